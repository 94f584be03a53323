//! Process plumbing the daemon and the operator share: option parsing
//! ([`options`]), the Prometheus listener ([`metrics_server`]) and text
//! ([`metrics_text`]), and the shutdown signal ([`shutdown_signal`]).

pub mod metrics_server;
pub mod metrics_text;
pub mod options;

/// Resolves on SIGTERM or SIGINT (never, when they cannot be listened for).
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
        }
        _ => std::future::pending::<()>().await,
    }
}
