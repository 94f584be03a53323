//! cluster-pool: each of the node's CIDRs with its use, the agent's verdict
//! (`ipam::cidr_depletion`) and why, in words: what `podnet status` shows
//! (`status.ipam.pod-cidrs`, built by `daemon::answers::cidrs`).

use ipnet::IpNet;

use super::IpamState;
use crate::ipam::Family;
use crate::ipam::cidr_depletion::{DepletionRules, is_first};
use crate::resources::PodCidrState;
use crate::store::now_ms;

/// A duration in ms as `3m12s` (whole seconds).
fn minutes(ms: u64) -> String {
    let s = ms / 1000;
    match (s / 60, s % 60) {
        (0, s) => format!("{s}s"),
        (m, 0) => format!("{m}m"),
        (m, s) => format!("{m}m{s}s"),
    }
}

/// One of the node's CIDRs: the agent's verdict on it (none: not judged yet),
/// its use and why it has that verdict, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCidr {
    pub cidr: IpNet,
    pub status: Option<PodCidrState>,
    /// The node's first CIDR of its family (never given back).
    pub first: bool,
    pub used: u64,
    pub usable: u64,
    pub why: String,
}

impl IpamState {
    /// The node's CIDRs in `spec.ipam.podCIDRs` order (none outside cluster-pool).
    pub fn node_cidrs(&self) -> Vec<NodeCidr> {
        let Some(rules) = self.cfg.depletion else {
            return Vec::new();
        };
        let node = self.sync.node();
        let spec: Vec<IpNet> = node.spec.ipam.pod_cidrs.iter().map(IpNet::trunc).collect();
        let blocks = self.pools.blocks();
        let now = now_ms();
        spec.iter()
            .map(|cidr| {
                let block = blocks.iter().find(|b| b.cidr == *cidr);
                let (used, usable) = block.map_or((0, 0), |b| (b.used, b.usable));
                let state = node
                    .status
                    .ipam
                    .pod_cidrs
                    .get(&cidr.to_string())
                    .map(|s| s.status);
                let first = is_first(&spec, cidr);
                NodeCidr {
                    cidr: *cidr,
                    status: state,
                    first,
                    used,
                    usable,
                    why: self.why(&rules, cidr, state, first, used, now),
                }
            })
            .collect()
    }

    fn why(
        &self,
        rules: &DepletionRules,
        cidr: &IpNet,
        state: Option<PodCidrState>,
        first: bool,
        used: u64,
        now: u64,
    ) -> String {
        let family = Family::of_net(cidr).label();
        let role = if first {
            "the node's first CIDR (never given back)"
        } else {
            "an extra CIDR from the operator"
        };
        let threshold = rules.threshold();
        match state {
            None => format!("{role}; not judged yet"),
            Some(PodCidrState::Depleted) => format!(
                "{role}; fewer than {threshold}% of the node's {family} addresses are free: \
                 asking the operator for another CIDR (cluster-pool-depletion-threshold)"
            ),
            Some(PodCidrState::Released) => format!(
                "{role}; held no address for {}: released, nothing is handed out of it, \
                 the operator takes it back",
                minutes(rules.release_delay_ms())
            ),
            Some(PodCidrState::InUse) if first || used > 0 => format!("{role}; in use"),
            Some(PodCidrState::InUse) => match self.sync.cidr_tracker().empty_for(cidr, now) {
                Some(empty) if empty >= rules.release_delay_ms() => format!(
                    "{role}; empty for {}, kept: without it fewer than {}% of the node's \
                         {family} addresses would be free",
                    minutes(empty),
                    (2 * u32::from(threshold)).min(100)
                ),
                Some(empty) => format!(
                    "{role}; empty for {}, released after {} (cluster-pool-cidr-release-delay)",
                    minutes(empty),
                    minutes(rules.release_delay_ms())
                ),
                None => format!("{role}; empty"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::minutes;

    #[test]
    fn durations_read_as_minutes_and_seconds() {
        assert_eq!(minutes(0), "0s");
        assert_eq!(minutes(59_999), "59s");
        assert_eq!(minutes(600_000), "10m");
        assert_eq!(minutes(192_000), "3m12s");
    }
}
