//! ClusterNetworkPolicy's tiers around NetworkPolicy, judged as the rendered
//! chains judge packets (`policy::fixtures::judge`).

use serde_json::{Value, json};

use super::*;
use crate::policy::fixtures::{
    Placed, cnp, compile_all, ip, judge, local, namespace, node, pod, policy, with_port,
};
use crate::policy::view::Protocol::{Tcp, Udp};

const WEB: &str = "lxcweb";
const CLIENT: &str = "10.0.2.1";
const OTHER: &str = "10.0.3.1";
const HTTP: (Protocol, u16) = (Tcp, 80);

/// web (local, namespace a, team=x, named port http/TCP 8080); client in b
/// (team=y); other in c (team=z).
fn pods() -> Vec<Placed> {
    let web = pod("a", "web", &[("app", "web")], &["10.0.0.10"]);
    vec![
        local(with_port(web, "http", Tcp, 8080), WEB),
        with_port(
            pod("b", "client", &[("role", "client")], &[CLIENT]),
            "http",
            Tcp,
            9090,
        ),
        pod("c", "other", &[("role", "other")], &[OTHER]),
    ]
}

fn namespaces() -> [NamespaceView; 3] {
    [
        namespace("a", &[("team", "x")]),
        namespace("b", &[("team", "y")]),
        namespace("c", &[("team", "z")]),
    ]
}

fn run(policies: &[PolicyView], cluster: &[ClusterPolicyView]) -> Compiled {
    let c = run_with_problems(policies, cluster);
    assert_eq!(c.problems, vec![], "{c:#?}");
    c
}

/// [`run`] of policies that may have problems.
fn run_with_problems(policies: &[PolicyView], cluster: &[ClusterPolicyView]) -> Compiled {
    let namespaces = namespaces();
    let nodes = [{
        let mut n = node("db-node", &["192.168.0.9"], &[]);
        n.labels = [("role".to_string(), "db".to_string())].into();
        n
    }];
    compile_all(
        Enforcement::Default,
        policies,
        cluster,
        &pods(),
        &namespaces,
        &[ip("192.168.0.1")],
        &nodes,
    )
}

/// A policy of `tier` and `priority` whose subject is namespace a.
fn tiered(
    name: &str,
    tier: &str,
    priority: u16,
    ingress: Value,
    egress: Value,
) -> ClusterPolicyView {
    cnp(
        name,
        json!({"tier": tier, "priority": priority,
            "subject": {"namespaces": {"matchLabels": {"team": "x"}}},
            "ingress": ingress, "egress": egress}),
    )
}

fn admin(name: &str, priority: u16, ingress: Value) -> ClusterPolicyView {
    tiered(name, "Admin", priority, ingress, json!([]))
}

fn baseline(name: &str, priority: u16, ingress: Value) -> ClusterPolicyView {
    tiered(name, "Baseline", priority, ingress, json!([]))
}

/// A rule of `action` from namespace `team`.
fn from_team(action: &str, team: &str) -> Value {
    json!({"action": action, "from": [{"namespaces": {"matchLabels": {"team": team}}}]})
}

fn np_allowing(team: &str) -> PolicyView {
    policy(
        "a",
        "np",
        json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": team}}}]}]}),
    )
}

fn np_deny_all() -> PolicyView {
    policy(
        "a",
        "np",
        json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
    )
}

fn ingress(c: &Compiled, from: &str, port: (Protocol, u16)) -> bool {
    judge(&c.state, Direction::Ingress, WEB, ip(from), port)
}

fn egress(c: &Compiled, to: &str, port: (Protocol, u16)) -> bool {
    judge(&c.state, Direction::Egress, WEB, ip(to), port)
}

#[test]
fn an_admin_deny_beats_a_networkpolicy_allow() {
    let c = run(
        &[np_allowing("y")],
        &[admin("deny-b", 10, json!([from_team("Deny", "y")]))],
    );
    assert!(!ingress(&c, CLIENT, HTTP));
    assert!(
        !ingress(&c, OTHER, HTTP),
        "NetworkPolicy isolates: other is not allowed"
    );
    let c = run(&[], &[admin("deny-b", 10, json!([from_team("Deny", "y")]))]);
    assert!(!ingress(&c, CLIENT, HTTP));
    assert!(
        ingress(&c, OTHER, HTTP),
        "no tier denies other: the default allows"
    );
}

#[test]
fn an_admin_accept_beats_a_networkpolicy_deny() {
    let c = run(
        &[np_deny_all()],
        &[admin("accept-b", 10, json!([from_team("Accept", "y")]))],
    );
    assert!(ingress(&c, CLIENT, HTTP));
    assert!(!ingress(&c, OTHER, HTTP));
}

