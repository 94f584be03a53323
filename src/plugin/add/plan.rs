//! The daemon's answer read as what the datapath set-up does per family: the
//! pod's address, its router, and in ENI-class modes the ENI it belongs to.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::api::models::{IpamAddressResponse, IpamResponse};
use crate::cni::CniError;

/// One family's address and router, as the daemon handed them out.
pub(super) struct FamilyPlan {
    pub ip: IpAddr,
    pub router: IpAddr,
    /// ENI-class modes: the ENI the address belongs to.
    pub eni: Option<EniPlan>,
}

/// The ENI routing of one address (from the IPAM response).
pub(super) struct EniPlan {
    pub mac: [u8; 6],
    pub number: u32,
    pub gateway: IpAddr,
}

impl FamilyPlan {
    /// The pod's address as a host route (/32 or /128).
    pub fn host_net(&self) -> IpNet {
        IpNet::from(self.ip)
    }
    /// The router's address as a host route.
    pub fn router_net(&self) -> IpNet {
        IpNet::from(self.router)
    }
    /// The family's default route.
    pub fn default_net(&self) -> IpNet {
        match self.ip {
            IpAddr::V4(_) => "0.0.0.0/0".parse().unwrap_or(IpNet::from(self.ip)),
            IpAddr::V6(_) => "::/0".parse().unwrap_or(IpNet::from(self.ip)),
        }
    }
}

/// The addresses the daemon gave, IPv6 first (Cilium's order). A family counts only
/// when it has an address and the daemon reports its router.
pub(super) fn plan_families(alloc: &IpamResponse) -> Result<Vec<FamilyPlan>, CniError> {
    let mut plans = Vec::new();
    for (ip, node, detail) in [
        (
            &alloc.address.ipv6,
            &alloc.host_addressing.ipv6,
            &alloc.ipv6,
        ),
        (
            &alloc.address.ipv4,
            &alloc.host_addressing.ipv4,
            &alloc.ipv4,
        ),
    ] {
        let Some(node) = node.as_ref().filter(|n| n.enabled && !ip.is_empty()) else {
            continue;
        };
        let ip: IpAddr = ip.split('/').next().unwrap_or("").parse().map_err(|_| {
            CniError::daemon_rejected(format!("invalid IPAM response: address {ip:?}"))
        })?;
        let router: IpAddr = node.ip.parse().map_err(|_| {
            CniError::daemon_rejected(format!(
                "invalid IPAM response: router address {:?}",
                node.ip
            ))
        })?;
        let eni = detail
            .as_ref()
            .filter(|d| !d.master_mac.is_empty())
            .map(eni_plan)
            .transpose()?
            .flatten();
        plans.push(FamilyPlan { ip, router, eni });
    }
    if plans.is_empty() {
        return Err(CniError::daemon_rejected(
            "IPAM did provide neither IPv4 nor IPv6 address",
        ));
    }
    Ok(plans)
}

/// The ENI routing the daemon asks for: MAC, interface number and gateway (no
/// gateway, e.g. IPv6 without a subnet, means no ENI routing, as in Cilium).
fn eni_plan(d: &IpamAddressResponse) -> Result<Option<EniPlan>, CniError> {
    let bad = |what: &str| CniError::daemon_rejected(format!("invalid IPAM response: {what}"));
    let Ok(gateway) = d.gateway.parse::<IpAddr>() else {
        return Ok(None);
    };
    let mut mac = [0u8; 6];
    let parts: Vec<&str> = d.master_mac.split(':').collect();
    if parts.len() != 6 {
        return Err(bad(&format!("master-mac {:?}", d.master_mac)));
    }
    for (b, p) in mac.iter_mut().zip(parts) {
        *b = u8::from_str_radix(p, 16)
            .map_err(|_| bad(&format!("master-mac {:?}", d.master_mac)))?;
    }
    let number = d
        .interface_number
        .parse::<u32>()
        .map_err(|_| bad(&format!("interface-number {:?}", d.interface_number)))?;
    Ok(Some(EniPlan {
        mac,
        number,
        gateway,
    }))
}
