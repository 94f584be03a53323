//! The source check (`--enable-source-ip-verification`, on by default): a pod
//! that is root in its own namespace adds another pod's address, the node's, or
//! a foreign one (192.0.2.7, 2001:db8::7) to its `eth0` and sends UDP with it as
//! the source: nothing arrives, the drops are counted by reason and `podnet
//! explain` names the pod's link. Legitimate traffic still flows, and counts no
//! drop: pod to pod, node to pod, pod to node, IPv6 neighbour discovery and DAD,
//! in host-scope (cluster-pool), multi-pool (addresses from two pools), crd, eni
//! (per-endpoint policy routing) and delegated-plugin modes, and across nodes on
//! a real API server (tunnel, native routing). Without the check the
//! same attack gets through (so the probe does test something); the table's
//! counters survive a daemon restart; a missing nft stops the daemon with what to
//! install.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use podnet::datapath::{NetNs, in_netns};

use crate::crossnode::{pod, start_node, wait_for};
use crate::external_modes::{VPC_ADDRESS, start_eni_node, write};
use crate::harness::*;

static PORT: AtomicU16 = AtomicU16::new(0);

fn open(ns: &Netns) -> NetNs {
    NetNs::open(ns.path()).expect("open netns")
}

/// Sends a few UDP datagrams from `from` with source `src` to `dst` (an address
/// of `to`) and tells whether one arrived there with that source.
fn delivered(from: &Netns, src: &str, to: &Netns, dst: &str) -> bool {
    let port = 42000
        + PORT.fetch_add(1, Ordering::SeqCst) % 1000
        + (std::process::id() % 20) as u16 * 1000;
    let (src, dst): (IpAddr, IpAddr) = (src.parse().expect("src"), dst.parse().expect("dst"));
    let rx = in_netns(&open(to), || {
        Ok(UdpSocket::bind(SocketAddr::new(dst, port)))
    })
    .expect("enter the receiver's netns")
    .unwrap_or_else(|e| panic!("binding {dst}:{port}: {e}"));
    rx.set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    let tx = in_netns(&open(from), || Ok(UdpSocket::bind(SocketAddr::new(src, 0))))
        .expect("enter the sender's netns")
        .unwrap_or_else(|e| panic!("binding {src} in the sender (is the address on eth0?): {e}"));
    let payload = format!("probe from {src}");
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut buf = [0u8; 128];
    while Instant::now() < deadline {
        let _ = tx.send_to(payload.as_bytes(), SocketAddr::new(dst, port));
        if let Ok((n, peer)) = rx.recv_from(&mut buf)
            && peer.ip() == src
            && &buf[..n] == payload.as_bytes()
        {
            return true;
        }
    }
    false
}

/// Adds `ip` (host prefix, no DAD) to the sandbox's interface, as an attacker
/// who is root in the pod can.
fn claim(sb: &Sandbox, ip: &str) {
    let (prefix, nodad) = match ip.contains(':') {
        true => ("128", "nodad"),
        false => ("32", ""),
    };
    let address = format!("{ip}/{prefix}");
    let mut args = vec!["ip", "addr", "replace", &address, "dev", &sb.ifname];
    args.extend((!nodad.is_empty()).then_some(nodad));
    let out = sb.ns.exec(&args);
    assert!(out.status.success(), "claiming {ip}: {out:?}");
}

/// The daemon's `drop_count_total` samples: (reason, family) and packets.
fn drops(node: &Node) -> Vec<((String, String), u64)> {
    let raw = node
        .client()
        .call("GET", "/metrics", &[], None)
        .expect("metrics");
    let text = String::from_utf8_lossy(&raw.body).to_string();
    let mut samples: Vec<((String, String), u64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("podnet_drop_count_total{reason=\""))
        .filter_map(|l| {
            let (reason, rest) = l.split_once("\",family=\"")?;
            let (family, n) = rest.split_once("\"} ")?;
            Some(((reason.to_string(), family.to_string()), n.parse().ok()?))
        })
        .collect();
    samples.sort();
    samples
}

fn dropped(node: &Node, reason: &str, family: &str) -> u64 {
    drops(node)
        .into_iter()
        .find(|((r, f), _)| r == reason && f == family)
        .map(|(_, n)| n)
        .unwrap_or(0)
}

fn total_dropped(node: &Node) -> u64 {
    drops(node).iter().map(|(_, n)| n).sum()
}

