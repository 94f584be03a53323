//! IPAM micro-benchmarks: the host-scope allocator on a /16 and a /8 node range,
//! and the cidrset on a /8 cluster pool carved into /24 node CIDRs.
//!
//! Two cases each: `empty` (allocate the next address, release it: the cursor
//! walks an empty range) and `full_but_one` (every address taken but one, which
//! is released and allocated again: each allocation scans the whole range
//! from the cursor round to the one free bit, the worst case of next-fit).
//!
//! `cargo bench --bench ipam`

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ipnet::IpNet;
use podnet::ipam::cidrset::CidrSet;
use podnet::ipam::hostscope::HostScopeAllocator;

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

fn net(s: &str) -> IpNet {
    s.parse().expect("CIDR")
}

fn hostscope(c: &mut Criterion) {
    let mut g = c.benchmark_group("hostscope_allocate_release");
    for (label, cidr) in [("slash16", "10.0.0.0/16"), ("slash8", "10.0.0.0/8")] {
        let mut a = HostScopeAllocator::new(net(cidr)).expect("allocator");
        g.bench_function(BenchmarkId::new("empty", label), |b| {
            b.iter(|| {
                let ip = a.allocate_next().expect("allocate");
                black_box(a.release(black_box(ip)))
            })
        });

        // Fill the range, then free one address: every allocate_next scans round.
        let mut a = HostScopeAllocator::new(net(cidr)).expect("allocator");
        let mut last = None;
        while let Ok(ip) = a.allocate_next() {
            last = Some(ip);
        }
        let hole = last.expect("at least one address");
        a.release(hole);
        g.bench_function(BenchmarkId::new("full_but_one", label), |b| {
            b.iter(|| {
                let ip = a.allocate_next().expect("the hole");
                black_box(a.release(black_box(ip)))
            })
        });
    }
    g.finish();
}

fn cidrset(c: &mut Criterion) {
    let mut g = c.benchmark_group("cidrset_8_pool_24_nodes");
    let mut s = CidrSet::new(net("10.0.0.0/8"), 24).expect("cidrset");
    g.bench_function("empty", |b| {
        b.iter(|| {
            let n = s.allocate_next().expect("allocate");
            s.release(black_box(&n)).expect("release");
        })
    });

    let mut s = CidrSet::new(net("10.0.0.0/8"), 24).expect("cidrset");
    let mut last = None;
    while let Ok(n) = s.allocate_next() {
        last = Some(n);
    }
    let hole = last.expect("at least one node CIDR");
    s.release(&hole).expect("release");
    g.bench_function("full_but_one", |b| {
        b.iter(|| {
            let n = s.allocate_next().expect("the hole");
            s.release(black_box(&n)).expect("release");
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = hostscope, cidrset
}
criterion_main!(benches);
