//! The daemon's options. Names are Cilium's agent/operator option names; every option
//! can be given as a flag or as a file in `--config-dir` (one file per option, the
//! way a ConfigMap is mounted). Flags win over files, files over defaults.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args};

use crate::ipam::cidr_depletion::{DEFAULT_DEPLETION_THRESHOLD, DEFAULT_RELEASE_DELAY};
pub(crate) use crate::process::options::OptionsError;
use crate::process::options::{parse_bool, parse_command_with_config_dir, parse_duration};

/// `podnet daemon` options.
#[derive(Debug, Clone, Args)]
pub struct DaemonOptions {
    /// Directory with one file per option (a mounted ConfigMap); flags override it.
    #[arg(long = "config-dir", value_name = "DIR")]
    pub config_dir: Option<PathBuf>,

    /// IPAM mode: cluster-pool (default), kubernetes or multi-pool.
    #[arg(long = "ipam", default_value = "cluster-pool")]
    pub ipam: String,

    /// Allocate IPv4 addresses.
    #[arg(long = "enable-ipv4", action = ArgAction::Set, num_args = 0..=1, default_value = "true", default_missing_value = "true", value_parser = parse_bool)]
    pub enable_ipv4: bool,

    /// Allocate IPv6 addresses.
    #[arg(long = "enable-ipv6", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub enable_ipv6: bool,

    /// Cluster pool IPv4 CIDRs, space-separated (default 10.0.0.0/8 when IPv4 is enabled).
    #[arg(long = "cluster-pool-ipv4-cidr", value_name = "CIDRS")]
    pub cluster_pool_ipv4_cidr: Option<String>,

    /// Node CIDR mask size for IPv4.
    #[arg(long = "cluster-pool-ipv4-mask-size", default_value_t = 24)]
    pub cluster_pool_ipv4_mask_size: u8,

    /// Cluster pool IPv6 CIDRs, space-separated (default fd00::/104 when IPv6 is enabled).
    #[arg(long = "cluster-pool-ipv6-cidr", value_name = "CIDRS")]
    pub cluster_pool_ipv6_cidr: Option<String>,

    /// Node CIDR mask size for IPv6 (Helm's default, 120).
    #[arg(long = "cluster-pool-ipv6-mask-size", default_value_t = 120)]
    pub cluster_pool_ipv6_mask_size: u8,

    /// Kubernetes backend: the kubeconfig of the API server (Cilium's option). Without
    /// it the in-cluster service account is used when KUBERNETES_SERVICE_HOST is set,
    /// else the embedded backend.
    #[arg(long = "k8s-kubeconfig-path", value_name = "FILE")]
    pub k8s_kubeconfig_path: Option<PathBuf>,

    /// This node's name (defaults to $K8S_NODE_NAME, then the host name).
    #[arg(long = "k8s-node-name", alias = "node-name", env = "K8S_NODE_NAME")]
    pub node_name: Option<String>,

    /// kubernetes mode: the node's pod CIDRs (Node.spec.podCIDRs), space-separated.
    #[arg(long = "pod-cidrs", value_name = "CIDRS")]
    pub pod_cidrs: Option<String>,

    /// kubernetes mode: override of the node's IPv4 pod CIDR ("auto" = none).
    #[arg(long = "ipv4-range", default_value = "auto")]
    pub ipv4_range: String,

    /// kubernetes mode: override of the node's IPv6 pod CIDR ("auto" = none).
    #[arg(long = "ipv6-range", default_value = "auto")]
    pub ipv6_range: String,

    /// multi-pool: directory of `CiliumPodIPPool` (and `CiliumNodeConfig`) manifests,
    /// watched for changes.
    #[arg(long = "pool-dir", value_name = "DIR")]
    pub pool_dir: Option<PathBuf>,

    /// multi-pool: directory of Pod and Namespace manifests (labels and annotations
    /// for pool selection), watched for changes.
    #[arg(long = "metadata-dir", value_name = "DIR")]
    pub metadata_dir: Option<PathBuf>,

    /// multi-pool: pools to create when absent, `<pool>=ipv4-cidrs:<cidr>[,..];ipv4-mask-size:<n>[;...]`.
    #[arg(long = "auto-create-cilium-pod-ip-pools", default_value = "")]
    pub auto_create_pools: String,

