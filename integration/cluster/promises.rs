//! Promises off the happy path on the three-node cluster (issue 53), in both
//! routing modes, each break as a user made it:
//! - `cluster-pool-ipv4-mask-size` changed from 24 to 26 in the ConfigMap, then
//!   `kubectl rollout restart` of the operator, then a new CiliumNode: it gets a
//!   /24 of the pool in force (the Lease's record), the new leader says the edit
//!   refused, and `podnet ipam check` finds no range on two nodes;
//! - a typo in `cluster-pool-ipv4-cidr` (`10.250.0.0/16@x`), then an agent pod and
//!   the operator restarted: the new agent is Ready and a pod starts on its node,
//!   its `podnet status` warns of the refused option, the operator's replicas
//!   are Ready and a new CiliumNode still gets its range;
//! - `nft delete table inet podnet_policy` on a node under a default-deny policy:
//!   the table is back by the agent's next resync and a client on another node is
//!   refused again.
//!
//! The ConfigMap is put back after each edit.

use super::*;

/// The web pod of [`web_manifest`] serves here.
const WEB_PORT: u16 = 8080;

/// Every pod of `default` isolated for ingress, nothing allowed.
const DENY_INGRESS: &str = r#"{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
  "metadata": {"name": "deny-ingress", "namespace": "default"},
  "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}"#;

#[test]
fn edits_restarts_and_a_removed_policy_table_break_no_promise() {
    for routing in ["tunnel", "native"] {
        let test = format!("promises_{routing}");
        let Some(cluster) = Cluster::start(&test) else {
            return;
        };
        cluster.apply(&podnet_manifests(routing, "ipv4"));
        cluster.wait_nodes_ready();
        a_refused_mask_edit_survives_an_operator_restart(&cluster, &test);
        a_typo_in_the_pool_costs_no_node_its_cni(&cluster, &test);
        a_policy_table_removed_by_hand_comes_back(&cluster, &test);
        drop(cluster);
    }
}

/// Sets ConfigMap keys (`{"key": "value"}` pairs) of podnet-config.
fn edit_config(cluster: &Cluster, data: &[(&str, &str)]) {
    let data: serde_json::Map<String, Value> = data
        .iter()
        .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
        .collect();
    let patch = serde_json::json!({ "data": data }).to_string();
    cluster.kubectl(&[
        "-n",
        "kube-system",
        "patch",
        "configmap",
        "podnet-config",
        "--type",
        "merge",
        "-p",
        &patch,
    ]);
}

/// The operator's pods.
fn operator_pods(cluster: &Cluster) -> Vec<String> {
    cluster
        .pods("kube-system", "app.kubernetes.io/name=podnet-operator")
        .iter()
        .filter_map(|p| Some(p["metadata"]["name"].as_str()?.to_string()))
        .collect()
}

/// `kubectl rollout restart` of the operator, waiting until it is done and a
/// replica it started leads.
fn restart_operator(cluster: &Cluster) {
    let before = operator_pods(cluster);
    let deploy = "deployment/podnet-operator";
    cluster.kubectl(&["-n", "kube-system", "rollout", "restart", deploy]);
    cluster.kubectl(&[
        "-n",
        "kube-system",
        "rollout",
        "status",
        deploy,
        "--timeout=240s",
    ]);
    cluster.wait_for(
        "a restarted operator replica to lead",
        || {
            // deploy/operator.yaml's identity is the pod's name.
            let holder = lease_holder(cluster)?;
            (!before.contains(&holder)).then_some(())
        },
        || cluster.describe("kube-system"),
    );
}

/// The pool in force on the operator's Lease.
fn pool_record(cluster: &Cluster) -> String {
    cluster
        .kubectl(&[
            "-n",
            "kube-system",
            "get",
            "lease",
            "podnet-operator-resource-lock",
            "-o",
            "jsonpath={.metadata.annotations.podnet\\.io/cluster-pool-in-force}",
        ])
        .trim()
        .to_string()
}

