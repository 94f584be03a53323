//! The last phase: open the socket, start the background work (timers, metrics,
//! the leak check, the policy loop, the backend's events and outbox, the
//! journal's and the source check's upkeep, the cross-node datapath, and the
//! one watch of every CiliumNode the last two share), write the CNI config, and serve until a shutdown signal; then undo what
//! `--cni-uninstall` asks. Which loops run on which backend is decided by pure
//! functions ([`policy_start`], [`leak_settings`]), tested on their own.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::StartError;
use super::check::Checked;
use super::cni_conf::{self, CniConf};
use super::restore::{Mtus, ReplayedQueue};
use crate::api::start_note;
use crate::daemon::config::{BackendKind, DaemonConfig, PolicyMode};
use crate::daemon::options::DaemonOptions;
use crate::daemon::server::{self, SocketLock};
use crate::daemon::state::{IpamState, Timer};
use crate::daemon::{
    Daemon, apply_node_events, bandwidth_loop, crossnode, flush_outbox, keep_journal_working,
    l2_loop, leak_check, observe, policy_loop, source_check,
};
use crate::k8s::node_pods::NodePodsApi;
use crate::node::cluster_nodes::{ClusterNodeList, watch_cluster_nodes};
use crate::node::{BackendHealth, NodeSink, NodeSource};
use crate::policy::Enforcement;
use crate::policy::table::PolicyTableError;
use crate::policy::verdict::DropLog;
use crate::process::shutdown_signal;

/// What the serving daemon is made of, once the start's phases are done.
pub(super) struct Serving {
    pub(super) opts: DaemonOptions,
    pub(super) checked: Checked,
    pub(super) mtus: Mtus,
    pub(super) lock: SocketLock,
    pub(super) queue: ReplayedQueue,
    pub(super) health: Arc<BackendHealth>,
    pub(super) state: IpamState,
    pub(super) timers: Vec<Timer>,
    pub(super) source: Box<dyn NodeSource>,
    pub(super) sink: Option<Box<dyn NodeSink>>,
}

/// Opens the socket, starts the background work (timers, metrics, the backend's
/// events and outbox, the journal's and the source check's upkeep, the
/// cross-node datapath), writes the CNI config, and serves until a shutdown
/// signal; then undoes what `--cni-uninstall` asks.
pub(super) async fn serve(s: Serving) -> Result<(), StartError> {
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
        l2: std::sync::OnceLock::new(),
        verdicts: std::sync::OnceLock::new(),
        bandwidth_shaped: Mutex::new(None),
    });
    daemon.arm_timers(s.timers);
    if let Some(check) = leak_check {
        tokio::spawn(leak_check::periodic(
            check,
            leak_check::DaemonFacts(daemon.clone()),
        ));
    }
    let mut cluster_nodes = ClusterNodes {
        health: s.health.clone(),
        list: None,
    };
    start_policy(&daemon, &s.checked, &mut cluster_nodes);
    start_l2_announcements(&daemon, &s.checked);
    start_bandwidth_loop(&daemon, &s.checked, s.opts.enable_bandwidth_manager);
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
        tokio::spawn(source_check::keep());
    }
    if let Some(status) = cross_node_status {
        spawn_cross_node(
            &daemon,
            &s.checked,
            s.mtus.device,
            &mut cluster_nodes,
            status,
        );
    }
    let conf = CniConf::of(&s.opts, &socket);
    if let Some(conf) = &conf {
        cni_conf::write_when_fit(&daemon, conf).await?;
    }
    tracing::info!(socket = %socket.display(), lock = %s.lock.path().display(), "podnet daemon ready");
    // The accept loop runs on a worker, not on this thread: a connection it
    // spawns then starts on the same worker, without a cross-thread wake-up.
    if let Err(e) = tokio::spawn(server::serve(listener, daemon, shutdown_signal())).await {
        tracing::error!(error = %e, "the API server stopped");
    }
    if s.opts.cni_uninstall {
        cni_conf::uninstall(cni_conf::to_uninstall(
            conf.as_ref().map(CniConf::path),
            cross_node.masquerade_v4 || cross_node.masquerade_v6,
            source_check,
        ));
    }
    let _ = std::fs::remove_file(&socket);
    tracing::info!("podnet daemon stopped");
    Ok(())
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

