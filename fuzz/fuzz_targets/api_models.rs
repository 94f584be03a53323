//! serde_json parsing of the daemon API models (request bodies the daemon reads,
//! response bodies the plugin and CLI read), and their serialize/parse round trip.

#![no_main]

use libfuzzer_sys::fuzz_target;
use podnet::api::models::{
    DaemonConfiguration, EndpointBatchDeleteRequest, EndpointChangeRequest, EndpointView,
    GcRequest, GcResponse, IpamResponse, StatusResponse,
};
use serde::{Serialize, de::DeserializeOwned};
use std::fmt::Debug;

fn check<T: Serialize + DeserializeOwned + PartialEq + Debug>(data: &[u8]) {
    let Ok(v) = serde_json::from_slice::<T>(data) else {
        return;
    };
    let bytes = serde_json::to_vec(&v).expect("serialize");
    let back: T = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "{} does not parse back: {e}\n{}",
            std::any::type_name::<T>(),
            String::from_utf8_lossy(&bytes)
        )
    });
    assert_eq!(back, v, "{}", String::from_utf8_lossy(&bytes));
}

fuzz_target!(|data: &[u8]| {
    check::<EndpointChangeRequest>(data);
    check::<EndpointBatchDeleteRequest>(data);
    check::<GcRequest>(data);
    check::<IpamResponse>(data);
    check::<StatusResponse>(data);
    check::<DaemonConfiguration>(data);
    check::<EndpointView>(data);
    check::<GcResponse>(data);
});
