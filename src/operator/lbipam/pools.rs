//! LB IPAM's pools, pure: a `CiliumLoadBalancerIPPool` checked and turned into
//! inclusive address ranges ([`Pool::from_resource`]), which addresses a pool may
//! hand out (`allowFirstLastIPs: "No"` keeps the first and last address of every
//! `cidr` block), the lowest free address of a family, the totals of its status,
//! and which pools conflict: a pool whose block overlaps a block of an earlier
//! pool (by creation, then name) is Conflicting and allocates nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use crate::ipam::Family;
use crate::ipam::ip_number::{from_number, span, to_number};
use crate::ipam::pooldef::check_selector;
use crate::ipam::selection::selector_matches;
use crate::resources::{CiliumLoadBalancerIPPool, LB_IP_POOL_KIND, LabelSelector};

/// One block: an inclusive range of one family, and the range it may hand out
/// (without the first and last address of a `cidr` block of a pool with
/// `allowFirstLastIPs: "No"`; empty when nothing is left).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub family: Family,
    first: u128,
    last: u128,
    usable: Option<(u128, u128)>,
    /// How messages name it: `10.0.10.0/24` or `10.0.20.100-10.0.20.200`.
    pub text: String,
}

impl Block {
    fn contains(&self, ip: &IpAddr) -> bool {
        let n = to_number(*ip);
        Family::of_addr(ip) == self.family && self.first <= n && n <= self.last
    }

    fn usable(&self, ip: &IpAddr) -> bool {
        let n = to_number(*ip);
        Family::of_addr(ip) == self.family && self.usable.is_some_and(|(a, b)| a <= n && n <= b)
    }

    fn size(&self) -> u128 {
        self.usable
            .map(|(a, b)| (b - a).saturating_add(1))
            .unwrap_or(0)
    }

    fn overlaps(&self, other: &Block) -> bool {
        self.family == other.family && self.first <= other.last && other.first <= self.last
    }
}

/// A pool, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Pool {
    pub name: String,
    /// `metadata.creationTimestamp` (RFC 3339, so it sorts as text).
    pub created: String,
    pub blocks: Vec<Block>,
    pub selector: Option<LabelSelector>,
    pub allow_first_last: bool,
    pub disabled: bool,
}

/// Why a pool object cannot be used; names the field and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidPool {
    pub pool: String,
    pub problem: String,
}

impl fmt::Display for InvalidPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{LB_IP_POOL_KIND} \"{}\": {}", self.pool, self.problem)
    }
}

impl Pool {
    /// Checks `obj` and builds its blocks: each item of `spec.blocks` is a `cidr`
    /// or a `start` with an optional `stop` of the same family, not below it.
    pub fn from_resource(obj: &CiliumLoadBalancerIPPool) -> Result<Pool, InvalidPool> {
        let name = obj.metadata.name.clone();
        let invalid = |problem: String| InvalidPool {
            pool: name.clone(),
            problem,
        };
        let allow_first_last = match obj.spec.allow_first_last_ips.as_deref() {
            None | Some("Yes") => true,
            Some("No") => false,
            Some(other) => {
                return Err(invalid(format!(
                    "spec.allowFirstLastIPs is {other:?}; write \"Yes\" or \"No\""
                )));
            }
        };
        if let Some(sel) = &obj.spec.service_selector {
            check_selector(sel, "spec.serviceSelector").map_err(|e| invalid(e.to_string()))?;
        }
        let mut blocks = Vec::new();
        for (i, b) in obj.spec.blocks.iter().enumerate() {
            let at = format!("spec.blocks[{i}]");
            let block = match (b.cidr, b.start, b.stop) {
                (Some(cidr), None, None) => {
                    let cidr = cidr.trunc();
                    let (first, last) = span(&cidr);
                    let usable = if allow_first_last || last - first < 2 {
                        Some((first, last))
                    } else {
                        Some((first + 1, last - 1))
                    };
                    Block {
                        family: Family::of_addr(&cidr.addr()),
                        first,
                        last,
                        usable,
                        text: cidr.to_string(),
                    }
                }
                (Some(_), _, _) => {
                    return Err(invalid(format!(
                        "{at} has both cidr and start/stop; write one block per list item"
                    )));
                }
                (None, Some(start), stop) => {
                    let stop = stop.unwrap_or(start);
                    if Family::of_addr(&start) != Family::of_addr(&stop) {
                        return Err(invalid(format!(
                            "{at}: start {start} and stop {stop} are of different families"
                        )));
                    }
                    let (first, last) = (to_number(start), to_number(stop));
                    if last < first {
                        return Err(invalid(format!(
                            "{at}: stop {stop} is below start {start}; swap them"
                        )));
                    }
                    Block {
                        family: Family::of_addr(&start),
                        first,
                        last,
                        usable: Some((first, last)),
                        text: if first == last {
                            start.to_string()
                        } else {
                            format!("{start}-{stop}")
                        },
                    }
                }
                (None, None, Some(_)) => {
                    return Err(invalid(format!("{at} has a stop but no start")));
                }
                (None, None, None) => {
                    return Err(invalid(format!("{at} is empty: give a cidr or a start")));
                }
            };
            blocks.push(block);
        }
        let created = obj
            .metadata
            .extra
            .get("creationTimestamp")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string();
        Ok(Pool {
            name,
            created,
            blocks,
            selector: obj.spec.service_selector.clone(),
            allow_first_last,
            disabled: obj.spec.disabled,
        })
    }

