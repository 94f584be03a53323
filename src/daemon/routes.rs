//! The REST routes: Cilium's paths under `/v1` (plus podnet's `/v1/cni/gc`,
//! `/v1/node` and `/v1/ipam/leak-check`), mapped onto `IpamState` calls. Identifiers are checked
//! (`api::validate`) before any state call; each state call runs under the state
//! mutex on the request's own worker thread, which hands its other tasks to another
//! thread first (`Daemon::with_state_in_place`), because it commits to the journal
//! before answering.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde::Serialize;

use super::Daemon;
use super::leak_check::LeakCheckError;
use super::server::BODY_TIMEOUT;
use super::state::{AllocateRequest, ApiError, ErrorKind};
use crate::api::http::{ascii_json, decode_component, parse_query};
use crate::api::models::{
    CONFIG_HEADER, CniReport, DaemonConfigurationStatus, EndpointBatchDeleteRequest,
    EndpointChangeRequest, ExplainResponse, GcRequest, LeakCheckStatus, LeakFinding, REASON_HEADER,
    SpoofedTraffic, StatusResponse,
};
use crate::api::validate::{self, MAX_QUERY_BYTES, optional};
use crate::ipam::Family;

/// Largest request body accepted.
pub const MAX_BODY: usize = 1024 * 1024;
/// At most this many unreadable DEL-queue entries are named in a status answer.
const UNREADABLE_NAMED: usize = 16;

type Reply = Response<Full<Bytes>>;

/// Serves one request.
pub async fn handle(
    daemon: Arc<Daemon>,
    req: Request<Incoming>,
) -> Result<Reply, std::convert::Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let result = route(daemon, req).await;
    Ok(match result {
        Ok(reply) => reply,
        Err(e) => {
            // Debug formatting: the message may quote what the client sent.
            let status = http_status(e.kind);
            if status >= 500 {
                tracing::warn!(%method, ?path, status, error = ?e.message, "request failed");
            } else {
                tracing::debug!(%method, ?path, status, error = ?e.message, "request refused");
            }
            let mut reply = json_reply(status, &e.message);
            if let Some(reason) = e.reason {
                reply.headers_mut().insert(
                    REASON_HEADER,
                    hyper::header::HeaderValue::from_static(reason.as_str()),
                );
            }
            if let Some(config) = &e.config {
                insert_config_header(&mut reply, config);
            }
            reply
        }
    })
}

/// The HTTP status of each kind of failure: the one place the API's errors
/// meet HTTP (Cilium's codes where Cilium has the same failure: 502 for an
/// allocation the IPAM cannot serve, 409 for an address in use).
fn http_status(kind: ErrorKind) -> u16 {
    match kind {
        ErrorKind::Invalid => 400,
        ErrorKind::NotFound => 404,
        ErrorKind::BodyTimeout => 408,
        ErrorKind::Conflict => 409,
        ErrorKind::BodyTooLarge => 413,
        ErrorKind::Internal => 500,
        ErrorKind::NoAddress => 502,
        ErrorKind::Unavailable => 503,
    }
}

