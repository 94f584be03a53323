//! `podnet status`: the IPAM one-liner in Cilium's form, the node's ranges, the
//! journal and DEL queue (with entries set aside as unreadable), and with
//! `--all-addresses` every address and its owner, the remote nodes of the
//! cross-node datapath; `-o json` for scripts. A daemon that has started but
//! does not serve yet is reported with what it waits for (exit 1: not ready).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::api::client::Client;
use crate::api::models::{CrossNodeStatus, IpamStatus};
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
    let ipam = &status.ipam;
    let state = if ipam.ranges.is_empty() {
        "Not ready"
    } else {
        status.cilium.state.as_str()
    };
    println!("Node:       {}", ipam.node_name);
    println!("Mode:       {}", ipam.mode);
    println!("Datapath:   {}", ipam.datapath);
    if let Some(b) = &ipam.backend {
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
            true => println!("Backend:    {}{location}", b.kind),
            false => println!("Backend:    {}{location}; {}", b.kind, watches.join(", ")),
        }
    }
    match status.cilium.msg.as_str() {
        "" => println!("State:      {state}"),
        msg => println!("State:      {state} ({msg})"),
    }
    if let Some(x) = &ipam.cross_node {
        print_cross_node(x);
    }
    println!("IPAM:       {}", ipam.status);
    for r in &ipam.ranges {
        println!(
            "  {} {}: {} used ({} cooling), {} free of {} usable",
            r.family,
            r.cidr,
            r.used,
            r.cooling,
            r.usable.saturating_sub(r.used),
            r.usable
        );
    }
    match ipam.journal_error.as_str() {
        "" => println!(
            "Journal:    {} ({} bytes)",
            ipam.journal, ipam.journal_bytes
        ),
        err => println!(
            "Journal:    {} ({} bytes) CANNOT COMMIT: {err}",
            ipam.journal, ipam.journal_bytes
        ),
    }
    println!("DEL queue:  {}", queue_line(ipam));
    let rr = &ipam.restore;
    println!(
        "Restore:    {} restored, {} expired, {} queued DELs replayed, {} released (link gone), {} orphan links removed, {} adopted from the kernel, {} outside the ranges",
        rr.restored,
        rr.expired,
        rr.queued_deletes,
        rr.released_link_gone.len(),
        rr.orphan_links_removed.len(),
        rr.adopted_from_kernel.len(),
        rr.outside_ranges.len()
    );
    if !rr.adopted_because.is_empty() {
        println!("            adopted because {}", rr.adopted_because);
    }
    if !rr.unaccounted_links_kept.is_empty() {
        println!(
            "            host links left alone (not provably podnet's, nothing to adopt): {}",
            rr.unaccounted_links_kept.join(", ")
        );
    }
    if args.all_addresses {
        println!("Allocated addresses:");
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
        for l in lines {
            println!("{l}");
        }
    }
    0
}

/// `0 waiting`, and the entries set aside as unreadable with what to do about them.
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
}
