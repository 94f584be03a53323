//! podnet on a real multi-node Kubernetes cluster: `scripts/cluster` runs a control
//! plane and three nodes (kubelet + a runtime + kube-proxy, each node in network
//! and mount namespaces of its own, on one fabric bridge; the runtimes containerd
//! 2, CRI-O and containerd 1.6, unless PODNET_CLUSTER_RUNTIMES says otherwise) and
//! CoreDNS;
//! `kubectl apply -f deploy/` installs podnet unchanged (the DaemonSet on every
//! node, the operator's two replicas on two nodes, tunnel mode). One such cluster
//! runs per machine (`scripts/cluster start` refuses a second); it is stopped when
//! the test ends, also on failure, and the test checks nothing of it is left.
//! Checks that need the same configuration share a cluster: a test runs them as
//! parts in turn ([`part`]), each removing its own pods.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ipnet::{IpNet, Ipv4Net};
use serde_json::Value;

use crate::harness::*;
use crate::scripted::*;

mod bandwidth;
mod dual_stack;
mod extra_cidrs;
mod faults;
mod helm;
mod l2;
mod leaks;
mod policy;
mod promises;
mod runtimes;
mod sticky;
mod upgrade;

const NODES: usize = 3;
/// Two busybox pods per node (a topology spread of maxSkew 1 over 6 replicas).
const REPLICAS: usize = 2 * NODES;
const SERVICE_IP: &str = "10.96.0.1";
/// The web pod's hostPort.
const HOST_PORT: u16 = 18080;
/// "The world" of scripts/cluster: behind a router, with no route to the pods.
const WORLD_IP: &str = "192.0.2.2";

fn node_names() -> Vec<String> {
    (1..=NODES).map(|i| format!("node-{i}")).collect()
}

/// One cluster per machine: the tests of this file take turns.
static ONE_CLUSTER: Mutex<()> = Mutex::new(());

/// A cluster `scripts/cluster start` brought up; `scripts/cluster stop` on drop
/// (a second stop after the test's own finds nothing to do).
struct Cluster {
    dir: PathBuf,
    /// PODNET_CLUSTER_IP_FAMILY: ipv4, dual or ipv6.
    family: &'static str,
    /// The test's name and when its cluster started: on drop, the test's time is
    /// appended to [`TIMES`].
    test: String,
    started: Instant,
    _turn: MutexGuard<'static, ()>,
}

/// Each cluster test's time from cluster start to stop, one line per test
/// (scripts/test-all prints it after the tests: where CI's time goes).
const TIMES: &str = "target/test-cluster-times.txt";

impl Cluster {
    /// Starts the cluster, or reports a skip (a failure unless skips are
    /// allowed: harness::skip) when a part is missing.
    fn start(test: &str) -> Option<Cluster> {
        Cluster::start_family(test, "ipv4")
    }

    /// Starts a cluster of IP family `family` (ipv4, dual or ipv6), or reports a
    /// skip as [`Cluster::start`] does.
    fn start_family(test: &str, family: &'static str) -> Option<Cluster> {
        // The default cluster's nodes run containerd 2, CRI-O and containerd 1.6
        // (`scripts/k8s-binaries runtimes` builds the first two and the CNI
        // plugins their nodes have).
        let parts = [
            "kube-proxy",
            "coredns",
            "containerd2/containerd",
            "crio/crio",
            "cni-plugins/portmap",
        ];
        if !node_parts_or_skip(test, &parts) {
            return None;
        }
        // A test that failed while it held the turn left nothing to protect.
        let turn = ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
        let t0 = Instant::now();
        let cluster = Cluster {
            dir: std::env::temp_dir().join(unique("podnet-cluster-")),
            family,
            test: test.to_string(),
            started: t0,
            _turn: turn,
        };
        cluster.script_ok(&["start"]);
        eprintln!(
            "scripts/cluster start: {NODES} nodes ({family}) registered in {:.1} s",
            t0.elapsed().as_secs_f64()
        );
        Some(cluster)
    }

    /// [`Cluster::start`], then podnet installed on it.
    fn start_with_podnet(test: &str) -> Option<Cluster> {
        let cluster = Cluster::start(test)?;
        cluster.install_podnet();
        Some(cluster)
    }

