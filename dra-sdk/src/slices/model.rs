//! The typed model of what a driver publishes.

use std::collections::BTreeMap;

pub use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// One device as published in a ResourceSlice.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Device {
    /// Device name: a DNS label, unique within its pool.
    pub name: String,
    /// Attributes keyed by qualified name. A bare C identifier is implicitly in the driver's
    /// domain; other names carry their domain (`resource.kubernetes.io/pcieRoot`).
    pub attributes: BTreeMap<String, AttributeValue>,
    /// Capacities keyed by qualified name, with the same naming rules as attributes.
    pub capacity: BTreeMap<String, DeviceCapacity>,
}

impl Device {
    /// A device with the given name and nothing else.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ..Self::default()
        }
    }

    /// Adds the attributes and capacities of a [`DeviceAttributes`] value.
    pub fn with_attributes<A: DeviceAttributes + ?Sized>(mut self, attributes: &A) -> Self {
        attributes.apply_to(&mut self);
        self
    }
}

/// The value of a device attribute. Exactly one kind, as in `resource.k8s.io`.
#[derive(Clone, Debug, PartialEq)]
pub enum AttributeValue {
    /// A 64-bit integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
    /// A string of at most 64 characters.
    String(String),
    /// A semantic version (semver 2.0.0) of at most 64 characters.
    Version(String),
    /// A non-empty list of integers (Kubernetes 1.36+, `DRAListTypeAttributes`).
    Ints(Vec<i64>),
    /// A non-empty list of booleans (Kubernetes 1.36+).
    Bools(Vec<bool>),
    /// A non-empty list of strings (Kubernetes 1.36+).
    Strings(Vec<String>),
    /// A non-empty list of semantic versions (Kubernetes 1.36+).
    Versions(Vec<String>),
}

/// A device capacity.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceCapacity {
    /// Total amount of the capacity.
    pub value: Quantity,
}

impl DeviceCapacity {
    /// A capacity with the given total value.
    pub fn new(value: impl Into<String>) -> Self {
        Self {
            value: Quantity(value.into()),
        }
    }
}

/// Something that contributes attributes and capacities to a [`Device`].
///
/// Usually derived with `#[derive(DeviceAttributes)]`.
pub trait DeviceAttributes {
    /// Writes this value's attributes and capacities into `device`.
    fn apply_to(&self, device: &mut Device);
}
