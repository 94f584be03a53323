//! Writing podnet's policy table to the kernel: each script through `nft -f -`
//! (`nft`), one transaction, so the table is always either the old
//! state or the new one, never half of either; and [`check`], reading it back
//! to compare with the state last written; [`suppressed`] reads the verdict
//! log's counter.

use super::check::{self, Depth, Found};
use super::render;
use super::state::{Diff, State};
use super::state::{EGRESS_MAP, FAMILY, FORWARD_CHAIN, INGRESS_MAP, INPUT_CHAIN, TABLE};
use super::verdict::{self, DropLog};
use crate::nft::{self, NftError};

/// A script nft did not apply (the table is as it was).
#[derive(Debug, thiserror::Error)]
pub enum PolicyTableError {
    #[error(
        "NetworkPolicy enforcement needs the nft tool, which is not installed (apt-get install nftables)"
    )]
    NftMissing,
    #[error("table {FAMILY} {TABLE}: {0}")]
    Nft(#[source] NftError),
}

impl From<NftError> for PolicyTableError {
    fn from(e: NftError) -> Self {
        match e {
            NftError::NotInstalled => PolicyTableError::NftMissing,
            e => PolicyTableError::Nft(e),
        }
    }
}

/// Replaces the table with `state`, its final drops logged with `log`.
pub fn install(state: &State, log: Option<&DropLog>) -> Result<(), PolicyTableError> {
    Ok(nft::apply(&render::install(state, log))?)
}

/// Applies `diff` to the table (which must hold the state it was taken from);
/// an empty diff writes nothing.
pub fn update(diff: &Diff, log: Option<&DropLog>) -> Result<(), PolicyTableError> {
    match diff.is_empty() {
        true => Ok(()),
        false => Ok(nft::apply(&render::update(diff, log))?),
    }
}

/// Removes the table (absent is fine).
pub fn remove() -> Result<(), PolicyTableError> {
    Ok(nft::apply(&format!(
        "table {FAMILY} {TABLE}\ndelete table {FAMILY} {TABLE}\n"
    ))?)
}

/// Compares the table in the kernel with `written`, the state last written, to
/// `depth`: [`Depth::Quick`] lists the chains (no rules), both verdict maps and
/// the two base chains; [`Depth::Full`] the whole table.
pub fn check(
    written: &State,
    log: Option<&DropLog>,
    depth: Depth,
) -> Result<Found, PolicyTableError> {
    let listings: Vec<serde_json::Value> = match depth {
        Depth::Quick => [
            ["chains", FAMILY].as_slice(),
            &["map", FAMILY, TABLE, INGRESS_MAP],
            &["map", FAMILY, TABLE, EGRESS_MAP],
            &["chain", FAMILY, TABLE, FORWARD_CHAIN],
            &["chain", FAMILY, TABLE, INPUT_CHAIN],
        ]
        .into_iter()
        .map(nft::list)
        .filter_map(Result::transpose)
        .collect::<Result<_, _>>()?,
        Depth::Full => nft::list_table(FAMILY, TABLE)?.into_iter().collect(),
    };
    let found = check::found(&listings);
    Ok(check::compare(&render::parts(written, log), &found, depth))
}

/// The packets the verdict log's limit kept from the log since the table was
/// installed (None: no table, or no such counter in it).
pub fn suppressed() -> Result<Option<u64>, PolicyTableError> {
    let Some(listing) = nft::list(&["counter", FAMILY, TABLE, verdict::SUPPRESSED])? else {
        return Ok(None);
    };
    let items = listing["nftables"].as_array().into_iter().flatten();
    let mut packets = items.filter_map(|item| item["counter"]["packets"].as_u64());
    Ok(packets.next())
}
