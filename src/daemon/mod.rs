//! The node daemon (`podnet daemon`): reads its options, takes the socket lock,
//! restores the journal, lets the node backend say what the node owns, replays the
//! DEL queue, reconciles with the kernel, reserves the router addresses and sets up
//! the router device, then serves the REST API on the unix socket and runs the
//! expiration and cooldown timers.

mod cniconf;
mod devices;
pub mod metrics;
pub mod options;
mod routes;
mod server;
pub mod state;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipnet::IpNet;

use crate::api::delete_queue::{DeleteQueue, read_entry};
use crate::datapath::{NetkitSupport, probe_netkit};
use crate::ipam::Family;
use crate::ipam::clusterpool::{ClusterPoolConfig, parse_cidr_list};
use crate::ipam::pool_options::{parse_auto_create_pools, parse_pre_allocation};
use crate::ipam::pooldef::PoolDef;
use crate::node::cilium_node_file::CiliumNodeFile;
use crate::node::external::ExternalBackend;
use crate::node::manifests::ManifestDir;
use crate::node::{EmbeddedBackend, EmbeddedMode, NodeBackend, NodeResource};
use crate::store::{Journal, Snapshot, now_ms};
use options::{DaemonOptions, OptionsError};
use state::{
    ApiError, IpamState, MultiPoolSettings, NODE_META_KEY, PoolingMode, StateConfig, Timer,
};

/// The running daemon, shared by every connection and timer.
pub struct Daemon {
    state: Mutex<IpamState>,
    queue: DeleteQueue,
}

