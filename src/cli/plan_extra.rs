//! `podnet plan`, cluster-pool: what podnet's extra node CIDRs mean for a plan.
//! A node asks for another CIDR when fewer than `cluster-pool-depletion-threshold`
//! percent of its addresses are free, and holds up to
//! `cluster-pool-extra-cidrs-max` extra ones per family: how full a node gets
//! before it asks, how many pod addresses it can hold at most, and how many
//! nodes the pool serves when every node holds one CIDR or the most it may.

use serde::Serialize;

use crate::ipam::cidr_depletion::DepletionRules;
use crate::ipam::sizing::Plan;

/// The extra-CIDR figures of a cluster-pool plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExtraCidrPlan {
    /// `cluster-pool-depletion-threshold`, percent.
    pub threshold_percent: u8,
    /// `cluster-pool-extra-cidrs-max`.
    pub extra_cidrs_max: u32,
    /// Addresses in use (router included) at which a node with one CIDR asks.
    pub asks_at_used: u64,
    /// Pod addresses a node holds at most (one CIDR plus every extra one).
    pub max_usable_per_node: u64,
    /// Nodes the pool serves when every node holds the most CIDRs it may.
    pub nodes_at_max: u64,
}

/// The figures for `plan` with `rules` and `max` extra CIDRs per node.
pub fn extra_cidr_plan(plan: &Plan, rules: &DepletionRules, max: u32) -> ExtraCidrPlan {
    let usable = plan.allocatable_per_node;
    let threshold = u64::from(rules.threshold());
    // The smallest `used` with free * 100 < threshold * usable.
    let free_below = (threshold * usable).div_ceil(100);
    let cidrs = u64::from(max) + 1;
    ExtraCidrPlan {
        threshold_percent: rules.threshold(),
        extra_cidrs_max: max,
        asks_at_used: usable - free_below.min(usable) + 1,
        max_usable_per_node: plan.usable_per_node + u64::from(max) * usable,
        nodes_at_max: plan.nodes / cidrs,
    }
}

/// The plan's text line.
pub fn extra_cidr_text(e: &ExtraCidrPlan, mask: u8) -> String {
    if e.extra_cidrs_max == 0 {
        return "Extra:    none (cluster-pool-extra-cidrs-max 0): a node keeps one CIDR per \
                family, as with Cilium\n"
            .to_string();
    }
    format!(
        "Extra:    a node asks for another /{mask} at {} addresses in use \
         (cluster-pool-depletion-threshold {}%), and holds up to {} extra \
         (cluster-pool-extra-cidrs-max): {} pod addresses at most; the pool serves {} nodes \
         if every node holds {} CIDRs\n",
        e.asks_at_used,
        e.threshold_percent,
        e.extra_cidrs_max,
        e.max_usable_per_node,
        e.nodes_at_max,
        e.extra_cidrs_max + 1
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::sizing::{PlanOptions, plan_cluster_pool};
    use std::time::Duration;

    #[test]
    fn a_24_asks_at_229_used_and_three_cidrs_hold_a_third_of_the_nodes() {
        let opts = PlanOptions {
            reserved_per_node: 2,
            max_pods: None,
            rollout_headroom_percent: 0,
        };
        let plan = plan_cluster_pool(&["10.244.0.0/16".parse().unwrap()], 24, &opts).unwrap();
        let rules = DepletionRules::new(10, Duration::ZERO).unwrap();
        let e = extra_cidr_plan(&plan, &rules, 2);
        // 254 allocatable; 10% is 25.4: 229 in use leaves 25 free, under it.
        assert_eq!(e.asks_at_used, 229);
        assert_eq!(e.max_usable_per_node, 252 + 2 * 254);
        assert_eq!(e.nodes_at_max, 85);
        assert!(extra_cidr_text(&e, 24).contains("asks for another /24 at 229 addresses in use"));
        let none = extra_cidr_plan(&plan, &rules, 0);
        assert!(extra_cidr_text(&none, 24).starts_with("Extra:    none"));
        let all = extra_cidr_plan(&plan, &DepletionRules::new(100, Duration::ZERO).unwrap(), 1);
        assert_eq!(all.asks_at_used, 1, "100%: as soon as anything is held");
    }
}
