//! `podnet operator`: the cluster-wide IPAM operator (Cilium's `cilium-operator`,
//! cluster-pool and multi-pool modes). Replicas elect a leader on a Lease
//! ([`lease`]); only the leader allocates: it re-reads every CiliumNode, re-adopts
//! what they hold, then follows every CiliumNode in one loop ([`node_loop`],
//! writing through [`node_api`]) that drives the allocator of the mode. In
//! cluster-pool ([`cluster_pool`]) it gives every node without CIDRs one per
//! enabled family from the cluster pool (over the cidrset of `ipam`), writes them
//! with server-side apply under its own field manager, and reports exhaustion in
//! the node's `status.ipam.operator-status.error` until room appears; in
//! multi-pool ([`multi_pool`]) it carves blocks of the CiliumPodIPPools until
//! each node's request is met and takes back what nodes release, adopting the
//! node CIDRs of nodes that ran cluster-pool with
//! `--enable-cluster-pool-to-multi-pool-migration` (pools of
//! `--auto-create-cilium-pod-ip-pools` are created first). A replica
//! that loses the lease exits (its Deployment restarts it as a follower). At start
//! each replica registers the CRDs the API server lacks ([`crds`]), unless told to
//! skip it. `podnet operator status` ([`status`]) shows the leader and every
//! node's CIDRs as the API server has them. Next to the node allocator, the leader
//! runs LB IPAM ([`lbipam`]), when enabled Node IPAM ([`nodeipam`]) and the
//! ClusterNetworkPolicies' status and Events ([`cluster_policy_status`]), and the
//! periodic duplicate check ([`duplicate_check`]: two Pods with one IP, a Pod IP
//! outside its node's ranges, a range on two CiliumNodes).

pub mod cluster_policy_status;
pub mod cluster_pool;
mod crds;
pub mod duplicate_check;
pub mod lbipam;
pub mod lease;
pub mod metrics;
pub mod multi_pool;
mod node_api;
pub mod node_loop;
pub mod nodeipam;
pub mod options;
pub mod retry;
mod status;

use std::sync::Arc;

use crate::ipam::clusterpool::{
    ClusterPoolConfig, ClusterPoolError, NodeCidrCarver, POOL_IN_FORCE_ANNOTATION,
};
use crate::k8s::connect::{ConnectError, connect};
use crate::k8s::mirror::WatchEnded;
use crate::process::metrics_server::MetricsBindError;
use crate::process::options::OptionsError;
use crate::process::{metrics_server, shutdown_signal};
use cluster_pool::NodeCidrs;
use crds::CrdError;
use lease::Elector;
use metrics::OperatorMetrics;
use options::{ConfigError, OperatorConfig, OperatorIpam, OperatorOptions};

/// The field manager of the operator's CiliumNode applies.
pub const FIELD_MANAGER: &str = "podnet-operator";

/// Entry point of `podnet operator` (and of `podnet operator status`); returns the
/// process exit code.
pub fn run(args: &[String]) -> i32 {
    if let Some(("status", rest)) = args.split_first().map(|(a, r)| (a.as_str(), r)) {
        return status::run(rest);
    }
    let opts = match OperatorOptions::parse_with_config_dir(args) {
        Ok(o) => o,
        Err(OptionsError::Flags(e)) => e.exit(),
        Err(e @ OptionsError::ConfigDir { .. }) => {
            eprintln!("podnet operator: {e}");
            return 1;
        }
    };
    crate::logging::init_stderr(&opts.log_level);
    match start(args, &opts) {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("podnet operator: {e}");
            1
        }
    }
}

/// What the leader runs.
enum Allocator {
    /// Node CIDRs from the cluster pool (and the pool the replica started
    /// with; None: the options of its ConfigMap did not parse, and it leads
    /// with the pool in force: `cluster_pool::reload`'s rule).
    ClusterPool(Option<(NodeCidrCarver, ClusterPoolConfig)>),
    /// Blocks of the CiliumPodIPPools (the pools to create first when
    /// missing, the migration's default pool when enabled).
    MultiPool(Vec<crate::ipam::pooldef::PoolDef>, Option<String>),
}

