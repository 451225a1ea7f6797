//! The mock backend's MIG state changes ([`MigManager`]): GPU and compute instances created
//! and destroyed in memory, every call recorded, failures injectable.
//!
//! The state is shared by clones of the backend (like the health events), so the driver's
//! backend and a test's handle see the same machine. Reads through
//! [`GpuBackend`](crate::backend::GpuBackend) (`mig_mode`, `mig_devices`, `inventory`) return
//! the changed state.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{MockBackend, derived_uuid};
use crate::backend::mig::{GpuInstanceInfo, MigCall, MigCallKind, MigError, MigManager};
use crate::backend::{GpuInventory, MigDeviceInfo, MigMode, MigPlacement};

/// GPU instance IDs the mock hands out: 1 to 14, the range NVML uses on A100 and H100.
const GPU_INSTANCE_IDS: std::ops::RangeInclusive<u32> = 1..=14;

/// The changeable MIG state of a [`MockBackend`]: GPU and compute instances created and
/// destroyed in memory, every call recorded, failures injectable; shared by clones of the
/// backend.
#[derive(Clone, Default)]
pub struct MockMig {
    shared: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    /// GPUs whose MIG state changed, by UUID: mode and devices now.
    live: BTreeMap<String, (Option<MigMode>, Vec<MigDeviceInfo>)>,
    calls: Vec<MigCall>,
    /// Injected failures: the next call of a kind fails with the message.
    failures: BTreeMap<MigCallKind, String>,
    /// GPU instances created without a compute instance yet: (GPU, GI) → (profile, placement).
    bare: BTreeMap<(String, u32), (u32, MigPlacement)>,
}

impl fmt::Debug for MockMig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state();
        f.debug_struct("MockMig")
            .field("changed_gpus", &state.live.len())
            .field("calls", &state.calls.len())
            .finish_non_exhaustive()
    }
}

/// The MIG state is not part of the machine a profile describes: two backends of the same
/// profile compare equal whatever instances were created since.
impl PartialEq for MockMig {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for MockMig {}

impl MockMig {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every update is a whole-value insert or push: a panicking holder leaves it usable.
        self.shared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every MIG call received so far, in order.
    pub fn calls(&self) -> Vec<MigCall> {
        self.state().calls.clone()
    }

    /// The calls received so far, forgetting them.
    pub fn take_calls(&self) -> Vec<MigCall> {
        std::mem::take(&mut self.state().calls)
    }

    /// Makes the next call of `kind` fail with `reason` (after it is recorded).
    pub fn fail_next(&self, kind: MigCallKind, reason: impl Into<String>) {
        self.state().failures.insert(kind, reason.into());
    }

    /// Sets a GPU's MIG mode as a reset or an operator would (`pending` ≠ `current`: the GPU
    /// waits for a reset). Not recorded as a call.
    pub fn set_mode(&self, gpu: &GpuInventory, mode: MigMode) {
        let mut state = self.state();
        let entry = state
            .live
            .entry(gpu.info.uuid.clone())
            .or_insert_with(|| (gpu.mig_mode, gpu.mig_devices.clone()));
        entry.0 = Some(mode);
    }

    /// The GPU's mode and MIG devices now.
    pub(super) fn current(&self, gpu: &GpuInventory) -> (Option<MigMode>, Vec<MigDeviceInfo>) {
        match self.state().live.get(&gpu.info.uuid) {
            Some((mode, devices)) => (*mode, devices.clone()),
            None => (gpu.mig_mode, gpu.mig_devices.clone()),
        }
    }
}

impl State {
    /// Records a call; fails it if a failure was injected for its kind.
    fn record(&mut self, call: MigCall, gpu: &str, operation: &str) -> Result<(), MigError> {
        let kind = call.kind();
        self.calls.push(call);
        match self.failures.remove(&kind) {
            Some(reason) => Err(MigError::Failed {
                operation: operation.to_owned(),
                gpu: gpu.to_owned(),
                reason,
            }),
            None => Ok(()),
        }
    }

    fn gpu<'a>(&'a mut self, gpu: &GpuInventory) -> &'a mut (Option<MigMode>, Vec<MigDeviceInfo>) {
        self.live
            .entry(gpu.info.uuid.clone())
            .or_insert_with(|| (gpu.mig_mode, gpu.mig_devices.clone()))
    }
}

