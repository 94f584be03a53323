//! Option parsing the daemon and the operator share: Cilium's Go-style
//! booleans and durations, and a command line with the files of its `--config-dir` under it
//! (a mounted Cilium ConfigMap: one file per option).

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Parses Go-style booleans as Cilium's flags accept them.
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "t" | "true" | "yes" | "on" => Ok(true),
        "0" | "f" | "false" | "no" | "off" => Ok(false),
        other => Err(format!("{other:?} is not a boolean (use true or false)")),
    }
}

/// Parses `500ms`, `30s`, `10m`, `1h` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 30s, 10m)"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("{s:?} has an unknown unit (use ms, s, m or h)")),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("{s:?} is not a valid duration"));
    }
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{s:?} is too long a duration"))
}

/// Why the options could not be read.
#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    /// A flag or a config-dir value is invalid (or help was asked for).
    #[error("{0}")]
    Flags(clap::Error),
    /// The config dir could not be read.
    #[error("{0}")]
    ConfigDir(String),
}

/// Parses `args` as command `C`, with the files of its `--config-dir` under the
/// command line (the daemon, the operator and the operator's status share it).
pub fn parse_command_with_config_dir<C: clap::Parser>(args: &[String]) -> Result<C, OptionsError> {
    let cmd = C::command();
    let argv = argv_with_config_dir(&cmd, args)?;
    let matches = cmd
        .try_get_matches_from(argv)
        .map_err(OptionsError::Flags)?;
    C::from_arg_matches(&matches).map_err(OptionsError::Flags)
}

fn find_config_dir(args: &[String]) -> Option<PathBuf> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if let Some(v) = a.strip_prefix("--config-dir=") {
            return Some(PathBuf::from(v));
        }
        if a == "--config-dir" {
            return it.next().map(PathBuf::from);
        }
    }
    None
}

/// The argv `cmd` parses: its name, the `--config-dir` files as `--name=value` (only
/// the options `cmd` knows; a Cilium ConfigMap holds many others), then `args`, so
/// flags win over files. The daemon and the operator read their config dirs with it.
fn argv_with_config_dir(cmd: &clap::Command, args: &[String]) -> Result<Vec<String>, OptionsError> {
    let mut argv = vec![cmd.get_name().to_string()];
    if let Some(dir) = find_config_dir(args) {
        argv.extend(read_config_dir(cmd, &dir).map_err(OptionsError::ConfigDir)?);
    }
    argv.extend(args.iter().cloned());
    Ok(argv)
}

/// Turns each option file `cmd` knows into `--name=value`.
fn read_config_dir(cmd: &clap::Command, dir: &Path) -> Result<Vec<String>, String> {
    let known: Vec<String> = cmd
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_string))
        .collect();
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("--config-dir {}: {e}", dir.display()))?;
    let mut out = Vec::new();
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("--config-dir {}: {e}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().to_string();
        if name.starts_with('.') || name == "config-dir" {
            continue;
        }
        if !known.contains(&name) {
            tracing::debug!(option = %name, "ignoring config-dir entry podnet does not use");
            continue;
        }
        names.push((name, entry.path()));
    }
    names.sort();
    for (name, path) in names {
        let value = std::fs::read_to_string(&path)
            .map_err(|e| format!("--config-dir {}: {e}", path.display()))?;
        out.push(format!("--{name}={}", value.trim()));
    }
    Ok(out)
}
