//! The REST routes: Cilium's paths under `/v1` (plus podnet's `/v1/cni/gc`,
//! `/v1/node` and `/v1/ipam/leak-check`), mapped onto `IpamState` calls.
//!
//! `ROUTES` is the table of method, path pattern and handler. `route` parses the
//! query, finds the route (`find_route`), reads the body of the routes that take one
//! (`read_body`: the one place with the size and time limits) and hands the handler
//! a `Call`. A handler checks what it takes first: the query and path through a pure
//! function of the `Call` (`allocate_next_request`, `ip_claim`, ...), the body
//! through `Call::json` and `api::validate`, then `daemon::answers` turns a body
//! into the state's request. Each state call runs under the state mutex on the
//! request's own worker thread, which hands its other tasks to another thread first
//! (`Daemon::with_state_in_place`), because it commits to the journal before
//! answering; `daemon::answers` builds the wire answer from what it returns.

use std::collections::HashMap;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{HeaderMap, Method, Request, Response, StatusCode};
use serde::Serialize;

use super::Daemon;
use super::answers;
use super::answers::ipam::{
    endpoint_registration, endpoint_release, gc_response, gc_scope, ipam_response, wired_attachment,
};
use super::answers::status::{
    configuration_status, daemon_configuration, endpoint_view, status_response,
};
use super::leak_check::LeakCheckError;
use super::state::{AllocateRequest, ApiError, ErrorKind, PluginReport};
use crate::api::http::{NotUtf8, ascii_json, decode_component, parse_query};
use crate::api::models::{
    CONFIG_HEADER, CniReport, DaemonConfigurationStatus, EndpointBatchDeleteRequest,
    EndpointChangeRequest, ExplainResponse, GcRequest, LeakCheckStatus, LeakFinding, REASON_HEADER,
    SpoofedTraffic, StatusResponse,
};
use crate::api::validate::{self, MAX_QUERY_BYTES, Refusal, optional};
use crate::ipam::Family;

/// Largest request body accepted.
pub const MAX_BODY: usize = 1024 * 1024;
/// How long a request may take to send its body once its head has arrived
/// (`read_body` enforces it: hyper has no body timeout). A plugin sends its body
/// (at most a few kB) right after the head.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// At most this many unreadable DEL-queue entries are named in a status answer.
const UNREADABLE_NAMED: usize = 16;

type Reply = Response<Full<Bytes>>;

/// A request the API's rules refuse is invalid.
impl From<Refusal> for ApiError {
    fn from(e: Refusal) -> ApiError {
        ApiError::new(ErrorKind::Invalid, e.to_string())
    }
}

/// A path or query that is not UTF-8 once decoded is invalid.
impl From<NotUtf8> for ApiError {
    fn from(e: NotUtf8) -> ApiError {
        ApiError::new(ErrorKind::Invalid, e.to_string())
    }
}

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
            if let Some(config) = e.config {
                insert_config_header(&mut reply, &configuration_status(*config));
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

/// What a handler's future is: boxed, so that the handlers of the table share a type.
type HandlerFuture = Pin<Box<dyn Future<Output = Result<Reply, ApiError>> + Send>>;
/// A route's handler: the daemon and the request as routing read it.
type Handler = fn(Arc<Daemon>, Call) -> HandlerFuture;

/// Whether a route reads the request's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyUse {
    /// The body is never read (a stalled or large body does not matter).
    Ignored,
    /// The body is read (`read_body`) before the handler runs; the handler decodes
    /// and checks it (`Call::json`).
    Json,
}

/// One row of the route table.
struct Route {
    method: Method,
    /// `/`-separated segments; a `{name}` segment matches any one segment of the
    /// path, handed to the handler in `Call::path_params`.
    pattern: &'static str,
    body: BodyUse,
    handler: Handler,
}

