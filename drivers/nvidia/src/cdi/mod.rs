//! Container edits for NVIDIA devices, computed from the current host state at every prepare.
//!
//! Nothing here is cached: upstream caches its CDI specs for minutes and so hands out specs
//! without device nodes when `/dev/nvidia*` appeared after the first prepare (issue #1380) or
//! stale ones after the driver was replaced (#1144). Reading a few `/dev` entries and a driver
//! root listing costs well under a millisecond.
//!
//! # What a container gets
//!
//! | Device | Device edits | Claim-wide edits |
//! |---|---|---|
//! | full GPU | `/dev/nvidia<minor>` | see below |
//! | MIG device | the parent's `/dev/nvidia<minor>`, and `/dev/nvidia-caps/nvidia-cap<gi>` and `nvidia-cap<ci>` for its GPU and compute instance | see below |
//! | VFIO device | `/dev/vfio/<group>` and `/dev/vfio/vfio` (legacy), or `/dev/vfio/devices/vfio<N>` and `/dev/iommu` (IOMMUFD) | `NVIDIA_VISIBLE_DEVICES=void` |
//!
//! Claim-wide edits of a claim with a GPU or MIG device ([`CdiEdits::common`]):
//! `/dev/nvidiactl`, `/dev/nvidia-uvm` and `/dev/nvidia-uvm-tools` when they exist on the
//! host; the driver's libraries (`lib*.so.<driver version>`) and binaries (`nvidia-smi`, the
//! MPS binaries, ...) and the GSP firmware found under the driver root, mounted read-only at
//! their path relative to the driver root; `NVIDIA_VISIBLE_DEVICES=void`, as in upstream's
//! specs, so that a legacy `nvidia-container-runtime` hook does not add every GPU; and, when a
//! hook binary is configured, the `nvidia-cdi-hook` hooks upstream uses (`create-symlinks`,
//! `update-ldcache`, `enable-cuda-compat`, `disable-device-node-modification`).
//!
//! # Device nodes
//!
//! Every device node is written **fully specified**: `type: c`, `major` and `minor`, as read
//! from the host's node (through [`Host::device_node`]) or, when the node does not exist on
//! the host yet, from the major the kernel lists in `/proc/devices` (`nvidia-frontend`,
//! `nvidia-uvm`, `nvidia-caps`, `vfio`). A fully specified node never makes the container
//! runtime look at the host (CDI fills only missing fields from the host node), so the
//! edits are valid on any machine: with the mock backend and a fake host tree whose
//! `/dev/nvidia0` is a stand-in, the container runtime on a test node without GPUs creates
//! the nodes and starts the container. MIG capability nodes are created in the container the
//! same way, as upstream does.
//!
//! # Driver root
//!
//! Upstream's flags name the driver installation twice: `--nvidia-driver-root` is where it is
//! on the node (`/`, or `/run/nvidia/driver` for the driver container) and
//! `--container-driver-root` is where the plugin sees it (`/driver-root`). [`DriverRoot`]
//! holds both: files are looked up through a [`Host`] rooted at the container driver root,
//! and mount sources are written as node paths (the container runtime runs on the node).
//!
//! # Hooks
//!
//! With a hook binary ([`CdiEdits::with_hook`], upstream's `--nvidia-cdi-hook-path`) the
//! edits carry upstream's `createContainer` hooks. When the configured binary does not exist
//! on the host, prepare fails with [`CdiError::HookMissing`] rather than handing out a spec
//! whose every container would fail to start. Without a hook binary, no hooks are written
//! and each library is mounted a second time at its soname (`libcuda.so.1`), which is what
//! `update-ldcache` would have linked: programs that `dlopen` the soname work either way.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dra_sdk::cdi::{ContainerEdits, DeviceNode, DeviceNodeType, Hook, HookName, Mount};

use crate::config::IommuBackendPolicy;
use crate::host::{self, DeviceNodeKind, Host, HostError};

/// Options of every driver mount, as NVIDIA's generated specs use them.
pub const MOUNT_OPTIONS: [&str; 5] = ["ro", "nosuid", "nodev", "rbind", "rprivate"];

