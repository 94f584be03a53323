//! Owns [`PoolOperator`], the multi-pool operator's block carving: the part of
//! cilium-operator's multi-pool allocator (`operator/pkg/ipam/allocator/multipool`)
//! that carves per-node blocks out of the pools' CIDRs, plus the cluster-pool →
//! multi-pool migration checks. The embedded operator uses one for podnet's own
//! node; `podnet operator` uses one for every node (`operator::multi_pool::blocks`
//! keeps which node holds which block, and checks pool edits against every node's
//! blocks with [`PoolOperator::update_pools_held`]). Pure logic, no I/O: the caller reads
//! `spec.ipam.pools.requested`, passes `spec.ipam.pools.allocated` in and writes
//! the returned errors to `status.ipam.operator-status.error`.
//!
//! # Carving
//!
//! One [`CidrSet`] per pool CIDR per family, with the family's `maskSize` as
//! node mask. A pool family's CIDRs are tried in the order listed, full ones
//! skipped; inside a CIDR the cidrset's round-robin order applies. Blocks that
//! overlap a v2 `reservedRanges` entry are occupied up front, so they are
//! never handed out (a block the node already holds there keeps working).
//!
//! Demand is met when the node's blocks of a pool and family hold at least
//! `needed` addresses, counted like Cilium's operator (`addrsInPrefix`): a
//! block of 2^h addresses counts 2^h − 2 (network and broadcast), or 2^h
//! when it has at most 2 addresses; allowFirstIP / allowLastIP are ignored.
//! This is the same count as `sizing::plan_multi_pool`.
//!
//! # Errors
//!
//! `satisfy` returns one message per failed pool and family, Cilium's text:
//! `failed to allocate ipv4 address for node "<node>" from pool "<pool>": <reason>`.
//! Multi-error results of the other functions are joined with `\n` (Go's
//! `errors.Join`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use super::Family;
use super::cidrset::{CidrSet, CidrSetError};
use super::ip_number::{from_number, span, to_number};
use super::pooldef::{PoolDef, PoolFamilySpec};
use crate::resources::{AllocatedPool, RequestedPool};

/// Prefix Cilium's operator puts before a migration error in
/// `status.ipam.operator-status.error`: write
/// `format!("{MIGRATION_FAILED_PREFIX}{err}")` for an error of
/// [`check_migration`].
pub const MIGRATION_FAILED_PREFIX: &str = "migration to multi-pool IPAM failed: ";

const FAMILIES: [Family; 2] = [Family::V4, Family::V6];

/// Addresses Cilium's operator counts in a block of `/mask` (`addrsInPrefix`).
fn block_addresses(family: Family, mask: u8) -> u128 {
    let host_bits = u32::from(family.bits().saturating_sub(mask));
    match 1u128.checked_shl(host_bits) {
        Some(n) if n <= 2 => n,
        Some(n) => n - 2,
        None => u128::MAX,
    }
}

/// The smallest list of prefixes covering `[start, end]` (inclusive).
fn range_prefixes(family: Family, start: u128, end: u128) -> Vec<IpNet> {
    let bits = u32::from(family.bits());
    let mut out = Vec::new();
    let mut cur = start;
    loop {
        let mut k = if cur == 0 {
            bits
        } else {
            cur.trailing_zeros().min(bits)
        };
        let last_offset = |k: u32| 1u128.checked_shl(k).map_or(u128::MAX, |n| n - 1);
        while k > 0 && end - cur < last_offset(k) {
            k -= 1;
        }
        // `bits - k` is at most 128 and the address is aligned.
        if let Ok(net) = IpNet::new(from_number(family, cur), (bits - k) as u8) {
            out.push(net);
        }
        let last = cur + last_offset(k);
        if last >= end {
            return out;
        }
        cur = last + 1;
    }
}

fn family_of_spec(def: &PoolDef, family: Family) -> Option<&PoolFamilySpec> {
    def.family(family)
}

fn join_nets(nets: &[IpNet]) -> String {
    nets.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `spec.<family>.maskSize` sizes that fit `cidr`, for a cidrset error whose
/// own text does not say them (else empty).
fn mask_field_advice(source: &CidrSetError, family: Family, cidr: IpNet) -> String {
    source.mask_advice(&format!("spec.{family}.maskSize"), cidr)
}

/// Why a pool definition cannot be carved, or a listed block is not one of its
/// blocks: the pool, the family, the CIDR or block, and what is wrong with it.
/// The `unable to ...` texts are Cilium's operator's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolProblem {
    #[error("pool {pool:?} is defined more than once")]
    DefinedTwice { pool: String },
    #[error("pool {pool:?}: {family} CIDR {cidr} is not an {} CIDR", .family.label())]
    CidrFamily {
        pool: String,
        family: Family,
        cidr: IpNet,
    },
    /// The cidrset refuses a CIDR / `maskSize` pair (its error kept, with the
    /// sizes that fit when its text does not say them).
    #[error(
        "pool {pool:?}: {family} CIDR {cidr} with maskSize {mask_size}: {source}{}",
        mask_field_advice(.source, *.family, *.cidr)
    )]
    CidrMaskSize {
        pool: String,
        family: Family,
        cidr: IpNet,
        mask_size: u8,
        #[source]
        source: CidrSetError,
    },
    #[error(
        "pool {pool:?}: {family} reserved range {start}-{end} is not an {} range",
        .family.label()
    )]
    RangeFamily {
        pool: String,
        family: Family,
        start: IpAddr,
        end: IpAddr,
    },
    #[error(
        "pool {pool:?}: {family} reserved range {start}-{end} is invalid: the start is after \
         the end"
    )]
    RangeReversed {
        pool: String,
        family: Family,
        start: IpAddr,
        end: IpAddr,
    },
    #[error(
        "pool {pool_a:?} {family} CIDR {cidr_a} overlaps pool {pool_b:?} {family} CIDR {cidr_b}: \
         pool CIDRs must not overlap one another"
    )]
    Overlap {
        family: Family,
        pool_a: String,
        cidr_a: IpNet,
        pool_b: String,
        cidr_b: IpNet,
    },
    #[error(
        "unable to find pool {pool}, prefix {block} is still allocated to the node but is \
         marked as orphan"
    )]
    UnknownPool { pool: String, block: IpNet },
    #[error("unable to reuse from pool {pool}: cidr {block} is not part of the requested pool")]
    NotInPool { pool: String, block: IpNet },
    #[error(
        "unable to reuse from pool {pool}: cidr {block} is a /{} but the pool's {family} \
         maskSize is {mask_size}",
        .block.prefix_len()
    )]
    BlockSize {
        pool: String,
        block: IpNet,
        family: Family,
        mask_size: u8,
    },
    #[error(
        "unable to reuse from pool {pool}: cidr {block} is not on a block boundary (expected {})",
        .block.trunc()
    )]
    BlockBoundary { pool: String, block: IpNet },
}

/// One family of one pool: its block size, one cidrset per CIDR (in the
/// order listed) and its reserved ranges.
#[derive(Debug, Clone)]
struct FamilyPool {
    family: Family,
    mask_size: u8,
    sets: Vec<CidrSet>,
    reserved: Vec<(u128, u128)>,
}

impl FamilyPool {
    fn build(pool: &str, family: Family, spec: &PoolFamilySpec) -> Result<Self, PoolProblem> {
        let mut sets = Vec::with_capacity(spec.cidrs.len());
        for cidr in &spec.cidrs {
            if Family::of_net(cidr) != family {
                return Err(PoolProblem::CidrFamily {
                    pool: pool.into(),
                    family,
                    cidr: *cidr,
                });
            }
            let set = CidrSet::new(*cidr, spec.mask_size).map_err(|source| {
                PoolProblem::CidrMaskSize {
                    pool: pool.into(),
                    family,
                    cidr: *cidr,
                    mask_size: spec.mask_size,
                    source,
                }
            })?;
            sets.push(set);
        }
        let mut reserved = Vec::with_capacity(spec.reserved_ranges.len());
        for &(start, end) in &spec.reserved_ranges {
            let range = |reversed: bool| {
                let pool = pool.into();
                if reversed {
                    PoolProblem::RangeReversed {
                        pool,
                        family,
                        start,
                        end,
                    }
                } else {
                    PoolProblem::RangeFamily {
                        pool,
                        family,
                        start,
                        end,
                    }
                }
            };
            if Family::of_addr(&start) != family || Family::of_addr(&end) != family {
                return Err(range(false));
            }
            let (s, e) = (to_number(start), to_number(end));
            if s > e {
                return Err(range(true));
            }
            reserved.push((s, e));
        }
        let mut fp = FamilyPool {
            family,
            mask_size: spec.mask_size,
            sets,
            reserved,
        };
        fp.occupy_reserved();
        Ok(fp)
    }

