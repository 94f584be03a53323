//! NetworkPolicy at scale (`BENCH_TEST=scale scripts/bench-policy` runs it;
//! `#[ignore]`d so the suite never does). On a real kube-apiserver with the
//! ClusterNetworkPolicy CRD, one node whose agent enforces both kinds
//! (`--enable-policy default --enable-cluster-network-policy`) with two real
//! pods attached by the plugin (server and client), `BENCH_PODS` (10,000) Pod
//! objects in all (policy_bench's: 10 namespaces, 20 simulated nodes, labels,
//! named ports, `status.podIPs`), `BENCH_POLICIES` (1,000) NetworkPolicies
//! (policy_bench's shapes, spread over the 10 namespaces: a tenth of them
//! select the server) and `BENCH_CLUSTER_POLICIES` (100)
//! ClusterNetworkPolicies (half Admin, half Baseline, each with pod and
//! namespace peers).
//!
//! It measures, in one run: the plugin's ADD latency (the real plugin binary,
//! started as a runtime starts it, through the daemon's socket, and its
//! phases from its log line; each ADD then DEL, `BENCH_ADDS` (100) of
//! each kind) while labels and policies churn with every policy in, and while
//! Pod labels churn with no policy, in four phases (with, without, without,
//! with: a drift of the machine weighs on both kinds alike); a Pod label
//! change to the kernel (`BENCH_LABELS` (50) pods, one at a time: one PATCH
//! with curl, then `nft get element` of the pod's address in the set of a
//! probe policy's peer, polled), joining and leaving; a new NetworkPolicy to
//! its rule in the server's rules (`BENCH_NEW` (30)); the agent's CPU per Pod
//! event (bulk label changes, `kubectl label` of every simulated pod of a
//! namespace at once, the agent's CPU until it is quiet again, less its CPU
//! at rest) and its RSS.
//! It prints a Markdown report (and writes it to `BENCH_OUT`); it asserts
//! nothing about time.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use podnet::datapath::{NetNs, in_netns};
use serde_json::{Value, json};

use crate::crossnode_bench::{append_to_bench_out, env_or};
use crate::harness::*;
use crate::k8s::ControlPlane;
use crate::k8s_backend::{
    POLICY_AGENT_ARGS, add_with_uid, create_node, create_sandbox_pods, eventually, k8s_node,
};
use crate::policy_bench::{
    NAMESPACES, api_write, chain, cpu_seconds, cpu_ticks, create_sim_pods, list, load, namespace,
    namespaces, new_policy, percentile, policy, post_policy, usage, wait_policies,
};

/// The port of the probe policy's rule: the one line of the server's ingress
/// chain that names it also names the probe's peer set.
const PROBE_PORT: &str = "7777";

/// Policy `i` of policy_bench in namespace `i % 10` (`default`'s select the
/// server).
fn spread_policy(i: usize) -> Value {
    let mut p = policy(i);
    p["metadata"]["namespace"] = json!(namespace(i));
    p
}

/// ClusterNetworkPolicy `i`: Admin for even `i`, Baseline for odd; its
/// subject the pods of one team's namespace or of one app; ingress from one
/// app anywhere (Accept, Deny or Pass), egress to a team's namespaces.
fn cluster_policy(i: usize) -> Value {
    let tier = if i.is_multiple_of(2) {
        "Admin"
    } else {
        "Baseline"
    };
    let subject = match i % 3 {
        0 => json!({"namespaces": {"matchLabels": {"team": format!("t{}", i % NAMESPACES)}}}),
        _ => json!({"pods": {"namespaceSelector": {},
                             "podSelector": {"matchLabels": {"app": format!("a{}", i % 50)}}}}),
    };
    let action = ["Accept", "Deny", "Pass"][i % 3];
    json!({"apiVersion": "policy.networking.k8s.io/v1beta1", "kind": "ClusterNetworkPolicy",
           "metadata": {"name": format!("cnp-{i}"), "labels": {"bench": "policy"}},
           "spec": {"tier": tier, "priority": i % 1000, "subject": subject,
                    "ingress": [{"action": action, "from": [{"pods": {
                        "namespaceSelector": {},
                        "podSelector": {"matchLabels": {"app": format!("a{}", (i * 3) % 50)}}}}]}],
                    "egress": [{"action": action, "to": [{"namespaces": {
                        "matchLabels": {"team": format!("t{}", (i + 1) % NAMESPACES)}}}]}]}})
}

