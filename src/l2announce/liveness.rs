//! Which nodes are live, from when each was last heard: pure, no I/O, the time
//! passed in. A node heard at `t` is live while `now < t + every * missed` and dead
//! from that instant on (the boundary itself is dead). This node is always live.
//! For a start grace of `every * (missed + 1)` after the agent started, the set
//! is not settled: the agent has not heard anybody yet, and its caller must not
//! take every other node for dead (it would announce every address).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tokio::time::Instant;

/// The heartbeat's rhythm: a beat every `every`; a node not heard for `missed`
/// beats is dead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Beat {
    pub every: Duration,
    pub missed: u32,
}

impl Default for Beat {
    fn default() -> Self {
        Beat {
            every: Duration::from_millis(500),
            missed: 3,
        }
    }
}

impl Beat {
    /// How long after it was last heard a node is dead.
    pub fn dead_after(&self) -> Duration {
        self.every.saturating_mul(self.missed)
    }

    /// How long after the agent started its live set is settled: one beat more
    /// than a node may stay silent, so every live peer had time to be heard.
    pub fn start_grace(&self) -> Duration {
        self.every.saturating_mul(self.missed.saturating_add(1))
    }
}

/// The nodes live at some instant. `settled` is false during the start grace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveSet {
    pub live: BTreeSet<String>,
    pub settled: bool,
}

/// When each other node was last heard, and when this agent started.
#[derive(Clone, Debug)]
pub struct Liveness {
    own: String,
    beat: Beat,
    settled_at: Instant,
    last_heard: BTreeMap<String, Instant>,
}

impl Liveness {
    pub fn new(own: &str, beat: Beat, started: Instant) -> Self {
        Liveness {
            own: own.to_string(),
            beat,
            settled_at: started + beat.start_grace(),
            last_heard: BTreeMap::new(),
        }
    }

    /// Records a beat from `node` at `at`. Returns whether this makes the node
    /// live when it was not (first heard, or heard again after it died): the
    /// live set changed. A beat older than the last one heard changes nothing;
    /// this node's own name is ignored (it is always live).
    pub fn heard(&mut self, node: &str, at: Instant) -> bool {
        if node == self.own {
            return false;
        }
        let dead_after = self.beat.dead_after();
        match self.last_heard.get_mut(node) {
            Some(last) if *last >= at => false,
            Some(last) => {
                let revived = at >= *last + dead_after;
                *last = at;
                revived
            }
            None => {
                self.last_heard.insert(node.to_string(), at);
                true
            }
        }
    }

    /// Forgets the nodes not in `nodes` (deleted from the cluster).
    pub fn forget_except(&mut self, nodes: &BTreeSet<String>) {
        self.last_heard.retain(|node, _| nodes.contains(node));
    }

    /// The nodes live at `now`: this one, and every node heard less than
    /// `dead_after` ago.
    pub fn live(&self, now: Instant) -> LiveSet {
        let mut live: BTreeSet<String> = self
            .last_heard
            .iter()
            .filter(|(_, last)| self.expires(**last) > now)
            .map(|(node, _)| node.clone())
            .collect();
        live.insert(self.own.clone());
        LiveSet {
            live,
            settled: now >= self.settled_at,
        }
    }

    /// The next instant after `now` at which `live` changes unless a beat comes:
    /// the earliest expiry of a live node, or the end of the start grace. None
    /// when nothing will change by itself.
    pub fn next_change(&self, now: Instant) -> Option<Instant> {
        let grace_end = Some(self.settled_at).filter(|end| *end > now);
        self.last_heard
            .values()
            .map(|last| self.expires(*last))
            .filter(|expiry| *expiry > now)
            .chain(grace_end)
            .min()
    }

    /// When each other node was last heard (nodes never heard are absent).
    pub fn last_heard(&self) -> &BTreeMap<String, Instant> {
        &self.last_heard
    }

