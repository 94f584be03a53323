//! Network namespaces: `NetNs` (an open netns file), `in_netns` (run a closure
//! on a short-lived thread that has entered a netns, so the caller's thread
//! never switches) and `NetlinkSocket::new_in` (a socket bound to a netns).
//!
//! `setns` only affects the calling thread, and `/proc/self/ns/net` names the
//! thread-group leader's netns, so the current netns is always read from
//! `/proc/thread-self/ns/net`.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use nix::sched::{CloneFlags, setns};
use nix::sys::statfs::{NSFS_MAGIC, fstatfs};

use super::error::{DatapathError, Result};
use super::socket::NetlinkSocket;

/// Path of the calling thread's own network namespace.
pub const THREAD_SELF_NETNS: &str = "/proc/thread-self/ns/net";

/// An open handle on a network namespace. The namespace stays alive at least
/// as long as this handle is open.
#[derive(Debug)]
pub struct NetNs {
    fd: OwnedFd,
    label: String,
}

impl NetNs {
    /// Open the netns at `path` (e.g. `/run/netns/x`, `/proc/<pid>/ns/net`).
    /// A missing path gives [`DatapathError::NetNsNotFound`]; a path that is
    /// not a namespace file gives EINVAL.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(DatapathError::NetNsNotFound {
                    path: path.to_path_buf(),
                });
            }
            Err(e) => {
                return Err(DatapathError::io(
                    format!("opening network namespace {}", path.display()),
                    e,
                ));
            }
        };
        let st = fstatfs(&file).map_err(|e| {
            DatapathError::io(
                format!("checking network namespace {}", path.display()),
                io::Error::from(e),
            )
        })?;
        if st.filesystem_type() != NSFS_MAGIC {
            return Err(DatapathError::io(
                format!(
                    "opening network namespace {}: not an nsfs file",
                    path.display()
                ),
                io::Error::from_raw_os_error(libc::EINVAL),
            ));
        }
        Ok(NetNs {
            fd: OwnedFd::from(file),
            label: path.display().to_string(),
        })
    }

    /// The calling thread's current network namespace.
    pub fn current() -> Result<Self> {
        Self::open(THREAD_SELF_NETNS)
    }

    /// Wrap an already-open namespace fd. `label` is used in error messages.
    pub fn from_fd(fd: OwnedFd, label: impl Into<String>) -> Self {
        NetNs {
            fd,
            label: label.into(),
        }
    }

    /// The path (or label) this namespace was opened from.
    pub fn label(&self) -> &str {
        &self.label
    }

    pub fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// (device, inode) of the namespace: equal ids mean the same namespace.
    pub fn id(&self) -> Result<(u64, u64)> {
        let st = nix::sys::stat::fstat(&self.fd).map_err(|e| {
            DatapathError::io(format!("stat of netns {}", self.label), io::Error::from(e))
        })?;
        Ok((st.st_dev, st.st_ino))
    }
}

impl AsFd for NetNs {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The calling thread inside another netns until `leave` (or drop) returns it.
/// Only for single-threaded callers such as the plugin: the daemon uses
/// [`in_netns`] (a thread of a runtime's pool must never switch).
pub struct NetnsGuard {
    home: NetNs,
    left: bool,
}

/// Moves the calling thread into `ns`; `home` is the netns it is in now, where
/// the guard takes it back (e.g. [`NetlinkSocket::netns`] of a socket the thread
/// opened there, which costs no /proc path walk).
pub fn enter_netns(ns: &NetNs, home: NetNs) -> Result<NetnsGuard> {
    setns(ns.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|e| {
        DatapathError::io(
            format!("entering network namespace {}", ns.label),
            io::Error::from(e),
        )
    })?;
    Ok(NetnsGuard { home, left: false })
}

impl NetnsGuard {
    /// Returns the thread to its original netns.
    pub fn leave(mut self) -> Result<()> {
        self.left = true;
        setns(self.home.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|e| {
            DatapathError::io(
                "returning to the original network namespace",
                io::Error::from(e),
            )
        })
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        if !self.left {
            let _ = setns(self.home.as_fd(), CloneFlags::CLONE_NEWNET);
        }
    }
}

/// Run `f` on a fresh, short-lived thread that has `setns`'d into `ns`.
/// The calling thread's namespace never changes. `f` may borrow from the
/// caller. Anything it creates that is bound to a netns (netlink sockets) keeps
/// that binding after the thread exits; `/proc/sys` writes inside `f` apply to `ns`.
pub fn in_netns<T, F>(ns: &NetNs, f: F) -> Result<T>
where
    T: Send,
    F: FnOnce() -> Result<T> + Send,
{
    std::thread::scope(|scope| {
        let handle = std::thread::Builder::new()
            .name("podnet-netns".into())
            .spawn_scoped(scope, || {
                setns(ns.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|e| {
                    DatapathError::io(
                        format!("entering network namespace {}", ns.label),
                        io::Error::from(e),
                    )
                })?;
                f()
            })
            .map_err(|e| DatapathError::io(format!("spawning thread for netns {}", ns.label), e))?;
        handle.join().map_err(|_| DatapathError::ThreadPanicked {
            context: format!("running in network namespace {}", ns.label),
        })?
    })
}

impl NetlinkSocket {
    /// The netns this socket is bound to, from the socket itself (`SIOCGSKNS`,
    /// Linux 4.9): no /proc path walk.
    pub fn netns(&self) -> Result<NetNs> {
        // SAFETY: SIOCGSKNS takes no argument and returns a new fd or -1.
        let fd = unsafe { libc::ioctl(self.raw_fd(), libc::SIOCGSKNS as _) };
        if fd < 0 {
            return Err(DatapathError::io(
                format!(
                    "finding the network namespace of a netlink socket{}",
                    self.where_()
                ),
                io::Error::last_os_error(),
            ));
        }
        // SAFETY: a successful SIOCGSKNS returns a fresh fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let label = self.ns_label().unwrap_or("the socket's network namespace");
        Ok(NetNs::from_fd(fd, label))
    }

    /// Open a socket inside `ns` (via a short-lived thread). The socket can be
    /// used from any thread afterwards and always acts on `ns`.
    pub fn new_in(ns: &NetNs) -> Result<Self> {
        let mut sock = in_netns(ns, NetlinkSocket::new)?;
        sock.set_ns_label(ns.label.clone());
        Ok(sock)
    }
}
