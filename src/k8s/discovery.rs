//! Which version of each Cilium kind podnet uses, by API discovery. For each kind
//! podnet reads or writes, [`CiliumKind::understood`] lists the versions podnet
//! decodes, newest first; [`resolve`] asks the API server which versions serve the
//! kind (`GET /apis`, then `GET /apis/cilium.io/<version>` for each version of the
//! group: a group version lists only the kinds its CRDs serve there) and returns
//! the `ApiResource` of the newest one podnet understands, or a
//! [`DiscoveryError`] naming the CRD, what it serves and what podnet understands.
//! Cilium 1.20.2 serves `ciliumpodippools` at v2alpha1 only, podnet's own CRD at
//! v2 and v2alpha1: both work. [`resolve_waiting`] retries, with a backoff, until
//! the CRD appears (as Cilium's agent waits for its CRDs) and reports what it
//! waits for.

use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

use crate::resources::{L2_POLICY_KIND, LB_IP_POOL_KIND, NODE_CONFIG_KIND, POD_IP_POOL_KIND};

/// Cilium's API group.
pub const GROUP: &str = "cilium.io";
/// network-policy-api's API group (ClusterNetworkPolicy).
pub const POLICY_GROUP: &str = "policy.networking.k8s.io";
/// The first wait of [`resolve_waiting`]; it doubles up to [`RECHECK_MAX`].
const RECHECK_FIRST: Duration = Duration::from_secs(1);
const RECHECK_MAX: Duration = Duration::from_secs(8);

/// A Cilium kind podnet reads or writes through the API server (and the one
/// kind of another group: network-policy-api's ClusterNetworkPolicy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CiliumKind {
    /// `CiliumNode`: the node resource (agent and operator).
    Node,
    /// `CiliumPodIPPool`: multi-pool's pools (agent and operator).
    PodIpPool,
    /// `CiliumNodeConfig`: a node's default pool (agent, multi-pool).
    NodeConfig,
    /// `CiliumLoadBalancerIPPool`: LB IPAM's pools (operator).
    LbIpPool,
    /// `CiliumL2AnnouncementPolicy`: which nodes announce which Services (agent).
    L2Policy,
    /// `ClusterNetworkPolicy` of `policy.networking.k8s.io` (agent).
    ClusterNetworkPolicy,
}

impl CiliumKind {
    pub fn kind(self) -> &'static str {
        match self {
            CiliumKind::Node => "CiliumNode",
            CiliumKind::PodIpPool => POD_IP_POOL_KIND,
            CiliumKind::NodeConfig => NODE_CONFIG_KIND,
            CiliumKind::LbIpPool => LB_IP_POOL_KIND,
            CiliumKind::L2Policy => L2_POLICY_KIND,
            CiliumKind::ClusterNetworkPolicy => "ClusterNetworkPolicy",
        }
    }

    /// The kind's API group: [`GROUP`], but for ClusterNetworkPolicy's.
    pub fn group(self) -> &'static str {
        match self {
            CiliumKind::ClusterNetworkPolicy => POLICY_GROUP,
            _ => GROUP,
        }
    }

    pub fn plural(self) -> &'static str {
        match self {
            CiliumKind::Node => "ciliumnodes",
            CiliumKind::PodIpPool => "ciliumpodippools",
            CiliumKind::NodeConfig => "ciliumnodeconfigs",
            CiliumKind::LbIpPool => "ciliumloadbalancerippools",
            CiliumKind::L2Policy => "ciliuml2announcementpolicies",
            CiliumKind::ClusterNetworkPolicy => "clusternetworkpolicies",
        }
    }

    /// How to install the CRD.
    pub fn install(self) -> &'static str {
        match self {
            CiliumKind::ClusterNetworkPolicy => {
                "install network-policy-api's (`kubectl apply -f deploy/crds/clusternetworkpolicies.yaml`)"
            }
            _ => "install Cilium's CRDs or podnet's (`podnet crds | kubectl apply -f -`)",
        }
    }

    /// The CRD's name, `<plural>.<group>`.
    pub fn crd(self) -> String {
        format!("{}.{}", self.plural(), self.group())
    }

    /// The versions podnet decodes (`resources`, `ipam::pooldef`,
    /// `ipam::node_config`), newest (preferred) first.
    pub fn understood(self) -> &'static [&'static str] {
        match self {
            CiliumKind::Node => &["v2"],
            CiliumKind::PodIpPool | CiliumKind::NodeConfig | CiliumKind::LbIpPool => {
                &["v2", "v2alpha1"]
            }
            CiliumKind::L2Policy => &["v2alpha1"],
            // network-policy-api v0.3.0: the two versions have the same fields.
            CiliumKind::ClusterNetworkPolicy => &["v1beta1", "v1alpha2"],
        }
    }

    /// The resource at `version`.
    pub fn at(self, version: &str) -> ApiResource {
        let group = self.group();
        ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: format!("{group}/{version}"),
            kind: self.kind().into(),
            plural: self.plural().into(),
        }
    }
}

