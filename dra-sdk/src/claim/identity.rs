//! Which claim: the identity the kubelet sends.

use std::fmt;

/// Identity of a claim as the kubelet sends it.
///
/// ```
/// use dra_sdk::claim::ClaimRef;
///
/// let claim = ClaimRef::new("default", "gpu-claim", "8f0c5d1e");
/// assert_eq!(claim.to_string(), "default/gpu-claim (8f0c5d1e)");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimRef {
    /// The ResourceClaim's UID.
    pub uid: String,
    /// The ResourceClaim's namespace.
    pub namespace: String,
    /// The ResourceClaim's name.
    pub name: String,
}

impl fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} ({})", self.namespace, self.name, self.uid)
    }
}

impl ClaimRef {
    /// A claim identity.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        uid: impl Into<String>,
    ) -> Self {
        Self {
            uid: uid.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

/// A device of a ResourceSlice pool: the (pool, device name) pair an allocation names, and the
/// identity of a device in every type that concerns one device (allocated, prepared, recorded,
/// its state and status).
///
/// ```
/// use dra_sdk::claim::DeviceRef;
///
/// let device = DeviceRef::new("node-a", "gpu-0");
/// assert_eq!(device.to_string(), "node-a/gpu-0");
/// assert_eq!(device.name, "gpu-0");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceRef {
    /// The pool the device is published in.
    pub pool: String,
    /// The device's name within its pool.
    pub name: String,
}

impl DeviceRef {
    /// The device `name` of `pool`.
    pub fn new(pool: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            pool: pool.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for DeviceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.pool, self.name)
    }
}