    /// multi-pool: addresses to keep ready per pool and family (`default=8,mars=4`).
    #[arg(long = "ipam-multi-pool-pre-allocation", default_value = "")]
    pub multi_pool_pre_allocation: String,

    /// multi-pool: the pool of pods nothing else selects.
    #[arg(long = "ipam-default-ip-pool", default_value = "default")]
    pub default_ip_pool: String,

    /// multi-pool: pods outside the default pool keep their source address.
    #[arg(long = "only-masquerade-default-pool", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub only_masquerade_default_pool: bool,

    /// multi-pool: adopt a cluster-pool node's CIDRs into the default pool at start.
    #[arg(long = "enable-cluster-pool-to-multi-pool-migration", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub cluster_pool_migration: bool,

    /// This node's labels (`k=v,k2=v2`), for `CiliumNodeConfig` node selectors.
    #[arg(long = "node-labels", default_value = "")]
    pub node_labels: String,

    /// A fixed router IPv4 address (not taken from IPAM); delegated-plugin mode
    /// defaults to 169.254.0.1.
    #[arg(long = "local-router-ipv4", default_value = "")]
    pub local_router_ipv4: String,

    /// A fixed router IPv6 address (not taken from IPAM); delegated-plugin mode
    /// with IPv6 needs one.
    #[arg(long = "local-router-ipv6", default_value = "")]
    pub local_router_ipv6: String,

    /// crd, azure, alibabacloud, eni: the CiliumNode manifest file the external
    /// IPAM writes for this node; the daemon writes only `status` into it.
    #[arg(long = "node-resource", value_name = "FILE")]
    pub node_resource: Option<PathBuf>,

    /// crd/eni: how often, at most, the used addresses are written into the node
    /// resource's status.
    #[arg(long = "ipam-cilium-node-update-rate", default_value = "15s", value_parser = parse_duration)]
    pub node_update_rate: Duration,

    /// Kubernetes backend: how often the leak check compares this node's
    /// allocations with the Pods the API server lists on it and the host links
    /// the kernel has (`POST /v1/ipam/leak-check` runs one now); 0 turns the
    /// periodic check off.
    #[arg(long = "ipam-leak-check-interval", default_value = "10m", value_parser = parse_duration)]
    pub leak_check_interval: Duration,

    /// How old an allocation must be before the leak check may call it a leak (an
    /// ADD in progress has its address before the API server lists its Pod here):
    /// the 10 minutes a pending allocation lives.
    #[arg(long = "ipam-leak-grace", default_value = "10m", value_parser = parse_duration)]
    pub leak_grace: Duration,

    /// Release an allocation the leak check found leaked in every check for this
    /// long (default 1h: ipam::leaks::DEFAULT_RELEASE_LEAKED_AFTER says why); 0
    /// only reports leaks and releases none.
    #[arg(long = "ipam-release-leaked-after", default_value = "1h", value_parser = parse_duration)]
    pub release_leaked_after: Duration,

    /// native or tunnel (default: tunnel with the Kubernetes backend, as Cilium;
    /// native on the embedded backend and in ENI-class modes, which need it).
    #[arg(long = "routing-mode")]
    pub routing_mode: Option<String>,

    /// Tunnel mode: the encapsulation (vxlan; geneve is refused with the reason).
    #[arg(long = "tunnel-protocol", default_value = "vxlan")]
    pub tunnel_protocol: String,

    /// Tunnel mode: the IP family of the tunnel's outer packets, ipv4 or ipv6
    /// (Cilium's option): each node's InternalIP of that family is its tunnel
    /// endpoint, and the overhead taken off the pod MTU is 50 or 70 bytes.
    #[arg(long = "underlay-protocol", default_value = "ipv4")]
    pub underlay_protocol: String,

    /// Tunnel mode: the UDP port of the tunnel (0 = 8472, VXLAN's).
    #[arg(long = "tunnel-port", default_value_t = 8472)]
    pub tunnel_port: u16,

    /// Native mode: route each other node's pod CIDRs via its InternalIP (the
    /// nodes share an L2 segment).
    #[arg(long = "auto-direct-node-routes", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub auto_direct_node_routes: bool,

