use serde_json::json;

use crate::policy::fixtures::policy as view;
use crate::policy::problem::Why;
use crate::policy::selector::Selector;
use crate::policy::view::{Namespaces, PeerView, PortSpec, PortView, Protocol, RuleView};

fn net(s: &str) -> ipnet::IpNet {
    s.parse().expect("a test network")
}

fn selector(v: serde_json::Value) -> Selector {
    Selector::parse(&serde_json::from_value(v).expect("a selector")).expect("valid")
}

fn types(spec: serde_json::Value) -> (bool, bool) {
    let p = view("ns", "p", spec);
    assert_eq!(p.problems, vec![], "{p:?}");
    (p.ingress.is_some(), p.egress.is_some())
}

#[test]
fn policy_types_default_as_the_api_server_does() {
    // Ingress always; Egress only with egress rules.
    assert_eq!(types(json!({"podSelector": {}})), (true, false));
    assert_eq!(
        types(json!({"podSelector": {}, "egress": []})),
        (true, false)
    );
    assert_eq!(
        types(json!({"podSelector": {}, "egress": [{}]})),
        (true, true)
    );
    assert_eq!(
        types(json!({"podSelector": {}, "policyTypes": []})),
        (true, false)
    );
    // Listed: exactly those.
    assert_eq!(
        types(json!({"podSelector": {}, "policyTypes": ["Egress"]})),
        (false, true)
    );
    assert_eq!(
        types(json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]})),
        (true, true)
    );
    assert_eq!(
        types(json!({"podSelector": {}, "policyTypes": ["Ingress"], "egress": [{}]})),
        (true, false)
    );
}

#[test]
fn a_listed_type_with_no_rules_denies_it_all() {
    let p = view(
        "ns",
        "deny",
        json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
    );
    assert_eq!(p.ingress, Some(vec![]));
    assert_eq!(p.egress, Some(vec![]));
    assert!(p.pod_selector.is_everything());
    // Ingress rules of a policy whose types leave Ingress out are not read.
    let p = view(
        "ns",
        "e",
        json!({"policyTypes": ["Egress"], "ingress": [{}]}),
    );
    assert_eq!((p.ingress, p.egress), (None, Some(vec![])));
}

#[test]
fn an_unknown_policy_type_is_a_problem() {
    let p = view("ns", "p", json!({"policyTypes": ["Sideways", "Egress"]}));
    assert_eq!((p.ingress.is_some(), p.egress.is_some()), (false, true));
    assert_eq!(p.problems.len(), 1);
    assert_eq!(p.problems[0].field, "spec.policyTypes[0]");
    assert_eq!(p.problems[0].why, Why::UnknownPolicyType("Sideways".into()));
    assert_eq!(
        p.problems[0].to_string(),
        "NetworkPolicy ns/p, spec.policyTypes[0]: unknown policy type \"Sideways\" (Ingress, Egress)"
    );
}

#[test]
fn peers_of_each_kind() {
    let p = view(
        "home",
        "p",
        json!({"ingress": [{"from": [
            {"podSelector": {"matchLabels": {"a": "x"}}},
            {"namespaceSelector": {"matchLabels": {"t": "y"}}},
            {"namespaceSelector": {}, "podSelector": {"matchLabels": {"a": "x"}}},
            {"ipBlock": {"cidr": "10.1.2.3/16", "except": ["10.1.9.0/24"]}},
            {},
        ]}]}),
    );
    let ax = selector(json!({"matchLabels": {"a": "x"}}));
    let ty = selector(json!({"matchLabels": {"t": "y"}}));
    let peers = &p
        .ingress
        .as_ref()
        .map(|r| r[0].peers.clone())
        .unwrap_or_default();
    assert_eq!(
        peers,
        &vec![
            PeerView::Pods {
                namespaces: Namespaces::Own("home".into()),
                pods: ax.clone()
            },
            PeerView::Pods {
                namespaces: Namespaces::Matching(ty),
                pods: Selector::everything()
            },
            PeerView::Pods {
                namespaces: Namespaces::Matching(Selector::everything()),
                pods: ax
            },
            // The host bits of a CIDR are dropped, as the API server's validation allows.
            PeerView::Block {
                net: net("10.1.0.0/16"),
                except: vec![net("10.1.9.0/24")]
            },
            PeerView::Nothing,
        ]
    );
}

