//! deploy/agent-rbac.yaml's admission policies on a real API server
//! (docs/least-privilege.md): an agent's token, bound to its pod, writes only its
//! own node's CiliumNode, and changes on its own Node only the exhaustion taint
//! and its annotation; the operator is not affected.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::*;
use crate::k8s::{ControlPlane, KubectlOutput};

/// One write by kubectl: what it is, its arguments, its stdin.
struct Write {
    what: &'static str,
    args: Vec<String>,
    stdin: Option<String>,
}

/// The writes an agent makes to `node`'s CiliumNode, each marking it with `by`: a
/// merge patch (a label), a merge patch of the status subresource, and a
/// server-side apply as the agent's field manager (an annotation).
fn writes(node: &str, by: &str) -> Vec<Write> {
    let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let label = format!(r#"{{"metadata":{{"labels":{{"podnet-test/by":"{by}"}}}}}}"#);
    let used = r#"{"status":{"ipam":{"used":{"10.20.1.5":{"owner":"default/p"}}}}}"#;
    vec![
        Write {
            what: "merge patch",
            args: words(&["patch", "cn", node, "--type=merge", "-p", &label]),
            stdin: None,
        },
        Write {
            what: "status patch",
            args: words(&[
                "patch",
                "cn",
                node,
                "--subresource=status",
                "--type=merge",
                "-p",
                used,
            ]),
            stdin: None,
        },
        Write {
            what: "server-side apply",
            args: words(&[
                "apply",
                "--server-side",
                "--field-manager=podnet-agent",
                "-f",
                "-",
            ]),
            stdin: Some(format!(
                "apiVersion: cilium.io/v2\nkind: CiliumNode\nmetadata:\n  name: {node}\n  \
                 annotations: {{podnet-test/applied-by: {by}}}\n"
            )),
        },
    ]
}

/// A CiliumNode as the admin reads it.
fn get_json(cp: &ControlPlane, name: &str) -> Value {
    let text = cp
        .kubectl(&["get", "cn", name, "-o", "json"])
        .expect_ok("get cn");
    serde_json::from_str(&text).expect("CiliumNode JSON")
}

fn ciliumnode(name: &str, ip: &str) -> String {
    format!(
        "apiVersion: cilium.io/v2\nkind: CiliumNode\nmetadata:\n  name: {name}\n\
         spec:\n  addresses:\n  - {{type: InternalIP, ip: {ip}}}\n"
    )
}

/// The message of deploy/agent-rbac.yaml's policy for an agent of `own` writing `other`.
fn not_yours(own: &str, other: &str) -> String {
    format!("podnet-agent on node {own} may write only CiliumNode {own}, not {other}")
}

/// Asserts that the API server refused `out` with the policy's message `msg`.
fn refused(out: KubectlOutput, what: &str, msg: &str) {
    assert!(
        out.forbidden() && out.stderr.contains(msg),
        "{what}: expected the policy's refusal ({msg}), got {out:?}"
    );
}

/// The policies load asynchronously, and the agent's RBAC grant too: repeats
/// `dry_run` (a `--dry-run=server` write: admission runs, nothing is stored) until
/// the API server refuses it with the policy's message `msg`. Until then it may
/// pass (the policy not loaded yet) or be refused by RBAC (the ClusterRoleBinding
/// not yet in the authorizer's cache), and either is retried.
fn wait_until_refused(msg: &str, mut dry_run: impl FnMut() -> KubectlOutput) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = dry_run();
        if out.forbidden() && out.stderr.contains(msg) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the admission policy did not refuse with {msg:?} within 30 s; last answer: {out:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// deploy/agent-rbac.yaml on a real API server: a podnet-agent token bound to a pod
/// on node A (as the kubelet mounts it) carries A's name; with it, every kind of
/// write to node B's CiliumNode (merge patch, update, server-side apply, the
/// status subresource, creating another node's) is refused with the policy's
/// message and changes nothing, and the same writes to A's own succeed. A
/// podnet-agent token bound to no pod writes no CiliumNode; the operator's token
/// writes B's as before.
#[test]
fn agent_token_writes_only_its_own_nodes_ciliumnode() {
    const TEST: &str = "agent_token_writes_only_its_own_nodes_ciliumnode";
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    cp.install_crds();
    for file in ["deploy/agent-rbac.yaml", "deploy/operator.yaml"] {
        let path = repo_path(file);
        cp.kubectl(&["apply", "-f", &path.to_string_lossy()])
            .expect_ok(file);
    }
    let (a, b) = ("lp-node-a", "lp-node-b");
    for node in [a, b] {
        cp.apply(&format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: {node}}}\n"
        ));
    }
    // Created, not applied: a client-side apply's annotation would make kubectl's
    // server-side applies below take over (and then drop) the spec.
    for (node, ip) in [(a, "10.250.0.11"), (b, "10.250.0.12")] {
        cp.kubectl_stdin(&["create", "-f", "-"], &ciliumnode(node, ip))
            .expect_ok("create CiliumNode");
    }
    // The agent's pod on node A (no kubelet: the object is enough to bind a token).
    cp.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: podnet-agent-a, namespace: kube-system}}\n\
         spec:\n  nodeName: {a}\n  serviceAccountName: podnet-agent\n\
         \x20 containers: [{{name: agent, image: ghcr.io/podnet/podnet:0.1.0}}]\n"
    ));
    let agent = cp.pod_token_kubeconfig("kube-system", "podnet-agent", "podnet-agent-a");
    let unbound = cp.token_kubeconfig("kube-system", "podnet-agent");
    let operator = cp.token_kubeconfig("kube-system", "podnet-operator");
    let client = cp.add_node_ns(a);
    let run = |kc: &Path, args: &[&str]| cp.kubectl_as(&client.ns, kc, args, None);
    let write = |kc: &Path, w: &Write| {
        let args: Vec<&str> = w.args.iter().map(String::as_str).collect();
        cp.kubectl_as(&client.ns, kc, &args, w.stdin.as_deref())
    };

    // The bound token names the pod's node (ServiceAccountTokenPodNodeInfo).
    let who: Value = serde_json::from_str(
        &run(&agent, &["auth", "whoami", "-o", "json"]).expect_ok("auth whoami"),
    )
    .expect("whoami JSON");
    assert_eq!(
        who["status"]["userInfo"]["extra"]["authentication.kubernetes.io/node-name"],
        serde_json::json!([a]),
        "{who}"
    );

    // The policy is loaded asynchronously: wait with a dry run (admission runs,
    // nothing is stored) until it refuses.
    let b_msg = not_yours(a, b);
    let mut probe = writes(b, "dry-run").swap_remove(0);
    probe.args.push("--dry-run=server".into());
    wait_until_refused(&b_msg, || write(&agent, &probe));

    // Node B's CiliumNode: every write refused, nothing changed.
    for w in writes(b, "agent-a") {
        refused(write(&agent, &w), w.what, &b_msg);
    }
    let mut obj = get_json(&cp, b);
    obj["metadata"]["labels"] = serde_json::json!({"podnet-test/by": "agent-a"});
    let update = Write {
        what: "update",
        args: vec!["replace".into(), "-f".into(), "-".into()],
        stdin: Some(obj.to_string()),
    };
    refused(write(&agent, &update), "update of B", &b_msg);
    let create = Write {
        what: "create",
        args: vec!["create".into(), "-f".into(), "-".into()],
        stdin: Some(ciliumnode("lp-node-c", "10.250.0.13")),
    };
    refused(
        write(&agent, &create),
        "create of another node's",
        &not_yours(a, "lp-node-c"),
    );
    let b_now = get_json(&cp, b);
    assert!(
        b_now["metadata"]["labels"].is_null()
            && b_now["metadata"]["annotations"]["podnet-test/applied-by"].is_null(),
        "B changed: {b_now}"
    );
    assert!(b_now["status"].is_null(), "B's status changed: {b_now}");
    assert_eq!(b_now["spec"]["addresses"][0]["ip"], "10.250.0.12");

    // Its own: the same writes succeed.
    for w in writes(a, "agent-a") {
        write(&agent, &w).expect_ok(w.what);
    }
    let a_now = get_json(&cp, a);
    assert_eq!(a_now["metadata"]["labels"]["podnet-test/by"], "agent-a");
    assert_eq!(
        a_now["status"]["ipam"]["used"]["10.20.1.5"]["owner"],
        "default/p"
    );
    assert_eq!(
        a_now["metadata"]["annotations"]["podnet-test/applied-by"],
        "agent-a"
    );

    // A podnet-agent token bound to no pod names no node: no CiliumNode write.
    for w in writes(a, "unbound") {
        refused(write(&unbound, &w), w.what, "this token names none");
    }

    // The operator writes every node's, spec and status.
    for w in writes(b, "operator") {
        write(&operator, &w).expect_ok(w.what);
    }
    assert_eq!(
        get_json(&cp, b)["metadata"]["labels"]["podnet-test/by"],
        "operator"
    );
}

