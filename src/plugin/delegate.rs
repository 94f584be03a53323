//! Delegated-plugin IPAM (`ipam.type` set in the network config): finding the
//! IPAM plugin in `CNI_PATH` and running it the way libcni's `invoke.Delegate*`
//! does (Cilium's `allocateIPsWithDelegatedPlugin`, reference §10).
//!
//! The delegate gets the caller's environment with `CNI_COMMAND` set to the
//! verb and the **original** stdin bytes; it prints its result (ADD) or its
//! error JSON (exit status non-zero) on stdout, logs on stderr.
//!
//! Error codes:
//! - `ipam.type` empty or not a plain file name, or no executable of that name
//!   in `CNI_PATH` → 7 (invalid network config), libcni's wording
//!   `failed to find plugin "x" in path [/a /b]`. `CNI_PATH` empty → 4.
//! - The delegate cannot be executed (permissions, bad interpreter), or a pipe
//!   to it fails → 5.
//! - ADD exited 0 but stdout is empty, not JSON or not a result → 6, the
//!   message quotes (truncated) what it printed.
//! - Non-zero exit with an error JSON on stdout → **its** code (0 becomes
//!   [`DELEGATE_FAILED`]), `msg` prefixed `delegated IPAM plugin <name>: `, its
//!   `details` kept.
//! - Non-zero exit without an error JSON, or killed by a signal →
//!   [`DELEGATE_FAILED`] (105), quoting its stderr (else its stdout).
//! - Still running after the timeout → the process group is killed, code 11
//!   (try again later: the runtime retries).

use std::ffi::OsString;
use std::io::{ErrorKind, Read, Write};
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use serde_json::Value;

use crate::cni::{CniArgs, CniEnv, CniError, CniResult, Command, NetConf};

/// 105 (podnet): the delegated IPAM plugin failed without a usable CNI error
/// (non-zero exit without an error JSON, a crash by signal, an error JSON
/// with code 0).
pub const DELEGATE_FAILED: u32 = 105;

/// One family's address from a delegated IPAM result: the plain address, the
/// address with the prefix length the delegate returned (host bits kept, e.g.
/// `10.1.2.3/24`), and the gateway.
pub type FamilyAddress = (IpAddr, IpNet, Option<IpAddr>);

/// The most of the delegate's stdout that is kept (a result is a few hundred bytes).
const MAX_STDOUT: usize = 1 << 20;
/// The most of the delegate's stderr that is kept; the rest is read and dropped.
const MAX_STDERR: usize = 64 << 10;
/// How many characters of the delegate's output an error message quotes.
const QUOTE_CHARS: usize = 256;
/// Attempts when exec fails with "text file busy" (the binary being written,
/// or a write fd leaked into a concurrent fork); libcni retries too.
const TXTBSY_ATTEMPTS: u32 = 5;
/// How long to wait for the delegate's output to close once it has exited
/// when the timeout is already (nearly) used up.
const OUTPUT_GRACE: Duration = Duration::from_millis(200);

/// Finds the delegated plugin `name` (the config's `ipam.type`): the first
/// directory of `cni_path` holding an executable regular file of that name
/// (symlinks followed). Non-executable files of that name are skipped and
/// named in the error's details.
///
/// Errors: `name` empty, containing `/` or NUL, or `.`/`..` → 7; `cni_path`
/// empty → 4 naming `CNI_PATH`; not found → 7,
/// `failed to find plugin "x" in path [/a /b]`.
pub fn find_plugin(name: &str, cni_path: &[PathBuf]) -> Result<PathBuf, CniError> {
    if name.is_empty() {
        return Err(CniError::invalid_network_config(
            "no delegated IPAM plugin: ipam.type is empty",
        ));
    }
    if name.contains('/') || name.contains('\0') || name == "." || name == ".." {
        return Err(CniError::invalid_network_config(format!(
            "invalid IPAM plugin name {name:?}: ipam.type must be a plain file name"
        )));
    }
    if cni_path.is_empty() {
        return Err(CniError::invalid_env(format!(
            "failed to find plugin {name:?}: CNI_PATH is empty"
        )));
    }
    let mut not_executable = Vec::new();
    for dir in cni_path {
        let candidate = dir.join(name);
        if let Ok(meta) = std::fs::metadata(&candidate)
            && meta.is_file()
        {
            if meta.permissions().mode() & 0o111 != 0 {
                return Ok(candidate);
            }
            not_executable.push(candidate.display().to_string());
        }
    }
    let dirs: Vec<String> = cni_path.iter().map(|d| d.display().to_string()).collect();
    let err = CniError::invalid_network_config(format!(
        "failed to find plugin {name:?} in path [{}]",
        dirs.join(" ")
    ));
    Err(if not_executable.is_empty() {
        err
    } else {
        err.with_details(format!("not executable: {}", not_executable.join(" ")))
    })
}

