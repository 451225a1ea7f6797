//! dra-sdk: build Kubernetes Dynamic Resource Allocation (DRA) kubelet plugins in Rust.
//!
//! A DRA driver's kubelet plugin publishes the node's devices as ResourceSlices, registers with
//! the kubelet, prepares allocated ResourceClaims when pods start and turns them into CDI specs
//! the container runtime applies. This crate does all of that; a driver implements one small
//! async trait, [`Driver`](driver::Driver), and sees only typed, resolved data.
//!
//! ```no_run
//! use dra_sdk::cdi::ContainerEdits;
//! use dra_sdk::claim::RecordedClaim;
//! use dra_sdk::claim::{Claim, DriverError};
//! use dra_sdk::driver::{Driver, PreparedClaim, PreparedDevice};
//! use dra_sdk::plugin::KubeletPlugin;
//! use dra_sdk::slices::{Device, DriverResources};
//!
//! struct Echo;
//!
//! #[dra_sdk::async_trait]
//! impl Driver for Echo {
//!     type Config = ();
//!
//!     async fn prepare(&self, claim: &Claim<()>) -> Result<PreparedClaim, DriverError> {
//!         let devices = claim.devices.iter().map(|device| {
//!             PreparedDevice::new(device, ContainerEdits::new().env("ECHO_DEVICE", &device.device))
//!         });
//!         Ok(PreparedClaim::new(devices.collect()))
//!     }
//!
//!     async fn unprepare(&self, _: &RecordedClaim) -> Result<(), DriverError> {
//!         Ok(())
//!     }
//! }
//!
//! # async fn main_() -> Result<(), Box<dyn std::error::Error>> {
//! let client = kube::Client::try_default().await?;
//! let devices = (0..4).map(|i| Device::new(format!("echo-{i}"))).collect();
//! KubeletPlugin::builder(Echo, "echo.example.com", "node-a", client)
//!     .resources(DriverResources::single_pool("node-a", devices))
//!     .start()
//!     .await?
//!     .run_until_signal()
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! Modules, one concept each:
//! - [`driver`]: the trait and the types a driver sees;
//! - [`context`]: the runtime handle a driver keeps: publish devices, report health and
//!   taints, stop on shutdown, read and update prepared claims;
//! - [`plugin`]: sockets, registration, the DRA gRPC services, the run loop;
//! - [`config`]: opaque claim configuration, decoded strictly into the driver's types;
//! - [`checkpoint`]: durable record of prepared claims;
//! - [`cdi`]: CDI spec types, validation and per-claim spec files;
//! - [`slices`]: the device model and the ResourceSlice publisher;
//! - [`health`]: device health for the kubelet's health stream;
//! - [`k8s`]: Kubernetes quantities, name rules and semantic versions, parsed once;
//! - [`device_status`]: per-device status in ResourceClaims (KEP-4817), by server-side apply;
//! - [`metadata`]: device metadata files for containers (KEP-5304, opt-in);
//! - [`cli`]: the standard kubelet-plugin flags (feature `cli`);
//! - [`rate_limit`]: the client-side limits of API requests (`--kube-api-qps`/`--kube-api-burst`
//!   for background work; prepares' claim reads have a budget of their own);
//! - [`advanced`]: the generated gRPC bindings, the `:authority` rewriter and the socket
//!   helpers, for tools that speak the kubelet's protocols themselves.
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod attributes;
pub mod cdi;
pub mod checkpoint;
pub mod claim;
#[cfg(feature = "cli")]
pub mod cli;
pub mod config;
pub mod context;
pub mod device_status;
pub mod driver;
pub mod health;
pub mod k8s;
pub mod metadata;
mod metrics;
pub mod plugin;
pub mod rate_limit;
pub mod slices;

pub mod advanced;
// The generated bindings live in `advanced`; the crate's own code names them `crate::proto`.
pub(crate) use advanced::proto;

/// Default kubelet plugin registry directory.
pub const DEFAULT_REGISTRAR_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// Default kubelet plugins directory (the plugin's sockets and data go to `<dir>/<driver>`).
pub const DEFAULT_PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";
// One public path for it: `cdi::DEFAULT_CDI_ROOT`, next to the spec writer.
pub(crate) use cdi::DEFAULT_CDI_ROOT;

/// The README's examples, compiled as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

// Versions of the crates in the public API, so drivers can use exactly these.
pub use k8s_openapi;
pub use kube;
pub use prometheus_client;
pub use tonic;

/// The attribute that implements [`Driver`](driver::Driver)'s async methods:
/// `#[dra_sdk::async_trait]` on the `impl`, with no dependency on `async-trait` of the
/// driver's own.
pub use async_trait::async_trait;

/// Derive macros, documented in their traits' modules.
pub use dra_sdk_derive::{DeviceAttributes, OpaqueConfig};
