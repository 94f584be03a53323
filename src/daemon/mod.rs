//! The node daemon (`podnet daemon`): reads its options, takes the socket lock,
//! restores the journal, lets the node backend say what the node owns, reserves
//! the router addresses and sets up the router device, then serves the REST API
//! on the unix socket and runs the expiration timers.

mod devices;
pub mod options;
mod routes;
mod server;
pub mod state;

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipnet::IpNet;

use crate::ipam::clusterpool::{ClusterPoolConfig, parse_cidr_list};
use crate::node::{EmbeddedBackend, EmbeddedMode, NodeBackend, NodeResource};
use crate::store::{Journal, now_ms};
use options::{DaemonOptions, OptionsError};
use state::{ApiError, Expiry, IpamState, NODE_META_KEY, StateConfig};

/// The running daemon, shared by every connection and timer.
pub struct Daemon {
    state: Mutex<IpamState>,
}

impl Daemon {
    /// Runs `f` on the state, on a blocking thread (the journal commit blocks).
    pub async fn with_state<T, F>(self: &Arc<Self>, f: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(&mut IpamState) -> Result<T, ApiError> + Send + 'static,
    {
        let d = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut st = d.state.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut st)
        })
        .await
        .map_err(|e| ApiError::new(500, format!("internal error: {e}")))?
    }

    /// Arms one task per expiration timer.
    pub fn arm_timers(self: &Arc<Self>, timers: Vec<Expiry>) {
        for t in timers {
            let d = self.clone();
            tokio::spawn(async move {
                let wait = t.deadline_ms.saturating_sub(now_ms());
                tokio::time::sleep(Duration::from_millis(wait)).await;
                let (ip, uuid) = (t.ip, t.uuid);
                let _ = d.with_state(move |s| Ok(s.expire(ip, &uuid))).await;
            });
        }
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
    let mode = embedded_mode(&opts)?;
    let lock = server::lock_socket(&opts.socket)?;
    server::ensure_private_dir(&opts.state_dir, "state directory")?;
    let journal = Journal::open(&opts.state_dir.join("journal.redb")).map_err(|e| e.to_string())?;
    let snapshot = journal.load().map_err(|e| e.to_string())?;
    let current: Option<NodeResource> = snapshot
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
        })?;
    let node = EmbeddedBackend::new(&node_name, mode).sync(current)?;
    let cidrs: Vec<IpNet> = node
        .spec
        .ipam
        .pod_cidrs
        .iter()
        .map(|c| {
            c.parse()
                .map_err(|e| format!("node resource podCIDR {c:?}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mtu = if opts.mtu > 0 {
        opts.mtu
    } else {
        devices::default_route_mtu().unwrap_or(1500)
    };
    let cfg = StateConfig {
        node_name: node_name.clone(),
        ipam_mode: opts.ipam.clone(),
        expiration: opts.ipam_expiration,
        mtu,
        reserve_health: opts.enable_health_checking,
        reserve_ingress: opts.enable_ingress_controller,
    };
    let (state, timers, report) = IpamState::restore(cfg, journal, node, &cidrs, snapshot)?;
    let routers: Vec<IpAddr> = state.router_ips();
    devices::setup_router(&routers, mtu)?;
    tracing::info!(
        node = %node_name,
        cidrs = ?cidrs.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
        routers = ?routers.iter().map(|r| r.to_string()).collect::<Vec<_>>(),
        restored = report.restored,
        expired = report.expired,
        dropped = report.dropped_out_of_range.len(),
        "IPAM restored"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let socket = opts.socket.clone();
    runtime.block_on(async move {
        let listener = server::bind(&socket)?;
        let daemon = Arc::new(Daemon { state: Mutex::new(state) });
        daemon.arm_timers(timers);
        tracing::info!(socket = %socket.display(), lock = %lock.path().display(), "podnet daemon ready");
        server::serve(listener, daemon, shutdown_signal()).await;
        let _ = std::fs::remove_file(&socket);
        tracing::info!("podnet daemon stopped");
        Ok::<(), String>(())
    })
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

/// Builds the embedded operator's mode from the options, with Cilium's start-up
/// checks.
fn embedded_mode(opts: &DaemonOptions) -> Result<EmbeddedMode, String> {
    match opts.ipam.as_str() {
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
            "ipam mode {other:?} is not supported by this build: use cluster-pool (default) or kubernetes"
        )),
    }
}
