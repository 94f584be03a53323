//! Modes where something outside podnet decides what the node owns, through a
//! CiliumNode manifest file: crd (single IPs of `spec.ipam.pool`) and eni (the ENI
//! inventory in `status.eni`, with per-endpoint policy routing through the ENI,
//! tested with veths that stand for ENIs and a "VPC" namespace behind them).

use std::path::Path;
use std::time::{Duration, Instant};

use crate::harness::*;

pub(crate) fn write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

fn crd_manifest(ips: &[&str]) -> String {
    let mut s = String::from(
        "apiVersion: cilium.io/v2\nkind: CiliumNode\nmetadata:\n  name: crd-node\nspec:\n  instance-id: i-0123\n  custom-field-of-the-external-tool: keep-me\n  ipam:\n    pool:\n",
    );
    for ip in ips {
        s.push_str(&format!("      {ip}: {{resource: eni-x}}\n"));
    }
    if ips.is_empty() {
        s = s.replace("    pool:\n", "    pool: {}\n");
    }
    s
}

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn crd_mode_hands_out_only_the_node_resource_ips_and_reports_them_used() {
    if !root_or_skip("crd") {
        return;
    }
    let mut node = Node::new(&[]);
    let file = node.dir.join("ciliumnode.yaml");
    write(&file, &crd_manifest(&[]));
    let f = file.display().to_string();
    node.args = [
        "--ipam",
        "crd",
        "--node-resource",
        &f,
        "--k8s-node-name",
        "crd-node",
        "--enable-health-checking=false",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(["--ipam-cilium-node-update-rate".into(), "1s".into()])
    .collect();
    // No IP yet: the daemon waits and does not serve.
    node.spawn_daemon();
    wait_until("the waiting log line", || {
        node.log()
            .contains("Waiting for initial IP to become available in 'crd-node' custom resource")
    });
    assert!(
        node.client().healthz().is_err(),
        "the daemon served before it had an IP"
    );
    write(
        &file,
        &crd_manifest(&["10.77.0.10", "10.77.0.11", "10.77.0.12"]),
    );
    node.wait_ready();

    let (a, b, c) = (node.sandbox(), node.sandbox(), node.sandbox());
    let (ra, rb) = (node.add(&a), node.add(&b));
    let got = [ra.ipv4(), rb.ipv4()];
    for ip in &got {
        assert!(
            ["10.77.0.11", "10.77.0.12"].contains(&ip.as_str()),
            "{ip} is not from spec.ipam.pool"
        );
    }
    assert!(a.ping(&rb.ipv4()));
    let full = node.add(&c);
    assert_eq!(full.code(), 101, "{full:?}");
    assert!(full.msg().contains("No IPs available"), "{}", full.msg());
    // An edit that adds an IP is picked up live.
    write(
        &file,
        &crd_manifest(&["10.77.0.10", "10.77.0.11", "10.77.0.12", "10.77.0.13"]),
    );
    wait_until("the new IP", || node.add(&c).ok);
    // status.ipam.used matches what is handed out; the external tool's fields stay.
    wait_until("status.ipam.used", || {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let v: serde_json::Value = serde_yaml_ng::from_str(&text).unwrap_or_default();
        let used = v["status"]["ipam"]["used"]
            .as_object()
            .map(|m| m.keys().cloned().collect::<Vec<_>>())
            .unwrap_or_default();
        used == ["10.77.0.10", "10.77.0.11", "10.77.0.12", "10.77.0.13"]
    });
    let text = std::fs::read_to_string(&file).expect("file");
    assert!(
        text.contains("custom-field-of-the-external-tool: keep-me") && text.contains("i-0123"),
        "{text}"
    );
}

pub(crate) const VPC_ADDRESS: &str = "10.0.200.5";

/// The "VPC": a namespace behind the ENI veths, holding each subnet's gateway and
/// an address only reachable through the VPC.
fn vpc(node: &Node, enis: &[(&str, &str, &str)]) -> Netns {
    {
        let ns = Netns::new("pnt-vpc");
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        ns.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{VPC_ADDRESS}/32"),
            "dev",
            "lo",
        ]);
        for (i, (dev, mac, gateway)) in enis.iter().enumerate() {
            let peer = format!("vpc{i}");
            node.ns.exec(&[
                "ip", "link", "add", dev, "address", mac, "type", "veth", "peer", "name", &peer,
            ]);
            node.ns
                .exec(&["ip", "link", "set", &peer, "netns", &ns.name]);
            node.ns.exec(&["ip", "link", "set", dev, "up"]);
            // The VPC fabric delivers an ENI's secondary IPs to its MAC.
            node.ns
                .exec(&["sysctl", "-qw", &format!("net.ipv4.conf.{dev}.proxy_arp=1")]);
            ns.exec(&["ip", "addr", "add", gateway, "dev", &peer]);
            ns.exec(&["ip", "link", "set", &peer, "up"]);
        }
        ns
    }
}

