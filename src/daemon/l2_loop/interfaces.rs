//! Where this node answers for an address: the links a policy's `interfaces`
//! patterns match (none given: the links that carry the node's InternalIPs),
//! among the node's own Ethernet links that are up (never loopback, a pod's
//! host link or podnet's tunnel), and of those only the ones with a subnet
//! that holds the address: nobody on a link asks for an address outside its
//! subnets, so announcing it there would only hide the mistake.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use crate::datapath::{DatapathError, LinkInfo, NetlinkSocket};
use crate::l2announce::views::Pattern;

/// One link of the node that could answer: its name and its addresses (with
/// their prefix lengths: the subnets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub name: String,
    pub addresses: Vec<IpNet>,
}

/// Whether `link` is one of the node's own Ethernet links that may answer.
fn may_answer(link: &LinkInfo) -> bool {
    let podnets = link
        .alias
        .as_deref()
        .is_some_and(|a| a.starts_with("podnet"));
    let kind_ok = !matches!(link.kind.as_deref(), Some("vxlan" | "netkit"));
    link.up && link.mac.is_some() && link.name != "lo" && !podnets && kind_ok
}

/// The node's links that may answer, with their subnets (read over netlink:
/// call from a blocking thread).
pub fn links() -> Result<Vec<Link>, DatapathError> {
    let nl = NetlinkSocket::new()?;
    let mut out = Vec::new();
    for link in nl.list_links()?.into_iter().filter(may_answer) {
        let addresses = nl.list_addresses(link.index)?;
        out.push(Link {
            name: link.name,
            addresses,
        });
    }
    Ok(out)
}

/// Where `address` is answered, or why nowhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placed {
    On(Vec<String>),
    /// No link matches the patterns (or carries an InternalIP).
    NoLink,
    /// Links match, none with a subnet holding the address: their names and
    /// subnets.
    OutsideSubnets(Vec<String>),
}

/// Places `address` on `links` by `patterns` (empty: the links with one of
/// `internal_ips`).
pub fn place(
    address: IpAddr,
    patterns: &[Pattern],
    internal_ips: &[IpAddr],
    links: &[Link],
) -> Placed {
    let chosen: Vec<&Link> = links
        .iter()
        .filter(|l| match patterns.is_empty() {
            true => l.addresses.iter().any(|a| internal_ips.contains(&a.addr())),
            false => patterns.iter().any(|p| p.matches(&l.name)),
        })
        .collect();
    if chosen.is_empty() {
        return Placed::NoLink;
    }
    let on: Vec<String> = chosen
        .iter()
        .filter(|l| l.addresses.iter().any(|a| a.contains(&address)))
        .map(|l| l.name.clone())
        .collect();
    match on.is_empty() {
        false => Placed::On(on),
        true => Placed::OutsideSubnets(
            chosen
                .iter()
                .map(|l| format!("{} ({})", l.name, subnets_text(&l.addresses)))
                .collect(),
        ),
    }
}

/// A link's subnets, as `10.251.0.0/24, fd00:10:251::/64`.
fn subnets_text(addresses: &[IpNet]) -> String {
    match addresses.is_empty() {
        true => "no address".into(),
        false => {
            let subnets: Vec<String> = addresses.iter().map(|a| a.trunc().to_string()).collect();
            subnets.join(", ")
        }
    }
}

/// The addresses to answer by link, from each address's placement.
pub fn by_link(placed: &BTreeMap<IpAddr, Placed>) -> BTreeMap<String, BTreeSet<IpAddr>> {
    let mut out: BTreeMap<String, BTreeSet<IpAddr>> = BTreeMap::new();
    for (address, p) in placed {
        if let Placed::On(links) = p {
            for l in links {
                out.entry(l.clone()).or_default().insert(*address);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::l2announce::views::PolicyView;
    use crate::resources::CiliumL2AnnouncementPolicy;

    fn link(name: &str, addresses: &[&str]) -> Link {
        Link {
            name: name.into(),
            addresses: addresses.iter().map(|a| a.parse().unwrap()).collect(),
        }
    }

    fn patterns(p: &[&str]) -> Vec<Pattern> {
        let policy: CiliumL2AnnouncementPolicy = serde_json::from_value(json!({
            "metadata": {"name": "p"}, "spec": {"loadBalancerIPs": true, "interfaces": p}
        }))
        .unwrap();
        PolicyView::from_resource(&policy).interfaces
    }

    fn ip(a: &str) -> IpAddr {
        a.parse().unwrap()
    }

    fn links() -> Vec<Link> {
        vec![
            link("eth0", &["10.251.0.11/24", "fd00:10:251::11/64"]),
            link("eth1", &["192.168.7.2/24"]),
            link("veth9", &[]),
        ]
    }

    #[test]
    fn without_patterns_the_links_with_an_internal_ip_answer() {
        let node = [ip("10.251.0.11")];
        let placed = place(ip("10.251.0.200"), &[], &node, &links());
        assert_eq!(placed, Placed::On(vec!["eth0".into()]));
        let v6 = place(ip("fd00:10:251::200"), &[], &node, &links());
        assert_eq!(v6, Placed::On(vec!["eth0".into()]));
        assert_eq!(
            place(ip("10.251.0.200"), &[], &[], &links()),
            Placed::NoLink
        );
    }

    #[test]
    fn patterns_pick_the_links_and_only_those_whose_subnet_holds_the_address_answer() {
        let node = [ip("10.251.0.11")];
        let both = patterns(&["^eth"]);
        assert_eq!(
            place(ip("192.168.7.50"), &both, &node, &links()),
            Placed::On(vec!["eth1".into()])
        );
        assert_eq!(
            place(ip("10.251.0.200"), &both, &node, &links()),
            Placed::On(vec!["eth0".into()])
        );
        assert_eq!(
            place(ip("10.251.0.200"), &patterns(&["^wlan"]), &node, &links()),
            Placed::NoLink
        );
        let outside = place(ip("203.0.113.9"), &both, &node, &links());
        assert_eq!(
            outside,
            Placed::OutsideSubnets(vec![
                "eth0 (10.251.0.0/24, fd00:10:251::/64)".into(),
                "eth1 (192.168.7.0/24)".into()
            ])
        );
        // Cilium's matching: unanchored.
        assert_eq!(
            place(ip("192.168.7.50"), &patterns(&["th1"]), &node, &links()),
            Placed::On(vec!["eth1".into()])
        );
    }

    #[test]
    fn the_placed_addresses_group_by_link() {
        let placed = BTreeMap::from([
            (ip("10.251.0.200"), Placed::On(vec!["eth0".into()])),
            (ip("fd00:10:251::200"), Placed::On(vec!["eth0".into()])),
            (ip("192.168.7.50"), Placed::On(vec!["eth1".into()])),
            (ip("203.0.113.9"), Placed::NoLink),
        ]);
        let by = by_link(&placed);
        assert_eq!(by.len(), 2);
        assert_eq!(by["eth0"].len(), 2);
        assert_eq!(by["eth1"], BTreeSet::from([ip("192.168.7.50")]));
    }
}
