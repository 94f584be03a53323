//! How podnet builds the Events it posts (events.k8s.io/v1, through kube-rs's
//! `Recorder`): the recorder of one reporting controller and instance
//! ([`recorder`]), and an Event of a type, reason and note whose action names
//! what it is about ([`event`], so Events about different values stay apart).
//!
//! What makes two Events one series: kube-rs's `Recorder` (kube-runtime 5.0,
//! `events.rs`, `EventKey`) folds every Event with the same type, `action`,
//! `reason`, reporting controller and instance, `regarding` object and
//! `related` object, posted within its cache's TTL, into one series: it patches
//! the first Event's series count and keeps the first Event's note. The note is
//! not in the key, so two Events of one reason on one object about different
//! values (two CIDRs, two leaked addresses) became one, naming the first value
//! only. Every Event podnet posts about a value puts that value in its action
//! ([`action_about`]): the action is in the key, and neither `kubectl get
//! events` nor `kubectl describe` shows it, so what they list (reason, object,
//! note) reads as before, one line per value. Repeats about the same value
//! still fold into a series.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// A recorder posting as `controller` (`podnet-agent`, `podnet-operator`), from
/// `instance` (the node, or the operator replica).
pub fn recorder(client: kube::Client, controller: &str, instance: &str) -> Recorder {
    Recorder::new(
        client,
        Reporter {
            controller: controller.into(),
            instance: Some(instance.into()),
        },
    )
}

/// An Event: Warning or Normal, its `reason`, its `note`, and the action
/// `<verb> <about>` ([`action_about`]); no related object.
pub fn event(warning: bool, reason: &str, note: &str, verb: &str, about: &str) -> Event {
    Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.into(),
        note: Some(note.into()),
        action: action_about(verb, about),
        secondary: None,
    }
}

/// A policy's problem (the object is cluster-scoped: `name` of `api_version`
/// and `kind`): a Warning `PolicyProblem` Event, `<field>: <why>` its note,
/// `Enforce <field>` its action. Best effort: a failed post is logged at debug.
pub async fn post_policy_problem(
    recorder: &Recorder,
    (api_version, kind): (&str, &str),
    name: &str,
    field: &str,
    why: &str,
) {
    let target = ObjectReference {
        api_version: Some(api_version.into()),
        kind: Some(kind.into()),
        name: Some(name.into()),
        ..ObjectReference::default()
    };
    let note = format!("{field}: {why}");
    let event = event(true, "PolicyProblem", &note, "Enforce", field);
    if let Err(e) = recorder.publish(&event, &target).await {
        tracing::debug!(error = %e, kind, name, "a policy problem's Event was not posted");
    }
}

/// The most the API server takes in an Event's action (events.k8s.io/v1).
const ACTION_MAX: usize = 128;

/// The action of an Event that `verb`s `subject`: `Verb subject`, cut to
/// [`ACTION_MAX`] bytes on a character boundary (a subject that long still
/// differs from others in its first hundred bytes in practice: CIDRs and
/// addresses are short).
fn action_about(verb: &str, subject: &str) -> String {
    let mut action = if subject.is_empty() {
        verb.to_string()
    } else {
        format!("{verb} {subject}")
    };
    if action.len() > ACTION_MAX {
        let mut end = ACTION_MAX;
        while !action.is_char_boundary(end) {
            end -= 1;
        }
        action.truncate(end);
    }
    action
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_action_names_the_subject_so_different_subjects_are_different_series() {
        let a = action_about("AllocatePodCIDR", "10.0.1.0/24");
        let b = action_about("AllocatePodCIDR", "10.0.2.0/24");
        assert_eq!(a, "AllocatePodCIDR 10.0.1.0/24");
        assert_ne!(a, b);
        assert_eq!(action_about("Found", ""), "Found");
    }

    #[test]
    fn a_long_action_is_cut_to_what_the_api_server_takes() {
        let long = "é".repeat(100);
        let action = action_about("Found", &long);
        assert!(action.len() <= ACTION_MAX, "{}", action.len());
        assert!(action.starts_with("Found é"));
    }

    #[test]
    fn an_event_has_its_type_reason_note_and_the_action_about_its_subject() {
        let e = event(true, "IPAMLeak", "10.0.1.5 leaked", "Found", "10.0.1.5");
        assert_eq!(e.type_, EventType::Warning);
        assert_eq!(e.reason, "IPAMLeak");
        assert_eq!(e.note.as_deref(), Some("10.0.1.5 leaked"));
        assert_eq!(e.action, "Found 10.0.1.5");
        assert!(e.secondary.is_none());
        let e = event(false, "Released", "", "Released", "");
        assert_eq!(e.type_, EventType::Normal);
        assert_eq!(e.note.as_deref(), Some(""));
        assert_eq!(e.action, "Released");
    }
}
