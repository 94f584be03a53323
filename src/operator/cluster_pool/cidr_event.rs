//! An Event about a node's CIDRs (extra CIDRs given, released or unavailable; a
//! range on a draining pool CIDR), as the bookkeeping ([`super::cidrs`],
//! [`super::drain`]) queues it and the handler posts it on the CiliumNode; and
//! how a note lists CIDRs ([`joined`]).

use ipnet::IpNet;

/// An Event about a node's CIDRs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CidrEvent {
    pub warning: bool,
    pub reason: &'static str,
    pub note: String,
}

/// `a, b, c`.
pub(super) fn joined(cidrs: &[IpNet]) -> String {
    cidrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
