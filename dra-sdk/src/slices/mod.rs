//! ResourceSlice publishing: the device model, validation, splitting and the reconcile loop.

mod model;

pub use model::{AttributeValue, Device, DeviceAttributes, DeviceCapacity, Quantity};
