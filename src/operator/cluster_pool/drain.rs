//! The operator's word on a pool CIDR taken out of `cluster-pool-ipv4-cidr` (or
//! `-ipv6-`) while nodes hold ranges of it (no I/O). The carver drains it
//! ([`reconfigure`](crate::ipam::clusterpool::NodeCidrCarver::reconfigure)):
//! nothing in use is taken away and no new range comes from it. Here is who is
//! still on it and the Event each of them gets, naming them all, so `kubectl
//! get events` says what the removal waits for. After a restart the options no
//! longer name the pool CIDR, and a node's range in no pool CIDR is held as it is
//! ([`adopt_after_restart`](crate::ipam::clusterpool::NodeCidrCarver::adopt_after_restart)):
//! the node gets the same kind of Event then. The removal completes when the
//! last of them is deleted (or releases an extra range there).

use ipnet::IpNet;

use super::cidr_event::{CidrEvent, joined};

/// Event reason: a node holds a range of a pool CIDR that drains.
pub const REASON_DRAINING: &str = "PodCIDRDraining";

/// Each node holding ranges in `pool`, with those ranges, by name.
pub fn users<'a>(
    pool: &IpNet,
    nodes: impl Iterator<Item = (&'a str, &'a [IpNet])>,
) -> Vec<(String, Vec<IpNet>)> {
    nodes
        .filter_map(|(name, held)| {
            let mine: Vec<IpNet> = held
                .iter()
                .copied()
                .filter(|c| pool.contains(&c.network()))
                .collect();
            (!mine.is_empty()).then(|| (name.to_string(), mine))
        })
        .collect()
}

/// The Event on `node`, which holds `ranges` of draining `pool` of `option`,
/// with every node still on it (`users`).
pub fn draining_event(
    option: &str,
    pool: &IpNet,
    node: &str,
    ranges: &[IpNet],
    users: &[String],
) -> CidrEvent {
    CidrEvent {
        warning: false,
        reason: REASON_DRAINING,
        about: pool.to_string(),
        note: format!(
            "{option} no longer lists {pool}: it drains; node {node} keeps {} until it is \
             deleted, no new node range comes from {pool}, and the removal completes when no \
             node is on it (still on it: {})",
            joined(ranges),
            users.join(", ")
        ),
    }
}

/// The Event on `node` when an operator that starts finds it holding `ranges`
/// in no pool CIDR of `option`.
pub fn held_outside_event(option: &str, node: &str, ranges: &[IpNet]) -> CidrEvent {
    CidrEvent {
        warning: false,
        reason: REASON_DRAINING,
        about: joined(ranges),
        note: format!(
            "node {node} holds {}, in no pool CIDR of {option}: a removed pool CIDR drains; \
             the node keeps it until it is deleted and no new node range comes from it",
            joined(ranges)
        ),
    }
}

/// The Event on a node holding `range` inside pool CIDR `pool`, whose node
/// ranges are `/mask` (the mask size changed before the operator's restart,
/// or someone wrote the node's spec).
pub fn held_other_size_event(node: &str, range: &IpNet, pool: &IpNet, mask: u8) -> CidrEvent {
    CidrEvent {
        warning: false,
        reason: REASON_DRAINING,
        about: range.to_string(),
        note: format!(
            "node {node} holds {range}, inside pool CIDR {pool} whose node ranges are /{mask}: \
             the node keeps it until it is deleted, and no range inside it goes to another node"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn the_users_are_the_nodes_with_a_range_inside_the_pool_cidr() {
        let a = nets(&["10.0.1.0/24", "10.9.0.0/24"]);
        let b = nets(&["10.9.1.0/24"]);
        let c = nets(&["10.0.2.0/24", "fd00::/120"]);
        let nodes = [
            ("a", a.as_slice()),
            ("b", b.as_slice()),
            ("c", c.as_slice()),
        ];
        let pool: IpNet = "10.0.0.0/16".parse().unwrap();
        assert_eq!(
            users(&pool, nodes.into_iter()),
            vec![
                ("a".to_string(), nets(&["10.0.1.0/24"])),
                ("c".to_string(), nets(&["10.0.2.0/24"]))
            ]
        );
    }

    #[test]
    fn the_event_names_the_option_the_pool_the_node_and_everyone_still_on_it() {
        let e = draining_event(
            "cluster-pool-ipv4-cidr",
            &"10.0.0.0/16".parse().unwrap(),
            "a",
            &nets(&["10.0.1.0/24"]),
            &["a".into(), "c".into()],
        );
        assert_eq!(e.reason, "PodCIDRDraining");
        assert!(!e.warning);
        assert_eq!(
            e.note,
            "cluster-pool-ipv4-cidr no longer lists 10.0.0.0/16: it drains; node a keeps \
             10.0.1.0/24 until it is deleted, no new node range comes from 10.0.0.0/16, and \
             the removal completes when no node is on it (still on it: a, c)"
        );
        let e = held_outside_event("cluster-pool-ipv4-cidr", "a", &nets(&["10.0.1.0/24"]));
        assert_eq!(
            e.note,
            "node a holds 10.0.1.0/24, in no pool CIDR of cluster-pool-ipv4-cidr: a removed \
             pool CIDR drains; the node keeps it until it is deleted and no new node range \
             comes from it"
        );
    }
}
