//! The cross-node datapath on a real kube-apiserver (integration/k8s.rs): node
//! daemons in namespaces on the control plane's fabric bridge (`--ipam kubernetes`,
//! each Node with its own pod CIDR), real pods made by the real plugin, and an
//! "outside" host on the fabric that routes nothing to pod addresses. In tunnel
//! mode (VXLAN) and native mode (auto-direct-node-routes): pod to pod across nodes
//! (ping and a TCP exchange), node to remote pod, pod to remote node, a full-size
//! don't-fragment ping, the outside host seeing the node's address as the source
//! (masquerade); in tunnel mode also a deleted node's routes and FDB entries going,
//! a new node becoming reachable, and a daemon restart that keeps the routes and a
//! live TCP connection; and tunnel mode over an IPv6 underlay (`--underlay-protocol
//! ipv6`) between IPv6-only nodes whose fabric carries no IPv4.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use podnet::api::models::CrossNodeStatus;
use podnet::datapath::{NetNs, in_netns};

use crate::harness::*;
use crate::k8s::{API_IP, ControlPlane, NodeNs};
use crate::k8s_backend::{
    add_as, add_service_cidr, create_node, create_pod, k8s_node, operator_allocates,
    set_internal_ips,
};

/// Waits until `f` holds, at most `limit`.
pub fn wait_for(what: &str, limit: Duration, f: impl FnMut() -> bool) {
    wait_showing(what, limit, f, String::new);
}

/// Waits until `f` holds, at most `limit`; on timeout the panic shows `detail()`.
fn wait_showing(
    what: &str,
    limit: Duration,
    mut f: impl FnMut() -> bool,
    detail: impl Fn() -> String,
) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n{}",
            detail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn open(ns: &Netns) -> NetNs {
    NetNs::open(ns.path()).expect("open netns")
}

/// A TCP listener on every address of `ns` of `ip`'s family.
pub fn listen(ns: &Netns, ip: IpAddr) -> TcpListener {
    let any = match ip {
        IpAddr::V4(_) => "0.0.0.0:0",
        IpAddr::V6(_) => "[::]:0",
    };
    let l = in_netns(&open(ns), || Ok(TcpListener::bind(any)))
        .expect("enter netns")
        .expect("bind");
    l.set_nonblocking(true).expect("nonblocking");
    l
}

