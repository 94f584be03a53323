//! The daemon's start, phase by phase: check the options and the process,
//! take the socket lock, open the journal, ask the node backend what the node
//! owns, restore the state, replay the DEL queue, reconcile with the kernel and
//! set up the router device, then serve (the CNI config is written once the
//! configuration fits the node). A failed phase is a [`StartError`] that names it
//! and keeps what went wrong.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ipnet::IpNet;

use super::capabilities::{self, CapabilityError};
use super::cniconf::CniConfError;
use super::config::{BackendKind, ConfigError, DaemonConfig, DatapathMode, IpamMode, PolicyMode};
use super::crossnode::PrerequisiteError;
use super::crossnode::settings::RoutingMode;
use super::device_error::DeviceError;
use super::leak_check;
use super::node_backend::{NodeBackend, node_source};
use super::options::DaemonOptions;
use super::policy_loop;
use super::server::{self, SocketError, SocketLock};
use super::source_check::{self, SourceCheckError};
use super::state::{
    ApiError, IpamState, JournalOrigin, MultiPoolSettings, NODE_META_KEY, PoolingMode,
    RestoreError, StateConfig, Timer,
};
use super::{
    Daemon, ReplayError, apply_node_events, apply_queued, cniconf, crossnode, devices,
    flush_outbox, heap, keep_journal_working, keep_source_check, metrics, read_queue,
    remove_queued,
};
use crate::api::delete_queue::{DeleteQueue, QueueLock};
use crate::api::start_note;
use crate::datapath::{NetkitSupport, probe_netkit};
use crate::ipam::Family;
use crate::ipam::clusterpool::ClusterPoolConfig;
use crate::ipam::pooldef::PoolDef;
use crate::k8s::node_pods::NodePodsApi;
use crate::node::{
    BackendHealth, EmbeddedMode, EmbeddedOperator, NodeError, NodeOperator, NodeResource, NodeSink,
    NodeSource, NodeView,
};
use crate::policy::table::PolicyTableError;
use crate::process::metrics_server::MetricsBindError;
use crate::process::shutdown_signal;
use crate::store::{Journal, Snapshot, StoreError, now_ms};

