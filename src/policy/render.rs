//! The node's state as nftables text, in podnet's table `inet podnet_policy`:
//! [`install`], the whole table replaced in one transaction, and [`update`],
//! one [`Diff`] as set element updates and chain replacements, also in one
//! transaction.
//!
//! The table: each named set twice (`<name>_v4`, `<name>_v6`); per
//! policy-selected pod and direction a chain, `ingress_<link>` ending in drop,
//! whose rules accept (an `ipBlock`'s as `ip saddr <cidr> ip saddr != { <except> }
//! ip saddr != @router_v4`, then `ip saddr @block_<hash>_v4` for the router
//! addresses it judges inside), or `egress_<link>` whose rules return (so the
//! destination's ingress chain is still looked at) and which ends in drop; two
//! verdict maps from host link to chain; the `forward` base chain, which
//! accepts established and related packets (replies, ICMP errors), then sends
//! packets from a pod's link to its egress chain and packets to a pod's link to
//! its ingress chain; and the `input` base chain, which sends what a pod sends
//! to its own node (a hostNetwork server, the node's addresses) to the pod's
//! egress chain the same way, but IPv6 neighbour discovery (without it the pod
//! reaches nothing). Packets of an invalid conntrack state are not dropped
//! there: they are judged by the pod chains like new ones, so a reply conntrack
//! lost track of passes whenever its direction is allowed. What the node sends
//! a pod (kubelet probes) leaves through output, which no chain looks at: as
//! Kubernetes says, a pod cannot refuse its own node.
//! With a [`DropLog`], the final drops and the ClusterNetworkPolicy tiers'
//! Deny rules are logged, and so are the tiers' Allow rules and (through the
//! two `allowed_<direction>` chains their rules `goto`) NetworkPolicy's allow
//! rules; the table holds the limits and the counter they share
//! (`policy::verdict`).

use std::collections::BTreeSet;
use std::fmt::Write;

use super::check::{self, Part};
use super::verdict::{self, DropLog};

use super::state::{
    Chain, ChainKey, Diff, Direction, EGRESS_MAP, Element, FAMILY, FORWARD_CHAIN, INGRESS_MAP,
    INPUT_CHAIN, PeerMatch, PortMatch, ROUTER_SET, Rule, Set, SetKind, State, TABLE, TierRule,
    Verdict,
};
use crate::ipam::Family;

const FAMILIES: [Family; 2] = [Family::V4, Family::V6];

/// The script that replaces podnet's policy table with `state`.
/// With `log`, each chain's final drop is logged (`verdict`).
pub fn install(state: &State, log: Option<&DropLog>) -> String {
    // `table` adds the table when absent, so the delete always finds one.
    let mut s = format!(
        "table {FAMILY} {TABLE}\ndelete table {FAMILY} {TABLE}\ntable {FAMILY} {TABLE} {{\n"
    );
    for object in log.map(verdict::objects).into_iter().flatten() {
        let _ = writeln!(s, "\t{object}");
    }
    for (name, lines) in allowed_chains(log) {
        let _ = writeln!(s, "\tchain {name} {{");
        for line in lines {
            let _ = writeln!(s, "\t\t{line}");
        }
        s.push_str("\t}\n");
    }
    for (name, set) in &state.sets {
        for family in FAMILIES {
            let _ = writeln!(
                s,
                "\tset {} {{ {}{} }}",
                set_name(name, family),
                set_type(set.kind, family),
                elements_clause(set, family)
            );
        }
    }
    for (key, chain) in &state.chains {
        let (head, pass) = chain_lines(key, chain, log);
        // The pass chain first: the head's `goto` names it.
        let named = pass.map(|lines| (pass_chain_name(key), lines));
        for (name, lines) in named.into_iter().chain([(chain_name(key), head)]) {
            let _ = writeln!(s, "\tchain {name} {{");
            for line in lines {
                let _ = writeln!(s, "\t\t{line}");
            }
            s.push_str("\t}\n");
        }
    }
    for (map, direction) in [
        (INGRESS_MAP, Direction::Ingress),
        (EGRESS_MAP, Direction::Egress),
    ] {
        let jumps: Vec<String> = state
            .chains
            .keys()
            .filter(|k| k.direction == direction)
            .map(map_element)
            .collect();
        let elements = match jumps.is_empty() {
            true => String::new(),
            false => format!(" elements = {{ {} }}", jumps.join(", ")),
        };
        let _ = writeln!(s, "\tmap {map} {{ type ifname : verdict;{elements} }}");
    }
    for (chain, hook, rules) in base_chains() {
        let _ = writeln!(
            s,
            "\tchain {chain} {{\n\t\ttype filter hook {hook} priority filter; policy accept;"
        );
        for rule in rules {
            let _ = writeln!(s, "\t\t{rule}");
        }
        s.push_str("\t}\n");
    }
    s.push_str("}\n");
    s
}