async fn route(daemon: Arc<Daemon>, req: Request<Incoming>) -> Result<Reply, ApiError> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = parse_query(req.uri().query().unwrap_or(""))?;
    let q = |k: &str| query.get(k).cloned().unwrap_or_default();
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    match (&method, segments.as_slice()) {
        (&Method::GET, ["v1", "healthz"]) => {
            // Cilium's `brief` header: the figures without the per-address lists
            // (what CNI STATUS needs; a full /16 lists 65,534 addresses).
            let brief = header(&req, "brief").is_some_and(|v| v.eq_ignore_ascii_case("true"));
            let mut status = daemon.with_state_in_place(move |s| Ok(s.status_brief(brief)))?;
            let backend = daemon.backend_status();
            if !backend.waiting.is_empty() {
                warn(
                    &mut status,
                    format!("waiting for {}", backend.waiting.join("; ")),
                );
            }
            status.ipam.backend = Some(backend);
            if let Some(leaks) = daemon.leak_status() {
                add_leak_status(&mut status, leaks);
            }
            status.ipam.cross_node = daemon.cross_node_status();
            // File I/O stays outside the state's lock.
            status.ipam.journal_bytes = std::fs::metadata(&status.ipam.journal)
                .map(|m| m.len())
                .unwrap_or(0);
            add_queue_status(
                &mut status,
                daemon.queue_depth(),
                &daemon.queue_unreadable(),
            );
            let reply = json_reply(200, &status);
            if !brief {
                // The per-address maps of a full node were many small blocks.
                drop(status);
                super::heap::trim();
            }
            Ok(reply)
        }
        (&Method::GET, ["v1", "config"]) => Ok(json_reply(
            200,
            &daemon.with_state_in_place(|s| Ok(s.config()))?,
        )),
        (&Method::GET, ["v1", "node"]) => Ok(json_reply(
            200,
            &daemon.with_state_in_place(|s| Ok(s.node().clone()))?,
        )),
        (&Method::POST, ["v1", "ipam"]) => {
            let family = match q("family").as_str() {
                "" => None,
                f => Some(Family::parse(f).map_err(|_| {
                    ApiError::new(
                        ErrorKind::Invalid,
                        format!("invalid family {f:?}: must be \"ipv4\" or \"ipv6\""),
                    )
                })?),
            };
            let expiration = header(&req, "expiration")
                .map(|v| v.eq_ignore_ascii_case("true"))
                .unwrap_or(false);
            validate::owner(&q("owner"))?;
            validate::pool("pool", &q("pool"))?;
            optional(&q("container-id"), |v| {
                validate::container_id("container-id", v)
            })?;
            optional(&q("ifname"), |v| validate::ifname("ifname", v))?;
            optional(&q("network"), |v| validate::network("network", v))?;
            validate::printable("netns", &q("netns"), validate::MAX_PATH_BYTES)?;
            optional(&q("pod-uid"), |v| validate::pod_uid("pod-uid", v))?;
            let areq = AllocateRequest {
                family,
                owner: q("owner"),
                pool: q("pool"),
                expiration,
                container_id: non_empty(q("container-id")),
                ifname: non_empty(q("ifname")),
                network: non_empty(q("network")),
                netns: non_empty(q("netns")),
                pod_uid: non_empty(q("pod-uid")),
            };
            let resp = daemon.allocate_next(areq).await?;
            Ok(json_reply(201, &resp))
        }
        (&Method::POST, ["v1", "ipam", "leak-check"]) => {
            let status = daemon.check_leaks().await.map_err(leak_check_error)?;
            Ok(json_reply(200, &status))
        }
        (&Method::POST, ["v1", "ipam", ip]) => {
            let ip = decode(ip)?;
            let (owner, pool) = (q("owner"), q("pool"));
            validate::owner(&owner)?;
            validate::pool("pool", &pool)?;
            let resp = daemon.with_state_in_place(move |s| s.allocate_ip(&ip, &owner, &pool))?;
            Ok(json_reply(200, &resp))
        }
        (&Method::DELETE, ["v1", "ipam", ip]) => {
            let ip = decode(ip)?;
            let pool = q("pool");
            validate::pool("pool", &pool)?;
            daemon.with_state_in_place(move |s| s.release_ip(&ip, &pool))?;
            Ok(json_reply(200, &serde_json::Value::Null))
        }
        (&Method::PUT, ["v1", "endpoint", _id]) => {
            // The plugin's timings end where this request starts; its registration
            // phase is this request as the daemon handles it.
            let received = Instant::now();
            let body: EndpointChangeRequest = read_json(req).await?;
            validate::endpoint_change(&body)?;
            let view = daemon.with_state_in_place(move |s| {
                let view = s.create_endpoint(&body)?;
                s.plugin_timings(
                    "ADD",
                    &body.podnet_phases,
                    "endpoint-registration",
                    received.elapsed(),
                );
                Ok(view)
            })?;
            Ok(json_reply(201, &view))
        }
        (&Method::GET, ["v1", "endpoint", id]) => {
            let id = decode(id)?;
            validate::printable("endpoint id", &id, MAX_QUERY_BYTES)?;
            Ok(json_reply(
                200,
                &daemon.with_state_in_place(move |s| s.endpoint(&id))?,
            ))
        }
        (&Method::DELETE, ["v1", "endpoint"]) => {
            // The plugin's timings end where this request starts; `daemon-release`
            // is this request as the daemon handles it.
            let received = Instant::now();
            let body: EndpointBatchDeleteRequest = read_json(req).await?;
            validate::endpoint_delete(&body)?;
            if let Some(teardown) = daemon.with_state_in_place(move |s| {
                let deleted = s.delete_endpoints(&body);
                s.plugin_timings(
                    "DEL",
                    &body.podnet_phases,
                    "daemon-release",
                    received.elapsed(),
                );
                deleted
            })? {
                daemon.spawn_teardown(teardown);
            }
            Ok(json_reply(200, &serde_json::Value::Null))
        }
        (&Method::POST, ["v1", "cni", "report"]) => {
            let body: CniReport = read_json(req).await?;
            validate::report(&body)?;
            daemon.with_state_in_place(move |s| {
                s.bind_wired(&body)?;
                s.cni_report(&body);
                Ok(())
            })?;
            Ok(json_reply(200, &serde_json::Value::Null))
        }
        (&Method::GET, ["v1", "explain"]) => {
            let q = q("q");
            if q.is_empty() {
                return Err(ApiError::new(
                    ErrorKind::Invalid,
                    "explain needs ?q=<pod ns/name | ip | container id>",
                ));
            }
            validate::printable("q", &q, MAX_QUERY_BYTES)?;
            let mut answer = daemon.with_state_in_place(move |s| Ok(s.explain(&q)))?;
            if !answer.addresses.is_empty()
                && let Some(listing) = daemon.source_check_listing().await
            {
                add_spoofed_traffic(&mut answer, listing.spoofers);
            }
            if let Some(leaks) = daemon.leak_status() {
                add_leaks(&mut answer, leaks.findings);
            }
            Ok(json_reply(200, &answer))
        }
        (&Method::GET, ["metrics"]) => Ok(text_reply(daemon.metrics_text().await?)),
        (&Method::POST, ["v1", "cni", "gc"]) => {
            let body: GcRequest = read_json(req).await?;
            validate::gc(&body)?;
            let (resp, stale) = daemon.with_state_in_place(move |s| s.gc(&body))?;
            daemon.remove_host_links(stale).await;
            Ok(json_reply(200, &resp))
        }
        (_, ["v1", ..]) => Err(ApiError::new(
            ErrorKind::NotFound,
            format!("no route for {method} {path}"),
        )),
        _ => Err(ApiError::new(
            ErrorKind::NotFound,
            format!("no route for {method} {path} (the API lives under /v1)"),
        )),
    }
}

