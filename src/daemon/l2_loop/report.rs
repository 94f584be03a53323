//! What the L2 announcement loop shows: the [`Shared`] handles the daemon
//! reads for `podnet status`, `podnet explain` and the metrics, and the Events
//! it posts. A Service gets a Normal `L2Announced` Event from the node that
//! takes one of its addresses over, naming the node and interfaces, and a
//! Warning `L2NotAnnounced` one from that node when the address is in none of
//! its interfaces' subnets. A policy's problem gets one Warning `L2PolicyInvalid`
//! Event, posted by one node only (the first live one in the problem's own hash
//! order), not one per node.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::Recorder;

use super::interfaces::Placed;
use crate::api::models::{L2Announcement, L2Candidate, L2Explanation, L2Status};
use crate::daemon::metrics::L2Figures;
use crate::datapath::l2_responder::{InterfaceReport, Responder, ResponderError};
use crate::k8s::mirror::Mirror;
use crate::l2announce::heartbeat::HeartbeatCounters;
use crate::l2announce::liveness::LiveSet;
use crate::l2announce::plan::{Plan, Standing, rank};
use crate::l2announce::views::{AddressKind, Problem, ServiceView};

/// What the loop shares with the daemon.
pub struct Shared {
    pub responder: Arc<Responder>,
    pub heartbeats: Arc<HeartbeatCounters>,
    status: Mutex<L2Status>,
    plan: RwLock<Option<Arc<Plan>>>,
    /// Addresses this node began to answer for.
    taken: AtomicU64,
}

impl Shared {
    pub fn new(port: u16) -> Shared {
        Shared {
            responder: Arc::new(Responder::new()),
            heartbeats: Arc::new(HeartbeatCounters::default()),
            status: Mutex::new(L2Status {
                heartbeat_port: port,
                waiting: "the API server".into(),
                ..L2Status::default()
            }),
            plan: RwLock::new(None),
            taken: AtomicU64::new(0),
        }
    }

    /// Says what the loop waits for before its first pass.
    pub fn waiting(&self, what: &str) {
        if let Ok(mut s) = self.status.lock() {
            s.waiting = what.into();
        }
    }

    pub fn status(&self) -> Option<L2Status> {
        self.status.lock().ok().map(|s| s.clone())
    }

    /// The figures of a metrics scrape.
    pub fn metrics(&self) -> L2Figures {
        let status = self.status().unwrap_or_default();
        let report = self.responder.report();
        let sum = |count: fn(&InterfaceReport) -> u64| report.interfaces.values().map(count).sum();
        L2Figures {
            answered: status.announced.len() as u64,
            takeovers: self.taken.load(Ordering::Relaxed),
            nodes_live: status.live_nodes.len() as u64,
            problems: status.problems.len() as u64,
            sent: vec![
                ("arp-reply", sum(|i| i.arp_replies)),
                (
                    "neighbour-advertisement",
                    sum(|i| i.neighbour_advertisements),
                ),
                ("gratuitous", sum(|i| i.gratuitous)),
            ],
            heartbeats: heartbeat_figures(&self.heartbeats),
        }
    }

