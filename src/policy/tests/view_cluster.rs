use serde_json::json;

use crate::policy::problem::{Kind, Why};
use crate::policy::selector::Selector;
use crate::policy::view::{
    Action, ClusterPolicyView, ClusterRuleView, Namespaces, PeerView, PortSpec, PortView, Protocol,
    Subject, Tier, cluster_policy,
};

fn selector(v: serde_json::Value) -> Selector {
    Selector::parse(&serde_json::from_value(v).expect("a selector")).expect("valid")
}

fn spec(ingress: serde_json::Value, egress: serde_json::Value) -> serde_json::Value {
    json!({
        "tier": "Admin", "priority": 10,
        "subject": {"namespaces": {"matchLabels": {"team": "a"}}},
        "ingress": ingress, "egress": egress,
    })
}

fn clean(v: serde_json::Value) -> ClusterPolicyView {
    let p = cluster_policy("cnp", &v);
    assert_eq!(p.problems, vec![], "{p:?}");
    p
}

/// The one problem of `v`: its field and why.
fn problem(v: serde_json::Value) -> (ClusterPolicyView, String, Why) {
    let p = cluster_policy("cnp", &v);
    assert_eq!(p.problems.len(), 1, "{p:?}");
    let q = p.problems[0].clone();
    assert_eq!(
        (q.kind, q.name.as_str()),
        (Kind::ClusterNetworkPolicy, "cnp")
    );
    (p, q.field, q.why)
}

fn deny_all() -> ClusterRuleView {
    ClusterRuleView {
        action: Action::Deny,
        peers: None,
        ports: vec![],
        index: 0,
        name: None,
    }
}

#[test]
fn tier_priority_subject_and_rules_in_order() {
    let p = clean(spec(
        json!([
            {"action": "Deny", "from": [{"namespaces": {}}]},
            {"action": "Pass", "from": [{"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "x"}}}}]},
            {"action": "Accept", "from": [{"namespaces": {"matchLabels": {"k": "v"}}}]},
        ]),
        json!([]),
    ));
    assert_eq!(p.place, Some((Tier::Admin, 10)));
    assert_eq!(
        p.subject,
        Subject::Namespaces(selector(json!({"matchLabels": {"team": "a"}})))
    );
    let actions: Vec<Action> = p.ingress.iter().map(|r| r.action).collect();
    assert_eq!(actions, [Action::Deny, Action::Pass, Action::Accept]);
    assert_eq!(
        p.ingress[1].peers,
        Some(vec![PeerView::Pods {
            namespaces: Namespaces::Matching(Selector::everything()),
            pods: selector(json!({"matchLabels": {"app": "x"}})),
        }])
    );
    assert_eq!(
        p.ingress[0].peers,
        Some(vec![PeerView::Pods {
            namespaces: Namespaces::Matching(Selector::everything()),
            pods: Selector::everything(),
        }])
    );
    let b = clean(json!({"tier": "Baseline", "priority": 1000,
        "subject": {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"a": "b"}}}}}));
    assert_eq!(b.place, Some((Tier::Baseline, 1000)));
    assert_eq!(
        b.subject,
        Subject::Pods {
            namespaces: Selector::everything(),
            pods: selector(json!({"matchLabels": {"a": "b"}})),
        }
    );
}

#[test]
fn egress_peers_networks_nodes_and_ports() {
    let p = clean(spec(
        json!([]),
        json!([{"action": "Accept",
        "to": [{"networks": ["10.0.0.0/8", "fd00::/8"]}, {"nodes": {"matchLabels": {"role": "db"}}}],
        "protocols": [
            {"tcp": {"destinationPort": {"number": 80}}},
            {"udp": {"destinationPort": {"range": {"start": 1000, "end": 2000}}}},
            {"destinationNamedPort": "web"},
        ]}]),
    ));
    let r = &p.egress[0];
    assert_eq!(
        r.peers,
        Some(vec![
            PeerView::Block {
                net: "10.0.0.0/8".parse().unwrap(),
                except: vec![]
            },
            PeerView::Block {
                net: "fd00::/8".parse().unwrap(),
                except: vec![]
            },
            PeerView::Nodes(selector(json!({"matchLabels": {"role": "db"}}))),
        ])
    );
    let port = |protocol, spec| PortView::Port { protocol, spec };
    let named = |p| port(p, PortSpec::Named("web".into()));
    assert_eq!(
        r.ports,
        vec![
            port(Protocol::Tcp, PortSpec::Range(80, 80)),
            port(Protocol::Udp, PortSpec::Range(1000, 2000)),
            named(Protocol::Tcp),
            named(Protocol::Udp),
            named(Protocol::Sctp),
        ]
    );
}

#[test]
fn an_unknown_action_is_a_problem_and_the_rule_denies_all() {
    let (p, field, why) = problem(spec(
        json!([{"action": "Allow", "from": [{"namespaces": {}}]}]),
        json!([]),
    ));
    assert_eq!(field, "spec.ingress[0].action");
    assert_eq!(why, Why::UnknownAction("Allow".into()));
    assert_eq!(p.ingress, vec![deny_all()]);
    assert_eq!(
        p.problems[0].to_string(),
        "ClusterNetworkPolicy cnp, spec.ingress[0].action: unknown action \"Allow\" (Accept, Deny, Pass): the rule denies all"
    );
}

