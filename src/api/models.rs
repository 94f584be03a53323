//! Wire models of the daemon API. Field names follow Cilium's `api/v1/openapi.yaml`
//! (kebab-case, with Cilium's few camelCase exceptions); podnet's own additions are
//! marked as such and are all optional, so a Cilium client still parses them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ipam::range_fill::RangeFill;

/// podnet: the HTTP header that carries why the daemon refused a request. The body
/// stays Cilium's error (a JSON string), so Cilium's clients are unaffected.
pub const REASON_HEADER: &str = "podnet-reason";

/// podnet: the HTTP header of a `delegated-plugin` refusal of `POST /v1/ipam` that
/// carries the daemon's configuration (`DaemonConfigurationStatus` as JSON, ASCII
/// only), so the plugin runs the delegated IPAM without asking `GET /v1/config`.
pub const CONFIG_HEADER: &str = "podnet-config";

/// podnet: why the daemon refused a request, on the wire (the `podnet-reason`
/// header and `explain`'s failures); the IPAM's own type, spelled here as there.
pub use crate::ipam::failure_reason::FailureReason;

/// `POST /v1/ipam` and `POST /v1/ipam/{ip}` answer: Cilium's `IPAMResponse`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct IpamResponse {
    pub address: AddressPair,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<IpamAddressResponse>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<IpamAddressResponse>,
    #[serde(rename = "host-addressing")]
    pub host_addressing: NodeAddressing,
    /// podnet: the journal commit that recorded the allocation (`<journal id>.<seq>`);
    /// the plugin marks the pod's host link with it (see `datapath::link_marker`).
    #[serde(
        rename = "journal-mark",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub journal_mark: String,
    /// podnet: the daemon's configuration (what `GET /v1/config` answers in
    /// `status`), so the plugin needs no round trip of its own for it.
    #[serde(
        rename = "podnet-config",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub podnet_config: Option<DaemonConfigurationStatus>,
    /// podnet: the daemon journaled the attachment's endpoint, pending, in the
    /// allocation's commit (the request named the pod's netns): the plugin marks the
    /// host link wired instead of registering the endpoint (docs/crash-safety.md).
    #[serde(
        rename = "podnet-endpoint-pending",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub endpoint_pending: bool,
}

/// Cilium's `AddressPair`: the plain addresses, their pools and expiration ids.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct AddressPair {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ipv4: String,
    #[serde(
        rename = "ipv4-pool-name",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub ipv4_pool_name: String,
    #[serde(
        rename = "ipv4-expiration-uuid",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub ipv4_expiration_uuid: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ipv6: String,
    #[serde(
        rename = "ipv6-pool-name",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub ipv6_pool_name: String,
    #[serde(
        rename = "ipv6-expiration-uuid",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub ipv6_expiration_uuid: String,
}

/// Cilium's `IPAMAddressResponse`, one per family.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct IpamAddressResponse {
    pub ip: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub gateway: String,
    /// Cilium never omits `cidrs`; it is `null` outside ENI-class modes.
    #[serde(default)]
    pub cidrs: Option<Vec<String>>,
    #[serde(
        rename = "master-mac",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub master_mac: String,
    #[serde(
        rename = "expiration-uuid",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub expiration_uuid: String,
    #[serde(
        rename = "interface-number",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub interface_number: String,
    #[serde(rename = "skip-masquerade", default, skip_serializing_if = "is_false")]
    pub skip_masquerade: bool,
    /// podnet: the pool the address came from (Cilium puts it only in `address`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pool: String,
}

/// Cilium's `NodeAddressing`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct NodeAddressing {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<NodeAddressingElement>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<NodeAddressingElement>,
}

/// Cilium's `NodeAddressingElement`: the router IP and the node's alloc range.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct NodeAddressingElement {
    #[serde(default, skip_serializing_if = "is_false")]
    pub enabled: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ip: String,
    #[serde(
        rename = "alloc-range",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub alloc_range: String,
}

/// `GET /v1/config`: Cilium's `DaemonConfiguration` (the status part the CNI reads).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DaemonConfiguration {
    #[serde(default)]
    pub status: DaemonConfigurationStatus,
}

