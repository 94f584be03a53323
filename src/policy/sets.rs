//! The sets of pods' addresses a compile makes (a peer selector's pods, the
//! address-port pairs of a named port), kept from one compile to the next and
//! brought up to date pod by pod: a Pod event costs one look at that pod per
//! kept set, not a walk of every pod for every selector. A set a compile asks
//! for that is not kept is made from every pod once; a set the last compile did
//! not use is dropped. What a pod adds to a set ([`Source::elements`]) is the
//! one definition both paths use, so a kept set is what a fresh compile makes.
//! A kept set whose elements did not change is handed out as the same
//! allocation again, so a compile copies and compares only the sets that did.
//!
//! The caller says what changed since the last compile ([`Changes`]): the keys
//! (`namespace/name`) of the Pods whose events arrived, or everything (a
//! relist, a Namespace's labels: a peer's `namespaceSelector` reads them).

use std::collections::{BTreeMap, BTreeSet};

use super::selector::{Labels, Selector};
use super::state::{Element, Set, SetKind};
use super::view::{Namespaces, PodView, Protocol};

/// What changed among the pods since the last compile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Changes {
    /// The Pods of these keys (added, changed or deleted).
    Pods(BTreeSet<String>),
    /// Anything else a kept set depends on: every set is made again.
    All,
}

impl Default for Changes {
    fn default() -> Changes {
        Changes::Pods(BTreeSet::new())
    }
}

impl Changes {
    /// The Pod of `key` changed.
    pub fn pod(&mut self, key: String) {
        if let Changes::Pods(keys) = self {
            keys.insert(key);
        }
    }

    /// Every set must be made again.
    pub fn all(&mut self) {
        *self = Changes::All;
    }
}

/// What a set stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source<'a> {
    /// The pods of `namespaces` that `pods` matches: their addresses.
    Peer {
        namespaces: &'a Namespaces,
        pods: &'a Selector,
    },
    /// Every pod's address and number for the named port.
    Port { protocol: Protocol, name: &'a str },
}

/// A [`Source`] as a kept set owns it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Owned {
    Peer {
        namespaces: Namespaces,
        pods: Selector,
    },
    Port {
        protocol: Protocol,
        name: String,
    },
}

impl Source<'_> {
    fn kind(&self) -> SetKind {
        match self {
            Source::Peer { .. } => SetKind::Addresses,
            Source::Port { .. } => SetKind::AddressPorts,
        }
    }

    fn owned(&self) -> Owned {
        match *self {
            Source::Peer { namespaces, pods } => Owned::Peer {
                namespaces: namespaces.clone(),
                pods: pods.clone(),
            },
            Source::Port { protocol, name } => Owned::Port {
                protocol,
                name: name.to_string(),
            },
        }
    }

    /// What `pod` adds to the set, `labels_of` giving a namespace's labels.
    pub fn elements<'l>(
        &self,
        pod: &PodView,
        labels_of: impl Fn(&str) -> &'l Labels,
    ) -> Vec<Element> {
        match *self {
            Source::Peer { namespaces, pods } => {
                let in_namespace = match namespaces {
                    Namespaces::Own(ns) => pod.namespace == *ns,
                    Namespaces::Matching(s) => s.matches(labels_of(&pod.namespace)),
                };
                match in_namespace && pods.matches(&pod.labels) {
                    true => pod.ips.iter().map(|ip| Element::Address(*ip)).collect(),
                    false => Vec::new(),
                }
            }
            Source::Port { protocol, name } => {
                let numbers = pod
                    .ports
                    .iter()
                    .filter(|np| np.name == name && np.protocol == protocol);
                let numbers: Vec<u16> = numbers.map(|np| np.number).collect();
                let pairs = pod
                    .ips
                    .iter()
                    .flat_map(|ip| numbers.iter().map(|n| Element::AddressPort(*ip, *n)));
                pairs.collect()
            }
        }
    }
}

/// One kept set: what each pod adds to it, and how many pods add each element
/// (two pods may share an address a while); the [`Set`] last made of it, until
/// its elements change.
#[derive(Debug, Clone)]
struct Kept {
    source: Owned,
    kind: SetKind,
    members: BTreeMap<String, Vec<Element>>,
    counts: BTreeMap<Element, usize>,
    made: Option<Set>,
}