/// Why a kind cannot be used (yet).
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// No version of the group serves the kind: its CRD is not installed (or
    /// not established yet).
    #[error("CRD {crd} is not installed (podnet reads {kind} at {understood}): {install}")]
    NotInstalled {
        crd: String,
        kind: &'static str,
        understood: String,
        /// How to install it ([`CiliumKind::install`]).
        install: &'static str,
    },
    /// The CRD serves only versions podnet does not understand.
    #[error(
        "CRD {crd} serves {kind} at {served}, none of which podnet understands (it understands {understood}): install a CRD that serves one of them"
    )]
    VersionNotServed {
        crd: String,
        kind: &'static str,
        served: String,
        understood: String,
    },
    /// Asking the API server failed.
    #[error("API discovery ({path}): {source}")]
    Api {
        path: String,
        #[source]
        source: kube::Error,
    },
}

impl DiscoveryError {
    /// The CRD is missing or unusable (the API server answered): a start waits
    /// for it, it does not fail.
    pub fn is_missing_crd(&self) -> bool {
        !matches!(self, DiscoveryError::Api { .. })
    }

    /// What a start waiting on this error waits for, after "waiting for".
    pub fn awaited(&self) -> String {
        match self {
            DiscoveryError::NotInstalled {
                crd, understood, ..
            } => format!("CRD {crd} at {understood} (not installed)"),
            DiscoveryError::VersionNotServed {
                crd,
                served,
                understood,
                ..
            } => format!("CRD {crd} at {understood} (it serves {served})"),
            DiscoveryError::Api { path, source } => {
                format!("the API server's discovery ({path}: {source})")
            }
        }
    }
}

/// "v2 or v2alpha1".
fn either(versions: &[&str]) -> String {
    versions.join(" or ")
}

/// The newest version podnet understands among `served` (the versions that
/// serve `kind`), as the resource to use.
pub fn choose(kind: CiliumKind, served: &[String]) -> Result<ApiResource, DiscoveryError> {
    let understood = kind.understood();
    if let Some(v) = understood.iter().find(|v| served.iter().any(|s| s == *v)) {
        return Ok(kind.at(v));
    }
    if served.is_empty() {
        return Err(DiscoveryError::NotInstalled {
            crd: kind.crd(),
            kind: kind.kind(),
            understood: either(understood),
            install: kind.install(),
        });
    }
    Err(DiscoveryError::VersionNotServed {
        crd: kind.crd(),
        kind: kind.kind(),
        served: served.join(", "),
        understood: either(understood),
    })
}

/// The versions of the kind's group that serve `kind`, as the API server says now.
pub async fn served_versions(
    client: &kube::Client,
    kind: CiliumKind,
) -> Result<Vec<String>, DiscoveryError> {
    let groups = client
        .list_api_groups()
        .await
        .map_err(|source| DiscoveryError::Api {
            path: "/apis".into(),
            source,
        })?;
    let Some(group) = groups.groups.into_iter().find(|g| g.name == kind.group()) else {
        return Ok(Vec::new());
    };
    let mut served = Vec::new();
    for version in group.versions {
        match client
            .list_api_group_resources(&version.group_version)
            .await
        {
            Ok(list) if list.resources.iter().any(|r| r.name == kind.plural()) => {
                served.push(version.version)
            }
            Ok(_) => {}
            // The version went away between the two calls (a CRD was deleted).
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(source) => {
                return Err(DiscoveryError::Api {
                    path: format!("/apis/{}", version.group_version),
                    source,
                });
            }
        }
    }
    Ok(served)
}

/// The resource to use for `kind`: the newest version podnet understands that
/// the API server serves.
pub async fn resolve(
    client: &kube::Client,
    kind: CiliumKind,
) -> Result<ApiResource, DiscoveryError> {
    let resource = choose(kind, &served_versions(client, kind).await?)?;
    tracing::debug!(kind = kind.kind(), version = %resource.version, "resolved by API discovery");
    Ok(resource)
}

