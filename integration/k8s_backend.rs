//! The daemon on the Kubernetes backend, against a real kube-apiserver and etcd
//! (integration/k8s.rs): kubernetes mode mirrors the Node's pod CIDRs into the
//! CiliumNode, cluster-pool waits for the operator's CIDRs and never clobbers
//! them, pods keep getting addresses while the API server is down (also across a
//! daemon restart), ADD and DEL write nothing to the API server, and the agent's
//! least-privilege ServiceAccount is enough and no more.

use std::time::{Duration, Instant};

use crate::harness::*;
use crate::k8s::{ControlPlane, NodeNs};

/// The IPv6 InternalIP a node namespace's Node lists when it has an IPv6 pod
/// CIDR: `fd00:250::<n>`, `n` as in its IPv4 one.
pub fn node_ipv6(node: &NodeNs) -> String {
    format!("fd00:250::{}", node.ip.octets()[3])
}

/// Sets the InternalIPs a Node lists (its `status.addresses`, replaced).
pub fn set_internal_ips(cp: &ControlPlane, node: &str, ips: &[&str]) {
    let addresses: Vec<String> = ips
        .iter()
        .map(|ip| format!(r#"{{"type":"InternalIP","address":"{ip}"}}"#))
        .collect();
    cp.kubectl(&[
        "patch",
        "node",
        node,
        "--subresource=status",
        "--type=merge",
        "-p",
        &format!(r#"{{"status":{{"addresses":[{}]}}}}"#, addresses.join(",")),
    ])
    .expect_ok("patch the Node's status");
}

/// Adds a ServiceCIDR `name` with `cidr` to the cluster's Service range (beside
/// the API server's own IPv4 one).
pub fn add_service_cidr(cp: &ControlPlane, name: &str, cidr: &str) {
    cp.kubectl_stdin(
        &["create", "-f", "-"],
        &format!(
            r#"{{"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
                "metadata": {{"name": "{name}"}}, "spec": {{"cidrs": ["{cidr}"]}}}}"#
        ),
    )
    .expect_ok("a ServiceCIDR");
}

/// Creates the Node object of a node namespace, with its InternalIP and pod CIDRs.
/// With an IPv6 pod CIDR the Node also lists an IPv6 InternalIP ([`node_ipv6`],
/// published only), as a dual-stack kubelet's does: the agent hands out no address
/// of a family its node has no address of (`daemon::node_check`).
pub fn create_node(cp: &ControlPlane, node: &NodeNs, pod_cidrs: &[&str]) {
    let cidrs = pod_cidrs
        .iter()
        .map(|c| format!("\"{c}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let spec = if pod_cidrs.is_empty() {
        String::new()
    } else {
        format!(
            "spec:\n  podCIDR: \"{}\"\n  podCIDRs: [{cidrs}]\n",
            pod_cidrs[0]
        )
    };
    cp.apply(&format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {}\n{spec}",
        node.name
    ));
    let v4 = node.ip.to_string();
    let v6 = node_ipv6(node);
    match pod_cidrs.iter().any(|c| c.contains(':')) {
        true => set_internal_ips(cp, &node.name, &[&v4, &v6]),
        false => set_internal_ips(cp, &node.name, &[&v4]),
    }
}

/// Writes the node's CIDRs into its CiliumNode the way the operator does (its own
/// field manager, server-side apply).
pub fn operator_assigns(cp: &ControlPlane, node: &str, cidrs: &[&str]) {
    let list = cidrs
        .iter()
        .map(|c| format!("\"{c}\""))
        .collect::<Vec<_>>()
        .join(", ");
    cp.kubectl_stdin(
        &[
            "apply",
            "--server-side",
            "--field-manager",
            "podnet-operator",
            "-f",
            "-",
        ],
        &format!(
            "apiVersion: cilium.io/v2\nkind: CiliumNode\nmetadata:\n  name: {node}\nspec:\n  ipam:\n    podCIDRs: [{list}]\n"
        ),
    )
    .expect_ok("apply the operator's podCIDRs");
}

/// A test plays the operator: `blocks` (pool, CIDR) into the node's CiliumNode.
pub fn operator_allocates(cp: &ControlPlane, node: &str, blocks: &[(&str, &str)]) {
    let list = blocks
        .iter()
        .map(|(pool, cidr)| format!("{{pool: {pool}, cidrs: [{cidr}]}}"))
        .collect::<Vec<_>>()
        .join(", ");
    cp.kubectl_stdin(
        &["apply", "--server-side", "--field-manager", "podnet-operator", "-f", "-"],
        &format!(
            "apiVersion: cilium.io/v2\nkind: CiliumNode\nmetadata: {{name: {node}}}\nspec:\n  ipam:\n    pools:\n      allocated: [{list}]\n"
        ),
    )
    .expect_ok("the operator's blocks");
}

pub fn jsonpath(cp: &ControlPlane, kind: &str, name: &str, path: &str) -> String {
    cp.kubectl(&["get", kind, name, "-o", &format!("jsonpath={path}")])
        .expect_ok("get")
}

/// Waits until `f` holds (30 s at most: an Event's post can lag on a busy machine).
pub(crate) fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A node `name` with the CRDs installed and its CiliumNode holding `pod_cidr`,
/// whose agent runs in kubernetes IPAM with `--enable-policy default` (the
/// policy tests' and benchmark's node); the node and its name.
pub fn policy_agent(cp: &ControlPlane, name: &str, pod_cidr: &str) -> (Node, String) {
    policy_agent_of(cp, name, pod_cidr, None)
}

/// [`policy_agent`] running `bin` (None: the binary under test).
pub fn policy_agent_of(
    cp: &ControlPlane,
    name: &str,
    pod_cidr: &str,
    bin: Option<&str>,
) -> (Node, String) {
    cp.install_crds();
    let ns = cp.add_node_ns(name);
    create_node(cp, &ns, &[pod_cidr]);
    let node_name = ns.name.clone();
    let mut node = k8s_node(
        ns,
        &cp.kubeconfig(),
        &["--ipam", "kubernetes", "--enable-policy", "default"],
    );
    node.bin = bin.map(str::to_string);
    node.start_daemon();
    (node, node_name)
}

/// The agent's options that enforce both NetworkPolicy and
/// ClusterNetworkPolicy, with the kubernetes IPAM.
pub const POLICY_AGENT_ARGS: [&str; 5] = [
    "--ipam",
    "kubernetes",
    "--enable-policy",
    "default",
    "--enable-cluster-network-policy",
];

/// A daemon on the node namespace, talking to the API server with `kubeconfig`.
pub fn k8s_node(node: NodeNs, kubeconfig: &std::path::Path, args: &[&str]) -> Node {
    let mut all = vec![
        "--k8s-kubeconfig-path",
        kubeconfig.to_str().expect("path"),
        "--k8s-node-name",
        &node.name,
        "--ipam-cilium-node-update-rate",
        "1s",
    ];
    all.extend_from_slice(args);
    Node::in_namespace(node.ns, &all)
}

/// The API server's own count of writes to CiliumNodes and Nodes: write requests
/// that succeeded (a 2xx code). A request that failed wrote nothing; one cut off by
/// a killed client (an operator SIGKILLed mid-apply) is counted with another code.
pub fn api_writes(cp: &ControlPlane) -> u64 {
    api_requests(cp, |l| {
        (l.contains("resource=\"ciliumnodes\"") || l.contains("resource=\"nodes\""))
            && l.contains("code=\"2")
            && ["APPLY", "POST", "PUT", "PATCH", "DELETE"]
                .iter()
                .any(|v| l.contains(&format!("verb=\"{v}\"")))
    })
}

/// The API server's apiserver_request_total, summed over the label sets (the
/// text inside `{...}`) `labels` accepts.
pub fn api_requests(cp: &ControlPlane, labels: impl Fn(&str) -> bool) -> u64 {
    let metrics = cp
        .kubectl(&["get", "--raw", "/metrics"])
        .expect_ok("metrics");
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("apiserver_request_total{"))
        .filter(|l| labels(l))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[test]
fn kubernetes_mode_mirrors_the_nodes_pod_cidrs_into_its_cilium_node() {
    let Some(cp) = ControlPlane::start("k8s_kubernetes_mode") else {
        return;
    };
    cp.install_crds();
    let ns = cp.add_node_ns("kn-1");
    create_node(&cp, &ns, &["10.244.5.0/24", "fd00:5::/120"]);
    let name = ns.name.clone();
    let mut node = k8s_node(
        ns,
        &cp.kubeconfig(),
        &["--ipam", "kubernetes", "--enable-ipv6"],
    );
    node.start_daemon();
    let sb = node.sandbox();
    let r = node.add(&sb);
    assert!(r.ok, "{}", r.stdout);
    assert!(r.ipv4().starts_with("10.244.5."), "{}", r.ipv4());
    assert!(r.ipv6().starts_with("fd00:5::"), "{}", r.ipv6());
    assert_eq!(
        jsonpath(&cp, "ciliumnode", &name, "{.spec.ipam.podCIDRs}"),
        r#"["10.244.5.0/24","fd00:5::/120"]"#
    );
    assert_eq!(
        jsonpath(
            &cp,
            "ciliumnode",
            &name,
            "{.metadata.ownerReferences[0].kind}"
        ),
        "Node"
    );
    let router = node.ipv4_addressing().ip;
    eventually("spec.health", || {
        let health = jsonpath(&cp, "ciliumnode", &name, "{.spec.health}");
        health.contains("\"ipv4\":\"10.244.5.") && health.contains("\"ipv6\":\"fd00:5::")
    });
    eventually("the CiliumInternalIP in spec.addresses", || {
        let addresses = jsonpath(&cp, "ciliumnode", &name, "{.spec.addresses}");
        addresses.contains("InternalIP") && addresses.contains(&router)
    });
    assert!(sb.ping(&router));
    assert!(node.del(&sb).ok);
    // The Node's labels are copied to the CiliumNode (a ClusterNetworkPolicy's
    // `nodes` peer selects by them) and follow a label added and one removed.
    let labels = |n: &str| jsonpath(&cp, "ciliumnode", n, "{.metadata.labels}");
    cp.kubectl(&["label", "node", &name, "zone=a"]);
    eventually("the CiliumNode labelled zone=a", || {
        labels(&name).contains(r#""zone":"a""#)
    });
    // Removed from the CiliumNode by hand, the agent writes it again.
    cp.kubectl(&["label", "ciliumnode", &name, "zone-"]);
    eventually("the zone label back on the CiliumNode", || {
        labels(&name).contains(r#""zone":"a""#)
    });
    cp.kubectl(&["label", "node", &name, "zone-"]);
    eventually("the zone label gone from the CiliumNode", || {
        !labels(&name).contains("zone")
    });
}

#[test]
fn cluster_pool_waits_for_the_operators_cidrs_and_never_clobbers_them() {
    let Some(cp) = ControlPlane::start("k8s_cluster_pool") else {
        return;
    };
    cp.install_crds();
    let ns = cp.add_node_ns("cp-1");
    create_node(&cp, &ns, &[]);
    let name = ns.name.clone();
    let mut node = k8s_node(ns, &cp.kubeconfig(), &["--ipam", "cluster-pool"]);
    node.spawn_daemon();
    eventually("the daemon to say what it waits for", || {
        node.log()
            .contains("waiting for the operator to write this node's CIDRs")
    });
    assert!(
        node.client().healthz().is_err(),
        "served before it owned anything"
    );
    operator_assigns(&cp, &name, &["10.77.3.0/24"]);
    node.wait_ready();
    let sb = node.sandbox();
    let r = node.add(&sb);
    assert!(r.ok, "{}", r.stdout);
    assert!(r.ipv4().starts_with("10.77.3."), "{}", r.ipv4());

    // The agent's applies (the router address, now and after a restart) leave the
    // operator's field and its ownership alone.
    eventually("the router address in the CiliumNode", || {
        jsonpath(&cp, "ciliumnode", &name, "{.spec.addresses}").contains("CiliumInternalIP")
    });
    node.restart_daemon();
    let owners = cp
        .kubectl(&[
            "get",
            "ciliumnode",
            &name,
            "-o",
            "json",
            "--show-managed-fields",
        ])
        .expect_ok("managed fields");
    let managed: serde_json::Value = serde_json::from_str(&owners).expect("json");
    let fields_of = |manager: &str| {
        managed["metadata"]["managedFields"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["manager"] == manager)
            .map(|m| m["fieldsV1"].to_string())
            .collect::<String>()
    };
    assert!(fields_of("podnet-operator").contains("podCIDRs"));
    assert!(!fields_of("podnet-agent").contains("podCIDRs"));
    assert!(fields_of("podnet-agent").contains("addresses"));
    assert_eq!(
        jsonpath(&cp, "ciliumnode", &name, "{.spec.ipam.podCIDRs}"),
        r#"["10.77.3.0/24"]"#
    );
}

#[test]
fn pods_get_addresses_while_the_api_server_is_down() {
    let Some(mut cp) = ControlPlane::start("k8s_api_server_down") else {
        return;
    };
    cp.install_crds();
    let ns = cp.add_node_ns("down-1");
    create_node(&cp, &ns, &[]);
    let name = ns.name.clone();
    let mut node = k8s_node(ns, &cp.kubeconfig(), &["--ipam", "cluster-pool"]);
    node.spawn_daemon();
    operator_assigns(&cp, &name, &["10.78.0.0/24"]);
    node.wait_ready();

    // The API server is killed in the middle of a burst of ADDs.
    let before: Vec<Sandbox> = (0..20).map(|_| node.sandbox()).collect();
    let refs: Vec<&Sandbox> = before.iter().collect();
    let results = std::thread::scope(|s| {
        let burst = s.spawn(|| node.plugin_parallel("ADD", &refs, 4));
        std::thread::sleep(Duration::from_millis(100));
        cp.stop_apiserver(true);
        burst.join().expect("burst")
    });
    let mut seen = std::collections::BTreeSet::new();
    for r in results {
        assert!(r.ok, "ADD while the API server went down: {}", r.stdout);
        assert!(seen.insert(r.ipv4()), "{} handed out twice", r.ipv4());
    }
    // A daemon restart while the API server is still down serves from the journal.
    node.restart_daemon();
    assert!(
        node.log()
            .contains("serving from what the journal says this node owns")
    );
    let after: Vec<Sandbox> = (0..5).map(|_| node.sandbox()).collect();
    let refs: Vec<&Sandbox> = after.iter().collect();
    let added = node.plugin_parallel("ADD", &refs, 4);
    for r in &added {
        assert!(
            r.ok,
            "ADD after a restart with the API server down: {}",
            r.stdout
        );
        assert!(seen.insert(r.ipv4()), "{} handed out twice", r.ipv4());
    }
    assert!(before[0].ping(&added[0].ipv4()));

    // The API server comes back: the watch resumes and sees changes again.
    cp.start_apiserver();
    cp.kubectl(&["annotate", "ciliumnode", &name, "podnet.test/poke=1"])
        .expect_ok("annotate");
    eventually("the watch to resume", || {
        node.log().matches("node resource reloaded").count() >= 2
    });
    eventually("the router address re-applied", || {
        jsonpath(&cp, "ciliumnode", &name, "{.spec.addresses}").contains("CiliumInternalIP")
    });
}

/// API-server writes while the pods are added and deleted on `node` (8 at a time).
fn writes_for(cp: &ControlPlane, node: &Node, pods: &[Sandbox]) -> u64 {
    std::thread::sleep(Duration::from_millis(1500));
    let start = api_writes(cp);
    let refs: Vec<&Sandbox> = pods.iter().collect();
    for r in node.plugin_parallel("ADD", &refs, 8) {
        assert!(r.ok, "{}", r.stdout);
    }
    for r in node.plugin_parallel("DEL", &refs, 8) {
        assert!(r.ok, "{}", r.stdout);
    }
    // Two update intervals: a write the outbox would make has happened by now.
    std::thread::sleep(Duration::from_millis(2500));
    api_writes(cp) - start
}

#[test]
fn adds_and_dels_write_nothing_to_the_api_server() {
    let Some(cp) = ControlPlane::start("k8s_api_writes") else {
        return;
    };
    cp.install_crds();
    // cluster-pool
    let ns = cp.add_node_ns("w-1");
    create_node(&cp, &ns, &[]);
    let name = ns.name.clone();
    let mut node = k8s_node(ns, &cp.kubeconfig(), &["--ipam", "cluster-pool"]);
    node.spawn_daemon();
    operator_assigns(&cp, &name, &["10.79.0.0/24"]);
    node.wait_ready();
    eventually("the agent's start-up writes", || {
        jsonpath(&cp, "ciliumnode", &name, "{.spec.addresses}").contains("CiliumInternalIP")
    });
    let pods: Vec<Sandbox> = (0..100).map(|_| node.sandbox()).collect();
    let writes = writes_for(&cp, &node, &pods);
    eprintln!("API server writes for 100 pod ADD+DEL, cluster-pool: {writes}");
    assert_eq!(writes, 0, "cluster-pool ADD/DEL wrote to the API server");
    drop(node);

    // kubernetes
    let ns = cp.add_node_ns("w-2");
    create_node(&cp, &ns, &["10.79.1.0/24"]);
    let name = ns.name.clone();
    let mut node = k8s_node(ns, &cp.kubeconfig(), &["--ipam", "kubernetes"]);
    node.start_daemon();
    eventually("the agent's start-up writes", || {
        jsonpath(&cp, "ciliumnode", &name, "{.spec.addresses}").contains("CiliumInternalIP")
    });
    let pods: Vec<Sandbox> = (0..100).map(|_| node.sandbox()).collect();
    let writes = writes_for(&cp, &node, &pods);
    eprintln!("API server writes for 100 pod ADD+DEL, kubernetes: {writes}");
    assert_eq!(writes, 0, "kubernetes-mode ADD/DEL wrote to the API server");
    drop(node);

    // multi-pool: a write only when the requested ceiling changes.
    cp.apply(
        "apiVersion: cilium.io/v2alpha1\nkind: CiliumPodIPPool\nmetadata: {name: default}\n\
         spec:\n  ipv4: {cidrs: [10.82.0.0/16], maskSize: 24}\n",
    );
    let ns = cp.add_node_ns("w-3");
    create_node(&cp, &ns, &[]);
    let name = ns.name.clone();
    operator_allocates(&cp, &name, &[("default", "10.82.0.0/24")]);
    let mut node = k8s_node(
        ns,
        &cp.kubeconfig(),
        &[
            "--ipam",
            "multi-pool",
            "--ipam-multi-pool-pre-allocation",
            "default=16",
        ],
    );
    node.start_daemon();
    eventually("the first demand", || {
        jsonpath(&cp, "ciliumnode", &name, "{.spec.ipam.pools.requested}").contains("default")
    });
    // Pool selection reads the Pods from the API server: create them first.
    let pods: Vec<Sandbox> = (0..100).map(|_| node.sandbox()).collect();
    create_sandbox_pods(&cp, &name, &pods);
    let writes = writes_for(&cp, &node, &pods);
    eprintln!("API server writes for 100 pod ADD+DEL, multi-pool (pre-allocation 16): {writes}");
    assert!(writes < 20, "multi-pool wrote {writes} times for 100 pods");
}

#[test]
fn the_agents_service_account_is_enough_and_no_more() {
    let Some(cp) = ControlPlane::start("k8s_agent_rbac") else {
        return;
    };
    cp.install_crds();
    let ns = cp.add_node_ns("rbac-1");
    // A /29: the router and the health endpoint leave 4 addresses for pods.
    create_node(&cp, &ns, &["10.244.9.0/29"]);
    let name = ns.name.clone();
    // The token the kubelet would mount in the agent's pod on this node.
    let agent = cp.agent_kubeconfig_on(&name);
    let mut node = k8s_node(
        ns,
        &agent,
        &["--ipam", "kubernetes", "--ipam-release-cooldown", "1s"],
    );
    node.start_daemon();
    let sb = node.sandbox();
    let r = node.add(&sb);
    assert!(r.ok, "{}", r.stdout);
    eventually("the agent's CiliumNode", || {
        jsonpath(&cp, "ciliumnode", &name, "{.spec.addresses}").contains("CiliumInternalIP")
    });
    // The configuration check reads the Service range with the agent's grant and
    // writes its condition through the admission policy.
    let status: serde_json::Value =
        serde_json::from_str(&node.podnet(&["status", "-o", "json"])).expect("status JSON");
    let check = &status["status"]["ipam"]["config-check"];
    assert_eq!(
        check["service-cidrs"],
        serde_json::json!(["10.96.0.0/16"]),
        "{check}"
    );
    eventually("the agent's podnet.io/ConfigFitsNode condition", || {
        jsonpath(
            &cp,
            "ciliumnode",
            &name,
            r#"{.status.conditions[?(@.type=="podnet.io/ConfigFitsNode")].reason}"#,
        ) == "Fits"
    });
    // The range full: the agent taints its Node (through the second admission
    // policy) with the reason, and CNI STATUS stays ready (a NotReady node's pods
    // would be evicted); a pod gone, an address is free and both go.
    let mut pods = vec![sb];
    let full = loop {
        let sb = node.sandbox();
        let r = node.add(&sb);
        if !r.ok {
            break r;
        }
        pods.push(sb);
        assert!(pods.len() <= 6, "a /29 gave {} pods addresses", pods.len());
    };
    assert_eq!(full.code(), 101, "{full:?}");
    let taints = || jsonpath(&cp, "node", &name, "{.spec.taints}");
    let reason = || {
        jsonpath(
            &cp,
            "node",
            &name,
            r#"{.metadata.annotations.podnet\.io/addresses-exhausted}"#,
        )
    };
    eventually(
        "the podnet.io/addresses-exhausted taint and its reason",
        || {
            taints().contains(r#""key":"podnet.io/addresses-exhausted""#)
                && reason().contains("range 10.244.9.0/29 of node rbac-")
        },
    );
    assert!(reason().contains("is exhausted"), "{}", reason());
    let status = node.plugin("STATUS", None, &node.conf("1.1.0"), &[]);
    assert!(
        status.ok,
        "STATUS on an exhausted Kubernetes node: {status:?}"
    );
    let gone = pods.pop().expect("a pod");
    assert!(node.del(&gone).ok);
    eventually(
        "the taint and the reason gone once an address is free",
        || !taints().contains("podnet.io/addresses-exhausted") && reason().is_empty(),
    );
    // Writes the agent must not make are refused.
    for args in [
        vec!["delete", "ciliumnode", name.as_str()],
        vec!["label", "node", name.as_str(), "podnet.test/x=1"],
        vec!["create", "namespace", "agent-may-not"],
    ] {
        let out = cp.kubectl_as(&node.ns, &agent, &args, None);
        assert!(out.forbidden(), "{args:?} as the agent: {out:?}");
    }
}

/// A Pod object on `node` (no scheduler runs: `spec.nodeName` is set directly).
pub fn create_pod(cp: &ControlPlane, namespace: &str, name: &str, node: &str, annotations: &str) {
    cp.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {namespace}\n  annotations: {{{annotations}}}\n\
         spec:\n  nodeName: {node}\n  containers: [{{name: c, image: busybox}}]\n"
    ));
}

/// ADD for a sandbox as the pod `namespace/name` (also used by crossnode.rs).
/// The Pod objects `default/<sandbox>` on node `node` that the harness's plugin
/// runs stand for (multi-pool selection reads them from the API server).
pub fn create_sandbox_pods(cp: &ControlPlane, node: &str, sandboxes: &[Sandbox]) {
    let list: Vec<String> = sandboxes
        .iter()
        .map(|sb| {
            format!(
                "- {{apiVersion: v1, kind: Pod, metadata: {{name: {}, namespace: default}}, spec: {{nodeName: {node}, containers: [{{name: c, image: busybox}}]}}}}",
                sb.ns.name
            )
        })
        .collect();
    cp.apply(&format!(
        "apiVersion: v1\nkind: List\nitems:\n{}\n",
        list.join("\n")
    ));
}

/// ADD of `sb` as the Pod `default/<sandbox name>`, with its UID from the API.
pub fn add_with_uid(cp: &ControlPlane, node: &Node, sb: &Sandbox) -> PluginOutput {
    let pod = &sb.ns.name;
    let r = add_as_pod(cp, node, sb, pod);
    assert!(r.ok, "ADD {pod}: {}", r.stdout);
    r
}

/// ADD of `sb` as the Pod `default/<pod>`, with its UID from the API; it may fail.
pub fn add_as_pod(cp: &ControlPlane, node: &Node, sb: &Sandbox, pod: &str) -> PluginOutput {
    let uid = jsonpath(cp, "pod", pod, "{.metadata.uid}");
    assert!(!uid.is_empty(), "the Pod {pod} has a UID");
    let args =
        format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod};K8S_POD_UID={uid}");
    node.plugin("ADD", Some(sb), &node.conf("1.1.0"), &[("CNI_ARGS", &args)])
}

pub fn add_as(node: &Node, sb: &Sandbox, namespace: &str, name: &str) -> PluginOutput {
    let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}");
    node.plugin("ADD", Some(sb), &node.conf("1.1.0"), &[("CNI_ARGS", &args)])
}

