//! The cross-node throughput and latency benchmark (`scripts/bench-crossnode`
//! runs it; it is `#[ignore]`d so the suite never does). Per routing mode, in one
//! run: two node daemons on a real API server, a pod on each, and the same two
//! node namespaces host to host over the fabric: a TCP bulk transfer for
//! `BENCH_SECONDS` (2) and `BENCH_RTTS` (2000) one-byte request/response round
//! trips, pod to pod and host to host, alternating for `BENCH_ROUNDS` (5) rounds
//! (the machine is shared: alternation spreads its noise over both paths); the
//! figures are medians over the rounds. It prints a Markdown table (and writes it
//! to `BENCH_OUT` when set). It measures and asserts nothing about time; it
//! fails only when the pods cannot reach each other.
//!
//! The source check's cost, in the same way: two pods on one node (the path where
//! the check is the largest part of the work), with the check on and off
//! (the daemon restarted with `--enable-source-ip-verification` true or false),
//! alternating for `BENCH_ROUNDS` rounds; its table is appended to `BENCH_OUT`.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::crossnode::{accept, connect, listen, pod, start_node, wait_for};
use crate::harness::*;
use crate::k8s::ControlPlane;

pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What one path gave.
pub struct Figures {
    pub gbit_per_s: f64,
    pub rtt_p50_us: f64,
    pub rtt_p99_us: f64,
}

