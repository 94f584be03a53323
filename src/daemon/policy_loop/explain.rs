//! The policy part of `podnet explain`: for each local pod the answer
//! names, what the policies in the table last written mean for it in each
//! direction (read from the loop's published [`Explanations`], not compiled
//! again), also said in the answer's summary. The policy's answer becomes the
//! wire's `PodPolicy` here.

use crate::api::models::{
    ClusterPolicyRules, DirectionPolicy, ExplainResponse, PodPolicy, PolicyAllows,
};
use crate::policy::Explanations;
use crate::policy::explain as policy;

/// Adds what `explanations` say of the answer's pods (their bound addresses'
/// owners) to `answer`.
pub fn add_policy(answer: &mut ExplainResponse, explanations: &Explanations) {
    let mut owners: Vec<&str> = answer
        .addresses
        .iter()
        .filter(|a| !a.container_id.is_empty())
        .map(|a| a.owner.as_str())
        .collect();
    owners.sort_unstable();
    owners.dedup();
    let pods: Vec<PodPolicy> = owners
        .into_iter()
        .map(|owner| {
            let ips: Vec<std::net::IpAddr> = answer
                .addresses
                .iter()
                .filter(|a| a.owner == owner)
                .filter_map(|a| a.ip.parse().ok())
                .collect();
            let pod = explanations
                .pod(owner, &ips)
                .unwrap_or_else(|| explanations.unrecorded(owner));
            PodPolicy::from(pod)
        })
        .collect();
    for p in &pods {
        let enforced = match p.enforced {
            true => "",
            false => " (not enforced: its host link is not podnet's)",
        };
        answer.summary.push_str(&format!(
            ". NetworkPolicy for {}{enforced}: ingress {}; egress {}",
            p.pod, p.ingress.summary, p.egress.summary
        ));
    }
    answer.policy = pods;
}

impl From<policy::PodPolicy> for PodPolicy {
    fn from(p: policy::PodPolicy) -> PodPolicy {
        PodPolicy {
            pod: p.pod,
            ingress: p.ingress.into(),
            egress: p.egress.into(),
            enforced: p.enforced,
        }
    }
}

impl From<policy::DirectionPolicy> for DirectionPolicy {
    fn from(d: policy::DirectionPolicy) -> DirectionPolicy {
        let policies = d.policies.into_iter().map(|a| PolicyAllows {
            policy: a.policy,
            allows: a.allows,
        });
        let tier = |tier: Vec<policy::ClusterPolicyRules>| {
            let rules = tier.into_iter().map(|p| ClusterPolicyRules {
                policy: p.policy,
                priority: p.priority,
                rules: p.rules,
            });
            rules.collect()
        };
        DirectionPolicy {
            isolated: d.isolated,
            admin: tier(d.admin),
            policies: policies.collect(),
            baseline: tier(d.baseline),
            summary: d.summary,
        }
    }
}

#[cfg(test)]
#[path = "tests/explain.rs"]
mod tests;
