//! `podnet::api::http`: query parsing, percent-decoding (checked against a
//! reference decoder), the encode/decode round trip, and `parse_response`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use podnet::api::http::{
    build_query, decode_component, encode_component, parse_query, parse_response,
};

/// The documented decoding: `%XX` with two hex digits is a byte, any other `%`
/// is kept verbatim, `+` is a space; the result must be UTF-8.
fn reference_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len()
                && b[i + 1].is_ascii_hexdigit()
                && b[i + 2].is_ascii_hexdigit() =>
            {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

fuzz_target!(|data: &[u8]| {
    // The plugin's HTTP client reads whatever the socket returns.
    if let Ok(r) = parse_response(data) {
        assert!(r.body.len() <= data.len());
    }

    let s = String::from_utf8_lossy(data);
    let s = s.as_ref();

    // Percent-encoding: only unreserved characters and %XX, and it decodes back.
    let enc = encode_component(s);
    assert!(
        enc.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.~%".contains(&b))
    );
    assert_eq!(decode_component(&enc).as_deref(), Ok(s), "encoded {enc:?}");

    // Decoding agrees with the documented rules (F1, `%+X`, is fixed).
    assert_eq!(
        decode_component(s).ok(),
        reference_decode(s),
        "decode_component({s:?})"
    );

    // A parsed query, rebuilt with build_query, parses to the same map (minus the
    // empty values build_query skips).
    if let Ok(map) = parse_query(s) {
        let pairs: Vec<(&str, &str)> = map.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let rebuilt = build_query(&pairs);
        let mut again = parse_query(&rebuilt).expect("rebuilt query parses");
        let mut want = map.clone();
        want.retain(|_, v| !v.is_empty());
        again.retain(|_, v| !v.is_empty());
        assert_eq!(again, want, "rebuilt {rebuilt:?}");
    }
});
