//! How the driver applies [`crate::sharing`] to a claim: config groups at prepare, undo at
//! unprepare, and the MPS daemons at start (adopt, restart, or stop those no claim owns).

use std::collections::BTreeSet;

use dra_sdk::cdi::ContainerEdits;
use dra_sdk::claim::{ClaimRef, DriverError};

use super::{ClaimState, Inner, Planned, PreparedKind, ReconcileReport, Reservations, Target};
use crate::config::{NvidiaConfig, SharingStrategy};
use crate::sharing::mps::{self, DeploymentRunner, Readoption};
use crate::sharing::{AppliedSharing, MpsRunner, SharedDevice, SharingError, Tools, timeslicing};

/// The devices of a claim that share one config with a sharing strategy.
struct Group<'a> {
    config: &'a NvidiaConfig,
    /// Indexes into the planned devices.
    members: Vec<usize>,
    devices: Vec<SharedDevice>,
}

fn shared_device(plan: &Planned) -> Option<SharedDevice> {
    match &plan.target {
        Target::Gpu(gpu) => Some(SharedDevice {
            device: plan.device.clone(),
            uuid: gpu.uuid.clone(),
            gpu_uuid: Some(gpu.uuid.clone()),
            compute_capability: gpu.cuda_compute_capability,
        }),
        Target::Mig { parent, mig } => Some(SharedDevice {
            device: plan.device.clone(),
            uuid: mig.uuid.clone(),
            gpu_uuid: None,
            compute_capability: parent.cuda_compute_capability,
        }),
        // A dynamic MIG partition's instance does not exist yet when sharing is planned, and
        // needs none: MPS is excluded with DynamicMIG and time-slicing does nothing on MIG.
        Target::Vfio { .. } | Target::Partition(_) => None,
    }
}

/// Devices with a sharing strategy, grouped by identical config, in allocation order (a
/// group's position is its index in the daemon ID).
fn groups(planned: &[Planned]) -> Vec<Group<'_>> {
    let mut groups: Vec<Group<'_>> = Vec::new();
    for (index, plan) in planned.iter().enumerate() {
        if plan.config.sharing().is_none() {
            continue;
        }
        let Some(device) = shared_device(plan) else {
            continue;
        };
        match groups.iter_mut().find(|group| *group.config == plan.config) {
            Some(group) => {
                group.members.push(index);
                group.devices.push(device);
            }
            None => groups.push(Group {
                config: &plan.config,
                members: vec![index],
                devices: vec![device],
            }),
        }
    }
    groups
}

fn to_driver_error(
    config: &NvidiaConfig,
    devices: &[SharedDevice],
    error: SharingError,
) -> DriverError {
    let names: Vec<&str> = devices.iter().map(|d| d.device.as_str()).collect();
    if error.is_invalid_config() {
        DriverError::InvalidConfig(format!(
            "{} for {}: {error}",
            config.kind(),
            names.join(", ")
        ))
    } else {
        DriverError::Device {
            device: names.join(", "),
            reason: error.to_string(),
        }
    }
}

/// Checks what can be checked before anything is touched: MPS with consumable shares, and
/// the MPS limits against the devices.
pub(super) fn check(inner: &Inner, planned: &[Planned]) -> Result<(), DriverError> {
    for group in groups(planned) {
        let Some((SharingStrategy::Mps, mps_config, _)) = group.config.sharing() else {
            continue;
        };
        if inner.consumable.is_enabled() {
            return Err(to_driver_error(
                group.config,
                &group.devices,
                SharingError::InvalidConfig {
                    field: "sharing.strategy".into(),
                    reason: format!(
                        "MPS cannot be used with consumable shares (--consumable-shares={}): \
                         one MPS daemon per claim cannot serve the other claims of the device",
                        inner.consumable
                    ),
                },
            ));
        }
        let default = crate::config::MpsConfig::default();
        mps::control_commands(mps_config.unwrap_or(&default), &group.devices)
            .map_err(|error| to_driver_error(group.config, &group.devices, error))?;
    }
    Ok(())
}

