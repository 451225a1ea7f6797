//! Rebinding a GPU between the `nvidia` driver and a VFIO driver through sysfs.
//!
//! Everything goes through a [`Host`]: sysfs writes, `modprobe` and `fuser` (run chrooted into
//! the host root, as upstream does). The sequence, with the exact writes:
//!
//! 1. the IOMMU must be on (`iommu_group` link), the GPU must have no SR-IOV VFs;
//! 2. the VFIO driver is chosen from `modules.alias` for the device's `modalias`
//!    (`vfio_pci:v000010DEd…` entries, for example `nvgrace_gpu_vfio_pci` on Grace Hopper),
//!    falling back to `vfio-pci`; its module is loaded with `modprobe` when the driver is not
//!    registered in `/sys/bus/pci/drivers`;
//! 3. while bound to `nvidia`, wait until no process holds `/dev/nvidia<minor>` (`fuser`
//!    every `poll` until `timeout`; upstream: 1 s and 60 s; where `fuser` cannot run, the
//!    `/proc/<pid>/fd` links are read instead);
//! 4. unbind: `\n` to `/sys/bus/pci/devices/<bdf>/driver_override`, `<bdf>` to
//!    `/sys/bus/pci/drivers/<current>/unbind`;
//! 5. bind: `<vfio driver>` to `driver_override`, `<bdf>` to
//!    `/sys/bus/pci/drivers/<vfio driver>/bind`; then the `driver` link must name it.
//!
//! A failure after step 4 restores the previous binding ([`VfioBinder::restore`]). A GPU
//! found already bound to a VFIO driver is used as is and left that way at unprepare
//! (upstream rebinds it to `nvidia`, issues #1330 and #1089).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::host::{Host, HostCommand, HostError, facts};

/// The generic VFIO PCI driver.
pub const VFIO_PCI: &str = "vfio-pci";
/// The NVIDIA kernel driver.
pub const NVIDIA: &str = "nvidia";

/// Why a GPU could not be moved between drivers.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VfioError {
    /// The IOMMU is off or the device has no group.
    #[error(
        "{bus_id} has no IOMMU group: enable the IOMMU (intel_iommu=on / amd_iommu=on) to pass GPUs through"
    )]
    NoIommuGroup {
        /// The GPU.
        bus_id: String,
    },
    /// The GPU has SR-IOV virtual functions enabled.
    #[error(
        "{bus_id} has {count} SR-IOV virtual functions enabled; disable them before passing the GPU through"
    )]
    SriovEnabled {
        /// The GPU.
        bus_id: String,
        /// `sriov_numvfs`.
        count: u32,
    },
    /// The VFIO module could not be loaded.
    #[error("loading kernel module {module} failed: {reason}")]
    Modprobe {
        /// The module.
        module: String,
        /// What modprobe said.
        reason: String,
    },
    /// Processes still use the GPU.
    #[error(
        "{bus_id} is still in use (processes hold /dev/nvidia{minor}) after {waited:?}; stop them and retry"
    )]
    Busy {
        /// The GPU.
        bus_id: String,
        /// Its minor.
        minor: u32,
        /// How long the driver waited.
        waited: Duration,
    },
    /// The bind did not take.
    #[error("{bus_id} is bound to {found:?} after binding it to {expected}")]
    BindFailed {
        /// The GPU.
        bus_id: String,
        /// The driver asked for.
        expected: String,
        /// The driver found.
        found: Option<String>,
    },
    /// A host read, write or command failed.
    #[error(transparent)]
    Host(#[from] HostError),
}

/// How a GPU was bound before the driver moved it to VFIO: what unprepare restores.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VfioBinding {
    /// The GPU's PCI bus ID.
    pub bus_id: String,
    /// Its IOMMU group.
    pub iommu_group: u32,
    /// The VFIO driver it is bound to now.
    pub vfio_driver: String,
    /// The driver it was bound to before (`nvidia`), `None` when unbound. Equal to
    /// `vfio_driver` when it was already on VFIO: unprepare then leaves it alone.
    pub previous_driver: Option<String>,
}

impl VfioBinding {
    /// Whether prepare changed the binding (and unprepare must restore it).
    pub fn rebound(&self) -> bool {
        self.previous_driver.as_deref() != Some(self.vfio_driver.as_str())
    }
}

/// Moves GPUs to VFIO and back.
#[derive(Clone, Debug)]
pub struct VfioBinder<'a> {
    host: &'a dyn Host,
    poll: Duration,
    timeout: Duration,
}

impl<'a> VfioBinder<'a> {
    /// A binder on `host`, polling for idleness every `poll` up to `timeout`.
    pub fn new(host: &'a dyn Host, poll: Duration, timeout: Duration) -> Self {
        Self {
            host,
            poll,
            timeout,
        }
    }

