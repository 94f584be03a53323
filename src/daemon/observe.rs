//! `GET /v1/observe` (`podnet observe`): the policy verdicts the kernel logged.
//! The policy table logs each pod chain's final drop, and each connection a
//! policy rule allowed, to NFLOG group [`GROUP`] under node-wide limits
//! (`policy::verdict`). One thread ([`spawn_reader`]) reads the group, names
//! both ends of each packet (a pod's `namespace/name` from the policy loop's
//! last [`Names`], else the address) and what decided: the
//! ClusterNetworkPolicy rule its prefix names ([`tier_rule`]), else the
//! NetworkPolicies whose default deny it is, or whose allow rules let it in
//! (one of those selecting the pod; podnet merges their rules); counts it
//! (`policy_verdicts_total{direction,verdict,policy}`) and hands it to the
//! observers: a broadcast channel of [`BUFFERED`] lines, so a slow client loses
//! lines (counted: `policy_observe_lines_lost_total`) and never holds the
//! reader. A client's lines are filtered ([`Filter`]: allowed ones only when
//! asked for) and written as JSON, one per line, until it goes. Nothing here
//! runs per packet the limits suppressed: the kernel counts those
//! (`policy::table::suppressed`), summed here across the table's reinstalls
//! ([`SuppressedCount`]).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use bytes::Bytes;
use futures::{Stream, StreamExt, stream};
use hyper::body::Frame;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::broadcast;

use super::metrics::VerdictLabels;
use crate::api::models::ObservedVerdict;
use crate::datapath::nflog::{self, NflogSocket, Packet};
use crate::policy::Explanations;
use crate::policy::state::Direction;
use crate::policy::state::Origin;
use crate::policy::verdict::{self, Logged, Outcome};
use crate::policy::view::Tier;

/// The streaming route.
pub const OBSERVE_PATH: &str = "/v1/observe";
/// The NFLOG group of the policy table's verdicts.
pub const GROUP: u16 = 5730;
/// The records a second the whole node logs at most (and the burst).
pub const PER_SECOND: u32 = 100;
/// Lines buffered for each observer before the slowest loses the oldest.
const BUFFERED: usize = 1024;

/// Who is who, as the policy loop's last write knew it.
#[derive(Debug, Default)]
pub struct Names {
    /// Every pod's `namespace/name` by each of its addresses.
    pub pods: HashMap<IpAddr, String>,
    /// The policies selecting each local pod.
    pub explanations: Arc<Explanations>,
}

/// The verdicts' shared part: the names, the counters and the observers.
pub struct Verdicts {
    lines: broadcast::Sender<Arc<ObservedVerdict>>,
    names: RwLock<Arc<Names>>,
    counts: Family<VerdictLabels, Counter>,
    /// Lines slow observers lost.
    lost: Counter,
    /// Records that could not be read, and receive buffer overflows.
    unreadable: Counter,
    /// What the limits suppressed, kept across the kernel counter's restarts.
    suppressed: tokio::sync::Mutex<SuppressedCount>,
}

/// The kernel's suppressed counter, summed across its restarts: a table
/// installed again (repaired, or after `nft flush ruleset`) starts its counter
/// at 0, and the metric must not go back.
#[derive(Debug, Default)]
pub struct SuppressedCount {
    /// The kernel's value last read.
    seen: u64,
    total: u64,
}

impl SuppressedCount {
    /// The total once the kernel says `kernel`: what it grew by, or, below the
    /// value last read, all of it (the counter started again since).
    pub fn take(&mut self, kernel: u64) -> u64 {
        let grown = kernel.checked_sub(self.seen).unwrap_or(kernel);
        self.total = self.total.saturating_add(grown);
        self.seen = kernel;
        self.total
    }
}

impl Verdicts {
    /// `counts`, `lost` and `unreadable` are the metrics' (shared) handles.
    pub fn new(
        counts: Family<VerdictLabels, Counter>,
        lost: Counter,
        unreadable: Counter,
    ) -> Verdicts {
        Verdicts {
            lines: broadcast::channel(BUFFERED).0,
            names: RwLock::default(),
            counts,
            lost,
            unreadable,
            suppressed: tokio::sync::Mutex::default(),
        }
    }

    /// What the limits suppressed since the agent started reading, the
    /// kernel's counter read now (None: it cannot be read). One read at a time,
    /// so two scrapes cannot take each other's reads for a restart.
    pub async fn suppressed(&self) -> Option<u64> {
        let mut count = self.suppressed.lock().await;
        let kernel = super::policy_loop::suppressed().await?;
        Some(count.take(kernel))
    }

