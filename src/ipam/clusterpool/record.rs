//! The cluster pool in force, as a record the cluster can see: the operator
//! leader writes it on its Lease (`podnet.io/cluster-pool-in-force`), so a
//! restarted or newly elected leader runs on the last pool that was taken, not
//! on a ConfigMap edit that does not parse or that the running leader refused.
//! The record is a JSON object of the options' names and values as a user
//! writes them (`{"cluster-pool-ipv4-cidr": "10.0.0.0/16 10.1.0.0/16@26", ...}`),
//! read back through the options' own parser and checks.

use std::collections::BTreeMap;

use super::{
    ClusterPoolConfig, ClusterPoolError, OPT_IPV4_CIDR, OPT_IPV4_MASK_SIZE, OPT_IPV6_CIDR,
    OPT_IPV6_MASK_SIZE, PoolEntry, parse_pool_list,
};
use crate::ipam::Family;

/// The annotation of the leader Lease that holds the record.
pub const POOL_IN_FORCE_ANNOTATION: &str = "podnet.io/cluster-pool-in-force";

/// Why a record does not read back as a pool.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolRecordError {
    #[error("{POOL_IN_FORCE_ANNOTATION} is not a JSON object of option values: {0}")]
    NotJson(String),
    #[error("{POOL_IN_FORCE_ANNOTATION}: {option} {value:?} is not {expected}")]
    BadValue {
        option: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("{POOL_IN_FORCE_ANNOTATION}: {0}")]
    Pool(#[from] ClusterPoolError),
}

impl ClusterPoolConfig {
    /// The record of this pool (the module's format).
    pub fn to_record(&self) -> String {
        let list = |family: Family| {
            let entries: Vec<String> = self
                .cidrs(family)
                .iter()
                .map(|c| {
                    let entry = PoolEntry {
                        cidr: *c,
                        mask: self.node_masks.get(c).copied(),
                    };
                    entry.to_string()
                })
                .collect();
            entries.join(" ")
        };
        let record: BTreeMap<&str, String> = [
            ("enable-ipv4", self.enable_ipv4.to_string()),
            ("enable-ipv6", self.enable_ipv6.to_string()),
            (OPT_IPV4_CIDR, list(Family::V4)),
            (OPT_IPV4_MASK_SIZE, self.ipv4_mask_size.to_string()),
            (OPT_IPV6_CIDR, list(Family::V6)),
            (OPT_IPV6_MASK_SIZE, self.ipv6_mask_size.to_string()),
        ]
        .into_iter()
        .collect();
        serde_json::to_string(&record).unwrap_or_default()
    }

    /// The pool a record holds, checked as the options are at start.
    pub fn from_record(record: &str) -> Result<ClusterPoolConfig, PoolRecordError> {
        let values: BTreeMap<String, String> =
            serde_json::from_str(record).map_err(|e| PoolRecordError::NotJson(e.to_string()))?;
        let get = |option: &'static str| values.get(option).map(String::as_str).unwrap_or("");
        let flag = |option: &'static str| match get(option) {
            "true" => Ok(true),
            "false" => Ok(false),
            other => Err(PoolRecordError::BadValue {
                option,
                value: other.to_string(),
                expected: "true or false",
            }),
        };
        let mask = |option: &'static str| {
            get(option)
                .parse::<u8>()
                .map_err(|_| PoolRecordError::BadValue {
                    option,
                    value: get(option).to_string(),
                    expected: "a mask size",
                })
        };
        let mut pool = ClusterPoolConfig {
            enable_ipv4: flag("enable-ipv4")?,
            enable_ipv6: flag("enable-ipv6")?,
            ipv4_mask_size: mask(OPT_IPV4_MASK_SIZE)?,
            ipv6_mask_size: mask(OPT_IPV6_MASK_SIZE)?,
            ..ClusterPoolConfig::default()
        };
        let v4 = parse_pool_list(OPT_IPV4_CIDR, get(OPT_IPV4_CIDR))?;
        let v6 = parse_pool_list(OPT_IPV6_CIDR, get(OPT_IPV6_CIDR))?;
        pool.set_pool(Family::V4, &v4);
        pool.set_pool(Family::V6, &v6);
        pool.validate()?;
        Ok(pool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(v4: &str, v6: &str) -> ClusterPoolConfig {
        let mut p = ClusterPoolConfig {
            enable_ipv6: !v6.is_empty(),
            ipv4_mask_size: 24,
            ipv6_mask_size: 120,
            ..ClusterPoolConfig::default()
        };
        p.set_pool(Family::V4, &parse_pool_list(OPT_IPV4_CIDR, v4).unwrap());
        p.set_pool(Family::V6, &parse_pool_list(OPT_IPV6_CIDR, v6).unwrap());
        p
    }

    #[test]
    fn a_pool_reads_back_as_written() {
        for p in [
            pool("10.0.0.0/16", ""),
            pool("10.0.0.0/16 10.1.0.0/16@26", "fd00::/104 fd01::/104@112"),
        ] {
            let record = p.to_record();
            assert_eq!(ClusterPoolConfig::from_record(&record), Ok(p));
        }
        assert_eq!(
            pool("10.0.0.0/16 10.1.0.0/16@26", "").to_record(),
            "{\"cluster-pool-ipv4-cidr\":\"10.0.0.0/16 10.1.0.0/16@26\",\
             \"cluster-pool-ipv4-mask-size\":\"24\",\"cluster-pool-ipv6-cidr\":\"\",\
             \"cluster-pool-ipv6-mask-size\":\"120\",\"enable-ipv4\":\"true\",\
             \"enable-ipv6\":\"false\"}"
        );
    }

    #[test]
    fn a_bad_record_says_what_is_wrong() {
        let good = pool("10.0.0.0/16", "").to_record();
        assert!(matches!(
            ClusterPoolConfig::from_record("banana"),
            Err(PoolRecordError::NotJson(_))
        ));
        let edited = good.replace("\"24\"", "\"x\"");
        assert_eq!(
            ClusterPoolConfig::from_record(&edited)
                .unwrap_err()
                .to_string(),
            "podnet.io/cluster-pool-in-force: cluster-pool-ipv4-mask-size \"x\" is not a mask size"
        );
        let edited = good.replace("10.0.0.0/16", "10.0.0.0/16@x");
        assert!(
            ClusterPoolConfig::from_record(&edited)
                .unwrap_err()
                .to_string()
                .contains("the node mask size after @ must be a number")
        );
        let edited = good.replace("\"true\"", "\"yes\"");
        assert!(matches!(
            ClusterPoolConfig::from_record(&edited),
            Err(PoolRecordError::BadValue {
                option: "enable-ipv4",
                ..
            })
        ));
    }
}
