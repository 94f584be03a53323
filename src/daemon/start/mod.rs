//! The daemon's start, phase by phase: check the options and the process,
//! take the socket lock, open the journal, ask the node backend what the node
//! owns, restore the state, replay the DEL queue, reconcile with the kernel and
//! set up the router device, then serve (the CNI config is written once the
//! configuration fits the node). A failed phase is a [`StartError`] that names it
//! and keeps what went wrong.
//!
//! [`start`] reads as the list of phases; each phase lives with its kin:
//! [`check`] (the options against this process and kernel, the source check's
//! table), [`journal`] (which journal and node resource it holds), [`node`] (the
//! node backend and the node resource the daemon starts from), [`restore`] (the
//! state, the DEL queue, the kernel), [`serve`] (the socket and the background
//! work) and [`cni_conf`] (the CNI config: when to write it, what to uninstall).
//! A phase that touches the kernel or the node's files does so through a small
//! trait or a function it is given, so its decisions are tested with fakes.

mod check;
mod cni_conf;
mod journal;
mod node;
mod restore;
mod serve;

use std::path::PathBuf;

use super::capabilities::CapabilityError;
use super::cniconf::CniConfError;
use super::config::{ConfigError, DatapathMode};
use super::crossnode::PrerequisiteError;
use super::device_error::DeviceError;
use super::node_backend::NodeBackend;
use super::options::DaemonOptions;
use super::server::{self, SocketError};
use super::source_check::SourceCheckError;
use super::state::{ApiError, RestoreError};
use super::{ReplayError, devices, heap};
use crate::node::NodeError;
use crate::process::metrics_server::MetricsBindError;

pub use journal::JournalOpenError;

/// Why the daemon did not start: the phase that failed, with what went wrong.
/// Each message is the failed step's own, which says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Options(#[from] ConfigError),
    #[error(transparent)]
    Capabilities(#[from] CapabilityError),
    #[error(transparent)]
    CrossNodePrerequisites(#[from] PrerequisiteError),
    #[error("cannot read the host name ({0}); set --k8s-node-name")]
    HostName(#[source] nix::errno::Errno),
    #[error("--datapath-mode={configured}: {reason}; use veth or auto")]
    NetkitMissing {
        configured: DatapathMode,
        reason: String,
    },
    #[error("cannot start the runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error(transparent)]
    SocketLock(SocketError),
    #[error(transparent)]
    SourceCheck(#[from] SourceCheckError),
    #[error(transparent)]
    StateDirectory(SocketError),
    #[error(transparent)]
    Journal(#[from] JournalOpenError),
    #[error("{0}")]
    NodeBackend(#[source] NodeError),
    #[error("{0}")]
    NodeOperator(#[source] NodeError),
    #[error(transparent)]
    Restore(RestoreError),
    #[error("{0}")]
    DeleteQueue(#[from] ReplayError),
    #[error("{0}")]
    KernelView(#[source] DeviceError),
    #[error(transparent)]
    KernelReconcile(RestoreError),
    #[error("{0}")]
    Teardown(#[source] DeviceError),
    #[error("{0}")]
    TeardownJournal(#[source] ApiError),
    #[error("{0}")]
    RouterDevice(#[source] DeviceError),
    #[error(transparent)]
    Serve(SocketError),
    #[error(transparent)]
    Metrics(#[from] MetricsBindError),
    #[error("{0}")]
    CniConfig(#[from] CniConfError),
    #[error("cannot clear {}: {source}", .path.display())]
    StartNote {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl StartError {
    /// The phase that failed, for the log.
    pub fn phase(&self) -> &'static str {
        match self {
            StartError::Options(_) => "options",
            StartError::Capabilities(_) => "capabilities",
            StartError::CrossNodePrerequisites(_) => "cross-node prerequisites",
            StartError::HostName(_) => "node name",
            StartError::NetkitMissing { .. } => "datapath mode",
            StartError::Runtime(_) => "runtime",
            StartError::SocketLock(_) => "socket lock",
            StartError::SourceCheck(_) => "source check",
            StartError::StateDirectory(_) => "state directory",
            StartError::Journal(_) => "journal",
            StartError::NodeBackend(_) => "node backend",
            StartError::NodeOperator(_) => "node operator",
            StartError::Restore(_) => "restore",
            StartError::DeleteQueue(_) => "DEL queue replay",
            StartError::KernelView(_) => "kernel view",
            StartError::KernelReconcile(_) => "kernel reconcile",
            StartError::Teardown(_) | StartError::TeardownJournal(_) => "teardown",
            StartError::RouterDevice(_) => "router device",
            StartError::Serve(_) | StartError::Metrics(_) => "serve",
            StartError::CniConfig(_) => "CNI config",
            StartError::StartNote { .. } => "start note",
        }
    }
}

/// Starts the daemon and serves until a shutdown signal.
pub(super) fn start(opts: DaemonOptions) -> Result<(), StartError> {
    let checked = check::check(&opts)?;
    heap::tune();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(StartError::Runtime)?;
    let lock = server::lock_socket(&opts.socket).map_err(StartError::SocketLock)?;
    server::ensure_private_dir(&opts.state_dir, "state directory")
        .map_err(StartError::StateDirectory)?;
    // First, so a journal this podnet refuses (a newer format) leaves the node
    // as it found it.
    let journal = journal::open_journal(
        &journal::JournalFiles,
        &opts.state_dir.join("journal.redb"),
        opts.rebuild_from_kernel,
    )?;
    check::set_up_source_check(&check::SourceCheckTable, opts.enable_source_ip_verification)?;
    let chosen = NodeBackend::of(&checked.config, &opts);
    let health = chosen.health(&opts);
    node::note_waits_in_lock_file(&health, &lock);
    let mut backend = node::connect_backend(
        &checked,
        chosen,
        &opts,
        runtime.handle(),
        journal.node.clone(),
        &health,
    )?;
    let router_hints = devices::router_addresses();
    let node = node::node_resource(
        &checked,
        &mut backend,
        journal.origin,
        journal.node.as_ref(),
        &router_hints,
    )?;
    let cidrs = node::node_cidrs(&node);
    let mtus = restore::mtus(&checked.config, opts.mtu, devices::default_route_mtu);
    let origin = journal.origin;
    let mut state = restore::restore_state(&checked, &opts, mtus, journal, node, &mut backend)?;
    let queue = restore::replay_delete_queue(&mut state, &opts.socket)?;
    restore::reconcile_with_kernel(&restore::HostKernel, &mut state, origin, &router_hints)?;
    let routers = state.router_ips();
    devices::setup_router(&routers, mtus.pod, &opts.procfs).map_err(StartError::RouterDevice)?;
    restore::log_restored(&state, &checked.node_name, &cidrs, &routers);
    let timers = state.take_timers();
    heap::trim();
    let node::Backend { source, sink, .. } = backend;
    runtime.block_on(serve::serve(serve::Serving {
        opts,
        checked,
        mtus,
        lock,
        queue,
        health,
        state,
        timers,
        source,
        sink,
    }))
}

#[cfg(test)]
pub(super) mod tests {
    use super::StartError;

    /// Checks that `err` fails the start in `phase`, with a message that says
    /// each of `says` (what failed, and what to fix).
    pub(in crate::daemon::start) fn assert_fails_in(err: &StartError, phase: &str, says: &[&str]) {
        assert_eq!(err.phase(), phase, "{err:?}");
        let text = err.to_string();
        for part in says {
            assert!(text.contains(part), "{text:?} does not say {part:?}");
        }
    }
}
