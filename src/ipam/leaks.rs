//! The per-node leak check, pure (no I/O): the node's allocations against the
//! Pods the API server lists on this node and the host links the kernel has.
//!
//! An allocation is a leak only when all three say so:
//! - its pod no longer exists: no Pod with the UID the allocation recorded (a
//!   new Pod of the same name is another pod), or, for an allocation that
//!   recorded no UID, no Pod of its namespace and name;
//! - its sandbox is gone: the host link of its attachment is not in the
//!   kernel (an allocation whose host link is unknown is never a leak: there is
//!   no evidence that its sandbox is gone);
//! - it is older than the grace period (a pod being created can have its
//!   address before the API server lists it on this node).
//!
//! An allocation whose host link exists is never a leak, whatever the API server
//! says: the API server may be behind, and the runtime still has the sandbox.
//! Such allocations are reported (the pod is gone, the link is not) so an
//! operator can look, and nothing is released for them.
//!
//! [`LeakTracker`] decides what to release: a leak found in every check for
//! `--ipam-release-leaked-after`. Only a check that listed the Pods makes a
//! report, so while the API server cannot be reached nothing is observed and
//! nothing is released.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A Pod, namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PodName {
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for PodName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One of the node's allocations, as the check needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAllocation {
    pub ip: IpAddr,
    /// The pod it was allocated for; None for the daemon's own addresses
    /// (router, health, ingress), which are never checked.
    pub pod: Option<PodName>,
    /// The pod's UID, when the allocation recorded it.
    pub pod_uid: Option<String>,
    pub container_id: Option<String>,
    /// The host-side link of its attachment, when known.
    pub host_link: Option<String>,
    /// How long ago it was allocated.
    pub age: Duration,
}

/// A Pod the API server lists on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePod {
    pub pod: PodName,
    pub uid: String,
}

/// Why the check says an allocation's pod is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "kebab-case")]
pub enum PodGone {
    /// No Pod has the UID the allocation recorded, nor its name.
    NoPod { uid: Option<String> },
    /// A Pod of the same name runs, with another UID: a new pod.
    Replaced {
        recorded_uid: String,
        running_uid: String,
    },
}

impl fmt::Display for PodGone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PodGone::NoPod { uid: Some(uid) } => {
                write!(f, "no pod with UID {uid} or its name on this node")
            }
            PodGone::NoPod { uid: None } => write!(
                f,
                "no pod of that name on this node (compared by name: the allocation recorded no UID)"
            ),
            PodGone::Replaced {
                recorded_uid,
                running_uid,
            } => write!(
                f,
                "the pod of that name is a new one (UID {running_uid}, the allocation's was {recorded_uid})"
            ),
        }
    }
}

/// What the check concluded for one allocation whose pod is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "kebab-case")]
pub enum Verdict {
    /// Pod gone, host link gone, older than the grace period.
    Leak { host_link: String },
    /// Pod gone, but its host link exists: never released this way.
    HostLinkPresent { host_link: String },
    /// Pod gone, host link gone, but younger than the grace period.
    WithinGrace { host_link: String },
    /// Pod gone, but the allocation names no host link to look for.
    HostLinkUnknown,
}

/// One allocation whose pod is gone, with the evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub ip: IpAddr,
    pub pod: PodName,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    pub pod_gone: PodGone,
    pub verdict: Verdict,
    pub age_seconds: u64,
}

