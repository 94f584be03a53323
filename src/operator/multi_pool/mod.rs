//! Multi-pool: the leader creates the `--auto-create-cilium-pod-ip-pools` pools
//! that do not exist ([`auto_create`]), reads the CiliumPodIPPools (with
//! `--enable-cluster-pool-to-multi-pool-migration`, nodes' `podCIDRs` are
//! adopted into the default pool), then follows every CiliumNode (the node
//! loop, [`node_loop`](super::node_loop)) and every CiliumPodIPPool, and keeps
//! [`PoolBlocks`] (the bookkeeping, no I/O) up to date. The CiliumNode watch's
//! first list is the re-read of every node: their blocks are re-adopted before
//! anything is carved. The sticky loop ([`sticky_loop`]) decides sticky
//! addresses and writes the pools' records; the nodes' part of each decision
//! goes to the node loop as an input ([`handler`]): the node loop's writer is
//! the one writer of each CiliumNode.
//!
//! # The write protocol (no lost write, no block on two nodes)
//!
//! - The agent owns `spec.ipam.pools.requested` (server-side apply as
//!   `podnet-agent`) and gives a free block back by removing it from
//!   `spec.ipam.pools.allocated` with a JSON patch whose `test` op checks the
//!   entry it edits (retried after a re-read on failure).
//! - The operator owns `allocated` and `status.ipam.operator-status`. It writes
//!   `allocated` as a forced server-side apply (`podnet-operator`) that carries
//!   the node's UID and the resourceVersion the list was computed from: when the
//!   agent changed the node meanwhile, the API server answers 409, the operator
//!   reads the node again (blocks carved for the failed write are freed by that
//!   observation) and plans again.
//! - The operator frees a block only when a node object at least as new as its
//!   own last write no longer lists it (or the node is deleted); then another
//!   node may get it.

pub mod auto_create;
pub mod blocks;
mod handler;
pub mod sticky;
pub mod sticky_lifecycle;
mod sticky_loop;
mod sticky_writes;

pub use blocks::PoolBlocks;

use futures::channel::mpsc;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use kube::api::{Api, ApiResource, DynamicObject, PatchParams, PostParams};
use kube::runtime::watcher;

use super::FIELD_MANAGER;
use super::metrics::OperatorMetrics;
use super::node_api::ApiNodes;
use super::node_loop;
use crate::controller::Backoff;
use crate::ipam::pooldef::PoolDef;
use crate::k8s::discovery::{CiliumKind, resolve_waiting};
use crate::k8s::mirror::WatchEnded;
use crate::k8s::objects::watch_nodes;
use crate::k8s::pool_watch::{PoolWatch, Resolver, list_pools};
use auto_create::pool_object;
use handler::{Input, MultiPool, set_pools};

/// Creates the pools of `--auto-create-cilium-pod-ip-pools` that do not exist
/// (an existing one is never changed) at `resource` (the version the CRD serves),
/// retrying while the API server fails.
async fn create_missing_pools(client: &kube::Client, resource: &ApiResource, pools: &[PoolDef]) {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), resource);
    for def in pools {
        let body: DynamicObject =
            match serde_json::from_value(pool_object(def, &resource.api_version)) {
                Ok(b) => b,
                Err(e) => {
                    tracing::error!(pool = %def.name, error = %e, "pool object not built");
                    continue;
                }
            };
        let mut wait = Backoff::API.next(None);
        loop {
            match api.create(&PostParams::default(), &body).await {
                Ok(_) => tracing::info!(pool = %def.name, "created the CiliumPodIPPool"),
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    tracing::info!(pool = %def.name, "the CiliumPodIPPool exists; left as it is")
                }
                // Refused as written (the CRD's validation): trying again cannot help.
                Err(kube::Error::Api(e)) if (400..500).contains(&e.code) && e.code != 429 => {
                    tracing::error!(pool = %def.name, error = %e, "the API server refused the CiliumPodIPPool; not created");
                }
                Err(e) => {
                    tracing::warn!(pool = %def.name, error = %e, retry_in = ?wait, "creating the CiliumPodIPPool failed");
                    tokio::time::sleep(wait).await;
                    wait = Backoff::API.next(Some(wait));
                    continue;
                }
            }
            break;
        }
    }
}

/// The pools as they are now; None when they cannot be read (the current
/// definitions stay).
async fn read_pools(client: &kube::Client, resource: &ApiResource) -> Option<Vec<PoolDef>> {
    list_pools(client, resource)
        .await
        .inspect_err(|e| tracing::warn!(error = %e, "CiliumPodIPPools not read; the current definitions stay"))
        .ok()
}

/// The CiliumPodIPPool resource, waiting until its CRD serves a version podnet
/// understands.
async fn resolve_pools(client: &kube::Client) -> ApiResource {
    resolve_waiting(client, CiliumKind::PodIpPool, &|_| {}).await
}

/// The pool definitions after each change of a CiliumPodIPPool (a list in
/// progress is read whole when it is done); a CRD that is not served any more is
/// waited for again (the current definitions stay in force meanwhile). Ends with
/// the watch.
fn pool_changes(
    client: kube::Client,
    resource: ApiResource,
) -> BoxStream<'static, Result<Vec<PoolDef>, WatchEnded>> {
    let resolve: Resolver<ApiResource> =
        Box::new(|client| async move { resolve_pools(&client).await }.boxed());
    let watch = PoolWatch::new(client, resource, "CiliumPodIPPool", resolve);
    futures::stream::unfold(Some(watch), |watch| async move {
        let mut w = watch?;
        loop {
            if let Err(ended) = w.changed().await {
                return Some((Err(ended), None));
            }
            if let Some(pools) = read_pools(w.client(), w.watched()).await {
                return Some((Ok(pools), Some(w)));
            }
        }
    })
    .boxed()
}

/// Runs until a watch ends (they do not while the API server can be retried).
pub async fn run(
    client: kube::Client,
    auto_create: Vec<PoolDef>,
    migrate_into: Option<String>,
    metrics: &OperatorMetrics,
) -> WatchEnded {
    let pool_resource = resolve_pools(&client).await;
    create_missing_pools(&client, &pool_resource, &auto_create).await;
    let mut blocks = PoolBlocks::default();
    if let Some(pool) = &migrate_into {
        tracing::info!(pool = %pool, "cluster-pool to multi-pool migration on: nodes' podCIDRs become their blocks of this pool");
        blocks = blocks.with_migration(pool);
    }
    if let Some(pools) = read_pools(&client, &pool_resource).await {
        set_pools(&mut blocks, &pools);
        metrics.pools_refused.set(i64::from(blocks.pools_refused()));
    }
    let writer =
        ApiNodes::resolve(&client, PatchParams::apply(FIELD_MANAGER).force(), metrics).await;
    let nodes = watch_nodes(writer.api(), watcher::Config::default());
    // The sticky loop's decisions, one at a time (it waits for each to settle).
    let (decisions, decided) = mpsc::channel(1);
    let inputs = futures::stream::select(
        pool_changes(client.clone(), pool_resource.clone()).map(|p| p.map(Input::Pools)),
        decided.map(|d| Ok(Input::Sticky(d))),
    );
    // What the node loop sees of the nodes, told to the sticky loop.
    let (sticky_hears, node_seen) = mpsc::unbounded();
    let mut handler = MultiPool::new(blocks, sticky_hears);
    let allocator = node_loop::run(&mut handler, &writer, nodes, inputs, metrics);
    let sticky = sticky_loop::run(client, pool_resource, &writer, node_seen, decisions);
    tokio::select! {
        ended = allocator => ended,
        ended = sticky => ended,
    }
}
