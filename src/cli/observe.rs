//! `podnet observe`: the packets a policy denied on this node (or, with
//! `--policy-audit-mode`, would have), and with `--allowed` the connections a
//! policy rule allowed, as the kernel logs them, one line each while it runs:
//! time, source and destination (a pod's `namespace/name`, or the address),
//! protocol and port, direction, verdict and what decided: the NetworkPolicies
//! whose default deny it is or whose rules allowed it, or the
//! ClusterNetworkPolicy, tier and rule. The node logs at most
//! `daemon::observe::PER_SECOND` records a second of each kind (denied,
//! allowed); `podnet_policy_verdicts_suppressed_total` counts the rest.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::api::client::Client;
use crate::api::models::ObservedVerdict;

/// `podnet observe` options.
#[derive(Debug, Clone, Args)]
pub struct ObserveArgs {
    /// Only packets to or from this namespace's pods.
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Only packets to or from pods of this name.
    #[arg(long)]
    pub pod: Option<String>,
    /// Only this verdict: denied, audit or allowed.
    #[arg(long)]
    pub verdict: Option<String>,
    /// The connections a policy rule allowed too (each one's first packet).
    #[arg(long)]
    pub allowed: bool,
    /// The daemon's socket.
    #[arg(long, default_value = crate::api::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Output format: text or json (one object per line).
    #[arg(short = 'o', long = "output", default_value = "text")]
    pub output: String,
}

/// Runs `podnet observe` until the daemon closes the stream; exit 1 when it
/// cannot start or the stream broke.
pub fn run(args: &ObserveArgs) -> i32 {
    if !["text", "json"].contains(&args.output.as_str()) {
        eprintln!(
            "podnet observe: -o {:?} is not one of text, json",
            args.output
        );
        return 2;
    }
    let client = Client::new(&args.socket, Duration::from_secs(10));
    let filter: Vec<(&str, &str)> = [
        ("namespace", &args.namespace),
        ("pod", &args.pod),
        ("verdict", &args.verdict),
    ]
    .into_iter()
    .filter_map(|(k, v)| Some((k, v.as_deref()?)))
    .chain(args.allowed.then_some(("allowed", "true")))
    .collect();
    let json = args.output == "json";
    let printed = client.observe(&filter, |line| match json {
        true => println!("{line}"),
        false => match serde_json::from_str::<ObservedVerdict>(line) {
            Ok(v) => println!("{}", text(&v)),
            Err(_) => println!("{line}"),
        },
    });
    match printed {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("podnet observe: {e}");
            1
        }
    }
}

/// One verdict as a line of text.
pub fn text(v: &ObservedVerdict) -> String {
    let port = v.port.map(|p| format!(" {p}")).unwrap_or_default();
    format!(
        "{} {} -> {} {}{port} {} {}: {}",
        v.time, v.source, v.destination, v.protocol, v.direction, v.verdict, v.policy
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verdict_is_one_line_naming_both_pods_and_the_policy() {
        let v = ObservedVerdict {
            time: "2026-12-07T06:00:00Z".into(),
            source: "default/client".into(),
            destination: "default/web".into(),
            protocol: "TCP".into(),
            port: Some(80),
            direction: "ingress".into(),
            verdict: "denied".into(),
            policy: "default deny of NetworkPolicy default/web-deny".into(),
        };
        assert_eq!(
            text(&v),
            "2026-12-07T06:00:00Z default/client -> default/web TCP 80 ingress denied: default deny of NetworkPolicy default/web-deny"
        );
        let icmp = ObservedVerdict {
            protocol: "ICMP".into(),
            port: None,
            ..v
        };
        assert!(text(&icmp).contains("default/web ICMP ingress denied"));
    }
}
