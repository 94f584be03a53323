//! An Event about a node's CIDRs (extra CIDRs given, released or unavailable; a
//! range on a draining pool CIDR), as the bookkeeping ([`super::cidrs`],
//! [`super::drain`]) queues it and the handler posts it on the CiliumNode
//! ([`CidrEvent::to_event`], its action naming what it is about so Events about
//! different CIDRs are not folded into one series); and how a note lists CIDRs
//! ([`joined`]).

use ipnet::IpNet;
use kube::runtime::events::Event;

use crate::k8s::events;

/// The verb of every CIDR Event's action.
const ACTION: &str = "AllocatePodCIDR";

/// An Event about a node's CIDRs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CidrEvent {
    pub warning: bool,
    pub reason: &'static str,
    /// What it is about (a CIDR, a family, a pool CIDR), in its action: Events
    /// of one reason on one node about different things stay apart.
    pub about: String,
    pub note: String,
}

impl CidrEvent {
    /// The Event posted: action `AllocatePodCIDR <about>`.
    pub fn to_event(&self) -> Event {
        events::event(self.warning, self.reason, &self.note, ACTION, &self.about)
    }
}

/// `a, b, c`.
pub(super) fn joined(cidrs: &[IpNet]) -> String {
    cidrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use kube::runtime::events::EventType;

    use super::*;

    /// The part of kube-rs's series key an Event sets (the rest, the reporter
    /// and the CiliumNode, is the same for every Event on one node).
    fn series_key(e: &Event) -> (EventType, String, String, bool) {
        (
            e.type_,
            e.action.clone(),
            e.reason.clone(),
            e.secondary.is_some(),
        )
    }

    fn allocated(cidr: &str) -> CidrEvent {
        CidrEvent {
            warning: false,
            reason: "ExtraPodCIDRAllocated",
            about: cidr.into(),
            note: format!("extra IPv4 CIDR {cidr} for node a"),
        }
    }

    #[test]
    fn events_about_two_cidrs_of_one_reason_are_two_series() {
        let first = allocated("10.0.1.0/24").to_event();
        let second = allocated("10.0.2.0/24").to_event();
        assert_eq!(first.reason, second.reason);
        assert_ne!(series_key(&first), series_key(&second));
        assert_eq!(first.action, "AllocatePodCIDR 10.0.1.0/24");
        assert_eq!(
            series_key(&first),
            series_key(&allocated("10.0.1.0/24").to_event()),
            "a repeat about the same CIDR is still one series"
        );
    }
}
