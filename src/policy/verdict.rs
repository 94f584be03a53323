//! Verdicts the kernel reports: a pod chain's final drop (what no
//! NetworkPolicy allows) and each ClusterNetworkPolicy Deny (Admin or Baseline
//! tier) logged to an NFLOG group, under one node-wide `limit` object so a
//! flood costs the node at most [`DropLog::per_second`] log records, with a
//! named counter of what the limit suppressed. What a policy allowed is logged
//! too, under a limit of its own ([`LIMIT_ALLOWED`], so allowed traffic never
//! uses up the budget of drops): each ClusterNetworkPolicy Allow rule, and a
//! NetworkPolicy allow rule through the direction's [`allowed_chain`]. Only a
//! connection's first packet reaches a pod chain (the forward chain accepts the
//! rest), so that is one record per connection. Each record's prefix
//! ([`prefix`], [`tier_prefix`], read back by [`parse_prefix`]) says the
//! verdict and the direction, and for a tier's rule the tier, policy and rule;
//! the agent names the pods (and the NetworkPolicies of a final drop or an
//! allow) from the packet's addresses (`daemon::observe`). With
//! [`DropLog::audit`] every logged drop lets the packet through and reports it
//! as `audit` (Cilium's `policy-audit-mode`).

use super::state::{Direction, Origin};
use super::view::Tier;

/// The node-wide limit object every logged drop shares.
pub const LIMIT: &str = "verdict_log";
/// The node-wide limit object every logged allow shares.
pub const LIMIT_ALLOWED: &str = "verdict_log_allowed";
/// The counter of the packets the limits kept from the log.
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
    /// Let what a policy would drop through (the final drop's and each
    /// ClusterNetworkPolicy Deny's), reported as `audit`.
    pub audit: bool,
}

/// What happened to a logged packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// Dropped: no policy allows it.
    Denied,
    /// Let through by audit mode, which would have dropped it.
    Audit,
    /// Allowed by a policy's rule.
    Allowed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Denied => "denied",
            Outcome::Audit => "audit",
            Outcome::Allowed => "allowed",
        }
    }
}

/// The longest prefix the kernel keeps (`NF_LOG_PREFIXLEN` less its NUL).
pub const PREFIX_MAX: usize = 127;
/// What ends a name [`tier_prefix`] had to cut short (no Kubernetes name has it).
const CUT: char = '~';

/// The prefix of a final drop's log record: `podnet denied ingress`.
pub fn prefix(outcome: Outcome, direction: Direction) -> String {
    format!("{PREFIX_HEAD} {} {}", outcome.as_str(), direction.as_str())
}

/// The prefix of a ClusterNetworkPolicy Deny's log record:
/// `podnet denied ingress admin 0 <policy> [<rule name>]`, at most
/// [`PREFIX_MAX`] bytes: the rule's name is cut (or left out) first, then
/// the policy's, each cut name ending in `~`; bytes other than ASCII letters,
/// digits, `.`, `-` and `_` become `_`.
pub fn tier_prefix(outcome: Outcome, direction: Direction, origin: &Origin) -> String {
    let mut text = format!(
        "{} {} {}",
        prefix(outcome, direction),
        tier_word(origin.tier),
        origin.index
    );
    let room = PREFIX_MAX.saturating_sub(text.len() + 1);
    let policy = fit(&origin.policy, room);
    text = format!("{text} {policy}");
    let room = PREFIX_MAX.saturating_sub(text.len() + 1);
    if let Some(name) = origin.name.as_deref().filter(|_| room >= 2) {
        text = format!("{text} {}", fit(name, room));
    }
    text
}

fn tier_word(tier: Tier) -> &'static str {
    match tier {
        Tier::Admin => "admin",
        Tier::Baseline => "baseline",
    }
}

/// `name` made safe for a quoted nft string and one word of a prefix, in at
/// most `room` bytes (cut ones end in [`CUT`]).
fn fit(name: &str, room: usize) -> String {
    let safe = |c: char| match c.is_ascii_alphanumeric() || ".-_".contains(c) {
        true => c,
        false => '_',
    };
    let text: String = name.chars().map(safe).collect();
    match text.len() <= room {
        true => text,
        false => {
            let mut cut: String = text.chars().take(room.saturating_sub(1)).collect();
            cut.push(CUT);
            cut
        }
    }
}

/// A log prefix that is not one [`prefix`] or [`tier_prefix`] writes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "NFLOG prefix {0:?} is not podnet's (podnet <denied|audit|allowed> <ingress|egress> [<admin|baseline> <rule index> <policy> [<rule name>]])"
)]
pub struct ForeignPrefix(pub String);

/// What a podnet log record's prefix says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logged {
    pub outcome: Outcome,
    pub direction: Direction,
    /// The ClusterNetworkPolicy rule that decided (its names as the prefix
    /// kept them); None: a NetworkPolicy chain's default deny, or its allow.
    pub origin: Option<Origin>,
}

