//! Owns `HostScopeAllocator`: the node-side allocator of single pod addresses
//! out of the node's primary pod CIDR, one instance per IP family (Cilium's
//! host-scope allocator, used by the cluster-pool and kubernetes IPAM modes).
//!
//! # Range
//!
//! As Cilium's `RangeSize`: a CIDR with ≥ 31 host bits (IPv4) or ≥ 127 host
//! bits (IPv6) has no range and is refused; IPv6 is capped at 65,536 tracked
//! addresses when it has ≥ 16 host bits; otherwise the range is 2^hostbits
//! addresses. When the range has more than 2 addresses, its first (network)
//! and last (broadcast, or the 65,536th for a capped IPv6 range) are excluded
//! unless [`AllocatorOptions`] allows them. A /31 (or /127) keeps both
//! addresses; a /32 (or /128) has exactly one.
//!
//! # Allocation order
//!
//! [`HostScopeAllocator::allocate_next`] is **next-fit with a rotating
//! cursor** (like cidrset's `nextCandidate`): it scans from the cursor, with
//! wrap-around, for the first free usable address, then moves the cursor just
//! past it. A just-released address is therefore handed out again only after
//! the cursor has wrapped around the whole range. (Cilium starts each scan at
//! a random offset instead; podnet is deterministic.) The cursor starts at
//! the first usable address; [`HostScopeAllocator::set_cursor_after`] moves
//! it on restore.

use std::net::IpAddr;

use ipnet::IpNet;

use super::bitmap::Bitmap;
use super::ip_number::{from_number, to_number};
use super::{Family, IpamError};

/// Cap on the tracked IPv6 range (Cilium: IPv6 ranges with ≥ 16 host bits are
/// limited to 65,536 addresses).
pub const IPV6_RANGE_CAP: u64 = 1 << 16;

/// Options relaxing the first/last-address exclusion (used by multi-pool).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocatorOptions {
    /// Allow the first (network) address when the range has more than 2 addresses.
    pub allow_first_ip: bool,
    /// Allow the last (broadcast / 65,536th) address when the range has more
    /// than 2 addresses.
    pub allow_last_ip: bool,
}

/// Single-address allocator over one node CIDR. See the module docs for the
/// range rules and the allocation order.
#[derive(Debug, Clone)]
pub struct HostScopeAllocator {
    /// The node CIDR, normalised to its network address.
    cidr: IpNet,
    family: Family,
    /// Numeric address of usable index 0.
    first: u128,
    /// Number of usable addresses (bits in `used`).
    usable: u64,
    used: Bitmap,
    /// Index where the next scan starts.
    cursor: u64,
}

impl HostScopeAllocator {
    /// An allocator over `cidr` with the default exclusions (first and last
    /// address excluded when the range has more than 2 addresses).
    pub fn new(cidr: IpNet) -> Result<Self, IpamError> {
        Self::with_options(cidr, AllocatorOptions::default())
    }

    /// An allocator over `cidr` (normalised to its network, prefix length
    /// kept) with explicit first/last options.
    pub fn with_options(cidr: IpNet, opts: AllocatorOptions) -> Result<Self, IpamError> {
        let cidr = cidr.trunc();
        let family = Family::of_net(&cidr);
        let host_bits = cidr.max_prefix_len() - cidr.prefix_len();
        let size: u64 = match family {
            Family::V4 if host_bits >= 31 => {
                return Err(IpamError::CidrTooLarge { cidr, host_bits });
            }
            Family::V6 if host_bits >= 127 => {
                return Err(IpamError::CidrTooLarge { cidr, host_bits });
            }
            Family::V6 if host_bits >= 16 => IPV6_RANGE_CAP,
            _ => 1u64 << host_bits,
        };
        let mut first = to_number(cidr.network());
        let mut usable = size;
        if size > 2 {
            if !opts.allow_first_ip {
                first += 1;
                usable -= 1;
            }
            if !opts.allow_last_ip {
                usable -= 1;
            }
        }
        Ok(Self {
            cidr,
            family,
            first,
            usable,
            used: Bitmap::new(usable),
            cursor: 0,
        })
    }

    fn index_of(&self, ip: IpAddr) -> Option<u64> {
        if Family::of_addr(&ip) != self.family {
            return None;
        }
        let off = to_number(ip).checked_sub(self.first)?;
        (off < u128::from(self.usable)).then_some(off as u64)
    }

