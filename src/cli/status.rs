//! `podnet status`: the IPAM one-liner in Cilium's form, whether the
//! configuration fits the node (and why not), the node's ranges, the
//! journal and DEL queue (with entries set aside as unreadable), the leak check
//! (its last result, each finding with its evidence), and with
//! `--all-addresses` every address and its owner, the remote nodes of the
//! cross-node datapath; `-o json` for scripts. A daemon that has started but
//! does not serve yet is reported with what it waits for (exit 1: not ready).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::api::client::Client;
use crate::api::models::{
    BackendStatus, BandwidthManager, ConfigCheckStatus, CrossNodeStatus, IpamStatus, L2Status,
    LeakCheckStatus, PodCidrLine, PolicyStatus, RestoreStatus, StatusResponse, time_of,
};
use crate::api::start_note;

/// `podnet status` options.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// The daemon's socket.
    #[arg(long, default_value = crate::api::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// List every allocated address with its owner.
    #[arg(long = "all-addresses")]
    pub all_addresses: bool,
    /// Output format: text or json.
    #[arg(short = 'o', long = "output", default_value = "text")]
    pub output: String,
}

/// Runs `podnet status`.
pub fn run(args: &StatusArgs) -> i32 {
    let client = Client::new(&args.socket, Duration::from_secs(10));
    let status = match client.healthz() {
        Ok(s) => s,
        Err(e) => {
            // Not serving yet: a starting daemon says what it waits for.
            match start_note::read(&args.socket) {
                Some(waiting) => eprintln!(
                    "podnet status: the daemon is starting and does not serve yet: waiting for {}",
                    waiting.join("; ")
                ),
                None => eprintln!("podnet status: {e}"),
            }
            return 1;
        }
    };
    if args.output == "json" {
        let node = client
            .call("GET", "/v1/node", &[], None)
            .ok()
            .and_then(|r| serde_json::from_slice::<serde_json::Value>(&r.body).ok());
        let out = serde_json::json!({"status": status, "node": node});
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
        return 0;
    }
    print_text(&status, args.all_addresses);
    0
}

/// The text form, top to bottom: the node (its datapath, and whether pods'
/// bandwidth limits are shaped) and its state, the configuration
/// check, the cross-node datapath, IPAM and its ranges, journal, DEL queue,
/// leak check, policy, restore, and with `all_addresses` every address.
fn print_text(status: &StatusResponse, all_addresses: bool) {
    let ipam = &status.ipam;
    let state = if ipam.ranges.is_empty() {
        "Not ready"
    } else {
        status.cilium.state.as_str()
    };
    println!("Node:       {}", ipam.node_name);
    println!("Mode:       {}", ipam.mode);
    println!("Datapath:   {}", ipam.datapath);
    if let Some(b) = status.bandwidth_manager.as_ref().filter(|b| b.enabled) {
        println!("{}", bandwidth_line(b));
    }
    if let Some(b) = &ipam.backend {
        println!("{}", backend_line(b));
    }
    match status.cilium.msg.as_str() {
        "" => println!("State:      {state}"),
        msg => println!("State:      {state} ({msg})"),
    }
    if let Some(check) = &ipam.config_check {
        print_lines(&config_lines(check));
    }
    if let Some(x) = &ipam.cross_node {
        print_cross_node(x);
    }
    println!("IPAM:       {}", ipam.status);
    let mut lines = range_lines(ipam);
    lines.extend(pod_cidr_lines(&ipam.pod_cidrs));
    lines.push(journal_line(ipam));
    lines.push(format!("DEL queue:  {}", queue_line(ipam)));
    if let Some(leaks) = &ipam.leak_check {
        lines.extend(leak_lines(leaks));
    }
    if let Some(l2) = &ipam.l2 {
        lines.extend(l2_lines(l2));
    }
    if let Some(policy) = &ipam.policy {
        lines.extend(policy_lines(policy));
    }
    lines.extend(restore_lines(&ipam.restore));
    if all_addresses {
        lines.extend(address_lines(ipam));
    }
    print_lines(&lines);
}

fn print_lines(lines: &[String]) {
    for line in lines {
        println!("{line}");
    }
}

