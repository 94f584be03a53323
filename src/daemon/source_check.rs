//! Source address verification: a pod sends only as itself. podnet's own
//! nftables table (`table inet podnet_source`) checks every packet that arrives
//! from a pod's host link (`lxc*`) with one reverse-path FIB lookup: the route
//! back to the packet's source must leave through the link the packet came in on.
//! Every mode routes a pod's addresses to it with a /32 (/128) through its host
//! link, so this holds exactly for the addresses the pod owns, at a cost that does
//! not grow with the number of pods. A packet that fails is dropped and counted
//! by reason and family (named counters), and its link goes into a dynamic set
//! (`spoofers`, with a per-element counter, forgotten an hour after its last
//! drop) that `podnet explain` reads. Packets from other links (the uplink, the
//! tunnel device, the router device) are not looked at.
//!
//! The daemon installs the table at start and checks it every [`RESYNC`]
//! ([`keep`], the controller kit's resync); a table already as podnet would
//! write it is kept, so its counters survive a restart. Removed at stop
//! ([`remove_at_stop`]), it stays removed: the keeper runs until the process
//! exits.
//! "As podnet would write it" is a fingerprint of the rule set in the comment of
//! its first rule, and the number of rules.

use std::convert::Infallible;
use std::sync::Mutex;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::api::models::SpoofedTraffic;
use crate::controller::{self, Backoff, Controller, Resync, Timing};
use crate::datapath::HOST_LINK_PREFIX;
use crate::ipam::Family;
use crate::k8s::mirror::WatchEnded;
use crate::nft::{self, NftError};

/// The table's family and name.
pub const FAMILY: &str = "inet";
pub const TABLE: &str = "podnet_source";
/// The set of host links that sent packets with a source they do not own.
const SPOOFERS: &str = "spoofers";
/// How long a link stays in the set after its last dropped packet.
const EVIDENCE_SECONDS: u64 = 3600;
/// Both families have their counters, whichever the node allocates.
const FAMILIES: [Family; 2] = [Family::V4, Family::V6];
/// How often the table is checked against what podnet writes.
pub const RESYNC: Duration = Duration::from_secs(30);

/// Why a packet's source is not its pod's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// An address of this node (the router address, the node's own).
    NodeAddress,
    /// An address routed to another pod's host link.
    OtherPod,
    /// Anything else: no pod on this node has it.
    Foreign,
}

impl Reason {
    /// In the order the rules try them.
    pub const ALL: [Reason; 3] = [Reason::NodeAddress, Reason::OtherPod, Reason::Foreign];

    /// The metric's `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Reason::NodeAddress => "spoofed-node-address",
            Reason::OtherPod => "spoofed-other-pod-address",
            Reason::Foreign => "spoofed-foreign-address",
        }
    }

    fn counter_name(self, family: Family) -> String {
        let reason = match self {
            Reason::NodeAddress => "node_address",
            Reason::OtherPod => "other_pod",
            Reason::Foreign => "foreign",
        };
        format!("{reason}_{}", family.as_str())
    }

    /// The match that tells this reason apart (one more FIB lookup, made only for
    /// packets already found spoofed).
    fn matcher(self) -> String {
        match self {
            Reason::NodeAddress => "fib saddr type local ".into(),
            Reason::OtherPod => format!("fib saddr oifname \"{HOST_LINK_PREFIX}*\" "),
            Reason::Foreign => String::new(),
        }
    }
}

/// Packets dropped for one reason and family, as the kernel counted them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drops {
    pub reason: Reason,
    pub family: Family,
    pub packets: u64,
    pub bytes: u64,
}

/// What the kernel has of podnet's table.
#[derive(Debug, Clone, PartialEq)]
pub struct Listing {
    /// The table is exactly what podnet writes.
    pub current: bool,
    pub drops: Vec<Drops>,
    pub spoofers: Vec<SpoofedTraffic>,
}

/// What `ensure` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    /// The table was already right (its counters go on).
    Kept,
    /// The table was missing and is now installed.
    Installed,
    /// The table differed (another podnet version, an edit) and was replaced.
    Replaced,
}

/// A failure of the source check's table.
#[derive(Debug, thiserror::Error)]
pub enum SourceCheckError {
    #[error(
        "the source check (--enable-source-ip-verification, on by default) needs the nft tool, which is not installed: apt-get install nftables (dnf install nftables), or turn the check off with --enable-source-ip-verification=false"
    )]
    NftMissing,
    #[error("source check, table {FAMILY} {TABLE}: {0}")]
    Nft(#[source] NftError),
}

