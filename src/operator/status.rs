//! `podnet operator status`: the cluster's IPAM as the API server has it. Reads the
//! leader Lease and every CiliumNode once and prints who leads and when it last
//! renewed, each node's CIDRs (cluster-pool podCIDRs and multi-pool blocks), router
//! address and operator error, the agent's verdict on each cluster-pool CIDR and
//! what it calls for (an extra CIDR asked, at the cap, one given back), and, when
//! the cluster pool is given (the operator's
//! own options, flags or `--config-dir`), each family's node CIDRs counted through
//! the operator's cidrset: total, in use, free. It also reads the CiliumPodIPPools
//! and counts each pool's blocks in use and free by re-adopting every node's blocks
//! through the multi-pool operator's bookkeeping; blocks the current definitions do
//! not accept (a refused edit) are listed. It lists every Pod too (one
//! cluster-wide list) and shows the duplicate check's findings now
//! (`ipam::duplicates`, as the leader's periodic check and `podnet ipam check`
//! find them). `-o json` for scripts.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use ipnet::IpNet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, ListParams};
use serde::Serialize;

use super::cluster_pool::extra::{self, OPT_EXTRA_CIDRS_MAX, parse_status};
use super::lease::LEASE_NAME;
use super::multi_pool::blocks::{ObservedNode, PoolBlocks as PoolBookkeeping};
use super::options::ClusterOptions;
use crate::ipam::CidrSet;
use crate::ipam::Family;
use crate::ipam::cidr_depletion::is_first;
use crate::ipam::clusterpool::{
    ClusterPoolConfig, ClusterPoolError, NodeCidrCarver, OPT_IPV4_CIDR, POOL_IN_FORCE_ANNOTATION,
    cidr_option,
};
use crate::ipam::duplicates::{Finding, PodView, check, finding_lines};
use crate::ipam::pooldef::PoolDef;
use crate::k8s::address_views::{list_pods, node_ranges};
use crate::k8s::connect::{ConnectError, kube_config};
use crate::k8s::discovery::{CiliumKind, DiscoveryError, resolve};
use crate::k8s::objects::{ListError, node_resource};
use crate::k8s::pool_watch::list_pools;
use crate::process::options::{OptionsError, parse_command_with_config_dir};
use crate::resources::{AllocatedPool, PodCidrState};

/// How long the reads may take before the API server counts as unreachable.
const READ_TIMEOUT: Duration = Duration::from_secs(15);

/// `podnet operator status` options (the operator's names, so its flags and its
/// `--config-dir` work as they are).
#[derive(Debug, Clone, Args)]
pub struct StatusOptions {
    #[command(flatten)]
    pub cluster: ClusterOptions,

    /// Output format: text or json.
    #[arg(short = 'o', long = "output", default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
}

#[derive(Debug, clap::Parser)]
#[command(
    name = "podnet operator status",
    about = "The operator's leader, every CiliumNode's CIDRs, router and error, and the cluster pool's free node CIDRs",
    args_override_self = true
)]
struct StatusCommand {
    #[command(flatten)]
    opts: StatusOptions,
}

/// The leader Lease as read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Leader {
    pub lease: String,
    pub holder: String,
    pub renew_time: Option<String>,
    pub renewed_seconds_ago: Option<i64>,
    pub lease_duration_seconds: Option<i32>,
    /// Not renewed within its duration: no replica leads.
    pub expired: bool,
    /// The cluster pool in force the leader records on the Lease
    /// (`podnet.io/cluster-pool-in-force`; None: none recorded).
    pub pool_in_force: Option<String>,
}

/// One pool's blocks on a node (`spec.ipam.pools.allocated[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PoolBlocks {
    pub pool: String,
    pub cidrs: Vec<IpNet>,
}

/// One CiliumNode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeLine {
    pub name: String,
    #[serde(rename = "podCIDRs")]
    pub pod_cidrs: Vec<IpNet>,
    pub pools: Vec<PoolBlocks>,
    /// `spec.addresses` of type CiliumInternalIP.
    pub router: Vec<String>,
    /// `status.ipam.operator-status.error` ("" = none).
    pub error: String,
    /// Cluster-pool: the agent's verdict on each CIDR (`status.ipam.pod-cidrs`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub cidr_status: BTreeMap<IpNet, PodCidrState>,
    /// Cluster-pool: what the verdicts call for (an extra CIDR asked, at the cap,
    /// one given back; "" = nothing).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub extra: String,
    /// Why the object could not be read ("" = it could).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub unreadable: String,
}

