//! The L2 responder against the kernel: a veth pair in a private netns, the
//! responder serving one end (`va`), the kernel resolving the answered
//! addresses (ARP, NDP) out of the other end (`vb`) and taking announcements.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket};
use std::time::{Duration, Instant};

use netlink_packet_core::{NLM_F_CREATE, NLM_F_REPLACE};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
};

use super::{in_private_netns, root};
use crate::datapath::l2_responder::{Responder, ResponderError, Wanted};
use crate::datapath::*;

/// The two ends of a veth pair, both up in the current netns.
struct Pair {
    s: NetlinkSocket,
    /// The answering end: (ifindex, MAC).
    va: (u32, [u8; 6]),
    vb: u32,
}

fn pair(va: &str, vb: &str) -> Pair {
    let s = NetlinkSocket::new().unwrap();
    let here = NetNs::current().unwrap();
    s.create_veth_pair(&VethSpec {
        host_name: va,
        host_mac: None,
        peer_name: vb,
        peer_mac: None,
        mtu: 1500,
        peer_netns: &here,
        txqlen: None,
    })
    .unwrap();
    let a = s.link_by_name(va).unwrap().unwrap();
    let b = s.link_by_name(vb).unwrap().unwrap();
    for i in [a.index, b.index] {
        s.set_link_up(i).unwrap();
    }
    Pair {
        va: (a.index, a.mac.unwrap()),
        vb: b.index,
        s,
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn wanted(interface: &str, ips: &[&str]) -> Wanted {
    let ips: BTreeSet<IpAddr> = ips.iter().map(|a| ip(a)).collect();
    BTreeMap::from([(interface.to_string(), ips)])
}

fn neighbour_message(index: u32, ip: IpAddr) -> NeighbourMessage {
    let mut msg = NeighbourMessage::default();
    msg.header.family = IpFamily::of(&ip).to_nl();
    msg.header.ifindex = index;
    let dst = match ip {
        IpAddr::V4(a) => NeighbourAddress::Inet(a),
        IpAddr::V6(a) => NeighbourAddress::Inet6(a),
    };
    msg.attributes.push(NeighbourAttribute::Destination(dst));
    msg
}

/// Link `index`'s neighbour entry for `ip`: its state and MAC.
fn neighbour(
    s: &NetlinkSocket,
    index: u32,
    ip: IpAddr,
) -> Option<(NeighbourState, Option<Vec<u8>>)> {
    let mut req = NeighbourMessage::default();
    req.header.family = IpFamily::of(&ip).to_nl();
    let msgs = s
        .dump(RouteNetlinkMessage::GetNeighbour(req), || "neigh".into())
        .unwrap();
    msgs.into_iter().find_map(|m| {
        let RouteNetlinkMessage::NewNeighbour(n) = m else {
            return None;
        };
        let mut dst = None;
        let mut mac = None;
        for a in n.attributes {
            match a {
                NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => {
                    dst = Some(IpAddr::V4(a))
                }
                NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => {
                    dst = Some(IpAddr::V6(a))
                }
                NeighbourAttribute::LinkLayerAddress(m) => mac = Some(m),
                _ => {}
            }
        }
        (n.header.ifindex == index && dst == Some(ip)).then_some((n.header.state, mac))
    })
}

/// A STALE entry for `ip` at `mac` on link `index` (`ip neigh replace ... nud stale`).
fn stale_neighbour(s: &NetlinkSocket, index: u32, ip: IpAddr, mac: [u8; 6]) {
    let mut msg = neighbour_message(index, ip);
    msg.header.state = NeighbourState::Stale;
    msg.attributes
        .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
    s.request(
        RouteNetlinkMessage::NewNeighbour(msg),
        NLM_F_CREATE | NLM_F_REPLACE,
        || "adding neighbour".into(),
    )
    .unwrap();
}

fn delete_neighbour(s: &NetlinkSocket, index: u32, ip: IpAddr) {
    let msg = neighbour_message(index, ip);
    s.request(RouteNetlinkMessage::DelNeighbour(msg), 0, || {
        "deleting neighbour".into()
    })
    .unwrap();
}

/// Makes the kernel resolve `ip`: a UDP datagram to its discard port.
fn resolve(ip: IpAddr) {
    let any: IpAddr = match ip {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let sock = UdpSocket::bind((any, 0)).unwrap();
    sock.send_to(b"x", (ip, 9)).unwrap();
}

/// Polls `f` every 50 ms for up to 5 s; true once it held.
fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

/// How many of this process's threads are called `name`.
fn threads_named(name: &str) -> usize {
    let tasks = std::fs::read_dir("/proc/self/task").unwrap();
    let comm = |t: std::fs::DirEntry| std::fs::read_to_string(t.path().join("comm")).ok();
    tasks
        .filter_map(|t| comm(t.unwrap()))
        .filter(|c| c.trim() == name)
        .count()
}

/// Whether link `interface` is in multicast group `mac` (`ip maddr`), read
/// from this thread's netns.
fn in_multicast_group(interface: &str, mac: &str) -> bool {
    let groups = std::fs::read_to_string("/proc/thread-self/net/dev_mcast").unwrap();
    groups.lines().any(|l| {
        let fields: Vec<&str> = l.split_whitespace().collect();
        fields.get(1) == Some(&interface) && fields.get(4) == Some(&mac)
    })
}

/// The answering side of tests 1 and 3: `vb` (with `vb_net`) resolves `answered`
/// through the responder on `va`; once the responder drops it, neither it nor
/// `never`, never answered, resolves.
fn answers_then_stops(va: &str, vb: &str, vb_net: &str, answered: &str, never: &str) {
    let p = pair(va, vb);
    p.s.add_address(p.vb, vb_net.parse().unwrap(), true)
        .unwrap();
    let responder = Responder::new();
    assert!(responder.set(&wanted(va, &[answered])).is_empty());
    // The thread names itself once it runs.
    assert!(eventually(|| threads_named(&format!("l2-{va}")) == 1));
    resolve(ip(answered));
    let va_mac = p.va.1.to_vec();
    let resolved = eventually(|| {
        neighbour(&p.s, p.vb, ip(answered))
            == Some((NeighbourState::Reachable, Some(va_mac.clone())))
    });
    assert!(resolved, "{:?}", neighbour(&p.s, p.vb, ip(answered)));
    let report = &responder.report().interfaces[va];
    assert_eq!(report.addresses, BTreeSet::from([ip(answered)]));
    assert!(
        report.arp_replies + report.neighbour_advertisements >= 1,
        "{report:?}"
    );
    assert!(report.error.is_none(), "{report:?}");
    assert!(eventually(
        || responder.report().interfaces[va].gratuitous == 3
    ));

    // Another address instead: the first is no longer answered.
    let other = "10.9.0.101";
    assert!(responder.set(&wanted(va, &[other])).is_empty());
    assert_eq!(
        responder.report().interfaces[va].addresses,
        BTreeSet::from([ip(other)])
    );
    delete_neighbour(&p.s, p.vb, ip(answered));
    resolve(ip(answered));
    resolve(ip(never));
    // An answer takes milliseconds; the kernel asks again every second.
    std::thread::sleep(Duration::from_millis(1500));
    for unanswered in [answered, never] {
        let state = neighbour(&p.s, p.vb, ip(unanswered)).map(|(state, _)| state);
        assert!(
            matches!(
                state,
                Some(NeighbourState::Incomplete | NeighbourState::Failed)
            ),
            "{unanswered}: {state:?}"
        );
    }
    drop(responder);
    assert_eq!(threads_named(&format!("l2-{va}")), 0, "the thread ended");
}

#[test]
fn l2_responder_answers_arp() {
    if !root("l2_responder_answers_arp") {
        return;
    }
    in_private_netns(|| {
        answers_then_stops("r1a", "r1b", "10.9.0.2/24", "10.9.0.100", "10.9.0.102")
    });
}

#[test]
fn l2_responder_answers_ndp() {
    if !root("l2_responder_answers_ndp") {
        return;
    }
    in_private_netns(|| {
        answers_then_stops("r3a", "r3b", "fd00:9::2/64", "fd00:9::100", "fd00:9::102")
    });
}

/// Test 2 and its IPv6 twin: `vb` holds a STALE entry for `address` with
/// another MAC; serving it on `va` moves the entry to `va`'s MAC.
fn announcement_moves_entry(va: &str, vb: &str, vb_net: &str, address: &str) {
    let p = pair(va, vb);
    p.s.add_address(p.vb, vb_net.parse().unwrap(), true)
        .unwrap();
    let elsewhere = [0x02, 0, 0, 0, 0, 0xee];
    stale_neighbour(&p.s, p.vb, ip(address), elsewhere);
    // The kernel keeps an IPv4 entry's MAC for locktime (1 s) after it changed,
    // unless the ARP is gratuitous for an on-link address (then it overrides at
    // once); waiting out the locktime keeps the test from depending on that.
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(
        neighbour(&p.s, p.vb, ip(address)).unwrap().1,
        Some(elsewhere.to_vec())
    );
    let responder = Responder::new();
    assert!(responder.set(&wanted(va, &[address])).is_empty());
    let va_mac = Some(p.va.1.to_vec());
    let moved = eventually(|| neighbour(&p.s, p.vb, ip(address)).unwrap().1 == va_mac);
    assert!(moved, "{:?}", neighbour(&p.s, p.vb, ip(address)));
    assert!(responder.report().interfaces[va].gratuitous >= 1);
}

#[test]
fn l2_responder_gratuitous_arp() {
    if !root("l2_responder_gratuitous_arp") {
        return;
    }
    in_private_netns(|| announcement_moves_entry("r2a", "r2b", "10.9.0.2/24", "10.9.0.100"));
}

#[test]
fn l2_responder_unsolicited_na() {
    if !root("l2_responder_unsolicited_na") {
        return;
    }
    in_private_netns(|| announcement_moves_entry("r4a", "r4b", "fd00:9::2/64", "fd00:9::100"));
}

#[test]
fn l2_responder_joins_solicited_node_groups() {
    if !root("l2_responder_joins_solicited_node_groups") {
        return;
    }
    in_private_netns(|| {
        pair("r5a", "r5b");
        let responder = Responder::new();
        let group = "3333ff000100";
        assert!(
            responder
                .set(&wanted("r5a", &["fd00:9::100", "fd00:8::100"]))
                .is_empty()
        );
        assert!(in_multicast_group("r5a", group));
        // Two addresses share the group: it stays while one of them is served.
        assert!(responder.set(&wanted("r5a", &["fd00:9::100"])).is_empty());
        assert!(in_multicast_group("r5a", group));
        assert!(responder.set(&wanted("r5a", &["10.9.0.100"])).is_empty());
        assert!(!in_multicast_group("r5a", group));
        assert!(responder.set(&wanted("r5a", &["fd00:9::100"])).is_empty());
        drop(responder);
        assert!(
            !in_multicast_group("r5a", group),
            "closing the socket leaves"
        );
    });
}

#[test]
fn l2_responder_missing_and_deleted_links() {
    if !root("l2_responder_missing_and_deleted_links") {
        return;
    }
    in_private_netns(|| {
        let p = pair("r6a", "r6b");
        p.s.add_address(p.vb, "10.9.0.2/24".parse().unwrap(), false)
            .unwrap();
        let mut asked = wanted("r6a", &["10.9.0.100"]);
        asked.extend(wanted("nope6", &["10.9.0.5"]));
        asked.extend(wanted("lo", &["10.9.0.6"]));
        let responder = Responder::new();
        let errors = responder.set(&asked);
        assert!(
            matches!(&errors[..], [ResponderError::NotEthernet { interface: lo }, ResponderError::NoSuchInterface { interface: nope }] if lo == "lo" && nope == "nope6"),
            "{errors:?}"
        );
        assert_eq!(errors[1].to_string(), "interface nope6: no such interface");
        resolve(ip("10.9.0.100"));
        let va_mac = Some(p.va.1.to_vec());
        assert!(eventually(
            || neighbour(&p.s, p.vb, ip("10.9.0.100")).is_some_and(|n| n.1 == va_mac)
        ));
        let report = responder.report();
        assert!(report.interfaces["nope6"].error.is_some());
        assert!(report.interfaces["nope6"].addresses.is_empty());
        assert!(report.interfaces["r6a"].error.is_none());

        // The link goes away under its thread.
        p.s.delete_link(p.va.0).unwrap();
        let gone = eventually(|| {
            matches!(
                responder.report().interfaces["r6a"].error,
                Some(ResponderError::LinkGone { .. })
            )
        });
        assert!(gone, "{:?}", responder.report());
        assert!(responder.report().interfaces["r6a"].addresses.is_empty());
        assert!(
            eventually(|| threads_named("l2-r6a") == 0),
            "the thread ended"
        );
        // Asked again, it is missing.
        let errors = responder.set(&wanted("r6a", &["10.9.0.100"]));
        assert!(
            matches!(&errors[..], [ResponderError::NoSuchInterface { .. }]),
            "{errors:?}"
        );
        assert_eq!(
            responder.report().interfaces.len(),
            1,
            "only what was asked last"
        );
    });
}

/// Drops CAP_NET_RAW from the calling thread's effective set (capabilities are
/// per thread: the rest of the test process keeps it).
fn drop_net_raw() {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    const CAP_NET_RAW: u32 = 13;
    let mut header = Header {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget/capset with a valid header and two data structs (version 3).
    unsafe {
        assert_eq!(
            libc::syscall(libc::SYS_capget, &raw mut header, data.as_mut_ptr()),
            0
        );
        data[0].effective &= !(1 << CAP_NET_RAW);
        assert_eq!(
            libc::syscall(libc::SYS_capset, &raw mut header, data.as_ptr()),
            0
        );
    }
}

#[test]
fn l2_responder_without_cap_net_raw() {
    if !root("l2_responder_without_cap_net_raw") {
        return;
    }
    in_private_netns(|| {
        pair("r7a", "r7b");
        drop_net_raw();
        let errors = Responder::new().set(&wanted("r7a", &["10.9.0.100"]));
        assert!(
            matches!(&errors[..], [ResponderError::NeedsCapNetRaw { .. }]),
            "{errors:?}"
        );
        let message = errors[0].to_string();
        assert!(
            message.starts_with("interface r7a: opening a packet socket: EPERM")
                && message.ends_with("(answering ARP/NDP needs CAP_NET_RAW)"),
            "{message}"
        );
    });
}

#[test]
fn l2_responder_announces_again_after_link_down_up() {
    if !root("l2_responder_announces_again_after_link_down_up") {
        return;
    }
    in_private_netns(|| {
        let p = pair("r8a", "r8b");
        let responder = Responder::new();
        assert!(
            responder
                .set(&wanted("r8a", &["10.9.0.100", "fd00:9::100"]))
                .is_empty()
        );
        let gratuitous = || responder.report().interfaces["r8a"].gratuitous;
        assert!(eventually(|| gratuitous() == 6), "{}", gratuitous());
        p.s.set_link_down(p.va.0).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        p.s.set_link_up(p.va.0).unwrap();
        assert!(eventually(|| gratuitous() == 12), "{}", gratuitous());
        let report = &responder.report().interfaces["r8a"];
        assert!(report.error.is_none(), "{report:?}");
        assert_eq!(report.addresses.len(), 2);
    });
}

/// The context switches and CPU ticks (user + system) so far of this process's
/// thread called `name`.
fn thread_usage(name: &str) -> (u64, u64) {
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = task.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).unwrap();
        let switches: u64 = status
            .lines()
            .filter(|l| l.contains("ctxt_switches:"))
            .map(|l| l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap())
            .sum();
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap();
        // After the parenthesised name: state is field 3, utime 14, stime 15.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        let ticks = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        return (switches, ticks);
    }
    panic!("no thread {name}");
}

/// Sends `count` IPv6 frames to `dst_mac` out of link `index`, each with
/// next header `next_header` and, after the IPv6 header, first byte `first`.
fn flood(index: u32, dst_mac: [u8; 6], next_header: u8, first: u8, count: usize) {
    // SAFETY: a packet socket, closed below; `addr` and `frame` are valid.
    unsafe {
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0);
        assert!(fd >= 0);
        let mut addr: libc::sockaddr_ll = std::mem::zeroed();
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_ifindex = index as i32;
        addr.sll_protocol = 0x86ddu16.to_be();
        let len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        assert_eq!(libc::bind(fd, (&raw const addr).cast(), len), 0);
        let mut frame = dst_mac.to_vec();
        frame.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x77, 0x86, 0xdd, 0x60, 0, 0, 0, 0, 8]);
        frame.extend_from_slice(&[next_header, 255]);
        frame.extend_from_slice(&"fd00:9::2".parse::<Ipv6Addr>().unwrap().octets());
        frame.extend_from_slice(&"fd00:9::100".parse::<Ipv6Addr>().unwrap().octets());
        frame.extend_from_slice(&[first, 0, 0, 0, 0, 0, 0, 0]);
        for _ in 0..count {
            let sent = libc::send(fd, frame.as_ptr().cast(), frame.len(), 0);
            assert_eq!(sent, frame.len() as isize);
        }
        libc::close(fd);
    }
}

