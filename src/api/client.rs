//! The blocking client of the daemon API, used by the short-lived plugin and by the
//! CLI. It speaks a minimal HTTP/1.1 over a unix stream (one request per connection,
//! `Connection: close`), which needs no async runtime and starts in microseconds.

use std::io::{BufRead, ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::http::{
    RawResponse, ResponseError, build_query, encode_component, is_complete, parse_response,
};
use super::models::*;

/// Largest response body the client accepts.
const MAX_RESPONSE: usize = 16 * 1024 * 1024;

/// Why a call to the daemon failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing listens on the socket (no file, refused, or permission denied).
    #[error(
        "podnet daemon is not reachable at {socket}: {source}; is the daemon running? (podnet daemon --socket {socket})"
    )]
    Unreachable {
        socket: String,
        #[source]
        source: std::io::Error,
    },
    /// The daemon accepted the connection but did not answer in time.
    #[error("podnet daemon at {socket} did not answer within {secs} s")]
    Timeout { socket: String, secs: u64 },
    /// The daemon closed the connection before its answer was complete (it was
    /// stopped or crashed in the middle of the request).
    #[error(
        "podnet daemon at {socket} closed the connection before it answered ({detail}); it may be restarting: try again"
    )]
    Closed { socket: String, detail: String },
    /// The daemon answered with an error status; `message` is its error text.
    #[error("{message}")]
    Status {
        status: u16,
        message: String,
        /// Why, where the daemon says (the `podnet-reason` header).
        reason: Option<FailureReason>,
        /// The daemon's configuration, where it sends it with the refusal (the
        /// `podnet-config` header of a `delegated-plugin` refusal).
        config: Option<Box<DaemonConfigurationStatus>>,
    },
    /// The answer could not be read or decoded.
    #[error("invalid answer from podnet daemon at {socket}: {detail}")]
    Protocol { socket: String, detail: String },
}

impl ClientError {
    /// True when the daemon could not be reached, did not answer, or closed the
    /// connection before its answer was complete: the request may succeed later.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            ClientError::Unreachable { .. }
                | ClientError::Timeout { .. }
                | ClientError::Closed { .. }
                | ClientError::Status { status: 503, .. }
        )
    }

    /// The HTTP status of a daemon error answer.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// Reads an answer's head; its status (0: a status line that is not HTTP's).
fn read_head(reader: &mut impl BufRead) -> std::io::Result<u16> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 || line.trim_end().is_empty() {
            return Ok(status);
        }
    }
}

/// Parameters of `POST /v1/ipam`.
#[derive(Debug, Clone, Default)]
pub struct AllocateParams<'a> {
    /// `ipv4`, `ipv6`, or empty for every enabled family.
    pub family: &'a str,
    pub owner: &'a str,
    pub pool: &'a str,
    pub expiration: bool,
    /// podnet: the attachment the address is for, so DEL and GC can find it.
    pub container_id: &'a str,
    pub ifname: &'a str,
    /// podnet: the CNI network name, so GC touches only its own network.
    pub network: &'a str,
    /// podnet: the pod's netns path. With `expiration` and the attachment, the
    /// daemon journals the endpoint, pending, in the allocation's commit.
    pub netns: &'a str,
    /// podnet: the pod's UID (`K8S_POD_UID`), recorded with the addresses for
    /// the leak check.
    pub pod_uid: &'a str,
}

/// A connection factory for one daemon socket.
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
    timeout: Duration,
}

impl Client {
    /// A client for the daemon at `socket`, giving up on a call after `timeout`.
    pub fn new(socket: impl AsRef<Path>, timeout: Duration) -> Client {
        Client {
            socket: socket.as_ref().to_path_buf(),
            timeout,
        }
    }

    /// The socket path this client talks to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// `GET /v1/config`.
    pub fn config(&self) -> Result<DaemonConfiguration, ClientError> {
        self.call_json("GET", "/v1/config", &[], None::<&()>)
    }

    /// `GET /v1/healthz`.
    pub fn healthz(&self) -> Result<StatusResponse, ClientError> {
        self.call_json("GET", "/v1/healthz", &[], None::<&()>)
    }

    /// `GET /v1/healthz` with `brief: true`: the figures without per-address lists.
    pub fn healthz_brief(&self) -> Result<StatusResponse, ClientError> {
        self.call_json("GET", "/v1/healthz", &[("brief", "true")], None::<&()>)
    }

