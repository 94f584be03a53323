//! What the plugin tells afterwards: its phase timings (and failure, if any) to the
//! daemon, which turns them into metrics and keeps failures for `podnet explain`
//! (a successful ADD's report also names the addresses of the attachment it
//! wired, which the daemon then binds; an ADD that registered its endpoint and a
//! DEL the daemon answered sent their timings with that request and make no
//! request for them); and one line per ADD/DEL in the config's
//! `log-file` (runtimes swallow the plugin's stderr), rotated at 10 MiB with 7
//! backups as Cilium's CNI log.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::api::client::Client;
use crate::api::models::CniReport;
use crate::cni::CniError;

use super::daemon_errors::ALLOCATE_CONTEXT;

const LOG_MAX_BYTES: u64 = 10 * 1024 * 1024;
const LOG_BACKUPS: u32 = 7;

/// Phase timings of one plugin run.
pub struct Timings {
    started: Instant,
    last: Instant,
    phases: BTreeMap<String, f64>,
    /// The daemon has them already (they came with the endpoint registration or
    /// the release).
    delivered: bool,
    /// The expiration UUIDs of a wired attachment's pending addresses, for the
    /// daemon to bind.
    wired: Vec<String>,
}

impl Timings {
    pub fn start() -> Timings {
        let now = Instant::now();
        Timings {
            started: now,
            last: now,
            phases: BTreeMap::new(),
            delivered: false,
            wired: Vec::new(),
        }
    }

    /// Ends a phase: the time since the previous mark goes to `phase`.
    pub fn mark(&mut self, phase: &str) {
        let now = Instant::now();
        *self.phases.entry(phase.to_string()).or_insert(0.0) += (now - self.last).as_secs_f64();
        self.last = now;
    }

    /// Time since the start.
    pub fn total(&self) -> Duration {
        self.started.elapsed()
    }

    /// The phases so far and `total` up to now: what travels with the endpoint
    /// registration (the daemon adds its own handling of that request).
    pub fn so_far(&self) -> BTreeMap<String, f64> {
        let mut phases = self.phases.clone();
        phases.insert("total".into(), self.total().as_secs_f64());
        phases
    }

    /// The daemon has recorded the timings: `report` sends nothing.
    pub fn delivered(&mut self) {
        self.delivered = true;
    }

    /// The ADD wired the attachment of these pending addresses: a successful
    /// ADD's report asks the daemon to bind them.
    pub fn wired(&mut self, expiration_uuids: Vec<String>) {
        self.wired = expiration_uuids;
    }
}

/// The short reason of a failure, by CNI error code (`allocation` for failures of
/// the daemon's allocation, which the daemon records itself).
pub fn reason_of(e: &CniError) -> &'static str {
    if e.msg.starts_with(ALLOCATE_CONTEXT) && e.code != 11 {
        return "allocation";
    }
    match e.code {
        101 => "range-full",
        11 => "daemon-unavailable",
        102 => "datapath",
        104 => "interface-exists",
        3 => "netns-missing",
        1 | 4 | 6 | 7 => "invalid-config",
        100 => "rejected",
        _ => "other",
    }
}

/// One finished ADD or DEL.
pub struct Outcome<'a> {
    pub verb: &'a str,
    pub container_id: &'a str,
    pub ifname: &'a str,
    pub owner: &'a str,
    pub result: Result<&'a str, &'a CniError>,
}

/// Sends the timings unless the daemon has them (without waiting for its answer)
/// and appends the log line.
pub fn report(client: &Client, log_file: Option<&Path>, timings: Timings, outcome: &Outcome<'_>) {
    let total = timings.total();
    let mut phases = timings.phases;
    phases.insert("total".into(), total.as_secs_f64());
    let line = log_file.map(|_| log_line(outcome, &phases));
    let (reason, error) = match outcome.result {
        Ok(_) => (String::new(), String::new()),
        Err(e) => (reason_of(e).to_string(), e.msg.clone()),
    };
    if reason != "daemon-unavailable" && !timings.delivered {
        let quick = Client::new(client.socket(), Duration::from_secs(1));
        let body = CniReport {
            verb: outcome.verb.into(),
            container_id: outcome.container_id.into(),
            ifname: outcome.ifname.into(),
            owner: outcome.owner.into(),
            phases,
            wired_expiration_uuids: if outcome.result.is_ok() {
                timings.wired
            } else {
                Vec::new()
            },
            reason,
            error,
        };
        if let Err(e) = quick.report(&body) {
            tracing::debug!(error = %e, "could not report timings");
        }
    }
    if let (Some(path), Some(line)) = (log_file, line)
        && let Err(e) = append_log(path, &line)
    {
        tracing::warn!(error = %e, path = %path.display(), "could not write the CNI log file");
    }
}

