use serde_json::json;

use super::*;
use crate::api::models::AddressExplanation;
use crate::policy::Enforcement;
use crate::policy::fixtures::{cnp, compile_all, compile_placed, local, pod, policy};

fn answer(addresses: &[(&str, &str, &str)]) -> ExplainResponse {
    ExplainResponse {
        query: "q".into(),
        summary: "It is there".into(),
        addresses: addresses
            .iter()
            .map(|(ip, owner, container)| AddressExplanation {
                ip: ip.to_string(),
                owner: owner.to_string(),
                container_id: container.to_string(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

fn explanations() -> Explanations {
    let pods = [
        local(pod("a", "web", &[("app", "web")], &["10.0.0.10"]), "lxcweb"),
        local(pod("a", "db", &[], &["10.0.0.11"]), "lxcdb"),
    ];
    let deny = policy(
        "a",
        "deny",
        json!({"podSelector": {"matchLabels": {"app": "web"}}}),
    );
    compile_placed(Enforcement::Default, &[deny], &pods, &[], &[]).explanations
}

#[test]
fn each_pod_of_the_answer_gets_its_policy_and_a_sentence_in_the_summary() {
    let mut a = answer(&[
        ("10.0.0.10", "a/web", "c1"),
        ("fd00::10", "a/web", "c1"),
        ("10.0.0.11", "a/db", "c2"),
        ("10.0.0.1", "router", ""),
    ]);
    add_policy(&mut a, &explanations());
    let pods: Vec<&str> = a.policy.iter().map(|p| p.pod.as_str()).collect();
    assert_eq!(
        pods,
        ["a/db", "a/web"],
        "one each, the node's own address none"
    );
    assert!(a.policy[1].ingress.isolated && !a.policy[1].egress.isolated);
    assert!(!a.policy[0].ingress.isolated, "db: no policy selects it");
    assert!(
        a.summary.contains(
            ". NetworkPolicy for a/web: ingress isolated: only what a/deny allows; traffic from its own node passes; egress open: no NetworkPolicy selects it for egress"
        ),
        "{}",
        a.summary
    );
}

#[test]
fn an_answer_without_a_pod_gets_nothing() {
    let mut a = answer(&[]);
    add_policy(&mut a, &explanations());
    assert!(a.policy.is_empty());
    assert_eq!(a.summary, "It is there");
}

#[test]
fn the_wire_spells_a_pods_policy_as_before() {
    let mut a = answer(&[("10.0.0.10", "a/web", "c1")]);
    add_policy(&mut a, &explanations());
    assert_eq!(
        serde_json::to_value(&a.policy).expect("json"),
        json!([{
            "pod": "a/web",
            "ingress": {
                "isolated": true,
                "policies": [{"policy": "a/deny", "allows": ["nothing"]}],
                "summary": "isolated: only what a/deny allows; traffic from its own node passes"
            },
            "egress": {
                "isolated": false,
                "policies": [],
                "summary": "open: no NetworkPolicy selects it for egress"
            },
            "enforced": true
        }])
    );
}

#[test]
fn the_wire_spells_the_tiers_only_when_a_cluster_policy_applies() {
    let pods = [local(
        pod("a", "web", &[("app", "web")], &["10.0.0.10"]),
        "lxcweb",
    )];
    let deny = cnp(
        "admin-deny",
        json!({"tier": "Admin", "priority": 3, "subject": {"namespaces": {}},
               "egress": [{"name": "no-dns", "action": "Deny", "to": [{"networks": ["10.96.0.10/32"]}],
                           "protocols": [{"udp": {"destinationPort": {"number": 53}}}]}]}),
    );
    let explanations =
        compile_all(Enforcement::Default, &[], &[deny], &pods, &[], &[], &[]).explanations;
    let mut a = answer(&[("10.0.0.10", "a/web", "c1")]);
    add_policy(&mut a, &explanations);
    let wire = serde_json::to_value(&a.policy).expect("json");
    assert_eq!(
        wire[0]["egress"]["admin"],
        json!([{"policy": "admin-deny", "priority": 3,
                "rules": ["rule 0 (no-dns): Deny to ipBlock 10.96.0.10/32 on UDP 53"]}])
    );
    assert_eq!(wire[0]["ingress"].get("admin"), None, "no rule for ingress");
    assert_eq!(wire[0]["egress"].get("baseline"), None);
    assert!(
        a.summary.contains(
            "egress first the Admin tier (admin-deny); then open: no NetworkPolicy selects it for egress"
        ),
        "{}",
        a.summary
    );
}
