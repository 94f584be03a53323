//! The NetworkPolicy benchmark (`scripts/bench-policy` runs it; `#[ignore]`d so
//! the suite never does). On a real kube-apiserver, one node whose agent runs
//! the policy loop (`--enable-policy default`) with two real pods attached by
//! the plugin (a server and a client), and `BENCH_PODS` (1,000) Pod objects in
//! all: the rest spread over 10 namespaces and 20 simulated nodes, with labels,
//! named ports and `status.podIPs`. Then `BENCH_POLICIES` (200) NetworkPolicies
//! in the real pods' namespace, each selecting the server (most the client too)
//! in one of five ways, with pod, namespace, combined and ipBlock peers, port
//! numbers, names and ranges, ingress and egress; each allows client to server.
//!
//! It measures, in one run: the agent's RSS and CPU before the objects, while
//! they arrive and at rest with them; `BENCH_NEW` (50) policies created one at a
//! time, each until its rule is in the server's ingress chain in the kernel
//! (polled with `nft list chain`) from the create request's return (one POST
//! with curl), p50 and p99; and pod-to-pod TCP throughput
//! and round trips (crossnode_bench's `measure`) with the policies against none
//! (all deleted), alternating for `BENCH_ROUNDS` (5) rounds. It prints a
//! Markdown report (and writes it to `BENCH_OUT` when set); it asserts nothing
//! about time and fails only when the policies are not applied.

use std::io::Write;
use std::time::{Duration, Instant};

use podnet::datapath::{NetNs, in_netns};
use serde_json::{Value, json};

use crate::crossnode_bench::{Figures, append_to_bench_out, env_or, measure, median, paired};
use crate::harness::*;
use crate::k8s::ControlPlane;
use crate::k8s_backend::{add_with_uid, create_sandbox_pods, policy_agent, policy_agent_of};

pub const NAMESPACES: usize = 10;
pub const SIM_NODES: usize = 20;
/// Linux reports /proc/<pid>/stat times in USER_HZ, 100 on every architecture
/// podnet builds for.
const TICKS_PER_SECOND: f64 = 100.0;

/// The namespace of pod `i`: `default` (the real pods') or `bench-<n>`.
pub fn namespace(i: usize) -> String {
    match i % NAMESPACES {
        0 => "default".into(),
        n => format!("bench-{n}"),
    }
}

/// The labelled namespaces (`default` is labelled, the others created).
pub fn namespaces() -> Value {
    let items: Vec<Value> = (0..NAMESPACES)
        .map(|n| {
            json!({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": namespace(n),
                                "labels": {"team": format!("t{n}"),
                                           "env": if n % 2 == 0 { "prod" } else { "dev" }}}})
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "List", "items": items})
}

/// Simulated pod `i` (no kubelet: the status is written as one would), with its
/// address `10.128.x.y`.
fn sim_pod(i: usize) -> Value {
    let ip = format!("10.128.{}.{}", i / 250, i % 250 + 1);
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": format!("sim-{i}"), "namespace": namespace(i),
                        "labels": {"app": format!("a{}", i % 50), "tier": format!("t{}", i % 5),
                                   "bench": "yes"}},
           "spec": {"nodeName": format!("sim-node-{}", i % SIM_NODES),
                    "containers": [{"name": "c", "image": "busybox",
                                    "ports": [{"name": "http", "containerPort": 8080},
                                              {"name": "metrics", "containerPort": 9100},
                                              {"name": "dns", "containerPort": 53, "protocol": "UDP"}]}]},
           "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}})
}