impl Kept {
    fn source(&self) -> Source<'_> {
        match &self.source {
            Owned::Peer { namespaces, pods } => Source::Peer { namespaces, pods },
            Owned::Port { protocol, name } => Source::Port {
                protocol: *protocol,
                name,
            },
        }
    }

    /// Puts `elements` in as `key`'s, in place of what it added before; true
    /// when the set's elements changed.
    fn put(&mut self, key: &str, elements: Vec<Element>) -> bool {
        let mut changed = false;
        for e in self.members.remove(key).unwrap_or_default() {
            if let Some(n) = self.counts.get_mut(&e) {
                *n -= 1;
                if *n == 0 {
                    self.counts.remove(&e);
                    changed = true;
                }
            }
        }
        for e in &elements {
            let n = self.counts.entry(*e).or_insert(0);
            changed |= *n == 0;
            *n += 1;
        }
        if !elements.is_empty() {
            self.members.insert(key.to_string(), elements);
        }
        if changed {
            self.made = None;
        }
        changed
    }

    /// The set, made again only when its elements changed since the last call.
    fn set(&mut self) -> Set {
        let (kind, counts) = (self.kind, &self.counts);
        let made = self
            .made
            .get_or_insert_with(|| Set::new(kind, counts.keys().copied()));
        made.clone()
    }
}

/// What [`SetCache::refresh`] did: pods looked at, sets whose elements changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Refreshed {
    pub pods: usize,
    pub sets_changed: usize,
}

/// The sets the last compile used, by name.
#[derive(Debug, Default)]
pub struct SetCache {
    kept: BTreeMap<String, Kept>,
    /// The names the compile under way asked for (the others are dropped at its end).
    used: BTreeSet<String>,
}

impl SetCache {
    /// Brings the kept sets up to `changes`: each changed pod (`pod` gives its
    /// view, None once deleted) is taken out of every set and put back where
    /// it belongs; [`Changes::All`] drops every set.
    pub fn refresh<'p, 'l>(
        &mut self,
        changes: Changes,
        pod: impl Fn(&str) -> Option<&'p PodView>,
        labels_of: impl Fn(&str) -> &'l Labels + Copy,
    ) -> Refreshed {
        let keys = match changes {
            Changes::All => {
                self.kept.clear();
                return Refreshed::default();
            }
            Changes::Pods(keys) => keys,
        };
        let mut changed = BTreeSet::new();
        for key in &keys {
            let view = pod(key);
            for (name, kept) in &mut self.kept {
                let elements = match view {
                    Some(p) => kept.source().elements(p, labels_of),
                    None => Vec::new(),
                };
                if kept.put(key, elements) {
                    changed.insert(name.clone());
                }
            }
        }
        Refreshed {
            pods: keys.len(),
            sets_changed: changed.len(),
        }
    }

    /// The set `name` of `source`: the kept one, or one made from `pods`.
    pub fn get<'l>(
        &mut self,
        name: &str,
        source: Source,
        pods: &[&PodView],
        labels_of: impl Fn(&str) -> &'l Labels + Copy,
    ) -> Set {
        self.used.insert(name.to_string());
        if let Some(kept) = self.kept.get_mut(name) {
            return kept.set();
        }
        let mut kept = Kept {
            source: source.owned(),
            kind: source.kind(),
            members: BTreeMap::new(),
            counts: BTreeMap::new(),
            made: None,
        };
        for p in pods {
            kept.put(
                &format!("{}/{}", p.namespace, p.name),
                source.elements(p, labels_of),
            );
        }
        let set = kept.set();
        self.kept.insert(name.to_string(), kept);
        set
    }

    /// Ends a compile: drops the sets it did not ask for.
    pub fn end_compile(&mut self) {
        let used = std::mem::take(&mut self.used);
        self.kept.retain(|name, _| used.contains(name));
    }
}

#[cfg(test)]
#[path = "tests/sets.rs"]
mod tests;
