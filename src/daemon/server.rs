//! The unix-socket listener: one daemon per socket (enforced with a lock file next
//! to it), the socket created 0600 in a directory only root can write, clients
//! that are not root refused with 403 by their credentials (SO_PEERCRED, so a
//! socket whose mode was loosened by hand still serves root only), one task per
//! connection so a slow client never blocks the others, and time limits on the
//! request head and body so a stalled client does not hold its task forever.
//! `GET /v1/observe` is the one answer that streams (`daemon::observe`).

use std::convert::Infallible;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Either, Full, StreamBody};
use hyper::body::Incoming;
use hyper::{Method, Request, Response};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use nix::fcntl::{Flock, FlockArg};
use tokio::net::UnixListener;

pub(crate) use crate::process::metrics_server::{bind_metrics, serve_metrics};

use super::Daemon;
use super::observe::{self, OBSERVE_PATH};
use super::routes::{error_reply, handle};
use crate::api::http::parse_query;

/// How long a connection may take to send its request head (its body's limit is
/// `routes::BODY_TIMEOUT`).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The lock that makes this daemon the only one on its socket.
pub struct SocketLock {
    _lock: Flock<File>,
    path: PathBuf,
}

impl SocketLock {
    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Why the daemon cannot take its socket: the directory, the lock or the bind.
/// Each says which path and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("cannot create {what} {}: {source}", .path.display())]
    CreateDir {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{what} {}: {source}", .path.display())]
    ReadDir {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{what} {} is not a directory", .path.display())]
    NotADirectory { what: &'static str, path: PathBuf },
    #[error(
        "{what} {} is writable by group or others (mode {mode:o}); refusing to use it: chmod go-w it or pick another path",
        .path.display()
    )]
    WritableByOthers {
        what: &'static str,
        path: PathBuf,
        mode: u32,
    },
    #[error("{what} {} is owned by uid {uid}, not by the daemon's user", .path.display())]
    NotOwned {
        what: &'static str,
        path: PathBuf,
        uid: u32,
    },
    #[error("cannot open lock file {}: {source}", .path.display())]
    OpenLock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "another podnet daemon is already serving on {} (it holds {}); stop it first or give this one its own --socket",
        .socket.display(),
        .lock.display()
    )]
    AlreadyServed { socket: PathBuf, lock: PathBuf },
    #[error("cannot lock {}: {source}", .path.display())]
    Lock {
        path: PathBuf,
        #[source]
        source: nix::errno::Errno,
    },
    #[error("cannot remove stale socket {}: {source}", .path.display())]
    RemoveStale {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot listen on {}: {source}", .path.display())]
    Listen {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot chmod {}: {source}", .path.display())]
    Chmod {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Creates the socket's directory (0700) if needed and takes the daemon lock.
/// Refuses when another daemon holds it, or when the directory is writable by others.
pub fn lock_socket(socket: &Path) -> Result<SocketLock, SocketError> {
    let dir = socket
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    ensure_private_dir(dir, "socket directory")?;
    let lock_path = crate::api::start_note::lock_path(socket);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&lock_path)
        .map_err(|source| SocketError::OpenLock {
            path: lock_path.clone(),
            source,
        })?;
    let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
        if errno == nix::errno::Errno::EWOULDBLOCK {
            SocketError::AlreadyServed {
                socket: socket.to_path_buf(),
                lock: lock_path.clone(),
            }
        } else {
            SocketError::Lock {
                path: lock_path.clone(),
                source: errno,
            }
        }
    })?;
    Ok(SocketLock {
        _lock: lock,
        path: lock_path,
    })
}

/// Creates `dir` with mode 0700 if missing; refuses an existing one that group or
/// others can write, or that root does not own. `what` names the directory.
pub fn ensure_private_dir(dir: &Path, what: &'static str) -> Result<(), SocketError> {
    let path = || dir.to_path_buf();
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| SocketError::CreateDir {
                what,
                path: path(),
                source,
            })?;
    }
    let meta = std::fs::metadata(dir).map_err(|source| SocketError::ReadDir {
        what,
        path: path(),
        source,
    })?;
    if !meta.is_dir() {
        return Err(SocketError::NotADirectory { what, path: path() });
    }
    if meta.mode() & 0o022 != 0 {
        return Err(SocketError::WritableByOthers {
            what,
            path: path(),
            mode: meta.mode() & 0o7777,
        });
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(SocketError::NotOwned {
            what,
            path: path(),
            uid: meta.uid(),
        });
    }
    Ok(())
}

