//! The opaque configuration API `resource.nvidia.com/v1beta1`: [`GpuConfig`],
//! [`MigDeviceConfig`] and [`VfioDeviceConfig`], with the upstream field names, defaults,
//! normalisation and validation, decoded strictly through dra-sdk's
//! [`ConfigRegistry`] (an unknown field is an error that
//! names it).
//!
//! ```yaml
//! apiVersion: resource.nvidia.com/v1beta1
//! kind: GpuConfig
//! sharing:
//!   strategy: TimeSlicing            # or MPS
//!   timeSlicingConfig:
//!     interval: Long                 # Default | Short | Medium | Long
//! ---
//! apiVersion: resource.nvidia.com/v1beta1
//! kind: MigDeviceConfig
//! sharing:
//!   strategy: MPS
//!   mpsConfig:
//!     defaultActiveThreadPercentage: 50
//!     defaultPinnedDeviceMemoryLimit: 10Gi
//! ---
//! apiVersion: resource.nvidia.com/v1beta1
//! kind: VfioDeviceConfig
//! iommu:
//!   backendPolicy: PreferIommuFD     # or LegacyOnly (default)
//!   enableAPIDevice: true
//! ```
//!
//! # What the driver does with each setting
//!
//! Decoding, normalisation and validation are complete for every field. What the driver
//! *does* with them (details in [`crate::sharing`] and `docs/sharing.md`):
//!
//! - **No `sharing`** (the default of every kind): the device is handed to the containers
//!   as is; containers of one claim that reference the same request share it, which is what
//!   upstream does too.
//! - **`TimeSlicing`** (gate `TimeSlicingSettings`): on full GPUs, the compute mode is set to
//!   `DEFAULT` and the time slice to the interval with `nvidia-smi`; on MIG devices it is
//!   accepted and does nothing, exactly like upstream (MIG devices have no time slice).
//! - **`MPS`** (gate `MPSSupport`): one MPS control daemon per group of devices sharing the
//!   config, with the limits of `mpsConfig`.
//! - **`VfioDeviceConfig`**: fully applied (see [`crate::driver`]).
//!
//! Without its gate, a strategy fails the claim with upstream's message, which names the
//! gate.
//! The gates themselves ([`FeatureGates`], `--feature-gates`) are configuration too and live
//! here, next to the settings they turn on.
//!
//! # Which config applies to a device
//!
//! [`select_config`] follows upstream: the configs that apply to a device are walked from the
//! highest precedence down (claim over class, later over earlier); the first config of the
//! device's own kind wins. A config that names the device's request explicitly but is of the
//! wrong kind (a `GpuConfig` for a request that got a MIG device) is an error naming both the
//! kind and the device; a config without `requests` only applies to devices of its own kind
//! and is skipped by the others. Without a match the device gets its kind's default config.

mod gates;
mod quantity;

use std::collections::BTreeMap;
use std::fmt;

use dra_sdk::config::{
    ConfigHooks, ConfigKind, ConfigRegistry, ConfigValidationError, OpaqueConfig,
};
use serde::{Deserialize, Serialize};

pub use gates::{FeatureGate, FeatureGateError, FeatureGates};
pub use quantity::Quantity;

/// The API group and version of every config kind of this driver.
pub const API_VERSION: &str = "resource.nvidia.com/v1beta1";

/// The registry of the driver's config kinds, decoding into [`NvidiaConfig`].
///
/// ```
/// use dra_driver_nvidia::config::{registry, NvidiaConfig};
///
/// let config = registry().decode(&serde_json::json!({
///     "apiVersion": "resource.nvidia.com/v1beta1",
///     "kind": "VfioDeviceConfig",
/// }))?;
/// let NvidiaConfig::Vfio(vfio) = config else { panic!("a VfioDeviceConfig") };
/// assert!(!vfio.iommu.unwrap().enable_api_device.unwrap());
/// # Ok::<(), dra_sdk::config::ConfigError>(())
/// ```
pub fn registry() -> ConfigRegistry<NvidiaConfig> {
    ConfigRegistry::new()
        .register::<GpuConfig>()
        .register::<MigDeviceConfig>()
        .register::<VfioDeviceConfig>()
}