/// A connection from inside `ns`.
pub fn connect(ns: &Netns, to: SocketAddr) -> TcpStream {
    let s = in_netns(&open(ns), || {
        Ok(TcpStream::connect_timeout(&to, Duration::from_secs(3)))
    })
    .expect("enter netns")
    .unwrap_or_else(|e| panic!("connecting to {to}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(3)))
        .expect("timeout");
    s
}

/// Accepts one connection within 5 s.
pub fn accept(l: &TcpListener) -> (TcpStream, SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match l.accept() {
            Ok((s, peer)) => {
                s.set_nonblocking(false).expect("blocking");
                s.set_read_timeout(Some(Duration::from_secs(3)))
                    .expect("timeout");
                return (s, peer);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline, "no connection arrived");
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

/// One line each way over a connection.
fn exchange(client: &mut TcpStream, server: &mut TcpStream, line: &str) {
    writeln!(client, "{line}").expect("client write");
    let mut got = String::new();
    BufReader::new(&mut *server)
        .read_line(&mut got)
        .expect("server read");
    assert_eq!(got.trim(), line);
    writeln!(server, "re: {line}").expect("server write");
    let mut back = String::new();
    BufReader::new(&mut *client)
        .read_line(&mut back)
        .expect("client read");
    assert_eq!(back.trim(), format!("re: {line}"));
}

/// A TCP connection from `from` to `to_ip` in `to`, one exchange; returns the
/// source address the server saw.
fn tcp_exchange(from: &Netns, to: &Netns, to_ip: &str) -> IpAddr {
    let ip: IpAddr = to_ip.parse().expect("ip");
    let l = listen(to, ip);
    let port = l.local_addr().expect("port").port();
    let mut c = connect(from, SocketAddr::new(ip, port));
    let (mut s, peer) = accept(&l);
    exchange(&mut c, &mut s, "hello across nodes");
    peer.ip()
}

pub fn ping(ns: &Netns, args: &[&str], ip: &str) -> bool {
    let family = if ip.contains(':') { "-6" } else { "-4" };
    let mut all = vec!["ping", family, "-c1", "-W2"];
    all.extend_from_slice(args);
    all.push(ip);
    ns.exec(&all).status.success()
}

pub fn cross_node(node: &Node) -> CrossNodeStatus {
    node.client()
        .healthz()
        .expect("status")
        .ipam
        .cross_node
        .expect("the cross-node datapath runs")
}

pub fn show(ns: &Netns, args: &[&str]) -> String {
    String::from_utf8_lossy(&ns.exec(args).stdout).to_string()
}

pub fn podnet_routes(node: &Node) -> String {
    show(&node.ns, &["ip", "-4", "route", "show", "proto", "77"])
}

pub fn fdb(node: &Node) -> String {
    show(&node.ns, &["bridge", "fdb", "show", "dev", "podnet_vxlan"])
}

/// A node with its Node object (pod CIDRs `cidrs`), the operator's `blocks`
/// (pool, CIDR) in its CiliumNode, and its daemon with `args`, started. With an
/// IPv6 pod CIDR the node also gets an IPv6 fabric address, `fd00:250::<n>/64`
/// (`n` as in its IPv4 one), published as a second InternalIP.
pub fn start_node(
    cp: &ControlPlane,
    name: &str,
    cidrs: &[&str],
    blocks: &[(&str, &str)],
    args: &[&str],
) -> (Node, String) {
    let ns: NodeNs = cp.add_node_ns(name);
    create_node(cp, &ns, cidrs);
    if cidrs.iter().any(|c| c.contains(':')) {
        let v6 = format!("fd00:250::{}", ns.ip.octets()[3]);
        let added = ns.ns.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{v6}/64"),
            "dev",
            "eth0",
            "nodad",
        ]);
        assert!(added.status.success(), "{added:?}");
        set_internal_ips(cp, name, &[&ns.ip.to_string(), &v6]);
    }
    if !blocks.is_empty() {
        operator_allocates(cp, name, blocks);
    }
    let ip = ns.ip.to_string();
    let mut node = k8s_node(ns, &cp.kubeconfig(), args);
    node.start_daemon();
    (node, ip)
}

/// A pod on `node`, with its IPv4 address.
pub fn pod(node: &Node) -> (Sandbox, String) {
    let (sb, ips) = dual_stack_pod(node);
    (sb, ips[0].clone())
}

/// A pod on `node`, with its addresses (IPv4 first).
fn dual_stack_pod(node: &Node) -> (Sandbox, Vec<String>) {
    let sb = node.sandbox();
    let r = node.add(&sb);
    assert!(r.ok, "{}\n{}", r.stdout, node.log());
    let mut ips = r.ips();
    ips.sort_by_key(|ip| ip.contains(':'));
    (sb, ips)
}

fn mtu_of(sb: &Sandbox) -> u32 {
    let out = show(&sb.ns, &["ip", "-o", "link", "show", &sb.ifname]);
    out.split_whitespace()
        .skip_while(|w| *w != "mtu")
        .nth(1)
        .and_then(|m| m.parse().ok())
        .unwrap_or(0)
}

/// What every mode must do: pod to pod both ways (ping, TCP), node to remote
/// pod, pod to remote node, a full-size DF ping, masquerade towards the outside.
fn check_connectivity(
    nodes: &[(&Node, &str)],
    pods: &[(&Sandbox, &str)],
    outside: &Netns,
    outside_ip: &str,
    pod_mtu: u32,
) {
    let ((n1, n1_ip), (n2, n2_ip)) = (nodes[0], nodes[1]);
    let ((p1, p1_ip), (p2, p2_ip)) = (pods[0], pods[1]);
    wait_for("pod to pod across nodes", Duration::from_secs(10), || {
        ping(&p1.ns, &[], p2_ip)
    });
    assert!(ping(&p2.ns, &[], p1_ip), "{p2_ip} -> {p1_ip}\n{}", n2.log());
    assert_eq!(
        tcp_exchange(&p1.ns, &p2.ns, p2_ip).to_string(),
        p1_ip,
        "a pod reaches a pod with its own address"
    );
    assert!(ping(&n2.ns, &[], p1_ip), "node to remote pod");
    assert!(ping(&p1.ns, &[], n2_ip), "pod to remote node");
    assert_eq!(mtu_of(p1), pod_mtu);
    let full = (pod_mtu - 28).to_string();
    assert!(
        ping(&p1.ns, &["-M", "do", "-s", &full], p2_ip),
        "a full-size ({pod_mtu}) don't-fragment packet crosses"
    );
    let over = (pod_mtu - 27).to_string();
    assert!(
        !ping(&p1.ns, &["-M", "do", "-s", &over], p2_ip),
        "one byte more does not fit the pod MTU"
    );
    // The outside host has no route to pod addresses: only a masqueraded
    // connection can come back, and it shows the node's address.
    assert_eq!(
        tcp_exchange(&p1.ns, outside, outside_ip).to_string(),
        n1_ip,
        "the outside sees the node's address\n{}",
        show(&n1.ns, &["nft", "list", "table", "ip", "podnet"])
    );
}

#[test]
fn tunnel_mode_connects_pods_across_nodes_follows_node_changes_and_survives_a_restart() {
    const TEST: &str = "crossnode_tunnel";
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    cp.install_crds();
    let outside = cp.add_node_ns("outside");
    let tunnel = [
        "--ipam",
        "kubernetes",
        "--routing-mode",
        "tunnel",
        "--enable-ipv6",
    ];
    let (mut n1, n1_ip) = start_node(
        &cp,
        "xt-1",
        &["10.61.1.0/24", "fd00:61:1::/120"],
        &[],
        &tunnel,
    );
    let (n2, n2_ip) = start_node(
        &cp,
        "xt-2",
        &["10.61.2.0/24", "fd00:61:2::/120"],
        &[],
        &tunnel,
    );
    let (mut n3, n3_ip) = start_node(
        &cp,
        "xt-3",
        &["10.61.3.0/24", "fd00:61:3::/120"],
        &[],
        &tunnel,
    );
    let (p1, p1_ips) = dual_stack_pod(&n1);
    let (p2, p2_ips) = dual_stack_pod(&n2);
    let (_p3, p3_ips) = dual_stack_pod(&n3);
    let (p1_ip, p2_ip, p3_ip) = (p1_ips[0].clone(), p2_ips[0].clone(), p3_ips[0].clone());

    wait_for(
        "n1 to know both remote nodes",
        Duration::from_secs(10),
        || {
            let s = cross_node(&n1);
            s.routes == 4
                && s.remote_nodes
                    .iter()
                    .all(|r| r.path == format!("tunnel to {}", r.internal_ip))
        },
    );
    let status = cross_node(&n1);
    assert_eq!(status.tunnel_local, n1_ip);
    assert!(status.errors.is_empty(), "{:?}", status.errors);
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &n1.ns.name,
            podnet_bin(),
            "status",
            "--socket",
        ])
        .arg(n1.socket())
        .output()
        .expect("podnet status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("tunnel (vxlan over IPv4, port 8472, device podnet_vxlan)")
            && text.contains(&format!(
                "({n2_ip}): 10.61.2.0/24 fd00:61:2::/120: tunnel to {n2_ip}"
            )),
        "{text}"
    );
    let dev = show(&n1.ns, &["ip", "-d", "link", "show", "podnet_vxlan"]);
    assert!(
        dev.contains("mtu 1450")
            && dev.contains("vxlan id 2")
            && dev.contains(&format!("local {n1_ip}"))
            && dev.contains("dstport 8472")
            && dev.contains("nolearning"),
        "{dev}"
    );
    check_connectivity(
        &[(&n1, &n1_ip), (&n2, &n2_ip)],
        &[(&p1, &p1_ip), (&p2, &p2_ip)],
        &outside.ns,
        &outside.ip.to_string(),
        1450,
    );
    assert!(ping(&p1.ns, &[], &p3_ip), "and to the third node's pod");
    // IPv6 pods through the same (IPv4) tunnel.
    let (p1_v6, p2_v6) = (&p1_ips[1], &p2_ips[1]);
    assert!(ping(&p1.ns, &[], p2_v6), "{p1_v6} -> {p2_v6}");
    assert!(
        ping(&p2.ns, &["-M", "do", "-s", "1402"], p1_v6),
        "full-size IPv6 (1450)"
    );
    assert_eq!(tcp_exchange(&p2.ns, &p1.ns, p1_v6).to_string(), *p2_v6);
    assert!(ping(&n2.ns, &[], p1_v6), "node to remote pod over IPv6");
    assert!(
        show(&n1.ns, &["nft", "list", "table", "ip6", "podnet"]).contains("masquerade"),
        "IPv6 masquerade is on with IPv6"
    );

    // A node goes (its daemon stopped, its CiliumNode deleted): the others drop
    // its route and FDB entry.
    assert!(fdb(&n1).contains(&format!("dst {n3_ip}")), "{}", fdb(&n1));
    n3.stop_daemon(false);
    cp.kubectl(&["delete", "ciliumnode", "xt-3"])
        .expect_ok("delete the CiliumNode");
    wait_showing(
        "n3's route and FDB entry to go",
        Duration::from_secs(5),
        || {
            !podnet_routes(&n1).contains("10.61.3.0/24")
                && !fdb(&n1).contains(&format!("dst {n3_ip}"))
                && !show(&n1.ns, &["ip", "-6", "route", "show", "proto", "77"])
                    .contains("fd00:61:3::")
        },
        || {
            format!(
                "routes:\n{}fdb:\n{}status: {:?}\nlog:\n{}",
                podnet_routes(&n1),
                fdb(&n1),
                cross_node(&n1),
                n1.log()
            )
        },
    );
    assert!(!podnet_routes(&n2).contains("10.61.3.0/24"));
    drop(n3);

    // A new node becomes reachable.
    let (n4, _) = start_node(
        &cp,
        "xt-4",
        &["10.61.4.0/24", "fd00:61:4::/120"],
        &[],
        &tunnel,
    );
    let (p4, p4_ip) = pod(&n4);
    let joined = Instant::now();
    wait_for("the new node's pod", Duration::from_secs(10), || {
        ping(&p1.ns, &["-W1"], &p4_ip)
    });
    eprintln!(
        "{TEST}: new node's pod reachable {:?} after its ADD",
        joined.elapsed()
    );
    // node-2 learns node-4 through its own watch, which may come a moment after
    // node-1's: the reply from p2 needs it.
    wait_for(
        "the new node's pod to reach node-2's pod",
        Duration::from_secs(10),
        || ping(&p4.ns, &["-W1"], &p2_ip),
    );

    // A restart keeps the routes and a live connection.
    let p2_addr: IpAddr = p2_ip.parse().expect("ip");
    let l = listen(&p2.ns, p2_addr);
    let port = l.local_addr().expect("port").port();
    let mut c = connect(&p1.ns, SocketAddr::new(p2_addr, port));
    let (mut s, _) = accept(&l);
    exchange(&mut c, &mut s, "before the restart");
    let routes_before = podnet_routes(&n1);
    let fdb_before = fdb(&n1);
    let device = |n: &Node| show(&n.ns, &["ip", "-o", "link", "show", "podnet_vxlan"]);
    let device_before = device(&n1);
    n1.stop_daemon(false);
    assert_eq!(
        podnet_routes(&n1),
        routes_before,
        "the daemon's stop keeps the routes"
    );
    n1.start_daemon();
    wait_for(
        "the restarted daemon's first pass",
        Duration::from_secs(10),
        || cross_node(&n1).synced,
    );
    assert_eq!(podnet_routes(&n1), routes_before);
    assert_eq!(fdb(&n1), fdb_before);
    let index = |line: &str| line.split(':').next().unwrap_or_default().to_string();
    assert_eq!(
        index(&device(&n1)),
        index(&device_before),
        "the tunnel device is kept, not re-created"
    );
    exchange(&mut c, &mut s, "after the restart");
}

