//! The agents' leak reports as the API server keeps them: the `IPAMLeak` and
//! `IPAMLeakReleased` Events each agent's leak check posts on its Node
//! (`daemon::leak_check`). `podnet ipam check` reads them to show, per node,
//! the leaks an agent found and has not released, with the agent's evidence:
//! the one part of the check the API server alone cannot do (whether a
//! sandbox is gone is known on the node). The API server keeps Events for its
//! `--event-ttl` (1 h by default), so a leak older than that is not seen here.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use serde::Serialize;

use super::objects::{ListError, list_pages};
use crate::ipam::leaks::{REASON_LEAK, REASON_RELEASED, note_address};

/// One leak Event on a Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeakEvent {
    pub node: String,
    pub released: bool,
    pub ip: IpAddr,
    pub note: String,
    /// When it was last seen (a repeated Event counts its newest occurrence).
    pub time: Option<Timestamp>,
}

/// A leak an agent reported and has not released.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentLeak {
    pub ip: IpAddr,
    /// The agent's finding: the pod, the evidence that it is gone, the host link.
    pub note: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reported_at: Option<String>,
}

/// Every leak Event on a Node, in every namespace (an Event on a cluster-scoped
/// object lives in `default`), both reasons.
pub async fn list(client: &kube::Client) -> Result<Vec<LeakEvent>, ListError> {
    let api = Api::<Event>::all(client.clone());
    let mut events = Vec::new();
    for reason in [REASON_LEAK, REASON_RELEASED] {
        let selector = format!("reason={reason},involvedObject.kind=Node");
        let params = ListParams::default().fields(&selector);
        events.extend(list_pages(&api, params, "Event", "v1", leak_event).await?);
    }
    Ok(events)
}

/// The leak Event an Event is, if it is one whose note names an address.
fn leak_event(e: &Event) -> Option<LeakEvent> {
    let released = match e.reason.as_deref()? {
        REASON_LEAK => false,
        REASON_RELEASED => true,
        _ => return None,
    };
    let note = e.message.clone()?;
    Some(LeakEvent {
        node: e.involved_object.name.clone()?,
        released,
        ip: note_address(&note)?,
        note,
        time: e
            .series
            .as_ref()
            .and_then(|s| s.last_observed_time.as_ref().map(|t| t.0))
            .or_else(|| e.event_time.as_ref().map(|t| t.0))
            .or_else(|| e.last_timestamp.as_ref().map(|t| t.0))
            .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0)),
    })
}

/// Per node, the leaks whose newest Event is a report, not a release, in
/// address order.
pub fn unreleased(events: &[LeakEvent]) -> BTreeMap<String, Vec<AgentLeak>> {
    let mut newest: BTreeMap<(&str, IpAddr), &LeakEvent> = BTreeMap::new();
    for e in events {
        let slot = newest.entry((e.node.as_str(), e.ip)).or_insert(e);
        // A release and a report at one instant: the release is the later step.
        if (e.time, e.released) > (slot.time, slot.released) {
            *slot = e;
        }
    }
    let mut by_node: BTreeMap<String, Vec<AgentLeak>> = BTreeMap::new();
    for ((node, ip), e) in newest {
        if !e.released {
            by_node
                .entry(node.to_string())
                .or_default()
                .push(AgentLeak {
                    ip,
                    note: e.note.clone(),
                    reported_at: e.time.map(|t| t.to_string()),
                });
        }
    }
    by_node
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(node: &str, ip: &str, released: bool, second: i64) -> LeakEvent {
        LeakEvent {
            node: node.into(),
            released,
            ip: ip.parse().unwrap(),
            note: format!("{ip} (default/p): gone"),
            time: Some(Timestamp::from_second(second).unwrap()),
        }
    }

    #[test]
    fn a_leak_counts_until_a_later_release_of_it_on_its_node() {
        let events = [
            event("node-1", "10.0.0.5", false, 100),
            event("node-1", "10.0.0.5", true, 200),
            // Leaked again after the release (a new pod, a new leak).
            event("node-1", "10.0.0.6", true, 100),
            event("node-1", "10.0.0.6", false, 300),
            // A release on another node does not release this node's leak.
            event("node-2", "10.0.0.7", false, 100),
            event("node-3", "10.0.0.7", true, 200),
            // Same instant: the release wins.
            event("node-2", "10.0.0.8", true, 50),
            event("node-2", "10.0.0.8", false, 50),
        ];
        let got: BTreeMap<String, Vec<IpAddr>> = unreleased(&events)
            .into_iter()
            .map(|(n, leaks)| (n, leaks.into_iter().map(|l| l.ip).collect()))
            .collect();
        let want: BTreeMap<String, Vec<IpAddr>> = [
            ("node-1".to_string(), vec!["10.0.0.6".parse().unwrap()]),
            ("node-2".to_string(), vec!["10.0.0.7".parse().unwrap()]),
        ]
        .into();
        assert_eq!(got, want);
    }

    #[test]
    fn an_event_without_a_reason_node_or_address_is_not_a_leak_event() {
        let mut e = Event {
            reason: Some(REASON_LEAK.into()),
            message: Some("10.0.0.5 (default/p): gone".into()),
            ..Event::default()
        };
        e.involved_object.name = Some("node-1".into());
        assert!(leak_event(&e).is_some());
        let mut other = e.clone();
        other.reason = Some("NodeReady".into());
        assert_eq!(leak_event(&other), None);
        let mut no_node = e.clone();
        no_node.involved_object.name = None;
        assert_eq!(leak_event(&no_node), None);
        let mut no_address = e.clone();
        no_address.message = Some("something else".into());
        assert_eq!(leak_event(&no_address), None);
    }
}