impl Daemon {
    /// Runs `f` on the state, on a blocking thread (the journal commit blocks), and
    /// arms the timers the call queued.
    pub async fn with_state<T, F>(self: &Arc<Self>, f: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(&mut IpamState) -> Result<T, ApiError> + Send + 'static,
    {
        let d = self.clone();
        let (result, timers) = tokio::task::spawn_blocking(move || {
            let mut st = d.state.lock().unwrap_or_else(|p| p.into_inner());
            let r = f(&mut st);
            (r, st.take_timers())
        })
        .await
        .map_err(|e| ApiError::new(500, format!("internal error: {e}")))?;
        self.arm_timers(timers);
        result
    }

    /// Arms one task per timer.
    fn arm_timers(self: &Arc<Self>, timers: Vec<Timer>) {
        for t in timers {
            let d = self.clone();
            tokio::spawn(async move {
                let wait = t.deadline_ms.saturating_sub(now_ms());
                tokio::time::sleep(Duration::from_millis(wait)).await;
                let _ = d.with_state(move |s| Ok(s.fire(&t))).await;
            });
        }
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
        self.with_state(move |s| {
            s.refresh_gauges(s.metrics());
            s.metrics().queue_depth.set(depth as i64);
            s.metrics().queue_bad_entries.set(unreadable as i64);
            Ok(s.metrics().encode())
        })
        .await
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
                        tracing::error!(error = %e.message, "could not journal the end of a teardown");
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
    let node_name = match &opts.node_name {
        Some(n) if !n.is_empty() => n.clone(),
        _ => nix::unistd::gethostname()
            .map_err(|e| format!("cannot read the host name ({e}); set --k8s-node-name"))?
            .to_string_lossy()
            .to_string(),
    };
    let pool_defs = load_pool_defs(&opts)?;
    let node_labels = parse_node_labels(&opts.node_labels)?;
    let default_pool = match opts
        .pool_dir
        .as_deref()
        .map(ManifestDir::load)
        .transpose()?
    {
        Some(dir) => dir
            .node_default_pool(&node_labels)
            .unwrap_or_else(|| opts.default_ip_pool.clone()),
        None => opts.default_ip_pool.clone(),
    };
    let external = external_mode(&opts)?;
    let mode = match external {
        Some(_) => EmbeddedMode::Delegated,
        None => embedded_mode(&opts, &pool_defs, &default_pool)?,
    };
    let lock = server::lock_socket(&opts.socket)?;
    server::ensure_private_dir(&opts.state_dir, "state directory")?;
    let (journal, snapshot, rebuilt) = open_journal(
        &opts.state_dir.join("journal.redb"),
        opts.rebuild_from_kernel,
    )?;
    let router_hints = devices::router_addresses();
    let current = if rebuilt {
        rebuilt_node(&node_name, &mode, &router_hints)
    } else {
        stored_node(&snapshot, &journal)?
    };
    let mut backend: Box<dyn NodeBackend> = match (&external, &opts.node_resource) {
        (Some(eni), Some(path)) => {
            let needed = opts.enable_ipv4 as u64 + opts.enable_ipv6 as u64;
            let needed = needed * (1 + opts.enable_health_checking as u64);
            Box::new(wait_for_external_ips(&node_name, path, *eni, needed)?)
        }
        _ => Box::new(EmbeddedBackend::new(&node_name, mode.clone())),
    };
    let node = backend.sync(current)?;
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
        node.spec.ipam.pod_cidrs.clone()
    };
    let pooling = match (&mode, external) {
        (_, Some(eni)) => PoolingMode::External { eni },
        (EmbeddedMode::MultiPool { .. }, None) => PoolingMode::MultiPool(MultiPoolSettings {
            default_pool: default_pool.clone(),
            pre_allocation: parse_pre_allocation(&opts.multi_pool_pre_allocation, &default_pool)
                .map_err(|e| format!("Invalid ipam-multi-pool-pre-allocation flag value: {e}"))?,
            only_masquerade_default_pool: opts.only_masquerade_default_pool,
        }),
        _ => PoolingMode::HostScope,
    };
    let families: Vec<Family> = [
        (opts.enable_ipv6, Family::V6),
        (opts.enable_ipv4, Family::V4),
    ]
    .into_iter()
    .filter(|(on, _)| *on)
    .map(|(_, f)| f)
    .collect();
    let mtu = if opts.mtu > 0 {
        opts.mtu
    } else {
        devices::default_route_mtu().unwrap_or(1500)
    };
    let cfg = StateConfig {
        node_name: node_name.clone(),
        ipam_mode: opts.ipam.clone(),
        expiration: opts.ipam_expiration,
        cooldown: opts.ipam_release_cooldown,
        mtu,
        reserve_health: opts.enable_health_checking,
        reserve_ingress: opts.enable_ingress_controller,
        datapath_mode: resolve_datapath_mode(&opts.datapath_mode)?,
        fixed_routers: fixed_routers(&opts)?,
        configured_datapath_mode: opts.datapath_mode.clone(),
        families,
        pooling,
    };
    let metrics = Arc::new(metrics::Metrics::new(&opts.metrics_prefix));
    let defs = backend.pools();
    let mut state = IpamState::restore(
        cfg,
        journal,
        node,
        backend,
        defs,
        snapshot,
        &router_hints,
        metrics,
    )?;
    if let Some(dir) = &opts.metadata_dir {
        state.set_metadata(Box::new(ManifestDir::load(dir)?));
    }

    // Replay the DELs queued while the daemon was down, holding the queue lock
    // until the socket accepts requests (a plugin that waits for the lock then
    // finds the daemon up).
    let queue = DeleteQueue::open(&opts.socket)?;
    let queue_lock = queue.lock_exclusive()?;
    replay_queue(&queue, &mut state)?;
    let kernel = devices::kernel_view()?;
    let reconciled = state.reconcile_with_kernel(&kernel, rebuilt)?;
    devices::delete_links(&reconciled.links_to_delete);
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
    devices::setup_router(&routers, mtu)?;
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
    release_restore_memory();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let socket = opts.socket.clone();
    let metrics_addr = opts.prometheus_serve_addr.clone();
    let watched = Watched {
        pool_dir: opts.pool_dir.clone(),
        metadata_dir: opts.metadata_dir.clone(),
        auto_create: opts.auto_create_pools.clone(),
        node_resource: external.and(opts.node_resource.clone()).zip(external),
        node_name: node_name.clone(),
    };
    let status_writer = external
        .and(opts.node_resource.clone())
        .map(|p| (p, opts.node_update_rate));
    let (cni_conf_dir, cni_log_file, cni_exclusive) = (
        opts.write_cni_conf_when_ready.clone(),
        opts.cni_log_file.clone(),
        opts.cni_exclusive,
    );
    runtime.block_on(async move {
        let listener = server::bind(&socket)?;
        drop(queue_lock);
        let daemon = Arc::new(Daemon { state: Mutex::new(state), queue });
        daemon.arm_timers(timers);
        if !metrics_addr.is_empty() {
            let tcp = server::bind_metrics(&metrics_addr).await?;
            tokio::spawn(server::serve_metrics(tcp, daemon.clone()));
        }
        tokio::spawn(watch_manifests(daemon.clone(), watched));
        if let Some((path, rate)) = status_writer {
            tokio::spawn(write_node_status(daemon.clone(), path, rate));
        }
        if !cni_conf_dir.is_empty() {
            let path = cniconf::write(Path::new(&cni_conf_dir), &socket, &cni_log_file, cni_exclusive)?;
            tracing::info!(path = %path.display(), "wrote the CNI config");
        }
        tracing::info!(socket = %socket.display(), lock = %lock.path().display(), "podnet daemon ready");
        server::serve(listener, daemon, shutdown_signal()).await;
        let _ = std::fs::remove_file(&socket);
        tracing::info!("podnet daemon stopped");
        Ok::<(), String>(())
    })
}

/// Opens and reads the journal. With `rebuild`, a journal that cannot be read is
/// moved aside (never deleted) and an empty one started; returns whether that
/// happened.
fn open_journal(path: &Path, rebuild: bool) -> Result<(Journal, Snapshot, bool), String> {
    let read = Journal::open(path).and_then(|j| j.load().map(|s| (j, s)));
    match read {
        Ok((j, s)) => Ok((j, s, false)),
        Err(e) if rebuild => {
            let aside = path.with_extension(format!("redb.corrupt-{}", now_ms()));
            tracing::warn!(error = %e, aside = %aside.display(), "journal unreadable: moving it aside and rebuilding from the kernel");
            std::fs::rename(path, &aside)
                .map_err(|re| format!("{e}; and it could not be moved aside: {re}"))?;
            let j = Journal::open(path).map_err(|e| e.to_string())?;
            Ok((j, Snapshot::default(), true))
        }
        Err(e) => Err(e.to_string()),
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
                "journal {}: node resource is corrupt: {e}",
                journal.path().display()
            )
        })
}

