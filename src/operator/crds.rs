//! Registering the CRDs where none exist: at start every replica creates each of
//! podnet's CRDs (Cilium 1.20's CiliumNode, CiliumPodIPPool, CiliumNodeConfig, CiliumLoadBalancerIPPool) that
//! the API server does not have yet, unless `--skip-crd-creation` is set. An
//! existing CRD is never replaced: Cilium's own (or a newer one) wins. While the
//! API server cannot be reached or answers 429 or 5xx, the start waits and tries
//! again ([`register_missing_waiting`]) instead of exiting: a replica that exits
//! is restarted by the kubelet with a growing back-off, and so could stay down for
//! minutes after the API server is back.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};

use crate::controller::Backoff;
use crate::resources::CRD_MANIFESTS;

/// Why a CRD was not registered.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    #[error("a built-in CRD does not parse: {0}")]
    BuiltIn(#[source] serde_yaml_ng::Error),
    #[error("registering CRD {name}: {source}")]
    Create {
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// The waits of [`register_missing_waiting`]: half a second, doubling up to 8 s.
const REGISTER_BACKOFF: Backoff = Backoff {
    first: Duration::from_millis(500),
    max: Duration::from_secs(8),
};

/// True for a failure that goes away by itself: the API server unreachable,
/// timing out, overloaded (429) or failing (5xx); not a refusal such as 403.
pub fn transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        kube::Error::BuildRequest(_)
        | kube::Error::SerdeError(_)
        | kube::Error::Discovery(_)
        | kube::Error::InferConfig(_) => false,
        _ => true,
    }
}

/// [`register_missing`], tried again with a back-off while it fails for a
/// [`transient`] reason (each new reason is logged once); a refusal or a CRD
/// that does not parse ends it with the error.
pub async fn register_missing_waiting(client: &kube::Client) -> Result<Vec<String>, CrdError> {
    let mut wait = None;
    let mut logged = String::new();
    loop {
        match register_missing(client).await {
            Err(CrdError::Create { name, source }) if transient(&source) => {
                let why = source.to_string();
                if why != logged {
                    tracing::warn!(crd = %name, error = %why, "the API server cannot be reached yet; trying again");
                    logged = why;
                }
            }
            done => return done,
        }
        let next = REGISTER_BACKOFF.next(wait);
        tokio::time::sleep(next).await;
        wait = Some(next);
    }
}

/// Creates the CRDs that are missing; returns the names it created.
pub async fn register_missing(client: &kube::Client) -> Result<Vec<String>, CrdError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut created = Vec::new();
    for manifest in CRD_MANIFESTS {
        let crd: CustomResourceDefinition =
            serde_yaml_ng::from_str(manifest).map_err(CrdError::BuiltIn)?;
        let name = crd.metadata.name.clone().unwrap_or_default();
        match api.create(&PostParams::default(), &crd).await {
            Ok(_) => {
                tracing::info!(crd = %name, "registered the CRD");
                created.push(name);
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                tracing::debug!(crd = %name, "the CRD exists already; left as it is");
            }
            Err(source) => return Err(CrdError::Create { name, source }),
        }
    }
    Ok(created)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("refused", "Reason")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn only_failures_that_pass_by_themselves_are_transient() {
        assert!(transient(&api_error(500)));
        assert!(transient(&api_error(503)));
        assert!(transient(&api_error(429)));
        assert!(!transient(&api_error(403)));
        assert!(!transient(&api_error(422)));
        assert!(!transient(&api_error(404)));
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(transient(&kube::Error::Service(Box::new(io))));
        let bad = serde_json::from_str::<u8>("x").expect_err("not JSON");
        assert!(!transient(&kube::Error::SerdeError(bad)));
    }
}
