//! The core path on one node: ADD gives distinct addresses from the node CIDR with
//! real connectivity, CHECK verifies, DEL frees (also twice, and after the netns is
//! gone), GC frees attachments that are no longer valid.

use crate::harness::*;

#[test]
fn two_sandboxes_get_distinct_addresses_and_reach_each_other() {
    if !root_or_skip("two_sandboxes") {
        return;
    }
    let node = Node::dual_stack();
    let a = node.sandbox();
    let b = node.sandbox();
    let ra = node.add(&a);
    let rb = node.add(&b);
    assert!(ra.ok && rb.ok, "{ra:?} {rb:?}");
    let (a4, a6, b4, b6) = (ra.ipv4(), ra.ipv6(), rb.ipv4(), rb.ipv6());
    assert_ne!(a4, b4);
    assert_ne!(a6, b6);
    let cfg = node.client().config().expect("config").status;
    let v4 = cfg.addressing.ipv4.expect("ipv4 addressing");
    let v6 = cfg.addressing.ipv6.expect("ipv6 addressing");
    for (ip, range) in [
        (&a4, &v4.alloc_range),
        (&b4, &v4.alloc_range),
        (&a6, &v6.alloc_range),
        (&b6, &v6.alloc_range),
    ] {
        let net: ipnet::IpNet = range.parse().expect("alloc range");
        assert!(
            net.contains(&ip.parse::<std::net::IpAddr>().expect("ip")),
            "{ip} not in {range}"
        );
    }
    assert!(
        v4.alloc_range.starts_with("10.20."),
        "node CIDR {} not from the pool",
        v4.alloc_range
    );

    // The result: host side first, pod side second with its sandbox; ips point at it.
    let res = ra.json();
    assert_eq!(res["cniVersion"], "1.1.0");
    assert!(
        res["interfaces"][0]["name"]
            .as_str()
            .unwrap_or("")
            .starts_with("lxc")
    );
    assert!(res["interfaces"][0].get("sandbox").is_none());
    assert_eq!(res["interfaces"][1]["name"], "eth0");
    assert_eq!(res["interfaces"][1]["sandbox"], a.ns.path());
    for ip in res["ips"].as_array().expect("ips") {
        assert_eq!(ip["interface"], 1);
    }
    assert_eq!(res["ips"][1]["address"], format!("{a4}/32"));
    assert_eq!(res["ips"][0]["address"], format!("{a6}/128"));

    // Connectivity both ways, both families, and to the router.
    assert!(a.ping(&b4), "a cannot reach b over IPv4");
    assert!(b.ping(&a4), "b cannot reach a over IPv4");
    assert!(a.ping(&b6), "a cannot reach b over IPv6");
    assert!(b.ping(&a6), "b cannot reach a over IPv6");
    assert!(a.ping(&v4.ip), "a cannot reach the IPv4 router");
    assert!(a.ping(&v6.ip), "a cannot reach the IPv6 router");

    // The daemon knows both, with their owners.
    let allocs = node.allocations();
    assert_eq!(
        allocs.get(&a4).map(String::as_str),
        Some(format!("default/{}", a.ns.name).as_str())
    );
    assert!(allocs.contains_key(&b6));
    assert_eq!(allocs.get(&v4.ip).map(String::as_str), Some("router"));
    assert!(node.del(&a).ok && node.del(&b).ok);
}

#[test]
fn check_passes_then_fails_after_the_pod_route_is_removed() {
    if !root_or_skip("check") {
        return;
    }
    let node = Node::dual_stack();
    let a = node.sandbox();
    let r = node.add(&a);
    let c = node.check(&a, &r);
    assert!(c.ok, "CHECK right after ADD failed: {c:?}");
    let out = a.ns.exec(&["ip", "-4", "route", "del", "default"]);
    assert!(out.status.success());
    let c = node.check(&a, &r);
    assert_eq!(c.code(), 103, "{c:?}");
    assert!(c.msg().contains("route 0.0.0.0/0"), "{}", c.msg());
    // Removing the address is reported too.
    let v4 = r.ipv4();
    a.ns.exec(&[
        "ip",
        "-4",
        "route",
        "add",
        "default",
        "via",
        &node.ipv4_addressing().ip,
        "dev",
        "eth0",
    ]);
    a.ns.exec(&["ip", "addr", "del", &format!("{v4}/32"), "dev", "eth0"]);
    let c = node.check(&a, &r);
    assert_eq!(c.code(), 103, "{c:?}");
    assert!(c.msg().contains(&v4), "{}", c.msg());
}

