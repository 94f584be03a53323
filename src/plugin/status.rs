//! STATUS: ready (exit 0) when the daemon answers and every node range has room;
//! 50 when the daemon is unreachable or failing, or its configuration does not fit
//! the node (it hands out no address: the runtime keeps the node's network not
//! ready, as for a node without a range); 51 when a range is exhausted, unless
//! the daemon's backend is Kubernetes. There a failed STATUS turns the Node
//! `Ready=False` (containerd 2 asks every 5 s), the node lifecycle controller
//! taints it `not-ready:NoExecute`, and after the pods' default 300 s toleration
//! every pod on the node is evicted: a full node would empty itself. The agent
//! says it with its own `podnet.io/addresses-exhausted:NoSchedule` taint
//! instead (docs/runtimes.md), and STATUS answers ready.

use crate::api::client::Client;
use crate::api::exhaustion::exhaustion;
use crate::api::models::StatusResponse;
use crate::cni::CniError;

pub fn status(client: &Client) -> Result<(), CniError> {
    let st = client
        .healthz_brief()
        .map_err(|e| CniError::plugin_not_available(format!("podnet is not available: {e}")))?;
    verdict(&st)
}

/// STATUS's answer for what the daemon reports.
fn verdict(st: &StatusResponse) -> Result<(), CniError> {
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
    match exhaustion(st) {
        Some(message) if !node_carries_exhaustion(st) => {
            Err(CniError::limited_connectivity(message))
        }
        _ => Ok(()),
    }
}

/// Whether the agent's Node says the node is exhausted (its taint): the
/// Kubernetes backend.
fn node_carries_exhaustion(st: &StatusResponse) -> bool {
    st.ipam
        .backend
        .as_ref()
        .is_some_and(|b| b.kind == "kubernetes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::models::{BackendStatus, ConfigCheckStatus, RangeStatus};

    fn daemon(backend: &str, used: u64) -> StatusResponse {
        let mut st = StatusResponse::default();
        st.ipam.mode = "cluster-pool".into();
        st.ipam.node_name = "node-1".into();
        st.ipam.ranges = vec![RangeStatus {
            family: "ipv4".into(),
            cidr: "10.0.1.0/24".into(),
            used,
            usable: 254,
            ..RangeStatus::default()
        }];
        st.ipam.backend = Some(BackendStatus {
            kind: backend.into(),
            ..BackendStatus::default()
        });
        st
    }

    fn code(answer: Result<(), CniError>) -> Option<u32> {
        answer.err().map(|e| e.code)
    }

    #[test]
    fn a_range_with_room_is_ready_under_every_backend() {
        for backend in ["embedded", "file", "kubernetes"] {
            assert_eq!(code(verdict(&daemon(backend, 253))), None, "{backend}");
        }
    }

    #[test]
    fn an_exhausted_range_is_51_unless_the_kubernetes_node_carries_it() {
        for backend in ["embedded", "file"] {
            let err = verdict(&daemon(backend, 254)).expect_err(backend);
            assert_eq!(err.code, 51, "{backend}");
            assert!(
                err.msg.contains("10.0.1.0/24 of node node-1 is exhausted"),
                "{}",
                err.msg
            );
        }
        assert_eq!(code(verdict(&daemon("kubernetes", 254))), None);
    }

    #[test]
    fn no_range_a_failure_or_a_config_that_does_not_fit_is_50_under_every_backend() {
        for backend in ["embedded", "kubernetes"] {
            let mut none = daemon(backend, 0);
            none.ipam.ranges.clear();
            assert_eq!(code(verdict(&none)), Some(50), "{backend}");
            let mut failing = daemon(backend, 0);
            failing.cilium.state = "Failure".into();
            assert_eq!(code(verdict(&failing)), Some(50), "{backend}");
            let mut unfit = daemon(backend, 0);
            unfit.ipam.config_check = Some(ConfigCheckStatus::default());
            assert_eq!(code(verdict(&unfit)), Some(50), "{backend}");
        }
    }
}