/// The fields of Cilium's `DaemonConfigurationStatus` that podnet fills.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DaemonConfigurationStatus {
    #[serde(default)]
    pub addressing: NodeAddressing,
    #[serde(rename = "ipam-mode", default)]
    pub ipam_mode: String,
    #[serde(rename = "deviceMTU", default)]
    pub device_mtu: u32,
    #[serde(rename = "routeMTU", default)]
    pub route_mtu: u32,
    #[serde(rename = "datapathMode", default)]
    pub datapath_mode: String,
    #[serde(rename = "configuredDatapathMode", default)]
    pub configured_datapath_mode: String,
    /// podnet: the node's name.
    #[serde(
        rename = "node-name",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub node_name: String,
    /// podnet: whether the plugin shapes `runtimeConfig.bandwidth`
    /// (`--enable-bandwidth-manager`; Cilium's status names it the same way).
    /// Left out when off, so the answer of a daemon without it reads as before.
    #[serde(
        rename = "bandwidth-manager",
        default,
        skip_serializing_if = "BandwidthManager::is_off"
    )]
    pub bandwidth_manager: BandwidthManager,
}

/// `bandwidth-manager` of the daemon's configuration.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct BandwidthManager {
    #[serde(default)]
    pub enabled: bool,
    /// podnet: local pods shaped, as the bandwidth loop's last pass found
    /// them (the status only, on the Kubernetes backend, once it ran).
    #[serde(
        rename = "pods-shaped",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub pods_shaped: Option<u64>,
}

impl BandwidthManager {
    fn is_off(&self) -> bool {
        !self.enabled
    }
}

/// `PUT /v1/endpoint/{id}` body: the subset of Cilium's `EndpointChangeRequest` the
/// CNI fills.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct EndpointChangeRequest {
    #[serde(rename = "container-id", default)]
    pub container_id: String,
    #[serde(
        rename = "container-interface-name",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub container_interface_name: String,
    #[serde(
        rename = "k8s-pod-name",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub k8s_pod_name: String,
    #[serde(
        rename = "k8s-namespace",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub k8s_namespace: String,
    #[serde(rename = "k8s-uid", default, skip_serializing_if = "String::is_empty")]
    pub k8s_uid: String,
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub addressing: AddressPair,
    #[serde(
        rename = "interface-name",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub interface_name: String,
    #[serde(rename = "interface-index", default, skip_serializing_if = "is_zero")]
    pub interface_index: u32,
    #[serde(
        rename = "container-netns-path",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub container_netns_path: String,
    #[serde(rename = "sync-build-endpoint", default)]
    pub sync_build_endpoint: bool,
    /// Cilium's `datapath-configuration`; `external-ipam` in delegated-plugin mode.
    #[serde(rename = "datapath-configuration", default)]
    pub datapath_configuration: DatapathConfiguration,
    /// podnet: the plugin's phase timings (phase → seconds, `total` included) up
    /// to sending this request, so ADD needs no report request of its own. The
    /// daemon adds `endpoint-registration` (its handling of this request, journal
    /// commit included) to them and to `total`, and records them once the
    /// endpoint is committed.
    #[serde(
        rename = "podnet-phases",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub podnet_phases: BTreeMap<String, f64>,
}

/// Cilium's `EndpointDatapathConfiguration` (the part the CNI sets).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DatapathConfiguration {
    #[serde(rename = "external-ipam", default, skip_serializing_if = "is_false")]
    pub external_ipam: bool,
}

/// `DELETE /v1/endpoint` body: Cilium's `EndpointBatchDeleteRequest`. podnet adds the
/// optional interface name, so one attachment of a multi-interface pod can go alone,
/// and the host links the daemon deletes before it releases the addresses (the
/// plugin's DEL then returns without waiting for the kernel's link teardown).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct EndpointBatchDeleteRequest {
    #[serde(rename = "container-id", default)]
    pub container_id: String,
    #[serde(
        rename = "container-interface-name",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub container_interface_name: String,
    #[serde(
        rename = "teardown-links",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub teardown_links: Vec<LinkRef>,
    /// podnet: the plugin's phase timings up to sending this request, so a DEL
    /// needs no report request of its own. The daemon adds `daemon-release` (its
    /// handling of this request) to them and to `total`.
    #[serde(
        rename = "podnet-phases",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub podnet_phases: BTreeMap<String, f64>,
}

/// podnet: a link by name and index (the index guards against a reused name).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LinkRef {
    pub name: String,
    pub index: u32,
}

