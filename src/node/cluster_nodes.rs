//! Every CiliumNode of the cluster (not only this node's), for the cross-node
//! datapath and the policy loop (one watch, its list shared): a watch that keeps, per node, only what routing and policy need (`spec.addresses`,
//! `spec.ipam`'s CIDRs and allocated blocks, the routing-mode annotation, and the
//! labels a ClusterNetworkPolicy's `nodes` peer selects by) in a [`Mirror`] and publishes the
//! whole list after each change: after each batch of the events that have already
//! arrived (up to [`EVENT_BATCH`]), so that a burst of node joins and deletions is
//! planned a few times, not once per event. The list holds shared nodes
//! ([`ClusterNodeList`]): a batch copies out only the nodes it changed. A relist (after an API-server restart or an
//! expired resourceVersion) is published only once complete, so a half-read list
//! never looks like deleted nodes.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use kube::api::{Api, DynamicObject};
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;

use super::{BackendHealth, NodeResource};
use crate::k8s::connect::connect;
use crate::k8s::discovery::{CiliumKind, DiscoveryError, resolve_waiting};
use crate::k8s::mirror::{Change, Keyed, Mirror};
use crate::k8s::objects::watch_nodes;
use crate::resources::{IpamPools, NodeIpamSpec, NodeSpec, ObjectMeta, ROUTING_MODE_ANNOTATION};

/// Every CiliumNode's routing part, as one shared list of shared nodes: a
/// batch copies out only the nodes it changed, and the reader takes the list
/// without a copy.
pub type ClusterNodeList = Arc<Vec<Arc<NodeResource>>>;

/// The watch's name in `podnet status`.
const WATCH: &str = "cluster-ciliumnodes";
/// At most this many events that have already arrived are applied before the
/// list is published.
const EVENT_BATCH: usize = 1024;

/// The routing- and policy-relevant part of a CiliumNode (everything else is
/// dropped, so the status writes and other annotations make no event).
fn routing_part(n: NodeResource) -> NodeResource {
    NodeResource {
        api_version: n.api_version,
        kind: n.kind,
        metadata: ObjectMeta {
            name: n.metadata.name,
            labels: n.metadata.labels,
            annotations: n
                .metadata
                .annotations
                .into_iter()
                .filter(|(k, _)| k == ROUTING_MODE_ANNOTATION)
                .collect(),
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
    // The published nodes, each shared until it changes.
    let mut shared: BTreeMap<String, Arc<NodeResource>> = BTreeMap::new();
    while let Some(first) = stream.next().await {
        let arrived =
            std::iter::from_fn(|| stream.next().now_or_never().flatten()).take(EVENT_BATCH);
        let mut matters = false;
        for item in std::iter::once(first).chain(arrived) {
            let change = take_event(item, &mut nodes, &health);
            matters |= change.matters();
            share(change, &nodes, &mut shared);
        }
        if matters
            && tx
                .send(Some(Arc::new(shared.values().cloned().collect())))
                .is_err()
        {
            return;
        }
    }
}

/// Brings the shared copies in line with `nodes` after `change`: only the
/// changed node is copied (all of them after a relist).
fn share(
    change: Change<NodeResource>,
    nodes: &Mirror<NodeResource>,
    shared: &mut BTreeMap<String, Arc<NodeResource>>,
) {
    match change {
        Change::Nothing => {}
        Change::Applied(key) => match nodes.get(&key) {
            Some(node) => {
                shared.insert(key, Arc::new(node.clone()));
            }
            None => {
                shared.remove(&key);
            }
        },
        Change::Deleted(node) => {
            shared.remove(&node.key());
        }
        Change::Relisted => {
            *shared = nodes
                .objects()
                .map(|n| (n.key(), Arc::new(n.clone())))
                .collect();
        }
    }
}

/// Applies one item of the watch to `nodes`; what it changed.
fn take_event(
    item: Result<Event<NodeResource>, watcher::Error>,
    nodes: &mut Mirror<NodeResource>,
    health: &BackendHealth,
) -> Change<NodeResource> {
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
    change
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, cidr: &str) -> NodeResource {
        let mut n = NodeResource::new(name);
        n.spec.ipam.pod_cidrs = vec![cidr.parse().unwrap()];
        n
    }

    #[test]
    fn a_batch_copies_only_the_nodes_it_changed() {
        let health = BackendHealth::new("kubernetes", String::new());
        let mut nodes = Mirror::<NodeResource>::default();
        let mut shared = BTreeMap::new();
        for event in [
            Event::Init,
            Event::InitApply(node("a", "10.0.1.0/24")),
            Event::InitApply(node("b", "10.0.2.0/24")),
            Event::InitDone,
        ] {
            let change = take_event(Ok(event), &mut nodes, &health);
            share(change, &nodes, &mut shared);
        }
        assert_eq!(shared.keys().collect::<Vec<_>>(), ["a", "b"]);
        let b_before = shared["b"].clone();
        // a changes, c joins, b stays the very same copy.
        for event in [
            Event::Apply(node("a", "10.0.9.0/24")),
            Event::Apply(node("c", "10.0.3.0/24")),
        ] {
            let change = take_event(Ok(event), &mut nodes, &health);
            assert!(change.matters());
            share(change, &nodes, &mut shared);
        }
        assert!(
            Arc::ptr_eq(&shared["b"], &b_before),
            "b was not copied again"
        );
        assert_eq!(
            shared["a"].spec.ipam.pod_cidrs[0].to_string(),
            "10.0.9.0/24"
        );
        // An update that changes nothing routing reads is no change.
        let same = take_event(
            Ok(Event::Apply(node("c", "10.0.3.0/24"))),
            &mut nodes,
            &health,
        );
        assert!(!same.matters());
        // Nor does another annotation; the routing mode's is one, and is kept.
        let mut noted = node("c", "10.0.3.0/24");
        noted
            .metadata
            .annotations
            .insert("other".into(), "x".into());
        assert!(!take_event(Ok(Event::Apply(noted.clone())), &mut nodes, &health).matters());
        noted
            .metadata
            .annotations
            .insert(ROUTING_MODE_ANNOTATION.into(), "tunnel".into());
        let said = take_event(Ok(Event::Apply(noted)), &mut nodes, &health);
        assert!(said.matters());
        share(said, &nodes, &mut shared);
        assert_eq!(
            shared["c"].metadata.annotations,
            BTreeMap::from([(ROUTING_MODE_ANNOTATION.to_string(), "tunnel".to_string())])
        );
        // A label change is one (a ClusterNetworkPolicy's `nodes` peer), and is kept.
        let mut labelled = node("c", "10.0.3.0/24");
        labelled.metadata.annotations =
            BTreeMap::from([(ROUTING_MODE_ANNOTATION.to_string(), "tunnel".to_string())]);
        labelled
            .metadata
            .labels
            .insert("kubernetes.io/os".into(), "linux".into());
        let relabelled = take_event(Ok(Event::Apply(labelled)), &mut nodes, &health);
        assert!(relabelled.matters());
        share(relabelled, &nodes, &mut shared);
        assert_eq!(shared["c"].metadata.labels["kubernetes.io/os"], "linux");
        let gone = take_event(
            Ok(Event::Delete(node("a", "10.0.9.0/24"))),
            &mut nodes,
            &health,
        );
        share(gone, &nodes, &mut shared);
        assert_eq!(shared.keys().collect::<Vec<_>>(), ["b", "c"]);
    }
}
