//! A sticky-address decision on its way through the one node loop (pure, no
//! I/O). The sticky loop ([`sticky_loop`](super::sticky_loop)) reads, decides
//! and writes the pools' records, then hands the nodes' part to the node loop
//! as a [`Decision`]: per node, the blocks to add to its
//! `spec.ipam.pools.allocated` (only at the resourceVersion they were decided
//! at) and its new `ipam.podnet.io/sticky-status`. The multi-pool handler folds
//! each node's part into that node's one write; once every node of the decision
//! is written, refused, failed or gone, the [`Settled`] outcome goes back to
//! the sticky loop, which waits for it before it reads again: one decision at a
//! time, so a block is never on two nodes. The other way, the handler tells the
//! sticky loop what it saw of the CiliumNodes ([`NodeSeen`]): the one node
//! watch serves both.

use std::collections::{BTreeMap, BTreeSet};

use futures::channel::oneshot;
use ipnet::IpNet;

use super::sticky::{STICKY_REQUESTS, STICKY_STATUS, add_block};

use crate::operator::node_loop::{Refusal, older};
use crate::resources::AllocatedPool;

/// What the node loop saw of a CiliumNode, told to the sticky loop (which
/// reads everything afresh when it may change an answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeSeen {
    /// A node was added or changed; `sticky`: it is annotated with a
    /// sticky-address request or answer.
    Upserted { sticky: bool },
    /// A node went away.
    Deleted,
    /// Every node was listed again (any may have gone).
    Relisted,
}

/// Whether a CiliumNode's annotations hold a sticky-address request or answer.
pub fn sticky_annotated(annotations: &BTreeMap<String, String>) -> bool {
    annotations.contains_key(STICKY_REQUESTS) || annotations.contains_key(STICKY_STATUS)
}

/// One node's part of a decision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodePart {
    /// The resourceVersion the node was read at: the blocks' precondition.
    pub resource_version: String,
    /// The blocks (pool, CIDR) to add to its `allocated` (empty: none).
    pub added: Vec<(String, IpNet)>,
    /// Its new `ipam.podnet.io/sticky-status` (None inside: removed), when it
    /// differs from what was read.
    pub status: Option<Option<String>>,
}

/// How the nodes' part of a decision went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settled {
    /// A node changed since it was read (409, or newer when written): read again.
    pub conflict: bool,
    /// The nodes whose write failed (tried again after the sticky loop's backoff).
    pub failed: Vec<String>,
}

/// The nodes' part of one decision, and where its outcome goes.
#[derive(Debug)]
pub struct Decision {
    pub nodes: BTreeMap<String, NodePart>,
    pub settled: oneshot::Sender<Settled>,
}

/// What a node's write takes of its part now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Take {
    /// Nothing (no part, or it waits until the node is seen at its resourceVersion).
    Nothing,
    /// Blocks to add (at the node's resourceVersion) and the status to write.
    Write {
        added: Vec<(String, IpNet)>,
        status: Option<Option<String>>,
    },
}

/// The decision in flight, node by node.
#[derive(Debug, Default)]
pub struct StickyWrites {
    parts: BTreeMap<String, NodePart>,
    /// Nodes whose part is in a write on its way.
    in_flight: BTreeSet<String>,
    settled: Option<oneshot::Sender<Settled>>,
    outcome: Settled,
}

impl StickyWrites {
    /// A new decision; returns its nodes (to plan). One with no node is settled at once.
    pub fn decided(&mut self, decision: Decision) -> Vec<String> {
        self.parts = decision.nodes;
        self.in_flight.clear();
        self.outcome = Settled::default();
        self.settled = Some(decision.settled);
        self.settle_if_done();
        self.parts.keys().cloned().collect()
    }

    /// What `name`'s write takes of its part, the node being known at
    /// `resource_version` (None: not seen yet). A part whose blocks were decided
    /// at an older resourceVersion is dropped (the node changed: read again).
    pub fn take(&mut self, name: &str, resource_version: Option<&str>) -> Take {
        let Some(part) = self.parts.get(name) else {
            return Take::Nothing;
        };
        let Some(seen) = resource_version else {
            return Take::Nothing;
        };
        if !part.added.is_empty() && seen != part.resource_version {
            if older(seen, &part.resource_version) {
                return Take::Nothing;
            }
            self.outcome.conflict = true;
            self.done(name);
            return Take::Nothing;
        }
        if part.added.is_empty() && part.status.is_none() {
            self.done(name);
            return Take::Nothing;
        }
        self.in_flight.insert(name.to_string());
        Take::Write {
            added: part.added.clone(),
            status: part.status.clone(),
        }
    }

    /// `name`'s write went through.
    pub fn written(&mut self, name: &str) {
        if self.in_flight.contains(name) {
            self.done(name);
        }
    }

    /// `name`'s write was refused: a conflict reads again; a node gone fails.
    pub fn refused(&mut self, name: &str, why: Refusal) {
        if !self.in_flight.contains(name) {
            return;
        }
        match why {
            Refusal::Conflict => self.outcome.conflict = true,
            Refusal::Gone => self.outcome.failed.push(name.to_string()),
        }
        self.done(name);
    }

