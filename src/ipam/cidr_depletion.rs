//! The agent's verdict on each of its cluster-pool CIDRs, written into
//! `status.ipam.pod-cidrs` (the field of Cilium's retired dynamic cluster-pool):
//! `depleted` asks the operator for another CIDR of the family, `released` gives
//! an empty extra CIDR back. Pure rules, no I/O; the daemon's state asks for a
//! verdict whenever it hands the node sink its outbox.
//!
//! The rules, per family, over the node's CIDRs in `spec.ipam.podCIDRs` order
//! (the first of a family is the one the node started with):
//! - free and usable addresses are summed over the CIDRs not released;
//! - when the free addresses are under `cluster-pool-depletion-threshold` percent
//!   of the usable ones, every CIDR not released is `depleted`;
//! - otherwise a CIDR is `in-use`, except an extra CIDR (never the first) that
//!   has held no address (cooling ones count as held) for
//!   `cluster-pool-cidr-release-delay`, and without which the node keeps at least
//!   twice the threshold free (so a release does not make the node ask again):
//!   that one is `released`, latest first, and nothing is handed out of it again;
//! - a released CIDR stays released until `spec.ipam.podCIDRs` no longer lists it
//!   (the operator took it off the node; listed again later, it is a new CIDR).
//!
//! Without podnet's operator (Cilium's) the verdicts are only status: no CIDR is
//! added, and a released one stays listed, unused.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ipnet::IpNet;

use super::Family;
use crate::resources::{PodCidrState, PodCidrStatus};

/// The agent option holding the threshold, in percent of the usable addresses.
pub const OPT_DEPLETION_THRESHOLD: &str = "cluster-pool-depletion-threshold";
/// Default of [`OPT_DEPLETION_THRESHOLD`].
pub const DEFAULT_DEPLETION_THRESHOLD: u8 = 10;
/// The agent option holding how long an extra CIDR stays empty before it goes back.
pub const OPT_RELEASE_DELAY: &str = "cluster-pool-cidr-release-delay";
/// Default of [`OPT_RELEASE_DELAY`].
pub const DEFAULT_RELEASE_DELAY: &str = "10m";

/// A threshold outside 1..=100.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{OPT_DEPLETION_THRESHOLD} {0}: must be a percentage of the node's usable addresses from 1 \
     to 100 (the node asks for another CIDR when fewer are free; default {DEFAULT_DEPLETION_THRESHOLD})"
)]
pub struct ThresholdError(pub u32);

/// When a node asks for another CIDR and when it gives one back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DepletionRules {
    threshold: u8,
    release_delay_ms: u64,
}

impl DepletionRules {
    /// `threshold` in percent (1 to 100), and the release delay.
    pub fn new(threshold: u32, release_delay: Duration) -> Result<DepletionRules, ThresholdError> {
        match u8::try_from(threshold) {
            Ok(t @ 1..=100) => Ok(DepletionRules {
                threshold: t,
                release_delay_ms: u64::try_from(release_delay.as_millis()).unwrap_or(u64::MAX),
            }),
            _ => Err(ThresholdError(threshold)),
        }
    }

    pub fn threshold(&self) -> u8 {
        self.threshold
    }

    pub fn release_delay_ms(&self) -> u64 {
        self.release_delay_ms
    }

    /// Whether `free` of `usable` is under `percent`.
    fn under(free: u64, usable: u64, percent: u64) -> bool {
        u128::from(free) * 100 < u128::from(percent) * u128::from(usable)
    }
}

/// One CIDR as the node's allocator sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CidrUse {
    pub cidr: IpNet,
    /// Addresses held (cooling ones included).
    pub used: u64,
    pub usable: u64,
}

/// What the agent remembers between verdicts: since when each extra CIDR is
/// empty, and which CIDRs it released.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CidrTracker {
    empty_since: BTreeMap<IpNet, u64>,
    released: BTreeSet<IpNet>,
}

