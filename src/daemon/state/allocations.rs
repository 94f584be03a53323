//! The allocations in memory: one compact slot per address, keyed by the address
//! as a number (IPv4 and IPv6 apart), with the names many addresses share (pools,
//! interface and network names, pool-selection codes) stored once. What goes in
//! is the journal's `AllocationRecord`, and `record()` gives it back field for
//! field; the fields only a pod's attachment or a timer uses are boxed apart, so
//! an address without them costs one 56-byte slot and its owner string.
//!
//! An index by attachment goes with it: the host link name of (container ID,
//! interface), the name podnet gives the link, and the name an allocation adopted
//! from the kernel was found under. Every ADD and DEL looks its attachment's
//! addresses up there instead of walking every allocation on the node, which made
//! their cost grow with the pods on it. Changes go only through `insert` and
//! `remove` (or a `Loader`), which keep the index in step.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::num::NonZeroU32;
use std::sync::Arc;

use crate::datapath::host_ifname;
use crate::ipam::Family;
use crate::store::{AllocationRecord, AllocationState};

/// Every allocation of the node, by address.
#[derive(Default)]
pub struct Allocations {
    v4: BTreeMap<u32, Slot>,
    v6: BTreeMap<u128, Slot>,
    names: Names,
    /// Addresses by the host link names of their attachment (`links_of`).
    by_link: HashMap<Box<str>, Vec<IpAddr>>,
}

/// One address's record without the address (the map's key).
struct Slot {
    owner: Box<str>,
    allocated_at_ms: u64,
    attachment: Option<Box<Attachment>>,
    deadlines: Option<Box<Deadlines>>,
    pool: NameId,
    selected_by: Option<NameId>,
    family: Family,
    state: AllocationState,
}

/// The CNI attachment an address serves.
struct Attachment {
    container_id: Option<Box<str>>,
    ifname: Option<NameId>,
    network: Option<NameId>,
    host_ifname: Option<Box<str>>,
    /// The pod's UID (`K8S_POD_UID`), for the leak check.
    pod_uid: Option<Box<str>>,
}

/// A pending address's expiration, a cooling address's end of cooldown.
struct Deadlines {
    expiration_uuid: Option<Box<str>>,
    expires_at_ms: Option<u64>,
    cooling_until_ms: Option<u64>,
}

/// A name in the table (its index plus one).
#[derive(Clone, Copy)]
struct NameId(NonZeroU32);

/// Names shared by many allocations, each stored once. Names are never removed:
/// pools, interface names, networks and selection codes are few.
#[derive(Default)]
struct Names {
    list: Vec<Arc<str>>,
    index: HashMap<Arc<str>, NameId>,
}

impl Names {
    fn intern(&mut self, name: &str) -> NameId {
        if let Some(id) = self.index.get(name) {
            return *id;
        }
        let shared: Arc<str> = Arc::from(name);
        let id = NameId(
            u32::try_from(self.list.len() + 1)
                .ok()
                .and_then(NonZeroU32::new)
                .unwrap_or(NonZeroU32::MAX),
        );
        self.list.push(shared.clone());
        self.index.insert(shared, id);
        id
    }

    fn get(&self, id: NameId) -> &str {
        self.list
            .get(id.0.get() as usize - 1)
            .map_or("", |s| s.as_ref())
    }
}

/// One allocation, read in place.
#[derive(Clone, Copy)]
pub struct Allocation<'a> {
    pub ip: IpAddr,
    slot: &'a Slot,
    names: &'a Names,
}

impl<'a> Allocation<'a> {
    pub fn state(&self) -> AllocationState {
        self.slot.state
    }

    pub fn family(&self) -> Family {
        self.slot.family
    }