    /// Marks every block overlapping a reserved range as allocated.
    fn occupy_reserved(&mut self) {
        let family = self.family;
        for set in &mut self.sets {
            let cluster = set.cluster();
            let (base, last) = span(&cluster);
            for &(s, e) in &self.reserved {
                let (lo, hi) = (s.max(base), e.min(last));
                if lo > hi {
                    continue;
                }
                for prefix in range_prefixes(family, lo, hi) {
                    // Inside the cluster CIDR by construction.
                    let _ = set.occupy(&prefix);
                }
            }
        }
    }

    fn overlaps_reserved(&self, block: &IpNet) -> bool {
        let (bs, be) = span(block);
        self.reserved.iter().any(|&(s, e)| s <= be && bs <= e)
    }

    /// The cidrset whose CIDR contains `block`.
    fn set_of(&self, block: &IpNet) -> Option<usize> {
        self.sets.iter().position(|s| {
            let c = s.cluster();
            block.prefix_len() >= c.prefix_len() && c.contains(&block.network())
        })
    }

    /// `Ok(set index)` when `block` is a block of this family: in one of its
    /// CIDRs, of the block size and on a block boundary. Otherwise Cilium's
    /// `unable to reuse from pool` reason.
    fn check_block(&self, pool: &str, block: &IpNet) -> Result<usize, PoolProblem> {
        let Some(i) = self.set_of(block) else {
            return Err(PoolProblem::NotInPool {
                pool: pool.into(),
                block: *block,
            });
        };
        if block.prefix_len() != self.mask_size {
            return Err(PoolProblem::BlockSize {
                pool: pool.into(),
                block: *block,
                family: self.family,
                mask_size: self.mask_size,
            });
        }
        if block.trunc() != *block {
            return Err(PoolProblem::BlockBoundary {
                pool: pool.into(),
                block: *block,
            });
        }
        Ok(i)
    }

    /// The first free block, trying the CIDRs in the order listed.
    fn allocate(&mut self) -> Result<IpNet, CidrSetError> {
        for set in &mut self.sets {
            if set.is_full() {
                continue;
            }
            return set.allocate_next();
        }
        Err(CidrSetError::NoRemaining)
    }
}

/// One pool: its definition and per-family state.
#[derive(Debug, Clone)]
struct Pool {
    def: PoolDef,
    v4: Option<FamilyPool>,
    v6: Option<FamilyPool>,
}

impl Pool {
    fn build(def: &PoolDef) -> Result<Self, PoolProblem> {
        let build = |family| {
            family_of_spec(def, family)
                .map(|spec| FamilyPool::build(&def.name, family, spec))
                .transpose()
        };
        Ok(Pool {
            def: def.clone(),
            v4: build(Family::V4)?,
            v6: build(Family::V6)?,
        })
    }

    fn family(&self, family: Family) -> Option<&FamilyPool> {
        match family {
            Family::V4 => self.v4.as_ref(),
            Family::V6 => self.v6.as_ref(),
        }
    }

    fn family_mut(&mut self, family: Family) -> Option<&mut FamilyPool> {
        match family {
            Family::V4 => self.v4.as_mut(),
            Family::V6 => self.v6.as_mut(),
        }
    }
}

/// Rejects two CIDRs of one family that overlap, within a pool or across
/// pools (the IP cache maps a prefix to one identity).
fn check_overlaps(pools: &[PoolDef]) -> Result<(), PoolProblem> {
    for family in FAMILIES {
        let all: Vec<(&str, IpNet)> = pools
            .iter()
            .filter_map(|p| family_of_spec(p, family).map(|s| (p, s)))
            .flat_map(|(p, s)| s.cidrs.iter().map(move |c| (p.name.as_str(), c.trunc())))
            .collect();
        for (i, (pa, a)) in all.iter().enumerate() {
            for (pb, b) in &all[i + 1..] {
                if a.contains(&b.network()) || b.contains(&a.network()) {
                    return Err(PoolProblem::Overlap {
                        family,
                        pool_a: pa.to_string(),
                        cidr_a: *a,
                        pool_b: pb.to_string(),
                        cidr_b: *b,
                    });
                }
            }
        }
    }
    Ok(())
}

/// The blocks listed per pool in `allocated` (deduplicated).
fn held_blocks(allocated: &[AllocatedPool]) -> BTreeMap<&str, BTreeSet<IpNet>> {
    let mut held: BTreeMap<&str, BTreeSet<IpNet>> = BTreeMap::new();
    for entry in allocated {
        let blocks = held.entry(entry.pool.as_str()).or_default();
        blocks.extend(entry.cidrs.iter().copied());
    }
    held.retain(|_, b| !b.is_empty());
    held
}

/// Why pool definitions, or blocks under them, were refused: every problem found,
/// one per line (each names the pool, the CIDR or block, the holder where there is
/// one, and what to change).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .problems.join("\n"))]
pub struct PoolsRefused {
    pub problems: Vec<String>,
}

impl From<String> for PoolsRefused {
    fn from(problem: String) -> PoolsRefused {
        PoolsRefused {
            problems: vec![problem],
        }
    }
}

impl From<PoolProblem> for PoolsRefused {
    fn from(problem: PoolProblem) -> PoolsRefused {
        PoolsRefused {
            problems: vec![problem.to_string()],
        }
    }
}

impl PoolsRefused {
    /// Ok when no problem was found.
    fn unless_any(problems: Vec<String>) -> Result<(), PoolsRefused> {
        if problems.is_empty() {
            Ok(())
        } else {
            Err(PoolsRefused { problems })
        }
    }
}

/// The embedded multi-pool operator for one node. See the module docs.
#[derive(Debug, Clone, Default)]
pub struct PoolOperator {
    pools: BTreeMap<String, Pool>,
    /// The node's name, for error texts (set by [`Self::with_node`] and by
    /// every [`Self::satisfy`]).
    node: Option<String>,
}

impl PoolOperator {
    /// Builds one cidrset per pool CIDR per family (block size = the
    /// family's `maskSize`) and occupies the blocks overlapping reserved
    /// ranges. Rejects a pool defined twice, a CIDR of the wrong family, an
    /// invalid reserved range, a CIDR / maskSize pair the cidrset refuses
    /// (its error, prefixed with the pool, family, CIDR and maskSize) and
    /// overlapping CIDRs within a pool or across pools.
    pub fn new(pools: &[PoolDef]) -> Result<Self, PoolsRefused> {
        let mut map = BTreeMap::new();
        for def in pools {
            if map.contains_key(&def.name) {
                return Err(PoolProblem::DefinedTwice {
                    pool: def.name.clone(),
                }
                .into());
            }
            map.insert(def.name.clone(), Pool::build(def)?);
        }
        check_overlaps(pools)?;
        Ok(PoolOperator {
            pools: map,
            node: None,
        })
    }

    /// Names the node in error texts of [`Self::update_pools`] before the
    /// first [`Self::satisfy`].
    pub fn with_node(mut self, node: &str) -> Self {
        self.node = Some(node.to_string());
        self
    }

    /// The definition of pool `name`, if it exists.
    pub fn pool_def(&self, name: &str) -> Option<&PoolDef> {
        self.pools.get(name).map(|p| &p.def)
    }

    /// The pool names, sorted.
    pub fn pool_names(&self) -> Vec<&str> {
        self.pools.keys().map(String::as_str).collect()
    }

