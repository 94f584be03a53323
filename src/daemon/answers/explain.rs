//! `GET /v1/explain`'s answer as the state gives it: the matching addresses,
//! the recent failures and the summary (the routes add the source check's,
//! the leak check's and NetworkPolicy's parts).

use crate::api::models::{AddressExplanation, ExplainResponse, FailureRecord};
use crate::daemon::state::{ExplainedAddress, Explanation, Failure};
use crate::store::AllocationState;

/// The answer to `query`, without the parts other loops add.
pub fn explain_response(query: &str, explanation: Explanation) -> ExplainResponse {
    ExplainResponse {
        query: query.into(),
        addresses: explanation.addresses.into_iter().map(address).collect(),
        failures: explanation.failures.into_iter().map(failure).collect(),
        summary: explanation.summary,
        spoofed_traffic: Vec::new(),
        leaks: Vec::new(),
        policy: Vec::new(),
        l2: None,
    }
}

fn address(a: ExplainedAddress) -> AddressExplanation {
    AddressExplanation {
        ip: a.ip.to_string(),
        pool: a.pool,
        owner: a.owner,
        state: state_word(a.state).into(),
        container_id: a.container_id,
        ifname: a.ifname,
        network: a.network,
        rule: a.rule,
        range: a.range,
        allocated_at_ms: a.allocated_at_ms,
        until_ms: a.until_ms,
        restored: a.restored,
        host_link: a.host_link,
    }
}

/// The word explain uses for where an address is in its life.
fn state_word(state: AllocationState) -> &'static str {
    match state {
        AllocationState::Pending => "pending",
        AllocationState::Bound => "bound",
        AllocationState::Infra => "infra",
        AllocationState::Cooling => "cooling",
    }
}

fn failure(f: Failure) -> FailureRecord {
    FailureRecord {
        at_ms: f.at_ms,
        verb: f.verb,
        owner: f.owner,
        container_id: f.container_id,
        ifname: f.ifname,
        reason: f.reason,
        message: f.message,
        hint: f.hint.into(),
    }
}
