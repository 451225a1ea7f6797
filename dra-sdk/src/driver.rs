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

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::cdi::ContainerEdits;
use crate::config::ConfigRegistry;
use crate::context::{DriverContext, RecordedClaim};
use crate::device_status::DeviceStatus;
use crate::health::HealthSource;
use crate::slices::PublishEvent;

/// A DRA driver: prepares and unprepares the devices of allocated claims on one node.
///
/// Both methods must be idempotent: the kubelet retries, and a plugin restart may replay an
/// interrupted call. The SDK already guarantees that one claim is never prepared and
/// unprepared at the same time, that a claim prepared successfully is not prepared again, and
/// that unprepare is only called for claims that were at least started.
///
/// ```no_run
/// use dra_sdk::cdi::ContainerEdits;
/// use dra_sdk::context::RecordedClaim;
/// use dra_sdk::driver::{Claim, Driver, DriverError, PreparedClaim, PreparedDevice};
///
/// struct MyDriver;
///
/// #[dra_sdk::async_trait]
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
///     async fn unprepare(&self, _claim: &RecordedClaim) -> Result<(), DriverError> {
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
    /// `claim` is what the SDK recorded: the devices, and the optional driver state returned
    /// from prepare ([`RecordedClaim::decode_state`]). It may describe a claim whose prepare was
    /// interrupted or failed half-way (`claim.completed` is then `false`), so tolerate missing
    /// pieces.
    async fn unprepare(&self, claim: &RecordedClaim) -> Result<(), DriverError>;

    /// Rolls back a claim whose prepare started but never completed before the plugin stopped
    /// (`claim.completed` is `false`).
    ///
    /// Called once at start for each such claim, before the plugin registers with the kubelet.
    /// The default calls [`Driver::unprepare`].
    async fn rollback(&self, claim: &RecordedClaim) -> Result<(), DriverError> {
        self.unprepare(claim).await
    }

    /// Called once when the plugin starts, before it registers with the kubelet, with the
    /// runtime context the driver keeps for its whole life: publish changed devices, report
    /// device health and taints, stop background work on shutdown, read and update the
    /// prepared claims. Keep a clone of `ctx` (it is cheap to clone).
    ///
    /// Runs after the rollback of interrupted prepares and before
    /// [`reconcile`](Self::reconcile). Resources published here are the first the plugin
    /// writes. An error stops the plugin from starting. The default does nothing.
    async fn start(&self, ctx: &DriverContext) -> Result<(), DriverError> {
        let _ = ctx;
        Ok(())
    }

    /// Called once at start, after [`start`](Self::start) and before the plugin registers, with
    /// every claim the checkpoint records as prepared on this node (interrupted prepares were
    /// rolled back already): the moment to destroy what no claim owns (MIG instances, VFIO
    /// bindings, sharing daemons left by a crash) and to restart what a claim needs.
    ///
    /// An error is logged and reported as [`PluginEvent::ReconcileFailed`]; the plugin goes on
    /// unless the error is [`ReconcileError::fatal`]. The default does nothing.
    async fn reconcile(&self, prepared: &[RecordedClaim]) -> Result<(), ReconcileError> {
        let _ = prepared;
        Ok(())
    }

    /// Whether the driver reports device health through
    /// [`DriverContext::set_device_state`]. When `true`, the plugin advertises the kubelet's
    /// `DRAResourceHealth` stream and serves the context's device states on it. Default `false`.
    fn reports_health(&self) -> bool {
        false
    }

    /// The driver's device health from its own [`HealthReporter`](crate::health::HealthReporter),
    /// if it monitors health that way.
    ///
    /// When `Some`, the plugin serves and advertises the kubelet's `DRAResourceHealth` stream
    /// from this source (and [`DriverContext::set_device_state`] then only taints devices);
    /// when `None` and [`reports_health`](Self::reports_health) is `false`, the service is not
    /// advertised.
    fn health(&self) -> Option<HealthSource> {
        None
    }

    /// Whether the plugin writes KEP-5304 device metadata for the claims this driver prepares
    /// (alpha in Kubernetes 1.36). When `true`, after each successful [`prepare`](Self::prepare)
    /// the plugin writes one metadata file per request with the allocated devices and the
    /// attributes they are published with, and a CDI spec that mounts it read-only into the
    /// containers using the request; the spec's CDI device is handed to the kubelet with the
    /// request's devices and recorded in the checkpoint. Unprepare, the rollback of an
    /// interrupted prepare and the start-up sweep of orphans remove the files like CDI specs.
    /// Paths and format: [`crate::metadata`]. Default `false`.
    fn device_metadata(&self) -> bool {
        false
    }

    /// Whether the driver reports KEP-4817 device status (`status.devices` of the claim).
    /// When `true`, the plugin writes the statuses a prepare returns
    /// ([`PreparedClaim::with_device_status`]) once the claim is recorded as prepared, and
    /// removes this driver's entries at unprepare; later changes go through
    /// [`DriverContext::device_status`]. A failed write is logged and reported as
    /// [`PluginEvent::DeviceStatusFailed`]: the claim stays prepared. Needs the RBAC in
    /// [`crate::device_status`]. Default `false`.
    fn reports_device_status(&self) -> bool {
        false
    }

    /// Every background event of the plugin, the one way they reach a driver: registration
    /// accepted or rejected, checkpoint problems found at start, rollbacks and reconciles that
    /// failed, device-status writes that failed, and the ResourceSlice publisher's progress and
    /// errors ([`PluginEvent::Publish`]). Called on the plugin's tasks: keep it quick (hand
    /// work to a channel of your own). The default does nothing: the SDK already logs each
    /// event. [`KubeletPlugin::registration_status`](crate::plugin::KubeletPlugin::registration_status)
    /// is the registration *state* for code outside the driver, not a second event stream.
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

    async fn unprepare(&self, claim: &RecordedClaim) -> Result<(), DriverError> {
        (**self).unprepare(claim).await
    }

    async fn rollback(&self, claim: &RecordedClaim) -> Result<(), DriverError> {
        (**self).rollback(claim).await
    }

    async fn start(&self, ctx: &DriverContext) -> Result<(), DriverError> {
        (**self).start(ctx).await
    }

    async fn reconcile(&self, prepared: &[RecordedClaim]) -> Result<(), ReconcileError> {
        (**self).reconcile(prepared).await
    }

    fn reports_health(&self) -> bool {
        (**self).reports_health()
    }

    fn health(&self) -> Option<HealthSource> {
        (**self).health()
    }

    fn device_metadata(&self) -> bool {
        (**self).device_metadata()
    }

    fn reports_device_status(&self) -> bool {
        (**self).reports_device_status()
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

/// An allocated claim, reduced to what concerns this driver.
///
/// The plugin builds it from the ResourceClaim with [`claims::resolve`](crate::claims::resolve);
/// a driver's unit tests build one directly:
///
/// ```
/// use dra_sdk::driver::{AllocatedDevice, Claim, ClaimRef};
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
            pool: pool.into(),
            device: device.into(),
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
    /// The status of prepared devices, written to the claim's `status.devices` once the claim
    /// is recorded as prepared; only for a driver whose
    /// [`reports_device_status`](Driver::reports_device_status) is `true`. Each entry must
    /// name a device allocated to the claim for this driver and keep the API's limits.
    pub device_status: Vec<DeviceStatus>,
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

    /// Adds the status of a prepared device (KEP-4817), written to the claim after prepare.
    ///
    /// ```
    /// use dra_sdk::device_status::DeviceStatus;
    /// use dra_sdk::driver::PreparedClaim;
    ///
    /// let prepared = PreparedClaim::new(Vec::new())
    ///     .with_device_status(DeviceStatus::new("node-1", "eth1").ready("Configured", "link up"));
    /// assert_eq!(prepared.device_status.len(), 1);
    /// ```
    pub fn with_device_status(mut self, status: DeviceStatus) -> Self {
        self.device_status.push(status);
        self
    }

    /// Sets the state handed back on unprepare from a typed value; read it back with
    /// [`RecordedClaim::decode_state`].
    ///
    /// ```
    /// use dra_sdk::driver::PreparedClaim;
    ///
    /// #[derive(serde::Serialize)]
    /// struct MpsState { daemon: String }
    ///
    /// let prepared = PreparedClaim::new(Vec::new())
    ///     .with_typed_state(&MpsState { daemon: "mps-1".into() })?;
    /// assert_eq!(prepared.driver_state.unwrap()["daemon"], "mps-1");
    /// # Ok::<(), dra_sdk::driver::DriverStateError>(())
    /// ```
    pub fn with_typed_state<T: Serialize>(mut self, state: &T) -> Result<Self, DriverStateError> {
        self.driver_state = Some(encode_state(state)?);
        Ok(self)
    }
}

