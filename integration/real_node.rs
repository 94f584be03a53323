//! podnet on a real Kubernetes node: `scripts/node` runs etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler, a container runtime and the kubelet in
//! a network namespace of its own; `kubectl apply -f deploy/` installs podnet from
//! the image `make image` built (its DaemonSet and operator Deployment); busybox
//! pods are started by the kubelet through the runtime's CRI, which calls the
//! installed podnet plugin. Every scenario runs once on each runtime
//! (`real_node::<runtime>::<scenario>`): containerd 1.6, containerd 2 and CRI-O,
//! whose CNI callers differ (docs/runtimes.md). The kubelet and the runtime use
//! fixed host paths, so one such node runs per machine: `scripts/node start`
//! refuses while another runs, and the node is stopped (by PID, everything
//! unmounted) when the test ends, also on failure.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::*;
use crate::scripted::*;

/// The node's network namespace and the conflist the agent writes (scripts/node,
/// deploy/podnet.yaml).
const NODE_NETNS: &str = "pnnode";
const CNI_CONF: &str = "/etc/cni/net.d/05-podnet.conflist";
const LEASE: &str = "podnet-operator-resource-lock";
const REPLICAS: usize = 20;

/// A node `scripts/node start` brought up; `scripts/node stop` on drop. One at a
/// time per process (`_one_node`); `scripts/node start` refuses a second across
/// processes.
struct RealNode {
    dir: PathBuf,
    /// scripts/node's PODNET_NODE_RUNTIME.
    runtime: &'static str,
    _one_node: MutexGuard<'static, ()>,
}

static ONE_NODE: Mutex<()> = Mutex::new(());

impl RealNode {
    /// Starts the node with `runtime`, or reports a skip (a failure unless skips
    /// are allowed: harness::skip) when a part is missing.
    fn start(test: &str, runtime: &'static str) -> Option<RealNode> {
        // The runtimes `scripts/k8s-binaries runtimes` builds, and the CNI
        // plugins their nodes have.
        let parts: &[&str] = match runtime {
            "containerd2" => &["containerd2/containerd", "cni-plugins/loopback"],
            "crio" => &["crio/crio", "cni-plugins/loopback"],
            _ => &[],
        };
        let test = format!("{test} on {runtime}");
        if !node_parts_or_skip(&test, parts) {
            return None;
        }
        let one_node = ONE_NODE
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let dir = std::env::temp_dir().join(unique("podnet-node-"));
        let node = RealNode {
            dir,
            runtime,
            _one_node: one_node,
        };
        node.script_ok(&["start"]);
        Some(node)
    }

    /// Waits until the agent's pod and the node are Ready; returns the agent pod.
    fn podnet_up(&self) -> Value {
        let agent = self.wait_for(
            "the podnet DaemonSet's pod Ready",
            || {
                let pods = self.pods("kube-system", "app.kubernetes.io/name=podnet");
                pods.into_iter().find(ready)
            },
            || self.describe("kube-system"),
        );
        self.kubectl(&[
            "wait",
            "--for=condition=Ready",
            "node/podnet-node",
            "--timeout=120s",
        ]);
        agent
    }

    /// `ip` in the node's network namespace.
    fn ip(&self, args: &[&str]) -> String {
        let out = Command::new("ip")
            .args(["-n", NODE_NETNS])
            .args(args)
            .output()
            .expect("running ip");
        assert!(out.status.success(), "ip {args:?}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// `nft list table <family> podnet` in the node's network namespace (the host's
    /// nft), or `None` while the table is missing.
    fn nft_table(&self, family: &str) -> Option<String> {
        let out = self.script(&["exec", "nft", "list", "table", family, "podnet"]);
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).to_string())
    }

