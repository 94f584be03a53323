//! podnet datapath: the kernel side of pod networking without eBPF, over
//! synchronous rtnetlink (netlink-packet-route + netlink-sys, no tokio).
//!
//! * [`NetlinkSocket`] — a blocking NETLINK_ROUTE socket, bound to the netns it
//!   was created in; per-object operations are methods on it (links, addresses,
//!   routes, proxy neighbours, rules, the VXLAN device and its FDB and
//!   neighbour entries, and the qdiscs, filters and IFB device of a pod's
//!   bandwidth limit: `tc`, with the TBF's attributes in `tbf`).
//! * [`NetNs`] / [`in_netns`] — namespace handles and "run this on a
//!   short-lived thread inside that netns" (the caller's thread never switches).
//! * [`write_sysctl`] / [`set_sysctl`] / [`read_sysctl`] — act on the calling
//!   thread's netns.
//! * [`host_ifname`] — Cilium's `lxc<12 hex>` host-side veth name.
//!
//! Usable from the short-lived CNI plugin process and from dedicated
//! std::threads of the daemon (never `setns` on an async/pooled thread).
//! Every failure is a [`DatapathError`] naming the operation and object, with
//! the errno available through [`DatapathError::errno`].

mod addr;
mod eni;
mod error;
pub mod l2_responder;
mod link;
pub mod link_marker;
mod names;
mod neigh;
mod netkit;
mod netns;
pub mod nflog;
mod route;
mod rule;
mod socket;
mod sysctl;
mod tbf;
mod tc;
mod vxlan;

#[cfg(test)]
pub(crate) mod tests;

pub use eni::{RULE_PRIORITY_EGRESS, RULE_PRIORITY_INGRESS, eni_rules, eni_table, is_pod_rule};
pub use error::{DatapathError, Result};
pub use link::{LOOPBACK_INDEX, LinkInfo, VethSpec};
pub use names::{
    HOST_LINK_PREFIX, IFB_ALIAS, IFB_LINK_PREFIX, IFNAME_MAX_LEN, format_mac, host_ifname,
    host_link_of_ifb, ifb_ifname, ifb_of_host_link, random_mac, validate_ifname,
};
pub use netkit::{NetkitMode, NetkitSpec, NetkitSupport, build_netkit_request, probe_netkit};
pub use netns::{NetNs, NetnsGuard, THREAD_SELF_NETNS, enter_netns, in_netns};
pub use route::{
    IpFamily, RouteInfo, RouteSpec, SCOPE_HOST, SCOPE_LINK, SCOPE_UNIVERSE, TABLE_LOCAL, TABLE_MAIN,
};
pub use rule::RuleSpec;
pub use socket::{NetlinkSocket, Request};
pub use sysctl::{read_sysctl, set_sysctl, write_sysctl, write_sysctl_in};
pub use tbf::{LATENCY_MS, TbfParams, TbfReading};
pub use tc::{QdiscInfo, TBF_HANDLE};
pub use vxlan::{L2Entry, VxlanSpec};

/// Whether the kernel knows links of `kind` (see [`NetlinkSocket::has_link_kind`]),
/// checked in the calling thread's netns.
pub fn kernel_has_link_kind(kind: &str) -> Result<bool> {
    NetlinkSocket::new()?.has_link_kind(kind)
}
