//! The node daemon (`podnet daemon`): resolves its options, takes the socket lock,
//! opens the journal, asks the node backend's source what the node owns (and the
//! embedded operator, where it plays the operator, to carve it), restores, replays
//! the DEL queue, reconciles with the kernel, reserves the router addresses and
//! sets up the router device, then serves the REST API on the unix socket, applies
//! the backend's events, flushes the node outbox to the backend's sink, and runs
//! the expiration and cooldown timers.

mod block_wait;
pub mod capabilities;
mod cniconf;
pub mod config;
pub mod crossnode;
mod devices;
mod heap;
pub mod metrics;
pub mod nft;
pub mod options;
mod routes;
pub(crate) mod server;
pub mod source_check;
pub mod state;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::Duration;

use ipnet::IpNet;

use crate::api::delete_queue::{DeleteQueue, read_entry};
use crate::api::models::EndpointBatchDeleteRequest;
use crate::api::start_note;
use crate::datapath::{NetkitSupport, probe_netkit};
use crate::ipam::Family;
use crate::ipam::pooldef::PoolDef;
use crate::node::external::{ExternalSink, ExternalSource};
use crate::node::kubernetes::{KubernetesConfig, KubernetesMode, kubernetes_backend};
use crate::node::manifest_source::ManifestSource;
use crate::node::{
    BackendHealth, EmbeddedMode, EmbeddedOperator, NodeEvent, NodeOperator, NodeResource, NodeSink,
    NodeSource,
};
use crate::store::{Journal, Snapshot, StoreError, now_ms};
use config::{BackendKind, DaemonConfig, DatapathMode, IpamMode, RoutingMode};
use options::{DaemonOptions, OptionsError};
use state::{
    ApiError, IpamState, JournalOrigin, MultiPoolSettings, NODE_META_KEY, PoolingMode, StateConfig,
    Timer,
};

/// A state call's result, with the timers it queued and the stale host links.
type Locked<T> = (Result<T, ApiError>, Vec<Timer>, Vec<state::StaleLink>);

/// The running daemon, shared by every connection and timer.
pub struct Daemon {
    state: Mutex<IpamState>,
    queue: DeleteQueue,
    backend: Arc<BackendHealth>,
    /// The cross-node datapath's status, when it runs.
    cross_node: Option<crossnode::SharedStatus>,
    /// Counts the node events applied; allocations waiting for blocks watch it.
    node_events: tokio::sync::watch::Sender<u64>,
    /// The source check runs (`--enable-source-ip-verification`).
    source_check: bool,
    /// Raised by an allocation that waits for blocks: the outbox flusher then
    /// writes the demand (which counts the waiting requests) without waiting out
    /// the update rate.
    demand_waiting: tokio::sync::Notify,
}

