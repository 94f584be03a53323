//! Owns podnet's IPAM sizing math, the pure part of `podnet plan` (no I/O):
//! how many nodes a cluster pool serves and how many Pod addresses each node
//! gets ([`plan_cluster_pool`]), how many multi-pool blocks a node takes for
//! its pre-allocation ([`plan_multi_pool`]) and the per-node address limit of
//! an AWS ENI instance ([`plan_eni`]).
//!
//! The formulas are the chapter's "Sizing math" (`ipam-deep-dive.txt`):
//!
//! ```text
//! nodes per pool CIDR      = 2^(M - P)
//! addresses per node       = 2^(32 - M) (IPv4), 2^(128 - M) (IPv6)
//! usable Pod IPs per node  = addresses - 2 (network, broadcast) - reserved
//! ```
//!
//! Nothing is recomputed here that another module owns: the pool / mask
//! validation (Cilium's `ErrSubNetMaskSizeInvalid`, `ErrCIDRSetSubNetTooBig`,
//! overlapping pool CIDRs) is [`ClusterPoolConfig`] / [`CidrSet::new`], the
//! node count is [`CidrSet::max_cidrs`], and the addresses left after the
//! network/broadcast exclusion (none excluded for /31 and /32, IPv6 capped at
//! 65,536 tracked addresses) are [`HostScopeAllocator::usable`].

use std::fmt;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::Serialize;

use super::cidrset::{CLUSTER_SUBNET_MAX_DIFF, CidrSet, CidrSetError};
use super::clusterpool::{ClusterPoolConfig, ClusterPoolError, MaskMisfit, NodeCidrCarver};
use super::hostscope::{HostScopeAllocator, IPV6_RANGE_CAP};
/// Cilium's `neededIPCeil` (`pkg/ipam/multipool_manager.go`; chapter "How the
/// agent asks for capacity", `cilium-facts.md` §6.2): the next-but-one multiple
/// of P (0 → P, 1..=P → 2P, P+1 → 3P; P = 0 returns the input). Owned by
/// [`super::multipool`]; re-exported here for the sizing callers.
pub use super::multipool::needed_ip_ceil;
use super::{Family, IpamError};

/// Addresses Cilium takes from every node range for itself by default: the
/// router (`cilium_host`) and health IPs.
pub const DEFAULT_RESERVED_PER_NODE: u32 = 2;
/// Reserved addresses per node when Ingress is enabled (router, health,
/// ingress): what the chapter's sizing table subtracts.
pub const RESERVED_WITH_INGRESS: u32 = 3;
/// The kubelet's default `maxPods`.
pub const DEFAULT_MAX_PODS: u32 = 110;
/// Default rollout headroom on top of `maxPods` (old and new Pods overlap
/// during a rolling update); podnet's choice, the chapter gives no number.
pub const DEFAULT_ROLLOUT_HEADROOM_PERCENT: u32 = 25;
/// Cilium's default `--ipam-multi-pool-pre-allocation` for the default pool.
pub const DEFAULT_MULTI_POOL_PRE_ALLOCATION: u32 = 8;
/// ENI `pre-allocate` default (a 0 means not set: 8, lowered on small instances).
pub const DEFAULT_ENI_PRE_ALLOCATE: u32 = 8;
/// Addresses in one ENI delegated IPv4 prefix (/28).
pub const ENI_PREFIX_ADDRESSES: u64 = 16;
/// Host bits of the upstream minimum node mask (/30).
const MIN_HOST_BITS: u8 = 2;
/// Host bits of the upstream recommended node mask (/29 or larger).
const RECOMMENDED_HOST_BITS: u8 = 3;

/// Errors of the sizing functions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizingError {
    /// No pool CIDR was given.
    #[error("no pool CIDR given: pass at least one --cidr")]
    NoCidrs,
    /// Pool CIDRs of both families in one plan.
    #[error(
        "pool CIDRs {first} and {other} are of different IP families; plan one family at a time \
         (Cilium keeps separate IPv4 and IPv6 pool lists and mask sizes)"
    )]
    MixedFamilies { first: IpNet, other: IpNet },
    /// [`CidrSet::new`] refused the pool CIDR / node mask pair. Display names
    /// Cilium's error (`ErrCIDRSetSubNetTooBig`, `ErrSubNetMaskSizeInvalid`),
    /// quotes the cidrset's text and says what to change.
    #[error("{}", describe_cidrset_error(cidr, *mask, error))]
    CidrSet {
        cidr: IpNet,
        mask: u8,
        error: CidrSetError,
    },
    /// Any other pool-list error (overlapping pool CIDRs).
    #[error(transparent)]
    Pool(ClusterPoolError),
    /// The host-scope allocator cannot run over a node CIDR of this size.
    #[error("node mask /{mask}: {error}")]
    NodeCidr { mask: u8, error: IpamError },
    /// ENI: the instance has no adapter.
    #[error("ENI: the instance must have at least one network interface (--eni-adapters)")]
    EniNoAdapters,
    /// ENI: the instance has no IPv4 address per adapter.
    #[error("ENI: IPv4 addresses per ENI must be at least 1 (--eni-ips-per-eni)")]
    EniNoAddresses,
    /// ENI: `first-interface-index` leaves no adapter for Pods.
    #[error(
        "ENI: first-interface-index {first_interface_index} leaves no adapter for Pods: the \
         instance has {adapters} (indices 0..{adapters})"
    )]
    EniFirstIndex {
        first_interface_index: u32,
        adapters: u32,
    },
}

fn cilium_error_name(error: &CidrSetError) -> Option<&'static str> {
    match error {
        CidrSetError::SubNetTooBig => Some("ErrCIDRSetSubNetTooBig"),
        CidrSetError::SubNetMaskSizeInvalid => Some("ErrSubNetMaskSizeInvalid"),
        CidrSetError::NoRemaining => Some("ErrCIDRRangeNoCIDRsRemaining"),
        _ => None,
    }
}

fn describe_cidrset_error(cidr: &IpNet, mask: u8, error: &CidrSetError) -> String {
    let prefix = cidr.prefix_len();
    let head = match cilium_error_name(error) {
        Some(name) => format!("pool {cidr} with node mask /{mask}: {name}: {error}"),
        None => format!("pool {cidr} with node mask /{mask}: {error}"),
    };
    match error {
        CidrSetError::SubNetTooBig => format!(
            "{head} (IPv6 node mask minus pool prefix is {}, above clusterSubnetMaxDiff = {max}: \
             the allocator keeps an uncompressed bitmap of node CIDRs); use a node mask of /{} or \
             shorter, or a pool prefix of /{} or longer",
            mask - prefix,
            prefix + CLUSTER_SUBNET_MAX_DIFF,
            mask - CLUSTER_SUBNET_MAX_DIFF,
            max = CLUSTER_SUBNET_MAX_DIFF,
        ),
        CidrSetError::SubNetMaskSizeInvalid => {
            format!(
                "{head} (/{mask} is longer than an {} address)",
                Family::of_net(cidr).label()
            )
        }
        _ => head,
    }
}

