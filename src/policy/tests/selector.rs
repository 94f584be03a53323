use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::json;

use super::*;
use crate::policy::fixtures::labels;

fn sel(v: serde_json::Value) -> Result<Selector, SelectorError> {
    Selector::parse(&serde_json::from_value::<LabelSelector>(v).expect("a selector"))
}

fn ok(v: serde_json::Value) -> Selector {
    sel(v).expect("a valid selector")
}

#[test]
fn the_empty_selector_matches_everything() {
    let s = ok(json!({}));
    assert!(s.is_everything());
    assert!(s.matches(&labels(&[])));
    assert!(s.matches(&labels(&[("a", "x")])));
    assert_eq!(s, Selector::everything());
    assert_eq!(s.text(), "{}");
}

#[test]
fn match_labels_need_every_pair() {
    let s = ok(json!({"matchLabels": {"a": "x", "b": "y"}}));
    assert!(s.matches(&labels(&[("a", "x"), ("b", "y"), ("c", "z")])));
    assert!(!s.matches(&labels(&[("a", "x")])));
    assert!(!s.matches(&labels(&[("a", "x"), ("b", "other")])));
    assert_eq!(s.text(), "a=x,b=y");
}

#[test]
fn each_operator_means_what_kubernetes_says() {
    let cases = [
        // (expression, labels, matches)
        (
            json!({"key": "a", "operator": "In", "values": ["x", "y"]}),
            vec![("a", "y")],
            true,
        ),
        (
            json!({"key": "a", "operator": "In", "values": ["x"]}),
            vec![("a", "z")],
            false,
        ),
        (
            json!({"key": "a", "operator": "In", "values": ["x"]}),
            vec![],
            false,
        ),
        (
            json!({"key": "a", "operator": "NotIn", "values": ["x"]}),
            vec![("a", "z")],
            true,
        ),
        (
            json!({"key": "a", "operator": "NotIn", "values": ["x"]}),
            vec![("a", "x")],
            false,
        ),
        // NotIn holds for a pod without the key.
        (
            json!({"key": "a", "operator": "NotIn", "values": ["x"]}),
            vec![],
            true,
        ),
        (
            json!({"key": "a", "operator": "Exists"}),
            vec![("a", "")],
            true,
        ),
        (
            json!({"key": "a", "operator": "Exists"}),
            vec![("b", "x")],
            false,
        ),
        (
            json!({"key": "a", "operator": "DoesNotExist"}),
            vec![("b", "x")],
            true,
        ),
        (
            json!({"key": "a", "operator": "DoesNotExist"}),
            vec![("a", "x")],
            false,
        ),
    ];
    for (expr, kv, want) in cases {
        let s = ok(json!({"matchExpressions": [expr.clone()]}));
        assert_eq!(s.matches(&labels(&kv)), want, "{expr} on {kv:?}");
    }
}

#[test]
fn labels_and_expressions_are_anded() {
    let s = ok(json!({
        "matchLabels": {"app": "web"},
        "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["a", "b"]},
            {"key": "canary", "operator": "DoesNotExist"},
        ]
    }));
    assert!(s.matches(&labels(&[("app", "web"), ("tier", "b")])));
    assert!(!s.matches(&labels(&[("app", "web"), ("tier", "b"), ("canary", "1")])));
    assert!(!s.matches(&labels(&[("app", "db"), ("tier", "b")])));
    assert_eq!(s.text(), "app=web,!canary,tier in (a,b)");
}

#[test]
fn the_same_selector_written_two_ways_is_equal() {
    let a = ok(json!({"matchLabels": {"a": "x"}}));
    let b = ok(json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["x"]}]}));
    assert_eq!(a, b);
    let c = ok(
        json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["y", "x", "x"]}]}),
    );
    let d = ok(json!({"matchExpressions": [{"key": "a", "operator": "In", "values": ["x", "y"]}]}));
    assert_eq!(c, d);
    assert_eq!(c.text(), "a in (x,y)");
}

#[test]
fn invalid_selectors_are_errors_naming_the_field() {
    let e = sel(json!({"matchExpressions": [
        {"key": "a", "operator": "Exists"},
        {"key": "a", "operator": "Equals", "values": ["x"]},
    ]}))
    .expect_err("unknown operator");
    assert_eq!(e.field, "matchExpressions[1].operator");
    assert_eq!(e.why, Why::UnknownOperator("Equals".into()));
    for op in ["In", "NotIn"] {
        let e = sel(json!({"matchExpressions": [{"key": "a", "operator": op, "values": []}]}))
            .expect_err("no values");
        assert_eq!(
            (e.field.as_str(), e.why),
            ("matchExpressions[0].values", Why::NoValues(op.into()))
        );
    }
    for op in ["Exists", "DoesNotExist"] {
        let e = sel(json!({"matchExpressions": [{"key": "a", "operator": op, "values": ["x"]}]}))
            .expect_err("values not allowed");
        assert_eq!(e.why, Why::ValuesNotAllowed(op.into()));
    }
}

#[test]
fn an_invalid_selector_matches_nothing_and_is_reported() {
    let bad: LabelSelector = serde_json::from_value(json!({
        "matchExpressions": [{"key": "a", "operator": "In"}]
    }))
    .expect("a selector");
    let mut reported = Vec::new();
    let s = Selector::parse_or_nothing(Some(&bad), |e| reported.push(e));
    assert_eq!(s, Selector::Nothing);
    assert!(!s.matches(&labels(&[])));
    assert!(!s.matches(&labels(&[("a", "x")])));
    assert_eq!(s.text(), "<nothing>");
    assert_eq!(reported.len(), 1);
    // Absent means empty, and nothing is reported.
    let s = Selector::parse_or_nothing(None, |_| panic!("nothing to report"));
    assert!(s.is_everything());
}