impl Daemon {
    /// Runs `f` on the state, on a blocking thread (the journal commit blocks), arms
    /// the timers the call queued and removes the host links of expired addresses.
    /// For the daemon's background work (timers, node events, metrics scrapes); the
    /// API's routes use [`Daemon::with_state_in_place`].
    pub async fn with_state<T, F>(self: &Arc<Self>, f: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(&mut IpamState) -> Result<T, ApiError> + Send + 'static,
    {
        let d = self.clone();
        let done = tokio::task::spawn_blocking(move || d.locked(f))
            .await
            .map_err(|e| ApiError::new(500, format!("internal error: {e}")))?;
        self.after(done)
    }

    /// Runs `f` on the state right here, on the worker thread that serves the
    /// request, so the request waits for no other thread: neither for a blocking
    /// thread to wake up nor for a worker to be woken again to write the answer (the
    /// two cross-thread wake-ups of `spawn_blocking`, expensive on a two-vCPU
    /// node: BENCHMARKS.md). When the state's lock is free, `f` runs at once: only the
    /// lock's holder ever blocks a worker, for one commit, and the other worker
    /// goes on serving (timers, watches, other connections). When it is held, the
    /// worker first hands its other tasks to another thread (`block_in_place`),
    /// then waits for the lock: a burst never blocks the runtime. Needs the
    /// multi-thread runtime.
    pub fn with_state_in_place<T, F>(self: &Arc<Self>, f: F) -> Result<T, ApiError>
    where
        F: FnOnce(&mut IpamState) -> Result<T, ApiError>,
    {
        let done = match self.state.try_lock() {
            Ok(mut st) => run_locked(&mut st, f),
            Err(TryLockError::Poisoned(p)) => run_locked(&mut p.into_inner(), f),
            Err(TryLockError::WouldBlock) => tokio::task::block_in_place(|| self.locked(f)),
        };
        self.after(done)
    }

    /// Runs `f` once the state's lock is free (see [`run_locked`]).
    fn locked<T, F>(&self, f: F) -> Locked<T>
    where
        F: FnOnce(&mut IpamState) -> Result<T, ApiError>,
    {
        run_locked(&mut self.state.lock().unwrap_or_else(|p| p.into_inner()), f)
    }

    /// Arms the timers a state call queued and removes, in the background, the host
    /// links it left stale.
    fn after<T>(self: &Arc<Self>, (result, timers, stale): Locked<T>) -> Result<T, ApiError> {
        self.arm_timers(timers);
        if !stale.is_empty() {
            tokio::task::spawn_blocking(move || stale.iter().for_each(devices::remove_stale_link));
        }
        result
    }

    /// Arms one task per timer.
    fn arm_timers(self: &Arc<Self>, timers: Vec<Timer>) {
        for t in timers {
            let d = self.clone();
            tokio::spawn(async move {
                let wait = t.deadline_ms.saturating_sub(now_ms());
                tokio::time::sleep(Duration::from_millis(wait)).await;
                let _ = d
                    .with_state(move |s| Ok(s.fire(&t, &devices::host_link_marker)))
                    .await;
            });
        }
    }

    /// The node backend, for status.
    pub fn backend_status(&self) -> crate::api::models::BackendStatus {
        crate::api::models::BackendStatus {
            kind: self.backend.kind.into(),
            location: self.backend.location(),
            watches: self.backend.watches(),
            waiting: self.backend.waiting(),
        }
    }

    /// The cross-node datapath, for status (None when it is off).
    pub fn cross_node_status(&self) -> Option<crate::api::models::CrossNodeStatus> {
        self.cross_node
            .as_ref()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }

    /// DELs waiting in the on-disk queue (normally none while the daemon runs).
    pub fn queue_depth(&self) -> usize {
        self.queue.entries().map(|e| e.len()).unwrap_or(0)
    }

    /// Queue entries set aside because they could not be used, until someone
    /// removes them.
    pub fn queue_unreadable(&self) -> Vec<PathBuf> {
        self.queue.unreadable_entries().unwrap_or_default()
    }

    /// The metrics text, with the gauges brought up to date.
    pub async fn metrics_text(self: &Arc<Self>) -> Result<String, ApiError> {
        let depth = self.queue_depth();
        let unreadable = self.queue_unreadable().len();
        let drops = self.source_check_listing().await.map(|l| l.drops);
        self.with_state(move |s| {
            s.refresh_gauges(s.metrics());
            if let Some(drops) = &drops {
                s.metrics().source_check_drops(drops);
            }
            s.metrics().queue_depth.set(depth as i64);
            s.metrics().queue_bad_entries.set(unreadable as i64);
            Ok(s.metrics().encode())
        })
        .await
    }

    /// The source check's table as the kernel has it (None when the check is off
    /// or the table cannot be read, which the log says).
    pub async fn source_check_listing(&self) -> Option<source_check::Listing> {
        if !self.source_check {
            return None;
        }
        match tokio::task::spawn_blocking(source_check::read).await {
            Ok(Ok(listing)) => listing,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot read the source check's counters");
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "source check read task failed");
                None
            }
        }
    }

    /// Deletes a DEL's links in the background, then lets the held addresses go.
    /// A link that cannot be deleted keeps them held (the next start retries).
    pub fn spawn_teardown(self: &Arc<Self>, teardown: state::Teardown) {
        let d = self.clone();
        tokio::spawn(async move {
            let (links, ips) = (teardown.links.clone(), teardown.ips.clone());
            let deleted = tokio::task::spawn_blocking(move || {
                let r = devices::delete_links_checked(&links);
                devices::prune_pod_rules(|ip| ips.contains(&ip));
                r
            })
            .await;
            match deleted {
                Ok(Ok(())) => {
                    let key = teardown.key.clone();
                    if let Err(e) = d.with_state(move |s| s.finish_teardown(&key)).await {
                        tracing::error!(error = %e.message, "could not journal the end of a teardown; it is retried once the journal works again");
                    }
                }
                Ok(Err(e)) => {
                    tracing::error!(error = %e, key = %teardown.key, "link teardown failed; the addresses stay held until the next start")
                }
                Err(e) => tracing::error!(error = %e, "link teardown task failed"),
            }
        });
    }

    /// Deletes the host-side links of garbage-collected attachments that still exist.
    pub async fn remove_host_links(&self, attachments: Vec<(String, String)>) {
        let res =
            tokio::task::spawn_blocking(move || devices::remove_host_links(&attachments)).await;
        if let Err(e) = res {
            tracing::warn!(error = %e, "removing host links failed");
        }
    }
}

