//! The election's clock, pure: the four durations (Cilium's lease duration, renew
//! deadline and retry period, and podnet's renew interval), the rules that keep them
//! safe, when a follower tries next and when the leader renews or steps down.
//!
//! Safety: the leader counts its renew deadline from the start of its last renewal
//! that succeeded; a follower counts the lease duration from when it saw that
//! renewal, which is later. The deadline is shorter than the lease, so the leader
//! has stopped before any follower may start. Failover after a leader dies: the
//! lease duration after its last renewal, so between `lease - renew interval` and
//! `lease` after its death (plus a follower's jitter and one request).

use std::time::Duration;

/// The election's durations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How long a lease lasts unrenewed (written to the Lease, in whole seconds).
    pub lease_duration: Duration,
    /// The leader stops leading when no renewal succeeded for this long.
    pub renew_deadline: Duration,
    /// How long the leader waits between renewals that succeed.
    pub renew_interval: Duration,
    /// How long the leader waits after a renewal that failed, and a follower after
    /// a lost race or an error.
    pub retry_period: Duration,
}

/// Cilium's operator defaults (lease 15 s, renew deadline 10 s, retry 2 s), with
/// renewals every 5 s instead of every retry period: 12 requests a minute instead of
/// 30, and still three tries (5, 7 and 9 s) before the renew deadline.
impl Default for Timing {
    fn default() -> Timing {
        let renew_deadline = Duration::from_secs(10);
        let retry_period = Duration::from_secs(2);
        Timing {
            lease_duration: Duration::from_secs(15),
            renew_deadline,
            renew_interval: default_renew_interval(renew_deadline, retry_period),
            retry_period,
        }
    }
}

/// The renew interval when none is given: half the renew deadline (room for
/// retries after a failed renewal), never less than the retry period.
pub fn default_renew_interval(renew_deadline: Duration, retry_period: Duration) -> Duration {
    (renew_deadline / 2).max(retry_period)
}

/// Durations that would let two replicas lead at once, or the leader never renew.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    #[error(
        "--{OPT_LEASE_DURATION} must be at least 1s (the Lease holds whole seconds), not {0:?}"
    )]
    LeaseTooShort(Duration),
    #[error(
        "--{OPT_RENEW_DEADLINE} ({deadline:?}) must be shorter than --{OPT_LEASE_DURATION} ({lease:?} as the Lease holds it): the leader must stop before a follower may take over"
    )]
    DeadlineNotBeforeLease { deadline: Duration, lease: Duration },
    #[error("--{option} must be more than 0")]
    Zero { option: &'static str },
    #[error(
        "--{option} ({period:?}) must be shorter than --{OPT_RENEW_DEADLINE} ({deadline:?}): the leader would give up before it tries"
    )]
    NotBeforeDeadline {
        option: &'static str,
        period: Duration,
        deadline: Duration,
    },
}

pub const OPT_LEASE_DURATION: &str = "leader-election-lease-duration";
pub const OPT_RENEW_DEADLINE: &str = "leader-election-renew-deadline";
pub const OPT_RENEW_INTERVAL: &str = "leader-election-renew-interval";
pub const OPT_RETRY_PERIOD: &str = "leader-election-retry-period";

impl Timing {
    /// Checks client-go's rules (lease > renew deadline > retry period > 0) and
    /// that a renewal comes before the deadline.
    pub fn check(self) -> Result<Timing, TimingError> {
        let lease = self.lease_written();
        if lease.is_zero() {
            return Err(TimingError::LeaseTooShort(self.lease_duration));
        }
        if self.renew_deadline >= lease {
            return Err(TimingError::DeadlineNotBeforeLease {
                deadline: self.renew_deadline,
                lease,
            });
        }
        for (option, period) in [
            (OPT_RETRY_PERIOD, self.retry_period),
            (OPT_RENEW_INTERVAL, self.renew_interval),
        ] {
            if period.is_zero() {
                return Err(TimingError::Zero { option });
            }
            if period >= self.renew_deadline {
                return Err(TimingError::NotBeforeDeadline {
                    option,
                    period,
                    deadline: self.renew_deadline,
                });
            }
        }
        Ok(self)
    }

    /// The lease duration as the Lease holds it: whole seconds.
    pub fn lease_written(&self) -> Duration {
        Duration::from_secs(u64::from(self.lease_seconds().unsigned_abs()))
    }

