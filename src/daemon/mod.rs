//! The node daemon (`podnet daemon`): resolves its options, takes the socket lock,
//! opens the journal, asks the node backend's source what the node owns (and the
//! embedded operator, where it plays the operator, to carve it), restores, replays
//! the DEL queue, reconciles with the kernel, reserves the router addresses and
//! sets up the router device, then serves the REST API on the unix socket, applies
//! the backend's events, flushes the node outbox to the backend's sink, and runs
//! the expiration and cooldown timers. Where the backend tells what the node is
//! (its addresses, the cluster's Service range), the configuration is judged
//! against it ([`node_check`]): while it does not fit, no address is handed out
//! and the CNI config is not written.

mod address_events;
mod answers;
pub mod bandwidth_loop;
mod block_wait;
pub mod capabilities;
mod cniconf;
pub mod config;
pub mod crossnode;
mod device_error;
mod devices;
mod heap;
pub mod l2_loop;
pub mod leak_check;
pub mod metrics;
mod node_backend;
pub mod node_check;
pub mod observe;
pub mod options;
pub mod policy_loop;
mod routes;
pub(crate) mod server;
pub mod source_check;
mod start;
pub mod state;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, TryLockError};
use std::time::Duration;

use crate::api::delete_queue::{DeleteQueue, QueueError, read_entry};
use crate::api::models::EndpointBatchDeleteRequest;
use crate::node::{BackendHealth, NodeEvent, NodeSink};
use crate::store::now_ms;
use options::{DaemonOptions, OptionsError};
use state::{ApiError, ErrorKind, IpamState, Timer};

/// A state call's result, with the timers it queued and the stale host links.
/// A state call's result and its effects: timers, stale links, flush soon.
type Locked<T> = (Result<T, ApiError>, Vec<Timer>, Vec<state::StaleLink>, bool);

/// The running daemon, shared by every connection and timer.
pub struct Daemon {
    state: Mutex<IpamState>,
    queue: DeleteQueue,
    backend: Arc<BackendHealth>,
    /// The cross-node datapath's status, when it runs.
    cross_node: Option<crossnode::SharedStatus>,
    /// Counts the node events applied; allocations waiting for blocks watch it.
    node_events: tokio::sync::watch::Sender<u64>,
    /// The source check runs (`--enable-source-ip-verification`).
    source_check: bool,
    /// Raised by an allocation that waits for blocks or a sticky address, and
    /// when a sticky address's block was given back: the outbox flusher then
    /// writes the demand (which counts the waiting requests), the sticky
    /// requests and the given-back blocks without waiting out the update rate.
    demand_waiting: tokio::sync::Notify,
    /// Where Events on this node's Pods go (the Kubernetes backend only).
    pod_events: Option<Arc<crate::k8s::node_pods::NodePodsApi>>,
    /// The leak check (the Kubernetes backend only).
    leak_check: Option<Arc<leak_check::LeakCheck<crate::k8s::node_pods::NodePodsApi>>>,
    /// The NetworkPolicy loop's last write (None: the loop does not run).
    policy: std::sync::Mutex<Option<crate::api::models::PolicyStatus>>,
    /// What the policies in the table last written mean for each local pod,
    /// published by the policy loop after each write (None: none yet).
    policy_explanations: std::sync::RwLock<Option<Arc<crate::policy::Explanations>>>,
    /// The L2 announcement loop's shared part (unset: it does not run).
    l2: std::sync::OnceLock<Arc<l2_loop::Shared>>,
    /// The policy verdicts' reader and observers (unset: the policy loop does
    /// not run).
    verdicts: std::sync::OnceLock<Arc<observe::Verdicts>>,
    /// Local pods the bandwidth loop's last pass found shaped (None: it has
    /// not run).
    bandwidth_shaped: std::sync::Mutex<Option<u64>>,
}

