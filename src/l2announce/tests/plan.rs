//! The plan: one answerer per address, chosen alike on every agent.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use serde_json::json;

use super::{lb, names, node, policy};
use crate::l2announce::plan::{Inputs, Plan, Standing, plan};
use crate::l2announce::views::{AddressKind, NodeView, PolicyView, ServiceView};

/// The world of one test: its objects, the live nodes and the ready endpoints.
struct World {
    policies: Vec<PolicyView>,
    services: Vec<ServiceView>,
    nodes: Vec<NodeView>,
    live: BTreeSet<String>,
    ready: BTreeMap<String, BTreeSet<String>>,
}

impl World {
    /// Three live nodes (node-1 labelled `l2=yes`, the others `l2=no`), one
    /// policy announcing every LoadBalancer address from every node.
    fn new(services: Vec<ServiceView>) -> World {
        World {
            policies: vec![policy("all", json!({"loadBalancerIPs": true}))],
            services,
            nodes: vec![
                node("node-1", &[("l2", "yes")]),
                node("node-2", &[("l2", "no")]),
                node("node-3", &[("l2", "no")]),
            ],
            live: names(&["node-1", "node-2", "node-3"]),
            ready: BTreeMap::new(),
        }
    }

    fn plan(&self) -> Plan {
        let policies: Vec<&PolicyView> = self.policies.iter().collect();
        let services: Vec<&ServiceView> = self.services.iter().collect();
        let nodes: Vec<&NodeView> = self.nodes.iter().collect();
        plan(&Inputs {
            policies: &policies,
            services: &services,
            nodes: &nodes,
            ready: &self.ready,
            live: &self.live,
        })
    }
}

fn ip(a: &str) -> IpAddr {
    a.parse().unwrap()
}

/// Who answers for `address` (None: nobody).
fn answerer(p: &Plan, address: &str) -> Option<String> {
    let a = p.addresses.get(&ip(address))?;
    a.answerer().map(|c| c.node.clone())
}

/// Every address's answerer.
fn answerers(p: &Plan) -> BTreeMap<IpAddr, Option<String>> {
    p.addresses
        .iter()
        .map(|(a, plan)| (*a, plan.answerer().map(|c| c.node.clone())))
        .collect()
}

fn standing(p: &Plan, address: &str, node: &str) -> Standing {
    let a = &p.addresses[&ip(address)];
    let c = a.candidates.iter().find(|c| c.node == node).unwrap();
    c.standing.clone()
}

#[test]
fn one_node_answers_each_address_the_first_in_its_order_and_the_others_stand_by() {
    let w = World::new(vec![lb("web", &["10.251.0.200"])]);
    let p = w.plan();
    let a = &p.addresses[&ip("10.251.0.200")];
    assert_eq!(a.kind, AddressKind::LoadBalancer);
    assert_eq!(a.services, ["default/web"]);
    assert_eq!(a.candidates.len(), 3);
    assert_eq!(a.candidates[0].standing, Standing::Answers);
    assert!(
        a.candidates[1..]
            .iter()
            .all(|c| c.standing == Standing::Standby)
    );
    assert_eq!(a.candidates[0].policy.as_deref(), Some("all"));
    assert!(p.problems.is_empty(), "{:?}", p.problems);
    assert_eq!(p.answered_by(&a.candidates[0].node).count(), 1);
}

#[test]
fn addresses_spread_over_the_nodes_and_a_death_moves_only_the_dead_nodes_addresses() {
    let ips: Vec<String> = (1..=60).map(|i| format!("10.251.1.{i}")).collect();
    let refs: Vec<&str> = ips.iter().map(String::as_str).collect();
    let mut w = World::new(vec![lb("many", &refs)]);
    let before = answerers(&w.plan());
    for n in ["node-1", "node-2", "node-3"] {
        let count = before.values().filter(|a| a.as_deref() == Some(n)).count();
        assert!(count >= 5, "{n} answers only {count} of 60: {before:?}");
    }
    w.live.remove("node-2");
    let after = answerers(&w.plan());
    for (a, was) in &before {
        match was.as_deref() {
            Some("node-2") => assert!(matches!(after[a].as_deref(), Some("node-1" | "node-3"))),
            _ => assert_eq!(&after[a], was, "{a} moved though its node lives"),
        }
    }
    // Back: every address returns to where it was.
    w.live.insert("node-2".into());
    assert_eq!(answerers(&w.plan()), before);
}

