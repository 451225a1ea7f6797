//! The test kit of [`dra_sdk`]: everything a driver author needs to test a DRA driver from
//! `cargo test`, without a cluster.
//!
//! - [`apiserver`]: a fake API server (HTTP on loopback, watches, server-side apply, the
//!   admission checks of a real one, fault injection);
//! - [`kubelet`]: a kubelet simulator that registers a plugin and calls its DRA gRPC services
//!   over the plugin's Unix sockets, as the kubelet does;
//! - [`claims`] and [`cluster`]: claim builders and an embedded test cluster that ties the
//!   fake API server, the kubelet simulator and the allocator ([`dra_sdk_allocator`])
//!   together;
//! - [`conformance`]: the conformance suite every driver runs (think csi-sanity);
//! - [`e2e`]: a harness that runs real Kubernetes components (API server, scheduler, controller
//!   manager, kubelet) a user brings, and [`cri`], the container runtime double those kubelets
//!   run on, checked against a real kubelet's recorded CRI conversation ([`recordings`]);
//! - [`sample_driver`]: a small GPU driver the SDK's own tests, benches and tools share;
//! - [`demo`]: the runner of a driver's end-to-end demo (embedded cluster or a real one);
//! - [`bench`](mod@bench): latency percentiles and the timed loops the benches share;
//! - [`deliverables`]: checks of what a driver repository ships (Helm charts, Dockerfiles,
//!   resident memory of the plugin process);
//! - [`admission`]: admission webhooks under HTTPS: test certificates, a client, and
//!   AdmissionReviews in the API server's shape.
//!
//! Everything here talks over real sockets, so a driver tested with it is tested the way a
//! cluster will use it.
//!
//! ```no_run
//! use dra_sdk_testing::cluster::TestCluster;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let cluster = TestCluster::start().await?;
//! println!("fake API server at {}", cluster.api().url());
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod assertions;
pub use assertions::assert_contains;

pub mod admission;
pub mod apiserver;
pub mod bench;
mod cdi_check;
pub mod claims;
pub mod cluster;
pub mod conformance;
pub mod cri;
pub mod deliverables;
pub mod demo;
pub mod e2e;
pub mod faults;
pub mod kubelet;
pub mod recordings;
pub mod sample_driver;
