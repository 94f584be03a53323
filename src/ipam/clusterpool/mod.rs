//! Owns the cluster-pool IPAM operator options (`cluster-pool-ipv4-cidr`,
//! `cluster-pool-ipv4-mask-size`, `cluster-pool-ipv6-cidr`,
//! `cluster-pool-ipv6-mask-size`), their validation with Cilium's start-up
//! errors, and [`NodeCidrCarver`], which hands each node its pod CIDRs out of
//! the pool CIDRs (Cilium `operator/pkg/ipam/allocator/clusterpool` and
//! `podcidr`).

mod entries;
mod reconfigure;
mod record;

use std::collections::BTreeMap;
use std::fmt;

use ipnet::IpNet;

pub use entries::{PoolEntry, parse_pool_list, parse_pool_list_lenient};
pub use reconfigure::{PoolChange, ReconfigureError};
pub use record::{POOL_IN_FORCE_ANNOTATION, PoolRecordError};

use super::Family;
use super::cidrset::{CidrSet, CidrSetError, node_mask_range};

/// Option holding the IPv4 pool CIDRs (space-separated).
pub const OPT_IPV4_CIDR: &str = "cluster-pool-ipv4-cidr";
/// Option holding the IPv6 pool CIDRs (space-separated).
pub const OPT_IPV6_CIDR: &str = "cluster-pool-ipv6-cidr";
/// Option holding the IPv4 node mask size.
pub const OPT_IPV4_MASK_SIZE: &str = "cluster-pool-ipv4-mask-size";
/// Option holding the IPv6 node mask size.
pub const OPT_IPV6_MASK_SIZE: &str = "cluster-pool-ipv6-mask-size";
/// Operator default of `cluster-pool-ipv4-mask-size`.
pub const DEFAULT_IPV4_MASK_SIZE: u8 = 24;
/// Operator default of `cluster-pool-ipv6-mask-size` (the Helm chart uses 120).
pub const DEFAULT_IPV6_MASK_SIZE: u8 = 112;
/// podnet's operator option: extra CIDRs a node may get per family.
pub const OPT_EXTRA_CIDRS_MAX: &str = "cluster-pool-extra-cidrs-max";
/// Default of [`OPT_EXTRA_CIDRS_MAX`].
pub const DEFAULT_EXTRA_CIDRS_MAX: u32 = 2;

/// The pool option of a family (`cluster-pool-ipv4-cidr`).
pub fn cidr_option(family: Family) -> &'static str {
    match family {
        Family::V4 => OPT_IPV4_CIDR,
        Family::V6 => OPT_IPV6_CIDR,
    }
}

fn mask_option(family: Family) -> &'static str {
    match family {
        Family::V4 => OPT_IPV4_MASK_SIZE,
        Family::V6 => OPT_IPV6_MASK_SIZE,
    }
}

fn short(family: Family) -> &'static str {
    match family {
        Family::V4 => "v4",
        Family::V6 => "v6",
    }
}

/// Errors of option parsing, validation and node carving.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterPoolError {
    /// A list entry is not `<address>/<prefix length>`.
    #[error(
        "invalid {option} entry {entry:?}: not a valid CIDR (expected <address>/<prefix length>, \
         e.g. 10.0.0.0/8)"
    )]
    InvalidCidr { option: String, entry: String },
    /// A list entry of the other family.
    #[error("{option}: {entry} is not an {} CIDR", expected.label())]
    WrongFamily {
        option: String,
        entry: String,
        expected: Family,
    },
    /// A list entry whose node mask size after `@` is not a number.
    #[error(
        "invalid {option} entry {entry:?}: the node mask size after @ must be a number \
         (e.g. 10.1.0.0/16@26)"
    )]
    InvalidNodeMask { option: String, entry: String },
    /// A list entry whose own node mask size does not fit its CIDR (shorter than
    /// the CIDR's prefix, longer than the family, or too many node ranges).
    #[error(
        "invalid {option} entry {entry:?}: node mask size /{mask} must be /{shortest} to \
         /{longest} for {cidr}"
    )]
    NodeMaskMisfit {
        option: String,
        entry: String,
        mask: u32,
        cidr: IpNet,
        shortest: u8,
        longest: u8,
    },
    /// A list entry with host bits set.
    #[error("{option}: {entry} has host bits set; did you mean {network}?")]
    HostBitsSet {
        option: String,
        entry: String,
        network: IpNet,
    },
    /// Neither IPv4 nor IPv6 is enabled (podnet check).
    #[error("cluster-pool IPAM needs at least one of IPv4 and IPv6 enabled")]
    NoFamilyEnabled,
    /// Cilium: `<option> must be provided when using ClusterPool`.
    #[error("{} must be provided when using ClusterPool", cidr_option(*family))]
    CidrRequired { family: Family },
    /// Cilium: `<option> must not be set if IPvX is disabled`.
    #[error("{} must not be set if {} is disabled", cidr_option(*family), family.label())]
    CidrSetForDisabledFamily { family: Family },
    /// Cilium `newCIDRSet`: an entry of the wrong family in the configured list.
    #[error("unable to initialize {} allocator: CIDR is not {} family: {cidr}", family.label(), short(*family))]
    NotFamily { family: Family, cidr: IpNet },
    /// Cilium `ErrCIDRColision`: two pool CIDRs of one family overlap.
    #[error("unable to initialize {} allocator: CIDR \"{cidr}\" collides with \"{existing}\"", family.label())]
    Collision {
        family: Family,
        cidr: IpNet,
        existing: IpNet,
    },
    /// [`CidrSet::new`] refused a pool CIDR / mask size combination.
    #[error(transparent)]
    AllocatorInit(#[from] MaskMisfit),
    /// A node's existing CIDR cannot be re-adopted.
    #[error(
        "node has CIDRs allocated ({node_cidrs}) that conflict with requested CIDRs: {cidr} {reason}"
    )]
    Conflict {
        node_cidrs: String,
        cidr: IpNet,
        reason: String,
    },
    /// Every pool CIDR of the family is full: Cilium's `ErrAllocatorFull`
    /// (`podcidr.go`), the text its operator writes into the node's
    /// `status.ipam.operator-status.error`.
    #[error("allocator full")]
    Exhausted { family: Family },
}

/// A node mask size that does not fit a pool CIDR of its family ([`CidrSet::new`]
/// refuses the pair): Cilium's start-up error, naming both options, its text
/// ending with the mask sizes that fit where Cilium's does not say them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unable to initialize {} allocator: {} {cidr} with {} {mask}: {error}{}",
    family.label(),
    cidr_option(*family),
    mask_option(*family),
    error.mask_advice(mask_option(*family), *cidr)
)]
pub struct MaskMisfit {
    pub family: Family,
    /// The pool CIDR, masked to its network.
    pub cidr: IpNet,
    pub mask: u8,
    pub error: CidrSetError,
}

