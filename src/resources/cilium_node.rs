//! `CiliumNode` (cilium.io/v2, field names as Cilium spells them), the node
//! resource: the part podnet uses (`spec.ipam`, `spec.addresses`, `spec.eni`,
//! `status.ipam`, `status.eni`), with every other field kept on a round trip.

use std::collections::BTreeMap;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::ObjectMeta;
use super::fields::cidr_list;

/// The annotation in which each agent says how it routes to the other nodes
/// (`tunnel` or `native`, its `--routing-mode`): podnet's own, as CiliumNode
/// has no field for it. While a cluster changes mode, a native node still
/// tunnels to the nodes that say `tunnel`, so no pair of nodes is left with a
/// path one end does not take.
pub const ROUTING_MODE_ANNOTATION: &str = "podnet.io/routing-mode";

/// The node resource (`CiliumNode`). Fields podnet does not model are kept in the
/// `extra` maps (top level, `metadata`, `spec`, `spec.ipam`, `status`) and written
/// back as read; `status.ipam` is the daemon's own and keeps only what it models.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeResource {
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: NodeSpec,
    #[serde(default)]
    pub status: NodeStatus,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<NodeAddress>,
    #[serde(default)]
    pub ipam: NodeIpamSpec,
    /// `spec.instance-id` (cloud instance; written by whoever creates the node).
    #[serde(
        rename = "instance-id",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub instance_id: String,
    /// `spec.eni`: AWS ENI settings of this node (ENI mode).
    #[serde(default, skip_serializing_if = "EniSpec::is_empty")]
    pub eni: EniSpec,
    /// `spec.health`: the node's health endpoint addresses.
    #[serde(default, skip_serializing_if = "HealthAddresses::is_empty")]
    pub health: HealthAddresses,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// `spec.health` (Cilium's `HealthAddressingSpec`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthAddresses {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ipv4: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ipv6: String,
}

impl HealthAddresses {
    pub fn is_empty(&self) -> bool {
        self.ipv4.is_empty() && self.ipv6.is_empty()
    }
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
    /// Cluster-pool and kubernetes modes: the node's CIDRs (on the wire, strings
    /// such as `10.0.1.0/24`; deserializing refuses anything that is not a CIDR).
    #[serde(
        rename = "podCIDRs",
        default,
        deserialize_with = "cidr_list",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub pod_cidrs: Vec<IpNet>,
    /// Multi-pool: what the node asks for and what it was given.
    #[serde(default, skip_serializing_if = "IpamPools::is_empty")]
    pub pools: IpamPools,
    /// CRD-backed IPAM: available single IPs, `ip -> {owner, resource}` (both
    /// families; the family comes from the key).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pool: BTreeMap<String, AllocationIp>,
    /// `ipv6-pool`: same shape (not read by Cilium's CRD allocator).
    #[serde(
        rename = "ipv6-pool",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub ipv6_pool: BTreeMap<String, AllocationIp>,
    /// Watermarks (operator side, ENI/CRD modes): 0 = unset.
    #[serde(rename = "min-allocate", default, skip_serializing_if = "is_zero")]
    pub min_allocate: u64,
    #[serde(rename = "max-allocate", default, skip_serializing_if = "is_zero")]
    pub max_allocate: u64,
    #[serde(rename = "pre-allocate", default, skip_serializing_if = "is_zero")]
    pub pre_allocate: u64,
    #[serde(
        rename = "max-above-watermark",
        default,
        skip_serializing_if = "is_zero"
    )]
    pub max_above_watermark: u64,
    #[serde(
        rename = "static-ip-tags",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub static_ip_tags: BTreeMap<String, String>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// `{owner, resource}` of a `spec.ipam.pool` / `status.ipam.used` entry
/// (`resource` is the ENI or interface ID in cloud modes).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationIp {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource: String,
}

/// `spec.eni` (AWS `ENISpec`, the same keys as the CNI conf's `eni` object).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EniSpec {
    #[serde(
        rename = "instance-type",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub instance_type: String,
    /// ENIs with a `number` below this are not used for Pods (unset = 0).
    #[serde(
        rename = "first-interface-index",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub first_interface_index: Option<u32>,
    #[serde(
        rename = "security-groups",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub security_groups: Vec<String>,
    #[serde(
        rename = "security-group-tags",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub security_group_tags: BTreeMap<String, String>,
    #[serde(rename = "subnet-ids", default, skip_serializing_if = "Vec::is_empty")]
    pub subnet_ids: Vec<String>,
    #[serde(
        rename = "subnet-tags",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub subnet_tags: BTreeMap<String, String>,
    #[serde(
        rename = "node-subnet-id",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub node_subnet_id: String,
    #[serde(rename = "vpc-id", default, skip_serializing_if = "String::is_empty")]
    pub vpc_id: String,
    #[serde(
        rename = "availability-zone",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub availability_zone: String,
    /// ENIs carrying all of these tags are not used for Pods.
    #[serde(
        rename = "exclude-interface-tags",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub exclude_interface_tags: BTreeMap<String, String>,
    #[serde(
        rename = "delete-on-termination",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub delete_on_termination: Option<bool>,
    /// The ENI primary IP may be given to Pods.
    #[serde(
        rename = "use-primary-address",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub use_primary_address: Option<bool>,
    #[serde(
        rename = "disable-prefix-delegation",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub disable_prefix_delegation: Option<bool>,
}

