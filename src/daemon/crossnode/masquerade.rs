//! Masquerade with nftables: podnet's own tables (`table ip podnet`, `table ip6
//! podnet`), each replaced as a whole in one `nft -f` transaction (create, delete,
//! create again: the kernel applies all of it or nothing), so no other table is
//! ever touched and no packet sees half a rule set (`nft` runs the tool).

use ipnet::IpNet;

use super::PrerequisiteError;
use super::plan::MasqueradeFamily;
use crate::nft::{self, NftError};

/// The name of podnet's nftables tables (one per family).
pub const TABLE: &str = "podnet";

/// The `nft -f` script that makes podnet's table of family `ip`/`ip6` hold
/// exactly `rules` (or removes it when `None`).
pub fn ruleset(v6: bool, rules: Option<&MasqueradeFamily>) -> String {
    let family = if v6 { "ip6" } else { "ip" };
    // `table` adds the table when absent, so the delete always finds one.
    let mut s = format!("table {family} {TABLE}\ndelete table {family} {TABLE}\n");
    if let Some(m) = rules {
        let set = |list: &[IpNet]| {
            list.iter()
                .map(IpNet::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let exempt = match m.exempt.is_empty() {
            true => String::new(),
            false => format!(" {family} daddr != {{ {} }}", set(&m.exempt)),
        };
        s.push_str(&format!(
            "table {family} {TABLE} {{\n\
             \tchain postrouting {{\n\
             \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
             \t\t{family} saddr {{ {} }}{exempt} counter masquerade comment \"podnet: pod traffic leaving the cluster\"\n\
             \t}}\n\
             }}\n",
            set(&m.sources)
        ));
    }
    s
}

/// A masquerade ruleset nft did not take.
#[derive(Debug, thiserror::Error)]
pub enum MasqueradeError {
    #[error(
        "masquerade needs the nft tool, which is not installed (apt-get install nftables), or turn it off with --enable-ipv4-masquerade=false --enable-ipv6-masquerade=false"
    )]
    NftMissing,
    #[error("nft refused podnet's masquerade rules: {0}")]
    Refused(String),
    #[error(transparent)]
    Nft(NftError),
}

/// Removes podnet's tables of both families (uninstall), in one transaction;
/// nothing else is touched, and tables that do not exist are not an error.
pub fn remove_tables() -> Result<(), MasqueradeError> {
    apply(&format!("{}{}", ruleset(false, None), ruleset(true, None)))
}

/// Runs `nft -f -` with `script`; the error says what to install or what nft said.
pub fn apply(script: &str) -> Result<(), MasqueradeError> {
    nft::apply(script).map_err(|e| match e {
        NftError::NotInstalled => MasqueradeError::NftMissing,
        NftError::Refused(msg) => MasqueradeError::Refused(msg),
        e => MasqueradeError::Nft(e),
    })
}

/// Fails with the reason when `nft` cannot be run (checked at start, so a
/// missing tool stops the daemon instead of leaving pods without masquerade).
pub fn check_nft() -> Result<(), PrerequisiteError> {
    nft::check_installed().map_err(|e| match e {
        NftError::NotInstalled => PrerequisiteError::NftMissing,
        e => PrerequisiteError::Nft(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn removal_only_creates_and_deletes_podnets_table() {
        assert_eq!(
            ruleset(false, None),
            "table ip podnet\ndelete table ip podnet\n"
        );
        assert_eq!(
            ruleset(true, None),
            "table ip6 podnet\ndelete table ip6 podnet\n"
        );
    }

    #[test]
    fn rules_masquerade_own_sources_outside_the_exempt_cidrs() {
        let m = MasqueradeFamily {
            sources: vec![net("10.1.0.0/24"), net("10.9.0.0/27")],
            exempt: vec![net("10.0.0.0/8")],
        };
        let s = ruleset(false, Some(&m));
        assert!(s.starts_with("table ip podnet\ndelete table ip podnet\ntable ip podnet {\n"));
        assert!(s.contains("type nat hook postrouting priority srcnat;"));
        assert!(
            s.contains("ip saddr { 10.1.0.0/24, 10.9.0.0/27 } ip daddr != { 10.0.0.0/8 } counter masquerade"),
            "{s}"
        );
        let m6 = MasqueradeFamily {
            sources: vec![net("fd00::/120")],
            exempt: Vec::new(),
        };
        let s = ruleset(true, Some(&m6));
        assert!(
            s.contains("ip6 saddr { fd00::/120 } counter masquerade"),
            "{s}"
        );
    }
}
