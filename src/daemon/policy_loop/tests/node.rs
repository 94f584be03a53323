use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;
use serde_json::json;

use super::*;

fn pod(name: &str, uid: &str, ip: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"namespace": "a", "name": name, "uid": uid, "labels": {"app": "web"}},
        "status": {"podIPs": [{"ip": ip}]},
    }))
    .unwrap()
}

fn listed<K: kube::Resource>(objects: Vec<K>) -> Mirror<K> {
    let mut m = Mirror::default();
    m.apply(Event::Init);
    for o in objects {
        m.apply(Event::InitApply(o));
    }
    m.apply(Event::InitDone);
    m
}

fn deny_all() -> NetworkPolicy {
    serde_json::from_value(json!({
        "metadata": {"namespace": "a", "name": "deny"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
    }))
    .unwrap()
}

fn link(uid: Option<&str>, link: &str) -> LocalLink {
    LocalLink {
        uid: uid.map(str::to_string),
        link: link.into(),
    }
}

#[test]
fn a_local_pod_is_enforced_on_its_link_and_a_pod_of_its_name_with_another_uid_is_not_local() {
    let mut watched = Watched {
        pods: listed(vec![
            pod("web", "u-1", "10.0.0.10"),
            pod("api", "u-2", "10.0.0.11"),
            pod("db", "u-3", "10.0.1.12"),
        ]),
        namespaces: listed(Vec::new()),
        policies: Mirror::default(),
    };
    assert!(
        !watched.synced(),
        "nothing is written before every watch listed"
    );
    watched.policies = listed(vec![deny_all()]);
    assert!(watched.synced());
    let node = NodeSide {
        links: [
            ("a/web".to_string(), link(Some("u-1"), "lxcweb")),
            ("a/api".to_string(), link(Some("u-old"), "lxcapi")),
        ]
        .into(),
        addresses: vec!["192.168.0.1".parse().unwrap()],
    };
    let c = compile_node(&watched, &node, Enforcement::Default);
    let links: Vec<&str> = c.state.chains.keys().map(|k| k.link.as_str()).collect();
    assert_eq!(
        links,
        ["lxcweb"],
        "db is remote; api's link is another pod's"
    );
    assert!(c.problems.is_empty());
}

#[test]
fn an_outage_is_logged_once_and_its_items_are_not_fed() {
    let mut o = Outage::default();
    let err = || Some(Err::<Event<Pod>, _>(watcher::Error::NoResourceVersion));
    assert!(o.take("Pod", err()).is_none());
    assert!(o.take("Namespace", err()).is_none());
    assert_eq!(o.0.len(), 2);
    assert!(o.take("Pod", Some(Ok(Event::<Pod>::Init))).is_some());
    assert!(
        o.take::<Pod>("Namespace", None).is_some(),
        "an ended watch is fed"
    );
    assert!(o.0.is_empty());
}
