//! Addresses a pod asks for by name (`ipam.podnet.io/ip-addresses`,
//! `ipam::address_request`): reading the annotation from the pod metadata, and
//! taking the address it names out of the pod's pool instead of the next free
//! one. The address goes through the same claim, journal commit and restore as
//! any allocation (`alloc`); the state's one lock makes "free?" and "take it"
//! one step, so of two pods asking at once exactly one gets it and the other is
//! told who holds it.
//!
//! Refusals carry an `address-*` reason (the plugin's CNI code 107, an Event on
//! the Pod): the annotation malformed, the address held (by which pod and
//! container), outside the ranges (blocks) this node holds for the pod's pool
//! (named), or in no pool / another pool than the pod's.

use std::net::IpAddr;

use super::{AllocateRequest, ApiError, ErrorKind, HOLD_UNTIL_TEARDOWN, IpamState, PoolingMode};
use crate::ipam::Family;
use crate::ipam::address_request::{ANNOTATION_IP_ADDRESSES, RequestedAddresses};
use crate::ipam::failure_reason::FailureReason;
use crate::ipam::multipool::PoolError;
use crate::store::{AllocationState, JournalOp, now_ms};

/// The code kept (after the pool's, with `+`) in an allocation's `selected_by`
/// when its address is the one the pod's annotation asked for.
pub(super) const ADDRESS_CODE: &str = "ip-addresses";

/// How many of a node's ranges a refusal lists (crd mode's are single IPs).
const RANGES_SHOWN: usize = 8;

/// Where a requested address came from.
pub(super) enum Requested {
    /// Newly taken out of the pool.
    Fresh,
    /// The pod's own already: its attachment added again, or released by the
    /// same pod and cooling down. Its allocator bit was never given back.
    Kept,
}

impl IpamState {
    /// What `owner`'s annotation asks for: None for a pod without it, an owner
    /// that is not `namespace/name`, or no metadata of the pod (no metadata
    /// source, not synced, or the pod not in it: in multi-pool pool selection has
    /// already refused that; in the other modes the pod gets the next free
    /// address, as without podnet's annotation).
    pub(super) fn requested_addresses(
        &self,
        owner: &str,
    ) -> Result<Option<RequestedAddresses>, ApiError> {
        let Some(meta) = self.metadata.as_deref() else {
            return Ok(None);
        };
        let Some((namespace, name)) = owner.split_once('/') else {
            return Ok(None);
        };
        let Some(pod) = meta.pod(namespace, name) else {
            if meta.synced() {
                tracing::debug!(owner, "pod not in the metadata: no address annotation read");
            }
            return Ok(None);
        };
        let refused = |e: crate::ipam::address_request::AddressAnnotationError| {
            ApiError::because(
                FailureReason::AddressAnnotation,
                ErrorKind::Invalid,
                format!("pod {owner}: {e}"),
            )
        };
        let Some(requested) =
            RequestedAddresses::from_annotations(&pod.annotations).map_err(refused)?
        else {
            return Ok(None);
        };
        requested
            .check_families(&self.cfg.families)
            .map_err(refused)?;
        Ok(Some(requested))
    }

