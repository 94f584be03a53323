//! When a sticky identity's record is released (pure rules, no I/O; used by
//! [`decide`](super::sticky::decide)). Only a StatefulSet's pods have sticky
//! addresses (the agent refuses any other pod), so an identity is
//! `<namespace>/<statefulset>-<ordinal>` and its record lives as the pod's
//! PersistentVolumeClaims do, by the StatefulSet's
//! `spec.persistentVolumeClaimRetentionPolicy`:
//!
//! - `whenScaled: Delete`: an ordinal outside `[start, start + replicas)`
//!   (`spec.ordinals.start`, `spec.replicas`) is released;
//! - `whenDeleted: Delete`: once the StatefulSet is gone (or replaced by one of
//!   the same name with another UID), its identities are released. A gone
//!   StatefulSet's policy cannot be read, so the operator notes the StatefulSets
//!   whose `whenDeleted` is `Delete` (by UID) in the pool's annotation
//!   [`STICKY_RELEASE_ON_DELETE`] while they exist ([`notes`]); a StatefulSet
//!   deleted before the operator saw it is treated as `Retain`;
//! - `Retain` (the default of both): kept, as the PVC is; also when the
//!   StatefulSet is gone (the user may create it again). An admin frees such an
//!   entry by removing it from the pool's `ipam.podnet.io/sticky-owners`;
//! - an identity whose name is not `<statefulset>-<ordinal>` (recorded before
//!   only StatefulSet pods were accepted, e.g. a Deployment's pod) is released.
//!
//! The caller releases an identity only when no node lists its block and no
//! node asks for it (its pod is gone everywhere); until then it waits.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::apps::v1::StatefulSet;

pub use crate::ipam::sticky::STICKY_RELEASE_ON_DELETE;
use crate::ipam::sticky::statefulset_ordinal;

/// `whenDeleted` / `whenScaled` of `persistentVolumeClaimRetentionPolicy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Retention {
    /// Kept (the default; also any value other than `Delete`).
    #[default]
    Retain,
    Delete,
}

impl Retention {
    fn of(value: Option<&str>) -> Retention {
        match value {
            Some("Delete") => Retention::Delete,
            _ => Retention::Retain,
        }
    }
}

/// What the operator reads of one StatefulSet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatefulSetView {
    /// `<namespace>/<name>`.
    pub key: String,
    pub uid: String,
    /// `spec.replicas` (1 when absent).
    pub replicas: u32,
    /// `spec.ordinals.start` (0 when absent).
    pub start: u32,
    pub when_deleted: Retention,
    pub when_scaled: Retention,
}

impl From<&StatefulSet> for StatefulSetView {
    fn from(set: &StatefulSet) -> StatefulSetView {
        let meta = &set.metadata;
        let spec = &set.spec;
        let policy = spec.persistent_volume_claim_retention_policy.as_ref();
        let count =
            |n: Option<i32>, default: u32| n.map_or(default, |n| u32::try_from(n).unwrap_or(0));
        StatefulSetView {
            key: format!(
                "{}/{}",
                meta.namespace.as_deref().unwrap_or("default"),
                meta.name.as_deref().unwrap_or_default()
            ),
            uid: meta.uid.clone().unwrap_or_default(),
            replicas: count(spec.replicas, 1),
            start: count(spec.ordinals.as_ref().and_then(|o| o.start), 0),
            when_deleted: Retention::of(policy.and_then(|p| p.when_deleted.as_deref())),
            when_scaled: Retention::of(policy.and_then(|p| p.when_scaled.as_deref())),
        }
    }
}

/// Why an identity is released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// Its name is not `<statefulset>-<ordinal>`.
    NotStatefulSet,
    /// Its StatefulSet, noted `whenDeleted: Delete`, is gone.
    Deleted,
    /// Its ordinal is out of its StatefulSet's range, `whenScaled: Delete`.
    ScaledDown,
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Release::NotStatefulSet => "not a StatefulSet pod's name",
            Release::Deleted => "its StatefulSet (whenDeleted: Delete) is gone",
            Release::ScaledDown => "its StatefulSet (whenScaled: Delete) scaled below it",
        })
    }
}

/// Every StatefulSet as read, by `<namespace>/<name>`.
#[derive(Debug, Default)]
pub struct StatefulSets(BTreeMap<String, StatefulSetView>);

impl StatefulSets {
    pub fn new(sets: impl IntoIterator<Item = StatefulSetView>) -> StatefulSets {
        StatefulSets(sets.into_iter().map(|s| (s.key.clone(), s)).collect())
    }
}

/// The StatefulSet key (`<namespace>/<statefulset>`) and ordinal of `identity`.
fn owner_of(identity: &str) -> Option<(String, u32)> {
    let (namespace, name) = identity.split_once('/')?;
    let (set, ordinal) = statefulset_ordinal(name)?;
    Some((format!("{namespace}/{set}"), ordinal))
}

/// Whether (and why) `identity`'s record is due for release, given every
/// StatefulSet and the pool's `notes` ([`STICKY_RELEASE_ON_DELETE`]).
pub fn due(
    identity: &str,
    sets: &StatefulSets,
    notes: &BTreeMap<String, String>,
) -> Option<Release> {
    let Some((key, ordinal)) = owner_of(identity) else {
        return Some(Release::NotStatefulSet);
    };
    let noted = notes.get(&key);
    match sets.0.get(&key) {
        None => noted.map(|_| Release::Deleted),
        Some(set) if noted.is_some_and(|uid| *uid != set.uid) => Some(Release::Deleted),
        Some(set) => {
            let inside = ordinal >= set.start && ordinal - set.start < set.replicas;
            (!inside && set.when_scaled == Retention::Delete).then_some(Release::ScaledDown)
        }
    }
}

