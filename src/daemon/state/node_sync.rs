//! Node sync: what the node asks of, and reports to, the operator and the API
//! server. It owns the node resource (as this node sees it), the pool
//! definitions, the operator's part where this node plays it (the embedded
//! backend), the pending demand of failed allocations, and the outbox marks: what
//! the node sink was last handed, so that only what changed is sent.
//!
//! Invariants:
//! - a pending owner counts towards its pool's demand for `PENDING_TTL_MS` after
//!   its last failure, and no longer once it got an address;
//! - a block this node gave back to a cluster operator stays out of the node
//!   resource's blocks while the operator's copy still lists it (`releasing`);
//! - free blocks are given back only once restore has finished;
//! - cluster-pool: the node serves from every CIDR of `spec.ipam.podCIDRs` but
//!   those it released (`ipam::cidr_depletion`), and its status says which
//!   (`status.ipam.pod-cidrs`, the verdict of the last outbox);
//! - the outbox hands each change once: the used addresses when they changed,
//!   the demand, node addresses and health addresses when they differ from what
//!   was last handed.
//!
//! The journal is not here: the state journals the node resource (`journal_op`)
//! when it changed.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use super::PoolingMode;
use crate::ipam::Family;
use crate::ipam::cidr_depletion::{CidrTracker, CidrUse, DepletionRules, status_map};
use crate::ipam::hostscope::AllocatorOptions;
use crate::ipam::pooldef::PoolDef;
use crate::ipam::sticky::STICKY_STATUS;
use crate::node::{
    HealthAddresses, NodeAddress, NodeError, NodeOperator, NodeOutbox, NodeResource, RequestedPool,
    UsedAddresses,
};
use crate::resources::PodCidrStatus;
use crate::store::JournalOp;

/// How long a failed allocation keeps counting towards demand (Cilium: 5 min).
const PENDING_TTL_MS: u64 = 5 * 60 * 1000;
/// Journal key of the node resource.
pub const NODE_META_KEY: &str = "ciliumnode";

/// The blocks of each pool and family the node resource gives this node.
pub(super) type WantedBlocks = BTreeMap<(String, Family), (Vec<IpNet>, AllocatorOptions)>;

/// What was last handed to the node sink, to send only what changed.
#[derive(Debug, Clone, Default)]
struct OutboxMarks {
    used_changed: bool,
    /// Multi-pool with a cluster operator: blocks given back, to be removed from
    /// `spec.ipam.pools.allocated` by the sink.
    released: Vec<(String, IpNet)>,
    /// Blocks given back that the node resource still lists: kept out of the
    /// node's blocks until a node resource without them arrives.
    releasing: BTreeSet<(String, IpNet)>,
    requested: Option<Vec<RequestedPool>>,
    addresses: Option<Vec<NodeAddress>>,
    health: Option<HealthAddresses>,
    pod_cidrs: Option<BTreeMap<String, PodCidrStatus>>,
    /// Multi-pool: the sticky requests last handed (identity -> pool).
    sticky_requests: Option<BTreeMap<String, String>>,
}

/// The node resource, the pool definitions, the operator, demand and outbox.
pub(super) struct NodeSync {
    node: NodeResource,
    /// The operator's part, where this node plays it (the embedded backend).
    operator: Option<Box<dyn NodeOperator>>,
    pool_defs: Vec<PoolDef>,
    /// Owners whose allocation failed recently, per pool and family (demand).
    pending: BTreeMap<(String, Family), BTreeMap<String, u64>>,
    /// Free blocks are given back only once restore has finished.
    restore_finished: bool,
    outbox: OutboxMarks,
    /// cluster-pool: since when extra CIDRs are empty, which were released.
    cidrs: CidrTracker,
    /// Sticky addresses whose ADD waits: identity -> (pool, when it last asked, ms).
    sticky_waiting: BTreeMap<String, (String, u64)>,
}

