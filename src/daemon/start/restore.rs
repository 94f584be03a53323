//! The restore phases: the pods' and the node device's MTUs ([`mtus`]), the state
//! restored from the journal on the node resource and the backend's pools
//! ([`restore_state`], with its [`StateConfig`] and pooling mode), the DELs queued
//! while the daemon was down replayed ([`replay_delete_queue`]), and the state and
//! the kernel brought together ([`reconcile_with_kernel`]). The kernel is reached
//! through [`Kernel`] (and the default route's MTU through a function given), so
//! each phase is tested with a fake.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use super::StartError;
use super::check::Checked;
use super::journal::OpenedJournal;
use super::node::Backend;
use crate::api::delete_queue::{DeleteQueue, QueueLock};
use crate::daemon::config::{DaemonConfig, IpamMode};
use crate::daemon::crossnode::settings::RoutingMode;
use crate::daemon::device_error::DeviceError;
use crate::daemon::node_check;
use crate::daemon::options::DaemonOptions;
use crate::daemon::state::{
    IpamState, JournalOrigin, KernelView, MultiPoolSettings, PoolingMode, StateConfig, TeardownLink,
};
use crate::daemon::{ReplayError, apply_queued, devices, metrics, read_queue, remove_queued};
use crate::node::NodeResource;

/// The pods' MTU and the node device's it derives from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Mtus {
    pub(super) pod: u32,
    pub(super) device: u32,
}

/// The DEL queue, replayed, and its lock, held until the socket accepts requests.
pub(super) struct ReplayedQueue {
    pub(super) queue: DeleteQueue,
    pub(super) lock: QueueLock,
}

/// The node device's MTU (`--mtu`, else the default route's, else 1500), and the
/// pods': pods in tunnel mode leave room for the encapsulation (over the underlay
/// family's outer header), so a full-size pod packet crosses the node's device
/// unfragmented.
pub(super) fn mtus(
    config: &DaemonConfig,
    mtu_flag: u32,
    default_route_mtu: impl FnOnce() -> Option<u32>,
) -> Mtus {
    let device = if mtu_flag > 0 {
        mtu_flag
    } else {
        default_route_mtu().unwrap_or(1500)
    };
    let pod = match config.cross_node.routing {
        RoutingMode::Tunnel => device.saturating_sub(crate::daemon::crossnode::tunnel_overhead(
            config.cross_node.underlay,
        )),
        RoutingMode::Native => device,
    };
    Mtus { pod, device }
}

/// How the state pools addresses in the configured IPAM mode.
fn pooling_mode(config: &DaemonConfig, default_pool: Option<&str>) -> PoolingMode {
    match (&config.multi_pool, config.ipam) {
        (_, IpamMode::Eni) => PoolingMode::External { eni: true },
        (_, mode) if mode.is_external() => PoolingMode::External { eni: false },
        (Some(m), _) => PoolingMode::MultiPool(MultiPoolSettings {
            default_pool: default_pool.unwrap_or(&m.default_pool).to_string(),
            configured_default_pool: m.default_pool.clone(),
            pre_allocation: m.pre_allocation.clone(),
            only_masquerade_default_pool: m.only_masquerade_default_pool,
        }),
        _ => PoolingMode::HostScope,
    }
}

/// What the state is restored with: the checked options, the MTUs and the
/// node's default pool (the backend's, else the configured one).
fn state_config(
    checked: &Checked,
    opts: &DaemonOptions,
    mtus: Mtus,
    default_pool: Option<&str>,
) -> StateConfig {
    let config = &checked.config;
    StateConfig {
        node_name: checked.node_name.clone(),
        ipam_mode: config.ipam,
        expiration: opts.ipam_expiration,
        cooldown: opts.ipam_release_cooldown,
        mtu: mtus.pod,
        reserve_health: opts.enable_health_checking,
        reserve_ingress: opts.enable_ingress_controller,
        datapath_mode: checked.datapath_mode,
        configured_datapath_mode: config.datapath,
        bandwidth_manager: opts.enable_bandwidth_manager,
        fixed_routers: config.fixed_routers.clone(),
        families: config.families.clone(),
        tunnel_underlay: config.cross_node.tunnel_underlay(),
        pool_findings: node_check::pool_findings(config),
        pooling: pooling_mode(config, default_pool),
        depletion: config.depletion,
    }
}