    /// The pods of `namespace` with a FailedCreatePodSandBox event whose message
    /// has `needle` (the plugin's error, as the kubelet reports it).
    fn sandbox_failures(&self, namespace: &str, needle: &str) -> BTreeSet<String> {
        let events = self.kubectl_json(&[
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            "reason=FailedCreatePodSandBox",
        ]);
        events["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["message"].as_str().is_some_and(|m| m.contains(needle)))
            .filter_map(|e| e["involvedObject"]["name"].as_str())
            .map(String::from)
            .collect()
    }
}

impl Scripted for RealNode {
    const WAIT: Duration = Duration::from_secs(180);
    const MARKER: &'static str = "/run/podnet-node.dir";

    fn command(&self) -> Command {
        let mut cmd = Command::new("bash");
        cmd.arg(repo().join("scripts/node"))
            .env("PODNET_NODE_DIR", &self.dir)
            .env("PODNET_NODE_RUNTIME", self.runtime)
            .env("PODNET_NODE_IMAGES", images_dir());
        cmd
    }

    fn dir(&self) -> &Path {
        &self.dir
    }

    fn log_tail(&self) -> String {
        format!(
            "kubelet.log (last lines, newest first):\n{}",
            log_end(&self.dir.join("logs/kubelet.log"), 15)
        )
    }
}

/// What `/proc/<pid>/status` says of a process of the node's containers.
#[derive(Debug)]
struct ProcessPrivileges {
    pid: u32,
    uid: u32,
    cap_eff: u64,
    no_new_privs: bool,
    /// 2: a seccomp filter (RuntimeDefault) is in force.
    seccomp: u32,
}

/// The processes in the node's cgroup (`/podnet-node`, scripts/node) whose command
/// line starts with `argv`, with their privileges.
fn node_processes(argv: &[&str]) -> Vec<ProcessPrivileges> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let field = |status: &str, name: &str| -> Option<String> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let matches = argv.len() <= args.len()
                && argv
                    .iter()
                    .zip(&args)
                    .all(|(want, got)| want.as_bytes() == *got);
            let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
            if !matches || !cgroup.contains("/podnet-node") {
                return None;
            }
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            Some(ProcessPrivileges {
                pid,
                uid: field(&status, "Uid:")?
                    .split_whitespace()
                    .nth(1)?
                    .parse()
                    .ok()?,
                cap_eff: u64::from_str_radix(&field(&status, "CapEff:")?, 16).ok()?,
                no_new_privs: field(&status, "NoNewPrivs:")? == "1",
                seccomp: field(&status, "Seccomp:")?.parse().ok()?,
            })
        })
        .collect()
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.tear_down();
    }
}

/// A pod and its addresses, IPv4 then IPv6.
type PodAddresses = (String, String, String);

/// Each pod's two addresses (`status.podIPs`, IPv4 then IPv6) are the ones
/// `podnet status --all-addresses` gives to that pod.
fn pods_have_their_podnet_addresses(node: &RealNode, pods: &[Value]) -> Vec<PodAddresses> {
    let allocated = node.allocated("ds/podnet");
    let mut pod_ips = Vec::new();
    for pod in pods {
        let name = pod["metadata"]["name"].as_str().expect("pod name");
        let ips: Vec<&str> = pod["status"]["podIPs"]
            .as_array()
            .map(|a| a.iter().filter_map(|i| i["ip"].as_str()).collect())
            .unwrap_or_default();
        assert!(
            ips.len() == 2 && ips[0].contains('.') && ips[1].contains(':'),
            "pod {name}: podIPs {ips:?}, wanted an IPv4 and an IPv6 address"
        );
        for ip in &ips {
            assert_eq!(
                allocated.get(*ip).map(String::as_str),
                Some(format!("default/{name}").as_str()),
                "pod {name} has {ip} but podnet's allocations are {allocated:?}"
            );
        }
        pod_ips.push((name.to_string(), ips[0].to_string(), ips[1].to_string()));
    }
    pod_ips
}

