//! The multi-pool operator's cluster-wide bookkeeping (pure logic, no I/O): one
//! [`PoolOperator`] for every node, so a block belongs to one node at a time,
//! and which node holds which block. It is fed what the API server says of each
//! CiliumNode (`spec.ipam.pools.requested` and `allocated`, the resourceVersion)
//! and of the CiliumPodIPPools, and says what each node's `allocated` and
//! `status.ipam.operator-status.error` must become.
//!
//! # Who holds a block
//!
//! A block is held by the node whose `allocated` lists it, or by the node it was
//! just carved for (the write is on its way). A node's observation that is not
//! older than what is known of it (resourceVersions compare as numbers, as
//! Kubernetes guarantees since 1.35) is the truth about its blocks: a block it no
//! longer lists was released by its agent and is free again. The operator's
//! writes of `allocated` carry the resourceVersion they were computed from, so a
//! write can never put back a block the agent removed meanwhile (the API server
//! answers 409 and the node is read again).
//!
//! # Pool edits
//!
//! A new set of pool definitions is checked against every node's blocks
//! ([`PoolOperator::update_pools_held`]); when it breaks blocks in use (a mask
//! size change, a CIDR in use removed, a pool with blocks deleted) it is refused:
//! the last good definitions stay in force, and nodes with errors get the reason
//! appended to theirs.

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;

use crate::ipam::pool_operator::PoolOperator;
use crate::ipam::pooldef::PoolDef;
use crate::resources::{AllocatedPool, RequestedPool};

/// What the operator reads of one CiliumNode.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObservedNode {
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub requested: Vec<RequestedPool>,
    pub allocated: Vec<AllocatedPool>,
    /// `status.ipam.operator-status.error` as the API server has it.
    pub error: String,
    /// Annotated `ipam.cilium.io/ignore: "true"`: its blocks stay taken, nothing
    /// is carved or written for it.
    pub ignored: bool,
}

/// What one node's CiliumNode must be changed to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeWrite {
    pub uid: String,
    /// The resourceVersion the write is computed from (its precondition).
    pub resource_version: String,
    /// The new `spec.ipam.pools.allocated`, when blocks were carved.
    pub allocated: Option<Vec<AllocatedPool>>,
    /// The new operator-status error ("" clears it), when it differs.
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default)]
struct NodeState {
    uid: String,
    resource_version: String,
    requested: Vec<RequestedPool>,
    /// `allocated` as last observed, plus the blocks carved since.
    allocated: Vec<AllocatedPool>,
    /// The error the API server has.
    error: String,
    ignored: bool,
}

/// Whether resourceVersion `a` is older than `b` (both numbers; anything else
/// is never older).
fn older(a: &str, b: &str) -> bool {
    match (a.parse::<u128>(), b.parse::<u128>()) {
        (Ok(a), Ok(b)) => a < b,
        _ => false,
    }
}

fn blocks_of(allocated: &[AllocatedPool]) -> BTreeSet<(String, IpNet)> {
    allocated
        .iter()
        .flat_map(|a| a.cidrs.iter().map(|c| (a.pool.clone(), c.trunc())))
        .collect()
}

/// The cluster-wide multi-pool bookkeeping. See the module docs.
#[derive(Debug, Clone)]
pub struct PoolBlocks {
    operator: PoolOperator,
    nodes: BTreeMap<String, NodeState>,
    /// (pool, block) -> the node holding it.
    holders: BTreeMap<(String, IpNet), String>,
    /// Why the latest pool definitions were refused (None: they are in force).
    refused: Option<String>,
}

impl PoolBlocks {
    /// Starts from the pool definitions as they are (an invalid set is an error).
    pub fn new(pools: &[PoolDef]) -> Result<PoolBlocks, String> {
        Ok(PoolBlocks {
            operator: PoolOperator::new(pools)?,
            nodes: BTreeMap::new(),
            holders: BTreeMap::new(),
            refused: None,
        })
    }