/// podnet's view of one endpoint (`GET /v1/endpoint/{id}`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct EndpointView {
    #[serde(rename = "container-id")]
    pub container_id: String,
    #[serde(rename = "container-interface-name")]
    pub container_interface_name: String,
    #[serde(rename = "interface-name")]
    pub interface_name: String,
    #[serde(default)]
    pub owner: String,
    #[serde(default)]
    pub addressing: AddressPair,
    #[serde(default)]
    pub restored: bool,
}

/// One attachment in a GC request (`cni.dev/valid-attachments`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct AttachmentRef {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
}

/// podnet: `POST /v1/cni/gc` body: release every allocation of `network` whose
/// attachment is not listed.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GcRequest {
    pub network: String,
    #[serde(rename = "valid-attachments")]
    pub valid_attachments: Vec<AttachmentRef>,
}

/// podnet: `POST /v1/cni/gc` answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GcResponse {
    /// Addresses released, as `ip (owner)`.
    pub released: Vec<String>,
}

/// `GET /v1/healthz`: the parts of Cilium's `StatusResponse` podnet fills.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StatusResponse {
    pub cilium: StatusElement,
    pub ipam: IpamStatus,
    /// Cilium's `bandwidth-manager` part: there when the option is on.
    #[serde(
        rename = "bandwidth-manager",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bandwidth_manager: Option<BandwidthManager>,
}

/// Cilium's `Status`: `state` is `Ok`, `Warning`, `Failure` or `Disabled`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StatusElement {
    pub state: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub msg: String,
}

/// Cilium's `IPAMStatus`, plus podnet's per-range figures.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct IpamStatus {
    /// ip (or `pool/ip` outside the default pool) → owner.
    #[serde(default)]
    pub allocations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<Vec<String>>,
    #[serde(default)]
    pub status: String,
    /// podnet: one entry per node range.
    #[serde(default)]
    pub ranges: Vec<RangeStatus>,
    /// podnet: the IPAM mode.
    #[serde(default)]
    pub mode: String,
    /// podnet: the node's name.
    #[serde(rename = "node-name", default)]
    pub node_name: String,
    /// podnet, multi-pool: the pool of a pod that names none
    /// (`ipam-default-ip-pool`); empty in the other modes.
    #[serde(
        rename = "default-pool",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub default_pool: String,
    /// podnet: released addresses that are not handed out yet (ip → former owner).
    #[serde(default)]
    pub cooling: BTreeMap<String, String>,
    /// podnet: what the last start restored and reconciled.
    #[serde(default)]
    pub restore: RestoreStatus,
    /// podnet: the datapath in use (`veth`).
    #[serde(default)]
    pub datapath: String,
    /// podnet: the journal file and its size.
    #[serde(default)]
    pub journal: String,
    #[serde(rename = "journal-bytes", default)]
    pub journal_bytes: u64,
    /// podnet: why the journal cannot commit, while it cannot (empty when it works).
    #[serde(
        rename = "journal-error",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub journal_error: String,
    /// podnet: where the node resource comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendStatus>,
    /// podnet, cluster-pool: each of the node's CIDRs, what the agent says of it
    /// (`status.ipam.pod-cidrs`) and why.
    #[serde(rename = "pod-cidrs", default, skip_serializing_if = "Vec::is_empty")]
    pub pod_cidrs: Vec<PodCidrLine>,
    /// podnet: the cross-node datapath (tunnel or routes, masquerade), when on.
    #[serde(
        rename = "cross-node",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub cross_node: Option<CrossNodeStatus>,
    /// podnet: whether the configuration fits the node (the Kubernetes backend
    /// only, once it read the node's facts).
    #[serde(
        rename = "config-check",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub config_check: Option<ConfigCheckStatus>,
    /// podnet: the leak check (the Kubernetes backend only).
    #[serde(
        rename = "leak-check",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub leak_check: Option<LeakCheckStatus>,
    /// podnet: NetworkPolicy enforcement (`--enable-policy default` on the
    /// Kubernetes backend).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyStatus>,
    /// podnet: L2 announcements (None: they do not run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l2: Option<L2Status>,
    /// podnet: DELs waiting in the on-disk queue.
    #[serde(rename = "queue-depth", default)]
    pub queue_depth: u64,
    /// podnet: queue entries the daemon could not read, set aside as `*.bad`.
    #[serde(rename = "queue-unreadable", default)]
    pub queue_unreadable: u64,
    /// podnet: the paths of (the first few of) those entries.
    #[serde(rename = "queue-unreadable-files", default)]
    pub queue_unreadable_files: Vec<String>,
}