fn eni_manifest(extra_eni: bool) -> String {
    let mut s = String::from(
        r#"apiVersion: cilium.io/v2
kind: CiliumNode
metadata:
  name: eni-node
spec:
  eni:
    first-interface-index: 1
status:
  eni:
    enis:
      eni-1:
        id: eni-1
        mac: "02:00:00:00:0e:01"
        number: 1
        subnet: {id: subnet-1, cidr: 10.0.1.0/24}
        vpc: {id: vpc-1, primary-cidr: 10.0.0.0/16}
        addresses: [10.0.1.20, 10.0.1.21]
      eni-2:
        id: eni-2
        mac: "02:00:00:00:0e:02"
        number: 2
        subnet: {id: subnet-2, cidr: 10.0.2.0/24}
        vpc: {id: vpc-1, primary-cidr: 10.0.0.0/16}
        addresses: [10.0.2.20, 10.0.2.21]
"#,
    );
    if extra_eni {
        s.push_str(
            r#"      eni-3:
        id: eni-3
        mac: "02:00:00:00:0e:09"
        number: 3
        subnet: {id: subnet-3, cidr: 10.0.3.0/24}
        vpc: {id: vpc-1, primary-cidr: 10.0.0.0/16}
        addresses: [10.0.3.20]
"#,
        );
    }
    s
}

/// The ENI veths of `eni_manifest`'s eni-1 and eni-2: device, MAC, gateway.
const ENIS: [(&str, &str, &str); 2] = [
    ("eni0", "02:00:00:00:0e:01", "10.0.1.1/24"),
    ("eni1", "02:00:00:00:0e:02", "10.0.2.1/24"),
];