#[test]
fn del_frees_the_address_is_idempotent_and_works_without_the_netns() {
    if !root_or_skip("del") {
        return;
    }
    let node = Node::dual_stack();
    let a = node.sandbox();
    let mut b = node.sandbox();
    let ra = node.add(&a);
    let rb = node.add(&b);
    let (a4, b4, b6) = (ra.ipv4(), rb.ipv4(), rb.ipv6());
    assert_eq!(node.host_links().len(), 2);

    let d = node.del(&a);
    assert!(d.ok, "{d:?}");
    assert!(!node.allocations().contains_key(&a4));
    assert!(a.interface_gone(), "eth0 survived DEL");
    let d = node.del(&a);
    assert!(d.ok, "second DEL failed: {d:?}");

    // The pod vanished before DEL: the netns is gone, DEL still frees everything.
    b.ns.delete();
    let d = node.del(&b);
    assert!(d.ok, "DEL without netns failed: {d:?}");
    let allocs = node.allocations();
    assert!(
        !allocs.contains_key(&b4) && !allocs.contains_key(&b6),
        "{allocs:?}"
    );
    assert!(
        node.host_links_gone(),
        "links left: {:?}",
        node.host_links()
    );

    // DEL with an empty CNI_NETNS.
    let c = node.sandbox();
    let rc = node.add(&c);
    let c4 = rc.ipv4();
    let d = node.plugin("DEL", Some(&c), &node.conf("1.1.0"), &[("CNI_NETNS", "")]);
    assert!(d.ok, "{d:?}");
    assert!(!node.allocations().contains_key(&c4));
}

#[test]
fn gc_releases_attachments_missing_from_the_valid_list() {
    if !root_or_skip("gc") {
        return;
    }
    let node = Node::dual_stack();
    let a = node.sandbox();
    let b = node.sandbox();
    let (ra, rb) = (node.add(&a), node.add(&b));
    let (a4, b4) = (ra.ipv4(), rb.ipv4());

    // No valid-attachments key: nothing is released, and stderr says so.
    let g = node.plugin("GC", None, &node.conf("1.1.0"), &[]);
    assert!(g.ok, "{g:?}");
    assert!(g.stderr.contains("releasing nothing"), "{}", g.stderr);
    assert!(node.allocations().contains_key(&a4));

    // Only b is valid: a's addresses and host link go.
    let mut conf: serde_json::Value = serde_json::from_str(&node.conf("1.1.0")).expect("conf");
    conf["cni.dev/valid-attachments"] =
        serde_json::json!([{"containerID": b.container_id, "ifname": "eth0"}]);
    let g = node.plugin("GC", None, &conf.to_string(), &[]);
    assert!(g.ok, "{g:?}");
    let allocs = node.allocations();
    assert!(!allocs.contains_key(&a4), "{allocs:?}");
    assert!(allocs.contains_key(&b4));
    assert_eq!(node.host_links().len(), 1, "a's host link should be gone");
    assert!(b.ping(&node.ipv4_addressing().ip));

    // The legacy key works too, and a config below 1.1.0 may not GC.
    let mut conf: serde_json::Value = serde_json::from_str(&node.conf("1.1.0")).expect("conf");
    conf["cni.dev/attachments"] = serde_json::json!([]);
    assert!(node.plugin("GC", None, &conf.to_string(), &[]).ok);
    assert!(!node.allocations().contains_key(&b4));
    let g = node.plugin("GC", None, &node.conf("1.0.0"), &[]);
    assert_eq!(g.code(), 1);
}

