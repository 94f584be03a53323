//! The daemon's options resolved once into what they mean: the IPAM mode, routing
//! and datapath modes as enums, the enabled families, the cluster pool, the node's
//! given pod CIDRs (kubernetes mode), the multi-pool settings and the fixed router
//! addresses, with Cilium's start-up checks and texts. `podnet daemon` starts from a
//! [`DaemonConfig`] and `podnet lint` checks one, so both refuse the same options
//! with the same words. Nothing here touches the kernel or the disk.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;

use ipnet::IpNet;

use super::crossnode::settings::{CrossNodeConfig, RoutingMode, TunnelProtocol};
use super::options::DaemonOptions;
use crate::ipam::Family;
use crate::ipam::cidr_depletion::{DepletionRules, ThresholdError};
use crate::ipam::clusterpool::{
    ClusterPoolConfig, ClusterPoolError, OPT_IPV4_CIDR, cidr_option, parse_pool_list,
    parse_pool_list_lenient,
};
use crate::ipam::multipool::needed_ip_ceil;
use crate::ipam::pool_options::{PoolOptionError, parse_auto_create_pools, parse_pre_allocation};
use crate::ipam::pooldef::PoolDef;
use crate::resources::{PoolDemand, RequestedPool};

/// Options that do not make a configuration: each message names the option and
/// says what to use instead (the words `podnet lint` shows too).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// `cluster-pool-depletion-threshold` out of range.
    #[error(transparent)]
    DepletionThreshold(#[from] ThresholdError),
    #[error(
        "ipam mode {0:?} is not supported by this build: use cluster-pool (default), kubernetes, multi-pool, crd, azure, alibabacloud, eni or delegated-plugin"
    )]
    UnknownIpamMode(String),
    #[error("--datapath-mode {0:?} is not one of veth, netkit, netkit-l2, auto")]
    UnknownDatapathMode(String),
    #[error("--routing-mode {0:?} is not one of native, tunnel")]
    UnknownRoutingMode(String),
    #[error("--tunnel-protocol {0:?} is not one of vxlan, geneve")]
    UnknownTunnelProtocol(String),
    #[error(
        "--underlay-protocol {0:?} is not one of ipv4, ipv6 (the IP family of the tunnel's outer packets: the nodes' InternalIPs of that family are the tunnel endpoints)"
    )]
    UnknownUnderlayProtocol(String),
    #[error(
        "ipam {0} needs routing-mode=native: its pod addresses are routed by the cloud network, and a tunnel would bypass it"
    )]
    TunnelUnderCloudIpam(IpamMode),
    #[error(
        "--routing-mode tunnel connects the nodes of a cluster from their CiliumNodes: it needs the Kubernetes backend (--k8s-kubeconfig-path, or in a pod); the embedded backend is one node, use --routing-mode native"
    )]
    TunnelWithoutKubernetes,
    #[error(
        "ipam {0} needs --node-resource FILE: the CiliumNode manifest the external IPAM writes for this node"
    )]
    NodeResourceMissing(IpamMode),
    #[error(transparent)]
    ClusterPool(#[from] ClusterPoolError),
    /// `--ipv4-range`, `--ipv6-range`, `--pod-cidrs`: `option` names the flag.
    #[error("{option} {value:?}: {source}")]
    PodCidr {
        option: String,
        value: String,
        #[source]
        source: ipnet::AddrParseError,
    },
    #[error("Invalid ipam-multi-pool-pre-allocation flag value: {0}")]
    PreAllocation(#[source] PoolOptionError),
    #[error("auto-create-cilium-pod-ip-pools: {0}")]
    AutoCreatePools(#[source] PoolOptionError),
    #[error("--{option} {value:?} is not an IP address")]
    RouterNotIp { option: &'static str, value: String },
    #[error("--{option} {value:?} is not an {} address", .family.label())]
    RouterWrongFamily {
        option: &'static str,
        value: String,
        family: Family,
    },
    #[error("--{option} {value:?} is not a CIDR: {source}")]
    NativeRoutingNotCidr {
        option: &'static str,
        value: String,
        #[source]
        source: ipnet::AddrParseError,
    },
    #[error("--{option} {value:?} is not an {} CIDR", if *.v4 { "IPv4" } else { "IPv6" })]
    NativeRoutingWrongFamily {
        option: &'static str,
        value: String,
        v4: bool,
    },
    #[error("--node-labels: {0:?} is not key=value")]
    NodeLabel(String),
    #[error(
        "--l2-announcements-heartbeat-port 0: the agents' heartbeats need a port (default 4247)"
    )]
    HeartbeatPortZero,
    #[error("--enable-policy {0:?} is not one of default, always, never")]
    UnknownPolicyMode(String),
}

/// `--ipam`: who decides what the node owns, and how addresses are allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpamMode {
    ClusterPool,
    Kubernetes,
    MultiPool,
    Crd,
    Azure,
    AlibabaCloud,
    Eni,
    DelegatedPlugin,
}

