//! Device health: what a driver reports, and what the kubelet's health stream carries.
//!
//! A driver that monitors its devices creates a [`HealthReporter`] / [`HealthSource`] pair,
//! returns the source from [`Driver::health`](crate::driver::Driver::health), and calls
//! [`HealthReporter::set`] whenever its view changes. The plugin then serves the kubelet's
//! `NodeWatchResources` stream with the full device list on every change, re-sent often enough
//! that the kubelet never marks a device stale.
//!
//! ```
//! use dra_sdk::health::{DeviceHealth, HealthReporter, HealthStatus};
//!
//! let (reporter, source) = HealthReporter::new();
//! reporter.set(vec![DeviceHealth::new("node-a", "gpu-0", HealthStatus::Healthy)]);
//! assert_eq!(source.current()[0].status, HealthStatus::Healthy);
//! ```

use std::time::Duration;

use tokio::sync::watch;

/// Health of one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceHealth {
    /// Pool of the device.
    pub pool: String,
    /// Device name within the pool.
    pub device: String,
    /// Current status.
    pub status: HealthStatus,
    /// Human-readable detail (kubelet 1.36+; at most 1024 characters are sent).
    pub message: String,
    /// How long the kubelet may go without an update before it considers the device's health
    /// unknown (kubelet 1.35+). `None` keeps the kubelet's default of 30 s.
    pub timeout: Option<Duration>,
}

impl DeviceHealth {
    /// A health entry without message or custom timeout.
    pub fn new(pool: impl Into<String>, device: impl Into<String>, status: HealthStatus) -> Self {
        Self {
            pool: pool.into(),
            device: device.into(),
            status,
            message: String::new(),
            timeout: None,
        }
    }

    /// Adds a message.
    pub fn with_message(mut self, message: impl Into<String>) -> Self {
        self.message = message.into();
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

/// The driver's handle to publish device health.
#[derive(Clone, Debug)]
pub struct HealthReporter {
    sender: watch::Sender<Vec<DeviceHealth>>,
}

impl HealthReporter {
    /// A reporter and the source the plugin reads from. Starts with no devices.
    pub fn new() -> (HealthReporter, HealthSource) {
        let (sender, receiver) = watch::channel(Vec::new());
        (HealthReporter { sender }, HealthSource { receiver })
    }

    /// Replaces the full device list.
    pub fn set(&self, devices: Vec<DeviceHealth>) {
        self.sender.send_replace(devices);
    }

    /// Changes the status of one device (added if unknown so far); no-op when nothing changes.
    pub fn update(&self, health: DeviceHealth) {
        self.sender.send_if_modified(|devices| {
            match devices
                .iter_mut()
                .find(|d| d.pool == health.pool && d.device == health.device)
            {
                Some(existing) if *existing == health => false,
                Some(existing) => {
                    *existing = health;
                    true
                }
                None => {
                    devices.push(health);
                    true
                }
            }
        });
    }
}

/// The plugin's side of a [`HealthReporter`].
#[derive(Clone, Debug)]
pub struct HealthSource {
    receiver: watch::Receiver<Vec<DeviceHealth>>,
}

impl HealthSource {
    /// The current full device list.
    pub fn current(&self) -> Vec<DeviceHealth> {
        self.receiver.borrow().clone()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<Vec<DeviceHealth>> {
        self.receiver.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn update_notifies_only_on_change() {
        let (reporter, source) = HealthReporter::new();
        let mut rx = source.subscribe();
        rx.borrow_and_update();
        reporter.update(DeviceHealth::new("p", "d", HealthStatus::Healthy));
        assert!(rx.has_changed().unwrap());
        rx.borrow_and_update();
        reporter.update(DeviceHealth::new("p", "d", HealthStatus::Healthy));
        assert!(!rx.has_changed().unwrap());
        reporter.update(DeviceHealth::new("p", "d", HealthStatus::Unhealthy));
        assert!(rx.has_changed().unwrap());
        assert_eq!(source.current().len(), 1);
        assert_eq!(source.current()[0].status, HealthStatus::Unhealthy);
    }
}
