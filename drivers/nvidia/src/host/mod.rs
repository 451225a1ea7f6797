//! Host facts and side effects, behind one trait: [`Host`].
//!
//! The driver reads `/proc/driver/nvidia/...` (MIG capability minors, per-GPU information),
//! sysfs (`/sys/bus/pci/devices/<bdf>/{iommu_group,driver,driver_override,numa_node}`), checks
//! device nodes, writes sysfs files to rebind a GPU to a VFIO driver, runs a few commands
//! (`nvidia-smi`, `modprobe`) and mounts a tmpfs (MPS). All of it goes through a [`Host`], so that:
//!
//! * [`SystemHost`] does it on the real machine, under a host root (`/`, or `/host-root`
//!   when the plugin runs in a container with the host's `/` mounted there);
//! * [`RootedHost`] does it in a directory (a temporary one in tests), records every write
//!   and command so tests can assert exact sequences, simulates the kernel's sysfs
//!   `bind`/`unbind`, and answers commands from a script. [`FakeHostTree`] lays out the
//!   `/proc`, `/sys` and `/dev` files of a mock hardware profile in such a directory.
//!
//! Paths passed to a [`Host`] are absolute paths as seen on the host (`/sys/bus/pci/...`); the
//! implementation maps them under its root. Errors name the host path.
//!
//! ```
//! use std::path::Path;
//! use dra_driver_nvidia::host::{Host, RootedHost};
//!
//! let dir = tempfile::tempdir()?;
//! std::fs::create_dir_all(dir.path().join("sys/bus/pci/devices/0000:07:00.0"))?;
//! let host = RootedHost::new(dir.path());
//! host.write(Path::new("/sys/bus/pci/devices/0000:07:00.0/driver_override"), b"vfio-pci")?;
//! assert_eq!(
//!     host.read_to_string(Path::new("/sys/bus/pci/devices/0000:07:00.0/driver_override"))?,
//!     "vfio-pci"
//! );
//! assert_eq!(host.events().len(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::path::{Path, PathBuf};

pub mod chroot;
mod fake;
pub mod process;
mod rooted;
mod system;

pub use fake::{
    FIRST_IOMMU_GROUP, FakeHostTree, KERNEL_RELEASE, NVIDIA_CAPS_MAJOR, NVIDIA_CTL_MINOR,
    NVIDIA_GPU_MAJOR, NVIDIA_UVM_MAJOR, VFIO_MAJOR, mig_ci_capability_minor,
    mig_gi_capability_minor,
};
pub use process::ProcessId;
pub use rooted::{HostEvent, RootedHost};
pub use system::SystemHost;

/// Host facts and side effects. Synchronous: sysfs and procfs answer at once, and commands
/// are short; async callers run them on a blocking thread.
pub trait Host: Send + Sync + fmt::Debug {
    /// The directory host paths are resolved under (`/` for the real host).
    fn root(&self) -> &Path;

    /// Where a host path lives in this process's filesystem.
    fn resolve(&self, path: &Path) -> PathBuf {
        let relative = path.strip_prefix("/").unwrap_or(path);
        self.root().join(relative)
    }

    /// Reads a whole file as UTF-8.
    fn read_to_string(&self, path: &Path) -> Result<String, HostError>;

    /// Writes a file, the way sysfs attributes are written: one `write` of `contents`, no
    /// create-and-rename (sysfs files cannot be replaced). [`SystemHost`] writes existing
    /// files only (a missing one is an error, never a new file on the host);
    /// [`RootedHost`] creates them.
    fn write(&self, path: &Path, contents: &[u8]) -> Result<(), HostError>;

    /// Whether a path exists (following symbolic links).
    fn exists(&self, path: &Path) -> Result<bool, HostError>;

    /// The names in a directory, sorted.
    fn read_dir(&self, path: &Path) -> Result<Vec<String>, HostError>;

    /// The target of a symbolic link (for sysfs `driver` and `iommu_group` links).
    fn read_link(&self, path: &Path) -> Result<PathBuf, HostError>;