    /// The names the next records are read with.
    pub fn set_names(&self, names: Names) {
        if let Ok(mut n) = self.names.write() {
            *n = Arc::new(names);
        }
    }

    fn names(&self) -> Arc<Names> {
        self.names.read().map(|n| n.clone()).unwrap_or_default()
    }

    /// Names, counts and hands out one record.
    fn take(&self, record: &nflog::Record) {
        let read = verdict::parse_prefix(&record.prefix)
            .map_err(|e| e.to_string())
            .and_then(|p| {
                Ok((
                    p,
                    nflog::parse_packet(&record.payload).map_err(|e| e.to_string())?,
                ))
            });
        let (logged, packet) = match read {
            Ok(read) => read,
            Err(e) => {
                tracing::debug!(error = %e, "NFLOG record not read");
                self.unreadable.inc();
                return;
            }
        };
        let time = record.time.unwrap_or_else(SystemTime::now);
        let line = describe(time, &logged, &packet, &self.names());
        let labels = VerdictLabels {
            direction: line.direction.clone(),
            verdict: line.verdict.clone(),
            policy: line.policy.clone(),
        };
        self.counts.get_or_create(&labels).inc();
        // No observer: nobody to give it to.
        let _ = self.lines.send(Arc::new(line));
    }
}

/// The line of one logged packet.
pub fn describe(
    time: SystemTime,
    logged: &Logged,
    packet: &Packet,
    names: &Names,
) -> ObservedVerdict {
    let name = |ip: IpAddr| {
        names
            .pods
            .get(&ip)
            .cloned()
            .unwrap_or_else(|| ip.to_string())
    };
    let direction = logged.direction;
    let local = match direction {
        Direction::Ingress => packet.destination,
        Direction::Egress => packet.source,
    };
    let selecting = names.explanations.selecting(local, direction);
    let policy = match (&logged.origin, logged.outcome) {
        (Some(origin), _) => tier_rule(origin, direction),
        (None, Outcome::Allowed) => match selecting {
            Some((_, [])) | None => "a NetworkPolicy (its name not known yet)".into(),
            Some((_, [one])) => format!("NetworkPolicy {one}"),
            Some((_, many)) => format!("one of NetworkPolicies {}", many.join(", ")),
        },
        (None, _) => match selecting {
            Some((_, [])) | None => format!("default deny of {}", enforcement_reason(names)),
            Some((_, [one])) => format!("default deny of NetworkPolicy {one}"),
            Some((_, many)) => format!("default deny of NetworkPolicies {}", many.join(", ")),
        },
    };
    ObservedVerdict {
        time: k8s_openapi::jiff::Timestamp::try_from(time)
            .map(|t| t.to_string())
            .unwrap_or_default(),
        source: name(packet.source),
        destination: name(packet.destination),
        protocol: packet.transport.name(),
        port: packet.port,
        direction: direction.as_str().into(),
        verdict: logged.outcome.as_str().into(),
        policy,
    }
}

/// A ClusterNetworkPolicy rule as a line names it:
/// `ClusterNetworkPolicy admin-deny-blue (Admin tier, ingress rule 0 "deny-blue")`
/// (no quoted name when the rule has none; a name the log prefix had to cut
/// ends in `~`).
fn tier_rule(origin: &Origin, direction: Direction) -> String {
    let tier = match origin.tier {
        Tier::Admin => "Admin",
        Tier::Baseline => "Baseline",
    };
    let name = match &origin.name {
        Some(n) => format!(" {n:?}"),
        None => String::new(),
    };
    format!(
        "ClusterNetworkPolicy {} ({tier} tier, {} rule {}{name})",
        origin.policy,
        direction.as_str(),
        origin.index
    )
}

/// Why a pod no policy selects is isolated.
fn enforcement_reason(names: &Names) -> &'static str {
    match names.explanations.enforcement {
        crate::policy::Enforcement::Always => "--enable-policy always",
        crate::policy::Enforcement::Default => "a pod chain (its policies not known yet)",
    }
}

/// Starts the thread that reads the verdicts' NFLOG group in this network
/// namespace. A group another process holds is logged: there are no verdicts
/// to observe then, and the table still drops.
pub fn spawn_reader(verdicts: Arc<Verdicts>) {
    let socket = match NflogSocket::bind(GROUP) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "policy verdicts cannot be read: podnet observe shows none");
            return;
        }
    };
    let spawned = std::thread::Builder::new()
        .name("policy-verdicts".into())
        .spawn(move || read_forever(&socket, &verdicts));
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "policy verdicts: no reader thread");
    }
}