/// The driver libraries mounted into containers, with the soname a program loads them by
/// (`None`: the soname is the full versioned name).
pub const DRIVER_LIBRARIES: [(&str, Option<&str>); 11] = [
    ("libcuda.so", Some("libcuda.so.1")),
    ("libcudadebugger.so", Some("libcudadebugger.so.1")),
    ("libnvidia-ml.so", Some("libnvidia-ml.so.1")),
    (
        "libnvidia-ptxjitcompiler.so",
        Some("libnvidia-ptxjitcompiler.so.1"),
    ),
    ("libnvidia-nvvm.so", Some("libnvidia-nvvm.so.4")),
    ("libnvidia-opencl.so", Some("libnvidia-opencl.so.1")),
    ("libnvidia-cfg.so", Some("libnvidia-cfg.so.1")),
    ("libnvidia-allocator.so", Some("libnvidia-allocator.so.1")),
    ("libnvidia-pkcs11.so", None),
    ("libnvidia-gpucomp.so", None),
    ("libnvidia-nscq.so", Some("libnvidia-nscq.so.2")),
];

/// Directories searched for libraries, relative to the driver root, in order.
pub const LIBRARY_DIRS: [&str; 7] = [
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib64",
    "/usr/lib",
];

/// The driver binaries mounted into containers.
pub const DRIVER_BINARIES: [&str; 5] = [
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];

/// Directories searched for binaries, relative to the driver root, in order.
pub const BINARY_DIRS: [&str; 4] = ["/usr/bin", "/usr/sbin", "/bin", "/sbin"];

/// Minor of `/dev/nvidiactl` under the GPU major.
pub const NVIDIACTL_MINOR: u32 = 255;

/// Why container edits could not be computed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CdiError {
    /// A device node the device cannot work without is missing, and its major is not in
    /// `/proc/devices` either (the kernel module is not loaded).
    #[error(
        "{path} does not exist on the host and /proc/devices lists no {module:?} major; {hint}"
    )]
    DeviceNodeMissing {
        /// The node.
        path: String,
        /// The `/proc/devices` name looked for.
        module: &'static str,
        /// What to check.
        hint: &'static str,
    },
    /// The configured `nvidia-cdi-hook` binary does not exist on the host.
    #[error("the CDI hook {path} does not exist on the host (check --nvidia-cdi-hook-path)")]
    HookMissing {
        /// The configured path.
        path: PathBuf,
    },
    /// Reading host state failed.
    #[error(transparent)]
    Host(#[from] HostError),
}

/// The NVIDIA driver installation: where the plugin reads it and where it is on the node.
#[derive(Clone, Debug)]
pub struct DriverRoot {
    files: Arc<dyn Host>,
    node_path: PathBuf,
}

impl DriverRoot {
    /// `files` is rooted at the container driver root (`--container-driver-root`, a
    /// [`SystemHost`](crate::host::SystemHost) at `/driver-root`); `node_path` is the same
    /// directory on the node (`--nvidia-driver-root`, `/` by default).
    pub fn new(files: Arc<dyn Host>, node_path: impl Into<PathBuf>) -> Self {
        Self {
            files,
            node_path: node_path.into(),
        }
    }

    /// The driver root on the node.
    pub fn node_path(&self) -> &Path {
        &self.node_path
    }

    /// The node path of a file given relative to the driver root (`/usr/bin/nvidia-smi`).
    pub fn node_path_of(&self, relative: &str) -> PathBuf {
        self.node_path.join(relative.trim_start_matches('/'))
    }

    fn exists(&self, relative: &str) -> Result<bool, HostError> {
        self.files.exists(Path::new(relative))
    }

    /// Where the plugin finds the first of `names` that exists in one of `dirs` (paths
    /// relative to the driver root): the path in the plugin's filesystem, to run or load it
    /// from there (`/driver-root/usr/bin/nvidia-smi`). `None` when none exists.
    pub fn find(&self, dirs: &[&str], names: &[&str]) -> Result<Option<PathBuf>, HostError> {
        Ok(self
            .find_relative(dirs, names)?
            .map(|relative| self.files.resolve(Path::new(&relative))))
    }

    /// Like [`find`](Self::find), but the path relative to the driver root
    /// (`/usr/bin/nvidia-cuda-mps-control`): where another container that mounts the driver
    /// root finds the file.
    pub fn find_relative(
        &self,
        dirs: &[&str],
        names: &[&str],
    ) -> Result<Option<String>, HostError> {
        for dir in dirs {
            for name in names {
                let relative = format!("{dir}/{name}");
                if self.exists(&relative)? {
                    return Ok(Some(relative));
                }
            }
        }
        Ok(None)
    }

    /// A bind mount of a file relative to the driver root, at the same path in the container.
    fn mount(&self, relative: &str) -> Mount {
        self.mount_at(relative, relative)
    }