impl Finding {
    /// True when the allocation is a leak.
    pub fn is_leak(&self) -> bool {
        matches!(self.verdict, Verdict::Leak { .. })
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}", self.ip, self.pod)?;
        if let Some(c) = &self.container_id {
            write!(f, ", container {c}")?;
        }
        write!(
            f,
            ", allocated {}s ago): {}; ",
            self.age_seconds, self.pod_gone
        )?;
        match &self.verdict {
            Verdict::Leak { host_link } => write!(f, "host link {host_link} is gone: leaked"),
            Verdict::HostLinkPresent { host_link } => write!(
                f,
                "but host link {host_link} exists (the runtime still has the sandbox): kept"
            ),
            Verdict::WithinGrace { host_link } => write!(
                f,
                "host link {host_link} is gone, but the allocation is within the grace period: not yet a leak"
            ),
            Verdict::HostLinkUnknown => write!(
                f,
                "but the allocation names no host link, so nothing shows its sandbox is gone: kept"
            ),
        }
    }
}

/// The check's result for one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeakReport {
    /// The pods' allocations checked (the daemon's own addresses are not).
    pub allocations: usize,
    /// The Pods the API server lists on this node.
    pub pods: usize,
    /// Every allocation whose pod is gone, leak or not, in address order.
    pub findings: Vec<Finding>,
}

impl LeakReport {
    /// The findings that are leaks.
    pub fn leaks(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|f| f.is_leak())
    }
}

/// The Event reason the agent posts on its Node for a leak it found; the note
/// is the finding ([`Finding`]'s text, which starts with the address).
pub const REASON_LEAK: &str = "IPAMLeak";
/// The Event reason for a leak the agent released; the note is
/// [`RELEASED_NOTE_PREFIX`] and the finding.
pub const REASON_RELEASED: &str = "IPAMLeakReleased";
/// How a released leak's note starts.
pub const RELEASED_NOTE_PREFIX: &str = "released: ";

/// The address a leak Event's note names (either reason), read back from the
/// text the agent wrote; None for a note not of that form.
pub fn note_address(note: &str) -> Option<IpAddr> {
    let finding = note.strip_prefix(RELEASED_NOTE_PREFIX).unwrap_or(note);
    finding.split_once(' ')?.0.parse().ok()
}

/// How young an allocation may be and still have no Pod listed: the 10 minutes
/// a pending allocation lives before it expires (an ADD in progress has its
/// address before the API server lists its Pod on this node).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10 * 60);

/// The default of `--ipam-release-leaked-after`: one hour. By then a leak has
/// been one in every check for an hour (six at the default 10-minute interval):
/// its Pod gone by UID, its host link gone, past the grace period. What is
/// transient (a list that lagged, a runtime recreating a sandbox) is gone by
/// then, while a leak kept forever costs its address until someone acts (a
/// runtime that skipped its DELs in a crash loop exhausts a /24 in ~250 pods).
/// A released address still cools down before it is handed out again.
pub const DEFAULT_RELEASE_LEAKED_AFTER: Duration = Duration::from_secs(60 * 60);

/// Which addresses have been leaks, since when (ms since the epoch), across
/// checks.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LeakTracker {
    first_seen_ms: BTreeMap<IpAddr, u64>,
}

impl LeakTracker {
    /// Takes the report of a check made at `now_ms`: a leak it names is
    /// remembered from the first report that named it; an address it does not
    /// call a leak is forgotten (its pod or host link came back, or it was
    /// released).
    pub fn observe(&mut self, report: &LeakReport, now_ms: u64) {
        let leaks: BTreeSet<IpAddr> = report.leaks().map(|f| f.ip).collect();
        self.first_seen_ms.retain(|ip, _| leaks.contains(ip));
        for ip in leaks {
            self.first_seen_ms.entry(ip).or_insert(now_ms);
        }
    }

    /// Since when `ip` has been a leak, if it is one.
    pub fn leaked_since_ms(&self, ip: &IpAddr) -> Option<u64> {
        self.first_seen_ms.get(ip).copied()
    }