impl IpamMode {
    /// Every mode, by its option value.
    pub const ALL: [IpamMode; 8] = [
        IpamMode::ClusterPool,
        IpamMode::Kubernetes,
        IpamMode::MultiPool,
        IpamMode::Crd,
        IpamMode::Azure,
        IpamMode::AlibabaCloud,
        IpamMode::Eni,
        IpamMode::DelegatedPlugin,
    ];

    /// The option value (Cilium's spelling, also what `/v1/config` reports).
    pub fn as_str(self) -> &'static str {
        match self {
            IpamMode::ClusterPool => "cluster-pool",
            IpamMode::Kubernetes => "kubernetes",
            IpamMode::MultiPool => "multi-pool",
            IpamMode::Crd => "crd",
            IpamMode::Azure => "azure",
            IpamMode::AlibabaCloud => "alibabacloud",
            IpamMode::Eni => "eni",
            IpamMode::DelegatedPlugin => "delegated-plugin",
        }
    }

    /// Parses `--ipam`.
    pub fn parse(s: &str) -> Result<IpamMode, ConfigError> {
        IpamMode::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| ConfigError::UnknownIpamMode(s.to_string()))
    }

    /// crd, azure, alibabacloud and eni: an external system writes the node's
    /// CiliumNode; podnet carves nothing.
    pub fn is_external(self) -> bool {
        matches!(
            self,
            IpamMode::Crd | IpamMode::Azure | IpamMode::AlibabaCloud | IpamMode::Eni
        )
    }
}

impl fmt::Display for IpamMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `--datapath-mode`: the pod device type asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatapathMode {
    Veth,
    /// netkit in L3 mode.
    Netkit,
    NetkitL2,
    /// netkit where the kernel has it, else veth (decided at start).
    Auto,
}

impl DatapathMode {
    pub fn as_str(self) -> &'static str {
        match self {
            DatapathMode::Veth => "veth",
            DatapathMode::Netkit => "netkit",
            DatapathMode::NetkitL2 => "netkit-l2",
            DatapathMode::Auto => "auto",
        }
    }

    /// Parses `--datapath-mode`.
    pub fn parse(s: &str) -> Result<DatapathMode, ConfigError> {
        [
            DatapathMode::Veth,
            DatapathMode::Netkit,
            DatapathMode::NetkitL2,
            DatapathMode::Auto,
        ]
        .into_iter()
        .find(|m| m.as_str() == s)
        .ok_or_else(|| ConfigError::UnknownDatapathMode(s.to_string()))
    }
}

impl fmt::Display for DatapathMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Parses `--routing-mode`.
fn parse_routing_mode(s: &str) -> Result<RoutingMode, ConfigError> {
    RoutingMode::parse(s).ok_or_else(|| ConfigError::UnknownRoutingMode(s.to_string()))
}

/// Parses `--tunnel-protocol`.
fn parse_tunnel_protocol(s: &str) -> Result<TunnelProtocol, ConfigError> {
    match s {
        "vxlan" => Ok(TunnelProtocol::Vxlan),
        "geneve" => Ok(TunnelProtocol::Geneve),
        other => Err(ConfigError::UnknownTunnelProtocol(other.to_string())),
    }
}

/// Parses `--underlay-protocol` (Cilium's name and values, `ipv4` or `ipv6`): the
/// IP family of the tunnel's outer packets, so of the InternalIP each node's
/// tunnel endpoint is.
fn parse_underlay(s: &str) -> Result<Family, ConfigError> {
    match s {
        "ipv4" => Ok(Family::V4),
        "ipv6" => Ok(Family::V6),
        other => Err(ConfigError::UnknownUnderlayProtocol(other.to_string())),
    }
}

/// `--enable-l2-announcements`: the heartbeats' port, when on.
fn l2_announcements(opts: &DaemonOptions) -> Result<Option<u16>, ConfigError> {
    match (
        opts.enable_l2_announcements,
        opts.l2_announcements_heartbeat_port,
    ) {
        (false, _) => Ok(None),
        (true, 0) => Err(ConfigError::HeartbeatPortZero),
        (true, port) => Ok(Some(port)),
    }
}

/// `--enable-policy`: whether the agent enforces NetworkPolicy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyMode {
    /// On the pods some policy selects (Kubernetes' semantics).
    Default,
    /// On every pod, in both directions, selected or not (Cilium's
    /// `always`): only what policies allow passes.
    Always,
    /// Not at all: podnet's policy table is removed.
    Never,
}

impl PolicyMode {
    /// Parses `--enable-policy`.
    pub fn parse(s: &str) -> Result<PolicyMode, ConfigError> {
        match s {
            "default" => Ok(PolicyMode::Default),
            "never" => Ok(PolicyMode::Never),
            "always" => Ok(PolicyMode::Always),
            other => Err(ConfigError::UnknownPolicyMode(other.to_string())),
        }
    }
}

/// Where the node resource lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendKind {
    /// The daemon's own journal and manifest directories (one node).
    Embedded,
    /// The API server: `--k8s-kubeconfig-path`, or the in-cluster service account
    /// (None) when KUBERNETES_SERVICE_HOST is set.
    Kubernetes { kubeconfig: Option<PathBuf> },
}

