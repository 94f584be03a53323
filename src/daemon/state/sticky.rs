//! The agent's side of sticky addresses (`ipam::sticky`): a pod whose
//! annotation [`POD_STICKY_POOL`] names a sticky pool gets the address its
//! identity (`<namespace>/<name>`) owns, wherever it runs.
//!
//! - The ADD asks: the identity goes into this node's requests (the CiliumNode
//!   annotation `ipam.podnet.io/sticky-requests`), and the ADD waits
//!   ([`FailureReason::StickyWaiting`], like a wait for blocks) until the
//!   operator's answer says `assigned` and the address's block is among the
//!   node's. A `moving` answer (the address is still on the node the pod left)
//!   waits the same way; after the wait the plugin answers CNI 11 and the
//!   runtime retries. A `refused` answer fails with the operator's words
//!   ([`FailureReason::StickyRefused`], CNI 107, an Event on the Pod).
//! - The requests are the identities with an address of a sticky pool here, and
//!   those whose ADD waits (until their pod is gone from this node, or for the
//!   pending demand's TTL).
//! - A sticky address skips the release cooldown (`ledger`): only its identity
//!   can have it again. Its block, no longer in use nor asked for, is given back
//!   at once (`pools::sync_demand`), so the identity's next node gets it.
//! - Only a StatefulSet's pod (its controlling owner reference an `apps`
//!   StatefulSet, its name `<statefulset>-<ordinal>`) may name a sticky pool:
//!   any other is refused ([`FailureReason::StickyRefused`], CNI 107, an Event
//!   on the Pod naming the annotation), as its name would hold an address for
//!   ever (the operator releases records by the StatefulSet's PVC retention
//!   policy, `operator::multi_pool::sticky_lifecycle`).
//! - A pod that does not name a sticky pool never gets a sticky pool's address.
//!
//! Invariant: an address of a sticky pool is taken only for the identity the
//! operator assigned it to, and only from a block this node holds.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::ledger::STICKY_CODE;
use super::requested::Requested;
use super::{AllocateRequest, ApiError, ErrorKind, IpamState};
use crate::ipam::Family;
use crate::ipam::address_request::ANNOTATION_IP_ADDRESSES;
use crate::ipam::failure_reason::FailureReason;
use crate::ipam::selection::PodMeta;
use crate::ipam::sticky::{
    POD_STICKY_POOL, STICKY_REQUESTS, STICKY_STATUS, State, parse_status, statefulset_ordinal,
};
use crate::store::now_ms;

/// The sticky pool a pod names, and the pool's one family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct StickyPool {
    pub(super) name: String,
    pub(super) family: Family,
}

/// Whether `pod` is a StatefulSet's: its controller is an `apps` StatefulSet
/// and its name that StatefulSet's name and an ordinal; or why not.
fn statefulset_pod(pod: &PodMeta) -> Result<(), String> {
    let remove = "remove the annotation from the pod (template)";
    let Some(controller) = &pod.controller else {
        return Err(format!(
            "only a StatefulSet's pods have sticky addresses, and this pod has no controller \
             (no ownerReferences entry with controller: true); {remove}"
        ));
    };
    let is_statefulset =
        controller.kind == "StatefulSet" && controller.api_version.starts_with("apps/");
    if !is_statefulset {
        return Err(format!(
            "only a StatefulSet's pods have sticky addresses, and this pod's controller is {} {} \
             ({}): an address for every pod name would be held forever; {remove}",
            controller.kind, controller.name, controller.api_version
        ));
    }
    match statefulset_ordinal(&pod.name) {
        Some((set, _)) if set == controller.name => Ok(()),
        _ => Err(format!(
            "the pod's name is not <statefulset>-<ordinal> of its StatefulSet {}",
            controller.name
        )),
    }
}

