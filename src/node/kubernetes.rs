//! The Kubernetes backend: this node's `CiliumNode` (cilium.io/v2) and `Node`
//! through the API server, with kube-rs. The source waits at start for what the
//! mode needs (kubernetes: `Node.spec.podCIDRs`, mirrored into the CiliumNode;
//! cluster-pool: the CIDRs the operator writes into `spec.ipam.podCIDRs`, followed
//! with a watch of the CiliumNode so the node serves as soon as the write lands),
//! unless the API server cannot be reached and the journal already knows the node's
//! CIDRs: then the node serves from what it owns. It then watches the CiliumNode (new blocks,
//! single IPs) and survives API-server restarts and expired resourceVersions (the
//! watcher relists). The sink writes the agent's fields with server-side apply under
//! its own field manager (`podnet-agent`): `spec.addresses` (InternalIP and the
//! router's CiliumInternalIP), the owner reference to the Node (deleting the Node
//! deletes its CiliumNode), `spec.ipam.podCIDRs` in kubernetes mode and
//! `spec.ipam.pools.requested` in multi-pool. Apply owns exactly the fields it
//! sends, so the operator's (`spec.ipam.podCIDRs` in cluster-pool, the allocated
//! blocks, `status.ipam.operator-status`) are never touched, and a conflict is an
//! error, not a lost write. The one exception: in multi-pool the agent gives free
//! blocks back by removing them from the operator's `spec.ipam.pools.allocated`
//! (as Cilium's agent does), with a merge patch that carries the resourceVersion
//! it was computed from, re-read and retried when the node changed meanwhile
//! (`operator::multi_pool` describes the whole protocol). In the external modes the
//! sink applies `status.ipam.used` through the status subresource, only when it
//! differs from what the CiliumNode held when the source last saw it. In
//! cluster-pool the source follows `spec.ipam.podCIDRs` (an extra CIDR the operator
//! appends is served from as it lands), and the sink applies the agent's verdict
//! on them, `status.ipam.pod-cidrs`, the same way under a field manager of its
//! own ([`POD_CIDRS_FIELD_MANAGER`]).
//!
//! The source also reads what the node is for the daemon's configuration check
//! (`daemon::node_check`): its Node's InternalIPs at start and then with a watch
//! of the Node, and the cluster's Service range (the ServiceCIDRs) at start. The
//! sink writes the verdict as the condition [`FIT_CONDITION`] in
//! `status.conditions`, under a field manager of its own, when it differs from
//! what the CiliumNode holds.
//!
//! The source runs its start's API calls on the daemon's runtime through its
//! handle (`initial` is called from a plain thread, never from a task); the sink
//! is async.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node as KubeNode;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::api::{
    Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, WatchEvent, WatchParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::runtime::Handle;

use super::external::offered;
use super::kube_pools::{self, KubeMetadata, PoolResources};
use super::{
    BackendHealth, ConfigFit, FlushFuture, HealthAddresses, NodeAddress, NodeError, NodeEvent,
    NodeFacts, NodeOutbox, NodeResource, NodeSink, NodeSource, NodeView, RequestedPool,
    ServiceRange, UsedAddresses, WatchFuture,
};
use crate::ipam::Family;
use crate::ipam::eni::eni_allocation;
use crate::k8s::connect::{api_server_url, connect};
use crate::k8s::discovery::{CiliumKind, DiscoveryError, resolve, resolve_waiting};
use crate::k8s::objects::{ApplyBody, condition_json, node_resource, typed};
use crate::resources::{Node, PodCidrStatus};

/// The field manager of the agent's server-side applies.
pub const FIELD_MANAGER: &str = "podnet-agent";
/// The field manager of the agent's condition in `status.conditions` (its own:
/// an apply of the status under [`FIELD_MANAGER`] would give up
/// `status.ipam.used`, which crd-class modes apply there).
pub const CHECK_FIELD_MANAGER: &str = "podnet-agent-config-check";
/// The field manager of the agent's `status.ipam.pod-cidrs` (its own, for the
/// reason [`CHECK_FIELD_MANAGER`] has one).
pub const POD_CIDRS_FIELD_MANAGER: &str = "podnet-agent-pod-cidrs";
/// The condition saying whether the agent's configuration fits the node
/// (`daemon::node_check`).
pub const FIT_CONDITION: &str = "podnet.io/ConfigFitsNode";
/// How often a start that waits (for the API server, the Node, the CIDRs) retries.
const RETRY: Duration = Duration::from_secs(1);
/// The subject of what the start waits for in `podnet status`.
const START: &str = "start";
/// How long a start follows its CiliumNode for the operator's write before it
/// re-reads the Node and applies again.
const START_WATCH: Duration = Duration::from_secs(10);

/// What the node's CIDRs come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubernetesMode {
    /// `Node.spec.podCIDRs`, mirrored into the CiliumNode by the agent.
    Kubernetes,
    /// `spec.ipam.podCIDRs`, written by the operator.
    ClusterPool,
    /// `spec.ipam.pools.allocated`, written by the operator on demand.
    MultiPool,
    /// crd, azure, alibabacloud (`eni: false`) and eni: what the external IPAM
    /// writes into the CiliumNode (single IPs, or the ENI inventory as blocks).
    External { eni: bool },
}

/// Where the API server is and how to reach it.
#[derive(Debug, Clone)]
pub struct KubernetesConfig {
    /// `--k8s-kubeconfig-path`; None: the in-cluster service account.
    pub kubeconfig: Option<PathBuf>,
    pub node_name: String,
    pub mode: KubernetesMode,
    /// The enabled families (IPv4, IPv6), for kubernetes mode's CIDR check.
    pub ipv4: bool,
    pub ipv6: bool,
    /// External modes: addresses the node must own before the daemon serves.
    pub needed: u64,
    /// multi-pool: the demand written at start (the pre-allocated pools and the
    /// default pool's router and health addresses); the source waits until each of
    /// these pools has a block, as Cilium's agent does.
    pub initial_demand: Vec<RequestedPool>,
}

/// The fields the agent owns in its CiliumNode (one apply always sends them all:
/// what an apply leaves out, the manager gives up).
#[derive(Debug, Clone, Default)]
struct AgentFields {
    node_uid: String,
    internal_ips: Vec<String>,
    router_addresses: Vec<NodeAddress>,
    health: HealthAddresses,
    pod_cidrs: Option<Vec<IpNet>>,
    requested: Option<Vec<RequestedPool>>,
}

