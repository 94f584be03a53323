//! The addresses, in one round trip to the daemon (the request built from the
//! CNI environment), with the daemon's configuration; in delegated-plugin mode
//! from the network config's IPAM plugin instead, shaped like the daemon's answer.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::api::client::{AllocateParams, Client, ClientError};
use crate::api::models::{
    DaemonConfigurationStatus, FailureReason, IpamAddressResponse, IpamResponse,
};
use crate::cni::{CniEnv, CniError, Command, NetConf};

use super::super::daemon_errors::{ALLOCATE_CONTEXT, to_cni};
use super::super::delegate;

/// The addresses, in one round trip: the daemon hands them out with
/// `expiration: true` (they go back by themselves unless the endpoint is
/// registered in time) and its configuration in `podnet-config`. In
/// delegated-plugin mode the daemon refuses (reason `delegated-plugin`) with its
/// configuration, and the config's IPAM plugin hands them out; true then.
pub(super) fn allocate(
    env: &CniEnv,
    conf: &NetConf,
    client: &Client,
    cid: &str,
    ifname: &str,
) -> Result<(IpamResponse, bool), CniError> {
    let answer = client.allocate(&AllocateParams {
        owner: &env.args.owner(cid),
        expiration: true,
        container_id: cid,
        ifname,
        network: &conf.name,
        netns: &env
            .netns
            .as_ref()
            .map(|n| n.display().to_string())
            .unwrap_or_default(),
        pod_uid: env.args.pod_uid.as_deref().unwrap_or_default(),
        ..Default::default()
    });
    match answer {
        Ok(resp) => Ok((resp, false)),
        Err(ClientError::Status {
            reason: Some(FailureReason::DelegatedPlugin),
            config,
            ..
        }) => {
            let daemon_cfg = daemon_config(client, config.map(|c| *c))?;
            Ok((delegated_allocation(env, conf, daemon_cfg)?, true))
        }
        Err(e) => Err(to_cni(e, ALLOCATE_CONTEXT)),
    }
}

/// The configuration the daemon sent with its answer; a daemon that sends none
/// (a podnet older than `podnet-config`) is asked for it with `GET /v1/config`.
pub(super) fn daemon_config(
    client: &Client,
    sent: Option<DaemonConfigurationStatus>,
) -> Result<DaemonConfigurationStatus, CniError> {
    match sent {
        Some(cfg) => Ok(cfg),
        None => client
            .config()
            .map(|c| c.status)
            .map_err(|e| to_cni(e, "reading the daemon's configuration")),
    }
}

/// delegated-plugin mode: the config's IPAM plugin hands out the addresses; the
/// answer is shaped like the daemon's (Cilium keeps the prefix in `address`), with
/// the daemon's router addresses and its configuration.
fn delegated_allocation(
    env: &CniEnv,
    conf: &NetConf,
    daemon_cfg: DaemonConfigurationStatus,
) -> Result<IpamResponse, CniError> {
    if delegate::ipam_type(conf).is_none() {
        return Err(CniError::invalid_network_config(
            "the daemon runs ipam=delegated-plugin: the network config needs ipam.type naming the IPAM plugin (e.g. host-local)",
        ));
    }
    let result = delegate::run_configured(Command::Add, env, conf)?.ok_or_else(|| {
        CniError::invalid_network_config("the delegated IPAM plugin returned no result")
    })?;
    let (v4, v6) = delegate::ipam_addresses(&result);
    let mut resp = IpamResponse {
        host_addressing: daemon_cfg.addressing.clone(),
        podnet_config: Some(daemon_cfg),
        ..Default::default()
    };
    let address = |net: &IpNet, gw: Option<IpAddr>| IpamAddressResponse {
        ip: net.addr().to_string(),
        gateway: gw.map(|g| g.to_string()).unwrap_or_default(),
        interface_number: "0".into(),
        ..Default::default()
    };
    if let Some((_, net, gw)) = v4 {
        resp.address.ipv4 = net.to_string();
        resp.ipv4 = Some(address(&net, gw));
    }
    if let Some((_, net, gw)) = v6 {
        resp.address.ipv6 = net.to_string();
        resp.ipv6 = Some(address(&net, gw));
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_dir::TestDir;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixListener;
    use std::time::Duration;

    #[test]
    fn the_configuration_comes_with_the_answer_else_from_get_config() {
        let dir = TestDir::new("addcfg");
        let sock = dir.join("d.sock");
        let client = Client::new(&sock, Duration::from_secs(5));
        // Sent along with the answer: no request (nothing even listens yet).
        let sent = DaemonConfigurationStatus {
            ipam_mode: "kubernetes".into(),
            ..Default::default()
        };
        assert_eq!(daemon_config(&client, Some(sent.clone())).unwrap(), sent);
        // Not sent (a daemon older than podnet-config): GET /v1/config.
        let listener = UnixListener::bind(&sock).unwrap();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut buf = [0u8; 4096];
            let n = conn.read(&mut buf).unwrap();
            let body = r#"{"status":{"ipam-mode":"cluster-pool","deviceMTU":1400}}"#;
            write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            String::from_utf8_lossy(&buf[..n]).to_string()
        });
        let cfg = daemon_config(&client, None).unwrap();
        assert_eq!(
            (cfg.ipam_mode.as_str(), cfg.device_mtu),
            ("cluster-pool", 1400)
        );
        assert!(server.join().unwrap().starts_with("GET /v1/config "));
    }
}
