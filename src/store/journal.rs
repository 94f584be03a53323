//! The redb-backed journal. Writes are batched into one transaction per API request
//! and committed durably before the daemon answers. A failed commit (a full disk)
//! takes the journal out of service until it is reopened; the file is checked page
//! by page when it is opened. The journal carries its format version
//! ([`JOURNAL_FORMAT`]); one written by a newer podnet is refused before anything
//! writes to it.

use std::net::IpAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, TableError};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::records::{AllocationRecord, EndpointRecord, allocation_key, now_ms};

const ALLOCATIONS_NAME: &str = "allocations";
const ALLOCATIONS: TableDefinition<&str, &[u8]> = TableDefinition::new(ALLOCATIONS_NAME);
const ENDPOINTS: TableDefinition<&str, &[u8]> = TableDefinition::new("endpoints");
/// The journal's page cache: the daemon keeps its state in memory and reads the
/// journal only at start; commits touch a path of pages each (a full /16: 4 MiB
/// held 3.5 MiB more than 1 MiB, and filling it through the API took as long).
const JOURNAL_CACHE_BYTES: usize = 1024 * 1024;
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

/// The journal format this podnet writes, and the newest it reads. Version 1 is
/// also every journal without a version (written before journals carried one).
/// A change an older podnet would misread (a record or key whose meaning
/// changes, a field it must not ignore) takes the next version; a field older
/// podnets may ignore does not (docs/crash-safety.md, "On-disk formats").
pub const JOURNAL_FORMAT: u64 = 1;

/// Why the journal could not be used. Every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "journal {path} cannot be opened: {detail}. If the file is damaged, restart the daemon with --rebuild-from-kernel: it moves the file aside and rebuilds the allocations from the pods' host links and routes"
    )]
    Open { path: PathBuf, detail: String },
    #[error("journal {path}: {detail}")]
    Io { path: PathBuf, detail: String },
    #[error(
        "journal {path}: record {key:?} in table {table} is corrupt: {detail}. Restart the daemon with --rebuild-from-kernel to move the journal aside and rebuild the allocations from the pods' host links and routes"
    )]
    Corrupt {
        path: PathBuf,
        table: &'static str,
        key: String,
        detail: String,
    },
    #[error(
        "journal {path} is in format version {found}, written by a newer podnet; this podnet reads format versions up to {understood}. Nothing was changed. Run a podnet that reads format {found} (the release that wrote it, or a newer one); or, to run this one, move the file aside (keep it: a podnet that reads format {found} can use it again) and start again: the daemon then adopts every running pod's addresses from its host link, and loses what only the journal knew (addresses cooling down after a release, attachments not wired yet, and the node's CIDRs unless the router device still holds its addresses)"
    )]
    NewerFormat {
        path: PathBuf,
        found: u64,
        understood: u64,
    },
}

/// One change to the journal.
#[derive(Debug, Clone, PartialEq)]
pub enum JournalOp {
    PutAllocation(AllocationRecord),
    DeleteAllocation {
        pool: String,
        ip: IpAddr,
    },
    PutEndpoint(EndpointRecord),
    DeleteEndpoint {
        container_id: String,
        ifname: String,
    },
    /// A named JSON document (e.g. the node resource).
    /// Removes a named JSON document.
    DeleteMeta {
        key: String,
    },
    PutMeta {
        key: String,
        value: serde_json::Value,
    },
}

/// What the journal holds besides the allocations, as read at start (the
/// allocations, one record per address, are read with `for_each_allocation`
/// instead of being held twice).
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    pub endpoints: Vec<EndpointRecord>,
    pub meta: Vec<(String, serde_json::Value)>,
}

/// Meta keys the journal keeps for itself (not part of the snapshot).
const META_JOURNAL_ID: &str = "journal-id";
const META_JOURNAL_SEQ: &str = "journal-seq";
const META_FORMAT: &str = "format-version";
/// How often, at most, a failed journal is reopened.
const REOPEN_INTERVAL: Duration = Duration::from_secs(1);