    /// `kubectl apply -f deploy/` with the ConfigMap changed for tunnel mode on
    /// the cluster's IP family as a user following docs/kubernetes.md changes it
    /// (the settings of scripts/lib/install-podnet.sh, which scripts/conformance
    /// and scripts/soak use too; none on an IPv4 cluster), then waits until every
    /// node is Ready.
    fn install_podnet(&self) {
        let t0 = Instant::now();
        if self.family == "ipv4" {
            let deploy = repo().join("deploy");
            self.kubectl(&["apply", "-f", deploy.to_str().expect("repo path is UTF-8")]);
        } else {
            self.apply(&podnet_manifests("tunnel", self.family));
        }
        self.wait_nodes_ready();
        eprintln!(
            "{NODES} nodes Ready {:.1} s after kubectl apply -f deploy/",
            t0.elapsed().as_secs_f64()
        );
    }

    /// Waits until every node is Ready.
    fn wait_nodes_ready(&self) {
        self.wait_for(
            "every node Ready",
            || {
                let nodes = self.kubectl_json(&["get", "nodes"])["items"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                (nodes.len() == NODES && nodes.iter().all(ready)).then_some(())
            },
            || self.describe("kube-system"),
        );
    }

    /// Waits until no pod of `default` matches `selector`, then checks that no
    /// agent (node -> agent pod) still holds an address for a pod of `default`.
    fn assert_freed(&self, selector: &str, agents: &BTreeMap<String, String>) {
        self.wait_for(
            &format!("the pods {selector} gone"),
            || self.pods("default", selector).is_empty().then_some(()),
            || self.describe("default"),
        );
        for (node, agent) in agents {
            let left: Vec<(String, String)> = self
                .allocated(agent)
                .into_iter()
                .filter(|(_, owner)| owner.starts_with("default/"))
                .collect();
            assert!(
                left.is_empty(),
                "{node}: addresses still allocated to deleted pods: {left:?}"
            );
        }
    }

    /// Waits for a Ready agent on every node, then checks that each holds exactly
    /// the addresses of the pods of `default` that `placed` (pod, node, address)
    /// puts on its node. The agents, node -> agent pod.
    fn assert_agents_hold(&self, placed: &[(String, String, String)]) -> BTreeMap<String, String> {
        let agents = self.wait_for(
            "an agent Ready on every node",
            || {
                let agents = self.agents();
                let all_ready = self
                    .pods("kube-system", "app.kubernetes.io/name=podnet")
                    .iter()
                    .all(ready);
                (agents.len() == NODES && all_ready).then_some(agents)
            },
            || self.describe("kube-system"),
        );
        for (node, agent) in &agents {
            let held: BTreeMap<String, String> = self
                .allocated(agent)
                .into_iter()
                .filter(|(_, owner)| owner.starts_with("default/"))
                .collect();
            let expected: BTreeMap<String, String> = placed
                .iter()
                .filter(|(_, n, _)| n == node)
                .map(|(pod, _, ip)| (ip.clone(), format!("default/{pod}")))
                .collect();
            assert_eq!(
                held, expected,
                "{node}: the agent's allocations against the pods on it"
            );
        }
        agents
    }

    /// The node's InternalIP, as its kubelet reported it.
    fn node_address(&self, node: &str) -> String {
        self.kubectl(&[
            "get",
            "node",
            node,
            "-o",
            "jsonpath={.status.addresses[?(@.type==\"InternalIP\")].address}",
        ])
    }

    /// `kubectl exec` in `pod` (of `default`); the output, or the failure's.
    fn exec(&self, pod: &str, cmd: &[&str]) -> Result<String, String> {
        let mut args = vec!["kubectl", "exec", "-n", "default", pod, "--"];
        args.extend_from_slice(cmd);
        let out = self.script(&args);
        match out.status.success() {
            true => Ok(String::from_utf8_lossy(&out.stdout).to_string()),
            false => Err(text(&out)),
        }
    }

    /// The podnet agent pod of each node.
    fn agents(&self) -> BTreeMap<String, String> {
        self.pods("kube-system", "app.kubernetes.io/name=podnet")
            .iter()
            .filter_map(|p| {
                Some((
                    p["spec"]["nodeName"].as_str()?.to_string(),
                    p["metadata"]["name"].as_str()?.to_string(),
                ))
            })
            .collect()
    }

    /// `scripts/cluster stop`, then checks that no namespace, mount, cgroup or
    /// process of the cluster is left.
    fn stop_clean(&self) {
        let t0 = Instant::now();
        self.script_ok(&["stop"]);
        eprintln!("scripts/cluster stop: {:.1} s", t0.elapsed().as_secs_f64());
        let left = self.leftovers();
        assert!(
            left.is_empty(),
            "left after scripts/cluster stop: {left:#?}"
        );
    }

    /// What is left of the cluster on the host: its network namespaces, the
    /// mounts under its state dir, its cgroup tree, its recorded processes still
    /// running.
    fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        for ns in std::fs::read_dir("/run/netns")
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = ns.file_name().to_string_lossy().to_string();
            if name.starts_with("pnc-") {
                left.push(format!("network namespace {name}"));
            }
        }
        let dir = self.dir.to_string_lossy().to_string();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for m in mounts.lines().filter(|m| m.contains(&dir)) {
            left.push(format!("mount {m}"));
        }
        if Path::new("/sys/fs/cgroup/pids/podnet-cluster").exists() {
            left.push("cgroup /sys/fs/cgroup/pids/podnet-cluster".to_string());
        }
        let pid_files = std::fs::read_dir(self.dir.join("pids"))
            .into_iter()
            .flatten();
        for place in pid_files.flatten() {
            for file in std::fs::read_dir(place.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                let pid = std::fs::read_to_string(file.path()).unwrap_or_default();
                let pid = pid.trim();
                if !pid.is_empty() && running(pid) {
                    left.push(format!("process {pid} ({})", file.path().display()));
                }
            }
        }
        left
    }
}

