//! Dynamic MIG in the driver (gate `DynamicMIG`): a MIG partition's GPU and compute instance
//! created at prepare, destroyed at unprepare, rolled back when prepare fails half-way, and
//! instances no completed claim owns destroyed at start.
//!
//! # What the checkpoint holds
//!
//! The SDK writes the claim's record as `PrepareStarted` before it calls prepare (the intent:
//! this claim, with its allocation naming GPU, profile and placement), and `PrepareCompleted`
//! with the driver state after. The driver state of a partition is a [`MigInstance`]: the
//! GPU, profile, placement and the GPU and compute instance IDs the hardware assigned, and the
//! MIG UUID. A prepare that fails destroys what it created before it returns. One the plugin
//! did not survive leaves a `PrepareStarted` record without instance IDs, which the SDK rolls
//! back (nothing to undo for the driver), and possibly an instance: the start-up clean-up
//! ([`reconcile`]) destroys every instance that no `PrepareCompleted` claim records.
//!
//! # Shared partitions
//!
//! With consumable shares (`--consumable-shares`) the scheduler allocates one partition to
//! several claims (each with a share ID), which the node checks have identical configs. The
//! first claim's prepare creates the instance, the others reuse it, and it is destroyed when
//! the last of them is unprepared. [`MigInstances`] keeps, for each partition with an
//! instance, the instance and the claims holding it; every claim's checkpoint record names
//! the instance, so the holders are rebuilt at start.
//!
//! # Serialization
//!
//! MIG operations of this process run one at a time ([`MigInstances`]): turning MIG mode off when
//! the last instance of a GPU goes must not race with a prepare that just turned it on, and
//! the clean-up must not see a prepare's instance before its claim is recorded. Across
//! processes (a rolling update runs two plugins on a node) the plugin opts into the SDK's
//! node-wide serialization (`serialize_operations`) when the gate is on: the start-up
//! clean-up of the new plugin holds the same lock as the old plugin's prepares.
//!
//! # GPUs that need a reset
//!
//! A GPU whose MIG mode change is pending (it needs a reset, upstream #883) is never changed:
//! it is not partitionable (its instances are published as static MIG devices), and the
//! clean-up leaves its instances alone and reports them ([`KeptMigInstance`], a warning in the
//! log). MIG mode is toggled only on GPUs that switch without a reset (Hopper and later).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use dra_sdk::cdi::ContainerEdits;
use dra_sdk::claim::DriverError;
use serde::{Deserialize, Serialize};

use super::{ClaimState, Inner, PreparedKind, device_error};
use crate::backend::mig::{MigError, MigManager, can_toggle_mig_mode, needs_reset};
use crate::backend::{GpuInfo, MigPlacement, MigProfileInfo};
use crate::devices::MigPartition;
use crate::host::facts;

/// A MIG partition prepared for a claim: what unprepare destroys. The `driver_state` entry
/// of the device, with `"type": "migdyn"`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigInstance {
    /// `MIG-…`.
    pub uuid: String,
    /// The GPU's UUID.
    #[serde(rename = "parentUUID")]
    pub parent_uuid: String,
    /// The GPU's minor.
    pub parent_minor: u32,
    /// GPU-instance profile ID.
    #[serde(rename = "profileID")]
    pub profile_id: u32,
    /// First memory slice of the placement.
    pub placement_start: u32,
    /// Memory slices of the placement.
    pub placement_size: u32,
    /// GPU instance ID the hardware assigned.
    #[serde(rename = "gpuInstanceID")]
    pub gpu_instance_id: u32,
    /// Compute instance ID the hardware assigned.
    #[serde(rename = "computeInstanceID")]
    pub compute_instance_id: u32,
}

impl MigInstance {
    /// The placement.
    pub fn placement(&self) -> MigPlacement {
        MigPlacement::new(self.placement_start, self.placement_size)
    }
}

/// The partitions of this node with an instance, by device name, and the claims holding
/// each; its lock is also the process-wide lock of MIG operations (see the
/// [module docs](self)).
#[derive(Debug, Default)]
pub(super) struct MigInstances(Mutex<BTreeMap<String, LivePartition>>);

