//! Cluster-pool: the leader gives every CiliumNode one CIDR per enabled family
//! of the cluster pool. [`NodeCidrs`] is the bookkeeping (no I/O); here is its
//! side of the node loop ([`node_loop`](super::node_loop): the watch, the
//! batching, the retries) and its writes.
//!
//! Writes are server-side applies under the field manager
//! [`FIELD_MANAGER`](super::FIELD_MANAGER) that carry only the operator's
//! fields: `spec.ipam.podCIDRs`, and `status.ipam.operator-status` through the
//! status subresource. The agent's fields (`spec.addresses`, the owner
//! reference, ...) are never sent, so they are never touched. Each write carries
//! the node's UID, so it cannot re-create a node that was deleted meanwhile (the
//! API server answers 409): a node gone or replaced is left to the watch, which
//! brings its deletion (and the new object).

mod cidrs;

pub use cidrs::NodeCidrs;

use std::collections::BTreeSet;
use std::convert::Infallible;

use kube::api::PatchParams;
use kube::runtime::watcher;
use serde_json::json;

use super::FIELD_MANAGER;
use super::metrics::OperatorMetrics;
use super::node_api::{ApiNodes, NodeApply};
use super::node_loop::{self, AfterRefusal, NodeHandler, NodeWriter, Refusal, Written};
use crate::k8s::discovery::{CiliumKind, api_waiting};
use crate::k8s::mirror::WatchEnded;
use crate::k8s::objects::watch_nodes;
use crate::resources::NodeResource;
use cidrs::{Observed, Pending};

impl NodeHandler for NodeCidrs {
    type Node = Observed;
    type Write = Pending;
    type Input = Infallible;

    fn upsert(&mut self, node: Observed) -> Vec<String> {
        self.observe(node)
    }

    fn delete(&mut self, name: &str) -> Vec<String> {
        self.remove(name)
    }

    fn relisted(&mut self, listed: &BTreeSet<String>, first: bool) -> Vec<String> {
        let touched = self.list_done(listed);
        let (allocated, waiting) = self.counts();
        if first {
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

    fn input(&mut self, input: Infallible) -> Vec<String> {
        match input {}
    }

    fn plan(&mut self, name: &str) -> Option<Pending> {
        self.pending(name)
    }

    fn written(&mut self, name: &str, write: &Pending) {
        if let Some(error) = &write.status_error {
            self.status_written(name, error);
        }
    }

    fn refused(&mut self, name: &str, why: Refusal) -> AfterRefusal {
        tracing::info!(node = %name, refusal = ?why, "node gone or replaced before its CIDRs were written");
        AfterRefusal::LeaveToWatch
    }

    fn report(&self, metrics: &OperatorMetrics) {
        let (allocated, waiting) = self.counts();
        metrics.set_nodes(allocated, waiting);
    }
}

impl NodeWriter<Pending> for ApiNodes<'_> {
    /// Its podCIDRs, then its operator-status error.
    async fn write(&self, name: &str, pending: &Pending) -> Written {
        let mut applies = Vec::new();
        if let Some(list) = &pending.pod_cidrs {
            let fields = json!({"ipam": {"podCIDRs": list}});
            applies.push(NodeApply::spec(fields, "pod-cidrs"));
        }
        if let Some(error) = &pending.status_error {
            applies.push(NodeApply::operator_error(error));
        }
        self.apply_all(name, &pending.uid, applies).await
    }

    async fn read(&self, name: &str) -> Result<Option<NodeResource>, kube::Error> {
        self.get(name).await
    }
}

/// Runs until the watch ends (it does not while the API server can be retried).
pub async fn run(
    client: kube::Client,
    mut cidrs: NodeCidrs,
    metrics: &OperatorMetrics,
) -> WatchEnded {
    let api = api_waiting(&client, CiliumKind::Node).await;
    let writer = ApiNodes::new(api.clone(), PatchParams::apply(FIELD_MANAGER), metrics);
    let nodes = watch_nodes(api, watcher::Config::default());
    node_loop::run(
        &mut cidrs,
        &writer,
        nodes,
        futures::stream::empty(),
        metrics,
    )
    .await
}
