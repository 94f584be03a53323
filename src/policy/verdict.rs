//! Verdicts the kernel reports: a pod chain's final drop (what no
//! NetworkPolicy allows) logged to an NFLOG group, under one node-wide `limit`
//! object so a flood costs the node at most [`DropLog::per_second`] log records,
//! with a named counter of what the limit suppressed. Each record's prefix
//! ([`prefix`], read back by [`parse_prefix`]) says the verdict and the
//! direction; the agent names the pods and the policies from the packet's
//! addresses (`daemon::observe`). With [`DropLog::audit`] the final drop lets
//! the packet through and reports it as `audit` (Cilium's `policy-audit-mode`).

use super::state::Direction;

/// The node-wide limit object every logged drop shares.
pub const LIMIT: &str = "verdict_log";
/// The counter of the packets the limit kept from the log.
pub const SUPPRESSED: &str = "verdict_log_suppressed";
/// What every prefix starts with (other NFLOG users of the group are not ours).
const PREFIX_HEAD: &str = "podnet";

/// How a chain's final drop is logged (the agent's options; fixed for its life).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DropLog {
    /// The NFLOG group the records go to.
    pub group: u16,
    /// The node-wide budget of log records per second (and the burst).
    pub per_second: u32,
    /// Let what no policy allows through, reported as `audit`.
    pub audit: bool,
}

/// What happened to a logged packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// Dropped: no policy allows it.
    Denied,
    /// Let through by audit mode, which would have dropped it.
    Audit,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Denied => "denied",
            Outcome::Audit => "audit",
        }
    }
}

/// The prefix of a final drop's log record: `podnet denied ingress`.
pub fn prefix(outcome: Outcome, direction: Direction) -> String {
    format!("{PREFIX_HEAD} {} {}", outcome.as_str(), direction.as_str())
}

/// A log prefix that is not one [`prefix`] writes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("NFLOG prefix {0:?} is not podnet's (podnet <denied|audit> <ingress|egress>)")]
pub struct ForeignPrefix(pub String);

/// The outcome and direction a prefix says.
pub fn parse_prefix(text: &str) -> Result<(Outcome, Direction), ForeignPrefix> {
    let foreign = || ForeignPrefix(text.to_string());
    let mut words = text.split(' ');
    if words.next() != Some(PREFIX_HEAD) {
        return Err(foreign());
    }
    let outcome = match words.next() {
        Some("denied") => Outcome::Denied,
        Some("audit") => Outcome::Audit,
        _ => return Err(foreign()),
    };
    let direction = match words.next() {
        Some("ingress") => Direction::Ingress,
        Some("egress") => Direction::Egress,
        _ => return Err(foreign()),
    };
    match words.next() {
        None => Ok((outcome, direction)),
        Some(_) => Err(foreign()),
    }
}

/// The table's objects the logged drops use: the limit and the counter.
pub fn objects(log: &DropLog) -> [String; 2] {
    let n = log.per_second;
    [
        format!("limit {LIMIT} {{ rate {n}/second burst {n} packets }}"),
        format!("counter {SUPPRESSED} {{ }}"),
    ]
}

/// A chain's final rules: `drop`, or, logged, the packets under the limit
/// logged and given `verdict`, the rest counted and given it too. `allow` is
/// what the chain gives an allowed packet (audit mode's verdict).
pub fn final_rules(direction: Direction, log: Option<&DropLog>, allow: &str) -> Vec<String> {
    let Some(log) = log else {
        return vec!["drop".into()];
    };
    let (outcome, verdict) = match log.audit {
        true => (Outcome::Audit, allow),
        false => (Outcome::Denied, "drop"),
    };
    vec![
        format!(
            "limit name \"{LIMIT}\" log prefix \"{}\" group {} {verdict}",
            prefix(outcome, direction),
            log.group
        ),
        format!("counter name \"{SUPPRESSED}\" {verdict}"),
    ]
}

#[cfg(test)]
#[path = "tests/verdict.rs"]
mod tests;