impl MaskMisfit {
    /// The mask size's option, `cluster-pool-ipv6-mask-size`.
    pub fn option(&self) -> &'static str {
        mask_option(self.family)
    }

    /// The pool CIDR's option, `cluster-pool-ipv6-cidr`.
    pub fn cidr_option(&self) -> &'static str {
        cidr_option(self.family)
    }

    /// The shortest and longest mask sizes that fit the pool CIDR.
    pub fn fitting(&self) -> (u8, u8) {
        node_mask_range(self.cidr)
    }
}

/// Parses a pool CIDR list option value: entries separated by whitespace
/// and/or commas; an empty value gives an empty list.
///
/// The expected family comes from `option_name`: a name containing `ipv4`
/// accepts only IPv4 CIDRs, one containing `ipv6` only IPv6 CIDRs; any other
/// name accepts both. Entries with host bits set (`10.0.0.1/8`) are refused
/// (Cilium silently masks them).
pub fn parse_cidr_list(option_name: &str, value: &str) -> Result<Vec<IpNet>, ClusterPoolError> {
    list_entries(value)
        .map(|entry| parse_cidr_entry(option_name, entry, entry))
        .collect()
}

/// The entries of a list option value: separated by whitespace and/or commas.
fn list_entries(value: &str) -> impl Iterator<Item = &str> {
    value
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|e| !e.is_empty())
}

/// The CIDR `cidr` of list entry `entry` of option `option_name` (the family
/// expected from the name, as [`parse_cidr_list`] says); errors name the entry.
fn parse_cidr_entry(option_name: &str, entry: &str, cidr: &str) -> Result<IpNet, ClusterPoolError> {
    let expected = if option_name.contains("ipv6") {
        Some(Family::V6)
    } else if option_name.contains("ipv4") {
        Some(Family::V4)
    } else {
        None
    };
    let net: IpNet = cidr.parse().map_err(|_| ClusterPoolError::InvalidCidr {
        option: option_name.to_string(),
        entry: entry.to_string(),
    })?;
    if let Some(f) = expected
        && Family::of_net(&net) != f
    {
        return Err(ClusterPoolError::WrongFamily {
            option: option_name.to_string(),
            entry: entry.to_string(),
            expected: f,
        });
    }
    if net.addr() != net.network() {
        return Err(ClusterPoolError::HostBitsSet {
            option: option_name.to_string(),
            entry: entry.to_string(),
            network: net.trunc(),
        });
    }
    Ok(net)
}

/// The cluster-pool operator options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterPoolConfig {
    pub enable_ipv4: bool,
    pub enable_ipv6: bool,
    /// `cluster-pool-ipv4-cidr`.
    pub ipv4_cidrs: Vec<IpNet>,
    /// `cluster-pool-ipv4-mask-size` (default 24).
    pub ipv4_mask_size: u8,
    /// `cluster-pool-ipv6-cidr`.
    pub ipv6_cidrs: Vec<IpNet>,
    /// `cluster-pool-ipv6-mask-size` (default 112).
    pub ipv6_mask_size: u8,
    /// The node mask sizes of the pool CIDRs that have their own (`<cidr>@<mask>`
    /// entries); any other takes its family's mask size.
    pub node_masks: BTreeMap<IpNet, u8>,
}

impl Default for ClusterPoolConfig {
    /// IPv4 on, IPv6 off (Cilium's `enable-ipv4`/`enable-ipv6` defaults), no
    /// pool CIDRs (the operator flag default is empty), masks 24 and 112.
    fn default() -> Self {
        Self {
            enable_ipv4: true,
            enable_ipv6: false,
            ipv4_cidrs: Vec::new(),
            ipv4_mask_size: DEFAULT_IPV4_MASK_SIZE,
            ipv6_cidrs: Vec::new(),
            ipv6_mask_size: DEFAULT_IPV6_MASK_SIZE,
            node_masks: BTreeMap::new(),
        }
    }
}

impl ClusterPoolConfig {
    /// Checks the options as the Cilium operator does at start-up (IPv4 first,
    /// then IPv6): a CIDR list is required for an enabled family and refused
    /// for a disabled one; each CIDR must be of the family, must not overlap
    /// an earlier one, and must accept the mask size ([`CidrSet::new`]).
    pub fn validate(&self) -> Result<(), ClusterPoolError> {
        self.build_sets().map(|_| ())
    }

    /// What [`Self::validate`] checks but whether the mask sizes fit the pool
    /// CIDRs: for an agent that carves no node CIDR itself, to which a misfit
    /// mask is a finding of its node check ([`Self::mask_misfits`]).
    pub fn validate_cidrs(&self) -> Result<(), ClusterPoolError> {
        self.check_any_family()?;
        for family in [Family::V4, Family::V6] {
            self.check_cidrs(family)?;
        }
        Ok(())
    }

    /// Every pool CIDR of an enabled family that its node mask size does not
    /// fit, IPv4 first.
    pub fn mask_misfits(&self) -> Vec<MaskMisfit> {
        [Family::V4, Family::V6]
            .into_iter()
            .filter(|&f| self.enabled(f))
            .flat_map(|f| {
                self.cidrs(f)
                    .iter()
                    .filter_map(move |c| node_set(f, *c, self.node_mask(f, c)).err())
            })
            .collect()
    }

    /// Sets a family's pool CIDRs from its option's entries, with the node
    /// mask sizes the entries carry.
    pub fn set_pool(&mut self, family: Family, entries: &[PoolEntry]) {
        let cidrs = entries.iter().map(|e| e.cidr).collect();
        match family {
            Family::V4 => self.ipv4_cidrs = cidrs,
            Family::V6 => self.ipv6_cidrs = cidrs,
        }
        self.node_masks.retain(|c, _| Family::of_net(c) != family);
        for e in entries {
            if let Some(mask) = e.mask {
                self.node_masks.insert(e.cidr, mask);
            }
        }
    }

    /// The node mask size of pool CIDR `cidr` of `family`: its own, or the
    /// family's.
    pub fn node_mask(&self, family: Family, cidr: &IpNet) -> u8 {
        self.node_masks
            .get(cidr)
            .copied()
            .unwrap_or_else(|| self.mask_size(family))
    }

