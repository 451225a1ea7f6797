//! The kubelet plugin: sockets, registration, the DRA gRPC services and the run loop.

pub mod authority;
pub mod registration;
pub mod socket;
