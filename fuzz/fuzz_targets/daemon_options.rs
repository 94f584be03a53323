//! `DaemonOptions::parse_with_config_dir` (flags; config-dir files become the
//! same flags) and its value parsers `parse_duration` / `parse_bool`.
//!
//! Input: newline-separated arguments. Arguments naming `config-dir` are
//! dropped so the target never reads arbitrary directories.

#![no_main]

use libfuzzer_sys::fuzz_target;
use podnet::daemon::options::{DaemonOptions, parse_bool, parse_duration};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if s.len() > 4096 {
        return;
    }
    if let Ok(d) = parse_duration(s) {
        let _ = d.as_secs_f64();
    }
    let _ = parse_bool(s);

    let args: Vec<String> = s
        .split('\n')
        .filter(|a| !a.contains("config-dir"))
        .take(64)
        .map(str::to_string)
        .collect();
    let _ = DaemonOptions::parse_with_config_dir(&args);
});