/// The single family of `cidrs`.
fn single_family(cidrs: &[IpNet]) -> Result<Family, SizingError> {
    let first = *cidrs.first().ok_or(SizingError::NoCidrs)?;
    let family = Family::of_net(&first);
    if let Some(other) = cidrs.iter().find(|c| Family::of_net(c) != family) {
        return Err(SizingError::MixedFamilies {
            first,
            other: *other,
        });
    }
    Ok(family)
}

/// One [`CidrSet`] per pool CIDR, validated exactly as the cluster-pool
/// operator does (Cilium's multi-pool operator uses the same `cidralloc` /
/// `cidrset` allocators: `operator/pkg/ipam/allocator/multipool/pool.go`).
fn build_sets(family: Family, cidrs: &[IpNet], mask: u8) -> Result<NodeCidrCarver, SizingError> {
    let config = match family {
        Family::V4 => ClusterPoolConfig {
            enable_ipv4: true,
            enable_ipv6: false,
            ipv4_cidrs: cidrs.to_vec(),
            ipv4_mask_size: mask,
            ..ClusterPoolConfig::default()
        },
        Family::V6 => ClusterPoolConfig {
            enable_ipv4: false,
            enable_ipv6: true,
            ipv6_cidrs: cidrs.to_vec(),
            ipv6_mask_size: mask,
            ..ClusterPoolConfig::default()
        },
    };
    NodeCidrCarver::new(&config).map_err(|e| match e {
        ClusterPoolError::AllocatorInit(MaskMisfit {
            cidr, mask, error, ..
        }) => SizingError::CidrSet { cidr, mask, error },
        other => SizingError::Pool(other),
    })
}

/// First and last node CIDR of a set (a set always has at least one).
fn first_last(set: &CidrSet) -> (IpNet, IpNet) {
    let first = set.index_to_cidr(0).unwrap_or(set.cluster());
    let last = set.index_to_cidr(set.max_cidrs() - 1).unwrap_or(first);
    (first, last)
}

/// `/M`, plus the IPv4 equivalent by host bits for IPv6 (`/127 (the IPv6
/// equivalent of /31)`).
fn mask_label(family: Family, mask: u8) -> String {
    match family {
        Family::V4 => format!("/{mask}"),
        Family::V6 => format!(
            "/{mask} (the IPv6 equivalent of /{})",
            32u8.saturating_sub(128 - mask)
        ),
    }
}

/// A synthetic prefix of `family` with `host_bits` host bits (mask
/// arithmetic only).
fn prefix_with_host_bits(family: Family, host_bits: u8) -> Option<IpNet> {
    match family {
        Family::V4 => Ipv4Net::new(0u32.into(), 32u8.checked_sub(host_bits)?)
            .ok()
            .map(IpNet::V4),
        Family::V6 => Ipv6Net::new(0u128.into(), 128u8.checked_sub(host_bits)?)
            .ok()
            .map(IpNet::V6),
    }
}

/// `maxPods + ceil(maxPods × headroom / 100)`.
fn required_with_headroom(max_pods: Option<u32>, headroom_percent: u32) -> Option<u64> {
    max_pods.map(|m| {
        let m = u64::from(m);
        m + (m * u64::from(headroom_percent)).div_ceil(100)
    })
}

/// Formats a count with `,` thousands separators (`65,536`).
pub fn group_digits(n: u128) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

// ---------------------------------------------------------------- cluster-pool

/// Options of [`plan_cluster_pool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanOptions {
    /// Addresses Cilium takes per node: 2 (router, health), 3 with Ingress.
    pub reserved_per_node: u32,
    /// The kubelet's `maxPods`; `None` skips the density check.
    pub max_pods: Option<u32>,
    /// Extra Pods over `maxPods` during rolling updates, in percent.
    pub rollout_headroom_percent: u32,
}

impl Default for PlanOptions {
    /// Reserved 2, maxPods 110, headroom 25 %.
    fn default() -> Self {
        Self {
            reserved_per_node: DEFAULT_RESERVED_PER_NODE,
            max_pods: Some(DEFAULT_MAX_PODS),
            rollout_headroom_percent: DEFAULT_ROLLOUT_HEADROOM_PERCENT,
        }
    }
}

impl PlanOptions {
    /// `maxPods` plus the rollout headroom, rounded up (110 + 25 % → 138);
    /// `None` without `maxPods`.
    pub fn required_per_node(&self) -> Option<u64> {
        required_with_headroom(self.max_pods, self.rollout_headroom_percent)
    }
}

/// Sizing of one pool CIDR (JSON: camelCase).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolPlan {
    /// The pool CIDR (network form).
    pub cidr: IpNet,
    /// Node CIDRs it holds: 2^(M − P).
    pub nodes: u64,
    /// Addresses per node CIDR: 2^(bits − M).
    pub addresses_per_node: u128,
    /// Pod addresses per node (see [`Plan::usable_per_node`]).
    pub usable_per_node: u64,
    /// `nodes × usable_per_node`.
    pub pod_ips: u128,
    /// The first node CIDR carved out of the pool.
    pub first_node_cidr: IpNet,
    /// The last node CIDR carved out of the pool.
    pub last_node_cidr: IpNet,
}

/// Result of [`plan_cluster_pool`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub family: Family,
    /// The node mask size M.
    pub mask_size: u8,
    pub options: PlanOptions,
    /// Node CIDRs over all pool CIDRs.
    pub nodes: u64,
    /// Addresses per node CIDR: 2^(bits − M).
    pub addresses_per_node: u128,
    /// Addresses the host-scope allocator hands out per node, before the
    /// reserved ones: the network and broadcast addresses are excluded
    /// (none for /31 and /32 and their IPv6 equivalents) and IPv6 ranges
    /// are capped at 65,536 tracked addresses.
    pub allocatable_per_node: u64,
    /// `allocatable_per_node − reserved_per_node` (floor 0).
    pub usable_per_node: u64,
    /// `maxPods` plus headroom, if `maxPods` is set.
    pub required_per_node: Option<u64>,
    /// `nodes × addresses_per_node` (saturating).
    pub total_addresses: u128,
    /// `nodes × usable_per_node`.
    pub total_pod_ips: u128,
    /// Per pool CIDR, in the order given.
    pub pools: Vec<PoolPlan>,
    pub warnings: Vec<String>,
}

