//! `CiliumNode`-shaped node resource (cilium.io/v2 field names), the part podnet
//! uses: `spec.ipam.podCIDRs`, `spec.addresses`, `status.ipam.operator-status`.

use serde::{Deserialize, Serialize};

/// The node resource. Unknown fields are kept out; podnet writes what it reads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeResource {
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    pub kind: String,
    pub metadata: Metadata,
    #[serde(default)]
    pub spec: NodeSpec,
    #[serde(default)]
    pub status: NodeStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    pub name: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<NodeAddress>,
    #[serde(default)]
    pub ipam: NodeIpamSpec,
}

/// `spec.addresses[]`: `type` is e.g. `CiliumInternalIP` (the router IP).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeAddress {
    #[serde(rename = "type")]
    pub kind: String,
    pub ip: String,
}

/// `spec.ipam`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeIpamSpec {
    #[serde(rename = "podCIDRs", default, skip_serializing_if = "Vec::is_empty")]
    pub pod_cidrs: Vec<String>,
    /// Multi-pool: what the node asks for and what it was given.
    #[serde(default, skip_serializing_if = "IpamPools::is_empty")]
    pub pools: IpamPools,
}

/// `spec.ipam.pools`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IpamPools {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requested: Vec<RequestedPool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allocated: Vec<AllocatedPool>,
}

impl IpamPools {
    pub fn is_empty(&self) -> bool {
        self.requested.is_empty() && self.allocated.is_empty()
    }
}

/// `spec.ipam.pools.requested[]`: demand per pool (zero counts omitted).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestedPool {
    pub pool: String,
    pub needed: PoolDemand,
}

/// `needed`: addresses per family.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolDemand {
    #[serde(rename = "ipv4-addrs", default, skip_serializing_if = "is_zero")]
    pub ipv4_addrs: u64,
    #[serde(rename = "ipv6-addrs", default, skip_serializing_if = "is_zero")]
    pub ipv6_addrs: u64,
}

/// `spec.ipam.pools.allocated[]`: the blocks the node owns in a pool (IPv4 CIDRs
/// sorted, then IPv6 CIDRs sorted).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatedPool {
    pub pool: String,
    #[serde(rename = "allowFirstIP", default)]
    pub allow_first_ip: bool,
    #[serde(rename = "allowLastIP", default)]
    pub allow_last_ip: bool,
    #[serde(default)]
    pub cidrs: Vec<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    #[serde(default)]
    pub ipam: NodeIpamStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeIpamStatus {
    #[serde(rename = "operator-status", default)]
    pub operator_status: OperatorStatus,
}

/// `status.ipam.operator-status`: the operator's last error for this node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OperatorStatus {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

impl NodeResource {
    /// An empty resource for `name`.
    pub fn new(name: &str) -> NodeResource {
        NodeResource {
            api_version: "cilium.io/v2".into(),
            kind: "CiliumNode".into(),
            metadata: Metadata { name: name.into() },
            ..Default::default()
        }
    }

    /// Sets the address of `kind` (replacing one of the same kind and family).
    pub fn set_address(&mut self, kind: &str, ip: std::net::IpAddr) {
        let v4 = ip.is_ipv4();
        self.spec.addresses.retain(|a| {
            a.kind != kind
                || a.ip
                    .parse::<std::net::IpAddr>()
                    .map(|x| x.is_ipv4() != v4)
                    .unwrap_or(false)
        });
        self.spec.addresses.push(NodeAddress {
            kind: kind.into(),
            ip: ip.to_string(),
        });
    }

    /// The addresses of `kind`.
    pub fn addresses_of(&self, kind: &str) -> Vec<std::net::IpAddr> {
        self.spec
            .addresses
            .iter()
            .filter(|a| a.kind == kind)
            .filter_map(|a| a.ip.parse().ok())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_shape_matches_ciliumnode() {
        let mut n = NodeResource::new("n1");
        n.spec.ipam.pod_cidrs = vec!["10.0.1.0/24".into()];
        n.set_address("CiliumInternalIP", "10.0.1.5".parse().unwrap());
        n.set_address("CiliumInternalIP", "10.0.1.7".parse().unwrap());
        n.set_address("CiliumInternalIP", "fd00::1".parse().unwrap());
        let v = serde_json::to_value(&n).unwrap();
        assert_eq!(v["apiVersion"], "cilium.io/v2");
        assert_eq!(v["spec"]["ipam"]["podCIDRs"][0], "10.0.1.0/24");
        assert_eq!(n.addresses_of("CiliumInternalIP").len(), 2);
        assert_eq!(
            n.addresses_of("CiliumInternalIP")[0].to_string(),
            "10.0.1.7"
        );
    }
}