    /// Whether `ip` is inside one of the pool's blocks (handed out or not).
    pub fn contains(&self, ip: &IpAddr) -> bool {
        self.blocks.iter().any(|b| b.contains(ip))
    }

    /// Whether the pool may hand `ip` out.
    pub fn usable(&self, ip: &IpAddr) -> bool {
        self.blocks.iter().any(|b| b.usable(ip))
    }

    /// Whether the pool has a block of `family`.
    pub fn has_family(&self, family: Family) -> bool {
        self.blocks.iter().any(|b| b.family == family)
    }

    /// Whether the pool's `serviceSelector` selects a Service with these labels
    /// (the synthetic ones included); no selector selects every Service.
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        self.selector
            .as_ref()
            .is_none_or(|s| selector_matches(s, labels))
    }

    /// How many addresses the pool may hand out.
    pub fn total(&self) -> u128 {
        self.blocks
            .iter()
            .fold(0u128, |n, b| n.saturating_add(b.size()))
    }

    /// The lowest address of `family` the pool may hand out that is not in `used`.
    pub fn first_free(&self, family: Family, used: &BTreeSet<IpAddr>) -> Option<IpAddr> {
        for b in self.blocks.iter().filter(|b| b.family == family) {
            let Some((a, z)) = b.usable else { continue };
            let mut candidate = a;
            let lo = from_number(family, a);
            let hi = from_number(family, z);
            for taken in used.range(lo..=hi) {
                if to_number(*taken) != candidate {
                    break;
                }
                if candidate == z {
                    candidate = z + 1;
                    break;
                }
                candidate += 1;
            }
            if candidate <= z {
                return Some(from_number(family, candidate));
            }
        }
        None
    }
}

/// Sorts pools as conflicts are decided: by creation, then by name.
pub fn sort_pools(pools: &mut [Pool]) {
    pools.sort_by(|a, b| (&a.created, &a.name).cmp(&(&b.created, &b.name)));
}

