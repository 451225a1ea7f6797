//! Test doubles for driver authors: a fake API server, a kubelet simulator, claim builders, an
//! allocator that does what the scheduler does, and an embedded test cluster that ties them
//! together; [`e2e`], a harness that runs real Kubernetes components (API server,
//! scheduler, controller manager, kubelet) for end-to-end tests; and [`cri`], the container
//! runtime double those kubelets run on, checked against a real kubelet's recorded CRI
//! conversation.
//!
//! Everything here talks over real sockets: the fake API server serves HTTP on loopback and the
//! kubelet simulator dials the plugin's Unix sockets, so a driver tested with them is tested
//! the way a cluster will use it.

pub mod allocator;
pub mod apiserver;
mod cdi_check;
pub mod claims;
pub mod cluster;
pub mod conformance;
pub mod cri;
pub mod e2e;
pub mod kubelet;
pub mod recordings;
