//! A local copy of one kind of object, fed by a kube-rs `watcher` (the one relist
//! buffer of podnet): the objects by `namespace/name` (or `name`), replaced whole
//! at every (re)list, so an object deleted while the watch was down is gone after
//! the relist, and a half-read list never looks like deleted objects. Each event
//! says what changed ([`Change`]); the operator's loops (node CIDRs and blocks, LB
//! IPAM, Node IPAM) and the agent's cluster-wide CiliumNode watch plan from it.

use std::collections::BTreeMap;

use kube::Resource;
use kube::runtime::watcher::{self, Event};

use crate::resources::NodeResource;

/// What identifies an object in a [`Mirror`].
pub trait Keyed {
    /// `namespace/name`, or `name` for a cluster-scoped object.
    fn key(&self) -> String;
}

impl<K: Resource> Keyed for K {
    fn key(&self) -> String {
        key_of(self)
    }
}

impl Keyed for NodeResource {
    fn key(&self) -> String {
        self.metadata.name.clone()
    }
}

/// The watch of a kind ended (it does not while the API server can be retried).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {kind} watch ended")]
pub struct WatchEnded {
    pub kind: String,
}

/// What one event changed in the copy.
#[derive(Debug, Clone, PartialEq)]
pub enum Change<K> {
    /// Nothing planning must see (a list in progress, an interrupted watch).
    Nothing,
    /// The object of this key was added or changed.
    Applied(String),
    /// This object was deleted.
    Deleted(K),
    /// A (re)list is complete: the copy was replaced whole.
    Relisted,
}

impl<K> Change<K> {
    /// Whether the copy changed in a way planning must see.
    pub fn matters(&self) -> bool {
        !matches!(self, Change::Nothing)
    }
}

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

impl<K: Keyed> Mirror<K> {
    /// Applies one event; says what changed (a list in progress changes nothing
    /// until it is done).
    pub fn apply(&mut self, event: Event<K>) -> Change<K> {
        match event {
            Event::Init => {
                self.listing = Some(BTreeMap::new());
                Change::Nothing
            }
            Event::InitApply(obj) => {
                if let Some(l) = self.listing.as_mut() {
                    l.insert(obj.key(), obj);
                }
                Change::Nothing
            }
            Event::InitDone => {
                self.objects = self.listing.take().unwrap_or_default();
                self.listed = true;
                Change::Relisted
            }
            Event::Apply(obj) => {
                let key = obj.key();
                self.objects.insert(key.clone(), obj);
                match self.listing {
                    None => Change::Applied(key),
                    Some(_) => Change::Nothing,
                }
            }
            Event::Delete(obj) => {
                self.objects.remove(&obj.key());
                match self.listing {
                    None => Change::Deleted(obj),
                    Some(_) => Change::Nothing,
                }
            }
        }
    }

    /// Takes one item of the watch stream of `kind` (objects' kind, for
    /// messages): an interrupted watch is logged (it resumes); `Err` when the
    /// stream ended.
    pub fn take(
        &mut self,
        item: Option<Result<Event<K>, watcher::Error>>,
        kind: &str,
    ) -> Result<Change<K>, WatchEnded> {
        match item {
            None => Err(WatchEnded { kind: kind.into() }),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "{kind} watch interrupted; it resumes");
                Ok(Change::Nothing)
            }
            Some(Ok(event)) => Ok(self.apply(event)),
        }
    }

    /// [`Mirror::take`], saying only whether planning must see the change.
    pub fn feed(
        &mut self,
        item: Option<Result<Event<K>, watcher::Error>>,
        kind: &str,
    ) -> Result<bool, WatchEnded> {
        self.take(item, kind).map(|c| c.matters())
    }

    /// Whether a list is being read (the copy is the one before it).
    pub fn listing(&self) -> bool {
        self.listing.is_some()
    }

    /// The object of `key`, if the copy has it.
    pub fn get(&self, key: &str) -> Option<&K> {
        self.objects.get(key)
    }

    pub fn objects(&self) -> impl Iterator<Item = &K> {
        self.objects.values()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        assert_eq!(m.apply(Event::Init), Change::Nothing);
        assert_eq!(m.apply(Event::InitApply(svc("a", "x"))), Change::Nothing);
        assert!(!m.listed);
        assert_eq!(m.apply(Event::InitDone), Change::Relisted);
        assert!(m.listed);
        assert_eq!(
            m.apply(Event::Apply(svc("b", "y"))),
            Change::Applied("b/y".into())
        );
        assert_eq!(m.objects().map(key_of).collect::<Vec<_>>(), ["a/x", "b/y"]);
        // Relist: b/y was deleted while the watch was down.
        m.apply(Event::Init);
        m.apply(Event::InitApply(svc("a", "x")));
        assert_eq!(m.objects().count(), 2);
        m.apply(Event::InitDone);
        assert_eq!(m.objects().map(key_of).collect::<Vec<_>>(), ["a/x"]);
        assert_eq!(
            m.apply(Event::Delete(svc("a", "x"))),
            Change::Deleted(svc("a", "x"))
        );
        assert!(m.is_empty());
        assert_eq!(
            m.feed(None, "Service").unwrap_err().to_string(),
            "the Service watch ended"
        );
    }

    #[test]
    fn node_resources_are_keyed_by_name() {
        let mut m = Mirror::<NodeResource>::default();
        m.apply(Event::Init);
        m.apply(Event::InitApply(NodeResource::new("n1")));
        assert_eq!(m.apply(Event::InitDone), Change::Relisted);
        assert!(m.get("n1").is_some());
    }
}