/// `Bandwidth:`, with how many local pods are shaped once the agent's
/// bandwidth loop has counted them.
fn bandwidth_line(b: &BandwidthManager) -> String {
    let line = "Bandwidth:  pods' bandwidth annotations are shaped (tbf qdiscs, docs/bandwidth.md)";
    match b.pods_shaped {
        Some(n) => format!("{line}; {n} local pod(s) shaped"),
        None => line.to_string(),
    }
}

/// `Backend:` with where it reads from and whether each watch has synced.
fn backend_line(b: &BackendStatus) -> String {
    let watches: Vec<String> = b
        .watches
        .iter()
        .map(|(w, synced)| format!("{w} {}", if *synced { "synced" } else { "not synced" }))
        .collect();
    let location = if b.location.is_empty() {
        String::new()
    } else {
        format!(" ({})", b.location)
    };
    match watches.is_empty() {
        true => format!("Backend:    {}{location}", b.kind),
        false => format!("Backend:    {}{location}; {}", b.kind, watches.join(", ")),
    }
}

/// One line per range: used, cooling, free and usable.
fn range_lines(ipam: &IpamStatus) -> Vec<String> {
    ipam.ranges
        .iter()
        .map(|r| {
            format!(
                "  {} {}: {} used ({} cooling), {} free of {} usable",
                r.family,
                r.cidr,
                r.used,
                r.cooling,
                r.usable.saturating_sub(r.used),
                r.usable
            )
        })
        .collect()
}

/// `Journal:` with its size, and the error when it cannot commit.
fn journal_line(ipam: &IpamStatus) -> String {
    match ipam.journal_error.as_str() {
        "" => format!(
            "Journal:    {} ({} bytes)",
            ipam.journal, ipam.journal_bytes
        ),
        err => format!(
            "Journal:    {} ({} bytes) CANNOT COMMIT: {err}",
            ipam.journal, ipam.journal_bytes
        ),
    }
}

/// `Restore:` with what restore decided, and the links it adopted or left alone.
fn restore_lines(rr: &RestoreStatus) -> Vec<String> {
    let mut lines = vec![format!(
        "Restore:    {} restored, {} expired, {} queued DELs replayed, {} released (link gone), {} orphan links removed, {} adopted from the kernel, {} outside the ranges",
        rr.restored,
        rr.expired,
        rr.queued_deletes,
        rr.released_link_gone.len(),
        rr.orphan_links_removed.len(),
        rr.adopted_from_kernel.len(),
        rr.outside_ranges.len()
    )];
    if !rr.adopted_because.is_empty() {
        lines.push(format!(
            "            adopted because {}",
            rr.adopted_because
        ));
    }
    if !rr.unaccounted_links_kept.is_empty() {
        lines.push(format!(
            "            host links left alone (not provably podnet's, nothing to adopt): {}",
            rr.unaccounted_links_kept.join(", ")
        ));
    }
    lines
}

/// `--all-addresses`: every allocated and cooling address with its owner, sorted.
fn address_lines(ipam: &IpamStatus) -> Vec<String> {
    let mut lines: Vec<String> = ipam
        .allocations
        .iter()
        .map(|(ip, owner)| format!("  {ip} ({owner})"))
        .chain(
            ipam.cooling
                .iter()
                .map(|(ip, was)| format!("  {ip} [cooling] (was {was})")),
        )
        .collect();
    lines.sort();
    lines.insert(0, "Allocated addresses:".to_string());
    lines
}

/// `0 waiting`, and the entries set aside as unreadable with what to do about them.
/// cluster-pool: each node CIDR, its status and why.
fn pod_cidr_lines(cidrs: &[PodCidrLine]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, c) in cidrs.iter().enumerate() {
        let head = if i == 0 { "Node CIDRs:" } else { "" };
        let status = if c.status.is_empty() {
            "-"
        } else {
            c.status.as_str()
        };
        out.push(format!(
            "{head:<12}{} {status} ({} of {} used): {}",
            c.cidr, c.used, c.usable, c.why
        ));
    }
    out
}