/// A family's node CIDRs in the cluster pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolSpace {
    pub family: &'static str,
    pub cidrs: Vec<IpNet>,
    pub mask_size: u8,
    pub total: u64,
    pub in_use: u64,
    pub free: u64,
}

/// A CiliumPodIPPool's blocks (multi-pool).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodPoolSpace {
    pub name: String,
    /// `<family> <cidrs> in /<maskSize>s` per family.
    pub definition: Vec<String>,
    pub blocks_in_use: u64,
    pub blocks_free: u64,
}

/// Everything `podnet operator status` shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// None: there is no Lease (no operator has run).
    pub leader: Option<Leader>,
    pub nodes: Vec<NodeLine>,
    pub pool: Vec<PoolSpace>,
    pub pod_pools: Vec<PodPoolSpace>,
    /// Blocks the pools as defined now do not accept (one line each).
    pub pod_pool_problems: Vec<String>,
    /// The duplicate check's findings now.
    pub findings: Vec<Finding>,
    /// Cluster-pool: the nodes holding ranges in no pool CIDR (of a pool CIDR
    /// removed from the options: it drains until they are gone).
    pub draining: Vec<DrainingNode>,
    /// Why the pool options given do not parse (the pool in force the Lease
    /// records is counted instead).
    pub pool_refused: Option<String>,
}

/// A node on a removed pool CIDR.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DrainingNode {
    pub node: String,
    pub cidrs: Vec<IpNet>,
}

/// Entry point of `podnet operator status`; returns the exit code.
pub fn run(args: &[String]) -> i32 {
    let opts = match parse(args) {
        Ok(o) => o,
        Err(OptionsError::Flags(e)) => e.exit(),
        Err(e @ OptionsError::ConfigDir { .. }) => {
            eprintln!("podnet operator status: {e}");
            return 1;
        }
    };
    match status(&opts) {
        Ok(report) if opts.output == "json" => match serde_json::to_string_pretty(&report) {
            Ok(s) => {
                println!("{s}");
                0
            }
            Err(e) => {
                eprintln!("podnet operator status: {e}");
                1
            }
        },
        Ok(report) => {
            print!("{}", text(&report));
            0
        }
        Err(e) => {
            eprintln!("podnet operator status: {e}");
            1
        }
    }
}

fn parse(args: &[String]) -> Result<StatusOptions, OptionsError> {
    parse_command_with_config_dir::<StatusCommand>(args).map(|c| c.opts)
}

