//! Pods and CiliumNodes as the cluster-wide duplicate check sees them
//! ([`crate::ipam::duplicates`]): the conversions from the API server's objects
//! and one read of both, shared by the operator's periodic check and `podnet ipam
//! check`. The Pods and CiliumNodes are listed cluster-wide page by page
//! ([`list_pages`]: a consistent snapshot), and only what the check needs is kept
//! of each.

use std::convert::Infallible;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use super::discovery::{CiliumKind, DiscoveryError, resolve};
use super::objects::{ListError, list_pages, list_valid};
use crate::ipam::duplicates::{NodeRange, NodeRanges, PodView, RangeSource};
use crate::ipam::leaks::PodName;
use crate::resources::{NodeIpamStatus, NodeResource, NodeSpec, NodeStatus, ObjectMeta};

/// Why the Pods and CiliumNodes could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    #[error(transparent)]
    List(#[from] ListError),
}

impl ReadError {
    /// The API server's own error, when it was a request that failed.
    pub fn api_error(&self) -> Option<&kube::Error> {
        match self {
            ReadError::Discovery(DiscoveryError::Api { source, .. }) => Some(source),
            ReadError::List(e) => Some(&e.source),
            ReadError::Discovery(_) => None,
        }
    }
}

/// What one read returns.
pub struct Listed {
    pub pods: Vec<PodView>,
    /// Every CiliumNode podnet understands (one it does not is logged and left
    /// out: its Pods count as on a node without a CiliumNode).
    pub cilium_nodes: Vec<NodeResource>,
}

impl Listed {
    /// Each CiliumNode's name and ranges, as the check takes them.
    pub fn node_ranges(&self) -> Vec<NodeRanges> {
        self.cilium_nodes.iter().map(node_ranges).collect()
    }
}

/// Lists every Pod and every CiliumNode once.
pub async fn read(client: &kube::Client) -> Result<Listed, ReadError> {
    let resource = resolve(client, CiliumKind::Node).await?;
    let cilium_nodes = list_valid(client, &resource, "CiliumNode", |n: &NodeResource| {
        Ok::<_, Infallible>(kept(n))
    })
    .await?;
    let pods = list_pods(client).await?;
    Ok(Listed { pods, cilium_nodes })
}

/// What the checks keep of a CiliumNode: its identity (apiVersion, kind, name,
/// UID: the Events' `regarding`), the ranges it owns (`spec.ipam`) and the
/// allocations it publishes (`status.ipam.used`, `ipv6-used`). The rest
/// (managedFields, labels, annotations, addresses, ENI, the operator's status)
/// is dropped as each page is read: at 5,000 nodes the whole objects were the
/// operator's largest peak.
fn kept(n: &NodeResource) -> NodeResource {
    let mut metadata = ObjectMeta::named(&n.metadata.name);
    if let Some(uid) = n.metadata.extra.get("uid") {
        metadata.extra.insert("uid".into(), uid.clone());
    }
    NodeResource {
        api_version: n.api_version.clone(),
        kind: n.kind.clone(),
        metadata,
        spec: NodeSpec {
            ipam: n.spec.ipam.clone(),
            ..NodeSpec::default()
        },
        status: NodeStatus {
            ipam: NodeIpamStatus {
                used: n.status.ipam.used.clone(),
                ipv6_used: n.status.ipam.ipv6_used.clone(),
                ..NodeIpamStatus::default()
            },
            ..NodeStatus::default()
        },
        extra: Default::default(),
    }
}

/// Every Pod of the cluster, page by page.
pub async fn list_pods(client: &kube::Client) -> Result<Vec<PodView>, ListError> {
    let api = Api::<Pod>::all(client.clone());
    list_pages(&api, ListParams::default(), "Pod", "v1", |p| {
        Some(pod_view(p))
    })
    .await
}

/// A Pod as the check needs it (an IP the API server has that does not parse is
/// logged and left out).
pub fn pod_view(pod: &Pod) -> PodView {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    let mut texts: Vec<&str> = status
        .and_then(|s| s.pod_ips.as_ref())
        .map(|ips| ips.iter().map(|i| i.ip.as_str()).collect())
        .unwrap_or_default();
    if texts.is_empty()
        && let Some(ip) = status.and_then(|s| s.pod_ip.as_deref())
    {
        texts.push(ip);
    }
    let name = PodName {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
    };
    let ips = texts
        .into_iter()
        .filter_map(|t| {
            t.parse::<IpAddr>()
                .inspect_err(
                    |_| tracing::warn!(pod = %name, ip = t, "a pod IP that is not an IP; left out"),
                )
                .ok()
        })
        .collect();
    PodView {
        uid: meta.uid.clone().unwrap_or_default(),
        node: spec
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty()),
        ips,
        host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
        phase: status.and_then(|s| s.phase.clone()).unwrap_or_default(),
        terminating: meta.deletion_timestamp.is_some(),
        pod: name,
    }
}