/// The probe: lets pods labelled `probe=in` (any namespace) into the server
/// on [`PROBE_PORT`].
fn probe_policy() -> String {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
           "metadata": {"name": "probe", "namespace": "default"},
           "spec": {"podSelector": {"matchLabels": {"role": "server"}},
                    "ingress": [{"from": [{"namespaceSelector": {},
                                           "podSelector": {"matchLabels": {"probe": "in"}}}],
                                 "ports": [{"port": 7777}]}]}})
    .to_string()
}

/// Simulated pod `i`'s namespace, name and address (policy_bench's `sim_pod`).
fn sim(i: usize) -> (String, String, String) {
    let ip = format!("10.128.{}.{}", i / 250, i % 250 + 1);
    (namespace(i), format!("sim-{i}"), ip)
}

/// Sets label `key` of simulated pod `i` to `value` (None: removes it), one
/// merge PATCH.
fn label(cp: &ControlPlane, i: usize, key: &str, value: Option<&str>) {
    let (ns, name, _) = sim(i);
    let body = json!({"metadata": {"labels": {key: value}}}).to_string();
    let path = format!("/api/v1/namespaces/{ns}/pods/{name}");
    api_write(cp, "PATCH", &path, "application/merge-patch+json", &body);
}

/// Runs `nft args` in the node's namespace; whether it succeeded.
fn nft_ok(node: &Node, args: &[&str]) -> bool {
    let ns = NetNs::open(node.ns.path()).expect("open the node's netns");
    in_netns(&ns, || {
        Ok(std::process::Command::new("nft")
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status())
    })
    .expect("enter the node's netns")
    .expect("nft")
    .success()
}

/// Whether the IPv4 set `set` of the policy table holds `ip`.
fn in_set(node: &Node, set: &str, ip: &str) -> bool {
    let element = format!("{{ {ip} }}");
    nft_ok(
        node,
        &["get", "element", "inet", "podnet_policy", set, &element],
    )
}

/// Milliseconds until `done` holds (polled every 5 ms, 60 s at most).
fn ms_until(what: &str, done: impl Fn() -> bool) -> f64 {
    let t = Instant::now();
    while !done() {
        assert!(t.elapsed() < Duration::from_secs(60), "{what} never seen");
        std::thread::sleep(Duration::from_millis(5));
    }
    t.elapsed().as_secs_f64() * 1e3
}

/// The IPv4 set of the server's probe rule.
fn probe_set(node: &Node, ingress_chain: &str) -> String {
    let listing = chain(node, ingress_chain);
    let line = listing
        .lines()
        .find(|l| l.contains(PROBE_PORT))
        .unwrap_or_else(|| panic!("the probe rule in {ingress_chain}: {listing}"));
    let set = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix('@'))
        .unwrap_or_else(|| panic!("a set in the probe rule: {line}"));
    set.to_string()
}

/// Label changes to the kernel, `n` pods one at a time: (join ms, leave ms).
fn label_latency(
    cp: &ControlPlane,
    node: &Node,
    set: &str,
    pods: usize,
    n: usize,
) -> [Vec<f64>; 2] {
    let (mut join, mut leave) = (Vec::new(), Vec::new());
    for k in 0..n {
        let i = 2 + (k * 197) % (pods - 2);
        let (_, name, ip) = sim(i);
        label(cp, i, "probe", Some("in"));
        join.push(ms_until(&format!("{name} in {set}"), || {
            in_set(node, set, &ip)
        }));
        std::thread::sleep(Duration::from_millis(300));
        label(cp, i, "probe", None);
        leave.push(ms_until(&format!("{name} out of {set}"), || {
            !in_set(node, set, &ip)
        }));
        std::thread::sleep(Duration::from_millis(300));
    }
    for v in [&mut join, &mut leave] {
        v.sort_by(f64::total_cmp);
    }
    [join, leave]
}

