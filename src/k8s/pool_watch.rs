//! The CiliumPodIPPools as pool definitions, and the one watch that says when to
//! read the pool kinds again: the agent's multi-pool backend watches the pools
//! and the CiliumNodeConfigs (`node::kube_pools`), the operator's multi-pool
//! allocator the pools (`operator::multi_pool`).
//!
//! The kinds are few and are read whole; the watch only says when
//! ([`PoolWatch::changed`]): after any change of an object of a watched kind, and
//! after a (re)list once it is complete (an object of a list in progress is no
//! change, so a relist after the watch was down is read once, whole). A kind whose
//! CRD goes away (or stops serving the version in use) is resolved again by the
//! owner's resolver, which waits until a version podnet understands is served;
//! what was read last stays in force meanwhile. An interrupted watch resumes by
//! itself (kube's default backoff).

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::watcher::{self, Event};

use super::discovery::{resource_gone, watch_all};
use super::mirror::WatchEnded;
use super::objects::{ListError, list_valid};
use crate::ipam::pooldef::PoolDef;
use crate::resources::{CiliumPodIPPool, POD_IP_POOL_KIND};

/// Every valid CiliumPodIPPool of `resource` (a version the API server serves;
/// an object decodes as the version it was read at); an invalid one is logged
/// and left out.
pub async fn list_pools(
    client: &kube::Client,
    resource: &ApiResource,
) -> Result<Vec<PoolDef>, ListError> {
    list_valid::<CiliumPodIPPool, _, _>(client, resource, POD_IP_POOL_KIND, |p| {
        PoolDef::try_from(p)
    })
    .await
}

/// The resources a [`PoolWatch`] watches, at the versions discovery resolved.
pub trait Watched: Send + 'static {
    fn resources(&self) -> Vec<&ApiResource>;
}

/// One kind.
impl Watched for ApiResource {
    fn resources(&self) -> Vec<&ApiResource> {
        vec![self]
    }
}

/// Resolves the watched kinds again, waiting until each CRD serves a version
/// podnet understands.
pub type Resolver<S> = Box<dyn Fn(kube::Client) -> BoxFuture<'static, S> + Send + Sync>;

type Events = BoxStream<'static, Result<Event<DynamicObject>, watcher::Error>>;

/// One watch over the kinds of `S`.
pub struct PoolWatch<S> {
    client: kube::Client,
    watched: S,
    events: Events,
    /// What the log calls the watch ("pool", "CiliumPodIPPool").
    what: &'static str,
    resolve: Resolver<S>,
    /// Told when the watch was interrupted or a kind went away: what was read
    /// last may be out of date.
    lost: Box<dyn Fn() + Send + Sync>,
}

impl<S: Watched> PoolWatch<S> {
    /// Watches `watched`; `resolve` is called when a kind goes away.
    pub fn new(client: kube::Client, watched: S, what: &'static str, resolve: Resolver<S>) -> Self {
        let events = watch_each(&client, &watched);
        PoolWatch {
            client,
            watched,
            events,
            what,
            resolve,
            lost: Box::new(|| {}),
        }
    }

    /// `lost` is called when the watch is interrupted or a kind goes away (the
    /// agent shows it in its backend health).
    pub fn on_lost(self, lost: impl Fn() + Send + Sync + 'static) -> Self {
        PoolWatch {
            lost: Box::new(lost),
            ..self
        }
    }

    /// Waits for the next change (a complete (re)list is one); `Err` when the
    /// watch ended (it does not while the API server can be retried). A kind that
    /// went away is resolved again in here, and the watch goes on with it.
    pub async fn changed(&mut self) -> Result<(), WatchEnded> {
        loop {
            let Some(item) = self.events.next().await else {
                return Err(WatchEnded {
                    kind: self.what.into(),
                });
            };
            match signal(item) {
                Signal::Nothing => {}
                Signal::Changed => return Ok(()),
                Signal::Gone => {
                    (self.lost)();
                    tracing::warn!(versions = ?self.versions(), "a {} CRD is not served any more; what was read last stays in force until it is", self.what);
                    self.watched = (self.resolve)(self.client.clone()).await;
                    self.events = watch_each(&self.client, &self.watched);
                }
                Signal::Interrupted(e) => {
                    (self.lost)();
                    tracing::warn!(error = %e, "{} watch interrupted; it resumes", self.what);
                }
            }
        }
    }

    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The resources as resolved last.
    pub fn watched(&self) -> &S {
        &self.watched
    }

    fn versions(&self) -> Vec<&str> {
        self.watched
            .resources()
            .into_iter()
            .map(|r| r.api_version.as_str())
            .collect()
    }
}

/// What one item of the watch means to its owner.
#[derive(Debug)]
enum Signal {
    /// An object of a list in progress, or the list's start: the change is its end.
    Nothing,
    /// Read the kinds again.
    Changed,
    /// A kind is not served any more (its CRD, or the version in use, went).
    Gone,
    /// The watch was interrupted; it resumes.
    Interrupted(watcher::Error),
}

fn signal(item: Result<Event<DynamicObject>, watcher::Error>) -> Signal {
    match item {
        Ok(Event::Init | Event::InitApply(_)) => Signal::Nothing,
        Ok(Event::InitDone | Event::Apply(_) | Event::Delete(_)) => Signal::Changed,
        Err(e) if resource_gone(&e) => Signal::Gone,
        Err(e) => Signal::Interrupted(e),
    }
}

/// One stream of the events of every resource of `watched`.
fn watch_each<S: Watched>(client: &kube::Client, watched: &S) -> Events {
    futures::stream::select_all(
        watched
            .resources()
            .into_iter()
            .map(|r| watch_all(client, r)),
    )
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;
    use kube::core::Status;

    fn pool() -> DynamicObject {
        DynamicObject {
            types: None,
            metadata: ObjectMeta {
                name: Some("blue".into()),
                ..Default::default()
            },
            data: serde_json::Value::Null,
        }
    }

    fn api_error(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(Status {
            code,
            reason: reason.into(),
            ..Default::default()
        }))
    }

    #[test]
    fn a_list_is_one_change_at_its_end_and_every_later_event_is_one() {
        let changes: Vec<bool> = [
            Event::Init,
            Event::InitApply(pool()),
            Event::InitDone,
            Event::Apply(pool()),
            Event::Delete(pool()),
        ]
        .into_iter()
        .map(|e| matches!(signal(Ok(e)), Signal::Changed))
        .collect();
        assert_eq!(changes, [false, false, true, true, true]);
        assert!(matches!(signal(Ok(Event::Init)), Signal::Nothing));
    }

    #[test]
    fn a_kind_not_served_any_more_is_gone_and_other_errors_interrupt() {
        let gone = watcher::Error::WatchStartFailed(api_error(404, "NotFound"));
        assert!(matches!(signal(Err(gone)), Signal::Gone));
        let gone = watcher::Error::InitialListFailed(api_error(404, "NotFound"));
        assert!(matches!(signal(Err(gone)), Signal::Gone));
        let refused = watcher::Error::InitialListFailed(api_error(403, "Forbidden"));
        assert!(matches!(signal(Err(refused)), Signal::Interrupted(_)));
        assert!(matches!(
            signal(Err(watcher::Error::NoResourceVersion)),
            Signal::Interrupted(_)
        ));
    }
}
