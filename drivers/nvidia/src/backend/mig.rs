//! Changing MIG state (dynamic MIG, gate `DynamicMIG`): [`MigManager`] is the one trait that
//! *changes* MIG state (create and destroy GPU and compute instances, MIG mode);
//! [`GpuBackend`](super::GpuBackend) stays read-only. The mock backend and the NVML backend
//! implement both.
//!
//! What a MIG-capable GPU publishes is in [`devices::counters`](crate::devices::counters); the
//! driver side (prepare, unprepare, rollback, start-up clean-up) is in `driver/dynamic_mig.rs`;
//! the user documentation in `drivers/nvidia/docs/dynamic-mig.md`.

use std::fmt;

use super::{BackendError, ComputeCapability, MigMode, MigPlacement};

/// Changes MIG state on a GPU. Every call is synchronous (NVML is); the driver runs them on
/// a blocking thread, one GPU at a time.
///
/// GPUs are addressed by UUID. Instances are created with the compute-instance profile that
/// spans the whole GPU instance (one compute instance per GPU instance, as upstream).
pub trait MigManager: Send + Sync + fmt::Debug {
    /// Creates a GPU instance of the GPU-instance profile `profile_id` (the ID `nvidia-smi mig
    /// -lgip` prints) at `placement`; returns its GPU instance ID.
    fn create_gpu_instance(
        &self,
        gpu_uuid: &str,
        profile_id: u32,
        placement: MigPlacement,
    ) -> Result<u32, MigError>;

    /// Creates the compute instance that spans GPU instance `gpu_instance_id`; returns its
    /// compute instance ID.
    fn create_compute_instance(
        &self,
        gpu_uuid: &str,
        gpu_instance_id: u32,
    ) -> Result<u32, MigError>;

    /// Destroys a compute instance. An instance that does not exist is not an error.
    fn destroy_compute_instance(
        &self,
        gpu_uuid: &str,
        gpu_instance_id: u32,
        compute_instance_id: u32,
    ) -> Result<(), MigError>;

    /// Destroys a GPU instance (its compute instances must be gone). An instance that does
    /// not exist is not an error.
    fn destroy_gpu_instance(&self, gpu_uuid: &str, gpu_instance_id: u32) -> Result<(), MigError>;

    /// The GPU instances of a GPU, with their compute instances. Unlike
    /// [`GpuBackend::mig_devices`](crate::backend::GpuBackend::mig_devices), this lists GPU
    /// instances without a compute instance (a prepare interrupted between the two creates).
    fn gpu_instances(&self, gpu_uuid: &str) -> Result<Vec<GpuInstanceInfo>, MigError>;

    /// Turns MIG mode on or off; returns the mode after the call (`pending` differs from
    /// `current` when the GPU needs a reset for the change to take effect). Only called on
    /// GPUs that [`can_toggle_mig_mode`].
    fn set_mig_mode(&self, gpu_uuid: &str, enabled: bool) -> Result<MigMode, MigError>;
}

/// A GPU instance, as [`MigManager::gpu_instances`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GpuInstanceInfo {
    /// GPU instance ID.
    pub gpu_instance_id: u32,
    /// GPU-instance profile ID.
    pub profile_id: u32,
    /// Placement in memory slices.
    pub placement: MigPlacement,
    /// Its compute instances' IDs (empty: none was created).
    pub compute_instance_ids: Vec<u32>,
}

impl GpuInstanceInfo {
    /// A GPU instance.
    pub fn new(
        gpu_instance_id: u32,
        profile_id: u32,
        placement: MigPlacement,
        compute_instance_ids: Vec<u32>,
    ) -> Self {
        Self {
            gpu_instance_id,
            profile_id,
            placement,
            compute_instance_ids,
        }
    }
}