/// A node whose fabric interface (eth0) carries IPv6 only, `fd00:250::<n>/64`, its
/// Node's one InternalIP, with the IPv6 pod CIDR `cidr` and its daemon started.
/// Its IPv4 address leaves eth0 for a point-to-point veth (`mgmt`, off the fabric
/// bridge) to the control-plane namespace, with a /32 route each way: that is how
/// the daemon still reaches the API server at 10.250.0.1. Both ends of the veth go
/// with the node's namespace.
fn start_ipv6_only_node(
    cp: &ControlPlane,
    name: &str,
    cidr: &str,
    args: &[&str],
) -> (Node, String) {
    let ns: NodeNs = cp.add_node_ns(name);
    let host = ns.ip.octets()[3];
    let (v4, v6, api) = (ns.ip, format!("fd00:250::{host}"), API_IP);
    let (n, c) = (ns.ns.name.as_str(), cp.netns());
    for cmd in [
        format!("-n {n} addr del {v4}/24 dev eth0"),
        format!("-n {n} addr add {v6}/64 dev eth0 nodad"),
        format!("-n {n} link add mgmt type veth peer name m{host} netns {c}"),
        format!("-n {n} addr add {v4}/32 dev mgmt"),
        format!("-n {n} link set mgmt up"),
        format!("-n {n} route add {api}/32 dev mgmt"),
        format!("-n {c} link set m{host} up"),
        format!("-n {c} route add {v4}/32 dev m{host}"),
    ] {
        let out = Command::new("ip")
            .args(cmd.split_whitespace())
            .output()
            .expect("ip");
        assert!(out.status.success(), "ip {cmd}: {out:?}");
    }
    create_node(cp, &ns, &[cidr]);
    set_internal_ips(cp, name, &[&v6]);
    let mut node = k8s_node(ns, &cp.kubeconfig(), args);
    node.start_daemon();
    (node, v6)
}

