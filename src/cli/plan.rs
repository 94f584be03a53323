//! `podnet plan`: the chapter's "Sizing math" as a command. Offline (no
//! daemon): how many nodes a cluster pool serves and how many Pod addresses a
//! node gets (`--pool-mode cluster-pool`, the default), how many blocks a
//! node takes from a multi-pool pool for its pre-allocation
//! (`--pool-mode multi-pool`), and the per-node limit of an AWS ENI instance
//! with the operator's allocation cycle for a node's numbers (`--pool-mode
//! eni`), and in cluster-pool what podnet's extra node CIDRs add (`plan_extra`).
//! `-o json` for scripts. The math is [`crate::ipam::sizing`], and
//! [`crate::ipam::eni`] for the ENI cycle.

use std::time::Duration;

use clap::{Args, ValueEnum};
use ipnet::IpNet;
use serde::Serialize;

use super::plan_extra::{ExtraCidrPlan, extra_cidr_plan, extra_cidr_text};
use crate::ipam::Family;
use crate::ipam::cidr_depletion::{DEFAULT_DEPLETION_THRESHOLD, DepletionRules};
use crate::ipam::clusterpool::{
    DEFAULT_EXTRA_CIDRS_MAX, DEFAULT_IPV4_MASK_SIZE, DEFAULT_IPV6_MASK_SIZE, parse_cidr_list,
};
use crate::ipam::eni;
use crate::ipam::sizing::{
    self, BlockPoolPlan, DEFAULT_ENI_PRE_ALLOCATE, DEFAULT_MAX_PODS,
    DEFAULT_MULTI_POOL_PRE_ALLOCATION, DEFAULT_RESERVED_PER_NODE, DEFAULT_ROLLOUT_HEADROOM_PERCENT,
    ENI_PREFIX_ADDRESSES, EniOptions, EniPlan, MultiPoolOptions, MultiPoolPlan, NodeDemand, Plan,
    PlanOptions, PoolPlan, group_digits,
};

/// Which IPAM mode to size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PoolMode {
    /// Cluster-pool (and Kubernetes host-scope): pool CIDRs carved into node CIDRs.
    ClusterPool,
    /// Multi-pool: one pool's CIDRs carved into per-node blocks on demand.
    MultiPool,
    /// AWS ENI: the instance's ENI/IP limit.
    Eni,
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
}

/// `podnet plan` options.
#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    /// Pool CIDR (repeatable; one family per plan).
    #[arg(long = "cidr", value_name = "CIDR")]
    pub cidrs: Vec<String>,
    /// Node mask size (cluster-pool; default 24 for IPv4, 112 for IPv6 as the
    /// operator flag, the Helm chart uses 120) or the pool's maskSize
    /// (multi-pool, required).
    #[arg(long = "mask-size", value_name = "M")]
    pub mask_size: Option<u8>,
    /// The kubelet's maxPods; 0 skips the density check.
    #[arg(long = "max-pods", value_name = "N", default_value_t = DEFAULT_MAX_PODS)]
    pub max_pods: u32,
    /// Addresses Cilium takes per node: 2 (router, health), 3 with Ingress.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_RESERVED_PER_NODE)]
    pub reserved: u32,
    /// Rollout headroom over maxPods, in percent.
    #[arg(long, value_name = "PERCENT", default_value_t = DEFAULT_ROLLOUT_HEADROOM_PERCENT)]
    pub headroom: u32,
    /// IPAM mode to size.
    #[arg(long = "pool-mode", value_enum, default_value_t = PoolMode::ClusterPool)]
    pub pool_mode: PoolMode,
    /// multi-pool: the pool's pre-allocation (default 8); eni:
    /// `spec.ipam.pre-allocate` (not set, or 0: 8, lowered on small instances;
    /// a value that is set is kept).
    #[arg(long = "pre-allocate", value_name = "N")]
    pub pre_allocate: Option<u32>,
    /// eni: network interfaces the instance type supports.
    #[arg(long = "eni-adapters", value_name = "N")]
    pub eni_adapters: Option<u32>,
    /// eni: IPv4 addresses per ENI the instance type supports.
    #[arg(long = "eni-ips-per-eni", value_name = "N")]
    pub eni_ips_per_eni: Option<u32>,
    /// eni: first-interface-index (ENIs below it carry no Pods; default 0).
    #[arg(long = "eni-first-interface-index", value_name = "N")]
    pub eni_first_interface_index: Option<u32>,
    /// eni: prefix delegation (/28 prefixes, x16 per ENI).
    #[arg(long = "eni-prefix-delegation")]
    pub eni_prefix_delegation: bool,
    /// eni: use-primary-address (+1 address per ENI).
    #[arg(long = "eni-use-primary-address")]
    pub eni_use_primary_address: bool,
    /// eni: `spec.ipam.min-allocate`, the addresses a node holds at least
    /// (default 0).
    #[arg(long = "min-allocate", value_name = "N")]
    pub min_allocate: Option<u64>,
    /// eni: `spec.ipam.max-allocate`, the addresses a node holds at most
    /// (default: the instance limit).
    #[arg(long = "max-allocate", value_name = "N")]
    pub max_allocate: Option<u64>,
    /// eni: `spec.ipam.max-above-watermark`, extra addresses per allocation
    /// (default 0).
    #[arg(long = "max-above-watermark", value_name = "N")]
    pub max_above_watermark: Option<u64>,
    /// eni: addresses the node holds now, for the operator cycle (default 0: a
    /// new node).
    #[arg(long = "available-ips", value_name = "N")]
    pub available_ips: Option<u64>,
    /// eni: addresses in use on the node now (default 0).
    #[arg(long = "used-ips", value_name = "N")]
    pub used_ips: Option<u64>,
    /// eni: Pods waiting for an address on the node (default 0).
    #[arg(long = "pending-pods", value_name = "N")]
    pub pending_pods: Option<u64>,
    /// eni: free addresses on the ENI the operator allocates on (default: no
    /// limit).
    #[arg(long = "eni-free-ips", value_name = "N")]
    pub eni_free_ips: Option<u64>,
    /// eni: free addresses in that ENI's subnet (default: no limit).
    #[arg(long = "subnet-free-ips", value_name = "N")]
    pub subnet_free_ips: Option<u64>,
    /// cluster-pool: the agents' `cluster-pool-depletion-threshold` (percent).
    #[arg(long = "depletion-threshold", value_name = "PERCENT", default_value_t = u32::from(DEFAULT_DEPLETION_THRESHOLD))]
    pub depletion_threshold: u32,
    /// cluster-pool: the operator's `cluster-pool-extra-cidrs-max`.
    #[arg(long = "extra-cidrs-max", value_name = "N", default_value_t = DEFAULT_EXTRA_CIDRS_MAX)]
    pub extra_cidrs_max: u32,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