    pub fn pool(&self) -> &'a str {
        self.names.get(self.slot.pool)
    }

    pub fn owner(&self) -> &'a str {
        &self.slot.owner
    }

    pub fn allocated_at_ms(&self) -> u64 {
        self.slot.allocated_at_ms
    }

    pub fn selected_by(&self) -> Option<&'a str> {
        self.slot.selected_by.map(|id| self.names.get(id))
    }

    pub fn container_id(&self) -> Option<&'a str> {
        self.slot.attachment.as_ref()?.container_id.as_deref()
    }

    pub fn ifname(&self) -> Option<&'a str> {
        let id = self.slot.attachment.as_ref()?.ifname?;
        Some(self.names.get(id))
    }

    pub fn network(&self) -> Option<&'a str> {
        let id = self.slot.attachment.as_ref()?.network?;
        Some(self.names.get(id))
    }

    pub fn host_ifname(&self) -> Option<&'a str> {
        self.slot.attachment.as_ref()?.host_ifname.as_deref()
    }

    pub fn pod_uid(&self) -> Option<&'a str> {
        self.slot.attachment.as_ref()?.pod_uid.as_deref()
    }

    pub fn expiration_uuid(&self) -> Option<&'a str> {
        self.slot.deadlines.as_ref()?.expiration_uuid.as_deref()
    }

    pub fn expires_at_ms(&self) -> Option<u64> {
        self.slot.deadlines.as_ref()?.expires_at_ms
    }

    pub fn cooling_until_ms(&self) -> Option<u64> {
        self.slot.deadlines.as_ref()?.cooling_until_ms
    }

    /// True if this live allocation belongs to the given attachment.
    pub fn is_for(&self, container_id: &str, ifname: Option<&str>) -> bool {
        self.state() != AllocationState::Cooling
            && self.container_id() == Some(container_id)
            && ifname.is_none_or(|i| self.ifname() == Some(i))
    }

    /// The journal's record of this allocation.
    pub fn record(&self) -> AllocationRecord {
        let owned = |s: Option<&str>| s.map(str::to_string);
        AllocationRecord {
            ip: self.ip,
            family: self.family(),
            pool: self.pool().to_string(),
            owner: self.owner().to_string(),
            container_id: owned(self.container_id()),
            ifname: owned(self.ifname()),
            network: owned(self.network()),
            state: self.state(),
            expiration_uuid: owned(self.expiration_uuid()),
            expires_at_ms: self.expires_at_ms(),
            allocated_at_ms: self.allocated_at_ms(),
            host_ifname: owned(self.host_ifname()),
            cooling_until_ms: self.cooling_until_ms(),
            selected_by: owned(self.selected_by()),
            pod_uid: owned(self.pod_uid()),
        }
    }
}

impl Allocations {
    pub fn get(&self, ip: &IpAddr) -> Option<Allocation<'_>> {
        let slot = match ip {
            IpAddr::V4(a) => self.v4.get(&u32::from(*a)),
            IpAddr::V6(a) => self.v6.get(&u128::from(*a)),
        }?;
        Some(self.view(*ip, slot))
    }

    /// Every allocation, IPv4 first, each family in address order.
    pub fn iter(&self) -> impl Iterator<Item = Allocation<'_>> {
        let v4 = self
            .v4
            .iter()
            .map(|(k, s)| self.view(IpAddr::V4(Ipv4Addr::from(*k)), s));
        let v6 = self
            .v6
            .iter()
            .map(|(k, s)| self.view(IpAddr::V6(Ipv6Addr::from(*k)), s));
        v4.chain(v6)
    }

    /// Adds or replaces the allocation of `rec.ip`.
    pub fn insert(&mut self, rec: AllocationRecord) {
        let ip = rec.ip;
        self.take(&ip);
        for link in links_of(
            rec.container_id.as_deref(),
            rec.ifname.as_deref(),
            rec.host_ifname.as_deref(),
        ) {
            self.by_link.entry(link).or_default().push(ip);
        }
        let slot = self.slot(rec);
        match ip {
            IpAddr::V4(a) => {
                self.v4.insert(u32::from(a), slot);
            }
            IpAddr::V6(a) => {
                self.v6.insert(u128::from(a), slot);
            }
        }
    }

    /// Starts a bulk load (restore): records are staged one by one as they are
    /// read, and `finish_load` builds the maps in one pass, with full nodes
    /// (inserting ascending addresses one at a time leaves them half full).
    pub fn loader() -> Loader {
        Loader::default()
    }

    /// Removes the allocation of `ip` and returns its record.
    pub fn remove(&mut self, ip: &IpAddr) -> Option<AllocationRecord> {
        let slot = self.take(ip)?;
        Some(self.view(*ip, &slot).record())
    }

    /// Takes the slot of `ip` out of the maps and the index (without building its
    /// record: `insert` replaces a slot on every ADD and bind).
    fn take(&mut self, ip: &IpAddr) -> Option<Slot> {
        let slot = match ip {
            IpAddr::V4(a) => self.v4.remove(&u32::from(*a)),
            IpAddr::V6(a) => self.v6.remove(&u128::from(*a)),
        }?;
        let view = Allocation {
            ip: *ip,
            slot: &slot,
            names: &self.names,
        };
        let links: Vec<Box<str>> =
            links_of(view.container_id(), view.ifname(), view.host_ifname()).collect();
        for link in links {
            if let Entry::Occupied(mut e) = self.by_link.entry(link) {
                e.get_mut().retain(|a| a != ip);
                if e.get().is_empty() {
                    e.remove();
                }
            }
        }
        Some(slot)
    }

    /// The allocations made for, or adopted under, the host link `link` (callers
    /// check the attachment itself: two attachments could share a name's hash).
    pub fn of_link<'a>(&'a self, link: &str) -> impl Iterator<Item = Allocation<'a>> {
        self.by_link
            .get(link)
            .into_iter()
            .flatten()
            .filter_map(|ip| self.get(ip))
    }

    fn view<'a>(&'a self, ip: IpAddr, slot: &'a Slot) -> Allocation<'a> {
        Allocation {
            ip,
            slot,
            names: &self.names,
        }
    }

    fn slot(&mut self, rec: AllocationRecord) -> Slot {
        make_slot(&mut self.names, rec)
    }
}

