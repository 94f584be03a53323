//! `podnet install --cni-bin-dir DIR`: copies this binary into the CNI bin dir the
//! way a DaemonSet's init container does, atomically: a temporary name in the same
//! directory, synced, then renamed over `podnet`, so a runtime never executes a
//! half-written file.

use std::path::{Path, PathBuf};

use clap::Args;

/// `podnet install` options.
#[derive(Debug, Clone, Args)]
pub struct InstallArgs {
    /// The runtime's CNI plugin directory (e.g. /host/opt/cni/bin).
    #[arg(long = "cni-bin-dir")]
    pub cni_bin_dir: PathBuf,
    /// The binary to install (default: this one).
    #[arg(long)]
    pub source: Option<PathBuf>,
}

/// Runs `podnet install`.
pub fn run(args: &InstallArgs) -> i32 {
    let source = match &args.source {
        Some(s) => s.clone(),
        None => match std::env::current_exe() {
            Ok(p) => p,
            Err(e) => {
                eprintln!("podnet install: cannot find this binary: {e}");
                return 1;
            }
        },
    };
    match install(&source, &args.cni_bin_dir) {
        Ok(dest) => {
            println!("installed {} as {}", source.display(), dest.display());
            0
        }
        Err(e) => {
            eprintln!("podnet install: {e}");
            1
        }
    }
}

/// Copies `source` to `<dir>/podnet` atomically; returns the destination.
pub fn install(source: &Path, dir: &Path) -> Result<PathBuf, String> {
    let data =
        std::fs::read(source).map_err(|e| format!("cannot read {}: {e}", source.display()))?;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let dest = dir.join("podnet");
    let tmp = dir.join(format!(".podnet.new.{}", std::process::id()));
    crate::atomic_file::replace(&dest, &tmp, &data, 0o755)
        .map_err(|e| format!("cannot install into {}: {e}", dest.display()))?;
    Ok(dest)
}
