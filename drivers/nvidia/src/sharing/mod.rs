//! GPU sharing: time-slicing, MPS and consumable shares (`docs/sharing.md` has the whole
//! story, with the exact host effects).
//!
//! * [`timeslicing`] (gate `TimeSlicingSettings`): `nvidia-smi` sets the compute mode to
//!   `DEFAULT` and the time slice of each full GPU of a config group; unprepare sets the time
//!   slice back to `Default` unless another prepared claim still uses the GPU.
//! * [`mps`] (gate `MPSSupport`): one MPS control daemon per config group, run as a
//!   Deployment pinned to the node ([`mps::deployment`], with `--image-name`: it outlives the
//!   plugin's container) or as a detached host process ([`Host::spawn`]: it outlives the
//!   plugin's process only), recorded in the claim's checkpointed driver state, re-adopted at
//!   start and stopped at unprepare.
//! * [`consumable`] (gate `ConsumableShares`): devices published with
//!   `allowMultipleAllocations` and memory request policies; several claims share a device
//!   only with identical configs.
//!
//! The tools run are the driver's own (`nvidia-smi`, `nvidia-cuda-mps-control`), found under
//! the container driver root ([`Tools`]) and run through the [`Host`], so tests see every
//! command line. `nvidia-smi` rather than NVML: the time slice has no call in the NVML
//! wrapper this crate uses, upstream runs exactly these commands (so operators can compare
//! logs), and through the host layer the fake host records them for the tests.

pub mod consumable;
pub mod mps;
pub mod timeslicing;

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::backend::ComputeCapability;
use crate::cdi::{BINARY_DIRS, DriverRoot, LIBRARY_DIRS};
use crate::host::{CommandOutput, Host, HostCommand, HostError};

pub use consumable::{ConsumableShares, ConsumableSharesError, SharedAllocation};
pub use mps::{MpsDaemonRecord, MpsRunner, MpsSettings};
pub use timeslicing::TimeSliceRecord;

/// One device of a sharing group, as the sharing code needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedDevice {
    /// The published device name.
    pub device: String,
    /// `GPU-…` for a full GPU, `MIG-…` for a MIG device: what `CUDA_VISIBLE_DEVICES` and MPS
    /// limits name.
    pub uuid: String,
    /// For a full GPU, its UUID: where the compute mode and the time slice are set. `None`
    /// for a MIG device (its parent GPU may serve other claims).
    pub gpu_uuid: Option<String>,
    /// The compute capability of the GPU (the parent's, for a MIG device).
    pub compute_capability: ComputeCapability,
}

/// What sharing did for a claim, kept in its checkpointed driver state so that unprepare
/// (in this process or after a restart) undoes exactly that.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "strategy")]
pub enum AppliedSharing {
    /// Time slices set on full GPUs.
    TimeSlicing(TimeSliceRecord),
    /// An MPS control daemon started.
    #[serde(rename = "MPS")]
    Mps(MpsDaemonRecord),
}

/// Why sharing could not be set up or undone.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SharingError {
    /// The config cannot be honoured for these devices (the message names the field).
    #[error("{field}: {reason}")]
    InvalidConfig {
        /// The config field, as a path (`sharing.mpsConfig.multiUser`).
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// A command ran and failed.
    #[error("`{command}` failed (exit status {status}): {output}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// Its exit status, or `signal`.
        status: String,
        /// What it printed on standard error (or output when that is empty).
        output: String,
    },
    /// The MPS control daemon did not become ready or could not be stopped.
    #[error("MPS control daemon {id}: {reason}")]
    Daemon {
        /// The daemon's ID.
        id: String,
        /// What happened.
        reason: String,
    },
    /// A call to the API server failed (MPS control-daemon Deployments).
    #[error("{action}: {source}")]
    Api {
        /// What was being done (`creating Deployment nvidia-dra/mps-control-daemon-…`).
        action: String,
        /// The client's error.
        source: kube::Error,
    },
    /// An object the plugin deleted was still there after the wait (an MPS control-daemon
    /// Deployment whose pod does not terminate).
    #[error("{what} still exists {timeout:.1?} after its deletion")]
    NotDeleted {
        /// The object (`Deployment nvidia-dra/mps-control-daemon-…`).
        what: String,
        /// How long the plugin waited.
        timeout: std::time::Duration,
    },
    /// A directory of the plugin could not be made, read or removed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The host failed.
    #[error(transparent)]
    Host(#[from] HostError),
}

