//! ClusterNetworkPolicy (`--enable-cluster-network-policy`) against a real
//! kube-apiserver with the CRD of deploy/crds (v1beta1): two pods attached by
//! the plugin on a node whose daemon watches the API with the agent's own
//! service-account token (deploy/agent-rbac.yaml), real ICMP between them.
//! A NetworkPolicy lets the client reach web; an Admin Deny of the client
//! beats it; made a Pass, it hands over to the NetworkPolicy, which allows; a
//! Baseline Deny of everyone loses to the NetworkPolicy and decides once the
//! NetworkPolicy is gone; `podnet explain` lists the tiers in that order. An
//! object podnet cannot enforce (a `domainNames` peer: no DNS-based peers yet)
//! is reported in `podnet status` and the metric, and opens nothing; so is a
//! named port no pod has, with one Event however many agents see it. An agent started before the CRD
//! enforces NetworkPolicy alone, says it waits for the CRD, and enforces the
//! ClusterNetworkPolicies once it is installed from `podnet crds`. An Admin
//! Deny's drop is seen by `podnet observe` naming the policy, tier and rule; in
//! audit mode it passes, reported as `audit`. The operator (with its own
//! service-account token, deploy/operator.yaml) writes each policy's
//! `podnet.io/Enforced` condition and posts each problem once for the cluster,
//! not again after a new leader takes over; conditions removed behind its back
//! are written again, without a second Event.

use std::time::Duration;

use super::observe::{Observer, audited_ping, metric, udp};
use crate::harness::*;
use crate::k8s::ControlPlane;
use crate::k8s_backend::{
    POLICY_AGENT_ARGS, add_with_uid, create_node, create_sandbox_pods, eventually, k8s_node,
};
use crate::operator::{Operator, install_operator, wait_for};

/// A ClusterNetworkPolicy of web (`app=web` in any namespace).
fn cnp(name: &str, tier: &str, rules: &str) -> String {
    format!(
        "apiVersion: policy.networking.k8s.io/v1beta1\nkind: ClusterNetworkPolicy\nmetadata:\n  name: {name}\nspec:\n  tier: {tier}\n  priority: 10\n  subject:\n    pods:\n      namespaceSelector: {{}}\n      podSelector:\n        matchLabels:\n          app: web\n{rules}"
    )
}

/// One ingress rule of `action` from the client (`role=client`).
fn from_client(action: &str) -> String {
    format!(
        "  ingress:\n  - action: {action}\n    from:\n    - pods:\n        namespaceSelector: {{}}\n        podSelector:\n          matchLabels:\n            role: client\n"
    )
}

const NP_ALLOW_CLIENT: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: web-from-client\n  namespace: default\nspec:\n  podSelector:\n    matchLabels:\n      app: web\n  ingress:\n  - from:\n    - podSelector:\n        matchLabels:\n          role: client\n";

const NP_DENY_WEB_EGRESS: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: web-no-egress\n  namespace: default\nspec:\n  podSelector:\n    matchLabels:\n      app: web\n  policyTypes: [Egress]\n";

/// Node `name` (pod CIDR `cidr`) whose daemon enforces NetworkPolicy and
/// ClusterNetworkPolicy with the agent's own service-account token (its RBAC,
/// deploy/agent-rbac.yaml, lists and watches the ClusterNetworkPolicies and
/// posts the Events), and two pods attached by the plugin: web (`app=web`)
/// and client (`role=client`), Running with their addresses. The node, web,
/// client and their addresses.
fn web_and_client(
    cp: &ControlPlane,
    name: &str,
    cidr: &str,
) -> (Node, Sandbox, Sandbox, Vec<String>) {
    let node = policy_node(cp, name, cidr);
    let node_name = node.ns.name.clone();
    let sandboxes = [node.sandbox(), node.sandbox()];
    create_sandbox_pods(cp, &node_name, &sandboxes);
    let ips: Vec<String> = sandboxes
        .iter()
        .map(|sb| add_with_uid(cp, &node, sb).ipv4())
        .collect();
    let [web, client] = sandboxes;
    for (sb, label, ip) in [
        (&web, "app=web", &ips[0]),
        (&client, "role=client", &ips[1]),
    ] {
        cp.kubectl(&["label", "pod", &sb.ns.name, label])
            .expect_ok("label the pod");
        cp.set_pod_ip(&sb.ns.name, ip);
    }
    (node, web, client, ips)
}

