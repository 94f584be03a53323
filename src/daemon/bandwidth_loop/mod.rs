//! The agent's pod bandwidth loop (`--enable-bandwidth-manager`, the
//! Kubernetes backend), on the controller kit: the runtime passes a Pod's
//! `kubernetes.io/ingress-bandwidth` and `egress-bandwidth` annotations to the
//! CNI ADD only (`plugin::shaping` shapes then), so this loop follows a
//! change on a running pod. It watches this node's Pods (field selector
//! `spec.nodeName`, each a `k8s::mirror::Mirror` of its [`PodView`]: the two
//! annotations, and the pod's IPs, whose arrival says its ADD finished), the
//! daemon's node events, and a resync every 30 s. A pass
//! takes each local pod's host link from the daemon's ledger (as the policy
//! loop does: `policy_loop::node_side_of`, same UID), reads the annotations as
//! kubelet and containerd do ([`annotations`]), reads the link's qdiscs and
//! writes only the difference ([`plan`], through a [`kernel::Shaper`]).
//!
//! A value kubelet would refuse leaves that direction's shaping as it is and
//! is posted once as a Warning Event `BandwidthInvalid` on the Pod (through
//! the daemon's `NodePodsApi`, as the refused-address Events are), naming the
//! annotation, the value and the accepted range; again only if the value
//! changes to another bad one (or the agent restarts). Metrics:
//! `bandwidth_pods_shaped` and `bandwidth_invalid_annotations_total`.
//!
//! API load: one watch of the node's Pods; an Event per bad value.

pub mod annotations;
pub mod kernel;
pub mod plan;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};

use super::Daemon;
use super::policy_loop::{LocalLink, node_side_of};
use crate::controller::{self, Backoff, Controller, Resync, Timing, WatchItem, ending};
use crate::ipam::leaks::PodName;
use crate::k8s::connect::connect_retrying;
use crate::k8s::mirror::{Keyed, Mirror, WatchEnded, projected};
use crate::k8s::node_pods::NodeEvent;
use crate::store::now_ms;
use annotations::{EGRESS, INGRESS, Invalid, Wanted, wanted};
use kernel::{Kernel, ShapeError, Shaper};

/// The Event's reason.
pub const REASON_INVALID: &str = "BandwidthInvalid";

/// A pass soon after a change, every 30 s without one (a link whose ADD
/// finished, a qdisc someone deleted), and after a failed pass again.
const TIMING: Timing = Timing {
    debounce: Duration::from_millis(200),
    min_interval: Duration::ZERO,
    resync: Some(Resync {
        every: Duration::from_secs(30),
        at_once: true,
        after_each_pass: false,
    }),
    backoff: Backoff {
        first: Duration::from_secs(1),
        max: Duration::from_secs(30),
    },
    changes_wait_for_backoff: false,
};

/// A Pod of this node as the loop sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    /// `kubernetes.io/ingress-bandwidth`, when there.
    pub ingress: Option<String>,
    /// `kubernetes.io/egress-bandwidth`, when there.
    pub egress: Option<String>,
    /// `status.podIPs`: kubelet writes them once the pod's ADD has finished,
    /// so their change wakes a pass that finds the new pod's link wired.
    pub ips: Vec<String>,
}

impl PodView {
    pub fn from_k8s(pod: Pod) -> PodView {
        let ips = pod
            .status
            .and_then(|s| s.pod_ips)
            .unwrap_or_default()
            .into_iter()
            .map(|ip| ip.ip)
            .collect();
        let meta = pod.metadata;
        let mut annotations = meta.annotations.unwrap_or_default();
        PodView {
            namespace: meta.namespace.unwrap_or_default(),
            name: meta.name.unwrap_or_default(),
            uid: meta.uid,
            ingress: annotations.remove(INGRESS),
            egress: annotations.remove(EGRESS),
            ips,
        }
    }
}

impl Keyed for PodView {
    fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// What the loop needs of the daemon: the local pods' host links, Events on
/// Pods, and the metrics (the daemon's, or a test's).
pub trait Node {
    /// Local pods' host links by `namespace/name` (None: unreadable).
    fn links(&self) -> impl Future<Output = Option<BTreeMap<String, LocalLink>>>;
    /// Posts `event` on the Pod.
    fn post(&self, pod: PodName, uid: Option<String>, event: NodeEvent)
    -> impl Future<Output = ()>;
    /// One pass's counts: pods shaped, bad values newly seen.
    fn report(&self, shaped: usize, invalid: usize) -> impl Future<Output = ()>;
}

/// One input of the loop.
pub enum Input {
    Pod(Box<WatchItem<PodView>>),
    /// The daemon's node events (a local pod's link may have changed).
    NodeEvent,
}

/// One local pod's wish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPlan {
    pub pod: PodName,
    pub uid: Option<String>,
    pub link: String,
    pub ingress: Wanted,
    pub egress: Wanted,
}