impl SharingError {
    pub(crate) fn io(action: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            action,
            path: path.display().to_string(),
            source,
        }
    }

    /// Whether the config is at fault (the user must change it) rather than the node.
    pub fn is_invalid_config(&self) -> bool {
        matches!(self, Self::InvalidConfig { .. })
    }
}

/// The driver's tools as the plugin runs them: `nvidia-smi` and `nvidia-cuda-mps-control`
/// from the container driver root (`/driver-root/usr/bin/...`), with the driver's
/// `libnvidia-ml.so.1` preloaded and its directory on the library path, as upstream runs
/// `nvidia-smi` (the plugin image has no driver libraries of its own). A tool not found
/// under the driver root is run by name from `PATH`.
#[derive(Clone, Debug)]
pub struct Tools<'a> {
    host: &'a dyn Host,
    nvidia_smi: String,
    mps_control: String,
    env: Vec<(String, String)>,
    daemon: mps::DaemonCommand,
}

/// `nvidia-smi`.
pub const NVIDIA_SMI: &str = "nvidia-smi";
/// `nvidia-cuda-mps-control`.
pub const MPS_CONTROL: &str = "nvidia-cuda-mps-control";

impl<'a> Tools<'a> {
    /// Finds the tools under `driver_root`; commands run on `host`.
    pub fn find(host: &'a dyn Host, driver_root: &DriverRoot) -> Result<Self, SharingError> {
        let binary = |name: &str| -> Result<String, SharingError> {
            Ok(driver_root
                .find(&BINARY_DIRS, &[name])?
                .map_or_else(|| name.to_owned(), |path| path.display().to_string()))
        };
        let mut env = Vec::new();
        if let Some(nvml) = driver_root.find(&LIBRARY_DIRS, &["libnvidia-ml.so.1"])? {
            if let Some(dir) = nvml.parent() {
                env.push(("LD_LIBRARY_PATH".to_owned(), dir.display().to_string()));
            }
            env.push(("LD_PRELOAD".to_owned(), nvml.display().to_string()));
        }
        Ok(Self {
            host,
            nvidia_smi: binary(NVIDIA_SMI)?,
            mps_control: binary(MPS_CONTROL)?,
            env,
            daemon: mps::DaemonCommand::find(driver_root)?,
        })
    }

    /// How an MPS control-daemon Deployment runs `nvidia-cuda-mps-control` from the driver
    /// root (see [`mps::deployment`]).
    pub fn daemon_command(&self) -> &mps::DaemonCommand {
        &self.daemon
    }

    /// The host the tools run on.
    pub fn host(&self) -> &'a dyn Host {
        self.host
    }

    /// `nvidia-smi args…`, with the driver's environment.
    pub fn nvidia_smi<I, S>(&self, args: I) -> HostCommand
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.with_env(HostCommand::new(&self.nvidia_smi, args))
    }

    /// `nvidia-cuda-mps-control args…`, with the driver's environment.
    pub fn mps_control<I, S>(&self, args: I) -> HostCommand
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.with_env(HostCommand::new(&self.mps_control, args))
    }

    fn with_env(&self, mut command: HostCommand) -> HostCommand {
        command.env.extend(self.env.iter().cloned());
        command
    }

    /// Runs a command; a non-zero exit is an error carrying what it printed.
    pub fn run(&self, command: &HostCommand) -> Result<CommandOutput, SharingError> {
        let output = self.host.run(command)?;
        if output.success() {
            return Ok(output);
        }
        let printed = if output.stderr.trim().is_empty() {
            output.stdout.trim()
        } else {
            output.stderr.trim()
        };
        Err(SharingError::CommandFailed {
            command: command.to_string(),
            status: output
                .status
                .map_or_else(|| "signal".to_owned(), |code| code.to_string()),
            output: printed.to_owned(),
        })
    }
}
