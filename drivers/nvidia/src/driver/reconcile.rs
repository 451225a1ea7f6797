//! Start-up reconciliation ([`Driver::reconcile`](dra_sdk::driver::Driver::reconcile)):
//! reservations rebuilt from the claims the checkpoint records as completed, and VFIO
//! bindings that no completed claim owns found and reported. This is the only place
//! reservations are restored after a restart: the driver starts with none, and the SDK calls
//! reconcile before the plugin registers with the kubelet, so no prepare can race it.
//!
//! Nothing is destroyed on suspicion. A GPU left on a VFIO driver is given back to its
//! previous driver only when the checkpoint proves this driver moved it there: a claim this
//! process held (prepared it, or reserved it at an earlier reconcile) recorded exactly that
//! binding, and the SDK no longer records that claim as prepared (it rolled it back or
//! dropped it). Every other VFIO-bound GPU is reported and left alone: an administrator, a
//! VM manager or another driver may have bound it on purpose.
//!
//! With `DynamicMIG` the MIG instances are the exception, as upstream: every GPU instance no
//! completed claim records is destroyed, since only this driver creates them under the gate
//! (a prepare the plugin did not survive leaves one); never on a GPU that waits for a reset,
//! whose orphans are reported instead (`driver/dynamic_mig.rs`).

use std::collections::{BTreeMap, BTreeSet};

use dra_sdk::claim::ClaimRef;

use super::{
    ClaimState, Inner, MigCleanup, NvidiaDriver, PreparedKind, Reservations, VfioBinding,
    dynamic_mig,
};
use crate::config::FeatureGate;
use crate::devices::{Discovery, DiscoveryOptions};
use crate::host::facts;

/// A GPU on a VFIO driver that no completed claim holds, reported and left as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnownedBinding {
    /// The GPU's PCI bus ID.
    pub bus_id: String,
    /// The VFIO driver it is bound to.
    pub driver: String,
    /// Why the driver did not give it back.
    pub reason: String,
}

/// What [`NvidiaDriver::reconcile_claims`] found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReconcileReport {
    /// UIDs of the completed claims whose devices are reserved now.
    pub reserved: Vec<String>,
    /// UIDs of claims reserved before (prepared by this process, or reserved by an earlier
    /// reconcile) that are not completed any more: their devices are free again.
    pub released: Vec<String>,
    /// PCI bus IDs of GPUs given back to their previous driver: bindings of released claims,
    /// recorded in the checkpoint.
    pub restored: Vec<String>,
    /// VFIO bindings no completed claim owns, left alone.
    pub unowned: Vec<UnownedBinding>,
    /// What could not be checked or restored, one message each.
    pub failures: Vec<String>,
    /// IDs of the MPS daemons of completed claims found running and adopted.
    pub daemons_adopted: Vec<String>,
    /// IDs of the MPS daemons of completed claims found stopped and started again.
    pub daemons_restarted: Vec<String>,
    /// IDs of MPS daemons no completed claim owns, stopped.
    pub daemons_stopped: Vec<String>,
    /// The new driver state of each claim whose daemon was started again (new pid and start
    /// time), to be written to the checkpoint.
    pub restarted_states: Vec<(ClaimRef, ClaimState)>,
    /// With `DynamicMIG`: MIG instances no completed claim records, destroyed or (on GPUs
    /// that need a reset) left alone; see `driver/dynamic_mig.rs`.
    pub mig: MigCleanup,
}

/// Whether `driver` is a VFIO driver (`vfio-pci`, `nvgrace-gpu-vfio-pci`, ...).
fn is_vfio_driver(driver: &str) -> bool {
    driver.contains("vfio")
}

impl NvidiaDriver {
    /// Rebuilds the reservations from `completed` (the claims the checkpoint records as
    /// prepared, with their driver state) and reconciles VFIO bindings (see
    /// `driver/reconcile.rs`). Blocking (sysfs reads and writes): call it off the async
    /// runtime. [`Driver::reconcile`](dra_sdk::driver::Driver::reconcile) calls it at start.
    ///
    /// Claims reserved before that are not in `completed` are released; a binding one of them
    /// recorded is restored if the GPU is still on that VFIO driver.
    pub fn reconcile_claims(
        &self,
        completed: impl IntoIterator<Item = (ClaimRef, ClaimState)>,
    ) -> ReconcileReport {
        reconcile(&self.inner, completed.into_iter().collect())
    }
}