fn queue_line(ipam: &IpamStatus) -> String {
    let waiting = format!("{} waiting", ipam.queue_depth);
    if ipam.queue_unreadable == 0 {
        return waiting;
    }
    let mut names = ipam.queue_unreadable_files.join(", ");
    let unnamed = ipam
        .queue_unreadable
        .saturating_sub(ipam.queue_unreadable_files.len() as u64);
    if unnamed > 0 {
        names.push_str(&format!(" and {unnamed} more"));
    }
    format!(
        "{waiting}, {} unreadable (moved aside: {names}; remove them after checking)",
        ipam.queue_unreadable
    )
}

/// The leak check: its settings and last check, then one line per finding.
fn leak_lines(leaks: &LeakCheckStatus) -> Vec<String> {
    let every = match leaks.interval_s {
        0 => "on demand only".to_string(),
        s => format!("every {s}s"),
    };
    let release = match leaks.release_after_s {
        Some(s) => format!("released after {s}s"),
        None => "never released".into(),
    };
    let last = match leaks.last_check_ms {
        Some(at) => {
            let leaked = leaks
                .findings
                .iter()
                .filter(|f| f.finding.is_leak())
                .count();
            format!(
                "last check {}: {} allocations, {} pods, {leaked} leaked, {} other findings; {} released since start",
                time_of(at),
                leaks.allocations,
                leaks.pods,
                leaks.findings.len() - leaked,
                leaks.released
            )
        }
        None => "no check yet".into(),
    };
    let mut lines = vec![format!(
        "Leak check: {every}, grace {}s, leaks {release}; {last}",
        leaks.grace_s
    )];
    if !leaks.error.is_empty() {
        lines.push(format!("  not checking: {}", leaks.error));
    }
    lines.extend(leaks.findings.iter().map(|f| format!("  {}", f.sentence())));
    lines
}

/// NetworkPolicy: whether the table holds the last state, what it enforces,
/// then one line per problem.
fn policy_lines(policy: &PolicyStatus) -> Vec<String> {
    if !policy.synced {
        return vec![
            "Policy:     waiting for the Pod, Namespace and NetworkPolicy watches to list (the table in the kernel stands as it was)".into(),
        ];
    }
    let table = match policy.table_written {
        true => "table written",
        false => "TABLE NOT WRITTEN (retrying; the log says why)",
    };
    let mut lines = vec![format!(
        "Policy:     {table}; {} NetworkPolicies, {} local pods enforced, {} problems",
        policy.policies,
        policy.pods_enforced,
        policy.problems.len()
    )];
    if let Some(cluster) = &policy.cluster_policies {
        lines.push(format!("  ClusterNetworkPolicy: {cluster}"));
    }
    if policy.audit_mode {
        lines.push(
            "  AUDIT MODE: nothing is denied; what would be is reported as audit (podnet observe)"
                .into(),
        );
    }
    lines.extend(policy.problems.iter().map(|p| format!("  {p}")));
    lines
}

/// L2 announcements: what this node answers for, then one line per address
/// and per problem.
fn l2_lines(l2: &L2Status) -> Vec<String> {
    if !l2.settled {
        return vec![format!(
            "L2:         answering nothing yet: waiting for {}",
            l2.waiting
        )];
    }
    let mut lines = vec![format!(
        "L2:         answering for {} of the cluster's {} announced addresses; {} of {} nodes live (heartbeats on UDP {}); {} problems",
        l2.announced.len(),
        l2.cluster_addresses,
        l2.live_nodes.len(),
        l2.nodes,
        l2.heartbeat_port,
        l2.problems.len()
    )];
    for a in &l2.announced {
        lines.push(format!(
            "  {} on {} for {} (policy {})",
            a.address,
            a.interfaces.join(", "),
            a.services.join(", "),
            a.policy
        ));
    }
    lines.extend(l2.problems.iter().map(|p| format!("  problem: {p}")));
    lines
}

