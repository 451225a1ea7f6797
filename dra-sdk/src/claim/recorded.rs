//! A claim as the checkpoint recorded it, handed to unprepare, rollback and reconcile.

use serde::de::DeserializeOwned;

use super::{ClaimRef, DriverStateError};
use crate::claim::DeviceRef;

/// A claim as the checkpoint records it, for the driver: what the kubelet was given, the
/// driver's own state, and whether prepare completed. [`Driver::unprepare`],
/// [`Driver::rollback`] and [`Driver::reconcile`] receive it; the checkpoint's storage record
/// ([`ClaimRecord`](crate::advanced::checkpoint::ClaimRecord)) stays the SDK's business.
///
/// [`Driver::unprepare`]: crate::driver::Driver::unprepare
/// [`Driver::rollback`]: crate::driver::Driver::rollback
/// [`Driver::reconcile`]: crate::driver::Driver::reconcile
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RecordedClaim {
    /// The claim.
    pub claim: ClaimRef,
    /// Whether prepare completed. `false` for a prepare that was interrupted or failed half-way:
    /// `devices` is then empty and `driver_state` holds whatever the driver recorded before the
    /// interruption, so undo only what it proves was done, and tolerate missing pieces.
    pub completed: bool,
    /// The devices handed to the kubelet (empty unless `completed`).
    pub devices: Vec<RecordedDevice>,
    /// The driver state as stored; decode it with [`decode_state`](Self::decode_state).
    pub driver_state: Option<serde_json::Value>,
}

impl RecordedClaim {
    /// A completed claim without devices or state, for a driver's own tests of
    /// [`Driver::unprepare`](crate::driver::Driver::unprepare) and
    /// [`Driver::reconcile`](crate::driver::Driver::reconcile).
    ///
    /// ```
    /// use dra_sdk::claim::{ClaimRef, RecordedClaim, RecordedDevice};
    ///
    /// let claim = RecordedClaim::new(ClaimRef::new("default", "gpu", "uid-1"))
    ///     .with_device(RecordedDevice::new("node-a", "gpu-0").with_request("gpu"))
    ///     .with_driver_state(serde_json::json!({ "bound": "vfio-pci" }));
    /// assert_eq!(claim.devices[0].device.name, "gpu-0");
    /// assert!(claim.completed);
    /// assert!(!claim.interrupted().completed);
    /// ```
    pub fn new(claim: ClaimRef) -> Self {
        Self {
            claim,
            completed: true,
            devices: Vec::new(),
            driver_state: None,
        }
    }

    /// Marks the claim's prepare as interrupted (what [`Driver::rollback`] receives).
    ///
    /// [`Driver::rollback`]: crate::driver::Driver::rollback
    #[must_use]
    pub fn interrupted(mut self) -> Self {
        self.completed = false;
        self
    }

    /// Adds a prepared device.
    #[must_use]
    pub fn with_device(mut self, device: RecordedDevice) -> Self {
        self.devices.push(device);
        self
    }

    /// Sets the stored driver state.
    #[must_use]
    pub fn with_driver_state(mut self, state: serde_json::Value) -> Self {
        self.driver_state = Some(state);
        self
    }

    /// The driver state decoded into the driver's type; `None` when the claim has none.
    pub fn decode_state<T: DeserializeOwned>(&self) -> Result<Option<T>, DriverStateError> {
        crate::claim::decode_state(&self.claim, self.driver_state.as_ref())
    }
}

/// One prepared device of a [`RecordedClaim`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordedDevice {
    /// Base request names this device satisfies.
    pub request_names: Vec<String>,
    /// The device.
    pub device: DeviceRef,
    /// Share ID of a consumable-capacity allocation, if any.
    pub share_id: Option<String>,
    /// CDI device IDs handed to the kubelet.
    pub cdi_device_ids: Vec<String>,
}

impl RecordedDevice {
    /// A device of `pool` for no request in particular, without share or CDI IDs.
    pub fn new(pool: impl Into<String>, device: impl Into<String>) -> Self {
        Self {
            request_names: Vec::new(),
            device: DeviceRef::new(pool, device),
            share_id: None,
            cdi_device_ids: Vec::new(),
        }
    }

    /// Adds a base request name this device satisfies.
    #[must_use]
    pub fn with_request(mut self, request: impl Into<String>) -> Self {
        self.request_names.push(request.into());
        self
    }

    /// Sets the share ID of a consumable-capacity allocation.
    #[must_use]
    pub fn with_share_id(mut self, share_id: impl Into<String>) -> Self {
        self.share_id = Some(share_id.into());
        self
    }

    /// Adds a CDI device ID handed to the kubelet.
    #[must_use]
    pub fn with_cdi_device_id(mut self, id: impl Into<String>) -> Self {
        self.cdi_device_ids.push(id.into());
        self
    }
}
