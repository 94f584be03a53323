//! The node phases: the node backend connected and what it says first
//! ([`connect_backend`]: the default pool, the embedded operator where the daemon
//! plays it), and the node resource the daemon starts from ([`node_resource`]: the
//! embedded operator's answer to what the journal holds, else the backend's, else
//! the journal's; after a rebuild, the router device's CIDRs). The backend comes
//! in as a [`NodeSource`] ([`connected`] takes the one [`connect_backend`] builds)
//! and the operator as a [`NodeOperator`], so each choice is tested with fakes.

use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use super::StartError;
use super::check::Checked;
use crate::api::start_note;
use crate::daemon::config::{BackendKind, DaemonConfig, IpamMode};
use crate::daemon::node_backend::{NodeBackend, node_source};
use crate::daemon::options::DaemonOptions;
use crate::daemon::server::SocketLock;
use crate::daemon::state::JournalOrigin;
use crate::ipam::Family;
use crate::ipam::pooldef::PoolDef;
use crate::node::{
    BackendHealth, EmbeddedMode, EmbeddedOperator, NodeOperator, NodeResource, NodeSink,
    NodeSource, NodeView,
};

/// The node backend, connected: its source and sink, what it said first, the
/// default pool, and the embedded operator where the daemon plays it.
pub(super) struct Backend {
    pub(super) source: Box<dyn NodeSource>,
    pub(super) sink: Option<Box<dyn NodeSink>>,
    pub(super) view: NodeView,
    pub(super) default_pool: Option<String>,
    pub(super) operator: Option<Box<dyn NodeOperator>>,
}

/// Until the socket answers, what the start waits for is in the lock file.
pub(super) fn note_waits_in_lock_file(health: &BackendHealth, lock: &SocketLock) {
    let note = lock.path().to_path_buf();
    health.on_waiting(Some(Box::new(move |waiting: &[String]| {
        if let Err(e) = start_note::write(&note, waiting) {
            tracing::warn!(error = %e, file = %note.display(), "cannot note what the start waits for");
        }
    })));
}

/// Connects the node backend and reads what it says first; sets up the embedded
/// operator where the daemon plays the operator for this node (an external IPAM
/// needs none).
pub(super) fn connect_backend(
    checked: &Checked,
    chosen: NodeBackend<'_>,
    opts: &DaemonOptions,
    runtime: &tokio::runtime::Handle,
    journal_node: Option<NodeResource>,
    health: &Arc<BackendHealth>,
) -> Result<Backend, StartError> {
    let (source, sink) = node_source(
        chosen,
        &checked.config,
        opts,
        &checked.node_name,
        runtime,
        journal_node,
        health,
    );
    connected(checked, source, sink)
}

/// The backend whose `source` was built: what it says first, the default pool,
/// and the embedded operator where the daemon plays it.
pub(super) fn connected(
    checked: &Checked,
    mut source: Box<dyn NodeSource>,
    sink: Option<Box<dyn NodeSink>>,
) -> Result<Backend, StartError> {
    let config = &checked.config;
    let view = source.initial().map_err(StartError::NodeBackend)?;
    let default_pool = config.multi_pool.as_ref().map(|m| {
        view.default_pool
            .clone()
            .unwrap_or_else(|| m.default_pool.clone())
    });
    let embedded = config.backend == BackendKind::Embedded;
    let operator: Option<Box<dyn NodeOperator>> =
        (embedded && !config.ipam.is_external()).then(|| {
            Box::new(EmbeddedOperator::new(
                &checked.node_name,
                embedded_mode(config, &view.pools, default_pool.as_deref()),
            )) as Box<dyn NodeOperator>
        });
    Ok(Backend {
        source,
        sink,
        view,
        default_pool,
        operator,
    })
}