/// A journal's identity as stored: its id and the sequence number of its last
/// commit.
type Identity = (String, u64);

/// Why the journal stopped taking commits, and since when.
#[derive(Debug, Clone)]
pub struct JournalFailure {
    pub message: String,
    pub since_ms: u64,
    /// The filesystem under the journal is full (ENOSPC).
    pub no_space: bool,
}

/// The open journal. Each commit carries a sequence number, so a host link marked
/// with (journal id, seq) says which journal handed out its addresses and when.
pub struct Journal {
    /// None while the journal is failed and not yet reopened.
    db: Option<Database>,
    path: PathBuf,
    id: String,
    seq: u64,
    seq_at_open: u64,
    created: bool,
    failure: Option<JournalFailure>,
    last_reopen: Option<Instant>,
}

impl Journal {
    /// Opens (or creates) the journal file and reads it. redb checks every page's
    /// checksum first, so a damaged file is an error here, never a panic later,
    /// and every allocation record is decoded once (and dropped), so a record
    /// that does not decode is an error here too. A missing or empty file starts
    /// a new journal (`created()` says so). A journal in a newer format than
    /// [`JOURNAL_FORMAT`] is refused before anything writes to it; an older one
    /// is read and marked with the current version.
    pub fn open(path: &Path) -> Result<(Journal, Snapshot), StoreError> {
        let created = std::fs::metadata(path).map_or(true, |m| m.len() == 0);
        let checked = created || refuse_newer_format_on_a_copy(path)?;
        let db = open_db(path)?;
        if !checked {
            check_format(path, &db)?;
        }
        let mut j = Journal {
            db: Some(db),
            path: path.to_path_buf(),
            id: String::new(),
            seq: 0,
            seq_at_open: 0,
            created,
            failure: None,
            last_reopen: None,
        };
        // Make sure the tables exist, so reads of a fresh journal succeed.
        j.write(&[])?;
        let (snapshot, identity, format) = j.read_all()?;
        let has_identity = identity.is_some();
        match identity {
            Some((id, seq)) => {
                j.id = id;
                j.seq = seq;
            }
            // New, or written by a podnet that kept no identity.
            None => j.id = new_journal_id(),
        }
        if !has_identity || format != Some(JOURNAL_FORMAT) {
            j.commit(&[JournalOp::PutMeta {
                key: META_FORMAT.into(),
                value: serde_json::Value::from(JOURNAL_FORMAT),
            }])?;
        }
        j.seq_at_open = j.seq;
        Ok((j, snapshot))
    }

    /// The file behind the journal.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// This journal's identity (random, made when the file was created).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The sequence number of the last commit.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The sequence number the journal had when it was opened.
    pub fn seq_at_open(&self) -> u64 {
        self.seq_at_open
    }

    /// True when the file was missing or empty at open: the journal knows nothing
    /// of what ran before.
    pub fn created(&self) -> bool {
        self.created
    }

    /// Why commits fail, while they do.
    pub fn failure(&self) -> Option<&JournalFailure> {
        self.failure.as_ref()
    }

    fn io(&self, e: impl std::fmt::Display) -> StoreError {
        StoreError::Io {
            path: self.path.clone(),
            detail: e.to_string(),
        }
    }

    /// Applies `ops` in one durable transaction with the next sequence number. A
    /// failed commit takes the journal out of service until `reopen` succeeds (redb
    /// refuses every later transaction after an I/O error).
    pub fn commit(&mut self, ops: &[JournalOp]) -> Result<(), StoreError> {
        if let Some(f) = &self.failure {
            return Err(self.io(format!(
                "{} (since {} ms ago; the daemon retries)",
                f.message,
                now_ms().saturating_sub(f.since_ms)
            )));
        }
        let next = self.seq + 1;
        let mut all = ops.to_vec();
        all.push(JournalOp::PutMeta {
            key: META_JOURNAL_ID.into(),
            value: serde_json::Value::String(self.id.clone()),
        });
        all.push(JournalOp::PutMeta {
            key: META_JOURNAL_SEQ.into(),
            value: serde_json::Value::from(next),
        });
        match self.write(&all) {
            Ok(()) => {
                self.seq = next;
                Ok(())
            }
            Err(e) => {
                let message = e.to_string();
                self.failure = Some(JournalFailure {
                    no_space: is_no_space(&message),
                    message,
                    since_ms: now_ms(),
                });
                // redb must be closed and opened again after an I/O error.
                self.db = None;
                Err(e)
            }
        }
    }

