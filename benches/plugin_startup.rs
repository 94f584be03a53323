//! The plugin's own start-up: one exec of the release binary with
//! `CNI_COMMAND=VERSION` (no daemon, no netlink), next to the same exec of
//! Debian's `ptp` plugin and of `/bin/true` for scale.
//!
//! `cargo bench --bench plugin_startup`

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
}

const STDIN: &[u8] = br#"{"cniVersion":"1.0.0","name":"bench","type":"podnet"}"#;

fn version(bin: &str) -> bool {
    let mut child = Command::new(bin)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", "VERSION")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    if let Some(mut i) = child.stdin.take() {
        let _ = i.write_all(STDIN);
    }
    child
        .wait_with_output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn startup(c: &mut Criterion) {
    let mut g = c.benchmark_group("plugin_startup_version");
    let podnet = env!("CARGO_BIN_EXE_podnet");
    assert!(version(podnet), "{podnet} VERSION failed");
    for (label, bin) in [
        ("podnet", podnet),
        ("ptp", "/usr/lib/cni/ptp"),
        ("true", "/bin/true"),
    ] {
        if !Path::new(bin).exists() {
            eprintln!("skipping {label}: {bin} is missing");
            continue;
        }
        g.bench_function(BenchmarkId::from_parameter(label), |b| {
            b.iter(|| version(bin))
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = startup
}
criterion_main!(benches);