impl AgentFields {
    /// The router and health addresses the journal says the node published, so
    /// the first apply of a restarted agent keeps them (an apply without them
    /// would drop them from the CiliumNode until the state is restored, and the
    /// other nodes would withdraw their routes to this node meanwhile).
    fn from_journal(node: Option<&NodeResource>) -> AgentFields {
        let Some(node) = node else {
            return AgentFields::default();
        };
        AgentFields {
            router_addresses: node
                .spec
                .addresses
                .iter()
                .filter(|a| a.kind == "CiliumInternalIP")
                .cloned()
                .collect(),
            health: node.spec.health.clone(),
            ..AgentFields::default()
        }
    }

    fn apply_body(&self, node_name: &str, api_version: &str) -> serde_json::Value {
        let mut addresses: Vec<serde_json::Value> = self
            .internal_ips
            .iter()
            .map(|ip| json!({"type": "InternalIP", "ip": ip}))
            .collect();
        addresses.extend(
            self.router_addresses
                .iter()
                .map(|a| json!({"type": a.kind, "ip": a.ip})),
        );
        let mut ipam = serde_json::Map::new();
        if let Some(cidrs) = &self.pod_cidrs {
            ipam.insert("podCIDRs".into(), json!(cidrs));
        }
        if let Some(requested) = &self.requested {
            ipam.insert("pools".into(), json!({ "requested": requested }));
        }
        let mut metadata = json!({"name": node_name});
        if !self.node_uid.is_empty() {
            metadata["ownerReferences"] = json!([{
                "apiVersion": "v1",
                "kind": "Node",
                "name": node_name,
                "uid": self.node_uid,
            }]);
        }
        let mut spec = json!({"addresses": addresses, "ipam": ipam});
        if !self.health.is_empty() {
            spec["health"] = json!(self.health);
        }
        json!({
            "apiVersion": api_version,
            "kind": "CiliumNode",
            "metadata": metadata,
            "spec": spec,
        })
    }
}

/// What one attempt at the start came to.
enum Attempt {
    /// The view, and the Node's labels (CiliumNodeConfig node selectors).
    Ready(Box<NodeView>, BTreeMap<String, String>),
    /// Still waiting for this (logged once, and shown in `podnet status`).
    Waiting(String),
}

/// The `ciliumnodes` resource API discovery found (shared by source and sink;
/// None until the source's start or the sink's first write resolved it).
type NodesResource = Arc<Mutex<Option<ApiResource>>>;

/// What the start resolved by API discovery: the CiliumNode resource and, in
/// multi-pool, the pools'.
struct Discovered {
    nodes: ApiResource,
    pools: Option<PoolResources>,
}

/// The resources `mode` needs, at the versions the API server serves (an error
/// that `is_missing_crd` is one the start waits out).
async fn discover(
    client: &kube::Client,
    mode: KubernetesMode,
) -> Result<Discovered, DiscoveryError> {
    Ok(Discovered {
        nodes: resolve(client, CiliumKind::Node).await?,
        pools: match mode {
            KubernetesMode::MultiPool => Some(PoolResources::resolve(client).await?),
            _ => None,
        },
    })
}

/// The API server's URL, for status.
async fn api_server(config: &KubernetesConfig) -> String {
    api_server_url(config.kubeconfig.as_ref()).await
}

/// What the agent writes into the status of this node's CiliumNode, as the last
/// version the source saw held it (None: none seen yet, or the last one did not
/// decode). The sink does not apply what the CiliumNode already holds: its own
/// apply comes back through the watch, and applying it again would be a write that
/// changes nothing. Another writer's change comes back the same way and differs,
/// so it is written over.
#[derive(Debug, Default)]
struct Seen {
    /// External modes: `status.ipam.used` / `ipv6-used`.
    used: Option<UsedAddresses>,
    /// The [`FIT_CONDITION`] in `status.conditions`.
    fit: Option<serde_json::Value>,
    /// cluster-pool: `status.ipam.pod-cidrs`.
    pod_cidrs: Option<BTreeMap<String, PodCidrStatus>>,
}

type SharedSeen = Arc<Mutex<Seen>>;

/// The used addresses a node resource lists in its status.
fn used_in(node: &NodeResource) -> UsedAddresses {
    UsedAddresses {
        ipv4: node.status.ipam.used.clone(),
        ipv6: node.status.ipam.ipv6_used.clone(),
    }
}