impl NodeSync {
    /// The node's sync at start: the used addresses are due to the sink.
    pub(super) fn new(
        node: NodeResource,
        operator: Option<Box<dyn NodeOperator>>,
        pool_defs: Vec<PoolDef>,
    ) -> NodeSync {
        NodeSync {
            cidrs: CidrTracker::from_status(&node.spec.ipam.pod_cidrs, &node.status.ipam.pod_cidrs),
            node,
            operator,
            pool_defs,
            pending: BTreeMap::new(),
            restore_finished: false,
            sticky_waiting: BTreeMap::new(),
            outbox: OutboxMarks {
                used_changed: true,
                ..Default::default()
            },
        }
    }

    pub(super) fn node(&self) -> &NodeResource {
        &self.node
    }

    pub(super) fn pool_defs(&self) -> &[PoolDef] {
        &self.pool_defs
    }

    /// Whether this node plays the operator's part itself (the embedded backend).
    pub(super) fn has_operator(&self) -> bool {
        self.operator.is_some()
    }

    /// The cluster operator's last word on this node's demand (empty: none).
    pub(super) fn operator_error(&self) -> &str {
        &self.node.status.ipam.operator_status.error
    }

    /// The journal op that records the node resource.
    pub(super) fn journal_op(&self) -> Result<JournalOp, serde_json::Error> {
        Ok(JournalOp::PutMeta {
            key: NODE_META_KEY.into(),
            value: serde_json::to_value(&self.node)?,
        })
    }

    /// The blocks the node resource gives this node, per pool and family: the
    /// podCIDRs (host-scope), the single addresses of `spec.ipam.pool` (crd and
    /// the like), or `pools.allocated` (multi-pool, eni).
    pub(super) fn wanted_blocks(&self, pooling: &PoolingMode) -> WantedBlocks {
        let mut wanted = WantedBlocks::new();
        let ipam = &self.node.spec.ipam;
        match pooling {
            PoolingMode::HostScope => {
                let released = self.cidrs.released();
                for c in ipam.pod_cidrs.iter().map(IpNet::trunc) {
                    let e = wanted
                        .entry((super::DEFAULT_POOL.to_string(), Family::of_net(&c)))
                        .or_insert((Vec::new(), AllocatorOptions::default()));
                    if !released.contains(&c) && !e.0.contains(&c) {
                        e.0.push(c);
                    }
                }
            }
            PoolingMode::External { eni: false } => {
                let single = |ip: &String| ip.parse::<IpAddr>().ok().map(IpNet::from);
                for c in ipam
                    .pool
                    .keys()
                    .chain(ipam.ipv6_pool.keys())
                    .filter_map(single)
                {
                    wanted
                        .entry((super::DEFAULT_POOL.to_string(), Family::of_net(&c)))
                        .or_insert((Vec::new(), AllocatorOptions::default()))
                        .0
                        .push(c);
                }
            }
            PoolingMode::MultiPool(_) | PoolingMode::External { eni: true } => {
                for a in &ipam.pools.allocated {
                    let opts = AllocatorOptions {
                        allow_first_ip: a.allow_first_ip,
                        allow_last_ip: a.allow_last_ip,
                    };
                    for c in &a.cidrs {
                        wanted
                            .entry((a.pool.clone(), Family::of_net(c)))
                            .or_insert((Vec::new(), opts))
                            .0
                            .push(*c);
                    }
                }
            }
        }
        wanted
    }

    /// Notes a failed allocation as pending demand at `now` (ms).
    pub(super) fn note_pending(&mut self, pool: &str, family: Family, owner: &str, now: u64) {
        self.pending
            .entry((pool.to_string(), family))
            .or_default()
            .insert(owner.to_string(), now);
    }

    /// Clears an owner's pending demand after a success.
    pub(super) fn clear_pending(&mut self, pool: &str, family: Family, owner: &str) {
        if let Some(m) = self.pending.get_mut(&(pool.to_string(), family)) {
            m.remove(owner);
        }
    }

    /// Forgets pending owners whose failure is older than the TTL at `now`.
    pub(super) fn expire_pending(&mut self, now: u64) {
        for m in self.pending.values_mut() {
            m.retain(|_, t| now.saturating_sub(*t) < PENDING_TTL_MS);
        }
    }

    /// Notes that `identity`'s ADD waits for its sticky address of `pool` at `now` (ms).
    pub(super) fn note_sticky_waiting(&mut self, identity: &str, pool: &str, now: u64) {
        self.sticky_waiting
            .insert(identity.to_string(), (pool.to_string(), now));
    }

