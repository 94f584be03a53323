//! The kit's timing, once, on paused time, with a controller in memory.

use std::collections::VecDeque;
use std::time::Duration;

use futures::stream::{self, StreamExt};
use tokio::time::Instant;

use super::*;

/// What the in-memory controller is fed.
#[derive(Debug, Clone, Copy)]
enum In {
    /// Every kind is listed.
    Listed,
    /// The value grows by this much.
    Add(i64),
    /// Nothing planning sees.
    Same,
    /// A watch ended.
    End,
}

/// Plans its value; records each apply and check (when, what).
struct Memory {
    start: Instant,
    listed: bool,
    value: i64,
    /// The outcomes of the next passes (true: it fails); then they succeed.
    failures: VecDeque<bool>,
    applied: Vec<(Duration, i64)>,
    checked: Vec<(Duration, i64, u32)>,
    /// What `wake_at` answers (it never changes by itself).
    wake: Option<Instant>,
}

impl Memory {
    fn new(failures: &[bool]) -> Memory {
        Memory {
            start: Instant::now(),
            listed: false,
            value: 0,
            failures: failures.iter().copied().collect(),
            applied: Vec::new(),
            checked: Vec::new(),
            wake: None,
        }
    }

    fn outcome(&mut self) -> Result<(), &'static str> {
        match self.failures.pop_front() {
            Some(true) => Err("the world is down"),
            _ => Ok(()),
        }
    }

    fn applied_at(&self) -> Vec<Duration> {
        self.applied.iter().map(|a| a.0).collect()
    }
}

impl Controller for Memory {
    type Input = In;
    type Plan = i64;
    type Error = &'static str;
    const WHAT: &'static str = "a write to memory";

    fn feed(&mut self, input: In) -> Result<bool, WatchEnded> {
        match input {
            In::Listed => self.listed = true,
            In::Add(n) => self.value += n,
            In::Same => return Ok(false),
            In::End => return Err(WatchEnded { kind: "Toy".into() }),
        }
        Ok(true)
    }

    fn ready(&self) -> bool {
        self.listed
    }

    async fn plan(&mut self) -> Option<i64> {
        Some(self.value)
    }

