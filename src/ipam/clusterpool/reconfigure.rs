//! A live change of the cluster pool (no I/O): the pool CIDR options read again
//! while the operator runs. Per family, a pool CIDR is its CIDR and its node
//! mask size:
//! - one the new lists keep stays as it is, with every range it handed out (one
//!   that was draining is taken back into use);
//! - one the new lists add starts empty; it may not overlap a pool CIDR that
//!   drains, nor a node CIDR held outside the pool (so a CIDR whose mask size
//!   changes, a removal and an addition, is refused while nodes hold ranges of
//!   the old one);
//! - one the new lists leave out is forgotten when no node holds a range of it,
//!   and otherwise drains: no new range comes from it, the nodes keep theirs,
//!   and it is forgotten once the last is released
//!   ([`NodeCidrCarver::finish_drains`]).
//!
//! The new lists pass the start-up checks first. A family turned on or off is
//! refused (that takes a restart). A refused change changes nothing.

use ipnet::IpNet;

use super::{
    ClusterPoolConfig, ClusterPoolError, NodeCidrCarver, PoolEntry, cidr_option, node_set, overlap,
};
use crate::ipam::Family;
use crate::ipam::cidrset::CidrSet;

/// What a [`NodeCidrCarver::reconfigure`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolChange {
    /// New pool CIDRs, as their entries read.
    pub added: Vec<PoolEntry>,
    /// Draining pool CIDRs named again: in use again.
    pub resumed: Vec<IpNet>,
    /// Pool CIDRs left out while nodes hold ranges of them.
    pub draining: Vec<IpNet>,
    /// Pool CIDRs left out that no node held a range of: forgotten.
    pub removed: Vec<IpNet>,
}

impl PoolChange {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        *self == PoolChange::default()
    }
}

/// Why a new cluster pool was refused (the previous one stays in force).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReconfigureError {
    /// The new lists fail the start-up checks.
    #[error(transparent)]
    Invalid(#[from] ClusterPoolError),
    /// `enable-ipv4` or `enable-ipv6` changed.
    #[error(
        "{} is now {}: turning a family on or off takes an operator restart",
        family_option(*family),
        if *enabled { "on" } else { "off" }
    )]
    FamilyChanged { family: Family, enabled: bool },
    /// A new entry overlaps a pool CIDR nodes still hold ranges of.
    #[error(
        "{option} entry {entry} overlaps {pool} (/{mask} node ranges), which is draining: \
         nodes still hold ranges of it; add the entry once they are gone, or add a CIDR \
         that does not overlap"
    )]
    OverlapsDraining {
        option: &'static str,
        entry: PoolEntry,
        pool: IpNet,
        mask: u8,
    },
    /// A new entry overlaps a node CIDR held outside the pool.
    #[error(
        "{option} entry {entry} overlaps node CIDR {held}, which a node holds outside the \
         pool (its pool CIDR was removed before the operator's restart); add the entry once \
         that node is gone, or add a CIDR that does not overlap"
    )]
    OverlapsHeld {
        option: &'static str,
        entry: PoolEntry,
        held: IpNet,
    },
}

fn family_option(family: Family) -> &'static str {
    match family {
        Family::V4 => "enable-ipv4",
        Family::V6 => "enable-ipv6",
    }
}

impl ClusterPoolConfig {
    /// The entries of a family's option as they read (the CIDR, and its own
    /// mask size if it has one).
    fn entries(&self, family: Family) -> Vec<PoolEntry> {
        self.cidrs(family)
            .iter()
            .map(|c| PoolEntry {
                cidr: *c,
                mask: self.node_masks.get(c).copied(),
            })
            .collect()
    }
}

impl NodeCidrCarver {
    /// Takes `config` as the cluster pool from now on, keeping every range
    /// handed out (the module's rule); on error nothing changed.
    pub fn reconfigure(
        &mut self,
        config: &ClusterPoolConfig,
    ) -> Result<PoolChange, ReconfigureError> {
        config.validate()?;
        for family in [Family::V4, Family::V6] {
            let enabled = config.enabled(family);
            if enabled == self.sets(family).is_empty() {
                return Err(ReconfigureError::FamilyChanged { family, enabled });
            }
        }
        let mut next = self.clone();
        next.finish_drains();
        let mut change = PoolChange::default();
        for family in [Family::V4, Family::V6] {
            next.reconfigure_family(config, family, &mut change)?;
        }
        *self = next;
        Ok(change)
    }

