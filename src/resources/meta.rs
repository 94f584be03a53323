//! The `metav1` parts every object shares: `metadata` ([`ObjectMeta`]) and label
//! selectors ([`LabelSelector`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::fields::nullable;

/// `metadata`: the fields podnet reads or writes typed, the rest kept in `extra`
/// (`uid`, `creationTimestamp`, `managedFields`, ...).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ObjectMeta {
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "String::is_empty"
    )]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub labels: BTreeMap<String, String>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub annotations: BTreeMap<String, String>,
    #[serde(
        rename = "resourceVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub resource_version: Option<String>,
    #[serde(
        rename = "ownerReferences",
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub owner_references: Vec<OwnerReference>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl ObjectMeta {
    /// Only a name.
    pub fn named(name: &str) -> ObjectMeta {
        ObjectMeta {
            name: name.to_string(),
            ..Default::default()
        }
    }

    /// `metadata.uid` ("" when absent).
    pub fn uid(&self) -> &str {
        self.extra
            .get("uid")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
    }

    /// How messages name the object: `Kind "namespace/name"`, `Kind "name"`, or
    /// `Kind (unnamed)`.
    pub fn describe(&self, kind: &str) -> String {
        match self.namespace.as_deref() {
            _ if self.name.is_empty() => format!("{kind} (unnamed)"),
            Some(ns) if !ns.is_empty() => format!("{kind} \"{ns}/{}\"", self.name),
            _ => format!("{kind} \"{}\"", self.name),
        }
    }
}

/// `metadata.ownerReferences[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OwnerReference {
    #[serde(rename = "apiVersion", default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub uid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller: Option<bool>,
    #[serde(
        rename = "blockOwnerDeletion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub block_owner_deletion: Option<bool>,
}

/// A label selector (`matchLabels` and `matchExpressions`). Whether the operators
/// are valid is checked where a selector is used (`ipam::pooldef`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelSelector {
    #[serde(rename = "matchLabels", default, deserialize_with = "nullable")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(rename = "matchExpressions", default, deserialize_with = "nullable")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One `matchExpressions` entry: operator `In`, `NotIn`, `Exists`, `DoesNotExist`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelSelectorRequirement {
    pub key: String,
    pub operator: String,
    #[serde(default, deserialize_with = "nullable")]
    pub values: Vec<String>,
}