fn failed(operation: &str, gpu: &str, reason: impl Into<String>) -> MigError {
    MigError::Failed {
        operation: operation.to_owned(),
        gpu: gpu.to_owned(),
        reason: reason.into(),
    }
}

impl MigManager for MockBackend {
    fn create_gpu_instance(
        &self,
        gpu_uuid: &str,
        profile_id: u32,
        placement: MigPlacement,
    ) -> Result<u32, MigError> {
        let gpu = self.gpu(gpu_uuid)?;
        let operation = format!("creating a GPU instance of profile {profile_id} at {placement}");
        let mut state = self.mig.state();
        state.record(
            MigCall::CreateGpuInstance {
                gpu: gpu_uuid.to_owned(),
                profile_id,
                placement,
            },
            gpu_uuid,
            &operation,
        )?;
        let Some(profile) = gpu.mig_profile(profile_id) else {
            return Err(failed(&operation, gpu_uuid, "no such profile on this GPU"));
        };
        if !profile.placements.contains(&placement) {
            return Err(failed(
                &operation,
                gpu_uuid,
                "not a placement of the profile",
            ));
        }
        let bare: Vec<(u32, MigPlacement)> = state
            .bare
            .iter()
            .filter(|((uuid, _), _)| uuid == gpu_uuid)
            .map(|((_, gi), (_, placement))| (*gi, *placement))
            .collect();
        let (mode, devices) = state.gpu(gpu);
        if !mode.is_some_and(|mode| mode.current) {
            return Err(failed(&operation, gpu_uuid, "MIG mode is off"));
        }
        let taken: Vec<(u32, MigPlacement)> = devices
            .iter()
            .map(|device| (device.gpu_instance_id, device.placement))
            .chain(bare)
            .collect();
        if let Some((gpu_instance_id, _)) =
            taken.iter().find(|(_, other)| other.overlaps(&placement))
        {
            return Err(MigError::PlacementTaken {
                gpu: gpu_uuid.to_owned(),
                placement,
                gpu_instance_id: *gpu_instance_id,
            });
        }
        let Some(id) = GPU_INSTANCE_IDS
            .clone()
            .find(|id| taken.iter().all(|(gi, _)| gi != id))
        else {
            return Err(failed(&operation, gpu_uuid, "no free GPU instance ID"));
        };
        state
            .bare
            .insert((gpu_uuid.to_owned(), id), (profile_id, placement));
        Ok(id)
    }

    fn create_compute_instance(
        &self,
        gpu_uuid: &str,
        gpu_instance_id: u32,
    ) -> Result<u32, MigError> {
        let gpu = self.gpu(gpu_uuid)?;
        let operation = format!("creating the compute instance of GPU instance {gpu_instance_id}");
        let mut state = self.mig.state();
        state.record(
            MigCall::CreateComputeInstance {
                gpu: gpu_uuid.to_owned(),
                gpu_instance_id,
            },
            gpu_uuid,
            &operation,
        )?;
        let key = (gpu_uuid.to_owned(), gpu_instance_id);
        let Some((profile_id, placement)) = state.bare.get(&key).copied() else {
            return Err(failed(
                &operation,
                gpu_uuid,
                "no GPU instance without a compute instance has this ID",
            ));
        };
        let Some(profile) = gpu.mig_profile(profile_id) else {
            return Err(failed(&operation, gpu_uuid, "no such profile on this GPU"));
        };
        let device = MigDeviceInfo {
            uuid: derived_uuid(
                "MIG",
                &format!(
                    "dynamic/{}/{gpu_uuid}/gi{gpu_instance_id}/ci0/{placement}",
                    profile.name
                ),
            ),
            gpu_instance_id,
            compute_instance_id: 0,
            profile_id,
            profile: profile.name.clone(),
            placement,
            memory_bytes: profile.memory_bytes(),
            engines: profile.engines,
        };
        state.bare.remove(&key);
        state.gpu(gpu).1.push(device);
        Ok(0)
    }