/// The leak check's settings, from the options (a zero
/// `--ipam-release-leaked-after`: report only).
fn leak_settings(opts: &DaemonOptions) -> leak_check::LeakSettings {
    leak_check::LeakSettings {
        interval: opts.leak_check_interval,
        grace: opts.leak_grace,
        release_after: (!opts.release_leaked_after.is_zero()).then_some(opts.release_leaked_after),
    }
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
    let settings = leak_settings(opts);
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

/// What `--enable-policy` does at start.
#[derive(Debug, PartialEq, Eq)]
enum PolicyStart<'a> {
    /// The policy loop runs, on the API server's NetworkPolicies.
    Run {
        kubeconfig: &'a Option<PathBuf>,
        enforcement: Enforcement,
    },
    /// Asked for, on the embedded backend, which has no NetworkPolicies.
    NotOnEmbedded,
    /// `never`: podnet's policy table is removed.
    RemoveTable,
}

/// `--enable-policy`: the policy loop on the Kubernetes backend (the embedded
/// one has no NetworkPolicies), isolating every local pod with `always`;
/// `never` removes podnet's policy table.
fn policy_start(config: &DaemonConfig) -> PolicyStart<'_> {
    match (config.policy, &config.backend) {
        (
            mode @ (PolicyMode::Default | PolicyMode::Always),
            BackendKind::Kubernetes { kubeconfig },
        ) => PolicyStart::Run {
            kubeconfig,
            enforcement: match mode {
                PolicyMode::Always => Enforcement::Always,
                _ => Enforcement::Default,
            },
        },
        (PolicyMode::Default | PolicyMode::Always, BackendKind::Embedded) => {
            PolicyStart::NotOnEmbedded
        }
        (PolicyMode::Never, _) => PolicyStart::RemoveTable,
    }
}

/// The one watch of every CiliumNode (the Kubernetes backend), started by its
/// first reader: the policy loop, the cross-node datapath.
struct ClusterNodes {
    health: Arc<BackendHealth>,
    list: Option<tokio::sync::watch::Receiver<Option<ClusterNodeList>>>,
}

impl ClusterNodes {
    /// A reader of the watch's list, the watch started if it is not.
    fn reader(
        &mut self,
        kubeconfig: &Option<PathBuf>,
    ) -> tokio::sync::watch::Receiver<Option<ClusterNodeList>> {
        let health = &self.health;
        let list = self.list.get_or_insert_with(|| {
            let (tx, rx) = tokio::sync::watch::channel(None);
            tokio::spawn(watch_cluster_nodes(kubeconfig.clone(), health.clone(), tx));
            rx
        });
        list.clone()
    }
}

/// Starts what `--enable-policy` asks for ([`policy_start`]). The table is never
/// removed at stop: it outlives an agent restart.
fn start_policy(daemon: &Arc<Daemon>, checked: &Checked, nodes: &mut ClusterNodes) {
    let config = &checked.config;
    match policy_start(config) {
        PolicyStart::Run {
            kubeconfig,
            enforcement,
        } => {
            let cluster_policies = config
                .cluster_network_policy
                .then(|| checked.node_name.clone());
            let log = start_verdicts(daemon, config.policy_audit_mode);
            tokio::spawn(policy_loop::run(
                daemon.clone(),
                kubeconfig.clone(),
                enforcement,
                Some(log),
                cluster_policies,
                nodes.reader(kubeconfig),
            ));
        }
        PolicyStart::NotOnEmbedded => {
            tracing::info!("NetworkPolicy is not enforced on the embedded backend (no API server)")
        }
        PolicyStart::RemoveTable => match crate::policy::table::remove() {
            Ok(()) | Err(PolicyTableError::NftMissing) => {
                tracing::info!("NetworkPolicy not enforced (--enable-policy never)")
            }
            Err(e) => {
                tracing::warn!(error = %e, "--enable-policy never: could not remove the policy table")
            }
        },
    }
}

/// Starts the reader of the policy verdicts the table logs; the table's log
/// settings (`--policy-audit-mode`).
fn start_verdicts(daemon: &Arc<Daemon>, audit: bool) -> DropLog {
    let verdicts = daemon.with_state_in_place(|s| {
        let m = s.metrics();
        Ok(observe::Verdicts::new(
            m.policy_verdicts.clone(),
            m.policy_observe_lines_lost.clone(),
            m.policy_verdict_records_unreadable.clone(),
        ))
    });
    if let Ok(v) = verdicts {
        let v = Arc::new(v);
        daemon.set_verdicts(v.clone());
        observe::spawn_reader(v);
    }
    if audit {
        tracing::warn!("--policy-audit-mode: what a policy would drop passes, reported as audit");
    }
    DropLog {
        group: observe::GROUP,
        per_second: observe::PER_SECOND,
        audit,
    }
}

