//! The node's cluster-pool CIDRs as status lists them (`ipam.pod-cidrs`).

use crate::api::models::PodCidrLine;
use crate::daemon::state::NodeCidr;

/// Each of the node's CIDRs as a status line (an unjudged one has no status).
pub fn pod_cidr_lines(cidrs: &[NodeCidr]) -> Vec<PodCidrLine> {
    cidrs
        .iter()
        .map(|c| PodCidrLine {
            cidr: c.cidr.to_string(),
            status: c.status.map(|s| s.as_str().to_string()).unwrap_or_default(),
            first: c.first,
            used: c.used,
            usable: c.usable,
            why: c.why.clone(),
        })
        .collect()
}
