//! The state's side of the leak check (`daemon::leak_check` runs it): the
//! node's pod allocations as `ipam::leaks::check` takes them, and the release
//! of the leaks it found, through the path a GC's release takes
//! (`release_attachment`, one journal commit).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use super::{ApiError, IpamState};
use crate::datapath::host_ifname;
use crate::ipam::leaks::{Finding, NodeAllocation, PodName};
use crate::store::{AllocationState, now_ms};

/// The suffix restore gives the owner of an allocation adopted from the kernel.
const FROM_KERNEL: &str = " [from kernel]";

impl IpamState {
    /// The allocations the leak check weighs, as of `now_ms`: the pods' live ones
    /// (pending or bound; cooling ones are released already, and the daemon's own
    /// have no pod). An allocation's pod is its owner `<namespace>/<name>`; its
    /// host link is the one it was adopted under, or the one podnet names for its
    /// attachment.
    pub fn leak_candidates(&self, now_ms: u64) -> Vec<NodeAllocation> {
        self.ledger
            .allocations()
            .iter()
            .filter(|a| matches!(a.state(), AllocationState::Bound | AllocationState::Pending))
            .map(|a| NodeAllocation {
                ip: a.ip,
                pod: pod_of_owner(a.owner()),
                pod_uid: a.pod_uid().map(str::to_string),
                container_id: a.container_id().map(str::to_string),
                host_link: a.host_ifname().map(str::to_string).or_else(|| {
                    a.container_id()
                        .zip(a.ifname())
                        .map(|(c, i)| host_ifname(c, i))
                }),
                age: Duration::from_millis(now_ms.saturating_sub(a.allocated_at_ms())),
            })
            .collect()
    }

    /// Releases the leaks the check found, each with its whole attachment (both
    /// families, the endpoint) as GC does, in one commit. A finding whose address
    /// no longer holds the allocation it was found for (released meanwhile, or
    /// handed to another container or pod) is skipped. Returns the addresses
    /// released.
    pub fn release_leaked(&mut self, leaks: &[Finding]) -> Result<Vec<IpAddr>, ApiError> {
        let now = now_ms();
        let mut ops = Vec::new();
        let mut released: BTreeSet<IpAddr> = BTreeSet::new();
        for leak in leaks {
            if released.contains(&leak.ip) {
                continue;
            }
            let Some(rec) = self.ledger.allocations().get(&leak.ip) else {
                continue;
            };
            let same = matches!(
                rec.state(),
                AllocationState::Bound | AllocationState::Pending
            ) && rec.container_id() == leak.container_id.as_deref()
                && pod_of_owner(rec.owner()).as_ref() == Some(&leak.pod);
            if !same {
                continue;
            }
            match rec.container_id().zip(rec.ifname()) {
                Some((cid, ifname)) => {
                    let (cid, ifname) = (cid.to_string(), ifname.to_string());
                    released.extend(self.ledger.release_attachment(
                        &cid,
                        Some(&ifname),
                        &mut ops,
                        now,
                    ));
                }
                None => {
                    ops.push(self.ledger.release_op(&rec.record(), now));
                    released.insert(leak.ip);
                }
            }
        }
        self.commit_apply(ops, "leaked allocation released")?;
        Ok(released.into_iter().collect())
    }
}

/// The pod an allocation's owner names: `<namespace>/<name>` (restore adds
/// ` [from kernel]` to an adopted one's); None for any other owner (a container
/// ID, when the runtime sent no pod names, or the daemon's own).
pub fn pod_of_owner(owner: &str) -> Option<PodName> {
    let owner = owner.strip_suffix(FROM_KERNEL).unwrap_or(owner);
    let (namespace, name) = owner.split_once('/')?;
    let plain = |s: &str| !s.is_empty() && !s.contains(['/', ' ']);
    (plain(namespace) && plain(name)).then(|| PodName {
        namespace: namespace.into(),
        name: name.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_names_a_pod_only_as_namespace_and_name() {
        let pod = |ns: &str, n: &str| {
            Some(PodName {
                namespace: ns.into(),
                name: n.into(),
            })
        };
        assert_eq!(pod_of_owner("default/web-0"), pod("default", "web-0"));
        assert_eq!(
            pod_of_owner("default/web-0 [from kernel]"),
            pod("default", "web-0")
        );
        for other in [
            "", "router", "health", "0123abcd", "a/", "/b", "a/b/c", "a b/c",
        ] {
            assert_eq!(pod_of_owner(other), None, "{other:?}");
        }
    }
}
