//! podnet on a dual-stack cluster (`PODNET_CLUSTER_IP_FAMILY=dual`: every node,
//! the control plane, the router and the world have an IPv6 address beside their
//! IPv4 one, the Services have two ranges), installed with docs/kubernetes.md's
//! dual-stack ConfigMap change, in tunnel mode; the same cluster then carries
//! cluster::l2's checks.

use std::net::IpAddr;

use super::*;

/// "The world"'s IPv6 address (scripts/cluster): no route to the pods.
const WORLD_IP6: &str = "2001:db8:2::2";
/// The port of the world's echo-the-peer server.
const PEER_ECHO_PORT: u16 = 18081;

/// One dual-stack cluster, podnet installed in tunnel mode, two parts in turn:
/// [`a_dual_stack_cluster_carries_both_families`] (its pods and Service removed
/// after it), then
/// [`super::l2::lb_addresses_answer_the_world_from_one_allowed_node_and_move_when_it_dies`].
/// Stopping the cluster then leaves no namespace, mount, cgroup or process
/// behind.
#[test]
fn a_dual_stack_cluster_carries_both_families_and_announces_lb_addresses() {
    let test = "a_dual_stack_cluster_carries_both_families_and_announces_lb_addresses";
    let Some(cluster) = Cluster::start_family(test, "dual") else {
        return;
    };
    cluster.install_podnet();
    part(test, "a_dual_stack_cluster_carries_both_families", || {
        a_dual_stack_cluster_carries_both_families(&cluster)
    });
    part(
        test,
        "lb_addresses_answer_the_world_from_one_allowed_node_and_move_when_it_dies",
        || {
            super::l2::lb_addresses_answer_the_world_from_one_allowed_node_and_move_when_it_dies(
                &cluster,
            )
        },
    );
    cluster.stop_clean();
}