    /// Blocks per pool (both families): `(in use, free)`; blocks kept out by a
    /// reserved range count as in use.
    pub fn pool_space(&self) -> BTreeMap<String, (u64, u64)> {
        self.pools
            .iter()
            .map(|(name, p)| {
                let sets = FAMILIES
                    .iter()
                    .filter_map(|f| p.family(*f))
                    .flat_map(|fp| fp.sets.iter());
                let (used, total) = sets.fold((0u64, 0u64), |(u, t), s| {
                    (u + s.allocated_count(), t + s.max_cidrs())
                });
                (name.clone(), (used, total.saturating_sub(used)))
            })
            .collect()
    }

    fn node_label(&self) -> String {
        match &self.node {
            Some(n) => format!("node {n:?}"),
            None => "the node".to_string(),
        }
    }

    /// Locates a listed block: `(family, set index, block)` or the reason it
    /// is not a block of `pool`.
    fn locate(&self, pool: &str, block: &IpNet) -> Result<(Family, usize, IpNet), PoolProblem> {
        let block = *block;
        let Some(p) = self.pools.get(pool) else {
            return Err(PoolProblem::UnknownPool {
                pool: pool.into(),
                block,
            });
        };
        let family = Family::of_net(&block);
        let Some(fp) = p.family(family) else {
            return Err(PoolProblem::NotInPool {
                pool: pool.into(),
                block,
            });
        };
        let i = fp.check_block(pool, &block)?;
        Ok((family, i, block))
    }

    fn occupy_located(&mut self, pool: &str, family: Family, i: usize, block: &IpNet) {
        if let Some(fp) = self.pools.get_mut(pool).and_then(|p| p.family_mut(family)) {
            // In the set's CIDR by construction.
            let _ = fp.sets[i].occupy(block);
        }
    }

    /// At start: occupies the blocks the node already owns. Every valid block
    /// is occupied; the others (unknown pool, in no CIDR of its
    /// pool, wrong size, not on a block boundary) are reported, one line each
    /// (`\n`-joined), for the caller to log and keep out. Idempotent.
    pub fn adopt(&mut self, allocated: &[AllocatedPool]) -> Result<(), PoolsRefused> {
        let mut errors = Vec::new();
        for entry in allocated {
            for cidr in &entry.cidrs {
                match self.locate(&entry.pool, cidr) {
                    Ok((family, i, block)) => self.occupy_located(&entry.pool, family, i, &block),
                    Err(e) => errors.push(e.to_string()),
                }
            }
        }
        PoolsRefused::unless_any(errors)
    }

    /// Carves blocks until, for every requested pool and family, the node's
    /// blocks of that pool and family (in `allocated`) hold at least `needed`
    /// addresses (module docs: the count), appending them to `allocated`
    /// (a new entry takes the pool's allowFirstIP / allowLastIP; entries stay
    /// sorted by pool name, CIDRs IPv4 sorted then IPv6 sorted). Blocks
    /// already listed are occupied first, so none is handed out twice.
    ///
    /// Returns the errors for `status.ipam.operator-status.error` (empty: all
    /// demand met). A failing pool does not stop the others; blocks carved
    /// before a pool ran dry are kept.
    pub fn satisfy(
        &mut self,
        node: &str,
        requested: &[RequestedPool],
        allocated: &mut Vec<AllocatedPool>,
    ) -> Vec<String> {
        self.node = Some(node.to_string());
        let mut errors = Vec::new();
        let mut changed = false;
        for req in requested {
            for family in FAMILIES {
                let needed = match family {
                    Family::V4 => req.needed.ipv4_addrs,
                    Family::V6 => req.needed.ipv6_addrs,
                };
                if needed == 0 {
                    continue;
                }
                let fail = |reason: String| {
                    format!(
                        "failed to allocate {family} address for node {node:?} from pool {:?}: \
                         {reason}",
                        req.pool
                    )
                };
                if !self.pools.contains_key(&req.pool) {
                    errors.push(fail(format!(
                        "cannot allocate from non-existing pool: {}",
                        req.pool
                    )));
                    continue;
                }
                // What the node holds already (valid blocks only: an orphan
                // does not count, like upstream).
                let held: BTreeSet<(usize, IpNet)> = allocated
                    .iter()
                    .filter(|e| e.pool == req.pool)
                    .flat_map(|e| e.cidrs.iter())
                    .filter_map(|s| self.locate(&req.pool, s).ok())
                    .filter(|(f, _, _)| *f == family)
                    .map(|(_, i, b)| (i, b))
                    .collect();
                let Some(pool) = self.pools.get_mut(&req.pool) else {
                    continue;
                };
                if pool.def.sticky {
                    errors.push(fail(
                        "pool is sticky: its addresses go to pod identities through the \
                         CiliumNode annotation ipam.podnet.io/sticky-requests, not \
                         spec.ipam.pools.requested"
                            .into(),
                    ));
                    continue;
                }
                let (allow_first_ip, allow_last_ip) =
                    (pool.def.allow_first_ip, pool.def.allow_last_ip);
                let Some(fp) = pool.family_mut(family).filter(|fp| !fp.sets.is_empty()) else {
                    errors.push(fail(format!("pool has no {family} CIDRs")));
                    continue;
                };
                for (i, block) in &held {
                    let _ = fp.sets[*i].occupy(block);
                }
                let per_block = block_addresses(family, fp.mask_size);
                let mut total = (held.len() as u128).saturating_mul(per_block);
                let mut carved = Vec::new();
                while total < u128::from(needed) {
                    match fp.allocate() {
                        Ok(block) => {
                            carved.push(block);
                            total = total.saturating_add(per_block);
                        }
                        Err(e) => {
                            errors.push(fail(e.to_string()));
                            break;
                        }
                    }
                }
                if carved.is_empty() {
                    continue;
                }
                changed = true;
                let entry = allocated_entry(allocated, &req.pool);
                entry.allow_first_ip = allow_first_ip;
                entry.allow_last_ip = allow_last_ip;
                entry.cidrs.extend(carved);
                entry.cidrs.sort();
            }
        }
        if changed {
            allocated.sort_by(|a, b| a.pool.cmp(&b.pool));
        }
        errors
    }

    /// Keeps `range` (a cluster-pool node's pod CIDR, of any size) from being
    /// carved: occupies every block of every pool that overlaps it. Returns
    /// the blocks this occupied that were free, as `(pool, block)`, for
    /// [`Self::release`] when the range is given up; blocks already taken stay
    /// with whoever took them and are not returned.
    pub fn occupy_range(&mut self, range: &IpNet) -> Vec<(String, IpNet)> {
        let family = Family::of_net(range);
        let (lo, hi) = span(range);
        let mut taken = Vec::new();
        for (name, pool) in &mut self.pools {
            let Some(fp) = pool.family_mut(family) else {
                continue;
            };
            let mask = fp.mask_size;
            for set in &mut fp.sets {
                let cluster = set.cluster();
                let (base, last) = span(&cluster);
                let (s, e) = (lo.max(base), hi.min(last));
                if s > e {
                    continue;
                }
                // Every block of the pool's size from the one holding `s`.
                let Some(size) = 1u128.checked_shl(u32::from(family.bits().saturating_sub(mask)))
                else {
                    continue;
                };
                let mut cur = s - (s - base) % size;
                while cur <= e {
                    if let Ok(block) = IpNet::new(from_number(family, cur), mask)
                        && set.is_allocated(&block) == Ok(false)
                        && set.occupy(&block).is_ok()
                    {
                        taken.push((name.clone(), block));
                    }
                    match cur.checked_add(size) {
                        Some(next) => cur = next,
                        None => break,
                    }
                }
            }
        }
        taken
    }

    /// The node gave `cidr` of `pool` back (the agent removed it from
    /// `allocated`): frees it. A block overlapping a reserved range stays
    /// occupied; an unknown pool or a prefix that is not one of its blocks is
    /// ignored.
    pub fn release(&mut self, pool: &str, cidr: &IpNet) {
        let Some(fp) = self
            .pools
            .get_mut(pool)
            .and_then(|p| p.family_mut(Family::of_net(cidr)))
        else {
            return;
        };
        let Ok(i) = fp.check_block(pool, cidr) else {
            return;
        };
        let _ = fp.sets[i].release(cidr);
        if fp.overlaps_reserved(cidr) {
            let _ = fp.sets[i].occupy(cidr);
        }
    }