/// deploy/'s three manifests as one, with each (from, to) replaced (`from` must
/// be there).
fn deploy_manifest(replacements: &[(&str, &str)]) -> String {
    let mut manifest = String::new();
    for file in ["podnet.yaml", "agent-rbac.yaml", "operator.yaml"] {
        let path = repo().join("deploy").join(file);
        let text = std::fs::read_to_string(&path).expect("reading deploy/");
        manifest.push_str(&text);
        manifest.push_str("\n---\n");
    }
    for (from, to) in replacements {
        assert!(manifest.contains(from), "deploy/ has no {from}");
        manifest = manifest.replace(from, to);
    }
    manifest
}

fn deployment(replicas: usize) -> String {
    format!(
        r#"{{"apiVersion": "apps/v1", "kind": "Deployment",
  "metadata": {{"name": "busybox", "namespace": "default"}},
  "spec": {{"replicas": {replicas},
    "selector": {{"matchLabels": {{"app": "busybox"}}}},
    "template": {{"metadata": {{"labels": {{"app": "busybox"}}}},
      "spec": {{"terminationGracePeriodSeconds": 1,
        "containers": [{{"name": "busybox", "image": "localhost/busybox:1.35",
          "imagePullPolicy": "Never",
          "command": ["/bin/busybox", "sleep", "86400"]}}]}}}}}}}}"#
    )
}

