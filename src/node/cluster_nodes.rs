//! Every CiliumNode of the cluster (not only this node's), for the cross-node
//! datapath: a watch that keeps, per node, only what routing needs (`spec.addresses`
//! and `spec.ipam`'s CIDRs and allocated blocks) in a [`Mirror`] and publishes the
//! whole list after each change: after each batch of the events that have already
//! arrived (up to [`EVENT_BATCH`]), so that a burst of node joins and deletions is
//! copied out and planned a few times, not once per event. A relist (after an API-server restart or an
//! expired resourceVersion) is published only once complete, so a half-read list
//! never looks like deleted nodes.

use std::path::PathBuf;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use kube::api::{Api, DynamicObject};
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;

use super::{BackendHealth, NodeResource};
use crate::k8s::connect::connect;
use crate::k8s::discovery::{CiliumKind, DiscoveryError, resolve_waiting};
use crate::k8s::mirror::{Change, Mirror};
use crate::k8s::objects::watch_nodes;
use crate::resources::{IpamPools, NodeIpamSpec, NodeSpec, ObjectMeta};

/// Every CiliumNode's routing part, as one shared list: the watch copies the
/// nodes out once per batch, and its reader takes the list without a copy.
pub type ClusterNodeList = Arc<Vec<NodeResource>>;

/// The watch's name in `podnet status`.
const WATCH: &str = "cluster-ciliumnodes";
/// At most this many events that have already arrived are applied before the
/// list is published.
const EVENT_BATCH: usize = 1024;

/// The routing-relevant part of a CiliumNode (everything else is dropped).
fn routing_part(n: NodeResource) -> NodeResource {
    NodeResource {
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
    }
}

/// A watch event with the routing part of its node; None when it changes
/// nothing in `nodes` (an unchanged routing part, a node not known deleted).
fn routing_event(
    event: Event<NodeResource>,
    nodes: &Mirror<NodeResource>,
) -> Option<Event<NodeResource>> {
    match event {
        Event::InitApply(n) => Some(Event::InitApply(routing_part(n))),
        Event::Apply(n) => {
            let n = routing_part(n);
            (nodes.get(&n.metadata.name) != Some(&n)).then_some(Event::Apply(n))
        }
        Event::Delete(n) => nodes
            .get(&n.metadata.name)
            .is_some()
            .then_some(Event::Delete(n)),
        other => Some(other),
    }
}

/// Watches every CiliumNode and publishes the list into `tx` (None until the
/// first complete list).
pub async fn watch_cluster_nodes(
    kubeconfig: Option<PathBuf>,
    health: Arc<BackendHealth>,
    tx: watch::Sender<Option<ClusterNodeList>>,
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
    let mut nodes = Mirror::<NodeResource>::default();
    let kind = CiliumKind::Node;
    let report = |e: Option<&DiscoveryError>| {
        health.set_waiting(&kind.crd(), e.map(DiscoveryError::awaited))
    };
    let resource = resolve_waiting(&client, kind, &report).await;
    let api: Api<DynamicObject> = Api::all_with(client, &resource);
    let mut stream = watch_nodes(api, watcher::Config::default());
    while let Some(first) = stream.next().await {
        let arrived =
            std::iter::from_fn(|| stream.next().now_or_never().flatten()).take(EVENT_BATCH);
        let mut matters = false;
        for item in std::iter::once(first).chain(arrived) {
            matters |= take_event(item, &mut nodes, &health);
        }
        if matters
            && tx
                .send(Some(Arc::new(nodes.objects().cloned().collect())))
                .is_err()
        {
            return;
        }
    }
}

/// Applies one item of the watch to `nodes`; whether planning must see the change.
fn take_event(
    item: Result<Event<NodeResource>, watcher::Error>,
    nodes: &mut Mirror<NodeResource>,
    health: &BackendHealth,
) -> bool {
    let change = match item {
        Ok(event) => match routing_event(event, nodes) {
            Some(event) => nodes.apply(event),
            None => Change::Nothing,
        },
        Err(e) => {
            health.set(WATCH, false);
            tracing::warn!(error = %e, "cluster CiliumNode watch interrupted; it resumes");
            Change::Nothing
        }
    };
    if change == Change::Relisted {
        health.set(WATCH, true);
    }
    change.matters()
}