/// Each pod gets one address of each family, of its node's CIDRs; pods on every
/// node reach each other over both families (VXLAN over the IPv4 underlay); a
/// `RequireDualStack` Service answers on both ClusterIPs from another node; the
/// world reaches a pod's hostPort and a NodePort over IPv6; the world sees a
/// pod's IPv6 egress as coming from the pod's node's IPv6 address (masquerade);
/// a rebooted node's new pods have both families again and are reached over
/// both. Deleting the pods frees every address of both families.
fn a_dual_stack_cluster_carries_both_families(cluster: &Cluster) {
    cluster.apply(&spread_deployment("spread", REPLICAS));
    cluster.wait_for(
        "every spread pod Ready",
        || {
            let pods = cluster.pods("default", "app=spread");
            (pods.len() == REPLICAS && pods.iter().all(ready)).then_some(())
        },
        || cluster.describe("default"),
    );
    let placed = placed_dual(cluster, "spread");
    eprintln!("pods: {placed:?}");
    assert_eq!(placed.len(), REPLICAS, "every pod has both families");
    for pod in &placed {
        let cidrs = node_pod_cidrs(cluster, &pod.node);
        for ip in [pod.v4, pod.v6] {
            assert!(
                cidrs.iter().any(|c| c.contains(&ip)),
                "{} on {} has {ip}, not of its node's CIDRs {cidrs:?}",
                pod.name,
                pod.node
            );
        }
    }

    // Pod to pod across the nodes, both families, both ways.
    let first = &placed[0];
    let others: Vec<&DualPod> = placed.iter().filter(|p| p.node != first.node).collect();
    assert!(!others.is_empty(), "pods on other nodes: {placed:?}");
    for other in &others {
        for ip in [other.v4, other.v6] {
            eprintln!(
                "{} ({}) pings {ip} ({})",
                first.name, first.node, other.node
            );
            cluster.ping("default", &first.name, &ip.to_string());
        }
    }
    cluster.ping("default", &others[0].name, &first.v6.to_string());

    // A RequireDualStack Service whose pod runs on another node than the client.
    let web_node = others[0].node.clone();
    cluster.apply(&dual_web_manifest(&web_node));
    cluster.wait_for(
        "the web pod Ready",
        || ready(&cluster.kubectl_json(&["get", "pod", "-n", "default", "web"])).then_some(()),
        || cluster.describe("default"),
    );
    let service = cluster.kubectl_json(&["get", "service", "-n", "default", "web"]);
    let cluster_ips: Vec<IpAddr> = service["spec"]["clusterIPs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip.as_str()?.parse().ok())
        .collect();
    assert!(
        cluster_ips.len() == 2 && cluster_ips[0].is_ipv4() && cluster_ips[1].is_ipv6(),
        "the web Service's clusterIPs: {}",
        service["spec"]
    );
    for ip in &cluster_ips {
        let request = format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | /bin/busybox nc -w 3 {ip} 80");
        let page = cluster.wait_for(
            &format!(
                "{} ({}) fetching the web Service on {ip}",
                first.name, first.node
            ),
            || {
                cluster
                    .exec(&first.name, &["/bin/busybox", "sh", "-c", &request])
                    .ok()
                    .filter(|page| page.starts_with("HTTP/1.1 200"))
            },
            || cluster.describe("default"),
        );
        assert_eq!(page.lines().last().map(str::trim), Some("served-by-web"));
    }

    // From the world over IPv6: the web pod's hostPort on its node, and the
    // Service's NodePort on the client's node (forwarded across the nodes).
    let node_port = service["spec"]["ports"][0]["nodePort"]
        .as_u64()
        .unwrap_or_else(|| panic!("the web Service has no nodePort: {}", service["spec"]));
    for url in [
        format!("http://[{}]:{HOST_PORT}/", node_ip6(cluster, &web_node)),
        format!("http://[{}]:{node_port}/", node_ip6(cluster, &first.node)),
    ] {
        let page = cluster.wait_for(
            &format!("the world fetching {url} (web on {web_node})"),
            || {
                let out =
                    cluster.script(&["exec", "world", "curl", "-sS", "--max-time", "3", &url]);
                out.status.success().then(|| text(&out))
            },
            || cluster.describe("default"),
        );
        assert_eq!(page.trim(), "served-by-web", "{url} answered {page:?}");
    }

    // Egress over IPv6: the world has no route to the pods; its server answers
    // with the address it saw, which must be the pod's node's.
    let echo = PeerEcho::start(cluster);
    let seen = cluster.wait_for(
        &format!(
            "{} connecting to [{WORLD_IP6}]:{PEER_ECHO_PORT}",
            first.name
        ),
        || {
            let cmd = format!("/bin/busybox nc -w 3 {WORLD_IP6} {PEER_ECHO_PORT} < /dev/null");
            let out = cluster
                .exec(&first.name, &["/bin/busybox", "sh", "-c", &cmd])
                .ok()?;
            // (socat names an IPv6 peer in brackets.)
            let seen = out.trim().trim_start_matches('[').trim_end_matches(']');
            seen.parse::<IpAddr>().ok()
        },
        || cluster.describe("default"),
    );
    drop(echo);
    assert_eq!(
        seen,
        node_ip6(cluster, &first.node),
        "the world saw {}'s IPv6 egress from {seen}, not from its node {}",
        first.name,
        first.node
    );

    // A reboot: the node's pods come back with both families, reached over both.
    let rebooted = others[0].node.clone();
    let before: BTreeSet<String> = placed
        .iter()
        .filter(|p| p.node == rebooted)
        .map(|p| p.container.clone())
        .collect();
    cluster.script_ok(&["reboot", &rebooted]);
    let after = cluster.wait_for(
        &format!("{rebooted}'s pods Ready again, with both families"),
        || {
            let pods = cluster.pods("default", "app=spread");
            let all_ready = pods.len() == REPLICAS && pods.iter().all(ready);
            let now = placed_dual(cluster, "spread");
            let renewed = now
                .iter()
                .filter(|p| p.node == rebooted)
                .all(|p| !before.contains(&p.container));
            (all_ready && renewed && now.len() == REPLICAS).then_some(now)
        },
        || cluster.describe("default"),
    );
    let client = after
        .iter()
        .find(|p| p.node != rebooted)
        .expect("a pod on another node");
    for pod in after.iter().filter(|p| p.node == rebooted) {
        for ip in [pod.v4, pod.v6] {
            eprintln!(
                "{} pings {} ({ip}) after {rebooted}'s reboot",
                client.name, pod.name
            );
            cluster.ping("default", &client.name, &ip.to_string());
        }
    }

    let agents = cluster.agents();
    cluster.kubectl(&["delete", "deployment", "spread", "--wait=true"]);
    cluster.kubectl(&["delete", "pod", "web", "--wait=true"]);
    cluster.kubectl(&["delete", "service", "web"]);
    cluster.assert_freed("app in (spread, web)", &agents);
}

/// A pod with one address of each family.
#[derive(Debug)]
struct DualPod {
    name: String,
    node: String,
    container: String,
    v4: IpAddr,
    v6: IpAddr,
}

/// The pods of `app` that have an IPv4 and an IPv6 address (status.podIPs).
fn placed_dual(cluster: &Cluster, app: &str) -> Vec<DualPod> {
    cluster
        .pods("default", &format!("app={app}"))
        .iter()
        .filter_map(|p| {
            let ips: Vec<IpAddr> = p["status"]["podIPs"]
                .as_array()?
                .iter()
                .filter_map(|ip| ip["ip"].as_str()?.parse().ok())
                .collect();
            Some(DualPod {
                name: p["metadata"]["name"].as_str()?.to_string(),
                node: p["spec"]["nodeName"].as_str()?.to_string(),
                container: container_id(p),
                v4: *ips.iter().find(|ip| ip.is_ipv4())?,
                v6: *ips.iter().find(|ip| ip.is_ipv6())?,
            })
        })
        .collect()
}

/// The node's IPv6 InternalIP.
fn node_ip6(cluster: &Cluster, node: &str) -> IpAddr {
    let listed = cluster.node_address(node);
    listed
        .split_whitespace()
        .filter_map(|a| a.parse::<IpAddr>().ok())
        .find(IpAddr::is_ipv6)
        .unwrap_or_else(|| panic!("{node} lists no IPv6 InternalIP: {listed:?}"))
}

/// [`web_manifest`]'s pod and NodePort Service, the Service `RequireDualStack`.
fn dual_web_manifest(node: &str) -> String {
    web_manifest(node).replace(
        r#""spec": {"type": "NodePort","#,
        r#""spec": {"type": "NodePort", "ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv4", "IPv6"],"#,
    )
}

/// A server in the world that answers each TCP connection on
/// [`PEER_ECHO_PORT`] with the peer address it sees (socat, limited to two
/// minutes by `timeout`); killed by its PID when dropped.
struct PeerEcho {
    pid: String,
}

impl PeerEcho {
    fn start(cluster: &Cluster) -> PeerEcho {
        let server = format!(
            "timeout 120 socat TCP6-LISTEN:{PEER_ECHO_PORT},fork,reuseaddr \
             SYSTEM:'echo $SOCAT_PEERADDR' > /dev/null 2>&1 & echo $!"
        );
        let out = cluster.script_ok(&["exec", "world", "sh", "-c", &server]);
        let pid = text(&out).trim().to_string();
        assert!(
            pid.parse::<u32>().is_ok(),
            "the world's peer echo did not start: {pid:?}"
        );
        PeerEcho { pid }
    }
}

impl Drop for PeerEcho {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(&self.pid).status();
    }
}