/// What the leader runs, set up.
enum Leading {
    ClusterPool(Box<NodeCidrs>, ClusterPoolConfig),
    MultiPool(Vec<crate::ipam::pooldef::PoolDef>, Option<String>),
}

/// Why the operator stopped short.
#[derive(Debug, thiserror::Error)]
enum OperatorError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    ClusterPool(#[from] ClusterPoolError),
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The metrics listener cannot be bound.
    #[error(transparent)]
    Metrics(#[from] MetricsBindError),
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error(transparent)]
    Crds(#[from] CrdError),
    #[error("leader election lost: {0}")]
    LeadershipLost(String),
    /// Leading with no cluster pool to run on.
    #[error("cannot lead: {0}")]
    NoClusterPool(String),
    #[error(transparent)]
    WatchEnded(#[from] WatchEnded),
}

/// Why the leader stopped.
enum Stop {
    Lost(String),
    WatchEnded(WatchEnded),
    Signal,
}

/// `args` is the command line `opts` came from: the cluster pool is read
/// again from it while the leader runs.
fn start(args: &[String], opts: &OperatorOptions) -> Result<(), OperatorError> {
    let config = OperatorConfig::resolve(opts)?;
    let allocator = starting_allocator(args, &config)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(OperatorError::Runtime)?;
    runtime.block_on(async move {
        let metrics = Arc::new(OperatorMetrics::new());
        if !opts.prometheus_serve_addr.is_empty() {
            spawn_metrics_server(&opts.prometheus_serve_addr, &metrics).await?;
        }
        let client = connect(config.kubeconfig.as_ref()).await?;
        if !opts.skip_crd_creation {
            tokio::select! {
                done = crds::register_missing_waiting(&client) => { done?; }
                _ = shutdown_signal() => return Ok(()),
            }
        }
        tracing::info!(identity = %config.identity, namespace = %config.namespace, lease = lease::LEASE_NAME, "podnet operator started; waiting to lead");
        let mut elector = Elector::new(client.clone(), &config.namespace, &config.identity, config.election);
        tokio::select! {
            _ = elector.acquire() => {}
            _ = shutdown_signal() => return Ok(()),
        }
        metrics.is_leader.set(1);
        let allocator = match allocator {
            Allocator::ClusterPool(started) => {
                let recorded = elector.annotation(POOL_IN_FORCE_ANNOTATION);
                match cluster_pool::reload::at_leading(args, started, recorded.as_deref()) {
                    Ok((carver, pool)) => {
                        let (record, carried) = tokio::sync::watch::channel(None);
                        elector.carry(POOL_IN_FORCE_ANNOTATION, carried);
                        let cidrs = NodeCidrs::new(carver, config.extra_cidrs_max).recording(&pool, record);
                        Leading::ClusterPool(Box::new(cidrs), pool)
                    }
                    Err(why) => {
                        metrics.is_leader.set(0);
                        elector.release().await;
                        return Err(OperatorError::NoClusterPool(why));
                    }
                }
            }
            Allocator::MultiPool(auto_create, migrate_into) => Leading::MultiPool(auto_create, migrate_into),
        };
        let allocate = async {
            match allocator {
                Leading::ClusterPool(cidrs, pool) => {
                    let reload = (args.to_vec(), pool);
                    cluster_pool::run(client.clone(), *cidrs, reload, &config.identity, &metrics).await
                }
                Leading::MultiPool(auto_create, migrate_into) => {
                    multi_pool::run(client.clone(), auto_create, migrate_into, &metrics).await
                }
            }
        };
        let beside = beside_the_allocator(&client, &config, &metrics);
        let duplicates = async {
            match config.duplicate_check {
                Some(interval) => duplicate_check::run(client.clone(), &config.identity, interval, &metrics).await,
                None => std::future::pending().await,
            }
        };
        let stop = tokio::select! {
            why = elector.keep_renewing() => Stop::Lost(why),
            ended = allocate => Stop::WatchEnded(ended),
            why = beside => Stop::WatchEnded(why),
            never = duplicates => match never {},
            _ = shutdown_signal() => Stop::Signal,
        };
        metrics.is_leader.set(0);
        match stop {
            Stop::Lost(why) => Err(OperatorError::LeadershipLost(why)),
            Stop::WatchEnded(ended) => {
                elector.release().await;
                Err(ended.into())
            }
            Stop::Signal => {
                elector.release().await;
                tracing::info!("podnet operator stopped");
                Ok(())
            }
        }
    })
}

/// The leader's loops beside the allocator, each when `config` turns it on:
/// LB IPAM, Node IPAM, the ClusterNetworkPolicies' status. Ends when the first
/// of their watches ends (never when none runs).
async fn beside_the_allocator(
    client: &kube::Client,
    config: &OperatorConfig,
    metrics: &OperatorMetrics,
) -> WatchEnded {
    let lb_ipam = async {
        match config.lb_ipam {
            Some(settings) => {
                lbipam::controller::run(client.clone(), settings, metrics.lbipam.clone()).await
            }
            None => std::future::pending().await,
        }
    };
    let node_ipam = async {
        match config.node_ipam {
            Some(default_ipam) => nodeipam::controller::run(client.clone(), default_ipam).await,
            None => std::future::pending().await,
        }
    };
    let cluster_policies = async {
        match config.cluster_network_policy {
            true => cluster_policy_status::run(client.clone(), &config.identity).await,
            false => std::future::pending().await,
        }
    };
    tokio::select! {
        why = lb_ipam => why,
        why = node_ipam => why,
        why = cluster_policies => why,
    }
}

/// The allocator the operator starts with, from the resolved config: for a
/// cluster pool, the carver of the pool the options give (none when they do not
/// parse but the pool is a live-edited ConfigMap: the leader then runs on the
/// pool in force).
fn starting_allocator(
    args: &[String],
    config: &OperatorConfig,
) -> Result<Allocator, OperatorError> {
    let allocator = match &config.ipam {
        OperatorIpam::ClusterPool(pool) => {
            let started = pool
                .clone()
                .and_then(|pool| NodeCidrCarver::new(&pool).map(|carver| (carver, pool)));
            match started {
                Ok(started) => Allocator::ClusterPool(Some(started)),
                // A pool in the ConfigMap, edited live: lead with the pool in force.
                Err(e) if cluster_pool::reload::has_config_dir(args) => {
                    tracing::error!(error = %e, "the cluster pool options do not parse; when leading, the operator runs on the pool in force its Lease records");
                    Allocator::ClusterPool(None)
                }
                Err(e) => return Err(e.into()),
            }
        }
        OperatorIpam::MultiPool {
            auto_create,
            migrate_into,
        } => Allocator::MultiPool(auto_create.clone(), migrate_into.clone()),
    };
    Ok(allocator)
}

/// Binds the metrics endpoint at `addr` and serves `metrics` on it in a task.
async fn spawn_metrics_server(
    addr: &str,
    metrics: &Arc<OperatorMetrics>,
) -> Result<(), OperatorError> {
    let tcp = metrics_server::bind_metrics(addr).await?;
    let m = metrics.clone();
    tokio::spawn(metrics_server::serve_metrics(tcp, move || {
        let m = m.clone();
        async move { m.encode() }
    }));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mask_size_that_does_not_fit_stops_the_operator_before_it_connects() {
        let args: Vec<String> = [
            "--k8s-kubeconfig-path",
            "/dev/null",
            "--cluster-pool-ipv4-cidr=10.0.0.0/8",
            "--enable-ipv6",
            "--cluster-pool-ipv6-cidr=fd00::/104",
            "--cluster-pool-ipv6-mask-size=96",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        // `run` logs this error, prints it and exits 1 (not called here: it
        // would install the process's log subscriber for every other test).
        let opts = OperatorOptions::parse_with_config_dir(&args).unwrap();
        let e = start(&args, &opts).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "unable to initialize IPv6 allocator: cluster-pool-ipv6-cidr fd00::/104 with \
                 cluster-pool-ipv6-mask-size 96"
            ),
            "{e}"
        );
    }
}