/// Adds the `podnet-config` header: the configuration as JSON, ASCII only (a
/// header value is no place for other bytes).
fn insert_config_header(reply: &mut Reply, config: &DaemonConfigurationStatus) {
    let value = serde_json::to_string(config)
        .map_err(|e| e.to_string())
        .and_then(|json| {
            hyper::header::HeaderValue::from_str(&ascii_json(&json)).map_err(|e| e.to_string())
        });
    match value {
        Ok(v) => {
            reply.headers_mut().insert(CONFIG_HEADER, v);
        }
        Err(e) => tracing::error!(error = %e, "could not encode the podnet-config header"),
    }
}

/// Adds the DEL queue to a status answer: the entries waiting, and those set aside
/// as unreadable, which make the state a Warning until someone removes them (the
/// releases they meant are left to GC or the expiration timers).
fn add_queue_status(status: &mut StatusResponse, waiting: usize, unreadable: &[PathBuf]) {
    status.ipam.queue_depth = waiting as u64;
    status.ipam.queue_unreadable = unreadable.len() as u64;
    status.ipam.queue_unreadable_files = unreadable
        .iter()
        .take(UNREADABLE_NAMED)
        .map(|p| p.display().to_string())
        .collect();
    if unreadable.is_empty() {
        return;
    }
    let warning = format!(
        "{} unreadable DEL-queue entr{} set aside ({}); check and remove {}",
        unreadable.len(),
        if unreadable.len() == 1 { "y" } else { "ies" },
        status.ipam.queue_unreadable_files.join(", "),
        if unreadable.len() == 1 { "it" } else { "them" },
    );
    warn(status, warning);
}

