//! What a daemon that has started but does not serve yet is waiting for (the API
//! server, a CRD, the operator's blocks), where `podnet status` finds it before
//! the socket answers: the daemon holds `<socket>.lock` from its first moment
//! (one daemon per socket) and writes what its start waits for into it, one line
//! each, emptying it once it serves. A reader trusts the text only while someone
//! holds the lock, so a daemon that died leaves nothing misleading behind.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

/// The lock file of the daemon serving `socket`.
pub fn lock_path(socket: &Path) -> PathBuf {
    PathBuf::from(format!("{}.lock", socket.display()))
}

/// Replaces the note in the lock file `lock` with `waiting` (empty: serving).
pub fn write(lock: &Path, waiting: &[String]) -> std::io::Result<()> {
    let mut text = waiting.join("\n");
    if !text.is_empty() {
        text.push('\n');
    }
    std::fs::write(lock, text)
}

/// What the daemon of `socket` waits for, when a daemon holds its lock and has
/// written a note (None: no daemon, or one that serves or waits for nothing).
pub fn read(socket: &Path) -> Option<Vec<String>> {
    let mut file = File::open(lock_path(socket)).ok()?;
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    // Taking the lock shared succeeds only when no daemon holds it.
    match Flock::lock(file, FlockArg::LockSharedNonblock) {
        Ok(_unlocked_on_drop) => None,
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
            let lines: Vec<String> = text.lines().map(str::to_string).collect();
            (!lines.is_empty()).then_some(lines)
        }
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_dir::TestDir;

    #[test]
    fn the_note_counts_only_while_the_lock_is_held() {
        let dir = TestDir::new("note");
        let socket = dir.join("podnet.sock");
        let lock = lock_path(&socket);
        let waiting =
            vec!["CRD ciliumpodippools.cilium.io at v2 or v2alpha1 (not installed)".to_string()];
        write(&lock, &waiting).unwrap();
        assert_eq!(read(&socket), None, "nobody holds the lock");
        let held = Flock::lock(File::open(&lock).unwrap(), FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| e)
            .unwrap();
        assert_eq!(read(&socket), Some(waiting));
        write(&lock, &[]).unwrap();
        assert_eq!(read(&socket), None, "serving: nothing awaited");
        drop(held);
    }
}