fn host_link(r: &PluginOutput) -> String {
    r.json()["interfaces"][0]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn table(node: &Node) -> String {
    let out = node
        .ns
        .exec(&["nft", "list", "table", "inet", "podnet_source"]);
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The attack from `attacker` towards `victim` (at `victim_ip`) with each of
/// `spoofed`: nothing arrives; its own address (`own`) still does.
fn attack_is_dropped(
    attacker: &Sandbox,
    own: &str,
    spoofed: &[&str],
    victim: &Netns,
    victim_ip: &str,
) {
    assert!(
        delivered(&attacker.ns, own, victim, victim_ip),
        "{own} -> {victim_ip}: the pod's own address must pass"
    );
    for src in spoofed {
        claim(attacker, src);
        assert!(
            !delivered(&attacker.ns, src, victim, victim_ip),
            "a packet from {src} (not the pod's) reached {victim_ip}"
        );
    }
}

#[test]
fn a_pod_sends_only_as_itself_and_its_drops_are_counted_and_explained() {
    if !root_or_skip("source_check_host_scope") {
        return;
    }
    let mut node = Node::dual_stack();
    let (a, b, c) = (node.sandbox(), node.sandbox(), node.sandbox());
    let (ra, rb, rc) = (node.add(&a), node.add(&b), node.add(&c));
    let (a4, a6) = (ra.ipv4(), ra.ipv6());
    let (b4, b6) = (rb.ipv4(), rb.ipv6());
    let (c4, c6) = (rc.ipv4(), rc.ipv6());
    assert!(
        table(&node).contains("fib saddr . iif oif missing jump spoofed"),
        "{}",
        table(&node)
    );

    // Legitimate traffic: pod to pod, pod to the node (its router address), the
    // node to a pod, both families (IPv6 needs neighbour discovery), and a new
    // IPv6 address through DAD. None of it is dropped.
    let router4 = node.ipv4_addressing().ip;
    let router6 = node.ipv6_addressing().ip;
    for (from, to) in [
        (&a, &b4),
        (&b, &a4),
        (&a, &b6),
        (&b, &a6),
        (&a, &router4),
        (&a, &router6),
    ] {
        assert!(from.ping(to), "{} cannot reach {to}", from.ns.name);
    }
    for ip in [&a4, &a6] {
        assert!(
            node.ns.exec(&["ping", "-c1", "-W2", ip]).status.success(),
            "the node cannot reach {ip}"
        );
    }
    assert!(delivered(&a.ns, &a4, &c.ns, &c4) && delivered(&a.ns, &a6, &c.ns, &c6));
    let out =
        c.ns.exec(&["ip", "addr", "add", "fd00:99::1/128", "dev", "eth0"]);
    assert!(out.status.success(), "{out:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while String::from_utf8_lossy(&c.ns.exec(&["ip", "addr", "show", "dev", "eth0"]).stdout)
        .contains("tentative")
    {
        assert!(Instant::now() < deadline, "DAD did not finish");
        std::thread::sleep(Duration::from_millis(100));
    }
    c.ns.exec(&["ip", "addr", "del", "fd00:99::1/128", "dev", "eth0"]);
    assert_eq!(
        total_dropped(&node),
        0,
        "legitimate traffic was dropped: {:?}",
        drops(&node)
    );

    // The attack: b's addresses, a foreign one, the node's own.
    attack_is_dropped(&a, &a4, &[&b4, "192.0.2.7", &router4], &c.ns, &c4);
    attack_is_dropped(&a, &a6, &[&b6, "2001:db8::7"], &c.ns, &c6);
    for (reason, family) in [
        ("spoofed-other-pod-address", "ipv4"),
        ("spoofed-other-pod-address", "ipv6"),
        ("spoofed-foreign-address", "ipv4"),
        ("spoofed-foreign-address", "ipv6"),
        ("spoofed-node-address", "ipv4"),
    ] {
        assert!(
            dropped(&node, reason, family) > 0,
            "no {reason} {family} drop counted: {:?}\n{}",
            drops(&node),
            table(&node)
        );
    }
    // The victim's link and the pod whose address was used show nothing.
    let owner = |sb: &Sandbox| format!("default/{}", sb.ns.name);
    let ex = node.client().explain(&owner(&a)).expect("explain a");
    assert_eq!(ex.spoofed_traffic.len(), 1, "{ex:?}");
    assert_eq!(ex.spoofed_traffic[0].host_link, host_link(&ra));
    assert!(ex.spoofed_traffic[0].packets > 0, "{ex:?}");
    assert!(
        ex.summary
            .contains("the pod sent with a source address it does not own"),
        "{}",
        ex.summary
    );
    for sb in [&b, &c] {
        let ex = node.client().explain(&owner(sb)).expect("explain");
        assert!(ex.spoofed_traffic.is_empty(), "{ex:?}");
    }
    let cli = Command::new("ip")
        .args(["netns", "exec", &node.ns.name, podnet_bin(), "explain"])
        .arg(owner(&a))
        .arg("--socket")
        .arg(node.socket())
        .output()
        .expect("podnet explain");
    let text = String::from_utf8_lossy(&cli.stdout);
    assert!(
        text.contains(&format!("dropped on host link {}", host_link(&ra))),
        "{text}"
    );

    // A restart keeps the table and its counters.
    let before = drops(&node);
    node.restart_daemon();
    assert_eq!(
        drops(&node),
        before,
        "the counters did not survive a restart"
    );
    assert!(node.log().contains("outcome=Kept"), "{}", node.log());
    // Tampered with (a rule removed), it is replaced at the next start.
    node.stop_daemon(false);
    node.ns
        .exec(&["nft", "flush", "chain", "inet", "podnet_source", "spoofed"]);
    node.start_daemon();
    assert!(node.log().contains("outcome=Replaced"), "{}", node.log());
    attack_is_dropped(&a, &a4, &[&b4], &c.ns, &c4);
    assert!(node.del(&a).ok && node.del(&b).ok && node.del(&c).ok);
}

#[test]
fn without_the_check_the_same_attack_gets_through_and_the_table_goes() {
    if !root_or_skip("source_check_off") {
        return;
    }
    let mut node = Node::dual_stack();
    assert!(!table(&node).is_empty(), "on by default");
    node.stop_daemon(false);
    node.args
        .push("--enable-source-ip-verification=false".into());
    node.start_daemon();
    assert!(table(&node).is_empty(), "turning it off removes the table");
    let (a, b, c) = (node.sandbox(), node.sandbox(), node.sandbox());
    let (ra, rb, rc) = (node.add(&a), node.add(&b), node.add(&c));
    for (spoofed, dst) in [
        (rb.ipv4(), rc.ipv4()),
        ("192.0.2.7".to_string(), rc.ipv4()),
        (rb.ipv6(), rc.ipv6()),
        ("2001:db8::7".to_string(), rc.ipv6()),
    ] {
        claim(&a, &spoofed);
        assert!(
            delivered(&a.ns, &spoofed, &c.ns, &dst),
            "without the check, {spoofed} -> {dst} should pass"
        );
    }
    assert!(ra.ok && node.del(&a).ok && node.del(&b).ok && node.del(&c).ok);
}

#[test]
fn a_missing_nft_stops_the_daemon_unless_the_check_is_off() {
    if !root_or_skip("source_check_nft_missing") {
        return;
    }
    let node = Node::new(&DUAL_STACK);
    // `ip` runs by its full path; the daemon then finds no nft on its PATH.
    let daemon = |extra: &[&str]| {
        let mut cmd = Command::new("/usr/sbin/ip");
        cmd.args(node.daemon_command(extra).get_args())
            .env("PATH", "/nonexistent");
        cmd
    };
    let mut failing = daemon(&[]);
    let out = failing.output().expect("daemon");
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("needs the nft tool, which is not installed: apt-get install nftables")
            && e.contains("--enable-source-ip-verification=false"),
        "{e}"
    );
    // Off, the daemon needs no nft.
    let mut child = daemon(&["--enable-source-ip-verification=false"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("daemon");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut ready = false;
    while Instant::now() < deadline && !ready {
        ready = node.client().healthz().is_ok();
        if matches!(child.try_wait(), Ok(Some(_))) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = child.wait();
    assert!(
        ready,
        "the daemon did not serve without nft and with the check off"
    );
}

/// Delivery of `attacker`'s own address to `victim_ip`, and none of `spoofed`,
/// on a node of any mode; plus pod to pod by ping, and no legitimate drop.
fn probe_mode(node: &Node, pods: &[(&Sandbox, String)], spoofed_extra: &[&str]) {
    let ((a, a_ip), (b, b_ip), (c, c_ip)) = (&pods[0], &pods[1], &pods[2]);
    assert!(a.ping(b_ip) && b.ping(a_ip), "pod to pod\n{}", node.log());
    assert_eq!(total_dropped(node), 0, "{:?}", drops(node));
    let mut spoofed: Vec<&str> = vec![b_ip.as_str(), "192.0.2.7"];
    spoofed.extend_from_slice(spoofed_extra);
    attack_is_dropped(a, a_ip, &spoofed, &c.ns, c_ip);
    assert!(
        dropped(node, "spoofed-other-pod-address", "ipv4") > 0,
        "{:?}",
        drops(node)
    );
    assert!(
        dropped(node, "spoofed-foreign-address", "ipv4") > 0,
        "{:?}",
        drops(node)
    );
}

#[test]
fn multi_pool_pods_with_addresses_from_two_pools() {
    if !root_or_skip("source_check_multi_pool") {
        return;
    }
    let scratch = std::env::temp_dir().join(format!("podnet-sc-{}", unique("")));
    std::fs::create_dir_all(scratch.join("pools")).expect("mkdir");
    std::fs::create_dir_all(scratch.join("meta")).expect("mkdir");
    std::fs::write(
        scratch.join("pools/pools.yaml"),
        r#"
apiVersion: cilium.io/v2alpha1
kind: CiliumPodIPPool
metadata: {name: default}
spec:
  ipv4: {cidrs: ["10.51.0.0/16"], maskSize: 27}
---
apiVersion: cilium.io/v2alpha1
kind: CiliumPodIPPool
metadata: {name: mars}
spec:
  ipv4: {cidrs: ["10.52.0.0/16"], maskSize: 27}
"#,
    )
    .expect("pools");
    std::fs::write(
        scratch.join("meta/ns.yaml"),
        "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Namespace, metadata: {name: blue}}\n- {apiVersion: v1, kind: Namespace, metadata: {name: red, annotations: {ipam.cilium.io/ip-pool: mars}}}\n- {apiVersion: v1, kind: Pod, metadata: {name: p1, namespace: blue}}\n- {apiVersion: v1, kind: Pod, metadata: {name: p2, namespace: red}}\n- {apiVersion: v1, kind: Pod, metadata: {name: p3, namespace: red}}\n",
    )
    .expect("metadata");
    let (pools, meta) = (
        scratch.join("pools").display().to_string(),
        scratch.join("meta").display().to_string(),
    );
    let node = Node::start(&[
        "--ipam",
        "multi-pool",
        "--pool-dir",
        &pools,
        "--metadata-dir",
        &meta,
        "--k8s-node-name",
        "sc-mp",
    ]);
    let add_in = |sb: &Sandbox, ns: &str, pod: &str| {
        let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={pod}");
        let r = node.plugin("ADD", Some(sb), &node.conf("1.1.0"), &[("CNI_ARGS", &args)]);
        assert!(r.ok, "{r:?}\n{}", node.log());
        r.ipv4()
    };
    let (a, b, c) = (node.sandbox(), node.sandbox(), node.sandbox());
    let (a_ip, b_ip, c_ip) = (
        add_in(&a, "blue", "p1"),
        add_in(&b, "red", "p2"),
        add_in(&c, "red", "p3"),
    );
    assert!(
        a_ip.starts_with("10.51.") && b_ip.starts_with("10.52."),
        "{a_ip} {b_ip}"
    );
    probe_mode(&node, &[(&a, a_ip), (&b, b_ip), (&c, c_ip)], &[]);
    drop(node);
    let _ = std::fs::remove_dir_all(&scratch);
}

#[test]
fn crd_mode() {
    if !root_or_skip("source_check_crd") {
        return;
    }
    let mut node = Node::new(&[]);
    let file = node.dir.join("ciliumnode.yaml");
    write(
        &file,
        "apiVersion: cilium.io/v2\nkind: CiliumNode\nmetadata:\n  name: sc-crd\nspec:\n  ipam:\n    pool:\n      10.78.0.10: {resource: eni-x}\n      10.78.0.11: {resource: eni-x}\n      10.78.0.12: {resource: eni-x}\n      10.78.0.13: {resource: eni-x}\n",
    );
    let f = file.display().to_string();
    node.args = [
        "--ipam",
        "crd",
        "--node-resource",
        &f,
        "--k8s-node-name",
        "sc-crd",
        "--enable-health-checking=false",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    node.start_daemon();
    let pods: Vec<(Sandbox, String)> = (0..3)
        .map(|_| {
            let sb = node.sandbox();
            let r = node.add(&sb);
            let ip = r.ipv4();
            (sb, ip)
        })
        .collect();
    let refs: Vec<(&Sandbox, String)> = pods.iter().map(|(s, ip)| (s, ip.clone())).collect();
    probe_mode(&node, &refs, &[]);
}

#[test]
fn eni_mode_with_per_endpoint_policy_routing() {
    if !root_or_skip("source_check_eni") {
        return;
    }
    let (node, vpc_ns) = start_eni_node(true);
    let (a, b) = (node.sandbox(), node.sandbox());
    let (ra, rb) = (node.add(&a), node.add(&b));
    let (a_ip, b_ip) = (ra.ipv4(), rb.ipv4());
    // Through the pods' ENIs (the VPC address is reachable only by the
    // per-endpoint rules), with the pods' own addresses.
    assert!(a.ping(VPC_ADDRESS) && b.ping(VPC_ADDRESS), "{}", node.log());
    assert!(a.ping(&b_ip), "pod to pod on one node");
    assert_eq!(total_dropped(&node), 0, "{:?}", drops(&node));
    attack_is_dropped(&a, &a_ip, &[&b_ip, "192.0.2.7"], &vpc_ns, VPC_ADDRESS);
    assert!(
        dropped(&node, "spoofed-other-pod-address", "ipv4") > 0,
        "{:?}",
        drops(&node)
    );
    assert!(node.del(&a).ok && node.del(&b).ok);
}

#[test]
fn delegated_plugin_mode() {
    if !root_or_skip("source_check_delegated") {
        return;
    }
    let host_local = Path::new("/usr/lib/cni/host-local");
    if !host_local.exists() {
        skip(
            "source_check_delegated",
            "/usr/lib/cni/host-local is missing (scripts/setup installs containernetworking-plugins)",
        );
        return;
    }
    let node = Node::start(&["--ipam", "delegated-plugin", "--k8s-node-name", "sc-deleg"]);
    let conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "deleg",
        "type": "podnet",
        "socket-path": node.socket(),
        "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.97.0.0/24"}]], "dataDir": node.dir.join("host-local")},
    })
    .to_string();
    let path = [("CNI_PATH", "/usr/lib/cni")];
    let pods: Vec<(Sandbox, String)> = (0..3)
        .map(|_| {
            let sb = node.sandbox();
            let r = node.plugin("ADD", Some(&sb), &conf, &path);
            let ip = r.ipv4();
            (sb, ip)
        })
        .collect();
    let refs: Vec<(&Sandbox, String)> = pods.iter().map(|(s, ip)| (s, ip.clone())).collect();
    probe_mode(&node, &refs, &[]);
    for (sb, _) in &pods {
        assert!(node.plugin("DEL", Some(sb), &conf, &path).ok);
    }
}

