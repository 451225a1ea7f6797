//! Container edits for NVIDIA devices, computed from the current host state at every prepare,
//! with the files `nvidia-ctk cdi generate` would give a container.
//!
//! Nothing here is cached: upstream caches its CDI specs for minutes and so hands out specs
//! without device nodes when `/dev/nvidia*` appeared after the first prepare (issue #1380) or
//! stale ones after the driver was replaced (#1144). Reading a few `/dev` entries and the
//! driver root's folders took about 2 ms for a full 550 install in one timed run (release
//! build, a busy 2-core machine, the fake driver root of `tests/cdi.rs`); no benchmark covers
//! it yet, and a real disk's first read may be slower.
//!
//! # What a container gets
//!
//! | Device | Device edits | Claim-wide edits |
//! |---|---|---|
//! | full GPU | `/dev/nvidia<minor>`; its `/dev/dri/card<N>` and `renderD<N>` (from `/sys/bus/pci/devices/<bdf>/drm/`); with a hook, `create-symlinks` of its `/dev/dri/by-path/pci-<bdf>-{card,render}` links | see below |
//! | MIG device | the parent's `/dev/nvidia<minor>`, and `/dev/nvidia-caps/nvidia-cap<gi>` and `nvidia-cap<ci>` for its GPU and compute instance (no DRM nodes: MIG has no graphics) | see below |
//! | VFIO device | `/dev/vfio/<group>` and `/dev/vfio/vfio` (legacy), or `/dev/vfio/devices/vfio<N>` and `/dev/iommu` (IOMMUFD) | `NVIDIA_VISIBLE_DEVICES=void` |
//!
//! Claim-wide edits of a claim with a GPU or MIG device ([`CdiEdits::common`]):
//!
//! | What | Found by ([`discover`]) | Mounted at |
//! |---|---|---|
//! | `/dev/nvidiactl`, `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools` | the host's node, else `/proc/devices` | — |
//! | `/dev/nvidia-modeset` | the host's node, when the `nvidia-modeset` module made it | — |
//! | driver libraries: every `*.so.<version>` (compute, NVDEC `libnvcuvid`, NVENC `libnvidia-encode`, OFA `libnvidia-opticalflow`, VDPAU, OpenGL/EGL/Vulkan, ...) and `libnvidia-nvvm70.so.*` | the folder of `libcuda.so.<version>`, from the usual library folders or the root's `/etc/ld.so.cache` | their path in the driver root, links resolved |
//! | `libnvidia-egl-gbm.so.*.*`, `libnvidia-egl-wayland.so.*.*`, `nvidia_drv.so`, `libglxserver_nvidia.so.<version>` | library folders, X module folders | their path |
//! | EGL vendor and platform files, `nvoptix.bin`, X configuration | `/etc`, `/usr/local/share`, `/usr/share` | their path |
//! | Vulkan ICD and layer files (`nvidia_icd.json`, `nvidia_layers.json`) | the same, then the root itself | under `/etc/vulkan/` |
//! | `nvidia-smi`, `nvidia-debugdump`, `nvidia-persistenced`, the MPS and IMEX binaries | the usual `PATH` folders | their path |
//! | GSP firmware `nvidia/<version>/gsp*.bin` | the kernel's firmware folders | their path |
//! | `nvidia-persistenced` and `nvidia-fabricmanager` sockets | `/run`, `/var/run` | their path, writable |
//! | `NVIDIA_VISIBLE_DEVICES=void` | — | so that a legacy `nvidia-container-runtime` hook does not add every GPU, as in upstream's specs |
//!
//! Mounts are read-only (`ro,nosuid,nodev,rbind,rprivate`, as `nvidia-ctk`'s), except the
//! sockets (`nosuid,nodev,rbind,rprivate,noexec`) and the Vulkan files (`ro,nosuid,nodev,bind`).
//! With a hook ([`CdiEdits::with_hook`]) the edits carry `nvidia-ctk`'s `createContainer`
//! hooks: `create-symlinks` (`libcuda.so`, `libGLX_indirect.so.0`,
//! `libnvidia-opticalflow.so`, the sonames and `.so` links the host has,
//! `gbm/nvidia-drm_gbm.so`, ...), `enable-cuda-compat --host-driver-version=<version>`,
//! `update-ldcache` with the library folders, `disable-device-node-modification`, and the
//! environment variable `NVIDIA_CTK_LIBCUDA_DIR`.
//!
//! **Verified on a fake driver root only**: the rules are `nvidia-ctk`'s as read from its
//! source, and `tests/cdi.rs` checks them on a driver root laid out from the file list of a
//! real 550 driver install (`tests/fixture/driver-550.txt`); no spec of this module has been
//! compared with `nvidia-ctk cdi generate` on a GPU node yet.
//!
//! # Device nodes
//!
//! Every device node is written **fully specified**: `type: c`, `major` and `minor`, as read
//! from the host's node (through [`Host::device_node`]) or, when the node does not exist on
//! the host yet, from the major the kernel lists in `/proc/devices` (`nvidia-frontend`,
//! `nvidia-uvm`, `nvidia-caps`, `vfio`) or, for DRM nodes, from sysfs
//! (`/sys/bus/pci/devices/<bdf>/drm/card<N>/dev`). A fully specified node never makes the
//! container runtime look at the host (CDI fills only missing fields from the host node), so
//! the edits are valid on any machine: with the mock backend and a fake host tree whose
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
//! every symbolic link resolved inside that root (an absolute link of a driver container's
//! tree never leads to the node's own `/usr`), and mount sources are written as node paths
//! (the container runtime runs on the node).
//!
//! # Hooks
//!
//! With a hook binary ([`CdiEdits::with_hook`], upstream's `--nvidia-cdi-hook-path`, by
//! default the plugin's own copy installed at start, see [`hook`]) the edits carry the hooks
//! above. When the configured binary does not exist on the node (as the plugin sees the node,
//! [`CdiHook`]), prepare fails with [`CdiError::HookMissing`] rather than handing out a spec
//! whose every container would fail to start. Without a hook binary, no hooks are written and
//! each link the hook would have made is a mount of the library instead, and each library is
//! mounted a second time at its soname (`libcuda.so.1`), which is what `update-ldcache` would
//! have linked: programs that `dlopen` the soname work either way, but an image whose loader
//! does not search the host's library folder (a UBI image on an Ubuntu node) finds nothing
//! without `update-ldcache`, and the `/dev/dri/by-path` links are missing.

