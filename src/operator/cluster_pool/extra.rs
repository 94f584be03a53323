//! The operator's rule for extra node CIDRs (no I/O): what it does with the
//! verdicts an agent writes into `status.ipam.pod-cidrs`
//! ([`cidr_depletion`](crate::ipam::cidr_depletion) states them). Per family of
//! the node's `spec.ipam.podCIDRs` (the first CIDR of a family is the node's
//! own for life):
//! - an extra CIDR the agent says is `released` is taken off the node and goes
//!   back to the pool; the first one never is, whatever the status says;
//! - when every CIDR of the family that is not released is `depleted` (a CIDR
//!   the status does not list yet, such as one just added, is not), the node gets
//!   one more, unless it holds `cluster-pool-extra-cidrs-max` extra CIDRs of the
//!   family already (then it is [`ExtraPlan::at_cap`]);
//! - the operator plans only from a node whose spec shows what it holds (its
//!   own last write has landed), so one depletion gets one CIDR.

use std::collections::BTreeMap;

use ipnet::IpNet;

use crate::ipam::Family;
pub use crate::ipam::clusterpool::{DEFAULT_EXTRA_CIDRS_MAX, OPT_EXTRA_CIDRS_MAX};
use crate::resources::PodCidrState;

/// What a node's status calls for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtraPlan {
    /// Extra CIDRs to take off the node.
    pub release: Vec<IpNet>,
    /// Families to give one more CIDR.
    pub grow: Vec<Family>,
    /// Families depleted with the most extra CIDRs allowed already.
    pub at_cap: Vec<Family>,
}

/// The plan for a node holding `held` (spec order) with the agent's `status`,
/// allowed `max` extra CIDRs per family.
pub fn plan(held: &[IpNet], status: &BTreeMap<IpNet, PodCidrState>, max: u32) -> ExtraPlan {
    let mut out = ExtraPlan::default();
    for family in [Family::V4, Family::V6] {
        let mine: Vec<IpNet> = held
            .iter()
            .copied()
            .filter(|c| Family::of_net(c) == family)
            .collect();
        let Some((first, extras)) = mine.split_first() else {
            continue;
        };
        let state = |c: &IpNet| status.get(c).copied();
        let (released, kept): (Vec<IpNet>, Vec<IpNet>) = extras
            .iter()
            .partition(|c| state(c) == Some(PodCidrState::Released));
        out.release.extend(released);
        let depleted = std::iter::once(first)
            .chain(&kept)
            .all(|c| state(c) == Some(PodCidrState::Depleted));
        if !depleted {
            continue;
        }
        if (kept.len() as u64) < u64::from(max) {
            out.grow.push(family);
        } else {
            out.at_cap.push(family);
        }
    }
    out
}

/// The agent's verdicts a node's `status.ipam.pod-cidrs` holds (keys that are
/// not CIDRs are left out).
pub fn parse_status(
    status: &BTreeMap<String, crate::resources::PodCidrStatus>,
) -> BTreeMap<IpNet, PodCidrState> {
    status
        .iter()
        .filter_map(|(c, s)| Some((c.parse::<IpNet>().ok()?.trunc(), s.status)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use PodCidrState::{Depleted, InUse, Released};

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn held(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|c| net(c)).collect()
    }

    fn status(pairs: &[(&str, PodCidrState)]) -> BTreeMap<IpNet, PodCidrState> {
        pairs.iter().map(|(c, s)| (net(c), *s)).collect()
    }

    #[test]
    fn a_depleted_family_gets_one_more() {
        let h = held(&["10.0.1.0/24", "fd00::/120"]);
        let s = status(&[("10.0.1.0/24", Depleted), ("fd00::/120", InUse)]);
        assert_eq!(
            plan(&h, &s, 2),
            ExtraPlan {
                grow: vec![Family::V4],
                ..Default::default()
            }
        );
    }

    #[test]
    fn nothing_while_any_cidr_of_the_family_has_room_or_is_not_judged_yet() {
        let h = held(&["10.0.1.0/24", "10.0.9.0/24"]);
        let s = status(&[("10.0.1.0/24", Depleted), ("10.0.9.0/24", InUse)]);
        assert_eq!(plan(&h, &s, 2), ExtraPlan::default());
        // Just added: the agent has not judged 10.0.9.0/24 yet.
        let s = status(&[("10.0.1.0/24", Depleted)]);
        assert_eq!(plan(&h, &s, 2), ExtraPlan::default());
        // No status at all (Cilium's agent, or an agent not judging yet).
        assert_eq!(plan(&h, &BTreeMap::new(), 2), ExtraPlan::default());
    }

    #[test]
    fn the_cap_counts_extra_cidrs_per_family_and_0_turns_it_off() {
        let h = held(&["10.0.1.0/24", "10.0.9.0/24", "10.0.10.0/24"]);
        let s = status(&[
            ("10.0.1.0/24", Depleted),
            ("10.0.9.0/24", Depleted),
            ("10.0.10.0/24", Depleted),
        ]);
        assert_eq!(plan(&h, &s, 3).grow, vec![Family::V4]);
        assert_eq!(plan(&h, &s, 2).at_cap, vec![Family::V4]);
        assert!(plan(&h, &s, 2).grow.is_empty());
        let first = held(&["10.0.1.0/24"]);
        assert_eq!(plan(&first, &s, 0).at_cap, vec![Family::V4]);
    }

    #[test]
    fn a_released_extra_goes_back_and_does_not_count() {
        let h = held(&["10.0.1.0/24", "10.0.9.0/24"]);
        let s = status(&[("10.0.1.0/24", InUse), ("10.0.9.0/24", Released)]);
        assert_eq!(
            plan(&h, &s, 2),
            ExtraPlan {
                release: vec![net("10.0.9.0/24")],
                ..Default::default()
            }
        );
        // Released, and the rest depleted: it goes, and another comes.
        let s = status(&[("10.0.1.0/24", Depleted), ("10.0.9.0/24", Released)]);
        let p = plan(&h, &s, 1);
        assert_eq!(p.release, vec![net("10.0.9.0/24")]);
        assert_eq!(p.grow, vec![Family::V4]);
    }

    #[test]
    fn the_first_cidr_never_goes_back() {
        let h = held(&["10.0.1.0/24", "10.0.9.0/24", "fd00::/120"]);
        let s = status(&[
            ("10.0.1.0/24", Released),
            ("10.0.9.0/24", InUse),
            ("fd00::/120", Released),
        ]);
        assert_eq!(plan(&h, &s, 2), ExtraPlan::default());
    }

    #[test]
    fn the_status_is_read_as_cidrs() {
        let mut raw = BTreeMap::new();
        raw.insert(
            "10.0.1.0/24".to_string(),
            crate::resources::PodCidrStatus { status: Depleted },
        );
        raw.insert(
            "not-a-cidr".to_string(),
            crate::resources::PodCidrStatus { status: InUse },
        );
        assert_eq!(parse_status(&raw), status(&[("10.0.1.0/24", Depleted)]));
    }
}
