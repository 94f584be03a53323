//! Log set-up shared by the daemon and the tools: `tracing` to stderr (stdout is
//! the CNI result channel and must stay clean).

use tracing_subscriber::EnvFilter;

/// Logs to stderr at `level` (a level name or a tracing filter); `PODNET_LOG`
/// overrides it.
pub fn init_stderr(level: &str) {
    let filter = std::env::var("PODNET_LOG")
        .ok()
        .and_then(|v| EnvFilter::try_new(v).ok())
        .or_else(|| EnvFilter::try_new(level).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(ansi)
        .try_init();
}