/// Records staged for `Allocations::loader`.
#[derive(Default)]
pub struct Loader {
    v4: Vec<(u32, Slot)>,
    v6: Vec<(u128, Slot)>,
    names: Names,
}

impl Loader {
    pub fn push(&mut self, rec: AllocationRecord) {
        let ip = rec.ip;
        let slot = make_slot(&mut self.names, rec);
        match ip {
            IpAddr::V4(a) => self.v4.push((u32::from(a), slot)),
            IpAddr::V6(a) => self.v6.push((u128::from(a), slot)),
        }
    }

    /// The table of the staged records (a later record of the same address
    /// replaces an earlier one).
    pub fn finish(self) -> Allocations {
        let mut table = Allocations {
            v4: self.v4.into_iter().collect(),
            v6: self.v6.into_iter().collect(),
            names: self.names,
            by_link: HashMap::new(),
        };
        let mut by_link: HashMap<Box<str>, Vec<IpAddr>> = HashMap::new();
        for a in table.iter() {
            for link in links_of(a.container_id(), a.ifname(), a.host_ifname()) {
                by_link.entry(link).or_default().push(a.ip);
            }
        }
        table.by_link = by_link;
        table
    }
}

/// The host link names an allocation is found under: the one podnet names for its
/// container ID and interface, and the one it was adopted under, if different.
fn links_of(
    container_id: Option<&str>,
    ifname: Option<&str>,
    adopted: Option<&str>,
) -> impl Iterator<Item = Box<str>> {
    let made = match (container_id, ifname) {
        (Some(c), Some(i)) => Some(host_ifname(c, i)),
        _ => None,
    };
    let adopted = adopted
        .filter(|h| made.as_deref() != Some(*h))
        .map(Box::<str>::from);
    made.map(String::into_boxed_str).into_iter().chain(adopted)
}

