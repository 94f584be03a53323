//! LB IPAM's planning (`operator::lbipam::services::plan`), which the controller
//! runs again after every pool or Service change: `fresh` gives every Service
//! its first address; `steady` is the usual pass, every Service already holding
//! its address (kept, nothing allocated). 10 pools of a /20 each, Services
//! spread over them by a label selector, 1,000 and 10,000 Services.
//!
//! `cargo bench --bench lbipam`

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use podnet::ipam::Family;
use podnet::operator::lbipam::pools::{Pool, sort_pools};
use podnet::operator::lbipam::services::{DefaultIpam, ServicePlan, ServiceView, Settings, plan};
use podnet::resources::{CiliumLoadBalancerIPPool, decode};

const POOLS: usize = 10;

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

fn pools() -> Vec<Pool> {
    let mut out: Vec<Pool> = (0..POOLS)
        .map(|i| {
            let v = serde_json::json!({
                "metadata": {"name": format!("pool-{i}"), "creationTimestamp": format!("2026-01-01T00:00:{i:02}Z")},
                "spec": {"blocks": [{"cidr": format!("10.{}.0.0/20", 100 + i)}],
                         "serviceSelector": {"matchLabels": {"tier": format!("t{i}")}}},
            });
            let obj: CiliumLoadBalancerIPPool = decode(&v).expect("pool");
            Pool::from_resource(&obj).expect("valid pool")
        })
        .collect();
    sort_pools(&mut out);
    out
}

fn services(n: usize) -> Vec<ServiceView> {
    (0..n)
        .map(|i| ServiceView {
            namespace: format!("ns-{}", i % 50),
            name: format!("svc-{i}"),
            created: format!("{i:08}"),
            labels: [("tier".to_string(), format!("t{}", i % POOLS))].into(),
            load_balancer: true,
            ip_families: vec![Family::V4],
            ports: vec![(80, "TCP".into())],
            ..Default::default()
        })
        .collect()
}

fn planning(c: &mut Criterion) {
    let settings = Settings {
        ipv4: true,
        ipv6: false,
        default_ipam: DefaultIpam::Lbipam,
    };
    let pools = pools();
    let mut g = c.benchmark_group("lbipam_plan");
    for n in [1_000, 10_000] {
        let fresh = services(n);
        g.bench_function(BenchmarkId::new("fresh", n), |b| {
            b.iter(|| black_box(plan(&pools, black_box(&fresh), &settings, &BTreeMap::new())))
        });
        let first = plan(&pools, &fresh, &settings, &BTreeMap::new());
        let steady: Vec<ServiceView> = fresh
            .iter()
            .map(|s| {
                let mut s = s.clone();
                if let Some(ServicePlan::Assign { ips, .. }) = first.services.get(&s.key()) {
                    s.ingress = ips.clone();
                    s.has_condition = true;
                }
                s
            })
            .collect();
        g.bench_function(BenchmarkId::new("steady", n), |b| {
            b.iter(|| black_box(plan(&pools, black_box(&steady), &settings, &first.origin)))
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = planning
}
criterion_main!(benches);