/// Why there is no report.
#[derive(Debug, thiserror::Error)]
enum StatusError {
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("{what}: the API server at {url} answered: {status}")]
    Refused {
        what: &'static str,
        url: String,
        status: Box<kube::core::Status>,
    },
    #[error("cannot reach the API server at {url} ({what}): {source}")]
    Unreachable {
        what: &'static str,
        url: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    #[error(transparent)]
    List(#[from] ListError),
    #[error("cannot reach the API server at {url}: no answer within {}s", READ_TIMEOUT.as_secs())]
    Timeout { url: String },
}

/// The cluster pool's carver, when a pool is given.
fn carver(opts: &StatusOptions) -> Result<Option<NodeCidrCarver>, ClusterPoolError> {
    let mut config = ClusterPoolConfig {
        ipv4_mask_size: opts.cluster.cluster_pool_ipv4_mask_size,
        ipv6_mask_size: opts.cluster.cluster_pool_ipv6_mask_size,
        ..ClusterPoolConfig::default()
    };
    opts.cluster.pool_lists(&mut config)?;
    if config.ipv4_cidrs.is_empty() && config.ipv6_cidrs.is_empty() {
        return Ok(None);
    }
    config.enable_ipv4 = !config.ipv4_cidrs.is_empty();
    config.enable_ipv6 = !config.ipv6_cidrs.is_empty();
    NodeCidrCarver::new(&config).map(Some)
}

fn status(opts: &StatusOptions) -> Result<Report, StatusError> {
    let (carver, pool_refused) = match carver(opts) {
        Ok(carver) => (carver, None),
        Err(e) => (None, Some(e.to_string())),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(StatusError::Runtime)?;
    let ns = &opts.cluster.leader_election_namespace;
    let (nodes, lease, defs, pods) =
        runtime.block_on(read(opts.cluster.k8s_kubeconfig_path.as_ref(), ns))?;
    // Options that do not parse (a ConfigMap edit): count the pool in force.
    let carver = carver.or_else(|| {
        pool_refused.as_ref()?;
        let record = lease.as_ref()?.metadata.annotations.as_ref()?;
        let pool = ClusterPoolConfig::from_record(record.get(POOL_IN_FORCE_ANNOTATION)?).ok()?;
        NodeCidrCarver::new(&pool).ok()
    });
    let mut r = report(&nodes, lease.as_ref(), ns, carver, Timestamp::now());
    r.pool_refused = pool_refused;
    for n in &mut r.nodes {
        n.extra = extra_note(n, opts.cluster.cluster_pool_extra_cidrs_max);
    }
    (r.pod_pools, r.pod_pool_problems) = pod_pools(&defs, &r.nodes);
    let views: Vec<_> = nodes
        .iter()
        .filter_map(|n| node_resource(n).ok())
        .map(|n| node_ranges(&n))
        .collect();
    r.findings = check(&pods, &views).findings;
    Ok(r)
}

/// What status reads.
type Read = (
    Vec<DynamicObject>,
    Option<Lease>,
    Vec<PoolDef>,
    Vec<PodView>,
);

/// Every CiliumNode, the leader Lease, the CiliumPodIPPools and every Pod.
async fn read(kubeconfig: Option<&PathBuf>, namespace: &str) -> Result<Read, StatusError> {
    let config = kube_config(kubeconfig).await?;
    let url = config.cluster_url.to_string();
    let client = kube::Client::try_from(config).map_err(ConnectError::Client)?;
    let failed = |what: &'static str, e: kube::Error| match e {
        kube::Error::Api(status) => StatusError::Refused {
            what,
            url: url.clone(),
            status,
        },
        source => StatusError::Unreachable {
            what,
            url: url.clone(),
            source,
        },
    };
    // The API server not answering reads as for any other request.
    let discovery = |what: &'static str, e: DiscoveryError| match e {
        DiscoveryError::Api { source, .. } => failed(what, source),
        e => StatusError::Discovery(e),
    };
    let reads = async {
        let nodes_resource = resolve(&client, CiliumKind::Node)
            .await
            .map_err(|e| discovery("listing CiliumNodes", e))?;
        let nodes = Api::<DynamicObject>::all_with(client.clone(), &nodes_resource)
            .list(&ListParams::default())
            .await
            .map_err(|e| failed("listing CiliumNodes", e))?;
        let lease = Api::<Lease>::namespaced(client.clone(), namespace)
            .get_opt(LEASE_NAME)
            .await
            .map_err(|e| failed("reading the leader Lease", e))?;
        // Without a pool CRD (cluster-pool), no pools.
        let pools = match resolve(&client, CiliumKind::PodIpPool).await {
            Ok(resource) => list_pools(&client, &resource).await?,
            Err(e) if e.is_missing_crd() => Vec::new(),
            Err(e) => return Err(discovery("listing CiliumPodIPPools", e)),
        };
        let pods = list_pods(&client)
            .await
            .map_err(|e| failed("listing Pods", e.source))?;
        Ok((nodes.items, lease, pools, pods))
    };
    tokio::time::timeout(READ_TIMEOUT, reads)
        .await
        .map_err(|_| StatusError::Timeout { url: url.clone() })?
}

/// What the objects say, with the pool's space counted by re-adopting every node's
/// CIDRs as the operator does (a CIDR outside the pool, or held twice, counts once
/// or not at all; the node's own operator error tells why).
pub fn report(
    objects: &[DynamicObject],
    lease: Option<&Lease>,
    namespace: &str,
    mut carver: Option<NodeCidrCarver>,
    now: Timestamp,
) -> Report {
    let mut nodes: Vec<NodeLine> = objects.iter().map(node_line).collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let mut pool = Vec::new();
    let mut draining = Vec::new();
    if let Some(carver) = carver.as_mut() {
        for n in &nodes {
            let mut outside = Vec::new();
            for cidr in &n.pod_cidrs {
                // Refused CIDRs (wrong size, taken) are not counted; one in no
                // pool CIDR is held outside them, as the operator does at start.
                let before = carver.outside().len();
                let _ = carver.adopt_after_restart(std::slice::from_ref(cidr));
                if carver.outside().len() > before {
                    outside.push(*cidr);
                }
            }
            if !outside.is_empty() {
                draining.push(DrainingNode {
                    node: n.name.clone(),
                    cidrs: outside,
                });
            }
        }
        for family in [Family::V4, Family::V6] {
            pool.extend(pool_space(carver.sets(family), family));
        }
    }
    let leader = lease.map(|l| leader(l, namespace, now));
    Report {
        leader,
        nodes,
        pool,
        pod_pools: Vec::new(),
        pod_pool_problems: Vec::new(),
        draining,
        findings: Vec::new(),
        pool_refused: None,
    }
}