impl PodPlan {
    fn invalid(&self) -> impl Iterator<Item = &Invalid> {
        [&self.ingress, &self.egress]
            .into_iter()
            .filter_map(|w| match w {
                Wanted::Invalid(i) => Some(i),
                _ => None,
            })
    }
}

/// The local pods of `pods` (host link from `links`, same UID when both say
/// one), each with its wish.
pub fn plan_pods(pods: &Mirror<PodView>, links: &BTreeMap<String, LocalLink>) -> Vec<PodPlan> {
    links
        .iter()
        .filter_map(|(key, local)| {
            let pod = pods.get(key)?;
            if let (Some(a), Some(b)) = (&local.uid, &pod.uid)
                && a != b
            {
                return None;
            }
            Some(PodPlan {
                pod: PodName {
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                },
                uid: pod.uid.clone(),
                link: local.link.clone(),
                ingress: wanted(INGRESS, pod.ingress.as_deref()),
                egress: wanted(EGRESS, pod.egress.as_deref()),
            })
        })
        .collect()
}

/// The loop's state.
pub struct BandwidthLoop<N: Node, S: Shaper + Send + 'static> {
    pub node: N,
    pub pods: Mirror<PodView>,
    /// None while a pass has it on a blocking thread, or if that thread died.
    pub shaper: Option<S>,
    pub make_shaper: fn() -> Result<S, ShapeError>,
    /// The bad values posted as Events (pod, UID, annotation, value) and still
    /// there.
    pub posted: BTreeSet<(String, Option<String>, &'static str, String)>,
}

/// Pods whose shaping could not be read or written (each logged).
#[derive(Debug, thiserror::Error)]
#[error("{0} pod(s) not shaped as their annotations ask")]
pub struct NotShaped(pub usize);

impl<N: Node, S: Shaper + Send + 'static> Controller for BandwidthLoop<N, S> {
    type Input = Input;
    type Plan = Vec<PodPlan>;
    type Error = NotShaped;
    const WHAT: &'static str = "a pod bandwidth pass";

    fn feed(&mut self, input: Input) -> Result<bool, WatchEnded> {
        match input {
            Input::Pod(e) => self.pods.feed(*e, "Pod"),
            Input::NodeEvent => Ok(true),
        }
    }

    fn ready(&self) -> bool {
        self.pods.listed()
    }

    async fn plan(&mut self) -> Option<Vec<PodPlan>> {
        let links = self.node.links().await?;
        Some(plan_pods(&self.pods, &links))
    }

    async fn apply(&mut self, plans: Vec<PodPlan>) -> Result<(), NotShaped> {
        let shaper = match self.shaper.take() {
            Some(s) => s,
            None => (self.make_shaper)().map_err(|e| {
                tracing::warn!(error = %e, "pod bandwidth: no netlink socket");
                NotShaped(plans.len())
            })?,
        };
        let wishes: Vec<_> = plans
            .iter()
            .map(|p| (p.link.clone(), p.ingress.clone(), p.egress.clone()))
            .collect();
        let done = tokio::task::spawn_blocking(move || shape_all(shaper, wishes)).await;
        let (shaped, failed) = match done {
            Ok((shaper, shaped, failed)) => {
                self.shaper = Some(shaper);
                (shaped, failed)
            }
            Err(e) => {
                tracing::error!(error = %e, "pod bandwidth: the pass did not finish");
                (0, plans.len())
            }
        };
        let new = self.post_invalid(&plans).await;
        self.node.report(shaped, new).await;
        match failed {
            0 => Ok(()),
            n => Err(NotShaped(n)),
        }
    }
}

/// Reads and writes every pod's shaping; returns the shaper, how many pods are
/// shaped and how many failed (each logged).
fn shape_all<S: Shaper>(mut shaper: S, pods: Vec<(String, Wanted, Wanted)>) -> (S, usize, usize) {
    let (mut shaped, mut failed) = (0, 0);
    for (link, ingress, egress) in pods {
        let outcome = shaper.observe(&link).and_then(|seen| {
            let Some(seen) = seen else {
                return Ok(false);
            };
            let steps = plan::plan(&ingress, &egress, &seen);
            if !steps.is_empty() {
                shaper.write(&link, &steps)?;
                tracing::info!(link = %link, steps = ?steps, "pod bandwidth: shaping changed to match the annotations");
            }
            Ok(plan::shaped_after(&seen, &steps))
        });
        match outcome {
            Ok(s) => shaped += usize::from(s),
            Err(e) => {
                tracing::warn!(error = %e, "pod bandwidth: not shaped");
                failed += 1;
            }
        }
    }
    (shaper, shaped, failed)
}

