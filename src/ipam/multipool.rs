//! The node side of pooled IPAM: named pools, each holding blocks (CIDRs) per
//! family that the node owns, with a host-scope allocator inside every block.
//! Multi-pool mode fills it from `spec.ipam.pools.allocated`; the host-scope modes
//! use the same structure with one pool (`default`) holding the node CIDR of each
//! family. Also the demand formula (`neededIPCeil`) and the choice of blocks to
//! give back (Cilium `pkg/ipam/multipool.go`, §6.2–6.5 of the facts).
//!
//! Allocation tries a pool's blocks in the order they were added (Cilium: to avoid
//! fragmentation); inside a block it is next-fit (see `hostscope`). A block that
//! disappears from the node's allocation while addresses in it are still used is
//! kept as "removed": its addresses stay valid, nothing new is handed out from it.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;

use super::Family;
use super::hostscope::{AllocatorOptions, HostScopeAllocator};

/// Why a pool operation failed (Cilium's texts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("unable to allocate from pool \"{pool}\" (family {family}): pool not (yet) available")]
    NotAvailable { pool: String, family: &'static str },
    #[error(
        "unable to reserve IP {ip} from pool \"{pool}\" (family {family}): pool not (yet) available"
    )]
    ReserveNotAvailable {
        pool: String,
        family: &'static str,
        ip: IpAddr,
    },
    #[error(
        "all CIDR ranges are exhausted: pool \"{pool}\" ({family}) has {used} of {usable} addresses in use"
    )]
    Exhausted {
        pool: String,
        family: &'static str,
        used: u64,
        usable: u64,
    },
    #[error("IP {ip} not in range of any CIDR")]
    NotInRange { ip: IpAddr },
    #[error("provided IP is already allocated")]
    AlreadyAllocated { ip: IpAddr },
}

struct Block {
    cidr: IpNet,
    alloc: HostScopeAllocator,
    removed: bool,
}

#[derive(Default)]
struct Pool {
    v4: Vec<Block>,
    v6: Vec<Block>,
}

impl Pool {
    fn blocks(&self, family: Family) -> &Vec<Block> {
        match family {
            Family::V4 => &self.v4,
            Family::V6 => &self.v6,
        }
    }
    fn blocks_mut(&mut self, family: Family) -> &mut Vec<Block> {
        match family {
            Family::V4 => &mut self.v4,
            Family::V6 => &mut self.v6,
        }
    }
}

/// One block as status shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockSummary {
    pub pool: String,
    pub family: Family,
    pub cidr: IpNet,
    pub used: u64,
    pub usable: u64,
    /// Cilium's capacity figure (2^hostbits − 2).
    pub capacity: u64,
    pub removed: bool,
}

/// Every pool the node holds blocks of.
#[derive(Default)]
pub struct PoolSet {
    pools: BTreeMap<String, Pool>,
}

/// Cilium's demand rounding: with pre-allocation `p`, `n` addresses in use ask for
/// the next-but-one multiple of `p` (0 → p, 1..=p → 2p, p+1 → 3p), so there is
/// always at least one spare unit; `p == 0` asks for exactly `n`.
pub fn needed_ip_ceil(n: u64, p: u64) -> u64 {
    if p == 0 {
        return n;
    }
    if !n.is_multiple_of(p) {
        (n / p + 2) * p
    } else {
        (n / p + 1) * p
    }
}

impl PoolSet {
    pub fn new() -> PoolSet {
        PoolSet::default()
    }

    /// Makes `pool`'s blocks of `family` exactly `cidrs` (the node's allocation):
    /// new CIDRs become blocks (after the existing ones), missing ones go, unless
    /// addresses in them are still used (then they stay, marked removed). Returns a
    /// line per decision for the log.
    pub fn sync_pool(
        &mut self,
        pool: &str,
        family: Family,
        cidrs: &[IpNet],
        opts: AllocatorOptions,
    ) -> Vec<String> {
        let mut log = Vec::new();
        let p = self.pools.entry(pool.to_string()).or_default();
        let blocks = p.blocks_mut(family);
        blocks.retain_mut(|b| {
            if cidrs.contains(&b.cidr) {
                b.removed = false;
                return true;
            }
            if b.alloc.used() > 0 {
                if !b.removed {
                    log.push(format!(
                        "in-use CIDR was removed from spec: {} of pool {pool}",
                        b.cidr
                    ));
                }
                b.removed = true;
                true
            } else {
                false
            }
        });
        for cidr in cidrs {
            if blocks.iter().any(|b| b.cidr == *cidr) {
                continue;
            }
            match HostScopeAllocator::with_options(*cidr, opts) {
                Ok(alloc) if alloc.usable() > 0 => blocks.push(Block {
                    cidr: *cidr,
                    alloc,
                    removed: false,
                }),
                Ok(_) => log.push(format!("skipping too-small CIDR {cidr} of pool {pool}")),
                Err(e) => log.push(format!("skipping CIDR {cidr} of pool {pool}: {e}")),
            }
        }
        if p.v4.is_empty() && p.v6.is_empty() {
            self.pools.remove(pool);
        }
        log
    }