    /// `POST /v1/ipam`: allocate the next address of each requested family. podnet
    /// answers with its configuration (`podnet-config`); in delegated-plugin mode
    /// it refuses with the reason `delegated-plugin` and the configuration
    /// (`ClientError::Status::config`).
    pub fn allocate(&self, p: &AllocateParams<'_>) -> Result<IpamResponse, ClientError> {
        let query = build_query(&[
            ("family", p.family),
            ("owner", p.owner),
            ("pool", p.pool),
            ("container-id", p.container_id),
            ("ifname", p.ifname),
            ("network", p.network),
            ("netns", p.netns),
            ("pod-uid", p.pod_uid),
        ]);
        let headers = [("expiration", if p.expiration { "true" } else { "false" })];
        self.call_json("POST", &format!("/v1/ipam?{query}"), &headers, None::<&()>)
    }

    /// `POST /v1/ipam/{ip}`: allocate one specific address.
    pub fn allocate_ip(
        &self,
        ip: &str,
        owner: &str,
        pool: &str,
    ) -> Result<IpamResponse, ClientError> {
        let query = build_query(&[("owner", owner), ("pool", pool)]);
        let path = format!("/v1/ipam/{}?{query}", encode_component(ip));
        self.call_json("POST", &path, &[], None::<&()>)
    }

    /// `DELETE /v1/ipam/{ip}`: release one address.
    pub fn release_ip(&self, ip: &str, pool: &str) -> Result<(), ClientError> {
        let query = build_query(&[("pool", pool)]);
        let path = format!("/v1/ipam/{}?{query}", encode_component(ip));
        self.call("DELETE", &path, &[], None).map(|_| ())
    }

    /// `PUT /v1/endpoint/{id}`: register the endpoint (stops the expiration timers);
    /// `podnet-phases` in the request carry the plugin's timings along.
    pub fn create_endpoint(
        &self,
        req: &EndpointChangeRequest,
    ) -> Result<EndpointView, ClientError> {
        let path = format!(
            "/v1/endpoint/{}",
            encode_component(super::LOCAL_ENDPOINT_ID)
        );
        self.call_json("PUT", &path, &[], Some(req))
    }

    /// `GET /v1/endpoint/cni-attachment-id:<cid>:<ifname>`.
    pub fn endpoint(&self, container_id: &str, ifname: &str) -> Result<EndpointView, ClientError> {
        let id = format!("cni-attachment-id:{container_id}:{ifname}");
        self.call_json(
            "GET",
            &format!("/v1/endpoint/{}", encode_component(&id)),
            &[],
            None::<&()>,
        )
    }

