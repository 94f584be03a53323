//! The leader's loop: watches every CiliumNode (kube-rs `watcher` with the default
//! backoff, so a restarted API server or an expired resourceVersion is survived by a
//! relist), feeds what it sees to [`NodeCidrs`], and writes what each node needs.
//! The watcher's first list is the re-read of every CiliumNode: their CIDRs are
//! re-adopted before anything is allocated.
//!
//! Writes are server-side applies under the field manager `podnet-operator` that
//! carry only the operator's fields: `spec.ipam.podCIDRs`, and
//! `status.ipam.operator-status` through the status subresource. The agent's fields
//! (`spec.addresses`, the owner reference, ...) are never sent, so they are never
//! touched. Each write carries the node's UID, so it cannot re-create a node that
//! was deleted meanwhile (the API server answers 409). A write that fails for any
//! other reason is retried with a backoff.
//!
//! Events that have already arrived are taken together, and the writes they call
//! for (one per node, different nodes) go out [`WRITE_CONCURRENCY`] at a time: a
//! burst of new nodes costs one apply each and is paced by the API server, not by
//! one round trip after the other.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::watcher::Event;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tokio::time::Instant;

use super::allocator::{NodeCidrs, Observed, Pending, ignored};
use super::metrics::OperatorMetrics;
use super::retry::WriteRetries;
use crate::k8s::discovery::{CiliumKind, api_waiting};
use crate::node::kubernetes::to_node_resource;

/// The field manager of the operator's applies.
pub const FIELD_MANAGER: &str = "podnet-operator";
/// Writes in flight at once (different nodes): a burst of new nodes is bounded by
/// the API server's write rate, not by one round trip after another.
const WRITE_CONCURRENCY: usize = 16;
/// At most this many events that have already arrived are taken before writing.
const EVENT_BATCH: usize = 1024;

/// What the operator reads of a CiliumNode object.
fn observed(obj: &DynamicObject) -> Result<Observed, String> {
    let node = to_node_resource(obj).map_err(|e| e.to_string())?;
    Ok(Observed {
        name: obj.metadata.name.clone().unwrap_or_default(),
        uid: obj.metadata.uid.clone().unwrap_or_default(),
        pod_cidrs: node.spec.ipam.pod_cidrs,
        error: node.status.ipam.operator_status.error,
        ignored: ignored(&node.metadata.annotations),
    })
}

/// Runs until the watch ends (it does not while the API server can be retried);
/// returns why.
pub async fn run(
    client: kube::Client,
    mut cidrs: NodeCidrs,
    metrics: Arc<OperatorMetrics>,
) -> String {
    let api = api_waiting(&client, CiliumKind::Node).await;
    let mut stream = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut listing: Option<BTreeSet<String>> = None;
    let mut first_list = true;
    let mut retry = WriteRetries::default();
    loop {
        let due = retry.next_due();
        let mut dirty: BTreeSet<String> = BTreeSet::new();
        let item = tokio::select! {
            item = stream.next() => Some(item),
            _ = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() && listing.is_none() => {
                dirty.extend(retry.due_at(Instant::now()));
                None
            }
        };
        // Take what else has already arrived too, so that a burst of new nodes is
        // written as one batch.
        let mut items = item
            .into_iter()
            .chain(std::iter::from_fn(|| stream.next().now_or_never()).take(EVENT_BATCH));
        for item in items.by_ref() {
            match item {
                None => return "the CiliumNode watch ended".into(),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "CiliumNode watch interrupted; it resumes")
                }
                Some(Ok(event)) => dirty.extend(apply_event(
                    &mut cidrs,
                    &mut listing,
                    &mut first_list,
                    event,
                )),
            }
        }
        // While a list is being read, writes wait for its end (the list may still
        // change what a node needs).
        if listing.is_some() {
            continue;
        }
        let mut jobs = Vec::new();
        for name in dirty {
            match cidrs.pending(&name) {
                Some(p) => jobs.push((name, p)),
                None => retry.succeeded(&name),
            }
        }
        let done: Vec<(String, Written)> = futures::stream::iter(jobs)
            .map(|(name, pending)| {
                let (api, metrics) = (&api, &metrics);
                async move {
                    let written = write_node(api, &name, pending, metrics).await;
                    (name, written)
                }
            })
            .buffer_unordered(WRITE_CONCURRENCY)
            .collect()
            .await;
        for (name, written) in done {
            for obj in &written.objects {
                if let Ok(o) = observed(obj) {
                    cidrs.observe(o);
                }
            }
            if let Some(error) = &written.status_error {
                cidrs.status_written(&name, error);
            }
            match written.failed {
                None => retry.succeeded(&name),
                Some(e) => {
                    let backoff = retry.failed(&name);
                    tracing::warn!(node = %name, error = %e, retry_in = ?backoff, "writing the node's CIDRs failed");
                }
            }
        }
        let (allocated, waiting) = cidrs.counts();
        metrics.set_nodes(allocated, waiting);
    }
}

