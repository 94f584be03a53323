//! Writing podnet's policy table to the kernel: each script through `nft -f -`
//! (`nft`), one transaction, so the table is always either the old
//! state or the new one, never half of either.

use super::render::{self, FAMILY, TABLE};
use super::state::{Diff, State};
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

/// Replaces the table with `state`.
pub fn install(state: &State) -> Result<(), PolicyTableError> {
    Ok(nft::apply(&render::install(state))?)
}

/// Applies `diff` to the table (which must hold the state it was taken from);
/// an empty diff writes nothing.
pub fn update(diff: &Diff) -> Result<(), PolicyTableError> {
    match diff.is_empty() {
        true => Ok(()),
        false => Ok(nft::apply(&render::update(diff))?),
    }
}

/// Removes the table (absent is fine).
pub fn remove() -> Result<(), PolicyTableError> {
    Ok(nft::apply(&format!(
        "table {FAMILY} {TABLE}\ndelete table {FAMILY} {TABLE}\n"
    ))?)
}
