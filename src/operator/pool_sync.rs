//! The multi-pool leader's loop: creates the `--auto-create-cilium-pod-ip-pools`
//! pools that do not exist, reads the CiliumPodIPPools (with
//! `--enable-cluster-pool-to-multi-pool-migration`, nodes' `podCIDRs` are
//! adopted into the default pool: [`PoolBlocks`]), then watches every
//! CiliumNode and every CiliumPodIPPool and keeps [`PoolBlocks`] up to date. The
//! CiliumNode watch's first list is the re-read of every node: their blocks are
//! re-adopted before anything is carved.
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

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::watcher::Error as WatchError;
use kube::runtime::watcher::Event;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::time::Instant;

use super::allocator::ignored;
use super::auto_pools::pool_object;
use super::metrics::OperatorMetrics;
use super::pools::{NodeWrite, ObservedNode, PoolBlocks};
use super::retry::{WriteRetries, next_backoff};
use super::sync::FIELD_MANAGER;
use crate::ipam::pooldef::PoolDef;
use crate::k8s::discovery::{CiliumKind, api_waiting, resolve_waiting, resource_gone, watch_all};
use crate::node::kube_pools::list_pools;
use crate::node::kubernetes::to_node_resource;

/// Conflicts in a row after which a node waits for the retry timer.
const CONFLICTS_IN_A_ROW: usize = 5;

/// What the operator reads of a CiliumNode.
fn observed(obj: &DynamicObject) -> Result<ObservedNode, String> {
    let node = to_node_resource(obj).map_err(|e| e.to_string())?;
    Ok(ObservedNode {
        name: obj.metadata.name.clone().unwrap_or_default(),
        uid: obj.metadata.uid.clone().unwrap_or_default(),
        resource_version: obj.metadata.resource_version.clone().unwrap_or_default(),
        requested: node.spec.ipam.pools.requested,
        allocated: node.spec.ipam.pools.allocated,
        pod_cidrs: node.spec.ipam.pod_cidrs,
        error: node.status.ipam.operator_status.error,
        ignored: ignored(&node.metadata.annotations),
    })
}

/// Feeds one CiliumNode to the bookkeeping; logs what is wrong with its blocks.
fn see(blocks: &mut PoolBlocks, obj: &DynamicObject) {
    let name = obj.metadata.name.clone().unwrap_or_default();
    match observed(obj) {
        Ok(o) => {
            for problem in blocks.observe(o) {
                tracing::error!(node = %name, "{problem}");
            }
        }
        Err(e) => {
            tracing::error!(node = %name, error = %e, "CiliumNode not understood; left alone")
        }
    }
}

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
        let mut wait = next_backoff(None);
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
                    wait = next_backoff(Some(wait));
                    continue;
                }
            }
            break;
        }
    }
}

/// Reads the pools and puts them in force unless they break blocks in use.
async fn reload_pools(
    client: &kube::Client,
    resource: &ApiResource,
    blocks: &mut PoolBlocks,
    metrics: &OperatorMetrics,
) {
    let defs = match list_pools(client, resource).await {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %e, "CiliumPodIPPools not read; the current definitions stay");
            return;
        }
    };
    let names: Vec<&str> = defs.iter().map(|d| d.name.as_str()).collect();
    match blocks.set_pools(&defs) {
        Ok(()) => {
            metrics.pools_refused.set(0);
            tracing::info!(pools = ?names, "pool definitions in force");
        }
        Err(why) => {
            metrics.pools_refused.set(1);
            tracing::error!(pools = ?names, "pool definitions refused, the previous ones stay in force: {why}");
        }
    }
}

