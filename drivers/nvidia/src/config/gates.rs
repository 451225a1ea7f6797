//! Feature gates of the NVIDIA kubelet plugin, with upstream's names, defaults and
//! dependency rules (`--feature-gates` / `FEATURE_GATES`).

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// One feature gate of the upstream driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum FeatureGate {
    /// `TimeSlicingSettings` (Alpha, off): time-slicing configs.
    TimeSlicingSettings,
    /// `MPSSupport` (Alpha, off): MPS configs.
    MpsSupport,
    /// `IMEXDaemonsWithDNSNames` (Beta, on): ComputeDomains only.
    ImexDaemonsWithDnsNames,
    /// `PassthroughSupport` (Alpha, off): VFIO devices.
    PassthroughSupport,
    /// `DynamicMIG` (Alpha, off): MIG devices created at prepare.
    DynamicMig,
    /// `NVMLDeviceHealthCheck` (Alpha, off): XID events as device taints.
    NvmlDeviceHealthCheck,
    /// `ComputeDomainCliques` (Beta, on): ComputeDomains only.
    ComputeDomainCliques,
    /// `CrashOnNVLinkFabricErrors` (Beta, on): ComputeDomains only.
    CrashOnNvLinkFabricErrors,
    /// `DeviceMetadata` (Alpha, off): KEP-5304 device metadata files, written by the SDK for
    /// every prepared claim, from which KubeVirt reads a VFIO device's PCI address
    /// (`resource.kubernetes.io/pciBusID`). Needs `PassthroughSupport`.
    DeviceMetadata,
    /// `DRAListTypeAttributes` (Alpha, off): list-typed attributes.
    DraListTypeAttributes,
    /// `FabricManagerPartitioning` (Alpha, off): FM partition attributes.
    FabricManagerPartitioning,
    /// `HostManagedIMEXDaemon` (Alpha, off): ComputeDomains only.
    HostManagedImexDaemon,
    /// `ConsumableShares` (Alpha, off): GPUs allocatable by several claims.
    ConsumableShares,
}

impl FeatureGate {
    /// Every gate, in upstream's order.
    pub const ALL: [FeatureGate; 13] = [
        FeatureGate::TimeSlicingSettings,
        FeatureGate::MpsSupport,
        FeatureGate::ImexDaemonsWithDnsNames,
        FeatureGate::PassthroughSupport,
        FeatureGate::DynamicMig,
        FeatureGate::NvmlDeviceHealthCheck,
        FeatureGate::ComputeDomainCliques,
        FeatureGate::CrashOnNvLinkFabricErrors,
        FeatureGate::DeviceMetadata,
        FeatureGate::DraListTypeAttributes,
        FeatureGate::FabricManagerPartitioning,
        FeatureGate::HostManagedImexDaemon,
        FeatureGate::ConsumableShares,
    ];

    /// The gate's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            FeatureGate::TimeSlicingSettings => "TimeSlicingSettings",
            FeatureGate::MpsSupport => "MPSSupport",
            FeatureGate::ImexDaemonsWithDnsNames => "IMEXDaemonsWithDNSNames",
            FeatureGate::PassthroughSupport => "PassthroughSupport",
            FeatureGate::DynamicMig => "DynamicMIG",
            FeatureGate::NvmlDeviceHealthCheck => "NVMLDeviceHealthCheck",
            FeatureGate::ComputeDomainCliques => "ComputeDomainCliques",
            FeatureGate::CrashOnNvLinkFabricErrors => "CrashOnNVLinkFabricErrors",
            FeatureGate::DeviceMetadata => "DeviceMetadata",
            FeatureGate::DraListTypeAttributes => "DRAListTypeAttributes",
            FeatureGate::FabricManagerPartitioning => "FabricManagerPartitioning",
            FeatureGate::HostManagedImexDaemon => "HostManagedIMEXDaemon",
            FeatureGate::ConsumableShares => "ConsumableShares",
        }
    }

    /// Upstream's default.
    pub fn default_enabled(self) -> bool {
        matches!(
            self,
            FeatureGate::ImexDaemonsWithDnsNames
                | FeatureGate::ComputeDomainCliques
                | FeatureGate::CrashOnNvLinkFabricErrors
        )
    }
}

impl fmt::Display for FeatureGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FeatureGate {
    type Err = FeatureGateError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        FeatureGate::ALL
            .into_iter()
            .find(|gate| gate.name() == name)
            .ok_or_else(|| FeatureGateError::Unknown {
                name: name.to_owned(),
            })
    }
}

/// Why a feature-gate setting was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FeatureGateError {
    /// Not a gate of this driver.
    #[error("unknown feature gate {name:?}; known gates: {}", known_gates())]
    Unknown {
        /// The name given.
        name: String,
    },
    /// Not `Name=true` or `Name=false`.
    #[error("invalid feature gate setting {setting:?}: expected Name=true or Name=false")]
    Syntax {
        /// The setting given.
        setting: String,
    },
    /// A gate is on without a gate it needs.
    #[error("feature gate {gate} requires {requires} to be enabled")]
    Requires {
        /// The gate that is on.
        gate: FeatureGate,
        /// The gate it needs.
        requires: FeatureGate,
    },
    /// Two gates that cannot be on together.
    #[error("feature gates {0} and {1} cannot be enabled together")]
    Exclusive(FeatureGate, FeatureGate),
}