/// The API: every route, tried in order; the first whose method and pattern match
/// the request serves it (so `/v1/ipam/leak-check` comes before `/v1/ipam/{ip}`).
static ROUTES: &[Route] = &[
    Route {
        method: Method::GET,
        pattern: "/v1/healthz",
        body: BodyUse::Ignored,
        handler: |daemon, call| Box::pin(get_healthz(daemon, call)),
    },
    Route {
        method: Method::GET,
        pattern: "/v1/config",
        body: BodyUse::Ignored,
        handler: |daemon, call| Box::pin(get_config(daemon, call)),
    },
    Route {
        method: Method::GET,
        pattern: "/v1/node",
        body: BodyUse::Ignored,
        handler: |daemon, call| Box::pin(get_node(daemon, call)),
    },
    Route {
        method: Method::POST,
        pattern: "/v1/ipam",
        body: BodyUse::Ignored,
        handler: |daemon, call| Box::pin(allocate_next(daemon, call)),
    },
    Route {
        method: Method::POST,
        pattern: "/v1/ipam/leak-check",
        body: BodyUse::Ignored,
        handler: |daemon, call| Box::pin(check_leaks(daemon, call)),
    },
    Route {
        method: Method::POST,
        pattern: "/v1/ipam/{ip}",
        body: BodyUse::Ignored,
        handler: |daemon, call| Box::pin(allocate_ip(daemon, call)),
    },
    Route {
        method: Method::DELETE,
        pattern: "/v1/ipam/{ip}",
        body: BodyUse::Ignored,
        handler: |daemon, call| Box::pin(release_ip(daemon, call)),
    },
    Route {
        method: Method::PUT,
        pattern: "/v1/endpoint/{id}",
        body: BodyUse::Json,
        handler: |daemon, call| Box::pin(put_endpoint(daemon, call)),
    },
    Route {
        method: Method::GET,
        pattern: "/v1/endpoint/{id}",
        body: BodyUse::Ignored,
        handler: |daemon, call| Box::pin(get_endpoint(daemon, call)),
    },
    Route {
        method: Method::DELETE,
        pattern: "/v1/endpoint",
        body: BodyUse::Json,
        handler: |daemon, call| Box::pin(delete_endpoints(daemon, call)),
    },
    Route {
        method: Method::POST,
        pattern: "/v1/cni/report",
        body: BodyUse::Json,
        handler: |daemon, call| Box::pin(cni_report(daemon, call)),
    },
    Route {
        method: Method::GET,
        pattern: "/v1/explain",
        body: BodyUse::Ignored,
        handler: |daemon, call| Box::pin(explain(daemon, call)),
    },
    Route {
        method: Method::GET,
        pattern: "/metrics",
        body: BodyUse::Ignored,
        handler: |daemon, call| Box::pin(get_metrics(daemon, call)),
    },
    Route {
        method: Method::POST,
        pattern: "/v1/cni/gc",
        body: BodyUse::Json,
        handler: |daemon, call| Box::pin(cni_gc(daemon, call)),
    },
];

/// The request as a handler gets it: what routing parsed and read.
struct Call {
    /// When the daemon started on the request (where the plugin's timings end).
    received: Instant,
    query: HashMap<String, String>,
    /// The path segments the pattern's `{…}` segments matched, in order, as sent
    /// (still percent-encoded).
    path_params: Vec<String>,
    headers: HeaderMap,
    /// The body of a `BodyUse::Json` route; empty for the others.
    body: Bytes,
}

impl Call {
    /// A query value; empty when the query does not have it.
    fn query(&self, key: &str) -> String {
        self.query.get(key).cloned().unwrap_or_default()
    }

    /// Whether a header says `true` (any case); absent or anything else is false.
    fn header_is_true(&self, name: &str) -> bool {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    }

    /// The route's one path parameter (`{ip}`, `{id}`), percent-decoded.
    fn path_param(&self) -> Result<String, ApiError> {
        let raw = self
            .path_params
            .first()
            .ok_or_else(|| ApiError::new(ErrorKind::Internal, "the route has no path parameter"))?;
        Ok(decode_component(raw)?)
    }

    /// The body decoded as JSON and accepted by `check` (an `api::validate` rule).
    fn json<T: serde::de::DeserializeOwned>(
        &self,
        check: impl FnOnce(&T) -> Result<(), Refusal>,
    ) -> Result<T, ApiError> {
        let value = serde_json::from_slice(&self.body)
            .map_err(|e| ApiError::new(ErrorKind::Invalid, format!("invalid request body: {e}")))?;
        check(&value)?;
        Ok(value)
    }
}

/// Routes one request: parses its query, finds its route, reads its body if the
/// route takes one, and runs the route's handler.
async fn route(daemon: Arc<Daemon>, req: Request<Incoming>) -> Result<Reply, ApiError> {
    let received = Instant::now();
    let query = parse_query(req.uri().query().unwrap_or(""))?;
    let (route, path_params) = find_route(req.method(), req.uri().path())?;
    let (head, body) = req.into_parts();
    let body = match route.body {
        BodyUse::Ignored => Bytes::new(),
        BodyUse::Json => read_body(body).await?,
    };
    let call = Call {
        received,
        query,
        path_params,
        headers: head.headers,
        body,
    };
    (route.handler)(daemon, call).await
}

