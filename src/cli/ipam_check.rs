//! `podnet ipam check`: the cluster-wide IPAM check, run now as the cluster
//! admin. It lists every Pod and CiliumNode once (a kubeconfig, or in-cluster),
//! runs the duplicate check (`ipam::duplicates`: two Pods with one IP, a Pod IP
//! outside its node's ranges, a range on two CiliumNodes) and prints a report
//! per node: its ranges, the Pods that hold addresses there, and, where the
//! CiliumNode publishes its allocations (`status.ipam.used`: the crd and eni
//! modes; cluster-pool, multi-pool and kubernetes publish none), the
//! allocations compared with the Pods by the agent's leak rules
//! (`ipam::leaks`): an allocation whose pod is gone is shown with that
//! evidence, but the API server alone cannot say whether its sandbox is gone
//! (the host link is on the node), so only the agent's own check calls it a
//! leak. Those leaks reach the report, in every mode, as the agents post them:
//! the `IPAMLeak` Events not followed by an `IPAMLeakReleased` for the address
//! (`k8s::leak_events`; kept for the API server's event TTL, 1 h by default).
//! Exit 0 when there is no finding and no unreleased leak, 1 otherwise, 2 when
//! the check could not run; `-o json` prints the same report as JSON.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;

use crate::ipam::duplicates::{Finding, NodeRange, PodView, check, finding_lines, joined};
use crate::ipam::leaks::{self, NodeAllocation, NodePod, PodName};
use crate::k8s::address_views::{Listed, ReadError, node_ranges, read};
use crate::k8s::connect::{ConnectError, kube_config};
use crate::k8s::leak_events::{self, AgentLeak};
use crate::k8s::objects::ListError;
use crate::resources::NodeResource;

/// How long the reads may take before the API server counts as unreachable.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// `podnet ipam` subcommands.
#[derive(Debug, Subcommand)]
pub enum IpamCommand {
    /// Check the cluster now: duplicate pod IPs, pod IPs outside their node's
    /// ranges, ranges on two CiliumNodes, and each node's allocations against
    /// its pods (exit 0: clean, 1: findings, 2: the check could not run).
    Check(CheckArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// `podnet ipam check` options.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// The cluster admin's kubeconfig (default: $KUBECONFIG, else ~/.kube/config,
    /// else in-cluster).
    #[arg(long = "kubeconfig", env = "KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    pub output: Output,
}

/// Runs `podnet ipam <command>`; returns the exit code.
pub fn run(command: &IpamCommand) -> i32 {
    match command {
        IpamCommand::Check(args) => run_check(args),
    }
}

fn run_check(args: &CheckArgs) -> i32 {
    let (listed, leak_events) = match list(args) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("podnet ipam check: {e}");
            return 2;
        }
    };
    let report = report(&listed, &leak_events::unreleased(&leak_events));
    match args.output {
        Output::Text => print!("{}", text(&report)),
        Output::Json => match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("podnet ipam check: {e}");
                return 2;
            }
        },
    }
    exit_code(&report)
}

/// 0 without findings and unreleased leaks, 1 with.
pub fn exit_code(report: &Report) -> i32 {
    let leaks = report.nodes.iter().any(|n| !n.agent_leaks.is_empty());
    if report.findings.is_empty() && !leaks {
        0
    } else {
        1
    }
}

/// Why the check could not run.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error(
        "kubeconfig {}: {source} (pass --kubeconfig FILE of a cluster admin, or set KUBECONFIG)",
        path.display()
    )]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("{0} (pass --kubeconfig FILE of a cluster admin, or set KUBECONFIG)")]
    Connect(#[source] ConnectError),
    #[error(
        "reading the Pods and CiliumNodes from the API server at {url}: {source}{}",
        hint(source)
    )]
    Read {
        url: String,
        #[source]
        source: Box<ReadError>,
    },
    #[error(
        "reading the agents' leak Events (IPAMLeak, IPAMLeakReleased) from the API server at {url}: {source}{}",
        hint_api(&source.source)
    )]
    Events {
        url: String,
        #[source]
        source: Box<ListError>,
    },
    #[error("the API server at {url} did not answer within {}s", READ_TIMEOUT.as_secs())]
    Timeout { url: String },
}

/// What to fix for a read that failed.
fn hint(e: &ReadError) -> &'static str {
    e.api_error().map(hint_api).unwrap_or_default()
}