    fn mount_at(&self, relative: &str, container_path: &str) -> Mount {
        Mount::new(
            self.node_path_of(relative).to_string_lossy(),
            container_path,
        )
        .options(MOUNT_OPTIONS)
    }
}

/// Computes container edits from the host state; see the [module documentation](self).
#[derive(Clone, Debug)]
pub struct CdiEdits {
    host: Arc<dyn Host>,
    driver_root: DriverRoot,
    hook: Option<PathBuf>,
}

impl CdiEdits {
    /// Edits for devices of `host`, with the driver installation at `driver_root`.
    pub fn new(host: Arc<dyn Host>, driver_root: DriverRoot) -> Self {
        Self {
            host,
            driver_root,
            hook: None,
        }
    }

    /// Adds upstream's `nvidia-cdi-hook` hooks, run from `path` on the host.
    pub fn with_hook(mut self, path: impl Into<PathBuf>) -> Self {
        self.hook = Some(path.into());
        self
    }

    /// The host the edits are computed from.
    pub fn host(&self) -> &Arc<dyn Host> {
        &self.host
    }

    /// The driver installation.
    pub fn driver_root(&self) -> &DriverRoot {
        &self.driver_root
    }

    /// The edits shared by the GPU and MIG devices of a claim: control and UVM nodes, driver
    /// files and hooks. `driver_version` is the kernel driver's (`580.126.20`), which is the
    /// suffix of the driver's libraries.
    pub fn common(&self, driver_version: &str) -> Result<ContainerEdits, CdiError> {
        let mut edits = ContainerEdits::new().env("NVIDIA_VISIBLE_DEVICES", "void");
        let devices = ProcDevices::read(self.host.as_ref())?;
        if let Some(node) =
            self.optional_node("/dev/nvidiactl", devices.gpu_major(), NVIDIACTL_MINOR)?
        {
            edits = edits.device_node(node);
        }
        for (path, minor) in [("/dev/nvidia-uvm", 0), ("/dev/nvidia-uvm-tools", 1)] {
            if let Some(node) = self.optional_node(path, devices.major("nvidia-uvm"), minor)? {
                edits = edits.device_node(node);
            }
        }

        let libraries = self.libraries(driver_version)?;
        if libraries.is_empty() {
            tracing::warn!(
                driver_root = %self.driver_root.node_path.display(),
                driver_version,
                "no NVIDIA driver libraries found under the driver root; containers get device nodes only"
            );
        }
        let mut library_dirs: Vec<&str> = Vec::new();
        for library in &libraries {
            edits = edits.mount(self.driver_root.mount(&library.path));
            if !library_dirs.contains(&library.dir) {
                library_dirs.push(library.dir);
            }
        }
        for binary in self.binaries()? {
            edits = edits.mount(self.driver_root.mount(&binary));
        }
        let firmware = format!("/lib/firmware/nvidia/{driver_version}");
        if self.driver_root.exists(&firmware)? {
            edits = edits.mount(self.driver_root.mount(&firmware));
        }

        match &self.hook {
            Some(hook) => {
                if !self.host.exists(hook)? {
                    return Err(CdiError::HookMissing { path: hook.clone() });
                }
                edits = self.hooks(edits, hook, driver_version, &libraries, &library_dirs);
            }
            None => {
                for library in &libraries {
                    if let Some(soname) = library.soname {
                        let container_path = format!("{}/{soname}", library.dir);
                        edits =
                            edits.mount(self.driver_root.mount_at(&library.path, &container_path));
                    }
                }
            }
        }
        Ok(edits)
    }

    fn hooks(
        &self,
        mut edits: ContainerEdits,
        hook: &Path,
        driver_version: &str,
        libraries: &[Library],
        library_dirs: &[&str],
    ) -> ContainerEdits {
        let path = hook.to_string_lossy().into_owned();
        let argv0 = hook
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_else(|| "nvidia-cdi-hook".to_owned());
        let new_hook = |subcommand: &str| {
            Hook::new(HookName::CreateContainer, &path)
                .arg(&argv0)
                .arg(subcommand)
                .env("NVIDIA_CTK_DEBUG", "false")
        };
        if let Some(cuda) = libraries.iter().find(|l| l.name == "libcuda.so") {
            edits = edits.hook(
                new_hook("create-symlinks")
                    .arg("--link")
                    .arg(format!("libcuda.so.1::{}/libcuda.so", cuda.dir)),
            );
        }
        edits = edits.hook(
            new_hook("enable-cuda-compat").arg(format!("--host-driver-version={driver_version}")),
        );
        if !library_dirs.is_empty() {
            let mut update = new_hook("update-ldcache");
            for dir in library_dirs {
                update = update.arg("--folder").arg(*dir);
            }
            edits = edits.hook(update);
        }
        edits.hook(new_hook("disable-device-node-modification"))
    }