/// Runs `check`, one part of a test whose parts share one cluster in turn:
/// prints when the part starts and how long it took, and names it if it fails.
fn part(test: &str, name: &str, check: impl FnOnce()) {
    /// On drop during a panic: which part failed.
    struct Failed<'a>(&'a str, &'a str);
    impl Drop for Failed<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                eprintln!("{}: the part {} failed", self.0, self.1);
            }
        }
    }
    eprintln!("{test}: the part {name}");
    let t0 = Instant::now();
    let _failed = Failed(test, name);
    check();
    eprintln!(
        "{test}: the part {name} passed in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}

/// True when process `pid` exists and is not a zombie (a component killed by
/// stop stays one until whoever inherited it, here the test's parent, reaps it).
fn running(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat.rsplit_once(") ")?.1.chars().next()?;
            Some(state != 'Z')
        })
        .unwrap_or(false)
}

impl Scripted for Cluster {
    const WAIT: Duration = Duration::from_secs(300);
    const MARKER: &'static str = "/run/podnet-cluster.dir";

    fn command(&self) -> Command {
        let mut cmd = Command::new("bash");
        cmd.arg(repo().join("scripts/cluster"))
            .env("PODNET_CLUSTER_DIR", &self.dir)
            .env("PODNET_CLUSTER_NODES", NODES.to_string())
            .env("PODNET_CLUSTER_IP_FAMILY", self.family)
            .env("PODNET_CLUSTER_IMAGES", images_dir());
        cmd
    }

    fn dir(&self) -> &Path {
        &self.dir
    }

    fn log_tail(&self) -> String {
        node_names()
            .iter()
            .map(|n| {
                let log = self.dir.join("logs").join(n).join("kubelet.log");
                format!(
                    "{n} kubelet.log (last lines, newest first):\n{}\n",
                    log_end(&log, 10)
                )
            })
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.tear_down();
        let verdict = match std::thread::panicking() {
            true => "failed",
            false => "passed",
        };
        let line = format!(
            "{:>5} s  {verdict}  {}\n",
            self.started.elapsed().as_secs(),
            self.test
        );
        let times = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(repo().join(TIMES));
        if let Err(e) = times.and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes())) {
            eprintln!("could not note the test's time in {TIMES}: {e}");
        }
    }
}

/// deploy/'s manifests with the ConfigMap changes scripts/lib/install-podnet.sh
/// makes for `routing` (tunnel, native) on a cluster of IP family `family`.
fn podnet_manifests(routing: &str, family: &str) -> String {
    podnet_manifests_with(routing, family, &[])
}

