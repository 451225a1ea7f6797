//! The kubelet plugin at run time: registration, prepare and unprepare, health, device status,
//! metadata, restarts and rolling updates, cancellation, the CLI client, observability; and the
//! admission webhook. One test binary with a module per subject rather than ten binaries: each
//! binary links the SDK's whole dependency tree again, which was most of this crate's test
//! build in CI.

mod cancellation;
mod cli_client;
mod context;
mod device_status;
mod events;
mod health_source;
mod metadata;
mod observability;
mod plugin;
mod restarts;
mod rolling_update;
mod skip_node_operations;
#[cfg(feature = "webhook")]
mod webhook;
