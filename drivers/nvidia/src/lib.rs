//! The NVIDIA GPU DRA driver, built on [`dra_sdk`]: full GPUs, static MIG devices, dynamic MIG
//! partitions ([`backend::mig`], gate `DynamicMIG`) and VFIO passthrough, GPU sharing (time-slicing, MPS,
//! consumable shares), discovered through NVML (feature `nvml`) or a mock backend described by a
//! hardware profile, so that everything runs on machines without a GPU.
#![deny(missing_docs)]

pub mod backend;
pub mod cdi;
pub mod config;
#[cfg(feature = "demo")]
pub mod demo;
pub mod devices;
pub mod driver;
pub mod health;
pub mod host;
pub mod plugin;
pub mod sharing;
