//! The agent's L2 announcement loop (`--enable-l2-announcements`, the
//! Kubernetes backend), on the controller kit. It watches every
//! CiliumL2AnnouncementPolicy, Service, EndpointSlice and Node of the cluster
//! (each a `k8s::mirror::Mirror` of its `l2announce::views` view) and takes
//! the heartbeats' live set (`l2announce::heartbeat`, which it feeds with
//! every node's InternalIPs). A pass plans (`l2announce::plan`, the same on
//! every agent), places each address this node answers for on its links
//! ([`interfaces`]) and hands the result to the ARP/NDP responder
//! (`datapath::l2_responder`), which sends the gratuitous ARP or unsolicited
//! neighbour advertisement of an address taken over. Nothing is answered
//! until every watch has listed and the heartbeats' start grace is over.
//!
//! API load: four watches and an Event per address taken (by the node that
//! takes it); nothing per Service at rest, no Lease.

pub mod interfaces;
mod report;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt, stream};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DynamicObject};
use kube::runtime::events::Recorder;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;

use super::Daemon;
use crate::controller::{self, Backoff, Controller, Resync, Timing, WatchItem, ending};
use crate::k8s::connect::connect_retrying;
use crate::k8s::discovery::{CiliumKind, resolve_waiting};
use crate::k8s::mirror::{Keyed, Mirror, WatchEnded, key_of, projected};
use crate::k8s::objects::typed;
use crate::k8s::objects::watch_all;
use crate::l2announce::heartbeat::{self, Peers};
use crate::l2announce::liveness::{Beat, LiveSet};
use crate::l2announce::plan::{Inputs, Plan, plan};
use crate::l2announce::views::{NodeView, PolicyView, ServiceView, SliceView, ready_nodes};
use crate::resources::{CiliumL2AnnouncementPolicy, L2_POLICY_KIND};
use interfaces::{Link, Placed};
pub use report::{Shared, add_explanation};

/// When the loop plans: soon after a change (a dead node's addresses move
/// within the failover budget), at each resync (links re-read, the responder
/// repaired), and after a failed pass again.
const TIMING: Timing = Timing {
    debounce: Duration::from_millis(50),
    min_interval: Duration::ZERO,
    resync: Some(Resync {
        every: Duration::from_secs(30),
        at_once: false,
        after_each_pass: true,
    }),
    backoff: Backoff {
        first: Duration::from_secs(1),
        max: Duration::from_secs(10),
    },
    changes_wait_for_backoff: false,
};

impl Keyed for PolicyView {
    fn key(&self) -> String {
        self.name.clone()
    }
}

impl Keyed for ServiceView {
    fn key(&self) -> String {
        ServiceView::key(self)
    }
}

