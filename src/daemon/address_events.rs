//! The Event on the Pod when the addresses its `ipam.podnet.io/ip-addresses`
//! annotation asks for are refused (an `address-*` reason: malformed, taken and
//! by whom, outside this node's ranges, in no pool), and when a sticky address
//! (`ipam.podnet.io/sticky-pool`) is refused: the CNI error reaches the
//! kubelet's log and its FailedCreatePodSandBox Event, this one says it on the
//! Pod in podnet's words, with reason `RequestedAddressRefused` (action
//! `AllocateIP <address-* reason>`: refusals of different kinds are different
//! Events, not one series keeping the first one's note). Posted in the
//! background, never holding the ADD; only on the Kubernetes backend (the
//! embedded one has no API server: the refusal is in the CNI error, the daemon's
//! log and `podnet explain`).

use std::sync::Arc;

use super::Daemon;
use super::state::{AllocateRequest, ApiError};
use crate::ipam::leaks::PodName;
use crate::k8s::node_pods::NodeEvent;

/// The Event's reason.
pub const REASON_REFUSED: &str = "RequestedAddressRefused";

/// An Event's note is at most 1 kB (events.k8s.io/v1).
const MAX_NOTE: usize = 1000;

impl Daemon {
    /// Posts the refusal `e` of `req` on its Pod, if `e` refuses the addresses
    /// the Pod asked for and the owner names a Pod.
    pub(super) fn report_refused_address(self: &Arc<Self>, req: &AllocateRequest, e: &ApiError) {
        let Some(api) = self.pod_events.clone() else {
            return;
        };
        let Some(reason) = e.reason.filter(|r| r.is_requested_address()) else {
            return;
        };
        let Some((namespace, name)) = req.owner.split_once('/') else {
            return;
        };
        let pod = PodName {
            namespace: namespace.to_string(),
            name: name.to_string(),
        };
        let uid = req.pod_uid.clone();
        let event = NodeEvent {
            warning: true,
            reason: REASON_REFUSED,
            action: "AllocateIP",
            about: reason.as_str().into(),
            note: truncated(&e.message),
        };
        tokio::spawn(async move {
            if let Err(e) = api.post_on_pod(&pod, uid.as_deref(), &event).await {
                tracing::warn!(error = %e, "could not post the refused address's Event");
            }
        });
    }
}

/// `message` cut to an Event note's size, on a character boundary.
fn truncated(message: &str) -> String {
    if message.len() <= MAX_NOTE {
        return message.to_string();
    }
    let mut end = MAX_NOTE - 3;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &message[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_note_is_cut_on_a_character_boundary() {
        assert_eq!(truncated("short"), "short");
        let long = "é".repeat(700);
        let cut = truncated(&long);
        assert!(
            cut.len() <= MAX_NOTE && cut.ends_with("..."),
            "{}",
            cut.len()
        );
    }
}
