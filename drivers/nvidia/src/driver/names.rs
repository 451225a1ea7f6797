//! Device names as the driver publishes them, parsed back at prepare.

use std::fmt;

/// A published device name, parsed.
///
/// ```
/// use dra_driver_nvidia::driver::DeviceName;
///
/// assert_eq!(DeviceName::parse("gpu-3"), Some(DeviceName::Gpu { minor: 3 }));
/// assert_eq!(
///     DeviceName::parse("gpu-0-mig-1g10gb-19-6"),
///     Some(DeviceName::Mig { parent_minor: 0, profile: "1g10gb".into(), profile_id: 19, placement_start: 6 }),
/// );
/// assert_eq!(DeviceName::parse("gpu-vfio-1"), Some(DeviceName::Vfio { index: 1 }));
/// assert_eq!(DeviceName::parse("gpu-x"), None);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DeviceName {
    /// `gpu-<minor>`.
    Gpu {
        /// Device minor of the GPU.
        minor: u32,
    },
    /// `gpu-<parentMinor>-mig-<profile>-<giProfileId>-<placementStart>`.
    Mig {
        /// Device minor of the parent GPU.
        parent_minor: u32,
        /// The profile, as it appears in the name (`1g10gb`, `1g10gb-me`).
        profile: String,
        /// GPU-instance profile ID.
        profile_id: u32,
        /// First memory slice of the placement.
        placement_start: u32,
    },
    /// `gpu-vfio-<index>`: the `index`-th NVIDIA GPU PCI function in bus-ID order.
    Vfio {
        /// Position among the NVIDIA GPU PCI functions.
        index: u32,
    },
}

impl DeviceName {
    /// Parses a device name; `None` when it is not one of the three forms.
    pub fn parse(name: &str) -> Option<Self> {
        let rest = name.strip_prefix("gpu-")?;
        if let Some(index) = rest.strip_prefix("vfio-") {
            return Some(DeviceName::Vfio {
                index: number(index)?,
            });
        }
        match rest.split_once("-mig-") {
            None => Some(DeviceName::Gpu {
                minor: number(rest)?,
            }),
            Some((parent, mig)) => {
                // The profile may itself contain dashes (`1g10gb-me`): the last two fields
                // are the numbers.
                let (head, start) = mig.rsplit_once('-')?;
                let (profile, id) = head.rsplit_once('-')?;
                if profile.is_empty() {
                    return None;
                }
                Some(DeviceName::Mig {
                    parent_minor: number(parent)?,
                    profile: profile.to_owned(),
                    profile_id: number(id)?,
                    placement_start: number(start)?,
                })
            }
        }
    }

    /// The name part that upstream derives from a MIG profile name: dots removed,
    /// lowercased, characters outside `[a-z0-9-]` mapped to `-` (`1g.10gb+me` → `1g10gb-me`).
    pub fn mig_profile_part(profile: &str) -> String {
        profile
            .chars()
            .filter(|c| *c != '.')
            .map(|c| c.to_ascii_lowercase())
            .map(|c| {
                if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' {
                    c
                } else {
                    '-'
                }
            })
            .collect()
    }
}

fn number(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

impl fmt::Display for DeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceName::Gpu { minor } => write!(f, "gpu-{minor}"),
            DeviceName::Mig {
                parent_minor,
                profile,
                profile_id,
                placement_start,
            } => write!(
                f,
                "gpu-{parent_minor}-mig-{profile}-{profile_id}-{placement_start}"
            ),
            DeviceName::Vfio { index } => write!(f, "gpu-vfio-{index}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects() {
        for name in [
            "gpu-0",
            "gpu-17",
            "gpu-0-mig-1g10gb-19-0",
            "gpu-7-mig-1g10gb-me-20-3",
            "gpu-vfio-4",
        ] {
            assert_eq!(DeviceName::parse(name).unwrap().to_string(), name);
        }
        for bad in [
            "",
            "gpu-",
            "gpu--1",
            "gpu-a",
            "gpu-0-mig--19-0",
            "gpu-0-mig-1g-x-0",
            "gpu-vfio-",
            "cpu-0",
            "gpu-+1",
        ] {
            assert_eq!(DeviceName::parse(bad), None, "{bad}");
        }
        assert_eq!(DeviceName::mig_profile_part("1g.10gb+me"), "1g10gb-me");
        assert_eq!(DeviceName::mig_profile_part("7g.80gb"), "7g80gb");
    }
}