    fn ip_at(&self, index: u64) -> IpAddr {
        from_number(self.family, self.first + u128::from(index))
    }

    /// Allocates the next free address, next-fit from the rotating cursor
    /// (see the module docs). Fails with [`IpamError::RangeFull`] when every
    /// usable address is taken.
    pub fn allocate_next(&mut self) -> Result<IpAddr, IpamError> {
        let found = self
            .used
            .find_next_clear(self.cursor)
            .ok_or(IpamError::RangeFull {
                cidr: self.cidr,
                used: self.used.count_ones(),
                usable: self.usable,
            })?;
        self.used.set(found);
        self.cursor = (found + 1) % self.usable;
        Ok(self.ip_at(found))
    }

    /// Allocates a specific address. Does not move the cursor.
    pub fn allocate(&mut self, ip: IpAddr) -> Result<(), IpamError> {
        let index = self.index_of(ip).ok_or(IpamError::NotInRange {
            ip,
            cidr: self.cidr,
        })?;
        if !self.used.set(index) {
            return Err(IpamError::AlreadyAllocated { ip });
        }
        Ok(())
    }

    /// Releases an address. Returns false (and does nothing) when it was not
    /// allocated or is outside the usable range.
    pub fn release(&mut self, ip: IpAddr) -> bool {
        match self.index_of(ip) {
            Some(index) => self.used.clear(index),
            None => false,
        }
    }

    /// Whether `ip` is currently allocated.
    pub fn is_allocated(&self, ip: IpAddr) -> bool {
        self.index_of(ip).is_some_and(|i| self.used.get(i))
    }