/// The chapter's "Sizing math" for cluster-pool (and Kubernetes host-scope)
/// IPAM: every pool CIDR of one family carved into `/mask` node CIDRs.
///
/// Errors: no CIDR, mixed families, overlapping pool CIDRs, the cidrset's
/// constructor errors (IPv6 difference above 16 → `ErrCIDRSetSubNetTooBig`;
/// mask above 32 / 128 → `ErrSubNetMaskSizeInvalid`; podnet's own: mask
/// shorter than a pool prefix, IPv4 difference above 24) and node CIDRs the
/// host-scope allocator refuses (≥ 31 / ≥ 127 host bits).
///
/// Warnings: a node mask above /30 (below the upstream minimum) or exactly
/// /30 (/29 or larger recommended), by host bits for IPv6; fewer usable
/// addresses than `maxPods` plus headroom; the IPv6 65,536-address cap; a
/// pool CIDR equal to the default 10.0.0.0/8 (overlap hazard).
pub fn plan_cluster_pool(
    cidrs: &[IpNet],
    mask: u8,
    opts: &PlanOptions,
) -> Result<Plan, SizingError> {
    let family = single_family(cidrs)?;
    let carver = build_sets(family, cidrs, mask)?;
    let sets = carver.sets(family);
    let (first_node, _) = first_last(&sets[0]);
    let allocatable = HostScopeAllocator::new(first_node)
        .map_err(|error| SizingError::NodeCidr { mask, error })?
        .usable();
    let host_bits = family.bits() - mask;
    let addresses_per_node = 1u128 << host_bits;
    let reserved = u64::from(opts.reserved_per_node);
    let usable = allocatable.saturating_sub(reserved);

    let pools: Vec<PoolPlan> = sets
        .iter()
        .map(|s| {
            let (first_node_cidr, last_node_cidr) = first_last(s);
            PoolPlan {
                cidr: s.cluster(),
                nodes: s.max_cidrs(),
                addresses_per_node,
                usable_per_node: usable,
                pod_ips: u128::from(s.max_cidrs()) * u128::from(usable),
                first_node_cidr,
                last_node_cidr,
            }
        })
        .collect();
    let nodes = pools
        .iter()
        .fold(0u64, |acc, p| acc.saturating_add(p.nodes));

    let mut warnings = Vec::new();
    let default_v4: IpNet = "10.0.0.0/8".parse().expect("static CIDR");
    for p in pools.iter().filter(|p| p.cidr == default_v4) {
        warnings.push(format!(
            "pool CIDR {} is Cilium's default and overlaps most corporate and VPC ranges; if it \
             overlaps the node network the nodes lose connectivity: set the list explicitly",
            p.cidr
        ));
    }
    mask_warnings(
        family,
        mask,
        allocatable,
        opts.reserved_per_node,
        &mut warnings,
    );
    if family == Family::V6 && addresses_per_node > u128::from(IPV6_RANGE_CAP) {
        warnings.push(format!(
            "a /{mask} node CIDR has {} addresses but the host-scope allocator tracks only the \
             first {} of an IPv6 range (Cilium caps it), so {} are allocatable per node",
            group_digits(addresses_per_node),
            group_digits(u128::from(IPV6_RANGE_CAP)),
            group_digits(u128::from(allocatable))
        ));
    }
    let required = opts.required_per_node();
    if let Some(required) = required
        && usable < required
    {
        warnings.push(density_warning(
            family,
            usable,
            opts.max_pods.unwrap_or_default(),
            opts.rollout_headroom_percent,
            required,
            reserved,
        ));
    } else if usable == 0 {
        warnings.push(format!(
            "no Pod address is left per node: {allocatable} allocatable minus {reserved} reserved"
        ));
    }

    Ok(Plan {
        family,
        mask_size: mask,
        options: *opts,
        nodes,
        addresses_per_node,
        allocatable_per_node: allocatable,
        usable_per_node: usable,
        required_per_node: required,
        total_addresses: u128::from(nodes).saturating_mul(addresses_per_node),
        total_pod_ips: u128::from(nodes) * u128::from(usable),
        pools,
        warnings,
    })
}

fn mask_warnings(
    family: Family,
    mask: u8,
    allocatable: u64,
    reserved: u32,
    warnings: &mut Vec<String>,
) {
    let host_bits = family.bits() - mask;
    if host_bits < MIN_HOST_BITS {
        warnings.push(format!(
            "node mask {} is above /30: upstream guidance is /30 at most and /29 or larger \
             recommended; a node CIDR with {host_bits} host bit(s) keeps {allocatable} \
             allocatable address(es) (no network/broadcast exclusion), before the {reserved} \
             reserved",
            mask_label(family, mask)
        ));
    } else if host_bits < RECOMMENDED_HOST_BITS {
        warnings.push(format!(
            "node mask {} is the upstream minimum; /29 or larger is recommended",
            mask_label(family, mask)
        ));
    }
}

/// The longest node mask whose usable count reaches `required`, by the
/// host-scope rules (2^h − 2 − reserved for h ≥ 2; IPv6 capped at 65,536).
fn suggest_mask(family: Family, required: u64, reserved: u64) -> Option<(u8, u64)> {
    (MIN_HOST_BITS..=family.bits()).find_map(|h| {
        let tracked: u128 = match family {
            Family::V6 if h >= 16 => u128::from(IPV6_RANGE_CAP),
            _ => 1u128 << h,
        };
        let usable = u64::try_from(tracked - 2).ok()?.saturating_sub(reserved);
        let prefix = prefix_with_host_bits(family, h)?;
        (usable >= required).then_some((prefix.prefix_len(), usable))
    })
}

fn density_warning(
    family: Family,
    usable: u64,
    max_pods: u32,
    headroom: u32,
    required: u64,
    reserved: u64,
) -> String {
    let hint = match suggest_mask(family, required, reserved) {
        Some((m, u)) => format!(
            "size the node mask for it (a /{m} node mask gives {} usable) or lower maxPods",
            group_digits(u128::from(u))
        ),
        None => "no node mask reaches it (the IPv6 host-scope range is capped at 65,536): lower \
                 maxPods"
            .to_string(),
    };
    format!(
        "usable Pod IPs per node ({}) are below maxPods {max_pods} plus {headroom}% rollout \
         headroom ({}): {hint}",
        group_digits(u128::from(usable)),
        group_digits(u128::from(required))
    )
}

// ------------------------------------------------------------------ multi-pool

/// Cilium's operator count of addresses in a block (`addrsInPrefix`,
/// `operator/pkg/ipam/allocator/multipool/pool_allocator.go`): 2^h − 2, or
/// 2^h for blocks of at most 2 addresses. The operator carves blocks until
/// this count reaches the node's request; it ignores allowFirstIP /
/// allowLastIP.
fn operator_block_addresses(addresses: u128) -> u128 {
    if addresses <= 2 {
        addresses
    } else {
        addresses - 2
    }
}

