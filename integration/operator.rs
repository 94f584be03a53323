//! `podnet operator` on a real kube-apiserver and etcd (integration/k8s.rs), run as
//! the real binary in the control plane's namespace with the least-privilege
//! ServiceAccount of deploy/operator.yaml: it carves node CIDRs for real node
//! daemons (cluster-pool on the Kubernetes backend), reports exhaustion in the
//! node's operator-status and recovers when a node goes, and two replicas elect one
//! leader on a Lease, the follower taking over when the leader is SIGKILLed in the
//! middle of a burst of new CiliumNodes, with no CIDR given twice; `podnet operator
//! status` shows the leader, every node's CIDRs and error, and the pool's free space.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::harness::*;
use crate::k8s::ControlPlane;
use crate::k8s_backend::{api_requests, api_writes, create_node, jsonpath, k8s_node};

const LEASE: &str = "podnet-operator-resource-lock";

/// One `podnet operator` process in the control plane's namespace; SIGKILLed by
/// PID on drop (drop it before its control plane).
pub struct Operator {
    pub identity: String,
    netns: String,
    metrics_port: u16,
    log: PathBuf,
    child: Option<Child>,
}

impl Operator {
    pub fn start(
        cp: &ControlPlane,
        identity: &str,
        kubeconfig: &Path,
        metrics_port: u16,
        args: &[&str],
    ) -> Operator {
        let log = cp.dir().join(format!("operator-{identity}.log"));
        let file = std::fs::File::create(&log).expect("operator log");
        let child = Command::new("ip")
            .args(["netns", "exec", cp.netns(), podnet_bin(), "operator"])
            .arg("--k8s-kubeconfig-path")
            .arg(kubeconfig)
            .arg(format!("--identity={identity}"))
            .arg(format!("--prometheus-serve-addr=127.0.0.1:{metrics_port}"))
            .args(args)
            .env("PODNET_LOG", "info")
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("spawning podnet operator");
        Operator {
            identity: identity.to_string(),
            netns: cp.netns().to_string(),
            metrics_port,
            log,
            child: Some(child),
        }
    }

    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM by PID (a graceful stop: the leader releases its Lease), then reap.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGTERM);
            let _ = c.wait();
        }
    }

    /// Whether the process has exited (reaped if so).
    pub fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| c.try_wait().expect("waiting on the operator").is_some())
    }

    /// SIGKILL by PID, then reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGKILL);
            let _ = c.wait();
        }
    }

    /// A metric's value from the operator's own `/metrics` (None if it does not
    /// answer or has no such line).
    pub fn metric(&self, line_prefix: &str) -> Option<f64> {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.netns,
                "curl",
                "-sf",
                "--max-time",
                "2",
            ])
            .arg(format!("http://127.0.0.1:{}/metrics", self.metrics_port))
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find(|l| l.starts_with(line_prefix))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("operator {} log:\n{}", self.identity, self.log());
        }
        self.kill();
    }
}

/// Waits until `f` holds, at most `limit`.
pub fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// name -> the words of `field` (a jsonpath) of every CiliumNode.
pub fn per_node(cp: &ControlPlane, field: &str) -> BTreeMap<String, Vec<String>> {
    let out = cp
        .kubectl(&[
            "get",
            "ciliumnodes",
            "-o",
            &format!(
                r#"jsonpath={{range .items[*]}}{{.metadata.name}}{{" "}}{field}{{"\n"}}{{end}}"#
            ),
        ])
        .expect_ok("get ciliumnodes");
    out.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let name = words.next()?.to_string();
            Some((name, words.map(str::to_string).collect()))
        })
        .collect()
}

/// name -> spec.ipam.podCIDRs of every CiliumNode.
fn pod_cidrs(cp: &ControlPlane) -> BTreeMap<String, Vec<String>> {
    per_node(cp, "{.spec.ipam.podCIDRs[*]}")
}

pub fn operator_error(cp: &ControlPlane, node: &str) -> String {
    jsonpath(
        cp,
        "ciliumnode",
        node,
        "{.status.ipam.operator-status.error}",
    )
}

