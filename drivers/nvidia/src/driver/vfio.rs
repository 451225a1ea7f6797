//! Rebinding a GPU between the `nvidia` driver and a VFIO driver through sysfs.
//!
//! Everything goes through a [`Host`] (sysfs writes, `/proc` reads, `modprobe` chrooted into
//! the host root, as upstream does) and, for persistence mode, through the [`GpuBackend`] and
//! `nvidia-persistenced`'s socket ([`super::persistenced`]). The sequence, with the exact
//! writes:
//!
//! 1. the IOMMU must be on (`iommu_group` link), the GPU must have no SR-IOV VFs;
//! 2. the VFIO driver is chosen from `modules.alias` for the device's `modalias`
//!    (`vfio_pci:v000010DEd…` entries, for example `nvgrace_gpu_vfio_pci` on Grace Hopper),
//!    falling back to `vfio-pci`; its module is loaded with `modprobe` when the driver is not
//!    registered in `/sys/bus/pci/drivers`;
//! 3. while bound to `nvidia`, persistence mode goes off: `nvidia-persistenced`, when its
//!    socket is found and it keeps the GPU open, is asked to close it (what `nvidia-smi -pm 0`
//!    does, and what upstream runs); NVML's own persistence mode, when the backend reports it
//!    on, is turned off. What was on is recorded in the binding ([`PriorPersistence`]), so that
//!    unprepare (of this plugin or of a restarted one: the binding is checkpointed) turns it
//!    back on;
//! 4. still on `nvidia`, wait until no process holds `/dev/nvidia<minor>`: the `/proc/<pid>/fd`
//!    links are read through the host every `poll` until `timeout` (upstream: `fuser` every
//!    1 s, up to 60 s). A GPU still held fails with the PID and name of each holder, and gets
//!    its persistence mode back;
//! 5. unbind: `\n` to `/sys/bus/pci/devices/<bdf>/driver_override`, `<bdf>` to
//!    `/sys/bus/pci/drivers/<current>/unbind`;
//! 6. bind: `<vfio driver>` to `driver_override`, `<bdf>` to
//!    `/sys/bus/pci/drivers/<vfio driver>/bind`; then the `driver` link must name it.
//!
//! A failure after step 5 restores the previous binding ([`VfioBinder::restore`]), persistence
//! mode included. A GPU found already bound to a VFIO driver is used as is and left that way at
//! unprepare (upstream rebinds it to `nvidia`, issues #1330 and #1089).
//!
//! Persistence mode comes back through NVML once the GPU is on `nvidia` again, even where the
//! daemon had held it: the daemon does not take back a GPU that was unbound and bound again
//! (upstream issue #1037; upstream re-enables it the same way). A GPU that never left `nvidia`
//! (it was busy) goes back to the daemon.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::persistenced::{Persistenced, SOCKET_PATHS};
use crate::backend::GpuBackend;
use crate::host::facts::NodeHolder;
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
        "{bus_id} is still in use after {waited:?}: /dev/nvidia{minor} is held by {}; stop them and retry{}",
        describe_holders(holders),
        persistenced_hint(bus_id, holders)
    )]
    Busy {
        /// The GPU.
        bus_id: String,
        /// Its minor.
        minor: u32,
        /// How long the driver waited.
        waited: Duration,
        /// The processes holding `/dev/nvidia<minor>` when the wait ended.
        holders: Vec<NodeHolder>,
    },
    /// Persistence mode could not be turned off (nothing was changed).
    #[error("turning persistence mode off for {bus_id} failed: {reason}")]
    Persistence {
        /// The GPU.
        bus_id: String,
        /// What failed.
        reason: String,
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

fn describe_holders(holders: &[NodeHolder]) -> String {
    holders
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// What to do about `nvidia-persistenced` when it is among the holders: `/proc/<pid>/comm`
/// holds the first 15 bytes of its name.
fn persistenced_hint(bus_id: &str, holders: &[NodeHolder]) -> String {
    if holders
        .iter()
        .any(|holder| holder.name.starts_with("nvidia-persist"))
    {
        format!(
            " (nvidia-persistenced keeps the GPUs it manages open: its socket was not found at \
             {} under the host root, or it did not close the GPU; `nvidia-smi -i {bus_id} -pm 0` \
             turns persistence off)",
            SOCKET_PATHS[0]
        )
    } else {
        String::new()
    }
}

/// The GPU behind a VFIO device while it is on `nvidia`: whose node the binder waits for and
/// whose persistence mode it turns off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvidiaGpu {
    /// `GPU-…`, for NVML.
    pub uuid: String,
    /// Its minor (`/dev/nvidia<minor>`).
    pub minor: u32,
}

/// Persistence mode a GPU had before prepare turned it off: what unprepare turns back on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PriorPersistence {
    /// The GPU, for NVML; `None` when only the daemon knew its mode.
    #[serde(rename = "gpuUUID", default, skip_serializing_if = "Option::is_none")]
    pub gpu_uuid: Option<String>,
    /// `nvidia-persistenced` kept it open (and was asked to close it).
    #[serde(default)]
    pub daemon: bool,
    /// NVML reported its persistence mode on (and it was turned off through NVML).
    #[serde(default)]
    pub nvml: bool,
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
    /// Persistence mode prepare turned off, to turn back on once the GPU is on `nvidia`
    /// again; absent when it was off (and in checkpoints of earlier versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistence: Option<PriorPersistence>,
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
    backend: Option<&'a dyn GpuBackend>,
    persistenced_sockets: Vec<PathBuf>,
    poll: Duration,
    timeout: Duration,
}