/// Runs `f` on the locked state; returns its result with the timers it queued and
/// the host links it left stale.
fn run_locked<T, F>(st: &mut IpamState, f: F) -> Locked<T>
where
    F: FnOnce(&mut IpamState) -> Result<T, ApiError>,
{
    let r = f(st);
    (r, st.take_timers(), st.take_stale_links())
}

/// Entry point of `podnet daemon`; returns the process exit code.
pub fn run(args: &[String]) -> i32 {
    let opts = match DaemonOptions::parse_with_config_dir(args) {
        Ok(o) => o,
        Err(OptionsError::Flags(e)) => e.exit(),
        Err(OptionsError::ConfigDir(e)) => {
            eprintln!("podnet daemon: {e}");
            return 1;
        }
    };
    crate::logging::init_stderr(&opts.log_level);
    match start(opts) {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("podnet daemon: {e}");
            1
        }
    }
}

fn start(opts: DaemonOptions) -> Result<(), String> {
    let config = DaemonConfig::resolve(&opts)?;
    capabilities::check(&config).map_err(|e| e.to_string())?;
    crossnode::check_prerequisites(&config.cross_node)?;
    let node_name = match &opts.node_name {
        Some(n) if !n.is_empty() => n.clone(),
        _ => nix::unistd::gethostname()
            .map_err(|e| format!("cannot read the host name ({e}); set --k8s-node-name"))?
            .to_string_lossy()
            .to_string(),
    };
    let datapath_mode = resolve_datapath_mode(config.datapath)?;
    heap::tune();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let lock = server::lock_socket(&opts.socket)?;
    server::ensure_private_dir(&opts.state_dir, "state directory")?;
    // First, so a journal this podnet refuses (a newer format) leaves the node
    // as it found it.
    let (journal, snapshot, origin, current) = open_journal(
        &opts.state_dir.join("journal.redb"),
        opts.rebuild_from_kernel,
    )?;
    let source_check = opts.enable_source_ip_verification;
    set_up_source_check(source_check)?;
    let health = backend_health(&config, &opts);
    // Until the socket answers, what the start waits for is in the lock file.
    let note = lock.path().to_path_buf();
    health.on_waiting(Some(Box::new(move |waiting: &[String]| {
        if let Err(e) = start_note::write(&note, waiting) {
            tracing::warn!(error = %e, file = %note.display(), "cannot note what the start waits for");
        }
    })));
    let (mut source, sink) = node_source(
        &config,
        &opts,
        &node_name,
        runtime.handle(),
        current.clone(),
        &health,
    );
    let view = source.initial().map_err(|e| e.to_string())?;
    let default_pool = config.multi_pool.as_ref().map(|m| {
        view.default_pool
            .clone()
            .unwrap_or_else(|| m.default_pool.clone())
    });
    // The embedded backend plays the operator for this node; an external IPAM
    // needs none.
    let embedded = config.backend == BackendKind::Embedded;
    let mut operator: Option<Box<dyn NodeOperator>> = (embedded && !config.ipam.is_external())
        .then(|| {
            Box::new(EmbeddedOperator::new(
                &node_name,
                embedded_mode(&config, &view.pools, default_pool.as_deref()),
            )) as Box<dyn NodeOperator>
        });
    let router_hints = devices::router_addresses();
    // A journal that knows nothing (rebuilt, or new on a node whose router device
    // shows that podnet ran here) takes the node's CIDRs from the router device.
    let current = match origin {
        JournalOrigin::Rebuilt => rebuilt_node(&node_name, &config, &router_hints),
        JournalOrigin::Created if !router_hints.is_empty() => {
            tracing::warn!(
                routers = ?router_hints,
                "the journal is new, but the router device shows that podnet ran on this node: taking the node's CIDRs from it and adopting the pods' addresses from their host links"
            );
            rebuilt_node(&node_name, &config, &router_hints)
        }
        _ => current,
    };
    let node = match (operator.as_mut(), view.node) {
        (Some(op), _) => op.sync(current).map_err(|e| e.to_string())?,
        (None, Some(node)) => node,
        (None, None) => current.unwrap_or_else(|| NodeResource::new(&node_name)),
    };
    let cidrs: Vec<String> = if node.spec.ipam.pod_cidrs.is_empty() {
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
    };
    let pooling = match (&config.multi_pool, config.ipam) {
        (_, IpamMode::Eni) => PoolingMode::External { eni: true },
        (_, mode) if mode.is_external() => PoolingMode::External { eni: false },
        (Some(m), _) => PoolingMode::MultiPool(MultiPoolSettings {
            default_pool: default_pool
                .clone()
                .unwrap_or_else(|| m.default_pool.clone()),
            configured_default_pool: m.default_pool.clone(),
            pre_allocation: m.pre_allocation.clone(),
            only_masquerade_default_pool: m.only_masquerade_default_pool,
        }),
        _ => PoolingMode::HostScope,
    };
    let device_mtu = if opts.mtu > 0 {
        opts.mtu
    } else {
        devices::default_route_mtu().unwrap_or(1500)
    };
    // Pods in tunnel mode leave room for the encapsulation, so a full-size pod
    // packet crosses the node's device unfragmented.
    let mtu = match config.cross_node.routing {
        RoutingMode::Tunnel => device_mtu.saturating_sub(crossnode::TUNNEL_OVERHEAD),
        RoutingMode::Native => device_mtu,
    };
    let cfg = StateConfig {
        node_name: node_name.clone(),
        ipam_mode: config.ipam,
        expiration: opts.ipam_expiration,
        cooldown: opts.ipam_release_cooldown,
        mtu,
        reserve_health: opts.enable_health_checking,
        reserve_ingress: opts.enable_ingress_controller,
        datapath_mode,
        configured_datapath_mode: config.datapath,
        fixed_routers: config.fixed_routers.clone(),
        families: config.families.clone(),
        pooling,
    };
    let metrics = Arc::new(metrics::Metrics::new(&opts.metrics_prefix));
    let mut state =
        IpamState::restore(cfg, journal, node, operator, view.pools, snapshot, metrics)?;
    if let Some(meta) = view.metadata {
        state.set_metadata(meta);
    }

    // Replay the DELs queued while the daemon was down, holding the queue lock
    // until the socket accepts requests (a plugin that waits for the lock then
    // finds the daemon up).
    let queue = DeleteQueue::open(&opts.socket)?;
    let queue_lock = queue.lock_exclusive()?;
    queue.remove_partial_writes();
    let queued = read_queue(&queue)?;
    let replayed = apply_queued(&mut state, &queued)?;
    remove_queued(&queued)?;
    state.note_queued_deletes(replayed);
    let kernel = devices::kernel_view()?;
    let reconciled = state.reconcile_with_kernel(&kernel, origin)?;
    devices::delete_links(&reconciled.links_to_delete);
    state.reserve_infra_addresses(&router_hints)?;
    for td in state.pending_teardowns() {
        devices::delete_links_checked(&td.links)?;
        state.finish_teardown(&td.key).map_err(|e| e.message)?;
    }
    // ENI-class rules of addresses no pod holds any more (DELs while the daemon was
    // down, crashes).
    let live = state.live_addresses();
    devices::prune_pod_rules(|ip| !live.contains(&ip));
    state.finish_restore();
    let routers: Vec<IpAddr> = state.router_ips();
    devices::setup_router(&routers, mtu, &opts.procfs)?;
    let report = state.restore_report().clone();
    tracing::info!(
        node = %node_name,
        cidrs = ?cidrs.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
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
    let timers = state.take_timers();
    heap::trim();
    let socket = opts.socket.clone();
    let metrics_addr = opts.prometheus_serve_addr.clone();
    let update_rate = opts.node_update_rate;
    let (cross_node, backend_kind) = (config.cross_node.clone(), config.backend.clone());
    let masquerades = cross_node.masquerade_v4 || cross_node.masquerade_v6;
    let (cni_conf_dir, cni_log_file, cni_exclusive, cni_uninstall) = (
        opts.write_cni_conf_when_ready.clone(),
        opts.cni_log_file.clone(),
        opts.cni_exclusive,
        opts.cni_uninstall,
    );
    runtime.block_on(async move {
        let listener = server::bind(&socket)?;
        drop(queue_lock);
        health.on_waiting(None);
        start_note::write(lock.path(), &[])
            .map_err(|e| format!("cannot clear {}: {e}", lock.path().display()))?;
        let cross_node_status = cross_node
            .is_active()
            .then(|| crossnode::new_status(&cross_node));
        let daemon = Arc::new(Daemon {
            state: Mutex::new(state),
            queue,
            backend: health.clone(),
            cross_node: cross_node_status.clone(),
            node_events: tokio::sync::watch::Sender::new(0),
            source_check,
            demand_waiting: tokio::sync::Notify::new(),
        });
        daemon.arm_timers(timers);
        if !metrics_addr.is_empty() {
            let tcp = server::bind_metrics(&metrics_addr).await?;
            let d = daemon.clone();
            tokio::spawn(server::serve_metrics(tcp, move || {
                let d = d.clone();
                async move { d.metrics_text().await.unwrap_or_else(|e| e.message) }
            }));
        }
        let (events_tx, events) = tokio::sync::mpsc::channel(16);
        tokio::spawn(source.watch(events_tx));
        tokio::spawn(apply_node_events(daemon.clone(), events));
        if let Some(sink) = sink {
            tokio::spawn(flush_outbox(daemon.clone(), sink, update_rate));
        }
        tokio::spawn(keep_journal_working(daemon.clone()));
        if source_check {
            tokio::spawn(keep_source_check());
        }
        if let Some(status) = cross_node_status {
            let feed = match backend_kind {
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
                cross_node,
                device_mtu,
                node_name,
                feed,
                status,
            ));
        }
        let written_conf = if cni_conf_dir.is_empty() {
            None
        } else {
            let path = cniconf::write(Path::new(&cni_conf_dir), &socket, &cni_log_file, cni_exclusive)?;
            tracing::info!(path = %path.display(), "wrote the CNI config");
            Some(path)
        };
        tracing::info!(socket = %socket.display(), lock = %lock.path().display(), "podnet daemon ready");
        // The accept loop runs on a worker, not on this thread: a connection it
        // spawns then starts on the same worker, without a cross-thread wake-up.
        if let Err(e) = tokio::spawn(server::serve(listener, daemon, shutdown_signal())).await {
            tracing::error!(error = %e, "the API server stopped");
        }
        if let Some(path) = written_conf.filter(|_| cni_uninstall) {
            match cniconf::remove(&path) {
                Ok(()) => tracing::info!(path = %path.display(), "removed the CNI config (cni-uninstall)"),
                Err(e) => tracing::warn!(error = %e, "cni-uninstall"),
            }
        }
        if cni_uninstall && masquerades {
            match crossnode::masquerade::remove_tables() {
                Ok(()) => tracing::info!(table = crossnode::masquerade::TABLE, "removed the masquerade tables (cni-uninstall)"),
                Err(e) => tracing::warn!(error = %e, "cni-uninstall: the masquerade tables"),
            }
        }
        if cni_uninstall && source_check {
            match source_check::remove() {
                Ok(()) => tracing::info!(table = source_check::TABLE, "removed the source check table (cni-uninstall)"),
                Err(e) => tracing::warn!(error = %e, "cni-uninstall: the source check table"),
            }
        }
        let _ = std::fs::remove_file(&socket);
        tracing::info!("podnet daemon stopped");
        Ok::<(), String>(())
    })
}