/// The notes of the Events of `reason` on CiliumNode `node`.
pub fn node_events(cp: &ControlPlane, node: &str, reason: &str) -> String {
    cp.kubectl(&[
        "get",
        "events",
        "-A",
        "--field-selector",
        &format!("reason={reason},involvedObject.name={node}"),
        "-o",
        "jsonpath={.items[*].message}",
    ])
    .expect_ok("events")
}

/// GETs of leases the API server answered (apiserver_request_total).
fn lease_reads(cp: &ControlPlane) -> u64 {
    api_requests(cp, |l| {
        l.contains("resource=\"leases\"") && l.contains("verb=\"GET\"")
    })
}

pub fn lease_holder(cp: &ControlPlane) -> String {
    let out = cp.kubectl(&[
        "get",
        "lease",
        "-n",
        "kube-system",
        LEASE,
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    if out.ok { out.stdout } else { String::new() }
}

/// The CRDs, deploy/operator.yaml, and a kubeconfig of its ServiceAccount.
pub fn install_operator(cp: &ControlPlane) -> PathBuf {
    cp.install_crds();
    install_operator_rbac(cp)
}

/// deploy/operator.yaml (and no CRD), and a kubeconfig of its ServiceAccount.
pub fn install_operator_rbac(cp: &ControlPlane) -> PathBuf {
    cp.kubectl(&[
        "apply",
        "-f",
        &repo_path("deploy/operator.yaml").to_string_lossy(),
    ])
    .expect_ok("apply deploy/operator.yaml");
    cp.token_kubeconfig("kube-system", "podnet-operator")
}

/// The fields each manager owns in a CiliumNode (`fieldsV1`, as text), by
/// manager and subresource.
pub fn managed_fields(cp: &ControlPlane, node: &str) -> BTreeMap<(String, String), String> {
    let json = cp
        .kubectl(&[
            "get",
            "ciliumnode",
            node,
            "-o",
            "json",
            "--show-managed-fields",
        ])
        .expect_ok("managed fields");
    let v: serde_json::Value = serde_json::from_str(&json).expect("json");
    v["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            (
                (
                    m["manager"].as_str().unwrap_or("").to_string(),
                    m["subresource"].as_str().unwrap_or("").to_string(),
                ),
                m["fieldsV1"].to_string(),
            )
        })
        .collect()
}

