//! The CNI plugin: reads the `CNI_*` environment and the request config, runs one
//! verb (one file each), and prints the result or the error JSON on stdout
//! (exit 1 on error, never the error code as exit status). It reaches the daemon
//! only through the API client, and the kernel only through `datapath`.

mod add;
mod add_turn;
mod attachment;
mod check;
mod daemon_errors;
mod datapath_errors;
mod del;
mod delegate;
mod gc;
mod report;
pub(crate) mod shaping;
mod status;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use crate::api::client::Client;
use crate::cni::{CniEnv, CniError, Command, LATEST_VERSION, NetConf, version_reply};

/// How long a plugin call waits for the daemon before giving up.
const DAEMON_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs the plugin for this process's environment and stdin; returns the exit code.
pub fn run() -> i32 {
    // A run lasts about a millisecond: bump allocation, nothing given back to the
    // system (see `arena`).
    crate::arena::use_arena();
    // Runtimes swallow the plugin's stderr: logs are opt-in (PODNET_LOG), which also
    // keeps the filter set-up off every pod's start-up path.
    if std::env::var_os("PODNET_LOG").is_some() {
        crate::logging::init_stderr("warn");
    }
    // Room for a usual config up front: one read and the end, not a read per doubling.
    let mut stdin = Vec::with_capacity(16 * 1024);
    if let Err(e) = std::io::stdin().read_to_end(&mut stdin) {
        return fail(
            &CniError::io_failure(format!("reading the network config from stdin: {e}")),
            LATEST_VERSION,
        );
    }
    // The version of an error answer, worked out only for an error (a parse of its
    // own, as the config may not parse as a whole).
    let version = || request_version(&stdin);
    let env = match CniEnv::from_lookup(|k| std::env::var(k).ok()) {
        Ok(e) => e,
        Err(e) => return fail(&e, &version()),
    };
    if env.command == Command::Version {
        return match version_reply(&stdin) {
            Ok(out) => {
                println!("{out}");
                0
            }
            Err(e) => fail(&e, &version()),
        };
    }
    let conf = match NetConf::parse(&stdin, env.command) {
        Ok(c) => c,
        Err(e) => return fail(&e, &version()),
    };
    let client = Client::new(socket_path(&conf), DAEMON_TIMEOUT);
    let mut timings = report::Timings::start();
    let outcome = match env.command {
        Command::Add => add::add(&env, &conf, &client, &mut timings).map(Some),
        Command::Del => del::del(&env, &conf, &client, &mut timings).map(|_| None),
        Command::Check => check::check(&env, &conf, &client)
            .and_then(|_| delegate::run_configured(Command::Check, &env, &conf))
            .map(|_| None),
        Command::Status => status::status(&client)
            .and_then(|_| delegate::run_configured(Command::Status, &env, &conf))
            .map(|_| None),
        Command::Gc => gc::gc(&conf, &client)
            .and_then(|_| delegate::run_configured(Command::Gc, &env, &conf))
            .map(|_| None),
        Command::Version => Ok(None),
    };
    if matches!(env.command, Command::Add | Command::Del) {
        let owner = env
            .args
            .owner(env.container_id.as_deref().unwrap_or_default());
        let result = match &outcome {
            Ok(out) => Ok(out.as_deref().unwrap_or("")),
            Err(e) => Err(e),
        };
        let o = report::Outcome {
            verb: env.command.as_str(),
            container_id: env.container_id.as_deref().unwrap_or_default(),
            ifname: env.ifname.as_deref().unwrap_or_default(),
            owner: &owner,
            result,
        };
        report::report(&client, conf.log_file.as_deref(), timings, &o);
    }
    match outcome {
        Ok(Some(out)) => {
            println!("{out}");
            0
        }
        Ok(None) => 0,
        Err(e) => fail(&e, &conf.cni_version),
    }
}

/// Ends the plugin's process with `code` once stdout is flushed, skipping the
/// runtime's clean-up at exit: it gives the signal stack and early allocations
/// back one `munmap` each, which the exit does anyway, all at once (stderr is
/// unbuffered, and every file the plugin wrote is closed by then).
pub fn exit(code: i32) -> ! {
    let _ = std::io::stdout().flush();
    // SAFETY: `_exit` ends the process; nothing runs after it.
    unsafe { libc::_exit(code) }
}

/// The daemon socket named by the config (`socket-path`), else the default.
fn socket_path(conf: &NetConf) -> PathBuf {
    conf.socket_path
        .clone()
        .unwrap_or_else(|| PathBuf::from(crate::api::DEFAULT_SOCKET))
}

/// The version to answer an error in when the config could not be fully parsed.
fn request_version(stdin: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(stdin)
        .ok()
        .and_then(|v| {
            v.get("cniVersion")
                .and_then(|v| v.as_str())
                .map(str::to_string)
        })
        .filter(|v| crate::cni::is_supported(v))
        .unwrap_or_else(|| LATEST_VERSION.to_string())
}

fn fail(e: &CniError, version: &str) -> i32 {
    tracing::warn!(code = e.code, msg = %e.msg, details = %e.details, "CNI call failed");
    println!("{}", e.to_json(version));
    1
}
