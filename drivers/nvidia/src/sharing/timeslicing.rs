//! Time-slicing: how long each process runs on a full GPU before the next one gets it.
//!
//! For each full GPU of a config group, in order (upstream's two commands):
//!
//! 1. `nvidia-smi -i <uuid> -c DEFAULT`: several processes may use the GPU at once;
//! 2. `nvidia-smi compute-policy -i <uuid> --set-timeslice <0|1|2|3>` (`Default`, `Short`,
//!    `Medium`, `Long`).
//!
//! MIG devices get nothing: they have no time slice (upstream accepts the config on them and
//! does nothing too). Unprepare runs `nvidia-smi compute-policy -i <uuid> --set-timeslice 0`
//! for each GPU, unless another prepared claim still uses it (consumable shares, admin
//! access): that claim keeps the interval it was prepared with.

use serde::{Deserialize, Serialize};

use super::{SharedDevice, SharingError, Tools};
use crate::config::TimeSliceInterval;

/// The time slices a claim set, for unprepare.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TimeSliceRecord {
    /// The devices of the config group.
    pub devices: Vec<String>,
    /// UUIDs of the full GPUs whose time slice was set.
    pub gpus: Vec<String>,
    /// The interval set.
    pub interval: TimeSliceInterval,
}

/// Sets the compute mode and the time slice of every full GPU of `devices`. Stops at the
/// first failure; what was set before stays set (a time slice is harmless, and unprepare or
/// the next prepare of the GPU sets it again).
pub fn apply(
    tools: &Tools<'_>,
    devices: &[SharedDevice],
    interval: TimeSliceInterval,
) -> Result<TimeSliceRecord, SharingError> {
    let mut gpus = Vec::new();
    for gpu in devices
        .iter()
        .filter_map(|device| device.gpu_uuid.as_deref())
    {
        tools.run(&tools.nvidia_smi(["-i", gpu, "-c", "DEFAULT"]))?;
        tools.run(&tools.nvidia_smi([
            "compute-policy".to_owned(),
            "-i".to_owned(),
            gpu.to_owned(),
            "--set-timeslice".to_owned(),
            interval.nvidia_smi_value().to_string(),
        ]))?;
        gpus.push(gpu.to_owned());
    }
    tracing::info!(?gpus, ?interval, "time slice set");
    Ok(TimeSliceRecord {
        devices: devices.iter().map(|d| d.device.clone()).collect(),
        gpus,
        interval,
    })
}

/// Sets the time slice of one GPU back to `Default`.
pub fn reset(tools: &Tools<'_>, gpu: &str) -> Result<(), SharingError> {
    tools.run(&tools.nvidia_smi(["compute-policy", "-i", gpu, "--set-timeslice", "0"]))?;
    tracing::info!(gpu, "time slice reset to Default");
    Ok(())
}
