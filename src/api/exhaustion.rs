//! The exhaustion rule (`ipam::exhaustion`) on a status answer as a client
//! reads it: CNI STATUS (`plugin::status`) asks the daemon for its status and
//! says why new pods cannot get an address.

use super::models::StatusResponse;
use crate::ipam::exhaustion::{self, NodeRanges};
use crate::ipam::range_fill::RangeFill;

/// Why new pods on the node of `status` cannot get an address; `None` when
/// they can ([`exhaustion::exhaustion`]). A range of a family this build does
/// not know is left out.
pub fn exhaustion(status: &StatusResponse) -> Option<String> {
    let ranges: Vec<RangeFill> = status
        .ipam
        .ranges
        .iter()
        .filter_map(|r| {
            Some(RangeFill {
                family: r.family.parse().ok()?,
                cidr: r.cidr.clone(),
                used: r.used,
                usable: r.usable,
                cooling: r.cooling,
                pool: r.pool.clone(),
                can_grow: r.can_grow,
            })
        })
        .collect();
    exhaustion::exhaustion(&NodeRanges {
        mode: &status.ipam.mode,
        node_name: &status.ipam.node_name,
        default_pool: &status.ipam.default_pool,
        ranges: &ranges,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::models::RangeStatus;

    #[test]
    fn a_status_answer_is_judged_by_its_ranges() {
        let mut status = StatusResponse::default();
        status.ipam.mode = "cluster-pool".into();
        status.ipam.node_name = "node-1".into();
        status.ipam.ranges = vec![RangeStatus {
            family: "ipv4".into(),
            cidr: "10.0.1.0/24".into(),
            used: 254,
            usable: 254,
            ..RangeStatus::default()
        }];
        let said = exhaustion(&status).unwrap_or_default();
        assert!(
            said.starts_with("ipv4 range 10.0.1.0/24 of node node-1 is exhausted (254/254"),
            "{said}"
        );
        status.ipam.ranges[0].used = 3;
        assert_eq!(exhaustion(&status), None);
    }
}
