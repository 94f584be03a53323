//! The daemon's IPAM state of one node, composed of parts that each own their
//! fields (each module says what it owns and keeps true):
//! - `ledger`: the journal and the allocations, endpoints and teardowns it
//!   records (who holds which address, every change journaled first);
//! - `node_sync`: the node resource, pool definitions, the embedded operator,
//!   pending demand and the outbox marks (what the node asks of, and reports to,
//!   the operator and the API server);
//! - `effects`: the timers and stale host links left for the caller;
//! - `fit`: whether the configuration fits the node (its verdict refuses
//!   allocations while it has an error);
//! - the pools of blocks (`ipam::multipool::PoolSet`: one `default` pool holding
//!   the node CIDRs in the host-scope modes) the allocator draws from.
//!
//! `IpamState` composes them and does what spans parts: an allocation picks from
//! the pools, records in the ledger, marks the outbox and queues a timer. Its
//! methods are grouped by request in alloc, pools, restore, views, explain and
//! leaks; callers outside the state call its public methods directly, with no
//! handle between: the REST API and the CNI plugin (`daemon::routes`,
//! `daemon::block_wait`), the node backend's loops, the daemon's upkeep
//! (timers, the journal, teardowns, leak release), the read-only answers
//! (metrics, the cross-node datapath, the policy loop) and start (once, after
//! [`IpamState::restore`]). All methods are synchronous; the server calls them
//! on blocking threads under one mutex, and every change is committed to the
//! journal before the method returns.

mod alloc;
mod allocations;
mod cidr_view;
mod effects;
mod error;
mod explain;
mod fit;
mod leaks;
mod ledger;
mod node_config;
mod node_sync;
mod pools;
mod requested;
mod restore;
mod sticky;
#[cfg(test)]
pub(crate) mod tests;
mod views;

use std::collections::{BTreeMap, VecDeque};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::{DatapathMode, IpamMode};
use super::metrics::Metrics;
use super::node_check::Mismatch;
use crate::datapath::link_marker::JournalMark;
use crate::ipam::Family;
use crate::ipam::cidr_depletion::DepletionRules;
use crate::ipam::failure_reason::FailureReason;
use crate::ipam::multipool::PoolSet;
use crate::ipam::selection::MetadataSource;
use crate::node::NodeResource;
use crate::store::{AllocationState, JournalOp, now_ms};
use allocations::Allocation;
use effects::Effects;
use ledger::{Applied, Ledger};
use node_sync::NodeSync;

pub use alloc::{
    Allocated, AllocatedAddress, AllocationCommit, Collected, EndpointRegistration,
    EndpointRelease, GcScope, WiredAttachment,
};
pub use cidr_view::NodeCidr;
pub use effects::{StaleLink, Timer, TimerKind};
pub use error::{ApiError, ErrorKind};
pub use explain::{ExplainedAddress, Explanation, Failure, PluginReport};
pub use ledger::{
    HOLD_UNTIL_TEARDOWN, HostLinkMarker, JOURNAL_UNAVAILABLE, TEARDOWN_PREFIX, Teardown,
    TeardownLink,
};
pub use node_config::{FamilyAddressing, NodeConfig};
pub use node_sync::NODE_META_KEY;
pub use pools::{MultiPoolSettings, PoolingMode};
pub use restore::{
    JournalOrigin, KernelLink, KernelView, ReconcileReport, RestoreError, RestoreReport,
};
pub use views::{
    AddressBook, AddressHolder, Health, HealthLevel, Hold, NodeStatus, RegisteredEndpoint,
};

