//! The kubelet plugin at run time: registration, prepare and unprepare, health, device status,
//! metadata, restarts and rolling updates, cancellation, the CLI client, observability; and the
//! admission webhook. One test binary with a module per subject rather than ten binaries: each
//! binary links the SDK's whole dependency tree again, which was most of this crate's test
//! build in CI.

mod api_faults;
mod cancellation;
mod claim_input;
mod cli_client;
mod context;
#[cfg(feature = "fault-injection")]
mod crash_steps;
mod device_status;
mod disk_faults;
mod events;
mod file_modes;
mod health_source;
mod kubelet_faults;
mod metadata;
mod observability;
mod plugin;
mod restarts;
mod rolling_update;
mod secrets;
mod skip_node_operations;
mod soak;
#[cfg(feature = "webhook")]
mod webhook;
