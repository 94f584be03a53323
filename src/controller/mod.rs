//! The controller kit: the one loop of every controller that watches the API
//! server (or the node) and writes somewhere. A [`Controller`] takes its
//! inputs (the events of its watches, merged into one stream, which it feeds
//! into its `k8s::mirror::Mirror`s), says when it is [`Controller::ready`]
//! (every kind listed), plans from what it has, and applies the plan (or, at a
//! resync, checks the world against it and repairs it). What went through
//! last is the controller's to remember (a pass that failed half way leaves
//! half of its plan applied: only the writer knows which half), so the kit
//! keeps no plan. [`run`] owns the timing ([`Timing`]): a pass
//! [`Timing::debounce`] after a change (and at least [`Timing::min_interval`]
//! after the one before), at each resync, when the controller's own state
//! asks ([`Controller::wake_at`]), and after a failed pass again with
//! podnet's one exponential [`Backoff`]. The kit's timing is tested here once,
//! on paused time; each controller tests its plan and its writes.

pub mod timing;

use std::future::Future;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::watcher::{self, Event};
use tokio::time::Instant;

use crate::k8s::mirror::WatchEnded;
use timing::Clock;
pub use timing::{Backoff, Resync, Timing, sleep_until};

/// One controller's side of the kit's loop.
pub trait Controller {
    /// One input: an item of one of its watches.
    type Input;
    /// What the world should be.
    type Plan;
    type Error: std::fmt::Display;
    /// What a pass writes, for the log line of a failed one ("an LB IPAM write").
    const WHAT: &'static str;

    /// Takes one input; returns whether planning must see it, or that a watch
    /// ended (the loop ends then).
    fn feed(&mut self, input: Self::Input) -> Result<bool, WatchEnded>;
    /// Whether a pass may run (every watched kind listed once).
    fn ready(&self) -> bool;
    /// Plans from the inputs (None: nothing to do yet, e.g. dormant).
    fn plan(&mut self) -> impl Future<Output = Option<Self::Plan>>;
    /// Makes the world what `plan` says (against what the controller last
    /// applied).
    fn apply(&mut self, plan: Self::Plan) -> impl Future<Output = Result<(), Self::Error>>;
    /// At resync number `resync` (from 0; a pass stands for every resync since
    /// the one it last saw): checks the world against `plan` and repairs it. By
    /// default an apply.
    fn check(
        &mut self,
        plan: Self::Plan,
        resync: u32,
    ) -> impl Future<Output = Result<(), Self::Error>> {
        let _ = resync;
        self.apply(plan)
    }

    /// When the controller's own state wants a pass without a change seen (a
    /// write it held back whose own retry is due); None: never. Each instant
    /// wakes the loop once: one later than the last pass's start, or than the
    /// last wake.
    fn wake_at(&self) -> Option<Instant> {
        None
    }

    /// A pass failed; it runs again in `retry_in`. By default logged.
    fn failed(&self, error: &Self::Error, retry_in: Duration) {
        tracing::warn!(error = %error, retry_in = ?retry_in, "{} failed", Self::WHAT);
    }
}

/// Runs `controller` over `events` with `timing` until one of its watches
/// ends; returns which. `events` ending only means nothing more comes from
/// it (the timers go on): [`ending`] makes a watch's end an input.
pub async fn run<C, S>(controller: &mut C, events: S, timing: Timing) -> WatchEnded
where
    C: Controller,
    S: Stream<Item = C::Input> + Unpin,
{
    let mut events = events.fuse();
    let mut clock = Clock::new(timing);
    loop {
        let due = clock.due;
        let wake = clock.wake(controller.wake_at());
        tokio::select! {
            biased;
            _ = sleep_until(due) => {}
            _ = clock.resync_tick() => {
                clock.resynced();
                continue;
            }
            _ = sleep_until(wake) => {
                clock.woken(wake);
                continue;
            }
            Some(input) = events.next() => {
                match controller.feed(input) {
                    Err(ended) => return ended,
                    Ok(true) => clock.changed(),
                    Ok(false) => {}
                }
                continue;
            }
        }
        let resync = clock.take_pass();
        let outcome = pass(controller, resync).await;
        clock.passed();
        match outcome {
            Some(Ok(())) => clock.succeeded(),
            Some(Err(e)) => controller.failed(&e, clock.failed()),
            None => {}
        }
    }
}

/// One pass (a resync's when `resync` says): None when it did not run (not
/// ready, nothing planned).
async fn pass<C: Controller>(
    controller: &mut C,
    resync: Option<u32>,
) -> Option<Result<(), C::Error>> {
    if !controller.ready() {
        return None;
    }
    let plan = controller.plan().await?;
    Some(match resync {
        Some(n) => controller.check(plan, n).await,
        None => controller.apply(plan).await,
    })
}

/// One item of a watch of `K` as [`ending`] hands it on (None: the watch
/// ended), what `k8s::mirror::Mirror::feed` takes.
pub type WatchItem<K> = Option<Result<Event<K>, watcher::Error>>;

/// `watch`'s items, then None when it ends: `k8s::mirror::Mirror::feed`
/// makes that a [`WatchEnded`].
pub fn ending<S: Stream>(watch: S) -> impl Stream<Item = Option<S::Item>> {
    watch.map(Some).chain(futures::stream::once(async { None }))
}

#[cfg(test)]
mod tests;
