//! The source's start: connect, resolve the resources the mode needs, read the
//! Node, apply the agent's fields, then wait (following the CiliumNode) for what
//! the mode needs; or serve from the journal when the API server cannot be
//! reached and the journal knows the node's CIDRs.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, WatchEvent, WatchParams};

use super::node_facts::{internal_ips, service_range};
use super::seen::see;
use super::source::KubernetesSource;
use super::{FIELD_MANAGER, KubernetesConfig, KubernetesMode, resolved, to_node_resource};
use crate::ipam::Family;
use crate::k8s::connect::{api_server_url, connect};
use crate::k8s::discovery::{CiliumKind, DiscoveryError, resolve};
use crate::k8s::objects::typed;
use crate::node::external::offered;
use crate::node::kube_pools::{self, KubeMetadata, PoolResources};
use crate::node::{NodeError, NodeFacts, NodeResource, NodeView, RequestedPool};
use crate::resources::Node;

/// How often a start that waits (for the API server, the Node, the CIDRs) retries.
const RETRY: Duration = Duration::from_secs(1);
/// The subject of what the start waits for in `podnet status`.
const START: &str = "start";
/// How long a start follows its CiliumNode for the operator's write before it
/// re-reads the Node and applies again.
const START_WATCH: Duration = Duration::from_secs(10);

/// What one attempt at the start came to.
enum Attempt {
    /// The view, and the Node's labels (CiliumNodeConfig node selectors).
    Ready(Box<NodeView>, BTreeMap<String, String>),
    /// Still waiting for this (logged once, and shown in `podnet status`).
    Waiting(String),
}

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

    pub(super) async fn initial_async(&mut self) -> Result<NodeView, NodeError> {
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
                    self.nodes.keep(found.nodes.clone());
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
            f.labels = node.metadata.labels.clone();
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
