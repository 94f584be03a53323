//! Every CiliumNode of the cluster (not only this node's), for the cross-node
//! datapath: a watch that keeps, per node, only what routing needs (`spec.addresses`
//! and `spec.ipam`'s CIDRs and allocated blocks) and publishes the whole list after
//! each change. A relist (after an API-server restart or an expired
//! resourceVersion) is published only once complete, so a half-read list never
//! looks like deleted nodes.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;

use super::kubernetes::{connect, to_node_resource};
use super::{BackendHealth, NodeResource};
use crate::k8s::discovery::{CiliumKind, DiscoveryError, resolve_waiting};
use crate::resources::{IpamPools, NodeIpamSpec, NodeSpec, ObjectMeta};

/// The watch's name in `podnet status`.
const WATCH: &str = "cluster-ciliumnodes";

/// The routing-relevant part of a CiliumNode (everything else is dropped).
fn routing_part(obj: &DynamicObject) -> Option<NodeResource> {
    match to_node_resource(obj) {
        Ok(n) => Some(NodeResource {
            api_version: n.api_version,
            kind: n.kind,
            metadata: ObjectMeta {
                name: n.metadata.name,
                ..Default::default()
            },
            spec: NodeSpec {
                addresses: n.spec.addresses,
                ipam: NodeIpamSpec {
                    pod_cidrs: n.spec.ipam.pod_cidrs,
                    pools: IpamPools {
                        requested: Vec::new(),
                        allocated: n.spec.ipam.pools.allocated,
                    },
                    ..Default::default()
                },
                ..Default::default()
            },
            ..Default::default()
        }),
        Err(e) => {
            tracing::warn!(error = %e, "a CiliumNode that cannot be read is left out of the routes");
            None
        }
    }
}

/// Watches every CiliumNode and publishes the list into `tx` (None until the
/// first complete list).
pub async fn watch_cluster_nodes(
    kubeconfig: Option<PathBuf>,
    health: Arc<BackendHealth>,
    tx: watch::Sender<Option<Vec<NodeResource>>>,
) {
    let client = loop {
        match connect(kubeconfig.as_ref()).await {
            Ok(c) => break c,
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch the cluster's CiliumNodes yet; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
    };
    health.set(WATCH, false);
    let mut nodes: BTreeMap<String, NodeResource> = BTreeMap::new();
    let mut relist: Option<BTreeMap<String, NodeResource>> = None;
    let kind = CiliumKind::Node;
    let report = |e: Option<&DiscoveryError>| {
        health.set_waiting(&kind.crd(), e.map(DiscoveryError::awaited))
    };
    let resource = resolve_waiting(&client, kind, &report).await;
    let api: Api<DynamicObject> = Api::all_with(client, &resource);
    let mut stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(event) = stream.next().await {
        let changed = match event {
            Ok(watcher::Event::Init) => {
                relist = Some(BTreeMap::new());
                false
            }
            Ok(watcher::Event::InitApply(obj)) => {
                if let (Some(buf), Some(n)) = (relist.as_mut(), routing_part(&obj)) {
                    buf.insert(n.metadata.name.clone(), n);
                }
                false
            }
            Ok(watcher::Event::InitDone) => {
                nodes = relist.take().unwrap_or_default();
                health.set(WATCH, true);
                true
            }
            Ok(watcher::Event::Apply(obj)) => match routing_part(&obj) {
                Some(n) if nodes.get(&n.metadata.name) != Some(&n) => {
                    nodes.insert(n.metadata.name.clone(), n);
                    true
                }
                _ => false,
            },
            Ok(watcher::Event::Delete(obj)) => nodes
                .remove(obj.metadata.name.as_deref().unwrap_or_default())
                .is_some(),
            Err(e) => {
                health.set(WATCH, false);
                tracing::warn!(error = %e, "cluster CiliumNode watch interrupted; it resumes");
                false
            }
        };
        if changed && tx.send(Some(nodes.values().cloned().collect())).is_err() {
            return;
        }
    }
}