#[test]
fn operator_carves_node_cidrs_for_real_daemons_and_reuses_a_freed_one() {
    const TEST: &str = "operator_cluster_pool";
    let t0 = Instant::now();
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    let sa = install_operator(&cp);
    // Three nodes, each with its daemon in its own namespace, waiting for CIDRs.
    let mut nodes: BTreeMap<String, Node> = BTreeMap::new();
    for name in ["opn-1", "opn-2", "opn-3"] {
        let ns = cp.add_node_ns(name);
        create_node(&cp, &ns, &[]);
        let mut node = k8s_node(ns, &cp.kubeconfig(), &["--ipam", "cluster-pool"]);
        node.spawn_daemon();
        nodes.insert(name.to_string(), node);
    }
    wait_for("the agents' CiliumNodes", Duration::from_secs(20), || {
        pod_cidrs(&cp).len() == 3
    });

    // 10.90.0.0/23 in /24s: room for two nodes.
    let started = Instant::now();
    let op = Operator::start(
        &cp,
        "op-a",
        &sa,
        9971,
        &[
            "--cluster-pool-ipv4-cidr",
            "10.90.0.0/23",
            "--cluster-pool-ipv4-mask-size",
            "24",
        ],
    );
    let mut waiting = String::new();
    wait_for(
        "two nodes with CIDRs and one waiting with the error",
        Duration::from_secs(15),
        || {
            let all = pod_cidrs(&cp);
            let with: Vec<&String> = all.keys().filter(|n| !all[*n].is_empty()).collect();
            let without: Vec<&String> = all.keys().filter(|n| all[*n].is_empty()).collect();
            if with.len() == 2 && without.len() == 1 {
                waiting = without[0].clone();
                return operator_error(&cp, &waiting) == "allocator full";
            }
            false
        },
    );
    let assigned = started.elapsed();
    eprintln!(
        "{TEST}: operator start to 2 of 3 nodes with CIDRs and the third's error: {assigned:?}"
    );
    let all = pod_cidrs(&cp);
    let given: BTreeSet<String> = all.values().flatten().cloned().collect();
    assert_eq!(
        given,
        BTreeSet::from(["10.90.0.0/24".to_string(), "10.90.1.0/24".to_string()]),
        "{all:?}"
    );

    // The nodes with CIDRs serve; a pod on each gets an address in its CIDR.
    let mut sandboxes = Vec::new();
    for (name, node) in nodes.iter_mut().filter(|(n, _)| **n != waiting) {
        node.wait_ready();
        let sb = node.sandbox();
        let r = node.add(&sb);
        assert!(r.ok, "{name}: {}", r.stdout);
        let prefix = all[name][0].trim_end_matches("0/24");
        assert!(
            r.ipv4().starts_with(prefix),
            "{name}: {} not in {:?}",
            r.ipv4(),
            all[name]
        );
        sandboxes.push(sb);
    }
    let w = &nodes[&waiting];
    assert!(
        w.client().healthz().is_err(),
        "{waiting} serves without CIDRs"
    );
    assert!(
        w.log()
            .contains("waiting for the operator to write this node's CIDRs")
    );

    // Each writer owns only its fields.
    let holder = all.keys().find(|n| **n != waiting).expect("a node").clone();
    let fields = managed_fields(&cp, &holder);
    let op_spec = &fields[&("podnet-operator".to_string(), String::new())];
    assert!(op_spec.contains("podCIDRs"), "{fields:?}");
    assert!(!op_spec.contains("addresses") && !op_spec.contains("ownerReferences"));
    let agent = &fields[&("podnet-agent".to_string(), String::new())];
    assert!(agent.contains("addresses") && agent.contains("ownerReferences"));
    assert!(!agent.contains("podCIDRs"), "{fields:?}");
    let waiting_fields = managed_fields(&cp, &waiting);
    assert!(
        waiting_fields[&("podnet-operator".to_string(), "status".to_string())]
            .contains("operator-status"),
        "{waiting_fields:?}"
    );

    // The ServiceAccount may do what the operator does and no more.
    let probe = &nodes[&waiting].ns;
    for args in [
        vec!["delete", "ciliumnode", holder.as_str()],
        vec!["get", "secrets", "-n", "kube-system"],
        vec![
            "get",
            "lease",
            "-n",
            "kube-system",
            "kube-controller-manager",
        ],
        vec!["label", "node", holder.as_str(), "podnet.test/x=1"],
    ] {
        let out = cp.kubectl_as(probe, &sa, &args, None);
        assert!(out.forbidden(), "{args:?} as the operator: {out:?}");
    }

    // A node goes (its daemon stopped, its CiliumNode deleted): its CIDR is free
    // again, the waiting node gets it, the error is cleared, and its daemon serves.
    let freed = all[&holder][0].clone();
    let mut gone = nodes.remove(&holder).expect("node");
    gone.stop_daemon(false);
    let uid = jsonpath(&cp, "ciliumnode", &holder, "{.metadata.uid}");
    let t = Instant::now();
    cp.kubectl(&["delete", "ciliumnode", &holder])
        .expect_ok("delete the CiliumNode");
    wait_for(
        "the waiting node to get the freed CIDR",
        Duration::from_secs(10),
        || pod_cidrs(&cp).get(&waiting) == Some(&vec![freed.clone()]),
    );
    let reuse = t.elapsed();
    wait_for("the error to be cleared", Duration::from_secs(5), || {
        operator_error(&cp, &waiting).is_empty()
    });
    eprintln!("{TEST}: CiliumNode deleted to its CIDR given to the waiting node: {reuse:?}");
    // What keeps a late write from re-creating a deleted node: an apply that
    // carries the UID (as the operator's do) is refused, not turned into a create.
    let late = cp.kubectl_stdin(
        &[
            "apply",
            "--server-side",
            "--field-manager",
            "podnet-operator",
            "-f",
            "-",
        ],
        &format!(
            "apiVersion: cilium.io/v2\nkind: CiliumNode\nmetadata:\n  name: {holder}\n  uid: {uid}\n\
             spec:\n  ipam:\n    podCIDRs: [{freed}]\n"
        ),
    );
    assert!(!late.ok && late.stderr.contains("uid mismatch"), "{late:?}");
    assert!(
        !pod_cidrs(&cp).contains_key(&holder),
        "the deleted node came back"
    );
    let w = nodes.get_mut(&waiting).expect("waiting node");
    w.wait_ready();
    let sb = w.sandbox();
    let r = w.add(&sb);
    assert!(r.ok, "{}", r.stdout);
    assert!(
        r.ipv4().starts_with(freed.trim_end_matches("0/24")),
        "{} not in {freed}",
        r.ipv4()
    );

    // Writes: one podCIDRs apply per node; the waiting node's error and its clearing.
    wait_for("the operator's counters", Duration::from_secs(5), || {
        op.metric("podnet_operator_ciliumnode_writes_total{kind=\"status\"}") == Some(2.0)
    });
    let applies = op.metric("podnet_operator_ciliumnode_writes_total{kind=\"pod-cidrs\"}");
    eprintln!("{TEST}: operator writes: {applies:?} podCIDRs applies for 3 nodes, 2 status writes");
    assert_eq!(applies, Some(3.0));
    assert_eq!(op.metric("podnet_operator_is_leader"), Some(1.0));
    assert!(op.log().contains("re-adopted their CIDRs"));
    drop(op);
    drop(gone);
    eprintln!("{TEST}: whole test {:?}", t0.elapsed());
}

