//! The mock backend's persistence mode ([`GpuBackend::persistence_mode`] and
//! [`GpuBackend::set_persistence_mode`]): a flag per GPU, off unless a test turns it on (a
//! profile has no field for it, as a rebooted node has it off), every change recorded,
//! failures injectable. Shared by clones of the backend, like the MIG state.
//!
//! [`GpuBackend::persistence_mode`]: crate::backend::GpuBackend::persistence_mode
//! [`GpuBackend::set_persistence_mode`]: crate::backend::GpuBackend::set_persistence_mode

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::backend::BackendError;

/// A call to the mock's persistence mode, as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PersistenceCall {
    /// `persistence_mode(gpu)`.
    Get {
        /// The GPU's UUID.
        gpu: String,
    },
    /// `set_persistence_mode(gpu, enabled)`.
    Set {
        /// The GPU's UUID.
        gpu: String,
        /// On or off.
        enabled: bool,
    },
}

/// The persistence mode of a [`MockBackend`](super::MockBackend)'s GPUs; shared by clones.
#[derive(Clone, Default)]
pub struct MockPersistence {
    shared: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    enabled: BTreeSet<String>,
    calls: Vec<PersistenceCall>,
    /// GPU → why every change of its mode fails.
    refused: BTreeMap<String, String>,
}

impl fmt::Debug for MockPersistence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state();
        f.debug_struct("MockPersistence")
            .field("enabled", &state.enabled)
            .field("calls", &state.calls.len())
            .finish_non_exhaustive()
    }
}

/// Not part of the machine a profile describes (see `MockMig`'s equality).
impl PartialEq for MockPersistence {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for MockPersistence {}

impl MockPersistence {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every update is one insert, remove or push: a poisoned lock is still consistent.
        self.shared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sets a GPU's mode as an operator (`nvidia-smi -pm`) or a boot script would; not
    /// recorded as a call.
    pub fn set(&self, gpu_uuid: &str, enabled: bool) {
        let mut state = self.state();
        if enabled {
            state.enabled.insert(gpu_uuid.to_owned());
        } else {
            state.enabled.remove(gpu_uuid);
        }
    }

    /// A GPU's mode now.
    pub fn is_enabled(&self, gpu_uuid: &str) -> bool {
        self.state().enabled.contains(gpu_uuid)
    }

    /// Every call received so far, in order.
    pub fn calls(&self) -> Vec<PersistenceCall> {
        self.state().calls.clone()
    }

    /// Makes every change of this GPU's mode fail with `reason` (as NVML's `NO_PERMISSION`
    /// does without root); the calls are still recorded.
    pub fn refuse_changes(&self, gpu_uuid: &str, reason: impl Into<String>) {
        self.state()
            .refused
            .insert(gpu_uuid.to_owned(), reason.into());
    }

    pub(super) fn get(&self, gpu_uuid: &str) -> bool {
        let mut state = self.state();
        state.calls.push(PersistenceCall::Get {
            gpu: gpu_uuid.to_owned(),
        });
        state.enabled.contains(gpu_uuid)
    }

    pub(super) fn change(&self, gpu_uuid: &str, enabled: bool) -> Result<(), BackendError> {
        let mut state = self.state();
        state.calls.push(PersistenceCall::Set {
            gpu: gpu_uuid.to_owned(),
            enabled,
        });
        if let Some(reason) = state.refused.get(gpu_uuid) {
            return Err(BackendError::Query {
                what: "setting persistence mode".into(),
                gpu: Some(gpu_uuid.to_owned()),
                reason: reason.clone(),
            });
        }
        if enabled {
            state.enabled.insert(gpu_uuid.to_owned());
        } else {
            state.enabled.remove(gpu_uuid);
        }
        Ok(())
    }
}
