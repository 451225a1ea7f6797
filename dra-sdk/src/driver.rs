//! The [`Driver`] trait a vendor implements, and the resolved data it sees.
//!
//! The SDK owns sockets, API calls, files and durable state. A driver only turns an allocated,
//! fully resolved [`Claim`] into container edits per device ([`PreparedClaim`]) and undoes that
//! on unprepare.

use std::sync::Arc;

use async_trait::async_trait;

use serde::Serialize;

use crate::cdi::ContainerEdits;
use crate::claim::DeviceRef;
use crate::claim::{
    AllocatedDevice, Claim, ClaimRef, DriverError, DriverStateError, RecordedClaim, encode_state,
};
use crate::config::ConfigRegistry;
use crate::context::DriverContext;
use crate::device_status::DeviceStatus;
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
/// use dra_sdk::claim::{Claim, DriverError, RecordedClaim};
/// use dra_sdk::driver::{Driver, PreparedClaim, PreparedDevice};
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
///                 let edits = ContainerEdits::new().env("MY_DEVICE", &d.device.name);
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

    /// Whether the plugin writes KEP-5304 device metadata for the claims this driver prepares
    /// (alpha in Kubernetes 1.36). When `true`, after each successful [`prepare`](Self::prepare)
    /// the plugin writes one metadata file per request with the allocated devices and the
    /// attributes they are published with, and a CDI spec that mounts it read-only into the
    /// containers using the request; the spec's CDI device is handed to the kubelet with the
    /// request's devices and recorded in the checkpoint. Unprepare, the rollback of an
    /// interrupted prepare and the start-up sweep of orphans remove the files like CDI specs.
    /// Paths and format: [`crate::advanced::metadata`]. Default `false`.
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
    /// # Ok::<(), dra_sdk::claim::DriverStateError>(())
    /// ```
    pub fn with_typed_state<T: Serialize>(mut self, state: &T) -> Result<Self, DriverStateError> {
        self.driver_state = Some(encode_state(state)?);
        Ok(self)
    }
}

/// Why [`Driver::reconcile`] failed, and whether the plugin may start anyway.
///
/// Converting a [`DriverError`] with `?` gives a non-fatal error: it is logged and reported as
/// [`PluginEvent::ReconcileFailed`], and the plugin starts.
///
/// ```
/// use dra_sdk::claim::DriverError;
/// use dra_sdk::driver::ReconcileError;
///
/// let leftover = ReconcileError::from(DriverError::Unavailable("MIG manager busy".into()));
/// assert!(!leftover.is_fatal());
/// let unsafe_to_serve = ReconcileError::fatal(DriverError::other("device state unknown"));
/// assert!(unsafe_to_serve.is_fatal());
/// ```
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
///
/// ```
/// use dra_sdk::cdi::{ContainerEdits, DeviceNode, Mount};
/// use dra_sdk::claim::AllocatedDevice;
/// use dra_sdk::driver::PreparedDevice;
///
/// let allocated: AllocatedDevice<()> = AllocatedDevice::new("gpu", "node-a", "gpu-0");
/// let edits = ContainerEdits::new()
///     .env("GPU_INDEX", "0")
///     .device_node(DeviceNode::new("/dev/gpu0"))
///     .mount(Mount::new("/opt/gpu/lib", "/usr/local/gpu/lib").option("ro"));
/// let prepared = PreparedDevice::new(&allocated, edits);
/// assert_eq!(prepared.device.name, "gpu-0");
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PreparedDevice {
    /// Base request name the device was allocated for.
    pub request: String,
    /// The device.
    pub device: DeviceRef,
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
