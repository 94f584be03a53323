//! The cluster pool read again while the leader runs. Every [`RELOAD_INTERVAL`]
//! the operator parses its options as at start: its command line over the
//! files of `--config-dir`, the mounted ConfigMap whose contents the kubelet
//! swaps in place (one `..data` symlink, within about a minute of an edit of
//! the ConfigMap). A cluster pool that differs from the last one read goes to
//! the node loop ([`NodeCidrs::reconfigure`](super::NodeCidrs::reconfigure)
//! keeps or refuses it); options that do not parse or fail the start-up checks
//! are logged once each, and the pool in force stays. A pool option given as a
//! flag wins over its file, as at start, so only a pool in the ConfigMap
//! changes live. No `--config-dir`: nothing to read again. A replica reads the
//! pool once more when it becomes leader ([`at_leading`]), so a follower that
//! waited through an edit starts from the pool in force, not the one it
//! started with.

use std::time::Duration;

use futures::{Stream, StreamExt};

use crate::ipam::clusterpool::{ClusterPoolConfig, NodeCidrCarver};
use crate::k8s::mirror::WatchEnded;
use crate::operator::options::{OperatorOptions, cluster_pool};

/// How often the options are read again.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(5);

/// The cluster pools read from `args` (the operator's command line) that
/// differ from `current` and from each other, as they come.
pub fn pool_changes(
    args: Vec<String>,
    current: ClusterPoolConfig,
) -> impl Stream<Item = Result<ClusterPoolConfig, WatchEnded>> + Unpin {
    let has_dir = args
        .iter()
        .any(|a| a == "--config-dir" || a.starts_with("--config-dir="));
    if !has_dir {
        return futures::stream::empty().left_stream();
    }
    let state = Reader {
        args,
        last: current,
        failed: None,
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
    /// The last pool read (or the one at start).
    last: ClusterPoolConfig,
    /// The last failure logged.
    failed: Option<String>,
}

impl Reader {
    /// Waits for a pool that differs from the last one read.
    async fn next_change(&mut self) -> ClusterPoolConfig {
        loop {
            tokio::time::sleep(RELOAD_INTERVAL).await;
            match read(&self.args) {
                Ok(pool) => {
                    self.failed = None;
                    if pool != self.last {
                        self.last = pool.clone();
                        return pool;
                    }
                }
                Err(why) => {
                    if self.failed.as_deref() != Some(why.as_str()) {
                        tracing::error!(error = %why, "the operator's options do not parse; the cluster pool in force stays");
                    }
                    self.failed = Some(why);
                }
            }
        }
    }
}

/// The cluster pool (and its carver) to lead with: what `args` give now, or,
/// when they do not parse, `started` (logged).
pub fn at_leading(
    args: &[String],
    started: (NodeCidrCarver, ClusterPoolConfig),
) -> (NodeCidrCarver, ClusterPoolConfig) {
    let now = read(args).and_then(|pool| {
        NodeCidrCarver::new(&pool)
            .map(|carver| (carver, pool))
            .map_err(|e| e.to_string())
    });
    match now {
        Ok(now) => now,
        Err(why) => {
            tracing::error!(error = %why, "the operator's options do not parse now; leading with the cluster pool it started with");
            started
        }
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
    fn a_new_leader_starts_from_the_pool_in_force_now() {
        let dir = TestDir::new("poolleading");
        std::fs::write(dir.join("cluster-pool-ipv4-cidr"), "10.0.0.0/16").unwrap();
        let started = read(&args(&dir)).unwrap();
        let carver = NodeCidrCarver::new(&started).unwrap();
        std::fs::write(dir.join("cluster-pool-ipv4-cidr"), "10.1.0.0/16@26").unwrap();
        let (carver, pool) = at_leading(&args(&dir), (carver, started.clone()));
        assert_eq!(pool.ipv4_cidrs, vec!["10.1.0.0/16".parse().unwrap()]);
        assert_eq!(carver.sets(Family::V4)[0].node_mask(), 26);
        // Options that do not parse now: the pool it started with.
        std::fs::write(dir.join("cluster-pool-ipv4-cidr"), "banana").unwrap();
        let (_, pool) = at_leading(&args(&dir), (carver, started.clone()));
        assert_eq!(pool, started);
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_changed_pool_comes_and_a_bad_one_is_skipped() {
        let dir = TestDir::new("poolchanges");
        std::fs::write(dir.join("cluster-pool-ipv4-cidr"), "10.0.0.0/16").unwrap();
        let current = read(&args(&dir)).unwrap();
        let mut changes = pool_changes(args(&dir), current);
        let next = tokio::spawn(async move { changes.next().await });
        // Unchanged, then malformed: nothing comes.
        tokio::time::sleep(RELOAD_INTERVAL * 2).await;
        std::fs::write(dir.join("cluster-pool-ipv4-cidr"), "10.0.0.0/16 banana").unwrap();
        tokio::time::sleep(RELOAD_INTERVAL * 2).await;
        assert!(!next.is_finished());
        std::fs::write(
            dir.join("cluster-pool-ipv4-cidr"),
            "10.0.0.0/16 10.1.0.0/16",
        )
        .unwrap();
        let pool = next.await.unwrap().unwrap().unwrap();
        assert_eq!(pool.ipv4_cidrs.len(), 2);
    }

    #[tokio::test]
    async fn without_a_config_dir_nothing_is_read_again() {
        let mut changes = pool_changes(Vec::new(), ClusterPoolConfig::default());
        assert!(changes.next().await.is_none());
    }
}