impl Daemon {
    /// Runs `f` on the state, on a blocking thread (the journal commit blocks), arms
    /// the timers the call queued and removes the host links of expired addresses.
    /// For the daemon's background work (timers, node events, metrics scrapes); the
    /// API's routes use [`Daemon::with_state_in_place`].
    pub async fn with_state<T, F>(self: &Arc<Self>, f: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(&mut IpamState) -> Result<T, ApiError> + Send + 'static,
    {
        let d = self.clone();
        let done = tokio::task::spawn_blocking(move || d.locked(f))
            .await
            .map_err(|e| ApiError::new(ErrorKind::Internal, format!("internal error: {e}")))?;
        self.after(done)
    }

    /// Runs `f` on the state right here, on the worker thread that serves the
    /// request, so the request waits for no other thread: neither for a blocking
    /// thread to wake up nor for a worker to be woken again to write the answer (the
    /// two cross-thread wake-ups of `spawn_blocking`, expensive on a two-vCPU
    /// node: BENCHMARKS.md). When the state's lock is free, `f` runs at once: only the
    /// lock's holder ever blocks a worker, for one commit, and the other worker
    /// goes on serving (timers, watches, other connections). When it is held, the
    /// worker first hands its other tasks to another thread (`block_in_place`),
    /// then waits for the lock: a burst never blocks the runtime. Needs the
    /// multi-thread runtime.
    pub fn with_state_in_place<T, F>(self: &Arc<Self>, f: F) -> Result<T, ApiError>
    where
        F: FnOnce(&mut IpamState) -> Result<T, ApiError>,
    {
        let done = match self.state.try_lock() {
            Ok(mut st) => run_locked(&mut st, f),
            Err(TryLockError::Poisoned(p)) => run_locked(&mut p.into_inner(), f),
            Err(TryLockError::WouldBlock) => tokio::task::block_in_place(|| self.locked(f)),
        };
        self.after(done)
    }

    /// Runs `f` once the state's lock is free (see [`run_locked`]).
    fn locked<T, F>(&self, f: F) -> Locked<T>
    where
        F: FnOnce(&mut IpamState) -> Result<T, ApiError>,
    {
        run_locked(&mut self.state.lock().unwrap_or_else(|p| p.into_inner()), f)
    }

    /// Arms the timers a state call queued, removes, in the background, the host
    /// links it left stale, and wakes the node sink's writer when asked.
    fn after<T>(
        self: &Arc<Self>,
        (result, timers, stale, flush_soon): Locked<T>,
    ) -> Result<T, ApiError> {
        self.arm_timers(timers);
        if flush_soon {
            self.demand_waiting.notify_one();
        }
        if !stale.is_empty() {
            tokio::task::spawn_blocking(move || stale.iter().for_each(devices::remove_stale_link));
        }
        result
    }

    /// Arms one task per timer.
    fn arm_timers(self: &Arc<Self>, timers: Vec<Timer>) {
        for t in timers {
            let d = self.clone();
            tokio::spawn(async move {
                let wait = t.deadline_ms.saturating_sub(now_ms());
                tokio::time::sleep(Duration::from_millis(wait)).await;
                let _ = d
                    .with_state(move |s| Ok(s.fire(&t, &devices::host_link_marker)))
                    .await;
            });
        }
    }

    /// The node backend, for status.
    pub fn backend_status(&self) -> crate::api::models::BackendStatus {
        crate::api::models::BackendStatus {
            kind: self.backend.kind.into(),
            location: self.backend.location(),
            watches: self.backend.watches(),
            waiting: self.backend.waiting(),
        }
    }

    /// The cross-node datapath, for status (None when it is off).
    pub fn cross_node_status(&self) -> Option<crate::api::models::CrossNodeStatus> {
        self.cross_node
            .as_ref()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).status())
    }

    /// Runs a leak check now (after the one under way, if any).
    pub async fn check_leaks(
        self: &Arc<Self>,
    ) -> Result<crate::api::models::LeakCheckStatus, leak_check::LeakCheckError> {
        match &self.leak_check {
            Some(check) => check.run(&leak_check::DaemonFacts(self.clone())).await,
            None => Err(leak_check::LeakCheckError::NoApiServer {
                backend: self.backend.kind.into(),
            }),
        }
    }

    /// The leak check's last result, for status and explain (None when there is
    /// no leak check).
    pub fn leak_status(&self) -> Option<crate::api::models::LeakCheckStatus> {
        self.leak_check.as_ref().map(|c| c.status())
    }

    /// The NetworkPolicy loop's status, for `podnet status` (None when it does
    /// not run).
    pub fn bandwidth_shaped(&self) -> Option<u64> {
        *self.bandwidth_shaped.lock().ok()?
    }

    fn set_bandwidth_shaped(&self, shaped: u64) {
        if let Ok(mut b) = self.bandwidth_shaped.lock() {
            *b = Some(shaped);
        }
    }

    pub fn policy_status(&self) -> Option<crate::api::models::PolicyStatus> {
        self.policy.lock().ok()?.clone()
    }

    /// Sets the NetworkPolicy loop's status.
    fn set_policy_status(&self, status: crate::api::models::PolicyStatus) {
        if let Ok(mut p) = self.policy.lock() {
            *p = Some(status);
        }
    }

    /// What the policies in the table last written mean for each local pod
    /// (None: the loop does not run or has written nothing yet).
    pub fn policy_explanations(&self) -> Option<Arc<crate::policy::Explanations>> {
        self.policy_explanations.read().ok()?.clone()
    }

    /// Publishes what the table just written means (the policy loop).
    fn set_policy_explanations(&self, explanations: Arc<crate::policy::Explanations>) {
        if let Ok(mut e) = self.policy_explanations.write() {
            *e = Some(explanations);
        }
    }

    /// The L2 announcement loop's shared part (None: it does not run).
    pub fn l2(&self) -> Option<&Arc<l2_loop::Shared>> {
        self.l2.get()
    }

    /// Records the L2 announcement loop's shared part (once).
    fn set_l2(&self, shared: Arc<l2_loop::Shared>) {
        if self.l2.set(shared).is_err() {
            tracing::warn!("a second L2 announcement loop was started; its status is not shown");
        }
    }

    /// The policy verdicts (None: the policy loop does not run).
    pub fn verdicts(&self) -> Option<&Arc<observe::Verdicts>> {
        self.verdicts.get()
    }

    /// Records the policy verdicts' shared part (once).
    fn set_verdicts(&self, verdicts: Arc<observe::Verdicts>) {
        if self.verdicts.set(verdicts).is_err() {
            tracing::warn!("a second policy verdict reader was started; it is not observed");
        }
    }

    /// DELs waiting in the on-disk queue (normally none while the daemon runs).
    pub fn queue_depth(&self) -> usize {
        self.queue.entries().map(|e| e.len()).unwrap_or(0)
    }

    /// Queue entries set aside because they could not be used, until someone
    /// removes them.
    pub fn queue_unreadable(&self) -> Vec<PathBuf> {
        self.queue.unreadable_entries().unwrap_or_default()
    }

    /// The metrics text, with the gauges brought up to date.
    pub async fn metrics_text(self: &Arc<Self>) -> Result<String, ApiError> {
        let depth = self.queue_depth();
        let unreadable = self.queue_unreadable().len();
        let drops = self.source_check_listing().await.map(|l| l.drops);
        let l2 = self.l2().map(|l| l.metrics());
        let suppressed = match self.verdicts() {
            Some(v) => v.suppressed().await,
            None => None,
        };
        self.with_state(move |s| {
            if let Some(n) = suppressed {
                let counter = s.metrics().policy_verdicts_suppressed.inner();
                counter.store(n, std::sync::atomic::Ordering::Relaxed);
            }
            s.refresh_gauges(s.metrics());
            if let Some(drops) = &drops {
                s.metrics().source_check_drops(drops);
            }
            s.metrics().queue_depth.set(depth as i64);
            if let Some(l2) = &l2 {
                s.metrics().l2(l2);
            }
            s.metrics().queue_bad_entries.set(unreadable as i64);
            Ok(s.metrics().encode())
        })
        .await
    }

    /// The source check's table as the kernel has it (None when the check is off
    /// or the table cannot be read, which the log says).
    pub async fn source_check_listing(&self) -> Option<source_check::Listing> {
        if !self.source_check {
            return None;
        }
        match tokio::task::spawn_blocking(source_check::read).await {
            Ok(Ok(listing)) => listing,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot read the source check's counters");
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "source check read task failed");
                None
            }
        }
    }

    /// Deletes a DEL's links in the background, then lets the held addresses go.
    /// A link that cannot be deleted keeps them held (the next start retries).
    pub fn spawn_teardown(self: &Arc<Self>, teardown: state::Teardown) {
        let d = self.clone();
        tokio::spawn(async move {
            let (links, ips) = (teardown.links.clone(), teardown.ips.clone());
            let deleted = tokio::task::spawn_blocking(move || {
                let r = devices::delete_links_checked(&links);
                devices::prune_pod_rules(|ip| ips.contains(&ip));
                r
            })
            .await;
            match deleted {
                Ok(Ok(())) => {
                    let key = teardown.key.clone();
                    if let Err(e) = d.with_state(move |s| s.finish_teardown(&key)).await {
                        tracing::error!(error = %e.message, "could not journal the end of a teardown; it is retried once the journal works again");
                    }
                }
                Ok(Err(e)) => {
                    tracing::error!(error = %e, key = %teardown.key, "link teardown failed; the addresses stay held until the next start")
                }
                Err(e) => tracing::error!(error = %e, "link teardown task failed"),
            }
        });
    }

    /// Deletes the host-side links of garbage-collected attachments that still exist.
    pub async fn remove_host_links(&self, attachments: Vec<(String, String)>) {
        let res =
            tokio::task::spawn_blocking(move || devices::remove_host_links(&attachments)).await;
        if let Err(e) = res {
            tracing::warn!(error = %e, "removing host links failed");
        }
    }
}