/// [`podnet_manifests`] with the ConfigMap's `KEY=VALUE` `more` on top.
fn podnet_manifests_with(routing: &str, family: &str, more: &[&str]) -> String {
    let lib = repo().join("scripts/lib/install-podnet.sh");
    let script = r#"r=$1 f=$2 && shift 2 && . "$0" && set -- $(podnet_settings "$r" "$f") "$@" && podnet_manifests "$@""#;
    let out = Command::new("bash")
        .args(["-c", script])
        .arg(&lib)
        .args([routing, family])
        .args(more)
        .env("REPO", repo())
        .output()
        .expect("running bash");
    assert!(
        out.status.success(),
        "podnet_manifests for {routing} {family}:\n{}",
        text(&out)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// `replicas` busybox pods labelled `app: <name>`, spread evenly over the nodes.
fn spread_deployment(name: &str, replicas: usize) -> String {
    format!(
        r#"{{"apiVersion": "apps/v1", "kind": "Deployment",
  "metadata": {{"name": "{name}", "namespace": "default"}},
  "spec": {{"replicas": {replicas},
    "selector": {{"matchLabels": {{"app": "{name}"}}}},
    "template": {{"metadata": {{"labels": {{"app": "{name}"}}}},
      "spec": {{"terminationGracePeriodSeconds": 1,
        "topologySpreadConstraints": [{{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
          "whenUnsatisfiable": "DoNotSchedule",
          "labelSelector": {{"matchLabels": {{"app": "{name}"}}}}}}],
        "containers": [{{"name": "busybox", "image": "localhost/busybox:1.35",
          "imagePullPolicy": "Never",
          "command": ["/bin/busybox", "sleep", "86400"]}}]}}}}}}}}"#
    )
}

/// A busybox web server on `node` (its page names the pod), on the node's
/// hostPort 18080 (the portmap plugin podnet's conflist chains) and behind the
/// NodePort Service `web` (port 80 to 8080).
fn web_manifest(node: &str) -> String {
    format!(
        r#"{{"apiVersion": "v1", "kind": "List", "items": [
  {{"apiVersion": "v1", "kind": "Pod",
    "metadata": {{"name": "web", "namespace": "default", "labels": {{"app": "web"}}}},
    "spec": {{"nodeName": "{node}", "terminationGracePeriodSeconds": 1,
      "containers": [{{"name": "web", "image": "localhost/busybox:1.35",
        "imagePullPolicy": "Never",
        "command": ["/bin/busybox", "sh", "-c",
          "/bin/busybox mkdir -p /www && echo served-by-web > /www/index.html && exec /bin/busybox httpd -f -p 8080 -h /www"],
        "ports": [{{"containerPort": 8080, "hostPort": {HOST_PORT}}}],
        "readinessProbe": {{"tcpSocket": {{"port": 8080}}, "periodSeconds": 1}}}}]}}}},
  {{"apiVersion": "v1", "kind": "Service",
    "metadata": {{"name": "web", "namespace": "default"}},
    "spec": {{"type": "NodePort", "selector": {{"app": "web"}},
      "ports": [{{"port": 80, "targetPort": 8080}}]}}}}]}}"#
    )
}

