//! The leader's duplicate check (`--ipam-duplicate-check-interval`, at start and
//! then every interval): it lists every Pod and CiliumNode (one cluster-wide Pod
//! list per check, in pages; nothing is watched or kept between checks) and
//! runs [`crate::ipam::duplicates::check`]. A finding found by two checks in a
//! row (the second one [`CONFIRM_AFTER`] later, at most the interval) is
//! reported once: a warning in the log, a Kubernetes Event on each Pod and
//! CiliumNode it concerns (reasons `DuplicatePodIP`, `PodIPOutsideNodeRanges`,
//! `OverlappingNodeRanges`), and the gauge `podnet_operator_ipam_findings{kind}`
//! counts every confirmed finding of each kind until it goes away. A check that
//! cannot read leaves the gauge as it was and counts in
//! `podnet_operator_ipam_checks_total{result="failed"}`.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, Recorder};

use super::FIELD_MANAGER;
use super::metrics::OperatorMetrics;
use crate::ipam::duplicates::{Confirmation, Finding, check};
use crate::k8s::address_views::{Listed, read};
use crate::k8s::events;

/// How soon a check that found something new checks again to confirm it.
pub const CONFIRM_AFTER: Duration = Duration::from_secs(30);

/// The longest note an Event takes (the API server refuses more than 1 kB).
const NOTE_MAX: usize = 1000;

