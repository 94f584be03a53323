//! NetworkPolicy and ClusterNetworkPolicy on the three-node cluster, enforced by
//! podnet's agents (`enable-policy: default`, deploy/'s setting, and
//! `enable-cluster-network-policy` turned on with the CRD of deploy/crds/) in
//! tunnel mode: a web pod on one node and clients in two labelled namespaces, on
//! its node and on the others.

use super::*;

/// Where the web pod of [`web_manifest`] serves.
const WEB_PORT: u16 = 8080;
/// The clients: (namespace, pod, index of its node in [`node_names`]). The web
/// pod runs on the second node.
const CLIENTS: [(&str, &str, usize); 3] = [
    ("pol-blue", "blue-far", 0),
    ("pol-blue", "blue-near", 1),
    ("pol-red", "red-far", 2),
];

/// Kubernetes' semantics, across nodes and on one node, as a user sees them:
/// - no policy: every client reaches the web pod;
/// - a default-deny ingress policy in its namespace blocks every client, and the
///   kubelet's readiness probe still passes (the node reaches its own pods);
/// - a policy allowing a namespaceSelector (team=blue) on the web port lets the
///   blue clients in, on the web pod's node and on another, and not the red one;
///   `podnet observe` in the web node's agent names the red client, the web pod
///   and the policies that dropped its connection;
/// - an egress policy in the blue namespace allowing only an ipBlock of the world
///   blocks a blue client's requests to the web pod and lets its pings to the
///   world through; deleting it restores the first;
/// - while the web node's agent restarts, the table stays in place: the red
///   client stays blocked and the blue one allowed at every probe, and after the
///   restart too;
/// - relabelling the red namespace team=blue lets its client in;
/// - the agent's `podnet status` says what it enforced;
/// - a ClusterNetworkPolicy of the Admin tier denying team=blue beats the
///   NetworkPolicy allowing it, and `podnet observe` names it, its tier and rule
///   for the dropped connection; one of the Baseline tier loses to it, and decides
///   once the NetworkPolicies are deleted; deleting it opens everything again.
#[test]
fn network_policies_hold_across_nodes_and_through_an_agent_restart() {
    let test = "network_policies_hold_across_nodes_and_through_an_agent_restart";
    let Some(cluster) = Cluster::start(test) else {
        return;
    };
    let crd = repo().join("deploy/crds/clusternetworkpolicies.yaml");
    cluster.kubectl(&["apply", "-f", crd.to_str().expect("repo path is UTF-8")]);
    cluster.apply(&podnet_manifests_with(
        "tunnel",
        cluster.family,
        &["enable-cluster-network-policy=true"],
    ));
    cluster.wait_nodes_ready();
    let nodes = node_names();
    let web_node = nodes[1].clone();
    cluster.apply(&namespace("pol-blue", "blue"));
    cluster.apply(&namespace("pol-red", "red"));
    cluster.apply(&web_manifest(&web_node));
    for (ns, pod, node) in CLIENTS {
        cluster.apply(&client(ns, pod, &nodes[node]));
    }
    cluster.wait_for(
        "the web pod and every client Ready",
        || {
            let web = cluster.kubectl_json(&["get", "pod", "-n", "default", "web"]);
            let clients = CLIENTS
                .iter()
                .all(|(ns, pod, _)| ready(&cluster.kubectl_json(&["get", "pod", "-n", ns, pod])));
            (ready(&web) && clients).then_some(())
        },
        || cluster.describe("default") + &cluster.describe("pol-blue"),
    );
    let web = cluster.kubectl_json(&["get", "pod", "-n", "default", "web"]);
    let web_ip = web["status"]["podIP"]
        .as_str()
        .expect("the web pod has an address")
        .to_string();
    let probe = Probe {
        cluster: &cluster,
        web_ip: &web_ip,
    };

    probe.settle("no policy", &[true, true, true]);

    cluster.apply(DENY_INGRESS);
    probe.settle("default-deny ingress", &[false, false, false]);
    // The readiness probe (every second, three failures) comes from the node.
    std::thread::sleep(Duration::from_secs(5));
    let web = cluster.kubectl_json(&["get", "pod", "-n", "default", "web"]);
    assert!(
        ready(&web),
        "the web pod lost its readiness under default deny: the kubelet's probe was blocked"
    );

    cluster.apply(ALLOW_BLUE);
    probe.settle("default deny + allow team=blue", &[true, true, false]);
    // `podnet observe` in the web node's agent names both pods and the
    // policies whose default deny dropped the red client's connection.
    let observer = Observer::start(&cluster, &cluster.agents()[&web_node], "pol-red");
    let line = observer.first(|| {
        probe.reached();
    });
    assert_eq!(line["source"], "pol-red/red-far", "{line}");
    assert_eq!(line["destination"], "default/web", "{line}");
    assert_eq!(line["protocol"], "TCP", "{line}");
    assert_eq!(line["port"], WEB_PORT, "{line}");
    assert_eq!(line["direction"], "ingress", "{line}");
    assert_eq!(line["verdict"], "denied", "{line}");
    assert_eq!(
        line["policy"], "default deny of NetworkPolicies default/allow-blue, default/deny-ingress",
        "{line}"
    );
    drop(observer);

    cluster.apply(BLUE_EGRESS_TO_WORLD);
    probe.settle("blue egress to the world only", &[false, false, false]);
    cluster.ping("pol-blue", "blue-far", WORLD_IP);
    cluster.kubectl(&["delete", "networkpolicy", "-n", "pol-blue", "egress-world"]);
    probe.settle("the egress policy deleted", &[true, true, false]);

    // The web node's agent restarts; every probe meanwhile must hold.
    let agent = cluster.agents()[&web_node].clone();
    cluster.kubectl(&["delete", "pod", "-n", "kube-system", &agent, "--wait=false"]);
    let mut probes = 0;
    cluster.wait_for(
        "a new agent Ready on the web pod's node",
        || {
            probe.assert_now("while the web node's agent restarts", &[true, true, false]);
            probes += 1;
            let agents = cluster.agents();
            let new = agents.get(&web_node).filter(|a| **a != agent)?;
            ready(&cluster.kubectl_json(&["get", "pod", "-n", "kube-system", new])).then_some(())
        },
        || cluster.describe("kube-system"),
    );
    eprintln!("{probes} probe rounds held while the agent restarted");
    probe.assert_now("after the agent restarted", &[true, true, false]);

    cluster.kubectl(&["label", "namespace", "pol-red", "team=blue", "--overwrite"]);
    probe.settle("pol-red relabelled team=blue", &[true, true, true]);
    cluster.kubectl(&["label", "namespace", "pol-red", "team=red", "--overwrite"]);
    probe.settle("pol-red labelled team=red again", &[true, true, false]);

    let agent = cluster.agents()[&web_node].clone();
    let status = cluster.podnet_status(&agent, &[]);
    let line = status
        .lines()
        .find(|l| l.starts_with("Policy:"))
        .unwrap_or_else(|| panic!("no Policy line in podnet status:\n{status}"));
    assert!(
        line.contains("table written") && line.contains("2 NetworkPolicies"),
        "podnet status on {web_node}: {line}"
    );
    assert!(
        !line.contains(" 0 local pods enforced"),
        "podnet status on {web_node} enforces nothing: {line}"
    );

    cluster.apply(&deny_blue("admin-deny-blue", "Admin"));
    probe.settle(
        "an Admin tier Deny of team=blue above the NetworkPolicy allowing it",
        &[false, false, false],
    );
    // The drop is seen naming the ClusterNetworkPolicy, its tier and rule.
    let observer = Observer::start(&cluster, &cluster.agents()[&web_node], "pol-blue");
    let line = observer.first(|| {
        probe.reached();
    });
    assert!(
        line["source"]
            .as_str()
            .is_some_and(|s| s.starts_with("pol-blue/")),
        "{line}"
    );
    assert_eq!(line["verdict"], "denied", "{line}");
    assert_eq!(
        line["policy"],
        r#"ClusterNetworkPolicy admin-deny-blue (Admin tier, ingress rule 0 "deny-blue")"#,
        "{line}"
    );
    drop(observer);
    cluster.kubectl(&["delete", "clusternetworkpolicy", "admin-deny-blue"]);
    cluster.apply(&deny_blue("baseline-deny-blue", "Baseline"));
    probe.settle(
        "a Baseline tier Deny of team=blue below the NetworkPolicy allowing it",
        &[true, true, false],
    );
    cluster.kubectl(&["delete", "networkpolicy", "-n", "default", "--all"]);
    probe.settle(
        "every NetworkPolicy deleted: the Baseline Deny decides",
        &[false, false, true],
    );
    cluster.kubectl(&["delete", "clusternetworkpolicy", "baseline-deny-blue"]);
    probe.settle("every policy deleted", &[true, true, true]);
}