/// The segments of a path or pattern: what is between its slashes, trailing ones
/// ignored (`/v1/ipam/` is `["v1", "ipam"]`).
fn segments(path: &str) -> Vec<&str> {
    path.trim_end_matches('/').split('/').skip(1).collect()
}

/// The route that serves `method` on `path`, with the segments its `{…}` segments
/// matched; `NotFound` when none does.
fn find_route(method: &Method, path: &str) -> Result<(&'static Route, Vec<String>), ApiError> {
    let path_segments = segments(path);
    for route in ROUTES.iter().filter(|r| r.method == *method) {
        if let Some(params) = match_pattern(route.pattern, &path_segments) {
            return Ok((route, params));
        }
    }
    let message = match path_segments.first() {
        Some(&"v1") => format!("no route for {method} {path}"),
        _ => format!("no route for {method} {path} (the API lives under /v1)"),
    };
    Err(ApiError::new(ErrorKind::NotFound, message))
}

/// The segments `pattern`'s `{…}` segments match in `path_segments`, or `None` when
/// the path is not one of the pattern's.
fn match_pattern(pattern: &str, path_segments: &[&str]) -> Option<Vec<String>> {
    let pattern_segments = segments(pattern);
    if pattern_segments.len() != path_segments.len() {
        return None;
    }
    let mut params = Vec::new();
    for (want, got) in pattern_segments.iter().zip(path_segments) {
        if want.starts_with('{') && want.ends_with('}') {
            params.push(got.to_string());
        } else if want != got {
            return None;
        }
    }
    Some(params)
}