/// podnet: the node backend: which (`embedded`, `file`, `kubernetes`), where it
/// reads from, and whether each of its watches has synced.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct BackendStatus {
    pub kind: String,
    pub location: String,
    #[serde(default)]
    pub watches: BTreeMap<String, bool>,
    /// What the backend waits for (a CRD that is missing, ...); empty: nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<String>,
}

/// podnet: the daemon's families against its node's addresses and the cluster's
/// Service range (`daemon::node_check`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ConfigCheckStatus {
    /// No error: the node hands out addresses.
    pub fits: bool,
    /// The InternalIPs the node's Node lists.
    #[serde(rename = "internal-ips", default)]
    pub internal_ips: Vec<String>,
    /// The cluster's Service range (every ServiceCIDR's CIDRs).
    #[serde(rename = "service-cidrs", default)]
    pub service_cidrs: Vec<String>,
    /// Why the Service range is not known (empty when it is).
    #[serde(
        rename = "service-range-unknown",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub service_range_unknown: String,
    /// Errors first, then warnings.
    #[serde(default)]
    pub findings: Vec<ConfigFinding>,
}

/// podnet: one way the configuration does not fit the node.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ConfigFinding {
    /// `error` (no address until it is fixed) or `warning`.
    pub severity: String,
    /// The option to change first (`enable-ipv6`).
    pub option: String,
    /// One CamelCase word (`NodeWithoutIPv6`), as in the CiliumNode's condition.
    pub reason: String,
    pub message: String,
}

/// podnet: the cross-node datapath: its mode, the remote nodes it knows and
/// what could not be installed.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CrossNodeStatus {
    /// `tunnel (vxlan, port 8472, device podnet_vxlan); masquerade IPv4 ...`.
    pub mode: String,
    /// The node list has been read and applied at least once.
    #[serde(default)]
    pub synced: bool,
    /// The tunnel's local address (empty before this node's InternalIP is known).
    #[serde(
        rename = "tunnel-local",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub tunnel_local: String,
    /// Routes to other nodes' CIDRs podnet keeps.
    #[serde(default)]
    pub routes: usize,
    #[serde(rename = "remote-nodes", default)]
    pub remote_nodes: Vec<RemoteNodeStatus>,
    /// What the last pass could not do (empty when all is in place).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

/// podnet: one remote node as the cross-node datapath sees it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RemoteNodeStatus {
    pub name: String,
    #[serde(rename = "internal-ip", default)]
    pub internal_ip: String,
    #[serde(default)]
    pub cidrs: Vec<String>,
    /// `tunnel to <ip>`, `route via <ip>`, `routed by the network`, or why not.
    pub path: String,
}

/// podnet: what the daemon's start found in the journal and the kernel, and did.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RestoreStatus {
    /// Allocations restored from the journal.
    pub restored: usize,
    /// Pending allocations whose expiration passed while the daemon was down.
    pub expired: usize,
    /// Cooling addresses whose cooldown ended while the daemon was down.
    #[serde(rename = "cooled-down")]
    pub cooled_down: usize,
    /// DELs from the on-disk queue, replayed at start (queued while the daemon was
    /// down) or while serving (queued while the journal could not commit).
    #[serde(rename = "queued-deletes")]
    pub queued_deletes: usize,
    /// Allocations outside the node's current ranges (kept, never handed out).
    #[serde(rename = "outside-ranges", default)]
    pub outside_ranges: Vec<String>,
    /// Bound allocations released because their host link was gone.
    #[serde(rename = "released-link-gone", default)]
    pub released_link_gone: Vec<String>,
    /// Host links removed because no allocation accounted for them.
    #[serde(rename = "orphan-links-removed", default)]
    pub orphan_links_removed: Vec<String>,
    /// Addresses adopted from the kernel: host links the journal did not know
    /// (a new, lost or rebuilt journal, or one older than the link).
    #[serde(rename = "adopted-from-kernel", default)]
    pub adopted_from_kernel: Vec<String>,
    /// Why the restore adopted from the kernel, when it did.
    #[serde(
        rename = "adopted-because",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub adopted_because: String,
    /// Host links podnet could not account for and left alone (not provably made
    /// under this journal, and no address of theirs could be adopted).
    #[serde(rename = "unaccounted-links-kept", default)]
    pub unaccounted_links_kept: Vec<String>,
}

