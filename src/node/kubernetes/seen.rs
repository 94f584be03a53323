//! What the agent writes into the status of this node's CiliumNode, as the
//! source last saw it: the sink writes only what differs.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::FIT_CONDITION;
use crate::node::{NodeResource, UsedAddresses};
use crate::resources::PodCidrStatus;

/// What the agent writes into the status of this node's CiliumNode, as the last
/// version the source saw held it (None: none seen yet, or the last one did not
/// decode). The sink does not apply what the CiliumNode already holds: its own
/// apply comes back through the watch, and applying it again would be a write that
/// changes nothing. Another writer's change comes back the same way and differs,
/// so it is written over.
#[derive(Debug, Default)]
pub(super) struct Seen {
    /// External modes: `status.ipam.used` / `ipv6-used`.
    pub(super) used: Option<UsedAddresses>,
    /// The [`FIT_CONDITION`] in `status.conditions`.
    pub(super) fit: Option<serde_json::Value>,
    /// cluster-pool: `status.ipam.pod-cidrs`.
    pub(super) pod_cidrs: Option<BTreeMap<String, PodCidrStatus>>,
}

pub(super) type SharedSeen = Arc<Mutex<Seen>>;

/// The used addresses a node resource lists in its status.
fn used_in(node: &NodeResource) -> UsedAddresses {
    UsedAddresses {
        ipv4: node.status.ipam.used.clone(),
        ipv6: node.status.ipam.ipv6_used.clone(),
    }
}

/// The [`FIT_CONDITION`] a node resource has in its status.
pub(super) fn fit_in(node: &NodeResource) -> Option<serde_json::Value> {
    node.status
        .extra
        .get("conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == FIT_CONDITION)
        .cloned()
}

/// Notes what `node` (the version just seen; None: one that did not decode) holds.
pub(super) fn see(seen: &SharedSeen, node: Option<&NodeResource>) {
    *seen.lock().unwrap_or_else(|p| p.into_inner()) = Seen {
        used: node.map(used_in),
        fit: node.and_then(fit_in),
        pod_cidrs: node.map(|n| n.status.ipam.pod_cidrs.clone()),
    };
}