/// The [`FIT_CONDITION`] a node resource has in its status.
fn fit_in(node: &NodeResource) -> Option<serde_json::Value> {
    node.status
        .extra
        .get("conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == FIT_CONDITION)
        .cloned()
}

/// Notes what `node` (the version just seen; None: one that did not decode) holds.
fn see(seen: &SharedSeen, node: Option<&NodeResource>) {
    *seen.lock().unwrap_or_else(|p| p.into_inner()) = Seen {
        used: node.map(used_in),
        fit: node.and_then(fit_in),
        pod_cidrs: node.map(|n| n.status.ipam.pod_cidrs.clone()),
    };
}

/// Both halves of the backend, sharing the agent's fields and the used addresses
/// last seen.
pub fn kubernetes_backend(
    config: KubernetesConfig,
    runtime: Handle,
    journal_node: Option<NodeResource>,
    health: Arc<BackendHealth>,
) -> (KubernetesSource, KubernetesSink) {
    let fields = Arc::new(Mutex::new(AgentFields::from_journal(journal_node.as_ref())));
    let seen = SharedSeen::default();
    let nodes = NodesResource::default();
    (
        KubernetesSource {
            config: config.clone(),
            runtime: runtime.clone(),
            journal_node,
            fields: fields.clone(),
            seen: seen.clone(),
            nodes: nodes.clone(),
            pools: None,
            client: None,
            node_labels: BTreeMap::new(),
            facts: None,
            health,
        },
        KubernetesSink {
            config,
            fields,
            seen,
            nodes,
            client: None,
            pending: false,
            pending_used: None,
            pending_fit: None,
            pending_released: BTreeSet::new(),
            pending_pod_cidrs: None,
        },
    )
}

/// This node's CiliumNode (and Node) from the API server.
pub struct KubernetesSource {
    config: KubernetesConfig,
    runtime: Handle,
    /// What the journal says the node owned (served from if the API server is down).
    journal_node: Option<NodeResource>,
    fields: Arc<Mutex<AgentFields>>,
    seen: SharedSeen,
    nodes: NodesResource,
    /// multi-pool: the pools' resources, once the start resolved them.
    pools: Option<PoolResources>,
    client: Option<kube::Client>,
    /// The Node's labels (CiliumNodeConfig node selectors).
    node_labels: BTreeMap<String, String>,
    /// What the node is, as the start read it (None: the start served from the
    /// journal); the watch follows its Node's InternalIPs from there.
    facts: Option<NodeFacts>,
    health: Arc<BackendHealth>,
}

impl KubernetesSource {
    /// The node's CIDRs the journal knows, if any (what the node owns already).
    fn journal_owns_something(&self) -> bool {
        self.journal_node.as_ref().is_some_and(|n| {
            !n.spec.ipam.pod_cidrs.is_empty()
                || n.spec
                    .ipam
                    .pools
                    .allocated
                    .iter()
                    .any(|a| !a.cidrs.is_empty())
        })
    }

    async fn initial_async(&mut self) -> Result<NodeView, NodeError> {
        let client = connect(self.config.kubeconfig.as_ref()).await?;
        self.health
            .set_location(format!("API server {}", api_server(&self.config).await));
        self.client = Some(client.clone());
        let name = self.config.node_name.clone();
        let nodes: Api<KubeNode> = Api::all(client.clone());
        let mut waiting_logged = false;
        let mut awaited = String::new();
        loop {
            let attempt = match discover(&client, self.config.mode).await {
                Ok(found) => {
                    *self.nodes.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(found.nodes.clone());
                    self.pools = found.pools;
                    self.try_initial(&nodes, &client, &found.nodes, &mut awaited)
                        .await
                }
                // The CRD is missing or serves no version podnet understands.
                Err(e) if e.is_missing_crd() => {
                    tracing::debug!(error = %e, "API discovery");
                    Ok(Attempt::Waiting(e.awaited()))
                }
                Err(e) => Err(e.into()),
            };
            match attempt {
                Ok(Attempt::Ready(mut view, labels)) => {
                    self.health.set_waiting(START, None);
                    if let Some(resources) = &self.pools {
                        let (pools, default_pool) =
                            kube_pools::pools_now(&client, resources, &labels).await?;
                        view.pools = pools;
                        view.default_pool = default_pool;
                    }
                    // Pool selection (multi-pool) and the address annotation
                    // (every mode: `ipam::address_request`) read this node's Pods.
                    view.metadata = Some(Box::new(KubeMetadata::start(
                        &client,
                        &name,
                        &self.runtime,
                        self.health.clone(),
                    )));
                    self.node_labels = labels;
                    view.facts = Some(NodeFacts {
                        internal_ips: self.internal_ips(),
                        service_range: service_range(&client).await,
                    });
                    self.facts = view.facts.clone();
                    return Ok(*view);
                }
                Ok(Attempt::Waiting(what)) => {
                    self.health.set_waiting(START, Some(what.clone()));
                    if what != awaited {
                        tracing::info!(node = %name, "waiting for {what}");
                        awaited = what;
                    }
                }
                Err(e) if self.journal_owns_something() => {
                    self.health.set_waiting(START, None);
                    tracing::warn!(error = %e, node = %name, "the API server cannot be reached: serving from what the journal says this node owns; the watch resumes when it is back");
                    return Ok(NodeView {
                        node: self.journal_node.clone(),
                        ..NodeView::default()
                    });
                }
                Err(e) => {
                    self.health
                        .set_waiting(START, Some(format!("the API server ({e})")));
                    if !waiting_logged {
                        tracing::warn!(error = %e, node = %name, "waiting for the API server");
                        waiting_logged = true;
                    }
                }
            }
            tokio::time::sleep(RETRY).await;
        }
    }

    /// One attempt: the Node, the agent's apply, then what the mode waits for;
    /// the view and the Node's labels, or what it still waits for
    /// (logged once through `awaited`, the last thing logged as awaited).
    async fn try_initial(
        &self,
        nodes: &Api<KubeNode>,
        client: &kube::Client,
        resource: &ApiResource,
        awaited: &mut String,
    ) -> Result<Attempt, NodeError> {
        let name = &self.config.node_name;
        let io = |source| NodeError::Api {
            op: "Kubernetes API".into(),
            source,
        };
        let Some(node) = nodes.get_opt(name).await.map_err(io)? else {
            return Ok(Attempt::Waiting(format!(
                "this node's Node object {name:?}"
            )));
        };
        let uid = node.metadata.uid.clone().unwrap_or_default();
        // The typed Node: a pod CIDR that is not one is an error naming the field,
        // never silently left out.
        let node: Node = typed(&node, "Node")?;
        let internal_ips: Vec<String> = node
            .status
            .addresses
            .iter()
            .filter(|a| a.kind == "InternalIP")
            .map(|a| a.address.clone())
            .collect();
        let pod_cidrs = match self.config.mode {
            KubernetesMode::Kubernetes => {
                let given = &node.spec.pod_cidrs;
                match kubernetes_cidrs(given, self.config.ipv4, self.config.ipv6) {
                    Ok(c) => Some(c),
                    Err(why) => {
                        return Ok(Attempt::Waiting(format!("Node.spec.podCIDRs ({why})")));
                    }
                }
            }
            _ => None,
        };
        let body = {
            let mut f = self.fields.lock().unwrap_or_else(|p| p.into_inner());
            f.node_uid = uid;
            f.internal_ips = internal_ips;
            f.pod_cidrs = pod_cidrs;
            if self.config.mode == KubernetesMode::MultiPool && f.requested.is_none() {
                f.requested = Some(self.config.initial_demand.clone());
            }
            f.apply_body(name, &resource.api_version)
        };
        let api: Api<DynamicObject> = Api::all_with(client.clone(), resource);
        let applied = api
            .patch(
                name,
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Apply(&body),
            )
            .await
            .map_err(io)?;
        let mut resource = resolved(self.config.mode, to_node_resource(&applied)?)?;
        see(&self.seen, Some(&resource));
        if let Some(what) = self.awaited(&resource) {
            self.health.set_waiting(START, Some(what.clone()));
            if what != *awaited {
                tracing::info!(node = %name, "waiting for {what}");
                *awaited = what.clone();
            }
            // Follow the CiliumNode from this version instead of asking again a
            // second later: the node serves as soon as the operator's write lands.
            let rv = applied
                .metadata
                .resource_version
                .clone()
                .unwrap_or_default();
            match self.await_cilium_node(&api, &rv).await {
                Some(r) => resource = r,
                None => return Ok(Attempt::Waiting(what)),
            }
        }
        let labels = node.metadata.labels.clone();
        let view = NodeView {
            node: Some(resource),
            ..NodeView::default()
        };
        Ok(Attempt::Ready(Box::new(view), labels))
    }
}

impl KubernetesSource {
    /// The InternalIPs the start read from the Node.
    fn internal_ips(&self) -> Vec<IpAddr> {
        internal_ips(
            &self
                .fields
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .internal_ips,
        )
    }

    /// What the start still waits for in this node's CiliumNode, if anything.
    fn awaited(&self, resource: &NodeResource) -> Option<String> {
        let name = &self.config.node_name;
        match self.config.mode {
            KubernetesMode::ClusterPool if resource.spec.ipam.pod_cidrs.is_empty() => Some(
                "the operator to write this node's CIDRs into spec.ipam.podCIDRs of its CiliumNode"
                    .into(),
            ),
            KubernetesMode::MultiPool => {
                let missing = pools_without_blocks(&self.config.initial_demand, resource);
                (!missing.is_empty()).then(|| {
                    format!(
                        "the operator to allocate blocks of pools {missing:?} into spec.ipam.pools.allocated of its CiliumNode"
                    )
                })
            }
            KubernetesMode::External { .. } if offered(resource) < self.config.needed => {
                Some(format!(
                    "initial IP to become available in '{name}' custom resource ({} of {} addresses)",
                    offered(resource),
                    self.config.needed
                ))
            }
            _ => None,
        }
    }

    /// Watches this node's CiliumNode from `rv` for at most [`START_WATCH`] until a
    /// version has what the start waits for. None: not within that time, or the
    /// watch broke (the caller tries again from the top).
    async fn await_cilium_node(&self, api: &Api<DynamicObject>, rv: &str) -> Option<NodeResource> {
        let params = WatchParams::default()
            .fields(&format!("metadata.name={}", self.config.node_name))
            .timeout(START_WATCH.as_secs() as u32);
        let follow = async {
            let mut events = api.watch(&params, rv).await.ok()?.boxed();
            while let Some(event) = events.next().await {
                let obj = match event.ok()? {
                    WatchEvent::Added(o) | WatchEvent::Modified(o) => o,
                    WatchEvent::Bookmark(_) => continue,
                    WatchEvent::Deleted(_) | WatchEvent::Error(_) => return None,
                };
                let resource = to_node_resource(&obj)
                    .and_then(|r| resolved(self.config.mode, r))
                    .ok()?;
                see(&self.seen, Some(&resource));
                if self.awaited(&resource).is_none() {
                    return Some(resource);
                }
            }
            None
        };
        tokio::time::timeout(START_WATCH + RETRY, follow)
            .await
            .ok()
            .flatten()
    }
}

/// The addresses of `listed` (a Node's InternalIPs as it lists them; one that is
/// not an address, which the API server does not let a Node have, is left out).
fn internal_ips(listed: &[String]) -> Vec<IpAddr> {
    listed.iter().filter_map(|a| a.parse().ok()).collect()
}

/// The InternalIPs of a Node object.
fn node_internal_ips(node: &KubeNode) -> Vec<IpAddr> {
    let listed: Vec<String> = node
        .status
        .iter()
        .flat_map(|s| s.addresses.iter().flatten())
        .filter(|a| a.type_ == "InternalIP")
        .map(|a| a.address.clone())
        .collect();
    internal_ips(&listed)
}

/// The cluster's Service range: the CIDRs of every ServiceCIDR
/// (networking.k8s.io/v1, Kubernetes 1.33 and later) not being deleted. The
/// `kubernetes` Service cannot tell it: it has one ClusterIP, of the primary
/// family, on a dual-stack cluster too.
async fn service_range(client: &kube::Client) -> ServiceRange {
    let api: Api<ServiceCIDR> = Api::all(client.clone());
    match api.list(&ListParams::default()).await {
        Ok(list) => ServiceRange::Known(
            list.items
                .iter()
                .filter(|s| s.metadata.deletion_timestamp.is_none())
                .flat_map(|s| s.spec.iter().flat_map(|spec| spec.cidrs.iter().flatten()))
                .filter_map(|c| c.parse::<IpNet>().ok())
                .collect(),
        ),
        Err(kube::Error::Api(e)) if e.code == 404 => ServiceRange::Unknown(
            "the API server serves no networking.k8s.io/v1 ServiceCIDR (Kubernetes before 1.33)"
                .into(),
        ),
        Err(kube::Error::Api(e)) if e.code == 403 => ServiceRange::Unknown(
            "the agent may not list servicecidrs (networking.k8s.io): grant it list (deploy/agent-rbac.yaml)"
                .into(),
        ),
        Err(e) => ServiceRange::Unknown(format!("listing the ServiceCIDRs failed: {e}")),
    }
}

/// Follows this node's Node and tells the daemon when its InternalIPs differ
/// from `facts` (what the start read; None: it read nothing, and the Service
/// range is read with the first Node seen).
async fn watch_node_facts(
    client: kube::Client,
    name: String,
    mut facts: Option<NodeFacts>,
    events: tokio::sync::mpsc::Sender<NodeEvent>,
) {
    let api: Api<KubeNode> = Api::all(client.clone());
    let selector = format!("metadata.name={name}");
    let mut stream = watcher(api, watcher::Config::default().fields(&selector))
        .default_backoff()
        .applied_objects()
        .boxed();
    while let Some(item) = stream.next().await {
        let node = match item {
            Ok(node) => node,
            Err(e) => {
                tracing::warn!(error = %e, "Node watch interrupted; it resumes");
                continue;
            }
        };
        let internal_ips = node_internal_ips(&node);
        let now = match facts.take() {
            Some(f) if f.internal_ips == internal_ips => {
                facts = Some(f);
                continue;
            }
            Some(f) => NodeFacts { internal_ips, ..f },
            None => NodeFacts {
                internal_ips,
                service_range: service_range(&client).await,
            },
        };
        facts = Some(now.clone());
        if events.send(NodeEvent::Facts(now)).await.is_err() {
            return;
        }
    }
}

/// multi-pool: the pools of `demand` the node holds no block of yet.
fn pools_without_blocks(demand: &[RequestedPool], node: &NodeResource) -> Vec<String> {
    demand
        .iter()
        .filter(|r| {
            !node
                .spec
                .ipam
                .pools
                .allocated
                .iter()
                .any(|a| a.pool == r.pool && !a.cidrs.is_empty())
        })
        .map(|r| r.pool.clone())
        .collect()
}

/// kubernetes mode: the first CIDR of each enabled family (Cilium's check).
fn kubernetes_cidrs(given: &[IpNet], v4: bool, v6: bool) -> Result<Vec<IpNet>, NodeError> {
    let mut out = Vec::new();
    for (on, family) in [(v4, Family::V4), (v6, Family::V6)] {
        match given.iter().find(|c| Family::of_net(c) == family) {
            Some(c) if on => out.push(c.trunc()),
            None if on => return Err(NodeError::PodCidrMissing(family)),
            _ => {}
        }
    }
    Ok(out)
}

/// eni: the ENI inventory as blocks of pool `default`, as the external backend does.
fn resolved(mode: KubernetesMode, mut node: NodeResource) -> Result<NodeResource, NodeError> {
    if mode == (KubernetesMode::External { eni: true }) {
        node.spec.ipam.pools.allocated =
            eni_allocation(&node.status.eni.enis, &node.spec.eni).map_err(NodeError::Eni)?;
    }
    Ok(node)
}

/// The typed node resource of a CiliumNode object.
fn to_node_resource(obj: &DynamicObject) -> Result<NodeResource, NodeError> {
    Ok(node_resource(obj)?)
}

impl NodeSource for KubernetesSource {
    fn initial(&mut self) -> Result<NodeView, NodeError> {
        let runtime = self.runtime.clone();
        runtime.block_on(self.initial_async())
    }

    fn watch(self: Box<Self>, events: tokio::sync::mpsc::Sender<NodeEvent>) -> WatchFuture {
        Box::pin(async move {
            let client = match self.client.clone() {
                Some(c) => c,
                None => match connect(self.config.kubeconfig.as_ref()).await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot watch this node's CiliumNode");
                        return;
                    }
                },
            };
            tokio::spawn(watch_node_facts(
                client.clone(),
                self.config.node_name.clone(),
                self.facts.clone(),
                events.clone(),
            ));
            if self.config.mode == KubernetesMode::MultiPool {
                tokio::spawn(kube_pools::watch_pools(
                    client.clone(),
                    self.pools.clone(),
                    self.node_labels.clone(),
                    events.clone(),
                    self.health.clone(),
                ));
            }
            let mode = self.config.mode;
            // Resolved at start, unless the start served from the journal.
            let known = self.nodes.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let resource = match known {
                Some(r) => r,
                None => {
                    let kind = CiliumKind::Node;
                    let report = |e: Option<&DiscoveryError>| {
                        self.health
                            .set_waiting(&kind.crd(), e.map(DiscoveryError::awaited))
                    };
                    let r = resolve_waiting(&client, kind, &report).await;
                    *self.nodes.lock().unwrap_or_else(|p| p.into_inner()) = Some(r.clone());
                    r
                }
            };
            let api: Api<DynamicObject> = Api::all_with(client, &resource);
            let selector = format!("metadata.name={}", self.config.node_name);
            let mut stream = watcher(api, watcher::Config::default().fields(&selector))
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(item) = stream.next().await {
                match item {
                    Ok(obj) => {
                        let decoded = to_node_resource(&obj);
                        see(&self.seen, decoded.as_ref().ok());
                        match decoded.and_then(|n| {
                            self.health.set("ciliumnode", true);
                            resolved(mode, n)
                        }) {
                            Ok(node) => {
                                if events.send(NodeEvent::Node(Box::new(node))).await.is_err() {
                                    return;
                                }
                            }
                            Err(e) => tracing::error!(error = %e, "CiliumNode not applied"),
                        }
                    }
                    Err(e) => {
                        self.health.set("ciliumnode", false);
                        tracing::warn!(error = %e, "CiliumNode watch interrupted; it resumes")
                    }
                }
            }
        })
    }
}