/// The configuration check: whether it fits and on which facts, then one line
/// per error or warning.
fn config_lines(check: &ConfigCheckStatus) -> Vec<String> {
    let verdict = match (check.fits, check.findings.is_empty()) {
        (false, _) => "DOES NOT FIT this node: no pod gets an address until it does",
        (true, true) => "fits this node",
        (true, false) => "fits this node, with warnings",
    };
    let services = match check.service_range_unknown.as_str() {
        "" if check.service_cidrs.is_empty() => "no ServiceCIDR".to_string(),
        "" => check.service_cidrs.join(", "),
        why => format!("unknown: {why}"),
    };
    let addresses = match check.internal_ips.is_empty() {
        true => "none listed".to_string(),
        false => check.internal_ips.join(", "),
    };
    let mut lines = vec![format!(
        "Config:     {verdict} (InternalIPs {addresses}; Service range {services})"
    )];
    lines.extend(
        check
            .findings
            .iter()
            .map(|f| format!("  {} ({}): {}", f.severity, f.option, f.message)),
    );
    lines
}

/// The cross-node datapath: its mode, then one line per remote node.
fn print_cross_node(x: &CrossNodeStatus) {
    let tunnel = match x.tunnel_local.as_str() {
        "" => String::new(),
        local => format!(", tunnel from {local}"),
    };
    match x.synced {
        true => println!("Nodes:      {}; {} routes{tunnel}", x.mode, x.routes),
        false => println!("Nodes:      {}; not synced yet", x.mode),
    }
    for r in &x.remote_nodes {
        println!(
            "  {} ({}): {}: {}",
            r.name,
            r.internal_ip,
            r.cidrs.join(" "),
            r.path
        );
    }
    for e in &x.errors {
        println!("  error: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_line_names_unreadable_entries() {
        let mut ipam = IpamStatus {
            queue_depth: 3,
            ..Default::default()
        };
        assert_eq!(queue_line(&ipam), "3 waiting");
        ipam.queue_depth = 0;
        ipam.queue_unreadable = 1;
        ipam.queue_unreadable_files = vec!["/run/podnet/delete-queue/0a.bad".into()];
        assert_eq!(
            queue_line(&ipam),
            "0 waiting, 1 unreadable (moved aside: /run/podnet/delete-queue/0a.bad; remove them after checking)"
        );
        ipam.queue_unreadable = 20;
        ipam.queue_unreadable_files.push("/q/0b.bad".into());
        assert!(
            queue_line(&ipam).contains("0a.bad, /q/0b.bad and 18 more;"),
            "{}",
            queue_line(&ipam)
        );
    }

    #[test]
    fn the_config_check_is_its_verdict_its_facts_and_a_line_per_finding() {
        use crate::api::models::ConfigFinding;
        let mut check = ConfigCheckStatus {
            fits: true,
            internal_ips: vec!["10.0.0.1".into()],
            service_cidrs: vec!["10.96.0.0/16".into()],
            ..Default::default()
        };
        assert_eq!(
            config_lines(&check),
            ["Config:     fits this node (InternalIPs 10.0.0.1; Service range 10.96.0.0/16)"]
        );
        check.fits = false;
        check.service_cidrs.clear();
        check.service_range_unknown = "not served".into();
        check.findings = vec![ConfigFinding {
            severity: "error".into(),
            option: "enable-ipv6".into(),
            reason: "NodeWithoutIPv6".into(),
            message: "enable-ipv6 is true (dual stack), but ...".into(),
        }];
        assert_eq!(
            config_lines(&check),
            [
                "Config:     DOES NOT FIT this node: no pod gets an address until it does (InternalIPs 10.0.0.1; Service range unknown: not served)",
                "  error (enable-ipv6): enable-ipv6 is true (dual stack), but ...",
            ]
        );
        check.fits = true;
        check.findings[0].severity = "warning".into();
        check.internal_ips.clear();
        assert!(
            config_lines(&check)[0]
                .starts_with("Config:     fits this node, with warnings (InternalIPs none listed;")
        );
    }

    #[test]
    fn the_l2_lines_say_what_waits_or_what_this_node_answers_for_and_the_problems() {
        let mut l2 = L2Status {
            waiting: "the CiliumL2AnnouncementPolicy CRD".into(),
            heartbeat_port: 4247,
            ..L2Status::default()
        };
        assert_eq!(
            l2_lines(&l2),
            ["L2:         answering nothing yet: waiting for the CiliumL2AnnouncementPolicy CRD"]
        );
        l2.settled = true;
        l2.live_nodes = vec!["node-1".into(), "node-2".into()];
        l2.nodes = 3;
        l2.cluster_addresses = 4;
        l2.announced = vec![crate::api::models::L2Announcement {
            address: "10.251.0.200".into(),
            services: vec!["default/web".into()],
            interfaces: vec!["eth0".into()],
            policy: "lan".into(),
        }];
        l2.problems = vec!["CiliumL2AnnouncementPolicy b, spec: neither ...".into()];
        assert_eq!(
            l2_lines(&l2),
            [
                "L2:         answering for 1 of the cluster's 4 announced addresses; 2 of 3 nodes live (heartbeats on UDP 4247); 1 problems",
                "  10.251.0.200 on eth0 for default/web (policy lan)",
                "  problem: CiliumL2AnnouncementPolicy b, spec: neither ...",
            ]
        );
    }

    #[test]
    fn the_policy_line_says_whether_the_table_is_written_and_lists_the_problems() {
        let mut p = PolicyStatus::default();
        assert!(policy_lines(&p)[0].starts_with("Policy:     waiting for the Pod"));
        p.synced = true;
        p.table_written = true;
        p.policies = 2;
        p.pods_enforced = 1;
        p.problems = vec![
            "NetworkPolicy a/p, spec.ingress[0].ports[0].port: no pod has a TCP port named \"x\""
                .into(),
        ];
        assert_eq!(
            policy_lines(&p),
            [
                "Policy:     table written; 2 NetworkPolicies, 1 local pods enforced, 1 problems",
                "  NetworkPolicy a/p, spec.ingress[0].ports[0].port: no pod has a TCP port named \"x\""
            ]
        );
        p.audit_mode = true;
        assert_eq!(
            policy_lines(&p)[1],
            "  AUDIT MODE: nothing is denied; what would be is reported as audit (podnet observe)"
        );
        p.table_written = false;
        assert!(policy_lines(&p)[0].contains("TABLE NOT WRITTEN"));
    }

    #[test]
    fn the_leak_check_is_its_settings_its_last_check_and_a_line_per_finding() {
        use crate::api::models::LeakFinding;
        use crate::ipam::leaks::{Finding, PodGone, PodName, Verdict};
        let mut leaks = LeakCheckStatus {
            interval_s: 600,
            grace_s: 600,
            release_after_s: Some(3600),
            ..Default::default()
        };
        assert_eq!(
            leak_lines(&leaks),
            ["Leak check: every 600s, grace 600s, leaks released after 3600s; no check yet"]
        );
        leaks.last_check_ms = Some(0);
        leaks.allocations = 12;
        leaks.pods = 11;
        leaks.findings = vec![LeakFinding {
            finding: Finding {
                ip: "10.0.0.3".parse().unwrap(),
                pod: PodName {
                    namespace: "default".into(),
                    name: "a".into(),
                },
                container_id: None,
                pod_gone: PodGone::NoPod { uid: None },
                verdict: Verdict::HostLinkUnknown,
                age_seconds: 5,
            },
            leaked_since_ms: None,
            release_at_ms: None,
        }];
        leaks.interval_s = 0;
        leaks.release_after_s = None;
        leaks.error = "the API server is down".into();
        let lines = leak_lines(&leaks);
        assert_eq!(
            lines[0],
            "Leak check: on demand only, grace 600s, leaks never released; last check 1970-01-01T00:00:00Z: 12 allocations, 11 pods, 0 leaked, 1 other findings; 0 released since start"
        );
        assert_eq!(lines[1], "  not checking: the API server is down");
        assert!(
            lines[2].starts_with("  10.0.0.3 (default/a, allocated 5s ago)"),
            "{}",
            lines[2]
        );
        assert_eq!(lines.len(), 3);
    }

    #[test]
    fn the_bandwidth_line_counts_the_shaped_pods_once_known() {
        let mut b = BandwidthManager {
            enabled: true,
            pods_shaped: None,
        };
        assert!(bandwidth_line(&b).ends_with("(tbf qdiscs, docs/bandwidth.md)"));
        b.pods_shaped = Some(3);
        assert!(bandwidth_line(&b).ends_with("docs/bandwidth.md); 3 local pod(s) shaped"));
    }
}