/// Runs until the watch ends (it does not while the API server can be retried);
/// returns why.
pub async fn run(
    client: kube::Client,
    auto_create: Vec<PoolDef>,
    migrate_into: Option<String>,
    metrics: Arc<OperatorMetrics>,
) -> String {
    let mut pool_resource = resolve_pools(&client).await;
    create_missing_pools(&client, &pool_resource, &auto_create).await;
    let mut blocks = match PoolBlocks::new(&[]) {
        Ok(b) => b,
        Err(e) => return e,
    };
    if let Some(pool) = &migrate_into {
        tracing::info!(pool = %pool, "cluster-pool to multi-pool migration on: nodes' podCIDRs become their blocks of this pool");
        blocks = blocks.with_migration(pool);
    }
    reload_pools(&client, &pool_resource, &mut blocks, &metrics).await;
    let api = api_waiting(&client, CiliumKind::Node).await;
    let mut nodes = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut pools = watch_all(&client, &pool_resource);
    let mut listing: Option<BTreeSet<String>> = None;
    let mut first_list = true;
    let mut retry = WriteRetries::default();
    loop {
        let due = retry.next_due();
        let mut dirty: BTreeSet<String> = BTreeSet::new();
        tokio::select! {
            item = nodes.next() => match item {
                None => return "the CiliumNode watch ended".into(),
                Some(Err(e)) => tracing::warn!(error = %e, "CiliumNode watch interrupted; it resumes"),
                Some(Ok(Event::Init)) => listing = Some(BTreeSet::new()),
                Some(Ok(Event::InitApply(obj))) => {
                    if let (Some(l), Some(name)) = (listing.as_mut(), obj.metadata.name.clone()) {
                        l.insert(name);
                    }
                    see(&mut blocks, &obj);
                }
                Some(Ok(Event::InitDone)) => {
                    let listed = listing.take().unwrap_or_default();
                    for gone in blocks.node_names().into_iter().filter(|n| !listed.contains(n)) {
                        blocks.remove(&gone);
                    }
                    if std::mem::take(&mut first_list) {
                        tracing::info!(nodes = listed.len(), "read every CiliumNode and re-adopted their blocks; allocating");
                    }
                    dirty.extend(blocks.node_names());
                }
                Some(Ok(Event::Apply(obj))) => {
                    see(&mut blocks, &obj);
                    dirty.extend(obj.metadata.name.clone());
                    // It may have given blocks back that waiting nodes need.
                    dirty.extend(blocks.waiting());
                }
                Some(Ok(Event::Delete(obj))) => {
                    if let Some(name) = obj.metadata.name.as_deref() {
                        blocks.remove(name);
                        retry.succeeded(name);
                    }
                    dirty.extend(blocks.waiting());
                }
            },
            item = pools.next() => match item {
                None => return "the CiliumPodIPPool watch ended".into(),
                Some(Err(e)) if resource_gone(&e) => {
                    tracing::warn!(version = %pool_resource.api_version, "the CiliumPodIPPool CRD is not served any more; the current definitions stay in force until it is");
                    pool_resource = resolve_pools(&client).await;
                    pools = watch_all(&client, &pool_resource);
                }
                Some(Err(e)) => warn_interrupted(&e),
                // A list in progress: read the whole set when it is done.
                Some(Ok(Event::Init | Event::InitApply(_))) => {}
                Some(Ok(_)) => {
                    reload_pools(&client, &pool_resource, &mut blocks, &metrics).await;
                    dirty.extend(blocks.node_names());
                }
            },
            _ = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                dirty.extend(retry.due_at(Instant::now()));
            }
        }
        // Writes wait for the end of a list of the nodes (it re-adopts blocks).
        if listing.is_some() || first_list {
            continue;
        }
        for name in dirty {
            match sync_node(&api, &mut blocks, &name, &metrics).await {
                Ok(()) => retry.succeeded(&name),
                Err(e) => {
                    let backoff = retry.failed(&name);
                    tracing::warn!(node = %name, error = %e, retry_in = ?backoff, "writing the node's blocks failed");
                }
            }
        }
        metrics.set_pool_blocks(&blocks.pool_space());
        let waiting = blocks.waiting().len();
        metrics.set_nodes(blocks.node_names().len() - waiting, waiting);
    }
}

/// The CiliumPodIPPool resource, waiting until its CRD serves a version podnet
/// understands.
async fn resolve_pools(client: &kube::Client) -> ApiResource {
    resolve_waiting(client, CiliumKind::PodIpPool, &|_| {}).await
}

fn warn_interrupted(e: &WatchError) {
    tracing::warn!(error = %e, "CiliumPodIPPool watch interrupted; it resumes");
}

/// What a failed write means.
enum WriteError {
    /// 409: the node changed since it was read (or was replaced).
    Conflict,
    /// 404: the node is gone (the watch brings its deletion).
    Gone,
    Other(kube::Error),
}

impl From<kube::Error> for WriteError {
    fn from(e: kube::Error) -> WriteError {
        match &e {
            kube::Error::Api(s) if s.is_conflict() => WriteError::Conflict,
            kube::Error::Api(s) if s.is_not_found() => WriteError::Gone,
            _ => WriteError::Other(e),
        }
    }
}

/// Plans and writes what `name` needs; after a conflict reads the node again
/// and plans again.
async fn sync_node(
    api: &Api<DynamicObject>,
    blocks: &mut PoolBlocks,
    name: &str,
    metrics: &OperatorMetrics,
) -> Result<(), kube::Error> {
    for _ in 0..CONFLICTS_IN_A_ROW {
        let Some(write) = blocks.plan(name) else {
            return Ok(());
        };
        match write_node(api, blocks, name, &write, metrics).await {
            Ok(()) => return Ok(()),
            Err(WriteError::Gone) => {
                tracing::info!(node = %name, "node gone before its blocks were written");
                blocks.remove(name);
                return Ok(());
            }
            Err(WriteError::Conflict) => {
                tracing::debug!(node = %name, "the node changed since it was read; reading it again");
                match api.get_opt(name).await? {
                    Some(obj) => see(blocks, &obj),
                    None => {
                        blocks.remove(name);
                        return Ok(());
                    }
                }
            }
            Err(WriteError::Other(e)) => return Err(e),
        }
    }
    Err(kube::Error::Service(
        format!("{CONFLICTS_IN_A_ROW} conflicts in a row writing CiliumNode {name:?}").into(),
    ))
}

/// Writes one plan: the blocks (resourceVersion-checked), then the error.
async fn write_node(
    api: &Api<DynamicObject>,
    blocks: &mut PoolBlocks,
    name: &str,
    write: &NodeWrite,
    metrics: &OperatorMetrics,
) -> Result<(), WriteError> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    if let Some(allocated) = &write.allocated {
        let body = json!({
            "apiVersion": "cilium.io/v2",
            "kind": "CiliumNode",
            "metadata": {"name": name, "uid": write.uid, "resourceVersion": write.resource_version},
            "spec": {"ipam": {"pools": {"allocated": allocated}}},
        });
        let obj = api.patch(name, &params, &Patch::Apply(&body)).await?;
        metrics.wrote("pools-allocated");
        see(blocks, &obj);
    }
    if let Some(error) = &write.error {
        // Only the operator writes its status: the UID is the only precondition.
        let body = json!({
            "apiVersion": "cilium.io/v2",
            "kind": "CiliumNode",
            "metadata": {"name": name, "uid": write.uid},
            "status": {"ipam": {"operator-status": {"error": error}}},
        });
        let obj = api
            .patch_status(name, &params, &Patch::Apply(&body))
            .await?;
        metrics.wrote("status");
        see(blocks, &obj);
    }
    Ok(())
}