    /// `name`'s write failed.
    pub fn failed(&mut self, name: &str) {
        if self.in_flight.contains(name) {
            self.outcome.failed.push(name.to_string());
            self.done(name);
        }
    }

    /// The node is gone: its part is dropped.
    pub fn forget(&mut self, name: &str) {
        self.done(name);
    }

    fn done(&mut self, name: &str) {
        self.parts.remove(name);
        self.in_flight.remove(name);
        self.settle_if_done();
    }

    fn settle_if_done(&mut self) {
        if !self.parts.is_empty() {
            return;
        }
        if let Some(settled) = self.settled.take() {
            // The sticky loop gone (it ended with its watch) waits for nothing.
            let _ = settled.send(std::mem::take(&mut self.outcome));
        }
    }
}

/// `allocated` with the `added` blocks.
pub fn with_blocks(allocated: &[AllocatedPool], added: &[(String, IpNet)]) -> Vec<AllocatedPool> {
    let mut all = allocated.to_vec();
    for (pool, cidr) in added {
        add_block(&mut all, pool, *cidr);
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(pool: &str, cidr: &str) -> (String, IpNet) {
        (pool.to_string(), cidr.parse().unwrap())
    }

    fn decision(parts: &[(&str, NodePart)]) -> (Decision, oneshot::Receiver<Settled>) {
        let (settled, rx) = oneshot::channel();
        let nodes = parts
            .iter()
            .map(|(n, p)| (n.to_string(), p.clone()))
            .collect();
        (Decision { nodes, settled }, rx)
    }

    fn part(rv: &str, added: Vec<(String, IpNet)>, status: Option<&str>) -> NodePart {
        NodePart {
            resource_version: rv.into(),
            added,
            status: Some(status.map(String::from)),
        }
    }

    #[test]
    fn a_decision_is_settled_once_every_node_is_written() {
        let mut w = StickyWrites::default();
        let (d, mut rx) = decision(&[
            (
                "a",
                part("5", vec![block("web", "10.77.0.1/32")], Some("{}")),
            ),
            ("b", part("6", Vec::new(), None)),
        ]);
        assert_eq!(w.decided(d), ["a", "b"]);
        // b is not seen yet; a is seen at an older version: both wait.
        assert_eq!(w.take("b", None), Take::Nothing);
        assert_eq!(w.take("a", Some("4")), Take::Nothing);
        assert!(matches!(w.take("a", Some("5")), Take::Write { added, .. } if added.len() == 1));
        assert!(
            matches!(w.take("b", Some("9")), Take::Write { added, status: Some(None) } if added.is_empty())
        );
        w.written("a");
        assert_eq!(rx.try_recv().unwrap(), None);
        w.written("b");
        assert_eq!(rx.try_recv().unwrap(), Some(Settled::default()));
    }

    #[test]
    fn a_node_that_changed_conflicts_and_a_failure_is_reported() {
        let mut w = StickyWrites::default();
        let (d, mut rx) = decision(&[
            ("a", part("5", vec![block("web", "10.77.0.1/32")], None)),
            ("b", part("6", vec![block("web", "10.77.0.2/32")], None)),
            ("c", part("7", Vec::new(), Some("{}"))),
        ]);
        w.decided(d);
        assert_eq!(w.take("a", Some("8")), Take::Nothing, "changed since");
        // A write without the part (a plain carving of b) settles nothing.
        w.failed("b");
        assert!(matches!(w.take("b", Some("6")), Take::Write { .. }));
        w.failed("b");
        assert!(matches!(w.take("c", Some("7")), Take::Write { .. }));
        w.refused("c", Refusal::Conflict);
        let settled = rx.try_recv().unwrap().unwrap();
        assert!(settled.conflict);
        assert_eq!(settled.failed, ["b"]);
    }

    #[test]
    fn an_empty_decision_or_gone_nodes_settle_at_once() {
        let mut w = StickyWrites::default();
        let (d, mut rx) = decision(&[]);
        assert!(w.decided(d).is_empty());
        assert_eq!(rx.try_recv().unwrap(), Some(Settled::default()));
        let (d, mut rx) = decision(&[("a", part("5", Vec::new(), None))]);
        w.decided(d);
        w.forget("a");
        assert_eq!(rx.try_recv().unwrap(), Some(Settled::default()));
    }

    #[test]
    fn blocks_join_their_pools_entry() {
        let held = |pool: &str, cidr: &str| AllocatedPool {
            pool: pool.into(),
            cidrs: vec![cidr.parse().unwrap()],
            ..Default::default()
        };
        let all = with_blocks(
            &[held("default", "10.0.0.0/26"), held("web", "10.77.0.5/32")],
            &[block("web", "10.77.0.1/32"), block("db", "10.78.0.1/32")],
        );
        let pools: Vec<&str> = all.iter().map(|a| a.pool.as_str()).collect();
        assert_eq!(pools, ["default", "web", "db"]);
        assert_eq!(all[1].cidrs.len(), 2);
        assert_eq!(all[1].cidrs[0].to_string(), "10.77.0.1/32");
    }
}