/// Installs the source check's table before any pod is served (kept as it is
/// when the kernel already has it, so its counters survive a restart), or
/// removes it when the check is off.
fn set_up_source_check(enabled: bool) -> Result<(), String> {
    if !enabled {
        if let Err(e) = source_check::remove() {
            tracing::warn!(error = %e, "--enable-source-ip-verification=false: could not remove the source check table");
        }
        tracing::warn!(
            "source check off (--enable-source-ip-verification=false): pods can send with any source address"
        );
        return Ok(());
    }
    let ensured = source_check::ensure().map_err(|e| e.to_string())?;
    tracing::info!(table = source_check::TABLE, outcome = ?ensured, "source check");
    Ok(())
}

/// Puts the source check's table back when someone removed or changed it.
async fn keep_source_check() {
    loop {
        tokio::time::sleep(source_check::RESYNC).await;
        match tokio::task::spawn_blocking(source_check::ensure).await {
            Ok(Ok(source_check::Ensured::Kept)) => {}
            Ok(Ok(ensured)) => {
                tracing::warn!(table = source_check::TABLE, outcome = ?ensured, "the source check table was missing or changed; podnet's is back")
            }
            Ok(Err(e)) => tracing::error!(error = %e, "source check: cannot check the table"),
            Err(e) => tracing::error!(error = %e, "source check task failed"),
        }
    }
}

