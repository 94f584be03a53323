//! Option parsing the daemon and the operator share: Cilium's Go-style
//! booleans and durations, and a command line with the files of its `--config-dir` under it
//! (a mounted Cilium ConfigMap: one file per option).

use std::path::{Path, PathBuf};
use std::time::Duration;

/// A flag value that is not one of the booleans Cilium's flags accept.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a boolean (use true or false)")]
pub struct NotABoolean(String);

/// Parses Go-style booleans as Cilium's flags accept them.
pub fn parse_bool(s: &str) -> Result<bool, NotABoolean> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "t" | "true" | "yes" | "on" => Ok(true),
        "0" | "f" | "false" | "no" | "off" => Ok(false),
        other => Err(NotABoolean(other.to_string())),
    }
}

/// Why a flag value is not a duration.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum DurationError {
    #[error("{0:?} is not a duration (e.g. 30s, 10m)")]
    NotANumber(String),
    #[error("{0:?} has an unknown unit (use ms, s, m or h)")]
    UnknownUnit(String),
    #[error("{0:?} is not a valid duration")]
    Invalid(String),
    #[error("{0:?} is too long a duration")]
    TooLong(String),
}

/// Parses `500ms`, `30s`, `10m`, `1h` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| DurationError::NotANumber(s.to_string()))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(DurationError::UnknownUnit(s.to_string())),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(DurationError::Invalid(s.to_string()));
    }
    Duration::try_from_secs_f64(secs).map_err(|_| DurationError::TooLong(s.to_string()))
}

/// Why the options could not be read.
#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    /// A flag or a config-dir value is invalid (or help was asked for).
    #[error("{0}")]
    Flags(clap::Error),
    /// The config dir (or one of its files) could not be read.
    #[error("--config-dir {}: {source}", .path.display())]
    ConfigDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
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
        argv.extend(read_config_dir(cmd, &dir)?);
    }
    argv.extend(args.iter().cloned());
    Ok(argv)
}

/// Turns each option file `cmd` knows into `--name=value`.
fn read_config_dir(cmd: &clap::Command, dir: &Path) -> Result<Vec<String>, OptionsError> {
    let known: Vec<String> = cmd
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_string))
        .collect();
    let unreadable = |path: &Path| {
        let path = path.to_path_buf();
        move |source| OptionsError::ConfigDir { path, source }
    };
    let entries = std::fs::read_dir(dir).map_err(unreadable(dir))?;
    let mut out = Vec::new();
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(unreadable(dir))?;
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
        let value = std::fs::read_to_string(&path).map_err(unreadable(&path))?;
        out.push(format!("--{name}={}", value.trim()));
    }
    Ok(out)
}