/// New policies to their rule in the server's chain, one at a time (ms from
/// the create's return).
fn new_policy_latency(cp: &ControlPlane, node: &Node, ingress_chain: &str, n: usize) -> Vec<f64> {
    let mut ms = Vec::new();
    for k in 0..n {
        let needle = format!("198.18.{k}.0/24");
        post_policy(cp, &new_policy(k));
        ms.push(ms_until(&format!("policy new-{k}"), || {
            chain(node, ingress_chain).contains(&needle)
        }));
        std::thread::sleep(Duration::from_millis(300));
    }
    cp.kubectl(&[
        "delete",
        "networkpolicy",
        "-n",
        "default",
        "-l",
        "bench=new",
    ])
    .expect_ok("delete the new policies");
    ms.sort_by(f64::total_cmp);
    ms
}

/// Who spent the CPU of one ADD phase: the agent (its own threads, and the nft
/// processes it ran), kube-apiserver and etcd, in CPU seconds per second of
/// the phase.
struct PhaseCpu {
    seconds: f64,
    agent: f64,
    nft: f64,
    apiserver: f64,
    etcd: f64,
}

impl PhaseCpu {
    /// The phase's row, with the policy table's `writes` (count, seconds).
    fn row(&self, phase: &str, writes: (f64, f64)) -> String {
        let (count, secs) = writes;
        format!(
            "| {phase} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} | {:.1} |",
            self.seconds,
            self.agent,
            self.nft,
            self.apiserver,
            self.etcd,
            count / self.seconds,
            if count > 0.0 { secs * 1e3 / count } else { 0.0 }
        )
    }
}

/// The CPU counters [`PhaseCpu`] is the difference of.
fn cpu_now(cp: &ControlPlane, agent: i32) -> [u64; 4] {
    let own = |pid: Option<i32>| pid.map_or(0, |p| cpu_ticks(p).0);
    let (a, n) = cpu_ticks(agent);
    [a, n, own(cp.apiserver_pid()), own(cp.etcd_pid())]
}

/// One ADD phase: each ADD's parts in ms (`wall`: as the bench timed it;
/// `exec`: that less the plugin's own duration, the process's start and exit;
/// then each phase the plugin's log line gives), the policy table's writes
/// meanwhile (how many, and the seconds their `nft` runs took), and who spent
/// the CPU.
struct AddPhase {
    parts: BTreeMap<String, Vec<f64>>,
    writes: (f64, f64),
    cpu: PhaseCpu,
}

/// The agent's policy table writes so far: (count, seconds), every result.
fn policy_writes(node: &Node) -> (f64, f64) {
    let metrics = node.metrics();
    let sum = |name: &str| -> f64 {
        let prefix = format!("podnet_policy_write_duration_seconds_{name}{{");
        metric_values(&metrics, &prefix).iter().sum()
    };
    (sum("count"), sum("sum"))
}

/// The duration and the phases of each ADD line of the plugin's log file
/// (`duration_ms=… phases_ms=a:1.2,b:3.4`), in order; the file is removed.
fn logged_adds(log: &std::path::Path) -> Vec<BTreeMap<String, f64>> {
    let text = std::fs::read_to_string(log).expect("the plugin's log file");
    std::fs::remove_file(log).expect("remove the plugin's log file");
    let field = |line: &str, key: &str| -> String {
        let at = line
            .find(key)
            .unwrap_or_else(|| panic!("no {key} in {line}"));
        line[at + key.len()..]
            .split(' ')
            .next()
            .unwrap_or("")
            .to_string()
    };
    text.lines()
        .filter(|l| l.contains(" ADD "))
        .map(|line| {
            let mut parts: BTreeMap<String, f64> = field(line, "phases_ms=")
                .split(',')
                .filter_map(|p| p.split_once(':'))
                .map(|(name, ms)| (name.to_string(), ms.parse().expect("a phase's ms")))
                .collect();
            let total = field(line, "duration_ms=").parse().expect("duration_ms");
            parts.insert("plugin".into(), total);
            parts
        })
        .collect()
}

