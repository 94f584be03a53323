//! The wire answers built from the state's figures, pinned byte for byte: the
//! pod CIDR lines and the configuration check of status, the restore report,
//! explain's answer and the `podnet-config` header's configuration. Times are
//! zeroed where the answer carries the clock.

use super::*;
use crate::daemon::answers;
use crate::ipam::cidr_depletion::DepletionRules;

/// `GET /v1/healthz`'s `ipam.pod-cidrs` of a cluster-pool node with a second CIDR.
#[test]
fn golden_the_pod_cidr_lines() {
    let dir = TestDir::new("state");
    let mut setup = Setup::cluster_pool(Some("10.0.0.0/28"), None).cooldown(Duration::ZERO);
    if let EmbeddedMode::ClusterPool(pool) = &mut setup.mode {
        pool.ipv4_cidrs = vec!["10.0.0.0/27".parse().unwrap()];
    }
    setup.cfg.depletion = Some(DepletionRules::new(25, Duration::ZERO).unwrap());
    let mut s = start(&dir, &setup);
    for _ in 0..10 {
        next_v4(&mut s).unwrap();
    }
    s.take_outbox();
    let mut node = s.node().clone();
    node.spec
        .ipam
        .pod_cidrs
        .push("10.0.0.16/28".parse().unwrap());
    s.set_external_node(node);
    for _ in 0..5 {
        next_v4(&mut s).unwrap();
    }
    s.take_outbox();
    let status = answers::status::status_response(s.status(false));
    let lines = serde_json::to_string(&status.ipam.pod_cidrs).unwrap();
    assert_eq!(
        lines,
        r#"[{"cidr":"10.0.0.0/28","status":"in-use","first":true,"used":14,"usable":14,"why":"the node's first CIDR (never given back); in use"},{"cidr":"10.0.0.16/28","status":"in-use","first":false,"used":2,"usable":14,"why":"an extra CIDR from the operator; in use"}]"#
    );
}

/// `GET /v1/healthz`'s `ipam.config-check` and the state it makes.
#[test]
fn golden_the_configuration_check() {
    let dir = TestDir::new("state");
    let mut s = start(&dir, &Setup::dual());
    s.set_node_facts(node_with(&["10.250.0.2"]));
    let st = answers::status::status_response(s.status(true));
    let check = serde_json::to_string(&st.ipam.config_check).unwrap();
    assert_eq!(
        check,
        r#"{"fits":false,"internal-ips":["10.250.0.2"],"service-cidrs":[],"service-range-unknown":"not read","findings":[{"severity":"error","option":"enable-ipv6","reason":"NodeWithoutIPv6","message":"enable-ipv6 is true (dual stack), but node node-a has no IPv6 InternalIP (its Node's status.addresses list only 10.250.0.2): its IPv6 pods would get addresses the node cannot carry for them (no next hop to other nodes with native routing, no source address to masquerade to outside the cluster). Give the node an IPv6 address and list it (kubelet --node-ip=<IPv4>,<IPv6>), or set enable-ipv6: \"false\" (and remove cluster-pool-ipv6-cidr)"}]}"#
    );
    assert_eq!(
        st.cilium.msg,
        "the configuration does not fit this node, no pod gets an address (enable-ipv6: NodeWithoutIPv6)"
    );
}

/// `GET /v1/healthz`'s `restore` after a restart that found a link gone.
#[test]
fn golden_the_restore_report() {
    let dir = TestDir::new("state");
    let setup = Setup::dual();
    let mut s = start(&dir, &setup);
    let gone = s.allocate_next(&pod("gone")).unwrap();
    s.create_endpoint(&endpoint_for("gone", &gone)).unwrap();
    s.allocate_next(&pod("starting")).unwrap();
    drop(s);
    let (mut s, origin) = restore(&dir, &setup);
    s.reconcile_with_kernel(&KernelView::default(), origin)
        .unwrap();
    s.note_queued_deletes(2);
    let status = answers::status::status_response(s.status(false));
    let report = serde_json::to_string(&status.ipam.restore).unwrap();
    assert_eq!(
        report,
        r#"{"restored":6,"expired":0,"cooled-down":0,"queued-deletes":2,"outside-ranges":[],"released-link-gone":["10.0.0.2 (ns/gone)","fd00::2 (ns/gone)"],"orphan-links-removed":[],"adopted-from-kernel":[],"unaccounted-links-kept":[]}"#
    );
}

/// `GET /v1/explain` of a wired pod with a failure the plugin reported.
#[test]
fn golden_the_explain_answer() {
    let dir = TestDir::new("state");
    let mut s = start(&dir, &Setup::dual());
    let resp = s.allocate_next(&pod("c1")).unwrap();
    s.create_endpoint(&endpoint_for("c1", &resp)).unwrap();
    s.cni_report(PluginReport {
        verb: "ADD",
        container_id: "c1",
        ifname: "eth0",
        owner: "ns/c1",
        phases: &BTreeMap::new(),
        reason: "datapath",
        error: "creating lxc1: File exists",
    });
    let mut answer = answers::explain::explain_response("ns/c1", s.explain("ns/c1"));
    for a in &mut answer.addresses {
        a.allocated_at_ms = 0;
    }
    for f in &mut answer.failures {
        f.at_ms = 0;
    }
    assert_eq!(
        serde_json::to_string(&answer).unwrap(),
        r#"{"query":"ns/c1","addresses":[{"ip":"10.0.0.2","pool":"default","owner":"ns/c1","state":"bound","container-id":"c1","ifname":"eth0","network":"podnet","rule":"ipam mode cluster-pool: IPv4 address of node node-a from pool default","range":"10.0.0.0/28 (block of pool default)","allocated-at-ms":0,"until-ms":0,"restored":false,"host-link":"lxc18b8fe0ca3d6"},{"ip":"fd00::2","pool":"default","owner":"ns/c1","state":"bound","container-id":"c1","ifname":"eth0","network":"podnet","rule":"ipam mode cluster-pool: IPv6 address of node node-a from pool default","range":"fd00::/124 (block of pool default)","allocated-at-ms":0,"until-ms":0,"restored":false,"host-link":"lxc18b8fe0ca3d6"}],"failures":[{"at-ms":0,"verb":"ADD","owner":"ns/c1","container-id":"c1","ifname":"eth0","reason":"datapath","message":"creating lxc1: File exists","hint":"a kernel operation failed: the message names the link or route; check the node's namespace (ip link, ip route) and kernel logs"}],"summary":"10.0.0.2 belongs to ns/c1 (container c1, eth0), from 10.0.0.0/28 (block of pool default). fd00::2 belongs to ns/c1 (container c1, eth0), from fd00::/124 (block of pool default). last failure: creating lxc1: File exists (datapath). Hint: a kernel operation failed: the message names the link or route; check the node's namespace (ip link, ip route) and kernel logs"}"#
    );
}

/// The configuration a `delegated-plugin` refusal carries (the `podnet-config`
/// header).
#[test]
fn golden_the_configuration_of_a_delegated_plugin_refusal() {
    let dir = TestDir::new("state");
    let mut s = start(&dir, &Setup::delegated_plugin());
    let e = s.allocate_next(&pod("c1")).unwrap_err();
    let config = e.config.expect("the configuration comes along");
    assert_eq!(
        serde_json::to_string(&answers::status::configuration_status(*config)).unwrap(),
        r#"{"addressing":{"ipv4":{"enabled":true,"ip":"169.254.0.1"}},"ipam-mode":"delegated-plugin","deviceMTU":1500,"routeMTU":1500,"datapathMode":"veth","configuredDatapathMode":"veth","node-name":"node-a"}"#
    );
}
