//! GC: releases this network's allocations whose attachment is not in
//! `cni.dev/valid-attachments`. Without the key (as `cnitool gc` sends) nothing is
//! released, and stderr says so: releasing everything on a missing key would
//! strand every running pod.

use crate::api::client::Client;
use crate::api::models::{AttachmentRef, GcRequest};
use crate::cni::{CniError, NetConf};

use super::daemon_errors::to_cni;

pub fn gc(conf: &NetConf, client: &Client) -> Result<(), CniError> {
    let Some(valid) = &conf.valid_attachments else {
        eprintln!(
            "podnet GC: the request has no cni.dev/valid-attachments list; releasing nothing for network {:?}",
            conf.name
        );
        return Ok(());
    };
    let req = GcRequest {
        network: conf.name.clone(),
        valid_attachments: valid
            .iter()
            .map(|a| AttachmentRef {
                container_id: a.container_id.clone(),
                ifname: a.ifname.clone(),
            })
            .collect(),
    };
    let resp = client
        .gc(&req)
        .map_err(|e| to_cni(e, "garbage-collecting stale attachments"))?;
    for r in &resp.released {
        eprintln!("podnet GC: released {r}");
    }
    Ok(())
}