#[test]
fn an_ipv6_underlay_tunnels_pods_across_a_fabric_without_ipv4() {
    const TEST: &str = "crossnode_ipv6_underlay";
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    cp.install_crds();
    // IPv6-only pods need an IPv6 Service range (daemon::node_check refuses a
    // pod network with no family in common with the Services): a second
    // ServiceCIDR beside the API server's IPv4 one.
    add_service_cidr(&cp, "ipv6", "fd00:96::/112");
    let args = [
        "--ipam",
        "kubernetes",
        "--routing-mode",
        "tunnel",
        "--enable-ipv4=false",
        "--enable-ipv6",
        "--underlay-protocol",
        "ipv6",
    ];
    let (n1, n1_ip) = start_ipv6_only_node(&cp, "x6-1", "fd00:63:1::/120", &args);
    let (n2, n2_ip) = start_ipv6_only_node(&cp, "x6-2", "fd00:63:2::/120", &args);
    let (p1, p1_ip) = pod(&n1);
    let (p2, p2_ip) = pod(&n2);
    wait_for("n1's tunnel to n2", Duration::from_secs(10), || {
        cross_node(&n1)
            .remote_nodes
            .iter()
            .any(|r| r.path == format!("tunnel to {n2_ip}"))
    });
    let status = cross_node(&n1);
    assert_eq!(status.tunnel_local, n1_ip);
    assert!(
        status
            .mode
            .starts_with("tunnel (vxlan over IPv6, port 8472")
            && status.errors.is_empty(),
        "{status:?}"
    );
    let dev = show(&n1.ns, &["ip", "-d", "link", "show", "podnet_vxlan"]);
    assert!(
        dev.contains("mtu 1430") && dev.contains(&format!("local {n1_ip}")),
        "{dev}"
    );
    assert!(fdb(&n1).contains(&format!("dst {n2_ip}")), "{}", fdb(&n1));
    assert_eq!(
        show(&n1.ns, &["ip", "-4", "-o", "addr", "show", "dev", "eth0"]),
        "",
        "no IPv4 on the fabric"
    );

    wait_for("pod to pod across nodes", Duration::from_secs(10), || {
        ping(&p1.ns, &[], &p2_ip)
    });
    assert!(
        ping(&p2.ns, &[], &p1_ip),
        "{p2_ip} -> {p1_ip}\n{}",
        n2.log()
    );
    assert_eq!(tcp_exchange(&p1.ns, &p2.ns, &p2_ip).to_string(), p1_ip);
    // 1500 - 70: the outer IPv6 header is 20 bytes more than IPv4's.
    assert_eq!(mtu_of(&p1), 1430);
    assert!(
        ping(&p1.ns, &["-M", "do", "-s", "1382"], &p2_ip),
        "a full-size (1430) don't-fragment IPv6 packet crosses"
    );
}

