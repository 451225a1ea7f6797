//! The runtime a driver lives in: [`DriverContext`], handed to [`Driver::start`](crate::driver::Driver::start).
//!
//! A real driver does more than answer prepare calls. Devices appear and change (hot-plug, a
//! new MIG layout), fail and recover, background monitors must stop with the plugin, and some
//! per-claim state changes after prepare (a sharing daemon restarted). The context is the one
//! handle for all of that:
//!
//! * [`publish`](DriverContext::publish) replaces the devices in the ResourceSlices;
//! * [`set_device_state`](DriverContext::set_device_state) reports a device's health to the
//!   kubelet's health stream *and* taints (or untaints) it in the ResourceSlices, in one call;
//! * [`cancellation_token`](DriverContext::cancellation_token) is cancelled when the plugin
//!   shuts down;
//! * [`prepared_claims`](DriverContext::prepared_claims) reads what the checkpoint records as
//!   prepared, and [`update_driver_state`](DriverContext::update_driver_state) changes a
//!   prepared claim's typed driver state there;
//! * [`device_status`](DriverContext::device_status) writes the status of allocated devices
//!   into their claims (`status.devices`, KEP-4817), at prepare or later.
//!
//! ```no_run
//! use dra_sdk::context::DriverContext;
//! use dra_sdk::claim::{Claim, DriverError, RecordedClaim};
//! use dra_sdk::driver::{Driver, PreparedClaim};
//! use dra_sdk::health::DeviceState;
//! use dra_sdk::slices::{DeviceTaint, TaintEffect};
//!
//! struct Gpus;
//!
//! #[dra_sdk::async_trait]
//! impl Driver for Gpus {
//!     type Config = ();
//!
//!     async fn start(&self, ctx: &DriverContext) -> Result<(), DriverError> {
//!         let ctx = ctx.clone();
//!         tokio::spawn(async move {
//!             let token = ctx.cancellation_token();
//!             let mut ticks = tokio::time::interval(std::time::Duration::from_secs(5));
//!             loop {
//!                 tokio::select! {
//!                     () = token.cancelled() => return,
//!                     _ = ticks.tick() => {}
//!                 }
//!                 // Poll the hardware; here gpu-3 reports an XID error.
//!                 ctx.set_device_state(
//!                     DeviceState::unhealthy(ctx.node_name(), "gpu-3", "XID 79")
//!                         .with_taint(DeviceTaint::new("gpu.example.com/xid", TaintEffect::NoExecute)),
//!                 );
//!             }
//!         });
//!         Ok(())
//!     }
//!
//!     fn reports_health(&self) -> bool {
//!         true
//!     }
//!
//!     async fn prepare(&self, claim: &Claim<()>) -> Result<PreparedClaim, DriverError> {
//!         Ok(PreparedClaim::new(Vec::new()))
//!     }
//!
//!     async fn unprepare(&self, _: &RecordedClaim) -> Result<(), DriverError> {
//!         Ok(())
//!     }
//! }
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::advanced::checkpoint::{Checkpoint, CheckpointError, ClaimRecord};
use crate::claim::locks::ClaimLocks;
use crate::claim::{ClaimRef, DeviceRef, DriverError, DriverStateError, RecordedClaim};
use crate::device_status::DeviceStatusWriter;
use crate::health::{DeviceState, HealthReporter, HealthSource};
use crate::slices::{DriverResources, SliceUpdater};

tokio::task_local! {
    /// The claim whose prepare or unprepare the current driver call serves: updating that
    /// claim's state from inside the call would wait for its own lock.
    pub(crate) static CLAIM_IN_PROGRESS: String;
}

/// Why a [`DriverContext`] call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ContextError {
    /// The plugin started without a ResourceSlice publisher: no resources were given to the
    /// builder and none were published from [`Driver::start`](crate::driver::Driver::start).
    #[error(
        "this plugin publishes no ResourceSlices: give the builder resources, or publish from Driver::start"
    )]
    NotPublishing,
    /// The claim is not recorded as prepared on this node (never prepared, still preparing, or
    /// unprepared since).
    #[error("claim {claim_uid} is not prepared on this node")]
    ClaimNotPrepared {
        /// The claim UID.
        claim_uid: String,
    },
    /// Called from the driver's own prepare or unprepare of the same claim, which holds the
    /// claim's lock: return the state from prepare instead.
    #[error(
        "the driver state of claim {claim_uid} cannot be updated from its own prepare or unprepare; return it in PreparedClaim"
    )]
    InsideClaimOperation {
        /// The claim UID.
        claim_uid: String,
    },
    /// The state could not be encoded.
    #[error(transparent)]
    State(#[from] DriverStateError),
    /// The checkpoint could not be read or written.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] CheckpointError),
    /// The context belongs to no running plugin with an API client.
    #[error("this context has no API client: it is not attached to a running plugin")]
    NoApiClient,
}