/// Any config kind of this driver, decoded, normalised and validated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind")]
pub enum NvidiaConfig {
    /// For full GPUs.
    #[serde(rename = "GpuConfig")]
    Gpu(GpuConfig),
    /// For MIG devices.
    #[serde(rename = "MigDeviceConfig")]
    Mig(MigDeviceConfig),
    /// For GPUs passed through with VFIO.
    #[serde(rename = "VfioDeviceConfig")]
    Vfio(VfioDeviceConfig),
}

impl NvidiaConfig {
    /// The `apiVersion` and `kind` of this config.
    pub fn kind(&self) -> ConfigKind {
        match self {
            NvidiaConfig::Gpu(_) => ConfigKind::of::<GpuConfig>(),
            NvidiaConfig::Mig(_) => ConfigKind::of::<MigDeviceConfig>(),
            NvidiaConfig::Vfio(_) => ConfigKind::of::<VfioDeviceConfig>(),
        }
    }

    /// The kind of device this config is for.
    pub fn device_type(&self) -> DeviceType {
        match self {
            NvidiaConfig::Gpu(_) => DeviceType::Gpu,
            NvidiaConfig::Mig(_) => DeviceType::Mig,
            NvidiaConfig::Vfio(_) => DeviceType::Vfio,
        }
    }

    /// The default config of a device type, normalised: what a device gets when no config
    /// applies to it.
    pub fn default_for(device_type: DeviceType) -> Self {
        match device_type {
            DeviceType::Gpu => NvidiaConfig::Gpu(GpuConfig::default()),
            DeviceType::Mig => NvidiaConfig::Mig(MigDeviceConfig::default()),
            DeviceType::Vfio => {
                let mut config = VfioDeviceConfig::default();
                config.normalize();
                NvidiaConfig::Vfio(config)
            }
        }
    }

    /// Checks what depends on the node rather than on the config itself: the feature gate of
    /// a sharing strategy (and of VFIO configs).
    ///
    /// See the [module documentation](self) for what is accepted.
    pub fn check_supported(&self, gates: &FeatureGates) -> Result<(), ConfigSupportError> {
        match self {
            NvidiaConfig::Gpu(GpuConfig {
                sharing: Some(sharing),
            }) => check_gate(sharing.strategy, gates),
            NvidiaConfig::Mig(MigDeviceConfig {
                sharing: Some(sharing),
            }) => check_gate(sharing.strategy, gates),
            NvidiaConfig::Gpu(_) | NvidiaConfig::Mig(_) => Ok(()),
            NvidiaConfig::Vfio(_) => {
                if gates.is_enabled(FeatureGate::PassthroughSupport) {
                    Ok(())
                } else {
                    Err(ConfigSupportError::GateDisabled {
                        what: "VfioDeviceConfig".into(),
                        gate: FeatureGate::PassthroughSupport,
                    })
                }
            }
        }
    }

    /// The sharing strategy and MPS settings of a GPU or MIG config, if any.
    pub fn sharing(&self) -> Option<(SharingStrategy, Option<&MpsConfig>, TimeSliceInterval)> {
        match self {
            NvidiaConfig::Gpu(GpuConfig {
                sharing: Some(sharing),
            }) => Some((
                sharing.strategy,
                sharing.mps_config.as_ref(),
                sharing
                    .time_slicing_config
                    .as_ref()
                    .and_then(|config| config.interval)
                    .unwrap_or_default(),
            )),
            NvidiaConfig::Mig(MigDeviceConfig {
                sharing: Some(sharing),
            }) => Some((
                sharing.strategy,
                sharing.mps_config.as_ref(),
                TimeSliceInterval::Default,
            )),
            _ => None,
        }
    }
}

fn check_gate(strategy: SharingStrategy, gates: &FeatureGates) -> Result<(), ConfigSupportError> {
    let gate = match strategy {
        SharingStrategy::TimeSlicing => FeatureGate::TimeSlicingSettings,
        SharingStrategy::Mps => FeatureGate::MpsSupport,
    };
    if gates.is_enabled(gate) {
        Ok(())
    } else {
        Err(ConfigSupportError::StrategyGateDisabled { strategy, gate })
    }
}

impl From<GpuConfig> for NvidiaConfig {
    fn from(config: GpuConfig) -> Self {
        NvidiaConfig::Gpu(config)
    }
}