/// Opens and reads the journal, including the node resource it holds. With
/// `rebuild`, a journal that cannot be read for any reason (a damaged file, a
/// record or the node resource that does not decode) is moved aside (never
/// deleted) and an empty one started.
fn open_journal(
    path: &Path,
    rebuild: bool,
) -> Result<(Journal, Snapshot, JournalOrigin, Option<NodeResource>), String> {
    let read = match Journal::open(path) {
        // Written by a newer podnet: refused as it is, never moved aside.
        Err(e @ StoreError::NewerFormat { .. }) => return Err(e.to_string()),
        opened => opened,
    };
    let read = read.map_err(|e| e.to_string()).and_then(|(j, s)| {
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
            Ok((j, s, origin, node))
        }
        Err(e) if rebuild => {
            let aside = path.with_extension(format!("redb.corrupt-{}", now_ms()));
            tracing::warn!(error = %e, aside = %aside.display(), "journal unreadable: moving it aside and rebuilding from the kernel");
            std::fs::rename(path, &aside)
                .map_err(|re| format!("{e}; and it could not be moved aside: {re}"))?;
            let (j, _) = Journal::open(path).map_err(|e| e.to_string())?;
            Ok((j, Snapshot::default(), JournalOrigin::Rebuilt, None))
        }
        Err(e) => Err(e),
    }
}