/// A ClusterNetworkPolicy of `tier` (Admin or Baseline) denying the web pod's
/// ingress from the namespaces labelled team=blue.
fn deny_blue(name: &str, tier: &str) -> String {
    format!(
        r#"{{"apiVersion": "policy.networking.k8s.io/v1beta1", "kind": "ClusterNetworkPolicy",
  "metadata": {{"name": "{name}"}},
  "spec": {{"tier": "{tier}", "priority": 10,
    "subject": {{"pods": {{"namespaceSelector": {{"matchLabels": {{"kubernetes.io/metadata.name": "default"}}}},
      "podSelector": {{"matchLabels": {{"app": "web"}}}}}}}},
    "ingress": [{{"name": "deny-blue", "action": "Deny",
      "from": [{{"namespaces": {{"matchLabels": {{"team": "blue"}}}}}}]}}]}}}}"#
    )
}

/// `podnet observe -o json --namespace NS` in an agent's container (kubectl
/// exec), its lines on a channel; the kubectl process is killed on drop (the
/// command in the container ends at its next line, or with the cluster).
struct Observer {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<Value>,
}

impl Observer {
    fn start(cluster: &Cluster, agent: &str, namespace: &str) -> Observer {
        let mut child = cluster
            .podnet_in_agent_command(agent, "observe", &["-o", "json", "--namespace", namespace])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("kubectl exec podnet observe");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                let value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("podnet observe printed {line:?}: {e}"));
                if tx.send(value).is_err() {
                    return;
                }
            }
        });
        Observer { child, lines }
    }

    /// The first line `send` makes appear (sent again every 3 s: the stream may
    /// not be subscribed yet), within 60 s.
    fn first(&self, mut send: impl FnMut()) -> Value {
        for _ in 0..20 {
            send();
            if let Ok(line) = self.lines.recv_timeout(Duration::from_secs(3)) {
                return line;
            }
        }
        panic!("podnet observe printed nothing in 60 s");
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Fetches of the web page by each client of [`CLIENTS`].
struct Probe<'a> {
    cluster: &'a Cluster,
    web_ip: &'a str,
}

