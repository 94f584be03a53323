//! The REST API's answers built from the state's own types: each file takes
//! what an `IpamState` call returned and makes the wire shape of `api::models`
//! (the routes call the state, then these). The state itself knows no wire type.

pub mod cidrs;
pub mod config_check;
pub mod explain;
pub mod restore;
