use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;
use serde_json::json;

use super::*;

fn pod(name: &str, uid: &str, ip: &str) -> PodView {
    PodView::from_k8s(
        serde_json::from_value(json!({
            "metadata": {"namespace": "a", "name": name, "uid": uid, "labels": {"app": "web"}},
            "status": {"podIPs": [{"ip": ip}]},
        }))
        .unwrap(),
    )
}

fn listed<K: Keyed>(objects: Vec<K>) -> Mirror<K> {
    let mut m = Mirror::default();
    m.apply(Event::Init);
    for o in objects {
        m.apply(Event::InitApply(o));
    }
    m.apply(Event::InitDone);
    m
}

fn deny_all() -> PolicyView {
    view::policy(
        &serde_json::from_value(json!({
            "metadata": {"namespace": "a", "name": "deny"},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
        }))
        .unwrap(),
    )
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
        nodes: None,
        ..Watched::default()
    };
    assert!(
        !watched.synced(),
        "nothing is written before every watch listed"
    );
    watched.policies = listed(vec![deny_all()]);
    assert!(!watched.synced(), "nor before the CiliumNodes are");
    assert!(!watched.take_nodes(None));
    let n1 = crate::resources::NodeResource::new("n1");
    let list: crate::node::cluster_nodes::ClusterNodeList = Arc::new(vec![Arc::new(n1)]);
    assert!(watched.take_nodes(Some(&list)), "listed: a change");
    assert!(watched.synced());
    assert!(
        !watched.take_nodes(Some(&list)),
        "the same addresses: no change"
    );
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

/// Pod `name` as the API server sends it: everything a Pod has, the compile's
/// fields among them.
fn whole_pod(name: &str, uid: &str, ip: &str, app: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"namespace": "a", "name": name, "uid": uid, "labels": {"app": app},
                     "annotations": {"note": "x".repeat(4096)},
                     "managedFields": [{"manager": "kubelet", "operation": "Update",
                                        "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}]},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox",
                 "env": [{"name": "E", "value": "v"}],
                 "ports": [{"name": "http", "containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }))
    .unwrap()
}

#[tokio::test]
async fn the_pod_watch_keeps_views_an_update_replaces_one_and_a_relist_drops_the_stale() {
    let events = vec![
        Ok(Event::Init),
        Ok(Event::InitApply(whole_pod(
            "web",
            "u-1",
            "10.0.0.10",
            "web",
        ))),
        Ok(Event::InitApply(whole_pod(
            "gone",
            "u-9",
            "10.0.0.99",
            "web",
        ))),
        Ok(Event::InitDone),
        Ok(Event::Apply(whole_pod("web", "u-1", "10.0.0.20", "db"))),
        Ok(Event::Init),
        Ok(Event::InitApply(whole_pod("web", "u-1", "10.0.0.20", "db"))),
        Ok(Event::InitDone),
    ];
    let mut stream = projected(futures::stream::iter(events), PodView::from_k8s).boxed();
    let mut pods = Mirror::<PodView>::default();
    for _ in 0..4 {
        pods.feed(stream.next().await, "Pod").unwrap();
    }
    let web = pods.get("a/web").expect("web's view");
    assert_eq!(
        web,
        &PodView {
            namespace: "a".into(),
            name: "web".into(),
            uid: Some("u-1".into()),
            labels: [("app".to_string(), "web".to_string())].into(),
            ips: vec!["10.0.0.10".parse().unwrap()],
            ports: vec![crate::policy::view::NamedPort {
                name: "http".into(),
                protocol: crate::policy::view::Protocol::Tcp,
                number: 8080,
            }],
        },
        "every field the compile reads, nothing else"
    );
    assert!(pods.feed(stream.next().await, "Pod").unwrap());
    let web = pods.get("a/web").expect("web's view");
    assert_eq!(web.ips, ["10.0.0.20".parse::<IpAddr>().unwrap()]);
    assert_eq!(web.labels.get("app").map(String::as_str), Some("db"));
    pods.feed(stream.next().await, "Pod").unwrap();
    pods.feed(stream.next().await, "Pod").unwrap();
    assert!(
        pods.get("a/gone").is_some(),
        "a half-read list deletes nothing"
    );
    pods.feed(stream.next().await, "Pod").unwrap();
    assert_eq!(
        pods.objects().map(Keyed::key).collect::<Vec<_>>(),
        ["a/web"],
        "the relist dropped the pod deleted meanwhile"
    );
    // The compile reads the views: web, relabelled, is still the local pod.
    let watched = Watched {
        pods,
        namespaces: listed(Vec::new()),
        policies: listed(vec![deny_all()]),
        nodes: Some(Vec::new()),
        ..Watched::default()
    };
    let node = NodeSide {
        links: [("a/web".to_string(), link(Some("u-1"), "lxcweb"))].into(),
        addresses: Vec::new(),
    };
    let c = compile_node(&watched, &node, Enforcement::Default);
    assert_eq!(c.state.chains.len(), 1);
    assert!(c.explanations.pod("a/web", &[]).is_some());
}

#[test]
fn cluster_policies_are_waited_for_only_while_discovery_has_not_answered_or_the_list_is_not_read() {
    let mut watched = Watched {
        pods: listed(Vec::new()),
        namespaces: listed(Vec::new()),
        policies: listed(Vec::new()),
        nodes: Some(Vec::new()),
        ..Watched::default()
    };
    assert!(watched.synced(), "off: NetworkPolicy alone");
    assert_eq!(cluster::status_line(&watched), None);
    watched.cluster_kind = ClusterKind::Unresolved;
    assert!(!watched.synced(), "not asked yet: nothing written");
    watched.cluster_kind = ClusterKind::NotInstalled;
    assert!(
        watched.synced(),
        "no CRD: NetworkPolicy is enforced meanwhile"
    );
    let line = cluster::status_line(&watched).unwrap();
    assert!(
        line.contains("clusternetworkpolicies.policy.networking.k8s.io not installed"),
        "{line}"
    );
    watched.cluster_kind = ClusterKind::Served("v1beta1".into());
    assert!(!watched.synced(), "served: its list first");
    let policy = crate::policy::view::cluster_policy(
        "p",
        &json!({"tier": "Admin", "priority": 1, "subject": {"namespaces": {}}}),
    );
    watched.cluster_policies = listed(vec![policy]);
    assert!(watched.synced());
    assert_eq!(
        cluster::status_line(&watched).as_deref(),
        Some("1 ClusterNetworkPolicies (policy.networking.k8s.io/v1beta1)")
    );
}