/// The parts of the table `install(state)` writes, as a resync compares them.
pub fn parts(state: &State, log: Option<&DropLog>) -> BTreeSet<Part> {
    let mut parts = BTreeSet::new();
    for (chain, hook, rules) in base_chains() {
        parts.insert(Part::Chain {
            name: chain.into(),
            hook: Some(check::base_chain("filter", hook, "accept")),
        });
        parts.insert(Part::Rules {
            chain: chain.into(),
            count: rules.len(),
        });
    }
    parts.extend([
        Part::Map {
            name: INGRESS_MAP.into(),
        },
        Part::Map {
            name: EGRESS_MAP.into(),
        },
    ]);
    for (name, lines) in allowed_chains(log) {
        parts.insert(Part::Rules {
            chain: name.clone(),
            count: lines.len(),
        });
        parts.insert(Part::Chain { name, hook: None });
    }
    for (name, set) in &state.sets {
        for family in FAMILIES {
            parts.insert(Part::Elements {
                set: set_name(name, family),
                count: element_texts(&set.elements, family).len(),
            });
        }
    }
    for (key, c) in &state.chains {
        let chain = chain_name(key);
        let (head, pass) = chain_lines(key, c, log);
        if let Some(pass) = pass {
            let name = pass_chain_name(key);
            parts.insert(Part::Rules {
                chain: name.clone(),
                count: pass.len(),
            });
            parts.insert(Part::Chain { name, hook: None });
        }
        parts.insert(Part::Rules {
            chain: chain.clone(),
            count: head.len(),
        });
        parts.insert(Part::Jump {
            map: map_of(key).into(),
            link: key.link.clone(),
            chain: chain.clone(),
        });
        parts.insert(Part::Chain {
            name: chain,
            hook: None,
        });
    }
    parts
}

/// With `log`, the chain of each direction a NetworkPolicy allow rule goes
/// to, and its rules ([`verdict::allowed_chain`]).
fn allowed_chains(log: Option<&DropLog>) -> Vec<(String, [String; 2])> {
    let Some(log) = log else {
        return Vec::new();
    };
    [Direction::Ingress, Direction::Egress]
        .into_iter()
        .map(|d| {
            let rules = verdict::allowed_chain_rules(d, log, allow(d));
            (verdict::allowed_chain(d), rules)
        })
        .collect()
}

/// The base chains, each with its hook and rules. Forward: replies pass, then
/// each packet goes to the chains of its links. Input: replies and neighbour
/// discovery pass, then a pod's packet goes to its egress chain.
fn base_chains() -> [(&'static str, &'static str, Vec<String>); 2] {
    let replies = "ct state established,related accept".to_string();
    let from_pod = format!("iifname vmap @{EGRESS_MAP}");
    [
        (
            FORWARD_CHAIN,
            "forward",
            vec![
                replies.clone(),
                from_pod.clone(),
                format!("oifname vmap @{INGRESS_MAP}"),
            ],
        ),
        (
            INPUT_CHAIN,
            "input",
            vec![
                replies,
                "icmpv6 type { nd-router-solicit, nd-neighbor-solicit, nd-neighbor-advert } accept"
                    .into(),
                from_pod,
            ],
        ),
    ]
}

/// The script that applies `diff` to the table: new sets and elements first,
/// then chains and their map elements, then what went away.
pub fn update(diff: &Diff, log: Option<&DropLog>) -> String {
    let mut s = String::new();
    let t = format!("{FAMILY} {TABLE}");
    for (name, set) in &diff.sets_added {
        for family in FAMILIES {
            let _ = writeln!(
                s,
                "add set {t} {} {{ {} }}",
                set_name(name, family),
                set_type(set.kind, family)
            );
        }
        element_lines(&mut s, "add", name, &set.elements);
    }
    for (name, elements) in &diff.elements_added {
        element_lines(&mut s, "add", name, elements);
    }
    for (key, chain) in &diff.chains_added {
        let (head, pass) = chain_lines(key, chain, log);
        if let Some(pass) = pass {
            let _ = writeln!(s, "add chain {t} {}", pass_chain_name(key));
            rule_lines(&mut s, &pass_chain_name(key), &pass);
        }
        let _ = writeln!(s, "add chain {t} {}", chain_name(key));
        rule_lines(&mut s, &chain_name(key), &head);
        let _ = writeln!(
            s,
            "add element {t} {} {{ {} }}",
            map_of(key),
            map_element(key)
        );
    }
    for (key, chain) in &diff.chains_replaced {
        let (head, pass) = chain_lines(key, chain, log);
        if let Some(pass) = pass {
            // `add` keeps a pass chain that is there (and its rules, flushed next).
            let name = pass_chain_name(key);
            let _ = writeln!(s, "add chain {t} {name}\nflush chain {t} {name}");
            rule_lines(&mut s, &name, &pass);
        }
        let _ = writeln!(s, "flush chain {t} {}", chain_name(key));
        rule_lines(&mut s, &chain_name(key), &head);
    }
    for key in &diff.chains_removed {
        let _ = writeln!(
            s,
            "delete element {t} {} {{ \"{}\" }}",
            map_of(key),
            key.link
        );
        let _ = writeln!(s, "flush chain {t} {}", chain_name(key));
        let _ = writeln!(s, "delete chain {t} {}", chain_name(key));
    }
    // After the heads that named them went or changed.
    for key in &diff.pass_chains_removed {
        let name = pass_chain_name(key);
        let _ = writeln!(s, "flush chain {t} {name}\ndelete chain {t} {name}");
    }
    for (name, elements) in &diff.elements_removed {
        element_lines(&mut s, "delete", name, elements);
    }
    for name in &diff.sets_removed {
        for family in FAMILIES {
            let _ = writeln!(s, "delete set {t} {}", set_name(name, family));
        }
    }
    s
}

