//! A node whose ranges are exhausted, in words: which range of which family is
//! full and what would give the node room in its IPAM mode. One message for the
//! two places that say it: CNI STATUS where no Kubernetes Node carries it
//! (`plugin::status`, through `api::exhaustion` from the status answer), and the
//! annotation beside the agent's `podnet.io/addresses-exhausted` taint on its
//! Node (`node::kubernetes`, from the daemon's state). In multi-pool, pools that
//! are exhausted while another pool has room are only said ([`exhausted_pools`]),
//! without the taint (`node_exhausted` has the rule).

use std::collections::BTreeSet;

use super::range_fill::RangeFill;

/// A node's ranges as the rule reads them.
#[derive(Debug, Clone, Copy)]
pub struct NodeRanges<'a> {
    /// The IPAM mode's name (`cluster-pool`, `kubernetes`, `multi-pool`, ...).
    pub mode: &'a str,
    pub node_name: &'a str,
    /// Multi-pool: the pool of a pod that names none (empty otherwise).
    pub default_pool: &'a str,
    /// One per pool and family.
    pub ranges: &'a [RangeFill],
}

/// Why new pods on the node cannot get an address, naming each full range and
/// what would give the node room in its IPAM mode; `None` when every range has
/// room (or can still grow), and in multi-pool while a pool has room
/// (`node_exhausted`).
pub fn exhaustion(st: &NodeRanges) -> Option<String> {
    let full = full_ranges(st);
    if full.is_empty() || !node_exhausted(st, &full) {
        return None;
    }
    let remedy = match st.mode {
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
        described(st, &full)
    ))
}

/// Multi-pool: the pools exhausted on the node while another pool it holds has
/// room, in words (the node is not tainted: `node_exhausted`); `None` when no
/// pool is exhausted, or the node as a whole is ([`exhaustion`] says it then).
pub fn exhausted_pools(st: &NodeRanges) -> Option<String> {
    let full = full_ranges(st);
    if full.is_empty() || node_exhausted(st, &full) {
        return None;
    }
    let exhausted = pools_of(&full);
    let roomy: BTreeSet<&str> = st
        .ranges
        .iter()
        .map(|r| r.pool.as_str())
        .filter(|p| !exhausted.contains(p))
        .collect();
    Some(format!(
        "{}: pods of pool {} cannot get an address on this node until pods of it are \
         deleted; the node is not tainted: pool {} has room, and a taint would keep its \
         pods out too",
        described(st, &full),
        exhausted.into_iter().collect::<Vec<_>>().join(", "),
        roomy.into_iter().collect::<Vec<_>>().join(", ")
    ))
}

/// Whether no new pod can get an address on the node, given its `full` ranges
/// (not empty): the taint's rule. With one pool (every mode but multi-pool) any
/// full range is enough (a pod needs an address of every family the node
/// serves). In multi-pool a pod takes the pool it names, or the default pool
/// (`ipam-default-ip-pool`), and a taint cannot say "for pods of pool X": the
/// node is exhausted when its default pool is, and so is every other pool it
/// holds blocks of (a pool is exhausted when a range of one of its families is
/// full and the operator cannot add to it). While a pool it holds has room the
/// exhausted ones are only said ([`exhausted_pools`]): the taint would keep out
/// that pool's pods too. A node holding no block of the default pool is not
/// exhausted (a pod of it asks the operator for one). A pool the node holds no
/// block of is not counted: whether the operator has room in it is not known
/// here, and while the taint is on its pods are kept out as well.
fn node_exhausted(st: &NodeRanges, full: &[&RangeFill]) -> bool {
    if st.mode != "multi-pool" {
        return true;
    }
    let exhausted = pools_of(full);
    let default = st.default_pool;
    let default_exhausted = default.is_empty() || exhausted.contains(default);
    default_exhausted
        && st
            .ranges
            .iter()
            .all(|r| exhausted.contains(r.pool.as_str()))
}

/// The ranges with no address left and no room to grow.
fn full_ranges<'a>(st: &NodeRanges<'a>) -> Vec<&'a RangeFill> {
    st.ranges.iter().filter(|r| r.is_exhausted()).collect()
}

/// The pools of `ranges`.
fn pools_of<'a>(ranges: &[&'a RangeFill]) -> BTreeSet<&'a str> {
    ranges.iter().map(|r| r.pool.as_str()).collect()
}

