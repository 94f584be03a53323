//! The pools side of the state: which pool a request draws from (pool selection in
//! multi-pool, always `default` in the host-scope modes), keeping the blocks in step
//! with the node resource, and in multi-pool the demand loop: compute
//! `spec.ipam.pools.requested` with Cilium's rounding, let the backend carve blocks
//! into `allocated`, and give back blocks that are free and above demand (only
//! once restore has finished). What the node resource says and asks is
//! `node_sync`'s; this side keeps the pools in step with it.

use std::collections::BTreeMap;

use super::{ApiError, ErrorKind, IpamState};
use crate::ipam::Family;
use crate::ipam::cidr_depletion::CidrUse;
use crate::ipam::exhaustion::{self, NodeRanges};
use crate::ipam::failure_reason::FailureReason;
use crate::ipam::hostscope::AllocatorOptions;
use crate::ipam::multipool::needed_ip_ceil;
use crate::ipam::pooldef::PoolDef;
use crate::ipam::selection::{MetadataSource, SelectionError, select_pool};
use crate::node::{AddressRoom, NodeError, NodeOutbox};
use crate::resources::{PoolDemand, RequestedPool};
use crate::store::now_ms;

/// How the node's addresses are organised.
#[derive(Debug, Clone)]
pub enum PoolingMode {
    /// cluster-pool, kubernetes: one pool, `default`, holding the node CIDR of
    /// each family.
    HostScope,
    /// multi-pool: blocks of named pools, chosen per pod.
    MultiPool(MultiPoolSettings),
    /// crd, azure, alibabacloud (single IPs of `spec.ipam.pool`) and eni (the ENI
    /// inventory as blocks): an external system decides; one pool, `default`.
    External { eni: bool },
}

/// Multi-pool options.
#[derive(Debug, Clone)]
pub struct MultiPoolSettings {
    /// `ipam-default-ip-pool` (after a per-node override).
    pub default_pool: String,
    /// `ipam-default-ip-pool` as the option gives it.
    pub configured_default_pool: String,
    /// `ipam-multi-pool-pre-allocation`, pool → addresses per family.
    pub pre_allocation: BTreeMap<String, u64>,
    /// `only-masquerade-default-pool`.
    pub only_masquerade_default_pool: bool,
}

impl IpamState {
    /// The pool a request without `pool` falls back to.
    pub(super) fn default_pool(&self) -> &str {
        match &self.cfg.pooling {
            PoolingMode::HostScope | PoolingMode::External { .. } => super::DEFAULT_POOL,
            PoolingMode::MultiPool(m) => &m.default_pool,
        }
    }

    pub(super) fn is_multi_pool(&self) -> bool {
        matches!(self.cfg.pooling, PoolingMode::MultiPool(_))
    }

    /// Brings the blocks in line with the node resource (podCIDRs in the host-scope
    /// modes, `pools.allocated` in multi-pool).
    pub(super) fn apply_node_blocks(&mut self) {
        let mut wanted = self.sync.wanted_blocks(&self.cfg.pooling);
        for name in self.pools.names() {
            for family in [Family::V4, Family::V6] {
                wanted
                    .entry((name.clone(), family))
                    .or_insert((Vec::new(), AllocatorOptions::default()));
            }
        }
        for ((pool, family), (cidrs, opts)) in wanted {
            for line in self.pools.sync_pool(&pool, family, &cidrs, opts) {
                tracing::warn!("{line}");
            }
        }
    }

    /// The pool for a request: the one asked for, else the default (host-scope), else
    /// pool selection (multi-pool). Returns the pool and, outside the single-pool
    /// modes, a short code of how it was chosen (`selection_text` explains it).
    pub(super) fn choose_pool(
        &self,
        requested: &str,
        owner: &str,
        family: Family,
    ) -> Result<(String, Option<&'static str>), ApiError> {
        if !requested.is_empty() {
            if !self.is_multi_pool() && requested != super::DEFAULT_POOL {
                return Err(ApiError::new(
                    ErrorKind::Invalid,
                    format!(
                        "pool {requested:?} does not exist: ipam mode {} has only the {:?} pool",
                        self.cfg.ipam_mode,
                        super::DEFAULT_POOL
                    ),
                ));
            }
            return Ok((requested.to_string(), Some("requested")));
        }
        if !self.is_multi_pool() {
            return Ok((super::DEFAULT_POOL.into(), None));
        }
        let default = self.default_pool().to_string();
        let Some(meta) = self.metadata.as_deref() else {
            return Ok((default, Some("no-metadata")));
        };
        let outcome =
            select_pool(owner, family, self.sync.pool_defs(), meta, &default).map_err(|e| {
                let (reason, kind) = match e {
                    SelectionError::NotSynced => {
                        (FailureReason::MetadataNotSynced, ErrorKind::Unavailable)
                    }
                    _ => (FailureReason::PoolSelection, ErrorKind::NoAddress),
                };
                ApiError::because(
                    reason,
                    kind,
                    format!("unable to determine IPAM pool for owner {owner:?}: {e}"),
                )
            })?;
        for w in &outcome.warnings {
            tracing::warn!(owner = ?owner, "{w}");
        }
        Ok((outcome.pool, Some(outcome.step.as_str())))
    }

