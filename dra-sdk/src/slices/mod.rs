//! ResourceSlice publishing: the device model, validation, splitting and the reconcile loop.

mod backoff;
mod layout;
mod limits;
mod model;
mod names;
mod plan;
mod publisher;
mod quantity;
mod validate;
mod wire;

pub use limits::{CounterLayout, KubernetesVersion, SliceLimits};
pub use model::{
    AttributeValue, CapacityRequestPolicy, CounterSet, Device, DeviceAttributes, DeviceCapacity,
    DeviceCounterConsumption, DeviceNodeSelection, DeviceTaint, DriverResources, NodeSelector,
    Pool, PoolNodeSelection, Quantity, TaintEffect, Time, ValidRequestValues,
};
pub use publisher::{
    Operation, PublishError, PublishEvent, PublishStats, PublisherHandle, ResourceSlicePublisher,
};
pub use validate::{FieldPath, Problem, ValidationError, ValidationErrors};
pub use wire::{FeatureGate, ResourceApiVersion};