    pub(super) fn count_taken(&self, n: usize) {
        self.taken.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Publishes a pass: the plan for explain, the status.
    pub(super) fn publish(
        &self,
        plan: &Arc<Plan>,
        node: &str,
        placed: &BTreeMap<IpAddr, Placed>,
        live: &LiveSet,
        local: &BTreeMap<IpAddr, Problem>,
        nodes: usize,
    ) {
        if let Ok(mut p) = self.plan.write() {
            *p = Some(plan.clone());
        }
        let announced = plan
            .answered_by(node)
            .filter_map(|(a, c)| match placed.get(&a.address) {
                Some(Placed::On(links)) => Some(L2Announcement {
                    address: a.address.to_string(),
                    services: a.services.clone(),
                    interfaces: links.clone(),
                    policy: c.policy.clone().unwrap_or_default(),
                }),
                _ => None,
            })
            .collect();
        if let Ok(mut s) = self.status.lock() {
            s.settled = live.settled;
            s.waiting = match live.settled {
                true => String::new(),
                false => {
                    "the heartbeats: their start grace (2 s), or they stopped (the log says why)"
                        .into()
                }
            };
            s.live_nodes = live.live.iter().cloned().collect();
            s.nodes = nodes as u64;
            s.announced = announced;
            s.cluster_addresses = plan.addresses.len() as u64;
            let problems = plan.problems.iter().chain(local.values());
            s.problems = problems.map(Problem::to_string).collect();
        }
    }

    /// Adds the responder's failures (an interface it could not answer on) to
    /// the status's problems.
    pub(super) fn note_responder_errors(&self, errors: &[ResponderError]) {
        if let Ok(mut s) = self.status.lock() {
            s.problems.extend(
                errors
                    .iter()
                    .map(|e| format!("answering on {}: {e}", e.interface())),
            );
        }
    }

    /// The explanation of `address`, when it is announced.
    pub fn explain(&self, address: IpAddr) -> Option<L2Explanation> {
        let plan = self.plan.read().ok()?.clone()?;
        let a = plan.addresses.get(&address)?;
        let candidates = a
            .candidates
            .iter()
            .map(|c| L2Candidate {
                node: c.node.clone(),
                standing: standing_word(&c.standing).into(),
                why: standing_sentence(&c.standing, &a.candidates),
                policy: c.policy.clone(),
            })
            .collect();
        Some(L2Explanation {
            address: address.to_string(),
            kind: match a.kind {
                AddressKind::LoadBalancer => "load-balancer".into(),
                AddressKind::External => "external".into(),
            },
            services: a.services.clone(),
            answerer: a.answerer().map(|c| c.node.clone()),
            candidates,
        })
    }
}

/// The heartbeats' counters, by event.
fn heartbeat_figures(c: &HeartbeatCounters) -> Vec<(&'static str, u64)> {
    let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
    vec![
        ("sent", n(&c.sent)),
        ("received", n(&c.received)),
        ("refused", n(&c.refused)),
        ("send-error", n(&c.send_errors)),
    ]
}

/// Adds what L2 announcements say of `address` to `answer` (nothing when it
/// is not announced).
pub fn add_explanation(
    answer: &mut crate::api::models::ExplainResponse,
    l2: &Shared,
    address: IpAddr,
) {
    let Some(e) = l2.explain(address) else {
        return;
    };
    let who = match &e.answerer {
        Some(node) => format!("{node} answers ARP/NDP for it"),
        None => "no node answers ARP/NDP for it".into(),
    };
    let others: Vec<String> = e
        .candidates
        .iter()
        .filter(|c| c.standing != "answers")
        .map(|c| format!("{}: {}", c.node, c.why))
        .collect();
    let sep = if answer.summary.is_empty() { "" } else { ". " };
    answer.summary.push_str(&format!(
        "{sep}L2 announcement of {address} (Service {}): {who}; {}",
        e.services.join(", "),
        others.join("; ")
    ));
    answer.l2 = Some(e);
}

fn standing_word(s: &Standing) -> &'static str {
    match s {
        Standing::Answers => "answers",
        Standing::Standby => "standby",
        Standing::NotSelected => "not-selected",
        Standing::NotLive => "not-live",
        Standing::NoReadyEndpoint(_) => "no-ready-endpoint",
    }
}

fn standing_sentence(s: &Standing, all: &[crate::l2announce::plan::Candidate]) -> String {
    let answerer = all.iter().find(|c| c.standing == Standing::Answers);
    match s {
        Standing::Answers => {
            "answers ARP/NDP for it (the first live node allowed, in the address's order)".into()
        }
        Standing::Standby => match answerer {
            Some(a) => format!("stands by: {} comes first in the address's order", a.node),
            None => "stands by".into(),
        },
        Standing::NotSelected => {
            "no CiliumL2AnnouncementPolicy that selects the Service selects this node".into()
        }
        Standing::NotLive => "not heard from lately (no heartbeat within 1.5 s)".into(),
        Standing::NoReadyEndpoint(svc) => {
            format!("externalTrafficPolicy Local, and no ready endpoint of {svc} runs on it")
        }
    }
}

/// This node's own problems, by address: an address it should answer for
/// that is in no subnet of its interfaces, or that no interface matches.
pub(super) fn placement_problems(
    plan: &Plan,
    placed: &BTreeMap<IpAddr, Placed>,
    node: &str,
) -> BTreeMap<IpAddr, Problem> {
    let mut problems = BTreeMap::new();
    for (address, p) in placed {
        let services = plan
            .addresses
            .get(address)
            .map(|a| a.services.join(", "))
            .unwrap_or_default();
        let why = match p {
            Placed::On(_) => continue,
            Placed::NoLink => format!(
                "address {address}: no interface of node {node} matches the policy's interfaces (or carries its InternalIP): not announced"
            ),
            Placed::OutsideSubnets(links) => format!(
                "address {address} is in no subnet of node {node}'s interfaces {}: no neighbour asks for it there; not announced",
                links.join(", ")
            ),
        };
        let problem = Problem {
            object: format!("Service {services}"),
            field: "status.loadBalancer.ingress".into(),
            why,
        };
        problems.insert(*address, problem);
    }
    problems
}