/// Runs the delegated IPAM plugin at `plugin` for `command`.
///
/// - Environment: this process's environment, with `CNI_COMMAND` = the verb,
///   and `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_IFNAME` and `CNI_PATH` (joined
///   with `:`) set from `env` where `env` has them (otherwise inherited as
///   they are). `CNI_ARGS` is inherited unchanged (unknown keys included);
///   only when this process has none is it rebuilt from `env.args`.
/// - stdin: `stdin`, the caller's original request bytes.
/// - The delegate runs in its own process group; after `timeout` the whole
///   group is killed (a shell's children too) and the call fails with code 11.
/// - stdout is kept up to 1 MiB, stderr up to 64 KiB (both fully drained).
///
/// ADD returns the parsed result (`Some`); every other verb returns `None` on
/// success and ignores stdout. See the module docs for the error codes.
pub fn delegate(
    command: Command,
    plugin: &Path,
    env: &CniEnv,
    stdin: &[u8],
    timeout: Duration,
) -> Result<Option<CniResult>, CniError> {
    let name = plugin_name(plugin);
    let output = execute(command, plugin, &name, env, stdin, timeout)?;
    if !output.stderr.bytes.is_empty() {
        tracing::debug!(
            plugin = %name,
            verb = command.as_str(),
            stderr = %String::from_utf8_lossy(&output.stderr.bytes),
            "delegated IPAM plugin stderr"
        );
    }
    interpret(
        command,
        &name,
        output.status,
        &output.stdout,
        &output.stderr,
    )
}

/// The first IPv4 and the first IPv6 address of a delegated IPAM result, each
/// with its prefix as returned and its gateway (a gateway of the other family
/// is dropped). The pod still gets the address as /32 or /128 (Cilium's
/// behaviour, reference §10 "Consequences").
pub fn ipam_addresses(result: &CniResult) -> (Option<FamilyAddress>, Option<FamilyAddress>) {
    let first = |v4: bool| {
        result
            .ips
            .iter()
            .find(|c| c.address.addr().is_ipv4() == v4)
            .map(|c| {
                let gw = c.gateway.filter(|g| g.is_ipv4() == v4);
                (c.address.addr(), c.address, gw)
            })
    };
    (first(true), first(false))
}

/// The plugin's file name, for messages.
fn plugin_name(plugin: &Path) -> String {
    plugin
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| plugin.display().to_string())
}

/// `delegated IPAM plugin <name>: `.
fn prefix(name: &str) -> String {
    format!("delegated IPAM plugin {name}: ")
}

/// Bytes read from one of the delegate's output pipes.
#[derive(Debug, Default)]
struct Captured {
    bytes: Vec<u8>,
    /// More was written than kept.
    truncated: bool,
}

/// What one run of the delegate produced.
#[derive(Debug)]
struct Output {
    status: ExitStatus,
    stdout: Captured,
    stderr: Captured,
}