/// What to fix for a request the API server failed or refused.
fn hint_api(e: &kube::Error) -> &'static str {
    match e {
        kube::Error::Api(s) if s.code == 401 => {
            " (the kubeconfig's credentials are refused: use a current one)"
        }
        kube::Error::Api(s) if s.code == 403 => {
            " (the check lists Pods, CiliumNodes and Events cluster-wide: use a kubeconfig allowed to)"
        }
        kube::Error::Api(_) => "",
        _ => " (is the API server up, and is this the right kubeconfig?)",
    }
}

/// The kubeconfig to use: the flag or $KUBECONFIG, else ~/.kube/config when it
/// exists, else None (in-cluster).
fn kubeconfig(args: &CheckArgs) -> Option<PathBuf> {
    args.kubeconfig.clone().or_else(|| {
        let home = std::env::var_os("HOME")?;
        let path = PathBuf::from(home).join(".kube/config");
        path.exists().then_some(path)
    })
}

fn list(args: &CheckArgs) -> Result<(Listed, Vec<leak_events::LeakEvent>), CheckError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(CheckError::Runtime)?;
    runtime.block_on(async {
        let config = kube_config(kubeconfig(args).as_ref())
            .await
            .map_err(|e| match e {
                ConnectError::Kubeconfig { path, source } => {
                    CheckError::Kubeconfig { path, source }
                }
                e => CheckError::Connect(e),
            })?;
        let url = config.cluster_url.to_string();
        let client = kube::Client::try_from(config)
            .map_err(|e| CheckError::Connect(ConnectError::Client(e)))?;
        let timeout = || CheckError::Timeout { url: url.clone() };
        let listed = tokio::time::timeout(READ_TIMEOUT, read(&client))
            .await
            .map_err(|_| timeout())?
            .map_err(|source| CheckError::Read {
                url: url.clone(),
                source: Box::new(source),
            })?;
        let events = tokio::time::timeout(READ_TIMEOUT, leak_events::list(&client))
            .await
            .map_err(|_| timeout())?
            .map_err(|source| CheckError::Events {
                url: url.clone(),
                source: Box::new(source),
            })?;
        Ok((listed, events))
    })
}

/// A Pod holding addresses on a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodLine {
    pub namespace: String,
    pub name: String,
    pub ips: Vec<IpAddr>,
}

/// The node's allocations as its CiliumNode publishes them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Allocations {
    /// Addresses in `status.ipam.used` / `ipv6-used` (pods' and the agent's own).
    pub count: usize,
    /// Allocations whose pod is gone, with the evidence (never called a leak
    /// here: the host link is on the node).
    pub pod_gone: Vec<PodGone>,
    /// Addresses of the node's Pods that are not among its allocations.
    pub not_allocated: Vec<IpAddr>,
}

/// A published allocation whose pod is gone (the API server does not say how
/// old it is, nor whether its sandbox is gone).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodGone {
    pub ip: IpAddr,
    pub pod: PodName,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// Why its pod counts as gone (the agent's rule).
    pub evidence: leaks::PodGone,
}

impl std::fmt::Display for PodGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}", self.ip, self.pod)?;
        if let Some(c) = &self.container_id {
            write!(f, ", container {c}")?;
        }
        write!(
            f,
            "): {}; whether its sandbox is gone is known on the node (its agent's leak check)",
            self.evidence
        )
    }
}

/// One node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    pub name: String,
    /// Whether a CiliumNode of this name exists.
    pub cilium_node: bool,
    pub ranges: Vec<NodeRange>,
    pub pods: Vec<PodLine>,
    /// None: the CiliumNode publishes no allocations (`status.ipam.used` is
    /// written in the crd and eni modes only).
    pub allocations: Option<Allocations>,
    /// The findings that concern this node (their text).
    pub findings: Vec<String>,
    /// Leaks the node's agent reported and has not released (its Events).
    pub agent_leaks: Vec<AgentLeak>,
}

/// Everything `podnet ipam check` shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub nodes: Vec<NodeReport>,
    pub findings: Vec<Finding>,
    /// Nodes whose Pods' IPs could not be checked against ranges (no
    /// CiliumNode, or one without ranges).
    pub unchecked_nodes: Vec<String>,
}