    /// `spec.leaseDurationSeconds` (0 for a lease under a second, which `check` refuses).
    pub fn lease_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }

    /// What the leader does next, `since_renewed` after the start of its last
    /// renewal that succeeded: after a success, renew one renew interval after it
    /// started; after a failure, one retry period from now. An attempt may run until
    /// the renew deadline; one that could not start before it is not made.
    pub fn leader_step(&self, since_renewed: Duration, last_failed: bool) -> LeaderStep {
        let at = if last_failed {
            since_renewed + self.retry_period
        } else {
            self.renew_interval.max(since_renewed)
        };
        if at >= self.renew_deadline {
            return LeaderStep::StepDown;
        }
        LeaderStep::Renew {
            after: at - since_renewed,
            limit: self.renew_deadline - at,
        }
    }
}

/// The leader's next move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaderStep {
    /// Wait `after`, then renew, giving the attempt at most `limit`.
    Renew { after: Duration, limit: Duration },
    /// Stop leading: no renewal can succeed within the renew deadline.
    StepDown,
}

/// How long a follower waits before its next attempt: after an attempt that found
/// the lease held by another replica (`held_by_other`), until the record it saw
/// unchanged for `seen_for` has been unchanged for the lease's `duration` (then it
/// may take it over); after a lost race or an error, one retry period.
pub fn follower_wait(
    held_by_other: bool,
    seen_for: Duration,
    duration: Duration,
    retry: Duration,
) -> Duration {
    match held_by_other {
        true => expiry_wait(seen_for, duration),
        false => retry,
    }
}