#[test]
fn a_baseline_deny_loses_to_a_networkpolicy_allow() {
    let deny_all = baseline(
        "deny-all",
        10,
        json!([{"action": "Deny", "from": [{"namespaces": {}}]}]),
    );
    let c = run(&[np_allowing("y")], std::slice::from_ref(&deny_all));
    assert!(ingress(&c, CLIENT, HTTP));
    assert!(!ingress(&c, OTHER, HTTP));
    // Without a NetworkPolicy the Baseline decides.
    let c = run(&[], &[deny_all]);
    assert!(!ingress(&c, CLIENT, HTTP));
    assert!(!ingress(&c, OTHER, HTTP));
}

#[test]
fn a_baseline_accept_loses_to_a_networkpolicy_deny() {
    let c = run(
        &[np_deny_all()],
        &[baseline("accept-b", 10, json!([from_team("Accept", "y")]))],
    );
    assert!(!ingress(&c, CLIENT, HTTP));
}

#[test]
fn an_admin_pass_hands_over_to_networkpolicy_and_skips_the_admin_tier() {
    let pass = admin("pass-b", 1, json!([from_team("Pass", "y")]));
    let deny_all = admin(
        "deny-all",
        2,
        json!([{"action": "Deny", "from": [{"namespaces": {}}]}]),
    );
    let c = run(&[np_allowing("y")], &[pass.clone(), deny_all.clone()]);
    assert!(
        ingress(&c, CLIENT, HTTP),
        "passed to NetworkPolicy, which allows"
    );
    assert!(
        !ingress(&c, OTHER, HTTP),
        "not passed: the later Admin Deny"
    );
    let c = run(&[np_deny_all()], &[pass.clone(), deny_all.clone()]);
    assert!(
        !ingress(&c, CLIENT, HTTP),
        "passed to NetworkPolicy, which denies"
    );
    // Without NetworkPolicy: on to the Baseline tier.
    let base = baseline("deny-b", 5, json!([from_team("Deny", "y")]));
    let c = run(&[], &[pass.clone(), deny_all.clone(), base]);
    assert!(!ingress(&c, CLIENT, HTTP), "passed to the Baseline Deny");
    let c = run(&[], &[pass, deny_all]);
    assert!(ingress(&c, CLIENT, HTTP), "passed to the default");
}

#[test]
fn a_baseline_pass_goes_to_the_default() {
    let pass = baseline("pass-b", 1, json!([from_team("Pass", "y")]));
    let deny_all = baseline(
        "deny-all",
        2,
        json!([{"action": "Deny", "from": [{"namespaces": {}}]}]),
    );
    let c = run(&[], &[pass, deny_all]);
    assert!(ingress(&c, CLIENT, HTTP));
    assert!(!ingress(&c, OTHER, HTTP));
}

#[test]
fn lower_priority_numbers_first_then_names_then_rule_order() {
    let accept = |name, p| admin(name, p, json!([from_team("Accept", "y")]));
    let deny = |name, p| admin(name, p, json!([from_team("Deny", "y")]));
    let c = run(&[], &[deny("d", 5), accept("a", 1)]);
    assert!(ingress(&c, CLIENT, HTTP));
    let c = run(&[], &[deny("d", 1), accept("a", 5)]);
    assert!(!ingress(&c, CLIENT, HTTP));
    // Equal priorities: by name (the API leaves it to the implementation).
    let c = run(&[], &[deny("b-deny", 3), accept("a-accept", 3)]);
    assert!(ingress(&c, CLIENT, HTTP));
    // Within a policy, the order written.
    let c = run(
        &[],
        &[admin(
            "both",
            1,
            json!([from_team("Deny", "y"), from_team("Accept", "y")]),
        )],
    );
    assert!(!ingress(&c, CLIENT, HTTP));
    // Every Admin rule before every Baseline rule, whatever the priorities.
    let c = run(
        &[],
        &[
            baseline("b", 0, json!([from_team("Deny", "y")])),
            admin("a", 1000, json!([from_team("Accept", "y")])),
        ],
    );
    assert!(ingress(&c, CLIENT, HTTP));
}

