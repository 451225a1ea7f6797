//! Fault injection for the plugin's own resources: the disk under its directories, the process
//! itself (killed at a chosen step), and the leak probes (file descriptors, tokio tasks, resident
//! memory) that show a fault left nothing behind. API server faults are in
//! [`apiserver::Faults`](crate::apiserver::Faults); kubelet-side misbehaviour is driven through
//! [`kubelet`](crate::kubelet).

pub mod disk;
pub mod leaks;
pub mod process;
