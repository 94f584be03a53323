//! The agent's NetworkPolicy loop (`--enable-policy default`, the Kubernetes
//! backend): watches of every Pod (peers live on other nodes), Namespace and
//! NetworkPolicy of the cluster ([`Watched`], each a `k8s::mirror::Mirror` of
//! the `policy::view` of its objects, made once as an event arrives: the whole
//! objects are not kept), every CiliumNode's addresses (the list of the
//! cross-node datapath's watch, shared: an ingress `ipBlock` judges a node's
//! router address as its InternalIP), and one writer. The loop is the
//! controller kit's ([`crate::controller::run`], [`TIMING`]). After a change
//! (debounced by [`DEBOUNCE`]) it compiles the node's state from the views and what the
//! daemon knows of the node, on the loop's own thread at a lower CPU priority
//! ([`worker`]: the runtime's two threads answer the plugin, and come first),
//! the pods' sets kept from one compile to the next and
//! brought up to date for the Pods whose events arrived ([`crate::policy::sets`]:
//! a Pod event costs a look at that pod per set, not every pod per selector)
//! ([`NodeSide`]: each local pod's host link from the ledger, or, for a pod a
//! delegated IPAM plugin addressed (`--ipam delegated-plugin`), from its
//! endpoint; the node's InternalIPs and router addresses), and the [`writer`]
//! writes what changed. A pod's addresses are its Pod's `status.podIPs`, in
//! every IPAM mode. With `--enable-cluster-network-policy` the loop also
//! watches the ClusterNetworkPolicies (`cluster`: discovery, the watch once the
//! CRD is served, the status line and the problems' Events).
//!
//! Every [`RESYNC`] the state is compiled again and, before it is written, the
//! kernel's table is checked against the state last written
//! (`policy_loop::writer::Writer::check`): a table someone deleted or changed is
//! installed whole again, logged once, and counted (`policy_table_repairs_total`,
//! by what was found: `missing`, `differs`). Each check is a quick one
//! (`policy::check::Depth::Quick`: the chains without their rules, the two
//! verdict maps, the forward chain's three rules; four `nft -j list` runs), and
//! every [`FULL_CHECK_EVERY`]th a full one (`nft -j list table`: every chain's
//! rule count and every set's element count too). The quick check finds what
//! `nft flush ruleset`, a host firewall's restart, `nft delete table` or `nft
//! flush table` does (no table; chains or maps gone; the forward chain empty),
//! and a pod's chain or map element deleted; a pod's chain flushed or a set's
//! element deleted waits for the full one; a rule edited in place, every count
//! kept, is not found. Why two depths: listing rules is most of the cost, and a
//! large table's listing costs more than installing it. Measured with nft 1.0.6
//! on a table of 20,000 rules (100 chains) and 200,000 set elements: the quick
//! check about 0.1 s of CPU (nft reads every rule of the table to list the
//! forward chain's), the full one 0.75 s, an install 0.6 s; for a small table a
//! few ms each. A table deleted while the state is empty (no policy selects a
//! local pod) is restored too: it filters nothing, but podnet's updates are
//! written against it.
//!
//! With a `policy::verdict::DropLog` the table logs its final drops; after
//! each write the loop hands the verdicts' reader (`daemon::observe`) every
//! pod's addresses and the policies selecting each local pod, so it names them.
//!
//! The table outlives the agent: it is never removed at stop, and a starting
//! agent writes its first (whole) state only once all four watches have listed,
//! so the previous agent's table stands until then. While the API server is
//! gone the last table stands (logged once); the watches' relists reconcile it
//! when it is back.

mod cluster;
pub mod explain;
mod worker;
pub mod writer;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt, stream};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::watcher;