#[tracing::instrument(skip_all, fields(completed = completed.len()))]
fn reconcile(inner: &Inner, completed: Vec<(ClaimRef, ClaimState)>) -> ReconcileReport {
    let mut report = ReconcileReport::default();

    // Reservations: exactly the completed claims.
    let mut fresh = Reservations::default();
    let mut owned: BTreeSet<String> = BTreeSet::new();
    for (claim, state) in &completed {
        fresh.restore(&claim.uid, &claim.namespace, &claim.name, state);
        report.reserved.push(claim.uid.clone());
        for device in &state.devices {
            if let PreparedKind::Vfio(binding) = &device.kind {
                owned.insert(binding.bus_id.clone());
            }
        }
    }
    let previous = std::mem::replace(&mut *inner.reservations(), fresh);

    // Who holds each dynamic MIG instance, whatever the gate says now: unprepare of a claim
    // that recorded one needs it.
    let states: Vec<(&str, &ClaimState)> = completed
        .iter()
        .map(|(claim, state)| (claim.uid.as_str(), state))
        .collect();
    inner.mig_instances.restore(states.iter().copied());
    if inner.gates.is_enabled(FeatureGate::DynamicMig) {
        report.mig = dynamic_mig::reconcile(inner, &states);
        report.failures.append(&mut report.mig.failures);
    }

    // Bindings provably ours: recorded by a claim that is no longer completed, and changed
    // by prepare (a GPU that was on VFIO before stays there).
    let mut ours: BTreeMap<String, VfioBinding> = BTreeMap::new();
    let mut released: Vec<(String, ClaimState)> = Vec::new();
    for (uid, state) in &previous.states {
        if completed.iter().any(|(claim, _)| &claim.uid == uid) {
            continue;
        }
        report.released.push(uid.clone());
        released.push((uid.clone(), state.clone()));
        for device in &state.devices {
            if let PreparedKind::Vfio(binding) = &device.kind
                && binding.rebound()
                && !owned.contains(&binding.bus_id)
            {
                ours.insert(binding.bus_id.clone(), binding.clone());
            }
        }
    }

    // The GPUs to look at: those bindings, and with PassthroughSupport every NVIDIA GPU
    // function of the node (without the gate this driver binds nothing, and discovery of
    // VFIO devices needs the IOMMU).
    let mut candidates: BTreeSet<String> = ours.keys().cloned().collect();
    if inner.gates.is_enabled(FeatureGate::PassthroughSupport) {
        let options = DiscoveryOptions::new().passthrough(true);
        match Discovery::discover(inner.backend.as_ref(), inner.host.as_ref(), &options) {
            Ok(discovery) => candidates.extend(
                discovery
                    .vfio
                    .into_iter()
                    .filter(|device| device.bound_driver.as_deref().is_some_and(is_vfio_driver))
                    .map(|device| device.pci_bus_id),
            ),
            Err(error) => report
                .failures
                .push(format!("listing the GPUs for VFIO bindings: {error}")),
        }
    }

    let binder = inner.binder();
    for bus_id in candidates {
        if owned.contains(&bus_id) {
            continue;
        }
        let driver = match facts::pci_driver(inner.host.as_ref(), &bus_id) {
            Ok(Some(driver)) if is_vfio_driver(&driver) => driver,
            // Not on VFIO (any more): nothing to do.
            Ok(_) => continue,
            Err(error) => {
                report
                    .failures
                    .push(format!("reading the driver of {bus_id}: {error}"));
                continue;
            }
        };
        match ours.get(&bus_id) {
            Some(binding) if binding.vfio_driver == driver => match binder.restore(binding) {
                Ok(()) => report.restored.push(bus_id),
                Err(error) => report.failures.push(format!(
                    "giving {bus_id} back to {:?}: {error}",
                    binding.previous_driver
                )),
            },
            Some(binding) => report.unowned.push(UnownedBinding {
                reason: format!(
                    "the checkpoint recorded binding it to {}, but it is on {driver} now",
                    binding.vfio_driver
                ),
                bus_id,
                driver,
            }),
            None => report.unowned.push(UnownedBinding {
                reason: "no claim in the checkpoint records binding it".to_owned(),
                bus_id,
                driver,
            }),
        }
    }
    super::claim_sharing::reconcile_daemons(inner, &completed, &released, &mut report);
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vfio_drivers_are_recognised_by_name() {
        assert!(is_vfio_driver("vfio-pci"));
        assert!(is_vfio_driver("nvgrace-gpu-vfio-pci"));
        assert!(!is_vfio_driver("nvidia"));
        assert!(!is_vfio_driver("nouveau"));
    }
}