/// Why a MIG operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MigError {
    /// The backend refused or failed the call.
    #[error("{operation} on {gpu}: {reason}")]
    Failed {
        /// What was asked (`creating GPU instance 1g.10gb (19) at 0:1`).
        operation: String,
        /// The GPU's UUID.
        gpu: String,
        /// Why.
        reason: String,
    },
    /// The placement is taken by another GPU instance.
    #[error("{gpu}: placement {placement} is taken by GPU instance {gpu_instance_id}")]
    PlacementTaken {
        /// The GPU's UUID.
        gpu: String,
        /// The placement asked for.
        placement: MigPlacement,
        /// The instance holding (part of) it.
        gpu_instance_id: u32,
    },
    /// The backend cannot change MIG state.
    #[error("the {backend} backend cannot change MIG state: {what}")]
    Unsupported {
        /// The backend.
        backend: String,
        /// What was asked.
        what: String,
    },
    /// A read of the hardware failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl MigError {
    /// The GPU asked about does not exist (any more): what was on it is gone with it.
    pub fn gpu_is_gone(&self) -> bool {
        matches!(self, Self::Backend(BackendError::NoSuchGpu { .. }))
    }
}

/// Whether the GPU switches MIG mode without a reset: Hopper (compute capability 9.0) and
/// later. Ampere (8.0) needs a GPU reset, which a running node (or a cloud VM without reset
/// support, upstream #883) may not be able to do, so the driver never toggles it.
pub fn can_toggle_mig_mode(capability: ComputeCapability) -> bool {
    capability >= ComputeCapability::new(9, 0)
}

/// Whether the GPU waits for a reset: a MIG mode change is pending. Nothing that changes MIG
/// state is done on such a GPU (upstream #883: destroying instances or toggling the mode
/// there leaves the GPU in "requires reset" on machines that cannot reset it).
pub fn needs_reset(mode: Option<MigMode>) -> bool {
    mode.is_some_and(|mode| mode.current != mode.pending)
}

/// One call a [`MigManager`] received, as the mock backend records them (tests assert the
/// exact sequence).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MigCall {
    /// [`MigManager::create_gpu_instance`].
    CreateGpuInstance {
        /// GPU UUID.
        gpu: String,
        /// GPU-instance profile ID.
        profile_id: u32,
        /// Placement.
        placement: MigPlacement,
    },
    /// [`MigManager::create_compute_instance`].
    CreateComputeInstance {
        /// GPU UUID.
        gpu: String,
        /// GPU instance ID.
        gpu_instance_id: u32,
    },
    /// [`MigManager::destroy_compute_instance`].
    DestroyComputeInstance {
        /// GPU UUID.
        gpu: String,
        /// GPU instance ID.
        gpu_instance_id: u32,
        /// Compute instance ID.
        compute_instance_id: u32,
    },
    /// [`MigManager::destroy_gpu_instance`].
    DestroyGpuInstance {
        /// GPU UUID.
        gpu: String,
        /// GPU instance ID.
        gpu_instance_id: u32,
    },
    /// [`MigManager::set_mig_mode`].
    SetMigMode {
        /// GPU UUID.
        gpu: String,
        /// The mode asked for.
        enabled: bool,
    },
}

impl MigCall {
    /// The kind of call, for fault injection.
    pub fn kind(&self) -> MigCallKind {
        match self {
            Self::CreateGpuInstance { .. } => MigCallKind::CreateGpuInstance,
            Self::CreateComputeInstance { .. } => MigCallKind::CreateComputeInstance,
            Self::DestroyComputeInstance { .. } => MigCallKind::DestroyComputeInstance,
            Self::DestroyGpuInstance { .. } => MigCallKind::DestroyGpuInstance,
            Self::SetMigMode { .. } => MigCallKind::SetMigMode,
        }
    }
}

/// The kinds of [`MigCall`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MigCallKind {
    /// Creating a GPU instance.
    CreateGpuInstance,
    /// Creating a compute instance.
    CreateComputeInstance,
    /// Destroying a compute instance.
    DestroyComputeInstance,
    /// Destroying a GPU instance.
    DestroyGpuInstance,
    /// Setting MIG mode.
    SetMigMode,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hopper_and_later_toggle_mig_mode() {
        assert!(!can_toggle_mig_mode(ComputeCapability::new(8, 0)));
        assert!(can_toggle_mig_mode(ComputeCapability::new(9, 0)));
        assert!(can_toggle_mig_mode(ComputeCapability::new(10, 0)));
    }

    #[test]
    fn a_pending_mode_change_needs_a_reset() {
        assert!(!needs_reset(None));
        assert!(!needs_reset(Some(MigMode::settled(true))));
        assert!(needs_reset(Some(MigMode {
            current: false,
            pending: true
        })));
    }
}
