//! The start's first phases: the options resolved and checked against this
//! process and kernel ([`check`]: the capabilities, the cross-node prerequisites,
//! the node's name, the pod device type), and the source check's table set up or
//! removed before any pod is served ([`set_up_source_check`]). The host name, the
//! netkit probe and the nftables table come in through a function or a trait
//! ([`SourceTable`]), so the decisions are tested without the host.

use std::ffi::OsString;

use super::StartError;
use crate::daemon::capabilities;
use crate::daemon::config::{DaemonConfig, DatapathMode};
use crate::daemon::crossnode;
use crate::daemon::options::DaemonOptions;
use crate::daemon::source_check::{self, Ensured, SourceCheckError};
use crate::datapath::{NetkitSupport, probe_netkit};

/// The options resolved and checked against this process and kernel.
pub(super) struct Checked {
    pub(super) config: DaemonConfig,
    pub(super) node_name: String,
    /// The pod device type in use (never `Auto`).
    pub(super) datapath_mode: DatapathMode,
}

/// Resolves the options and checks them against this process and kernel: the
/// capabilities, the cross-node prerequisites, the node's name, the pod device.
pub(super) fn check(opts: &DaemonOptions) -> Result<Checked, StartError> {
    let config = DaemonConfig::resolve(opts)?;
    capabilities::check(&config)?;
    crossnode::check_prerequisites(&config.cross_node)?;
    let node_name = node_name(opts.node_name.as_deref(), nix::unistd::gethostname)?;
    let datapath_mode = resolve_datapath_mode(config.datapath, probe_netkit)?;
    Ok(Checked {
        config,
        node_name,
        datapath_mode,
    })
}

/// The node's name: `--k8s-node-name` when given (not empty), else the host name.
fn node_name(
    given: Option<&str>,
    host_name: impl FnOnce() -> nix::Result<OsString>,
) -> Result<String, StartError> {
    match given {
        Some(n) if !n.is_empty() => Ok(n.to_string()),
        _ => Ok(host_name()
            .map_err(StartError::HostName)?
            .to_string_lossy()
            .to_string()),
    }
}

/// The pod device type for `--datapath-mode`: netkit is checked here, at start, so
/// a kernel without it fails the daemon, never a pod's ADD.
fn resolve_datapath_mode(
    configured: DatapathMode,
    probe: impl FnOnce() -> NetkitSupport,
) -> Result<DatapathMode, StartError> {
    match configured {
        DatapathMode::Veth => Ok(DatapathMode::Veth),
        DatapathMode::Netkit | DatapathMode::NetkitL2 => match probe() {
            NetkitSupport::Supported => Ok(configured),
            NetkitSupport::Unsupported { reason } => {
                Err(StartError::NetkitMissing { configured, reason })
            }
        },
        DatapathMode::Auto => match probe() {
            NetkitSupport::Supported => Ok(DatapathMode::Netkit),
            NetkitSupport::Unsupported { reason } => {
                tracing::info!("datapath-mode auto: using veth ({reason})");
                Ok(DatapathMode::Veth)
            }
        },
    }
}

/// The source check's nftables table: the kernel's, or a test's fake.
pub(super) trait SourceTable {
    /// Installs the table, or keeps it as it is when the kernel already has it.
    fn ensure(&self) -> Result<Ensured, SourceCheckError>;
    /// Removes the table (none: nothing to do).
    fn remove(&self) -> Result<(), SourceCheckError>;
}

/// The kernel's table.
pub(super) struct SourceCheckTable;

impl SourceTable for SourceCheckTable {
    fn ensure(&self) -> Result<Ensured, SourceCheckError> {
        source_check::ensure()
    }

    fn remove(&self) -> Result<(), SourceCheckError> {
        source_check::remove()
    }
}