#[test]
fn subjects_by_namespace_or_by_pod() {
    let subject = |subject: Value| {
        cnp(
            "s",
            json!({"tier": "Admin", "priority": 1, "subject": subject,
                "ingress": [from_team("Deny", "y")]}),
        )
    };
    let by_pod = subject(
        json!({"pods": {"namespaceSelector": {"matchLabels": {"team": "x"}},
        "podSelector": {"matchLabels": {"app": "web"}}}}),
    );
    assert!(!ingress(&run(&[], &[by_pod]), CLIENT, HTTP));
    let other_pods = subject(json!({"pods": {"namespaceSelector": {},
        "podSelector": {"matchLabels": {"app": "db"}}}}));
    let c = run(&[], &[other_pods]);
    assert!(c.state.chains.is_empty(), "web is no subject: no chain");
    let other_namespaces = subject(json!({"namespaces": {"matchLabels": {"team": "y"}}}));
    assert!(run(&[], &[other_namespaces]).state.chains.is_empty());
}

#[test]
fn pod_peers_match_namespace_and_pod_selectors() {
    let rule = json!({"action": "Deny", "from": [{"pods": {
        "namespaceSelector": {"matchLabels": {"team": "y"}},
        "podSelector": {"matchLabels": {"role": "client"}}}}]});
    let c = run(&[], &[admin("p", 1, json!([rule]))]);
    assert!(!ingress(&c, CLIENT, HTTP));
    assert!(ingress(&c, OTHER, HTTP));
}

#[test]
fn egress_networks_deny_and_accept() {
    let policy = tiered(
        "egress",
        "Admin",
        1,
        json!([]),
        json!([
            {"action": "Accept", "to": [{"networks": ["10.0.3.1/32"]}]},
            {"action": "Deny", "to": [{"networks": ["10.0.0.0/8"]}]},
        ]),
    );
    let c = run(&[], &[policy]);
    assert!(egress(&c, OTHER, HTTP), "the first rule accepts");
    assert!(!egress(&c, CLIENT, HTTP));
    assert!(egress(&c, "172.16.0.1", HTTP), "outside both: the default");
}

#[test]
fn port_numbers_and_ranges_per_protocol() {
    let rule = json!({"action": "Deny", "from": [{"namespaces": {}}], "protocols": [
        {"tcp": {"destinationPort": {"range": {"start": 1000, "end": 2000}}}},
        {"udp": {"destinationPort": {"number": 53}}}]});
    let c = run(&[], &[admin("ports", 1, json!([rule]))]);
    assert!(!ingress(&c, CLIENT, (Tcp, 1000)));
    assert!(!ingress(&c, CLIENT, (Tcp, 2000)));
    assert!(ingress(&c, CLIENT, (Tcp, 2001)));
    assert!(ingress(&c, CLIENT, (Udp, 1500)));
    assert!(!ingress(&c, CLIENT, (Udp, 53)));
}

#[test]
fn named_ports_are_the_destination_pods() {
    // Ingress: web's own http (TCP 8080).
    let rule = json!({"action": "Deny", "from": [{"namespaces": {}}],
        "protocols": [{"destinationNamedPort": "http"}]});
    let c = run(&[], &[admin("named", 1, json!([rule]))]);
    assert!(!ingress(&c, CLIENT, (Tcp, 8080)));
    assert!(ingress(&c, CLIENT, (Tcp, 9090)));
    // Egress: the destination's (client's http is TCP 9090).
    let rule = json!({"action": "Deny", "to": [{"namespaces": {}}],
        "protocols": [{"destinationNamedPort": "http"}]});
    let c = run(
        &[],
        &[tiered("named", "Admin", 1, json!([]), json!([rule]))],
    );
    assert!(!egress(&c, CLIENT, (Tcp, 9090)));
    assert!(egress(&c, CLIENT, (Tcp, 8080)));
    assert!(egress(&c, OTHER, (Tcp, 9090)), "other has no http port");
    assert_eq!(c.problems, vec![], "http is a port of web and client");
}

#[test]
fn a_named_port_no_pod_has_is_a_problem_naming_its_field() {
    let rule = |port: &str| {
        json!({"action": "Accept", "from": [{"namespaces": {}}],
               "protocols": [{"tcp": {"destinationPort": {"number": 80}}},
                             {"destinationNamedPort": port}]})
    };
    let misspelled = admin("named", 1, json!([rule("http"), rule("htp")]));
    let c = run_with_problems(&[], &[misspelled]);
    let problems: Vec<(&str, &str, String)> = c
        .problems
        .iter()
        .map(|p| (p.name.as_str(), p.field.as_str(), p.why.to_string()))
        .collect();
    assert_eq!(
        problems,
        [(
            "named",
            "spec.ingress[1].protocols[1].destinationNamedPort",
            "no pod has a container port named \"htp\"".to_string()
        )]
    );
    // A rule that failed closed already is not reported twice.
    let broken = json!({"action": "Deny", "from": [{"namespaces": {"matchExpressions": [{"key": "a", "operator": "Near"}]}}],
                        "protocols": [{"destinationNamedPort": "htp"}]});
    let c = run_with_problems(&[], &[admin("broken", 1, json!([broken]))]);
    let fields: Vec<&str> = c.problems.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        ["spec.ingress[0].from[0].namespaces.matchExpressions[0].operator"]
    );
}