/// Writes the agent's fields of the CiliumNode.
pub struct KubernetesSink {
    config: KubernetesConfig,
    fields: Arc<Mutex<AgentFields>>,
    seen: SharedSeen,
    nodes: NodesResource,
    /// Connected on the first flush, then reused.
    client: Option<kube::Client>,
    /// An apply failed (the API server was down): send the fields again.
    pending: bool,
    /// External modes: used addresses not written yet.
    pending_used: Option<UsedAddresses>,
    /// The configuration check's verdict, not written yet.
    pending_fit: Option<ConfigFit>,
    /// Multi-pool: blocks given back, not removed from the CiliumNode yet.
    pending_released: BTreeSet<(String, IpNet)>,
    /// cluster-pool: the verdict on the node's CIDRs, not written yet.
    pending_pod_cidrs: Option<BTreeMap<String, PodCidrStatus>>,
}

impl KubernetesSink {
    /// The API client, connected on first use.
    async fn client(&mut self) -> Result<kube::Client, NodeError> {
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        let client = connect(self.config.kubeconfig.as_ref()).await?;
        self.client = Some(client.clone());
        Ok(client)
    }

    /// The CiliumNode resource the source resolved (or, when the start served
    /// from the journal, that this call resolves).
    async fn nodes_resource(&mut self) -> Result<ApiResource, NodeError> {
        let client = self.client().await?;
        let known = self.nodes.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let resource = match known {
            Some(r) => r,
            None => {
                let r = resolve(&client, CiliumKind::Node).await?;
                *self.nodes.lock().unwrap_or_else(|p| p.into_inner()) = Some(r.clone());
                r
            }
        };
        Ok(resource)
    }

