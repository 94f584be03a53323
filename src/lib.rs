//! podnet: a Kubernetes CNI plugin with an embedded node IPAM daemon.
//!
//! One binary plays two roles: the CNI plugin (when `CNI_COMMAND` is set) and the
//! node daemon plus operator tools (subcommands). Dependencies point one way:
//! `resources` (the typed Kubernetes and Cilium objects) depends on nothing;
//! `cni` and `ipam` know nothing of netlink or HTTP, and `ipam` reads resources
//! only from `resources`; `node` uses `ipam`, `resources` and `k8s` (the Kubernetes access layer: which
//! version of each Cilium kind the API server serves); `plugin` uses `cni`,
//! `datapath` and `api`; `api` takes its identifier rules from `cni`, so the plugin
//! and the daemon's API check the same; `daemon` uses `api`, `ipam`, `node`,
//! `store` and `datapath` for its own devices; `operator` (the cluster-wide IPAM
//! operator) uses `ipam`, `resources`, `k8s` and the Kubernetes connection of `node`, and
//! shares the option reader and the metrics listener of `daemon`; `policy`
//! (NetworkPolicy, compiled to nftables) reads `k8s_openapi` objects and writes
//! through `nft`; `controller` (the one loop of a controller that watches and
//! writes, and podnet's one backoff) uses only `k8s`, and `daemon` and
//! `operator` run their controllers on it.

pub mod api;
pub mod arena;
pub mod atomic_file;
pub mod cli;
pub mod cni;
pub mod controller;
pub mod daemon;
pub mod datapath;
pub mod heap_backing;
pub mod ipam;
pub mod k8s;
pub mod l2announce;
pub mod logging;
pub mod nft;
pub mod node;
pub mod operator;
pub mod plugin;
pub mod policy;
pub mod process;
pub mod resources;
pub mod store;
#[cfg(test)]
mod test_dir;
#[cfg(test)]
mod test_skip;

/// Runs the binary: the CNI plugin when `CNI_COMMAND` is set and non-empty, else a
/// subcommand. Returns the exit code (the plugin exits itself, see `plugin::exit`).
pub fn run() -> i32 {
    match std::env::var("CNI_COMMAND") {
        Ok(c) if !c.is_empty() => plugin::exit(plugin::run()),
        _ => cli::run(std::env::args().collect()),
    }
}