    /// True if the pool has any block of `family`.
    pub fn has(&self, pool: &str, family: Family) -> bool {
        self.pools
            .get(pool)
            .is_some_and(|p| !p.blocks(family).is_empty())
    }

    /// The next free address of `pool` in `family`.
    pub fn allocate_next(&mut self, pool: &str, family: Family) -> Result<IpAddr, PoolError> {
        let p = self
            .pools
            .get_mut(pool)
            .filter(|p| !p.blocks(family).is_empty())
            .ok_or_else(|| PoolError::NotAvailable {
                pool: pool.into(),
                family: family.as_str(),
            })?;
        for b in p.blocks_mut(family).iter_mut().filter(|b| !b.removed) {
            if let Ok(ip) = b.alloc.allocate_next() {
                return Ok(ip);
            }
        }
        let (used, usable) = (self.used(pool, family), self.usable(pool, family));
        Err(PoolError::Exhausted {
            pool: pool.into(),
            family: family.as_str(),
            used,
            usable,
        })
    }

    /// Reserves `ip` in `pool` (restore, or a specific request).
    pub fn allocate(&mut self, pool: &str, ip: IpAddr) -> Result<(), PoolError> {
        let family = Family::of_addr(&ip);
        let p = self
            .pools
            .get_mut(pool)
            .filter(|p| !p.blocks(family).is_empty())
            .ok_or_else(|| PoolError::ReserveNotAvailable {
                pool: pool.into(),
                family: family.as_str(),
                ip,
            })?;
        let b = p
            .blocks_mut(family)
            .iter_mut()
            .find(|b| b.alloc.contains(ip))
            .ok_or(PoolError::NotInRange { ip })?;
        b.alloc
            .allocate(ip)
            .map_err(|_| PoolError::AlreadyAllocated { ip })
    }

    /// Releases `ip` wherever it is; false if it was not allocated.
    pub fn release(&mut self, ip: IpAddr) -> bool {
        self.block_mut(ip).is_some_and(|b| b.alloc.release(ip))
    }

    /// Continues next-fit allocation after `ip` in its block (restore).
    pub fn set_cursor_after(&mut self, ip: IpAddr) {
        if let Some(b) = self.block_mut(ip) {
            b.alloc.set_cursor_after(ip);
        }
    }

    fn block_mut(&mut self, ip: IpAddr) -> Option<&mut Block> {
        let family = Family::of_addr(&ip);
        self.pools
            .values_mut()
            .flat_map(|p| p.blocks_mut(family).iter_mut())
            .find(|b| b.alloc.contains(ip))
    }

    /// The pool and block CIDR whose usable range holds `ip`.
    pub fn locate(&self, ip: IpAddr) -> Option<(&str, IpNet)> {
        let family = Family::of_addr(&ip);
        self.pools.iter().find_map(|(name, p)| {
            p.blocks(family)
                .iter()
                .find(|b| b.alloc.contains(ip))
                .map(|b| (name.as_str(), b.cidr))
        })
    }

    /// Addresses in use in `pool`/`family`.
    pub fn used(&self, pool: &str, family: Family) -> u64 {
        self.pools
            .get(pool)
            .map(|p| p.blocks(family).iter().map(|b| b.alloc.used()).sum())
            .unwrap_or(0)
    }

    /// Addresses that can be handed out at all in `pool`/`family` (removed blocks
    /// count only their used addresses).
    pub fn usable(&self, pool: &str, family: Family) -> u64 {
        self.pools
            .get(pool)
            .map(|p| {
                p.blocks(family)
                    .iter()
                    .map(|b| {
                        if b.removed {
                            b.alloc.used()
                        } else {
                            b.alloc.usable()
                        }
                    })
                    .sum()
            })
            .unwrap_or(0)
    }

