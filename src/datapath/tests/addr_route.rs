//! Addresses and routes inside a pod netns.

use std::net::IpAddr;

use ipnet::IpNet;

use super::{in_private_netns, new_netns, root};
use crate::datapath::*;

/// A veth whose peer `eth0` sits (up, with `lo` up) in a fresh pod netns.
/// Returns (pod ns, pod socket, eth0 ifindex, host socket, host ifindex).
pub(super) fn pod_with_eth0(label: &str) -> (NetNs, NetlinkSocket, u32, NetlinkSocket, u32) {
    let pod = new_netns(label);
    let host = NetlinkSocket::new().unwrap();
    let podsock = NetlinkSocket::new_in(&pod).unwrap();
    let h = host
        .create_veth_pair(&VethSpec {
            host_name: "lxcpod0",
            host_mac: None,
            peer_name: "eth0",
            peer_mac: None,
            mtu: 1500,
            peer_netns: &pod,
            txqlen: None,
        })
        .unwrap();
    host.set_link_up(h.index).unwrap();
    let eth0 = podsock.link_by_name("eth0").unwrap().unwrap().index;
    let lo = podsock.link_by_name("lo").unwrap().unwrap().index;
    podsock.set_link_up(lo).unwrap();
    podsock.set_link_up(eth0).unwrap();
    (pod, podsock, eth0, host, h.index)
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn addresses_v4_and_v6_nodad() {
    if !root("addresses_v4_and_v6_nodad") {
        return;
    }
    in_private_netns(|| {
        let (_pod, s, eth0, _host, _) = pod_with_eth0("pod-addr");
        s.add_address(eth0, net("10.1.0.5/32"), false).unwrap();
        s.add_address(eth0, net("fd00::5/128"), true).unwrap();
        let addrs = s.list_addresses(eth0).unwrap();
        assert!(addrs.contains(&net("10.1.0.5/32")), "{addrs:?}");
        assert!(addrs.contains(&net("fd00::5/128")), "{addrs:?}");

        let e = s.add_address(eth0, net("10.1.0.5/32"), false).unwrap_err();
        assert_eq!(e.errno(), Some(libc::EEXIST), "{e}");
        assert!(
            e.to_string()
                .starts_with("adding address 10.1.0.5/32 to link #"),
            "{e}"
        );
        // A broadcast-carrying /24 works too.
        s.add_address(eth0, net("192.168.7.9/24"), false).unwrap();
        assert!(
            s.list_addresses(eth0)
                .unwrap()
                .contains(&net("192.168.7.9/24"))
        );

        s.delete_address(eth0, net("10.1.0.5/32")).unwrap();
        s.delete_address(eth0, net("fd00::5/128")).unwrap();
        let addrs = s.list_addresses(eth0).unwrap();
        assert!(!addrs.contains(&net("10.1.0.5/32")) && !addrs.contains(&net("fd00::5/128")));
        let e = s.delete_address(eth0, net("10.1.0.5/32")).unwrap_err();
        assert!(e.is_not_found(), "{e}");
        // Lists are per link: lo has only its loopback addresses.
        let lo = s.link_by_name("lo").unwrap().unwrap().index;
        assert!(s.list_addresses(lo).unwrap().contains(&net("127.0.0.1/8")));
    });
}

#[test]
fn link_route_and_default_route_v4_v6() {
    if !root("link_route_and_default_route_v4_v6") {
        return;
    }
    in_private_netns(|| {
        let (_pod, s, eth0, _host, _) = pod_with_eth0("pod-routes");
        s.add_address(eth0, net("10.1.0.5/32"), false).unwrap();
        s.add_address(eth0, net("fd00::5/128"), true).unwrap();
        for (router, default) in [("10.1.0.1", "0.0.0.0/0"), ("fd00::1", "::/0")] {
            let router = ip(router);
            let family = IpFamily::of(&router);
            let link_route = RouteSpec::link(IpNet::from(router), eth0);
            let default_route = RouteSpec {
                dst: net(default),
                gateway: Some(router),
                scope_link: false,
                mtu: Some(1400),
                ..link_route.clone()
            };
            s.add_route(&link_route).unwrap();
            s.add_route(&default_route).unwrap();
            let e = s.add_route(&default_route).unwrap_err();
            assert!(e.is_exists(), "{e}");

            let routes = s.list_routes(family, Some(TABLE_MAIN)).unwrap();
            let lr = routes
                .iter()
                .find(|r| r.dst == IpNet::from(router))
                .unwrap_or_else(|| panic!("link route missing: {routes:?}"));
            assert_eq!(lr.gateway, None);
            assert_eq!(lr.oif, Some(eth0));
            if family == IpFamily::V4 {
                assert_eq!(lr.scope, SCOPE_LINK);
            }
            let dr = routes
                .iter()
                .find(|r| r.dst == net(default))
                .unwrap_or_else(|| panic!("default route missing: {routes:?}"));
            assert_eq!(dr.gateway, Some(router));
            assert_eq!(dr.oif, Some(eth0));
            assert_eq!(dr.mtu, Some(1400));
            assert_eq!(dr.scope, SCOPE_UNIVERSE);
            assert_eq!(dr.table, TABLE_MAIN);

            // Replace changes the MTU in place.
            s.replace_route(&RouteSpec {
                mtu: Some(1300),
                ..default_route.clone()
            })
            .unwrap();
            let routes = s.list_routes(family, Some(TABLE_MAIN)).unwrap();
            let defaults: Vec<_> = routes.iter().filter(|r| r.dst == net(default)).collect();
            assert_eq!(defaults.len(), 1, "{defaults:?}");
            assert_eq!(defaults[0].mtu, Some(1300));

            s.delete_route(&default_route).unwrap();
            let e = s.delete_route(&default_route).unwrap_err();
            assert!(e.is_not_found(), "{e}");
            s.delete_route(&link_route).unwrap();
            let routes = s.list_routes(family, Some(TABLE_MAIN)).unwrap();
            assert!(!routes.iter().any(|r| r.dst == net(default)), "{routes:?}");
        }
    });
}

#[test]
fn route_in_table_with_priority_and_mtu() {
    if !root("route_in_table_with_priority_and_mtu") {
        return;
    }
    in_private_netns(|| {
        // Host side: route to the pod IP via the lxc device in a custom table.
        let (_pod, _s, _eth0, host, lxc) = pod_with_eth0("pod-table");
        for (dst, table) in [("10.1.0.5/32", 100u32), ("fd00::5/128", 1000u32)] {
            let spec = RouteSpec {
                dst: net(dst),
                gateway: None,
                oif: lxc,
                scope_link: true,
                mtu: Some(1450),
                table: Some(table),
                priority: Some(42),
                onlink: false,
                prefsrc: None,
                protocol: None,
            };
            host.add_route(&spec).unwrap();
            let fam = IpFamily::of(&net(dst).addr());
            let routes = host.list_routes(fam, Some(table)).unwrap();
            assert_eq!(routes.len(), 1, "{routes:?}");
            let r = &routes[0];
            assert_eq!(
                (r.dst, r.oif, r.mtu, r.priority, r.table),
                (net(dst), Some(lxc), Some(1450), Some(42), table)
            );
            assert!(
                !host
                    .list_routes(fam, Some(TABLE_MAIN))
                    .unwrap()
                    .iter()
                    .any(|r| r.dst == net(dst))
            );
            host.delete_route(&spec).unwrap();
            assert!(host.list_routes(fam, Some(table)).unwrap().is_empty());
        }
        let bad = RouteSpec {
            dst: net("0.0.0.0/0"),
            gateway: Some(ip("fd00::1")),
            oif: 0,
            scope_link: false,
            mtu: None,
            table: None,
            priority: None,
            onlink: false,
            prefsrc: None,
            protocol: None,
        };
        assert!(matches!(
            host.add_route(&bad),
            Err(DatapathError::Invalid(_))
        ));
        // An unreachable gateway: the kernel's extended ACK text is kept.
        let e = host
            .add_route(&RouteSpec {
                dst: net("0.0.0.0/0"),
                gateway: Some(ip("10.9.9.9")),
                oif: lxc,
                scope_link: false,
                mtu: None,
                table: None,
                priority: None,
                onlink: false,
                prefsrc: None,
                protocol: None,
            })
            .unwrap_err();
        assert_eq!(e.errno(), Some(libc::ENETUNREACH), "{e}");
        assert!(
            matches!(&e, DatapathError::Netlink { ext_ack: Some(m), .. } if !m.is_empty()),
            "{e:?}"
        );
    });
}

#[test]
fn a_batch_is_answered_in_order_each_with_its_own_error() {
    if !root("a_batch_is_answered_in_order_each_with_its_own_error") {
        return;
    }
    in_private_netns(|| {
        let (_pod, s, eth0, _host, _) = pod_with_eth0("pod-batch");
        let link = RouteSpec::link(net("10.2.0.1/32"), eth0);
        let default = RouteSpec {
            dst: net("0.0.0.0/0"),
            gateway: Some(ip("10.2.0.1")),
            scope_link: false,
            ..link.clone()
        };
        let outcomes = s
            .batch(vec![
                s.link_up_request(LOOPBACK_INDEX),
                s.add_address_request(eth0, net("10.2.0.5/32"), false),
                s.add_address_request(eth0, net("10.2.0.5/32"), false),
                s.add_route_request(&link).unwrap(),
                s.add_route_request(&default).unwrap(),
            ])
            .unwrap();
        assert_eq!(outcomes.len(), 5);
        assert!(outcomes[0].is_ok() && outcomes[1].is_ok(), "{outcomes:?}");
        // The duplicate fails with its own context; the requests after it still ran.
        let e = outcomes[2].as_ref().unwrap_err();
        assert!(e.is_exists(), "{e}");
        assert!(
            e.to_string().starts_with(&format!(
                "adding address 10.2.0.5/32 to link #{eth0} in pod-batch: File exists"
            )),
            "{e}"
        );
        assert!(outcomes[3].is_ok() && outcomes[4].is_ok(), "{outcomes:?}");
        let routes = s.list_routes(IpFamily::V4, Some(TABLE_MAIN)).unwrap();
        assert!(
            routes
                .iter()
                .any(|r| r.dst.prefix_len() == 0 && r.gateway == Some(ip("10.2.0.1"))),
            "{routes:?}"
        );
        // The socket is in step afterwards: the next request gets its own answer.
        let e = s.add_route(&default).unwrap_err();
        assert!(e.is_exists(), "{e}");
    });
}
