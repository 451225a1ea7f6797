//! Test doubles for driver authors: a fake API server, a kubelet simulator, claim builders, an
//! allocator that does what the scheduler does, and an embedded test cluster that ties them
//! together.
//!
//! Everything here talks over real sockets: the fake API server serves HTTP on loopback and the
//! kubelet simulator dials the plugin's Unix sockets, so a driver tested with them is tested
//! the way a cluster will use it.

pub mod allocator;
pub mod apiserver;
pub mod claims;
pub mod cluster;
pub mod conformance;
pub mod kubelet;
