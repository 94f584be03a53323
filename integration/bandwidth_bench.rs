//! The pod bandwidth benchmark (`scripts/bench-bandwidth` runs it; it is
//! `#[ignore]`d so the suite never does). Two node daemons on a real API server
//! (tunnel routing, `--enable-bandwidth-manager`), an iperf3 server in a pod on
//! the second node, and pods on the first limited as a runtime asks
//! (`runtimeConfig.bandwidth`, with containerd's burst) to 10 and 100 Mbit/s:
//! shaped by podnet, and by the peer, the reference `bandwidth` plugin chained
//! after podnet (`BENCH_PEER_BANDWIDTH`: its binary), in the same run. iperf3
//! measures each direction for `BENCH_SECONDS` (5, after 1 s it omits) over
//! `BENCH_ROUNDS` (3) rounds, medians reported. An unlimited pod on the same node
//! is measured alone and while a limited neighbour sends; and the ADD latency of
//! a pod without a limit with the option off and on. It asserts nothing about
//! time; it fails only when a pod cannot reach the server.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::crossnode::{pod, start_node, wait_for};
use crate::crossnode_bench::{append_to_bench_out, env_or};
use crate::harness::*;
use crate::k8s::ControlPlane;

/// The iperf3 servers' ports: one for the measured pod, one for a neighbour.
const PORT: &str = "5201";
const NEIGHBOUR_PORT: &str = "5202";

/// `rate` bits/s each way, with the burst containerd and CRI-O send.
fn limits(rate: u64) -> Value {
    json!({"ingressRate": rate, "ingressBurst": 4_294_967_295u64,
           "egressRate": rate, "egressBurst": 4_294_967_295u64})
}

/// An iperf3 server in `ns`, killed (by its PID) when dropped.
struct Server(Child);

