//! Small HTTP pieces both sides of the socket share: percent-encoding of query
//! values, query-string parsing, and the status-line / header parsing of the
//! plugin's minimal HTTP/1.1 client.

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

/// Decodes `%XX` escapes and `+` (as space). Invalid escapes are kept verbatim; a
/// result that is not UTF-8 is rejected.
pub fn decode_component(s: &str) -> Result<String, String> {
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
    String::from_utf8(out).map_err(|_| format!("query value {s:?} is not valid UTF-8"))
}

/// Parses `a=1&b=2` into a map (last value wins).
pub fn parse_query(q: &str) -> Result<HashMap<String, String>, String> {
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

/// A parsed HTTP response: status code and body.
#[derive(Debug, Clone, PartialEq)]
pub struct RawResponse {
    pub status: u16,
    pub body: Vec<u8>,
}

/// Parses a complete HTTP/1.1 response (the connection was closed by the server, so
/// everything is in `raw`). Honours Content-Length and chunked transfer coding.
pub fn parse_response(raw: &[u8]) -> Result<RawResponse, String> {
    let head_end = find(raw, b"\r\n\r\n").ok_or("response has no end of headers")?;
    let head = std::str::from_utf8(&raw[..head_end]).map_err(|_| "response head is not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let mut content_length = None;
    let mut chunked = false;
    for line in lines {
        if let Some((k, v)) = line.split_once(':') {
            let k = k.trim().to_ascii_lowercase();
            let v = v.trim();
            if k == "content-length" {
                content_length = v.parse::<usize>().ok();
            } else if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
                chunked = true;
            }
        }
    }
    let rest = &raw[head_end + 4..];
    let body = if chunked {
        dechunk(rest)?
    } else if let Some(n) = content_length {
        if rest.len() < n {
            return Err(format!(
                "response body truncated: {} of {n} bytes",
                rest.len()
            ));
        }
        rest[..n].to_vec()
    } else {
        rest.to_vec()
    };
    Ok(RawResponse { status, body })
}

fn dechunk(mut data: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let line_end = find(data, b"\r\n").ok_or("bad chunk header")?;
        let size_str = std::str::from_utf8(&data[..line_end]).map_err(|_| "bad chunk size")?;
        let size = usize::from_str_radix(size_str.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| format!("bad chunk size {size_str:?}"))?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if size.checked_add(2).is_none_or(|need| data.len() < need) {
            return Err("chunk truncated".into());
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
                body: b"{}".to_vec()
            }
        );
        let r = parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.body, b"abc");
        assert!(parse_response(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nab").is_err());
        assert!(parse_response(b"garbage").is_err());
        let huge = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nx";
        assert!(parse_response(huge).is_err());
        assert!(parse_response(b"HTTP/1.1 abc\r\n\r\n").is_err());
    }
}