    /// Takes `ip`, the address the pod's annotation asks for, out of `pool`. The
    /// pod's own address (its attachment added again: `ops` already releases it;
    /// or cooling after the same pod's DEL) is kept: its ops are dropped and the
    /// caller records it anew.
    pub(super) fn take_requested(
        &mut self,
        pool: &str,
        ip: IpAddr,
        req: &AllocateRequest,
        ops: &mut Vec<JournalOp>,
    ) -> Result<Requested, ApiError> {
        if let Some(held) = self.ledger.allocations().get(&ip) {
            let own_attachment = match (&req.container_id, &req.ifname) {
                (Some(c), Some(i)) => held.is_for(c, Some(i)),
                _ => false,
            };
            let own_cooling = held.state() == AllocationState::Cooling
                && held.cooling_until_ms() != Some(HOLD_UNTIL_TEARDOWN)
                && !req.owner.is_empty()
                && held.owner() == req.owner;
            if (own_attachment || own_cooling) && held.pool() == pool {
                ops.retain(|op| op_ip(op) != Some(ip));
                return Ok(Requested::Kept);
            }
            return Err(self.taken(ip, req));
        }
        let draining = self
            .pools
            .blocks()
            .into_iter()
            .find(|b| b.pool == pool && b.removed && b.cidr.contains(&ip));
        if let Some(block) = draining {
            return Err(ApiError::because(
                FailureReason::AddressOutsideNode,
                ErrorKind::NoAddress,
                format!(
                    "pod {}: {ip} ({ANNOTATION_IP_ADDRESSES}) is in range {} of pool {pool}, which node {} no longer holds (it stays only while addresses in it are in use)",
                    req.owner, block.cidr, self.cfg.node_name
                ),
            ));
        }
        match self.pools.allocate(pool, ip) {
            Ok(()) => Ok(Requested::Fresh),
            Err(PoolError::AlreadyAllocated { .. }) => Err(ApiError::because(
                FailureReason::AddressTaken,
                ErrorKind::Conflict,
                format!(
                    "pod {}: {ip} ({ANNOTATION_IP_ADDRESSES}) is allocated on node {} but recorded for no pod; podnet ipam check says more",
                    req.owner, self.cfg.node_name
                ),
            )),
            Err(_) => Err(self.outside(pool, ip, &req.owner)),
        }
    }

    /// The refusal of an address the ledger holds, naming the holder.
    fn taken(&self, ip: IpAddr, req: &AllocateRequest) -> ApiError {
        let node = &self.cfg.node_name;
        let Some(held) = self.ledger.allocations().get(&ip) else {
            return ApiError::new(ErrorKind::Internal, format!("{ip} vanished"));
        };
        let holder = match held.state() {
            AllocationState::Infra => format!("is node {node}'s own {} address", held.owner()),
            AllocationState::Cooling if held.cooling_until_ms() == Some(HOLD_UNTIL_TEARDOWN) => {
                format!(
                    "was released by {} and its host link is being torn down on node {node}",
                    held.owner()
                )
            }
            AllocationState::Cooling => format!(
                "was released by {} and cools down for {} s more on node {node} before another pod may have it",
                held.owner(),
                held.cooling_until_ms()
                    .unwrap_or(0)
                    .saturating_sub(now_ms())
                    .div_ceil(1000)
            ),
            state => format!(
                "is taken by pod {} (container {}, interface {}, {}) on node {node}",
                held.owner(),
                held.container_id().unwrap_or("unknown"),
                held.ifname().unwrap_or("unknown"),
                if state == AllocationState::Pending {
                    "being added"
                } else {
                    "bound"
                }
            ),
        };
        ApiError::because(
            FailureReason::AddressTaken,
            ErrorKind::Conflict,
            format!(
                "pod {}: {ip} ({ANNOTATION_IP_ADDRESSES}) {holder}",
                req.owner
            ),
        )
    }

    /// The refusal of an address `pool` holds no block of on this node: outside
    /// the node's ranges (named), or in no pool, or in another pool than `pool`.
    fn outside(&self, pool: &str, ip: IpAddr, owner: &str) -> ApiError {
        let family = Family::of_addr(&ip);
        let node = &self.cfg.node_name;
        let edge = self
            .pools
            .blocks()
            .into_iter()
            .find(|b| b.pool == pool && b.cidr.contains(&ip));
        let (reason, why) = match (&self.cfg.pooling, edge) {
            (_, Some(block)) => (
                FailureReason::AddressOutsideNode,
                format!(
                    "is in node {node}'s range {} but not one it hands out (its first or last address)",
                    block.cidr
                ),
            ),
            (PoolingMode::MultiPool(_), None) => self.outside_pools(pool, ip),
            (PoolingMode::HostScope, None) => (
                FailureReason::AddressOutsideNode,
                format!(
                    "is outside node {node}'s {} ranges ({})",
                    family.label(),
                    self.ranges(pool, family)
                ),
            ),
            (PoolingMode::External { .. }, None) => (
                FailureReason::AddressOutsideNode,
                format!(
                    "is not among the {} addresses node {node}'s CiliumNode holds ({}; ipam mode {})",
                    family.label(),
                    self.ranges(pool, family),
                    self.cfg.ipam_mode
                ),
            ),
        };
        ApiError::because(
            reason,
            ErrorKind::NoAddress,
            format!("pod {owner}: {ip} ({ANNOTATION_IP_ADDRESSES}) {why}"),
        )
    }

