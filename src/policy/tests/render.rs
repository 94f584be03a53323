use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::policy::check::Part;
use crate::policy::fixtures::ip;
use crate::policy::state::FORWARD_CHAIN;
use crate::policy::state::{
    ChainKey, Diff, Direction, Element, Origin, PeerMatch, PortMatch, Rule, Set, SetKind, State,
};
use crate::policy::verdict::DropLog;
use crate::policy::view::Protocol::{Sctp, Tcp, Udp};
use crate::policy::view::Tier;

fn addrs(list: &[&str]) -> BTreeSet<Element> {
    list.iter().map(|s| Element::Address(ip(s))).collect()
}

fn key(direction: Direction, link: &str) -> ChainKey {
    ChainKey {
        direction,
        link: link.into(),
    }
}

fn set(name: &str) -> PeerMatch {
    PeerMatch::Set(name.into())
}

/// A web pod that takes TCP 80 and 8000-8080 from the clients and anything from
/// 10/8 but 10.1/16 (two nodes' router addresses judged as their InternalIPs,
/// one of them inside), and may reach the clients' named port and UDP 53.
fn state() -> State {
    let sets = BTreeMap::from([
        (
            "block_x".to_string(),
            Set::new(SetKind::Addresses, addrs(&["10.61.2.1"])),
        ),
        (
            "router".to_string(),
            Set::new(SetKind::Addresses, addrs(&["10.61.2.1", "10.61.3.1"])),
        ),
        (
            "node".to_string(),
            Set::new(SetKind::Addresses, addrs(&["192.168.0.1", "fd00::1"])),
        ),
        (
            "peer_c".to_string(),
            Set::new(SetKind::Addresses, addrs(&["10.0.1.1", "10.0.1.2"])),
        ),
        (
            "port_m".to_string(),
            Set::new(
                SetKind::AddressPorts,
                [Element::AddressPort(ip("fd00::5"), 9100)],
            ),
        ),
    ]);
    let ingress = vec![
        Rule {
            peer: set("node"),
            port: PortMatch::Any,
        },
        Rule {
            peer: set("peer_c"),
            port: PortMatch::Ranges(Tcp, vec![(80, 80), (8000, 8080)]),
        },
        Rule {
            peer: PeerMatch::Block {
                net: "10.0.0.0/8".parse().expect("net"),
                except: vec!["10.1.0.0/16".parse().expect("net")],
                routers: Some("block_x".into()),
            },
            port: PortMatch::Any,
        },
    ];
    let egress = vec![
        Rule {
            peer: PeerMatch::Any,
            port: PortMatch::Named(Tcp, "port_m".into()),
        },
        Rule {
            peer: PeerMatch::Any,
            port: PortMatch::Ranges(Udp, vec![(53, 53)]),
        },
        Rule {
            peer: PeerMatch::Block {
                net: "fd00::/8".parse().expect("net"),
                except: vec![],
                routers: None,
            },
            port: PortMatch::Protocol(Sctp),
        },
    ];
    State {
        sets,
        chains: BTreeMap::from([
            (key(Direction::Ingress, "lxcweb"), Chain::isolated(ingress)),
            (key(Direction::Egress, "lxcweb"), Chain::isolated(egress)),
        ]),
    }
}