/// The node resource the journal holds.
fn stored_node(snapshot: &Snapshot, journal: &Journal) -> Result<Option<NodeResource>, String> {
    snapshot
        .meta
        .iter()
        .find(|(k, _)| k == NODE_META_KEY)
        .map(|(_, v)| serde_json::from_value(v.clone()))
        .transpose()
        .map_err(|e| {
            format!(
                "journal {}: the node resource record is corrupt: {e}. Restart the daemon with --rebuild-from-kernel to move the journal aside and rebuild the allocations from the pods' host links and routes",
                journal.path().display()
            )
        })
}

/// In a rebuild, the node's CIDRs are those that hold the router device's addresses.
fn rebuilt_node(
    node_name: &str,
    config: &DaemonConfig,
    routers: &[IpAddr],
) -> Option<NodeResource> {
    let cfg = config.cluster_pool.as_ref()?;
    let mut node = NodeResource::new(node_name);
    for ip in routers {
        let mask = if ip.is_ipv4() {
            cfg.ipv4_mask_size
        } else {
            cfg.ipv6_mask_size
        };
        if let Ok(net) = IpNet::new(*ip, mask) {
            node.spec.ipam.pod_cidrs.push(net.trunc());
        }
    }
    Some(node)
}

/// The queued DELs, read outside the state lock. A corrupt entry is renamed
/// `*.bad` and reported (in the log, and in status and metrics while it is
/// there): the daemon does not guess what it meant.
fn read_queue(queue: &DeleteQueue) -> Result<Vec<(PathBuf, EndpointBatchDeleteRequest)>, String> {
    let mut out = Vec::new();
    for path in queue.entries()? {
        match read_entry(&path) {
            Ok(req) => out.push((path, req)),
            Err(e) => match queue.set_aside(&path) {
                Ok(bad) => tracing::error!(
                    "{e}; renamed it to {} and leaving its addresses to GC or the expiration timer",
                    bad.display()
                ),
                Err(re) => tracing::error!("{e}; and it could not be set aside: {re}"),
            },
        }
    }
    Ok(out)
}

/// Applies queued DELs to the state (one already applied counts as done).
fn apply_queued(
    state: &mut IpamState,
    queued: &[(PathBuf, EndpointBatchDeleteRequest)],
) -> Result<usize, String> {
    for (path, req) in queued {
        match state.delete_endpoints(req) {
            Ok(_) => {}
            Err(e) if e.status == 404 => {}
            Err(e) => return Err(format!("replaying {}: {}", path.display(), e.message)),
        }
        tracing::info!(container = ?req.container_id, ifname = ?req.container_interface_name, "replayed a queued DEL");
    }
    Ok(queued.len())
}

/// Removes queue entries that were applied.
fn remove_queued(queued: &[(PathBuf, EndpointBatchDeleteRequest)]) -> Result<(), String> {
    for (path, _) in queued {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot remove {}: {e}", path.display())),
        }
    }
    Ok(())
}