/// The HTTP status of a leak check that made no report: 409 when the daemon has
/// no leak check (its backend has no API server to list Pods from: the request
/// conflicts with how it runs), 503 when the API server did not list the Pods
/// (try again once it answers), 500 when the kernel's links could not be read,
/// and a state failure's own (503 while the journal cannot commit a release).
fn leak_check_error(e: LeakCheckError) -> ApiError {
    let kind = match &e {
        LeakCheckError::NoApiServer { .. } => ErrorKind::Conflict,
        LeakCheckError::PodList(_) => ErrorKind::Unavailable,
        LeakCheckError::HostLinks(_) | LeakCheckError::Task(_) => ErrorKind::Internal,
        LeakCheckError::State(state) => state.kind,
    };
    ApiError::new(kind, e.to_string())
}

/// Adds the leak check to a status answer: leaks make the state a Warning, and
/// so does a check that cannot list the Pods.
fn add_leak_status(status: &mut StatusResponse, leaks: LeakCheckStatus) {
    let leaked: Vec<String> = leaks
        .findings
        .iter()
        .filter(|f| f.finding.is_leak())
        .map(|f| format!("{} ({})", f.finding.ip, f.finding.pod))
        .collect();
    if !leaked.is_empty() {
        warn(
            status,
            format!(
                "{} leaked allocation{} ({}); podnet explain <ip> shows the evidence",
                leaked.len(),
                if leaked.len() == 1 { "" } else { "s" },
                leaked.join(", ")
            ),
        );
    }
    if !leaks.error.is_empty() {
        warn(status, format!("leak check: {}", leaks.error));
    }
    status.ipam.leak_check = Some(leaks);
}

/// Adds what the last leak check found for the answer's addresses to an explain
/// answer, and says so in its summary.
fn add_leaks(answer: &mut ExplainResponse, findings: Vec<LeakFinding>) {
    answer.leaks = findings
        .into_iter()
        .filter(|f| {
            answer
                .addresses
                .iter()
                .any(|a| a.ip == f.finding.ip.to_string())
        })
        .collect();
    for f in &answer.leaks {
        answer
            .summary
            .push_str(&format!(". Leak check: {}", f.sentence()));
    }
}

/// Makes an `Ok` state a `Warning` and adds `warning` to its message.
fn warn(status: &mut StatusResponse, warning: String) {
    let cilium = &mut status.cilium;
    if cilium.state.is_empty() || cilium.state == "Ok" {
        cilium.state = "Warning".into();
    }
    cilium.msg = if cilium.msg.is_empty() {
        warning
    } else {
        format!("{}; {warning}", cilium.msg)
    };
}

