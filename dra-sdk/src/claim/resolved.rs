//! The claim a driver prepares: allocated devices of this driver, each with its decoded
//! opaque configs.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::ClaimRef;
use crate::claim::DeviceRef;

/// An allocated claim, reduced to what concerns this driver.
///
/// The plugin builds it from the ResourceClaim with [`resolve`](crate::advanced::claim::resolve);
/// a driver's unit tests build one directly:
///
/// ```
/// use dra_sdk::claim::{AllocatedDevice, Claim, ClaimRef};
///
/// let claim: Claim<()> = Claim::new(ClaimRef::new("default", "gpu-claim", "uid-1"))
///     .with_device(AllocatedDevice::new("gpu", "node-a", "gpu-0"))
///     .with_device(AllocatedDevice::new("gpu", "node-a", "gpu-1").with_admin_access(true));
/// assert_eq!(claim.devices.len(), 2);
/// assert_eq!(claim.resource_claim.metadata.uid.as_deref(), Some("uid-1"));
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct Claim<C> {
    /// The claim's identity.
    pub claim: ClaimRef,
    /// The allocation results for this driver only, in allocation order.
    pub devices: Vec<AllocatedDevice<C>>,
    /// The full ResourceClaim as read from the API server, for anything not resolved above.
    pub resource_claim: Arc<ResourceClaim>,
}

impl<C> Claim<C> {
    /// A claim without devices whose ResourceClaim has only its namespace, name and UID set;
    /// add devices with [`with_device`](Self::with_device) and the full object with
    /// [`with_resource_claim`](Self::with_resource_claim).
    pub fn new(claim: ClaimRef) -> Self {
        let mut object = ResourceClaim::default();
        object.metadata.namespace = Some(claim.namespace.clone());
        object.metadata.name = Some(claim.name.clone());
        object.metadata.uid = Some(claim.uid.clone());
        Self {
            claim,
            devices: Vec::new(),
            resource_claim: Arc::new(object),
        }
    }

    /// Adds an allocated device, after those already there.
    pub fn with_device(mut self, device: AllocatedDevice<C>) -> Self {
        self.devices.push(device);
        self
    }

    /// Replaces the ResourceClaim object handed to the driver.
    pub fn with_resource_claim(mut self, object: Arc<ResourceClaim>) -> Self {
        self.resource_claim = object;
        self
    }
}

/// One allocated device of a claim, with the configs that apply to it.
#[derive(Debug)]
#[non_exhaustive]
pub struct AllocatedDevice<C> {
    /// The request this device was allocated for; for a `firstAvailable` subrequest, the base
    /// request name (what containers reference).
    pub request: String,
    /// The `firstAvailable` subrequest that was satisfied, if any.
    pub subrequest: Option<String>,
    /// The device.
    pub device: DeviceRef,
    /// Identifies this share of a device that allows multiple allocations.
    pub share_id: Option<String>,
    /// Capacity consumed by this share (consumable capacity), keyed by qualified name.
    pub consumed_capacity: BTreeMap<String, Quantity>,
    /// Whether the device was allocated with admin access (monitoring, not exclusive use).
    pub admin_access: bool,
    /// The opaque configs that apply to this device, lowest precedence first: class configs,
    /// then claim configs, each in declaration order. The last one wins.
    pub configs: Vec<AppliedConfig<C>>,
}

impl<C> AllocatedDevice<C> {
    /// A device allocated for `request` (the base request name), without share, capacity,
    /// admin access or configs.
    pub fn new(
        request: impl Into<String>,
        pool: impl Into<String>,
        device: impl Into<String>,
    ) -> Self {
        Self {
            request: request.into(),
            subrequest: None,
            device: DeviceRef::new(pool, device),
            share_id: None,
            consumed_capacity: BTreeMap::new(),
            admin_access: false,
            configs: Vec::new(),
        }
    }

    /// Sets the `firstAvailable` subrequest that was satisfied.
    pub fn with_subrequest(mut self, subrequest: impl Into<String>) -> Self {
        self.subrequest = Some(subrequest.into());
        self
    }

    /// Sets the share ID of a device that allows multiple allocations.
    pub fn with_share_id(mut self, share_id: impl Into<String>) -> Self {
        self.share_id = Some(share_id.into());
        self
    }

    /// Adds consumed capacity, e.g. `("memory", "10Gi")`.
    pub fn with_consumed_capacity(
        mut self,
        name: impl Into<String>,
        quantity: impl Into<String>,
    ) -> Self {
        self.consumed_capacity
            .insert(name.into(), Quantity(quantity.into()));
        self
    }

    /// Sets admin access.
    pub fn with_admin_access(mut self, admin_access: bool) -> Self {
        self.admin_access = admin_access;
        self
    }

    /// Adds a config with a higher precedence than those already there.
    pub fn with_config(mut self, source: ConfigSource, config: C) -> Self {
        self.configs.push(AppliedConfig {
            source,
            config: Arc::new(config),
        });
        self
    }

    /// The config with the highest precedence, if any applies.
    pub fn config(&self) -> Option<&C> {
        self.configs.last().map(|applied| applied.config.as_ref())
    }

    /// `<pool>/<device>`, the way the kubelet names a device.
    pub fn id(&self) -> String {
        self.device.to_string()
    }
}

/// A decoded opaque config and where it came from.
#[derive(Debug)]
pub struct AppliedConfig<C> {
    /// DeviceClass or ResourceClaim.
    pub source: ConfigSource,
    /// The decoded config, shared by every device it applies to.
    pub config: Arc<C>,
}

impl<C> Clone for AppliedConfig<C> {
    fn clone(&self) -> Self {
        Self {
            source: self.source,
            config: Arc::clone(&self.config),
        }
    }
}

/// Where an opaque config was declared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigSource {
    /// From the DeviceClass of the request (`FromClass`).
    Class,
    /// From the ResourceClaim itself (`FromClaim`).
    Claim,
}
