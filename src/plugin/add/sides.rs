//! The two sides of the pod's link and how the plugin reaches each: the
//! runtime's netns (where the plugin's thread is, and the host end `lxc…`) and the
//! pod's (its netns, its interface `CNI_IFNAME`), a netlink socket in each, and
//! the thread's visits into the pod's netns (`in_pod`).

use std::path::Path;

use crate::cni::CniError;
use crate::datapath::{
    DatapathError, NetNs, NetlinkSocket, enter_netns, host_ifname, write_sysctl,
};

use super::super::attachment::open_netns;
use super::super::datapath_errors::dp;

/// Where the pod's link goes, opened before the allocation.
pub(super) struct Sides<'a> {
    pub netns: NetNs,
    pub netns_path: &'a Path,
    /// A socket in the runtime's netns.
    pub host_sock: NetlinkSocket,
    /// A socket in the pod's netns.
    pub pod_sock: NetlinkSocket,
    /// The host end's name (`lxc…`, Cilium's rule).
    pub host_name: String,
    /// The pod end's name (`CNI_IFNAME`).
    pub ifname: &'a str,
}

impl<'a> Sides<'a> {
    /// Opens the pod's netns and a netlink socket on each side. The pod's socket
    /// is opened before the allocation, so an interface of another plugin is
    /// refused (104) before any address is taken.
    pub fn open(
        netns_path: &'a Path,
        container_id: &str,
        ifname: &'a str,
    ) -> Result<Self, CniError> {
        let netns = open_netns(netns_path)?;
        let host_sock =
            NetlinkSocket::new().map_err(dp("opening netlink in the runtime's namespace"))?;
        let pod_sock = in_pod(
            &netns,
            &host_sock,
            "opening netlink in the pod's namespace",
            NetlinkSocket::new,
        )?;
        Ok(Sides {
            netns,
            netns_path,
            host_sock,
            pod_sock,
            host_name: host_ifname(container_id, ifname),
            ifname,
        })
    }

    /// Whether the pod already has an interface named `ifname` (one ioctl).
    pub fn pod_has_ifname(&self) -> Result<bool, CniError> {
        Ok(self
            .pod_sock
            .link_index(self.ifname)
            .map_err(dp("looking up the pod interface"))?
            .is_some())
    }

    /// The pod's IPv6 defaults, once the daemon's answer says IPv6 is on: IPv6 on,
    /// and no DAD for interfaces created from now on (so `eth0`, created next,
    /// answers at once).
    pub fn set_pod_ipv6_defaults(&self) -> Result<(), CniError> {
        in_pod(
            &self.netns,
            &self.host_sock,
            "setting the pod's IPv6 defaults",
            || {
                write_sysctl("net/ipv6/conf/all/disable_ipv6", "0")?;
                write_sysctl("net/ipv6/conf/default/accept_dad", "0").map(|_| ())
            },
        )
    }
}

/// Runs `f` with this (the plugin's only) thread in the pod's netns, and comes
/// back to the netns of `host_sock` (the runtime's, where the thread is); `what`
/// names `f`'s work in its error.
fn in_pod<T>(
    netns: &NetNs,
    host_sock: &NetlinkSocket,
    what: &'static str,
    f: impl FnOnce() -> Result<T, DatapathError>,
) -> Result<T, CniError> {
    // From the socket, else (a kernel before 4.9) from /proc.
    let home = host_sock
        .netns()
        .or_else(|_| NetNs::current())
        .map_err(dp("opening the runtime's network namespace"))?;
    let guard = enter_netns(netns, home).map_err(dp("entering the pod's network namespace"))?;
    let done = f();
    guard
        .leave()
        .map_err(dp("leaving the pod's network namespace"))?;
    done.map_err(dp(what))
}
