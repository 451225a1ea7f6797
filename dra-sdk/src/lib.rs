//! dra-sdk: build Kubernetes Dynamic Resource Allocation (DRA) kubelet plugins in Rust.
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod attributes;
pub mod cdi;
pub mod checkpoint;
pub mod config;
pub mod plugin;
pub mod proto;
pub mod slices;
#[cfg(feature = "testing")]
pub mod testing;

pub use dra_sdk_derive::{DeviceAttributes, OpaqueConfig};