/// A node's line as its CiliumNode says it (or why the object is not understood).
fn node_line(obj: &DynamicObject) -> NodeLine {
    let name = obj.metadata.name.clone().unwrap_or_default();
    match node_resource(obj) {
        Ok(n) => NodeLine {
            name,
            pod_cidrs: n.spec.ipam.pod_cidrs,
            pools: n
                .spec
                .ipam
                .pools
                .allocated
                .into_iter()
                .map(|p| PoolBlocks {
                    pool: p.pool,
                    cidrs: p.cidrs,
                })
                .collect(),
            router: n
                .spec
                .addresses
                .into_iter()
                .filter(|a| a.kind == "CiliumInternalIP")
                .map(|a| a.ip)
                .collect(),
            error: n.status.ipam.operator_status.error,
            cidr_status: parse_status(&n.status.ipam.pod_cidrs),
            extra: String::new(),
            unreadable: String::new(),
        },
        Err(e) => NodeLine {
            name,
            pod_cidrs: Vec::new(),
            pools: Vec::new(),
            router: Vec::new(),
            error: String::new(),
            cidr_status: BTreeMap::new(),
            extra: String::new(),
            unreadable: e.to_string(),
        },
    }
}

/// The leader as the Lease records it, judged against `now`.
fn leader(l: &Lease, namespace: &str, now: Timestamp) -> Leader {
    let spec = l.spec.clone().unwrap_or_default();
    let renewed = spec.renew_time.as_ref().map(|t| t.0);
    let ago = renewed.map(|t| now.duration_since(t).as_secs());
    let duration = spec.lease_duration_seconds;
    Leader {
        lease: format!("{namespace}/{LEASE_NAME}"),
        holder: spec.holder_identity.unwrap_or_default(),
        renew_time: renewed.map(|t| t.to_string()),
        renewed_seconds_ago: ago,
        lease_duration_seconds: duration,
        expired: match (ago, duration) {
            (Some(ago), Some(d)) => ago > i64::from(d),
            _ => true,
        },
        pool_in_force: l
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(POOL_IN_FORCE_ANNOTATION))
            .cloned(),
    }
}

/// A family's node CIDRs, one line per node mask size (pool CIDRs with their
/// own mask size have lines of their own).
fn pool_space(sets: &[CidrSet], family: Family) -> Vec<PoolSpace> {
    let mut masks: Vec<u8> = Vec::new();
    for s in sets {
        if !masks.contains(&s.node_mask()) {
            masks.push(s.node_mask());
        }
    }
    masks
        .into_iter()
        .map(|mask| {
            let sets: Vec<&CidrSet> = sets.iter().filter(|s| s.node_mask() == mask).collect();
            let total: u64 = sets.iter().map(|s| s.max_cidrs()).sum();
            let in_use: u64 = sets.iter().map(|s| s.allocated_count()).sum();
            PoolSpace {
                family: family.label(),
                cidrs: sets.iter().map(|s| s.cluster()).collect(),
                mask_size: mask,
                total,
                in_use,
                free: total.saturating_sub(in_use),
            }
        })
        .collect()
}

/// The CiliumPodIPPools' blocks in use and free, counted by feeding every node's
/// blocks to the operator's bookkeeping; and what it does not accept.
pub fn pod_pools(defs: &[PoolDef], nodes: &[NodeLine]) -> (Vec<PodPoolSpace>, Vec<String>) {
    let mut blocks = match PoolBookkeeping::new(defs) {
        Ok(b) => b,
        Err(e) => {
            return (
                Vec::new(),
                vec![format!("the pools are invalid together: {e}")],
            );
        }
    };
    let mut problems = Vec::new();
    for n in nodes {
        problems.extend(
            blocks.observe(ObservedNode {
                name: n.name.clone(),
                uid: n.name.clone(),
                allocated: n
                    .pools
                    .iter()
                    .map(|p| AllocatedPool {
                        pool: p.pool.clone(),
                        cidrs: p.cidrs.clone(),
                        ..Default::default()
                    })
                    .collect(),
                // Not migrated yet: their blocks are in use too.
                pod_cidrs: n.pod_cidrs.clone(),
                ..Default::default()
            }),
        );
    }
    let space = blocks.pool_space();
    let pools = defs
        .iter()
        .map(|d| {
            let (in_use, free) = space.get(&d.name).copied().unwrap_or_default();
            PodPoolSpace {
                name: d.name.clone(),
                definition: [Family::V4, Family::V6]
                    .into_iter()
                    .filter_map(|f| {
                        d.family(f).map(|s| {
                            format!("{} {} in /{}s", f.label(), cidr_list(&s.cidrs), s.mask_size)
                        })
                    })
                    .collect(),
                blocks_in_use: in_use,
                blocks_free: free,
            }
        })
        .collect();
    (pools, problems)
}