pub mod discover;
pub mod hook;
pub mod ldcache;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dra_sdk::cdi::{ContainerEdits, DeviceNode, DeviceNodeType, Hook, HookName, Mount};

use self::discover::{DriverFiles, FileMount, MountKind};
pub use self::hook::CdiHook;
use crate::config::IommuBackendPolicy;
use crate::host::{self, DeviceNodeKind, Host, HostError};

/// Options of every read-only driver mount, as NVIDIA's generated specs use them.
pub const MOUNT_OPTIONS: [&str; 5] = ["ro", "nosuid", "nodev", "rbind", "rprivate"];

/// Options of the Vulkan files mounted under `/etc`, as `nvidia-ctk` writes them.
pub const VULKAN_MOUNT_OPTIONS: [&str; 4] = ["ro", "nosuid", "nodev", "bind"];

/// Options of the IPC socket mounts, as `nvidia-ctk` writes them: writable (connecting to a
/// socket writes to it), not executable.
pub const SOCKET_MOUNT_OPTIONS: [&str; 5] = ["nosuid", "nodev", "rbind", "rprivate", "noexec"];

/// Directories searched for `libnvidia-ml.so.1` and `libcuda.so.1` by the sharing code (MPS
/// daemons), relative to the driver root, in order. Container edits use
/// [`discover::LIBRARY_SEARCH_DIRS`] and the loader cache.
pub const LIBRARY_DIRS: [&str; 7] = [
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib64",
    "/usr/lib",
];

