//! The journal phase: which journal the daemon starts from and the node
//! resource it holds ([`open_journal`]). A journal that cannot be read is refused,
//! or, with `--rebuild-from-kernel`, moved aside (never deleted) and an empty one
//! started; one written by a newer podnet is refused either way. The files are
//! reached through [`JournalStore`], so each choice is tested with a fake.

use std::path::{Path, PathBuf};

use crate::daemon::state::{JournalOrigin, NODE_META_KEY};
use crate::node::NodeResource;
use crate::store::{Journal, Snapshot, StoreError, now_ms};

/// Why the journal could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum JournalOpenError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "journal {}: the node resource record is corrupt: {source}. Restart the daemon with --rebuild-from-kernel to move the journal aside and rebuild the allocations from the pods' host links and routes",
        .path.display()
    )]
    CorruptNode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// `--rebuild-from-kernel`, and the unreadable journal could not be moved aside.
    #[error("{unreadable}; and it could not be moved aside: {source}")]
    MoveAside {
        unreadable: Box<JournalOpenError>,
        #[source]
        source: std::io::Error,
    },
}

/// The journal as opened, with the node resource it holds.
pub(super) struct OpenedJournal {
    pub(super) journal: Journal,
    pub(super) snapshot: Snapshot,
    pub(super) origin: JournalOrigin,
    pub(super) node: Option<NodeResource>,
}

/// Where the journal's file is opened and moved aside: the file system, or a
/// test's fake.
pub(super) trait JournalStore {
    /// Opens (or creates) the journal at `path`.
    fn open(&self, path: &Path) -> Result<(Journal, Snapshot), StoreError>;
    /// Renames the journal at `path` to `aside`.
    fn move_aside(&self, path: &Path, aside: &Path) -> std::io::Result<()>;
}

/// The journal's file on the file system.
pub(super) struct JournalFiles;

impl JournalStore for JournalFiles {
    fn open(&self, path: &Path) -> Result<(Journal, Snapshot), StoreError> {
        Journal::open(path)
    }

    fn move_aside(&self, path: &Path, aside: &Path) -> std::io::Result<()> {
        std::fs::rename(path, aside)
    }
}

/// Opens and reads the journal, including the node resource it holds. With
/// `rebuild`, a journal that cannot be read for any reason (a damaged file, a
/// record or the node resource that does not decode) is moved aside (never
/// deleted) and an empty one started.
pub(super) fn open_journal(
    store: &impl JournalStore,
    path: &Path,
    rebuild: bool,
) -> Result<OpenedJournal, JournalOpenError> {
    let read = match store.open(path) {
        // Written by a newer podnet: refused as it is, never moved aside.
        Err(e @ StoreError::NewerFormat { .. }) => return Err(e.into()),
        opened => opened,
    };
    let read = read.map_err(JournalOpenError::from).and_then(|(j, s)| {
        let node = stored_node(&s, &j)?;
        Ok((j, s, node))
    });
    match read {
        Ok((j, s, node)) => {
            let origin = if j.created() {
                JournalOrigin::Created
            } else {
                JournalOrigin::Existing
            };
            Ok(OpenedJournal {
                journal: j,
                snapshot: s,
                origin,
                node,
            })
        }
        Err(e) if rebuild => {
            let aside = path.with_extension(format!("redb.corrupt-{}", now_ms()));
            tracing::warn!(error = %e, aside = %aside.display(), "journal unreadable: moving it aside and rebuilding from the kernel");
            store
                .move_aside(path, &aside)
                .map_err(|source| JournalOpenError::MoveAside {
                    unreadable: Box::new(e),
                    source,
                })?;
            let (j, _) = store.open(path)?;
            Ok(OpenedJournal {
                journal: j,
                snapshot: Snapshot::default(),
                origin: JournalOrigin::Rebuilt,
                node: None,
            })
        }
        Err(e) => Err(e),
    }
}

