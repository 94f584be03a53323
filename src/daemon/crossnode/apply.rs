//! Makes the kernel hold a [`DatapathPlan`]: the VXLAN device, the routes podnet
//! marks with its own protocol number, the tunnel's neighbour and FDB entries, and
//! the masquerade table. Only differences are written: an entry that is already
//! right is left alone (a restarted daemon disturbs no live traffic), a missing
//! one is added, and one podnet made that the plan no longer has is removed.
//! Nothing without podnet's marks (another protocol number, another device,
//! another nftables table) is ever read for removal. The writes go in batches:
//! up to [`BATCH`] netlink requests a datagram, each acknowledged by the kernel.
//!
//! What a pass compares the plan with is the caller's choice ([`Compare`]): the
//! kernel's entries, dumped (at start and every resync, which is what puts back
//! an entry someone removed), or the plan this reconciler last applied without
//! an error, so a change of a few nodes writes only their entries and dumps
//! nothing (at 5,000 nodes each dump is 5,000 routes, FDB and neighbour entries
//! to read and parse).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ipnet::IpNet;

use super::masquerade;
use super::plan::{DatapathPlan, PlannedRoute, TunnelEndpoint};
use super::settings::{CrossNodeConfig, RoutingMode};
use super::{RESYNC, ROUTE_PROTOCOL, TUNNEL_DEVICE, TUNNEL_VNI};
use crate::datapath::{
    DatapathError, IpFamily, L2Entry, LinkInfo, NetlinkSocket, Request, RouteInfo, RouteSpec,
    TABLE_MAIN, VxlanSpec, format_mac,
};

/// Netlink requests sent in one datagram. The kernel handles them in order and
/// acknowledges each (capped ACKs: a few KiB for a full batch).
const BATCH: usize = 128;

/// What [`Reconciler::apply`] compares the plan with to find what to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compare {
    /// The kernel's entries, dumped: finds what anyone else changed.
    Kernel,
    /// The plan last applied without an error (the kernel's entries when there
    /// is none, or the tunnel device is not the one it was written to).
    LastApplied,
}

/// The routes, FDB and neighbour entries of a plan the kernel took without an
/// error, and the tunnel device they went to.
struct Applied {
    tunnel_index: Option<u32>,
    routes: BTreeSet<PlannedRoute>,
    fdb: BTreeSet<L2Entry>,
    neighbours: BTreeSet<L2Entry>,
}

/// The kernel side of the cross-node datapath; remembers the masquerade rule
/// sets it last wrote (the kernel's are not read back) and the last plan the
/// kernel took whole.
pub struct Reconciler {
    config: CrossNodeConfig,
    /// The node's device MTU (the tunnel device gets it minus the underlay's
    /// overhead).
    device_mtu: u32,
    masquerade_written: [Option<String>; 2],
    applied: Option<Applied>,
    /// Native routing: since when the plan has not wanted the tunnel device
    /// that is still there.
    tunnel_unwanted_since: Option<Instant>,
    /// How long such a device is kept at most ([`RESYNC`]; passes keep
    /// postponing the resync while the nodes keep changing).
    tunnel_linger: Duration,
}

impl Reconciler {
    pub fn new(config: CrossNodeConfig, device_mtu: u32) -> Reconciler {
        Reconciler {
            config,
            device_mtu,
            masquerade_written: [None, None],
            applied: None,
            tunnel_unwanted_since: None,
            tunnel_linger: RESYNC,
        }
    }