/// Adds what the source check dropped on the answer's host links to an explain
/// answer, and says so in its summary.
fn add_spoofed_traffic(answer: &mut ExplainResponse, spoofers: Vec<SpoofedTraffic>) {
    answer.spoofed_traffic = spoofers
        .into_iter()
        .filter(|t| answer.addresses.iter().any(|a| a.host_link == t.host_link))
        .collect();
    for t in &answer.spoofed_traffic {
        answer.summary.push_str(&format!(
            ". The source check dropped {} packet{} ({} bytes) from host link {} within the last hour: the pod sent with a source address it does not own (podnet_drop_count_total counts them by reason)",
            t.packets,
            if t.packets == 1 { "" } else { "s" },
            t.bytes,
            t.host_link
        ));
    }
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

fn decode(s: &str) -> Result<String, ApiError> {
    Ok(decode_component(s)?)
}

fn header(req: &Request<Incoming>, name: &str) -> Option<String> {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Reads a JSON body of at most `MAX_BODY` bytes that arrives within
/// `BODY_TIMEOUT`; a stalled body gets 408, and the connection is closed after it.
async fn read_json<T: serde::de::DeserializeOwned>(req: Request<Incoming>) -> Result<T, ApiError> {
    let body = tokio::time::timeout(
        BODY_TIMEOUT,
        Limited::new(req.into_body(), MAX_BODY).collect(),
    )
    .await
    .map_err(|_| {
        ApiError::new(
            ErrorKind::BodyTimeout,
            format!(
                "request body did not arrive within {} s; closing the connection",
                BODY_TIMEOUT.as_secs()
            ),
        )
    })?
    .map_err(|e| {
        ApiError::new(
            ErrorKind::BodyTooLarge,
            format!("request body rejected: {e} (limit {MAX_BODY} bytes)"),
        )
    })?
    .to_bytes();
    serde_json::from_slice(&body)
        .map_err(|e| ApiError::new(ErrorKind::Invalid, format!("invalid request body: {e}")))
}

pub use crate::process::metrics_server::text_reply;

/// An error answer: the message as a JSON string, as every refusal of the API.
pub fn error_reply(status: u16, message: &str) -> Reply {
    json_reply(status, &message)
}

fn json_reply<T: Serialize>(status: u16, body: &T) -> Reply {
    let bytes =
        serde_json::to_vec(body).unwrap_or_else(|_| b"\"internal encoding error\"".to_vec());
    let mut resp = Response::new(Full::new(Bytes::from(bytes)));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::models::StatusElement;

    fn status(state: &str, msg: &str) -> StatusResponse {
        StatusResponse {
            cilium: StatusElement {
                state: state.into(),
                msg: msg.into(),
            },
            ..Default::default()
        }
    }

    #[test]
    fn unreadable_queue_entries_make_a_warning_that_names_them() {
        let mut s = status("Ok", "");
        add_queue_status(&mut s, 2, &[]);
        assert_eq!((s.ipam.queue_depth, s.ipam.queue_unreadable), (2, 0));
        assert_eq!(s.cilium, status("Ok", "").cilium);

        let mut s = status("Ok", "");
        add_queue_status(&mut s, 0, &[PathBuf::from("/q/00.bad")]);
        assert_eq!(s.ipam.queue_unreadable, 1);
        assert_eq!(s.ipam.queue_unreadable_files, vec!["/q/00.bad".to_string()]);
        assert_eq!(s.cilium.state, "Warning");
        assert_eq!(
            s.cilium.msg,
            "1 unreadable DEL-queue entry set aside (/q/00.bad); check and remove it"
        );

        // A full range keeps its warning; a failure stays a failure.
        let mut s = status("Warning", "ipv4 range 10.0.0.0/30 of node n is full");
        add_queue_status(
            &mut s,
            0,
            &[PathBuf::from("/q/a.bad"), PathBuf::from("/q/b.bad")],
        );
        assert_eq!(s.cilium.state, "Warning");
        assert_eq!(
            s.cilium.msg,
            "ipv4 range 10.0.0.0/30 of node n is full; 2 unreadable DEL-queue entries set aside (/q/a.bad, /q/b.bad); check and remove them"
        );
        let mut s = status("Failure", "journal");
        add_queue_status(&mut s, 0, &[PathBuf::from("/q/a.bad")]);
        assert_eq!(s.cilium.state, "Failure");

        // Many are counted, the first few named.
        let many: Vec<PathBuf> = (0..40)
            .map(|i| PathBuf::from(format!("/q/{i:02}.bad")))
            .collect();
        let mut s = status("Ok", "");
        add_queue_status(&mut s, 0, &many);
        assert_eq!(s.ipam.queue_unreadable, 40);
        assert_eq!(s.ipam.queue_unreadable_files.len(), UNREADABLE_NAMED);
    }

    fn leak_finding(ip: &str, host_link_present: bool) -> LeakFinding {
        use crate::ipam::leaks::{Finding, PodGone, PodName, Verdict};
        let host_link = "lxc-a".to_string();
        LeakFinding {
            finding: Finding {
                ip: ip.parse().unwrap(),
                pod: PodName {
                    namespace: "default".into(),
                    name: "a".into(),
                },
                container_id: None,
                pod_gone: PodGone::NoPod {
                    uid: Some("uid-a".into()),
                },
                verdict: match host_link_present {
                    true => Verdict::HostLinkPresent { host_link },
                    false => Verdict::Leak { host_link },
                },
                age_seconds: 700,
            },
            leaked_since_ms: (!host_link_present).then_some(0),
            release_at_ms: (!host_link_present).then_some(3_600_000),
        }
    }

    #[test]
    fn leaks_and_a_check_that_cannot_list_make_a_warning() {
        let mut s = status("Ok", "");
        add_leak_status(&mut s, LeakCheckStatus::default());
        assert_eq!(s.cilium, status("Ok", "").cilium);
        assert!(s.ipam.leak_check.is_some());

        let mut s = status("Ok", "");
        let leaks = LeakCheckStatus {
            findings: vec![
                leak_finding("10.0.0.3", false),
                leak_finding("10.0.0.4", true),
            ],
            ..Default::default()
        };
        add_leak_status(&mut s, leaks);
        assert_eq!(s.cilium.state, "Warning");
        assert_eq!(
            s.cilium.msg,
            "1 leaked allocation (10.0.0.3 (default/a)); podnet explain <ip> shows the evidence"
        );

        let mut s = status("Ok", "");
        let failing = LeakCheckStatus {
            error: "listing the Pods of node n1: refused".into(),
            ..Default::default()
        };
        add_leak_status(&mut s, failing);
        assert_eq!(
            s.cilium.msg,
            "leak check: listing the Pods of node n1: refused"
        );
    }

    #[test]
    fn explain_says_what_the_leak_check_found_for_its_addresses_only() {
        let mut answer = ExplainResponse {
            addresses: vec![crate::api::models::AddressExplanation {
                ip: "10.0.0.3".into(),
                ..Default::default()
            }],
            summary: "10.0.0.3 is bound".into(),
            ..Default::default()
        };
        add_leaks(
            &mut answer,
            vec![
                leak_finding("10.0.0.3", false),
                leak_finding("10.0.0.9", false),
            ],
        );
        assert_eq!(answer.leaks.len(), 1);
        assert_eq!(
            answer.summary,
            "10.0.0.3 is bound. Leak check: 10.0.0.3 (default/a, allocated 700s ago): no pod with UID uid-a or its name on this node; host link lxc-a is gone: leaked; a leak in every check since 1970-01-01T00:00:00Z, released at 1970-01-01T01:00:00Z if it stays one"
        );
    }

    #[test]
    fn each_leak_check_failure_has_its_http_status() {
        let status_of = |e| http_status(leak_check_error(e).kind);
        assert_eq!(
            status_of(LeakCheckError::NoApiServer {
                backend: "embedded".into()
            }),
            409
        );
        let refused = kube::Error::ReadEvents(std::io::ErrorKind::ConnectionRefused.into());
        assert_eq!(
            status_of(LeakCheckError::PodList(
                crate::k8s::node_pods::NodePodsError::List {
                    node: "n1".into(),
                    source: refused
                }
            )),
            503
        );
        assert_eq!(
            status_of(LeakCheckError::State(ApiError::new(
                ErrorKind::Unavailable,
                "journal"
            ))),
            503
        );
    }
}
