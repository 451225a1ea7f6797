//! The undo log of a prepare: each step that changes the node registers how to undo it as it
//! succeeds, and a failed prepare rolls the log back newest first, so that the prepare itself
//! reads as forward steps.

use dra_sdk::claim::ClaimRef;

use super::{ClaimState, Inner, MigInstance, PreparedKind, VfioBinding, dynamic_mig};

/// One step to undo.
#[derive(Debug)]
enum Undo {
    /// The claim's reservations: released, and an earlier successful attempt of the claim
    /// holds what it held again.
    Reservations,
    /// A partition the claim was given: let go of (destroyed unless another claim holds it).
    Partition {
        device: String,
        instance: MigInstance,
    },
    /// A GPU bound to VFIO: back to its previous driver.
    Binding(VfioBinding),
}

/// What a prepare of `claim` did so far, for [`rollback`](Self::rollback) on failure.
#[derive(Debug)]
pub(super) struct UndoLog<'a> {
    inner: &'a Inner,
    claim: &'a ClaimRef,
    /// The state of an earlier successful attempt of this claim: it keeps what it holds.
    earlier: Option<&'a ClaimState>,
    steps: Vec<Undo>,
}

impl<'a> UndoLog<'a> {
    /// The log of a prepare whose reservations are taken: rolling back releases them.
    pub(super) fn reserved(
        inner: &'a Inner,
        claim: &'a ClaimRef,
        earlier: Option<&'a ClaimState>,
    ) -> Self {
        Self {
            inner,
            claim,
            earlier,
            steps: vec![Undo::Reservations],
        }
    }

    /// The state of an earlier successful attempt of this claim, if any.
    pub(super) fn earlier(&self) -> Option<&'a ClaimState> {
        self.earlier
    }

    /// A partition created or joined for `device`.
    pub(super) fn partition(&mut self, device: &str, instance: &MigInstance) {
        self.steps.push(Undo::Partition {
            device: device.to_owned(),
            instance: instance.clone(),
        });
    }

    /// A GPU bound to VFIO.
    pub(super) fn binding(&mut self, binding: &VfioBinding) {
        self.steps.push(Undo::Binding(binding.clone()));
    }

    /// Undoes every step, newest first. Failures are logged: the prepare fails with its own
    /// error either way.
    pub(super) fn rollback(self) {
        let Self {
            inner,
            claim,
            earlier,
            steps,
        } = self;
        for step in steps.into_iter().rev() {
            match step {
                Undo::Partition { device, instance } => {
                    // An earlier successful attempt of this claim keeps holding its partitions.
                    let kept = earlier.iter().flat_map(|state| &state.devices).any(
                        |device| matches!(&device.kind, PreparedKind::MigDynamic(old) if *old == instance),
                    );
                    if kept {
                        continue;
                    }
                    if let Err(undo) = dynamic_mig::release(inner, &claim.uid, &device, &instance) {
                        tracing::error!(gpu = %instance.parent_uuid, gpu_instance_id = instance.gpu_instance_id, error = %undo, "rolling back a MIG partition failed");
                    }
                }
                Undo::Binding(binding) => {
                    if let Err(restore) = inner.binder().restore(&binding) {
                        tracing::error!(bus_id = %binding.bus_id, error = %restore, "rolling back a VFIO binding failed");
                    }
                }
                Undo::Reservations => {
                    let mut reservations = inner.reservations();
                    reservations.release(&claim.uid);
                    if let Some(earlier) = earlier {
                        reservations.restore(&claim.uid, &claim.namespace, &claim.name, earlier);
                    }
                }
            }
        }
    }
}
