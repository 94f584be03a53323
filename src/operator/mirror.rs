//! A local copy of one kind of object, fed by a kube-rs `watcher`: the objects by
//! `namespace/name` (or `name`), replaced whole at every (re)list, so an object
//! deleted while the watch was down is gone after the relist. The LB IPAM and
//! Node IPAM controllers plan from these copies, and plan again after a failed
//! write on a [`Retry`] backoff.

use std::collections::BTreeMap;
use std::time::Duration;

use super::retry::next_backoff;

use kube::Resource;
use kube::runtime::watcher::{self, Event};
use tokio::time::Instant;

/// The objects of one kind as the watch last showed them.
pub struct Mirror<K> {
    objects: BTreeMap<String, K>,
    /// Objects of the list being read (None: no list in progress).
    listing: Option<BTreeMap<String, K>>,
    /// Whether a whole list has been read once.
    pub listed: bool,
}

impl<K> Default for Mirror<K> {
    fn default() -> Mirror<K> {
        Mirror {
            objects: BTreeMap::new(),
            listing: None,
            listed: false,
        }
    }
}

/// `namespace/name`, or `name` for a cluster-scoped object.
pub fn key_of<K: Resource>(obj: &K) -> String {
    let meta = obj.meta();
    let name = meta.name.clone().unwrap_or_default();
    match meta.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name,
    }
}

impl<K: Resource> Mirror<K> {
    /// Applies one event; returns whether the copy changed in a way planning must
    /// see (a list in progress changes nothing until it is done).
    pub fn apply(&mut self, event: Event<K>) -> bool {
        match event {
            Event::Init => {
                self.listing = Some(BTreeMap::new());
                false
            }
            Event::InitApply(obj) => {
                if let Some(l) = self.listing.as_mut() {
                    l.insert(key_of(&obj), obj);
                }
                false
            }
            Event::InitDone => {
                self.objects = self.listing.take().unwrap_or_default();
                self.listed = true;
                true
            }
            Event::Apply(obj) => {
                self.objects.insert(key_of(&obj), obj);
                self.listing.is_none()
            }
            Event::Delete(obj) => {
                self.objects.remove(&key_of(&obj));
                self.listing.is_none()
            }
        }
    }

    /// Feeds one item of the watch stream of `kind` (objects' kind, for
    /// messages); `Err` when the stream ended.
    pub fn feed(
        &mut self,
        item: Option<Result<Event<K>, watcher::Error>>,
        kind: &str,
    ) -> Result<bool, String> {
        match item {
            None => Err(format!("the {kind} watch ended")),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "{kind} watch interrupted; it resumes");
                Ok(false)
            }
            Some(Ok(event)) => Ok(self.apply(event)),
        }
    }

    pub fn objects(&self) -> impl Iterator<Item = &K> {
        self.objects.values()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }
}

/// When to plan again after failed writes: 0.5 s after the first failure,
/// doubling up to 30 s, until a pass succeeds.
#[derive(Debug, Default)]
pub struct Retry(Option<(Instant, Duration)>);

impl Retry {
    /// When the next attempt is due (None: nothing failed).
    pub fn due(&self) -> Option<Instant> {
        self.0.map(|(at, _)| at)
    }

    /// Records a pass's outcome; returns the wait after a failure.
    pub fn record<E: std::fmt::Display>(&mut self, outcome: Result<(), E>, what: &str) {
        match outcome {
            Ok(()) => self.0 = None,
            Err(e) => {
                let backoff = next_backoff(self.0.map(|(_, b)| b));
                tracing::warn!(error = %e, retry_in = ?backoff, "{what} failed");
                self.0 = Some((Instant::now() + backoff, backoff));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::retry::{RETRY_FIRST, RETRY_MAX};
    use k8s_openapi::api::core::v1::Service;
    use kube::api::ObjectMeta;

    fn svc(ns: &str, name: &str) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn a_relist_replaces_everything() {
        let mut m = Mirror::<Service>::default();
        assert!(!m.apply(Event::Init));
        assert!(!m.apply(Event::InitApply(svc("a", "x"))));
        assert!(!m.listed);
        assert!(m.apply(Event::InitDone));
        assert!(m.listed);
        assert!(m.apply(Event::Apply(svc("b", "y"))));
        assert_eq!(m.objects().map(key_of).collect::<Vec<_>>(), ["a/x", "b/y"]);
        // Relist: b/y was deleted while the watch was down.
        m.apply(Event::Init);
        m.apply(Event::InitApply(svc("a", "x")));
        assert_eq!(m.objects().count(), 2);
        m.apply(Event::InitDone);
        assert_eq!(m.objects().map(key_of).collect::<Vec<_>>(), ["a/x"]);
        assert!(m.apply(Event::Delete(svc("a", "x"))));
        assert!(m.is_empty());
        assert_eq!(
            m.feed(None, "Service"),
            Err("the Service watch ended".into())
        );
    }

    #[test]
    fn retries_back_off_and_reset() {
        let mut r = Retry::default();
        assert!(r.due().is_none());
        let backoff = |r: &Retry| r.0.map(|(_, b)| b);
        let before = Instant::now();
        r.record(Err("boom"), "a write");
        assert_eq!(backoff(&r), Some(RETRY_FIRST));
        assert!(r.due().is_some_and(|d| d >= before + RETRY_FIRST));
        r.record(Err("boom"), "a write");
        assert_eq!(backoff(&r), Some(RETRY_FIRST * 2));
        for _ in 0..10 {
            r.record(Err("boom"), "a write");
        }
        assert_eq!(backoff(&r), Some(RETRY_MAX));
        r.record(Ok::<(), &str>(()), "a write");
        assert!(r.due().is_none());
    }
}