    /// Multi-pool: which pool `ip` is in, if any, against the pod's `pool`.
    fn outside_pools(&self, pool: &str, ip: IpAddr) -> (FailureReason, String) {
        let family = Family::of_addr(&ip);
        let node = &self.cfg.node_name;
        if let Some((other, block)) = self.pools.locate(ip)
            && other != pool
        {
            return (
                FailureReason::AddressNotInPool,
                format!(
                    "is in pool {other} (block {block} on node {node}), not in the pod's pool {pool}: ask for an address of {pool}, or put the pod in {other} (ipam.cilium.io/ip-pool)"
                ),
            );
        }
        let defs = self.sync.pool_defs();
        let home = defs.iter().find_map(|d| {
            let cidr = d.family(family)?.cidrs.iter().find(|c| c.contains(&ip))?;
            Some((d.name.as_str(), *cidr))
        });
        match home {
            Some((name, cidr)) if name == pool => (
                FailureReason::AddressOutsideNode,
                format!(
                    "is in pool {pool} ({cidr}) but in none of the blocks node {node} holds of it ({}): ask for an address inside them",
                    self.ranges(pool, family)
                ),
            ),
            Some((name, cidr)) => (
                FailureReason::AddressNotInPool,
                format!(
                    "is in pool {name} ({cidr}), not in the pod's pool {pool}: ask for an address of {pool}, or put the pod in {name} (ipam.cilium.io/ip-pool)"
                ),
            ),
            None => {
                let pools: Vec<String> = defs
                    .iter()
                    .filter_map(|d| {
                        let cidrs = &d.family(family)?.cidrs;
                        let cidrs: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
                        Some(format!("{} {}", d.name, cidrs.join(" ")))
                    })
                    .collect();
                (
                    FailureReason::AddressNotInPool,
                    format!(
                        "is not in any {} pool ({})",
                        family.label(),
                        if pools.is_empty() {
                            "none defined".to_string()
                        } else {
                            pools.join("; ")
                        }
                    ),
                )
            }
        }
    }

    /// The ranges (blocks) of `pool` in `family` this node holds, for a message.
    fn ranges(&self, pool: &str, family: Family) -> String {
        let blocks: Vec<String> = self
            .pools
            .blocks()
            .into_iter()
            .filter(|b| b.pool == pool && b.family == family && !b.removed)
            .map(|b| b.cidr.to_string())
            .collect();
        match blocks.len() {
            0 => "none".into(),
            n if n > RANGES_SHOWN => format!(
                "{} and {} more",
                blocks[..RANGES_SHOWN].join(", "),
                n - RANGES_SHOWN
            ),
            _ => blocks.join(", "),
        }
    }
}

/// The `selected_by` code of an address the annotation asked for, after the
/// pool's code if any.
pub(super) fn requested_code(pool_code: Option<&str>) -> String {
    match pool_code {
        Some(code) => format!("{code}+{ADDRESS_CODE}"),
        None => ADDRESS_CODE.to_string(),
    }
}

/// The address an op records or deletes.
fn op_ip(op: &JournalOp) -> Option<IpAddr> {
    match op {
        JournalOp::PutAllocation(rec) => Some(rec.ip),
        JournalOp::DeleteAllocation { ip, .. } => Some(*ip),
        _ => None,
    }
}