impl From<NftError> for SourceCheckError {
    fn from(e: NftError) -> Self {
        match e {
            NftError::NotInstalled => SourceCheckError::NftMissing,
            e => SourceCheckError::Nft(e),
        }
    }
}

/// The chains of the table, each with its hook line (if any) and its rules,
/// without the fingerprint.
fn chains() -> Vec<(&'static str, Option<&'static str>, Vec<String>)> {
    let mut spoofed = vec![format!("update @{SPOOFERS} {{ iifname }}")];
    for reason in Reason::ALL {
        for family in FAMILIES {
            spoofed.push(format!(
                "meta nfproto {} {}counter name {} drop",
                family.as_str(),
                reason.matcher(),
                reason.counter_name(family)
            ));
        }
    }
    // Neither family (cannot happen in an inet prerouting hook): still dropped.
    spoofed.push("drop".into());
    vec![
        (
            "prerouting",
            Some("type filter hook prerouting priority raw; policy accept;"),
            vec![format!("iifname \"{HOST_LINK_PREFIX}*\" jump from_pod")],
        ),
        (
            "from_pod",
            None,
            vec![
                // IPv6 duplicate address detection (from ::) and link-local
                // traffic (neighbour discovery, router solicitations, MLD) never
                // leave the link.
                "ip6 saddr { ::, fe80::/10 } return".into(),
                // The route back to the source must leave through this link.
                "fib saddr . iif oif missing jump spoofed".into(),
            ],
        ),
        ("spoofed", None, spoofed),
    ]
}

/// The table's text with `comment` on its first rule.
fn table_text(comment: &str) -> String {
    let mut s = format!("table {FAMILY} {TABLE} {{\n");
    for reason in Reason::ALL {
        for family in FAMILIES {
            s.push_str(&format!(
                "\tcounter {} {{ }}\n",
                reason.counter_name(family)
            ));
        }
    }
    s.push_str(&format!(
        "\tset {SPOOFERS} {{ type ifname; flags dynamic, timeout; counter; size 65535; timeout {EVIDENCE_SECONDS}s; }}\n"
    ));
    let mut first = true;
    for (name, hook, rules) in chains() {
        s.push_str(&format!("\tchain {name} {{\n"));
        if let Some(hook) = hook {
            s.push_str(&format!("\t\t{hook}\n"));
        }
        for rule in rules {
            match std::mem::take(&mut first) {
                true => s.push_str(&format!("\t\t{rule} comment \"{comment}\"\n")),
                false => s.push_str(&format!("\t\t{rule}\n")),
            }
        }
        s.push_str("\t}\n");
    }
    s.push_str("}\n");
    s
}

/// The comment that marks the table as this version's: a digest of the rules.
fn fingerprint() -> String {
    let digest = Sha256::digest(table_text("").as_bytes());
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("podnet source check {hex}")
}

fn rule_count() -> usize {
    chains().iter().map(|(_, _, rules)| rules.len()).sum()
}

/// The `nft -f` script that removes the table (creating it first, so the delete
/// always finds one).
pub fn removal_script() -> String {
    format!("table {FAMILY} {TABLE}\ndelete table {FAMILY} {TABLE}\n")
}

/// The `nft -f` script that replaces the table with podnet's, in one transaction.
pub fn install_script() -> String {
    format!("{}{}", removal_script(), table_text(&fingerprint()))
}

/// Reads a JSON listing of the table.
pub fn parse_listing(listing: &serde_json::Value) -> Listing {
    let (expected, mut marked, mut rules) = (fingerprint(), false, 0);
    let (mut drops, mut spoofers) = (Vec::new(), Vec::new());
    let num = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or(0);
    for (kind, body) in nft::objects(listing) {
        match kind {
            "rule" => {
                rules += 1;
                marked |= body["comment"].as_str() == Some(expected.as_str());
            }
            "counter" => {
                let name = body["name"].as_str().unwrap_or_default();
                let found = Reason::ALL.iter().find_map(|&reason| {
                    FAMILIES
                        .into_iter()
                        .find(|&f| reason.counter_name(f) == name)
                        .map(|family| (reason, family))
                });
                if let Some((reason, family)) = found {
                    drops.push(Drops {
                        reason,
                        family,
                        packets: num(body, "packets"),
                        bytes: num(body, "bytes"),
                    });
                }
            }
            "set" if body["name"].as_str() == Some(SPOOFERS) => {
                for elem in body["elem"].as_array().into_iter().flatten() {
                    let e = &elem["elem"];
                    if let Some(link) = e["val"].as_str() {
                        spoofers.push(SpoofedTraffic {
                            host_link: link.to_string(),
                            packets: num(&e["counter"], "packets"),
                            bytes: num(&e["counter"], "bytes"),
                            expires_in_s: num(e, "expires"),
                        });
                    }
                }
            }
            _ => {}
        }
    }
    Listing {
        current: marked
            && rules == rule_count()
            && drops.len() == Reason::ALL.len() * FAMILIES.len(),
        drops,
        spoofers,
    }
}