/// Applies every group's strategy and adds the MPS edits to its devices. On failure, what
/// this call did is undone.
pub(super) fn apply(
    inner: &Inner,
    claim: &ClaimRef,
    planned: &[Planned],
    edits: &mut [ContainerEdits],
) -> Result<Vec<AppliedSharing>, DriverError> {
    let groups = groups(planned);
    if groups.is_empty() {
        return Ok(Vec::new());
    }
    let tools = Tools::find(inner.host.as_ref(), inner.cdi.driver_root())
        .map_err(|error| DriverError::Unavailable(error.to_string()))?;
    let runner = inner.mps_runner();
    if let (Some(config), MpsRunner::HostProcess) = (&inner.mps_deployments, &runner) {
        // Never fall back to a host process that a container restart would kill.
        return Err(DriverError::Unavailable(format!(
            "MPS control daemons run as Deployments (image {}), but the driver was not \
             started by a plugin with an API client",
            config.image
        )));
    }
    let mut applied = Vec::new();
    for (index, group) in groups.iter().enumerate() {
        let Some((strategy, mps_config, interval)) = group.config.sharing() else {
            continue;
        };
        let result = match strategy {
            SharingStrategy::TimeSlicing => timeslicing::apply(&tools, &group.devices, interval)
                .map(|record| {
                    (!record.gpus.is_empty()).then_some(AppliedSharing::TimeSlicing(record))
                }),
            SharingStrategy::Mps => {
                let default = crate::config::MpsConfig::default();
                let id = format!("{}-{index}", claim.uid);
                mps::start(
                    &tools,
                    &inner.mps,
                    &runner,
                    &id,
                    mps_config.unwrap_or(&default),
                    &group.devices,
                )
                .map(|record| {
                    for member in &group.members {
                        edits[*member].append(record.container_edits());
                    }
                    Some(AppliedSharing::Mps(record))
                })
            }
        };
        match result {
            Ok(Some(record)) => applied.push(record),
            Ok(None) => {}
            Err(error) => {
                for failure in undo(inner, &claim.uid, &applied) {
                    tracing::error!(claim = %claim, failure, "undoing sharing after a failed prepare");
                }
                return Err(to_driver_error(group.config, &group.devices, error));
            }
        }
    }
    Ok(applied)
}

/// Whether a claim other than `uid` holds the full GPU `gpu_uuid` (consumable shares, admin
/// access): then its compute mode and time slice stay as they are.
fn used_elsewhere(reservations: &Reservations, uid: &str, gpu_uuid: &str) -> bool {
    reservations
        .states
        .iter()
        .filter(|(holder, _)| holder.as_str() != uid)
        .flat_map(|(_, state)| &state.devices)
        .any(|device| matches!(&device.kind, PreparedKind::Gpu { uuid, .. } if uuid == gpu_uuid))
}

/// Undoes `applied` (last first); returns what failed, one message each.
pub(super) fn undo(inner: &Inner, uid: &str, applied: &[AppliedSharing]) -> Vec<String> {
    if applied.is_empty() {
        return Vec::new();
    }
    let tools = match Tools::find(inner.host.as_ref(), inner.cdi.driver_root()) {
        Ok(tools) => tools,
        Err(error) => return vec![error.to_string()],
    };
    let runner = inner.mps_runner();
    // A GPU that is gone (lost, removed, another inventory after a restart) took its time
    // slice and compute mode with it: nothing to reset there. Each GPU is asked about alone;
    // one that cannot be read is tried.
    let gone = |gpu: &str| matches!(inner.backend.gpu(gpu), Ok(None));
    let mut failures = Vec::new();
    for sharing in applied.iter().rev() {
        let free = |gpus: &[String]| -> Vec<String> {
            let reservations = inner.reservations();
            gpus.iter()
                .filter(|gpu| !used_elsewhere(&reservations, uid, gpu))
                .filter(|gpu| {
                    let gone = gone(gpu);
                    if gone {
                        tracing::warn!(%gpu, claim = uid, "the GPU is gone; nothing to reset on it");
                    }
                    !gone
                })
                .cloned()
                .collect()
        };
        match sharing {
            AppliedSharing::TimeSlicing(record) => {
                for gpu in free(&record.gpus) {
                    if let Err(error) = timeslicing::reset(&tools, &gpu) {
                        failures.push(format!("resetting the time slice of {gpu}: {error}"));
                    }
                }
            }
            AppliedSharing::Mps(record) => {
                let reset = free(&record.exclusive_gpus);
                if let Err(error) = mps::stop(&tools, &inner.mps, &runner, record, &reset) {
                    failures.push(format!("stopping MPS daemon {}: {error}", record.id));
                }
            }
        }
    }
    failures
}

