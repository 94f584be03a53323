//! How podnet builds the Events it posts (events.k8s.io/v1, through kube-rs's
//! `Recorder`): the recorder of one reporting controller and instance
//! ([`recorder`]), and an Event of a type, reason and note whose action names
//! what it is about ([`event`], so Events about different values stay apart:
//! [`super::event_series`]).

use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use super::event_series::action_about;

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

#[cfg(test)]
mod tests {
    use super::*;

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
