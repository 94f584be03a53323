//! The cross-node datapath: pods on other nodes reached through a VXLAN tunnel
//! (`--routing-mode tunnel`) or routes via the nodes' InternalIPs (`native` with
//! `--auto-direct-node-routes`), and pod traffic leaving the cluster masqueraded
//! (nftables). One task owns it: it turns the cluster's CiliumNodes (the
//! Kubernetes backend's watch of every node; this node's own resource on the
//! embedded backend) into a [`plan::DatapathPlan`] and has [`apply::Reconciler`]
//! write the difference: on every change, from the plan it wrote before; every
//! [`RESYNC`], from the kernel's entries (so an entry someone removed comes back).
//! The task is a controller of the controller kit ([`crate::controller::run`]):
//! the resync is its check, counted from the last pass. `podnet status` shows
//! the remote nodes it knows.

mod apply;
pub mod masquerade;
mod nodes;
pub mod plan;
pub mod settings;

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt, stream};
use ipnet::IpNet;

use super::Daemon;
use crate::api::models::{CrossNodeStatus, RemoteNodeStatus};
use crate::controller::{self, Backoff, Controller, Resync, Timing};
use crate::ipam::Family;
use crate::k8s::mirror::WatchEnded;
use crate::node::cluster_nodes::ClusterNodeList;
use apply::{Compare, Reconciler};
use nodes::RoutingNodes;
use settings::{CrossNodeConfig, RoutingMode, TunnelProtocol};

/// The tunnel device podnet creates (and the only one it removes).
pub const TUNNEL_DEVICE: &str = "podnet_vxlan";
/// The VXLAN network identifier of podnet's tunnel.
pub const TUNNEL_VNI: u32 = 2;
/// VXLAN over an IPv4 underlay: outer IPv4 (20) + UDP (8) + VXLAN (8) + inner
/// Ethernet (14).
pub const TUNNEL_OVERHEAD_IPV4: u32 = 50;
/// VXLAN over an IPv6 underlay: outer IPv6 (40) + UDP (8) + VXLAN (8) + inner
/// Ethernet (14).
pub const TUNNEL_OVERHEAD_IPV6: u32 = 70;
/// The `proto` of every route podnet installs to another node (`ip route show
/// proto 77`); routes with another protocol number are never touched.
pub const ROUTE_PROTOCOL: u8 = 77;
/// How often the kernel is checked against the plan without any change (the
/// policy loop checks its table as often: `daemon::policy_loop`).
pub const RESYNC: Duration = Duration::from_secs(30);
/// The shortest time from one pass to the next for a change of the nodes: the
/// first change after a quiet spell is planned at once, the rest of a burst (a
/// hundred nodes joining) at most this often, each pass taking all that came
/// meanwhile. A pass plans every node, so passing on each change of a burst
/// costs a plan of the whole cluster per node that joined.
const MIN_PASS_INTERVAL: Duration = Duration::from_millis(100);
/// How often the embedded backend's node (this node alone: nothing announces its
/// changes) is read again for the plan.
const THIS_NODE_POLL: Duration = Duration::from_secs(5);

/// What the encapsulation over `underlay` adds to each packet: the tunnel
/// device's MTU, and the pods', is the node device's MTU minus this.
pub fn tunnel_overhead(underlay: Family) -> u32 {
    match underlay {
        Family::V4 => TUNNEL_OVERHEAD_IPV4,
        Family::V6 => TUNNEL_OVERHEAD_IPV6,
    }
}