/// Directories searched for the MPS binaries by the sharing code, relative to the driver
/// root, in order. Container edits use [`discover::BINARY_SEARCH_DIRS`].
pub const BINARY_DIRS: [&str; 4] = ["/usr/bin", "/usr/sbin", "/bin", "/sbin"];

/// Minor of `/dev/nvidiactl` under the GPU major.
pub const NVIDIACTL_MINOR: u32 = 255;

/// Where the `nvidia-modeset` module's node is.
pub const NVIDIA_MODESET: &str = "/dev/nvidia-modeset";

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

    /// The driver root's files as the plugin reads them.
    pub fn files(&self) -> &dyn Host {
        self.files.as_ref()
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

    /// A bind mount of `source` (relative to the driver root) at `container_path`.
    fn mount_at(&self, source: &str, container_path: &str, options: &[&str]) -> Mount {
        Mount::new(self.node_path_of(source).to_string_lossy(), container_path)
            .options(options.iter().copied())
    }

    fn file_mount(&self, file: &FileMount) -> Mount {
        let options: &[&str] = match file.kind {
            MountKind::File => &MOUNT_OPTIONS,
            MountKind::Vulkan => &VULKAN_MOUNT_OPTIONS,
            MountKind::Socket => &SOCKET_MOUNT_OPTIONS,
        };
        self.mount_at(&file.source, &file.container, options)
    }
}

/// Computes container edits from the host state; see the [module documentation](self).
#[derive(Clone, Debug)]
pub struct CdiEdits {
    host: Arc<dyn Host>,
    driver_root: DriverRoot,
    hook: Option<CdiHook>,
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

    /// Adds upstream's `nvidia-cdi-hook` hooks, run from `hook` on the node (a path, checked
    /// through [`Self::host`], or a [`CdiHook`] that says where to check it).
    pub fn with_hook(mut self, hook: impl Into<CdiHook>) -> Self {
        self.hook = Some(hook.into());
        self
    }

    /// The hook, when the edits carry hooks.
    pub fn hook(&self) -> Option<&CdiHook> {
        self.hook.as_ref()
    }

    /// The host the edits are computed from.
    pub fn host(&self) -> &Arc<dyn Host> {
        &self.host
    }

    /// The driver installation.
    pub fn driver_root(&self) -> &DriverRoot {
        &self.driver_root
    }

    /// The edits shared by the GPU and MIG devices of a claim: control, UVM and modeset
    /// nodes, driver files and hooks. `driver_version` is the kernel driver's
    /// (`580.126.20`), which is the suffix of the driver's libraries.
    pub fn common(&self, driver_version: &str) -> Result<ContainerEdits, CdiError> {
        let hook = self.checked_hook()?;
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
        // Only when the module made it: a compute node without nvidia-modeset has none.
        if let Some(node) = self.optional_node(NVIDIA_MODESET, None, 0)? {
            edits = edits.device_node(node);
        }

        let files = discover::discover(&self.driver_root, self.host.as_ref(), driver_version)?;
        if files.library_dir.is_none() {
            match &files.other_version {
                Some(other) => tracing::warn!(
                    driver_root = %self.driver_root.node_path.display(),
                    driver_version,
                    libraries_version = %other,
                    "the driver root's libraries are of another version than the kernel \
                     driver (upgraded without a reboot?); containers get no driver libraries"
                ),
                None => tracing::warn!(
                    driver_root = %self.driver_root.node_path.display(),
                    driver_version,
                    "no libcuda.so or libnvidia-ml.so of the driver's version under the driver \
                     root; containers get no driver libraries"
                ),
            }
        }
        let mut container_paths: Vec<&str> = Vec::new();
        for file in files.mounts() {
            edits = edits.mount(self.driver_root.file_mount(file));
            container_paths.push(&file.container);
        }
        match hook {
            Some(hook) => {
                if let Some(dir) = &files.library_dir {
                    edits = edits.env("NVIDIA_CTK_LIBCUDA_DIR", dir);
                }
                edits = self.hooks(edits, hook, driver_version, &files);
            }
            None => {
                // What the hooks would have linked, as mounts of the files the links lead to.
                for link in &files.links {
                    if container_paths.contains(&link.path.as_str()) {
                        continue;
                    }
                    container_paths.push(&link.path);
                    edits = edits.mount(self.driver_root.mount_at(
                        &link.source,
                        &link.path,
                        &MOUNT_OPTIONS,
                    ));
                }
            }
        }
        Ok(edits)
    }

