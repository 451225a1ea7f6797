//! The [`Driver`] trait a vendor implements, and the resolved data it sees.
//!
//! The SDK owns sockets, API calls, files and durable state. A driver only turns an allocated,
//! fully resolved [`Claim`] into container edits per device ([`PreparedClaim`]) and undoes that
//! on unprepare.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::cdi::ContainerEdits;
use crate::checkpoint::ClaimRecord;
use crate::config::ConfigRegistry;
use crate::health::HealthSource;

/// A DRA driver: prepares and unprepares the devices of allocated claims on one node.
///
/// Both methods must be idempotent: the kubelet retries, and a plugin restart may replay an
/// interrupted call. The SDK already guarantees that one claim is never prepared and
/// unprepared at the same time, that a claim prepared successfully is not prepared again, and
/// that unprepare is only called for claims that were at least started.
///
/// ```no_run
/// use dra_sdk::cdi::ContainerEdits;
/// use dra_sdk::checkpoint::ClaimRecord;
/// use dra_sdk::driver::{Claim, ClaimRef, Driver, DriverError, PreparedClaim, PreparedDevice};
///
/// struct MyDriver;
///
/// #[async_trait::async_trait]
/// impl Driver for MyDriver {
///     type Config = ();
///
///     async fn prepare(&self, claim: &Claim<()>) -> Result<PreparedClaim, DriverError> {
///         let devices = claim
///             .devices
///             .iter()
///             .map(|d| {
///                 let edits = ContainerEdits::new().env("MY_DEVICE", &d.device);
///                 PreparedDevice::new(d, edits)
///             })
///             .collect();
///         Ok(PreparedClaim::new(devices))
///     }
///
///     async fn unprepare(&self, _claim: &ClaimRef, _record: &ClaimRecord) -> Result<(), DriverError> {
///         Ok(())
///     }
/// }
/// ```
#[async_trait]
pub trait Driver: Send + Sync + 'static {
    /// The driver's decoded opaque configuration: usually an enum over its config kinds, or the
    /// newest version of its one config kind. Use `()` for a driver without configs.
    type Config: Send + Sync + 'static;

    /// The opaque config types this driver accepts, keyed by apiVersion and kind.
    ///
    /// Called once when the plugin starts. The default accepts none: any opaque config addressed
    /// to this driver then fails its claim with a clear message.
    fn config_registry(&self) -> ConfigRegistry<Self::Config> {
        ConfigRegistry::new()
    }

    /// Prepares the devices of one claim and returns the container edits per device.
    ///
    /// The SDK writes the CDI spec file and answers the kubelet. Returning an error fails this
    /// claim only; its message reaches the pod's events.
    async fn prepare(&self, claim: &Claim<Self::Config>) -> Result<PreparedClaim, DriverError>;

    /// Undoes [`Driver::prepare`] for a claim recorded in the checkpoint.
    ///
    /// `record` is what the SDK stored: the devices, and the optional `driver_state` the
    /// driver returned from prepare. It may describe a claim whose prepare was interrupted or
    /// failed half-way (`record.state` is then `PrepareStarted`), so tolerate missing pieces.
    async fn unprepare(&self, claim: &ClaimRef, record: &ClaimRecord) -> Result<(), DriverError>;

    /// Rolls back a claim whose prepare started but never completed before the plugin stopped.
    ///
    /// Called once at start for each such claim, before the plugin registers with the kubelet.
    /// The default calls [`Driver::unprepare`].
    async fn rollback(&self, claim: &ClaimRef, record: &ClaimRecord) -> Result<(), DriverError> {
        self.unprepare(claim, record).await
    }

    /// The driver's device health, if it monitors health.
    ///
    /// When `Some`, the plugin serves and advertises the kubelet's `DRAResourceHealth` stream;
    /// when `None`, that service is neither advertised nor served.
    fn health(&self) -> Option<HealthSource> {
        None
    }

    /// Background events the driver may want to log or act on (registration rejected,
    /// checkpoint problems found at start). The default logs nothing extra: the SDK already
    /// logs each event.
    fn on_event(&self, event: &PluginEvent) {
        let _ = event;
    }
}

/// A shared driver is a driver: keep an `Arc` to it elsewhere (to feed health or hot-plug
/// events) and hand the plugin a clone.
#[async_trait]
impl<D: Driver> Driver for Arc<D> {
    type Config = D::Config;

    fn config_registry(&self) -> ConfigRegistry<Self::Config> {
        (**self).config_registry()
    }

    async fn prepare(&self, claim: &Claim<Self::Config>) -> Result<PreparedClaim, DriverError> {
        (**self).prepare(claim).await
    }

    async fn unprepare(&self, claim: &ClaimRef, record: &ClaimRecord) -> Result<(), DriverError> {
        (**self).unprepare(claim, record).await
    }