/// Creates `manifests` with kubectl from another thread and SIGKILLs `leader` once
/// `served()` counts 5 nodes served, while the rest are still being created;
/// returns when it was killed and how many nodes were served then.
pub fn kill_mid_burst(
    cp: &ControlPlane,
    manifests: &[String],
    leader: &mut Operator,
    served: impl Fn() -> usize,
) -> (Instant, usize) {
    std::thread::scope(|s| {
        let creator = s.spawn(|| {
            for m in manifests {
                cp.kubectl_stdin(&["create", "-f", "-"], m)
                    .expect_ok("create CiliumNodes");
            }
        });
        wait_for(
            "the leader to start allocating",
            Duration::from_secs(20),
            || served() >= 5,
        );
        leader.kill();
        let killed = (Instant::now(), served());
        creator.join().expect("creator thread");
        killed
    })
}

#[test]
fn a_follower_takes_over_when_the_leader_is_killed_mid_burst() {
    const TEST: &str = "operator_failover";
    let t0 = Instant::now();
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    let sa = install_operator(&cp);
    let pool = ["--cluster-pool-ipv4-cidr", "10.200.0.0/16"];
    let mut ops = vec![
        Operator::start(&cp, "op-a", &sa, 9971, &pool),
        Operator::start(&cp, "op-b", &sa, 9972, &pool),
    ];
    wait_for("a leader", Duration::from_secs(10), || {
        ["op-a", "op-b"].contains(&lease_holder(&cp).as_str())
    });
    let leader_id = lease_holder(&cp);
    let leader = ops
        .iter()
        .position(|o| o.identity == leader_id)
        .expect("leader");
    let follower = 1 - leader;
    wait_for("both replicas' metrics", Duration::from_secs(5), || {
        ops.iter()
            .all(|o| o.metric("podnet_operator_is_leader").is_some())
    });
    assert_eq!(ops[leader].metric("podnet_operator_is_leader"), Some(1.0));
    assert_eq!(ops[follower].metric("podnet_operator_is_leader"), Some(0.0));
    wait_for(
        "the follower to see the leader",
        Duration::from_secs(5),
        || {
            ops[follower]
                .log()
                .contains("another replica leads; waiting for its lease to expire")
        },
    );

    // The follower watches the Lease instead of reading it every retry period:
    // over 10 s of rest no reads of leases (client-go's follower makes 5; the API
    // server's own identity lease may add one or two).
    let reads_before = lease_reads(&cp);
    std::thread::sleep(Duration::from_secs(10));
    let reads = lease_reads(&cp) - reads_before;
    eprintln!("{TEST}: reads of leases over 10 s with a leader and a follower: {reads}");
    assert!(
        reads <= 2,
        "{reads} reads of leases in 10 s: the follower polls"
    );
    assert!(
        !ops[follower].log().contains("cannot watch the Lease"),
        "the deployed Role refused the follower's watch: {}",
        ops[follower].log()
    );

    // 50 CiliumNodes, created with kubectl in batches of 5 while the leader works.
    let writes_before = api_writes(&cp);
    // The issue's burst: 200 new CiliumNodes, 20 per kubectl create.
    const NODES: usize = 200;
    const PER_CREATE: usize = 20;
    let manifests: Vec<String> = (0..NODES / PER_CREATE)
        .map(|batch| {
            (0..PER_CREATE)
                .map(|i| {
                    format!(
                        "apiVersion: cilium.io/v2\nkind: CiliumNode\nmetadata:\n  name: burst-{:03}\nspec: {{}}\n",
                        batch * PER_CREATE + i
                    )
                })
                .collect::<Vec<_>>()
                .join("---\n")
        })
        .collect();
    let (killed_at, done) = kill_mid_burst(&cp, &manifests, &mut ops[leader], || {
        pod_cidrs(&cp).values().filter(|c| !c.is_empty()).count()
    });
    eprintln!("{TEST}: leader {leader_id} SIGKILLed with {done} of {NODES} nodes allocated");

    let new_leader = ops[follower].identity.clone();
    wait_for(
        "the follower to take the lease",
        Duration::from_secs(25),
        || lease_holder(&cp) == new_leader,
    );
    let takeover = killed_at.elapsed();
    wait_for(
        "every CiliumNode to have a CIDR",
        Duration::from_secs(10),
        || {
            let all = pod_cidrs(&cp);
            all.len() == NODES && all.values().all(|c| c.len() == 1)
        },
    );
    let complete = killed_at.elapsed();
    eprintln!(
        "{TEST}: failover (SIGKILL to the follower holding the lease) {takeover:?}; all {NODES} nodes allocated {complete:?} after the kill"
    );
    // Lease 15 s + up to two retry periods (2 s, jittered) of observation and
    // acquisition on the follower's clock.
    assert!(
        takeover < Duration::from_secs(21),
        "takeover took {takeover:?}"
    );
    assert_eq!(ops[follower].metric("podnet_operator_is_leader"), Some(1.0));

    // No CIDR was given twice, and all come from the pool.
    let all = pod_cidrs(&cp);
    let mut seen = BTreeSet::new();
    for (name, cidrs) in &all {
        assert!(
            cidrs[0].starts_with("10.200.") && cidrs[0].ends_with(".0/24"),
            "{name}: {cidrs:?}"
        );
        assert!(seen.insert(cidrs[0].clone()), "{} given twice", cidrs[0]);
    }
    // Writes to CiliumNodes: the 200 creates and one podCIDRs apply per node, by
    // whichever leader made it.
    let writes = api_writes(&cp) - writes_before;
    eprintln!(
        "{TEST}: API writes to CiliumNodes: {writes} ({NODES} creates + {} operator writes for {NODES} nodes)",
        writes - NODES as u64
    );
    let failed_writes: Vec<String> = ops
        .iter()
        .flat_map(|op| op.log().lines().map(str::to_string).collect::<Vec<_>>())
        .filter(|l| l.contains("failed"))
        .collect();
    // One apply per node. The one the SIGKILL cut off mid-request may have been
    // committed and still be counted with another code (the client never read
    // its answer); the follower then re-adopts that node's CIDR without writing,
    // so one fewer 2xx write is the same outcome, never one more.
    let operator_writes = writes - NODES as u64;
    assert!(
        operator_writes == NODES as u64 || operator_writes + 1 == NODES as u64,
        "{operator_writes} operator writes for {NODES} nodes; operator log lines about failures: {failed_writes:#?}"
    );
    assert!(ops[follower].log().contains("re-adopted their CIDRs"));
    let events = cp
        .kubectl(&[
            "get",
            "events",
            "-n",
            "kube-system",
            "--field-selector",
            "reason=LeaderElection",
            "-o",
            "jsonpath={.items[*].message}",
        ])
        .expect_ok("get events");
    for id in ["op-a", "op-b"] {
        assert!(events.contains(&format!("{id} became leader")), "{events}");
    }
    let pids: Vec<i32> = ops.iter().filter_map(Operator::pid).collect();
    drop(ops);
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "operator {pid} still runs"
        );
    }
    eprintln!("{TEST}: whole test {:?}", t0.elapsed());
}

