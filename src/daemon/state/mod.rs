//! The daemon's IPAM state: the pools of blocks the node owns (one `default` pool
//! holding the node CIDRs in the host-scope modes), every allocation and endpoint,
//! and the journal that makes them durable. All methods are
//! synchronous; the server calls them on blocking threads under one mutex, and every
//! change is committed to the journal before the method returns. Timers the state
//! wants armed (expiration, end of cooldown) are queued and taken by the caller.

mod alloc;
mod allocations;
mod effects;
mod error;
mod explain;
mod leaks;
mod pools;
mod restore;
#[cfg(test)]
mod tests;
mod views;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::IpNet;

use super::config::{DatapathMode, IpamMode};
use super::devices::DeviceError;
use super::metrics::Metrics;
use crate::api::link_marker::{JournalMark, LinkMarker};
use crate::api::models::{FailureReason, FailureRecord};
use crate::ipam::Family;
use crate::ipam::multipool::PoolSet;
use crate::ipam::pooldef::PoolDef;
use crate::ipam::selection::MetadataSource;
use crate::node::{NodeOperator, NodeResource, RequestedPool};
use crate::store::{
    AllocationRecord, AllocationState, EndpointRecord, Journal, JournalOp, StoreError, now_ms,
};
use allocations::{Allocation, Allocations};
use effects::Effects;

pub use effects::{StaleLink, Timer, TimerKind};
pub use error::{ApiError, ErrorKind};
pub use pools::{MultiPoolSettings, PoolingMode};
pub use restore::{
    JournalOrigin, KernelLink, KernelView, ReconcileReport, RestoreError, RestoreReport,
};

/// The pool of the host-scope modes, and multi-pool's default default pool.
pub const DEFAULT_POOL: &str = "default";
/// Cooling "until" of an address held while its links are torn down.
pub const HOLD_UNTIL_TEARDOWN: u64 = u64::MAX;
/// Journal meta key prefix of pending link teardowns.
pub const TEARDOWN_PREFIX: &str = "teardown/";

/// A DEL's host links the daemon deletes before it releases the addresses.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Teardown {
    pub key: String,
    pub links: Vec<crate::api::models::LinkRef>,
    pub ips: Vec<IpAddr>,
}

/// `rec` held: cooling with no end, until its teardown finishes.
pub(super) fn held(rec: &AllocationRecord) -> AllocationRecord {
    cooling(rec, HOLD_UNTIL_TEARDOWN)
}

/// `rec` released into the cooling state until `until_ms`: the attachment's
/// fields are cleared, owner and pool stay for `status` and `explain`.
fn cooling(rec: &AllocationRecord, until_ms: u64) -> AllocationRecord {
    AllocationRecord {
        state: AllocationState::Cooling,
        container_id: None,
        ifname: None,
        network: None,
        expiration_uuid: None,
        expires_at_ms: None,
        host_ifname: None,
        cooling_until_ms: Some(until_ms),
        ..rec.clone()
    }
}

/// The first words of the error a client gets while the journal cannot commit.
pub const JOURNAL_UNAVAILABLE: &str = "cannot record the change durably";
/// How many recent failures `explain` remembers.
pub const MAX_FAILURES: usize = 256;
/// Journal key of the node resource.
pub const NODE_META_KEY: &str = "ciliumnode";

/// Reads the podnet marker of a host link by name (none: no link, or no marker;
/// an error: the kernel could not be asked).
pub type HostLinkMarker<'a> = dyn Fn(&str) -> Result<Option<LinkMarker>, DeviceError> + 'a;

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
    addresses: Option<Vec<crate::node::NodeAddress>>,
    health: Option<crate::node::HealthAddresses>,
}

/// Static facts the state needs.
#[derive(Debug, Clone)]
pub struct StateConfig {
    pub node_name: String,
    pub ipam_mode: IpamMode,
    pub expiration: Duration,
    pub cooldown: Duration,
    pub mtu: u32,
    pub reserve_health: bool,
    pub reserve_ingress: bool,
    /// The pod device type in use (never `Auto`) and as configured.
    pub datapath_mode: DatapathMode,
    pub configured_datapath_mode: DatapathMode,
    /// Router addresses given by the operator (`local-router-ipv4/6`), not taken
    /// from IPAM.
    pub fixed_routers: BTreeMap<Family, IpAddr>,
    /// The enabled families, IPv6 first (allocation order).
    pub families: Vec<Family>,
    pub pooling: PoolingMode,
}