/// Restores the state from the journal, on the node resource and the backend's
/// pools and metadata, and judges the configuration on the node's facts.
pub(super) fn restore_state(
    checked: &Checked,
    opts: &DaemonOptions,
    mtus: Mtus,
    journal: OpenedJournal,
    node: NodeResource,
    backend: &mut Backend,
) -> Result<IpamState, StartError> {
    let cfg = state_config(checked, opts, mtus, backend.default_pool.as_deref());
    let metrics = Arc::new(metrics::Metrics::new(&opts.metrics_prefix));
    let mut state = IpamState::restore(
        cfg,
        journal.journal,
        node,
        backend.operator.take(),
        std::mem::take(&mut backend.view.pools),
        journal.snapshot,
        metrics,
    )
    .map_err(StartError::Restore)?;
    if let Some(meta) = backend.view.metadata.take() {
        state.set_metadata(meta);
    }
    if let Some(facts) = backend.view.facts.take()
        && let Some(verdict) = state.set_node_facts(facts)
    {
        verdict.log(&checked.node_name);
    }
    Ok(state)
}

/// Replays the DELs queued while the daemon was down, holding the queue lock
/// until the socket accepts requests (a plugin that waits for the lock then
/// finds the daemon up).
pub(super) fn replay_delete_queue(
    state: &mut IpamState,
    socket: &Path,
) -> Result<ReplayedQueue, StartError> {
    let queue = DeleteQueue::open(socket).map_err(ReplayError::from)?;
    let lock = queue.lock_exclusive().map_err(ReplayError::from)?;
    queue.remove_partial_writes();
    let queued = read_queue(&queue)?;
    let replayed = apply_queued(state, &queued)?;
    remove_queued(&queued)?;
    state.note_queued_deletes(replayed);
    Ok(ReplayedQueue { queue, lock })
}

/// What the start reads from, and does to, the kernel's links and rules: the
/// host's, or a test's fake.
pub(super) trait Kernel {
    /// The pods' host links, with the addresses routed through them.
    fn view(&self) -> Result<KernelView, DeviceError>;
    /// Deletes the orphan host links `names` (a failure is only logged).
    fn delete_links(&self, names: &[String]);
    /// Deletes a teardown's links, each only if it still has its recorded name.
    fn delete_links_checked(&self, links: &[TeardownLink]) -> Result<(), DeviceError>;
    /// Removes the ENI-class rules of the addresses `stale` says are not in use.
    fn prune_pod_rules(&self, stale: &dyn Fn(IpAddr) -> bool);
}

/// The host's kernel.
pub(super) struct HostKernel;

impl Kernel for HostKernel {
    fn view(&self) -> Result<KernelView, DeviceError> {
        devices::kernel_view()
    }

    fn delete_links(&self, names: &[String]) {
        devices::delete_links(names)
    }

    fn delete_links_checked(&self, links: &[TeardownLink]) -> Result<(), DeviceError> {
        devices::delete_links_checked(links)
    }

    fn prune_pod_rules(&self, stale: &dyn Fn(IpAddr) -> bool) {
        devices::prune_pod_rules(stale)
    }
}

/// Brings the state and the kernel together: the pods' host links, the
/// addresses the routers take, the teardowns the last run left, the ENI-class
/// rules of addresses no pod holds any more (DELs while the daemon was down,
/// crashes).
pub(super) fn reconcile_with_kernel(
    kernel: &impl Kernel,
    state: &mut IpamState,
    origin: JournalOrigin,
    router_hints: &[IpAddr],
) -> Result<(), StartError> {
    let view = kernel.view().map_err(StartError::KernelView)?;
    let reconciled = state
        .reconcile_with_kernel(&view, origin)
        .map_err(StartError::KernelReconcile)?;
    kernel.delete_links(&reconciled.links_to_delete);
    state
        .reserve_infra_addresses(router_hints)
        .map_err(StartError::KernelReconcile)?;
    for td in state.pending_teardowns() {
        kernel
            .delete_links_checked(&td.links)
            .map_err(StartError::Teardown)?;
        state
            .finish_teardown(&td.key)
            .map_err(StartError::TeardownJournal)?;
    }
    let live = state.live_addresses();
    kernel.prune_pod_rules(&|ip| !live.contains(&ip));
    state.finish_restore();
    Ok(())
}

/// Logs what the restore found.
pub(super) fn log_restored(
    state: &IpamState,
    node_name: &str,
    cidrs: &[String],
    routers: &[IpAddr],
) {
    let report = state.restore_report();
    tracing::info!(
        node = %node_name,
        cidrs = ?cidrs,
        routers = ?routers.iter().map(|r| r.to_string()).collect::<Vec<_>>(),
        restored = report.restored,
        expired = report.expired,
        cooled_down = report.cooled_down,
        queued_deletes = report.queued_deletes,
        outside_ranges = report.outside_ranges.len(),
        released_link_gone = report.released_link_gone.len(),
        orphan_links_removed = report.orphan_links_removed.len(),
        adopted_from_kernel = report.adopted_from_kernel.len(),
        "IPAM restored"
    );
}

#[cfg(test)]
mod tests;