#[test]
fn the_operator_deployment_matches_what_the_binary_accepts() {
    let text =
        std::fs::read_to_string(repo_path("deploy/operator.yaml")).expect("deploy/operator.yaml");
    let docs: Vec<serde_json::Value> = text
        .split("\n---")
        .map(|d| serde_yaml_ng::from_str::<serde_json::Value>(d).expect("yaml document"))
        .collect();
    let kind = |k: &str| {
        docs.iter()
            .find(|d| d["kind"] == k)
            .unwrap_or_else(|| panic!("{k} missing"))
    };
    let deployment = kind("Deployment");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(
        pod["serviceAccountName"],
        kind("ServiceAccount")["metadata"]["name"]
    );
    let container = &pod["containers"][0];
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect()
    };
    assert_eq!(strings(&container["command"])[1], "operator");
    // The flags and the agent's ConfigMap (its config dir) parse and resolve as
    // operator options.
    let mut args = strings(&container["args"]);
    let config_dir = args
        .iter()
        .find_map(|a| a.strip_prefix("--config-dir=").map(str::to_string))
        .expect("--config-dir");
    assert!(
        container["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m["mountPath"] == config_dir.as_str())
    );
    args.retain(|a| !a.starts_with("--config-dir"));
    let agent = std::fs::read_to_string(repo_path("deploy/podnet.yaml")).expect("podnet.yaml");
    let config_map = agent
        .split("\n---")
        .map(|d| serde_yaml_ng::from_str::<serde_json::Value>(d).expect("yaml"))
        .find(|d| d["kind"] == "ConfigMap")
        .expect("ConfigMap");
    let mut all: Vec<String> = config_map["data"]
        .as_object()
        .expect("data")
        .iter()
        .filter(|(k, _)| {
            // The agent's judgment of its CIDRs is the agent's.
            let agent_only = [
                "cluster-pool-depletion-threshold",
                "cluster-pool-cidr-release-delay",
            ];
            (k.starts_with("cluster-pool-") && !agent_only.contains(&k.as_str()))
                || ["enable-ipv4", "enable-ipv6", "ipam"].contains(&k.as_str())
        })
        .map(|(k, v)| format!("--{k}={}", v.as_str().unwrap_or("")))
        .collect();
    all.extend(args);
    all.push("--k8s-kubeconfig-path=/dev/null".into());
    let opts = podnet::operator::options::OperatorOptions::parse_with_config_dir(&all)
        .unwrap_or_else(|e| panic!("{e}"));
    let config =
        podnet::operator::options::OperatorConfig::resolve(&opts).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.identity, "$(POD_NAME)", "Kubernetes expands it");
    // Least privilege: the Lease by name, CiliumNodes without create or delete,
    // CiliumPodIPPools created (auto-created pools) and patched (a sticky
    // pool's record) but never replaced or deleted, Pods listed only,
    // StatefulSets listed and watched only.
    let role = kind("Role");
    let rules = role["rules"].as_array().expect("rules");
    assert!(rules.iter().any(|r| r["resourceNames"][0] == LEASE));
    let cluster_role = kind("ClusterRole");
    for rule in cluster_role["rules"].as_array().expect("rules") {
        let verbs = strings(&rule["verbs"]);
        let forbidden: &[&str] = if rule["resources"][0] == "ciliumpodippools" {
            // Pools: created when missing, a sticky pool's record patched.
            &["update", "delete", "*"]
        } else if rule["apiGroups"][0] == "apiextensions.k8s.io" {
            // It may create a missing CRD or pool, never change or delete one.
            &["update", "patch", "delete", "*"]
        } else if rule["apiGroups"][0] == "events.k8s.io" {
            // The duplicate check's Events, in the namespaces of the Pods they
            // are on: created, and patched as a series; never deleted.
            &["update", "delete", "*"]
        } else {
            &["create", "delete", "*"]
        };
        assert!(
            !verbs.iter().any(|v| forbidden.contains(&v.as_str())),
            "{rule}"
        );
        if rule["resources"][0] == "pods" {
            assert_eq!(verbs, ["list"], "{rule}");
        }
        if rule["resources"][0] == "statefulsets" {
            // Sticky records live by their StatefulSet's policy: read only.
            assert_eq!(verbs, ["list", "watch"], "{rule}");
        }
    }
}

