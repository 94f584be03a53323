//! Why the node's IPAM refused a request for an address: one reason the daemon's
//! state decides, the REST API sends (`podnet-reason`), `explain` and the
//! metrics name, and the plugin maps to a CNI error code.

use serde::{Deserialize, Serialize};

/// Why the daemon refused a request for an address. The REST API sends it in
/// the `podnet-reason` header (as [`FailureReason::as_str`] spells it, and
/// serde too), so clients map failures to CNI codes without reading messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureReason {
    /// The node's range (or a pool that cannot grow) has no free address.
    RangeFull,
    /// The pool does not exist on this node (yet).
    PoolNotAvailable,
    /// No single pool could be chosen for the pod.
    PoolSelection,
    /// Pod or Namespace metadata is not synced yet: try again.
    MetadataNotSynced,
    /// The journal cannot record changes (a full or failing disk): try again.
    JournalUnavailable,
    /// The daemon runs `--ipam delegated-plugin` and hands out no pod addresses:
    /// the plugin runs the network config's IPAM plugin (the configuration comes
    /// along in the `podnet-config` header).
    DelegatedPlugin,
    /// The daemon's configuration does not fit its node (`enable-ipv6` on a node
    /// without an IPv6 address, ...): no address until it is fixed.
    NodeConfig,
    /// The pod's `ipam.podnet.io/ip-addresses` annotation cannot be read (or this
    /// mode cannot honour it).
    AddressAnnotation,
    /// The address the pod's annotation asks for is held (by which pod, said).
    AddressTaken,
    /// The address the pod's annotation asks for is in no range (block) this
    /// node holds for the pod's pool.
    AddressOutsideNode,
    /// The address the pod's annotation asks for is in no pool, or in another
    /// pool than the pod's.
    AddressNotInPool,
    /// The pod's sticky address (`ipam.podnet.io/sticky-pool`) is not on this
    /// node yet: asked of the operator, or still on the node the pod left.
    StickyWaiting,
    /// The pod's sticky address cannot be served: the annotation names no
    /// sticky pool, or the operator refused the request (its words).
    StickyRefused,
}

impl FailureReason {
    /// The header value (also the reason `explain` and the metrics use).
    pub fn as_str(self) -> &'static str {
        match self {
            FailureReason::RangeFull => "range-full",
            FailureReason::PoolNotAvailable => "pool-not-available",
            FailureReason::PoolSelection => "pool-selection",
            FailureReason::MetadataNotSynced => "metadata-not-synced",
            FailureReason::JournalUnavailable => "journal-unavailable",
            FailureReason::DelegatedPlugin => "delegated-plugin",
            FailureReason::NodeConfig => "node-config",
            FailureReason::AddressAnnotation => "address-annotation",
            FailureReason::AddressTaken => "address-taken",
            FailureReason::AddressOutsideNode => "address-outside-node",
            FailureReason::AddressNotInPool => "address-not-in-pool",
            FailureReason::StickyWaiting => "sticky-waiting",
            FailureReason::StickyRefused => "sticky-refused",
        }
    }

    /// Whether this refuses the addresses a pod's annotation asks for (the
    /// plugin's code 107; the agent posts an Event on the Pod).
    pub fn is_requested_address(self) -> bool {
        matches!(
            self,
            FailureReason::AddressAnnotation
                | FailureReason::AddressTaken
                | FailureReason::AddressOutsideNode
                | FailureReason::AddressNotInPool
                | FailureReason::StickyRefused
        )
    }

    /// Every reason.
    pub const ALL: [FailureReason; 13] = [
        FailureReason::RangeFull,
        FailureReason::PoolNotAvailable,
        FailureReason::PoolSelection,
        FailureReason::MetadataNotSynced,
        FailureReason::JournalUnavailable,
        FailureReason::DelegatedPlugin,
        FailureReason::NodeConfig,
        FailureReason::AddressAnnotation,
        FailureReason::AddressTaken,
        FailureReason::AddressOutsideNode,
        FailureReason::AddressNotInPool,
        FailureReason::StickyWaiting,
        FailureReason::StickyRefused,
    ];

    /// Reads a header value; None for a reason this build does not know.
    pub fn parse(s: &str) -> Option<FailureReason> {
        FailureReason::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_reasons_round_trip() {
        for r in FailureReason::ALL {
            assert_eq!(FailureReason::parse(r.as_str()), Some(r));
        }
        assert_eq!(FailureReason::parse("delegated-plugin-v2"), None);
    }

    #[test]
    fn serde_spells_each_reason_as_the_header_does() {
        for r in FailureReason::ALL {
            let json = serde_json::to_value(r).expect("serialize");
            assert_eq!(json, serde_json::Value::from(r.as_str()));
        }
    }
}
