//! The pod end of the link: `lo` and the interface up, and per family the
//! address, a link route to the router and the default route via it, in one
//! datagram.

use crate::cni::CniError;
use crate::datapath::{LOOPBACK_INDEX, RouteSpec};

use super::super::datapath_errors::dp;
use super::netlink_batch::{Step, in_order};
use super::plan::FamilyPlan;
use super::sides::Sides;

/// Pod side: `lo` and the interface up (its IPv6 sysctls came from the
/// namespace's defaults set before it was created), then per family the /32
/// (/128), a link route to the router and a default route via it (with the
/// daemon's `route_mtu`). All in one datagram, answered in order; the first
/// failure is the error, with what it was doing.
pub(super) fn set_up(
    sides: &Sides<'_>,
    pod_index: u32,
    plans: &[FamilyPlan],
    route_mtu: Option<u32>,
) -> Result<(), CniError> {
    let sock = &sides.pod_sock;
    let routes: Vec<[RouteSpec; 2]> = plans
        .iter()
        .map(|p| pod_routes(p, pod_index, route_mtu))
        .collect();
    let mut steps = vec![
        Step::new(
            sock.link_up_request(LOOPBACK_INDEX),
            "bringing up lo in the pod",
        ),
        Step::new(
            sock.link_up_request(pod_index),
            "bringing up the pod interface",
        ),
    ];
    for (p, routes) in plans.iter().zip(&routes) {
        steps.push(Step::new(
            sock.add_address_request(pod_index, p.host_net(), p.ip.is_ipv6()),
            "adding the pod address",
        ));
        for r in routes {
            let req = sock
                .add_route_request(r)
                .map_err(dp("adding a pod route"))?;
            steps.push(Step {
                exists_ok: true,
                ..Step::new(req, "adding a pod route")
            });
        }
    }
    in_order(sock, steps, "configuring the pod's interface")
}

/// The pod's routes of one family: a link route to the router, and the default
/// route via it (with the daemon's route MTU).
fn pod_routes(p: &FamilyPlan, pod_index: u32, route_mtu: Option<u32>) -> [RouteSpec; 2] {
    [
        RouteSpec::link(p.router_net(), pod_index),
        RouteSpec {
            dst: p.default_net(),
            gateway: Some(p.router),
            oif: pod_index,
            scope_link: false,
            mtu: route_mtu,
            table: None,
            priority: None,
            onlink: false,
            prefsrc: None,
            protocol: None,
        },
    ]
}
