//! The operator's options, with Cilium's operator option names, and their resolution
//! into an [`OperatorConfig`]: the IPAM mode (cluster-pool with the cluster pool and
//! Cilium's start-up checks, or multi-pool with the pools to auto-create), where the
//! API server is, and the leader election (identity and timing). Every option is a flag or a file in `--config-dir`,
//! read by the daemon's reader (flags win over files).

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args};

use super::cluster_pool::extra::DEFAULT_EXTRA_CIDRS_MAX;
use super::lbipam::services::{DefaultIpam, Settings};
use super::lease::timing::{
    OPT_LEASE_DURATION, OPT_RENEW_DEADLINE, OPT_RENEW_INTERVAL, OPT_RETRY_PERIOD, Timing,
    TimingError, default_renew_interval,
};
use super::multi_pool::auto_create::{self, AutoCreateError, OPT_AUTO_CREATE};
use crate::ipam::Family;
use crate::ipam::clusterpool::{
    ClusterPoolConfig, ClusterPoolError, DEFAULT_IPV4_MASK_SIZE, DEFAULT_IPV6_MASK_SIZE,
    OPT_IPV4_CIDR, OPT_IPV6_CIDR, parse_pool_list,
};
use crate::ipam::pooldef::PoolDef;
use crate::process::options::{
    OptionsError, parse_bool, parse_command_with_config_dir, parse_duration,
};

/// The options `podnet operator` and `podnet operator status` share: the config
/// dir, the cluster pool, and where the API server and the leader Lease are.
#[derive(Debug, Clone, Args)]
pub struct ClusterOptions {
    /// Directory with one file per option (a mounted ConfigMap); flags override it.
    #[arg(long = "config-dir", value_name = "DIR")]
    pub config_dir: Option<PathBuf>,

    /// Cluster pool IPv4 CIDRs, space-separated (the operator needs them when IPv4 is enabled).
    #[arg(
        long = "cluster-pool-ipv4-cidr",
        value_name = "CIDRS",
        default_value = ""
    )]
    pub cluster_pool_ipv4_cidr: String,

    /// Node CIDR mask size for IPv4.
    #[arg(long = "cluster-pool-ipv4-mask-size", default_value_t = DEFAULT_IPV4_MASK_SIZE)]
    pub cluster_pool_ipv4_mask_size: u8,

    /// Cluster pool IPv6 CIDRs, space-separated (the operator needs them when IPv6 is enabled).
    #[arg(
        long = "cluster-pool-ipv6-cidr",
        value_name = "CIDRS",
        default_value = ""
    )]
    pub cluster_pool_ipv6_cidr: String,

    /// Node CIDR mask size for IPv6 (the operator's default, 112).
    #[arg(long = "cluster-pool-ipv6-mask-size", default_value_t = DEFAULT_IPV6_MASK_SIZE)]
    pub cluster_pool_ipv6_mask_size: u8,

    /// podnet: extra CIDRs per family a node may get from the cluster pool when
    /// its agent says its CIDRs are depleted (cluster-pool-depletion-threshold);
    /// 0: none (a node keeps one CIDR per family, as with Cilium).
    #[arg(long = "cluster-pool-extra-cidrs-max", default_value_t = DEFAULT_EXTRA_CIDRS_MAX)]
    pub cluster_pool_extra_cidrs_max: u32,

    /// The kubeconfig of the API server; without it, the in-cluster service
    /// account (KUBERNETES_SERVICE_HOST must be set).
    #[arg(long = "k8s-kubeconfig-path", value_name = "FILE")]
    pub k8s_kubeconfig_path: Option<PathBuf>,

    /// Namespace of the leader-election Lease.
    #[arg(long = "leader-election-namespace", default_value = "kube-system")]
    pub leader_election_namespace: String,
}

impl ClusterOptions {
    /// Sets `config`'s pool CIDRs from `cluster-pool-ipv4-cidr` and
    /// `cluster-pool-ipv6-cidr` (entries with their own mask sizes included).
    pub fn pool_lists(&self, config: &mut ClusterPoolConfig) -> Result<(), ClusterPoolError> {
        let v4 = parse_pool_list(OPT_IPV4_CIDR, &self.cluster_pool_ipv4_cidr)?;
        let v6 = parse_pool_list(OPT_IPV6_CIDR, &self.cluster_pool_ipv6_cidr)?;
        config.set_pool(Family::V4, &v4);
        config.set_pool(Family::V6, &v6);
        Ok(())
    }
}

