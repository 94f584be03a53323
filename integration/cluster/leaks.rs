//! Day two on the cluster: an address whose pod and sandbox are gone without a
//! DEL is found by the agent's leak check and released; one whose sandbox still
//! runs is reported and never released, and `podnet ipam check` shows the
//! agent's leak until it is released; two pods with one IP are reported by the
//! operator and by `podnet ipam check`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use podnet::api::client::{Client, ClientError};
use serde_json::Value;

use super::*;

/// The node the pods leak on.
const NODE: &str = "node-2";
/// `--ipam-release-leaked-after` for this cluster (the default is 1 h).
const RELEASE_AFTER: Duration = Duration::from_secs(5);

impl Cluster {
    /// podnet's ConfigMap created with `options` (option name, value), then
    /// [`Cluster::install_podnet`]. Without --save-config, so `kubectl apply -f
    /// deploy/` keeps the keys its own ConfigMap does not have.
    fn install_podnet_with(&self, options: &[(&str, &str)]) {
        let mut args = vec![
            "create".to_string(),
            "configmap".to_string(),
            "-n".to_string(),
            "kube-system".to_string(),
            "podnet-config".to_string(),
        ];
        args.extend(
            options
                .iter()
                .map(|(k, v)| format!("--from-literal={k}={v}")),
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.kubectl(&args);
        self.install_podnet();
    }

    /// The agent's socket on `node`, as the host sees it (the node's /run/podnet
    /// is a bind mount of its state dir).
    pub(super) fn agent_socket(&self, node: &str) -> PathBuf {
        self.dir
            .join("nodes")
            .join(node)
            .join("fs/run/podnet/podnet.sock")
    }

    /// `POST /v1/ipam/leak-check` on `node`'s agent, until it lists the Pods.
    fn leak_check(&self, node: &str) -> Value {
        let client = Client::new(self.agent_socket(node), Duration::from_secs(30));
        self.wait_for(
            &format!("a leak check on {node} that listed the Pods"),
            || match client.call("POST", "/v1/ipam/leak-check", &[], None) {
                Ok(r) => serde_json::from_slice(&r.body).ok(),
                Err(ClientError::Status { status: 503, .. }) => None,
                Err(e) => panic!("the leak check on {node}: {e}"),
            },
            || self.describe("kube-system"),
        )
    }

    /// The agent's allocations on `node`: address -> owner.
    pub(super) fn node_allocations(&self, node: &str) -> BTreeMap<String, String> {
        let out = Command::new(podnet_bin())
            .args(["status", "-o", "json", "--socket"])
            .arg(self.agent_socket(node))
            .output()
            .expect("podnet status");
        assert!(out.status.success(), "podnet status on {node}: {out:?}");
        let status: Value = serde_json::from_slice(&out.stdout).expect("status JSON");
        status["status"]["ipam"]["allocations"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(ip, owner)| (ip.clone(), owner.as_str().unwrap_or_default().to_string()))
            .collect()
    }
}

impl Cluster {
    /// `podnet ipam check` run in the control plane's namespace as the cluster
    /// admin: its exit status and its report (with stderr).
    pub(super) fn ipam_check(&self) -> (std::process::Output, String) {
        let kubeconfig = self.dir.join("pki/admin.kubeconfig");
        let kubeconfig = kubeconfig.to_str().expect("a UTF-8 path");
        let podnet = std::fs::canonicalize(podnet_bin()).expect("the podnet binary");
        let podnet = podnet.to_str().expect("a UTF-8 path");
        let out = self.script(&[
            "exec",
            "cp",
            podnet,
            "ipam",
            "check",
            "--kubeconfig",
            kubeconfig,
        ]);
        let report = text(&out);
        (out, report)
    }
}

/// The verdict of each finding of a check: address -> verdict.
fn verdicts(check: &Value) -> BTreeMap<String, String> {
    check["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| {
            Some((
                f["ip"].as_str()?.to_string(),
                f["verdict"]["verdict"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// One cluster for the two day-two checks: podnet installed with the leak
/// check on demand (grace 0, release after 5 s) and the operator's duplicate
/// check every 10 s, set in podnet's ConfigMap; then
/// [`a_leaked_address_is_released_and_one_whose_sandbox_runs_is_kept`] on
/// node-2 and [`two_pods_with_one_ip_are_reported`] on node-3.
#[test]
fn leaks_are_released_or_kept_and_two_pods_with_one_ip_are_reported() {
    let test = "leaks_are_released_or_kept_and_two_pods_with_one_ip_are_reported";
    let Some(cluster) = Cluster::start(test) else {
        return;
    };
    let release_after = format!("{}s", RELEASE_AFTER.as_secs());
    cluster.install_podnet_with(&[
        ("ipam-leak-check-interval", "0"),
        ("ipam-leak-grace", "0s"),
        ("ipam-release-leaked-after", &release_after),
        ("ipam-duplicate-check-interval", "10s"),
    ]);
    a_leaked_address_is_released_and_one_whose_sandbox_runs_is_kept(&cluster);
    two_pods_with_one_ip_are_reported(&cluster);
}

/// Two pods on node-2 lose their Pod objects while node-2's kubelet is down (so
/// no CNI DEL comes): one's sandbox network is gone too (its host link deleted
/// behind the runtime's back), the other's still runs. The agent's check
/// reports the first as a leak with an `IPAMLeak` Event on the Node and
/// releases it once it has been one for 5 s; the second is reported as
/// `host-link-present` and keeps its address in every check.
fn a_leaked_address_is_released_and_one_whose_sandbox_runs_is_kept(cluster: &Cluster) {
    cluster.apply(&busybox_on("leaked", NODE));
    cluster.apply(&busybox_on("kept", NODE));
    let pods = cluster.wait_for(
        "the two pods Ready",
        || {
            let all = cluster.pods("default", "app=pinned");
            (all.len() == 2 && all.iter().all(ready)).then(|| placed(cluster, "pinned"))
        },
        || cluster.describe("default"),
    );
    let ip_of = |pod: &str| {
        pods.iter()
            .find(|(name, _, _)| name == pod)
            .map(|(_, _, ip)| ip.clone())
            .unwrap_or_else(|| panic!("no address for {pod}: {pods:?}"))
    };
    let (leaked, kept) = (ip_of("leaked"), ip_of("kept"));

    // No kubelet, no DEL: the node's kubelet killed (the runtime and the pods run on).
    let pid_file = cluster.dir.join("pids").join(NODE).join("kubelet");
    let pid = std::fs::read_to_string(&pid_file).expect("the kubelet's PID file");
    let killed = Command::new("kill")
        .args(["-KILL", pid.trim()])
        .status()
        .expect("kill");
    assert!(killed.success(), "kill -KILL {pid}");
    // The leaked pod's sandbox network goes behind the runtime's back.
    let route = cluster.script_ok(&["exec", NODE, "ip", "-o", "route", "get", &leaked]);
    let route = String::from_utf8_lossy(&route.stdout).to_string();
    let host_link = route
        .split_whitespace()
        .skip_while(|w| *w != "dev")
        .nth(1)
        .unwrap_or_else(|| panic!("no host link in {route:?}"))
        .to_string();
    cluster.script_ok(&["exec", NODE, "ip", "link", "del", &host_link]);
    cluster.kubectl(&[
        "delete",
        "pod",
        "leaked",
        "kept",
        "--force",
        "--grace-period=0",
    ]);

    let first = cluster.leak_check(NODE);
    let expected = BTreeMap::from([
        (leaked.clone(), "leak".to_string()),
        (kept.clone(), "host-link-present".to_string()),
    ]);
    assert_eq!(verdicts(&first), expected, "the first check: {first}");
    assert_eq!(first["released"], 0, "{first}");
    cluster.wait_for(
        &format!("an IPAMLeak Event naming {leaked}"),
        || {
            let events = cluster.kubectl_json(&[
                "get",
                "events",
                "-A",
                "--field-selector",
                "reason=IPAMLeak",
            ]);
            events["items"]
                .as_array()?
                .iter()
                .any(|e| e["message"].as_str().is_some_and(|m| m.contains(&leaked)))
                .then_some(())
        },
        || cluster.describe("default"),
    );

    // The admin's check shows the agent's leak, with its evidence, on its node.
    let (out, report) = cluster.ipam_check();
    assert_eq!(out.status.code(), Some(1), "ipam check:\n{report}");
    assert!(
        report
            .lines()
            .any(|l| l.contains("LEAK (reported by the agent")
                && l.contains(&leaked)
                && l.contains("leaked")),
        "ipam check does not show the leak of {leaked}:\n{report}"
    );

    std::thread::sleep(RELEASE_AFTER + Duration::from_secs(1));
    let second = cluster.leak_check(NODE);
    assert_eq!(second["released"], 1, "the second check: {second}");
    let (out, report) = cluster.ipam_check();
    assert!(
        report.contains("Leaks reported by the agents, not released: none"),
        "ipam check after the release (exit {:?}):\n{report}",
        out.status.code()
    );
    let held = cluster.node_allocations(NODE);
    assert!(
        !held.contains_key(&leaked),
        "{leaked} still allocated after its release: {held:?}"
    );
    assert!(held.contains_key(&kept), "{kept} lost: {held:?}");

    std::thread::sleep(RELEASE_AFTER + Duration::from_secs(1));
    let third = cluster.leak_check(NODE);
    assert_eq!(
        verdicts(&third),
        BTreeMap::from([(kept.clone(), "host-link-present".to_string())]),
        "the third check: {third}"
    );
    assert!(
        cluster.node_allocations(NODE).contains_key(&kept),
        "{kept}, whose sandbox runs, was released"
    );
}

/// Two Pods with one IP, planted by hand on a node that is off (so no kubelet
/// rewrites their status): the operator's leader posts a `DuplicatePodIP`
/// Event on each, and `podnet ipam check`, run as the cluster admin, exits 1
/// naming both.
fn two_pods_with_one_ip_are_reported(cluster: &Cluster) {
    let off = "node-3";
    let ip = node_cidrs(cluster, off)
        .first()
        .map(|c| c.hosts().nth(199).expect("a /24 has 200 hosts").to_string())
        .unwrap_or_else(|| panic!("{off} has no pod CIDR"));
    cluster.script_ok(&["poweroff", off]);
    for twin in ["twin-a", "twin-b"] {
        cluster.apply(&busybox_on(twin, off));
        let status = format!(
            r#"{{"status":{{"phase":"Running","podIP":"{ip}","podIPs":[{{"ip":"{ip}"}}]}}}}"#
        );
        cluster.kubectl(&[
            "patch",
            "pod",
            twin,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status,
        ]);
    }
    cluster.wait_for(
        "a DuplicatePodIP Event on each twin",
        || {
            let events = cluster.kubectl_json(&[
                "get",
                "events",
                "-n",
                "default",
                "--field-selector",
                "reason=DuplicatePodIP",
            ]);
            let on = |pod: &str| {
                events["items"]
                    .as_array()
                    .is_some_and(|items| items.iter().any(|e| e["involvedObject"]["name"] == pod))
            };
            (on("twin-a") && on("twin-b")).then_some(())
        },
        || cluster.describe("kube-system"),
    );
    let (out, report) = cluster.ipam_check();
    assert_eq!(out.status.code(), Some(1), "ipam check:\n{report}");
    for needle in ["twin-a", "twin-b", ip.as_str()] {
        assert!(
            report.contains(needle),
            "ipam check does not name {needle}:\n{report}"
        );
    }
}