/// Multi-pool settings.
#[derive(Debug, Clone)]
pub struct MultiPoolConfig {
    /// `ipam-default-ip-pool` (a CiliumNodeConfig may override it per node).
    pub default_pool: String,
    /// `ipam-multi-pool-pre-allocation`, pool → addresses per family.
    pub pre_allocation: BTreeMap<String, u64>,
    /// `only-masquerade-default-pool`.
    pub only_masquerade_default_pool: bool,
    /// `enable-cluster-pool-to-multi-pool-migration`.
    pub migrate_cluster_pool: bool,
    /// `auto-create-cilium-pod-ip-pools`.
    pub auto_create: Vec<PoolDef>,
}

impl MultiPoolConfig {
    /// On the Kubernetes backend, what the node asks for before its state exists,
    /// computed as the state will: each pre-allocated pool's pre-allocation, and the
    /// default pool's router (and health) addresses rounded up by its
    /// pre-allocation, per enabled family.
    pub fn initial_demand(&self, families: &[Family], health: bool) -> Vec<RequestedPool> {
        let mut pools = self.pre_allocation.clone();
        let infra = infra_addresses_per_family(health);
        let pre = self
            .pre_allocation
            .get(&self.default_pool)
            .copied()
            .unwrap_or(0);
        pools.insert(self.default_pool.clone(), needed_ip_ceil(infra, pre));
        pools
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(pool, n)| RequestedPool {
                pool,
                needed: PoolDemand {
                    ipv4_addrs: if families.contains(&Family::V4) { n } else { 0 },
                    ipv6_addrs: if families.contains(&Family::V6) { n } else { 0 },
                },
            })
            .collect()
    }
}

/// The addresses the node takes for itself in each family before any pod: the
/// router's, and the health endpoint's with `--enable-health-checking`.
pub fn infra_addresses_per_family(health_checking: bool) -> u64 {
    1 + u64::from(health_checking)
}

/// The daemon's options, resolved and checked.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub backend: BackendKind,
    pub ipam: IpamMode,
    pub routing: RoutingMode,
    pub datapath: DatapathMode,
    /// The enabled families, IPv6 first (allocation order).
    pub families: Vec<Family>,
    /// cluster-pool: the pool the node CIDR is carved from.
    pub cluster_pool: Option<ClusterPoolConfig>,
    /// cluster-pool on the Kubernetes backend: why the operator's pool options
    /// are refused, and the option to fix (None: they are not).
    pub cluster_pool_refused: Option<(&'static str, ClusterPoolError)>,
    /// kubernetes: the node's pod CIDRs (`--pod-cidrs`, `--ipv4-range`, `--ipv6-range`).
    pub pod_cidrs: Vec<IpNet>,
    pub multi_pool: Option<MultiPoolConfig>,
    /// Router addresses given by the operator (`local-router-ipv4/6`), not from IPAM.
    pub fixed_routers: BTreeMap<Family, IpAddr>,
    /// This node's labels (`--node-labels`), for CiliumNodeConfig selectors.
    pub node_labels: BTreeMap<String, String>,
    /// Routes, tunnel and masquerade towards other nodes and the outside.
    pub cross_node: CrossNodeConfig,
    /// `--enable-policy`.
    pub policy: PolicyMode,
    /// `--enable-cluster-network-policy`.
    pub cluster_network_policy: bool,
    /// `--policy-audit-mode`.
    pub policy_audit_mode: bool,
    /// `--enable-l2-announcements`: the heartbeats' UDP port (None: off).
    pub l2_announcements: Option<u16>,
    /// cluster-pool: when the node asks for another CIDR and gives one back.
    pub depletion: Option<DepletionRules>,
}

