//! One node range's fill: how many of its addresses are in use, how many can be
//! handed out and whether more can come. The daemon's status reports it and
//! says a range is full by it.

use super::Family;

/// The fill of one range of a node: a family's blocks of one pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeFill {
    pub family: Family,
    /// The range's blocks, space-separated.
    pub cidr: String,
    /// Addresses in use, infrastructure (router, health, ingress) included.
    pub used: u64,
    /// Addresses that can be handed out at all (network/broadcast excluded).
    pub usable: u64,
    /// Of `used`, addresses released recently and still cooling down.
    pub cooling: u64,
    /// The pool (`default` in the host-scope modes).
    pub pool: String,
    /// Multi-pool: the operator can still add blocks to this pool.
    pub can_grow: bool,
}

impl RangeFill {
    /// True when no address can be handed out and no more can come.
    pub fn is_exhausted(&self) -> bool {
        self.used >= self.usable && !self.can_grow
    }
}
