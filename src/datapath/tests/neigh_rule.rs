//! Proxy NDP entries and policy-routing rules.

use std::net::IpAddr;

use super::addr_route::pod_with_eth0;
use super::{in_private_netns, root};
use crate::datapath::*;

#[test]
fn proxy_ndp_add_list_delete() {
    if !root("proxy_ndp_add_list_delete") {
        return;
    }
    in_private_netns(|| {
        let (_pod, _s, _eth0, host, lxc) = pod_with_eth0("pod-ndp");
        let ip: IpAddr = "fd00::5".parse().unwrap();
        let other: IpAddr = "fd00::6".parse().unwrap();
        host.add_proxy_neighbour(lxc, ip).unwrap();
        host.add_proxy_neighbour(lxc, other).unwrap();
        let mut list = host.list_proxy_neighbours(lxc).unwrap();
        list.sort();
        assert_eq!(list, vec![ip, other]);
        // The kernel ignores NLM_F_EXCL for proxy entries: re-adding is a no-op.
        host.add_proxy_neighbour(lxc, ip).unwrap();
        assert_eq!(host.list_proxy_neighbours(lxc).unwrap().len(), 2);
        let lo = host.link_by_name("lo").unwrap().unwrap().index;
        assert!(host.list_proxy_neighbours(lo).unwrap().is_empty());

        host.delete_proxy_neighbour(lxc, ip).unwrap();
        assert_eq!(host.list_proxy_neighbours(lxc).unwrap(), vec![other]);
        let e = host.delete_proxy_neighbour(lxc, ip).unwrap_err();
        assert!(e.is_not_found(), "{e}");
        assert!(
            e.to_string()
                .starts_with(&format!("deleting proxy neighbour fd00::5 on link #{lxc}")),
            "{e}"
        );
        host.delete_proxy_neighbour(lxc, other).unwrap();
        assert!(host.list_proxy_neighbours(lxc).unwrap().is_empty());
    });
}

#[test]
fn rules_add_list_delete() {
    if !root("rules_add_list_delete") {
        return;
    }
    in_private_netns(|| {
        let s = NetlinkSocket::new().unwrap();
        for ip in ["10.1.0.5", "fd00::5"] {
            let ip: IpAddr = ip.parse().unwrap();
            let fam = IpFamily::of(&ip);
            let defaults = s.list_rules(fam).unwrap();
            assert!(
                defaults
                    .iter()
                    .any(|r| r.table == TABLE_MAIN && r.priority == 32766),
                "{defaults:?}"
            );

            let from = RuleSpec::from_ip(ip, 100, 110);
            let to = RuleSpec::to_ip_main(ip, 20);
            s.add_rule(&from).unwrap();
            s.add_rule(&to).unwrap();
            let rules = s.list_rules(fam).unwrap();
            assert!(rules.contains(&from), "{rules:?}");
            assert!(rules.contains(&to), "{rules:?}");
            let e = s.add_rule(&from).unwrap_err();
            assert!(e.is_exists(), "{e}");

            s.delete_rule(&from).unwrap();
            s.delete_rule(&to).unwrap();
            assert_eq!(s.list_rules(fam).unwrap(), defaults);
            let e = s.delete_rule(&from).unwrap_err();
            assert!(e.is_not_found(), "{e}");
            assert!(
                e.to_string()
                    .starts_with("deleting rule priority 110 from "),
                "{e}"
            );
        }
        let mut bad = RuleSpec::from_ip("10.0.0.1".parse().unwrap(), 100, 1);
        bad.family = IpFamily::V6;
        assert!(matches!(s.add_rule(&bad), Err(DatapathError::Invalid(_))));
    });
}