impl From<MigDeviceConfig> for NvidiaConfig {
    fn from(config: MigDeviceConfig) -> Self {
        NvidiaConfig::Mig(config)
    }
}

impl From<VfioDeviceConfig> for NvidiaConfig {
    fn from(config: VfioDeviceConfig) -> Self {
        NvidiaConfig::Vfio(config)
    }
}

/// A config that decoded and validated, but that this node cannot honour.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigSupportError {
    /// The strategy's feature gate is off (upstream's message, word for word).
    #[error(
        "{:?} is selected as the GPU sharing strategy, but the {:?} feature gate is not enabled",
        .strategy.as_str(),
        .gate.name()
    )]
    StrategyGateDisabled {
        /// The requested strategy.
        strategy: SharingStrategy,
        /// The gate it needs.
        gate: FeatureGate,
    },
    /// A config kind whose feature gate is off.
    #[error("{what} needs the {:?} feature gate, which is not enabled on this node", .gate.name())]
    GateDisabled {
        /// What was asked for.
        what: String,
        /// The gate it needs.
        gate: FeatureGate,
    },
}

/// The three kinds of devices this driver publishes (the `type` attribute).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceType {
    /// A full GPU (`gpu-<minor>`).
    Gpu,
    /// A MIG device (`gpu-<minor>-mig-<profile>-<profileId>-<start>`).
    Mig,
    /// A GPU passed through with VFIO (`gpu-vfio-<index>`).
    Vfio,
}

impl DeviceType {
    /// `gpu`, `mig` or `vfio`: the `type` attribute.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceType::Gpu => "gpu",
            DeviceType::Mig => "mig",
            DeviceType::Vfio => "vfio",
        }
    }

    /// The config kind for this device type.
    pub fn config_kind(self) -> ConfigKind {
        match self {
            DeviceType::Gpu => ConfigKind::of::<GpuConfig>(),
            DeviceType::Mig => ConfigKind::of::<MigDeviceConfig>(),
            DeviceType::Vfio => ConfigKind::of::<VfioDeviceConfig>(),
        }
    }
}

impl fmt::Display for DeviceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceType::Gpu => "GPU",
            DeviceType::Mig => "MIG device",
            DeviceType::Vfio => "VFIO device",
        })
    }
}

/// One config that applies to a device, as [`select_config`] sees it.
#[derive(Clone, Copy, Debug)]
pub struct CandidateConfig<'a> {
    /// The decoded config.
    pub config: &'a NvidiaConfig,
    /// Whether the config's `requests` list names the device's request (rather than being
    /// empty, which means every request).
    pub names_request: bool,
}

/// A config of one kind was aimed at a device of another.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{config} cannot configure {device_type} {device:?} (request {request:?}); use {}",
    .device_type.config_kind()
)]
pub struct ConfigMismatch {
    /// The config's kind.
    pub config: ConfigKind,
    /// The device's type.
    pub device_type: DeviceType,
    /// The device name.
    pub device: String,
    /// The request the device was allocated for.
    pub request: String,
}

