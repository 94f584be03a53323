//! `podnet status`: the IPAM one-liner in Cilium's form, the node's ranges, and with
//! `--all-addresses` every address and its owner; `-o json` for scripts.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::api::client::Client;

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
            eprintln!("podnet status: {e}");
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
    match status.cilium.msg.as_str() {
        "" => println!("State:      {state}"),
        msg => println!("State:      {state} ({msg})"),
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
    println!("DEL queue:  {} waiting", ipam.queue_depth);
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
