//! The bodies the agent sends to its CiliumNode: the apply of the fields it
//! owns ([`AgentFields`]), the status applies (used addresses, the
//! [`FIT_CONDITION`], the verdict on the pod CIDRs) and the merge patch that
//! gives blocks back. Pinned whole by the tests: they are the wire.

use std::collections::BTreeMap;

use ipnet::IpNet;
use serde_json::json;

use super::FIT_CONDITION;
use crate::ipam::sticky::{STICKY_REQUESTS, requests_annotation};
use crate::k8s::objects::{ApplyBody, condition_json};
use crate::node::{
    ConfigFit, HealthAddresses, NodeAddress, NodeResource, RequestedPool, UsedAddresses,
};
use crate::resources::{PodCidrStatus, ROUTING_MODE_ANNOTATION};

/// The fields the agent owns in its CiliumNode (one apply always sends them all:
/// what an apply leaves out, the manager gives up).
#[derive(Debug, Clone, Default)]
pub(super) struct AgentFields {
    pub(super) node_uid: String,
    pub(super) internal_ips: Vec<String>,
    pub(super) router_addresses: Vec<NodeAddress>,
    pub(super) health: HealthAddresses,
    pub(super) pod_cidrs: Option<Vec<IpNet>>,
    pub(super) requested: Option<Vec<RequestedPool>>,
    /// Multi-pool: the sticky addresses asked for (identity -> pool); written
    /// as the annotation [`STICKY_REQUESTS`] while not empty.
    pub(super) sticky_requests: BTreeMap<String, String>,
    /// `--routing-mode` (`tunnel`, `native`), written as the annotation
    /// [`ROUTING_MODE_ANNOTATION`]; empty: not written.
    pub(super) routing_mode: &'static str,
    /// The Node's labels, copied to the CiliumNode's as Cilium's agent copies
    /// them: a ClusterNetworkPolicy's `nodes` peer selects Nodes by them, and
    /// every agent reads the CiliumNodes.
    pub(super) labels: BTreeMap<String, String>,
    /// Apply again at the sink's next flush: the Node's labels changed (the
    /// Node watch), or the CiliumNode lost a label or the routing-mode
    /// annotation the agent wrote (its own watch: [`AgentFields::lost_from`]).
    pub(super) reapply: bool,
}

impl AgentFields {
    /// The router and health addresses the journal says the node published, so
    /// the first apply of a restarted agent keeps them (an apply without them
    /// would drop them from the CiliumNode until the state is restored, and the
    /// other nodes would withdraw their routes to this node meanwhile).
    pub(super) fn from_journal(node: Option<&NodeResource>) -> AgentFields {
        let Some(node) = node else {
            return AgentFields::default();
        };
        AgentFields {
            router_addresses: node
                .spec
                .addresses
                .iter()
                .filter(|a| a.kind == "CiliumInternalIP")
                .cloned()
                .collect(),
            health: node.spec.health.clone(),
            ..AgentFields::default()
        }
    }

    /// Whether `node` (the CiliumNode as the watch sees it) lacks a label or the
    /// routing-mode annotation these fields write: removed or changed behind the
    /// agent's back. Labels others added are not the agent's and do not count.
    pub(super) fn lost_from(&self, node: &NodeResource) -> bool {
        let labels = &node.metadata.labels;
        let label_lost = self.labels.iter().any(|(k, v)| labels.get(k) != Some(v));
        let said = node.metadata.annotations.get(ROUTING_MODE_ANNOTATION);
        let mode_lost =
            !self.routing_mode.is_empty() && said.map(String::as_str) != Some(self.routing_mode);
        label_lost || mode_lost
    }

