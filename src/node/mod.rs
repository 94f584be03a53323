//! What this node owns, and where that truth lives: the node resource (shaped like
//! Cilium's `CiliumNode`) and the backends that hold it. A backend is three small
//! parts, and the daemon does not know which backend runs:
//! - a [`NodeSource`]: what the backend has at start ([`NodeView`]), then typed
//!   [`NodeEvent`]s (this node's resource, pools, the default pool, pod metadata)
//!   that one loop in the daemon applies to the state;
//! - a [`NodeSink`], optional: a writer task flushes the state's [`NodeOutbox`]
//!   (requested pools, used addresses, node addresses) to where the backend keeps
//!   the resource, rate-limited and never under the state's lock;
//! - a [`NodeOperator`], optional: the operator's part (carving node CIDRs and pool
//!   blocks), present in the embedded backend for a single node, absent where a
//!   cluster operator owns it.
//!
//! Backends: `embedded` (the embedded operator, manifests in watched directories:
//! [`manifest_source`]), `external` (crd/eni: a CiliumNode file an external IPAM
//! writes: [`external`]) and `kubernetes` (this node's CiliumNode and Node through
//! the API server: [`kubernetes`]). The Kubernetes backend also watches every
//! other node's CiliumNode for the cross-node datapath ([`cluster_nodes`]).

pub mod cilium_node_file;
pub mod cluster_nodes;
mod embedded;
pub mod external;
pub(crate) mod kube_pools;
pub mod kubernetes;
pub mod manifest_source;
pub mod manifests;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::pin::Pin;

use ipnet::IpNet;

use crate::ipam::Family;
use crate::ipam::clusterpool::ClusterPoolError;
use crate::ipam::pool_operator::PoolsRefused;
use crate::ipam::pooldef::PoolDef;
use crate::ipam::selection::MetadataSource;
use crate::k8s::connect::ConnectError;
use crate::k8s::discovery::DiscoveryError;
use crate::k8s::objects::ListError;
use crate::resources::InvalidObject;
use cilium_node_file::NodeFileError;
use manifests::ManifestError;

pub use crate::resources::{
    AllocationIp, HealthAddresses, NodeAddress, NodeResource, RequestedPool,
};
pub use embedded::{EmbeddedMode, EmbeddedOperator};