/// The taint and annotation the agent puts on its own Node while no new pod can
/// get an address there (src/node/kubernetes/taint.rs).
const EXHAUSTED: &str = "podnet.io/addresses-exhausted";

/// A merge patch of a Node's taints (the whole list) and annotations.
fn node_patch(node: &str, taints: Value, annotations: Value) -> Vec<String> {
    let body = serde_json::json!({
        "metadata": {"annotations": annotations},
        "spec": {"taints": taints},
    });
    [
        "patch",
        "node",
        node,
        "--type=merge",
        "-p",
        &body.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// deploy/agent-rbac.yaml's second policy on a real API server: with its
/// pod-bound token, an agent on node A adds and removes the exhaustion taint
/// (NoSchedule) and its annotation on A, keeping A's other taints; it cannot
/// taint node B, put the taint on A with another effect, add, drop or change
/// another taint, annotation or label of A, or cordon A. A token bound to no
/// pod changes no Node.
#[test]
fn agent_token_marks_only_its_own_node_and_only_as_exhausted() {
    const TEST: &str = "agent_token_marks_only_its_own_node_and_only_as_exhausted";
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    let path = repo_path("deploy/agent-rbac.yaml");
    cp.kubectl(&["apply", "-f", &path.to_string_lossy()])
        .expect_ok("deploy/agent-rbac.yaml");
    let (a, b) = ("taint-node-a", "taint-node-b");
    // The Nodes' own taints: one of an admin's, and the one the API server's
    // admission puts on a new Node (here from the start: it adds none then).
    let gpu = serde_json::json!({"key": "dedicated", "value": "gpu", "effect": "NoSchedule"});
    let not_ready =
        serde_json::json!({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"});
    let with = |extra: &[&Value]| -> Value {
        let mut all = vec![gpu.clone(), not_ready.clone()];
        all.extend(extra.iter().map(|t| (*t).clone()));
        Value::Array(all)
    };
    for node in [a, b] {
        cp.apply(&format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {node}\n  labels: {{zone: z1}}\n  \
             annotations: {{owner: infra}}\nspec:\n  taints:\n  - {{key: dedicated, value: gpu, effect: NoSchedule}}\n  \
             - {{key: node.kubernetes.io/not-ready, effect: NoSchedule}}\n"
        ));
    }
    cp.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: podnet-agent-a, namespace: kube-system}}\n\
         spec:\n  nodeName: {a}\n  serviceAccountName: podnet-agent\n\
         \x20 containers: [{{name: agent, image: ghcr.io/podnet/podnet:0.1.0}}]\n"
    ));
    let agent = cp.pod_token_kubeconfig("kube-system", "podnet-agent", "podnet-agent-a");
    let unbound = cp.token_kubeconfig("kube-system", "podnet-agent");
    let client = cp.add_node_ns(a);
    let as_agent = |kc: &Path, args: &[String]| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cp.kubectl_as(&client.ns, kc, &args, None)
    };
    let ours = serde_json::json!({"key": EXHAUSTED, "effect": "NoSchedule"});
    let why = serde_json::json!({EXHAUSTED: "ipv4 range 10.244.1.0/24 of node taint-node-a is exhausted"});
    let exhausted = |node: &str| node_patch(node, with(&[&ours]), why.clone());

    // The policy loads asynchronously: a dry run (admission runs, nothing is
    // stored) until it refuses the write to B.
    let not_b = format!("podnet-agent on node {a} may change only Node {a}, not {b}");
    let mut probe = exhausted(b);
    probe.push("--dry-run=server".into());
    wait_until_refused(&not_b, || as_agent(&agent, &probe));

    refused(as_agent(&agent, &exhausted(b)), "tainting B", &not_b);
    let only = "only the taint and annotation podnet.io/addresses-exhausted";
    let no_annotation = serde_json::json!({});
    let not_allowed = [
        (
            "the taint with NoExecute",
            node_patch(
                a,
                with(&[&serde_json::json!({"key": EXHAUSTED, "effect": "NoExecute"})]),
                no_annotation.clone(),
            ),
        ),
        (
            "another taint added",
            node_patch(
                a,
                with(&[
                    &ours,
                    &serde_json::json!({"key": "evict-me", "effect": "NoExecute"}),
                ]),
                no_annotation.clone(),
            ),
        ),
        (
            "the other taint dropped",
            node_patch(
                a,
                serde_json::json!([not_ready, ours]),
                no_annotation.clone(),
            ),
        ),
        (
            "another annotation changed",
            node_patch(a, with(&[]), serde_json::json!({"owner": "agent"})),
        ),
        (
            "another annotation removed",
            node_patch(a, with(&[]), serde_json::json!({"owner": null})),
        ),
        (
            "a label",
            ["label", "node", a, "zone=z2", "--overwrite"]
                .map(String::from)
                .to_vec(),
        ),
        (
            // (kubectl cordon exits 0 when the patch is refused.)
            "a cordon",
            [
                "patch",
                "node",
                a,
                "--type=merge",
                "-p",
                r#"{"spec":{"unschedulable":true}}"#,
            ]
            .map(String::from)
            .to_vec(),
        ),
    ];
    for (what, args) in &not_allowed {
        refused(as_agent(&agent, args), what, only);
    }
    refused(
        as_agent(&unbound, &exhausted(a)),
        "a token bound to no pod",
        "this token names none",
    );
    let node_json = |name: &str| -> Value {
        serde_json::from_str(
            &cp.kubectl(&["get", "node", name, "-o", "json"])
                .expect_ok("get node"),
        )
        .expect("Node JSON")
    };
    for name in [a, b] {
        let node = node_json(name);
        assert_eq!(node["spec"]["taints"], with(&[]), "{name}: {node}");
        assert_eq!(node["metadata"]["labels"]["zone"], "z1", "{name}");
        assert_eq!(node["metadata"]["annotations"]["owner"], "infra", "{name}");
        assert!(node["spec"]["unschedulable"].is_null(), "{name}: {node}");
    }

    // Its own Node: the taint and the reason on, then off; the rest stays.
    as_agent(&agent, &exhausted(a)).expect_ok("tainting A");
    let node = node_json(a);
    assert_eq!(node["spec"]["taints"], with(&[&ours]));
    assert_eq!(node["metadata"]["annotations"][EXHAUSTED], why[EXHAUSTED]);
    as_agent(
        &agent,
        &node_patch(a, with(&[]), serde_json::json!({EXHAUSTED: null})),
    )
    .expect_ok("untainting A");
    let node = node_json(a);
    assert_eq!(node["spec"]["taints"], with(&[]));
    assert!(
        node["metadata"]["annotations"][EXHAUSTED].is_null(),
        "{node}"
    );
    assert_eq!(node["metadata"]["annotations"]["owner"], "infra");
}
