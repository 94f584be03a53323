//! What the steps after the allocation work with: the request, the daemon's
//! answer and configuration, and the two sides of the pod's link.

use crate::api::client::Client;
use crate::api::models::{DaemonConfigurationStatus, IpamResponse};
use crate::cni::bandwidth::BandwidthLimits;
use crate::cni::{CniEnv, NetConf};

use super::sides::Sides;

/// One ADD after its allocation.
pub(super) struct Attempt<'a> {
    pub env: &'a CniEnv,
    pub conf: &'a NetConf,
    pub client: &'a Client,
    pub alloc: &'a IpamResponse,
    pub daemon_cfg: &'a DaemonConfigurationStatus,
    /// delegated-plugin mode: the addresses are the delegated IPAM plugin's.
    pub delegated: bool,
    pub sides: &'a Sides<'a>,
    pub container_id: &'a str,
    /// `runtimeConfig.bandwidth`, checked.
    pub limits: Option<BandwidthLimits>,
}

impl Attempt<'_> {
    /// The MTU of the pod's default route, when the daemon sets one.
    pub fn route_mtu(&self) -> Option<u32> {
        let mtu = self.daemon_cfg.route_mtu;
        (mtu > 0).then_some(mtu)
    }
}