/// Runs `podnet plan`; exit 1 with a message on stderr on any error.
pub fn run(args: &PlanArgs) -> i32 {
    match render(args) {
        Ok(out) => {
            print!("{out}");
            0
        }
        Err(e) => {
            eprintln!("podnet plan: {e}");
            1
        }
    }
}

/// The whole output (text or JSON, newline-terminated) or the error message.
pub fn render(args: &PlanArgs) -> Result<String, String> {
    check_mode_flags(args)?;
    let max_pods = (args.max_pods > 0).then_some(args.max_pods);
    match args.pool_mode {
        PoolMode::ClusterPool => {
            let cidrs = parse_cidrs(&args.cidrs)?;
            let mask = args.mask_size.unwrap_or(match Family::of_net(&cidrs[0]) {
                Family::V4 => DEFAULT_IPV4_MASK_SIZE,
                Family::V6 => DEFAULT_IPV6_MASK_SIZE,
            });
            let opts = PlanOptions {
                reserved_per_node: args.reserved,
                max_pods,
                rollout_headroom_percent: args.headroom,
            };
            let plan = sizing::plan_cluster_pool(&cidrs, mask, &opts).map_err(|e| e.to_string())?;
            let rules = DepletionRules::new(args.depletion_threshold, Duration::ZERO)
                .map_err(|e| e.to_string())?;
            let extra = extra_cidr_plan(&plan, &rules, args.extra_cidrs_max);
            Ok(match args.output {
                OutputFormat::Json => cluster_pool_json(&plan, &extra),
                OutputFormat::Text => cluster_pool_text(&plan) + &extra_cidr_text(&extra, mask),
            })
        }
        PoolMode::MultiPool => {
            let cidrs = parse_cidrs(&args.cidrs)?;
            let mask = args
                .mask_size
                .ok_or("--pool-mode multi-pool needs --mask-size (the pool's maskSize)")?;
            let opts = MultiPoolOptions {
                pre_allocate: args
                    .pre_allocate
                    .unwrap_or(DEFAULT_MULTI_POOL_PRE_ALLOCATION),
                reserved_per_node: args.reserved,
                max_pods,
                rollout_headroom_percent: args.headroom,
            };
            let plan = sizing::plan_multi_pool(&cidrs, mask, &opts).map_err(|e| e.to_string())?;
            Ok(match args.output {
                OutputFormat::Json => multi_pool_json(&plan),
                OutputFormat::Text => multi_pool_text(&plan),
            })
        }
        PoolMode::Eni => {
            let opts = EniOptions {
                adapters: args
                    .eni_adapters
                    .ok_or("--pool-mode eni needs --eni-adapters and --eni-ips-per-eni")?,
                ipv4_per_eni: args
                    .eni_ips_per_eni
                    .ok_or("--pool-mode eni needs --eni-adapters and --eni-ips-per-eni")?,
                first_interface_index: args.eni_first_interface_index.unwrap_or(0),
                prefix_delegation: args.eni_prefix_delegation,
                use_primary_address: args.eni_use_primary_address,
                pre_allocate: args.pre_allocate.unwrap_or(0),
                reserved_per_node: args.reserved,
                max_pods,
                rollout_headroom_percent: args.headroom,
            };
            let mut plan = sizing::plan_eni(&opts).map_err(|e| e.to_string())?;
            let cycle = eni_cycle(args, &opts)?;
            if cycle.max_allocate > plan.max_allocate {
                plan.warnings.push(format!(
                    "max-allocate {} is above the instance limit {}: the operator only warns, \
                     and the instance's ENIs hold at most {}",
                    cycle.max_allocate, plan.max_allocate, plan.max_allocate
                ));
            }
            Ok(match args.output {
                OutputFormat::Json => eni_json(&plan, &cycle),
                OutputFormat::Text => eni_text(&plan, &cycle),
            })
        }
    }
}