/// A request for the next address(es).
#[derive(Debug, Clone, Default)]
pub struct AllocateRequest {
    pub family: Option<Family>,
    pub owner: String,
    pub pool: String,
    pub expiration: bool,
    pub container_id: Option<String>,
    pub ifname: Option<String>,
    pub network: Option<String>,
    /// The pod's netns: with `expiration` and the attachment, the endpoint is
    /// journaled (pending) in the allocation's commit.
    pub netns: Option<String>,
    /// The pod's UID (`K8S_POD_UID`), recorded for the leak check.
    pub pod_uid: Option<String>,
}

/// The IPAM state of one node.
pub struct IpamState {
    cfg: StateConfig,
    pools: PoolSet,
    routers: BTreeMap<Family, IpAddr>,
    /// The operator's part, where this node plays it (the embedded backend).
    operator: Option<Box<dyn NodeOperator>>,
    pool_defs: Vec<PoolDef>,
    metadata: Option<Box<dyn MetadataSource + Send>>,
    /// Owners whose allocation failed recently, per pool and family (demand).
    pending: BTreeMap<(String, Family), BTreeMap<String, u64>>,
    /// Free blocks are given back only once restore has finished.
    restore_finished: bool,
    /// DELs whose links are being torn down, by journal key.
    teardowns: BTreeMap<String, Teardown>,
    /// What the node sink last got, and whether the used addresses changed since.
    outbox: OutboxMarks,
    allocations: Allocations,
    endpoints: BTreeMap<String, EndpointRecord>,
    restored_endpoints: BTreeSet<String>,
    journal: Journal,
    node: NodeResource,
    /// Timers to arm and host links to remove, for the caller.
    effects: Effects,
    restore_report: RestoreReport,
    metrics: Arc<Metrics>,
    failures: VecDeque<FailureRecord>,
}

impl IpamState {
    /// The timers queued since the last call; the caller arms them.
    pub fn take_timers(&mut self) -> Vec<Timer> {
        self.effects.take_timers()
    }

    /// The host links of expired attachments queued since the last call; the
    /// caller removes them.
    pub fn take_stale_links(&mut self) -> Vec<StaleLink> {
        self.effects.take_stale_links()
    }

    /// The node resource as it stands.
    pub fn node(&self) -> &NodeResource {
        &self.node
    }

    /// The router address of each enabled family.
    pub fn router_ips(&self) -> Vec<IpAddr> {
        self.routers.values().copied().collect()
    }

    /// Commits `ops` to the journal. While the journal is failed (a full disk),
    /// it is first reopened if possible; otherwise the change is refused as
    /// `Unavailable` (503), which clients treat as "try again later" (a DEL goes to
    /// the on-disk queue).
    fn commit(&mut self, ops: &[JournalOp]) -> Result<(), ApiError> {
        if self.journal.failure().is_some() {
            self.recover_journal();
        }
        let started = Instant::now();
        let result = self.journal.commit(ops);
        self.metrics
            .phase("daemon", "journal-commit", started.elapsed().as_secs_f64());
        result.map_err(|e| {
            tracing::error!(error = %e, "journal commit failed");
            ApiError::because(
                FailureReason::JournalUnavailable,
                ErrorKind::Unavailable,
                self.journal_unavailable(&e.to_string()),
            )
        })
    }

    /// The journal's identity and last commit (what host links are marked with).
    pub fn journal_mark(&self) -> JournalMark {
        JournalMark {
            journal_id: self.journal.id().to_string(),
            seq: self.journal.seq(),
        }
    }

    /// What a client is told while the journal cannot commit.
    fn journal_unavailable(&self, detail: &str) -> String {
        let dir = self
            .journal
            .path()
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let hint = if self.journal.failure().is_some_and(|f| f.no_space) {
            format!("the filesystem of the state directory {dir} is full: free space there")
        } else {
            format!("check the state directory {dir} and the kernel log for I/O errors")
        };
        format!(
            "{JOURNAL_UNAVAILABLE}: {detail}; {hint} (the daemon reopens the journal by itself once it can write)"
        )
    }

