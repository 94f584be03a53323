//! The daemon's configuration as the plugin needs it (`GET /v1/config`, the
//! allocation answer and a `delegated-plugin` refusal carry it): the modes, the
//! MTU and each family's router and alloc range.

use std::net::IpAddr;

use super::super::config::{DatapathMode, IpamMode};
use crate::ipam::Family;

/// The daemon's configuration as the plugin needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeConfig {
    /// Each enabled family.
    pub addressing: Vec<FamilyAddressing>,
    pub ipam_mode: IpamMode,
    /// The pods' device and route MTU.
    pub mtu: u32,
    /// The pod device type in use, and as configured.
    pub datapath_mode: DatapathMode,
    pub configured_datapath_mode: DatapathMode,
    pub node_name: String,
    /// Whether the plugin shapes `runtimeConfig.bandwidth`.
    pub bandwidth_manager: bool,
}

/// One family's router address and the node's alloc range of it: the node
/// CIDR (host-scope) or the first block of the default pool (multi-pool).
#[derive(Debug, Clone, PartialEq)]
pub struct FamilyAddressing {
    pub family: Family,
    pub router: Option<IpAddr>,
    pub alloc_range: Option<String>,
}
