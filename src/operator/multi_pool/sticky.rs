//! Sticky addresses (pure rules, no I/O): an address that belongs to a pod's
//! identity (`<namespace>/<name>`, e.g. a StatefulSet's `web-0`) and follows it
//! from node to node. A sticky pool is a CiliumPodIPPool annotated
//! [`STICKY_POOL`]` = "true"` whose one family's `maskSize` is 32 (IPv4) or 128
//! (IPv6): every block is one address. A node's agent asks for the identities
//! of its pods in the CiliumNode annotation [`STICKY_REQUESTS`]; the pool
//! records which identity owns which address in its annotation
//! [`STICKY_OWNERS`] (it outlives pods and nodes); the operator puts the
//! address's /32 (/128) block in the requesting node's
//! `spec.ipam.pools.allocated` and answers in the node's [`STICKY_STATUS`].
//!
//! [`decide`] takes every sticky pool, every node and every StatefulSet as read
//! (one consistent list) and says which records to write (first) and which
//! blocks to add to which node (after). A block listed by a node other than the requester is
//! `moving`: it goes to the requester only once no node lists it (its old
//! node's agent gave it back); of nodes asking for one identity at once, one
//! is assigned (the one that lists it, else the first by name), the others
//! are told `moving` naming it.
//!
//! A record is released (removed from [`STICKY_OWNERS`], its address free again)
//! by its StatefulSet's PVC retention policy ([`sticky_lifecycle`](super::sticky_lifecycle)),
//! and only once no node lists its block nor asks for it. Without the
//! StatefulSets (their list failed) nothing is released.
//!
//! Each pool's record is written on its own: a pool whose write failed is
//! `held_back` in the next decisions (its recorded identities are served, new
//! ones wait unanswered, nothing of it is released) while the other pools go on.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use crate::ipam::Family;
use crate::ipam::ip_number::{from_number, span};
use crate::ipam::pooldef::{PoolDef, PoolFamilySpec};
use crate::resources::AllocatedPool;

use super::sticky_lifecycle::{self, Release, StatefulSets};
pub use crate::ipam::sticky::{
    Answer, STICKY_OWNERS, STICKY_POOL, STICKY_RELEASE_ON_DELETE, STICKY_REQUESTS, STICKY_STATUS,
    State,
};

/// What the operator reads of one CiliumPodIPPool.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolView {
    pub name: String,
    /// Annotated [`STICKY_POOL`]` = "true"`.
    pub sticky: bool,
    /// The pool's definition, or why the object is not a valid pool.
    pub def: Result<PoolDef, String>,
    /// The annotation [`STICKY_OWNERS`] (empty when absent).
    pub owners: Result<BTreeMap<String, IpAddr>, String>,
    /// The annotation [`STICKY_RELEASE_ON_DELETE`] (empty when absent).
    pub release_on_delete: Result<BTreeMap<String, String>, String>,
    /// Its record cannot be written now (the last write failed; retried after
    /// a backoff): only recorded identities are served.
    pub held_back: bool,
}

impl PoolView {
    /// The view of a pool object with `def` (its definition or why not) and
    /// `annotations`.
    pub fn new(
        name: &str,
        def: Result<PoolDef, String>,
        annotations: &BTreeMap<String, String>,
    ) -> PoolView {
        let owners = match annotations.get(STICKY_OWNERS) {
            None => Ok(BTreeMap::new()),
            Some(raw) => serde_json::from_str(raw).map_err(|e| {
                format!(
                    "annotation {STICKY_OWNERS} of CiliumPodIPPool {name:?} is not a JSON object \
                     of \"<namespace>/<name>\": \"<address>\": {e}"
                )
            }),
        };
        let release_on_delete = match annotations.get(STICKY_RELEASE_ON_DELETE) {
            None => Ok(BTreeMap::new()),
            Some(raw) => serde_json::from_str(raw).map_err(|e| {
                format!(
                    "annotation {STICKY_RELEASE_ON_DELETE} of CiliumPodIPPool {name:?} is not a \
                     JSON object of \"<namespace>/<statefulset>\": \"<uid>\": {e}"
                )
            }),
        };
        PoolView {
            name: name.to_string(),
            sticky: annotations.get(STICKY_POOL).map(String::as_str) == Some("true"),
            def,
            owners,
            release_on_delete,
            held_back: false,
        }
    }
}

/// What the operator reads of one CiliumNode.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    /// The annotation [`STICKY_REQUESTS`] as written, if any.
    pub requests: Option<String>,
    pub allocated: Vec<AllocatedPool>,
}