    /// Takes one node's CiliumNode as the API server has it. Returns the
    /// problems found in its `allocated` (a block held by another node, a block
    /// that is not one of its pool's), for the log; the node holds every other
    /// listed block, and the blocks it no longer lists are free again. An
    /// observation older than what is known of the node is ignored; a node
    /// replaced by a new object (another UID) starts over.
    pub fn observe(&mut self, node: ObservedNode) -> Vec<String> {
        if let Some(known) = self.nodes.get(&node.name) {
            if known.uid != node.uid {
                self.remove(&node.name);
            } else if older(&node.resource_version, &known.resource_version) {
                return Vec::new();
            }
        }
        let listed = blocks_of(&node.allocated);
        let gone: Vec<(String, IpNet)> = self
            .holders
            .iter()
            .filter(|(block, holder)| **holder == node.name && !listed.contains(*block))
            .map(|(block, _)| block.clone())
            .collect();
        for (pool, cidr) in gone {
            self.operator.release(&pool, &cidr);
            self.holders.remove(&(pool, cidr));
        }
        let mut problems = Vec::new();
        let mut allocated = node.allocated.clone();
        for (pool, cidr) in listed {
            let key = (pool.clone(), cidr);
            match self.holders.get(&key) {
                Some(h) if *h == node.name => continue,
                Some(h) => {
                    problems.push(format!(
                        "block {cidr} of pool {pool:?} is listed by node {:?} but is held by node \
                         {h:?}: left with {h:?}",
                        node.name
                    ));
                    for a in allocated.iter_mut().filter(|a| a.pool == pool) {
                        a.cidrs.retain(|c| c.trunc() != cidr);
                    }
                    continue;
                }
                None => {}
            }
            let one = AllocatedPool {
                pool: pool.clone(),
                cidrs: vec![cidr],
                ..Default::default()
            };
            match self.operator.adopt(&[one]) {
                Ok(()) => {
                    self.holders.insert(key, node.name.clone());
                }
                Err(e) => problems.push(format!("node {:?}: {e}", node.name)),
            }
        }
        self.nodes.insert(
            node.name.clone(),
            NodeState {
                uid: node.uid,
                resource_version: node.resource_version,
                requested: node.requested,
                allocated,
                error: node.error,
                ignored: node.ignored,
            },
        );
        problems
    }

    /// The node's CiliumNode is gone: its blocks are free again.
    pub fn remove(&mut self, name: &str) {
        self.nodes.remove(name);
        let held: Vec<(String, IpNet)> = self
            .holders
            .iter()
            .filter(|(_, h)| *h == name)
            .map(|(b, _)| b.clone())
            .collect();
        for (pool, cidr) in held {
            self.operator.release(&pool, &cidr);
            self.holders.remove(&(pool, cidr));
        }
    }

    /// New pool definitions: in force when they keep every node's blocks valid,
    /// otherwise refused: the previous ones stay in force. Returns the refusal.
    pub fn set_pools(&mut self, pools: &[PoolDef]) -> Result<(), String> {
        let holders: Vec<(String, &[AllocatedPool])> = self
            .nodes
            .iter()
            .map(|(name, n)| (format!("node {name:?}"), n.allocated.as_slice()))
            .collect();
        match self.operator.update_pools_held(pools, &holders) {
            Ok(()) => {
                self.refused = None;
                Ok(())
            }
            Err(why) => {
                self.refused = Some(why.clone());
                Err(why)
            }
        }
    }