/// The report of what was listed, with the agents' unreleased leaks per node.
pub fn report(listed: &Listed, agent_leaks: &BTreeMap<String, Vec<AgentLeak>>) -> Report {
    let checked = check(&listed.pods, &listed.node_ranges());
    let by_name: BTreeMap<&str, &NodeResource> = listed
        .cilium_nodes
        .iter()
        .map(|n| (n.metadata.name.as_str(), n))
        .collect();
    let names: BTreeSet<&str> = by_name
        .keys()
        .copied()
        .chain(listed.pods.iter().filter_map(|p| p.node.as_deref()))
        .chain(agent_leaks.keys().map(String::as_str))
        .collect();
    let nodes = names
        .into_iter()
        .map(|name| {
            let on_node: Vec<&PodView> = listed
                .pods
                .iter()
                .filter(|p| p.node.as_deref() == Some(name))
                .collect();
            let cilium_node = by_name.get(name).copied();
            NodeReport {
                name: name.to_string(),
                cilium_node: cilium_node.is_some(),
                ranges: cilium_node
                    .map(|n| node_ranges(n).ranges)
                    .unwrap_or_default(),
                pods: on_node
                    .iter()
                    .filter(|p| p.holds_addresses() && !p.ips.is_empty())
                    .map(|p| PodLine {
                        namespace: p.pod.namespace.clone(),
                        name: p.pod.name.clone(),
                        ips: p.ips.clone(),
                    })
                    .collect(),
                allocations: cilium_node.and_then(|n| allocations(n, &on_node)),
                findings: checked
                    .findings
                    .iter()
                    .filter(|f| f.nodes().contains(name))
                    .map(ToString::to_string)
                    .collect(),
                agent_leaks: agent_leaks.get(name).cloned().unwrap_or_default(),
            }
        })
        .collect();
    Report {
        nodes,
        findings: checked.findings,
        unchecked_nodes: checked.unchecked_nodes,
    }
}

/// The node's published allocations against its Pods; None when it publishes
/// none.
fn allocations(node: &NodeResource, on_node: &[&PodView]) -> Option<Allocations> {
    let used = &node.status.ipam;
    if used.used.is_empty() && used.ipv6_used.is_empty() {
        return None;
    }
    let published: Vec<NodeAllocation> = used
        .used
        .iter()
        .chain(&used.ipv6_used)
        .filter_map(|(ip, owner)| {
            Some(NodeAllocation {
                ip: ip.parse().ok()?,
                pod: owner.owner.split_once('/').map(|(ns, name)| PodName {
                    namespace: ns.into(),
                    name: name.into(),
                }),
                pod_uid: None,
                container_id: Some(owner.resource.clone()).filter(|r| !r.is_empty()),
                host_link: None,
                age: Duration::ZERO,
            })
        })
        .collect();
    // Every Pod object on the node counts as its pod existing (as in the
    // agent's check); the addresses compared are those of Pods holding them.
    let pods: Vec<NodePod> = on_node
        .iter()
        .map(|p| NodePod {
            pod: p.pod.clone(),
            uid: p.uid.clone(),
        })
        .collect();
    let compared = leaks::check(&published, &pods, &BTreeSet::new(), leaks::DEFAULT_GRACE);
    let allocated: BTreeSet<IpAddr> = published.iter().map(|a| a.ip).collect();
    let not_allocated = on_node
        .iter()
        .filter(|p| p.holds_addresses())
        .flat_map(|p| p.ips.iter().copied())
        .filter(|ip| !allocated.contains(ip))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    Some(Allocations {
        count: published.len(),
        pod_gone: compared
            .findings
            .into_iter()
            .map(|f| PodGone {
                ip: f.ip,
                pod: f.pod,
                container_id: f.container_id,
                evidence: f.pod_gone,
            })
            .collect(),
        not_allocated,
    })
}

