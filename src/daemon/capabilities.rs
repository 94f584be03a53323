//! The Linux capabilities the daemon needs, checked at start: a container that
//! lacks one fails at once with the capability's name and what it is for, not
//! later with an EPERM from the first netlink request or nft run. The check reads
//! the effective set from `/proc/self/status` (`CapEff`); which capabilities are
//! needed depends only on the configuration ([`needed`]), so the decision is pure.

use std::fmt;

use super::config::{DaemonConfig, DatapathMode};

/// A capability the daemon may need (its bit in the capability sets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    /// Netlink writes (links, addresses, routes, neighbours, FDB), nftables.
    NetAdmin,
    /// `unshare(CLONE_NEWNET)`: the netkit probe's private namespace.
    SysAdmin,
    /// AF_PACKET sockets: answering ARP and NDP (L2 announcements).
    NetRaw,
}

impl Capability {
    /// The bit number (`linux/capability.h`).
    pub fn bit(self) -> u32 {
        match self {
            Capability::NetAdmin => 12,
            Capability::SysAdmin => 21,
            Capability::NetRaw => 13,
        }
    }

    /// The name as `capsh` and the kernel's headers write it.
    pub fn name(self) -> &'static str {
        match self {
            Capability::NetAdmin => "CAP_NET_ADMIN",
            Capability::SysAdmin => "CAP_SYS_ADMIN",
            Capability::NetRaw => "CAP_NET_RAW",
        }
    }
}

/// A capability and what the daemon needs it for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    pub capability: Capability,
    pub why: &'static str,
}

impl fmt::Display for Need {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (needed to {})", self.capability.name(), self.why)
    }
}

/// Why the daemon may not start: a capability is missing, or the effective set
/// could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CapabilityError {
    #[error("{}", missing_message(.0))]
    Missing(Vec<Need>),
    #[error("cannot read the effective capabilities from /proc/self/status: {0}")]
    Unreadable(#[source] std::io::Error),
    #[error("cannot read the effective capabilities: /proc/self/status has {0}")]
    Malformed(String),
}

fn missing_message(missing: &[Need]) -> String {
    let list: Vec<String> = missing.iter().map(Need::to_string).collect();
    let (noun, pronoun) = if missing.len() == 1 {
        ("capability", "it")
    } else {
        ("capabilities", "them")
    };
    format!(
        "missing {noun} {}; add {pronoun} to the container's securityContext.capabilities.add (outside a container, run the daemon as root)",
        list.join(", ")
    )
}

/// What the daemon needs with `config`: CAP_NET_ADMIN always (the router device,
/// pod and cross-node routes, the tunnel, nftables, the forwarding sysctls), and
/// CAP_SYS_ADMIN when netkit is asked for explicitly (its probe makes a private
/// network namespace; `auto` falls back to veth without it), CAP_NET_RAW with
/// L2 announcements (the ARP and NDP answers go out on packet sockets).
pub fn needed(config: &DaemonConfig) -> Vec<Need> {
    let mut needs = vec![Need {
        capability: Capability::NetAdmin,
        why: "create the router device, the pods' host routes and the routes, tunnel and masquerade rules to other nodes (netlink, nftables), and set the forwarding sysctls",
    }];
    if matches!(
        config.datapath,
        DatapathMode::Netkit | DatapathMode::NetkitL2
    ) {
        needs.push(Need {
            capability: Capability::SysAdmin,
            why: "check at start, in a private network namespace, that the kernel has netkit (--datapath-mode=netkit); use veth or auto to run without it",
        });
    }
    if config.l2_announcements.is_some() {
        needs.push(Need {
            capability: Capability::NetRaw,
            why: "answer ARP and NDP for announced Service addresses (--enable-l2-announcements; packet sockets)",
        });
    }
    needs
}

/// The effective set of a `/proc/<pid>/status` text (its `CapEff:` line, hex).
pub fn effective_from_status(status: &str) -> Result<u64, CapabilityError> {
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .ok_or_else(|| CapabilityError::Malformed("no CapEff line".into()))?;
    u64::from_str_radix(line.trim(), 16)
        .map_err(|e| CapabilityError::Malformed(format!("CapEff {:?} ({e})", line.trim())))
}

/// The needs `effective` does not cover, in the order given.
pub fn missing(effective: u64, needs: &[Need]) -> Vec<Need> {
    needs
        .iter()
        .filter(|n| effective & (1u64 << n.capability.bit()) == 0)
        .copied()
        .collect()
}

