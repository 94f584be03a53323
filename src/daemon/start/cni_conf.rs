//! The CNI config the serving daemon writes (`--write-cni-conf-when-ready`):
//! what it is and where it goes ([`CniConf`]), when it is written (now, or once
//! the configuration fits the node: [`when_to_write`]), and what `--cni-uninstall`
//! removes at stop ([`to_uninstall`], then [`uninstall`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::StartError;
use crate::daemon::cniconf::{self, CniConfError};
use crate::daemon::options::DaemonOptions;
use crate::daemon::state::ApiError;
use crate::daemon::{Daemon, crossnode, source_check};

/// `--write-cni-conf-when-ready DIR`: the CNI config and where it goes.
#[derive(Clone)]
pub(super) struct CniConf {
    dir: PathBuf,
    socket: PathBuf,
    log_file: PathBuf,
    exclusive: bool,
    chained: Vec<cniconf::ChainedPlugin>,
    /// `--enable-bandwidth-manager`: the `bandwidth` capability.
    bandwidth: bool,
}

impl CniConf {
    /// The config `opts` ask for (None: none).
    pub(super) fn of(opts: &DaemonOptions, socket: &Path) -> Option<CniConf> {
        if opts.write_cni_conf_when_ready.is_empty() {
            return None;
        }
        let chained = if opts.cni_bin_dir.is_empty() {
            Vec::new()
        } else {
            cniconf::chained_plugins(Path::new(&opts.cni_bin_dir))
        };
        Some(CniConf {
            dir: PathBuf::from(&opts.write_cni_conf_when_ready),
            socket: socket.to_path_buf(),
            log_file: opts.cni_log_file.clone(),
            exclusive: opts.cni_exclusive,
            chained,
            bandwidth: opts.enable_bandwidth_manager,
        })
    }

    pub(super) fn path(&self) -> PathBuf {
        self.dir.join(cniconf::CONF_NAME)
    }

    fn write(&self) -> Result<(), CniConfError> {
        let path = cniconf::write(
            &self.dir,
            &self.socket,
            &self.log_file,
            self.exclusive,
            &self.chained,
            self.bandwidth,
        )?;
        tracing::info!(path = %path.display(), "wrote the CNI config");
        Ok(())
    }
}

/// When the CNI config is written.
#[derive(Debug, PartialEq, Eq)]
enum WriteWhen {
    Now,
    /// The configuration does not fit this node: not until it does.
    OnceFit,
}

/// When to write the CNI config, given whether the configuration fits the node
/// (a state that cannot say does not hold it back).
fn when_to_write(fits: Result<bool, ApiError>) -> WriteWhen {
    match fits {
        Ok(false) => WriteWhen::OnceFit,
        _ => WriteWhen::Now,
    }
}

/// Writes the CNI config now, or, while the configuration does not fit this
/// node, once it does.
pub(super) async fn write_when_fit(daemon: &Arc<Daemon>, conf: &CniConf) -> Result<(), StartError> {
    match when_to_write(daemon.with_state(|s| Ok(s.fits())).await) {
        WriteWhen::OnceFit => {
            tracing::warn!(path = %conf.path().display(), "not writing the CNI config while the configuration does not fit this node (the log says why): the runtime does not report the network ready");
            tokio::spawn(write_cni_conf_once_fit(daemon.clone(), conf.clone()));
            Ok(())
        }
        WriteWhen::Now => Ok(conf.write()?),
    }
}

/// Writes the CNI config once the node's facts changed so that the configuration
/// fits (a Node that now lists the missing address).
async fn write_cni_conf_once_fit(daemon: Arc<Daemon>, conf: CniConf) {
    // Subscribed before the first look: a change between the two is not missed.
    let mut events = daemon.node_events.subscribe();
    loop {
        if matches!(daemon.with_state(|s| Ok(s.fits())).await, Ok(true)) {
            match conf.write() {
                Ok(()) => return,
                Err(e) => {
                    tracing::error!(error = %e, "the configuration fits this node now, but the CNI config cannot be written; it is tried again at the next change of the node")
                }
            }
        }
        if events.changed().await.is_err() {
            return;
        }
    }
}

/// One thing `--cni-uninstall` removes at stop.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Removal {
    /// The CNI config the daemon wrote.
    CniConf(PathBuf),
    /// The masquerade tables.
    MasqueradeTables,
    /// The source check's table.
    SourceCheckTable,
}

