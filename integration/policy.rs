//! NetworkPolicy in a real kernel (src/policy): a "node" namespace with three
//! "pod" namespaces, each on a veth whose node side is named like a pod's host
//! link, with IPv4 and IPv6 addresses routed as podnet routes them, forwarding
//! on. The policy table is compiled from real policy objects, written with
//! `policy::table` inside the node namespace, and judged with real TCP and UDP:
//! an unselected pod stays open; default deny blocks others while the pod's
//! own connections get their replies (conntrack) and its node still reaches it;
//! a podSelector allow lets exactly the selected peer in on the listed and the
//! named port; egress to an ipBlock with except, to a named port of the
//! destination, and UDP; then a label change applied as a diff (one set element,
//! the table not recreated) opens a connection while an established one lives on.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use podnet::datapath::{NetNs, in_netns};
use podnet::policy::state::Element;
use podnet::policy::view::{NamedPort, Protocol};
use podnet::policy::{Cluster, NamespaceView, PodView, PolicyView, State, compile, table};
use serde_json::json;

use crate::harness::*;

/// An allowed connection may take this long on a busy machine.
const ALLOWED: Duration = Duration::from_secs(10);
/// A dropped packet never answers: this long without an answer is blocked.
const BLOCKED: Duration = Duration::from_millis(1500);
/// The node's router address on every host link, as podnet's.
const ROUTER4: &str = "10.77.255.254";
const NODE6: &str = "fd77::ffff";
const TCP_PORTS: [u16; 4] = [80, 8080, 9000, 9100];

fn open(ns: &Netns) -> NetNs {
    NetNs::open(ns.path()).expect("open netns")
}

/// Runs `command` (words split on spaces) in `ns`; panics if it fails.
fn run(ns: &Netns, command: &str) {
    let args: Vec<&str> = command.split_whitespace().collect();
    let out = ns.exec(&args);
    assert!(out.status.success(), "{command} in {}: {out:?}", ns.name);
}

