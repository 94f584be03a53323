//! veth creation across namespaces, link attributes, up/MTU, deletion.

use super::{in_private_netns, new_netns, root};
use crate::datapath::*;

#[test]
fn veth_pair_peer_created_in_pod_netns() {
    if !root("veth_pair_peer_created_in_pod_netns") {
        return;
    }
    in_private_netns(|| {
        let pod = new_netns("pod-veth");
        let host = NetlinkSocket::new().unwrap();
        let podsock = NetlinkSocket::new_in(&pod).unwrap();
        let host_mac = random_mac().unwrap();
        let peer_mac = random_mac().unwrap();
        let spec = VethSpec {
            host_name: "lxctest0",
            host_mac: Some(host_mac),
            peer_name: "eth0",
            peer_mac: Some(peer_mac),
            mtu: 1400,
            peer_netns: &pod,
            txqlen: Some(1000),
        };
        let h = host.create_veth_pair(&spec).unwrap();
        assert_eq!(h.name, "lxctest0");
        assert_eq!(h.kind.as_deref(), Some("veth"));
        assert_eq!(h.mtu, 1400);
        assert_eq!(h.mac, Some(host_mac));
        assert_eq!(h.txqlen, Some(1000));
        assert!(!h.up);

        // The peer exists only inside the pod netns, under its final name.
        assert!(host.link_by_name("eth0").unwrap().is_none());
        let p = podsock
            .link_by_name("eth0")
            .unwrap()
            .expect("peer in pod ns");
        // The index lookup without netlink answers for the socket's netns.
        assert_eq!(podsock.link_index("eth0").unwrap(), Some(p.index));
        assert_eq!(host.link_index("eth0").unwrap(), None);
        assert_eq!(host.link_index("lxctest0").unwrap(), Some(h.index));
        assert_eq!(podsock.link_index("lo").unwrap(), Some(LOOPBACK_INDEX));
        let e = podsock.link_index("bad/name").unwrap_err();
        assert!(matches!(e, DatapathError::Invalid(_)), "{e}");
        assert_eq!(p.mtu, 1400, "peer carries its own MTU");
        assert_eq!(p.mac, Some(peer_mac));
        assert_eq!(p.kind.as_deref(), Some("veth"));
        assert_eq!(
            h.link,
            Some(p.index),
            "IFLA_LINK of host end = peer ifindex"
        );
        assert_eq!(p.link, Some(h.index));
        assert_eq!(
            podsock.link_by_index(p.index).unwrap().unwrap().name,
            "eth0"
        );

        // Duplicate create: EEXIST, with a message naming the objects.
        let e = host.create_veth_pair(&spec).unwrap_err();
        assert_eq!(e.errno(), Some(libc::EEXIST), "{e}");
        assert!(e.is_exists());
        let msg = e.to_string();
        assert!(
            msg.starts_with(
                "creating veth lxctest0 (peer eth0 in pod-veth): File exists (os error 17)"
            ),
            "{msg}"
        );
        // Same peer name in the pod but a new host name: also EEXIST.
        let e = host
            .create_veth_pair(&VethSpec {
                host_name: "lxctest1",
                ..spec
            })
            .unwrap_err();
        assert_eq!(e.errno(), Some(libc::EEXIST), "{e}");
        assert!(host.link_by_name("lxctest1").unwrap().is_none());

        // Up and MTU.
        host.set_link_up(h.index).unwrap();
        podsock.set_link_up(p.index).unwrap();
        assert!(host.link_by_index(h.index).unwrap().unwrap().up);
        assert!(podsock.link_by_name("eth0").unwrap().unwrap().up);
        host.set_link_mtu(h.index, 1300).unwrap();
        assert_eq!(host.link_by_index(h.index).unwrap().unwrap().mtu, 1300);
        let mac = random_mac().unwrap();
        host.set_link_mac(h.index, mac).unwrap();
        assert_eq!(host.link_by_index(h.index).unwrap().unwrap().mac, Some(mac));
        host.set_link_down(h.index).unwrap();
        assert!(!host.link_by_index(h.index).unwrap().unwrap().up);

        let names: Vec<String> = host
            .list_links()
            .unwrap()
            .into_iter()
            .map(|l| l.name)
            .collect();
        assert!(names.contains(&"lo".to_string()) && names.contains(&"lxctest0".to_string()));

        // Deleting the host end removes the pod end too.
        assert!(host.delete_link_by_name("lxctest0").unwrap());
        assert!(!host.delete_link_by_name("lxctest0").unwrap());
        assert!(podsock.link_by_name("eth0").unwrap().is_none());
    });
}