    /// The node mask size of the pool CIDR `addr` is in (the family's when it
    /// is in none).
    pub fn node_mask_of(&self, addr: std::net::IpAddr) -> u8 {
        let family = Family::of_addr(&addr);
        self.cidrs(family)
            .iter()
            .find(|c| c.contains(&addr))
            .map_or_else(|| self.mask_size(family), |c| self.node_mask(family, c))
    }

    fn enabled(&self, family: Family) -> bool {
        match family {
            Family::V4 => self.enable_ipv4,
            Family::V6 => self.enable_ipv6,
        }
    }

    fn cidrs(&self, family: Family) -> &[IpNet] {
        match family {
            Family::V4 => &self.ipv4_cidrs,
            Family::V6 => &self.ipv6_cidrs,
        }
    }

    fn mask_size(&self, family: Family) -> u8 {
        match family {
            Family::V4 => self.ipv4_mask_size,
            Family::V6 => self.ipv6_mask_size,
        }
    }

    fn check_any_family(&self) -> Result<(), ClusterPoolError> {
        match self.enable_ipv4 || self.enable_ipv6 {
            true => Ok(()),
            false => Err(ClusterPoolError::NoFamilyEnabled),
        }
    }

    /// A family's CIDR list, but for the mask size: required when the family is
    /// enabled, refused when not, each CIDR of the family and overlapping no
    /// earlier one.
    fn check_cidrs(&self, family: Family) -> Result<(), ClusterPoolError> {
        let cidrs = self.cidrs(family);
        if !self.enabled(family) {
            return match cidrs.is_empty() {
                true => Ok(()),
                false => Err(ClusterPoolError::CidrSetForDisabledFamily { family }),
            };
        }
        if cidrs.is_empty() {
            return Err(ClusterPoolError::CidrRequired { family });
        }
        for (i, cidr) in cidrs.iter().enumerate() {
            if Family::of_net(cidr) != family {
                return Err(ClusterPoolError::NotFamily {
                    family,
                    cidr: *cidr,
                });
            }
            if let Some(existing) = cidrs[..i].iter().find(|e| overlap(e, cidr)) {
                return Err(ClusterPoolError::Collision {
                    family,
                    cidr: *cidr,
                    existing: existing.trunc(),
                });
            }
        }
        Ok(())
    }

    fn build_sets(&self) -> Result<(Vec<CidrSet>, Vec<CidrSet>), ClusterPoolError> {
        self.check_any_family()?;
        Ok((
            self.build_family(Family::V4)?,
            self.build_family(Family::V6)?,
        ))
    }

    /// A family's allocators, its CIDRs checked first (empty when disabled).
    fn build_family(&self, family: Family) -> Result<Vec<CidrSet>, ClusterPoolError> {
        self.check_cidrs(family)?;
        if !self.enabled(family) {
            return Ok(Vec::new());
        }
        let sets = self
            .cidrs(family)
            .iter()
            .map(|c| node_set(family, *c, self.node_mask(family, c)));
        Ok(sets.collect::<Result<_, _>>()?)
    }
}

/// Whether two pool CIDRs share an address (as [`CidrSet::in_range`]).
fn overlap(a: &IpNet, b: &IpNet) -> bool {
    a.trunc().contains(&b.addr()) || b.trunc().contains(&a.network())
}

/// The allocator of pool CIDR `cidr` at node mask `mask`.
fn node_set(family: Family, cidr: IpNet, mask: u8) -> Result<CidrSet, MaskMisfit> {
    CidrSet::new(cidr, mask).map_err(|error| MaskMisfit {
        family,
        cidr: cidr.trunc(),
        mask,
        error,
    })
}

/// Hands nodes their pod CIDRs: one [`CidrSet`] per pool CIDR per enabled
/// family, tried in configuration order.
///
/// The carver does not remember which node holds what; the caller records
/// the result of [`Self::carve_for_node`] and calls [`Self::release_node`]
/// when the node goes away.
///
/// A pool CIDR taken out of the options while nodes hold ranges of it is
/// draining ([`reconfigure`]): it keeps their ranges, gives no new one, and is
/// forgotten once the last is released. After a restart the options no longer
/// name it: a node CIDR in no pool CIDR is then held as it is, outside every
/// set ([`Self::adopt_after_restart`]), until its node releases it.
///
/// A node CIDR inside a pool CIDR but not of its node range size (the mask
/// size changed before a restart, or someone wrote the node's spec) is held
/// apart too, whenever it is adopted: every range of the pool CIDR it overlaps
/// stays taken while it is held, so no range inside it is handed to another
/// node.
#[derive(Debug, Clone)]
pub struct NodeCidrCarver {
    v4: Vec<CidrSet>,
    v6: Vec<CidrSet>,
    /// Pool CIDRs removed from the options while nodes still hold ranges of them.
    draining: Vec<CidrSet>,
    /// Node CIDRs held apart from the pool CIDRs' ranges: in no pool CIDR
    /// (held by the nodes that had them at start), or inside one but of
    /// another size (the ranges they overlap are taken in its set).
    outside: Vec<IpNet>,
}

struct JoinedCidrs<'a>(&'a [IpNet]);

impl fmt::Display for JoinedCidrs<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{c}")?;
        }
        Ok(())
    }
}

/// How [`NodeCidrCarver`] takes a node's CIDRs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Take {
    /// Re-adopt what it has, allocate a CIDR of a family it has none of.
    Carve,
    /// Re-adopt what it has, nothing more.
    Adopt,
    /// As `Adopt`, and a CIDR in no pool CIDR is held outside every set.
    AdoptAfterRestart,
}

impl NodeCidrCarver {
    /// Validates `config` and builds the allocators.
    pub fn new(config: &ClusterPoolConfig) -> Result<Self, ClusterPoolError> {
        let (v4, v6) = config.build_sets()?;
        Ok(Self {
            v4,
            v6,
            draining: Vec::new(),
            outside: Vec::new(),
        })
    }

    /// The allocators of one family, in configuration order (empty for a
    /// disabled family).
    pub fn sets(&self, family: Family) -> &[CidrSet] {
        match family {
            Family::V4 => &self.v4,
            Family::V6 => &self.v6,
        }
    }

    /// The pool CIDRs that are draining: removed from the options, still
    /// holding ranges of nodes.
    pub fn draining(&self) -> &[CidrSet] {
        &self.draining
    }

    /// Node CIDRs held apart: in no pool CIDR (re-adopted after a restart),
    /// or of another size than the pool CIDR they lie in.
    pub fn outside(&self) -> &[IpNet] {
        &self.outside
    }

    /// The pool CIDR, active or draining, that a held-apart `cidr` lies in
    /// (None: it is in none).
    pub fn pool_of(&self, cidr: &IpNet) -> Option<&CidrSet> {
        let family = Family::of_net(cidr);
        self.sets(family)
            .iter()
            .chain(&self.draining)
            .find(|s| s.in_range(cidr))
    }