/// `GET /v1/healthz`: the node's status, with the backend, the leak check, the
/// cross-node fabric, the journal's size and the DEL queue.
async fn get_healthz(daemon: Arc<Daemon>, call: Call) -> Result<Reply, ApiError> {
    // Cilium's `brief` header: the figures without the per-address lists
    // (what CNI STATUS needs; a full /16 lists 65,534 addresses).
    let brief = call.header_is_true("brief");
    let mut status = status_response(daemon.with_state_in_place(move |s| Ok(s.status(brief)))?);
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
    status.ipam.policy = daemon.policy_status();
    if let Some(b) = status.bandwidth_manager.as_mut() {
        b.pods_shaped = daemon.bandwidth_shaped();
    }
    status.ipam.l2 = daemon.l2().and_then(|l| l.status());
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

/// `GET /v1/config`: the daemon's configuration.
async fn get_config(daemon: Arc<Daemon>, _call: Call) -> Result<Reply, ApiError> {
    let config = daemon.with_state_in_place(|s| Ok(s.config()))?;
    Ok(json_reply(200, &daemon_configuration(config)))
}

/// `GET /v1/node`: the node's ranges as the daemon uses them.
async fn get_node(daemon: Arc<Daemon>, _call: Call) -> Result<Reply, ApiError> {
    let node = daemon.with_state_in_place(|s| Ok(s.node().clone()))?;
    Ok(json_reply(200, &node))
}

/// `POST /v1/ipam`: the next address of each family (or of `?family=`).
async fn allocate_next(daemon: Arc<Daemon>, call: Call) -> Result<Reply, ApiError> {
    let request = allocate_next_request(&call)?;
    let allocated = daemon.allocate_waiting_for_blocks(request).await?;
    Ok(json_reply(201, &ipam_response(allocated)))
}

/// The checked query (and `expiration` header) of `POST /v1/ipam`.
fn allocate_next_request(call: &Call) -> Result<AllocateRequest, ApiError> {
    let family = match call.query("family").as_str() {
        "" => None,
        f => Some(Family::parse(f).map_err(|_| {
            ApiError::new(
                ErrorKind::Invalid,
                format!("invalid family {f:?}: must be \"ipv4\" or \"ipv6\""),
            )
        })?),
    };
    let expiration = call.header_is_true("expiration");
    validate::owner(&call.query("owner"))?;
    validate::pool("pool", &call.query("pool"))?;
    optional(&call.query("container-id"), |v| {
        validate::container_id("container-id", v)
    })?;
    optional(&call.query("ifname"), |v| validate::ifname("ifname", v))?;
    optional(&call.query("network"), |v| validate::network("network", v))?;
    validate::printable("netns", &call.query("netns"), validate::MAX_PATH_BYTES)?;
    optional(&call.query("pod-uid"), |v| validate::pod_uid("pod-uid", v))?;
    Ok(AllocateRequest {
        family,
        owner: call.query("owner"),
        pool: call.query("pool"),
        expiration,
        container_id: non_empty(call.query("container-id")),
        ifname: non_empty(call.query("ifname")),
        network: non_empty(call.query("network")),
        netns: non_empty(call.query("netns")),
        pod_uid: non_empty(call.query("pod-uid")),
    })
}

/// `POST /v1/ipam/leak-check`: runs the leak check now and answers its report.
async fn check_leaks(daemon: Arc<Daemon>, _call: Call) -> Result<Reply, ApiError> {
    let status = daemon.check_leaks().await.map_err(leak_check_error)?;
    Ok(json_reply(200, &status))
}

/// The address, owner and pool of `POST /v1/ipam/{ip}`, checked.
struct IpClaim {
    ip: String,
    owner: String,
    pool: String,
}

/// `POST /v1/ipam/{ip}`: allocates that address.
async fn allocate_ip(daemon: Arc<Daemon>, call: Call) -> Result<Reply, ApiError> {
    let IpClaim { ip, owner, pool } = ip_claim(&call)?;
    let allocated = daemon.with_state_in_place(move |s| s.allocate_ip(&ip, &owner, &pool))?;
    Ok(json_reply(200, &ipam_response(allocated)))
}

/// The checked path and query of `POST /v1/ipam/{ip}`.
fn ip_claim(call: &Call) -> Result<IpClaim, ApiError> {
    let ip = call.path_param()?;
    let (owner, pool) = (call.query("owner"), call.query("pool"));
    validate::owner(&owner)?;
    validate::pool("pool", &pool)?;
    Ok(IpClaim { ip, owner, pool })
}

/// `DELETE /v1/ipam/{ip}`: releases that address.
async fn release_ip(daemon: Arc<Daemon>, call: Call) -> Result<Reply, ApiError> {
    let (ip, pool) = ip_release(&call)?;
    daemon.with_state_in_place(move |s| s.release_ip(&ip, &pool))?;
    Ok(json_reply(200, &serde_json::Value::Null))
}

/// The checked address and pool of `DELETE /v1/ipam/{ip}`.
fn ip_release(call: &Call) -> Result<(String, String), ApiError> {
    let ip = call.path_param()?;
    let pool = call.query("pool");
    validate::pool("pool", &pool)?;
    Ok((ip, pool))
}

/// `PUT /v1/endpoint/{id}`: registers an attachment (the `{id}` is not used: the
/// body names it).
async fn put_endpoint(daemon: Arc<Daemon>, call: Call) -> Result<Reply, ApiError> {
    let change: EndpointChangeRequest = call.json(validate::endpoint_change)?;
    // The plugin's timings end where this request starts; its registration
    // phase is this request as the daemon handles it.
    let received = call.received;
    let view = daemon.with_state_in_place(move |s| {
        let view = s.create_endpoint(&endpoint_registration(&change))?;
        s.plugin_timings(
            "ADD",
            &change.podnet_phases,
            "endpoint-registration",
            received.elapsed(),
        );
        Ok(view)
    })?;
    Ok(json_reply(201, &endpoint_view(view)))
}

/// `GET /v1/endpoint/{id}`: one endpoint.
async fn get_endpoint(daemon: Arc<Daemon>, call: Call) -> Result<Reply, ApiError> {
    let id = endpoint_id(&call)?;
    let endpoint = daemon.with_state_in_place(move |s| s.endpoint(&id))?;
    Ok(json_reply(200, &endpoint_view(endpoint)))
}

/// The checked `{id}` of `GET /v1/endpoint/{id}`.
fn endpoint_id(call: &Call) -> Result<String, ApiError> {
    let id = call.path_param()?;
    validate::printable("endpoint id", &id, MAX_QUERY_BYTES)?;
    Ok(id)
}

/// `DELETE /v1/endpoint`: deletes an attachment's endpoint and host links and
/// releases its addresses.
async fn delete_endpoints(daemon: Arc<Daemon>, call: Call) -> Result<Reply, ApiError> {
    let delete: EndpointBatchDeleteRequest = call.json(validate::endpoint_delete)?;
    // The plugin's timings end where this request starts; `daemon-release`
    // is this request as the daemon handles it.
    let received = call.received;
    let teardown = daemon.with_state_in_place(move |s| {
        let deleted = s.delete_endpoints(&endpoint_release(&delete));
        s.plugin_timings(
            "DEL",
            &delete.podnet_phases,
            "daemon-release",
            received.elapsed(),
        );
        deleted
    })?;
    if let Some(teardown) = teardown {
        daemon.spawn_teardown(teardown);
    }
    Ok(json_reply(200, &serde_json::Value::Null))
}

/// `POST /v1/cni/report`: the plugin's account of an ADD or DEL.
async fn cni_report(daemon: Arc<Daemon>, call: Call) -> Result<Reply, ApiError> {
    let report: CniReport = call.json(validate::report)?;
    daemon.with_state_in_place(move |s| {
        s.bind_wired(&wired_attachment(&report))?;
        s.cni_report(plugin_report(&report));
        Ok(())
    })?;
    Ok(json_reply(200, &serde_json::Value::Null))
}

/// The plugin's report as the state takes it.
fn plugin_report(report: &CniReport) -> PluginReport<'_> {
    PluginReport {
        verb: &report.verb,
        container_id: &report.container_id,
        ifname: &report.ifname,
        owner: &report.owner,
        phases: &report.phases,
        reason: &report.reason,
        error: &report.error,
    }
}