/// The thread sleeps while nothing is asked, and the NDP socket's filter keeps
/// it asleep through 10,000 IPv6 packets that are not neighbour solicitations
/// (to the joined solicited-node group: a real NIC would pass them too).
#[test]
fn l2_responder_sleeps_through_other_traffic() {
    if !root("l2_responder_sleeps_through_other_traffic") {
        return;
    }
    in_private_netns(|| {
        let p = pair("r9a", "r9b");
        let responder = Responder::new();
        assert!(responder.set(&wanted("r9a", &["fd00:9::100"])).is_empty());
        assert!(eventually(|| responder.report().interfaces["r9a"]
            .gratuitous
            == 3));
        std::thread::sleep(Duration::from_millis(100));

        let before = thread_usage("l2-r9a");
        std::thread::sleep(Duration::from_secs(1));
        let idle = thread_usage("l2-r9a");
        let group = [0x33, 0x33, 0xff, 0x00, 0x01, 0x00];
        // UDP, and ICMPv6 echo requests (next header 58, type 128).
        flood(p.vb, group, 17, 0, 5000);
        flood(p.vb, group, 58, 128, 5000);
        std::thread::sleep(Duration::from_millis(200));
        let flooded = thread_usage("l2-r9a");
        eprintln!(
            "l2 responder thread: idle 1 s: {} wake-ups, {} ticks; 10,000 other IPv6 packets: {} wake-ups, {} ticks",
            idle.0 - before.0,
            idle.1 - before.1,
            flooded.0 - idle.0,
            flooded.1 - idle.1,
        );
        // At most the peer's duplicate address detection of its link-local
        // address (a real solicitation, within a second of the link coming up).
        assert!(idle.0 - before.0 <= 1, "woke up while idle");
        assert!(flooded.0 - idle.0 <= 2, "woke up for other packets");
        assert_eq!(
            responder.report().interfaces["r9a"].neighbour_advertisements,
            0
        );
    });
}