#[test]
fn status_reports_ready_then_exhausted_and_add_names_the_full_range() {
    if !root_or_skip("status") {
        return;
    }
    // A /29 has 6 usable addresses: router + health leave 4 for pods.
    let node = Node::start(&[
        "--cluster-pool-ipv4-cidr",
        "10.30.0.0/24",
        "--cluster-pool-ipv4-mask-size",
        "29",
        "--k8s-node-name",
        "small",
        "--ipam-release-cooldown",
        "2s",
    ]);
    assert!(node.plugin("STATUS", None, &node.conf("1.1.0"), &[]).ok);
    let sbs: Vec<Sandbox> = (0..5).map(|_| node.sandbox()).collect();
    for sb in &sbs[..4] {
        let r = node.add(sb);
        assert!(r.ok, "{r:?}");
    }
    let full = node.add(&sbs[4]);
    assert_eq!(full.code(), 101, "{full:?}");
    assert!(full.msg().contains("range is full"), "{}", full.msg());
    assert!(
        full.msg().contains("10.30.0.0/29") && full.msg().contains("small"),
        "{}",
        full.msg()
    );
    assert!(
        sbs[4]
            .ns
            .exec(&["ip", "link", "show", "eth0"])
            .status
            .code()
            != Some(0),
        "failed ADD left eth0"
    );
    assert_eq!(node.host_links().len(), 4, "failed ADD left a host link");
    let st = node.plugin("STATUS", None, &node.conf("1.1.0"), &[]);
    assert_eq!(st.code(), 51, "{st:?}");
    assert!(st.msg().contains("exhausted"), "{}", st.msg());
    // The released address cools down first: still full, and STATUS says so.
    let freed = node
        .allocations()
        .into_iter()
        .find(|(_, o)| o.ends_with(&sbs[0].ns.name))
        .map(|(ip, _)| ip);
    assert!(node.del(&sbs[0]).ok);
    assert_eq!(
        node.plugin("STATUS", None, &node.conf("1.1.0"), &[]).code(),
        51
    );
    assert_eq!(node.add(&sbs[4]).code(), 101);
    let cooling = node.client().healthz().expect("healthz").ipam.cooling;
    assert!(
        freed.as_ref().is_some_and(|ip| cooling.contains_key(ip)),
        "{cooling:?}"
    );
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert!(node.plugin("STATUS", None, &node.conf("1.1.0"), &[]).ok);
    let r = node.add(&sbs[4]);
    assert!(r.ok, "{r:?}");
    assert_eq!(Some(r.ipv4()), freed);
}

#[test]
fn a_retried_add_replaces_its_own_interface_but_not_a_foreign_one() {
    if !root_or_skip("retried_add") {
        return;
    }
    let node = Node::dual_stack();
    let a = node.sandbox();
    let first = node.add(&a);
    let second = node.add(&a);
    assert!(second.ok, "{second:?}");
    // The first attempt's addresses were given back, not leaked.
    let allocs = node.allocations();
    assert!(
        !allocs.contains_key(&first.ipv4()) || first.ipv4() == second.ipv4(),
        "{allocs:?}"
    );
    assert_eq!(node.host_links().len(), 1);
    assert!(a.ping(&node.ipv4_addressing().ip));

    // An eth0 podnet did not make is left alone: code 104, nothing allocated.
    let b = node.sandbox();
    b.ns.exec(&[
        "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "other0",
    ]);
    let before = node.allocations().len();
    let r = node.add(&b);
    assert_eq!(r.code(), 104, "{r:?}");
    assert_eq!(node.allocations().len(), before);
    assert!(b.ns.exec(&["ip", "link", "show", "eth0"]).status.success());
}

