//! The Kubernetes backend: this node's `CiliumNode` (cilium.io/v2) and `Node`
//! through the API server, with kube-rs. The source waits at start for what the
//! mode needs (kubernetes: `Node.spec.podCIDRs`, mirrored into the CiliumNode;
//! cluster-pool: the CIDRs the operator writes into `spec.ipam.podCIDRs`, followed
//! with a watch of the CiliumNode so the node serves as soon as the write lands),
//! unless the API server cannot be reached and the journal already knows the node's
//! CIDRs: then the node serves from what it owns. It then watches the CiliumNode (new blocks,
//! single IPs) and survives API-server restarts and expired resourceVersions (the
//! watcher relists). The sink writes the agent's fields with server-side apply under
//! its own field manager (`podnet-agent`): `spec.addresses` (InternalIP and the
//! router's CiliumInternalIP), the owner reference to the Node (deleting the Node
//! deletes its CiliumNode), `spec.ipam.podCIDRs` in kubernetes mode and
//! `spec.ipam.pools.requested` in multi-pool. Apply owns exactly the fields it
//! sends, so the operator's (`spec.ipam.podCIDRs` in cluster-pool, the allocated
//! blocks, `status.ipam.operator-status`) are never touched, and a conflict is an
//! error, not a lost write. The one exception: in multi-pool the agent gives free
//! blocks back by removing them from the operator's `spec.ipam.pools.allocated`
//! (as Cilium's agent does), with a merge patch that carries the resourceVersion
//! it was computed from, re-read and retried when the node changed meanwhile
//! (`operator::multi_pool` describes the whole protocol). In the external modes the
//! sink applies `status.ipam.used` through the status subresource, only when it
//! differs from what the CiliumNode held when the source last saw it. In
//! cluster-pool the source follows `spec.ipam.podCIDRs` (an extra CIDR the operator
//! appends is served from as it lands), and the sink applies the agent's verdict
//! on them, `status.ipam.pod-cidrs`, the same way under a field manager of its
//! own ([`POD_CIDRS_FIELD_MANAGER`]).
//!
//! The source also reads what the node is for the daemon's configuration check
//! (`daemon::node_check`): its Node's InternalIPs at start and then with a watch
//! of the Node, and the cluster's Service range (the ServiceCIDRs) at start. The
//! sink writes the verdict as the condition [`FIT_CONDITION`] in
//! `status.conditions`, under a field manager of its own, when it differs from
//! what the CiliumNode holds.
//!
//! The source runs its start's API calls on the daemon's runtime through its
//! handle (`initial` is called from a plain thread, never from a task); the sink
//! is async.
//!
//! Owners: [`source`] (the source, its start in `start`, the Node's facts in
//! `node_facts`), [`sink`] (the sink, its release of blocks in `release`, the
//! exhaustion taint on the Node in `taint`), the
//! bodies it applies (`bodies`), what the source last saw (`seen`) and the
//! CiliumNode resource both resolve once (`resource`).

mod bodies;
mod node_facts;
mod release;
mod resource;
mod seen;
pub mod sink;
pub mod source;
mod start;
mod taint;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use kube::api::DynamicObject;
use tokio::runtime::Handle;

use super::{BackendHealth, NodeError, NodeResource, RequestedPool};
use crate::ipam::eni::eni_allocation;
use crate::k8s::objects::node_resource;
use bodies::AgentFields;
use resource::NodesResource;
use seen::SharedSeen;
pub use sink::KubernetesSink;
pub use source::KubernetesSource;

/// The field manager of the agent's server-side applies.
pub const FIELD_MANAGER: &str = "podnet-agent";
/// The field manager of the agent's condition in `status.conditions` (its own:
/// an apply of the status under [`FIELD_MANAGER`] would give up
/// `status.ipam.used`, which crd-class modes apply there).
pub const CHECK_FIELD_MANAGER: &str = "podnet-agent-config-check";
/// The field manager of the agent's `status.ipam.pod-cidrs` (its own, for the
/// reason [`CHECK_FIELD_MANAGER`] has one).
pub const POD_CIDRS_FIELD_MANAGER: &str = "podnet-agent-pod-cidrs";
/// The condition saying whether the agent's configuration fits the node
/// (`daemon::node_check`).
pub const FIT_CONDITION: &str = "podnet.io/ConfigFitsNode";

/// What the node's CIDRs come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubernetesMode {
    /// `Node.spec.podCIDRs`, mirrored into the CiliumNode by the agent.
    Kubernetes,
    /// `spec.ipam.podCIDRs`, written by the operator.
    ClusterPool,
    /// `spec.ipam.pools.allocated`, written by the operator on demand.
    MultiPool,
    /// crd, azure, alibabacloud (`eni: false`) and eni: what the external IPAM
    /// writes into the CiliumNode (single IPs, or the ENI inventory as blocks).
    External { eni: bool },
}

/// Where the API server is and how to reach it.
#[derive(Debug, Clone)]
pub struct KubernetesConfig {
    /// `--k8s-kubeconfig-path`; None: the in-cluster service account.
    pub kubeconfig: Option<PathBuf>,
    pub node_name: String,
    pub mode: KubernetesMode,
    /// The enabled families (IPv4, IPv6), for kubernetes mode's CIDR check.
    pub ipv4: bool,
    pub ipv6: bool,
    /// External modes: addresses the node must own before the daemon serves.
    pub needed: u64,
    /// multi-pool: the demand written at start (the pre-allocated pools and the
    /// default pool's router and health addresses); the source waits until each of
    /// these pools has a block, as Cilium's agent does.
    pub initial_demand: Vec<RequestedPool>,
    /// `--routing-mode` (`tunnel`, `native`), which the agent says in its
    /// CiliumNode (`resources::ROUTING_MODE_ANNOTATION`); empty: not said.
    pub routing_mode: &'static str,
}

/// Both halves of the backend, sharing the agent's fields and the used addresses
/// last seen.
pub fn kubernetes_backend(
    config: KubernetesConfig,
    runtime: Handle,
    journal_node: Option<NodeResource>,
    health: Arc<BackendHealth>,
) -> (KubernetesSource, KubernetesSink) {
    let fields = Arc::new(Mutex::new(AgentFields {
        routing_mode: config.routing_mode,
        ..AgentFields::from_journal(journal_node.as_ref())
    }));
    let seen = SharedSeen::default();
    let nodes = NodesResource::default();
    (
        KubernetesSource {
            config: config.clone(),
            runtime: runtime.clone(),
            journal_node,
            fields: fields.clone(),
            seen: seen.clone(),
            nodes: nodes.clone(),
            pools: None,
            client: None,
            node_labels: BTreeMap::new(),
            facts: None,
            health,
        },
        KubernetesSink {
            config,
            fields,
            seen,
            nodes,
            client: None,
            pending: false,
            pending_used: None,
            pending_fit: None,
            pending_released: BTreeSet::new(),
            pending_pod_cidrs: None,
            pending_room: None,
        },
    )
}

/// eni: the ENI inventory as blocks of pool `default`, as the external backend does.
fn resolved(mode: KubernetesMode, mut node: NodeResource) -> Result<NodeResource, NodeError> {
    if mode == (KubernetesMode::External { eni: true }) {
        node.spec.ipam.pools.allocated =
            eni_allocation(&node.status.eni.enis, &node.spec.eni).map_err(NodeError::Eni)?;
    }
    Ok(node)
}

/// The typed node resource of a CiliumNode object.
fn to_node_resource(obj: &DynamicObject) -> Result<NodeResource, NodeError> {
    Ok(node_resource(obj)?)
}
