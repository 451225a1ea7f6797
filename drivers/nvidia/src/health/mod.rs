//! Device health (feature gate `NVMLDeviceHealthCheck`): backend events become device states
//! through the SDK's one device-state API ([`DriverContext::set_device_states`](dra_sdk::context::DriverContext::set_device_states)), which feeds
//! both the kubelet's health stream and the device taints in the ResourceSlice.
//!
//! * An event source per backend ([`HealthEventStream`](crate::backend::events::HealthEventStream), from
//!   [`GpuBackend::health_events`](crate::backend::GpuBackend::health_events)): NVML's event set (feature `nvml`), or the mock's
//!   injected and file events ([`MockEvents`](crate::backend::mock::MockEvents)).
//! * A policy ([`HealthPolicy`]): critical XIDs taint `gpu.nvidia.com/xid=<xid>` with effect
//!   `NoSchedule` (`None` for ignorable XIDs: [`DEFAULT_IGNORED_XIDS`] plus
//!   `--additional-xids-to-ignore`), a double-bit ECC error taints `gpu.nvidia.com/xid=dbe`
//!   (`NoSchedule`), a lost GPU `gpu.nvidia.com/gpu-lost` (`NoSchedule`); an event on a GPU affects its
//!   MIG devices too. When events cannot be registered every device carries
//!   `gpu.nvidia.com/unmonitored` (`None`) and its health is Unknown.
//! * Recovery, which upstream lacks: a taint goes after a configurable period without new
//!   events ([`HealthPolicy::recovery_period`]), or when the operator creates a file named
//!   after the device (or `all`) in the reset directory ([`HealthPolicy::reset_dir`]). A lost
//!   GPU recovers only by the operator's signal.
//!
//! See `drivers/nvidia/docs/health.md`.

mod monitor;

pub use monitor::{DeviceMap, HealthMonitor, HealthTracker};

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

/// XIDs upstream treats as application errors, not GPU faults: their taint is informational
/// (effect `None`). 13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped
/// processing, 45 preemptive cleanup, 68 video processor exception, 109 context switch
/// timeout.
pub const DEFAULT_IGNORED_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// Taint key of a critical XID (value: the XID) or a double-bit ECC error (value `dbe`).
pub const TAINT_XID: &str = "gpu.nvidia.com/xid";
/// Taint key of a lost GPU.
pub const TAINT_GPU_LOST: &str = "gpu.nvidia.com/gpu-lost";
/// Taint key of devices whose events cannot be watched.
pub const TAINT_UNMONITORED: &str = "gpu.nvidia.com/unmonitored";
/// The reset file name that clears every device.
pub const RESET_ALL: &str = "all";
/// Upstream's NVML wait timeout; also how often the monitor checks for cancellation.
pub const DEFAULT_EVENT_WAIT: Duration = Duration::from_secs(5);

/// How events become taints and how taints go away.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HealthPolicy {
    /// XIDs whose taint is informational (effect `None`, device stays Healthy).
    pub ignored_xids: BTreeSet<u64>,
    /// A tainted device (not a lost GPU) is untainted after this long without a new event.
    /// `None`: only the operator's signal untaints.
    pub recovery_period: Option<Duration>,
    /// A file named after a device (or [`RESET_ALL`]) created here untaints it; the monitor
    /// removes the file once done.
    pub reset_dir: Option<PathBuf>,
    /// How long one wait for events lasts on the blocking thread.
    pub event_wait: Duration,
    /// How often recovery and the reset directory are checked.
    pub check_interval: Duration,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        Self {
            ignored_xids: DEFAULT_IGNORED_XIDS.into_iter().collect(),
            recovery_period: None,
            reset_dir: None,
            event_wait: DEFAULT_EVENT_WAIT,
            check_interval: Duration::from_secs(1),
        }
    }
}

impl HealthPolicy {
    /// Upstream's ignore list plus `additional` (`--additional-xids-to-ignore`).
    pub fn ignore_xids(mut self, additional: impl IntoIterator<Item = u64>) -> Self {
        self.ignored_xids.extend(additional);
        self
    }

    /// See [`recovery_period`](Self::recovery_period).
    pub fn recovery_period(mut self, period: Option<Duration>) -> Self {
        self.recovery_period = period;
        self
    }

    /// See [`reset_dir`](Self::reset_dir).
    pub fn reset_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.reset_dir = dir;
        self
    }

    /// See [`event_wait`](Self::event_wait) and [`check_interval`](Self::check_interval);
    /// short values make tests fast.
    pub fn timing(mut self, event_wait: Duration, check_interval: Duration) -> Self {
        self.event_wait = event_wait;
        self.check_interval = check_interval;
        self
    }
}

/// Parses `--additional-xids-to-ignore`: comma-separated XIDs, blanks ignored.
///
/// ```
/// use dra_driver_nvidia::health::parse_xids;
/// assert_eq!(parse_xids("48, 79,")?, vec![48, 79]);
/// assert!(parse_xids("48,x").is_err());
/// # Ok::<(), dra_driver_nvidia::health::XidListError>(())
/// ```
pub fn parse_xids(text: &str) -> Result<Vec<u64>, XidListError> {
    text.split(',')
        .map(str::trim)
        .filter(|xid| !xid.is_empty())
        .map(|xid| {
            xid.parse().map_err(|_| XidListError {
                value: xid.to_owned(),
            })
        })
        .collect()
}

/// An XID in `--additional-xids-to-ignore` that is not a number.
#[derive(Debug, thiserror::Error)]
#[error("invalid XID {value:?} in --additional-xids-to-ignore: expected comma-separated numbers")]
pub struct XidListError {
    /// The entry.
    pub value: String,
}