    /// crd/eni: `status.ipam.used` and `ipv6-used`, through the status subresource.
    async fn apply_used(&mut self, used: &UsedAddresses) -> Result<(), NodeError> {
        let name = self.config.node_name.clone();
        let resource = self.nodes_resource().await?;
        let api: Api<DynamicObject> = Api::all_with(self.client().await?, &resource);
        let body = used_body(&resource.api_version, &name, used);
        api.patch_status(
            &name,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|source| NodeError::Api {
            op: format!("applying the status of CiliumNode {name:?}"),
            source,
        })?;
        Ok(())
    }
}

impl KubernetesSink {
    /// The configuration check's verdict as the [`FIT_CONDITION`] in
    /// `status.conditions`, through the status subresource under its own field
    /// manager; nothing when the CiliumNode already says it (a restarted agent with
    /// the same verdict writes nothing). The transition time stays while the
    /// status does.
    async fn apply_fit(&mut self, fit: &ConfigFit) -> Result<(), NodeError> {
        let old = self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .fit
            .clone();
        let Some(condition) = fit_condition(fit, old.as_ref()) else {
            return Ok(());
        };
        let name = self.config.node_name.clone();
        let resource = self.nodes_resource().await?;
        let api: Api<DynamicObject> = Api::all_with(self.client().await?, &resource);
        let body = fit_body(&resource.api_version, &name, condition);
        api.patch_status(
            &name,
            &PatchParams::apply(CHECK_FIELD_MANAGER),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|source| NodeError::Api {
            op: format!("applying the {FIT_CONDITION} condition of CiliumNode {name:?}"),
            source,
        })?;
        Ok(())
    }
}