/// Starts the L2 announcement loop when `--enable-l2-announcements` asks
/// (the Kubernetes backend: the embedded one has no Services).
fn start_l2_announcements(daemon: &Arc<Daemon>, checked: &Checked) {
    let Some(port) = checked.config.l2_announcements else {
        return;
    };
    match &checked.config.backend {
        BackendKind::Kubernetes { kubeconfig } => {
            let node = checked.node_name.clone();
            tokio::spawn(l2_loop::run(daemon.clone(), kubeconfig.clone(), node, port));
        }
        BackendKind::Embedded => {
            tracing::warn!(
                "--enable-l2-announcements: not on the embedded backend (no API server, no Services)"
            )
        }
    }
}

/// Starts the pod bandwidth loop when `--enable-bandwidth-manager` asks (the
/// Kubernetes backend: on the embedded one a limit is set at ADD only).
fn start_bandwidth_loop(daemon: &Arc<Daemon>, checked: &Checked, enabled: bool) {
    if !enabled {
        return;
    }
    if let BackendKind::Kubernetes { kubeconfig } = &checked.config.backend {
        let node = checked.node_name.clone();
        tokio::spawn(bandwidth_loop::run(
            daemon.clone(),
            kubeconfig.clone(),
            node,
        ));
    }
}

/// Runs the cross-node datapath, fed by every CiliumNode of the cluster (the
/// Kubernetes backend) or by this node alone (the embedded one).
fn spawn_cross_node(
    daemon: &Arc<Daemon>,
    checked: &Checked,
    device_mtu: u32,
    nodes: &mut ClusterNodes,
    status: crossnode::SharedStatus,
) {
    let feed = match &checked.config.backend {
        BackendKind::Kubernetes { kubeconfig } => {
            crossnode::NodeFeed::Cluster(nodes.reader(kubeconfig))
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::daemon::start::node::tests::{checked, started};

    const KUBE: [&str; 2] = ["--k8s-kubeconfig-path", "/etc/kube.conf"];

    #[test]
    fn the_policy_loop_runs_on_the_api_server_isolating_every_pod_with_always() {
        for (mode, enforcement) in [
            ("default", Enforcement::Default),
            ("always", Enforcement::Always),
        ] {
            let c = checked(&[&KUBE[..], &["--enable-policy", mode]].concat());
            let kubeconfig = &Some(PathBuf::from("/etc/kube.conf"));
            assert_eq!(
                policy_start(&c.config),
                PolicyStart::Run {
                    kubeconfig,
                    enforcement
                },
                "{mode}"
            );
        }
    }

    #[test]
    fn the_embedded_backend_enforces_no_policy_and_never_removes_the_table_anywhere() {
        for mode in ["default", "always"] {
            let c = checked(&["--enable-policy", mode]);
            assert_eq!(
                policy_start(&c.config),
                PolicyStart::NotOnEmbedded,
                "{mode}"
            );
        }
        let never = ["--enable-policy", "never"];
        for args in [&never[..], &[&KUBE[..], &never[..]].concat()] {
            let c = checked(args);
            assert_eq!(
                policy_start(&c.config),
                PolicyStart::RemoveTable,
                "{args:?}"
            );
        }
    }

    #[test]
    fn the_leak_check_and_pod_events_run_only_on_the_api_server() {
        let (opts, c) = started(&[]);
        assert!(leak_check_of(&c, &opts).is_none());
        assert!(pod_events_of(&c).is_none());
        let (opts, c) = started(&KUBE);
        let check = leak_check_of(&c, &opts).unwrap();
        assert_eq!(check.settings(), leak_settings(&opts));
        assert!(pod_events_of(&c).is_some());
    }

    #[test]
    fn the_leak_check_releases_only_with_a_release_delay() {
        let (opts, _) = started(&[
            "--ipam-leak-check-interval=30s",
            "--ipam-leak-grace=2m",
            "--ipam-release-leaked-after=0",
        ]);
        let settings = leak_settings(&opts);
        assert_eq!(settings.interval, Duration::from_secs(30));
        assert_eq!(settings.grace, Duration::from_secs(120));
        assert_eq!(settings.release_after, None);
        let (opts, _) = started(&["--ipam-release-leaked-after=1h"]);
        assert_eq!(
            leak_settings(&opts).release_after,
            Some(Duration::from_secs(3600))
        );
    }
}