    /// `identity` got its sticky address (or its pod is gone): it waits no more.
    pub(super) fn clear_sticky_waiting(&mut self, identity: &str) {
        self.sticky_waiting.remove(identity);
    }

    /// The identities whose ADD waits for a sticky address, with their pool;
    /// those that last asked `PENDING_TTL_MS` before `now` are forgotten first.
    pub(super) fn sticky_waiting(&mut self, now: u64) -> impl Iterator<Item = (&str, &str)> {
        self.sticky_waiting
            .retain(|_, (_, t)| now.saturating_sub(*t) < PENDING_TTL_MS);
        self.sticky_waiting
            .iter()
            .map(|(identity, (pool, _))| (identity.as_str(), pool.as_str()))
    }

    /// The pools with pending demand (of either family; possibly none left).
    pub(super) fn pending_pools(&self) -> impl Iterator<Item = &str> {
        self.pending.keys().map(|(p, _)| p.as_str())
    }

    /// How many owners wait for an address of `pool` and `family`.
    pub(super) fn pending_count(&self, pool: &str, family: Family) -> u64 {
        self.pending
            .get(&(pool.to_string(), family))
            .map_or(0, |m| m.len() as u64)
    }

    /// Writes the demand into the node resource and, with an embedded operator,
    /// lets it carve blocks to meet it.
    pub(super) fn request(&mut self, requested: Vec<RequestedPool>) {
        self.node.spec.ipam.pools.requested = requested;
        let errors = match self.operator.as_mut() {
            Some(op) => op.satisfy(&mut self.node),
            None => Vec::new(),
        };
        for e in errors {
            tracing::warn!(error = %e, "the pool operator could not meet the node's demand");
        }
    }

    /// Whether free blocks may be given back (restore has finished).
    pub(super) fn may_give_back(&self) -> bool {
        self.restore_finished
    }

    /// From now on free blocks may be given back.
    pub(super) fn finish_restore(&mut self) {
        self.restore_finished = true;
    }

    /// Gives a free block back: to the embedded operator, or through the sink to
    /// a cluster operator (which frees it when it sees it gone from the node
    /// resource); the node resource stops listing it.
    pub(super) fn give_back_block(&mut self, pool: &str, cidr: IpNet) {
        match self.operator.as_mut() {
            Some(op) => op.release_block(pool, &cidr),
            None => {
                self.outbox.released.push((pool.to_string(), cidr));
                self.outbox.releasing.insert((pool.to_string(), cidr));
            }
        }
        for a in self
            .node
            .spec
            .ipam
            .pools
            .allocated
            .iter_mut()
            .filter(|a| a.pool == pool)
        {
            a.cidrs.retain(|c| *c != cidr);
        }
    }

    /// Drops the pools left without blocks from `pools.allocated`.
    pub(super) fn drop_empty_pools(&mut self) {
        self.node
            .spec
            .ipam
            .pools
            .allocated
            .retain(|a| !a.cidrs.is_empty());
    }

    /// New pool definitions; refused, with nothing changed, when the embedded
    /// operator finds they break what the node uses.
    pub(super) fn set_pool_defs(&mut self, defs: Vec<PoolDef>) -> Result<(), NodeError> {
        if let Some(op) = self.operator.as_mut() {
            op.update_pools(&defs, &self.node)?;
        }
        self.pool_defs = defs;
        Ok(())
    }