/// Spawns the delegate, feeds stdin, drains its output and waits for it, up to
/// `timeout`.
fn execute(
    command: Command,
    plugin: &Path,
    name: &str,
    env: &CniEnv,
    stdin: &[u8],
    timeout: Duration,
) -> Result<Output, CniError> {
    let verb = command.as_str();
    let deadline = Instant::now() + timeout;
    let mut cmd = delegate_command(verb, plugin, env);
    let mut child = spawn(&mut cmd, deadline).map_err(|e| {
        CniError::io_failure(format!(
            "{}cannot execute {}: {e}",
            prefix(name),
            plugin.display()
        ))
    })?;

    // Feed stdin from a thread: a delegate that does not read it (or reads
    // it late) must not block us. Write errors (EPIPE when it exits without
    // reading) are the delegate's business; dropping the pipe closes it.
    if let Some(mut pipe) = child.stdin.take() {
        let input = stdin.to_vec();
        thread::spawn(move || {
            let _ = pipe.write_all(&input);
        });
    }
    let (done_tx, done_rx) = mpsc::channel();
    let stdout = Arc::new(Mutex::new(Captured::default()));
    let stderr = Arc::new(Mutex::new(Captured::default()));
    if let Some(pipe) = child.stdout.take() {
        drain(pipe, MAX_STDOUT, Arc::clone(&stdout), done_tx.clone());
    }
    if let Some(pipe) = child.stderr.take() {
        drain(pipe, MAX_STDERR, Arc::clone(&stderr), done_tx);
    }
    let take = |c: &Arc<Mutex<Captured>>| {
        std::mem::take(&mut *c.lock().unwrap_or_else(|p| p.into_inner()))
    };

    let timed_out = |stderr: &Arc<Mutex<Captured>>| {
        let err = CniError::try_again_later(format!(
            "{}{verb} did not finish within {}; killed",
            prefix(name),
            fmt_duration(timeout)
        ));
        match quote_opt(&take(stderr)) {
            Some(q) => err.with_details(format!("stderr: {q}")),
            None => err,
        }
    };

    let status = match wait_for_exit(&mut child, deadline) {
        Ok(Some(status)) => status,
        Ok(None) => return Err(timed_out(&stderr)),
        Err(e) => {
            return Err(CniError::io_failure(format!(
                "{}waiting for {verb}: {e}",
                prefix(name)
            )));
        }
    };

    // Both pipes close when the delegate and everything it started are gone.
    // A leftover child still holding them is killed with the group.
    let wait_until = deadline.max(Instant::now() + OUTPUT_GRACE);
    for _ in 0..2 {
        let left = wait_until.saturating_duration_since(Instant::now());
        if done_rx.recv_timeout(left).is_err() {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            return Err(timed_out(&stderr).with_details(format!(
                "{verb} exited ({}) but a process it started kept its output open",
                fmt_status(status)
            )));
        }
    }
    Ok(Output {
        status,
        stdout: take(&stdout),
        stderr: take(&stderr),
    })
}

/// The delegate's command line: `plugin` with `CNI_COMMAND=verb`, the CNI
/// environment of this call (`CNI_ARGS` only when the runtime set none), piped
/// stdio, in a process group of its own (so a timeout kills all it started).
fn delegate_command(verb: &str, plugin: &Path, env: &CniEnv) -> std::process::Command {
    let mut cmd = std::process::Command::new(plugin);
    cmd.env("CNI_COMMAND", verb)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if let Some(id) = &env.container_id {
        cmd.env("CNI_CONTAINERID", id);
    }
    if let Some(netns) = &env.netns {
        cmd.env("CNI_NETNS", netns);
    }
    if let Some(ifname) = &env.ifname {
        cmd.env("CNI_IFNAME", ifname);
    }
    if !env.path.is_empty() {
        let mut joined = OsString::new();
        for (i, dir) in env.path.iter().enumerate() {
            if i > 0 {
                joined.push(":");
            }
            joined.push(dir);
        }
        cmd.env("CNI_PATH", joined);
    }
    if std::env::var_os("CNI_ARGS").is_none_or(|a| a.is_empty())
        && let Some(args) = args_string(&env.args)
    {
        cmd.env("CNI_ARGS", args);
    }
    cmd
}

/// Polls `child` until it exits (its status) or `deadline` passes (None). On
/// the deadline, and when waiting fails, its process group is killed first.
fn wait_for_exit(child: &mut Child, deadline: Instant) -> std::io::Result<Option<ExitStatus>> {
    let mut nap = Duration::from_millis(1);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(Some(status)),
            Ok(None) => {}
            Err(e) => {
                kill_group(child);
                return Err(e);
            }
        }
        let now = Instant::now();
        if now >= deadline {
            kill_group(child);
            return Ok(None);
        }
        thread::sleep(nap.min(deadline - now));
        nap = (nap * 2).min(Duration::from_millis(20));
    }
}