    /// Forgets the draining pool CIDRs no node holds a range of any more, and
    /// returns them.
    pub fn finish_drains(&mut self) -> Vec<IpNet> {
        let (done, left): (Vec<CidrSet>, Vec<CidrSet>) = std::mem::take(&mut self.draining)
            .into_iter()
            .partition(|s| s.allocated_count() == 0);
        self.draining = left;
        done.iter().map(CidrSet::cluster).collect()
    }

    fn reconfigure_family(
        &mut self,
        config: &ClusterPoolConfig,
        family: Family,
        change: &mut PoolChange,
    ) -> Result<(), ReconfigureError> {
        let mut old: Vec<Option<CidrSet>> = std::mem::take(self.sets_mut(family))
            .into_iter()
            .map(Some)
            .collect();
        let mut kept = Vec::new();
        let mut added = Vec::new();
        for entry in config.entries(family) {
            let mask = config.node_mask(family, &entry.cidr);
            let same = |s: &CidrSet| s.cluster() == entry.cidr && s.node_mask() == mask;
            if let Some(set) = old
                .iter_mut()
                .find(|s| s.as_ref().is_some_and(same))
                .and_then(Option::take)
            {
                kept.push(set);
            } else if let Some(i) = self.draining.iter().position(same) {
                kept.push(self.draining.remove(i));
                change.resumed.push(entry.cidr);
            } else {
                kept.push(node_set(family, entry.cidr, mask).map_err(ClusterPoolError::from)?);
                added.push(entry);
            }
        }
        for set in old.into_iter().flatten() {
            if set.allocated_count() > 0 {
                change.draining.push(set.cluster());
                self.draining.push(set);
            } else {
                change.removed.push(set.cluster());
            }
        }
        *self.sets_mut(family) = kept;
        for entry in &added {
            self.check_free(family, entry)?;
        }
        change.added.extend(added);
        Ok(())
    }

