//! The daemon's own devices in the node namespace: the router device pair
//! (`podnet_host`, the analog of `cilium_host`, carrying the router IPs, with its
//! twin `podnet_net`), the forwarding and NDP-proxy sysctls pods need, removal
//! of garbage-collected attachments' host links and of the IFB devices of pods
//! that are gone (their bandwidth limits), and the link names the leak check weighs.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::Path;

use ipnet::IpNet;

use super::device_error::{DeviceError, failed};
use super::state::{KernelLink, KernelView, StaleLink, TeardownLink};
use crate::datapath::link_marker::LinkMarker;
use crate::datapath::{
    IFB_ALIAS, IpFamily, NetNs, NetlinkSocket, TABLE_MAIN, VethSpec, host_ifname, host_link_of_ifb,
    ifb_ifname, ifb_of_host_link, write_sysctl_in,
};
use crate::datapath::{RULE_PRIORITY_EGRESS, RULE_PRIORITY_INGRESS, is_pod_rule};

/// The router device that carries the node's router IPs.
pub const ROUTER_DEVICE: &str = "podnet_host";
/// The other end of the router pair.
pub const ROUTER_PEER: &str = "podnet_net";

/// Creates (or reuses) the router pair, puts the router IPs on it and enables
/// forwarding (the sysctls under `procfs`). Idempotent: a restarted daemon finds
/// the pair in place.
pub fn setup_router(routers: &[IpAddr], mtu: u32, procfs: &Path) -> Result<(), DeviceError> {
    let sock = NetlinkSocket::new().map_err(failed("router device"))?;
    let host = match sock
        .link_by_name(ROUTER_DEVICE)
        .map_err(failed("router device"))?
    {
        Some(l) => l,
        None => {
            let here = NetNs::current().map_err(failed("router device"))?;
            sock.create_veth_pair(&VethSpec {
                host_name: ROUTER_DEVICE,
                host_mac: None,
                peer_name: ROUTER_PEER,
                peer_mac: None,
                mtu,
                peer_netns: &here,
                txqlen: None,
            })
            .map_err(failed(format!(
                "creating the router device {ROUTER_DEVICE}"
            )))?
        }
    };
    if let Some(peer) = sock
        .link_by_name(ROUTER_PEER)
        .map_err(failed("router device"))?
    {
        sock.set_link_up(peer.index)
            .map_err(failed("router device"))?;
    }
    sock.set_link_up(host.index)
        .map_err(failed("router device"))?;
    let present = sock
        .list_addresses(host.index)
        .map_err(failed("router device"))?;
    for ip in routers {
        let net = IpNet::from(*ip);
        if !present.contains(&net) {
            sock.add_address(host.index, net, ip.is_ipv6())
                .map_err(failed(format!("putting router IP {ip} on {ROUTER_DEVICE}")))?;
        }
    }
    // Addresses a previous run left that are no longer router IPs.
    for net in present {
        if net.prefix_len() == net.max_prefix_len()
            && !routers.contains(&net.addr())
            && !is_link_local(&net.addr())
        {
            tracing::info!(address = %net, "removing a stale router address");
            if let Err(e) = sock.delete_address(host.index, net) {
                tracing::warn!(address = %net, error = %e, "could not remove a stale router address");
            }
        }
    }
    let sysctl =
        |k: &str, v: &str| write_sysctl_in(procfs, k, v).map_err(failed(format!("sysctl {k}={v}")));
    if routers.iter().any(|r| r.is_ipv4()) {
        sysctl("net/ipv4/ip_forward", "1")?;
    }
    if routers.iter().any(|r| r.is_ipv6()) {
        sysctl("net/ipv6/conf/all/forwarding", "1")?;
        sysctl("net/ipv6/conf/all/proxy_ndp", "1")?;
    }
    Ok(())
}

fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// The MTU of the device that carries the default route, if there is one.
pub fn default_route_mtu() -> Option<u32> {
    let sock = NetlinkSocket::new().ok()?;
    let routes = sock.list_routes(IpFamily::V4, Some(TABLE_MAIN)).ok()?;
    let oif = routes.iter().find(|r| r.dst.prefix_len() == 0)?.oif?;
    sock.link_by_index(oif)
        .ok()?
        .map(|l| l.mtu)
        .filter(|m| *m > 0)
}