/// podnet: fill of one node range.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RangeStatus {
    pub family: String,
    pub cidr: String,
    /// Addresses in use, infrastructure (router, health, ingress) included.
    pub used: u64,
    /// Addresses that can be handed out at all (network/broadcast excluded).
    pub usable: u64,
    /// Of `used`, addresses released recently and still cooling down.
    #[serde(default)]
    pub cooling: u64,
    /// The pool (`default` in the host-scope modes).
    #[serde(default)]
    pub pool: String,
    /// Multi-pool: the operator can still add blocks to this pool.
    #[serde(rename = "can-grow", default)]
    pub can_grow: bool,
}

impl RangeStatus {
    /// True when no address can be handed out and no more can come.
    pub fn is_exhausted(&self) -> bool {
        self.used >= self.usable && !self.can_grow
    }
}

/// A range's fill as the status spells it.
impl From<&RangeFill> for RangeStatus {
    fn from(r: &RangeFill) -> RangeStatus {
        RangeStatus {
            family: r.family.as_str().into(),
            cidr: r.cidr.clone(),
            used: r.used,
            usable: r.usable,
            cooling: r.cooling,
            pool: r.pool.clone(),
            can_grow: r.can_grow,
        }
    }
}

/// One of the node's cluster-pool CIDRs in status.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PodCidrLine {
    pub cidr: String,
    /// `in-use`, `depleted`, `released` (empty: not judged yet).
    #[serde(default)]
    pub status: String,
    /// The node's first CIDR of its family (never given back).
    #[serde(default)]
    pub first: bool,
    #[serde(default)]
    pub used: u64,
    #[serde(default)]
    pub usable: u64,
    /// Why it has this status, in words.
    #[serde(default)]
    pub why: String,
}

/// podnet: `POST /v1/cni/report`, sent by the plugin at the end of ADD and DEL:
/// its phase timings and, for a failure, the reason and message (kept for
/// `podnet explain`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CniReport {
    pub verb: String,
    #[serde(rename = "container-id", default)]
    pub container_id: String,
    #[serde(default)]
    pub ifname: String,
    #[serde(default)]
    pub owner: String,
    /// Phase name → seconds.
    #[serde(default)]
    pub phases: BTreeMap<String, f64>,
    /// Short machine reason of a failure (`range-full`, `datapath`, ...).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    /// A successful ADD whose endpoint the daemon journaled pending: the expiration
    /// UUIDs of the addresses, which the daemon binds if they are still pending for
    /// this attachment (it refuses the report otherwise).
    #[serde(
        rename = "wired-expiration-uuids",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub wired_expiration_uuids: Vec<String>,
}

/// podnet: one remembered failure.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FailureRecord {
    #[serde(rename = "at-ms")]
    pub at_ms: u64,
    pub verb: String,
    #[serde(default)]
    pub owner: String,
    #[serde(rename = "container-id", default)]
    pub container_id: String,
    #[serde(default)]
    pub ifname: String,
    pub reason: String,
    pub message: String,
    /// What to do about it.
    #[serde(default)]
    pub hint: String,
}

/// podnet: `GET /v1/explain?q=<pod|ip|container-id>`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ExplainResponse {
    pub query: String,
    /// The addresses that match, with why each is where it is.
    #[serde(default)]
    pub addresses: Vec<AddressExplanation>,
    /// Recent failures that match.
    #[serde(default)]
    pub failures: Vec<FailureRecord>,
    /// A one-paragraph answer.
    pub summary: String,
    /// The matching pods' host links whose packets the source check dropped (a
    /// source address the pod does not own) within the last hour.
    #[serde(
        rename = "spoofed-traffic",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub spoofed_traffic: Vec<SpoofedTraffic>,
    /// What the last leak check found for the matching addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leaks: Vec<LeakFinding>,
    /// What NetworkPolicy means for the matching pods of this node (empty when
    /// the policy loop does not run or has written no table yet).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policy: Vec<PodPolicy>,
    /// Which node answers ARP or NDP for the address asked about, and why the
    /// others do not (when L2 announcements run and it is announced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l2: Option<L2Explanation>,
}

/// podnet: one announced address in `podnet explain`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct L2Explanation {
    pub address: String,
    /// `load-balancer` or `external`.
    pub kind: String,
    /// `namespace/name` of each Service it belongs to.
    pub services: Vec<String>,
    /// The node that answers (None: none may).
    #[serde(default)]
    pub answerer: Option<String>,
    /// Every node in the address's order, with why it does or does not answer.
    pub candidates: Vec<L2Candidate>,
}

