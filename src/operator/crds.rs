//! Registering the CRDs where none exist: at start every replica creates each of
//! podnet's CRDs (Cilium 1.20's CiliumNode, CiliumPodIPPool, CiliumNodeConfig, CiliumLoadBalancerIPPool) that
//! the API server does not have yet, unless `--skip-crd-creation` is set. An
//! existing CRD is never replaced: Cilium's own (or a newer one) wins.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};

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
