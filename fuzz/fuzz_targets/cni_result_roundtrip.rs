//! `CniResult::from_value` and the render/parse round trip of `to_json`.
//!
//! Input: JSON. For every result that parses:
//! - `to_json("1.1.0")` parses back to the same result (with `cniVersion`
//!   "1.1.0"; an empty `dns` is omitted by design, so it comes back `None`),
//!   and rendering that again gives the same JSON;
//! - `to_json("1.0.0")` / `to_json("0.4.0")` parse back to the result minus the
//!   1.1.0-only keys.

#![no_main]

use libfuzzer_sys::fuzz_target;
use podnet::cni::CniResult;

/// What a result looks like after rendering: `cniVersion` replaced, an empty
/// `dns` dropped, and (below 1.1.0) the 1.1.0-only keys removed.
fn rendered(r: &CniResult, version: &str) -> CniResult {
    let mut r = r.clone();
    r.cni_version = version.to_string();
    if r.dns.as_ref().is_some_and(|d| d.is_empty()) {
        r.dns = None;
    }
    if version != "1.1.0" {
        for i in &mut r.interfaces {
            i.mtu = None;
            i.socket_path = None;
            i.pci_id = None;
        }
        for rt in &mut r.routes {
            rt.mtu = None;
            rt.advmss = None;
            rt.priority = None;
            rt.table = None;
            rt.scope = None;
        }
    }
    r
}

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let Ok(result) = CniResult::from_value(value) else {
        return;
    };

    for version in ["1.1.0", "1.0.0", "0.4.0"] {
        let json = result.to_json(version);
        let back = CniResult::from_value(json.clone()).unwrap_or_else(|e| {
            panic!("to_json({version}) does not parse back: {e}\nresult: {result:?}\njson: {json}")
        });
        assert_eq!(
            back,
            rendered(&result, version),
            "to_json({version}) round trip\njson: {json}"
        );
        assert_eq!(back.to_json(version), json, "to_json({version}) not stable");
        // What the plugin prints must be serializable text.
        serde_json::to_string(&json).unwrap();
    }
});