    /// Applies new pool definitions, checked against the blocks the node
    /// holds (`allocated`): see [`Self::update_pools_held`].
    pub fn update_pools(
        &mut self,
        new: &[PoolDef],
        allocated: &[AllocatedPool],
    ) -> Result<(), PoolsRefused> {
        let node = self.node_label();
        self.update_pools_held(new, &[(node, allocated)])
    }

    /// Applies new pool definitions, checked against the blocks every holder
    /// holds (`holders`: a label naming it in errors, e.g. `node "n1"`, and
    /// its `allocated`): new pools and new CIDRs are accepted; `maskSize`,
    /// `allowFirstIP` and `allowLastIP` of a pool with blocks cannot change; a
    /// CIDR holding blocks cannot be removed (a family dropped from the pool
    /// removes its CIDRs); a pool with blocks cannot be deleted. All
    /// violations are reported (`\n`-joined, each naming the holder) and
    /// nothing changes. On success the allocators are rebuilt from every
    /// holder's blocks (a CIDR kept with the same maskSize keeps its
    /// round-robin position).
    pub fn update_pools_held(
        &mut self,
        new: &[PoolDef],
        holders: &[(String, &[AllocatedPool])],
    ) -> Result<(), PoolsRefused> {
        let mut cand = PoolOperator::new(new)?;
        let mut errors = Vec::new();
        for (node, allocated) in holders {
            let held = held_blocks(allocated);
            for (name, old) in &self.pools {
                let Some(blocks) = held.get(name.as_str()) else {
                    continue;
                };
                check_pool_edit(name, old, cand.pools.get(name), node, blocks, &mut errors);
            }
        }
        PoolsRefused::unless_any(errors)?;

        // Keep the round-robin position of CIDRs that stay with the same
        // block size; their bits are rebuilt below.
        for (name, newp) in &mut cand.pools {
            let Some(old) = self.pools.get(name) else {
                continue;
            };
            for family in FAMILIES {
                let (Some(nf), Some(of)) = (newp.family_mut(family), old.family(family)) else {
                    continue;
                };
                if nf.mask_size != of.mask_size {
                    continue;
                }
                for set in &mut nf.sets {
                    if let Some(os) = of.sets.iter().find(|s| s.cluster() == set.cluster()) {
                        let mut kept = os.clone();
                        let cluster = kept.cluster();
                        let _ = kept.release(&cluster);
                        *set = kept;
                    }
                }
                nf.occupy_reserved();
            }
        }
        cand.node = self.node.take();
        // Every block was validated against the old pools; those the new
        // definitions do not accept were refused above or are orphans.
        for (_, allocated) in holders {
            let _ = cand.adopt(allocated);
        }
        *self = cand;
        Ok(())
    }
}

/// The violations of one pool edit (`new`: the new definition, None when
/// deleted) against the blocks `node` holds in it.
fn check_pool_edit(
    name: &str,
    old: &Pool,
    new: Option<&Pool>,
    node: &str,
    blocks: &BTreeSet<IpNet>,
    errors: &mut Vec<String>,
) {
    let all: Vec<IpNet> = blocks.iter().copied().collect();
    let Some(newp) = new else {
        errors.push(format!(
            "pool still in use by node: cannot delete pool {name:?} while {node} holds its \
             blocks {}",
            join_nets(&all)
        ));
        return;
    };
    for (field, was, now) in [
        (
            "allowFirstIP",
            old.def.allow_first_ip,
            newp.def.allow_first_ip,
        ),
        ("allowLastIP", old.def.allow_last_ip, newp.def.allow_last_ip),
    ] {
        if was != now {
            errors.push(format!(
                "cannot change {field} in existing pool {name:?} from {was} to {now}: {field} is \
                 immutable once the pool has blocks ({node} holds {})",
                join_nets(&all)
            ));
        }
    }
    for family in FAMILIES {
        let Some(of) = old.family(family) else {
            continue;
        };
        if let Some(nf) = newp.family(family)
            && nf.mask_size != of.mask_size
        {
            errors.push(format!(
                "cannot change {} mask size in existing pool {name:?} from {} to {}: maskSize is \
                 immutable once the pool has blocks ({node} holds {})",
                family.label(),
                of.mask_size,
                nf.mask_size,
                join_nets(&all)
            ));
        }
        for set in &of.sets {
            let cidr = set.cluster();
            let kept = newp
                .family(family)
                .is_some_and(|nf| nf.sets.iter().any(|s| s.cluster() == cidr));
            if kept {
                continue;
            }
            let inside: Vec<IpNet> = blocks
                .iter()
                .filter(|b| cidr.contains(&b.network()))
                .copied()
                .collect();
            if !inside.is_empty() {
                errors.push(format!(
                    "CIDR from pool still in use by node: cannot remove {family} CIDR {cidr} from \
                     pool {name:?} while {node} holds its blocks {}",
                    join_nets(&inside)
                ));
            }
        }
    }
}

/// Cluster-pool → multi-pool online migration preconditions for one node:
/// the default pool has the family of every node pod CIDR, one of its CIDRs
/// covers it, and its `maskSize` equals the pod CIDR's prefix length. All
/// violations are reported (`\n`-joined); Cilium writes a migration failure to
/// the status as [`MIGRATION_FAILED_PREFIX`] + the error.
pub fn check_migration(
    default_pool: &PoolDef,
    node_pod_cidrs: &[IpNet],
) -> Result<(), PoolsRefused> {
    let name = &default_pool.name;
    let mut errors = Vec::new();
    for cidr in node_pod_cidrs {
        let family = Family::of_net(cidr);
        let Some(spec) = default_pool.family(family).filter(|s| !s.cidrs.is_empty()) else {
            errors.push(format!(
                "default pool {name:?} has no {family} CIDRs: it must cover the node pod CIDR \
                 {cidr} with maskSize {}",
                cidr.prefix_len()
            ));
            continue;
        };
        let block = cidr.trunc();
        if !spec.cidrs.iter().any(|c| c.trunc().contains(&block)) {
            errors.push(format!(
                "node pod CIDR {cidr} is not covered by default pool {name:?} ({family} CIDRs: \
                 {}): add a CIDR containing it",
                join_nets(&spec.cidrs)
            ));
        }
        if spec.mask_size != cidr.prefix_len() {
            errors.push(format!(
                "node pod CIDR {cidr} is a /{} but default pool {name:?} has {family} maskSize \
                 {}: the default pool must use the same mask size as the node pod CIDRs \
                 (expected maskSize {})",
                cidr.prefix_len(),
                spec.mask_size,
                cidr.prefix_len()
            ));
        }
    }
    PoolsRefused::unless_any(errors)
}

/// The node's pod CIDRs listed under the default pool, as the migration
/// writes them to `spec.ipam.pools.allocated` (IPv4 sorted, then IPv6 sorted;
/// allowFirstIP / allowLastIP from the pool).
pub fn migrated_allocation(default_pool: &PoolDef, node_pod_cidrs: &[IpNet]) -> AllocatedPool {
    let set: BTreeSet<IpNet> = node_pod_cidrs.iter().map(IpNet::trunc).collect();
    let mut cidrs: Vec<IpNet> = set.into_iter().collect();
    cidrs.sort();
    AllocatedPool {
        pool: default_pool.name.clone(),
        allow_first_ip: default_pool.allow_first_ip,
        allow_last_ip: default_pool.allow_last_ip,
        cidrs,
    }
}

