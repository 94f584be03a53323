//! The cluster-pool CIDR options' value (`cluster-pool-ipv4-cidr`,
//! `cluster-pool-ipv6-cidr`) with podnet's one addition to Cilium's plain list:
//! an entry may carry its own node mask size after `@` (`10.1.0.0/16@26`), and
//! the node ranges carved from that CIDR have that size whatever the family's
//! `cluster-pool-ipvX-mask-size` says. A plain list means what it means to
//! Cilium. `@` is in no CIDR or address of either family (IPv6 has `:`), so an
//! entry splits at it without doubt: `fd00:1::/96@112`.

use std::fmt;

use ipnet::IpNet;

use super::{ClusterPoolError, list_entries, parse_cidr_entry};
use crate::ipam::cidrset::node_mask_range;

/// One entry of a pool CIDR list: the CIDR, and its own node mask size if it
/// has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolEntry {
    pub cidr: IpNet,
    pub mask: Option<u8>,
}

impl fmt::Display for PoolEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.mask {
            Some(mask) => write!(f, "{}@{mask}", self.cidr),
            None => write!(f, "{}", self.cidr),
        }
    }
}

/// Parses a pool CIDR list option value: entries `<cidr>` or `<cidr>@<mask>`
/// separated by whitespace and/or commas (an empty value is an empty list), the
/// family expected from the option's name as for
/// [`parse_cidr_list`](super::parse_cidr_list). Every error names the option and
/// the entry.
pub fn parse_pool_list(option: &str, value: &str) -> Result<Vec<PoolEntry>, ClusterPoolError> {
    list_entries(value)
        .map(|entry| parse_entry(option, entry))
        .collect()
}

/// [`parse_pool_list`] for options another process judges (the operator's, read
/// by an agent): the entries that parse, and the first error of those that do not.
pub fn parse_pool_list_lenient(
    option: &str,
    value: &str,
) -> (Vec<PoolEntry>, Option<ClusterPoolError>) {
    let mut first_error = None;
    let entries = list_entries(value)
        .filter_map(|entry| {
            parse_entry(option, entry)
                .map_err(|e| first_error.get_or_insert(e).clone())
                .ok()
        })
        .collect();
    (entries, first_error)
}