/// One line of the log: when, the verb, the attachment and pod, the result,
/// the duration, and each phase's share of it (`total` is the duration), in ms.
fn log_line(o: &Outcome<'_>, phases: &BTreeMap<String, f64>) -> String {
    let result = match o.result {
        Ok(out) => {
            let ips: Vec<String> = serde_json::from_str::<serde_json::Value>(out)
                .ok()
                .and_then(|v| v.get("ips").and_then(|i| i.as_array()).cloned())
                .unwrap_or_default()
                .iter()
                .filter_map(|ip| {
                    ip.get("address")
                        .and_then(|a| a.as_str())
                        .map(str::to_string)
                })
                .collect();
            format!("ok ips=[{}]", ips.join(","))
        }
        Err(e) => format!("error code={} msg={:?}", e.code, e.msg),
    };
    let ms = |secs: f64| format!("{:.2}", secs * 1000.0);
    let total = phases.get("total").copied().unwrap_or_default();
    let parts: Vec<String> = phases
        .iter()
        .filter(|(name, _)| *name != "total")
        .map(|(name, secs)| format!("{name}:{}", ms(*secs)))
        .collect();
    format!(
        "{} {} container={} ifname={} pod={} {} duration_ms={} phases_ms={}\n",
        utc_now(),
        o.verb,
        o.container_id,
        o.ifname,
        o.owner,
        result,
        ms(total),
        parts.join(",")
    )
}

/// Appends `line`, rotating the file first when it is over the limit. The file is
/// root's alone (0600: it names every pod and its addresses); one that group or
/// others can read or write is made so.
fn append_log(path: &Path, line: &str) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let meta = std::fs::metadata(path).ok();
    let loose = meta
        .as_ref()
        .is_some_and(|m| m.permissions().mode() & 0o077 != 0);
    if meta.is_some_and(|m| m.len() >= LOG_MAX_BYTES) {
        for i in (1..LOG_BACKUPS).rev() {
            let from = path.with_extension(format!("log.{i}"));
            if from.exists() {
                std::fs::rename(&from, path.with_extension(format!("log.{}", i + 1)))?;
            }
        }
        std::fs::rename(path, path.with_extension("log.1"))?;
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    if loose {
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    f.write_all(line.as_bytes())
}

/// The current UTC time as RFC 3339 with milliseconds.
fn utc_now() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// Days since 1970-01-01 to (year, month, day), Howard Hinnant's algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_dir::TestDir;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_788), (2026, 12, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn log_rotates() {
        let test_dir = TestDir::new("log");
        // A directory append_log has to create first.
        let dir = test_dir.join("logs");
        let path = dir.join("cni.log");
        append_log(&path, "a\n").unwrap();
        std::fs::write(&path, vec![b'x'; LOG_MAX_BYTES as usize]).unwrap();
        append_log(&path, "b\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "b\n");
        assert!(dir.join("cni.log.1").exists());
    }

    #[test]
    fn timings_so_far_end_with_the_total_up_to_now() {
        let mut t = Timings::start();
        t.mark("netlink-setup");
        t.mark("netlink-setup");
        let phases = t.so_far();
        assert_eq!(
            phases.keys().collect::<Vec<_>>(),
            ["netlink-setup", "total"]
        );
        assert!(phases["total"] >= phases["netlink-setup"]);
        assert!(!t.delivered);
        t.delivered();
        assert!(t.delivered);
    }

    #[test]
    fn the_log_line_gives_the_duration_and_each_phase_in_ms() {
        let phases = BTreeMap::from([
            ("ipam-round-trip".to_string(), 0.0012),
            ("netlink-host".to_string(), 0.00405),
            ("total".to_string(), 0.0061),
        ]);
        let result = r#"{"ips":[{"address":"10.0.0.5/24"}]}"#;
        let outcome = Outcome {
            verb: "ADD",
            container_id: "c1",
            ifname: "eth0",
            owner: "ns/pod",
            result: Ok(result),
        };
        let line = log_line(&outcome, &phases);
        assert!(
            line.ends_with(
                " ADD container=c1 ifname=eth0 pod=ns/pod ok ips=[10.0.0.5/24] duration_ms=6.10 \
                 phases_ms=ipam-round-trip:1.20,netlink-host:4.05\n"
            ),
            "{line}"
        );
    }

    #[test]
    fn reasons() {
        assert_eq!(reason_of(&CniError::address_exhausted("x")), "range-full");
        let alloc = CniError::address_exhausted(format!("{}: range is full", ALLOCATE_CONTEXT));
        assert_eq!(reason_of(&alloc), "allocation");
        assert_eq!(
            reason_of(&CniError::try_again_later("x")),
            "daemon-unavailable"
        );
    }
}