    async fn rollback(&self, claim: &ClaimRef, record: &ClaimRecord) -> Result<(), DriverError> {
        (**self).rollback(claim, record).await
    }

    fn health(&self) -> Option<HealthSource> {
        (**self).health()
    }

    fn on_event(&self, event: &PluginEvent) {
        (**self).on_event(event)
    }
}

/// Identity of a claim as the kubelet sends it.
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

/// An allocated claim, reduced to what concerns this driver.
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

/// One allocated device of a claim, with the configs that apply to it.
#[derive(Debug)]
#[non_exhaustive]
pub struct AllocatedDevice<C> {
    /// The request this device was allocated for; for a `firstAvailable` subrequest, the base
    /// request name (what containers reference).
    pub request: String,
    /// The `firstAvailable` subrequest that was satisfied, if any.
    pub subrequest: Option<String>,
    /// Pool of the device.
    pub pool: String,
    /// Name of the device within its pool.
    pub device: String,
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
    /// The config with the highest precedence, if any applies.
    pub fn config(&self) -> Option<&C> {
        self.configs.last().map(|applied| applied.config.as_ref())
    }

    /// `<pool>/<device>`, the way the kubelet names a device.
    pub fn id(&self) -> String {
        format!("{}/{}", self.pool, self.device)
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

/// What a driver returns for a prepared claim.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct PreparedClaim {
    /// One entry per allocated device the driver prepared.
    pub devices: Vec<PreparedDevice>,
    /// Edits applied to every container that uses any device of the claim.
    pub common_edits: ContainerEdits,
    /// Opaque data stored in the checkpoint and handed back on unprepare and rollback.
    pub driver_state: Option<serde_json::Value>,
}

impl PreparedClaim {
    /// A prepared claim with the given devices.
    pub fn new(devices: Vec<PreparedDevice>) -> Self {
        Self {
            devices,
            ..Self::default()
        }
    }

    /// Sets the edits shared by all devices of the claim.
    pub fn with_common_edits(mut self, edits: ContainerEdits) -> Self {
        self.common_edits = edits;
        self
    }

    /// Sets the opaque state handed back on unprepare.
    pub fn with_driver_state(mut self, state: serde_json::Value) -> Self {
        self.driver_state = Some(state);
        self
    }
}

/// One prepared device and the container edits that expose it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PreparedDevice {
    /// Base request name the device was allocated for.
    pub request: String,
    /// Pool of the device.
    pub pool: String,
    /// Name of the device.
    pub device: String,
    /// Share ID for multi-allocatable devices.
    pub share_id: Option<String>,
    /// What a container using this device gets. Empty edits produce no CDI device.
    pub edits: ContainerEdits,
}

impl PreparedDevice {
    /// The prepared form of an allocated device.
    pub fn new<C>(allocated: &AllocatedDevice<C>, edits: ContainerEdits) -> Self {
        Self {
            request: allocated.request.clone(),
            pool: allocated.pool.clone(),
            device: allocated.device.clone(),
            share_id: allocated.share_id.clone(),
            edits,
        }
    }
}

/// Why a driver could not prepare or unprepare a claim.
///
/// The message is what users see in the pod's events, so make it specific.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    /// One device could not be set up.
    #[error("device {device}: {reason}")]
    Device {
        /// `<pool>/<device>` or the device name.
        device: String,
        /// What went wrong.
        reason: String,
    },
    /// The claim's configuration is valid JSON but cannot be honoured on this node.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The node or device is temporarily unable to serve; the kubelet will retry.
    #[error("temporarily unavailable: {0}")]
    Unavailable(String),
    /// Anything else.
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

impl DriverError {
    /// A short, stable label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            DriverError::Device { .. } => "device",
            DriverError::InvalidConfig(_) => "invalid_config",
            DriverError::Unavailable(_) => "unavailable",
            DriverError::Other(_) => "other",
        }
    }

    /// Wraps any error.
    pub fn other(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        DriverError::Other(error.into())
    }
}

/// Something that happened in the background of a running plugin.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum PluginEvent {
    /// The kubelet accepted the plugin.
    Registered,
    /// The kubelet rejected the registration; it retries on its own.
    RegistrationRejected {
        /// The kubelet's reason.
        error: String,
    },
    /// The checkpoint file was unreadable and was moved aside; prepared claims were lost.
    CheckpointCorrupt {
        /// Where the unreadable file now is.
        moved_to: std::path::PathBuf,
    },
    /// The checkpoint was written during another boot and was discarded.
    CheckpointFromOtherBoot,
    /// A claim whose prepare was interrupted could not be rolled back at start.
    RollbackFailed {
        /// The claim.
        claim: ClaimRef,
        /// The driver's error message.
        error: String,
    },
}