/// What `--cni-uninstall` removes at stop: the CNI config the daemon was to
/// write, the masquerade tables when it masquerades, the source check's table
/// when the check runs.
pub(super) fn to_uninstall(
    written_conf: Option<PathBuf>,
    masquerades: bool,
    source_check: bool,
) -> Vec<Removal> {
    written_conf
        .map(Removal::CniConf)
        .into_iter()
        .chain(masquerades.then_some(Removal::MasqueradeTables))
        .chain(source_check.then_some(Removal::SourceCheckTable))
        .collect()
}

/// Removes each of `removals`; a failure is logged, and the others still go.
pub(super) fn uninstall(removals: Vec<Removal>) {
    for removal in removals {
        match removal {
            Removal::CniConf(path) => match cniconf::remove(&path) {
                Ok(()) => {
                    tracing::info!(path = %path.display(), "removed the CNI config (cni-uninstall)")
                }
                Err(e) => tracing::warn!(error = %e, "cni-uninstall"),
            },
            Removal::MasqueradeTables => match crossnode::masquerade::remove_tables() {
                Ok(()) => tracing::info!(
                    table = crossnode::masquerade::TABLE,
                    "removed the masquerade tables (cni-uninstall)"
                ),
                Err(e) => tracing::warn!(error = %e, "cni-uninstall: the masquerade tables"),
            },
            Removal::SourceCheckTable => match source_check::remove_at_stop() {
                Ok(()) => tracing::info!(
                    table = source_check::TABLE,
                    "removed the source check table (cni-uninstall)"
                ),
                Err(e) => tracing::warn!(error = %e, "cni-uninstall: the source check table"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::config::resolved_options as resolved;
    use crate::daemon::start::tests::assert_fails_in;
    use crate::daemon::state::ErrorKind;
    use crate::test_dir::TestDir;

    fn conf_of(args: &[&str]) -> Option<CniConf> {
        let (opts, _) = resolved(args);
        CniConf::of(&opts, Path::new("/run/podnet/podnet.sock"))
    }

    #[test]
    fn no_cni_config_is_written_unless_asked_for() {
        assert!(conf_of(&[]).is_none());
    }

    #[test]
    fn the_cni_config_goes_into_the_directory_given_and_names_the_socket() {
        let dir = TestDir::new("start-cni-conf");
        let dir_arg = dir.display().to_string();
        let conf = conf_of(&["--write-cni-conf-when-ready", &dir_arg]).unwrap();
        assert_eq!(conf.path(), dir.join(cniconf::CONF_NAME));
        assert!(conf.chained.is_empty());
        conf.write().unwrap();
        let written = std::fs::read_to_string(conf.path()).unwrap();
        assert!(written.contains("/run/podnet/podnet.sock"), "{written}");
    }

    #[test]
    fn a_cni_config_that_cannot_be_written_fails_the_start_naming_the_directory() {
        let dir = TestDir::new("start-cni-conf");
        let not_a_dir = dir.join("file");
        std::fs::write(&not_a_dir, b"").unwrap();
        let dir_arg = not_a_dir.display().to_string();
        let conf = conf_of(&["--write-cni-conf-when-ready", &dir_arg]).unwrap();
        let err = StartError::from(conf.write().unwrap_err());
        assert!(matches!(err, StartError::CniConfig(_)), "{err:?}");
        assert_fails_in(&err, "CNI config", &[&dir_arg]);
    }

    #[test]
    fn the_cni_config_waits_only_while_the_configuration_does_not_fit() {
        assert_eq!(when_to_write(Ok(true)), WriteWhen::Now);
        assert_eq!(when_to_write(Ok(false)), WriteWhen::OnceFit);
        let unknown = ApiError::new(ErrorKind::Unavailable, "the journal is down");
        assert_eq!(when_to_write(Err(unknown)), WriteWhen::Now);
    }

    #[test]
    fn cni_uninstall_removes_only_what_the_daemon_set_up() {
        let conf = PathBuf::from("/etc/cni/net.d/05-podnet.conflist");
        assert_eq!(
            to_uninstall(Some(conf.clone()), true, true),
            [
                Removal::CniConf(conf.clone()),
                Removal::MasqueradeTables,
                Removal::SourceCheckTable
            ]
        );
        assert_eq!(
            to_uninstall(Some(conf.clone()), false, false),
            [Removal::CniConf(conf)]
        );
        assert_eq!(to_uninstall(None, true, false), [Removal::MasqueradeTables]);
        assert_eq!(to_uninstall(None, false, true), [Removal::SourceCheckTable]);
        assert!(to_uninstall(None, false, false).is_empty());
    }
}
