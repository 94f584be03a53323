//! L2 announcements on the three-node dual-stack cluster (deploy/'s
//! `enable-l2-announcements: "true"`): LoadBalancer Services get addresses of
//! the fabric's own subnets from LB IPAM, one node answers ARP (IPv4) and NDP
//! (IPv6) for each, and "the world" behind the fabric's router reaches them.
//! Run by cluster::dual_stack on its cluster (one cluster for both).

use std::net::IpAddr;
use std::process::{Child, Stdio};

use super::*;

/// The LB pool: addresses of the fabric's subnets no node or router has.
const POOL: &str = r#"{"apiVersion": "cilium.io/v2", "kind": "CiliumLoadBalancerIPPool",
  "metadata": {"name": "fabric"},
  "spec": {"blocks": [{"start": "10.251.0.200", "stop": "10.251.0.220"},
                      {"start": "fd00:10:251::200", "stop": "fd00:10:251::220"}]}}"#;

/// The policy: LoadBalancer addresses, on eth0, from node-1 and node-2 only.
const POLICY: &str = r#"{"apiVersion": "cilium.io/v2alpha1", "kind": "CiliumL2AnnouncementPolicy",
  "metadata": {"name": "fabric"},
  "spec": {"loadBalancerIPs": true, "interfaces": ["^eth0$"],
    "nodeSelector": {"matchExpressions": [
      {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-3"]}]}}}"#;

/// A policy with an interface pattern that is not a regular expression.
const BROKEN_POLICY: &str = r#"{"apiVersion": "cilium.io/v2alpha1", "kind": "CiliumL2AnnouncementPolicy",
  "metadata": {"name": "broken"},
  "spec": {"loadBalancerIPs": true, "interfaces": ["eth["]}}"#;

/// A pool of addresses outside every subnet of the nodes, and a Service asking
/// for one of them (LB IPAM's `lbipam.cilium.io/ips`).
const OUTSIDE: &str = r#"{"apiVersion": "v1", "kind": "List", "items": [
  {"apiVersion": "cilium.io/v2", "kind": "CiliumLoadBalancerIPPool",
   "metadata": {"name": "outside"},
   "spec": {"blocks": [{"start": "203.0.113.10", "stop": "203.0.113.20"}]}},
  {"apiVersion": "v1", "kind": "Service",
   "metadata": {"name": "outside", "namespace": "default",
     "annotations": {"lbipam.cilium.io/ips": "203.0.113.10"}},
   "spec": {"type": "LoadBalancer", "selector": {"app": "lbweb"},
     "ports": [{"port": 80, "targetPort": 8080}]}}]}"#;

/// A busybox web server `name` on `node` (its page says its name) behind the
/// dual-stack LoadBalancer Service `name` (port 80 to 8080), with
/// `externalTrafficPolicy` `etp`.
fn lb_web(name: &str, node: &str, etp: &str) -> String {
    format!(
        r#"{{"apiVersion": "v1", "kind": "List", "items": [
  {{"apiVersion": "v1", "kind": "Pod",
    "metadata": {{"name": "{name}", "namespace": "default", "labels": {{"app": "{name}"}}}},
    "spec": {{"nodeName": "{node}", "terminationGracePeriodSeconds": 1,
      "containers": [{{"name": "web", "image": "localhost/busybox:1.35",
        "imagePullPolicy": "Never",
        "command": ["/bin/busybox", "sh", "-c",
          "/bin/busybox mkdir -p /www && echo {name} > /www/index.html && exec /bin/busybox httpd -f -p 8080 -h /www"],
        "readinessProbe": {{"tcpSocket": {{"port": 8080}}, "periodSeconds": 1}}}}]}}}},
  {{"apiVersion": "v1", "kind": "Service",
    "metadata": {{"name": "{name}", "namespace": "default"}},
    "spec": {{"type": "LoadBalancer", "selector": {{"app": "{name}"}},
      "ipFamilyPolicy": "RequireDualStack", "externalTrafficPolicy": "{etp}",
      "ports": [{{"port": 80, "targetPort": 8080}}]}}}}]}}"#
    )
}