/// The CIDRs of `family` in `spec`, in order, without repeats.
fn of_family(spec: &[IpNet], family: Family) -> Vec<IpNet> {
    let mut out: Vec<IpNet> = Vec::new();
    for c in spec.iter().map(IpNet::trunc) {
        if Family::of_net(&c) == family && !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// Whether `cidr` is the first of its family in `spec`.
pub fn is_first(spec: &[IpNet], cidr: &IpNet) -> bool {
    of_family(spec, Family::of_net(cidr)).first() == Some(&cidr.trunc())
}

impl CidrTracker {
    /// What a (re)started agent takes from its node: the CIDRs the status says it
    /// released, where the spec still lists them (never the first of a family).
    pub fn from_status(spec: &[IpNet], status: &BTreeMap<String, PodCidrStatus>) -> CidrTracker {
        let released = status
            .iter()
            .filter(|(_, s)| s.status == PodCidrState::Released)
            .filter_map(|(c, _)| c.parse::<IpNet>().ok())
            .map(|c| c.trunc())
            .filter(|c| spec.iter().any(|s| s.trunc() == *c) && !is_first(spec, c))
            .collect();
        CidrTracker {
            empty_since: BTreeMap::new(),
            released,
        }
    }

    /// The CIDRs released and still listed: nothing is handed out of them.
    pub fn released(&self) -> &BTreeSet<IpNet> {
        &self.released
    }

    /// How long (ms) an extra CIDR has been empty at `now`, if it is.
    pub fn empty_for(&self, cidr: &IpNet, now: u64) -> Option<u64> {
        self.empty_since
            .get(cidr)
            .map(|since| now.saturating_sub(*since))
    }

    /// The verdict on every CIDR of `spec` at `now` (ms). `uses` gives each CIDR's
    /// held and usable addresses (a CIDR it lacks counts as empty with no room).
    pub fn judge(
        &mut self,
        rules: &DepletionRules,
        spec: &[IpNet],
        uses: &[CidrUse],
        now: u64,
    ) -> BTreeMap<IpNet, PodCidrState> {
        let listed: BTreeSet<IpNet> = spec.iter().map(IpNet::trunc).collect();
        self.released.retain(|c| listed.contains(c));
        self.empty_since.retain(|c, _| listed.contains(c));
        let mut out = BTreeMap::new();
        for family in [Family::V4, Family::V6] {
            self.judge_family(rules, &of_family(spec, family), uses, now, &mut out);
        }
        out
    }

    fn judge_family(
        &mut self,
        rules: &DepletionRules,
        cidrs: &[IpNet],
        uses: &[CidrUse],
        now: u64,
        out: &mut BTreeMap<IpNet, PodCidrState>,
    ) {
        let Some(first) = cidrs.first().copied() else {
            return;
        };
        let use_of = |c: &IpNet| {
            uses.iter()
                .find(|u| u.cidr.trunc() == *c)
                .map_or((0, 0), |u| (u.used.min(u.usable), u.usable))
        };
        let active: Vec<IpNet> = cidrs
            .iter()
            .copied()
            .filter(|c| !self.released.contains(c))
            .collect();
        for c in cidrs.iter().filter(|c| self.released.contains(*c)) {
            out.insert(*c, PodCidrState::Released);
        }
        let (mut free, mut usable) = active.iter().fold((0u64, 0u64), |(f, u), c| {
            let (used, usable) = use_of(c);
            (f + (usable - used), u + usable)
        });
        let threshold = u64::from(rules.threshold);
        if DepletionRules::under(free, usable, threshold) {
            for c in active {
                self.empty_since.remove(&c);
                out.insert(c, PodCidrState::Depleted);
            }
            return;
        }
        let keep = (2 * threshold).min(100);
        for c in active.into_iter().rev() {
            let (used, size) = use_of(&c);
            if c == first || used > 0 {
                self.empty_since.remove(&c);
                out.insert(c, PodCidrState::InUse);
                continue;
            }
            let since = *self.empty_since.entry(c).or_insert(now);
            let waited = now.saturating_sub(since) >= rules.release_delay_ms;
            let (free_after, usable_after) = (free - size, usable - size);
            if waited && !DepletionRules::under(free_after, usable_after, keep) {
                self.empty_since.remove(&c);
                self.released.insert(c);
                (free, usable) = (free_after, usable_after);
                out.insert(c, PodCidrState::Released);
            } else {
                out.insert(c, PodCidrState::InUse);
            }
        }
    }
}

/// A verdict as `status.ipam.pod-cidrs` spells it.
pub fn status_map(verdict: &BTreeMap<IpNet, PodCidrState>) -> BTreeMap<String, PodCidrStatus> {
    verdict
        .iter()
        .map(|(c, s)| (c.to_string(), PodCidrStatus { status: *s }))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use PodCidrState::{Depleted, InUse, Released};

    const MIN: u64 = 60_000;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn rules(threshold: u32, delay_min: u64) -> DepletionRules {
        DepletionRules::new(threshold, Duration::from_secs(delay_min * 60)).unwrap()
    }

    /// A /24 (or /120) has 254 usable addresses; a /28 14.
    fn used(cidr: &str, used: u64) -> CidrUse {
        let cidr = net(cidr);
        let usable = (1u64 << (cidr.max_prefix_len() - cidr.prefix_len())) - 2;
        CidrUse { cidr, used, usable }
    }

    fn verdict(pairs: &[(&str, PodCidrState)]) -> BTreeMap<IpNet, PodCidrState> {
        pairs.iter().map(|(c, s)| (net(c), *s)).collect()
    }

    #[test]
    fn a_threshold_of_0_or_over_100_is_refused_naming_the_option() {
        for bad in [0, 101, 1000, 300] {
            let e = DepletionRules::new(bad, Duration::ZERO).unwrap_err();
            assert_eq!(e, ThresholdError(bad));
            assert!(
                e.to_string()
                    .starts_with(&format!("cluster-pool-depletion-threshold {bad}: must be")),
                "{e}"
            );
        }
        assert_eq!(rules(1, 0).threshold(), 1);
        assert_eq!(rules(100, 0).threshold(), 100);
    }

    #[test]
    fn a_node_with_room_says_in_use() {
        let mut t = CidrTracker::default();
        let spec = [net("10.0.1.0/24")];
        let v = t.judge(&rules(10, 10), &spec, &[used("10.0.1.0/24", 200)], 0);
        assert_eq!(v, verdict(&[("10.0.1.0/24", InUse)]));
    }

    #[test]
    fn free_addresses_under_the_threshold_deplete_every_cidr_of_the_family() {
        let mut t = CidrTracker::default();
        let spec = [net("10.0.1.0/24"), net("fd00::/120")];
        // 10% of 254 is 25.4: 229 used leaves 25 free, under it; 228 leaves 26.
        let v = t.judge(
            &rules(10, 10),
            &spec,
            &[used("10.0.1.0/24", 228), used("fd00::/120", 1)],
            0,
        );
        assert_eq!(v[&net("10.0.1.0/24")], InUse);
        let uses = [used("10.0.1.0/24", 229), used("fd00::/120", 1)];
        let v = t.judge(&rules(10, 10), &spec, &uses, 0);
        assert_eq!(v[&net("10.0.1.0/24")], Depleted);
        assert_eq!(v[&net("fd00::/120")], InUse, "the other family has room");
        // Two CIDRs: the free addresses are summed over both.
        let spec = [net("10.0.1.0/24"), net("10.0.9.0/24")];
        let uses = [used("10.0.1.0/24", 254), used("10.0.9.0/24", 210)];
        assert_eq!(
            t.judge(&rules(10, 10), &spec, &uses, 0),
            verdict(&[("10.0.1.0/24", Depleted), ("10.0.9.0/24", Depleted)])
        );
        let uses = [used("10.0.1.0/24", 254), used("10.0.9.0/24", 200)];
        assert_eq!(
            t.judge(&rules(10, 10), &spec, &uses, 0),
            verdict(&[("10.0.1.0/24", InUse), ("10.0.9.0/24", InUse)])
        );
    }

    #[test]
    fn a_threshold_of_100_asks_as_soon_as_anything_is_held() {
        let mut t = CidrTracker::default();
        let spec = [net("10.0.1.0/28")];
        assert_eq!(
            t.judge(&rules(100, 0), &spec, &[used("10.0.1.0/28", 0)], 0),
            verdict(&[("10.0.1.0/28", InUse)])
        );
        assert_eq!(
            t.judge(&rules(100, 0), &spec, &[used("10.0.1.0/28", 1)], 0),
            verdict(&[("10.0.1.0/28", Depleted)])
        );
    }

    #[test]
    fn an_empty_extra_cidr_goes_back_after_the_delay_and_is_never_served_again() {
        let mut t = CidrTracker::default();
        let r = rules(10, 10);
        let spec = [net("10.0.1.0/24"), net("10.0.9.0/24")];
        let uses = [used("10.0.1.0/24", 20), used("10.0.9.0/24", 0)];
        assert_eq!(t.judge(&r, &spec, &uses, 0)[&net("10.0.9.0/24")], InUse);
        assert_eq!(t.empty_for(&net("10.0.9.0/24"), 3 * MIN), Some(3 * MIN));
        assert_eq!(
            t.judge(&r, &spec, &uses, 10 * MIN - 1)[&net("10.0.9.0/24")],
            InUse
        );
        assert_eq!(
            t.judge(&r, &spec, &uses, 10 * MIN)[&net("10.0.9.0/24")],
            Released
        );
        assert_eq!(t.released(), &BTreeSet::from([net("10.0.9.0/24")]));
        // Still listed: still released (whatever the allocator says of it).
        let busy = [used("10.0.1.0/24", 20), used("10.0.9.0/24", 0)];
        assert_eq!(
            t.judge(&r, &spec, &busy, 11 * MIN)[&net("10.0.9.0/24")],
            Released
        );
        // The operator took it off: forgotten; listed again later, it is new.
        t.judge(&r, &spec[..1], &uses[..1], 12 * MIN);
        assert!(t.released().is_empty());
        assert_eq!(
            t.judge(&r, &spec, &uses, 13 * MIN)[&net("10.0.9.0/24")],
            InUse
        );
    }

    #[test]
    fn a_pod_in_the_extra_cidr_restarts_its_delay() {
        let mut t = CidrTracker::default();
        let r = rules(10, 10);
        let spec = [net("10.0.1.0/24"), net("10.0.9.0/24")];
        let empty = [used("10.0.1.0/24", 20), used("10.0.9.0/24", 0)];
        let one = [used("10.0.1.0/24", 20), used("10.0.9.0/24", 1)];
        t.judge(&r, &spec, &empty, 0);
        t.judge(&r, &spec, &one, 9 * MIN);
        assert_eq!(t.empty_for(&net("10.0.9.0/24"), 9 * MIN), None);
        t.judge(&r, &spec, &empty, 10 * MIN);
        assert_eq!(
            t.judge(&r, &spec, &empty, 19 * MIN)[&net("10.0.9.0/24")],
            InUse
        );
        assert_eq!(
            t.judge(&r, &spec, &empty, 20 * MIN)[&net("10.0.9.0/24")],
            Released
        );
    }

    #[test]
    fn the_first_cidr_never_goes_back() {
        let mut t = CidrTracker::default();
        let r = rules(10, 0);
        // Empty first, busy extra: the extra stays, and so does the first.
        let spec = [net("10.0.1.0/24"), net("10.0.9.0/24")];
        let uses = [used("10.0.1.0/24", 0), used("10.0.9.0/24", 30)];
        for now in [0, 60 * MIN, 600 * MIN] {
            assert_eq!(
                t.judge(&r, &spec, &uses, now),
                verdict(&[("10.0.1.0/24", InUse), ("10.0.9.0/24", InUse)])
            );
        }
        // A status that says the first is released is not believed at start.
        let status = status_map(&verdict(&[
            ("10.0.1.0/24", Released),
            ("10.0.9.0/24", Released),
        ]));
        let t = CidrTracker::from_status(&spec, &status);
        assert_eq!(t.released(), &BTreeSet::from([net("10.0.9.0/24")]));
        assert!(is_first(&spec, &net("10.0.1.0/24")));
        assert!(!is_first(&spec, &net("10.0.9.0/24")));
    }

    #[test]
    fn a_release_that_would_make_the_node_ask_again_waits() {
        let mut t = CidrTracker::default();
        let r = rules(10, 0);
        let spec = [net("10.0.1.0/24"), net("10.0.9.0/24")];
        // Without the extra: 54 of 254 free (21%), at least twice the threshold.
        let uses = [used("10.0.1.0/24", 200), used("10.0.9.0/24", 0)];
        assert_eq!(t.judge(&r, &spec, &uses, 0)[&net("10.0.9.0/24")], Released);
        // Without the extra: 44 of 254 free (17%): kept.
        let mut t = CidrTracker::default();
        let uses = [used("10.0.1.0/24", 210), used("10.0.9.0/24", 0)];
        assert_eq!(t.judge(&r, &spec, &uses, 0)[&net("10.0.9.0/24")], InUse);
    }

    #[test]
    fn the_latest_extra_goes_back_first() {
        let mut t = CidrTracker::default();
        let r = rules(25, 0);
        let spec = [net("10.0.1.0/24"), net("10.0.2.0/24"), net("10.0.3.0/24")];
        // Two empty extras; only one can go while 50% stays free.
        let uses = [
            used("10.0.1.0/24", 254),
            used("10.0.2.0/24", 0),
            used("10.0.3.0/24", 0),
        ];
        assert_eq!(
            t.judge(&r, &spec, &uses, 0),
            verdict(&[
                ("10.0.1.0/24", InUse),
                ("10.0.2.0/24", InUse),
                ("10.0.3.0/24", Released)
            ])
        );
    }

    #[test]
    fn released_cidrs_do_not_count_and_the_rest_may_still_deplete() {
        let mut t = CidrTracker::default();
        let r = rules(10, 0);
        let spec = [net("10.0.1.0/24"), net("10.0.9.0/24")];
        t.judge(&r, &spec, &[used("10.0.1.0/24", 10)], 0);
        assert_eq!(t.released().len(), 1, "no use known: empty");
        let v = t.judge(&r, &spec, &[used("10.0.1.0/24", 250)], MIN);
        assert_eq!(
            v,
            verdict(&[("10.0.1.0/24", Depleted), ("10.0.9.0/24", Released)])
        );
    }

    #[test]
    fn no_cidr_no_verdict_and_the_status_spells_the_crd_words() {
        let mut t = CidrTracker::default();
        assert!(t.judge(&rules(10, 0), &[], &[], 0).is_empty());
        let v = verdict(&[("10.0.1.0/24", Depleted), ("fd00::/120", InUse)]);
        let json = serde_json::to_value(status_map(&v)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "10.0.1.0/24": {"status": "depleted"},
                "fd00::/120": {"status": "in-use"}
            })
        );
    }
}