    /// The edits of a full GPU: its `/dev/nvidia<minor>`.
    pub fn gpu(&self, minor: u32) -> Result<ContainerEdits, CdiError> {
        let devices = ProcDevices::read(self.host.as_ref())?;
        let node = self.required_node(
            &format!("/dev/nvidia{minor}"),
            devices.gpu_major(),
            minor,
            "nvidia-frontend",
            "is the NVIDIA kernel module loaded (nvidia-smi, nvidia-modprobe)?",
        )?;
        Ok(ContainerEdits::new().device_node(node))
    }

    /// The edits of a MIG device: the parent GPU's node and the capability nodes of its GPU
    /// instance and compute instance, whose minors the driver publishes in
    /// `/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<gi>[/ci<ci>]/access`.
    pub fn mig(
        &self,
        parent_minor: u32,
        gpu_instance: u32,
        compute_instance: u32,
    ) -> Result<ContainerEdits, CdiError> {
        let mut edits = self.gpu(parent_minor)?;
        let devices = ProcDevices::read(self.host.as_ref())?;
        for ci in [None, Some(compute_instance)] {
            let minor = host::facts::mig_capability_minor(
                self.host.as_ref(),
                parent_minor,
                gpu_instance,
                ci,
            )?;
            edits = edits.device_node(self.required_node(
                &format!("/dev/nvidia-caps/nvidia-cap{minor}"),
                devices.major("nvidia-caps"),
                minor,
                "nvidia-caps",
                "is the NVIDIA kernel module loaded with MIG support?",
            )?);
        }
        Ok(edits)
    }

    /// The edits of a GPU bound to a VFIO driver, in IOMMU group `group`.
    ///
    /// Legacy VFIO (the default policy, and the fallback when the host has no IOMMUFD):
    /// `/dev/vfio/<group>` and `/dev/vfio/vfio`, without which a group is unusable (upstream
    /// omits the latter unless asked, issue #1089); `/dev/iommu` as well when
    /// `enable_api_device` is set and the host has it. `PreferIommuFD` on a host with
    /// `/dev/iommu` and the device's `vfio-dev/vfio<N>` cdev: `/dev/vfio/devices/vfio<N>` and
    /// `/dev/iommu`.
    pub fn vfio(
        &self,
        bus_id: &str,
        group: u32,
        policy: IommuBackendPolicy,
        enable_api_device: bool,
    ) -> Result<ContainerEdits, CdiError> {
        let devices = ProcDevices::read(self.host.as_ref())?;
        let iommu = self.optional_node("/dev/iommu", None, 0)?;
        let mut edits = ContainerEdits::new().env("NVIDIA_VISIBLE_DEVICES", "void");
        if policy == IommuBackendPolicy::PreferIommuFd
            && let Some(iommu) = &iommu
            && let Some(cdev) = self.vfio_cdev(bus_id)?
        {
            let path = format!("/dev/vfio/devices/{cdev}");
            let node = self.required_node(&path, None, 0, "vfio", "is the vfio module loaded?")?;
            return Ok(edits.device_node(node).device_node(iommu.clone()));
        }
        let group_node = self.required_node(
            &format!("/dev/vfio/{group}"),
            devices.major("vfio"),
            group,
            "vfio",
            "is the GPU bound to a VFIO driver?",
        )?;
        let api = self.required_node(
            "/dev/vfio/vfio",
            devices.misc_major(),
            VFIO_MISC_MINOR,
            "misc",
            "is the vfio module loaded?",
        )?;
        edits = edits.device_node(group_node).device_node(api);
        if enable_api_device && let Some(iommu) = iommu {
            edits = edits.device_node(iommu);
        }
        Ok(edits)
    }

