//! Owns `CidrSet`, the operator-side node-CIDR allocator: it carves one
//! cluster pool CIDR into node CIDRs of a fixed mask size, with Kubernetes /
//! Cilium `cidrset` semantics (`pkg/ipam/cidrset/cidr_set.go`).
//!
//! # Allocation order
//!
//! [`CidrSet::allocate_next`] is **round-robin**, exactly as Cilium: the scan
//! starts at `next_candidate`, takes the first free index with wrap-around,
//! and sets `next_candidate = (found + 1) mod max_cidrs`. It is not
//! lowest-first: a released node CIDR is handed out again only after the
//! candidate has wrapped around.
//!
//! # Index math
//!
//! Node CIDR `i` is `cluster_base | (i << (bits − node_mask))`; the index of an
//! address is `(cluster_base ^ addr) >> (bits − node_mask)`, which must be
//! below `max_cidrs = 1 << (node_mask − cluster_mask)`. Both families are
//! computed in `u128` (Cilium splits IPv6 into 64-bit halves; the result is
//! the same).

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use super::Family;
use super::bitmap::Bitmap;
use super::ip_number::{from_number, to_number};

/// Cilium's `clusterSubnetMaxDiff`: for IPv6, `node_mask − cluster_mask` may
/// be at most 16.
pub const CLUSTER_SUBNET_MAX_DIFF: u8 = 16;

/// podnet's own limit for IPv4: `node_mask − cluster_mask` may be at most 24,
/// i.e. at most 2^24 node CIDRs (a 2 MiB bitmap). Cilium checks no difference
/// for IPv4; podnet refuses larger ones because the allocator keeps an
/// uncompressed bitmap with one bit per node CIDR.
pub const IPV4_MAX_DIFF: u8 = 24;

/// The node mask sizes [`CidrSet::new`] accepts for `cluster`: from its prefix
/// length to [`CLUSTER_SUBNET_MAX_DIFF`] (IPv6) or [`IPV4_MAX_DIFF`] (IPv4) bits
/// longer, within the family's width.
pub fn node_mask_range(cluster: IpNet) -> (u8, u8) {
    let family = Family::of_net(&cluster);
    let most = match family {
        Family::V6 => CLUSTER_SUBNET_MAX_DIFF,
        Family::V4 => IPV4_MAX_DIFF,
    };
    let shortest = cluster.prefix_len();
    (shortest, shortest.saturating_add(most).min(family.bits()))
}

impl CidrSetError {
    /// What to set `option` (the mask size's option or field) to, for an error
    /// whose own text does not say it (Cilium's texts name no bound): `; <option>
    /// must be /<a> to /<b> for <cluster>`, else empty.
    pub fn mask_advice(&self, option: &str, cluster: IpNet) -> String {
        match self {
            CidrSetError::SubNetTooBig | CidrSetError::SubNetMaskSizeInvalid => {
                let (a, b) = node_mask_range(cluster);
                format!("; {option} must be /{a} to /{b} for {}", cluster.trunc())
            }
            _ => String::new(),
        }
    }
}

/// Errors of [`CidrSet`]. The first five texts are Cilium's, verbatim.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrSetError {
    /// Cilium `ErrCIDRRangeNoCIDRsRemaining`.
    #[error(
        "CIDR allocation failed; there are no remaining CIDRs left to allocate in the accepted range"
    )]
    NoRemaining,
    /// Cilium `ErrCIDRSetSubNetTooBig` (IPv6 difference above 16).
    #[error("New CIDR set failed; the node CIDR size is too big")]
    SubNetTooBig,
    /// Cilium `ErrSubNetMaskSizeInvalid`.
    #[error("SubNetMask is invalid, should be lower or equal to 32 for IPv4 and to 128 for IPv6")]
    SubNetMaskSizeInvalid,
    /// An address whose index falls outside the allocator.
    #[error("CIDR: {addr}/{mask} is out of the range of CIDR allocator")]
    IndexOutOfRange { addr: IpAddr, mask: u8 },
    /// A prefix that neither lies in nor contains the cluster CIDR.
    #[error("cidr {cidr} is out the range of cluster cidr {cluster}")]
    OutOfClusterRange { cidr: IpNet, cluster: IpNet },
    /// podnet check (Cilium does not validate it): the node mask must not be
    /// shorter than the cluster prefix.
    #[error(
        "node mask size /{node_mask} is shorter than the prefix length of cluster CIDR {cluster}; \
         it must be /{} or longer",
        cluster.prefix_len()
    )]
    NodeMaskShorterThanCluster { cluster: IpNet, node_mask: u8 },
    /// podnet check (Cilium does not validate it): IPv4 difference above
    /// [`IPV4_MAX_DIFF`].
    #[error(
        "node mask size /{node_mask} splits cluster CIDR {cluster} into 2^{} node CIDRs, more \
         than the supported 2^24; use a longer cluster prefix or a shorter node mask",
        node_mask - cluster.prefix_len()
    )]
    TooManyNodeCidrs { cluster: IpNet, node_mask: u8 },
}

