//! The loop with in-memory links and a recording daemon: a changed annotation
//! changes the TBF, a bad one is posted once and keeps the shaping, a removed
//! one removes it; links whose ADD has not finished, other UIDs and failures.

pub(super) mod fake;
mod kernel;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use kube::runtime::watcher::Event;

use super::plan::{IfbSeen, Observed, Step};
use super::*;
use crate::datapath::TbfReading;
use fake::written;

/// The daemon's side: the links, the Events posted and the last report.
#[derive(Default, Clone)]
struct Recorded {
    links: Arc<Mutex<BTreeMap<String, LocalLink>>>,
    events: Arc<Mutex<Vec<(String, NodeEvent)>>>,
    reports: Arc<Mutex<Vec<(usize, usize)>>>,
}

impl Node for Recorded {
    async fn links(&self) -> Option<BTreeMap<String, LocalLink>> {
        Some(self.links.lock().unwrap().clone())
    }

    async fn post(&self, pod: PodName, _uid: Option<String>, event: NodeEvent) {
        self.events.lock().unwrap().push((pod.to_string(), event));
    }

    async fn report(&self, shaped: usize, invalid: usize) {
        self.reports.lock().unwrap().push((shaped, invalid));
    }
}

/// One write: the link and its steps.
type Write = (String, Vec<Step>);

/// Host links in memory (absent: no link or its ADD not finished); a link in
/// `failing` fails its writes.
#[derive(Default, Clone)]
struct Links {
    seen: Arc<Mutex<BTreeMap<String, Observed>>>,
    failing: Arc<Mutex<Vec<String>>>,
    writes: Arc<Mutex<Vec<Write>>>,
}

impl Shaper for Links {
    fn observe(&mut self, link: &str) -> Result<Option<Observed>, ShapeError> {
        Ok(self.seen.lock().unwrap().get(link).cloned())
    }

    fn write(&mut self, link: &str, steps: &[Step]) -> Result<(), ShapeError> {
        if self.failing.lock().unwrap().iter().any(|l| l == link) {
            return Err(ShapeError::NoIfbName(link.into()));
        }
        self.writes
            .lock()
            .unwrap()
            .push((link.into(), steps.to_vec()));
        let mut seen = self.seen.lock().unwrap();
        let now = written(&seen[link], steps);
        seen.insert(link.into(), now);
        Ok(())
    }
}

fn pod(name: &str, uid: &str, ingress: Option<&str>, egress: Option<&str>) -> PodView {
    PodView {
        namespace: "default".into(),
        name: name.into(),
        uid: Some(uid.into()),
        ingress: ingress.map(str::to_string),
        egress: egress.map(str::to_string),
        ips: Vec::new(),
    }
}

struct Harness {
    bw: BandwidthLoop<Recorded, Links>,
    node: Recorded,
    links: Links,
}

fn harness(pods: Vec<PodView>) -> Harness {
    let (node, links) = (Recorded::default(), Links::default());
    let mut bw = BandwidthLoop {
        node: node.clone(),
        pods: Mirror::default(),
        shaper: Some(links.clone()),
        make_shaper: || Ok(Links::default()),
        posted: BTreeSet::new(),
    };
    assert!(!bw.ready());
    bw.feed(Input::Pod(Box::new(Some(Ok(Event::Init)))))
        .unwrap();
    for p in pods {
        bw.feed(Input::Pod(Box::new(Some(Ok(Event::InitApply(p))))))
            .unwrap();
    }
    bw.feed(Input::Pod(Box::new(Some(Ok(Event::InitDone)))))
        .unwrap();
    assert!(bw.ready());
    Harness { bw, node, links }
}

impl Harness {
    /// A local pod with host link `link`, wired, nothing shaped.
    fn local(&self, name: &str, uid: &str, link: &str) {
        self.node.links.lock().unwrap().insert(
            format!("default/{name}"),
            LocalLink {
                uid: Some(uid.into()),
                link: link.into(),
            },
        );
        self.links
            .seen
            .lock()
            .unwrap()
            .insert(link.into(), Observed::default());
    }

    async fn pass(&mut self) -> Result<(), NotShaped> {
        let plan = self.bw.plan().await.expect("a plan");
        self.bw.apply(plan).await
    }

