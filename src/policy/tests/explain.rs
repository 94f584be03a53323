use serde_json::json;

use super::*;
use crate::policy::fixtures::{compile_placed, ip, local, namespace, pod, policy};

fn explanations(enforcement: Enforcement, policies: &[PolicyView]) -> Explanations {
    let pods = [
        local(
            pod("a", "web", &[("app", "web")], &["10.0.0.10", "fd00::10"]),
            "lxcweb",
        ),
        local(pod("a", "db", &[("app", "db")], &["10.0.0.11"]), "lxcdb"),
        pod("b", "client", &[("role", "client")], &["10.0.2.1"]),
    ];
    compile_placed(
        enforcement,
        policies,
        &pods,
        &[namespace("a", &[]), namespace("b", &[("team", "y")])],
        &[ip("192.168.0.1")],
    )
    .explanations
}

fn web_policies() -> Vec<PolicyView> {
    vec![
        policy(
            "a",
            "deny",
            json!({"podSelector": {"matchLabels": {"app": "web"}}}),
        ),
        policy(
            "a",
            "allow",
            json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"],
                   "ingress": [
                       {"from": [{"podSelector": {"matchLabels": {"role": "client"}},
                                  "namespaceSelector": {"matchLabels": {"team": "y"}}},
                                 {"ipBlock": {"cidr": "10.9.0.0/16", "except": ["10.9.1.0/24"]}}],
                        "ports": [{"port": 80}, {"port": "http"}, {"protocol": "UDP", "port": 5000, "endPort": 5010}]},
                       {"from": [{"podSelector": {}}]}],
                   "egress": [{"to": [{"namespaceSelector": {}}]}, {"ports": [{"protocol": "SCTP"}]}]}),
        ),
    ]
}

#[test]
fn a_selected_pod_names_its_policies_and_what_each_allows_per_direction() {
    let e = explanations(Enforcement::Default, &web_policies());
    let web = e.pod("", &[ip("fd00::10")]).expect("web by its address");
    assert_eq!(web.pod, "a/web");
    assert!(web.enforced);
    assert!(web.ingress.isolated && web.egress.isolated);
    let ingress: Vec<(&str, Vec<&str>)> = web
        .ingress
        .policies
        .iter()
        .map(|p| {
            (
                p.policy.as_str(),
                p.allows.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(
        ingress,
        [
            ("a/deny", vec!["nothing"]),
            (
                "a/allow",
                vec![
                    "from pods role=client of namespaces team=y, ipBlock 10.9.0.0/16 except 10.9.1.0/24 on TCP 80, TCP port named http, UDP 5000-5010",
                    "from every pod of a on any port",
                ]
            ),
        ]
    );
    assert_eq!(
        web.ingress.summary,
        "isolated: only what a/deny, a/allow allow; traffic with its own node passes"
    );
    let egress: Vec<&str> = web
        .egress
        .policies
        .iter()
        .map(|p| p.policy.as_str())
        .collect();
    assert_eq!(egress, ["a/allow"], "deny has no Egress in its policyTypes");
    assert_eq!(
        web.egress.policies[0].allows,
        [
            "to every pod of every namespace on any port",
            "to anywhere on SCTP any port"
        ]
    );
    assert_eq!(
        e.pod("a/db", &[])
            .expect("db by name")
            .ingress
            .policies
            .len(),
        1,
        "db: only allow selects it"
    );
}

#[test]
fn an_unselected_pod_is_open_by_default_and_isolated_with_always() {
    let only_web = &web_policies()[..1];
    let e = explanations(Enforcement::Default, only_web);
    assert_eq!(
        e.pod("a/db", &[ip("10.0.0.11")]),
        None,
        "db is not recorded"
    );
    let db = e.unrecorded("a/db");
    assert!(!db.ingress.isolated && !db.egress.isolated);
    assert_eq!(
        db.ingress.summary,
        "open: no NetworkPolicy selects it for ingress"
    );
    let web = e.pod("a/web", &[]).expect("web");
    assert_eq!(
        (web.egress.isolated, web.egress.summary.as_str()),
        (false, "open: no NetworkPolicy selects it for egress"),
        "deny selects web for ingress only"
    );

    let e = explanations(Enforcement::Always, only_web);
    let db = e.pod("a/db", &[]).expect("every local pod is recorded");
    assert!(db.ingress.isolated && db.egress.isolated);
    assert!(db.ingress.policies.is_empty());
    assert_eq!(
        db.egress.summary,
        "isolated by enable-policy always: no NetworkPolicy selects it for egress, so nothing is allowed; traffic with its own node passes"
    );
    assert!(
        e.pod("b/client", &[ip("10.0.2.1")]).is_none(),
        "remote pods are not"
    );
}

#[test]
fn a_pod_whose_link_nft_cannot_name_says_it_is_not_enforced() {
    let pods = [local(
        pod("a", "web", &[("app", "web")], &["10.0.0.10"]),
        "bad link",
    )];
    let e =
        compile_placed(Enforcement::Default, &web_policies()[..1], &pods, &[], &[]).explanations;
    assert!(!e.pod("a/web", &[]).expect("web").enforced);
}