/// Keeps the journal working while the daemon serves: once a second, a failed
/// journal (a full disk) is reopened and checked against memory; after that the
/// teardowns it could not finish are retried. DELs that plugins queued meanwhile
/// (the daemon answered 503) are replayed as soon as the journal commits again.
async fn keep_journal_working(daemon: Arc<Daemon>) {
    loop {
        tokio::time::sleep(JOURNAL_CHECK_INTERVAL).await;
        let recovered = daemon
            .with_state(|s| Ok(s.recover_journal()))
            .await
            .ok()
            .flatten();
        match recovered {
            Some(false) => continue,
            Some(true) => {
                if let Ok(teardowns) = daemon.with_state(|s| Ok(s.pending_teardowns())).await {
                    for td in teardowns {
                        daemon.spawn_teardown(td);
                    }
                }
            }
            None => {}
        }
        let d = daemon.clone();
        let queued = match tokio::task::spawn_blocking(move || read_queue(&d.queue)).await {
            Ok(Ok(q)) if !q.is_empty() => q,
            Ok(Ok(_)) => continue,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot read the DEL queue");
                continue;
            }
            Err(_) => continue,
        };
        let queued = Arc::new(queued);
        let q = queued.clone();
        match daemon
            .with_state(move |s| {
                let n = apply_queued(s, &q).map_err(|e| ApiError::new(503, e))?;
                s.note_queued_deletes(n);
                Ok(n)
            })
            .await
        {
            Ok(n) => {
                let removed = tokio::task::spawn_blocking(move || remove_queued(&queued)).await;
                if let Ok(Err(e)) = removed {
                    tracing::warn!(error = %e, "queued DELs were applied but not removed (replaying them again is harmless)");
                }
                tracing::info!(
                    replayed = n,
                    "replayed DELs queued while the daemon could not take them"
                );
            }
            Err(e) => tracing::warn!(error = %e.message, "queued DELs not replayed yet"),
        }
    }
}

/// How often the journal's health and the DEL queue are checked while serving.
const JOURNAL_CHECK_INTERVAL: Duration = Duration::from_secs(1);

pub(crate) async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
        }
        _ => std::future::pending::<()>().await,
    }
}

/// Applies the backend's events to the state, one at a time. A change the state
/// refuses (a pool edit that breaks what the node uses) keeps the previous state,
/// and the log says why.
async fn apply_node_events(
    daemon: Arc<Daemon>,
    mut events: tokio::sync::mpsc::Receiver<NodeEvent>,
) {
    while let Some(event) = events.recv().await {
        let (what, applied) = match event {
            NodeEvent::Node(node) => (
                "node resource",
                daemon
                    .with_state(move |s| {
                        s.set_external_node(*node);
                        Ok(())
                    })
                    .await,
            ),
            NodeEvent::Pools(defs) => (
                "pool definitions",
                daemon
                    .with_state(move |s| s.set_pool_defs(defs).map_err(|e| ApiError::new(409, e)))
                    .await,
            ),
            NodeEvent::DefaultPool(pool) => (
                "default pool",
                daemon
                    .with_state(move |s| {
                        s.set_default_pool(pool);
                        Ok(())
                    })
                    .await,
            ),
            NodeEvent::Metadata(meta) => (
                "pod and namespace metadata",
                daemon
                    .with_state(move |s| {
                        s.set_metadata(meta);
                        Ok(())
                    })
                    .await,
            ),
        };
        daemon.node_events.send_modify(|n| *n += 1);
        match applied {
            Ok(()) => tracing::info!("{what} reloaded"),
            Err(e) => {
                tracing::error!(error = %e.message, "{what} not applied; keeping the previous state")
            }
        }
    }
}

/// The shortest time between two flushes when allocations wait for blocks.
const WAITING_FLUSH_INTERVAL: Duration = Duration::from_secs(1);

/// Flushes the state's outbox to the backend's sink once per `rate` (Cilium's
/// `ipam-cilium-node-update-rate`), outside the state's lock; sooner, but at most
/// once per [`WAITING_FLUSH_INTERVAL`], while allocations wait for blocks (their
/// demand would otherwise reach the operator up to a whole `rate` later).
async fn flush_outbox(daemon: Arc<Daemon>, sink: Box<dyn NodeSink>, rate: Duration) {
    let sink = Arc::new(Mutex::new(sink));
    loop {
        let started = tokio::time::Instant::now();
        if let Ok(outbox) = daemon
            .with_state(|s| Ok(s.take_outbox().unwrap_or_default()))
            .await
        {
            let sink = sink.clone();
            let flushed = tokio::task::spawn_blocking(move || {
                sink.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .flush(&outbox)
            })
            .await;
            match flushed {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "could not write the node resource"),
                Err(e) => tracing::warn!(error = %e, "node resource writer failed"),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep_until(started + rate) => {}
            _ = daemon.demand_waiting.notified() => {
                tokio::time::sleep_until(started + WAITING_FLUSH_INTERVAL.min(rate)).await;
            }
        }
    }
}