/// Bulk transfer, then round trips, from `from` to `to_ip` in `to`.
pub fn measure(from: &Netns, to: &Netns, to_ip: &str) -> Figures {
    let seconds: f64 = env_or("BENCH_SECONDS", 2.0);
    let rtts: usize = env_or("BENCH_RTTS", 2000);
    let ip: IpAddr = to_ip.parse().expect("ip");

    let l = listen(to, ip);
    let addr = SocketAddr::new(ip, l.local_addr().expect("port").port());
    let mut c = connect(from, addr);
    let (mut s, _) = accept(&l);
    let receiver = std::thread::spawn(move || {
        let mut buf = vec![0u8; 256 * 1024];
        let mut bytes = 0u64;
        loop {
            match s.read(&mut buf) {
                Ok(0) => return (bytes, Instant::now()),
                Ok(n) => bytes += n as u64,
                Err(e) => panic!("bulk receive: {e}"),
            }
        }
    });
    let chunk = vec![0x5au8; 128 * 1024];
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs_f64(seconds) {
        c.write_all(&chunk).expect("bulk send");
    }
    c.shutdown(std::net::Shutdown::Write).expect("shutdown");
    let (bytes, end) = receiver.join().expect("receiver");
    let gbit_per_s = bytes as f64 * 8.0 / (end - start).as_secs_f64() / 1e9;

    let mut c = connect(from, addr);
    let (mut s, _) = accept(&l);
    c.set_nodelay(true).expect("nodelay");
    s.set_nodelay(true).expect("nodelay");
    let echo = std::thread::spawn(move || {
        let mut b = [0u8; 1];
        while let Ok(1) = s.read(&mut b) {
            s.write_all(&b).expect("echo");
        }
    });
    let mut samples = Vec::with_capacity(rtts);
    let mut b = [0u8; 1];
    for _ in 0..rtts {
        let t = Instant::now();
        c.write_all(&[1]).expect("request");
        c.read_exact(&mut b).expect("response");
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    drop(c);
    echo.join().expect("echo thread");
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    Figures {
        gbit_per_s,
        rtt_p50_us: at(0.5),
        rtt_p99_us: at(0.99),
    }
}

/// The median of each figure over the rounds.
pub fn median(rounds: &[Figures]) -> Figures {
    let of = |f: fn(&Figures) -> f64| {
        let mut v: Vec<f64> = rounds.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Figures {
        gbit_per_s: of(|f| f.gbit_per_s),
        rtt_p50_us: of(|f| f.rtt_p50_us),
        rtt_p99_us: of(|f| f.rtt_p99_us),
    }
}

/// The median over rounds of `f(a) / f(b)`, round by round: each round's pair
/// shares the machine's state of the moment, so this is steadier than the ratio
/// of medians.
pub fn paired(a: &[Figures], b: &[Figures], f: fn(&Figures) -> f64) -> f64 {
    let mut r: Vec<f64> = a.iter().zip(b).map(|(a, b)| f(a) / f(b)).collect();
    r.sort_by(f64::total_cmp);
    r[r.len() / 2]
}

/// Prints `text` and appends it to the file `BENCH_OUT` names, if any.
pub fn append_to_bench_out(text: &str) {
    println!("{text}");
    if let Ok(path) = std::env::var("BENCH_OUT") {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("opening {path}: {e}"));
        f.write_all(text.as_bytes())
            .unwrap_or_else(|e| panic!("writing {path}: {e}"));
    }
}

/// One routing mode: a cluster of two nodes, pod to pod against host to host.
fn mode_rows(mode: &str, args: &[&str]) -> Vec<String> {
    let Some(cp) = ControlPlane::start("crossnode_bench") else {
        return Vec::new();
    };
    cp.install_crds();
    let mut all = vec!["--ipam", "kubernetes"];
    all.extend_from_slice(args);
    let (n1, _) = start_node(&cp, "xb-1", &["10.66.1.0/24"], &[], &all);
    let (n2, n2_ip) = start_node(&cp, "xb-2", &["10.66.2.0/24"], &[], &all);
    let (p1, _) = pod(&n1);
    let (p2, p2_ip) = pod(&n2);
    wait_for("pod to pod", Duration::from_secs(10), || {
        p1.ns.exec(&["ping", "-c1", "-W1", &p2_ip]).status.success()
    });
    let (mut pod_rounds, mut host_rounds) = (Vec::new(), Vec::new());
    for _ in 0..env_or("BENCH_ROUNDS", 5usize) {
        pod_rounds.push(measure(&p1.ns, &p2.ns, &p2_ip));
        host_rounds.push(measure(&n1.ns, &n2.ns, &n2_ip));
    }
    let (pods, hosts) = (median(&pod_rounds), median(&host_rounds));
    vec![row(mode, &pods, &hosts)]
}

/// A table row: `a` against `b` (throughput, its ratio, round trips, their ratio).
fn row(label: &str, a: &Figures, b: &Figures) -> String {
    format!(
        "| {label} | {:.2} | {:.2} | {:.2} | {:.0} / {:.0} | {:.0} / {:.0} | {:.2} |",
        a.gbit_per_s,
        b.gbit_per_s,
        a.gbit_per_s / b.gbit_per_s,
        a.rtt_p50_us,
        a.rtt_p99_us,
        b.rtt_p50_us,
        b.rtt_p99_us,
        a.rtt_p50_us / b.rtt_p50_us,
    )
}

/// Restarts `node`'s daemon with the source check on or off, and checks that
/// the table is there exactly when it is on.
fn set_source_check(node: &mut Node, on: bool) {
    node.args
        .retain(|a| !a.starts_with("--enable-source-ip-verification"));
    node.args
        .push(format!("--enable-source-ip-verification={on}"));
    node.restart_daemon();
    let listed = node
        .ns
        .exec(&["nft", "list", "table", "inet", "podnet_source"])
        .status
        .success();
    assert_eq!(listed, on, "the source check table with the check {on}");
}

#[test]
#[ignore = "a benchmark: scripts/bench-crossnode runs it"]
fn source_check_throughput_and_latency() {
    let mut node = Node::start(&[
        "--cluster-pool-ipv4-cidr",
        "10.67.0.0/16",
        "--k8s-node-name",
        "scb",
    ]);
    let (p1, _) = pod(&node);
    let (p2, p2_ip) = pod(&node);
    let (mut on_rounds, mut off_rounds) = (Vec::new(), Vec::new());
    for round in 0..env_or("BENCH_ROUNDS", 5usize) {
        // Alternate which goes first, so drift of the machine spreads over both.
        for on in [round % 2 == 0, round % 2 == 1] {
            set_source_check(&mut node, on);
            let figures = measure(&p1.ns, &p2.ns, &p2_ip);
            match on {
                true => on_rounds.push(figures),
                false => off_rounds.push(figures),
            }
        }
    }
    let (on, off) = (median(&on_rounds), median(&off_rounds));
    let paired = |f: fn(&Figures) -> f64| paired(&on_rounds, &off_rounds, f);
    let table = format!(
        "\n| pod→pod, one node | check on Gbit/s | check off Gbit/s | ratio | on RTT p50 / p99 µs | off RTT p50 / p99 µs | RTT p50 ratio |\n\
         |---|---|---|---|---|---|---|\n{}\n\
         \nper-round on/off ratios, median over {} rounds: throughput {:.2}, RTT p50 {:.2}\n",
        row("veth, IPv4, TCP", &on, &off),
        on_rounds.len(),
        paired(|f| f.gbit_per_s),
        paired(|f| f.rtt_p50_us),
    );
    append_to_bench_out(&table);
}

#[test]
#[ignore = "a benchmark: scripts/bench-crossnode runs it"]
fn crossnode_throughput_and_latency() {
    let mut rows = vec![
        "| mode | pod→pod Gbit/s | host→host Gbit/s | ratio | pod RTT p50 / p99 µs | host RTT p50 / p99 µs | RTT p50 ratio |".to_string(),
        "|---|---|---|---|---|---|---|".to_string(),
    ];
    rows.extend(mode_rows(
        "tunnel (VXLAN, pod MTU 1450)",
        &["--routing-mode", "tunnel"],
    ));
    rows.extend(mode_rows(
        "native (auto-direct-node-routes, MTU 1500)",
        &["--routing-mode", "native", "--auto-direct-node-routes"],
    ));
    let table = rows.join("\n") + "\n";
    println!("{table}");
    if let Ok(path) = std::env::var("BENCH_OUT") {
        std::fs::write(&path, &table).unwrap_or_else(|e| panic!("writing {path}: {e}"));
    }
}