impl DaemonConfig {
    /// Resolves the options, with Cilium's start-up checks.
    pub fn resolve(opts: &DaemonOptions) -> Result<DaemonConfig, ConfigError> {
        let ipam = IpamMode::parse(&opts.ipam)?;
        let depletion = DepletionRules::new(
            opts.cluster_pool_depletion_threshold,
            opts.cluster_pool_cidr_release_delay,
        )?;
        let policy = PolicyMode::parse(&opts.enable_policy)?;
        let datapath = DatapathMode::parse(&opts.datapath_mode)?;
        let backend = match &opts.k8s_kubeconfig_path {
            Some(path) => BackendKind::Kubernetes {
                kubeconfig: Some(path.clone()),
            },
            None if std::env::var("KUBERNETES_SERVICE_HOST").is_ok_and(|h| !h.is_empty()) => {
                BackendKind::Kubernetes { kubeconfig: None }
            }
            None => BackendKind::Embedded,
        };
        let embedded = backend == BackendKind::Embedded;
        let routing = match &opts.routing_mode {
            Some(m) => parse_routing_mode(m)?,
            None if embedded || ipam.is_external() => RoutingMode::Native,
            None => RoutingMode::Tunnel,
        };
        if ipam.is_external() && ipam != IpamMode::Crd && routing == RoutingMode::Tunnel {
            return Err(ConfigError::TunnelUnderCloudIpam(ipam));
        }
        if embedded && routing == RoutingMode::Tunnel {
            return Err(ConfigError::TunnelWithoutKubernetes);
        }
        if embedded && ipam.is_external() && opts.node_resource.is_none() {
            return Err(ConfigError::NodeResourceMissing(ipam));
        }
        let families = [
            (opts.enable_ipv6, Family::V6),
            (opts.enable_ipv4, Family::V4),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .map(|(_, f)| f)
        .collect();
        let (cluster_pool, cluster_pool_refused) = match ipam {
            IpamMode::ClusterPool => {
                let (pool, refused) = cluster_pool(opts, embedded)?;
                (Some(pool), refused)
            }
            _ => (None, None),
        };
        Ok(DaemonConfig {
            backend,
            ipam,
            routing,
            datapath,
            families,
            cluster_pool,
            cluster_pool_refused,
            pod_cidrs: match ipam {
                IpamMode::Kubernetes => kubernetes_pod_cidrs(opts)?,
                _ => Vec::new(),
            },
            multi_pool: match ipam {
                IpamMode::MultiPool => Some(multi_pool(opts)?),
                _ => None,
            },
            fixed_routers: fixed_routers(opts, ipam)?,
            node_labels: parse_node_labels(&opts.node_labels)?,
            cross_node: cross_node(opts, routing, embedded)?,
            policy,
            cluster_network_policy: opts.enable_cluster_network_policy,
            policy_audit_mode: opts.policy_audit_mode,
            l2_announcements: l2_announcements(opts)?,
            depletion: (ipam == IpamMode::ClusterPool).then_some(depletion),
        })
    }
}

/// The cluster pool, checked as Cilium's operator does at start. The embedded
/// backend carves the node's CIDRs itself and refuses options that do not pass
/// (the agent does not start). With the Kubernetes backend they are the
/// operator's, which refuses them and runs on the pool in force, so the agent
/// starts whatever they say (an edit of the ConfigMap must not cost a
/// restarting node its CNI): a misfit mask ([`ClusterPoolConfig::mask_misfits`])
/// and the first refusal (kept beside the pool, which holds the entries that
/// parse) are warnings of its node check (`daemon::node_check`): in its log,
/// its CiliumNode's condition and `podnet status`.
#[allow(clippy::type_complexity)]
fn cluster_pool(
    opts: &DaemonOptions,
    embedded: bool,
) -> Result<(ClusterPoolConfig, Option<(&'static str, ClusterPoolError)>), ConfigError> {
    let mut refused = None;
    let mut list = |value: &Option<String>, enabled: bool, name: &'static str, default: &str| {
        let v = value.clone().unwrap_or_else(|| {
            if enabled {
                default.to_string()
            } else {
                String::new()
            }
        });
        if embedded {
            return parse_pool_list(name, &v);
        }
        let (entries, error) = parse_pool_list_lenient(name, &v);
        if let Some(e) = error {
            refused.get_or_insert((name, e));
        }
        Ok(entries)
    };
    let mut cfg = ClusterPoolConfig {
        enable_ipv4: opts.enable_ipv4,
        enable_ipv6: opts.enable_ipv6,
        ipv4_mask_size: opts.cluster_pool_ipv4_mask_size,
        ipv6_mask_size: opts.cluster_pool_ipv6_mask_size,
        ..ClusterPoolConfig::default()
    };
    let v4 = list(
        &opts.cluster_pool_ipv4_cidr,
        opts.enable_ipv4,
        "cluster-pool-ipv4-cidr",
        "10.0.0.0/8",
    )?;
    cfg.set_pool(Family::V4, &v4);
    let v6 = list(
        &opts.cluster_pool_ipv6_cidr,
        opts.enable_ipv6,
        "cluster-pool-ipv6-cidr",
        "fd00::/104",
    )?;
    cfg.set_pool(Family::V6, &v6);
    match embedded {
        true => cfg.validate()?,
        false => {
            if let Err(e) = cfg.validate_cidrs() {
                let option = refused_option(&e);
                refused.get_or_insert((option, e));
            }
        }
    }
    Ok((cfg, refused))
}

/// The pool option a refusal of the cluster pool's checks is about.
fn refused_option(error: &ClusterPoolError) -> &'static str {
    match error {
        ClusterPoolError::CidrRequired { family }
        | ClusterPoolError::CidrSetForDisabledFamily { family }
        | ClusterPoolError::NotFamily { family, .. }
        | ClusterPoolError::Collision { family, .. }
        | ClusterPoolError::Exhausted { family } => cidr_option(*family),
        ClusterPoolError::WrongFamily { expected, .. } => cidr_option(*expected),
        ClusterPoolError::AllocatorInit(m) => m.option(),
        _ => OPT_IPV4_CIDR,
    }
}

