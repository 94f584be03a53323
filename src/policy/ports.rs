//! The `ports` of a rule, resolved: whole protocols, merged port ranges per
//! protocol, and named ports (an ingress rule's against the selected pod's own
//! container ports, an egress rule's as an address-port set of the destination
//! pods). An entry that resolves to nothing allows nothing; when every entry
//! does, the rule allows nothing (never every port).

use std::collections::{BTreeMap, BTreeSet};

use super::state::PortMatch;
use super::view::{PodView, PortSpec, PortView, Protocol};

/// What a named port stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Named {
    /// These port numbers (the selected pod's own; none if it lacks the name).
    Numbers(Vec<u16>),
    /// The address-port set of that name.
    Set(String),
}

/// `target`'s own numbers for the named port.
pub fn own(target: &PodView, protocol: Protocol, name: &str) -> Named {
    let numbers = target
        .ports
        .iter()
        .filter(|np| np.name == name && np.protocol == protocol);
    Named::Numbers(numbers.map(|np| np.number).collect())
}

/// A rule's ports, resolved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ports {
    whole: BTreeSet<Protocol>,
    ranges: BTreeMap<Protocol, Vec<(u16, u16)>>,
    named: BTreeSet<(Protocol, String)>,
}

impl Ports {
    /// Resolves `ports` (not empty: empty means any port, which the caller
    /// handles), each named port through `named`.
    pub fn resolve(ports: &[PortView], mut named: impl FnMut(Protocol, &str) -> Named) -> Ports {
        let mut out = Ports::default();
        for port in ports {
            let PortView::Port { protocol, spec } = port else {
                continue;
            };
            let ranges = out.ranges.entry(*protocol).or_default();
            match spec {
                PortSpec::Any => {
                    out.whole.insert(*protocol);
                }
                PortSpec::Range(first, last) => ranges.push((*first, *last)),
                PortSpec::Named(name) => match named(*protocol, name) {
                    Named::Numbers(ns) => ranges.extend(ns.into_iter().map(|n| (n, n))),
                    Named::Set(set) => {
                        out.named.insert((*protocol, set));
                    }
                },
            }
        }
        out
    }

    /// The port matches, one per protocol and kind (none when nothing resolved).
    pub fn matches(self) -> Vec<PortMatch> {
        let mut out: Vec<PortMatch> = self.whole.iter().map(|p| PortMatch::Protocol(*p)).collect();
        for (protocol, ranges) in self.ranges {
            if !ranges.is_empty() && !self.whole.contains(&protocol) {
                out.push(PortMatch::Ranges(protocol, merge(ranges)));
            }
        }
        let named = self
            .named
            .into_iter()
            .filter(|(p, _)| !self.whole.contains(p));
        out.extend(named.map(|(p, set)| PortMatch::Named(p, set)));
        out
    }
}

/// The named ports of `ports`: index, protocol and name.
pub fn names(ports: &[PortView]) -> impl Iterator<Item = (usize, Protocol, &str)> {
    ports.iter().enumerate().filter_map(|(k, p)| match p {
        PortView::Port {
            protocol,
            spec: PortSpec::Named(name),
        } => Some((k, *protocol, name.as_str())),
        _ => None,
    })
}

/// `ranges` sorted, overlapping and adjacent ones joined (nftables refuses
/// overlapping intervals in one set).
fn merge(mut ranges: Vec<(u16, u16)>) -> Vec<(u16, u16)> {
    ranges.sort_unstable();
    let mut out: Vec<(u16, u16)> = Vec::with_capacity(ranges.len());
    for (first, last) in ranges {
        match out.last_mut() {
            Some(prev) if u32::from(first) <= u32::from(prev.1) + 1 => prev.1 = prev.1.max(last),
            _ => out.push((first, last)),
        }
    }
    out
}

#[cfg(test)]
#[path = "tests/ports.rs"]
mod tests;
