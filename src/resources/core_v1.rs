//! The Kubernetes `core/v1` objects podnet reads: `Pod` and `Namespace` (their
//! metadata, for pool selection) and `Node` (`spec.podCIDRs`, `status.addresses`).
//! Everything else they carry is kept in `extra`.

use std::collections::BTreeMap;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::fields::{cidrs, nullable};
use super::object::object;

object! {
    /// A `Pod`: its metadata (`metadata.namespace` absent means `default`).
    pub struct Pod {}
}

object! {
    /// A `Namespace`: its metadata.
    pub struct Namespace {}
}

object! {
    /// A `Node`: its pod CIDRs (kubernetes mode) and addresses.
    pub struct Node {
        #[serde(default, deserialize_with = "nullable")]
        pub spec: NodeSpec,
        #[serde(default, deserialize_with = "nullable")]
        pub status: NodeStatus,
    }
}

/// `Node.spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeSpec {
    #[serde(
        rename = "podCIDRs",
        default,
        deserialize_with = "cidrs",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub pod_cidrs: Vec<IpNet>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// `Node.status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub addresses: Vec<NodeAddress>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// `Node.status.addresses[]`: `type` is `InternalIP`, `ExternalIP`, `Hostname`, ...
/// (`address` is a host name for `Hostname`, so it stays text).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeAddress {
    #[serde(rename = "type")]
    pub kind: String,
    pub address: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::decode;

    #[test]
    fn pod_metadata_and_the_rest_kept() {
        let v = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "rover-1",
                "namespace": "tenant-mars",
                "labels": {"app": "rover"},
                "annotations": {"ipam.cilium.io/ipv4-pool": "blue"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rover",
                                     "uid": "u", "controller": true, "blockOwnerDeletion": true}],
                "managedFields": [{"manager": "kubectl"}]
            },
            "spec": {"nodeName": "worker-1"},
            "status": {"podIP": "10.20.0.17"}
        });
        let pod: Pod = decode(&v).unwrap();
        assert_eq!(pod.metadata.describe("Pod"), "Pod \"tenant-mars/rover-1\"");
        assert_eq!(pod.metadata.owner_references[0].controller, Some(true));
        assert_eq!(serde_json::to_value(&pod).unwrap(), v);
        let ns: Namespace =
            decode(&serde_json::json!({"kind": "Namespace", "metadata": {"name": "a"}})).unwrap();
        assert_eq!(ns.metadata.describe("Namespace"), "Namespace \"a\"");
    }

    #[test]
    fn node_pod_cidrs_and_addresses() {
        let v = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "worker-1"},
            "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24", "fd00:1::/64"]},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.168.1.10"},
                                     {"type": "Hostname", "address": "worker-1"}]}
        });
        let node: Node = decode(&v).unwrap();
        assert_eq!(node.spec.pod_cidrs.len(), 2);
        assert_eq!(node.status.addresses[1].kind, "Hostname");
        assert_eq!(serde_json::to_value(&node).unwrap(), v);
        let mut bad = v.clone();
        bad["spec"]["podCIDRs"][1] = "fd00:1::".into();
        assert!(
            decode::<Node>(&bad)
                .unwrap_err()
                .starts_with("spec.podCIDRs[1]: \"fd00:1::\" is not a CIDR")
        );
    }
}