#[test]
fn the_operator_registers_missing_crds_unless_told_to_skip() {
    let Some(cp) = ControlPlane::start("operator_crds") else {
        return;
    };
    let crd_exists = |cp: &ControlPlane| cp.kubectl(&["get", "crd", "ciliumnodes.cilium.io"]).ok;
    let args = ["--cluster-pool-ipv4-cidr", "10.91.0.0/16"];
    let mut skipping = Operator::start(
        &cp,
        "skipper",
        &cp.kubeconfig(),
        19601,
        &[&args[..], &["--skip-crd-creation"]].concat(),
    );
    wait_for(
        "the skipping operator to wait for the lease",
        Duration::from_secs(10),
        || skipping.log().contains("waiting to lead"),
    );
    assert!(!crd_exists(&cp), "--skip-crd-creation registered a CRD");
    skipping.kill();
    let registering = Operator::start(&cp, "registrar", &cp.kubeconfig(), 19602, &args);
    wait_for("the CRDs", Duration::from_secs(10), || crd_exists(&cp));
    for crd in [
        "ciliumpodippools.cilium.io",
        "ciliumnodeconfigs.cilium.io",
        "ciliumloadbalancerippools.cilium.io",
        "ciliuml2announcementpolicies.cilium.io",
    ] {
        assert!(cp.kubectl(&["get", "crd", crd]).ok, "{crd} not registered");
    }
    assert!(registering.log().contains("registered the CRD"));
    drop(registering);
    // A second start finds them and leaves them as they are.
    let again = Operator::start(&cp, "again", &cp.kubeconfig(), 19603, &args);
    wait_for("the second operator", Duration::from_secs(10), || {
        again.log().contains("waiting to lead") || again.log().contains("leading")
    });
    assert!(!again.log().contains("registered the CRD"));
}