/// Runs `f` on the locked state; returns its result with the timers it queued and
/// the host links it left stale.
fn run_locked<T, F>(st: &mut IpamState, f: F) -> Locked<T>
where
    F: FnOnce(&mut IpamState) -> Result<T, ApiError>,
{
    let r = f(st);
    (
        r,
        st.take_timers(),
        st.take_stale_links(),
        st.take_flush_soon(),
    )
}

/// Entry point of `podnet daemon`; returns the process exit code.
pub fn run(args: &[String]) -> i32 {
    let opts = match DaemonOptions::parse_with_config_dir(args) {
        Ok(o) => o,
        Err(OptionsError::Flags(e)) => e.exit(),
        Err(e @ OptionsError::ConfigDir { .. }) => {
            eprintln!("podnet daemon: {e}");
            return 1;
        }
    };
    crate::logging::init_stderr(&opts.log_level);
    match start::start(opts) {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!(phase = e.phase(), "{e}");
            eprintln!("podnet daemon: {e}");
            1
        }
    }
}

/// Why queued DELs were not replayed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error("replaying {}: {source}", .path.display())]
    Apply {
        path: PathBuf,
        #[source]
        source: ApiError,
    },
    #[error("cannot remove {}: {source}", .path.display())]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The queued DELs, read outside the state lock. A corrupt entry is renamed