/// `GET /v1/explain?q=`: what the daemon knows about a pod, address or container.
async fn explain(daemon: Arc<Daemon>, call: Call) -> Result<Reply, ApiError> {
    let subject = explain_subject(&call)?;
    let explanation = daemon.with_state_in_place(|s| Ok(s.explain(&subject)))?;
    let mut answer = answers::explain::explain_response(&subject, explanation);
    if !answer.addresses.is_empty()
        && let Some(listing) = daemon.source_check_listing().await
    {
        add_spoofed_traffic(&mut answer, listing.spoofers);
    }
    if let Some(leaks) = daemon.leak_status() {
        add_leaks(&mut answer, leaks.findings);
    }
    if let Some(explanations) = daemon.policy_explanations() {
        super::policy_loop::explain::add_policy(&mut answer, &explanations);
    }
    if let (Some(l2), Ok(address)) = (daemon.l2(), subject.parse()) {
        super::l2_loop::add_explanation(&mut answer, l2, address);
    }
    Ok(json_reply(200, &answer))
}

/// The checked `q` of `GET /v1/explain`: required.
fn explain_subject(call: &Call) -> Result<String, ApiError> {
    let subject = call.query("q");
    if subject.is_empty() {
        return Err(ApiError::new(
            ErrorKind::Invalid,
            "explain needs ?q=<pod ns/name | ip | container id>",
        ));
    }
    validate::printable("q", &subject, MAX_QUERY_BYTES)?;
    Ok(subject)
}

/// `GET /metrics`: the Prometheus text.
async fn get_metrics(daemon: Arc<Daemon>, _call: Call) -> Result<Reply, ApiError> {
    Ok(text_reply(daemon.metrics_text().await?))
}