fn rule_lines(s: &mut String, chain: &str, lines: &[String]) {
    for line in lines {
        let _ = writeln!(s, "add rule {FAMILY} {TABLE} {chain} {line}");
    }
}

fn element_lines(s: &mut String, verb: &str, name: &str, elements: &BTreeSet<Element>) {
    for family in FAMILIES {
        let texts = element_texts(elements, family);
        if !texts.is_empty() {
            let _ = writeln!(
                s,
                "{verb} element {FAMILY} {TABLE} {} {{ {} }}",
                set_name(name, family),
                texts.join(", ")
            );
        }
    }
}

fn set_name(name: &str, family: Family) -> String {
    match family {
        Family::V4 => format!("{name}_v4"),
        Family::V6 => format!("{name}_v6"),
    }
}

fn set_type(kind: SetKind, family: Family) -> String {
    let addr = match family {
        Family::V4 => "ipv4_addr",
        Family::V6 => "ipv6_addr",
    };
    match kind {
        SetKind::Addresses => format!("type {addr};"),
        SetKind::AddressPorts => format!("type {addr} . inet_service;"),
    }
}

fn element_texts(elements: &BTreeSet<Element>, family: Family) -> Vec<String> {
    let of_family = elements.iter().filter(|e| e.family() == family);
    of_family
        .map(|e| match e {
            Element::Address(ip) => ip.to_string(),
            Element::AddressPort(ip, port) => format!("{ip} . {port}"),
        })
        .collect()
}

fn elements_clause(set: &Set, family: Family) -> String {
    let texts = element_texts(&set.elements, family);
    match texts.is_empty() {
        true => String::new(),
        false => format!(" elements = {{ {} }}", texts.join(", ")),
    }
}

fn chain_name(key: &ChainKey) -> String {
    format!("{}_{}", key.direction.as_str(), key.link)
}

/// The chain an Admin `Pass` goes to (no pod chain's name starts with `pass_`).
fn pass_chain_name(key: &ChainKey) -> String {
    format!("pass_{}", chain_name(key))
}

fn map_of(key: &ChainKey) -> &'static str {
    match key.direction {
        Direction::Ingress => INGRESS_MAP,
        Direction::Egress => EGRESS_MAP,
    }
}

fn map_element(key: &ChainKey) -> String {
    format!("\"{}\" : jump {}", key.link, chain_name(key))
}

/// The rules of a pod's chain, and of its pass chain when an Admin rule
/// passes: the Admin tier's, then (in the pass chain when there is one) the
/// NetworkPolicy tier's ending in drop, or else the Baseline tier's and allow.
fn chain_lines(
    key: &ChainKey,
    chain: &Chain,
    log: Option<&DropLog>,
) -> (Vec<String>, Option<Vec<String>>) {
    let direction = key.direction;
    let goto_pass = format!("goto {}", pass_chain_name(key));
    let tier = |rules: &[TierRule]| -> Vec<String> {
        let texts = rules
            .iter()
            .map(|r| tier_rule_texts(direction, r, &goto_pass, log));
        texts.flatten().collect()
    };
    // A NetworkPolicy allow: logged in the direction's allowed chain.
    let allowed = match log {
        Some(_) => format!("goto {}", verdict::allowed_chain(direction)),
        None => allow(direction).to_string(),
    };
    let rest = match &chain.policy {
        Some(rules) => {
            let allows = rules.iter().map(|r| rule_texts(direction, r, &allowed));
            let last = verdict::final_rules(direction, log, allow(direction));
            allows.flatten().chain(last).collect()
        }
        None => {
            let mut lines = tier(&chain.baseline);
            lines.push(allow(direction).to_string());
            lines
        }
    };
    let mut head = tier(&chain.admin);
    match chain.passes() {
        true => {
            head.push(goto_pass.clone());
            (head, Some(rest))
        }
        false => {
            head.extend(rest);
            (head, None)
        }
    }
}

