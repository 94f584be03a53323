//! When a failed API write is tried again: the controller kit's backoff
//! ([`Backoff::API`]: half a second, doubling up to 30 s, reset by a success,
//! [`next_backoff`]), per node
//! for the CiliumNode writes and per pool for the sticky-address records
//! ([`WriteRetries`]), and for a whole pass of LB IPAM or
//! Node IPAM writes ([`Retry`]).

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::controller::Backoff;
pub use crate::controller::sleep_until;

pub const RETRY_FIRST: Duration = Backoff::API.first;
pub const RETRY_MAX: Duration = Backoff::API.max;

/// The wait after a failure, given the wait after the previous one (None: the
/// first failure).
pub fn next_backoff(previous: Option<Duration>) -> Duration {
    Backoff::API.next(previous)
}

/// The objects (nodes, pools) whose write failed, with when to try again and
/// the current backoff.
#[derive(Debug, Default)]
pub struct WriteRetries {
    due: BTreeMap<String, (Instant, Duration)>,
}

impl WriteRetries {
    /// The earliest retry, if any.
    pub fn next_due(&self) -> Option<Instant> {
        self.due.values().map(|(at, _)| *at).min()
    }

    /// The nodes due at `now`.
    pub fn due_at(&self, now: Instant) -> Vec<String> {
        self.due
            .iter()
            .filter(|(_, (at, _))| *at <= now)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Whether `name` waits for its retry at `now` (failed, not due yet).
    pub fn waits(&self, name: &str, now: Instant) -> bool {
        self.due.get(name).is_some_and(|(at, _)| *at > now)
    }

    /// Forgets the names `keep` says are gone.
    pub fn keep(&mut self, keep: impl Fn(&str) -> bool) {
        self.due.retain(|name, _| keep(name));
    }

    /// The node's write succeeded (or it is gone).
    pub fn succeeded(&mut self, name: &str) {
        self.due.remove(name);
    }

    /// The node's write failed: returns how long it waits.
    pub fn failed(&mut self, name: &str) -> Duration {
        let backoff = next_backoff(self.due.get(name).map(|(_, b)| *b));
        self.due
            .insert(name.to_string(), (Instant::now() + backoff, backoff));
        backoff
    }
}

/// When to plan again after failed writes: 0.5 s after the first failure,
/// doubling up to 30 s, until a pass succeeds.
#[derive(Debug, Default)]
pub struct Retry(Option<(Instant, Duration)>);

impl Retry {
    /// When the next attempt is due (None: nothing failed).
    pub fn due(&self) -> Option<Instant> {
        self.0.map(|(at, _)| at)
    }

    /// Records a pass's outcome; returns the wait after a failure.
    pub fn record<E: std::fmt::Display>(&mut self, outcome: Result<(), E>, what: &str) {
        match outcome {
            Ok(()) => self.0 = None,
            Err(e) => {
                let backoff = next_backoff(self.0.map(|(_, b)| b));
                tracing::warn!(error = %e, retry_in = ?backoff, "{what} failed");
                self.0 = Some((Instant::now() + backoff, backoff));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_and_reset() {
        let mut r = Retry::default();
        assert!(r.due().is_none());
        let backoff = |r: &Retry| r.0.map(|(_, b)| b);
        let before = Instant::now();
        r.record(Err("boom"), "a write");
        assert_eq!(backoff(&r), Some(RETRY_FIRST));
        assert!(r.due().is_some_and(|d| d >= before + RETRY_FIRST));
        r.record(Err("boom"), "a write");
        assert_eq!(backoff(&r), Some(RETRY_FIRST * 2));
        for _ in 0..10 {
            r.record(Err("boom"), "a write");
        }
        assert_eq!(backoff(&r), Some(RETRY_MAX));
        r.record(Ok::<(), &str>(()), "a write");
        assert!(r.due().is_none());
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_resets() {
        let mut r = WriteRetries::default();
        assert_eq!(r.next_due(), None);
        let waits: Vec<Duration> = (0..9).map(|_| r.failed("n1")).collect();
        assert_eq!(waits[0], RETRY_FIRST);
        assert_eq!(waits[1], Duration::from_secs(1));
        assert_eq!(waits[8], RETRY_MAX);
        assert!(r.due_at(Instant::now()).is_empty());
        assert_eq!(r.due_at(Instant::now() + RETRY_MAX), ["n1"]);
        r.succeeded("n1");
        assert_eq!(r.next_due(), None);
        assert_eq!(r.failed("n1"), RETRY_FIRST);
    }
}
