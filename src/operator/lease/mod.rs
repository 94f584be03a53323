//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's rules and
//! Cilium's operator options (lease 15 s, renew deadline 10 s, retry 2 s), and
//! renewals every renew interval (5 s) instead of every retry period: the timing and
//! its rules are [`timing`]. Every change to the Lease is an update checked against
//! the resourceVersion read, so two replicas can never both win. A follower takes the
//! lease over once the record it last saw has not changed for the lease duration,
//! timed on its own clock (no clock skew between replicas matters). Unlike client-go,
//! which reads the Lease every retry period, a follower watches it and reads it only
//! when the lease it saw may have expired or was released: the leader's renewals
//! reach it as watch events, not as requests. The leader renews every renew interval,
//! retries every retry period after a failure, bounds each try by the renew deadline
//! and gives up leading when no renewal succeeded for the renew deadline, which is
//! shorter than the lease: it stops before anyone else may start. On a graceful stop
//! it releases the lease so a follower takes over at once.
//!
//! The leader can also keep a record on the Lease, where a restarted or newly
//! elected leader finds it ([`Elector::carry`], [`Elector::annotation`]): an
//! annotation that rides on the renewals, so it costs no request of its own and
//! is on the Lease within one renew interval of a change.

pub mod timing;

use std::pin::Pin;
use std::time::{Duration, Instant, SystemTime};

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;

use timing::{LeaderStep, Timing, expiry_wait, follower_wait};

/// The Lease's name (Cilium's operator uses `cilium-operator-resource-lock`).
pub const LEASE_NAME: &str = "podnet-operator-resource-lock";

/// One attempt's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    /// This replica holds the lease (acquired or renewed).
    Held,
    /// Another replica holds a lease that has not expired.
    HeldByOther,
    /// Lost a race (the resourceVersion moved): try again.
    Retry,
}

/// What of the Lease's record a follower watches for changes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    holder: String,
    renew: Option<MicroTime>,
    acquire: Option<MicroTime>,
    duration: Option<i32>,
    transitions: Option<i32>,
}

impl Record {
    fn of(spec: &LeaseSpec) -> Record {
        Record {
            holder: spec.holder_identity.clone().unwrap_or_default(),
            renew: spec.renew_time.clone(),
            acquire: spec.acquire_time.clone(),
            duration: spec.lease_duration_seconds,
            transitions: spec.lease_transitions,
        }
    }
}

/// The Lease's changes as a follower sees them (a watch of that one object).
type LeaseEvents =
    Pin<Box<dyn Stream<Item = Result<watcher::Event<Lease>, watcher::Error>> + Send>>;

/// One replica's side of the election.
pub struct Elector {
    client: kube::Client,
    api: Api<Lease>,
    namespace: String,
    identity: String,
    timing: Timing,
    /// The record last seen and when it was first seen (this replica's clock).
    observed: Option<(Record, Instant)>,
    /// The Lease as this replica last wrote it (the leader renews from it).
    cached: Option<Lease>,
    /// Annotations the leader keeps on the Lease, as they are now (None: leave
    /// the Lease's as it is).
    carried: Vec<(&'static str, watch::Receiver<Option<String>>)>,
}

fn now() -> k8s_openapi::jiff::Timestamp {
    let micros = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(0))
        .unwrap_or(0);
    k8s_openapi::jiff::Timestamp::from_microsecond(micros).unwrap_or_default()
}

fn now_micro() -> MicroTime {
    MicroTime(now())
}

impl Elector {
    pub fn new(client: kube::Client, namespace: &str, identity: &str, timing: Timing) -> Elector {
        Elector {
            api: Api::namespaced(client.clone(), namespace),
            client,
            namespace: namespace.to_string(),
            identity: identity.to_string(),
            timing,
            observed: None,
            cached: None,
            carried: Vec::new(),
        }
    }

    /// Keeps annotation `key` on the Lease at the value `value` holds, from the
    /// next write on (the module's rule).
    pub fn carry(&mut self, key: &'static str, value: watch::Receiver<Option<String>>) {
        self.carried.push((key, value));
    }

    /// Annotation `key` of the Lease as this replica last wrote or read it
    /// while leading (a new leader: as the previous one left it).
    pub fn annotation(&self, key: &str) -> Option<String> {
        let lease = self.cached.as_ref()?;
        lease.metadata.annotations.as_ref()?.get(key).cloned()
    }

    /// The carried annotations into `lease`.
    fn stamp(&self, lease: &mut Lease) {
        for (key, value) in &self.carried {
            if let Some(v) = value.borrow().clone() {
                let annotations = lease
                    .metadata
                    .annotations
                    .get_or_insert_with(Default::default);
                annotations.insert((*key).to_string(), v);
            }
        }
    }