use super::Daemon;
use super::metrics::{FoundLabels, ResultLabels};
use super::observe::Names;
use super::state::{ApiError, IpamState};
use crate::api::models::PolicyStatus;
use crate::controller::{self, Backoff, Controller, Resync, Timing, WatchItem, ending};
use crate::k8s::connect::connect_retrying;
use crate::k8s::mirror::{Keyed, Mirror, WatchEnded, projected};
use crate::k8s::objects::watch_all;
use crate::node::cluster_nodes::ClusterNodeList;
use crate::policy::check::{Depth, Found};
use crate::policy::compile::labels_in;
use crate::policy::problem::Kind;
use crate::policy::selector::Labels;
use crate::policy::sets::{Changes, SetCache};
use crate::policy::verdict::DropLog;
use crate::policy::{
    Cluster, ClusterPolicyView, Compiled, Enforcement, Explanations, Local, NamespaceView,
    NodeView, PodView, PolicyView, Problem, compile_with, view,
};
use crate::store::now_ms;
pub use cluster::ClusterKind;
use worker::Worker;
use writer::{Kernel, Pass, Writer, Wrote};

/// How long after a change the loop waits for more before it compiles.
pub const DEBOUNCE: Duration = Duration::from_millis(200);
/// How soon a failed write is tried again (always: first and last alike).
const RETRY: Duration = Duration::from_secs(5);
/// How often the state is compiled without a change seen (a local pod's link
/// appears when the plugin attaches it, which no watch event says) and the
/// kernel's table checked: the cross-node reconciler's resync, so after a
/// `nft flush ruleset` a node's masquerade, routes and policy table are all
/// back within the same bound.
const RESYNC: Duration = super::crossnode::RESYNC;
/// Every how many resyncs the check reads the whole table (5 minutes).
const FULL_CHECK_EVERY: u32 = 10;

/// When the loop writes: [`DEBOUNCE`] after a change, [`RETRY`] after a failed
/// write (a change waits for it), and at each [`RESYNC`] (the first at once),
/// which also checks the kernel's table first ([`check_depth`]).
const TIMING: Timing = Timing {
    debounce: DEBOUNCE,
    min_interval: Duration::ZERO,
    resync: Some(Resync {
        every: RESYNC,
        at_once: true,
        after_each_pass: false,
    }),
    backoff: Backoff {
        first: RETRY,
        max: RETRY,
    },
    changes_wait_for_backoff: true,
};

/// The check of the pass at resync `n`, the last resync checked being `last`:
/// full when a resync the pass stands for is a [`FULL_CHECK_EVERY`]th (the
/// first, number 0, included: it has nothing written to check), else quick.
fn check_depth(last: Option<u32>, n: u32) -> Depth {
    let first = last.map_or(n, |l| l.wrapping_add(1));
    match (first..=n).any(|k| k % FULL_CHECK_EVERY == 0) {
        true => Depth::Full,
        false => Depth::Quick,
    }
}

/// The views of the cluster's objects, as the watches last showed them.
#[derive(Default)]
pub struct Watched {
    pub pods: Mirror<PodView>,
    pub namespaces: Mirror<NamespaceView>,
    pub policies: Mirror<PolicyView>,
    /// Empty while ClusterNetworkPolicy is off or its CRD is not served.
    pub cluster_policies: Mirror<ClusterPolicyView>,
    pub cluster_kind: ClusterKind,
    /// Every CiliumNode's addresses, sorted (None until the watch has listed).
    pub nodes: Option<Vec<NodeView>>,
    /// What changed for the kept sets since the last compile took it.
    pub changes: Changes,
}

/// `namespace/name`, as `k8s::mirror::key_of` keys the Pod.
impl Keyed for PodView {
    fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

impl Keyed for NamespaceView {
    fn key(&self) -> String {
        self.name.clone()
    }
}

impl Keyed for PolicyView {
    fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

impl Watched {
    /// Whether every watch has listed once (until then nothing is written).
    pub fn synced(&self) -> bool {
        let listed = self.pods.listed() && self.namespaces.listed() && self.policies.listed();
        let cluster = match self.cluster_kind {
            ClusterKind::Off | ClusterKind::NotInstalled => true,
            ClusterKind::Unresolved => false,
            ClusterKind::Served(_) => self.cluster_policies.listed(),
        };
        listed && cluster && self.nodes.is_some()
    }

