//! STATUS: ready (exit 0) when the daemon answers and every node range has room;
//! 50 when the daemon is unreachable or failing, or its configuration does not fit
//! the node (it hands out no address: the runtime keeps the node's network not
//! ready, as for a node without a range); 51 when a range is exhausted.

use crate::api::client::Client;
use crate::cni::CniError;

pub fn status(client: &Client) -> Result<(), CniError> {
    let st = client
        .healthz_brief()
        .map_err(|e| CniError::plugin_not_available(format!("podnet is not available: {e}")))?;
    if let Some(check) = st.ipam.config_check.as_ref().filter(|c| !c.fits) {
        let errors: Vec<String> = check
            .findings
            .iter()
            .filter(|f| f.severity == "error")
            .map(|f| f.message.clone())
            .collect();
        return Err(CniError::plugin_not_available(format!(
            "podnet's configuration does not fit this node, it hands out no address: {}",
            errors.join("; ")
        )));
    }
    if st.cilium.state == "Failure" {
        return Err(CniError::plugin_not_available(format!(
            "podnet daemon reports failure: {}",
            st.cilium.msg
        )));
    }
    if st.ipam.ranges.is_empty() {
        return Err(CniError::plugin_not_available(
            "podnet daemon has no address range for this node yet",
        ));
    }
    let full: Vec<String> = st
        .ipam
        .ranges
        .iter()
        .filter(|r| r.is_exhausted())
        .map(|r| {
            format!(
                "{} range {} of node {} is exhausted ({}/{} addresses in use)",
                r.family, r.cidr, st.ipam.node_name, r.used, r.usable
            )
        })
        .collect();
    if !full.is_empty() {
        return Err(CniError::limited_connectivity(format!(
            "{}: new pods on this node cannot get an address until pods are deleted (or give nodes a larger range: cluster-pool-ipv4-mask-size)",
            full.join("; ")
        )));
    }
    Ok(())
}