fn parse_entry(option: &str, entry: &str) -> Result<PoolEntry, ClusterPoolError> {
    let Some((cidr, mask)) = entry.split_once('@') else {
        let cidr = parse_cidr_entry(option, entry, entry)?;
        return Ok(PoolEntry { cidr, mask: None });
    };
    let cidr = parse_cidr_entry(option, entry, cidr)?;
    let mask: u32 = mask
        .strip_prefix('/')
        .unwrap_or(mask)
        .parse()
        .map_err(|_| ClusterPoolError::InvalidNodeMask {
            option: option.to_string(),
            entry: entry.to_string(),
        })?;
    let (shortest, longest) = node_mask_range(cidr);
    let fits = u8::try_from(mask)
        .ok()
        .filter(|m| (shortest..=longest).contains(m));
    let Some(mask) = fits else {
        return Err(ClusterPoolError::NodeMaskMisfit {
            option: option.to_string(),
            entry: entry.to_string(),
            mask,
            cidr,
            shortest,
            longest,
        });
    };
    Ok(PoolEntry {
        cidr,
        mask: Some(mask),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::clusterpool::{OPT_IPV4_CIDR, OPT_IPV6_CIDR};

    fn entry(cidr: &str, mask: Option<u8>) -> PoolEntry {
        PoolEntry {
            cidr: cidr.parse().unwrap(),
            mask,
        }
    }

    fn error(option: &str, value: &str) -> String {
        parse_pool_list(option, value).unwrap_err().to_string()
    }

    #[test]
    fn a_plain_list_means_what_it_means_to_cilium() {
        assert_eq!(
            parse_pool_list(OPT_IPV4_CIDR, "10.0.0.0/16 10.1.0.0/16,10.2.0.0/16").unwrap(),
            vec![
                entry("10.0.0.0/16", None),
                entry("10.1.0.0/16", None),
                entry("10.2.0.0/16", None)
            ]
        );
        assert_eq!(parse_pool_list(OPT_IPV4_CIDR, " , ").unwrap(), vec![]);
    }

    #[test]
    fn an_entry_carries_its_own_mask_after_the_at_sign() {
        assert_eq!(
            parse_pool_list(OPT_IPV4_CIDR, "10.0.0.0/16,10.1.0.0/16@26 10.2.0.0/16@/28").unwrap(),
            vec![
                entry("10.0.0.0/16", None),
                entry("10.1.0.0/16", Some(26)),
                entry("10.2.0.0/16", Some(28))
            ]
        );
        assert_eq!(
            parse_pool_list(OPT_IPV6_CIDR, "fd00:1::/96@112").unwrap(),
            vec![entry("fd00:1::/96", Some(112))]
        );
        // The CIDR's own prefix length and the family's width are both sizes.
        assert_eq!(
            parse_pool_list(OPT_IPV4_CIDR, "10.3.0.0/24@24 10.4.0.0/24@32").unwrap(),
            vec![
                entry("10.3.0.0/24", Some(24)),
                entry("10.4.0.0/24", Some(32))
            ]
        );
    }

    #[test]
    fn it_reads_back_as_written() {
        let value = "10.0.0.0/16 10.1.0.0/16@26";
        let parsed = parse_pool_list(OPT_IPV4_CIDR, value).unwrap();
        let written: Vec<String> = parsed.iter().map(ToString::to_string).collect();
        assert_eq!(written.join(" "), value);
    }

    #[test]
    fn a_malformed_entry_is_named_with_its_option() {
        assert_eq!(
            error(OPT_IPV4_CIDR, "10.0.0.0/16 10.1.0.0/16@big"),
            "invalid cluster-pool-ipv4-cidr entry \"10.1.0.0/16@big\": the node mask size \
             after @ must be a number (e.g. 10.1.0.0/16@26)"
        );
        assert_eq!(
            error(OPT_IPV4_CIDR, "10.1.0.0/16@"),
            "invalid cluster-pool-ipv4-cidr entry \"10.1.0.0/16@\": the node mask size \
             after @ must be a number (e.g. 10.1.0.0/16@26)"
        );
        assert_eq!(
            error(OPT_IPV4_CIDR, "10.1.0.0@26"),
            "invalid cluster-pool-ipv4-cidr entry \"10.1.0.0@26\": not a valid CIDR (expected \
             <address>/<prefix length>, e.g. 10.0.0.0/8)"
        );
        assert_eq!(
            error(OPT_IPV4_CIDR, "10.1.0.0/16@26@27"),
            "invalid cluster-pool-ipv4-cidr entry \"10.1.0.0/16@26@27\": the node mask size \
             after @ must be a number (e.g. 10.1.0.0/16@26)"
        );
        assert_eq!(
            error(OPT_IPV6_CIDR, "10.1.0.0/16@26"),
            "cluster-pool-ipv6-cidr: 10.1.0.0/16@26 is not an IPv6 CIDR"
        );
        assert_eq!(
            error(OPT_IPV4_CIDR, "10.1.0.1/16@26"),
            "cluster-pool-ipv4-cidr: 10.1.0.1/16@26 has host bits set; did you mean 10.1.0.0/16?"
        );
    }

    #[test]
    fn a_mask_that_does_not_fit_its_cidr_is_named_with_the_sizes_that_do() {
        // Larger than the CIDR.
        assert_eq!(
            error(OPT_IPV4_CIDR, "10.1.0.0/16@12"),
            "invalid cluster-pool-ipv4-cidr entry \"10.1.0.0/16@12\": node mask size /12 must \
             be /16 to /32 for 10.1.0.0/16"
        );
        // Longer than the family.
        assert_eq!(
            error(OPT_IPV4_CIDR, "10.1.0.0/16@33"),
            "invalid cluster-pool-ipv4-cidr entry \"10.1.0.0/16@33\": node mask size /33 must \
             be /16 to /32 for 10.1.0.0/16"
        );
        // More node ranges than a cidrset takes.
        assert_eq!(
            error(OPT_IPV6_CIDR, "fd00::/96@120"),
            "invalid cluster-pool-ipv6-cidr entry \"fd00::/96@120\": node mask size /120 must \
             be /96 to /112 for fd00::/96"
        );
        assert_eq!(
            error(OPT_IPV4_CIDR, "10.0.0.0/8@300"),
            "invalid cluster-pool-ipv4-cidr entry \"10.0.0.0/8@300\": node mask size /300 must \
             be /8 to /32 for 10.0.0.0/8"
        );
    }
}