/// Picks the config of one device from the configs that apply to it, lowest precedence
/// first (the order of [`AllocatedDevice::configs`](dra_sdk::claim::AllocatedDevice)).
///
/// Returns the default config of `device_type` when none matches. See the
/// [module documentation](self#which-config-applies-to-a-device) for the rules.
///
/// ```
/// use dra_driver_nvidia::config::*;
///
/// let gpu = NvidiaConfig::Gpu(GpuConfig::default());
/// let error = select_config(
///     DeviceType::Mig,
///     "gpu-0-mig-1g10gb-19-0",
///     "mig",
///     &[CandidateConfig { config: &gpu, names_request: true }],
/// )
/// .unwrap_err();
/// assert_eq!(
///     error.to_string(),
///     "GpuConfig (resource.nvidia.com/v1beta1) cannot configure MIG device \
///      \"gpu-0-mig-1g10gb-19-0\" (request \"mig\"); use MigDeviceConfig (resource.nvidia.com/v1beta1)",
/// );
/// // Without `requests`, a GpuConfig does not apply to MIG devices at all.
/// let picked = select_config(
///     DeviceType::Mig,
///     "gpu-0-mig-1g10gb-19-0",
///     "mig",
///     &[CandidateConfig { config: &gpu, names_request: false }],
/// )?;
/// assert_eq!(picked, NvidiaConfig::Mig(MigDeviceConfig::default()));
/// # Ok::<(), ConfigMismatch>(())
/// ```
pub fn select_config(
    device_type: DeviceType,
    device: &str,
    request: &str,
    candidates: &[CandidateConfig<'_>],
) -> Result<NvidiaConfig, ConfigMismatch> {
    for candidate in candidates.iter().rev() {
        if candidate.config.device_type() == device_type {
            return Ok(candidate.config.clone());
        }
        if candidate.names_request {
            return Err(ConfigMismatch {
                config: candidate.config.kind(),
                device_type,
                device: device.to_owned(),
                request: request.to_owned(),
            });
        }
    }
    Ok(NvidiaConfig::default_for(device_type))
}

// ---------------------------------------------------------------------------------------
// GpuConfig

/// Configuration of full GPUs (`kind: GpuConfig`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, OpaqueConfig)]
#[serde(rename_all = "camelCase")]
#[dra(api_version = "resource.nvidia.com/v1beta1", kind = "GpuConfig")]
pub struct GpuConfig {
    /// How the GPU is shared between the containers of a claim; none by default (no
    /// implicit time-slicing, as upstream since v0.5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<GpuSharing>,
}

/// Sharing of a full GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuSharing {
    /// The strategy.
    pub strategy: SharingStrategy,
    /// Settings of `TimeSlicing`; only with that strategy. Defaults to interval `Default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slicing_config: Option<TimeSlicingConfig>,
    /// Settings of `MPS`; only with that strategy. Defaults to an empty config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_config: Option<MpsConfig>,
}

/// GPU sharing strategies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SharingStrategy {
    /// Processes take turns on the GPU.
    TimeSlicing,
    /// NVIDIA Multi-Process Service.
    #[serde(rename = "MPS")]
    Mps,
}

impl SharingStrategy {
    /// The name as written in configs.
    pub fn as_str(self) -> &'static str {
        match self {
            SharingStrategy::TimeSlicing => "TimeSlicing",
            SharingStrategy::Mps => "MPS",
        }
    }
}

/// Time-slicing settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TimeSlicingConfig {
    /// Length of a time slice; `Default` when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<TimeSliceInterval>,
}

/// Time-slice lengths, as `nvidia-smi compute-policy --set-timeslice` takes them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TimeSliceInterval {
    /// The driver's default.
    #[default]
    Default,
    /// Short slices.
    Short,
    /// Medium slices.
    Medium,
    /// Long slices.
    Long,
}

impl TimeSliceInterval {
    /// The value passed to `nvidia-smi compute-policy --set-timeslice`.
    pub fn nvidia_smi_value(self) -> u8 {
        match self {
            TimeSliceInterval::Default => 0,
            TimeSliceInterval::Short => 1,
            TimeSliceInterval::Medium => 2,
            TimeSliceInterval::Long => 3,
        }
    }
}

/// MPS settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MpsConfig {
    /// Share of the multiprocessors each client may use, 0 to 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_active_thread_percentage: Option<i64>,
    /// Pinned device memory limit of every device of the group; at least 1Mi.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_pinned_device_memory_limit: Option<Quantity>,
    /// Per-device overrides of the limit, keyed by device UUID or by index into the
    /// claim's allocated devices. Keys are checked against the devices at prepare.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_per_device_pinned_memory_limit: Option<BTreeMap<String, Quantity>>,
    /// Start the MPS control daemon in multi-user mode (`-M`); needs compute capability
    /// 7.0 or newer on every GPU, checked at prepare.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multi_user: Option<bool>,
}

const MIB: u64 = 1 << 20;