    /// The CiliumNode watch ended (its task stopped): the nodes stay as last
    /// listed, or none; true when that is news to the compile (never listed).
    fn nodes_ended(&mut self) -> bool {
        tracing::warn!(
            "NetworkPolicy: the CiliumNode watch ended; the nodes' addresses stay as last listed"
        );
        let unlisted = self.nodes.is_none();
        self.nodes.get_or_insert_with(Vec::new);
        unlisted
    }

    /// Notes what a Pod watch item changes for the kept sets: its Pod, or
    /// every set once a (re)list is complete.
    fn note_pod(&mut self, item: &WatchItem<PodView>) {
        match item {
            Some(Ok(watcher::Event::Apply(p) | watcher::Event::Delete(p))) => {
                self.changes.pod(p.key())
            }
            Some(Ok(watcher::Event::InitDone)) => self.changes.all(),
            _ => {}
        }
    }

    /// Takes the CiliumNode watch's list (None: not listed yet); true when the
    /// nodes' addresses changed.
    pub fn take_nodes(&mut self, list: Option<&ClusterNodeList>) -> bool {
        let Some(list) = list else {
            return false;
        };
        let mut nodes: Vec<NodeView> = list.iter().map(|n| NodeView::from_resource(n)).collect();
        nodes.sort();
        let changed = self.nodes.as_ref() != Some(&nodes);
        self.nodes = Some(nodes);
        changed
    }
}

/// A local pod's host link, as the daemon's ledger has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalLink {
    /// The pod's UID, when the allocation recorded it: a Pod of the same name
    /// and another UID is not this one.
    pub uid: Option<String>,
    pub link: String,
}

/// What the daemon knows of this node that the compile needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeSide {
    /// Local pods' host links by `namespace/name`.
    pub links: BTreeMap<String, LocalLink>,
    /// The node's own addresses (InternalIPs and router addresses).
    pub addresses: Vec<IpAddr>,
}

impl NodeSide {
    /// The pods of `pods` that run here, each with its host link.
    fn local<'a>(&'a self, pods: &'a Mirror<PodView>) -> Vec<Local<'a>> {
        let local = |(key, local): (&String, &'a LocalLink)| {
            let pod = pods.get(key)?;
            let same = match (&local.uid, &pod.uid) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            };
            same.then_some(Local {
                pod,
                link: &local.link,
            })
        };
        self.links.iter().filter_map(local).collect()
    }
}

/// The node's state from the watched views and the node's side, every set
/// made from every pod.
pub fn compile_node(watched: &Watched, node: &NodeSide, enforcement: Enforcement) -> Compiled {
    compile_node_with(
        watched,
        node,
        enforcement,
        &mut SetCache::default(),
        Changes::All,
    )
}

/// [`compile_node`] with the sets of `cache`, brought up to `changes` first.
pub fn compile_node_with(
    watched: &Watched,
    node: &NodeSide,
    enforcement: Enforcement,
    cache: &mut SetCache,
    changes: Changes,
) -> Compiled {
    let labels: BTreeMap<&str, &Labels> = watched
        .namespaces
        .objects()
        .map(|n| (n.name.as_str(), &n.labels))
        .collect();
    let refreshed = cache.refresh(
        changes,
        |key| watched.pods.get(key),
        |ns| labels_in(&labels, ns),
    );
    tracing::debug!(
        pods = refreshed.pods,
        sets_changed = refreshed.sets_changed,
        "NetworkPolicy: kept sets brought up to date"
    );
    let policies: Vec<&PolicyView> = watched.policies.objects().collect();
    let cluster_policies: Vec<&ClusterPolicyView> = watched.cluster_policies.objects().collect();
    let namespaces: Vec<&NamespaceView> = watched.namespaces.objects().collect();
    let pods: Vec<&PodView> = watched.pods.objects().collect();
    compile_with(
        Cluster {
            enforcement,
            policies: &policies,
            cluster_policies: &cluster_policies,
            pods: &pods,
            local: &node.local(&watched.pods),
            namespaces: &namespaces,
            node_addresses: &node.addresses,
            nodes: watched.nodes.as_deref().unwrap_or_default(),
        },
        cache,
    )
}