/// The one-line description of `config` that `podnet status` shows.
fn describe(config: &CrossNodeConfig) -> String {
    let mut s = match (config.routing, config.auto_direct_node_routes) {
        (RoutingMode::Tunnel, _) => format!(
            "tunnel (vxlan over {}, port {}, device {TUNNEL_DEVICE})",
            config.underlay.label(),
            config.tunnel_port
        ),
        (RoutingMode::Native, true) => "native, auto-direct-node-routes".to_string(),
        (RoutingMode::Native, false) => "native (routes are the network's)".to_string(),
    };
    let masq: Vec<&str> = [
        (config.masquerade_v4, "IPv4"),
        (config.masquerade_v6, "IPv6"),
    ]
    .into_iter()
    .filter_map(|(on, f)| on.then_some(f))
    .collect();
    s.push_str(&match masq.is_empty() {
        true => "; masquerade off".to_string(),
        false => format!("; masquerade {} (nftables table podnet)", masq.join(", ")),
    });
    s
}

/// What the kernel or the host lacks for the cross-node configuration.
#[derive(Debug, thiserror::Error)]
pub enum PrerequisiteError {
    #[error(
        "--tunnel-protocol geneve: this kernel has no Geneve driver (creating a geneve device fails with \"Unknown device type\"); use --tunnel-protocol vxlan"
    )]
    NoGeneveDriver,
    #[error("--tunnel-protocol geneve: podnet's tunnel is VXLAN only; use --tunnel-protocol vxlan")]
    GeneveNotSupported,
    #[error(
        "--tunnel-protocol geneve: cannot check the kernel for Geneve ({0}); podnet's tunnel is VXLAN: use --tunnel-protocol vxlan"
    )]
    GeneveUnknown(#[source] crate::datapath::DatapathError),
    #[error(
        "masquerade (--enable-ipv4-masquerade / --enable-ipv6-masquerade, on by default with the Kubernetes backend) needs the nft tool, which is not installed: apt-get install nftables, or turn masquerade off"
    )]
    NftMissing,
    #[error(transparent)]
    Nft(crate::nft::NftError),
}

/// Fails with the reason when the kernel or the host lacks what the
/// configuration needs (called before the daemon serves).
pub fn check_prerequisites(config: &CrossNodeConfig) -> Result<(), PrerequisiteError> {
    if config.routing == RoutingMode::Tunnel && config.tunnel_protocol == TunnelProtocol::Geneve {
        return Err(match crate::datapath::kernel_has_link_kind("geneve") {
            Ok(false) => PrerequisiteError::NoGeneveDriver,
            Ok(true) => PrerequisiteError::GeneveNotSupported,
            Err(e) => PrerequisiteError::GeneveUnknown(e),
        });
    }
    if config.masquerade_v4 || config.masquerade_v6 {
        masquerade::check_nft()?;
    }
    Ok(())
}

/// Where the cluster's nodes come from.
pub enum NodeFeed {
    /// Every CiliumNode, from the Kubernetes backend's watch (None until listed).
    Cluster(tokio::sync::watch::Receiver<Option<ClusterNodeList>>),
    /// The embedded backend: this node alone (masquerade only).
    ThisNode,
}

/// What the task last did, shared with `podnet status`.
pub type SharedStatus = Arc<Mutex<CrossNodeState>>;

/// What the last pass planned and could not do, kept as the plan has it: the
/// text `podnet status` shows is written when it is asked for (writing it for
/// every remote node on every batch of the watch was a large part of a batch).
#[derive(Debug, Default)]
pub struct CrossNodeState {
    mode: String,
    synced: bool,
    tunnel_local: Option<IpAddr>,
    routes: usize,
    remotes: Vec<plan::RemoteNode>,
    errors: Vec<String>,
}

impl CrossNodeState {
    /// The status `podnet status` shows.
    pub fn status(&self) -> CrossNodeStatus {
        CrossNodeStatus {
            mode: self.mode.clone(),
            synced: self.synced,
            tunnel_local: self.tunnel_local.map(|t| t.to_string()).unwrap_or_default(),
            routes: self.routes,
            remote_nodes: self
                .remotes
                .iter()
                .map(|r| RemoteNodeStatus {
                    name: r.name.clone(),
                    internal_ip: r.internal_ip.map(|i| i.to_string()).unwrap_or_default(),
                    cidrs: r.cidrs.iter().map(IpNet::to_string).collect(),
                    path: r.path.to_string(),
                })
                .collect(),
            errors: self.errors.clone(),
        }
    }
}