    fn destroy_compute_instance(
        &self,
        gpu_uuid: &str,
        gpu_instance_id: u32,
        compute_instance_id: u32,
    ) -> Result<(), MigError> {
        let gpu = self.gpu(gpu_uuid)?;
        let operation = format!(
            "destroying compute instance {compute_instance_id} of GPU instance {gpu_instance_id}"
        );
        let mut state = self.mig.state();
        state.record(
            MigCall::DestroyComputeInstance {
                gpu: gpu_uuid.to_owned(),
                gpu_instance_id,
                compute_instance_id,
            },
            gpu_uuid,
            &operation,
        )?;
        let devices = &mut state.gpu(gpu).1;
        let position = devices.iter().position(|device| {
            device.gpu_instance_id == gpu_instance_id
                && device.compute_instance_id == compute_instance_id
        });
        if let Some(position) = position {
            let device = devices.remove(position);
            // The GPU instance stays, without a compute instance.
            state.bare.insert(
                (gpu_uuid.to_owned(), gpu_instance_id),
                (device.profile_id, device.placement),
            );
        }
        Ok(())
    }

    fn destroy_gpu_instance(&self, gpu_uuid: &str, gpu_instance_id: u32) -> Result<(), MigError> {
        let gpu = self.gpu(gpu_uuid)?;
        let operation = format!("destroying GPU instance {gpu_instance_id}");
        let mut state = self.mig.state();
        state.record(
            MigCall::DestroyGpuInstance {
                gpu: gpu_uuid.to_owned(),
                gpu_instance_id,
            },
            gpu_uuid,
            &operation,
        )?;
        if state
            .gpu(gpu)
            .1
            .iter()
            .any(|device| device.gpu_instance_id == gpu_instance_id)
        {
            return Err(failed(
                &operation,
                gpu_uuid,
                "it still has a compute instance (NVML: In use by another client)",
            ));
        }
        state.bare.remove(&(gpu_uuid.to_owned(), gpu_instance_id));
        Ok(())
    }

    fn gpu_instances(&self, gpu_uuid: &str) -> Result<Vec<GpuInstanceInfo>, MigError> {
        let gpu = self.gpu(gpu_uuid)?;
        let state = self.mig.state();
        let devices = match state.live.get(gpu_uuid) {
            Some((_, devices)) => devices.clone(),
            None => gpu.mig_devices.clone(),
        };
        let mut instances: BTreeMap<u32, GpuInstanceInfo> = BTreeMap::new();
        for device in devices {
            instances
                .entry(device.gpu_instance_id)
                .or_insert_with(|| {
                    GpuInstanceInfo::new(
                        device.gpu_instance_id,
                        device.profile_id,
                        device.placement,
                        Vec::new(),
                    )
                })
                .compute_instance_ids
                .push(device.compute_instance_id);
        }
        for ((uuid, gi), (profile_id, placement)) in &state.bare {
            if uuid == gpu_uuid {
                instances.entry(*gi).or_insert_with(|| {
                    GpuInstanceInfo::new(*gi, *profile_id, *placement, Vec::new())
                });
            }
        }
        Ok(instances.into_values().collect())
    }

    fn set_mig_mode(&self, gpu_uuid: &str, enabled: bool) -> Result<MigMode, MigError> {
        let gpu = self.gpu(gpu_uuid)?;
        let operation = format!("setting MIG mode {}", if enabled { "on" } else { "off" });
        let mut state = self.mig.state();
        state.record(
            MigCall::SetMigMode {
                gpu: gpu_uuid.to_owned(),
                enabled,
            },
            gpu_uuid,
            &operation,
        )?;
        let toggles = crate::backend::mig::can_toggle_mig_mode(gpu.info.cuda_compute_capability);
        let busy = state.bare.keys().any(|(uuid, _)| uuid == gpu_uuid);
        let (mode, devices) = state.gpu(gpu);
        let Some(mode) = mode else {
            return Err(failed(&operation, gpu_uuid, "the GPU does not support MIG"));
        };
        if !enabled && (busy || !devices.is_empty()) {
            return Err(failed(&operation, gpu_uuid, "MIG instances exist"));
        }
        // Ampere takes the new mode at the next reset; Hopper and later at once.
        mode.pending = enabled;
        if toggles {
            mode.current = enabled;
        }
        Ok(*mode)
    }
}
