//! `podnet explain <pod|ip|container-id>`: why this pod has this address, or why it
//! has none (the matching allocations with their rule, range, times and state, and
//! the recent failures with the troubleshooting hint, and the packets the source
//! check dropped because the pod sent with an address it does not own, what
//! the last leak check found for the addresses, and per direction which
//! ClusterNetworkPolicies of the Admin tier, NetworkPolicies and Baseline
//! ClusterNetworkPolicies apply to the pod, in order, and what they do).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::api::client::Client;
use crate::store::now_ms;

/// `podnet explain` options.
#[derive(Debug, Clone, Args)]
pub struct ExplainArgs {
    /// A pod (`namespace/name`), an address, or a container ID.
    pub query: String,
    /// The daemon's socket.
    #[arg(long, default_value = crate::api::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Output format: text or json.
    #[arg(short = 'o', long = "output", default_value = "text")]
    pub output: String,
}

/// Runs `podnet explain`; exit 0 when something matched, 1 when nothing did.
pub fn run(args: &ExplainArgs) -> i32 {
    let client = Client::new(&args.socket, Duration::from_secs(10));
    let ex = match client.explain(&args.query) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("podnet explain: {e}");
            return 1;
        }
    };
    let found = !ex.addresses.is_empty() || !ex.failures.is_empty() || ex.l2.is_some();
    if args.output == "json" {
        println!("{}", serde_json::to_string_pretty(&ex).unwrap_or_default());
        return if found { 0 } else { 1 };
    }
    println!("{}", ex.summary);
    let now = now_ms();
    for a in &ex.addresses {
        println!();
        println!("Address:    {} ({}, pool {})", a.ip, a.state, a.pool);
        println!("Owner:      {}", a.owner);
        if !a.container_id.is_empty() {
            println!(
                "Attachment: {} {} (network {}, host link {})",
                a.container_id, a.ifname, a.network, a.host_link
            );
        }
        println!("Range:      {}", a.range);
        println!("Rule:       {}", a.rule);
        println!(
            "Allocated:  {} s ago{}",
            now.saturating_sub(a.allocated_at_ms) / 1000,
            if a.restored {
                " (restored after a restart)"
            } else {
                ""
            }
        );
        if a.until_ms > 0 {
            let what = if a.state == "cooling" {
                "Free again in"
            } else {
                "Expires in"
            };
            println!("{what}: {} s", a.until_ms.saturating_sub(now) / 1000);
        }
    }
    for p in &ex.policy {
        println!();
        let enforced = match p.enforced {
            true => "",
            false => " (not enforced: its host link is not podnet's)",
        };
        println!("Policy:     {}{enforced}", p.pod);
        for (direction, d) in [("Ingress:", &p.ingress), ("Egress:", &p.egress)] {
            println!("  {direction:<9} {}", d.summary);
            let tier = |name: &str, tier: &[crate::api::models::ClusterPolicyRules]| {
                for c in tier {
                    let rules = c.rules.join("; ");
                    println!("    {name} {} (priority {}): {rules}", c.policy, c.priority);
                }
            };
            tier("Admin", &d.admin);
            for allows in &d.policies {
                println!("    {}: {}", allows.policy, allows.allows.join("; "));
            }
            tier("Baseline", &d.baseline);
        }
    }
    for t in &ex.spoofed_traffic {
        println!();
        println!(
            "Spoofed:    {} packets ({} bytes) dropped on host link {} by the source check (a source address the pod does not own); forgotten in {} s unless more come",
            t.packets, t.bytes, t.host_link, t.expires_in_s
        );
    }
    for l in &ex.leaks {
        println!();
        println!("Leak check: {}", l.sentence());
    }
    if let Some(l2) = &ex.l2 {
        print_l2(l2);
    }
    for f in &ex.failures {
        println!();
        println!(
            "Failure {} s ago: {} {} ({})",
            now.saturating_sub(f.at_ms) / 1000,
            f.verb,
            f.message,
            f.reason
        );
        println!("Hint: {}", f.hint);
    }
    if found { 0 } else { 1 }
}

/// The L2 announcement of the address asked about: who answers, then every
/// node with why it does or does not.
fn print_l2(l2: &crate::api::models::L2Explanation) {
    println!();
    let answerer = l2.answerer.as_deref().unwrap_or("no node");
    println!(
        "L2:         {} ({} address of {}): {answerer} answers ARP/NDP",
        l2.address,
        l2.kind,
        l2.services.join(", ")
    );
    for c in &l2.candidates {
        let policy = c
            .policy
            .as_deref()
            .map(|p| format!(" [policy {p}]"))
            .unwrap_or_default();
        println!("  {:<12} {}{policy}", c.node, c.why);
    }
}