#[test]
fn multi_pool_selects_pools_from_pod_and_namespace_annotations_in_the_api() {
    let Some(cp) = ControlPlane::start("k8s_multi_pool") else {
        return;
    };
    cp.install_crds();
    cp.apply(
        "apiVersion: cilium.io/v2alpha1\nkind: CiliumPodIPPool\nmetadata: {name: default}\n\
         spec:\n  ipv4: {cidrs: [10.80.0.0/16], maskSize: 27}\n---\n\
         apiVersion: cilium.io/v2alpha1\nkind: CiliumPodIPPool\nmetadata: {name: mars}\n\
         spec:\n  ipv4: {cidrs: [10.81.0.0/16], maskSize: 27}\n---\n\
         apiVersion: v1\nkind: Namespace\nmetadata:\n  name: lab2\n  annotations: {ipam.cilium.io/ip-pool: mars}\n",
    );
    let ns = cp.add_node_ns("mp-1");
    create_node(&cp, &ns, &[]);
    let name = ns.name.clone();
    // The test plays the operator: each pool gets a block for this node.
    operator_allocates(
        &cp,
        &name,
        &[("default", "10.80.0.0/27"), ("mars", "10.81.0.0/27")],
    );
    let mut node = k8s_node(
        ns,
        &cp.kubeconfig(),
        &[
            "--ipam",
            "multi-pool",
            "--ipam-multi-pool-pre-allocation",
            "default=4,mars=4",
        ],
    );
    node.start_daemon();
    let (plain, annotated, in_lab2) = (node.sandbox(), node.sandbox(), node.sandbox());
    create_pod(&cp, "default", "plain", &name, "");
    create_pod(
        &cp,
        "default",
        "annotated",
        &name,
        "ipam.cilium.io/ip-pool: mars",
    );
    create_pod(&cp, "lab2", "web", &name, "");
    let cases = [
        (&plain, "default", "plain", "10.80.0."),
        (&annotated, "default", "annotated", "10.81.0."),
        (&in_lab2, "lab2", "web", "10.81.0."),
    ];
    for (sb, namespace, pod, prefix) in cases {
        // The pod may reach the daemon's cache a moment after it was created.
        let mut r = add_as(&node, sb, namespace, pod);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !r.ok && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
            r = add_as(&node, sb, namespace, pod);
        }
        assert!(r.ok, "{namespace}/{pod}: {}", r.stdout);
        assert!(
            r.ipv4().starts_with(prefix),
            "{namespace}/{pod}: {}",
            r.ipv4()
        );
    }
    // A pod the API server does not know gets Cilium's selection error.
    let unknown = node.sandbox();
    let r = add_as(&node, &unknown, "default", "nobody");
    assert!(!r.ok);
    assert!(
        r.msg()
            .contains(r#"resource Pod "default/nobody" not found"#),
        "{}",
        r.msg()
    );
    // Status names the backend, the API server and each watch's state.
    eventually("every watch synced in status", || {
        let st = node.client().healthz().expect("healthz");
        let b = st.ipam.backend.expect("backend status");
        b.kind == "kubernetes"
            && b.location.starts_with("API server https://10.250.0.1")
            && ["ciliumnode", "pods", "namespaces", "pools"]
                .iter()
                .all(|w| b.watches.get(*w) == Some(&true))
    });
    let out = node.ns.exec(&[
        podnet_bin(),
        "status",
        "--socket",
        node.socket().to_str().expect("socket"),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Backend:    kubernetes (API server https://"),
        "{text}"
    );
    assert!(text.contains("ciliumnode synced"), "{text}");
    // The demand reaches the CiliumNode for the operator.
    eventually("spec.ipam.pools.requested", || {
        let requested = jsonpath(&cp, "ciliumnode", &name, "{.spec.ipam.pools.requested}");
        requested.contains("\"default\"") && requested.contains("\"mars\"")
    });
}

#[test]
fn crd_mode_serves_the_single_ips_an_external_ipam_writes_and_reports_them_used() {
    let Some(cp) = ControlPlane::start("k8s_crd_mode") else {
        return;
    };
    cp.install_crds();
    let ns = cp.add_node_ns("crd-1");
    create_node(&cp, &ns, &[]);
    let name = ns.name.clone();
    let mut node = k8s_node(ns, &cp.kubeconfig(), &["--ipam", "crd"]);
    node.spawn_daemon();
    eventually("Cilium's waiting message", || {
        node.log().contains(&format!(
            "initial IP to become available in '{name}' custom resource"
        ))
    });
    // The external IPAM hands the node five addresses (its own field manager):
    // the router, the health endpoint and the two pods leave one free (a full
    // node would also write its Node's exhaustion taint).
    cp.kubectl_stdin(
        &["apply", "--server-side", "--field-manager", "external-ipam", "-f", "-"],
        &format!(
            "apiVersion: cilium.io/v2\nkind: CiliumNode\nmetadata: {{name: {name}}}\nspec:\n  ipam:\n    pool:\n      10.90.1.10: {{resource: eni-1}}\n      10.90.1.11: {{resource: eni-1}}\n      10.90.1.12: {{resource: eni-1}}\n      10.90.1.13: {{resource: eni-1}}\n      10.90.1.14: {{resource: eni-1}}\n"
        ),
    )
    .expect_ok("the external IPAM's addresses");
    node.wait_ready();
    let sb = node.sandbox();
    let r = node.add(&sb);
    assert!(r.ok, "{}", r.stdout);
    assert!(r.ipv4().starts_with("10.90.1.1"), "{}", r.ipv4());
    eventually("status.ipam.used to list the pod", || {
        jsonpath(&cp, "ciliumnode", &name, "{.status.ipam.used}").contains(&r.ipv4())
    });
    // One more pod, one write: the agent's status apply comes back through its
    // watch and is not applied again (it was: two writes for every change).
    // Two update intervals before and after, as in `writes_for`.
    std::thread::sleep(Duration::from_millis(2500));
    let before = api_writes(&cp);
    let sb = node.sandbox();
    let r2 = node.add(&sb);
    assert!(r2.ok, "{}", r2.stdout);
    eventually("status.ipam.used to list the second pod", || {
        jsonpath(&cp, "ciliumnode", &name, "{.status.ipam.used}").contains(&r2.ipv4())
    });
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(api_writes(&cp) - before, 1, "writes for one pod's ADD");
    // The external IPAM's field is still its own.
    assert!(jsonpath(&cp, "ciliumnode", &name, "{.spec.ipam.pool}").contains("10.90.1.13"));
}