    /// Applies `plan`, writing what differs from `compare`, and keeps it for the
    /// next [`Compare::LastApplied`]; returns what could not be done (empty when
    /// all is in place).
    pub fn apply(&mut self, plan: DatapathPlan, compare: Compare) -> Vec<String> {
        let mut errors = Vec::new();
        let last = self.applied.take();
        let sock = match NetlinkSocket::new() {
            Ok(s) => s,
            Err(e) => return vec![format!("netlink socket: {e}")],
        };
        let tunnel = match self.tunnel_device(&sock, plan.tunnel.as_ref(), compare) {
            Ok(t) => t,
            Err(e) => {
                errors.push(e.to_string());
                None
            }
        };
        let tunnel_index = tunnel.as_ref().map(|l| l.index);
        let last =
            last.filter(|l| compare == Compare::LastApplied && l.tunnel_index == tunnel_index);
        if let Some(index) = tunnel_index {
            for fdb in [true, false] {
                let want = if fdb { &plan.fdb } else { &plan.neighbours };
                let have = match &last {
                    Some(l) => Ok(Cow::Borrowed(if fdb { &l.fdb } else { &l.neighbours })),
                    None => listed_l2(&sock, index, fdb).map(Cow::Owned),
                };
                match have {
                    Ok(have) => sync_l2(&sock, index, want, &have, fdb, &mut errors),
                    Err(e) => errors.push(e.to_string()),
                }
            }
        }
        let have = match &last {
            Some(l) => routes_of(&l.routes, tunnel_index),
            None => kernel_routes(&sock, &mut errors),
        };
        sync_routes(&sock, &plan.routes, &have, tunnel_index, &mut errors);
        let entries_written = errors.is_empty();
        let families = [
            (false, self.config.masquerade_v4, &plan.masquerade_v4),
            (true, self.config.masquerade_v6, &plan.masquerade_v6),
        ];
        for (slot, (v6, enabled, rules)) in families.into_iter().enumerate() {
            let script = masquerade::ruleset(v6, rules.as_ref());
            if self.masquerade_written[slot].as_deref() == Some(script.as_str()) {
                continue;
            }
            // Masquerade off: a table left by an earlier run is removed, but a
            // host without nft (which cannot have one) is not an error.
            if !enabled && masquerade::check_nft().is_err() {
                self.masquerade_written[slot] = Some(script);
                continue;
            }
            match masquerade::apply(&script) {
                Ok(()) => self.masquerade_written[slot] = Some(script),
                Err(e) => errors.push(e.to_string()),
            }
        }
        if entries_written {
            let DatapathPlan {
                routes,
                fdb,
                neighbours,
                ..
            } = plan;
            self.applied = Some(Applied {
                tunnel_index,
                routes,
                fdb,
                neighbours,
            });
        }
        errors
    }

    /// The tunnel device as the plan wants it: created (or re-created when its
    /// MAC, port or local address differ, so also when `--underlay-protocol`
    /// changed its family), MTU set, up. In native mode the plan wants one
    /// only while another node still tunnels (`plan`). A device no longer
    /// wanted is removed at a resync ([`Compare::Kernel`]) or once unwanted
    /// for [`RESYNC`], not at once: the node that stopped tunnelling may not
    /// have replaced its own tunnel routes yet, and its packets still arrive
    /// here meanwhile.
    fn tunnel_device(
        &mut self,
        sock: &NetlinkSocket,
        want: Option<&TunnelEndpoint>,
        compare: Compare,
    ) -> Result<Option<LinkInfo>, DatapathError> {
        let existing = sock.link_by_name(TUNNEL_DEVICE)?;
        let Some(want) = want else {
            if self.config.routing == RoutingMode::Native && existing.is_some() {
                let since = *self.tunnel_unwanted_since.get_or_insert_with(Instant::now);
                if compare == Compare::Kernel || since.elapsed() >= self.tunnel_linger {
                    self.tunnel_unwanted_since = None;
                    sock.delete_link_by_name(TUNNEL_DEVICE)?;
                    tracing::info!(
                        device = TUNNEL_DEVICE,
                        "removed the tunnel device (native routing, and no node tunnels any more)"
                    );
                    return Ok(None);
                }
            }
            return Ok(existing);
        };
        self.tunnel_unwanted_since = None;
        let mtu = self
            .device_mtu
            .saturating_sub(super::tunnel_overhead(self.config.underlay));
        let link = match existing {
            Some(l)
                if l.kind.as_deref() == Some("vxlan")
                    && l.mac == Some(want.mac)
                    && l.vxlan == Some((self.config.tunnel_port, Some(want.local))) =>
            {
                l
            }
            other => {
                if other.is_some() {
                    sock.delete_link_by_name(TUNNEL_DEVICE)?;
                }
                let l = sock.create_vxlan(&VxlanSpec {
                    name: TUNNEL_DEVICE.into(),
                    id: TUNNEL_VNI,
                    port: self.config.tunnel_port,
                    local: want.local,
                    mac: want.mac,
                    mtu,
                })?;
                tracing::info!(
                    device = TUNNEL_DEVICE,
                    local = %want.local,
                    mac = %format_mac(&want.mac),
                    port = self.config.tunnel_port,
                    "created the tunnel device"
                );
                l
            }
        };
        if link.mtu != mtu {
            sock.set_link_mtu(link.index, mtu)?;
        }
        if !link.up {
            sock.set_link_up(link.index)?;
        }
        Ok(Some(link))
    }
}