/// Why the daemon did not start: the phase that failed, with what went wrong.
/// Each message is the failed step's own, which says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Options(#[from] ConfigError),
    #[error(transparent)]
    Capabilities(#[from] CapabilityError),
    #[error(transparent)]
    CrossNodePrerequisites(#[from] PrerequisiteError),
    #[error("cannot read the host name ({0}); set --k8s-node-name")]
    HostName(#[source] nix::errno::Errno),
    #[error("--datapath-mode={configured}: {reason}; use veth or auto")]
    NetkitMissing {
        configured: DatapathMode,
        reason: String,
    },
    #[error("cannot start the runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error(transparent)]
    SocketLock(SocketError),
    #[error(transparent)]
    SourceCheck(#[from] SourceCheckError),
    #[error(transparent)]
    StateDirectory(SocketError),
    #[error(transparent)]
    Journal(#[from] JournalOpenError),
    #[error("{0}")]
    NodeBackend(#[source] NodeError),
    #[error("{0}")]
    NodeOperator(#[source] NodeError),
    #[error(transparent)]
    Restore(RestoreError),
    #[error("{0}")]
    DeleteQueue(#[from] ReplayError),
    #[error("{0}")]
    KernelView(#[source] DeviceError),
    #[error(transparent)]
    KernelReconcile(RestoreError),
    #[error("{0}")]
    Teardown(#[source] DeviceError),
    #[error("{0}")]
    TeardownJournal(#[source] ApiError),
    #[error("{0}")]
    RouterDevice(#[source] DeviceError),
    #[error(transparent)]
    Serve(SocketError),
    #[error(transparent)]
    Metrics(#[from] MetricsBindError),
    #[error("{0}")]
    CniConfig(#[from] CniConfError),
    #[error("cannot clear {}: {source}", .path.display())]
    StartNote {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl StartError {
    /// The phase that failed, for the log.
    pub fn phase(&self) -> &'static str {
        match self {
            StartError::Options(_) => "options",
            StartError::Capabilities(_) => "capabilities",
            StartError::CrossNodePrerequisites(_) => "cross-node prerequisites",
            StartError::HostName(_) => "node name",
            StartError::NetkitMissing { .. } => "datapath mode",
            StartError::Runtime(_) => "runtime",
            StartError::SocketLock(_) => "socket lock",
            StartError::SourceCheck(_) => "source check",
            StartError::StateDirectory(_) => "state directory",
            StartError::Journal(_) => "journal",
            StartError::NodeBackend(_) => "node backend",
            StartError::NodeOperator(_) => "node operator",
            StartError::Restore(_) => "restore",
            StartError::DeleteQueue(_) => "DEL queue replay",
            StartError::KernelView(_) => "kernel view",
            StartError::KernelReconcile(_) => "kernel reconcile",
            StartError::Teardown(_) | StartError::TeardownJournal(_) => "teardown",
            StartError::RouterDevice(_) => "router device",
            StartError::Serve(_) | StartError::Metrics(_) => "serve",
            StartError::CniConfig(_) => "CNI config",
            StartError::StartNote { .. } => "start note",
        }
    }
}

/// The options resolved and checked against this process and kernel.
struct Checked {
    config: DaemonConfig,
    node_name: String,
    /// The pod device type in use (never `Auto`).
    datapath_mode: DatapathMode,
}

/// Why the journal could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum JournalOpenError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "journal {}: the node resource record is corrupt: {source}. Restart the daemon with --rebuild-from-kernel to move the journal aside and rebuild the allocations from the pods' host links and routes",
        .path.display()
    )]
    CorruptNode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// `--rebuild-from-kernel`, and the unreadable journal could not be moved aside.
    #[error("{unreadable}; and it could not be moved aside: {source}")]
    MoveAside {
        unreadable: Box<JournalOpenError>,
        #[source]
        source: std::io::Error,
    },
}

/// The journal as opened, with the node resource it holds.
struct OpenedJournal {
    journal: Journal,
    snapshot: Snapshot,
    origin: JournalOrigin,
    node: Option<NodeResource>,
}

/// The node backend, connected: its source and sink, what it said first, the
/// default pool, and the embedded operator where the daemon plays it.
struct Backend {
    source: Box<dyn NodeSource>,
    sink: Option<Box<dyn NodeSink>>,
    view: NodeView,
    default_pool: Option<String>,
    operator: Option<Box<dyn NodeOperator>>,
}

/// The DEL queue, replayed, and its lock, held until the socket accepts requests.
struct ReplayedQueue {
    queue: DeleteQueue,
    lock: QueueLock,
}

/// The pods' MTU and the node device's it derives from.
#[derive(Clone, Copy)]
struct Mtus {
    pod: u32,
    device: u32,
}

/// Starts the daemon and serves until a shutdown signal.
pub(super) fn start(opts: DaemonOptions) -> Result<(), StartError> {
    let checked = check(&opts)?;
    heap::tune();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(StartError::Runtime)?;
    let lock = server::lock_socket(&opts.socket).map_err(StartError::SocketLock)?;
    server::ensure_private_dir(&opts.state_dir, "state directory")
        .map_err(StartError::StateDirectory)?;
    // First, so a journal this podnet refuses (a newer format) leaves the node
    // as it found it.
    let journal = open_journal(
        &opts.state_dir.join("journal.redb"),
        opts.rebuild_from_kernel,
    )?;
    set_up_source_check(opts.enable_source_ip_verification)?;
    let chosen = NodeBackend::of(&checked.config, &opts);
    let health = chosen.health(&opts);
    note_waits_in_lock_file(&health, &lock);
    let mut backend = connect_backend(
        &checked,
        chosen,
        &opts,
        runtime.handle(),
        journal.node.clone(),
        &health,
    )?;
    let router_hints = devices::router_addresses();
    let node = node_resource(&checked, &mut backend, &journal, &router_hints)?;
    let cidrs = node_cidrs(&node);
    let mtus = mtus(&checked.config, &opts);
    let origin = journal.origin;
    let mut state = restore_state(&checked, &opts, mtus, journal, node, &mut backend)?;
    let queue = replay_delete_queue(&mut state, &opts.socket)?;
    reconcile_with_kernel(&mut state, origin, &router_hints)?;
    let routers = state.router_ips();
    devices::setup_router(&routers, mtus.pod, &opts.procfs).map_err(StartError::RouterDevice)?;
    log_restored(&state, &checked.node_name, &cidrs, &routers);
    let timers = state.take_timers();
    heap::trim();
    let Backend { source, sink, .. } = backend;
    runtime.block_on(serve(Serving {
        opts,
        checked,
        mtus,
        lock,
        queue,
        health,
        state,
        timers,
        source,
        sink,
    }))
}

/// Resolves the options and checks them against this process and kernel: the
/// capabilities, the cross-node prerequisites, the node's name, the pod device.
fn check(opts: &DaemonOptions) -> Result<Checked, StartError> {
    let config = DaemonConfig::resolve(opts)?;
    capabilities::check(&config)?;
    crossnode::check_prerequisites(&config.cross_node)?;
    let node_name = match &opts.node_name {
        Some(n) if !n.is_empty() => n.clone(),
        _ => nix::unistd::gethostname()
            .map_err(StartError::HostName)?
            .to_string_lossy()
            .to_string(),
    };
    let datapath_mode = resolve_datapath_mode(config.datapath)?;
    Ok(Checked {
        config,
        node_name,
        datapath_mode,
    })
}

/// Until the socket answers, what the start waits for is in the lock file.
fn note_waits_in_lock_file(health: &BackendHealth, lock: &SocketLock) {
    let note = lock.path().to_path_buf();
    health.on_waiting(Some(Box::new(move |waiting: &[String]| {
        if let Err(e) = start_note::write(&note, waiting) {
            tracing::warn!(error = %e, file = %note.display(), "cannot note what the start waits for");
        }
    })));
}

/// Connects the node backend and reads what it says first; sets up the embedded
/// operator where the daemon plays the operator for this node (an external IPAM
/// needs none).
fn connect_backend(
    checked: &Checked,
    chosen: NodeBackend<'_>,
    opts: &DaemonOptions,
    runtime: &tokio::runtime::Handle,
    journal_node: Option<NodeResource>,
    health: &Arc<BackendHealth>,
) -> Result<Backend, StartError> {
    let config = &checked.config;
    let (mut source, sink) = node_source(
        chosen,
        config,
        opts,
        &checked.node_name,
        runtime,
        journal_node,
        health,
    );
    let view = source.initial().map_err(StartError::NodeBackend)?;
    let default_pool = config.multi_pool.as_ref().map(|m| {
        view.default_pool
            .clone()
            .unwrap_or_else(|| m.default_pool.clone())
    });
    let embedded = config.backend == BackendKind::Embedded;
    let operator: Option<Box<dyn NodeOperator>> =
        (embedded && !config.ipam.is_external()).then(|| {
            Box::new(EmbeddedOperator::new(
                &checked.node_name,
                embedded_mode(config, &view.pools, default_pool.as_deref()),
            )) as Box<dyn NodeOperator>
        });
    Ok(Backend {
        source,
        sink,
        view,
        default_pool,
        operator,
    })
}

/// The node resource the daemon starts from: the embedded operator's answer to
/// what the journal holds, else the backend's, else the journal's.
fn node_resource(
    checked: &Checked,
    backend: &mut Backend,
    journal: &OpenedJournal,
    router_hints: &[IpAddr],
) -> Result<NodeResource, StartError> {
    let node_name = &checked.node_name;
    // A journal that knows nothing (rebuilt, or new on a node whose router device
    // shows that podnet ran here) takes the node's CIDRs from the router device.
    let current = match journal.origin {
        JournalOrigin::Rebuilt => rebuilt_node(node_name, &checked.config, router_hints),
        JournalOrigin::Created if !router_hints.is_empty() => {
            tracing::warn!(
                routers = ?router_hints,
                "the journal is new, but the router device shows that podnet ran on this node: taking the node's CIDRs from it and adopting the pods' addresses from their host links"
            );
            rebuilt_node(node_name, &checked.config, router_hints)
        }
        _ => journal.node.clone(),
    };
    match (backend.operator.as_mut(), backend.view.node.take()) {
        (Some(op), _) => op.sync(current).map_err(StartError::NodeOperator),
        (None, Some(node)) => Ok(node),
        (None, None) => Ok(current.unwrap_or_else(|| NodeResource::new(node_name))),
    }
}

/// The node's CIDRs, for the log: its pod CIDRs, else its pools' blocks.
fn node_cidrs(node: &NodeResource) -> Vec<String> {
    if node.spec.ipam.pod_cidrs.is_empty() {
        node.spec
            .ipam
            .pools
            .allocated
            .iter()
            .flat_map(|a| a.cidrs.iter().map(|c| format!("{}/{c}", a.pool)))
            .chain(node.spec.ipam.pool.keys().cloned())
            .collect()
    } else {
        node.spec
            .ipam
            .pod_cidrs
            .iter()
            .map(IpNet::to_string)
            .collect()
    }
}

/// The node device's MTU (`--mtu`, else the default route's), and the pods':
/// pods in tunnel mode leave room for the encapsulation (over the underlay
/// family's outer header), so a full-size pod packet crosses the node's device
/// unfragmented.
fn mtus(config: &DaemonConfig, opts: &DaemonOptions) -> Mtus {
    let device = if opts.mtu > 0 {
        opts.mtu
    } else {
        devices::default_route_mtu().unwrap_or(1500)
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

/// Restores the state from the journal, on the node resource and the backend's
/// pools and metadata, and judges the configuration on the node's facts.
fn restore_state(
    checked: &Checked,
    opts: &DaemonOptions,
    mtus: Mtus,
    journal: OpenedJournal,
    node: NodeResource,
    backend: &mut Backend,
) -> Result<IpamState, StartError> {
    let config = &checked.config;
    let cfg = StateConfig {
        node_name: checked.node_name.clone(),
        ipam_mode: config.ipam,
        expiration: opts.ipam_expiration,
        cooldown: opts.ipam_release_cooldown,
        mtu: mtus.pod,
        reserve_health: opts.enable_health_checking,
        reserve_ingress: opts.enable_ingress_controller,
        datapath_mode: checked.datapath_mode,
        configured_datapath_mode: config.datapath,
        fixed_routers: config.fixed_routers.clone(),
        families: config.families.clone(),
        tunnel_underlay: config.cross_node.tunnel_underlay(),
        mask_misfits: config
            .cluster_pool
            .as_ref()
            .map(ClusterPoolConfig::mask_misfits)
            .unwrap_or_default(),
        pooling: pooling_mode(config, backend.default_pool.as_deref()),
        depletion: config.depletion,
    };
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
fn replay_delete_queue(state: &mut IpamState, socket: &Path) -> Result<ReplayedQueue, StartError> {
    let queue = DeleteQueue::open(socket).map_err(ReplayError::from)?;
    let lock = queue.lock_exclusive().map_err(ReplayError::from)?;
    queue.remove_partial_writes();
    let queued = read_queue(&queue)?;
    let replayed = apply_queued(state, &queued)?;
    remove_queued(&queued)?;
    state.note_queued_deletes(replayed);
    Ok(ReplayedQueue { queue, lock })
}

/// Brings the state and the kernel together: the pods' host links, the
/// addresses the routers take, the teardowns the last run left, the ENI-class
/// rules of addresses no pod holds any more (DELs while the daemon was down,
/// crashes).
fn reconcile_with_kernel(
    state: &mut IpamState,
    origin: JournalOrigin,
    router_hints: &[IpAddr],
) -> Result<(), StartError> {
    let kernel = devices::kernel_view().map_err(StartError::KernelView)?;
    let reconciled = state
        .reconcile_with_kernel(&kernel, origin)
        .map_err(StartError::KernelReconcile)?;
    devices::delete_links(&reconciled.links_to_delete);
    state
        .reserve_infra_addresses(router_hints)
        .map_err(StartError::KernelReconcile)?;
    for td in state.pending_teardowns() {
        devices::delete_links_checked(&td.links).map_err(StartError::Teardown)?;
        state
            .finish_teardown(&td.key)
            .map_err(StartError::TeardownJournal)?;
    }
    let live = state.live_addresses();
    devices::prune_pod_rules(|ip| !live.contains(&ip));
    state.finish_restore();
    Ok(())
}

/// Logs what the restore found.
fn log_restored(state: &IpamState, node_name: &str, cidrs: &[String], routers: &[IpAddr]) {
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

/// What the serving daemon is made of, once the start's phases are done.
struct Serving {
    opts: DaemonOptions,
    checked: Checked,
    mtus: Mtus,
    lock: SocketLock,
    queue: ReplayedQueue,
    health: Arc<BackendHealth>,
    state: IpamState,
    timers: Vec<Timer>,
    source: Box<dyn NodeSource>,
    sink: Option<Box<dyn NodeSink>>,
}

/// Opens the socket, starts the background work (timers, metrics, the backend's
/// events and outbox, the journal's and the source check's upkeep, the
/// cross-node datapath), writes the CNI config, and serves until a shutdown
/// signal; then undoes what `--cni-uninstall` asks.
async fn serve(s: Serving) -> Result<(), StartError> {
    let socket = s.opts.socket.clone();
    let source_check = s.opts.enable_source_ip_verification;
    let listener = server::bind(&socket).map_err(StartError::Serve)?;
    drop(s.queue.lock);
    s.health.on_waiting(None);
    start_note::write(s.lock.path(), &[]).map_err(|source| StartError::StartNote {
        path: s.lock.path().to_path_buf(),
        source,
    })?;
    let cross_node = s.checked.config.cross_node.clone();
    let cross_node_status = cross_node
        .is_active()
        .then(|| crossnode::new_status(&cross_node));
    let leak_check = leak_check_of(&s.checked, &s.opts);
    let daemon = Arc::new(Daemon {
        state: Mutex::new(s.state),
        queue: s.queue.queue,
        backend: s.health.clone(),
        cross_node: cross_node_status.clone(),
        node_events: tokio::sync::watch::Sender::new(0),
        source_check,
        demand_waiting: tokio::sync::Notify::new(),
        leak_check: leak_check.clone(),
        pod_events: pod_events_of(&s.checked),
        policy: Mutex::new(None),
        policy_explanations: std::sync::RwLock::new(None),
    });
    daemon.arm_timers(s.timers);
    if let Some(check) = leak_check {
        tokio::spawn(leak_check::periodic(
            check,
            leak_check::DaemonFacts(daemon.clone()),
        ));
    }
    start_policy(&daemon, &s.checked.config);
    if !s.opts.prometheus_serve_addr.is_empty() {
        spawn_metrics(&daemon, &s.opts.prometheus_serve_addr).await?;
    }
    let (events_tx, events) = tokio::sync::mpsc::channel(16);
    tokio::spawn(s.source.watch(events_tx));
    tokio::spawn(apply_node_events(daemon.clone(), events));
    if let Some(sink) = s.sink {
        tokio::spawn(flush_outbox(daemon.clone(), sink, s.opts.node_update_rate));
    }
    tokio::spawn(keep_journal_working(daemon.clone()));
    if source_check {
        tokio::spawn(keep_source_check());
    }
    if let Some(status) = cross_node_status {
        spawn_cross_node(&daemon, &s.checked, s.mtus.device, s.health, status);
    }
    let conf = CniConf::of(&s.opts, &socket);
    if let Some(conf) = &conf {
        match daemon.with_state(|s| Ok(s.fits())).await {
            Ok(false) => {
                tracing::warn!(path = %conf.path().display(), "not writing the CNI config while the configuration does not fit this node (the log says why): the runtime does not report the network ready");
                tokio::spawn(write_cni_conf_once_fit(daemon.clone(), conf.clone()));
            }
            _ => conf.write()?,
        }
    }
    tracing::info!(socket = %socket.display(), lock = %s.lock.path().display(), "podnet daemon ready");
    // The accept loop runs on a worker, not on this thread: a connection it
    // spawns then starts on the same worker, without a cross-thread wake-up.
    if let Err(e) = tokio::spawn(server::serve(listener, daemon, shutdown_signal())).await {
        tracing::error!(error = %e, "the API server stopped");
    }
    if s.opts.cni_uninstall {
        uninstall(
            conf.as_ref().map(CniConf::path).as_deref(),
            cross_node.masquerade_v4 || cross_node.masquerade_v6,
            source_check,
        );
    }
    let _ = std::fs::remove_file(&socket);
    tracing::info!("podnet daemon stopped");
    Ok(())
}

/// `--write-cni-conf-when-ready DIR`: the CNI config and where it goes.
#[derive(Clone)]
struct CniConf {
    dir: PathBuf,
    socket: PathBuf,
    log_file: PathBuf,
    exclusive: bool,
    chained: Vec<cniconf::ChainedPlugin>,
}

impl CniConf {
    /// The config `opts` ask for (None: none).
    fn of(opts: &DaemonOptions, socket: &Path) -> Option<CniConf> {
        if opts.write_cni_conf_when_ready.is_empty() {
            return None;
        }
        let chained = if opts.cni_bin_dir.is_empty() {
            Vec::new()
        } else {
            cniconf::chained_plugins(Path::new(&opts.cni_bin_dir))
        };
        Some(CniConf {
            dir: PathBuf::from(&opts.write_cni_conf_when_ready),
            socket: socket.to_path_buf(),
            log_file: opts.cni_log_file.clone(),
            exclusive: opts.cni_exclusive,
            chained,
        })
    }

    fn path(&self) -> PathBuf {
        self.dir.join(cniconf::CONF_NAME)
    }

    fn write(&self) -> Result<(), CniConfError> {
        let path = cniconf::write(
            &self.dir,
            &self.socket,
            &self.log_file,
            self.exclusive,
            &self.chained,
        )?;
        tracing::info!(path = %path.display(), "wrote the CNI config");
        Ok(())
    }
}

/// Writes the CNI config once the node's facts changed so that the configuration
/// fits (a Node that now lists the missing address).
async fn write_cni_conf_once_fit(daemon: Arc<Daemon>, conf: CniConf) {
    // Subscribed before the first look: a change between the two is not missed.
    let mut events = daemon.node_events.subscribe();
    loop {
        if matches!(daemon.with_state(|s| Ok(s.fits())).await, Ok(true)) {
            match conf.write() {
                Ok(()) => return,
                Err(e) => {
                    tracing::error!(error = %e, "the configuration fits this node now, but the CNI config cannot be written; it is tried again at the next change of the node")
                }
            }
        }
        if events.changed().await.is_err() {
            return;
        }
    }
}

/// Serves the metrics on `addr`.
async fn spawn_metrics(daemon: &Arc<Daemon>, addr: &str) -> Result<(), StartError> {
    let tcp = server::bind_metrics(addr).await?;
    let d = daemon.clone();
    tokio::spawn(server::serve_metrics(tcp, move || {
        let d = d.clone();
        async move { d.metrics_text().await.unwrap_or_else(|e| e.message) }
    }));
    Ok(())
}

/// The leak check, on the Kubernetes backend (every mode there has podnet hand
/// out the pods' addresses); None on the others, which have no API server to
/// list the node's Pods.
fn leak_check_of(
    checked: &Checked,
    opts: &DaemonOptions,
) -> Option<Arc<leak_check::LeakCheck<NodePodsApi>>> {
    let BackendKind::Kubernetes { kubeconfig } = &checked.config.backend else {
        return None;
    };
    let settings = leak_check::LeakSettings {
        interval: opts.leak_check_interval,
        grace: opts.leak_grace,
        release_after: (!opts.release_leaked_after.is_zero()).then_some(opts.release_leaked_after),
    };
    tracing::info!(
        interval = ?settings.interval,
        grace = ?settings.grace,
        release_after = ?settings.release_after,
        "leak check on"
    );
    Some(Arc::new(leak_check::LeakCheck::new(
        NodePodsApi::new(kubeconfig.clone(), checked.node_name.clone()),
        settings,
    )))
}

/// Where Events on this node's Pods go: the API server, on the Kubernetes
/// backend; None on the others.
fn pod_events_of(checked: &Checked) -> Option<Arc<NodePodsApi>> {
    let BackendKind::Kubernetes { kubeconfig } = &checked.config.backend else {
        return None;
    };
    Some(Arc::new(NodePodsApi::new(
        kubeconfig.clone(),
        checked.node_name.clone(),
    )))
}

/// `--enable-policy`: the policy loop on the Kubernetes backend (the embedded
/// one has no NetworkPolicies), isolating every local pod with `always`;
/// `never` removes podnet's policy table. The table
/// is never removed at stop: it outlives an agent restart.
fn start_policy(daemon: &Arc<Daemon>, config: &DaemonConfig) {
    match (config.policy, &config.backend) {
        (
            mode @ (PolicyMode::Default | PolicyMode::Always),
            BackendKind::Kubernetes { kubeconfig },
        ) => {
            let enforcement = match mode {
                PolicyMode::Always => crate::policy::Enforcement::Always,
                _ => crate::policy::Enforcement::Default,
            };
            tokio::spawn(policy_loop::run(
                daemon.clone(),
                kubeconfig.clone(),
                enforcement,
            ));
        }
        (PolicyMode::Default | PolicyMode::Always, BackendKind::Embedded) => {
            tracing::info!("NetworkPolicy is not enforced on the embedded backend (no API server)")
        }
        (PolicyMode::Never, _) => match crate::policy::table::remove() {
            Ok(()) | Err(PolicyTableError::NftMissing) => {
                tracing::info!("NetworkPolicy not enforced (--enable-policy never)")
            }
            Err(e) => {
                tracing::warn!(error = %e, "--enable-policy never: could not remove the policy table")
            }
        },
    }
}

/// Runs the cross-node datapath, fed by every CiliumNode of the cluster (the
/// Kubernetes backend) or by this node alone (the embedded one).
fn spawn_cross_node(
    daemon: &Arc<Daemon>,
    checked: &Checked,
    device_mtu: u32,
    health: Arc<BackendHealth>,
    status: crossnode::SharedStatus,
) {
    let feed = match checked.config.backend.clone() {
        BackendKind::Kubernetes { kubeconfig } => {
            let (tx, rx) = tokio::sync::watch::channel(None);
            tokio::spawn(crate::node::cluster_nodes::watch_cluster_nodes(
                kubeconfig, health, tx,
            ));
            crossnode::NodeFeed::Cluster(rx)
        }
        BackendKind::Embedded => crossnode::NodeFeed::ThisNode,
    };
    tokio::spawn(crossnode::run(
        daemon.clone(),
        checked.config.cross_node.clone(),
        device_mtu,
        checked.node_name.clone(),
        feed,
        status,
    ));
}

/// `--cni-uninstall`, at stop: removes the CNI config the daemon wrote, the
/// masquerade tables and the source check's table.
fn uninstall(written_conf: Option<&Path>, masquerades: bool, source_check: bool) {
    if let Some(path) = written_conf {
        match cniconf::remove(path) {
            Ok(()) => {
                tracing::info!(path = %path.display(), "removed the CNI config (cni-uninstall)")
            }
            Err(e) => tracing::warn!(error = %e, "cni-uninstall"),
        }
    }
    if masquerades {
        match crossnode::masquerade::remove_tables() {
            Ok(()) => tracing::info!(
                table = crossnode::masquerade::TABLE,
                "removed the masquerade tables (cni-uninstall)"
            ),
            Err(e) => tracing::warn!(error = %e, "cni-uninstall: the masquerade tables"),
        }
    }
    if source_check {
        match source_check::remove() {
            Ok(()) => tracing::info!(
                table = source_check::TABLE,
                "removed the source check table (cni-uninstall)"
            ),
            Err(e) => tracing::warn!(error = %e, "cni-uninstall: the source check table"),
        }
    }
}

/// Installs the source check's table before any pod is served (kept as it is
/// when the kernel already has it, so its counters survive a restart), or
/// removes it when the check is off.
fn set_up_source_check(enabled: bool) -> Result<(), StartError> {
    if !enabled {
        if let Err(e) = source_check::remove() {
            tracing::warn!(error = %e, "--enable-source-ip-verification=false: could not remove the source check table");
        }
        tracing::warn!(
            "source check off (--enable-source-ip-verification=false): pods can send with any source address"
        );
        return Ok(());
    }
    let ensured = source_check::ensure()?;
    tracing::info!(table = source_check::TABLE, outcome = ?ensured, "source check");
    Ok(())
}

/// Opens and reads the journal, including the node resource it holds. With
/// `rebuild`, a journal that cannot be read for any reason (a damaged file, a
/// record or the node resource that does not decode) is moved aside (never
/// deleted) and an empty one started.
fn open_journal(path: &Path, rebuild: bool) -> Result<OpenedJournal, JournalOpenError> {
    let read = match Journal::open(path) {
        // Written by a newer podnet: refused as it is, never moved aside.
        Err(e @ StoreError::NewerFormat { .. }) => return Err(e.into()),
        opened => opened,
    };
    let read = read.map_err(JournalOpenError::from).and_then(|(j, s)| {
        let node = stored_node(&s, &j)?;
        Ok((j, s, node))
    });
    match read {
        Ok((j, s, node)) => {
            let origin = if j.created() {
                JournalOrigin::Created
            } else {
                JournalOrigin::Existing
            };
            Ok(OpenedJournal {
                journal: j,
                snapshot: s,
                origin,
                node,
            })
        }
        Err(e) if rebuild => {
            let aside = path.with_extension(format!("redb.corrupt-{}", now_ms()));
            tracing::warn!(error = %e, aside = %aside.display(), "journal unreadable: moving it aside and rebuilding from the kernel");
            std::fs::rename(path, &aside).map_err(|source| JournalOpenError::MoveAside {
                unreadable: Box::new(e),
                source,
            })?;
            let (j, _) = Journal::open(path)?;
            Ok(OpenedJournal {
                journal: j,
                snapshot: Snapshot::default(),
                origin: JournalOrigin::Rebuilt,
                node: None,
            })
        }
        Err(e) => Err(e),
    }
}

/// The node resource the journal holds.
fn stored_node(
    snapshot: &Snapshot,
    journal: &Journal,
) -> Result<Option<NodeResource>, JournalOpenError> {
    snapshot
        .meta
        .iter()
        .find(|(k, _)| k == NODE_META_KEY)
        .map(|(_, v)| serde_json::from_value(v.clone()))
        .transpose()
        .map_err(|source| JournalOpenError::CorruptNode {
            path: journal.path().to_path_buf(),
            source,
        })
}

/// In a rebuild, the node's CIDRs are those that hold the router device's
/// addresses: of the node mask size of the pool CIDR each is in (its own
/// `<cidr>@<mask>`, or the family's), for a family whose mask size fits its
/// pool CIDRs (a misfit one, which the Kubernetes backend lets start as a finding
/// of the node check, would make up CIDRs the operator never carved).
fn rebuilt_node(
    node_name: &str,
    config: &DaemonConfig,
    routers: &[IpAddr],
) -> Option<NodeResource> {
    let cfg = config.cluster_pool.as_ref()?;
    let misfit: Vec<Family> = cfg.mask_misfits().iter().map(|m| m.family).collect();
    let mut node = NodeResource::new(node_name);
    for ip in routers {
        let family = Family::of_addr(ip);
        if misfit.contains(&family) {
            continue;
        }
        if let Ok(net) = IpNet::new(*ip, cfg.node_mask_of(*ip)) {
            node.spec.ipam.pod_cidrs.push(net.trunc());
        }
    }
    Some(node)
}

/// The pod device type for `--datapath-mode`: netkit is checked here, at start, so
/// a kernel without it fails the daemon, never a pod's ADD.
fn resolve_datapath_mode(configured: DatapathMode) -> Result<DatapathMode, StartError> {
    match configured {
        DatapathMode::Veth => Ok(DatapathMode::Veth),
        DatapathMode::Netkit | DatapathMode::NetkitL2 => match probe_netkit() {
            NetkitSupport::Supported => Ok(configured),
            NetkitSupport::Unsupported { reason } => {
                Err(StartError::NetkitMissing { configured, reason })
            }
        },
        DatapathMode::Auto => match probe_netkit() {
            NetkitSupport::Supported => Ok(DatapathMode::Netkit),
            NetkitSupport::Unsupported { reason } => {
                tracing::info!("datapath-mode auto: using veth ({reason})");
                Ok(DatapathMode::Veth)
            }
        },
    }
}

/// What the embedded operator decides the node's addresses from.
fn embedded_mode(
    config: &DaemonConfig,
    pools: &[PoolDef],
    default_pool: Option<&str>,
) -> EmbeddedMode {
    match (&config.cluster_pool, &config.multi_pool, config.ipam) {
        (Some(cp), _, _) => EmbeddedMode::ClusterPool(cp.clone()),
        (_, Some(m), _) => {
            let default_pool = default_pool.unwrap_or(&m.default_pool);
            if !pools.iter().any(|p| p.name == default_pool) {
                tracing::warn!(
                    pool = default_pool,
                    "the default pool does not exist (yet): pods that no annotation or selector places will not get addresses"
                );
            }
            EmbeddedMode::MultiPool {
                pools: pools.to_vec(),
                default_pool: default_pool.to_string(),
                migrate_cluster_pool: m.migrate_cluster_pool,
            }
        }
        (_, _, IpamMode::Kubernetes) => EmbeddedMode::Kubernetes {
            pod_cidrs: config.pod_cidrs.clone(),
            enable_ipv4: config.families.contains(&Family::V4),
            enable_ipv6: config.families.contains(&Family::V6),
        },
        _ => EmbeddedMode::Delegated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::config::resolved_options as resolved;

    fn mtus_of(args: &[&str]) -> Mtus {
        let (opts, config) = resolved(args);
        mtus(&config, &opts)
    }

    #[test]
    fn a_rebuilt_node_takes_no_cidr_of_a_family_whose_mask_size_does_not_fit() {
        let (_, config) = resolved(&[
            "--k8s-kubeconfig-path",
            "/nonexistent",
            "--enable-ipv6",
            "--cluster-pool-ipv4-cidr",
            "10.0.0.0/8",
            "--cluster-pool-ipv6-cidr",
            "fd00::/104",
            "--cluster-pool-ipv6-mask-size",
            "121",
        ]);
        let routers = ["10.0.7.1", "fd00::7:1"].map(|ip| ip.parse::<IpAddr>().unwrap());
        let node = rebuilt_node("n1", &config, &routers).unwrap();
        assert_eq!(
            node.spec.ipam.pod_cidrs,
            vec!["10.0.7.0/24".parse::<IpNet>().unwrap()]
        );
    }

    #[test]
    fn the_pod_mtu_leaves_room_for_the_underlays_outer_header() {
        let base = ["--mtu", "1500", "--k8s-kubeconfig-path", "/nonexistent"];
        for (extra, pod) in [
            (&["--underlay-protocol", "ipv4"][..], 1450),
            (&["--underlay-protocol", "ipv6"], 1430),
            (&["--routing-mode", "native"], 1500),
        ] {
            let m = mtus_of(&[&base[..], extra].concat());
            assert_eq!((m.pod, m.device), (pod, 1500), "{extra:?}");
        }
    }
}
