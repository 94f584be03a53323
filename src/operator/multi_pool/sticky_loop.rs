//! The leader's sticky-address loop (I/O around the rules of [`sticky`](super::sticky)),
//! run next to the multi-pool node loop. After a change that may matter (a
//! CiliumPodIPPool changed; a CiliumNode that asks or is answered changed; any
//! CiliumNode changed or went away while an address is moving), it lists every
//! CiliumPodIPPool and CiliumNode afresh (a consistent read, never a cache that
//! may lag behind its own writes), decides, and writes in this order:
//!
//! 1. each pool's new `ipam.podnet.io/sticky-owners` record, as a merge patch
//!    carrying the pool's resourceVersion (409: everything is read again at
//!    once, up to [`CONFLICTS_IN_A_ROW`] times, then after the backoff);
//! 2. each node's `spec.ipam.pools.allocated` with the new /32 (/128) block, as
//!    the multi-pool operator writes it: a forced server-side apply under the
//!    operator's field manager with the node's UID and the resourceVersion it
//!    was read at (409: everything is read again);
//! 3. each node's `ipam.podnet.io/sticky-status` whose answer changed.
//!
//! A block is added to a node only when the list just read shows no node
//! listing it: as the operator is the only one that adds blocks, and it writes
//! one decision at a time, a block is never on two nodes.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use tokio::time::Instant;

use super::sticky::{NodeView, PoolView, STICKY_OWNERS, STICKY_REQUESTS, STICKY_STATUS, decide};
use crate::ipam::pooldef::PoolDef;
use crate::k8s::mirror::WatchEnded;
use crate::k8s::objects::{ListError, list_pages, list_valid, node_resource, watch_nodes};
use crate::operator::FIELD_MANAGER;
use crate::operator::node_api::{ApiNodes, NodeApply};
use crate::operator::node_loop::{CONFLICTS_IN_A_ROW, Refusal, WriteError, ignored};
use crate::operator::retry::next_backoff;
use crate::resources::{CiliumPodIPPool, NodeResource, POD_IP_POOL_KIND};

/// How one pass did not go through (it is tried again after a backoff).
#[derive(Debug, thiserror::Error)]
enum PassError {
    #[error(transparent)]
    List(#[from] ListError),
    #[error("writing annotation {STICKY_OWNERS} of CiliumPodIPPool {pool:?}: {source}")]
    Record {
        pool: String,
        #[source]
        source: kube::Error,
    },
    #[error("adding sticky blocks to CiliumNode {node:?}: {source}")]
    Blocks {
        node: String,
        #[source]
        source: WriteError,
    },
    #[error("writing annotation {STICKY_STATUS} of CiliumNode {node:?}: {source}")]
    Status {
        node: String,
        #[source]
        source: kube::Error,
    },
}

impl PassError {
    /// Whether an object changed since it was read (409): read again at once.
    fn conflict(&self) -> bool {
        let is_409 = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.is_conflict());
        match self {
            PassError::Record { source, .. } => is_409(source),
            PassError::Blocks { source, .. } => {
                matches!(source, WriteError::Refused(Refusal::Conflict))
            }
            PassError::List(_) | PassError::Status { .. } => false,
        }
    }
}

/// A pool as read: its view and the resourceVersion its record is written at.
struct ReadPool {
    view: PoolView,
    resource_version: String,
}

/// A node as read.
struct ReadNode {
    /// Annotated `ipam.cilium.io/ignore: "true"`.
    ignored: bool,
    view: NodeView,
    uid: String,
    resource_version: String,
    /// Its `ipam.podnet.io/sticky-status` as the API server has it.
    status: Option<String>,
}

fn read_pool(pool: &CiliumPodIPPool) -> Result<ReadPool, String> {
    let def = PoolDef::try_from(pool).map_err(|e| e.to_string());
    Ok(ReadPool {
        view: PoolView::new(&pool.metadata.name, def, &pool.metadata.annotations),
        resource_version: pool.metadata.resource_version.clone().unwrap_or_default(),
    })
}

