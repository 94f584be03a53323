//! Multi-pool on the Kubernetes backend: the pool definitions (`CiliumPodIPPool`),
//! this node's default pool (`CiliumNodeConfig` against the Node's labels) and the
//! Pod and Namespace metadata pool selection reads, from the API server (the Pods'
//! annotations also carry the addresses a pod asks for, in every mode).
//!
//! Pools and node configs are few: on any change of either the source lists both
//! again and sends the whole set (an invalid object is logged and left out, the
//! others apply). Pods (only this node's, by `spec.nodeName`) and Namespaces live in
//! reflector stores that pool selection reads directly; until both have listed,
//! selection answers "not synced yet" (retryable) instead of "not found".
//!
//! Pools and node configs are read at the newest version their CRD serves that
//! podnet understands (API discovery, `k8s::discovery`): Cilium 1.20.2's pool CRD
//! serves v2alpha1 only, podnet's v2 and v2alpha1. A CRD that goes away while the
//! daemon runs is waited for again; the pools in force stay meanwhile (the watch:
//! `k8s::pool_watch`, which the operator's multi-pool allocator uses too).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Namespace as KubeNamespace, Pod as KubePod};
use kube::api::{Api, ApiResource};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::runtime::Handle;

use super::{BackendHealth, NodeError, NodeEvent, send_pools};
use crate::ipam::node_config::{NodeConfigDef, node_default_pool};
use crate::ipam::pooldef::PoolDef;
use crate::ipam::selection::{
    LABEL_NAMESPACE_NAME, MetadataSource, NamespaceMeta, PodController, PodMeta,
};
use crate::k8s::discovery::{CiliumKind, DiscoveryError, resolve, resolve_waiting};
use crate::k8s::objects::list_valid;
use crate::k8s::pool_watch::{PoolWatch, Resolver, Watched, list_pools};
use crate::resources::{CiliumNodeConfig, NODE_CONFIG_KIND};

/// The resources multi-pool reads, at the versions the API server serves.
#[derive(Debug, Clone)]
pub(super) struct PoolResources {
    pools: ApiResource,
    node_configs: ApiResource,
}

impl PoolResources {
    /// Both kinds by API discovery (an error that `is_missing_crd` is one the
    /// start waits out).
    pub(super) async fn resolve(client: &kube::Client) -> Result<PoolResources, DiscoveryError> {
        Ok(PoolResources {
            pools: resolve(client, CiliumKind::PodIpPool).await?,
            node_configs: resolve(client, CiliumKind::NodeConfig).await?,
        })
    }

    /// Both kinds, waiting (and saying so in `health`) until their CRDs serve a
    /// version podnet understands.
    async fn resolve_waiting(client: &kube::Client, health: &BackendHealth) -> PoolResources {
        let waiting = |kind: CiliumKind| {
            move |e: Option<&DiscoveryError>| {
                health.set_waiting(&kind.crd(), e.map(DiscoveryError::awaited))
            }
        };
        let pools = CiliumKind::PodIpPool;
        let configs = CiliumKind::NodeConfig;
        PoolResources {
            pools: resolve_waiting(client, pools, &waiting(pools)).await,
            node_configs: resolve_waiting(client, configs, &waiting(configs)).await,
        }
    }
}

impl Watched for PoolResources {
    fn resources(&self) -> Vec<&ApiResource> {
        vec![&self.pools, &self.node_configs]
    }
}

/// This node's default pool from the CiliumNodeConfigs that select it.
async fn default_pool(
    client: &kube::Client,
    resource: &ApiResource,
    node_labels: &BTreeMap<String, String>,
) -> Result<Option<String>, NodeError> {
    let configs: Vec<NodeConfigDef> =
        list_valid::<CiliumNodeConfig, _, _>(client, resource, NODE_CONFIG_KIND, |c| {
            NodeConfigDef::try_from(c)
        })
        .await?;
    Ok(node_default_pool(&configs, node_labels))
}

/// The pools and this node's default pool, as they are now.
pub(super) async fn pools_now(
    client: &kube::Client,
    resources: &PoolResources,
    node_labels: &BTreeMap<String, String>,
) -> Result<(Vec<PoolDef>, Option<String>), NodeError> {
    Ok((
        list_pools(client, &resources.pools).await?,
        default_pool(client, &resources.node_configs, node_labels).await?,
    ))
}