/// What one pass posts Events about.
pub(super) struct Posting<'a> {
    pub plan: &'a Plan,
    pub node: &'a str,
    /// The addresses this node began to answer for.
    pub taken: &'a [IpAddr],
    pub placed: &'a BTreeMap<IpAddr, Placed>,
    pub services: &'a Mirror<ServiceView>,
    /// This node's own problems, by address.
    pub local: &'a BTreeMap<IpAddr, Problem>,
    pub live: &'a BTreeSet<String>,
}

/// Posts the pass's Events: each address taken, and each problem not posted
/// before (`posted`: the problems posted and still there). A failed post is
/// logged at debug, never retried: Events are best effort.
pub(super) async fn post_events(
    recorder: &Recorder,
    p: Posting<'_>,
    posted: &mut BTreeSet<Problem>,
) {
    for address in p.taken {
        let (Some(a), Some(Placed::On(links))) =
            (p.plan.addresses.get(address), p.placed.get(address))
        else {
            continue;
        };
        let note = format!(
            "node {} answers ARP/NDP for {address} on {}",
            p.node,
            links.join(", ")
        );
        for svc in &a.services {
            if let Some(s) = p.services.get(svc) {
                post(
                    recorder,
                    service_ref(s),
                    false,
                    "L2Announced",
                    &note,
                    &address.to_string(),
                )
                .await;
            }
        }
    }
    let now: BTreeSet<&Problem> = p.plan.problems.iter().chain(p.local.values()).collect();
    posted.retain(|q| now.contains(q));
    for q in &p.plan.problems {
        let name = q.object.trim_start_matches("CiliumL2AnnouncementPolicy ");
        if q.object.starts_with("CiliumL2AnnouncementPolicy ")
            && reports(q, p.node, p.live)
            && posted.insert(q.clone())
        {
            post(
                recorder,
                policy_ref(name),
                true,
                "L2PolicyInvalid",
                &q.to_string(),
                &q.field,
            )
            .await;
        }
    }
    for (address, q) in p.local {
        let first = p
            .plan
            .addresses
            .get(address)
            .and_then(|a| a.services.first());
        let Some(s) = first.and_then(|k| p.services.get(k)) else {
            continue;
        };
        if posted.insert(q.clone()) {
            post(
                recorder,
                service_ref(s),
                true,
                "L2NotAnnounced",
                &q.why,
                &address.to_string(),
            )
            .await;
        }
    }
}

fn service_ref(s: &ServiceView) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Service".into()),
        namespace: Some(s.namespace.clone()),
        name: Some(s.name.clone()),
        uid: s.uid.clone(),
        ..ObjectReference::default()
    }
}

fn policy_ref(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(crate::resources::L2_POLICY_V2ALPHA1.into()),
        kind: Some(crate::resources::L2_POLICY_KIND.into()),
        name: Some(name.into()),
        ..ObjectReference::default()
    }
}

async fn post(
    recorder: &Recorder,
    target: ObjectReference,
    warning: bool,
    reason: &str,
    note: &str,
    about: &str,
) {
    let event = crate::k8s::events::event(warning, reason, note, "Announce", about);
    if let Err(e) = recorder.publish(&event, &target).await {
        tracing::debug!(error = %e, reason, "L2 announcements: an Event was not posted");
    }
}