impl IpamState {
    /// The sticky pool `owner`'s annotation names: None for a pod without it (or
    /// no metadata of the pod); refused when this node cannot serve it, the pod
    /// is not a StatefulSet's or the pool is not a sticky pool, naming the field.
    pub(super) fn sticky_pool_of(&self, owner: &str) -> Result<Option<StickyPool>, ApiError> {
        let Some(meta) = self.metadata.as_deref() else {
            return Ok(None);
        };
        let Some((namespace, name)) = owner.split_once('/') else {
            return Ok(None);
        };
        let Some(pod) = meta.pod(namespace, name) else {
            return Ok(None);
        };
        let Some(pool) = pod.annotations.get(POD_STICKY_POOL) else {
            return Ok(None);
        };
        let refused = |why: String| {
            ApiError::because(
                FailureReason::StickyRefused,
                ErrorKind::Invalid,
                format!("pod {owner}: annotation {POD_STICKY_POOL}={pool:?}: {why}"),
            )
        };
        if !self.is_multi_pool() || self.sync.has_operator() {
            return Err(refused(format!(
                "sticky addresses need ipam mode multi-pool with podnet operator (this node runs ipam mode {} with {})",
                self.cfg.ipam_mode,
                if self.sync.has_operator() {
                    "the embedded operator"
                } else {
                    "no pools"
                }
            )));
        }
        if pod.annotations.contains_key(ANNOTATION_IP_ADDRESSES) {
            return Err(refused(format!(
                "the pod also has {ANNOTATION_IP_ADDRESSES}: a pod asks for its addresses by one of them, not both"
            )));
        }
        let Some(def) = self.sync.pool_defs().iter().find(|d| d.name == *pool) else {
            return Err(refused(
                "no CiliumPodIPPool of that name (kubectl get ciliumpodippools)".into(),
            ));
        };
        if !def.sticky {
            return Err(refused(format!(
                "pool {pool} is not sticky: annotate it {}: \"true\"",
                crate::ipam::sticky::STICKY_POOL
            )));
        }
        let family = match (&def.ipv4, &def.ipv6) {
            (Some(_), None) => Family::V4,
            (None, Some(_)) => Family::V6,
            _ => {
                return Err(refused(format!(
                    "sticky pool {pool} has both spec.ipv4 and spec.ipv6: a sticky pool has one family"
                )));
            }
        };
        if !self.cfg.families.contains(&family) {
            return Err(refused(format!(
                "sticky pool {pool} is {}, which this node does not run (enable-{})",
                family.label(),
                family.label().to_lowercase()
            )));
        }
        if let Err(why) = statefulset_pod(&pod) {
            return Err(refused(why));
        }
        Ok(Some(StickyPool {
            name: pool.clone(),
            family,
        }))
    }

    /// A pool selected for a pod that does not name it: a sticky pool is refused.
    pub(super) fn refuse_sticky_pool(&self, pool: &str, owner: &str) -> Result<(), ApiError> {
        let sticky = self
            .sync
            .pool_defs()
            .iter()
            .any(|d| d.name == pool && d.sticky);
        if !sticky {
            return Ok(());
        }
        Err(ApiError::because(
            FailureReason::StickyRefused,
            ErrorKind::Invalid,
            format!(
                "pod {owner}: pool {pool} is sticky: its addresses go only to pods whose annotation {POD_STICKY_POOL} names it (set it in the StatefulSet's pod template), not through ipam.cilium.io/ip-pool or a pool selector"
            ),
        ))
    }

    /// Takes the address the operator assigned to `req.owner` in `pool`, once its
    /// block is on this node; until then the identity is asked for and the
    /// refusal says what it waits for.
    pub(super) fn take_sticky(
        &mut self,
        pool: &StickyPool,
        req: &AllocateRequest,
        ops: &mut Vec<crate::store::JournalOp>,
    ) -> Result<(IpAddr, Requested), ApiError> {
        let identity = req.owner.as_str();
        let node = self.cfg.node_name.clone();
        self.sync
            .note_sticky_waiting(identity, &pool.name, now_ms());
        let waiting = |why: String| {
            ApiError::because(
                FailureReason::StickyWaiting,
                ErrorKind::Unavailable,
                format!(
                    "pod {identity}: sticky address of pool {}: {why}",
                    pool.name
                ),
            )
        };
        let answers = parse_status(&self.sync.node().metadata.annotations)
            .map_err(|e| waiting(format!("CiliumNode {node}: {e}")))?;
        let Some(answer) = answers.get(identity).filter(|a| a.pool == pool.name) else {
            return Err(waiting(format!(
                "asked the operator (CiliumNode {node} annotation {STICKY_REQUESTS}); no answer in {STICKY_STATUS} yet"
            )));
        };
        let said = answer.message.clone().unwrap_or_default();
        let address = match (answer.state, answer.address) {
            (State::Refused, _) => {
                return Err(ApiError::because(
                    FailureReason::StickyRefused,
                    ErrorKind::Invalid,
                    format!(
                        "pod {identity}: the operator refused its sticky address of pool {}: {said}",
                        pool.name
                    ),
                ));
            }
            (State::Moving, _) => {
                return Err(waiting(format!(
                    "the address is still on another node ({said}); it comes here once that node's agent gives it back, after its pod there is gone"
                )));
            }
            (State::Assigned, None) => {
                return Err(waiting(format!(
                    "the operator's answer in {STICKY_STATUS} names no address"
                )));
            }
            (State::Assigned, Some(a)) => a,
        };
        let on_node = self
            .pools
            .blocks()
            .into_iter()
            .any(|b| b.pool == pool.name && !b.removed && b.cidr.contains(&address));
        if !on_node {
            return Err(waiting(format!(
                "{address} is assigned to this node; its block is not among node {node}'s yet"
            )));
        }
        let how = self.take_requested(&pool.name, address, req, ops)?;
        self.sync.clear_sticky_waiting(identity);
        Ok((address, how))
    }