impl EniSpec {
    pub fn is_empty(&self) -> bool {
        *self == EniSpec::default()
    }
}

/// `status.eni`: the ENI inventory (written by the operator side).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EniStatus {
    /// ENI ID -> ENI.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub enis: BTreeMap<String, Eni>,
}

impl EniStatus {
    pub fn is_empty(&self) -> bool {
        self.enis.is_empty()
    }
}

/// One ENI of `status.eni.enis`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Eni {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    /// The ENI primary private IP.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ip: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    #[serde(
        rename = "availability-zone",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub availability_zone: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// Interface number (device index); the route table is 10 + number.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub number: u32,
    #[serde(default, skip_serializing_if = "AwsSubnet::is_empty")]
    pub subnet: AwsSubnet,
    #[serde(default, skip_serializing_if = "AwsVpc::is_empty")]
    pub vpc: AwsVpc,
    /// Private IPs (secondary IPs; prefix members may be listed too).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// Delegated IPv4 prefixes (/28).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefixes: Vec<String>,
    /// Delegated IPv6 prefixes (/80).
    #[serde(
        rename = "ipv6-prefixes",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub ipv6_prefixes: Vec<String>,
    #[serde(
        rename = "security-groups",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub security_groups: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    #[serde(
        rename = "public-ip",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub public_ip: String,
}

/// `subnet {id, cidr}` of an ENI.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AwsSubnet {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cidr: String,
}

impl AwsSubnet {
    pub fn is_empty(&self) -> bool {
        self.id.is_empty() && self.cidr.is_empty()
    }
}

/// `vpc {id, primary-cidr, cidrs[]}` of an ENI.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AwsVpc {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    #[serde(
        rename = "primary-cidr",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub primary_cidr: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cidrs: Vec<String>,
}

impl AwsVpc {
    pub fn is_empty(&self) -> bool {
        self.id.is_empty() && self.primary_cidr.is_empty() && self.cidrs.is_empty()
    }
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
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
    /// On the wire, strings such as `10.0.1.0/24` (deserializing refuses anything
    /// that is not a CIDR).
    #[serde(default, deserialize_with = "cidr_list")]
    pub cidrs: Vec<IpNet>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    #[serde(default)]
    pub ipam: NodeIpamStatus,
    /// `status.eni`: the ENI inventory (ENI mode).
    #[serde(default, skip_serializing_if = "EniStatus::is_empty")]
    pub eni: EniStatus,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// `status.ipam`: the daemon writes all of it; keys it does not model are dropped.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeIpamStatus {
    #[serde(rename = "operator-status", default)]
    pub operator_status: OperatorStatus,
    /// CRD-backed IPAM: IPs in use, `ip -> {owner, resource}` (rewritten in full).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub used: BTreeMap<String, AllocationIp>,
    #[serde(
        rename = "ipv6-used",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub ipv6_used: BTreeMap<String, AllocationIp>,
    /// Cluster-pool: the state of each of the node's CIDRs, `cidr -> {status}`
    /// (the field of Cilium's retired dynamic cluster-pool, written by the agent):
    /// whether the node still has room, needs another CIDR, or gave one back.
    #[serde(
        rename = "pod-cidrs",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub pod_cidrs: BTreeMap<String, PodCidrStatus>,
}

/// One entry of `status.ipam.pod-cidrs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodCidrStatus {
    pub status: PodCidrState,
}

/// What the agent says of one of its CIDRs (the CRD's enum).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PodCidrState {
    /// Served from; the node has room.
    InUse,
    /// The node's free addresses of this family fell under the threshold: it
    /// asks for another CIDR.
    Depleted,
    /// Empty for the release delay and given back: nothing is handed out of it,
    /// and the operator may take it off the node.
    Released,
}