/// kubernetes mode: `--ipv4-range`/`--ipv6-range` (unless `auto`) and `--pod-cidrs`.
fn kubernetes_pod_cidrs(opts: &DaemonOptions) -> Result<Vec<IpNet>, ConfigError> {
    let mut cidrs: Vec<IpNet> = Vec::new();
    for (range, v4) in [(&opts.ipv4_range, true), (&opts.ipv6_range, false)] {
        if range != "auto" && !range.is_empty() {
            let c: IpNet = range.parse().map_err(|source| ConfigError::PodCidr {
                option: format!("--ipv{}-range", if v4 { 4 } else { 6 }),
                value: range.clone(),
                source,
            })?;
            cidrs.push(c);
        }
    }
    for c in opts
        .pod_cidrs
        .as_deref()
        .unwrap_or("")
        .split([' ', ','])
        .filter(|s| !s.is_empty())
    {
        let c: IpNet = c.parse().map_err(|source| ConfigError::PodCidr {
            option: "--pod-cidrs".to_string(),
            value: c.to_string(),
            source,
        })?;
        cidrs.push(c);
    }
    Ok(cidrs)
}

fn multi_pool(opts: &DaemonOptions) -> Result<MultiPoolConfig, ConfigError> {
    Ok(MultiPoolConfig {
        default_pool: opts.default_ip_pool.clone(),
        pre_allocation: parse_pre_allocation(
            &opts.multi_pool_pre_allocation,
            &opts.default_ip_pool,
        )
        .map_err(ConfigError::PreAllocation)?,
        only_masquerade_default_pool: opts.only_masquerade_default_pool,
        migrate_cluster_pool: opts.cluster_pool_migration,
        auto_create: parse_auto_create_pools(&opts.auto_create_pools)
            .map_err(ConfigError::AutoCreatePools)?,
    })
}

/// `--local-router-ipv4/6`; delegated-plugin mode defaults the IPv4 one to
/// 169.254.0.1 (the node answers ARP for it as a local address).
fn fixed_routers(
    opts: &DaemonOptions,
    ipam: IpamMode,
) -> Result<BTreeMap<Family, IpAddr>, ConfigError> {
    let mut out = BTreeMap::new();
    let delegated = ipam == IpamMode::DelegatedPlugin;
    for (value, family, on, name) in [
        (
            &opts.local_router_ipv4,
            Family::V4,
            opts.enable_ipv4,
            "local-router-ipv4",
        ),
        (
            &opts.local_router_ipv6,
            Family::V6,
            opts.enable_ipv6,
            "local-router-ipv6",
        ),
    ] {
        let value = if value.is_empty() && delegated && family == Family::V4 {
            "169.254.0.1"
        } else {
            value.as_str()
        };
        if value.is_empty() || !on {
            continue;
        }
        let ip: IpAddr = value.parse().map_err(|_| ConfigError::RouterNotIp {
            option: name,
            value: value.to_string(),
        })?;
        if Family::of_addr(&ip) != family {
            return Err(ConfigError::RouterWrongFamily {
                option: name,
                value: value.to_string(),
                family,
            });
        }
        out.insert(family, ip);
    }
    Ok(out)
}

/// The cross-node datapath's options. Masquerade is on by default with the
/// Kubernetes backend (Cilium's default) and off on the embedded one (a single
/// node's default changes nothing in its kernel).
fn cross_node(
    opts: &DaemonOptions,
    routing: RoutingMode,
    embedded: bool,
) -> Result<CrossNodeConfig, ConfigError> {
    let mut native_routing_cidrs = Vec::new();
    for (value, v4, name) in [
        (
            &opts.ipv4_native_routing_cidr,
            true,
            "ipv4-native-routing-cidr",
        ),
        (
            &opts.ipv6_native_routing_cidr,
            false,
            "ipv6-native-routing-cidr",
        ),
    ] {
        // podnet takes a list (Cilium one CIDR: cilium/cilium#29102).
        let entries = value
            .split(|c: char| c.is_whitespace() || c == ',')
            .filter(|e| !e.is_empty());
        for entry in entries {
            let c: IpNet = entry
                .parse()
                .map_err(|source| ConfigError::NativeRoutingNotCidr {
                    option: name,
                    value: entry.to_string(),
                    source,
                })?;
            if c.addr().is_ipv4() != v4 {
                return Err(ConfigError::NativeRoutingWrongFamily {
                    option: name,
                    value: entry.to_string(),
                    v4,
                });
            }
            native_routing_cidrs.push(c.trunc());
        }
    }
    Ok(CrossNodeConfig {
        routing,
        tunnel_protocol: parse_tunnel_protocol(&opts.tunnel_protocol)?,
        tunnel_port: match opts.tunnel_port {
            0 => 8472,
            p => p,
        },
        underlay: parse_underlay(&opts.underlay_protocol)?,
        auto_direct_node_routes: opts.auto_direct_node_routes,
        native_routing_cidrs,
        masquerade_v4: opts.enable_ipv4 && opts.enable_ipv4_masquerade.unwrap_or(!embedded),
        masquerade_v6: opts.enable_ipv6 && opts.enable_ipv6_masquerade.unwrap_or(!embedded),
    })
}

/// `k=v,k2=v2`.
fn parse_node_labels(s: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut out = BTreeMap::new();
    for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| ConfigError::NodeLabel(pair.to_string()))?;
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(out)
}