/// Whether this node posts the Event of `problem`: the first live node in the
/// problem's own order.
fn reports(problem: &Problem, node: &str, live: &BTreeSet<String>) -> bool {
    live.iter()
        .min_by_key(|n| rank(n, problem))
        .is_some_and(|n| n == node)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::models::ExplainResponse;
    use crate::l2announce::plan::{Inputs, plan};
    use crate::l2announce::views::{NodeView, PolicyView};
    use crate::resources::CiliumL2AnnouncementPolicy;

    /// The plan of one LoadBalancer address, 10.251.0.200 of `default/web`,
    /// over node-1 and node-2, the policy selecting node-1 only.
    fn one_address() -> Plan {
        let p: CiliumL2AnnouncementPolicy = serde_json::from_value(json!({
            "metadata": {"name": "lan"},
            "spec": {"loadBalancerIPs": true,
                     "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": "node-1"}}}
        }))
        .unwrap();
        let policy = PolicyView::from_resource(&p);
        let service = ServiceView {
            namespace: "default".into(),
            name: "web".into(),
            uid: None,
            labels: Default::default(),
            load_balancer: vec!["10.251.0.200".parse().unwrap()],
            external: Vec::new(),
            local_traffic: false,
        };
        let node = |n: &str| NodeView {
            name: n.into(),
            labels: [("kubernetes.io/hostname".to_string(), n.to_string())].into(),
            internal_ips: Vec::new(),
        };
        let (n1, n2) = (node("node-1"), node("node-2"));
        plan(&Inputs {
            policies: &[&policy],
            services: &[&service],
            nodes: &[&n1, &n2],
            ready: &BTreeMap::new(),
            live: &["node-1".to_string(), "node-2".to_string()].into(),
        })
    }

    #[test]
    fn explain_names_the_node_that_answers_and_why_each_other_does_not() {
        let shared = Shared::new(4247);
        let planned = Arc::new(one_address());
        let live = LiveSet {
            live: ["node-1".to_string(), "node-2".to_string()].into(),
            settled: true,
        };
        let address: IpAddr = "10.251.0.200".parse().unwrap();
        let placed = BTreeMap::from([(address, Placed::On(vec!["eth0".into()]))]);
        shared.publish(&planned, "node-1", &placed, &live, &BTreeMap::new(), 2);
        let mut answer = ExplainResponse::default();
        add_explanation(&mut answer, &shared, address);
        let e = answer.l2.clone().expect("an explanation");
        assert_eq!(e.answerer.as_deref(), Some("node-1"));
        assert_eq!(e.services, ["default/web"]);
        let node2 = e.candidates.iter().find(|c| c.node == "node-2").unwrap();
        assert_eq!(node2.standing, "not-selected");
        assert!(
            answer.summary.contains("node-1 answers ARP/NDP for it"),
            "{}",
            answer.summary
        );
        assert!(
            answer
                .summary
                .contains("node-2: no CiliumL2AnnouncementPolicy"),
            "{}",
            answer.summary
        );
        let status = shared.status().unwrap();
        assert!(status.settled && status.waiting.is_empty());
        assert_eq!(status.announced.len(), 1);
        assert_eq!(status.announced[0].interfaces, ["eth0"]);
        // An address not announced: nothing added.
        let mut other = ExplainResponse::default();
        add_explanation(&mut other, &shared, "10.251.0.9".parse().unwrap());
        assert!(other.l2.is_none() && other.summary.is_empty());
    }

    #[test]
    fn an_address_this_node_cannot_place_is_a_problem_naming_its_service_and_the_links() {
        let planned = one_address();
        let address: IpAddr = "10.251.0.200".parse().unwrap();
        let placed = BTreeMap::from([(
            address,
            Placed::OutsideSubnets(vec!["eth0 (192.168.1.0/24)".into()]),
        )]);
        let problems = placement_problems(&planned, &placed, "node-1");
        let p = &problems[&address];
        assert_eq!(p.object, "Service default/web");
        assert!(
            p.why.contains(
                "10.251.0.200 is in no subnet of node node-1's interfaces eth0 (192.168.1.0/24)"
            ),
            "{}",
            p.why
        );
        let none = BTreeMap::from([(address, Placed::NoLink)]);
        assert!(
            placement_problems(&planned, &none, "node-1")[&address]
                .why
                .contains("no interface of node node-1 matches")
        );
        let fine = BTreeMap::from([(address, Placed::On(vec!["eth0".into()]))]);
        assert!(placement_problems(&planned, &fine, "node-1").is_empty());
    }

    #[test]
    fn one_live_node_reports_a_policy_problem_the_same_on_every_node() {
        let problem = Problem {
            object: "CiliumL2AnnouncementPolicy p".into(),
            field: "spec".into(),
            why: "x".into(),
        };
        let live: BTreeSet<String> = ["node-1", "node-2", "node-3"].map(String::from).into();
        let reporters: Vec<&String> = live
            .iter()
            .filter(|n| reports(&problem, n, &live))
            .collect();
        assert_eq!(reporters.len(), 1);
    }
}
