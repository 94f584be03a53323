//! LB IPAM in `podnet operator` on a real kube-apiserver and etcd
//! (integration/k8s.rs), the operator running as the real binary with the
//! least-privilege ServiceAccount of deploy/operator.yaml. The chapter's Lab 4
//! without the announcement part: a pool with a small start/stop block and a
//! selector, a matching Service gets an address (condition satisfied, IPs
//! Available goes down), an overlapping second pool (written as v2alpha1) is
//! Conflicting and allocates nothing, `disabled: true` stops new allocations
//! while the existing Service keeps its address; then sharing keys with and
//! without port conflicts, a requested address, the release on type change and
//! on delete, the metrics, and an operator restart after which every Service
//! keeps its address. Also a pool edit that keeps the addresses still inside the
//! pool and reports the one it orphaned, and a pool podnet cannot use.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::k8s::ControlPlane;
use crate::operator::{Operator, install_operator, wait_for};

const LIMIT: Duration = Duration::from_secs(20);

/// `kubectl get svc -A` as `namespace/name` -> (ingress IPs, satisfied reason).
fn services(cp: &ControlPlane) -> BTreeMap<String, (String, String)> {
    let out = cp
        .kubectl(&[
            "get",
            "svc",
            "-A",
            "-o",
            r#"jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name}{"|"}{.status.loadBalancer.ingress[*].ip}{"|"}{.status.conditions[?(@.type=="cilium.io/IPAMRequestSatisfied")].reason}{"\n"}{end}"#,
        ])
        .expect_ok("get services");
    out.lines()
        .filter_map(|l| {
            let mut f = l.split('|');
            Some((
                f.next()?.to_string(),
                (f.next()?.to_string(), f.next()?.to_string()),
            ))
        })
        .collect()
}

fn service(cp: &ControlPlane, key: &str) -> (String, String) {
    services(cp).remove(key).unwrap_or_default()
}

/// Waits until Service `key` has these addresses (space-separated) and reason.
fn wait_service(cp: &ControlPlane, key: &str, ips: &str, reason: &str) {
    let mut last = Default::default();
    let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(&format!("{key} to have {ips:?} ({reason})"), LIMIT, || {
            last = service(cp, key);
            last == (ips.to_string(), reason.to_string())
        })
    }));
    assert!(
        ok.is_ok(),
        "{key}: wanted ({ips:?}, {reason:?}), last seen {last:?}"
    );
}

/// One field of the condition `kind` of object `name`.
fn condition_field(
    cp: &ControlPlane,
    resource: &str,
    name: &str,
    kind: &str,
    field: &str,
) -> String {
    let path = format!(r#"jsonpath={{.status.conditions[?(@.type=="{kind}")].{field}}}"#);
    cp.kubectl(&["get", resource, name, "-o", &path])
        .expect_ok("get a condition")
}

/// `kubectl get ippool NAME` columns: DISABLED CONFLICTING IPS-AVAILABLE.
fn pool_columns(cp: &ControlPlane, pool: &str) -> String {
    let out = cp
        .kubectl(&["get", "ippool", pool, "--no-headers"])
        .expect_ok("get ippool");
    let words: Vec<&str> = out.split_whitespace().collect();
    words.get(1..4).map(|w| w.join(" ")).unwrap_or(out.clone())
}

fn wait_pool(cp: &ControlPlane, pool: &str, columns: &str) {
    let mut last = String::new();
    let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(&format!("pool {pool} to show {columns:?}"), LIMIT, || {
            last = pool_columns(cp, pool);
            last == columns
        })
    }));
    assert!(
        ok.is_ok(),
        "pool {pool}: wanted {columns:?}, last seen {last:?}"
    );
}

/// A LoadBalancer Service in `default`.
fn lb_service(name: &str, labels: &str, annotations: &str, ports: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\n  labels: {{{labels}}}\n  annotations: {{{annotations}}}\n\
         spec:\n  type: LoadBalancer\n  ports: [{ports}]\n"
    )
}

fn start_operator(cp: &ControlPlane, identity: &str, sa: &std::path::Path) -> Operator {
    Operator::start(
        cp,
        identity,
        sa,
        9981,
        &["--cluster-pool-ipv4-cidr", "10.90.0.0/16"],
    )
}