/// Watches pools and node configs and sends the whole set after every change;
/// when their CRD goes (or stops serving the version in use), waits until one
/// is served again and goes on with it. `resources`: what the start resolved
/// (None when it served from the journal: resolved here).
pub(super) async fn watch_pools(
    client: kube::Client,
    resources: Option<PoolResources>,
    node_labels: BTreeMap<String, String>,
    events: tokio::sync::mpsc::Sender<NodeEvent>,
    health: Arc<BackendHealth>,
) {
    let resources = match resources {
        Some(r) => r,
        None => PoolResources::resolve_waiting(&client, &health).await,
    };
    let resolving = health.clone();
    let resolve: Resolver<PoolResources> = Box::new(move |client| {
        let health = resolving.clone();
        async move { PoolResources::resolve_waiting(&client, &health).await }.boxed()
    });
    let lost = health.clone();
    let mut watch = PoolWatch::new(client, resources, "pool", resolve)
        .on_lost(move || lost.set("pools", false));
    while watch.changed().await.is_ok() {
        match pools_now(watch.client(), watch.watched(), &node_labels).await {
            Ok((pools, default_pool)) => {
                health.set("pools", true);
                if !send_pools(&events, pools, default_pool).await {
                    return;
                }
            }
            Err(e) => tracing::warn!(error = %e, "pools not reloaded"),
        }
    }
}

/// Pod (this node's) and Namespace metadata from reflector stores.
pub struct KubeMetadata {
    pods: Store<KubePod>,
    namespaces: Store<KubeNamespace>,
    synced: Arc<AtomicBool>,
}

impl KubeMetadata {
    /// Starts the reflectors on `runtime`; the stores fill in the background.
    pub(super) fn start(
        client: &kube::Client,
        node_name: &str,
        runtime: &Handle,
        health: Arc<BackendHealth>,
    ) -> KubeMetadata {
        let (pods, pod_writer) = reflector::store::<KubePod>();
        let (namespaces, ns_writer) = reflector::store::<KubeNamespace>();
        let pod_stream = reflector::reflector(
            pod_writer,
            watcher(
                Api::<KubePod>::all(client.clone()),
                watcher::Config::default().fields(&format!("spec.nodeName={node_name}")),
            ),
        )
        .default_backoff();
        let ns_stream = reflector::reflector(
            ns_writer,
            watcher(
                Api::<KubeNamespace>::all(client.clone()),
                watcher::Config::default(),
            ),
        )
        .default_backoff();
        runtime.spawn(pod_stream.for_each(|r| async move {
            if let Err(e) = r {
                tracing::warn!(error = %e, "pod watch interrupted; it resumes");
            }
        }));
        runtime.spawn(ns_stream.for_each(|r| async move {
            if let Err(e) = r {
                tracing::warn!(error = %e, "namespace watch interrupted; it resumes");
            }
        }));
        let synced = Arc::new(AtomicBool::new(false));
        let (p, n, s) = (pods.clone(), namespaces.clone(), synced.clone());
        runtime.spawn(async move {
            if p.wait_until_ready().await.is_ok() && n.wait_until_ready().await.is_ok() {
                s.store(true, Ordering::SeqCst);
                health.set("pods", true);
                health.set("namespaces", true);
                tracing::info!("pod and namespace metadata synced");
            }
        });
        KubeMetadata {
            pods,
            namespaces,
            synced,
        }
    }
}

impl MetadataSource for KubeMetadata {
    fn pod(&self, namespace: &str, name: &str) -> Option<PodMeta> {
        let pod = self.pods.get(&ObjectRef::new(name).within(namespace))?;
        Some(PodMeta {
            namespace: namespace.to_string(),
            name: name.to_string(),
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            annotations: pod.metadata.annotations.clone().unwrap_or_default(),
            controller: PodController::of(pod.metadata.owner_references.iter().flatten().map(
                |r| {
                    (
                        r.api_version.as_str(),
                        r.kind.as_str(),
                        r.name.as_str(),
                        r.controller,
                    )
                },
            )),
        })
    }

    fn namespace(&self, name: &str) -> Option<NamespaceMeta> {
        let ns = self.namespaces.get(&ObjectRef::new(name))?;
        let mut labels = ns.metadata.labels.clone().unwrap_or_default();
        labels
            .entry(LABEL_NAMESPACE_NAME.to_string())
            .or_insert_with(|| name.to_string());
        Some(NamespaceMeta {
            name: name.to_string(),
            labels,
            annotations: ns.metadata.annotations.clone().unwrap_or_default(),
        })
    }

    fn synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }
}