/// Options of [`plan_multi_pool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MultiPoolOptions {
    /// The pool's `--ipam-multi-pool-pre-allocation` value P (default 8 for
    /// the default pool, 0 for other pools).
    pub pre_allocate: u32,
    /// Addresses the node itself holds in this pool (router, health[,
    /// ingress]): 2 for the default pool, 0 for other pools.
    pub reserved_per_node: u32,
    /// The kubelet's `maxPods`; `None` skips the peak row.
    pub max_pods: Option<u32>,
    /// Extra Pods over `maxPods` during rolling updates, in percent.
    pub rollout_headroom_percent: u32,
}

impl Default for MultiPoolOptions {
    /// P = 8, reserved 2, maxPods 110, headroom 25 %.
    fn default() -> Self {
        Self {
            pre_allocate: DEFAULT_MULTI_POOL_PRE_ALLOCATION,
            reserved_per_node: DEFAULT_RESERVED_PER_NODE,
            max_pods: Some(DEFAULT_MAX_PODS),
            rollout_headroom_percent: DEFAULT_ROLLOUT_HEADROOM_PERCENT,
        }
    }
}

/// Blocks of one pool CIDR (JSON: camelCase).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockPoolPlan {
    pub cidr: IpNet,
    /// Per-node blocks it holds: 2^(maskSize − P).
    pub blocks: u64,
    pub first_block: IpNet,
    pub last_block: IpNet,
}

/// What one node requests and receives at a given number of in-use addresses
/// (JSON: camelCase).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeDemand {
    /// Addresses in use (reserved + Pods).
    pub in_use: u64,
    /// `neededIPCeil(in_use, P)`: what the agent writes to
    /// `spec.ipam.pools.requested`.
    pub needed_ips: u64,
    /// Blocks the operator carves to cover it: ceil(needed / usable per block).
    pub blocks_per_node: u64,
    /// Nodes the pool serves at this demand; `None` when a node needs no block.
    pub nodes: Option<u64>,
}

/// Result of [`plan_multi_pool`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiPoolPlan {
    pub family: Family,
    /// The pool's `maskSize`.
    pub mask_size: u8,
    pub options: MultiPoolOptions,
    /// Blocks over all pool CIDRs.
    pub blocks: u64,
    /// 2^(bits − maskSize).
    pub addresses_per_block: u128,
    /// The operator's count per block (2^h − 2; 2^h for /31, /32).
    pub usable_per_block: u128,
    /// A node with only its reserved addresses in use.
    pub idle: NodeDemand,
    /// A node at maxPods plus headroom, if `maxPods` is set.
    pub peak: Option<NodeDemand>,
    pub pools: Vec<BlockPoolPlan>,
    pub warnings: Vec<String>,
}

/// Multi-pool sizing for one pool (its CIDRs of one family and its
/// `maskSize`): blocks per pool CIDR, addresses per block, and how many
/// blocks a node takes for its pre-allocation, using Cilium's `neededIPCeil`
/// rounding (chapter, "How the agent asks for capacity"; `cilium-facts.md`
/// §6.2) at idle (reserved addresses in use) and at maxPods plus headroom.
/// Pending allocations are not modelled.
///
/// Validation is the cluster-pool one (same cidrset allocators). Warns when a
/// block has fewer usable addresses than 2 × P (the request as soon as one
/// address is in use): the chapter's "choose maskSize so a block is a few
/// times larger than preAlloc".
pub fn plan_multi_pool(
    cidrs: &[IpNet],
    mask_size: u8,
    opts: &MultiPoolOptions,
) -> Result<MultiPoolPlan, SizingError> {
    let family = single_family(cidrs)?;
    let carver = build_sets(family, cidrs, mask_size)?;
    let sets = carver.sets(family);
    let host_bits = family.bits() - mask_size;
    let addresses_per_block = 1u128.checked_shl(u32::from(host_bits)).unwrap_or(u128::MAX);
    let usable_per_block = operator_block_addresses(addresses_per_block);
    let pools: Vec<BlockPoolPlan> = sets
        .iter()
        .map(|s| {
            let (first_block, last_block) = first_last(s);
            BlockPoolPlan {
                cidr: s.cluster(),
                blocks: s.max_cidrs(),
                first_block,
                last_block,
            }
        })
        .collect();
    let blocks = pools
        .iter()
        .fold(0u64, |acc, p| acc.saturating_add(p.blocks));
    let p = u64::from(opts.pre_allocate);
    let reserved = u64::from(opts.reserved_per_node);
    let demand = |in_use: u64| {
        let needed_ips = needed_ip_ceil(in_use, p);
        let per_node = u128::from(needed_ips).div_ceil(usable_per_block);
        let blocks_per_node = u64::try_from(per_node).unwrap_or(u64::MAX);
        NodeDemand {
            in_use,
            needed_ips,
            blocks_per_node,
            nodes: (blocks_per_node > 0).then(|| blocks / blocks_per_node),
        }
    };
    let idle = demand(reserved);
    let required = required_with_headroom(opts.max_pods, opts.rollout_headroom_percent);
    let peak = required.map(|r| demand(reserved + r));

    let mut warnings = Vec::new();
    if p > 0 && usable_per_block < u128::from(2 * p) {
        warnings.push(format!(
            "a /{mask_size} block has {} usable addresses, fewer than 2 x preAlloc ({}) that \
             neededIPCeil requests as soon as one address is in use: nodes will acquire and \
             release many tiny blocks; choose maskSize so a block is a few times larger than \
             preAlloc (for example /27 = 32 addresses with preAlloc=8)",
            group_digits(usable_per_block),
            2 * p
        ));
    }
    if family == Family::V6 && addresses_per_block > u128::from(IPV6_RANGE_CAP) {
        warnings.push(format!(
            "a /{mask_size} block has {} addresses but the agent's allocator tracks only the \
             first {} of an IPv6 range",
            group_digits(addresses_per_block),
            group_digits(u128::from(IPV6_RANGE_CAP))
        ));
    }
    for (label, d) in [("idle", Some(idle)), ("at maxPods plus headroom", peak)] {
        if let Some(d) = d
            && d.nodes == Some(0)
        {
            warnings.push(format!(
                "{label} a node needs {} blocks but the pool has only {}",
                d.blocks_per_node, blocks
            ));
        }
    }

    Ok(MultiPoolPlan {
        family,
        mask_size,
        options: *opts,
        blocks,
        addresses_per_block,
        usable_per_block,
        idle,
        peak,
        pools,
        warnings,
    })
}

// ------------------------------------------------------------------------- ENI