/// At start: adopts or restarts the daemons of the completed claims (their new records go to
/// `report.restarted_states`), stops those of released claims and those no claim records.
pub(super) fn reconcile_daemons(
    inner: &Inner,
    completed: &[(ClaimRef, ClaimState)],
    released: &[(String, ClaimState)],
    report: &mut ReconcileReport,
) {
    let mut owned: BTreeSet<String> = BTreeSet::new();
    let tools = Tools::find(inner.host.as_ref(), inner.cdi.driver_root());
    let runner = inner.mps_runner();
    for (claim, state) in completed {
        let mut updated = state.clone();
        let mut changed = false;
        for sharing in &mut updated.sharing {
            let AppliedSharing::Mps(record) = sharing else {
                continue;
            };
            owned.insert(record.id.clone());
            let tools = match &tools {
                Ok(tools) => tools,
                Err(error) => {
                    report
                        .failures
                        .push(format!("MPS daemon {}: {error}", record.id));
                    continue;
                }
            };
            match mps::ensure_running(tools, &inner.mps, &runner, record) {
                Ok(Readoption::Adopted) => report.daemons_adopted.push(record.id.clone()),
                Ok(Readoption::Restarted(new)) => {
                    report.daemons_restarted.push(record.id.clone());
                    *record = *new;
                    changed = true;
                }
                Err(error) => report.failures.push(format!(
                    "claim {claim}: restarting MPS daemon {}: {error}",
                    record.id
                )),
            }
        }
        if changed {
            inner
                .reservations()
                .states
                .insert(claim.uid.clone(), updated.clone());
            report.restarted_states.push((claim.clone(), updated));
        }
    }
    let mut stopped: BTreeSet<String> = BTreeSet::new();
    for (uid, state) in released {
        let failures = undo(inner, uid, &state.sharing);
        report.failures.extend(failures);
        for sharing in &state.sharing {
            if let AppliedSharing::Mps(record) = sharing {
                stopped.insert(record.id.clone());
                report.daemons_stopped.push(record.id.clone());
            }
        }
    }
    for record in mps::recorded_daemons(&inner.mps) {
        if owned.contains(&record.id) || stopped.contains(&record.id) {
            continue;
        }
        // Started by a prepare that never reached the checkpoint: no claim owns it.
        let uid = record
            .id
            .rsplit_once('-')
            .map_or("", |(uid, _)| uid)
            .to_owned();
        let failures = undo(inner, &uid, &[AppliedSharing::Mps(record.clone())]);
        report.failures.extend(failures);
        stopped.insert(record.id.clone());
        report.daemons_stopped.push(record.id);
    }
    if let MpsRunner::Deployment(deployments) = &runner {
        delete_unowned_deployments(inner, deployments, &owned, &stopped, report);
    }
}

/// Deletes the daemon Deployments of this node that no completed claim owns and whose daemon
/// directory was not found above (its record lost): old enough not to belong to a prepare
/// still running in another plugin instance ([`MpsSettings::orphan_grace`]).
///
/// [`MpsSettings::orphan_grace`]: crate::sharing::MpsSettings::orphan_grace
fn delete_unowned_deployments(
    inner: &Inner,
    deployments: &DeploymentRunner,
    owned: &BTreeSet<String>,
    stopped: &BTreeSet<String>,
    report: &mut ReconcileReport,
) {
    let ours = match deployments.ours() {
        Ok(ours) => ours,
        Err(error) => {
            report.failures.push(error.to_string());
            return;
        }
    };
    for found in ours {
        if owned.contains(&found.id)
            || stopped.contains(&found.id)
            || found.age < inner.mps.orphan_grace
        {
            continue;
        }
        tracing::warn!(id = %found.id, deployment = %found.deployment.name, "MPS control daemon Deployment no prepared claim owns; deleting it");
        match deployments.delete(&found.deployment, inner.mps.delete_timeout) {
            Ok(()) => report.daemons_stopped.push(found.id),
            Err(error) => report
                .failures
                .push(format!("MPS daemon {}: {error}", found.id)),
        }
    }
}