/// Encodes a typed driver state as JSON.
pub(crate) fn encode_state<T: Serialize>(state: &T) -> Result<serde_json::Value, DriverStateError> {
    serde_json::to_value(state).map_err(|source| DriverStateError::Encode {
        type_name: std::any::type_name::<T>(),
        source,
    })
}

/// Decodes a claim's JSON driver state into `T`; `None` when the claim has none.
pub(crate) fn decode_state<T: DeserializeOwned>(
    claim: impl fmt::Display,
    state: Option<&serde_json::Value>,
) -> Result<Option<T>, DriverStateError> {
    let Some(state) = state else {
        return Ok(None);
    };
    serde_path_to_error::deserialize(state)
        .map(Some)
        .map_err(|error| {
            let path = error.path().to_string();
            DriverStateError::Decode {
                claim: claim.to_string(),
                type_name: std::any::type_name::<T>(),
                path,
                source: error.into_inner(),
            }
        })
}

/// A typed driver state that could not be encoded or decoded: the driver's state type changed
/// incompatibly between versions, or a state was written by hand.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverStateError {
    /// The state could not be encoded as JSON.
    #[error("encoding the driver state as {type_name}: {source}")]
    Encode {
        /// The Rust type.
        type_name: &'static str,
        /// The serializer error.
        #[source]
        source: serde_json::Error,
    },
    /// The stored state does not decode into the driver's type.
    #[error("decoding the driver state of claim {claim} as {type_name} at `{path}`: {source}")]
    Decode {
        /// The claim: `namespace/name (uid)`, or `namespace/name` from a bare checkpoint record.
        claim: String,
        /// The Rust type.
        type_name: &'static str,
        /// Where in the state the mismatch is (`.` for the whole value).
        path: String,
        /// The deserializer error.
        #[source]
        source: serde_json::Error,
    },
}