/// The node's pod CIDRs of both families, as the operator gave them (its
/// CiliumNode).
fn node_pod_cidrs(cluster: &Cluster, node: &str) -> Vec<IpNet> {
    cluster.kubectl_json(&["get", "ciliumnode", node])["spec"]["ipam"]["podCIDRs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c.as_str()?.parse().ok())
        .collect()
}

/// The node's IPv4 pod CIDRs.
fn node_cidrs(cluster: &Cluster, node: &str) -> Vec<Ipv4Net> {
    node_pod_cidrs(cluster, node)
        .into_iter()
        .filter_map(|c| match c {
            IpNet::V4(c) => Some(c),
            IpNet::V6(_) => None,
        })
        .collect()
}

/// The ID of the pod's (first) container, empty before it has one.
fn container_id(pod: &Value) -> String {
    pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// One cluster with `deploy/` applied as it is, three parts in turn, each
/// removing its own pods: [`deploy_runs_pods_across_a_three_node_cluster`], then
/// [`upgrade::a_rolling_update_of_podnet_changes_no_address_and_loses_no_ping`],
/// then [`runtimes::runtimes_status_reaches_readiness_gc_releases_and_restarts_lose_nothing`]
/// (last: it fills a node's ranges, and the rolling update checks that no
/// node's ranges change). Stopping the cluster then leaves no namespace, mount,
/// cgroup or process behind.
#[test]
fn deploy_runs_pods_rolls_podnet_and_serves_each_runtime() {
    let test = "deploy_runs_pods_rolls_podnet_and_serves_each_runtime";
    let Some(cluster) = Cluster::start_with_podnet(test) else {
        return;
    };
    part(test, "deploy_runs_pods_across_a_three_node_cluster", || {
        deploy_runs_pods_across_a_three_node_cluster(&cluster)
    });
    part(
        test,
        "a_rolling_update_of_podnet_changes_no_address_and_loses_no_ping",
        || upgrade::a_rolling_update_of_podnet_changes_no_address_and_loses_no_ping(&cluster),
    );
    part(
        test,
        "runtimes_status_reaches_readiness_gc_releases_and_restarts_lose_nothing",
        || {
            runtimes::runtimes_status_reaches_readiness_gc_releases_and_restarts_lose_nothing(
                &cluster, test,
            )
        },
    );
    cluster.stop_clean();
}

/// The cluster of `scripts/cluster` with `deploy/` applied as it is: three nodes
/// turn Ready, the operator's two replicas run on two different nodes, every node
/// gets its own pod CIDR; busybox pods spread over the nodes each have an address
/// of their node's CIDR (the one their node's agent allocated to them), reach pods
/// on the other nodes (VXLAN), reach a ClusterIP Service whose pod runs on another
/// node (kube-proxy, nftables) and the world (masqueraded); the world and another
/// node reach that pod's hostPort (portmap chained after podnet) and the Service's
/// NodePort on another node; pods resolve `kubernetes.default.svc.cluster.local`
/// through CoreDNS; no node carries the `kubernetes` Service address (kube-proxy
/// serves it to the host-network agents). Deleting the pods frees their addresses
/// on every node.
fn deploy_runs_pods_across_a_three_node_cluster(cluster: &Cluster) {
    // The operator's replicas: on two different nodes (required anti-affinity).
    let operators = cluster.wait_for(
        "both operator replicas Running",
        || {
            let pods = cluster.pods("kube-system", "app.kubernetes.io/name=podnet-operator");
            (pods.len() == 2 && pods.iter().all(|p| p["status"]["phase"] == "Running"))
                .then_some(pods)
        },
        || cluster.describe("kube-system"),
    );
    let operator_nodes: BTreeSet<&str> = operators
        .iter()
        .filter_map(|p| p["spec"]["nodeName"].as_str())
        .collect();
    assert_eq!(operator_nodes.len(), 2, "operators on {operator_nodes:?}");

    // No address trick: the agents reach the API server through kube-proxy.
    for node in node_names() {
        let out = cluster.script_ok(&["exec", &node, "ip", "-o", "addr", "show"]);
        assert!(
            !text(&out).contains(&format!(" {SERVICE_IP}/")),
            "{node} carries the kubernetes Service address:\n{}",
            text(&out)
        );
    }

    let cidrs: BTreeMap<String, Vec<Ipv4Net>> = node_names()
        .into_iter()
        .map(|n| {
            let c = node_cidrs(cluster, &n);
            (n, c)
        })
        .collect();
    let all: BTreeSet<&Ipv4Net> = cidrs.values().flatten().collect();
    assert!(
        cidrs.values().all(|c| c.len() == 1) && all.len() == NODES,
        "each node has its own pod CIDR: {cidrs:?}"
    );

    cluster.apply(&spread_deployment("spread", REPLICAS));
    let pods = cluster.wait_for(
        "every spread pod Ready",
        || {
            let pods = cluster.pods("default", "app=spread");
            (pods.len() == REPLICAS && pods.iter().all(ready)).then_some(pods)
        },
        || cluster.describe("default"),
    );
    // (pod, node, IPv4 address)
    let placed = placed(cluster, "spread");
    assert_eq!(
        placed.len(),
        pods.len(),
        "every Ready pod has an address: {placed:?}"
    );
    eprintln!("pods: {placed:?}");
    let per_node: BTreeSet<&str> = placed.iter().map(|(_, n, _)| n.as_str()).collect();
    assert_eq!(per_node.len(), NODES, "pods on every node: {placed:?}");

    // Each pod's address is of its node's CIDR, and its node's agent allocated it
    // to that pod.
    let agents = cluster.agents();
    assert_eq!(agents.len(), NODES, "one agent per node: {agents:?}");
    let allocated: BTreeMap<&str, BTreeMap<String, String>> = agents
        .iter()
        .map(|(node, agent)| (node.as_str(), cluster.allocated(agent)))
        .collect();
    for (pod, node, ip) in &placed {
        let addr: std::net::Ipv4Addr = ip
            .parse()
            .unwrap_or_else(|e| panic!("pod {pod}: podIP {ip:?}: {e}"));
        assert!(
            cidrs[node].iter().any(|c| c.contains(&addr)),
            "pod {pod} on {node} has {ip}, not of its node's CIDR {:?}",
            cidrs[node]
        );
        assert_eq!(
            allocated[node.as_str()].get(ip).map(String::as_str),
            Some(format!("default/{pod}").as_str()),
            "pod {pod} has {ip} but {node}'s agent allocated {:?}",
            allocated[node.as_str()]
        );
    }

    // Across the nodes: the first pod pings a pod on every other node, and a pod
    // of the last node pings the first.
    let (first, first_node, first_ip) = &placed[0];
    for (_, node, ip) in placed.iter().filter(|(_, n, _)| n != first_node) {
        eprintln!("{first} ({first_node}) pings {ip} ({node})");
        cluster.ping("default", first, ip);
    }
    let (other, _, _) = placed
        .iter()
        .find(|(_, n, _)| n != first_node)
        .expect("a pod on another node");
    cluster.ping("default", other, first_ip);

    // A ClusterIP Service whose only pod runs on a node other than the client's.
    let web_node = node_names()
        .into_iter()
        .find(|n| n != first_node)
        .expect("another node");
    cluster.apply(&web_manifest(&web_node));
    cluster.wait_for(
        "the web pod Ready",
        || {
            let pod = cluster.kubectl_json(&["get", "pod", "-n", "default", "web"]);
            ready(&pod).then_some(())
        },
        || cluster.describe("default"),
    );
    let web_service = |path: &str| {
        let jsonpath = format!("jsonpath={{{path}}}");
        cluster.kubectl(&["get", "service", "-n", "default", "web", "-o", &jsonpath])
    };
    let web_ip = web_service(".spec.clusterIP");
    // HTTP/1.0 by hand through busybox nc: Debian's static busybox wget crashes
    // (SIGSEGV) in these pods, even for an address literal.
    let request = format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | /bin/busybox nc -w 3 {web_ip} 80");
    let page = cluster.wait_for(
        &format!("{first} ({first_node}) fetching http://{web_ip}/ (web on {web_node})"),
        || {
            cluster
                .exec(first, &["/bin/busybox", "sh", "-c", &request])
                .ok()
                .filter(|page| page.starts_with("HTTP/1.1 200"))
        },
        || cluster.describe("default"),
    );
    assert_eq!(
        page.lines().last().map(str::trim),
        Some("served-by-web"),
        "http://{web_ip}/ answered {page:?}"
    );

    // From outside the cluster (the world namespace, and another node's host):
    // the web pod's hostPort on its node's address (portmap, chained after
    // podnet), and the Service's NodePort on the first pod's node, which forwards
    // across the nodes to the web pod.
    let web_node_ip = cluster.node_address(&web_node);
    let node_port = web_service(".spec.ports[0].nodePort");
    let first_node_ip = cluster.node_address(first_node);
    for (from, url) in [
        ("world", format!("http://{web_node_ip}:{HOST_PORT}/")),
        (
            first_node.as_str(),
            format!("http://{web_node_ip}:{HOST_PORT}/"),
        ),
        ("world", format!("http://{first_node_ip}:{node_port}/")),
    ] {
        let page = cluster.wait_for(
            &format!("{from} fetching {url} (web on {web_node})"),
            || {
                let out = cluster.script(&["exec", from, "curl", "-sS", "--max-time", "3", &url]);
                out.status.success().then(|| text(&out))
            },
            || cluster.describe("default"),
        );
        assert_eq!(
            page.trim(),
            "served-by-web",
            "{from}: {url} answered {page:?}"
        );
    }
    // Egress: the world has no route to the pods, so an answer proves the
    // masquerade to the node's address.
    eprintln!("{first} ({first_node}) pings the world, {WORLD_IP}");
    cluster.ping("default", first, WORLD_IP);

    // Cluster DNS: CoreDNS (scheduled once the nodes were Ready) answers with the
    // kubernetes Service's address.
    cluster.wait_for(
        "CoreDNS Ready",
        || {
            let pods = cluster.pods("kube-system", "k8s-app=kube-dns");
            (!pods.is_empty() && pods.iter().all(ready)).then_some(())
        },
        || cluster.describe("kube-system"),
    );
    let name = "kubernetes.default.svc.cluster.local";
    let last = std::cell::RefCell::new(String::new());
    cluster.wait_for(
        &format!("{first} resolving {name}"),
        || {
            let out = match cluster.exec(first, &["/bin/busybox", "nslookup", name]) {
                Ok(out) | Err(out) => out,
            };
            let answered = out.lines().any(|l| {
                l.trim_start().starts_with("Address")
                    && l.split_whitespace().last() == Some(SERVICE_IP)
            });
            *last.borrow_mut() = out;
            answered.then_some(())
        },
        || {
            format!(
                "last nslookup:\n{}\n{}",
                last.borrow(),
                cluster.describe("kube-system")
            )
        },
    );

    // Deleting the pods frees their addresses on every node.
    cluster.kubectl(&["delete", "deployment", "spread", "--wait=true"]);
    cluster.kubectl(&["delete", "pod", "web", "--wait=true"]);
    cluster.kubectl(&["delete", "service", "web"]);
    cluster.assert_freed("app in (spread, web)", &agents);
}

/// The pods of `app`: (name, node, IPv4 address) of each that has an address.
fn placed(cluster: &Cluster, app: &str) -> Vec<(String, String, String)> {
    cluster
        .pods("default", &format!("app={app}"))
        .iter()
        .filter_map(|p| {
            Some((
                p["metadata"]["name"].as_str()?.to_string(),
                p["spec"]["nodeName"].as_str()?.to_string(),
                p["status"]["podIP"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// The holder of the operator's Lease, if any.
fn lease_holder(cluster: &Cluster) -> Option<String> {
    let out = cluster.script(&[
        "kubectl",
        "get",
        "lease",
        "-n",
        "kube-system",
        "podnet-operator-resource-lock",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    let holder = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !holder.is_empty()).then_some(holder)
}

/// A busybox pod named `name` on `node`.
fn busybox_on(name: &str, node: &str) -> String {
    format!(
        r#"{{"apiVersion": "v1", "kind": "Pod",
  "metadata": {{"name": "{name}", "namespace": "default", "labels": {{"app": "pinned"}}}},
  "spec": {{"nodeName": "{node}", "terminationGracePeriodSeconds": 1,
    "containers": [{{"name": "busybox", "image": "localhost/busybox:1.35",
      "imagePullPolicy": "Never", "command": ["/bin/busybox", "sleep", "86400"]}}]}}}}"#
    )
}

/// The pingers' interval, seconds.
const PING_INTERVAL: &str = "0.2";

/// Each pod of `placed` pings the first pod of another node every 0.2 s, in the
/// background inside the pod (it outlives the exec), its statistics to /ping.log
/// on SIGINT: (pod, the address it pings).
fn start_pingers(cluster: &Cluster, placed: &[(String, String, String)]) -> Vec<(String, String)> {
    let mut pingers = Vec::new();
    for (pod, node, _) in placed {
        let to = peer_of(placed, node);
        let start = format!(
            "/bin/busybox ping -i {PING_INTERVAL} {to} > /ping.log 2>&1 & echo $! > /ping.pid"
        );
        cluster
            .exec(pod, &["/bin/busybox", "sh", "-c", &start])
            .unwrap_or_else(|e| panic!("starting {pod}'s pinger: {e}"));
        let alive = "/bin/busybox sleep 1; kill -0 $(/bin/busybox cat /ping.pid)";
        cluster
            .exec(pod, &["/bin/busybox", "sh", "-c", alive])
            .unwrap_or_else(|e| panic!("{pod}'s pinger did not outlive its exec: {e}"));
        pingers.push((pod.clone(), to.to_string()));
    }
    pingers
}

/// Stops the pingers of [`start_pingers`]: (pod, address, sent, received), each
/// having sent at least 10 (it spanned what it watched).
fn stop_pingers(
    cluster: &Cluster,
    pingers: &[(String, String)],
) -> Vec<(String, String, u64, u64)> {
    let mut counts = Vec::new();
    for (pod, to) in pingers {
        let stop = "kill -INT $(/bin/busybox cat /ping.pid); /bin/busybox sleep 1; /bin/busybox cat /ping.log";
        let log = cluster
            .exec(pod, &["/bin/busybox", "sh", "-c", stop])
            .unwrap_or_else(|e| panic!("stopping {pod}'s pinger: {e}"));
        let (sent, received) = ping_counts(&log)
            .unwrap_or_else(|| panic!("{pod}'s ping to {to}: no statistics in {log}"));
        eprintln!("{pod} -> {to}: {sent} sent, {received} received");
        assert!(
            sent >= 10,
            "{pod}'s pinger ran only {sent} pings: it did not span what it watched"
        );
        counts.push((pod.clone(), to.clone(), sent, received));
    }
    counts
}

/// Transmitted and received of a busybox ping's statistics line.
fn ping_counts(log: &str) -> Option<(u64, u64)> {
    let line = log.lines().find(|l| l.contains("packets transmitted"))?;
    let mut numbers = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|n| !n.is_empty());
    Some((numbers.next()?.parse().ok()?, numbers.next()?.parse().ok()?))
}

/// Waits for an Event of `reason` on the object `default/<name>` (a Service, a
/// Pod) whose message holds `text`.
fn wait_for_event(cluster: &Cluster, reason: &str, name: &str, text: &str) {
    cluster.wait_for(
        &format!("a {reason} Event of {name} saying {text:?}"),
        || {
            let selector = format!("reason={reason},involvedObject.name={name}");
            let messages = cluster.kubectl(&[
                "get",
                "events",
                "-n",
                "default",
                "--field-selector",
                &selector,
                "-o",
                "jsonpath={.items[*].message}",
            ]);
            messages.contains(text).then_some(())
        },
        || cluster.kubectl(&["get", "events", "-n", "default"]),
    );
}

/// After `what` (an update, an upgrade): stops the pingers of [`start_pingers`]
/// and checks that each lost at most `max_lost` pings, that the spread pods
/// kept their nodes and addresses (`before`), and that none restarted.
fn assert_undisturbed(
    cluster: &Cluster,
    pingers: &[(String, String)],
    before: &[(String, String, String)],
    what: &str,
    max_lost: u64,
) {
    for (pod, to, sent, received) in stop_pingers(cluster, pingers) {
        assert!(
            sent - received <= max_lost,
            "{pod} -> {to}: {} pings lost during the {what} ({sent} sent), more than {max_lost}",
            sent - received
        );
    }
    let after = placed(cluster, "spread");
    assert_eq!(after, before, "pods and their addresses after the {what}");
    for p in cluster.pods("default", "app=spread") {
        let restarts = p["status"]["containerStatuses"][0]["restartCount"].as_u64();
        assert_eq!(
            restarts,
            Some(0),
            "{} restarted during the {what}",
            p["metadata"]["name"]
        );
    }
}

/// The `spread` Deployment of [`spread_deployment`] applied, once every pod is
/// Ready: (pod, node, IPv4 address) of each.
fn spread_ready(cluster: &Cluster) -> Vec<(String, String, String)> {
    cluster.apply(&spread_deployment("spread", REPLICAS));
    cluster.wait_for(
        "every spread pod Ready",
        || {
            let pods = cluster.pods("default", "app=spread");
            let all = pods.len() == REPLICAS && pods.iter().all(ready);
            all.then(|| placed(cluster, "spread"))
        },
        || cluster.describe("default"),
    )
}

/// The address of the first pod of `placed` (pod, node, address) on a node
/// other than `node`.
fn peer_of<'a>(placed: &'a [(String, String, String)], node: &str) -> &'a str {
    placed
        .iter()
        .find(|(_, n, _)| n != node)
        .map(|(_, _, ip)| ip.as_str())
        .expect("a pod on another node")
}

/// Each pod of `placed` pings (3 tries) the pod [`peer_of`] names; `what` says
/// what the pods went through, for the failure.
fn assert_each_reaches_a_peer(cluster: &Cluster, placed: &[(String, String, String)], what: &str) {
    for (pod, node, _) in placed {
        let to = peer_of(placed, node);
        cluster
            .exec(pod, &["/bin/busybox", "ping", "-c", "3", "-W", "2", to])
            .unwrap_or_else(|e| panic!("{pod} cannot reach {to} {what}: {e}"));
    }
}