    /// Binds the GPU at `bus_id` (NVIDIA minor `minor`, when it has one) to its VFIO driver.
    pub fn bind(&self, bus_id: &str, minor: Option<u32>) -> Result<VfioBinding, VfioError> {
        let iommu_group =
            facts::iommu_group(self.host, bus_id)?.ok_or_else(|| VfioError::NoIommuGroup {
                bus_id: bus_id.to_owned(),
            })?;
        let current = facts::pci_driver(self.host, bus_id)?;
        let (module, vfio_driver) = self.best_vfio_driver(bus_id)?;
        if current.as_deref() == Some(vfio_driver.as_str()) {
            tracing::info!(bus_id, driver = %vfio_driver, "GPU already bound to its VFIO driver");
            return Ok(VfioBinding {
                bus_id: bus_id.to_owned(),
                iommu_group,
                vfio_driver,
                previous_driver: current,
            });
        }
        self.check_sriov(bus_id)?;
        self.load_module(&module, &vfio_driver)?;
        if current.as_deref() == Some(NVIDIA)
            && let Some(minor) = minor
        {
            self.wait_idle(bus_id, minor)?;
        }
        let binding = VfioBinding {
            bus_id: bus_id.to_owned(),
            iommu_group,
            vfio_driver: vfio_driver.clone(),
            previous_driver: current.clone(),
        };
        let device = facts::pci_device_dir(bus_id);
        if let Some(current) = &current {
            self.host.write(&device.join("driver_override"), b"\n")?;
            self.host
                .write(&driver_file(current, "unbind"), bus_id.as_bytes())?;
        }
        let result = self.attach(bus_id, &vfio_driver);
        if let Err(error) = result {
            tracing::warn!(bus_id, %error, "binding to VFIO failed; restoring the previous driver");
            if let Err(restore) = self.restore(&binding) {
                tracing::error!(bus_id, error = %restore, "restoring the previous driver failed");
            }
            return Err(error);
        }
        tracing::info!(bus_id, driver = %vfio_driver, previous = ?current, "GPU bound to VFIO");
        Ok(binding)
    }

    fn attach(&self, bus_id: &str, driver: &str) -> Result<(), VfioError> {
        let device = facts::pci_device_dir(bus_id);
        self.host
            .write(&device.join("driver_override"), driver.as_bytes())?;
        self.host
            .write(&driver_file(driver, "bind"), bus_id.as_bytes())?;
        let found = facts::pci_driver(self.host, bus_id)?;
        if found.as_deref() != Some(driver) {
            return Err(VfioError::BindFailed {
                bus_id: bus_id.to_owned(),
                expected: driver.to_owned(),
                found,
            });
        }
        Ok(())
    }

    /// Undoes [`bind`](Self::bind): back to the previous driver, `driver_override` cleared.
    /// Idempotent: a GPU already back on its previous driver is left alone, and a GPU that
    /// was on VFIO before prepare stays there.
    pub fn restore(&self, binding: &VfioBinding) -> Result<(), VfioError> {
        if !binding.rebound() {
            return Ok(());
        }
        let bus_id = binding.bus_id.as_str();
        let device = facts::pci_device_dir(bus_id);
        if !self.host.exists(&device)? {
            tracing::warn!(bus_id, "GPU is gone from sysfs; nothing to restore");
            return Ok(());
        }
        let current = facts::pci_driver(self.host, bus_id)?;
        if current.is_some() && current == binding.previous_driver {
            return Ok(());
        }
        self.host.write(&device.join("driver_override"), b"\n")?;
        if let Some(current) = &current {
            self.host
                .write(&driver_file(current, "unbind"), bus_id.as_bytes())?;
        }
        if let Some(previous) = &binding.previous_driver {
            self.host
                .write(&driver_file(previous, "bind"), bus_id.as_bytes())?;
            let found = facts::pci_driver(self.host, bus_id)?;
            if found.as_deref() != Some(previous.as_str()) {
                return Err(VfioError::BindFailed {
                    bus_id: bus_id.to_owned(),
                    expected: previous.clone(),
                    found,
                });
            }
        }
        tracing::info!(bus_id, driver = ?binding.previous_driver, "GPU returned to its driver");
        Ok(())
    }

    fn check_sriov(&self, bus_id: &str) -> Result<(), VfioError> {
        let path = facts::pci_device_dir(bus_id).join("sriov_numvfs");
        match self.host.read_to_string(&path) {
            Ok(text) => {
                let count = text.trim().parse::<u32>().unwrap_or(0);
                if count > 0 {
                    return Err(VfioError::SriovEnabled {
                        bus_id: bus_id.to_owned(),
                        count,
                    });
                }
                Ok(())
            }
            Err(error) if error.is_not_found() => Ok(()),
            Err(error) => Err(error.into()),
        }
    }