/// The text form.
pub fn text(r: &Report) -> String {
    let mut out = String::new();
    for n in &r.nodes {
        out.push_str(&format!("Node {}", n.name));
        if !n.cilium_node {
            out.push_str(" (no CiliumNode)");
        }
        out.push('\n');
        out.push_str(&format!("  ranges:      {}\n", joined(&n.ranges)));
        match &n.allocations {
            None => out.push_str(
                "  allocations: not published (status.ipam.used is written in the crd and eni modes only)\n",
            ),
            Some(a) => {
                out.push_str(&format!(
                    "  allocations: {} in status.ipam.used\n",
                    a.count
                ));
                for f in &a.pod_gone {
                    out.push_str(&format!("    pod gone: {f}\n"));
                }
                if !a.not_allocated.is_empty() {
                    out.push_str(&format!(
                        "    pod IPs not among them (the agent publishes at its update rate): {}\n",
                        joined(&a.not_allocated)
                    ));
                }
            }
        }
        out.push_str(&format!("  pods:        {}\n", n.pods.len()));
        for p in &n.pods {
            out.push_str(&format!(
                "    {}/{} {}\n",
                p.namespace,
                p.name,
                joined(&p.ips)
            ));
        }
        for f in &n.findings {
            out.push_str(&format!("  FINDING: {f}\n"));
        }
        for l in &n.agent_leaks {
            let at = l.reported_at.as_deref().map(|t| format!(" at {t}"));
            out.push_str(&format!(
                "  LEAK (reported by the agent{}): {}\n",
                at.unwrap_or_default(),
                l.note
            ));
        }
    }
    if !r.unchecked_nodes.is_empty() {
        out.push_str(&format!(
            "Not checked against ranges (no CiliumNode, or one without ranges): {}\n",
            r.unchecked_nodes.join(", ")
        ));
    }
    match r.findings.len() {
        0 => out.push_str("Findings: none\n"),
        n => out.push_str(&format!("Findings: {n}\n{}", finding_lines(&r.findings))),
    }
    match r.nodes.iter().map(|n| n.agent_leaks.len()).sum::<usize>() {
        0 => out.push_str("Leaks reported by the agents, not released: none\n"),
        n => out.push_str(&format!(
            "Leaks reported by the agents, not released: {n}\n"
        )),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::address_views::pod_view;
    use crate::test_dir::TestDir;
    use k8s_openapi::api::core::v1::Pod;

    fn pod(name: &str, node: &str, ips: &[&str]) -> PodView {
        let ips: Vec<serde_json::Value> =
            ips.iter().map(|ip| serde_json::json!({"ip": ip})).collect();
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": "Running", "podIPs": ips},
        }))
        .unwrap();
        pod_view(&pod)
    }

    fn cilium_node(v: serde_json::Value) -> NodeResource {
        serde_json::from_value(v).unwrap()
    }

    fn listed() -> Listed {
        Listed {
            pods: vec![
                pod("web-1", "n1", &["10.0.0.5"]),
                pod("web-2", "n1", &["10.0.0.5"]),
                pod("db", "n2", &["10.0.1.9"]),
                pod("lost", "n3", &["10.7.0.1"]),
            ],
            cilium_nodes: vec![
                cilium_node(serde_json::json!({
                    "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
                    "metadata": {"name": "n1"},
                    "spec": {"ipam": {"podCIDRs": ["10.0.0.0/24"]}},
                })),
                cilium_node(serde_json::json!({
                    "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
                    "metadata": {"name": "n2"},
                    "spec": {"ipam": {"pool": {"10.0.1.9": {}, "10.0.1.10": {}}}},
                    "status": {"ipam": {"used": {
                        "10.0.1.9": {"owner": "default/db", "resource": "c1"},
                        "10.0.1.10": {"owner": "default/gone", "resource": "c2"},
                    }}},
                })),
            ],
        }
    }

    #[test]
    fn a_report_per_node_with_the_findings() {
        let r = report(&listed(), &BTreeMap::new());
        assert_eq!(exit_code(&r), 1);
        let t = text(&r);
        assert_eq!(
            t,
            "Node n1\n\
             \x20 ranges:      10.0.0.0/24 (podCIDR)\n\
             \x20 allocations: not published (status.ipam.used is written in the crd and eni modes only)\n\
             \x20 pods:        2\n\
             \x20   default/web-1 10.0.0.5\n\
             \x20   default/web-2 10.0.0.5\n\
             \x20 FINDING: 10.0.0.5 is the IP of 2 pods: default/web-1 on n1, default/web-2 on n1\n\
             Node n2\n\
             \x20 ranges:      10.0.1.10/32 (pool IP), 10.0.1.9/32 (pool IP)\n\
             \x20 allocations: 2 in status.ipam.used\n\
             \x20   pod gone: 10.0.1.10 (default/gone, container c2): no pod of that name on this node (compared by name: the allocation recorded no UID); whether its sandbox is gone is known on the node (its agent's leak check)\n\
             \x20 pods:        1\n\
             \x20   default/db 10.0.1.9\n\
             Node n3 (no CiliumNode)\n\
             \x20 ranges:      none\n\
             \x20 allocations: not published (status.ipam.used is written in the crd and eni modes only)\n\
             \x20 pods:        1\n\
             \x20   default/lost 10.7.0.1\n\
             Not checked against ranges (no CiliumNode, or one without ranges): n3\n\
             Findings: 1\n\
             \x20 DuplicatePodIP: 10.0.0.5 is the IP of 2 pods: default/web-1 on n1, default/web-2 on n1\n\
             Leaks reported by the agents, not released: none\n"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["findings"][0]["kind"], "same-ip");
        assert_eq!(json["findings"][0]["ip"], "10.0.0.5");
        assert_eq!(json["findings"][0]["pods"][1]["name"], "web-2");
        assert_eq!(json["nodes"][1]["allocations"]["count"], 2);
        assert_eq!(
            json["nodes"][1]["allocations"]["podGone"][0],
            serde_json::json!({"ip": "10.0.1.10", "pod": {"namespace": "default", "name": "gone"},
                               "containerId": "c2", "evidence": {"reason": "no-pod", "uid": null}})
        );
        assert_eq!(json["nodes"][0]["allocations"], serde_json::Value::Null);
        assert_eq!(json["uncheckedNodes"], serde_json::json!(["n3"]));
    }

    #[test]
    fn a_clean_cluster_is_exit_0_and_an_unallocated_pod_ip_is_shown() {
        let mut l = listed();
        l.pods.retain(|p| p.pod.name != "web-2");
        l.pods.push(pod("new", "n2", &["10.0.1.10"]));
        let r = report(&l, &BTreeMap::new());
        assert!(r.findings.is_empty(), "{:?}", r.findings);
        assert_eq!(exit_code(&r), 0);
        let t = text(&r);
        assert!(
            t.ends_with("Findings: none\nLeaks reported by the agents, not released: none\n"),
            "{t}"
        );
        // 10.0.1.10 is allocated to default/gone; default/new holds it.
        assert!(!t.contains("pod IPs not among them"), "{t}");
        l.pods.push(pod("other", "n2", &["10.0.1.11"]));
        let t = text(&report(&l, &BTreeMap::new()));
        assert!(
            t.contains(
                "    pod IPs not among them (the agent publishes at its update rate): 10.0.1.11\n"
            ),
            "{t}"
        );
    }

    #[test]
    fn an_unreachable_api_server_is_exit_2_with_what_to_fix() {
        let dir = TestDir::new("ipamcheck");
        let (kubeconfig, port) = crate::k8s::connect::unreachable_kubeconfig(&dir);
        let args = CheckArgs {
            kubeconfig: Some(kubeconfig.clone()),
            output: Output::Text,
        };
        let e = list(&args).err().unwrap().to_string();
        assert!(
            e.starts_with(&format!(
                "reading the Pods and CiliumNodes from the API server at https://127.0.0.1:{port}/: "
            )) && e.ends_with("(is the API server up, and is this the right kubeconfig?)"),
            "{e}"
        );
        assert_eq!(run_check(&args), 2);
        let missing = CheckArgs {
            kubeconfig: Some(dir.join("nothing-here")),
            output: Output::Json,
        };
        let e = list(&missing).err().unwrap().to_string();
        assert!(
            e.contains("nothing-here")
                && e.ends_with("(pass --kubeconfig FILE of a cluster admin, or set KUBECONFIG)"),
            "{e}"
        );
        assert_eq!(run_check(&missing), 2);
    }

    #[test]
    fn an_unreleased_agent_leak_is_shown_on_its_node_and_is_exit_1() {
        let mut l = listed();
        l.pods.retain(|p| p.pod.name != "web-2");
        let leak = AgentLeak {
            ip: "10.0.0.9".parse().unwrap(),
            note: "10.0.0.9 (default/old, allocated 900s ago): no pod of that name on this node; host link lxc1 is gone: leaked".into(),
            reported_at: Some("2026-12-02T01:00:00Z".into()),
        };
        let leaks = BTreeMap::from([("n1".to_string(), vec![leak])]);
        let r = report(&l, &leaks);
        assert!(r.findings.is_empty(), "{:?}", r.findings);
        assert_eq!(exit_code(&r), 1);
        let t = text(&r);
        assert!(
            t.contains("  LEAK (reported by the agent at 2026-12-02T01:00:00Z): 10.0.0.9 (default/old, allocated 900s ago): no pod of that name on this node; host link lxc1 is gone: leaked\nNode n2\n"),
            "{t}"
        );
        assert!(
            t.ends_with("Leaks reported by the agents, not released: 1\n"),
            "{t}"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["nodes"][0]["agentLeaks"][0]["ip"], "10.0.0.9");
        // A node with a leak but neither pods nor a CiliumNode still has a report.
        let r = report(
            &l,
            &BTreeMap::from([("n9".to_string(), leaks["n1"].clone())]),
        );
        assert!(r.nodes.iter().any(|n| n.name == "n9" && !n.cilium_node));
    }
}