/// Runs the check every `interval` while this replica leads.
pub async fn run(
    client: kube::Client,
    identity: &str,
    interval: Duration,
    metrics: &OperatorMetrics,
) -> Infallible {
    let recorder = events::recorder(client.clone(), FIELD_MANAGER, identity);
    let mut confirmation = Confirmation::default();
    loop {
        let wait = match read(&client).await {
            Ok(listed) => {
                metrics.checked("ok");
                let report = check(&listed.pods, &listed.node_ranges());
                let confirmed = confirmation.observe(&report.findings);
                metrics.set_findings(&confirmed.current);
                for finding in &confirmed.new {
                    tracing::warn!(reason = finding.kind().event_reason(), "{finding}");
                    publish(&recorder, &listed, finding).await;
                }
                if confirmed.suspected > 0 {
                    interval.min(CONFIRM_AFTER)
                } else {
                    interval
                }
            }
            Err(e) => {
                metrics.checked("failed");
                tracing::warn!(error = %e, "the duplicate check could not read the Pods and CiliumNodes; it tries again at the next interval");
                interval
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// One Event per object the finding concerns.
async fn publish(recorder: &Recorder, listed: &Listed, finding: &Finding) {
    let event = event(finding);
    for object in regarding(listed, finding) {
        if let Err(e) = recorder.publish(&event, &object).await {
            tracing::warn!(error = %e, object = ?object.name, reason = event.reason, "publishing the Event failed");
        }
    }
}

/// The finding's Event: action `CheckIPAM <what it is about>` (the address, or
/// the ranges), so two findings of one kind on one object are two Events, not
/// one series naming the first (`k8s::events`).
fn event(finding: &Finding) -> Event {
    events::event(
        true,
        finding.kind().event_reason(),
        &note(finding),
        "CheckIPAM",
        &subject(finding),
    )
}

/// What a finding is about: its address, or its ranges.
fn subject(finding: &Finding) -> String {
    match finding {
        Finding::SameIp { ip, .. } | Finding::OutsideNodeRanges { ip, .. } => ip.to_string(),
        Finding::RangeOnTwoNodes { ranges } => {
            let cidrs: BTreeSet<String> = ranges.iter().map(|r| r.cidr.to_string()).collect();
            cidrs.into_iter().collect::<Vec<_>>().join(", ")
        }
    }
}

/// The finding as an Event's note, cut to [`NOTE_MAX`] bytes.
fn note(finding: &Finding) -> String {
    let mut note = finding.to_string();
    if note.len() > NOTE_MAX {
        let mut end = NOTE_MAX - 3;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push_str("...");
    }
    note
}

/// The Pods and CiliumNodes a finding concerns.
pub fn regarding(listed: &Listed, finding: &Finding) -> Vec<ObjectReference> {
    let pod = |namespace: &str, name: &str, uid: &str| ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(namespace.into()),
        name: Some(name.into()),
        uid: Some(uid.into()).filter(|u: &String| !u.is_empty()),
        ..Default::default()
    };
    let node = |name: &str| {
        let found = listed.cilium_nodes.iter().find(|n| n.metadata.name == name);
        ObjectReference {
            api_version: Some(
                found
                    .map(|n| n.api_version.clone())
                    .unwrap_or_else(|| "cilium.io/v2".into()),
            ),
            kind: Some("CiliumNode".into()),
            name: Some(name.into()),
            uid: found
                .map(|n| n.metadata.uid().to_string())
                .filter(|u| !u.is_empty()),
            ..Default::default()
        }
    };
    match finding {
        Finding::SameIp { pods, .. } => pods
            .iter()
            .map(|p| pod(&p.namespace, &p.name, &p.uid))
            .collect(),
        Finding::OutsideNodeRanges {
            pod: p, node: n, ..
        } => {
            vec![pod(&p.namespace, &p.name, &p.uid), node(n)]
        }
        Finding::RangeOnTwoNodes { .. } => finding.nodes().into_iter().map(node).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::duplicates::{HeldRange, NodeRange, PodRef, RangeSource};
    use crate::resources::NodeResource;

    fn pod(name: &str) -> PodRef {
        PodRef {
            namespace: "shop".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            node: "n1".into(),
        }
    }

    fn refs(objects: &[ObjectReference]) -> Vec<String> {
        objects
            .iter()
            .map(|o| {
                format!(
                    "{} {} {}/{} {}",
                    o.api_version.as_deref().unwrap_or(""),
                    o.kind.as_deref().unwrap_or(""),
                    o.namespace.as_deref().unwrap_or(""),
                    o.name.as_deref().unwrap_or(""),
                    o.uid.as_deref().unwrap_or("")
                )
            })
            .collect()
    }

    #[test]
    fn events_go_on_the_pods_and_cilium_nodes_of_a_finding() {
        let mut n1: NodeResource = NodeResource::new("n1");
        n1.metadata
            .extra
            .insert("uid".into(), serde_json::json!("cn-uid-1"));
        let listed = Listed {
            pods: Vec::new(),
            cilium_nodes: vec![n1],
        };
        let same = Finding::SameIp {
            ip: "10.0.0.5".parse().unwrap(),
            pods: vec![pod("a"), pod("b")],
        };
        assert_eq!(
            refs(&regarding(&listed, &same)),
            ["v1 Pod shop/a uid-a", "v1 Pod shop/b uid-b"]
        );
        let outside = Finding::OutsideNodeRanges {
            pod: pod("a"),
            ip: "10.9.0.1".parse().unwrap(),
            node: "n1".into(),
            ranges: vec![NodeRange {
                cidr: "10.0.0.0/24".parse().unwrap(),
                source: RangeSource::PodCidr,
            }],
        };
        assert_eq!(
            refs(&regarding(&listed, &outside)),
            [
                "v1 Pod shop/a uid-a",
                "cilium.io/v2 CiliumNode /n1 cn-uid-1"
            ]
        );
        // A CiliumNode not listed (deleted meanwhile) is named without a UID.
        let overlap = Finding::RangeOnTwoNodes {
            ranges: ["n1", "n2"]
                .map(|node| HeldRange {
                    node: node.into(),
                    cidr: "10.0.0.0/24".parse().unwrap(),
                    source: RangeSource::PodCidr,
                })
                .to_vec(),
        };
        assert_eq!(
            refs(&regarding(&listed, &overlap)),
            [
                "cilium.io/v2 CiliumNode /n1 cn-uid-1",
                "cilium.io/v2 CiliumNode /n2 "
            ]
        );
    }

    #[test]
    fn a_long_note_is_cut_on_a_character_boundary() {
        let many = Finding::SameIp {
            ip: "10.0.0.5".parse().unwrap(),
            pods: (0..80).map(|i| pod(&format!("ööö{i}"))).collect(),
        };
        let text = note(&many);
        assert!(many.to_string().len() > NOTE_MAX);
        // The cut falls inside an "ö".
        assert!(!many.to_string().is_char_boundary(NOTE_MAX - 3));
        assert!(text.len() <= NOTE_MAX && text.ends_with("..."), "{text}");
        assert!(many.to_string().starts_with(text.trim_end_matches("...")));
        let short = Finding::SameIp {
            ip: "10.0.0.5".parse().unwrap(),
            pods: vec![pod("a"), pod("b")],
        };
        assert_eq!(note(&short), short.to_string());
    }

    #[test]
    fn findings_about_two_addresses_on_one_pod_are_two_series() {
        let first = Finding::SameIp {
            ip: "10.0.0.5".parse().unwrap(),
            pods: vec![pod("a"), pod("b")],
        };
        let second = Finding::SameIp {
            ip: "10.0.0.6".parse().unwrap(),
            pods: vec![pod("a"), pod("c")],
        };
        let (first, second) = (event(&first), event(&second));
        assert_eq!(first.reason, second.reason);
        assert_eq!(first.action, "CheckIPAM 10.0.0.5");
        assert_ne!(first.action, second.action);
    }
}
