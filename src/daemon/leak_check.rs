//! The agent's leak check on the Kubernetes backend (issue 29): every
//! `--ipam-leak-check-interval` and on demand (`POST /v1/ipam/leak-check`), it
//! lists this node's Pods (the field selector `spec.nodeName`), then takes the
//! node's pod allocations, then reads the host links the kernel has, and hands
//! the three to `ipam::leaks::check` (the rule: pod gone by UID, host link gone,
//! older than `--ipam-leak-grace`). A new finding is logged once with its
//! evidence, and a new leak is posted as a Warning Event `IPAMLeak` on the Node;
//! status, explain and the metrics show the last check. A leak found in every
//! check for `--ipam-release-leaked-after` is released through GC's path (one
//! journal commit), once the kernel is read again and its host link is still
//! gone. While the Pods cannot be listed, nothing is observed and nothing is
//! released; the log says so once, and again once the list works.
//!
//! One check runs at a time. The checker talks to the API server and to the
//! daemon through two traits ([`PodSource`], [`NodeFacts`]), so its loop is
//! tested with fakes.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::Daemon;
use super::device_error::DeviceError;
use super::devices;
use super::state::ApiError;
use crate::api::models::{LeakCheckStatus, LeakFinding};
use crate::ipam::leaks::{
    self, Finding, LeakReport, LeakTracker, NodeAllocation, NodePod, Verdict,
};
use crate::ipam::leaks::{REASON_LEAK, REASON_RELEASED, RELEASED_NOTE_PREFIX};
use crate::k8s::node_pods::{NodeEvent, NodePodsApi, NodePodsError};
use crate::store::now_ms;

/// The check's settings (the daemon's flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeakSettings {
    /// `--ipam-leak-check-interval`; zero: only on demand.
    pub interval: Duration,
    /// `--ipam-leak-grace`.
    pub grace: Duration,
    /// `--ipam-release-leaked-after`; None: report only.
    pub release_after: Option<Duration>,
}

