//! The on-disk DEL queue between the plugin and the daemon: when the daemon cannot
//! be reached, DEL records the release here and succeeds; the daemon replays the
//! queue at start before it serves. A directory `delete-queue/` next to the socket
//! (0700) holds one `<hash>.delete` file per attachment (the JSON of an
//! `EndpointBatchDeleteRequest`), written to a temporary name, synced and renamed,
//! so a crash at any point leaves either no entry or a whole one. A lock file
//! closes the race with a starting daemon: writers hold it shared while they retry
//! the API and write; the daemon holds it exclusively from before it replays the
//! queue until its socket accepts requests. An entry the daemon cannot use is set
//! aside as `<hash>.bad`, listed until someone removes it. Each entry carries
//! its format version (`format-version`, [`QUEUE_FORMAT`]; an entry without one
//! is version 1); one in a newer format is set aside too, never guessed at.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use sha2::{Digest, Sha256};

use super::models::EndpointBatchDeleteRequest;
use super::validate;

/// At most this many queued entries; a DEL beyond it fails (try again later).
pub const MAX_ENTRIES: usize = 256;
/// How long a writer waits for the shared lock (a starting daemon holds it).
pub const LOCK_TIMEOUT: Duration = Duration::from_millis(1500);
const SUFFIX: &str = ".delete";
/// The extension of entries set aside.
const BAD_EXTENSION: &str = "bad";
/// The format of the entries this podnet writes, and the newest it reads: the
/// JSON of an `EndpointBatchDeleteRequest` plus this key. Version 1 is also an
/// entry without the key (written before entries carried a version).
pub const QUEUE_FORMAT: u64 = 1;
const FORMAT_KEY: &str = "format-version";

/// What a DEL queue operation failed with; each message names the queue or the
/// entry.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// A file system call on the queue failed; `action` says which, on what.
    #[error("{action}: {source}")]
    Io {
        action: String,
        #[source]
        source: std::io::Error,
    },
    /// The shared lock stayed taken (by a starting daemon) or could not be taken.
    #[error("cannot lock the DEL queue {} (is the daemon starting?): {source}", .dir.display())]
    LockShared {
        dir: PathBuf,
        #[source]
        source: nix::errno::Errno,
    },
    #[error("cannot lock the DEL queue {}: {source}", .dir.display())]
    LockExclusive {
        dir: PathBuf,
        #[source]
        source: nix::errno::Errno,
    },
    #[error("the DEL queue {} already holds {MAX_ENTRIES} entries; the daemon must start and drain it", .dir.display())]
    Full { dir: PathBuf },
    #[error("cannot encode the DEL queue entry: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("DEL queue entry {} is corrupt: {source}", .path.display())]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("DEL queue entry {} is corrupt: {FORMAT_KEY} is not a format version", .path.display())]
    NotAFormatVersion { path: PathBuf },
    #[error("DEL queue entry {} is in format version {found}, written by a newer podnet plugin; this podnet reads format versions up to {QUEUE_FORMAT}. Its release is left to GC or the expiration timer; a daemon that reads format {found} replays it", .path.display())]
    NewerFormat { path: PathBuf, found: u64 },
    /// The entry parses, but names an attachment the API would refuse.
    #[error("DEL queue entry {} is unusable: {reason}", .path.display())]
    Unusable {
        path: PathBuf,
        #[source]
        reason: validate::Refusal,
    },
}

/// A failed file system call on the queue, saying what it was doing.
fn io(action: impl Into<String>) -> impl FnOnce(std::io::Error) -> QueueError {
    let action = action.into();
    move |source| QueueError::Io { action, source }
}

/// The queue directory that belongs to a daemon socket.
pub fn queue_dir(socket: &Path) -> PathBuf {
    socket
        .parent()
        .unwrap_or(Path::new("/"))
        .join("delete-queue")
}

/// The queue of one daemon socket.
pub struct DeleteQueue {
    dir: PathBuf,
}

/// A held queue lock (shared for writers, exclusive for the daemon).
pub struct QueueLock {
    _lock: Flock<File>,
}