/// Node `name` (pod CIDR `cidr`) whose daemon enforces NetworkPolicy and
/// ClusterNetworkPolicy with the agent's own service-account token, no pod yet.
fn policy_node(cp: &ControlPlane, name: &str, cidr: &str) -> Node {
    let ns = cp.add_node_ns(name);
    create_node(cp, &ns, &[cidr]);
    let agent = cp.agent_kubeconfig_on(&ns.name);
    let mut node = k8s_node(ns, &agent, &POLICY_AGENT_ARGS);
    node.start_daemon();
    node
}

#[test]
fn admin_deny_beats_networkpolicy_pass_hands_over_and_baseline_deny_loses() {
    let Some(cp) = ControlPlane::start("k8s_cluster_policy") else {
        return;
    };
    cp.install_crds();
    let (node, web, client, ips) = web_and_client(&cp, "cnp-1", "10.244.19.0/24");
    let (web_ip, client_ip) = (&ips[0], &ips[1]);
    let status_has = |node: &Node, what: &str| node.podnet(&["status"]).contains(what);
    eventually("the ClusterNetworkPolicy watch", || {
        status_has(
            &node,
            "ClusterNetworkPolicy: 0 ClusterNetworkPolicies (policy.networking.k8s.io/v1beta1)",
        )
    });

    cp.apply(NP_ALLOW_CLIENT);
    eventually("the NetworkPolicy written", || {
        status_has(&node, "1 NetworkPolicies, 1 local pods enforced")
    });
    assert!(client.ping(web_ip), "the NetworkPolicy allows the client");

    // Admin Deny beats the NetworkPolicy's allow, and explain says so.
    cp.apply(&cnp("admin-web", "Admin", &from_client("Deny")));
    eventually("the Admin Deny enforced", || !client.ping(web_ip));
    let explained = node.podnet(&["explain", web_ip]);
    for line in [
        "Ingress:  first the Admin tier (admin-web); then isolated: only what default/web-from-client allows",
        "    Admin admin-web (priority 10): rule 0: Deny from pods role=client of every namespace on any port",
        "    default/web-from-client: from pods role=client of default on any port",
    ] {
        assert!(explained.contains(line), "{line:?} in:\n{explained}");
    }

    // Pass hands over to the NetworkPolicy, which allows.
    cp.apply(&cnp("admin-web", "Admin", &from_client("Pass")));
    eventually("the Pass enforced", || client.ping(web_ip));
    let m = node.metrics();
    assert!(m.contains("podnet_policy_problems 0"), "{m}");

    // A Baseline Deny of everyone loses to the NetworkPolicy's allow ...
    cp.kubectl(&["delete", "clusternetworkpolicy", "admin-web"])
        .expect_ok("delete the Admin policy");
    let deny_all = "  ingress:\n  - action: Deny\n    from:\n    - namespaces: {}\n";
    cp.apply(&cnp("baseline-web", "Baseline", deny_all));
    eventually("the Baseline policy seen", || {
        status_has(
            &node,
            "ClusterNetworkPolicy: 1 ClusterNetworkPolicies (policy.networking.k8s.io/v1beta1)",
        )
    });
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert!(
        client.ping(web_ip),
        "the NetworkPolicy decides before the Baseline"
    );
    let explained = node.podnet(&["explain", web_ip]);
    let not_reached =
        "the Baseline tier (baseline-web) is not reached: NetworkPolicy isolates the pod";
    assert!(explained.contains(not_reached), "{explained}");
    // ... and decides without it.
    cp.kubectl(&["delete", "networkpolicy", "web-from-client"])
        .expect_ok("delete the NetworkPolicy");
    eventually("the Baseline Deny enforced", || !client.ping(web_ip));
    cp.kubectl(&["delete", "clusternetworkpolicy", "baseline-web"])
        .expect_ok("delete the Baseline policy");
    eventually("open again", || client.ping(web_ip));

    // An object podnet cannot enforce: reported, and it opens nothing.
    cp.apply(NP_DENY_WEB_EGRESS);
    eventually("web's egress denied", || !web.ping(client_ip));
    let dns = "  egress:\n  - action: Accept\n    to:\n    - domainNames: [example.com]\n";
    cp.apply(&cnp("dns-web", "Admin", dns));
    let problem = "ClusterNetworkPolicy dns-web, spec.egress[0].to[0].domainNames: domainNames is not enforced by podnet";
    eventually("the problem in podnet status", || {
        status_has(&node, problem)
    });
    let m = node.metrics();
    assert!(m.contains("podnet_policy_problems 1"), "{m}");
    assert!(!web.ping(client_ip), "the problem rule opens nothing");
    // A named port no pod has: reported, naming the field.
    let misspelled = "  ingress:\n  - action: Deny\n    from:\n    - namespaces: {}\n    protocols:\n    - destinationNamedPort: htp\n";
    cp.apply(&cnp("named-web", "Admin", misspelled));
    let problem = "ClusterNetworkPolicy named-web, spec.ingress[0].protocols[0].destinationNamedPort: no pod has a container port named \"htp\"";
    eventually("the named port's problem in podnet status", || {
        status_has(&node, problem)
    });
    // The agents post the named port's Event (it depends on the pods), once
    // for the cluster: a second node's agent sees the same problem and finds
    // the Event posted. The operator posts the object's own problems (the
    // test below).
    let other = policy_node(&cp, "cnp-1b", "10.244.20.0/24");
    eventually("the second agent sees the named port's problem", || {
        status_has(&other, problem)
    });
    eventually("the named port's Event", || {
        let events = cp
            .kubectl(&[
                "get",
                "events",
                "-A",
                "--field-selector",
                "reason=PolicyProblem",
            ])
            .expect_ok("get events");
        events.contains("named-web") && !events.contains("dns-web")
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(problem_events(&cp, "named-web"), 1, "one Event, two agents");
}

#[test]
fn the_crd_installed_after_the_agent_started_is_waited_for_and_then_enforced() {
    let Some(cp) = ControlPlane::start("k8s_cluster_policy_late_crd") else {
        return;
    };
    cp.install_crds();
    cp.kubectl(&[
        "delete",
        "crd",
        "clusternetworkpolicies.policy.networking.k8s.io",
    ])
    .expect_ok("delete the ClusterNetworkPolicy CRD");
    let (node, _web, client, ips) = web_and_client(&cp, "cnp-2", "10.244.20.0/24");
    let web_ip = &ips[0];
    let status_has = |node: &Node, what: &str| node.podnet(&["status"]).contains(what);
    // No CRD: NetworkPolicy is enforced alone, and the status says what is awaited.
    eventually("the CRD awaited", || {
        status_has(
            &node,
            "ClusterNetworkPolicy: CRD clusternetworkpolicies.policy.networking.k8s.io not installed",
        )
    });
    assert!(status_has(&node, "Policy:     table written"));
    cp.apply(NP_ALLOW_CLIENT);
    eventually("the NetworkPolicy written without the CRD", || {
        status_has(&node, "1 NetworkPolicies, 1 local pods enforced")
    });
    assert!(client.ping(web_ip));

    // Installed as `podnet crds | kubectl apply -f -` does (the Cilium CRDs
    // it prints too are there already: unchanged).
    let printed = std::process::Command::new(podnet_bin())
        .arg("crds")
        .output()
        .expect("podnet crds");
    assert!(printed.status.success(), "podnet crds: {printed:?}");
    let crds = node.dir.join("crds.yaml");
    std::fs::write(&crds, &printed.stdout).expect("write the printed CRDs");
    cp.install_crd_files(&crds, &["clusternetworkpolicies.policy.networking.k8s.io"]);
    eventually(
        "the ClusterNetworkPolicy watch once the CRD is served",
        || {
            status_has(
                &node,
                "ClusterNetworkPolicy: 0 ClusterNetworkPolicies (policy.networking.k8s.io/v1beta1)",
            )
        },
    );
    cp.apply(&cnp("admin-web", "Admin", &from_client("Deny")));
    eventually("the Admin Deny enforced", || !client.ping(web_ip));
}

#[test]
fn an_admin_deny_is_observed_naming_its_policy_tier_and_rule_and_audit_mode_reports_it() {
    let Some(cp) = ControlPlane::start("k8s_cluster_policy_observe") else {
        return;
    };
    cp.install_crds();
    let (mut node, web, client, ips) = web_and_client(&cp, "cnp-3", "10.244.21.0/24");
    let web_ip = &ips[0];
    let named = from_client("Deny").replacen("  - action", "  - name: deny-client\n    action", 1);
    cp.apply(&cnp("admin-deny-client", "Admin", &named));
    eventually("the Admin Deny enforced", || !client.ping(web_ip));

    let policy =
        "ClusterNetworkPolicy admin-deny-client (Admin tier, ingress rule 0 \"deny-client\")";
    let observer = Observer::start(&node);
    let line = observer.first(|| udp(&client, web_ip, 8080, 1));
    let client_pod = format!("default/{}", client.ns.name);
    let web_pod = format!("default/{}", web.ns.name);
    assert_eq!(line["source"], client_pod.as_str(), "{line}");
    assert_eq!(line["destination"], web_pod.as_str(), "{line}");
    assert_eq!(line["direction"], "ingress", "{line}");
    assert_eq!(line["verdict"], "denied", "{line}");
    assert_eq!(line["policy"], policy, "{line}");
    // The label's quotes are escaped in the exposition.
    let counted = "podnet_policy_verdicts_total{direction=\"ingress\",verdict=\"denied\",policy=\"ClusterNetworkPolicy admin-deny-client (Admin tier, ingress rule 0 ";
    assert!(metric(&node.metrics(), counted) >= 1, "{}", node.metrics());
    drop(observer);

    // Audit mode: the Deny lets the ping through, reported as audit.
    let line = audited_ping(&mut node, &client, web_ip);
    assert_eq!(line["policy"], policy, "{line}");
}

/// The `podnet.io/Enforced` condition of ClusterNetworkPolicy `name`:
/// `status/reason/message/observedGeneration`.
fn enforced(cp: &ControlPlane, name: &str) -> String {
    let field = |f: &str| format!("{{.status.conditions[?(@.type==\"podnet.io/Enforced\")].{f}}}");
    let path = ["status", "reason", "message", "observedGeneration"].map(field);
    let out = cp.kubectl(&[
        "get",
        "clusternetworkpolicy",
        name,
        "-o",
        &format!("jsonpath={}", path.join("/")),
    ]);
    out.stdout.trim().to_string()
}

/// The PolicyProblem Events on ClusterNetworkPolicy `name`.
fn problem_events(cp: &ControlPlane, name: &str) -> usize {
    let selector = format!("reason=PolicyProblem,involvedObject.name={name}");
    let out = cp
        .kubectl(&[
            "get",
            "events",
            "-A",
            "--field-selector",
            &selector,
            "-o",
            "name",
        ])
        .expect_ok("get events");
    out.lines().filter(|l| !l.trim().is_empty()).count()
}

#[test]
fn the_operator_writes_each_policys_condition_and_posts_each_problem_once_for_the_cluster() {
    let Some(cp) = ControlPlane::start("k8s_cluster_policy_status") else {
        return;
    };
    let kubeconfig = install_operator(&cp);
    cp.apply(&cnp("admin-web", "Admin", &from_client("Deny")));
    let dns = "  egress:\n  - action: Accept\n    to:\n    - domainNames: [example.com]\n";
    cp.apply(&cnp("dns-web", "Admin", dns));
    let args = [
        "--cluster-pool-ipv4-cidr",
        "10.93.0.0/16",
        "--enable-cluster-network-policy",
    ];
    let mut leader = Operator::start(&cp, "cnp-status", &kubeconfig, 19611, &args);
    let limit = Duration::from_secs(30);
    wait_for("admin-web's condition", limit, || {
        enforced(&cp, "admin-web") == "True/Enforced/podnet enforces every rule as written/1"
    });
    let problem = "False/Problems/1 problem: spec.egress[0].to[0].domainNames: domainNames is not enforced by podnet; a rule with a problem fails closed (podnet status, Events)/1";
    wait_for("dns-web's condition", limit, || {
        enforced(&cp, "dns-web") == problem
    });
    wait_for("the problem's Event", limit, || {
        problem_events(&cp, "dns-web") == 1
    });
    assert_eq!(problem_events(&cp, "admin-web"), 0);

    // The next leader finds the condition written: no Event again.
    leader.stop();
    let next = Operator::start(&cp, "cnp-status-2", &kubeconfig, 19612, &args);
    wait_for("the next leader's watch", limit, || {
        next.log().contains("ClusterNetworkPolicy status on")
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(problem_events(&cp, "dns-web"), 1, "{}", next.log());

    // The conditions removed behind the leader's back: written again, and the
    // problem, posted already, is not posted again.
    for name in ["admin-web", "dns-web"] {
        cp.kubectl(&[
            "patch",
            "clusternetworkpolicy",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"conditions":[]}}"#,
        ])
        .expect_ok("remove the conditions");
    }
    wait_for("admin-web's condition again", limit, || {
        enforced(&cp, "admin-web") == "True/Enforced/podnet enforces every rule as written/1"
    });
    wait_for("dns-web's condition again", limit, || {
        enforced(&cp, "dns-web") == problem
    });
    assert_eq!(problem_events(&cp, "dns-web"), 1, "{}", next.log());

    // Fixed: enforced as written, at its new generation.
    let networks = "  egress:\n  - action: Accept\n    to:\n    - networks: [10.0.0.0/8]\n";
    cp.apply(&cnp("dns-web", "Admin", networks));
    wait_for("dns-web enforced", limit, || {
        enforced(&cp, "dns-web") == "True/Enforced/podnet enforces every rule as written/2"
    });
}