#[test]
fn veth_pair_by_indexes_and_rp_filter_by_netlink() {
    if !root("veth_pair_by_indexes_and_rp_filter_by_netlink") {
        return;
    }
    in_private_netns(|| {
        let pod = new_netns("pod-idx");
        let host = NetlinkSocket::new().unwrap();
        let podsock = NetlinkSocket::new_in(&pod).unwrap();
        let spec = VethSpec {
            host_name: "lxcidx0",
            host_mac: None,
            peer_name: "eth0",
            peer_mac: None,
            mtu: 1400,
            peer_netns: &pod,
            txqlen: None,
        };
        let (h, p) = host.create_veth_pair_indexes(&spec, &podsock).unwrap();
        assert_eq!(host.link_by_name("lxcidx0").unwrap().unwrap().index, h);
        let peer = podsock.link_by_name("eth0").unwrap().unwrap();
        assert_eq!((peer.index, peer.link), (p, Some(h)));
        let e = host.create_veth_pair_indexes(&spec, &podsock).unwrap_err();
        assert!(e.is_exists(), "{e}");
        assert!(
            e.to_string()
                .starts_with("creating veth lxcidx0 (peer eth0 in pod-idx): File exists"),
            "{e}"
        );

        // rp_filter as /proc/sys has it, set through the link's IPv4 conf.
        let key = "net/ipv4/conf/lxcidx0/rp_filter";
        for value in [2, 0, 1, 0] {
            let outcome = host.batch(vec![host.rp_filter_request(h, value)]).unwrap();
            assert!(outcome.into_iter().all(|o| o.is_ok()));
            assert_eq!(read_sysctl(key).unwrap(), value.to_string());
        }
        let e = host
            .perform(host.rp_filter_request(999_999, 0))
            .unwrap_err();
        assert!(e.is_not_found(), "{e}");
        assert!(
            e.to_string()
                .starts_with("setting rp_filter 0 on link #999999: "),
            "{e}"
        );

        // A socket knows its netns: the pod's, not the thread's.
        assert_eq!(podsock.netns().unwrap().id().unwrap(), pod.id().unwrap());
        assert_eq!(podsock.netns().unwrap().label(), "pod-idx");
        assert_eq!(
            host.netns().unwrap().id().unwrap(),
            NetNs::current().unwrap().id().unwrap()
        );
    });
}

#[test]
fn delete_missing_link() {
    if !root("delete_missing_link") {
        return;
    }
    in_private_netns(|| {
        let s = NetlinkSocket::new().unwrap();
        assert!(!s.delete_link_by_name("nosuchlink0").unwrap());
        assert!(s.link_by_name("nosuchlink0").unwrap().is_none());
        assert!(s.link_by_index(999_999).unwrap().is_none());
        let e = s.delete_link(999_999).unwrap_err();
        assert_eq!(e.errno(), Some(libc::ENODEV), "{e}");
        assert!(e.is_not_found());
        assert!(e.to_string().starts_with("deleting link #999999: "), "{e}");
        assert!(s.delete_link_by_name("bad/name").is_err());
    });
}

