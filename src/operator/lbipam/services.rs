//! Which Service gets which LB IPAM address, pure: [`plan`] takes every pool and
//! every Service as the API server has them (with the addresses their status
//! holds) and returns each served Service's addresses and its
//! `cilium.io/IPAMRequestSatisfied` condition, each pool's status, and the
//! Services a pool edit orphaned.
//!
//! Stability first: an address a Service holds is kept while it is inside a pool
//! that is not Conflicting (disabled or not) and selects the Service, so a
//! restart, a new pool or an edited pool moves no address (the pitfall of
//! upstream issue 40358). Only then are missing addresses allocated, the lowest
//! free one of the first matching enabled pool (by creation).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use super::pools::{Pool, conflicts};
use crate::ipam::Family;

/// The `loadBalancerClass` LB IPAM serves besides none.
pub const SERVED_CLASSES: [&str; 2] = ["io.cilium/l2-announcer", "io.cilium/bgp-control-plane"];
/// Node IPAM's class.
pub const NODE_IPAM_CLASS: &str = "io.cilium/node";
pub const IPS_ANNOTATION: &str = "lbipam.cilium.io/ips";
pub const SHARING_KEY_ANNOTATION: &str = "lbipam.cilium.io/sharing-key";
pub const SHARING_NAMESPACES_ANNOTATION: &str = "lbipam.cilium.io/sharing-cross-namespace";
pub const NAMESPACE_LABEL: &str = "io.kubernetes.service.namespace";
pub const NAME_LABEL: &str = "io.kubernetes.service.name";

/// `--default-lb-service-ipam`: who serves a LoadBalancer Service without a class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DefaultIpam {
    Lbipam,
    Nodeipam,
    None,
}

/// `spec.ipFamilyPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FamilyPolicy {
    #[default]
    SingleStack,
    PreferDualStack,
    RequireDualStack,
}

/// What the planner reads of a Service.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServiceView {
    pub namespace: String,
    pub name: String,
    pub created: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub load_balancer: bool,
    pub class: Option<String>,
    pub ip_families: Vec<Family>,
    pub policy: FamilyPolicy,
    /// `spec.loadBalancerIP` (the legacy request).
    pub legacy_ip: Option<String>,
    /// `(port, protocol)` of `spec.ports`.
    pub ports: Vec<(i32, String)>,
    /// `status.loadBalancer.ingress[].ip`.
    pub ingress: Vec<IpAddr>,
    /// Whether the status carries `cilium.io/IPAMRequestSatisfied` (LB IPAM served it).
    pub has_condition: bool,
}

impl ServiceView {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The labels a `serviceSelector` sees: the Service's and the synthetic two.
    fn selector_labels(&self) -> BTreeMap<String, String> {
        let mut l = self.labels.clone();
        l.insert(NAMESPACE_LABEL.into(), self.namespace.clone());
        l.insert(NAME_LABEL.into(), self.name.clone());
        l
    }

    fn sharing_key(&self) -> Option<&str> {
        self.annotations
            .get(SHARING_KEY_ANNOTATION)
            .map(|k| k.trim())
            .filter(|k| !k.is_empty())
    }

    fn allows_namespace(&self, ns: &str) -> bool {
        ns == self.namespace
            || self
                .annotations
                .get(SHARING_NAMESPACES_ANNOTATION)
                .is_some_and(|list| list.split(',').map(str::trim).any(|n| n == "*" || n == ns))
    }
}

/// Whether `a` and `b` may share one address: the same sharing key, namespaces
/// that allow each other, and no `(port, protocol)` in common.
fn may_share(a: &ServiceView, b: &ServiceView) -> bool {
    a.sharing_key().is_some()
        && a.sharing_key() == b.sharing_key()
        && a.allows_namespace(&b.namespace)
        && b.allows_namespace(&a.namespace)
        && !a.ports.iter().any(|p| b.ports.contains(p))
}

/// The operator's settings the planner needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub ipv4: bool,
    pub ipv6: bool,
    pub default_ipam: DefaultIpam,
}

impl Settings {
    /// Whether LB IPAM serves `svc`: a LoadBalancer Service without a class (when
    /// the default is lbipam) or with one of [`SERVED_CLASSES`].
    pub fn serves(&self, svc: &ServiceView) -> bool {
        svc.load_balancer
            && match svc.class.as_deref() {
                None => self.default_ipam == DefaultIpam::Lbipam,
                Some(c) => SERVED_CLASSES.contains(&c),
            }
    }

    fn enabled(&self, f: Family) -> bool {
        match f {
            Family::V4 => self.ipv4,
            Family::V6 => self.ipv6,
        }
    }
}

