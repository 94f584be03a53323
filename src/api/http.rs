//! Small HTTP pieces both sides of the socket share: percent-encoding of query
//! values, query-string parsing, JSON fit for a header value, and the status-line
//! / header parsing of the plugin's minimal HTTP/1.1 client.

use std::collections::HashMap;

/// Percent-encodes everything but RFC 3986 unreserved characters.
pub fn encode_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A query value whose decoded bytes are not UTF-8 (the value as sent).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("query value {0:?} is not valid UTF-8")]
pub struct NotUtf8(pub String);

/// Decodes `%XX` escapes and `+` (as space). Invalid escapes are kept verbatim; a
/// result that is not UTF-8 is rejected.
pub fn decode_component(s: &str) -> Result<String, NotUtf8> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len()
                && bytes[i + 1].is_ascii_hexdigit()
                && bytes[i + 2].is_ascii_hexdigit() =>
            {
                // Both are hex digits, so this cannot fail; `from_str_radix` alone
                // would also take a sign (`%+1`).
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("00");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(0));
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| NotUtf8(s.to_string()))
}

/// Parses `a=1&b=2` into a map (last value wins).
pub fn parse_query(q: &str) -> Result<HashMap<String, String>, NotUtf8> {
    let mut map = HashMap::new();
    for pair in q.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        map.insert(decode_component(k)?, decode_component(v)?);
    }
    Ok(map)
}

/// Builds `a=1&b=2` from pairs, skipping empty values.
pub fn build_query(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{}={}", encode_component(k), encode_component(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// A parsed HTTP response: status code, reason phrase and body.
#[derive(Debug, Clone, PartialEq)]
pub struct RawResponse {
    pub status: u16,
    /// The status line's reason phrase (`Request Timeout`), possibly empty.
    pub reason: String,
    /// The `podnet-reason` header: why the daemon refused, when it says.
    pub podnet_reason: Option<String>,
    /// The `podnet-config` header: the daemon's configuration as JSON, sent with
    /// a `delegated-plugin` refusal.
    pub podnet_config: Option<String>,
    pub body: Vec<u8>,
}

/// Why the bytes of a response could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseError {
    /// The bytes stop before the response does (no end of headers, a short body or
    /// chunk): the server closed the connection in the middle of its answer.
    Incomplete(String),
    /// The bytes are not an HTTP/1.1 response.
    Malformed(String),
}

impl std::fmt::Display for ResponseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResponseError::Incomplete(s) | ResponseError::Malformed(s) => f.write_str(s),
        }
    }
}

/// Parses a complete HTTP/1.1 response (the connection was closed by the server, so
/// everything is in `raw`). Honours Content-Length and chunked transfer coding.
pub fn parse_response(raw: &[u8]) -> Result<RawResponse, ResponseError> {
    use ResponseError::{Incomplete, Malformed};
    let Some(head_end) = find(raw, b"\r\n\r\n") else {
        // A cut-off head still starts like one; anything else is another protocol.
        let n = raw.len().min(5);
        return Err(if raw[..n] == b"HTTP/"[..n] {
            Incomplete(format!(
                "the answer stops after {} bytes, before the end of its headers",
                raw.len()
            ))
        } else {
            Malformed("the answer is not HTTP".into())
        });
    };
    let head = std::str::from_utf8(&raw[..head_end])
        .map_err(|_| Malformed("response head is not UTF-8".into()))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.splitn(3, ' ');
    let status = parts
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| Malformed(format!("bad status line {status_line:?}")))?;
    let reason = parts.next().unwrap_or("").trim().to_string();
    let mut content_length = None;
    let mut chunked = false;
    let mut podnet_reason = None;
    let mut podnet_config = None;
    for line in lines {
        if let Some((k, v)) = line.split_once(':') {
            let k = k.trim().to_ascii_lowercase();
            let v = v.trim();
            if k == "content-length" {
                content_length = v.parse::<usize>().ok();
            } else if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
                chunked = true;
            } else if k == crate::api::models::REASON_HEADER {
                podnet_reason = Some(v.to_string());
            } else if k == crate::api::models::CONFIG_HEADER {
                podnet_config = Some(v.to_string());
            }
        }
    }
    let rest = &raw[head_end + 4..];
    let body = if chunked {
        dechunk(rest)?
    } else if let Some(n) = content_length {
        if rest.len() < n {
            return Err(Incomplete(format!(
                "response body truncated: {} of {n} bytes",
                rest.len()
            )));
        }
        rest[..n].to_vec()
    } else {
        rest.to_vec()
    };
    Ok(RawResponse {
        status,
        reason,
        podnet_reason,
        podnet_config,
        body,
    })
}