/// Node-CIDR allocator over one cluster CIDR. See the module docs for the
/// allocation order and the index math.
#[derive(Debug, Clone)]
pub struct CidrSet {
    /// The cluster CIDR, masked to its network.
    cluster: IpNet,
    family: Family,
    cluster_base: u128,
    node_mask: u8,
    max_cidrs: u64,
    next_candidate: u64,
    /// One bit per node-CIDR index.
    used: Bitmap,
}

impl CidrSet {
    /// A node-CIDR allocator carving `cluster` (masked to its network) into
    /// `/node_mask` blocks.
    ///
    /// Checks, in order: `node_mask` above 32 (IPv4) / 128 (IPv6) →
    /// [`CidrSetError::SubNetMaskSizeInvalid`]; `node_mask` shorter than the
    /// cluster prefix → [`CidrSetError::NodeMaskShorterThanCluster`] (podnet
    /// only); IPv6 difference above 16 → [`CidrSetError::SubNetTooBig`];
    /// IPv4 difference above 24 → [`CidrSetError::TooManyNodeCidrs`] (podnet
    /// only: 2^24 bitmap bits is the practical limit).
    pub fn new(cluster: IpNet, node_mask: u8) -> Result<Self, CidrSetError> {
        let cluster = cluster.trunc();
        let family = Family::of_net(&cluster);
        if node_mask > family.bits() {
            return Err(CidrSetError::SubNetMaskSizeInvalid);
        }
        let cluster_mask = cluster.prefix_len();
        if node_mask < cluster_mask {
            return Err(CidrSetError::NodeMaskShorterThanCluster { cluster, node_mask });
        }
        let diff = node_mask - cluster_mask;
        match family {
            Family::V6 if diff > CLUSTER_SUBNET_MAX_DIFF => {
                return Err(CidrSetError::SubNetTooBig);
            }
            Family::V4 if diff > IPV4_MAX_DIFF => {
                return Err(CidrSetError::TooManyNodeCidrs { cluster, node_mask });
            }
            _ => {}
        }
        let max_cidrs = 1u64 << diff;
        Ok(Self {
            cluster,
            family,
            cluster_base: to_number(cluster.network()),
            node_mask,
            max_cidrs,
            next_candidate: 0,
            used: Bitmap::new(max_cidrs),
        })
    }

    /// The cluster CIDR (network form).
    pub fn cluster(&self) -> IpNet {
        self.cluster
    }

    /// The node CIDR mask size.
    pub fn node_mask(&self) -> u8 {
        self.node_mask
    }

    /// The family of the cluster CIDR.
    pub fn family(&self) -> Family {
        self.family
    }

    /// `1 << (node_mask − cluster_mask)`.
    pub fn max_cidrs(&self) -> u64 {
        self.max_cidrs
    }

    /// Number of allocated node-CIDR indices.
    pub fn allocated_count(&self) -> u64 {
        self.used.count_ones()
    }

    /// Whether every node CIDR is allocated.
    pub fn is_full(&self) -> bool {
        self.used.count_ones() == self.max_cidrs
    }

    fn shift(&self) -> u32 {
        u32::from(self.family.bits() - self.node_mask)
    }

    /// The node CIDR at `index`, or `None` when `index >= max_cidrs()`.
    pub fn index_to_cidr(&self, index: u64) -> Option<IpNet> {
        if index >= self.max_cidrs {
            return None;
        }
        let offset = u128::from(index).checked_shl(self.shift()).unwrap_or(0);
        let addr = from_number(self.family, self.cluster_base | offset);
        IpNet::new(addr, self.node_mask).ok()
    }