/// The `cilium.io/IPAMRequestSatisfied` condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Satisfied {
    pub status: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Satisfied {
    fn yes() -> Satisfied {
        Satisfied {
            status: true,
            reason: "satisfied",
            message: String::new(),
        }
    }

    fn no(reason: &'static str, message: String) -> Satisfied {
        Satisfied {
            status: false,
            reason,
            message,
        }
    }
}

/// What to write to a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServicePlan {
    /// Served: these addresses (sorted) and this condition.
    Assign {
        ips: Vec<IpAddr>,
        condition: Satisfied,
    },
    /// No longer served (deleted class, other type): remove LB IPAM's addresses
    /// and condition.
    Release,
}

/// A pool's status.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PoolStatus {
    /// The `cilium.io/PoolConflict` message when Conflicting.
    pub conflict: Option<String>,
    pub total: u128,
    pub used: u128,
}

impl PoolStatus {
    pub fn available(&self) -> u128 {
        self.total.saturating_sub(self.used)
    }
}

/// An address a pool edit left outside the pool that handed it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    pub pool: String,
    pub service: String,
    pub ip: IpAddr,
}

/// Everything [`plan`] decided.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// By `namespace/name`; Services LB IPAM neither serves nor served are absent.
    pub services: BTreeMap<String, ServicePlan>,
    pub pools: BTreeMap<String, PoolStatus>,
    pub orphans: Vec<Orphan>,
    /// Which pool each held address is in (the `origin` of the next plan).
    pub origin: BTreeMap<IpAddr, String>,
}

impl Plan {
    /// Served Services, and those of them not satisfied.
    pub fn counts(&self) -> (usize, usize) {
        let assigned = self.services.values().filter_map(|p| match p {
            ServicePlan::Assign { condition, .. } => Some(condition.status),
            ServicePlan::Release => None,
        });
        assigned.fold((0, 0), |(all, unsat), ok| {
            (all + 1, unsat + usize::from(!ok))
        })
    }
}

/// The families `svc` asks for, or why it cannot be served.
fn wanted_families(svc: &ServiceView, s: &Settings) -> Result<Vec<Family>, Satisfied> {
    let enabled: Vec<Family> = [Family::V4, Family::V6]
        .into_iter()
        .filter(|f| s.enabled(*f))
        .collect();
    match svc.policy {
        FamilyPolicy::SingleStack => {
            let family = svc
                .ip_families
                .first()
                .copied()
                .or_else(|| enabled.first().copied())
                .unwrap_or(Family::V4);
            if s.enabled(family) {
                Ok(vec![family])
            } else {
                Err(Satisfied::no(
                    "no_pool",
                    format!("the Service asks for {} but the operator has it disabled", family.label()),
                ))
            }
        }
        FamilyPolicy::PreferDualStack => Ok(enabled),
        FamilyPolicy::RequireDualStack if enabled.len() == 2 => Ok(enabled),
        FamilyPolicy::RequireDualStack => Err(Satisfied::no(
            "no_pool",
            "ipFamilyPolicy RequireDualStack needs IPv4 and IPv6, but the operator has one of them disabled (--enable-ipv4, --enable-ipv6)".into(),
        )),
    }
}

/// The addresses `svc` requests (`lbipam.cilium.io/ips`, else
/// `spec.loadBalancerIP`), or why the request cannot be read.
fn requested(svc: &ServiceView) -> Result<Vec<IpAddr>, Satisfied> {
    let (source, text) = match (svc.annotations.get(IPS_ANNOTATION), &svc.legacy_ip) {
        (Some(a), _) => (IPS_ANNOTATION, a.as_str()),
        (None, Some(l)) => ("spec.loadBalancerIP", l.as_str()),
        (None, None) => return Ok(Vec::new()),
    };
    let mut out = Vec::new();
    for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        let ip = word.parse().map_err(|_| {
            Satisfied::no(
                "invalid_request",
                format!(
                    "{source}: {word:?} is not an IP address; write addresses separated by commas"
                ),
            )
        })?;
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    Ok(out)
}

/// The allocation state while planning.
struct Book<'a> {
    services: &'a [ServiceView],
    /// address -> indexes of the Services holding it.
    holders: BTreeMap<IpAddr, Vec<usize>>,
    /// Service index -> the addresses it holds (sorted).
    held: Vec<Vec<IpAddr>>,
    used: BTreeSet<IpAddr>,
}