/// The node's podCIDRs, each with the agent's verdict when it gave one
/// (`10.0.0.0/24 (depleted), 10.0.9.0/24 (extra, in-use)`).
fn judged_cidrs(n: &NodeLine) -> String {
    if n.cidr_status.is_empty() {
        return cidr_list(&n.pod_cidrs);
    }
    n.pod_cidrs
        .iter()
        .map(|c| {
            let state = n
                .cidr_status
                .get(&c.trunc())
                .map_or("not judged", |s| s.as_str());
            match is_first(&n.pod_cidrs, c) {
                true => format!("{c} ({state})"),
                false => format!("{c} (extra, {state})"),
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the agent's verdicts on `n` call for, with `max` extra CIDRs allowed.
pub fn extra_note(n: &NodeLine, max: u32) -> String {
    let plan = extra::plan(&n.pod_cidrs, &n.cidr_status, max);
    let mut notes: Vec<String> = Vec::new();
    for f in &plan.grow {
        notes.push(format!("{} depleted: asks for an extra CIDR", f.label()));
    }
    for f in &plan.at_cap {
        notes.push(format!(
            "{} depleted with {max} extra CIDRs ({OPT_EXTRA_CIDRS_MAX}): no more",
            f.label()
        ));
    }
    for c in &plan.release {
        notes.push(format!("{c} released: goes back to the pool"));
    }
    notes.join("; ")
}

fn cidr_list(cidrs: &[IpNet]) -> String {
    match cidrs {
        [] => "none".into(),
        _ => cidrs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// The text form's Leader line (and In force line, when the Lease records a pool).
fn leader_lines(leader: Option<&Leader>) -> String {
    let mut out = String::new();
    match leader {
        None => out.push_str(&format!(
            "Leader:     none (no Lease {LEASE_NAME}: no operator has run)\n"
        )),
        Some(l) => {
            let holder = if l.holder.is_empty() {
                "none (released)"
            } else {
                l.holder.as_str()
            };
            let renewed = match (&l.renew_time, l.renewed_seconds_ago) {
                (Some(t), Some(ago)) => format!("renewed {t}, {ago}s ago"),
                _ => "never renewed".into(),
            };
            let expired = if l.expired && !l.holder.is_empty() {
                "; EXPIRED: no replica leads"
            } else {
                ""
            };
            out.push_str(&format!(
                "Leader:     {holder} (Lease {}, {renewed}{expired})\n",
                l.lease
            ));
            if let Some(pool) = &l.pool_in_force {
                out.push_str(&format!("In force:   {pool}\n"));
            }
        }
    }
    out
}

/// The text form's line of one node, newline included.
fn node_text(n: &NodeLine) -> String {
    if !n.unreadable.is_empty() {
        return format!("  {}: not understood: {}\n", n.name, n.unreadable);
    }
    let mut line = format!("  {}: podCIDRs {}", n.name, judged_cidrs(n));
    if !n.extra.is_empty() {
        line.push_str(&format!("; {}", n.extra));
    }
    for p in &n.pools {
        line.push_str(&format!("; pool {}: {}", p.pool, cidr_list(&p.cidrs)));
    }
    match n.router.as_slice() {
        [] => line.push_str("; router none"),
        ips => line.push_str(&format!("; router {}", ips.join(", "))),
    }
    if !n.error.is_empty() {
        line.push_str(&format!("; error: {}", n.error));
    }
    line.push('\n');
    line
}

/// The text form.
pub fn text(r: &Report) -> String {
    let mut out = String::new();
    out.push_str(&leader_lines(r.leader.as_ref()));
    if let Some(why) = &r.pool_refused {
        out.push_str(&format!(
            "Options:    refused: {why} (the operator runs on the pool in force)\n"
        ));
    }
    out.push_str(&format!("Nodes:      {}\n", r.nodes.len()));
    for n in &r.nodes {
        out.push_str(&node_text(n));
    }
    for p in &r.pod_pools {
        out.push_str(&format!(
            "Pool {}:  {}: {} blocks in use, {} free\n",
            p.name,
            p.definition.join("; "),
            p.blocks_in_use,
            p.blocks_free
        ));
    }
    if !r.pod_pool_problems.is_empty() {
        out.push_str(
            "Blocks the pools do not accept (a refused pool edit: the running operator keeps the previous definitions):\n",
        );
        for p in &r.pod_pool_problems {
            out.push_str(&format!("  {p}\n"));
        }
    }
    for p in &r.pool {
        out.push_str(&format!(
            "Pool {}:  {} in /{}s: {} total, {} in use, {} free\n",
            p.family,
            cidr_list(&p.cidrs),
            p.mask_size,
            p.total,
            p.in_use,
            p.free
        ));
    }
    for d in &r.draining {
        let option = d
            .cidrs
            .first()
            .map_or(OPT_IPV4_CIDR, |c| cidr_option(Family::of_net(c)));
        out.push_str(&format!(
            "Draining:   {} holds {}, in no pool CIDR of {option}: a removed pool CIDR \
             drains; no new node range comes from it, and its removal completes when the \
             node is deleted\n",
            d.node,
            cidr_list(&d.cidrs)
        ));
    }
    match r.findings.len() {
        0 => out.push_str("Findings:   none (no duplicate pod IP, pod IP outside its node's ranges or range on two nodes)\n"),
        n => out.push_str(&format!("Findings:   {n}\n{}", finding_lines(&r.findings))),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_dir::TestDir;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn node(v: serde_json::Value) -> DynamicObject {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn nodes_the_lease_and_the_pool_space() {
        let objects = vec![
            node(serde_json::json!({
                "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
                "metadata": {"name": "b"},
                "spec": {"ipam": {"podCIDRs": ["10.90.1.0/24"]},
                         "addresses": [{"type": "InternalIP", "ip": "192.0.2.2"},
                                       {"type": "CiliumInternalIP", "ip": "10.90.1.1"}]},
            })),
            node(serde_json::json!({
                "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
                "metadata": {"name": "a"},
                "spec": {"ipam": {"podCIDRs": ["10.90.0.0/24", "10.1.0.0/24"],
                                  "pools": {"allocated": [{"pool": "blue", "cidrs": ["10.20.0.0/28"]}]}}},
            })),
            node(serde_json::json!({
                "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
                "metadata": {"name": "c"},
                "status": {"ipam": {"operator-status": {"error": "allocator full"}}},
            })),
            node(serde_json::json!({
                "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
                "metadata": {"name": "d"},
                "spec": {"ipam": {"podCIDRs": ["not a cidr"]}},
            })),
        ];
        let opts = parse(&args(&[
            "--cluster-pool-ipv4-cidr",
            "10.90.0.0/23 10.91.0.0/24",
        ]))
        .unwrap();
        let now: Timestamp = "2026-01-01T00:00:10Z".parse().unwrap();
        let lease: Lease = serde_json::from_value(serde_json::json!({
            "metadata": {"name": LEASE_NAME, "namespace": "kube-system",
                         "annotations": {POOL_IN_FORCE_ANNOTATION: "{\"cluster-pool-ipv4-cidr\":\"10.90.0.0/23\"}"}},
            "spec": {"holderIdentity": "op-a", "leaseDurationSeconds": 15,
                     "renewTime": "2026-01-01T00:00:07.000000Z"},
        }))
        .unwrap();
        let r = report(
            &objects,
            Some(&lease),
            "kube-system",
            carver(&opts).unwrap(),
            now,
        );
        let l = r.leader.as_ref().unwrap();
        assert_eq!(
            (l.holder.as_str(), l.renewed_seconds_ago),
            ("op-a", Some(3))
        );
        assert!(!l.expired);
        assert_eq!(r.pool.len(), 1);
        assert_eq!(
            (r.pool[0].total, r.pool[0].in_use, r.pool[0].free),
            (3, 2, 1),
            "10.1.0.0/24 is outside the pool"
        );
        let t = text(&r);
        assert!(t.contains("Leader:     op-a (Lease kube-system/podnet-operator-resource-lock, renewed 2026-01-01T00:00:07Z, 3s ago)\nIn force:   {\"cluster-pool-ipv4-cidr\":\"10.90.0.0/23\"}\n"), "{t}");
        assert!(
            t.contains(
                "  a: podCIDRs 10.90.0.0/24, 10.1.0.0/24; pool blue: 10.20.0.0/28; router none\n"
            ),
            "{t}"
        );
        assert!(
            t.contains("  b: podCIDRs 10.90.1.0/24; router 10.90.1.1\n"),
            "{t}"
        );
        assert!(
            t.contains("  c: podCIDRs none; router none; error: allocator full\n"),
            "{t}"
        );
        assert!(t.contains("  d: not understood: "), "{t}");
        assert!(
            t.contains(
                "Pool IPv4:  10.90.0.0/23, 10.91.0.0/24 in /24s: 3 total, 2 in use, 1 free\n"
            ),
            "{t}"
        );
        assert_eq!(
            r.draining,
            [DrainingNode {
                node: "a".into(),
                cidrs: vec!["10.1.0.0/24".parse().unwrap()]
            }]
        );
        assert!(
            t.contains(
                "Draining:   a holds 10.1.0.0/24, in no pool CIDR of cluster-pool-ipv4-cidr: a \
                 removed pool CIDR drains; no new node range comes from it, and its removal \
                 completes when the node is deleted\n"
            ),
            "{t}"
        );
        // Without a pool, no pool lines; an old renewal is an expired lease.
        let later: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let r = report(&objects, Some(&lease), "kube-system", None, later);
        assert!(r.pool.is_empty());
        assert!(text(&r).contains("; EXPIRED: no replica leads)"));
        assert!(
            text(&report(&[], None, "kube-system", None, later)).starts_with("Leader:     none")
        );
    }

    #[test]
    fn a_pool_cidr_with_its_own_mask_size_has_a_line_of_its_own() {
        let objects = vec![node(serde_json::json!({
            "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
            "metadata": {"name": "a"},
            "spec": {"ipam": {"podCIDRs": ["10.91.0.64/26"]}},
        }))];
        let opts = parse(&args(&[
            "--cluster-pool-ipv4-cidr",
            "10.90.0.0/23,10.91.0.0/24@26 10.92.0.0/24",
        ]))
        .unwrap();
        let r = report(
            &objects,
            None,
            "kube-system",
            carver(&opts).unwrap(),
            Timestamp::now(),
        );
        let t = text(&r);
        assert!(
            t.contains(
                "Pool IPv4:  10.90.0.0/23, 10.92.0.0/24 in /24s: 3 total, 0 in use, 3 free\n\
                 Pool IPv4:  10.91.0.0/24 in /26s: 4 total, 1 in use, 3 free\n"
            ),
            "{t}"
        );
        assert!(r.draining.is_empty());
        let bad = parse(&args(&["--cluster-pool-ipv4-cidr", "10.91.0.0/24@20"])).unwrap();
        assert_eq!(
            carver(&bad).unwrap_err().to_string(),
            "invalid cluster-pool-ipv4-cidr entry \"10.91.0.0/24@20\": node mask size /20 must \
             be /24 to /32 for 10.91.0.0/24"
        );
    }

    #[test]
    fn pod_pools_count_blocks_and_list_what_they_do_not_accept() {
        let def = |mask| PoolDef {
            name: "mars".into(),
            ipv4: Some(crate::ipam::pooldef::PoolFamilySpec {
                cidrs: vec!["10.63.0.0/24".parse().unwrap()],
                mask_size: mask,
                reserved_ranges: Vec::new(),
            }),
            ..Default::default()
        };
        let holder = NodeLine {
            name: "n1".into(),
            pod_cidrs: Vec::new(),
            pools: vec![PoolBlocks {
                pool: "mars".into(),
                cidrs: vec!["10.63.0.0/28".parse().unwrap()],
            }],
            router: Vec::new(),
            error: String::new(),
            cidr_status: BTreeMap::new(),
            extra: String::new(),
            unreadable: String::new(),
        };
        let (pools, problems) = pod_pools(&[def(28)], std::slice::from_ref(&holder));
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(pools[0].definition, ["IPv4 10.63.0.0/24 in /28s"]);
        assert_eq!((pools[0].blocks_in_use, pools[0].blocks_free), (1, 15));
        // A node not migrated from cluster-pool: the blocks of its /26 are in use.
        let cluster_pool_node = NodeLine {
            name: "n0".into(),
            pod_cidrs: vec!["10.63.0.64/26".parse().unwrap()],
            pools: Vec::new(),
            ..holder.clone()
        };
        let (pools, _) = pod_pools(&[def(28)], &[holder.clone(), cluster_pool_node]);
        assert_eq!((pools[0].blocks_in_use, pools[0].blocks_free), (5, 11));
        let (pools, problems) = pod_pools(&[def(27)], &[holder]);
        assert_eq!((pools[0].blocks_in_use, pools[0].blocks_free), (0, 8));
        assert_eq!(
            problems,
            [
                "node \"n1\": unable to reuse from pool mars: cidr 10.63.0.0/28 is a /28 but the pool's ipv4 maskSize is 27"
            ]
        );
        let r = Report {
            leader: None,
            nodes: Vec::new(),
            pool: Vec::new(),
            pod_pools: pools,
            pod_pool_problems: problems,
            draining: Vec::new(),
            pool_refused: None,
            findings: vec![Finding::RangeOnTwoNodes {
                ranges: ["a", "b"]
                    .map(|node| crate::ipam::duplicates::HeldRange {
                        node: node.into(),
                        cidr: "10.63.0.0/24".parse().unwrap(),
                        source: crate::ipam::duplicates::RangeSource::PodCidr,
                    })
                    .to_vec(),
            }],
        };
        let t = text(&r);
        assert!(
            t.contains("Pool mars:  IPv4 10.63.0.0/24 in /27s: 0 blocks in use, 8 free\n"),
            "{t}"
        );
        assert!(t.contains("a refused pool edit"), "{t}");
        assert!(
            t.ends_with("Findings:   1\n  OverlappingNodeRanges: ranges on more than one CiliumNode overlap: 10.63.0.0/24 (podCIDR) on a, 10.63.0.0/24 (podCIDR) on b\n"),
            "{t}"
        );
    }

    #[test]
    fn an_unreachable_api_server_is_exit_1() {
        let dir = TestDir::new("opstatus");
        let (kubeconfig, port) = crate::k8s::connect::unreachable_kubeconfig(&dir);
        let opts = parse(&args(&[
            "--k8s-kubeconfig-path",
            &kubeconfig.display().to_string(),
        ]))
        .unwrap();
        let e = status(&opts).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!(
                "cannot reach the API server at https://127.0.0.1:{port}/ (listing CiliumNodes): "
            )),
            "{e}"
        );
        assert_eq!(
            run(&args(&[
                "--k8s-kubeconfig-path",
                &kubeconfig.display().to_string()
            ])),
            1
        );
    }

    #[test]
    fn each_cidr_shows_the_agents_verdict_and_what_it_calls_for() {
        let net = |c: &str| c.parse::<IpNet>().unwrap();
        let mut n = NodeLine {
            name: "a".into(),
            pod_cidrs: vec![net("10.90.0.0/24"), net("10.90.9.0/24")],
            pools: Vec::new(),
            router: Vec::new(),
            error: String::new(),
            cidr_status: BTreeMap::from([
                (net("10.90.0.0/24"), PodCidrState::Depleted),
                (net("10.90.9.0/24"), PodCidrState::Depleted),
            ]),
            extra: String::new(),
            unreadable: String::new(),
        };
        assert_eq!(
            judged_cidrs(&n),
            "10.90.0.0/24 (depleted), 10.90.9.0/24 (extra, depleted)"
        );
        assert_eq!(extra_note(&n, 2), "IPv4 depleted: asks for an extra CIDR");
        assert_eq!(
            extra_note(&n, 1),
            "IPv4 depleted with 1 extra CIDRs (cluster-pool-extra-cidrs-max): no more"
        );
        n.cidr_status
            .insert(net("10.90.9.0/24"), PodCidrState::Released);
        n.cidr_status
            .insert(net("10.90.0.0/24"), PodCidrState::InUse);
        assert_eq!(
            extra_note(&n, 2),
            "10.90.9.0/24 released: goes back to the pool"
        );
        n.extra = extra_note(&n, 2);
        let r = Report {
            nodes: vec![n],
            ..report(&[], None, "kube-system", None, Timestamp::now())
        };
        assert!(
            text(&r).contains(
                "  a: podCIDRs 10.90.0.0/24 (in-use), 10.90.9.0/24 (extra, released); \
                 10.90.9.0/24 released: goes back to the pool; router none\n"
            ),
            "{}",
            text(&r)
        );
    }
}
