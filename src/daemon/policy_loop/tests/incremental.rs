//! The kept sets against a compile from scratch: over random sequences of Pod
//! and Namespace events (a fixed seed each), the loop's incremental compile
//! (`compile_node_with`, the changes noted as `PolicyLoop::feed` notes them)
//! equals `compile_node` after every event.

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::runtime::watcher::Event;
use serde_json::{Value, json};

use super::*;
use crate::policy::fixtures::cnp;

/// xorshift64: a fixed sequence per seed, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a>(&mut self, of: &[&'a str]) -> &'a str {
        of[self.below(of.len())]
    }
}

const NAMESPACES: [&str; 3] = ["a", "b", "c"];
const PODS: usize = 24;

/// A random Pod `i` (its namespace fixed by `i`): labels, an address (two
/// pods may share one), named ports or none.
fn random_pod(rng: &mut Rng, i: usize) -> PodView {
    let mut labels = serde_json::Map::new();
    for (key, values) in [("app", ["web", "db", "api"]), ("tier", ["x", "y", "z"])] {
        if rng.below(4) != 0 {
            labels.insert(key.into(), json!(values[rng.below(3)]));
        }
    }
    let ip = format!("10.0.0.{}", rng.below(PODS + 4) + 1);
    let mut ports: Vec<Value> = Vec::new();
    for name in ["http", "dns"] {
        if rng.below(2) == 0 {
            ports.push(json!({"name": name, "containerPort": 80 + rng.below(3)}));
        }
    }
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"namespace": NAMESPACES[i % 3], "name": format!("p{i}"), "labels": labels},
        "spec": {"containers": [{"name": "c", "ports": ports}]},
        "status": {"podIPs": [{"ip": ip}]},
    }))
    .expect("a test pod");
    PodView::from_k8s(pod)
}

fn any_pod(rng: &mut Rng) -> PodView {
    let i = rng.below(PODS);
    random_pod(rng, i)
}

fn random_namespace(rng: &mut Rng) -> NamespaceView {
    let team = rng.pick(&["red", "blue"]);
    let ns: Namespace = serde_json::from_value(json!({
        "metadata": {"name": rng.pick(&NAMESPACES), "labels": {"team": team}},
    }))
    .expect("a test namespace");
    NamespaceView::from_k8s(ns)
}

/// Policies with every kind of pod set: own namespace, matching namespaces,
/// both, named ports of either direction; and a ClusterNetworkPolicy.
fn policies() -> Vec<PolicyView> {
    let specs = [
        json!({"podSelector": {"matchLabels": {"app": "web"}},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "api"}}}]},
                           {"from": [{"namespaceSelector": {"matchLabels": {"team": "red"}}}],
                            "ports": [{"port": "http"}]}]}),
        json!({"podSelector": {},
               "policyTypes": ["Egress"],
               "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"team": "blue"}},
                                   "podSelector": {"matchExpressions": [
                                       {"key": "tier", "operator": "In", "values": ["x", "y"]}]}}],
                           "ports": [{"port": "dns"}]},
                          {"to": [{"podSelector": {"matchExpressions": [
                              {"key": "app", "operator": "DoesNotExist"}]}}]}]}),
    ];
    specs
        .into_iter()
        .enumerate()
        .map(|(i, spec)| {
            view::policy(
                &serde_json::from_value(json!({
                    "metadata": {"namespace": "a", "name": format!("np{i}")}, "spec": spec,
                }))
                .expect("a test policy"),
            )
        })
        .collect()
}

fn watched(rng: &mut Rng) -> Watched {
    let mut w = Watched {
        nodes: Some(Vec::new()),
        ..Watched::default()
    };
    for item in [Event::Init, Event::InitDone] {
        w.namespaces.apply(item);
    }
    w.pods.apply(Event::Init);
    for i in 0..PODS / 2 {
        w.pods.apply(Event::InitApply(random_pod(rng, i)));
    }
    w.note_pod(&Some(Ok(Event::InitDone)));
    w.pods.apply(Event::InitDone);
    w.policies.apply(Event::Init);
    for p in policies() {
        w.policies.apply(Event::InitApply(p));
    }
    w.policies.apply(Event::InitDone);
    let subject = json!({"namespaces": {"matchLabels": {"team": "red"}}});
    let spec = json!({"tier": "Admin", "priority": 5, "subject": subject,
                      "ingress": [{"action": "Deny", "from": [{"pods": {
                          "namespaceSelector": {}, "podSelector": {"matchLabels": {"tier": "z"}}}}]}]});
    w.cluster_policies.apply(Event::Init);
    w.cluster_policies
        .apply(Event::InitApply(cnp("deny-z", spec)));
    w.cluster_policies.apply(Event::InitDone);
    w.cluster_kind = ClusterKind::Off;
    w
}

/// One random event, fed as the loop feeds it.
fn random_event(rng: &mut Rng, w: &mut Watched) {
    let item = match rng.below(20) {
        0..=12 => Event::Apply(any_pod(rng)),
        13..=16 => {
            let i = rng.below(PODS);
            let key = format!("{}/p{i}", NAMESPACES[i % 3]);
            match w.pods.get(&key) {
                Some(p) => Event::Delete(p.clone()),
                None => Event::Apply(any_pod(rng)),
            }
        }
        17..=18 => {
            w.changes.all();
            w.namespaces.apply(Event::Apply(random_namespace(rng)));
            return;
        }
        _ => {
            // A relist: every pod there is, some of them new.
            let pods: Vec<PodView> = w.pods.objects().cloned().collect();
            w.pods.apply(Event::Init);
            for p in pods {
                w.pods.apply(Event::InitApply(p));
            }
            Event::InitApply(any_pod(rng))
        }
    };
    let relist = matches!(item, Event::InitApply(_));
    let item = Some(Ok(item));
    w.note_pod(&item);
    let _ = w.pods.take(item, "Pod");
    if relist {
        w.note_pod(&Some(Ok(Event::InitDone)));
        w.pods.apply(Event::InitDone);
    }
}

fn node() -> NodeSide {
    let links = (0..6).map(|i| {
        let key = format!("{}/p{i}", NAMESPACES[i % 3]);
        let link = LocalLink {
            uid: None,
            link: format!("veth{i}"),
        };
        (key, link)
    });
    NodeSide {
        links: links.collect(),
        addresses: vec!["192.168.0.1".parse().expect("an address")],
    }
}

#[test]
fn the_incremental_compile_equals_a_compile_from_scratch_after_every_event() {
    let node = node();
    for seed in 1..=8u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut w = watched(&mut rng);
        let mut sets = SetCache::default();
        for step in 0..300 {
            let changes = std::mem::take(&mut w.changes);
            let kept = compile_node_with(&w, &node, Enforcement::Default, &mut sets, changes);
            let fresh = compile_node(&w, &node, Enforcement::Default);
            assert_eq!(kept, fresh, "seed {seed}, step {step}");
            random_event(&mut rng, &mut w);
        }
    }
}