/// A partition's instance and the UIDs of the claims holding it (none: its destruction
/// failed, and is tried again by the next unprepare).
#[derive(Debug)]
pub(super) struct LivePartition {
    instance: MigInstance,
    holders: BTreeSet<String>,
}

type Live = BTreeMap<String, LivePartition>;

impl MigInstances {
    fn hold(&self) -> MutexGuard<'_, Live> {
        // Every update is one insert or one remove: a panicking holder leaves it consistent.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Replaces what is known with the partitions the prepared claims record, `(uid, state)`
    /// (at start, from the checkpoint).
    pub(super) fn restore<'a>(&self, claims: impl IntoIterator<Item = (&'a str, &'a ClaimState)>) {
        let mut live = Live::new();
        for (uid, state) in claims {
            for device in &state.devices {
                if let PreparedKind::MigDynamic(instance) = &device.kind {
                    live.entry(device.device.clone())
                        .or_insert_with(|| LivePartition {
                            instance: instance.clone(),
                            holders: BTreeSet::new(),
                        })
                        .holders
                        .insert(uid.to_owned());
                }
            }
        }
        *self.hold() = live;
    }
}

/// A partition resolved at prepare: the GPU, the profile and the placement.
#[derive(Clone, Debug)]
pub(super) struct PlannedPartition {
    pub(super) parent: GpuInfo,
    pub(super) profile: MigProfileInfo,
    pub(super) placement: MigPlacement,
}

impl From<&MigPartition> for PlannedPartition {
    fn from(partition: &MigPartition) -> Self {
        Self {
            parent: partition.parent.clone(),
            profile: partition.profile.clone(),
            placement: partition.placement,
        }
    }
}

fn manager(inner: &Inner) -> Result<&dyn MigManager, DriverError> {
    inner.mig.as_deref().ok_or_else(|| {
        DriverError::Unavailable(
            "dynamic MIG is on but the driver has no MIG manager (NvidiaDriverBuilder::mig_manager)"
                .to_owned(),
        )
    })
}