/// The [`FIT_CONDITION`] saying `fit`, when the CiliumNode's (`old`) does not say
/// the same already (type, status, reason and message); its transition time is
/// `old`'s while the status stays.
fn fit_condition(fit: &ConfigFit, old: Option<&serde_json::Value>) -> Option<serde_json::Value> {
    let status = if fit.fits { "True" } else { "False" };
    let condition = condition_json(FIT_CONDITION, status, &fit.reason, &fit.message, old);
    let same = old.is_some_and(|o| {
        ["type", "status", "reason", "message"]
            .iter()
            .all(|k| o[k] == condition[k])
    });
    (!same).then_some(condition)
}

impl KubernetesSink {
    /// cluster-pool: `status.ipam.pod-cidrs` through the status subresource under
    /// [`POD_CIDRS_FIELD_MANAGER`] (the whole map: a CIDR left out is dropped),
    /// unless the CiliumNode already says it.
    async fn apply_pod_cidrs(
        &mut self,
        pod_cidrs: &BTreeMap<String, PodCidrStatus>,
    ) -> Result<(), NodeError> {
        let held = self
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pod_cidrs
            .as_ref()
            == Some(pod_cidrs);
        if held {
            return Ok(());
        }
        let name = self.config.node_name.clone();
        let resource = self.nodes_resource().await?;
        let api: Api<DynamicObject> = Api::all_with(self.client().await?, &resource);
        let body = pod_cidrs_body(&resource.api_version, &name, pod_cidrs);
        api.patch_status(
            &name,
            &PatchParams::apply(POD_CIDRS_FIELD_MANAGER),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|source| NodeError::Api {
            op: format!("applying status.ipam.pod-cidrs of CiliumNode {name:?}"),
            source,
        })?;
        Ok(())
    }
}

/// crd/eni: the status apply of `status.ipam.used` and `ipv6-used`.
fn used_body(api_version: &str, name: &str, used: &UsedAddresses) -> ApplyBody {
    ApplyBody::new(api_version, "CiliumNode", name).with(
        "status",
        json!({"ipam": {"used": used.ipv4, "ipv6-used": used.ipv6}}),
    )
}

/// The status apply of the [`FIT_CONDITION`].
fn fit_body(api_version: &str, name: &str, condition: serde_json::Value) -> ApplyBody {
    ApplyBody::new(api_version, "CiliumNode", name)
        .with("status", json!({"conditions": [condition]}))
}

/// cluster-pool: the status apply of `status.ipam.pod-cidrs`.
fn pod_cidrs_body(
    api_version: &str,
    name: &str,
    pod_cidrs: &BTreeMap<String, PodCidrStatus>,
) -> ApplyBody {
    ApplyBody::new(api_version, "CiliumNode", name)
        .with("status", json!({"ipam": {"pod-cidrs": pod_cidrs}}))
}

/// multi-pool: the merge patch giving blocks back (`allocated` without them),
/// only as of resourceVersion `rv`.
fn release_body(rv: Option<&str>, allocated: &[serde_json::Value]) -> serde_json::Value {
    json!({
        "metadata": {"resourceVersion": rv},
        "spec": {"ipam": {"pools": {"allocated": allocated}}},
    })
}

/// Attempts at removing given-back blocks before the next flush tries again.
const RELEASE_ATTEMPTS: usize = 5;

/// `spec.ipam.pools.allocated` of a CiliumNode object (raw JSON entries) without
/// the `released` blocks; None when it lists none of them.
fn allocated_without(
    obj: &DynamicObject,
    released: &BTreeSet<(String, IpNet)>,
) -> Option<Vec<serde_json::Value>> {
    let entries = obj.data["spec"]["ipam"]["pools"]["allocated"].as_array()?;
    let mut removed = false;
    let mut kept = Vec::with_capacity(entries.len());
    for entry in entries {
        let pool = entry["pool"].as_str().unwrap_or_default().to_string();
        let Some(cidrs) = entry["cidrs"].as_array() else {
            kept.push(entry.clone());
            continue;
        };
        let left: Vec<serde_json::Value> = cidrs
            .iter()
            .filter(|c| {
                let gone = c
                    .as_str()
                    .and_then(|c| c.parse::<IpNet>().ok())
                    .is_some_and(|c| released.contains(&(pool.clone(), c.trunc())));
                removed |= gone;
                !gone
            })
            .cloned()
            .collect();
        if left.len() == cidrs.len() {
            kept.push(entry.clone());
        } else if !left.is_empty() {
            let mut e = entry.clone();
            e["cidrs"] = serde_json::Value::Array(left);
            kept.push(e);
        }
    }
    removed.then_some(kept)
}

impl KubernetesSink {
    /// Removes the given-back blocks from `spec.ipam.pools.allocated`: reads the
    /// CiliumNode, then merge-patches the list without them, with the
    /// resourceVersion read as precondition; on 409 (the operator or anyone
    /// changed the node) reads it again.
    async fn remove_released(&mut self) -> Result<(), NodeError> {
        let name = self.config.node_name.clone();
        let released = self.pending_released.clone();
        let api: Api<DynamicObject> =
            Api::all_with(self.client().await?, &self.nodes_resource().await?);
        let op = || format!("giving blocks back in CiliumNode {name:?}");
        let api_error = |source| NodeError::Api { op: op(), source };
        let mut done = false;
        for _ in 0..RELEASE_ATTEMPTS {
            let Some(obj) = api.get_opt(&name).await.map_err(api_error)? else {
                done = true;
                break;
            };
            let Some(allocated) = allocated_without(&obj, &released) else {
                done = true;
                break;
            };
            let body = release_body(obj.metadata.resource_version.as_deref(), &allocated);
            let params = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            match api.patch(&name, &params, &Patch::Merge(&body)).await {
                Ok(_) => {
                    tracing::info!(blocks = ?released, "gave blocks back to the operator");
                    done = true;
                    break;
                }
                Err(kube::Error::Api(e)) if e.is_conflict() => continue,
                Err(e) => return Err(api_error(e)),
            }
        }
        if !done {
            return Err(NodeError::Changing {
                op: op(),
                attempts: RELEASE_ATTEMPTS,
            });
        }
        self.pending_released.clear();
        Ok(())
    }
}