    fn expires(&self, last: Instant) -> Instant {
        last + self.beat.dead_after()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn nodes(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn fresh() -> (Liveness, Instant) {
        let t0 = Instant::now();
        (Liveness::new("a", Beat::default(), t0), t0)
    }

    #[test]
    fn the_default_beat_is_half_a_second_and_three_missed() {
        let beat = Beat::default();
        assert_eq!(beat.dead_after(), 1500 * MS);
        assert_eq!(beat.start_grace(), 2000 * MS);
    }

    #[test]
    fn this_node_alone_is_live_at_start_and_not_settled() {
        let (l, t0) = fresh();
        let set = l.live(t0);
        assert_eq!(set.live, nodes(&["a"]));
        assert!(!set.settled);
    }

    #[test]
    fn the_start_grace_ends_exactly_at_every_times_missed_plus_one() {
        let (l, t0) = fresh();
        assert!(!l.live(t0 + 1999 * MS).settled);
        assert!(l.live(t0 + 2000 * MS).settled);
        assert!(l.live(t0 + 3600 * 1000 * MS).settled);
    }

    #[test]
    fn this_node_is_always_live_even_when_never_heard_and_long_settled() {
        let (mut l, t0) = fresh();
        assert!(!l.heard("a", t0), "hearing oneself changes nothing");
        assert!(l.last_heard().is_empty());
        let set = l.live(t0 + 3600 * 1000 * MS);
        assert_eq!(set.live, nodes(&["a"]));
        l.forget_except(&BTreeSet::new());
        assert_eq!(l.live(t0).live, nodes(&["a"]));
    }

    #[test]
    fn a_heard_node_is_live_until_three_missed_beats_and_dead_at_the_boundary() {
        let (mut l, t0) = fresh();
        let at = t0 + 100 * MS;
        assert!(l.heard("b", at), "first heard: the set changes");
        assert_eq!(l.live(at).live, nodes(&["a", "b"]));
        assert_eq!(l.live(at + 1499 * MS).live, nodes(&["a", "b"]));
        // The boundary itself is dead: 1.5 s of silence is 3 missed beats.
        assert_eq!(l.live(at + 1500 * MS).live, nodes(&["a"]));
        assert_eq!(l.live(at + 5000 * MS).live, nodes(&["a"]));
    }

    #[test]
    fn each_beat_pushes_the_expiry_and_does_not_change_the_set() {
        let (mut l, t0) = fresh();
        assert!(l.heard("b", t0));
        assert!(!l.heard("b", t0 + 500 * MS));
        assert!(!l.heard("b", t0 + 1000 * MS));
        assert_eq!(l.live(t0 + 2400 * MS).live, nodes(&["a", "b"]));
        assert_eq!(l.live(t0 + 2500 * MS).live, nodes(&["a"]));
    }

    #[test]
    fn a_beat_just_before_the_boundary_keeps_it_live_one_at_the_boundary_revives_it() {
        let (mut l, t0) = fresh();
        assert!(l.heard("b", t0));
        assert!(!l.heard("b", t0 + 1499 * MS), "still live: no change");
        let (mut l, t0) = fresh();
        assert!(l.heard("b", t0));
        assert!(
            l.heard("b", t0 + 1500 * MS),
            "dead at the boundary: revived"
        );
    }

    #[test]
    fn a_dead_node_heard_again_is_revived() {
        let (mut l, t0) = fresh();
        l.heard("b", t0);
        assert_eq!(l.live(t0 + 4000 * MS).live, nodes(&["a"]));
        assert!(l.heard("b", t0 + 4000 * MS));
        assert_eq!(l.live(t0 + 4000 * MS).live, nodes(&["a", "b"]));
        assert_eq!(l.live(t0 + 5499 * MS).live, nodes(&["a", "b"]));
        assert_eq!(l.live(t0 + 5500 * MS).live, nodes(&["a"]));
    }

    #[test]
    fn a_beat_older_than_the_last_one_changes_nothing() {
        let (mut l, t0) = fresh();
        l.heard("b", t0 + 1000 * MS);
        assert!(!l.heard("b", t0));
        assert!(!l.heard("b", t0 + 1000 * MS));
        assert_eq!(l.last_heard()["b"], t0 + 1000 * MS);
        assert_eq!(l.live(t0 + 2499 * MS).live, nodes(&["a", "b"]));
    }

    #[test]
    fn forget_except_drops_deleted_nodes_and_keeps_the_others() {
        let (mut l, t0) = fresh();
        l.heard("b", t0);
        l.heard("c", t0);
        l.heard("d", t0);
        l.forget_except(&nodes(&["a", "c", "e"]));
        assert_eq!(l.live(t0).live, nodes(&["a", "c"]));
        assert_eq!(
            l.last_heard().keys().cloned().collect::<BTreeSet<_>>(),
            nodes(&["c"])
        );
        assert!(
            l.heard("b", t0 + 100 * MS),
            "a forgotten node heard again is new"
        );
    }

    #[test]
    fn last_heard_says_when_each_node_was_last_heard() {
        let (mut l, t0) = fresh();
        l.heard("b", t0 + 100 * MS);
        l.heard("c", t0 + 200 * MS);
        l.heard("b", t0 + 300 * MS);
        let heard: Vec<(&str, Instant)> = l
            .last_heard()
            .iter()
            .map(|(n, t)| (n.as_str(), *t))
            .collect();
        assert_eq!(heard, vec![("b", t0 + 300 * MS), ("c", t0 + 200 * MS)]);
    }

    #[test]
    fn next_change_is_the_grace_end_when_nobody_was_heard() {
        let (l, t0) = fresh();
        assert_eq!(l.next_change(t0), Some(t0 + 2000 * MS));
        assert_eq!(l.next_change(t0 + 1999 * MS), Some(t0 + 2000 * MS));
        assert_eq!(l.next_change(t0 + 2000 * MS), None, "settled, nobody heard");
    }

    #[test]
    fn next_change_is_the_earliest_expiry_or_the_grace_end() {
        let (mut l, t0) = fresh();
        l.heard("b", t0);
        l.heard("c", t0 + 300 * MS);
        assert_eq!(
            l.next_change(t0 + 300 * MS),
            Some(t0 + 1500 * MS),
            "b first"
        );
        l.heard("b", t0 + 1000 * MS);
        assert_eq!(l.next_change(t0 + 1000 * MS), Some(t0 + 1800 * MS), "c now");
        // Both expire after the grace ends at 2 s: the grace end comes first.
        l.heard("c", t0 + 1000 * MS);
        assert_eq!(l.next_change(t0 + 1000 * MS), Some(t0 + 2000 * MS));
        assert_eq!(l.next_change(t0 + 2000 * MS), Some(t0 + 2500 * MS));
    }

    #[test]
    fn next_change_skips_the_dead_and_is_none_when_all_are_dead_and_settled() {
        let (mut l, t0) = fresh();
        l.heard("b", t0 + 1000 * MS);
        l.heard("c", t0 + 2000 * MS);
        // At the boundary b is dead: only c's expiry remains.
        assert_eq!(l.next_change(t0 + 2500 * MS), Some(t0 + 3500 * MS));
        assert_eq!(l.next_change(t0 + 3499 * MS), Some(t0 + 3500 * MS));
        assert_eq!(l.next_change(t0 + 3500 * MS), None);
        assert_eq!(l.live(t0 + 3500 * MS).live, nodes(&["a"]));
    }

    #[test]
    fn next_change_matches_live_at_every_millisecond() {
        // The set never changes strictly between two of next_change's instants.
        let (mut l, t0) = fresh();
        l.heard("b", t0 + 100 * MS);
        l.heard("c", t0 + 700 * MS);
        l.heard("d", t0 + 2300 * MS);
        let mut now = t0;
        let mut set = l.live(now);
        let mut changes = 0;
        while let Some(next) = l.next_change(now) {
            assert!(next > now);
            while now + MS < next {
                now += MS;
                assert_eq!(l.live(now), set, "changed before next_change said");
            }
            now = next;
            let changed = l.live(now);
            assert_ne!(
                changed,
                set,
                "next_change at {:?} changed nothing",
                next - t0
            );
            set = changed;
            changes += 1;
        }
        // b, c, the grace end, d; then a alone and settled for good.
        assert_eq!(changes, 4);
        assert_eq!(set, l.live(now + 3600 * 1000 * MS));
        assert_eq!(set.live, nodes(&["a"]));
    }
}
