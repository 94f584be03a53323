//! When a controller's passes run: [`Timing`] (debounce after a change, the
//! resync, the backoff after a failed pass) and [`Backoff`], podnet's one
//! exponential backoff rule (the operator's API writes: [`Backoff::API`]).

use std::time::Duration;

use tokio::time::{Instant, Interval};

/// Waits after failures: `first` after the first one, doubling up to `max`,
/// reset by a success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub first: Duration,
    pub max: Duration,
}

impl Backoff {
    /// The operator's API writes: half a second, doubling up to 30 s.
    pub const API: Backoff = Backoff {
        first: Duration::from_millis(500),
        max: Duration::from_secs(30),
    };

    /// The wait after a failure, given the wait after the previous one (None:
    /// the first failure).
    pub fn next(self, previous: Option<Duration>) -> Duration {
        previous
            .map(|b| (b * 2).min(self.max))
            .unwrap_or(self.first)
    }
}

/// How often the world is compared with the plan without a change seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resync {
    pub every: Duration,
    /// Whether the first comes at once (else after `every`).
    pub at_once: bool,
    /// Whether `every` counts from the end of the last pass (else the
    /// resyncs keep their beat whatever passes between them).
    pub after_each_pass: bool,
}

/// A controller's timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How long after a change the pass waits for more (zero: at once). Later
    /// changes do not move a pass already due.
    pub debounce: Duration,
    /// The shortest time from the start of one pass to the next for a change
    /// (a burst after the first change of a quiet spell is paced).
    pub min_interval: Duration,
    /// None: the world is compared with the plan only when a pass fails.
    pub resync: Option<Resync>,
    pub backoff: Backoff,
    /// Whether a change waits for the backoff of a failed pass (else it
    /// passes after the debounce, sooner than the backoff).
    pub changes_wait_for_backoff: bool,
}

impl Timing {
    /// A pass at once after each change, no resync, the API backoff (LB IPAM,
    /// Node IPAM).
    pub const AT_ONCE: Timing = Timing {
        debounce: Duration::ZERO,
        min_interval: Duration::ZERO,
        resync: None,
        backoff: Backoff::API,
        changes_wait_for_backoff: false,
    };
}

/// Sleeps until `due`; never wakes without one.
pub async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A controller's clock: when its next pass is due, whether it is a resync
/// (and which, counting from 0), and the backoff of the failures in a row.
pub(super) struct Clock {
    timing: Timing,
    /// When the next pass is due (None: nothing waits).
    pub(super) due: Option<Instant>,
    resync: Option<Interval>,
    resyncs: u32,
    /// The resync the next pass is (None: a plain pass).
    check: Option<u32>,
    /// The wait after the last failure (None: the last pass went through).
    backoff: Option<Duration>,
    /// Whether the pass due is the retry of a failed one.
    retrying: bool,
    /// When the last pass began.
    last_pass: Option<Instant>,
    /// The last wake the controller asked for that was taken.
    last_wake: Option<Instant>,
}

impl Clock {
    pub(super) fn new(timing: Timing) -> Clock {
        let resync = timing.resync.map(|r| match r.at_once {
            true => tokio::time::interval(r.every),
            false => tokio::time::interval_at(Instant::now() + r.every, r.every),
        });
        Clock {
            timing,
            due: None,
            resync,
            resyncs: 0,
            check: None,
            backoff: None,
            retrying: false,
            last_pass: None,
            last_wake: None,
        }
    }

    /// A change was seen: a pass after the debounce, unless one is due sooner.
    pub(super) fn changed(&mut self) {
        if self.retrying && self.timing.changes_wait_for_backoff {
            return;
        }
        let mut at = Instant::now() + self.timing.debounce;
        if let Some(last) = self.last_pass {
            at = at.max(last + self.timing.min_interval);
        }
        self.due = Some(self.due.map_or(at, |due| due.min(at)));
    }

    /// Waits for the next resync (never, without one).
    pub(super) async fn resync_tick(&mut self) {
        match self.resync.as_mut() {
            Some(interval) => {
                interval.tick().await;
            }
            None => std::future::pending().await,
        }
    }

    /// The wake to wait for of those the controller asks for: one later than
    /// the last pass's start and the last wake taken (each wakes once).
    pub(super) fn wake(&self, asked: Option<Instant>) -> Option<Instant> {
        let after = self.last_pass.max(self.last_wake);
        asked.filter(|at| after.is_none_or(|after| *at > after))
    }

    /// A wake the controller asked for came: a pass as for a change.
    pub(super) fn woken(&mut self, at: Option<Instant>) {
        self.last_wake = at;
        self.changed();
    }

    /// A resync is due: the next pass is this one (the numbers say which
    /// resyncs a pass stood for).
    pub(super) fn resynced(&mut self) {
        self.check = Some(self.resyncs);
        self.resyncs = self.resyncs.wrapping_add(1);
        self.changed();
    }

    /// The pass begins: returns the resync it is, if it is one.
    pub(super) fn take_pass(&mut self) -> Option<u32> {
        self.due = None;
        self.retrying = false;
        self.last_pass = Some(Instant::now());
        self.check.take()
    }

    /// The pass ended: a resync counted from the last pass starts again.
    pub(super) fn passed(&mut self) {
        let restart = self.timing.resync.is_some_and(|r| r.after_each_pass);
        if let (true, Some(interval)) = (restart, self.resync.as_mut()) {
            interval.reset();
        }
    }

    pub(super) fn succeeded(&mut self) {
        self.backoff = None;
    }

    /// The pass failed: another is due after the backoff; returns the wait.
    pub(super) fn failed(&mut self) -> Duration {
        let wait = self.timing.backoff.next(self.backoff);
        self.backoff = Some(wait);
        self.due = Some(Instant::now() + wait);
        self.retrying = true;
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let b = Backoff::API;
        let mut wait = None;
        let waits: Vec<Duration> = (0..9)
            .map(|_| {
                let w = b.next(wait);
                wait = Some(w);
                w
            })
            .collect();
        assert_eq!(waits[0], Duration::from_millis(500));
        assert_eq!(waits[1], Duration::from_secs(1));
        assert_eq!(waits[8], Duration::from_secs(30));
    }
}