/// ADD (then DEL) of each sandbox, timed, while `churn` runs on another
/// thread until they are done; the plugin logs each to a file the bench reads.
fn add_latency(
    node: &Node,
    cpu: impl Fn() -> [u64; 4],
    sandboxes: &[Sandbox],
    churn: impl Fn(&AtomicBool) + Sync,
) -> AddPhase {
    let log = node.dir.join("bench-cni.log");
    let mut conf: Value = serde_json::from_str(&node.conf("1.1.0")).expect("conf");
    conf["log-file"] = json!(log);
    let conf = conf.to_string();
    let (t0, c0, w0) = (Instant::now(), cpu(), policy_writes(node));
    let stop = AtomicBool::new(false);
    let walls = std::thread::scope(|s| {
        s.spawn(|| churn(&stop));
        let ms: Vec<f64> = sandboxes
            .iter()
            .map(|sb| {
                let t = Instant::now();
                let add = node.plugin_as_runtime("ADD", sb, &conf);
                let took = t.elapsed().as_secs_f64() * 1e3;
                assert!(add.ok, "ADD {}: {}", sb.ns.name, add.stdout);
                let del = node.plugin_as_runtime("DEL", sb, &conf);
                assert!(del.ok, "DEL {}", sb.ns.name);
                took
            })
            .collect();
        stop.store(true, Ordering::Relaxed);
        ms
    });
    let (seconds, c1, w1) = (t0.elapsed().as_secs_f64(), cpu(), policy_writes(node));
    let logged = logged_adds(&log);
    assert_eq!(logged.len(), walls.len(), "one log line per ADD");
    let mut parts: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (wall, mut logged) in walls.into_iter().zip(logged) {
        logged.insert("exec".into(), wall - logged["plugin"]);
        logged.insert("wall".into(), wall);
        for (name, ms) in logged {
            parts.entry(name).or_default().push(ms);
        }
    }
    let per_s = |i: usize| cpu_seconds(c0[i], c1[i]) / seconds;
    let cpu = PhaseCpu {
        seconds,
        agent: per_s(0),
        nft: per_s(1),
        apiserver: per_s(2),
        etcd: per_s(3),
    };
    let writes = (w1.0 - w0.0, w1.1 - w0.1);
    AddPhase { parts, writes, cpu }
}

/// The ms of one part of every ADD of `phases`, sorted.
fn pooled(phases: &[&AddPhase], part: &str) -> Vec<f64> {
    let all = phases
        .iter()
        .flat_map(|p| p.parts.get(part).into_iter().flatten());
    let mut v: Vec<f64> = all.copied().collect();
    v.sort_by(f64::total_cmp);
    v
}

/// Each part of the ADD (`wall`, `exec`, `plugin`, the plugin's phases), p50
/// and p99 without and with policies, each kind's two phases pooled.
fn parts_table(without: [&AddPhase; 2], with: [&AddPhase; 2]) -> String {
    let mut rows = vec![
        "| ADD part, ms | without: p50 | p99 | with: p50 | p99 |".to_string(),
        "|---|---|---|---|---|".into(),
    ];
    let order = ["wall", "exec", "plugin"];
    let rest = with[0]
        .parts
        .keys()
        .filter(|k| !order.contains(&k.as_str()));
    for part in order.iter().map(|s| s.to_string()).chain(rest.cloned()) {
        let (a, b) = (pooled(&without, &part), pooled(&with, &part));
        if a.is_empty() || b.is_empty() {
            continue;
        }
        let q = |v: &[f64], x| percentile(v, x);
        rows.push(format!(
            "| {part} | {:.2} | {:.2} | {:.2} | {:.2} |",
            q(&a, 0.5),
            q(&a, 0.99),
            q(&b, 0.5),
            q(&b, 0.99)
        ));
    }
    rows.join("\n")
}