    /// Waits until this replica holds the lease.
    pub async fn acquire(&mut self) {
        let mut reported = String::new();
        let mut events: LeaseEvents = watcher(
            self.api.clone(),
            watcher::Config::default().fields(&format!("metadata.name={LEASE_NAME}")),
        )
        .default_backoff()
        .boxed();
        let mut watch_refused = false;
        loop {
            let attempt = self.try_acquire_or_renew().await;
            match &attempt {
                Ok(Attempt::Held) => {
                    tracing::info!(identity = %self.identity, lease = %format!("{}/{LEASE_NAME}", self.namespace), "became leader");
                    self.announce().await;
                    return;
                }
                Ok(_) => {
                    let holder = self
                        .observed
                        .as_ref()
                        .map(|(r, _)| r.holder.clone())
                        .unwrap_or_default();
                    if holder != reported {
                        tracing::info!(leader = %holder, "another replica leads; waiting for its lease to expire");
                        reported = holder;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "leader election: cannot read or write the Lease")
                }
            }
            let wait = self.jitter(follower_wait(
                matches!(attempt, Ok(Attempt::HeldByOther)),
                self.seen_for(),
                self.observed_duration(),
                self.timing.retry_period,
            ));
            let until_expiry = matches!(attempt, Ok(Attempt::HeldByOther));
            self.follow(&mut events, wait, until_expiry, &mut watch_refused)
                .await;
        }
    }