/// The node's side, from the daemon's state.
async fn node_side(daemon: &Arc<Daemon>) -> Result<NodeSide, ApiError> {
    daemon.with_state(|s| Ok(node_side_of(s, now_ms()))).await
}

/// The node's side as `state` has it at `now` (ms): the pods of the ledger's
/// allocations, and those a delegated IPAM plugin addressed (their endpoints).
pub(crate) fn node_side_of(state: &IpamState, now: u64) -> NodeSide {
    let mut links = BTreeMap::new();
    for a in state.leak_candidates(now) {
        if let (Some(pod), Some(link)) = (a.pod, a.host_link) {
            let uid = a.pod_uid;
            links.insert(pod.to_string(), LocalLink { uid, link });
        }
    }
    for (pod, link) in state.delegated_pods() {
        let uid = None;
        links
            .entry(pod.to_string())
            .or_insert(LocalLink { uid, link });
    }
    let mut addresses: BTreeSet<IpAddr> = state.internal_ips().into_iter().collect();
    addresses.extend(state.router_ips());
    NodeSide {
        links,
        addresses: addresses.into_iter().collect(),
    }
}

/// Which watches are interrupted: the outage is logged once, and its end.
#[derive(Default)]
struct Outage(BTreeSet<&'static str>);

impl Outage {
    /// Takes one item of the `kind` watch; an error is no item for the mirror.
    fn take<K>(
        &mut self,
        kind: &'static str,
        item: Option<Result<watcher::Event<K>, watcher::Error>>,
    ) -> Option<Option<Result<watcher::Event<K>, watcher::Error>>> {
        match item {
            Some(Err(e)) => {
                if self.0.is_empty() {
                    tracing::warn!(error = %e, watch = kind, "NetworkPolicy: the API server cannot be watched; the policy table stays as last written until it can");
                }
                self.0.insert(kind);
                None
            }
            item => {
                if self.0.remove(kind) && self.0.is_empty() {
                    tracing::info!("NetworkPolicy: the watches resumed");
                }
                Some(item)
            }
        }
    }
}

/// One input of the loop.
pub enum Input {
    Pod(Box<WatchItem<PodView>>),
    Namespace(Box<WatchItem<NamespaceView>>),
    Policy(Box<WatchItem<PolicyView>>),
    ClusterPolicy(Box<WatchItem<ClusterPolicyView>>),
    /// What discovery found of the ClusterNetworkPolicy CRD.
    ClusterKind(ClusterKind),
    /// The daemon's node events (a local pod's link may have changed).
    NodeEvent,
    /// The CiliumNode watch's list (None: not listed yet).
    Nodes(Option<ClusterNodeList>),
    /// The CiliumNode watch's task stopped.
    NodesEnded,
}

/// The loop's inputs, merged: the three watches, the daemon's node events and
/// the CiliumNode watch's list.
fn inputs(
    client: &kube::Client,
    daemon: &Daemon,
    cluster_policies: bool,
    nodes: tokio::sync::watch::Receiver<Option<ClusterNodeList>>,
) -> impl Stream<Item = Input> + Unpin + use<> {
    let pods = projected(watch_all::<Pod>(client), PodView::from_k8s);
    let namespaces = projected(watch_all::<Namespace>(client), NamespaceView::from_k8s);
    let policies = projected(watch_all::<NetworkPolicy>(client), |p| view::policy(&p));
    let node_events = stream::unfold(daemon.node_events.subscribe(), |mut rx| async move {
        rx.changed().await.ok().map(|()| (Input::NodeEvent, rx))
    });
    let node_lists = stream::unfold(Some(nodes), |rx| async move {
        let mut rx = rx?;
        match rx.changed().await {
            Ok(()) => {
                let list = rx.borrow_and_update().clone();
                Some((Input::Nodes(list), Some(rx)))
            }
            Err(_) => Some((Input::NodesEnded, None)),
        }
    });
    stream::select_all([
        ending(pods).map(|e| Input::Pod(Box::new(e))).boxed(),
        ending(namespaces)
            .map(|e| Input::Namespace(Box::new(e)))
            .boxed(),
        ending(policies).map(|e| Input::Policy(Box::new(e))).boxed(),
        node_events.boxed(),
        node_lists.boxed(),
        match cluster_policies {
            true => cluster::inputs(client.clone()),
            false => stream::empty().boxed(),
        },
    ])
}

/// Runs the loop until a watch ends (it does not while the API server can be
/// retried). `nodes` is the CiliumNode watch's list.
pub async fn run(
    daemon: Arc<Daemon>,
    kubeconfig: Option<PathBuf>,
    enforcement: Enforcement,
    log: Option<DropLog>,
    cluster_policies: Option<String>,
    mut nodes: tokio::sync::watch::Receiver<Option<ClusterNodeList>>,
) {
    let client = connect_retrying(kubeconfig.as_ref(), "NetworkPolicy", RETRY).await;
    let mut watched = Watched::default();
    watched.take_nodes(nodes.borrow_and_update().as_ref());
    if cluster_policies.is_some() {
        watched.cluster_kind = ClusterKind::Unresolved;
    }
    let events = inputs(&client, &daemon, cluster_policies.is_some(), nodes);
    let events_to = cluster_policies.map(|node| cluster::Problems::new(client.clone(), &node));
    daemon.set_policy_status(PolicyStatus::default());
    let mode = match enforcement {
        Enforcement::Default => "default",
        Enforcement::Always => "always",
    };
    tracing::info!("NetworkPolicy enforcement on (--enable-policy {mode})");
    let worker = match Worker::start() {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(error = %e, "NetworkPolicy: the policy thread did not start; the policy table stays as last written");
            return;
        }
    };
    let mut policy = PolicyLoop {
        daemon,
        worker,
        events_to,
        enforcement,
        watched,
        outage: Outage::default(),
        writer: Some(Writer::new(Kernel { log })),
        last_resync: None,
        log,
        sets: SetCache::default(),
    };
    let ended = controller::run(&mut policy, events, TIMING).await;
    tracing::error!(error = %ended, "NetworkPolicy: the loop stopped; the policy table stays as last written");
}