/// Label churn: a simulated pod's `app` changed every 100 ms; with
/// `policies`, also a policy created or deleted every 500 ms. Every request is
/// one curl, so the churn itself costs the machine alike with and without.
fn churn(cp: &ControlPlane, pods: usize, policies: bool, stop: &AtomicBool) {
    let mut k = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let i = 2 + (k * 7919) % (pods - 2);
        label(cp, i, "app", Some(&format!("a{}", k % 50)));
        if policies && k.is_multiple_of(5) {
            match (k / 5) % 2 {
                0 => post_policy(cp, &new_policy(200 + (k / 10) % 50)),
                _ => {
                    let name = format!("new-{}", 200 + (k / 10) % 50);
                    let path = format!(
                        "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies/{name}"
                    );
                    api_write(cp, "DELETE", &path, "application/json", "");
                }
            }
        }
        k += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The agent's CPU ticks once it has been quiet (no tick in 2 s of
/// `rest_per_s`-corrected readings) after a burst.
fn ticks_when_quiet(pid: i32, rest_per_s: f64) -> (u64, Instant) {
    let mut last = usage(pid).2;
    loop {
        std::thread::sleep(Duration::from_secs(2));
        let now = usage(pid).2;
        if (now - last) as f64 <= rest_per_s * 2.0 + 2.0 {
            return (now, Instant::now());
        }
        last = now;
    }
}

/// Bulk label changes: every simulated pod of namespaces `bench-1..` relabelled
/// (`app`), one `kubectl label` per namespace; (events, agent CPU ms per event
/// less its rest rate, seconds).
fn cpu_per_pod_event(cp: &ControlPlane, pid: i32, rest_per_s: f64) -> (usize, f64, f64) {
    let (_, _, t0) = usage(pid);
    let start = Instant::now();
    let mut events = 0;
    for n in 1..NAMESPACES {
        let ns = format!("bench-{n}");
        let value = format!("app=a{}", (n * 11) % 50);
        let out = cp
            .kubectl(&[
                "label",
                "pods",
                "-n",
                &ns,
                "-l",
                "bench=yes",
                &value,
                "--overwrite",
            ])
            .expect_ok("relabel a namespace's pods");
        events += out.lines().filter(|l| l.ends_with(" labeled")).count();
    }
    let (t1, end) = ticks_when_quiet(pid, rest_per_s);
    let secs = (end - start).as_secs_f64();
    let busy = (cpu_seconds(t0, t1) - rest_per_s / 100.0 * secs).max(0.0);
    (events, busy * 1e3 / events.max(1) as f64, secs)
}

/// The agent's node: policy and ClusterNetworkPolicy enforced, the server and
/// client attached by the plugin and labelled, with their addresses; `adds`
/// more sandboxes with their Pods (the ADD latency's). The node, server's
/// ingress chain, the sandboxes.
fn scale_node(cp: &ControlPlane, adds: usize) -> (Node, String, Vec<Sandbox>) {
    cp.install_crds();
    let ns = cp.add_node_ns("polscale-1");
    // A /21: the ADD phases' 2 x `adds` ADDs may all fall within the daemon's
    // release cooldown (30 s: a released address is not handed out again
    // before), each then taking an address of its own.
    create_node(cp, &ns, &["10.244.0.0/21"]);
    let node_name = ns.name.clone();
    let mut node = k8s_node(ns, &cp.kubeconfig(), &POLICY_AGENT_ARGS);
    node.start_daemon();
    let real = [node.sandbox(), node.sandbox()];
    let sandboxes: Vec<Sandbox> = (0..adds).map(|_| node.sandbox()).collect();
    create_sandbox_pods(cp, &node_name, &real);
    create_sandbox_pods(cp, &node_name, &sandboxes);
    let [server, client] = real;
    for (sb, labels) in [
        (&server, "role=server app=a0 tier=t0 bench=yes"),
        (&client, "role=client app=a1 tier=t1 bench=yes"),
    ] {
        let ip = add_with_uid(cp, &node, sb).ipv4();
        let mut args = vec!["label", "pod", &sb.ns.name];
        args.extend(labels.split(' '));
        cp.kubectl(&args).expect_ok("label a real pod");
        cp.set_pod_ip(&sb.ns.name, &ip);
    }
    let link = podnet::datapath::host_ifname(&server.container_id, &server.ifname);
    (node, format!("ingress_{link}"), sandboxes)
}

/// Creates the bench's policies, `counts` (NetworkPolicies,
/// ClusterNetworkPolicies) and the probe; the time until the agent wrote them.
fn create_policies(cp: &ControlPlane, node: &Node, counts: (usize, usize)) -> Duration {
    let (n_policies, n_cluster) = counts;
    let t = Instant::now();
    cp.kubectl_stdin(
        &["create", "-f", "-"],
        &list((0..n_policies).map(spread_policy).collect()),
    )
    .expect_ok("create policies");
    cp.kubectl_stdin(
        &["create", "-f", "-"],
        &list((0..n_cluster).map(cluster_policy).collect()),
    )
    .expect_ok("create cluster policies");
    cp.kubectl_stdin(&["create", "-f", "-"], &probe_policy())
        .expect_ok("the probe policy");
    wait_cluster_policies(node, n_cluster);
    wait_policies(node, n_policies + 1) + t.elapsed()
}

/// Deletes every policy of both kinds, and waits for the agent to write none.
fn delete_policies(cp: &ControlPlane, node: &Node) {
    cp.kubectl(&["delete", "networkpolicies", "--all", "-A", "--wait=false"])
        .expect_ok("delete the policies");
    cp.kubectl(&["delete", "clusternetworkpolicies", "--all", "--wait=false"])
        .expect_ok("delete the cluster policies");
    wait_cluster_policies(node, 0);
    wait_policies(node, 0);
}

fn wait_cluster_policies(node: &Node, n: usize) {
    let line = format!("ClusterNetworkPolicy: {n} ClusterNetworkPolicies");
    eventually(&format!("{n} ClusterNetworkPolicies watched"), || {
        node.podnet(&["status"]).contains(&line)
    });
}

fn p50_p99(sorted: &[f64]) -> String {
    format!(
        "{:.0} | {:.0} | {:.0}",
        percentile(sorted, 0.5),
        percentile(sorted, 0.99),
        percentile(sorted, 1.0)
    )
}

#[test]
#[ignore = "a benchmark: BENCH_TEST=scale scripts/bench-policy runs it"]
fn policy_at_scale_label_and_policy_to_kernel_cpu_per_pod_event_and_add_latency() {
    let Some(cp) = ControlPlane::start("policy_scale_bench") else {
        return;
    };
    let (started, load_start) = (Instant::now(), load());
    let adds = env_or("BENCH_ADDS", 100usize);
    let (node, ingress_chain, sandboxes) = scale_node(&cp, adds);
    let pid = node.daemon_pid().expect("the agent runs");
    wait_policies(&node, 0);

    cp.kubectl_stdin(&["apply", "-f", "-"], &namespaces().to_string())
        .expect_ok("namespaces");
    let pods = env_or("BENCH_PODS", 10000usize);
    let t_pods = Instant::now();
    create_sim_pods(&cp, 2..pods);
    let pods_took = t_pods.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(5));
    let (rss_pods, _, _) = usage(pid);

    let counts = (
        env_or("BENCH_POLICIES", 1000usize),
        env_or("BENCH_CLUSTER_POLICIES", 100usize),
    );
    let (n_policies, n_cluster) = counts;
    let (_, _, ticks_p0) = usage(pid);
    let written_after = create_policies(&cp, &node, counts);
    let (_, _, ticks_p1) = usage(pid);
    let set = probe_set(&node, &ingress_chain);

    std::thread::sleep(Duration::from_secs(5));
    let rest = env_or("BENCH_REST_SECONDS", 20u64);
    let (_, _, r0) = usage(pid);
    std::thread::sleep(Duration::from_secs(rest));
    let (rss_rest, hwm_rest, r1) = usage(pid);
    let rest_per_s = (r1 - r0) as f64 / rest as f64;

    let [join, leave] = label_latency(&cp, &node, &set, pods, env_or("BENCH_LABELS", 50usize));
    let new = new_policy_latency(&cp, &node, &ingress_chain, env_or("BENCH_NEW", 30usize));
    let (events, cpu_ms_per_event, burst_s) = cpu_per_pod_event(&cp, pid, rest_per_s);
    let (rss_end, hwm_end, _) = usage(pid);
    ticks_when_quiet(pid, rest_per_s);

    // ADD latency in four phases, with policies, without, without, with
    // (ABBA: a drift of the machine over the run weighs on both alike), each
    // on half the sandboxes; the policies deleted and created again between.
    let (first, second) = sandboxes.split_at(sandboxes.len() / 2);
    let cpu = || cpu_now(&cp, pid);
    let with = |sb: &[Sandbox]| add_latency(&node, cpu, sb, |stop| churn(&cp, pods, true, stop));
    let without =
        |sb: &[Sandbox]| add_latency(&node, cpu, sb, |stop| churn(&cp, pods, false, stop));
    let with_1 = with(first);
    delete_policies(&cp, &node);
    ticks_when_quiet(pid, rest_per_s);
    let [none_1, none_2] = [without(second), without(first)];
    create_policies(&cp, &node, counts);
    ticks_when_quiet(pid, rest_per_s);
    let with_2 = with(second);
    let phases = [
        ("with", &with_1),
        ("without", &none_1),
        ("without", &none_2),
        ("with", &with_2),
    ];
    let cpu_rows: Vec<String> = phases.iter().map(|(k, p)| p.cpu.row(k, p.writes)).collect();
    let cpu_rows = cpu_rows.join("\n");
    let parts = parts_table([&none_1, &none_2], [&with_1, &with_2]);
    let (add_with, add_none) = (
        pooled(&[&with_1, &with_2], "wall"),
        pooled(&[&none_1, &none_2], "wall"),
    );
    let [with_1, none_1, none_2, with_2] =
        [&with_1, &none_1, &none_2, &with_2].map(|p| pooled(&[p], "wall"));

    let mib = |kib: u64| kib as f64 / 1024.0;
    let p99 = |v: &[f64]| percentile(v, 0.99);
    let report = format!(
        "\n{pods} Pod objects (2 on the measured node), {n_policies} NetworkPolicies (+1 probe) in \
         {NAMESPACES} namespaces, {n_cluster} ClusterNetworkPolicies; load average at start {load_start}, \
         at end {}; {:.0} s in all. Pods created with their status in {pods_took:.0} s; the policies \
         written by the agent {:.1} s after their create began ({:.1} s of agent CPU).\n\n\
         | change → in the kernel (from the request's return) | n | p50 ms | p99 ms | max ms |\n\
         |---|---|---|---|---|\n\
         | Pod label change: the pod joins a peer set | {} | {} |\n\
         | Pod label change: the pod leaves it | {} | {} |\n\
         | new NetworkPolicy: its rule in the server's chains | {} | {} |\n\n\
         | agent | |\n|---|---|\n\
         | CPU per Pod event ({events} label changes, kubectl label per namespace, {burst_s:.0} s, less the rest rate) | {cpu_ms_per_event:.2} ms |\n\
         | CPU at rest with everything | {:.2} % of a core |\n\
         | RSS: pods, no policies / policies at rest (peak) / at the end (peak) | {:.1} / {:.1} ({:.1}) / {:.1} ({:.1}) MiB |\n\n\
         | CNI ADD ({adds} each, real plugin, ADD then DEL; phases with, without, without, with) | p50 ms | p99 ms | max ms |\n\
         |---|---|---|---|\n\
         | no policies, Pod labels churning (10/s) | {} |\n\
         | every policy, labels and policies churning (10/s, 2/s) | {} |\n\n\
         ADD p99 with policies / without: {:.2} (each phase's p99, in order: {:.0}, {:.0}, {:.0}, {:.0} ms)\n\n\
         {parts}\n\n\
         | ADD phase: CPU seconds per second | s | agent | its nft runs | kube-apiserver | etcd | policy writes per s | ms per write |\n\
         |---|---|---|---|---|---|---|---|\n\
         {cpu_rows}\n",
        load(),
        started.elapsed().as_secs_f64(),
        written_after.as_secs_f64(),
        cpu_seconds(ticks_p0, ticks_p1),
        join.len(),
        p50_p99(&join),
        leave.len(),
        p50_p99(&leave),
        new.len(),
        p50_p99(&new),
        rest_per_s,
        mib(rss_pods),
        mib(rss_rest),
        mib(hwm_rest),
        mib(rss_end),
        mib(hwm_end),
        p50_p99(&add_none),
        p50_p99(&add_with),
        p99(&add_with) / p99(&add_none),
        p99(&with_1),
        p99(&none_1),
        p99(&none_2),
        p99(&with_2),
    );
    append_to_bench_out(&report);
}