/// The FDB (`fdb`) or neighbour entries the kernel holds on the tunnel device.
fn listed_l2(
    sock: &NetlinkSocket,
    index: u32,
    fdb: bool,
) -> Result<BTreeSet<L2Entry>, DatapathError> {
    let listed = match fdb {
        true => sock.list_fdb(index),
        false => sock.list_neighbours(index),
    };
    Ok(listed?.into_iter().collect())
}

/// FDB (`fdb`) or neighbour entries of the tunnel device: add those of `want`
/// not in `have`, remove the others (the device is podnet's, so every entry on
/// it is).
fn sync_l2(
    sock: &NetlinkSocket,
    index: u32,
    want: &BTreeSet<L2Entry>,
    have: &BTreeSet<L2Entry>,
    fdb: bool,
    errors: &mut Vec<String>,
) {
    let adds = want.difference(have).map(|e| match fdb {
        true => sock.append_fdb_request(index, e),
        false => sock.replace_neighbour_request(index, e),
    });
    // A neighbour is the kernel's by its IP alone: one whose MAC changed is
    // rewritten by its replace, and a delete of the old entry would remove the
    // new one. FDB entries are one per MAC and destination, so each goes.
    let wanted_ips: BTreeSet<_> = want.iter().map(|e| e.ip).collect();
    let deletes = have
        .difference(want)
        .filter(|e| fdb || !wanted_ips.contains(&e.ip))
        .map(|e| match fdb {
            true => sock.delete_fdb_request(index, e),
            false => sock.delete_neighbour_request(index, e),
        });
    send_batched(sock, adds.chain(deletes).collect(), errors);
}

/// Sends `requests` [`BATCH`] a datagram; what the kernel refused goes to `errors`.
fn send_batched<'a>(sock: &'a NetlinkSocket, requests: Vec<Request<'a>>, errors: &mut Vec<String>) {
    let mut requests = requests.into_iter().peekable();
    while requests.peek().is_some() {
        match sock.batch(requests.by_ref().take(BATCH).collect()) {
            Ok(outcomes) => errors.extend(
                outcomes
                    .into_iter()
                    .filter_map(|r| r.err())
                    .map(|e| e.to_string()),
            ),
            Err(e) => errors.push(e.to_string()),
        }
    }
}

fn route_spec(r: &PlannedRoute, tunnel_index: Option<u32>) -> Option<RouteSpec> {
    let oif = match r.tunnel {
        true => tunnel_index?,
        false => 0,
    };
    Some(RouteSpec {
        dst: r.dst,
        gateway: Some(r.gateway),
        oif,
        scope_link: false,
        mtu: None,
        table: None,
        priority: None,
        onlink: r.tunnel,
        prefsrc: r.prefsrc,
        protocol: Some(ROUTE_PROTOCOL),
    })
}

/// Whether a listed route already is `spec` (destination, gateway, device and
/// source address: a route whose `src` changed is replaced).
fn route_matches(have: &RouteInfo, spec: &RouteSpec) -> bool {
    have.dst == spec.dst
        && have.gateway == spec.gateway
        && (spec.oif == 0 || have.oif == Some(spec.oif))
        && have.prefsrc == spec.prefsrc
}

/// podnet's routes (its protocol number) the kernel holds in the main table.
fn kernel_routes(sock: &NetlinkSocket, errors: &mut Vec<String>) -> Vec<RouteInfo> {
    let mut have: Vec<RouteInfo> = Vec::new();
    for family in [IpFamily::V4, IpFamily::V6] {
        match sock.list_routes(family, Some(TABLE_MAIN)) {
            Ok(l) => have.extend(l.into_iter().filter(|r| r.protocol == ROUTE_PROTOCOL)),
            Err(e) => errors.push(e.to_string()),
        }
    }
    have
}