/// Spawns `cmd`, retrying while exec fails with ETXTBSY (before `deadline`).
fn spawn(cmd: &mut std::process::Command, deadline: Instant) -> std::io::Result<Child> {
    let mut attempt = 1;
    loop {
        match cmd.spawn() {
            Err(e)
                if e.raw_os_error() == Some(libc::ETXTBSY)
                    && attempt < TXTBSY_ATTEMPTS
                    && Instant::now() + Duration::from_millis(100) < deadline =>
            {
                attempt += 1;
                thread::sleep(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// Kills the delegate's process group (it is the group leader) and reaps it.
fn kill_group(child: &mut Child) {
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// Reads `pipe` to EOF on a thread, keeping at most `max` bytes in `into`,
/// then reports on `done`.
fn drain(
    mut pipe: impl Read + Send + 'static,
    max: usize,
    into: Arc<Mutex<Captured>>,
    done: mpsc::Sender<()>,
) {
    thread::spawn(move || {
        let mut buf = [0u8; 8192];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let mut c = into.lock().unwrap_or_else(|p| p.into_inner());
                    let room = max.saturating_sub(c.bytes.len());
                    c.bytes.extend_from_slice(&buf[..n.min(room)]);
                    if n > room {
                        c.truncated = true;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = done.send(());
    });
}

/// Rebuilds a `CNI_ARGS` string from the parsed keys, `None` when there are none.
fn args_string(args: &CniArgs) -> Option<String> {
    let pairs: Vec<String> = [
        ("K8S_POD_NAMESPACE", &args.pod_namespace),
        ("K8S_POD_NAME", &args.pod_name),
        ("K8S_POD_INFRA_CONTAINER_ID", &args.pod_infra_container_id),
        ("K8S_POD_UID", &args.pod_uid),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={v}")))
    .collect();
    (!pairs.is_empty()).then(|| format!("IgnoreUnknown=1;{}", pairs.join(";")))
}

/// Turns the delegate's exit status and output into the call's outcome.
fn interpret(
    command: Command,
    name: &str,
    status: ExitStatus,
    stdout: &Captured,
    stderr: &Captured,
) -> Result<Option<CniResult>, CniError> {
    let verb = command.as_str();
    let pre = prefix(name);
    if let Some(sig) = status.signal() {
        let signame = nix::sys::signal::Signal::try_from(sig)
            .map(|s| format!(" ({})", s.as_str()))
            .unwrap_or_default();
        let err = CniError::new(
            DELEGATE_FAILED,
            format!("{pre}{verb} killed by signal {sig}{signame}"),
        );
        return Err(match quote_opt(stderr) {
            Some(q) => err.with_details(format!("stderr: {q}")),
            None => err,
        });
    }
    if !status.success() {
        if let Some(e) = error_json(&stdout.bytes) {
            let code = if e.code == 0 { DELEGATE_FAILED } else { e.code };
            return Err(CniError::new(code, format!("{pre}{}", e.msg)).with_details(e.details));
        }
        let said = quote_opt(stderr).or_else(|| quote_opt(stdout));
        let msg = format!("{pre}{verb} failed ({})", fmt_status(status));
        return Err(CniError::new(
            DELEGATE_FAILED,
            match said {
                Some(q) => format!("{msg}: {q}"),
                None => msg,
            },
        ));
    }
    if command != Command::Add {
        return Ok(None);
    }
    let bad = |why: String| {
        let err =
            CniError::decode_failure(format!("{pre}could not interpret {verb} result: {why}"));
        match quote_opt(stderr) {
            Some(q) => err.with_details(format!("stderr: {q}")),
            None => err,
        }
    };
    if stdout.truncated {
        return Err(bad(format!(
            "output longer than {MAX_STDOUT} bytes: {}",
            quote(stdout)
        )));
    }
    if stdout.bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(bad("it printed nothing".into()));
    }
    let parsed = serde_json::from_slice::<Value>(&stdout.bytes)
        .and_then(CniResult::from_value)
        .map_err(|e| bad(format!("{e}: {}", quote(stdout))))?;
    Ok(Some(parsed))
}

/// A CNI error object parsed from a failed delegate's stdout.
fn error_json(stdout: &[u8]) -> Option<CniError> {
    let value: Value = serde_json::from_slice(stdout).ok()?;
    let obj = value.as_object()?;
    let code = obj.get("code").and_then(Value::as_u64);
    let msg = obj.get("msg").and_then(Value::as_str);
    if code.is_none() && msg.is_none() {
        return None;
    }
    let code = code.map_or(0, |c| u32::try_from(c).unwrap_or(DELEGATE_FAILED));
    let details = obj.get("details").and_then(Value::as_str).unwrap_or("");
    Some(CniError::new(code, msg.unwrap_or("")).with_details(details))
}

/// The output as a quoted, single-line string of at most [`QUOTE_CHARS`]
/// characters (trimmed), `…` marking a cut.
fn quote(c: &Captured) -> String {
    let text = String::from_utf8_lossy(&c.bytes);
    let text = text.trim();
    let mut cut: String = text.chars().take(QUOTE_CHARS).collect();
    if cut.len() < text.len() || c.truncated {
        cut.push('…');
    }
    format!("{cut:?}")
}

/// [`quote`], or `None` for blank output.
fn quote_opt(c: &Captured) -> Option<String> {
    (!c.bytes.iter().all(u8::is_ascii_whitespace)).then(|| quote(c))
}

fn fmt_status(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("signal {sig}"),
        _ => status.to_string(),
    }
}

fn fmt_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 && d.as_secs() > 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// How long a delegated IPAM plugin may take.
pub const DELEGATE_TIMEOUT: Duration = Duration::from_secs(30);

/// The delegated IPAM plugin named by the config's `ipam.type`, if any.
pub fn ipam_type(conf: &NetConf) -> Option<&str> {
    conf.ipam
        .as_ref()
        .and_then(|v| v.get("type"))
        .and_then(|t| t.as_str())
        .filter(|t| !t.is_empty())
}

/// Runs the config's delegated IPAM plugin for `command` with the config as the
/// runtime sent it. `Ok(None)` when the config names no delegate.
pub fn run_configured(
    command: Command,
    env: &CniEnv,
    conf: &NetConf,
) -> Result<Option<CniResult>, CniError> {
    let Some(name) = ipam_type(conf) else {
        return Ok(None);
    };
    let plugin = find_plugin(name, &env.path)?;
    let stdin = serde_json::to_vec(&conf.raw)
        .map_err(|e| CniError::io_failure(format!("encoding the config: {e}")))?;
    delegate(command, &plugin, env, &stdin, DELEGATE_TIMEOUT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_dir::{TestDir, shell_script as script};

    const HOST_LOCAL: &str = "/usr/lib/cni/host-local";
    const T: Duration = Duration::from_secs(20);

    fn env(command: Command) -> CniEnv {
        CniEnv {
            command,
            container_id: Some("c1".into()),
            netns: Some("/proc/self/ns/net".into()),
            ifname: Some("eth0".into()),
            args: CniArgs::default(),
            path: vec![PathBuf::from("/usr/lib/cni")],
        }
    }

    fn host_local_conf(data_dir: &Path) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "t",
            "type": "podnet",
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": "10.99.7.0/24"}]],
                "dataDir": data_dir,
            }
        }))
        .unwrap()
    }

    fn host_local() -> Option<PathBuf> {
        if Path::new(HOST_LOCAL).is_file() {
            Some(find_plugin("host-local", &[PathBuf::from("/usr/lib/cni")]).unwrap())
        } else {
            let why = format!("{HOST_LOCAL} is not installed (containernetworking-plugins)");
            crate::test_skip::skip("delegation to host-local", &why);
            None
        }
    }

    /// Files (allocations) in host-local's per-network directory.
    fn state_files(data: &Path) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(data.join("t")) else {
            return Vec::new();
        };
        let mut names: Vec<String> = rd
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.parse::<IpAddr>().is_ok())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn host_local_add_then_del() {
        let Some(plugin) = host_local() else { return };
        let data = TestDir::new("delegate-hl");
        let conf = host_local_conf(&data);

        let result = delegate(Command::Add, &plugin, &env(Command::Add), &conf, T)
            .unwrap()
            .expect("ADD returns a result");
        assert!(result.interfaces.is_empty());
        let subnet: IpNet = "10.99.7.0/24".parse().unwrap();
        let (v4, v6) = ipam_addresses(&result);
        let (ip, net, gw) = v4.expect("an IPv4 address");
        assert!(subnet.contains(&ip), "{ip}");
        assert_eq!(net.prefix_len(), 24);
        assert_eq!(net.addr(), ip);
        assert_eq!(gw, Some("10.99.7.1".parse().unwrap()));
        assert_eq!(v6, None);
        assert_eq!(state_files(&data), vec![ip.to_string()]);

        // CHECK and DEL print nothing on success.
        assert_eq!(
            delegate(Command::Del, &plugin, &env(Command::Del), &conf, T).unwrap(),
            None
        );
        assert!(state_files(&data).is_empty());
        // DEL is idempotent.
        assert_eq!(
            delegate(Command::Del, &plugin, &env(Command::Del), &conf, T).unwrap(),
            None
        );
    }

    #[test]
    fn host_local_error_code_comes_through() {
        let Some(plugin) = host_local() else { return };
        let data = TestDir::new("delegate-hl-bad");
        // A range host-local refuses: its error JSON (code and msg) is surfaced.
        let conf = serde_json::to_vec(&serde_json::json!({
            "cniVersion": "1.0.0", "name": "t", "type": "podnet",
            "ipam": {"type": "host-local", "ranges": [[{"subnet": "not-a-cidr"}]],
                     "dataDir": &*data},
        }))
        .unwrap();
        let e = delegate(Command::Add, &plugin, &env(Command::Add), &conf, T).unwrap_err();
        assert!(
            e.msg.starts_with("delegated IPAM plugin host-local: "),
            "{e:?}"
        );
        // host-local answers {"code":999,"msg":"invalid CIDR address: not-a-cidr"}.
        assert_ne!(e.code, DELEGATE_FAILED, "{e:?}");
        assert!(e.msg.contains("not-a-cidr"), "{e:?}");
        assert!(state_files(&data).is_empty());
    }

    #[test]
    fn find_plugin_search_order_and_errors() {
        let a = TestDir::new("delegate-fa");
        let b = TestDir::new("delegate-fb");
        script(&b, "ipam", "exit 0");
        script(&a, "ipam", "exit 0");
        let path = [a.to_path_buf(), b.to_path_buf()];
        assert_eq!(find_plugin("ipam", &path).unwrap(), a.join("ipam"));

        let e = find_plugin("nope", &path).unwrap_err();
        assert_eq!(e.code, CniError::INVALID_NETWORK_CONFIG);
        assert_eq!(
            e.msg,
            format!(
                "failed to find plugin \"nope\" in path [{} {}]",
                a.display(),
                b.display()
            )
        );

        // A non-executable file and a directory of that name are skipped.
        std::fs::write(a.join("plain"), "#!/bin/sh\n").unwrap();
        std::fs::create_dir(b.join("plain")).unwrap();
        let e = find_plugin("plain", &path).unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.details.contains("not executable"), "{e:?}");
        assert!(e.details.contains(&a.join("plain").display().to_string()));

        for bad in ["", ".", "..", "a/b", "/usr/lib/cni/host-local", "x\0y"] {
            let e = find_plugin(bad, &path).unwrap_err();
            assert_eq!(e.code, 7, "{bad:?}: {e:?}");
        }
        let e = find_plugin("ipam", &[]).unwrap_err();
        assert_eq!(e.code, CniError::INVALID_ENV);
        assert!(
            e.msg.contains("CNI_PATH") && e.msg.contains("ipam"),
            "{e:?}"
        );
    }

    #[test]
    fn missing_binary_is_io_failure() {
        let dir = TestDir::new("delegate-missing");
        let e = delegate(
            Command::Add,
            &dir.join("gone"),
            &env(Command::Add),
            b"{}",
            T,
        )
        .unwrap_err();
        assert_eq!(e.code, CniError::IO_FAILURE);
        assert!(
            e.msg
                .starts_with("delegated IPAM plugin gone: cannot execute"),
            "{e:?}"
        );
    }

    #[test]
    fn environment_and_stdin_are_passed() {
        let dir = TestDir::new("delegate-env");
        let plugin = script(
            &dir,
            "spy",
            &format!(
                r#"d={}
cat > "$d/stdin"
env | grep '^CNI_' | sort > "$d/env"
echo '{{"cniVersion":"1.0.0","ips":[{{"address":"10.0.0.5/24","gateway":"10.0.0.1"}},{{"address":"fd00::5/64"}}]}}'"#,
                dir.display()
            ),
        );
        let mut e = env(Command::Add);
        e.path = vec![PathBuf::from("/x"), PathBuf::from("/y")];
        e.args = CniArgs::parse("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p").unwrap();
        let stdin = br#"{"cniVersion":"1.0.0","name":"t","ipam":{"type":"spy"}}"#;
        let result = delegate(Command::Add, &plugin, &e, stdin, T)
            .unwrap()
            .unwrap();
        assert_eq!(std::fs::read(dir.join("stdin")).unwrap(), stdin);
        let seen = std::fs::read_to_string(dir.join("env")).unwrap();
        for want in [
            "CNI_COMMAND=ADD",
            "CNI_CONTAINERID=c1",
            "CNI_NETNS=/proc/self/ns/net",
            "CNI_IFNAME=eth0",
            "CNI_PATH=/x:/y",
        ] {
            assert!(seen.lines().any(|l| l == want), "{want} not in\n{seen}");
        }
        if std::env::var_os("CNI_ARGS").is_none() {
            assert!(
                seen.lines()
                    .any(|l| l == "CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p"),
                "{seen}"
            );
        }
        let (v4, v6) = ipam_addresses(&result);
        assert_eq!(
            v4,
            Some((
                "10.0.0.5".parse().unwrap(),
                "10.0.0.5/24".parse().unwrap(),
                Some("10.0.0.1".parse().unwrap())
            ))
        );
        assert_eq!(
            v6,
            Some((
                "fd00::5".parse().unwrap(),
                "fd00::5/64".parse().unwrap(),
                None
            ))
        );

        // DEL gets CNI_COMMAND=DEL and its stdout is ignored.
        assert_eq!(
            delegate(Command::Del, &plugin, &env(Command::Del), stdin, T).unwrap(),
            None
        );
        let seen = std::fs::read_to_string(dir.join("env")).unwrap();
        assert!(seen.lines().any(|l| l == "CNI_COMMAND=DEL"), "{seen}");
    }

    #[test]
    fn garbage_stdout() {
        let dir = TestDir::new("delegate-garbage");
        let plugin = script(
            &dir,
            "junk",
            "echo 'this is not a CNI result'; echo oops >&2",
        );
        let e = delegate(Command::Add, &plugin, &env(Command::Add), b"{}", T).unwrap_err();
        assert_eq!(e.code, CniError::DECODE_FAILURE);
        assert!(
            e.msg
                .starts_with("delegated IPAM plugin junk: could not interpret ADD result: "),
            "{e:?}"
        );
        assert!(e.msg.contains(r#""this is not a CNI result""#), "{e:?}");
        assert_eq!(e.details, r#"stderr: "oops""#);
        // Outside ADD stdout does not matter.
        for verb in [Command::Del, Command::Check, Command::Status, Command::Gc] {
            assert_eq!(delegate(verb, &plugin, &env(verb), b"{}", T).unwrap(), None);
        }

        // Long garbage is quoted truncated; a JSON non-result and silence fail too.
        let long = script(&dir, "long", "head -c 5000 /dev/zero | tr '\\0' x");
        let e = delegate(Command::Add, &long, &env(Command::Add), b"{}", T).unwrap_err();
        assert_eq!(e.code, 6);
        assert!(e.msg.len() < 600 && e.msg.contains("xxx…\""), "{}", e.msg);
        let arr = script(&dir, "arr", "echo '[1,2]'");
        let e = delegate(Command::Add, &arr, &env(Command::Add), b"{}", T).unwrap_err();
        assert_eq!(e.code, 6);
        assert!(e.msg.contains("[1,2]"), "{e:?}");
        let bad_ip = script(&dir, "badip", r#"echo '{"ips":[{"address":"10.0.0.5"}]}'"#);
        let e = delegate(Command::Add, &bad_ip, &env(Command::Add), b"{}", T).unwrap_err();
        assert_eq!(e.code, 6, "{e:?}");
        let quiet = script(&dir, "quiet", "exit 0");
        let e = delegate(Command::Add, &quiet, &env(Command::Add), b"{}", T).unwrap_err();
        assert_eq!(e.code, 6);
        assert!(e.msg.ends_with("it printed nothing"), "{e:?}");
    }

    #[test]
    fn error_json_is_surfaced() {
        let dir = TestDir::new("delegate-busy");
        let plugin = script(
            &dir,
            "busy",
            r#"echo '{"cniVersion":"1.0.0","code":11,"msg":"busy"}'; exit 1"#,
        );
        for verb in [Command::Add, Command::Del, Command::Status] {
            let e = delegate(verb, &plugin, &env(verb), b"{}", T).unwrap_err();
            assert_eq!(e.code, 11);
            assert_eq!(e.msg, "delegated IPAM plugin busy: busy");
            assert_eq!(e.details, "");
        }
        let detailed = script(
            &dir,
            "full",
            r#"echo '{"code":101,"msg":"no room","details":"range 10.0.0.0/30 full"}'; exit 3"#,
        );
        let e = delegate(Command::Add, &detailed, &env(Command::Add), b"{}", T).unwrap_err();
        assert_eq!(
            (e.code, e.msg.as_str(), e.details.as_str()),
            (
                101,
                "delegated IPAM plugin full: no room",
                "range 10.0.0.0/30 full"
            )
        );
        let zero = script(&dir, "zero", r#"echo '{"code":0,"msg":"odd"}'; exit 1"#);
        let e = delegate(Command::Add, &zero, &env(Command::Add), b"{}", T).unwrap_err();
        assert_eq!(
            (e.code, e.msg.as_str()),
            (DELEGATE_FAILED, "delegated IPAM plugin zero: odd")
        );
    }

    #[test]
    fn failure_without_error_json_uses_stderr() {
        let dir = TestDir::new("delegate-fail");
        let plugin = script(
            &dir,
            "fail",
            "echo not json; echo 'disk on fire' >&2; exit 2",
        );
        let e = delegate(Command::Del, &plugin, &env(Command::Del), b"{}", T).unwrap_err();
        assert_eq!(e.code, DELEGATE_FAILED);
        assert_eq!(
            e.msg,
            r#"delegated IPAM plugin fail: DEL failed (exit status 2): "disk on fire""#
        );
        // No stderr: stdout is quoted; nothing at all: just the status.
        let out = script(&dir, "out", "echo 'only stdout'; exit 1");
        let e = delegate(Command::Add, &out, &env(Command::Add), b"{}", T).unwrap_err();
        assert!(
            e.msg.ends_with(r#"(exit status 1): "only stdout""#),
            "{e:?}"
        );
        let mute = script(&dir, "mute", "exit 4");
        let e = delegate(Command::Add, &mute, &env(Command::Add), b"{}", T).unwrap_err();
        assert_eq!(
            e.msg,
            "delegated IPAM plugin mute: ADD failed (exit status 4)"
        );
        // Huge stderr is bounded and the quote truncated.
        let loud = script(
            &dir,
            "loud",
            "head -c 2000000 /dev/zero | tr '\\0' e >&2; exit 1",
        );
        let e = delegate(Command::Add, &loud, &env(Command::Add), b"{}", T).unwrap_err();
        assert!(e.msg.len() < 600 && e.msg.ends_with("eee…\""), "{}", e.msg);
    }

    #[test]
    fn killed_by_signal() {
        let dir = TestDir::new("delegate-sig");
        let plugin = script(&dir, "crash", "echo dying >&2; kill -KILL $$");
        let e = delegate(Command::Add, &plugin, &env(Command::Add), b"{}", T).unwrap_err();
        assert_eq!(e.code, DELEGATE_FAILED);
        assert_eq!(
            e.msg,
            "delegated IPAM plugin crash: ADD killed by signal 9 (SIGKILL)"
        );
        assert_eq!(e.details, r#"stderr: "dying""#);
    }

    #[test]
    fn hang_is_killed_after_timeout() {
        let dir = TestDir::new("delegate-hang");
        // sh waits for sleep, which holds the output pipes: the whole group must die.
        let plugin = script(&dir, "hang", "echo started >&2; sleep 30");
        let start = Instant::now();
        let e = delegate(
            Command::Add,
            &plugin,
            &env(Command::Add),
            b"{}",
            Duration::from_millis(300),
        )
        .unwrap_err();
        let took = start.elapsed();
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert!(took >= Duration::from_millis(300), "{took:?}");
        assert_eq!(e.code, CniError::TRY_AGAIN_LATER);
        assert_eq!(
            e.msg,
            "delegated IPAM plugin hang: ADD did not finish within 300ms; killed"
        );
        // (The shell may not have got to its echo on a loaded machine.)
        assert!(
            e.details.is_empty() || e.details == r#"stderr: "started""#,
            "{e:?}"
        );

        // A delegate that exits but leaves a child holding stdout open.
        let orphan = script(&dir, "orphan", "sleep 30 & echo '{}'; exit 0");
        let start = Instant::now();
        let e = delegate(
            Command::Add,
            &orphan,
            &env(Command::Add),
            b"{}",
            Duration::from_millis(300),
        )
        .unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(5));
        assert_eq!(e.code, 11);
        assert!(
            e.details.contains("kept its output open") || e.msg.ends_with("killed"),
            "{e:?}"
        );
    }

    #[test]
    fn large_stdin_to_a_delegate_that_ignores_it() {
        let dir = TestDir::new("delegate-stdin");
        let plugin = script(&dir, "ignore", r#"echo '{"cniVersion":"1.0.0"}'"#);
        let big = vec![b' '; 1 << 20];
        let r = delegate(Command::Add, &plugin, &env(Command::Add), &big, T)
            .unwrap()
            .unwrap();
        assert_eq!(ipam_addresses(&r), (None, None));
    }

    #[test]
    fn ipam_addresses_first_per_family() {
        let r = CniResult::from_value(serde_json::json!({
            "ips": [
                {"address": "fd00::7/64", "gateway": "10.0.0.1"},
                {"address": "10.0.0.7/24", "gateway": "10.0.0.1"},
                {"address": "10.0.0.8/24"},
                {"address": "fd00::8/64", "gateway": "fd00::1"},
            ]
        }))
        .unwrap();
        let (v4, v6) = ipam_addresses(&r);
        assert_eq!(
            v4,
            Some((
                "10.0.0.7".parse().unwrap(),
                "10.0.0.7/24".parse().unwrap(),
                Some("10.0.0.1".parse().unwrap())
            ))
        );
        // The first IPv6 entry; its IPv4 gateway is dropped.
        assert_eq!(
            v6,
            Some((
                "fd00::7".parse().unwrap(),
                "fd00::7/64".parse().unwrap(),
                None
            ))
        );
    }

    #[test]
    fn args_rebuilt() {
        assert_eq!(args_string(&CniArgs::default()), None);
        let a = CniArgs::parse("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_UID=u").unwrap();
        assert_eq!(
            args_string(&a).unwrap(),
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_UID=u"
        );
        assert_eq!(CniArgs::parse(&args_string(&a).unwrap()).unwrap(), a);
    }
}
