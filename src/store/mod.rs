//! The journal: the daemon's durable record of every allocation, endpoint and the
//! node resource, in an embedded transactional store (redb). A change is committed
//! before the daemon answers the request that caused it; on start the daemon
//! rebuilds its state from here.

mod journal;
mod records;

pub use journal::{JOURNAL_FORMAT, Journal, JournalFailure, JournalOp, Snapshot, StoreError};
pub use records::{AllocationRecord, AllocationState, EndpointRecord, allocation_key, now_ms};
