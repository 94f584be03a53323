//! The configuration check as status shows it (`ipam.config-check`): the
//! verdict on the node's facts, and those facts.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::api::models::{ConfigCheckStatus, ConfigFinding};
use crate::daemon::node_check::Verdict;
use crate::node::{NodeFacts, ServiceRange};

/// `verdict` and the `facts` it was made on, with each finding's whole text.
pub fn config_check_status(verdict: &Verdict, facts: &NodeFacts) -> ConfigCheckStatus {
    ConfigCheckStatus {
        fits: verdict.fits(),
        internal_ips: facts.internal_ips.iter().map(IpAddr::to_string).collect(),
        service_cidrs: match &facts.service_range {
            ServiceRange::Known(cidrs) => cidrs.iter().map(IpNet::to_string).collect(),
            ServiceRange::Unknown(_) => Vec::new(),
        },
        service_range_unknown: match &facts.service_range {
            ServiceRange::Known(_) => String::new(),
            ServiceRange::Unknown(why) => why.clone(),
        },
        findings: verdict
            .mismatches
            .iter()
            .map(|m| ConfigFinding {
                severity: m.severity().as_str().into(),
                option: m.option().into(),
                reason: m.reason().into(),
                message: m.to_string(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::config::IpamMode;
    use crate::daemon::node_check::judge;
    use crate::ipam::Family;

    #[test]
    fn the_status_lists_the_facts_and_every_finding() {
        let facts = NodeFacts {
            internal_ips: vec!["10.0.0.1".parse().unwrap()],
            service_range: ServiceRange::Unknown("not served".into()),
        };
        let dual = [Family::V6, Family::V4];
        let verdict = judge(&dual, IpamMode::ClusterPool, None, &[], "n1", &facts);
        let s = config_check_status(&verdict, &facts);
        assert!(!s.fits);
        assert_eq!(s.internal_ips, ["10.0.0.1"]);
        assert!(s.service_cidrs.is_empty());
        assert_eq!(s.service_range_unknown, "not served");
        assert_eq!(s.findings.len(), 1);
        assert_eq!(
            (
                s.findings[0].severity.as_str(),
                s.findings[0].option.as_str()
            ),
            ("error", "enable-ipv6")
        );
    }
}