    /// The sticky addresses this node asks for (identity -> pool): the
    /// identities with a sticky address here, and those whose ADD waits and
    /// whose pod is still on this node (or not known yet).
    pub(super) fn sticky_requests(&mut self) -> BTreeMap<String, String> {
        let mut requests: BTreeMap<String, String> = self
            .ledger
            .allocations()
            .iter()
            .filter(|a| a.selected_by() == Some(STICKY_CODE))
            .map(|a| (a.owner().to_string(), a.pool().to_string()))
            .collect();
        let gone: Vec<String> = match self.metadata.as_deref().filter(|m| m.synced()) {
            Some(meta) => self
                .sync
                .sticky_waiting(now_ms())
                .filter(|(identity, _)| {
                    identity
                        .split_once('/')
                        .is_none_or(|(ns, name)| meta.pod(ns, name).is_none())
                })
                .map(|(identity, _)| identity.to_string())
                .collect(),
            None => Vec::new(),
        };
        for identity in gone {
            self.sync.clear_sticky_waiting(&identity);
        }
        for (identity, pool) in self.sync.sticky_waiting(now_ms()) {
            requests
                .entry(identity.to_string())
                .or_insert_with(|| pool.to_string());
        }
        requests
    }

    /// The addresses of `pool` the operator assigned to identities this node
    /// asks for: their blocks stay while no pod uses them.
    pub(super) fn sticky_kept(
        &self,
        pool: &str,
        requests: &BTreeMap<String, String>,
    ) -> BTreeSet<IpAddr> {
        let Ok(answers) = parse_status(&self.sync.node().metadata.annotations) else {
            return BTreeSet::new();
        };
        answers
            .iter()
            .filter(|(identity, a)| {
                a.pool == pool
                    && a.state == State::Assigned
                    && requests.get(*identity).is_some_and(|p| p == pool)
            })
            .filter_map(|(_, a)| a.address)
            .collect()
    }

    /// Gives back the blocks of sticky pools that no pod here uses and no
    /// identity this node asks for owns (its pod left, or was never here).
    /// Run with the demand and before each outbox: a waiting pod that left
    /// stops being asked for at the next outbox, and its block goes with it.
    /// Whether one was given back.
    pub(super) fn give_back_sticky_blocks(&mut self) -> bool {
        let sticky: Vec<String> = self
            .pools
            .names()
            .into_iter()
            .filter(|p| self.is_sticky_pool(p))
            .collect();
        if sticky.is_empty() {
            return false;
        }
        let requests = self.sticky_requests();
        let mut gave = false;
        for pool in sticky {
            let keep = self.sticky_kept(&pool, &requests);
            for family in [Family::V4, Family::V6] {
                for cidr in self.pools.release_blocks_not_kept(&pool, family, &keep) {
                    tracing::info!(pool = %pool, cidr = %cidr, "gave back a sticky address no pod here uses or asks for");
                    self.sync.give_back_block(&pool, cidr);
                    gave = true;
                }
            }
        }
        if gave {
            // The identity's next node waits for it.
            self.effects.flush_soon();
        }
        gave
    }

    /// Whether `pool` is a sticky pool.
    pub(super) fn is_sticky_pool(&self, pool: &str) -> bool {
        self.sync
            .pool_defs()
            .iter()
            .any(|d| d.name == pool && d.sticky)
    }
}