/// Installs the source check's table before any pod is served (kept as it is
/// when the kernel already has it, so its counters survive a restart), or
/// removes it when the check is off.
pub(super) fn set_up_source_check(
    table: &impl SourceTable,
    enabled: bool,
) -> Result<(), StartError> {
    if !enabled {
        if let Err(e) = table.remove() {
            tracing::warn!(error = %e, "--enable-source-ip-verification=false: could not remove the source check table");
        }
        tracing::warn!(
            "source check off (--enable-source-ip-verification=false): pods can send with any source address"
        );
        return Ok(());
    }
    let ensured = table.ensure()?;
    tracing::info!(table = source_check::TABLE, outcome = ?ensured, "source check");
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::daemon::start::tests::assert_fails_in;

    fn unsupported() -> NetkitSupport {
        NetkitSupport::Unsupported {
            reason: "netkit needs Linux 6.7".into(),
        }
    }

    #[test]
    fn the_node_name_given_wins_over_the_host_name() {
        let name = node_name(Some("n1"), || panic!("the host name is not read")).unwrap();
        assert_eq!(name, "n1");
    }

    #[test]
    fn without_a_node_name_or_with_an_empty_one_the_host_name_is_the_node_name() {
        for given in [None, Some("")] {
            let name = node_name(given, || Ok(OsString::from("host-7"))).unwrap();
            assert_eq!(name, "host-7", "{given:?}");
        }
    }

    #[test]
    fn an_unreadable_host_name_says_to_set_the_node_name() {
        let err = node_name(None, || Err(nix::errno::Errno::EFAULT)).unwrap_err();
        assert!(matches!(err, StartError::HostName(_)), "{err:?}");
        assert_fails_in(
            &err,
            "node name",
            &["cannot read the host name", "set --k8s-node-name"],
        );
    }

    #[test]
    fn veth_is_used_without_probing_the_kernel() {
        let mode = resolve_datapath_mode(DatapathMode::Veth, || panic!("not probed")).unwrap();
        assert_eq!(mode, DatapathMode::Veth);
    }

    #[test]
    fn netkit_asked_for_is_used_when_the_kernel_has_it() {
        for mode in [DatapathMode::Netkit, DatapathMode::NetkitL2] {
            let got = resolve_datapath_mode(mode, || NetkitSupport::Supported).unwrap();
            assert_eq!(got, mode);
        }
    }

    #[test]
    fn netkit_asked_for_on_a_kernel_without_it_fails_the_start_naming_the_fix() {
        for mode in [DatapathMode::Netkit, DatapathMode::NetkitL2] {
            let err = resolve_datapath_mode(mode, unsupported).unwrap_err();
            assert!(
                matches!(err, StartError::NetkitMissing { configured, .. } if configured == mode),
                "{err:?}"
            );
            assert_fails_in(
                &err,
                "datapath mode",
                &[
                    &format!("--datapath-mode={mode}"),
                    "netkit needs Linux 6.7",
                    "use veth or auto",
                ],
            );
        }
    }

    #[test]
    fn auto_takes_netkit_where_the_kernel_has_it_and_veth_where_not() {
        let with = resolve_datapath_mode(DatapathMode::Auto, || NetkitSupport::Supported);
        assert_eq!(with.unwrap(), DatapathMode::Netkit);
        let without = resolve_datapath_mode(DatapathMode::Auto, unsupported);
        assert_eq!(without.unwrap(), DatapathMode::Veth);
    }

    /// A table that records what was asked of it and answers as told.
    #[derive(Default)]
    struct FakeTable {
        missing_nft: bool,
        calls: RefCell<Vec<&'static str>>,
    }

    impl SourceTable for FakeTable {
        fn ensure(&self) -> Result<Ensured, SourceCheckError> {
            self.calls.borrow_mut().push("ensure");
            match self.missing_nft {
                true => Err(SourceCheckError::NftMissing),
                false => Ok(Ensured::Installed),
            }
        }

        fn remove(&self) -> Result<(), SourceCheckError> {
            self.calls.borrow_mut().push("remove");
            match self.missing_nft {
                true => Err(SourceCheckError::NftMissing),
                false => Ok(()),
            }
        }
    }

    #[test]
    fn the_source_check_on_ensures_its_table() {
        let table = FakeTable::default();
        set_up_source_check(&table, true).unwrap();
        assert_eq!(*table.calls.borrow(), ["ensure"]);
    }

    #[test]
    fn the_source_check_off_removes_its_table_and_a_failed_removal_does_not_stop_the_start() {
        for missing_nft in [false, true] {
            let table = FakeTable {
                missing_nft,
                ..FakeTable::default()
            };
            set_up_source_check(&table, false).unwrap();
            assert_eq!(*table.calls.borrow(), ["remove"], "{missing_nft}");
        }
    }

    #[test]
    fn a_source_check_table_that_cannot_be_set_up_fails_the_start_naming_the_fix() {
        let table = FakeTable {
            missing_nft: true,
            ..FakeTable::default()
        };
        let err = set_up_source_check(&table, true).unwrap_err();
        assert!(matches!(err, StartError::SourceCheck(_)), "{err:?}");
        assert_fails_in(
            &err,
            "source check",
            &[
                "apt-get install nftables",
                "--enable-source-ip-verification=false",
            ],
        );
    }
}