/// A request whose key or value is malformed, or an annotation that is not a
/// JSON object: refused under the key the status answers it with.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Malformed {
    key: String,
    message: String,
}

/// The well-formed requests of a [`STICKY_REQUESTS`] annotation (identity ->
/// pool) and the malformed entries.
fn parse_requests(raw: &str) -> (BTreeMap<String, String>, Vec<Malformed>) {
    let mut requests = BTreeMap::new();
    let mut malformed = Vec::new();
    let entries: serde_json::Map<String, serde_json::Value> = match serde_json::from_str(raw) {
        Ok(m) => m,
        Err(e) => {
            malformed.push(Malformed {
                key: STICKY_REQUESTS.to_string(),
                message: format!(
                    "annotation {STICKY_REQUESTS} is not a JSON object of \
                     \"<namespace>/<name>\": \"<pool>\": {e}"
                ),
            });
            return (requests, malformed);
        }
    };
    for (key, value) in entries {
        let identity_ok = matches!(
            key.split_once('/'),
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/')
        );
        let pool = value.as_str().filter(|p| !p.is_empty());
        match (identity_ok, pool) {
            (true, Some(pool)) => {
                requests.insert(key, pool.to_string());
            }
            (false, _) => malformed.push(Malformed {
                message: format!(
                    "key {key:?} of annotation {STICKY_REQUESTS} is not <namespace>/<name>"
                ),
                key,
            }),
            (true, None) => malformed.push(Malformed {
                message: format!(
                    "value {value} of {STICKY_REQUESTS}[{key:?}] is not a pool name (a non-empty string)"
                ),
                key,
            }),
        }
    }
    (requests, malformed)
}

/// A pool's record as [`decide`] writes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolRecord {
    /// The whole new [`STICKY_OWNERS`].
    pub owners: BTreeMap<String, IpAddr>,
    /// The whole new [`STICKY_RELEASE_ON_DELETE`]; None: left as it is.
    pub release_on_delete: Option<BTreeMap<String, String>>,
}

/// What [`decide`] says to do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Pool -> its new record (only pools whose record changed). Written before
    /// any block of `assign`.
    pub records: BTreeMap<String, PoolRecord>,
    /// Pool -> the identities its record releases, and why.
    pub released: BTreeMap<String, BTreeMap<String, Release>>,
    /// Node -> its whole new `spec.ipam.pools.allocated` (only nodes that get
    /// a block).
    pub assign: BTreeMap<String, Vec<AllocatedPool>>,
    /// Node -> its [`STICKY_STATUS`] (every node; empty: no requests).
    pub status: BTreeMap<String, BTreeMap<String, Answer>>,
    /// Whether a request waits for another node to give a block back.
    pub moving: bool,
    /// Whether a record due for release waits for a node to give its block
    /// back (or to stop asking for it).
    pub releasing: bool,
}

/// The family spec of a sticky pool, or why the pool cannot serve sticky
/// addresses (naming the field).
fn sticky_family(view: &PoolView) -> Result<&PoolFamilySpec, String> {
    let name = &view.name;
    if !view.sticky {
        return Err(format!(
            "pool {name:?} is not sticky: its annotation {STICKY_POOL} is not \"true\""
        ));
    }
    let def = view
        .def
        .as_ref()
        .map_err(|why| format!("pool {name:?} is not a valid pool: {why}"))?;
    let (family, field, bits) = match (&def.ipv4, &def.ipv6) {
        (Some(f), None) => (f, "spec.ipv4.maskSize", 32),
        (None, Some(f)) => (f, "spec.ipv6.maskSize", 128),
        _ => {
            return Err(format!(
                "pool {name:?} has both spec.ipv4 and spec.ipv6: a sticky pool has one family"
            ));
        }
    };
    if family.mask_size != bits {
        return Err(format!(
            "{field} of sticky pool {name:?} is {}, not {bits}: a sticky pool's blocks are single addresses",
            family.mask_size
        ));
    }
    Ok(family)
}

/// The lowest address of `family` that is not in `taken` nor reserved.
fn lowest_free(family: &PoolFamilySpec, taken: &BTreeSet<IpAddr>) -> Option<IpAddr> {
    let reserved = |a: &IpAddr| {
        family
            .reserved_ranges
            .iter()
            .any(|(first, last)| first <= a && a <= last)
    };
    let mut cidrs = family.cidrs.clone();
    cidrs.sort();
    for cidr in cidrs {
        let cidr = cidr.trunc();
        let (first, last) = span(&cidr);
        let family = Family::of_net(&cidr);
        let mut n = first;
        loop {
            let a = from_number(family, n);
            if !taken.contains(&a) && !reserved(&a) {
                return Some(a);
            }
            if n == last {
                break;
            }
            n += 1;
        }
    }
    None
}