/// Options of [`plan_eni`] (the instance type's limits come from AWS; the
/// chapter gives the formulas, not a table of instance types).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EniOptions {
    /// Network interfaces (ENIs) the instance type supports.
    pub adapters: u32,
    /// IPv4 addresses per ENI the instance type supports (primary included).
    pub ipv4_per_eni: u32,
    /// `first-interface-index`: ENIs below it are not used for Pods.
    pub first_interface_index: u32,
    /// `--aws-enable-prefix-delegation`: /28 prefixes instead of secondary IPs.
    pub prefix_delegation: bool,
    /// `use-primary-address`: each ENI's primary IP is usable too.
    pub use_primary_address: bool,
    /// `spec.ipam.pre-allocate`; 0 = not set: 8, lowered on small instances (an
    /// explicit value is kept, as upstream).
    pub pre_allocate: u32,
    /// Addresses Cilium takes per node (router, health[, ingress]).
    pub reserved_per_node: u32,
    /// The kubelet's `maxPods`; `None` skips the density check.
    pub max_pods: Option<u32>,
    /// Extra Pods over `maxPods` during rolling updates, in percent.
    pub rollout_headroom_percent: u32,
}

impl Default for EniOptions {
    /// No instance limits (callers set `adapters` and `ipv4_per_eni`),
    /// first-interface-index 0, no prefix delegation, pre-allocate not set,
    /// reserved 2, maxPods 110, headroom 25 %.
    fn default() -> Self {
        Self {
            adapters: 0,
            ipv4_per_eni: 0,
            first_interface_index: 0,
            prefix_delegation: false,
            use_primary_address: false,
            pre_allocate: 0,
            reserved_per_node: DEFAULT_RESERVED_PER_NODE,
            max_pods: Some(DEFAULT_MAX_PODS),
            rollout_headroom_percent: DEFAULT_ROLLOUT_HEADROOM_PERCENT,
        }
    }
}

/// Result of [`plan_eni`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EniPlan {
    pub options: EniOptions,
    /// `adapters − first_interface_index`.
    pub usable_enis: u32,
    /// Pod addresses per ENI: (IPs per ENI − 1), × 16 with prefix delegation,
    /// + 1 with use-primary-address.
    pub addresses_per_eni: u64,
    /// The default max-allocate (the instance limit): usable ENIs ×
    /// addresses per ENI.
    pub max_allocate: u64,
    /// The pre-allocate in force: the one set, else `min(8, usable ENIs × (IPs
    /// per ENI − 1))`.
    pub effective_pre_allocate: u32,
    /// `max_allocate − reserved` (floor 0).
    pub pod_capacity: u64,
    /// `maxPods` plus headroom, if `maxPods` is set.
    pub required_per_node: Option<u64>,
    pub warnings: Vec<String>,
}

/// The chapter's ENI instance limit ("Allocation algorithm", "Prefix
/// delegation", "ENI caveats"): max-allocate = (adapters −
/// firstInterfaceIndex) × (ipv4PerENI − 1), × 16 with prefix delegation, + 1
/// per ENI with usePrimaryAddress; a pre-allocate that is not set is 8,
/// lowered to min(8, (adapters − firstIndex) × (ipsPerENI − 1)) (the operator
/// fills in `GetMinimumAllocatableIPv4` only for a 0; a value that is set stays).
///
/// The operator's deficit / excess / watermark cycle is [`super::eni`]'s. Not
/// modelled: /28 fragmentation of the subnet, instance-type tables, IPv6 (/80
/// per node).
pub fn plan_eni(opts: &EniOptions) -> Result<EniPlan, SizingError> {
    if opts.adapters == 0 {
        return Err(SizingError::EniNoAdapters);
    }
    if opts.ipv4_per_eni == 0 {
        return Err(SizingError::EniNoAddresses);
    }
    if opts.first_interface_index >= opts.adapters {
        return Err(SizingError::EniFirstIndex {
            first_interface_index: opts.first_interface_index,
            adapters: opts.adapters,
        });
    }
    let usable_enis = opts.adapters - opts.first_interface_index;
    let secondary = u64::from(opts.ipv4_per_eni - 1);
    let mut addresses_per_eni = if opts.prefix_delegation {
        secondary * ENI_PREFIX_ADDRESSES
    } else {
        secondary
    };
    if opts.use_primary_address {
        addresses_per_eni += 1;
    }
    let max_allocate = u64::from(usable_enis) * addresses_per_eni;
    let small_limit = u64::from(usable_enis) * secondary;
    let effective_pre_allocate = if opts.pre_allocate == 0 {
        u32::try_from(u64::from(DEFAULT_ENI_PRE_ALLOCATE).min(small_limit))
            .unwrap_or(DEFAULT_ENI_PRE_ALLOCATE)
    } else {
        opts.pre_allocate
    };
    let reserved = u64::from(opts.reserved_per_node);
    let pod_capacity = max_allocate.saturating_sub(reserved);
    let required = required_with_headroom(opts.max_pods, opts.rollout_headroom_percent);

    let mut warnings = Vec::new();
    if opts.pre_allocate == 0 && effective_pre_allocate < DEFAULT_ENI_PRE_ALLOCATE {
        warnings.push(format!(
            "pre-allocate lowered from {DEFAULT_ENI_PRE_ALLOCATE} to {effective_pre_allocate} on \
             this small instance: min({DEFAULT_ENI_PRE_ALLOCATE}, ({} - {}) x ({} - 1))",
            opts.adapters, opts.first_interface_index, opts.ipv4_per_eni
        ));
    }
    if let Some(required) = required
        && pod_capacity < required
    {
        let hint = if opts.prefix_delegation {
            "use a larger instance type or lower maxPods"
        } else {
            "use a larger instance type or prefix delegation (x16 per ENI), or lower maxPods"
        };
        warnings.push(format!(
            "Pod capacity per node ({pod_capacity}: {max_allocate} instance limit minus \
             {reserved} reserved) is below maxPods {} plus {}% rollout headroom ({required}): \
             Pod density is bounded by the instance ENI/IP limit; {hint}",
            opts.max_pods.unwrap_or_default(),
            opts.rollout_headroom_percent
        ));
    }
    if opts.prefix_delegation {
        warnings.push(
            "prefix delegation is effective only on Nitro or bare-metal instance types, is not \
             used on a node that already holds secondary /32 IPs, and needs contiguous free /28 \
             blocks in the subnet (InsufficientPrefixesInSubnet makes the operator fall back to \
             /32 secondary IPs)"
                .to_string(),
        );
    }
    if pod_capacity == 0 {
        warnings.push(format!(
            "no Pod address per node: {max_allocate} instance limit minus {reserved} reserved"
        ));
    }

    Ok(EniPlan {
        options: *opts,
        usable_enis,
        addresses_per_eni,
        max_allocate,
        effective_pre_allocate,
        pod_capacity,
        required_per_node: required,
        warnings,
    })
}

