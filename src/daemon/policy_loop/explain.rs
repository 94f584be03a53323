//! The NetworkPolicy part of `podnet explain`: for each local pod the answer
//! names, what the policies in the table last written mean for it in each
//! direction (read from the loop's published [`Explanations`], not compiled
//! again), also said in the answer's summary.

use crate::api::models::{ExplainResponse, PodPolicy};
use crate::policy::Explanations;

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
            explanations
                .pod(owner, &ips)
                .unwrap_or_else(|| explanations.unrecorded(owner))
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

#[cfg(test)]
#[path = "tests/explain.rs"]
mod tests;