/// Gives claim `uid` the partition's instance, with its container edits: the one that
/// exists already (another claim's share, or an earlier attempt of this claim), or a GPU and
/// compute instance created now. Undoes what it created when a later step fails, so an
/// error leaves the GPU as it was. Claim `uid` holds the instance until [`release`].
pub(super) fn create(
    inner: &Inner,
    uid: &str,
    device: &str,
    plan: &PlannedPartition,
) -> Result<(ContainerEdits, MigInstance), DriverError> {
    let mig = manager(inner)?;
    let gpu = &plan.parent.uuid;
    let mut live = inner.mig_instances.hold();
    let instances = |what: &str| {
        inner
            .backend
            .mig_devices(gpu)
            .map_err(|error| device_error(device, format!("{what}: {error}")))
    };

    if let Some(partition) = live.get_mut(device) {
        let instance = partition.instance.clone();
        if instances("listing the MIG devices")?
            .iter()
            .any(|existing| existing.uuid == instance.uuid)
        {
            let edits = inner
                .cdi
                .mig(
                    instance.parent_minor,
                    instance.gpu_instance_id,
                    instance.compute_instance_id,
                )
                .map_err(|error| device_error(device, error))?;
            partition.holders.insert(uid.to_owned());
            tracing::debug!(%gpu, device, holders = partition.holders.len(), "MIG partition reused");
            return Ok((edits, instance));
        }
        // Destroyed behind our back: made again below.
        tracing::warn!(%gpu, device, uuid = %instance.uuid, "a prepared MIG partition is gone; creating it again");
        live.remove(device);
    }

    let mode = inner
        .backend
        .mig_mode(gpu)
        .map_err(|error| device_error(device, format!("reading the MIG mode: {error}")))?;
    if needs_reset(mode) {
        return Err(device_error(
            device,
            "the GPU waits for a reset (a MIG mode change is pending); no MIG instance is \
             created on it",
        ));
    }
    if !mode.is_some_and(|mode| mode.current) {
        if !can_toggle_mig_mode(plan.parent.cuda_compute_capability) {
            return Err(device_error(
                device,
                "MIG mode is off and this GPU cannot turn it on without a reset",
            ));
        }
        let now = mig
            .set_mig_mode(gpu, true)
            .map_err(|error| device_error(device, error))?;
        if !now.current {
            // NVML left the change pending: something holds the GPU. Say what, and undo the
            // pending change so the GPU does not switch at its next reset behind everyone's
            // back.
            let node = format!("/dev/nvidia{}", plan.parent.minor);
            let holders = match facts::node_holders(inner.host.as_ref(), Path::new(&node)) {
                Ok(holders) if !holders.is_empty() => holders
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                Ok(_) => "no process this plugin can see".to_owned(),
                Err(error) => format!("(the holders cannot be listed: {error})"),
            };
            let reverted = match mig.set_mig_mode(gpu, false) {
                Ok(_) => "the pending change was reverted".to_owned(),
                Err(error) => format!("reverting the pending change failed: {error}"),
            };
            return Err(device_error(
                device,
                format!(
                    "turning MIG mode on is pending: the GPU is in use ({node} held by \
                     {holders}); {reverted}; retry when the GPU is idle"
                ),
            ));
        }
    }

    let placement = plan.placement;
    let gpu_instance_id = mig
        .create_gpu_instance(gpu, plan.profile.id, placement)
        .map_err(|error| {
            mode_off_if_unused(inner, mig, &plan.parent);
            device_error(device, creation_error(&plan.profile, error))
        })?;
    let undo = |compute_instance: Option<u32>| {
        if let Some(ci) = compute_instance
            && let Err(error) = mig.destroy_compute_instance(gpu, gpu_instance_id, ci)
        {
            tracing::error!(%gpu, gpu_instance_id, ci, %error, "rolling back a compute instance failed");
            return;
        }
        if let Err(error) = mig.destroy_gpu_instance(gpu, gpu_instance_id) {
            tracing::error!(%gpu, gpu_instance_id, %error, "rolling back a GPU instance failed");
            return;
        }
        mode_off_if_unused(inner, mig, &plan.parent);
    };
    let compute_instance_id = match mig.create_compute_instance(gpu, gpu_instance_id) {
        Ok(id) => id,
        Err(error) => {
            undo(None);
            return Err(device_error(device, error));
        }
    };
    let result = instances("reading the new MIG device").and_then(|devices| {
        let uuid = devices
            .into_iter()
            .find(|existing| {
                existing.gpu_instance_id == gpu_instance_id
                    && existing.compute_instance_id == compute_instance_id
            })
            .map(|existing| existing.uuid)
            .ok_or_else(|| {
                device_error(
                    device,
                    format!(
                        "GPU instance {gpu_instance_id} / compute instance {compute_instance_id} \
                         was created but the GPU does not list it"
                    ),
                )
            })?;
        let edits = inner
            .cdi
            .mig(plan.parent.minor, gpu_instance_id, compute_instance_id)
            .map_err(|error| device_error(device, error))?;
        Ok((edits, uuid))
    });
    match result {
        Ok((edits, uuid)) => {
            tracing::info!(%gpu, device, gpu_instance_id, compute_instance_id, %uuid, "MIG partition created");
            let instance = MigInstance {
                uuid,
                parent_uuid: plan.parent.uuid.clone(),
                parent_minor: plan.parent.minor,
                profile_id: plan.profile.id,
                placement_start: placement.start,
                placement_size: placement.size,
                gpu_instance_id,
                compute_instance_id,
            };
            live.insert(
                device.to_owned(),
                LivePartition {
                    instance: instance.clone(),
                    holders: BTreeSet::from([uid.to_owned()]),
                },
            );
            Ok((edits, instance))
        }
        Err(error) => {
            undo(Some(compute_instance_id));
            Err(error)
        }
    }
}