/// The options `args`, and their resolved configuration: for the tests of what
/// starts from both.
#[cfg(test)]
pub(super) fn resolved_options(args: &[&str]) -> (DaemonOptions, DaemonConfig) {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let opts = DaemonOptions::parse_with_config_dir(&args).unwrap();
    let config = DaemonConfig::resolve(&opts).unwrap();
    (opts, config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_initial_multi_pool_demand_is_what_the_state_will_ask() {
        let m = MultiPoolConfig {
            default_pool: "default".into(),
            pre_allocation: [("default".to_string(), 8), ("mars".to_string(), 4)]
                .into_iter()
                .collect(),
            only_masquerade_default_pool: false,
            migrate_cluster_pool: false,
            auto_create: Vec::new(),
        };
        let d = m.initial_demand(&[Family::V4], true);
        // Router + health = 2, rounded up by 8: 16 (neededIPCeil).
        assert_eq!(d[0].pool, "default");
        assert_eq!((d[0].needed.ipv4_addrs, d[0].needed.ipv6_addrs), (16, 0));
        assert_eq!((d[1].pool.as_str(), d[1].needed.ipv4_addrs), ("mars", 4));
        let none = MultiPoolConfig {
            pre_allocation: BTreeMap::new(),
            ..m
        };
        let d = none.initial_demand(&[Family::V6, Family::V4], false);
        assert_eq!(d.len(), 1);
        assert_eq!((d[0].needed.ipv4_addrs, d[0].needed.ipv6_addrs), (1, 1));
    }

    fn resolve(args: &[&str]) -> Result<DaemonConfig, Box<dyn std::error::Error>> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let opts = DaemonOptions::parse_with_config_dir(&args)?;
        Ok(DaemonConfig::resolve(&opts)?)
    }

    #[test]
    fn every_mode_round_trips_through_its_name() {
        for m in IpamMode::ALL {
            assert_eq!(IpamMode::parse(m.as_str()), Ok(m));
        }
        let e = IpamMode::parse("host-local").unwrap_err().to_string();
        assert!(e.contains("not supported by this build"), "{e}");
    }

    #[test]
    fn the_depletion_threshold_is_a_percentage_and_only_cluster_pool_judges() {
        let c = resolve(&[]).unwrap();
        let rules = c.depletion.expect("cluster-pool judges its CIDRs");
        assert_eq!(rules.threshold(), 10);
        assert_eq!(rules.release_delay_ms(), 600_000);
        let c = resolve(&[
            "--cluster-pool-depletion-threshold=100",
            "--cluster-pool-cidr-release-delay=30s",
        ])
        .unwrap();
        assert_eq!(c.depletion.map(|r| r.release_delay_ms()), Some(30_000));
        for bad in ["0", "101"] {
            let e = resolve(&[&format!("--cluster-pool-depletion-threshold={bad}")])
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(&format!(
                    "cluster-pool-depletion-threshold {bad}: must be a percentage"
                )),
                "{e}"
            );
        }
        let e = resolve(&["--cluster-pool-depletion-threshold=-1"]).unwrap_err();
        assert!(
            e.to_string().contains("cluster-pool-depletion-threshold"),
            "{e}"
        );
        assert!(
            resolve(&["--ipam", "kubernetes", "--pod-cidrs", "10.1.0.0/24"])
                .unwrap()
                .depletion
                .is_none()
        );
    }

    #[test]
    fn defaults_are_cluster_pool_ipv4_veth_native() {
        let c = resolve(&[]).unwrap();
        assert_eq!(c.ipam, IpamMode::ClusterPool);
        assert_eq!(c.routing, RoutingMode::Native);
        assert_eq!(c.datapath, DatapathMode::Veth);
        assert_eq!(c.families, vec![Family::V4]);
        let cp = c.cluster_pool.unwrap();
        assert_eq!(cp.ipv4_cidrs, vec!["10.0.0.0/8".parse::<IpNet>().unwrap()]);
        assert!(c.multi_pool.is_none());
    }

    #[test]
    fn l2_announcements_are_off_by_default_and_need_a_heartbeat_port() {
        assert_eq!(resolve(&[]).unwrap().l2_announcements, None);
        let on = resolve(&["--enable-l2-announcements"]).unwrap();
        assert_eq!(on.l2_announcements, Some(4247));
        let port = [
            "--enable-l2-announcements",
            "true",
            "--l2-announcements-heartbeat-port",
            "5000",
        ];
        assert_eq!(resolve(&port).unwrap().l2_announcements, Some(5000));
        let zero = [
            "--enable-l2-announcements",
            "--l2-announcements-heartbeat-port",
            "0",
        ];
        let e = resolve(&zero).unwrap_err().to_string();
        assert!(e.contains("heartbeats need a port"), "{e}");
    }

    #[test]
    fn policy_audit_mode_is_off_unless_asked() {
        assert!(!resolve(&[]).unwrap().policy_audit_mode);
        assert!(resolve(&["--policy-audit-mode"]).unwrap().policy_audit_mode);
        let off = resolve(&["--policy-audit-mode", "false"]).unwrap();
        assert!(!off.policy_audit_mode);
    }

    #[test]
    fn cluster_network_policy_is_off_unless_asked() {
        assert!(!resolve(&[]).unwrap().cluster_network_policy);
        let on = resolve(&["--enable-cluster-network-policy"]).unwrap();
        assert!(on.cluster_network_policy);
        let off = resolve(&["--enable-cluster-network-policy", "false"]).unwrap();
        assert!(!off.cluster_network_policy);
    }

    #[test]
    fn enable_policy_is_default_always_or_never() {
        assert_eq!(resolve(&[]).unwrap().policy, PolicyMode::Default);
        let never = resolve(&["--enable-policy", "never"]).unwrap();
        assert_eq!(never.policy, PolicyMode::Never);
        let always = resolve(&["--enable-policy", "always"]).unwrap();
        assert_eq!(always.policy, PolicyMode::Always);
        let e = resolve(&["--enable-policy", "sometimes"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("default, always, never"), "{e}");
    }

    #[test]
    fn families_are_ipv6_first() {
        let c = resolve(&["--enable-ipv6", "--cluster-pool-ipv6-cidr", "fd00::/104"]).unwrap();
        assert_eq!(c.families, vec![Family::V6, Family::V4]);
    }

    #[test]
    fn ciliums_start_up_checks() {
        let e = resolve(&[
            "--enable-ipv6=false",
            "--cluster-pool-ipv6-cidr",
            "fd00::/104",
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("must not be set if IPv6 is disabled"), "{e}");
        let e = resolve(&["--ipam", "eni", "--routing-mode", "tunnel"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("routing-mode=native"), "{e}");
        let e = resolve(&["--ipam", "crd"]).unwrap_err().to_string();
        assert!(e.contains("--node-resource"), "{e}");
        let e = resolve(&["--datapath-mode", "ebpf"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("not one of veth"), "{e}");
        let e = resolve(&["--routing-mode", "overlay"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("not one of native, tunnel"), "{e}");
    }

    const MISFIT_V6_MASK: [&str; 5] = [
        "--enable-ipv6",
        "--cluster-pool-ipv6-cidr",
        "fd00::/104",
        "--cluster-pool-ipv6-mask-size",
        "121",
    ];

    #[test]
    fn an_ipv6_mask_size_that_does_not_fit_the_pool_cidr_stops_the_embedded_agent_naming_both_options()
     {
        // The embedded backend carves the node's CIDR itself: it cannot start.
        let e = resolve(&MISFIT_V6_MASK).unwrap_err().to_string();
        assert_eq!(
            e,
            "unable to initialize IPv6 allocator: cluster-pool-ipv6-cidr fd00::/104 with \
             cluster-pool-ipv6-mask-size 121: New CIDR set failed; the node CIDR size is too \
             big; cluster-pool-ipv6-mask-size must be /104 to /120 for fd00::/104"
        );
        let e = resolve(&[
            "--enable-ipv6",
            "--cluster-pool-ipv6-cidr",
            "fd00::/104",
            "--cluster-pool-ipv6-mask-size",
            "100",
        ])
        .unwrap_err()
        .to_string();
        assert!(e.ends_with("it must be /104 or longer"), "{e}");
    }

    #[test]
    fn with_the_kubernetes_backend_a_misfit_mask_size_starts_the_agent_and_is_left_to_the_node_check()
     {
        // The operator carves the node CIDRs: the agent starts, and its node check
        // names the mask (daemon::node_check, Mismatch::MaskSizeMisfit).
        let args = [
            &["--k8s-kubeconfig-path", "/nonexistent/kubeconfig"][..],
            &MISFIT_V6_MASK,
        ]
        .concat();
        let c = resolve(&args).unwrap();
        let misfits = c.cluster_pool.unwrap().mask_misfits();
        assert_eq!(misfits.len(), 1, "{misfits:?}");
        assert_eq!(
            (misfits[0].option(), misfits[0].mask, misfits[0].fitting()),
            ("cluster-pool-ipv6-mask-size", 121, (104, 120))
        );
        // Every other pool error too: the operator's options, refused by it,
        // are a warning of the node check, with the entries that parse.
        let mut args = args.clone();
        args.extend(["--enable-ipv6=false"]);
        let c = resolve(&args).unwrap();
        let (option, e) = c.cluster_pool_refused.clone().unwrap();
        assert_eq!(option, "cluster-pool-ipv6-cidr");
        assert!(
            e.to_string()
                .contains("must not be set if IPv6 is disabled"),
            "{e}"
        );
        let args = [
            "--k8s-kubeconfig-path",
            "/nonexistent/kubeconfig",
            "--cluster-pool-ipv4-cidr",
            "10.244.0.0/16 10.250.0.0/16@x",
        ];
        let c = resolve(&args).unwrap();
        assert_eq!(
            c.cluster_pool.as_ref().unwrap().ipv4_cidrs,
            vec!["10.244.0.0/16".parse::<IpNet>().unwrap()]
        );
        let findings = crate::daemon::node_check::pool_findings(&c);
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert_eq!(
            (findings[0].option(), findings[0].reason()),
            ("cluster-pool-ipv4-cidr", "ClusterPoolOptionRefused")
        );
        assert!(findings[0].to_string().contains("10.250.0.0/16@x"));
        // The embedded backend carves the CIDRs itself: it refuses to start.
        let e = resolve(&args[2..]).unwrap_err().to_string();
        assert!(e.contains("10.250.0.0/16@x"), "{e}");
    }

    #[test]
    fn cross_node_defaults_leave_a_single_node_alone() {
        let c = resolve(&[]).unwrap().cross_node;
        assert_eq!(c.routing, RoutingMode::Native);
        assert!(!c.is_active(), "{c:?}");
        let e = resolve(&["--routing-mode", "tunnel"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs the Kubernetes backend"), "{e}");
        let c = resolve(&["--enable-ipv4-masquerade"]).unwrap().cross_node;
        assert!(c.masquerade_v4 && !c.masquerade_v6 && c.is_active());
    }

    #[test]
    fn the_kubernetes_backend_defaults_to_a_vxlan_tunnel_with_masquerade() {
        let kc = ["--k8s-kubeconfig-path", "/nonexistent/kubeconfig"];
        let c = resolve(&kc).unwrap().cross_node;
        assert_eq!(c.routing, RoutingMode::Tunnel);
        assert_eq!(
            (c.tunnel_protocol, c.tunnel_port, c.underlay),
            (TunnelProtocol::Vxlan, 8472, Family::V4)
        );
        assert!(c.masquerade_v4 && !c.masquerade_v6);
        let mut args = kc.to_vec();
        args.extend([
            "--routing-mode=native",
            "--auto-direct-node-routes",
            "--ipv4-native-routing-cidr=10.0.0.0/8",
            "--enable-ipv4-masquerade=false",
        ]);
        let c = resolve(&args).unwrap().cross_node;
        assert_eq!(c.routing, RoutingMode::Native);
        assert!(c.auto_direct_node_routes && !c.masquerade_v4);
        assert_eq!(
            c.native_routing_cidrs,
            vec!["10.0.0.0/8".parse::<IpNet>().unwrap()]
        );
        // Several CIDRs, where Cilium takes one.
        args.push("--ipv4-native-routing-cidr=10.0.0.0/8, 172.16.0.0/12 192.168.0.0/16");
        let c = resolve(&args).unwrap().cross_node;
        let want: Vec<IpNet> = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
            .iter()
            .map(|c| c.parse().unwrap())
            .collect();
        assert_eq!(c.native_routing_cidrs, want);
        let e = resolve(
            &[
                &kc[..],
                &["--ipv4-native-routing-cidr=10.0.0.0/8,fd00::/64"],
            ]
            .concat(),
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "--ipv4-native-routing-cidr \"fd00::/64\" is not an IPv4 CIDR"
        );
        for (bad, says) in [
            (
                "--ipv4-native-routing-cidr=fd00::/64",
                "is not an IPv4 CIDR",
            ),
            ("--ipv6-native-routing-cidr=nope", "is not a CIDR"),
            ("--tunnel-protocol=gre", "not one of vxlan, geneve"),
            (
                "--underlay-protocol=IPv6",
                "--underlay-protocol \"IPv6\" is not one of ipv4, ipv6",
            ),
        ] {
            let mut args = kc.to_vec();
            args.push(bad);
            let e = resolve(&args).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn kubernetes_cidrs_and_router_overrides() {
        let c = resolve(&[
            "--ipam",
            "kubernetes",
            "--pod-cidrs",
            "10.1.2.0/24",
            "--ipv6-range",
            "fd00:1::/120",
            "--enable-ipv6",
        ])
        .unwrap();
        assert_eq!(c.pod_cidrs.len(), 2);
        let c = resolve(&["--ipam", "delegated-plugin"]).unwrap();
        assert_eq!(
            c.fixed_routers.get(&Family::V4),
            Some(&"169.254.0.1".parse::<IpAddr>().unwrap())
        );
        let e = resolve(&["--local-router-ipv4", "fd00::1"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("not an IPv4 address"), "{e}");
    }

    #[test]
    fn multi_pool_settings() {
        let c = resolve(&[
            "--ipam",
            "multi-pool",
            "--ipam-multi-pool-pre-allocation",
            "default=8,mars=4",
            "--node-labels",
            "zone=a, rack=7",
        ])
        .unwrap();
        let m = c.multi_pool.unwrap();
        assert_eq!(m.pre_allocation.get("mars"), Some(&4));
        assert_eq!(c.node_labels.get("rack").map(String::as_str), Some("7"));
        let e = resolve(&["--node-labels", "zone"]).unwrap_err().to_string();
        assert!(e.contains("not key=value"), "{e}");
    }

    #[test]
    fn underlay_protocol_takes_ciliums_two_values_and_names_them_otherwise() {
        for u in [Family::V4, Family::V6] {
            assert_eq!(parse_underlay(u.as_str()), Ok(u));
        }
        let e = parse_underlay("inet6").unwrap_err().to_string();
        assert!(
            e.starts_with("--underlay-protocol \"inet6\" is not one of ipv4, ipv6"),
            "{e}"
        );
    }
}
