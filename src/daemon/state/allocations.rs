//! The node's allocations by address, with an index by attachment: the host link
//! name of (container ID, interface), the name podnet gives the link, and the name
//! an allocation adopted from the kernel was found under. Every ADD and DEL looks
//! its attachment's addresses up here instead of walking every allocation on the
//! node, which made their cost grow with the pods on it. Reads go through `Deref`
//! to the map by address; changes only through `insert` and `remove`, which keep
//! the index in step.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::ops::Deref;

use crate::datapath::host_ifname;
use crate::store::AllocationRecord;

/// Boxed records: the map's nodes then hold 8-byte values, not whole records,
/// which halves its memory (ascending inserts leave nodes about half full).
#[derive(Default)]
pub struct Allocations {
    by_ip: BTreeMap<IpAddr, Box<AllocationRecord>>,
    by_link: HashMap<String, Vec<IpAddr>>,
}

impl Deref for Allocations {
    type Target = BTreeMap<IpAddr, Box<AllocationRecord>>;

    fn deref(&self) -> &Self::Target {
        &self.by_ip
    }
}

impl Allocations {
    /// Adds or replaces the record of `rec.ip`; returns the one it replaced.
    pub fn insert(&mut self, rec: AllocationRecord) -> Option<Box<AllocationRecord>> {
        let old = self.remove(&rec.ip);
        for link in links_of(&rec) {
            self.by_link.entry(link).or_default().push(rec.ip);
        }
        self.by_ip.insert(rec.ip, Box::new(rec));
        old
    }

    /// Removes the record of `ip`.
    pub fn remove(&mut self, ip: &IpAddr) -> Option<Box<AllocationRecord>> {
        let old = self.by_ip.remove(ip)?;
        for link in links_of(&old) {
            if let Entry::Occupied(mut e) = self.by_link.entry(link) {
                e.get_mut().retain(|a| a != ip);
                if e.get().is_empty() {
                    e.remove();
                }
            }
        }
        Some(old)
    }

    /// The records made for, or adopted under, the host link `link` (callers check
    /// the attachment itself: two attachments could share a name's hash).
    pub fn of_link<'a>(&'a self, link: &str) -> impl Iterator<Item = &'a AllocationRecord> {
        self.by_link
            .get(link)
            .into_iter()
            .flatten()
            .filter_map(|ip| self.by_ip.get(ip))
            .map(|b| &**b)
    }
}

/// The host link names a record is found under: the one podnet names for its
/// container ID and interface, and the one it was adopted under, if different.
fn links_of(rec: &AllocationRecord) -> Vec<String> {
    let made = match (&rec.container_id, &rec.ifname) {
        (Some(c), Some(i)) => Some(host_ifname(c, i)),
        _ => None,
    };
    let adopted = rec.host_ifname.clone().filter(|h| Some(h) != made.as_ref());
    made.into_iter().chain(adopted).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::Family;
    use crate::store::AllocationState;

    fn rec(ip: &str, attachment: Option<(&str, &str)>, adopted: Option<&str>) -> AllocationRecord {
        AllocationRecord {
            ip: ip.parse().unwrap(),
            family: Family::V4,
            pool: "default".into(),
            owner: "ns/pod".into(),
            container_id: attachment.map(|a| a.0.to_string()),
            ifname: attachment.map(|a| a.1.to_string()),
            network: None,
            state: AllocationState::Bound,
            expiration_uuid: None,
            expires_at_ms: None,
            allocated_at_ms: 0,
            host_ifname: adopted.map(str::to_string),
            cooling_until_ms: None,
            selected_by: None,
        }
    }

    fn ips_of(a: &Allocations, link: &str) -> Vec<String> {
        let mut v: Vec<String> = a.of_link(link).map(|r| r.ip.to_string()).collect();
        v.sort();
        v
    }

    #[test]
    fn an_attachment_finds_its_addresses_and_loses_them_when_they_go_or_move() {
        let mut a = Allocations::default();
        let link = host_ifname("c1", "eth0");
        a.insert(rec("10.0.0.2", Some(("c1", "eth0")), None));
        a.insert(rec("10.0.0.3", Some(("c1", "eth0")), None));
        a.insert(rec("10.0.0.4", Some(("c2", "eth0")), None));
        a.insert(rec("10.0.0.5", None, None));
        assert_eq!(ips_of(&a, &link), ["10.0.0.2", "10.0.0.3"]);
        assert_eq!(a.len(), 4);
        // Replaced by a record of another attachment: found under that one only.
        let old = a.insert(rec("10.0.0.3", Some(("c2", "eth0")), None));
        assert_eq!(old.map(|r| r.container_id), Some(Some("c1".to_string())));
        assert_eq!(ips_of(&a, &link), ["10.0.0.2"]);
        assert_eq!(
            ips_of(&a, &host_ifname("c2", "eth0")),
            ["10.0.0.3", "10.0.0.4"]
        );
        assert!(a.remove(&"10.0.0.2".parse().unwrap()).is_some());
        assert!(ips_of(&a, &link).is_empty());
        assert!(!a.by_link.contains_key(&link), "no empty entry is kept");
        assert!(a.remove(&"10.0.0.2".parse().unwrap()).is_none());
    }

    #[test]
    fn an_adopted_address_is_found_under_its_link_name_too() {
        let mut a = Allocations::default();
        a.insert(rec("10.0.0.7", None, Some("lxcadopted0001")));
        assert_eq!(ips_of(&a, "lxcadopted0001"), ["10.0.0.7"]);
        let made = host_ifname("c3", "eth0");
        a.insert(rec("10.0.0.8", Some(("c3", "eth0")), Some(&made)));
        assert_eq!(ips_of(&a, &made), ["10.0.0.8"], "listed once");
        a.remove(&"10.0.0.7".parse().unwrap());
        a.remove(&"10.0.0.8".parse().unwrap());
        assert!(a.by_link.is_empty());
    }
}