#[test]
fn native_mode_routes_pods_via_the_nodes_internal_ips() {
    const TEST: &str = "crossnode_native";
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    cp.install_crds();
    let outside = cp.add_node_ns("outside");
    let native = [
        "--ipam",
        "kubernetes",
        "--routing-mode",
        "native",
        "--auto-direct-node-routes",
        "--ipv4-native-routing-cidr",
        "10.62.0.0/16",
        "--enable-ipv6",
    ];
    let (n1, n1_ip) = start_node(
        &cp,
        "xn-1",
        &["10.62.1.0/24", "fd00:62:1::/120"],
        &[],
        &native,
    );
    let (n2, n2_ip) = start_node(
        &cp,
        "xn-2",
        &["10.62.2.0/24", "fd00:62:2::/120"],
        &[],
        &native,
    );
    let (p1, p1_ips) = dual_stack_pod(&n1);
    let (p2, p2_ips) = dual_stack_pod(&n2);
    let (p1_ip, p2_ip) = (p1_ips[0].clone(), p2_ips[0].clone());
    wait_for("n1's route to n2's pods", Duration::from_secs(10), || {
        podnet_routes(&n1).contains(&format!("10.62.2.0/24 via {n2_ip} dev eth0"))
    });
    let s = cross_node(&n1);
    assert_eq!(s.remote_nodes.len(), 1);
    let n2_v6 = format!("fd00:250::{}", n2_ip.rsplit('.').next().unwrap_or_default());
    assert_eq!(
        s.remote_nodes[0].path,
        format!("route via {n2_ip}, {n2_v6}")
    );
    assert!(s.tunnel_local.is_empty());
    assert!(
        show(&n1.ns, &["ip", "link", "show", "podnet_vxlan"]).is_empty(),
        "no tunnel device in native mode"
    );
    check_connectivity(
        &[(&n1, &n1_ip), (&n2, &n2_ip)],
        &[(&p1, &p1_ip), (&p2, &p2_ip)],
        &outside.ns,
        &outside.ip.to_string(),
        1500,
    );
    // IPv6 pods via the nodes' IPv6 InternalIPs.
    let routes6 = show(&n1.ns, &["ip", "-6", "route", "show", "proto", "77"]);
    assert!(
        routes6.contains(&format!("fd00:62:2::/120 via {n2_v6} dev eth0")),
        "{routes6}"
    );
    let (p1_v6, p2_v6) = (&p1_ips[1], &p2_ips[1]);
    assert!(ping(&p1.ns, &[], p2_v6), "{p1_v6} -> {p2_v6}");
    assert!(
        ping(&p2.ns, &["-M", "do", "-s", "1452"], p1_v6),
        "full-size IPv6 (1500)"
    );
    assert_eq!(tcp_exchange(&p2.ns, &p1.ns, p1_v6).to_string(), *p2_v6);
    assert!(ping(&n2.ns, &[], p1_v6), "node to remote pod over IPv6");

    // A node still in tunnel routing (the routing mode changing node by node):
    // the native nodes make a tunnel device for it and tunnel to it, both ways,
    // and still reach each other directly.
    let tunnel = ["--ipam", "kubernetes", "--enable-ipv6"];
    let (n3, n3_ip) = start_node(
        &cp,
        "xn-3",
        &["10.62.3.0/24", "fd00:62:3::/120"],
        &[],
        &tunnel,
    );
    let (p3, p3_ips) = dual_stack_pod(&n3);
    for native in [&n1, &n2] {
        wait_showing(
            "a native node's tunnel to the tunnel node",
            Duration::from_secs(10),
            || {
                cross_node(native)
                    .remote_nodes
                    .iter()
                    .any(|r| r.path == format!("tunnel to {n3_ip}"))
            },
            || format!("{:?}\n{}", cross_node(native), native.log()),
        );
    }
    let routes = podnet_routes(&n1);
    assert!(
        routes.contains(&format!("10.62.2.0/24 via {n2_ip} dev eth0"))
            && routes
                .lines()
                .any(|l| l.starts_with("10.62.3.0/24 via") && l.contains("dev podnet_vxlan")),
        "{routes}"
    );
    for (pod, ip) in [(&p1, &p1_ip), (&p2, &p2_ip)] {
        wait_for(
            "a native node's pod and the tunnel node's",
            Duration::from_secs(10),
            || ping(&pod.ns, &[], &p3_ips[0]),
        );
        assert!(ping(&p3.ns, &[], ip), "{} -> {ip}\n{}", p3_ips[0], n3.log());
        assert!(
            ping(&pod.ns, &[], &p3_ips[1]),
            "{ip} -> {} over IPv6",
            p3_ips[1]
        );
    }
    assert!(
        ping(&p1.ns, &[], &p2_ip),
        "the native nodes still reach each other"
    );
}