    /// Multi-pool: recomputes the demand, lets the backend carve blocks, gives back
    /// free blocks above demand, and journals the node resource when it changed.
    pub(super) fn sync_demand(&mut self) {
        let PoolingMode::MultiPool(settings) = &self.cfg.pooling else {
            return;
        };
        let settings = settings.clone();
        self.sync.expire_pending(now_ms());
        let before = self.sync.node().clone();
        let mut names: Vec<String> = self.pools.names();
        names.extend(settings.pre_allocation.keys().cloned());
        names.extend(self.sync.pending_pools().map(str::to_string));
        names.sort();
        names.dedup();
        let mut requested = Vec::new();
        let mut needed_by: BTreeMap<(String, Family), u64> = BTreeMap::new();
        // Sticky pools are asked for by identity (`sticky`), never by count.
        names.retain(|pool| !self.is_sticky_pool(pool));
        for pool in &names {
            let mut demand = PoolDemand::default();
            for family in self.cfg.families.clone() {
                let in_use = self.pools.used(pool, family);
                let pending = self.sync.pending_count(pool, family);
                let needed = match settings.pre_allocation.get(pool) {
                    Some(p) => needed_ip_ceil(in_use + pending, *p),
                    None => in_use + pending,
                };
                needed_by.insert((pool.clone(), family), needed);
                match family {
                    Family::V4 => demand.ipv4_addrs = needed,
                    Family::V6 => demand.ipv6_addrs = needed,
                }
            }
            if demand.ipv4_addrs > 0 || demand.ipv6_addrs > 0 {
                requested.push(RequestedPool {
                    pool: pool.clone(),
                    needed: demand,
                });
            }
        }
        self.sync.request(requested);
        self.apply_node_blocks();
        if self.sync.may_give_back() {
            for ((pool, family), needed) in needed_by {
                for cidr in self.pools.release_free_blocks(&pool, family, needed) {
                    tracing::info!(pool = %pool, cidr = %cidr, "released a free block above demand");
                    self.sync.give_back_block(&pool, cidr);
                }
            }
            let _ = self.give_back_sticky_blocks();
            self.sync.drop_empty_pools();
        }
        if *self.sync.node() != before {
            self.journal_node();
        }
    }

    /// Journals the node resource (a failure is logged: the resource is rebuilt from
    /// the blocks' allocations on the next start).
    pub(super) fn journal_node(&mut self) {
        match self.sync.journal_op() {
            Ok(op) => {
                if let Err(e) = self.commit(&[op]) {
                    tracing::error!(error = %e.message, "could not journal the node resource");
                }
            }
            Err(e) => tracing::error!(error = %e, "could not encode the node resource"),
        }
    }

    /// Whether addresses of `pool` keep their source address (no masquerade).
    pub fn skip_masquerade(&self, pool: &str) -> bool {
        match &self.cfg.pooling {
            PoolingMode::HostScope | PoolingMode::External { .. } => false,
            PoolingMode::MultiPool(m) => {
                (m.only_masquerade_default_pool && pool != m.default_pool)
                    || self
                        .sync
                        .pool_defs()
                        .iter()
                        .any(|p| p.name == pool && p.skip_masquerade)
            }
        }
    }

    /// New pool definitions (the pool directory changed). Refused, with nothing
    /// changed, when the change breaks what the node uses.
    pub fn set_pool_defs(&mut self, defs: Vec<PoolDef>) -> Result<(), NodeError> {
        self.sync.set_pool_defs(defs)?;
        self.sync_demand();
        Ok(())
    }

    /// The pod/namespace metadata used for pool selection.
    pub fn set_metadata(&mut self, meta: Box<dyn MetadataSource + Send>) {
        self.metadata = Some(meta);
    }

    /// Marks the end of restore: from now on free blocks may be given back.
    pub fn finish_restore(&mut self) {
        self.sync.finish_restore();
        self.sync_demand();
    }

    /// crd/eni: the external system changed the node resource (the spec, and in
    /// eni mode the inventory): take the new addresses; ones in use that vanished
    /// stay until their pods go, and are reported.
    ///
    /// Multi-pool: a block this node gave back stays out of its blocks while the
    /// node resource still lists it (the removal is on its way); once a resource
    /// without it arrived, a later listing is a new allocation.
    ///
    /// cluster-pool: the node serves from the CIDRs the operator gives it now.
    pub fn set_external_node(&mut self, node: crate::resources::NodeResource) {
        if self.cfg.depletion.is_some() {
            self.sync.set_pod_cidrs(node.spec.ipam.pod_cidrs.clone());
        }
        self.sync.set_external(node);
        self.apply_node_blocks();
        self.journal_node();
    }

