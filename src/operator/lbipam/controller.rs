//! LB IPAM's loop in the leader: watches every `CiliumLoadBalancerIPPool` and
//! every Service ([`Mirror`]s), and once both are listed and the first pool exists
//! (dormant until then) plans everything again after each change
//! ([`services::plan`]) and writes what differs from what the API server has:
//! each Service's `status.loadBalancer.ingress` and `cilium.io/IPAMRequestSatisfied`
//! condition, each pool's conditions. Writes are server-side applies of the
//! status subresource under the field manager `podnet-operator-lb-ipam`, so a
//! Service or pool LB IPAM no longer serves loses exactly the fields it wrote. A
//! failed write is retried with a backoff by planning again. The loop is the
//! controller kit's ([`crate::controller::run`]): no debounce, no resync.

use std::collections::BTreeMap;
use std::net::IpAddr;

use futures::{Stream, StreamExt, stream};
use k8s_openapi::api::core::v1::{Service, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

use super::metrics::LbIpamMetrics;
use super::pools::{Pool, sort_pools};
use super::services::{
    self, FamilyPolicy, Orphan, Plan, PoolStatus, ServicePlan, ServiceView, Settings,
};
use crate::controller::{self, Controller, Timing, WatchItem, ending};
use crate::ipam::Family;
use crate::k8s::discovery::{CiliumKind, resolve_waiting};
use crate::k8s::mirror::{Mirror, WatchEnded, key_of};
use crate::k8s::objects::{ApplyBody, condition_json, condition_of, typed};
use crate::resources::{CiliumLoadBalancerIPPool, LB_IP_POOL_KIND};

/// The field manager of LB IPAM's applies.
pub const FIELD_MANAGER: &str = "podnet-operator-lb-ipam";
pub const SATISFIED_CONDITION: &str = "cilium.io/IPAMRequestSatisfied";
pub const CONFLICT_CONDITION: &str = "cilium.io/PoolConflict";
pub const TOTAL_CONDITION: &str = "cilium.io/IPsTotal";
pub const AVAILABLE_CONDITION: &str = "cilium.io/IPsAvailable";
pub const USED_CONDITION: &str = "cilium.io/IPsUsed";
/// podnet's own: the pool's last edit left Services' addresses outside it.
pub const ORPHANED_CONDITION: &str = "podnet.io/ServicesOrphaned";
/// podnet's own: the pool cannot be used (what is wrong and where).
pub const INVALID_CONDITION: &str = "podnet.io/InvalidPool";

/// What LB IPAM reads of a Service.
pub fn view(svc: &Service) -> ServiceView {
    let meta = &svc.metadata;
    let spec = svc.spec.clone().unwrap_or_default();
    ServiceView {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        created: meta
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
        labels: meta.labels.clone().unwrap_or_default(),
        annotations: meta.annotations.clone().unwrap_or_default(),
        load_balancer: spec.type_.as_deref() == Some("LoadBalancer"),
        class: spec.load_balancer_class.clone(),
        ip_families: ip_families(&spec),
        policy: match spec.ip_family_policy.as_deref() {
            Some("PreferDualStack") => FamilyPolicy::PreferDualStack,
            Some("RequireDualStack") => FamilyPolicy::RequireDualStack,
            _ => FamilyPolicy::SingleStack,
        },
        legacy_ip: spec.load_balancer_ip.clone().filter(|s| !s.is_empty()),
        ports: spec
            .ports
            .iter()
            .flatten()
            .map(|p| (p.port, p.protocol.clone().unwrap_or_else(|| "TCP".into())))
            .collect(),
        ingress: ingress_ips(svc),
        has_condition: condition(svc, SATISFIED_CONDITION).is_some(),
    }
}

/// `spec.ipFamilies`, in order.
pub fn ip_families(spec: &ServiceSpec) -> Vec<Family> {
    spec.ip_families
        .iter()
        .flatten()
        .filter_map(|f| match f.as_str() {
            "IPv4" => Some(Family::V4),
            "IPv6" => Some(Family::V6),
            _ => None,
        })
        .collect()
}

/// `status.loadBalancer.ingress[].ip` that parse.
pub fn ingress_ips(svc: &Service) -> Vec<IpAddr> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .collect()
}