/// Feeds one watch event to the bookkeeping; returns the nodes that may need writes.
fn apply_event(
    cidrs: &mut NodeCidrs,
    listing: &mut Option<BTreeSet<String>>,
    first_list: &mut bool,
    event: Event<DynamicObject>,
) -> Vec<String> {
    match event {
        Event::Init => {
            *listing = Some(BTreeSet::new());
            Vec::new()
        }
        Event::InitApply(obj) => {
            if let (Some(l), Some(name)) = (listing.as_mut(), obj.metadata.name.clone()) {
                l.insert(name);
            }
            see(cidrs, &obj)
        }
        Event::InitDone => {
            let listed = listing.take().unwrap_or_default();
            let touched = cidrs.list_done(&listed);
            let (allocated, waiting) = cidrs.counts();
            if std::mem::take(first_list) {
                tracing::info!(
                    nodes = listed.len(),
                    holding_cidrs = allocated,
                    with_errors = waiting,
                    "read every CiliumNode and re-adopted their CIDRs; allocating"
                );
            } else {
                tracing::info!(nodes = listed.len(), "CiliumNodes listed again");
            }
            touched
        }
        Event::Apply(obj) => see(cidrs, &obj),
        Event::Delete(obj) => match obj.metadata.name.as_deref() {
            Some(name) => cidrs.remove(name),
            None => Vec::new(),
        },
    }
}

/// Feeds one CiliumNode to the bookkeeping.
fn see(cidrs: &mut NodeCidrs, obj: &DynamicObject) -> Vec<String> {
    match observed(obj) {
        Ok(o) => cidrs.observe(o),
        Err(e) => {
            tracing::error!(error = %e, "CiliumNode not understood; left alone");
            Vec::new()
        }
    }
}

/// Whether a failed write means the object is gone or was replaced: the watch
/// brings its deletion (and the new object), so the write is not retried.
fn gone(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_not_found() || s.is_conflict())
}

/// What one node's writes left behind.
#[derive(Default)]
struct Written {
    /// The objects the API server answered with (newer than what was watched).
    objects: Vec<DynamicObject>,
    /// The operator-status error that was written.
    status_error: Option<String>,
    /// Why a write failed (it is retried); None when everything went through or
    /// the node is gone.
    failed: Option<kube::Error>,
}

/// Writes what `name` needs: its podCIDRs, then its operator-status error. No
/// bookkeeping here (writes of several nodes run at once); the caller feeds the
/// result back.
async fn write_node(
    api: &Api<DynamicObject>,
    name: &str,
    pending: Pending,
    metrics: &OperatorMetrics,
) -> Written {
    let params = PatchParams::apply(FIELD_MANAGER);
    let mut written = Written::default();
    let Pending {
        uid,
        pod_cidrs,
        status_error,
    } = pending;
    if let Some(list) = pod_cidrs {
        let body = json!({
            "apiVersion": "cilium.io/v2",
            "kind": "CiliumNode",
            "metadata": {"name": name, "uid": uid},
            "spec": {"ipam": {"podCIDRs": list}},
        });
        match api.patch(name, &params, &Patch::Apply(&body)).await {
            Ok(obj) => {
                metrics.wrote("pod-cidrs");
                written.objects.push(obj);
            }
            Err(e) if gone(&e) => {
                tracing::info!(node = %name, error = %e, "node gone or replaced before its CIDRs were written");
                return written;
            }
            Err(e) => {
                written.failed = Some(e);
                return written;
            }
        }
    }
    if let Some(error) = status_error {
        // Clearing writes "" (what Cilium's omitempty field reads as no error):
        // applying without the field would leave `operator-status: null`, which
        // the CRD's schema refuses.
        let body = json!({
            "apiVersion": "cilium.io/v2",
            "kind": "CiliumNode",
            "metadata": {"name": name, "uid": uid},
            "status": {"ipam": {"operator-status": {"error": error}}},
        });
        match api.patch_status(name, &params, &Patch::Apply(&body)).await {
            Ok(obj) => {
                metrics.wrote("status");
                written.objects.push(obj);
                written.status_error = Some(error);
            }
            Err(e) if gone(&e) => {}
            Err(e) => written.failed = Some(e),
        }
    }
    written
}
