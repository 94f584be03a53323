//! The Prometheus listener of the daemon and the operator: `GET /metrics` over
//! HTTP/1 on `--prometheus-serve-addr`, one task per connection, with a time
//! limit on the request head.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Response;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

/// How long a connection may take to send its request head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// A `text/plain` answer in Prometheus' text format.
pub fn text_reply(body: String) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}

/// Why the metrics listener could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum MetricsBindError {
    /// `--prometheus-serve-addr` is not an address and port.
    #[error(
        "--prometheus-serve-addr {0:?}: want an IP address and port (127.0.0.1:9962, [::1]:9962) or :port for every address; host names are not resolved"
    )]
    NotAnAddress(String),
    /// The kernel refused the bind (in use, not an address of this host, ...).
    #[error("cannot serve metrics on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// Binds the metrics listener (`ip:port`, or `:port` for every address). Host names
/// are refused rather than resolved: the release binary links glibc statically,
/// where name service lookups are unreliable.
pub async fn bind_metrics(addr: &str) -> Result<tokio::net::TcpListener, MetricsBindError> {
    let socket_addr = parse_metrics_addr(addr)?;
    tokio::net::TcpListener::bind(socket_addr)
        .await
        .map_err(|source| MetricsBindError::Bind {
            addr: socket_addr,
            source,
        })
}

fn parse_metrics_addr(addr: &str) -> Result<std::net::SocketAddr, MetricsBindError> {
    let literal = if addr.starts_with(':') {
        format!("[::]{addr}")
    } else {
        addr.to_string()
    };
    literal
        .parse()
        .map_err(|_| MetricsBindError::NotAnAddress(addr.to_string()))
}

/// Serves `GET /metrics` (anything else is 404) on the metrics listener, with the
/// text `metrics` gives for each scrape (the daemon's and the operator's registries).
pub async fn serve_metrics<F, Fut>(listener: tokio::net::TcpListener, metrics: F)
where
    F: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = String> + Send + 'static,
{
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let metrics = metrics.clone();
                async move {
                    let reply = if req.uri().path() == "/metrics" {
                        text_reply(metrics().await)
                    } else {
                        let mut r = text_reply("only /metrics lives here\n".into());
                        *r.status_mut() = hyper::StatusCode::NOT_FOUND;
                        r
                    };
                    Ok::<_, std::convert::Infallible>(reply)
                }
            });
            let conn = http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), svc);
            let _ = conn.await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::parse_metrics_addr;

    #[test]
    fn metrics_address_is_an_ip_and_port_or_a_bare_port() {
        assert_eq!(
            parse_metrics_addr("127.0.0.1:9962").unwrap().to_string(),
            "127.0.0.1:9962"
        );
        assert_eq!(
            parse_metrics_addr(":9962").unwrap().to_string(),
            "[::]:9962"
        );
        assert_eq!(
            parse_metrics_addr("[::1]:9962").unwrap().to_string(),
            "[::1]:9962"
        );
        for bad in ["localhost:9962", "9962", "127.0.0.1", "", "[::1]"] {
            let err = parse_metrics_addr(bad).expect_err(bad).to_string();
            assert!(err.contains("host names are not resolved"), "{bad}: {err}");
        }
    }
}