/// Why a check made no report, or its release failed.
#[derive(Debug, thiserror::Error)]
pub enum LeakCheckError {
    #[error(
        "the leak check needs the Kubernetes backend (this daemon's is {backend}): it compares the node's allocations with the Pods the API server lists on the node"
    )]
    NoApiServer { backend: String },
    #[error("{0}; nothing was observed and nothing released")]
    PodList(#[source] NodePodsError),
    #[error("{0}; nothing was observed and nothing released")]
    HostLinks(#[source] DeviceError),
    #[error("the leak check's kernel read did not finish: {0}")]
    Task(#[source] tokio::task::JoinError),
    #[error("{0}")]
    State(#[source] ApiError),
}

/// This node's Pods, and where Events go: the API server, or a test's fake.
pub trait PodSource: Send + Sync + 'static {
    fn list(&self) -> impl Future<Output = Result<Vec<NodePod>, NodePodsError>> + Send;
    fn post(&self, event: &NodeEvent) -> impl Future<Output = Result<(), NodePodsError>> + Send;
}

impl PodSource for NodePodsApi {
    fn list(&self) -> impl Future<Output = Result<Vec<NodePod>, NodePodsError>> + Send {
        NodePodsApi::list(self)
    }

    fn post(&self, event: &NodeEvent) -> impl Future<Output = Result<(), NodePodsError>> + Send {
        NodePodsApi::post(self, event)
    }
}

/// What the check reads from, and does to, the node: the daemon, or a test's fake.
pub trait NodeFacts: Send + Sync {
    /// The time now, in ms since the epoch.
    fn now_ms(&self) -> u64;
    /// The node's pod allocations.
    fn allocations(
        &self,
    ) -> impl Future<Output = Result<Vec<NodeAllocation>, LeakCheckError>> + Send;
    /// The names of the links the kernel has.
    fn live_host_links(
        &self,
    ) -> impl Future<Output = Result<BTreeSet<String>, LeakCheckError>> + Send;
    /// Releases the leaks (still the allocations found); the addresses released.
    fn release(
        &self,
        leaks: Vec<Finding>,
    ) -> impl Future<Output = Result<Vec<IpAddr>, LeakCheckError>> + Send;
    /// Sets the leak gauge and counts releases.
    fn count(&self, leaks: usize, released: usize) -> impl Future<Output = ()> + Send;
}

/// The daemon as the check's node.
pub struct DaemonFacts(pub Arc<Daemon>);

impl NodeFacts for DaemonFacts {
    fn now_ms(&self) -> u64 {
        now_ms()
    }

    async fn allocations(&self) -> Result<Vec<NodeAllocation>, LeakCheckError> {
        self.0
            .with_state(|s| Ok(s.leak_candidates(now_ms())))
            .await
            .map_err(LeakCheckError::State)
    }

    async fn live_host_links(&self) -> Result<BTreeSet<String>, LeakCheckError> {
        tokio::task::spawn_blocking(devices::link_names)
            .await
            .map_err(LeakCheckError::Task)?
            .map_err(LeakCheckError::HostLinks)
    }

    async fn release(&self, leaks: Vec<Finding>) -> Result<Vec<IpAddr>, LeakCheckError> {
        self.0
            .with_state(move |s| s.release_leaked(&leaks))
            .await
            .map_err(LeakCheckError::State)
    }

    async fn count(&self, leaks: usize, released: usize) {
        let counted = self
            .0
            .with_state(move |s| {
                let m = s.metrics();
                m.leaks.set(leaks as i64);
                m.leaks_released.inc_by(released as u64);
                Ok(())
            })
            .await;
        if let Err(e) = counted {
            tracing::warn!(error = %e.message, "leak check: could not update the metrics");
        }
    }
}

/// What the checks so far have found, across checks.
#[derive(Debug, Default)]
struct LeakBook {
    tracker: LeakTracker,
    /// The last check that listed the Pods: when, and its report.
    last: Option<(u64, LeakReport)>,
    /// The verdict each finding was last logged with (a finding is logged again
    /// only when its verdict changes).
    logged: BTreeMap<IpAddr, Verdict>,
    /// Why the last attempt made no report, while it is so.
    failing: Option<String>,
    released: u64,
}

/// What one report changes.
#[derive(Debug, Default, PartialEq)]
struct Observed {
    /// Findings not logged before with this verdict.
    new: Vec<Finding>,
    /// Leaks due for release.
    due: Vec<Finding>,
}

impl LeakBook {
    /// Takes the report of a check made at `now_ms`.
    fn observe(
        &mut self,
        report: LeakReport,
        now_ms: u64,
        release_after: Option<Duration>,
    ) -> Observed {
        self.failing = None;
        self.tracker.observe(&report, now_ms);
        let due = release_after
            .map(|after| {
                self.tracker
                    .due(&report, now_ms, after)
                    .into_iter()
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let new = report
            .findings
            .iter()
            .filter(|f| self.logged.get(&f.ip) != Some(&f.verdict))
            .cloned()
            .collect();
        self.logged = report
            .findings
            .iter()
            .map(|f| (f.ip, f.verdict.clone()))
            .collect();
        self.last = Some((now_ms, report));
        Observed { new, due }
    }

    /// Notes an attempt that failed (no report, or a release the journal
    /// refused); true the first time in a row (the one to log).
    fn failed(&mut self, error: String) -> bool {
        self.failing.replace(error).is_none()
    }

    /// Takes released addresses out of the last report.
    fn released(&mut self, ips: &[IpAddr]) {
        self.released += ips.len() as u64;
        if let Some((_, report)) = &mut self.last {
            report.findings.retain(|f| !ips.contains(&f.ip));
        }
        for ip in ips {
            self.logged.remove(ip);
        }
    }

    fn status(&self, settings: &LeakSettings) -> LeakCheckStatus {
        let secs = |d: Duration| d.as_secs();
        let (last_check_ms, allocations, pods, findings) = match &self.last {
            Some((at, report)) => (
                Some(*at),
                report.allocations as u64,
                report.pods as u64,
                report
                    .findings
                    .iter()
                    .map(|f| self.finding(f, settings))
                    .collect(),
            ),
            None => (None, 0, 0, Vec::new()),
        };
        LeakCheckStatus {
            interval_s: secs(settings.interval),
            grace_s: secs(settings.grace),
            release_after_s: settings.release_after.map(secs),
            last_check_ms,
            allocations,
            pods,
            findings,
            released: self.released,
            error: self.failing.clone().unwrap_or_default(),
        }
    }

    fn finding(&self, f: &Finding, settings: &LeakSettings) -> LeakFinding {
        let since = self.tracker.leaked_since_ms(&f.ip);
        LeakFinding {
            finding: f.clone(),
            leaked_since_ms: since,
            release_at_ms: since.zip(settings.release_after).map(|(s, after)| {
                s.saturating_add(u64::try_from(after.as_millis()).unwrap_or(u64::MAX))
            }),
        }
    }
}

/// The leak check of one node.
pub struct LeakCheck<P> {
    pods: P,
    settings: LeakSettings,
    /// Held for a whole check: one at a time.
    book: tokio::sync::Mutex<LeakBook>,
    /// The book's status after the last check, for status and explain (which do
    /// not wait for a check under way).
    status: Mutex<LeakCheckStatus>,
}

impl<P: PodSource> LeakCheck<P> {
    pub fn new(pods: P, settings: LeakSettings) -> LeakCheck<P> {
        let book = LeakBook::default();
        let status = Mutex::new(book.status(&settings));
        LeakCheck {
            pods,
            settings,
            book: tokio::sync::Mutex::new(book),
            status,
        }
    }

    pub fn settings(&self) -> LeakSettings {
        self.settings
    }

    /// The status after the last check.
    pub fn status(&self) -> LeakCheckStatus {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Runs one check (after the one under way, if any); its status, or why it
    /// made no report.
    pub async fn run(&self, node: &impl NodeFacts) -> Result<LeakCheckStatus, LeakCheckError> {
        let mut book = self.book.lock().await;
        let result = self.check(&mut book, node).await;
        if let Err(e) = &result
            && book.failed(e.to_string())
        {
            tracing::warn!(error = %e, "leak check: no report until this works again (logged once)");
        }
        let status = book.status(&self.settings);
        *self.status.lock().unwrap_or_else(|p| p.into_inner()) = status.clone();
        result.map(|()| status)
    }

    async fn check(
        &self,
        book: &mut LeakBook,
        node: &impl NodeFacts,
    ) -> Result<(), LeakCheckError> {
        // Pods first, then allocations, then links: a pod created after the list
        // has a young allocation (the grace period), and an allocation released
        // after the snapshot is gone either way.
        let pods = self.pods.list().await.map_err(LeakCheckError::PodList)?;
        let allocations = node.allocations().await?;
        let links = node.live_host_links().await?;
        if book.failing.is_some() {
            tracing::info!("leak check: the Pods and host links are read again");
        }
        let report = leaks::check(&allocations, &pods, &links, self.settings.grace);
        let current = report.leaks().count();
        let observed = book.observe(report, node.now_ms(), self.settings.release_after);
        for f in &observed.new {
            self.log_and_post(f).await;
        }
        let released = self.release(observed.due, node).await?;
        book.released(&released);
        node.count(current.saturating_sub(released.len()), released.len())
            .await;
        Ok(())
    }

    /// Logs a new finding with its evidence; a leak is also posted as an Event.
    async fn log_and_post(&self, f: &Finding) {
        let uid = match &f.pod_gone {
            leaks::PodGone::NoPod { uid } => uid.clone(),
            leaks::PodGone::Replaced { recorded_uid, .. } => Some(recorded_uid.clone()),
        };
        let host_link = match &f.verdict {
            Verdict::Leak { host_link }
            | Verdict::HostLinkPresent { host_link }
            | Verdict::WithinGrace { host_link } => Some(host_link.as_str()),
            Verdict::HostLinkUnknown => None,
        };
        if !f.is_leak() {
            tracing::info!(ip = %f.ip, pod = %f.pod, uid = ?uid, host_link = ?host_link, age_s = f.age_seconds, "leak check: {f}");
            return;
        }
        tracing::warn!(ip = %f.ip, pod = %f.pod, uid = ?uid, host_link = ?host_link, age_s = f.age_seconds, "leak check: {f}");
        let release = match self.settings.release_after {
            Some(after) => format!(
                "; released once it has been a leak in every check for {}s (--ipam-release-leaked-after)",
                after.as_secs()
            ),
            None => "; not released (--ipam-release-leaked-after 0)".into(),
        };
        self.post(NodeEvent {
            warning: true,
            reason: REASON_LEAK,
            action: "Found",
            about: f.ip.to_string(),
            note: format!("{f}{release}"),
        })
        .await;
    }

    async fn post(&self, event: NodeEvent) {
        if let Err(e) = self.pods.post(&event).await {
            tracing::warn!(error = %e, "leak check: could not post the Event");
        }
    }

    /// Releases the due leaks whose host links are still gone when the kernel is
    /// read again.
    async fn release(
        &self,
        due: Vec<Finding>,
        node: &impl NodeFacts,
    ) -> Result<Vec<IpAddr>, LeakCheckError> {
        if due.is_empty() {
            return Ok(Vec::new());
        }
        let links = node.live_host_links().await?;
        let still_gone: Vec<Finding> = due
            .into_iter()
            .filter(|f| match &f.verdict {
                Verdict::Leak { host_link } => !links.contains(host_link),
                _ => false,
            })
            .collect();
        let released = node.release(still_gone.clone()).await?;
        for f in still_gone.iter().filter(|f| released.contains(&f.ip)) {
            tracing::warn!(ip = %f.ip, pod = %f.pod, "leak check: released a leaked allocation: {f}");
            self.post(NodeEvent {
                warning: false,
                reason: REASON_RELEASED,
                action: "Released",
                about: f.ip.to_string(),
                note: format!("{RELEASED_NOTE_PREFIX}{f}"),
            })
            .await;
        }
        Ok(released)
    }
}

/// Runs the check every `interval` (the first after one interval), until the
/// daemon stops; each check logs what it finds, and a failed one is logged once.
pub async fn periodic<P: PodSource>(check: Arc<LeakCheck<P>>, node: impl NodeFacts) {
    let interval = check.settings().interval;
    if interval.is_zero() {
        return;
    }
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        // A failure is logged by `run`, once in a row.
        let _ = check.run(&node).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::ipam::leaks::PodName;

    const MINUTE: Duration = Duration::from_secs(60);

    fn name(n: &str) -> PodName {
        PodName {
            namespace: "default".into(),
            name: n.into(),
        }
    }

    /// An allocation of pod `default/<pod>` (UID `uid-<pod>`, host link
    /// `lxc-<pod>`), allocated two hours ago.
    fn alloc(ip: &str, pod: &str) -> NodeAllocation {
        NodeAllocation {
            ip: ip.parse().unwrap(),
            pod: Some(name(pod)),
            pod_uid: Some(format!("uid-{pod}")),
            container_id: Some(format!("cid-{pod}")),
            host_link: Some(format!("lxc-{pod}")),
            age: 120 * MINUTE,
        }
    }

    fn running(pod: &str) -> NodePod {
        NodePod {
            pod: name(pod),
            uid: format!("uid-{pod}"),
        }
    }

    /// The API server: the Pods it lists (None: it does not answer) and the
    /// Events posted.
    #[derive(Default)]
    struct FakeApi {
        pods: Mutex<Option<Vec<NodePod>>>,
        lists: AtomicUsize,
        events: Mutex<Vec<NodeEvent>>,
    }

    impl FakeApi {
        fn answer(&self, pods: Option<Vec<NodePod>>) {
            *self.pods.lock().unwrap() = pods;
        }

        fn reasons(&self) -> Vec<&'static str> {
            self.events
                .lock()
                .unwrap()
                .iter()
                .map(|e| e.reason)
                .collect()
        }
    }

    impl PodSource for Arc<FakeApi> {
        async fn list(&self) -> Result<Vec<NodePod>, NodePodsError> {
            self.lists.fetch_add(1, Ordering::SeqCst);
            self.pods
                .lock()
                .unwrap()
                .clone()
                .ok_or_else(|| NodePodsError::List {
                    node: "n1".into(),
                    source: kube::Error::ReadEvents(std::io::ErrorKind::ConnectionRefused.into()),
                })
        }

        async fn post(&self, event: &NodeEvent) -> Result<(), NodePodsError> {
            self.events.lock().unwrap().push(event.clone());
            Ok(())
        }
    }

    /// The daemon and the kernel: allocations, live links, what was released and
    /// the metrics; its clock is tokio's (paused in these tests).
    struct FakeNode {
        allocations: Mutex<Vec<NodeAllocation>>,
        links: Mutex<BTreeSet<String>>,
        released: Mutex<Vec<IpAddr>>,
        gauge: Mutex<(usize, usize)>,
        start: tokio::time::Instant,
    }

    impl FakeNode {
        fn new(allocations: Vec<NodeAllocation>, links: &[&str]) -> Arc<FakeNode> {
            Arc::new(FakeNode {
                allocations: Mutex::new(allocations),
                links: Mutex::new(links.iter().map(|l| l.to_string()).collect()),
                released: Mutex::default(),
                gauge: Mutex::default(),
                start: tokio::time::Instant::now(),
            })
        }
    }

    impl NodeFacts for Arc<FakeNode> {
        fn now_ms(&self) -> u64 {
            1_000_000 + self.start.elapsed().as_millis() as u64
        }

        async fn allocations(&self) -> Result<Vec<NodeAllocation>, LeakCheckError> {
            Ok(self.allocations.lock().unwrap().clone())
        }

        async fn live_host_links(&self) -> Result<BTreeSet<String>, LeakCheckError> {
            Ok(self.links.lock().unwrap().clone())
        }

        async fn release(&self, leaks: Vec<Finding>) -> Result<Vec<IpAddr>, LeakCheckError> {
            let ips: Vec<IpAddr> = leaks.iter().map(|f| f.ip).collect();
            self.allocations
                .lock()
                .unwrap()
                .retain(|a| !ips.contains(&a.ip));
            self.released.lock().unwrap().extend(&ips);
            Ok(ips)
        }

        async fn count(&self, leaks: usize, released: usize) {
            let mut gauge = self.gauge.lock().unwrap();
            *gauge = (leaks, gauge.1 + released);
        }
    }

    fn settings(release_after: Option<Duration>) -> LeakSettings {
        LeakSettings {
            interval: 10 * MINUTE,
            grace: 10 * MINUTE,
            release_after,
        }
    }

    fn verdicts(status: &LeakCheckStatus) -> Vec<(String, bool)> {
        status
            .findings
            .iter()
            .map(|f| (f.finding.ip.to_string(), f.finding.is_leak()))
            .collect()
    }

    /// Lets the checker's ticks up to `at` (since the start) run.
    async fn until(node: &FakeNode, at: Duration) {
        tokio::time::sleep_until(node.start + at).await;
        // The tick due at `at` runs before the test looks.
        tokio::task::yield_now().await;
    }

    #[tokio::test(start_paused = true)]
    async fn the_periodic_check_reports_once_releases_when_due_and_nothing_while_the_api_is_down() {
        let api = Arc::new(FakeApi::default());
        api.answer(Some(vec![running("b")]));
        // a: pod gone, link gone (a leak); b: running; c: pod gone, link present.
        let node = FakeNode::new(
            vec![
                alloc("10.0.0.3", "a"),
                alloc("10.0.0.4", "b"),
                alloc("10.0.0.5", "c"),
            ],
            &["lxc-b", "lxc-c"],
        );
        let check = Arc::new(LeakCheck::new(api.clone(), settings(Some(60 * MINUTE))));
        tokio::spawn(periodic(check.clone(), node.clone()));

        // Nothing before the first interval.
        until(&node, 9 * MINUTE).await;
        assert_eq!(api.lists.load(Ordering::SeqCst), 0);
        assert_eq!(check.status().last_check_ms, None);

        until(&node, 10 * MINUTE + Duration::from_secs(1)).await;
        let status = check.status();
        assert_eq!(
            verdicts(&status),
            [("10.0.0.3".into(), true), ("10.0.0.5".into(), false)]
        );
        assert_eq!((status.allocations, status.pods), (3, 1));
        let leak = &status.findings[0];
        assert_eq!(leak.leaked_since_ms, Some(node.now_ms() - 1_000));
        assert_eq!(
            leak.release_at_ms,
            leak.leaked_since_ms.map(|s| s + 3_600_000)
        );
        assert_eq!(api.reasons(), [REASON_LEAK]);
        assert!(
            api.events.lock().unwrap()[0]
                .note
                .contains("10.0.0.3 (default/a")
        );
        assert_eq!(*node.gauge.lock().unwrap(), (1, 0));

        // Two more checks: the same findings, no second Event.
        until(&node, 30 * MINUTE + Duration::from_secs(1)).await;
        assert_eq!(api.lists.load(Ordering::SeqCst), 3);
        assert_eq!(api.reasons(), [REASON_LEAK]);

        // The API server goes away for 45 minutes: checks make no report, the
        // last one stays, nothing is released although the leak would be due.
        api.answer(None);
        until(&node, 75 * MINUTE + Duration::from_secs(1)).await;
        assert_eq!(api.lists.load(Ordering::SeqCst), 7);
        let status = check.status();
        assert!(
            status
                .error
                .contains("nothing was observed and nothing released"),
            "{}",
            status.error
        );
        assert!(
            status.error.contains("listing the Pods of node n1"),
            "{}",
            status.error
        );
        assert!(node.released.lock().unwrap().is_empty());
        assert_eq!(verdicts(&status), verdicts(&check.status()));

        // Back: the first check that lists the Pods releases the leak (a leak in
        // every check for an hour), never the one whose link exists.
        api.answer(Some(vec![running("b")]));
        until(&node, 80 * MINUTE + Duration::from_secs(1)).await;
        assert_eq!(
            *node.released.lock().unwrap(),
            ["10.0.0.3".parse::<IpAddr>().unwrap()]
        );
        let status = check.status();
        assert_eq!(status.error, "");
        assert_eq!(status.released, 1);
        assert_eq!(verdicts(&status), [("10.0.0.5".into(), false)]);
        assert_eq!(api.reasons(), [REASON_LEAK, REASON_RELEASED]);
        assert_eq!(*node.gauge.lock().unwrap(), (0, 1));

        until(&node, 600 * MINUTE).await;
        assert_eq!(node.released.lock().unwrap().len(), 1);
        assert_eq!(api.reasons(), [REASON_LEAK, REASON_RELEASED]);
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_release_delay_leaks_are_only_reported() {
        let api = Arc::new(FakeApi::default());
        api.answer(Some(Vec::new()));
        let node = FakeNode::new(vec![alloc("10.0.0.3", "a")], &[]);
        let check = LeakCheck::new(api.clone(), settings(None));
        for _ in 0..20 {
            let status = check.run(&node).await.unwrap();
            assert_eq!(verdicts(&status), [("10.0.0.3".into(), true)]);
            assert_eq!(status.findings[0].release_at_ms, None);
            tokio::time::sleep(60 * MINUTE).await;
        }
        assert!(node.released.lock().unwrap().is_empty());
        assert_eq!(api.reasons(), [REASON_LEAK]);
        assert!(
            api.events.lock().unwrap()[0]
                .note
                .ends_with("not released (--ipam-release-leaked-after 0)")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_due_leak_whose_host_link_came_back_is_not_released() {
        let api = Arc::new(FakeApi::default());
        api.answer(Some(Vec::new()));
        let node = FakeNode::new(vec![alloc("10.0.0.3", "a")], &[]);
        let check = LeakCheck::new(api.clone(), settings(Some(Duration::ZERO)));
        // The link reappears between the check's read and the release's.
        let status = check.run(&node).await.unwrap();
        assert_eq!(status.released, 1, "due at once with a zero delay");
        node.allocations
            .lock()
            .unwrap()
            .push(alloc("10.0.0.9", "z"));
        let due: Vec<Finding> = leaks::check(
            &[alloc("10.0.0.9", "z")],
            &[],
            &BTreeSet::new(),
            Duration::ZERO,
        )
        .findings;
        node.links.lock().unwrap().insert("lxc-z".into());
        let released = check.release(due, &node).await.unwrap();
        assert!(released.is_empty());
        assert_eq!(node.released.lock().unwrap().len(), 1);
    }

    #[test]
    fn a_failed_list_is_logged_once_in_a_row() {
        let mut book = LeakBook::default();
        assert!(book.failed("down".into()));
        assert!(!book.failed("down".into()));
        assert_eq!(book.status(&settings(None)).error, "down");
        let report = leaks::check(&[], &[], &BTreeSet::new(), Duration::ZERO);
        book.observe(report, 0, None);
        assert_eq!(book.status(&settings(None)).error, "");
        assert!(book.failed("down again".into()));
    }

    #[test]
    fn a_finding_is_new_again_only_when_its_verdict_changes() {
        let mut book = LeakBook::default();
        let young = NodeAllocation {
            age: MINUTE,
            ..alloc("10.0.0.3", "a")
        };
        let grace = 10 * MINUTE;
        let first = book.observe(
            leaks::check(std::slice::from_ref(&young), &[], &BTreeSet::new(), grace),
            0,
            None,
        );
        assert_eq!(first.new.len(), 1);
        let same = book.observe(
            leaks::check(&[young], &[], &BTreeSet::new(), grace),
            1,
            None,
        );
        assert!(same.new.is_empty());
        let old = book.observe(
            leaks::check(&[alloc("10.0.0.3", "a")], &[], &BTreeSet::new(), grace),
            2,
            None,
        );
        assert_eq!(old.new.len(), 1);
        assert!(old.new[0].is_leak());
        assert!(old.due.is_empty(), "no release delay: never due");
    }
}