/// How long until a lease record unchanged for `seen_for` may have expired.
pub fn expiry_wait(seen_for: Duration, duration: Duration) -> Duration {
    duration.saturating_sub(seen_for)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(15);
    const RETRY: Duration = Duration::from_secs(2);

    fn s(secs: f64) -> Duration {
        Duration::from_secs_f64(secs)
    }

    #[test]
    fn a_follower_waits_until_the_lease_it_saw_may_have_expired() {
        assert_eq!(follower_wait(true, Duration::ZERO, LEASE, RETRY), LEASE);
        assert_eq!(follower_wait(true, s(11.0), LEASE, RETRY), s(4.0));
        // Already past it (the watch was down): try at once.
        assert_eq!(follower_wait(true, s(40.0), LEASE, RETRY), Duration::ZERO);
    }

    #[test]
    fn a_lost_race_or_an_error_waits_one_retry_period() {
        assert_eq!(follower_wait(false, Duration::ZERO, LEASE, RETRY), RETRY);
        assert_eq!(follower_wait(false, s(40.0), LEASE, RETRY), RETRY);
    }

    #[test]
    fn the_defaults_are_ciliums_with_a_renewal_every_five_seconds() {
        let t = Timing::default();
        assert_eq!(
            (
                t.lease_duration,
                t.renew_deadline,
                t.renew_interval,
                t.retry_period
            ),
            (LEASE, s(10.0), s(5.0), RETRY)
        );
        assert_eq!(t.check(), Ok(t));
        assert_eq!(t.lease_seconds(), 15);
        // Renewals a minute: 12, where renewing every retry period made 30.
        assert_eq!(60 / t.renew_interval.as_secs(), 12);
    }

    #[test]
    fn the_renew_interval_defaults_to_half_the_deadline_at_least_one_retry() {
        assert_eq!(default_renew_interval(s(10.0), s(2.0)), s(5.0));
        assert_eq!(default_renew_interval(s(10.0), s(8.0)), s(8.0));
        assert_eq!(default_renew_interval(s(60.0), s(5.0)), s(30.0));
    }

    #[test]
    fn a_leader_that_renews_waits_one_renew_interval_from_the_renewals_start() {
        let t = Timing::default();
        assert_eq!(
            t.leader_step(Duration::ZERO, false),
            LeaderStep::Renew {
                after: s(5.0),
                limit: s(5.0)
            }
        );
        // The renewal took 300 ms: the next starts 5 s after it started.
        assert_eq!(
            t.leader_step(s(0.3), false),
            LeaderStep::Renew {
                after: s(4.7),
                limit: s(5.0)
            }
        );
        // One that took longer than the interval: at once, with what is left.
        assert_eq!(
            t.leader_step(s(6.0), false),
            LeaderStep::Renew {
                after: Duration::ZERO,
                limit: s(4.0)
            }
        );
    }

    #[test]
    fn a_leader_whose_renewals_fail_retries_then_steps_down_before_the_deadline() {
        let t = Timing::default();
        // Renewed at 0; the tries at 5, 7 and 9 s fail at once.
        let mut now = Duration::ZERO;
        let mut tries = Vec::new();
        let mut failed = false;
        while let LeaderStep::Renew { after, limit } = t.leader_step(now, failed) {
            now += after;
            assert_eq!(limit, t.renew_deadline - now);
            tries.push(now);
            failed = true;
        }
        assert_eq!(tries, [s(5.0), s(7.0), s(9.0)]);
        assert!(now < t.renew_deadline);
        // A try that hangs until its limit ends at the deadline: step down.
        assert_eq!(t.leader_step(t.renew_deadline, true), LeaderStep::StepDown);
        assert_eq!(t.leader_step(t.renew_deadline, false), LeaderStep::StepDown);
    }

    /// The leader steps down before the earliest moment a follower may take over,
    /// whatever fails: the follower counts the lease from when it saw the last
    /// renewal, no earlier than that renewal's start, where the leader counts from.
    #[test]
    fn a_leader_always_stops_before_a_follower_may_start() {
        let timings = [
            Timing::default(),
            Timing {
                renew_interval: s(8.0),
                ..Timing::default()
            },
            Timing {
                lease_duration: s(60.0),
                renew_deadline: s(40.0),
                renew_interval: s(20.0),
                retry_period: s(5.0),
            },
        ];
        for t in timings {
            let t = t.check().unwrap();
            // Each try fails after `latency` (a hanging one at its limit).
            for latency in [0.0, 0.1, 1.0, 3.0, 100.0] {
                let mut now = Duration::ZERO;
                let mut failed = false;
                while let LeaderStep::Renew { after, limit } = t.leader_step(now, failed) {
                    now += after + s(latency).min(limit);
                    failed = true;
                }
                let follower_may_start = t.lease_written();
                assert!(
                    now <= t.renew_deadline && now < follower_may_start,
                    "{t:?} latency {latency}: stepped down at {now:?}"
                );
            }
        }
    }

    /// A leader killed `since` after its last renewal is taken over when the record
    /// the follower saw has been unchanged for the lease: at most the lease duration
    /// after the kill, at least the lease less one renew interval.
    #[test]
    fn a_dead_leader_is_replaced_within_the_lease_duration() {
        let t = Timing::default();
        for since in [0.0, 1.0, 4.9] {
            let killed = s(since);
            // The follower saw the renewal at 0 and has seen nothing since.
            let takeover = follower_wait(true, killed, t.lease_written(), RETRY) + killed;
            let failover = takeover - killed;
            assert!(
                failover <= t.lease_duration && failover > t.lease_duration - t.renew_interval,
                "{since}: {failover:?}"
            );
        }
    }

    #[test]
    fn unsafe_durations_are_refused_naming_the_option() {
        let refused = |t: Timing| t.check().unwrap_err().to_string();
        assert_eq!(
            refused(Timing {
                renew_deadline: LEASE,
                ..Timing::default()
            }),
            "--leader-election-renew-deadline (15s) must be shorter than \
             --leader-election-lease-duration (15s as the Lease holds it): the leader must \
             stop before a follower may take over"
        );
        // 10.5 s is written as 10: the deadline must be shorter than that.
        assert!(
            refused(Timing {
                lease_duration: s(10.5),
                ..Timing::default()
            })
            .contains("(10s as the Lease holds it)")
        );
        assert_eq!(
            refused(Timing {
                lease_duration: s(0.5),
                ..Timing::default()
            }),
            "--leader-election-lease-duration must be at least 1s (the Lease holds whole \
             seconds), not 500ms"
        );
        let default = Timing::default();
        for (timing, message) in [
            (
                Timing {
                    retry_period: Duration::ZERO,
                    ..default
                },
                "--leader-election-retry-period must be more than 0",
            ),
            (
                Timing {
                    renew_interval: Duration::ZERO,
                    ..default
                },
                "--leader-election-renew-interval must be more than 0",
            ),
            (
                Timing {
                    renew_interval: s(10.0),
                    ..default
                },
                "--leader-election-renew-interval (10s) must be shorter than \
                 --leader-election-renew-deadline (10s): the leader would give up before it tries",
            ),
            (
                Timing {
                    retry_period: s(12.0),
                    ..default
                },
                "--leader-election-retry-period (12s) must be shorter than \
                 --leader-election-renew-deadline (10s): the leader would give up before it tries",
            ),
        ] {
            assert_eq!(refused(timing), message);
        }
    }
}