#[test]
fn socket_in_pod_netns_sees_only_pod_links() {
    if !root("socket_in_pod_netns_sees_only_pod_links") {
        return;
    }
    in_private_netns(|| {
        let pod = new_netns("pod-links");
        // Socket created on another thread, used here: still bound to the pod ns.
        let podsock = NetlinkSocket::new_in(&pod).unwrap();
        let links = podsock.list_links().unwrap();
        assert_eq!(links.len(), 1, "{links:?}");
        assert_eq!(links[0].name, "lo");
        assert!(links[0].kind.is_none());
        let e = podsock.delete_link(999_999).unwrap_err();
        assert!(e.to_string().contains(" in pod-links: "), "{e}");
    });
}

#[test]
fn vxlan_device_comes_up_without_a_link_local_address() {
    if !root("vxlan_device_comes_up_without_a_link_local_address") {
        return;
    }
    in_private_netns(|| {
        let host = NetlinkSocket::new().unwrap();
        let spec = VxlanSpec {
            name: "pnvxtest".into(),
            id: 2,
            port: 8472,
            local: std::net::Ipv4Addr::new(192, 0, 2, 1).into(),
            mac: random_mac().unwrap(),
            mtu: 1450,
        };
        let link = host.create_vxlan(&spec).unwrap();
        assert!(!link.up);
        host.set_link_up(link.index).unwrap();
        // In the default mode (EUI-64) the kernel adds fe80::… (tentative) the
        // moment the link goes up; with generation off, no IPv6 address at all.
        assert_eq!(host.list_addresses(link.index).unwrap(), vec![]);
        let mode = read_sysctl("net/ipv6/conf/pnvxtest/addr_gen_mode").unwrap();
        assert_eq!(mode.trim(), "1", "addr_gen_mode none");
    });
}

#[test]
fn vxlan_device_with_an_ipv6_local_reports_it_and_takes_ipv6_fdb_entries() {
    if !root("vxlan_device_with_an_ipv6_local_reports_it_and_takes_ipv6_fdb_entries") {
        return;
    }
    in_private_netns(|| {
        let host = NetlinkSocket::new().unwrap();
        let local: std::net::IpAddr = "2001:db8::1".parse().unwrap();
        let spec = VxlanSpec {
            name: "pnvx6test".into(),
            id: 2,
            port: 8472,
            local,
            mac: random_mac().unwrap(),
            mtu: 1430,
        };
        let link = host.create_vxlan(&spec).unwrap();
        host.set_link_up(link.index).unwrap();
        let link = host.link_by_name("pnvx6test").unwrap().expect("the device");
        assert_eq!(link.vxlan, Some((8472, Some(local))), "IFLA_VXLAN_LOCAL6");
        assert_eq!((link.mtu, link.up), (1430, true));
        let remote = L2Entry {
            ip: "2001:db8::2".parse().unwrap(),
            mac: [0x1e, 1, 2, 3, 4, 5],
        };
        host.append_fdb(link.index, &remote).unwrap();
        host.append_fdb(link.index, &remote).unwrap();
        assert_eq!(
            host.list_fdb(link.index).unwrap(),
            vec![remote],
            "appended once"
        );
        let router = L2Entry {
            ip: "fd00:61:2::1".parse().unwrap(),
            mac: remote.mac,
        };
        host.replace_neighbour(link.index, &router).unwrap();
        assert_eq!(host.list_neighbours(link.index).unwrap(), vec![router]);
        let v4 = L2Entry {
            ip: "192.0.2.2".parse().unwrap(),
            mac: [0x0e, 0x70, 192, 0, 2, 2],
        };
        // The kernel refuses a destination of the other family.
        let e = host.append_fdb(link.index, &v4).unwrap_err();
        assert_eq!(e.errno(), Some(libc::EAFNOSUPPORT), "{e}");
        host.delete_fdb(link.index, &remote).unwrap();
        assert_eq!(host.list_fdb(link.index).unwrap(), vec![]);
    });
}