impl fmt::Display for Plan {
    /// One-line summary: `65,536 nodes x 256 addresses (251 usable)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} nodes x {} addresses ({} usable)",
            group_digits(u128::from(self.nodes)),
            group_digits(self.addresses_per_node),
            group_digits(u128::from(self.usable_per_node))
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn table_opts() -> PlanOptions {
        // The chapter's table subtracts the 2 excluded and the 3 Cilium-owned
        // addresses; no maxPods so the rows carry only their own warnings.
        PlanOptions {
            reserved_per_node: RESERVED_WITH_INGRESS,
            max_pods: None,
            rollout_headroom_percent: DEFAULT_ROLLOUT_HEADROOM_PERCENT,
        }
    }

    /// The chapter's sizing table, row by row: (pool, mask, nodes,
    /// addresses per node, usable with reserved = 3 when the table states it).
    #[test]
    fn sizing_table_golden() {
        let rows: &[(&str, u8, u64, u128, Option<u64>)] = &[
            ("10.0.0.0/8", 24, 65_536, 256, Some(251)),
            ("10.244.0.0/16", 24, 256, 256, None),
            ("10.244.0.0/16", 26, 1_024, 64, Some(59)),
            ("10.244.0.0/16", 28, 4_096, 16, Some(11)),
            ("fd00::/104", 120, 65_536, 256, None),
            ("fd00:10:244::/96", 112, 65_536, 65_536, None),
        ];
        for &(cidr, mask, nodes, addrs, usable) in rows {
            let plan = plan_cluster_pool(&nets(&[cidr]), mask, &table_opts()).unwrap();
            assert_eq!(plan.nodes, nodes, "{cidr} /{mask} nodes");
            assert_eq!(plan.addresses_per_node, addrs, "{cidr} /{mask} addresses");
            assert_eq!(plan.pools.len(), 1);
            assert_eq!(plan.pools[0].nodes, nodes);
            assert_eq!(plan.pools[0].addresses_per_node, addrs);
            if let Some(u) = usable {
                assert_eq!(plan.usable_per_node, u, "{cidr} /{mask} usable");
            }
            // addresses − 2 − 3 for every row (the table's formula).
            assert_eq!(
                u128::from(plan.usable_per_node),
                addrs - 5,
                "{cidr} /{mask}"
            );
        }
    }

    #[test]
    fn table_rows_details() {
        let p = plan_cluster_pool(&nets(&["10.244.0.0/16"]), 24, &table_opts()).unwrap();
        assert_eq!(p.allocatable_per_node, 254);
        assert_eq!(p.usable_per_node, 251);
        assert_eq!(p.total_addresses, 65_536);
        assert_eq!(p.total_pod_ips, 256 * 251);
        assert_eq!(
            p.pools[0].first_node_cidr,
            "10.244.0.0/24".parse::<IpNet>().unwrap()
        );
        assert_eq!(
            p.pools[0].last_node_cidr,
            "10.244.255.0/24".parse::<IpNet>().unwrap()
        );
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
        assert_eq!(p.to_string(), "256 nodes x 256 addresses (251 usable)");

        let d = plan_cluster_pool(&nets(&["fd00:10:244::/96"]), 112, &table_opts()).unwrap();
        assert_eq!(d.allocatable_per_node, 65_534);
        assert_eq!(d.usable_per_node, 65_531);
        assert_eq!(
            d.pools[0].last_node_cidr,
            "fd00:10:244::ffff:0/112".parse::<IpNet>().unwrap()
        );
    }

    #[test]
    fn defaults_reserve_two() {
        let p = plan_cluster_pool(&nets(&["10.244.0.0/16"]), 24, &PlanOptions::default()).unwrap();
        assert_eq!(p.usable_per_node, 252);
        assert_eq!(p.required_per_node, Some(138));
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    }