/// podnet: one node's standing for an announced address.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct L2Candidate {
    pub node: String,
    /// `answers`, `standby`, `not-selected`, `not-live`, `no-ready-endpoint`.
    pub standing: String,
    /// The standing as a sentence.
    pub why: String,
    /// The policy that selects it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
}

/// podnet: what NetworkPolicy and ClusterNetworkPolicy mean for one local pod
/// (`podnet explain`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PodPolicy {
    /// `namespace/name`.
    pub pod: String,
    pub ingress: DirectionPolicy,
    pub egress: DirectionPolicy,
    /// False when policies select it but its host link is not podnet's.
    #[serde(default)]
    pub enforced: bool,
}

/// podnet: one direction of a pod's policy.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DirectionPolicy {
    /// Whether what no policy allows is dropped.
    #[serde(default)]
    pub isolated: bool,
    /// The Admin tier's ClusterNetworkPolicies with rules for this direction
    /// whose subject the pod is, in the order they decide.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub admin: Vec<ClusterPolicyRules>,
    /// The policies that select the pod for this direction.
    #[serde(default)]
    pub policies: Vec<PolicyAllows>,
    /// The Baseline tier's, as `admin` (they decide only where no
    /// NetworkPolicy isolates the pod).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub baseline: Vec<ClusterPolicyRules>,
    /// One sentence: the tiers in order, open or isolated and by what.
    #[serde(default)]
    pub summary: String,
}

/// podnet: a ClusterNetworkPolicy whose subject a pod is, and its rules of a
/// direction.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ClusterPolicyRules {
    pub policy: String,
    #[serde(default)]
    pub priority: u16,
    /// Each rule as text, in the order written: `rule 0 (name): Deny from
    /// pods app=db of every namespace on TCP 5432`.
    #[serde(default)]
    pub rules: Vec<String>,
}

/// podnet: a policy that selects a pod, and what its rules allow.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PolicyAllows {
    /// `namespace/name`.
    pub policy: String,
    /// Each rule as text (`from pods role=client of default on TCP 80`);
    /// `nothing` when the policy has no rule for the direction.
    #[serde(default)]
    pub allows: Vec<String>,
}

/// podnet: the NetworkPolicy loop's last write (`podnet status`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PolicyStatus {
    /// Whether every watch (Pods, Namespaces, NetworkPolicies) has listed; no
    /// table is written before.
    #[serde(default)]
    pub synced: bool,
    /// Whether the table in the kernel holds the last compiled state (false
    /// before the first write and after a failed one).
    #[serde(rename = "table-written", default)]
    pub table_written: bool,
    /// NetworkPolicies seen.
    #[serde(default)]
    pub policies: u64,
    /// Local pods with a chain in the table.
    #[serde(rename = "pods-enforced", default)]
    pub pods_enforced: u64,
    /// Each problem of the policies (NetworkPolicies and
    /// ClusterNetworkPolicies): the policy, the field and why.
    #[serde(default)]
    pub problems: Vec<String>,
    /// ClusterNetworkPolicy: the version watched and how many, or what is
    /// awaited (None: `--enable-cluster-network-policy` is off).
    #[serde(
        rename = "cluster-policies",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub cluster_policies: Option<String>,
    /// `--policy-audit-mode`: what a policy would drop passes, reported as `audit`.
    #[serde(rename = "audit-mode", default)]
    pub audit_mode: bool,
}

/// podnet: one packet a policy verdict was logged for, a line of
/// `GET /v1/observe` (`podnet observe`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ObservedVerdict {
    /// When the packet was logged, RFC 3339.
    pub time: String,
    /// The source pod's `namespace/name`, or its address when not a known pod.
    pub source: String,
    pub destination: String,
    /// `TCP`, `UDP`, `SCTP`, `ICMP` or `IP protocol N`.
    pub protocol: String,
    /// The destination port (TCP, UDP, SCTP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// `ingress` or `egress`, seen from the pod whose chain decided.
    pub direction: String,
    /// `denied` or `audit` (would be denied; `--policy-audit-mode`).
    pub verdict: String,
    /// What decided: the NetworkPolicies whose default deny it is, or a
    /// ClusterNetworkPolicy Deny: `ClusterNetworkPolicy <name> (<tier> tier,
    /// <direction> rule <index> "<rule name>")`.
    pub policy: String,
}