/// A pod `name` in namespace default on `node` (its Pod object first, so the
/// daemon can select its pool), with its IPv4 address.
pub fn pool_pod(
    cp: &ControlPlane,
    node: &Node,
    node_name: &str,
    name: &str,
    pool: &str,
) -> (Sandbox, String) {
    create_pod(
        cp,
        "default",
        name,
        node_name,
        &format!("ipam.cilium.io/ip-pool: {pool}"),
    );
    let sb = node.sandbox();
    let mut r = add_as(node, &sb, "default", name);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !r.ok && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        r = add_as(node, &sb, "default", name);
    }
    assert!(r.ok, "{name}: {}", r.stdout);
    let ip = r.ipv4();
    (sb, ip)
}

#[test]
fn multi_pool_blocks_cross_the_tunnel_and_a_skip_masquerade_pool_keeps_its_address() {
    const TEST: &str = "crossnode_multi_pool";
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    cp.install_crds();
    cp.apply(
        "apiVersion: cilium.io/v2alpha1\nkind: CiliumPodIPPool\nmetadata: {name: default}\n\
         spec:\n  ipv4: {cidrs: [10.80.0.0/16], maskSize: 27}\n---\n\
         apiVersion: cilium.io/v2alpha1\nkind: CiliumPodIPPool\nmetadata:\n  name: mars\n  annotations: {ipam.cilium.io/skip-masquerade: \"true\"}\n\
         spec:\n  ipv4: {cidrs: [10.81.0.0/16], maskSize: 27}\n",
    );
    let outside = cp.add_node_ns("outside");
    let args = [
        "--ipam",
        "multi-pool",
        "--ipam-multi-pool-pre-allocation",
        "default=2,mars=2",
        "--routing-mode",
        "tunnel",
    ];
    let mut nodes = Vec::new();
    for (name, default_block, mars_block) in [
        ("xm-1", "10.80.0.0/27", "10.81.0.0/27"),
        ("xm-2", "10.80.0.32/27", "10.81.0.32/27"),
    ] {
        let blocks = [("default", default_block), ("mars", mars_block)];
        nodes.push(start_node(&cp, name, &[], &blocks, &args));
    }
    let (n1, n1_ip) = &nodes[0];
    let (n2, _) = &nodes[1];
    let (plain, plain_ip) = pool_pod(&cp, n1, "xm-1", "plain", "default");
    let (martian, martian_ip) = pool_pod(&cp, n1, "xm-1", "martian", "mars");
    let (remote, remote_ip) = pool_pod(&cp, n2, "xm-2", "remote", "default");
    assert!(martian_ip.starts_with("10.81.0."), "{martian_ip}");

    // Both pools' blocks cross the tunnel.
    wait_for(
        "both of n2's blocks routed on n1",
        Duration::from_secs(10),
        || {
            let r = podnet_routes(n1);
            r.contains("10.80.0.32/27") && r.contains("10.81.0.32/27")
        },
    );
    // A block allocated to n2 is routed on n1, and gone once released (how long
    // that took is printed, not asserted).
    let n2_blocks = [("default", "10.80.0.32/27"), ("mars", "10.81.0.32/27")];
    let mut more = n2_blocks.to_vec();
    more.push(("default", "10.80.0.64/27"));
    let t0 = Instant::now();
    operator_allocates(&cp, "xm-2", &more);
    wait_for("the new block's route", Duration::from_secs(10), || {
        podnet_routes(n1).contains("10.80.0.64/27")
    });
    let added = t0.elapsed();
    let t0 = Instant::now();
    operator_allocates(&cp, "xm-2", &n2_blocks);
    wait_for(
        "the released block's route to go",
        Duration::from_secs(10),
        || !podnet_routes(n1).contains("10.80.0.64/27"),
    );
    eprintln!(
        "{TEST}: a new block routed {added:?} after the apply, a released one gone {:?} after",
        t0.elapsed()
    );
    assert!(
        ping(&remote.ns, &[], &plain_ip),
        "default pool across nodes"
    );
    assert!(ping(&remote.ns, &[], &martian_ip), "mars pool across nodes");
    assert_eq!(
        tcp_exchange(&martian.ns, &remote.ns, &remote_ip).to_string(),
        martian_ip
    );

    // Towards the outside (which routes the mars pool back to n1): the default
    // pool leaves as the node, mars keeps its address.
    assert!(
        outside
            .ns
            .exec(&["ip", "route", "add", "10.81.0.0/16", "via", n1_ip])
            .status
            .success()
    );
    let table = show(&n1.ns, &["nft", "list", "table", "ip", "podnet"]);
    assert!(table.contains("ip saddr 10.80.0.0/27"), "{table}");
    assert_eq!(
        tcp_exchange(&plain.ns, &outside.ns, &outside.ip.to_string()).to_string(),
        *n1_ip
    );
    assert_eq!(
        tcp_exchange(&martian.ns, &outside.ns, &outside.ip.to_string()).to_string(),
        martian_ip,
        "{table}"
    );
}

