//! Tests that run the real `podnet` binary in real network namespaces: each test
//! builds its own node namespace (where the daemon runs and host-side links live)
//! and sandbox namespaces, drives the plugin with CNI environment variables, and
//! removes everything it made (processes by PID). A test that cannot run here
//! (no root, a missing binary or image) fails, naming what is missing; under
//! `PODNET_ALLOW_SKIPS=1` it is recorded as skipped instead, and `make test` ends
//! with their count and names (`harness::skip`).

mod harness;

mod agent_admission;
mod api_faults;
mod bad_input;
mod bandwidth;
mod bandwidth_bench;
mod bandwidth_k8s;
mod cluster;
mod cnitool;
mod config_check;
mod core_path;
mod crash_safety;
mod crd_versions;
mod crossnode;
mod crossnode_bench;
mod daemon_lifecycle;
mod delegated;
mod duplicates;
mod external_modes;
mod extra_cidrs;
mod helm_chart;
mod install;
mod journal_faults;
mod journal_formats;
mod k8s;
mod k8s_backend;
mod lbipam;
mod leak_check;
mod least_privilege;
mod lint;
mod local_access;
mod migration;
mod multipool;
mod nodeipam;
mod operations;
mod operator;
mod operator_pools;
mod pending_attachment;
mod policy;
mod policy_bench;
mod policy_scale_bench;
mod pool_live;
mod real_node;
mod requested_address;
mod round_trips;
mod scripted;
mod source_check;
mod sticky_address;