/// A new status holder for `config`.
pub fn new_status(config: &CrossNodeConfig) -> SharedStatus {
    Arc::new(Mutex::new(CrossNodeState {
        mode: describe(config),
        ..CrossNodeState::default()
    }))
}

/// The task's timing for `feed`: the cluster's nodes are passed on at once
/// after a quiet spell, a burst at most every [`MIN_PASS_INTERVAL`], and
/// compared with the kernel first and [`RESYNC`] after the last pass; this
/// node alone (the embedded backend) is read again and compared with the
/// kernel every [`THIS_NODE_POLL`].
fn timing(feed: &NodeFeed) -> Timing {
    let every = match feed {
        NodeFeed::Cluster(_) => RESYNC,
        NodeFeed::ThisNode => THIS_NODE_POLL,
    };
    Timing {
        debounce: Duration::ZERO,
        min_interval: MIN_PASS_INTERVAL,
        resync: Some(Resync {
            every,
            at_once: true,
            after_each_pass: true,
        }),
        backoff: Backoff::API,
        changes_wait_for_backoff: false,
    }
}

/// A change of the cluster's nodes (None: the watch's task stopped).
fn changes(feed: &NodeFeed) -> impl Stream<Item = Option<()>> + Unpin + use<> {
    let NodeFeed::Cluster(rx) = feed else {
        return stream::empty().left_stream();
    };
    let mut rx = rx.clone();
    rx.borrow_and_update();
    stream::unfold(Some(rx), |rx| async move {
        let mut rx = rx?;
        match rx.changed().await {
            Ok(()) => {
                rx.borrow_and_update();
                Some((Some(()), Some(rx)))
            }
            Err(_) => Some((None, None)),
        }
    })
    .boxed()
    .right_stream()
}

/// The cross-node task: plans on every change of the nodes (at most every
/// [`MIN_PASS_INTERVAL`]) and every [`RESYNC`], and applies on a blocking thread. A change is written against the
/// plan applied before it; the first pass and each resync against the kernel's
/// dumps, which puts back what someone else removed.
pub async fn run(
    daemon: Arc<Daemon>,
    config: CrossNodeConfig,
    device_mtu: u32,
    node_name: String,
    feed: NodeFeed,
    status: SharedStatus,
) {
    let (events, timing) = (changes(&feed), timing(&feed));
    let mut task = CrossNode {
        reconciler: Arc::new(Mutex::new(Reconciler::new(config.clone(), device_mtu))),
        routing: RoutingNodes::default(),
        daemon,
        config,
        node_name,
        feed,
        status,
    };
    controller::run(&mut task, events, timing).await;
}

/// The task's state.
struct CrossNode {
    daemon: Arc<Daemon>,
    config: CrossNodeConfig,
    node_name: String,
    feed: NodeFeed,
    reconciler: Arc<Mutex<Reconciler>>,
    routing: RoutingNodes,
    status: SharedStatus,
}

impl Controller for CrossNode {
    type Input = Option<()>;
    type Plan = plan::DatapathPlan;
    /// What could not be done is published, and done at the next pass.
    type Error = Infallible;
    const WHAT: &'static str = "the cross-node datapath";

    fn feed(&mut self, change: Option<()>) -> Result<bool, WatchEnded> {
        match change {
            Some(()) => Ok(true),
            None => Err(WatchEnded {
                kind: "CiliumNode".into(),
            }),
        }
    }

    fn ready(&self) -> bool {
        true
    }

