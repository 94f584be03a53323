//! `podnet observe` against a real kube-apiserver and the real agent (the
//! binary under test): a NetworkPolicy that default-denies web's ingress drops
//! the client's UDP, and `podnet observe -o json` prints a line naming both
//! pods, the port, the direction, `denied` and the policy; the metric counts
//! it; a flood is logged at most at the node's limit and the rest counted as
//! suppressed, a count that does not go back when the table is deleted and
//! installed again. A second policy allowing the client's UDP to another port:
//! `podnet observe --verdict allowed` prints the datagram as `allowed`, naming
//! the policies whose rules let it in. An agent restarted with
//! `--policy-audit-mode` lets the client's ping through, and observe reports it
//! as `audit`, as `podnet status` says.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

use crate::harness::*;
use crate::k8s::ControlPlane;
use crate::k8s_backend::{add_with_uid, create_sandbox_pods, eventually, policy_agent};

/// A running `podnet observe -o json`; its lines come through `lines`.
pub(super) struct Observer {
    child: Child,
    lines: mpsc::Receiver<Value>,
}

impl Observer {
    pub(super) fn start(node: &Node) -> Observer {
        Observer::start_with(node, &[])
    }

    /// `podnet observe -o json` with `args` too.
    pub(super) fn start_with(node: &Node, args: &[&str]) -> Observer {
        let mut child = Command::new(podnet_bin())
            .args(["observe", "-o", "json"])
            .args(args)
            .arg("--socket")
            .arg(node.socket())
            .stdout(Stdio::piped())
            .spawn()
            .expect("podnet observe");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let value = serde_json::from_str(&line).expect("a JSON line");
                if tx.send(value).is_err() {
                    return;
                }
            }
        });
        Observer { child, lines }
    }

    /// The first line `send` makes appear (sent again each second: the stream
    /// may not be subscribed yet), within 30 s.
    pub(super) fn first(&self, mut send: impl FnMut()) -> Value {
        for _ in 0..30 {
            send();
            if let Ok(line) = self.lines.recv_timeout(Duration::from_secs(1)) {
                return line;
            }
        }
        panic!("podnet observe printed nothing in 30 s");
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One UDP datagram from `sb` to `ip:port`, a new socket each time.
pub(super) fn udp(sb: &Sandbox, ip: &str, port: u16, count: u32) {
    let script = format!("for i in $(seq {count}); do echo x > /dev/udp/{ip}/{port}; done");
    let out = sb.ns.exec(&["bash", "-c", &script]);
    assert!(out.status.success(), "{out:?}");
}

/// The value of the metric line that starts with `name`, 0 when absent.
pub(super) fn metric(metrics: &str, name: &str) -> u64 {
    metric_values(metrics, name)
        .first()
        .map_or(0, |v| *v as u64)
}

#[test]
fn observe_names_the_policy_that_dropped_a_connection_and_audit_mode_reports_instead() {
    let Some(cp) = ControlPlane::start("k8s_policy_observe") else {
        return;
    };
    let (mut node, node_name) = policy_agent(&cp, "observe-1", "10.244.9.0/24");
    let sandboxes = [node.sandbox(), node.sandbox()];
    create_sandbox_pods(&cp, &node_name, &sandboxes);
    let ips: Vec<String> = sandboxes
        .iter()
        .map(|sb| add_with_uid(&cp, &node, sb).ipv4())
        .collect();
    // The agent names pods by their Pods' status.podIPs, which a kubelet writes.
    for (sb, ip) in sandboxes.iter().zip(&ips) {
        cp.set_pod_ip(&sb.ns.name, ip);
    }
    let [web, client] = sandboxes;
    let web_ip = &ips[0];
    let (web_pod, client_pod) = (
        format!("default/{}", web.ns.name),
        format!("default/{}", client.ns.name),
    );
    cp.kubectl(&["label", "pod", &web.ns.name, "app=web"])
        .expect_ok("label web");
    cp.apply(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: web-deny\n  namespace: default\nspec:\n  podSelector:\n    matchLabels:\n      app: web\n  policyTypes: [Ingress]\n",
    );
    eventually("web isolated", || {
        node.podnet(&["status"]).contains("1 local pods enforced")
    });

    for (args, refusal) in [
        (
            ["--verdict", "accepted"],
            "observe: verdict \"accepted\" is not one of denied, audit, allowed",
        ),
        (
            ["--namespace", "Bad"],
            "observe: namespace \"Bad\" is not a Kubernetes name",
        ),
        (["-o", "yaml"], "-o \"yaml\" is not one of text, json"),
    ] {
        let stderr = observe_refused(&node, &args);
        assert!(stderr.contains(refusal), "{refusal:?} in {stderr}");
    }

    let observer = Observer::start(&node);
    let line = observer.first(|| udp(&client, web_ip, 8080, 1));
    assert_eq!(line["source"], client_pod.as_str(), "{line}");
    assert_eq!(line["destination"], web_pod.as_str(), "{line}");
    assert_eq!(line["protocol"], "UDP", "{line}");
    assert_eq!(line["port"], 8080, "{line}");
    assert_eq!(line["direction"], "ingress", "{line}");
    assert_eq!(line["verdict"], "denied", "{line}");
    assert_eq!(
        line["policy"], "default deny of NetworkPolicy default/web-deny",
        "{line}"
    );
    let counted = "podnet_policy_verdicts_total{direction=\"ingress\",verdict=\"denied\",policy=\"default deny of NetworkPolicy default/web-deny\"}";
    assert!(metric(&node.metrics(), counted) >= 1, "{}", node.metrics());

    // A flood: at most the node's budget is logged, the rest counted.
    let before = metric(&node.metrics(), counted);
    udp(&client, web_ip, 8080, 1000);
    let m = node.metrics();
    let suppressed = metric(&m, "podnet_policy_verdicts_suppressed_total");
    let logged = metric(&m, counted) - before;
    assert!(suppressed > 0, "{m}");
    assert!(
        logged <= 300,
        "at most a few seconds' budget: {logged}\n{m}"
    );
    eprintln!("flood of 1000: {logged} logged, {suppressed} suppressed");
    drop(observer);

    // The table deleted behind the agent's back: its next check installs it
    // again, with the kernel's counter from 0. The metric does not go back,
    // and what the new table suppresses adds to it.
    let deleted = node
        .ns
        .exec(&["nft", "delete", "table", "inet", "podnet_policy"]);
    assert!(deleted.status.success(), "{deleted:?}");
    let repaired = "podnet_policy_table_repairs_total{found=\"missing\"}";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(70);
    while metric(&node.metrics(), repaired) < 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "no repair: {}",
            node.metrics()
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let total = "podnet_policy_verdicts_suppressed_total";
    let after_repair = metric(&node.metrics(), total);
    assert!(
        after_repair >= suppressed,
        "{after_repair} after {suppressed}"
    );
    udp(&client, web_ip, 8080, 1000);
    let again = metric(&node.metrics(), total);
    assert!(again > after_repair, "{again} after {after_repair}");

    // Allowed: the client's UDP to 9090, once the rule is in the table.
    cp.kubectl(&["label", "pod", &client.ns.name, "app=client"])
        .expect_ok("label client");
    cp.apply(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: web-allow-udp\n  namespace: default\nspec:\n  podSelector:\n    matchLabels:\n      app: web\n  ingress:\n  - from:\n    - podSelector:\n        matchLabels:\n          app: client\n    ports:\n    - {protocol: UDP, port: 9090}\n",
    );
    let observer = Observer::start_with(&node, &["--verdict", "allowed"]);
    let line = observer.first(|| udp(&client, web_ip, 9090, 1));
    assert_eq!(line["verdict"], "allowed", "{line}");
    assert_eq!(line["source"], client_pod.as_str(), "{line}");
    assert_eq!(line["destination"], web_pod.as_str(), "{line}");
    assert_eq!(line["port"], 9090, "{line}");
    assert_eq!(
        line["policy"], "one of NetworkPolicies default/web-allow-udp, default/web-deny",
        "{line}"
    );
    let allowed = "podnet_policy_verdicts_total{direction=\"ingress\",verdict=\"allowed\",policy=\"one of NetworkPolicies default/web-allow-udp, default/web-deny\"}";
    assert!(metric(&node.metrics(), allowed) >= 1, "{}", node.metrics());
    drop(observer);
    cp.kubectl(&["delete", "networkpolicy", "web-allow-udp"])
        .expect_ok("delete web-allow-udp");

    // Audit mode: the ping passes, reported as audit.
    assert!(!client.ping(web_ip), "denied before audit mode");
    let line = audited_ping(&mut node, &client, web_ip);
    assert_eq!(line["destination"], web_pod.as_str(), "{line}");
    assert_eq!(
        line["policy"], "default deny of NetworkPolicy default/web-deny",
        "{line}"
    );
}

/// `node`'s agent restarted with `--policy-audit-mode`: `client`'s ping to
/// `web_ip`, which policy denies, gets through, and observe's line for it
/// (asserted `audit` and ICMP) is returned.
pub(super) fn audited_ping(node: &mut Node, client: &Sandbox, web_ip: &str) -> Value {
    node.stop_daemon(false);
    node.args.push("--policy-audit-mode".into());
    node.start_daemon();
    eventually("audit mode in podnet status", || {
        node.podnet(&["status"]).contains("AUDIT MODE")
    });
    let observer = Observer::start(node);
    let mut answered = false;
    let line = observer.first(|| answered |= client.ping(web_ip));
    assert!(
        answered || client.ping(web_ip),
        "audit mode lets it through"
    );
    assert_eq!(line["verdict"], "audit", "{line}");
    assert_eq!(line["protocol"], "ICMP", "{line}");
    line
}

/// `podnet observe <args>` run to its end: its exit status and stderr.
fn observe_refused(node: &Node, args: &[&str]) -> String {
    let out = Command::new(podnet_bin())
        .arg("observe")
        .args(args)
        .arg("--socket")
        .arg(node.socket())
        .output()
        .expect("podnet observe");
    assert!(!out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn observe_on_a_node_that_enforces_no_policy_says_so() {
    if !root_or_skip("observe_on_a_node_that_enforces_no_policy_says_so") {
        return;
    }
    // The embedded backend has no NetworkPolicies: nothing is logged.
    let node = Node::start(&[]);
    let stderr = observe_refused(&node, &[]);
    assert!(
        stderr.contains("observe: NetworkPolicy is not enforced here"),
        "{stderr}"
    );
}
