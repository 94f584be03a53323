//! Tests of the L2 announcement plan and its views.

mod plan;
mod views;

use std::collections::{BTreeMap, BTreeSet};

use serde_json::json;

use super::views::{NodeView, PolicyView, ServiceView};
use crate::resources::CiliumL2AnnouncementPolicy;

/// A policy from its `spec`.
fn policy(name: &str, spec: serde_json::Value) -> PolicyView {
    let p: CiliumL2AnnouncementPolicy =
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap();
    PolicyView::from_resource(&p)
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn node(name: &str, pairs: &[(&str, &str)]) -> NodeView {
    NodeView {
        name: name.into(),
        labels: labels(pairs),
        internal_ips: Vec::new(),
    }
}

/// A LoadBalancer Service `default/<name>` with `ips`.
fn lb(name: &str, ips: &[&str]) -> ServiceView {
    ServiceView {
        namespace: "default".into(),
        name: name.into(),
        uid: None,
        labels: labels(&[("app", name)]),
        load_balancer: ips.iter().map(|a| a.parse().unwrap()).collect(),
        external: Vec::new(),
        local_traffic: false,
    }
}

fn names(n: &[&str]) -> BTreeSet<String> {
    n.iter().map(|s| s.to_string()).collect()
}