    /// The apply of every field the agent owns, to CiliumNode `node_name` at
    /// `api_version`.
    pub(super) fn apply_body(&self, node_name: &str, api_version: &str) -> ApplyBody {
        let addresses: Vec<serde_json::Value> = self
            .internal_ips
            .iter()
            .map(|ip| json!({"type": "InternalIP", "ip": ip}))
            .chain(
                self.router_addresses
                    .iter()
                    .map(|a| json!({"type": a.kind, "ip": a.ip})),
            )
            .collect();
        let mut ipam = serde_json::Map::new();
        if let Some(cidrs) = &self.pod_cidrs {
            ipam.insert("podCIDRs".into(), json!(cidrs));
        }
        if let Some(requested) = &self.requested {
            ipam.insert("pools".into(), json!({ "requested": requested }));
        }
        let mut spec = json!({"addresses": addresses, "ipam": ipam});
        if !self.health.is_empty() {
            spec["health"] = json!(self.health);
        }
        let mut body = ApplyBody::new(api_version, "CiliumNode", node_name);
        let mut annotations = serde_json::Map::new();
        if !self.sticky_requests.is_empty() {
            annotations.insert(
                STICKY_REQUESTS.into(),
                json!(requests_annotation(&self.sticky_requests)),
            );
        }
        if !self.routing_mode.is_empty() {
            annotations.insert(ROUTING_MODE_ANNOTATION.into(), json!(self.routing_mode));
        }
        if !annotations.is_empty() {
            body = body.meta("annotations", serde_json::Value::Object(annotations));
        }
        if !self.labels.is_empty() {
            body = body.meta("labels", json!(self.labels));
        }
        let body = if self.node_uid.is_empty() {
            body
        } else {
            // Deleting the Node deletes its CiliumNode.
            body.owned_by("v1", "Node", node_name, &self.node_uid)
        };
        body.with("spec", spec)
    }
}

/// crd/eni: the status apply of `status.ipam.used` and `ipv6-used`.
pub(super) fn used_body(api_version: &str, name: &str, used: &UsedAddresses) -> ApplyBody {
    ApplyBody::new(api_version, "CiliumNode", name).with(
        "status",
        json!({"ipam": {"used": used.ipv4, "ipv6-used": used.ipv6}}),
    )
}

/// The status apply of the [`FIT_CONDITION`].
pub(super) fn fit_body(api_version: &str, name: &str, condition: serde_json::Value) -> ApplyBody {
    ApplyBody::new(api_version, "CiliumNode", name)
        .with("status", json!({"conditions": [condition]}))
}

/// cluster-pool: the status apply of `status.ipam.pod-cidrs`.
pub(super) fn pod_cidrs_body(
    api_version: &str,
    name: &str,
    pod_cidrs: &BTreeMap<String, PodCidrStatus>,
) -> ApplyBody {
    ApplyBody::new(api_version, "CiliumNode", name)
        .with("status", json!({"ipam": {"pod-cidrs": pod_cidrs}}))
}

/// multi-pool: the merge patch giving blocks back (`allocated` without them),
/// only as of resourceVersion `rv`.
pub(super) fn release_body(rv: Option<&str>, allocated: &[serde_json::Value]) -> serde_json::Value {
    json!({
        "metadata": {"resourceVersion": rv},
        "spec": {"ipam": {"pools": {"allocated": allocated}}},
    })
}