/// The pod device type for `--datapath-mode`: netkit is checked here, at start, so
/// a kernel without it fails the daemon, never a pod's ADD.
fn resolve_datapath_mode(configured: DatapathMode) -> Result<DatapathMode, String> {
    match configured {
        DatapathMode::Veth => Ok(DatapathMode::Veth),
        DatapathMode::Netkit | DatapathMode::NetkitL2 => match probe_netkit() {
            NetkitSupport::Supported => Ok(configured),
            NetkitSupport::Unsupported { reason } => Err(format!(
                "--datapath-mode={configured}: {reason}; use veth or auto"
            )),
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

/// The backend's source, and its sink where it has one: an external IPAM's
/// CiliumNode file (crd, azure, alibabacloud, eni), else the embedded backend's
/// manifest directories.
fn node_source(
    config: &DaemonConfig,
    opts: &DaemonOptions,
    node_name: &str,
    runtime: &tokio::runtime::Handle,
    journal_node: Option<NodeResource>,
    health: &Arc<BackendHealth>,
) -> (Box<dyn NodeSource>, Option<Box<dyn NodeSink>>) {
    if let BackendKind::Kubernetes { kubeconfig } = &config.backend {
        let mode = match config.ipam {
            IpamMode::Kubernetes => KubernetesMode::Kubernetes,
            IpamMode::ClusterPool => KubernetesMode::ClusterPool,
            IpamMode::MultiPool => KubernetesMode::MultiPool,
            mode => KubernetesMode::External {
                eni: mode == IpamMode::Eni,
            },
        };
        let (source, sink) = kubernetes_backend(
            KubernetesConfig {
                kubeconfig: kubeconfig.clone(),
                node_name: node_name.to_string(),
                mode,
                ipv4: config.families.contains(&Family::V4),
                ipv6: config.families.contains(&Family::V6),
                needed: config.families.len() as u64 * (1 + opts.enable_health_checking as u64),
                initial_demand: config
                    .multi_pool
                    .as_ref()
                    .map(|m| m.initial_demand(&config.families, opts.enable_health_checking))
                    .unwrap_or_default(),
            },
            runtime.clone(),
            journal_node,
            health.clone(),
        );
        return (Box::new(source), Some(Box::new(sink)));
    }
    match (&opts.node_resource, config.ipam.is_external()) {
        (Some(path), true) => {
            let families = config.families.len() as u64;
            (
                Box::new(ExternalSource {
                    health: health.clone(),
                    node_name: node_name.to_string(),
                    path: path.clone(),
                    eni: config.ipam == IpamMode::Eni,
                    needed: families * (1 + opts.enable_health_checking as u64),
                }),
                Some(Box::new(ExternalSink { path: path.clone() })),
            )
        }
        _ => (
            Box::new(ManifestSource {
                health: health.clone(),
                pool_dir: opts.pool_dir.clone(),
                metadata_dir: opts.metadata_dir.clone(),
                auto_create: config
                    .multi_pool
                    .as_ref()
                    .map(|m| m.auto_create.clone())
                    .unwrap_or_default(),
                node_labels: config.node_labels.clone(),
            }),
            None,
        ),
    }
}

/// Which backend runs and where it reads from, for status.
fn backend_health(config: &DaemonConfig, opts: &DaemonOptions) -> Arc<BackendHealth> {
    let dirs = || {
        [&opts.pool_dir, &opts.metadata_dir]
            .into_iter()
            .flatten()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    };
    match (
        &config.backend,
        &opts.node_resource,
        config.ipam.is_external(),
    ) {
        (BackendKind::Kubernetes { kubeconfig }, _, _) => BackendHealth::new(
            "kubernetes",
            kubeconfig
                .as_ref()
                .map(|k| format!("kubeconfig {}", k.display()))
                .unwrap_or_else(|| "in-cluster service account".into()),
        ),
        (_, Some(path), true) => BackendHealth::new("file", path.display().to_string()),
        _ => BackendHealth::new("embedded", dirs()),
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