/// The loop's state.
struct PolicyLoop {
    daemon: Arc<Daemon>,
    /// Where the compile and the writes run ([`worker`]: a nicer thread).
    worker: Worker,
    /// Where ClusterNetworkPolicy problems are posted as Events (None: off).
    events_to: Option<cluster::Problems>,
    enforcement: Enforcement,
    watched: Watched,
    outage: Outage,
    /// None if its task died: the next write starts a new one, which installs.
    writer: Option<Writer<Kernel>>,
    /// The last resync whose pass checked the table.
    last_resync: Option<u32>,
    /// How the final drops are logged (None: silent).
    log: Option<DropLog>,
    /// The pods' sets of the last compile.
    sets: SetCache,
}

/// The table is not as the last compile says (the writer tries again).
#[derive(Debug, thiserror::Error)]
#[error("the policy table is not written")]
pub struct NotWritten;

/// A pass's plan: the node's state and what the status counts of it.
pub struct Planned {
    compiled: Arc<Compiled>,
    count: Count,
}

impl Controller for PolicyLoop {
    type Input = Input;
    /// None: the node's side could not be read (nothing is written).
    type Plan = Option<Planned>;
    type Error = NotWritten;
    const WHAT: &'static str = "a NetworkPolicy write";

    fn feed(&mut self, input: Input) -> Result<bool, WatchEnded> {
        let (w, outage) = (&mut self.watched, &mut self.outage);
        match input {
            Input::Pod(e) => match outage.take("Pod", *e) {
                Some(e) => {
                    w.note_pod(&e);
                    w.pods.feed(e, "Pod")
                }
                None => Ok(false),
            },
            Input::Namespace(e) => match outage.take("Namespace", *e) {
                Some(e) => {
                    // A peer's namespaceSelector reads its labels.
                    w.changes.all();
                    w.namespaces.feed(e, "Namespace")
                }
                None => Ok(false),
            },
            Input::Policy(e) => match outage.take("NetworkPolicy", *e) {
                Some(e) => w.policies.feed(e, "NetworkPolicy"),
                None => Ok(false),
            },
            Input::ClusterPolicy(e) => match outage.take("ClusterNetworkPolicy", *e) {
                Some(e) => w.cluster_policies.feed(e, "ClusterNetworkPolicy"),
                None => Ok(false),
            },
            Input::ClusterKind(kind) => {
                w.cluster_kind = kind;
                Ok(true)
            }
            Input::NodeEvent => Ok(true),
            Input::Nodes(list) => Ok(w.take_nodes(list.as_ref())),
            Input::NodesEnded => Ok(w.nodes_ended()),
        }
    }