    /// A new entry overlaps no draining pool CIDR and no node CIDR held
    /// outside the pool.
    fn check_free(&self, family: Family, entry: &PoolEntry) -> Result<(), ReconfigureError> {
        let option = cidr_option(family);
        if let Some(d) = self
            .draining
            .iter()
            .find(|d| overlap(&d.cluster(), &entry.cidr))
        {
            return Err(ReconfigureError::OverlapsDraining {
                option,
                entry: *entry,
                pool: d.cluster(),
                mask: d.node_mask(),
            });
        }
        if let Some(held) = self.outside.iter().find(|o| overlap(o, &entry.cidr)) {
            return Err(ReconfigureError::OverlapsHeld {
                option,
                entry: *entry,
                held: *held,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::clusterpool::parse_pool_list;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| net(s)).collect()
    }

    /// An IPv4 pool from an option value, /24 unless an entry says otherwise.
    fn pool(value: &str) -> ClusterPoolConfig {
        let mut c = ClusterPoolConfig::default();
        let entries = parse_pool_list("cluster-pool-ipv4-cidr", value).unwrap();
        c.set_pool(Family::V4, &entries);
        c
    }

    fn carver(value: &str) -> NodeCidrCarver {
        NodeCidrCarver::new(&pool(value)).unwrap()
    }

    fn pools(c: &NodeCidrCarver) -> Vec<String> {
        c.sets(Family::V4)
            .iter()
            .map(|s| format!("{}@{}", s.cluster(), s.node_mask()))
            .collect()
    }

    #[test]
    fn an_entry_with_its_own_mask_carves_ranges_of_that_size() {
        let mut c = carver("10.0.0.0/24 10.1.0.0/24@26");
        assert_eq!(c.carve_for_node(&[]).unwrap(), nets(&["10.0.0.0/24"]));
        assert_eq!(c.carve_for_node(&[]).unwrap(), nets(&["10.1.0.0/26"]));
        assert_eq!(c.carve_one(Family::V4, &[]).unwrap(), net("10.1.0.64/26"));
        // Re-adoption checks each pool CIDR's own mask: a range of another
        // size is held apart, and takes every range it covers.
        let mut again = carver("10.0.0.0/24 10.1.0.0/24@26");
        assert!(again.adopt_node(&nets(&["10.1.0.128/26"])).is_ok());
        assert_eq!(
            again
                .adopt_node(&nets(&["10.1.0.0/24"]))
                .unwrap_err()
                .to_string(),
            "node has CIDRs allocated (10.1.0.0/24) that conflict with requested CIDRs: \
             10.1.0.0/24 overlaps 10.1.0.128/26, which another node holds"
        );
        assert!(again.adopt_node(&nets(&["10.0.0.0/25"])).is_ok());
        assert_eq!(again.outside(), nets(&["10.0.0.0/25"]).as_slice());
    }

    #[test]
    fn an_appended_cidr_takes_effect_and_the_ranges_handed_out_stay() {
        let mut c = carver("10.0.0.0/24");
        assert_eq!(c.carve_for_node(&[]).unwrap(), nets(&["10.0.0.0/24"]));
        assert!(c.carve_for_node(&[]).is_err(), "full");
        let change = c.reconfigure(&pool("10.0.0.0/24 10.1.0.0/23@25")).unwrap();
        assert_eq!(
            change,
            PoolChange {
                added: parse_pool_list("x", "10.1.0.0/23@25").unwrap(),
                ..Default::default()
            }
        );
        assert_eq!(pools(&c), ["10.0.0.0/24@24", "10.1.0.0/23@25"]);
        assert_eq!(c.sets(Family::V4)[0].allocated_count(), 1, "kept");
        assert_eq!(c.carve_for_node(&[]).unwrap(), nets(&["10.1.0.0/25"]));
        // The same lists again change nothing.
        assert!(
            c.reconfigure(&pool("10.0.0.0/24,10.1.0.0/23@25"))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn a_removed_cidr_in_use_drains_and_is_forgotten_with_its_last_range() {
        let mut c = carver("10.0.0.0/23 10.1.0.0/24");
        let a = c.carve_for_node(&[]).unwrap();
        let b = c.carve_for_node(&[]).unwrap();
        assert_eq!(
            [a.clone(), b.clone()].concat(),
            nets(&["10.0.0.0/24", "10.0.1.0/24"])
        );
        let change = c.reconfigure(&pool("10.1.0.0/24")).unwrap();
        assert_eq!(change.draining, nets(&["10.0.0.0/23"]));
        assert!(change.removed.is_empty());
        // No new range from it, even with room in it after a release.
        c.release_node(&a);
        assert!(c.finish_drains().is_empty(), "b is still on it");
        assert_eq!(c.carve_for_node(&[]).unwrap(), nets(&["10.1.0.0/24"]));
        assert!(c.carve_for_node(&[]).is_err());
        // b's range is still its own: re-adopting it elsewhere conflicts.
        assert!(c.adopt_node(&b).is_err());
        assert_eq!(c.draining()[0].cluster(), net("10.0.0.0/23"));
        c.release_node(&b);
        assert_eq!(c.finish_drains(), nets(&["10.0.0.0/23"]));
        assert!(c.draining().is_empty());
        assert!(c.finish_drains().is_empty(), "once");
    }

    #[test]
    fn a_removed_cidr_nobody_uses_is_forgotten_at_once() {
        let mut c = carver("10.0.0.0/24 10.1.0.0/24");
        let change = c.reconfigure(&pool("10.0.0.0/24")).unwrap();
        assert_eq!(change.removed, nets(&["10.1.0.0/24"]));
        assert!(c.draining().is_empty());
        // Added back later, with another mask, it is new.
        let change = c.reconfigure(&pool("10.0.0.0/24 10.1.0.0/24@28")).unwrap();
        assert_eq!(change.added.len(), 1);
    }

    #[test]
    fn a_draining_cidr_named_again_is_back_in_use_with_its_ranges() {
        let mut c = carver("10.0.0.0/23");
        let a = c.carve_for_node(&[]).unwrap();
        c.reconfigure(&pool("10.1.0.0/24")).unwrap();
        let change = c.reconfigure(&pool("10.1.0.0/24 10.0.0.0/23")).unwrap();
        assert_eq!(change.resumed, nets(&["10.0.0.0/23"]));
        assert!(change.added.is_empty());
        assert!(c.draining().is_empty());
        assert!(c.adopt_node(&a).is_err(), "a's range is still taken");
        assert_eq!(c.carve_one(Family::V4, &[]).unwrap(), net("10.1.0.0/24"));
        assert_eq!(c.carve_one(Family::V4, &[]).unwrap(), net("10.0.1.0/24"));
    }

    #[test]
    fn a_new_entry_overlapping_a_draining_cidr_is_refused_and_changes_nothing() {
        let mut c = carver("10.0.0.0/16");
        c.carve_for_node(&[]).unwrap();
        c.reconfigure(&pool("10.1.0.0/16")).unwrap();
        let before = pools(&c);
        // The same CIDR with another mask size: a removal and an addition.
        let e = c
            .reconfigure(&pool("10.1.0.0/16 10.0.0.0/16@26"))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "cluster-pool-ipv4-cidr entry 10.0.0.0/16@26 overlaps 10.0.0.0/16 (/24 node \
             ranges), which is draining: nodes still hold ranges of it; add the entry once \
             they are gone, or add a CIDR that does not overlap"
        );
        assert_eq!(pools(&c), before);
        assert_eq!(c.draining().len(), 1);
        // A changed mask size of an entry in use is the same refusal.
        let mut c = carver("10.0.0.0/16");
        c.carve_for_node(&[]).unwrap();
        let mut narrower = pool("10.0.0.0/16");
        narrower.ipv4_mask_size = 26;
        assert!(matches!(
            c.reconfigure(&narrower),
            Err(ReconfigureError::OverlapsDraining { pool, mask: 24, .. }) if pool == net("10.0.0.0/16")
        ));
        // Nobody on it: the mask size changes.
        let mut c = carver("10.0.0.0/16");
        c.reconfigure(&narrower).unwrap();
        assert_eq!(pools(&c), ["10.0.0.0/16@26"]);
    }

    #[test]
    fn new_lists_that_fail_the_start_up_checks_are_refused() {
        let mut c = carver("10.0.0.0/16");
        let e = c
            .reconfigure(&pool("10.0.0.0/16 10.0.128.0/17"))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "unable to initialize IPv4 allocator: CIDR \"10.0.128.0/17\" collides with \
             \"10.0.0.0/16\""
        );
        let e = c.reconfigure(&pool("")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cluster-pool-ipv4-cidr must be provided when using ClusterPool"
        );
        let mut dual = pool("10.0.0.0/16");
        dual.enable_ipv6 = true;
        dual.set_pool(
            Family::V6,
            &parse_pool_list("cluster-pool-ipv6-cidr", "fd00::/104").unwrap(),
        );
        assert_eq!(
            c.reconfigure(&dual).unwrap_err().to_string(),
            "enable-ipv6 is now on: turning a family on or off takes an operator restart"
        );
        assert_eq!(pools(&c), ["10.0.0.0/16@24"]);
    }

    #[test]
    fn after_a_restart_a_node_cidr_in_no_pool_is_held_outside_it() {
        let mut c = carver("10.1.0.0/16");
        assert_eq!(
            c.adopt_after_restart(&nets(&["10.0.3.0/24"])).unwrap(),
            nets(&["10.0.3.0/24"])
        );
        assert_eq!(c.outside(), nets(&["10.0.3.0/24"]).as_slice());
        // Not twice, nor overlapping.
        assert!(c.adopt_after_restart(&nets(&["10.0.3.0/25"])).is_err());
        // Only at a restart: later it is a conflict, as before.
        assert!(c.adopt_node(&nets(&["10.0.4.0/24"])).is_err());
        // A new entry over it is refused while the node holds it.
        let e = c.reconfigure(&pool("10.1.0.0/16 10.0.0.0/16")).unwrap_err();
        assert_eq!(
            e,
            ReconfigureError::OverlapsHeld {
                option: "cluster-pool-ipv4-cidr",
                entry: parse_pool_list("x", "10.0.0.0/16").unwrap()[0],
                held: net("10.0.3.0/24"),
            }
        );
        c.release_node(&nets(&["10.0.3.0/24"]));
        assert!(c.outside().is_empty());
        c.reconfigure(&pool("10.1.0.0/16 10.0.0.0/16")).unwrap();
    }
}