/// `podnet operator` options.
#[derive(Debug, Clone, Args)]
pub struct OperatorOptions {
    #[command(flatten)]
    pub cluster: ClusterOptions,

    /// IPAM mode: cluster-pool or multi-pool.
    #[arg(long = "ipam", default_value = "cluster-pool")]
    pub ipam: String,

    /// multi-pool: CiliumPodIPPools to create at start when they do not exist,
    /// `<pool>=ipv4-cidrs:<cidr>[,<cidr>...];ipv4-mask-size:<n>[;ipv6-cidrs:...;ipv6-mask-size:<n>]`,
    /// comma-separated or repeated.
    #[arg(long = "auto-create-cilium-pod-ip-pools", value_name = "POOLS")]
    pub auto_create_cilium_pod_ip_pools: Vec<String>,

    /// multi-pool: adopt the `spec.ipam.podCIDRs` of nodes that ran
    /// cluster-pool as their blocks of the default pool (online migration).
    #[arg(long = "enable-cluster-pool-to-multi-pool-migration", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub enable_cluster_pool_to_multi_pool_migration: bool,

    /// The pool the migration adopts the node CIDRs into.
    #[arg(long = "ipam-default-ip-pool", default_value = "default")]
    pub ipam_default_ip_pool: String,

    /// Allocate IPv4 node CIDRs.
    #[arg(long = "enable-ipv4", action = ArgAction::Set, num_args = 0..=1, default_value = "true", default_missing_value = "true", value_parser = parse_bool)]
    pub enable_ipv4: bool,

    /// Allocate IPv6 node CIDRs.
    #[arg(long = "enable-ipv6", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub enable_ipv6: bool,

    /// How long the leader's lease lasts unrenewed: a follower takes over this long
    /// after the last renewal it saw (Cilium's option; whole seconds).
    #[arg(long = OPT_LEASE_DURATION, default_value = "15s", value_parser = parse_duration)]
    pub leader_election_lease_duration: Duration,

    /// The leader stops leading when no renewal succeeded for this long (Cilium's
    /// option; shorter than the lease duration).
    #[arg(long = OPT_RENEW_DEADLINE, default_value = "10s", value_parser = parse_duration)]
    pub leader_election_renew_deadline: Duration,

    /// How long the leader waits after a failed renewal, and a follower after a
    /// lost race or an error (Cilium's option).
    #[arg(long = OPT_RETRY_PERIOD, default_value = "2s", value_parser = parse_duration)]
    pub leader_election_retry_period: Duration,

    /// How often the leader renews its lease (podnet's option; default: half the
    /// renew deadline, at least the retry period).
    #[arg(long = OPT_RENEW_INTERVAL, value_parser = parse_duration)]
    pub leader_election_renew_interval: Option<Duration>,

    /// This replica's name in the Lease (default: the host name and the PID).
    #[arg(long = "identity", default_value = "")]
    pub identity: String,

    /// Do not register the CRDs (CiliumNode, CiliumPodIPPool, CiliumNodeConfig, CiliumLoadBalancerIPPool)
    /// where the API server lacks them (Cilium's option).
    #[arg(long = "skip-crd-creation", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub skip_crd_creation: bool,

    /// Serve Prometheus metrics on this address (e.g. `:9963`); empty = off.
    #[arg(long = "prometheus-serve-addr", default_value = "")]
    pub prometheus_serve_addr: String,

    /// Log filter (error, warn, info, debug, trace, or a tracing filter).
    #[arg(long = "log-level", default_value = "info")]
    pub log_level: String,

    /// LB IPAM: addresses from CiliumLoadBalancerIPPools for LoadBalancer
    /// Services (dormant until the first pool exists).
    #[arg(long = "enable-lb-ipam", action = ArgAction::Set, num_args = 0..=1, default_value = "true", default_missing_value = "true", value_parser = parse_bool)]
    pub enable_lb_ipam: bool,