/// In a rebuild, the node's CIDRs are those that hold the router device's addresses.
fn rebuilt_node(node_name: &str, mode: &EmbeddedMode, routers: &[IpAddr]) -> Option<NodeResource> {
    let EmbeddedMode::ClusterPool(cfg) = mode else {
        return None;
    };
    let mut node = NodeResource::new(node_name);
    for ip in routers {
        let mask = if ip.is_ipv4() {
            cfg.ipv4_mask_size
        } else {
            cfg.ipv6_mask_size
        };
        if let Ok(net) = IpNet::new(*ip, mask) {
            node.spec.ipam.pod_cidrs.push(net.trunc().to_string());
        }
    }
    Some(node)
}

/// Replays and removes the queued DELs. A corrupt entry is renamed `*.bad` and
/// reported (in the log, and in status and metrics while it is there): the daemon
/// does not guess what it meant.
fn replay_queue(queue: &DeleteQueue, state: &mut IpamState) -> Result<(), String> {
    queue.remove_partial_writes();
    let mut n = 0;
    for path in queue.entries()? {
        match read_entry(&path) {
            Ok(req) => {
                match state.delete_endpoints(&req) {
                    Ok(_) => {}
                    Err(e) if e.status == 404 => {}
                    Err(e) => return Err(format!("replaying {}: {}", path.display(), e.message)),
                }
                tracing::info!(container = %req.container_id, ifname = %req.container_interface_name, "replayed a queued DEL");
                std::fs::remove_file(&path)
                    .map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
                n += 1;
            }
            Err(e) => match queue.set_aside(&path) {
                Ok(bad) => tracing::error!(
                    "{e}; renamed it to {} and leaving its addresses to GC or the expiration timer",
                    bad.display()
                ),
                Err(re) => tracing::error!("{e}; and it could not be set aside: {re}"),
            },
        }
    }
    state.note_queued_deletes(n);
    Ok(())
}

