//! Device health: what a driver reports, and what the kubelet's health stream carries.
//!
//! There is one way to report it: a driver whose
//! [`reports_health`](crate::driver::Driver::reports_health) is `true` sets a [`DeviceState`]
//! per device with [`DriverContext::set_device_state`](crate::context::DriverContext::set_device_state)
//! whenever its view changes. One call updates the kubelet's `NodeWatchResources` stream (the
//! full device list on every change, re-sent often enough that the kubelet never marks a
//! device stale) and the taints the device carries in the published ResourceSlices.

use std::time::Duration;

use tokio::sync::watch;

use crate::claim::DeviceRef;
use crate::slices::DeviceTaint;

/// Everything the driver knows about one device's condition: its health for the kubelet's
/// health stream, and the taints the device carries in the published ResourceSlices while it
/// is in this state.
///
/// Set with [`DriverContext::set_device_state`](crate::context::DriverContext::set_device_state).
/// Taints are driver-chosen (key, value, effect); a later state without taints, typically
/// [`DeviceState::healthy`], removes them.
///
/// ```
/// use dra_sdk::health::{DeviceState, HealthStatus};
/// use dra_sdk::slices::{DeviceTaint, TaintEffect};
///
/// let failed = DeviceState::unhealthy("node-a", "gpu-3", "XID 79: GPU has fallen off the bus")
///     .with_taint(DeviceTaint::new("gpu.example.com/xid", TaintEffect::NoExecute).value("79"));
/// assert_eq!(failed.status, HealthStatus::Unhealthy);
/// assert_eq!(failed.taints.len(), 1);
///
/// let recovered = DeviceState::healthy("node-a", "gpu-3");
/// assert!(recovered.taints.is_empty());
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct DeviceState {
    /// The device.
    pub device: DeviceRef,
    /// Health as the kubelet's health stream reports it.
    pub status: HealthStatus,
    /// Human-readable detail for the pod's status (kubelet 1.36+; at most 1024 characters are
    /// sent).
    pub message: String,
    /// How long the kubelet may go without an update before it considers the device's health
    /// unknown (kubelet 1.35+). `None` keeps the kubelet's default of 30 s.
    pub timeout: Option<Duration>,
    /// Taints added to the device's published entry while it is in this state, on top of the
    /// taints the driver publishes with the device itself.
    pub taints: Vec<DeviceTaint>,
}

impl DeviceState {
    /// A state with this health status, no message and no taints.
    pub fn new(pool: impl Into<String>, device: impl Into<String>, status: HealthStatus) -> Self {
        Self {
            device: DeviceRef::new(pool, device),
            status,
            message: String::new(),
            timeout: None,
            taints: Vec::new(),
        }
    }

    /// A healthy device: no taints.
    pub fn healthy(pool: impl Into<String>, device: impl Into<String>) -> Self {
        Self::new(pool, device, HealthStatus::Healthy)
    }

    /// An unhealthy device, with a message for the pod's status. Add the taint it should carry
    /// with [`with_taint`](Self::with_taint).
    pub fn unhealthy(
        pool: impl Into<String>,
        device: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self::new(pool, device, HealthStatus::Unhealthy).with_message(message)
    }

    /// A device whose health is not known.
    pub fn unknown(pool: impl Into<String>, device: impl Into<String>) -> Self {
        Self::new(pool, device, HealthStatus::Unknown)
    }

    /// Sets the message for the pod's status.
    pub fn with_message(mut self, message: impl Into<String>) -> Self {
        self.message = message.into();
        self
    }

    /// Adds a taint the device carries in its ResourceSlice while in this state.
    pub fn with_taint(mut self, taint: DeviceTaint) -> Self {
        self.taints.push(taint);
        self
    }

    /// Sets how long the kubelet may go without news before it considers the health unknown.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

/// Health status of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HealthStatus {
    /// Not known.
    Unknown,
    /// Working.
    Healthy,
    /// Not working.
    Unhealthy,
}

/// The context's handle to publish device health.
#[derive(Clone, Debug)]
pub(crate) struct HealthReporter {
    sender: watch::Sender<Vec<DeviceState>>,
}

impl HealthReporter {
    /// A reporter and the source the plugin reads from. Starts with no devices.
    pub(crate) fn new() -> (HealthReporter, HealthSource) {
        let (sender, receiver) = watch::channel(Vec::new());
        (HealthReporter { sender }, HealthSource { receiver })
    }

    /// Replaces the full device list.
    pub(crate) fn set(&self, devices: Vec<DeviceState>) {
        self.sender.send_replace(devices);
    }
}

/// The plugin's side of a [`HealthReporter`].
#[derive(Clone, Debug)]
pub(crate) struct HealthSource {
    receiver: watch::Receiver<Vec<DeviceState>>,
}

impl HealthSource {
    /// The current full device list.
    #[cfg(test)]
    pub(crate) fn current(&self) -> Vec<DeviceState> {
        self.receiver.borrow().clone()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<Vec<DeviceState>> {
        self.receiver.clone()
    }
}
