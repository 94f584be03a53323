//! What the journal stores: one record per allocated address and per registered
//! endpoint. Records are JSON inside redb, so a human can read a dump of them.

use std::net::IpAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Where an allocated address is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AllocationState {
    /// Handed out with an expiration timer; no endpoint registered yet.
    Pending,
    /// Bound to a registered endpoint (or allocated without expiration).
    Bound,
    /// Reserved by the daemon for itself (router, health, ingress).
    Infra,
    /// Released, but not handed out again before `cooling_until_ms`.
    Cooling,
}

/// One allocated address.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocationRecord {
    pub ip: IpAddr,
    /// `ipv4` or `ipv6`.
    pub family: crate::ipam::Family,
    pub pool: String,
    pub owner: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ifname: Option<String>,
    /// The CNI network name the allocation was made for (GC scope).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    pub state: AllocationState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiration_uuid: Option<String>,
    /// When a pending allocation expires (ms since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    pub allocated_at_ms: u64,
    /// The host-side link of the attachment, when known (rebuilt from the kernel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_ifname: Option<String>,
    /// When a cooling address may be handed out again (ms since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cooling_until_ms: Option<u64>,
    /// Why the address came from its pool (the pool-selection step), for explain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selected_by: Option<String>,
    /// The UID of the pod it was allocated for (`K8S_POD_UID`), for the leak
    /// check: a new pod of the same name is another pod. Journals written before
    /// it existed have none, and an older podnet ignores it (docs/crash-safety.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
}

impl AllocationRecord {
    /// The journal key: `<pool>/<ip>`.
    pub fn key(&self) -> String {
        allocation_key(&self.pool, &self.ip)
    }

    /// True if this live allocation belongs to the given attachment.
    pub fn is_for(&self, container_id: &str, ifname: Option<&str>) -> bool {
        self.state != AllocationState::Cooling
            && self.container_id.as_deref() == Some(container_id)
            && ifname.is_none_or(|i| self.ifname.as_deref() == Some(i))
    }
}

/// The journal key of an allocation.
pub fn allocation_key(pool: &str, ip: &IpAddr) -> String {
    format!("{pool}/{ip}")
}

/// One registered endpoint (a CNI attachment that completed ADD).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointRecord {
    pub container_id: String,
    pub ifname: String,
    /// The host-side link name.
    pub host_ifname: String,
    pub owner: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<IpAddr>,
    pub pool: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<String>,
    pub created_at_ms: u64,
    /// The addresses belong to a delegated IPAM plugin: the daemon never frees them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub external_ipam: bool,
}

impl EndpointRecord {
    /// The journal key: `<containerID>:<ifname>`.
    pub fn key(&self) -> String {
        Self::key_of(&self.container_id, &self.ifname)
    }

    /// The journal key of the endpoint of an attachment.
    pub fn key_of(container_id: &str, ifname: &str) -> String {
        format!("{container_id}:{ifname}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(json: serde_json::Value) -> AllocationRecord {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_record_without_a_pod_uid_loads_and_one_with_it_round_trips() {
        let old = serde_json::json!({
            "ip": "10.0.0.3", "family": "ipv4", "pool": "default", "owner": "ns/a",
            "container_id": "c", "ifname": "eth0", "state": "bound", "allocated_at_ms": 1
        });
        assert_eq!(decode(old.clone()).pod_uid, None);
        let mut new = old.clone();
        new["pod_uid"] = "u-1".into();
        let rec = decode(new.clone());
        assert_eq!(rec.pod_uid.as_deref(), Some("u-1"));
        assert_eq!(serde_json::to_value(&rec).unwrap(), new);
        // Without a UID nothing is written: the record is as an older podnet wrote it.
        assert_eq!(serde_json::to_value(decode(old.clone())).unwrap(), old);
    }

    #[test]
    fn a_field_the_reader_does_not_know_is_ignored() {
        // What lets a podnet that predates `pod_uid` read a record that has it
        // (the record's serde derive never refused unknown fields).
        let mut json = serde_json::json!({
            "ip": "10.0.0.3", "family": "ipv4", "pool": "default", "owner": "ns/a",
            "state": "bound", "allocated_at_ms": 1
        });
        json["a_field_from_a_newer_podnet"] = "x".into();
        assert_eq!(decode(json).owner, "ns/a");
    }
}