/// podnet: L2 announcements on this node (`podnet status`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct L2Status {
    /// Whether every watch has listed and the start grace of the heartbeats
    /// is over (nothing is answered before).
    #[serde(default)]
    pub settled: bool,
    /// What it still waits for, when not settled.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub waiting: String,
    /// The nodes heard from lately (this one included), and every node.
    #[serde(rename = "live-nodes", default)]
    pub live_nodes: Vec<String>,
    #[serde(default)]
    pub nodes: u64,
    /// The UDP port of the heartbeats.
    #[serde(rename = "heartbeat-port", default)]
    pub heartbeat_port: u16,
    /// The addresses this node answers for.
    #[serde(default)]
    pub announced: Vec<L2Announcement>,
    /// Addresses announced in the cluster (by any node).
    #[serde(rename = "cluster-addresses", default)]
    pub cluster_addresses: u64,
    /// What is wrong: a policy's field, a shared address, an address outside
    /// the interface's subnets.
    #[serde(default)]
    pub problems: Vec<String>,
}

/// podnet: one address this node answers for.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct L2Announcement {
    pub address: String,
    pub services: Vec<String>,
    pub interfaces: Vec<String>,
    pub policy: String,
}

/// podnet: the leak check's settings and its last result (`podnet status`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LeakCheckStatus {
    /// `--ipam-leak-check-interval` in seconds (0: only on demand).
    #[serde(rename = "interval-s")]
    pub interval_s: u64,
    /// `--ipam-leak-grace` in seconds.
    #[serde(rename = "grace-s")]
    pub grace_s: u64,
    /// `--ipam-release-leaked-after` in seconds; None: leaks are only reported.
    #[serde(
        rename = "release-after-s",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub release_after_s: Option<u64>,
    /// When the last check that listed the Pods ran (ms since the epoch).
    #[serde(
        rename = "last-check-ms",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub last_check_ms: Option<u64>,
    /// The pods' allocations and the Pods that check compared.
    #[serde(default)]
    pub allocations: u64,
    #[serde(default)]
    pub pods: u64,
    /// Every allocation whose pod is gone, leak or not, from that check.
    #[serde(default)]
    pub findings: Vec<LeakFinding>,
    /// Leaked allocations released since the daemon started.
    #[serde(default)]
    pub released: u64,
    /// Why the last attempt made no check (the API server could not list the
    /// Pods, the host links could not be read); empty when it did.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// podnet: one allocation whose pod is gone, with the evidence, and for a leak
/// since when it has been one and when it is released.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LeakFinding {
    #[serde(flatten)]
    pub finding: crate::ipam::leaks::Finding,
    /// A leak in every check since (ms since the epoch).
    #[serde(
        rename = "leaked-since-ms",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub leaked_since_ms: Option<u64>,
    /// When it is released, if it stays a leak (ms since the epoch).
    #[serde(
        rename = "release-at-ms",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub release_at_ms: Option<u64>,
}

impl LeakFinding {
    /// The finding in a sentence: the evidence, and for a leak since when it has
    /// been one and when it is released.
    pub fn sentence(&self) -> String {
        let mut s = self.finding.to_string();
        if let Some(since) = self.leaked_since_ms {
            s.push_str(&format!("; a leak in every check since {}", time_of(since)));
            match self.release_at_ms {
                Some(at) => s.push_str(&format!(", released at {} if it stays one", time_of(at))),
                None => s.push_str(", never released (--ipam-release-leaked-after 0)"),
            }
        }
        s
    }
}

/// A time in ms since the epoch, as RFC 3339.
pub fn time_of(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| k8s_openapi::jiff::Timestamp::from_millisecond(ms).ok())
        .map(|t| t.to_string())
        .unwrap_or_else(|| format!("{ms} ms after the epoch"))
}

/// podnet: packets the source check dropped on one host link: the pod sent with a
/// source address it does not own.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SpoofedTraffic {
    #[serde(rename = "host-link")]
    pub host_link: String,
    pub packets: u64,
    pub bytes: u64,
    /// Seconds until the evidence is forgotten, unless more packets are dropped.
    #[serde(rename = "expires-in-s", default)]
    pub expires_in_s: u64,
}