impl KubernetesSink {
    /// Applies the agent's fields when one changed (or the last apply failed).
    async fn apply_fields(&mut self, outbox: &NodeOutbox) -> Result<(), NodeError> {
        {
            let mut f = self.fields.lock().unwrap_or_else(|p| p.into_inner());
            let mut changed = self.pending;
            if let Some(addresses) = &outbox.addresses {
                f.router_addresses = addresses.clone();
                changed = true;
            }
            if let Some(health) = &outbox.health {
                f.health = health.clone();
                changed = true;
            }
            if let Some(requested) = &outbox.requested_pools {
                f.requested = Some(requested.clone());
                changed = true;
            }
            if !changed {
                return Ok(());
            }
        }
        let name = self.config.node_name.clone();
        self.pending = true;
        let resource = self.nodes_resource().await?;
        let body = self
            .fields
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .apply_body(&name, &resource.api_version);
        let api: Api<DynamicObject> = Api::all_with(self.client().await?, &resource);
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|source| NodeError::Api {
            op: format!("applying CiliumNode {name:?}"),
            source,
        })?;
        self.pending = false;
        Ok(())
    }
}

impl NodeSink for KubernetesSink {
    fn flush<'a>(&'a mut self, outbox: &'a NodeOutbox) -> FlushFuture<'a> {
        Box::pin(self.flush_async(outbox))
    }
}

impl KubernetesSink {
    async fn flush_async(&mut self, outbox: &NodeOutbox) -> Result<(), NodeError> {
        self.pending_released
            .extend(outbox.released_blocks.iter().cloned());
        if let Some(fit) = outbox.config_fit.clone() {
            self.pending_fit = Some(fit);
        }
        if let (KubernetesMode::External { .. }, Some(used)) = (self.config.mode, &outbox.used) {
            self.pending_used = Some(used.clone());
        }
        if let Some(used) = self.pending_used.clone() {
            let held = self
                .seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .used
                .as_ref()
                == Some(&used);
            if !held {
                self.apply_used(&used).await?;
            }
            self.pending_used = None;
        }

        // The lower demand first, then the blocks it frees: the operator never
        // sees a block gone while the old demand still asks for it (it would
        // carve it right back).
        self.apply_fields(outbox).await?;
        if !self.pending_released.is_empty() {
            self.remove_released().await?;
        }
        if let Some(pod_cidrs) = outbox.pod_cidrs.clone() {
            self.pending_pod_cidrs = Some(pod_cidrs);
        }
        if let Some(pod_cidrs) = self.pending_pod_cidrs.clone() {
            self.apply_pod_cidrs(&pod_cidrs).await?;
            self.pending_pod_cidrs = None;
        }
        // Last: a condition that cannot be written (a CRD without the field is
        // no error: the API server prunes it) holds up none of the above.
        if let Some(fit) = self.pending_fit.clone() {
            self.apply_fit(&fit).await?;
            self.pending_fit = None;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire, pinned: each body the agent sends, whole.
    fn wire(body: &impl serde::Serialize) -> serde_json::Value {
        serde_json::to_value(body).unwrap()
    }

    fn requested(pool: &str, v4: u64) -> RequestedPool {
        RequestedPool {
            pool: pool.into(),
            needed: crate::resources::PoolDemand {
                ipv4_addrs: v4,
                ipv6_addrs: 0,
            },
        }
    }

    #[test]
    fn golden_the_agent_fields_apply_in_each_mode() {
        let full = AgentFields {
            node_uid: "u-1".into(),
            internal_ips: vec!["10.250.0.2".into(), "fd00::2".into()],
            router_addresses: vec![NodeAddress {
                kind: "CiliumInternalIP".into(),
                ip: "10.244.1.1".into(),
            }],
            health: HealthAddresses {
                ipv4: "10.244.1.2".into(),
                ipv6: "fd00:1::2".into(),
            },
            pod_cidrs: Some(vec!["10.244.1.0/24".parse().unwrap()]),
            requested: Some(vec![requested("default", 16)]),
        };
        assert_eq!(
            wire(&full.apply_body("n1", "cilium.io/v2")),
            json!({
                "apiVersion": "cilium.io/v2",
                "kind": "CiliumNode",
                "metadata": {
                    "name": "n1",
                    "ownerReferences": [
                        {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u-1"}
                    ],
                },
                "spec": {
                    "addresses": [
                        {"type": "InternalIP", "ip": "10.250.0.2"},
                        {"type": "InternalIP", "ip": "fd00::2"},
                        {"type": "CiliumInternalIP", "ip": "10.244.1.1"},
                    ],
                    "ipam": {
                        "podCIDRs": ["10.244.1.0/24"],
                        "pools": {"requested": [
                            {"pool": "default", "needed": {"ipv4-addrs": 16}}
                        ]},
                    },
                    "health": {"ipv4": "10.244.1.2", "ipv6": "fd00:1::2"},
                },
            })
        );
        // A first apply before the Node is read: no owner, no health, an
        // empty ipam (cluster-pool: the operator's podCIDRs are never sent).
        assert_eq!(
            wire(&AgentFields::default().apply_body("n2", "cilium.io/v2")),
            json!({
                "apiVersion": "cilium.io/v2",
                "kind": "CiliumNode",
                "metadata": {"name": "n2"},
                "spec": {"addresses": [], "ipam": {}},
            })
        );
    }

    #[test]
    fn golden_the_status_applies_and_the_release_patch() {
        let owned = crate::resources::AllocationIp {
            owner: "default/pod-a".into(),
            resource: String::new(),
        };
        let used = UsedAddresses {
            ipv4: BTreeMap::from([("10.1.0.5".to_string(), owned)]),
            ipv6: BTreeMap::new(),
        };
        assert_eq!(
            wire(&used_body("cilium.io/v2", "n1", &used)),
            json!({
                "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
                "metadata": {"name": "n1"},
                "status": {"ipam": {
                    "used": {"10.1.0.5": {"owner": "default/pod-a"}},
                    "ipv6-used": {},
                }},
            })
        );
        let condition = json!({"type": FIT_CONDITION, "status": "True", "reason": "Fits",
            "message": "m", "lastTransitionTime": "2025-01-01T00:00:00Z"});
        assert_eq!(
            wire(&fit_body("cilium.io/v2", "n1", condition.clone())),
            json!({
                "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
                "metadata": {"name": "n1"},
                "status": {"conditions": [condition]},
            })
        );
        let cidrs = BTreeMap::from([
            (
                "10.244.1.0/24".to_string(),
                PodCidrStatus {
                    status: crate::resources::PodCidrState::InUse,
                },
            ),
            (
                "10.244.9.0/24".to_string(),
                PodCidrStatus {
                    status: crate::resources::PodCidrState::Depleted,
                },
            ),
        ]);
        assert_eq!(
            wire(&pod_cidrs_body("cilium.io/v2", "n1", &cidrs)),
            json!({
                "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
                "metadata": {"name": "n1"},
                "status": {"ipam": {"pod-cidrs": {
                    "10.244.1.0/24": {"status": "in-use"},
                    "10.244.9.0/24": {"status": "depleted"},
                }}},
            })
        );
        let kept = vec![json!({"pool": "default", "cidrs": ["10.10.0.0/26"]})];
        assert_eq!(
            release_body(Some("7"), &kept),
            json!({
                "metadata": {"resourceVersion": "7"},
                "spec": {"ipam": {"pools": {"allocated": [
                    {"pool": "default", "cidrs": ["10.10.0.0/26"]}
                ]}}},
            })
        );
    }

    #[test]
    fn kubernetes_mode_needs_a_cidr_per_enabled_family() {
        let v4: IpNet = "10.1.2.0/24".parse().unwrap();
        let v6: IpNet = "fd00:1::/120".parse().unwrap();
        assert_eq!(
            kubernetes_cidrs(&[v4, v6], true, true).unwrap(),
            vec![v4, v6]
        );
        assert_eq!(kubernetes_cidrs(&[v6, v4], true, false).unwrap(), vec![v4]);
        assert_eq!(
            kubernetes_cidrs(&[v4], true, true).unwrap_err().to_string(),
            "Required IPv6 PodCIDR not available"
        );
    }

    #[test]
    fn the_condition_is_written_only_when_it_says_something_new() {
        let fit = |fits: bool, reason: &str| ConfigFit {
            fits,
            reason: reason.into(),
            message: "m".into(),
        };
        let mut node = NodeResource::new("n1");
        assert_eq!(fit_in(&node), None);
        let first = fit_condition(&fit(false, "NodeWithoutIPv6"), None).expect("a first condition");
        assert_eq!(first["type"], FIT_CONDITION);
        assert_eq!(first["status"], "False");
        node.status.extra.insert(
            "conditions".into(),
            json!([{"type": "other.io/X", "status": "True"}, first.clone()]),
        );
        let seen = fit_in(&node).expect("the node's condition");
        // A restarted agent with the same verdict writes nothing.
        assert_eq!(
            fit_condition(&fit(false, "NodeWithoutIPv6"), Some(&seen)),
            None
        );
        // Another reason, same status: written, the transition time kept.
        let next = fit_condition(&fit(false, "IPv6PodsOnIPv4Node"), Some(&seen)).unwrap();
        assert_eq!(next["lastTransitionTime"], seen["lastTransitionTime"]);
        assert!(fit_condition(&fit(true, "Fits"), Some(&seen)).is_some());
    }

    #[test]
    fn given_back_blocks_leave_the_allocated_list() {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
            "metadata": {"name": "n1", "resourceVersion": "7"},
            "spec": {"ipam": {"pools": {"allocated": [
                {"pool": "default", "cidrs": ["10.10.0.0/26", "10.10.0.64/26"], "allowFirstIP": true},
                {"pool": "mars", "cidrs": ["10.20.0.0/26"]},
            ]}}},
        }))
        .unwrap();
        let b = |p: &str, c: &str| (p.to_string(), c.parse::<IpNet>().unwrap());
        let left =
            allocated_without(&obj, &BTreeSet::from([b("default", "10.10.0.64/26")])).unwrap();
        assert_eq!(
            json!(left),
            json!([
                {"pool": "default", "cidrs": ["10.10.0.0/26"], "allowFirstIP": true},
                {"pool": "mars", "cidrs": ["10.20.0.0/26"]},
            ])
        );
        let left = allocated_without(&obj, &BTreeSet::from([b("mars", "10.20.0.0/26")])).unwrap();
        assert_eq!(left.len(), 1, "an emptied entry goes");
        // Not listed (or listed under another pool): nothing to write.
        assert_eq!(
            allocated_without(&obj, &BTreeSet::from([b("mars", "10.10.0.0/26")])),
            None
        );
    }