impl From<ContextError> for DriverError {
    fn from(error: ContextError) -> Self {
        DriverError::other(error)
    }
}

/// The driver's handle on the running plugin; see the [module documentation](self).
///
/// Cheap to clone; every clone is the same context. All methods are safe to call from any
/// task, at any time after [`Driver::start`](crate::driver::Driver::start) received it.
#[derive(Clone)]
pub struct DriverContext {
    inner: Arc<Inner>,
}

struct Inner {
    driver_name: String,
    node_name: String,
    shutdown: CancellationToken,
    checkpoint: Arc<Checkpoint>,
    locks: ClaimLocks,
    health: HealthReporter,
    health_source: HealthSource,
    slices: Mutex<Slices>,
    /// The claim status writer, set once the plugin has its API client.
    device_status: std::sync::OnceLock<Arc<DeviceStatusWriter>>,
    client: std::sync::OnceLock<kube::Client>,
}

/// What the ResourceSlices are made of: the driver's devices and the taints of their states.
#[derive(Default)]
struct Slices {
    /// The driver's resources, without state taints; `None` until something is published.
    base: Option<DriverResources>,
    /// Device states by (pool, device), in a stable order for the health stream.
    states: BTreeMap<DeviceRef, DeviceState>,
    /// The running publisher, once the plugin started one.
    publisher: Option<SliceUpdater>,
    /// Set when the plugin finished starting without a publisher.
    publishing_disabled: bool,
}

impl Slices {
    /// The driver's resources with the state taints added to their devices.
    fn merged(&self) -> Option<DriverResources> {
        let mut resources = self.base.clone()?;
        for (pool_name, pool) in &mut resources.pools {
            for device in &mut pool.devices {
                let Some(state) = self.states.get(&DeviceRef::new(pool_name, &device.name)) else {
                    continue;
                };
                for taint in &state.taints {
                    // The driver may publish the same taint itself: one entry per key and effect.
                    let present = device
                        .taints
                        .iter()
                        .any(|t| t.key == taint.key && t.effect == taint.effect);
                    if !present {
                        device.taints.push(taint.clone());
                    }
                }
            }
        }
        Some(resources)
    }

    fn push(&self) {
        if let (Some(publisher), Some(resources)) = (&self.publisher, self.merged()) {
            publisher.update(resources);
        }
    }
}