    fn update(&mut self, p: PodView) {
        assert!(
            self.bw
                .feed(Input::Pod(Box::new(Some(Ok(Event::Apply(p))))))
                .unwrap()
        );
    }

    fn seen(&self, link: &str) -> Observed {
        self.links.seen.lock().unwrap()[link].clone()
    }

    fn events(&self) -> Vec<(String, NodeEvent)> {
        self.node.events.lock().unwrap().clone()
    }

    fn last_report(&self) -> (usize, usize) {
        *self.node.reports.lock().unwrap().last().unwrap()
    }
}

/// The TBF reading of `rate_bits` with the runtimes' burst.
fn tbf(rate_bits: u64) -> Option<TbfReading> {
    let p = super::plan::tbf(&crate::cni::bandwidth::Shape {
        rate_bits,
        burst_bits: annotations::RUNTIME_BURST_BITS,
    });
    Some(TbfReading {
        rate_bytes: p.rate_bytes,
        limit_bytes: p.limit_bytes,
    })
}

fn shaped(ingress_bits: u64, egress_bits: u64) -> Observed {
    Observed {
        to_pod: tbf(ingress_bits),
        ingress_qdisc: true,
        redirect: true,
        ifb: Some(IfbSeen {
            ready: true,
            tbf: tbf(egress_bits),
        }),
    }
}

#[tokio::test]
async fn a_change_changes_the_tbf_a_bad_value_is_posted_once_and_a_removal_removes() {
    let mut h = harness(vec![pod("web", "u1", Some("10M"), Some("1M"))]);
    h.local("web", "u1", "lxcaaaaaaaaaaaa");
    h.pass().await.unwrap();
    assert_eq!(h.seen("lxcaaaaaaaaaaaa"), shaped(10_000_000, 1_000_000));
    assert_eq!(h.last_report(), (1, 0));
    // Nothing changed: nothing written.
    let writes = h.links.writes.lock().unwrap().len();
    h.pass().await.unwrap();
    assert_eq!(h.links.writes.lock().unwrap().len(), writes);

    // The annotation changed: the TBFs follow.
    h.update(pod("web", "u1", Some("20M"), Some("500k")));
    h.pass().await.unwrap();
    assert_eq!(h.seen("lxcaaaaaaaaaaaa"), shaped(20_000_000, 500_000));

    // A bad egress value: that direction kept, the other follows; one Event.
    h.update(pod("web", "u1", Some("30M"), Some("0")));
    h.pass().await.unwrap();
    h.pass().await.unwrap();
    assert_eq!(h.seen("lxcaaaaaaaaaaaa"), shaped(30_000_000, 500_000));
    let events = h.events();
    assert_eq!(events.len(), 1, "{events:?}");
    let (on, e) = &events[0];
    assert_eq!(on, "default/web");
    assert!(e.warning);
    assert_eq!(e.reason, REASON_INVALID);
    assert!(
        e.note.contains("kubernetes.io/egress-bandwidth: \"0\""),
        "{}",
        e.note
    );
    assert!(e.note.contains("from 1k"), "{}", e.note);
    assert_eq!(h.last_report(), (1, 0));
    // Another bad value: another Event.
    h.update(pod("web", "u1", Some("30M"), Some("ten")));
    h.pass().await.unwrap();
    h.pass().await.unwrap();
    assert_eq!(h.events().len(), 2);
    assert!(h.events()[1].1.note.contains("\"ten\" is not a quantity"));
    assert_ne!(h.events()[0].1.about, h.events()[1].1.about);

    // Both removed: nothing shaped, the IFB gone.
    h.update(pod("web", "u1", None, None));
    h.pass().await.unwrap();
    assert_eq!(h.seen("lxcaaaaaaaaaaaa"), Observed::default());
    assert_eq!(h.last_report(), (0, 0));
    // Bad again after a good value: posted again.
    h.update(pod("web", "u1", None, Some("0")));
    h.pass().await.unwrap();
    assert_eq!(h.events().len(), 3);
    assert_eq!(h.seen("lxcaaaaaaaaaaaa"), Observed::default());
}