    /// The leaks of `report` (a check made at `now_ms`, already observed) that
    /// have been leaks for `release_after` or longer: the ones to release.
    pub fn due<'r>(
        &self,
        report: &'r LeakReport,
        now_ms: u64,
        release_after: Duration,
    ) -> Vec<&'r Finding> {
        let after_ms = u64::try_from(release_after.as_millis()).unwrap_or(u64::MAX);
        report
            .leaks()
            .filter(|f| {
                self.leaked_since_ms(&f.ip)
                    .is_some_and(|since| now_ms.saturating_sub(since) >= after_ms)
            })
            .collect()
    }
}

/// Compares the node's allocations with its Pods and live host links.
pub fn check(
    allocations: &[NodeAllocation],
    pods: &[NodePod],
    live_host_links: &BTreeSet<String>,
    grace: Duration,
) -> LeakReport {
    let uids: HashSet<&str> = pods.iter().map(|p| p.uid.as_str()).collect();
    let mut findings: Vec<Finding> = allocations
        .iter()
        .filter_map(|a| {
            let pod = a.pod.as_ref()?;
            let pod_gone = pod_gone(a, pod, pods, &uids)?;
            let verdict = match &a.host_link {
                None => Verdict::HostLinkUnknown,
                Some(link) if live_host_links.contains(link) => Verdict::HostLinkPresent {
                    host_link: link.clone(),
                },
                Some(link) if a.age < grace => Verdict::WithinGrace {
                    host_link: link.clone(),
                },
                Some(link) => Verdict::Leak {
                    host_link: link.clone(),
                },
            };
            Some(Finding {
                ip: a.ip,
                pod: pod.clone(),
                container_id: a.container_id.clone(),
                pod_gone,
                verdict,
                age_seconds: a.age.as_secs(),
            })
        })
        .collect();
    findings.sort_by_key(|f| f.ip);
    LeakReport {
        allocations: allocations.iter().filter(|a| a.pod.is_some()).count(),
        pods: pods.len(),
        findings,
    }
}