/// One tier rule's nftables rules. A Deny or an Allow with a [`DropLog`] is
/// two for each match, as a chain's final drop: logged under its limit, then
/// counted.
fn tier_rule_texts(
    direction: Direction,
    r: &TierRule,
    goto_pass: &str,
    log: Option<&DropLog>,
) -> Vec<String> {
    let logged_pair = match (r.verdict, log, &r.origin) {
        (Verdict::Deny, Some(log), Some(origin)) => Some(verdict::deny_rules(
            direction,
            origin,
            log,
            allow(direction),
        )),
        (Verdict::Allow, Some(log), Some(origin)) => Some(verdict::allow_rules(
            direction,
            origin,
            log,
            allow(direction),
        )),
        _ => None,
    };
    if let Some([logged, counted]) = logged_pair {
        let logged = rule_texts(direction, &r.rule, &logged);
        let counted = rule_texts(direction, &r.rule, &counted);
        let pairs = logged.into_iter().zip(counted);
        return pairs.flat_map(|(l, c)| [l, c]).collect();
    }
    let verdict = match r.verdict {
        Verdict::Allow => allow(direction),
        Verdict::Pass => goto_pass,
        Verdict::Deny => "drop",
    };
    rule_texts(direction, &r.rule, verdict)
}

/// What an allowed packet gets: accepted (ingress), or back to the forward
/// chain for its destination's ingress judgement (egress).
fn allow(direction: Direction) -> &'static str {
    match direction {
        Direction::Ingress => "accept",
        Direction::Egress => "return",
    }
}

/// One rule's nftables rules, each ending in `verdict`: one per family when it
/// names addresses, else one for both; an ingress block two, the second for
/// the router addresses it judges inside.
fn rule_texts(direction: Direction, rule: &Rule, verdict: &str) -> Vec<String> {
    let field = match direction {
        Direction::Ingress => "saddr",
        Direction::Egress => "daddr",
    };
    let families: &[Family] = match (&rule.peer, &rule.port) {
        (PeerMatch::Block { net, .. }, _) => &[Family::of_net(net)],
        (PeerMatch::Set(_), _) | (_, PortMatch::Named(..)) => &FAMILIES,
        // No address in the rule: the family only names sets, and none is named.
        (PeerMatch::Any, _) => &[Family::V4],
    };
    let mut texts = Vec::new();
    for family in families {
        let port = port_text(&rule.port, *family);
        for peer in peer_texts(&rule.peer, field, *family) {
            texts.push(format!("{peer}{port}{verdict}"));
        }
    }
    texts
}

fn ip_keyword(family: Family) -> &'static str {
    match family {
        Family::V4 => "ip",
        Family::V6 => "ip6",
    }
}

/// The address matches of a peer: one, or two for a block with `routers`.
fn peer_texts(peer: &PeerMatch, field: &str, family: Family) -> Vec<String> {
    let ip = ip_keyword(family);
    match peer {
        PeerMatch::Any => vec![String::new()],
        PeerMatch::Set(name) => vec![format!("{ip} {field} @{} ", set_name(name, family))],
        PeerMatch::Block {
            net,
            except,
            routers,
        } => {
            let mut block = format!("{ip} {field} {net} ");
            if !except.is_empty() {
                let except: Vec<String> = except.iter().map(|e| e.to_string()).collect();
                let _ = write!(block, "{ip} {field} != {{ {} }} ", except.join(", "));
            }
            let Some(routers) = routers else {
                return vec![block];
            };
            let every = set_name(ROUTER_SET, family);
            let _ = write!(block, "{ip} {field} != @{every} ");
            vec![
                block,
                format!("{ip} {field} @{} ", set_name(routers, family)),
            ]
        }
    }
}

fn port_text(port: &PortMatch, family: Family) -> String {
    match port {
        PortMatch::Any => String::new(),
        PortMatch::Protocol(p) => format!("meta l4proto {} ", p.nft_name()),
        PortMatch::Ranges(p, ranges) => {
            let texts: Vec<String> = ranges
                .iter()
                .map(|(a, b)| match a == b {
                    true => a.to_string(),
                    false => format!("{a}-{b}"),
                })
                .collect();
            let ports = match texts.as_slice() {
                [one] => one.clone(),
                _ => format!("{{ {} }}", texts.join(", ")),
            };
            format!("meta l4proto {} th dport {ports} ", p.nft_name())
        }
        PortMatch::Named(p, set) => format!(
            "meta l4proto {} {} daddr . th dport @{} ",
            p.nft_name(),
            ip_keyword(family),
            set_name(set, family)
        ),
    }
}

#[cfg(test)]
#[path = "tests/render.rs"]
mod tests;
