//! Per-release validation limits of ResourceSlices.

use std::fmt;

/// A Kubernetes minor release, as reported by the API server's `/version`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KubernetesVersion {
    /// Major version (1).
    pub major: u32,
    /// Minor version (34 for 1.34).
    pub minor: u32,
}

impl KubernetesVersion {
    /// A release.
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// Parses `/version` output: the emulated version if the server reports one (it
    /// validates as that release), else `major`/`minor` (tolerating a trailing `+`), else
    /// `gitVersion` (`v1.35.2-gke.100`).
    pub fn from_version_info(info: &serde_json::Value) -> Option<Self> {
        let field = |name: &str| info.get(name).and_then(serde_json::Value::as_str);
        let number = |s: &str| s.trim_end_matches('+').parse::<u32>().ok();
        let pair = |major: &str, minor: &str| {
            Some(Self::new(number(field(major)?)?, number(field(minor)?)?))
        };
        pair("emulationMajor", "emulationMinor")
            .or_else(|| pair("major", "minor"))
            .or_else(|| Self::parse_git_version(field("gitVersion")?))
    }

    /// Parses a `gitVersion` such as `v1.34.1` or `v1.36.0-rc.1+k3s1`.
    pub fn parse_git_version(git_version: &str) -> Option<Self> {
        let mut parts = git_version.strip_prefix('v')?.split('.');
        let major = parts.next()?.parse().ok()?;
        let minor: String = parts
            .next()?
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        Some(Self::new(major, minor.parse().ok()?))
    }
}

impl fmt::Display for KubernetesVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Where a pool's shared counter sets are published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CounterLayout {
    /// Kubernetes 1.34: counter sets belong to one slice and only its devices consume them;
    /// the publisher puts all counter sets and all consuming devices of a pool in one slice.
    WithDevices,
    /// Kubernetes 1.35+: counter sets are pool-wide and live in slices without devices.
    SeparateSlices,
}

/// Validation limits of the API server a publisher talks to (kubelet-wire §3.4).
///
/// [`SliceLimits::for_release`] gives the rules of a release; [`SliceLimits::strictest`] the
/// strictest combination of all supported releases, used while the release is unknown.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SliceLimits {
    /// The release these limits belong to; `None` for [`SliceLimits::strictest`].
    pub release: Option<KubernetesVersion>,
    /// Devices per slice.
    pub max_devices_per_slice: usize,
    /// Devices per slice when any device in it has taints, consumes counters or (1.36) has
    /// list-typed attributes.
    pub max_devices_per_slice_advanced: usize,
    /// Where counter sets go.
    pub counter_layout: CounterLayout,
    /// Counter sets per slice (1.35+: 8).
    pub max_counter_sets_per_slice: usize,
    /// Counters per counter set.
    pub max_counters_per_set: usize,
    /// Counters across all counter sets of one slice (1.34: 32).
    pub max_counters_per_slice: Option<usize>,
    /// Counter-consumption entries per device (1.35+: 2).
    pub max_consumptions_per_device: usize,
    /// Counters per consumption entry.
    pub max_counters_per_consumption: usize,
    /// Consumed counters per device across entries (1.34: 32).
    pub max_consumed_counters_per_device: Option<usize>,
    /// Consumed counters across all devices of a slice (1.34: 1024).
    pub max_consumed_counters_per_slice: Option<usize>,
    /// Attributes plus capacities per device.
    pub max_attributes_and_capacities: usize,
    /// Attribute values per device, list elements counted (1.36: 48).
    pub max_attribute_values: Option<usize>,
    /// Taints per device (1.34: 4, 1.35+: 16).
    pub max_taints_per_device: usize,
    /// Binding conditions, and separately binding-failure conditions, per device.
    pub max_binding_conditions: usize,
    /// Length of string and version attribute values.
    pub max_string_length: usize,
    /// Whether the release knows list-typed attributes (1.36+).
    pub list_attributes: bool,
    /// Whether the release knows the 1.37 device-model fields: `partitionTypeAttribute`,
    /// `compatibilityGroups`, `nodeAllocatableResources` (in its 1.37 shape; 1.36's alpha
    /// `nodeAllocatableResourceMappings` is not supported) and `skipNodeOperations`. All are
    /// alpha in 1.37, so a 1.37 server may still drop them (reported as dropped fields).
    pub device_model_1_37: bool,
    /// Compatibility groups per counter consumption (1.37: 2).
    pub max_compatibility_groups: usize,
}

impl SliceLimits {
    /// The limits of Kubernetes 1.37 (also used for newer releases).
    fn v1_37() -> Self {
        Self {
            release: Some(KubernetesVersion::new(1, 37)),
            max_devices_per_slice: 128,
            max_devices_per_slice_advanced: 64,
            counter_layout: CounterLayout::SeparateSlices,
            max_counter_sets_per_slice: 8,
            max_counters_per_set: 32,
            max_counters_per_slice: None,
            max_consumptions_per_device: 2,
            max_counters_per_consumption: 32,
            max_consumed_counters_per_device: None,
            max_consumed_counters_per_slice: None,
            max_attributes_and_capacities: 32,
            max_attribute_values: Some(48),
            max_taints_per_device: 16,
            max_binding_conditions: 4,
            max_string_length: 64,
            list_attributes: true,
            device_model_1_37: true,
            max_compatibility_groups: 2,
        }
    }