    /// What changed for the node sink since the last call: the used addresses
    /// (`status.ipam.used`), the demand (`spec.ipam.pools.requested`), the node's
    /// addresses and whether the configuration fits the node. None when nothing did.
    pub fn take_outbox(&mut self) -> Option<NodeOutbox> {
        self.judge_cidrs();
        let used = self
            .sync
            .take_used_changed()
            .then(|| self.ledger.used_addresses());
        // Sticky blocks asked for by no one here any more (a waiting pod that
        // left): given back now, not at the next allocation or release.
        if self.sync.may_give_back() && self.give_back_sticky_blocks() {
            self.sync.drop_empty_pools();
            self.journal_node();
        }
        let sticky_requests = self.sticky_requests();
        let out = self
            .sync
            .take_outbox(used, self.is_multi_pool(), sticky_requests);
        let config_fit = self.take_config_fit();
        let address_room = self.take_address_room();
        if config_fit.is_none() && address_room.is_none() {
            return out;
        }
        Some(NodeOutbox {
            config_fit,
            address_room,
            ..out.unwrap_or_default()
        })
    }

    /// Whether a new pod can get an address (the ranges as status reports
    /// them), when that changed since the last call (the first call always: a
    /// previous run's taint may be on the Node).
    fn take_address_room(&mut self) -> Option<AddressRoom> {
        let ranges = self.range_fills();
        let mode = self.cfg.ipam_mode.to_string();
        let node = NodeRanges {
            mode: &mode,
            node_name: &self.cfg.node_name,
            default_pool: if self.is_multi_pool() {
                self.default_pool()
            } else {
                ""
            },
            ranges: &ranges,
        };
        let room = if let Some(why) = exhaustion::exhaustion(&node) {
            AddressRoom::Exhausted(why)
        } else if let Some(why) = exhaustion::exhausted_pools(&node) {
            AddressRoom::PoolsExhausted(why)
        } else {
            AddressRoom::Available
        };
        if self.room_sent.as_ref() == Some(&room) {
            return None;
        }
        self.room_sent = Some(room.clone());
        Some(room)
    }

    /// cluster-pool: the verdict on the node's CIDRs (`status.ipam.pod-cidrs`);
    /// a CIDR released leaves the blocks, and the node resource is journaled
    /// when the verdict changed.
    fn judge_cidrs(&mut self) {
        let Some(rules) = self.cfg.depletion else {
            return;
        };
        let uses: Vec<CidrUse> = self
            .pools
            .blocks()
            .into_iter()
            .filter(|b| b.pool == super::DEFAULT_POOL)
            .map(|b| CidrUse {
                cidr: b.cidr,
                used: b.used,
                usable: b.usable,
            })
            .collect();
        let before = self.sync.node().status.ipam.pod_cidrs.clone();
        if self.sync.judge_cidrs(&rules, &uses, now_ms()) {
            self.apply_node_blocks();
        }
        let after = &self.sync.node().status.ipam.pod_cidrs;
        if *after != before {
            for (cidr, state) in after.iter().filter(|(c, s)| before.get(*c) != Some(*s)) {
                tracing::info!(cidr = %cidr, status = state.status.as_str(), "node CIDR status");
            }
            self.journal_node();
        }
    }

    /// Multi-pool: this node's default pool changed (a CiliumNodeConfig); None goes
    /// back to the option's.
    pub fn set_default_pool(&mut self, pool: Option<String>) {
        let PoolingMode::MultiPool(m) = &mut self.cfg.pooling else {
            return;
        };
        let pool = pool.unwrap_or_else(|| m.configured_default_pool.clone());
        if m.default_pool != pool {
            tracing::info!(from = %m.default_pool, to = %pool, "this node's default pool changed");
            m.default_pool = pool;
            self.sync_demand();
        }
    }

    /// eni: the ENI details of an address for the IPAM response.
    pub(super) fn eni_details(&self, ip: std::net::IpAddr) -> Option<crate::ipam::eni::EniRouting> {
        match self.cfg.pooling {
            PoolingMode::External { eni: true } => {
                crate::ipam::eni::eni_for_ip(&self.sync.node().status.eni.enis, ip)
            }
            _ => None,
        }
    }
}

/// What a pool-selection code (kept per allocation) means, for explain.
pub(super) fn selection_text(code: &str) -> &'static str {
    match code {
        "requested" => "requested by the caller",
        "no-metadata" => "the default pool (no pod metadata source is configured)",
        "pod-annotation" => "the pod's ipam.cilium.io pool annotation (precedence step 1)",
        "namespace-annotation" => {
            "the namespace's ipam.cilium.io pool annotation (precedence step 2)"
        }
        "selector" => "the only CiliumPodIPPool whose selectors match the pod (precedence step 3)",
        "default" => "the default pool: no annotation or pool selector applies (precedence step 4)",
        _ => "unknown",
    }
}