#[tokio::test]
async fn only_local_wired_pods_of_the_same_uid_are_shaped() {
    let mut h = harness(vec![
        pod("here", "u1", Some("10M"), None),
        pod("elsewhere", "u2", Some("10M"), None),
        pod("replaced", "u3-new", Some("10M"), None),
        pod("adding", "u4", Some("10M"), None),
    ]);
    h.local("here", "u1", "lxc111111111111");
    h.local("replaced", "u3-old", "lxc333333333333");
    // "adding": in the ledger, its link not there (or its ADD not finished).
    h.node.links.lock().unwrap().insert(
        "default/adding".into(),
        LocalLink {
            uid: Some("u4".into()),
            link: "lxc444444444444".into(),
        },
    );
    h.pass().await.unwrap();
    assert_eq!(h.seen("lxc111111111111").to_pod, tbf(10_000_000));
    assert_eq!(h.seen("lxc333333333333"), Observed::default());
    let writes = h.links.writes.lock().unwrap().clone();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(h.last_report(), (1, 0));
    // The ADD finished: the next pass (a node event, a resync) shapes it.
    assert!(h.bw.feed(Input::NodeEvent).unwrap());
    h.links
        .seen
        .lock()
        .unwrap()
        .insert("lxc444444444444".into(), Observed::default());
    h.pass().await.unwrap();
    assert_eq!(h.seen("lxc444444444444").to_pod, tbf(10_000_000));
    assert_eq!(h.last_report(), (2, 0));
}

#[tokio::test]
async fn a_failed_write_fails_the_pass_and_the_others_are_shaped() {
    let mut h = harness(vec![
        pod("a", "ua", Some("10M"), None),
        pod("b", "ub", None, Some("2M")),
    ]);
    h.local("a", "ua", "lxcaaaaaaaaaaaa");
    h.local("b", "ub", "lxcbbbbbbbbbbbb");
    h.links
        .failing
        .lock()
        .unwrap()
        .push("lxcaaaaaaaaaaaa".into());
    let e = h.pass().await.unwrap_err();
    assert_eq!(e.0, 1);
    assert_eq!(h.seen("lxcbbbbbbbbbbbb").ifb.unwrap().tbf, tbf(2_000_000));
    assert_eq!(h.last_report(), (1, 0));
    h.links.failing.lock().unwrap().clear();
    h.pass().await.unwrap();
    assert_eq!(h.seen("lxcaaaaaaaaaaaa").to_pod, tbf(10_000_000));
    assert_eq!(h.last_report(), (2, 0));
}

#[tokio::test]
async fn a_bad_value_on_a_new_pod_is_posted_and_counted_once() {
    let mut h = harness(vec![pod("p", "u", Some("1Pi"), Some("-1M"))]);
    h.local("p", "u", "lxcpppppppppppp");
    h.pass().await.unwrap();
    h.pass().await.unwrap();
    assert_eq!(h.events().len(), 2);
    let counted: usize = h.node.reports.lock().unwrap().iter().map(|r| r.1).sum();
    assert_eq!(counted, 2);
    assert_eq!(h.seen("lxcpppppppppppp"), Observed::default());
}

#[test]
fn the_view_reads_the_two_annotations() {
    let mut p = Pod::default();
    p.metadata.namespace = Some("ns".into());
    p.metadata.name = Some("n".into());
    p.metadata.uid = Some("u".into());
    p.metadata.annotations = Some(
        [
            (INGRESS.to_string(), "10M".to_string()),
            ("other".to_string(), "x".to_string()),
        ]
        .into(),
    );
    p.status = Some(k8s_openapi::api::core::v1::PodStatus {
        pod_ips: Some(vec![k8s_openapi::api::core::v1::PodIP {
            ip: "10.0.0.5".into(),
        }]),
        ..Default::default()
    });
    let v = PodView::from_k8s(p);
    let mut want = pod("n", "u", Some("10M"), None).with_namespace("ns");
    want.ips = vec!["10.0.0.5".into()];
    assert_eq!(v, want);
    assert_eq!(v.key(), "ns/n");
}

impl PodView {
    fn with_namespace(mut self, ns: &str) -> PodView {
        self.namespace = ns.into();
        self
    }
}