impl Server {
    fn start(ns: &Netns, port: &str) -> Server {
        let child = Command::new("ip")
            .args(["netns", "exec", &ns.name, "iperf3", "-s", "-p", port])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("iperf3 -s");
        Server(child)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An iperf3 client run from `ns` to `server`: Mbit/s the receiving end got,
/// the pod sending (`reverse` false: its egress) or receiving (its ingress).
fn iperf(ns: &Netns, server: &str, reverse: bool) -> f64 {
    iperf_for(ns, server, PORT, reverse, env_or("BENCH_SECONDS", 5u32))
}

/// [`iperf`] to `port` for `seconds`.
fn iperf_for(ns: &Netns, server: &str, port: &str, reverse: bool, seconds: u32) -> f64 {
    let seconds = seconds.to_string();
    let mut args = vec![
        "netns", "exec", &ns.name, "iperf3", "-c", server, "-p", port, "-J", "-O", "1", "-t",
        &seconds,
    ];
    if reverse {
        args.push("-R");
    }
    // The server takes one client at a time: retry while it is busy.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = Command::new("ip").args(&args).output().expect("iperf3 -c");
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if let Some(bps) = report["end"]["sum_received"]["bits_per_second"].as_f64() {
            return bps / 1e6;
        }
        assert!(
            Instant::now() < deadline,
            "iperf3 from {} to {server}: {}",
            ns.name,
            String::from_utf8_lossy(&out.stdout)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A pod on `node` limited to `rate` by podnet itself.
fn podnet_limited(node: &Node, rate: u64) -> Sandbox {
    let sb = node.sandbox();
    let mut conf: Value = serde_json::from_str(&node.conf("1.1.0")).expect("conf");
    conf["runtimeConfig"] = json!({"bandwidth": limits(rate)});
    let add = node.plugin("ADD", Some(&sb), &conf.to_string(), &[]);
    assert!(add.ok, "{add:?}");
    sb
}

/// A pod on `node` given its address by podnet and limited to `rate` by the
/// reference `bandwidth` plugin `peer`, chained after podnet as a conflist does.
fn peer_limited(node: &Node, peer: &str, rate: u64) -> Sandbox {
    let sb = node.sandbox();
    let add = node.add(&sb);
    assert!(add.ok, "{add:?}");
    let conf = json!({
        "cniVersion": "1.1.0", "name": "podnet-it", "type": "bandwidth",
        "runtimeConfig": {"bandwidth": limits(rate)},
        "prevResult": add.json(),
    });
    let out = chained(node, peer, "ADD", &sb, &conf);
    assert!(out.status.success(), "the peer's ADD: {out:?}");
    sb
}

/// Runs the chained plugin `bin` in the node namespace.
fn chained(
    node: &Node,
    bin: &str,
    command: &str,
    sb: &Sandbox,
    conf: &Value,
) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", &node.ns.name, bin])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", &sb.container_id)
        .env("CNI_NETNS", sb.ns.path())
        .env("CNI_IFNAME", &sb.ifname)
        .env("CNI_PATH", "/nonexistent")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the peer plugin");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(conf.to_string().as_bytes())
        .expect("the peer's config");
    child.wait_with_output().expect("the peer's output")
}

/// Median Mbit/s of `sb` sending (egress) and receiving (ingress).
fn both_ways(sb: &Sandbox, server: &str) -> (f64, f64) {
    let rounds = env_or("BENCH_ROUNDS", 3usize);
    let egress = median((0..rounds).map(|_| iperf(&sb.ns, server, false)).collect());
    let ingress = median((0..rounds).map(|_| iperf(&sb.ns, server, true)).collect());
    (egress, ingress)
}

fn within(measured: f64, limit_mbit: f64) -> String {
    format!(
        "{measured:.2} ({:+.1}%)",
        (measured - limit_mbit) / limit_mbit * 100.0
    )
}

/// Median ms of `n` ADDs (each then deleted) of pods without a limit.
fn add_latency_ms(node: &Node, n: usize) -> f64 {
    let mut ms = Vec::with_capacity(n);
    for _ in 0..n {
        let sb = node.sandbox();
        let t = Instant::now();
        let add = node.add(&sb);
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(add.ok, "{add:?}");
        assert!(node.del(&sb).ok);
    }
    median(ms)
}

fn set_bandwidth_manager(node: &mut Node, on: bool) {
    node.args
        .retain(|a| !a.starts_with("--enable-bandwidth-manager"));
    node.args.push(format!("--enable-bandwidth-manager={on}"));
    node.restart_daemon();
}

#[test]
#[ignore = "a benchmark: scripts/bench-bandwidth runs it"]
fn pod_bandwidth_limits_across_nodes() {
    let peer = std::env::var("BENCH_PEER_BANDWIDTH").unwrap_or_default();
    assert!(
        !peer.is_empty(),
        "BENCH_PEER_BANDWIDTH names the reference bandwidth plugin (scripts/bench-bandwidth sets it)"
    );
    let Some(cp) = ControlPlane::start("bandwidth_bench") else {
        return;
    };
    cp.install_crds();
    let args = [
        "--ipam",
        "kubernetes",
        "--routing-mode",
        "tunnel",
        "--enable-bandwidth-manager",
    ];
    let (mut n1, _) = start_node(&cp, "bw-1", &["10.68.1.0/24"], &[], &args);
    let (n2, _) = start_node(&cp, "bw-2", &["10.68.2.0/24"], &[], &args);
    let (server_pod, server_ip) = pod(&n2);
    let _servers = [
        Server::start(&server_pod.ns, PORT),
        Server::start(&server_pod.ns, NEIGHBOUR_PORT),
    ];
    let (unlimited, _) = pod(&n1);
    wait_for("pod to pod", Duration::from_secs(10), || {
        unlimited
            .ns
            .exec(&["ping", "-c1", "-W1", &server_ip])
            .status
            .success()
    });

    let mut table = String::from(
        "\n| limit (both ways) | podnet egress Mbit/s | podnet ingress Mbit/s | peer egress Mbit/s | peer ingress Mbit/s |\n|---|---|---|---|---|\n",
    );
    let mut limited_10 = None;
    for rate in [10_000_000u64, 100_000_000] {
        let ours = podnet_limited(&n1, rate);
        let theirs = peer_limited(&n1, &peer, rate);
        let (oe, oi) = both_ways(&ours, &server_ip);
        let (pe, pi) = both_ways(&theirs, &server_ip);
        let mbit = rate as f64 / 1e6;
        table += &format!(
            "| {mbit:.0} Mbit/s | {} | {} | {} | {} |\n",
            within(oe, mbit),
            within(oi, mbit),
            within(pe, mbit),
            within(pi, mbit)
        );
        if rate == 10_000_000 {
            limited_10 = Some(ours);
        }
    }

    // The unlimited neighbour, alone and while the 10 Mbit/s pod sends.
    let alone = both_ways(&unlimited, &server_ip).0;
    let neighbour = limited_10.expect("the 10 Mbit/s pod");
    let rounds = env_or("BENCH_ROUNDS", 3usize);
    let seconds = env_or("BENCH_SECONDS", 5u32);
    // The neighbour sends for longer than the measured rounds take.
    let span = (seconds + 2) * rounds as u32 + 2;
    let (neighbour_ns, ip) = (&neighbour.ns, server_ip.as_str());
    let busy = std::thread::scope(|s| {
        let background = s.spawn(move || iperf_for(neighbour_ns, ip, NEIGHBOUR_PORT, false, span));
        std::thread::sleep(Duration::from_secs(1));
        let v = median(
            (0..rounds)
                .map(|_| iperf(&unlimited.ns, &server_ip, false))
                .collect(),
        );
        background.join().expect("the neighbour's iperf3");
        v
    });
    table += &format!(
        "\nunlimited pod on the same node, egress: {alone:.0} Mbit/s alone, {busy:.0} Mbit/s beside a limited one\n"
    );

    // ADD latency of a pod without a limit, the option off and on, alternating.
    let n = env_or("BENCH_ADDS", 20usize);
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for enabled in [round % 2 == 0, round % 2 == 1] {
            set_bandwidth_manager(&mut n1, enabled);
            let ms = add_latency_ms(&n1, n);
            if enabled { on.push(ms) } else { off.push(ms) }
        }
    }
    table += &format!(
        "ADD of a pod without a limit, median of {n} per round over {} rounds: {:.2} ms with the option off, {:.2} ms on\n",
        on.len(),
        median(off),
        median(on)
    );
    append_to_bench_out(&table);
}