    async fn apply(&mut self, plan: i64) -> Result<(), &'static str> {
        self.applied.push((self.start.elapsed(), plan));
        self.outcome()
    }

    async fn check(&mut self, plan: i64, resync: u32) -> Result<(), &'static str> {
        self.checked.push((self.start.elapsed(), plan, resync));
        self.outcome()
    }

    fn wake_at(&self) -> Option<Instant> {
        self.wake
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn timing(debounce: Duration, resync: Option<Resync>) -> Timing {
    Timing {
        debounce,
        min_interval: Duration::ZERO,
        resync,
        backoff: Backoff::API,
        changes_wait_for_backoff: false,
    }
}

/// Runs `memory` for `time` over `inputs`, each after its wait, then a
/// stream that stays open; returns how the loop ended, if it did.
async fn run_for(
    memory: &mut Memory,
    inputs: Vec<(Duration, In)>,
    timing: Timing,
    time: Duration,
) -> Option<WatchEnded> {
    let events = stream::iter(inputs)
        .then(|(wait, input)| async move {
            tokio::time::sleep(wait).await;
            input
        })
        .chain(stream::pending())
        .boxed();
    tokio::time::timeout(time, run(memory, events, timing))
        .await
        .ok()
}

#[tokio::test(start_paused = true)]
async fn changes_within_the_debounce_are_one_pass() {
    let mut m = Memory::new(&[]);
    let inputs = vec![
        (ms(0), In::Listed),
        (ms(0), In::Add(1)),
        (ms(50), In::Add(2)),
        (ms(10), In::Same),
        (ms(300), In::Add(3)),
    ];
    run_for(&mut m, inputs, timing(ms(200), None), ms(10_000)).await;
    assert_eq!(m.applied, [(ms(200), 3), (ms(560), 6)]);
    assert!(m.checked.is_empty());
}

#[tokio::test(start_paused = true)]
async fn nothing_passes_before_ready() {
    let mut m = Memory::new(&[]);
    let inputs = vec![(ms(0), In::Add(1)), (ms(1000), In::Listed)];
    run_for(&mut m, inputs, timing(ms(200), None), ms(10_000)).await;
    assert_eq!(m.applied, [(ms(1200), 1)]);
}

#[tokio::test(start_paused = true)]
async fn failures_back_off_doubling_and_a_success_resets() {
    let mut m = Memory::new(&[true, true, true, false, true]);
    let inputs = vec![(ms(0), In::Listed), (ms(10_000), In::Add(1))];
    run_for(&mut m, inputs, timing(ms(0), None), ms(60_000)).await;
    let at = [0, 500, 1500, 3500, 10_000, 10_500];
    assert_eq!(m.applied_at(), at.map(ms));
}

#[tokio::test(start_paused = true)]
async fn a_change_does_not_wait_for_the_backoff_unless_told_to() {
    for (wait, second) in [(false, ms(100)), (true, ms(500))] {
        let mut m = Memory::new(&[true]);
        let inputs = vec![(ms(0), In::Listed), (ms(100), In::Add(1))];
        let mut t = timing(ms(0), None);
        t.changes_wait_for_backoff = wait;
        run_for(&mut m, inputs, t, ms(10_000)).await;
        assert_eq!(m.applied_at(), [ms(0), second]);
    }
}

/// A resync every 30 s (`at_once`: the first at once; `after_each_pass`:
/// counted from the last pass).
fn every_30s(at_once: bool, after_each_pass: bool) -> Resync {
    Resync {
        every: Duration::from_secs(30),
        at_once,
        after_each_pass,
    }
}

/// A controller listed at once, with `resync`, run for `time` over `later`
/// inputs (each after its wait) after `failures`.
async fn resynced(
    failures: &[bool],
    resync: Resync,
    later: Vec<(Duration, In)>,
    debounce: Duration,
    time: Duration,
) -> Memory {
    let mut inputs = vec![(ms(0), In::Listed)];
    inputs.extend(later);
    let mut m = Memory::new(failures);
    run_for(&mut m, inputs, timing(debounce, Some(resync)), time).await;
    m
}

#[tokio::test(start_paused = true)]
async fn resyncs_check_the_world_after_the_debounce_once_ready() {
    let m = resynced(&[], every_30s(false, false), vec![], ms(200), ms(65_000)).await;
    assert_eq!(m.applied, [(ms(200), 0)]);
    assert_eq!(m.checked, [(ms(30_200), 0, 0), (ms(60_200), 0, 1)]);

    let m = resynced(&[], every_30s(true, false), vec![], ms(200), ms(35_000)).await;
    assert!(m.applied.is_empty(), "the first pass is the first resync");
    assert_eq!(m.checked, [(ms(200), 0, 0), (ms(30_200), 0, 1)]);

    // Not ready: no resync checks anything.
    let mut m = Memory::new(&[]);
    let t = timing(ms(200), Some(every_30s(true, false)));
    run_for(&mut m, Vec::new(), t, ms(65_000)).await;
    assert!(m.checked.is_empty() && m.applied.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_resync_counted_from_the_last_pass_waits_after_a_change() {
    let change = vec![(ms(20_000), In::Add(1))];
    let m = resynced(&[], every_30s(false, true), change, ms(0), ms(85_000)).await;
    assert_eq!(m.applied, [(ms(0), 0), (ms(20_000), 1)]);
    assert_eq!(m.checked, [(ms(50_000), 1, 0), (ms(80_000), 1, 1)]);
}

#[tokio::test(start_paused = true)]
async fn a_failed_check_is_retried_as_an_apply_after_the_backoff() {
    let m = resynced(&[true], every_30s(true, false), vec![], ms(100), ms(10_000)).await;
    assert_eq!(m.checked, [(ms(100), 0, 0)]);
    assert_eq!(m.applied, [(ms(600), 0)]);
}

#[tokio::test(start_paused = true)]
async fn changes_are_paced_from_the_start_of_the_last_pass() {
    let mut m = Memory::new(&[]);
    let adds = [10, 400].map(|wait| (ms(wait), In::Add(1)));
    let inputs = [(ms(0), In::Listed)].into_iter().chain(adds).collect();
    let mut t = timing(ms(0), None);
    t.min_interval = ms(100);
    run_for(&mut m, inputs, t, ms(10_000)).await;
    assert_eq!(m.applied_at(), [ms(0), ms(100), ms(410)]);
}

#[tokio::test(start_paused = true)]
async fn a_watch_that_ends_ends_the_loop_and_ending_says_so() {
    let mut m = Memory::new(&[]);
    let inputs = vec![(ms(0), In::Listed), (ms(1000), In::End)];
    let ended = run_for(&mut m, inputs, timing(ms(0), None), ms(10_000)).await;
    assert_eq!(ended, Some(WatchEnded { kind: "Toy".into() }));

    let items: Vec<Option<u8>> = ending(stream::iter([1, 2])).collect().await;
    assert_eq!(items, [Some(1), Some(2), None]);
}

#[tokio::test(start_paused = true)]
async fn a_wake_the_controller_asks_for_passes_once_and_one_before_the_last_pass_never() {
    let mut m = Memory::new(&[]);
    m.wake = Some(m.start + ms(5000));
    let inputs = vec![(ms(0), In::Listed), (ms(100), In::Add(1))];
    run_for(&mut m, inputs, timing(ms(0), None), ms(20_000)).await;
    // The changes, then the wake once, though wake_at still names it.
    assert_eq!(m.applied_at(), [ms(0), ms(100), ms(5000)]);

    // A wake already taken, or not later than a pass's start, wakes nothing
    // again (here the first, before the controller was ready).
    let mut m = Memory::new(&[]);
    m.wake = Some(m.start);
    let inputs = vec![(ms(0), In::Listed), (ms(100), In::Add(1))];
    run_for(&mut m, inputs, timing(ms(0), None), ms(1000)).await;
    assert_eq!(m.applied_at(), [ms(0), ms(100)]);
}