    /// The device node at `path`, or `None` if nothing is there.
    fn device_node(&self, path: &Path) -> Result<Option<DeviceNode>, HostError>;

    /// Runs a command to completion. A non-zero exit is not an error here; see
    /// [`CommandOutput::success`].
    fn run(&self, command: &HostCommand) -> Result<CommandOutput, HostError>;

    /// Starts a long-running process (a sharing daemon) without waiting for it: in a process
    /// group of its own, standard streams on `/dev/null`, so that it outlives the plugin
    /// process. Returns its identity ([`process::ProcessId`]: pid and start time), which is
    /// what a restarted plugin checks before adopting it.
    fn spawn(&self, command: &HostCommand) -> Result<process::ProcessId, HostError>;

    /// Sends SIGTERM (SIGKILL with `force`) to a process this plugin started. A process that
    /// is gone already is not an error.
    fn signal(&self, process: &process::ProcessId, force: bool) -> Result<(), HostError>;

    /// Mounts a new tmpfs of `size` (`65536k`, tmpfs's `size=` syntax) at `target`, with
    /// `nosuid`, `nodev` and `noexec`, by the `mount(2)` system call: the plugin's image has
    /// no `mount` program. `target` is a path in the plugin's own filesystem, not a host path:
    /// the MPS directories live in the kubelet's plugins directory, which the chart mounts at
    /// the same path, with bidirectional propagation so that the node (and the pods the
    /// kubelet starts there) see the tmpfs too.
    fn mount_tmpfs(&self, target: &Path, size: &str) -> Result<(), HostError>;

    /// Unmounts what is mounted at `target` (a path in the plugin's own filesystem, as for
    /// [`Host::mount_tmpfs`]) by `umount2(2)`. Returns `false` when nothing was mounted there
    /// or `target` is gone, which an interrupted earlier unmount leaves behind.
    fn unmount(&self, target: &Path) -> Result<bool, HostError>;
}

/// A character or block device node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceNode {
    /// Character or block.
    pub kind: DeviceNodeKind,
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
}

/// The kind of a device node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceNodeKind {
    /// Character device (`c`); every NVIDIA node is one.
    Char,
    /// Block device (`b`).
    Block,
}

impl DeviceNodeKind {
    /// `c` or `b`, as CDI and `mknod` spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Char => "c",
            Self::Block => "b",
        }
    }
}

/// A command to run on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostCommand {
    /// The program (a path, or a name looked up in `PATH`).
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Run it with the host root as `/`, as upstream does for `modprobe` when the plugin runs
    /// in a container ([`SystemHost`] does so without a `chroot` program: see [`chroot`]).
    pub chroot: bool,
    /// Environment variables set for it, on top of the plugin's.
    pub env: Vec<(String, String)>,
    /// What it reads on its standard input (`nvidia-cuda-mps-control` takes its commands
    /// there); nothing when `None`.
    pub stdin: Option<String>,
}

impl HostCommand {
    /// `program args…`, not chrooted.
    pub fn new<I, S>(program: impl Into<String>, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            chroot: false,
            env: Vec::new(),
            stdin: None,
        }
    }

    /// The same command, run chrooted into the host root.
    pub fn chrooted(mut self) -> Self {
        self.chroot = true;
        self
    }

    /// The same command with one more environment variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// The same command, reading `input` on its standard input.
    pub fn stdin(mut self, input: impl Into<String>) -> Self {
        self.stdin = Some(input.into());
        self
    }
}

impl fmt::Display for HostCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (key, value) in &self.env {
            write!(f, "{key}={value} ")?;
        }
        f.write_str(&self.program)?;
        for arg in &self.args {
            write!(f, " {arg}")?;
        }
        Ok(())
    }
}