    /// `DELETE /v1/endpoint`: delete the endpoints of a container and release their
    /// addresses. A 404 (nothing known) is success.
    pub fn delete_endpoints(&self, req: &EndpointBatchDeleteRequest) -> Result<(), ClientError> {
        let body = to_body(req, &self.socket)?;
        match self.call("DELETE", "/v1/endpoint", &[], Some(body)) {
            Ok(_) => Ok(()),
            Err(ClientError::Status { status: 404, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `POST /v1/cni/report`: the plugin's timings and failure (a successful ADD's
    /// timings travel with its endpoint registration instead).
    /// Sent without waiting for the answer: the plugin exits right after it.
    pub fn report(&self, report: &CniReport) -> Result<(), ClientError> {
        let body = to_body(report, &self.socket)?;
        let sock = self.socket.display().to_string();
        let mut stream =
            UnixStream::connect(&self.socket).map_err(|source| ClientError::Unreachable {
                socket: sock.clone(),
                source,
            })?;
        let head = format!(
            "POST /v1/cni/report HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        stream
            .write_all(&[head.as_bytes(), &body].concat())
            .map_err(|e| ClientError::Protocol {
                socket: sock,
                detail: e.to_string(),
            })
    }

    /// `GET /v1/observe?namespace=&pod=&verdict=`: each verdict line as the
    /// daemon sends it, to `each`, until the daemon closes the stream. Asked
    /// in HTTP/1.0, so the body ends when the connection does; no time limit
    /// once the answer's head is in.
    pub fn observe(
        &self,
        filter: &[(&str, &str)],
        mut each: impl FnMut(&str),
    ) -> Result<(), ClientError> {
        let sock = self.socket.display().to_string();
        let stream =
            UnixStream::connect(&self.socket).map_err(|source| ClientError::Unreachable {
                socket: sock.clone(),
                source,
            })?;
        let io_err = |e: std::io::Error| io_error(&sock, self.timeout, e);
        stream
            .set_read_timeout(Some(self.timeout))
            .map_err(io_err)?;
        let req = format!(
            "GET /v1/observe?{} HTTP/1.0\r\nHost: localhost\r\n\r\n",
            build_query(filter)
        );
        (&stream).write_all(req.as_bytes()).map_err(io_err)?;
        let mut reader = std::io::BufReader::new(&stream);
        let status = read_head(&mut reader).map_err(io_err)?;
        if status != 200 {
            let mut body = String::new();
            let _ = reader.read_to_string(&mut body);
            let message = serde_json::from_str::<String>(&body).unwrap_or(body);
            return Err(ClientError::Status {
                status,
                message,
                reason: None,
                config: None,
            });
        }
        stream.set_read_timeout(None).map_err(io_err)?;
        let mut line = String::new();
        while reader.read_line(&mut line).map_err(io_err)? > 0 {
            each(line.trim_end());
            line.clear();
        }
        Ok(())
    }

    /// `GET /v1/explain?q=`.
    pub fn explain(&self, query: &str) -> Result<ExplainResponse, ClientError> {
        let q = build_query(&[("q", query)]);
        self.call_json("GET", &format!("/v1/explain?{q}"), &[], None::<&()>)
    }

    /// `POST /v1/cni/gc`.
    pub fn gc(&self, req: &GcRequest) -> Result<GcResponse, ClientError> {
        self.call_json("POST", "/v1/cni/gc", &[], Some(req))
    }

    fn call_json<B: Serialize, T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&B>,
    ) -> Result<T, ClientError> {
        let body = match body {
            Some(b) => Some(to_body(b, &self.socket)?),
            None => None,
        };
        let resp = self.call(method, path, headers, body)?;
        serde_json::from_slice(&resp.body).map_err(|e| ClientError::Protocol {
            socket: self.socket.display().to_string(),
            detail: format!("{method} {path}: {e}"),
        })
    }

    /// One request on a fresh connection. Non-2xx answers become `ClientError::Status`
    /// carrying the daemon's error text (a JSON string, as Cilium's API sends).
    pub fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Result<RawResponse, ClientError> {
        let sock = self.socket.display().to_string();
        let mut stream =
            UnixStream::connect(&self.socket).map_err(|source| ClientError::Unreachable {
                socket: sock.clone(),
                source,
            })?;
        let io_err = |e: std::io::Error| io_error(&sock, self.timeout, e);
        stream
            .set_read_timeout(Some(self.timeout))
            .map_err(io_err)?;
        stream
            .set_write_timeout(Some(self.timeout))
            .map_err(io_err)?;
        let body = body.unwrap_or_default();
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
            body.len()
        );
        if !body.is_empty() {
            req.push_str("Content-Type: application/json\r\n");
        }
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        let mut out = req.into_bytes();
        out.extend_from_slice(&body);
        // A server that refuses a request early (e.g. a body over its limit) answers
        // and closes while we still write: keep the write error and read the answer.
        let write_result = stream.write_all(&out);
        let mut raw = Vec::with_capacity(4096);
        let read_result = read_response(&mut stream, &mut raw);
        if raw.is_empty() {
            write_result.map_err(io_err)?;
            read_result.map_err(io_err)?;
            return Err(ClientError::Closed {
                socket: sock,
                detail: "nothing received".into(),
            });
        }
        let resp = parse_response(&raw).map_err(|e| match e {
            // Cut off in the middle: the daemon went away while answering.
            ResponseError::Incomplete(detail) => match read_result {
                Err(read) => io_err(read),
                Ok(_) => ClientError::Closed {
                    socket: sock.clone(),
                    detail,
                },
            },
            ResponseError::Malformed(detail) => ClientError::Protocol {
                socket: sock.clone(),
                detail,
            },
        })?;
        if (200..300).contains(&resp.status) {
            Ok(resp)
        } else {
            Err(ClientError::Status {
                status: resp.status,
                message: error_text(&resp),
                reason: resp.podnet_reason.as_deref().and_then(FailureReason::parse),
                config: resp
                    .podnet_config
                    .as_deref()
                    .and_then(|c| serde_json::from_str(c).ok())
                    .map(Box::new),
            })
        }
    }
}

/// Reads an answer into `raw` until its framing (Content-Length, chunked coding)
/// says it is whole, the server closes the connection, or `MAX_RESPONSE` bytes
/// came: a whole answer is used at once, without waiting for the server's close.
fn read_response(stream: &mut UnixStream, raw: &mut Vec<u8>) -> std::io::Result<()> {
    let mut chunk = [0u8; 4096];
    while raw.len() < MAX_RESPONSE {
        match stream.read(&mut chunk) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                raw.extend_from_slice(&chunk[..n]);
                if is_complete(raw) {
                    return Ok(());
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Classifies a failed socket read or write: a timeout, the daemon closing the
/// connection (reset, broken pipe, early end), or anything else.
fn io_error(socket: &str, timeout: Duration, e: std::io::Error) -> ClientError {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => ClientError::Timeout {
            socket: socket.to_string(),
            secs: timeout.as_secs().max(1),
        },
        ErrorKind::ConnectionReset
        | ErrorKind::ConnectionAborted
        | ErrorKind::BrokenPipe
        | ErrorKind::UnexpectedEof => ClientError::Closed {
            socket: socket.to_string(),
            detail: e.to_string(),
        },
        _ => ClientError::Protocol {
            socket: socket.to_string(),
            detail: e.to_string(),
        },
    }
}

fn to_body<B: Serialize>(b: &B, socket: &Path) -> Result<Vec<u8>, ClientError> {
    serde_json::to_vec(b).map_err(|e| ClientError::Protocol {
        socket: socket.display().to_string(),
        detail: format!("encoding request: {e}"),
    })
}

/// The daemon's error text: its body is a JSON string; fall back to the raw text,
/// and to the HTTP status when the body says nothing.
fn error_text(resp: &RawResponse) -> String {
    let text = match serde_json::from_slice::<String>(&resp.body) {
        Ok(s) => s,
        Err(_) => String::from_utf8_lossy(&resp.body).trim().to_string(),
    };
    if !text.trim().is_empty() {
        return text;
    }
    let reason = if resp.reason.is_empty() {
        String::new()
    } else {
        format!(" {}", resp.reason)
    };
    format!(
        "podnet daemon answered HTTP {}{reason} without an error message",
        resp.status
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_socket_is_reported_as_such() {
        let c = Client::new("/nonexistent/podnet.sock", Duration::from_secs(1));
        let e = c.healthz().unwrap_err();
        assert!(e.is_unavailable());
        assert!(e.to_string().contains("is the daemon running"));
    }

    fn answer(status: u16, reason: &str, body: &[u8]) -> RawResponse {
        RawResponse {
            status,
            reason: reason.into(),
            podnet_reason: None,
            podnet_config: None,
            body: body.to_vec(),
        }
    }

    #[test]
    fn error_bodies() {
        assert_eq!(
            error_text(&answer(502, "Bad Gateway", b"\"range is full\"")),
            "range is full"
        );
        assert_eq!(error_text(&answer(400, "", b"plain\n")), "plain");
    }

    #[test]
    fn an_empty_error_body_says_the_status() {
        for body in [&b""[..], b"\"\"", b" \n", b"\"  \""] {
            assert_eq!(
                error_text(&answer(414, "URI Too Long", body)),
                "podnet daemon answered HTTP 414 URI Too Long without an error message"
            );
        }
        assert_eq!(
            error_text(&answer(500, "", b"")),
            "podnet daemon answered HTTP 500 without an error message"
        );
    }

    #[test]
    fn a_closed_connection_is_try_again_and_says_so() {
        for kind in [
            ErrorKind::ConnectionReset,
            ErrorKind::ConnectionAborted,
            ErrorKind::BrokenPipe,
            ErrorKind::UnexpectedEof,
        ] {
            let e = io_error("/s.sock", Duration::from_secs(3), kind.into());
            assert!(matches!(e, ClientError::Closed { .. }), "{kind:?}: {e:?}");
            assert!(e.is_unavailable(), "{kind:?}");
            let text = e.to_string();
            assert!(
                text.contains("closed the connection") && text.contains("try again"),
                "{text}"
            );
        }
        let e = io_error(
            "/s.sock",
            Duration::from_secs(3),
            ErrorKind::TimedOut.into(),
        );
        assert!(matches!(e, ClientError::Timeout { secs: 3, .. }));
        assert!(e.is_unavailable());
        let e = io_error(
            "/s.sock",
            Duration::from_secs(3),
            ErrorKind::InvalidData.into(),
        );
        assert!(matches!(e, ClientError::Protocol { .. }));
        assert!(!e.is_unavailable());
        let refused = ClientError::Status {
            status: 400,
            message: "no".into(),
            reason: None,
            config: None,
        };
        assert!(!refused.is_unavailable());
        let busy = ClientError::Status {
            status: 503,
            message: "busy".into(),
            reason: Some(FailureReason::JournalUnavailable),
            config: None,
        };
        assert!(busy.is_unavailable());
    }
}