    /// Whether `ip` is in the usable range (allocated or not).
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.index_of(ip).is_some()
    }

    /// Number of allocated addresses.
    pub fn used(&self) -> u64 {
        self.used.count_ones()
    }

    /// Number of allocatable addresses (after exclusions and the IPv6 cap).
    pub fn usable(&self) -> u64 {
        self.usable
    }

    /// Number of free addresses.
    pub fn free(&self) -> u64 {
        self.usable - self.used.count_ones()
    }

    /// Cilium's `Capacity` (metrics/status): 2^hostbits − 2, not capped for
    /// IPv6, saturating at `u64::MAX`; 0 for /31, /32 (and /127, /128).
    pub fn capacity(&self) -> u64 {
        let host_bits = u32::from(self.cidr.max_prefix_len() - self.cidr.prefix_len());
        match host_bits {
            0..64 => (1u64 << host_bits).saturating_sub(2),
            // 2^64 − 2 still fits; beyond that saturate.
            64 => u64::MAX - 1,
            _ => u64::MAX,
        }
    }

    /// The node CIDR (network address, original prefix length).
    pub fn cidr(&self) -> IpNet {
        self.cidr
    }

    /// The allocator's family.
    pub fn family(&self) -> Family {
        self.family
    }

    /// Allocated addresses in ascending address order.
    pub fn iter_allocated(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.used.iter_ones().map(|i| self.ip_at(i))
    }

    /// Moves the cursor just past `ip`, so that allocation continues after
    /// it (used on restore with the most recently allocated address).
    /// Returns false and leaves the cursor unchanged when `ip` is not in the
    /// usable range.
    pub fn set_cursor_after(&mut self, ip: IpAddr) -> bool {
        match self.index_of(ip) {
            Some(index) => {
                self.cursor = (index + 1) % self.usable;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }
    fn alloc(s: &str) -> HostScopeAllocator {
        HostScopeAllocator::new(net(s)).unwrap()
    }

    #[test]
    fn usable_counts_v4() {
        for (cidr, usable, first, last) in [
            ("10.0.1.0/24", 254, "10.0.1.1", "10.0.1.254"),
            ("10.0.0.0/22", 1022, "10.0.0.1", "10.0.3.254"),
            ("10.0.0.0/16", 65534, "10.0.0.1", "10.0.255.254"),
            ("10.0.0.0/30", 2, "10.0.0.1", "10.0.0.2"),
            ("10.0.0.0/31", 2, "10.0.0.0", "10.0.0.1"),
            ("10.0.0.7/32", 1, "10.0.0.7", "10.0.0.7"),
        ] {
            let a = alloc(cidr);
            assert_eq!(a.usable(), usable, "{cidr}");
            assert_eq!(a.used(), 0);
            assert_eq!(a.free(), usable);
            assert_eq!(a.family(), Family::V4);
            assert!(a.contains(ip(first)), "{cidr} first {first}");
            assert!(a.contains(ip(last)), "{cidr} last {last}");
        }
    }

    #[test]
    fn usable_counts_v6() {
        for (cidr, usable, first, last, beyond) in [
            ("fd00::/120", 254, "fd00::1", "fd00::fe", Some("fd00::ff")),
            (
                "fd00::/112",
                65534,
                "fd00::1",
                "fd00::fffe",
                Some("fd00::ffff"),
            ),
            (
                "fd00:10:244::/96",
                65534,
                "fd00:10:244::1",
                "fd00:10:244::fffe",
                Some("fd00:10:244::ffff"),
            ),
            (
                "fd00:1::/64",
                65534,
                "fd00:1::1",
                "fd00:1::fffe",
                Some("fd00:1::1:0"),
            ),
            ("fd00::/127", 2, "fd00::", "fd00::1", None),
            ("fd00::5/128", 1, "fd00::5", "fd00::5", None),
        ] {
            let a = alloc(cidr);
            assert_eq!(a.usable(), usable, "{cidr}");
            assert_eq!(a.family(), Family::V6);
            assert!(a.contains(ip(first)), "{cidr}");
            assert!(a.contains(ip(last)), "{cidr}");
            if let Some(b) = beyond {
                assert!(!a.contains(ip(b)), "{cidr} {b}");
            }
        }
        // Capped ranges: the 65,536th address and everything after it are out.
        let a = alloc("fd00:1::/64");
        assert!(!a.contains(ip("fd00:1::")));
        assert!(!a.contains(ip("fd00:1::ffff")));
        assert!(!a.contains(ip("fd00:1::ffff:ffff:ffff:fffe")));
    }

    #[test]
    fn first_and_last_excluded() {
        let mut a = alloc("10.0.1.0/24");
        assert!(!a.contains(ip("10.0.1.0")));
        assert!(!a.contains(ip("10.0.1.255")));
        let want = "provided IP is not in the valid range. The range of valid IPs is 10.0.1.0/24";
        assert_eq!(a.allocate(ip("10.0.1.0")).unwrap_err().to_string(), want);
        assert_eq!(a.allocate(ip("10.0.1.255")).unwrap_err().to_string(), want);
        let mut a = alloc("10.0.0.0/30");
        assert!(a.allocate(ip("10.0.0.0")).is_err());
        assert!(a.allocate(ip("10.0.0.3")).is_err());
        assert_eq!(a.allocate_next().unwrap(), ip("10.0.0.1"));
        assert_eq!(a.allocate_next().unwrap(), ip("10.0.0.2"));
        assert!(matches!(
            a.allocate_next(),
            Err(IpamError::RangeFull { .. })
        ));
    }

    #[test]
    fn slash31_and_slash32() {
        let mut a = alloc("10.0.0.0/31");
        assert_eq!(a.allocate_next().unwrap(), ip("10.0.0.0"));
        assert_eq!(a.allocate_next().unwrap(), ip("10.0.0.1"));
        assert!(a.allocate_next().is_err());
        let mut a = alloc("10.0.0.7/32");
        assert_eq!(a.cidr(), net("10.0.0.7/32"));
        assert_eq!(a.allocate_next().unwrap(), ip("10.0.0.7"));
        assert_eq!(
            a.allocate_next().unwrap_err().to_string(),
            "range is full: no free address in 10.0.0.7/32 (1 of 1 allocated)"
        );
        assert!(a.release(ip("10.0.0.7")));
        assert_eq!(a.allocate_next().unwrap(), ip("10.0.0.7"));
        let mut a = alloc("fd00::/127");
        assert_eq!(a.allocate_next().unwrap(), ip("fd00::"));
        assert_eq!(a.allocate_next().unwrap(), ip("fd00::1"));
    }

    #[test]
    fn allow_first_and_last_options() {
        let both = AllocatorOptions {
            allow_first_ip: true,
            allow_last_ip: true,
        };
        let a = HostScopeAllocator::with_options(net("10.0.1.0/24"), both).unwrap();
        assert_eq!(a.usable(), 256);
        assert!(a.contains(ip("10.0.1.0")) && a.contains(ip("10.0.1.255")));

        let first = AllocatorOptions {
            allow_first_ip: true,
            allow_last_ip: false,
        };
        let mut a = HostScopeAllocator::with_options(net("10.0.1.0/24"), first).unwrap();
        assert_eq!(a.usable(), 255);
        assert!(a.contains(ip("10.0.1.0")) && !a.contains(ip("10.0.1.255")));
        assert_eq!(a.allocate_next().unwrap(), ip("10.0.1.0"));

        let last = AllocatorOptions {
            allow_first_ip: false,
            allow_last_ip: true,
        };
        let a = HostScopeAllocator::with_options(net("10.0.1.0/24"), last).unwrap();
        assert_eq!(a.usable(), 255);
        assert!(!a.contains(ip("10.0.1.0")) && a.contains(ip("10.0.1.255")));

        // Capped IPv6: "last" is the 65,536th address.
        let a = HostScopeAllocator::with_options(net("fd00::/64"), both).unwrap();
        assert_eq!(a.usable(), 65536);
        assert!(a.contains(ip("fd00::")) && a.contains(ip("fd00::ffff")));
        assert!(!a.contains(ip("fd00::1:0")));

        // Options do not matter for ranges of 1 or 2 addresses.
        let a = HostScopeAllocator::with_options(net("10.0.0.0/31"), both).unwrap();
        assert_eq!(a.usable(), 2);
        let a = HostScopeAllocator::with_options(net("10.0.0.0/32"), both).unwrap();
        assert_eq!(a.usable(), 1);
    }

    #[test]
    fn too_large_cidrs_are_refused() {
        for (s, hb) in [
            ("10.0.0.0/0", 32u8),
            ("0.0.0.0/0", 32),
            ("128.0.0.0/1", 31),
            ("::/0", 128),
            ("8000::/1", 127),
        ] {
            let err = HostScopeAllocator::new(net(s)).unwrap_err();
            assert_eq!(
                err,
                IpamError::CidrTooLarge {
                    cidr: net(s).trunc(),
                    host_bits: hb
                }
            );
        }
        assert_eq!(
            HostScopeAllocator::new(net("10.0.0.0/0"))
                .unwrap_err()
                .to_string(),
            "node CIDR 0.0.0.0/0 is too large for the host-scope allocator: 32 host bits \
             (the limit is 30 for IPv4 and 126 for IPv6)"
        );
        // The largest accepted sizes work and allocate lazily.
        let mut a = alloc("64.0.0.0/2");
        assert_eq!(a.usable(), (1 << 30) - 2);
        assert_eq!(a.allocate_next().unwrap(), ip("64.0.0.1"));
        let a = alloc("fd00::/2");
        assert_eq!(a.usable(), 65534);
    }

    #[test]
    fn cidr_is_normalised_keeping_prefix() {
        let a = alloc("10.0.1.77/24");
        assert_eq!(a.cidr(), net("10.0.1.0/24"));
        assert_eq!(a.cidr().to_string(), "10.0.1.0/24");
        let a = alloc("fd00::1234/112");
        assert_eq!(a.cidr().to_string(), "fd00::/112");
    }

    #[test]
    fn capacity_is_uncapped_cilium_style() {
        assert_eq!(alloc("10.0.1.0/24").capacity(), 254);
        assert_eq!(alloc("10.0.0.0/30").capacity(), 2);
        assert_eq!(alloc("10.0.0.0/31").capacity(), 0);
        assert_eq!(alloc("10.0.0.0/32").capacity(), 0);
        assert_eq!(alloc("fd00::/120").capacity(), 254);
        assert_eq!(alloc("fd00::/112").capacity(), 65534);
        assert_eq!(alloc("fd00::/96").capacity(), (1u64 << 32) - 2);
        assert_eq!(alloc("fd00::/64").capacity(), u64::MAX - 1);
        assert_eq!(alloc("fd00::/63").capacity(), u64::MAX);
        assert_eq!(alloc("fd00::/8").capacity(), u64::MAX);
        assert_eq!(alloc("fd00::/128").capacity(), 0);
    }

    #[test]
    fn next_fit_order_and_wrap() {
        let mut a = alloc("10.0.0.0/29"); // usable .1 ..= .6
        assert_eq!(a.allocate_next().unwrap(), ip("10.0.0.1"));
        assert_eq!(a.allocate_next().unwrap(), ip("10.0.0.2"));
        assert_eq!(a.allocate_next().unwrap(), ip("10.0.0.3"));
        // Released address is not reused immediately.
        assert!(a.release(ip("10.0.0.2")));
        assert_eq!(a.allocate_next().unwrap(), ip("10.0.0.4"));
        assert_eq!(a.allocate_next().unwrap(), ip("10.0.0.5"));
        assert_eq!(a.allocate_next().unwrap(), ip("10.0.0.6"));
        // Cursor wraps; .1 and .3 are taken, .2 is free again.
        assert_eq!(a.allocate_next().unwrap(), ip("10.0.0.2"));
        assert!(matches!(
            a.allocate_next(),
            Err(IpamError::RangeFull { .. })
        ));
        // Release two, the cursor (after .2) finds .5 before .1.
        assert!(a.release(ip("10.0.0.1")));
        assert!(a.release(ip("10.0.0.5")));
        assert_eq!(a.allocate_next().unwrap(), ip("10.0.0.5"));
        assert_eq!(a.allocate_next().unwrap(), ip("10.0.0.1"));
    }

    #[test]
    fn allocate_specific_does_not_move_cursor() {
        let mut a = alloc("10.0.0.0/24");
        a.allocate(ip("10.0.0.1")).unwrap();
        a.allocate(ip("10.0.0.100")).unwrap();
        assert_eq!(a.allocate_next().unwrap(), ip("10.0.0.2"));
    }

    #[test]
    fn full_allocation_of_slash22_has_no_duplicates() {
        let cidr = net("10.20.0.0/22");
        let mut a = HostScopeAllocator::new(cidr).unwrap();
        let mut seen = HashSet::new();
        for _ in 0..1022 {
            let got = a.allocate_next().unwrap();
            assert!(cidr.contains(&got));
            assert!(a.contains(got));
            assert_ne!(got, ip("10.20.0.0"));
            assert_ne!(got, ip("10.20.3.255"));
            assert!(seen.insert(got), "duplicate {got}");
        }
        assert_eq!(seen.len(), 1022);
        assert_eq!(a.used(), 1022);
        assert_eq!(a.free(), 0);
        let err = a.allocate_next().unwrap_err();
        assert!(err.to_string().starts_with("range is full"));
        assert_eq!(
            err.to_string(),
            "range is full: no free address in 10.20.0.0/22 (1022 of 1022 allocated)"
        );
        assert_eq!(a.iter_allocated().count(), 1022);
    }

    #[test]
    fn range_full_message_for_slash24() {
        let mut a = alloc("10.0.1.0/24");
        for _ in 0..254 {
            a.allocate_next().unwrap();
        }
        assert_eq!(
            a.allocate_next().unwrap_err().to_string(),
            "range is full: no free address in 10.0.1.0/24 (254 of 254 allocated)"
        );
    }

    #[test]
    fn release_and_reallocate_after_wrap() {
        let mut a = alloc("10.0.0.0/24");
        for _ in 0..254 {
            a.allocate_next().unwrap();
        }
        assert!(a.release(ip("10.0.0.10")));
        assert!(a.release(ip("10.0.0.200")));
        // The cursor wrapped to index 0 after .254; scan finds .10 first.
        assert_eq!(a.allocate_next().unwrap(), ip("10.0.0.10"));
        assert_eq!(a.allocate_next().unwrap(), ip("10.0.0.200"));
        assert!(a.allocate_next().is_err());
        // Once not full, a release is reused only after the cursor wraps.
        assert!(a.release(ip("10.0.0.201")));
        assert!(a.release(ip("10.0.0.100")));
        assert_eq!(a.allocate_next().unwrap(), ip("10.0.0.201"));
        assert_eq!(a.allocate_next().unwrap(), ip("10.0.0.100"));
    }

    #[test]
    fn nearly_full_slash16() {
        let mut a = alloc("10.1.0.0/16");
        for _ in 0..65534 {
            a.allocate_next().unwrap();
        }
        assert!(a.release(ip("10.1.128.7")));
        assert_eq!(a.allocate_next().unwrap(), ip("10.1.128.7"));
        assert!(a.allocate_next().is_err());
        // Allocate/release churn on a /16 stays consistent.
        let mut b = alloc("10.2.0.0/16");
        for _ in 0..200_000 {
            let x = b.allocate_next().unwrap();
            assert!(b.release(x));
        }
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn allocate_specific_errors() {
        let mut a = alloc("10.0.1.0/24");
        a.allocate(ip("10.0.1.5")).unwrap();
        let err = a.allocate(ip("10.0.1.5")).unwrap_err();
        assert_eq!(err, IpamError::AlreadyAllocated { ip: ip("10.0.1.5") });
        assert_eq!(err.to_string(), "provided IP is already allocated");
        let want = "provided IP is not in the valid range. The range of valid IPs is 10.0.1.0/24";
        for bad in ["10.0.2.1", "10.0.1.0", "10.0.1.255", "fd00::1", "0.0.0.0"] {
            assert_eq!(a.allocate(ip(bad)).unwrap_err().to_string(), want, "{bad}");
        }
        let mut a = alloc("fd00::/64");
        assert_eq!(
            a.allocate(ip("fd00::1:0")).unwrap_err().to_string(),
            "provided IP is not in the valid range. The range of valid IPs is fd00::/64"
        );
        a.allocate(ip("fd00::fffe")).unwrap();
        assert!(a.is_allocated(ip("fd00::fffe")));
    }

    #[test]
    fn release_is_noop_for_unallocated_or_out_of_range() {
        let mut a = alloc("10.0.1.0/24");
        assert!(!a.release(ip("10.0.1.9")));
        assert!(!a.release(ip("10.0.1.0")));
        assert!(!a.release(ip("10.9.9.9")));
        assert!(!a.release(ip("fd00::1")));
        a.allocate(ip("10.0.1.9")).unwrap();
        assert!(a.is_allocated(ip("10.0.1.9")));
        assert!(a.release(ip("10.0.1.9")));
        assert!(!a.release(ip("10.0.1.9")));
        assert!(!a.is_allocated(ip("10.0.1.9")));
        assert!(!a.is_allocated(ip("10.9.9.9")));
        assert_eq!(a.used(), 0);
    }

    #[test]
    fn iter_allocated_in_address_order() {
        let mut a = alloc("fd00::/112");
        for s in ["fd00::ff00", "fd00::2", "fd00::1:0", "fd00::41", "fd00::40"] {
            let _ = a.allocate(ip(s));
        }
        let got: Vec<IpAddr> = a.iter_allocated().collect();
        assert_eq!(
            got,
            vec![
                ip("fd00::2"),
                ip("fd00::40"),
                ip("fd00::41"),
                ip("fd00::ff00")
            ]
        );
    }

    #[test]
    fn set_cursor_after_restores_position() {
        let mut a = alloc("10.0.0.0/24");
        for s in ["10.0.0.1", "10.0.0.2", "10.0.0.50"] {
            a.allocate(ip(s)).unwrap();
        }
        assert!(a.set_cursor_after(ip("10.0.0.50")));
        assert_eq!(a.allocate_next().unwrap(), ip("10.0.0.51"));
        // After the last usable address the cursor wraps to the first.
        assert!(a.set_cursor_after(ip("10.0.0.254")));
        assert_eq!(a.allocate_next().unwrap(), ip("10.0.0.3"));
        assert!(!a.set_cursor_after(ip("10.0.1.1")));
        assert_eq!(a.allocate_next().unwrap(), ip("10.0.0.4"));
    }

    #[test]
    fn v6_next_fit_and_full() {
        let mut a = alloc("fd00::/120");
        assert_eq!(a.allocate_next().unwrap(), ip("fd00::1"));
        for _ in 0..253 {
            a.allocate_next().unwrap();
        }
        assert_eq!(
            a.allocate_next().unwrap_err().to_string(),
            "range is full: no free address in fd00::/120 (254 of 254 allocated)"
        );
        assert!(a.is_allocated(ip("fd00::fe")));
        let mut a = alloc("fd00:10:244::/96");
        a.set_cursor_after(ip("fd00:10:244::fffe"));
        assert_eq!(a.allocate_next().unwrap(), ip("fd00:10:244::1"));
    }
}
