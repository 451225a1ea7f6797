//! Named steps of prepare and unprepare, and a hook the plugin calls at each: for tests that
//! stop the plugin at a chosen step (a SIGKILL of its own process, say) and check what a
//! restart makes of the state left behind.
//!
//! **Test-only**: compiled with the non-default cargo feature `fault-injection`, which a
//! shipped driver never enables. Without it the calls are compiled out; with it, a plugin
//! without a hook ([`PluginBuilder::fault_hook`](crate::plugin::PluginBuilder::fault_hook))
//! pays one `Option` check per step. The hook lives in the plugin it is given to: no global
//! state, so tests in one process do not see each other's hooks.
//!
//! Each step is *between* two durable side effects: the hook runs after the one its name says
//! is done and before the next one starts. Steps marked "per claim" are reached once for each
//! claim of a batch that gets that far (concurrently, in no fixed order); the others once per
//! batch. A step is reached only when the plugin gets that far: [`Step::UnprepareStartedRecorded`]
//! only for a batch with a prepared claim, the per-claim unprepare steps only for claims with a
//! record. The metadata and device-status steps are reached whether or not the driver opted
//! into those (the work is then a no-op).
//!
//! ```
//! # #[cfg(feature = "fault-injection")] {
//! use dra_sdk::advanced::fault_injection::Step;
//!
//! assert_eq!(Step::ALL.len(), 14);
//! assert_eq!(Step::DriverPrepared.as_str(), "driver_prepared");
//! assert_eq!("driver_prepared".parse::<Step>(), Ok(Step::DriverPrepared));
//! assert!(Step::DriverPrepared.is_prepare() && !Step::DriverUnprepared.is_prepare());
//! # }
//! ```

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// A point in prepare or unprepare, between two durable side effects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Step {
    /// Prepare: the batch's claims are locked; nothing is recorded yet.
    PrepareLocked,
    /// Prepare: the claims were read and recorded `PrepareStarted`; the driver was not
    /// called yet.
    PrepareStartedRecorded,
    /// Prepare, per claim: the driver's `prepare` returned; no CDI spec is written yet.
    DriverPrepared,
    /// Prepare, per claim: the CDI spec is written; no device metadata yet.
    CdiSpecWritten,
    /// Prepare, per claim: the device metadata is written (a no-op for a driver without
    /// it); the claim is not recorded completed yet.
    MetadataWritten,
    /// Prepare: the batch's claims are recorded `PrepareCompleted`; no device status is
    /// written yet and the kubelet has no answer.
    PrepareCompletedRecorded,
    /// Prepare, per recorded claim: the device status is written (a no-op for a driver
    /// without it, or a prepare without statuses); the kubelet has no answer yet.
    DeviceStatusWritten,
    /// Unprepare: the batch's claims are locked; nothing changed yet.
    UnprepareLocked,
    /// Unprepare: the prepared claims are recorded `UnprepareStarted`; the driver was not
    /// called yet.
    UnprepareStartedRecorded,
    /// Unprepare, per recorded claim: the driver's `unprepare` returned; the CDI spec is
    /// still there.
    DriverUnprepared,
    /// Unprepare, per recorded claim: the CDI spec is removed; the metadata is still there.
    CdiSpecRemoved,
    /// Unprepare, per recorded claim: the device metadata is removed; the device status is
    /// still there.
    MetadataRemoved,
    /// Unprepare, per recorded claim: the device status is cleared (a no-op for a driver
    /// without it); the record is still there.
    DeviceStatusCleared,
    /// Unprepare: the batch's records are removed; the kubelet has no answer yet.
    UnprepareRecordRemoved,
}

impl Step {
    /// Every step, in the order a prepare and then an unprepare reach them.
    pub const ALL: [Step; 14] = [
        Step::PrepareLocked,
        Step::PrepareStartedRecorded,
        Step::DriverPrepared,
        Step::CdiSpecWritten,
        Step::MetadataWritten,
        Step::PrepareCompletedRecorded,
        Step::DeviceStatusWritten,
        Step::UnprepareLocked,
        Step::UnprepareStartedRecorded,
        Step::DriverUnprepared,
        Step::CdiSpecRemoved,
        Step::MetadataRemoved,
        Step::DeviceStatusCleared,
        Step::UnprepareRecordRemoved,
    ];

    /// The step's name, in `snake_case` (what [`FromStr`] reads back).
    pub fn as_str(self) -> &'static str {
        match self {
            Step::PrepareLocked => "prepare_locked",
            Step::PrepareStartedRecorded => "prepare_started_recorded",
            Step::DriverPrepared => "driver_prepared",
            Step::CdiSpecWritten => "cdi_spec_written",
            Step::MetadataWritten => "metadata_written",
            Step::PrepareCompletedRecorded => "prepare_completed_recorded",
            Step::DeviceStatusWritten => "device_status_written",
            Step::UnprepareLocked => "unprepare_locked",
            Step::UnprepareStartedRecorded => "unprepare_started_recorded",
            Step::DriverUnprepared => "driver_unprepared",
            Step::CdiSpecRemoved => "cdi_spec_removed",
            Step::MetadataRemoved => "metadata_removed",
            Step::DeviceStatusCleared => "device_status_cleared",
            Step::UnprepareRecordRemoved => "unprepare_record_removed",
        }
    }

    /// Whether the step belongs to prepare (else to unprepare).
    pub fn is_prepare(self) -> bool {
        matches!(
            self,
            Step::PrepareLocked
                | Step::PrepareStartedRecorded
                | Step::DriverPrepared
                | Step::CdiSpecWritten
                | Step::MetadataWritten
                | Step::PrepareCompletedRecorded
                | Step::DeviceStatusWritten
        )
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Step {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Step::ALL
            .into_iter()
            .find(|step| step.as_str() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = Step::ALL.iter().map(|step| step.as_str()).collect();
                format!(
                    "unknown fault-injection step {name:?} (known: {})",
                    names.join(", ")
                )
            })
    }
}

/// The hook a plugin calls at each [`Step`]; shared by the plugin's tasks.
pub(crate) type FaultHook = Arc<dyn Fn(Step) + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_has_a_distinct_name_that_parses_back() {
        let mut names = std::collections::HashSet::new();
        for step in Step::ALL {
            assert!(names.insert(step.as_str()), "{step} twice");
            assert_eq!(step.as_str().parse::<Step>(), Ok(step));
        }
        let error = "nope".parse::<Step>().unwrap_err();
        assert!(
            error.contains("\"nope\"") && error.contains("driver_prepared"),
            "{error}"
        );
    }

    #[test]
    fn prepare_steps_come_first() {
        let prepare = Step::ALL
            .iter()
            .take_while(|step| step.is_prepare())
            .count();
        assert_eq!(prepare, 7);
        assert!(Step::ALL[prepare..].iter().all(|step| !step.is_prepare()));
    }
}