impl Probe<'_> {
    /// Whether each client's fetch got the page (HTTP/1.0 by hand through busybox
    /// nc, as in `deploy_runs_pods_across_a_three_node_cluster`: Debian's static
    /// busybox wget crashes in these pods; a blocked connection times out in 2 s).
    fn reached(&self) -> Vec<bool> {
        let request = format!(
            "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | /bin/busybox nc -w 2 {} {WEB_PORT}",
            self.web_ip
        );
        CLIENTS
            .iter()
            .map(|(ns, pod, _)| {
                let out = self.cluster.script(&[
                    "kubectl",
                    "exec",
                    "-n",
                    ns,
                    pod,
                    "--",
                    "/bin/busybox",
                    "sh",
                    "-c",
                    &request,
                ]);
                out.status.success()
                    && String::from_utf8_lossy(&out.stdout).contains("served-by-web")
            })
            .collect()
    }

    /// Waits until the clients reach the web pod as `expected` says (policy
    /// changes take effect asynchronously), then checks that it holds.
    fn settle(&self, what: &str, expected: &[bool]) {
        let last = std::cell::RefCell::new(Vec::new());
        self.cluster.wait_for(
            &format!(
                "{what}: clients {CLIENTS:?} reaching {}:{WEB_PORT} as {expected:?}",
                self.web_ip
            ),
            || {
                let now = self.reached();
                let done = now == expected;
                *last.borrow_mut() = now;
                done.then_some(())
            },
            || {
                format!(
                    "last: {:?}; {}",
                    last.borrow(),
                    self.cluster.describe("default")
                )
            },
        );
        self.assert_now(what, expected);
        eprintln!("{what}: {expected:?} holds");
    }

    fn assert_now(&self, what: &str, expected: &[bool]) {
        let now = self.reached();
        assert_eq!(
            now, expected,
            "{what}: clients {CLIENTS:?} reaching {}:{WEB_PORT}",
            self.web_ip
        );
    }
}

/// A namespace labelled `team=<team>`.
fn namespace(name: &str, team: &str) -> String {
    format!(
        r#"{{"apiVersion": "v1", "kind": "Namespace",
  "metadata": {{"name": "{name}", "labels": {{"team": "{team}"}}}}}}"#
    )
}

/// A busybox pod `name` in `ns` on `node`.
fn client(ns: &str, name: &str, node: &str) -> String {
    format!(
        r#"{{"apiVersion": "v1", "kind": "Pod",
  "metadata": {{"name": "{name}", "namespace": "{ns}", "labels": {{"app": "client"}}}},
  "spec": {{"nodeName": "{node}", "terminationGracePeriodSeconds": 1,
    "containers": [{{"name": "busybox", "image": "localhost/busybox:1.35",
      "imagePullPolicy": "Never", "command": ["/bin/busybox", "sleep", "86400"]}}]}}}}"#
    )
}

/// Every pod of `default` isolated for ingress, nothing allowed.
const DENY_INGRESS: &str = r#"{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
  "metadata": {"name": "deny-ingress", "namespace": "default"},
  "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}"#;

/// The web pod's port, from every pod of the namespaces labelled team=blue.
const ALLOW_BLUE: &str = r#"{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
  "metadata": {"name": "allow-blue", "namespace": "default"},
  "spec": {"podSelector": {"matchLabels": {"app": "web"}},
    "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "blue"}}}],
      "ports": [{"protocol": "TCP", "port": 8080}]}]}}"#;

/// The blue pods may send only to the world (scripts/cluster's 192.0.2.0/24).
const BLUE_EGRESS_TO_WORLD: &str = r#"{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
  "metadata": {"name": "egress-world", "namespace": "pol-blue"},
  "spec": {"podSelector": {}, "policyTypes": ["Egress"],
    "egress": [{"to": [{"ipBlock": {"cidr": "192.0.2.0/24"}}]}]}}"#;