impl fmt::Debug for DriverContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DriverContext")
            .field("driver_name", &self.inner.driver_name)
            .field("node_name", &self.inner.node_name)
            .field("cancelled", &self.inner.shutdown.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl DriverContext {
    pub(crate) fn new(
        driver_name: String,
        node_name: String,
        checkpoint: Arc<Checkpoint>,
        locks: ClaimLocks,
        initial: Option<DriverResources>,
    ) -> Self {
        let (health, health_source) = HealthReporter::new();
        Self {
            inner: Arc::new(Inner {
                driver_name,
                node_name,
                shutdown: CancellationToken::new(),
                checkpoint,
                locks,
                health,
                health_source,
                slices: Mutex::new(Slices {
                    base: initial,
                    ..Slices::default()
                }),
                device_status: std::sync::OnceLock::new(),
                client: std::sync::OnceLock::new(),
            }),
        }
    }

    fn slices(&self) -> std::sync::MutexGuard<'_, Slices> {
        // Every critical section leaves `Slices` consistent, so a poisoned lock is usable.
        self.inner
            .slices
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The driver name the plugin registered.
    pub fn driver_name(&self) -> &str {
        &self.inner.driver_name
    }

    /// The node the plugin runs on (usually also the name of its pool).
    pub fn node_name(&self) -> &str {
        &self.inner.node_name
    }

    /// Cancelled when the plugin shuts down (or is dropped): stop background work with it.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.inner.shutdown.clone()
    }

    /// Replaces the devices the plugin publishes (hot-plug, a new partition layout). The taints
    /// of the current device states are added on top. Non-blocking: the publisher writes the
    /// latest resources in the background.
    ///
    /// Before the plugin starts its publisher (inside [`Driver::start`](crate::driver::Driver::start))
    /// this sets what it publishes first. Fails with [`ContextError::NotPublishing`] once the
    /// plugin is running without a publisher.
    pub fn publish(&self, resources: DriverResources) -> Result<(), ContextError> {
        let mut slices = self.slices();
        if slices.publishing_disabled {
            return Err(ContextError::NotPublishing);
        }
        slices.base = Some(resources);
        slices.push();
        Ok(())
    }

    /// The resources last published by the driver, without state taints; `None` before the
    /// first.
    pub fn resources(&self) -> Option<DriverResources> {
        self.slices().base.clone()
    }

    /// Sets one device's state: its health on the kubelet's health stream (when the driver
    /// [`reports_health`](crate::driver::Driver::reports_health)) and its state taints in the
    /// ResourceSlices. Nothing is sent when nothing changed.
    pub fn set_device_state(&self, state: DeviceState) {
        let mut slices = self.slices();
        let key = state.device.clone();
        let previous = slices.states.insert(key, state.clone());
        if previous.as_ref() == Some(&state) {
            return;
        }
        let taints_changed =
            previous.map_or(!state.taints.is_empty(), |p| p.taints != state.taints);
        self.publish_health(&slices);
        if taints_changed {
            slices.push();
        }
    }

    /// Replaces the state of every device; devices left out are no longer reported (the
    /// kubelet then considers their health unknown) and lose their state taints.
    pub fn set_device_states(&self, states: impl IntoIterator<Item = DeviceState>) {
        let mut slices = self.slices();
        let states: BTreeMap<_, _> = states
            .into_iter()
            .map(|state| (state.device.clone(), state))
            .collect();
        if states == slices.states {
            return;
        }
        let taints_changed = !states
            .iter()
            .filter(|(_, s)| !s.taints.is_empty())
            .eq(slices.states.iter().filter(|(_, s)| !s.taints.is_empty()));
        slices.states = states;
        self.publish_health(&slices);
        if taints_changed {
            slices.push();
        }
    }

    /// Forgets one device's state (the device was removed): it leaves the health stream and
    /// loses its state taints.
    pub fn clear_device_state(&self, pool: &str, device: &str) {
        let mut slices = self.slices();
        let Some(previous) = slices.states.remove(&DeviceRef::new(pool, device)) else {
            return;
        };
        self.publish_health(&slices);
        if !previous.taints.is_empty() {
            slices.push();
        }
    }

    /// The current device states.
    pub fn device_states(&self) -> Vec<DeviceState> {
        self.slices().states.values().cloned().collect()
    }

    fn publish_health(&self, slices: &Slices) {
        let health: Vec<DeviceState> = slices.states.values().cloned().collect();
        self.inner.health.set(health);
    }

    /// Every claim the checkpoint records as prepared on this node (prepares in progress are
    /// not included), including those prepared by another instance of the plugin during a
    /// rolling update.
    pub async fn prepared_claims(&self) -> Result<Vec<RecordedClaim>, ContextError> {
        let records = self.blocking(|checkpoint| checkpoint.records()).await?;
        Ok(records
            .iter()
            .filter(|(_, record)| record.is_completed())
            .map(|(uid, record)| {
                let claim = ClaimRef::new(&record.namespace, &record.name, uid);
                record.recorded(claim)
            })
            .collect())
    }

    /// One prepared claim, if the checkpoint records it as prepared.
    pub async fn prepared_claim(
        &self,
        claim_uid: &str,
    ) -> Result<Option<RecordedClaim>, ContextError> {
        let uid = claim_uid.to_owned();
        let record = self
            .blocking(move |checkpoint| checkpoint.get(&uid))
            .await?;
        Ok(record.filter(ClaimRecord::is_completed).map(|record| {
            let claim = ClaimRef::new(&record.namespace, &record.name, claim_uid);
            record.recorded(claim)
        }))
    }

    /// Replaces the driver state of a prepared claim in the checkpoint (a daemon restarted with
    /// a new ID, say); unprepare and later starts see the new state.
    ///
    /// Waits for a prepare or unprepare of the same claim in progress, so it never races with
    /// them; calling it from the driver's own prepare or unprepare of that claim fails with
    /// [`ContextError::InsideClaimOperation`] instead of waiting forever. Fails with
    /// [`ContextError::ClaimNotPrepared`] when the claim is not (or no longer) prepared.
    pub async fn update_driver_state<T: Serialize>(
        &self,
        claim_uid: &str,
        state: &T,
    ) -> Result<(), ContextError> {
        let value = crate::claim::encode_state(state)?;
        let inside = CLAIM_IN_PROGRESS
            .try_with(|uid| uid == claim_uid)
            .unwrap_or(false);
        if inside {
            return Err(ContextError::InsideClaimOperation {
                claim_uid: claim_uid.to_owned(),
            });
        }
        let _guard = self.inner.locks.lock(claim_uid).await;
        let uid = claim_uid.to_owned();
        let updated = self
            .blocking(move |checkpoint| checkpoint.set_driver_state(&uid, Some(value)))
            .await?;
        if !updated {
            return Err(ContextError::ClaimNotPrepared {
                claim_uid: claim_uid.to_owned(),
            });
        }
        tracing::debug!(claim.uid = %claim_uid, "driver state updated");
        Ok(())
    }

    /// Runs a checkpoint call off the runtime: it may wait for another instance's file lock.
    async fn blocking<T: Send + 'static>(
        &self,
        call: impl FnOnce(&Checkpoint) -> Result<T, CheckpointError> + Send + 'static,
    ) -> Result<T, ContextError> {
        let checkpoint = Arc::clone(&self.inner.checkpoint);
        match tokio::task::spawn_blocking(move || call(&checkpoint)).await {
            Ok(result) => result.map_err(ContextError::from),
            Err(join_error) => Err(ContextError::Checkpoint(CheckpointError::Read {
                path: self.inner.checkpoint.path().to_path_buf(),
                source: std::io::Error::other(format!("checkpoint task failed: {join_error}")),
            })),
        }
    }

    // Plugin side.

    /// The health source the plugin serves when the driver reports health through the context.
    pub(crate) fn health_source(&self) -> HealthSource {
        self.inner.health_source.clone()
    }

    /// What the publisher should start with: the driver's resources with state taints, if any
    /// were given or published.
    /// Why the plugin cannot prepare `device` of `pool`: the plugin publishes resources, and
    /// not that pool, or not that device in it. `None` when it publishes the device, or when
    /// it publishes nothing itself (another component publishes the driver's devices).
    ///
    /// An allocation from a pool the plugin does not publish comes from slices of an earlier
    /// inventory (a plugin restarted with other devices, before its stale slices were
    /// replaced): preparing it as one of the new devices would hand that device out twice.
    pub(crate) fn unpublished(&self, pool: &str, device: &str) -> Option<String> {
        let slices = self.slices();
        let resources = slices.base.as_ref()?;
        let Some(published) = resources.pools.get(pool) else {
            let pools: Vec<&str> = resources.pools.keys().map(String::as_str).collect();
            return Some(format!(
                "device {device} was allocated from pool {pool:?}, which this plugin does not \
                 publish (it publishes {}): the allocation comes from stale ResourceSlices; \
                 delete the claim's pods so that it is allocated again",
                if pools.is_empty() {
                    "no pool".to_owned()
                } else {
                    format!("pool {}", pools.join(", "))
                }
            ));
        };
        if published.devices.iter().any(|d| d.name == device) {
            return None;
        }
        Some(format!(
            "device {device} was allocated from pool {pool:?}, which has no such device now: \
             the allocation comes from stale ResourceSlices; delete the claim's pods so that it \
             is allocated again"
        ))
    }

    pub(crate) fn initial_resources(&self) -> Option<DriverResources> {
        self.slices().merged()
    }

    /// Gives the context the plugin's API client, for [`device_status`](Self::device_status).
    pub(crate) fn attach_client(&self, client: kube::Client) {
        let writer = DeviceStatusWriter::new(client.clone(), self.inner.driver_name.clone());
        // Attached once, at start; a second call would carry the same client.
        let _ = self.inner.device_status.set(Arc::new(writer));
        let _ = self.inner.client.set(client);
    }

    /// The plugin's API client (the one given to the plugin builder), for drivers that manage
    /// objects of their own, for example the NVIDIA driver's MPS control-daemon Deployments.
    /// Attached before [`Driver::start`](crate::driver::Driver::start) runs; cheap to clone.
    pub fn client(&self) -> Result<kube::Client, ContextError> {
        self.inner
            .client
            .get()
            .cloned()
            .ok_or(ContextError::NoApiClient)
    }

    /// The writer of this driver's entries in claims' `status.devices` (KEP-4817): one
    /// server-side apply per claim per change, the driver name as field manager, other drivers'
    /// entries kept. Call [`DeviceStatusWriter::clear`] when a claim is unprepared. Needs the
    /// RBAC in [`crate::device_status`]; a refusal leaves the claim prepared.
    ///
    /// ```no_run
    /// # async fn demo(ctx: dra_sdk::context::DriverContext, claim: dra_sdk::claim::ClaimRef)
    /// # -> Result<(), Box<dyn std::error::Error>> {
    /// use dra_sdk::device_status::DeviceStatus;
    ///
    /// let status = DeviceStatus::new("node-1", "eth1").ready("Configured", "link up");
    /// ctx.device_status()?.apply(&claim, &[status]).await?;
    /// # Ok(()) }
    /// ```
    pub fn device_status(&self) -> Result<Arc<DeviceStatusWriter>, ContextError> {
        self.inner
            .device_status
            .get()
            .cloned()
            .ok_or(ContextError::NoApiClient)
    }

    /// Connects the running publisher; anything published since
    /// [`initial_resources`](Self::initial_resources) is sent right away.
    pub(crate) fn attach_publisher(&self, publisher: Option<SliceUpdater>) {
        let mut slices = self.slices();
        match publisher {
            Some(publisher) => {
                slices.publisher = Some(publisher);
                slices.push();
            }
            None => slices.publishing_disabled = true,
        }
    }

    /// Cancels the driver's token: the plugin is stopping.
    pub(crate) fn cancel(&self) {
        self.inner.shutdown.cancel();
    }
}