#[test]
fn a_single_embedded_node_gets_no_tunnel_and_masquerades_only_when_asked() {
    const TEST: &str = "crossnode_embedded";
    if !root_or_skip(TEST) {
        return;
    }
    if !Command::new("nft")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        skip(TEST, "nft is missing (scripts/setup installs nftables)");
        return;
    }
    let plain = Node::start(&["--cluster-pool-ipv4-cidr", "10.64.0.0/16"]);
    let st = plain.client().healthz().expect("status");
    assert!(st.ipam.cross_node.is_none(), "{:?}", st.ipam.cross_node);
    let sb = plain.sandbox();
    let r = plain.add(&sb);
    assert!(r.ok, "{}", r.stdout);
    assert_eq!(mtu_of(&sb), 1500, "no tunnel overhead on one node");
    assert!(show(&plain.ns, &["ip", "link", "show", "podnet_vxlan"]).is_empty());
    assert_eq!(
        show(&plain.ns, &["nft", "list", "tables"]).trim(),
        "table inet podnet_source",
        "no masquerade table by default, only the source check's"
    );

    let masq = Node::start(&[
        "--cluster-pool-ipv4-cidr",
        "10.65.0.0/16",
        "--enable-ipv4-masquerade",
    ]);
    wait_for(
        "the embedded node's masquerade table",
        Duration::from_secs(10),
        || {
            show(&masq.ns, &["nft", "list", "table", "ip", "podnet"])
                .contains("ip saddr 10.65.0.0/24 ip daddr != 10.65.0.0/24")
        },
    );
    let st = masq.client().healthz().expect("status");
    let x = st.ipam.cross_node.expect("cross-node status");
    assert!(x.remote_nodes.is_empty() && x.errors.is_empty(), "{x:?}");
    assert!(show(&masq.ns, &["ip", "link", "show", "podnet_vxlan"]).is_empty());
}