/// The node resource the journal holds.
fn stored_node(
    snapshot: &Snapshot,
    journal: &Journal,
) -> Result<Option<NodeResource>, JournalOpenError> {
    snapshot
        .meta
        .iter()
        .find(|(k, _)| k == NODE_META_KEY)
        .map(|(_, v)| serde_json::from_value(v.clone()))
        .transpose()
        .map_err(|source| JournalOpenError::CorruptNode {
            path: journal.path().to_path_buf(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::daemon::start::StartError;
    use crate::daemon::start::tests::assert_fails_in;
    use crate::store::JournalOp;
    use crate::test_dir::TestDir;

    /// The file system, except where a test says otherwise: the first open's
    /// error, and a move aside that fails. Records the moves asked for.
    #[derive(Default)]
    struct FakeFiles {
        first_open: RefCell<Option<StoreError>>,
        refuse_move: bool,
        moves: RefCell<Vec<PathBuf>>,
    }

    impl JournalStore for FakeFiles {
        fn open(&self, path: &Path) -> Result<(Journal, Snapshot), StoreError> {
            match self.first_open.borrow_mut().take() {
                Some(e) => Err(e),
                None => Journal::open(path),
            }
        }

        fn move_aside(&self, path: &Path, aside: &Path) -> std::io::Result<()> {
            self.moves.borrow_mut().push(aside.to_path_buf());
            if self.refuse_move {
                return Err(std::io::Error::from_raw_os_error(libc::EACCES));
            }
            std::fs::rename(path, aside)
        }
    }

    fn journal_with_node(path: &Path, node: serde_json::Value) {
        let (mut j, _) = Journal::open(path).unwrap();
        j.commit(&[JournalOp::PutMeta {
            key: NODE_META_KEY.into(),
            value: node,
        }])
        .unwrap();
    }

    /// The files in `dir` whose name starts with `prefix`.
    fn files(dir: &Path, prefix: &str) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with(prefix))
            .collect()
    }

    /// Checks that `e` fails the start in the journal phase, saying `says`.
    fn assert_journal_fails(e: JournalOpenError, says: &[&str]) {
        assert_fails_in(&StartError::from(e), "journal", says);
    }

    #[test]
    fn a_new_journal_is_created_and_holds_no_node() {
        let dir = TestDir::new("start-journal");
        let opened = open_journal(&JournalFiles, &dir.join("journal.redb"), false).unwrap();
        assert_eq!(opened.origin, JournalOrigin::Created);
        assert!(opened.node.is_none());
    }

    #[test]
    fn an_existing_journal_gives_the_node_resource_it_holds() {
        let dir = TestDir::new("start-journal");
        let path = dir.join("journal.redb");
        let node = NodeResource::new("n1");
        journal_with_node(&path, serde_json::to_value(&node).unwrap());
        for rebuild in [false, true] {
            let opened = open_journal(&JournalFiles, &path, rebuild).unwrap();
            assert_eq!(opened.origin, JournalOrigin::Existing, "{rebuild}");
            assert_eq!(opened.node.as_ref(), Some(&node), "{rebuild}");
            assert_eq!(opened.snapshot.meta.len(), 1, "{rebuild}");
        }
    }

    #[test]
    fn a_corrupt_node_record_is_refused_naming_the_file_and_the_rebuild() {
        let dir = TestDir::new("start-journal");
        let path = dir.join("journal.redb");
        journal_with_node(&path, serde_json::json!("not a node"));
        let err = open_journal(&JournalFiles, &path, false).err().unwrap();
        assert!(
            matches!(err, JournalOpenError::CorruptNode { .. }),
            "{err:?}"
        );
        assert_journal_fails(
            err,
            &[
                &path.display().to_string(),
                "node resource record is corrupt",
                "--rebuild-from-kernel",
            ],
        );
        assert_eq!(files(&dir, "journal.redb.corrupt-"), Vec::<String>::new());
    }

    #[test]
    fn a_damaged_file_is_refused_naming_the_rebuild() {
        let dir = TestDir::new("start-journal");
        let path = dir.join("journal.redb");
        std::fs::write(&path, b"not a journal").unwrap();
        let err = open_journal(&JournalFiles, &path, false).err().unwrap();
        assert!(matches!(err, JournalOpenError::Store(_)), "{err:?}");
        assert_journal_fails(err, &["--rebuild-from-kernel"]);
        assert_eq!(std::fs::read(&path).unwrap(), b"not a journal");
    }

    #[test]
    fn with_rebuild_an_unreadable_journal_is_moved_aside_and_an_empty_one_started() {
        for unreadable in ["a damaged file", "a corrupt node record"] {
            let dir = TestDir::new("start-journal");
            let path = dir.join("journal.redb");
            match unreadable {
                "a damaged file" => std::fs::write(&path, b"not a journal").unwrap(),
                _ => journal_with_node(&path, serde_json::json!(42)),
            }
            let opened = open_journal(&JournalFiles, &path, true).unwrap();
            assert_eq!(opened.origin, JournalOrigin::Rebuilt, "{unreadable}");
            assert!(opened.node.is_none(), "{unreadable}");
            assert!(opened.snapshot.meta.is_empty(), "{unreadable}");
            let aside = files(&dir, "journal.redb.corrupt-");
            assert_eq!(aside.len(), 1, "{unreadable}: {aside:?}");
            let kept = dir.join(&aside[0]);
            match unreadable {
                "a damaged file" => assert_eq!(std::fs::read(&kept).unwrap(), b"not a journal"),
                _ => {
                    let (_, snapshot) = Journal::open(&kept).unwrap();
                    let node = (NODE_META_KEY.to_string(), serde_json::json!(42));
                    assert_eq!(snapshot.meta, [node], "the record is kept as it was");
                }
            }
        }
    }

    #[test]
    fn a_journal_of_a_newer_podnet_is_refused_and_never_moved_aside_even_with_rebuild() {
        let dir = TestDir::new("start-journal");
        let path = dir.join("journal.redb");
        for rebuild in [false, true] {
            let files = FakeFiles {
                first_open: RefCell::new(Some(StoreError::NewerFormat {
                    path: path.clone(),
                    found: 2,
                    understood: 1,
                })),
                ..FakeFiles::default()
            };
            let err = open_journal(&files, &path, rebuild).err().unwrap();
            assert!(
                matches!(err, JournalOpenError::Store(StoreError::NewerFormat { .. })),
                "{err:?}"
            );
            assert!(files.moves.borrow().is_empty(), "{rebuild}");
            assert_journal_fails(err, &["written by a newer podnet"]);
        }
    }

    #[test]
    fn an_unreadable_journal_that_cannot_be_moved_aside_says_both() {
        let dir = TestDir::new("start-journal");
        let path = dir.join("journal.redb");
        let files = FakeFiles {
            first_open: RefCell::new(Some(StoreError::Open {
                path: path.clone(),
                detail: "invalid header".into(),
            })),
            refuse_move: true,
            ..FakeFiles::default()
        };
        let err = open_journal(&files, &path, true).err().unwrap();
        assert!(matches!(err, JournalOpenError::MoveAside { .. }), "{err:?}");
        assert_eq!(files.moves.borrow().len(), 1);
        assert_journal_fails(
            err,
            &[
                "invalid header",
                "could not be moved aside",
                "Permission denied",
            ],
        );
    }
}
