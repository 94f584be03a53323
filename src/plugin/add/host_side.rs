//! The host end of the pod's link: its IPv6 sysctls, then in one datagram no
//! `rp_filter`, up (with podnet's marker), the route to the pod and the IPv6
//! router's proxy entry.

use crate::cni::CniError;
use crate::datapath::{RouteSpec, set_sysctl};

use super::super::datapath_errors::dp;
use super::netlink_batch::{Step, in_order};
use super::plan::FamilyPlan;
use super::sides::Sides;

/// Host side: its IPv6 sysctls (or only `disable_ipv6` when `ipv4_only`), then
/// in one datagram no `rp_filter` (the daemon's nftables source check verifies
/// the pod's source addresses, both families; set by netlink, not through
/// /proc), up (with podnet's `marker` in its alias, set in the same request), a
/// /32 (/128) route to the pod, and an NDP proxy entry so the pod can resolve
/// the IPv6 router address.
pub(super) fn set_up(
    sides: &Sides<'_>,
    host_index: u32,
    plans: &[FamilyPlan],
    ipv4_only: bool,
    marker: Option<String>,
) -> Result<(), CniError> {
    let (host_sock, host_name) = (&sides.host_sock, sides.host_name.as_str());
    if !ipv4_only {
        // No DAD on the host side: while its link-local address is tentative the
        // kernel sends no neighbour solicitation to the pod at all.
        set_sysctl(&format!("net/ipv6/conf/{host_name}/accept_dad"), "0")
            .map_err(dp("host accept_dad"))?;
        // Answer the pod's router solicitations at once (the default proxy
        // delay is up to 0.8 s per resolution).
        set_sysctl(&format!("net/ipv6/neigh/{host_name}/proxy_delay"), "0")
            .map_err(dp("host proxy_delay"))?;
    } else {
        disable_ipv6(host_name)?;
    }
    let routes: Vec<RouteSpec> = plans
        .iter()
        .map(|p| RouteSpec::link(p.host_net(), host_index))
        .collect();
    let up = match &marker {
        Some(alias) => host_sock.link_up_with_alias_request(host_index, alias),
        None => host_sock.link_up_request(host_index),
    };
    let mut steps = vec![
        Step::new(host_sock.rp_filter_request(host_index, 0), "host rp_filter"),
        Step::new(up, "bringing up the host side"),
    ];
    for (p, route) in plans.iter().zip(&routes) {
        let req = host_sock
            .replace_route_request(route)
            .map_err(dp("adding the host route to the pod"))?;
        steps.push(Step::new(req, "adding the host route to the pod"));
        if p.ip.is_ipv6() {
            steps.push(Step::new(
                host_sock.add_proxy_neighbour_request(host_index, p.router),
                "adding the IPv6 router proxy entry",
            ));
        }
    }
    in_order(host_sock, steps, "configuring the host side")
}

/// An IPv4-only pod gets no IPv6 on its host link either, set before the link
/// goes up (within the plugin's turn, `add_turn`). Otherwise every host link gets
/// a link-local address, an fe80::/64 and an ff00::/8 route and MLD traffic, and
/// that kernel work grows with the pods on the node: IPv6 route lookups walk the
/// fe80::/64 routes of every link and each link deletion walks the whole IPv6
/// table (BENCHMARKS.md "Flat cost"). A kernel without IPv6 has no such sysctl:
/// nothing to disable.
fn disable_ipv6(host_name: &str) -> Result<(), CniError> {
    match set_sysctl(&format!("net/ipv6/conf/{host_name}/disable_ipv6"), "1") {
        Err(e) if !e.is_not_found() => Err(dp("disabling IPv6 on the host side")(e)),
        _ => Ok(()),
    }
}
