//! CDI spec versions and the minimum version a spec's contents need.
//!
//! Runtimes reject a spec whose `cdiVersion` they do not know (containerd 1.7 and CRI-O up to
//! 1.27 know nothing newer than 0.5.0), so a writer should declare the *lowest* version its
//! contents allow: [`Spec::minimum_version`] computes it exactly as the reference's
//! `MinimumRequiredVersion` does, and [`SpecWriter`](super::SpecWriter) writes it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::error::CdiError;
use super::spec::{ContainerEdits, Spec};

/// A released CDI spec version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Version {
    /// 0.1.0: a pre-release draft. Known, but below every spec's minimum, so never valid.
    V0_1_0,
    /// 0.2.0: a pre-release draft. Known, but below every spec's minimum, so never valid.
    V0_2_0,
    /// 0.3.0: the baseline (env, device nodes, mounts, hooks).
    V0_3_0,
    /// 0.4.0: `mounts[].type`.
    V0_4_0,
    /// 0.5.0: `deviceNodes[].hostPath`; device names starting with a digit.
    V0_5_0,
    /// 0.6.0: annotations; dots in the class.
    V0_6_0,
    /// 0.7.0: `intelRdt`, `additionalGids`.
    V0_7_0,
    /// 0.8.0: no spec change.
    V0_8_0,
    /// 1.0.0: no spec change.
    V1_0_0,
    /// 1.1.0: `netDevices`, `intelRdt.schemata`, `intelRdt.enableMonitoring`.
    V1_1_0,
}

impl Version {
    /// The newest version this module knows and writes.
    pub const CURRENT: Version = Version::V1_1_0;

    /// The lowest version any spec can declare: the minimum of a spec that uses no versioned
    /// feature.
    pub const EARLIEST: Version = Version::V0_3_0;

    /// Every known version, oldest first.
    pub const ALL: [Version; 10] = [
        Version::V0_1_0,
        Version::V0_2_0,
        Version::V0_3_0,
        Version::V0_4_0,
        Version::V0_5_0,
        Version::V0_6_0,
        Version::V0_7_0,
        Version::V0_8_0,
        Version::V1_0_0,
        Version::V1_1_0,
    ];

    /// The version as written in `cdiVersion` (`"0.5.0"`, no leading `v`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Version::V0_1_0 => "0.1.0",
            Version::V0_2_0 => "0.2.0",
            Version::V0_3_0 => "0.3.0",
            Version::V0_4_0 => "0.4.0",
            Version::V0_5_0 => "0.5.0",
            Version::V0_6_0 => "0.6.0",
            Version::V0_7_0 => "0.7.0",
            Version::V0_8_0 => "0.8.0",
            Version::V1_0_0 => "1.0.0",
            Version::V1_1_0 => "1.1.0",
        }
    }
}

impl FromStr for Version {
    type Err = CdiError;

    /// Parses a known version; a leading `v` is accepted, as by every reference library since
    /// v0.5.x.
    fn from_str(s: &str) -> Result<Version, CdiError> {
        parse_version(s).ok_or_else(|| CdiError::spec("cdiVersion", unknown_version(s)))
    }
}

fn parse_version(s: &str) -> Option<Version> {
    let bare = s.strip_prefix('v').unwrap_or(s);
    Version::ALL.into_iter().find(|v| v.as_str() == bare)
}

