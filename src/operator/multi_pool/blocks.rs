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
//! # Nodes that ran cluster-pool
//!
//! A node whose `spec.ipam.podCIDRs` (written by a cluster-pool operator) are
//! not listed in its `allocated` has pods on those ranges: every pool block
//! overlapping them is kept out of carving (for every node, itself included)
//! for as long as the node lists them. With
//! `--enable-cluster-pool-to-multi-pool-migration` the node's plan adopts them
//! instead: after [`check_migration`] against the default pool they become the
//! node's blocks of that pool in `allocated` (Cilium's online migration); a
//! failed check is the node's operator-status error, prefixed with
//! [`MIGRATION_FAILED_PREFIX`], and nothing is carved for it.
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

use super::sticky_writes::sticky_annotated;
use crate::ipam::pool_operator::{
    MIGRATION_FAILED_PREFIX, PoolOperator, PoolsRefused, check_migration, migrated_allocation,
};
use crate::ipam::pooldef::PoolDef;
use crate::k8s::mirror::Keyed;
use crate::operator::node_loop::{ignored, older};
use crate::resources::{AllocatedPool, NodeResource, RequestedPool};

/// What the operator reads of one CiliumNode: all the node loop keeps of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObservedNode {
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub requested: Vec<RequestedPool>,
    pub allocated: Vec<AllocatedPool>,
    /// `spec.ipam.podCIDRs` (a cluster-pool operator's CIDRs).
    pub pod_cidrs: Vec<IpNet>,
    /// `status.ipam.operator-status.error` as the API server has it.
    pub error: String,
    /// Annotated `ipam.cilium.io/ignore: "true"`: its blocks stay taken, nothing
    /// is carved or written for it.
    pub ignored: bool,
    /// Annotated with a sticky-address request or answer (what the sticky
    /// loop hears of it: [`NodeSeen`](super::sticky_writes::NodeSeen)).
    pub sticky: bool,
}

impl From<&NodeResource> for ObservedNode {
    fn from(node: &NodeResource) -> ObservedNode {
        ObservedNode {
            name: node.metadata.name.clone(),
            uid: node.metadata.uid().to_string(),
            resource_version: node.metadata.resource_version.clone().unwrap_or_default(),
            requested: node.spec.ipam.pools.requested.clone(),
            allocated: node.spec.ipam.pools.allocated.clone(),
            pod_cidrs: node.spec.ipam.pod_cidrs.clone(),
            error: node.status.ipam.operator_status.error.clone(),
            ignored: ignored(&node.metadata.annotations),
            sticky: sticky_annotated(&node.metadata.annotations),
        }
    }
}

impl Keyed for ObservedNode {
    fn key(&self) -> String {
        self.name.clone()
    }
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
    pod_cidrs: Vec<IpNet>,
    /// The error the API server has.
    error: String,
    ignored: bool,
}

impl NodeState {
    /// Its pod CIDRs that no entry of `allocated` lists (not migrated yet).
    fn unmigrated(&self) -> Vec<IpNet> {
        let listed: BTreeSet<IpNet> = blocks_of(&self.allocated)
            .into_iter()
            .map(|(_, c)| c)
            .collect();
        self.pod_cidrs
            .iter()
            .map(IpNet::trunc)
            .filter(|c| !listed.contains(c))
            .collect()
    }
}

fn blocks_of(allocated: &[AllocatedPool]) -> BTreeSet<(String, IpNet)> {
    allocated
        .iter()
        .flat_map(|a| a.cidrs.iter().map(|c| (a.pool.clone(), c.trunc())))
        .collect()
}

/// The cluster-wide multi-pool bookkeeping. See the module docs. The default
/// one has no pools yet.
#[derive(Debug, Clone, Default)]
pub struct PoolBlocks {
    operator: PoolOperator,
    nodes: BTreeMap<String, NodeState>,
    /// (pool, block) -> the node holding it.
    holders: BTreeMap<(String, IpNet), String>,
    /// Why the latest pool definitions were refused (None: they are in force).
    refused: Option<String>,
    /// node -> the pool blocks kept out of carving for its unmigrated pod
    /// CIDRs (module docs), to free when it no longer lists them.
    reserved: BTreeMap<String, Vec<(String, IpNet)>>,
    /// `--enable-cluster-pool-to-multi-pool-migration`: the default pool the
    /// pod CIDRs migrate into; None: they are only kept out of carving.
    migrate_into: Option<String>,
}

