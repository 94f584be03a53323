//! The source: this node's CiliumNode (and Node) from the API server. Its start
//! is in `start`; here, the watch that follows the CiliumNode afterwards, and
//! the watches of the Node's facts and (multi-pool) of the pools beside it.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::runtime::Handle;
use tokio::sync::mpsc::Sender;

use super::bodies::AgentFields;
use super::node_facts::watch_node_facts;
use super::resource::NodesResource;
use super::seen::{SharedSeen, see};
use super::{KubernetesConfig, KubernetesMode, resolved, to_node_resource};
use crate::k8s::connect::connect;
use crate::k8s::discovery::{CiliumKind, DiscoveryError, resolve_waiting};
use crate::node::kube_pools::{self, PoolResources};
use crate::node::{
    BackendHealth, NodeError, NodeEvent, NodeFacts, NodeResource, NodeSource, NodeView, WatchFuture,
};

/// This node's CiliumNode (and Node) from the API server.
pub struct KubernetesSource {
    pub(super) config: KubernetesConfig,
    pub(super) runtime: Handle,
    /// What the journal says the node owned (served from if the API server is down).
    pub(super) journal_node: Option<NodeResource>,
    pub(super) fields: Arc<Mutex<AgentFields>>,
    pub(super) seen: SharedSeen,
    pub(super) nodes: NodesResource,
    /// multi-pool: the pools' resources, once the start resolved them.
    pub(super) pools: Option<PoolResources>,
    pub(super) client: Option<kube::Client>,
    /// The Node's labels (CiliumNodeConfig node selectors).
    pub(super) node_labels: BTreeMap<String, String>,
    /// What the node is, as the start read it (None: the start served from the
    /// journal); the watch follows its Node's InternalIPs from there.
    pub(super) facts: Option<NodeFacts>,
    pub(super) health: Arc<BackendHealth>,
}

impl NodeSource for KubernetesSource {
    fn initial(&mut self) -> Result<NodeView, NodeError> {
        let runtime = self.runtime.clone();
        runtime.block_on(self.initial_async())
    }

    fn watch(self: Box<Self>, events: Sender<NodeEvent>) -> WatchFuture {
        Box::pin(self.watch_async(events))
    }
}

impl KubernetesSource {
    /// Follows the CiliumNode (and the Node, and the pools) until the daemon
    /// stops listening.
    async fn watch_async(self: Box<Self>, events: Sender<NodeEvent>) {
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
            self.fields.clone(),
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
        let resource = self.nodes_resource(&client).await;
        let api: Api<DynamicObject> = Api::all_with(client, &resource);
        let selector = format!("metadata.name={}", self.config.node_name);
        let mut stream = watcher(api, watcher::Config::default().fields(&selector))
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(item) = stream.next().await {
            match item {
                Ok(obj) => {
                    let Some(node) = self.applied(&obj) else {
                        continue;
                    };
                    self.note_lost(&node);
                    if events.send(NodeEvent::Node(Box::new(node))).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    self.health.set("ciliumnode", false);
                    tracing::warn!(error = %e, "CiliumNode watch interrupted; it resumes")
                }
            }
        }
    }

    /// The CiliumNode resource the start resolved or, when it served from the
    /// journal, the one discovery finds (waited for, and shown in status).
    async fn nodes_resource(&self, client: &kube::Client) -> ApiResource {
        let kind = CiliumKind::Node;
        let report = |e: Option<&DiscoveryError>| {
            self.health
                .set_waiting(&kind.crd(), e.map(DiscoveryError::awaited))
        };
        let waited = || async { Ok::<_, Infallible>(resolve_waiting(client, kind, &report).await) };
        let Ok(resource) = self.nodes.or_resolve(waited).await;
        resource
    }

    /// Marks the agent's fields for the sink's next apply when `node` lost what
    /// they write (a label or the routing-mode annotation edited by hand).
    fn note_lost(&self, node: &NodeResource) {
        let mut f = self.fields.lock().unwrap_or_else(|p| p.into_inner());
        if !f.reapply && f.lost_from(node) {
            tracing::warn!(
                "the CiliumNode lost a label or annotation this agent writes; applying them again"
            );
            f.reapply = true;
        }
    }

    /// The node resource of a version of the CiliumNode the watch saw, noted as
    /// seen; None (logged) when it cannot be applied.
    fn applied(&self, obj: &DynamicObject) -> Option<NodeResource> {
        let decoded = to_node_resource(obj);
        see(&self.seen, decoded.as_ref().ok());
        decoded
            .and_then(|n| {
                self.health.set("ciliumnode", true);
                resolved(self.config.mode, n)
            })
            .inspect_err(|e| tracing::error!(error = %e, "CiliumNode not applied"))
            .ok()
    }
}