/// Whether `raw` holds a whole response whose end its framing marks (a
/// Content-Length satisfied, or the last chunk of chunked coding), so a reader
/// need not wait for the server to close the connection. An answer framed by the
/// close alone is never complete here.
pub fn is_complete(raw: &[u8]) -> bool {
    let Some(head_end) = find(raw, b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
    let framed = head.split("\r\n").skip(1).any(|line| {
        line.starts_with("content-length:")
            || (line.starts_with("transfer-encoding:") && line.contains("chunked"))
    });
    framed && parse_response(raw).is_ok()
}

/// JSON text fit for an HTTP header value: serde_json already escapes control
/// characters; the characters beyond ASCII (which only occur inside strings) are
/// written as `\uXXXX` escapes (UTF-16, as JSON has them).
pub fn ascii_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for ch in json.chars() {
        if ch.is_ascii() {
            out.push(ch);
        } else {
            let mut units = [0u16; 2];
            for unit in ch.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

fn dechunk(mut data: &[u8]) -> Result<Vec<u8>, ResponseError> {
    use ResponseError::{Incomplete, Malformed};
    let mut out = Vec::new();
    loop {
        let line_end =
            find(data, b"\r\n").ok_or_else(|| Incomplete("chunk header truncated".into()))?;
        let size_str = std::str::from_utf8(&data[..line_end])
            .map_err(|_| Malformed("bad chunk size".into()))?;
        let size = usize::from_str_radix(size_str.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| Malformed(format!("bad chunk size {size_str:?}")))?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if size.checked_add(2).is_none_or(|need| data.len() < need) {
            return Err(Incomplete("chunk truncated".into()));
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn component_round_trip() {
        let s = "kube-system/core dns+1%é";
        assert_eq!(decode_component(&encode_component(s)).unwrap(), s);
        assert_eq!(encode_component("a/b"), "a%2Fb");
        assert_eq!(decode_component("a%2fb").unwrap(), "a/b");
        assert_eq!(decode_component("100%").unwrap(), "100%");
        assert_eq!(decode_component("%zz").unwrap(), "%zz");
        assert_eq!(decode_component("%+1").unwrap(), "% 1");
        assert!(decode_component("%ff").is_err());
    }

    #[test]
    fn query() {
        let q = parse_query("owner=ns%2Fpod&family=ipv4&&flag").unwrap();
        assert_eq!(q["owner"], "ns/pod");
        assert_eq!(q["family"], "ipv4");
        assert_eq!(q["flag"], "");
        assert_eq!(
            build_query(&[("owner", "a/b"), ("pool", "")]),
            "owner=a%2Fb"
        );
    }

    #[test]
    fn responses() {
        let r = parse_response(b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n{}").unwrap();
        assert_eq!(
            r,
            RawResponse {
                status: 201,
                reason: "Created".into(),
                podnet_reason: None,
                podnet_config: None,
                body: b"{}".to_vec()
            }
        );
        let r = parse_response(
            b"HTTP/1.1 502 Bad Gateway\r\npodnet-reason: range-full\r\ncontent-length: 2\r\n\r\n\"\"",
        )
        .unwrap();
        assert_eq!(r.podnet_reason.as_deref(), Some("range-full"));
        let r = parse_response(
            b"HTTP/1.1 502 Bad Gateway\r\npodnet-reason: delegated-plugin\r\nPodnet-Config: {\"ipam-mode\":\"delegated-plugin\"}\r\ncontent-length: 2\r\n\r\n\"\"",
        )
        .unwrap();
        assert_eq!(
            (r.podnet_reason.as_deref(), r.podnet_config.as_deref()),
            (
                Some("delegated-plugin"),
                Some(r#"{"ipam-mode":"delegated-plugin"}"#)
            )
        );
        let r = parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.body, b"abc");
        let r = parse_response(b"HTTP/1.1 414 URI Too Long\r\ncontent-length: 0\r\n\r\n").unwrap();
        assert_eq!((r.status, r.reason.as_str()), (414, "URI Too Long"));
        let r = parse_response(b"HTTP/1.1 500\r\n\r\n").unwrap();
        assert_eq!((r.status, r.reason.as_str()), (500, ""));
    }

    #[test]
    fn header_json_is_ascii_and_still_the_same_json() {
        let v = serde_json::json!({"node-name": "nœud-🚀", "line": "a\nb"});
        let text = ascii_json(&serde_json::to_string(&v).unwrap());
        assert!(text.bytes().all(|b| (0x20..0x7f).contains(&b)), "{text}");
        assert!(text.contains("n\\u0153ud-\\ud83d\\ude80"), "{text}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&text).unwrap(), v);
    }

    #[test]
    fn cut_off_responses_are_incomplete_and_others_malformed() {
        let incomplete =
            |raw: &[u8]| matches!(parse_response(raw), Err(ResponseError::Incomplete(_)));
        let malformed =
            |raw: &[u8]| matches!(parse_response(raw), Err(ResponseError::Malformed(_)));
        for raw in [
            &b""[..],
            b"H",
            b"HTTP/",
            b"HTTP/1.1 200 OK\r\nContent-",
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nab",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nx",
        ] {
            assert!(incomplete(raw), "{:?}", String::from_utf8_lossy(raw));
        }
        for raw in [
            &b"garbage"[..],
            b"SSH-2.0-OpenSSH\r\n",
            b"HTTP/1.1 abc\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        ] {
            assert!(malformed(raw), "{:?}", String::from_utf8_lossy(raw));
        }
        let e = parse_response(b"HTTP/1.1 2").unwrap_err();
        assert_eq!(
            e.to_string(),
            "the answer stops after 10 bytes, before the end of its headers"
        );
    }

    #[test]
    fn only_answers_their_framing_ends_are_complete_before_the_close() {
        for raw in [
            &b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n{}"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        ] {
            assert!(is_complete(raw), "{:?}", String::from_utf8_lossy(raw));
        }
        for raw in [
            &b""[..],
            b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n",
            b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n{",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n",
            // No framing: only the server's close ends it.
            b"HTTP/1.1 200 OK\r\n\r\n{}",
            // A header value that merely mentions the word is not framing.
            b"HTTP/1.1 200 OK\r\nx-note: content-length: 2\r\n\r\n{}",
        ] {
            assert!(!is_complete(raw), "{:?}", String::from_utf8_lossy(raw));
        }
    }
}