impl PoolBlocks {
    /// Starts from the pool definitions as they are (an invalid set is an error).
    pub fn new(pools: &[PoolDef]) -> Result<PoolBlocks, PoolsRefused> {
        Ok(PoolBlocks {
            operator: PoolOperator::new(pools)?,
            nodes: BTreeMap::new(),
            holders: BTreeMap::new(),
            refused: None,
            reserved: BTreeMap::new(),
            migrate_into: None,
        })
    }

    /// Migrates the unmigrated pod CIDRs of every node into `default_pool`.
    pub fn with_migration(mut self, default_pool: &str) -> PoolBlocks {
        self.migrate_into = Some(default_pool.to_string());
        self
    }

    /// Frees the blocks kept out for `name`'s pod CIDRs, except those a node
    /// now lists (they are held).
    fn unreserve(&mut self, name: &str) {
        for (pool, cidr) in self.reserved.remove(name).unwrap_or_default() {
            if !self.holders.contains_key(&(pool.clone(), cidr)) {
                self.operator.release(&pool, &cidr);
            }
        }
    }

    /// Keeps the pool blocks overlapping `name`'s unmigrated pod CIDRs out of
    /// carving; returns the blocks another node holds inside them (problems).
    fn reserve(&mut self, name: &str) -> Vec<String> {
        let Some(node) = self.nodes.get(name) else {
            return Vec::new();
        };
        let mut taken = Vec::new();
        let mut problems = Vec::new();
        for range in node.unmigrated() {
            taken.extend(self.operator.occupy_range(&range));
            for ((pool, block), holder) in &self.holders {
                let overlaps = block.contains(&range.network()) || range.contains(&block.network());
                if overlaps && holder != name {
                    problems.push(format!(
                        "node {name:?} has cluster-pool pod CIDR {range} but block {block} of                          pool {pool:?} inside it is held by node {holder:?}"
                    ));
                }
            }
        }
        if !taken.is_empty() {
            self.reserved.insert(name.to_string(), taken);
        }
        problems
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
        let name = node.name.clone();
        self.nodes.insert(
            name.clone(),
            NodeState {
                uid: node.uid,
                resource_version: node.resource_version,
                requested: node.requested,
                allocated,
                pod_cidrs: node.pod_cidrs,
                error: node.error,
                ignored: node.ignored,
            },
        );
        self.unreserve(&name);
        problems.extend(self.reserve(&name));
        problems
    }

