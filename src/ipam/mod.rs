//! Owns podnet's pure IPAM logic (no I/O): the IP family type, the node-side
//! host-scope address allocator ([`hostscope`]), addresses as numbers for range
//! arithmetic ([`ip_number`]), the operator-side node-CIDR
//! allocator ([`cidrset`]) and the cluster-pool options and per-node carving
//! ([`clusterpool`]), the agent's verdict on its cluster-pool CIDRs
//! ([`cidr_depletion`]) and the fill of a node range ([`range_fill`]). Semantics follow Cilium 1.20 (`pkg/ipam/hostscope.go`,
//! `pkg/ipam/service/ipallocator`, `pkg/ipam/cidrset`,
//! `operator/pkg/ipam/allocator/clusterpool`).

pub mod address_request;
mod bitmap;
pub mod cidr_depletion;
pub mod cidrset;
pub mod clusterpool;
pub mod duplicates;
pub mod eni;
pub mod exhaustion;
pub mod failure_reason;
pub mod hostscope;
pub mod ip_number;
pub mod leaks;
pub mod multipool;
pub mod node_config;
pub mod pool_cidr;
pub mod pool_operator;
pub mod pool_options;
pub mod pooldef;
pub mod range_fill;
pub mod selection;
pub mod sizing;
pub mod sticky;

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

pub use cidrset::{CidrSet, CidrSetError};
pub use clusterpool::{ClusterPoolConfig, ClusterPoolError, NodeCidrCarver, parse_cidr_list};
pub use hostscope::{AllocatorOptions, HostScopeAllocator};

/// An IP address family, spelled as Cilium spells it on the wire
/// (`"ipv4"` / `"ipv6"`, case-sensitive).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Family {
    #[serde(rename = "ipv4")]
    V4,
    #[serde(rename = "ipv6")]
    V6,
}

impl Family {
    /// `"ipv4"` or `"ipv6"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        }
    }

    /// The other family.
    pub fn other(self) -> Family {
        match self {
            Family::V4 => Family::V6,
            Family::V6 => Family::V4,
        }
    }

    /// Human label used in error messages: `"IPv4"` or `"IPv6"`.
    pub fn label(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }

    /// Parses exactly `"ipv4"` or `"ipv6"` (case-sensitive, like Cilium).
    pub fn parse(s: &str) -> Result<Family, IpamError> {
        match s {
            "ipv4" => Ok(Family::V4),
            "ipv6" => Ok(Family::V6),
            other => Err(IpamError::UnknownFamily(other.to_string())),
        }
    }

    /// Family of an address.
    pub fn of_addr(ip: &IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// Family of a prefix.
    pub fn of_net(net: &IpNet) -> Family {
        match net {
            IpNet::V4(_) => Family::V4,
            IpNet::V6(_) => Family::V6,
        }
    }

    /// Address width in bits: 32 or 128.
    pub fn bits(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Family {
    type Err = IpamError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Family::parse(s)
    }
}

/// Errors of the host-scope allocator and of [`Family::parse`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpamError {
    /// The CIDR leaves no allocatable range (≥ 31 host bits for IPv4, ≥ 127
    /// for IPv6; Cilium's `RangeSize` is 0 there).
    #[error(
        "node CIDR {cidr} is too large for the host-scope allocator: {host_bits} host bits \
         (the limit is 30 for IPv4 and 126 for IPv6)"
    )]
    CidrTooLarge { cidr: IpNet, host_bits: u8 },

    /// Every usable address is allocated. Display starts with Cilium's
    /// `range is full`.
    #[error("range is full: no free address in {cidr} ({used} of {usable} allocated)")]
    RangeFull { cidr: IpNet, used: u64, usable: u64 },

    /// The IP is not in the usable range (wrong family, outside the CIDR, or
    /// an excluded first/last address). Cilium's exact text.
    #[error("provided IP is not in the valid range. The range of valid IPs is {cidr}")]
    NotInRange { ip: IpAddr, cidr: IpNet },

    /// The IP is already allocated. Cilium's exact text.
    #[error("provided IP is already allocated")]
    AlreadyAllocated { ip: IpAddr },

    /// [`Family::parse`] got something other than `ipv4` / `ipv6`.
    #[error("unknown IP family {0:?}: expected \"ipv4\" or \"ipv6\"")]
    UnknownFamily(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn family_strings() {
        assert_eq!(Family::V4.as_str(), "ipv4");
        assert_eq!(Family::V6.as_str(), "ipv6");
        assert_eq!(Family::parse("ipv4"), Ok(Family::V4));
        assert_eq!(Family::parse("ipv6"), Ok(Family::V6));
        assert_eq!("ipv6".parse::<Family>(), Ok(Family::V6));
        for bad in ["IPv4", "IPV6", "v4", "4", "", " ipv4"] {
            assert_eq!(
                Family::parse(bad),
                Err(IpamError::UnknownFamily(bad.to_string()))
            );
        }
        assert_eq!(
            Family::parse("IPv4").unwrap_err().to_string(),
            "unknown IP family \"IPv4\": expected \"ipv4\" or \"ipv6\""
        );
        assert_eq!(Family::V6.to_string(), "ipv6");
        assert_eq!(Family::V4.label(), "IPv4");
        assert_eq!(Family::V4.bits(), 32);
        assert_eq!(Family::V6.bits(), 128);
    }

    #[test]
    fn family_of() {
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        let v6: IpAddr = "fd00::1".parse().unwrap();
        assert_eq!(Family::of_addr(&v4), Family::V4);
        assert_eq!(Family::of_addr(&v6), Family::V6);
        assert_eq!(Family::of_net(&"fd00::/64".parse().unwrap()), Family::V6);
        assert_eq!(Family::of_net(&"10.0.0.0/8".parse().unwrap()), Family::V4);
    }
}