impl PodCidrState {
    /// The word the CRD uses.
    pub fn as_str(self) -> &'static str {
        match self {
            PodCidrState::InUse => "in-use",
            PodCidrState::Depleted => "depleted",
            PodCidrState::Released => "released",
        }
    }
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
            metadata: ObjectMeta::named(name),
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
        n.spec.ipam.pod_cidrs = vec!["10.0.1.0/24".parse().unwrap()];
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

    /// What `kubectl get ciliumnode -o json` prints, with fields podnet does not
    /// model at every level.
    fn kubectl_node() -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "cilium.io/v2",
            "kind": "CiliumNode",
            "metadata": {
                "name": "worker-1",
                "labels": {"kubernetes.io/hostname": "worker-1"},
                "resourceVersion": "4711",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "worker-1", "uid": "u-1"}],
                "uid": "c0ffee",
                "creationTimestamp": "2026-09-20T10:00:00Z"
            },
            "spec": {
                "addresses": [{"type": "CiliumInternalIP", "ip": "10.0.1.1"}],
                "bootid": "b-1",
                "health": {"ipv4": "10.0.1.2"},
                "ipam": {
                    "podCIDRs": ["10.0.1.0/24"],
                    "pools": {"allocated": [{
                        "pool": "default",
                        "allowFirstIP": false,
                        "allowLastIP": false,
                        "cidrs": ["10.9.0.0/27"]
                    }]},
                    "future-knob": 3
                }
            },
            "status": {
                "ipam": {"operator-status": {}, "release-ips": {"10.0.1.30": "released"}},
                "azure": {"interfaces": []}
            },
            "future-top-level": true
        })
    }

    #[test]
    fn round_trip_keeps_unknown_fields() {
        let before = kubectl_node();
        let node: NodeResource = crate::resources::decode(&before).unwrap();
        assert_eq!(node.metadata.name, "worker-1");
        assert_eq!(node.metadata.resource_version.as_deref(), Some("4711"));
        assert_eq!(node.metadata.owner_references[0].kind, "Node");
        assert_eq!(node.metadata.labels["kubernetes.io/hostname"], "worker-1");
        assert_eq!(
            node.spec.ipam.pod_cidrs,
            vec!["10.0.1.0/24".parse::<IpNet>().unwrap()]
        );
        assert_eq!(
            node.spec.ipam.pools.allocated[0].cidrs,
            vec!["10.9.0.0/27".parse::<IpNet>().unwrap()]
        );
        let after = serde_json::to_value(&node).unwrap();
        // Everything but status.ipam (the daemon's own) comes back as it was.
        let mut expected = before.clone();
        expected["status"]["ipam"] = serde_json::json!({"operator-status": {}});
        assert_eq!(after, expected);
    }

    #[test]
    fn cidr_fields_must_be_cidrs() {
        let mut v = kubectl_node();
        v["spec"]["ipam"]["podCIDRs"] = serde_json::json!(["10.0.1.0/24", "10.0.2.0/33"]);
        assert_eq!(
            crate::resources::decode::<NodeResource>(&v).unwrap_err(),
            "spec.ipam.podCIDRs[1]: \"10.0.2.0/33\" is not a CIDR (expected <address>/<prefix \
             length>, e.g. 10.0.0.0/16 or fd00::/104)"
        );
        let mut v = kubectl_node();
        v["spec"]["ipam"]["pools"]["allocated"][0]["cidrs"] = serde_json::json!(["10.9.0.0"]);
        let e = crate::resources::decode::<NodeResource>(&v).unwrap_err();
        assert!(
            e.starts_with("spec.ipam.pools.allocated[0].cidrs[0]: \"10.9.0.0\" is not a CIDR"),
            "{e}"
        );
        // A list, not a string or null (as when the field held text).
        let mut v = kubectl_node();
        v["spec"]["ipam"]["podCIDRs"] = serde_json::json!(null);
        assert_eq!(
            crate::resources::decode::<NodeResource>(&v).unwrap_err(),
            "spec.ipam.podCIDRs must be a list, not null"
        );
        let mut v = kubectl_node();
        v["spec"]["ipam"]["pools"]["allocated"][0]["cidrs"] = serde_json::json!("10.9.0.0/27");
        assert_eq!(
            crate::resources::decode::<NodeResource>(&v).unwrap_err(),
            "spec.ipam.pools.allocated[0].cidrs must be a list, not a string"
        );
    }

    /// The CIDR fields are typed but the wire format is the strings Cilium
    /// writes, both families (what a journal written before holds reads back and
    /// is written again unchanged).
    #[test]
    fn cidr_fields_are_strings_on_the_wire() {
        let stored = serde_json::json!({
            "apiVersion": "cilium.io/v2",
            "kind": "CiliumNode",
            "metadata": {"name": "n1"},
            "spec": {"ipam": {
                "podCIDRs": ["10.0.1.0/24", "fd00::/120", "fd00:1:2::/64"],
                "pools": {"allocated": [{
                    "pool": "default",
                    "allowFirstIP": false,
                    "allowLastIP": false,
                    "cidrs": ["10.9.0.0/27", "10.9.0.32/27", "fd00:9::/120", "2600:1f00::5/128"]
                }]}
            }},
            "status": {"ipam": {"operator-status": {}}}
        });
        let node: NodeResource = crate::resources::decode(&stored).unwrap();
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        assert_eq!(
            node.spec.ipam.pod_cidrs,
            [net("10.0.1.0/24"), net("fd00::/120"), net("fd00:1:2::/64")]
        );
        assert_eq!(
            node.spec.ipam.pools.allocated[0].cidrs[2],
            net("fd00:9::/120")
        );
        assert_eq!(serde_json::to_value(&node).unwrap(), stored);
        // Written from memory: the same text as `IpNet`'s `Display`.
        let mut n = NodeResource::new("n1");
        n.spec.ipam.pod_cidrs = vec![net("fd00::/120"), net("10.0.1.0/24")];
        let text = serde_json::to_string(&n.spec.ipam).unwrap();
        assert_eq!(text, r#"{"podCIDRs":["fd00::/120","10.0.1.0/24"]}"#);
    }
}
