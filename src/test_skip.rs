//! Test-only: what a unit test does when it cannot run here (no root, a missing
//! tool). It fails, naming what is missing, unless `PODNET_ALLOW_SKIPS=1`; then it
//! appends `<test>: <reason>` to the file `PODNET_SKIP_LOG` names (`make test`
//! lists those at the end) and the test returns without checking anything. A test
//! that did not run never reads as passed. integration/harness.rs includes this
//! same file for the integration tests.

use std::io::Write;

/// Fails the calling test, or records its skip when skips are allowed.
pub fn skip(test: &str, reason: &str) {
    let allowed = std::env::var("PODNET_ALLOW_SKIPS").is_ok_and(|v| v == "1");
    assert!(
        allowed,
        "{test} cannot run here: {reason} (PODNET_ALLOW_SKIPS=1 lets it skip)"
    );
    // libtest names each test's thread after the test (one thread: "main").
    let name = match std::thread::current().name() {
        Some(thread) if thread != "main" => thread.to_string(),
        _ => test.to_string(),
    };
    eprintln!("SKIPPED {name}: {reason}");
    if let Some(log) = std::env::var_os("PODNET_SKIP_LOG") {
        let line = format!("{name}: {reason}\n");
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .unwrap_or_else(|e| panic!("recording the skip of {test} in {log:?}: {e}"));
    }
}