    /// Opens a failed journal again (at most once per second) and reads it, so the
    /// caller can check it against what it holds in memory. Clears the failure on
    /// success.
    pub fn reopen(&mut self) -> Option<Result<Snapshot, StoreError>> {
        self.failure.as_ref()?;
        if self
            .last_reopen
            .is_some_and(|t| t.elapsed() < REOPEN_INTERVAL)
        {
            return None;
        }
        self.last_reopen = Some(Instant::now());
        let result = open_db(&self.path).and_then(|db| {
            self.db = Some(db);
            self.read_all()
        });
        Some(match result {
            Ok((snapshot, identity, _)) => {
                if let Some((_, seq)) = identity {
                    self.seq = self.seq.max(seq);
                }
                self.failure = None;
                Ok(snapshot)
            }
            Err(e) => {
                self.db = None;
                if let Some(f) = self.failure.as_mut() {
                    f.message = e.to_string();
                    f.no_space = is_no_space(&f.message);
                }
                Err(e)
            }
        })
    }

    fn db(&self) -> Result<&Database, StoreError> {
        self.db
            .as_ref()
            .ok_or_else(|| self.io("the journal is closed after an I/O error"))
    }

    fn write(&self, ops: &[JournalOp]) -> Result<(), StoreError> {
        let txn = self.db()?.begin_write().map_err(|e| self.io(e))?;
        {
            let mut allocs = txn.open_table(ALLOCATIONS).map_err(|e| self.io(e))?;
            let mut eps = txn.open_table(ENDPOINTS).map_err(|e| self.io(e))?;
            let mut meta = txn.open_table(META).map_err(|e| self.io(e))?;
            for op in ops {
                match op {
                    JournalOp::PutAllocation(r) => {
                        let v = self.encode(r)?;
                        allocs
                            .insert(r.key().as_str(), v.as_slice())
                            .map_err(|e| self.io(e))?;
                    }
                    JournalOp::DeleteAllocation { pool, ip } => {
                        allocs
                            .remove(allocation_key(pool, ip).as_str())
                            .map_err(|e| self.io(e))?;
                    }
                    JournalOp::PutEndpoint(r) => {
                        let v = self.encode(r)?;
                        eps.insert(r.key().as_str(), v.as_slice())
                            .map_err(|e| self.io(e))?;
                    }
                    JournalOp::DeleteEndpoint {
                        container_id,
                        ifname,
                    } => {
                        eps.remove(EndpointRecord::key_of(container_id, ifname).as_str())
                            .map_err(|e| self.io(e))?;
                    }
                    JournalOp::DeleteMeta { key } => {
                        meta.remove(key.as_str()).map_err(|e| self.io(e))?;
                    }
                    JournalOp::PutMeta { key, value } => {
                        let v = self.encode(value)?;
                        meta.insert(key.as_str(), v.as_slice())
                            .map_err(|e| self.io(e))?;
                    }
                }
            }
        }
        txn.commit().map_err(|e| self.io(e))
    }

    fn encode<T: Serialize>(&self, v: &T) -> Result<Vec<u8>, StoreError> {
        serde_json::to_vec(v).map_err(|e| self.io(e))
    }