    /// `(module, driver)`: the VFIO variant driver whose `modules.alias` pattern matches the
    /// device's `modalias`, or `vfio_pci` / `vfio-pci`.
    fn best_vfio_driver(&self, bus_id: &str) -> Result<(String, String), VfioError> {
        let fallback = || ("vfio_pci".to_owned(), VFIO_PCI.to_owned());
        let modalias = match self
            .host
            .read_to_string(&facts::pci_device_dir(bus_id).join("modalias"))
        {
            Ok(text) => text.trim().to_owned(),
            Err(error) if error.is_not_found() => return Ok(fallback()),
            Err(error) => return Err(error.into()),
        };
        let Some(device_alias) = modalias.strip_prefix("pci:") else {
            return Ok(fallback());
        };
        let release = match self
            .host
            .read_to_string(Path::new("/proc/sys/kernel/osrelease"))
        {
            Ok(text) => text.trim().to_owned(),
            Err(error) if error.is_not_found() => return Ok(fallback()),
            Err(error) => return Err(error.into()),
        };
        let aliases = match self.host.read_to_string(
            &PathBuf::from("/lib/modules")
                .join(&release)
                .join("modules.alias"),
        ) {
            Ok(text) => text,
            Err(error) if error.is_not_found() => return Ok(fallback()),
            Err(error) => return Err(error.into()),
        };
        let variant = aliases.lines().find_map(|line| {
            let mut words = line.split_whitespace();
            let (Some("alias"), Some(pattern), Some(module)) =
                (words.next(), words.next(), words.next())
            else {
                return None;
            };
            let pattern = pattern.strip_prefix("vfio_pci:")?;
            (module != "vfio_pci" && glob_match(pattern, device_alias)).then(|| module.to_owned())
        });
        Ok(match variant {
            Some(module) => {
                let driver = module.replace('_', "-");
                (module, driver)
            }
            None => fallback(),
        })
    }

    fn load_module(&self, module: &str, driver: &str) -> Result<(), VfioError> {
        if self
            .host
            .exists(&PathBuf::from("/sys/bus/pci/drivers").join(driver))?
        {
            return Ok(());
        }
        let output = self
            .host
            .run(&HostCommand::new("modprobe", [module]).chrooted())?;
        if !output.success() {
            return Err(VfioError::Modprobe {
                module: module.to_owned(),
                reason: output.stderr.trim().to_owned(),
            });
        }
        Ok(())
    }

    /// `fuser` exits 0 when a process uses the file, 1 when none does. Where `fuser` cannot
    /// run (not installed on the host, or a fake host without it), the same question is
    /// answered by reading `/proc/<pid>/fd` through the host.
    fn wait_idle(&self, bus_id: &str, minor: u32) -> Result<(), VfioError> {
        let started = Instant::now();
        let node = format!("/dev/nvidia{minor}");
        let command = HostCommand::new("fuser", [node.clone()]).chrooted();
        let mut use_fuser = true;
        loop {
            let busy = if use_fuser {
                match self.host.run(&command) {
                    Ok(output) => output.success(),
                    Err(HostError::Command { reason, .. }) => {
                        tracing::debug!(%reason, "fuser unavailable; scanning /proc instead");
                        use_fuser = false;
                        self.held_open(&node)?
                    }
                    Err(error) => return Err(error.into()),
                }
            } else {
                self.held_open(&node)?
            };
            if !busy {
                return Ok(());
            }
            let waited = started.elapsed();
            if waited >= self.timeout {
                return Err(VfioError::Busy {
                    bus_id: bus_id.to_owned(),
                    minor,
                    waited,
                });
            }
            tracing::debug!(bus_id, minor, "GPU busy; waiting before rebinding it");
            std::thread::sleep(self.poll.min(self.timeout.saturating_sub(waited)));
        }
    }

    /// Whether any process has `node` open, from the `/proc/<pid>/fd` links.
    fn held_open(&self, node: &str) -> Result<bool, HostError> {
        facts::node_holders(self.host, Path::new(node)).map(|holders| !holders.is_empty())
    }
}

fn driver_file(driver: &str, file: &str) -> PathBuf {
    PathBuf::from("/sys/bus/pci/drivers")
        .join(driver)
        .join(file)
}

/// `modules.alias` patterns: `*` matches any run of characters, everything else literally.
fn glob_match(pattern: &str, text: &str) -> bool {
    let pattern = pattern.as_bytes();
    let text = text.as_bytes();
    let (mut p, mut t) = (0, 0);
    let mut backtrack: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            backtrack = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((star, matched)) = backtrack {
            p = star + 1;
            t = matched + 1;
            backtrack = Some((star, matched + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        let alias = "v000010DEd00002342sv000010DEsd000016EBbc03sc02i00";
        assert!(glob_match("v000010DEd00002342sv*sd*bc*sc*i*", alias));
        assert!(!glob_match("v000010DEd00002343sv*sd*bc*sc*i*", alias));
        assert!(glob_match("*", alias));
        assert!(glob_match("", ""));
        assert!(!glob_match("a", ""));
    }
}
