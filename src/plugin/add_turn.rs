//! The node's podnet plugins take turns with their netlink work (IPv4-only pods):
//! from creating a pod's veth pair, through its host side (where IPv6 is
//! disabled), its ENI routing and its pod side, to marking its host link wired.
//! The kernel serialises all of it anyway (RTNL), but a `disable_ipv6` write that
//! finds RTNL held does not wait for it: the kernel restarts the system call until
//! it gets the lock, and that spinning takes the CPU the holder needs, so a burst
//! of ADDs went slower than the same ADDs one by one. Within the turn, no other
//! plugin holds RTNL while the write runs; a plugin waiting for its turn sleeps
//! (BENCHMARKS.md, "ADD in batches" and "The turn covers the whole netlink
//! work"). Outside it, plugins run in parallel: the exec, the allocation, the
//! answer. The turn is an flock on a file in the daemon socket's directory,
//! released when the plugin drops it or exits, however it exits.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

/// The turn's file for the daemon serving `socket`.
pub fn turn_path(socket: &Path) -> PathBuf {
    socket
        .parent()
        .unwrap_or(Path::new("/"))
        .join("add-turn.lock")
}

/// This plugin's turn, held until dropped. A plugin that cannot take one (the
/// directory is read-only or gone) goes on without it: the turn saves CPU, it
/// guards nothing.
pub struct AddTurn {
    _held: Option<Flock<File>>,
}

impl AddTurn {
    /// Waits for the turn of the plugins of `socket`'s daemon.
    pub fn take(socket: &Path) -> AddTurn {
        let path = turn_path(socket);
        let held = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| e.to_string())
            .and_then(|file| {
                Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| e.to_string())
            });
        match held {
            Ok(lock) => AddTurn { _held: Some(lock) },
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "going on without the ADD turn");
                AddTurn { _held: None }
            }
        }
    }

    /// Whether this plugin holds the turn.
    #[cfg(test)]
    fn held(&self) -> bool {
        self._held.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_dir::TestDir;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn a_second_turn_waits_until_the_first_is_dropped() {
        let dir = TestDir::new("add-turn-wait");
        let socket = dir.join("podnet.sock");
        let first = AddTurn::take(&socket);
        assert!(first.held());
        let (tx, rx) = mpsc::channel();
        let waiter = {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let second = AddTurn::take(&socket);
                tx.send(second.held()).unwrap();
            })
        };
        // A busy machine only makes the waiter later: it cannot get the turn while
        // the first is held.
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
        drop(first);
        assert_eq!(rx.recv_timeout(Duration::from_secs(30)), Ok(true));
        waiter.join().unwrap();
        assert!(turn_path(&socket).exists());
    }

    #[test]
    fn without_a_usable_directory_the_plugin_goes_on_without_a_turn() {
        let dir = TestDir::new("add-turn-gone");
        let socket = dir.join("gone").join("podnet.sock");
        assert!(!AddTurn::take(&socket).held());
    }
}