    fn sets_mut(&mut self, family: Family) -> &mut Vec<CidrSet> {
        match family {
            Family::V4 => &mut self.v4,
            Family::V6 => &mut self.v6,
        }
    }

    /// The set, active or draining, whose pool CIDR has `cidr`.
    fn set_of(&mut self, cidr: &IpNet) -> Option<&mut CidrSet> {
        let family = Family::of_net(cidr);
        let Self {
            v4, v6, draining, ..
        } = self;
        let active = match family {
            Family::V4 => v4,
            Family::V6 => v6,
        };
        active
            .iter_mut()
            .chain(draining.iter_mut())
            .find(|s| s.in_range(cidr))
    }

    /// Returns the node's pod CIDRs (IPv4 first, then IPv6).
    ///
    /// For each enabled family: if `existing` holds CIDRs of that family, each
    /// is re-adopted (occupied) when it lies in a pool CIDR (active or
    /// draining) and is not allocated yet (one of another size than the pool
    /// CIDR's node ranges is held apart: the type's rule); otherwise one new
    /// CIDR is allocated round-robin from the first active pool CIDR that is
    /// not full. Any existing CIDR that cannot be re-adopted (already
    /// allocated, overlapping one held, in no pool, or of a disabled family)
    /// fails the whole call with [`ClusterPoolError::Conflict`]; all
    /// pools full fails with [`ClusterPoolError::Exhausted`]. On error nothing
    /// stays allocated.
    pub fn carve_for_node(&mut self, existing: &[IpNet]) -> Result<Vec<IpNet>, ClusterPoolError> {
        self.carve_or_adopt(existing, Take::Carve)
    }

    /// Re-adopts the node's existing CIDRs with the checks of
    /// [`Self::carve_for_node`], but allocates nothing for a family the node has no
    /// CIDR of: an operator that starts re-adopts every node first and allocates
    /// only then, so no fresh allocation can take a CIDR a node not read yet holds.
    pub fn adopt_node(&mut self, existing: &[IpNet]) -> Result<Vec<IpNet>, ClusterPoolError> {
        self.carve_or_adopt(existing, Take::Adopt)
    }

    /// [`Self::adopt_node`] for the nodes an operator reads at start: a CIDR in
    /// no pool CIDR of its (enabled) family is what a pool CIDR removed before
    /// the restart left, and is held as it is, outside every set (a CIDR
    /// overlapping one held so is a conflict).
    pub fn adopt_after_restart(
        &mut self,
        existing: &[IpNet],
    ) -> Result<Vec<IpNet>, ClusterPoolError> {
        self.carve_or_adopt(existing, Take::AdoptAfterRestart)
    }

    /// Whether `cidrs` hold a CIDR of every enabled family.
    pub fn covers_every_family(&self, cidrs: &[IpNet]) -> bool {
        [Family::V4, Family::V6]
            .into_iter()
            .all(|f| self.sets(f).is_empty() || cidrs.iter().any(|c| Family::of_net(c) == f))
    }

    fn carve_or_adopt(
        &mut self,
        existing: &[IpNet],
        take: Take,
    ) -> Result<Vec<IpNet>, ClusterPoolError> {
        let mut done: Vec<IpNet> = Vec::new();
        let result = self.carve_inner(existing, take, &mut done);
        if result.is_err() {
            self.release_node(&done);
        }
        result
    }

    fn carve_inner(
        &mut self,
        existing: &[IpNet],
        take: Take,
        done: &mut Vec<IpNet>,
    ) -> Result<Vec<IpNet>, ClusterPoolError> {
        let mut node: Vec<IpNet> = Vec::with_capacity(existing.len());
        for c in existing {
            let c = c.trunc();
            if !node.contains(&c) {
                node.push(c);
            }
        }
        let conflict = |cidr: IpNet, reason: String| ClusterPoolError::Conflict {
            node_cidrs: JoinedCidrs(existing).to_string(),
            cidr,
            reason,
        };
        let mut out = Vec::new();
        for family in [Family::V4, Family::V6] {
            let mine: Vec<IpNet> = node
                .iter()
                .copied()
                .filter(|c| Family::of_net(c) == family)
                .collect();
            let sets = self.sets_mut(family);
            if mine.is_empty() {
                if sets.is_empty() || take != Take::Carve {
                    continue;
                }
                let (_, cidr) = allocate_next(sets, family)?;
                done.push(cidr);
                out.push(cidr);
                continue;
            }
            if sets.is_empty() {
                return Err(conflict(
                    mine[0],
                    format!(
                        "is an {} CIDR but {} is disabled",
                        family.label(),
                        family.label()
                    ),
                ));
            }
            for cidr in mine {
                self.adopt_one(cidr, take).map_err(|r| conflict(cidr, r))?;
                done.push(cidr);
                out.push(cidr);
            }
        }
        Ok(out)
    }

    /// Occupies one existing node CIDR where it lies; the reason it cannot be.
    fn adopt_one(&mut self, cidr: IpNet, take: Take) -> Result<(), String> {
        let family = Family::of_net(&cidr);
        let pools: Vec<IpNet> = self.sets(family).iter().map(CidrSet::cluster).collect();
        if let Some(held) = self.outside.iter().find(|o| overlap(o, &cidr)) {
            return Err(format!("overlaps {held}, which another node holds"));
        }
        let Some(set) = self.set_of(&cidr) else {
            if take != Take::AdoptAfterRestart {
                return Err(format!(
                    "is not in any pool of {} ({})",
                    cidr_option(family),
                    JoinedCidrs(&pools)
                ));
            }
            self.outside.push(cidr);
            return Ok(());
        };
        if cidr.prefix_len() != set.node_mask() {
            return self.hold_apart(cidr);
        }
        if set.is_allocated(&cidr).map_err(|e| e.to_string())? {
            return Err("is already allocated".to_string());
        }
        set.occupy(&cidr).map_err(|e| e.to_string())
    }