/// `*.bad` and reported (in the log, and in status and metrics while it is
/// there): the daemon does not guess what it meant.
fn read_queue(
    queue: &DeleteQueue,
) -> Result<Vec<(PathBuf, EndpointBatchDeleteRequest)>, ReplayError> {
    let mut out = Vec::new();
    for path in queue.entries()? {
        match read_entry(&path) {
            Ok(req) => out.push((path, req)),
            Err(e) => match queue.set_aside(&path) {
                Ok(bad) => tracing::error!(
                    "{e}; renamed it to {} and leaving its addresses to GC or the expiration timer",
                    bad.display()
                ),
                Err(re) => tracing::error!("{e}; and it could not be set aside: {re}"),
            },
        }
    }
    Ok(out)
}

/// Applies queued DELs to the state (one already applied counts as done).
fn apply_queued(
    state: &mut IpamState,
    queued: &[(PathBuf, EndpointBatchDeleteRequest)],
) -> Result<usize, ReplayError> {
    for (path, req) in queued {
        match state.delete_endpoints(&answers::ipam::endpoint_release(req)) {
            Ok(_) => {}
            Err(e) if e.kind == ErrorKind::NotFound => {}
            Err(source) => {
                return Err(ReplayError::Apply {
                    path: path.clone(),
                    source,
                });
            }
        }
        tracing::info!(container = ?req.container_id, ifname = ?req.container_interface_name, "replayed a queued DEL");
    }
    Ok(queued.len())
}

/// Removes queue entries that were applied.
fn remove_queued(queued: &[(PathBuf, EndpointBatchDeleteRequest)]) -> Result<(), ReplayError> {
    for (path, _) in queued {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(ReplayError::Remove {
                    path: path.clone(),
                    source,
                });
            }
        }
    }
    Ok(())
}