    /// Hands every allocation record to `f`, in key order, one at a time. A
    /// record that does not decode is an error naming it; so is `f`'s.
    pub fn for_each_allocation<E: From<StoreError>>(
        &self,
        mut f: impl FnMut(AllocationRecord) -> Result<(), E>,
    ) -> Result<(), E> {
        let txn = self.db()?.begin_read().map_err(|e| self.io(e))?;
        let table = txn.open_table(ALLOCATIONS).map_err(|e| self.io(e))?;
        for entry in table.iter().map_err(|e| self.io(e))? {
            let (k, v) = entry.map_err(|e| self.io(e))?;
            let rec = self.decode(ALLOCATIONS_NAME, k.value(), v.value())?;
            f(rec)?;
        }
        Ok(())
    }

    /// Every allocation record, collected (tests).
    #[cfg(test)]
    pub fn all_allocations(&self) -> Vec<AllocationRecord> {
        let mut out = Vec::new();
        self.for_each_allocation(|r| {
            out.push(r);
            Ok::<_, StoreError>(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
        out
    }

    /// Reads the endpoints and meta records, checks that every allocation record
    /// decodes, and returns the journal's identity (id, seq) and its format
    /// version, if it has them. A record that does not decode is an error naming
    /// it: the daemon refuses to guess.
    fn read_all(&self) -> Result<(Snapshot, Option<Identity>, Option<u64>), StoreError> {
        let txn = self.db()?.begin_read().map_err(|e| self.io(e))?;
        let mut meta: Vec<(String, serde_json::Value)> = self.read_table(&txn, META, "meta")?;
        let take = |meta: &mut Vec<(String, serde_json::Value)>, key: &str| {
            meta.iter()
                .position(|(k, _)| k == key)
                .map(|i| meta.remove(i).1)
        };
        let id = take(&mut meta, META_JOURNAL_ID);
        let seq = take(&mut meta, META_JOURNAL_SEQ);
        let format = take(&mut meta, META_FORMAT)
            .map(|v| format_number(&self.path, &v))
            .transpose()?;
        let identity = match (id, seq) {
            (Some(serde_json::Value::String(id)), Some(seq)) if !id.is_empty() => {
                let seq = seq.as_u64().ok_or_else(|| StoreError::Corrupt {
                    path: self.path.clone(),
                    table: "meta",
                    key: META_JOURNAL_SEQ.into(),
                    detail: format!("{seq} is not a sequence number"),
                })?;
                Some((id, seq))
            }
            _ => None,
        };
        let allocations = txn.open_table(ALLOCATIONS).map_err(|e| self.io(e))?;
        for entry in allocations.iter().map_err(|e| self.io(e))? {
            let (k, v) = entry.map_err(|e| self.io(e))?;
            self.decode::<AllocationRecord>(ALLOCATIONS_NAME, k.value(), v.value())?;
        }
        let snapshot = Snapshot {
            endpoints: self
                .read_table(&txn, ENDPOINTS, "endpoints")?
                .into_iter()
                .map(|(_, v)| v)
                .collect(),
            meta,
        };
        Ok((snapshot, identity, format))
    }

    fn read_table<T: DeserializeOwned>(
        &self,
        txn: &redb::ReadTransaction,
        def: TableDefinition<&str, &[u8]>,
        name: &'static str,
    ) -> Result<Vec<(String, T)>, StoreError> {
        let table = txn.open_table(def).map_err(|e| self.io(e))?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(|e| self.io(e))? {
            let (k, v) = entry.map_err(|e| self.io(e))?;
            let value = self.decode(name, k.value(), v.value())?;
            out.push((k.value().to_string(), value));
        }
        Ok(out)
    }

    fn decode<T: DeserializeOwned>(
        &self,
        table: &'static str,
        key: &str,
        value: &[u8],
    ) -> Result<T, StoreError> {
        serde_json::from_slice(value).map_err(|e| StoreError::Corrupt {
            path: self.path.clone(),
            table,
            key: key.to_string(),
            detail: e.to_string(),
        })
    }
}

/// Opens the file with redb's integrity check: every page of the committed trees is
/// verified against its checksum before anything is trusted (a plain open may panic
/// on a damaged page).
fn open_db(path: &Path) -> Result<Database, StoreError> {
    // A small page cache: the daemon keeps its state in memory and reads the
    // journal only at start (redb's default cache grows to 1 GiB).
    let db = redb::Builder::new()
        .set_cache_size(JOURNAL_CACHE_BYTES)
        .set_check_integrity_on_open(true)
        .create(path)
        .map_err(|e| StoreError::Open {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
    // Root's alone: it names every pod and its addresses.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|e| {
        StoreError::Open {
            path: path.to_path_buf(),
            detail: format!("cannot make it mode 0600: {e}"),
        }
    })?;
    Ok(db)
}

/// Refuses a journal in a newer format without changing a byte of it: redb
/// rewrites its allocator state when it opens a file for writing (and its
/// read-only open has no integrity check, so it may panic on a damaged file), so
/// the version is read from a private copy next to the file, removed after.
/// False when no copy could be made (a full disk): the caller checks the file
/// itself before its first write.
fn refuse_newer_format_on_a_copy(path: &Path) -> Result<bool, StoreError> {
    let copy = path.with_extension(format!("redb.format-check-{}", std::process::id()));
    let copied = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&copy)
        .and_then(|mut to| std::io::copy(&mut std::fs::File::open(path)?, &mut to));
    let result = match copied {
        Ok(_) => match open_db(&copy) {
            Ok(db) => check_format(path, &db).map(|()| true),
            // Not readable at all: the open of the file itself says why.
            Err(_) => Ok(true),
        },
        Err(e) => {
            tracing::warn!(journal = %path.display(), error = %e, "cannot copy the journal to read its format version; reading it in place");
            Ok(false)
        }
    };
    let _ = std::fs::remove_file(&copy);
    result
}

/// Refuses a journal whose format version is newer than [`JOURNAL_FORMAT`]
/// (reads only).
fn check_format(path: &Path, db: &impl ReadableDatabase) -> Result<(), StoreError> {
    let io = |e: &dyn std::fmt::Display| StoreError::Io {
        path: path.to_path_buf(),
        detail: e.to_string(),
    };
    let txn = db.begin_read().map_err(|e| io(&e))?;
    let meta = match txn.open_table(META) {
        Ok(table) => table,
        Err(TableError::TableDoesNotExist(_)) => return Ok(()),
        Err(e) => return Err(io(&e)),
    };
    let Some(stored) = meta.get(META_FORMAT).map_err(|e| io(&e))? else {
        return Ok(());
    };
    let value: serde_json::Value =
        serde_json::from_slice(stored.value()).map_err(|e| StoreError::Corrupt {
            path: path.to_path_buf(),
            table: "meta",
            key: META_FORMAT.into(),
            detail: e.to_string(),
        })?;
    match format_number(path, &value)? {
        found if found > JOURNAL_FORMAT => Err(StoreError::NewerFormat {
            path: path.to_path_buf(),
            found,
            understood: JOURNAL_FORMAT,
        }),
        _ => Ok(()),
    }
}

/// The format version a meta value holds (a positive integer).
fn format_number(path: &Path, value: &serde_json::Value) -> Result<u64, StoreError> {
    value
        .as_u64()
        .filter(|v| *v > 0)
        .ok_or_else(|| StoreError::Corrupt {
            path: path.to_path_buf(),
            table: "meta",
            key: META_FORMAT.into(),
            detail: format!("{value} is not a format version"),
        })
}

/// 16 hex digits, random.
fn new_journal_id() -> String {
    let id = uuid::Uuid::new_v4().as_u128();
    format!("{:016x}", (id >> 64) as u64 ^ id as u64)
}

/// ENOSPC, as redb reports it (it keeps only the text of the I/O error).
fn is_no_space(message: &str) -> bool {
    message.contains(&format!("os error {}", libc::ENOSPC))
        || message.contains("No space left on device")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::records::AllocationState;
    use crate::test_dir::TestDir;

    fn rec(ip: &str) -> AllocationRecord {
        AllocationRecord {
            ip: ip.parse().unwrap(),
            family: crate::ipam::Family::V4,
            pool: "default".into(),
            owner: "ns/pod".into(),
            container_id: Some("c1".into()),
            ifname: Some("eth0".into()),
            network: Some("podnet".into()),
            state: AllocationState::Pending,
            expiration_uuid: Some("u".into()),
            expires_at_ms: Some(now_ms() + 1000),
            allocated_at_ms: now_ms(),
            host_ifname: None,
            cooling_until_ms: None,
            selected_by: None,
            pod_uid: None,
        }
    }

    #[test]
    fn commit_survives_reopen() {
        let dir = TestDir::new("journal");
        let path = dir.join("journal.redb");
        {
            let (mut j, _) = Journal::open(&path).unwrap();
            j.commit(&[
                JournalOp::PutAllocation(rec("10.0.0.2")),
                JournalOp::PutAllocation(rec("10.0.0.3")),
            ])
            .unwrap();
            j.commit(&[JournalOp::DeleteAllocation {
                pool: "default".into(),
                ip: "10.0.0.2".parse().unwrap(),
            }])
            .unwrap();
            j.commit(&[JournalOp::PutMeta {
                key: "node".into(),
                value: serde_json::json!({"a": 1}),
            }])
            .unwrap();
        }
        let (j, s) = Journal::open(&path).unwrap();
        let allocations = j.all_allocations();
        assert_eq!(allocations.len(), 1);
        assert_eq!(allocations[0].ip.to_string(), "10.0.0.3");
        assert_eq!(s.meta.len(), 1, "{:?}", s.meta);
        assert_eq!(s.meta[0].0, "node");
    }

    #[test]
    fn identity_and_sequence_survive_reopen() {
        let dir = TestDir::new("journal");
        let path = dir.join("journal.redb");
        let (id, seq) = {
            let (mut j, _) = Journal::open(&path).unwrap();
            assert!(j.created());
            assert_eq!(j.id().len(), 16);
            let before = j.seq();
            j.commit(&[JournalOp::PutAllocation(rec("10.0.0.2"))])
                .unwrap();
            assert_eq!(j.seq(), before + 1);
            (j.id().to_string(), j.seq())
        };
        let (j, _) = Journal::open(&path).unwrap();
        assert!(!j.created());
        assert_eq!(j.id(), id);
        assert_eq!(j.seq(), seq);
        assert_eq!(j.seq_at_open(), seq);
        // An empty file is a new journal with a new identity.
        drop(j);
        std::fs::write(&path, b"").unwrap();
        let (j, s) = Journal::open(&path).unwrap();
        assert!(j.created());
        assert_ne!(j.id(), id);
        assert!(s.endpoints.is_empty() && s.meta.is_empty());
        assert!(j.all_allocations().is_empty());
    }

    #[test]
    fn garbage_file_is_refused_with_its_name() {
        let dir = TestDir::new("journal");
        let path = dir.join("journal.redb");
        std::fs::write(
            &path,
            b"this is not a redb file at all, not even close................",
        )
        .unwrap();
        let err = Journal::open(&path).err().unwrap().to_string();
        assert!(err.contains("journal.redb"), "{err}");
        assert!(err.contains("--rebuild-from-kernel"), "{err}");
    }

    /// A journal with a few hundred records, closed cleanly.
    fn populated(path: &Path) -> usize {
        let (mut j, _) = Journal::open(path).unwrap();
        for chunk in 0..8u32 {
            let ops: Vec<JournalOp> = (0..50u32)
                .map(|i| {
                    let n = chunk * 50 + i;
                    JournalOp::PutAllocation(rec(&format!("10.1.{}.{}", n / 250, n % 250 + 1)))
                })
                .collect();
            j.commit(&ops).unwrap();
        }
        400
    }

    /// Damage anywhere in the file: zeroed pages and flipped bytes at every page
    /// give a clear error or a journal that reads back, never a panic (this test
    /// runs with unwinding: a panic inside redb fails it).
    #[test]
    fn damaged_pages_give_an_error_never_a_panic() {
        let dir = TestDir::new("journal");
        let clean = dir.join("clean.redb");
        let records = populated(&clean);
        let original = std::fs::read(&clean).unwrap();
        let pages = original.len().div_ceil(4096);
        let path = dir.join("journal.redb");
        let mut outcomes = (0, 0);
        for page in 0..pages {
            let start = page * 4096;
            let end = (start + 4096).min(original.len());
            let damages: [fn(&mut [u8]); 4] = [
                |b| b.fill(0),
                |b| b[0] ^= 0xff,
                |b| {
                    let mid = b.len() / 2;
                    b[mid] ^= 0x01
                },
                |b| {
                    let last = b.len() - 1;
                    b[last] ^= 0x80
                },
            ];
            for damage in damages {
                let mut bytes = original.clone();
                damage(&mut bytes[start..end]);
                std::fs::write(&path, &bytes).unwrap();
                match Journal::open(&path) {
                    Ok((j, _)) => {
                        // Unused space may be damaged harmlessly; what reads back
                        // is whole.
                        assert!(j.all_allocations().len() <= records, "page {page}");
                        outcomes.0 += 1;
                    }
                    Err(e) => {
                        let msg = e.to_string();
                        assert!(msg.contains("journal.redb"), "page {page}: {msg}");
                        assert!(msg.contains("--rebuild-from-kernel"), "page {page}: {msg}");
                        outcomes.1 += 1;
                    }
                }
            }
        }
        assert!(
            outcomes.1 > 0,
            "no damage was detected at all: {outcomes:?}"
        );
    }

    #[test]
    fn a_record_that_does_not_decode_is_refused_at_open_with_its_key() {
        let dir = TestDir::new("journal");
        let path = dir.join("journal.redb");
        {
            let (j, _) = Journal::open(&path).unwrap();
            let txn = j.db().unwrap().begin_write().unwrap();
            txn.open_table(ALLOCATIONS)
                .unwrap()
                .insert("default/10.0.0.9", b"{\"ip\": 5}".as_slice())
                .unwrap();
            txn.commit().unwrap();
        }
        let err = Journal::open(&path).err().unwrap().to_string();
        assert!(err.contains("default/10.0.0.9"), "{err}");
        assert!(err.contains("--rebuild-from-kernel"), "{err}");
    }

    /// Writes `value` under the format key, as another podnet would have.
    fn put_format(path: &Path, value: &[u8]) {
        let db = redb::Database::create(path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META)
            .unwrap()
            .insert(META_FORMAT, value)
            .unwrap();
        txn.commit().unwrap();
    }

    #[test]
    fn a_journal_without_a_version_is_format_1_read_whole_and_marked() {
        let dir = TestDir::new("journal");
        let path = dir.join("journal.redb");
        let id = {
            let (mut j, _) = Journal::open(&path).unwrap();
            j.commit(&[JournalOp::PutAllocation(rec("10.0.0.2"))])
                .unwrap();
            let txn = j.db().unwrap().begin_write().unwrap();
            txn.open_table(META).unwrap().remove(META_FORMAT).unwrap();
            txn.commit().unwrap();
            j.id().to_string()
        };
        {
            let db = redb::Database::create(&path).unwrap();
            let txn = db.begin_read().unwrap();
            assert!(
                txn.open_table(META)
                    .unwrap()
                    .get(META_FORMAT)
                    .unwrap()
                    .is_none()
            );
        }
        let (j, s) = Journal::open(&path).unwrap();
        assert_eq!(j.id(), id);
        assert_eq!(j.all_allocations(), vec![rec_like(&j, "10.0.0.2")]);
        assert!(s.meta.iter().all(|(k, _)| k != META_FORMAT), "{:?}", s.meta);
        let txn = j.db().unwrap().begin_read().unwrap();
        let table = txn.open_table(META).unwrap();
        let stored = table.get(META_FORMAT).unwrap().unwrap();
        assert_eq!(stored.value(), JOURNAL_FORMAT.to_string().as_bytes());
    }

    /// The record `rec(ip)` as the journal holds it (its times are the journal's).
    fn rec_like(j: &Journal, ip: &str) -> AllocationRecord {
        let stored = j.all_allocations();
        let found = stored.iter().find(|r| r.ip.to_string() == ip).unwrap();
        AllocationRecord {
            expires_at_ms: found.expires_at_ms,
            allocated_at_ms: found.allocated_at_ms,
            ..rec(ip)
        }
    }

    #[test]
    fn a_new_journal_carries_the_current_format() {
        let dir = TestDir::new("journal");
        let path = dir.join("journal.redb");
        let (j, s) = Journal::open(&path).unwrap();
        assert!(s.meta.is_empty());
        assert_eq!(
            j.db().map(|db| check_format(&path, db).is_ok()).ok(),
            Some(true)
        );
        let txn = j.db().unwrap().begin_read().unwrap();
        let table = txn.open_table(META).unwrap();
        assert_eq!(
            table.get(META_FORMAT).unwrap().unwrap().value(),
            b"1".as_slice()
        );
    }

    #[test]
    fn a_newer_format_is_refused_with_both_versions_and_the_file_untouched() {
        let dir = TestDir::new("journal");
        let path = dir.join("journal.redb");
        {
            let (mut j, _) = Journal::open(&path).unwrap();
            j.commit(&[JournalOp::PutAllocation(rec("10.0.0.2"))])
                .unwrap();
        }
        put_format(&path, b"2");
        let before = std::fs::read(&path).unwrap();
        let err = Journal::open(&path).err().unwrap();
        assert!(
            matches!(
                err,
                StoreError::NewerFormat {
                    found: 2,
                    understood: JOURNAL_FORMAT,
                    ..
                }
            ),
            "{err:?}"
        );
        let msg = err.to_string();
        for part in [
            "journal.redb",
            "format version 2",
            "up to 1",
            "Nothing was changed",
            "move the file aside",
        ] {
            assert!(msg.contains(part), "{part}: {msg}");
        }
        assert_eq!(std::fs::read(&path).unwrap(), before, "the file changed");
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(
            left,
            vec![std::ffi::OsString::from("journal.redb")],
            "the copy is left"
        );
    }

    #[test]
    fn every_version_above_the_current_is_refused_and_none_up_to_it() {
        let dir = TestDir::new("journal");
        let path = dir.join("journal.redb");
        for (stored, refused) in [
            ("1", false),
            ("2", true),
            ("7", true),
            ("18446744073709551615", true),
        ] {
            put_format(&path, stored.as_bytes());
            let db = open_db(&path).unwrap();
            let result = check_format(&path, &db);
            assert_eq!(
                matches!(result, Err(StoreError::NewerFormat { found, .. }) if found.to_string() == stored),
                refused,
                "{stored}: {result:?}"
            );
            assert_eq!(result.is_ok(), !refused, "{stored}");
        }
    }

    #[test]
    fn a_format_that_is_not_a_version_is_corrupt_with_its_key() {
        for bad in [b"\"two\"".as_slice(), b"0", b"-1", b"1.5", b"{"] {
            let dir = TestDir::new("journal");
            let path = dir.join("journal.redb");
            put_format(&path, bad);
            let err = Journal::open(&path).err().unwrap();
            let msg = err.to_string();
            assert!(matches!(err, StoreError::Corrupt { .. }), "{msg}");
            assert!(msg.contains(META_FORMAT), "{msg}");
            assert!(msg.contains("--rebuild-from-kernel"), "{msg}");
        }
    }

    #[test]
    fn no_space_is_recognised() {
        assert!(is_no_space(
            "journal /x: I/O error: No space left on device (os error 28)"
        ));
        assert!(!is_no_space(
            "journal /x: I/O error: Input/output error (os error 5)"
        ));
    }
}
