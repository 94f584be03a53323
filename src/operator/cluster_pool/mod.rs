//! Cluster-pool: the leader gives every CiliumNode one CIDR per enabled family
//! of the cluster pool, and extra ones to a node whose agent says it is
//! depleted ([`extra`]). The cluster pool is read again while it runs
//! ([`reload`]): new pool CIDRs are used at once, removed ones drain ([`drain`]). [`NodeCidrs`] is the bookkeeping (no I/O); here is its
//! side of the node loop ([`node_loop`](super::node_loop): the watch, the
//! batching, the retries) and its writes, with the Events about extra CIDRs on
//! the CiliumNode.
//!
//! Writes are server-side applies under the field manager
//! [`FIELD_MANAGER`](super::FIELD_MANAGER) that carry only the operator's
//! fields: `spec.ipam.podCIDRs`, and `status.ipam.operator-status` through the
//! status subresource. The agent's fields (`spec.addresses`, the owner
//! reference, ...) are never sent, so they are never touched. Each write carries
//! the node's UID, so it cannot re-create a node that was deleted meanwhile (the
//! API server answers 409): a node gone or replaced is left to the watch, which
//! brings its deletion (and the new object).

mod cidr_event;
mod cidrs;
pub mod drain;
pub mod extra;
pub mod reload;

pub use cidrs::NodeCidrs;

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::PatchParams;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher;
use serde_json::json;

use super::FIELD_MANAGER;
use super::metrics::OperatorMetrics;
use super::node_api::{ApiNodes, NodeApply};
use super::node_loop::{self, AfterRefusal, NodeHandler, NodeWriter, Refusal, Written};
use crate::ipam::clusterpool::ClusterPoolConfig;
use crate::k8s::mirror::WatchEnded;
use crate::k8s::objects::watch_nodes;
use crate::resources::NodeResource;
use cidr_event::CidrEvent;
use cidrs::{Observed, Pending};
use reload::PoolRead;

impl NodeHandler for NodeCidrs {
    type Node = Observed;
    type Write = Pending;
    type Input = PoolRead;

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

    fn input(&mut self, read: PoolRead) -> Vec<String> {
        self.read(read)
    }

    fn plan(&mut self, name: &str) -> Option<Pending> {
        self.pending(name)
    }

    fn written(&mut self, name: &str, write: &Pending) {
        NodeCidrs::written(self, name, write);
    }

    fn refused(&mut self, name: &str, why: Refusal) -> AfterRefusal {
        tracing::info!(node = %name, refusal = ?why, "node gone or replaced before its CIDRs were written");
        AfterRefusal::LeaveToWatch
    }

    fn report(&self, metrics: &OperatorMetrics) {
        let (allocated, waiting) = self.counts();
        metrics.set_nodes(allocated, waiting);
        metrics.pools_refused.set(i64::from(self.pool_refused()));
    }
}

/// The CiliumNodes' writer: the applies, and the Events on them.
struct CidrWriter<'a> {
    nodes: ApiNodes<'a>,
    events: Recorder,
}

impl NodeWriter<Pending> for CidrWriter<'_> {
    /// Its podCIDRs, then its operator-status error, then its Events (an Event
    /// that cannot be posted is logged, and the write stands).
    async fn write(&self, name: &str, pending: &Pending) -> Written {
        let mut applies = Vec::new();
        if let Some(list) = &pending.pod_cidrs {
            let fields = json!({"ipam": {"podCIDRs": list}});
            applies.push(NodeApply::spec(fields, "pod-cidrs"));
        }
        if let Some(error) = &pending.status_error {
            applies.push(NodeApply::operator_error(error));
        }
        let written = self.nodes.apply_all(name, &pending.uid, applies).await;
        if written.outcome.is_ok() {
            for event in &pending.events {
                self.post(name, &pending.uid, event).await;
            }
        }
        written
    }

    async fn read(&self, name: &str) -> Result<Option<NodeResource>, kube::Error> {
        self.nodes.get(name).await
    }
}

impl CidrWriter<'_> {
    async fn post(&self, name: &str, uid: &str, event: &CidrEvent) {
        let regarding = ObjectReference {
            api_version: Some("cilium.io/v2".into()),
            kind: Some("CiliumNode".into()),
            name: Some(name.into()),
            uid: Some(uid.into()).filter(|u: &String| !u.is_empty()),
            ..Default::default()
        };
        let posted = event.to_event();
        if let Err(e) = self.events.publish(&posted, &regarding).await {
            tracing::warn!(error = %e, node = %name, reason = event.reason, "publishing the Event failed");
        }
    }
}

/// Runs until the watch ends (it does not while the API server can be retried).
/// `args` is the operator's command line, `pool` the cluster pool it started
/// with: the pool is read again from them ([`reload`]).
pub async fn run(
    client: kube::Client,
    mut cidrs: NodeCidrs,
    (args, pool): (Vec<String>, ClusterPoolConfig),
    identity: &str,
    metrics: &OperatorMetrics,
) -> WatchEnded {
    let nodes = ApiNodes::resolve(&client, PatchParams::apply(FIELD_MANAGER), metrics).await;
    let api = nodes.api();
    let writer = CidrWriter {
        nodes,
        events: Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: Some(identity.into()),
            },
        ),
    };
    let nodes = watch_nodes(api, watcher::Config::default());
    let pools = reload::pool_changes(args, pool);
    node_loop::run(&mut cidrs, &writer, nodes, pools, metrics).await
}