impl<'a> VfioBinder<'a> {
    /// A binder on `host`, polling for idleness every `poll` up to `timeout`. Without a
    /// backend ([`with_backend`](Self::with_backend)) NVML's persistence mode is left alone;
    /// `nvidia-persistenced` is looked for at [`SOCKET_PATHS`].
    pub fn new(host: &'a dyn Host, poll: Duration, timeout: Duration) -> Self {
        Self {
            host,
            backend: None,
            persistenced_sockets: SOCKET_PATHS.iter().map(PathBuf::from).collect(),
            poll,
            timeout,
        }
    }

    /// Reads and changes persistence mode through `backend`.
    pub fn with_backend(mut self, backend: &'a dyn GpuBackend) -> Self {
        self.backend = Some(backend);
        self
    }

    /// Where `nvidia-persistenced`'s socket may be (host paths, tried in order).
    pub fn persistenced_sockets(mut self, sockets: Vec<PathBuf>) -> Self {
        self.persistenced_sockets = sockets;
        self
    }

    /// Binds the GPU at `bus_id` (the NVIDIA GPU `gpu`, when it has one) to its VFIO driver.
    pub fn bind(&self, bus_id: &str, gpu: Option<&NvidiaGpu>) -> Result<VfioBinding, VfioError> {
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
                persistence: None,
            });
        }
        self.check_sriov(bus_id)?;
        self.load_module(&module, &vfio_driver)?;
        let mut persistence = None;
        if current.as_deref() == Some(NVIDIA)
            && let Some(gpu) = gpu
        {
            persistence = self.persistence_off(bus_id, gpu)?;
            if let Err(error) = self.wait_idle(bus_id, gpu.minor) {
                if let Some(prior) = &persistence {
                    self.persistence_back(bus_id, prior, false);
                }
                return Err(error);
            }
        }
        let binding = VfioBinding {
            bus_id: bus_id.to_owned(),
            iommu_group,
            vfio_driver: vfio_driver.clone(),
            previous_driver: current.clone(),
            persistence,
        };
        let device = facts::pci_device_dir(bus_id);
        if let Some(current) = &current {
            let detached = self
                .host
                .write(&device.join("driver_override"), b"\n")
                .and_then(|()| {
                    self.host
                        .write(&driver_file(current, "unbind"), bus_id.as_bytes())
                });
            if let Err(error) = detached {
                // Still on its driver: only persistence mode to give back.
                if let Some(prior) = &binding.persistence {
                    self.persistence_back(bus_id, prior, false);
                }
                return Err(error.into());
            }
        }
        if let Err(error) = self.attach(bus_id, &vfio_driver) {
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

    /// Undoes [`bind`](Self::bind): back to the previous driver, `driver_override` cleared,
    /// then persistence mode back on when prepare turned it off. Idempotent: a GPU already
    /// back on its previous driver is left alone (persistence mode included), and a GPU that
    /// was on VFIO before prepare stays there. Persistence mode that cannot be turned back on
    /// is logged, not returned: the GPU works without it, and failing would hold up the pod's
    /// end.
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
            if previous == NVIDIA
                && let Some(prior) = &binding.persistence
            {
                self.persistence_back(bus_id, prior, true);
            }
        }
        tracing::info!(bus_id, driver = ?binding.previous_driver, "GPU returned to its driver");
        Ok(())
    }

    /// Turns persistence mode off, `nvidia-persistenced` first (NVML may report the daemon's
    /// hold as persistence mode on); what was on, or `None` when nothing was.
    fn persistence_off(
        &self,
        bus_id: &str,
        gpu: &NvidiaGpu,
    ) -> Result<Option<PriorPersistence>, VfioError> {
        let failed = |reason: String| VfioError::Persistence {
            bus_id: bus_id.to_owned(),
            reason,
        };
        let daemon = match Persistenced::find(self.host, &self.persistenced_sockets)? {
            None => None,
            Some(daemon) => match daemon.mode(bus_id) {
                Ok(Some(true)) => Some(daemon),
                Ok(_) => None,
                Err(error) => {
                    // Not knowing is not a reason to refuse: if the daemon holds the GPU, the
                    // idle wait names it.
                    if error.no_daemon() {
                        tracing::debug!(bus_id, %error, "no nvidia-persistenced behind its socket");
                    } else {
                        tracing::warn!(bus_id, %error, "cannot ask nvidia-persistenced about the GPU");
                    }
                    None
                }
            },
        };
        let nvml = match self.backend {
            Some(backend) => backend
                .persistence_mode(&gpu.uuid)
                .map_err(|error| failed(format!("reading it: {error}")))?
                .unwrap_or(false),
            None => false,
        };
        if daemon.is_none() && !nvml {
            return Ok(None);
        }
        if let Some(daemon) = &daemon {
            daemon
                .set_mode(bus_id, false)
                .map_err(|error| failed(error.to_string()))?;
            tracing::info!(bus_id, socket = %daemon.socket().display(), "nvidia-persistenced closed the GPU");
        }
        if nvml && let Some(backend) = self.backend {
            if let Err(error) = backend.set_persistence_mode(&gpu.uuid, false) {
                // Nothing else changed yet: give the daemon its GPU back.
                if let Some(daemon) = &daemon
                    && let Err(back) = daemon.set_mode(bus_id, true)
                {
                    tracing::warn!(bus_id, error = %back, "nvidia-persistenced did not take the GPU back");
                }
                return Err(failed(error.to_string()));
            }
            tracing::info!(bus_id, gpu = %gpu.uuid, "persistence mode turned off");
        }
        Ok(Some(PriorPersistence {
            gpu_uuid: Some(gpu.uuid.clone()),
            daemon: daemon.is_some(),
            nvml,
        }))
    }

    /// Turns persistence mode back on. `left_nvidia`: the GPU was unbound and bound again, so
    /// the daemon cannot have it back and NVML's own persistence mode stands in for it.
    fn persistence_back(&self, bus_id: &str, prior: &PriorPersistence, left_nvidia: bool) {
        let mut through_nvml = prior.nvml || (prior.daemon && left_nvidia);
        if prior.daemon && !left_nvidia {
            let back = Persistenced::find(self.host, &self.persistenced_sockets)
                .map_err(|error| error.to_string())
                .and_then(|daemon| {
                    daemon
                        .ok_or_else(|| "its socket is gone".to_owned())?
                        .set_mode(bus_id, true)
                        .map_err(|error| error.to_string())
                });
            match back {
                Ok(()) => tracing::info!(bus_id, "nvidia-persistenced keeps the GPU open again"),
                Err(error) => {
                    tracing::warn!(bus_id, %error, "nvidia-persistenced did not take the GPU back; turning NVML's persistence mode on instead");
                    through_nvml = true;
                }
            }
        }
        if !through_nvml {
            return;
        }
        let (Some(backend), Some(uuid)) = (self.backend, prior.gpu_uuid.as_deref()) else {
            tracing::warn!(
                bus_id,
                "persistence mode was on before the GPU went to VFIO and cannot be turned back \
                 on here (no GPU backend); `nvidia-smi -i {bus_id} -pm 1` turns it on"
            );
            return;
        };
        // A GPU back on `nvidia` may be unknown to the NVML session opened before it left: a
        // release makes the call open its own.
        let _fresh = backend.release_devices();
        match backend.set_persistence_mode(uuid, true) {
            Ok(()) => tracing::info!(bus_id, gpu = uuid, "persistence mode turned back on"),
            Err(error) => tracing::error!(
                bus_id,
                gpu = uuid,
                %error,
                "persistence mode could not be turned back on; `nvidia-smi -i {bus_id} -pm 1` \
                 turns it on"
            ),
        }
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

    /// Waits until no process holds `/dev/nvidia<minor>`, from the `/proc/<pid>/fd` links the
    /// host shows (no program needed, where upstream runs `fuser`).
    fn wait_idle(&self, bus_id: &str, minor: u32) -> Result<(), VfioError> {
        let started = Instant::now();
        let node = PathBuf::from(format!("/dev/nvidia{minor}"));
        loop {
            let holders = facts::node_holders(self.host, &node)?;
            if holders.is_empty() {
                return Ok(());
            }
            let waited = started.elapsed();
            if waited >= self.timeout {
                return Err(VfioError::Busy {
                    bus_id: bus_id.to_owned(),
                    minor,
                    waited,
                    holders,
                });
            }
            tracing::debug!(bus_id, minor, holders = %describe_holders(&holders), "GPU busy; waiting before rebinding it");
            std::thread::sleep(self.poll.min(self.timeout.saturating_sub(waited)));
        }
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