/// A CiliumNode's ranges: `spec.ipam.podCIDRs`, the blocks of
/// `spec.ipam.pools.allocated`, and the single IPs of `spec.ipam.pool` /
/// `ipv6-pool` (a key that is not an IP is left out).
pub fn node_ranges(node: &NodeResource) -> NodeRanges {
    let ipam = &node.spec.ipam;
    let mut ranges: Vec<NodeRange> = ipam
        .pod_cidrs
        .iter()
        .map(|c| NodeRange {
            cidr: *c,
            source: RangeSource::PodCidr,
        })
        .collect();
    for pool in &ipam.pools.allocated {
        ranges.extend(pool.cidrs.iter().map(|c| NodeRange {
            cidr: *c,
            source: RangeSource::PoolBlock {
                pool: pool.pool.clone(),
            },
        }));
    }
    ranges.extend(
        ipam.pool
            .keys()
            .chain(ipam.ipv6_pool.keys())
            .filter_map(|ip| ip.parse::<IpAddr>().ok())
            .map(|ip| NodeRange {
                cidr: ip.into(),
                source: RangeSource::PoolIp,
            }),
    );
    NodeRanges {
        name: node.metadata.name.clone(),
        ranges,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_keeps_what_the_check_needs() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1",
                         "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"nodeName": "n1", "hostNetwork": false, "containers": []},
            "status": {"phase": "Running", "podIP": "10.0.0.5",
                       "podIPs": [{"ip": "10.0.0.5"}, {"ip": "fd00::5"}, {"ip": "bogus"}]},
        }))
        .unwrap();
        let v = pod_view(&pod);
        assert_eq!(v.pod.to_string(), "shop/web");
        assert_eq!(v.uid, "u1");
        assert_eq!(v.node.as_deref(), Some("n1"));
        assert_eq!(
            v.ips,
            [
                "10.0.0.5".parse::<IpAddr>().unwrap(),
                "fd00::5".parse().unwrap()
            ]
        );
        assert_eq!(v.phase, "Running");
        assert!(v.terminating && !v.host_network);
        // Only podIP (an older kubelet), host network, not scheduled.
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "h", "namespace": "kube-system"},
            "spec": {"hostNetwork": true, "containers": []},
            "status": {"podIP": "192.0.2.1"},
        }))
        .unwrap();
        let v = pod_view(&pod);
        assert_eq!(v.ips, ["192.0.2.1".parse::<IpAddr>().unwrap()]);
        assert!(v.host_network && !v.terminating);
        assert_eq!((v.node, v.phase.as_str()), (None, ""));
    }

    #[test]
    fn a_cilium_node_has_its_cidrs_blocks_and_pool_ips() {
        let node: NodeResource = serde_json::from_value(serde_json::json!({
            "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
            "metadata": {"name": "n1"},
            "spec": {"ipam": {
                "podCIDRs": ["10.0.0.0/24"],
                "pools": {"allocated": [{"pool": "blue", "cidrs": ["10.9.0.0/28", "fd09::/124"]}]},
                "pool": {"10.5.0.9": {}, "not-an-ip": {}},
                "ipv6-pool": {"fd05::9": {"resource": "eni-1"}},
            }},
        }))
        .unwrap();
        let v = node_ranges(&node);
        assert_eq!(v.name, "n1");
        let texts: Vec<String> = v.ranges.iter().map(ToString::to_string).collect();
        assert_eq!(
            texts,
            [
                "10.0.0.0/24 (podCIDR)",
                "10.9.0.0/28 (block of pool blue)",
                "fd09::/124 (block of pool blue)",
                "10.5.0.9/32 (pool IP)",
                "fd05::9/128 (pool IP)",
            ]
        );
    }

    #[test]
    fn a_cilium_node_keeps_its_identity_ranges_and_published_allocations_only() {
        let node: NodeResource = serde_json::from_value(serde_json::json!({
            "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
            "metadata": {"name": "n1", "uid": "u-1", "resourceVersion": "7",
                         "labels": {"a": "b"}, "annotations": {"c": "d"},
                         "managedFields": [{"manager": "podnet", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"addresses": [{"type": "InternalIP", "ip": "10.1.0.1"}],
                     "ipam": {"podCIDRs": ["10.0.0.0/24"]}},
            "status": {"ipam": {"used": {"10.0.0.5": {"owner": "default/p", "resource": "c1"}},
                                "operator-status": {"error": "x"}},
                       "extra": {"big": true}},
        }))
        .unwrap();
        let k = kept(&node);
        assert_eq!(k.api_version, "cilium.io/v2");
        assert_eq!(k.metadata.name, "n1");
        assert_eq!(k.metadata.uid(), "u-1");
        assert_eq!(k.metadata.extra.len(), 1, "{:?}", k.metadata.extra);
        assert!(k.metadata.labels.is_empty() && k.metadata.annotations.is_empty());
        assert!(k.spec.addresses.is_empty() && k.status.extra.is_empty());
        assert_eq!(k.status.ipam.used, node.status.ipam.used);
        assert_eq!(node_ranges(&k), node_ranges(&node));
    }
}
