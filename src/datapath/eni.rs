//! ENI-class routing of one pod (Cilium's `pkg/datapath/linux/routing`): an
//! ingress rule sends traffic to the pod through the main table, an egress rule
//! sends traffic from the pod to the ENI's own table (10 + interface number), whose
//! routes leave through the ENI device towards the subnet's gateway.

use std::net::IpAddr;

use ipnet::IpNet;

use super::route::{IpFamily, TABLE_MAIN};
use super::rule::RuleSpec;

/// Priority of the rule `to <pod> lookup main`.
pub const RULE_PRIORITY_INGRESS: u32 = 20;
/// Priority of the rule `from <pod> lookup <10 + n>`.
pub const RULE_PRIORITY_EGRESS: u32 = 111;
/// The ENI tables are `10 + interface number`.
pub const ROUTE_TABLE_INTERFACES_OFFSET: u32 = 10;

/// The table of ENI number `n`.
pub fn eni_table(interface_number: u32) -> u32 {
    ROUTE_TABLE_INTERFACES_OFFSET + interface_number
}

/// The ingress and egress rules of one pod address on ENI `n`.
pub fn eni_rules(pod_ip: IpAddr, interface_number: u32) -> [RuleSpec; 2] {
    let family = IpFamily::of(&pod_ip);
    let host = IpNet::from(pod_ip);
    [
        RuleSpec {
            family,
            src: None,
            dst: Some(host),
            table: TABLE_MAIN,
            priority: RULE_PRIORITY_INGRESS,
        },
        RuleSpec {
            family,
            src: Some(host),
            dst: None,
            table: eni_table(interface_number),
            priority: RULE_PRIORITY_EGRESS,
        },
    ]
}

/// True for a rule `eni_rules` makes for `ip`.
pub fn is_pod_rule(rule: &RuleSpec, ip: IpAddr) -> bool {
    let host = Some(IpNet::from(ip));
    (rule.priority == RULE_PRIORITY_INGRESS && rule.dst == host && rule.src.is_none())
        || (rule.priority == RULE_PRIORITY_EGRESS && rule.src == host && rule.dst.is_none())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_cilium() {
        let ip: IpAddr = "10.0.1.20".parse().unwrap();
        let [ing, eg] = eni_rules(ip, 1);
        assert_eq!(
            (ing.priority, ing.table, ing.dst),
            (20, 254, Some("10.0.1.20/32".parse().unwrap()))
        );
        assert_eq!(
            (eg.priority, eg.table, eg.src),
            (111, 11, Some("10.0.1.20/32".parse().unwrap()))
        );
        assert!(is_pod_rule(&ing, ip) && is_pod_rule(&eg, ip));
        assert!(!is_pod_rule(&ing, "10.0.1.21".parse().unwrap()));
        let [ing6, _] = eni_rules("fd00::1".parse().unwrap(), 0);
        assert_eq!(ing6.dst, Some("fd00::1/128".parse().unwrap()));
    }
}