#[test]
fn lb_ipam_lab4_conflicts_disabled_sharing_requests_and_restart() {
    const TEST: &str = "lbipam_lab4";
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    let sa = install_operator(&cp);
    let mut op = start_operator(&cp, "lb-a", &sa);

    // Dormant until the first pool: a Service made before it is served after it.
    cp.apply(&lb_service("web", "color: blue", "", "{port: 80}"));
    cp.apply(
        "apiVersion: cilium.io/v2\nkind: CiliumLoadBalancerIPPool\nmetadata:\n  name: lab4-blue\n\
         spec:\n  blocks:\n  - start: 10.201.0.100\n    stop: 10.201.0.102\n  serviceSelector:\n    matchLabels: {color: blue}\n",
    );
    wait_service(&cp, "default/web", "10.201.0.100", "satisfied");
    wait_pool(&cp, "lab4-blue", "false False 2");
    let total = condition_field(&cp, "ippool", "lab4-blue", "cilium.io/IPsTotal", "message");
    assert_eq!(total, "3");
    let condition = condition_field(
        &cp,
        "svc",
        "web",
        "cilium.io/IPAMRequestSatisfied",
        "status",
    );
    assert_eq!(condition, "True");

    // A Service the selector does not pick: no_pool, with Cilium's message.
    cp.apply(&lb_service("plain", "", "", "{port: 80}"));
    wait_service(&cp, "default/plain", "", "no_pool");
    let message = condition_field(
        &cp,
        "svc",
        "plain",
        "cilium.io/IPAMRequestSatisfied",
        "message",
    );
    assert_eq!(
        message,
        "There are no enabled CiliumLoadBalancerIPPools that match this service"
    );

    // An overlapping later pool, written as the deprecated v2alpha1: Conflicting,
    // and it allocates nothing (plain, which it would select, stays unserved).
    cp.apply(
        "apiVersion: cilium.io/v2alpha1\nkind: CiliumLoadBalancerIPPool\nmetadata:\n  name: lab4-overlap\n\
         spec:\n  blocks:\n  - cidr: 10.201.0.96/28\n",
    );
    wait_pool(&cp, "lab4-overlap", "false True 16");
    let reason = condition_field(
        &cp,
        "ippool",
        "lab4-overlap",
        "cilium.io/PoolConflict",
        "message",
    );
    assert_eq!(
        reason,
        "Pool conflicts since CIDR '10.201.0.96/28' overlaps CIDR '10.201.0.100-10.201.0.102' from IP Pool 'lab4-blue'"
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(service(&cp, "default/plain"), ("".into(), "no_pool".into()));
    wait_for("the conflict metric", LIMIT, || {
        op.metric("podnet_operator_lbipam_conflicting_pools") == Some(1.0)
    });
    cp.kubectl(&["delete", "ippool", "lab4-overlap"])
        .expect_ok("delete the overlap");

    // disabled: no new allocation; web keeps its address.
    cp.kubectl(&[
        "patch",
        "ippool",
        "lab4-blue",
        "--type=merge",
        "-p",
        r#"{"spec":{"disabled":true}}"#,
    ])
    .expect_ok("disable");
    wait_pool(&cp, "lab4-blue", "true False 2");
    cp.apply(&lb_service("web-2", "color: blue", "", "{port: 80}"));
    wait_service(&cp, "default/web-2", "", "no_pool");
    assert_eq!(
        service(&cp, "default/web"),
        ("10.201.0.100".into(), "satisfied".into())
    );
    cp.kubectl(&[
        "patch",
        "ippool",
        "lab4-blue",
        "--type=merge",
        "-p",
        r#"{"spec":{"disabled":false}}"#,
    ])
    .expect_ok("enable");
    wait_service(&cp, "default/web-2", "10.201.0.101", "satisfied");
    wait_pool(&cp, "lab4-blue", "false False 1");

    // Sharing: http and dns share one address; http-2 (80/TCP again) gets another.
    cp.apply(
        "apiVersion: cilium.io/v2\nkind: CiliumLoadBalancerIPPool\nmetadata:\n  name: shared\n\
         spec:\n  allowFirstLastIPs: \"No\"\n  blocks:\n  - cidr: 10.202.0.0/29\n  serviceSelector:\n    matchLabels: {app: shared}\n",
    );
    let key = "lbipam.cilium.io/sharing-key: vip";
    cp.apply(&lb_service("s-http", "app: shared", key, "{port: 80}"));
    wait_service(&cp, "default/s-http", "10.202.0.1", "satisfied");
    cp.apply(&lb_service(
        "s-dns",
        "app: shared",
        key,
        "{port: 53, protocol: UDP}",
    ));
    wait_service(&cp, "default/s-dns", "10.202.0.1", "satisfied");
    cp.apply(&lb_service("s-http-2", "app: shared", key, "{port: 80}"));
    wait_service(&cp, "default/s-http-2", "10.202.0.2", "satisfied");
    // A requested address; the broadcast of a "No" pool is refused.
    cp.apply(&lb_service(
        "req",
        "app: shared",
        "lbipam.cilium.io/ips: 10.202.0.5",
        "{port: 80}",
    ));
    wait_service(&cp, "default/req", "10.202.0.5", "satisfied");
    cp.apply(&lb_service(
        "req-last",
        "app: shared",
        "lbipam.cilium.io/ips: 10.202.0.7",
        "{port: 80}",
    ));
    wait_service(&cp, "default/req-last", "", "no_pool");
    wait_pool(&cp, "shared", "false False 3");

    // Type change and deletion release the address.
    cp.kubectl(&[
        "patch",
        "svc",
        "web-2",
        "--type=merge",
        "-p",
        r#"{"spec":{"type":"ClusterIP"}}"#,
    ])
    .expect_ok("to ClusterIP");
    wait_service(&cp, "default/web-2", "", "");
    cp.kubectl(&["delete", "svc", "s-http-2"])
        .expect_ok("delete");
    wait_pool(&cp, "lab4-blue", "false False 2");
    wait_pool(&cp, "shared", "false False 4");
    wait_for("the pool metrics", LIMIT, || {
        op.metric("podnet_operator_lbipam_ips_used{pool=\"shared\"}") == Some(2.0)
            && op.metric("podnet_operator_lbipam_services_unsatisfied") == Some(2.0)
    });

    // Restart: every Service keeps its address, and the new leader allocates
    // around them.
    let before = services(&cp);
    op.stop();
    let op = start_operator(&cp, "lb-b", &sa);
    cp.apply(&lb_service("after", "color: blue", "", "{port: 80}"));
    wait_service(&cp, "default/after", "10.201.0.101", "satisfied");
    cp.apply(&lb_service("after-shared", "app: shared", "", "{port: 80}"));
    wait_service(&cp, "default/after-shared", "10.202.0.2", "satisfied");
    let mut now = services(&cp);
    now.remove("default/after");
    now.remove("default/after-shared");
    assert_eq!(now, before);
    drop(op);
}

#[test]
fn lb_ipam_pool_edit_keeps_addresses_and_reports_orphans() {
    const TEST: &str = "lbipam_pool_edit";
    let Some(cp) = ControlPlane::start(TEST) else {
        return;
    };
    let sa = install_operator(&cp);
    let op = start_operator(&cp, "lb-e", &sa);
    let pool = |blocks: &str| {
        format!(
            "apiVersion: cilium.io/v2\nkind: CiliumLoadBalancerIPPool\nmetadata:\n  name: edited\n\
             spec:\n  blocks: [{blocks}]\n"
        )
    };
    cp.apply(&pool("{start: 10.205.0.1, stop: 10.205.0.4}"));
    for (name, ip) in [
        ("a", "10.205.0.1"),
        ("b", "10.205.0.2"),
        ("c", "10.205.0.3"),
    ] {
        cp.apply(&lb_service(name, "", "", "{port: 80}"));
        wait_service(&cp, &format!("default/{name}"), ip, "satisfied");
    }
    // The edit adds a block in front and drops 10.205.0.1: b and c keep theirs
    // (upstream would renumber), a gets a new one and the pool names it.
    cp.apply(&pool(
        "{cidr: 10.206.0.0/31}, {start: 10.205.0.2, stop: 10.205.0.4}",
    ));
    wait_service(&cp, "default/a", "10.206.0.0", "satisfied");
    assert_eq!(
        service(&cp, "default/b"),
        ("10.205.0.2".into(), "satisfied".into())
    );
    assert_eq!(
        service(&cp, "default/c"),
        ("10.205.0.3".into(), "satisfied".into())
    );
    wait_for("the orphan condition", LIMIT, || {
        condition_field(
            &cp,
            "ippool",
            "edited",
            "podnet.io/ServicesOrphaned",
            "message",
        )
        .contains("default/a (10.205.0.1)")
    });
    wait_pool(&cp, "edited", "false False 2");

    // A pool the schema lets through but podnet cannot use says why.
    cp.apply(
        "apiVersion: cilium.io/v2\nkind: CiliumLoadBalancerIPPool\nmetadata:\n  name: reversed\n\
         spec:\n  blocks: [{start: 10.207.0.9, stop: 10.207.0.1}]\n",
    );
    wait_for("the invalid-pool condition", LIMIT, || {
        condition_field(
            &cp,
            "ippool",
            "reversed",
            "podnet.io/InvalidPool",
            "message",
        ) == "CiliumLoadBalancerIPPool \"reversed\": spec.blocks[0]: stop 10.207.0.1 is below start 10.207.0.9; swap them"
    });
    drop(op);
}