    /// The limits of a release. Releases before 1.34 get the 1.34 rules, releases after 1.37
    /// the 1.37 rules.
    pub fn for_release(release: KubernetesVersion) -> Self {
        let mut limits = Self::v1_37();
        limits.release = Some(release);
        if release.major != 1 || release.minor >= 37 {
            return limits;
        }
        limits.device_model_1_37 = false;
        if release.minor >= 36 {
            return limits;
        }
        limits.list_attributes = false;
        limits.max_attribute_values = None;
        if release.minor <= 34 {
            limits.max_devices_per_slice_advanced = 128;
            limits.counter_layout = CounterLayout::WithDevices;
            limits.max_counters_per_slice = Some(32);
            limits.max_consumptions_per_device = 32;
            limits.max_consumed_counters_per_device = Some(32);
            limits.max_consumed_counters_per_slice = Some(1024);
            limits.max_taints_per_device = 4;
        }
        limits
    }

    /// The limits for an unknown release: every limit at its strictest across 1.34–1.37, the
    /// 1.35+ counter layout (partitionable devices are alpha before 1.35), and list-typed
    /// attributes and the 1.37 device-model fields allowed (the server reports them as
    /// dropped if it does not know them).
    pub fn strictest() -> Self {
        Self {
            release: None,
            max_counters_per_slice: Some(32),
            max_consumed_counters_per_device: Some(32),
            max_consumed_counters_per_slice: Some(1024),
            max_taints_per_device: 4,
            ..Self::v1_37()
        }
    }

    /// [`SliceLimits::for_release`] when known, else [`SliceLimits::strictest`].
    pub fn for_optional_release(release: Option<KubernetesVersion>) -> Self {
        release.map_or_else(Self::strictest, Self::for_release)
    }

    /// Device slots the publisher fills per slice unless the pool asks otherwise: the
    /// advanced-feature limit, so that tainting a device (a health change) rewrites one slice
    /// instead of splitting a full one and moving the pool to a new generation.
    pub fn default_devices_per_slice(&self) -> usize {
        self.max_devices_per_slice_advanced
    }
}

impl Default for SliceLimits {
    fn default() -> Self {
        Self::strictest()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_version_info() {
        let info = json!({"major": "1", "minor": "35+", "gitVersion": "v1.35.2-eks"});
        assert_eq!(
            KubernetesVersion::from_version_info(&info),
            Some(KubernetesVersion::new(1, 35))
        );
        let emulated =
            json!({"major": "1", "minor": "36", "emulationMajor": "1", "emulationMinor": "35"});
        assert_eq!(
            KubernetesVersion::from_version_info(&emulated),
            Some(KubernetesVersion::new(1, 35))
        );
        let git_only = json!({"gitVersion": "v1.34.0-rc.1+k3s1"});
        assert_eq!(
            KubernetesVersion::from_version_info(&git_only),
            Some(KubernetesVersion::new(1, 34))
        );
        assert_eq!(KubernetesVersion::from_version_info(&json!({})), None);
        assert_eq!(KubernetesVersion::new(1, 34).to_string(), "1.34");
    }

    #[test]
    fn release_tables() {
        let v134 = SliceLimits::for_release(KubernetesVersion::new(1, 34));
        assert_eq!(v134.max_devices_per_slice_advanced, 128);
        assert_eq!(v134.max_taints_per_device, 4);
        assert_eq!(v134.counter_layout, CounterLayout::WithDevices);
        assert!(!v134.list_attributes);

        let v135 = SliceLimits::for_release(KubernetesVersion::new(1, 35));
        assert_eq!(v135.max_devices_per_slice_advanced, 64);
        assert_eq!(v135.max_taints_per_device, 16);
        assert_eq!(v135.max_consumptions_per_device, 2);
        assert_eq!(v135.counter_layout, CounterLayout::SeparateSlices);
        assert!(!v135.list_attributes);

        let v136 = SliceLimits::for_release(KubernetesVersion::new(1, 36));
        assert!(v136.list_attributes);
        assert!(!v136.device_model_1_37);
        assert!(!v135.device_model_1_37);

        let v137 = SliceLimits::for_release(KubernetesVersion::new(1, 37));
        assert_eq!(v137.max_attribute_values, Some(48));
        assert!(v137.list_attributes);
        assert!(v137.device_model_1_37);
        assert_eq!(v137.max_compatibility_groups, 2);
        let v138 = SliceLimits::for_release(KubernetesVersion::new(1, 38));
        assert!(v138.device_model_1_37);
        assert_eq!(v138.release, Some(KubernetesVersion::new(1, 38)));

        let strict = SliceLimits::strictest();
        assert_eq!(strict.max_taints_per_device, 4);
        assert_eq!(strict.max_devices_per_slice_advanced, 64);
        assert_eq!(strict.max_counters_per_slice, Some(32));
        assert_eq!(strict.counter_layout, CounterLayout::SeparateSlices);
        assert!(strict.device_model_1_37);
    }
}
