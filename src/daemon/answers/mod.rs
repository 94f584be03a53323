//! The daemon's REST answers: each builds a wire shape of `api::models` from
//! what the state returns (and turns a request body into the state's request),
//! so the state holds no wire type. The routes (`daemon::routes`) call the
//! state, then these.

pub mod cidrs;
pub mod config_check;
pub mod explain;
pub mod ipam;
pub mod restore;
pub mod status;
#[cfg(test)]
mod tests;