/// Fails when this process lacks a capability `config` needs.
pub fn check(config: &DaemonConfig) -> Result<(), CapabilityError> {
    let status =
        std::fs::read_to_string("/proc/self/status").map_err(CapabilityError::Unreadable)?;
    let lacking = missing(effective_from_status(&status)?, &needed(config));
    if lacking.is_empty() {
        Ok(())
    } else {
        Err(CapabilityError::Missing(lacking))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::options::DaemonOptions;

    const NET_ADMIN_ONLY: u64 = 1 << 12;
    /// What the effective set of a root shell in a typical container shows.
    const STATUS: &str = "Name:\tpodnet\nUmask:\t0022\nState:\tS (sleeping)\n\
        CapInh:\t0000000000000000\nCapPrm:\t00000000a80425fb\nCapEff:\t00000000a80425fb\n\
        CapBnd:\t00000000a80425fb\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\n";

    fn need(capability: Capability) -> Need {
        Need {
            capability,
            why: "do it",
        }
    }

    #[test]
    fn the_effective_set_is_read_from_the_capeff_line() {
        assert_eq!(effective_from_status(STATUS).unwrap(), 0xa80425fb);
        assert_eq!(
            effective_from_status("CapEff:\t000001fffeffffff\n").unwrap(),
            0x1fffeffffff
        );
    }

    #[test]
    fn a_status_without_a_readable_capeff_is_an_error_saying_so() {
        let e = effective_from_status("Name:\tpodnet\n").unwrap_err();
        assert!(e.to_string().contains("no CapEff line"), "{e}");
        let e = effective_from_status("CapEff:\tzz\n").unwrap_err();
        assert!(e.to_string().contains(r#"CapEff "zz""#), "{e}");
    }

    #[test]
    fn only_the_needs_outside_the_effective_set_are_missing() {
        let needs = [need(Capability::NetAdmin), need(Capability::SysAdmin)];
        assert_eq!(missing(u64::MAX, &needs), vec![]);
        assert_eq!(
            missing(NET_ADMIN_ONLY, &needs),
            vec![need(Capability::SysAdmin)]
        );
        assert_eq!(missing(0, &needs), needs.to_vec());
        // The default Docker/containerd set has CAP_NET_RAW but not CAP_NET_ADMIN.
        assert_eq!(
            missing(0xa80425fb, &needs[..1]),
            vec![need(Capability::NetAdmin)]
        );
    }

    #[test]
    fn the_message_names_each_missing_capability_what_for_and_where_to_add_it() {
        let one = CapabilityError::Missing(vec![need(Capability::NetAdmin)]).to_string();
        assert_eq!(
            one,
            "missing capability CAP_NET_ADMIN (needed to do it); add it to the container's securityContext.capabilities.add (outside a container, run the daemon as root)"
        );
        let two =
            CapabilityError::Missing(vec![need(Capability::NetAdmin), need(Capability::SysAdmin)])
                .to_string();
        assert!(
            two.starts_with(
                "missing capabilities CAP_NET_ADMIN (needed to do it), CAP_SYS_ADMIN (needed to do it); add them to"
            ),
            "{two}"
        );
    }

    #[test]
    fn net_admin_is_always_needed_and_sys_admin_only_for_explicit_netkit() {
        let caps = |mode: &str| -> Vec<Capability> {
            let args = vec![format!("--datapath-mode={mode}")];
            let opts = DaemonOptions::parse_with_config_dir(&args).unwrap();
            let config = DaemonConfig::resolve(&opts).unwrap();
            needed(&config).iter().map(|n| n.capability).collect()
        };
        use Capability::*;
        assert_eq!(caps("veth"), vec![NetAdmin]);
        assert_eq!(caps("auto"), vec![NetAdmin]);
        assert_eq!(caps("netkit"), vec![NetAdmin, SysAdmin]);
        assert_eq!(caps("netkit-l2"), vec![NetAdmin, SysAdmin]);
    }

    #[test]
    fn net_raw_is_needed_only_with_l2_announcements() {
        let caps = |args: &[&str]| -> Vec<Capability> {
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            let opts = DaemonOptions::parse_with_config_dir(&args).unwrap();
            let config = DaemonConfig::resolve(&opts).unwrap();
            needed(&config).iter().map(|n| n.capability).collect()
        };
        use Capability::*;
        assert_eq!(caps(&["--enable-l2-announcements"]), vec![NetAdmin, NetRaw]);
        assert_eq!(caps(&["--enable-l2-announcements=false"]), vec![NetAdmin]);
    }
}
