//! The node's desired policy state, and the difference between two of them.
//!
//! The state is shaped so that a change in the cluster is a small change here:
//! the addresses a peer selector matches (and the address-port pairs a named
//! port stands for) are named sets shared by every rule that uses them, so a pod
//! that gains a label is one set element; only a change to what a local pod is
//! allowed replaces that pod's chain. [`State::diff`] finds exactly those changes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use super::view::{Protocol, Tier};
use crate::ipam::Family;

/// The table's family and name.
pub const FAMILY: &str = "inet";
pub const TABLE: &str = "podnet_policy";
/// The verdict maps from host link to chain.
pub const INGRESS_MAP: &str = "ingress_pods";
pub const EGRESS_MAP: &str = "egress_pods";
/// The base chain on the forward hook: traffic between pods, and between a
/// pod and anything beyond its node.
pub const FORWARD_CHAIN: &str = "forward";
/// The base chain on the input hook: traffic from a pod to its own node,
/// judged by the pod's egress chain.
pub const INPUT_CHAIN: &str = "input";

/// The set of this node's own addresses (traffic from them is allowed).
pub const NODE_SET: &str = "node";
/// The set of every node's router address, which an ingress `ipBlock` judges
/// as its node's InternalIP, not as itself (`compile`).
pub const ROUTER_SET: &str = "router";

/// A direction of traffic, seen from the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }
}

/// What a set holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetKind {
    /// Addresses (pods a peer selector matches, the node's).
    Addresses,
    /// Address and port pairs (the pods that have a named port, and its number).
    AddressPorts,
}

/// An element of a set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Element {
    Address(IpAddr),
    AddressPort(IpAddr, u16),
}

impl Element {
    pub fn family(&self) -> Family {
        match self {
            Element::Address(ip) | Element::AddressPort(ip, _) => Family::of_addr(ip),
        }
    }
}

/// A named set of both families (nftables holds one set per family). Its
/// elements are shared: a kept set unchanged since the last compile is the same
/// allocation in both states, so cloning a state and [`State::diff`] cost
/// nothing for it, however many pods it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Set {
    pub kind: SetKind,
    pub elements: Arc<BTreeSet<Element>>,
}

impl Set {
    pub fn new(kind: SetKind, elements: impl IntoIterator<Item = Element>) -> Set {
        Set {
            kind,
            elements: Arc::new(elements.into_iter().collect()),
        }
    }
}

/// Whom a rule allows: the peer's address (the source for ingress, the
/// destination for egress).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PeerMatch {
    /// Any address.
    Any,
    /// The addresses of a set.
    Set(String),
    /// `net` minus the `except` networks (within `net`, merged). With
    /// `routers` (ingress), a node's router address is judged as its node: the
    /// block matches no address of [`ROUTER_SET`] as itself, and every address
    /// of the set `routers` (those whose node's InternalIP it holds).
    Block {
        net: IpNet,
        except: Vec<IpNet>,
        routers: Option<String>,
    },
}

/// What a rule allows of the transport: always the destination port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PortMatch {
    /// Any protocol, any port.
    Any,
    /// Any port of the protocol.
    Protocol(Protocol),
    /// These port ranges of the protocol (merged, ascending).
    Ranges(Protocol, Vec<(u16, u16)>),
    /// A named port of the destination pod: the pairs of an `AddressPorts` set.
    Named(Protocol, String),
}

/// What a ClusterNetworkPolicy rule does with what it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// Accepted (ingress) or on to the destination's ingress judgement (egress).
    Allow,
    /// Dropped.
    Deny,
    /// On to the NetworkPolicy tier (from the Admin tier: the pod's pass chain).
    Pass,
}

/// One rule of a ClusterNetworkPolicy tier.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TierRule {
    pub rule: Rule,
    pub verdict: Verdict,
    /// The ClusterNetworkPolicy rule it is; None for podnet's own (the
    /// node's addresses allowed before the tiers).
    pub origin: Option<Origin>,
}

/// Where a tier rule comes from: what a logged Deny names (`policy::verdict`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Origin {
    pub tier: Tier,
    /// The ClusterNetworkPolicy's name.
    pub policy: String,
    /// The rule's index in the policy's `ingress` or `egress` list.
    pub index: usize,
    /// The rule's `name`, when set.
    pub name: Option<String>,
}