    #[test]
    fn default_pool_overlap_warning() {
        let p = plan_cluster_pool(&nets(&["10.0.0.0/8"]), 24, &table_opts()).unwrap();
        assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);
        assert!(p.warnings[0].contains("10.0.0.0/8"));
        assert!(p.warnings[0].contains("set the list explicitly"));
        // Only the exact default, not a sub-range.
        let q = plan_cluster_pool(&nets(&["10.0.0.0/9"]), 24, &table_opts()).unwrap();
        assert!(q.warnings.is_empty(), "{:?}", q.warnings);
    }

    #[test]
    fn ipv6_difference_17_is_an_error() {
        let err = plan_cluster_pool(&nets(&["fd00::/104"]), 121, &table_opts()).unwrap_err();
        assert_eq!(
            err,
            SizingError::CidrSet {
                cidr: "fd00::/104".parse().unwrap(),
                mask: 121,
                error: CidrSetError::SubNetTooBig
            }
        );
        let msg = err.to_string();
        assert!(msg.contains("ErrCIDRSetSubNetTooBig"), "{msg}");
        assert!(
            msg.contains("New CIDR set failed; the node CIDR size is too big"),
            "{msg}"
        );
        assert!(
            msg.contains("is 17, above clusterSubnetMaxDiff = 16"),
            "{msg}"
        );
        assert!(msg.contains("/120 or shorter"), "{msg}");
        assert!(msg.contains("/105 or longer"), "{msg}");
        // 96 → 113 as well; exactly 16 is fine.
        assert!(plan_cluster_pool(&nets(&["fd00:10:244::/96"]), 113, &table_opts()).is_err());
        assert!(plan_cluster_pool(&nets(&["fd00:10:244::/96"]), 112, &table_opts()).is_ok());
    }

    #[test]
    fn mask_size_invalid() {
        let err = plan_cluster_pool(&nets(&["10.0.0.0/16"]), 33, &table_opts()).unwrap_err();
        assert!(matches!(
            err,
            SizingError::CidrSet {
                error: CidrSetError::SubNetMaskSizeInvalid,
                ..
            }
        ));
        let msg = err.to_string();
        assert!(msg.contains("ErrSubNetMaskSizeInvalid"), "{msg}");
        assert!(msg.contains("SubNetMask is invalid"), "{msg}");
        let v6 = plan_cluster_pool(&nets(&["fd00::/120"]), 129, &table_opts()).unwrap_err();
        assert!(v6.to_string().contains("ErrSubNetMaskSizeInvalid"));
    }

    #[test]
    fn other_validation_errors() {
        assert_eq!(
            plan_cluster_pool(&[], 24, &table_opts()).unwrap_err(),
            SizingError::NoCidrs
        );
        let mixed = plan_cluster_pool(&nets(&["10.0.0.0/16", "fd00::/104"]), 24, &table_opts());
        assert!(matches!(mixed, Err(SizingError::MixedFamilies { .. })));
        let overlap = plan_cluster_pool(&nets(&["10.0.0.0/16", "10.0.1.0/24"]), 26, &table_opts())
            .unwrap_err();
        assert!(matches!(
            overlap,
            SizingError::Pool(ClusterPoolError::Collision { .. })
        ));
        assert!(overlap.to_string().contains("collides with"), "{overlap}");
        let shorter = plan_cluster_pool(&nets(&["10.0.0.0/16"]), 8, &table_opts()).unwrap_err();
        assert!(matches!(
            shorter,
            SizingError::CidrSet {
                error: CidrSetError::NodeMaskShorterThanCluster { .. },
                ..
            }
        ));
        // A /1 node CIDR has no host-scope range.
        let huge = plan_cluster_pool(&nets(&["0.0.0.0/0"]), 1, &table_opts()).unwrap_err();
        assert!(matches!(huge, SizingError::NodeCidr { mask: 1, .. }));
    }

    #[test]
    fn mask_31_and_32_warn() {
        let p31 = plan_cluster_pool(&nets(&["10.244.0.0/24"]), 31, &table_opts()).unwrap();
        assert_eq!(p31.nodes, 128);
        assert_eq!(p31.addresses_per_node, 2);
        assert_eq!(p31.allocatable_per_node, 2, "a /31 keeps both addresses");
        assert_eq!(p31.usable_per_node, 0);
        assert!(
            p31.warnings
                .iter()
                .any(|w| w.contains("node mask /31 is above /30") && w.contains("/29 or larger"))
        );
        assert!(p31.warnings.iter().any(|w| w.contains("no Pod address")));

        let p32 = plan_cluster_pool(&nets(&["10.244.0.0/24"]), 32, &table_opts()).unwrap();
        assert_eq!(p32.nodes, 256);
        assert_eq!(p32.allocatable_per_node, 1, "a /32 has one address");
        assert!(
            p32.warnings
                .iter()
                .any(|w| w.contains("node mask /32 is above /30"))
        );

        let p30 = plan_cluster_pool(&nets(&["10.244.0.0/24"]), 30, &table_opts()).unwrap();
        assert_eq!(p30.allocatable_per_node, 2);
        assert!(
            p30.warnings
                .iter()
                .any(|w| w.contains("/30 is the upstream minimum"))
        );
        let p29 = plan_cluster_pool(&nets(&["10.244.0.0/24"]), 29, &table_opts()).unwrap();
        assert_eq!(p29.usable_per_node, 3);
        assert!(!p29.warnings.iter().any(|w| w.contains("upstream")));

        let v6 = plan_cluster_pool(&nets(&["fd00::/120"]), 127, &table_opts()).unwrap();
        assert_eq!(v6.allocatable_per_node, 2);
        assert!(
            v6.warnings
                .iter()
                .any(|w| w.contains("/127 (the IPv6 equivalent of /31) is above /30"))
        );
    }

    #[test]
    fn max_pods_warning_names_numbers() {
        let p = plan_cluster_pool(&nets(&["10.244.0.0/16"]), 26, &PlanOptions::default()).unwrap();
        assert_eq!(p.usable_per_node, 60);
        assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);
        let w = &p.warnings[0];
        assert!(w.contains("(60)"), "{w}");
        assert!(w.contains("maxPods 110"), "{w}");
        assert!(w.contains("25% rollout headroom (138)"), "{w}");
        assert!(w.contains("a /24 node mask gives 252 usable"), "{w}");

        // Exactly enough: 252 usable ≥ 201 + 51 = 252? 201 + ceil(50.25) = 252.
        let opts = PlanOptions {
            max_pods: Some(201),
            ..PlanOptions::default()
        };
        let ok = plan_cluster_pool(&nets(&["10.244.0.0/16"]), 24, &opts).unwrap();
        assert_eq!(ok.required_per_node, Some(252));
        assert!(ok.warnings.is_empty(), "{:?}", ok.warnings);
        let opts = PlanOptions {
            max_pods: Some(202),
            ..PlanOptions::default()
        };
        let short = plan_cluster_pool(&nets(&["10.244.0.0/16"]), 24, &opts).unwrap();
        assert!(short.warnings[0].contains("/23 node mask gives 508"));

        // No maxPods: no density warning.
        let none = PlanOptions {
            max_pods: None,
            ..PlanOptions::default()
        };
        let q = plan_cluster_pool(&nets(&["10.244.0.0/16"]), 26, &none).unwrap();
        assert!(q.warnings.is_empty(), "{:?}", q.warnings);
    }

    #[test]
    fn ipv6_cap_warning_and_unreachable_density() {
        let opts = PlanOptions {
            max_pods: Some(70_000),
            ..PlanOptions::default()
        };
        let p = plan_cluster_pool(&nets(&["fd00::/80"]), 96, &opts).unwrap();
        assert_eq!(p.addresses_per_node, 1u128 << 32);
        assert_eq!(p.allocatable_per_node, 65_534);
        assert!(
            p.warnings
                .iter()
                .any(|w| w.contains("tracks only the first 65,536"))
        );
        assert!(
            p.warnings
                .iter()
                .any(|w| w.contains("no node mask reaches it"))
        );
    }

    #[test]
    fn several_pools_sum() {
        let p = plan_cluster_pool(
            &nets(&["10.244.0.0/16", "10.245.0.0/17"]),
            24,
            &table_opts(),
        )
        .unwrap();
        assert_eq!(p.nodes, 256 + 128);
        assert_eq!(p.pools[1].nodes, 128);
        assert_eq!(p.total_pod_ips, 384 * 251);
    }

    #[test]
    fn needed_ip_ceil_cases() {
        // cilium-facts §6.2 examples with p = 16.
        for (n, want) in [(0, 16), (1, 32), (15, 32), (16, 32), (17, 48)] {
            assert_eq!(needed_ip_ceil(n, 16), want, "n={n}");
        }
        // 0 → P, 1..=P → 2P, P+1 → 3P, large.
        let p = 8;
        assert_eq!(needed_ip_ceil(0, p), 8);
        for n in 1..=p {
            assert_eq!(needed_ip_ceil(n, p), 16, "n={n}");
        }
        assert_eq!(needed_ip_ceil(p + 1, p), 24);
        assert_eq!(needed_ip_ceil(1_000, p), 1_008);
        assert_eq!(needed_ip_ceil(1_001, p), 1_016);
        // p = 0 returns the input.
        assert_eq!(needed_ip_ceil(0, 0), 0);
        assert_eq!(needed_ip_ceil(37, 0), 37);
    }

    #[test]
    fn multi_pool_chapter_example() {
        // Chapter: default pool 10.10.0.0/16, maskSize 27, preAlloc 8.
        let p =
            plan_multi_pool(&nets(&["10.10.0.0/16"]), 27, &MultiPoolOptions::default()).unwrap();
        assert_eq!(p.blocks, 2_048);
        assert_eq!(p.addresses_per_block, 32);
        assert_eq!(p.usable_per_block, 30);
        // Idle: router + health in use → neededIPCeil(2, 8) = 16 → 1 block.
        assert_eq!(
            p.idle,
            NodeDemand {
                in_use: 2,
                needed_ips: 16,
                blocks_per_node: 1,
                nodes: Some(2_048)
            }
        );
        // Peak: 2 + 138 = 140 → neededIPCeil = 152 → ceil(152/30) = 6 blocks.
        assert_eq!(
            p.peak,
            Some(NodeDemand {
                in_use: 140,
                needed_ips: 152,
                blocks_per_node: 6,
                nodes: Some(341)
            })
        );
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
        assert_eq!(
            p.pools[0].last_block,
            "10.10.255.224/27".parse::<IpNet>().unwrap()
        );
    }

    #[test]
    fn multi_pool_idle_demands() {
        // Non-default pool: nothing reserved. 0 in use → P; P = 0 → no block.
        let opts = MultiPoolOptions {
            reserved_per_node: 0,
            max_pods: None,
            ..MultiPoolOptions::default()
        };
        let p = plan_multi_pool(&nets(&["10.20.0.0/16"]), 27, &opts).unwrap();
        assert_eq!(p.idle.needed_ips, 8);
        assert_eq!(p.idle.blocks_per_node, 1);
        assert_eq!(p.peak, None);
        let zero = MultiPoolOptions {
            pre_allocate: 0,
            ..opts
        };
        let q = plan_multi_pool(&nets(&["10.20.0.0/16"]), 27, &zero).unwrap();
        assert_eq!(q.idle.needed_ips, 0);
        assert_eq!(q.idle.blocks_per_node, 0);
        assert_eq!(q.idle.nodes, None);
    }

    #[test]
    fn multi_pool_tiny_blocks_warn() {
        let p =
            plan_multi_pool(&nets(&["10.10.0.0/16"]), 29, &MultiPoolOptions::default()).unwrap();
        assert_eq!(p.usable_per_block, 6);
        // neededIPCeil(2, 8) = 16 → ceil(16/6) = 3 blocks at idle.
        assert_eq!(p.idle.blocks_per_node, 3);
        assert!(
            p.warnings
                .iter()
                .any(|w| w.contains("fewer than 2 x preAlloc (16)") && w.contains("/27 = 32"))
        );
        // /32 blocks: 1 address each, counted whole.
        let q =
            plan_multi_pool(&nets(&["10.10.0.0/24"]), 32, &MultiPoolOptions::default()).unwrap();
        assert_eq!(q.usable_per_block, 1);
        assert_eq!(q.idle.blocks_per_node, 16);
        // A pool too small for one node at peak.
        let r =
            plan_multi_pool(&nets(&["10.10.0.0/26"]), 28, &MultiPoolOptions::default()).unwrap();
        assert_eq!(r.peak.unwrap().nodes, Some(0));
        assert!(
            r.warnings
                .iter()
                .any(|w| w.contains("but the pool has only 4"))
        );
    }

    #[test]
    fn multi_pool_validation_is_cidrset() {
        let err =
            plan_multi_pool(&nets(&["fd00::/96"]), 113, &MultiPoolOptions::default()).unwrap_err();
        assert!(err.to_string().contains("ErrCIDRSetSubNetTooBig"));
    }

    #[test]
    fn eni_limits() {
        // 3 ENIs x 10 IPv4 each (e.g. an m5.large), first index 0.
        let opts = EniOptions {
            adapters: 3,
            ipv4_per_eni: 10,
            ..EniOptions::default()
        };
        let p = plan_eni(&opts).unwrap();
        assert_eq!(p.usable_enis, 3);
        assert_eq!(p.addresses_per_eni, 9);
        assert_eq!(p.max_allocate, 27);
        assert_eq!(p.effective_pre_allocate, 8);
        assert_eq!(p.pod_capacity, 25);
        assert!(
            p.warnings
                .iter()
                .any(|w| w.contains("prefix delegation (x16"))
        );

        let pd = plan_eni(&EniOptions {
            prefix_delegation: true,
            ..opts
        })
        .unwrap();
        assert_eq!(pd.addresses_per_eni, 144);
        assert_eq!(pd.max_allocate, 432);
        assert_eq!(pd.pod_capacity, 430);
        assert!(pd.warnings.iter().any(|w| w.contains("Nitro")));
        assert!(!pd.warnings.iter().any(|w| w.contains("below maxPods")));

        let first1 = plan_eni(&EniOptions {
            first_interface_index: 1,
            use_primary_address: true,
            ..opts
        })
        .unwrap();
        assert_eq!(first1.usable_enis, 2);
        assert_eq!(first1.addresses_per_eni, 10);
        assert_eq!(first1.max_allocate, 20);
    }

    #[test]
    fn eni_small_instance_lowers_pre_allocate() {
        // 2 ENIs x 4 IPv4 (t3.micro-like), first index 1: 1 x 3 = 3.
        let p = plan_eni(&EniOptions {
            adapters: 2,
            ipv4_per_eni: 4,
            first_interface_index: 1,
            pre_allocate: 0,
            ..EniOptions::default()
        })
        .unwrap();
        assert_eq!(p.effective_pre_allocate, 3);
        assert_eq!(p.max_allocate, 3);
        assert!(p.warnings.iter().any(|w| w.contains("lowered from 8 to 3")));
    }

    #[test]
    fn eni_pre_allocate_set_is_kept() {
        // Upstream lowers only the default: a pre-allocate that is set stays, even
        // on an instance that cannot hold it.
        let small = EniOptions {
            adapters: 2,
            ipv4_per_eni: 4,
            first_interface_index: 1,
            ..EniOptions::default()
        };
        for set in [2, 8, 12] {
            let p = plan_eni(&EniOptions {
                pre_allocate: set,
                ..small
            })
            .unwrap();
            assert_eq!(p.effective_pre_allocate, set);
            assert!(!p.warnings.iter().any(|w| w.contains("lowered")));
        }
        assert_eq!(plan_eni(&small).unwrap().effective_pre_allocate, 3);
    }

    #[test]
    fn eni_errors() {
        let base = EniOptions {
            adapters: 3,
            ipv4_per_eni: 10,
            ..EniOptions::default()
        };
        assert_eq!(
            plan_eni(&EniOptions {
                adapters: 0,
                ..base
            })
            .unwrap_err(),
            SizingError::EniNoAdapters
        );
        assert_eq!(
            plan_eni(&EniOptions {
                ipv4_per_eni: 0,
                ..base
            })
            .unwrap_err(),
            SizingError::EniNoAddresses
        );
        assert!(matches!(
            plan_eni(&EniOptions {
                first_interface_index: 3,
                ..base
            }),
            Err(SizingError::EniFirstIndex { .. })
        ));
    }

    #[test]
    fn digits() {
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(251), "251");
        assert_eq!(group_digits(65_536), "65,536");
        assert_eq!(group_digits(4_294_967_296), "4,294,967,296");
    }
}