#[test]
fn a_priority_out_of_range_or_an_unknown_tier_applies_nothing() {
    for (priority, tier, field, why) in [
        (
            json!(1001),
            "Admin",
            "spec.priority",
            Why::PriorityOutOfRange(1001),
        ),
        (
            json!(-1),
            "Admin",
            "spec.priority",
            Why::PriorityOutOfRange(-1),
        ),
        (
            json!(5),
            "Middle",
            "spec.tier",
            Why::UnknownTier("Middle".into()),
        ),
    ] {
        let mut v = spec(
            json!([{"action": "Accept", "from": [{"namespaces": {}}]}]),
            json!([]),
        );
        v["priority"] = priority;
        v["tier"] = json!(tier);
        let (p, f, w) = problem(v);
        assert_eq!((f.as_str(), w), (field, why));
        assert_eq!((p.place, p.ingress.len()), (None, 0));
    }
}

#[test]
fn a_bad_cidr_fails_closed_by_action() {
    // Accept: the rule matches nothing; Deny and Pass: it denies all.
    for (action, rules) in [
        ("Accept", vec![]),
        ("Deny", vec![deny_all()]),
        ("Pass", vec![deny_all()]),
    ] {
        let (p, field, why) = problem(spec(
            json!([]),
            json!([{"action": action, "to": [{"networks": ["10.0.0.0/33"]}]}]),
        ));
        assert_eq!(field, "spec.egress[0].to[0].networks[0]");
        assert!(matches!(why, Why::InvalidCidr { ref value, .. } if value == "10.0.0.0/33"));
        assert_eq!(p.egress, rules, "{action}");
    }
}

#[test]
fn bad_ports_are_problems_naming_the_field() {
    let cases = [
        (
            json!({"tcp": {"destinationPort": {"range": {"start": 90, "end": 80}}}}),
            "spec.ingress[0].protocols[0].tcp.destinationPort.range",
            Why::RangeStartNotBelowEnd { start: 90, end: 80 },
        ),
        (
            json!({"udp": {"destinationPort": {"number": 70000}}}),
            "spec.ingress[0].protocols[0].udp.destinationPort.number",
            Why::PortOutOfRange(70000),
        ),
        (
            json!({"icmp": {"type": 8}}),
            "spec.ingress[0].protocols[0]",
            Why::NotExactlyOne("icmp".into(), "tcp, udp, sctp, destinationNamedPort"),
        ),
        (
            json!({"tcp": {}}),
            "spec.ingress[0].protocols[0].tcp.destinationPort",
            Why::NotExactlyOne("no field".into(), "number, range"),
        ),
        (
            json!({"tcp": {"destinationPort": {"number": 1}}, "udp": {"destinationPort": {"number": 1}}}),
            "spec.ingress[0].protocols[0]",
            Why::NotExactlyOne("tcp, udp".into(), "tcp, udp, sctp, destinationNamedPort"),
        ),
    ];
    for (protocol, field, why) in cases {
        let (p, f, w) = problem(spec(
            json!([{"action": "Accept", "from": [{"namespaces": {}}], "protocols": [protocol]}]),
            json!([]),
        ));
        assert_eq!((f.as_str(), w), (field, why));
        assert_eq!(
            p.ingress,
            vec![],
            "an Accept with a problem matches nothing"
        );
    }
}

#[test]
fn peers_and_subjects_need_exactly_one_field() {
    let (_, field, why) = problem(spec(
        json!([{"action": "Accept", "from": [{"namespaces": {}, "pods": {"podSelector": {}}}]}]),
        json!([]),
    ));
    assert_eq!(field, "spec.ingress[0].from[0]");
    assert_eq!(
        why,
        Why::NotExactlyOne("namespaces, pods".into(), "namespaces, pods")
    );
    // An ingress peer has no networks; an unknown field is one too (fail closed).
    let (p, field, _) = problem(spec(
        json!([{"action": "Deny", "from": [{"networks": ["10.0.0.0/8"]}]}]),
        json!([]),
    ));
    assert_eq!(field, "spec.ingress[0].from[0]");
    assert_eq!(p.ingress, vec![deny_all()]);
    let (p, field, _) = problem(spec(
        json!([]),
        json!([{"action": "Pass", "to": [{"services": {}}]}]),
    ));
    assert_eq!(field, "spec.egress[0].to[0]");
    assert_eq!(p.egress, vec![deny_all()]);
    let mut v = spec(json!([]), json!([]));
    v["subject"] = json!({});
    let (p, field, _) = problem(v);
    assert_eq!(
        (field.as_str(), p.subject),
        ("spec.subject", Subject::Nothing)
    );
}

#[test]
fn domain_names_are_not_enforced_a_problem() {
    let (p, field, why) = problem(spec(
        json!([]),
        json!([{"action": "Accept", "to": [{"domainNames": ["example.com"]}]}]),
    ));
    assert_eq!(field, "spec.egress[0].to[0].domainNames");
    assert_eq!(why, Why::NotSupported("domainNames"));
    assert_eq!(p.egress, vec![]);
}

#[test]
fn a_spec_that_does_not_decode_applies_nothing() {
    let (p, field, why) = problem(json!({"tier": "Admin", "priority": "high"}));
    assert_eq!(field, "spec");
    assert!(matches!(why, Why::Undecodable(_)));
    assert_eq!(p.place, None);
}