impl MpsConfig {
    fn validate(&self, path: &str) -> Result<(), ConfigValidationError> {
        if let Some(percentage) = self.default_active_thread_percentage
            && !(0..=100).contains(&percentage)
        {
            return Err(ConfigValidationError::for_field(
                format!("{path}.defaultActiveThreadPercentage"),
                format!("must be between 0 and 100, got {percentage}"),
            ));
        }
        if let Some(limit) = &self.default_pinned_device_memory_limit {
            check_limit(&format!("{path}.defaultPinnedDeviceMemoryLimit"), limit)?;
        }
        for (key, limit) in self.default_per_device_pinned_memory_limit.iter().flatten() {
            if key.is_empty() {
                return Err(ConfigValidationError::for_field(
                    format!("{path}.defaultPerDevicePinnedMemoryLimit"),
                    "keys must be a device UUID or an index, got an empty key",
                ));
            }
            check_limit(
                &format!("{path}.defaultPerDevicePinnedMemoryLimit[{key}]"),
                limit,
            )?;
        }
        Ok(())
    }
}

/// The messages do not quote the value: the SDK never echoes a user's string in a config
/// error (it could be a secret in another field), and a driver's own checks follow suit.
fn check_limit(field: &str, limit: &Quantity) -> Result<(), ConfigValidationError> {
    match limit.bytes() {
        None => Err(ConfigValidationError::for_field(
            field,
            "is not a valid quantity (for example 10Gi or 512Mi)",
        )),
        Some(bytes) if bytes < MIB => Err(ConfigValidationError::for_field(
            field,
            format!("must be at least 1Mi, got {bytes} bytes"),
        )),
        Some(_) => Ok(()),
    }
}

impl ConfigHooks for GpuConfig {
    fn normalize(&mut self) {
        if let Some(sharing) = &mut self.sharing {
            match sharing.strategy {
                SharingStrategy::TimeSlicing => {
                    let config = sharing
                        .time_slicing_config
                        .get_or_insert_with(TimeSlicingConfig::default);
                    config.interval.get_or_insert(TimeSliceInterval::Default);
                }
                SharingStrategy::Mps => {
                    sharing.mps_config.get_or_insert_with(MpsConfig::default);
                }
            }
        }
    }

    fn validate(&self) -> Result<(), ConfigValidationError> {
        let Some(sharing) = &self.sharing else {
            return Ok(());
        };
        match sharing.strategy {
            SharingStrategy::TimeSlicing if sharing.mps_config.is_some() => {
                Err(ConfigValidationError::for_field(
                    "sharing.mpsConfig",
                    "must not be set with strategy TimeSlicing",
                ))
            }
            SharingStrategy::Mps if sharing.time_slicing_config.is_some() => {
                Err(ConfigValidationError::for_field(
                    "sharing.timeSlicingConfig",
                    "must not be set with strategy MPS",
                ))
            }
            SharingStrategy::Mps => match &sharing.mps_config {
                Some(mps) => mps.validate("sharing.mpsConfig"),
                None => Ok(()),
            },
            SharingStrategy::TimeSlicing => Ok(()),
        }
    }
}

// ---------------------------------------------------------------------------------------
// MigDeviceConfig

/// Configuration of MIG devices (`kind: MigDeviceConfig`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, OpaqueConfig)]
#[serde(rename_all = "camelCase")]
#[dra(api_version = "resource.nvidia.com/v1beta1", kind = "MigDeviceConfig")]
pub struct MigDeviceConfig {
    /// How the MIG device is shared; none by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<MigDeviceSharing>,
}

/// Sharing of a MIG device. There is no `timeSlicingConfig`: MIG devices have no time
/// slice to set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigDeviceSharing {
    /// The strategy.
    pub strategy: SharingStrategy,
    /// Settings of `MPS`; only with that strategy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_config: Option<MpsConfig>,
}

impl ConfigHooks for MigDeviceConfig {
    fn normalize(&mut self) {
        if let Some(sharing) = &mut self.sharing
            && sharing.strategy == SharingStrategy::Mps
        {
            sharing.mps_config.get_or_insert_with(MpsConfig::default);
        }
    }

    fn validate(&self) -> Result<(), ConfigValidationError> {
        let Some(sharing) = &self.sharing else {
            return Ok(());
        };
        match (&sharing.strategy, &sharing.mps_config) {
            (SharingStrategy::TimeSlicing, Some(_)) => Err(ConfigValidationError::for_field(
                "sharing.mpsConfig",
                "must not be set with strategy TimeSlicing",
            )),
            (SharingStrategy::Mps, Some(mps)) => mps.validate("sharing.mpsConfig"),
            _ => Ok(()),
        }
    }
}

