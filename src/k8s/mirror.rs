//! A watched kind's relist buffer ([`Relist`], the one relist buffer of podnet):
//! a (re)list is handed on whole once complete, so an object deleted while the
//! watch was down is gone after the relist, and a half-read list never looks like
//! deleted objects. [`Relist`] keeps nothing once a list is done (the node loop
//! hands each object to its allocator, which keeps what it needs); [`Mirror`] is
//! a local copy of one kind over it, the objects by `namespace/name` (or `name`),
//! replaced whole at every (re)list. Each event says what changed ([`Change`]);
//! the operator's LB IPAM and Node IPAM loops and the agent's cluster-wide
//! CiliumNode watch plan from a [`Mirror`]. A watch can be [`projected`] first,
//! so a [`Mirror`] (and a list in progress) keeps only a view of each object,
//! made once as its event arrives (the agent's NetworkPolicy loop).

use std::collections::BTreeMap;

use futures::{Stream, StreamExt};
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

/// What one event brought, as [`Relist`] hands it on.
#[derive(Debug, Clone, PartialEq)]
pub enum Step<K> {
    /// Nothing yet (a list began, an object of a list in progress, an
    /// interrupted watch).
    Nothing,
    /// This object was added or changed (also while a list is in progress:
    /// [`Relist::listing`] says so).
    Applied(K),
    /// This object was deleted (also while a list is in progress).
    Deleted(K),
    /// A (re)list is complete: every object there is, by key.
    Relisted(BTreeMap<String, K>),
}

/// `events` with each object replaced by `project(object)`, made as its event
/// arrives: the whole object is dropped then, also while a list is read, and a
/// [`Mirror`] of the views keeps [`Relist`]'s semantics (the view's
/// [`Keyed::key`] must be its object's).
pub fn projected<K, V>(
    events: impl Stream<Item = Result<Event<K>, watcher::Error>>,
    mut project: impl FnMut(K) -> V,
) -> impl Stream<Item = Result<Event<V>, watcher::Error>> {
    events.map(move |item| item.map(|event| project_event(event, &mut project)))
}

/// `event` with its object projected.
fn project_event<K, V>(event: Event<K>, project: &mut impl FnMut(K) -> V) -> Event<V> {
    match event {
        Event::Init => Event::Init,
        Event::InitApply(obj) => Event::InitApply(project(obj)),
        Event::InitDone => Event::InitDone,
        Event::Apply(obj) => Event::Apply(project(obj)),
        Event::Delete(obj) => Event::Delete(project(obj)),
    }
}

/// The objects of a list in progress, held until the list is complete; nothing
/// else.
pub struct Relist<K> {
    /// Objects of the list being read (None: no list in progress).
    listing: Option<BTreeMap<String, K>>,
    /// Whether a whole list has been read once.
    pub listed: bool,
}

impl<K> Default for Relist<K> {
    fn default() -> Relist<K> {
        Relist {
            listing: None,
            listed: false,
        }
    }
}

impl<K: Keyed> Relist<K> {
    /// Takes one event.
    pub fn apply(&mut self, event: Event<K>) -> Step<K> {
        match event {
            Event::Init => {
                self.listing = Some(BTreeMap::new());
                Step::Nothing
            }
            Event::InitApply(obj) => {
                if let Some(l) = self.listing.as_mut() {
                    l.insert(obj.key(), obj);
                }
                Step::Nothing
            }
            Event::InitDone => {
                self.listed = true;
                Step::Relisted(self.listing.take().unwrap_or_default())
            }
            Event::Apply(obj) => Step::Applied(obj),
            Event::Delete(obj) => Step::Deleted(obj),
        }
    }

    /// Takes one item of the watch stream of `kind` (objects' kind, for
    /// messages): an interrupted watch is logged (it resumes); `Err` when the
    /// stream ended.
    pub fn take(
        &mut self,
        item: Option<Result<Event<K>, watcher::Error>>,
        kind: &str,
    ) -> Result<Step<K>, WatchEnded> {
        match item {
            None => Err(WatchEnded { kind: kind.into() }),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "{kind} watch interrupted; it resumes");
                Ok(Step::Nothing)
            }
            Some(Ok(event)) => Ok(self.apply(event)),
        }
    }

    /// Whether a list is being read.
    pub fn listing(&self) -> bool {
        self.listing.is_some()
    }
}

/// The objects of one kind as the watch last showed them.
pub struct Mirror<K> {
    objects: BTreeMap<String, K>,
    relist: Relist<K>,
}