/// What a command printed and how it ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommandOutput {
    /// Exit status; `None` when a signal ended it.
    pub status: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl CommandOutput {
    /// Exit status 0 with this output.
    pub fn ok(stdout: impl Into<String>) -> Self {
        Self {
            status: Some(0),
            stdout: stdout.into(),
            stderr: String::new(),
        }
    }

    /// Exit status `status` with this standard error.
    pub fn failed(status: i32, stderr: impl Into<String>) -> Self {
        Self {
            status: Some(status),
            stdout: String::new(),
            stderr: stderr.into(),
        }
    }

    /// Whether it exited with status 0.
    pub fn success(&self) -> bool {
        self.status == Some(0)
    }
}

/// Why a host operation failed. Every variant names the host path or command.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// Reading failed.
    #[error("reading {path}: {source}")]
    Read {
        /// Host path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Writing failed.
    #[error("writing {contents:?} to {path}: {source}")]
    Write {
        /// Host path.
        path: PathBuf,
        /// What was written (lossy UTF-8).
        contents: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file's contents are not what the kernel writes there.
    #[error("unexpected contents in {path}: {reason}")]
    Malformed {
        /// Host path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A mount or unmount system call failed.
    #[error("{operation} {path}: {source}")]
    Mount {
        /// `mounting a tmpfs on` or `unmounting`.
        operation: &'static str,
        /// The mount point, in the plugin's filesystem.
        path: PathBuf,
        /// The error the kernel returned.
        source: std::io::Error,
    },
    /// A command could not be started.
    #[error("running `{command}`: {reason}")]
    Command {
        /// The command line.
        command: String,
        /// Why it did not run.
        reason: String,
    },
}

impl HostError {
    pub(crate) fn read(path: &Path, source: std::io::Error) -> Self {
        Self::Read {
            path: path.to_owned(),
            source,
        }
    }

    pub(crate) fn write(path: &Path, contents: &[u8], source: std::io::Error) -> Self {
        Self::Write {
            path: path.to_owned(),
            contents: String::from_utf8_lossy(contents).into_owned(),
            source,
        }
    }

    /// Whether the error is a missing file or directory.
    pub fn is_not_found(&self) -> bool {
        match self {
            Self::Read { source, .. } | Self::Write { source, .. } => {
                source.kind() == std::io::ErrorKind::NotFound
            }
            _ => false,
        }
    }
}

/// Host facts derived from files: the helpers the driver uses, on any [`Host`].
pub mod facts {
    use super::{Host, HostError};
    use std::path::{Path, PathBuf};

    /// `/sys/bus/pci/devices/<bdf>`.
    pub fn pci_device_dir(bus_id: &str) -> PathBuf {
        PathBuf::from("/sys/bus/pci/devices").join(bus_id)
    }

    /// The PCIe root complex of a PCI device (`pci0000:00`), from the sysfs path its
    /// `/sys/bus/pci/devices/<bdf>` link points at (`../../../devices/pci0000:00/…/<bdf>`).
    /// `None` when the link is missing or has no `pci<domain>:<bus>` component.
    pub fn pcie_root(host: &dyn Host, bus_id: &str) -> Result<Option<String>, HostError> {
        let link = match host.read_link(&pci_device_dir(bus_id)) {
            Ok(link) => link,
            Err(error) if error.is_not_found() => return Ok(None),
            Err(error) => return Err(error),
        };
        Ok(link
            .components()
            .filter_map(|component| component.as_os_str().to_str())
            .find(|name| name.starts_with("pci") && name.contains(':'))
            .map(str::to_owned))
    }

    /// The driver a PCI device is bound to (`nvidia`, `vfio-pci`), or `None` when unbound.
    pub fn pci_driver(host: &dyn Host, bus_id: &str) -> Result<Option<String>, HostError> {
        match host.read_link(&pci_device_dir(bus_id).join("driver")) {
            Ok(link) => Ok(link
                .file_name()
                .and_then(|name| name.to_str())
                .map(str::to_owned)),
            Err(error) if error.is_not_found() => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// The IOMMU group of a PCI device, or `None` when the IOMMU is off.
    pub fn iommu_group(host: &dyn Host, bus_id: &str) -> Result<Option<u32>, HostError> {
        let path = pci_device_dir(bus_id).join("iommu_group");
        match host.read_link(&path) {
            Ok(link) => {
                let group = link
                    .file_name()
                    .and_then(|name| name.to_str())
                    .and_then(|name| name.parse().ok())
                    .ok_or_else(|| HostError::Malformed {
                        path: path.clone(),
                        reason: format!("link target {} is not a group number", link.display()),
                    })?;
                Ok(Some(group))
            }
            Err(error) if error.is_not_found() => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// A process holding a device node open.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct NodeHolder {
        /// Its process ID (in the host's pid namespace).
        pub pid: u32,
        /// Its command name (`/proc/<pid>/comm`), empty when unreadable.
        pub name: String,
    }

    impl std::fmt::Display for NodeHolder {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self.name.as_str() {
                "" => write!(f, "PID {}", self.pid),
                name => write!(f, "PID {} ({name})", self.pid),
            }
        }
    }

    /// The processes holding `node` open, from the `/proc/<pid>/fd` links the host shows.
    /// Processes that exit or hide their descriptors while being read are skipped.
    pub fn node_holders(host: &dyn Host, node: &Path) -> Result<Vec<NodeHolder>, HostError> {
        let pids = match host.read_dir(Path::new("/proc")) {
            Ok(names) => names,
            Err(error) if error.is_not_found() => return Ok(Vec::new()),
            Err(error) => return Err(error),
        };
        let mut holders = Vec::new();
        for pid in pids.iter().filter_map(|name| name.parse::<u32>().ok()) {
            let process = PathBuf::from("/proc").join(pid.to_string());
            let fd_dir = process.join("fd");
            let Ok(fds) = host.read_dir(&fd_dir) else {
                continue;
            };
            let holds = fds.iter().any(|fd| {
                host.read_link(&fd_dir.join(fd))
                    .is_ok_and(|target| target == node)
            });
            if holds {
                let name = host
                    .read_to_string(&process.join("comm"))
                    .map(|name| name.trim().to_owned())
                    .unwrap_or_default();
                holders.push(NodeHolder { pid, name });
            }
        }
        Ok(holders)
    }

    /// The NUMA node of a PCI device; `None` when the file is missing or says `-1`.
    pub fn numa_node(host: &dyn Host, bus_id: &str) -> Result<Option<u32>, HostError> {
        let path = pci_device_dir(bus_id).join("numa_node");
        match host.read_to_string(&path) {
            Ok(text) => {
                let node: i64 = text.trim().parse().map_err(|_| HostError::Malformed {
                    path: path.clone(),
                    reason: format!("{:?} is not a NUMA node number", text.trim()),
                })?;
                Ok(u32::try_from(node).ok())
            }
            Err(error) if error.is_not_found() => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// The capability minor the NVIDIA driver exposes for a MIG GPU instance or compute
    /// instance, from `/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<gi>[/ci<ci>]/access`
    /// (`DeviceFileMinor: <n>` line); its device node is `/dev/nvidia-caps/nvidia-cap<n>`.
    pub fn mig_capability_minor(
        host: &dyn Host,
        gpu_minor: u32,
        gpu_instance: u32,
        compute_instance: Option<u32>,
    ) -> Result<u32, HostError> {
        let mut path = PathBuf::from(format!(
            "/proc/driver/nvidia/capabilities/gpu{gpu_minor}/mig/gi{gpu_instance}"
        ));
        if let Some(ci) = compute_instance {
            path.push(format!("ci{ci}"));
        }
        path.push("access");
        capability_minor(host, &path)
    }

    /// The `DeviceFileMinor` of a `/proc/driver/nvidia/capabilities/.../access` file.
    pub fn capability_minor(host: &dyn Host, path: &Path) -> Result<u32, HostError> {
        let text = host.read_to_string(path)?;
        text.lines()
            .find_map(|line| {
                let (key, value) = line.split_once(':')?;
                (key.trim() == "DeviceFileMinor").then(|| value.trim().parse().ok())?
            })
            .ok_or_else(|| HostError::Malformed {
                path: path.to_owned(),
                reason: "no numeric DeviceFileMinor line".into(),
            })
    }
}