/// `deploy/` (dual stack) brings podnet up on a fresh node (DaemonSet pod
/// Ready, node Ready, CRDs registered by the operator, one operator replica holds
/// the Lease, the agent's nftables tables masquerade the node's pod CIDRs); 20
/// busybox pods of a Deployment run with the IPv4 and IPv6 addresses podnet allocated to them and reach each other; they keep them across a restart of the
/// agent's pod, after which one more pod starts; deleting the Deployment frees
/// every address and leaves no link or route behind; `kubectl delete -f deploy/`
/// takes the CNI config off the node.
fn deploy_runs_pods_through_podnet(runtime: &'static str) {
    let test = "deploy_runs_pods_through_podnet";
    let Some(node) = RealNode::start(test, runtime) else {
        return;
    };
    let deploy = repo().join("deploy");
    let deploy = deploy.to_str().expect("repo path is UTF-8");
    // deploy/ as it is, but dual stack.
    node.apply(&deploy_manifest(&[(
        r#"enable-ipv6: "false""#,
        "enable-ipv6: \"true\"\n  cluster-pool-ipv6-cidr: \"fd00:10:244::/104\"\n  \
         cluster-pool-ipv6-mask-size: \"120\"",
    )]));
    let agent = node.podnet_up();
    assert!(
        Path::new(CNI_CONF).exists(),
        "the agent is Ready but {CNI_CONF} is missing"
    );
    // Least privilege (docs/least-privilege.md): the agent runs as root with
    // CAP_NET_ADMIN and CAP_NET_RAW (L2 announcements' packet sockets) alone, the operator as an unprivileged user with none, both
    // under the runtime's seccomp profile and no_new_privs. The agent's CiliumNode
    // writes pass the admission policy with the token the kubelet mounted.
    let agents = node_processes(&["/usr/local/bin/podnet", "daemon"]);
    assert_eq!(agents.len(), 1, "the agent's processes: {agents:?}");
    let a = &agents[0];
    assert!(
        a.uid == 0 && a.cap_eff == (1 << 12 | 1 << 13) && a.no_new_privs && a.seccomp == 2,
        "the agent (PID {}) should run as root with CAP_NET_ADMIN and CAP_NET_RAW (CapEff 0x3000) alone, no_new_privs, seccomp: {a:?}",
        a.pid
    );
    let operators = node_processes(&["/usr/local/bin/podnet", "operator"]);
    assert!(!operators.is_empty(), "no operator process");
    for o in &operators {
        assert!(
            o.uid == 65532 && o.cap_eff == 0 && o.no_new_privs && o.seccomp == 2,
            "the operator (PID {}) should run as 65532 with no capability, no_new_privs, seccomp: {o:?}",
            o.pid
        );
    }
    node.kubectl(&[
        "get",
        "validatingadmissionpolicybinding",
        "podnet-agent-own-ciliumnode",
    ]);
    assert!(
        Path::new("/opt/cni/bin/podnet").exists(),
        "the init container did not install /opt/cni/bin/podnet"
    );
    for crd in crate::k8s::CRDS {
        node.kubectl(&["get", "crd", crd]);
    }
    let holder = node.wait_for(
        "an operator replica holding the Lease",
        || {
            let out = node.kubectl(&[
                "get",
                "lease",
                "-n",
                "kube-system",
                LEASE,
                "--ignore-not-found",
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ]);
            Some(out).filter(|h| !h.is_empty())
        },
        || node.describe("kube-system"),
    );
    let operators = node.pods("kube-system", "app.kubernetes.io/name=podnet-operator");
    let running: Vec<&str> = operators
        .iter()
        .filter(|p| p["status"]["phase"] == "Running")
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    assert!(
        running.contains(&holder.as_str()),
        "the Lease holder {holder} is not a running operator pod ({running:?})"
    );

    // The agent masquerades with the image's nft: its tables hold the rule for
    // the node's pod CIDRs (IPv4 and IPv6), as the operator gave them.
    let cidrs: Vec<String> =
        node.kubectl_json(&["get", "ciliumnode", "podnet-node"])["spec"]["ipam"]["podCIDRs"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|c| c.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
    assert_eq!(cidrs.len(), 2, "the node's podCIDRs: {cidrs:?}");
    for cidr in &cidrs {
        let family = if cidr.contains(':') { "ip6" } else { "ip" };
        let table = node.wait_for(
            &format!("the agent's nftables table {family} podnet"),
            || node.nft_table(family),
            || node.describe("kube-system"),
        );
        let rule = table.lines().find(|l| l.contains("masquerade"));
        assert!(
            rule.is_some_and(|r| (r.contains(&format!("{family} saddr {cidr} "))
                || r.contains(&format!("{family} saddr {{ {cidr}")))
                && r.contains("podnet: pod traffic leaving the cluster")),
            "table {family} podnet has no masquerade rule for {cidr}:\n{table}"
        );
    }

    let links_before = node.ip(&["-o", "link", "show"]).lines().count();
    let routes_before = node.ip(&["route", "show"]);
    let t0 = Instant::now();
    node.apply(&deployment(REPLICAS));
    let pods = node.wait_for(
        "every busybox pod Ready",
        || {
            let pods = node.pods("default", "app=busybox");
            (pods.len() == REPLICAS && pods.iter().all(ready)).then_some(pods)
        },
        || node.describe("default"),
    );
    eprintln!(
        "{REPLICAS} pods Ready {:.1} s after the Deployment was created",
        t0.elapsed().as_secs_f64()
    );

    let pod_ips = pods_have_their_podnet_addresses(&node, &pods);
    // The first pod reaches every other, the last reaches the first.
    let ping = |from: &str, to: &str| node.ping("default", from, to);
    for (_, v4, v6) in &pod_ips[1..] {
        ping(&pod_ips[0].0, v4);
        ping(&pod_ips[0].0, v6);
    }
    ping(&pod_ips[REPLICAS - 1].0, &pod_ips[0].1);
    ping(&pod_ips[REPLICAS - 1].0, &pod_ips[0].2);

    // The agent's pod deleted while the pods run: its successor restores their
    // addresses from the journal (a hostPath), they still reach each other, and a
    // new pod starts once it is back.
    let old_agent = agent["metadata"]["name"].as_str().expect("agent pod name");
    node.kubectl(&[
        "delete",
        "pod",
        "-n",
        "kube-system",
        old_agent,
        "--wait=true",
    ]);
    node.wait_for(
        "a new podnet agent pod Ready",
        || {
            node.pods("kube-system", "app.kubernetes.io/name=podnet")
                .into_iter()
                .find(|p| ready(p) && p["metadata"]["name"] != old_agent)
        },
        || node.describe("kube-system"),
    );
    let replicas = (REPLICAS + 1).to_string();
    node.kubectl(&["scale", "deployment", "busybox", "--replicas", &replicas]);
    let pods = node.wait_for(
        "one more busybox pod Ready after the agent restart",
        || {
            let pods = node.pods("default", "app=busybox");
            (pods.len() == REPLICAS + 1 && pods.iter().all(ready)).then_some(pods)
        },
        || node.describe("default"),
    );
    let after = pods_have_their_podnet_addresses(&node, &pods);
    for kept in &pod_ips {
        assert!(
            after.contains(kept),
            "pod {} lost its addresses {} {} across the agent restart: {after:?}",
            kept.0,
            kept.1,
            kept.2
        );
    }
    let (new_pod, new_v4, new_v6) = after
        .iter()
        .find(|p| !pod_ips.contains(p))
        .expect("the new pod");
    ping(&pod_ips[0].0, new_v4);
    ping(&pod_ips[0].0, new_v6);
    ping(new_pod, &pod_ips[0].1);

    // Deleting the Deployment: every pod's address is released (CNI DEL from the
    // CRI), its veth and route are gone.
    node.kubectl(&["delete", "deployment", "busybox", "--wait=true"]);
    node.wait_for(
        "the busybox pods gone",
        || node.pods("default", "app=busybox").is_empty().then_some(()),
        || node.describe("default"),
    );
    let left: Vec<(String, String)> = node
        .allocated("ds/podnet")
        .into_iter()
        .filter(|(_, owner)| owner.starts_with("default/"))
        .collect();
    assert!(
        left.is_empty(),
        "addresses still allocated to deleted pods: {left:?}"
    );
    let links_after = node.ip(&["-o", "link", "show"]).lines().count();
    assert_eq!(links_after, links_before, "links left behind");
    assert_eq!(
        node.ip(&["route", "show"]),
        routes_before,
        "routes left behind"
    );

    // `kubectl delete -f deploy/`: the agent removes its CNI config as it stops.
    node.kubectl(&["delete", "-f", deploy, "--wait=true"]);
    node.wait_for(
        "the podnet pods gone",
        || {
            node.pods(
                "kube-system",
                "app.kubernetes.io/name in (podnet, podnet-operator)",
            )
            .is_empty()
            .then_some(())
        },
        || node.describe("kube-system"),
    );
    assert!(
        !Path::new(CNI_CONF).exists(),
        "{CNI_CONF} is still there after kubectl delete -f deploy/"
    );
}

/// `deploy/` with CAP_NET_ADMIN taken out of the agent's capabilities: the agent
/// fails at start, and `kubectl describe` (the container's termination message)
/// names the capability, what it is for and where to add it. This is the agent's
/// own message, handed on alike by every runtime: it runs on scripts/node's
/// default runtime only.
#[test]
fn agent_without_net_admin_fails_at_start_naming_it() {
    let test = "agent_without_net_admin_fails_at_start_naming_it";
    let Some(node) = RealNode::start(test, "containerd1") else {
        return;
    };
    node.apply(&deploy_manifest(&[(
        "add: [NET_ADMIN, NET_RAW]",
        "add: [NET_RAW]",
    )]));
    let wanted = "missing capability CAP_NET_ADMIN (needed to create the router device";
    let message = node.wait_for(
        "the agent's container terminated naming CAP_NET_ADMIN",
        || {
            let pods = node.pods("kube-system", "app.kubernetes.io/name=podnet");
            pods.iter()
                .flat_map(|p| p["status"]["containerStatuses"].as_array().cloned())
                .flatten()
                .filter(|c| c["name"] == "agent")
                .flat_map(|c| [c["state"].clone(), c["lastState"].clone()])
                .filter_map(|s| s["terminated"]["message"].as_str().map(String::from))
                .find(|m| m.contains(wanted))
        },
        || node.describe("kube-system"),
    );
    assert!(
        message.contains("add it to the container's securityContext.capabilities.add"),
        "{message}"
    );
    assert!(
        !Path::new(CNI_CONF).exists(),
        "the agent failed but {CNI_CONF} was written"
    );
}

/// The chapter's Lab 1 on the real node: with a /28 node mask and no extra CIDRs
/// for a full node (`cluster-pool-extra-cidrs-max: "0"`; `podnet plan`: 12 usable
/// pod addresses per node, and at most as many), a Deployment of 20 replicas has
/// exactly that many pods Running; the rest stay ContainerCreating, their events
/// carrying the plugin's range-full error. (With deploy/'s 2 extra CIDRs the node
/// would grow to 40 and run all 20: the cluster test `extra_cidrs` covers that.)
fn lab1_a_28_node_mask_runs_what_podnet_plan_says(runtime: &'static str) {
    let test = "lab1_a_28_node_mask_runs_what_podnet_plan_says";
    let Some(node) = RealNode::start(test, runtime) else {
        return;
    };
    let plan = Command::new(podnet_bin())
        .args([
            "plan",
            "--cidr",
            "10.244.0.0/16",
            "--mask-size",
            "28",
            "--extra-cidrs-max",
            "0",
            "-o",
            "json",
        ])
        .output()
        .expect("podnet plan");
    assert!(plan.status.success(), "podnet plan: {}", text(&plan));
    let plan: Value = serde_json::from_slice(&plan.stdout).expect("plan JSON");
    let usable = plan["usablePerNode"].as_u64().expect("usablePerNode") as usize;
    assert_eq!(
        plan["extraCidrs"]["maxUsablePerNode"].as_u64(),
        Some(usable as u64),
        "no extra CIDRs: the node's own range is all it gets"
    );
    assert!(
        usable < REPLICAS,
        "the lab needs fewer addresses than replicas"
    );

    // deploy/ with the node mask of the lab, and no extra CIDRs.
    node.apply(&deploy_manifest(&[
        (
            r#"cluster-pool-ipv4-mask-size: "24""#,
            r#"cluster-pool-ipv4-mask-size: "28""#,
        ),
        (
            r#"cluster-pool-extra-cidrs-max: "2""#,
            r#"cluster-pool-extra-cidrs-max: "0""#,
        ),
    ]));
    node.podnet_up();

    node.apply(&deployment(REPLICAS));
    let running = |pods: &[Value]| pods.iter().filter(|p| ready(p)).count();
    node.wait_for(
        "as many pods Running as the node range holds",
        || {
            let pods = node.pods("default", "app=busybox");
            (running(&pods) == usable).then_some(())
        },
        || node.describe("default"),
    );
    // The others fail in the plugin with the range-full error, and stay so.
    let full = "range is full";
    node.wait_for(
        "every other pod with the CNI error in its events",
        || {
            let failing = node.sandbox_failures("default", full);
            let pods = node.pods("default", "app=busybox");
            let pending: Vec<&str> = pods
                .iter()
                .filter(|p| !ready(p))
                .filter_map(|p| p["metadata"]["name"].as_str())
                .collect();
            (pending.len() == REPLICAS - usable && pending.iter().all(|p| failing.contains(*p)))
                .then_some(())
        },
        || node.describe("default"),
    );
    let pods = node.pods("default", "app=busybox");
    assert_eq!(running(&pods), usable, "{}", node.describe("default"));
    let waiting: Vec<&str> = pods
        .iter()
        .filter(|p| !ready(p))
        .filter_map(|p| p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"].as_str())
        .collect();
    assert_eq!(
        waiting,
        vec!["ContainerCreating"; REPLICAS - usable],
        "{}",
        node.describe("default")
    );
}

/// A `CiliumPodIPPool` of one IPv4 CIDR in blocks of `mask`.
fn pool_manifest(name: &str, cidr: &str, mask: u8) -> String {
    format!(
        "apiVersion: cilium.io/v2alpha1\nkind: CiliumPodIPPool\nmetadata: {{name: {name}}}\n\
         spec:\n  ipv4: {{cidrs: [\"{cidr}\"], maskSize: {mask}}}\n"
    )
}

/// A busybox pod in `namespace`, with `annotations` (a JSON object).
fn pod_manifest(namespace: &str, name: &str, annotations: &str) -> String {
    format!(
        r#"{{"apiVersion": "v1", "kind": "Pod",
  "metadata": {{"name": "{name}", "namespace": "{namespace}",
    "labels": {{"app": "lab2"}}, "annotations": {annotations}}},
  "spec": {{"terminationGracePeriodSeconds": 1,
    "containers": [{{"name": "busybox", "image": "localhost/busybox:1.35",
      "imagePullPolicy": "Never",
      "command": ["/bin/busybox", "sleep", "86400"]}}]}}}}"#
    )
}