#[test]
fn every_agent_plans_alike_whatever_order_its_watches_listed_in() {
    let mut w = World::new(vec![
        lb("a", &["10.251.0.200"]),
        lb("b", &["10.251.0.201", "fd00:10:251::c8"]),
    ]);
    w.policies.push(policy(
        "extra",
        json!({"loadBalancerIPs": true, "interfaces": ["eth0"]}),
    ));
    let first = w.plan();
    w.nodes.reverse();
    w.services.reverse();
    w.policies.reverse();
    assert_eq!(w.plan(), first);
}

#[test]
fn a_node_outside_the_node_selector_never_answers_even_when_every_selected_node_is_dead() {
    let mut w = World::new(vec![lb("web", &["10.251.0.200"])]);
    w.policies = vec![policy(
        "only-1",
        json!({"loadBalancerIPs": true, "nodeSelector": {"matchLabels": {"l2": "yes"}}}),
    )];
    let p = w.plan();
    assert_eq!(answerer(&p, "10.251.0.200").as_deref(), Some("node-1"));
    assert_eq!(
        standing(&p, "10.251.0.200", "node-2"),
        Standing::NotSelected
    );
    w.live.remove("node-1");
    let p = w.plan();
    assert_eq!(answerer(&p, "10.251.0.200"), None);
    assert_eq!(standing(&p, "10.251.0.200", "node-1"), Standing::NotLive);
    assert_eq!(
        standing(&p, "10.251.0.200", "node-3"),
        Standing::NotSelected
    );
}

#[test]
fn external_traffic_policy_local_answers_only_from_a_node_with_a_ready_endpoint_and_moves_with_it()
{
    let mut svc = lb("local", &["10.251.0.210"]);
    svc.local_traffic = true;
    let mut w = World::new(vec![svc]);
    let p = w.plan();
    assert_eq!(answerer(&p, "10.251.0.210"), None, "no endpoint anywhere");
    assert_eq!(
        standing(&p, "10.251.0.210", "node-1"),
        Standing::NoReadyEndpoint("default/local".into())
    );
    for n in ["node-3", "node-1"] {
        w.ready.insert("default/local".into(), names(&[n]));
        assert_eq!(answerer(&w.plan(), "10.251.0.210").as_deref(), Some(n));
    }
    // An endpoint on a dead node does not make it answer.
    w.live.remove("node-1");
    assert_eq!(answerer(&w.plan(), "10.251.0.210"), None);
}

#[test]
fn each_kind_of_address_is_announced_only_by_a_policy_that_says_so() {
    let mut svc = lb("both", &["10.251.0.220"]);
    svc.external = vec![ip("10.251.0.221")];
    let mut w = World::new(vec![svc]);
    let p = w.plan();
    assert!(p.addresses.contains_key(&ip("10.251.0.220")));
    assert!(!p.addresses.contains_key(&ip("10.251.0.221")));
    w.policies = vec![policy("ext", json!({"externalIPs": true}))];
    let p = w.plan();
    assert_eq!(
        p.addresses.keys().copied().collect::<Vec<_>>(),
        [ip("10.251.0.221")]
    );
    assert_eq!(p.addresses[&ip("10.251.0.221")].kind, AddressKind::External);
}