    /// Who serves a LoadBalancer Service without loadBalancerClass.
    #[arg(long = "default-lb-service-ipam", value_enum, default_value = "lbipam")]
    pub default_lb_service_ipam: DefaultIpam,

    /// Node IPAM: node addresses for Services of loadBalancerClass io.cilium/node.
    #[arg(long = "enable-node-ipam", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub enable_node_ipam: bool,

    /// ClusterNetworkPolicy (the agents' option of the same name): the leader
    /// writes each policy's podnet.io/Enforced condition and posts each
    /// problem once as an Event.
    #[arg(long = "enable-cluster-network-policy", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true", value_parser = parse_bool)]
    pub enable_cluster_network_policy: bool,

    /// How often the leader checks the cluster for two Pods with the same IP, a
    /// Pod IP outside its node's ranges and a range on two CiliumNodes (also at
    /// start); 0 = never.
    #[arg(long = "ipam-duplicate-check-interval", default_value = "5m", value_parser = parse_duration)]
    pub ipam_duplicate_check_interval: Duration,
}

/// Command used only to parse operator options on their own.
#[derive(Debug, clap::Parser)]
#[command(name = "podnet operator", args_override_self = true)]
struct OperatorCommand {
    #[command(flatten)]
    opts: OperatorOptions,
}

impl OperatorOptions {
    /// Parses `args` (the words after `operator`), with `--config-dir` files under
    /// the flags; files of options the operator does not know are ignored.
    pub fn parse_with_config_dir(args: &[String]) -> Result<OperatorOptions, OptionsError> {
        parse_command_with_config_dir::<OperatorCommand>(args).map(|c| c.opts)
    }
}

/// What the operator allocates.
#[derive(Debug, Clone)]
pub enum OperatorIpam {
    /// One node CIDR per enabled family from the cluster pool, or why its
    /// options are refused (the operator decides whether it can run without
    /// them: `cluster_pool::reload`'s rule).
    ClusterPool(Result<ClusterPoolConfig, ClusterPoolError>),
    /// Blocks of the CiliumPodIPPools on demand; these pools are created at
    /// start when missing. `migrate_into`: the default pool of the
    /// cluster-pool to multi-pool migration, when enabled.
    MultiPool {
        auto_create: Vec<PoolDef>,
        migrate_into: Option<String>,
    },
}

/// The operator's options, resolved and checked.
#[derive(Debug, Clone)]
pub struct OperatorConfig {
    pub ipam: OperatorIpam,
    /// None: in-cluster.
    pub kubeconfig: Option<PathBuf>,
    pub namespace: String,
    pub identity: String,
    /// The leader election's durations, checked.
    pub election: Timing,
    /// None: LB IPAM is off (`--enable-lb-ipam=false`).
    pub lb_ipam: Option<Settings>,
    /// None: Node IPAM is off; else who serves Services without a class.
    pub node_ipam: Option<DefaultIpam>,
    /// Whether the leader writes the ClusterNetworkPolicies' status.
    pub cluster_network_policy: bool,
    /// None: the duplicate check is off; else its interval.
    pub duplicate_check: Option<Duration>,
    /// Cluster-pool: extra CIDRs a node may get per family.
    pub extra_cidrs_max: u32,
}