    fn ready(&self) -> bool {
        self.watched.synced()
    }

    async fn plan(&mut self) -> Option<Option<Planned>> {
        Some(self.compile().await)
    }

    async fn apply(&mut self, plan: Option<Planned>) -> Result<(), NotWritten> {
        self.pass(plan, None).await
    }

    async fn check(&mut self, plan: Option<Planned>, resync: u32) -> Result<(), NotWritten> {
        let depth = check_depth(self.last_resync, resync);
        self.last_resync = Some(resync);
        self.pass(plan, Some(depth)).await
    }

    /// The writer logs what failed.
    fn failed(&self, _error: &NotWritten, _retry_in: Duration) {}
}

impl PolicyLoop {
    /// Checks the kernel's table when `check` says, and writes (on the policy
    /// thread, off the runtime's: nft is a process); reports the pass.
    async fn pass(
        &mut self,
        plan: Option<Planned>,
        check: Option<Depth>,
    ) -> Result<(), NotWritten> {
        if let Some(planned) = plan {
            let log = self.log;
            let mut writer = self
                .writer
                .take()
                .unwrap_or_else(|| Writer::new(Kernel { log }));
            let compiled = planned.compiled;
            let done = self
                .worker
                .run(move || {
                    let pass = writer.pass(&compiled, check);
                    (writer, pass)
                })
                .await;
            let pass = match done {
                Ok((writer, pass)) => {
                    self.writer = Some(writer);
                    Some(pass)
                }
                Err(e) => {
                    tracing::error!(error = %e, "NetworkPolicy: the write did not finish");
                    None
                }
            };
            let written = !self.pending();
            if let (Some(to), ClusterKind::Served(version)) =
                (self.events_to.as_mut(), &self.watched.cluster_kind)
            {
                to.post(version, &planned.count.cluster_problems).await;
            }
            let audit = self.log.is_some_and(|l| l.audit);
            report(&self.daemon, planned.count, pass, written, audit).await;
        }
        match self.pending() {
            true => Err(NotWritten),
            false => Ok(()),
        }
    }

    /// Whether the table waits for a write.
    fn pending(&self) -> bool {
        self.writer.as_ref().is_none_or(Writer::pending)
    }
}

/// What one write reports, for the metrics and the status.
#[derive(Clone)]
struct Count {
    policies: usize,
    problems: Vec<String>,
    /// The ClusterNetworkPolicies' problems (also in `problems`), for Events.
    cluster_problems: Vec<Problem>,
    /// The ClusterNetworkPolicy line of the status (None: off).
    cluster: Option<String>,
    pods_enforced: usize,
    /// Which policies select each local pod, for explain once written.
    explanations: Arc<Explanations>,
    /// Every pod's `namespace/name` by address, for the verdicts once written
    /// (None: the drops are not logged, so there are no verdicts to name).
    pods_by_ip: Option<HashMap<IpAddr, String>>,
}

impl PolicyLoop {
    /// Compiles the node's state and counts it (None: the node's side cannot
    /// be read), off the runtime's threads, which answer the plugin: the views
    /// and the kept sets go to the policy thread and come back with the plan
    /// (the count walks every pod when the verdicts need their names). The events
    /// that arrive meanwhile wait in the watches' streams; the next pass takes
    /// them all at once.
    async fn compile(&mut self) -> Option<Planned> {
        let node = match node_side(&self.daemon).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e.message, "NetworkPolicy: the node's links cannot be read; not written");
                return None;
            }
        };
        let mut watched = std::mem::take(&mut self.watched);
        let mut sets = std::mem::take(&mut self.sets);
        let (enforcement, names) = (self.enforcement, self.log.is_some());
        let planned = self.worker.run(move || {
            let changes = std::mem::take(&mut watched.changes);
            let compiled = compile_node_with(&watched, &node, enforcement, &mut sets, changes);
            let planned = planned(&watched, compiled, names);
            (watched, sets, planned)
        });
        let (watched, sets, planned) = match planned.await {
            Ok(done) => done,
            Err(e) => {
                tracing::warn!(error = %e, "NetworkPolicy: the compile did not run");
                return None;
            }
        };
        self.watched = watched;
        self.sets = sets;
        Some(planned)
    }
}