/// Why the allocation's pod is gone; None while it runs.
fn pod_gone(
    allocation: &NodeAllocation,
    pod: &PodName,
    pods: &[NodePod],
    uids: &HashSet<&str>,
) -> Option<PodGone> {
    let same_name = pods.iter().find(|p| &p.pod == pod);
    match (&allocation.pod_uid, same_name) {
        (Some(uid), _) if uids.contains(uid.as_str()) => None,
        (Some(uid), Some(running)) => Some(PodGone::Replaced {
            recorded_uid: uid.clone(),
            running_uid: running.uid.clone(),
        }),
        (Some(uid), None) => Some(PodGone::NoPod {
            uid: Some(uid.clone()),
        }),
        (None, Some(_)) => None,
        (None, None) => Some(PodGone::NoPod { uid: None }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(600);

    fn name(ns: &str, n: &str) -> PodName {
        PodName {
            namespace: ns.into(),
            name: n.into(),
        }
    }

    fn running(ns: &str, n: &str, uid: &str) -> NodePod {
        NodePod {
            pod: name(ns, n),
            uid: uid.into(),
        }
    }

    /// An allocation of pod `default/<pod>` with UID `uid`, host link
    /// `lxc-<pod>`, allocated an hour ago.
    fn alloc(ip: &str, pod: &str, uid: Option<&str>) -> NodeAllocation {
        NodeAllocation {
            ip: ip.parse().unwrap(),
            pod: Some(name("default", pod)),
            pod_uid: uid.map(str::to_string),
            container_id: Some(format!("cid-{pod}")),
            host_link: Some(format!("lxc-{pod}")),
            age: Duration::from_secs(3600),
        }
    }

    fn links(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn verdicts(report: &LeakReport) -> Vec<(String, Verdict)> {
        report
            .findings
            .iter()
            .map(|f| (f.ip.to_string(), f.verdict.clone()))
            .collect()
    }

    #[test]
    fn a_running_pod_is_never_a_finding_by_uid_or_by_name() {
        let allocations = [
            alloc("10.0.0.3", "a", Some("uid-a")),
            alloc("10.0.0.4", "b", None),
        ];
        let pods = [
            running("default", "a", "uid-a"),
            running("default", "b", "uid-b"),
        ];
        let report = check(&allocations, &pods, &links(&[]), GRACE);
        assert_eq!(report.findings, vec![]);
        assert_eq!((report.allocations, report.pods), (2, 2));
    }

    #[test]
    fn a_recorded_uid_that_runs_is_the_pod_whatever_the_name() {
        // The UID is the pod's identity: a match by UID is the pod.
        let report = check(
            &[alloc("10.0.0.3", "a", Some("uid-a"))],
            &[running("other", "renamed", "uid-a")],
            &links(&[]),
            GRACE,
        );
        assert_eq!(report.findings, vec![]);
    }

    #[test]
    fn a_gone_pod_gone_link_past_grace_is_a_leak_with_its_evidence() {
        let report = check(
            &[alloc("10.0.0.3", "a", Some("uid-a"))],
            &[],
            &links(&["lxc-other"]),
            GRACE,
        );
        assert_eq!(report.leaks().count(), 1);
        let leak = &report.findings[0];
        assert_eq!(
            leak.pod_gone,
            PodGone::NoPod {
                uid: Some("uid-a".into())
            }
        );
        assert_eq!(
            leak.verdict,
            Verdict::Leak {
                host_link: "lxc-a".into()
            }
        );
        assert_eq!(leak.age_seconds, 3600);
        assert_eq!(
            leak.to_string(),
            "10.0.0.3 (default/a, container cid-a, allocated 3600s ago): no pod with UID uid-a or its name on this node; host link lxc-a is gone: leaked"
        );
    }

    #[test]
    fn a_new_pod_of_the_same_name_does_not_hide_the_old_ones_leak() {
        let report = check(
            &[alloc("10.0.0.3", "a", Some("uid-old"))],
            &[running("default", "a", "uid-new")],
            &links(&[]),
            GRACE,
        );
        assert_eq!(
            report.findings[0].pod_gone,
            PodGone::Replaced {
                recorded_uid: "uid-old".into(),
                running_uid: "uid-new".into()
            }
        );
        assert!(report.findings[0].is_leak());
        assert!(
            report.findings[0]
                .to_string()
                .contains("a new one (UID uid-new, the allocation's was uid-old)")
        );
    }

    #[test]
    fn without_a_recorded_uid_the_name_decides_and_the_evidence_says_so() {
        let gone = check(&[alloc("10.0.0.3", "a", None)], &[], &links(&[]), GRACE);
        assert_eq!(gone.findings[0].pod_gone, PodGone::NoPod { uid: None });
        assert!(gone.findings[0].to_string().contains("compared by name"));
        assert!(gone.findings[0].is_leak());
        // A same-named pod counts as running: without a UID there is no telling.
        let same_name = check(
            &[alloc("10.0.0.3", "a", None)],
            &[running("default", "a", "uid-x")],
            &links(&[]),
            GRACE,
        );
        assert_eq!(same_name.findings, vec![]);
        // Another namespace's pod of that name is not it.
        let other_ns = check(
            &[alloc("10.0.0.3", "a", None)],
            &[running("kube-system", "a", "uid-x")],
            &links(&[]),
            GRACE,
        );
        assert!(other_ns.findings[0].is_leak());
    }

    #[test]
    fn a_live_host_link_is_never_a_leak_whatever_the_api_server_says() {
        for grace in [Duration::ZERO, GRACE] {
            let report = check(
                &[
                    alloc("10.0.0.3", "a", Some("uid-a")),
                    alloc("10.0.0.4", "b", None),
                ],
                &[running("default", "a", "uid-new")],
                &links(&["lxc-a", "lxc-b"]),
                grace,
            );
            assert_eq!(
                verdicts(&report),
                vec![
                    (
                        "10.0.0.3".into(),
                        Verdict::HostLinkPresent {
                            host_link: "lxc-a".into()
                        }
                    ),
                    (
                        "10.0.0.4".into(),
                        Verdict::HostLinkPresent {
                            host_link: "lxc-b".into()
                        }
                    ),
                ]
            );
            assert_eq!(report.leaks().count(), 0);
            assert!(report.findings[0].to_string().ends_with(": kept"));
        }
    }

    #[test]
    fn the_grace_period_holds_back_young_allocations_up_to_its_end() {
        let at = |secs| NodeAllocation {
            age: Duration::from_secs(secs),
            ..alloc("10.0.0.3", "a", Some("uid-a"))
        };
        let verdict = |secs| {
            check(&[at(secs)], &[], &links(&[]), GRACE).findings[0]
                .verdict
                .clone()
        };
        let within = Verdict::WithinGrace {
            host_link: "lxc-a".into(),
        };
        assert_eq!(verdict(0), within);
        assert_eq!(verdict(599), within);
        assert_eq!(
            verdict(600),
            Verdict::Leak {
                host_link: "lxc-a".into()
            }
        );
        assert!(
            check(&[at(1)], &[], &links(&[]), GRACE).findings[0]
                .to_string()
                .contains("within the grace period")
        );
    }

    #[test]
    fn an_allocation_with_no_host_link_is_never_a_leak() {
        let report = check(
            &[NodeAllocation {
                host_link: None,
                ..alloc("10.0.0.3", "a", Some("uid-a"))
            }],
            &[],
            &links(&[]),
            Duration::ZERO,
        );
        assert_eq!(
            verdicts(&report),
            vec![("10.0.0.3".into(), Verdict::HostLinkUnknown)]
        );
        assert_eq!(report.leaks().count(), 0);
    }

    #[test]
    fn the_daemons_own_addresses_are_not_checked() {
        let router = NodeAllocation {
            pod: None,
            pod_uid: None,
            container_id: None,
            host_link: None,
            ..alloc("10.0.0.1", "x", None)
        };
        let report = check(&[router], &[], &links(&[]), Duration::ZERO);
        assert_eq!((report.allocations, report.findings.len()), (0, 0));
    }

    #[test]
    fn findings_come_in_address_order_with_both_families_of_a_pod() {
        let report = check(
            &[
                alloc("fd00::5", "b", Some("uid-b")),
                alloc("10.0.0.9", "a", Some("uid-a")),
                alloc("10.0.0.5", "b", Some("uid-b")),
                alloc("10.0.0.7", "c", Some("uid-c")),
            ],
            &[running("default", "c", "uid-c")],
            &links(&[]),
            GRACE,
        );
        let ips: Vec<String> = report.findings.iter().map(|f| f.ip.to_string()).collect();
        assert_eq!(ips, ["10.0.0.5", "10.0.0.9", "fd00::5"]);
        assert_eq!(
            (report.allocations, report.pods, report.leaks().count()),
            (4, 1, 3)
        );
    }

    const MINUTE_MS: u64 = 60_000;

    #[test]
    fn a_leak_is_due_once_it_was_one_in_every_check_for_the_release_delay() {
        let leaked = check(
            &[alloc("10.0.0.3", "a", Some("uid-a"))],
            &[],
            &links(&[]),
            GRACE,
        );
        let after = Duration::from_secs(3600);
        let mut tracker = LeakTracker::default();
        tracker.observe(&leaked, 0);
        assert_eq!(
            tracker.leaked_since_ms(&"10.0.0.3".parse().unwrap()),
            Some(0)
        );
        assert!(tracker.due(&leaked, 0, after).is_empty());
        for minute in [10, 20, 59] {
            tracker.observe(&leaked, minute * MINUTE_MS);
            assert!(
                tracker.due(&leaked, minute * MINUTE_MS, after).is_empty(),
                "{minute}"
            );
        }
        tracker.observe(&leaked, 60 * MINUTE_MS);
        let due: Vec<String> = tracker
            .due(&leaked, 60 * MINUTE_MS, after)
            .iter()
            .map(|f| f.ip.to_string())
            .collect();
        assert_eq!(due, ["10.0.0.3"]);
    }

    #[test]
    fn a_check_that_sees_no_leak_starts_the_delay_again() {
        let allocation = alloc("10.0.0.3", "a", Some("uid-a"));
        let leaked = check(std::slice::from_ref(&allocation), &[], &links(&[]), GRACE);
        // The host link came back for a while (the runtime still had the sandbox).
        let kept = check(&[allocation], &[], &links(&["lxc-a"]), GRACE);
        let after = Duration::from_secs(3600);
        let mut tracker = LeakTracker::default();
        tracker.observe(&leaked, 0);
        tracker.observe(&kept, 30 * MINUTE_MS);
        assert_eq!(tracker.leaked_since_ms(&"10.0.0.3".parse().unwrap()), None);
        tracker.observe(&leaked, 40 * MINUTE_MS);
        assert!(tracker.due(&leaked, 90 * MINUTE_MS, after).is_empty());
        tracker.observe(&leaked, 100 * MINUTE_MS);
        assert_eq!(tracker.due(&leaked, 100 * MINUTE_MS, after).len(), 1);
    }

    #[test]
    fn only_leaks_are_ever_due_and_only_those_of_the_report_in_hand() {
        let report = check(
            &[
                alloc("10.0.0.3", "a", Some("uid-a")),
                NodeAllocation {
                    age: Duration::from_secs(1),
                    ..alloc("10.0.0.4", "b", Some("uid-b"))
                },
                alloc("10.0.0.5", "c", Some("uid-c")),
            ],
            &[],
            &links(&["lxc-c"]),
            GRACE,
        );
        let mut tracker = LeakTracker::default();
        tracker.observe(&report, 0);
        let due = tracker.due(&report, u64::MAX, Duration::ZERO);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].ip.to_string(), "10.0.0.3");
        // A report without the leak (no list could be made: no report at all, or
        // a later one where it is gone) releases nothing of it.
        let empty = check(&[], &[], &links(&[]), GRACE);
        assert!(tracker.due(&empty, u64::MAX, Duration::ZERO).is_empty());
    }

    #[test]
    fn the_report_serializes_with_its_evidence() {
        let report = check(
            &[alloc("10.0.0.3", "a", Some("uid-a"))],
            &[running("default", "a", "uid-b")],
            &links(&[]),
            GRACE,
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "allocations": 1,
                "pods": 1,
                "findings": [{
                    "ip": "10.0.0.3",
                    "pod": {"namespace": "default", "name": "a"},
                    "container_id": "cid-a",
                    "pod_gone": {"reason": "replaced", "recorded_uid": "uid-a", "running_uid": "uid-b"},
                    "verdict": {"verdict": "leak", "host_link": "lxc-a"},
                    "age_seconds": 3600
                }]
            })
        );
    }

    #[test]
    fn a_leak_events_note_gives_back_its_address() {
        for ip in ["10.244.1.7", "fd00:10:244:1::7"] {
            let finding = Finding {
                ip: ip.parse().unwrap(),
                pod: name("default", "web-1"),
                container_id: Some("abc".into()),
                pod_gone: PodGone::NoPod { uid: None },
                verdict: Verdict::Leak {
                    host_link: "lxc1234".into(),
                },
                age_seconds: 700,
            };
            let found = finding.to_string();
            let released = format!("{RELEASED_NOTE_PREFIX}{finding}");
            assert_eq!(note_address(&found), Some(finding.ip), "{found}");
            assert_eq!(note_address(&released), Some(finding.ip), "{released}");
        }
        for note in ["", "released: ", "not an address (x)", "10.244.1.7"] {
            assert_eq!(note_address(note), None, "{note:?}");
        }
    }
}