fn make_slot(names: &mut Names, rec: AllocationRecord) -> Slot {
    let attachment = (rec.container_id.is_some()
        || rec.ifname.is_some()
        || rec.network.is_some()
        || rec.host_ifname.is_some()
        || rec.pod_uid.is_some())
    .then(|| {
        Box::new(Attachment {
            container_id: rec.container_id.map(String::into_boxed_str),
            ifname: rec.ifname.as_deref().map(|n| names.intern(n)),
            network: rec.network.as_deref().map(|n| names.intern(n)),
            host_ifname: rec.host_ifname.map(String::into_boxed_str),
            pod_uid: rec.pod_uid.map(String::into_boxed_str),
        })
    });
    let deadlines = (rec.expiration_uuid.is_some()
        || rec.expires_at_ms.is_some()
        || rec.cooling_until_ms.is_some())
    .then(|| {
        Box::new(Deadlines {
            expiration_uuid: rec.expiration_uuid.map(String::into_boxed_str),
            expires_at_ms: rec.expires_at_ms,
            cooling_until_ms: rec.cooling_until_ms,
        })
    });
    Slot {
        owner: rec.owner.into_boxed_str(),
        allocated_at_ms: rec.allocated_at_ms,
        attachment,
        deadlines,
        pool: names.intern(&rec.pool),
        selected_by: rec.selected_by.as_deref().map(|s| names.intern(s)),
        family: rec.family,
        state: rec.state,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(ip: &str) -> AllocationRecord {
        AllocationRecord {
            ip: ip.parse().unwrap(),
            family: Family::of_addr(&ip.parse().unwrap()),
            pool: "blue".into(),
            owner: "ns/pod".into(),
            container_id: Some("c".repeat(64)),
            ifname: Some("eth0".into()),
            network: Some("podnet".into()),
            state: AllocationState::Pending,
            expiration_uuid: Some("7d1c".into()),
            expires_at_ms: Some(12),
            allocated_at_ms: 3,
            host_ifname: Some("lxc1".into()),
            cooling_until_ms: Some(44),
            selected_by: Some("pod-annotation".into()),
            pod_uid: Some("6f1c2d3e-0000-4000-8000-00000000000a".into()),
        }
    }

    fn bare(ip: &str) -> AllocationRecord {
        AllocationRecord {
            allocated_at_ms: 9,
            ..super::super::restore::infra_record(ip.parse().unwrap(), "router")
        }
    }

    #[test]
    fn records_come_back_field_for_field() {
        let mut a = Allocations::default();
        let records = [full("10.0.0.2"), bare("10.0.0.1"), full("fd00::5")];
        for r in &records {
            a.insert(r.clone());
        }
        for r in &records {
            assert_eq!(a.get(&r.ip).unwrap().record(), *r);
        }
        let order: Vec<String> = a.iter().map(|r| r.ip.to_string()).collect();
        assert_eq!(order, ["10.0.0.1", "10.0.0.2", "fd00::5"]);
        assert_eq!(a.remove(&records[0].ip), Some(records[0].clone()));
        assert!(a.get(&records[0].ip).is_none());
        assert_eq!(a.iter().count(), 2);
    }

    #[test]
    fn a_slot_stays_56_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 56);
    }

    #[test]
    fn shared_names_are_stored_once() {
        let mut loader = Allocations::loader();
        for i in 1..=200 {
            loader.push(full(&format!("10.0.{}.{}", i / 100, i % 100 + 1)));
        }
        let a = loader.finish();
        assert_eq!(a.iter().count(), 200);
        // blue, eth0, podnet, pod-annotation.
        assert_eq!(a.names.list.len(), 4);
        let r = a.get(&"10.0.1.1".parse().unwrap()).unwrap();
        assert!(r.is_for(&"c".repeat(64), Some("eth0")));
        assert!(!r.is_for(&"c".repeat(64), Some("net1")));
    }

    fn attached(
        ip: &str,
        attachment: Option<(&str, &str)>,
        adopted: Option<&str>,
    ) -> AllocationRecord {
        AllocationRecord {
            container_id: attachment.map(|a| a.0.to_string()),
            ifname: attachment.map(|a| a.1.to_string()),
            host_ifname: adopted.map(str::to_string),
            ..bare(ip)
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
        a.insert(attached("10.0.0.2", Some(("c1", "eth0")), None));
        a.insert(attached("10.0.0.3", Some(("c1", "eth0")), None));
        a.insert(attached("10.0.0.4", Some(("c2", "eth0")), None));
        a.insert(attached("10.0.0.5", None, None));
        assert_eq!(ips_of(&a, &link), ["10.0.0.2", "10.0.0.3"]);
        assert_eq!(a.iter().count(), 4);
        // Replaced by a record of another attachment: found under that one only.
        a.insert(attached("10.0.0.3", Some(("c2", "eth0")), None));
        assert_eq!(ips_of(&a, &link), ["10.0.0.2"]);
        assert_eq!(
            ips_of(&a, &host_ifname("c2", "eth0")),
            ["10.0.0.3", "10.0.0.4"]
        );
        assert!(a.remove(&"10.0.0.2".parse().unwrap()).is_some());
        assert!(ips_of(&a, &link).is_empty());
        assert!(
            !a.by_link.contains_key(link.as_str()),
            "no empty entry is kept"
        );
        assert!(a.remove(&"10.0.0.2".parse().unwrap()).is_none());
    }

    #[test]
    fn an_adopted_address_is_found_under_its_link_name_too() {
        let mut a = Allocations::default();
        a.insert(attached("10.0.0.7", None, Some("lxcadopted0001")));
        assert_eq!(ips_of(&a, "lxcadopted0001"), ["10.0.0.7"]);
        let made = host_ifname("c3", "eth0");
        a.insert(attached("10.0.0.8", Some(("c3", "eth0")), Some(&made)));
        assert_eq!(ips_of(&a, &made), ["10.0.0.8"], "listed once");
        a.remove(&"10.0.0.7".parse().unwrap());
        a.remove(&"10.0.0.8".parse().unwrap());
        assert!(a.by_link.is_empty());
    }

    #[test]
    fn a_loaded_table_has_the_index_too() {
        let mut loader = Allocations::loader();
        loader.push(attached("10.0.0.2", Some(("c1", "eth0")), None));
        loader.push(attached("10.0.0.9", None, Some("lxcadopted0002")));
        let a = loader.finish();
        assert_eq!(ips_of(&a, &host_ifname("c1", "eth0")), ["10.0.0.2"]);
        assert_eq!(ips_of(&a, "lxcadopted0002"), ["10.0.0.9"]);
    }

    #[test]
    fn a_replaced_record_drops_what_it_no_longer_has() {
        let mut a = Allocations::default();
        a.insert(full("10.0.0.2"));
        let mut cooled = bare("10.0.0.2");
        cooled.state = AllocationState::Cooling;
        cooled.cooling_until_ms = Some(100);
        a.insert(cooled.clone());
        let r = a.get(&cooled.ip).unwrap();
        assert_eq!(r.record(), cooled);
        assert_eq!(r.container_id(), None);
        assert_eq!(r.cooling_until_ms(), Some(100));
    }
}