    /// Takes what an external system (or a cluster operator) wrote into the node
    /// resource: the addresses, blocks and ENI inventory, and the operator's
    /// status. A block being given back stays out while the new resource still
    /// lists it; once one without it arrived, a later listing is a new block.
    pub(super) fn set_external(&mut self, node: NodeResource) {
        self.node.spec.ipam.pool = node.spec.ipam.pool;
        self.node.spec.ipam.ipv6_pool = node.spec.ipam.ipv6_pool;
        let mut allocated = node.spec.ipam.pools.allocated;
        let listed: BTreeSet<(String, IpNet)> = allocated
            .iter()
            .flat_map(|a| a.cidrs.iter().map(|c| (a.pool.clone(), *c)))
            .collect();
        let releasing = &mut self.outbox.releasing;
        releasing.retain(|b| listed.contains(b));
        for a in &mut allocated {
            a.cidrs
                .retain(|c| !releasing.contains(&(a.pool.clone(), *c)));
        }
        allocated.retain(|a| !a.cidrs.is_empty());
        self.node.spec.ipam.pools.allocated = allocated;
        self.node.spec.eni = node.spec.eni;
        self.node.status.eni = node.status.eni;
        // The operator's answers to this node's sticky requests.
        match node.metadata.annotations.get(STICKY_STATUS) {
            Some(answers) => {
                self.node
                    .metadata
                    .annotations
                    .insert(STICKY_STATUS.to_string(), answers.clone());
            }
            None => {
                self.node.metadata.annotations.remove(STICKY_STATUS);
            }
        }
        // The cluster operator's last word on this node's demand (an exhausted or
        // missing pool): shown in status and failed ADDs, and it ends waits.
        self.node.status.ipam.operator_status = node.status.ipam.operator_status;
        self.outbox.used_changed = true;
    }

    /// cluster-pool: the CIDRs the operator gives this node now (none: keep
    /// what it has; a CIDR gone while in use stays until its pods go).
    pub(super) fn set_pod_cidrs(&mut self, cidrs: Vec<IpNet>) {
        if !cidrs.is_empty() {
            self.node.spec.ipam.pod_cidrs = cidrs;
        }
    }

    /// cluster-pool: judges the node's CIDRs on `uses` at `now` (ms) into
    /// `status.ipam.pod-cidrs`. Whether the released CIDRs changed (the blocks
    /// must follow).
    pub(super) fn judge_cidrs(
        &mut self,
        rules: &DepletionRules,
        uses: &[CidrUse],
        now: u64,
    ) -> bool {
        let before = self.cidrs.released().clone();
        let verdict = self
            .cidrs
            .judge(rules, &self.node.spec.ipam.pod_cidrs, uses, now);
        self.node.status.ipam.pod_cidrs = status_map(&verdict);
        *self.cidrs.released() != before
    }

    /// cluster-pool: what the agent remembers of its CIDRs.
    pub(super) fn cidr_tracker(&self) -> &CidrTracker {
        &self.cidrs
    }

    /// The router address of a family (`CiliumInternalIP`).
    pub(super) fn set_router(&mut self, ip: IpAddr) {
        self.node.set_address("CiliumInternalIP", ip);
    }

    /// The health endpoint's address of a family.
    pub(super) fn set_health(&mut self, family: Family, ip: IpAddr) {
        match family {
            Family::V4 => self.node.spec.health.ipv4 = ip.to_string(),
            Family::V6 => self.node.spec.health.ipv6 = ip.to_string(),
        }
    }

    /// The used addresses changed: the sink gets them with the next outbox.
    pub(super) fn mark_used_changed(&mut self) {
        self.outbox.used_changed = true;
    }

    /// Whether the used addresses changed since the last outbox (and forgets it).
    pub(super) fn take_used_changed(&mut self) -> bool {
        std::mem::take(&mut self.outbox.used_changed)
    }

    /// What changed for the node sink since the last call: `used` (when it
    /// changed), the blocks given back, the demand and the sticky requests
    /// (`multi_pool` only) and the node's addresses. None when nothing did.
    pub(super) fn take_outbox(
        &mut self,
        used: Option<UsedAddresses>,
        multi_pool: bool,
        sticky_requests: BTreeMap<String, String>,
    ) -> Option<NodeOutbox> {
        let mut out = NodeOutbox {
            released_blocks: std::mem::take(&mut self.outbox.released),
            used,
            ..NodeOutbox::default()
        };
        let requested = &self.node.spec.ipam.pools.requested;
        if multi_pool && self.outbox.requested.as_ref() != Some(requested) {
            self.outbox.requested = Some(requested.clone());
            out.requested_pools = Some(requested.clone());
        }
        if multi_pool
            && self.operator.is_none()
            && self.outbox.sticky_requests.as_ref() != Some(&sticky_requests)
        {
            self.outbox.sticky_requests = Some(sticky_requests.clone());
            out.sticky_requests = Some(sticky_requests);
        }
        let addresses = &self.node.spec.addresses;
        if self.outbox.addresses.as_ref() != Some(addresses) {
            self.outbox.addresses = Some(addresses.clone());
            out.addresses = Some(addresses.clone());
        }
        let health = &self.node.spec.health;
        if self.outbox.health.as_ref() != Some(health) {
            self.outbox.health = Some(health.clone());
            out.health = Some(health.clone());
        }
        let pod_cidrs = &self.node.status.ipam.pod_cidrs;
        if !pod_cidrs.is_empty() && self.outbox.pod_cidrs.as_ref() != Some(pod_cidrs) {
            self.outbox.pod_cidrs = Some(pod_cidrs.clone());
            out.pod_cidrs = Some(pod_cidrs.clone());
        }
        (!out.is_empty()).then_some(out)
    }