/// Refuses flags that do not apply to the chosen mode.
fn check_mode_flags(args: &PlanArgs) -> Result<(), String> {
    let eni_flags = [
        ("--eni-adapters", args.eni_adapters.is_some()),
        ("--eni-ips-per-eni", args.eni_ips_per_eni.is_some()),
        (
            "--eni-first-interface-index",
            args.eni_first_interface_index.is_some(),
        ),
        ("--eni-prefix-delegation", args.eni_prefix_delegation),
        ("--eni-use-primary-address", args.eni_use_primary_address),
        ("--min-allocate", args.min_allocate.is_some()),
        ("--max-allocate", args.max_allocate.is_some()),
        ("--max-above-watermark", args.max_above_watermark.is_some()),
        ("--available-ips", args.available_ips.is_some()),
        ("--used-ips", args.used_ips.is_some()),
        ("--pending-pods", args.pending_pods.is_some()),
        ("--eni-free-ips", args.eni_free_ips.is_some()),
        ("--subnet-free-ips", args.subnet_free_ips.is_some()),
    ];
    let used = |flags: &[(&'static str, bool)]| flags.iter().find(|(_, set)| *set).map(|(n, _)| *n);
    let refuse =
        |flag: &str, mode: &str| Err(format!("{flag} does not apply to --pool-mode {mode}"));
    match args.pool_mode {
        PoolMode::ClusterPool => {
            if args.pre_allocate.is_some() {
                return Err(
                    "--pre-allocate applies to --pool-mode multi-pool or eni, not \
                            cluster-pool"
                        .to_string(),
                );
            }
            if let Some(flag) = used(&eni_flags) {
                return refuse(flag, "cluster-pool");
            }
        }
        PoolMode::MultiPool => {
            if let Some(flag) = used(&eni_flags) {
                return refuse(flag, "multi-pool");
            }
        }
        PoolMode::Eni => {
            if let Some(flag) = used(&[
                ("--cidr", !args.cidrs.is_empty()),
                ("--mask-size", args.mask_size.is_some()),
            ]) {
                return refuse(flag, "eni");
            }
        }
    }
    Ok(())
}

/// Parses every `--cidr` value (each may hold several, comma- or
/// space-separated); at least one is required. A pool entry with its own node
/// mask size (`<cidr>@<mask>`, the operator's) is planned apart: one plan has
/// one mask size.
fn parse_cidrs(values: &[String]) -> Result<Vec<IpNet>, String> {
    let mut out = Vec::new();
    for v in values {
        if let Some(entry) = v
            .split(|c: char| c == ',' || c.is_whitespace())
            .find(|e| e.contains('@'))
        {
            let (cidr, mask) = entry.split_once('@').unwrap_or((entry, ""));
            return Err(format!(
                "--cidr entry \"{entry}\" carries its own node mask size: a plan has one mask \
                 size, so plan that entry apart (--cidr {cidr} --mask-size {mask}) and the rest \
                 with theirs"
            ));
        }
        out.extend(parse_cidr_list("--cidr", v).map_err(|e| e.to_string())?);
    }
    if out.is_empty() {
        return Err("no pool CIDR given: pass at least one --cidr".to_string());
    }
    Ok(out)
}

fn n(v: impl Into<u128>) -> String {
    group_digits(v.into())
}

/// A plain table: first column left-aligned, the others right-aligned except
/// the last (left-aligned), two spaces between columns.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let cols = headers.len();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate().take(cols) {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            let w = widths[i];
            if i == 0 || i + 1 == cols {
                s.push_str(&format!("{c:<w$}"));
            } else {
                s.push_str(&format!("{c:>w$}"));
            }
        }
        s.truncate(s.trim_end().len());
        s.push('\n');
        s
    };
    let mut out = line(headers.to_vec());
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

fn warnings_text(warnings: &[String]) -> String {
    if warnings.is_empty() {
        return "\nNo warnings.\n".to_string();
    }
    let mut s = String::from("\nWarnings:\n");
    for w in warnings {
        s.push_str(&format!("  - {w}\n"));
    }
    s
}

fn pretty<T: Serialize>(v: &T) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s
}

// ---------------------------------------------------------------- cluster-pool

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ClusterPoolJson<'a> {
    nodes: u64,
    addresses_per_node: u128,
    usable_per_node: u64,
    warnings: &'a [String],
    pools: &'a [PoolPlan],
    extra_cidrs: &'a ExtraCidrPlan,
}

/// Top level exactly `nodes`, `addressesPerNode`, `usablePerNode`,
/// `warnings`, `pools`, `extraCidrs`.
fn cluster_pool_json(plan: &Plan, extra: &ExtraCidrPlan) -> String {
    pretty(&ClusterPoolJson {
        nodes: plan.nodes,
        addresses_per_node: plan.addresses_per_node,
        usable_per_node: plan.usable_per_node,
        warnings: &plan.warnings,
        pools: &plan.pools,
        extra_cidrs: extra,
    })
}