#[test]
fn geneve_and_a_missing_nft_stop_the_daemon_with_the_reason() {
    const TEST: &str = "crossnode_prerequisites";
    if !root_or_skip(TEST) {
        return;
    }
    let ns = Netns::new("pnt-xn");
    let dir = std::env::temp_dir().join(format!("podnet-it-{}", ns.name));
    let run = |extra: &[&str], path: &str| {
        let out = Command::new("/usr/sbin/ip")
            .args(["netns", "exec", &ns.name, podnet_bin(), "daemon"])
            .arg("--socket")
            .arg(dir.join("podnet.sock"))
            .arg("--state-dir")
            .arg(dir.join("state"))
            .args(["--k8s-kubeconfig-path", "/nonexistent/kubeconfig"])
            .args(extra)
            .env("PATH", path)
            .output()
            .expect("podnet daemon");
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let path = std::env::var("PATH").unwrap_or_default();
    let e = run(&["--tunnel-protocol", "geneve"], &path);
    assert!(
        e.contains("--tunnel-protocol geneve: this kernel has no Geneve driver"),
        "{e}"
    );
    assert!(
        show(&ns, &["ip", "link", "show", "podnet_probe"]).is_empty(),
        "the probe left nothing behind"
    );
    let e = run(&[], "/nonexistent");
    assert!(
        e.contains("needs the nft tool, which is not installed: apt-get install nftables"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
