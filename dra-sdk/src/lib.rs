//! dra-sdk: build Kubernetes Dynamic Resource Allocation (DRA) kubelet plugins in Rust.
//!
//! A DRA driver's kubelet plugin publishes the node's devices as ResourceSlices, registers with
//! the kubelet, prepares allocated ResourceClaims when pods start and turns them into CDI specs
//! the container runtime applies. This crate does all of that; a driver implements one small
//! async trait, [`Driver`](driver::Driver), and sees only typed, resolved data.
//!
//! ```no_run
//! use dra_sdk::cdi::ContainerEdits;
//! use dra_sdk::claim::{Claim, DriverError, RecordedClaim};
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
//!             PreparedDevice::new(device, ContainerEdits::new().env("ECHO_DEVICE", &device.device.name))
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
//! - [`claim`]: the claim vocabulary everything builds on: which claim, the claim a driver
//!   prepares, the claim the checkpoint recorded, what can go wrong with one;
//! - [`driver`]: the trait a driver implements, and what it returns;
//! - [`context`]: the runtime handle a driver keeps, the one way to publish devices and report
//!   health and taints; it also stops on shutdown and reads and updates prepared claims;
//! - [`plugin`]: the plugin and its builder: sockets, registration, the DRA gRPC services, the
//!   run loop;
//! - [`config`]: opaque claim configuration, decoded strictly into the driver's types;
//! - [`cdi`]: the container edits a driver returns;
//! - [`slices`]: the device model a driver publishes;
//! - [`attributes`]: typed device attributes and capacities, and the standard ones;
//! - [`health`]: device states for the kubelet's health stream and the slices' taints;
//! - [`device_status`]: per-device status in ResourceClaims (KEP-4817), by server-side apply;
//! - [`k8s`]: Kubernetes quantities, name rules and semantic versions, parsed once;
//! - [`cli`]: the standard kubelet-plugin flags (feature `cli`);
//! - `webhook`: an admission webhook that refuses bad opaque configs at `kubectl apply`
//!   (feature `webhook`);
//! - [`advanced`]: what a driver reaches only through the plugin, for tools and tests that
//!   drive it directly: the checkpoint, the CDI spec writer, the slice publisher, claim
//!   reading, device metadata files, API rate limits, the gRPC bindings and socket helpers.
//!
//! The test kit is the `dra-sdk-testing` crate, the allocator `dra-sdk-allocator`.
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod attributes;
pub mod cdi;
pub mod claim;
#[cfg(feature = "cli")]
pub mod cli;
pub mod config;
pub mod context;
pub mod device_status;
pub mod driver;
pub mod health;
pub mod k8s;
mod metrics;
pub mod plugin;
pub mod slices;
#[cfg(feature = "webhook")]
#[cfg_attr(docsrs, doc(cfg(feature = "webhook")))]
pub mod webhook;

pub mod advanced;
// The generated bindings live in `advanced`; the crate's own code names them `crate::proto`.
pub(crate) use advanced::proto;

// One public path each, in `advanced`; the crate's own code uses the short paths.
pub(crate) use advanced::{DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRAR_DIR};
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
