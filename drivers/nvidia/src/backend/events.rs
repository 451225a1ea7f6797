//! Health events as a backend reports them, and the stream that delivers them.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::BackendError;

/// What went wrong on a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HealthEventKind {
    /// A critical XID error, with its number (NVML `XidCriticalError`).
    Xid(u64),
    /// An uncorrectable (double-bit) ECC error.
    DoubleBitEcc,
    /// The GPU fell off the bus (NVML `ERROR_GPU_IS_LOST`) or can no longer be resolved.
    GpuLost,
    /// Events on this GPU cannot be watched (its registration failed): its devices are
    /// Unknown, the other GPUs stay watched.
    Unmonitored,
}

impl fmt::Display for HealthEventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Xid(xid) => write!(f, "xid {xid}"),
            Self::DoubleBitEcc => f.write_str("double-bit-ecc"),
            Self::GpuLost => f.write_str("gpu-lost"),
            Self::Unmonitored => f.write_str("unmonitored"),
        }
    }
}

/// What NVML says a GPU needs before it can be trusted again
/// (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`, field 230).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecoveryAction {
    /// Nothing: the GPU can be used.
    None,
    /// A GPU reset.
    GpuReset,
    /// A node reboot.
    NodeReboot,
    /// Draining peer-to-peer traffic.
    DrainP2p,
    /// Draining, then a GPU reset.
    DrainAndReset,
    /// A value this plugin does not know: treated as needing attention.
    Unknown(u32),
}

impl RecoveryAction {
    /// From NVML's value (`NVML_GPU_RECOVERY_ACTION_*`: 0 none, 1 GPU reset, 2 node reboot,
    /// 3 drain P2P, 4 drain and reset).
    pub fn from_nvml(value: u32) -> Self {
        match value {
            0 => Self::None,
            1 => Self::GpuReset,
            2 => Self::NodeReboot,
            3 => Self::DrainP2p,
            4 => Self::DrainAndReset,
            other => Self::Unknown(other),
        }
    }

    /// NVML's value.
    pub fn to_nvml(self) -> u32 {
        match self {
            Self::None => 0,
            Self::GpuReset => 1,
            Self::NodeReboot => 2,
            Self::DrainP2p => 3,
            Self::DrainAndReset => 4,
            Self::Unknown(other) => other,
        }
    }
}

impl fmt::Display for RecoveryAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::GpuReset => f.write_str("a GPU reset"),
            Self::NodeReboot => f.write_str("a node reboot"),
            Self::DrainP2p => f.write_str("draining peer-to-peer traffic"),
            Self::DrainAndReset => f.write_str("draining and a GPU reset"),
            Self::Unknown(value) => write!(f, "recovery action {value}"),
        }
    }
}

/// One event on one device.
///
/// `uuid` is the device the backend reported: a GPU (`GPU-…`) or a MIG device (`MIG-…`). An
/// event on a GPU affects the GPU and every MIG device on it; an event on a MIG device
/// affects that MIG device only.
///
/// The text form (one line of a mock event file) is `<uuid> <kind>`:
///
/// ```
/// use dra_driver_nvidia::backend::events::{HealthEvent, HealthEventKind};
///
/// let event: HealthEvent = "GPU-4404041a-04cf-1ccf-9e70-f139a9b1e23c xid 79".parse()?;
/// assert_eq!(event.kind, HealthEventKind::Xid(79));
/// assert_eq!(event.to_string(), "GPU-4404041a-04cf-1ccf-9e70-f139a9b1e23c xid 79");
/// assert!("GPU-1 xid seventy-nine".parse::<HealthEvent>().is_err());
/// # Ok::<(), dra_driver_nvidia::backend::events::EventParseError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct HealthEvent {
    /// The GPU or MIG device UUID.
    pub uuid: String,
    /// What happened.
    pub kind: HealthEventKind,
}

impl HealthEvent {
    /// An event on the device with this UUID.
    pub fn new(uuid: impl Into<String>, kind: HealthEventKind) -> Self {
        Self {
            uuid: uuid.into(),
            kind,
        }
    }
}

impl fmt::Display for HealthEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.uuid, self.kind)
    }
}

/// A health event line that does not parse.
#[derive(Debug, thiserror::Error)]
#[error(
    "invalid health event {line:?}: expected `<uuid> xid <number>`, `<uuid> double-bit-ecc`, `<uuid> gpu-lost` or `<uuid> unmonitored`"
)]
pub struct EventParseError {
    /// The line.
    pub line: String,
}

impl FromStr for HealthEvent {
    type Err = EventParseError;

    fn from_str(line: &str) -> Result<Self, Self::Err> {
        let invalid = || EventParseError {
            line: line.to_owned(),
        };
        let words: Vec<&str> = line.split_whitespace().collect();
        let kind = match words.as_slice() {
            [_, "xid", number] => HealthEventKind::Xid(number.parse().map_err(|_| invalid())?),
            [_, "double-bit-ecc"] => HealthEventKind::DoubleBitEcc,
            [_, "gpu-lost"] => HealthEventKind::GpuLost,
            [_, "unmonitored"] => HealthEventKind::Unmonitored,
            _ => return Err(invalid()),
        };
        Ok(Self::new(words[0], kind))
    }
}

/// Events from the devices a backend registered for, read on a blocking thread.
///
/// [`GpuBackend::health_events`](crate::backend::GpuBackend::health_events) returns one.
pub trait HealthEventStream {
    /// Waits up to `timeout` for the next event: `Ok(None)` when none came. An error means
    /// the stream cannot deliver events any more; the monitor then marks every device
    /// unmonitored.
    fn wait(&mut self, timeout: Duration) -> Result<Option<HealthEvent>, BackendError>;
}