    /// Holds a node CIDR of another size than the ranges of the pool CIDRs it
    /// overlaps (the type's rule): each of their ranges it covers is taken,
    /// unless another node's range is among them.
    fn hold_apart(&mut self, cidr: IpNet) -> Result<(), String> {
        let Self {
            v4,
            v6,
            draining,
            outside,
        } = self;
        let sets = || v4.iter().chain(v6.iter()).chain(draining.iter());
        for set in sets().filter(|s| s.in_range(&cidr)) {
            let taken = set.allocated_within(&cidr).map_err(|e| e.to_string())?;
            // A range taken for a node held apart that does not overlap this
            // one (it shares a larger range of the pool CIDR) is no conflict.
            if let Some(range) = taken
                .iter()
                .find(|r| !outside.iter().any(|o| overlap(o, r)))
            {
                return Err(format!("overlaps {range}, which another node holds"));
            }
        }
        for set in v4
            .iter_mut()
            .chain(v6.iter_mut())
            .chain(draining.iter_mut())
        {
            if set.in_range(&cidr) {
                set.occupy(&cidr).map_err(|e| e.to_string())?;
            }
        }
        outside.push(cidr);
        Ok(())
    }

    /// One more CIDR of `family` for a node that has some (an extra CIDR), from
    /// the first pool CIDR with room; a CIDR in `avoid` is not given (it stays
    /// free). [`ClusterPoolError::Exhausted`] when none is left.
    pub fn carve_one(
        &mut self,
        family: Family,
        avoid: &[IpNet],
    ) -> Result<IpNet, ClusterPoolError> {
        let sets = self.sets_mut(family);
        let mut skipped = Vec::new();
        let result = loop {
            match allocate_next(sets, family) {
                Ok((i, cidr)) if avoid.contains(&cidr) && skipped.len() < avoid.len() => {
                    skipped.push((i, cidr));
                }
                Ok((i, cidr)) if avoid.contains(&cidr) => {
                    skipped.push((i, cidr));
                    break Err(ClusterPoolError::Exhausted { family });
                }
                other => break other.map(|(_, cidr)| cidr),
            }
        };
        for (i, cidr) in skipped {
            if let Some(set) = sets.get_mut(i) {
                let _ = set.release(&cidr);
            }
        }
        result
    }

    /// Releases a node's CIDRs back to their pools (or out of the carver, for
    /// one held outside every pool). CIDRs that are in no pool or not
    /// allocated are ignored. A draining pool CIDR whose last range goes is
    /// forgotten at the next [`Self::finish_drains`].
    pub fn release_node(&mut self, cidrs: &[IpNet]) {
        for cidr in cidrs {
            if let Some(i) = self.outside.iter().position(|o| o == cidr) {
                self.outside.remove(i);
                self.release_apart(cidr);
            } else if let Some(set) = self.set_of(cidr) {
                let _ = set.release(cidr);
            }
        }
    }

    /// Frees the ranges a node CIDR held apart took, but those another one
    /// held apart still overlaps.
    fn release_apart(&mut self, cidr: &IpNet) {
        let Self {
            v4,
            v6,
            draining,
            outside,
        } = self;
        for set in v4
            .iter_mut()
            .chain(v6.iter_mut())
            .chain(draining.iter_mut())
        {
            if !set.in_range(cidr) {
                continue;
            }
            for range in set.allocated_within(cidr).unwrap_or_default() {
                if !outside.iter().any(|o| overlap(o, &range)) {
                    let _ = set.release(&range);
                }
            }
        }
    }
}

