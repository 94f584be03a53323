//! What the enforcer reads of Pods, Namespaces, NetworkPolicies and the
//! cluster's CiliumNodes: plain values built from the API objects ([`PodView`],
//! [`NamespaceView`], [`policy`], [`NodeView`]), with every field parsed once. A policy's view keeps the problems found while
//! parsing it; the part a problem names becomes one that allows nothing.

use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Container, Namespace, Pod, PodSpec};

use super::problem::Problem;
use super::selector::{Labels, Selector};
use crate::resources::NodeResource;

pub use super::view_cluster::{
    Action, ClusterPolicyView, ClusterRuleView, Subject, Tier, cluster_policy,
};
pub use super::view_policy::policy;

/// A transport protocol NetworkPolicy names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// `TCP`, `UDP`, `SCTP` (the API's spelling, exactly); None for others.
    pub fn parse(s: &str) -> Option<Protocol> {
        match s {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    /// The API's spelling.
    pub fn api_name(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }

    /// nftables' name (`meta l4proto tcp`).
    pub fn nft_name(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

/// A named container port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamedPort {
    pub name: String,
    pub protocol: Protocol,
    pub number: u16,
}

/// A pod as the enforcer needs it: made once from the Pod object (the agent's
/// mirror keeps only this); whether it runs on this node is the compile's
/// [`Local`](super::compile::Local), not the view's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodView {
    pub namespace: String,
    pub name: String,
    /// `metadata.uid`: a local pod's allocation names it, so a Pod of the same
    /// name and another UID is not that pod.
    pub uid: Option<String>,
    pub labels: Labels,
    /// `status.podIPs` (empty until the pod has addresses, and for host-network
    /// or finished pods, whose addresses are not theirs).
    pub ips: Vec<IpAddr>,
    /// The named ports of its containers and native sidecars.
    pub ports: Vec<NamedPort>,
}

impl PodView {
    /// The view of `pod` (taken whole: its metadata's strings move into the
    /// view, the rest is dropped).
    pub fn from_k8s(pod: Pod) -> PodView {
        let spec = pod.spec.as_ref();
        let status = pod.status.as_ref();
        let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
        let finished = matches!(
            status.and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        );
        let mut ips: Vec<IpAddr> = status
            .and_then(|s| s.pod_ips.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|p| p.ip.parse().ok())
            .collect();
        if ips.is_empty() {
            ips.extend(status.and_then(|s| s.pod_ip.as_ref()?.parse::<IpAddr>().ok()));
        }
        if host_network || finished {
            ips.clear();
        }
        let ports = spec
            .into_iter()
            .flat_map(serving_containers)
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| {
                Some(NamedPort {
                    name: p.name.clone()?,
                    protocol: Protocol::parse(p.protocol.as_deref().unwrap_or("TCP"))?,
                    number: u16::try_from(p.container_port).ok()?,
                })
            })
            .collect();
        let meta = pod.metadata;
        PodView {
            namespace: meta.namespace.unwrap_or_default(),
            name: meta.name.unwrap_or_default(),
            uid: meta.uid,
            labels: meta.labels.unwrap_or_default(),
            ips,
            ports,
        }
    }
}

/// The containers whose named ports a policy can name: the Pod's containers
/// and its native sidecars (init containers with `restartPolicy: Always`, which
/// run beside them for the Pod's life). Other init containers have exited
/// before the Pod serves, as Kubernetes' own resolution of named ports has it.
fn serving_containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    spec.containers.iter().chain(sidecars)
}

/// A namespace as the enforcer needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceView {
    pub name: String,
    pub labels: Labels,
}

impl NamespaceView {
    /// The view of `ns` (taken whole, as [`PodView::from_k8s`]).
    pub fn from_k8s(ns: Namespace) -> NamespaceView {
        NamespaceView {
            name: ns.metadata.name.unwrap_or_default(),
            labels: ns.metadata.labels.unwrap_or_default(),
        }
    }
}

/// A node of the cluster as the enforcer needs it: the addresses its host
/// traffic carries (its CiliumNode's `spec.addresses`).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct NodeView {
    pub name: String,
    /// The CiliumNode's labels (a ClusterNetworkPolicy's `nodes` peer).
    pub labels: Labels,
    /// Type `InternalIP`, in their order.
    pub internal_ips: Vec<IpAddr>,
    /// Type `CiliumInternalIP`: the node's router addresses, the source of its
    /// host traffic to other nodes' pods in tunnel routing.
    pub router_ips: Vec<IpAddr>,
}

impl NodeView {
    /// The view of `node` (addresses that do not parse are left out).
    pub fn from_resource(node: &NodeResource) -> NodeView {
        let addresses = |kind: &str| {
            let of_kind = node.spec.addresses.iter().filter(|a| a.kind == kind);
            of_kind.filter_map(|a| a.ip.parse().ok()).collect()
        };
        NodeView {
            name: node.metadata.name.clone(),
            labels: node.metadata.labels.clone(),
            internal_ips: addresses("InternalIP"),
            router_ips: addresses("CiliumInternalIP"),
        }
    }
}

/// Which namespaces a pod peer's pods are in.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Namespaces {
    /// The policy's own (a peer with a `podSelector` only).
    Own(String),
    /// Those the `namespaceSelector` matches.
    Matching(Selector),
}

/// One entry of `from` / `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerView {
    Pods {
        namespaces: Namespaces,
        pods: Selector,
    },
    /// `ipBlock`: `net` minus every `except` (a ClusterNetworkPolicy's
    /// `networks`: one per CIDR, no except).
    Block { net: IpNet, except: Vec<IpNet> },
    /// A ClusterNetworkPolicy's `nodes`: the InternalIPs of the nodes (their
    /// CiliumNodes) whose labels the selector matches.
    Nodes(Selector),
    /// An invalid peer: allows nothing.
    Nothing,
}

/// Which ports of a protocol an entry of `ports` allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortSpec {
    /// No `port`: every port of the protocol.
    Any,
    /// `port` .. `endPort` (or `port` alone).
    Range(u16, u16),
    /// A named port, resolved per pod.
    Named(String),
}

/// One entry of `ports`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortView {
    Port {
        protocol: Protocol,
        spec: PortSpec,
    },
    /// An invalid entry: allows nothing.
    Nothing,
}

/// One ingress or egress rule.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleView {
    /// Empty: every peer.
    pub peers: Vec<PeerView>,
    /// Empty: every port and protocol.
    pub ports: Vec<PortView>,
}

/// A NetworkPolicy as the enforcer needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyView {
    pub namespace: String,
    pub name: String,
    pub pod_selector: Selector,
    /// None when `Ingress` is not among the policy types; an empty list denies
    /// all ingress of the selected pods.
    pub ingress: Option<Vec<RuleView>>,
    /// As `ingress`, for `Egress`.
    pub egress: Option<Vec<RuleView>>,
    /// What parsing found wrong.
    pub problems: Vec<Problem>,
}

#[cfg(test)]
#[path = "tests/view.rs"]
mod tests;