/// Whether `a` is inside one of the pool's CIDRs.
fn in_pool(family: &PoolFamilySpec, a: IpAddr) -> bool {
    family.cidrs.iter().any(|c| c.contains(&a))
}

/// The one-address block of `a`.
fn block(a: IpAddr) -> IpNet {
    IpNet::from(a)
}

/// (pool, address) -> the node listing its block (the first by the list's order).
type Holders = BTreeMap<(String, IpAddr), String>;

/// Who lists which sticky-sized block now.
fn holders(nodes: &[NodeView]) -> Holders {
    let mut holders = Holders::new();
    for node in nodes {
        for entry in &node.allocated {
            for cidr in &entry.cidrs {
                holders
                    .entry((entry.pool.clone(), cidr.network()))
                    .or_insert_with(|| node.name.clone());
            }
        }
    }
    holders
}

/// The well-formed requests, (pool, identity) -> the nodes asking, in name
/// order (`nodes` sorted); a node's malformed entries are refused in its status
/// right away, and every node gets a status (empty: no requests).
fn wanted(nodes: &[&NodeView], plan: &mut Plan) -> BTreeMap<(String, String), Vec<String>> {
    let mut wanted: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for node in nodes {
        let status = plan.status.entry(node.name.clone()).or_default();
        let Some(raw) = &node.requests else { continue };
        let (requests, malformed) = parse_requests(raw);
        for m in malformed {
            status.insert(m.key, Answer::refused("", m.message));
        }
        for (identity, pool) in requests {
            wanted
                .entry((pool, identity))
                .or_default()
                .push(node.name.clone());
        }
    }
    wanted
}

/// The address of `identity` in `pool_name`: its record, else the pool's lowest
/// free address, recorded in `records` (the pool's record as this pass writes
/// it); None when the pool is held back and has no record of it (no answer
/// now); or why the request is refused.
fn identity_address(
    pools: &BTreeMap<&str, &PoolView>,
    records: &mut BTreeMap<String, BTreeMap<String, IpAddr>>,
    holders: &Holders,
    pool_name: &str,
    identity: &str,
) -> Result<Option<IpAddr>, String> {
    let view = pools.get(pool_name).ok_or_else(|| {
        format!("pool {pool_name:?} of {STICKY_REQUESTS}[{identity:?}] does not exist")
    })?;
    let family =
        sticky_family(view).map_err(|why| format!("{STICKY_REQUESTS}[{identity:?}]: {why}"))?;
    let owners = match &view.owners {
        Ok(o) => records
            .entry(pool_name.to_string())
            .or_insert_with(|| o.clone()),
        Err(why) => return Err(why.clone()),
    };
    if let Some(a) = owners.get(identity) {
        if in_pool(family, *a) {
            return Ok(Some(*a));
        }
        return Err(format!(
            "{identity} owns {a} in annotation {STICKY_OWNERS} of pool {pool_name:?}, \
             outside the pool's CIDRs"
        ));
    }
    if view.held_back {
        return Ok(None);
    }
    let mut taken: BTreeSet<IpAddr> = owners.values().copied().collect();
    taken.extend(
        holders
            .keys()
            .filter(|(p, _)| p == pool_name)
            .map(|(_, a)| *a),
    );
    let a = lowest_free(family, &taken).ok_or_else(|| {
        format!(
            "pool {pool_name:?} of {STICKY_REQUESTS}[{identity:?}] has no free \
             address (every one is recorded in {STICKY_OWNERS} or allocated)"
        )
    })?;
    owners.insert(identity.to_string(), a);
    Ok(Some(a))
}

/// The answer to `node` for `identity`'s `address`, which `holder` lists.
fn answer_for(node: &str, holder: &str, pool: &str, identity: &str, address: IpAddr) -> Answer {
    if node == holder {
        return Answer {
            pool: pool.to_string(),
            address: Some(address),
            state: State::Assigned,
            message: None,
        };
    }
    Answer {
        pool: pool.to_string(),
        address: Some(address),
        state: State::Moving,
        message: Some(format!(
            "{identity}'s address {address} is still in node {holder:?}'s \
             spec.ipam.pools.allocated; it moves here once that node gives it back"
        )),
    }
}

/// Puts `answer`'s answer for `identity` in the status of each node of `askers`.
fn answer_all(plan: &mut Plan, askers: &[String], identity: &str, answer: impl Fn(&str) -> Answer) {
    for node in askers {
        if let Some(s) = plan.status.get_mut(node) {
            s.insert(identity.to_string(), answer(node));
        }
    }
}