fn creation_error(profile: &MigProfileInfo, error: MigError) -> String {
    match error {
        MigError::PlacementTaken {
            placement,
            gpu_instance_id,
            ..
        } => format!(
            "placement {placement} of {} is taken by GPU instance {gpu_instance_id}, which no \
             prepared claim of this node explains (made by hand, or by a plugin that did not \
             clean up)",
            profile.name
        ),
        other => other.to_string(),
    }
}

/// Claim `uid` lets go of partition `device`, whose instance it recorded as `instance`; the
/// instance is destroyed (compute instance, then GPU instance) unless another claim still
/// holds it. An instance already gone is no error, so unprepare can be retried.
pub(super) fn release(
    inner: &Inner,
    uid: &str,
    device: &str,
    instance: &MigInstance,
) -> Result<(), String> {
    let mut live = inner.mig_instances.hold();
    let Some(partition) = live.get_mut(device) else {
        // No claim is known to hold it: destroy what the claim recorded.
        return destroy(inner, instance);
    };
    partition.holders.remove(uid);
    if !partition.holders.is_empty() {
        tracing::info!(gpu = %instance.parent_uuid, device, holders = partition.holders.len(), "MIG partition kept: other claims share it");
        return Ok(());
    }
    let instance = partition.instance.clone();
    destroy(inner, &instance)?;
    live.remove(device);
    Ok(())
}

/// Destroys an instance; the caller holds [`MigInstances`]. An instance whose GPU is gone
/// (lost, removed, or another inventory after a restart) went with it: there is nothing left
/// to undo, and failing would keep the claim's pod from ever terminating.
fn destroy(inner: &Inner, instance: &MigInstance) -> Result<(), String> {
    let mig = manager(inner).map_err(|error| error.to_string())?;
    let gpu = &instance.parent_uuid;
    let instances = match mig.gpu_instances(gpu) {
        Ok(instances) => instances,
        Err(error) if error.gpu_is_gone() => {
            tracing::warn!(%gpu, gpu_instance_id = instance.gpu_instance_id, uuid = %instance.uuid, %error, "the GPU of this MIG partition is gone; nothing to destroy");
            return Ok(());
        }
        Err(error) => return Err(error.to_string()),
    };
    let exists = instances
        .into_iter()
        .find(|existing| existing.gpu_instance_id == instance.gpu_instance_id);
    let Some(existing) = exists else {
        return Ok(());
    };
    if existing.placement != instance.placement() || existing.profile_id != instance.profile_id {
        // The ID was reused by another instance: this claim's is gone already.
        return Ok(());
    }
    if existing
        .compute_instance_ids
        .contains(&instance.compute_instance_id)
    {
        mig.destroy_compute_instance(gpu, instance.gpu_instance_id, instance.compute_instance_id)
            .map_err(|error| error.to_string())?;
    }
    mig.destroy_gpu_instance(gpu, instance.gpu_instance_id)
        .map_err(|error| error.to_string())?;
    tracing::info!(%gpu, gpu_instance_id = instance.gpu_instance_id, uuid = %instance.uuid, "MIG partition destroyed");
    if let Ok(Some(parent)) = inner.backend.gpu(gpu) {
        mode_off_if_unused(inner, mig, &parent);
    }
    Ok(())
}

/// On a GPU that switches MIG mode without a reset, turns MIG off once no instance is left,
/// so the full GPU can run work again (as upstream). Failures are logged: the next prepare
/// of a partition finds MIG on, which is fine.
fn mode_off_if_unused(inner: &Inner, mig: &dyn MigManager, gpu: &GpuInfo) {
    if !can_toggle_mig_mode(gpu.cuda_compute_capability) {
        return;
    }
    let on = matches!(inner.backend.mig_mode(&gpu.uuid), Ok(Some(mode)) if mode.current);
    let empty = mig
        .gpu_instances(&gpu.uuid)
        .is_ok_and(|instances| instances.is_empty());
    if on
        && empty
        && let Err(error) = mig.set_mig_mode(&gpu.uuid, false)
    {
        tracing::warn!(gpu = %gpu.uuid, %error, "turning MIG mode off again failed");
    }
}