async fn shutdown_signal() {
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

/// The manifest directories (and node resource file) the daemon polls.
struct Watched {
    pool_dir: Option<PathBuf>,
    metadata_dir: Option<PathBuf>,
    auto_create: String,
    /// crd/eni: the node resource file, and whether it is eni mode.
    node_resource: Option<(PathBuf, bool)>,
    node_name: String,
}

/// How often the manifest directories are checked for changes.
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// Polls the pool and metadata directories and hands changes to the state. A
/// directory that does not parse keeps the previous state (and says why).
async fn watch_manifests(daemon: Arc<Daemon>, watched: Watched) {
    let stamp = |d: &Option<PathBuf>| d.as_deref().and_then(|d| ManifestDir::fingerprint(d).ok());
    let (mut pools_seen, mut meta_seen) = (stamp(&watched.pool_dir), stamp(&watched.metadata_dir));
    let node_stamp = || {
        watched
            .node_resource
            .as_ref()
            .and_then(|(p, _)| CiliumNodeFile::current_fingerprint(p).ok())
    };
    let mut node_seen = node_stamp();
    loop {
        tokio::time::sleep(WATCH_INTERVAL).await;
        let node_now = node_stamp();
        if node_now != node_seen
            && let Some((path, eni)) = &watched.node_resource
        {
            node_seen = node_now;
            let loaded = ExternalBackend::load(&watched.node_name, path, *eni)
                .and_then(|b| ExternalBackend::resolved(b.resource(), *eni));
            match loaded {
                Ok(node) => {
                    let _ = daemon
                        .with_state(move |s| {
                            s.set_external_node(node);
                            Ok(())
                        })
                        .await;
                    tracing::info!(file = %path.display(), "node resource reloaded");
                }
                Err(e) => {
                    tracing::error!(error = %e, "node resource not reloaded; keeping the previous one")
                }
            }
        }
        let pools_now = stamp(&watched.pool_dir);
        if pools_now != pools_seen {
            pools_seen = pools_now;
            let defs = pool_defs_from(watched.pool_dir.as_deref(), &watched.auto_create);
            let applied = match defs {
                Ok(defs) => {
                    daemon
                        .with_state(move |s| {
                            s.set_pool_defs(defs).map_err(|e| ApiError::new(409, e))
                        })
                        .await
                }
                Err(e) => Err(ApiError::new(400, e)),
            };
            match applied {
                Ok(()) => tracing::info!("pool definitions reloaded"),
                Err(e) => {
                    tracing::error!(error = %e.message, "pool definitions not applied; keeping the previous ones")
                }
            }
        }
        let meta_now = stamp(&watched.metadata_dir);
        if meta_now != meta_seen {
            meta_seen = meta_now;
            if let Some(dir) = watched.metadata_dir.clone() {
                match ManifestDir::load(&dir) {
                    Ok(m) => {
                        let _ = daemon
                            .with_state(move |s| {
                                s.set_metadata(Box::new(m));
                                Ok(())
                            })
                            .await;
                        tracing::info!("pod and namespace metadata reloaded");
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "metadata not reloaded; keeping the previous one")
                    }
                }
            }
        }
    }
}

/// crd/eni: writes the used addresses into the node resource's status, at most
/// once per `rate` (Cilium's `ipam-cilium-node-update-rate`).
async fn write_node_status(daemon: Arc<Daemon>, path: PathBuf, rate: Duration) {
    loop {
        if let Ok(Some(status)) = daemon.with_state(|s| Ok(s.take_external_status())).await {
            let p = path.clone();
            let written = tokio::task::spawn_blocking(move || {
                CiliumNodeFile::load(&p).and_then(|(f, _)| f.write_status(&status))
            })
            .await;
            match written {
                Ok(Ok(())) => tracing::debug!(file = %path.display(), "wrote status.ipam.used"),
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "could not write the node resource's status")
                }
                Err(e) => tracing::warn!(error = %e, "status writer failed"),
            }
        }
        tokio::time::sleep(rate).await;
    }
}

/// The pools of the pool directory plus the auto-created ones that it lacks.
fn pool_defs_from(pool_dir: Option<&Path>, auto_create: &str) -> Result<Vec<PoolDef>, String> {
    let mut defs: Vec<PoolDef> = match pool_dir {
        Some(dir) => ManifestDir::load(dir)?.pools().to_vec(),
        None => Vec::new(),
    };
    for auto in parse_auto_create_pools(auto_create)
        .map_err(|e| format!("auto-create-cilium-pod-ip-pools: {e}"))?
    {
        if !defs.iter().any(|d| d.name == auto.name) {
            defs.push(auto);
        }
    }
    Ok(defs)
}