/// The host-side links (`lxc…`) of this namespace and the /32 and /128 routes of
/// the main table through each.
pub fn kernel_view() -> Result<KernelView, DeviceError> {
    let sock = NetlinkSocket::new().map_err(failed("reading host links"))?;
    let links = sock.list_links().map_err(failed("reading host links"))?;
    let mut routes = sock
        .list_routes(IpFamily::V4, Some(TABLE_MAIN))
        .map_err(failed("reading host routes"))?;
    routes.extend(
        sock.list_routes(IpFamily::V6, Some(TABLE_MAIN))
            .map_err(failed("reading host routes"))?,
    );
    let mut view = KernelView::default();
    for link in links.into_iter().filter(|l| l.name.starts_with("lxc")) {
        let routed = routes
            .iter()
            .filter(|r| r.oif == Some(link.index) && r.dst.prefix_len() == r.dst.max_prefix_len())
            .map(|r| r.dst.addr())
            .collect();
        view.links.push(KernelLink {
            marker: link.alias.as_deref().and_then(LinkMarker::parse),
            name: link.name,
            routed,
        });
    }
    Ok(view)
}

/// The names of the links in this namespace: the leak check's evidence that a
/// sandbox is gone is that its host link is not among them.
pub fn link_names() -> Result<BTreeSet<String>, DeviceError> {
    let sock = NetlinkSocket::new().map_err(failed("reading host links"))?;
    let links = sock.list_links().map_err(failed("reading host links"))?;
    Ok(links.into_iter().map(|l| l.name).collect())
}

/// The addresses on the router device, if it exists (hints for a rebuild).
pub fn router_addresses() -> Vec<IpAddr> {
    let Ok(sock) = NetlinkSocket::new() else {
        return Vec::new();
    };
    let Ok(Some(link)) = sock.link_by_name(ROUTER_DEVICE) else {
        return Vec::new();
    };
    sock.list_addresses(link.index)
        .unwrap_or_default()
        .into_iter()
        .filter(|n| n.prefix_len() == n.max_prefix_len() && !is_link_local(&n.addr()))
        .map(|n| n.addr())
        .collect()
}

/// Deletes the given host links (orphans found at start).
pub fn delete_links(names: &[String]) {
    let Ok(sock) = NetlinkSocket::new() else {
        return;
    };
    for name in names {
        if let Err(e) = sock.delete_link_by_name(name) {
            tracing::warn!(link = %name, error = %e, "could not remove an orphan host link");
        }
    }
}

/// Removes the ENI-class rules (`to <ip> lookup main`, `from <ip> lookup 10+n`) of
/// addresses `stale` says are no longer in use.
pub fn prune_pod_rules(stale: impl Fn(IpAddr) -> bool) {
    let Ok(sock) = NetlinkSocket::new() else {
        return;
    };
    for family in [IpFamily::V4, IpFamily::V6] {
        for rule in sock.list_rules(family).unwrap_or_default() {
            let ip = match (rule.priority, rule.src, rule.dst) {
                (RULE_PRIORITY_INGRESS, None, Some(d)) => d.addr(),
                (RULE_PRIORITY_EGRESS, Some(s), None) => s.addr(),
                _ => continue,
            };
            if is_pod_rule(&rule, ip)
                && stale(ip)
                && let Err(e) = sock.delete_rule(&rule)
            {
                tracing::warn!(error = %e, ip = %ip, "could not remove a pod rule");
            }
        }
    }
}

/// Deletes links by index, each only if it still has its recorded name (an index
/// reused by a newer link is left alone). Missing links count as deleted.
pub fn delete_links_checked(links: &[TeardownLink]) -> Result<(), DeviceError> {
    let sock = NetlinkSocket::new().map_err(failed("link teardown"))?;
    for l in links {
        match sock.link_by_index(l.index) {
            Ok(Some(found)) if found.name == l.name => match sock.delete_link(l.index) {
                Ok(()) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(failed(format!("deleting {} (#{})", l.name, l.index))(e)),
            },
            Ok(_) => {}
            Err(e) => return Err(failed(format!("looking up {} (#{})", l.name, l.index))(e)),
        }
    }
    Ok(())
}