    /// IPv4 destinations reached without masquerade (the network routes pod
    /// addresses to them): CIDRs, space- or comma-separated (Cilium takes one).
    #[arg(long = "ipv4-native-routing-cidr", default_value = "")]
    pub ipv4_native_routing_cidr: String,

    /// IPv6 destinations reached without masquerade (CIDRs, as for IPv4).
    #[arg(long = "ipv6-native-routing-cidr", default_value = "")]
    pub ipv6_native_routing_cidr: String,

    /// Source-NAT IPv4 pod traffic leaving the cluster to the node's address
    /// (nftables; default: on with the Kubernetes backend, off on the embedded one).
    #[arg(long = "enable-ipv4-masquerade", action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub enable_ipv4_masquerade: Option<bool>,

    /// Source-NAT IPv6 pod traffic leaving the cluster (default as for IPv4).
    #[arg(long = "enable-ipv6-masquerade", action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub enable_ipv6_masquerade: Option<bool>,

    /// Drop packets from a pod whose source address the pod does not own (a
    /// reverse-path check in podnet's nftables table `inet podnet_source`; needs
    /// the nft tool). Off removes the table.
    #[arg(long = "enable-source-ip-verification", action = ArgAction::Set, num_args = 0..=1, default_value = "true", default_missing_value = "true", value_parser = parse_bool)]
    pub enable_source_ip_verification: bool,

    /// NetworkPolicy enforcement (Cilium's option and values): `default` enforces
    /// on the pods some policy selects (Kubernetes' semantics; the Kubernetes
    /// backend's watches feed podnet's nftables table `inet podnet_policy`), `never`
    /// writes no table and removes podnet's, `always` (default-deny for every pod)
    /// is not yet supported.
    #[arg(long = "enable-policy", default_value = "default")]
    pub enable_policy: String,

    /// Policy audit mode (Cilium's option): what a policy would drop (what no
    /// NetworkPolicy allows, a ClusterNetworkPolicy Deny) is let through and
    /// reported as `audit` by `podnet observe` and the metrics, instead of
    /// dropped, so a policy can be rolled out safely.
    #[arg(long = "policy-audit-mode", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub policy_audit_mode: bool,

    /// ClusterNetworkPolicy enforcement (`policy.networking.k8s.io`, the
    /// network-policy-api's Admin and Baseline tiers around NetworkPolicy), with
    /// `--enable-policy` default or always on the Kubernetes backend: the
    /// newest version the API server serves, v1beta1 or v1alpha2, watched
    /// once its CRD is installed (docs/security.md).
    #[arg(long = "enable-cluster-network-policy", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub enable_cluster_network_policy: bool,

    /// L2 announcements (Cilium's option): answer ARP and NDP for the
    /// LoadBalancer and external addresses of the Services a
    /// CiliumL2AnnouncementPolicy selects, one node per address, failing over
    /// by the agents' heartbeats (docs/l2-announcements.md). The Kubernetes
    /// backend only; needs CAP_NET_RAW.
    #[arg(long = "enable-l2-announcements", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub enable_l2_announcements: bool,

    /// The UDP port the agents' L2 announcement heartbeats go to (on every
    /// node's InternalIPs).
    #[arg(long = "l2-announcements-heartbeat-port", default_value_t = 4247)]
    pub l2_announcements_heartbeat_port: u16,

    /// Pod device type: veth, netkit (L3), netkit-l2, or auto (netkit where the
    /// kernel has it, else veth).
    #[arg(long = "datapath-mode", default_value = "veth")]
    pub datapath_mode: String,

    /// MTU of pod devices and routes; 0 = the MTU of the node's default-route device, else 1500.
    #[arg(long = "mtu", default_value_t = 0)]
    pub mtu: u32,

    /// How long an address handed out with `expiration: true` waits for its endpoint.
    #[arg(long = "ipam-expiration", default_value = "10m", value_parser = parse_duration)]
    pub ipam_expiration: Duration,

    /// How long a released address waits before it is handed out again.
    #[arg(long = "ipam-release-cooldown", default_value = "30s", value_parser = parse_duration)]
    pub ipam_release_cooldown: Duration,

    /// cluster-pool (podnet): when fewer than this percentage of the node's
    /// usable addresses of a family are free, the agent marks its CIDRs of that
    /// family `depleted` in status.ipam.pod-cidrs, and podnet's operator appends
    /// another CIDR (1 to 100).
    #[arg(long = "cluster-pool-depletion-threshold", default_value_t = u32::from(DEFAULT_DEPLETION_THRESHOLD))]
    pub cluster_pool_depletion_threshold: u32,