    /// Brings a failed journal back: reopens it (at most once a second), checks it
    /// against the state in memory (what clients were told) and writes whatever
    /// differs. None when the journal was not failed; else whether it works now.
    pub fn recover_journal(&mut self) -> Option<bool> {
        self.journal.failure()?;
        let fixes = match self.journal.reopen()? {
            Ok(snapshot) => self.journal_fixes(&self.journal, snapshot),
            Err(e) => Err(e),
        };
        let fixes = match fixes {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "journal still unavailable");
                return Some(false);
            }
        };
        let n = fixes.len();
        match self.journal.commit(&fixes) {
            Ok(()) => {
                tracing::warn!(
                    rewritten = n,
                    journal = %self.journal.path().display(),
                    "journal reopened after a failure and checked against the state in memory"
                );
                Some(true)
            }
            Err(e) => {
                tracing::warn!(error = %e, "journal reopened, but it still cannot commit");
                Some(false)
            }
        }
    }

    /// The ops that make `journal` (its allocations, and the rest in `snapshot`)
    /// hold exactly what memory holds.
    fn journal_fixes(
        &self,
        journal: &Journal,
        snapshot: crate::store::Snapshot,
    ) -> Result<Vec<JournalOp>, StoreError> {
        let mut ops = Vec::new();
        let mut seen = BTreeSet::new();
        journal.for_each_allocation(|rec| {
            match self.allocations.get(&rec.ip) {
                Some(mem) if mem.pool() == rec.pool => {
                    let mem = mem.record();
                    if mem != rec {
                        ops.push(JournalOp::PutAllocation(mem));
                    }
                }
                _ => ops.push(JournalOp::DeleteAllocation {
                    pool: rec.pool.clone(),
                    ip: rec.ip,
                }),
            }
            seen.insert(rec.key());
            Ok(())
        })?;
        ops.extend(
            self.allocations
                .iter()
                .filter(|r| !seen.contains(&crate::store::allocation_key(r.pool(), &r.ip)))
                .map(|r| JournalOp::PutAllocation(r.record())),
        );
        let mut seen = BTreeSet::new();
        for ep in snapshot.endpoints {
            match self.endpoints.get(&ep.key()) {
                Some(mem) if *mem == ep => {}
                Some(mem) => ops.push(JournalOp::PutEndpoint(mem.clone())),
                None => ops.push(JournalOp::DeleteEndpoint {
                    container_id: ep.container_id.clone(),
                    ifname: ep.ifname.clone(),
                }),
            }
            seen.insert(ep.key());
        }
        ops.extend(
            self.endpoints
                .iter()
                .filter(|(k, _)| !seen.contains(*k))
                .map(|(_, e)| JournalOp::PutEndpoint(e.clone())),
        );
        for (key, _) in &snapshot.meta {
            if key.starts_with(TEARDOWN_PREFIX) && !self.teardowns.contains_key(key) {
                ops.push(JournalOp::DeleteMeta { key: key.clone() });
            }
        }
        for (key, td) in &self.teardowns {
            if let Ok(value) = serde_json::to_value(td) {
                ops.push(JournalOp::PutMeta {
                    key: key.clone(),
                    value,
                });
            }
        }
        if let Ok(value) = serde_json::to_value(&self.node) {
            ops.push(JournalOp::PutMeta {
                key: NODE_META_KEY.into(),
                value,
            });
        }
        Ok(ops)
    }

    /// The journal op that releases `rec`: straight back to the pool without a
    /// cooldown, else into the cooling state.
    fn release_op(&self, rec: &AllocationRecord, now: u64) -> JournalOp {
        if self.cfg.cooldown.is_zero() {
            JournalOp::DeleteAllocation {
                pool: rec.pool.clone(),
                ip: rec.ip,
            }
        } else {
            JournalOp::PutAllocation(cooling(rec, now + self.cfg.cooldown.as_millis() as u64))
        }
    }

    /// Applies committed ops to memory (allocator bits, maps, timers), and marks
    /// the used addresses changed for the node sink.
    fn apply(&mut self, ops: Vec<JournalOp>, why: &str) {
        self.outbox.used_changed = true;
        for op in ops {
            match op {
                JournalOp::DeleteAllocation { ip, .. } => {
                    if let Some(rec) = self.allocations.remove(&ip)
                        && rec.state != AllocationState::Cooling
                    {
                        tracing::info!(ip = %ip, owner = ?rec.owner, reason = why, "released");
                        self.metrics.event("release", rec.family.as_str());
                    }
                    self.pools.release(ip);
                }
                JournalOp::PutAllocation(rec) => {
                    // A held address that starts its cooldown was already counted.
                    let was_cooling = self
                        .allocations
                        .get(&rec.ip)
                        .is_some_and(|r| r.state() == AllocationState::Cooling);
                    match (
                        &rec.state,
                        rec.cooling_until_ms,
                        &rec.expiration_uuid,
                        rec.expires_at_ms,
                    ) {
                        (AllocationState::Cooling, Some(HOLD_UNTIL_TEARDOWN), _, _) => {
                            tracing::info!(ip = %rec.ip, owner = ?rec.owner, reason = why, "released (held until its links are gone)");
                            self.metrics.event("release", rec.family.as_str());
                        }
                        (AllocationState::Cooling, Some(until), _, _) => {
                            if !was_cooling {
                                tracing::info!(ip = %rec.ip, owner = ?rec.owner, reason = why, "released (cooling down)");
                                self.metrics.event("release", rec.family.as_str());
                            }
                            self.effects.arm(Timer {
                                ip: rec.ip,
                                deadline_ms: until,
                                kind: TimerKind::Cooldown,
                            });
                        }
                        (AllocationState::Pending, _, Some(uuid), Some(deadline)) => {
                            self.effects.arm(Timer {
                                ip: rec.ip,
                                deadline_ms: deadline,
                                kind: TimerKind::Expire { uuid: uuid.clone() },
                            });
                        }
                        _ => {}
                    }
                    self.allocations.insert(rec);
                }
                JournalOp::PutEndpoint(ep) => {
                    self.endpoints.insert(ep.key(), ep);
                }
                JournalOp::DeleteEndpoint {
                    container_id,
                    ifname,
                } => {
                    let key = EndpointRecord::key_of(&container_id, &ifname);
                    self.endpoints.remove(&key);
                    self.restored_endpoints.remove(&key);
                }
                JournalOp::PutMeta { key, value } => {
                    if key.starts_with(TEARDOWN_PREFIX)
                        && let Ok(td) = serde_json::from_value::<Teardown>(value)
                    {
                        self.teardowns.insert(key, td);
                    }
                }
                JournalOp::DeleteMeta { key } => {
                    self.teardowns.remove(&key);
                }
            }
        }
    }

    /// Commits `ops`, applies them, and brings the pools' demand up to date.
    fn commit_apply(&mut self, ops: Vec<JournalOp>, why: &str) -> Result<(), ApiError> {
        if ops.is_empty() {
            return Ok(());
        }
        self.commit(&ops)?;
        self.apply(ops, why);
        self.sync_demand();
        Ok(())
    }

    /// The host link of an expired allocation's attachment, unless something else
    /// of that attachment still lives (another address, or its endpoint).
    fn expired_attachment_link(&self, rec: &AllocationRecord) -> Option<StaleLink> {
        let (cid, ifname) = (rec.container_id.as_deref()?, rec.ifname.as_deref()?);
        let others = self
            .allocations
            .iter()
            .any(|r| r.ip != rec.ip && r.is_for(cid, Some(ifname)));
        if others
            || self
                .endpoints
                .contains_key(&EndpointRecord::key_of(cid, ifname))
        {
            return None;
        }
        Some(StaleLink {
            name: crate::datapath::host_ifname(cid, ifname),
            made_by: self.journal_mark(),
        })
    }

    /// The endpoint journaled with a pending allocation (`pending_endpoint`): the
    /// attachment's endpoint while it lists `rec` and every address it lists is
    /// still pending (a registered endpoint bound its addresses).
    fn pending_endpoint_of(&self, rec: &AllocationRecord) -> Option<&EndpointRecord> {
        let (cid, ifname) = (rec.container_id.as_deref()?, rec.ifname.as_deref()?);
        let ep = self.endpoints.get(&EndpointRecord::key_of(cid, ifname))?;
        let listed = [ep.ipv4, ep.ipv6];
        let all_pending = listed.iter().flatten().all(|ip| {
            self.allocations
                .get(ip)
                .is_some_and(|r| r.state() == AllocationState::Pending)
        });
        (!ep.external_ipam && listed.contains(&Some(rec.ip)) && all_pending).then_some(ep)
    }

    /// Whether a host link's marker shows the ADD of `ep` finished: made under
    /// this journal, for this attachment, and marked wired by the plugin's last
    /// netlink change.
    fn wired_for(&self, marker: &LinkMarker, ep: &EndpointRecord) -> bool {
        marker.wired
            && marker.journal.journal_id == self.journal.id()
            && marker
                .container_id
                .as_deref()
                .is_none_or(|c| c == ep.container_id)
            && marker.ifname.as_deref().is_none_or(|i| i == ep.ifname)
    }

    /// The ops that bind the attachment's pending addresses (all of them, or
    /// those with one of `uuids`).
    fn bind_ops(&self, cid: &str, ifname: &str, uuids: Option<&[String]>) -> Vec<JournalOp> {
        self.allocations
            .of_link(&crate::datapath::host_ifname(cid, ifname))
            .filter(|r| r.state() == AllocationState::Pending && r.is_for(cid, Some(ifname)))
            .filter(|r| {
                uuids.is_none_or(|u| {
                    r.expiration_uuid()
                        .is_some_and(|id| u.iter().any(|x| x == id))
                })
            })
            .map(|r| {
                JournalOp::PutAllocation(AllocationRecord {
                    state: AllocationState::Bound,
                    expiration_uuid: None,
                    expires_at_ms: None,
                    ..r.record()
                })
            })
            .collect()
    }

    /// The journal ops of an expiring address, and the host link to remove once
    /// they are committed. An address with a pending endpoint is its whole
    /// attachment: bound if the host link says the ADD finished (`host_link`
    /// reads a link's marker), else released with the endpoint and the link.
    /// None when the link could not be read (the caller tries again later).
    fn expiry_ops(
        &self,
        rec: &AllocationRecord,
        host_link: &HostLinkMarker<'_>,
        now: u64,
    ) -> Option<(Vec<JournalOp>, Option<StaleLink>)> {
        let Some(ep) = self.pending_endpoint_of(rec) else {
            tracing::warn!(ip = %rec.ip, owner = ?rec.owner, "Released IP after expiration");
            // Decided before the release (the attachment's other addresses are
            // still live then).
            return Some((
                vec![self.release_op(rec, now)],
                self.expired_attachment_link(rec),
            ));
        };
        let marker = match host_link(&ep.host_ifname) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(ip = %rec.ip, error = %e, "cannot tell whether the expiring attachment was wired: keeping the address and asking again in a second");
                return None;
            }
        };
        if marker.is_some_and(|m| self.wired_for(&m, ep)) {
            tracing::info!(ip = %rec.ip, owner = ?rec.owner, link = %ep.host_ifname, "pending address expired, but its host link is marked wired (the ADD finished): bound");
            return Some((self.bind_ops(&ep.container_id, &ep.ifname, None), None));
        }
        tracing::warn!(ip = %rec.ip, owner = ?rec.owner, link = %ep.host_ifname, "Released IP after expiration (its host link is not marked wired: the ADD never finished)");
        let mut ops = Vec::new();
        self.release_attachment(&ep.container_id, Some(&ep.ifname), &mut ops, now);
        let stale = StaleLink {
            name: ep.host_ifname.clone(),
            made_by: self.journal_mark(),
        };
        Some((ops, Some(stale)))
    }

    /// Queues `timer` again in a second.
    fn retry_later(&mut self, timer: &Timer) {
        self.effects.arm(Timer {
            deadline_ms: now_ms() + 1000,
            ..timer.clone()
        });
    }

    /// Fires a timer. Expiration releases (or, for a wired attachment, binds) the
    /// address if it is still pending with the same UUID (`expiry_ops`); the end
    /// of a cooldown gives the address back to the pool. Returns true if it
    /// changed something.
    pub fn fire(&mut self, timer: &Timer, host_link: &HostLinkMarker<'_>) -> bool {
        let Some(rec) = self.allocations.get(&timer.ip).map(|r| r.record()) else {
            return false;
        };
        let now = now_ms();
        let (ops, stale_link) = match &timer.kind {
            TimerKind::Expire { uuid } => {
                if rec.state != AllocationState::Pending
                    || rec.expiration_uuid.as_deref() != Some(uuid)
                {
                    return false;
                }
                let Some(decided) = self.expiry_ops(&rec, host_link, now) else {
                    self.retry_later(timer);
                    return false;
                };
                decided
            }
            TimerKind::Cooldown => {
                if rec.state != AllocationState::Cooling
                    || rec.cooling_until_ms.is_some_and(|t| t > now)
                {
                    return false;
                }
                let op = JournalOp::DeleteAllocation {
                    pool: rec.pool.clone(),
                    ip: rec.ip,
                };
                (vec![op], None)
            }
        };
        match self.commit_apply(ops, "timer") {
            Ok(()) => {
                if let Some(link) = stale_link {
                    self.effects.remove_link(link);
                }
                true
            }
            Err(e) => {
                // Try again later (the journal may be failed for a while).
                tracing::error!(ip = %rec.ip, error = %e.message, "could not journal a timer's change; keeping the address and trying again in a second");
                self.retry_later(timer);
                false
            }
        }
    }
}