/// The guide's examples, compiled and run as doc tests; its context example needs the test kit.
#[cfg(doctest)]
#[doc = include_str!("../../docs/guide.md")]
pub struct GuideDoctests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slices::{Device, DeviceTaint, TaintEffect};

    fn context(dir: &std::path::Path) -> DriverContext {
        let (checkpoint, _) = Checkpoint::open(dir, "boot").unwrap();
        DriverContext::new(
            "gpu.example.com".into(),
            "node-a".into(),
            Arc::new(checkpoint),
            ClaimLocks::default(),
            Some(DriverResources::single_pool(
                "node-a",
                vec![Device::new("gpu-0"), Device::new("gpu-1")],
            )),
        )
    }

    fn xid() -> DeviceTaint {
        DeviceTaint::new("gpu.example.com/xid", TaintEffect::NoExecute).value("79")
    }

    #[tokio::test]
    async fn the_api_client_is_there_once_the_plugin_attached_it() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        assert!(matches!(ctx.client(), Err(ContextError::NoApiClient)));
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        ctx.attach_client(kube::Client::try_from(config).unwrap());
        assert!(ctx.client().is_ok());
        assert!(ctx.device_status().is_ok());
    }

    #[tokio::test]
    async fn state_taints_are_merged_into_the_published_devices_and_removed_on_recovery() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        ctx.set_device_state(DeviceState::unhealthy("node-a", "gpu-1", "XID 79").with_taint(xid()));
        let merged = ctx.initial_resources().unwrap();
        let devices = &merged.pools["node-a"].devices;
        assert!(devices[0].taints.is_empty());
        assert_eq!(devices[1].taints, [xid()]);
        assert_eq!(ctx.health_source().current().len(), 1);
        // The driver's own resources are kept apart from the taints.
        assert!(
            ctx.resources().unwrap().pools["node-a"].devices[1]
                .taints
                .is_empty()
        );

        ctx.set_device_state(DeviceState::healthy("node-a", "gpu-1"));
        let merged = ctx.initial_resources().unwrap();
        assert!(merged.pools["node-a"].devices[1].taints.is_empty());
        ctx.clear_device_state("node-a", "gpu-1");
        assert!(ctx.health_source().current().is_empty());
    }

    #[tokio::test]
    async fn a_taint_the_driver_publishes_itself_is_not_duplicated() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        ctx.publish(DriverResources::single_pool(
            "node-a",
            vec![Device::new("gpu-0").taint(xid())],
        ))
        .unwrap();
        ctx.set_device_states([DeviceState::unhealthy("node-a", "gpu-0", "x").with_taint(xid())]);
        assert_eq!(
            ctx.initial_resources().unwrap().pools["node-a"].devices[0]
                .taints
                .len(),
            1
        );
    }

    #[tokio::test]
    async fn publishing_fails_once_the_plugin_runs_without_a_publisher() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        ctx.attach_publisher(None);
        assert!(matches!(
            ctx.publish(DriverResources::new()),
            Err(ContextError::NotPublishing)
        ));
    }

    #[tokio::test]
    async fn driver_state_of_an_unknown_claim_is_not_updated() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        let error = ctx.update_driver_state("nope", &1).await.unwrap_err();
        assert!(
            matches!(error, ContextError::ClaimNotPrepared { .. }),
            "{error}"
        );
        let inside = CLAIM_IN_PROGRESS
            .scope("uid-1".to_owned(), ctx.update_driver_state("uid-1", &1))
            .await
            .unwrap_err();
        assert!(
            matches!(inside, ContextError::InsideClaimOperation { .. }),
            "{inside}"
        );
    }
}
