//! What a state call leaves for the daemon to do outside the state's lock: the
//! timers to arm (expiration, end of cooldown), the host links of expired
//! attachments to remove, and whether the node sink should write soon rather
//! than at the next update interval. The state queues them; the caller takes
//! them after each call.

use std::net::IpAddr;

use crate::datapath::link_marker::JournalMark;

/// What a timer does when it fires.
#[derive(Debug, Clone, PartialEq)]
pub enum TimerKind {
    /// Release a pending address unless its endpoint was created (UUID matches).
    Expire { uuid: String },
    /// End the cooldown of a released address.
    Cooldown,
}

/// A timer to arm: act on `ip` at `deadline_ms` (ms since the epoch).
#[derive(Debug, Clone, PartialEq)]
pub struct Timer {
    pub ip: IpAddr,
    pub deadline_ms: u64,
    pub kind: TimerKind,
}

/// The host link of an attachment whose address expired (its plugin died before
/// the endpoint was registered). The daemon removes it only if its marker shows
/// it was made under this journal no later than `made_by`: a retried ADD's newer
/// link of the same name is left alone.
#[derive(Debug, Clone, PartialEq)]
pub struct StaleLink {
    pub name: String,
    pub made_by: JournalMark,
}

/// The effects queued since the caller last took them.
#[derive(Debug, Default)]
pub(super) struct Effects {
    timers: Vec<Timer>,
    stale_links: Vec<StaleLink>,
    /// Another node waits for what the outbox holds (a sticky block given back).
    flush_soon: bool,
}

impl Effects {
    /// Queues a timer to arm.
    pub(super) fn arm(&mut self, timer: Timer) {
        self.timers.push(timer);
    }

    /// Queues a host link to remove.
    pub(super) fn remove_link(&mut self, link: StaleLink) {
        self.stale_links.push(link);
    }

    /// Asks for the outbox to be written soon.
    pub(super) fn flush_soon(&mut self) {
        self.flush_soon = true;
    }

    pub(super) fn take_flush_soon(&mut self) -> bool {
        std::mem::take(&mut self.flush_soon)
    }

    pub(super) fn take_timers(&mut self) -> Vec<Timer> {
        std::mem::take(&mut self.timers)
    }

    pub(super) fn take_stale_links(&mut self) -> Vec<StaleLink> {
        std::mem::take(&mut self.stale_links)
    }
}
