//! When a failed API write is tried again: the controller kit's backoff
//! ([`Backoff::API`]: half a second, doubling up to 30 s, reset by a success), per node
//! for the CiliumNode writes and per pool for the sticky-address records
//! ([`WriteRetries`]). A whole pass of a controller (LB IPAM, Node IPAM) is
//! retried by the controller kit (`crate::controller::run`).

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::controller::Backoff;

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
        let backoff = Backoff::API.next(self.due.get(name).map(|(_, b)| *b));
        self.due
            .insert(name.to_string(), (Instant::now() + backoff, backoff));
        backoff
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_and_resets() {
        let mut r = WriteRetries::default();
        assert_eq!(r.next_due(), None);
        let waits: Vec<Duration> = (0..9).map(|_| r.failed("n1")).collect();
        assert_eq!(waits[0], Backoff::API.first);
        assert_eq!(waits[1], Duration::from_secs(1));
        assert_eq!(waits[8], Backoff::API.max);
        assert!(r.due_at(Instant::now()).is_empty());
        assert_eq!(r.due_at(Instant::now() + Backoff::API.max), ["n1"]);
        r.succeeded("n1");
        assert_eq!(r.next_due(), None);
        assert_eq!(r.failed("n1"), Backoff::API.first);
    }
}