/// podnet: why one address is allocated (or cooling).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct AddressExplanation {
    pub ip: String,
    pub pool: String,
    pub owner: String,
    /// `pending`, `bound`, `infra` or `cooling`.
    pub state: String,
    #[serde(rename = "container-id", default)]
    pub container_id: String,
    #[serde(default)]
    pub ifname: String,
    #[serde(default)]
    pub network: String,
    /// The rule that chose the range (the pool-selection step in multi-pool).
    pub rule: String,
    /// The node range the address comes from.
    pub range: String,
    #[serde(rename = "allocated-at-ms")]
    pub allocated_at_ms: u64,
    /// Pending: when it expires; cooling: when it is free again.
    #[serde(rename = "until-ms", default)]
    pub until_ms: u64,
    #[serde(default)]
    pub restored: bool,
    /// The host-side link the attachment has.
    #[serde(rename = "host-link", default)]
    pub host_link: String,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipam_response_uses_cilium_field_names() {
        let r = IpamResponse {
            address: AddressPair {
                ipv4: "10.0.1.23".into(),
                ipv4_pool_name: "default".into(),
                ..Default::default()
            },
            ipv4: Some(IpamAddressResponse {
                ip: "10.0.1.23".into(),
                expiration_uuid: "u".into(),
                ..Default::default()
            }),
            ipv6: None,
            host_addressing: NodeAddressing {
                ipv4: Some(NodeAddressingElement {
                    enabled: true,
                    ip: "10.0.1.1".into(),
                    alloc_range: "10.0.1.0/24".into(),
                }),
                ipv6: None,
            },
            journal_mark: String::new(),
            podnet_config: None,
            endpoint_pending: false,
        };
        let v = serde_json::to_value(&r).unwrap();
        assert!(v.get("journal-mark").is_none());
        assert!(v.get("podnet-config").is_none());
        assert_eq!(v["address"]["ipv4-pool-name"], "default");
        assert_eq!(v["ipv4"]["expiration-uuid"], "u");
        assert!(v["ipv4"]["cidrs"].is_null());
        assert!(v["ipv4"].get("gateway").is_none());
        assert_eq!(v["host-addressing"]["ipv4"]["alloc-range"], "10.0.1.0/24");
        assert!(v.get("ipv6").is_none());
        let back: IpamResponse = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn podnet_additions_are_optional_both_ways() {
        // What a Cilium agent answers (no podnet fields) parses, and the podnet
        // fields read as absent.
        let cilium = serde_json::json!({
            "address": {"ipv4": "10.0.1.23", "ipv4-expiration-uuid": "u"},
            "ipv4": {"ip": "10.0.1.23", "cidrs": null, "expiration-uuid": "u"},
            "host-addressing": {"ipv4": {"enabled": true, "ip": "10.0.1.1"}},
        });
        let r: IpamResponse = serde_json::from_value(cilium).unwrap();
        assert_eq!((r.podnet_config, r.journal_mark.as_str()), (None, ""));
        // podnet's configuration travels as /v1/config's `status`.
        let cfg = DaemonConfigurationStatus {
            ipam_mode: "cluster-pool".into(),
            device_mtu: 1450,
            route_mtu: 1450,
            datapath_mode: "veth".into(),
            ..Default::default()
        };
        let r = IpamResponse {
            podnet_config: Some(cfg.clone()),
            ..Default::default()
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["podnet-config"]["ipam-mode"], "cluster-pool");
        assert_eq!(v["podnet-config"]["deviceMTU"], 1450);
        let back: IpamResponse = serde_json::from_value(v).unwrap();
        assert_eq!(back.podnet_config, Some(cfg));
        // The endpoint request of a Cilium client has no phases, and sends none.
        let ep: EndpointChangeRequest = serde_json::from_value(serde_json::json!({
            "container-id": "c1", "state": "waiting-for-identity",
            "addressing": {"ipv4": "10.0.1.23"}, "sync-build-endpoint": true,
        }))
        .unwrap();
        assert!(ep.podnet_phases.is_empty());
        assert!(
            serde_json::to_value(&ep)
                .unwrap()
                .get("podnet-phases")
                .is_none()
        );
    }

    #[test]
    fn range_exhaustion() {
        let r = RangeStatus {
            family: "ipv4".into(),
            cidr: "10.0.0.0/30".into(),
            used: 2,
            usable: 2,
            cooling: 1,
            pool: "default".into(),
            can_grow: false,
        };
        assert!(r.is_exhausted());
    }
}