#[test]
fn a_host_link_left_without_its_pod_end_is_replaced() {
    if !root_or_skip("stale_host_link") {
        return;
    }
    let node = Node::dual_stack();
    let a = node.sandbox();
    // A link under this attachment's host-side name with no end in the pod (a veth
    // whose peer stays in the node netns): creating the pair finds the name taken,
    // the link goes as a previous attempt's, and the creation is retried.
    let host = podnet::datapath::host_ifname(&a.container_id, "eth0");
    let made = node.ns.exec(&[
        "ip", "link", "add", &host, "type", "veth", "peer", "name", "stale0",
    ]);
    assert!(made.status.success(), "{made:?}");
    let r = node.add(&a);
    assert!(r.ok, "{r:?}");
    // The new pair's host end has its peer in the pod; the stale one's peer went with it.
    let shown = node.ns.exec(&["ip", "link", "show", &host]);
    assert!(
        String::from_utf8_lossy(&shown.stdout).contains("link-netns"),
        "{shown:?}"
    );
    assert!(
        !node
            .ns
            .exec(&["ip", "link", "show", "stale0"])
            .status
            .success()
    );
    assert_eq!(node.host_links().len(), 1);
    assert!(a.ping(&node.ipv4_addressing().ip));
}

#[test]
fn ipv4_only_node_with_spec_1_0_0() {
    if !root_or_skip("ipv4_only") {
        return;
    }
    let node = Node::start(&[
        "--cluster-pool-ipv4-cidr",
        "10.40.0.0/16",
        "--k8s-node-name",
        "v4only",
    ]);
    let a = node.sandbox();
    let r = node.plugin("ADD", Some(&a), &node.conf("1.0.0"), &[]);
    assert!(r.ok, "{r:?}");
    let res = r.json();
    assert_eq!(res["cniVersion"], "1.0.0");
    assert_eq!(r.ips().len(), 1);
    // 1.1-only fields are not sent to a 1.0.0 runtime.
    assert!(
        res["routes"]
            .as_array()
            .expect("routes")
            .iter()
            .all(|rt| rt.get("mtu").is_none())
    );
    assert!(res["interfaces"][0].get("mtu").is_none());
    let v = node.plugin("VERSION", None, r#"{"cniVersion":"1.0.0"}"#, &[]);
    assert!(v.ok);
    assert_eq!(
        v.json()["supportedVersions"],
        serde_json::json!(["0.4.0", "1.0.0", "1.1.0"])
    );
}

/// `/proc/sys/net/ipv6/conf/<link>/disable_ipv6` in the node namespace.
fn host_ipv6_disabled(node: &Node, link: &str) -> String {
    let out = node.ns.exec(&[
        "cat",
        &format!("/proc/sys/net/ipv6/conf/{link}/disable_ipv6"),
    ]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn an_ipv4_only_pod_has_no_ipv6_on_its_host_link_a_dual_stack_pod_has() {
    if !root_or_skip("host_link_ipv6") {
        return;
    }
    // IPv4 only: no link-local address, no fe80::/64 or ff00::/8 route per pod
    // (kernel work that grows with the pods on the node), and the pod still works.
    let node = Node::start(&[
        "--cluster-pool-ipv4-cidr",
        "10.41.0.0/16",
        "--k8s-node-name",
        "v4host",
    ]);
    let a = node.sandbox();
    assert!(node.add(&a).ok);
    let host = node.host_links();
    assert_eq!(host.len(), 1, "{host:?}");
    assert_eq!(host_ipv6_disabled(&node, &host[0]), "1");
    let routes6 = node
        .ns
        .exec(&["ip", "-6", "route", "show", "table", "all", "dev", &host[0]]);
    assert!(routes6.status.success());
    assert_eq!(String::from_utf8_lossy(&routes6.stdout).trim(), "");
    assert!(a.ping(&node.ipv4_addressing().ip));
    assert!(node.del(&a).ok);
    assert!(node.host_links_gone());

    // Dual stack: the host link keeps IPv6 (NDP proxy for the pod's router).
    let dual = Node::dual_stack();
    let b = dual.sandbox();
    assert!(dual.add(&b).ok);
    let host = dual.host_links();
    assert_eq!(host_ipv6_disabled(&dual, &host[0]), "0");
    let router6 = dual.ipv6_addressing().ip;
    assert!(b.ping(&router6));
    assert!(dual.del(&b).ok);
}