    /// The node-CIDR index holding `addr`: `(cluster ^ addr) >> (bits − node_mask)`.
    pub fn index_of(&self, addr: IpAddr) -> Result<u64, CidrSetError> {
        let out = CidrSetError::IndexOutOfRange {
            addr,
            mask: self.node_mask,
        };
        if Family::of_addr(&addr) != self.family {
            return Err(out);
        }
        let index = (self.cluster_base ^ to_number(addr))
            .checked_shr(self.shift())
            .unwrap_or(0);
        if index >= u128::from(self.max_cidrs) {
            return Err(out);
        }
        Ok(index as u64)
    }

    /// Whether the cluster CIDR contains the prefix's address, or the prefix
    /// contains the cluster's address (Cilium `InRange`). Always false for
    /// the other family.
    pub fn in_range(&self, prefix: &IpNet) -> bool {
        self.cluster.contains(&prefix.addr()) || prefix.trunc().contains(&self.cluster.network())
    }

    /// Cilium `getBeginningAndEndIndices`: the inclusive index range covered
    /// by `prefix`. A prefix longer than the cluster prefix covers the node
    /// CIDRs of its first and last addresses and everything between; an
    /// equal or wider one covers every index.
    pub fn index_range(&self, prefix: &IpNet) -> Result<(u64, u64), CidrSetError> {
        if !self.in_range(prefix) {
            return Err(CidrSetError::OutOfClusterRange {
                cidr: *prefix,
                cluster: self.cluster,
            });
        }
        if self.cluster.prefix_len() < prefix.prefix_len() {
            let begin = self.index_of(prefix.network())?;
            let end = self.index_of(prefix.broadcast())?;
            Ok((begin, end))
        } else {
            Ok((0, self.max_cidrs - 1))
        }
    }

    /// Allocates the next free node CIDR, round-robin from `next_candidate`
    /// (see the module docs).
    pub fn allocate_next(&mut self) -> Result<IpNet, CidrSetError> {
        if self.is_full() {
            return Err(CidrSetError::NoRemaining);
        }
        let found = self
            .used
            .find_next_clear(self.next_candidate)
            .ok_or(CidrSetError::NoRemaining)?;
        let cidr = self.index_to_cidr(found).ok_or(CidrSetError::NoRemaining)?;
        self.used.set(found);
        self.next_candidate = (found + 1) % self.max_cidrs;
        Ok(cidr)
    }

    /// Marks every index covered by `prefix` as allocated. Succeeds even if
    /// some were already set; only newly set bits count.
    pub fn occupy(&mut self, prefix: &IpNet) -> Result<(), CidrSetError> {
        let (begin, end) = self.index_range(prefix)?;
        self.used.set_range(begin, end);
        Ok(())
    }

    /// Clears every index covered by `prefix`. Releasing a free CIDR is not
    /// an error; only bits that were set are uncounted.
    pub fn release(&mut self, prefix: &IpNet) -> Result<(), CidrSetError> {
        let (begin, end) = self.index_range(prefix)?;
        self.used.clear_range(begin, end);
        Ok(())
    }

    /// The allocated node CIDRs that `prefix` covers.
    pub fn allocated_within(&self, prefix: &IpNet) -> Result<Vec<IpNet>, CidrSetError> {
        let (begin, end) = self.index_range(prefix)?;
        Ok((begin..=end)
            .filter(|i| self.used.get(*i))
            .filter_map(|i| self.index_to_cidr(i))
            .collect())
    }

    /// True only if every index covered by `prefix` is allocated.
    pub fn is_allocated(&self, prefix: &IpNet) -> Result<bool, CidrSetError> {
        let (begin, end) = self.index_range(prefix)?;
        Ok(self.used.all_set(begin, end))
    }
}