/// Keeps the journal working while the daemon serves: once a second, a failed
/// journal (a full disk) is reopened and checked against memory; after that the
/// teardowns it could not finish are retried. DELs that plugins queued meanwhile
/// (the daemon answered 503) are replayed as soon as the journal commits again.
async fn keep_journal_working(daemon: Arc<Daemon>) {
    loop {
        tokio::time::sleep(JOURNAL_CHECK_INTERVAL).await;
        let recovered = daemon
            .with_state(|s| Ok(s.recover_journal()))
            .await
            .ok()
            .flatten();
        match recovered {
            Some(false) => continue,
            Some(true) => {
                if let Ok(teardowns) = daemon.with_state(|s| Ok(s.pending_teardowns())).await {
                    for td in teardowns {
                        daemon.spawn_teardown(td);
                    }
                }
            }
            None => {}
        }
        let d = daemon.clone();
        let queued = match tokio::task::spawn_blocking(move || read_queue(&d.queue)).await {
            Ok(Ok(q)) if !q.is_empty() => q,
            Ok(Ok(_)) => continue,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot read the DEL queue");
                continue;
            }
            Err(_) => continue,
        };
        let queued = Arc::new(queued);
        let q = queued.clone();
        match daemon
            .with_state(move |s| {
                let n = apply_queued(s, &q)
                    .map_err(|e| ApiError::new(ErrorKind::Unavailable, e.to_string()))?;
                s.note_queued_deletes(n);
                Ok(n)
            })
            .await
        {
            Ok(n) => {
                let removed = tokio::task::spawn_blocking(move || remove_queued(&queued)).await;
                if let Ok(Err(e)) = removed {
                    tracing::warn!(error = %e, "queued DELs were applied but not removed (replaying them again is harmless)");
                }
                tracing::info!(
                    replayed = n,
                    "replayed DELs queued while the daemon could not take them"
                );
            }
            Err(e) => tracing::warn!(error = %e.message, "queued DELs not replayed yet"),
        }
    }
}

/// How often the journal's health and the DEL queue are checked while serving.
const JOURNAL_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Applies the backend's events to the state, one at a time. A change the state
/// refuses (a pool edit that breaks what the node uses) keeps the previous state,
/// and the log says why.
async fn apply_node_events(
    daemon: Arc<Daemon>,
    mut events: tokio::sync::mpsc::Receiver<NodeEvent>,
) {
    while let Some(event) = events.recv().await {
        let (what, applied) = match event {
            NodeEvent::Node(node) => (
                "node resource",
                daemon
                    .with_state(move |s| {
                        s.set_external_node(*node);
                        Ok(())
                    })
                    .await,
            ),
            NodeEvent::Pools(defs) => (
                "pool definitions",
                daemon
                    .with_state(move |s| {
                        s.set_pool_defs(defs)
                            .map_err(|e| ApiError::new(ErrorKind::Conflict, e.to_string()))
                    })
                    .await,
            ),
            NodeEvent::DefaultPool(pool) => (
                "default pool",
                daemon
                    .with_state(move |s| {
                        s.set_default_pool(pool);
                        Ok(())
                    })
                    .await,
            ),
            NodeEvent::Metadata(meta) => (
                "pod and namespace metadata",
                daemon
                    .with_state(move |s| {
                        s.set_metadata(meta);
                        Ok(())
                    })
                    .await,
            ),
            NodeEvent::Facts(facts) => ("the node's addresses", judge_facts(&daemon, facts).await),
        };
        daemon.node_events.send_modify(|n| *n += 1);
        match applied {
            Ok(()) => tracing::info!("{what} reloaded"),
            Err(e) => {
                tracing::error!(error = %e.message, "{what} not applied; keeping the previous state")
            }
        }
    }
}

/// Judges the configuration on the node's new facts, and says a new verdict in
/// the log.
async fn judge_facts(daemon: &Arc<Daemon>, facts: crate::node::NodeFacts) -> Result<(), ApiError> {
    let (verdict, node) = daemon
        .with_state(move |s| {
            let verdict = s.set_node_facts(facts);
            Ok((verdict, s.node().metadata.name.clone()))
        })
        .await?;
    if let Some(v) = verdict {
        v.log(&node);
    }
    Ok(())
}

/// The shortest time between two flushes when allocations wait for blocks.
const WAITING_FLUSH_INTERVAL: Duration = Duration::from_secs(1);

/// Flushes the state's outbox to the backend's sink once per `rate` (Cilium's
/// `ipam-cilium-node-update-rate`), outside the state's lock; sooner, but at most
/// once per [`WAITING_FLUSH_INTERVAL`], while allocations wait for blocks (their
/// demand would otherwise reach the operator up to a whole `rate` later).
async fn flush_outbox(daemon: Arc<Daemon>, mut sink: Box<dyn NodeSink>, rate: Duration) {
    loop {
        let started = tokio::time::Instant::now();
        if let Ok(outbox) = daemon
            .with_state(|s| Ok(s.take_outbox().unwrap_or_default()))
            .await
            && let Err(e) = sink.flush(&outbox).await
        {
            tracing::warn!(error = %e, "could not write the node resource");
        }
        tokio::select! {
            _ = tokio::time::sleep_until(started + rate) => {}
            _ = daemon.demand_waiting.notified() => {
                tokio::time::sleep_until(started + WAITING_FLUSH_INTERVAL.min(rate)).await;
            }
        }
    }
}