/// The log of the replica that leads now.
fn leader_log(cluster: &Cluster) -> String {
    // deploy/operator.yaml's identity is the pod's name.
    let Some(pod) = lease_holder(cluster) else {
        return String::new();
    };
    let out = cluster.script(&["kubectl", "-n", "kube-system", "logs", &pod]);
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// A CiliumNode no agent runs for; its pod CIDRs once the operator wrote them.
fn new_cilium_node(cluster: &Cluster, name: &str) -> Vec<IpNet> {
    cluster.apply(&format!(
        r#"{{"apiVersion": "cilium.io/v2", "kind": "CiliumNode", "metadata": {{"name": "{name}"}}, "spec": {{}}}}"#
    ));
    cluster.wait_for(
        &format!("{name}'s pod CIDRs"),
        || {
            let cidrs = node_pod_cidrs(cluster, name);
            (!cidrs.is_empty()).then_some(cidrs)
        },
        || leader_log(cluster),
    )
}

/// `podnet ipam check` finds nothing.
fn assert_ipam_clean(cluster: &Cluster, what: &str) {
    let (out, report) = cluster.ipam_check();
    assert!(out.status.success(), "{what}: podnet ipam check:\n{report}");
}

fn a_refused_mask_edit_survives_an_operator_restart(cluster: &Cluster, test: &str) {
    cluster.wait_for(
        "the pool in force on the Lease",
        || {
            let record = pool_record(cluster);
            record
                .contains("\"cluster-pool-ipv4-mask-size\":\"24\"")
                .then_some(())
        },
        || leader_log(cluster),
    );
    let held: Vec<IpNet> = node_names()
        .iter()
        .flat_map(|n| node_pod_cidrs(cluster, n))
        .collect();
    edit_config(cluster, &[("cluster-pool-ipv4-mask-size", "26")]);
    let t0 = Instant::now();
    restart_operator(cluster);
    let cidrs = new_cilium_node(cluster, "promise-new-1");
    eprintln!(
        "{test}: mask edit, operator restarted, new CiliumNode given {cidrs:?} in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(cidrs.len(), 1, "{cidrs:?}");
    assert_eq!(cidrs[0].prefix_len(), 24, "the pool in force, not the edit");
    for h in &held {
        assert!(
            !h.contains(&cidrs[0].network()) && !cidrs[0].contains(&h.network()),
            "the new node's {} overlaps a live range {h}",
            cidrs[0]
        );
    }
    cluster.wait_for(
        "the new leader to say the edit refused",
        || leader_log(cluster).contains("were refused").then_some(()),
        || leader_log(cluster),
    );
    assert_ipam_clean(cluster, "after the refused mask edit and a restart");
    cluster.kubectl(&["delete", "ciliumnode", "promise-new-1"]);
    edit_config(cluster, &[("cluster-pool-ipv4-mask-size", "24")]);
}

fn a_typo_in_the_pool_costs_no_node_its_cni(cluster: &Cluster, test: &str) {
    let pool = "10.244.0.0/16 10.250.0.0/16@x";
    edit_config(cluster, &[("cluster-pool-ipv4-cidr", pool)]);
    let node = "node-1";
    let agent = cluster.agents()[node].clone();
    let t0 = Instant::now();
    cluster.kubectl(&["delete", "pod", "-n", "kube-system", &agent, "--wait=false"]);
    restart_operator(cluster);
    let new_agent = cluster.wait_for(
        "a new agent Ready on node-1",
        || {
            let agents = cluster.agents();
            let new = agents.get(node).filter(|a| **a != agent)?.clone();
            ready(&cluster.kubectl_json(&["get", "pod", "-n", "kube-system", &new])).then_some(new)
        },
        || cluster.describe("kube-system"),
    );
    cluster.apply(&busybox_on("after-typo", node));
    cluster.wait_for(
        "a pod started on node-1 after the typo",
        || cluster.exec("after-typo", &["/bin/busybox", "true"]).ok(),
        || cluster.describe("default"),
    );
    eprintln!(
        "{test}: typo, agent and operator restarted, a pod running on {node} in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let status = cluster.podnet_status(&new_agent, &[]);
    assert!(
        status.contains("warning (cluster-pool-ipv4-cidr): invalid cluster-pool-ipv4-cidr entry \"10.250.0.0/16@x\""),
        "podnet status on {node}:\n{status}"
    );
    let cidrs = new_cilium_node(cluster, "promise-new-2");
    assert_eq!(cidrs[0].prefix_len(), 24, "{cidrs:?}");
    cluster.wait_for(
        "the new leader to say the typo refused",
        || {
            leader_log(cluster)
                .contains("10.250.0.0/16@x")
                .then_some(())
        },
        || leader_log(cluster),
    );
    assert_ipam_clean(cluster, "after the typo and the restarts");
    cluster.kubectl(&["delete", "ciliumnode", "promise-new-2"]);
    cluster.kubectl(&["delete", "pod", "after-typo", "--wait=false"]);
    edit_config(cluster, &[("cluster-pool-ipv4-cidr", "10.244.0.0/16")]);
}

/// Whether `client` (of `default`) gets the web page from `web_ip`.
fn fetches(cluster: &Cluster, client: &str, web_ip: &str) -> bool {
    let request =
        format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | /bin/busybox nc -w 2 {web_ip} {WEB_PORT}");
    cluster
        .exec(client, &["/bin/busybox", "sh", "-c", &request])
        .is_ok_and(|out| out.contains("served-by-web"))
}

fn a_policy_table_removed_by_hand_comes_back(cluster: &Cluster, test: &str) {
    let nodes = node_names();
    let web_node = nodes[1].clone();
    cluster.apply(&web_manifest(&web_node));
    cluster.apply(&busybox_on("promise-client", &nodes[0]));
    let web_ip = cluster.wait_for(
        "the web pod and the client Ready",
        || {
            let web = cluster.kubectl_json(&["get", "pod", "-n", "default", "web"]);
            let client = cluster.kubectl_json(&["get", "pod", "-n", "default", "promise-client"]);
            let ip = web["status"]["podIP"].as_str()?.to_string();
            (ready(&web) && ready(&client)).then_some(ip)
        },
        || cluster.describe("default"),
    );
    cluster.wait_for(
        "the client reaching the web pod",
        || fetches(cluster, "promise-client", &web_ip).then_some(()),
        || cluster.describe("default"),
    );
    cluster.apply(DENY_INGRESS);
    cluster.wait_for(
        "default deny to refuse the client",
        || (!fetches(cluster, "promise-client", &web_ip)).then_some(()),
        || cluster.describe("default"),
    );
    cluster.script_ok(&[
        "exec",
        &web_node,
        "nft",
        "delete",
        "table",
        "inet",
        "podnet_policy",
    ]);
    let t0 = Instant::now();
    cluster.wait_for(
        "the policy table back on the web pod's node",
        || {
            let out = cluster.script(&[
                "exec",
                &web_node,
                "nft",
                "list",
                "table",
                "inet",
                "podnet_policy",
            ]);
            out.status.success().then_some(())
        },
        || cluster.describe("kube-system"),
    );
    eprintln!(
        "{test}: the policy table deleted by hand, back in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    cluster.wait_for(
        "default deny to refuse the client again",
        || (!fetches(cluster, "promise-client", &web_ip)).then_some(()),
        || cluster.describe("default"),
    );
    cluster.kubectl(&["delete", "networkpolicy", "-n", "default", "deny-ingress"]);
    cluster.kubectl(&["delete", "pod", "web", "promise-client", "--wait=false"]);
}