    /// Pool names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.pools.keys().cloned().collect()
    }

    /// Every block, by pool then family (IPv4 first) then insertion order.
    pub fn blocks(&self) -> Vec<BlockSummary> {
        let mut out = Vec::new();
        for (name, p) in &self.pools {
            for family in [Family::V4, Family::V6] {
                for b in p.blocks(family) {
                    out.push(BlockSummary {
                        pool: name.clone(),
                        family,
                        cidr: b.cidr,
                        used: b.alloc.used(),
                        usable: b.alloc.usable(),
                        capacity: b.alloc.capacity(),
                        removed: b.removed,
                    });
                }
            }
        }
        out
    }

    /// Sticky pools (one address a block, each an identity's): the blocks with
    /// no address in use that are not in `keep` (the addresses this node still
    /// asks for) are dropped and returned, for the caller to give back.
    pub fn release_blocks_not_kept(
        &mut self,
        pool: &str,
        family: Family,
        keep: &std::collections::BTreeSet<IpAddr>,
    ) -> Vec<IpNet> {
        let Some(p) = self.pools.get_mut(pool) else {
            return Vec::new();
        };
        let blocks = p.blocks_mut(family);
        let released: Vec<IpNet> = blocks
            .iter()
            .filter(|b| b.alloc.used() == 0 && !keep.contains(&b.cidr.network()))
            .map(|b| b.cidr)
            .collect();
        blocks.retain(|b| !released.contains(&b.cidr));
        if p.v4.is_empty() && p.v6.is_empty() {
            self.pools.remove(pool);
        }
        released
    }

    /// Blocks to give back (Cilium §6.4): walking the newest first, a block with no
    /// address in use goes when the rest still leaves `needed − in use` free.
    /// The chosen blocks are dropped here; the caller removes them from the node's
    /// allocation.
    pub fn release_free_blocks(&mut self, pool: &str, family: Family, needed: u64) -> Vec<IpNet> {
        let Some(p) = self.pools.get_mut(pool) else {
            return Vec::new();
        };
        let blocks = p.blocks_mut(family);
        let in_use: u64 = blocks.iter().map(|b| b.alloc.used()).sum();
        let free_needed = needed.saturating_sub(in_use);
        let mut free: u64 = blocks
            .iter()
            .filter(|b| !b.removed)
            .map(|b| b.alloc.free())
            .sum();
        let mut released = Vec::new();
        for b in blocks.iter().rev() {
            if b.alloc.used() == 0 && free.saturating_sub(b.alloc.free()) >= free_needed {
                free -= b.alloc.free();
                released.push(b.cidr);
            }
        }
        blocks.retain(|b| !released.contains(&b.cidr));
        if p.v4.is_empty() && p.v6.is_empty() {
            self.pools.remove(pool);
        }
        released
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn needed_ip_ceil_matches_cilium() {
        let p = 16;
        assert_eq!(needed_ip_ceil(0, p), 16);
        assert_eq!(needed_ip_ceil(1, p), 32);
        assert_eq!(needed_ip_ceil(15, p), 32);
        assert_eq!(needed_ip_ceil(16, p), 32);
        assert_eq!(needed_ip_ceil(17, p), 48);
        assert_eq!(needed_ip_ceil(1000, 8), 1008);
        assert_eq!(needed_ip_ceil(1001, 8), 1016);
        assert_eq!(needed_ip_ceil(7, 0), 7);
        for n in 1..=8 {
            assert_eq!(needed_ip_ceil(n, 8), 16, "n={n}");
        }
        assert_eq!(needed_ip_ceil(9, 8), 24);
    }

    #[test]
    fn allocation_walks_blocks_in_order_and_reports_exhaustion() {
        let mut s = PoolSet::new();
        s.sync_pool(
            "default",
            Family::V4,
            &[net("10.0.0.0/30"), net("10.0.1.0/30")],
            AllocatorOptions::default(),
        );
        let got: Vec<String> = (0..4)
            .map(|_| s.allocate_next("default", Family::V4).unwrap().to_string())
            .collect();
        assert_eq!(got, ["10.0.0.1", "10.0.0.2", "10.0.1.1", "10.0.1.2"]);
        let e = s.allocate_next("default", Family::V4).unwrap_err();
        assert!(
            e.to_string().starts_with("all CIDR ranges are exhausted"),
            "{e}"
        );
        assert_eq!(
            s.allocate_next("mars", Family::V4).unwrap_err().to_string(),
            "unable to allocate from pool \"mars\" (family ipv4): pool not (yet) available"
        );
        assert_eq!(
            s.allocate_next("default", Family::V6)
                .unwrap_err()
                .to_string(),
            "unable to allocate from pool \"default\" (family ipv6): pool not (yet) available"
        );
    }

    #[test]
    fn first_and_last_follow_the_pool_options() {
        let mut s = PoolSet::new();
        let opts = AllocatorOptions {
            allow_first_ip: true,
            allow_last_ip: true,
        };
        s.sync_pool("eni", Family::V4, &[net("10.1.0.0/30")], opts);
        assert_eq!(s.usable("eni", Family::V4), 4);
        assert_eq!(
            s.allocate_next("eni", Family::V4).unwrap().to_string(),
            "10.1.0.0"
        );
        s.sync_pool(
            "single",
            Family::V4,
            &[net("10.2.0.7/32")],
            AllocatorOptions::default(),
        );
        assert_eq!(
            s.allocate_next("single", Family::V4).unwrap().to_string(),
            "10.2.0.7"
        );
    }

    #[test]
    fn specific_allocation_errors() {
        let mut s = PoolSet::new();
        s.sync_pool(
            "default",
            Family::V4,
            &[net("10.0.0.0/24")],
            AllocatorOptions::default(),
        );
        let ip: IpAddr = "10.0.0.9".parse().unwrap();
        s.allocate("default", ip).unwrap();
        assert_eq!(
            s.allocate("default", ip).unwrap_err(),
            PoolError::AlreadyAllocated { ip }
        );
        let out: IpAddr = "10.9.0.1".parse().unwrap();
        assert_eq!(
            s.allocate("default", out).unwrap_err().to_string(),
            "IP 10.9.0.1 not in range of any CIDR"
        );
        assert!(
            s.allocate("mars", ip)
                .unwrap_err()
                .to_string()
                .contains("unable to reserve IP 10.0.0.9 from pool \"mars\"")
        );
        assert_eq!(s.locate(ip), Some(("default", net("10.0.0.0/24"))));
        assert!(s.release(ip));
        assert!(!s.release(ip));
    }

    #[test]
    fn a_block_removed_while_in_use_is_kept_but_not_used() {
        let mut s = PoolSet::new();
        let opts = AllocatorOptions::default();
        s.sync_pool(
            "default",
            Family::V4,
            &[net("10.0.0.0/30"), net("10.0.1.0/30")],
            opts,
        );
        let ip = s.allocate_next("default", Family::V4).unwrap();
        let log = s.sync_pool("default", Family::V4, &[net("10.0.1.0/30")], opts);
        assert!(
            log[0].contains("in-use CIDR was removed from spec"),
            "{log:?}"
        );
        assert_eq!(
            s.allocate_next("default", Family::V4).unwrap().to_string(),
            "10.0.1.1"
        );
        assert!(s.release(ip));
        s.sync_pool("default", Family::V4, &[net("10.0.1.0/30")], opts);
        assert_eq!(s.blocks().len(), 1);
    }

    #[test]
    fn free_blocks_above_demand_are_given_back_newest_first() {
        let mut s = PoolSet::new();
        let opts = AllocatorOptions::default();
        let cidrs = [net("10.0.0.0/29"), net("10.0.0.8/29"), net("10.0.0.16/29")];
        s.sync_pool("default", Family::V4, &cidrs, opts);
        let ip = s.allocate_next("default", Family::V4).unwrap();
        assert_eq!(ip.to_string(), "10.0.0.1");
        // 1 in use, demand 8: 7 must stay free, so one empty /29 (6 usable) goes
        // and one stays.
        let released = s.release_free_blocks("default", Family::V4, 8);
        assert_eq!(released, vec![net("10.0.0.16/29")]);
        // With no demand the other empty block goes; the one in use never does.
        assert_eq!(
            s.release_free_blocks("default", Family::V4, 0),
            vec![net("10.0.0.8/29")]
        );
        assert!(s.release_free_blocks("default", Family::V4, 0).is_empty());
        s.release(ip);
        assert_eq!(
            s.release_free_blocks("default", Family::V4, 0),
            vec![net("10.0.0.0/29")]
        );
        assert!(s.names().is_empty());
    }

    #[test]
    fn sticky_blocks_go_back_unless_in_use_or_still_asked_for() {
        let mut s = PoolSet::new();
        let blocks = [
            net("10.20.0.1/32"),
            net("10.20.0.2/32"),
            net("10.20.0.3/32"),
        ];
        s.sync_pool("web", Family::V4, &blocks, AllocatorOptions::default());
        let (one, two): (IpAddr, IpAddr) =
            ("10.20.0.1".parse().unwrap(), "10.20.0.2".parse().unwrap());
        s.allocate("web", one).unwrap();
        let keep = std::collections::BTreeSet::from([two]);
        assert_eq!(
            s.release_blocks_not_kept("web", Family::V4, &keep),
            vec![net("10.20.0.3/32")]
        );
        assert!(
            s.release_blocks_not_kept("web", Family::V4, &keep)
                .is_empty()
        );
        s.release(one);
        assert_eq!(
            s.release_blocks_not_kept("web", Family::V4, &Default::default()),
            blocks[..2].to_vec()
        );
        assert!(s.names().is_empty());
    }

    #[test]
    fn too_small_cidrs_are_skipped() {
        let mut s = PoolSet::new();
        let log = s.sync_pool(
            "p",
            Family::V4,
            &[net("0.0.0.0/0")],
            AllocatorOptions::default(),
        );
        assert!(log[0].contains("skipping CIDR"), "{log:?}");
        assert!(!s.has("p", Family::V4));
    }
}