pub fn list(items: Vec<Value>) -> String {
    json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

/// Creates simulated pods `range`, then writes their status, 250 a request.
pub fn create_sim_pods(cp: &ControlPlane, range: std::ops::Range<usize>) {
    let sims: Vec<Value> = range.map(sim_pod).collect();
    for chunk in sims.chunks(250) {
        let text = list(chunk.to_vec());
        cp.kubectl_stdin(&["create", "-f", "-"], &text)
            .expect_ok("create pods");
        cp.kubectl_stdin(&["replace", "--subresource=status", "-f", "-"], &text)
            .expect_ok("pod status");
    }
}

/// Policy `i`: its pod selector takes one of five shapes, all matching the
/// server; its first ingress rule lets the client in (on every port or the
/// range 1024-65535: the benchmark's ports are ephemeral); the others add
/// namespace, named-port and ipBlock peers; every third one also limits egress
/// (to the server, DNS anywhere in the cluster and an ipBlock).
pub fn policy(i: usize) -> Value {
    let selector = match i % 5 {
        0 => json!({"matchLabels": {"role": "server"}}),
        1 => json!({"matchLabels": {"app": "a0"}}),
        2 => {
            json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["t0", "t1"]}]})
        }
        3 => json!({}),
        _ => json!({"matchExpressions": [{"key": "bench", "operator": "Exists"}]}),
    };
    let client = match i % 4 {
        0 => json!({"podSelector": {"matchLabels": {"role": "client"}}}),
        1 => json!({"namespaceSelector": {"matchLabels": {"team": "t0"}},
                    "podSelector": {"matchLabels": {"app": "a1"}}}),
        2 => json!({"podSelector": {"matchExpressions": [
                        {"key": "app", "operator": "In", "values": ["a1", format!("a{}", i % 50)]}]}}),
        _ => json!({"ipBlock": {"cidr": "10.244.7.0/24", "except": ["10.244.7.250/32"]}}),
    };
    let mut first = json!({"from": [client]});
    if i % 2 == 1 {
        first["ports"] = json!([{"port": 1024, "endPort": 65535}]);
    }
    let ingress = json!([
        first,
        {"from": [{"namespaceSelector": {"matchLabels": {"team": format!("t{}", i % NAMESPACES)}}}],
         "ports": [{"port": "http"}, {"port": 8443}]},
        {"from": [{"ipBlock": {"cidr": format!("10.128.{}.0/24", i % 4),
                               "except": [format!("10.128.{}.{}/32", i % 4, i % 250 + 1)]}},
                  {"podSelector": {"matchLabels": {"app": format!("a{}", (i * 7) % 50)}}}],
         "ports": [{"port": "metrics"}, {"port": 53, "protocol": "UDP"}]},
    ]);
    let mut spec = json!({"podSelector": selector, "ingress": ingress});
    if i.is_multiple_of(3) {
        spec["policyTypes"] = json!(["Ingress", "Egress"]);
        spec["egress"] = json!([
            {"to": [{"podSelector": {"matchLabels": {"role": "server"}}}]},
            {"to": [{"namespaceSelector": {}}], "ports": [{"port": "dns", "protocol": "UDP"}]},
            {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}],
             "ports": [{"port": 443}]},
        ]);
    }
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": format!("p-{i}"), "namespace": "default",
                        "labels": {"bench": "policy"}},
           "spec": spec})
}

/// New policy `k` of the latency part: lets `198.18.<k>.0/24` into the server.
pub fn new_policy(k: usize) -> String {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": format!("new-{k}"), "namespace": "default",
                        "labels": {"bench": "new"}},
           "spec": {"podSelector": {"matchLabels": {"role": "server"}},
                    "ingress": [{"from": [{"ipBlock": {"cidr": format!("198.18.{k}.0/24")}}]}]}})
    .to_string()
}

/// Creates `policy` (JSON) in `default` with one POST from the control plane's
/// namespace (curl: a process far quicker to start than kubectl, so the time
/// around it brackets the API server's write closely).
pub fn post_policy(cp: &ControlPlane, policy: &str) {
    let path = "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies";
    api_write(cp, "POST", path, "application/json", policy);
}

/// One `method` request of `body` (of `content_type`) to the API server's
/// `path`, with curl from the control plane's namespace (see [`post_policy`]).
pub fn api_write(cp: &ControlPlane, method: &str, path: &str, content_type: &str, body: &str) {
    let ns = NetNs::open(format!("/run/netns/{}", cp.netns())).expect("open the API's netns");
    let url = format!("{}{path}", cp.server());
    let dir = cp.dir();
    let request = || -> std::io::Result<std::process::Output> {
        let mut child = std::process::Command::new("curl")
            .args(["-sS", "--fail", "-o", "/dev/null", "-X", method])
            .args(["-H", &format!("Content-Type: {content_type}")])
            .args(["--data-binary", "@-"])
            .arg("--cacert")
            .arg(dir.join("ca.crt"))
            .arg("--cert")
            .arg(dir.join("admin.crt"))
            .arg("--key")
            .arg(dir.join("admin.key"))
            .arg(&url)
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(body.as_bytes())?;
        }
        child.wait_with_output()
    };
    let out = in_netns(&ns, || Ok(request()))
        .expect("enter the API's netns")
        .expect("curl");
    assert!(out.status.success(), "{method} {path} {body}: {out:?}");
}

