use std::collections::BTreeSet;

use serde_json::json;

use super::*;
use crate::policy::fixtures::{
    Placed, compile_placed, ip, local, namespace, pod, policy, with_port,
};
use crate::policy::state::Diff;
use crate::policy::view::Protocol::{Tcp, Udp};

const NODE: &str = "192.168.0.1";

fn run(policies: &[PolicyView], pods: &[Placed]) -> Compiled {
    run_as(Enforcement::Default, policies, pods)
}

fn run_always(policies: &[PolicyView], pods: &[Placed]) -> Compiled {
    run_as(Enforcement::Always, policies, pods)
}

fn run_as(enforcement: Enforcement, policies: &[PolicyView], pods: &[Placed]) -> Compiled {
    let namespaces = [
        namespace("a", &[("team", "x")]),
        namespace("b", &[("team", "y")]),
        namespace("c", &[("team", "x")]),
    ];
    compile_placed(enforcement, policies, pods, &namespaces, &[ip(NODE)])
}

/// Pods used by most tests: web (local, a), db (local, a), client in a, b, c.
fn pods() -> Vec<Placed> {
    vec![
        local(
            pod("a", "web", &[("app", "web")], &["10.0.0.10", "fd00::10"]),
            "lxcweb",
        ),
        local(pod("a", "db", &[("app", "db")], &["10.0.0.11"]), "lxcdb"),
        pod("a", "client", &[("role", "client")], &["10.0.1.1"]),
        pod(
            "b",
            "client",
            &[("role", "client")],
            &["10.0.2.1", "fd00::21"],
        ),
        pod("c", "other", &[("role", "other")], &["10.0.3.1"]),
    ]
}

fn key(direction: Direction, link: &str) -> ChainKey {
    ChainKey {
        direction,
        link: link.into(),
    }
}

fn node_rule() -> Rule {
    Rule {
        peer: PeerMatch::Set(NODE_SET.into()),
        port: PortMatch::Any,
    }
}

/// The NetworkPolicy tier's rules of a chain (which must isolate).
fn chain(c: &Compiled, direction: Direction, link: &str) -> Vec<Rule> {
    c.state
        .chains
        .get(&key(direction, link))
        .and_then(|chain| chain.policy.clone())
        .unwrap_or_else(|| panic!("no chain {direction:?} {link}: {c:#?}"))
}

/// The addresses of the set a rule's peer names.
fn members(c: &Compiled, rule: &Rule) -> BTreeSet<Element> {
    match &rule.peer {
        PeerMatch::Set(name) => c.state.sets[name].elements.as_ref().clone(),
        other => panic!("not a set peer: {other:?}"),
    }
}

fn addrs(list: &[&str]) -> BTreeSet<Element> {
    list.iter().map(|s| Element::Address(ip(s))).collect()
}

#[test]
fn without_policies_every_pod_is_open_and_only_the_node_set_exists() {
    let c = run(&[], &pods());
    assert!(c.state.chains.is_empty());
    assert_eq!(c.state.sets.keys().collect::<Vec<_>>(), [NODE_SET]);
    assert_eq!(*c.state.sets[NODE_SET].elements, addrs(&[NODE]));
    assert!(c.problems.is_empty());
}

#[test]
fn default_deny_ingress_selects_every_pod_of_its_namespace_and_allows_only_the_node() {
    let c = run(&[policy("a", "deny", json!({"podSelector": {}}))], &pods());
    assert_eq!(chain(&c, Direction::Ingress, "lxcweb"), vec![node_rule()]);
    assert_eq!(chain(&c, Direction::Ingress, "lxcdb"), vec![node_rule()]);
    assert_eq!(c.state.chains.len(), 2, "egress stays open");
    // A policy of another namespace selects none of them.
    let c = run(&[policy("b", "deny", json!({"podSelector": {}}))], &pods());
    assert!(c.state.chains.is_empty());
}