    /// `vfio<N>` from `/sys/bus/pci/devices/<bdf>/vfio-dev/`, when the kernel has VFIO cdevs.
    fn vfio_cdev(&self, bus_id: &str) -> Result<Option<String>, HostError> {
        let dir = host::facts::pci_device_dir(bus_id).join("vfio-dev");
        match self.host.read_dir(&dir) {
            Ok(names) => Ok(names.into_iter().find(|name| name.starts_with("vfio"))),
            Err(error) if error.is_not_found() => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// The node at `path` if it exists on the host, or one built from `major` (from
    /// `/proc/devices`) and `minor`; `None` when neither is known.
    fn optional_node(
        &self,
        path: &str,
        major: Option<u32>,
        minor: u32,
    ) -> Result<Option<DeviceNode>, HostError> {
        let found = self.host.device_node(Path::new(path))?;
        let numbers = match found {
            Some(node) if node.kind == DeviceNodeKind::Char => Some((node.major, node.minor)),
            Some(_) => None,
            None => major.map(|major| (major, minor)),
        };
        Ok(numbers.map(|(major, minor)| {
            DeviceNode::new(path)
                .device_type(DeviceNodeType::Char)
                .major(i64::from(major))
                .minor(i64::from(minor))
        }))
    }

    fn required_node(
        &self,
        path: &str,
        major: Option<u32>,
        minor: u32,
        module: &'static str,
        hint: &'static str,
    ) -> Result<DeviceNode, CdiError> {
        self.optional_node(path, major, minor)?
            .ok_or_else(|| CdiError::DeviceNodeMissing {
                path: path.to_owned(),
                module,
                hint,
            })
    }

    fn libraries(&self, driver_version: &str) -> Result<Vec<Library>, HostError> {
        let mut found = Vec::new();
        for (name, soname) in DRIVER_LIBRARIES {
            for dir in LIBRARY_DIRS {
                let path = format!("{dir}/{name}.{driver_version}");
                if self.driver_root.exists(&path)? {
                    found.push(Library {
                        name,
                        soname,
                        dir,
                        path,
                    });
                    break;
                }
            }
        }
        Ok(found)
    }

    fn binaries(&self) -> Result<Vec<String>, HostError> {
        let mut found = Vec::new();
        for name in DRIVER_BINARIES {
            for dir in BINARY_DIRS {
                let path = format!("{dir}/{name}");
                if self.driver_root.exists(&path)? {
                    found.push(path);
                    break;
                }
            }
        }
        Ok(found)
    }
}

/// Minor of `/dev/vfio/vfio` under the misc major (10), fixed by the kernel.
pub const VFIO_MISC_MINOR: u32 = 196;

struct Library {
    name: &'static str,
    soname: Option<&'static str>,
    dir: &'static str,
    /// Relative to the driver root.
    path: String,
}

/// The character device majors of `/proc/devices`.
#[derive(Debug, Default)]
struct ProcDevices {
    majors: Vec<(u32, String)>,
}

impl ProcDevices {
    /// A missing `/proc/devices` (a bare fake host tree) reads as no majors.
    fn read(host: &dyn Host) -> Result<Self, HostError> {
        let text = match host.read_to_string(Path::new("/proc/devices")) {
            Ok(text) => text,
            Err(error) if error.is_not_found() => return Ok(Self::default()),
            Err(error) => return Err(error),
        };
        Ok(Self::parse(&text))
    }

    fn parse(text: &str) -> Self {
        let majors = text
            .lines()
            .skip_while(|line| !line.starts_with("Character devices"))
            .skip(1)
            .take_while(|line| !line.starts_with("Block devices"))
            .filter_map(|line| {
                let (major, name) = line.trim().split_once(char::is_whitespace)?;
                Some((major.parse().ok()?, name.trim().to_owned()))
            })
            .collect();
        Self { majors }
    }

    fn major(&self, name: &str) -> Option<u32> {
        self.majors
            .iter()
            .find(|(_, n)| n == name)
            .map(|(major, _)| *major)
    }

    /// The GPU and control nodes' major: `nvidia-frontend` (or `nvidia` on some drivers).
    fn gpu_major(&self) -> Option<u32> {
        self.major("nvidia-frontend")
            .or_else(|| self.major("nvidia"))
    }

    fn misc_major(&self) -> Option<u32> {
        self.major("misc")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_devices_lists_character_majors_only() {
        let devices = ProcDevices::parse(
            "Character devices:\n  1 mem\n 10 misc\n195 nvidia-frontend\n234 nvidia-caps\n\
             507 nvidia-uvm\n\nBlock devices:\n  8 sd\n 43 nvidia\n",
        );
        assert_eq!(devices.gpu_major(), Some(195));
        assert_eq!(devices.major("nvidia-caps"), Some(234));
        assert_eq!(devices.major("nvidia-uvm"), Some(507));
        assert_eq!(devices.misc_major(), Some(10));
        assert_eq!(devices.major("sd"), None);
    }
}