fn load_pool_defs(opts: &DaemonOptions) -> Result<Vec<PoolDef>, String> {
    if opts.ipam != "multi-pool" {
        return Ok(Vec::new());
    }
    pool_defs_from(opts.pool_dir.as_deref(), &opts.auto_create_pools)
}

/// The pod device type for `--datapath-mode`: netkit is checked here, at start, so
/// a kernel without it fails the daemon, never a pod's ADD.
fn resolve_datapath_mode(configured: &str) -> Result<String, String> {
    match configured {
        "veth" => Ok("veth".into()),
        "netkit" | "netkit-l2" => match probe_netkit() {
            NetkitSupport::Supported => Ok(configured.into()),
            NetkitSupport::Unsupported { reason } => Err(format!(
                "--datapath-mode={configured}: {reason}; use veth or auto"
            )),
        },
        "auto" => match probe_netkit() {
            NetkitSupport::Supported => Ok("netkit".into()),
            NetkitSupport::Unsupported { reason } => {
                tracing::info!("datapath-mode auto: using veth ({reason})");
                Ok("veth".into())
            }
        },
        other => Err(format!(
            "--datapath-mode {other:?} is not one of veth, netkit, netkit-l2, auto"
        )),
    }
}

/// `--local-router-ipv4/6`; delegated-plugin mode defaults the IPv4 one to
/// 169.254.0.1 (the node answers ARP for it as a local address).
fn fixed_routers(opts: &DaemonOptions) -> Result<BTreeMap<Family, IpAddr>, String> {
    let mut out = BTreeMap::new();
    let delegated = opts.ipam == "delegated-plugin";
    for (value, family, on, name) in [
        (
            &opts.local_router_ipv4,
            Family::V4,
            opts.enable_ipv4,
            "local-router-ipv4",
        ),
        (
            &opts.local_router_ipv6,
            Family::V6,
            opts.enable_ipv6,
            "local-router-ipv6",
        ),
    ] {
        let value = if value.is_empty() && delegated && family == Family::V4 {
            "169.254.0.1"
        } else {
            value.as_str()
        };
        if value.is_empty() || !on {
            continue;
        }
        let ip: IpAddr = value
            .parse()
            .map_err(|_| format!("--{name} {value:?} is not an IP address"))?;
        if Family::of_addr(&ip) != family {
            return Err(format!(
                "--{name} {value:?} is not an {} address",
                family.label()
            ));
        }
        out.insert(family, ip);
    }
    Ok(out)
}

/// crd, azure, alibabacloud (`Some(false)`) and eni (`Some(true)`) read the node
/// resource from `--node-resource`; ENI-class modes route natively and refuse a
/// tunnel, as Cilium does.
fn external_mode(opts: &DaemonOptions) -> Result<Option<bool>, String> {
    let eni = match opts.ipam.as_str() {
        "crd" | "azure" | "alibabacloud" => false,
        "eni" => true,
        _ => return Ok(None),
    };
    if opts.routing_mode == "tunnel" && opts.ipam != "crd" {
        return Err(format!(
            "ipam {} needs routing-mode=native: its pod addresses are routed by the cloud network, and a tunnel would bypass it",
            opts.ipam
        ));
    }
    if opts.node_resource.is_none() {
        return Err(format!(
            "ipam {} needs --node-resource FILE: the CiliumNode manifest the external IPAM writes for this node",
            opts.ipam
        ));
    }
    Ok(Some(eni))
}