    /// The hook, after checking that it exists where the plugin can tell.
    fn checked_hook(&self) -> Result<Option<&CdiHook>, CdiError> {
        let Some(hook) = &self.hook else {
            return Ok(None);
        };
        if hook.exists(self.host.as_ref())? == Some(false) {
            return Err(CdiError::HookMissing {
                path: hook.path().to_owned(),
            });
        }
        Ok(Some(hook))
    }

    fn hooks(
        &self,
        mut edits: ContainerEdits,
        hook: &CdiHook,
        driver_version: &str,
        files: &DriverFiles,
    ) -> ContainerEdits {
        let links: Vec<String> = files
            .links
            .iter()
            .filter(|link| link.by_hook)
            .map(discover::Link::argument)
            .collect();
        if !links.is_empty() {
            edits = edits.hook(create_symlinks(hook, &links));
        }
        edits = edits.hook(
            hook_command(hook, "enable-cuda-compat")
                .arg(format!("--host-driver-version={driver_version}")),
        );
        let folders = files.library_folders();
        if !folders.is_empty() {
            let mut update = hook_command(hook, "update-ldcache");
            for folder in folders {
                update = update.arg("--folder").arg(folder);
            }
            edits = edits.hook(update);
        }
        edits.hook(hook_command(hook, "disable-device-node-modification"))
    }

    /// The edits of a full GPU: its `/dev/nvidia<minor>`, the DRM nodes sysfs lists for
    /// its PCI function `bus_id`, and with a hook the `/dev/dri/by-path` links to them.
    pub fn gpu(&self, minor: u32, bus_id: &str) -> Result<ContainerEdits, CdiError> {
        let mut edits = ContainerEdits::new().device_node(self.gpu_node(minor)?);
        let drm = self.drm_nodes(bus_id)?;
        for (_, node) in &drm {
            edits = edits.device_node(node.clone());
        }
        if let Some(hook) = &self.hook {
            let links = self.drm_links(bus_id, &drm)?;
            if !links.is_empty() {
                edits = edits.hook(create_symlinks(hook, &links));
            }
        }
        Ok(edits)
    }

    fn gpu_node(&self, minor: u32) -> Result<DeviceNode, CdiError> {
        let devices = ProcDevices::read(self.host.as_ref())?;
        self.required_node(
            &format!("/dev/nvidia{minor}"),
            devices.gpu_major(),
            minor,
            "nvidia-frontend",
            "is the NVIDIA kernel module loaded (nvidia-smi, nvidia-modprobe)?",
        )
    }