/// The conflicting pools of `pools` (sorted by [`sort_pools`]), each with the
/// message of its `cilium.io/PoolConflict` condition: a pool is Conflicting when a
/// block overlaps a block of an earlier pool that is not itself Conflicting.
pub fn conflicts(pools: &[Pool]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut kept: Vec<&Pool> = Vec::new();
    for p in pools {
        let clash = kept.iter().find_map(|earlier| {
            p.blocks.iter().find_map(|b| {
                earlier
                    .blocks
                    .iter()
                    .find(|e| b.overlaps(e))
                    .map(|e| (b, e, earlier))
            })
        });
        match clash {
            Some((mine, theirs, earlier)) => {
                out.insert(
                    p.name.clone(),
                    format!(
                        "Pool conflicts since CIDR '{}' overlaps CIDR '{}' from IP Pool '{}'",
                        mine.text, theirs.text, earlier.name
                    ),
                );
            }
            None => kept.push(p),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::decode;

    fn pool(name: &str, created: &str, spec: serde_json::Value) -> Pool {
        let v = serde_json::json!({
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": spec,
        });
        Pool::from_resource(&decode::<CiliumLoadBalancerIPPool>(&v).unwrap()).unwrap()
    }

    fn invalid(spec: serde_json::Value) -> String {
        let v = serde_json::json!({"metadata": {"name": "p"}, "spec": spec});
        Pool::from_resource(&decode::<CiliumLoadBalancerIPPool>(&v).unwrap())
            .unwrap_err()
            .to_string()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn cidr_and_range_blocks_with_first_and_last() {
        let spec = serde_json::json!({"blocks": [
            {"cidr": "10.0.10.0/30"},
            {"start": "10.0.20.100", "stop": "10.0.20.102"},
            {"start": "10.0.30.7"},
            {"cidr": "10.0.40.0/31"},
            {"cidr": "10.0.50.1/32"},
        ]});
        let yes = pool("a", "", spec.clone());
        assert!(yes.allow_first_last);
        assert_eq!(yes.total(), 4 + 3 + 1 + 2 + 1);
        assert!(yes.usable(&ip("10.0.10.0")) && yes.usable(&ip("10.0.10.3")));
        let mut no_spec = spec;
        no_spec["allowFirstLastIPs"] = "No".into();
        let no = pool("b", "", no_spec);
        // The /30 loses its network and broadcast; ranges, /31 and /32 keep all.
        assert_eq!(no.total(), 2 + 3 + 1 + 2 + 1);
        assert!(!no.usable(&ip("10.0.10.0")) && !no.usable(&ip("10.0.10.3")));
        assert!(no.contains(&ip("10.0.10.0")));
        assert!(no.usable(&ip("10.0.10.1")) && no.usable(&ip("10.0.20.100")));
        assert!(no.usable(&ip("10.0.40.0")) && no.usable(&ip("10.0.50.1")));
        assert!(!no.contains(&ip("10.0.20.103")));
        assert_eq!(no.blocks[1].text, "10.0.20.100-10.0.20.102");
        assert_eq!(no.blocks[2].text, "10.0.30.7");
        // A cidr with host bits is read as its network.
        let h = pool(
            "h",
            "",
            serde_json::json!({"blocks": [{"cidr": "10.1.0.5/24"}]}),
        );
        assert_eq!(h.blocks[0].text, "10.1.0.0/24");
    }

    #[test]
    fn first_free_skips_used_and_reserved_addresses() {
        let p = pool(
            "a",
            "",
            serde_json::json!({"allowFirstLastIPs": "No", "blocks": [
                {"cidr": "10.0.10.0/30"}, {"start": "10.0.20.1", "stop": "10.0.20.2"},
                {"cidr": "fd00::/126"},
            ]}),
        );
        let mut used = BTreeSet::new();
        let mut got = Vec::new();
        while let Some(a) = p.first_free(Family::V4, &used) {
            got.push(a.to_string());
            used.insert(a);
        }
        assert_eq!(got, ["10.0.10.1", "10.0.10.2", "10.0.20.1", "10.0.20.2"]);
        used.remove(&ip("10.0.10.2"));
        assert_eq!(p.first_free(Family::V4, &used), Some(ip("10.0.10.2")));
        assert_eq!(p.first_free(Family::V6, &used), Some(ip("fd00::1")));
        used.insert(ip("10.0.10.2"));
        assert_eq!(p.first_free(Family::V4, &used), None);
        assert!(p.has_family(Family::V6));
        // Used addresses outside the pool do not matter; the top of the range is found.
        let r = pool(
            "r",
            "",
            serde_json::json!({"blocks": [{"start": "255.255.255.254", "stop": "255.255.255.255"}]}),
        );
        let used: BTreeSet<IpAddr> = [ip("255.255.255.254"), ip("9.9.9.9")].into();
        assert_eq!(r.first_free(Family::V4, &used), Some(ip("255.255.255.255")));
        let used: BTreeSet<IpAddr> = [ip("255.255.255.254"), ip("255.255.255.255")].into();
        assert_eq!(r.first_free(Family::V4, &used), None);
    }

    #[test]
    fn a_huge_ipv6_pool_counts_without_overflow() {
        let p = pool(
            "v6",
            "",
            serde_json::json!({"blocks": [{"cidr": "::/0"}, {"cidr": "fd00::/64"}]}),
        );
        assert_eq!(p.total(), u128::MAX);
    }

    #[test]
    fn bad_pools_say_what_to_fix() {
        let e = invalid(serde_json::json!({"allowFirstLastIPs": "no"}));
        assert_eq!(
            e,
            "CiliumLoadBalancerIPPool \"p\": spec.allowFirstLastIPs is \"no\"; write \"Yes\" or \"No\""
        );
        let e =
            invalid(serde_json::json!({"blocks": [{"cidr": "10.0.0.0/24", "start": "10.0.0.1"}]}));
        assert!(
            e.contains("spec.blocks[0] has both cidr and start/stop"),
            "{e}"
        );
        let e = invalid(
            serde_json::json!({"blocks": [{"cidr": "10.0.0.0/24"}, {"start": "10.0.0.9", "stop": "10.0.0.1"}]}),
        );
        assert!(
            e.contains("spec.blocks[1]: stop 10.0.0.1 is below start 10.0.0.9"),
            "{e}"
        );
        let e = invalid(serde_json::json!({"blocks": [{"start": "10.0.0.1", "stop": "fd00::1"}]}));
        assert!(e.contains("different families"), "{e}");
        let e = invalid(serde_json::json!({"blocks": [{"stop": "10.0.0.1"}]}));
        assert!(e.contains("has a stop but no start"), "{e}");
        let e = invalid(serde_json::json!({"blocks": [{}]}));
        assert!(e.contains("spec.blocks[0] is empty"), "{e}");
        let e = invalid(
            serde_json::json!({"serviceSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}),
        );
        assert!(
            e.contains("spec.serviceSelector.matchExpressions[0]"),
            "{e}"
        );
    }

    #[test]
    fn the_later_overlapping_pool_conflicts() {
        let mut pools = vec![
            pool(
                "late",
                "2026-01-02T00:00:00Z",
                serde_json::json!({"blocks": [{"start": "10.0.0.5", "stop": "10.0.0.9"}]}),
            ),
            pool(
                "early",
                "2026-01-01T00:00:00Z",
                serde_json::json!({"blocks": [{"cidr": "10.0.0.0/29"}]}),
            ),
            pool(
                "v6",
                "2026-01-01T00:00:00Z",
                serde_json::json!({"blocks": [{"cidr": "::a00:0/125"}]}),
            ),
            // Overlaps only "late", which conflicts itself: kept.
            pool(
                "later",
                "2026-01-03T00:00:00Z",
                serde_json::json!({"blocks": [{"cidr": "10.0.0.8/30"}]}),
            ),
            pool(
                "same-time-b",
                "2026-01-04T00:00:00Z",
                serde_json::json!({"blocks": [{"cidr": "10.9.0.0/24"}]}),
            ),
            pool(
                "same-time-a",
                "2026-01-04T00:00:00Z",
                serde_json::json!({"blocks": [{"cidr": "10.9.0.128/25"}]}),
            ),
        ];
        sort_pools(&mut pools);
        let c = conflicts(&pools);
        assert_eq!(c.keys().collect::<Vec<_>>(), ["late", "same-time-b"]);
        assert_eq!(
            c["late"],
            "Pool conflicts since CIDR '10.0.0.5-10.0.0.9' overlaps CIDR '10.0.0.0/29' from IP Pool 'early'"
        );
        assert!(c["same-time-b"].contains("from IP Pool 'same-time-a'"));
    }

    #[test]
    fn selectors_with_and_without_labels() {
        let p = pool(
            "s",
            "",
            serde_json::json!({"serviceSelector": {"matchLabels": {"color": "blue"}}}),
        );
        let blue: BTreeMap<String, String> = [("color".to_string(), "blue".to_string())].into();
        assert!(p.selects(&blue));
        assert!(!p.selects(&BTreeMap::new()));
        assert!(pool("all", "", serde_json::json!({})).selects(&BTreeMap::new()));
    }
}