    /// Carves what `name` requested and lacks, and says what to write (None:
    /// nothing). The carved blocks are held by the node from now on; after a
    /// write refused with a conflict, observe the node again (the blocks not
    /// written are freed by it).
    pub fn plan(&mut self, name: &str) -> Option<NodeWrite> {
        let node = self.nodes.get_mut(name).filter(|n| !n.ignored)?;
        let mut allocated = node.allocated.clone();
        let errors = self.operator.satisfy(name, &node.requested, &mut allocated);
        let mut error = errors.join("; ");
        if let (Some(why), false) = (&self.refused, error.is_empty()) {
            error = format!("{error}; pool definitions not applied: {why}");
        }
        let carved = (allocated != node.allocated).then(|| allocated.clone());
        if carved.is_some() {
            for (pool, cidr) in blocks_of(&allocated).difference(&blocks_of(&node.allocated)) {
                self.holders.insert((pool.clone(), *cidr), name.to_string());
            }
            node.allocated = allocated;
        }
        let error = (error != node.error).then_some(error);
        if carved.is_none() && error.is_none() {
            return None;
        }
        Some(NodeWrite {
            uid: node.uid.clone(),
            resource_version: node.resource_version.clone(),
            allocated: carved,
            error,
        })
    }

    /// The nodes known, sorted.
    pub fn node_names(&self) -> Vec<String> {
        self.nodes.keys().cloned().collect()
    }

    /// Per pool: `(blocks in use, blocks free)`.
    pub fn pool_space(&self) -> BTreeMap<String, (u64, u64)> {
        self.operator.pool_space()
    }

