use serde_json::json;

use super::*;
use crate::policy::fixtures::{
    cnp, compile_all, compile_placed, ip, local, namespace, pod, policy,
};

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
        "isolated: only what a/deny, a/allow allow; traffic from its own node passes"
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
        "isolated by enable-policy always: no NetworkPolicy selects it for egress, so nothing is allowed; traffic to its own node too"
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

/// An Admin policy on web (two rules in, none out), another Admin one of a
/// higher precedence for egress, and a Baseline one on every pod.
fn cluster_policies() -> Vec<ClusterPolicyView> {
    vec![
        cnp(
            "admin-web",
            json!({"tier": "Admin", "priority": 10,
                   "subject": {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "web"}}}},
                   "ingress": [
                       {"name": "no-db", "action": "Deny",
                        "from": [{"pods": {"namespaceSelector": {"matchLabels": {"team": "y"}},
                                           "podSelector": {"matchLabels": {"role": "client"}}}}],
                        "protocols": [{"tcp": {"destinationPort": {"number": 5432}}}]},
                       {"action": "Pass", "from": [{"namespaces": {}}],
                        "protocols": [{"destinationNamedPort": "http"},
                                      {"udp": {"destinationPort": {"range": {"start": 5000, "end": 5010}}}}]}]}),
        ),
        cnp(
            "admin-out",
            json!({"tier": "Admin", "priority": 5,
                   "subject": {"namespaces": {}},
                   "egress": [
                       {"action": "Accept", "to": [{"networks": ["10.9.0.0/16"]}, {"nodes": {"matchLabels": {"role": "db"}}}]},
                       {"action": "Deny", "to": [{"networks": ["10.9.0.0/33"]}]}]}),
        ),
        cnp(
            "base",
            json!({"tier": "Baseline", "priority": 1,
                   "subject": {"namespaces": {}},
                   "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}]}),
        ),
    ]
}

fn explanations_with(policies: &[PolicyView]) -> Explanations {
    let pods = [
        local(pod("a", "web", &[("app", "web")], &["10.0.0.10"]), "lxcweb"),
        local(pod("a", "db", &[("app", "db")], &["10.0.0.11"]), "lxcdb"),
        pod("b", "client", &[("role", "client")], &["10.0.2.1"]),
    ];
    compile_all(
        Enforcement::Default,
        policies,
        &cluster_policies(),
        &pods,
        &[namespace("a", &[]), namespace("b", &[("team", "y")])],
        &[],
        &[],
    )
    .explanations
}

#[test]
fn cluster_policies_are_listed_per_tier_in_the_order_they_decide_with_their_rules() {
    let e = explanations_with(&web_policies());
    let web = e.pod("a/web", &[]).expect("web");
    let tier = |t: &[ClusterPolicyRules]| -> Vec<(String, u16, Vec<String>)> {
        t.iter()
            .map(|p| (p.policy.clone(), p.priority, p.rules.clone()))
            .collect()
    };
    assert_eq!(
        tier(&web.ingress.admin),
        [(
            "admin-web".to_string(),
            10,
            vec![
                "rule 0 (no-db): Deny from pods role=client of namespaces team=y on TCP 5432"
                    .to_string(),
                "rule 1: Pass from every pod of every namespace on port named http, UDP 5000-5010"
                    .to_string(),
            ]
        )],
        "admin-out has no ingress rule: not listed for ingress"
    );
    assert_eq!(
        tier(&web.egress.admin),
        [(
            "admin-out".to_string(),
            5,
            vec![
                "rule 0: Accept to ipBlock 10.9.0.0/16, nodes role=db on any port".to_string(),
                "rule 1: Deny to anywhere on any port (the rule has a problem: podnet status names it)"
                    .to_string(),
            ]
        )]
    );
    assert_eq!(tier(&web.ingress.baseline).len(), 1);
    assert!(web.egress.baseline.is_empty(), "base has no egress rule");
    assert_eq!(
        web.ingress.summary,
        "first the Admin tier (admin-web); then isolated: only what a/deny, a/allow allow; traffic from its own node passes; the Baseline tier (base) is not reached: NetworkPolicy isolates the pod"
    );
    assert_eq!(
        web.egress.summary,
        "first the Admin tier (admin-out); then isolated: only what a/allow allows; traffic to its own node too"
    );
}

#[test]
fn a_pod_only_cluster_policies_apply_to_is_recorded_and_the_baseline_decides_where_it_is_open() {
    let e = explanations_with(&[]);
    let db = e
        .pod("", &[ip("10.0.0.11")])
        .expect("db: a subject, though no NetworkPolicy selects it");
    assert!(!db.ingress.isolated && db.ingress.policies.is_empty());
    assert_eq!(
        db.ingress.summary,
        "open: no NetworkPolicy selects it for ingress; then the Baseline tier (base); what no tier decides passes"
    );
    assert_eq!(
        db.egress.summary,
        "first the Admin tier (admin-out); then open: no NetworkPolicy selects it for egress"
    );
    let names =
        |t: &[ClusterPolicyRules]| -> Vec<String> { t.iter().map(|p| p.policy.clone()).collect() };
    let web = e.pod("a/web", &[]).expect("web");
    assert_eq!(names(&web.ingress.admin), ["admin-web"]);
    assert_eq!(names(&web.egress.admin), ["admin-out"]);
}

#[test]
fn without_cluster_policies_nothing_of_the_tiers_is_said() {
    let e = explanations(Enforcement::Default, &web_policies());
    let web = e.pod("a/web", &[]).expect("web");
    for d in [&web.ingress, &web.egress] {
        assert!(d.admin.is_empty() && d.baseline.is_empty());
        assert!(!d.summary.contains("tier"), "{}", d.summary);
    }
}