fn read_forever(socket: &NflogSocket, verdicts: &Verdicts) {
    let mut buf = Vec::with_capacity(64 * 1024);
    loop {
        match socket.receive(&mut buf) {
            Ok(records) => {
                for record in records {
                    match record {
                        Ok(r) => verdicts.take(&r),
                        Err(e) => {
                            tracing::debug!(error = %e, "NFLOG message not read");
                            verdicts.unreadable.inc();
                        }
                    }
                }
            }
            Err(e) if e.records_lost() => {
                verdicts.unreadable.inc();
            }
            // Not expected of a bound socket: logged, and read again after a
            // pause so a socket that keeps failing costs nothing.
            Err(e) => {
                tracing::warn!(error = %e, "policy verdicts: NFLOG receive failed");
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        }
    }
}

/// Which lines an observer wants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Either end in this namespace.
    pub namespace: Option<String>,
    /// Either end a pod of this name.
    pub pod: Option<String>,
    /// `denied`, `audit` or `allowed`.
    pub verdict: Option<String>,
    /// Allowed packets too (without it, or `verdict` `allowed`, none).
    pub allowed: bool,
}

/// A filter the observe endpoint refuses: the field and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    #[error("observe: verdict {0:?} is not one of denied, audit, allowed")]
    Verdict(String),
    #[error("observe: allowed {0:?} is not one of true, false")]
    Allowed(String),
    #[error("observe: {field} {value:?} is not a Kubernetes name")]
    Name { field: &'static str, value: String },
}

impl Filter {
    /// The filter of the query's `namespace`, `pod`, `verdict` and `allowed`.
    pub fn from_query(query: &HashMap<String, String>) -> Result<Filter, FilterError> {
        let get = |k: &str| query.get(k).filter(|v| !v.is_empty()).cloned();
        let name = |field: &'static str| -> Result<Option<String>, FilterError> {
            match get(field) {
                Some(v) if !is_name(&v) => Err(FilterError::Name { field, value: v }),
                v => Ok(v),
            }
        };
        let verdict = get("verdict");
        if let Some(v) = verdict
            .as_deref()
            .filter(|v| !["denied", "audit", "allowed"].contains(v))
        {
            return Err(FilterError::Verdict(v.to_string()));
        }
        let allowed = match get("allowed").as_deref() {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => return Err(FilterError::Allowed(other.to_string())),
        };
        Ok(Filter {
            namespace: name("namespace")?,
            pod: name("pod")?,
            allowed: allowed || verdict.as_deref() == Some("allowed"),
            verdict,
        })
    }

    pub fn admits(&self, line: &ObservedVerdict) -> bool {
        let ends = [line.source.as_str(), line.destination.as_str()];
        let split = |end: &'_ str| {
            end.split_once('/')
                .map(|(ns, n)| (ns.to_string(), n.to_string()))
        };
        let pods: Vec<(String, String)> = ends.into_iter().filter_map(split).collect();
        let namespace = self.namespace.as_ref();
        let pod_ok = |(ns, n): &(String, String)| {
            namespace.is_none_or(|want| want == ns)
                && self.pod.as_ref().is_none_or(|want| want == n)
        };
        let by_pod = match (namespace, &self.pod) {
            (None, None) => true,
            _ => pods.iter().any(pod_ok),
        };
        let wanted = self.allowed || line.verdict != Outcome::Allowed.as_str();
        wanted && by_pod && self.verdict.as_ref().is_none_or(|v| *v == line.verdict)
    }
}

/// A DNS-1123 name as Kubernetes namespaces and pods have (lower case,
/// digits, `-` and `.`, at most 253).
fn is_name(s: &str) -> bool {
    s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// The body of one observer: its lines as JSON, one per line, while it stays.
pub fn lines(
    verdicts: &Verdicts,
    filter: Filter,
) -> impl Stream<Item = Result<Frame<Bytes>, Infallible>> + Send + use<> {
    let rx = verdicts.lines.subscribe();
    let lost = verdicts.lost.clone();
    stream::unfold(rx, move |mut rx| {
        let lost = lost.clone();
        async move {
            loop {
                match rx.recv().await {
                    Ok(line) => return Some((line, rx)),
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        lost.inc_by(n);
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        }
    })
    .filter(move |line| std::future::ready(filter.admits(line)))
    .map(|line| {
        let mut text = serde_json::to_vec(&*line).unwrap_or_default();
        text.push(b'\n');
        Ok(Frame::data(Bytes::from(text)))
    })
}

#[cfg(test)]
#[path = "tests/observe.rs"]
mod tests;