/// A TCP server that echoes, in a pod's namespace, until dropped.
struct Echo {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Echo {
    fn start(ns: &Netns, port: u16) -> Echo {
        let listener = in_netns(&open(ns), || Ok(TcpListener::bind(("::", port))))
            .expect("enter the pod's netns")
            .unwrap_or_else(|e| panic!("listening on {port}: {e}"));
        listener.set_nonblocking(true).expect("nonblocking");
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopping.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => drop(std::thread::spawn(move || echo(conn))),
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Echo {
            stop,
            thread: Some(thread),
        }
    }
}

/// Echoes until the peer closes (connections end with the test).
fn echo(mut conn: TcpStream) {
    let _ = conn.set_nonblocking(false);
    let mut buf = [0u8; 256];
    while let Ok(n) = conn.read(&mut buf) {
        if n == 0 || conn.write_all(&buf[..n]).is_err() {
            return;
        }
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A test pod's labels, and its named TCP ports.
type Labels<'a> = &'a [(&'a str, &'a str)];
type Ports<'a> = &'a [(&'a str, u16)];

/// One pod: its namespace, addresses and host link.
struct Pod {
    ns: Netns,
    v4: IpAddr,
    v6: IpAddr,
    link: String,
}

/// The node and its pods; everything goes with the namespaces on drop.
struct Topology {
    /// Held so the servers run as long as the topology.
    _echoes: Vec<Echo>,
    pods: Vec<Pod>,
    node: Netns,
}

impl Topology {
    fn new(n: u8) -> Topology {
        let node = Netns::new("pnt-pol-node");
        run(&node, "ip link set lo up");
        run(&node, "sysctl -qw net.ipv4.ip_forward=1");
        run(&node, "sysctl -qw net.ipv6.conf.all.forwarding=1");
        run(&node, &format!("ip addr add {NODE6}/128 dev lo"));
        let pods: Vec<Pod> = (1..=n).map(|i| Topology::pod(&node, i)).collect();
        let mut echoes = Vec::new();
        for pod in &pods {
            echoes.extend(TCP_PORTS.iter().map(|port| Echo::start(&pod.ns, *port)));
        }
        let t = Topology {
            _echoes: echoes,
            pods,
            node,
        };
        // Neighbours resolved and routes working before any policy.
        for (a, b) in [(0, 1), (1, 0)] {
            for ip in [t.pods[b].v4, t.pods[b].v6] {
                assert!(t.tcp(a, ip, 80, ALLOWED), "{a} -> {ip} without a policy");
            }
        }
        t
    }

    /// Pod `i` (1-based): a veth from the node, `10.77.0.<i>/32` and
    /// `fd77::<i>/128`, routes through the node's router addresses.
    fn pod(node: &Netns, i: u8) -> Pod {
        let ns = Netns::new("pnt-pol-pod");
        let link = format!("lxc{i:012x}");
        let (v4, v6) = (format!("10.77.0.{i}"), format!("fd77::{i}"));
        run(&ns, "ip link set lo up");
        run(&ns, "sysctl -qw net.ipv6.conf.default.accept_dad=0");
        let veth = format!(
            "ip link add {link} type veth peer name eth0 netns {}",
            ns.name
        );
        run(node, &veth);
        run(node, &format!("ip link set {link} up"));
        run(node, &format!("ip addr add {ROUTER4}/32 dev {link}"));
        run(node, &format!("ip addr add fe80::1/64 dev {link} nodad"));
        run(node, &format!("ip route add {v4}/32 dev {link}"));
        run(node, &format!("ip -6 route add {v6}/128 dev {link}"));
        run(&ns, "ip link set eth0 up");
        run(&ns, &format!("ip addr add {v4}/32 dev eth0"));
        run(&ns, &format!("ip addr add {v6}/128 dev eth0 nodad"));
        run(&ns, &format!("ip route add {ROUTER4} dev eth0"));
        run(&ns, &format!("ip route add default via {ROUTER4} dev eth0"));
        run(&ns, "ip -6 route add default via fe80::1 dev eth0");
        Pod {
            ns,
            v4: v4.parse().expect("v4"),
            v6: v6.parse().expect("v6"),
            link,
        }
    }

    /// True when a TCP connection from pod `from` to `ip:port` is set up
    /// within `wait` (the SYN-ACK is the answer).
    fn tcp(&self, from: usize, ip: IpAddr, port: u16, wait: Duration) -> bool {
        let to = SocketAddr::new(ip, port);
        self.tcp_from(&self.pods[from].ns, to, wait).is_some()
    }

    fn tcp_from(&self, ns: &Netns, to: SocketAddr, wait: Duration) -> Option<TcpStream> {
        let deadline = Instant::now() + wait;
        // An allowed connection may meet a neighbour still being resolved: retry.
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let c = in_netns(&open(ns), || Ok(TcpStream::connect_timeout(&to, left)))
                .expect("enter the netns");
            match c {
                Ok(s) => return Some(s),
                Err(_) if left.is_zero() => return None,
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// True when a UDP datagram from pod `from` reaches pod `to` on `port`.
    fn udp(&self, from: usize, to: usize, v6: bool, port: u16, wait: Duration) -> bool {
        let dst = match v6 {
            true => self.pods[to].v6,
            false => self.pods[to].v4,
        };
        let rx = in_netns(&open(&self.pods[to].ns), || {
            Ok(UdpSocket::bind(("::", port)))
        })
        .expect("enter the netns")
        .expect("bind the receiver");
        rx.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        let any = if v6 { "[::]:0" } else { "0.0.0.0:0" };
        let tx = in_netns(&open(&self.pods[from].ns), || Ok(UdpSocket::bind(any)))
            .expect("enter the netns")
            .expect("bind the sender");
        let deadline = Instant::now() + wait;
        let mut buf = [0u8; 16];
        while Instant::now() < deadline {
            let _ = tx.send_to(b"probe", SocketAddr::new(dst, port));
            if matches!(rx.recv_from(&mut buf), Ok((5, _))) {
                return true;
            }
        }
        false
    }

    /// Pod views: pod `i` with `labels` and `ports`, all on this node.
    fn views(&self, pods: &[(Labels, Ports)]) -> Vec<PodView> {
        let view = |(pod, (labels, ports)): (&Pod, &(Labels, Ports))| PodView {
            namespace: "default".into(),
            name: pod.link.clone(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ips: vec![pod.v4, pod.v6],
            host_link: Some(pod.link.clone()),
            ports: ports
                .iter()
                .map(|(name, number)| NamedPort {
                    name: name.to_string(),
                    protocol: Protocol::Tcp,
                    number: *number,
                })
                .collect(),
        };
        self.pods.iter().zip(pods).map(view).collect()
    }

    fn compile(&self, policies: &[PolicyView], pods: &[PodView]) -> State {
        let namespaces = [NamespaceView {
            name: "default".into(),
            labels: Default::default(),
        }];
        let node: Vec<IpAddr> = [ROUTER4, NODE6]
            .iter()
            .map(|s| s.parse().expect("ip"))
            .collect();
        let c = compile(Cluster {
            policies,
            pods,
            namespaces: &namespaces,
            node_addresses: &node,
        });
        assert!(
            c.problems.is_empty() && c.unusable_links.is_empty(),
            "{c:?}"
        );
        c.state
    }

    fn install(&self, state: &State) {
        in_netns(&open(&self.node), || Ok(table::install(state)))
            .expect("enter the node's netns")
            .unwrap_or_else(|e| panic!("installing the table: {e}"));
    }

    fn update(&self, before: &State, after: &State) {
        in_netns(&open(&self.node), || Ok(table::update(&before.diff(after))))
            .expect("enter the node's netns")
            .unwrap_or_else(|e| panic!("updating the table: {e}"));
    }

    /// The table as the kernel lists it, without handles, set elements sorted,
    /// each rule with its chain and place: equal for equal rule sets.
    fn normalized(&self) -> Vec<String> {
        let listing = in_netns(&open(&self.node), || {
            Ok(podnet::daemon::nft::list_table("inet", "podnet_policy"))
        })
        .expect("enter the node's netns")
        .expect("listing the table")
        .expect("the table exists");
        let mut places: std::collections::BTreeMap<String, usize> = Default::default();
        let mut out: Vec<String> = podnet::daemon::nft::objects(&listing)
            .filter(|(kind, _)| *kind != "metainfo")
            .map(|(kind, body)| {
                let mut body = body.clone();
                strip(&mut body);
                match kind {
                    "rule" => {
                        let chain = body["chain"].as_str().unwrap_or_default().to_string();
                        let place = places.entry(chain.clone()).or_default();
                        *place += 1;
                        format!("rule {chain} #{place}: {body}")
                    }
                    _ => format!("{kind}: {body}"),
                }
            })
            .collect();
        out.sort();
        out
    }

    /// The kernel's handle of the policy table (a new one if it was recreated).
    fn table_handle(&self) -> u64 {
        let listing = in_netns(&open(&self.node), || {
            Ok(podnet::daemon::nft::list_table("inet", "podnet_policy"))
        })
        .expect("enter the node's netns")
        .expect("listing the table")
        .expect("the table exists");
        let table = podnet::daemon::nft::objects(&listing).find(|(kind, _)| *kind == "table");
        table
            .and_then(|(_, t)| t["handle"].as_u64())
            .expect("the table's handle")
    }
}

/// The kinds of change `diff` holds.
fn diff_kinds(diff: &podnet::policy::Diff) -> Vec<&'static str> {
    let kinds = [
        ("sets added", diff.sets_added.is_empty()),
        ("sets removed", diff.sets_removed.is_empty()),
        ("elements added", diff.elements_added.is_empty()),
        ("elements removed", diff.elements_removed.is_empty()),
        ("chains added", diff.chains_added.is_empty()),
        ("chains replaced", diff.chains_replaced.is_empty()),
        ("chains removed", diff.chains_removed.is_empty()),
    ];
    kinds
        .iter()
        .filter(|(_, empty)| !empty)
        .map(|(k, _)| *k)
        .collect()
}

/// `v` without handles, its set elements sorted.
fn strip(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(o) => {
            o.remove("handle");
            o.values_mut().for_each(strip);
            if let Some(serde_json::Value::Array(elements)) = o.get_mut("elem") {
                elements.sort_by_key(|e| e.to_string());
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
        _ => {}
    }
}

fn policy(name: &str, spec: serde_json::Value) -> PolicyView {
    let np = serde_json::from_value(
        json!({"metadata": {"namespace": "default", "name": name}, "spec": spec}),
    );
    podnet::policy::view::policy(&np.expect("a NetworkPolicy"))
}

#[test]
fn ingress_policies_hold_in_the_kernel_and_a_label_change_is_one_element() {
    if !root_or_skip("policy_ingress") {
        return;
    }
    let t = Topology::new(3);
    let (web, client, other) = (0, 1, 2);
    let web_ports: Ports = &[("http", 8080)];
    let pods = t.views(&[
        (&[("app", "web")], web_ports),
        (&[("role", "client")], &[]),
        (&[("role", "other")], &[]),
    ]);
    let (w4, w6) = (t.pods[web].v4, t.pods[web].v6);

    // Default deny for web: nobody gets in, web's own connections get their
    // replies, its node still reaches it, the others stay open.
    let deny = policy(
        "deny",
        json!({"podSelector": {"matchLabels": {"app": "web"}}}),
    );
    t.install(&t.compile(std::slice::from_ref(&deny), &pods));
    for ip in [w4, w6] {
        assert!(
            !t.tcp(client, ip, 80, BLOCKED),
            "client -> web {ip} under default deny"
        );
        assert!(
            !t.tcp(other, ip, 80, BLOCKED),
            "other -> web {ip} under default deny"
        );
    }
    for ip in [t.pods[client].v4, t.pods[client].v6] {
        assert!(
            t.tcp(web, ip, 80, ALLOWED),
            "web's own connection to {ip} gets its reply"
        );
    }
    assert!(
        t.tcp(client, t.pods[other].v4, 80, ALLOWED),
        "an unselected pod stays open"
    );
    assert!(
        t.tcp_from(&t.node, SocketAddr::new(w4, 80), ALLOWED)
            .is_some(),
        "the node reaches its pod (kubelet probes)"
    );
    assert!(!t.udp(client, web, false, 53, BLOCKED));

    // Clients in on TCP 80 and the named port http (8080), nothing else.
    let allow = policy(
        "allow-clients",
        json!({"podSelector": {"matchLabels": {"app": "web"}},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}],
                            "ports": [{"port": 80}, {"port": "http"}]}]}),
    );
    let policies = [deny, allow];
    let before = t.compile(&policies, &pods);
    t.install(&before);
    for ip in [w4, w6] {
        assert!(t.tcp(client, ip, 80, ALLOWED), "client -> web {ip}:80");
        assert!(t.tcp(client, ip, 8080, ALLOWED), "client -> web {ip}:http");
        assert!(
            !t.tcp(client, ip, 9000, BLOCKED),
            "client -> web {ip}:9000 is not listed"
        );
        assert!(!t.tcp(other, ip, 80, BLOCKED), "other is no client");
    }
    assert!(
        !t.udp(client, web, true, 80, BLOCKED),
        "UDP 80 is not TCP 80"
    );

    // An established connection, then other becomes a client: one set element
    // per family, applied as an update of the same table.
    let mut live = t
        .tcp_from(&t.pods[client].ns, SocketAddr::new(w4, 80), ALLOWED)
        .expect("client -> web");
    let handle = t.table_handle();
    let mut relabelled = pods.clone();
    relabelled[other]
        .labels
        .insert("role".into(), "client".into());
    let after = t.compile(&policies, &relabelled);
    let diff = before.diff(&after);
    let added: Vec<&Element> = diff.elements_added.values().flatten().collect();
    assert_eq!(
        added,
        [
            &Element::Address(t.pods[other].v4),
            &Element::Address(t.pods[other].v6)
        ]
    );
    assert_eq!(diff.elements_added.len(), 1, "{diff:?}");
    assert!(
        diff.elements_removed.is_empty()
            && diff.sets_added.is_empty()
            && diff.chains_replaced.is_empty()
    );
    t.update(&before, &after);
    assert_eq!(
        t.table_handle(),
        handle,
        "the table was updated, not recreated"
    );
    for ip in [w4, w6] {
        assert!(
            t.tcp(other, ip, 80, ALLOWED),
            "other is a client now: -> {ip}"
        );
    }
    live.set_read_timeout(Some(ALLOWED)).expect("timeout");
    live.write_all(b"still here")
        .expect("write on the established connection");
    let mut buf = [0u8; 10];
    live.read_exact(&mut buf)
        .expect("the established connection survives the update");
    assert_eq!(&buf, b"still here");

    // And back: other's addresses leave the set; its new connections are dropped.
    t.update(&after, &before);
    assert!(!t.tcp(other, w4, 80, BLOCKED), "other is no client again");
    drop(live);
}

#[test]
fn egress_to_an_ip_block_a_named_port_and_udp() {
    if !root_or_skip("policy_egress") {
        return;
    }
    let t = Topology::new(3);
    let (web, b, c) = (0, 1, 2);
    let pods = t.views(&[
        (&[("app", "web")], &[]),
        (&[("role", "dns")], &[]),
        (&[("role", "metrics")], &[("metrics", 9100)]),
    ]);
    // web may reach 10.77.0.0/24 but c (10.77.0.3) on TCP 80, any pod's
    // `metrics` port, and the dns pod on UDP 53; nothing else.
    let egress = policy(
        "egress",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Egress"],
        "egress": [
            {"to": [{"ipBlock": {"cidr": "10.77.0.0/24", "except": ["10.77.0.3/32"]}}], "ports": [{"port": 80}]},
            {"ports": [{"port": "metrics"}]},
            {"to": [{"podSelector": {"matchLabels": {"role": "dns"}}}], "ports": [{"protocol": "UDP", "port": 53}]},
        ]}),
    );
    t.install(&t.compile(&[egress], &pods));
    assert!(t.tcp(web, t.pods[b].v4, 80, ALLOWED), "inside the block");
    assert!(!t.tcp(web, t.pods[c].v4, 80, BLOCKED), "the except");
    assert!(
        !t.tcp(web, t.pods[b].v6, 80, BLOCKED),
        "the block is IPv4 only"
    );
    assert!(
        !t.tcp(web, t.pods[b].v4, 9000, BLOCKED),
        "a port the block does not list"
    );
    for ip in [t.pods[c].v4, t.pods[c].v6] {
        assert!(t.tcp(web, ip, 9100, ALLOWED), "c's metrics port at {ip}");
    }
    assert!(
        !t.tcp(web, t.pods[b].v4, 9100, BLOCKED),
        "b has no port named metrics"
    );
    assert!(
        t.udp(web, b, false, 53, ALLOWED) && t.udp(web, b, true, 53, ALLOWED),
        "UDP 53 to dns"
    );
    assert!(!t.udp(web, c, false, 53, BLOCKED), "c is not the dns pod");
    // Ingress of web is not selected: open.
    assert!(
        t.tcp(b, t.pods[web].v4, 9000, ALLOWED),
        "web's ingress stays open"
    );
    // An empty table filters nothing again.
    t.install(&State::default());
    assert!(
        t.tcp(web, t.pods[c].v4, 80, ALLOWED),
        "no policy, no filter"
    );
}

#[test]
fn every_update_leaves_the_table_a_fresh_install_would_write() {
    if !root_or_skip("policy_updates") {
        return;
    }
    let t = Topology::new(3);
    let mut pods = t.views(&[
        (&[("app", "web")], &[("http", 8080)]),
        (&[("role", "client")], &[]),
        (&[("role", "metrics")], &[("metrics", 9100)]),
    ]);
    let deny = policy(
        "deny",
        json!({"podSelector": {"matchLabels": {"app": "web"}}}),
    );
    let allow = policy(
        "allow",
        json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}], "ports": [{"port": "http"}, {"port": 80, "endPort": 90}]}]}),
    );
    let egress = policy(
        "egress",
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Egress"],
               "egress": [{"ports": [{"port": "metrics"}]},
                          {"to": [{"ipBlock": {"cidr": "fd77::/64", "except": ["fd77::3/128"]}}]}]}),
    );
    let mut states = vec![
        State::default(),
        t.compile(&[deny.clone(), allow.clone()], &pods),
        t.compile(&[deny.clone(), allow.clone(), egress.clone()], &pods),
    ];
    pods[2].labels.insert("role".into(), "client".into());
    pods[2].ports[0].number = 9200;
    states.push(t.compile(&[deny.clone(), allow, egress.clone()], &pods));
    states.push(t.compile(&[deny, egress], &pods));
    states.push(State::default());
    t.install(&states[0]);
    let mut kinds = std::collections::BTreeSet::new();
    for (i, pair) in states.windows(2).enumerate() {
        let (handle, before) = (t.table_handle(), t.normalized());
        let diff = pair[0].diff(&pair[1]);
        kinds.extend(diff_kinds(&diff));
        t.update(&pair[0], &pair[1]);
        let updated = t.normalized();
        assert_ne!(before, updated, "step {i} changes the table");
        assert_eq!(
            t.table_handle(),
            handle,
            "step {i}: the table was recreated"
        );
        // The same state installed afresh (the next step starts from it).
        t.install(&pair[1]);
        assert_eq!(
            updated,
            t.normalized(),
            "step {i}: the update differs from an install"
        );
    }
    assert_eq!(
        kinds.len(),
        7,
        "every kind of change was applied: {kinds:?}"
    );
    // Traffic still judged after all that: an empty table filters nothing.
    assert!(t.tcp(1, t.pods[0].v4, 9000, ALLOWED));
}
