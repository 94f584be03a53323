//! A pool's CIDR as the pool options and the pool resources take it: of the pool's
//! family, without host bits; the error says what is wrong and the caller names the
//! option or field it was in.

use ipnet::IpNet;

use super::Family;

/// Why a pool CIDR was refused (the caller names the field it was in).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolCidrError {
    #[error("{value:?} is not a CIDR (expected <address>/<prefix length>, e.g. {})", example_cidr(*.family))]
    NotACidr { value: String, family: Family },
    #[error("{cidr} is not an {} CIDR", .family.label())]
    WrongFamily { cidr: IpNet, family: Family },
    #[error("{cidr} has host bits set; did you mean {}?", .cidr.trunc())]
    HostBits { cidr: IpNet },
}

/// Parses a pool CIDR of `family`: `<address>/<prefix length>` without host bits.
pub fn parse_pool_cidr(s: &str, family: Family) -> Result<IpNet, PoolCidrError> {
    let net: IpNet = s.parse().map_err(|_| PoolCidrError::NotACidr {
        value: s.into(),
        family,
    })?;
    check_pool_cidr(&net, family)?;
    Ok(net)
}

/// Checks a parsed pool CIDR: of `family`, without host bits.
pub fn check_pool_cidr(net: &IpNet, family: Family) -> Result<(), PoolCidrError> {
    if Family::of_net(net) != family {
        return Err(PoolCidrError::WrongFamily { cidr: *net, family });
    }
    if net.trunc() != *net {
        return Err(PoolCidrError::HostBits { cidr: *net });
    }
    Ok(())
}

/// The example a "not a CIDR" message gives for `family`.
fn example_cidr(family: Family) -> &'static str {
    match family {
        Family::V4 => "10.0.0.0/16",
        Family::V6 => "fd00::/104",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_cidr_is_of_its_family_without_host_bits() {
        assert_eq!(
            parse_pool_cidr("10.1.0.0/16", Family::V4).map(|n| n.to_string()),
            Ok("10.1.0.0/16".to_string())
        );
        for (value, family, message) in [
            (
                "10.1.0.0",
                Family::V4,
                "\"10.1.0.0\" is not a CIDR (expected <address>/<prefix length>, e.g. 10.0.0.0/16)",
            ),
            (
                "fd00::",
                Family::V6,
                "\"fd00::\" is not a CIDR (expected <address>/<prefix length>, e.g. fd00::/104)",
            ),
            ("fd00::/104", Family::V4, "fd00::/104 is not an IPv4 CIDR"),
            (
                "10.1.0.1/16",
                Family::V4,
                "10.1.0.1/16 has host bits set; did you mean 10.1.0.0/16?",
            ),
        ] {
            let refused = parse_pool_cidr(value, family).unwrap_err();
            assert_eq!(refused.to_string(), message);
        }
    }
}