impl Book<'_> {
    /// Whether `svc` may take `ip` given who holds it already.
    fn may_take(&self, svc: usize, ip: &IpAddr) -> bool {
        self.holders.get(ip).is_none_or(|hs| {
            hs.iter()
                .all(|h| *h == svc || may_share(&self.services[svc], &self.services[*h]))
        })
    }

    fn take(&mut self, svc: usize, ip: IpAddr) {
        let hs = self.holders.entry(ip).or_default();
        if !hs.contains(&svc) {
            hs.push(svc);
            if let Err(at) = self.held[svc].binary_search(&ip) {
                self.held[svc].insert(at, ip);
            }
        }
        self.used.insert(ip);
    }
}

/// Plans every Service and pool. `pools` are sorted by creation
/// (`pools::sort_pools`); `origin` is the previous plan's (empty after a start).
pub fn plan(
    pools: &[Pool],
    services: &[ServiceView],
    settings: &Settings,
    origin: &BTreeMap<IpAddr, String>,
) -> Plan {
    let conflicting = conflicts(pools);
    let active: Vec<&Pool> = pools
        .iter()
        .filter(|p| !conflicting.contains_key(&p.name))
        .collect();
    let served = served_in_order(services, settings);
    let mut book = Book {
        services,
        holders: BTreeMap::new(),
        held: vec![Vec::new(); services.len()],
        used: BTreeSet::new(),
    };
    let mut out = Plan::default();

    // Keep what is held and still valid.
    let mut asks: BTreeMap<usize, Ask> = BTreeMap::new();
    for &i in &served {
        let ask = keep_held(
            i,
            pools,
            &active,
            settings,
            origin,
            &mut book,
            &mut out.orphans,
        );
        asks.insert(i, ask);
    }

    // Allocate what is missing.
    for &i in &served {
        let condition = match asks.remove(&i) {
            Some(ask) => allocate_missing(i, ask, &active, &mut book),
            None => Satisfied::yes(),
        };
        let ips = book.held[i].clone();
        out.services
            .insert(services[i].key(), ServicePlan::Assign { ips, condition });
    }

    // Services LB IPAM served before but serves no more.
    for svc in services
        .iter()
        .filter(|s| !settings.serves(s) && s.has_condition)
    {
        out.services.insert(svc.key(), ServicePlan::Release);
    }

    for p in pools {
        let status = pool_status(p, &conflicting, &book, &mut out.origin);
        out.pools.insert(p.name.clone(), status);
    }
    out
}

/// The indexes of the Services LB IPAM serves, oldest first (then by key).
fn served_in_order(services: &[ServiceView], settings: &Settings) -> Vec<usize> {
    let mut order: Vec<usize> = (0..services.len()).collect();
    order.sort_by(|a, b| {
        let (a, b) = (&services[*a], &services[*b]);
        (&a.created, a.key()).cmp(&(&b.created, b.key()))
    });
    order
        .into_iter()
        .filter(|i| settings.serves(&services[*i]))
        .collect()
}

/// What a served Service asks for: the families it wants and the addresses it
/// requests (each, or why it cannot be satisfied).
struct Ask {
    families: Result<Vec<Family>, Satisfied>,
    request: Result<Vec<IpAddr>, Satisfied>,
}

/// Keeps the addresses Service `i` holds that still fit what it asks for and sit
/// in an active pool selecting it; an address a pool edit left outside its pool
/// of `origin` becomes an orphan. Returns what the Service asks for.
fn keep_held(
    i: usize,
    pools: &[Pool],
    active: &[&Pool],
    settings: &Settings,
    origin: &BTreeMap<IpAddr, String>,
    book: &mut Book<'_>,
    orphans: &mut Vec<Orphan>,
) -> Ask {
    let services = book.services;
    let svc = &services[i];
    let labels = svc.selector_labels();
    let families = wanted_families(svc, settings);
    let request = requested(svc);
    for ip in &svc.ingress {
        let fits = match &request {
            Ok(r) if !r.is_empty() => r.contains(ip),
            Ok(_) => families
                .as_ref()
                .is_ok_and(|f| f.contains(&Family::of_addr(ip))),
            Err(_) => false,
        };
        let in_pool = active.iter().any(|p| p.usable(ip) && p.selects(&labels));
        if fits && in_pool && book.may_take(i, ip) {
            book.take(i, *ip);
            continue;
        }
        if let Some(pool) = origin.get(ip)
            && pools.iter().any(|p| &p.name == pool && !p.contains(ip))
        {
            orphans.push(Orphan {
                pool: pool.clone(),
                service: svc.key(),
                ip: *ip,
            });
        }
    }
    Ask { families, request }
}