#[test]
fn the_service_selector_picks_the_services() {
    let mut w = World::new(vec![
        lb("web", &["10.251.0.200"]),
        lb("db", &["10.251.0.201"]),
    ]);
    w.policies = vec![policy(
        "web",
        json!({"loadBalancerIPs": true, "serviceSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]}}),
    )];
    let p = w.plan();
    assert_eq!(
        p.addresses.keys().copied().collect::<Vec<_>>(),
        [ip("10.251.0.200")]
    );
}

#[test]
fn an_invalid_policy_selects_nothing_names_its_field_and_another_policy_still_announces() {
    let mut w = World::new(vec![lb("web", &["10.251.0.200"])]);
    w.policies = vec![
        policy(
            "bad-regex",
            json!({"loadBalancerIPs": true, "interfaces": ["eth0", "eth["]}),
        ),
        policy(
            "bad-selector",
            json!({"loadBalancerIPs": true, "nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}}),
        ),
    ];
    let p = w.plan();
    assert!(p.addresses.is_empty());
    let fields: Vec<(&str, &str)> = p
        .problems
        .iter()
        .map(|q| (q.object.as_str(), q.field.as_str()))
        .collect();
    assert_eq!(
        fields,
        [
            ("CiliumL2AnnouncementPolicy bad-regex", "spec.interfaces[1]"),
            (
                "CiliumL2AnnouncementPolicy bad-selector",
                "spec.nodeSelector.matchExpressions[0].operator"
            ),
        ]
    );
    assert!(
        p.problems[0]
            .why
            .contains("\"eth[\" is not a regular expression"),
        "{}",
        p.problems[0]
    );
    w.policies
        .push(policy("good", json!({"loadBalancerIPs": true})));
    let p = w.plan();
    assert!(answerer(&p, "10.251.0.200").is_some());
    assert_eq!(p.problems.len(), 2);
}

#[test]
fn a_policy_that_announces_neither_kind_is_a_problem() {
    let mut w = World::new(vec![lb("web", &["10.251.0.200"])]);
    w.policies = vec![policy("nothing", json!({"interfaces": ["eth0"]}))];
    let p = w.plan();
    assert!(p.addresses.is_empty());
    assert_eq!(p.problems.len(), 1);
    assert_eq!(p.problems[0].field, "spec");
    assert!(
        p.problems[0]
            .why
            .contains("neither loadBalancerIPs nor externalIPs")
    );
}

#[test]
fn two_policies_with_different_interfaces_for_one_node_are_a_problem_and_the_first_by_name_wins() {
    let mut w = World::new(vec![lb("web", &["10.251.0.200"])]);
    w.policies = vec![
        policy(
            "b-wlan",
            json!({"loadBalancerIPs": true, "interfaces": ["wlan0"]}),
        ),
        policy(
            "a-eth",
            json!({"loadBalancerIPs": true, "interfaces": ["^eth[0-9]+$"]}),
        ),
    ];
    let p = w.plan();
    let a = &p.addresses[&ip("10.251.0.200")];
    let answering = a.answerer().unwrap();
    assert_eq!(answering.policy.as_deref(), Some("a-eth"));
    assert_eq!(answering.interfaces.len(), 1);
    assert!(answering.interfaces[0].matches("eth0") && !answering.interfaces[0].matches("wlan0"));
    assert_eq!(
        p.problems.len(),
        1,
        "one problem, however many nodes: {:?}",
        p.problems
    );
    let q = &p.problems[0];
    assert_eq!(
        (q.object.as_str(), q.field.as_str()),
        ("CiliumL2AnnouncementPolicy b-wlan", "spec.interfaces")
    );
    assert!(q.why.contains("a-eth's are used"));
}

#[test]
fn a_shared_address_is_answered_by_a_node_that_may_answer_for_every_service_sharing_it() {
    let mut local = lb("dns-udp", &["10.251.0.230"]);
    local.local_traffic = true;
    let mut w = World::new(vec![lb("dns-tcp", &["10.251.0.230"]), local]);
    w.ready.insert("default/dns-udp".into(), names(&["node-2"]));
    let p = w.plan();
    assert_eq!(answerer(&p, "10.251.0.230").as_deref(), Some("node-2"));
    assert_eq!(
        p.addresses[&ip("10.251.0.230")].services,
        ["default/dns-tcp", "default/dns-udp"]
    );
    // dns-tcp only from node-1, dns-udp only from node-2: nobody may answer for both.
    w.policies = vec![
        policy(
            "tcp",
            json!({"loadBalancerIPs": true, "serviceSelector": {"matchLabels": {"app": "dns-tcp"}}, "nodeSelector": {"matchLabels": {"l2": "yes"}}}),
        ),
        policy(
            "udp",
            json!({"loadBalancerIPs": true, "serviceSelector": {"matchLabels": {"app": "dns-udp"}}}),
        ),
    ];
    let p = w.plan();
    assert_eq!(answerer(&p, "10.251.0.230"), None);
    assert_eq!(p.problems.len(), 1, "{:?}", p.problems);
    assert!(
        p.problems[0]
            .why
            .contains("shared by Services default/dns-tcp, default/dns-udp")
    );
}

#[test]
fn ipv6_addresses_are_planned_alike() {
    let w = World::new(vec![lb("v6", &["fd00:10:251::c8", "10.251.0.200"])]);
    let p = w.plan();
    assert!(answerer(&p, "fd00:10:251::c8").is_some());
    assert!(answerer(&p, "10.251.0.200").is_some());
}

#[test]
fn no_node_is_live_no_node_answers() {
    let mut w = World::new(vec![lb("web", &["10.251.0.200"])]);
    w.live.clear();
    let p = w.plan();
    assert_eq!(answerer(&p, "10.251.0.200"), None);
    assert!(
        p.addresses[&ip("10.251.0.200")]
            .candidates
            .iter()
            .all(|c| c.standing == Standing::NotLive)
    );
}