// ---------------------------------------------------------------------------------------
// VfioDeviceConfig

/// Configuration of GPUs passed through with VFIO (`kind: VfioDeviceConfig`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, OpaqueConfig)]
#[serde(rename_all = "camelCase")]
#[dra(api_version = "resource.nvidia.com/v1beta1", kind = "VfioDeviceConfig")]
pub struct VfioDeviceConfig {
    /// IOMMU settings; normalised to the defaults when omitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iommu: Option<IommuConfig>,
}

/// IOMMU settings of a VFIO device.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IommuConfig {
    /// Legacy VFIO group devices or IOMMUFD; `LegacyOnly` by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_policy: Option<IommuBackendPolicy>,
    /// Also give the container the API device: `/dev/iommu` (IOMMUFD) or `/dev/vfio/vfio`
    /// (legacy). False by default.
    #[serde(
        default,
        rename = "enableAPIDevice",
        skip_serializing_if = "Option::is_none"
    )]
    pub enable_api_device: Option<bool>,
}

/// Which VFIO interface a container gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum IommuBackendPolicy {
    /// The group device `/dev/vfio/<group>` (and `/dev/vfio/vfio` as the API device).
    #[default]
    LegacyOnly,
    /// The per-device cdev `/dev/vfio/devices/vfioN` (and `/dev/iommu`) when the host has
    /// IOMMUFD, the legacy devices otherwise.
    #[serde(rename = "PreferIommuFD")]
    PreferIommuFd,
}

impl VfioDeviceConfig {
    /// The backend policy, after normalisation.
    pub fn backend_policy(&self) -> IommuBackendPolicy {
        self.iommu
            .as_ref()
            .and_then(|iommu| iommu.backend_policy)
            .unwrap_or_default()
    }

    /// Whether the API device is requested, after normalisation.
    pub fn enable_api_device(&self) -> bool {
        self.iommu
            .as_ref()
            .and_then(|iommu| iommu.enable_api_device)
            .unwrap_or(false)
    }
}

impl ConfigHooks for VfioDeviceConfig {
    fn normalize(&mut self) {
        let iommu = self.iommu.get_or_insert_with(IommuConfig::default);
        iommu
            .backend_policy
            .get_or_insert(IommuBackendPolicy::LegacyOnly);
        iommu.enable_api_device.get_or_insert(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_map_to_nvidia_smi_values() {
        let values: Vec<u8> = [
            TimeSliceInterval::Default,
            TimeSliceInterval::Short,
            TimeSliceInterval::Medium,
            TimeSliceInterval::Long,
        ]
        .into_iter()
        .map(TimeSliceInterval::nvidia_smi_value)
        .collect();
        assert_eq!(values, [0, 1, 2, 3]);
    }

    #[test]
    fn defaults_per_device_type() {
        assert_eq!(
            NvidiaConfig::default_for(DeviceType::Gpu),
            NvidiaConfig::Gpu(GpuConfig { sharing: None })
        );
        let NvidiaConfig::Vfio(vfio) = NvidiaConfig::default_for(DeviceType::Vfio) else {
            panic!("not a VFIO config");
        };
        assert_eq!(vfio.backend_policy(), IommuBackendPolicy::LegacyOnly);
        assert!(!vfio.enable_api_device());
    }

    #[test]
    fn the_last_config_of_the_right_kind_wins() {
        let long = NvidiaConfig::Gpu(GpuConfig {
            sharing: Some(GpuSharing {
                strategy: SharingStrategy::TimeSlicing,
                time_slicing_config: Some(TimeSlicingConfig {
                    interval: Some(TimeSliceInterval::Long),
                }),
                mps_config: None,
            }),
        });
        let plain = NvidiaConfig::Gpu(GpuConfig::default());
        let mig = NvidiaConfig::Mig(MigDeviceConfig::default());
        let candidates = [
            CandidateConfig {
                config: &plain,
                names_request: false,
            },
            CandidateConfig {
                config: &long,
                names_request: true,
            },
            CandidateConfig {
                config: &mig,
                names_request: false,
            },
        ];
        let picked = select_config(DeviceType::Gpu, "gpu-0", "gpu", &candidates).unwrap();
        assert_eq!(picked, long);
    }
}
