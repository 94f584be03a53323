//! A node whose ranges are exhausted, in words: which range of which family is
//! full and what would give the node room in its IPAM mode. One message for the
//! two places that say it: CNI STATUS where no Kubernetes Node carries it
//! (`plugin::status`), and the annotation beside the agent's
//! `podnet.io/addresses-exhausted` taint on its Node (`node::kubernetes`).

use super::models::{RangeStatus, StatusResponse};

/// Why new pods on the node cannot get an address, naming each full range and
/// what would give the node room in its IPAM mode; `None` when every range has
/// room (or can still grow).
pub fn exhaustion(st: &StatusResponse) -> Option<String> {
    let full: Vec<&RangeStatus> = st.ipam.ranges.iter().filter(|r| r.is_exhausted()).collect();
    if full.is_empty() {
        return None;
    }
    let ranges: Vec<String> = full
        .iter()
        .map(|r| {
            format!(
                "{} range {} of node {} is exhausted ({}/{} addresses in use)",
                r.family, r.cidr, st.ipam.node_name, r.used, r.usable
            )
        })
        .collect();
    let remedy = match st.ipam.mode.as_str() {
        "cluster-pool" => {
            let families: Vec<&str> = full.iter().map(|r| r.family.as_str()).collect();
            let masks: Vec<String> = families
                .iter()
                .map(|f| format!("cluster-pool-{f}-mask-size"))
                .collect();
            format!(
                " or podnet's operator gives the node another range (at most \
                 cluster-pool-extra-cidrs-max more; each range's size is {})",
                masks.join(", ")
            )
        }
        "kubernetes" => " (the range is the Node's spec.podCIDRs, sized by \
                         kube-controller-manager's --node-cidr-mask-size)"
            .to_string(),
        _ => String::new(),
    };
    Some(format!(
        "{}: new pods on this node cannot get an address until pods are deleted{remedy}",
        ranges.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(mode: &str, ranges: Vec<RangeStatus>) -> StatusResponse {
        let mut st = StatusResponse::default();
        st.ipam.mode = mode.into();
        st.ipam.node_name = "node-1".into();
        st.ipam.ranges = ranges;
        st
    }

    fn range(family: &str, cidr: &str, used: u64, usable: u64) -> RangeStatus {
        RangeStatus {
            family: family.into(),
            cidr: cidr.into(),
            used,
            usable,
            ..RangeStatus::default()
        }
    }

    #[test]
    fn a_range_with_room_or_one_that_can_grow_is_not_exhausted() {
        let roomy = status("cluster-pool", vec![range("ipv4", "10.0.1.0/24", 253, 254)]);
        assert_eq!(exhaustion(&roomy), None);
        let growing = RangeStatus {
            can_grow: true,
            ..range("ipv4", "10.0.1.0/24", 254, 254)
        };
        assert_eq!(exhaustion(&status("multi-pool", vec![growing])), None);
    }

    #[test]
    fn cluster_pool_names_every_full_range_and_the_options_of_its_family() {
        let st = status(
            "cluster-pool",
            vec![
                range("ipv4", "10.0.1.0/24 10.0.3.0/24", 508, 508),
                range("ipv6", "fd00::/120", 254, 254),
            ],
        );
        assert_eq!(
            exhaustion(&st).as_deref(),
            Some(
                "ipv4 range 10.0.1.0/24 10.0.3.0/24 of node node-1 is exhausted (508/508 addresses in use); \
                 ipv6 range fd00::/120 of node node-1 is exhausted (254/254 addresses in use): \
                 new pods on this node cannot get an address until pods are deleted or podnet's \
                 operator gives the node another range (at most cluster-pool-extra-cidrs-max more; \
                 each range's size is cluster-pool-ipv4-mask-size, cluster-pool-ipv6-mask-size)"
            )
        );
    }

    #[test]
    fn kubernetes_mode_points_at_the_controller_manager() {
        let st = status("kubernetes", vec![range("ipv6", "fd00::/120", 254, 254)]);
        let message = exhaustion(&st).unwrap_or_default();
        assert!(message.starts_with("ipv6 range fd00::/120 of node node-1 is exhausted"));
        assert!(message.ends_with("sized by kube-controller-manager's --node-cidr-mask-size)"));
        assert!(!message.contains("cluster-pool"), "{message}");
    }

    #[test]
    fn other_modes_say_only_that_pods_must_be_deleted() {
        let st = status("crd", vec![range("ipv4", "10.0.0.0/28", 14, 14)]);
        let message = exhaustion(&st).unwrap_or_default();
        assert!(message.ends_with("until pods are deleted"), "{message}");
    }
}
