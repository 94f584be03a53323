//! How daemon API failures become CNI errors: unreachable, silent, gone in the
//! middle of the request (connection closed or reset), or busy (503: its journal
//! cannot commit, pod metadata not synced) → 11 (try again later); a full range or
//! exhausted pool (the daemon's `range-full` reason) → 101; a configuration that
//! does not fit the node (`node-config`: `enable-ipv6` on a node without IPv6, ...)
//! → 106, not 11 (it lasts until someone changes an option or the node) nor 7 (the
//! network config the runtime passed is fine); the addresses a pod's
//! `ipam.podnet.io/ip-addresses` annotation asks for refused (malformed, taken,
//! outside the node's ranges, in no pool: `address-*` reasons) → 107, not 7 (the
//! fault is the Pod's, not the network config's) nor 11 (it lasts until the Pod
//! or the holder changes; the kubelet retries the sandbox anyway), and so is a
//! sticky address refused (`sticky-refused`); a sticky address not on the node
//! yet (`sticky-waiting`, 503) → 11; any other refusal → 100.
//! The daemon's own text is kept; the code follows its reason, never its wording.

use crate::api::client::ClientError;
use crate::api::models::FailureReason;
use crate::cni::CniError;

/// What an allocation failure says first (Cilium's wording); the daemon has
/// already recorded such failures itself (`report` tells them apart by it).
pub const ALLOCATE_CONTEXT: &str = "unable to allocate IP via local podnet daemon";

/// Maps a failed daemon call made while doing `what`.
pub fn to_cni(e: ClientError, what: &str) -> CniError {
    let text = format!("{what}: {e}");
    match &e {
        _ if e.is_unavailable() => CniError::try_again_later(text),
        ClientError::Status {
            reason: Some(FailureReason::RangeFull),
            ..
        } => CniError::address_exhausted(text),
        ClientError::Status {
            reason: Some(FailureReason::NodeConfig),
            ..
        } => CniError::node_config_mismatch(text),
        ClientError::Status {
            reason: Some(r), ..
        } if r.is_requested_address() => CniError::requested_address_refused(text),
        _ => CniError::daemon_rejected(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes() {
        let closed = ClientError::Closed {
            socket: "/run/podnet/podnet.sock".into(),
            detail: "Connection reset by peer (os error 104)".into(),
        };
        let e = to_cni(closed, "reading the daemon's configuration");
        assert_eq!(e.code, CniError::TRY_AGAIN_LATER);
        assert!(
            e.msg.starts_with("reading the daemon's configuration: ")
                && e.msg.contains("closed the connection")
                && e.msg.contains("try again"),
            "{}",
            e.msg
        );
        let full = ClientError::Status {
            status: 502,
            message: "range is full: no free address".into(),
            reason: Some(FailureReason::RangeFull),
            config: None,
        };
        assert_eq!(to_cni(full, "x").code, CniError::ADDRESS_EXHAUSTED);
        // The wording alone does not make a full range.
        let worded = ClientError::Status {
            status: 502,
            message: "range is full: but no reason given".into(),
            reason: None,
            config: None,
        };
        assert_eq!(to_cni(worded, "x").code, CniError::DAEMON_REJECTED);
        let journal = ClientError::Status {
            status: 503,
            message: "cannot record the change durably".into(),
            reason: Some(FailureReason::JournalUnavailable),
            config: None,
        };
        assert_eq!(to_cni(journal, "x").code, CniError::TRY_AGAIN_LATER);
        let misfit = ClientError::Status {
            status: 502,
            message: "this node's podnet configuration does not fit the node: enable-ipv6 ..."
                .into(),
            reason: Some(FailureReason::NodeConfig),
            config: None,
        };
        let e = to_cni(misfit, "allocating");
        assert_eq!(e.code, CniError::NODE_CONFIG_MISMATCH);
        assert!(e.msg.contains("enable-ipv6"), "{}", e.msg);
        for reason in [
            FailureReason::AddressAnnotation,
            FailureReason::AddressTaken,
            FailureReason::AddressOutsideNode,
            FailureReason::AddressNotInPool,
            FailureReason::StickyRefused,
        ] {
            let pinned = ClientError::Status {
                status: 409,
                message: "10.0.1.5 is taken by pod default/web-0".into(),
                reason: Some(reason),
                config: None,
            };
            let e = to_cni(pinned, "allocating");
            assert_eq!(e.code, CniError::REQUESTED_ADDRESS_REFUSED, "{reason:?}");
            assert!(e.msg.contains("default/web-0"), "{}", e.msg);
        }
        // A sticky address still on the node its pod left, after the wait.
        let moving = ClientError::Status {
            status: 503,
            message:
                "pod db/web-0: sticky address of pool web: the address is still on another node"
                    .into(),
            reason: Some(FailureReason::StickyWaiting),
            config: None,
        };
        assert_eq!(to_cni(moving, "x").code, CniError::TRY_AGAIN_LATER);
        let refused = ClientError::Status {
            status: 400,
            message: "invalid owner".into(),
            reason: None,
            config: None,
        };
        let e = to_cni(refused, "x");
        assert_eq!((e.code, e.msg.as_str()), (100, "x: invalid owner"));
    }
}
