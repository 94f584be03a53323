use serde_json::json;

use super::*;
use crate::policy::compile::{Cluster, compile_with};
use crate::policy::enforcement::Enforcement;
use crate::policy::fixtures::{ip, labels, local, pod, policy};
use crate::policy::state::State;
use crate::policy::view::PolicyView;

fn policies() -> Vec<PolicyView> {
    let from = |app: &str| json!({"from": [{"podSelector": {"matchLabels": {"app": app}}}]});
    vec![policy(
        "a",
        "np",
        json!({"podSelector": {"matchLabels": {"app": "web"}},
               "ingress": [from("api"), from("db"), from("cache")]}),
    )]
}

fn state(pods: &[&PodView], cache: &mut SetCache, policies: &[PolicyView]) -> State {
    let web = pods[0];
    let local = [crate::policy::Local {
        pod: web,
        link: "veth0",
    }];
    let cluster = Cluster {
        enforcement: Enforcement::Default,
        policies: &policies.iter().collect::<Vec<_>>(),
        cluster_policies: &[],
        pods,
        local: &local,
        namespaces: &[],
        node_addresses: &[],
        nodes: &[],
    };
    compile_with(cluster, cache).state
}

#[test]
fn a_pod_label_change_looks_at_that_pod_only_and_changes_only_the_sets_it_leaves_and_joins() {
    let web = local(pod("a", "web", &[("app", "web")], &["10.0.0.1"]), "veth0").view;
    let mut others: Vec<PodView> = (2..50)
        .map(|i| {
            pod(
                "a",
                &format!("p{i}"),
                &[("app", "db")],
                &[&format!("10.0.0.{i}")],
            )
            .view
        })
        .collect();
    let policies = policies();
    let mut cache = SetCache::default();
    let all = |others: &[PodView]| -> Vec<PodView> {
        std::iter::once(web.clone())
            .chain(others.iter().cloned())
            .collect()
    };
    let pods = all(&others);
    let before = state(&pods.iter().collect::<Vec<_>>(), &mut cache, &policies);

    others[0].labels = labels(&[("app", "api")]);
    let pods = all(&others);
    let by_key = |key: &str| {
        pods.iter()
            .find(|p| format!("{}/{}", p.namespace, p.name) == key)
    };
    let labels_of = |_: &str| -> &Labels {
        static NONE: Labels = Labels::new();
        &NONE
    };
    let refreshed = cache.refresh(
        Changes::Pods(["a/p2".to_string()].into()),
        by_key,
        labels_of,
    );
    assert_eq!(
        refreshed,
        Refreshed {
            pods: 1,
            sets_changed: 2
        },
        "one pod looked at; the db set lost it, the api set gained it"
    );
    let after = state(&pods.iter().collect::<Vec<_>>(), &mut cache, &policies);
    let diff = before.diff(&after);
    let moved = Element::Address(ip("10.0.0.2"));
    let changed: Vec<_> = diff
        .elements_added
        .values()
        .chain(diff.elements_removed.values())
        .collect();
    assert_eq!(changed.len(), 2, "{diff:?}");
    assert!(changed.iter().all(|e| *e == &BTreeSet::from([moved])));
    assert!(diff.chains_replaced.is_empty() && diff.chains_added.is_empty());
    let peer_sets = |s: &State| -> Vec<(String, Set)> {
        let peers = s.sets.iter().filter(|(name, _)| name.starts_with("peer"));
        peers.map(|(n, set)| (n.clone(), set.clone())).collect()
    };
    let (peers_before, peers_after) = (peer_sets(&before), peer_sets(&after));
    assert_eq!(peers_after.len(), 3, "{peers_after:?}");
    let shared = peers_after.iter().filter(|(name, set)| {
        let old = peers_before.iter().find(|(n, _)| n == name);
        old.is_some_and(|(_, old)| std::sync::Arc::ptr_eq(&old.elements, &set.elements))
    });
    assert_eq!(
        shared.count(),
        1,
        "the set the pod neither left nor joined (cache) is the last compile's own; the two it changed are new"
    );
    assert_eq!(
        after,
        state(
            &pods.iter().collect::<Vec<_>>(),
            &mut SetCache::default(),
            &policies
        )
    );
}

#[test]
fn an_address_two_pods_share_stays_until_both_are_gone_and_unused_sets_are_dropped() {
    let one = pod("a", "one", &[("app", "db")], &["10.0.0.9"]).view;
    let two = pod("a", "two", &[("app", "db")], &["10.0.0.9"]).view;
    let mut cache = SetCache::default();
    let selector =
        Selector::parse(&serde_json::from_value(json!({"matchLabels": {"app": "db"}})).unwrap())
            .unwrap();
    let namespaces = Namespaces::Own("a".into());
    let source = Source::Peer {
        namespaces: &namespaces,
        pods: &selector,
    };
    let none = |_: &str| -> &Labels {
        static NONE: Labels = Labels::new();
        &NONE
    };
    let set = cache.get("peer_x", source.clone(), &[&one, &two], none);
    assert_eq!(
        *set.elements,
        BTreeSet::from([Element::Address(ip("10.0.0.9"))])
    );
    cache.end_compile();
    let only_two = |key: &str| (key == "a/two").then_some(&two);
    cache.refresh(Changes::Pods(["a/one".to_string()].into()), only_two, none);
    let set = cache.get("peer_x", source.clone(), &[&two], none);
    assert_eq!(set.elements.len(), 1, "the other pod still has it");
    cache.end_compile();
    cache.refresh(Changes::Pods(["a/two".to_string()].into()), |_| None, none);
    assert!(cache.get("peer_x", source, &[], none).elements.is_empty());
    cache.end_compile();
    cache.end_compile();
    assert!(
        cache.kept.is_empty(),
        "a set no compile asked for is dropped"
    );
}