/// Reads the node resource file until it offers `needed` addresses (Cilium waits
/// the same way before it serves).
fn wait_for_external_ips(
    node: &str,
    path: &Path,
    eni: bool,
    needed: u64,
) -> Result<ExternalBackend, String> {
    let mut logged = false;
    loop {
        let backend = ExternalBackend::load(node, path, eni)?;
        let resolved = ExternalBackend::resolved(backend.resource(), eni)?;
        let have = resolved.spec.ipam.pool.len() as u64
            + resolved.spec.ipam.ipv6_pool.len() as u64
            + resolved
                .spec
                .ipam
                .pools
                .allocated
                .iter()
                .flat_map(|a| a.cidrs.iter())
                .filter_map(|c| c.parse::<IpNet>().ok())
                .map(|n| 1u64 << (n.max_prefix_len() - n.prefix_len()).min(63))
                .sum::<u64>();
        if have >= needed {
            return Ok(backend);
        }
        if !logged {
            tracing::info!(
                have,
                needed,
                "Waiting for initial IP to become available in '{node}' custom resource"
            );
            logged = true;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// `k=v,k2=v2`.
fn parse_node_labels(s: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("--node-labels: {pair:?} is not key=value"))?;
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(out)
}

/// Builds the embedded operator's mode from the options, with Cilium's start-up
/// checks.
fn embedded_mode(
    opts: &DaemonOptions,
    pool_defs: &[PoolDef],
    default_pool: &str,
) -> Result<EmbeddedMode, String> {
    match opts.ipam.as_str() {
        "multi-pool" => {
            if !pool_defs.iter().any(|p| p.name == default_pool) {
                tracing::warn!(
                    pool = default_pool,
                    "the default pool does not exist (yet): pods that no annotation or selector places will not get addresses"
                );
            }
            Ok(EmbeddedMode::MultiPool {
                pools: pool_defs.to_vec(),
                default_pool: default_pool.to_string(),
                migrate_cluster_pool: opts.cluster_pool_migration,
            })
        }
        "cluster-pool" => {
            let list = |value: &Option<String>, enabled: bool, name: &str, default: &str| {
                let v = value.clone().unwrap_or_else(|| {
                    if enabled {
                        default.to_string()
                    } else {
                        String::new()
                    }
                });
                parse_cidr_list(name, &v).map_err(|e| e.to_string())
            };
            let cfg = ClusterPoolConfig {
                enable_ipv4: opts.enable_ipv4,
                enable_ipv6: opts.enable_ipv6,
                ipv4_cidrs: list(
                    &opts.cluster_pool_ipv4_cidr,
                    opts.enable_ipv4,
                    "cluster-pool-ipv4-cidr",
                    "10.0.0.0/8",
                )?,
                ipv4_mask_size: opts.cluster_pool_ipv4_mask_size,
                ipv6_cidrs: list(
                    &opts.cluster_pool_ipv6_cidr,
                    opts.enable_ipv6,
                    "cluster-pool-ipv6-cidr",
                    "fd00::/104",
                )?,
                ipv6_mask_size: opts.cluster_pool_ipv6_mask_size,
            };
            cfg.validate().map_err(|e| e.to_string())?;
            Ok(EmbeddedMode::ClusterPool(cfg))
        }
        "delegated-plugin" => Ok(EmbeddedMode::Delegated),
        "kubernetes" => {
            let mut cidrs: Vec<IpNet> = Vec::new();
            for (range, v4) in [(&opts.ipv4_range, true), (&opts.ipv6_range, false)] {
                if range != "auto" && !range.is_empty() {
                    let c: IpNet = range.parse().map_err(|e| {
                        format!("--ipv{}-range {range:?}: {e}", if v4 { 4 } else { 6 })
                    })?;
                    cidrs.push(c);
                }
            }
            for c in opts
                .pod_cidrs
                .as_deref()
                .unwrap_or("")
                .split([' ', ','])
                .filter(|s| !s.is_empty())
            {
                let c: IpNet = c.parse().map_err(|e| format!("--pod-cidrs {c:?}: {e}"))?;
                cidrs.push(c);
            }
            Ok(EmbeddedMode::Kubernetes {
                pod_cidrs: cidrs,
                enable_ipv4: opts.enable_ipv4,
                enable_ipv6: opts.enable_ipv6,
            })
        }
        other => Err(format!(
            "ipam mode {other:?} is not supported by this build: use cluster-pool (default), kubernetes, multi-pool or delegated-plugin"
        )),
    }
}

/// Restore reads the whole journal into memory once (a snapshot, then the maps built
/// from it); the allocator keeps the freed pages, so a full /16 stayed ~50 MiB above
/// its live size after a restart. Hand them back to the kernel once restore is done.
fn release_restore_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own heap; no pointers are passed.
    unsafe {
        libc::malloc_trim(0);
    }
}