/// Found by the soak (issue 40): a replica that started while the API server was
/// down exited, and the kubelet's growing back-off kept it down for minutes after
/// the API server came back. It waits now, and goes on once the API server answers.
#[test]
fn an_operator_started_while_the_api_server_is_down_waits_for_it() {
    let Some(mut cp) = ControlPlane::start("operator_waits_for_api") else {
        return;
    };
    cp.stop_apiserver(false);
    let args = ["--cluster-pool-ipv4-cidr", "10.92.0.0/16"];
    let mut op = Operator::start(&cp, "patient", &cp.kubeconfig(), 19604, &args);
    wait_for(
        "the operator to say it waits for the API server",
        Duration::from_secs(20),
        || op.log().contains("cannot be reached yet; trying again"),
    );
    std::thread::sleep(Duration::from_secs(3));
    assert!(!op.exited(), "the operator exited:\n{}", op.log());
    cp.start_apiserver();
    wait_for(
        "the CRDs after the API server came back",
        Duration::from_secs(30),
        || cp.kubectl(&["get", "crd", "ciliumnodes.cilium.io"]).ok,
    );
    wait_for("the operator to lead", Duration::from_secs(30), || {
        op.log().contains("waiting to lead") && lease_holder(&cp) == "patient"
    });
    assert!(!op.exited(), "the operator exited:\n{}", op.log());
}