/// Gives Service `i` what it asks for and does not hold yet: the requested
/// addresses, else one address of each wanted family. Returns its condition.
fn allocate_missing(i: usize, ask: Ask, active: &[&Pool], book: &mut Book<'_>) -> Satisfied {
    match (ask.request, ask.families) {
        (Err(bad), _) => bad,
        (Ok(request), _) if !request.is_empty() => claim_requested(i, &request, active, book),
        (_, Err(why)) => why,
        (_, Ok(families)) => allocate_families(i, families, active, book),
    }
}

/// Takes each requested address Service `i` does not hold yet.
fn claim_requested(
    i: usize,
    request: &[IpAddr],
    active: &[&Pool],
    book: &mut Book<'_>,
) -> Satisfied {
    let labels = book.services[i].selector_labels();
    let held = book.held[i].clone();
    let mut condition = Satisfied::yes();
    for ip in request.iter().filter(|ip| !held.contains(ip)) {
        match claim(active, &labels, ip) {
            Err(why) => condition = why,
            Ok(()) if book.may_take(i, ip) => book.take(i, *ip),
            Ok(()) => {
                condition = Satisfied::no(
                    "already_allocated",
                    format!("The requested IP '{ip}' is already allocated to another Service"),
                )
            }
        }
    }
    condition
}

/// Allocates an address of each of `families` Service `i` holds none of; a
/// PreferDualStack Service that got any is satisfied.
fn allocate_families(
    i: usize,
    families: Vec<Family>,
    active: &[&Pool],
    book: &mut Book<'_>,
) -> Satisfied {
    let services = book.services;
    let svc = &services[i];
    let labels = svc.selector_labels();
    let prefers_dual_stack = svc.policy == FamilyPolicy::PreferDualStack;
    let held = book.held[i].clone();
    let mut failures = Vec::new();
    for family in families {
        if held.iter().any(|ip| Family::of_addr(ip) == family) {
            continue;
        }
        match allocate(active, &labels, family, i, book) {
            Ok(ip) => book.take(i, ip),
            Err(why) => failures.push(why),
        }
    }
    let got_any = !book.held[i].is_empty();
    match failures.into_iter().next() {
        None => Satisfied::yes(),
        Some(_) if prefers_dual_stack && got_any => Satisfied::yes(),
        Some(why) => why,
    }
}

/// Pool `p`'s status: its conflict, or how many of its addresses are held (each
/// recorded in `origin` as the next plan's).
fn pool_status(
    p: &Pool,
    conflicting: &BTreeMap<String, String>,
    book: &Book<'_>,
    origin: &mut BTreeMap<IpAddr, String>,
) -> PoolStatus {
    let mut status = PoolStatus {
        conflict: conflicting.get(&p.name).cloned(),
        total: p.total(),
        used: 0,
    };
    if status.conflict.is_none() {
        for ip in book.used.iter().filter(|ip| p.usable(ip)) {
            status.used += 1;
            origin.insert(*ip, p.name.clone());
        }
    }
    status
}

/// Whether a requested `ip` can come from an enabled pool selecting the Service.
fn claim(
    active: &[&Pool],
    labels: &BTreeMap<String, String>,
    ip: &IpAddr,
) -> Result<(), Satisfied> {
    let holding: Vec<&&Pool> = active.iter().filter(|p| p.contains(ip)).collect();
    if holding.is_empty() {
        return Err(Satisfied::no(
            "no_pool",
            format!(
                "The requested IP '{ip}' is not in any CiliumLoadBalancerIPPool that is not conflicting"
            ),
        ));
    }
    let selecting: Vec<&&&Pool> = holding.iter().filter(|p| p.selects(labels)).collect();
    if selecting.is_empty() {
        return Err(Satisfied::no(
            "pool_selector_mismatch",
            format!(
                "The requested IP '{ip}' is in pool '{}', whose serviceSelector does not select this Service",
                holding[0].name
            ),
        ));
    }
    let Some(pool) = selecting.iter().find(|p| !p.disabled) else {
        return Err(Satisfied::no(
            "no_pool",
            format!(
                "The requested IP '{ip}' is in pool '{}', which is disabled",
                selecting[0].name
            ),
        ));
    };
    if !pool.usable(ip) {
        return Err(Satisfied::no(
            "no_pool",
            format!(
                "The requested IP '{ip}' is the first or last address of a cidr block of pool '{}', which has allowFirstLastIPs: \"No\"",
                pool.name
            ),
        ));
    }
    Ok(())
}

