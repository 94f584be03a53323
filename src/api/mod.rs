//! The daemon's REST API as both sides see it: the wire models (Cilium's JSON field
//! names), the identifier rules the API enforces, the blocking client the plugin and
//! the CLI use, and small HTTP helpers. The server's routes live in
//! `daemon::routes`; this module holds no daemon logic.

pub mod client;
pub mod delete_queue;
pub mod exhaustion;
pub mod http;
pub mod models;
pub mod start_note;
pub mod validate;

/// Default path of the daemon's unix socket.
pub const DEFAULT_SOCKET: &str = "/run/podnet/podnet.sock";

/// The endpoint id the plugin uses when it creates an endpoint (Cilium's CNI uses
/// `cilium-local:0`; the daemon assigns the real id).
pub const LOCAL_ENDPOINT_ID: &str = "cilium-local:0";