/// Two nodes on a real API server in `routing` mode: pod to pod across nodes and
/// node to remote pod pass, and arrive on the tunnel or the uplink without a
/// drop on the receiving node; the attack from a pod towards the other node
/// (another pod's address on its node, a remote pod's, a foreign one) is dropped
/// on the sending node.
fn across_nodes(test: &str, cidr: &str, routing: &[&str]) {
    let Some(cp) = crate::k8s::ControlPlane::start(test) else {
        return;
    };
    cp.install_crds();
    let mut args = vec!["--ipam", "kubernetes"];
    args.extend_from_slice(routing);
    let (c1, c2) = (format!("{cidr}.1.0/24"), format!("{cidr}.2.0/24"));
    let (n1, _) = start_node(&cp, &format!("{test}-1"), &[&c1], &[], &args);
    let (n2, _) = start_node(&cp, &format!("{test}-2"), &[&c2], &[], &args);
    let ((a, a_ip), (b, b_ip)) = (pod(&n1), pod(&n1));
    let ((c, c_ip), (_d, d_ip)) = (pod(&n2), pod(&n2));
    wait_for("pod to pod across nodes", Duration::from_secs(10), || {
        a.ping(&c_ip)
    });
    assert!(c.ping(&a_ip) && b.ping(&c_ip), "pod to pod across nodes");
    assert!(
        n2.ns.exec(&["ping", "-c1", "-W2", &a_ip]).status.success(),
        "node to remote pod"
    );
    assert_eq!(total_dropped(&n1), 0, "{:?}", drops(&n1));
    assert_eq!(total_dropped(&n2), 0, "{:?}", drops(&n2));
    attack_is_dropped(&a, &a_ip, &[&b_ip, &d_ip, "192.0.2.7"], &c.ns, &c_ip);
    assert!(
        dropped(&n1, "spoofed-other-pod-address", "ipv4") > 0,
        "{:?}",
        drops(&n1)
    );
    assert!(
        dropped(&n1, "spoofed-foreign-address", "ipv4") > 0,
        "{:?}",
        drops(&n1)
    );
    assert_eq!(total_dropped(&n2), 0, "the receiving node drops nothing");
}

#[test]
fn across_nodes_in_tunnel_mode() {
    across_nodes("sc-tunnel", "10.71", &["--routing-mode", "tunnel"]);
}

#[test]
fn across_nodes_in_native_mode() {
    across_nodes(
        "sc-native",
        "10.72",
        &[
            "--routing-mode",
            "native",
            "--auto-direct-node-routes",
            "--ipv4-native-routing-cidr",
            "10.72.0.0/16",
        ],
    );
}