/// An address of `family` for Service `svc`: one a Service it may share with holds
/// (sharing key), else the lowest free one of the first enabled pool selecting it.
fn allocate(
    active: &[&Pool],
    labels: &BTreeMap<String, String>,
    family: Family,
    svc: usize,
    book: &mut Book,
) -> Result<IpAddr, Satisfied> {
    let candidates: Vec<&&Pool> = active
        .iter()
        .filter(|p| !p.disabled && p.has_family(family) && p.selects(labels))
        .collect();
    if candidates.is_empty() {
        return Err(Satisfied::no(
            "no_pool",
            "There are no enabled CiliumLoadBalancerIPPools that match this service".into(),
        ));
    }
    if book.services[svc].sharing_key().is_some() {
        let shared = book.holders.iter().find(|(ip, hs)| {
            Family::of_addr(ip) == family
                && !hs.contains(&svc)
                && hs
                    .iter()
                    .all(|h| may_share(&book.services[svc], &book.services[*h]))
                && candidates.iter().any(|p| p.usable(ip))
        });
        if let Some((ip, _)) = shared {
            return Ok(*ip);
        }
    }
    candidates
        .iter()
        .find_map(|p| p.first_free(family, &book.used))
        .ok_or_else(|| {
            Satisfied::no(
                "out_of_ips",
                "All enabled CiliumLoadBalancerIPPools that match this service are out of IPs"
                    .into(),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{CiliumLoadBalancerIPPool, decode};

    fn pool(name: &str, spec: serde_json::Value) -> Pool {
        let v = serde_json::json!({
            "metadata": {"name": name, "creationTimestamp": format!("2026-01-01T00:00:0{}Z", name.len() % 10)},
            "spec": spec,
        });
        Pool::from_resource(&decode::<CiliumLoadBalancerIPPool>(&v).unwrap()).unwrap()
    }

    fn svc(name: &str) -> ServiceView {
        ServiceView {
            namespace: "default".into(),
            name: name.into(),
            created: name.into(),
            load_balancer: true,
            ip_families: vec![Family::V4],
            ports: vec![(80, "TCP".into())],
            ..Default::default()
        }
    }

    fn with(mut s: ServiceView, k: &str, v: &str) -> ServiceView {
        s.annotations.insert(k.into(), v.into());
        s
    }

    const V4: Settings = Settings {
        ipv4: true,
        ipv6: false,
        default_ipam: DefaultIpam::Lbipam,
    };
    const DUAL: Settings = Settings {
        ipv4: true,
        ipv6: true,
        default_ipam: DefaultIpam::Lbipam,
    };

    fn ips(p: &Plan, key: &str) -> Vec<String> {
        match &p.services[key] {
            ServicePlan::Assign { ips, .. } => ips.iter().map(|i| i.to_string()).collect(),
            ServicePlan::Release => vec!["released".into()],
        }
    }

    fn reason(p: &Plan, key: &str) -> &'static str {
        match &p.services[key] {
            ServicePlan::Assign { condition, .. } => condition.reason,
            ServicePlan::Release => "released",
        }
    }

    fn message(p: &Plan, key: &str) -> String {
        match &p.services[key] {
            ServicePlan::Assign { condition, .. } => condition.message.clone(),
            ServicePlan::Release => String::new(),
        }
    }

    fn small() -> Pool {
        pool(
            "small",
            serde_json::json!({"blocks": [{"start": "10.0.20.100", "stop": "10.0.20.102"}],
                               "serviceSelector": {"matchLabels": {"color": "blue"}}}),
        )
    }

    fn blue(name: &str) -> ServiceView {
        let mut s = svc(name);
        s.labels.insert("color".into(), "blue".into());
        s
    }

    #[test]
    fn lab4_selector_allocation_and_exhaustion() {
        let services = [blue("a"), svc("plain"), blue("b"), blue("c"), blue("d")];
        let p = plan(&[small()], &services, &V4, &BTreeMap::new());
        assert_eq!(ips(&p, "default/a"), ["10.0.20.100"]);
        assert_eq!(reason(&p, "default/a"), "satisfied");
        assert_eq!(ips(&p, "default/b"), ["10.0.20.101"]);
        assert_eq!(ips(&p, "default/c"), ["10.0.20.102"]);
        assert_eq!(reason(&p, "default/d"), "out_of_ips");
        assert!(ips(&p, "default/d").is_empty());
        assert_eq!(reason(&p, "default/plain"), "no_pool");
        assert_eq!(
            message(&p, "default/plain"),
            "There are no enabled CiliumLoadBalancerIPPools that match this service"
        );
        let st = &p.pools["small"];
        assert_eq!((st.total, st.used, st.available()), (3, 3, 0));
        assert_eq!(p.counts(), (5, 2));
        assert_eq!(p.origin.len(), 3);
    }

    #[test]
    fn synthetic_labels_select_by_namespace_and_name() {
        let p1 = pool(
            "by-name",
            serde_json::json!({"blocks": [{"cidr": "10.1.0.0/30"}], "serviceSelector": {
                "matchLabels": {"io.kubernetes.service.namespace": "default", "io.kubernetes.service.name": "web"}}}),
        );
        let p = plan(&[p1], &[svc("web"), svc("db")], &V4, &BTreeMap::new());
        assert_eq!(ips(&p, "default/web"), ["10.1.0.0"]);
        assert_eq!(reason(&p, "default/db"), "no_pool");
    }

    #[test]
    fn a_conflicting_pool_allocates_nothing_and_a_disabled_one_keeps_its_services() {
        let overlap = pool(
            "overlapping",
            serde_json::json!({"blocks": [{"cidr": "10.0.20.96/28"}]}),
        );
        let services = [blue("a"), svc("plain")];
        let p = plan(
            &[small(), overlap.clone()],
            &services,
            &V4,
            &BTreeMap::new(),
        );
        assert_eq!(ips(&p, "default/a"), ["10.0.20.100"]);
        assert_eq!(reason(&p, "default/plain"), "no_pool");
        assert!(p.pools["overlapping"].conflict.is_some());
        assert_eq!(p.pools["overlapping"].used, 0);
        assert!(p.pools["small"].conflict.is_none());

        let mut disabled = small();
        disabled.disabled = true;
        let mut a = blue("a");
        a.ingress = vec!["10.0.20.100".parse().unwrap()];
        let p = plan(&[disabled], &[a, blue("new")], &V4, &BTreeMap::new());
        assert_eq!(ips(&p, "default/a"), ["10.0.20.100"]);
        assert_eq!(reason(&p, "default/a"), "satisfied");
        assert_eq!(reason(&p, "default/new"), "no_pool");
        assert_eq!(p.pools["small"].used, 1);
    }

    #[test]
    fn held_addresses_survive_a_restart_and_a_new_pool() {
        let mut a = blue("a");
        a.ingress = vec!["10.0.20.102".parse().unwrap()];
        let earlier = pool(
            "aa",
            serde_json::json!({"blocks": [{"cidr": "10.5.0.0/24"}]}),
        );
        let mut pools = vec![small(), earlier];
        super::super::pools::sort_pools(&mut pools);
        assert_eq!(pools[0].name, "aa");
        let p = plan(&pools, &[a, blue("b")], &V4, &BTreeMap::new());
        assert_eq!(ips(&p, "default/a"), ["10.0.20.102"]);
        assert_eq!(ips(&p, "default/b"), ["10.5.0.0"]);
    }

    #[test]
    fn a_pool_edit_keeps_valid_addresses_and_reports_orphans() {
        let before = pool(
            "edit",
            serde_json::json!({"blocks": [{"start": "10.0.0.1", "stop": "10.0.0.4"}]}),
        );
        let services = [svc("a"), svc("b"), svc("c")];
        let p1 = plan(&[before], &services, &V4, &BTreeMap::new());
        assert_eq!(ips(&p1, "default/c"), ["10.0.0.3"]);
        // The edit drops 10.0.0.1 and adds a block in front: a and c keep theirs.
        let after = pool(
            "edit",
            serde_json::json!({"blocks": [{"cidr": "10.9.0.0/31"}, {"start": "10.0.0.2", "stop": "10.0.0.4"}]}),
        );
        let held: Vec<ServiceView> = services
            .iter()
            .map(|s| {
                let mut s = s.clone();
                s.ingress = ips(&p1, &s.key())
                    .iter()
                    .map(|i| i.parse().unwrap())
                    .collect();
                s
            })
            .collect();
        let p2 = plan(&[after], &held, &V4, &p1.origin);
        assert_eq!(ips(&p2, "default/b"), ["10.0.0.2"]);
        assert_eq!(ips(&p2, "default/c"), ["10.0.0.3"]);
        assert_eq!(ips(&p2, "default/a"), ["10.9.0.0"]);
        assert_eq!(
            p2.orphans,
            [Orphan {
                pool: "edit".into(),
                service: "default/a".into(),
                ip: "10.0.0.1".parse().unwrap()
            }]
        );
        // A deleted pool orphans nothing: its Services just lose the address.
        let p3 = plan(&[], &held, &V4, &p1.origin);
        assert!(p3.orphans.is_empty());
        assert_eq!(reason(&p3, "default/a"), "no_pool");
    }

    #[test]
    fn classes_and_the_default() {
        let pools = [pool(
            "all",
            serde_json::json!({"blocks": [{"cidr": "10.1.0.0/28"}]}),
        )];
        let mut l2 = svc("l2");
        l2.class = Some("io.cilium/l2-announcer".into());
        let mut other = svc("other");
        other.class = Some("example.com/lb".into());
        let mut node = svc("node");
        node.class = Some(NODE_IPAM_CLASS.into());
        let mut cluster_ip = svc("cip");
        cluster_ip.load_balancer = false;
        let mut was_served = svc("gone");
        was_served.load_balancer = false;
        was_served.has_condition = true;
        let services = [svc("none"), l2, other, node, cluster_ip, was_served];
        let p = plan(&pools, &services, &V4, &BTreeMap::new());
        assert_eq!(
            p.services.keys().collect::<Vec<_>>(),
            ["default/gone", "default/l2", "default/none"]
        );
        assert_eq!(p.services["default/gone"], ServicePlan::Release);
        for default_ipam in [DefaultIpam::None, DefaultIpam::Nodeipam] {
            let s = Settings { default_ipam, ..V4 };
            let p = plan(&pools, &services, &s, &BTreeMap::new());
            assert!(!p.services.contains_key("default/none"));
            assert!(p.services.contains_key("default/l2"));
        }
    }

    #[test]
    fn family_policies() {
        let pools = [pool(
            "dual",
            serde_json::json!({"blocks": [{"cidr": "10.1.0.0/30"}, {"cidr": "fd00::/126"}]}),
        )];
        let single = svc("single");
        let mut six = svc("six");
        six.ip_families = vec![Family::V6, Family::V4];
        let mut prefer = svc("prefer");
        prefer.policy = FamilyPolicy::PreferDualStack;
        let mut require = svc("require");
        require.policy = FamilyPolicy::RequireDualStack;
        let services = [single, six, prefer, require];
        let p = plan(&pools, &services, &DUAL, &BTreeMap::new());
        // Planned by creation (here: by name).
        assert_eq!(ips(&p, "default/prefer"), ["10.1.0.0", "fd00::"]);
        assert_eq!(ips(&p, "default/require"), ["10.1.0.1", "fd00::1"]);
        assert_eq!(ips(&p, "default/single"), ["10.1.0.2"]);
        assert_eq!(ips(&p, "default/six"), ["fd00::2"]);
        assert!(p.counts().1 == 0);
        // IPv6 off: PreferDualStack takes IPv4 alone; RequireDualStack stays unsatisfied.
        let p = plan(&pools, &services, &V4, &BTreeMap::new());
        assert_eq!(ips(&p, "default/prefer"), ["10.1.0.0"]);
        assert_eq!(reason(&p, "default/prefer"), "satisfied");
        assert!(ips(&p, "default/require").is_empty());
        assert!(message(&p, "default/require").contains("RequireDualStack"));
        assert_eq!(reason(&p, "default/six"), "no_pool");
        // A pool of one family only: PreferDualStack is satisfied with it.
        let v4only = [pool(
            "v4",
            serde_json::json!({"blocks": [{"cidr": "10.1.0.0/30"}]}),
        )];
        let p = plan(&v4only, &services, &DUAL, &BTreeMap::new());
        assert_eq!(reason(&p, "default/prefer"), "satisfied");
        assert_eq!(reason(&p, "default/require"), "no_pool");
        assert_eq!(ips(&p, "default/require"), ["10.1.0.1"]);
    }

    #[test]
    fn requested_addresses() {
        let pools = [
            pool(
                "first-last",
                serde_json::json!({"allowFirstLastIPs": "No", "blocks": [{"cidr": "10.0.10.0/24"}]}),
            ),
            pool(
                "blues",
                serde_json::json!({"blocks": [{"cidr": "10.0.30.0/24"}], "serviceSelector": {"matchLabels": {"color": "blue"}}}),
            ),
        ];
        let services = [
            with(svc("two"), IPS_ANNOTATION, "10.0.10.100, 10.0.10.101"),
            {
                let mut l = svc("legacy");
                l.legacy_ip = Some("10.0.10.7".into());
                l
            },
            with(svc("x-taken"), IPS_ANNOTATION, "10.0.10.100"),
            with(svc("broadcast"), IPS_ANNOTATION, "10.0.10.255"),
            with(svc("nowhere"), IPS_ANNOTATION, "192.168.0.1"),
            with(svc("not-blue"), IPS_ANNOTATION, "10.0.30.5"),
            with(blue("blue"), IPS_ANNOTATION, "10.0.30.5"),
            with(svc("typo"), IPS_ANNOTATION, "10.0.10.3OO"),
        ];
        let p = plan(&pools, &services, &V4, &BTreeMap::new());
        assert_eq!(ips(&p, "default/two"), ["10.0.10.100", "10.0.10.101"]);
        assert_eq!(ips(&p, "default/legacy"), ["10.0.10.7"]);
        assert_eq!(reason(&p, "default/x-taken"), "already_allocated");
        assert_eq!(reason(&p, "default/broadcast"), "no_pool");
        assert!(message(&p, "default/broadcast").contains("allowFirstLastIPs"));
        assert_eq!(reason(&p, "default/nowhere"), "no_pool");
        assert_eq!(reason(&p, "default/not-blue"), "pool_selector_mismatch");
        assert_eq!(ips(&p, "default/blue"), ["10.0.30.5"]);
        assert_eq!(reason(&p, "default/typo"), "invalid_request");
        assert!(message(&p, "default/typo").contains("\"10.0.10.3OO\" is not an IP address"));
        // Held addresses that are no longer requested are given back.
        let mut moved = with(svc("two"), IPS_ANNOTATION, "10.0.10.101");
        moved.ingress = vec![
            "10.0.10.100".parse().unwrap(),
            "10.0.10.101".parse().unwrap(),
        ];
        let p = plan(&pools, &[moved], &V4, &BTreeMap::new());
        assert_eq!(ips(&p, "default/two"), ["10.0.10.101"]);
    }

    #[test]
    fn sharing_keys_share_when_ports_do_not_conflict() {
        let pools = [pool(
            "p",
            serde_json::json!({"blocks": [{"cidr": "10.2.0.0/29"}]}),
        )];
        let web = with(svc("web"), SHARING_KEY_ANNOTATION, "vip");
        let mut dns = with(svc("dns"), SHARING_KEY_ANNOTATION, "vip");
        dns.ports = vec![(53, "UDP".into()), (80, "UDP".into())];
        let again = with(svc("web2"), SHARING_KEY_ANNOTATION, "vip");
        let other_key = with(svc("other"), SHARING_KEY_ANNOTATION, "else");
        let p = plan(&pools, &[web, dns, again, other_key], &V4, &BTreeMap::new());
        // By creation (name): dns, other, web, web2.
        assert_eq!(ips(&p, "default/dns"), ["10.2.0.0"]);
        assert_eq!(ips(&p, "default/other"), ["10.2.0.1"]);
        assert_eq!(ips(&p, "default/web"), ["10.2.0.0"]);
        // Port 80/TCP conflicts with web: a second address from the key's set.
        assert_eq!(ips(&p, "default/web2"), ["10.2.0.2"]);
        assert_eq!(p.pools["p"].used, 3);
    }

    #[test]
    fn cross_namespace_sharing_needs_both_sides() {
        let pools = [pool(
            "p",
            serde_json::json!({"blocks": [{"cidr": "10.2.0.0/29"}]}),
        )];
        let mk = |ns: &str, name: &str, port: i32, allow: Option<&str>| {
            let mut s = with(svc(name), SHARING_KEY_ANNOTATION, "vip");
            s.namespace = ns.into();
            s.ports = vec![(port, "TCP".into())];
            if let Some(a) = allow {
                s.annotations
                    .insert(SHARING_NAMESPACES_ANNOTATION.into(), a.into());
            }
            s
        };
        let services = [
            mk("ns1", "a", 80, Some("ns2")),
            mk("ns2", "b", 81, Some("ns1, ns3")),
            mk("ns3", "c", 82, Some("*")),
            mk("ns4", "d", 83, None),
        ];
        let p = plan(&pools, &services, &V4, &BTreeMap::new());
        assert_eq!(ips(&p, "ns1/a"), ["10.2.0.0"]);
        assert_eq!(ips(&p, "ns2/b"), ["10.2.0.0"]);
        // ns3 allows all, but ns1 does not allow ns3.
        assert_eq!(ips(&p, "ns3/c"), ["10.2.0.1"]);
        // ns4 allows nobody else, ns3 allows ns4 but ns4 does not allow ns3.
        assert_eq!(ips(&p, "ns4/d"), ["10.2.0.2"]);
    }

    #[test]
    fn two_holders_of_one_address_after_a_restart_keep_it_only_if_they_may_share() {
        let pools = [pool(
            "p",
            serde_json::json!({"blocks": [{"cidr": "10.2.0.0/29"}]}),
        )];
        let mut a = svc("a");
        a.ingress = vec!["10.2.0.4".parse().unwrap()];
        let mut b = svc("b");
        b.ingress = a.ingress.clone();
        let p = plan(&pools, &[a, b], &V4, &BTreeMap::new());
        assert_eq!(ips(&p, "default/a"), ["10.2.0.4"]);
        assert_eq!(ips(&p, "default/b"), ["10.2.0.0"]);
    }
}