/// The plan of `compiled`, with what the status counts of it (`names`: with
/// every pod's name by address, for the verdicts).
fn planned(watched: &Watched, mut compiled: Compiled, names: bool) -> Planned {
    let links: BTreeSet<&str> = compiled
        .state
        .chains
        .keys()
        .map(|k| k.link.as_str())
        .collect();
    let pods_enforced = links.len();
    let count = Count {
        policies: watched.policies.objects().count(),
        problems: compiled.problems.iter().map(|p| p.to_string()).collect(),
        cluster_problems: compiled
            .problems
            .iter()
            .filter(|p| p.kind == Kind::ClusterNetworkPolicy)
            .cloned()
            .collect(),
        cluster: cluster::status_line(watched),
        pods_enforced,
        explanations: Arc::new(std::mem::take(&mut compiled.explanations)),
        pods_by_ip: names.then(|| pods_by_ip(&watched.pods)),
    };
    Planned {
        compiled: Arc::new(compiled),
        count,
    }
}

/// Every pod's `namespace/name` by each of its addresses.
fn pods_by_ip(pods: &Mirror<PodView>) -> HashMap<IpAddr, String> {
    let named = pods
        .objects()
        .flat_map(|p| p.ips.iter().map(move |ip| (*ip, p.key())));
    named.collect()
}

/// The packets the verdict log's limit suppressed, from the kernel's counter
/// (None: it cannot be read, which is logged at debug level).
pub async fn suppressed() -> Option<u64> {
    match tokio::task::spawn_blocking(crate::policy::table::suppressed).await {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "the verdict log's counter cannot be read");
            None
        }
        Err(_) => None,
    }
}

/// Puts one write into the status, the metrics and the verdicts' names.
async fn report(
    daemon: &Arc<Daemon>,
    c: Count,
    pass: Option<Pass>,
    table_written: bool,
    audit_mode: bool,
) {
    let Some(Pass {
        repaired,
        wrote,
        took,
    }) = pass
    else {
        return;
    };
    let problems = c.problems.len();
    if wrote != Wrote::Failed {
        if let (Some(verdicts), Some(pods)) = (daemon.verdicts(), c.pods_by_ip) {
            verdicts.set_names(Names {
                pods,
                explanations: c.explanations.clone(),
            });
        }
        daemon.set_policy_explanations(c.explanations);
    }
    daemon.set_policy_status(PolicyStatus {
        synced: true,
        table_written,
        policies: c.policies as u64,
        pods_enforced: c.pods_enforced as u64,
        problems: c.problems,
        cluster_policies: c.cluster,
        audit_mode,
    });
    let _ = daemon
        .with_state(move |s| {
            let m = s.metrics();
            m.policy_problems.set(problems as i64);
            m.policy_pods_enforced.set(c.pods_enforced as i64);
            if let Some(result) = wrote.result() {
                let labels = ResultLabels {
                    result: result.into(),
                };
                m.policy_updates.get_or_create(&labels).inc();
                m.policy_write_seconds
                    .get_or_create(&labels)
                    .observe(took.as_secs_f64());
            }
            if let Some(found) = repaired.as_ref().and_then(Found::label) {
                let labels = FoundLabels {
                    found: found.into(),
                };
                m.policy_table_repairs.get_or_create(&labels).inc();
            }
            Ok(())
        })
        .await;
}

#[cfg(test)]
#[path = "tests/node.rs"]
mod tests;

#[cfg(test)]
#[path = "tests/incremental.rs"]
mod incremental_tests;