/// Releases the records due for release (see the module docs) whose block no
/// node lists and no node asks for, in `records`; the others wait.
fn release(
    pools: &BTreeMap<&str, &PoolView>,
    sets: &StatefulSets,
    holders: &Holders,
    wanted: &BTreeMap<(String, String), Vec<String>>,
    records: &mut BTreeMap<String, BTreeMap<String, IpAddr>>,
    plan: &mut Plan,
) {
    let no_notes = BTreeMap::new();
    for (name, view) in pools {
        let Ok(owners) = view.owners.as_ref() else {
            continue;
        };
        if !view.sticky || view.held_back {
            continue;
        }
        let notes = view.release_on_delete.as_ref().unwrap_or(&no_notes);
        for (identity, address) in owners {
            let Some(why) = sticky_lifecycle::due(identity, sets, notes) else {
                continue;
            };
            let held = holders.contains_key(&(name.to_string(), *address));
            if held || wanted.contains_key(&(name.to_string(), identity.clone())) {
                plan.releasing = true;
                continue;
            }
            records
                .entry(name.to_string())
                .or_insert_with(|| owners.clone())
                .remove(identity);
            plan.released
                .entry(name.to_string())
                .or_default()
                .insert(identity.clone(), why);
        }
    }
}

/// The records that changed: each sticky pool's owners (as `records` has them,
/// else as read) and, with the StatefulSets known, its notes of StatefulSets
/// released on delete. A held-back pool's record is never written.
fn changed_records(
    pools: &BTreeMap<&str, &PoolView>,
    sets: Option<&StatefulSets>,
    mut records: BTreeMap<String, BTreeMap<String, IpAddr>>,
) -> BTreeMap<String, PoolRecord> {
    let mut changed = BTreeMap::new();
    for (name, view) in pools {
        let Ok(before) = view.owners.as_ref() else {
            continue;
        };
        if !view.sticky || view.held_back {
            continue;
        }
        let owners = records.remove(*name).unwrap_or_else(|| before.clone());
        let notes = match (sets, &view.release_on_delete) {
            (Some(sets), Ok(old)) => {
                Some(sticky_lifecycle::notes(owners.keys(), sets, old)).filter(|n| n != old)
            }
            _ => None,
        };
        if owners != *before || notes.is_some() {
            changed.insert(
                name.to_string(),
                PoolRecord {
                    owners,
                    release_on_delete: notes,
                },
            );
        }
    }
    changed
}

/// Decides every node's sticky requests given every pool, every node and every
/// StatefulSet (None: not known, nothing is released) as read at one moment.
/// See the module docs.
pub fn decide(pools: &[PoolView], nodes: &[NodeView], sets: Option<&StatefulSets>) -> Plan {
    let pools: BTreeMap<&str, &PoolView> = pools.iter().map(|p| (p.name.as_str(), p)).collect();
    let mut plan = Plan::default();
    let mut holders = holders(nodes);
    let mut records: BTreeMap<String, BTreeMap<String, IpAddr>> = BTreeMap::new();
    let mut nodes: Vec<&NodeView> = nodes.iter().collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let wanted = wanted(&nodes, &mut plan);
    if let Some(sets) = sets {
        release(&pools, sets, &holders, &wanted, &mut records, &mut plan);
    }
    for ((pool_name, identity), askers) in wanted {
        let address = match identity_address(&pools, &mut records, &holders, &pool_name, &identity)
        {
            Ok(Some(a)) => a,
            // Held back: no answer until the pool's record can be written.
            Ok(None) => continue,
            Err(why) => {
                answer_all(&mut plan, &askers, &identity, |_| {
                    Answer::refused(&pool_name, why.clone())
                });
                continue;
            }
        };
        let key = (pool_name.clone(), address);
        let holder = match holders.get(&key) {
            Some(h) => h.clone(),
            None => {
                // Nobody lists it: the first asker gets it.
                let first = askers[0].clone();
                let node = nodes.iter().find(|n| n.name == first);
                let allocated = plan
                    .assign
                    .entry(first.clone())
                    .or_insert_with(|| node.map(|n| n.allocated.clone()).unwrap_or_default());
                add_block(allocated, &pool_name, block(address));
                holders.insert(key, first.clone());
                first
            }
        };
        answer_all(&mut plan, &askers, &identity, |node| {
            answer_for(node, &holder, &pool_name, &identity, address)
        });
        if askers.iter().any(|n| *n != holder) {
            plan.moving = true;
        }
    }
    plan.records = changed_records(&pools, sets, records);
    plan
}