    /// Waits `wait`; returns early when the lease is released or deleted. A wait
    /// `until_expiry` moves its end whenever the watch shows the record changed (the
    /// leader renewed: its lease runs from now); a retry's wait does not. Without
    /// the watch (refused or broken) the wait runs out, and the next attempt reads
    /// the Lease.
    async fn follow(
        &mut self,
        events: &mut LeaseEvents,
        wait: Duration,
        until_expiry: bool,
        refused: &mut bool,
    ) {
        let mut deadline = tokio::time::Instant::now() + wait;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return,
                event = events.next() => match event {
                    Some(Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease))) => {
                        *refused = false;
                        let Some(spec) = lease.spec else { continue };
                        if spec.holder_identity.as_deref().unwrap_or_default().is_empty() {
                            return;
                        }
                        let before = self.seen_for();
                        self.observe(&spec);
                        if until_expiry && self.seen_for() < before {
                            let until = expiry_wait(self.seen_for(), self.observed_duration());
                            deadline = tokio::time::Instant::now() + self.jitter(until);
                        }
                    }
                    Some(Ok(watcher::Event::Delete(_))) => return,
                    Some(Ok(watcher::Event::Init | watcher::Event::InitDone)) => {}
                    Some(Err(e)) => {
                        if !*refused {
                            tracing::warn!(error = %e, "cannot watch the Lease; reading it when the lease may have expired instead (the operator's Role needs list and watch on leases: deploy/operator.yaml)");
                            *refused = true;
                        }
                    }
                    None => {
                        tokio::time::sleep_until(deadline).await;
                        return;
                    }
                },
            }
        }
    }

    /// How long the record last seen has been unchanged (zero before any).
    fn seen_for(&self) -> Duration {
        self.observed
            .as_ref()
            .map(|(_, at)| at.elapsed())
            .unwrap_or_default()
    }

    /// The lease duration the record last seen gives (ours by default).
    fn observed_duration(&self) -> Duration {
        self.observed
            .as_ref()
            .and_then(|(r, _)| r.duration)
            .and_then(|s| u64::try_from(s).ok())
            .map(Duration::from_secs)
            .unwrap_or(self.timing.lease_duration)
    }

    /// Renews the lease while leading (`Timing::leader_step`: every renew interval,
    /// every retry period after a failure, each try bounded by the renew deadline);
    /// returns why leading stopped (another replica holds it, or no renewal
    /// succeeded for the renew deadline).
    pub async fn keep_renewing(&mut self) -> String {
        // Counted from a renewal's start: a follower sees it later than that.
        let mut renewed = Instant::now();
        let mut failed = false;
        loop {
            let LeaderStep::Renew { after, limit } =
                self.timing.leader_step(renewed.elapsed(), failed)
            else {
                return format!(
                    "the lease was not renewed within the renew deadline ({:?})",
                    self.timing.renew_deadline
                );
            };
            tokio::time::sleep(after).await;
            let started = Instant::now();
            failed = true;
            match tokio::time::timeout(limit, self.try_acquire_or_renew()).await {
                Ok(Ok(Attempt::Held)) => {
                    renewed = started;
                    failed = false;
                }
                Ok(Ok(Attempt::HeldByOther)) => {
                    return "another replica holds the lease".into();
                }
                Ok(Ok(Attempt::Retry)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot renew the Lease"),
                Err(_) => tracing::warn!(
                    "renewing the Lease took longer than the {limit:?} left of the renew deadline"
                ),
            }
        }
    }

    /// Gives the lease up (graceful stop): no holder, so a follower takes over at
    /// its next attempt.
    pub async fn release(&mut self) {
        let Some(mut lease) = self.cached.take() else {
            return;
        };
        let mut spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now_micro());
        lease.spec = Some(spec);
        self.stamp(&mut lease);
        match self
            .api
            .replace(LEASE_NAME, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => tracing::info!("released the leader lease"),
            Err(e) => tracing::warn!(error = %e, "cannot release the Lease; it expires by itself"),
        }
    }

    /// `wait` plus up to 10 % of the retry period, so followers do not move in step.
    fn jitter(&self, wait: Duration) -> Duration {
        let mut b = [0u8; 1];
        let r = getrandom::fill(&mut b).map(|_| b[0]).unwrap_or(0);
        wait + self.timing.retry_period * u32::from(r) / 2550
    }

    fn observe(&mut self, spec: &LeaseSpec) -> Instant {
        let record = Record::of(spec);
        match &self.observed {
            Some((r, at)) if *r == record => *at,
            _ => {
                let now = Instant::now();
                self.observed = Some((record, now));
                now
            }
        }
    }

    /// client-go's `tryAcquireOrRenew`.
    async fn try_acquire_or_renew(&mut self) -> Result<Attempt, kube::Error> {
        let leading = self.cached.is_some();
        let current = match self.cached.take() {
            Some(lease) => lease,
            None => match self.api.get_opt(LEASE_NAME).await? {
                Some(lease) => lease,
                None => return self.create().await,
            },
        };
        let spec = current.spec.clone().unwrap_or_default();
        let seen_at = self.observe(&spec);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let duration = self.observed_duration();
        if !leading && !holder.is_empty() && holder != self.identity && seen_at.elapsed() < duration
        {
            return Ok(Attempt::HeldByOther);
        }
        let now = now_micro();
        let mut next = spec.clone();
        if holder != self.identity {
            next.acquire_time = Some(now.clone());
            next.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        next.holder_identity = Some(self.identity.clone());
        next.lease_duration_seconds = Some(self.timing.lease_seconds());
        next.renew_time = Some(now);
        let mut lease = current;
        lease.spec = Some(next);
        self.stamp(&mut lease);
        // The object carries the resourceVersion it was read with: a concurrent
        // change makes this a 409, never a second winner.
        match self
            .api
            .replace(LEASE_NAME, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => Ok(self.hold(written)),
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(Attempt::Retry),
            Err(e) => Err(e),
        }
    }

    /// Keeps the Lease as this replica wrote it: it holds the lease.
    fn hold(&mut self, written: Lease) -> Attempt {
        if let Some(s) = &written.spec {
            self.observe(s);
        }
        self.cached = Some(written);
        Attempt::Held
    }

    async fn create(&mut self) -> Result<Attempt, kube::Error> {
        let now = now_micro();
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(LEASE_NAME.into()),
                namespace: Some(self.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                lease_duration_seconds: Some(self.timing.lease_seconds()),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(written) => Ok(self.hold(written)),
            Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(Attempt::Retry),
            Err(e) => Err(e),
        }
    }

    /// An Event on the Lease, as client-go's leader election records one.
    async fn announce(&self) {
        let Some(lease) = &self.cached else {
            return;
        };
        let now = now();
        let event = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{LEASE_NAME}.")),
                namespace: Some(self.namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some("coordination.k8s.io/v1".into()),
                kind: Some("Lease".into()),
                name: Some(LEASE_NAME.into()),
                namespace: Some(self.namespace.clone()),
                uid: lease.metadata.uid.clone(),
                ..ObjectReference::default()
            },
            reason: Some("LeaderElection".into()),
            message: Some(format!("{} became leader", self.identity)),
            type_: Some("Normal".into()),
            source: Some(EventSource {
                component: Some("podnet-operator".into()),
                ..EventSource::default()
            }),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            ..Event::default()
        };
        let events: Api<Event> = Api::namespaced(self.client.clone(), &self.namespace);
        if let Err(e) = events.create(&PostParams::default(), &event).await {
            tracing::warn!(error = %e, "cannot record the leader election Event");
        }
    }
}