/// Why the options do not make a configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("ipam {0:?} is not supported by podnet operator: use cluster-pool or multi-pool")]
    UnsupportedIpam(String),
    #[error(
        "--{} needs --ipam multi-pool (it creates CiliumPodIPPools)",
        OPT_AUTO_CREATE
    )]
    AutoCreateNeedsMultiPool,
    #[error(
        "--{} needs --ipam multi-pool (it migrates cluster-pool nodes into it)",
        OPT_MIGRATION
    )]
    MigrationNeedsMultiPool,
    #[error(
        "--{} needs --ipam-default-ip-pool: the pool the node CIDRs migrate into",
        OPT_MIGRATION
    )]
    MigrationNeedsDefaultPool,
    #[error(
        "podnet operator needs the API server: --k8s-kubeconfig-path FILE, or run it in a pod (KUBERNETES_SERVICE_HOST)"
    )]
    NoApiServer,
    #[error("--leader-election-namespace must not be empty")]
    NoNamespace,
    #[error(transparent)]
    ClusterPool(#[from] ClusterPoolError),
    #[error(transparent)]
    AutoCreate(#[from] AutoCreateError),
    #[error(transparent)]
    LeaderElection(#[from] TimingError),
}

impl OperatorConfig {
    /// Resolves the options with Cilium's operator start-up checks
    /// (`cluster-pool-ipv4-cidr must be provided when using ClusterPool`, ...).
    pub fn resolve(opts: &OperatorOptions) -> Result<OperatorConfig, ConfigError> {
        let ipam = match opts.ipam.as_str() {
            "cluster-pool" => OperatorIpam::ClusterPool(cluster_pool(opts)),
            "multi-pool" => OperatorIpam::MultiPool {
                auto_create: auto_create::parse(&opts.auto_create_cilium_pod_ip_pools)?,
                migrate_into: migration(opts)?,
            },
            other => return Err(ConfigError::UnsupportedIpam(other.to_string())),
        };
        if !matches!(ipam, OperatorIpam::MultiPool { .. }) {
            if !opts.auto_create_cilium_pod_ip_pools.is_empty() {
                return Err(ConfigError::AutoCreateNeedsMultiPool);
            }
            if opts.enable_cluster_pool_to_multi_pool_migration {
                return Err(ConfigError::MigrationNeedsMultiPool);
            }
        }
        let kubeconfig = match &opts.cluster.k8s_kubeconfig_path {
            Some(p) => Some(p.clone()),
            None if std::env::var("KUBERNETES_SERVICE_HOST").is_ok_and(|h| !h.is_empty()) => None,
            None => return Err(ConfigError::NoApiServer),
        };
        if opts.cluster.leader_election_namespace.is_empty() {
            return Err(ConfigError::NoNamespace);
        }
        let identity = if opts.identity.is_empty() {
            default_identity()
        } else {
            opts.identity.clone()
        };
        let lb_ipam = opts.enable_lb_ipam.then_some(Settings {
            ipv4: opts.enable_ipv4,
            ipv6: opts.enable_ipv6,
            default_ipam: opts.default_lb_service_ipam,
        });
        Ok(OperatorConfig {
            ipam,
            kubeconfig,
            namespace: opts.cluster.leader_election_namespace.clone(),
            identity,
            election: election(opts)?,
            lb_ipam,
            node_ipam: opts
                .enable_node_ipam
                .then_some(opts.default_lb_service_ipam),
            cluster_network_policy: opts.enable_cluster_network_policy,
            duplicate_check: Some(opts.ipam_duplicate_check_interval).filter(|i| !i.is_zero()),
            extra_cidrs_max: opts.cluster.cluster_pool_extra_cidrs_max,
        })
    }
}

const OPT_MIGRATION: &str = "enable-cluster-pool-to-multi-pool-migration";

/// The default pool the migration adopts node CIDRs into, when enabled.
fn migration(opts: &OperatorOptions) -> Result<Option<String>, ConfigError> {
    if !opts.enable_cluster_pool_to_multi_pool_migration {
        return Ok(None);
    }
    if opts.ipam_default_ip_pool.is_empty() {
        return Err(ConfigError::MigrationNeedsDefaultPool);
    }
    Ok(Some(opts.ipam_default_ip_pool.clone()))
}

/// The leader election's durations, checked (the renew interval defaults from the
/// renew deadline and retry period given).
fn election(opts: &OperatorOptions) -> Result<Timing, TimingError> {
    Timing {
        lease_duration: opts.leader_election_lease_duration,
        renew_deadline: opts.leader_election_renew_deadline,
        renew_interval: opts.leader_election_renew_interval.unwrap_or_else(|| {
            default_renew_interval(
                opts.leader_election_renew_deadline,
                opts.leader_election_retry_period,
            )
        }),
        retry_period: opts.leader_election_retry_period,
    }
    .check()
}

/// The cluster pool with Cilium's start-up checks.
pub fn cluster_pool(opts: &OperatorOptions) -> Result<ClusterPoolConfig, ClusterPoolError> {
    let mut cluster_pool = ClusterPoolConfig {
        enable_ipv4: opts.enable_ipv4,
        enable_ipv6: opts.enable_ipv6,
        ipv4_mask_size: opts.cluster.cluster_pool_ipv4_mask_size,
        ipv6_mask_size: opts.cluster.cluster_pool_ipv6_mask_size,
        ..ClusterPoolConfig::default()
    };
    opts.cluster.pool_lists(&mut cluster_pool)?;
    cluster_pool.validate()?;
    Ok(cluster_pool)
}

/// `<host name>-<pid>`, unique per replica (a pod's host name is the pod's name).
fn default_identity() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "podnet-operator".into());
    format!("{host}-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_dir::TestDir;

    fn cluster_pool_of(c: &OperatorConfig) -> &ClusterPoolConfig {
        match &c.ipam {
            OperatorIpam::ClusterPool(Ok(p)) => p,
            OperatorIpam::ClusterPool(Err(e)) => panic!("refused: {e}"),
            OperatorIpam::MultiPool { .. } => panic!("multi-pool: {c:?}"),
        }
    }

    fn resolve(args: &[&str]) -> Result<OperatorConfig, Box<dyn std::error::Error>> {
        let mut all = vec!["--k8s-kubeconfig-path", "/dev/null"];
        all.extend_from_slice(args);
        let args: Vec<String> = all.iter().map(|s| s.to_string()).collect();
        let opts = OperatorOptions::parse_with_config_dir(&args)?;
        let config = OperatorConfig::resolve(&opts)?;
        // The cluster pool's own refusal (the operator decides what it means).
        if let OperatorIpam::ClusterPool(Err(e)) = &config.ipam {
            return Err(e.clone().into());
        }
        Ok(config)
    }

    #[test]
    fn cluster_pool_with_ciliums_checks() {
        let c = resolve(&["--cluster-pool-ipv4-cidr", "10.90.0.0/23"]).unwrap();
        assert_eq!(cluster_pool_of(&c).ipv4_mask_size, 24);
        assert_eq!(cluster_pool_of(&c).ipv6_mask_size, 112);
        assert_eq!(c.namespace, "kube-system");
        assert!(
            c.identity.ends_with(&format!("-{}", std::process::id())),
            "{}",
            c.identity
        );
        assert_eq!(
            resolve(&[]).unwrap_err().to_string(),
            "cluster-pool-ipv4-cidr must be provided when using ClusterPool"
        );
        assert_eq!(
            resolve(&[
                "--cluster-pool-ipv4-cidr=10.0.0.0/8",
                "--cluster-pool-ipv6-cidr=fd00::/104"
            ])
            .unwrap_err()
            .to_string(),
            "cluster-pool-ipv6-cidr must not be set if IPv6 is disabled"
        );
        let e = resolve(&[
            "--cluster-pool-ipv4-cidr=10.0.0.0/8",
            "--enable-ipv6",
            "--cluster-pool-ipv6-cidr=fd00::/104",
            "--cluster-pool-ipv6-mask-size=121",
        ])
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("New CIDR set failed")
                && e.ends_with("cluster-pool-ipv6-mask-size must be /104 to /120 for fd00::/104"),
            "{e}"
        );
    }

    #[test]
    fn a_mask_size_that_does_not_fit_its_pool_cidr_names_the_option_and_both_values() {
        let v6 = |mask: &str| {
            resolve(&[
                "--cluster-pool-ipv4-cidr=10.0.0.0/8",
                "--enable-ipv6",
                "--cluster-pool-ipv6-cidr=fd00::/104",
                &format!("--cluster-pool-ipv6-mask-size={mask}"),
            ])
            .unwrap_err()
            .to_string()
        };
        let v4 = |mask: &str| {
            resolve(&[
                "--cluster-pool-ipv4-cidr=10.0.0.0/16",
                &format!("--cluster-pool-ipv4-mask-size={mask}"),
            ])
            .unwrap_err()
            .to_string()
        };
        for (e, start, end) in [
            (
                v6("96"),
                "unable to initialize IPv6 allocator: cluster-pool-ipv6-cidr fd00::/104 with \
                 cluster-pool-ipv6-mask-size 96: ",
                "it must be /104 or longer",
            ),
            (
                v6("129"),
                "unable to initialize IPv6 allocator: cluster-pool-ipv6-cidr fd00::/104 with \
                 cluster-pool-ipv6-mask-size 129: SubNetMask is invalid",
                "cluster-pool-ipv6-mask-size must be /104 to /120 for fd00::/104",
            ),
            (
                v4("12"),
                "unable to initialize IPv4 allocator: cluster-pool-ipv4-cidr 10.0.0.0/16 with \
                 cluster-pool-ipv4-mask-size 12: ",
                "it must be /16 or longer",
            ),
            (
                v4("33"),
                "unable to initialize IPv4 allocator: cluster-pool-ipv4-cidr 10.0.0.0/16 with \
                 cluster-pool-ipv4-mask-size 33: SubNetMask is invalid",
                "cluster-pool-ipv4-mask-size must be /16 to /32 for 10.0.0.0/16",
            ),
        ] {
            assert!(e.starts_with(start) && e.ends_with(end), "{e}");
        }
        // A mask equal to the CIDR's prefix is one node's CIDR: Cilium takes it.
        resolve(&[
            "--cluster-pool-ipv4-cidr=10.0.0.0/8",
            "--enable-ipv6",
            "--cluster-pool-ipv6-cidr=fd00::/104",
            "--cluster-pool-ipv6-mask-size=104",
        ])
        .unwrap();
    }

    #[test]
    fn lb_and_node_ipam_options() {
        let c = resolve(&["--cluster-pool-ipv4-cidr", "10.90.0.0/23"]).unwrap();
        let lb = c.lb_ipam.unwrap();
        assert_eq!(lb.default_ipam, DefaultIpam::Lbipam);
        assert!(lb.ipv4 && !lb.ipv6);
        assert!(c.node_ipam.is_none());
        let c = resolve(&[
            "--cluster-pool-ipv4-cidr=10.90.0.0/23",
            "--default-lb-service-ipam=nodeipam",
            "--enable-node-ipam",
        ])
        .unwrap();
        assert_eq!(c.lb_ipam.unwrap().default_ipam, DefaultIpam::Nodeipam);
        assert_eq!(c.node_ipam, Some(DefaultIpam::Nodeipam));
        let c = resolve(&[
            "--cluster-pool-ipv4-cidr=10.90.0.0/23",
            "--enable-lb-ipam=false",
        ])
        .unwrap();
        assert!(c.lb_ipam.is_none());
        let e = resolve(&[
            "--cluster-pool-ipv4-cidr=10.90.0.0/23",
            "--default-lb-service-ipam=metallb",
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("possible values: lbipam, nodeipam, none"), "{e}");
    }

    #[test]
    fn multi_pool_with_pools_to_auto_create() {
        let c = resolve(&["--ipam", "multi-pool"]).unwrap();
        assert!(
            matches!(&c.ipam, OperatorIpam::MultiPool { auto_create, migrate_into: None } if auto_create.is_empty())
        );
        let c = resolve(&[
            "--ipam=multi-pool",
            "--auto-create-cilium-pod-ip-pools=default=ipv4-cidrs:10.10.0.0/16;ipv4-mask-size:24",
        ])
        .unwrap();
        let OperatorIpam::MultiPool { auto_create, .. } = &c.ipam else {
            panic!("{c:?}");
        };
        assert_eq!(auto_create[0].name, "default");
        let e = resolve(&[
            "--cluster-pool-ipv4-cidr=10.0.0.0/8",
            "--auto-create-cilium-pod-ip-pools=default=ipv4-cidrs:10.10.0.0/16;ipv4-mask-size:24",
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("needs --ipam multi-pool"), "{e}");
        let e = resolve(&["--ipam", "eni"]).unwrap_err().to_string();
        assert!(e.contains("use cluster-pool or multi-pool"), "{e}");
    }

    #[test]
    fn the_migration_option_names_the_default_pool() {
        let into = |args: &[&str]| match resolve(args).map(|c| c.ipam) {
            Ok(OperatorIpam::MultiPool { migrate_into, .. }) => Ok(migrate_into),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e),
        };
        let on = "--enable-cluster-pool-to-multi-pool-migration";
        assert_eq!(
            into(&["--ipam=multi-pool", on]).unwrap(),
            Some("default".into())
        );
        assert_eq!(
            into(&["--ipam=multi-pool", on, "--ipam-default-ip-pool=blue"]).unwrap(),
            Some("blue".into())
        );
        assert_eq!(into(&["--ipam=multi-pool"]).unwrap(), None);
        let e = into(&["--ipam=multi-pool", on, "--ipam-default-ip-pool="])
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs --ipam-default-ip-pool"), "{e}");
        let e = resolve(&["--cluster-pool-ipv4-cidr=10.0.0.0/8", on])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("enable-cluster-pool-to-multi-pool-migration needs --ipam multi-pool"),
            "{e}"
        );
    }

    #[test]
    fn the_leader_election_timing_is_ciliums_options_and_the_renew_interval() {
        let pool = "--cluster-pool-ipv4-cidr=10.0.0.0/8";
        assert_eq!(resolve(&[pool]).unwrap().election, Timing::default());
        let c = resolve(&[
            pool,
            "--leader-election-lease-duration=30s",
            "--leader-election-renew-deadline=20s",
            "--leader-election-retry-period=4s",
        ])
        .unwrap();
        assert_eq!(
            (c.election.lease_duration, c.election.renew_interval),
            (Duration::from_secs(30), Duration::from_secs(10))
        );
        let c = resolve(&[pool, "--leader-election-renew-interval=8s"]).unwrap();
        assert_eq!(c.election.renew_interval, Duration::from_secs(8));
        let dir = TestDir::new("opelection");
        std::fs::write(dir.join("leader-election-retry-period"), "1s\n").unwrap();
        let d = dir.display().to_string();
        let c = resolve(&[pool, "--config-dir", &d]).unwrap();
        assert_eq!(c.election.retry_period, Duration::from_secs(1));
        let e = resolve(&[pool, "--leader-election-renew-deadline=15s"])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--leader-election-renew-deadline (15s) must be shorter than --leader-election-lease-duration"),
            "{e}"
        );
    }

    #[test]
    fn options_from_a_config_dir_under_flags() {
        let dir = TestDir::new("opdir");
        std::fs::write(dir.join("cluster-pool-ipv4-cidr"), "10.9.0.0/16\n").unwrap();
        std::fs::write(dir.join("cluster-pool-ipv4-mask-size"), "26").unwrap();
        std::fs::write(dir.join("leader-election-namespace"), "podnet").unwrap();
        std::fs::write(dir.join("socket"), "daemon-only option").unwrap();
        let d = dir.display().to_string();
        let c = resolve(&[
            "--config-dir",
            &d,
            "--cluster-pool-ipv4-mask-size=28",
            "--identity=op-a",
        ])
        .unwrap();
        assert_eq!(cluster_pool_of(&c).ipv4_cidrs[0].to_string(), "10.9.0.0/16");
        assert_eq!(cluster_pool_of(&c).ipv4_mask_size, 28);
        assert_eq!(c.namespace, "podnet");
        assert_eq!(c.identity, "op-a");
    }

    #[test]
    fn extra_cidrs_default_to_two_and_0_turns_them_off() {
        let c = resolve(&["--cluster-pool-ipv4-cidr", "10.90.0.0/23"]).unwrap();
        assert_eq!(c.extra_cidrs_max, 2);
        let c = resolve(&[
            "--cluster-pool-ipv4-cidr",
            "10.90.0.0/23",
            "--cluster-pool-extra-cidrs-max=0",
        ])
        .unwrap();
        assert_eq!(c.extra_cidrs_max, 0);
        let e = resolve(&["--cluster-pool-extra-cidrs-max=-1"]).unwrap_err();
        assert!(
            e.to_string().contains("cluster-pool-extra-cidrs-max"),
            "{e}"
        );
    }
}