impl Keyed for SliceView {
    fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

impl Keyed for NodeView {
    fn key(&self) -> String {
        self.name.clone()
    }
}

/// One input of the loop.
pub enum Input {
    Policy(Box<WatchItem<PolicyView>>),
    Service(Box<WatchItem<ServiceView>>),
    Slice(Box<WatchItem<SliceView>>),
    Node(Box<WatchItem<NodeView>>),
    /// The heartbeats' live set changed.
    Live(LiveSet),
}

/// A policy object's view (one that does not decode selects nothing).
fn policy_view(obj: DynamicObject) -> PolicyView {
    match typed::<CiliumL2AnnouncementPolicy, _>(&obj, L2_POLICY_KIND) {
        Ok(p) => PolicyView::from_resource(&p),
        Err(e) => PolicyView::undecodable(&key_of(&obj), e.problem),
    }
}

/// The loop's inputs, merged.
fn inputs(
    client: &kube::Client,
    policies: Api<DynamicObject>,
    live: watch::Receiver<LiveSet>,
) -> impl Stream<Item = Input> + Unpin + use<> {
    let config = watcher::Config::default();
    let policies = projected(watcher(policies, config).default_backoff(), policy_view);
    let services = projected(watch_all::<Service>(client), ServiceView::from_k8s);
    let slices = projected(watch_all::<EndpointSlice>(client), SliceView::from_k8s);
    let nodes = projected(watch_all::<Node>(client), NodeView::from_k8s);
    // The heartbeats stopped (their sender dropped): the others no longer
    // hear this node and take its addresses over, so it answers nothing.
    let live = stream::unfold(Some(live), |rx| async move {
        let mut rx = rx?;
        match rx.changed().await {
            Ok(()) => {
                let set = rx.borrow_and_update().clone();
                Some((Input::Live(set), Some(rx)))
            }
            Err(_) => Some((Input::Live(unsettled()), None)),
        }
    });
    stream::select_all([
        ending(policies).map(|e| Input::Policy(Box::new(e))).boxed(),
        ending(services)
            .map(|e| Input::Service(Box::new(e)))
            .boxed(),
        ending(slices).map(|e| Input::Slice(Box::new(e))).boxed(),
        ending(nodes).map(|e| Input::Node(Box::new(e))).boxed(),
        live.boxed(),
    ])
}

/// The live set before the heartbeats say anything, and after they stopped:
/// nothing is answered.
fn unsettled() -> LiveSet {
    LiveSet {
        live: BTreeSet::new(),
        settled: false,
    }
}

/// Runs the loop (and the heartbeats) until a watch ends (they do not while
/// the API server can be retried).
pub async fn run(daemon: Arc<Daemon>, kubeconfig: Option<PathBuf>, node: String, port: u16) {
    let shared = Arc::new(Shared::new(port));
    daemon.set_l2(shared.clone());
    let client = connect_retrying(
        kubeconfig.as_ref(),
        "L2 announcements",
        Duration::from_secs(2),
    )
    .await;
    shared.waiting("the CiliumL2AnnouncementPolicy CRD");
    let resource = resolve_waiting(&client, CiliumKind::L2Policy, &|_| {}).await;
    let (peers_tx, peers_rx) = watch::channel(Peers::new());
    let (live_tx, live_rx) = watch::channel(unsettled());
    let counters = shared.heartbeats.clone();
    let own = node.clone();
    tokio::spawn(async move {
        let beat = Beat::default();
        if let Err(e) = heartbeat::run(own, beat, port, peers_rx, live_tx, counters).await {
            tracing::error!(error = %e, "L2 announcements: the heartbeats stopped; this node answers for nothing");
        }
    });
    let events = inputs(&client, Api::all_with(client.clone(), &resource), live_rx);
    let recorder = crate::k8s::events::recorder(client, "podnet-agent", &node);
    let mut l2 = L2Loop {
        node,
        port,
        shared,
        recorder,
        peers: peers_tx,
        policies: Mirror::default(),
        services: Mirror::default(),
        slices: Mirror::default(),
        nodes: Mirror::default(),
        live: unsettled(),
        answered: BTreeSet::new(),
        posted: BTreeSet::new(),
    };
    tracing::info!(port, "L2 announcements on");
    let ended = controller::run(&mut l2, events, TIMING).await;
    tracing::error!(error = %ended, "L2 announcements: the loop stopped; the node answers as last planned");
}

/// The loop's state.
struct L2Loop {
    node: String,
    port: u16,
    shared: Arc<Shared>,
    recorder: Recorder,
    peers: watch::Sender<Peers>,
    policies: Mirror<PolicyView>,
    services: Mirror<ServiceView>,
    slices: Mirror<SliceView>,
    nodes: Mirror<NodeView>,
    live: LiveSet,
    /// The addresses the last pass answered for.
    answered: BTreeSet<IpAddr>,
    /// The problems posted as Events and still there.
    posted: BTreeSet<crate::l2announce::views::Problem>,
}

/// A pass's plan: the cluster's, and this node's InternalIPs.
pub struct Planned {
    plan: Arc<Plan>,
    internal_ips: Vec<IpAddr>,
}

/// Why a pass did not finish.
#[derive(Debug, thiserror::Error)]
pub enum L2Error {
    #[error("reading the node's links: {0}")]
    Links(String),
    #[error("answering on {0}")]
    Responder(String),
}

impl Controller for L2Loop {
    type Input = Input;
    type Plan = Planned;
    type Error = L2Error;
    const WHAT: &'static str = "an L2 announcement pass";