pub fn condition<'a>(svc: &'a Service, kind: &str) -> Option<&'a Condition> {
    svc.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)
}

/// Whether `conditions` (as the object has them) already say what `wanted` says.
fn same_conditions(have: &[Value], wanted: &[Value]) -> bool {
    let strip = |c: &Value| {
        (
            c["type"].clone(),
            c["status"].clone(),
            c["reason"].clone(),
            c["message"].clone(),
        )
    };
    let mut a: Vec<_> = have.iter().map(strip).collect();
    let mut b: Vec<_> = wanted.iter().map(strip).collect();
    a.sort_by_key(|c| c.0.to_string());
    b.sort_by_key(|c| c.0.to_string());
    a == b
}

/// The loop's state.
struct LbIpam {
    services_api: Api<Service>,
    pools_api: Api<DynamicObject>,
    /// The pools' apiVersion (API discovery: the newest served one podnet reads).
    pools_version: String,
    settings: Settings,
    metrics: LbIpamMetrics,
    pools: Mirror<DynamicObject>,
    services: Mirror<Service>,
    awake: bool,
    /// Which pool each held address came from (the last plan's).
    origin: BTreeMap<IpAddr, String>,
    /// pool -> (its generation, the orphans its edit at that generation made).
    orphans: BTreeMap<String, (i64, Vec<Orphan>)>,
    /// Object key -> (its resourceVersion when written, what was written): the
    /// copy is stale until the watch brings the write back, so the same write is
    /// not sent twice meanwhile.
    sent: BTreeMap<String, (Option<String>, Written)>,
}

/// What was written to an object, compared with what the next plan wants.
#[derive(Debug, Clone, PartialEq)]
enum Written {
    /// A Service's planned status.
    Service(ServicePlan),
    /// A pool's conditions: type, status, reason and message of each.
    PoolConditions(Vec<[Value; 4]>),
}

/// One item of one of the loop's watches (None: that watch ended).
enum Watched {
    Pool(Box<WatchItem<DynamicObject>>),
    Service(Box<WatchItem<Service>>),
}

/// A pass's plan: what every Service and pool should say, and the pools that
/// cannot be used (name -> what is wrong).
struct LbPlan {
    plan: Plan,
    invalid: BTreeMap<String, String>,
}

/// Runs until a watch ends (they do not while the API server can be retried);
/// returns why.
pub async fn run(client: kube::Client, settings: Settings, metrics: LbIpamMetrics) -> WatchEnded {
    let pools = resolve_waiting(&client, CiliumKind::LbIpPool, &|_| {}).await;
    let mut c = LbIpam {
        services_api: Api::all(client.clone()),
        pools_api: Api::all_with(client, &pools),
        pools_version: pools.api_version,
        settings,
        metrics,
        pools: Mirror::default(),
        services: Mirror::default(),
        awake: false,
        origin: BTreeMap::new(),
        orphans: BTreeMap::new(),
        sent: BTreeMap::new(),
    };
    let events = c.watches();
    controller::run(&mut c, events, Timing::AT_ONCE).await
}

impl Controller for LbIpam {
    type Input = Watched;
    type Plan = LbPlan;
    type Error = kube::Error;
    const WHAT: &'static str = "an LB IPAM write";

    fn feed(&mut self, input: Watched) -> Result<bool, WatchEnded> {
        match input {
            Watched::Pool(e) => self.pools.feed(*e, LB_IP_POOL_KIND),
            Watched::Service(e) => self.services.feed(*e, "Service"),
        }
    }

    fn ready(&self) -> bool {
        self.pools.listed() && self.services.listed()
    }

    /// None while dormant (no pool yet).
    async fn plan(&mut self) -> Option<LbPlan> {
        if !self.awake {
            if self.pools.is_empty() {
                return None;
            }
            tracing::info!("the first CiliumLoadBalancerIPPool exists: LB IPAM is awake");
            self.awake = true;
        }
        Some(self.plan_all())
    }

