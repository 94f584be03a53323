//! End-to-end: the Cilium-style ADD and DEL sequence on a pod netns, verified
//! by listing kernel state.

use std::net::IpAddr;

use ipnet::IpNet;

use super::{in_private_netns, new_netns, root};
use crate::datapath::*;

#[test]
fn cilium_style_add_then_del() {
    if !root("cilium_style_add_then_del") {
        return;
    }
    in_private_netns(|| {
        let pod = new_netns("/run/netns/pod-e2e");
        let host = NetlinkSocket::new().unwrap();
        let host_name = host_ifname("a1b2c3d4e5f6", "eth0");
        let mtu = 1450;

        // Link pair; host end up, host rp_filter=0.
        let lxc = host
            .create_veth_pair(&VethSpec {
                host_name: &host_name,
                host_mac: Some(random_mac().unwrap()),
                peer_name: "eth0",
                peer_mac: Some(random_mac().unwrap()),
                mtu,
                peer_netns: &pod,
                txqlen: Some(1000),
            })
            .unwrap();
        host.set_link_up(lxc.index).unwrap();
        write_sysctl(&format!("net/ipv4/conf/{host_name}/rp_filter"), "0").unwrap();

        // Inside the pod.
        let pod_ip: IpAddr = "10.0.1.23".parse().unwrap();
        let pod_ip6: IpAddr = "fd00:1::23".parse().unwrap();
        let router: IpAddr = "10.0.1.1".parse().unwrap();
        let router6: IpAddr = "fd00:1::1".parse().unwrap();
        let s = NetlinkSocket::new_in(&pod).unwrap();
        in_netns(&pod, || write_sysctl("net/ipv6/conf/all/disable_ipv6", "0")).unwrap();
        let eth0 = s.link_by_name("eth0").unwrap().unwrap();
        assert_eq!(eth0.mtu, mtu);
        s.set_link_up(eth0.index).unwrap();
        s.add_address(eth0.index, IpNet::from(pod_ip), false)
            .unwrap();
        s.add_address(eth0.index, IpNet::from(pod_ip6), true)
            .unwrap();
        for (r, default) in [(router, "0.0.0.0/0"), (router6, "::/0")] {
            s.add_route(&RouteSpec::link(IpNet::from(r), eth0.index))
                .unwrap();
            s.add_route(&RouteSpec {
                dst: default.parse().unwrap(),
                gateway: Some(r),
                oif: eth0.index,
                scope_link: false,
                mtu: Some(mtu - 50),
                table: None,
                priority: None,
                onlink: false,
                prefsrc: None,
                protocol: None,
            })
            .unwrap();
        }

        // Verify.
        let addrs = s.list_addresses(eth0.index).unwrap();
        assert!(addrs.contains(&IpNet::from(pod_ip)) && addrs.contains(&IpNet::from(pod_ip6)));
        let v4 = s.list_routes(IpFamily::V4, Some(TABLE_MAIN)).unwrap();
        assert!(
            v4.iter()
                .any(|r| r.dst == IpNet::from(router) && r.scope == SCOPE_LINK)
        );
        assert!(v4.iter().any(|r| r.dst.prefix_len() == 0
            && r.gateway == Some(router)
            && r.mtu == Some(mtu - 50)));
        let v6 = s.list_routes(IpFamily::V6, Some(TABLE_MAIN)).unwrap();
        assert!(v6.iter().any(|r| r.dst == IpNet::from(router6)));
        assert!(
            v6.iter()
                .any(|r| r.dst.prefix_len() == 0 && r.gateway == Some(router6))
        );
        assert_eq!(
            read_sysctl(&format!("net/ipv4/conf/{host_name}/rp_filter")).unwrap(),
            "0"
        );

        // DEL: remove the host end; the pod end goes with it; a second DEL is a no-op.
        assert!(host.delete_link_by_name(&host_name).unwrap());
        assert!(s.link_by_name("eth0").unwrap().is_none());
        assert!(!host.delete_link_by_name(&host_name).unwrap());
    });
}