/// The node resource the daemon starts from: the embedded operator's answer to
/// what the journal holds (`stored`), else the backend's, else the journal's.
pub(super) fn node_resource(
    checked: &Checked,
    backend: &mut Backend,
    origin: JournalOrigin,
    stored: Option<&NodeResource>,
    router_hints: &[IpAddr],
) -> Result<NodeResource, StartError> {
    let node_name = &checked.node_name;
    // A journal that knows nothing (rebuilt, or new on a node whose router device
    // shows that podnet ran here) takes the node's CIDRs from the router device.
    let current = match origin {
        JournalOrigin::Rebuilt => rebuilt_node(node_name, &checked.config, router_hints),
        JournalOrigin::Created if !router_hints.is_empty() => {
            tracing::warn!(
                routers = ?router_hints,
                "the journal is new, but the router device shows that podnet ran on this node: taking the node's CIDRs from it and adopting the pods' addresses from their host links"
            );
            rebuilt_node(node_name, &checked.config, router_hints)
        }
        _ => stored.cloned(),
    };
    match (backend.operator.as_mut(), backend.view.node.take()) {
        (Some(op), _) => op.sync(current).map_err(StartError::NodeOperator),
        (None, Some(node)) => Ok(node),
        (None, None) => Ok(current.unwrap_or_else(|| NodeResource::new(node_name))),
    }
}

/// The node's CIDRs, for the log: its pod CIDRs, else its pools' blocks.
pub(super) fn node_cidrs(node: &NodeResource) -> Vec<String> {
    if node.spec.ipam.pod_cidrs.is_empty() {
        node.spec
            .ipam
            .pools
            .allocated
            .iter()
            .flat_map(|a| a.cidrs.iter().map(|c| format!("{}/{c}", a.pool)))
            .chain(node.spec.ipam.pool.keys().cloned())
            .collect()
    } else {
        node.spec
            .ipam
            .pod_cidrs
            .iter()
            .map(IpNet::to_string)
            .collect()
    }
}

/// In a rebuild, the node's CIDRs are those that hold the router device's
/// addresses: of the node mask size of the pool CIDR each is in (its own
/// `<cidr>@<mask>`, or the family's), for a family whose mask size fits its
/// pool CIDRs (a misfit one, which the Kubernetes backend lets start as a finding
/// of the node check, would make up CIDRs the operator never carved).
fn rebuilt_node(
    node_name: &str,
    config: &DaemonConfig,
    routers: &[IpAddr],
) -> Option<NodeResource> {
    let cfg = config.cluster_pool.as_ref()?;
    let misfit: Vec<Family> = cfg.mask_misfits().iter().map(|m| m.family).collect();
    let mut node = NodeResource::new(node_name);
    for ip in routers {
        let family = Family::of_addr(ip);
        if misfit.contains(&family) {
            continue;
        }
        if let Ok(net) = IpNet::new(*ip, cfg.node_mask_of(*ip)) {
            node.spec.ipam.pod_cidrs.push(net.trunc());
        }
    }
    Some(node)
}

