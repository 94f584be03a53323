//! Addresses as numbers, for range arithmetic: an IPv4 or IPv6 address to its
//! integer ([`to_number`]) and back ([`from_number`]), and a CIDR's first and
//! last address as numbers ([`span`]). Pure; every range and block computation
//! of `ipam` and the operator goes through these.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

use super::Family;

/// The address as an integer: an IPv4 address in the low 32 bits.
pub fn to_number(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// The address of `family` numbered `n`; an IPv4 number past the last address
/// (`n > u32::MAX`) saturates to `255.255.255.255`.
pub fn from_number(family: Family, n: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(u32::try_from(n).unwrap_or(u32::MAX))),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(n)),
    }
}

/// The first (network) and last (broadcast) address of `cidr`, as numbers.
pub fn span(cidr: &IpNet) -> (u128, u128) {
    (to_number(cidr.network()), to_number(cidr.broadcast()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn v4_numbers_round_trip_at_the_edges() {
        for (text, n) in [
            ("0.0.0.0", 0u128),
            ("0.0.0.1", 1),
            ("10.0.1.0", 0x0a00_0100),
            ("255.255.255.254", u128::from(u32::MAX) - 1),
            ("255.255.255.255", u128::from(u32::MAX)),
        ] {
            assert_eq!(to_number(ip(text)), n, "{text}");
            assert_eq!(from_number(Family::V4, n), ip(text), "{text}");
        }
    }

    #[test]
    fn v6_numbers_round_trip_at_the_edges() {
        for (text, n) in [
            ("::", 0u128),
            ("::1", 1),
            ("::ffff:ffff", u128::from(u32::MAX)),
            ("::1:0:0", 1 << 32),
            ("fd00::1", (0xfd00u128 << 112) | 1),
            ("ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe", u128::MAX - 1),
            ("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", u128::MAX),
        ] {
            assert_eq!(to_number(ip(text)), n, "{text}");
            assert_eq!(from_number(Family::V6, n), ip(text), "{text}");
        }
    }

    #[test]
    fn a_v4_number_past_the_last_address_saturates() {
        let last = ip("255.255.255.255");
        assert_eq!(from_number(Family::V4, u128::from(u32::MAX) + 1), last);
        assert_eq!(from_number(Family::V4, u128::MAX), last);
    }

    #[test]
    fn families_keep_apart_for_the_same_number() {
        assert_eq!(from_number(Family::V4, 1), ip("0.0.0.1"));
        assert_eq!(from_number(Family::V6, 1), ip("::1"));
        // An IPv4 address and its IPv4-mapped IPv6 form are different numbers.
        assert_ne!(to_number(ip("10.0.0.1")), to_number(ip("::ffff:10.0.0.1")));
    }

    #[test]
    fn span_is_the_first_and_last_address_of_the_cidr() {
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        assert_eq!(span(&net("10.0.1.0/24")), (0x0a00_0100, 0x0a00_01ff));
        assert_eq!(span(&net("10.0.1.7/24")), (0x0a00_0100, 0x0a00_01ff));
        assert_eq!(span(&net("10.0.0.5/32")), (0x0a00_0005, 0x0a00_0005));
        assert_eq!(span(&net("0.0.0.0/0")), (0, u128::from(u32::MAX)));
        assert_eq!(span(&net("::/0")), (0, u128::MAX));
        assert_eq!(
            span(&net("fd00::/120")),
            (0xfd00u128 << 112, (0xfd00u128 << 112) | 0xff)
        );
    }
}