/// The next free node CIDR of the first pool CIDR of `sets` with room (and
/// which pool CIDR it came from).
fn allocate_next(sets: &mut [CidrSet], family: Family) -> Result<(usize, IpNet), ClusterPoolError> {
    sets.iter_mut()
        .enumerate()
        .filter(|(_, s)| !s.is_full())
        .find_map(|(i, s)| s.allocate_next().ok().map(|c| (i, c)))
        .ok_or(ClusterPoolError::Exhausted { family })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carve_one_adds_a_cidr_and_avoids_the_ones_asked() {
        let mut c = NodeCidrCarver::new(&v4_config(&["10.0.0.0/22"], 24)).unwrap();
        assert_eq!(c.carve_for_node(&[]).unwrap(), nets(&["10.0.0.0/24"]));
        assert_eq!(
            c.carve_one(Family::V4, &nets(&["10.0.1.0/24"])).unwrap(),
            net("10.0.2.0/24")
        );
        assert!(
            !c.sets(Family::V4)[0]
                .is_allocated(&net("10.0.1.0/24"))
                .unwrap()
        );
        assert_eq!(c.carve_one(Family::V4, &[]).unwrap(), net("10.0.3.0/24"));
        // Only an avoided one left: exhausted, and it stays free.
        assert_eq!(
            c.carve_one(Family::V4, &nets(&["10.0.1.0/24"])),
            Err(ClusterPoolError::Exhausted { family: Family::V4 })
        );
        assert_eq!(c.carve_one(Family::V4, &[]).unwrap(), net("10.0.1.0/24"));
        assert_eq!(
            c.carve_one(Family::V4, &[]),
            Err(ClusterPoolError::Exhausted { family: Family::V4 })
        );
        // A disabled family has no pool.
        assert!(c.carve_one(Family::V6, &[]).is_err());
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }
    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| net(s)).collect()
    }
    fn v4_config(cidrs: &[&str], mask: u8) -> ClusterPoolConfig {
        ClusterPoolConfig {
            ipv4_cidrs: nets(cidrs),
            ipv4_mask_size: mask,
            ..Default::default()
        }
    }
    fn dual(v4: &[&str], v4m: u8, v6: &[&str], v6m: u8) -> ClusterPoolConfig {
        ClusterPoolConfig {
            enable_ipv4: true,
            enable_ipv6: true,
            ipv4_cidrs: nets(v4),
            ipv4_mask_size: v4m,
            ipv6_cidrs: nets(v6),
            ipv6_mask_size: v6m,
            node_masks: Default::default(),
        }
    }

    #[test]
    fn parse_lists() {
        assert_eq!(
            parse_cidr_list(OPT_IPV4_CIDR, "10.0.0.0/8 192.168.0.0/16").unwrap(),
            nets(&["10.0.0.0/8", "192.168.0.0/16"])
        );
        assert_eq!(
            parse_cidr_list(
                OPT_IPV4_CIDR,
                " 10.0.0.0/8,172.16.0.0/12 ,\t192.168.0.0/16 "
            )
            .unwrap(),
            nets(&["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"])
        );
        assert_eq!(parse_cidr_list(OPT_IPV4_CIDR, "").unwrap(), vec![]);
        assert_eq!(parse_cidr_list(OPT_IPV4_CIDR, "  , ").unwrap(), vec![]);
        assert_eq!(
            parse_cidr_list(OPT_IPV6_CIDR, "fd00::/104").unwrap(),
            nets(&["fd00::/104"])
        );
        assert_eq!(
            parse_cidr_list("pool", "fd00::/104 10.0.0.0/8").unwrap(),
            nets(&["fd00::/104", "10.0.0.0/8"])
        );
    }

    #[test]
    fn parse_list_errors() {
        assert_eq!(
            parse_cidr_list(OPT_IPV4_CIDR, "fd00::/104")
                .unwrap_err()
                .to_string(),
            "cluster-pool-ipv4-cidr: fd00::/104 is not an IPv4 CIDR"
        );
        assert_eq!(
            parse_cidr_list(OPT_IPV6_CIDR, "fd00::/104 10.0.0.0/8")
                .unwrap_err()
                .to_string(),
            "cluster-pool-ipv6-cidr: 10.0.0.0/8 is not an IPv6 CIDR"
        );
        let err = parse_cidr_list(OPT_IPV4_CIDR, "10.0.0.1/8").unwrap_err();
        assert_eq!(
            err.to_string(),
            "cluster-pool-ipv4-cidr: 10.0.0.1/8 has host bits set; did you mean 10.0.0.0/8?"
        );
        assert!(
            err.to_string()
                .contains("10.0.0.1/8 has host bits set; did you mean 10.0.0.0/8?")
        );
        assert_eq!(
            parse_cidr_list(OPT_IPV6_CIDR, "fd00::1/104")
                .unwrap_err()
                .to_string(),
            "cluster-pool-ipv6-cidr: fd00::1/104 has host bits set; did you mean fd00::/104?"
        );
        for bad in [
            "10.0.0.0",
            "10.0.0.0/33",
            "banana",
            "10.0.0.0/8/8",
            "10.0.0.256/24",
        ] {
            let err = parse_cidr_list(OPT_IPV4_CIDR, &format!("10.0.0.0/8 {bad}")).unwrap_err();
            assert_eq!(
                err,
                ClusterPoolError::InvalidCidr {
                    option: OPT_IPV4_CIDR.into(),
                    entry: bad.into()
                }
            );
        }
        assert_eq!(
            parse_cidr_list(OPT_IPV4_CIDR, "10.0.0.0")
                .unwrap_err()
                .to_string(),
            "invalid cluster-pool-ipv4-cidr entry \"10.0.0.0\": not a valid CIDR (expected \
             <address>/<prefix length>, e.g. 10.0.0.0/8)"
        );
    }

    #[test]
    fn defaults() {
        let c = ClusterPoolConfig::default();
        assert!(c.enable_ipv4 && !c.enable_ipv6);
        assert_eq!(c.ipv4_mask_size, 24);
        assert_eq!(c.ipv6_mask_size, 112);
        assert!(c.ipv4_cidrs.is_empty() && c.ipv6_cidrs.is_empty());
    }

    #[test]
    fn validate_exact_errors() {
        let msg = |c: ClusterPoolConfig| c.validate().unwrap_err().to_string();
        assert_eq!(
            msg(ClusterPoolConfig::default()),
            "cluster-pool-ipv4-cidr must be provided when using ClusterPool"
        );
        assert_eq!(
            msg(ClusterPoolConfig {
                enable_ipv4: false,
                enable_ipv6: true,
                ipv4_cidrs: nets(&["10.0.0.0/8"]),
                ipv6_cidrs: nets(&["fd00::/104"]),
                ..Default::default()
            }),
            "cluster-pool-ipv4-cidr must not be set if IPv4 is disabled"
        );
        assert_eq!(
            msg(ClusterPoolConfig {
                enable_ipv6: true,
                ipv4_cidrs: nets(&["10.0.0.0/8"]),
                ..Default::default()
            }),
            "cluster-pool-ipv6-cidr must be provided when using ClusterPool"
        );
        assert_eq!(
            msg(ClusterPoolConfig {
                ipv4_cidrs: nets(&["10.0.0.0/8"]),
                ipv6_cidrs: nets(&["fd00::/104"]),
                ..Default::default()
            }),
            "cluster-pool-ipv6-cidr must not be set if IPv6 is disabled"
        );
        assert_eq!(
            msg(ClusterPoolConfig {
                enable_ipv4: false,
                ..Default::default()
            }),
            "cluster-pool IPAM needs at least one of IPv4 and IPv6 enabled"
        );
    }

    #[test]
    fn validate_mask_errors_are_wrapped() {
        assert_eq!(
            v4_config(&["10.0.0.0/8"], 33)
                .validate()
                .unwrap_err()
                .to_string(),
            "unable to initialize IPv4 allocator: cluster-pool-ipv4-cidr 10.0.0.0/8 with \
             cluster-pool-ipv4-mask-size 33: SubNetMask is invalid, should be lower or equal to \
             32 for IPv4 and to 128 for IPv6; cluster-pool-ipv4-mask-size must be /8 to /32 \
             for 10.0.0.0/8"
        );
        assert_eq!(
            dual(&["10.0.0.0/8"], 24, &["fd00::/104"], 121)
                .validate()
                .unwrap_err()
                .to_string(),
            "unable to initialize IPv6 allocator: cluster-pool-ipv6-cidr fd00::/104 with \
             cluster-pool-ipv6-mask-size 121: New CIDR set failed; the node CIDR size is too \
             big; cluster-pool-ipv6-mask-size must be /104 to /120 for fd00::/104"
        );
        assert_eq!(
            dual(&["10.0.0.0/8"], 24, &["fd00::/104"], 129)
                .validate()
                .unwrap_err()
                .to_string(),
            "unable to initialize IPv6 allocator: cluster-pool-ipv6-cidr fd00::/104 with \
             cluster-pool-ipv6-mask-size 129: SubNetMask is invalid, should be lower or equal to \
             32 for IPv4 and to 128 for IPv6; cluster-pool-ipv6-mask-size must be /104 to /120 \
             for fd00::/104"
        );
        assert_eq!(
            dual(&["10.0.0.0/8"], 24, &["fd00::/104"], 96)
                .validate()
                .unwrap_err()
                .to_string(),
            "unable to initialize IPv6 allocator: cluster-pool-ipv6-cidr fd00::/104 with \
             cluster-pool-ipv6-mask-size 96: node mask size /96 is shorter than the prefix \
             length of cluster CIDR fd00::/104; it must be /104 or longer"
        );
        assert_eq!(
            v4_config(&["10.0.0.0/16"], 8).validate().unwrap_err(),
            ClusterPoolError::AllocatorInit(MaskMisfit {
                family: Family::V4,
                cidr: net("10.0.0.0/16"),
                mask: 8,
                error: CidrSetError::NodeMaskShorterThanCluster {
                    cluster: net("10.0.0.0/16"),
                    node_mask: 8
                }
            })
        );
        // The Helm and operator defaults are valid.
        dual(&["10.0.0.0/8"], 24, &["fd00::/104"], 120)
            .validate()
            .unwrap();
        dual(&["10.244.0.0/16"], 24, &["fd00:10:244::/96"], 112)
            .validate()
            .unwrap();
    }

    #[test]
    fn validate_overlap_and_family() {
        assert_eq!(
            v4_config(&["10.0.0.0/8", "10.1.0.0/16"], 24)
                .validate()
                .unwrap_err()
                .to_string(),
            "unable to initialize IPv4 allocator: CIDR \"10.1.0.0/16\" collides with \"10.0.0.0/8\""
        );
        assert_eq!(
            v4_config(&["10.1.0.0/16", "10.0.0.0/8"], 24)
                .validate()
                .unwrap_err()
                .to_string(),
            "unable to initialize IPv4 allocator: CIDR \"10.0.0.0/8\" collides with \"10.1.0.0/16\""
        );
        assert!(matches!(
            v4_config(&["10.0.0.0/16", "10.0.0.0/16"], 24).validate(),
            Err(ClusterPoolError::Collision { .. })
        ));
        v4_config(&["10.0.0.0/16", "10.1.0.0/16"], 24)
            .validate()
            .unwrap();
        assert_eq!(
            v4_config(&["fd00::/104"], 24)
                .validate()
                .unwrap_err()
                .to_string(),
            "unable to initialize IPv4 allocator: CIDR is not v4 family: fd00::/104"
        );
        assert_eq!(
            dual(&["10.0.0.0/8"], 24, &["10.0.0.0/8"], 112)
                .validate()
                .unwrap_err()
                .to_string(),
            "unable to initialize IPv6 allocator: CIDR is not v6 family: 10.0.0.0/8"
        );
    }

    #[test]
    fn carve_fresh_dual_stack() {
        let mut c = NodeCidrCarver::new(&dual(&["10.0.0.0/8"], 24, &["fd00::/104"], 120)).unwrap();
        assert_eq!(
            c.carve_for_node(&[]).unwrap(),
            nets(&["10.0.0.0/24", "fd00::/120"])
        );
        assert_eq!(
            c.carve_for_node(&[]).unwrap(),
            nets(&["10.0.1.0/24", "fd00::100/120"])
        );
        assert_eq!(c.sets(Family::V4)[0].allocated_count(), 2);
        assert_eq!(c.sets(Family::V6)[0].allocated_count(), 2);
    }

    #[test]
    fn carve_readopts_existing() {
        let mut c = NodeCidrCarver::new(&v4_config(&["10.0.0.0/16"], 24)).unwrap();
        assert_eq!(
            c.carve_for_node(&nets(&["10.0.1.0/24"])).unwrap(),
            nets(&["10.0.1.0/24"])
        );
        // Multiple existing CIDRs of a family are all re-adopted.
        assert_eq!(
            c.carve_for_node(&nets(&["10.0.3.0/24", "10.0.4.0/24"]))
                .unwrap(),
            nets(&["10.0.3.0/24", "10.0.4.0/24"])
        );
        // Fresh allocations skip the re-adopted ones.
        assert_eq!(c.carve_for_node(&[]).unwrap(), nets(&["10.0.0.0/24"]));
        assert_eq!(c.carve_for_node(&[]).unwrap(), nets(&["10.0.2.0/24"]));
        assert_eq!(c.carve_for_node(&[]).unwrap(), nets(&["10.0.5.0/24"]));
        assert_eq!(c.sets(Family::V4)[0].allocated_count(), 6);
    }

    #[test]
    fn a_range_of_another_size_is_held_apart_and_nothing_inside_it_is_handed_out() {
        // The operator carved /24s, then restarted with /26 (issue 53: the
        // restarted operator gave a new node a /26 inside a live /24).
        let mut c = NodeCidrCarver::new(&v4_config(&["10.0.0.0/22"], 26)).unwrap();
        let held = c.adopt_after_restart(&nets(&["10.0.0.0/24"])).unwrap();
        assert_eq!(held, nets(&["10.0.0.0/24"]));
        assert_eq!(c.outside(), nets(&["10.0.0.0/24"]).as_slice());
        assert_eq!(
            c.pool_of(&net("10.0.0.0/24")).map(CidrSet::cluster),
            Some(net("10.0.0.0/22"))
        );
        let carved: Vec<IpNet> = (0..12)
            .map(|_| c.carve_one(Family::V4, &[]).unwrap())
            .collect();
        assert!(
            carved.iter().all(|r| !overlap(r, &net("10.0.0.0/24"))),
            "{carved:?}"
        );
        assert!(c.carve_one(Family::V4, &[]).is_err(), "the rest is full");
        // Released, its four ranges are free again.
        c.release_node(&nets(&["10.0.0.0/24"]));
        assert!(c.outside().is_empty());
        assert_eq!(c.sets(Family::V4)[0].allocated_count(), 12);
        assert_eq!(c.carve_one(Family::V4, &[]).unwrap(), net("10.0.0.0/26"));
    }

    #[test]
    fn smaller_ranges_held_apart_share_their_pool_range_until_both_go() {
        // /24 ranges, two nodes on /26s of one /24 (the mask size was 26).
        let mut c = NodeCidrCarver::new(&v4_config(&["10.0.0.0/23"], 24)).unwrap();
        c.adopt_after_restart(&nets(&["10.0.0.0/26"])).unwrap();
        c.adopt_after_restart(&nets(&["10.0.0.64/26"])).unwrap();
        // A third overlapping either is a conflict; a /24 of the pool there too.
        assert!(c.adopt_after_restart(&nets(&["10.0.0.0/25"])).is_err());
        assert!(c.adopt_node(&nets(&["10.0.0.0/24"])).is_err());
        assert_eq!(c.carve_for_node(&[]).unwrap(), nets(&["10.0.1.0/24"]));
        assert!(c.carve_for_node(&[]).is_err());
        c.release_node(&nets(&["10.0.0.0/26"]));
        assert!(
            c.carve_for_node(&[]).is_err(),
            "10.0.0.64/26 still holds 10.0.0.0/24"
        );
        c.release_node(&nets(&["10.0.0.64/26"]));
        assert_eq!(c.carve_for_node(&[]).unwrap(), nets(&["10.0.0.0/24"]));
    }

    #[test]
    fn a_range_held_apart_over_a_normal_one_is_a_conflict_and_leaves_nothing() {
        let mut c = NodeCidrCarver::new(&v4_config(&["10.0.0.0/22"], 26)).unwrap();
        c.adopt_after_restart(&nets(&["10.0.0.64/26"])).unwrap();
        assert_eq!(
            c.adopt_after_restart(&nets(&["10.0.0.0/24"]))
                .unwrap_err()
                .to_string(),
            "node has CIDRs allocated (10.0.0.0/24) that conflict with requested CIDRs: \
             10.0.0.0/24 overlaps 10.0.0.64/26, which another node holds"
        );
        assert!(c.outside().is_empty());
        assert_eq!(c.sets(Family::V4)[0].allocated_count(), 1);
    }

    #[test]
    fn carve_readopts_one_family_and_allocates_the_other() {
        let mut c = NodeCidrCarver::new(&dual(&["10.0.0.0/16"], 24, &["fd00::/104"], 120)).unwrap();
        assert_eq!(
            c.carve_for_node(&nets(&["fd00::500/120"])).unwrap(),
            nets(&["10.0.0.0/24", "fd00::500/120"])
        );
        assert!(
            c.sets(Family::V6)[0]
                .is_allocated(&net("fd00::500/120"))
                .unwrap()
        );
    }

    #[test]
    fn carve_conflicts() {
        let mut c = NodeCidrCarver::new(&v4_config(&["10.0.0.0/16"], 24)).unwrap();
        c.carve_for_node(&nets(&["10.0.1.0/24"])).unwrap();
        assert_eq!(
            c.carve_for_node(&nets(&["10.0.1.0/24"]))
                .unwrap_err()
                .to_string(),
            "node has CIDRs allocated (10.0.1.0/24) that conflict with requested CIDRs: \
             10.0.1.0/24 is already allocated"
        );
        // Of another size than the pool CIDR's ranges: held apart, not a
        // conflict (the type's rule), and overlapping it is one.
        assert_eq!(
            c.carve_for_node(&nets(&["10.0.2.0/25"])).unwrap(),
            nets(&["10.0.2.0/25"])
        );
        assert_eq!(
            c.carve_for_node(&nets(&["10.0.2.0/23"]))
                .unwrap_err()
                .to_string(),
            "node has CIDRs allocated (10.0.2.0/23) that conflict with requested CIDRs: \
             10.0.2.0/23 overlaps 10.0.2.0/25, which another node holds"
        );
        c.release_node(&nets(&["10.0.2.0/25"]));
        assert_eq!(
            c.carve_for_node(&nets(&["10.9.0.0/24"]))
                .unwrap_err()
                .to_string(),
            "node has CIDRs allocated (10.9.0.0/24) that conflict with requested CIDRs: \
             10.9.0.0/24 is not in any pool of cluster-pool-ipv4-cidr (10.0.0.0/16)"
        );
        assert_eq!(
            c.carve_for_node(&nets(&["10.0.7.0/24", "fd00::/120"]))
                .unwrap_err()
                .to_string(),
            "node has CIDRs allocated (10.0.7.0/24, fd00::/120) that conflict with requested \
             CIDRs: fd00::/120 is an IPv6 CIDR but IPv6 is disabled"
        );
        // Failed calls leave nothing behind (10.0.7.0/24 was reverted).
        assert_eq!(c.sets(Family::V4)[0].allocated_count(), 1);
        // A partially conflicting list is reverted as a whole.
        assert!(
            c.carve_for_node(&nets(&["10.0.8.0/24", "10.0.1.0/24"]))
                .is_err()
        );
        assert!(
            !c.sets(Family::V4)[0]
                .is_allocated(&net("10.0.8.0/24"))
                .unwrap()
        );
        assert_eq!(c.sets(Family::V4)[0].allocated_count(), 1);
        // Duplicates within one node's list are merged, not a conflict.
        assert_eq!(
            c.carve_for_node(&nets(&["10.0.9.0/24", "10.0.9.0/24"]))
                .unwrap(),
            nets(&["10.0.9.0/24"])
        );
    }

    #[test]
    fn full_pool_moves_to_next_cidr_then_exhausts() {
        let mut c = NodeCidrCarver::new(&v4_config(&["10.0.0.0/23", "10.1.0.0/24"], 24)).unwrap();
        assert_eq!(c.carve_for_node(&[]).unwrap(), nets(&["10.0.0.0/24"]));
        assert_eq!(c.carve_for_node(&[]).unwrap(), nets(&["10.0.1.0/24"]));
        assert_eq!(c.carve_for_node(&[]).unwrap(), nets(&["10.1.0.0/24"]));
        let err = c.carve_for_node(&[]).unwrap_err();
        assert_eq!(err.to_string(), "allocator full");
        assert_eq!(err, ClusterPoolError::Exhausted { family: Family::V4 });
        // Releasing a node frees its CIDR for the next one.
        c.release_node(&nets(&["10.0.1.0/24"]));
        assert_eq!(c.carve_for_node(&[]).unwrap(), nets(&["10.0.1.0/24"]));
        // Releasing unknown CIDRs is ignored.
        c.release_node(&nets(&["192.168.0.0/24", "fd00::/120"]));
    }

    #[test]
    fn adopt_allocates_nothing_for_a_missing_family() {
        let mut c = NodeCidrCarver::new(&dual(&["10.0.0.0/16"], 24, &["fd00::/104"], 120)).unwrap();
        assert_eq!(
            c.adopt_node(&nets(&["10.0.4.0/24"])).unwrap(),
            nets(&["10.0.4.0/24"])
        );
        assert_eq!(c.sets(Family::V6)[0].allocated_count(), 0);
        assert!(!c.covers_every_family(&nets(&["10.0.4.0/24"])));
        assert!(c.covers_every_family(&nets(&["10.0.4.0/24", "fd00::/120"])));
        assert_eq!(c.adopt_node(&[]).unwrap(), vec![]);
        // The same checks as carving.
        assert!(matches!(
            c.adopt_node(&nets(&["10.0.4.0/24"])),
            Err(ClusterPoolError::Conflict { .. })
        ));
        // Completing the node later: release, then carve what it holds.
        c.release_node(&nets(&["10.0.4.0/24"]));
        assert_eq!(
            c.carve_for_node(&nets(&["10.0.4.0/24"])).unwrap(),
            nets(&["10.0.4.0/24", "fd00::/120"])
        );
    }

    #[test]
    fn exhausted_second_family_reverts_first() {
        let mut c = NodeCidrCarver::new(&dual(&["10.0.0.0/16"], 24, &["fd00::/120"], 120)).unwrap();
        assert_eq!(
            c.carve_for_node(&[]).unwrap(),
            nets(&["10.0.0.0/24", "fd00::/120"])
        );
        assert!(matches!(
            c.carve_for_node(&[]),
            Err(ClusterPoolError::Exhausted {
                family: Family::V6,
                ..
            })
        ));
        assert_eq!(c.sets(Family::V4)[0].allocated_count(), 1);
    }
}