    /// The node's CiliumNode is gone: its blocks are free again.
    pub fn remove(&mut self, name: &str) {
        self.nodes.remove(name);
        self.unreserve(name);
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
    pub fn set_pools(&mut self, pools: &[PoolDef]) -> Result<(), PoolsRefused> {
        let holders: Vec<(String, &[AllocatedPool])> = self
            .nodes
            .iter()
            .map(|(name, n)| (format!("node {name:?}"), n.allocated.as_slice()))
            .collect();
        match self.operator.update_pools_held(pools, &holders) {
            Ok(()) => {
                self.refused = None;
                // The allocators were rebuilt from the held blocks only.
                self.reserved.clear();
                for name in self.node_names() {
                    for problem in self.reserve(&name) {
                        tracing::error!(node = %name, "{problem}");
                    }
                }
                Ok(())
            }
            Err(why) => {
                self.refused = Some(why.to_string());
                Err(why)
            }
        }
    }

    /// Carves what `name` requested and lacks, and says what to write (None:
    /// nothing). The carved blocks are held by the node from now on; after a
    /// write refused with a conflict, observe the node again (the blocks not
    /// written are freed by it).
    pub fn plan(&mut self, name: &str) -> Option<NodeWrite> {
        let node = self.nodes.get(name).filter(|n| !n.ignored)?;
        let mut allocated = node.allocated.clone();
        let requested = node.requested.clone();
        let unmigrated = node.unmigrated();
        let migration = match &self.migrate_into {
            Some(pool) if !unmigrated.is_empty() => self.migrate(pool, &unmigrated, &mut allocated),
            _ => Ok(()),
        };
        let mut error = match migration {
            Ok(()) => self
                .operator
                .satisfy(name, &requested, &mut allocated)
                .join("; "),
            Err(why) => format!("{MIGRATION_FAILED_PREFIX}{why}"),
        };
        let node = self.nodes.get_mut(name)?;
        if let (Some(why), false) = (&self.refused, error.is_empty()) {
            error = format!("{error}; pool definitions not applied: {why}");
        }
        let carved = (allocated != node.allocated).then(|| allocated.clone());
        if carved.is_some() {
            for (pool, cidr) in blocks_of(&allocated).difference(&blocks_of(&node.allocated)) {
                self.holders.insert((pool.clone(), *cidr), name.to_string());
            }
            if let Some(kept) = self.reserved.get_mut(name) {
                kept.retain(|b| !self.holders.contains_key(b));
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

    /// Adds the node's unmigrated pod CIDRs to `allocated` as blocks of the
    /// default pool `pool` when the migration's preconditions hold; else why not.
    fn migrate(
        &self,
        pool: &str,
        unmigrated: &[IpNet],
        allocated: &mut Vec<AllocatedPool>,
    ) -> Result<(), PoolsRefused> {
        let def = self.operator.pool_def(pool).ok_or_else(|| {
            PoolsRefused::from(format!(
                "default pool {pool:?} does not exist: create the CiliumPodIPPool {pool:?}                  covering the node's pod CIDRs with the same mask size"
            ))
        })?;
        check_migration(def, unmigrated)?;
        let migrated = migrated_allocation(def, unmigrated);
        match allocated.iter_mut().find(|a| a.pool == pool) {
            Some(entry) => {
                entry.cidrs.extend(migrated.cidrs);
                entry.cidrs.sort();
            }
            None => {
                allocated.push(migrated);
                allocated.sort_by(|a, b| a.pool.cmp(&b.pool));
            }
        }
        Ok(())
    }

    /// What is known of `name`: a write that changes nothing (its UID and the
    /// resourceVersion last observed), and its blocks (observed, plus those
    /// carved since).
    pub fn known(&self, name: &str) -> Option<(NodeWrite, &[AllocatedPool])> {
        let node = self.nodes.get(name)?;
        let write = NodeWrite {
            uid: node.uid.clone(),
            resource_version: node.resource_version.clone(),
            allocated: None,
            error: None,
        };
        Some((write, &node.allocated))
    }

    /// Whether the latest pool definitions were refused.
    pub fn pools_refused(&self) -> bool {
        self.refused.is_some()
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
            pod_cidrs: Vec::new(),
            error: String::new(),
            ignored: false,
            sticky: false,
        }
    }

    /// A node that ran cluster-pool: `pod_cidrs`, nothing allocated.
    fn cluster_pool_node(name: &str, rv: u32, pod_cidrs: &[&str]) -> ObservedNode {
        let mut n = node(name, rv, &[], &[]);
        n.pod_cidrs = pod_cidrs.iter().map(|c| net(c)).collect();
        n
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
            .unwrap_err()
            .to_string();
        assert!(
            why.contains("cannot change IPv4 mask size in existing pool \"default\" from 26 to 27"),
            "{why}"
        );
        assert!(why.contains("node \"n1\" holds 10.10.0.0/26"), "{why}");
        let why = b.set_pools(&[]).unwrap_err().to_string();
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
    fn cluster_pool_cidrs_are_never_carved_without_the_migration() {
        let mut b = PoolBlocks::new(&[pool("default", &["10.10.0.0/24"], 26)]).unwrap();
        // n1 ran cluster-pool with a /25: two blocks of the pool are its.
        assert!(
            b.observe(cluster_pool_node("n1", 1, &["10.10.0.0/25"]))
                .is_empty()
        );
        assert_eq!(b.plan("n1"), None, "nothing written without the option");
        b.observe(node("n2", 2, &[("default", 100)], &[]));
        let w = b.plan("n2").unwrap();
        assert_eq!(cidrs(&w), ["10.10.0.128/26", "10.10.0.192/26"]);
        // Still kept out after a pool edit rebuilds the allocators.
        b.set_pools(&[pool("default", &["10.10.0.0/24", "10.11.0.0/24"], 26)])
            .unwrap();
        b.observe(node("n3", 3, &[("default", 10)], &[]));
        assert_eq!(cidrs(&b.plan("n3").unwrap()), ["10.11.0.0/26"]);
        // The node is gone: its range is free again.
        b.remove("n1");
        b.observe(node("n4", 4, &[("default", 10)], &[]));
        assert_eq!(cidrs(&b.plan("n4").unwrap()), ["10.10.0.0/26"]);
    }

    #[test]
    fn the_migration_adopts_the_pod_cidrs_as_default_pool_blocks() {
        let pools = [pool("default", &["10.10.0.0/16"], 24)];
        let mut b = PoolBlocks::new(&pools).unwrap().with_migration("default");
        b.observe(cluster_pool_node("n1", 1, &["10.10.5.0/24"]));
        let w = b.plan("n1").unwrap();
        assert_eq!(cidrs(&w), ["10.10.5.0/24"]);
        assert_eq!(w.error, None);
        assert_eq!(w.allocated.as_ref().unwrap()[0].pool, "default");
        assert_eq!(b.holder("default", &net("10.10.5.0/24")), Some("n1"));
        // The agent restarted in multi-pool asks for more: a new block next to it.
        let mut n1 = cluster_pool_node("n1", 2, &["10.10.5.0/24"]);
        n1.requested = node("n1", 2, &[("default", 300)], &[]).requested;
        n1.allocated = w.allocated.clone().unwrap();
        assert!(b.observe(n1).is_empty());
        assert_eq!(
            cidrs(&b.plan("n1").unwrap()),
            ["10.10.0.0/24", "10.10.5.0/24"]
        );
        // Another node never gets the migrated block.
        b.observe(node("n2", 3, &[("default", 1000)], &[]));
        let got = cidrs(&b.plan("n2").unwrap());
        assert!(!got.contains(&"10.10.5.0/24".to_string()), "{got:?}");
        // A conflict on the write: observing the node without it keeps it out.
        let mut c = PoolBlocks::new(&pools).unwrap().with_migration("default");
        c.observe(cluster_pool_node("n1", 1, &["10.10.5.0/24"]));
        assert!(c.plan("n1").is_some());
        c.observe(cluster_pool_node("n1", 2, &["10.10.5.0/24"]));
        assert_eq!(c.holder("default", &net("10.10.5.0/24")), None);
        c.observe(node("n2", 3, &[("default", 1500)], &[]));
        let got = cidrs(&c.plan("n2").unwrap());
        assert!(!got.contains(&"10.10.5.0/24".to_string()), "{got:?}");
    }

    #[test]
    fn a_failed_migration_is_the_nodes_error_and_changes_nothing() {
        let mut b = PoolBlocks::new(&[pool("default", &["10.20.0.0/16"], 24)])
            .unwrap()
            .with_migration("default");
        let mut n1 = cluster_pool_node("n1", 1, &["10.10.5.0/24"]);
        n1.requested = node("n1", 1, &[("default", 10)], &[]).requested;
        b.observe(n1);
        let w = b.plan("n1").unwrap();
        assert_eq!(w.allocated, None, "nothing carved for the node");
        assert_eq!(
            w.error.as_deref(),
            Some(
                "migration to multi-pool IPAM failed: node pod CIDR 10.10.5.0/24 is not covered \
                 by default pool \"default\" (ipv4 CIDRs: 10.20.0.0/16): add a CIDR containing it"
            )
        );
        let mut m = PoolBlocks::new(&[pool("blue", &["10.10.0.0/16"], 24)])
            .unwrap()
            .with_migration("default");
        m.observe(cluster_pool_node("n1", 1, &["10.10.5.0/24"]));
        let e = m.plan("n1").unwrap().error.unwrap();
        assert!(
            e.starts_with(
                "migration to multi-pool IPAM failed: default pool \"default\" does not exist"
            ),
            "{e}"
        );
        // Still kept out of the pool it overlaps.
        m.observe(node("n2", 2, &[("blue", 2000)], &[]));
        let got = cidrs(&m.plan("n2").unwrap());
        assert_eq!(got.len(), 8);
        assert!(!got.contains(&"10.10.5.0/24".to_string()), "{got:?}");
    }
}
