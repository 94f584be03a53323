//! The `ciliumnodes` resource API discovery found, shared by the source and the
//! sink: resolved by the source's start, or (when the start served from the
//! journal) by whichever half needs it first, and kept from then on.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use kube::api::ApiResource;

/// The resource, once resolved (None until then).
#[derive(Debug, Clone, Default)]
pub(super) struct NodesResource(Arc<Mutex<Option<ApiResource>>>);

impl NodesResource {
    /// Keeps `resource` (what the start resolved at this attempt).
    pub(super) fn keep(&self, resource: ApiResource) {
        *self.lock() = Some(resource);
    }

    /// The resource kept, or else the one `resolve` finds, kept from then on.
    pub(super) async fn or_resolve<E, F>(
        &self,
        resolve: impl FnOnce() -> F,
    ) -> Result<ApiResource, E>
    where
        F: Future<Output = Result<ApiResource, E>>,
    {
        let known = self.lock().clone();
        if let Some(resource) = known {
            return Ok(resource);
        }
        let resource = resolve().await?;
        self.keep(resource.clone());
        Ok(resource)
    }

    fn lock(&self) -> MutexGuard<'_, Option<ApiResource>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::k8s::discovery::CiliumKind;
    use futures::executor::block_on;
    use std::cell::Cell;

    #[test]
    fn the_resource_is_resolved_once_then_kept() {
        let shared = NodesResource::default();
        let other_half = shared.clone();
        let calls = Cell::new(0);
        let resolve = || async {
            calls.set(calls.get() + 1);
            Ok::<_, ()>(CiliumKind::Node.at("v2"))
        };
        let first = block_on(shared.or_resolve(resolve)).unwrap();
        let second = block_on(other_half.or_resolve(resolve)).unwrap();
        assert_eq!(first.api_version, "cilium.io/v2");
        assert_eq!(second.api_version, first.api_version);
        assert_eq!(
            calls.get(),
            1,
            "the other half reuses what the first resolved"
        );
    }

    #[test]
    fn a_failed_resolve_keeps_nothing_and_a_kept_resource_needs_none() {
        let shared = NodesResource::default();
        let failed = block_on(shared.or_resolve(|| async { Err::<ApiResource, _>("down") }));
        assert_eq!(failed.unwrap_err(), "down");
        shared.keep(CiliumKind::Node.at("v2"));
        let kept = block_on(shared.or_resolve(|| async { Err::<ApiResource, _>("unused") }));
        assert_eq!(kept.unwrap().api_version, "cilium.io/v2");
    }
}