/// [`resolve`], again and again (every second, backing off to every
/// [`RECHECK_MAX`]) until it succeeds. `report` hears what is awaited while it
/// waits (logged once per change) and `None` once the kind resolved.
pub async fn resolve_waiting(
    client: &kube::Client,
    kind: CiliumKind,
    report: &(dyn Fn(Option<&DiscoveryError>) + Send + Sync),
) -> ApiResource {
    let mut wait = RECHECK_FIRST;
    let mut logged = String::new();
    loop {
        match resolve(client, kind).await {
            Ok(resource) => {
                if !logged.is_empty() {
                    tracing::info!(crd = %kind.crd(), version = %resource.version, "the CRD is served; going on");
                }
                report(None);
                return resource;
            }
            Err(e) => {
                let awaited = e.awaited();
                if awaited != logged {
                    tracing::warn!("waiting for {awaited}: {e}");
                    logged = awaited;
                }
                report(Some(&e));
            }
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(RECHECK_MAX);
    }
}

/// Every object of `resource`, watched (relists and API-server restarts
/// survived with kube's default backoff).
pub fn watch_all(
    client: &kube::Client,
    resource: &ApiResource,
) -> BoxStream<'static, Result<Event<DynamicObject>, watcher::Error>> {
    watcher::watcher(
        Api::<DynamicObject>::all_with(client.clone(), resource),
        watcher::Config::default(),
    )
    .default_backoff()
    .boxed()
}

/// A watch error that means the resource is not served any more (the CRD, or
/// the version the watch uses, went away): the caller resolves it again.
pub fn resource_gone(e: &kube::runtime::watcher::Error) -> bool {
    use kube::runtime::watcher::Error;
    match e {
        Error::InitialListFailed(kube::Error::Api(s))
        | Error::WatchStartFailed(kube::Error::Api(s)) => s.is_not_found(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served(versions: &[&str]) -> Vec<String> {
        versions.iter().map(|v| v.to_string()).collect()
    }

    #[test]
    fn cluster_network_policy_is_v1beta1_else_v1alpha2_of_its_own_group() {
        let kind = CiliumKind::ClusterNetworkPolicy;
        let r = choose(kind, &served(&["v1alpha2", "v1beta1"])).unwrap();
        assert_eq!(r.api_version, "policy.networking.k8s.io/v1beta1");
        assert_eq!(r.plural, "clusternetworkpolicies");
        let r = choose(kind, &served(&["v1alpha2"])).unwrap();
        assert_eq!(r.api_version, "policy.networking.k8s.io/v1alpha2");
        let e = choose(kind, &served(&[])).unwrap_err().to_string();
        assert_eq!(
            e,
            "CRD clusternetworkpolicies.policy.networking.k8s.io is not installed (podnet reads ClusterNetworkPolicy at v1beta1 or v1alpha2): install network-policy-api's (`kubectl apply -f deploy/crds/clusternetworkpolicies.yaml`)"
        );
        let e = choose(kind, &served(&["v1alpha1"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("serves ClusterNetworkPolicy at v1alpha1"), "{e}");
    }

    #[test]
    fn the_newest_understood_served_version_wins() {
        // Cilium 1.20.2's pool CRD serves v2alpha1 only; podnet's serves both.
        let r = choose(CiliumKind::PodIpPool, &served(&["v2alpha1"])).unwrap();
        assert_eq!(
            (r.api_version.as_str(), r.plural.as_str()),
            ("cilium.io/v2alpha1", "ciliumpodippools")
        );
        let r = choose(CiliumKind::PodIpPool, &served(&["v2alpha1", "v2"])).unwrap();
        assert_eq!(r.api_version, "cilium.io/v2");
        let r = choose(CiliumKind::NodeConfig, &served(&["v3", "v2alpha1"])).unwrap();
        assert_eq!(r.version, "v2alpha1");
        let r = choose(CiliumKind::LbIpPool, &served(&["v2"])).unwrap();
        assert_eq!(
            (r.kind.as_str(), r.group.as_str()),
            ("CiliumLoadBalancerIPPool", "cilium.io")
        );
    }

    #[test]
    fn a_missing_crd_or_version_says_what_to_install() {
        let e = choose(CiliumKind::PodIpPool, &[]).unwrap_err();
        assert!(e.is_missing_crd());
        assert_eq!(
            e.awaited(),
            "CRD ciliumpodippools.cilium.io at v2 or v2alpha1 (not installed)"
        );
        assert!(e.to_string().starts_with(
            "CRD ciliumpodippools.cilium.io is not installed (podnet reads CiliumPodIPPool at v2 or v2alpha1)"
        ), "{e}");
        let e = choose(CiliumKind::Node, &served(&["v2alpha1", "v3"])).unwrap_err();
        assert_eq!(
            e.awaited(),
            "CRD ciliumnodes.cilium.io at v2 (it serves v2alpha1, v3)"
        );
        assert!(
            e.to_string()
                .contains("none of which podnet understands (it understands v2)"),
            "{e}"
        );
    }
}