fn unknown_version(s: &str) -> String {
    format!(
        "unknown CDI version {s:?}; known versions are 0.1.0 to {}",
        Version::CURRENT
    )
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Version {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Version, D::Error> {
        let text = String::deserialize(deserializer)?;
        parse_version(&text).ok_or_else(|| serde::de::Error::custom(unknown_version(&text)))
    }
}

impl Default for Version {
    fn default() -> Self {
        Version::EARLIEST
    }
}

impl Spec {
    /// The lowest `cdiVersion` that can describe this spec, computed as the reference's
    /// `MinimumRequiredVersion`: the newest version one of whose features the spec uses, or
    /// [`Version::EARLIEST`].
    ///
    /// ```
    /// use dra_sdk::advanced::cdi::{CdiDevice, CdiVersion, Spec};
    /// use dra_sdk::cdi::{ContainerEdits, DeviceNode};
    ///
    /// let edits = ContainerEdits::new().device_node(DeviceNode::new("/dev/x").host_path("/dev/y"));
    /// let spec = Spec::new("vendor.com/class".parse()?).device(CdiDevice::new("a", edits));
    /// assert_eq!(spec.minimum_version(), CdiVersion::V0_5_0); // because of hostPath
    /// # Ok::<(), dra_sdk::cdi::CdiError>(())
    /// ```
    pub fn minimum_version(&self) -> Version {
        self.version_requirement()
            .map_or(Version::EARLIEST, |(version, _)| version)
    }

    /// Sets `cdiVersion` to [`minimum_version`](Self::minimum_version).
    pub fn set_minimum_version(&mut self) {
        self.version = self.minimum_version();
    }

    /// The minimum version and the first feature (in the reference's order of checks) that needs
    /// it; `None` when nothing raises the version above [`Version::EARLIEST`].
    pub(crate) fn version_requirement(&self) -> Option<(Version, String)> {
        // Newest first, as the reference tries its predicates; 0.8.0 and 1.0.0 changed nothing.
        self.requires_v1_1_0()
            .map(|why| (Version::V1_1_0, why))
            .or_else(|| self.requires_v0_7_0().map(|why| (Version::V0_7_0, why)))
            .or_else(|| self.requires_v0_6_0().map(|why| (Version::V0_6_0, why)))
            .or_else(|| self.requires_v0_5_0().map(|why| (Version::V0_5_0, why)))
            .or_else(|| self.requires_v0_4_0().map(|why| (Version::V0_4_0, why)))
    }

    /// Every container-edits block with the scope it belongs to, spec level first.
    fn edit_scopes(&self) -> impl Iterator<Item = (Scope<'_>, &ContainerEdits)> {
        std::iter::once((Scope::Spec, &self.container_edits)).chain(
            self.devices
                .iter()
                .map(|device| (Scope::Device(&device.name), &device.container_edits)),
        )
    }

    fn first_edit_use(
        &self,
        feature: &str,
        uses: impl Fn(&ContainerEdits) -> bool,
    ) -> Option<String> {
        self.edit_scopes()
            .find(|(_, edits)| uses(edits))
            .map(|(scope, _)| format!("{scope} uses {feature}"))
    }

    fn requires_v1_1_0(&self) -> Option<String> {
        self.first_edit_use("netDevices", |e| !e.net_devices.is_empty())
            .or_else(|| {
                self.first_edit_use("intelRdt.schemata", |e| {
                    e.intel_rdt
                        .as_ref()
                        .is_some_and(|rdt| rdt.schemata.is_some())
                })
            })
            .or_else(|| {
                self.first_edit_use("intelRdt.enableMonitoring", |e| {
                    e.intel_rdt
                        .as_ref()
                        .is_some_and(|rdt| rdt.enable_monitoring)
                })
            })
    }

    fn requires_v0_7_0(&self) -> Option<String> {
        self.first_edit_use("intelRdt", |e| e.intel_rdt.is_some())
            .or_else(|| self.first_edit_use("additionalGids", |e| !e.additional_gids.is_empty()))
    }

    fn requires_v0_6_0(&self) -> Option<String> {
        if !self.annotations.is_empty() {
            return Some("the spec has annotations".to_owned());
        }
        if let Some(device) = self.devices.iter().find(|d| !d.annotations.is_empty()) {
            return Some(format!("device {:?} has annotations", device.name));
        }
        if self.kind.class().contains('.') {
            return Some(format!("class {:?} contains a dot", self.kind.class()));
        }
        None
    }

    fn requires_v0_5_0(&self) -> Option<String> {
        if let Some(device) = self
            .devices
            .iter()
            .find(|d| d.name.as_bytes().first().is_some_and(u8::is_ascii_digit))
        {
            return Some(format!("device name {:?} starts with a digit", device.name));
        }
        self.first_edit_use("deviceNodes[].hostPath", |e| {
            e.device_nodes.iter().any(|node| !node.host_path.is_empty())
        })
    }

    fn requires_v0_4_0(&self) -> Option<String> {
        self.first_edit_use("mounts[].type", |e| {
            e.mounts.iter().any(|mount| !mount.mount_type.is_empty())
        })
    }
}

#[derive(Clone, Copy)]
enum Scope<'a> {
    Spec,
    Device(&'a str),
}

impl fmt::Display for Scope<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Spec => f.write_str("spec-level containerEdits"),
            Scope::Device(name) => write!(f, "device {name:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_accepts_known_versions_with_optional_v() {
        for v in Version::ALL {
            assert_eq!(v.as_str().parse::<Version>().unwrap(), v);
            assert_eq!(format!("v{v}").parse::<Version>().unwrap(), v);
        }
        for bad in ["", "1.2.0", "0.3", "vv0.3.0", "0.3.0 ", "V0.3.0"] {
            assert!(bad.parse::<Version>().is_err(), "{bad}");
        }
    }

    #[test]
    fn versions_are_ordered_oldest_first() {
        assert!(Version::ALL.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(Version::ALL.last(), Some(&Version::CURRENT));
    }
}
