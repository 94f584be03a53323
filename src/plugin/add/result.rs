//! The CNI result of a wired pod, in the config's version.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::cni::{CniError, CniResult, Interface, IpConfig, Route};
use crate::datapath::format_mac;

use super::attempt::Attempt;
use super::link_pair::LinkPair;
use super::plan::FamilyPlan;

impl Attempt<'_> {
    /// The CNI result: the host interface first, the pod interface second, the
    /// addresses on the pod interface with their routes, in the config's version.
    pub(super) fn result(&self, pair: &LinkPair, plans: &[FamilyPlan]) -> Result<String, CniError> {
        let (conf, mtu, sides) = (self.conf, self.daemon_cfg.device_mtu, self.sides);
        let route_mtu = self.route_mtu();
        let ips = plans
            .iter()
            .map(|p| IpConfig {
                address: p.host_net(),
                gateway: Some(p.router),
                interface: Some(1),
            })
            .collect();
        let routes = plans
            .iter()
            .flat_map(|p| {
                [
                    result_route(p.router_net(), None, None),
                    result_route(p.default_net(), Some(p.router), route_mtu),
                ]
            })
            .collect();
        let result = CniResult {
            cni_version: conf.cni_version.clone(),
            interfaces: vec![
                Interface {
                    name: sides.host_name.clone(),
                    mac: pair.host_mac.as_ref().map(format_mac),
                    mtu: Some(mtu),
                    ..Default::default()
                },
                Interface {
                    name: sides.ifname.to_string(),
                    mac: pair.pod_mac.as_ref().map(format_mac),
                    mtu: Some(mtu),
                    sandbox: Some(sides.netns_path.display().to_string()),
                    ..Default::default()
                },
            ],
            ips,
            routes,
            dns: None,
        };
        serde_json::to_string(&result.to_json(&conf.cni_version))
            .map_err(|e| CniError::io_failure(format!("encoding the result: {e}")))
    }
}

fn result_route(dst: IpNet, gw: Option<IpAddr>, mtu: Option<u32>) -> Route {
    Route {
        dst,
        gw,
        mtu,
        advmss: None,
        priority: None,
        table: None,
        scope: None,
    }
}