/// Why a backend could not do what was asked; the text says which object and why.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The node-resource file (`--node-resource`) cannot be read, or is invalid.
    #[error(transparent)]
    File(#[from] NodeFileError),
    /// The node-resource file describes another node.
    #[error("{} describes node {found:?}, not this node {expected:?}", .path.display())]
    NotThisNode {
        path: PathBuf,
        found: String,
        expected: String,
    },
    /// The journal's node resource is another node's.
    #[error(
        "the journal belongs to node {found:?}, not {expected:?}; use the node's own --state-dir or move the journal aside"
    )]
    JournalOfAnotherNode { found: String, expected: String },
    /// A manifest directory (`--pool-dir`, `--metadata-dir`) cannot be read.
    #[error(transparent)]
    Manifests(#[from] ManifestError),
    /// The pool definitions do not fit this node (which pool, which block, why).
    #[error(transparent)]
    Pools(PoolsRefused),
    /// The node ran cluster-pool and is restarted in multi-pool mode without the
    /// migration.
    #[error(
        "node {node} was running cluster-pool (spec.ipam.podCIDRs = {pod_cidrs:?}); restarting it in multi-pool mode needs enable-cluster-pool-to-multi-pool-migration=true and a default pool {default_pool:?} that covers those CIDRs with the same mask"
    )]
    MigrationNotEnabled {
        node: String,
        pod_cidrs: Vec<String>,
        default_pool: String,
    },
    /// The migration's default pool is not defined.
    #[error(
        "cluster-pool to multi-pool migration needs the default pool {0:?} to exist before the restart"
    )]
    MigrationWithoutDefaultPool(String),
    /// ipam=kubernetes (embedded) without the node's pod CIDR of an enabled family.
    #[error(
        "Required {} PodCIDR not available: ipam=kubernetes needs the node's {} pod CIDR (--pod-cidrs, or --{}-range)",
        .0.label(),
        .0.label(),
        .0.label().to_lowercase()
    )]
    PodCidrNotGiven(Family),
    /// ipam=kubernetes: the Node object has no pod CIDR of an enabled family.
    #[error("Required {} PodCIDR not available", .0.label())]
    PodCidrMissing(Family),
    /// The ENI inventory cannot be turned into pool blocks (`ipam::eni`'s words).
    #[error(transparent)]
    Eni(#[from] crate::ipam::eni::EniError),
    /// The cluster pool is not one (its CIDRs and mask sizes).
    #[error(transparent)]
    ClusterPool(#[from] ClusterPoolError),
    /// The operator cannot give the node its CIDRs (Cilium's operator errors).
    #[error("node {node}: {source}")]
    Carve {
        node: String,
        #[source]
        source: ClusterPoolError,
    },
    /// The API server cannot be reached with the configuration given.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// An object the API server sent is not one podnet reads.
    #[error(transparent)]
    Decode(#[from] InvalidObject),
    /// A kind's CRD is not served (at a version podnet reads).
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    /// Listing a kind failed.
    #[error(transparent)]
    List(#[from] ListError),
    /// A call to the API server failed.
    #[error("{op}: {source}")]
    Api {
        /// What was being done (`applying CiliumNode "n1"`).
        op: String,
        #[source]
        source: kube::Error,
    },
    /// The object changed under every attempt at editing it.
    #[error("{op}: it changed {attempts} times in a row; trying again")]
    Changing { op: String, attempts: usize },
    /// A blocking write did not finish.
    #[error("{op}: {source}")]
    Join {
        op: String,
        #[source]
        source: tokio::task::JoinError,
    },
}

/// What a backend has when the daemon starts.
#[derive(Default)]
pub struct NodeView {
    /// This node's resource as the backend keeps it; None where the backend keeps
    /// none of its own (embedded: the journal's copy is the node resource).
    pub node: Option<NodeResource>,
    /// The pool definitions (multi-pool).
    pub pools: Vec<PoolDef>,
    /// This node's default pool, when something overrides the option's
    /// (a CiliumNodeConfig).
    pub default_pool: Option<String>,
    /// Pod and Namespace labels and annotations for pool selection, if any.
    pub metadata: Option<Box<dyn MetadataSource + Send>>,
    /// What the node is (its addresses, the cluster's Service range), where the
    /// backend knows it (the Kubernetes backend).
    pub facts: Option<NodeFacts>,
}

/// What the node is, as far as the daemon's families depend on it: read by the
/// Kubernetes backend, judged by the daemon (`daemon::node_check`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    /// The InternalIPs its Node lists in `status.addresses` (empty: none yet).
    pub internal_ips: Vec<IpAddr>,
    /// The cluster's Service range.
    pub service_range: ServiceRange,
}

/// The cluster's Service range: every ServiceCIDR's `spec.cidrs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceRange {
    Known(Vec<IpNet>),
    /// Not read, and why (an API server without ServiceCIDRs, a missing grant).
    Unknown(String),
}

/// The daemon's verdict on its configuration against the node, as the node
/// resource shows it (a condition in its status).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigFit {
    /// The node can hand out addresses (warnings aside).
    pub fits: bool,
    /// One CamelCase word, as a Kubernetes condition's reason.
    pub reason: String,
    pub message: String,
}

/// A change the backend saw.
pub enum NodeEvent {
    /// This node's resource changed (crd/eni: the spec and the ENI inventory).
    Node(Box<NodeResource>),
    /// The pool definitions changed.
    Pools(Vec<PoolDef>),
    /// This node's default pool changed (None: back to the option's).
    DefaultPool(Option<String>),
    /// Pod and Namespace metadata changed.
    Metadata(Box<dyn MetadataSource + Send>),
    /// What the node is changed (its Node's InternalIPs).
    Facts(NodeFacts),
}

/// Sends new pool definitions, then the default pool, as a source's watch does
/// when the pools change; false once the daemon no longer listens.
async fn send_pools(
    events: &tokio::sync::mpsc::Sender<NodeEvent>,
    pools: Vec<PoolDef>,
    default_pool: Option<String>,
) -> bool {
    events.send(NodeEvent::Pools(pools)).await.is_ok()
        && events
            .send(NodeEvent::DefaultPool(default_pool))
            .await
            .is_ok()
}

