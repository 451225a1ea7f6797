//! Checks of what a driver repository ships, shared by the drivers of this workspace: its Helm
//! chart ([`chart`], and on a real API server [`chart_cluster`]), its plugin image's Dockerfile
//! ([`dockerfile`]) and the resident memory of its plugin process ([`memory`]).
//!
//! They panic with a message on a missing tool or document: a test setup error, not data.

pub mod chart;
pub mod chart_cluster;
pub mod dockerfile;
pub mod memory;