    /// Nodes with an error in their operator-status (waiting for room, a pool).
    pub fn waiting(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|(_, n)| !n.error.is_empty())
            .map(|(name, _)| name.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::pooldef::PoolFamilySpec;
    use crate::resources::PoolDemand;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn pool(name: &str, cidrs: &[&str], mask: u8) -> PoolDef {
        PoolDef {
            name: name.into(),
            ipv4: Some(PoolFamilySpec {
                cidrs: cidrs.iter().map(|c| net(c)).collect(),
                mask_size: mask,
                reserved_ranges: Vec::new(),
            }),
            ..Default::default()
        }
    }

    fn node(name: &str, rv: u32, wants: &[(&str, u64)], holds: &[(&str, &[&str])]) -> ObservedNode {
        ObservedNode {
            name: name.into(),
            uid: format!("uid-{name}"),
            resource_version: rv.to_string(),
            requested: wants
                .iter()
                .map(|(p, n)| RequestedPool {
                    pool: p.to_string(),
                    needed: PoolDemand {
                        ipv4_addrs: *n,
                        ipv6_addrs: 0,
                    },
                })
                .collect(),
            allocated: holds
                .iter()
                .map(|(p, cs)| AllocatedPool {
                    pool: p.to_string(),
                    cidrs: cs.iter().map(|c| net(c)).collect(),
                    ..Default::default()
                })
                .collect(),
            error: String::new(),
            ignored: false,
        }
    }

    impl PoolBlocks {
        fn holder(&self, pool: &str, cidr: &IpNet) -> Option<&str> {
            self.holders
                .get(&(pool.to_string(), *cidr))
                .map(String::as_str)
        }
    }

    fn cidrs(w: &NodeWrite) -> Vec<String> {
        w.allocated
            .iter()
            .flatten()
            .flat_map(|a| a.cidrs.iter().map(IpNet::to_string))
            .collect()
    }

    #[test]
    fn blocks_are_shared_across_nodes_and_adopted_before_carving() {
        let mut b = PoolBlocks::new(&[pool("default", &["10.10.0.0/24"], 26)]).unwrap();
        // n1 already holds the first block (re-adopted); n2 asks for two blocks.
        assert!(
            b.observe(node("n1", 5, &[], &[("default", &["10.10.0.0/26"])]))
                .is_empty()
        );
        b.observe(node("n2", 6, &[("default", 100)], &[]));
        assert_eq!(b.plan("n1"), None);
        let w = b.plan("n2").unwrap();
        assert_eq!(cidrs(&w), ["10.10.0.64/26", "10.10.0.128/26"]);
        assert_eq!(w.resource_version, "6");
        assert_eq!(w.error, None);
        assert_eq!(b.holder("default", &net("10.10.0.128/26")), Some("n2"));
        assert_eq!(b.pool_space()["default"], (3, 1));
        // Planned again before the write is seen: nothing more to carve.
        assert_eq!(b.plan("n2"), None);
    }

    #[test]
    fn errors_name_the_node_and_a_missing_pool_recovers_when_created() {
        let mut b = PoolBlocks::new(&[pool("default", &["10.10.0.0/24"], 26)]).unwrap();
        b.observe(node("n1", 1, &[("mars", 10)], &[]));
        let w = b.plan("n1").unwrap();
        assert_eq!(
            w.error.as_deref(),
            Some(
                "failed to allocate ipv4 address for node \"n1\" from pool \"mars\": cannot \
                 allocate from non-existing pool: mars"
            )
        );
        assert_eq!(w.allocated, None);
        let mut after = node("n1", 2, &[("mars", 10)], &[]);
        after.error = w.error.clone().unwrap();
        b.observe(after);
        assert_eq!(b.waiting(), ["n1"]);
        assert_eq!(b.plan("n1"), None, "the error is written once");
        b.set_pools(&[
            pool("default", &["10.10.0.0/24"], 26),
            pool("mars", &["10.20.0.0/24"], 26),
        ])
        .unwrap();
        let w = b.plan("n1").unwrap();
        assert_eq!(cidrs(&w), ["10.20.0.0/26"]);
        assert_eq!(w.error.as_deref(), Some(""), "cleared");
    }

    #[test]
    fn a_released_block_is_freed_and_carved_for_another_node() {
        let mut b = PoolBlocks::new(&[pool("default", &["10.10.0.0/25"], 26)]).unwrap();
        b.observe(node("n1", 1, &[("default", 100)], &[]));
        let w = b.plan("n1").unwrap();
        assert_eq!(cidrs(&w), ["10.10.0.0/26", "10.10.0.64/26"]);
        let both: &[&str] = &["10.10.0.0/26", "10.10.0.64/26"];
        b.observe(node("n1", 2, &[("default", 100)], &[("default", both)]));
        b.observe(node("n2", 3, &[("default", 10)], &[]));
        let w = b.plan("n2").unwrap();
        let full = w.error.unwrap();
        assert!(full.contains("there are no remaining CIDRs left"), "{full}");
        let mut after = node("n2", 4, &[("default", 10)], &[]);
        after.error = full;
        b.observe(after);
        // A stale event (before the operator's write) does not free anything.
        b.observe(node("n1", 1, &[("default", 100)], &[]));
        assert_eq!(b.holder("default", &net("10.10.0.64/26")), Some("n1"));
        // The agent gave 10.10.0.64/26 back (its newer object no longer lists it).
        b.observe(node(
            "n1",
            5,
            &[("default", 10)],
            &[("default", &["10.10.0.0/26"])],
        ));
        assert_eq!(b.holder("default", &net("10.10.0.64/26")), None);
        let w = b.plan("n2").unwrap();
        assert_eq!(cidrs(&w), ["10.10.0.64/26"]);
        assert_eq!(w.error.as_deref(), Some(""));
    }

    #[test]
    fn a_conflicting_write_is_undone_by_observing_the_node_again() {
        let mut b = PoolBlocks::new(&[pool("default", &["10.10.0.0/25"], 26)]).unwrap();
        b.observe(node("n1", 1, &[("default", 10)], &[]));
        let w = b.plan("n1").unwrap();
        assert_eq!(cidrs(&w), ["10.10.0.0/26"]);
        // The write got 409; the node read again does not list the block.
        b.observe(node("n1", 2, &[], &[]));
        assert_eq!(b.holder("default", &net("10.10.0.0/26")), None);
        assert_eq!(b.pool_space()["default"], (0, 2));
    }

    #[test]
    fn a_deleted_or_replaced_node_gives_its_blocks_back() {
        let mut b = PoolBlocks::new(&[pool("default", &["10.10.0.0/25"], 26)]).unwrap();
        b.observe(node("n1", 1, &[], &[("default", &["10.10.0.0/26"])]));
        b.observe(node("n2", 2, &[], &[("default", &["10.10.0.64/26"])]));
        b.remove("n1");
        assert_eq!(b.holder("default", &net("10.10.0.0/26")), None);
        let mut again = node("n2", 1, &[], &[]);
        again.uid = "uid-new".into();
        b.observe(again);
        assert_eq!(b.holder("default", &net("10.10.0.64/26")), None, "new UID");
        assert_eq!(b.node_names(), ["n2"]);
    }

    #[test]
    fn an_ignored_node_keeps_its_blocks_and_gets_nothing() {
        let mut b = PoolBlocks::new(&[pool("default", &["10.10.0.0/25"], 26)]).unwrap();
        let mut n1 = node(
            "n1",
            1,
            &[("default", 100)],
            &[("default", &["10.10.0.0/26"])],
        );
        n1.ignored = true;
        b.observe(n1);
        assert_eq!(b.plan("n1"), None);
        assert_eq!(b.holder("default", &net("10.10.0.0/26")), Some("n1"));
        b.observe(node("n2", 2, &[("default", 100)], &[]));
        assert_eq!(cidrs(&b.plan("n2").unwrap()), ["10.10.0.64/26"]);
    }

    #[test]
    fn a_block_two_nodes_list_stays_with_the_first() {
        let mut b = PoolBlocks::new(&[pool("default", &["10.10.0.0/24"], 26)]).unwrap();
        b.observe(node("n1", 1, &[], &[("default", &["10.10.0.0/26"])]));
        let problems = b.observe(node(
            "n2",
            2,
            &[("default", 10)],
            &[("default", &["10.10.0.0/26", "10.10.1.0/26"])],
        ));
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].contains("is held by node \"n1\""),
            "{problems:?}"
        );
        assert!(
            problems[1].contains("not part of the requested pool"),
            "{problems:?}"
        );
        assert_eq!(b.holder("default", &net("10.10.0.0/26")), Some("n1"));
        let w = b.plan("n2").unwrap();
        assert_eq!(
            cidrs(&w),
            ["10.10.0.64/26", "10.10.1.0/26"],
            "the orphan is kept"
        );
    }

    #[test]
    fn a_pool_edit_that_breaks_blocks_in_use_is_refused_and_the_old_one_serves() {
        let mut b = PoolBlocks::new(&[pool("default", &["10.10.0.0/24"], 26)]).unwrap();
        b.observe(node(
            "n1",
            1,
            &[("default", 10)],
            &[("default", &["10.10.0.0/26"])],
        ));
        let why = b
            .set_pools(&[pool("default", &["10.10.0.0/24"], 27)])
            .unwrap_err();
        assert!(
            why.contains("cannot change IPv4 mask size in existing pool \"default\" from 26 to 27"),
            "{why}"
        );
        assert!(why.contains("node \"n1\" holds 10.10.0.0/26"), "{why}");
        let why = b.set_pools(&[]).unwrap_err();
        assert!(
            why.starts_with(
                "pool still in use by node: cannot delete pool \"default\" while node \"n1\""
            ),
            "{why}"
        );
        assert_eq!(b.refused.as_deref(), Some(why.as_str()));
        // Still carving /26s from the old definition.
        b.observe(node(
            "n1",
            2,
            &[("default", 100)],
            &[("default", &["10.10.0.0/26"])],
        ));
        assert_eq!(
            cidrs(&b.plan("n1").unwrap()),
            ["10.10.0.0/26", "10.10.0.64/26"]
        );
        // A compatible edit (a CIDR added) is taken and clears the refusal.
        b.set_pools(&[pool("default", &["10.10.0.0/24", "10.11.0.0/24"], 26)])
            .unwrap();
        assert_eq!(b.refused, None);
        assert_eq!(b.pool_space()["default"], (2, 6));
    }

    #[test]
    fn resource_versions_compare_as_numbers() {
        assert!(older("9", "10"));
        assert!(!older("10", "9"));
        assert!(!older("10", "10"));
        assert!(!older("x", "10"));
    }
}