    /// cluster-pool (podnet): how long an extra CIDR (never the node's first)
    /// holds no address before the agent marks it `released` and podnet's
    /// operator takes it back.
    #[arg(long = "cluster-pool-cidr-release-delay", default_value = DEFAULT_RELEASE_DELAY, value_parser = parse_duration)]
    pub cluster_pool_cidr_release_delay: Duration,

    /// If the journal cannot be read, move it aside and rebuild the allocations
    /// from the pods' host links and routes (see docs/crash-safety.md).
    #[arg(long = "rebuild-from-kernel", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub rebuild_from_kernel: bool,

    /// Reserve a health endpoint address per family.
    #[arg(long = "enable-health-checking", action = ArgAction::Set, num_args = 0..=1, default_value = "true", default_missing_value = "true", value_parser = parse_bool)]
    pub enable_health_checking: bool,

    /// Reserve an ingress address per family.
    #[arg(long = "enable-ingress-controller", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub enable_ingress_controller: bool,

    /// Shape each pod's traffic as its `kubernetes.io/ingress-bandwidth` and
    /// `egress-bandwidth` annotations ask (the runtime's
    /// `runtimeConfig.bandwidth`): the written CNI config declares the
    /// `bandwidth` capability and the plugin sets TBF qdiscs (docs/bandwidth.md).
    /// Cilium's option.
    #[arg(long = "enable-bandwidth-manager", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub enable_bandwidth_manager: bool,

    /// The proc filesystem under which the daemon sets its sysctls (forwarding,
    /// proxy NDP: `<procfs>/sys/net/...`). In a container, whose own /proc/sys is
    /// read-only unless privileged, mount the host's /proc/sys/net at
    /// `<procfs>/sys/net` (deploy/podnet.yaml: `/host/proc`). Cilium's option.
    #[arg(long = "procfs", default_value = "/proc")]
    pub procfs: PathBuf,

    /// The daemon's unix socket (created 0600).
    #[arg(long = "socket", default_value = crate::api::DEFAULT_SOCKET)]
    pub socket: PathBuf,

    /// Where the journal lives (created 0700).
    #[arg(long = "state-dir", default_value = "/run/podnet/state")]
    pub state_dir: PathBuf,

    /// Write the CNI config (`05-podnet.conflist`) into this directory once the
    /// daemon can serve; empty = never.
    #[arg(long = "write-cni-conf-when-ready", default_value = "")]
    pub write_cni_conf_when_ready: String,

    /// With `write-cni-conf-when-ready`: move other CNI configs aside as `*.podnet_bak`.
    #[arg(long = "cni-exclusive", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub cni_exclusive: bool,

    /// With `write-cni-conf-when-ready`: remove the written config when the daemon
    /// stops (SIGTERM), so a node whose agent is gone (its DaemonSet deleted) stops
    /// offering podnet to the runtime. Off by default: an agent restart then leaves
    /// the config in place.
    #[arg(long = "cni-uninstall", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub cni_uninstall: bool,

    /// The log file the written CNI config gives the plugin.
    #[arg(long = "cni-log-file", default_value = "/run/podnet/podnet-cni.log")]
    pub cni_log_file: PathBuf,

    /// With `write-cni-conf-when-ready`: the CNI plugin directory as this daemon
    /// sees it (the host's `/opt/cni/bin`; deploy/podnet.yaml mounts it read-only
    /// at `/host/opt/cni/bin`). When it holds the reference `portmap` plugin, the
    /// written config chains it after podnet, so pods' hostPorts are served; empty
    /// = chain nothing.
    #[arg(long = "cni-bin-dir", default_value = "")]
    pub cni_bin_dir: String,

    /// Serve Prometheus metrics on this address (e.g. `127.0.0.1:9962`, or `:9962`
    /// for every address); empty = off.
    #[arg(long = "prometheus-serve-addr", default_value = "")]
    pub prometheus_serve_addr: String,

    /// Prefix of metric names (`cilium` gives Cilium's names).
    #[arg(long = "metrics-prefix", default_value = "podnet")]
    pub metrics_prefix: String,

