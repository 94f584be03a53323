//! Whether the configuration fits the node (`daemon::node_check`): the facts the
//! backend told, the verdict on them, and the condition last handed to the node
//! sink. While the verdict has an error the state refuses every allocation
//! (`POST /v1/ipam`, `POST /v1/ipam/{ip}`) with it; releases, endpoints and GC go
//! on. A backend that tells no facts (embedded, a CiliumNode file) is not judged.

use std::net::IpAddr;

use super::{ApiError, ErrorKind, IpamState};
use crate::daemon::node_check::{Verdict, judge};
use crate::ipam::failure_reason::FailureReason;
use crate::node::{ConfigFit, NodeFacts};

/// The facts, their verdict and what the sink was last handed.
#[derive(Debug, Default)]
pub(super) struct Fit {
    facts: Option<NodeFacts>,
    verdict: Verdict,
    sent: Option<ConfigFit>,
}

impl IpamState {
    /// Judges the configuration on the node's `facts`; the new verdict when it
    /// differs from the last one (the caller says it in the log).
    pub fn set_node_facts(&mut self, facts: NodeFacts) -> Option<Verdict> {
        let verdict = judge(
            &self.cfg.families,
            self.cfg.ipam_mode,
            self.cfg.tunnel_underlay,
            &self.cfg.pool_findings,
            &self.cfg.node_name,
            &facts,
        );
        let first = self.fit.facts.is_none();
        self.fit.facts = Some(facts);
        if !first && verdict == self.fit.verdict {
            return None;
        }
        self.fit.verdict = verdict.clone();
        Some(verdict)
    }

    /// The InternalIPs the node's Node lists (empty until the backend told them).
    pub fn internal_ips(&self) -> Vec<IpAddr> {
        self.fit
            .facts
            .as_ref()
            .map(|f| f.internal_ips.clone())
            .unwrap_or_default()
    }

    /// The node hands out addresses (no error in the verdict, or no facts).
    pub fn fits(&self) -> bool {
        self.fit.verdict.fits()
    }

    /// Why an allocation is refused, while the verdict has an error: 502 (the
    /// node's IPAM cannot give an address, as Cilium answers) with the reason
    /// `node-config`, which the plugin turns into its own CNI code.
    pub(super) fn fit_refusal(&self) -> Option<ApiError> {
        self.fit.verdict.refusal().map(|message| {
            ApiError::because(FailureReason::NodeConfig, ErrorKind::NoAddress, message)
        })
    }

    /// The verdict as the node resource's condition, when it changed since the
    /// last call (the first verdict always: it replaces a previous run's).
    pub(super) fn take_config_fit(&mut self) -> Option<ConfigFit> {
        self.fit.facts.as_ref()?;
        let condition = self.fit.verdict.condition();
        if self.fit.sent.as_ref() == Some(&condition) {
            return None;
        }
        self.fit.sent = Some(condition.clone());
        Some(condition)
    }

    /// The verdict and the facts it was made on, for status (None: not judged).
    pub fn config_check(&self) -> Option<(&Verdict, &NodeFacts)> {
        Some((&self.fit.verdict, self.fit.facts.as_ref()?))
    }
}
