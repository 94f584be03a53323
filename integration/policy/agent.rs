//! The agent's policy loop (`--enable-policy default`) against a real
//! kube-apiserver (integration/k8s.rs): two pods attached by the plugin on a
//! node whose daemon watches the API; a NetworkPolicy created through the API
//! that default-denies ingress for one of them puts that pod's chain into the
//! node's table and the other pod's ping goes unanswered while the denied pod's
//! own ping gets its reply (`podnet status` and the metrics say what is
//! enforced, and `podnet explain` which policy selects which pod and what it
//! allows); the table stays while the agent is stopped; deleting
//! the policy takes the chain out and the ping is answered again; an agent
//! started with `--enable-policy never` removes the table. With the API server
//! stopped the table stands; once it is back the policy deleted is applied.

use crate::harness::*;
use crate::k8s::ControlPlane;
use crate::k8s_backend::{add_with_uid, create_sandbox_pods, eventually, policy_agent};

/// `nft list table inet podnet_policy` in the node's namespace (None: no table).
fn table(node: &Node) -> Option<String> {
    let out = node
        .ns
        .exec(&["nft", "list", "table", "inet", "podnet_policy"]);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).to_string())
}

#[test]
fn a_policy_created_in_the_api_is_enforced_on_its_pods_link_and_deleting_it_opens_it() {
    let Some(cp) = ControlPlane::start("k8s_policy_agent") else {
        return;
    };
    let (mut node, node_name) = policy_agent(&cp, "policy-1", "10.244.7.0/24");

    let sandboxes = [node.sandbox(), node.sandbox()];
    create_sandbox_pods(&cp, &node_name, &sandboxes);
    let ips: Vec<String> = sandboxes
        .iter()
        .map(|sb| add_with_uid(&cp, &node, sb).ipv4())
        .collect();
    let [web, client] = sandboxes;
    let (web_ip, client_ip) = (&ips[0], &ips[1]);
    let web_link = podnet::datapath::host_ifname(&web.container_id, &web.ifname);
    let chain = format!("chain ingress_{web_link}");
    cp.kubectl(&["label", "pod", &web.ns.name, "app=web"])
        .expect_ok("label web");

    // Once the watches have listed, the table is installed (no pod selected yet).
    eventually("the policy table", || table(&node).is_some());
    assert!(client.ping(web_ip), "open before any policy");

    cp.apply(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: web-deny\n  namespace: default\nspec:\n  podSelector:\n    matchLabels:\n      app: web\n  policyTypes: [Ingress]\n",
    );
    eventually("web's ingress chain", || {
        table(&node).is_some_and(|t| t.contains(&chain))
    });
    eventually("the policy line of podnet status", || {
        node.podnet(&["status"]).contains(
            "Policy:     table written; 1 NetworkPolicies, 1 local pods enforced, 0 problems",
        )
    });
    assert!(!client.ping(web_ip), "client -> web under default deny");
    assert!(web.ping(client_ip), "web's own ping gets its reply");
    let m = node.metrics();
    assert!(m.contains("podnet_policy_pods_enforced 1"), "{m}");
    assert!(
        m.contains("podnet_policy_updates_total{result=\"installed\"} 1"),
        "{m}"
    );
    assert!(m.contains("podnet_policy_problems 0"), "{m}");
    assert!(
        m.contains("podnet_policy_write_duration_seconds_count{result=\"installed\"} 1"),
        "{m}"
    );
    let web_pod = format!("default/{}", web.ns.name);
    let explained = node.podnet(&["explain", web_ip]);
    for line in [
        format!("NetworkPolicy for {web_pod}: ingress isolated: only what default/web-deny allows"),
        "egress open: no NetworkPolicy selects it for egress".into(),
        format!("Policy:     {web_pod}"),
        "    default/web-deny: nothing".into(),
    ] {
        assert!(explained.contains(&line), "{line:?} in:\n{explained}");
    }
    let explained = node.podnet(&["explain", client_ip]);
    assert!(
        explained.contains("ingress open: no NetworkPolicy selects it for ingress"),
        "{explained}"
    );

    // The table outlives the agent.
    node.stop_daemon(false);
    assert!(
        table(&node).is_some_and(|t| t.contains(&chain)),
        "the table stays while the agent is stopped"
    );
    assert!(!client.ping(web_ip), "still denied without the agent");
    node.start_daemon();

    cp.kubectl(&["delete", "networkpolicy", "web-deny"])
        .expect_ok("delete the policy");
    eventually("web's chain gone", || {
        table(&node).is_some_and(|t| !t.contains(&chain))
    });
    assert!(client.ping(web_ip), "open again");

    // --enable-policy never takes podnet's table out.
    node.stop_daemon(false);
    node.args.extend(["--enable-policy".into(), "never".into()]);
    node.start_daemon();
    assert_eq!(table(&node), None, "no table with --enable-policy never");
}

#[test]
fn the_table_stands_while_the_api_server_is_gone_and_the_latest_state_follows_it_back() {
    let Some(mut cp) = ControlPlane::start("k8s_policy_api_gone") else {
        return;
    };
    let (node, node_name) = policy_agent(&cp, "policy-2", "10.244.8.0/24");
    let sandboxes = [node.sandbox()];
    create_sandbox_pods(&cp, &node_name, &sandboxes);
    add_with_uid(&cp, &node, &sandboxes[0]);
    let [web] = sandboxes;
    let chain = format!(
        "chain ingress_{}",
        podnet::datapath::host_ifname(&web.container_id, &web.ifname)
    );
    cp.apply(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: deny-all\n  namespace: default\nspec:\n  podSelector: {}\n",
    );
    eventually("web's chain", || {
        table(&node).is_some_and(|t| t.contains(&chain))
    });
    let written = table(&node);

    cp.stop_apiserver(true);
    std::thread::sleep(std::time::Duration::from_secs(5));
    assert_eq!(
        table(&node),
        written,
        "the table stands while the API server is gone"
    );
    cp.start_apiserver();
    cp.kubectl(&["delete", "networkpolicy", "deny-all"])
        .expect_ok("delete the policy");
    eventually("the watches back, the chain gone", || {
        table(&node).is_some_and(|t| !t.contains(&chain))
    });
    let m = node.metrics();
    assert!(
        !m.contains("podnet_policy_updates_total{result=\"failed\"}"),
        "{m}"
    );
}