fn cluster_pool_text(plan: &Plan) -> String {
    let reserved = plan.options.reserved_per_node;
    let mut s = format!(
        "Cluster-pool plan: {}, node mask /{}\n",
        plan.family.label(),
        plan.mask_size
    );
    s.push_str(&format!(
        "Per node: {} addresses, {} allocatable (host-scope rules), {} usable after {} reserved \
         ({})\n",
        n(plan.addresses_per_node),
        n(plan.allocatable_per_node),
        n(plan.usable_per_node),
        reserved,
        reserved_label(reserved)
    ));
    if let (Some(max_pods), Some(required)) = (plan.options.max_pods, plan.required_per_node) {
        s.push_str(&format!(
            "Needed:   maxPods {max_pods} + {}% rollout headroom = {required} per node\n",
            plan.options.rollout_headroom_percent
        ));
    }
    s.push('\n');
    let mut rows: Vec<Vec<String>> = plan
        .pools
        .iter()
        .map(|p| {
            vec![
                p.cidr.to_string(),
                n(p.nodes),
                n(p.addresses_per_node),
                n(p.usable_per_node),
                n(p.pod_ips),
                format!("{} .. {}", p.first_node_cidr, p.last_node_cidr),
            ]
        })
        .collect();
    rows.push(vec![
        "total".to_string(),
        n(plan.nodes),
        n(plan.addresses_per_node),
        n(plan.usable_per_node),
        n(plan.total_pod_ips),
        String::new(),
    ]);
    s.push_str(&table(
        &[
            "POOL CIDR",
            "NODES",
            "ADDRESSES/NODE",
            "USABLE/NODE",
            "POD IPS",
            "NODE CIDRS",
        ],
        &rows,
    ));
    s.push_str(&warnings_text(&plan.warnings));
    s
}

fn reserved_label(reserved: u32) -> &'static str {
    match reserved {
        0 => "none",
        1 => "router",
        2 => "router, health",
        3 => "router, health, ingress",
        _ => "router, health, ingress and others",
    }
}

// ------------------------------------------------------------------ multi-pool

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MultiPoolJson<'a> {
    mode: &'static str,
    mask_size: u8,
    pre_allocate: u32,
    reserved_per_node: u32,
    blocks: u64,
    addresses_per_block: u128,
    usable_per_block: u128,
    idle: NodeDemand,
    peak: Option<NodeDemand>,
    warnings: &'a [String],
    pools: &'a [BlockPoolPlan],
}

fn multi_pool_json(plan: &MultiPoolPlan) -> String {
    pretty(&MultiPoolJson {
        mode: "multi-pool",
        mask_size: plan.mask_size,
        pre_allocate: plan.options.pre_allocate,
        reserved_per_node: plan.options.reserved_per_node,
        blocks: plan.blocks,
        addresses_per_block: plan.addresses_per_block,
        usable_per_block: plan.usable_per_block,
        idle: plan.idle,
        peak: plan.peak,
        warnings: &plan.warnings,
        pools: &plan.pools,
    })
}

fn multi_pool_text(plan: &MultiPoolPlan) -> String {
    let o = &plan.options;
    let mut s = format!(
        "Multi-pool plan: {}, maskSize /{}, pre-allocation {}\n",
        plan.family.label(),
        plan.mask_size,
        o.pre_allocate
    );
    s.push_str(&format!(
        "Per block: {} addresses, {} usable (operator count)\n\n",
        n(plan.addresses_per_block),
        n(plan.usable_per_block)
    ));
    let mut rows: Vec<Vec<String>> = plan
        .pools
        .iter()
        .map(|p| {
            vec![
                p.cidr.to_string(),
                n(p.blocks),
                format!("{} .. {}", p.first_block, p.last_block),
            ]
        })
        .collect();
    rows.push(vec!["total".to_string(), n(plan.blocks), String::new()]);
    s.push_str(&table(&["POOL CIDR", "BLOCKS", "BLOCK CIDRS"], &rows));
    s.push('\n');
    let demand_row = |label: String, d: &NodeDemand| {
        vec![
            label,
            n(d.in_use),
            n(d.needed_ips),
            n(d.blocks_per_node),
            d.nodes.map(n).unwrap_or_else(|| "unbounded".to_string()),
        ]
    };
    let mut rows = vec![demand_row(
        format!("idle ({} reserved)", o.reserved_per_node),
        &plan.idle,
    )];
    if let (Some(peak), Some(max_pods)) = (&plan.peak, o.max_pods) {
        rows.push(demand_row(
            format!(
                "peak (reserved + maxPods {max_pods} + {}%)",
                o.rollout_headroom_percent
            ),
            peak,
        ));
    }
    s.push_str(&table(
        &[
            "NODE",
            "IN USE",
            "NEEDED (neededIPCeil)",
            "BLOCKS/NODE",
            "NODES",
        ],
        &rows,
    ));
    s.push_str(&warnings_text(&plan.warnings));
    s
}

// ------------------------------------------------------------------------- ENI

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct EniJson<'a> {
    mode: &'static str,
    adapters: u32,
    ipv4_per_eni: u32,
    first_interface_index: u32,
    prefix_delegation: bool,
    use_primary_address: bool,
    usable_enis: u32,
    addresses_per_eni: u64,
    max_allocate: u64,
    effective_pre_allocate: u32,
    reserved_per_node: u32,
    pod_capacity: u64,
    required_per_node: Option<u64>,
    cycle: &'a EniCycle,
    warnings: &'a [String],
}