/// A node annotated `ipam.cilium.io/ignore: "true"` is left alone: its blocks
/// still count as held, its requests are not read and its status not written.
fn read_node(node: &NodeResource) -> ReadNode {
    let annotations = &node.metadata.annotations;
    let ignored = ignored(annotations);
    ReadNode {
        ignored,
        view: NodeView {
            name: node.metadata.name.clone(),
            requests: annotations
                .get(STICKY_REQUESTS)
                .filter(|_| !ignored)
                .cloned(),
            allocated: node.spec.ipam.pools.allocated.clone(),
        },
        uid: node.metadata.uid().to_string(),
        resource_version: node.metadata.resource_version.clone().unwrap_or_default(),
        status: annotations.get(STICKY_STATUS).cloned(),
    }
}

/// Whether a CiliumNode event may change a sticky answer.
fn concerns_sticky(event: &Event<NodeResource>, moving: bool) -> bool {
    let asks = |n: &NodeResource| {
        let a = &n.metadata.annotations;
        a.contains_key(STICKY_REQUESTS) || a.contains_key(STICKY_STATUS)
    };
    match event {
        Event::Init | Event::InitApply(_) => false,
        Event::InitDone | Event::Delete(_) => true,
        Event::Apply(n) => moving || asks(n),
    }
}

/// One pass: reads everything, decides, writes. Returns whether an address
/// is moving (then every node change is looked at).
async fn pass(
    client: &kube::Client,
    pool_resource: &ApiResource,
    nodes: &ApiNodes<'_>,
) -> Result<bool, PassError> {
    let pools = list_valid(client, pool_resource, POD_IP_POOL_KIND, read_pool).await?;
    let read = list_pages(
        &nodes.api(),
        ListParams::default(),
        "CiliumNode",
        nodes.api_version(),
        |obj| node_resource(obj).ok().map(|n| read_node(&n)),
    )
    .await?;
    let views: Vec<PoolView> = pools.iter().map(|p| p.view.clone()).collect();
    let node_views: Vec<NodeView> = read.iter().map(|n| n.view.clone()).collect();
    let plan = decide(&views, &node_views);

    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..Default::default()
    };
    let pool_api: Api<DynamicObject> = Api::all_with(client.clone(), pool_resource);
    for (name, record) in &plan.records {
        let Some(pool) = pools.iter().find(|p| p.view.name == *name) else {
            continue;
        };
        let body = json!({"metadata": {
            "resourceVersion": pool.resource_version,
            "annotations": {STICKY_OWNERS: serde_json::to_string(record).unwrap_or_default()},
        }});
        pool_api
            .patch(name, &params, &Patch::Merge(&body))
            .await
            .map_err(|source| PassError::Record {
                pool: name.clone(),
                source,
            })?;
        tracing::info!(pool = %name, owners = record.len(), "sticky-address record written");
    }
    let by_name: BTreeMap<&str, &ReadNode> =
        read.iter().map(|n| (n.view.name.as_str(), n)).collect();
    for (name, allocated) in &plan.assign {
        let Some(node) = by_name.get(name.as_str()) else {
            continue;
        };
        let fields = json!({"ipam": {"pools": {"allocated": allocated}}});
        let apply = NodeApply::spec(fields, "sticky-allocated").checked_at(&node.resource_version);
        let written = nodes.apply_all(name, &node.uid, vec![apply]).await;
        written.outcome.map_err(|source| PassError::Blocks {
            node: name.clone(),
            source,
        })?;
        tracing::info!(node = %name, "sticky blocks added to the node's allocated list");
    }
    for (name, answers) in &plan.status {
        let Some(node) = by_name.get(name.as_str()).filter(|n| !n.ignored) else {
            continue;
        };
        let new = (!answers.is_empty()).then(|| serde_json::to_string(answers).unwrap_or_default());
        if new == node.status {
            continue;
        }
        let body = json!({"metadata": {"annotations": {STICKY_STATUS: new}}});
        nodes
            .api()
            .patch(name, &params, &Patch::Merge(&body))
            .await
            .map_err(|source| PassError::Status {
                node: name.clone(),
                source,
            })?;
    }
    Ok(plan.moving)
}

