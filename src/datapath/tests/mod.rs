//! Tests of the datapath module. Root tests run in private network namespaces:
//! each one runs on a thread that `unshare(CLONE_NEWNET)`s (its private "host"
//! netns vanishes with the thread), and pod namespaces are anonymous netns
//! kept alive only by an open fd. The machine's own netns is never modified.

mod addr_route;
mod l2_responder;
mod link;
mod misc;
mod neigh_rule;
mod pod;
mod tc;

use std::fs::File;
use std::os::fd::OwnedFd;

use nix::sched::{CloneFlags, unshare};

use super::NetNs;

/// True when running as root; otherwise the test fails or, where skips are
/// allowed, is recorded as skipped (`test_skip`).
pub(crate) fn root(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    crate::test_skip::skip(test, "needs root (CAP_NET_ADMIN)");
    false
}

/// Run `f` on a thread with its own fresh netns (the test's private "host").
pub(crate) fn in_private_netns<F: FnOnce() + Send + 'static>(f: F) {
    let machine_ns = NetNs::current().unwrap().id().unwrap();
    let handle = std::thread::spawn(move || {
        unshare(CloneFlags::CLONE_NEWNET).unwrap();
        let here = NetNs::current().unwrap().id().unwrap();
        assert_ne!(here, machine_ns, "test must not run in the machine's netns");
        f()
    });
    if let Err(panic) = handle.join() {
        std::panic::resume_unwind(panic);
    }
}

/// A new anonymous netns, alive while the returned handle is open.
pub(super) fn new_netns(label: &str) -> NetNs {
    let file = std::thread::spawn(|| {
        unshare(CloneFlags::CLONE_NEWNET).unwrap();
        File::open("/proc/thread-self/ns/net").unwrap()
    })
    .join()
    .unwrap();
    NetNs::from_fd(OwnedFd::from(file), label)
}