#[test]
fn default_deny_egress_leaves_ingress_open() {
    let c = run(
        &[policy("a", "deny", json!({"policyTypes": ["Egress"]}))],
        &pods(),
    );
    assert_eq!(chain(&c, Direction::Egress, "lxcweb"), vec![]);
    assert!(
        !c.state
            .chains
            .contains_key(&key(Direction::Ingress, "lxcweb"))
    );
}

#[test]
fn a_pod_selector_peer_is_the_pods_of_the_policys_namespace() {
    let p = policy(
        "a",
        "p",
        json!({"podSelector": {"matchLabels": {"app": "web"}},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]}),
    );
    let c = run(&[p], &pods());
    let rules = chain(&c, Direction::Ingress, "lxcweb");
    assert_eq!(rules.len(), 2);
    assert_eq!(rules[0], node_rule());
    assert_eq!(rules[1].port, PortMatch::Any);
    assert_eq!(
        members(&c, &rules[1]),
        addrs(&["10.0.1.1"]),
        "not b's client"
    );
    assert!(
        !c.state
            .chains
            .contains_key(&key(Direction::Ingress, "lxcdb")),
        "db is not selected"
    );
}

#[test]
fn a_namespace_selector_peer_is_every_pod_of_the_matching_namespaces() {
    let p = policy(
        "a",
        "p",
        json!({"ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "x"}}}]}]}),
    );
    let c = run(&[p], &pods());
    let rules = chain(&c, Direction::Ingress, "lxcweb");
    assert_eq!(
        members(&c, &rules[1]),
        addrs(&["10.0.0.10", "fd00::10", "10.0.0.11", "10.0.1.1", "10.0.3.1"])
    );
}

#[test]
fn both_selectors_in_one_peer_are_the_matching_pods_of_the_matching_namespaces() {
    let p = policy(
        "a",
        "p",
        json!({"ingress": [{"from": [{
            "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["x", "y"]}]},
            "podSelector": {"matchLabels": {"role": "client"}},
        }]}]}),
    );
    let c = run(&[p], &pods());
    let rules = chain(&c, Direction::Ingress, "lxcweb");
    assert_eq!(
        members(&c, &rules[1]),
        addrs(&["10.0.1.1", "10.0.2.1", "fd00::21"])
    );
}

#[test]
fn a_pod_in_a_namespace_the_cache_lacks_has_no_labels() {
    let mut all = pods();
    all.push(pod("ghost", "g", &[("role", "client")], &["10.0.9.9"]));
    let p = policy(
        "a",
        "p",
        json!({"ingress": [{"from": [{"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}}]}]}),
    );
    let c = run(&[p], &all);
    assert_eq!(
        members(&c, &chain(&c, Direction::Ingress, "lxcweb")[1]),
        addrs(&["10.0.9.9"])
    );
}

#[test]
fn an_ip_block_keeps_only_the_excepts_inside_it_merged() {
    let p = policy(
        "a",
        "p",
        json!({"ingress": [{"from": [
            {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16", "10.1.2.0/24", "10.2.0.0/16", "10.3.0.0/16", "192.168.0.0/16", "fd00::/8"]}},
            {"ipBlock": {"cidr": "172.16.0.0/16", "except": ["172.0.0.0/8"]}},
        ]}]}),
    );
    let c = run(&[p], &pods());
    let rules = chain(&c, Direction::Ingress, "lxcweb");
    let net = |s: &str| s.parse::<ipnet::IpNet>().expect("net");
    let routers = Some(set_name(
        "block",
        &(net("10.0.0.0/8"), [net("10.1.0.0/16"), net("10.2.0.0/15")]),
    ));
    assert_eq!(
        rules[1..],
        [Rule {
            peer: PeerMatch::Block {
                net: net("10.0.0.0/8"),
                except: vec![net("10.1.0.0/16"), net("10.2.0.0/15")],
                routers,
            },
            port: PortMatch::Any,
        }],
        "the second block is all except: it allows nothing"
    );
}

#[test]
fn the_rules_of_every_selecting_policy_add_up_and_a_shared_selector_is_one_set() {
    let clients = json!({"podSelector": {"matchLabels": {"role": "client"}}});
    let p1 = policy(
        "a",
        "p1",
        json!({"ingress": [{"from": [clients], "ports": [{"port": 80}]}]}),
    );
    let p2 = policy(
        "a",
        "p2",
        json!({"podSelector": {"matchLabels": {"app": "web"}},
               "ingress": [{"from": [clients], "ports": [{"port": 443}, {"protocol": "UDP", "port": 53}]}]}),
    );
    let c = run(&[p1, p2], &pods());
    let web = chain(&c, Direction::Ingress, "lxcweb");
    let db = chain(&c, Direction::Ingress, "lxcdb");
    let ports: Vec<&PortMatch> = web[1..].iter().map(|r| &r.port).collect();
    assert_eq!(
        ports,
        [
            &PortMatch::Ranges(Tcp, vec![(80, 80)]),
            &PortMatch::Ranges(Tcp, vec![(443, 443)]),
            &PortMatch::Ranges(Udp, vec![(53, 53)])
        ]
    );
    assert_eq!(db[1..].len(), 1);
    assert_eq!(
        c.state.sets.len(),
        2,
        "node and one set of clients: {:?}",
        c.state.sets.keys()
    );
    assert!(web[1..].iter().all(|r| r.peer == db[1].peer));
}

#[test]
fn ingress_named_ports_resolve_against_each_selected_pod() {
    let mut all = pods();
    all[0] = with_port(all[0].clone(), "http", Tcp, 8080);
    all[1] = with_port(all[1].clone(), "http", Tcp, 9090);
    all[1] = with_port(all[1].clone(), "dns", Udp, 53);
    let p = policy(
        "a",
        "p",
        json!({"ingress": [{"ports": [{"port": "http"}, {"port": "dns"}, {"protocol": "UDP", "port": "dns"}]}]}),
    );
    let c = run(&[p], &all);
    let port_of = |link| {
        chain(&c, Direction::Ingress, link)[1..]
            .iter()
            .map(|r| (r.peer.clone(), r.port.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        port_of("lxcweb"),
        [(PeerMatch::Any, PortMatch::Ranges(Tcp, vec![(8080, 8080)]))]
    );
    assert_eq!(
        port_of("lxcdb"),
        [
            (PeerMatch::Any, PortMatch::Ranges(Tcp, vec![(9090, 9090)])),
            (PeerMatch::Any, PortMatch::Ranges(Udp, vec![(53, 53)]))
        ],
        "TCP dns is no port of db's"
    );
    let fields: Vec<&str> = c.problems.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        ["spec.ingress[0].ports[1].port"],
        "no pod has a TCP port named dns"
    );
}

#[test]
fn egress_named_ports_are_the_destination_pods_address_and_port() {
    let mut all = pods();
    all[2] = with_port(all[2].clone(), "metrics", Tcp, 9100);
    all[3] = with_port(all[3].clone(), "metrics", Tcp, 9200);
    let p = policy(
        "a",
        "p",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Egress"],
               "egress": [{"ports": [{"port": "metrics"}]}]}),
    );
    let c = run(&[p], &all);
    let rules = chain(&c, Direction::Egress, "lxcweb");
    let [
        Rule {
            peer: PeerMatch::Any,
            port: PortMatch::Named(Tcp, set),
        },
    ] = rules.as_slice()
    else {
        panic!("{rules:?}")
    };
    let want: BTreeSet<Element> = [("10.0.1.1", 9100), ("10.0.2.1", 9200), ("fd00::21", 9200)]
        .iter()
        .map(|(a, p)| Element::AddressPort(ip(a), *p))
        .collect();
    assert_eq!(*c.state.sets[set].elements, want);
    assert_eq!(c.state.sets[set].kind, SetKind::AddressPorts);
}

#[test]
fn a_port_name_no_pod_has_allows_nothing_on_its_rule_and_is_reported_once() {
    let p = policy(
        "a",
        "p",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress", "Egress"],
               "ingress": [{"ports": [{"port": "nope"}]}, {"ports": [{"port": 22}]}],
               "egress": [{"ports": [{"port": "nope"}]}]}),
    );
    let c = run(&[p], &pods());
    assert_eq!(
        chain(&c, Direction::Ingress, "lxcweb"),
        vec![
            node_rule(),
            Rule {
                peer: PeerMatch::Any,
                port: PortMatch::Ranges(Tcp, vec![(22, 22)])
            }
        ]
    );
    // Egress: a rule on an empty set, so a pod that later has the name is one element.
    let egress = chain(&c, Direction::Egress, "lxcweb");
    let [
        Rule {
            port: PortMatch::Named(Tcp, set),
            ..
        },
    ] = egress.as_slice()
    else {
        panic!("{egress:?}")
    };
    assert!(c.state.sets[set].elements.is_empty());
    let fields: Vec<&str> = c.problems.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.egress[0].ports[0].port",
            "spec.ingress[0].ports[0].port"
        ]
    );
    assert!(matches!(&c.problems[0].why, Why::UnknownPortName { name, .. } if name == "nope"));
}

#[test]
fn a_rule_whose_every_port_or_peer_is_invalid_allows_nothing_not_everything() {
    let p = policy(
        "a",
        "p",
        json!({"podSelector": {"matchLabels": {"app": "web"}},
        "ingress": [
            {"ports": [{"port": 90, "endPort": 80}]},
            {"from": [{"ipBlock": {"cidr": "bogus"}}]},
            {"from": [{"podSelector": {"matchLabels": {"role": "client"}}}], "ports": [{"protocol": "UDP"}, {"protocol": "UDP", "port": 5}]},
        ]}),
    );
    let c = run(&[p], &pods());
    let rules = chain(&c, Direction::Ingress, "lxcweb");
    assert_eq!(rules.len(), 2, "{rules:?}");
    assert_eq!(
        rules[1].port,
        PortMatch::Protocol(Udp),
        "a whole protocol covers its ports"
    );
    assert_eq!(c.problems.len(), 2, "{:?}", c.problems);
}

#[test]
fn a_pod_whose_link_nftables_cannot_name_is_listed_not_enforced() {
    let mut all = pods();
    all[0].link = Some("bad\"link".into());
    let c = run(&[policy("a", "deny", json!({}))], &all);
    assert_eq!(c.unusable_links, ["a/web"]);
    assert_eq!(c.state.chains.len(), 1);
}

#[test]
fn a_label_change_that_moves_a_remote_pod_into_a_selector_is_one_element() {
    let p = [policy(
        "a",
        "p",
        json!({"ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"role": "client"}}}]}]}),
    )];
    let mut all = pods();
    let before = run(&p, &all);
    all[4].labels.insert("role".into(), "client".into());
    let after = run(&p, &all);
    let diff = before.state.diff(&after.state);
    let set = match &chain(&after, Direction::Ingress, "lxcweb")[1].peer {
        PeerMatch::Set(s) => s.clone(),
        other => panic!("{other:?}"),
    };
    let want = Diff {
        elements_added: [(set, addrs(&["10.0.3.1"]))].into(),
        ..Diff::default()
    };
    assert_eq!(diff, want);
    assert!(after.state.diff(&after.state).is_empty());
}

#[test]
fn a_local_pod_that_becomes_selected_gets_its_chain_and_loses_it_again() {
    let p = [policy(
        "a",
        "p",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [{"ports": [{"port": 80}]}]}),
    )];
    let mut all = pods();
    let before = run(&p, &all);
    all[1].labels.insert("app".into(), "web".into());
    let after = run(&p, &all);
    let diff = before.state.diff(&after.state);
    assert_eq!(
        diff.chains_added.keys().collect::<Vec<_>>(),
        [&key(Direction::Ingress, "lxcdb")]
    );
    assert_eq!(
        diff,
        Diff {
            chains_added: diff.chains_added.clone(),
            ..Diff::default()
        }
    );
    let back = after.state.diff(&before.state);
    assert_eq!(
        back,
        Diff {
            chains_removed: [key(Direction::Ingress, "lxcdb")].into(),
            ..Diff::default()
        }
    );
}

#[test]
fn a_change_no_selector_sees_is_no_diff_and_a_new_address_is_two_elements() {
    let p = [policy(
        "a",
        "p",
        json!({"ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]}),
    )];
    let mut all = pods();
    let before = run(&p, &all);
    all[3].labels.insert("unrelated".into(), "yes".into());
    all[4].ips.push(ip("fd00::31"));
    assert!(before.state.diff(&run(&p, &all).state).is_empty());
    all[2].ips = vec![ip("10.0.1.99")];
    let diff = before.state.diff(&run(&p, &all).state);
    let set = diff
        .elements_added
        .keys()
        .next()
        .cloned()
        .unwrap_or_default();
    let want = Diff {
        elements_added: [(set.clone(), addrs(&["10.0.1.99"]))].into(),
        elements_removed: [(set, addrs(&["10.0.1.1"]))].into(),
        ..Diff::default()
    };
    assert_eq!(diff, want);
}

#[test]
fn always_isolates_every_local_pod_in_both_directions_but_for_its_node() {
    let c = run_always(&[], &pods());
    let keys: Vec<(Direction, &str)> = c
        .state
        .chains
        .keys()
        .map(|k| (k.direction, k.link.as_str()))
        .collect();
    assert_eq!(
        keys,
        [
            (Direction::Ingress, "lxcdb"),
            (Direction::Ingress, "lxcweb"),
            (Direction::Egress, "lxcdb"),
            (Direction::Egress, "lxcweb"),
        ],
        "every local pod, no remote one"
    );
    assert_eq!(chain(&c, Direction::Ingress, "lxcweb"), [node_rule()]);
    assert!(chain(&c, Direction::Egress, "lxcweb").is_empty());
    assert_eq!(c, run_always(&[], &pods()), "the same state each time");
}

#[test]
fn always_adds_what_policies_allow_and_keeps_unselected_directions_shut() {
    let allow = policy(
        "a",
        "allow",
        json!({"podSelector": {"matchLabels": {"app": "web"}},
               "ingress": [{"ports": [{"port": 80}]}]}),
    );
    let c = run_always(std::slice::from_ref(&allow), &pods());
    let by_default = run(&[allow], &pods());
    assert_eq!(
        chain(&c, Direction::Ingress, "lxcweb"),
        chain(&by_default, Direction::Ingress, "lxcweb"),
        "what a policy allows is the same in both modes"
    );
    assert!(
        chain(&c, Direction::Egress, "lxcweb").is_empty(),
        "no policy selects web for egress: isolated all the same"
    );
    assert!(
        !by_default
            .state
            .chains
            .contains_key(&key(Direction::Egress, "lxcweb"))
    );
    assert_eq!(chain(&c, Direction::Ingress, "lxcdb"), [node_rule()]);
}

/// Issue 53, item 4: other nodes' host traffic to a local pod carries the
/// node's router address in tunnel routing (the route to a remote pod CIDR has
/// `src` = the router address) and its InternalIP in native routing.
mod node_traffic {
    use super::*;
    use crate::policy::fixtures::{compile_with_nodes, node, peer_allowed};
    use crate::policy::view::NodeView;

    /// This node (n1), n2 on the same node network, n3 on another; each with an
    /// IPv4 and an IPv6 InternalIP and router address.
    fn nodes() -> Vec<NodeView> {
        vec![
            node("n1", &[NODE, "fd00:192::1"], &["10.61.1.1", "fd61:1::1"]),
            node(
                "n2",
                &["192.168.0.2", "fd00:192::2"],
                &["10.61.2.1", "fd61:2::1"],
            ),
            node(
                "n3",
                &["192.168.1.3", "fd00:193::3"],
                &["10.61.3.1", "fd61:3::1"],
            ),
        ]
    }

    /// The source of `node`'s host traffic to another node's pod, per family.
    fn source(node: &NodeView, tunnel: bool, v6: bool) -> IpAddr {
        let of = |list: &[IpAddr]| list.iter().copied().find(|ip| ip.is_ipv6() == v6);
        let list = match tunnel {
            true => &node.router_ips,
            false => &node.internal_ips,
        };
        of(list).expect("an address of the family")
    }

    fn web_from(peers: serde_json::Value, nodes: &[NodeView]) -> Compiled {
        let p = policy(
            "a",
            "p",
            json!({"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [{"from": peers}]}),
        );
        let namespaces = [namespace("a", &[])];
        compile_with_nodes(
            Enforcement::Default,
            &[p],
            &pods(),
            &namespaces,
            &[ip(NODE)],
            nodes,
        )
    }

    /// Whether web takes `node`'s host traffic in tunnel and in native routing.
    fn takes(c: &Compiled, node: &NodeView, v6: bool) -> (bool, bool) {
        let from = |tunnel| source(node, tunnel, v6);
        let allowed = |tunnel| peer_allowed(&c.state, Direction::Ingress, "lxcweb", from(tunnel));
        (allowed(true), allowed(false))
    }

    #[test]
    fn without_the_nodes_addresses_tunnel_routing_misses_what_native_routing_matches() {
        // What podnet did before it knew the nodes: the router address is
        // judged as itself, outside the node network's block.
        let blocks = json!([{"ipBlock": {"cidr": "192.168.0.0/24"}}]);
        let c = web_from(blocks, &[]);
        let n2 = &nodes()[1];
        assert_eq!(takes(&c, n2, false), (false, true), "(tunnel, native)");
    }

    #[test]
    fn an_ingress_ip_block_judges_a_nodes_router_address_as_its_internal_ip() {
        let blocks = json!([
            {"ipBlock": {"cidr": "192.168.0.0/24"}},
            {"ipBlock": {"cidr": "fd00:192::/64"}},
        ]);
        let c = web_from(blocks, &nodes());
        let [_, n2, n3] = &nodes()[..] else {
            panic!("three nodes")
        };
        for v6 in [false, true] {
            assert_eq!(
                takes(&c, n2, v6),
                (true, true),
                "n2 is in the block, v6 {v6}"
            );
            assert_eq!(takes(&c, n3, v6), (false, false), "n3 is not, v6 {v6}");
        }
        let routers = |c: &Compiled| {
            members(
                c,
                &Rule {
                    peer: PeerMatch::Set(ROUTER_SET.into()),
                    port: PortMatch::Any,
                },
            )
        };
        assert_eq!(
            routers(&c),
            addrs(&[
                "10.61.1.1",
                "10.61.2.1",
                "10.61.3.1",
                "fd61:1::1",
                "fd61:2::1",
                "fd61:3::1"
            ])
        );
    }

    #[test]
    fn an_except_of_the_node_network_and_a_block_of_pod_cidrs_agree_in_both_modes() {
        let all_but_nodes =
            json!([{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["192.168.0.0/24"]}}]);
        let c = web_from(all_but_nodes, &nodes());
        let [_, n2, n3] = &nodes()[..] else {
            panic!("three nodes")
        };
        assert_eq!(takes(&c, n2, false), (false, false), "n2 is excepted");
        assert_eq!(takes(&c, n3, false), (true, true), "n3 is not");
        let pod_cidrs = json!([{"ipBlock": {"cidr": "10.61.0.0/16"}}]);
        let c = web_from(pod_cidrs, &nodes());
        assert_eq!(
            takes(&c, n2, false),
            (false, false),
            "a router address is no pod"
        );
        let remote_pod = ip("10.61.2.7");
        assert!(peer_allowed(
            &c.state,
            Direction::Ingress,
            "lxcweb",
            remote_pod
        ));
    }

    #[test]
    fn a_router_address_two_nodes_list_stands_for_neither_and_egress_judges_as_sent() {
        let mut both = nodes();
        both[2].router_ips[0] = ip("10.61.2.1");
        let blocks = json!([{"ipBlock": {"cidr": "192.168.0.0/23"}}]);
        let c = web_from(blocks, &both);
        assert!(!peer_allowed(
            &c.state,
            Direction::Ingress,
            "lxcweb",
            ip("10.61.2.1")
        ));
        assert!(peer_allowed(
            &c.state,
            Direction::Ingress,
            "lxcweb",
            ip("192.168.0.2")
        ));
        // Egress: the destination the pod chose, router address or not.
        let p = policy(
            "a",
            "p",
            json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Egress"],
                   "egress": [{"to": [{"ipBlock": {"cidr": "10.61.0.0/16"}}]}]}),
        );
        let c = compile_with_nodes(
            Enforcement::Default,
            &[p],
            &pods(),
            &[],
            &[ip(NODE)],
            &nodes(),
        );
        assert!(peer_allowed(
            &c.state,
            Direction::Egress,
            "lxcweb",
            ip("10.61.2.1")
        ));
        assert!(!peer_allowed(
            &c.state,
            Direction::Egress,
            "lxcweb",
            ip("192.168.0.2")
        ));
        assert!(!c.state.sets.contains_key(ROUTER_SET));
    }

    #[test]
    fn a_node_that_joins_is_set_elements_not_a_chain_replaced() {
        let blocks = json!([{"ipBlock": {"cidr": "192.168.0.0/24"}}]);
        let before = web_from(blocks.clone(), &nodes()[..2]);
        let after = web_from(blocks, &nodes());
        let diff = before.state.diff(&after.state);
        assert!(
            diff.chains_replaced.is_empty() && diff.chains_added.is_empty(),
            "{diff:?}"
        );
        assert_eq!(
            diff.elements_added.keys().collect::<Vec<_>>(),
            [ROUTER_SET],
            "n3 is outside the block: its router address is only excluded"
        );
    }
}

/// Issue 53, item 4: a pod and itself. Traffic to the pod's own address never
/// leaves its namespace (the kernel delivers it on `lo`): no table sees it. A
/// pod that reaches itself through a Service (kube-proxy's DNAT back to it, the
/// hairpin) leaves through its host link and comes back through it, with its
/// own address as the source in the forward hook (kube-proxy's masquerade of
/// hairpin traffic is in postrouting, after it): a peer like any other.
mod own_address {
    use super::*;
    use crate::policy::fixtures::peer_allowed;

    const WEB: [&str; 2] = ["10.0.0.10", "fd00::10"];

    fn allowed(c: &Compiled, direction: Direction) -> Vec<bool> {
        let own = WEB.map(ip);
        own.iter()
            .map(|a| peer_allowed(&c.state, direction, "lxcweb", *a))
            .collect()
    }

    #[test]
    fn hairpin_traffic_is_denied_by_an_ingress_policy_that_does_not_name_the_pod() {
        let p = policy(
            "a",
            "p",
            json!({"podSelector": {"matchLabels": {"app": "web"}},
                   "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]}),
        );
        let c = run(&[p], &pods());
        assert_eq!(allowed(&c, Direction::Ingress), [false, false]);
        assert!(peer_allowed(
            &c.state,
            Direction::Ingress,
            "lxcweb",
            ip("10.0.1.1")
        ));
        let always = run_always(&[], &pods());
        assert_eq!(allowed(&always, Direction::Ingress), [false, false]);
        assert_eq!(allowed(&always, Direction::Egress), [false, false]);
    }

    #[test]
    fn hairpin_traffic_passes_where_a_policy_names_the_pod_in_both_directions() {
        let web = json!([{"podSelector": {"matchLabels": {"app": "web"}}}]);
        let p = policy(
            "a",
            "p",
            json!({"podSelector": {"matchLabels": {"app": "web"}},
                   "policyTypes": ["Ingress", "Egress"],
                   "ingress": [{"from": web}], "egress": [{"to": web}]}),
        );
        let c = run(&[p], &pods());
        assert_eq!(allowed(&c, Direction::Ingress), [true, true]);
        assert_eq!(allowed(&c, Direction::Egress), [true, true]);
        let by_block = policy(
            "a",
            "p",
            json!({"podSelector": {"matchLabels": {"app": "web"}},
                   "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.10/32"}}]}]}),
        );
        let c = run(&[by_block], &pods());
        assert_eq!(allowed(&c, Direction::Ingress), [true, false]);
    }
}