/// What a prefix says: outcome, direction, and the rule when a tier's Deny wrote it.
pub fn parse_prefix(text: &str) -> Result<Logged, ForeignPrefix> {
    let foreign = || ForeignPrefix(text.to_string());
    let mut words = text.split(' ');
    if words.next() != Some(PREFIX_HEAD) {
        return Err(foreign());
    }
    let outcome = match words.next() {
        Some("denied") => Outcome::Denied,
        Some("audit") => Outcome::Audit,
        Some("allowed") => Outcome::Allowed,
        _ => return Err(foreign()),
    };
    let direction = match words.next() {
        Some("ingress") => Direction::Ingress,
        Some("egress") => Direction::Egress,
        _ => return Err(foreign()),
    };
    let origin = match words.next() {
        None => None,
        Some(tier) => Some(parse_origin(tier, &mut words).ok_or_else(foreign)?),
    };
    match words.next() {
        None => Ok(Logged {
            outcome,
            direction,
            origin,
        }),
        Some(_) => Err(foreign()),
    }
}

/// The origin after the direction: tier, index, policy, and maybe the rule's name.
fn parse_origin<'a>(tier: &str, words: &mut impl Iterator<Item = &'a str>) -> Option<Origin> {
    let tier = match tier {
        "admin" => Tier::Admin,
        "baseline" => Tier::Baseline,
        _ => return None,
    };
    let index = words
        .next()
        .filter(|i| i.bytes().all(|b| b.is_ascii_digit()))?;
    let index = index.parse().ok()?;
    let policy = words.next().filter(|p| !p.is_empty())?.to_string();
    let name = match words.next() {
        Some("") => return None,
        name => name.map(str::to_string),
    };
    Some(Origin {
        tier,
        policy,
        index,
        name,
    })
}

/// The table's objects the logged verdicts use: the two limits and the counter.
pub fn objects(log: &DropLog) -> [String; 3] {
    let n = log.per_second;
    [
        format!("limit {LIMIT} {{ rate {n}/second burst {n} packets }}"),
        format!("limit {LIMIT_ALLOWED} {{ rate {n}/second burst {n} packets }}"),
        format!("counter {SUPPRESSED} {{ }}"),
    ]
}

/// The chain a NetworkPolicy allow rule of `direction` goes to (`goto`) when
/// verdicts are logged: it logs the packet under [`LIMIT_ALLOWED`] and gives
/// it `allow` (no pod chain's name starts with `allowed_`).
pub fn allowed_chain(direction: Direction) -> String {
    format!("allowed_{}", direction.as_str())
}

/// The rules of [`allowed_chain`].
pub fn allowed_chain_rules(direction: Direction, log: &DropLog, allow: &str) -> [String; 2] {
    limited_rules(
        LIMIT_ALLOWED,
        &prefix(Outcome::Allowed, direction),
        log,
        allow,
    )
}

/// The ends of a ClusterNetworkPolicy Allow's two rules (each after the
/// rule's match): logged under [`LIMIT_ALLOWED`] with [`tier_prefix`], the
/// rest counted; both give `allow`.
pub fn allow_rules(
    direction: Direction,
    origin: &Origin,
    log: &DropLog,
    allow: &str,
) -> [String; 2] {
    let prefix = tier_prefix(Outcome::Allowed, direction, origin);
    limited_rules(LIMIT_ALLOWED, &prefix, log, allow)
}

/// A chain's final rules: `drop`, or, logged, the packets under the limit
/// logged and given `verdict`, the rest counted and given it too. `allow` is
/// what the chain gives an allowed packet (audit mode's verdict).
pub fn final_rules(direction: Direction, log: Option<&DropLog>, allow: &str) -> Vec<String> {
    let Some(log) = log else {
        return vec!["drop".into()];
    };
    logged_rules(&prefix(outcome_of(log), direction), log, allow).into()
}

/// The ends of a ClusterNetworkPolicy Deny's two rules (each after the
/// rule's match), logged as [`final_rules`] are, with [`tier_prefix`].
pub fn deny_rules(
    direction: Direction,
    origin: &Origin,
    log: &DropLog,
    allow: &str,
) -> [String; 2] {
    let prefix = tier_prefix(outcome_of(log), direction, origin);
    logged_rules(&prefix, log, allow)
}

fn outcome_of(log: &DropLog) -> Outcome {
    match log.audit {
        true => Outcome::Audit,
        false => Outcome::Denied,
    }
}

/// A drop's two rules under [`LIMIT`]; audit mode's verdict is `allow`.
fn logged_rules(prefix: &str, log: &DropLog, allow: &str) -> [String; 2] {
    let verdict = match log.audit {
        true => allow,
        false => "drop",
    };
    limited_rules(LIMIT, prefix, log, verdict)
}

/// Under `limit`: logged with `prefix` and given `verdict`; the rest counted
/// and given it too.
fn limited_rules(limit: &str, prefix: &str, log: &DropLog, verdict: &str) -> [String; 2] {
    [
        format!(
            "limit name \"{limit}\" log prefix \"{prefix}\" group {} {verdict}",
            log.group
        ),
        format!("counter name \"{SUPPRESSED}\" {verdict}"),
    ]
}

#[cfg(test)]
#[path = "tests/verdict.rs"]
mod tests;
