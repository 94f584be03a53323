//! The cluster pool read again while the leader runs. Every [`RELOAD_INTERVAL`]
//! the operator parses its options as at start: its command line over the
//! files of `--config-dir`, the mounted ConfigMap whose contents the kubelet
//! swaps in place (one `..data` symlink, within about a minute of an edit of
//! the ConfigMap). A cluster pool that differs from the last one read goes to
//! the node loop ([`NodeCidrs::reconfigure`](super::NodeCidrs::reconfigure)
//! keeps or refuses it); options that do not parse or fail the start-up checks
//! go to it too, once each, as refused ([`PoolRead::Malformed`]: logged and
//! counted in `podnet_operator_pool_definitions_refused`), and the pool in force
//! stays. A pool option given as a flag wins over its file, as at start, so
//! only a pool in the ConfigMap changes live. No `--config-dir`: nothing to
//! read again.
//!
//! A replica that becomes leader leads with the pool in force the leaders before
//! it recorded on the Lease ([`at_leading`], `ipam::clusterpool`'s record): what
//! the options say then comes as the first change, judged as the running leader
//! would have judged it, so neither a restart nor a failover takes a pool the
//! running leader refused, and a ConfigMap edit that does not parse costs no
//! replica its start. With no record (the first leader), it leads with the
//! options as they are now, or with those it started with.

use std::time::Duration;

use futures::{Stream, StreamExt};

use crate::ipam::clusterpool::{ClusterPoolConfig, NodeCidrCarver, POOL_IN_FORCE_ANNOTATION};
use crate::k8s::mirror::WatchEnded;
use crate::operator::options::{OperatorOptions, cluster_pool};

/// How often the options are read again.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(5);

/// One reading of the cluster pool options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolRead {
    /// They parse and pass the start-up checks: the pool they give.
    Parsed(ClusterPoolConfig),
    /// They do not: why (the pool in force stays).
    Malformed(String),
}

/// Whether the operator's command line reads options from `--config-dir` (the
/// ConfigMap, which changes live).
pub fn has_config_dir(args: &[String]) -> bool {
    args.iter()
        .any(|a| a == "--config-dir" || a.starts_with("--config-dir="))
}

/// The readings of the cluster pool from `args` (the operator's command line)
/// that differ from `current` and from the one before, as they come: the first
/// at once, then every [`RELOAD_INTERVAL`].
pub fn pool_changes(
    args: Vec<String>,
    current: ClusterPoolConfig,
) -> impl Stream<Item = Result<PoolRead, WatchEnded>> + Unpin {
    if !has_config_dir(&args) {
        return futures::stream::empty().left_stream();
    }
    let state = Reader {
        args,
        last: current,
        failed: None,
        first: true,
    };
    futures::stream::unfold(state, |mut r| async move {
        let next = r.next_change().await;
        Some((Ok(next), r))
    })
    .boxed()
    .right_stream()
}

struct Reader {
    args: Vec<String>,
    /// The last pool read (or the one led with).
    last: ClusterPoolConfig,
    /// The last failure read.
    failed: Option<String>,
    /// Nothing read yet: no wait before the first reading.
    first: bool,
}

impl Reader {
    /// Waits for a reading that differs from the last one: another pool, a
    /// failure, another failure, or the end of one (even back to the same pool).
    async fn next_change(&mut self) -> PoolRead {
        loop {
            if !std::mem::take(&mut self.first) {
                tokio::time::sleep(RELOAD_INTERVAL).await;
            }
            match read(&self.args) {
                Ok(pool) => {
                    let recovered = self.failed.take().is_some();
                    if pool != self.last || recovered {
                        self.last = pool.clone();
                        return PoolRead::Parsed(pool);
                    }
                }
                Err(why) => {
                    if self.failed.as_deref() != Some(why.as_str()) {
                        tracing::error!(error = %why, "the operator's cluster pool options do not parse; the cluster pool in force stays");
                        self.failed = Some(why.clone());
                        return PoolRead::Malformed(why);
                    }
                }
            }
        }
    }
}