impl<K> Default for Mirror<K> {
    fn default() -> Mirror<K> {
        Mirror {
            objects: BTreeMap::new(),
            relist: Relist::default(),
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
        let step = self.relist.apply(event);
        self.changed(step)
    }

    /// The copy after `step`.
    fn changed(&mut self, step: Step<K>) -> Change<K> {
        let listing = self.relist.listing();
        match step {
            Step::Nothing => Change::Nothing,
            Step::Relisted(objects) => {
                self.objects = objects;
                Change::Relisted
            }
            Step::Applied(obj) => {
                let key = obj.key();
                self.objects.insert(key.clone(), obj);
                match listing {
                    false => Change::Applied(key),
                    true => Change::Nothing,
                }
            }
            Step::Deleted(obj) => {
                self.objects.remove(&obj.key());
                match listing {
                    false => Change::Deleted(obj),
                    true => Change::Nothing,
                }
            }
        }
    }

    /// [`Relist::take`], and what the item changed in the copy.
    pub fn take(
        &mut self,
        item: Option<Result<Event<K>, watcher::Error>>,
        kind: &str,
    ) -> Result<Change<K>, WatchEnded> {
        let step = self.relist.take(item, kind)?;
        Ok(self.changed(step))
    }

    /// [`Mirror::take`], saying only whether planning must see the change.
    pub fn feed(
        &mut self,
        item: Option<Result<Event<K>, watcher::Error>>,
        kind: &str,
    ) -> Result<bool, WatchEnded> {
        self.take(item, kind).map(|c| c.matters())
    }

    /// Whether a whole list has been read once.
    pub fn listed(&self) -> bool {
        self.relist.listed
    }

    /// Whether a list is being read (the copy is the one before it).
    pub fn listing(&self) -> bool {
        self.relist.listing()
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
    fn a_relist_holds_only_the_list_in_progress_and_hands_it_on_whole() {
        let mut r = Relist::<Service>::default();
        assert_eq!(r.apply(Event::Init), Step::Nothing);
        assert!(r.listing());
        assert_eq!(r.apply(Event::InitApply(svc("a", "y"))), Step::Nothing);
        assert_eq!(r.apply(Event::InitApply(svc("a", "x"))), Step::Nothing);
        assert!(!r.listed);
        let Step::Relisted(all) = r.apply(Event::InitDone) else {
            panic!("the list is handed on when complete");
        };
        assert_eq!(all.keys().collect::<Vec<_>>(), ["a/x", "a/y"]);
        assert!(r.listed && !r.listing());
        assert_eq!(
            r.apply(Event::Apply(svc("b", "z"))),
            Step::Applied(svc("b", "z"))
        );
        assert_eq!(
            r.apply(Event::Delete(svc("a", "x"))),
            Step::Deleted(svc("a", "x"))
        );
        assert_eq!(
            r.take(Some(Err(watcher::Error::NoResourceVersion)), "Service"),
            Ok(Step::Nothing)
        );
        assert!(r.take(None, "Service").is_err());
    }

    #[test]
    fn a_relist_replaces_everything() {
        let mut m = Mirror::<Service>::default();
        assert_eq!(m.apply(Event::Init), Change::Nothing);
        assert_eq!(m.apply(Event::InitApply(svc("a", "x"))), Change::Nothing);
        assert!(!m.listed());
        assert_eq!(m.apply(Event::InitDone), Change::Relisted);
        assert!(m.listed());
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

    /// What a projected mirror keeps of a Service: its key and its type.
    #[derive(Debug, Clone, PartialEq)]
    struct Kept {
        key: String,
        kind: Option<String>,
    }

    impl Keyed for Kept {
        fn key(&self) -> String {
            self.key.clone()
        }
    }

    fn kept(s: Service) -> Kept {
        Kept {
            key: key_of(&s),
            kind: s.spec.and_then(|s| s.type_),
        }
    }

    fn typed(ns: &str, name: &str, kind: &str) -> Service {
        let mut s = svc(ns, name);
        s.spec = Some(k8s_openapi::api::core::v1::ServiceSpec {
            type_: Some(kind.into()),
            ..Default::default()
        });
        s
    }

    #[tokio::test]
    async fn a_projected_mirror_keeps_views_with_the_relist_semantics() {
        let events = vec![
            Ok(Event::Init),
            Ok(Event::InitApply(typed("a", "x", "ClusterIP"))),
            Ok(Event::InitApply(svc("a", "stale"))),
            Ok(Event::InitDone),
            Ok(Event::Apply(typed("a", "x", "LoadBalancer"))),
            Err(watcher::Error::NoResourceVersion),
            // A relist while a/stale was deleted: read half, then whole.
            Ok(Event::Init),
            Ok(Event::InitApply(typed("a", "x", "LoadBalancer"))),
            Ok(Event::InitDone),
        ];
        let mut stream = projected(futures::stream::iter(events), kept).boxed();
        let mut m = Mirror::<Kept>::default();
        let mut changes = Vec::new();
        let mut take = async |m: &mut Mirror<Kept>| m.take(stream.next().await, "Service");
        for _ in 0..4 {
            changes.push(take(&mut m).await);
        }
        assert_eq!(changes.pop(), Some(Ok(Change::Relisted)));
        assert_eq!(m.objects().count(), 2);
        assert_eq!(take(&mut m).await, Ok(Change::Applied("a/x".into())));
        assert_eq!(
            m.get("a/x").and_then(|k| k.kind.as_deref()),
            Some("LoadBalancer"),
            "an update replaces the view"
        );
        assert_eq!(take(&mut m).await, Ok(Change::Nothing));
        take(&mut m).await.expect("Init");
        take(&mut m).await.expect("InitApply");
        assert_eq!(m.objects().count(), 2, "a half-read list deletes nothing");
        assert_eq!(take(&mut m).await, Ok(Change::Relisted));
        assert_eq!(
            m.objects().map(Keyed::key).collect::<Vec<_>>(),
            ["a/x"],
            "the relist dropped the stale view"
        );
        assert!(take(&mut m).await.is_err(), "the stream ended");
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
