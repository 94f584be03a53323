//! REST round trip over the unix socket: the real daemon binary
//! (`target/release/podnet daemon`, IPv4, node range /20, release cooldown 0 s)
//! in a private network namespace with a temp socket, timed through the
//! plugin's own blocking client: `GET /v1/healthz`, `GET /v1/config` (the first
//! call of every ADD), and `POST /v1/ipam` + `DELETE /v1/ipam/{ip}` with the
//! journal on tmpfs (/dev/shm, as /run on a node) and on disk (/tmp here).
//!
//! Needs root (`ip netns`); prints a skip line otherwise.
//!
//! `cargo bench --bench api`

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use podnet::api::client::{AllocateParams, Client};

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
}

/// A daemon in its own netns with its own temp dir; all removed on drop (the
/// daemon by its PID).
struct Daemon {
    netns: String,
    dir: PathBuf,
    child: Option<Child>,
}

impl Daemon {
    fn start(tag: &str, state_base: &str) -> Option<Daemon> {
        let netns = format!("pbn-crit-{}-{tag}", std::process::id());
        let ok = Command::new("ip")
            .args(["netns", "add", &netns])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            eprintln!("api bench: ip netns add {netns} failed");
            return None;
        }
        let dir =
            Path::new(state_base).join(format!("podnet-bench-api-{}-{tag}", std::process::id()));
        let mut d = Daemon {
            netns,
            dir,
            child: None,
        };
        std::fs::create_dir_all(d.dir.join("run")).ok()?;
        let log = std::fs::File::create(d.dir.join("daemon.log")).ok()?;
        // `ip netns exec` execs the daemon in place: the child's PID is the daemon's.
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &d.netns,
                env!("CARGO_BIN_EXE_podnet"),
                "daemon",
            ])
            .arg("--socket")
            .arg(d.socket())
            .arg("--state-dir")
            .arg(d.dir.join("state"))
            .args([
                "--cluster-pool-ipv4-cidr",
                "10.99.0.0/16",
                "--cluster-pool-ipv4-mask-size",
                "20",
                "--ipam-release-cooldown",
                "0s",
                "--k8s-node-name",
                "bench-api",
            ])
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .ok()?;
        d.child = Some(child);
        let client = d.client();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if client.healthz().is_ok() {
                return Some(d);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "api bench: the daemon did not answer; log:\n{}",
            std::fs::read_to_string(d.dir.join("daemon.log")).unwrap_or_default()
        );
        None
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("run").join("podnet.sock")
    }

    fn client(&self) -> Client {
        Client::new(self.socket(), Duration::from_secs(10))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn allocate_release(client: &Client) {
    let r = client
        .allocate(&AllocateParams {
            family: "ipv4",
            owner: "bench/pod",
            expiration: false,
            ..Default::default()
        })
        .expect("allocate");
    client
        .release_ip(&r.address.ipv4, "default")
        .expect("release");
}

fn api(c: &mut Criterion) {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED api benchmarks: need root (ip netns)");
        return;
    }
    let Some(shm) = Daemon::start("shm", "/dev/shm") else {
        return;
    };
    let Some(disk) = Daemon::start("disk", "/tmp") else {
        return;
    };
    let mut g = c.benchmark_group("api_unix_socket");
    let client = shm.client();
    g.bench_function("healthz", |b| {
        b.iter(|| black_box(client.healthz().expect("healthz")))
    });
    g.bench_function("config", |b| {
        b.iter(|| black_box(client.config().expect("config")))
    });
    for (label, d) in [("tmpfs", &shm), ("disk", &disk)] {
        let client = d.client();
        g.bench_function(BenchmarkId::new("allocate_release", label), |b| {
            b.iter(|| allocate_release(&client))
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = api
}
criterion_main!(benches);
