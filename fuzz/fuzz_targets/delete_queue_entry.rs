//! `podnet::api::delete_queue::read_entry` on arbitrary file contents (a DEL
//! queue file the daemon replays at start; it may be corrupt after a crash): it
//! returns exactly the entries that parse and that the API would accept.

#![no_main]

use libfuzzer_sys::fuzz_target;
use podnet::api::delete_queue::read_entry;
use podnet::api::models::EndpointBatchDeleteRequest;
use podnet::api::validate::endpoint_delete;
use std::path::PathBuf;
use std::sync::OnceLock;

fn entry_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        // fuzz/run.sh sets PODNET_FUZZ_TMP to a directory it removes afterwards.
        let base = if let Some(d) = std::env::var_os("PODNET_FUZZ_TMP") {
            PathBuf::from(d)
        } else if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("podnet-fuzz-dq-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("0123456789abcdef.delete")
    })
}

fuzz_target!(|data: &[u8]| {
    let path = entry_path();
    std::fs::write(path, data).unwrap();
    let direct = serde_json::from_slice::<EndpointBatchDeleteRequest>(data).ok();
    match read_entry(path) {
        Ok(req) => {
            assert!(endpoint_delete(&req).is_ok(), "{req:?}");
            assert_eq!(direct.as_ref(), Some(&req));
        }
        Err(msg) => {
            assert!(msg.contains(&*path.to_string_lossy()), "{msg}");
            if let Some(d) = direct {
                // It parsed, so the API would refuse the attachment it names.
                assert!(endpoint_delete(&d).is_err(), "{msg}");
            }
        }
    }
});
