//! One round trip per ADD: the allocation journals the endpoint pending, the
//! plugin marks the host link wired as its last netlink change, and the report
//! that binds the addresses is not waited for. What must hold when that report
//! never arrives or arrives too late: a daemon killed right after ADD returned
//! keeps the address (restart and expiry bind it by the wired marker); an ADD
//! stopped between the host side and the marker still expires with its link;
//! CHECK and DEL right after ADD see the pending endpoint; a report that comes
//! after DEL is refused.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use podnet::api::client::AllocateParams;
use podnet::api::http::parse_response;
use podnet::datapath::link_marker::LinkMarker;

use crate::harness::*;
use crate::round_trips::{Kill, Proxy, eventually};

/// A single-stack node whose pending addresses expire after `expiration`
/// (long enough for an ADD on a busy machine: one that takes longer has its
/// addresses expire before the link is marked wired, as it should).
fn node(cidr: &str, expiration: &str) -> Node {
    Node::start(&[
        "--cluster-pool-ipv4-cidr",
        cidr,
        "--ipam-expiration",
        expiration,
        "--k8s-node-name",
        "pending-node",
    ])
}

/// Whether `ip` is allocated and no longer expiring.
fn bound(node: &Node, ip: &str) -> bool {
    node.allocations()
        .get(ip)
        .is_some_and(|o| !o.contains("[expiring]"))
}

#[test]
fn a_daemon_killed_right_after_add_keeps_the_address_through_restart_and_expiry() {
    if !root_or_skip("daemon_killed_after_add") {
        return;
    }
    let mut node = node("10.56.0.0/16", "5s");
    let proxy = Proxy::start(&node.dir, node.socket(), Kill::Hold("POST /v1/cni/report"));
    let a = node.sandbox();
    let r = node.plugin("ADD", Some(&a), &proxy.conf(), &[]);
    assert!(r.ok, "{r:?}");
    // The daemon never got the report: the address is pending, the link wired.
    assert!(eventually(5, || proxy.held().len() == 1));
    let ip = r.ipv4();
    assert!(!bound(&node, &ip), "{:?}", node.allocations());
    let host = podnet::datapath::host_ifname(&a.container_id, "eth0");
    let alias = node.link_alias(&host).expect("marker");
    assert!(
        LinkMarker::parse(&alias).is_some_and(|m| m.wired),
        "{alias}"
    );
    // SIGKILL, and stay down past the expiration.
    node.stop_daemon(true);
    std::thread::sleep(Duration::from_millis(5500));
    node.start_daemon();
    assert!(
        eventually(5, || bound(&node, &ip)),
        "{:?}\n{}",
        node.allocations(),
        node.log()
    );
    assert!(node.log().contains("marked wired"), "{}", node.log());
    // And it stays: nothing else expires it, the pod keeps its link.
    std::thread::sleep(Duration::from_millis(5500));
    assert!(bound(&node, &ip), "{:?}", node.allocations());
    assert_eq!(node.host_links(), std::slice::from_ref(&host));
    assert!(a.ping(&node.ipv4_addressing().ip));
    assert!(node.client().endpoint(&a.container_id, "eth0").is_ok());
    assert!(node.del(&a).ok);
    assert!(node.host_links_gone());
}

#[test]
fn an_add_stopped_before_the_wired_marker_expires_with_its_link() {
    if !root_or_skip("stopped_before_wired") {
        return;
    }
    let node = node("10.57.0.0/16", "5s");
    let a = node.sandbox();
    // What a plugin killed after the host side and before the marker leaves: the
    // allocation (with its pending endpoint), and the pair with the host side up
    // and marked with the allocation's commit, not wired.
    let netns = a.ns.path();
    let resp = node
        .client()
        .allocate(&AllocateParams {
            owner: "default/stopped",
            expiration: true,
            container_id: &a.container_id,
            ifname: "eth0",
            network: "podnet-it",
            netns: &netns,
            ..Default::default()
        })
        .expect("allocate");
    assert!(resp.endpoint_pending, "{resp:?}");
    let ip = resp.address.ipv4.clone();
    assert!(node.client().endpoint(&a.container_id, "eth0").is_ok());
    let host = podnet::datapath::host_ifname(&a.container_id, "eth0");
    let marker = format!("podnet j={} c={} i=eth0", resp.journal_mark, a.container_id);
    for cmd in [
        vec![
            "ip", "link", "add", &host, "type", "veth", "peer", "name", "eth0", "netns", &a.ns.name,
        ],
        vec!["ip", "link", "set", "dev", &host, "alias", &marker, "up"],
    ] {
        let out = node.ns.exec(&cmd);
        assert!(out.status.success(), "{cmd:?}: {out:?}");
    }
    // The expiry finds no wired marker: address, endpoint and link go.
    assert!(
        eventually(10, || !node.allocations().contains_key(&ip)
            && node.host_links().is_empty()),
        "left: {:?} {:?}",
        node.allocations(),
        node.host_links()
    );
    assert!(node.client().endpoint(&a.container_id, "eth0").is_err());
    assert!(a.interface_gone());
    assert!(node.log().contains("not marked wired"), "{}", node.log());
}

#[test]
fn check_and_del_right_after_add_work_and_a_report_after_del_is_refused() {
    if !root_or_skip("del_right_after_add") {
        return;
    }
    // No expiry in this test's time: CHECK and DEL meet the pending endpoint.
    let node = node("10.58.0.0/16", "60s");
    let proxy = Proxy::start(&node.dir, node.socket(), Kill::Hold("POST /v1/cni/report"));
    let a = node.sandbox();
    let r = node.plugin("ADD", Some(&a), &proxy.conf(), &[]);
    assert!(r.ok, "{r:?}");
    let ip = r.ipv4();
    // Pending (the report is held back), yet CHECK and status see the endpoint.
    assert!(!bound(&node, &ip));
    let check = node.check(&a, &r);
    assert!(check.ok, "{check:?}");
    let owner = format!("default/{}", a.ns.name);
    let allocs = node.allocations();
    assert!(
        allocs.get(&ip).is_some_and(|o| o.starts_with(&owner)),
        "status: {allocs:?}"
    );
    let explained = node.client().explain(&a.container_id).expect("explain");
    assert_eq!(explained.addresses.len(), 1, "{explained:?}");
    assert!(node.del(&a).ok);
    assert!(!node.allocations().contains_key(&ip));
    assert!(node.client().endpoint(&a.container_id, "eth0").is_err());
    assert!(node.host_links_gone());
    // The report arrives after the DEL: refused, nothing comes back.
    assert!(eventually(5, || proxy.held().len() == 1));
    let mut s = UnixStream::connect(node.socket()).expect("connect");
    s.write_all(&proxy.held()[0])
        .expect("write the late report");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read");
    let resp = parse_response(&raw).expect("HTTP");
    assert_eq!(resp.status, 409, "{}", String::from_utf8_lossy(&resp.body));
    assert!(
        String::from_utf8_lossy(&resp.body).contains("report refused"),
        "{}",
        String::from_utf8_lossy(&resp.body)
    );
    assert!(!node.allocations().contains_key(&ip));
    assert!(node.client().endpoint(&a.container_id, "eth0").is_err());
}