/// The cluster pool (and its carver) to lead with (the module's rule):
/// `recorded`, the Lease's record of the pool in force, when there is one that
/// reads back; else what `args` give now; else `started`, the pool the replica
/// started with. None of them: why.
pub fn at_leading(
    args: &[String],
    started: Option<(NodeCidrCarver, ClusterPoolConfig)>,
    recorded: Option<&str>,
) -> Result<(NodeCidrCarver, ClusterPoolConfig), String> {
    let carve = |pool: ClusterPoolConfig| {
        NodeCidrCarver::new(&pool)
            .map(|carver| (carver, pool))
            .map_err(|e| e.to_string())
    };
    if let Some(record) = recorded {
        let in_force = ClusterPoolConfig::from_record(record)
            .map_err(|e| e.to_string())
            .and_then(carve);
        match in_force {
            Ok(in_force) => {
                tracing::info!(pool = %record, "leading with the cluster pool in force, as the Lease records it");
                return Ok(in_force);
            }
            Err(why) => {
                tracing::error!(error = %why, "the Lease's record of the cluster pool in force does not read back; leading with the options");
            }
        }
    }
    let now = read(args).and_then(carve);
    match (now, started) {
        (Ok(now), _) => Ok(now),
        (Err(why), Some(started)) => {
            tracing::error!(error = %why, "the operator's options do not parse now; leading with the cluster pool it started with");
            Ok(started)
        }
        (Err(why), None) => Err(format!(
            "{why}; and the Lease records no cluster pool in force ({POOL_IN_FORCE_ANNOTATION}) to \
             lead with: fix the cluster pool options"
        )),
    }
}