/// A boxed future of a source's watch loop.
pub type WatchFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A boxed future of a sink's flush.
pub type FlushFuture<'a> = Pin<Box<dyn Future<Output = Result<(), NodeError>> + Send + 'a>>;

/// Where the node resource, pools and pod metadata come from.
pub trait NodeSource: Send {
    /// What the backend has now; called once at start, before restore. It may
    /// wait (crd mode waits until the node owns enough addresses, as Cilium does).
    fn initial(&mut self) -> Result<NodeView, NodeError>;

    /// Watches for changes until the daemon stops, sending each as an event.
    fn watch(self: Box<Self>, events: tokio::sync::mpsc::Sender<NodeEvent>) -> WatchFuture;
}

/// `status.ipam.used` / `ipv6-used`: address → owner and resource.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsedAddresses {
    pub ipv4: BTreeMap<String, AllocationIp>,
    pub ipv6: BTreeMap<String, AllocationIp>,
}

/// What the state wants written to the node's resource; each part only when it
/// changed since the last flush.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeOutbox {
    /// `spec.ipam.pools.requested` (multi-pool demand).
    pub requested_pools: Option<Vec<RequestedPool>>,
    /// Multi-pool: the sticky addresses this node asks for (identity -> pool,
    /// the CiliumNode annotation `ipam.podnet.io/sticky-requests`; empty: none).
    pub sticky_requests: Option<BTreeMap<String, String>>,
    /// `status.ipam.used` and `ipv6-used`.
    pub used: Option<UsedAddresses>,
    /// `spec.addresses` (the router's CiliumInternalIP).
    pub addresses: Option<Vec<NodeAddress>>,
    /// `spec.health` (the health endpoint's addresses).
    pub health: Option<HealthAddresses>,
    /// Multi-pool blocks `(pool, cidr)` the node gives back: the sink removes
    /// them from `spec.ipam.pools.allocated` (where a cluster operator owns it).
    pub released_blocks: Vec<(String, IpNet)>,
    /// Whether the configuration fits the node (where the backend told the facts).
    pub config_fit: Option<ConfigFit>,
    /// cluster-pool: `status.ipam.pod-cidrs`, the agent's verdict on its CIDRs.
    pub pod_cidrs: Option<BTreeMap<String, crate::resources::PodCidrStatus>>,
    /// Whether new pods can get an address here, when that changed (the
    /// Kubernetes backend taints its Node while they cannot).
    pub address_room: Option<AddressRoom>,
}

/// Whether a new pod on the node can get an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressRoom {
    Available,
    /// Every range of a family is full: why, in words (`ipam::exhaustion`).
    Exhausted(String),
    /// Multi-pool: some pools are exhausted while another has room: why, in
    /// words (`ipam::exhaustion::exhausted_pools`); said without the taint.
    PoolsExhausted(String),
}

impl NodeOutbox {
    pub fn is_empty(&self) -> bool {
        self.released_blocks.is_empty()
            && self.config_fit.is_none()
            && self.requested_pools.is_none()
            && self.sticky_requests.is_none()
            && self.used.is_none()
            && self.addresses.is_none()
            && self.health.is_none()
            && self.pod_cidrs.is_none()
            && self.address_room.is_none()
    }
}

/// Writes the outbox to where the backend keeps the node resource. Called by the
/// writer task once per update interval, outside the state's lock, with what
/// changed since the last call (often nothing); a sink keeps what it failed to
/// write and tries again at the next call. The flush is async: a sink that
/// blocks runs its blocking part off the runtime itself.
pub trait NodeSink: Send {
    fn flush<'a>(&'a mut self, outbox: &'a NodeOutbox) -> FlushFuture<'a>;
}

/// The operator's part for this node: what the node owns at start, blocks on
/// demand, blocks given back. Pure bookkeeping, no I/O: the state calls it under
/// its lock.
pub trait NodeOperator: Send {
    /// Brings the node resource up to date at start (cluster-pool: carve the node
    /// CIDRs; kubernetes: take the given ones; multi-pool: adopt the node's blocks,
    /// or migrate its cluster-pool CIDRs) and returns it.
    fn sync(&mut self, current: Option<NodeResource>) -> Result<NodeResource, NodeError>;

    /// Multi-pool: carves blocks until `spec.ipam.pools.requested` is met, into
    /// `spec.ipam.pools.allocated`. Returns the errors it also writes into
    /// `status.ipam.operator-status.error` (empty: all met).
    fn satisfy(&mut self, node: &mut NodeResource) -> Vec<String>;