/// A MIG instance the start-up clean-up found without a completed claim.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OrphanMigInstance {
    /// The GPU's UUID.
    pub gpu: String,
    /// GPU instance ID.
    pub gpu_instance_id: u32,
    /// GPU-instance profile ID.
    pub profile_id: u32,
    /// Placement.
    pub placement: MigPlacement,
}

/// An orphan left alone, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeptMigInstance {
    /// The instance.
    pub instance: OrphanMigInstance,
    /// Why it was not destroyed.
    pub reason: String,
}

/// What the start-up clean-up did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MigCleanup {
    /// Orphans destroyed.
    pub destroyed: Vec<OrphanMigInstance>,
    /// Orphans left alone: on GPUs that need a reset.
    pub kept: Vec<KeptMigInstance>,
    /// What failed, one message each.
    pub failures: Vec<String>,
}

/// Destroys the MIG instances on this node that no completed claim records (see the
/// [module docs](self)), except on GPUs that need a reset.
/// `completed` holds `(uid, state)` of each completed claim; they hold their partitions from
/// now on.
#[tracing::instrument(skip_all)]
pub(super) fn reconcile(inner: &Inner, completed: &[(&str, &ClaimState)]) -> MigCleanup {
    let mut cleanup = MigCleanup::default();
    let Some(mig) = inner.mig.as_deref() else {
        cleanup
            .failures
            .push("dynamic MIG is on but the driver has no MIG manager".to_owned());
        return cleanup;
    };
    let owned: BTreeSet<(String, u32)> = completed
        .iter()
        .flat_map(|(_, state)| &state.devices)
        .filter_map(|device| match &device.kind {
            PreparedKind::MigDynamic(instance) => {
                Some((instance.parent_uuid.clone(), instance.gpu_instance_id))
            }
            _ => None,
        })
        .collect();
    let _lock = inner.mig_instances.hold();
    let gpus = match inner.backend.gpus() {
        Ok(gpus) => gpus,
        Err(error) => {
            cleanup.failures.push(format!("listing the GPUs: {error}"));
            return cleanup;
        }
    };
    for gpu in &gpus {
        let mode = match inner.backend.mig_mode(&gpu.uuid) {
            Ok(Some(mode)) => mode,
            Ok(None) => continue,
            Err(error) => {
                cleanup
                    .failures
                    .push(format!("reading the MIG mode of {}: {error}", gpu.uuid));
                continue;
            }
        };
        let instances = match mig.gpu_instances(&gpu.uuid) {
            Ok(instances) => instances,
            Err(error) => {
                cleanup.failures.push(format!(
                    "listing the GPU instances of {}: {error}",
                    gpu.uuid
                ));
                continue;
            }
        };
        for instance in instances {
            if owned.contains(&(gpu.uuid.clone(), instance.gpu_instance_id)) {
                continue;
            }
            let orphan = OrphanMigInstance {
                gpu: gpu.uuid.clone(),
                gpu_instance_id: instance.gpu_instance_id,
                profile_id: instance.profile_id,
                placement: instance.placement,
            };
            if needs_reset(Some(mode)) {
                cleanup.kept.push(KeptMigInstance {
                    instance: orphan,
                    reason: "the GPU waits for a reset (a MIG mode change is pending); \
                             changing it could leave it unusable until one (upstream #883)"
                        .to_owned(),
                });
                continue;
            }
            let destroyed = instance
                .compute_instance_ids
                .iter()
                .try_for_each(|ci| {
                    mig.destroy_compute_instance(&gpu.uuid, instance.gpu_instance_id, *ci)
                })
                .and_then(|()| mig.destroy_gpu_instance(&gpu.uuid, instance.gpu_instance_id));
            match destroyed {
                Ok(()) => cleanup.destroyed.push(orphan),
                Err(error) => cleanup.failures.push(format!(
                    "destroying orphan GPU instance {} of {}: {error}",
                    instance.gpu_instance_id, gpu.uuid
                )),
            }
        }
    }
    // MIG mode is left as found: turning it off here would change the devices published
    // at start (the full GPU of a GPU in MIG mode is not).
    cleanup
}