/// The cluster pool `args` give now.
fn read(args: &[String]) -> Result<ClusterPoolConfig, String> {
    let opts = OperatorOptions::parse_with_config_dir(args).map_err(|e| e.to_string())?;
    cluster_pool(&opts).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipam::Family;
    use crate::test_dir::TestDir;

    fn args(dir: &TestDir) -> Vec<String> {
        vec!["--config-dir".into(), dir.display().to_string()]
    }

    #[test]
    fn the_pool_is_read_from_the_config_dir_under_the_flags() {
        let dir = TestDir::new("poolreload");
        std::fs::write(
            dir.join("cluster-pool-ipv4-cidr"),
            "10.0.0.0/16 10.1.0.0/16@26\n",
        )
        .unwrap();
        let pool = read(&args(&dir)).unwrap();
        assert_eq!(pool.ipv4_cidrs.len(), 2);
        assert_eq!(
            pool.node_mask(Family::V4, &"10.1.0.0/16".parse().unwrap()),
            26
        );
        // A flag wins over the file.
        let mut flagged = args(&dir);
        flagged.push("--cluster-pool-ipv4-cidr=10.9.0.0/16".into());
        assert_eq!(
            read(&flagged).unwrap().ipv4_cidrs,
            vec!["10.9.0.0/16".parse().unwrap()]
        );
        std::fs::write(
            dir.join("cluster-pool-ipv4-cidr"),
            "10.0.0.0/16 10.1.0.0/16@12\n",
        )
        .unwrap();
        assert_eq!(
            read(&args(&dir)).unwrap_err(),
            "invalid cluster-pool-ipv4-cidr entry \"10.1.0.0/16@12\": node mask size /12 must \
             be /16 to /32 for 10.1.0.0/16"
        );
    }

    #[test]
    fn a_new_leader_leads_with_the_record_else_the_options_now_else_its_start() {
        let dir = TestDir::new("poolleading");
        std::fs::write(dir.join("cluster-pool-ipv4-cidr"), "10.0.0.0/16").unwrap();
        let started = read(&args(&dir)).unwrap();
        let carver = NodeCidrCarver::new(&started).unwrap();
        let with_start = || Some((carver.clone(), started.clone()));
        // No record: the options now.
        std::fs::write(dir.join("cluster-pool-ipv4-cidr"), "10.1.0.0/16@26").unwrap();
        let (carver_now, pool) = at_leading(&args(&dir), with_start(), None).unwrap();
        assert_eq!(pool.ipv4_cidrs, vec!["10.1.0.0/16".parse().unwrap()]);
        assert_eq!(carver_now.sets(Family::V4)[0].node_mask(), 26);
        // A record: it, whatever the options say now.
        let record = started.to_record();
        let (_, pool) = at_leading(&args(&dir), None, Some(&record)).unwrap();
        assert_eq!(pool, started);
        // Options that do not parse now, no record: the pool it started with;
        // nothing to lead with at all: why, naming the record.
        std::fs::write(dir.join("cluster-pool-ipv4-cidr"), "banana").unwrap();
        let (_, pool) = at_leading(&args(&dir), with_start(), None).unwrap();
        assert_eq!(pool, started);
        let (_, pool) = at_leading(&args(&dir), with_start(), Some("{}")).unwrap();
        assert_eq!(
            pool, started,
            "a record that does not read back is passed over"
        );
        let why = at_leading(&args(&dir), None, None).unwrap_err();
        assert!(
            why.starts_with("invalid cluster-pool-ipv4-cidr entry \"banana\"")
                && why.ends_with(
                    "the Lease records no cluster pool in force \
                     (podnet.io/cluster-pool-in-force) to lead with: fix the cluster pool options"
                ),
            "{why}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_changed_pool_comes_and_a_bad_one_is_said_once() {
        let dir = TestDir::new("poolchanges");
        std::fs::write(dir.join("cluster-pool-ipv4-cidr"), "10.0.0.0/16").unwrap();
        let current = read(&args(&dir)).unwrap();
        let mut changes = pool_changes(args(&dir), current.clone());
        async fn next(
            changes: &mut (impl Stream<Item = Result<PoolRead, WatchEnded>> + Unpin),
        ) -> PoolRead {
            changes.next().await.unwrap().unwrap()
        }
        // Unchanged: nothing comes.
        let quiet = tokio::time::timeout(RELOAD_INTERVAL * 3, next(&mut changes)).await;
        assert!(quiet.is_err());
        // Malformed: said once, while it lasts.
        std::fs::write(
            dir.join("cluster-pool-ipv4-cidr"),
            "10.0.0.0/16 10.1.0.0/16@x",
        )
        .unwrap();
        let read = next(&mut changes).await;
        assert!(
            matches!(&read, PoolRead::Malformed(why) if why.contains("10.1.0.0/16@x")),
            "{read:?}"
        );
        let quiet = tokio::time::timeout(RELOAD_INTERVAL * 3, next(&mut changes)).await;
        assert!(quiet.is_err());
        // Back to the pool in force: said, so the refusal ends.
        std::fs::write(dir.join("cluster-pool-ipv4-cidr"), "10.0.0.0/16").unwrap();
        assert_eq!(next(&mut changes).await, PoolRead::Parsed(current));
        std::fs::write(
            dir.join("cluster-pool-ipv4-cidr"),
            "10.0.0.0/16 10.1.0.0/16",
        )
        .unwrap();
        let PoolRead::Parsed(pool) = next(&mut changes).await else {
            panic!("a pool that parses");
        };
        assert_eq!(pool.ipv4_cidrs.len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_reading_comes_at_once() {
        let dir = TestDir::new("poolfirst");
        std::fs::write(dir.join("cluster-pool-ipv4-cidr"), "10.0.0.0/16").unwrap();
        let recorded = read(&args(&dir)).unwrap();
        std::fs::write(
            dir.join("cluster-pool-ipv4-cidr"),
            "10.0.0.0/16 10.1.0.0/16",
        )
        .unwrap();
        let mut changes = pool_changes(args(&dir), recorded);
        let started = tokio::time::Instant::now();
        assert!(matches!(
            changes.next().await,
            Some(Ok(PoolRead::Parsed(_)))
        ));
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test]
    async fn without_a_config_dir_nothing_is_read_again() {
        let mut changes = pool_changes(Vec::new(), ClusterPoolConfig::default());
        assert!(changes.next().await.is_none());
    }
}
