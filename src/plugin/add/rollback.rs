//! Rolling a failed ADD back after its allocation.

use crate::api::client::Client;
use crate::api::models::EndpointBatchDeleteRequest;
use crate::datapath::{RuleSpec, ifb_ifname};

use super::super::shaping;
use super::sides::Sides;

/// Rolls an ADD back: the link pair goes with its host side, the pod's IFB
/// device (its bandwidth limit) with it, the ENI rules this attempt added are removed, and the addresses are released through the daemon.
/// Failures are logged; the expiration timer is the last resort for an address
/// that could not be released, and the daemon's next start removes rules of
/// addresses no pod holds.
pub(super) fn undo(client: &Client, sides: &Sides<'_>, added_rules: &[RuleSpec], cid: &str) {
    let (host_sock, host_name) = (&sides.host_sock, sides.host_name.as_str());
    if let Err(e) = host_sock.delete_link_by_name(host_name) {
        tracing::warn!(error = %e, "rollback: could not delete {host_name}");
    }
    if let Err(e) = shaping::remove_ifb(host_sock, &ifb_ifname(cid, sides.ifname)) {
        tracing::warn!(error = %e.msg, "rollback: could not delete the pod's IFB device");
    }
    for rule in added_rules {
        match host_sock.delete_rule(rule) {
            Err(e) if !e.is_not_found() => {
                tracing::warn!(error = %e, "rollback: could not remove an ENI rule");
            }
            _ => {}
        }
    }
    let req = EndpointBatchDeleteRequest {
        container_id: cid.into(),
        container_interface_name: sides.ifname.into(),
        ..Default::default()
    };
    if let Err(e) = client.delete_endpoints(&req) {
        tracing::warn!(error = %e, "rollback: could not release the addresses; they expire on their own");
    }
}