/// Binds the socket (removing a stale file first; the lock proves nobody serves it)
/// with mode 0600.
pub fn bind(socket: &Path) -> Result<UnixListener, SocketError> {
    let path = || socket.to_path_buf();
    if socket.exists() {
        std::fs::remove_file(socket).map_err(|source| SocketError::RemoveStale {
            path: path(),
            source,
        })?;
    }
    let listener = UnixListener::bind(socket).map_err(|source| SocketError::Listen {
        path: path(),
        source,
    })?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600)).map_err(|source| {
        SocketError::Chmod {
            path: path(),
            source,
        }
    })?;
    Ok(listener)
}

/// Accepts connections until `shutdown` resolves.
pub async fn serve(
    listener: UnixListener,
    daemon: Arc<Daemon>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if let Err(refusal) = peer_allowed(stream.peer_cred()) {
                    tracing::warn!(peer = %refusal.peer, "refused an API client that is not root");
                    tokio::spawn(refuse(stream, refusal));
                    continue;
                }
                let d = daemon.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| serve_request(d.clone(), req));
                    // half_close: a plugin that sends its timing report and exits
                    // still has the report processed.
                    let conn = http1::Builder::new()
                        .timer(hyper_util::rt::TokioTimer::new())
                        .half_close(true)
                        .header_read_timeout(HEADER_TIMEOUT)
                        .serve_connection(TokioIo::new(stream), svc);
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                });
            }
        }
    }
}

/// A reply: whole, or the lines of `GET /v1/observe` while the client stays.
type Body = Either<Full<Bytes>, BoxBody<Bytes, Infallible>>;

/// Serves one request: `GET /v1/observe` streams, every other route answers
/// once (`routes::handle`).
async fn serve_request(
    daemon: Arc<Daemon>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    if req.method() == Method::GET && req.uri().path() == OBSERVE_PATH {
        return Ok(observe_reply(
            &daemon,
            req.uri().query().unwrap_or_default(),
        ));
    }
    let reply = handle(daemon, req).await?;
    Ok(reply.map(Either::Left))
}

/// `GET /v1/observe?namespace=&pod=&verdict=`: the policy verdicts logged
/// from now on, JSON lines (`daemon::observe`); ends when the client goes.
fn observe_reply(daemon: &Daemon, query: &str) -> Response<Body> {
    let refuse = |status: u16, message: &str| error_reply(status, message).map(Either::Left);
    let Some(verdicts) = daemon.verdicts() else {
        return refuse(
            404,
            "observe: NetworkPolicy is not enforced here (--enable-policy on the Kubernetes backend), so no verdicts are logged",
        );
    };
    let filter = match parse_query(query) {
        Ok(q) => observe::Filter::from_query(&q),
        Err(e) => return refuse(400, &e.to_string()),
    };
    let filter = match filter {
        Ok(f) => f,
        Err(e) => return refuse(400, &e.to_string()),
    };
    let body = StreamBody::new(observe::lines(verdicts, filter));
    let mut reply = Response::new(Either::Right(BodyExt::boxed(body)));
    reply.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/x-ndjson"),
    );
    reply
}

/// Why a client may not use the API.
#[derive(Debug, thiserror::Error)]
#[error(
    "podnet's API serves root only, and this client is {peer}: run the command as root (sudo podnet ...). The socket's mode does not widen this: the daemon checks the peer's credentials (SO_PEERCRED) on every connection"
)]
pub struct PeerRefused {
    /// The peer as the kernel reports it (`uid 65534, pid 1234`).
    pub peer: String,
}

/// The HTTP status of every answer to a refused client.
pub const PEER_REFUSED_STATUS: u16 = 403;

/// Root, and the daemon's own user, may use the API; a connection whose
/// credentials cannot be read may not.
fn peer_allowed(cred: std::io::Result<tokio::net::unix::UCred>) -> Result<(), PeerRefused> {
    let own = nix::unistd::geteuid().as_raw();
    match cred {
        Ok(c) if c.uid() == 0 || c.uid() == own => Ok(()),
        Ok(c) => Err(PeerRefused {
            peer: match c.pid() {
                Some(pid) => format!("uid {}, pid {pid}", c.uid()),
                None => format!("uid {}", c.uid()),
            },
        }),
        Err(e) => Err(PeerRefused {
            peer: format!("a process whose credentials cannot be read ({e})"),
        }),
    }
}

/// Answers every request of a refused connection with 403 and the reason.
async fn refuse(stream: tokio::net::UnixStream, refusal: PeerRefused) {
    let message = refusal.to_string();
    let svc = service_fn(move |_req| {
        let reply = super::routes::error_reply(PEER_REFUSED_STATUS, &message);
        async move { Ok::<_, std::convert::Infallible>(reply) }
    });
    let conn = http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(stream), svc);
    let _ = conn.await;
}