    fn feed(&mut self, input: Input) -> Result<bool, WatchEnded> {
        match input {
            Input::Policy(e) => self.policies.feed(*e, L2_POLICY_KIND),
            Input::Service(e) => self.services.feed(*e, "Service"),
            Input::Slice(e) => self.slices.feed(*e, "EndpointSlice"),
            Input::Node(e) => {
                let changed = self.nodes.feed(*e, "Node")?;
                if changed {
                    self.send_peers();
                }
                Ok(changed)
            }
            Input::Live(set) => {
                let changed = set != self.live;
                self.live = set;
                Ok(changed)
            }
        }
    }

    fn ready(&self) -> bool {
        self.policies.listed()
            && self.services.listed()
            && self.slices.listed()
            && self.nodes.listed()
    }

    async fn plan(&mut self) -> Option<Planned> {
        let policies: Vec<&PolicyView> = self.policies.objects().collect();
        let services: Vec<&ServiceView> = self.services.objects().collect();
        let nodes: Vec<&NodeView> = self.nodes.objects().collect();
        let ready = ready_nodes(self.slices.objects());
        let planned = plan(&Inputs {
            policies: &policies,
            services: &services,
            nodes: &nodes,
            ready: &ready,
            live: &self.live.live,
        });
        let own = self.nodes.get(&self.node);
        Some(Planned {
            plan: Arc::new(planned),
            internal_ips: own.map(|n| n.internal_ips.clone()).unwrap_or_default(),
        })
    }

    async fn apply(&mut self, planned: Planned) -> Result<(), L2Error> {
        let links = read_links().await?;
        let placed = match self.live.settled {
            true => place_all(&planned, &self.node, &links),
            false => BTreeMap::new(),
        };
        let wanted = interfaces::by_link(&placed);
        let responder = self.shared.responder.clone();
        let errors = tokio::task::spawn_blocking(move || responder.set(&wanted))
            .await
            .map_err(|e| L2Error::Responder(e.to_string()))?;
        let taken: Vec<IpAddr> = placed
            .iter()
            .filter(|(a, p)| matches!(p, Placed::On(_)) && !self.answered.contains(a))
            .map(|(a, _)| *a)
            .collect();
        self.answered = placed
            .iter()
            .filter(|(_, p)| matches!(p, Placed::On(_)))
            .map(|(a, _)| *a)
            .collect();
        let local = report::placement_problems(&planned.plan, &placed, &self.node);
        let nodes = self.nodes.objects().count();
        let live = &self.live;
        self.shared
            .publish(&planned.plan, &self.node, &placed, live, &local, nodes);
        self.shared.note_responder_errors(&errors);
        let posting = report::Posting {
            plan: &planned.plan,
            node: &self.node,
            taken: &taken,
            placed: &placed,
            services: &self.services,
            local: &local,
            live: &self.live.live,
        };
        report::post_events(&self.recorder, posting, &mut self.posted).await;
        self.shared.count_taken(taken.len());
        match errors.first() {
            None => Ok(()),
            Some(e) => Err(L2Error::Responder(format!("{}: {e}", e.interface()))),
        }
    }
}

impl L2Loop {
    /// Every other node's InternalIPs at the heartbeat port, to the heartbeats.
    fn send_peers(&self) {
        let peers: Peers = self
            .nodes
            .objects()
            .filter(|n| n.name != self.node)
            .map(|n| {
                let to = n
                    .internal_ips
                    .iter()
                    .map(|ip| SocketAddr::new(*ip, self.port));
                (n.name.clone(), to.collect())
            })
            .collect();
        self.peers.send_if_modified(|p| {
            let changed = *p != peers;
            *p = peers;
            changed
        });
    }
}

/// The node's links that may answer (netlink, on a blocking thread).
async fn read_links() -> Result<Vec<Link>, L2Error> {
    match tokio::task::spawn_blocking(interfaces::links).await {
        Ok(Ok(links)) => Ok(links),
        Ok(Err(e)) => Err(L2Error::Links(e.to_string())),
        Err(e) => Err(L2Error::Links(e.to_string())),
    }
}

/// Where each address this node answers for goes.
fn place_all(planned: &Planned, node: &str, links: &[Link]) -> BTreeMap<IpAddr, Placed> {
    planned
        .plan
        .answered_by(node)
        .map(|(a, c)| {
            let placed = interfaces::place(a.address, &c.interfaces, &planned.internal_ips, links);
            (a.address, placed)
        })
        .collect()
}