impl fmt::Display for CidrSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (node mask /{}, {} of {} node CIDRs allocated)",
            self.cluster,
            self.node_mask,
            self.allocated_count(),
            self.max_cidrs
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }
    fn set(c: &str, m: u8) -> CidrSet {
        CidrSet::new(net(c), m).unwrap()
    }

    #[test]
    fn constructor_errors() {
        let invalid =
            "SubNetMask is invalid, should be lower or equal to 32 for IPv4 and to 128 for IPv6";
        assert_eq!(
            CidrSet::new(net("10.0.0.0/8"), 33).unwrap_err().to_string(),
            invalid
        );
        assert_eq!(
            CidrSet::new(net("fd00::/104"), 129)
                .unwrap_err()
                .to_string(),
            invalid
        );
        assert_eq!(
            CidrSet::new(net("fd00::/104"), 121)
                .unwrap_err()
                .to_string(),
            "New CIDR set failed; the node CIDR size is too big"
        );
        assert_eq!(
            CidrSet::new(net("fd00:10:244::/96"), 113).unwrap_err(),
            CidrSetError::SubNetTooBig
        );
        assert_eq!(
            CidrSet::new(net("10.0.0.0/16"), 8).unwrap_err().to_string(),
            "node mask size /8 is shorter than the prefix length of cluster CIDR 10.0.0.0/16; \
             it must be /16 or longer"
        );
        assert!(matches!(
            CidrSet::new(net("fd00::/64"), 48),
            Err(CidrSetError::NodeMaskShorterThanCluster { .. })
        ));
        assert_eq!(
            CidrSet::new(net("10.0.0.0/7"), 32).unwrap_err().to_string(),
            "node mask size /32 splits cluster CIDR 10.0.0.0/7 into 2^25 node CIDRs, more than \
             the supported 2^24; use a longer cluster prefix or a shorter node mask"
        );
        // Boundaries that are accepted.
        assert_eq!(set("10.0.0.0/8", 32).max_cidrs(), 1 << 24);
        assert_eq!(set("10.0.0.0/8", 8).max_cidrs(), 1);
        assert_eq!(set("fd00::/112", 128).max_cidrs(), 65536);
        assert_eq!(set("::/0", 0).max_cidrs(), 1);
        assert_eq!(set("0.0.0.0/0", 0).max_cidrs(), 1);
    }

    #[test]
    fn the_mask_advice_is_the_range_every_accepted_mask_lies_in() {
        for (cluster, range) in [
            ("fd00::/104", (104, 120)),
            ("fd00::/120", (120, 128)),
            ("10.0.0.0/8", (8, 32)),
            ("10.0.0.0/24", (24, 32)),
        ] {
            let cluster = net(cluster);
            assert_eq!(node_mask_range(cluster), range, "{cluster}");
            let bits = Family::of_net(&cluster).bits();
            for mask in 0..=bits + 1 {
                let inside = (range.0..=range.1).contains(&mask);
                assert_eq!(
                    CidrSet::new(cluster, mask).is_ok(),
                    inside,
                    "{cluster} /{mask}"
                );
            }
        }
        let too_big = CidrSet::new(net("fd00::/104"), 121).unwrap_err();
        assert_eq!(
            too_big.mask_advice("m", net("fd00::/104")),
            "; m must be /104 to /120 for fd00::/104"
        );
        // Texts that say the bound themselves get no advice.
        let short = CidrSet::new(net("fd00::/104"), 96).unwrap_err();
        assert_eq!(short.mask_advice("m", net("fd00::/104")), "");
    }

    #[test]
    fn v4_index_math() {
        let s = set("10.0.0.0/8", 24);
        assert_eq!(s.max_cidrs(), 65536);
        assert_eq!(s.index_to_cidr(0), Some(net("10.0.0.0/24")));
        assert_eq!(s.index_to_cidr(1), Some(net("10.0.1.0/24")));
        assert_eq!(s.index_to_cidr(256), Some(net("10.1.0.0/24")));
        assert_eq!(s.index_to_cidr(65535), Some(net("10.255.255.0/24")));
        assert_eq!(s.index_to_cidr(65536), None);
        assert_eq!(s.index_of(ip("10.0.1.0")), Ok(1));
        assert_eq!(s.index_of(ip("10.0.1.77")), Ok(1));
        assert_eq!(s.index_of(ip("10.255.255.255")), Ok(65535));
        assert_eq!(
            s.index_of(ip("11.0.0.0")).unwrap_err().to_string(),
            "CIDR: 11.0.0.0/24 is out of the range of CIDR allocator"
        );
        assert!(s.index_of(ip("fd00::")).is_err());
        // Normalised cluster and /32 node CIDRs.
        let s = set("192.168.7.9/24", 32);
        assert_eq!(s.cluster(), net("192.168.7.0/24"));
        assert_eq!(s.index_to_cidr(9), Some(net("192.168.7.9/32")));
        let s = set("10.244.0.0/16", 26);
        assert_eq!(s.max_cidrs(), 1024);
        assert_eq!(s.index_to_cidr(5), Some(net("10.244.1.64/26")));
    }

    #[test]
    fn v6_index_math() {
        let s = set("fd00::/104", 120);
        assert_eq!(s.max_cidrs(), 65536);
        assert_eq!(s.index_to_cidr(1), Some(net("fd00::100/120")));
        assert_eq!(s.index_to_cidr(65535), Some(net("fd00::ff:ff00/120")));
        assert_eq!(s.index_of(ip("fd00::ff:ff00")), Ok(65535));

        let s = set("fd00:10:244::/96", 112);
        assert_eq!(s.max_cidrs(), 65536);
        assert_eq!(s.index_to_cidr(0), Some(net("fd00:10:244::/112")));
        assert_eq!(s.index_to_cidr(1), Some(net("fd00:10:244::1:0/112")));
        assert_eq!(s.index_to_cidr(65535), Some(net("fd00:10:244::ffff:0/112")));
        assert_eq!(s.index_of(ip("fd00:10:244::ffff:1234")), Ok(65535));

        // Index in the high half (node mask <= 64).
        let s = set("fd00:1::/48", 64);
        assert_eq!(s.index_to_cidr(5), Some(net("fd00:1:0:5::/64")));
        assert_eq!(s.index_of(ip("fd00:1:0:5::1")), Ok(5));
        // Index straddling the 64-bit halves.
        let s = set("fd00::/56", 72);
        assert_eq!(s.index_to_cidr(0xffff), Some(net("fd00:0:0:ff:ff00::/72")));
        assert_eq!(s.index_to_cidr(0x1ff), Some(net("fd00:0:0:1:ff00::/72")));
        assert_eq!(s.index_of(ip("fd00:0:0:1:ff00::5")), Ok(0x1ff));
        for i in [0u64, 1, 255, 256, 4095, 65535] {
            let c = s.index_to_cidr(i).unwrap();
            assert_eq!(s.index_of(c.network()), Ok(i));
        }
        assert_eq!(
            s.index_of(ip("fd01::")).unwrap_err().to_string(),
            "CIDR: fd01::/72 is out of the range of CIDR allocator"
        );
        // /128 node CIDRs.
        let s = set("fd00::/112", 128);
        assert_eq!(s.index_to_cidr(0xabcd), Some(net("fd00::abcd/128")));
    }

    #[test]
    fn round_robin_allocation() {
        let mut s = set("10.0.0.0/22", 24);
        assert_eq!(s.allocate_next().unwrap(), net("10.0.0.0/24"));
        assert_eq!(s.allocate_next().unwrap(), net("10.0.1.0/24"));
        assert_eq!(s.allocate_next().unwrap(), net("10.0.2.0/24"));
        s.release(&net("10.0.0.0/24")).unwrap();
        // Not lowest-first: continues after the last allocation.
        assert_eq!(s.allocate_next().unwrap(), net("10.0.3.0/24"));
        assert_eq!(s.allocate_next().unwrap(), net("10.0.0.0/24"));
        assert!(s.is_full());
        assert_eq!(
            s.allocate_next().unwrap_err().to_string(),
            "CIDR allocation failed; there are no remaining CIDRs left to allocate in the accepted range"
        );
        s.release(&net("10.0.2.0/24")).unwrap();
        s.release(&net("10.0.1.0/24")).unwrap();
        // next_candidate is index 1.
        assert_eq!(s.allocate_next().unwrap(), net("10.0.1.0/24"));
        assert_eq!(s.allocate_next().unwrap(), net("10.0.2.0/24"));
    }

    #[test]
    fn occupy_skips_in_round_robin() {
        let mut s = set("10.0.0.0/16", 24);
        s.occupy(&net("10.0.0.0/24")).unwrap();
        s.occupy(&net("10.0.2.0/24")).unwrap();
        assert_eq!(s.allocate_next().unwrap(), net("10.0.1.0/24"));
        assert_eq!(s.allocate_next().unwrap(), net("10.0.3.0/24"));
    }

    #[test]
    fn occupy_release_counting() {
        let mut s = set("10.0.0.0/16", 24);
        s.occupy(&net("10.0.4.0/24")).unwrap();
        assert_eq!(s.allocated_count(), 1);
        s.occupy(&net("10.0.4.0/24")).unwrap(); // already set: no double count
        assert_eq!(s.allocated_count(), 1);
        s.occupy(&net("10.0.4.0/22")).unwrap(); // 4..=7, 3 new
        assert_eq!(s.allocated_count(), 4);
        assert!(s.is_allocated(&net("10.0.4.0/22")).unwrap());
        assert!(s.is_allocated(&net("10.0.5.0/24")).unwrap());
        assert!(!s.is_allocated(&net("10.0.0.0/21")).unwrap());
        // A prefix longer than the node mask maps to its node CIDR.
        assert!(s.is_allocated(&net("10.0.6.128/25")).unwrap());
        s.release(&net("10.0.6.128/25")).unwrap();
        assert_eq!(s.allocated_count(), 3);
        assert!(!s.is_allocated(&net("10.0.6.0/24")).unwrap());
        s.release(&net("10.0.6.0/24")).unwrap(); // releasing a free CIDR is fine
        assert_eq!(s.allocated_count(), 3);
        // Wider-or-equal prefixes cover every index.
        s.occupy(&net("10.0.0.0/16")).unwrap();
        assert_eq!(s.allocated_count(), 256);
        assert!(s.is_full());
        assert!(s.is_allocated(&net("10.0.0.0/8")).unwrap());
        s.release(&net("0.0.0.0/0")).unwrap();
        assert_eq!(s.allocated_count(), 0);
        // Host bits in the prefix do not matter.
        s.occupy(&net("10.0.9.77/24")).unwrap();
        assert!(s.is_allocated(&net("10.0.9.0/24")).unwrap());
    }

    #[test]
    fn in_range_and_out_of_range_errors() {
        let mut s = set("10.0.0.0/16", 24);
        assert!(s.in_range(&net("10.0.1.0/24")));
        assert!(s.in_range(&net("10.0.0.0/16")));
        assert!(
            s.in_range(&net("10.0.0.0/8")),
            "prefix containing the cluster"
        );
        assert!(s.in_range(&net("10.0.200.3/32")));
        assert!(!s.in_range(&net("10.1.0.0/24")));
        assert!(!s.in_range(&net("11.0.0.0/8")));
        assert!(!s.in_range(&net("fd00::/8")));
        assert!(!s.in_range(&net("::/0")));
        assert_eq!(
            s.occupy(&net("10.1.0.0/24")).unwrap_err().to_string(),
            "cidr 10.1.0.0/24 is out the range of cluster cidr 10.0.0.0/16"
        );
        assert!(s.release(&net("192.168.0.0/24")).is_err());
        assert!(s.is_allocated(&net("192.168.0.0/24")).is_err());
        assert_eq!(s.allocated_count(), 0);

        let s6 = set("fd00::/104", 120);
        assert!(s6.in_range(&net("fd00::100/120")));
        assert!(s6.in_range(&net("fd00::/8")));
        assert!(!s6.in_range(&net("fd00::100:0:0/120")));
        assert!(!s6.in_range(&net("10.0.0.0/8")));
        assert_eq!(s6.index_range(&net("fd00::1:0/112")).unwrap(), (256, 511));
    }

    #[test]
    fn v6_full_allocation_and_wrap() {
        let mut s = set("fd00::/112", 116); // 16 node CIDRs
        let mut got = Vec::new();
        for _ in 0..16 {
            got.push(s.allocate_next().unwrap());
        }
        assert_eq!(got[0], net("fd00::/116"));
        assert_eq!(got[15], net("fd00::f000/116"));
        assert!(matches!(s.allocate_next(), Err(CidrSetError::NoRemaining)));
        s.release(&got[3]).unwrap();
        assert_eq!(s.allocate_next().unwrap(), got[3]);
    }

    #[test]
    fn large_v4_allocator_is_lazy_and_works() {
        let mut s = set("10.0.0.0/8", 32);
        assert_eq!(s.allocate_next().unwrap(), net("10.0.0.0/32"));
        s.occupy(&net("10.255.255.255/32")).unwrap();
        assert_eq!(s.allocated_count(), 2);
        assert_eq!(
            s.to_string(),
            "10.0.0.0/8 (node mask /32, 2 of 16777216 node CIDRs allocated)"
        );
    }
}