#[test]
fn node_peers_are_the_nodes_internal_ips() {
    let rule = json!({"action": "Deny", "to": [{"nodes": {"matchLabels": {"role": "db"}}}]});
    let c = run(
        &[],
        &[tiered("nodes", "Admin", 1, json!([]), json!([rule]))],
    );
    assert!(!egress(&c, "192.168.0.9", HTTP));
    assert!(egress(&c, "192.168.0.8", HTTP));
}

#[test]
fn the_node_s_own_traffic_is_never_judged() {
    let deny_all = admin(
        "deny-all",
        1,
        json!([{"action": "Deny", "from": [{"namespaces": {}}]}]),
    );
    let c = run(&[], &[deny_all]);
    assert!(ingress(&c, "192.168.0.1", HTTP));
    assert!(!ingress(&c, CLIENT, HTTP));
}

#[test]
fn a_bad_object_opens_nothing_and_breaks_nothing_else() {
    let bad_accept = tiered(
        "bad-accept",
        "Admin",
        1,
        json!([]),
        json!([{"action": "Accept", "to": [{"networks": ["10.0.2.0/33"]}]}]),
    );
    let np_egress_deny = policy(
        "a",
        "np",
        json!({"podSelector": {}, "policyTypes": ["Egress"]}),
    );
    let namespaces = namespaces();
    let c = compile_all(
        Enforcement::Default,
        &[np_egress_deny],
        &[
            bad_accept,
            admin("deny-b", 2, json!([from_team("Deny", "y")])),
        ],
        &pods(),
        &namespaces,
        &[],
        &[],
    );
    assert_eq!(c.problems.len(), 1, "{c:#?}");
    assert_eq!(c.problems[0].field, "spec.egress[0].to[0].networks[0]");
    assert!(!egress(&c, CLIENT, HTTP), "the bad Accept opens nothing");
    assert!(!ingress(&c, CLIENT, HTTP), "the other policy applies");
    let out_of_range = cnp(
        "far",
        json!({"tier": "Admin", "priority": 5000, "subject": {"namespaces": {}},
            "ingress": [{"action": "Deny", "from": [{"namespaces": {}}]}]}),
    );
    let c = compile_all(
        Enforcement::Default,
        &[],
        &[out_of_range],
        &pods(),
        &namespaces,
        &[],
        &[],
    );
    assert_eq!(c.problems[0].field, "spec.priority");
    assert!(c.state.chains.is_empty(), "it applies nothing");
}

#[test]
fn only_networkpolicy_renders_as_before() {
    // A pod no ClusterNetworkPolicy selects keeps its NetworkPolicy chain alone.
    let c = run(&[np_allowing("y")], &[]);
    let chain = &c.state.chains[&ChainKey {
        direction: Direction::Ingress,
        link: WEB.into(),
    }];
    assert!(chain.admin.is_empty() && chain.baseline.is_empty());
    assert!(chain.policy.is_some());
}

#[test]
fn each_tier_rule_names_its_policy_tier_index_and_name() {
    use crate::policy::state::{ChainKey, Origin};
    // An Accept with a problem (no `networks` in ingress) is left out: the
    // Deny after it keeps index 1.
    let bad_accept = json!({"action": "Accept", "from": [{"networks": ["10.0.0.0/8"]}]});
    let mut deny = from_team("Deny", "y");
    deny["name"] = json!("deny-b");
    let c = compile_all(
        Enforcement::Default,
        &[],
        &[
            admin("admin-deny", 10, json!([bad_accept, deny])),
            baseline("base", 10, json!([from_team("Deny", "z")])),
        ],
        &pods(),
        &namespaces(),
        &[ip("192.168.0.1")],
        &[],
    );
    let key = ChainKey {
        direction: Direction::Ingress,
        link: WEB.into(),
    };
    let chain = &c.state.chains[&key];
    // The node's addresses first: podnet's own rule, no origin.
    assert_eq!(chain.admin[0].origin, None);
    assert_eq!(
        chain.admin[1].origin,
        Some(Origin {
            tier: Tier::Admin,
            policy: "admin-deny".into(),
            index: 1,
            name: Some("deny-b".into()),
        })
    );
    assert_eq!(
        chain.baseline[0].origin,
        Some(Origin {
            tier: Tier::Baseline,
            policy: "base".into(),
            index: 0,
            name: None,
        })
    );
}
