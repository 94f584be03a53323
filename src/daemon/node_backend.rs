//! Which node backend the daemon runs, chosen once from the config and the
//! options ([`NodeBackend::of`]): the API server, an external IPAM's CiliumNode
//! file, or the embedded backend's manifest directories. What depends on the
//! choice at start (the status line's [`BackendHealth`], the [`NodeSource`] and
//! [`NodeSink`]) matches on it, never on the options again. [`addresses_needed`]
//! is the one count of what the node must own before the daemon serves (what an
//! external IPAM's node, from the API server or the file, is waited for to hold).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::config::{BackendKind, DaemonConfig, IpamMode, infra_addresses_per_family};
use super::options::DaemonOptions;
use crate::ipam::Family;
use crate::node::external::{ExternalSink, ExternalSource};
use crate::node::kubernetes::{KubernetesConfig, KubernetesMode, kubernetes_backend};
use crate::node::manifest_source::ManifestSource;
use crate::node::{BackendHealth, NodeResource, NodeSink, NodeSource};

/// Where the node resource comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeBackend<'a> {
    /// The API server: `--k8s-kubeconfig-path`, or the in-cluster service
    /// account (None).
    Kubernetes { kubeconfig: &'a Option<PathBuf> },
    /// The CiliumNode file an external IPAM (crd, azure, alibabacloud, eni)
    /// writes for this node (`--node-resource`).
    ExternalFile { path: &'a Path },
    /// The embedded backend: the pools and pod metadata in manifest directories.
    Manifests,
}

impl<'a> NodeBackend<'a> {
    /// The backend the configuration and the options choose.
    pub fn of(config: &'a DaemonConfig, opts: &'a DaemonOptions) -> NodeBackend<'a> {
        match (&config.backend, &opts.node_resource) {
            (BackendKind::Kubernetes { kubeconfig }, _) => NodeBackend::Kubernetes { kubeconfig },
            (_, Some(path)) if config.ipam.is_external() => NodeBackend::ExternalFile { path },
            _ => NodeBackend::Manifests,
        }
    }

    /// Which backend runs and where it reads from, for status.
    pub fn health(self, opts: &DaemonOptions) -> Arc<BackendHealth> {
        match self {
            NodeBackend::Kubernetes { kubeconfig } => BackendHealth::new(
                "kubernetes",
                kubeconfig
                    .as_ref()
                    .map(|k| format!("kubeconfig {}", k.display()))
                    .unwrap_or_else(|| "in-cluster service account".into()),
            ),
            NodeBackend::ExternalFile { path } => {
                BackendHealth::new("file", path.display().to_string())
            }
            NodeBackend::Manifests => BackendHealth::new(
                "embedded",
                [&opts.pool_dir, &opts.metadata_dir]
                    .into_iter()
                    .flatten()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
        }
    }
}

/// The addresses the node must own before the daemon serves: each family's
/// router address, and its health address with health checking.
pub fn addresses_needed(config: &DaemonConfig, opts: &DaemonOptions) -> u64 {
    config.families.len() as u64 * infra_addresses_per_family(opts.enable_health_checking)
}

/// How the Kubernetes backend reads the node in the configured IPAM mode.
fn kubernetes_mode(ipam: IpamMode) -> KubernetesMode {
    match ipam {
        IpamMode::Kubernetes => KubernetesMode::Kubernetes,
        IpamMode::ClusterPool => KubernetesMode::ClusterPool,
        IpamMode::MultiPool => KubernetesMode::MultiPool,
        mode => KubernetesMode::External {
            eni: mode == IpamMode::Eni,
        },
    }
}

/// The backend's source, and its sink where it has one (the manifest
/// directories have none).
pub fn node_source(
    backend: NodeBackend<'_>,
    config: &DaemonConfig,
    opts: &DaemonOptions,
    node_name: &str,
    runtime: &tokio::runtime::Handle,
    journal_node: Option<NodeResource>,
    health: &Arc<BackendHealth>,
) -> (Box<dyn NodeSource>, Option<Box<dyn NodeSink>>) {
    let needed = addresses_needed(config, opts);
    match backend {
        NodeBackend::Kubernetes { kubeconfig } => {
            let (source, sink) = kubernetes_backend(
                KubernetesConfig {
                    kubeconfig: kubeconfig.clone(),
                    node_name: node_name.to_string(),
                    mode: kubernetes_mode(config.ipam),
                    ipv4: config.families.contains(&Family::V4),
                    ipv6: config.families.contains(&Family::V6),
                    needed,
                    initial_demand: config
                        .multi_pool
                        .as_ref()
                        .map(|m| m.initial_demand(&config.families, opts.enable_health_checking))
                        .unwrap_or_default(),
                    routing_mode: config.cross_node.routing.as_str(),
                },
                runtime.clone(),
                journal_node,
                health.clone(),
            );
            (Box::new(source), Some(Box::new(sink)))
        }
        NodeBackend::ExternalFile { path } => (
            Box::new(ExternalSource {
                health: health.clone(),
                node_name: node_name.to_string(),
                path: path.to_path_buf(),
                eni: config.ipam == IpamMode::Eni,
                needed,
            }),
            Some(Box::new(ExternalSink {
                path: path.to_path_buf(),
            })),
        ),
        NodeBackend::Manifests => (
            Box::new(ManifestSource {
                health: health.clone(),
                pool_dir: opts.pool_dir.clone(),
                metadata_dir: opts.metadata_dir.clone(),
                auto_create: config
                    .multi_pool
                    .as_ref()
                    .map(|m| m.auto_create.clone())
                    .unwrap_or_default(),
                node_labels: config.node_labels.clone(),
            }),
            None,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::config::resolved_options as resolved;

    /// The backend `args` choose, and its status kind and location.
    fn chosen(args: &[&str]) -> (String, &'static str, String) {
        let (opts, config) = resolved(args);
        let backend = NodeBackend::of(&config, &opts);
        let health = backend.health(&opts);
        (format!("{backend:?}"), health.kind, health.location())
    }

    #[test]
    fn the_api_server_is_the_backend_whenever_a_kubeconfig_is_given() {
        let (backend, kind, location) = chosen(&[
            "--k8s-kubeconfig-path",
            "/etc/kube.conf",
            "--ipam",
            "crd",
            "--node-resource",
            "/run/node.yaml",
        ]);
        assert!(backend.starts_with("Kubernetes"), "{backend}");
        assert_eq!(
            (kind, location.as_str()),
            ("kubernetes", "kubeconfig /etc/kube.conf")
        );
    }

    #[test]
    fn an_external_ipam_without_the_api_server_reads_its_node_resource_file() {
        let (backend, kind, location) =
            chosen(&["--ipam", "crd", "--node-resource", "/run/node.yaml"]);
        assert!(backend.starts_with("ExternalFile"), "{backend}");
        assert_eq!((kind, location.as_str()), ("file", "/run/node.yaml"));
    }

    #[test]
    fn the_embedded_backend_reads_its_manifest_directories() {
        let (backend, kind, location) = chosen(&[
            "--ipam",
            "multi-pool",
            "--pool-dir",
            "/etc/pools",
            "--metadata-dir",
            "/etc/meta",
        ]);
        assert_eq!(backend, "Manifests");
        assert_eq!(
            (kind, location.as_str()),
            ("embedded", "/etc/pools /etc/meta")
        );
    }

    #[test]
    fn a_node_resource_file_is_read_only_in_an_external_ipam_mode() {
        let (backend, _, _) = chosen(&["--node-resource", "/run/node.yaml"]);
        assert_eq!(backend, "Manifests");
    }

    #[test]
    fn on_the_api_server_each_external_ipam_reads_the_node_as_an_external_one() {
        for (ipam, mode) in [
            (IpamMode::Kubernetes, KubernetesMode::Kubernetes),
            (IpamMode::ClusterPool, KubernetesMode::ClusterPool),
            (IpamMode::MultiPool, KubernetesMode::MultiPool),
            (IpamMode::Crd, KubernetesMode::External { eni: false }),
            (IpamMode::Eni, KubernetesMode::External { eni: true }),
        ] {
            assert_eq!(kubernetes_mode(ipam), mode, "{ipam:?}");
        }
    }

    #[test]
    fn the_node_needs_a_router_address_per_family_and_a_health_address_with_health_checking() {
        for (args, needed) in [
            (&["--enable-health-checking=false"][..], 1),
            (&[], 2),
            (&["--enable-ipv6", "--enable-health-checking=false"], 2),
            (&["--enable-ipv6"], 4),
        ] {
            let (opts, config) = resolved(args);
            assert_eq!(addresses_needed(&config, &opts), needed, "{args:?}");
        }
    }
}
