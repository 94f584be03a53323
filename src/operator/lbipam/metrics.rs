//! LB IPAM's metrics, Cilium's names under the operator's prefix
//! (`podnet_operator_lbipam_*`): conflicting pools, each pool's available and
//! used addresses, and the Services LB IPAM serves and leaves unsatisfied.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::services::Plan;
use crate::process::metrics_text::gauge_value;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub pool: String,
}

/// The gauges, registered in the operator's registry.
#[derive(Clone, Default)]
pub struct LbIpamMetrics {
    conflicting_pools: Gauge,
    ips_available: Family<PoolLabels, Gauge>,
    ips_used: Family<PoolLabels, Gauge>,
    services_matching: Gauge,
    services_unsatisfied: Gauge,
}

impl LbIpamMetrics {
    /// Registers every gauge under `lbipam_` in `registry`.
    pub fn register(registry: &mut Registry) -> LbIpamMetrics {
        let m = LbIpamMetrics::default();
        let r = registry.sub_registry_with_prefix("lbipam");
        r.register(
            "conflicting_pools",
            "CiliumLoadBalancerIPPools marked Conflicting",
            m.conflicting_pools.clone(),
        );
        r.register(
            "ips_available",
            "Addresses a pool can still hand out",
            m.ips_available.clone(),
        );
        r.register(
            "ips_used",
            "Addresses of a pool held by Services",
            m.ips_used.clone(),
        );
        r.register(
            "services_matching",
            "LoadBalancer Services LB IPAM serves",
            m.services_matching.clone(),
        );
        r.register(
            "services_unsatisfied",
            "Served Services whose request is not satisfied",
            m.services_unsatisfied.clone(),
        );
        m
    }

    /// Sets every gauge from a plan; pools that are gone lose their series.
    pub fn update(&self, plan: &Plan) {
        self.conflicting_pools.set(gauge_value(
            plan.pools.values().filter(|p| p.conflict.is_some()).count(),
        ));
        self.ips_available.clear();
        self.ips_used.clear();
        for (name, status) in &plan.pools {
            let labels = PoolLabels { pool: name.clone() };
            self.ips_available
                .get_or_create(&labels)
                .set(gauge_value(status.available()));
            self.ips_used
                .get_or_create(&labels)
                .set(gauge_value(status.used));
        }
        let (matching, unsatisfied) = plan.counts();
        self.services_matching.set(gauge_value(matching));
        self.services_unsatisfied.set(gauge_value(unsatisfied));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::lbipam::services::{PoolStatus, Satisfied, ServicePlan};

    #[test]
    fn names_and_values() {
        let mut registry = Registry::with_prefix("podnet_operator");
        let m = LbIpamMetrics::register(&mut registry);
        let mut plan = Plan::default();
        plan.pools.insert(
            "blue".into(),
            PoolStatus {
                conflict: None,
                total: 3,
                used: 1,
            },
        );
        plan.pools.insert(
            "huge".into(),
            PoolStatus {
                conflict: Some("overlaps".into()),
                total: u128::MAX,
                used: 0,
            },
        );
        plan.services.insert(
            "default/a".into(),
            ServicePlan::Assign {
                ips: vec![],
                condition: Satisfied {
                    status: false,
                    reason: "no_pool",
                    message: String::new(),
                },
            },
        );
        plan.services
            .insert("default/b".into(), ServicePlan::Release);
        m.update(&plan);
        let text = crate::process::metrics_text::encode(&registry);
        for line in [
            "podnet_operator_lbipam_conflicting_pools 1",
            "podnet_operator_lbipam_ips_available{pool=\"blue\"} 2",
            "podnet_operator_lbipam_ips_used{pool=\"blue\"} 1",
            &format!(
                "podnet_operator_lbipam_ips_available{{pool=\"huge\"}} {}",
                i64::MAX
            ),
            "podnet_operator_lbipam_services_matching 1",
            "podnet_operator_lbipam_services_unsatisfied 1",
        ] {
            assert!(text.contains(line), "{line} missing in {text}");
        }
        plan.pools.remove("huge");
        m.update(&plan);
        let text = crate::process::metrics_text::encode(&registry);
        assert!(!text.contains("huge"), "{text}");
    }
}