/// Runs until a watch ends (they do not while the API server can be retried).
pub async fn run(
    client: kube::Client,
    pool_resource: ApiResource,
    nodes: &ApiNodes<'_>,
) -> WatchEnded {
    // Fused: a watch that ended says so again instead of being polled after its end.
    let mut node_events = watch_nodes(nodes.api(), watcher::Config::default()).fuse();
    let pool_api: Api<DynamicObject> = Api::all_with(client.clone(), &pool_resource);
    let mut pool_events = watcher::watcher(pool_api, watcher::Config::default())
        .default_backoff()
        .boxed()
        .fuse();
    let mut moving = false;
    // A failed pass is tried again at this time.
    let mut retry_at: Option<Instant> = None;
    let mut backoff: Option<Duration> = None;
    let mut conflicts = 0;
    loop {
        let retry = async {
            match retry_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let mut wanted = tokio::select! {
            event = node_events.next() => match event {
                None => return WatchEnded { kind: "CiliumNode".into() },
                Some(Ok(e)) => concerns_sticky(&e, moving),
                Some(Err(_)) => false,
            },
            event = pool_events.next() => match event {
                None => return WatchEnded { kind: POD_IP_POOL_KIND.into() },
                Some(Ok(Event::Init | Event::InitApply(_))) | Some(Err(_)) => false,
                Some(Ok(_)) => true,
            },
            _ = retry => true,
        };
        // The events that have already arrived are taken together.
        while let Some(Some(event)) = node_events.next().now_or_never() {
            wanted |= matches!(event, Ok(e) if concerns_sticky(&e, moving));
        }
        while let Some(Some(event)) = pool_events.next().now_or_never() {
            wanted |= matches!(
                event,
                Ok(Event::Apply(_) | Event::Delete(_) | Event::InitDone)
            );
        }
        if !wanted {
            continue;
        }
        match pass(&client, &pool_resource, nodes).await {
            Ok(m) => {
                moving = m;
                conflicts = 0;
                retry_at = None;
                backoff = None;
            }
            Err(e) if e.conflict() && conflicts + 1 < CONFLICTS_IN_A_ROW => {
                tracing::debug!(error = %e, "sticky addresses: changed meanwhile; reading again");
                conflicts += 1;
                retry_at = Some(Instant::now());
            }
            Err(e) => {
                conflicts = 0;
                let wait = next_backoff(backoff);
                tracing::warn!(error = %e, retry_in = ?wait, "sticky addresses: pass not done");
                backoff = Some(wait);
                retry_at = Some(Instant::now() + wait);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(annotations: &[(&str, &str)]) -> NodeResource {
        let mut n = NodeResource::new("n1");
        for (k, v) in annotations {
            n.metadata.annotations.insert(k.to_string(), v.to_string());
        }
        n
    }

    #[test]
    fn only_node_changes_that_may_change_an_answer_start_a_pass() {
        let plain = || Event::Apply(node(&[]));
        let asks = || Event::Apply(node(&[(STICKY_REQUESTS, "{}")]));
        let answered = || Event::Apply(node(&[(STICKY_STATUS, "{}")]));
        assert!(!concerns_sticky(&plain(), false));
        assert!(
            concerns_sticky(&plain(), true),
            "a block may have been given back"
        );
        assert!(concerns_sticky(&asks(), false));
        assert!(concerns_sticky(&answered(), false));
        assert!(concerns_sticky(&Event::Delete(node(&[])), false));
        assert!(concerns_sticky(&Event::InitDone, false));
        assert!(!concerns_sticky(
            &Event::InitApply(node(&[(STICKY_REQUESTS, "{}")])),
            true
        ));
    }

    #[test]
    fn an_ignored_node_is_not_answered_but_its_blocks_count() {
        let asks = r#"{"db/web-0": "web"}"#;
        let read = read_node(&node(&[(STICKY_REQUESTS, asks)]));
        assert_eq!(read.view.requests.as_deref(), Some(asks));
        assert!(!read.ignored);
        let mut ignored = node(&[(STICKY_REQUESTS, asks), ("ipam.cilium.io/ignore", "true")]);
        ignored.spec.ipam.pools.allocated = vec![crate::resources::AllocatedPool {
            pool: "web".into(),
            cidrs: vec!["10.77.0.1/32".parse().unwrap()],
            ..Default::default()
        }];
        let read = read_node(&ignored);
        assert!(read.ignored);
        assert_eq!(read.view.requests, None, "its requests are not read");
        assert_eq!(
            read.view.allocated.len(),
            1,
            "its block still counts as held"
        );
    }
}