    /// Log filter (error, warn, info, debug, trace, or a tracing filter).
    #[arg(long = "log-level", default_value = "info")]
    pub log_level: String,
}

/// Command used only to parse daemon options on their own.
#[derive(Debug, clap::Parser)]
#[command(name = "podnet daemon", args_override_self = true)]
struct DaemonCommand {
    #[command(flatten)]
    opts: DaemonOptions,
}

impl DaemonOptions {
    /// Parses `args` (the words after `daemon`), merging `--config-dir` files under
    /// the command line. Unknown files in the config dir are ignored (a Cilium
    /// ConfigMap holds many options podnet does not use).
    pub fn parse_with_config_dir(args: &[String]) -> Result<DaemonOptions, OptionsError> {
        parse_command_with_config_dir::<DaemonCommand>(args).map(|c| c.opts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_dir::TestDir;

    fn parse(args: &[&str]) -> Result<DaemonOptions, OptionsError> {
        DaemonOptions::parse_with_config_dir(
            &args.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )
    }

    #[test]
    fn defaults() {
        let o = parse(&[]).unwrap();
        assert_eq!(o.ipam, "cluster-pool");
        assert!(o.enable_ipv4);
        assert!(!o.enable_ipv6);
        assert_eq!(o.cluster_pool_ipv4_mask_size, 24);
        assert_eq!(o.ipam_expiration, Duration::from_secs(600));
        assert_eq!(o.socket, PathBuf::from("/run/podnet/podnet.sock"));
        assert_eq!(o.underlay_protocol, "ipv4", "Cilium's default");
        assert_eq!(o.enable_policy, "default", "Cilium's default");
    }

    #[test]
    fn the_leak_checks_defaults_are_ipam_leaks_own() {
        use crate::ipam::leaks::{DEFAULT_GRACE, DEFAULT_RELEASE_LEAKED_AFTER};
        let o = parse(&[]).unwrap();
        assert_eq!(o.leak_check_interval, Duration::from_secs(600));
        assert_eq!(o.leak_grace, DEFAULT_GRACE);
        assert_eq!(o.release_leaked_after, DEFAULT_RELEASE_LEAKED_AFTER);
        let o = parse(&[
            "--ipam-release-leaked-after=0",
            "--ipam-leak-check-interval=30s",
        ])
        .unwrap();
        assert_eq!(o.release_leaked_after, Duration::ZERO);
        assert_eq!(o.leak_check_interval, Duration::from_secs(30));
    }

    #[test]
    fn bool_forms() {
        assert!(parse(&["--enable-ipv6"]).unwrap().enable_ipv6);
        assert!(parse(&["--enable-ipv6=true"]).unwrap().enable_ipv6);
        assert!(!parse(&["--enable-ipv4=false"]).unwrap().enable_ipv4);
        assert!(parse(&["--enable-ipv4=maybe"]).is_err());
    }

    #[test]
    fn config_dir_under_flags() {
        let dir = TestDir::new("optdir");
        std::fs::write(dir.join("cluster-pool-ipv4-cidr"), "10.9.0.0/16\n").unwrap();
        std::fs::write(dir.join("cluster-pool-ipv4-mask-size"), "26").unwrap();
        std::fs::write(dir.join("enable-ipv6"), "true").unwrap();
        std::fs::write(dir.join("underlay-protocol"), "ipv6\n").unwrap();
        std::fs::write(dir.join("some-cilium-option"), "x").unwrap();
        std::fs::write(dir.join("..data"), "x").unwrap();
        let d = dir.display().to_string();
        let o = parse(&["--config-dir", &d, "--cluster-pool-ipv4-mask-size", "28"]).unwrap();
        assert_eq!(o.cluster_pool_ipv4_cidr.as_deref(), Some("10.9.0.0/16"));
        assert_eq!(o.cluster_pool_ipv4_mask_size, 28);
        assert!(o.enable_ipv6);
        assert_eq!(o.underlay_protocol, "ipv6");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("2d").is_err());
        assert!(parse_duration("x").is_err());
        assert!(parse_duration("99999999999999999999999h").is_err());
    }

    #[test]
    fn bad_mask_value_is_rejected() {
        assert!(parse(&["--cluster-pool-ipv4-mask-size", "abc"]).is_err());
    }
}