/// The podnet marker of the host link `name`: none when the link is gone or
/// carries none; an error when netlink could not be asked.
pub fn host_link_marker(name: &str) -> Result<Option<LinkMarker>, DeviceError> {
    let link = NetlinkSocket::new()
        .and_then(|sock| sock.link_by_name(name))
        .map_err(failed(format!("looking up host link {name}")))?;
    Ok(link.and_then(|l| l.alias.as_deref().and_then(LinkMarker::parse)))
}

/// Removes the host link of an attachment whose address expired, if its marker
/// proves it was made under this journal no later than the expiry; a link without
/// that proof (a newer ADD's, or another program's) is left alone.
pub fn remove_stale_link(stale: &StaleLink) {
    let found = NetlinkSocket::new().and_then(|sock| {
        let link = sock.link_by_name(&stale.name)?;
        Ok((sock, link))
    });
    let (sock, link) = match found {
        Ok((sock, Some(link))) => (sock, link),
        Ok((_, None)) => return,
        Err(e) => {
            tracing::warn!(link = %stale.name, error = %e, "cannot look up the host link of an expired address");
            return;
        }
    };
    let marker = link.alias.as_deref().and_then(LinkMarker::parse);
    let proven = marker.as_ref().is_some_and(|m| {
        m.journal.journal_id == stale.made_by.journal_id && m.journal.seq <= stale.made_by.seq
    });
    if !proven {
        tracing::info!(link = %stale.name, alias = ?link.alias, "the expired attachment's host link is not provably the one its address was handed out for: leaving it alone");
        return;
    }
    match sock.delete_link(link.index) {
        Ok(()) => {
            tracing::info!(link = %stale.name, "removed the host link of an expired address (its ADD never finished)");
            // Its IFB device (a bandwidth limit), which the link does not take along.
            if let Some(ifb) = ifb_of_host_link(&stale.name)
                && let Err(e) = sock.delete_link_by_name(&ifb)
            {
                tracing::warn!(link = %ifb, error = %e, "could not remove the IFB device of an expired address");
            }
        }
        Err(e) if e.is_not_found() => {}
        Err(e) => {
            tracing::warn!(link = %stale.name, error = %e, "could not remove the host link of an expired address")
        }
    }
}

/// Deletes the host-side links and IFB devices of the given attachments where
/// they still exist, then every podnet IFB device whose pod's host link is gone
/// ([`remove_orphan_ifbs`]).
pub fn remove_host_links(attachments: &[(String, String)]) {
    let sock = match NetlinkSocket::new() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot open netlink to remove host links");
            return;
        }
    };
    for (cid, ifname) in attachments {
        for name in [host_ifname(cid, ifname), ifb_ifname(cid, ifname)] {
            match sock.delete_link_by_name(&name) {
                Ok(true) => {
                    tracing::info!(link = %name, container = ?cid, "removed a link of a collected attachment")
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(link = %name, error = %e, "could not remove a link"),
            }
        }
    }
    remove_orphan_ifbs(&sock);
}

/// Deletes podnet's IFB devices (kind `ifb`, named `ifb` + a host link's hash,
/// with podnet's alias) whose pod's host link `lxc…` is gone: the pod's netns
/// went without a DEL, or a DEL's teardown was lost. An ADD creates the host
/// link before the IFB, so a live ADD's IFB always has its twin.
pub fn remove_orphan_ifbs(sock: &NetlinkSocket) {
    let links = match sock.list_links() {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list links to remove orphan IFB devices");
            return;
        }
    };
    let names: BTreeSet<&str> = links.iter().map(|l| l.name.as_str()).collect();
    for l in &links {
        let orphan = l.kind.as_deref() == Some("ifb")
            && l.alias.as_deref() == Some(IFB_ALIAS)
            && host_link_of_ifb(&l.name).is_some_and(|host| !names.contains(host.as_str()));
        if !orphan {
            continue;
        }
        match sock.delete_link(l.index) {
            Ok(()) => {
                tracing::info!(link = %l.name, "removed the IFB device of a pod that is gone")
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                tracing::warn!(link = %l.name, error = %e, "could not remove an orphan IFB device")
            }
        }
    }
}