/// The Service's LoadBalancer addresses, once LB IPAM gave both families.
fn lb_addresses(cluster: &Cluster, service: &str) -> Vec<IpAddr> {
    cluster.wait_for(
        &format!("Service {service}'s two LoadBalancer addresses"),
        || {
            let svc = cluster.kubectl_json(&["get", "service", "-n", "default", service]);
            let ips: Vec<IpAddr> = svc["status"]["loadBalancer"]["ingress"]
                .as_array()?
                .iter()
                .filter_map(|i| i["ip"].as_str()?.parse().ok())
                .collect();
            (ips.len() == 2).then_some(ips)
        },
        || cluster.describe("default"),
    )
}

/// `url` from the world (1 s timeout): the page, or None.
fn from_world(cluster: &Cluster, address: IpAddr) -> Option<String> {
    let url = match address {
        IpAddr::V4(a) => format!("http://{a}/"),
        IpAddr::V6(a) => format!("http://[{a}]/"),
    };
    let out = cluster.script(&["exec", "world", "curl", "-sS", "-m", "1", &url]);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// What an agent's `podnet explain <address> -o json` says of the address's
/// announcement (null when the agent cannot be asked: it is being replaced).
fn l2_explain(cluster: &Cluster, agent: &str, address: IpAddr) -> Value {
    let a = address.to_string();
    let out = cluster.podnet_in_agent(agent, "explain", &["-o", "json", &a]);
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    answer["l2"].clone()
}

/// The node that answers for `address`, as the agent of every node but `down`
/// says (they must agree); None while they do not or none answers.
fn answerer(cluster: &Cluster, address: IpAddr, down: Option<&str>) -> Option<String> {
    let agents = cluster.agents();
    let said: BTreeSet<Option<String>> = agents
        .iter()
        .filter(|(node, _)| Some(node.as_str()) != down)
        .map(|(_, agent)| agent)
        .map(|agent| {
            l2_explain(cluster, agent, address)["answerer"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    match said.len() {
        1 => said.into_iter().next().flatten(),
        _ => None,
    }
}

/// The MAC of node `node`'s eth0.
fn node_mac(cluster: &Cluster, node: &str) -> String {
    let out = cluster.script_ok(&["exec", node, "ip", "-j", "link", "show", "eth0"]);
    let links: Value = serde_json::from_slice(&out.stdout).expect("ip -j link");
    links[0]["address"].as_str().unwrap_or_default().to_string()
}

/// The MAC the fabric's router has for `address` (None: not resolved).
fn router_mac(cluster: &Cluster, address: IpAddr) -> Option<String> {
    let a = address.to_string();
    let out = cluster.script(&[
        "exec", "fabric", "ip", "-j", "neigh", "show", &a, "dev", "br0",
    ]);
    let entries: Value = serde_json::from_slice(&out.stdout).ok()?;
    entries.as_array()?.iter().find_map(|e| {
        let reachable = e["state"]
            .as_array()?
            .iter()
            .any(|s| s != "FAILED" && s != "INCOMPLETE");
        reachable
            .then(|| e["lladdr"].as_str().map(str::to_string))
            .flatten()
    })
}

/// A client in the world fetching `address` every 100 ms (1 s timeout), one
/// line per try: `<unix time> ok|fail`. Its loop (which writes its PID first)
/// is killed by PID on drop, then the script that started it.
struct WorldClient {
    child: Child,
    log: PathBuf,
    pid_file: PathBuf,
}

impl WorldClient {
    fn start(cluster: &Cluster, address: IpAddr, log: PathBuf) -> WorldClient {
        let pid_file = log.with_extension("pid");
        let url = match address {
            IpAddr::V4(a) => format!("http://{a}/"),
            IpAddr::V6(a) => format!("http://[{a}]/"),
        };
        let script = format!(
            "echo $$ > {}; while :; do if curl -s -o /dev/null -m 1 {url}; then r=ok; else r=fail; fi; echo \"$(date +%s.%N) $r\"; sleep 0.1; done > {}",
            pid_file.display(),
            log.display()
        );
        let child = cluster
            .command()
            .args(["exec", "world", "bash", "-c", &script])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting the world's client");
        WorldClient {
            child,
            log,
            pid_file,
        }
    }

    /// Each try: (unix time, ok).
    fn tries(&self) -> Vec<(f64, bool)> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let (t, r) = l.split_once(' ')?;
                Some((t.parse().ok()?, r == "ok"))
            })
            .collect()
    }
}

impl Drop for WorldClient {
    fn drop(&mut self) {
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        let pid = std::fs::read_to_string(&self.pid_file).ok();
        if let Some(pid) = pid.and_then(|p| p.trim().parse().ok()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The outage a client saw around `since` (unix time): from the end of its
/// last good try before its first failed one after `since` to the end of the
/// first good try after that (a try's time is its end; None: no failure, or
/// no recovery yet).
fn outage(tries: &[(f64, bool)], since: f64) -> Option<(f64, f64)> {
    let first_fail = tries.iter().position(|(t, ok)| *t >= since && !ok)?;
    let last_good = tries[..first_fail].iter().rev().find(|(_, ok)| *ok)?;
    let back = tries[first_fail..].iter().find(|(_, ok)| *ok)?;
    Some((last_good.0, back.0))
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// A LoadBalancer Service's IPv4 and IPv6 addresses answer the world from
/// node-1 or node-2 (the policy's nodes, never node-3), every agent agreeing
/// on which, and the fabric's router has that node's MAC for them; when that
/// node is powered off, the other allowed node answers (the outage the world
/// saw is printed), and the Service has an `L2Announced` Event naming the node;
/// an `externalTrafficPolicy: Local` Service is answered by the node of its
/// pod, and moves when the pod does. Bad input: a policy whose interface
/// pattern is no regular expression is a problem in `podnet status` naming it
/// and the field, and the other policy's addresses still answer; an address
/// outside every subnet of the nodes gets a Warning Event saying so. Run by
/// cluster::dual_stack on its cluster, after the pods of its first part are
/// gone.
pub(super) fn lb_addresses_answer_the_world_from_one_allowed_node_and_move_when_it_dies(
    cluster: &Cluster,
) {
    cluster.apply(POOL);
    cluster.apply(POLICY);
    // The server on node-3, which never answers and is never powered off: the
    // world's outage is the announcement's alone.
    cluster.apply(&lb_web("lbweb", "node-3", "Cluster"));
    let addresses = lb_addresses(cluster, "lbweb");
    for a in &addresses {
        let page = cluster.wait_for(
            &format!("the world reaching {a}"),
            || from_world(cluster, *a),
            || cluster.describe("default"),
        );
        assert_eq!(page, "lbweb");
    }
    let v4 = addresses
        .iter()
        .copied()
        .find(IpAddr::is_ipv4)
        .expect("an IPv4 address");
    let first = cluster.wait_for(
        &format!("every agent agreeing who answers for {v4}"),
        || answerer(cluster, v4, None),
        || cluster.describe("kube-system"),
    );
    assert!(
        first == "node-1" || first == "node-2",
        "{first} answers, outside the policy's nodes"
    );
    let agent = cluster.agents()["node-3"].clone();
    let explained = l2_explain(cluster, &agent, v4);
    let node3 = explained["candidates"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["node"] == "node-3").cloned())
        .expect("node-3 among the candidates");
    assert_eq!(node3["standing"], "not-selected", "{explained}");
    for a in &addresses {
        let answering = answerer(cluster, *a, None).expect("an answerer");
        assert_eq!(
            router_mac(cluster, *a),
            Some(node_mac(cluster, &answering)),
            "the router's neighbour entry for {a} is not {answering}'s eth0"
        );
    }
    let announced = format!("node {first} answers ARP/NDP for {v4}");
    wait_for_event(cluster, "L2Announced", "lbweb", &announced);

    // Failover: the answering node powered off under a client in the world.
    let other = if first == "node-1" {
        "node-2"
    } else {
        "node-1"
    };
    let client = WorldClient::start(cluster, v4, cluster.dir().join("l2-client.log"));
    std::thread::sleep(Duration::from_secs(2));
    let cut = unix_now();
    cluster.script_ok(&["poweroff", &first]);
    let (down, up) = cluster.wait_for(
        "the world's client back after the power cut",
        || {
            outage(&client.tries(), cut).or_else(|| {
                // No failed try at all: the takeover was quicker than a try.
                let good = client.tries().iter().any(|(t, ok)| *t > cut + 5.0 && *ok);
                good.then_some((cut, cut))
            })
        },
        || cluster.describe("kube-system"),
    );
    eprintln!(
        "{first} powered off: the world had no answer from {:.1} s to {:.1} s after the cut ({:.1} s from its last answer to its next)",
        down - cut,
        up - cut,
        up - down
    );
    drop(client);
    let now = cluster.wait_for(
        &format!("the live agents agreeing that {other} answers for {v4}"),
        || answerer(cluster, v4, Some(&first)).filter(|n| n == other),
        || cluster.describe("kube-system"),
    );
    assert_eq!(router_mac(cluster, v4), Some(node_mac(cluster, &now)));
    cluster.script_ok(&["boot", &first]);
    cluster.wait_nodes_ready();
    cluster.wait_for(
        "an agent Ready on every node",
        || {
            let agents = cluster.pods("kube-system", "app.kubernetes.io/name=podnet");
            (agents.len() == NODES && agents.iter().all(ready)).then_some(())
        },
        || cluster.describe("kube-system"),
    );

    // externalTrafficPolicy Local: the node of the pod answers, and follows it.
    for node in ["node-2", "node-1"] {
        let _ = cluster.script(&[
            "kubectl",
            "delete",
            "pod",
            "-n",
            "default",
            "lblocal",
            "--wait=true",
        ]);
        cluster.apply(&lb_web("lblocal", node, "Local"));
        let local = lb_addresses(cluster, "lblocal");
        for a in local {
            cluster.wait_for(
                &format!("{node} answering for {a} (its pod's node)"),
                || answerer(cluster, a, None).filter(|n| n == node),
                || cluster.describe("default"),
            );
            let page = cluster.wait_for(
                &format!("the world reaching {a} on {node}"),
                || from_world(cluster, a),
                || cluster.describe("default"),
            );
            assert_eq!(page, "lblocal");
        }
    }

    // Bad input: nothing else stops being announced.
    cluster.apply(BROKEN_POLICY);
    let agent = cluster.agents()["node-1"].clone();
    let wanted = r#"CiliumL2AnnouncementPolicy broken, spec.interfaces[0]: "eth[" is not a regular expression"#;
    cluster.wait_for(
        "podnet status naming the broken policy's field",
        || {
            cluster
                .podnet_status(&agent, &[])
                .contains(wanted)
                .then_some(())
        },
        || cluster.podnet_status(&agent, &[]),
    );
    assert_eq!(
        from_world(cluster, v4).as_deref(),
        Some("lbweb"),
        "{v4} after the broken policy"
    );
    cluster.apply(OUTSIDE);
    wait_for_event(
        cluster,
        "L2NotAnnounced",
        "outside",
        "203.0.113.10 is in no subnet",
    );
    assert_eq!(
        from_world(cluster, v4).as_deref(),
        Some("lbweb"),
        "{v4} after the outside address"
    );
}