impl DeleteQueue {
    /// The queue next to `socket`; creates the directory (0700) if needed, and
    /// makes an existing one that group or others can use root's alone again.
    pub fn open(socket: &Path) -> Result<DeleteQueue, QueueError> {
        let dir = queue_dir(socket);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io(format!("cannot create the DEL queue {}", dir.display())))?;
        let mode = std::fs::metadata(&dir)
            .map_err(io(format!("the DEL queue {}", dir.display())))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                .map_err(io(format!("cannot chmod the DEL queue {}", dir.display())))?;
        }
        Ok(DeleteQueue { dir })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn lock_file(&self) -> Result<File, QueueError> {
        let path = self.dir.join("lockfile");
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(io(format!("cannot open {}", path.display())))
    }

    /// Takes the lock shared, waiting at most `LOCK_TIMEOUT`.
    pub fn lock_shared(&self) -> Result<QueueLock, QueueError> {
        let deadline = Instant::now() + LOCK_TIMEOUT;
        let mut file = self.lock_file()?;
        loop {
            match Flock::lock(file, FlockArg::LockSharedNonblock) {
                Ok(lock) => return Ok(QueueLock { _lock: lock }),
                Err((f, nix::errno::Errno::EWOULDBLOCK)) if Instant::now() < deadline => {
                    file = f;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err((_, source)) => {
                    return Err(QueueError::LockShared {
                        dir: self.dir.clone(),
                        source,
                    });
                }
            }
        }
    }

    /// Takes the lock exclusively (the daemon, at start), waiting for writers.
    pub fn lock_exclusive(&self) -> Result<QueueLock, QueueError> {
        let file = self.lock_file()?;
        Flock::lock(file, FlockArg::LockExclusive)
            .map(|lock| QueueLock { _lock: lock })
            .map_err(|(_, source)| QueueError::LockExclusive {
                dir: self.dir.clone(),
                source,
            })
    }

    /// Records a release durably. Idempotent per attachment.
    pub fn enqueue(&self, req: &EndpointBatchDeleteRequest) -> Result<PathBuf, QueueError> {
        let mut entry = serde_json::to_value(req).map_err(QueueError::Encode)?;
        if let Some(fields) = entry.as_object_mut() {
            fields.insert(FORMAT_KEY.into(), QUEUE_FORMAT.into());
        }
        let body = serde_json::to_vec(&entry).map_err(QueueError::Encode)?;
        let name = entry_name(&req.container_id, &req.container_interface_name);
        let path = self.dir.join(&name);
        if !path.exists() && self.entries()?.len() >= MAX_ENTRIES {
            return Err(QueueError::Full {
                dir: self.dir.clone(),
            });
        }
        let tmp = self.dir.join(format!(".{name}.tmp"));
        crate::atomic_file::replace(&path, &tmp, &body, 0o600).map_err(io(format!(
            "cannot write the DEL queue entry {}",
            path.display()
        )))?;
        Ok(path)
    }

    /// The queued entries, oldest name first.
    pub fn entries(&self) -> Result<Vec<PathBuf>, QueueError> {
        self.files_ending(SUFFIX)
    }

    /// Sets an entry that cannot be used aside (`<hash>.bad`), so it is neither
    /// replayed again nor lost; returns the new path.
    pub fn set_aside(&self, entry: &Path) -> Result<PathBuf, QueueError> {
        let bad = entry.with_extension(BAD_EXTENSION);
        std::fs::rename(entry, &bad)
            .map_err(io(format!("cannot rename {} aside", entry.display())))?;
        Ok(bad)
    }

    /// The entries set aside, by name.
    pub fn unreadable_entries(&self) -> Result<Vec<PathBuf>, QueueError> {
        self.files_ending(&format!(".{BAD_EXTENSION}"))
    }

    fn files_ending(&self, suffix: &str) -> Result<Vec<PathBuf>, QueueError> {
        let mut out = Vec::new();
        let rd = std::fs::read_dir(&self.dir)
            .map_err(io(format!("cannot read {}", self.dir.display())))?;
        for entry in rd.flatten() {
            let p = entry.path();
            if p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(suffix) && !n.starts_with('.'))
            {
                out.push(p);
            }
        }
        out.sort();
        Ok(out)
    }

    /// Removes temporary files of writers that died before renaming (they never
    /// reported success, so nothing is lost).
    pub fn remove_partial_writes(&self) {
        if let Ok(rd) = std::fs::read_dir(&self.dir) {
            for entry in rd.flatten() {
                let name = entry.file_name().to_string_lossy().to_string();
                if name.starts_with('.') && name.ends_with(".tmp") {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
    }
}

/// Reads one entry. A file that does not parse, is in a newer format, or whose
/// attachment the API would refuse, is an error naming it.
pub fn read_entry(path: &Path) -> Result<EndpointBatchDeleteRequest, QueueError> {
    let data = std::fs::read(path).map_err(io(format!("cannot read {}", path.display())))?;
    let corrupt = |source| QueueError::Corrupt {
        path: path.to_path_buf(),
        source,
    };
    let entry: serde_json::Value = serde_json::from_slice(&data).map_err(corrupt)?;
    match entry.get(FORMAT_KEY).map(|v| v.as_u64().filter(|v| *v > 0)) {
        None => {}
        Some(None) => {
            return Err(QueueError::NotAFormatVersion {
                path: path.to_path_buf(),
            });
        }
        Some(Some(found)) if found > QUEUE_FORMAT => {
            return Err(QueueError::NewerFormat {
                path: path.to_path_buf(),
                found,
            });
        }
        Some(Some(_)) => {}
    }
    let req: EndpointBatchDeleteRequest = serde_json::from_value(entry).map_err(corrupt)?;
    validate::endpoint_delete(&req).map_err(|reason| QueueError::Unusable {
        path: path.to_path_buf(),
        reason,
    })?;
    Ok(req)
}

fn entry_name(container_id: &str, ifname: &str) -> String {
    let digest = Sha256::digest(format!("{container_id}:{ifname}").as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{hex}{SUFFIX}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_dir::TestDir;

    /// A socket path in a fresh directory (kept while the returned dir lives).
    fn tmp_socket() -> (TestDir, PathBuf) {
        let d = TestDir::new("dq");
        let sock = d.join("podnet.sock");
        (d, sock)
    }

    #[test]
    fn enqueue_is_idempotent_readable_and_versioned() {
        let (_dir, sock) = tmp_socket();
        let q = DeleteQueue::open(&sock).unwrap();
        let req = EndpointBatchDeleteRequest {
            container_id: "c1".into(),
            container_interface_name: "eth0".into(),
            ..Default::default()
        };
        let p1 = q.enqueue(&req).unwrap();
        let p2 = q.enqueue(&req).unwrap();
        assert_eq!(p1, p2);
        assert_eq!(q.entries().unwrap().len(), 1);
        assert_eq!(read_entry(&p1).unwrap(), req);
        // Entries carry their format.
        let path = p1;
        let written: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(written[FORMAT_KEY], serde_json::json!(QUEUE_FORMAT));
        // An entry as podnet wrote it before entries carried a version.
        std::fs::write(
            &path,
            br#"{"container-id":"c1","container-interface-name":"eth0"}"#,
        )
        .unwrap();
        assert_eq!(read_entry(&path).unwrap(), req);
        std::fs::write(
            &path,
            br#"{"format-version":1,"container-id":"c1","container-interface-name":"eth0"}"#,
        )
        .unwrap();
        assert_eq!(read_entry(&path).unwrap(), req);
    }

    #[test]
    fn a_newer_or_malformed_format_is_refused_with_the_versions() {
        let (_dir, sock) = tmp_socket();
        let q = DeleteQueue::open(&sock).unwrap();
        let path = q.dir().join("0000.delete");
        std::fs::write(&path, br#"{"format-version":2,"container-id":"c1"}"#).unwrap();
        let e = read_entry(&path).unwrap_err();
        assert!(matches!(e, QueueError::NewerFormat { found: 2, .. }), "{e}");
        let e = e.to_string();
        for part in [
            "0000.delete",
            "format version 2",
            "up to 1",
            "GC or the expiration timer",
        ] {
            assert!(e.contains(part), "{part}: {e}");
        }
        for bad in [r#""2""#, "0", "-1", "1.5", "null"] {
            std::fs::write(
                &path,
                format!(r#"{{"format-version":{bad},"container-id":"c1"}}"#),
            )
            .unwrap();
            let e = read_entry(&path).unwrap_err();
            assert!(
                matches!(e, QueueError::NotAFormatVersion { .. }),
                "{bad}: {e}"
            );
            assert!(
                e.to_string()
                    .contains("corrupt: format-version is not a format version"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn queue_is_bounded() {
        let (_dir, sock) = tmp_socket();
        let q = DeleteQueue::open(&sock).unwrap();
        for i in 0..MAX_ENTRIES {
            q.enqueue(&EndpointBatchDeleteRequest {
                container_id: format!("c{i}"),
                ..Default::default()
            })
            .unwrap();
        }
        let e = q.enqueue(&EndpointBatchDeleteRequest {
            container_id: "one-more".into(),
            ..Default::default()
        });
        assert!(e.unwrap_err().to_string().contains("256 entries"));
    }

    #[test]
    fn corrupt_and_partial_entries() {
        let (_dir, sock) = tmp_socket();
        let q = DeleteQueue::open(&sock).unwrap();
        let bad = q.dir().join("0000.delete");
        std::fs::write(&bad, b"{\"container-id\": ").unwrap();
        assert!(
            read_entry(&bad)
                .unwrap_err()
                .to_string()
                .contains("corrupt")
        );
        std::fs::write(q.dir().join(".x.delete.tmp"), b"partial").unwrap();
        q.remove_partial_writes();
        assert_eq!(q.entries().unwrap(), vec![bad.clone()]);
        let forged = q.dir().join("0001.delete");
        std::fs::write(&forged, br#"{"container-id": "../../x"}"#).unwrap();
        let e = read_entry(&forged).unwrap_err().to_string();
        assert!(e.contains("unusable: invalid container-id"), "{e}");
        std::fs::write(&forged, br#"{"container-interface-name": "eth0"}"#).unwrap();
        assert!(
            read_entry(&forged)
                .unwrap_err()
                .to_string()
                .contains("container-id")
        );
    }

    #[test]
    fn unusable_entries_are_set_aside_and_listed() {
        let (_dir, sock) = tmp_socket();
        let q = DeleteQueue::open(&sock).unwrap();
        let good = q
            .enqueue(&EndpointBatchDeleteRequest {
                container_id: "c1".into(),
                ..Default::default()
            })
            .unwrap();
        let bad = q.dir().join("00000000.delete");
        std::fs::write(&bad, b"garbage").unwrap();
        assert_eq!(q.unreadable_entries().unwrap(), Vec::<PathBuf>::new());
        let aside = q.set_aside(&bad).unwrap();
        assert_eq!(aside, q.dir().join("00000000.bad"));
        assert!(!bad.exists() && aside.exists());
        assert_eq!(q.entries().unwrap(), vec![good]);
        assert_eq!(q.unreadable_entries().unwrap(), vec![aside.clone()]);
        assert!(
            q.set_aside(&bad)
                .unwrap_err()
                .to_string()
                .contains("cannot rename")
        );
        std::fs::remove_file(&aside).unwrap();
        assert!(q.unreadable_entries().unwrap().is_empty());
    }

    #[test]
    fn exclusive_lock_blocks_writers() {
        let (_dir, sock) = tmp_socket();
        let q = DeleteQueue::open(&sock).unwrap();
        let held = q.lock_exclusive().unwrap();
        let t = Instant::now();
        assert!(q.lock_shared().is_err());
        assert!(t.elapsed() >= LOCK_TIMEOUT);
        drop(held);
        assert!(q.lock_shared().is_ok());
    }
}