    /// Multi-pool: the node gave a block back.
    fn release_block(&mut self, pool: &str, cidr: &IpNet);

    /// Multi-pool: the pool definitions changed; refused (nothing changes) when a
    /// change breaks what the node uses.
    fn update_pools(&mut self, pools: &[PoolDef], node: &NodeResource) -> Result<(), NodeError>;
}

/// What a backend says about itself for `podnet status`: which backend, where it
/// reads from (the API server, the directories, the file), and whether each of
/// its watches has listed (and not failed since).
pub struct BackendHealth {
    pub kind: &'static str,
    location: std::sync::Mutex<String>,
    watches: std::sync::Mutex<BTreeMap<String, bool>>,
    /// What the backend waits for (a CRD, the operator's blocks, ...), by subject.
    waiting: std::sync::Mutex<BTreeMap<String, String>>,
    /// Told the whole waiting list after each change (the daemon, while it
    /// starts, writes it where `podnet status` finds it before the socket answers).
    on_waiting: std::sync::Mutex<Option<WaitingHook>>,
}

/// See [`BackendHealth::on_waiting`].
pub type WaitingHook = Box<dyn Fn(&[String]) + Send>;

impl BackendHealth {
    pub fn new(kind: &'static str, location: String) -> std::sync::Arc<BackendHealth> {
        std::sync::Arc::new(BackendHealth {
            kind,
            location: std::sync::Mutex::new(location),
            watches: std::sync::Mutex::new(BTreeMap::new()),
            waiting: std::sync::Mutex::new(BTreeMap::new()),
            on_waiting: std::sync::Mutex::new(None),
        })
    }

    /// Records that the backend waits for `what` on `subject` (None: no longer).
    pub fn set_waiting(&self, subject: &str, what: Option<String>) {
        let list = {
            let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            let changed = match what {
                Some(w) => waiting.insert(subject.to_string(), w.clone()) != Some(w),
                None => waiting.remove(subject).is_some(),
            };
            if !changed {
                return;
            }
            waiting.values().cloned().collect::<Vec<_>>()
        };
        if let Some(hook) = &*self.on_waiting.lock().unwrap_or_else(|p| p.into_inner()) {
            hook(&list);
        }
    }

    /// What the backend waits for now, one line each ("CRD ... at v2 (not installed)").
    pub fn waiting(&self) -> Vec<String> {
        self.waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Sets (or, with None, removes) the hook told the waiting list after each change.
    pub fn on_waiting(&self, hook: Option<WaitingHook>) {
        *self.on_waiting.lock().unwrap_or_else(|p| p.into_inner()) = hook;
    }

    /// Where the backend reads from.
    pub fn location(&self) -> String {
        self.location
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Says where the backend reads from (once it knows, e.g. the API server).
    pub fn set_location(&self, location: String) {
        *self.location.lock().unwrap_or_else(|p| p.into_inner()) = location;
    }

    /// Records whether `watch` is synced.
    pub fn set(&self, watch: &str, synced: bool) {
        self.watches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(watch.to_string(), synced);
    }

    /// Each watch and whether it is synced.
    pub fn watches(&self) -> BTreeMap<String, bool> {
        self.watches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn the_waiting_hook_hears_each_change_once() {
        let health = BackendHealth::new("kubernetes", String::new());
        let heard = Arc::new(Mutex::new(Vec::new()));
        let h = heard.clone();
        health.on_waiting(Some(Box::new(move |w: &[String]| {
            h.lock().unwrap().push(w.to_vec())
        })));
        health.set_waiting("start", Some("the API server".into()));
        health.set_waiting("start", Some("the API server".into()));
        health.set_waiting("crd", Some("CRD x".into()));
        health.set_waiting("start", None);
        health.set_waiting("start", None);
        assert_eq!(health.waiting(), ["CRD x"]);
        health.on_waiting(None);
        health.set_waiting("crd", None);
        assert_eq!(
            *heard.lock().unwrap(),
            [
                vec!["the API server".to_string()],
                vec!["CRD x".into(), "the API server".into()],
                vec!["CRD x".into()],
            ]
        );
        assert!(health.waiting().is_empty());
    }
}