/// What the embedded operator decides the node's addresses from.
fn embedded_mode(
    config: &DaemonConfig,
    pools: &[PoolDef],
    default_pool: Option<&str>,
) -> EmbeddedMode {
    match (&config.cluster_pool, &config.multi_pool, config.ipam) {
        (Some(cp), _, _) => EmbeddedMode::ClusterPool(cp.clone()),
        (_, Some(m), _) => {
            let default_pool = default_pool.unwrap_or(&m.default_pool);
            if !pools.iter().any(|p| p.name == default_pool) {
                tracing::warn!(
                    pool = default_pool,
                    "the default pool does not exist (yet): pods that no annotation or selector places will not get addresses"
                );
            }
            EmbeddedMode::MultiPool {
                pools: pools.to_vec(),
                default_pool: default_pool.to_string(),
                migrate_cluster_pool: m.migrate_cluster_pool,
            }
        }
        (_, _, IpamMode::Kubernetes) => EmbeddedMode::Kubernetes {
            pod_cidrs: config.pod_cidrs.clone(),
            enable_ipv4: config.families.contains(&Family::V4),
            enable_ipv6: config.families.contains(&Family::V6),
        },
        _ => EmbeddedMode::Delegated,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::daemon::config::resolved_options as resolved;
    use crate::daemon::start::tests::assert_fails_in;
    use crate::node::{NodeError, NodeEvent, WatchFuture};
    use crate::resources::AllocatedPool;

    /// The options of a daemon started with `args` on node `n1`, and the checks'
    /// outcome (veth pods).
    pub(in crate::daemon::start) fn started(args: &[&str]) -> (DaemonOptions, Checked) {
        let (opts, config) = resolved(args);
        let checked = Checked {
            config,
            node_name: "n1".into(),
            datapath_mode: crate::daemon::config::DatapathMode::Veth,
        };
        (opts, checked)
    }

    pub(in crate::daemon::start) fn checked(args: &[&str]) -> Checked {
        started(args).1
    }

    /// A backend whose first word is `initial`.
    pub(in crate::daemon::start) struct FakeSource {
        pub(in crate::daemon::start) initial: Option<Result<NodeView, NodeError>>,
    }

    impl NodeSource for FakeSource {
        fn initial(&mut self) -> Result<NodeView, NodeError> {
            self.initial.take().expect("initial is asked once")
        }

        fn watch(self: Box<Self>, _: tokio::sync::mpsc::Sender<NodeEvent>) -> WatchFuture {
            Box::pin(async {})
        }
    }

    /// The backend of a daemon started with `args`, whose first word is `view`.
    fn backend_saying(args: &[&str], view: NodeView) -> Backend {
        let source = FakeSource {
            initial: Some(Ok(view)),
        };
        connected(&checked(args), Box::new(source), None).unwrap()
    }

    /// An operator that records the node it was given and answers `answer`.
    struct FakeOperator {
        given: Arc<Mutex<Vec<Option<NodeResource>>>>,
        answer: fn(Option<NodeResource>) -> Result<NodeResource, NodeError>,
    }

    impl NodeOperator for FakeOperator {
        fn sync(&mut self, current: Option<NodeResource>) -> Result<NodeResource, NodeError> {
            self.given.lock().unwrap().push(current.clone());
            (self.answer)(current)
        }

        fn satisfy(&mut self, _: &mut NodeResource) -> Vec<String> {
            Vec::new()
        }

        fn release_block(&mut self, _: &str, _: &IpNet) {}

        fn update_pools(&mut self, _: &[PoolDef], _: &NodeResource) -> Result<(), NodeError> {
            Ok(())
        }
    }

    fn backend(node: Option<NodeResource>, operator: Option<FakeOperator>) -> Backend {
        Backend {
            source: Box::new(FakeSource { initial: None }),
            sink: None,
            view: NodeView {
                node,
                ..NodeView::default()
            },
            default_pool: None,
            operator: operator.map(|o| Box::new(o) as Box<dyn NodeOperator>),
        }
    }

    fn node_with_cidr(name: &str, cidr: &str) -> NodeResource {
        let mut node = NodeResource::new(name);
        node.spec.ipam.pod_cidrs.push(cidr.parse().unwrap());
        node
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_backend_that_cannot_say_what_the_node_owns_fails_the_start_with_its_words() {
        let source = FakeSource {
            initial: Some(Err(NodeError::NotThisNode {
                path: "/run/node.yaml".into(),
                found: "n2".into(),
                expected: "n1".into(),
            })),
        };
        let err = connected(&checked(&[]), Box::new(source), None)
            .err()
            .unwrap();
        assert!(matches!(err, StartError::NodeBackend(_)), "{err:?}");
        assert_fails_in(
            &err,
            "node backend",
            &[
                "/run/node.yaml",
                "describes node \"n2\", not this node \"n1\"",
            ],
        );
    }

    #[test]
    fn the_backends_default_pool_wins_over_the_configured_one() {
        let multi = ["--ipam", "multi-pool"];
        let told = NodeView {
            default_pool: Some("blue".into()),
            ..NodeView::default()
        };
        assert_eq!(
            backend_saying(&multi, told).default_pool.as_deref(),
            Some("blue")
        );
        let silent = backend_saying(&multi, NodeView::default());
        assert_eq!(silent.default_pool.as_deref(), Some("default"));
        let not_multi = NodeView {
            default_pool: Some("blue".into()),
            ..NodeView::default()
        };
        assert_eq!(backend_saying(&[], not_multi).default_pool, None);
    }

    #[test]
    fn the_daemon_plays_the_operator_only_on_the_embedded_backend_and_not_for_an_external_ipam() {
        let kube = ["--k8s-kubeconfig-path", "/nonexistent"];
        let external = ["--ipam", "crd", "--node-resource", "/run/node.yaml"];
        for (args, plays) in [
            (&[][..], true),
            (&["--ipam", "multi-pool"], true),
            (&external, false),
            (&kube, false),
        ] {
            let backend = backend_saying(args, NodeView::default());
            assert_eq!(backend.operator.is_some(), plays, "{args:?}");
        }
    }

    #[test]
    fn without_an_operator_the_backends_node_wins_over_the_journals() {
        let mut b = backend(Some(node_with_cidr("n1", "10.0.1.0/24")), None);
        let stored = node_with_cidr("n1", "10.0.2.0/24");
        let node = node_resource(
            &checked(&[]),
            &mut b,
            JournalOrigin::Existing,
            Some(&stored),
            &[],
        )
        .unwrap();
        assert_eq!(node, node_with_cidr("n1", "10.0.1.0/24"));
    }

    #[test]
    fn without_an_operator_or_a_backends_node_the_journals_node_else_a_new_one() {
        let stored = node_with_cidr("n1", "10.0.2.0/24");
        for (stored, want) in [
            (Some(&stored), stored.clone()),
            (None, NodeResource::new("n1")),
        ] {
            let mut b = backend(None, None);
            let node =
                node_resource(&checked(&[]), &mut b, JournalOrigin::Existing, stored, &[]).unwrap();
            assert_eq!(node, want);
        }
    }

    /// What the operator is given, for a journal of `origin` holding `stored`,
    /// with the router device holding `routers`.
    fn given_to_operator(
        origin: JournalOrigin,
        stored: Option<&NodeResource>,
        routers: &[IpAddr],
    ) -> Option<NodeResource> {
        let given = Arc::new(Mutex::new(Vec::new()));
        let operator = FakeOperator {
            given: given.clone(),
            answer: |n| Ok(n.unwrap_or_else(|| NodeResource::new("carved"))),
        };
        let mut b = backend(Some(node_with_cidr("n1", "10.9.9.0/24")), Some(operator));
        let node = node_resource(&checked(&[]), &mut b, origin, stored, routers).unwrap();
        let mut given = given.lock().unwrap().clone();
        assert_eq!(given.len(), 1);
        let given = given.remove(0);
        let answer = given.clone().unwrap_or_else(|| NodeResource::new("carved"));
        assert_eq!(
            node, answer,
            "the operator's answer, not the backend's node"
        );
        given
    }

    #[test]
    fn the_operator_is_given_the_journals_node_and_its_answer_is_the_node() {
        let stored = node_with_cidr("n1", "10.0.2.0/24");
        let routers = [ip("10.0.7.1")];
        for (origin, hints) in [
            (JournalOrigin::Existing, &routers[..]),
            (JournalOrigin::Existing, &[]),
            (JournalOrigin::Created, &[]),
        ] {
            let given = given_to_operator(origin, Some(&stored), hints);
            assert_eq!(given.as_ref(), Some(&stored), "{origin:?} {hints:?}");
        }
        assert_eq!(given_to_operator(JournalOrigin::Created, None, &[]), None);
    }

    #[test]
    fn a_rebuilt_or_new_journal_on_a_node_with_a_router_device_takes_the_cidrs_from_it() {
        let routers = [ip("10.0.7.1")];
        for origin in [JournalOrigin::Rebuilt, JournalOrigin::Created] {
            let given = given_to_operator(origin, None, &routers);
            assert_eq!(
                given,
                Some(node_with_cidr("n1", "10.0.7.0/24")),
                "{origin:?}"
            );
        }
        let no_router = given_to_operator(JournalOrigin::Rebuilt, None, &[]);
        assert_eq!(no_router, Some(NodeResource::new("n1")));
    }

    #[test]
    fn a_journal_of_another_node_fails_the_start_naming_both_nodes_and_the_fix() {
        let config = checked(&[]);
        let mut b = backend_saying(&[], NodeView::default());
        let stored = NodeResource::new("n2");
        let err = node_resource(&config, &mut b, JournalOrigin::Existing, Some(&stored), &[])
            .err()
            .unwrap();
        assert!(
            matches!(
                err,
                StartError::NodeOperator(NodeError::JournalOfAnotherNode { .. })
            ),
            "{err:?}"
        );
        assert_fails_in(
            &err,
            "node operator",
            &["belongs to node \"n2\", not \"n1\"", "--state-dir"],
        );
    }

    #[test]
    fn the_embedded_operator_carves_the_node_its_cidrs() {
        let args = ["--cluster-pool-ipv4-cidr", "10.0.0.0/8"];
        let mut b = backend_saying(&args, NodeView::default());
        let config = checked(&args);
        let node = node_resource(&config, &mut b, JournalOrigin::Created, None, &[]).unwrap();
        assert_eq!(node.metadata.name, "n1");
        assert_eq!(node_cidrs(&node), ["10.0.0.0/24"]);
    }

    #[test]
    fn a_rebuilt_node_takes_no_cidr_of_a_family_whose_mask_size_does_not_fit() {
        let (_, config) = resolved(&[
            "--k8s-kubeconfig-path",
            "/nonexistent",
            "--enable-ipv6",
            "--cluster-pool-ipv4-cidr",
            "10.0.0.0/8",
            "--cluster-pool-ipv6-cidr",
            "fd00::/104",
            "--cluster-pool-ipv6-mask-size",
            "121",
        ]);
        let routers = [ip("10.0.7.1"), ip("fd00::7:1")];
        let node = rebuilt_node("n1", &config, &routers).unwrap();
        assert_eq!(
            node.spec.ipam.pod_cidrs,
            vec!["10.0.7.0/24".parse::<IpNet>().unwrap()]
        );
    }

    #[test]
    fn only_cluster_pool_rebuilds_a_node_from_the_router_device() {
        let (_, config) = resolved(&["--ipam", "multi-pool"]);
        assert_eq!(rebuilt_node("n1", &config, &[ip("10.0.7.1")]), None);
    }

    #[test]
    fn the_embedded_operator_works_in_the_configured_ipam_mode() {
        let mode = |args: &[&str], default_pool| {
            let (_, config) = resolved(args);
            embedded_mode(&config, &[], default_pool)
        };
        assert!(matches!(mode(&[], None), EmbeddedMode::ClusterPool(_)));
        let multi = mode(&["--ipam", "multi-pool"], Some("blue"));
        assert!(
            matches!(&multi, EmbeddedMode::MultiPool { default_pool, .. } if default_pool == "blue"),
            "{multi:?}"
        );
        let multi = mode(&["--ipam", "multi-pool"], None);
        assert!(
            matches!(&multi, EmbeddedMode::MultiPool { default_pool, .. } if default_pool == "default"),
            "{multi:?}"
        );
        let kubernetes = mode(
            &["--ipam", "kubernetes", "--pod-cidrs", "10.1.0.0/24"],
            None,
        );
        assert!(
            matches!(
                kubernetes,
                EmbeddedMode::Kubernetes {
                    enable_ipv4: true,
                    ..
                }
            ),
            "{kubernetes:?}"
        );
        let delegated = mode(
            &[
                "--ipam",
                "delegated-plugin",
                "--local-router-ipv4",
                "10.1.0.1",
            ],
            None,
        );
        assert!(
            matches!(delegated, EmbeddedMode::Delegated),
            "{delegated:?}"
        );
    }

    #[test]
    fn the_logged_cidrs_are_the_pod_cidrs_else_the_pools_blocks_and_addresses() {
        assert_eq!(
            node_cidrs(&node_with_cidr("n1", "10.0.1.0/24")),
            ["10.0.1.0/24"]
        );
        let mut node = NodeResource::new("n1");
        node.spec.ipam.pools.allocated.push(AllocatedPool {
            pool: "blue".into(),
            cidrs: vec!["10.2.0.0/28".parse().unwrap()],
            ..AllocatedPool::default()
        });
        node.spec
            .ipam
            .pool
            .insert("10.3.0.5".into(), Default::default());
        assert_eq!(node_cidrs(&node), ["blue/10.2.0.0/28", "10.3.0.5"]);
    }
}