/// The [`FIT_CONDITION`] saying `fit`, when the CiliumNode's (`old`) does not say
/// the same already (type, status, reason and message); its transition time is
/// `old`'s while the status stays.
pub(super) fn fit_condition(
    fit: &ConfigFit,
    old: Option<&serde_json::Value>,
) -> Option<serde_json::Value> {
    let status = if fit.fits { "True" } else { "False" };
    let condition = condition_json(FIT_CONDITION, status, &fit.reason, &fit.message, old);
    let same = old.is_some_and(|o| {
        ["type", "status", "reason", "message"]
            .iter()
            .all(|k| o[k] == condition[k])
    });
    (!same).then_some(condition)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::kubernetes::seen::fit_in;

    /// The wire, pinned: each body the agent sends, whole.
    fn wire(body: &impl serde::Serialize) -> serde_json::Value {
        serde_json::to_value(body).unwrap()
    }

    fn requested(pool: &str, v4: u64) -> RequestedPool {
        RequestedPool {
            pool: pool.into(),
            needed: crate::resources::PoolDemand {
                ipv4_addrs: v4,
                ipv6_addrs: 0,
            },
        }
    }

    #[test]
    fn golden_the_agent_fields_apply_in_each_mode() {
        let full = AgentFields {
            node_uid: "u-1".into(),
            internal_ips: vec!["10.250.0.2".into(), "fd00::2".into()],
            router_addresses: vec![NodeAddress {
                kind: "CiliumInternalIP".into(),
                ip: "10.244.1.1".into(),
            }],
            health: HealthAddresses {
                ipv4: "10.244.1.2".into(),
                ipv6: "fd00:1::2".into(),
            },
            pod_cidrs: Some(vec!["10.244.1.0/24".parse().unwrap()]),
            requested: Some(vec![requested("default", 16)]),
            sticky_requests: BTreeMap::from([("db/web-0".into(), "web".into())]),
            routing_mode: "tunnel",
            labels: BTreeMap::from([("kubernetes.io/os".into(), "linux".into())]),
            reapply: false,
        };
        assert_eq!(
            wire(&full.apply_body("n1", "cilium.io/v2")),
            json!({
                "apiVersion": "cilium.io/v2",
                "kind": "CiliumNode",
                "metadata": {
                    "name": "n1",
                    "labels": {"kubernetes.io/os": "linux"},
                    "ownerReferences": [
                        {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u-1"}
                    ],
                    "annotations": {
                        "ipam.podnet.io/sticky-requests": "{\"db/web-0\":\"web\"}",
                        "podnet.io/routing-mode": "tunnel",
                    },
                },
                "spec": {
                    "addresses": [
                        {"type": "InternalIP", "ip": "10.250.0.2"},
                        {"type": "InternalIP", "ip": "fd00::2"},
                        {"type": "CiliumInternalIP", "ip": "10.244.1.1"},
                    ],
                    "ipam": {
                        "podCIDRs": ["10.244.1.0/24"],
                        "pools": {"requested": [
                            {"pool": "default", "needed": {"ipv4-addrs": 16}}
                        ]},
                    },
                    "health": {"ipv4": "10.244.1.2", "ipv6": "fd00:1::2"},
                },
            })
        );
        // A first apply before the Node is read: no owner, no health, an
        // empty ipam (cluster-pool: the operator's podCIDRs are never sent).
        assert_eq!(
            wire(&AgentFields::default().apply_body("n2", "cilium.io/v2")),
            json!({
                "apiVersion": "cilium.io/v2",
                "kind": "CiliumNode",
                "metadata": {"name": "n2"},
                "spec": {"addresses": [], "ipam": {}},
            })
        );
    }

    #[test]
    fn golden_the_status_applies_and_the_release_patch() {
        let owned = crate::resources::AllocationIp {
            owner: "default/pod-a".into(),
            resource: String::new(),
        };
        let used = UsedAddresses {
            ipv4: BTreeMap::from([("10.1.0.5".to_string(), owned)]),
            ipv6: BTreeMap::new(),
        };
        assert_eq!(
            wire(&used_body("cilium.io/v2", "n1", &used)),
            json!({
                "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
                "metadata": {"name": "n1"},
                "status": {"ipam": {
                    "used": {"10.1.0.5": {"owner": "default/pod-a"}},
                    "ipv6-used": {},
                }},
            })
        );
        let condition = json!({"type": FIT_CONDITION, "status": "True", "reason": "Fits",
            "message": "m", "lastTransitionTime": "2025-01-01T00:00:00Z"});
        assert_eq!(
            wire(&fit_body("cilium.io/v2", "n1", condition.clone())),
            json!({
                "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
                "metadata": {"name": "n1"},
                "status": {"conditions": [condition]},
            })
        );
        let cidrs = BTreeMap::from([
            (
                "10.244.1.0/24".to_string(),
                PodCidrStatus {
                    status: crate::resources::PodCidrState::InUse,
                },
            ),
            (
                "10.244.9.0/24".to_string(),
                PodCidrStatus {
                    status: crate::resources::PodCidrState::Depleted,
                },
            ),
        ]);
        assert_eq!(
            wire(&pod_cidrs_body("cilium.io/v2", "n1", &cidrs)),
            json!({
                "apiVersion": "cilium.io/v2", "kind": "CiliumNode",
                "metadata": {"name": "n1"},
                "status": {"ipam": {"pod-cidrs": {
                    "10.244.1.0/24": {"status": "in-use"},
                    "10.244.9.0/24": {"status": "depleted"},
                }}},
            })
        );
        let kept = vec![json!({"pool": "default", "cidrs": ["10.10.0.0/26"]})];
        assert_eq!(
            release_body(Some("7"), &kept),
            json!({
                "metadata": {"resourceVersion": "7"},
                "spec": {"ipam": {"pools": {"allocated": [
                    {"pool": "default", "cidrs": ["10.10.0.0/26"]}
                ]}}},
            })
        );
    }

    #[test]
    fn the_condition_is_written_only_when_it_says_something_new() {
        let fit = |fits: bool, reason: &str| ConfigFit {
            fits,
            reason: reason.into(),
            message: "m".into(),
        };
        let mut node = NodeResource::new("n1");
        assert_eq!(fit_in(&node), None);
        let first = fit_condition(&fit(false, "NodeWithoutIPv6"), None).expect("a first condition");
        assert_eq!(first["type"], FIT_CONDITION);
        assert_eq!(first["status"], "False");
        node.status.extra.insert(
            "conditions".into(),
            json!([{"type": "other.io/X", "status": "True"}, first.clone()]),
        );
        let seen = fit_in(&node).expect("the node's condition");
        // A restarted agent with the same verdict writes nothing.
        assert_eq!(
            fit_condition(&fit(false, "NodeWithoutIPv6"), Some(&seen)),
            None
        );
        // Another reason, same status: written, the transition time kept.
        let next = fit_condition(&fit(false, "IPv6PodsOnIPv4Node"), Some(&seen)).unwrap();
        assert_eq!(next["lastTransitionTime"], seen["lastTransitionTime"]);
        assert!(fit_condition(&fit(true, "Fits"), Some(&seen)).is_some());
    }

    #[test]
    fn a_label_or_the_routing_mode_edited_behind_the_agents_back_is_lost() {
        let f = AgentFields {
            labels: BTreeMap::from([("kubernetes.io/os".into(), "linux".into())]),
            routing_mode: "native",
            ..AgentFields::default()
        };
        let mut node = NodeResource::new("n1");
        node.metadata.labels = f.labels.clone();
        node.metadata
            .annotations
            .insert(ROUTING_MODE_ANNOTATION.into(), "native".into());
        assert!(!f.lost_from(&node));
        // A label someone else added is not the agent's.
        node.metadata.labels.insert("team".into(), "a".into());
        assert!(!f.lost_from(&node));
        let mut edited = node.clone();
        edited.metadata.labels.remove("kubernetes.io/os");
        assert!(f.lost_from(&edited));
        let mut edited = node.clone();
        edited
            .metadata
            .labels
            .insert("kubernetes.io/os".into(), "windows".into());
        assert!(f.lost_from(&edited));
        let mut edited = node.clone();
        edited.metadata.annotations.remove(ROUTING_MODE_ANNOTATION);
        assert!(f.lost_from(&edited));
        // No mode to say: its annotation is not the agent's to keep.
        let quiet = AgentFields {
            routing_mode: "",
            ..f.clone()
        };
        assert!(!quiet.lost_from(&edited));
    }

    #[test]
    fn an_apply_sends_every_field_the_agent_owns() {
        let f = AgentFields {
            node_uid: "u-1".into(),
            internal_ips: vec!["10.250.0.2".into()],
            router_addresses: vec![NodeAddress {
                kind: "CiliumInternalIP".into(),
                ip: "10.244.1.1".into(),
            }],
            health: HealthAddresses {
                ipv4: "10.244.1.2".into(),
                ipv6: String::new(),
            },
            pod_cidrs: None,
            requested: Some(Vec::new()),
            sticky_requests: BTreeMap::new(),
            routing_mode: "native",
            ..AgentFields::default()
        };
        let body = wire(&f.apply_body("n1", "cilium.io/v2"));
        // No sticky request: no such annotation (the apply gives it up).
        assert_eq!(
            body["metadata"]["annotations"],
            json!({"podnet.io/routing-mode": "native"})
        );
        assert_eq!(body["spec"]["health"]["ipv4"], "10.244.1.2");
        assert!(body["spec"]["health"].get("ipv6").is_none());
        assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(body["metadata"]["ownerReferences"][0]["kind"], "Node");
        assert_eq!(body["spec"]["addresses"][0]["type"], "InternalIP");
        assert_eq!(body["spec"]["addresses"][1]["ip"], "10.244.1.1");
        // cluster-pool: the operator owns podCIDRs; the agent never sends them.
        assert!(body["spec"]["ipam"].get("podCIDRs").is_none());
        assert!(body["spec"]["ipam"]["pools"]["requested"].is_array());
    }

    #[test]
    fn a_restarted_agent_first_applies_the_addresses_the_journal_knows() {
        let mut journal = NodeResource::new("n1");
        journal.set_address("InternalIP", "10.250.0.2".parse().unwrap());
        journal.set_address("CiliumInternalIP", "10.244.1.1".parse().unwrap());
        journal.spec.health.ipv4 = "10.244.1.2".into();
        let f = AgentFields::from_journal(Some(&journal));
        let body = wire(&f.apply_body("n1", "cilium.io/v2"));
        assert_eq!(
            body["spec"]["addresses"],
            json!([{"type": "CiliumInternalIP", "ip": "10.244.1.1"}]),
            "the InternalIP comes from the Node, not the journal"
        );
        assert_eq!(body["spec"]["health"]["ipv4"], "10.244.1.2");
        assert!(AgentFields::from_journal(None).router_addresses.is_empty());
    }
}