#[test]
fn the_whole_table_replaces_the_old_one_in_one_script() {
    let want = "\
table inet podnet_policy
delete table inet podnet_policy
table inet podnet_policy {
\tset block_x_v4 { type ipv4_addr; elements = { 10.61.2.1 } }
\tset block_x_v6 { type ipv6_addr; }
\tset node_v4 { type ipv4_addr; elements = { 192.168.0.1 } }
\tset node_v6 { type ipv6_addr; elements = { fd00::1 } }
\tset peer_c_v4 { type ipv4_addr; elements = { 10.0.1.1, 10.0.1.2 } }
\tset peer_c_v6 { type ipv6_addr; }
\tset port_m_v4 { type ipv4_addr . inet_service; }
\tset port_m_v6 { type ipv6_addr . inet_service; elements = { fd00::5 . 9100 } }
\tset router_v4 { type ipv4_addr; elements = { 10.61.2.1, 10.61.3.1 } }
\tset router_v6 { type ipv6_addr; }
\tchain ingress_lxcweb {
\t\tip saddr @node_v4 accept
\t\tip6 saddr @node_v6 accept
\t\tip saddr @peer_c_v4 meta l4proto tcp th dport { 80, 8000-8080 } accept
\t\tip6 saddr @peer_c_v6 meta l4proto tcp th dport { 80, 8000-8080 } accept
\t\tip saddr 10.0.0.0/8 ip saddr != { 10.1.0.0/16 } ip saddr != @router_v4 accept
\t\tip saddr @block_x_v4 accept
\t\tdrop
\t}
\tchain egress_lxcweb {
\t\tmeta l4proto tcp ip daddr . th dport @port_m_v4 return
\t\tmeta l4proto tcp ip6 daddr . th dport @port_m_v6 return
\t\tmeta l4proto udp th dport 53 return
\t\tip6 daddr fd00::/8 meta l4proto sctp return
\t\tdrop
\t}
\tmap ingress_pods { type ifname : verdict; elements = { \"lxcweb\" : jump ingress_lxcweb } }
\tmap egress_pods { type ifname : verdict; elements = { \"lxcweb\" : jump egress_lxcweb } }
\tchain forward {
\t\ttype filter hook forward priority filter; policy accept;
\t\tct state established,related accept
\t\tiifname vmap @egress_pods
\t\toifname vmap @ingress_pods
\t}
\tchain input {
\t\ttype filter hook input priority filter; policy accept;
\t\tct state established,related accept
\t\ticmpv6 type { nd-router-solicit, nd-neighbor-solicit, nd-neighbor-advert } accept
\t\tiifname vmap @egress_pods
\t}
}
";
    assert_eq!(install(&state(), None), want);
}

#[test]
fn an_empty_state_is_a_table_that_filters_nothing() {
    let s = install(&State::default(), None);
    assert!(
        s.contains("\tmap ingress_pods { type ifname : verdict; }\n"),
        "{s}"
    );
    assert!(
        s.contains("\tmap egress_pods { type ifname : verdict; }\n"),
        "{s}"
    );
    assert!(
        !s.contains("chain ingress_") && !s.contains("\tset "),
        "{s}"
    );
}

#[test]
fn a_diff_is_element_updates_and_chain_replacements() {
    let diff = Diff {
        sets_added: [(
            "peer_n".to_string(),
            Set::new(SetKind::Addresses, addrs(&["10.0.5.5"])),
        )]
        .into(),
        sets_removed: ["peer_old".to_string()].into(),
        elements_added: [("peer_c".to_string(), addrs(&["10.0.1.3", "fd00::13"]))].into(),
        elements_removed: [(
            "port_m".to_string(),
            [Element::AddressPort(ip("10.0.1.1"), 9100)].into(),
        )]
        .into(),
        chains_added: [(
            key(Direction::Ingress, "lxcnew"),
            Chain::isolated(vec![Rule {
                peer: set("peer_n"),
                port: PortMatch::Any,
            }]),
        )]
        .into(),
        chains_replaced: [(key(Direction::Egress, "lxcweb"), Chain::isolated(vec![]))].into(),
        chains_removed: [key(Direction::Ingress, "lxcgone")].into(),
        pass_chains_removed: Default::default(),
    };
    let want = "\
add set inet podnet_policy peer_n_v4 { type ipv4_addr; }
add set inet podnet_policy peer_n_v6 { type ipv6_addr; }
add element inet podnet_policy peer_n_v4 { 10.0.5.5 }
add element inet podnet_policy peer_c_v4 { 10.0.1.3 }
add element inet podnet_policy peer_c_v6 { fd00::13 }
add chain inet podnet_policy ingress_lxcnew
add rule inet podnet_policy ingress_lxcnew ip saddr @peer_n_v4 accept
add rule inet podnet_policy ingress_lxcnew ip6 saddr @peer_n_v6 accept
add rule inet podnet_policy ingress_lxcnew drop
add element inet podnet_policy ingress_pods { \"lxcnew\" : jump ingress_lxcnew }
flush chain inet podnet_policy egress_lxcweb
add rule inet podnet_policy egress_lxcweb drop
delete element inet podnet_policy ingress_pods { \"lxcgone\" }
flush chain inet podnet_policy ingress_lxcgone
delete chain inet podnet_policy ingress_lxcgone
delete element inet podnet_policy port_m_v4 { 10.0.1.1 . 9100 }
delete set inet podnet_policy peer_old_v4
delete set inet podnet_policy peer_old_v6
";
    assert_eq!(update(&diff, None), want);
    assert_eq!(update(&Diff::default(), None), "");
}

/// A chain of the two ClusterNetworkPolicy tiers: an Admin Deny of `peer_d`,
/// Pass of `peer_p` (when `pass`), Accept of `peer_a`; NetworkPolicy allowing
/// `peer_n` (when `isolated`); a Baseline Deny of everyone.
fn tiered(pass: bool, isolated: bool) -> Chain {
    let origin = |tier, policy: &str, index, name: Option<&str>| {
        Some(Origin {
            tier,
            policy: policy.into(),
            index,
            name: name.map(str::to_string),
        })
    };
    let rule = |peer: &str, verdict| TierRule {
        rule: Rule {
            peer: set(peer),
            port: PortMatch::Any,
        },
        verdict,
        origin: origin(Tier::Admin, "admin-deny-blue", 2, Some("deny-blue")),
    };
    let mut admin = vec![rule("peer_d", Verdict::Deny)];
    if pass {
        admin.push(rule("peer_p", Verdict::Pass));
    }
    admin.push(rule("peer_a", Verdict::Allow));
    let allows = vec![Rule {
        peer: set("peer_n"),
        port: PortMatch::Any,
    }];
    Chain {
        admin,
        policy: isolated.then_some(allows),
        baseline: vec![TierRule {
            rule: Rule {
                peer: PeerMatch::Any,
                port: PortMatch::Any,
            },
            verdict: Verdict::Deny,
            origin: origin(Tier::Baseline, "baseline-deny", 0, None),
        }],
    }
}

fn one_chain(key: ChainKey, chain: Chain) -> State {
    State {
        sets: BTreeMap::new(),
        chains: [(key, chain)].into(),
    }
}

#[test]
fn the_tiers_render_in_order_and_a_pass_goes_to_the_pass_chain() {
    let s = install(
        &one_chain(key(Direction::Ingress, "lxcweb"), tiered(true, true)),
        None,
    );
    let want = "\
\tchain pass_ingress_lxcweb {
\t\tip saddr @peer_n_v4 accept
\t\tip6 saddr @peer_n_v6 accept
\t\tdrop
\t}
\tchain ingress_lxcweb {
\t\tip saddr @peer_d_v4 drop
\t\tip6 saddr @peer_d_v6 drop
\t\tip saddr @peer_p_v4 goto pass_ingress_lxcweb
\t\tip6 saddr @peer_p_v6 goto pass_ingress_lxcweb
\t\tip saddr @peer_a_v4 accept
\t\tip6 saddr @peer_a_v6 accept
\t\tgoto pass_ingress_lxcweb
\t}
";
    assert!(s.contains(want), "{s}");
    // No NetworkPolicy, no Pass, egress: one chain, the Baseline then the default.
    let s = install(
        &one_chain(key(Direction::Egress, "lxcweb"), tiered(false, false)),
        None,
    );
    let want = "\
\tchain egress_lxcweb {
\t\tip daddr @peer_d_v4 drop
\t\tip6 daddr @peer_d_v6 drop
\t\tip daddr @peer_a_v4 return
\t\tip6 daddr @peer_a_v6 return
\t\tdrop
\t\treturn
\t}
";
    assert!(s.contains(want), "{s}");
    assert!(!s.contains("pass_"), "{s}");
}

#[test]
fn a_pass_chain_is_in_the_parts_and_goes_after_its_head() {
    let k = key(Direction::Ingress, "lxcweb");
    let with = one_chain(k.clone(), tiered(true, true));
    let parts = parts(&with, None);
    assert!(parts.contains(&Part::Chain {
        name: "pass_ingress_lxcweb".into(),
        hook: None
    }));
    assert!(parts.contains(&Part::Rules {
        chain: "pass_ingress_lxcweb".into(),
        count: 3
    }));
    assert!(parts.contains(&Part::Rules {
        chain: "ingress_lxcweb".into(),
        count: 7
    }));
    // Replaced by a chain without Pass: the head first, then the pass chain goes.
    let without = one_chain(k.clone(), tiered(false, true));
    let d = with.diff(&without);
    assert_eq!(d.pass_chains_removed, [k.clone()].into());
    let script = update(&d, None);
    let head = script
        .find("flush chain inet podnet_policy ingress_lxcweb")
        .unwrap();
    let gone = script
        .find("delete chain inet podnet_policy pass_ingress_lxcweb")
        .unwrap();
    assert!(head < gone, "{script}");
    // Gaining a Pass: the pass chain is made before the head names it.
    let d = without.diff(&with);
    assert!(d.pass_chains_removed.is_empty());
    let script = update(&d, None);
    let made = script
        .find("add chain inet podnet_policy pass_ingress_lxcweb")
        .unwrap();
    let head = script
        .find("flush chain inet podnet_policy ingress_lxcweb")
        .unwrap();
    assert!(made < head, "{script}");
    // Removed with its pod: the head's map element and chain, then the pass chain.
    let d = with.diff(&State::default());
    assert_eq!(d.pass_chains_removed, [k].into());
    let script = update(&d, None);
    let head = script
        .find("delete chain inet podnet_policy ingress_lxcweb")
        .unwrap();
    let gone = script
        .find("delete chain inet podnet_policy pass_ingress_lxcweb")
        .unwrap();
    assert!(head < gone, "{script}");
}

const LOG: DropLog = DropLog {
    group: 5730,
    per_second: 100,
    audit: false,
};

#[test]
fn logged_final_drops_share_the_limit_and_the_counter() {
    let s = install(&state(), Some(&LOG));
    let objects = "\
table inet podnet_policy {
\tlimit verdict_log { rate 100/second burst 100 packets }
\tlimit verdict_log_allowed { rate 100/second burst 100 packets }
\tcounter verdict_log_suppressed { }
\tchain allowed_ingress {
\t\tlimit name \"verdict_log_allowed\" log prefix \"podnet allowed ingress\" group 5730 accept
\t\tcounter name \"verdict_log_suppressed\" accept
\t}
\tchain allowed_egress {
\t\tlimit name \"verdict_log_allowed\" log prefix \"podnet allowed egress\" group 5730 return
\t\tcounter name \"verdict_log_suppressed\" return
\t}
\tset block_x_v4";
    assert!(s.contains(objects), "{s}");
    // A NetworkPolicy allow goes to the direction's allowed chain.
    let ingress_end = "\
\t\tip saddr @block_x_v4 goto allowed_ingress
\t\tlimit name \"verdict_log\" log prefix \"podnet denied ingress\" group 5730 drop
\t\tcounter name \"verdict_log_suppressed\" drop
\t}";
    assert!(s.contains(ingress_end), "{s}");
    let egress_end = "\
\t\tip6 daddr fd00::/8 meta l4proto sctp goto allowed_egress
\t\tlimit name \"verdict_log\" log prefix \"podnet denied egress\" group 5730 drop
\t\tcounter name \"verdict_log_suppressed\" drop
\t}";
    assert!(s.contains(egress_end), "{s}");
    // Without the log, today's table.
    assert_eq!(install(&state(), None).matches("\t\tdrop\n").count(), 2);
    // Each chain has one rule more, and the two allowed chains two each.
    let rules = |log| -> usize {
        parts(&state(), log)
            .iter()
            .map(|p| match p {
                Part::Rules { chain, count } if chain != FORWARD_CHAIN => *count,
                _ => 0,
            })
            .sum()
    };
    assert_eq!(rules(Some(&LOG)), rules(None) + 2 + 4);
    let allowed_chains = |log| {
        let parts = parts(&state(), log);
        ["allowed_ingress", "allowed_egress"].map(|name| {
            parts.contains(&Part::Chain {
                name: name.into(),
                hook: None,
            })
        })
    };
    assert_eq!(allowed_chains(Some(&LOG)), [true, true]);
    assert_eq!(allowed_chains(None), [false, false]);
}

#[test]
fn audit_mode_lets_the_final_drop_through_and_logs_it_as_audit() {
    let audit = DropLog { audit: true, ..LOG };
    let s = install(&state(), Some(&audit));
    for line in [
        "\t\tlimit name \"verdict_log\" log prefix \"podnet audit ingress\" group 5730 accept\n\t\tcounter name \"verdict_log_suppressed\" accept\n",
        "\t\tlimit name \"verdict_log\" log prefix \"podnet audit egress\" group 5730 return\n\t\tcounter name \"verdict_log_suppressed\" return\n",
    ] {
        assert!(s.contains(line), "{line} in {s}");
    }
    assert!(!s.contains("drop"), "{s}");
    // A ClusterNetworkPolicy Deny lets it through too, logged as audit.
    let tiers = one_chain(key(Direction::Ingress, "lxcweb"), tiered(true, true));
    let s = install(&tiers, Some(&audit));
    let admin = "\
\t\tip saddr @peer_d_v4 limit name \"verdict_log\" log prefix \"podnet audit ingress admin 2 admin-deny-blue deny-blue\" group 5730 accept
\t\tip saddr @peer_d_v4 counter name \"verdict_log_suppressed\" accept
";
    assert!(s.contains(admin), "{s}");
    assert!(!s.contains("drop"), "{s}");
    assert!(s.contains("\tchain pass_ingress_lxcweb {\n\t\tip saddr @peer_n_v4 goto allowed_ingress\n\t\tip6 saddr @peer_n_v6 goto allowed_ingress\n\t\tlimit name \"verdict_log\" log prefix \"podnet audit ingress\" group 5730 accept\n"), "{s}");
    // An update writes the replaced chain the same way.
    let mut next = state();
    next.chains
        .insert(key(Direction::Ingress, "lxcnew"), Chain::isolated(vec![]));
    let script = update(&state().diff(&next), Some(&audit));
    assert!(
        script.contains("add rule inet podnet_policy ingress_lxcnew limit name \"verdict_log\" log prefix \"podnet audit ingress\" group 5730 accept\n"),
        "{script}"
    );
}

#[test]
fn a_logged_admin_deny_logs_under_the_limit_naming_its_rule_then_counts_and_drops() {
    let s = install(
        &one_chain(key(Direction::Ingress, "lxcweb"), tiered(true, true)),
        Some(&LOG),
    );
    let want = "\
\tchain ingress_lxcweb {
\t\tip saddr @peer_d_v4 limit name \"verdict_log\" log prefix \"podnet denied ingress admin 2 admin-deny-blue deny-blue\" group 5730 drop
\t\tip saddr @peer_d_v4 counter name \"verdict_log_suppressed\" drop
\t\tip6 saddr @peer_d_v6 limit name \"verdict_log\" log prefix \"podnet denied ingress admin 2 admin-deny-blue deny-blue\" group 5730 drop
\t\tip6 saddr @peer_d_v6 counter name \"verdict_log_suppressed\" drop
\t\tip saddr @peer_p_v4 goto pass_ingress_lxcweb
\t\tip6 saddr @peer_p_v6 goto pass_ingress_lxcweb
\t\tip saddr @peer_a_v4 limit name \"verdict_log_allowed\" log prefix \"podnet allowed ingress admin 2 admin-deny-blue deny-blue\" group 5730 accept
\t\tip saddr @peer_a_v4 counter name \"verdict_log_suppressed\" accept
\t\tip6 saddr @peer_a_v6 limit name \"verdict_log_allowed\" log prefix \"podnet allowed ingress admin 2 admin-deny-blue deny-blue\" group 5730 accept
\t\tip6 saddr @peer_a_v6 counter name \"verdict_log_suppressed\" accept
\t\tgoto pass_ingress_lxcweb
\t}
";
    assert!(s.contains(want), "{s}");
    // The parts count the two rules of each match (a Deny's and an Allow's).
    let k = key(Direction::Ingress, "lxcweb");
    let parts = parts(&one_chain(k, tiered(true, true)), Some(&LOG));
    assert!(parts.contains(&Part::Rules {
        chain: "ingress_lxcweb".into(),
        count: 11
    }));
}

#[test]
fn a_logged_baseline_deny_names_its_policy_and_rule_index() {
    let s = install(
        &one_chain(key(Direction::Egress, "lxcweb"), tiered(false, false)),
        Some(&LOG),
    );
    let want = "\
\t\tip6 daddr @peer_a_v6 counter name \"verdict_log_suppressed\" return
\t\tlimit name \"verdict_log\" log prefix \"podnet denied egress baseline 0 baseline-deny\" group 5730 drop
\t\tcounter name \"verdict_log_suppressed\" drop
\t\treturn
\t}
";
    assert!(s.contains(want), "{s}");
}

#[test]
fn a_deny_podnet_wrote_without_an_origin_drops_unlogged() {
    let mut chain = tiered(false, false);
    chain.baseline[0].origin = None;
    let s = install(
        &one_chain(key(Direction::Egress, "lxcweb"), chain),
        Some(&LOG),
    );
    assert!(
        s.contains(
            "\t\tip6 daddr @peer_a_v6 counter name \"verdict_log_suppressed\" return\n\t\tdrop\n"
        ),
        "{s}"
    );
}