    /// `/dev/dri/card*` then `/dev/dri/renderD*` of the PCI function, as
    /// `/sys/bus/pci/devices/<bdf>/drm/` names them: numbers from the host's node, else from
    /// sysfs's `dev` file; a name with neither is left out.
    fn drm_nodes(&self, bus_id: &str) -> Result<Vec<(String, DeviceNode)>, HostError> {
        let drm = host::facts::pci_device_dir(bus_id).join("drm");
        let names = match self.host.read_dir(&drm) {
            Ok(names) => names,
            Err(error) if error.is_not_found() => return Ok(Vec::new()),
            Err(error) => return Err(error),
        };
        let mut nodes = Vec::new();
        for prefix in ["card", "renderD"] {
            for name in names.iter().filter(|name| {
                name.strip_prefix(prefix)
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            }) {
                let path = format!("/dev/dri/{name}");
                let numbers = match self.host.device_node(Path::new(&path))? {
                    Some(node) if node.kind == DeviceNodeKind::Char => {
                        Some((node.major, node.minor))
                    }
                    _ => self.sysfs_dev(&drm.join(name).join("dev"))?,
                };
                let Some((major, minor)) = numbers else {
                    tracing::debug!(node = %path, "DRM node without numbers; left out");
                    continue;
                };
                nodes.push((
                    path.clone(),
                    DeviceNode::new(path)
                        .device_type(DeviceNodeType::Char)
                        .major(i64::from(major))
                        .minor(i64::from(minor)),
                ));
            }
        }
        Ok(nodes)
    }

    /// `major:minor` from a sysfs `dev` file; `None` when absent or malformed.
    fn sysfs_dev(&self, path: &Path) -> Result<Option<(u32, u32)>, HostError> {
        let text = match self.host.read_to_string(path) {
            Ok(text) => text,
            Err(error) if error.is_not_found() => return Ok(None),
            Err(error) => return Err(error),
        };
        Ok(text
            .trim()
            .split_once(':')
            .and_then(|(major, minor)| Some((major.parse().ok()?, minor.parse().ok()?))))
    }

    /// `<target>::/dev/dri/by-path/pci-<bdf>-{card,render}` for the host's by-path links
    /// that lead to one of `nodes`.
    fn drm_links(
        &self,
        bus_id: &str,
        nodes: &[(String, DeviceNode)],
    ) -> Result<Vec<String>, HostError> {
        let mut links = Vec::new();
        for kind in ["card", "render"] {
            let link = format!("/dev/dri/by-path/pci-{bus_id}-{kind}");
            let target = match self.host.read_link(Path::new(&link)) {
                Ok(target) => target.to_string_lossy().into_owned(),
                Err(_) => continue, // no such link (or not a link): nothing to recreate
            };
            let node = if target.starts_with('/') {
                target.clone()
            } else {
                normalize(&format!("/dev/dri/by-path/{target}"))
            };
            if nodes.iter().any(|(path, _)| *path == node) {
                links.push(format!("{target}::{link}"));
            }
        }
        Ok(links)
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
        let mut edits = ContainerEdits::new().device_node(self.gpu_node(parent_minor)?);
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
}

/// A `createContainer` hook running `nvidia-cdi-hook <subcommand>`, as `nvidia-ctk` writes
/// them (argv\[0\] the binary's name, `NVIDIA_CTK_DEBUG=false`).
fn hook_command(hook: &CdiHook, subcommand: &str) -> Hook {
    let path = hook.path().to_string_lossy().into_owned();
    let argv0 = hook
        .path()
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| hook::HOOK_FILE_NAME.to_owned());
    Hook::new(HookName::CreateContainer, path)
        .arg(argv0)
        .arg(subcommand)
        .env("NVIDIA_CTK_DEBUG", "false")
}

fn create_symlinks(hook: &CdiHook, links: &[String]) -> Hook {
    let mut hook = hook_command(hook, "create-symlinks");
    for link in links {
        hook = hook.arg("--link").arg(link);
    }
    hook
}

/// `path` with `.` and `..` components folded (`/dev/dri/by-path/../card1` →
/// `/dev/dri/card1`).
fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for component in path.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    format!("/{}", parts.join("/"))
}

/// Minor of `/dev/vfio/vfio` under the misc major (10), fixed by the kernel.
pub const VFIO_MISC_MINOR: u32 = 196;

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
    fn by_path_targets_normalize_to_the_node_they_name() {
        assert_eq!(normalize("/dev/dri/by-path/../card1"), "/dev/dri/card1");
        assert_eq!(normalize("/dev/dri/./by-path//x"), "/dev/dri/by-path/x");
        assert_eq!(normalize("/../../x"), "/x");
    }

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