/// The rules of the pod chain `chain` in the node's policy table, with those
/// of its pass chain (`pass_<chain>`: ClusterNetworkPolicy's Admin tier first,
/// the NetworkPolicy tier behind a Pass) ("" if absent). One terse listing of
/// the table (no set elements): as long as listing one chain, which reads the
/// sets too (about 120 ms with 100,000 elements).
pub fn chain(node: &Node, chain: &str) -> String {
    let ns = NetNs::open(node.ns.path()).expect("open the node's netns");
    let out = in_netns(&ns, || {
        Ok(std::process::Command::new("nft")
            .args(["-t", "list", "table", "inet", "podnet_policy"])
            .output())
    })
    .expect("enter the node's netns")
    .expect("nft");
    let pass = format!("pass_{chain}");
    let ours = |name: &str| name == chain || name == pass;
    let (mut rules, mut inside) = (String::new(), false);
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(name) = line.trim().strip_prefix("chain ") {
            inside = ours(name.trim_end_matches(" {"));
        } else if line.trim() == "}" {
            inside = false;
        } else if inside {
            rules.push_str(line);
            rules.push('\n');
        }
    }
    rules
}

/// Waits (2 min at most) until the agent has written a state with `n`
/// policies; returns how long that took.
pub fn wait_policies(node: &Node, n: usize) -> Duration {
    let t = Instant::now();
    let want = format!("table written; {n} NetworkPolicies,");
    while !node.podnet(&["status"]).contains(&want) {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "the agent never wrote {n} policies: {}\n{}",
            node.podnet(&["status"]),
            node.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    t.elapsed()
}

/// The agent's (RSS, peak RSS) in KiB and CPU ticks (user + system) so far.
pub fn usage(pid: i32) -> (u64, u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (kib("VmRSS:"), kib("VmHWM:"), cpu_ticks(pid).0)
}

/// A process's CPU ticks (user + system) so far, and those of the children it
/// waited for (the agent's nft runs).
pub fn cpu_ticks(pid: i32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis: utime, stime, cutime and
    // cstime are the 12th to the 15th of them.
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<u64> = after
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let at = |i: usize| fields.get(i).copied().unwrap_or(0);
    (at(11) + at(12), at(13) + at(14))
}

pub fn cpu_seconds(from: u64, to: u64) -> f64 {
    to.saturating_sub(from) as f64 / TICKS_PER_SECOND
}

pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

pub fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
#[ignore = "a benchmark: scripts/bench-policy runs it"]
fn policy_enforcement_latency_datapath_and_agent_cost() {
    let Some(cp) = ControlPlane::start("policy_bench") else {
        return;
    };
    let started = Instant::now();
    let load_start = load();
    let (node, node_name) = policy_agent(&cp, "polbench-1", "10.244.7.0/24");
    let pid = node.daemon_pid().expect("the agent runs");

    // The two real pods, labelled and with their status as a kubelet writes it.
    let sandboxes = [node.sandbox(), node.sandbox()];
    create_sandbox_pods(&cp, &node_name, &sandboxes);
    let [server, client] = sandboxes;
    let server_ip = add_with_uid(&cp, &node, &server).ipv4();
    let client_ip = add_with_uid(&cp, &node, &client).ipv4();
    let server_link = podnet::datapath::host_ifname(&server.container_id, &server.ifname);
    let ingress_chain = format!("ingress_{server_link}");
    for (sb, labels) in [
        (&server, "role=server app=a0 tier=t0 bench=yes"),
        (&client, "role=client app=a1 tier=t1 bench=yes"),
    ] {
        let mut args = vec!["label", "pod", &sb.ns.name];
        args.extend(labels.split(' '));
        cp.kubectl(&args).expect_ok("label a real pod");
    }
    wait_policies(&node, 0);
    std::thread::sleep(Duration::from_secs(2));
    let (rss_empty, _, ticks_empty) = usage(pid);

    // The cluster's objects: namespaces, pods (then their status), policies.
    cp.kubectl_stdin(&["apply", "-f", "-"], &namespaces().to_string())
        .expect_ok("namespaces");
    let pods = env_or("BENCH_PODS", 1000usize);
    let t_pods = Instant::now();
    create_sim_pods(&cp, 2..pods);
    let real_status = |ip: &str| {
        json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}).to_string()
    };
    for (sb, ip) in [(&server, &server_ip), (&client, &client_ip)] {
        cp.kubectl(&[
            "patch",
            "pod",
            &sb.ns.name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &real_status(ip),
        ])
        .expect_ok("real pod status");
    }
    let pods_took = t_pods.elapsed();
    let n_policies = env_or("BENCH_POLICIES", 200usize);
    let policies = list((0..n_policies).map(policy).collect());
    let t_policies = Instant::now();
    cp.kubectl_stdin(&["create", "-f", "-"], &policies)
        .expect_ok("create policies");
    let created_took = t_policies.elapsed();
    let applied_after = wait_policies(&node, n_policies) + created_took;
    let (rss_loaded, _, ticks_loaded) = usage(pid);
    assert!(
        chain(&node, &ingress_chain).contains("accept"),
        "the server's ingress chain: {}",
        chain(&node, &ingress_chain)
    );

    // At rest with everything.
    let rest = env_or("BENCH_REST_SECONDS", 60u64);
    std::thread::sleep(Duration::from_secs(5));
    let (_, _, ticks_rest0) = usage(pid);
    let t_rest = Instant::now();
    std::thread::sleep(Duration::from_secs(rest));
    let (rss_rest, hwm_rest, ticks_rest1) = usage(pid);
    let rest_cpu = cpu_seconds(ticks_rest0, ticks_rest1) / t_rest.elapsed().as_secs_f64();

    // Policy created to enforced, one at a time.
    let (mut from_return, mut from_start, mut create_took) = (Vec::new(), Vec::new(), Vec::new());
    let (_, _, ticks_new0) = usage(pid);
    let new = env_or("BENCH_NEW", 50usize);
    for k in 0..new {
        let needle = format!("198.18.{k}.0/24");
        let t0 = Instant::now();
        post_policy(&cp, &new_policy(k));
        let t1 = Instant::now();
        while !chain(&node, &ingress_chain).contains(&needle) {
            assert!(
                t1.elapsed() < Duration::from_secs(60),
                "policy new-{k} never enforced"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let t2 = Instant::now();
        from_return.push((t2 - t1).as_secs_f64() * 1e3);
        from_start.push((t2 - t0).as_secs_f64() * 1e3);
        create_took.push((t1 - t0).as_secs_f64() * 1e3);
        // Past the agent's debounce, so the next one is a change of its own.
        std::thread::sleep(Duration::from_millis(500));
    }
    let (_, _, ticks_new1) = usage(pid);
    cp.kubectl(&[
        "delete",
        "networkpolicy",
        "-n",
        "default",
        "-l",
        "bench=new",
    ])
    .expect_ok("delete the new policies");
    wait_policies(&node, n_policies);
    for v in [&mut from_return, &mut from_start, &mut create_took] {
        v.sort_by(f64::total_cmp);
    }

    // Throughput and round trips, with the policies and with none, alternating.
    let (mut with_rounds, mut none_rounds) = (Vec::new(), Vec::new());
    let mut with_policies = true;
    for round in 0..env_or("BENCH_ROUNDS", 5usize) {
        for want in [round % 2 == 0, round % 2 == 1] {
            if want != with_policies {
                match want {
                    true => cp
                        .kubectl_stdin(&["create", "-f", "-"], &policies)
                        .expect_ok("create policies"),
                    false => cp
                        .kubectl(&[
                            "delete",
                            "networkpolicy",
                            "-n",
                            "default",
                            "-l",
                            "bench=policy",
                        ])
                        .expect_ok("delete policies"),
                };
                wait_policies(&node, if want { n_policies } else { 0 });
                with_policies = want;
            }
            assert_eq!(
                chain(&node, &ingress_chain).contains("accept"),
                want,
                "the server's chain with policies {want}"
            );
            let figures = measure(&client.ns, &server.ns, &server_ip);
            match want {
                true => with_rounds.push(figures),
                false => none_rounds.push(figures),
            }
        }
    }
    let (with, none) = (median(&with_rounds), median(&none_rounds));
    let paired = |f: fn(&Figures) -> f64| paired(&with_rounds, &none_rounds, f);

    let mib = |kib: u64| kib as f64 / 1024.0;
    let report = format!(
        "\n{pods} Pod objects ({} on the measured node, the rest on {SIM_NODES} simulated nodes, \
         {NAMESPACES} namespaces), {n_policies} NetworkPolicies; load average at start {load_start}, \
         at end {}; {:.0} s in all.\n\n\
         Objects in: pods created with their status in {:.1} s; the {n_policies} policies created in \
         {:.1} s (one kubectl), written by the agent {:.1} s after the create began.\n\n\
         | policy created → enforced (server's chain in the kernel), {new} policies | p50 ms | p99 ms | max ms |\n\
         |---|---|---|---|\n\
         | from the create's return | {:.0} | {:.0} | {:.0} |\n\
         | from the create's start (the request included) | {:.0} | {:.0} | {:.0} |\n\
         | the create request itself (curl, TLS included) | {:.0} | {:.0} | {:.0} |\n\n\
         | agent | RSS MiB | CPU |\n\
         |---|---|---|\n\
         | before the objects (2 pods, 0 policies) | {:.1} | {:.2} s since start |\n\
         | objects arriving (pods, then policies until written) | {:.1} | {:.2} s |\n\
         | at rest with them, {rest} s | {:.1} (peak {:.1}) | {:.2} % of a core |\n\
         | {new} policy creations | | {:.2} s, {:.0} ms each |\n\n\
         | client → server, one node | {n_policies} policies Gbit/s | none Gbit/s | ratio | {n_policies} policies RTT p50 / p99 µs | none RTT p50 / p99 µs | RTT p99 ratio |\n\
         |---|---|---|---|---|---|---|\n\
         | veth, IPv4, TCP (medians of {} rounds) | {:.2} | {:.2} | {:.2} | {:.0} / {:.0} | {:.0} / {:.0} | {:.2} |\n\n\
         per-round with/none ratios, median over {} rounds: throughput {:.2}, RTT p50 {:.2}, RTT p99 {:.2}\n",
        2,
        load(),
        started.elapsed().as_secs_f64(),
        pods_took.as_secs_f64(),
        created_took.as_secs_f64(),
        applied_after.as_secs_f64(),
        percentile(&from_return, 0.5),
        percentile(&from_return, 0.99),
        percentile(&from_return, 1.0),
        percentile(&from_start, 0.5),
        percentile(&from_start, 0.99),
        percentile(&from_start, 1.0),
        percentile(&create_took, 0.5),
        percentile(&create_took, 0.99),
        percentile(&create_took, 1.0),
        mib(rss_empty),
        cpu_seconds(0, ticks_empty),
        mib(rss_loaded),
        cpu_seconds(ticks_empty, ticks_loaded),
        mib(rss_rest),
        mib(hwm_rest),
        rest_cpu * 100.0,
        cpu_seconds(ticks_new0, ticks_new1),
        cpu_seconds(ticks_new0, ticks_new1) * 1e3 / new as f64,
        with_rounds.len(),
        with.gbit_per_s,
        none.gbit_per_s,
        with.gbit_per_s / none.gbit_per_s,
        with.rtt_p50_us,
        with.rtt_p99_us,
        none.rtt_p50_us,
        none.rtt_p99_us,
        with.rtt_p99_us / none.rtt_p99_us,
        with_rounds.len(),
        paired(|f| f.gbit_per_s),
        paired(|f| f.rtt_p50_us),
        paired(|f| f.rtt_p99_us),
    );
    append_to_bench_out(&report);
}

/// One agent of the memory benchmark and its readings: (RSS, peak RSS, CPU
/// ticks) before the objects, once they are written, and at rest.
struct Agent {
    what: String,
    node: Node,
    readings: Vec<(u64, u64, u64)>,
}

impl Agent {
    fn read(&mut self) {
        let pid = self.node.daemon_pid().expect("the agent runs");
        self.readings.push(usage(pid));
    }
}

/// The agent's memory with many Pods (`BENCH_PODS`, 5,000 here) and
/// `BENCH_POLICIES` (200) NetworkPolicies, as `policy_bench`'s (the same
/// objects, no real pods): the binary under test and, when
/// `BENCH_BASELINE_BIN` names another build (main's, say), that one beside it
/// on a second node of the same API server, so both see the same objects at the
/// same load. Reads each agent's RSS and CPU before the objects, once both have
/// written the policies, and after `BENCH_REST_SECONDS` (60) at rest.
#[test]
#[ignore = "a benchmark: BENCH_TEST=memory scripts/bench-policy runs it"]
fn policy_agent_memory_with_many_pods_against_a_baseline() {
    let Some(cp) = ControlPlane::start("policy_bench_memory") else {
        return;
    };
    let started = Instant::now();
    let load_start = load();
    let mut agents = vec![Agent {
        what: format!("this build ({})", podnet_bin()),
        node: policy_agent(&cp, "polmem-1", "10.244.8.0/24").0,
        readings: Vec::new(),
    }];
    if let Ok(bin) = std::env::var("BENCH_BASELINE_BIN")
        && !bin.is_empty()
    {
        agents.push(Agent {
            what: format!("baseline ({bin})"),
            node: policy_agent_of(&cp, "polmem-2", "10.244.9.0/24", Some(&bin)).0,
            readings: Vec::new(),
        });
    }
    for a in &agents {
        wait_policies(&a.node, 0);
    }
    std::thread::sleep(Duration::from_secs(2));
    agents.iter_mut().for_each(Agent::read);

    cp.kubectl_stdin(&["apply", "-f", "-"], &namespaces().to_string())
        .expect_ok("namespaces");
    let pods = env_or("BENCH_PODS", 5000usize);
    let t_pods = Instant::now();
    create_sim_pods(&cp, 0..pods);
    let pods_took = t_pods.elapsed();
    let n_policies = env_or("BENCH_POLICIES", 200usize);
    cp.kubectl_stdin(
        &["create", "-f", "-"],
        &list((0..n_policies).map(policy).collect()),
    )
    .expect_ok("create policies");
    for a in &agents {
        wait_policies(&a.node, n_policies);
    }
    agents.iter_mut().for_each(Agent::read);
    let rest = env_or("BENCH_REST_SECONDS", 60u64);
    std::thread::sleep(Duration::from_secs(rest));
    agents.iter_mut().for_each(Agent::read);

    let mib = |kib: u64| kib as f64 / 1024.0;
    let mut report = format!(
        "\n{pods} Pod objects ({NAMESPACES} namespaces, {SIM_NODES} simulated nodes, none on the \
         agents' nodes), {n_policies} NetworkPolicies, {} agent(s) of one API server; pods created \
         with their status in {:.1} s; load average at start {load_start}, at end {}; {:.0} s in all.\n\n\
         | agent | RSS MiB before the objects | with them, written | at rest {rest} s (peak) | CPU s objects arriving | CPU at rest % of a core |\n\
         |---|---|---|---|---|---|\n",
        agents.len(),
        pods_took.as_secs_f64(),
        load(),
        started.elapsed().as_secs_f64(),
    );
    for a in &agents {
        let [(empty, _, t0), (loaded, _, t1), (at_rest, peak, t2)] = a.readings[..] else {
            panic!("three readings of {}", a.what);
        };
        report.push_str(&format!(
            "| {} | {:.1} | {:.1} | {:.1} ({:.1}) | {:.2} | {:.2} |\n",
            a.what,
            mib(empty),
            mib(loaded),
            mib(at_rest),
            mib(peak),
            cpu_seconds(t0, t1),
            cpu_seconds(t1, t2) * 100.0 / rest.max(1) as f64,
        ));
    }
    append_to_bench_out(&report);
}