/// What the kernel has of the table (None: no table).
pub fn read() -> Result<Option<Listing>, SourceCheckError> {
    Ok(nft::list_table(FAMILY, TABLE)?.as_ref().map(parse_listing))
}

/// Installs the table unless the kernel already has it as podnet writes it.
pub fn ensure() -> Result<Ensured, SourceCheckError> {
    let had = read()?;
    if had.as_ref().is_some_and(|l| l.current) {
        return Ok(Ensured::Kept);
    }
    nft::apply(&install_script())?;
    Ok(match had {
        Some(_) => Ensured::Replaced,
        None => Ensured::Installed,
    })
}

/// Whether the table was removed at the daemon's stop (`--cni-uninstall`):
/// held while the keeper checks, so that a check in flight ends before the
/// removal and no later one puts the table back.
static REMOVED_AT_STOP: Mutex<bool> = Mutex::new(false);

/// The keeper's check: [`ensure`] unless `removed` says the table went for good
/// (None then).
fn ensure_unless_removed(removed: &Mutex<bool>) -> Result<Option<Ensured>, SourceCheckError> {
    let removed = removed.lock().unwrap_or_else(|p| p.into_inner());
    match *removed {
        true => Ok(None),
        false => ensure().map(Some),
    }
}

/// Removes the table for good: after a keeper's check in flight, and no later
/// check puts it back.
fn remove_for_good(removed: &Mutex<bool>) -> Result<(), SourceCheckError> {
    let mut removed = removed.lock().unwrap_or_else(|p| p.into_inner());
    *removed = true;
    remove()
}

/// Removes the table at the daemon's stop (`--cni-uninstall`), so that the
/// keeper, still running until the process exits, does not put it back.
pub fn remove_at_stop() -> Result<(), SourceCheckError> {
    remove_for_good(&REMOVED_AT_STOP)
}