/// One pod's judgement of one direction, tier by tier: the Admin tier's rules
/// in order of precedence (the first that matches decides), then the
/// NetworkPolicy tier (when NetworkPolicy isolates the pod: its allow rules,
/// then drop), then the Baseline tier's rules in order (never `Pass`), then
/// allow. An Admin `Pass` skips the rest of the Admin tier: it goes to the
/// pod's pass chain, which holds the tiers after it.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Chain {
    pub admin: Vec<TierRule>,
    /// The NetworkPolicy tier's allow rules; None when it does not isolate
    /// the pod (the Baseline tier and the default decide).
    pub policy: Option<Vec<Rule>>,
    pub baseline: Vec<TierRule>,
}

impl Chain {
    /// A chain of NetworkPolicy's allow rules only.
    pub fn isolated(rules: Vec<Rule>) -> Chain {
        Chain {
            policy: Some(rules),
            ..Chain::default()
        }
    }

    /// Whether an Admin rule passes (the pod has a pass chain).
    pub fn passes(&self) -> bool {
        self.admin.iter().any(|r| r.verdict == Verdict::Pass)
    }
}

/// One allow rule of a pod's chain.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rule {
    pub peer: PeerMatch,
    pub port: PortMatch,
}

/// The chain of one direction of one local pod, by its host link.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChainKey {
    pub direction: Direction,
    pub link: String,
}

/// Everything the node's table holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    pub sets: BTreeMap<String, Set>,
    /// Each policy-selected local pod's judgement per direction.
    pub chains: BTreeMap<ChainKey, Chain>,
}

/// What changes from one state to the next.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diff {
    /// New sets, with their elements.
    pub sets_added: BTreeMap<String, Set>,
    pub sets_removed: BTreeSet<String>,
    /// Elements of sets in both states.
    pub elements_added: BTreeMap<String, BTreeSet<Element>>,
    pub elements_removed: BTreeMap<String, BTreeSet<Element>>,
    pub chains_added: BTreeMap<ChainKey, Chain>,
    pub chains_replaced: BTreeMap<ChainKey, Chain>,
    pub chains_removed: BTreeSet<ChainKey>,
    /// Pods whose pass chain goes (removed or replaced by one without).
    pub pass_chains_removed: BTreeSet<ChainKey>,
}

impl Diff {
    pub fn is_empty(&self) -> bool {
        *self == Diff::default()
    }
}

impl State {
    /// What turns `self` into `next`.
    pub fn diff(&self, next: &State) -> Diff {
        let mut d = Diff::default();
        for (name, set) in &next.sets {
            // A set's name says what it holds (its kind included), so a set of
            // the same name is the same set.
            let Some(old) = self.sets.get(name) else {
                d.sets_added.insert(name.clone(), set.clone());
                continue;
            };
            if Arc::ptr_eq(&set.elements, &old.elements) {
                continue;
            }
            let added: BTreeSet<Element> =
                set.elements.difference(&old.elements).copied().collect();
            let removed: BTreeSet<Element> =
                old.elements.difference(&set.elements).copied().collect();
            if !added.is_empty() {
                d.elements_added.insert(name.clone(), added);
            }
            if !removed.is_empty() {
                d.elements_removed.insert(name.clone(), removed);
            }
        }
        let gone = self.sets.keys().filter(|n| !next.sets.contains_key(*n));
        d.sets_removed.extend(gone.cloned());
        for (key, rules) in &next.chains {
            let changes = match self.chains.get(key) {
                None => &mut d.chains_added,
                Some(old) if old != rules => &mut d.chains_replaced,
                Some(_) => continue,
            };
            changes.insert(key.clone(), rules.clone());
        }
        let gone = self.chains.keys().filter(|k| !next.chains.contains_key(*k));
        d.chains_removed.extend(gone.cloned());
        let passing = |chains: &BTreeMap<ChainKey, Chain>, key: &ChainKey| {
            chains.get(key).is_some_and(Chain::passes)
        };
        let pass_gone = self
            .chains
            .iter()
            .filter(|(k, c)| c.passes() && !passing(&next.chains, k));
        d.pass_chains_removed
            .extend(pass_gone.map(|(k, _)| k.clone()));
        d
    }
}

#[cfg(test)]
#[path = "tests/state.rs"]
mod tests;