/// The options of an eni-mode daemon on the manifest `file`.
fn eni_daemon_args(file: &Path) -> Vec<String> {
    let f = file.display().to_string();
    [
        "--ipam",
        "eni",
        "--node-resource",
        &f,
        "--k8s-node-name",
        "eni-node",
        "--enable-health-checking=false",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// An eni-mode node on `eni_manifest(extra_eni)`, its daemon started, and the
/// VPC behind its ENIs.
pub(crate) fn start_eni_node(extra_eni: bool) -> (Node, Netns) {
    let mut node = Node::new(&[]);
    let file = node.dir.join("ciliumnode.yaml");
    write(&file, &eni_manifest(extra_eni));
    let vpc = vpc(&node, &ENIS);
    node.args = eni_daemon_args(&file);
    node.start_daemon();
    (node, vpc)
}

fn ip_rules(node: &Node) -> String {
    String::from_utf8_lossy(&node.ns.exec(&["ip", "rule", "show"]).stdout).to_string()
}

#[test]
fn eni_mode_routes_each_pod_through_its_eni() {
    if !root_or_skip("eni") {
        return;
    }
    let mut node = Node::new(&[]);
    let file = node.dir.join("ciliumnode.yaml");
    write(&file, &eni_manifest(true));
    let f = file.display().to_string();
    // ENI with a tunnel is refused at start.
    node.args = [
        "--ipam",
        "eni",
        "--node-resource",
        &f,
        "--routing-mode",
        "tunnel",
        "--k8s-node-name",
        "eni-node",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let out = node.daemon_command(&[]).output().expect("daemon");
    assert!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("routing-mode=native")
    );

    let _vpc = vpc(&node, &ENIS);
    node.args = eni_daemon_args(&file);
    node.start_daemon();
    let (a, b, c, d) = (
        node.sandbox(),
        node.sandbox(),
        node.sandbox(),
        node.sandbox(),
    );
    let (ra, rb) = (node.add(&a), node.add(&b));
    // The router took 10.0.1.20; a gets the rest of ENI 1, b the first of ENI 2.
    assert_eq!(ra.ipv4(), "10.0.1.21", "{ra:?}");
    assert_eq!(rb.ipv4(), "10.0.2.20", "{rb:?}");
    let rules = ip_rules(&node);
    assert!(
        rules.contains("20:\tfrom all to 10.0.1.21 lookup main"),
        "{rules}"
    );
    assert!(rules.contains("111:\tfrom 10.0.1.21 lookup 11"), "{rules}");
    assert!(rules.contains("111:\tfrom 10.0.2.20 lookup 12"), "{rules}");
    let t11 =
        String::from_utf8_lossy(&node.ns.exec(&["ip", "route", "show", "table", "11"]).stdout)
            .to_string();
    assert!(
        t11.contains("default via 10.0.1.1 dev eni0")
            && t11.contains("10.0.1.1 dev eni0 scope link"),
        "{t11}"
    );
    let t12 =
        String::from_utf8_lossy(&node.ns.exec(&["ip", "route", "show", "table", "12"]).stdout)
            .to_string();
    assert!(t12.contains("default via 10.0.2.1 dev eni1"), "{t12}");
    // The VPC address is reachable only by policy routing: the main table has no
    // route to it.
    let main = String::from_utf8_lossy(
        &node
            .ns
            .exec(&["ip", "route", "show", "table", "main"])
            .stdout,
    )
    .to_string();
    assert!(
        !main.contains("default") && !main.contains("10.0.200."),
        "{main}"
    );
    assert!(a.ping(VPC_ADDRESS), "pod on ENI 1 cannot reach the VPC");
    assert!(b.ping(VPC_ADDRESS), "pod on ENI 2 cannot reach the VPC");
    let host_a = ra.json()["interfaces"][0]["name"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let host_b = rb.json()["interfaces"][0]["name"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let via = |from: &str, iif: &str| {
        String::from_utf8_lossy(
            &node
                .ns
                .exec(&["ip", "route", "get", VPC_ADDRESS, "from", from, "iif", iif])
                .stdout,
        )
        .to_string()
    };
    assert!(
        via("10.0.1.21", &host_a).contains("dev eni0"),
        "{}",
        via("10.0.1.21", &host_a)
    );
    assert!(
        via("10.0.2.20", &host_b).contains("dev eni1"),
        "{}",
        via("10.0.2.20", &host_b)
    );
    // The IPAM response carried the ENI details.
    let ep = node.client().config().expect("cfg").status;
    assert_eq!(ep.ipam_mode, "eni");
    // c takes ENI 2's last address; d gets ENI 3's, whose MAC is on no link: a
    // clear error, nothing half-configured, the address not leaked.
    assert_eq!(node.add(&c).ipv4(), "10.0.2.21");
    let rd = node.add(&d);
    assert_eq!(rd.code(), 102, "{rd:?}");
    assert!(
        rd.msg().contains("02:00:00:00:0e:09") && rd.msg().contains("on no host link"),
        "{}",
        rd.msg()
    );
    assert!(d.interface_gone());
    assert_eq!(node.host_links().len(), 3);
    assert!(!node.allocations().contains_key("10.0.3.20"));
    // DEL removes a's rules and keeps b's.
    assert!(node.del(&a).ok);
    wait_until("a's rules to go", || !ip_rules(&node).contains("10.0.1.21"));
    let rules = ip_rules(&node);
    assert!(rules.contains("from 10.0.2.20 lookup 12"), "{rules}");
    assert!(b.ping(VPC_ADDRESS));
}

/// An ADD that fails after it installed the pod's ENI routing takes back the rules
/// it added, and only those: another pod's rules and a rule that was there before
/// stay, and so do the ENI table's routes (other pods on the ENI share them, as on
/// DEL). The failure is a real one: the sandbox's own policy routing prohibits the
/// router address, so the kernel refuses the pod's default route via the router,
/// a pod-side step after the ENI routing.
#[test]
fn eni_add_rolled_back_after_its_routing_removes_the_rules_it_added() {
    if !root_or_skip("eni_rollback") {
        return;
    }
    let (node, _vpc) = start_eni_node(false);
    let router = node.ipv4_addressing().ip;
    assert_eq!(router, "10.0.1.20");

    // a takes ENI 1's pod address; the next ADD gets ENI 2's first, 10.0.2.20.
    let a = node.sandbox();
    assert_eq!(node.add(&a).ipv4(), "10.0.1.21");
    // A rule for 10.0.2.20 someone else left: not this attempt's to remove.
    node.ns.exec(&[
        "ip",
        "rule",
        "add",
        "to",
        "10.0.2.20",
        "lookup",
        "main",
        "pref",
        "20",
    ]);

    let b = node.sandbox();
    let prohibit = ["ip", "rule", "add", "to", &router, "prohibit", "pref", "10"];
    assert!(b.ns.exec(&prohibit).status.success());
    let rb = node.add(&b);
    assert_eq!(rb.code(), 102, "{rb:?}");
    assert!(rb.msg().starts_with("adding a pod route"), "{}", rb.msg());

    // The ENI routing had been installed (table 12 exists only through it) ...
    let t12 =
        String::from_utf8_lossy(&node.ns.exec(&["ip", "route", "show", "table", "12"]).stdout)
            .to_string();
    assert!(t12.contains("default via 10.0.2.1 dev eni1"), "{t12}");
    // ... and the rollback removed the rule it added, nothing else.
    let rules = ip_rules(&node);
    assert!(!rules.contains("from 10.0.2.20 lookup 12"), "{rules}");
    assert!(
        rules.contains("20:\tfrom all to 10.0.2.20 lookup main"),
        "{rules}"
    );
    assert!(
        rules.contains("20:\tfrom all to 10.0.1.21 lookup main"),
        "{rules}"
    );
    assert!(rules.contains("111:\tfrom 10.0.1.21 lookup 11"), "{rules}");
    // The pair and the address went too.
    assert!(b.interface_gone());
    assert_eq!(node.host_links().len(), 1);
    assert!(!node.allocations().contains_key("10.0.2.20"));

    // Without the prohibiting rule the same sandbox attaches.
    let allow = ["ip", "rule", "del", "to", &router, "prohibit", "pref", "10"];
    assert!(b.ns.exec(&allow).status.success());
    let rb = node.add(&b);
    assert!(rb.ok, "{rb:?}");
    assert!(b.ping(VPC_ADDRESS), "pod on ENI 2 cannot reach the VPC");
}
