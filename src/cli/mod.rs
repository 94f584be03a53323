//! The subcommands: `podnet status`, `explain`, `observe`, `plan`, `lint`, `install`,
//! `ipam check` and `version` live here; `daemon` and `operator` dispatch to their own modules (as
//! does the plugin). They reach the daemon only through the API client.

mod cidr_groups;
pub mod explain;
pub mod install;
pub mod ipam_check;
pub mod lint;
pub mod lint_finding;
pub mod observe;
pub mod plan;
mod plan_extra;
pub mod status;

use clap::{Parser, Subcommand};

/// podnet: Kubernetes CNI plugin with an embedded node IPAM daemon.
#[derive(Debug, Parser)]
#[command(name = "podnet", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node daemon (options: `podnet daemon --help`).
    #[command(disable_help_flag = true)]
    Daemon {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run the cluster-wide IPAM operator (options: `podnet operator --help`); `podnet
    /// operator status` shows the leader and every node's CIDRs.
    #[command(disable_help_flag = true)]
    Operator {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Show the daemon's IPAM status.
    Status(status::StatusArgs),
    /// Explain why a pod, address or container has its address, or none.
    Explain(explain::ExplainArgs),
    /// Stream the packets NetworkPolicy denies on this node (or, in audit
    /// mode, would deny): both pods, port, direction, verdict and policy.
    Observe(observe::ObserveArgs),
    /// Copy this binary into the CNI bin dir atomically (DaemonSet init step).
    Install(install::InstallArgs),
    /// Check daemon options, pools, metadata and conflists before an install.
    #[command(disable_help_flag = true)]
    Lint {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Cluster-wide IPAM checks as the cluster admin (`podnet ipam check`).
    Ipam {
        #[command(subcommand)]
        command: ipam_check::IpamCommand,
    },
    /// Size a cluster: nodes, addresses and pod IPs per node (offline).
    Plan(plan::PlanArgs),
    /// Print the CustomResourceDefinitions podnet works with (Cilium 1.20's
    /// CiliumNode, CiliumPodIPPool, CiliumNodeConfig, CiliumLoadBalancerIPPool,
    /// CiliumL2AnnouncementPolicy, and sig-network's ClusterNetworkPolicy), for
    /// `kubectl apply -f -` where they are not installed.
    Crds,
    /// Print podnet's version, the CNI versions it speaks and the on-disk formats
    /// it reads.
    Version,
}

/// Runs a subcommand; returns the exit code.
pub fn run(args: Vec<String>) -> i32 {
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    match cli.command {
        Command::Daemon { args } => crate::daemon::run(&args),
        Command::Operator { args } => crate::operator::run(&args),
        Command::Status(a) => status::run(&a),
        Command::Explain(a) => explain::run(&a),
        Command::Observe(a) => observe::run(&a),
        Command::Install(a) => install::run(&a),
        Command::Ipam { command } => ipam_check::run(&command),
        Command::Plan(a) => plan::run(&a),
        Command::Lint { args } => lint::run(&args),
        Command::Crds => {
            let crds = crate::resources::CRD_MANIFESTS.join("---\n");
            print!(
                "{crds}---\n{}",
                crate::resources::CLUSTER_NETWORK_POLICY_CRD
            );
            0
        }
        Command::Version => {
            println!("podnet {}", env!("CARGO_PKG_VERSION"));
            println!(
                "CNI spec versions: {}",
                crate::cni::SUPPORTED_VERSIONS.join(", ")
            );
            println!(
                "on-disk formats: journal {}, DEL queue {} (reads these and older)",
                crate::store::JOURNAL_FORMAT,
                crate::api::delete_queue::QUEUE_FORMAT
            );
            0
        }
    }
}