fn known_gates() -> String {
    FeatureGate::ALL
        .iter()
        .map(|gate| gate.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The feature gates of one plugin: upstream's defaults plus what was set.
///
/// ```
/// use dra_driver_nvidia::config::{FeatureGate, FeatureGates};
///
/// let gates: FeatureGates = "PassthroughSupport=true".parse()?;
/// assert!(gates.is_enabled(FeatureGate::PassthroughSupport));
/// assert!(gates.is_enabled(FeatureGate::ComputeDomainCliques)); // on by default
/// assert_eq!(
///     "DynamicMIG=true,PassthroughSupport=true".parse::<FeatureGates>().unwrap_err().to_string(),
///     "feature gates PassthroughSupport and DynamicMIG cannot be enabled together",
/// );
/// # Ok::<(), dra_driver_nvidia::config::FeatureGateError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FeatureGates {
    set: BTreeMap<FeatureGate, bool>,
}

impl FeatureGates {
    /// Upstream's defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets one gate, without checking the dependency rules (see [`validate`](Self::validate)).
    pub fn set(mut self, gate: FeatureGate, enabled: bool) -> Self {
        self.set.insert(gate, enabled);
        self
    }

    /// Whether a gate is on.
    pub fn is_enabled(&self, gate: FeatureGate) -> bool {
        self.set
            .get(&gate)
            .copied()
            .unwrap_or_else(|| gate.default_enabled())
    }

    /// Checks upstream's rules: `ComputeDomainCliques` needs `IMEXDaemonsWithDNSNames`,
    /// `DeviceMetadata` needs `PassthroughSupport`, and `DynamicMIG` excludes
    /// `PassthroughSupport` and `MPSSupport`, as `PassthroughSupport` excludes
    /// `NVMLDeviceHealthCheck`. Unlike upstream, `DynamicMIG` and `NVMLDeviceHealthCheck` go
    /// together: health events of a partitionable GPU taint its full GPU and partitions
    /// (`docs/dynamic-mig.md`).
    pub fn validate(&self) -> Result<(), FeatureGateError> {
        use FeatureGate::*;
        for (gate, requires) in [
            (ComputeDomainCliques, ImexDaemonsWithDnsNames),
            (DeviceMetadata, PassthroughSupport),
        ] {
            if self.is_enabled(gate) && !self.is_enabled(requires) {
                return Err(FeatureGateError::Requires { gate, requires });
            }
        }
        for (a, b) in [
            (PassthroughSupport, DynamicMig),
            (MpsSupport, DynamicMig),
            (PassthroughSupport, NvmlDeviceHealthCheck),
        ] {
            if self.is_enabled(a) && self.is_enabled(b) {
                return Err(FeatureGateError::Exclusive(a, b));
            }
        }
        Ok(())
    }
}

impl FromStr for FeatureGates {
    type Err = FeatureGateError;

    /// `Name=true,Other=false` (spaces allowed around items), then [`validate`](Self::validate).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut gates = FeatureGates::new();
        for setting in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (name, value) =
                setting
                    .split_once('=')
                    .ok_or_else(|| FeatureGateError::Syntax {
                        setting: setting.to_owned(),
                    })?;
            let gate: FeatureGate = name.trim().parse()?;
            let enabled = match value.trim() {
                "true" => true,
                "false" => false,
                _ => {
                    return Err(FeatureGateError::Syntax {
                        setting: setting.to_owned(),
                    });
                }
            };
            gates = gates.set(gate, enabled);
        }
        gates.validate()?;
        Ok(gates)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for gate in FeatureGate::ALL {
            assert_eq!(gate.name().parse::<FeatureGate>(), Ok(gate));
        }
    }

    #[test]
    fn errors_are_clear() {
        let error = "Passthrough=true".parse::<FeatureGates>().unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("unknown feature gate \"Passthrough\"; known gates: TimeSlicingSettings, MPSSupport,"),
            "{error}"
        );
        assert_eq!(
            "PassthroughSupport=yes"
                .parse::<FeatureGates>()
                .unwrap_err()
                .to_string(),
            "invalid feature gate setting \"PassthroughSupport=yes\": expected Name=true or Name=false"
        );
        assert_eq!(
            "DeviceMetadata=true"
                .parse::<FeatureGates>()
                .unwrap_err()
                .to_string(),
            "feature gate DeviceMetadata requires PassthroughSupport to be enabled"
        );
        assert_eq!(
            "IMEXDaemonsWithDNSNames=false"
                .parse::<FeatureGates>()
                .unwrap_err()
                .to_string(),
            "feature gate ComputeDomainCliques requires IMEXDaemonsWithDNSNames to be enabled"
        );
        assert!("".parse::<FeatureGates>().is_ok());
    }
}