    async fn apply(&mut self, plan: LbPlan) -> Result<(), kube::Error> {
        self.write_all(&plan).await
    }
}

/// The pool `obj` defines, or what is wrong with it (the message its
/// condition shows), decoded as every object is (`k8s::objects::typed`).
fn parse_pool(obj: &DynamicObject) -> Result<Pool, String> {
    typed::<CiliumLoadBalancerIPPool, _>(obj, LB_IP_POOL_KIND)
        .map_err(|e| e.to_string())
        .and_then(|p| Pool::from_resource(&p).map_err(|e| e.to_string()))
}

/// The status apply of Service `namespace/name`.
fn service_status_body(namespace: &str, name: &str, status: Value) -> ApplyBody {
    ApplyBody::new("v1", "Service", name)
        .meta("namespace", namespace.into())
        .with("status", status)
}

/// The status apply of pool `name` (at `api_version`): its conditions.
fn pool_status_body(api_version: &str, name: &str, conditions: Vec<Value>) -> ApplyBody {
    ApplyBody::new(api_version, LB_IP_POOL_KIND, name)
        .with("status", json!({"conditions": conditions}))
}

/// Applies `status` to Service `svc`'s status subresource under `manager`
/// (fields of the manager's earlier applies that `status` lacks are removed); a
/// Service deleted meanwhile is not an error.
pub async fn apply_service_status(
    client: kube::Client,
    manager: &str,
    svc: &Service,
    status: Value,
) -> Result<(), kube::Error> {
    let namespace = svc.metadata.namespace.clone().unwrap_or_default();
    let name = svc.metadata.name.clone().unwrap_or_default();
    let body = service_status_body(&namespace, &name, status);
    let api: Api<Service> = Api::namespaced(client, &namespace);
    let params = PatchParams::apply(manager).force();
    match api.patch_status(&name, &params, &Patch::Apply(&body)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

impl LbIpam {
    /// The watches of the pools and the Services, merged.
    fn watches(&self) -> impl Stream<Item = Watched> + Unpin + use<> {
        let config = watcher::Config::default;
        let pools = watcher(self.pools_api.clone(), config()).default_backoff();
        let services = watcher(self.services_api.clone(), config()).default_backoff();
        stream::select(
            ending(pools).map(|e| Watched::Pool(Box::new(e))),
            ending(services).map(|e| Watched::Service(Box::new(e))),
        )
        .boxed()
    }

    /// Plans everything (and keeps what the next plan starts from: each
    /// address's pool, each pool edit's orphans); updates the metrics.
    fn plan_all(&mut self) -> LbPlan {
        let mut pools = Vec::new();
        let mut invalid = BTreeMap::new();
        for obj in self.pools.objects() {
            let name = key_of(obj);
            match parse_pool(obj) {
                Ok(p) => pools.push(p),
                Err(e) => {
                    invalid.insert(name, e);
                }
            }
        }
        sort_pools(&mut pools);
        let views: Vec<ServiceView> = self.services.objects().map(view).collect();
        let plan = services::plan(&pools, &views, &self.settings, &self.origin);
        self.origin = plan.origin.clone();
        self.note_orphans(&plan);
        self.metrics.update(&plan);
        LbPlan { plan, invalid }
    }

    /// Writes what differs from `plan` (and was not written already).
    async fn write_all(&mut self, LbPlan { plan, invalid }: &LbPlan) -> Result<(), kube::Error> {
        let mut first_error = None;
        let current: BTreeMap<String, &Service> =
            self.services.objects().map(|s| (key_of(s), s)).collect();
        self.sent.retain(|k, _| {
            current.contains_key(k) || self.pools.objects().any(|p| &key_of(p) == k)
        });
        for (key, want) in &plan.services {
            let Some(svc) = current.get(key) else {
                continue;
            };
            let sent = (
                svc.metadata.resource_version.clone(),
                Written::Service(want.clone()),
            );
            if self.sent.get(key) == Some(&sent) {
                continue;
            }
            match self.write_service(svc, want).await {
                Ok(true) => {
                    self.sent.insert(key.clone(), sent);
                }
                Ok(false) => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        let objects: Vec<DynamicObject> = self.pools.objects().cloned().collect();
        for obj in &objects {
            let name = key_of(obj);
            let wanted = match (plan.pools.get(&name), invalid.get(&name)) {
                (Some(status), _) => self.pool_conditions(obj, &name, status),
                (None, Some(problem)) => {
                    tracing::warn!(pool = %name, "{problem}");
                    vec![condition_json(
                        INVALID_CONDITION,
                        "True",
                        "invalid",
                        problem,
                        condition_of(obj, INVALID_CONDITION),
                    )]
                }
                (None, None) => continue,
            };
            let stripped: Vec<[Value; 4]> = wanted
                .iter()
                .map(|c| ["type", "status", "reason", "message"].map(|k| c[k].clone()))
                .collect();
            let sent = (
                obj.metadata.resource_version.clone(),
                Written::PoolConditions(stripped),
            );
            if self.sent.get(&name) == Some(&sent) {
                continue;
            }
            match self.write_pool(obj, &name, wanted).await {
                Ok(true) => {
                    self.sent.insert(name, sent);
                }
                Ok(false) => {}
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Keeps the orphans of each pool's latest edit.
    fn note_orphans(&mut self, plan: &Plan) {
        let generations: BTreeMap<String, i64> = self
            .pools
            .objects()
            .map(|o| (key_of(o), o.metadata.generation.unwrap_or(0)))
            .collect();
        self.orphans
            .retain(|pool, (g, _)| generations.get(pool) == Some(g));
        for o in &plan.orphans {
            let generation = generations.get(&o.pool).copied().unwrap_or(0);
            tracing::warn!(pool = %o.pool, service = %o.service, ip = %o.ip, "a pool edit left the Service's address outside the pool; it was released");
            let entry = self
                .orphans
                .entry(o.pool.clone())
                .or_insert_with(|| (generation, Vec::new()));
            if !entry.1.contains(o) {
                entry.1.push(o.clone());
            }
        }
    }

    fn pool_conditions(&self, obj: &DynamicObject, name: &str, status: &PoolStatus) -> Vec<Value> {
        let old = |kind: &str| condition_of(obj, kind);
        let mut out = vec![match &status.conflict {
            Some(m) => condition_json(
                CONFLICT_CONDITION,
                "True",
                "cidr_overlap",
                m,
                old(CONFLICT_CONDITION),
            ),
            None => condition_json(
                CONFLICT_CONDITION,
                "False",
                "resolved",
                "",
                old(CONFLICT_CONDITION),
            ),
        }];
        for (kind, n) in [
            (TOTAL_CONDITION, status.total),
            (AVAILABLE_CONDITION, status.available()),
            (USED_CONDITION, status.used),
        ] {
            out.push(condition_json(
                kind,
                "Unknown",
                "noreason",
                &n.to_string(),
                old(kind),
            ));
        }
        if let Some((_, orphans)) = self.orphans.get(name).filter(|(_, o)| !o.is_empty()) {
            let list: Vec<String> = orphans
                .iter()
                .map(|o| format!("{} ({})", o.service, o.ip))
                .collect();
            let message = format!(
                "the last edit of this pool left these Services' addresses outside it, so they were released and allocated again: {}; to keep an address, put its block back",
                list.join(", ")
            );
            out.push(condition_json(
                ORPHANED_CONDITION,
                "True",
                "pool_edited",
                &message,
                old(ORPHANED_CONDITION),
            ));
        }
        out
    }

    async fn write_pool(
        &self,
        obj: &DynamicObject,
        name: &str,
        wanted: Vec<Value>,
    ) -> Result<bool, kube::Error> {
        let have: Vec<Value> = obj
            .data
            .pointer("/status/conditions")
            .and_then(|c| c.as_array())
            .cloned()
            .unwrap_or_default();
        if same_conditions(&have, &wanted) {
            return Ok(false);
        }
        let body = pool_status_body(&self.pools_version, name, wanted);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        match self
            .pools_api
            .patch_status(name, &params, &Patch::Apply(&body))
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Writes `want` unless the Service says it already; returns whether it wrote.
    async fn write_service(&self, svc: &Service, want: &ServicePlan) -> Result<bool, kube::Error> {
        let (namespace, name) = (
            svc.metadata.namespace.clone().unwrap_or_default(),
            svc.metadata.name.clone().unwrap_or_default(),
        );
        let status = match want {
            ServicePlan::Release => json!({}),
            ServicePlan::Assign { ips, condition: c } => {
                let old = condition(svc, SATISFIED_CONDITION);
                let mut have_ips = ingress_ips(svc);
                have_ips.sort();
                let same_condition = old.is_some_and(|o| {
                    o.status == if c.status { "True" } else { "False" }
                        && o.reason == c.reason
                        && o.message == c.message
                });
                if same_condition && &have_ips == ips {
                    return Ok(false);
                }
                let old_json = old.and_then(|o| serde_json::to_value(o).ok());
                let cond = condition_json(
                    SATISFIED_CONDITION,
                    if c.status { "True" } else { "False" },
                    c.reason,
                    &c.message,
                    old_json.as_ref(),
                );
                let ingress: Vec<Value> =
                    ips.iter().map(|ip| json!({"ip": ip.to_string()})).collect();
                if ingress.is_empty() {
                    json!({"conditions": [cond]})
                } else {
                    json!({"loadBalancer": {"ingress": ingress}, "conditions": [cond]})
                }
            }
        };
        if let ServicePlan::Assign { ips, condition: c } = want {
            tracing::info!(service = %format!("{namespace}/{name}"), ips = ?ips, reason = c.reason, "LB IPAM: Service status");
        } else {
            tracing::info!(service = %format!("{namespace}/{name}"), "LB IPAM: Service no longer served; its addresses are released");
        }
        apply_service_status(
            self.services_api.clone().into_client(),
            FIELD_MANAGER,
            svc,
            status,
        )
        .await
        .map(|()| true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(body: ApplyBody) -> Value {
        serde_json::to_value(body).unwrap()
    }

    #[test]
    fn golden_the_status_applies_of_a_service_and_a_pool() {
        let status = json!({"loadBalancer": {"ingress": [{"ip": "10.0.10.1"}]}});
        assert_eq!(
            wire(service_status_body("shop", "web", status)),
            json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "web", "namespace": "shop"},
                "status": {"loadBalancer": {"ingress": [{"ip": "10.0.10.1"}]}},
            })
        );
        let conditions = vec![json!({"type": CONFLICT_CONDITION, "status": "False"})];
        assert_eq!(
            wire(pool_status_body("cilium.io/v2alpha1", "blue", conditions)),
            json!({
                "apiVersion": "cilium.io/v2alpha1", "kind": "CiliumLoadBalancerIPPool",
                "metadata": {"name": "blue"},
                "status": {"conditions": [{"type": CONFLICT_CONDITION, "status": "False"}]},
            })
        );
    }

    #[test]
    fn an_invalid_pool_says_which_pool_and_field() {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cilium.io/v2", "kind": "CiliumLoadBalancerIPPool",
            "metadata": {"name": "blue"},
            "spec": {"blocks": [{"cidr": "10.0.10.0/33"}]},
        }))
        .unwrap();
        // The message the pool's condition shows, pinned.
        assert_eq!(
            parse_pool(&obj).unwrap_err(),
            "CiliumLoadBalancerIPPool \"blue\": spec.blocks[0].cidr: \"10.0.10.0/33\" is not a CIDR \
             (expected <address>/<prefix length>, e.g. 10.0.0.0/16 or fd00::/104)"
        );
        let good: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cilium.io/v2", "kind": "CiliumLoadBalancerIPPool",
            "metadata": {"name": "blue"},
            "spec": {"blocks": [{"cidr": "10.0.10.0/24"}]},
        }))
        .unwrap();
        assert!(parse_pool(&good).is_ok());
    }
}
