//! The IPAM and endpoint requests between the wire and the state: the bodies of
//! `PUT` and `DELETE /v1/endpoint`, `POST /v1/cni/report` and `POST /v1/cni/gc`
//! as the state's requests (checked by `api::validate` before), and the state's
//! [`Allocated`] and [`Collected`] as Cilium's `IPAMResponse` and podnet's GC
//! answer.

use super::status::{configuration_status, node_addressing};
use crate::api::models::{
    CniReport, EndpointBatchDeleteRequest, EndpointChangeRequest, GcRequest, GcResponse,
    IpamAddressResponse, IpamResponse,
};
use crate::daemon::state::{
    Allocated, AllocatedAddress, Collected, EndpointRegistration, EndpointRelease, GcScope,
    TeardownLink, WiredAttachment,
};

/// The attachment a `PUT /v1/endpoint/{id}` body registers.
pub fn endpoint_registration(req: &EndpointChangeRequest) -> EndpointRegistration {
    EndpointRegistration {
        container_id: req.container_id.clone(),
        ifname: req.container_interface_name.clone(),
        pod_namespace: req.k8s_namespace.clone(),
        pod_name: req.k8s_pod_name.clone(),
        ipv4: req.addressing.ipv4.clone(),
        ipv4_expiration_uuid: req.addressing.ipv4_expiration_uuid.clone(),
        ipv6: req.addressing.ipv6.clone(),
        ipv6_expiration_uuid: req.addressing.ipv6_expiration_uuid.clone(),
        host_ifname: req.interface_name.clone(),
        netns: req.container_netns_path.clone(),
        external_ipam: req.datapath_configuration.external_ipam,
    }
}

/// The attachments a `DELETE /v1/endpoint` body (or a queued DEL) deletes.
pub fn endpoint_release(req: &EndpointBatchDeleteRequest) -> EndpointRelease {
    EndpointRelease {
        container_id: req.container_id.clone(),
        ifname: req.container_interface_name.clone(),
        teardown_links: req
            .teardown_links
            .iter()
            .map(|l| TeardownLink {
                name: l.name.clone(),
                index: l.index,
            })
            .collect(),
    }
}

/// The wired attachment a `POST /v1/cni/report` names.
pub fn wired_attachment(report: &CniReport) -> WiredAttachment {
    WiredAttachment {
        container_id: report.container_id.clone(),
        ifname: report.ifname.clone(),
        owner: report.owner.clone(),
        expiration_uuids: report.wired_expiration_uuids.clone(),
    }
}

/// What a `POST /v1/cni/gc` body collects.
pub fn gc_scope(req: &GcRequest) -> GcScope {
    GcScope {
        network: req.network.clone(),
        valid_attachments: req
            .valid_attachments
            .iter()
            .map(|a| (a.container_id.clone(), a.ifname.clone()))
            .collect(),
    }
}

/// The answer of `POST /v1/ipam` and `POST /v1/ipam/{ip}`: each address (in
/// `address` and its family's element), the node's addressing and, for the
/// plugin's allocation, the commit's journal mark, whether its endpoint is
/// pending, and the configuration.
pub fn ipam_response(allocated: Allocated) -> IpamResponse {
    let mut resp = IpamResponse {
        host_addressing: node_addressing(&allocated.config.addressing),
        ..Default::default()
    };
    if let Some(commit) = &allocated.commit {
        resp.journal_mark = commit.journal_mark.encode();
        resp.endpoint_pending = commit.endpoint_pending;
    }
    for address in &allocated.addresses {
        add_address(&mut resp, address);
    }
    if allocated.commit.is_some() {
        resp.podnet_config = Some(configuration_status(allocated.config));
    }
    resp
}

/// Fills `address` into `resp`: the plain address and pool, and its family's
/// element (with its ENI's gateway, VPC CIDRs, MAC and interface number in eni).
fn add_address(resp: &mut IpamResponse, address: &AllocatedAddress) {
    let ip = address.ip.to_string();
    let mut el = IpamAddressResponse {
        ip: ip.clone(),
        expiration_uuid: address.expiration_uuid.clone().unwrap_or_default(),
        pool: address.pool.clone(),
        skip_masquerade: address.skip_masquerade,
        ..Default::default()
    };
    if let Some(eni) = &address.eni {
        el.gateway = eni.gateway.map(|g| g.to_string()).unwrap_or_default();
        el.cidrs = Some(eni.vpc_cidrs.iter().map(|c| c.to_string()).collect());
        el.master_mac = eni.mac.clone();
        el.interface_number = eni.interface_number.to_string();
    }
    if address.ip.is_ipv4() {
        resp.address.ipv4 = ip;
        resp.address.ipv4_pool_name = address.pool.clone();
        resp.ipv4 = Some(el);
    } else {
        resp.address.ipv6 = ip;
        resp.address.ipv6_pool_name = address.pool.clone();
        resp.ipv6 = Some(el);
    }
}

/// The answer of `POST /v1/cni/gc`: each address released, as `ip (owner)`.
pub fn gc_response(collected: &Collected) -> GcResponse {
    GcResponse {
        released: collected
            .released
            .iter()
            .map(|(ip, owner)| format!("{ip} ({owner})"))
            .collect(),
    }
}
