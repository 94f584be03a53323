//! CHECK: the pod interface, its addresses and routes must match `prevResult`; the
//! daemon must know the attachment and agree on its addresses; the host side link
//! and its route to the pod must exist; with `runtimeConfig.bandwidth` and the
//! daemon's bandwidth manager, the pod's qdiscs, redirect and IFB device must
//! shape it as asked (`shaping::check`). The first difference is reported (103).

use std::net::IpAddr;
use std::path::Path;

use crate::api::client::Client;
use crate::cni::{CniEnv, CniError, CniResult, IpConfig, NetConf, bandwidth};
use crate::datapath::{IpFamily, NetlinkSocket, TABLE_MAIN, host_ifname, ifb_ifname};

use super::attachment;
use super::daemon_errors::to_cni;
use super::datapath_errors::dp;
use super::shaping;

pub fn check(env: &CniEnv, conf: &NetConf, client: &Client) -> Result<(), CniError> {
    let (cid, ifname, netns_path) = attachment::ids(env)?;
    let prev = conf
        .prev_result
        .as_ref()
        .ok_or_else(|| CniError::invalid_network_config("CHECK needs the prevResult of the ADD"))?;
    let recorded = daemon_addresses(client, cid, ifname)?;
    let expected = expected_addresses(prev, cid, ifname, &recorded)?;
    let limits = bandwidth::parse(&conf.raw)?;
    check_pod_side(prev, netns_path, ifname, &expected)?;
    let (host_sock, host_index) = check_host_side(cid, ifname, &recorded)?;
    match limits {
        Some(l) if bandwidth_manager(client)? => {
            let host_name = host_ifname(cid, ifname);
            let ifb = ifb_ifname(cid, ifname);
            shaping::check(&host_sock, host_index, &host_name, &ifb, &l)
        }
        _ => Ok(()),
    }
}

/// Whether the daemon shapes `runtimeConfig.bandwidth` (asked only when a
/// limit is).
fn bandwidth_manager(client: &Client) -> Result<bool, CniError> {
    client
        .config()
        .map(|c| c.status.bandwidth_manager.enabled)
        .map_err(|e| to_cni(e, "reading the daemon's configuration"))
}

/// The addresses the daemon records for the attachment; a mismatch if it has none.
fn daemon_addresses(client: &Client, cid: &str, ifname: &str) -> Result<Vec<IpAddr>, CniError> {
    let ep = client.endpoint(cid, ifname).map_err(|e| match e.status() {
        Some(404) => {
            CniError::check_mismatch(format!("podnet daemon has no endpoint for {cid}/{ifname}"))
        }
        _ => to_cni(e, "asking the daemon about the endpoint"),
    })?;
    Ok([&ep.addressing.ipv4, &ep.addressing.ipv6]
        .into_iter()
        .filter_map(|s| s.parse().ok())
        .collect())
}

/// The pod interface's addresses in prevResult, each of which the daemon must record.
fn expected_addresses<'a>(
    prev: &'a CniResult,
    cid: &str,
    ifname: &str,
    recorded: &[IpAddr],
) -> Result<Vec<&'a IpConfig>, CniError> {
    // Which interface index of prevResult is the pod's.
    let pod_idx = prev
        .interfaces
        .iter()
        .position(|i| i.name == *ifname && i.sandbox.is_some());
    let expected: Vec<_> = prev
        .ips
        .iter()
        .filter(|ip| ip.interface.is_none() || ip.interface == pod_idx)
        .collect();
    for ip in &expected {
        if !recorded.contains(&ip.address.addr()) {
            return Err(CniError::check_mismatch(format!(
                "prevResult lists {} but the daemon records {:?} for {cid}/{ifname}",
                ip.address, recorded
            )));
        }
    }
    Ok(expected)
}

/// In the pod's namespace: the interface is up with the expected addresses and prevResult's routes.
fn check_pod_side(
    prev: &CniResult,
    netns_path: &Path,
    ifname: &str,
    expected: &[&IpConfig],
) -> Result<(), CniError> {
    let netns = attachment::open_netns(netns_path)?;
    let pod_sock =
        NetlinkSocket::new_in(&netns).map_err(dp("opening netlink in the pod's namespace"))?;
    let link = pod_sock
        .link_by_name(ifname)
        .map_err(dp("looking up the pod interface"))?
        .ok_or_else(|| {
            CniError::check_mismatch(format!(
                "cannot find container link {ifname} in {}",
                netns_path.display()
            ))
        })?;
    if !link.up {
        return Err(CniError::check_mismatch(format!(
            "container link {ifname} is down"
        )));
    }
    let addrs = pod_sock
        .list_addresses(link.index)
        .map_err(dp("listing pod addresses"))?;
    for ip in expected {
        if !addrs.contains(&ip.address) {
            return Err(CniError::check_mismatch(format!(
                "expected ip {} on interface {ifname}",
                ip.address
            )));
        }
    }
    for route in &prev.routes {
        let present = pod_sock
            .list_routes(IpFamily::of(&route.dst.addr()), Some(TABLE_MAIN))
            .map_err(dp("listing pod routes"))?
            .iter()
            .any(|r| r.dst == route.dst && r.gateway == route.gw);
        if !present {
            let via = route.gw.map(|g| format!(" via {g}")).unwrap_or_default();
            return Err(CniError::check_mismatch(format!(
                "route {}{via} is missing from {} in {}",
                route.dst,
                ifname,
                netns_path.display()
            )));
        }
    }
    Ok(())
}

/// In the runtime's namespace: the host side link exists and routes each recorded
/// address to it. Returns the socket and the link's index.
fn check_host_side(
    cid: &str,
    ifname: &str,
    recorded: &[IpAddr],
) -> Result<(NetlinkSocket, u32), CniError> {
    let host_sock =
        NetlinkSocket::new().map_err(dp("opening netlink in the runtime's namespace"))?;
    let host_name = host_ifname(cid, ifname);
    let host = host_sock
        .link_by_name(&host_name)
        .map_err(dp("looking up the host side"))?
        .ok_or_else(|| {
            CniError::check_mismatch(format!(
                "host side {host_name} of {cid}/{ifname} is missing"
            ))
        })?;
    for ip in recorded {
        let routed = host_sock
            .list_routes(IpFamily::of(ip), Some(TABLE_MAIN))
            .map_err(dp("listing host routes"))?
            .iter()
            .any(|r| {
                r.dst.addr() == *ip
                    && r.dst.prefix_len() == r.dst.max_prefix_len()
                    && r.oif == Some(host.index)
            });
        if !routed {
            return Err(CniError::check_mismatch(format!(
                "host route {ip} dev {host_name} is missing"
            )));
        }
    }
    Ok((host_sock, host.index))
}
