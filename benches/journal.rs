//! Journal micro-benchmarks (redb): one durable commit of a `PutAllocation`, as
//! the daemon does before answering `POST /v1/ipam`, in a temp dir on /tmp (the
//! root disk here) and on /dev/shm (tmpfs, as /run on a node); opening an
//! existing journal; and the restore read (`Journal::load`) of 10,000
//! allocations.
//!
//! `cargo bench --bench journal`

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use podnet::store::{AllocationRecord, Journal, JournalOp, StoreError, now_ms};

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
}

/// A temp dir under `base`, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(base: &str) -> Option<TempDir> {
        if !Path::new(base).is_dir() {
            return None;
        }
        let p = Path::new(base).join(format!(
            "podnet-bench-journal-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4()
        ));
        std::fs::create_dir_all(&p).ok()?;
        Some(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A record like the plugin's allocations (attachment known, bound). Built
/// through serde so that optional fields added to the record later keep their
/// defaults and this file keeps compiling.
fn record(i: u32) -> AllocationRecord {
    let ip = Ipv4Addr::from(0x0a63_0000u32 + 2 + (i % 65_000));
    serde_json::from_value(serde_json::json!({
        "ip": IpAddr::V4(ip),
        "family": "ipv4",
        "pool": "default",
        "owner": format!("default/pod-{i}"),
        "container_id": format!("{:064x}", u64::from(i) * 0x9e37_79b9),
        "ifname": "eth0",
        "network": "podnet",
        "state": "bound",
        "allocated_at_ms": now_ms(),
        "host_ifname": format!("lxc{i:012x}"),
    }))
    .expect("an allocation record")
}

const PLACES: [(&str, &str); 2] = [("tmp", "/tmp"), ("dev-shm", "/dev/shm")];

fn commit(c: &mut Criterion) {
    let mut g = c.benchmark_group("journal_commit_put_allocation");
    for (label, base) in PLACES {
        let Some(dir) = TempDir::new(base) else {
            eprintln!("skipping journal on {base}: not a directory");
            continue;
        };
        let (mut j, _) = Journal::open(&dir.0.join("journal.redb")).expect("open");
        let mut i = 0u32;
        g.bench_function(BenchmarkId::from_parameter(label), |b| {
            b.iter(|| {
                i = i.wrapping_add(1);
                j.commit(&[JournalOp::PutAllocation(record(i))])
                    .expect("commit");
            })
        });
    }
    g.finish();
}

fn open(c: &mut Criterion) {
    let mut g = c.benchmark_group("journal_open_existing");
    for (label, base) in PLACES {
        let Some(dir) = TempDir::new(base) else {
            continue;
        };
        let path = dir.0.join("journal.redb");
        drop(Journal::open(&path).expect("create"));
        g.bench_function(BenchmarkId::from_parameter(label), |b| {
            b.iter(|| black_box(Journal::open(&path).expect("open")))
        });
    }
    g.finish();
}

fn restore(c: &mut Criterion) {
    let mut g = c.benchmark_group("journal_restore");
    let Some(dir) = TempDir::new("/tmp") else {
        return;
    };
    let path = dir.0.join("journal.redb");
    let (mut j, _) = Journal::open(&path).expect("open");
    let ops: Vec<JournalOp> = (0..10_000)
        .map(|i| JournalOp::PutAllocation(record(i)))
        .collect();
    j.commit(&ops).expect("write 10,000 records");
    drop(j);
    let load = || {
        let (j, snapshot) = Journal::open(&path).expect("open");
        let mut n = 0usize;
        j.for_each_allocation(|r| {
            n += 1;
            black_box(r);
            Ok::<_, StoreError>(())
        })
        .expect("read");
        (n, snapshot)
    };
    assert_eq!(load().0, 10_000, "the journal holds every record written");
    // Open (with redb's page-by-page integrity check and a decode of every
    // record) and read every allocation once more, one at a time: what a daemon
    // start does.
    g.bench_function("open_and_load_10000_allocations", |b| {
        b.iter(|| black_box(load()))
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = commit, open, restore
}
criterion_main!(benches);