/// `podnet operator status` in the control plane's namespace, as the operator's
/// ServiceAccount: (exit code, stdout, stderr).
pub fn operator_status(
    cp: &ControlPlane,
    kubeconfig: &Path,
    args: &[&str],
) -> (i32, String, String) {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            cp.netns(),
            podnet_bin(),
            "operator",
            "status",
        ])
        .arg("--k8s-kubeconfig-path")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("running podnet operator status");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn operator_status_shows_the_leader_the_nodes_and_the_pool_space() {
    const TEST: &str = "operator_status";
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    let sa = install_operator(&cp);
    let node = |name: &str, router: &str| {
        format!(
            "apiVersion: cilium.io/v2\nkind: CiliumNode\nmetadata:\n  name: {name}\n\
             spec:\n  addresses:\n  - {{type: CiliumInternalIP, ip: {router}}}\n"
        )
    };
    for (name, router) in [("st-1", "192.0.2.1"), ("st-2", "192.0.2.2")] {
        cp.kubectl_stdin(&["create", "-f", "-"], &node(name, router))
            .expect_ok("create a CiliumNode");
    }
    let pool = [
        "--cluster-pool-ipv4-cidr",
        "10.92.0.0/23",
        "--cluster-pool-ipv4-mask-size",
        "24",
    ];
    let op = Operator::start(&cp, "op-s", &sa, 9973, &pool);
    wait_for("both nodes' CIDRs", Duration::from_secs(15), || {
        pod_cidrs(&cp).values().filter(|c| c.len() == 1).count() == 2
    });
    cp.kubectl_stdin(&["create", "-f", "-"], &node("st-3", "192.0.2.3"))
        .expect_ok("create the third CiliumNode");
    wait_for("the third node's error", Duration::from_secs(10), || {
        operator_error(&cp, "st-3") == "allocator full"
    });
    let cidrs = pod_cidrs(&cp);

    let (code, out, err) = operator_status(&cp, &sa, &pool);
    eprintln!("{TEST}: podnet operator status:\n{out}");
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with(
            "Leader:     op-s (Lease kube-system/podnet-operator-resource-lock, renewed "
        ) && !lines[0].contains("EXPIRED"),
        "{out}"
    );
    assert_eq!(lines[1], "Nodes:      3");
    for (i, name) in ["st-1", "st-2"].iter().enumerate() {
        assert_eq!(
            lines[2 + i],
            format!(
                "  {name}: podCIDRs {}; router 192.0.2.{}",
                cidrs[*name][0],
                i + 1
            )
        );
    }
    assert_eq!(
        lines[4],
        "  st-3: podCIDRs none; router 192.0.2.3; error: allocator full"
    );
    assert_eq!(
        lines[5],
        "Pool IPv4:  10.92.0.0/23 in /24s: 2 total, 2 in use, 0 free"
    );
    assert!(lines[6].starts_with("Findings:   none"), "{out}");
    assert_eq!(lines.len(), 7, "{out}");

    let (code, out, err) = operator_status(&cp, &sa, &[&pool[..], &["-o", "json"]].concat());
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["leader"]["holder"], "op-s");
    assert_eq!(v["leader"]["expired"], false);
    let nodes = v["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 3);
    for n in nodes {
        let name = n["name"].as_str().expect("name");
        let want: Vec<serde_json::Value> = cidrs[name].iter().map(|c| c.as_str().into()).collect();
        assert_eq!(n["podCIDRs"], serde_json::Value::Array(want), "{n}");
        assert_eq!(n["router"][0], format!("192.0.2.{}", &name[3..]));
    }
    assert_eq!(nodes[2]["error"], "allocator full");
    assert_eq!(nodes[0]["error"], "");
    assert_eq!(
        v["pool"],
        serde_json::json!([{"family": "IPv4", "cidrs": ["10.92.0.0/23"], "maskSize": 24,
                            "total": 2, "inUse": 2, "free": 0}])
    );
    drop(op);
}