/// Removes the table (turning the check off, uninstalling); a missing table is
/// not an error, and neither is a missing nft (then there is no table either).
pub fn remove() -> Result<(), SourceCheckError> {
    match nft::apply(&removal_script()) {
        Ok(()) | Err(NftError::NotInstalled) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The keeper's timing: a check [`RESYNC`] after the last one ended.
const KEEPER_TIMING: Timing = Timing {
    debounce: Duration::ZERO,
    min_interval: Duration::ZERO,
    resync: Some(Resync {
        every: RESYNC,
        at_once: false,
        after_each_pass: true,
    }),
    backoff: Backoff::API,
    changes_wait_for_backoff: false,
};

/// Puts the table back when someone removed or changed it: a controller with
/// no inputs and nothing to apply between its resyncs. A failed check is
/// logged and tried again at the next resync.
struct Keeper;

impl Controller for Keeper {
    type Input = Infallible;
    type Plan = ();
    type Error = Infallible;
    const WHAT: &'static str = "the source check";

    fn feed(&mut self, input: Infallible) -> Result<bool, WatchEnded> {
        match input {}
    }

    fn ready(&self) -> bool {
        true
    }

    async fn plan(&mut self) -> Option<()> {
        Some(())
    }

    async fn apply(&mut self, _plan: ()) -> Result<(), Infallible> {
        Ok(())
    }

    async fn check(&mut self, _plan: (), _resync: u32) -> Result<(), Infallible> {
        match tokio::task::spawn_blocking(|| ensure_unless_removed(&REMOVED_AT_STOP)).await {
            Ok(Ok(None | Some(Ensured::Kept))) => {}
            Ok(Ok(Some(ensured))) => {
                tracing::warn!(table = TABLE, outcome = ?ensured, "the source check table was missing or changed; podnet's is back")
            }
            Ok(Err(e)) => tracing::error!(error = %e, "source check: cannot check the table"),
            Err(e) => tracing::error!(error = %e, "source check task failed"),
        }
        Ok(())
    }
}

/// Keeps the table (runs for ever).
pub async fn keep() {
    controller::run(&mut Keeper, futures::stream::empty(), KEEPER_TIMING).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_pod_links_are_checked_with_one_lookup_and_ndp_passes() {
        let s = install_script();
        assert!(s.starts_with(
            "table inet podnet_source\ndelete table inet podnet_source\ntable inet podnet_source {\n"
        ));
        assert!(s.contains("type filter hook prerouting priority raw; policy accept;"));
        assert!(s.contains(&format!(
            "iifname \"lxc*\" jump from_pod comment \"{}\"",
            fingerprint()
        )));
        assert!(s.contains("ip6 saddr { ::, fe80::/10 } return"));
        assert!(s.contains("fib saddr . iif oif missing jump spoofed"));
        // The evidence is recorded in a rule of its own: a full set cannot
        // keep a spoofed packet from being dropped.
        assert!(s.contains("\t\tupdate @spoofers { iifname }\n"));
        assert!(s.contains(
            "meta nfproto ipv4 fib saddr oifname \"lxc*\" counter name other_pod_ipv4 drop"
        ));
        assert!(s.contains("meta nfproto ipv6 counter name foreign_ipv6 drop"));
        assert_eq!(rule_count(), 11);
    }

    #[test]
    fn a_table_removed_for_good_is_not_put_back_by_the_keeper() {
        use crate::datapath::tests::{in_private_netns, root};
        let test = "a_table_removed_for_good_is_not_put_back_by_the_keeper";
        if !root(test) {
            return;
        }
        in_private_netns(|| {
            let removed = Mutex::new(false);
            assert!(matches!(
                ensure_unless_removed(&removed),
                Ok(Some(Ensured::Installed))
            ));
            remove_for_good(&removed).expect("removed");
            assert!(matches!(ensure_unless_removed(&removed), Ok(None)));
            assert!(read().expect("read").is_none(), "put back after the stop");
        });
    }

    #[test]
    fn the_fingerprint_changes_with_the_rules() {
        assert_eq!(fingerprint(), fingerprint());
        assert!(fingerprint().starts_with("podnet source check "));
        assert_ne!(
            Sha256::digest(table_text("").as_bytes()),
            Sha256::digest(table_text("x").as_bytes())
        );
    }

    fn listing(comment: &str, extra_rules: usize) -> serde_json::Value {
        let mut objects = vec![serde_json::json!({"table": {"family": "inet", "name": TABLE}})];
        for reason in Reason::ALL {
            for family in FAMILIES {
                let packets = u64::from(reason == Reason::OtherPod && family == Family::V6) * 3;
                objects.push(serde_json::json!({"counter": {
                    "name": reason.counter_name(family), "packets": packets, "bytes": packets * 100
                }}));
            }
        }
        objects.push(serde_json::json!({"set": {"name": "spoofers", "elem": [
            {"elem": {"val": "lxc0123456789ab", "expires": 3598, "counter": {"packets": 3, "bytes": 300}}}
        ]}}));
        objects.push(serde_json::json!({"rule": {"chain": "prerouting", "comment": comment}}));
        for _ in 1..rule_count() + extra_rules {
            objects.push(serde_json::json!({"rule": {"chain": "spoofed"}}));
        }
        serde_json::json!({ "nftables": objects })
    }

    #[test]
    fn a_listing_gives_counters_evidence_and_whether_it_is_current() {
        let l = parse_listing(&listing(&fingerprint(), 0));
        assert!(l.current);
        assert_eq!(l.drops.len(), 6);
        let other6 = l
            .drops
            .iter()
            .find(|d| d.reason == Reason::OtherPod && d.family == Family::V6)
            .map(|d| (d.packets, d.bytes));
        assert_eq!(other6, Some((3, 300)));
        assert_eq!(
            l.spoofers,
            vec![SpoofedTraffic {
                host_link: "lxc0123456789ab".into(),
                packets: 3,
                bytes: 300,
                expires_in_s: 3598,
            }]
        );
        assert!(!parse_listing(&listing("podnet source check 000000000000", 0)).current);
        assert!(!parse_listing(&listing(&fingerprint(), 1)).current);
        assert!(!parse_listing(&serde_json::json!({"nftables": []})).current);
    }
}