    #[test]
    fn an_apply_sends_every_field_the_agent_owns() {
        let f = AgentFields {
            node_uid: "u-1".into(),
            internal_ips: vec!["10.250.0.2".into()],
            router_addresses: vec![NodeAddress {
                kind: "CiliumInternalIP".into(),
                ip: "10.244.1.1".into(),
            }],
            health: HealthAddresses {
                ipv4: "10.244.1.2".into(),
                ipv6: String::new(),
            },
            pod_cidrs: None,
            requested: Some(Vec::new()),
        };
        let body = f.apply_body("n1", "cilium.io/v2");
        assert_eq!(body["spec"]["health"]["ipv4"], "10.244.1.2");
        assert!(body["spec"]["health"].get("ipv6").is_none());
        assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(body["metadata"]["ownerReferences"][0]["kind"], "Node");
        assert_eq!(body["spec"]["addresses"][0]["type"], "InternalIP");
        assert_eq!(body["spec"]["addresses"][1]["ip"], "10.244.1.1");
        // cluster-pool: the operator owns podCIDRs; the agent never sends them.
        assert!(body["spec"]["ipam"].get("podCIDRs").is_none());
        assert!(body["spec"]["ipam"]["pools"]["requested"].is_array());
    }

    #[test]
    fn a_restarted_agent_first_applies_the_addresses_the_journal_knows() {
        let mut journal = NodeResource::new("n1");
        journal.set_address("InternalIP", "10.250.0.2".parse().unwrap());
        journal.set_address("CiliumInternalIP", "10.244.1.1".parse().unwrap());
        journal.spec.health.ipv4 = "10.244.1.2".into();
        let f = AgentFields::from_journal(Some(&journal));
        let body = f.apply_body("n1", "cilium.io/v2");
        assert_eq!(
            body["spec"]["addresses"],
            json!([{"type": "CiliumInternalIP", "ip": "10.244.1.1"}]),
            "the InternalIP comes from the Node, not the journal"
        );
        assert_eq!(body["spec"]["health"]["ipv4"], "10.244.1.2");
        assert!(AgentFields::from_journal(None).router_addresses.is_empty());
    }
}