#[test]
fn an_invalid_cidr_or_except_allows_nothing_and_names_the_field() {
    let p = view(
        "ns",
        "p",
        json!({"policyTypes": ["Egress"], "egress": [{"to": [
            {"ipBlock": {"cidr": "10.0.0.0/33"}},
            {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16", "nonsense"]}},
            {"ipBlock": {"cidr": "fd00::/64"}},
        ]}]}),
    );
    let peers = p
        .egress
        .as_ref()
        .map(|r| r[0].peers.clone())
        .unwrap_or_default();
    assert_eq!(peers[0], PeerView::Nothing);
    assert_eq!(peers[1], PeerView::Nothing);
    assert!(matches!(peers[2], PeerView::Block { .. }));
    let fields: Vec<&str> = p.problems.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.egress[0].to[0].ipBlock.cidr",
            "spec.egress[0].to[1].ipBlock.except[1]"
        ]
    );
    assert!(matches!(&p.problems[0].why, Why::InvalidCidr { value, .. } if value == "10.0.0.0/33"));
}

#[test]
fn an_invalid_selector_in_a_peer_matches_nothing() {
    let p = view(
        "ns",
        "p",
        json!({"ingress": [{"from": [
            {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}},
        ]}]}),
    );
    assert_eq!(p.problems.len(), 1);
    assert_eq!(
        p.problems[0].field,
        "spec.ingress[0].from[0].podSelector.matchExpressions[0].operator"
    );
    let rules = p.ingress.unwrap_or_default();
    assert_eq!(
        rules[0].peers,
        vec![PeerView::Pods {
            namespaces: Namespaces::Own("ns".into()),
            pods: Selector::Nothing
        }]
    );
    // The policy's own selector: the policy selects no pod.
    let p = view(
        "ns",
        "p",
        json!({"podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}),
    );
    assert_eq!(p.pod_selector, Selector::Nothing);
    assert_eq!(
        p.problems[0].field,
        "spec.podSelector.matchExpressions[0].values"
    );
}

fn ports(list: serde_json::Value) -> (Vec<PortView>, Vec<(String, Why)>) {
    let p = view("ns", "p", json!({"ingress": [{"ports": list}]}));
    let rules: Vec<RuleView> = p.ingress.unwrap_or_default();
    let problems = p.problems.into_iter().map(|p| (p.field, p.why)).collect();
    (rules[0].ports.clone(), problems)
}

#[test]
fn ports_default_to_tcp_and_take_numbers_names_and_ranges() {
    let (list, problems) = ports(json!([
        {"port": 80},
        {"protocol": "UDP", "port": 53},
        {"protocol": "SCTP"},
        {"port": "http"},
        {"port": 8000, "endPort": 8080},
        {"port": 9000, "endPort": 9000},
    ]));
    assert_eq!(problems, vec![]);
    let port = |protocol, spec| PortView::Port { protocol, spec };
    assert_eq!(
        list,
        vec![
            port(Protocol::Tcp, PortSpec::Range(80, 80)),
            port(Protocol::Udp, PortSpec::Range(53, 53)),
            port(Protocol::Sctp, PortSpec::Any),
            port(Protocol::Tcp, PortSpec::Named("http".into())),
            port(Protocol::Tcp, PortSpec::Range(8000, 8080)),
            port(Protocol::Tcp, PortSpec::Range(9000, 9000)),
        ]
    );
}

#[test]
fn invalid_ports_allow_nothing_and_are_reported() {
    let (list, problems) = ports(json!([
        {"port": 8080, "endPort": 8000},
        {"port": 0},
        {"port": 70000},
        {"port": 80, "endPort": 70000},
        {"port": "http", "endPort": 90},
        {"endPort": 90},
        {"protocol": "ICMP", "port": 1},
        {"protocol": "tcp", "port": 1},
        {"port": 443},
    ]));
    assert_eq!(list.iter().filter(|p| **p == PortView::Nothing).count(), 8);
    assert_eq!(
        list[8],
        PortView::Port {
            protocol: Protocol::Tcp,
            spec: PortSpec::Range(443, 443)
        }
    );
    let base = "spec.ingress[0].ports";
    assert_eq!(
        problems,
        vec![
            (
                format!("{base}[0].endPort"),
                Why::EndPortBelowPort {
                    port: 8080,
                    end: 8000
                }
            ),
            (format!("{base}[1].port"), Why::PortOutOfRange(0)),
            (format!("{base}[2].port"), Why::PortOutOfRange(70000)),
            (format!("{base}[3].endPort"), Why::PortOutOfRange(70000)),
            (
                format!("{base}[4].endPort"),
                Why::EndPortWithoutNumber("http".into())
            ),
            (
                format!("{base}[5].endPort"),
                Why::EndPortWithoutNumber("no port".into())
            ),
            (
                format!("{base}[6].protocol"),
                Why::UnknownProtocol("ICMP".into())
            ),
            (
                format!("{base}[7].protocol"),
                Why::UnknownProtocol("tcp".into())
            ),
        ]
    );
}