/// The chapter's Lab 2 on the real node: `deploy/` with its ConfigMap switched to
/// `ipam: multi-pool` (agent and operator), CiliumPodIPPools `default`, `blue` and
/// `red` created with kubectl, a namespace annotated `ipam.cilium.io/ip-pool: blue`.
/// A pod in `default` gets an address of the default pool, one in the annotated
/// namespace one of `blue`, one there annotated `ipam.cilium.io/ip-pool: red` one of
/// `red` (the pod's annotation wins over its namespace's); each pod's
/// `status.podIPs` is what `podnet status --all-addresses` gives it (as `pool/ip`
/// outside the default pool), and the pods reach each other across the pools. A pod
/// in a namespace annotated `ipam.cilium.io/require-pool-match: "true"` that no pool
/// matches stays ContainerCreating with the pool-match error in its events.
fn lab2_namespace_and_pod_annotations_select_pools(runtime: &'static str) {
    let test = "lab2_namespace_and_pod_annotations_select_pools";
    let Some(node) = RealNode::start(test, runtime) else {
        return;
    };
    let pools = [
        ("default", "10.10.0.0/16"),
        ("blue", "10.20.0.0/16"),
        ("red", "10.30.0.0/16"),
    ];
    // The pools first (their CRD from deploy/crds/), then deploy/ in multi-pool:
    // the operator reads the same ConfigMap, so `ipam` switches both.
    let crds = repo().join("deploy/crds");
    node.kubectl(&["apply", "-f", crds.to_str().expect("repo path is UTF-8")]);
    node.kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd/ciliumpodippools.cilium.io",
        "--timeout=60s",
    ]);
    for (name, cidr) in pools {
        node.apply(&pool_manifest(name, cidr, 27));
    }
    node.apply(&deploy_manifest(&[(
        "ipam: cluster-pool",
        "ipam: multi-pool\n  ipam-multi-pool-pre-allocation: \"default=8,blue=4,red=4\"",
    )]));
    node.podnet_up();

    node.kubectl(&["create", "namespace", "lab2-blue"]);
    node.kubectl(&[
        "annotate",
        "namespace",
        "lab2-blue",
        "ipam.cilium.io/ip-pool=blue",
    ]);
    node.kubectl(&["create", "namespace", "lab2-strict"]);
    node.kubectl(&[
        "annotate",
        "namespace",
        "lab2-strict",
        "ipam.cilium.io/require-pool-match=true",
    ]);
    // (namespace, pod, its annotations, the pool expected)
    let cases = [
        ("default", "in-default", "{}", "default"),
        ("lab2-blue", "in-blue", "{}", "blue"),
        (
            "lab2-blue",
            "pinned-red",
            r#"{"ipam.cilium.io/ip-pool": "red"}"#,
            "red",
        ),
    ];
    for (namespace, name, annotations, _) in cases {
        node.apply(&pod_manifest(namespace, name, annotations));
    }
    node.apply(&pod_manifest("lab2-strict", "unmatched", "{}"));

    let mut pod_ips = Vec::new();
    for (namespace, name, _, pool) in cases {
        let pod = node.wait_for(
            &format!("pod {namespace}/{name} Ready"),
            || {
                let pod = node.kubectl_json(&["get", "pod", "-n", namespace, name]);
                ready(&pod).then_some(pod)
            },
            || node.describe(namespace),
        );
        let ips: Vec<String> = pod["status"]["podIPs"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|i| i["ip"].as_str())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(
            ips.len(),
            1,
            "pod {namespace}/{name}: podIPs {ips:?}, wanted one IPv4 address"
        );
        let ip: std::net::Ipv4Addr = ips[0].parse().expect("an IPv4 podIP");
        let cidr = pools.iter().find(|(p, _)| *p == pool).expect("pool").1;
        let net: ipnet::Ipv4Net = cidr.parse().expect("pool CIDR");
        assert!(
            net.contains(&ip),
            "pod {namespace}/{name} has {ip}, not in pool {pool} ({cidr})"
        );
        pod_ips.push((namespace, name, pool, ip.to_string()));
    }

    eprintln!("pods and their pools' addresses: {pod_ips:?}");
    // podnet's view: each address is the pod's, in the expected pool (`pool/ip`
    // outside the default pool).
    let allocated = node.allocated("ds/podnet");
    for (namespace, name, pool, ip) in &pod_ips {
        let key = if *pool == "default" {
            ip.clone()
        } else {
            format!("{pool}/{ip}")
        };
        assert_eq!(
            allocated.get(&key).map(String::as_str),
            Some(format!("{namespace}/{name}").as_str()),
            "pod {namespace}/{name} has {ip} of pool {pool} but podnet's allocations are {allocated:?}"
        );
    }

    // Across the pools, every pod reaches every other.
    for (from_ns, from, _, _) in &pod_ips {
        for (_, to, _, ip) in &pod_ips {
            if from == to {
                continue;
            }
            node.ping(from_ns, from, ip);
        }
    }

    // require-pool-match with no pool matching: no address, the plugin's error.
    let no_match = "no matching CiliumPodIPPool found";
    node.wait_for(
        "the unmatched pod with the pool-match error in its events",
        || {
            node.sandbox_failures("lab2-strict", no_match)
                .contains("unmatched")
                .then_some(())
        },
        || node.describe("lab2-strict"),
    );
    let pod = node.kubectl_json(&["get", "pod", "-n", "lab2-strict", "unmatched"]);
    assert_eq!(
        pod["status"]["containerStatuses"][0]["state"]["waiting"]["reason"].as_str(),
        Some("ContainerCreating"),
        "{}",
        node.describe("lab2-strict")
    );
    assert!(
        !node
            .allocated("ds/podnet")
            .values()
            .any(|o| o == "lab2-strict/unmatched"),
        "the unmatched pod got an address"
    );
}

/// The scenarios above that take a runtime, each a test on each runtime:
/// `real_node::crio::lab1_...`.
macro_rules! on_each_runtime {
    ($($runtime:ident),+) => {$(
        mod $runtime {
            const RUNTIME: &str = stringify!($runtime);

            #[test]
            fn deploy_runs_pods_through_podnet() {
                super::deploy_runs_pods_through_podnet(RUNTIME);
            }

            #[test]
            fn lab1_a_28_node_mask_runs_what_podnet_plan_says() {
                super::lab1_a_28_node_mask_runs_what_podnet_plan_says(RUNTIME);
            }

            #[test]
            fn lab2_namespace_and_pod_annotations_select_pools() {
                super::lab2_namespace_and_pod_annotations_select_pools(RUNTIME);
            }
        }
    )+};
}

on_each_runtime!(containerd1, containerd2, crio);
