//! The kernel topology of the policy tests: a node namespace and pod namespaces
//! on veths named like podnet's host links, echo servers in every pod, probes
//! (TCP connects, UDP datagrams) between them, and the policy table compiled,
//! written and listed inside the node namespace.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use podnet::datapath::{NetNs, in_netns};
use podnet::policy::view::{NamedPort, Protocol};
use podnet::policy::{
    Cluster, Enforcement, Local, NamespaceView, PodView, PolicyView, State, compile, table,
};
use serde_json::json;

use crate::harness::*;

/// An allowed connection may take this long on a busy machine.
pub const ALLOWED: Duration = Duration::from_secs(10);
/// A dropped packet never answers: this long without an answer is blocked.
pub const BLOCKED: Duration = Duration::from_millis(1500);
/// The node's router address on every host link, as podnet's.
pub const ROUTER4: &str = "10.77.255.254";
/// The node's IPv6 address (on its loopback).
pub const NODE6: &str = "fd77::ffff";
const TCP_PORTS: [u16; 4] = [80, 8080, 9000, 9100];

fn open(ns: &Netns) -> NetNs {
    NetNs::open(ns.path()).expect("open netns")
}

/// Runs `command` (words split on spaces) in `ns`; panics if it fails.
pub fn run(ns: &Netns, command: &str) {
    let args: Vec<&str> = command.split_whitespace().collect();
    let out = ns.exec(&args);
    assert!(out.status.success(), "{command} in {}: {out:?}", ns.name);
}

/// A TCP server that echoes, in a pod's (or the node's) namespace, until dropped.
pub struct Echo {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Echo {
    pub fn start(ns: &Netns, port: u16) -> Echo {
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
pub type Labels<'a> = &'a [(&'a str, &'a str)];
pub type Ports<'a> = &'a [(&'a str, u16)];

/// One pod: its namespace, addresses and host link.
pub struct Pod {
    pub ns: Netns,
    pub v4: IpAddr,
    pub v6: IpAddr,
    pub link: String,
}

/// The node and its pods; everything goes with the namespaces on drop.
pub struct Topology {
    /// Held so the servers run as long as the topology.
    _echoes: Vec<Echo>,
    pub pods: Vec<Pod>,
    pub node: Netns,
}

impl Topology {
    pub fn new(n: u8) -> Topology {
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
    pub fn tcp(&self, from: usize, ip: IpAddr, port: u16, wait: Duration) -> bool {
        let to = SocketAddr::new(ip, port);
        self.tcp_from(&self.pods[from].ns, to, wait).is_some()
    }

    pub fn tcp_from(&self, ns: &Netns, to: SocketAddr, wait: Duration) -> Option<TcpStream> {
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
    pub fn udp(&self, from: usize, to: usize, v6: bool, port: u16, wait: Duration) -> bool {
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

    /// Pod views: pod `i` with `labels` and `ports`, all on this node, each
    /// named as its host link.
    pub fn views(&self, pods: &[(Labels, Ports)]) -> Vec<PodView> {
        let view = |(pod, (labels, ports)): (&Pod, &(Labels, Ports))| PodView {
            namespace: "default".into(),
            name: pod.link.clone(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ips: vec![pod.v4, pod.v6],
            uid: None,
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

    pub fn compile(&self, policies: &[PolicyView], pods: &[PodView]) -> State {
        self.compile_as(Enforcement::Default, policies, pods)
    }

    /// `compile` with `enforcement` (`always` isolates every pod).
    pub fn compile_as(
        &self,
        enforcement: Enforcement,
        policies: &[PolicyView],
        pods: &[PodView],
    ) -> State {
        let namespaces = [NamespaceView {
            name: "default".into(),
            labels: Default::default(),
        }];
        let node: Vec<IpAddr> = [ROUTER4, NODE6]
            .iter()
            .map(|s| s.parse().expect("ip"))
            .collect();
        let local: Vec<Local> = pods
            .iter()
            .map(|pod| Local {
                pod,
                link: &pod.name,
            })
            .collect();
        let c = compile(Cluster {
            enforcement,
            policies: &policies.iter().collect::<Vec<_>>(),
            cluster_policies: &[],
            pods: &pods.iter().collect::<Vec<_>>(),
            local: &local,
            namespaces: &namespaces.iter().collect::<Vec<_>>(),
            node_addresses: &node,
            nodes: &[],
        });
        assert!(
            c.problems.is_empty() && c.unusable_links.is_empty(),
            "{c:?}"
        );
        c.state
    }

    pub fn install(&self, state: &State) {
        in_netns(&open(&self.node), || Ok(table::install(state, None)))
            .expect("enter the node's netns")
            .unwrap_or_else(|e| panic!("installing the table: {e}"));
    }

    pub fn update(&self, before: &State, after: &State) {
        in_netns(&open(&self.node), || {
            Ok(table::update(&before.diff(after), None))
        })
        .expect("enter the node's netns")
        .unwrap_or_else(|e| panic!("updating the table: {e}"));
    }

    /// Removes the table (absent is fine) and checks it is gone.
    pub fn remove(&self) {
        in_netns(&open(&self.node), || Ok(table::remove()))
            .expect("enter the node's netns")
            .unwrap_or_else(|e| panic!("removing the table: {e}"));
        let listing = in_netns(&open(&self.node), || {
            Ok(podnet::nft::list_table("inet", "podnet_policy"))
        });
        assert!(matches!(listing, Ok(Ok(None))), "{listing:?}");
    }

    /// The table as the kernel lists it, without handles, set elements sorted,
    /// each rule with its chain and place: equal for equal rule sets.
    pub fn normalized(&self) -> Vec<String> {
        let listing = in_netns(&open(&self.node), || {
            Ok(podnet::nft::list_table("inet", "podnet_policy"))
        })
        .expect("enter the node's netns")
        .expect("listing the table")
        .expect("the table exists");
        let mut places: std::collections::BTreeMap<String, usize> = Default::default();
        let mut out: Vec<String> = podnet::nft::objects(&listing)
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
    pub fn table_handle(&self) -> u64 {
        let listing = in_netns(&open(&self.node), || {
            Ok(podnet::nft::list_table("inet", "podnet_policy"))
        })
        .expect("enter the node's netns")
        .expect("listing the table")
        .expect("the table exists");
        let table = podnet::nft::objects(&listing).find(|(kind, _)| *kind == "table");
        table
            .and_then(|(_, t)| t["handle"].as_u64())
            .expect("the table's handle")
    }
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

pub fn policy(name: &str, spec: serde_json::Value) -> PolicyView {
    let np = serde_json::from_value(
        json!({"metadata": {"namespace": "default", "name": name}, "spec": spec}),
    );
    podnet::policy::view::policy(&np.expect("a NetworkPolicy"))
}