/// The operator's allocation cycle for one node's numbers (chapter
/// "Allocation algorithm"), computed by [`crate::ipam::eni`].
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct EniCycle {
    available_ips: u64,
    used_ips: u64,
    pending_pods: u64,
    /// In force: set, or the default lowered on small instances.
    pre_allocate: u64,
    min_allocate: u64,
    /// In force: set, or the instance limit.
    max_allocate: u64,
    max_above_watermark: u64,
    eni_free_ips: Option<u64>,
    subnet_free_ips: Option<u64>,
    deficit: u64,
    surge_allocate: u64,
    per_cycle_allocation: u64,
    /// With prefix delegation: the /28 prefixes the per-cycle allocation takes.
    prefixes: Option<u64>,
    /// Released only with `--aws-release-excess-ips`.
    excess: u64,
}

/// The cycle for the node the flags describe (a new node by default).
fn eni_cycle(args: &PlanArgs, opts: &EniOptions) -> Result<EniCycle, String> {
    let available = args.available_ips.unwrap_or(0);
    let used = args.used_ips.unwrap_or(0);
    if used > available {
        return Err(format!(
            "--used-ips {used} is more than --available-ips {available}: a node uses only addresses it holds"
        ));
    }
    let pending = args.pending_pods.unwrap_or(0);
    let pre = eni::effective_pre_allocate(u64::from(opts.pre_allocate), opts);
    let min = args.min_allocate.unwrap_or(0);
    let max = eni::effective_max_allocate(args.max_allocate.unwrap_or(0), opts);
    let watermark = args.max_above_watermark.unwrap_or(0);
    let needed = eni::deficit(available, used, pre, min, max);
    let per_cycle = eni::per_cycle_allocation(
        args.subnet_free_ips.unwrap_or(u64::MAX),
        args.eni_free_ips.unwrap_or(u64::MAX),
        needed,
        watermark,
        pending,
    );
    Ok(EniCycle {
        available_ips: available,
        used_ips: used,
        pending_pods: pending,
        pre_allocate: pre,
        min_allocate: min,
        max_allocate: max,
        max_above_watermark: watermark,
        eni_free_ips: args.eni_free_ips,
        subnet_free_ips: args.subnet_free_ips,
        deficit: needed,
        surge_allocate: eni::surge_allocate(pending, needed),
        per_cycle_allocation: per_cycle,
        prefixes: opts.prefix_delegation.then(|| eni::prefixes_for(per_cycle)),
        excess: eni::excess(available, used, pre, min, watermark),
    })
}

fn eni_json(plan: &EniPlan, cycle: &EniCycle) -> String {
    let o = &plan.options;
    pretty(&EniJson {
        mode: "eni",
        adapters: o.adapters,
        ipv4_per_eni: o.ipv4_per_eni,
        first_interface_index: o.first_interface_index,
        prefix_delegation: o.prefix_delegation,
        use_primary_address: o.use_primary_address,
        usable_enis: plan.usable_enis,
        addresses_per_eni: plan.addresses_per_eni,
        max_allocate: plan.max_allocate,
        effective_pre_allocate: plan.effective_pre_allocate,
        reserved_per_node: o.reserved_per_node,
        pod_capacity: plan.pod_capacity,
        required_per_node: plan.required_per_node,
        cycle,
        warnings: &plan.warnings,
    })
}

fn eni_text(plan: &EniPlan, cycle: &EniCycle) -> String {
    let o = &plan.options;
    let mut per_eni = format!("({} - 1)", o.ipv4_per_eni);
    if o.prefix_delegation {
        per_eni.push_str(" x 16");
    }
    if o.use_primary_address {
        per_eni.push_str(" + 1");
    }
    let mut s = format!(
        "ENI plan: {} adapters, {} IPv4 per ENI, first-interface-index {}{}{}\n\n",
        o.adapters,
        o.ipv4_per_eni,
        o.first_interface_index,
        if o.prefix_delegation {
            ", prefix delegation"
        } else {
            ""
        },
        if o.use_primary_address {
            ", use-primary-address"
        } else {
            ""
        }
    );
    let mut rows = vec![
        vec![
            "ENIs for Pods".to_string(),
            n(plan.usable_enis),
            format!("{} - {}", o.adapters, o.first_interface_index),
        ],
        vec![
            "addresses per ENI".to_string(),
            n(plan.addresses_per_eni),
            per_eni,
        ],
        vec![
            "max-allocate (instance limit)".to_string(),
            n(plan.max_allocate),
            "ENIs x addresses per ENI".to_string(),
        ],
        vec![
            "pre-allocate".to_string(),
            n(plan.effective_pre_allocate),
            if o.pre_allocate == 0 {
                format!(
                    "min({DEFAULT_ENI_PRE_ALLOCATE}, ENIs x ({} - 1))",
                    o.ipv4_per_eni
                )
            } else {
                "set (a set value is not lowered)".to_string()
            },
        ],
        vec![
            "Pod capacity".to_string(),
            n(plan.pod_capacity),
            format!(
                "max-allocate - {} reserved ({})",
                o.reserved_per_node,
                reserved_label(o.reserved_per_node)
            ),
        ],
    ];
    if let (Some(required), Some(max_pods)) = (plan.required_per_node, o.max_pods) {
        rows.push(vec![
            "needed".to_string(),
            n(required),
            format!(
                "maxPods {max_pods} + {}% rollout headroom",
                o.rollout_headroom_percent
            ),
        ]);
    }
    s.push_str(&table(&["PER NODE", "VALUE", "FORMULA"], &rows));
    s.push('\n');
    s.push_str(&eni_cycle_text(cycle));
    s.push_str(&warnings_text(&plan.warnings));
    s
}