/// The routes an applied plan put in the kernel, as a dump would list them.
fn routes_of(routes: &BTreeSet<PlannedRoute>, tunnel_index: Option<u32>) -> Vec<RouteInfo> {
    routes
        .iter()
        .map(|r| RouteInfo {
            dst: r.dst,
            gateway: Some(r.gateway),
            oif: if r.tunnel { tunnel_index } else { None },
            scope: 0,
            mtu: None,
            table: TABLE_MAIN,
            priority: None,
            kind: 1,
            protocol: ROUTE_PROTOCOL,
            prefsrc: r.prefsrc,
        })
        .collect()
}

/// podnet's routes in the main table: replace those of `want` that `have` does
/// not hold as wanted, delete those of `have` to CIDRs no remote node has any
/// more.
fn sync_routes(
    sock: &NetlinkSocket,
    want: &BTreeSet<PlannedRoute>,
    have: &[RouteInfo],
    tunnel_index: Option<u32>,
    errors: &mut Vec<String>,
) {
    let specs: Vec<RouteSpec> = want
        .iter()
        .filter_map(|r| route_spec(r, tunnel_index))
        .collect();
    let wanted: BTreeSet<IpNet> = specs.iter().map(|s| s.dst).collect();
    let stale: Vec<RouteSpec> = have
        .iter()
        .filter(|h| !wanted.contains(&h.dst))
        .map(|stale| RouteSpec {
            dst: stale.dst,
            gateway: stale.gateway,
            oif: stale.oif.unwrap_or(0),
            scope_link: false,
            mtu: None,
            table: None,
            priority: stale.priority,
            onlink: false,
            prefsrc: None,
            protocol: Some(ROUTE_PROTOCOL),
        })
        .collect();
    // The listed routes by destination: a pass compares each wanted route with
    // the few of its destination, not with all of them.
    let mut listed: BTreeMap<IpNet, Vec<&RouteInfo>> = BTreeMap::new();
    for h in have {
        listed.entry(h.dst).or_default().push(h);
    }
    let in_place = |spec: &RouteSpec| {
        listed
            .get(&spec.dst)
            .is_some_and(|hs| hs.iter().any(|h| route_matches(h, spec)))
    };
    let replaces = specs
        .iter()
        .filter(|spec| !in_place(spec))
        .map(|spec| sock.replace_route_request(spec));
    let deletes = stale.iter().map(|spec| sock.delete_route_request(spec));
    let mut requests = Vec::new();
    for r in replaces.chain(deletes) {
        match r {
            Ok(request) => requests.push(request),
            Err(e) => errors.push(e.to_string()),
        }
    }
    send_batched(sock, requests, errors);
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::daemon::crossnode::plan::tunnel_mac;
    use crate::daemon::crossnode::settings::TunnelProtocol;
    use crate::ipam::Family;

    fn listed(prefsrc: Option<&str>) -> RouteInfo {
        RouteInfo {
            dst: "10.1.1.0/24".parse().unwrap(),
            gateway: Some("10.1.1.1".parse().unwrap()),
            oif: Some(7),
            scope: 0,
            mtu: None,
            table: TABLE_MAIN,
            priority: None,
            kind: 1,
            protocol: ROUTE_PROTOCOL,
            prefsrc: prefsrc.map(|s| s.parse().unwrap()),
        }
    }

    #[test]
    fn a_route_with_another_source_address_is_not_in_place() {
        let planned = PlannedRoute {
            dst: "10.1.1.0/24".parse().unwrap(),
            gateway: "10.1.1.1".parse().unwrap(),
            tunnel: true,
            prefsrc: Some("10.1.0.1".parse().unwrap()),
        };
        let spec = route_spec(&planned, Some(7)).unwrap();
        assert!(route_matches(&listed(Some("10.1.0.1")), &spec));
        assert!(
            !route_matches(&listed(Some("10.1.0.9")), &spec),
            "src changed"
        );
        assert!(!route_matches(&listed(None), &spec), "src missing");
        let mut other_dev = listed(Some("10.1.0.1"));
        other_dev.oif = Some(8);
        assert!(!route_matches(&other_dev, &spec));
        let native = PlannedRoute {
            tunnel: false,
            prefsrc: None,
            ..planned
        };
        let spec = route_spec(&native, None).unwrap();
        assert!(route_matches(&listed(None), &spec));
        assert!(!route_matches(&listed(Some("10.1.0.1")), &spec));
    }

    fn endpoints(local: &str, remote: &str) -> DatapathPlan {
        let (local, remote): (IpAddr, IpAddr) = (local.parse().unwrap(), remote.parse().unwrap());
        let mac = tunnel_mac(remote);
        DatapathPlan {
            tunnel: Some(TunnelEndpoint {
                local,
                mac: tunnel_mac(local),
            }),
            fdb: BTreeSet::from([L2Entry { ip: remote, mac }]),
            ..DatapathPlan::default()
        }
    }

    /// Tunnel mode over IPv4 on port 8472, masquerade off.
    fn tunnel_config() -> CrossNodeConfig {
        CrossNodeConfig {
            routing: RoutingMode::Tunnel,
            tunnel_protocol: TunnelProtocol::Vxlan,
            tunnel_port: 8472,
            underlay: Family::V4,
            auto_direct_node_routes: false,
            native_routing_cidrs: Vec::new(),
            masquerade_v4: false,
            masquerade_v6: false,
        }
    }

    /// A tunnel plan with `n` remote nodes: a route, an FDB and a neighbour entry each.
    fn remotes(n: u32) -> DatapathPlan {
        let mut plan = endpoints("192.0.2.1", "192.0.2.2");
        plan.fdb.clear();
        for i in 0..n {
            let remote = IpAddr::from(std::net::Ipv4Addr::from(0xac10_0000 + 10 + i));
            let gateway = IpAddr::from(std::net::Ipv4Addr::from(0x0a01_0001 + (i << 8)));
            plan.fdb.insert(L2Entry {
                ip: remote,
                mac: tunnel_mac(remote),
            });
            plan.neighbours.insert(L2Entry {
                ip: gateway,
                mac: tunnel_mac(remote),
            });
            plan.routes.insert(PlannedRoute {
                dst: IpNet::new(gateway, 24).unwrap().trunc(),
                gateway,
                tunnel: true,
                prefsrc: None,
            });
        }
        plan
    }

    /// Runs `test` as root in a network namespace of its own, with loopback up
    /// (its addresses make the local table, against which the kernel checks an
    /// onlink route's gateway); without root it is a skip.
    fn as_root_in_netns(name: &str, test: impl FnOnce(&NetlinkSocket) + Send + 'static) {
        use crate::datapath::tests::{in_private_netns, root};
        if !root(name) {
            return;
        }
        in_private_netns(|| {
            let sock = NetlinkSocket::new().unwrap();
            sock.set_link_up(crate::datapath::LOOPBACK_INDEX).unwrap();
            test(&sock)
        });
    }

    /// The destinations of podnet's IPv4 routes, and the FDB and neighbour
    /// entries of the tunnel device, as the kernel lists them.
    fn tunnel_entries(
        sock: &NetlinkSocket,
    ) -> (BTreeSet<IpNet>, BTreeSet<L2Entry>, BTreeSet<L2Entry>) {
        let index = sock.link_by_name(TUNNEL_DEVICE).unwrap().unwrap().index;
        let routes = sock
            .list_routes(IpFamily::V4, Some(TABLE_MAIN))
            .unwrap()
            .into_iter()
            .filter(|r| r.protocol == ROUTE_PROTOCOL)
            .map(|r| r.dst)
            .collect();
        let fdb = sock.list_fdb(index).unwrap().into_iter().collect();
        let neighbours = sock.list_neighbours(index).unwrap().into_iter().collect();
        (routes, fdb, neighbours)
    }

    #[test]
    fn more_entries_than_a_batch_are_all_written_and_removed() {
        as_root_in_netns(
            "more_entries_than_a_batch_are_all_written_and_removed",
            |sock| {
                let mut r = Reconciler::new(tunnel_config(), 1500);
                let count = |sock: &NetlinkSocket| {
                    let (routes, fdb, neighbours) = tunnel_entries(sock);
                    (routes.len(), fdb.len(), neighbours.len())
                };
                let n = 3 * BATCH as u32 + 7;
                for compare in [Compare::Kernel, Compare::LastApplied] {
                    assert_eq!(r.apply(remotes(n), compare), Vec::<String>::new());
                    assert_eq!(count(sock), (n as usize, n as usize, n as usize));
                    assert_eq!(r.apply(remotes(5), compare), Vec::<String>::new());
                    assert_eq!(count(sock), (5, 5, 5), "the others removed");
                }
            },
        );
    }

    #[test]
    fn a_change_is_written_from_the_last_plan_and_a_resync_puts_back_what_was_removed() {
        as_root_in_netns(
            "a_change_is_written_from_the_last_plan_and_a_resync_puts_back_what_was_removed",
            |sock| {
                let mut r = Reconciler::new(tunnel_config(), 1500);
                let kernel = |sock: &NetlinkSocket| {
                    let (routes, fdb, _) = tunnel_entries(sock);
                    (routes, fdb)
                };
                let wanted = |plan: &DatapathPlan| {
                    (
                        plan.routes.iter().map(|r| r.dst).collect::<BTreeSet<_>>(),
                        plan.fdb.clone(),
                    )
                };
                // An empty last plan (a first pass without an error): every entry
                // of the next plan is written.
                assert_eq!(r.apply(remotes(0), Compare::Kernel), Vec::<String>::new());
                let three = remotes(3);
                assert_eq!(
                    r.apply(three.clone(), Compare::LastApplied),
                    Vec::<String>::new()
                );
                assert_eq!(kernel(sock), wanted(&three));

                // Someone removes a route: a change compares with the last plan, not
                // the kernel, so it stays missing until a resync.
                let gone = *three.routes.first().unwrap();
                sock.delete_route(
                    &route_spec(
                        &gone,
                        sock.link_by_name(TUNNEL_DEVICE).unwrap().map(|l| l.index),
                    )
                    .unwrap(),
                )
                .unwrap();
                let five = remotes(5);
                assert_eq!(
                    r.apply(five.clone(), Compare::LastApplied),
                    Vec::<String>::new()
                );
                let (routes, fdb) = kernel(sock);
                assert_eq!(fdb, five.fdb, "the two new nodes' entries written");
                assert_eq!(routes.len(), 4, "{routes:?}");
                assert!(!routes.contains(&gone.dst));
                assert_eq!(r.apply(five.clone(), Compare::Kernel), Vec::<String>::new());
                assert_eq!(kernel(sock), wanted(&five), "put back by the resync");

                // Nodes leave: their entries go without a dump.
                let two = remotes(2);
                assert_eq!(
                    r.apply(two.clone(), Compare::LastApplied),
                    Vec::<String>::new()
                );
                assert_eq!(kernel(sock), wanted(&two));
            },
        );
    }

    #[test]
    fn a_native_node_keeps_its_tunnel_while_needed_and_removes_it_at_a_resync() {
        as_root_in_netns(
            "a_native_node_keeps_its_tunnel_while_needed_and_removes_it_at_a_resync",
            |sock| {
                let config = CrossNodeConfig {
                    routing: RoutingMode::Native,
                    auto_direct_node_routes: true,
                    ..tunnel_config()
                };
                let mut r = Reconciler::new(config, 1500);
                // Two nodes still tunnel: the device and their entries.
                let two = remotes(2);
                assert_eq!(r.apply(two.clone(), Compare::Kernel), Vec::<String>::new());
                let (routes, fdb, _) = tunnel_entries(sock);
                assert_eq!((routes.len(), fdb), (2, two.fdb.clone()));
                let index = sock.link_by_name(TUNNEL_DEVICE).unwrap().unwrap().index;

                // None does any more: a change takes the routes and entries away
                // but keeps the device, which may still receive...
                let none = DatapathPlan::default();
                assert_eq!(
                    r.apply(none.clone(), Compare::LastApplied),
                    Vec::<String>::new()
                );
                let (routes, fdb, neighbours) = tunnel_entries(sock);
                assert!(routes.is_empty() && fdb.is_empty() && neighbours.is_empty());
                assert_eq!(
                    sock.link_by_name(TUNNEL_DEVICE).unwrap().map(|l| l.index),
                    Some(index),
                    "kept until the resync"
                );
                // ... until the resync removes it.
                assert_eq!(r.apply(none.clone(), Compare::Kernel), Vec::<String>::new());
                assert!(sock.link_by_name(TUNNEL_DEVICE).unwrap().is_none());

                // Or a change once it has been unwanted long enough (changes
                // that keep coming postpone the resync).
                assert_eq!(r.apply(two, Compare::LastApplied), Vec::<String>::new());
                r.tunnel_linger = Duration::ZERO;
                assert_eq!(r.apply(none, Compare::LastApplied), Vec::<String>::new());
                assert!(sock.link_by_name(TUNNEL_DEVICE).unwrap().is_none());
            },
        );
    }

    #[test]
    fn a_neighbour_whose_mac_changes_keeps_the_new_mac() {
        as_root_in_netns("a_neighbour_whose_mac_changes_keeps_the_new_mac", |sock| {
            for compare in [Compare::Kernel, Compare::LastApplied] {
                let mut r = Reconciler::new(tunnel_config(), 1500);
                let mut plan = remotes(2);
                assert_eq!(r.apply(plan.clone(), Compare::Kernel), Vec::<String>::new());
                let old = plan.neighbours.pop_first().expect("a neighbour");
                let moved = L2Entry {
                    ip: old.ip,
                    mac: [0x02, 0, 0, 0, 0, 0x42],
                };
                plan.neighbours.insert(moved);
                assert_eq!(r.apply(plan.clone(), compare), Vec::<String>::new());
                let index = sock.link_by_name(TUNNEL_DEVICE).unwrap().unwrap().index;
                let have: BTreeSet<L2Entry> =
                    sock.list_neighbours(index).unwrap().into_iter().collect();
                assert_eq!(
                    have, plan.neighbours,
                    "the new MAC, not a deleted entry ({compare:?})"
                );
                assert!(have.contains(&moved));
            }
        });
    }

    #[test]
    fn a_new_underlay_family_re_creates_the_tunnel_device_with_its_mtu_and_fdb() {
        as_root_in_netns(
            "a_new_underlay_family_re_creates_the_tunnel_device_with_its_mtu_and_fdb",
            |sock| {
                let device = || {
                    sock.link_by_name(TUNNEL_DEVICE)
                        .unwrap()
                        .expect("the device")
                };
                let mut config = tunnel_config();
                let v4 = endpoints("192.0.2.1", "192.0.2.2");
                assert_eq!(
                    Reconciler::new(config.clone(), 1500).apply(v4.clone(), Compare::Kernel),
                    Vec::<String>::new()
                );
                let old = device();
                assert_eq!(
                    (old.mtu, old.vxlan),
                    (1450, Some((8472, Some("192.0.2.1".parse().unwrap()))))
                );
                assert_eq!(sock.list_fdb(old.index).unwrap(), Vec::from_iter(v4.fdb));

                config.underlay = Family::V6;
                let v6 = endpoints("2001:db8::1", "2001:db8::2");
                let mut r = Reconciler::new(config, 1500);
                assert_eq!(r.apply(v6.clone(), Compare::Kernel), Vec::<String>::new());
                let new = device();
                assert_ne!(new.index, old.index, "re-created");
                assert_eq!(
                    (new.mtu, new.vxlan),
                    (1430, Some((8472, Some("2001:db8::1".parse().unwrap()))))
                );
                assert_eq!(
                    sock.list_fdb(new.index).unwrap(),
                    Vec::from_iter(v6.fdb.clone())
                );
                assert!(new.up && new.mac == v6.tunnel.map(|t| t.mac));
                assert_eq!(r.apply(v6.clone(), Compare::Kernel), Vec::<String>::new());
                assert_eq!(device().index, new.index, "kept once right");
            },
        );
    }
}