impl<N: Node, S: Shaper + Send + 'static> BandwidthLoop<N, S> {
    /// Posts an Event for each bad value not posted yet; forgets the posted
    /// values no longer there. Returns how many were posted.
    async fn post_invalid(&mut self, plans: &[PodPlan]) -> usize {
        let mut now = BTreeSet::new();
        let mut new = 0;
        for p in plans {
            for i in p.invalid() {
                let key = (
                    p.pod.to_string(),
                    p.uid.clone(),
                    i.annotation,
                    i.value.clone(),
                );
                if !self.posted.contains(&key) {
                    tracing::warn!(pod = %p.pod, "{i}");
                    let event = NodeEvent {
                        warning: true,
                        reason: REASON_INVALID,
                        action: "ShapeBandwidth",
                        about: format!("{} {}", i.annotation, i.value),
                        note: i.to_string(),
                    };
                    self.node.post(p.pod.clone(), p.uid.clone(), event).await;
                    new += 1;
                }
                now.insert(key);
            }
        }
        self.posted = now;
        new
    }
}

/// The daemon as the loop's [`Node`].
struct DaemonNode(Arc<Daemon>);

impl Node for DaemonNode {
    async fn links(&self) -> Option<BTreeMap<String, LocalLink>> {
        let side = self.0.with_state(|s| Ok(node_side_of(s, now_ms()))).await;
        match side {
            Ok(side) => Some(side.links),
            Err(e) => {
                tracing::warn!(error = %e.message, "pod bandwidth: the node's links cannot be read");
                None
            }
        }
    }

    async fn post(&self, pod: PodName, uid: Option<String>, event: NodeEvent) {
        let Some(api) = self.0.pod_events.clone() else {
            return;
        };
        if let Err(e) = api.post_on_pod(&pod, uid.as_deref(), &event).await {
            tracing::warn!(error = %e, "pod bandwidth: could not post the Event");
        }
    }

    async fn report(&self, shaped: usize, invalid: usize) {
        self.0.set_bandwidth_shaped(shaped as u64);
        let _ = self
            .0
            .with_state(move |s| {
                let m = s.metrics();
                m.bandwidth_pods_shaped.set(shaped as i64);
                m.bandwidth_invalid_annotations.inc_by(invalid as u64);
                Ok(())
            })
            .await;
    }
}

/// The loop's inputs: the node's Pods and the daemon's node events.
fn inputs(
    client: &kube::Client,
    daemon: &Daemon,
    node: &str,
) -> impl Stream<Item = Input> + Unpin + use<> {
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let pods = watcher(Api::<Pod>::all(client.clone()), config).default_backoff();
    let pods = projected(pods, PodView::from_k8s);
    let node_events = stream::unfold(daemon.node_events.subscribe(), |mut rx| async move {
        rx.changed().await.ok().map(|()| (Input::NodeEvent, rx))
    });
    stream::select_all([
        ending(pods).map(|e| Input::Pod(Box::new(e))).boxed(),
        node_events.boxed(),
    ])
}

/// Runs the loop until its watch ends (it does not while the API server can
/// be retried).
pub async fn run(daemon: Arc<Daemon>, kubeconfig: Option<PathBuf>, node: String) {
    let client =
        connect_retrying(kubeconfig.as_ref(), "pod bandwidth", Duration::from_secs(2)).await;
    let events = inputs(&client, &daemon, &node);
    let mut bw = BandwidthLoop {
        node: DaemonNode(daemon),
        pods: Mirror::default(),
        shaper: None,
        make_shaper: || {
            crate::datapath::NetlinkSocket::new()
                .map(Kernel)
                .map_err(|source| ShapeError::Kernel {
                    link: "netlink".into(),
                    source,
                })
        },
        posted: BTreeSet::new(),
    };
    tracing::info!("pod bandwidth: following the Pods' bandwidth annotations");
    let ended = controller::run(&mut bw, events, TIMING).await;
    tracing::error!(error = %ended, "pod bandwidth: the loop stopped; pods keep their shaping as last set");
}

#[cfg(test)]
mod tests;