/// The cycle as a table, each formula with the node's numbers filled in.
fn eni_cycle_text(c: &EniCycle) -> String {
    let (avail, used, pre) = (c.available_ips, c.used_ips, c.pre_allocate);
    let mut s = format!(
        "Operator cycle: {avail} available, {used} used, {} Pods pending; pre-allocate {pre}, \
         min-allocate {}, max-allocate {}, max-above-watermark {}\n\n",
        c.pending_pods, c.min_allocate, c.max_allocate, c.max_above_watermark
    );
    let mut deficit = format!("{pre} + {used} - {avail}");
    if c.min_allocate > 0 {
        deficit = format!("max({deficit}, {} - {avail})", c.min_allocate);
    }
    if c.max_allocate > 0 {
        deficit.push_str(&format!(", at most {} held", c.max_allocate));
    }
    deficit.push_str(", floor 0");
    let want = format!(
        "{} + {} + {}",
        c.deficit, c.max_above_watermark, c.surge_allocate
    );
    let caps: Vec<String> = [("subnet", c.subnet_free_ips), ("ENI", c.eni_free_ips)]
        .into_iter()
        .filter_map(|(what, free)| free.map(|f| format!("{what} free {f}")))
        .collect();
    let per_cycle = if caps.is_empty() {
        format!("{want} (needed + max-above-watermark + surge)")
    } else {
        format!("min({}, {want})", caps.join(", "))
    };
    let mut rows = vec![
        vec!["deficit (needed)".to_string(), n(c.deficit), deficit],
        vec![
            "surge".to_string(),
            n(c.surge_allocate),
            format!("{} pending - {} needed, floor 0", c.pending_pods, c.deficit),
        ],
        vec![
            "per-cycle allocation".to_string(),
            n(c.per_cycle_allocation),
            per_cycle,
        ],
    ];
    if let Some(prefixes) = c.prefixes {
        rows.push(vec![
            "prefixes (/28)".to_string(),
            n(prefixes),
            format!("ceil({} / {ENI_PREFIX_ADDRESSES})", c.per_cycle_allocation),
        ]);
    }
    rows.push(vec![
        "excess".to_string(),
        n(c.excess),
        "released only with --aws-release-excess-ips".to_string(),
    ]);
    s.push_str(&table(&["CYCLE", "VALUE", "FORMULA"], &rows));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        plan: PlanArgs,
    }

    fn args(list: &[&str]) -> PlanArgs {
        let mut v = vec!["plan"];
        v.extend_from_slice(list);
        Cli::try_parse_from(v).expect("parse").plan
    }

    fn json(list: &[&str]) -> serde_json::Value {
        let mut l = list.to_vec();
        l.extend_from_slice(&["-o", "json"]);
        serde_json::from_str(&render(&args(&l)).unwrap()).unwrap()
    }

    #[test]
    fn plan_json_top_level_fields() {
        let v = json(&[
            "--cidr",
            "10.244.0.0/16",
            "--mask-size",
            "24",
            "--reserved",
            "3",
        ]);
        let obj = v.as_object().unwrap();
        let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "addressesPerNode",
                "extraCidrs",
                "nodes",
                "pools",
                "usablePerNode",
                "warnings"
            ]
        );
        assert_eq!(v["nodes"], 256);
        assert_eq!(v["addressesPerNode"], 256);
        assert_eq!(v["usablePerNode"], 251);
        assert_eq!(v["warnings"].as_array().unwrap().len(), 0);
        let pool = &v["pools"][0];
        assert_eq!(pool["cidr"], "10.244.0.0/16");
        assert_eq!(pool["nodes"], 256);
        assert_eq!(pool["usablePerNode"], 251);
        assert_eq!(pool["podIps"], 64_256);
        assert_eq!(pool["firstNodeCidr"], "10.244.0.0/24");
        assert_eq!(pool["lastNodeCidr"], "10.244.255.0/24");
    }

    #[test]
    fn plan_json_table_rows() {
        for (cidr, mask, nodes, addrs) in [
            ("10.0.0.0/8", "24", 65_536u64, 256u64),
            ("fd00::/104", "120", 65_536, 256),
            ("fd00:10:244::/96", "112", 65_536, 65_536),
            ("10.244.0.0/16", "26", 1_024, 64),
            ("10.244.0.0/16", "28", 4_096, 16),
        ] {
            let v = json(&["--cidr", cidr, "--mask-size", mask, "--reserved", "3"]);
            assert_eq!(v["nodes"], nodes, "{cidr}");
            assert_eq!(v["addressesPerNode"], addrs, "{cidr}");
            assert_eq!(v["usablePerNode"], addrs - 5, "{cidr}");
        }
    }

    #[test]
    fn plan_default_masks_and_lists() {
        let v = json(&["--cidr", "10.244.0.0/16,10.245.0.0/16"]);
        assert_eq!(v["nodes"], 512);
        assert_eq!(v["addressesPerNode"], 256);
        let v6 = json(&["--cidr", "fd00:10:244::/96"]);
        assert_eq!(v6["addressesPerNode"], 65_536, "IPv6 default mask is 112");
    }

    #[test]
    fn plan_text_table() {
        let out = render(&args(&[
            "--cidr",
            "10.244.0.0/16",
            "--mask-size",
            "26",
            "--reserved",
            "3",
        ]))
        .unwrap();
        assert!(
            out.starts_with("Cluster-pool plan: IPv4, node mask /26\n"),
            "{out}"
        );
        assert!(out.contains("64 addresses, 62 allocatable"), "{out}");
        assert!(out.contains("59 usable after 3 reserved (router, health, ingress)"));
        assert!(out.contains("POOL CIDR"), "{out}");
        assert!(out.contains("10.244.0.0/16"), "{out}");
        assert!(out.contains("1,024"), "{out}");
        assert!(out.contains("10.244.0.0/26 .. 10.244.255.192/26"), "{out}");
        assert!(
            out.contains("Warnings:\n  - usable Pod IPs per node (59)"),
            "{out}"
        );
    }

    #[test]
    fn plan_errors_are_messages() {
        let e = render(&args(&["--cidr", "fd00::/104", "--mask-size", "121"])).unwrap_err();
        assert!(e.contains("ErrCIDRSetSubNetTooBig"), "{e}");
        let e = render(&args(&["--cidr", "10.0.0.0/16", "--mask-size", "33"])).unwrap_err();
        assert!(e.contains("ErrSubNetMaskSizeInvalid"), "{e}");
        let e = render(&args(&["--cidr", "10.0.0.1/16"])).unwrap_err();
        assert!(
            e.contains("has host bits set; did you mean 10.0.0.0/16?"),
            "{e}"
        );
        let e = render(&args(&["--cidr", "bogus"])).unwrap_err();
        assert!(e.contains("not a valid CIDR"), "{e}");
        let e = render(&args(&["--cidr", "10.244.0.0/16, 10.245.0.0/24@28"])).unwrap_err();
        assert!(
            e.contains("\"10.245.0.0/24@28\" carries its own node mask size")
                && e.contains("(--cidr 10.245.0.0/24 --mask-size 28)"),
            "{e}"
        );
        let e = render(&args(&[])).unwrap_err();
        assert!(e.contains("at least one --cidr"), "{e}");
        let e = render(&args(&["--cidr", "10.0.0.0/8", "--pre-allocate", "8"])).unwrap_err();
        assert!(e.contains("--pre-allocate applies to"), "{e}");
        let e = render(&args(&["--cidr", "10.0.0.0/8", "--eni-adapters", "3"])).unwrap_err();
        assert!(e.contains("--eni-adapters does not apply"), "{e}");
        let e = render(&args(&[
            "--pool-mode",
            "multi-pool",
            "--cidr",
            "10.10.0.0/16",
        ]))
        .unwrap_err();
        assert!(e.contains("needs --mask-size"), "{e}");
        let e = render(&args(&["--pool-mode", "eni", "--eni-adapters", "3"])).unwrap_err();
        assert!(e.contains("--eni-ips-per-eni"), "{e}");
        let e = render(&args(&[
            "--pool-mode",
            "eni",
            "--cidr",
            "10.0.0.0/8",
            "--eni-adapters",
            "3",
            "--eni-ips-per-eni",
            "10",
        ]))
        .unwrap_err();
        assert!(
            e.contains("--cidr does not apply to --pool-mode eni"),
            "{e}"
        );
        assert_eq!(
            run(&args(&["--cidr", "fd00::/104", "--mask-size", "121"])),
            1
        );
    }

    #[test]
    fn plan_max_pods_zero_disables_check() {
        let v = json(&[
            "--cidr",
            "10.244.0.0/16",
            "--mask-size",
            "28",
            "--max-pods",
            "0",
        ]);
        assert_eq!(v["warnings"].as_array().unwrap().len(), 0);
        let w = json(&["--cidr", "10.244.0.0/16", "--mask-size", "28"]);
        assert_eq!(w["warnings"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn plan_multi_pool_outputs() {
        let base = [
            "--pool-mode",
            "multi-pool",
            "--cidr",
            "10.10.0.0/16",
            "--mask-size",
            "27",
            "--pre-allocate",
            "8",
        ];
        let v = json(&base);
        assert_eq!(v["mode"], "multi-pool");
        assert_eq!(v["blocks"], 2_048);
        assert_eq!(v["addressesPerBlock"], 32);
        assert_eq!(v["usablePerBlock"], 30);
        assert_eq!(v["idle"]["neededIps"], 16);
        assert_eq!(v["idle"]["blocksPerNode"], 1);
        assert_eq!(v["peak"]["neededIps"], 152);
        assert_eq!(v["peak"]["blocksPerNode"], 6);
        assert_eq!(v["pools"][0]["blocks"], 2_048);
        let text = render(&args(&base)).unwrap();
        assert!(text.contains("Multi-pool plan: IPv4, maskSize /27, pre-allocation 8"));
        assert!(text.contains("NEEDED (neededIPCeil)"), "{text}");
        assert!(text.contains("10.10.0.0/27 .. 10.10.255.224/27"), "{text}");
    }

    #[test]
    fn plan_eni_outputs() {
        let base = [
            "--pool-mode",
            "eni",
            "--eni-adapters",
            "3",
            "--eni-ips-per-eni",
            "10",
        ];
        let v = json(&base);
        assert_eq!(v["mode"], "eni");
        assert_eq!(v["maxAllocate"], 27);
        assert_eq!(v["podCapacity"], 25);
        assert_eq!(v["effectivePreAllocate"], 8);
        let mut pd = base.to_vec();
        pd.push("--eni-prefix-delegation");
        let w = json(&pd);
        assert_eq!(w["maxAllocate"], 432);
        let text = render(&args(&pd)).unwrap();
        assert!(text.contains("(10 - 1) x 16"), "{text}");
        assert!(text.contains("max-allocate (instance limit)"), "{text}");
        // A new node by default: the first cycle asks for the pre-allocation.
        assert_eq!(v["cycle"]["availableIps"], 0);
        assert_eq!(v["cycle"]["deficit"], 8);
        assert_eq!(v["cycle"]["perCycleAllocation"], 8);
        assert_eq!(v["cycle"]["prefixes"], serde_json::Value::Null);
        assert_eq!(w["cycle"]["prefixes"], 1);
    }

    #[test]
    fn plan_eni_cycle_worked_example() {
        // The chapter: preAllocate=8, minAllocate=16, 10 available, 4 used:
        // deficit = max(8 + 4 - 10, 16 - 10) = 6.
        let example = [
            "--pool-mode",
            "eni",
            "--eni-adapters",
            "3",
            "--eni-ips-per-eni",
            "10",
            "--pre-allocate",
            "8",
            "--min-allocate",
            "16",
            "--available-ips",
            "10",
            "--used-ips",
            "4",
        ];
        let v = json(&example);
        let c = &v["cycle"];
        assert_eq!(c["deficit"], 6);
        assert_eq!(c["maxAllocate"], 27, "the instance limit when not set");
        assert_eq!(c["perCycleAllocation"], 6);
        assert_eq!(c["excess"], 0);
        let text = render(&args(&example)).unwrap();
        assert!(
            text.contains("max(8 + 4 - 10, 16 - 10), at most 27 held, floor 0"),
            "{text}"
        );

        // Watermark, surge and the ENI's free addresses; prefixes with delegation.
        let mut busy = example.to_vec();
        busy.extend([
            "--max-above-watermark",
            "2",
            "--pending-pods",
            "10",
            "--eni-free-ips",
            "5",
            "--eni-prefix-delegation",
        ]);
        let c = json(&busy)["cycle"].clone();
        assert_eq!(c["surgeAllocate"], 4);
        assert_eq!(c["perCycleAllocation"], 5, "min(ENI free 5, 6 + 2 + 4)");
        assert_eq!(c["prefixes"], 1);
        let text = render(&args(&busy)).unwrap();
        assert!(text.contains("min(ENI free 5, 6 + 2 + 4)"), "{text}");

        // More than needed: excess = 26 - 10 used - 8 pre-allocate - 2 watermark.
        let c = json(&[
            "--pool-mode",
            "eni",
            "--eni-adapters",
            "3",
            "--eni-ips-per-eni",
            "10",
            "--available-ips",
            "26",
            "--used-ips",
            "10",
            "--max-above-watermark",
            "2",
        ])["cycle"]
            .clone();
        assert_eq!(
            (c["deficit"].clone(), c["excess"].clone()),
            (0.into(), 6.into())
        );
    }

    #[test]
    fn plan_eni_pre_and_max_allocate_in_force() {
        let small = [
            "--pool-mode",
            "eni",
            "--eni-adapters",
            "2",
            "--eni-ips-per-eni",
            "4",
            "--eni-first-interface-index",
            "1",
        ];
        // Not set: 8 lowered to the small instance's 3; set: kept, as upstream.
        let v = json(&small);
        assert_eq!(v["effectivePreAllocate"], 3);
        assert_eq!(v["cycle"]["preAllocate"], 3);
        let mut set = small.to_vec();
        set.extend(["--pre-allocate", "8", "--max-allocate", "10"]);
        let v = json(&set);
        assert_eq!(v["effectivePreAllocate"], 8);
        assert_eq!(v["cycle"]["preAllocate"], 8);
        assert_eq!(v["cycle"]["maxAllocate"], 10);
        assert_eq!(v["cycle"]["deficit"], 8);
        let warnings = v["warnings"].to_string();
        assert!(!warnings.contains("lowered"), "{warnings}");
        assert!(
            warnings.contains("max-allocate 10 is above the instance limit 3"),
            "{warnings}"
        );
    }

    #[test]
    fn plan_eni_cycle_flags_are_checked() {
        let e = render(&args(&["--cidr", "10.0.0.0/8", "--min-allocate", "16"])).unwrap_err();
        assert!(e.contains("--min-allocate does not apply"), "{e}");
        let e = render(&args(&[
            "--pool-mode",
            "multi-pool",
            "--cidr",
            "10.10.0.0/16",
            "--mask-size",
            "27",
            "--used-ips",
            "3",
        ]))
        .unwrap_err();
        assert!(e.contains("--used-ips does not apply"), "{e}");
        let e = render(&args(&[
            "--pool-mode",
            "eni",
            "--eni-adapters",
            "3",
            "--eni-ips-per-eni",
            "10",
            "--used-ips",
            "5",
            "--available-ips",
            "4",
        ]))
        .unwrap_err();
        assert!(e.contains("is more than --available-ips 4"), "{e}");
    }
}