/// The pool of the host-scope modes, and multi-pool's default default pool.
pub const DEFAULT_POOL: &str = "default";
/// How many recent failures `explain` remembers.
pub const MAX_FAILURES: usize = 256;

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
    /// `--enable-bandwidth-manager`: the plugin shapes `runtimeConfig.bandwidth`.
    pub bandwidth_manager: bool,
    /// Router addresses given by the operator (`local-router-ipv4/6`), not taken
    /// from IPAM.
    pub fixed_routers: BTreeMap<Family, IpAddr>,
    /// The enabled families, IPv6 first (allocation order).
    pub families: Vec<Family>,
    /// The tunnel's underlay family (`--underlay-protocol`) in tunnel routing;
    /// None in native routing, which has no underlay.
    pub tunnel_underlay: Option<Family>,
    /// cluster-pool on the Kubernetes backend: the findings of the operator's
    /// pool options, mask sizes that do not fit their pool CIDRs and options
    /// that do not parse (the embedded backend refuses them at start).
    pub pool_findings: Vec<Mismatch>,
    pub pooling: PoolingMode,
    /// cluster-pool: when the node asks for another CIDR and gives one back
    /// (`status.ipam.pod-cidrs`).
    pub depletion: Option<DepletionRules>,
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

/// The IPAM state of one node: the ledger, the node sync and the effects
/// composed with the pools of blocks the node draws addresses from.
pub struct IpamState {
    cfg: StateConfig,
    pools: PoolSet,
    routers: BTreeMap<Family, IpAddr>,
    metadata: Option<Box<dyn MetadataSource + Send>>,
    /// Who holds which address, durably.
    ledger: Ledger,
    /// What the node asks of, and reports to, the operator and the API server.
    sync: NodeSync,
    /// Timers to arm and host links to remove, for the caller.
    effects: Effects,
    restore_report: RestoreReport,
    metrics: Arc<Metrics>,
    failures: VecDeque<Failure>,
    /// Whether the configuration fits the node.
    fit: fit::Fit,
    /// The last [`AddressRoom`](crate::node::AddressRoom) put in the outbox.
    room_sent: Option<crate::node::AddressRoom>,
}

impl IpamState {
    /// The timers queued since the last call; the caller arms them.
    pub fn take_timers(&mut self) -> Vec<Timer> {
        self.effects.take_timers()
    }

    /// Whether the outbox should be written soon (another node waits for it)
    /// since the last call; the caller wakes the node sink's writer.
    pub fn take_flush_soon(&mut self) -> bool {
        self.effects.take_flush_soon()
    }

    /// The host links of expired attachments queued since the last call; the
    /// caller removes them.
    pub fn take_stale_links(&mut self) -> Vec<StaleLink> {
        self.effects.take_stale_links()
    }

    /// The node resource as it stands.
    pub fn node(&self) -> &NodeResource {
        self.sync.node()
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
        if self.ledger.journal().failure().is_some() {
            self.recover_journal();
        }
        let started = Instant::now();
        let result = self.ledger.commit(ops);
        self.metrics
            .phase("daemon", "journal-commit", started.elapsed().as_secs_f64());
        result.map_err(|e| {
            tracing::error!(error = %e, "journal commit failed");
            ApiError::because(
                FailureReason::JournalUnavailable,
                ErrorKind::Unavailable,
                self.ledger.unavailable(&e.to_string()),
            )
        })
    }

    /// The journal's identity and last commit (what host links are marked with).
    pub fn journal_mark(&self) -> JournalMark {
        self.ledger.journal_mark()
    }

    /// Brings a failed journal back: reopens it (at most once a second), checks it
    /// against the state in memory (what clients were told) and writes whatever
    /// differs. None when the journal was not failed; else whether it works now.
    pub fn recover_journal(&mut self) -> Option<bool> {
        self.ledger.journal().failure()?;
        let node = self.sync.journal_op().ok();
        self.ledger.recover(node)
    }

    /// Applies committed ops: the ledger's memory, the allocator bits of freed
    /// addresses, release counts and timers; the used addresses are due to the
    /// node sink.
    fn apply(&mut self, ops: Vec<JournalOp>, why: &str) {
        self.sync.mark_used_changed();
        let (pools, effects, metrics) = (&mut self.pools, &mut self.effects, &self.metrics);
        self.ledger.apply(ops, why, |change| match change {
            Applied::Freed(ip) => {
                pools.release(ip);
            }
            Applied::Released(family) => metrics.event("release", family.as_str()),
            Applied::Timer(timer) => effects.arm(timer),
        });
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
        let Some(rec) = self.ledger.allocations().get(&timer.ip).map(|r| r.record()) else {
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
                let Some(decided) = self.ledger.expiry_ops(&rec, host_link, now) else {
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