    /// Ages every pending owner by `ms` (tests of the TTL).
    #[cfg(test)]
    pub(super) fn age_pending(&mut self, ms: u64) {
        for owners in self.pending.values_mut() {
            owners.values_mut().for_each(|t| *t = t.saturating_sub(ms));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{AllocatedPool, PoolDemand};

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn with_blocks(blocks: &[&str]) -> NodeResource {
        let mut node = NodeResource::default();
        node.spec.ipam.pools.allocated = vec![AllocatedPool {
            pool: "blue".into(),
            cidrs: blocks.iter().map(|c| net(c)).collect(),
            ..Default::default()
        }];
        node
    }

    fn blue_blocks(sync: &NodeSync) -> Vec<IpNet> {
        sync.node()
            .spec
            .ipam
            .pools
            .allocated
            .iter()
            .filter(|a| a.pool == "blue")
            .flat_map(|a| a.cidrs.clone())
            .collect()
    }

    #[test]
    fn pending_demand_lasts_the_ttl_and_ends_when_the_owner_got_an_address() {
        let mut sync = NodeSync::new(NodeResource::default(), None, Vec::new());
        let now = 10 * PENDING_TTL_MS;
        sync.note_pending("blue", Family::V4, "ns/a", now - PENDING_TTL_MS);
        sync.note_pending("blue", Family::V4, "ns/b", now - PENDING_TTL_MS + 1);
        sync.note_pending("blue", Family::V6, "ns/b", now);
        sync.note_pending("green", Family::V4, "ns/c", now);
        assert_eq!(sync.pending_count("blue", Family::V4), 2);
        sync.expire_pending(now);
        assert_eq!(sync.pending_count("blue", Family::V4), 1, "ns/a aged out");
        sync.clear_pending("blue", Family::V4, "ns/b");
        assert_eq!(sync.pending_count("blue", Family::V4), 0);
        assert_eq!(sync.pending_count("blue", Family::V6), 1, "per family");
        // A failure noted again restarts the owner's TTL.
        sync.note_pending("green", Family::V4, "ns/c", now + PENDING_TTL_MS - 1);
        sync.expire_pending(now + PENDING_TTL_MS);
        assert_eq!(sync.pending_count("green", Family::V4), 1);
        let pools: BTreeSet<&str> = sync.pending_pools().collect();
        assert_eq!(pools, BTreeSet::from(["blue", "green"]));
    }

    #[test]
    fn the_outbox_hands_each_change_once() {
        let mut sync = NodeSync::new(NodeResource::default(), None, Vec::new());
        assert!(
            sync.take_used_changed(),
            "the used addresses are due at start"
        );
        assert!(!sync.take_used_changed());
        let first = sync
            .take_outbox(Some(UsedAddresses::default()), true, BTreeMap::new())
            .expect("the first outbox");
        assert_eq!(first.used, Some(UsedAddresses::default()));
        assert_eq!(first.requested_pools, Some(Vec::new()));
        assert_eq!(first.sticky_requests, Some(BTreeMap::new()));
        assert_eq!(first.addresses, Some(Vec::new()));
        assert!(first.health.is_some());
        assert_eq!(
            sync.take_outbox(None, true, BTreeMap::new()),
            None,
            "nothing changed since"
        );

        let router: IpAddr = "10.0.0.1".parse().unwrap();
        sync.set_router(router);
        sync.set_health(Family::V4, "10.0.0.2".parse().unwrap());
        let demand = vec![RequestedPool {
            pool: "blue".into(),
            needed: PoolDemand {
                ipv4_addrs: 16,
                ipv6_addrs: 0,
            },
        }];
        sync.request(demand.clone());
        let out = sync
            .take_outbox(None, false, BTreeMap::new())
            .expect("addresses changed");
        assert_eq!(out.addresses.unwrap()[0].ip, router.to_string());
        assert_eq!(out.health.unwrap().ipv4, "10.0.0.2");
        assert_eq!(out.requested_pools, None, "demand only in multi-pool");
        assert_eq!(out.used, None);
        let out = sync
            .take_outbox(None, true, BTreeMap::new())
            .expect("the demand");
        assert_eq!(out.requested_pools, Some(demand));
        assert_eq!(sync.take_outbox(None, true, BTreeMap::new()), None);
        let asks = BTreeMap::from([("db/web-0".to_string(), "web".to_string())]);
        let out = sync
            .take_outbox(None, true, asks.clone())
            .expect("a sticky request");
        assert_eq!(out.sticky_requests, Some(asks.clone()));
        assert_eq!(sync.take_outbox(None, true, asks), None);
        sync.mark_used_changed();
        assert!(sync.take_used_changed());
    }

    #[test]
    fn a_block_given_back_stays_out_until_a_node_resource_without_it_arrived() {
        let (b1, b2) = ("10.1.0.0/28", "10.1.0.16/28");
        let mut sync = NodeSync::new(with_blocks(&[b1, b2]), None, Vec::new());
        sync.give_back_block("blue", net(b1));
        assert_eq!(blue_blocks(&sync), [net(b2)]);
        let out = sync.take_outbox(None, true, BTreeMap::new()).unwrap();
        assert_eq!(out.released_blocks, [("blue".to_string(), net(b1))]);
        // The cluster operator's copy still lists it: kept out.
        sync.set_external(with_blocks(&[b1, b2]));
        assert_eq!(blue_blocks(&sync), [net(b2)]);
        assert!(sync.take_used_changed());
        // A resource without it arrived: a later listing is a new block.
        sync.set_external(with_blocks(&[b2]));
        sync.set_external(with_blocks(&[b1, b2]));
        assert_eq!(blue_blocks(&sync), [net(b1), net(b2)]);
        // The last block of a pool given back: the pool goes from the list.
        sync.give_back_block("blue", net(b1));
        sync.give_back_block("blue", net(b2));
        sync.drop_empty_pools();
        assert!(sync.node().spec.ipam.pools.allocated.is_empty());
    }

    #[test]
    fn the_wanted_blocks_follow_the_pooling_mode() {
        let mut node = with_blocks(&["10.1.0.0/28", "fd00:1::/120"]);
        node.spec.ipam.pod_cidrs = vec![net("10.0.0.0/24"), net("10.9.0.0/24")];
        node.spec
            .ipam
            .pool
            .insert("10.2.0.5".into(), Default::default());
        let sync = NodeSync::new(node, None, Vec::new());
        let keys = |w: WantedBlocks| -> Vec<(String, Family, Vec<IpNet>)> {
            w.into_iter().map(|((p, f), (c, _))| (p, f, c)).collect()
        };
        assert_eq!(
            keys(sync.wanted_blocks(&PoolingMode::HostScope)),
            [(
                "default".into(),
                Family::V4,
                vec![net("10.0.0.0/24"), net("10.9.0.0/24")]
            )],
            "every node CIDR"
        );
        assert_eq!(
            keys(sync.wanted_blocks(&PoolingMode::External { eni: false })),
            [("default".into(), Family::V4, vec![net("10.2.0.5/32")])]
        );
        assert_eq!(
            keys(sync.wanted_blocks(&PoolingMode::External { eni: true })),
            [
                ("blue".into(), Family::V4, vec![net("10.1.0.0/28")]),
                ("blue".into(), Family::V6, vec![net("fd00:1::/120")]),
            ]
        );
    }
}