    /// None until the nodes are listed.
    async fn plan(&mut self) -> Option<plan::DatapathPlan> {
        // The watch's list is shared, not copied (a copy of every node per
        // batch was most of an agent's CPU under node churn).
        let list: ClusterNodeList = match &self.feed {
            NodeFeed::Cluster(rx) => rx.borrow().clone()?,
            NodeFeed::ThisNode => self
                .daemon
                .with_state(|s| Ok(s.node().clone()))
                .await
                .ok()
                .map(|n| Arc::new(vec![Arc::new(n)]))?,
        };
        self.routing.update(&list);
        let nodes = self.routing.nodes();
        let pools: BTreeSet<String> = nodes
            .iter()
            .flat_map(|n| n.cidrs.iter().filter_map(|(p, _)| p.clone()))
            .collect();
        let skip = self
            .daemon
            .with_state(move |s| {
                Ok(pools
                    .into_iter()
                    .filter(|p| s.skip_masquerade(p))
                    .collect::<BTreeSet<String>>())
            })
            .await
            .unwrap_or_default();
        Some(plan::plan(&self.config, &self.node_name, nodes, &skip))
    }

    async fn apply(&mut self, plan: plan::DatapathPlan) -> Result<(), Infallible> {
        self.pass(plan, Compare::LastApplied).await;
        Ok(())
    }

    async fn check(&mut self, plan: plan::DatapathPlan, _resync: u32) -> Result<(), Infallible> {
        self.pass(plan, Compare::Kernel).await;
        Ok(())
    }
}

impl CrossNode {
    /// Applies `plan` against `compare` on a blocking thread; publishes what
    /// it could not do.
    async fn pass(&mut self, mut plan: plan::DatapathPlan, compare: Compare) {
        let shown = Shown {
            tunnel_local: plan.tunnel.map(|t| t.local),
            routes: plan.routes.len(),
            remotes: std::mem::take(&mut plan.remotes),
        };
        let r = self.reconciler.clone();
        let errors = tokio::task::spawn_blocking(move || {
            r.lock()
                .unwrap_or_else(|e| e.into_inner())
                .apply(plan, compare)
        })
        .await
        .unwrap_or_else(|e| vec![format!("cross-node reconcile task failed: {e}")]);
        for e in &errors {
            tracing::warn!(error = %e, "cross-node datapath");
        }
        publish(&self.status, shown, errors);
    }
}

/// What status shows of a plan (the reconciler keeps the rest).
struct Shown {
    tunnel_local: Option<IpAddr>,
    routes: usize,
    remotes: Vec<plan::RemoteNode>,
}

fn publish(status: &SharedStatus, shown: Shown, errors: Vec<String>) {
    let mut s = status.lock().unwrap_or_else(|e| e.into_inner());
    s.synced = true;
    s.errors = errors;
    s.tunnel_local = shown.tunnel_local;
    s.routes = shown.routes;
    s.remotes = shown.remotes;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tunnel(underlay: Family) -> CrossNodeConfig {
        CrossNodeConfig {
            routing: RoutingMode::Tunnel,
            tunnel_protocol: TunnelProtocol::Vxlan,
            tunnel_port: 8472,
            underlay,
            auto_direct_node_routes: false,
            native_routing_cidrs: Vec::new(),
            masquerade_v4: false,
            masquerade_v6: true,
        }
    }

    #[test]
    fn the_status_line_names_the_underlay_family() {
        assert_eq!(
            describe(&tunnel(Family::V6)),
            "tunnel (vxlan over IPv6, port 8472, device podnet_vxlan); masquerade IPv6 (nftables table podnet)"
        );
        assert!(describe(&tunnel(Family::V4)).starts_with("tunnel (vxlan over IPv4, port 8472"));
    }

    #[test]
    fn an_ipv6_underlay_takes_70_bytes_and_an_ipv4_one_50() {
        assert_eq!(tunnel_overhead(Family::V4), 50);
        assert_eq!(tunnel_overhead(Family::V6), 40 + 8 + 8 + 14);
    }
}
