//! The operator's Prometheus metrics (`podnet_operator_*`, on
//! `--prometheus-serve-addr`): whether this replica leads, the writes it made to
//! CiliumNodes by kind, how many nodes hold their CIDRs or wait for room, in
//! multi-pool the blocks in use and free per pool and whether the latest pool
//! definitions were refused, the duplicate check's confirmed findings by kind and
//! its runs, and LB IPAM's (`lbipam_*`, [`LbIpamMetrics`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::lbipam::metrics::LbIpamMetrics;
use crate::ipam::duplicates::{Finding, FindingKind};
use crate::process::metrics_text::{self, gauge_value};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub pool: String,
    pub state: String,
}

/// Every metric the operator exports.
pub struct OperatorMetrics {
    registry: Registry,
    pub is_leader: Gauge,
    pub writes: Family<KindLabels, Counter>,
    pub nodes: Family<StateLabels, Gauge>,
    pub pool_blocks: Family<PoolLabels, Gauge>,
    pub pools_refused: Gauge,
    pub findings: Family<KindLabels, Gauge>,
    pub checks: Family<ResultLabels, Counter>,
    pub lbipam: LbIpamMetrics,
}

impl Default for OperatorMetrics {
    fn default() -> OperatorMetrics {
        OperatorMetrics::new()
    }
}

impl OperatorMetrics {
    /// Every metric, registered under `podnet_operator_`.
    pub fn new() -> OperatorMetrics {
        let mut registry = Registry::with_prefix("podnet_operator");
        let is_leader = Gauge::default();
        let writes = Family::<KindLabels, Counter>::default();
        let nodes = Family::<StateLabels, Gauge>::default();
        registry.register(
            "is_leader",
            "1 while this replica holds the leader Lease",
            is_leader.clone(),
        );
        registry.register(
            "ciliumnode_writes",
            "Writes to CiliumNodes: pod-cidrs (spec.ipam.podCIDRs applies), status (operator-status applies)",
            writes.clone(),
        );
        registry.register(
            "ipam_nodes",
            "CiliumNodes by state: allocated (cluster-pool: a CIDR of every enabled family; multi-pool: no error), waiting (an error in operator-status)",
            nodes.clone(),
        );
        let pool_blocks = Family::<PoolLabels, Gauge>::default();
        let pools_refused = Gauge::default();
        registry.register(
            "pool_blocks",
            "multi-pool: blocks per CiliumPodIPPool by state: allocated (held by nodes), free",
            pool_blocks.clone(),
        );
        registry.register(
            "pool_definitions_refused",
            "multi-pool: 1 while the latest CiliumPodIPPool definitions are refused (they break blocks in use; the previous ones stay in force)",
            pools_refused.clone(),
        );
        let findings = Family::<KindLabels, Gauge>::default();
        let checks = Family::<ResultLabels, Counter>::default();
        registry.register(
            "ipam_findings",
            "Duplicate check: findings confirmed by two checks in a row, by kind: same-ip (two Pods with one IP), outside-node-ranges (a Pod IP outside its node's ranges), range-on-two-nodes (a CIDR, block or IP on two CiliumNodes); each must be 0",
            findings.clone(),
        );
        registry.register(
            "ipam_checks",
            "Duplicate checks run by the leader: ok (Pods and CiliumNodes read), failed (they could not be)",
            checks.clone(),
        );
        let lbipam = LbIpamMetrics::register(&mut registry);
        OperatorMetrics {
            registry,
            lbipam,
            is_leader,
            writes,
            nodes,
            pool_blocks,
            pools_refused,
            findings,
            checks,
        }
    }

    /// Sets the confirmed findings per kind (every kind, zero included).
    pub fn set_findings(&self, current: &[Finding]) {
        for kind in FindingKind::ALL {
            let n = current.iter().filter(|f| f.kind() == kind).count();
            self.findings
                .get_or_create(&KindLabels {
                    kind: kind.label().into(),
                })
                .set(gauge_value(n));
        }
    }

    /// Counts one duplicate check by its result.
    pub fn checked(&self, result: &str) {
        self.checks
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    /// Counts one write of `kind`.
    pub fn wrote(&self, kind: &str) {
        self.writes
            .get_or_create(&KindLabels { kind: kind.into() })
            .inc();
    }

    /// Sets the node counts.
    pub fn set_nodes(&self, allocated: usize, waiting: usize) {
        for (state, n) in [("allocated", allocated), ("waiting", waiting)] {
            self.nodes
                .get_or_create(&StateLabels {
                    state: state.into(),
                })
                .set(gauge_value(n));
        }
    }

    /// Sets the blocks per pool: `(allocated, free)`; pools gone are dropped.
    pub fn set_pool_blocks(&self, space: &std::collections::BTreeMap<String, (u64, u64)>) {
        self.pool_blocks.clear();
        for (pool, (allocated, free)) in space {
            for (state, n) in [("allocated", allocated), ("free", free)] {
                self.pool_blocks
                    .get_or_create(&PoolLabels {
                        pool: pool.clone(),
                        state: state.into(),
                    })
                    .set(gauge_value(*n));
            }
        }
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        metrics_text::encode(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let m = OperatorMetrics::new();
        m.is_leader.set(1);
        m.wrote("pod-cidrs");
        m.set_nodes(3, 1);
        m.set_pool_blocks(&[("default".to_string(), (2, 14))].into_iter().collect());
        m.pools_refused.set(1);
        m.set_findings(&[crate::ipam::duplicates::Finding::RangeOnTwoNodes { ranges: Vec::new() }]);
        m.checked("ok");
        let text = m.encode();
        assert!(
            text.contains("podnet_operator_ipam_findings{kind=\"range-on-two-nodes\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("podnet_operator_ipam_findings{kind=\"same-ip\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("podnet_operator_ipam_checks_total{result=\"ok\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("podnet_operator_pool_blocks{pool=\"default\",state=\"free\"} 14"),
            "{text}"
        );
        assert!(
            text.contains("podnet_operator_pool_definitions_refused 1"),
            "{text}"
        );
        assert!(text.contains("podnet_operator_is_leader 1"), "{text}");
        assert!(
            text.contains("podnet_operator_ciliumnode_writes_total{kind=\"pod-cidrs\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("podnet_operator_ipam_nodes{state=\"waiting\"} 1"),
            "{text}"
        );
    }
}