/// Adds block `cidr` of `pool` to `allocated` (to the pool's entry, sorted).
pub fn add_block(allocated: &mut Vec<AllocatedPool>, pool: &str, cidr: IpNet) {
    match allocated.iter_mut().find(|a| a.pool == pool) {
        Some(entry) => {
            entry.cidrs.push(cidr);
            entry.cidrs.sort();
        }
        None => allocated.push(AllocatedPool {
            pool: pool.to_string(),
            cidrs: vec![cidr],
            ..Default::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::super::sticky_lifecycle::Retention;
    use super::*;

    fn family(cidr: &str, mask: u8) -> PoolFamilySpec {
        PoolFamilySpec {
            cidrs: vec![cidr.parse().unwrap()],
            mask_size: mask,
            reserved_ranges: Vec::new(),
        }
    }

    fn def(name: &str, v4: Option<PoolFamilySpec>, v6: Option<PoolFamilySpec>) -> PoolDef {
        PoolDef {
            name: name.into(),
            ipv4: v4,
            ipv6: v6,
            allow_first_ip: false,
            allow_last_ip: false,
            skip_masquerade: false,
            sticky: true,
            pod_selector: None,
            namespace_selector: None,
        }
    }

    fn sticky_pool(cidr: &str, owners: &[(&str, &str)]) -> PoolView {
        let mut annotations = BTreeMap::from([(STICKY_POOL.to_string(), "true".to_string())]);
        if !owners.is_empty() {
            let record: BTreeMap<&str, &str> = owners.iter().copied().collect();
            annotations.insert(
                STICKY_OWNERS.into(),
                serde_json::to_string(&record).unwrap(),
            );
        }
        PoolView::new(
            "web",
            Ok(def("web", Some(family(cidr, 32)), None)),
            &annotations,
        )
    }

    fn node(name: &str, requests: &str, blocks: &[&str]) -> NodeView {
        let allocated = if blocks.is_empty() {
            Vec::new()
        } else {
            vec![AllocatedPool {
                pool: "web".into(),
                cidrs: blocks.iter().map(|b| b.parse().unwrap()).collect(),
                ..Default::default()
            }]
        };
        NodeView {
            name: name.into(),
            requests: (!requests.is_empty()).then(|| requests.to_string()),
            allocated,
        }
    }

    fn answer<'a>(plan: &'a Plan, node: &str, identity: &str) -> &'a Answer {
        &plan.status[node][identity]
    }

    fn ip(a: &str) -> IpAddr {
        a.parse().unwrap()
    }

    /// The plan without StatefulSets (nothing released).
    fn plan_of(pools: &[PoolView], nodes: &[NodeView]) -> Plan {
        decide(pools, nodes, None)
    }

    const WEB0: &str = r#"{"default/web-0": "web"}"#;

    #[test]
    fn a_new_identity_gets_the_lowest_free_address_recorded_first_then_its_block() {
        let pool = sticky_pool("10.9.0.0/30", &[("default/other", "10.9.0.0")]);
        // 10.9.0.1 is allocated to node b (not recorded): not free either.
        let plan = plan_of(
            &[pool],
            &[node("a", WEB0, &[]), node("b", "", &["10.9.0.1/32"])],
        );
        let a = answer(&plan, "a", "default/web-0");
        assert_eq!(a.state, State::Assigned);
        assert_eq!(a.address, Some(ip("10.9.0.2")));
        assert_eq!(plan.records["web"].owners["default/web-0"], ip("10.9.0.2"));
        assert_eq!(plan.records["web"].owners["default/other"], ip("10.9.0.0"));
        assert_eq!(
            plan.assign["a"][0].cidrs,
            ["10.9.0.2/32".parse::<IpNet>().unwrap()]
        );
        assert!(!plan.assign.contains_key("b"));
        assert!(plan.status["b"].is_empty());
        assert!(!plan.moving);
    }

    #[test]
    fn a_recorded_identity_already_on_its_node_changes_nothing() {
        let pool = sticky_pool("10.9.0.0/30", &[("default/web-0", "10.9.0.3")]);
        let plan = plan_of(&[pool], &[node("a", WEB0, &["10.9.0.3/32"])]);
        assert_eq!(answer(&plan, "a", "default/web-0").state, State::Assigned);
        assert_eq!(
            answer(&plan, "a", "default/web-0").address,
            Some(ip("10.9.0.3"))
        );
        assert!(plan.records.is_empty() && plan.assign.is_empty());
    }

    #[test]
    fn an_identity_moving_waits_for_the_old_node_then_keeps_its_address() {
        let pool = || sticky_pool("10.9.0.0/28", &[("default/web-0", "10.9.0.5")]);
        // Still listed by a (which no longer asks): b is told moving, naming a.
        let plan = plan_of(
            &[pool()],
            &[node("a", "", &["10.9.0.5/32"]), node("b", WEB0, &[])],
        );
        let b = answer(&plan, "b", "default/web-0");
        assert_eq!(b.state, State::Moving);
        assert_eq!(b.address, Some(ip("10.9.0.5")));
        assert!(b.message.as_deref().unwrap().contains("node \"a\""));
        assert!(plan.assign.is_empty() && plan.records.is_empty());
        assert!(plan.moving);
        // a gave it back: b gets the same address, the record is unchanged.
        let plan = plan_of(&[pool()], &[node("a", "", &[]), node("b", WEB0, &[])]);
        assert_eq!(answer(&plan, "b", "default/web-0").state, State::Assigned);
        assert_eq!(
            answer(&plan, "b", "default/web-0").address,
            Some(ip("10.9.0.5"))
        );
        assert_eq!(
            plan.assign["b"][0].cidrs,
            ["10.9.0.5/32".parse::<IpNet>().unwrap()]
        );
        assert!(plan.records.is_empty());
        assert!(!plan.moving);
    }

    #[test]
    fn two_nodes_asking_for_one_identity_at_once_one_wins() {
        let pool = sticky_pool("10.9.0.0/28", &[]);
        let plan = plan_of(&[pool], &[node("b", WEB0, &[]), node("a", WEB0, &[])]);
        assert_eq!(answer(&plan, "a", "default/web-0").state, State::Assigned);
        let b = answer(&plan, "b", "default/web-0");
        assert_eq!(b.state, State::Moving);
        assert!(b.message.as_deref().unwrap().contains("node \"a\""));
        assert_eq!(plan.assign.keys().collect::<Vec<_>>(), ["a"]);
        assert_eq!(plan.records["web"].owners.len(), 1);
        // The node that lists it wins over the first by name.
        let pool = sticky_pool("10.9.0.0/28", &[("default/web-0", "10.9.0.0")]);
        let plan = plan_of(
            &[pool],
            &[node("a", WEB0, &[]), node("b", WEB0, &["10.9.0.0/32"])],
        );
        assert_eq!(answer(&plan, "b", "default/web-0").state, State::Assigned);
        assert_eq!(answer(&plan, "a", "default/web-0").state, State::Moving);
        assert!(plan.assign.is_empty());
    }

    #[test]
    fn malformed_requests_are_refused_naming_them_and_the_rest_served() {
        let pool = sticky_pool("10.9.0.0/28", &[]);
        let bad_entries =
            r#"{"web-1": "web", "default/web-2": 5, "default/web-3": "", "default/web-4": "web"}"#;
        let plan = plan_of(
            &[pool],
            &[
                node("a", bad_entries, &[]),
                node("b", "{not json", &[]),
                node("c", WEB0, &[]),
            ],
        );
        let refused = |n: &str, k: &str| {
            let a = answer(&plan, n, k);
            assert_eq!(a.state, State::Refused, "{n} {k}");
            a.message.clone().unwrap()
        };
        assert!(refused("a", "web-1").contains("key \"web-1\""));
        assert!(refused("a", "default/web-2").contains("value 5"));
        assert!(refused("a", "default/web-3").contains("[\"default/web-3\"]"));
        assert!(refused("b", STICKY_REQUESTS).contains("not a JSON object"));
        assert_eq!(answer(&plan, "a", "default/web-4").state, State::Assigned);
        assert_eq!(answer(&plan, "c", "default/web-0").state, State::Assigned);
        assert_ne!(
            answer(&plan, "a", "default/web-4").address,
            answer(&plan, "c", "default/web-0").address
        );
    }

    #[test]
    fn pools_that_cannot_serve_are_refused_naming_the_field() {
        let refusal = |pools: &[PoolView]| {
            let plan = plan_of(pools, &[node("a", WEB0, &[])]);
            let a = answer(&plan, "a", "default/web-0").clone();
            assert_eq!(a.state, State::Refused);
            assert!(plan.assign.is_empty() && plan.records.is_empty());
            a.message.unwrap()
        };
        assert!(refusal(&[]).contains("does not exist"));
        let plain = PoolView::new(
            "web",
            Ok(def("web", Some(family("10.9.0.0/28", 32)), None)),
            &BTreeMap::new(),
        );
        assert!(refusal(&[plain]).contains(STICKY_POOL));
        let sticky = BTreeMap::from([(STICKY_POOL.to_string(), "true".to_string())]);
        let wide = PoolView::new(
            "web",
            Ok(def("web", Some(family("10.9.0.0/16", 24)), None)),
            &sticky,
        );
        assert!(refusal(&[wide]).contains("spec.ipv4.maskSize"));
        let v6 = PoolView::new(
            "web",
            Ok(def("web", None, Some(family("fd00::/120", 120)))),
            &sticky,
        );
        assert!(refusal(&[v6]).contains("spec.ipv6.maskSize"));
        let both = PoolView::new(
            "web",
            Ok(def(
                "web",
                Some(family("10.9.0.0/28", 32)),
                Some(family("fd00::/120", 128)),
            )),
            &sticky,
        );
        assert!(refusal(&[both]).contains("both spec.ipv4 and spec.ipv6"));
        let invalid = PoolView::new("web", Err("spec is missing".into()), &sticky);
        assert!(refusal(&[invalid]).contains("spec is missing"));
        let mut bad_record = sticky.clone();
        bad_record.insert(STICKY_OWNERS.into(), "[1]".into());
        let bad = PoolView::new(
            "web",
            Ok(def("web", Some(family("10.9.0.0/28", 32)), None)),
            &bad_record,
        );
        assert!(refusal(&[bad]).contains(STICKY_OWNERS));
        let outside = sticky_pool("10.9.0.0/28", &[("default/web-0", "10.8.0.1")]);
        assert!(refusal(&[outside]).contains("outside the pool's CIDRs"));
    }

    #[test]
    fn a_full_pool_is_refused_and_the_recorded_keep_theirs() {
        let pool = sticky_pool("10.9.0.0/31", &[("default/web-0", "10.9.0.0")]);
        let requests =
            r#"{"default/web-0": "web", "default/web-1": "web", "default/web-2": "web"}"#;
        let plan = plan_of(&[pool], &[node("a", requests, &[])]);
        assert_eq!(
            answer(&plan, "a", "default/web-0").address,
            Some(ip("10.9.0.0"))
        );
        assert_eq!(
            answer(&plan, "a", "default/web-1").address,
            Some(ip("10.9.0.1"))
        );
        let full = answer(&plan, "a", "default/web-2");
        assert_eq!(full.state, State::Refused);
        assert!(full.message.as_deref().unwrap().contains("no free address"));
        assert_eq!(plan.assign["a"][0].cidrs.len(), 2);
        assert_eq!(plan.records["web"].owners.len(), 2);
    }

    #[test]
    fn an_ipv6_pool_and_reserved_ranges_are_served() {
        let sticky = BTreeMap::from([(STICKY_POOL.to_string(), "true".to_string())]);
        let mut f = family("fd00::/126", 128);
        f.reserved_ranges = vec![(ip("fd00::"), ip("fd00::1"))];
        let pool = PoolView::new("web", Ok(def("web", None, Some(f))), &sticky);
        let plan = plan_of(&[pool], &[node("a", WEB0, &[])]);
        assert_eq!(
            answer(&plan, "a", "default/web-0").address,
            Some(ip("fd00::2"))
        );
    }

    #[test]
    fn a_request_removed_keeps_the_record() {
        let pool = sticky_pool("10.9.0.0/28", &[("default/web-0", "10.9.0.5")]);
        let plan = plan_of(&[pool], &[node("a", "{}", &["10.9.0.5/32"])]);
        assert!(plan.status["a"].is_empty());
        assert!(plan.records.is_empty() && plan.assign.is_empty());
    }

    use crate::operator::multi_pool::sticky_lifecycle::tests::set as statefulset;

    #[test]
    fn a_deployment_pods_record_is_released_once_no_node_holds_or_asks_for_it() {
        // Issue 53.4: a Deployment's pod names burned one address each, forever.
        let pool = || sticky_pool("10.9.0.0/30", &[("default/rover-5d8f9-x7k2p", "10.9.0.0")]);
        let sets = StatefulSets::default();
        // Still on node a: kept, and every node change is looked at.
        let plan = decide(&[pool()], &[node("a", "", &["10.9.0.0/32"])], Some(&sets));
        assert!(plan.records.is_empty() && plan.releasing);
        // Asked for (an older agent): kept.
        let asks = r#"{"default/rover-5d8f9-x7k2p": "web"}"#;
        let plan = decide(&[pool()], &[node("a", asks, &[])], Some(&sets));
        assert!(plan.releasing && plan.records.is_empty());
        assert_eq!(
            answer(&plan, "a", "default/rover-5d8f9-x7k2p").state,
            State::Assigned
        );
        // Gone everywhere: released, and its address serves a new identity.
        let plan = decide(&[pool()], &[node("b", WEB0, &[])], Some(&sets));
        assert_eq!(
            plan.released["web"]["default/rover-5d8f9-x7k2p"],
            Release::NotStatefulSet
        );
        assert_eq!(
            plan.records["web"].owners,
            BTreeMap::from([("default/web-0".to_string(), ip("10.9.0.0"))])
        );
        assert!(!plan.releasing);
        // Without the StatefulSets nothing is released.
        let plan = plan_of(&[pool()], &[]);
        assert!(plan.records.is_empty() && plan.released.is_empty());
    }

    #[test]
    fn a_scaled_down_ordinal_is_released_by_when_scaled_delete_and_kept_by_retain() {
        use Retention::{Delete, Retain};
        let pool = || {
            sticky_pool(
                "10.9.0.0/28",
                &[("default/web-0", "10.9.0.1"), ("default/web-1", "10.9.0.2")],
            )
        };
        let scaled = StatefulSets::new([statefulset("default/web", 1, Retain, Delete)]);
        let plan = decide(&[pool()], &[], Some(&scaled));
        assert_eq!(plan.released["web"]["default/web-1"], Release::ScaledDown);
        assert_eq!(
            plan.records["web"].owners.keys().collect::<Vec<_>>(),
            ["default/web-0"]
        );
        assert_eq!(
            plan.records["web"].release_on_delete, None,
            "nothing to note"
        );
        let retained = StatefulSets::new([statefulset("default/web", 1, Retain, Retain)]);
        let plan = decide(&[pool()], &[], Some(&retained));
        assert!(plan.records.is_empty() && plan.released.is_empty());
    }

    #[test]
    fn a_deleted_statefulset_releases_by_its_noted_when_deleted_and_retain_keeps() {
        use Retention::{Delete, Retain};
        let owners = [("default/web-0", "10.9.0.1")];
        // While it exists, its whenDeleted: Delete is noted by UID.
        let sets = StatefulSets::new([statefulset("default/web", 1, Delete, Retain)]);
        let plan = decide(&[sticky_pool("10.9.0.0/28", &owners)], &[], Some(&sets));
        let noted = BTreeMap::from([("default/web".to_string(), "uid-default/web".to_string())]);
        assert_eq!(plan.records["web"].release_on_delete, Some(noted.clone()));
        assert_eq!(plan.records["web"].owners.len(), 1);
        // Gone: released; its note goes with its last identity.
        let mut pool = sticky_pool("10.9.0.0/28", &owners);
        pool.release_on_delete = Ok(noted);
        let gone = StatefulSets::default();
        let plan = decide(&[pool.clone()], &[], Some(&gone));
        assert_eq!(plan.released["web"]["default/web-0"], Release::Deleted);
        assert_eq!(plan.records["web"].owners, BTreeMap::new());
        assert_eq!(plan.records["web"].release_on_delete, Some(BTreeMap::new()));
        // Never noted (whenDeleted: Retain, the default): kept.
        let plan = decide(&[sticky_pool("10.9.0.0/28", &owners)], &[], Some(&gone));
        assert!(plan.records.is_empty() && plan.released.is_empty());
        // A held-back pool releases nothing.
        pool.held_back = true;
        assert!(decide(&[pool], &[], Some(&gone)).records.is_empty());
    }

    #[test]
    fn a_held_back_pool_serves_recorded_identities_and_leaves_new_ones_unanswered() {
        let mut pool = sticky_pool("10.9.0.0/28", &[("default/web-0", "10.9.0.5")]);
        pool.held_back = true;
        let requests = r#"{"default/web-0": "web", "default/web-1": "web"}"#;
        let plan = plan_of(&[pool], &[node("a", requests, &[])]);
        assert_eq!(answer(&plan, "a", "default/web-0").state, State::Assigned);
        assert!(!plan.status["a"].contains_key("default/web-1"));
        assert_eq!(
            plan.assign["a"][0].cidrs,
            ["10.9.0.5/32".parse::<IpNet>().unwrap()]
        );
        assert!(plan.records.is_empty());
    }

    #[test]
    fn the_status_is_json_naming_pool_address_state_and_message() {
        let a = Answer {
            pool: "web".into(),
            address: Some(ip("10.9.0.5")),
            state: State::Moving,
            message: Some("m".into()),
        };
        assert_eq!(
            serde_json::to_value(&a).unwrap(),
            serde_json::json!({"pool": "web", "address": "10.9.0.5", "state": "moving", "message": "m"})
        );
    }
}
