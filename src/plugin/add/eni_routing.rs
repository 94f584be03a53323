//! ENI-class modes: the pod's policy rules and its ENI's routing table, on the
//! host (Cilium §3.3).

use ipnet::IpNet;

use crate::cni::CniError;
use crate::datapath::{NetlinkSocket, RouteSpec, RuleSpec, eni_rules, eni_table, format_mac};

use super::super::datapath_errors::dp;
use super::plan::{EniPlan, FamilyPlan};

/// The pod's rules and its ENI's table: `to <pod> lookup main` (priority 20),
/// `from <pod> lookup 10+n` (111), and in table 10+n a link route to the gateway
/// and a default route via it, through the ENI device found by its MAC; nothing
/// for a family without ENI routing. Each rule it adds goes into `added_rules` at
/// once, so a rollback removes exactly those (a rule that already existed is not
/// this ADD's); the table's routes are shared by the ENI's pods and stay, as on
/// DEL.
pub(super) fn install(
    host_sock: &NetlinkSocket,
    p: &FamilyPlan,
    added_rules: &mut Vec<RuleSpec>,
) -> Result<(), CniError> {
    let Some(eni) = &p.eni else {
        return Ok(());
    };
    let device = eni_device(host_sock, eni)?;
    let table = eni_table(eni.number);
    for r in [
        RouteSpec {
            dst: IpNet::from(eni.gateway),
            gateway: None,
            oif: device,
            scope_link: true,
            mtu: None,
            table: Some(table),
            priority: None,
            onlink: false,
            prefsrc: None,
            protocol: None,
        },
        RouteSpec {
            dst: p.default_net(),
            gateway: Some(eni.gateway),
            oif: device,
            scope_link: false,
            mtu: None,
            table: Some(table),
            priority: None,
            onlink: false,
            prefsrc: None,
            protocol: None,
        },
    ] {
        host_sock
            .replace_route(&r)
            .map_err(dp("adding the ENI table route"))?;
    }
    for rule in eni_rules(p.ip, eni.number) {
        match host_sock.add_rule(&rule) {
            Ok(()) => added_rules.push(rule),
            Err(e) if e.is_exists() => {}
            Err(e) => return Err(dp("adding the ENI rule")(e)),
        }
    }
    Ok(())
}

/// The index of the host link that is the ENI (found by its MAC; podnet's own
/// links are never it).
fn eni_device(host_sock: &NetlinkSocket, eni: &EniPlan) -> Result<u32, CniError> {
    let links = host_sock.list_links().map_err(dp("listing host links"))?;
    links
        .iter()
        .find(|l| {
            l.mac == Some(eni.mac) && !l.name.starts_with("lxc") && !l.name.starts_with("podnet_")
        })
        .map(|l| l.index)
        .ok_or_else(|| {
            CniError::datapath_failure(format!(
                "the ENI with MAC {} (interface number {}) is on no host link: the ENI inventory and the node disagree",
                format_mac(&eni.mac),
                eni.number
            ))
        })
}