/// The node's entry for `pool` in `allocated`, appended empty if it has none.
fn allocated_entry<'a>(allocated: &'a mut Vec<AllocatedPool>, pool: &str) -> &'a mut AllocatedPool {
    let idx = match allocated.iter().position(|e| e.pool == pool) {
        Some(i) => i,
        None => {
            allocated.push(AllocatedPool {
                pool: pool.to_string(),
                ..Default::default()
            });
            allocated.len() - 1
        }
    };
    &mut allocated[idx]
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::resources::PoolDemand;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn fam(cidrs: &[&str], mask: u8) -> Option<PoolFamilySpec> {
        Some(PoolFamilySpec {
            cidrs: cidrs.iter().map(|c| net(c)).collect(),
            mask_size: mask,
            reserved_ranges: Vec::new(),
        })
    }

    fn pool4(name: &str, cidrs: &[&str], mask: u8) -> PoolDef {
        PoolDef {
            name: name.into(),
            ipv4: fam(cidrs, mask),
            ..Default::default()
        }
    }

    fn req(pool: &str, v4: u64, v6: u64) -> RequestedPool {
        RequestedPool {
            pool: pool.into(),
            needed: PoolDemand {
                ipv4_addrs: v4,
                ipv6_addrs: v6,
            },
        }
    }

    fn cidrs_of(allocated: &[AllocatedPool], pool: &str) -> Vec<String> {
        allocated
            .iter()
            .find(|e| e.pool == pool)
            .map(|e| e.cidrs.iter().map(IpNet::to_string).collect())
            .unwrap_or_default()
    }

    const FULL: &str = "CIDR allocation failed; there are no remaining CIDRs left to allocate in \
                        the accepted range";

    #[test]
    fn carves_until_demand_is_met() {
        let mut def = pool4("default", &["10.10.0.0/16"], 27);
        def.allow_first_ip = true;
        let mut op = PoolOperator::new(&[def]).unwrap();
        let mut alloc = Vec::new();
        assert!(
            op.satisfy("n1", &[req("default", 8, 0)], &mut alloc)
                .is_empty()
        );
        assert_eq!(
            alloc,
            vec![AllocatedPool {
                pool: "default".into(),
                allow_first_ip: true,
                allow_last_ip: false,
                cidrs: vec![net("10.10.0.0/27")],
            }]
        );
        // Already met: nothing changes.
        let before = alloc.clone();
        assert!(
            op.satisfy("n1", &[req("default", 30, 0)], &mut alloc)
                .is_empty()
        );
        assert_eq!(alloc, before);
        // 40 > 30 counted addresses of one /27: a second block.
        assert!(
            op.satisfy("n1", &[req("default", 40, 0)], &mut alloc)
                .is_empty()
        );
        assert_eq!(
            cidrs_of(&alloc, "default"),
            ["10.10.0.0/27", "10.10.0.32/27"]
        );
        // Two /27 count 60 (Cilium's addrsInPrefix: 32 - 2 each).
        assert!(
            op.satisfy("n1", &[req("default", 60, 0)], &mut alloc)
                .is_empty()
        );
        assert_eq!(alloc[0].cidrs.len(), 2);
        assert!(
            op.satisfy("n1", &[req("default", 61, 0)], &mut alloc)
                .is_empty()
        );
        assert_eq!(alloc[0].cidrs.len(), 3);
        // Zero demand carves nothing, even for an unknown pool.
        assert!(
            op.satisfy("n1", &[req("nope", 0, 0)], &mut alloc)
                .is_empty()
        );
    }

    #[test]
    fn block_address_count() {
        assert_eq!(block_addresses(Family::V4, 27), 30);
        assert_eq!(block_addresses(Family::V4, 31), 2);
        assert_eq!(block_addresses(Family::V4, 32), 1);
        assert_eq!(block_addresses(Family::V6, 120), 254);
        assert_eq!(block_addresses(Family::V6, 64), (1u128 << 64) - 2);
        assert_eq!(block_addresses(Family::V6, 0), u128::MAX);
    }

    #[test]
    fn multiple_pools_sorted_by_name() {
        let mut op = PoolOperator::new(&[
            pool4("mars", &["10.20.0.0/16"], 27),
            pool4("default", &["10.10.0.0/16"], 26),
        ])
        .unwrap();
        let mut alloc = Vec::new();
        let errs = op.satisfy(
            "n1",
            &[req("mars", 4, 0), req("default", 100, 0)],
            &mut alloc,
        );
        assert!(errs.is_empty(), "{errs:?}");
        let pools: Vec<&str> = alloc.iter().map(|e| e.pool.as_str()).collect();
        assert_eq!(pools, ["default", "mars"]);
        assert_eq!(
            cidrs_of(&alloc, "default"),
            ["10.10.0.0/26", "10.10.0.64/26"]
        );
        assert_eq!(cidrs_of(&alloc, "mars"), ["10.20.0.0/27"]);
    }

    #[test]
    fn dual_stack_orders_v4_then_v6() {
        let def = PoolDef {
            name: "default".into(),
            ipv4: fam(&["10.10.0.0/16"], 27),
            ipv6: fam(&["fd00:10::/112"], 120),
            ..Default::default()
        };
        let mut op = PoolOperator::new(&[def]).unwrap();
        // A pre-existing entry listed v6 first gets normalised.
        let mut alloc = vec![AllocatedPool {
            pool: "default".into(),
            cidrs: vec![net("fd00:10::/120")],
            ..Default::default()
        }];
        op.adopt(&alloc).unwrap();
        let errs = op.satisfy("n1", &[req("default", 8, 300)], &mut alloc);
        assert!(errs.is_empty(), "{errs:?}");
        assert_eq!(
            cidrs_of(&alloc, "default"),
            ["10.10.0.0/27", "fd00:10::/120", "fd00:10::100/120"]
        );
        // Numeric, not string, order inside a family; IPv4 before IPv6.
        let mut v = vec![
            net("fd00::/120"),
            net("10.0.10.0/24"),
            net("10.0.2.0/24"),
            net("10.0.2.0/23"),
        ];
        v.sort();
        assert_eq!(
            v,
            [
                net("10.0.2.0/23"),
                net("10.0.2.0/24"),
                net("10.0.10.0/24"),
                net("fd00::/120")
            ]
        );
    }

    #[test]
    fn a_sticky_pool_is_not_carved_for_requested() {
        let mut sticky = pool4("web", &["10.20.0.0/28"], 32);
        sticky.sticky = true;
        let mut op = PoolOperator::new(&[sticky]).unwrap();
        let mut alloc = Vec::new();
        let errs = op.satisfy("n1", &[req("web", 1, 0)], &mut alloc);
        assert!(alloc.is_empty());
        assert_eq!(errs.len(), 1);
        assert!(errs[0].contains("pool is sticky"), "{errs:?}");
    }

    #[test]
    fn full_pool_moves_to_next_cidr_then_errors() {
        let mut op = PoolOperator::new(&[
            pool4("mars", &["10.20.0.0/26", "10.30.0.0/27"], 27),
            pool4("default", &["10.10.0.0/16"], 27),
        ])
        .unwrap();
        let mut alloc = Vec::new();
        let errs = op.satisfy(
            "n1",
            &[
                req("mars", 100, 0),
                req("default", 8, 0),
                req("venus", 8, 0),
                req("default", 0, 8),
            ],
            &mut alloc,
        );
        assert_eq!(
            errs,
            vec![
                format!(
                    "failed to allocate ipv4 address for node \"n1\" from pool \"mars\": {FULL}"
                ),
                "failed to allocate ipv4 address for node \"n1\" from pool \"venus\": cannot \
                 allocate from non-existing pool: venus"
                    .to_string(),
                "failed to allocate ipv6 address for node \"n1\" from pool \"default\": pool has \
                 no ipv6 CIDRs"
                    .to_string(),
            ]
        );
        // The blocks carved before mars ran dry are kept; default succeeded.
        assert_eq!(
            cidrs_of(&alloc, "mars"),
            ["10.20.0.0/27", "10.20.0.32/27", "10.30.0.0/27"]
        );
        assert_eq!(cidrs_of(&alloc, "default"), ["10.10.0.0/27"]);
        // The chapter's troubleshooting wording.
        assert!(errs[0].starts_with("failed to allocate ipv4 address for node "));
        assert!(errs[0].contains(" from pool "));
    }

    #[test]
    fn adopt_and_release_round_trip() {
        let pools = [pool4("mars", &["10.20.0.0/26"], 27)];
        let mut first = PoolOperator::new(&pools).unwrap();
        let mut alloc = Vec::new();
        assert!(
            first
                .satisfy("n1", &[req("mars", 40, 0)], &mut alloc)
                .is_empty()
        );
        assert_eq!(cidrs_of(&alloc, "mars"), ["10.20.0.0/27", "10.20.0.32/27"]);

        // Restart: a new operator adopts what the node owns.
        let mut op = PoolOperator::new(&pools).unwrap();
        op.adopt(&alloc).unwrap();
        op.adopt(&alloc).unwrap(); // idempotent
        assert!(
            op.satisfy("n1", &[req("mars", 40, 0)], &mut alloc)
                .is_empty()
        );
        assert_eq!(alloc[0].cidrs.len(), 2);
        let errs = op.satisfy("n1", &[req("mars", 61, 0)], &mut alloc);
        assert_eq!(
            errs,
            [format!(
                "failed to allocate ipv4 address for node \"n1\" from pool \"mars\": {FULL}"
            )]
        );

        // The node hands the first block back; it can be carved again.
        alloc[0].cidrs.retain(|c| *c != net("10.20.0.0/27"));
        op.release("mars", &net("10.20.0.0/27"));
        op.release("mars", &net("10.20.0.0/27")); // twice is fine
        op.release("nope", &net("10.20.0.0/27")); // unknown pool ignored
        assert!(
            op.satisfy("n1", &[req("mars", 40, 0)], &mut alloc)
                .is_empty()
        );
        assert_eq!(cidrs_of(&alloc, "mars"), ["10.20.0.0/27", "10.20.0.32/27"]);
    }

    #[test]
    fn adopt_reports_bad_blocks_and_keeps_good_ones() {
        let mut op = PoolOperator::new(&[pool4("mars", &["10.20.0.0/26"], 27)]).unwrap();
        let alloc = vec![
            AllocatedPool {
                pool: "mars".into(),
                cidrs: vec![
                    net("10.20.0.32/27"),
                    net("10.99.0.0/27"),
                    net("10.20.0.0/26"),
                    net("10.20.0.5/27"),
                    net("fd00::/120"),
                ],
                ..Default::default()
            },
            AllocatedPool {
                pool: "gone".into(),
                cidrs: vec![net("10.50.0.0/27")],
                ..Default::default()
            },
        ];
        let err = op.adopt(&alloc).unwrap_err().to_string();
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(
            lines,
            [
                "unable to reuse from pool mars: cidr 10.99.0.0/27 is not part of the requested \
                 pool",
                "unable to reuse from pool mars: cidr 10.20.0.0/26 is a /26 but the pool's ipv4 \
                 maskSize is 27",
                "unable to reuse from pool mars: cidr 10.20.0.5/27 is not on a block boundary \
                 (expected 10.20.0.0/27)",
                "unable to reuse from pool mars: cidr fd00::/120 is not part of the requested \
                 pool",
                "unable to find pool gone, prefix 10.50.0.0/27 is still allocated to the node \
                 but is marked as orphan",
            ]
        );
        // The valid block was occupied: the next carve takes the other one.
        let mut fresh = Vec::new();
        assert!(
            op.satisfy("n1", &[req("mars", 8, 0)], &mut fresh)
                .is_empty()
        );
        assert_eq!(cidrs_of(&fresh, "mars"), ["10.20.0.0/27"]);
    }

    #[test]
    fn reserved_ranges_are_skipped() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        // The chapter's example: retire 10.10.0.0/16.
        let mut def = pool4("default", &["10.10.0.0/16", "10.20.0.0/16"], 24);
        def.ipv4.as_mut().unwrap().reserved_ranges = vec![(ip("10.10.0.0"), ip("10.10.255.255"))];
        let mut op = PoolOperator::new(&[def.clone()]).unwrap();
        // An existing block in the retired CIDR keeps working.
        let mut alloc = vec![AllocatedPool {
            pool: "default".into(),
            cidrs: vec![net("10.10.5.0/24")],
            ..Default::default()
        }];
        op.adopt(&alloc).unwrap();
        assert!(
            op.satisfy("n1", &[req("default", 500, 0)], &mut alloc)
                .is_empty()
        );
        assert_eq!(
            cidrs_of(&alloc, "default"),
            ["10.10.5.0/24", "10.20.0.0/24"]
        );
        // Released, it does not come back.
        alloc[0].cidrs.retain(|c| *c != net("10.10.5.0/24"));
        op.release("default", &net("10.10.5.0/24"));
        assert!(
            op.satisfy("n1", &[req("default", 500, 0)], &mut alloc)
                .is_empty()
        );
        assert_eq!(
            cidrs_of(&alloc, "default"),
            ["10.20.0.0/24", "10.20.1.0/24"]
        );

        // A partial range: blocks 1 and 2 of a /24 in /27s are skipped.
        let mut def = pool4("p", &["10.0.0.0/24"], 27);
        def.ipv4.as_mut().unwrap().reserved_ranges = vec![(ip("10.0.0.40"), ip("10.0.0.70"))];
        let mut op = PoolOperator::new(&[def]).unwrap();
        let mut alloc = Vec::new();
        assert!(op.satisfy("n1", &[req("p", 90, 0)], &mut alloc).is_empty());
        assert_eq!(
            cidrs_of(&alloc, "p"),
            ["10.0.0.0/27", "10.0.0.96/27", "10.0.0.128/27"]
        );
        // 8 blocks, 2 reserved: the 7th needs more than the 6 left.
        let errs = op.satisfy("n1", &[req("p", 7 * 30, 0)], &mut alloc);
        assert_eq!(alloc[0].cidrs.len(), 6);
        assert_eq!(errs.len(), 1);
        assert!(errs[0].ends_with(FULL));

        // Invalid reserved ranges.
        let mut bad = pool4("p", &["10.0.0.0/24"], 27);
        bad.ipv4.as_mut().unwrap().reserved_ranges = vec![(ip("10.0.0.9"), ip("10.0.0.1"))];
        assert_eq!(
            PoolOperator::new(&[bad.clone()]).unwrap_err().to_string(),
            "pool \"p\": ipv4 reserved range 10.0.0.9-10.0.0.1 is invalid: the start is after \
             the end"
        );
        bad.ipv4.as_mut().unwrap().reserved_ranges = vec![(ip("fd00::"), ip("fd00::1"))];
        assert_eq!(
            PoolOperator::new(&[bad]).unwrap_err().to_string(),
            "pool \"p\": ipv4 reserved range fd00::-fd00::1 is not an IPv4 range"
        );
    }

    #[test]
    fn range_prefix_decomposition() {
        let v4 = |s: &str| to_number(s.parse().unwrap());
        let got = range_prefixes(Family::V4, v4("10.0.0.40"), v4("10.0.0.70"));
        let want: Vec<IpNet> = [
            "10.0.0.40/29",
            "10.0.0.48/28",
            "10.0.0.64/30",
            "10.0.0.68/31",
            "10.0.0.70/32",
        ]
        .iter()
        .map(|s| net(s))
        .collect();
        assert_eq!(got, want);
        assert_eq!(
            range_prefixes(Family::V4, 0, u128::from(u32::MAX)),
            [net("0.0.0.0/0")]
        );
        assert_eq!(range_prefixes(Family::V6, 0, u128::MAX), [net("::/0")]);
        assert_eq!(
            range_prefixes(Family::V6, u128::MAX, u128::MAX),
            [net("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128")]
        );
    }

    #[test]
    fn overlap_and_cidrset_errors() {
        assert_eq!(
            PoolOperator::new(&[
                pool4("a", &["10.0.0.0/16"], 24),
                pool4("b", &["10.1.0.0/16", "10.0.128.0/17"], 24),
            ])
            .unwrap_err()
            .to_string(),
            "pool \"a\" ipv4 CIDR 10.0.0.0/16 overlaps pool \"b\" ipv4 CIDR 10.0.128.0/17: pool \
             CIDRs must not overlap one another"
        );
        assert_eq!(
            PoolOperator::new(&[pool4("a", &["10.0.0.0/16", "10.0.0.0/8"], 24)])
                .unwrap_err()
                .to_string(),
            "pool \"a\" ipv4 CIDR 10.0.0.0/16 overlaps pool \"a\" ipv4 CIDR 10.0.0.0/8: pool \
             CIDRs must not overlap one another"
        );
        assert_eq!(
            PoolOperator::new(&[pool4("a", &["10.0.0.0/16"], 8)])
                .unwrap_err()
                .to_string(),
            "pool \"a\": ipv4 CIDR 10.0.0.0/16 with maskSize 8: node mask size /8 is shorter \
             than the prefix length of cluster CIDR 10.0.0.0/16; it must be /16 or longer"
        );
        let v6 = PoolDef {
            name: "six".into(),
            ipv6: fam(&["fd00::/104"], 121),
            ..Default::default()
        };
        assert_eq!(
            PoolOperator::new(&[v6]).unwrap_err().to_string(),
            "pool \"six\": ipv6 CIDR fd00::/104 with maskSize 121: New CIDR set failed; the node \
             CIDR size is too big; spec.ipv6.maskSize must be /104 to /120 for fd00::/104"
        );
        assert_eq!(
            PoolOperator::new(&[pool4("a", &["fd00::/64"], 80)])
                .unwrap_err()
                .to_string(),
            "pool \"a\": ipv4 CIDR fd00::/64 is not an IPv4 CIDR"
        );
        assert_eq!(
            PoolOperator::new(&[pool4("a", &["10.0.0.0/16"], 24), pool4("a", &[], 24)])
                .unwrap_err()
                .to_string(),
            "pool \"a\" is defined more than once"
        );
        // Different families never overlap; equal v6 CIDRs do.
        let dual = |n: &str, c6: &str| PoolDef {
            name: n.into(),
            ipv4: fam(&["10.0.0.0/16"], 24),
            ipv6: fam(&[c6], 120),
            ..Default::default()
        };
        assert!(
            PoolOperator::new(&[dual("a", "fd00::/112"), pool4("b", &["10.1.0.0/16"], 24)]).is_ok()
        );
        let mut other = dual("b", "fd00::/112");
        other.ipv4 = None;
        assert!(
            PoolOperator::new(&[dual("a", "fd00::/112"), other])
                .unwrap_err()
                .to_string()
                .contains("ipv6 CIDR fd00::/112 overlaps pool \"b\" ipv6 CIDR fd00::/112")
        );
    }

    /// An operator for "mars" with one block held by node n1.
    fn mars_with_block() -> (PoolOperator, Vec<AllocatedPool>) {
        let mut op = PoolOperator::new(&[
            pool4("mars", &["10.20.0.0/16", "10.21.0.0/16"], 27),
            pool4("idle", &["10.40.0.0/16"], 27),
        ])
        .unwrap()
        .with_node("n1");
        let mut alloc = Vec::new();
        assert!(
            op.satisfy("n1", &[req("mars", 8, 0)], &mut alloc)
                .is_empty()
        );
        assert_eq!(cidrs_of(&alloc, "mars"), ["10.20.0.0/27"]);
        (op, alloc)
    }

    #[test]
    fn immutable_fields_of_a_pool_with_blocks() {
        let (mut op, mut alloc) = mars_with_block();
        let idle = pool4("idle", &["10.40.0.0/16"], 27);

        let changed = pool4("mars", &["10.20.0.0/16", "10.21.0.0/16"], 26);
        assert_eq!(
            op.update_pools(&[changed, idle.clone()], &alloc)
                .unwrap_err()
                .to_string(),
            "cannot change IPv4 mask size in existing pool \"mars\" from 27 to 26: maskSize is \
             immutable once the pool has blocks (node \"n1\" holds 10.20.0.0/27)"
        );
        let mut changed = pool4("mars", &["10.20.0.0/16", "10.21.0.0/16"], 27);
        changed.allow_first_ip = true;
        assert_eq!(
            op.update_pools(&[changed, idle.clone()], &alloc)
                .unwrap_err()
                .to_string(),
            "cannot change allowFirstIP in existing pool \"mars\" from false to true: \
             allowFirstIP is immutable once the pool has blocks (node \"n1\" holds 10.20.0.0/27)"
        );
        let mut changed = pool4("mars", &["10.20.0.0/16", "10.21.0.0/16"], 27);
        changed.allow_last_ip = true;
        assert_eq!(
            op.update_pools(&[changed, idle.clone()], &alloc)
                .unwrap_err()
                .to_string(),
            "cannot change allowLastIP in existing pool \"mars\" from false to true: \
             allowLastIP is immutable once the pool has blocks (node \"n1\" holds 10.20.0.0/27)"
        );
        // Nothing changed: still /27 blocks, continuing round-robin.
        assert!(
            op.satisfy("n1", &[req("mars", 40, 0)], &mut alloc)
                .is_empty()
        );
        assert_eq!(cidrs_of(&alloc, "mars"), ["10.20.0.0/27", "10.20.0.32/27"]);

        // A pool without blocks may change all three.
        let mars = pool4("mars", &["10.20.0.0/16", "10.21.0.0/16"], 27);
        let mut idle2 = pool4("idle", &["10.40.0.0/16"], 28);
        idle2.allow_first_ip = true;
        idle2.allow_last_ip = true;
        op.update_pools(&[mars, idle2], &alloc).unwrap();
        assert!(
            op.satisfy("n1", &[req("idle", 8, 0)], &mut alloc)
                .is_empty()
        );
        let entry = alloc.iter().find(|e| e.pool == "idle").unwrap();
        assert_eq!(entry.cidrs, [net("10.40.0.0/28")]);
        assert!(entry.allow_first_ip && entry.allow_last_ip);
    }

    #[test]
    fn in_use_cidrs_and_pools_cannot_be_removed() {
        let (mut op, mut alloc) = mars_with_block();
        let idle = pool4("idle", &["10.40.0.0/16"], 27);

        // Removing the CIDR holding the block.
        let err = op
            .update_pools(
                &[pool4("mars", &["10.21.0.0/16"], 27), idle.clone()],
                &alloc,
            )
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "CIDR from pool still in use by node: cannot remove ipv4 CIDR 10.20.0.0/16 from pool \
             \"mars\" while node \"n1\" holds its blocks 10.20.0.0/27"
        );
        assert!(err.contains("CIDR from pool still in use by node"));
        // Dropping the family removes the CIDR too.
        let no_v4 = PoolDef {
            name: "mars".into(),
            ipv6: fam(&["fd00::/112"], 120),
            ..Default::default()
        };
        assert!(
            op.update_pools(&[no_v4, idle.clone()], &alloc)
                .unwrap_err()
                .to_string()
                .starts_with("CIDR from pool still in use by node: cannot remove ipv4 CIDR")
        );
        // Deleting the pool.
        assert_eq!(
            op.update_pools(std::slice::from_ref(&idle), &alloc)
                .unwrap_err()
                .to_string(),
            "pool still in use by node: cannot delete pool \"mars\" while node \"n1\" holds its \
             blocks 10.20.0.0/27"
        );

        // Replacing 10.20.0.0/16 by narrower CIDRs removes it: refused.
        assert!(
            op.update_pools(
                &[
                    pool4("mars", &["10.20.0.0/26", "10.30.0.0/16"], 27),
                    idle.clone(),
                ],
                &alloc,
            )
            .unwrap_err()
            .to_string()
            .contains("cannot remove ipv4 CIDR 10.20.0.0/16 from pool \"mars\"")
        );
        // Removing the unused CIDR, deleting the unused pool and adding a new
        // pool and CIDR are accepted live.
        let mars = pool4("mars", &["10.20.0.0/16", "10.30.0.0/16"], 27);
        let venus = pool4("venus", &["10.50.0.0/16"], 27);
        op.update_pools(&[mars, venus], &alloc).unwrap();
        assert_eq!(op.pool_names(), ["mars", "venus"]);
        let errs = op.satisfy(
            "n1",
            &[req("mars", 40, 0), req("venus", 8, 0), req("idle", 8, 0)],
            &mut alloc,
        );
        assert_eq!(
            errs,
            [
                "failed to allocate ipv4 address for node \"n1\" from pool \"idle\": cannot \
              allocate from non-existing pool: idle"
            ]
        );
        // The held block stayed occupied and round-robin position was kept.
        assert_eq!(cidrs_of(&alloc, "mars"), ["10.20.0.0/27", "10.20.0.32/27"]);
        assert_eq!(cidrs_of(&alloc, "venus"), ["10.50.0.0/27"]);

        // A full pool gets a new CIDR live and carving continues there.
        let mut op = PoolOperator::new(&[pool4("p", &["10.0.0.0/27"], 27)]).unwrap();
        let mut alloc = Vec::new();
        assert_eq!(op.satisfy("n1", &[req("p", 40, 0)], &mut alloc).len(), 1);
        op.update_pools(&[pool4("p", &["10.0.0.0/27", "10.0.1.0/27"], 27)], &alloc)
            .unwrap();
        assert!(op.satisfy("n1", &[req("p", 40, 0)], &mut alloc).is_empty());
        assert_eq!(cidrs_of(&alloc, "p"), ["10.0.0.0/27", "10.0.1.0/27"]);
        // Without with_node/satisfy the node is "the node".
        let mut anon = PoolOperator::new(&[pool4("p", &["10.0.0.0/27"], 27)]).unwrap();
        assert!(
            anon.update_pools(&[], &alloc)
                .unwrap_err()
                .to_string()
                .contains("while the node holds its blocks 10.0.0.0/27")
        );
    }

    #[test]
    fn new_pool_overlapping_an_existing_one_is_refused_without_change() {
        let (mut op, alloc) = mars_with_block();
        let err = op
            .update_pools(
                &[
                    pool4("mars", &["10.20.0.0/16", "10.21.0.0/16"], 27),
                    pool4("idle", &["10.40.0.0/16"], 27),
                    pool4("zeta", &["10.20.128.0/17"], 27),
                ],
                &alloc,
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains("overlaps pool \"zeta\""), "{err}");
        assert_eq!(op.pool_names(), ["idle", "mars"]);
    }

    #[test]
    fn live_reserved_range_retires_a_cidr() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let def = pool4("default", &["10.10.0.0/26", "10.20.0.0/26"], 27);
        let mut op = PoolOperator::new(std::slice::from_ref(&def)).unwrap();
        let mut alloc = Vec::new();
        assert!(
            op.satisfy("n1", &[req("default", 8, 0)], &mut alloc)
                .is_empty()
        );
        assert_eq!(cidrs_of(&alloc, "default"), ["10.10.0.0/27"]);
        // Same definitions: the allocators are rebuilt from `allocated`.
        op.update_pools(std::slice::from_ref(&def), &alloc).unwrap();
        // Reserve the whole first CIDR while the node holds a block in it.
        let mut retired = def.clone();
        retired.ipv4.as_mut().unwrap().reserved_ranges = vec![(ip("10.10.0.0"), ip("10.10.0.63"))];
        op.update_pools(&[retired], &alloc).unwrap();
        assert!(
            op.satisfy("n1", &[req("default", 90, 0)], &mut alloc)
                .is_empty()
        );
        assert_eq!(
            cidrs_of(&alloc, "default"),
            ["10.10.0.0/27", "10.20.0.0/27", "10.20.0.32/27"]
        );
        let errs = op.satisfy("n1", &[req("default", 120, 0)], &mut alloc);
        assert_eq!(errs.len(), 1);
        assert!(errs[0].ends_with(FULL));
        // A block missing from `allocated` at update time is free again.
        alloc[0].cidrs.retain(|c| *c != net("10.20.0.32/27"));
        op.update_pools(std::slice::from_ref(&def), &alloc).unwrap();
        assert!(
            op.satisfy("n1", &[req("default", 120, 0)], &mut alloc)
                .is_empty()
        );
        assert_eq!(alloc[0].cidrs.len(), 4);
    }

    #[test]
    fn migration_checks() {
        let def = PoolDef {
            name: "default".into(),
            ipv4: fam(&["10.0.0.0/8"], 24),
            ipv6: fam(&["fd00::/104"], 120),
            ..Default::default()
        };
        let pod = [net("10.0.1.0/24"), net("fd00::100/120")];
        check_migration(&def, &pod).unwrap();
        check_migration(&def, &[]).unwrap();

        assert_eq!(
            check_migration(&def, &[net("192.168.1.0/24")])
                .unwrap_err()
                .to_string(),
            "node pod CIDR 192.168.1.0/24 is not covered by default pool \"default\" (ipv4 \
             CIDRs: 10.0.0.0/8): add a CIDR containing it"
        );
        assert_eq!(
            check_migration(&def, &[net("10.0.1.0/25")])
                .unwrap_err()
                .to_string(),
            "node pod CIDR 10.0.1.0/25 is a /25 but default pool \"default\" has ipv4 maskSize \
             24: the default pool must use the same mask size as the node pod CIDRs (expected \
             maskSize 25)"
        );
        let v4_only = pool4("default", &["10.0.0.0/8"], 24);
        assert_eq!(
            check_migration(&v4_only, &pod).unwrap_err().to_string(),
            "default pool \"default\" has no ipv6 CIDRs: it must cover the node pod CIDR \
             fd00::100/120 with maskSize 120"
        );
        // Both problems of one CIDR are reported.
        assert_eq!(
            check_migration(&def, &[net("11.0.0.0/16")])
                .unwrap_err()
                .to_string()
                .lines()
                .count(),
            2
        );
        assert_eq!(
            format!("{MIGRATION_FAILED_PREFIX}x"),
            "migration to multi-pool IPAM failed: x"
        );

        let mut def2 = def.clone();
        def2.allow_last_ip = true;
        let got = migrated_allocation(&def2, &[net("fd00::100/120"), net("10.0.1.0/24")]);
        assert_eq!(
            got,
            AllocatedPool {
                pool: "default".into(),
                allow_first_ip: false,
                allow_last_ip: true,
                cidrs: vec![net("10.0.1.0/24"), net("fd00::100/120")],
            }
        );
        // The operator adopts the migrated blocks and carves around them.
        let mut op = PoolOperator::new(&[def]).unwrap();
        let mut alloc = vec![got];
        op.adopt(&alloc).unwrap();
        assert!(
            op.satisfy("n1", &[req("default", 300, 0)], &mut alloc)
                .is_empty()
        );
        assert_eq!(
            cidrs_of(&alloc, "default"),
            ["10.0.0.0/24", "10.0.1.0/24", "fd00::100/120"]
        );
    }

    #[test]
    fn a_cluster_pool_range_is_kept_out_of_every_pool_it_overlaps() {
        let mut op = PoolOperator::new(&[
            pool4("default", &["10.0.0.0/24"], 26),
            pool4("mars", &["10.1.0.0/24"], 26),
        ])
        .unwrap();
        let mut alloc = Vec::new();
        assert!(
            op.satisfy("n1", &[req("default", 10, 0)], &mut alloc)
                .is_empty()
        );
        assert_eq!(cidrs_of(&alloc, "default"), ["10.0.0.0/26"]);
        // A /25 covers two /26 blocks; the one n1 holds is not returned.
        let taken = op.occupy_range(&net("10.0.0.0/25"));
        assert_eq!(taken, [("default".to_string(), net("10.0.0.64/26"))]);
        // A /28 inside one block keeps that whole block; no pool: nothing.
        assert_eq!(
            op.occupy_range(&net("10.1.0.200/29")),
            [("mars".to_string(), net("10.1.0.192/26"))]
        );
        assert!(op.occupy_range(&net("192.168.0.0/16")).is_empty());
        assert!(op.occupy_range(&net("fd00::/64")).is_empty());
        assert!(
            op.satisfy("n1", &[req("default", 100, 0)], &mut alloc)
                .is_empty()
        );
        assert_eq!(
            cidrs_of(&alloc, "default"),
            ["10.0.0.0/26", "10.0.0.128/26"],
            "carved around the range"
        );
        op.release("default", &net("10.0.0.64/26"));
        let mut other = Vec::new();
        assert!(
            op.satisfy("n2", &[req("default", 120, 0)], &mut other)
                .is_empty()
        );
        assert_eq!(
            cidrs_of(&other, "default"),
            ["10.0.0.64/26", "10.0.0.192/26"],
            "the released range is carved again"
        );
    }
}