/// Each full range, named with its family (and its pool in multi-pool).
fn described(st: &NodeRanges, full: &[&RangeFill]) -> String {
    let multi = st.mode == "multi-pool";
    full.iter()
        .map(|r| {
            let pool = if multi {
                format!(" of pool {}", r.pool)
            } else {
                String::new()
            };
            format!(
                "{} range {}{pool} of node {} is exhausted ({}/{} addresses in use)",
                r.family.as_str(),
                r.cidr,
                st.node_name,
                r.used,
                r.usable
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node's ranges, owned (the rule borrows them).
    struct Node {
        mode: &'static str,
        default_pool: &'static str,
        ranges: Vec<RangeFill>,
    }

    impl Node {
        fn ranges(&self) -> NodeRanges<'_> {
            NodeRanges {
                mode: self.mode,
                node_name: "node-1",
                default_pool: self.default_pool,
                ranges: &self.ranges,
            }
        }
    }

    fn status(mode: &'static str, ranges: Vec<RangeFill>) -> Node {
        Node {
            mode,
            default_pool: "",
            ranges,
        }
    }

    fn range(family: &str, cidr: &str, used: u64, usable: u64) -> RangeFill {
        RangeFill {
            family: family.parse().unwrap(),
            cidr: cidr.into(),
            used,
            usable,
            cooling: 0,
            pool: String::new(),
            can_grow: false,
        }
    }

    #[test]
    fn a_range_with_room_or_one_that_can_grow_is_not_exhausted() {
        let roomy = status("cluster-pool", vec![range("ipv4", "10.0.1.0/24", 253, 254)]);
        assert_eq!(exhaustion(&roomy.ranges()), None);
        let growing = RangeFill {
            can_grow: true,
            ..range("ipv4", "10.0.1.0/24", 254, 254)
        };
        assert_eq!(
            exhaustion(&status("multi-pool", vec![growing]).ranges()),
            None
        );
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
            exhaustion(&st.ranges()).as_deref(),
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
        let message = exhaustion(&st.ranges()).unwrap_or_default();
        assert!(message.starts_with("ipv6 range fd00::/120 of node node-1 is exhausted"));
        assert!(message.ends_with("sized by kube-controller-manager's --node-cidr-mask-size)"));
        assert!(!message.contains("cluster-pool"), "{message}");
    }

    #[test]
    fn other_modes_say_only_that_pods_must_be_deleted() {
        let st = status("crd", vec![range("ipv4", "10.0.0.0/28", 14, 14)]);
        let message = exhaustion(&st.ranges()).unwrap_or_default();
        assert!(message.ends_with("until pods are deleted"), "{message}");
    }

    fn pool(pool: &str, family: &str, cidr: &str, used: u64, usable: u64) -> RangeFill {
        RangeFill {
            pool: pool.into(),
            ..range(family, cidr, used, usable)
        }
    }

    fn multi_pool(ranges: Vec<RangeFill>) -> Node {
        Node {
            default_pool: "default",
            ..status("multi-pool", ranges)
        }
    }

    #[test]
    fn multi_pool_taints_only_when_the_default_pool_and_every_other_held_pool_are_exhausted() {
        let default_full = pool("default", "ipv4", "10.10.0.0/27", 30, 30);
        let default_roomy = pool("default", "ipv4", "10.10.0.0/27", 3, 30);
        let blue_full = pool("blue", "ipv4", "10.20.0.0/28", 14, 14);
        let blue_roomy = pool("blue", "ipv4", "10.20.0.0/28", 1, 14);

        // Another pool full, the default with room: said, not tainted.
        let st = multi_pool(vec![default_roomy.clone(), blue_full.clone()]);
        assert_eq!(exhaustion(&st.ranges()), None);
        let said = exhausted_pools(&st.ranges()).unwrap_or_default();
        assert!(
            said.starts_with("ipv4 range 10.20.0.0/28 of pool blue of node node-1 is exhausted"),
            "{said}"
        );
        assert!(
            said.contains("pods of pool blue cannot get an address"),
            "{said}"
        );
        assert!(said.contains("pool default has room"), "{said}");

        // The default full, another pool with room: said, not tainted.
        let st = multi_pool(vec![default_full.clone(), blue_roomy]);
        assert_eq!(exhaustion(&st.ranges()), None);
        assert!(exhausted_pools(&st.ranges()).is_some_and(|s| s.contains("pool blue has room")));

        // Every pool it holds full: tainted (and not said twice).
        let st = multi_pool(vec![default_full.clone(), blue_full.clone()]);
        assert!(
            exhaustion(&st.ranges()).is_some_and(|s| s.contains("new pods on this node cannot"))
        );
        assert_eq!(exhausted_pools(&st.ranges()), None);

        // No block of the default pool yet: a pod of it asks the operator.
        let st = multi_pool(vec![blue_full]);
        assert_eq!(exhaustion(&st.ranges()), None);
        assert!(exhausted_pools(&st.ranges()).is_some());

        // Only the default pool, full.
        assert!(exhaustion(&multi_pool(vec![default_full]).ranges()).is_some());
    }

    #[test]
    fn a_dual_stack_pool_is_exhausted_when_one_family_is() {
        let st = multi_pool(vec![
            pool("default", "ipv4", "10.10.0.0/27", 30, 30),
            pool("default", "ipv6", "fd00::/120", 3, 254),
        ]);
        assert!(exhaustion(&st.ranges()).is_some());
    }

    #[test]
    fn the_host_scope_modes_taint_on_any_full_range() {
        let st = status(
            "cluster-pool",
            vec![
                range("ipv4", "10.0.1.0/24", 254, 254),
                range("ipv6", "fd00::/120", 1, 254),
            ],
        );
        assert!(exhaustion(&st.ranges()).is_some());
        assert_eq!(exhausted_pools(&st.ranges()), None);
    }
}