/// `POST /v1/cni/gc`: releases the network's allocations whose attachments the
/// runtime no longer lists, and deletes their host links.
async fn cni_gc(daemon: Arc<Daemon>, call: Call) -> Result<Reply, ApiError> {
    let gc: GcRequest = call.json(validate::gc)?;
    let collected = daemon.with_state_in_place(move |s| s.gc(&gc_scope(&gc)))?;
    daemon
        .remove_host_links(collected.stale_attachments.clone())
        .await;
    Ok(json_reply(200, &gc_response(&collected)))
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

/// Reads a body of at most `MAX_BODY` bytes that arrives within `BODY_TIMEOUT`; a
/// stalled body gets 408, and the connection is closed after it.
async fn read_body<B>(body: B) -> Result<Bytes, ApiError>
where
    B: hyper::body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let collected = tokio::time::timeout(BODY_TIMEOUT, Limited::new(body, MAX_BODY).collect())
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
        })?;
    Ok(collected.to_bytes())
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

    /// A `Call` as `route` makes it: `query` parsed as the query string, the
    /// segments `{…}` matched, the headers and the body.
    fn call(
        query: &str,
        path_params: &[&str],
        headers: &[(&'static str, &str)],
        body: &str,
    ) -> Call {
        let mut header_map = HeaderMap::new();
        for (name, value) in headers {
            header_map.insert(*name, value.parse().unwrap());
        }
        Call {
            received: Instant::now(),
            query: parse_query(query).unwrap(),
            path_params: path_params.iter().map(|p| p.to_string()).collect(),
            headers: header_map,
            body: Bytes::from(body.to_string()),
        }
    }

    fn query(q: &str) -> Call {
        call(q, &[], &[], "")
    }

    fn path(param: &str, q: &str) -> Call {
        call(q, &[param], &[], "")
    }

    /// The HTTP status a refusal is answered with.
    fn status_of<T>(result: Result<T, ApiError>) -> u16 {
        match result {
            Ok(_) => panic!("accepted"),
            Err(e) => http_status(e.kind),
        }
    }

    /// The route that serves `method` on `path`: its pattern and path parameters.
    fn found(method: Method, path: &str) -> (&'static str, Vec<String>) {
        let (route, params) = find_route(&method, path).unwrap();
        (route.pattern, params)
    }

    #[test]
    fn every_route_is_found_by_its_own_pattern() {
        for route in ROUTES {
            let path = route
                .pattern
                .replace("{ip}", "10.0.0.1")
                .replace("{id}", "7");
            for path in [path.clone(), format!("{path}/")] {
                let (found, _) = find_route(&route.method, &path).unwrap();
                assert_eq!(
                    (&found.method, found.pattern),
                    (&route.method, route.pattern),
                    "{path}"
                );
            }
        }
    }

    #[test]
    fn path_parameters_are_the_segments_as_sent() {
        assert_eq!(
            found(Method::POST, "/v1/ipam/fd00%3A%3A1"),
            ("/v1/ipam/{ip}", vec!["fd00%3A%3A1".to_string()])
        );
        assert_eq!(
            found(Method::GET, "/v1/endpoint/cilium-local:0"),
            ("/v1/endpoint/{id}", vec!["cilium-local:0".to_string()])
        );
        assert_eq!(found(Method::POST, "/v1/ipam/"), ("/v1/ipam", vec![]));
        // The leak check is its own route for POST; DELETE releases an address
        // spelled `leak-check` (which the state refuses).
        assert_eq!(
            found(Method::POST, "/v1/ipam/leak-check"),
            ("/v1/ipam/leak-check", vec![])
        );
        assert_eq!(
            found(Method::DELETE, "/v1/ipam/leak-check"),
            ("/v1/ipam/{ip}", vec!["leak-check".to_string()])
        );
    }

    #[test]
    fn unknown_paths_and_wrong_methods_are_not_found() {
        let not_found = |method: Method, path: &str| {
            let e = find_route(&method, path).err().unwrap();
            assert_eq!(http_status(e.kind), 404, "{method} {path}");
            e.message
        };
        assert_eq!(
            not_found(Method::GET, "/v1/ipam"),
            "no route for GET /v1/ipam"
        );
        // Outside /v1 the message says where the API lives.
        let outside = " (the API lives under /v1)";
        for (method, path, suffix) in [
            (Method::PUT, "/v1/cni/gc", ""),
            (Method::POST, "/v1/healthz", ""),
            (Method::HEAD, "/v1/healthz", ""),
            (Method::GET, "/v1/ipam/10.0.0.1", ""),
            (Method::POST, "/v1/ipam/10.0.0.1/x", ""),
            (Method::PUT, "/v1/endpoint", ""),
            (Method::DELETE, "/v1/endpoint/7", ""),
            (Method::GET, "/v1/nothing", ""),
            (Method::GET, "/v1", ""),
            (Method::GET, "/", outside),
            (Method::GET, "/healthz", outside),
            (Method::POST, "/metrics", outside),
            (Method::GET, "/v2/healthz", outside),
        ] {
            assert_eq!(
                not_found(method.clone(), path),
                format!("no route for {method} {path}{suffix}")
            );
        }
    }

    #[test]
    fn a_query_that_is_not_utf8_is_invalid() {
        let e = ApiError::from(parse_query("owner=%FF").err().unwrap());
        assert_eq!(http_status(e.kind), 400);
    }

    #[test]
    fn allocate_next_takes_its_query_and_expiration_header() {
        let request = allocate_next_request(&call(
            "family=ipv6&owner=default%2Fweb-0&pool=blue&container-id=0123abc&ifname=eth0\
             &network=podnet&netns=%2Fvar%2Frun%2Fnetns%2Fx&pod-uid=6b1c",
            &[],
            &[("expiration", "TRUE")],
            "",
        ))
        .unwrap();
        assert_eq!(request.family, Some(Family::V6));
        assert_eq!(
            (request.owner.as_str(), request.pool.as_str()),
            ("default/web-0", "blue")
        );
        assert!(request.expiration);
        assert_eq!(request.container_id.as_deref(), Some("0123abc"));
        assert_eq!(request.ifname.as_deref(), Some("eth0"));
        assert_eq!(request.network.as_deref(), Some("podnet"));
        assert_eq!(request.netns.as_deref(), Some("/var/run/netns/x"));
        assert_eq!(request.pod_uid.as_deref(), Some("6b1c"));

        // Everything is optional; absent is empty, not set.
        let request = allocate_next_request(&query("")).unwrap();
        assert_eq!(request.family, None);
        assert!(!request.expiration);
        assert_eq!(
            (
                request.container_id,
                request.ifname,
                request.network,
                request.netns,
                request.pod_uid
            ),
            (None, None, None, None, None)
        );
        let other = call("", &[], &[("expiration", "yes")], "");
        assert!(!allocate_next_request(&other).unwrap().expiration);
    }

    #[test]
    fn allocate_next_refuses_bad_query_values() {
        let e = allocate_next_request(&query("family=ipv5")).err().unwrap();
        assert_eq!(
            (http_status(e.kind), e.message.as_str()),
            (400, "invalid family \"ipv5\": must be \"ipv4\" or \"ipv6\"")
        );
        let long_owner = format!("owner={}", "a".repeat(validate::MAX_OWNER_BYTES + 1));
        let long_pool = format!("pool={}", "p".repeat(validate::MAX_POOL_BYTES + 1));
        for bad in [
            long_owner.as_str(),
            "owner=a%01b",
            long_pool.as_str(),
            "container-id=not%20an%20id",
            "ifname=eth%2F0",
            "network=no%20spaces",
            "netns=%2Fproc%01",
            "pod-uid=%7F",
        ] {
            assert_eq!(status_of(allocate_next_request(&query(bad))), 400, "{bad}");
        }
    }

    #[test]
    fn allocate_ip_decodes_its_address_and_checks_owner_and_pool() {
        let claim = ip_claim(&path("fd00%3A%3A1", "owner=o&pool=p")).unwrap();
        assert_eq!(
            (claim.ip.as_str(), claim.owner.as_str(), claim.pool.as_str()),
            ("fd00::1", "o", "p")
        );
        assert_eq!(status_of(ip_claim(&path("%FF", ""))), 400);
        assert_eq!(status_of(ip_claim(&path("10.0.0.1", "owner=%01"))), 400);
        let long_pool = format!("pool={}", "p".repeat(validate::MAX_POOL_BYTES + 1));
        assert_eq!(status_of(ip_claim(&path("10.0.0.1", &long_pool))), 400);
        // No path parameter is a route-table mistake, not the client's.
        assert_eq!(status_of(ip_claim(&query(""))), 500);
    }

    #[test]
    fn release_ip_decodes_its_address_and_checks_the_pool() {
        assert_eq!(
            ip_release(&path("10.0.0.1", "pool=blue")).unwrap(),
            ("10.0.0.1".to_string(), "blue".to_string())
        );
        assert_eq!(
            ip_release(&path("10.0.0.1", "")).unwrap(),
            ("10.0.0.1".to_string(), String::new())
        );
        assert_eq!(status_of(ip_release(&path("%C3%28", ""))), 400);
        assert_eq!(status_of(ip_release(&path("10.0.0.1", "pool=a%0Ab"))), 400);
    }

    #[test]
    fn endpoint_id_is_decoded_and_printable() {
        assert_eq!(
            endpoint_id(&path("cilium-local%3A0", "")).unwrap(),
            "cilium-local:0"
        );
        assert_eq!(status_of(endpoint_id(&path("a%01", ""))), 400);
        let long = "i".repeat(MAX_QUERY_BYTES + 1);
        assert_eq!(status_of(endpoint_id(&path(&long, ""))), 400);
    }

    #[test]
    fn explain_needs_a_printable_subject() {
        assert_eq!(
            explain_subject(&query("q=default%2Fweb-0")).unwrap(),
            "default/web-0"
        );
        let e = explain_subject(&query("")).err().unwrap();
        assert_eq!(
            (http_status(e.kind), e.message.as_str()),
            (400, "explain needs ?q=<pod ns/name | ip | container id>")
        );
        assert_eq!(status_of(explain_subject(&query("q=a%1Bb"))), 400);
    }

    fn body(json: &str) -> Call {
        call("", &["7"], &[], json)
    }

    #[test]
    fn bodies_are_decoded_then_checked() {
        let change = EndpointChangeRequest {
            container_id: "0123abc".into(),
            container_interface_name: "eth0".into(),
            k8s_uid: "6b1c".into(),
            ..Default::default()
        };
        let json = serde_json::to_string(&change).unwrap();
        assert_eq!(body(&json).json(validate::endpoint_change).unwrap(), change);
        // Not JSON, the wrong shape, no body at all.
        for bad in ["{", "\"text\"", "", "{\"container-id\": 5}"] {
            let e = body(bad)
                .json::<EndpointChangeRequest>(validate::endpoint_change)
                .err()
                .unwrap();
            assert_eq!(http_status(e.kind), 400, "{bad:?}");
            assert!(
                e.message.starts_with("invalid request body: "),
                "{}",
                e.message
            );
        }
        // Well-formed, but refused by the route's rule.
        let bad_id = serde_json::to_string(&EndpointChangeRequest {
            container_id: "not an id".into(),
            ..change
        })
        .unwrap();
        let e = body(&bad_id)
            .json::<EndpointChangeRequest>(validate::endpoint_change)
            .err()
            .unwrap();
        assert_eq!(http_status(e.kind), 400);
        assert!(
            e.message.starts_with("invalid container-id"),
            "{}",
            e.message
        );
    }

    #[test]
    fn each_body_route_checks_its_body() {
        let delete = serde_json::to_string(&EndpointBatchDeleteRequest {
            container_id: "bad id".into(),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            status_of(body(&delete).json(validate::endpoint_delete)),
            400
        );
        let report = serde_json::to_string(&CniReport {
            verb: "ADD\u{1}".into(),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(status_of(body(&report).json(validate::report)), 400);
        let gc = serde_json::to_string(&GcRequest::default()).unwrap();
        assert_eq!(status_of(body(&gc).json(validate::gc)), 400);
        let gc = serde_json::to_string(&GcRequest {
            network: "podnet".into(),
            ..Default::default()
        })
        .unwrap();
        assert!(body(&gc).json(validate::gc).is_ok());
    }

    /// What each body route answers for a body without its required fields (`{}`):
    /// 400 naming the field, from the route's rule (the container ID of PUT and
    /// DELETE /v1/endpoint) or from decoding (the network of POST /v1/cni/gc, the
    /// verb of POST /v1/cni/report).
    #[test]
    fn a_body_without_its_required_fields_is_400_naming_the_field() {
        fn refused<T: serde::de::DeserializeOwned>(
            check: impl FnOnce(&T) -> Result<(), Refusal>,
        ) -> (u16, String) {
            match body("{}").json(check) {
                Ok(_) => (200, String::new()),
                Err(e) => (http_status(e.kind), e.message),
            }
        }
        for ((status, message), starts) in [
            (
                refused::<EndpointChangeRequest>(validate::endpoint_change),
                "invalid container-id \"\"",
            ),
            (
                refused::<EndpointBatchDeleteRequest>(validate::endpoint_delete),
                "invalid container-id \"\"",
            ),
            (
                refused::<GcRequest>(validate::gc),
                "invalid request body: missing field `network`",
            ),
            (
                refused::<CniReport>(validate::report),
                "invalid request body: missing field `verb`",
            ),
        ] {
            assert_eq!(status, 400, "{message}");
            assert!(message.starts_with(starts), "{message}");
        }
    }

    #[tokio::test]
    async fn a_body_is_read_up_to_its_limit() {
        let small = Full::new(Bytes::from_static(b"{}"));
        assert_eq!(read_body(small).await.unwrap(), Bytes::from_static(b"{}"));
        let large = Full::new(Bytes::from(vec![b' '; MAX_BODY + 1]));
        let e = read_body(large).await.err().unwrap();
        assert_eq!(http_status(e.kind), 413);
        assert_eq!(
            e.message,
            format!("request body rejected: length limit exceeded (limit {MAX_BODY} bytes)")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_times_out() {
        let stalled = http_body_util::StreamBody::new(futures::stream::pending::<
            Result<hyper::body::Frame<Bytes>, std::convert::Infallible>,
        >());
        let e = read_body(stalled).await.err().unwrap();
        assert_eq!(http_status(e.kind), 408);
        assert_eq!(
            e.message,
            format!(
                "request body did not arrive within {} s; closing the connection",
                BODY_TIMEOUT.as_secs()
            )
        );
    }
}