/// The pool's new [`STICKY_RELEASE_ON_DELETE`] for the identities its record
/// keeps: a StatefulSet that exists is noted (by UID) when its `whenDeleted` is
/// `Delete`; a gone one keeps its note while it has identities.
pub fn notes<'a>(
    identities: impl IntoIterator<Item = &'a String>,
    sets: &StatefulSets,
    old: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut notes = BTreeMap::new();
    for (key, _) in identities.into_iter().filter_map(|i| owner_of(i)) {
        let note = match sets.0.get(&key) {
            Some(set) if set.when_deleted == Retention::Delete => Some(set.uid.clone()),
            Some(_) => None,
            None => old.get(&key).cloned(),
        };
        if let Some(uid) = note {
            notes.insert(key, uid);
        }
    }
    notes
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A StatefulSet `key` (`ns/name`) of `replicas` from ordinal 0, uid `uid-<key>`.
    pub(crate) fn set(
        key: &str,
        replicas: u32,
        deleted: Retention,
        scaled: Retention,
    ) -> StatefulSetView {
        StatefulSetView {
            key: key.into(),
            uid: format!("uid-{key}"),
            replicas,
            start: 0,
            when_deleted: deleted,
            when_scaled: scaled,
        }
    }

    #[test]
    fn the_policy_and_counts_are_read_with_their_defaults() {
        let read = |v: serde_json::Value| {
            StatefulSetView::from(&serde_json::from_value::<StatefulSet>(v).unwrap())
        };
        let plain = read(
            serde_json::json!({"metadata": {"name": "web", "namespace": "db", "uid": "u"}, "spec": {
            "selector": {}, "serviceName": "web", "template": {}}}),
        );
        assert_eq!(
            plain,
            StatefulSetView {
                key: "db/web".into(),
                uid: "u".into(),
                replicas: 1,
                ..Default::default()
            }
        );
        let set = read(
            serde_json::json!({"metadata": {"name": "web", "namespace": "db"}, "spec": {
            "selector": {}, "serviceName": "web", "template": {}, "replicas": 3, "ordinals": {"start": 5},
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Delete"}}}),
        );
        assert_eq!((set.replicas, set.start), (3, 5));
        assert_eq!(
            (set.when_deleted, set.when_scaled),
            (Retention::Delete, Retention::Delete)
        );
    }

    #[test]
    fn scaled_down_ordinals_are_released_only_with_when_scaled_delete() {
        use Retention::{Delete, Retain};
        let none = BTreeMap::new();
        let sets = StatefulSets::new([
            set("db/web", 2, Retain, Delete),
            set("db/kept", 2, Delete, Retain),
        ]);
        assert_eq!(due("db/web-1", &sets, &none), None);
        assert_eq!(due("db/web-2", &sets, &none), Some(Release::ScaledDown));
        assert_eq!(due("db/kept-7", &sets, &none), None, "whenScaled: Retain");
        let mut from_five = set("db/web", 2, Retain, Delete);
        from_five.start = 5;
        let sets = StatefulSets::new([from_five]);
        assert_eq!(due("db/web-4", &sets, &none), Some(Release::ScaledDown));
        assert_eq!(due("db/web-6", &sets, &none), None);
        assert_eq!(due("db/web-7", &sets, &none), Some(Release::ScaledDown));
    }

    #[test]
    fn a_gone_statefulset_releases_only_when_noted_delete_and_names_that_are_not_ordinals_go() {
        use Retention::{Delete, Retain};
        let empty = StatefulSets::default();
        let none = BTreeMap::new();
        assert_eq!(due("db/web-0", &empty, &none), None, "never noted: Retain");
        let noted = BTreeMap::from([("db/web".to_string(), "uid-db/web".to_string())]);
        assert_eq!(due("db/web-0", &empty, &noted), Some(Release::Deleted));
        // Deleted and created again: another UID.
        let again = StatefulSets::new([StatefulSetView {
            uid: "new".into(),
            ..set("db/web", 3, Delete, Retain)
        }]);
        assert_eq!(due("db/web-0", &again, &noted), Some(Release::Deleted));
        let same = StatefulSets::new([set("db/web", 3, Delete, Retain)]);
        assert_eq!(due("db/web-0", &same, &noted), None);
        assert_eq!(
            due("db/rover-5d8f9-x7k2p", &same, &none),
            Some(Release::NotStatefulSet)
        );
    }

    #[test]
    fn notes_name_the_delete_statefulsets_with_identities_and_keep_gone_ones() {
        use Retention::{Delete, Retain};
        let sets = StatefulSets::new([
            set("db/web", 1, Delete, Retain),
            set("db/kept", 1, Retain, Retain),
        ]);
        let old = BTreeMap::from([
            ("db/gone".to_string(), "g".to_string()),
            ("db/other".to_string(), "o".to_string()),
        ]);
        let ids: Vec<String> = ["db/web-0", "db/web-1", "db/kept-0", "db/gone-0", "db/x"]
            .map(String::from)
            .into();
        assert_eq!(
            notes(&ids, &sets, &old),
            BTreeMap::from([
                ("db/gone".to_string(), "g".to_string()),
                ("db/web".to_string(), "uid-db/web".to_string()),
            ])
        );
    }
}
