//! The redb-backed journal. Writes are batched into one transaction per API request
//! and committed durably before the daemon answers.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::records::{AllocationRecord, EndpointRecord, allocation_key};

const ALLOCATIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("allocations");
const ENDPOINTS: TableDefinition<&str, &[u8]> = TableDefinition::new("endpoints");
/// The journal's page cache.
const JOURNAL_CACHE_BYTES: usize = 4 * 1024 * 1024;
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

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
}

/// One change to the journal.
#[derive(Debug, Clone)]
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

/// Everything the journal holds, as read at start.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    pub allocations: Vec<AllocationRecord>,
    pub endpoints: Vec<EndpointRecord>,
    pub meta: Vec<(String, serde_json::Value)>,
}

/// The open journal.
pub struct Journal {
    db: Database,
    path: PathBuf,
}

impl Journal {
    /// Opens (or creates) the journal file.
    pub fn open(path: &Path) -> Result<Journal, StoreError> {
        // A small page cache: the daemon keeps its state in memory and reads the
        // journal only at start (redb's default cache grows to 1 GiB).
        let db = redb::Builder::new()
            .set_cache_size(JOURNAL_CACHE_BYTES)
            .create(path)
            .map_err(|e| StoreError::Open {
                path: path.to_path_buf(),
                detail: e.to_string(),
            })?;
        let j = Journal {
            db,
            path: path.to_path_buf(),
        };
        // Make sure the tables exist, so reads of a fresh journal succeed.
        j.commit(&[])?;
        Ok(j)
    }

    /// The file behind the journal.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io(&self, e: impl std::fmt::Display) -> StoreError {
        StoreError::Io {
            path: self.path.clone(),
            detail: e.to_string(),
        }
    }

    /// Applies `ops` in one durable transaction.
    pub fn commit(&self, ops: &[JournalOp]) -> Result<(), StoreError> {
        let txn = self.db.begin_write().map_err(|e| self.io(e))?;
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

    /// Reads everything. A record that does not decode is an error naming it: the
    /// daemon refuses to guess.
    pub fn load(&self) -> Result<Snapshot, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.io(e))?;
        Ok(Snapshot {
            allocations: self
                .read_table(&txn, ALLOCATIONS, "allocations")?
                .into_iter()
                .map(|(_, v)| v)
                .collect(),
            endpoints: self
                .read_table(&txn, ENDPOINTS, "endpoints")?
                .into_iter()
                .map(|(_, v)| v)
                .collect(),
            meta: self.read_table(&txn, META, "meta")?,
        })
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
            let key = k.value().to_string();
            let value = serde_json::from_slice(v.value()).map_err(|e| StoreError::Corrupt {
                path: self.path.clone(),
                table: name,
                key: key.clone(),
                detail: e.to_string(),
            })?;
            out.push((key, value));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::records::{AllocationState, now_ms};

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
        }
    }

    #[test]
    fn commit_survives_reopen() {
        let dir = tempdir();
        let path = dir.join("journal.redb");
        {
            let j = Journal::open(&path).unwrap();
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
        let j = Journal::open(&path).unwrap();
        let s = j.load().unwrap();
        assert_eq!(s.allocations.len(), 1);
        assert_eq!(s.allocations[0].ip.to_string(), "10.0.0.3");
        assert_eq!(s.meta[0].0, "node");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn garbage_file_is_refused_with_its_name() {
        let dir = tempdir();
        let path = dir.join("journal.redb");
        std::fs::write(
            &path,
            b"this is not a redb file at all, not even close................",
        )
        .unwrap();
        let err = Journal::open(&path).err().unwrap().to_string();
        assert!(err.contains("journal.redb"), "{err}");
        assert!(err.contains("--rebuild-from-kernel"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn tempdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "podnet-journal-test-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