impl From<DriverStateError> for DriverError {
    fn from(error: DriverStateError) -> Self {
        DriverError::other(error)
    }
}

/// Why [`Driver::reconcile`] failed, and whether the plugin may start anyway.
///
/// Converting a [`DriverError`] with `?` gives a non-fatal error: it is logged and reported as
/// [`PluginEvent::ReconcileFailed`], and the plugin starts.
#[derive(Debug, thiserror::Error)]
#[error("{source}")]
pub struct ReconcileError {
    #[source]
    source: DriverError,
    fatal: bool,
}

impl ReconcileError {
    /// A failure the plugin reports and starts anyway (leftovers stay until the next start).
    pub fn recoverable(source: impl Into<DriverError>) -> Self {
        Self {
            source: source.into(),
            fatal: false,
        }
    }

    /// A failure that must stop the plugin from starting: serving claims would be unsafe.
    pub fn fatal(source: impl Into<DriverError>) -> Self {
        Self {
            source: source.into(),
            fatal: true,
        }
    }

    /// Whether the plugin must not start.
    pub fn is_fatal(&self) -> bool {
        self.fatal
    }

    /// The driver's error.
    pub fn into_source(self) -> DriverError {
        self.source
    }
}

impl From<DriverError> for ReconcileError {
    fn from(source: DriverError) -> Self {
        Self::recoverable(source)
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
    /// Fully qualified CDI device IDs (`vendor/class=name`) of specs the SDK did not write
    /// (managed by the driver or another component), handed to the kubelet after the ID of the
    /// SDK's own spec, if any. The SDK never writes or removes these specs.
    pub cdi_device_ids: Vec<String>,
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
            cdi_device_ids: Vec::new(),
        }
    }

    /// Adds the ID of a CDI device from a spec the SDK does not manage, e.g.
    /// `nvidia.com/gpu=GPU-8f3c…` from a spec the vendor's toolkit generated. The plugin checks
    /// that it is a valid qualified name.
    pub fn with_cdi_device_id(mut self, id: impl Into<String>) -> Self {
        self.cdi_device_ids.push(id.into());
        self
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
    /// [`Driver::reconcile`] failed with a recoverable error; the plugin started anyway.
    ReconcileFailed {
        /// The driver's error message.
        error: String,
    },
    /// Writing or removing the device status of a claim failed (see
    /// [`Driver::reports_device_status`]); the claim stays prepared (or unprepared).
    DeviceStatusFailed {
        /// The claim.
        claim: ClaimRef,
        /// What went wrong, with what to grant when the server refused the write.
        error: String,
    },
    /// The plugin's ResourceSlice publisher connected, synced, failed (it retries) or found
    /// fields the server drops. Sent only while the driver publishes resources.
    Publish(PublishEvent),
}
