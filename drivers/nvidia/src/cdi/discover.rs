//! The files of an NVIDIA driver installation that a container gets, found by the rules
//! `nvidia-ctk cdi generate` (NVIDIA Container Toolkit, `nvml` mode) uses:
//!
//! * **Driver libraries**: the folder of `libcuda.so.<version>` (else
//!   `libnvidia-ml.so.<version>`), looked up in the usual library folders and then in the
//!   root's `/etc/ld.so.cache` ([`super::ldcache`]); in that folder and its `vdpau/`
//!   subfolder, every `*.so.<version>` (compute, video: `libnvcuvid`, `libnvidia-encode`,
//!   `libnvidia-opticalflow`, VDPAU; graphics: `libGLX_nvidia`, `libEGL_nvidia`, ...;
//!   whatever the installed version ships), and `libnvidia-nvvm70.so.*`.
//! * **Graphics**: `libnvidia-egl-gbm.so.*.*` and `libnvidia-egl-wayland.so.*.*` (versioned
//!   apart from the driver), the X driver `nvidia_drv.so` and `libglxserver_nvidia.so.<version>`
//!   in the X module folders; the configuration files under `/etc`, `/usr/local/share` or
//!   `/usr/share` ([`CONFIG_FILES`]); the Vulkan ICD and layer files ([`VULKAN_FILES`]), mounted
//!   under the container's `/etc`.
//! * **Binaries** ([`BINARIES`]) in the usual `PATH` folders, first found.
//! * **GSP firmware**: `nvidia/<version>/gsp*.bin` under the kernel's firmware folders
//!   (a custom `firmware_class.path`, `/lib/firmware/updates[/<release>]`,
//!   `/lib/firmware[/<release>]`).
//! * **IPC sockets**: `nvidia-persistenced/socket` and `nvidia-fabricmanager/socket` under
//!   `/run` or `/var/run`. The MPS pipe folder is not among them: MPS claims mount their own
//!   daemon's folder (`crate::sharing`).
//! * **Links** the `create-symlinks` hook makes in the container: `libcuda.so`,
//!   `libGLX_indirect.so.0`, `libnvidia-opticalflow.so`, each library's soname and `.so`
//!   links where the host has them, `gbm/nvidia-drm_gbm.so`,
//!   `libnvidia-vulkan-producer.so`, `libglxserver_nvidia.so`.
//!
//! Where this differs from `nvidia-ctk`: a library's soname is the name of the link
//! `ldconfig` made next to it on the host (`libcuda.so.1 -> libcuda.so.550.54.15`), else the
//! soname NVIDIA's libraries are known to have ([`KNOWN_SONAMES`]); `nvidia-ctk` reads it from
//! the ELF file, which on every installed driver names the same link. Mount sources are the
//! files with every symbolic link resolved inside the driver root, so that an absolute link
//! in a driver container's root (`/run/nvidia/driver`) never leads to the node's own `/usr`.
//! The loader cache's aarch64 entries are read (see [`super::ldcache`]).

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::DriverRoot;
use super::ldcache::{self, LD_SO_CACHE, LdCacheEntry};
use crate::host::{Host, HostError};

/// Folders searched for driver libraries, relative to the driver root, in order:
/// `nvidia-ctk`'s list. The loader cache is searched after them.
pub const LIBRARY_SEARCH_DIRS: [&str; 12] = [
    "/",
    "/usr/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/lib/aarch64-linux-gnu/nvidia/current",
    "/lib64",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu/nvidia/current",
    "/lib/aarch64-linux-gnu/nvidia/current",
    "/glibc/lib",
];

/// Folders searched for driver binaries, in order (`nvidia-ctk`'s default `PATH`).
pub const BINARY_SEARCH_DIRS: [&str; 6] = [
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// The driver binaries mounted into containers.
pub const BINARIES: [&str; 7] = [
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-imex",
    "nvidia-imex-ctl",
];

/// Folders searched for configuration files (relative to the driver root), in order:
/// `/etc`, then the default `XDG_DATA_DIRS`.
pub const CONFIG_SEARCH_DIRS: [&str; 3] = ["/etc", "/usr/local/share", "/usr/share"];

/// Graphics configuration files, relative to a [configuration folder](CONFIG_SEARCH_DIRS),
/// mounted at the path they have in the driver root.
pub const CONFIG_FILES: [&str; 6] = [
    "glvnd/egl_vendor.d/10_nvidia.json",
    "egl/egl_external_platform.d/15_nvidia_gbm.json",
    "egl/egl_external_platform.d/10_nvidia_wayland.json",
    "nvidia/nvoptix.bin",
    "X11/xorg.conf.d/10-nvidia.conf",
    "X11/xorg.conf.d/nvidia-drm-outputclass.conf",
];

/// Vulkan ICD and layer files, relative to a configuration folder or to the driver root
/// itself (GKE installs them at `<driver root>/vulkan`), mounted under the container's
/// `/etc` (where the Vulkan loader looks first). The architecture-named ICD file of RPM
/// packages is looked for as well.
pub const VULKAN_FILES: [&str; 3] = [
    "vulkan/icd.d/nvidia_icd.json",
    "vulkan/icd.d/nvidia_layers.json",
    "vulkan/implicit_layer.d/nvidia_layers.json",
];

/// The sonames of NVIDIA's libraries, for a library the host has no soname link beside
/// (a driver root laid out by copying files): `(library name without the version, soname)`.
pub const KNOWN_SONAMES: [(&str, &str); 24] = [
    ("libcuda.so", "libcuda.so.1"),
    ("libcudadebugger.so", "libcudadebugger.so.1"),
    ("libnvidia-ml.so", "libnvidia-ml.so.1"),
    (
        "libnvidia-ptxjitcompiler.so",
        "libnvidia-ptxjitcompiler.so.1",
    ),
    ("libnvidia-nvvm.so", "libnvidia-nvvm.so.4"),
    ("libnvidia-opencl.so", "libnvidia-opencl.so.1"),
    ("libnvidia-cfg.so", "libnvidia-cfg.so.1"),
    ("libnvidia-allocator.so", "libnvidia-allocator.so.1"),
    ("libnvidia-nscq.so", "libnvidia-nscq.so.2"),
    ("libnvcuvid.so", "libnvcuvid.so.1"),
    ("libnvidia-encode.so", "libnvidia-encode.so.1"),
    ("libnvidia-opticalflow.so", "libnvidia-opticalflow.so.1"),
    ("libnvidia-fbc.so", "libnvidia-fbc.so.1"),
    ("libvdpau_nvidia.so", "libvdpau_nvidia.so.1"),
    ("libnvoptix.so", "libnvoptix.so.1"),
    ("libnvidia-ngx.so", "libnvidia-ngx.so.1"),
    ("libGLX_nvidia.so", "libGLX_nvidia.so.0"),
    ("libEGL_nvidia.so", "libEGL_nvidia.so.0"),
    ("libGLESv2_nvidia.so", "libGLESv2_nvidia.so.2"),
    ("libGLESv1_CM_nvidia.so", "libGLESv1_CM_nvidia.so.1"),
    ("libnvidia-vksc-core.so", "libnvidia-vksc-core.so.1"),
    ("libnvidia-egl-gbm.so", "libnvidia-egl-gbm.so.1"),
    ("libnvidia-egl-wayland.so", "libnvidia-egl-wayland.so.1"),
    ("libnvidia-sandboxutils.so", "libnvidia-sandboxutils.so.1"),
];

/// IPC sockets, relative to a [run folder](RUN_DIRS), first found each.
pub const SOCKETS: [&str; 2] = ["nvidia-persistenced/socket", "nvidia-fabricmanager/socket"];

/// Folders searched for [`SOCKETS`], in order.
pub const RUN_DIRS: [&str; 2] = ["/run", "/var/run"];

/// Where the kernel's firmware loader reads a custom firmware folder from (on the host).
pub const FIRMWARE_CLASS_PATH: &str = "/sys/module/firmware_class/parameters/path";

/// At most this many symbolic links are followed for one path, as the kernel's limit.
const MAX_LINKS: usize = 40;

/// What a mount is, which decides its options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MountKind {
    /// A library, binary, firmware or configuration file: read-only.
    File,
    /// A Vulkan file mounted under `/etc`: read-only, a plain bind.
    Vulkan,
    /// An IPC socket: writable (a client connects), not executable.
    Socket,
}

/// A file of the driver root to mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct FileMount {
    /// The file, every link resolved, relative to the driver root.
    pub(super) source: String,
    /// Where the container sees it.
    pub(super) container: String,
    pub(super) kind: MountKind,
}

/// A symbolic link for the container: `target` at `path` (`libcuda.so.1` at
/// `/usr/lib/x86_64-linux-gnu/libcuda.so`), leading to the driver root's `source`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Link {
    pub(super) target: String,
    pub(super) path: String,
    /// The file the link ends at, relative to the driver root (mounted at `path` when no
    /// hook makes the link).
    pub(super) source: String,
    /// Whether `nvidia-ctk` would have the `create-symlinks` hook make it. Sonames the host
    /// has no link for are not (with hooks, `ldconfig` makes them); without hooks every link
    /// is a mount.
    pub(super) by_hook: bool,
}

impl Link {
    /// The hook argument: `<target>::<path>`.
    pub(super) fn argument(&self) -> String {
        format!("{}::{}", self.target, self.path)
    }
}

/// Everything found for one driver version.
#[derive(Debug, Default)]
pub(super) struct DriverFiles {
    /// The folder of `libcuda.so.<version>` in the container, when found.
    pub(super) library_dir: Option<String>,
    /// Version-suffixed libraries and the legacy NVVM: what `update-ldcache` indexes.
    pub(super) libraries: Vec<FileMount>,
    /// Graphics libraries versioned apart, and the X modules.
    pub(super) graphics_libraries: Vec<FileMount>,
    pub(super) configs: Vec<FileMount>,
    pub(super) binaries: Vec<FileMount>,
    pub(super) firmware: Vec<FileMount>,
    pub(super) sockets: Vec<FileMount>,
    pub(super) links: Vec<Link>,
    /// Set when no library of the version was found but another version's `libcuda.so` was.
    pub(super) other_version: Option<String>,
}

impl DriverFiles {
    /// The folders of [`Self::libraries`], each once, in order: `update-ldcache`'s folders.
    pub(super) fn library_folders(&self) -> Vec<String> {
        let mut folders: Vec<String> = Vec::new();
        for library in &self.libraries {
            let folder = parent(&library.container).to_owned();
            if !folders.contains(&folder) {
                folders.push(folder);
            }
        }
        folders
    }

    /// Every mount, in the order the edits list them.
    pub(super) fn mounts(&self) -> impl Iterator<Item = &FileMount> {
        self.libraries
            .iter()
            .chain(&self.graphics_libraries)
            .chain(&self.configs)
            .chain(&self.binaries)
            .chain(&self.firmware)
            .chain(&self.sockets)
    }
}

/// Finds the driver's files under `root` for `version`. `host` is the node itself: the
/// kernel release and a custom firmware folder are read there.
pub(super) fn discover(
    root: &DriverRoot,
    host: &dyn Host,
    version: &str,
) -> Result<DriverFiles, HostError> {
    let mut finder = Finder::new(root.files());
    let mut files = DriverFiles::default();

    let library = match finder.find_library(&format!("libcuda.so.{version}"))? {
        Some(found) => Some(found),
        None => finder.find_library(&format!("libnvidia-ml.so.{version}"))?,
    };
    if let Some(library) = library {
        let dir = parent(&library).to_owned();
        files.libraries = finder.version_libraries(&dir, version)?;
        files.links = finder.library_links(&files.libraries, version)?;
        files.library_dir = Some(dir);
    } else {
        files.other_version = finder.find_library("libcuda.so.*.*")?.and_then(|path| {
            file_name(&path)
                .strip_prefix("libcuda.so.")
                .map(str::to_owned)
        });
    }
    let (graphics, graphics_links) =
        finder.graphics_libraries(files.library_dir.as_deref(), version, &files.libraries)?;
    files.graphics_libraries = graphics;
    for link in graphics_links {
        if !files.links.iter().any(|l| l.path == link.path) {
            files.links.push(link);
        }
    }
    files.configs = finder.configs()?;
    files.binaries = finder.binaries()?;
    files.firmware = finder.firmware(host, version)?;
    files.sockets = finder.sockets()?;
    Ok(files)
}

/// Looks files up in a driver root, resolving links inside it. Lives for one computation of
/// the edits: its folder listings are never reused across prepares.
struct Finder<'a> {
    files: &'a dyn Host,
    /// The loader cache, read on first use (`None` inside: unreadable or absent).
    ldcache: Option<Option<Vec<LdCacheEntry>>>,
    /// Folder listings already read (the library folder is read once per library otherwise).
    listings: RefCell<HashMap<String, Vec<String>>>,
}

impl<'a> Finder<'a> {
    fn new(files: &'a dyn Host) -> Self {
        Self {
            files,
            ldcache: None,
            listings: RefCell::new(HashMap::new()),
        }
    }

    /// `name` in `dir`, a folder whose path has no links left: only `name` itself can be a
    /// link, so one `readlink` answers for a plain file.
    fn resolve_child(&self, dir: &str, name: &str) -> Result<Option<String>, HostError> {
        let path = join(dir, name);
        match self.files.read_link(Path::new(&path)) {
            Ok(_) => self.resolve(&path),
            Err(error) if is_not_link(&error) => Ok(Some(path)),
            Err(error) if is_absent(&error) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// `path` (relative to the root, absolute form) with every symbolic link resolved
    /// inside the root; `None` when it does not exist (or a link dangles).
    fn resolve(&self, path: &str) -> Result<Option<String>, HostError> {
        resolve_in_root(self.files, path)
    }

    /// The names in a folder of the root that match `pattern` (`*` wildcards); none when
    /// the folder does not exist.
    fn list(&self, dir: &str, pattern: &str) -> Result<Vec<String>, HostError> {
        if let Some(names) = self.listings.borrow().get(dir) {
            return Ok(names
                .iter()
                .filter(|name| glob_match(pattern, name))
                .cloned()
                .collect());
        }
        let names = match self.files.read_dir(Path::new(dir)) {
            Ok(names) => names,
            Err(error) if is_absent(&error) => Vec::new(),
            Err(error) => return Err(error),
        };
        let matching = names
            .iter()
            .filter(|name| glob_match(pattern, name))
            .cloned()
            .collect();
        self.listings.borrow_mut().insert(dir.to_owned(), names);
        Ok(matching)
    }

    /// The first library matching `pattern` in [`LIBRARY_SEARCH_DIRS`], else in the loader
    /// cache (by the cached name or the name of the file its path leads to), resolved.
    fn find_library(&mut self, pattern: &str) -> Result<Option<String>, HostError> {
        for dir in LIBRARY_SEARCH_DIRS {
            let Some(resolved_dir) = self.resolve(dir)? else {
                continue;
            };
            for name in self.list(&resolved_dir, pattern)? {
                if let Some(found) = self.resolve_child(&resolved_dir, &name)? {
                    return Ok(Some(found));
                }
            }
        }
        for entry in self.ldcache_entries()? {
            let Some(found) = self.resolve(&entry.path)? else {
                continue;
            };
            if glob_match(pattern, &entry.name) || glob_match(pattern, file_name(&found)) {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// Every library matching `pattern` in the search folders (each file once), else the
    /// loader cache's.
    fn find_libraries(&mut self, pattern: &str) -> Result<Vec<String>, HostError> {
        let mut found = Vec::new();
        for dir in LIBRARY_SEARCH_DIRS {
            let Some(resolved_dir) = self.resolve(dir)? else {
                continue;
            };
            for name in self.list(&resolved_dir, pattern)? {
                if let Some(path) = self.resolve_child(&resolved_dir, &name)?
                    && !found.contains(&path)
                {
                    found.push(path);
                }
            }
        }
        if found.is_empty() {
            for entry in self.ldcache_entries()? {
                if let Some(path) = self.resolve(&entry.path)?
                    && (glob_match(pattern, &entry.name) || glob_match(pattern, file_name(&path)))
                    && !found.contains(&path)
                {
                    found.push(path);
                }
            }
        }
        Ok(found)
    }

    fn ldcache_entries(&mut self) -> Result<Vec<LdCacheEntry>, HostError> {
        if self.ldcache.is_none() {
            self.ldcache = Some(self.read_ldcache()?);
        }
        Ok(self.ldcache.clone().flatten().unwrap_or_default())
    }

    /// The root's loader cache; `None` when there is none, it cannot be read or it is not
    /// one (logged: a driver root whose libraries are all in the usual folders does not need
    /// it, so this never fails a prepare).
    fn read_ldcache(&self) -> Result<Option<Vec<LdCacheEntry>>, HostError> {
        let Some(path) = self.resolve(LD_SO_CACHE)? else {
            return Ok(None);
        };
        // The cache is binary, which `Host` does not read: the driver root is always a
        // directory tree of this process (`SystemHost` or `RootedHost`), so read the file
        // there.
        let data = match std::fs::read(self.files.resolve(Path::new(&path))) {
            Ok(data) => data,
            Err(error) => {
                tracing::warn!(path = %path, %error, "cannot read the driver root's loader cache; ignoring it");
                return Ok(None);
            }
        };
        match ldcache::parse(&data) {
            Ok(entries) => Ok(Some(entries)),
            Err(error) => {
                tracing::warn!(path = %path, %error, "ignoring the driver root's loader cache");
                Ok(None)
            }
        }
    }

    /// Every `*.so.<version>` in `dir` and `dir/vdpau`, and `libnvidia-nvvm70.so.*` in
    /// `dir`: each file once, by name within each folder.
    fn version_libraries(&self, dir: &str, version: &str) -> Result<Vec<FileMount>, HostError> {
        let pattern = format!("*.so.{version}");
        let mut seen = HashSet::new();
        let mut libraries = Vec::new();
        // The vdpau folder may be a link itself: resolved, so that only names can be.
        let vdpau = self.resolve(&join(dir, "vdpau"))?;
        let mut folders = vec![(dir, pattern.as_str())];
        if let Some(vdpau) = &vdpau {
            folders.push((vdpau.as_str(), pattern.as_str()));
        }
        folders.push((dir, "libnvidia-nvvm70.so.*"));
        for (folder, pattern) in folders {
            for name in self.list(folder, pattern)? {
                let Some(resolved) = self.resolve_child(folder, &name)? else {
                    continue;
                };
                if seen.insert(resolved.clone()) {
                    libraries.push(FileMount {
                        container: resolved.clone(),
                        source: resolved,
                        kind: MountKind::File,
                    });
                }
            }
        }
        Ok(libraries)
    }

    /// The links of the version libraries: `nvidia-ctk`'s fixed ones, then each library's
    /// soname and `.so` links.
    fn library_links(
        &self,
        libraries: &[FileMount],
        version: &str,
    ) -> Result<Vec<Link>, HostError> {
        let mut links: Vec<Link> = Vec::new();
        let mut push = |link: Link| {
            if !links.iter().any(|l| l.path == link.path) {
                links.push(link);
            }
        };
        for library in libraries {
            let dir = parent(&library.container);
            let name = file_name(&library.container);
            let link = |target: &str, link_name: &str, by_hook: bool| Link {
                target: target.to_owned(),
                path: join(dir, link_name),
                source: library.source.clone(),
                by_hook,
            };
            let versioned = |stem: &str| name == format!("{stem}.{version}");
            if versioned("libcuda.so") {
                // Programs that dlopen("libcuda.so") without a development package.
                push(link("libcuda.so.1", "libcuda.so", true));
            } else if versioned("libGLX_nvidia.so") {
                // GLVND's indirect GLX.
                push(link(name, "libGLX_indirect.so.0", true));
            } else if versioned("libnvidia-opticalflow.so") {
                push(link(
                    "libnvidia-opticalflow.so.1",
                    "libnvidia-opticalflow.so",
                    true,
                ));
            }
            if !name.ends_with(&format!(".so.{version}")) {
                continue;
            }
            let (soname, by_hook) = match self.soname_link(dir, name, &library.source)? {
                Some(soname) => (Some(soname), true),
                None => (known_soname(name).map(str::to_owned), false),
            };
            if let Some(soname) = &soname
                && soname != name
            {
                push(link(name, soname, by_hook));
            }
            let so_target = soname.as_deref().unwrap_or(name);
            if let Some(dot_so) = dot_so_name(so_target)
                && dot_so != so_target
                && self.is_link(&join(dir, dot_so))?
            {
                push(link(so_target, dot_so, true));
            }
        }
        Ok(links)
    }

    /// The soname link the host has beside `name` in `dir`: a link named
    /// `<name up to .so>.so.<...>` that leads to `source` (the shortest, when several do).
    fn soname_link(
        &self,
        dir: &str,
        name: &str,
        source: &str,
    ) -> Result<Option<String>, HostError> {
        let Some(stem_end) = name.find(".so.") else {
            return Ok(None);
        };
        let prefix = &name[..stem_end + ".so.".len()];
        let mut best: Option<String> = None;
        for candidate in self.list(dir, &format!("{prefix}*"))? {
            if candidate == name || !self.is_link(&join(dir, &candidate))? {
                continue;
            }
            if self.resolve(&join(dir, &candidate))?.as_deref() != Some(source) {
                continue;
            }
            if best.as_ref().is_none_or(|b| candidate.len() < b.len()) {
                best = Some(candidate);
            }
        }
        Ok(best)
    }

    fn is_link(&self, path: &str) -> Result<bool, HostError> {
        match self.files.read_link(Path::new(path)) {
            Ok(_) => Ok(true),
            Err(error) if is_absent(&error) || is_not_link(&error) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// EGL platform libraries, the X modules, and their links: `gbm/nvidia-drm_gbm.so` for
    /// `libnvidia-allocator`, `libnvidia-vulkan-producer.so`, `libglxserver_nvidia.so`.
    /// Soname links of the EGL libraries are mount-only (with hooks, `ldconfig` makes them).
    fn graphics_libraries(
        &mut self,
        library_dir: Option<&str>,
        version: &str,
        libraries: &[FileMount],
    ) -> Result<(Vec<FileMount>, Vec<Link>), HostError> {
        let mut mounts: Vec<FileMount> = Vec::new();
        let mut links = Vec::new();
        let mounted = |path: &str, mounts: &[FileMount]| {
            libraries.iter().chain(mounts).any(|m| m.source == path)
        };
        for pattern in ["libnvidia-egl-gbm.so.*.*", "libnvidia-egl-wayland.so.*.*"] {
            for path in self.find_libraries(pattern)? {
                if mounted(&path, &mounts) {
                    continue;
                }
                let dir = parent(&path).to_owned();
                let name = file_name(&path).to_owned();
                let soname = match self.soname_link(&dir, &name, &path)? {
                    Some(soname) => Some(soname),
                    None => known_soname(&name).map(str::to_owned),
                };
                if let Some(soname) = soname {
                    links.push(Link {
                        target: name.clone(),
                        path: join(&dir, &soname),
                        source: path.clone(),
                        by_hook: false,
                    });
                }
                mounts.push(FileMount {
                    container: path.clone(),
                    source: path,
                    kind: MountKind::File,
                });
            }
        }
        for library in libraries {
            let dir = parent(&library.container);
            let name = file_name(&library.container);
            if name == format!("libnvidia-allocator.so.{version}") {
                links.push(Link {
                    target: "../libnvidia-allocator.so.1".to_owned(),
                    path: join(dir, "gbm/nvidia-drm_gbm.so"),
                    source: library.source.clone(),
                    by_hook: true,
                });
            } else if name == format!("libnvidia-vulkan-producer.so.{version}") {
                links.push(Link {
                    target: name.to_owned(),
                    path: join(dir, "libnvidia-vulkan-producer.so"),
                    source: library.source.clone(),
                    by_hook: true,
                });
            }
        }
        for name in [
            "nvidia_drv.so".to_owned(),
            format!("libglxserver_nvidia.so.{version}"),
        ] {
            let Some((path, resolved)) = self.first_in(&xorg_dirs(library_dir), &name)? else {
                continue;
            };
            if mounted(&resolved, &mounts) {
                continue;
            }
            if name.starts_with("libglxserver_nvidia.so.") {
                links.push(Link {
                    target: name.clone(),
                    path: join(parent(&path), "libglxserver_nvidia.so"),
                    source: resolved.clone(),
                    by_hook: true,
                });
            }
            mounts.push(FileMount {
                source: resolved,
                container: path,
                kind: MountKind::File,
            });
        }
        Ok((mounts, links))
    }

    /// `dir/name` of the first of `dirs` that has it: the path as looked up, and resolved.
    fn first_in(&self, dirs: &[String], name: &str) -> Result<Option<(String, String)>, HostError> {
        for dir in dirs {
            let path = join(dir, name);
            if let Some(resolved) = self.resolve(&path)? {
                return Ok(Some((path, resolved)));
            }
        }
        Ok(None)
    }

    fn configs(&self) -> Result<Vec<FileMount>, HostError> {
        let mut mounts: Vec<FileMount> = Vec::new();
        for file in CONFIG_FILES {
            for dir in CONFIG_SEARCH_DIRS {
                let path = join(dir, file);
                if let Some(resolved) = self.resolve(&path)?
                    && !mounts.iter().any(|m| m.source == resolved)
                {
                    mounts.push(FileMount {
                        source: resolved,
                        container: path,
                        kind: MountKind::File,
                    });
                }
            }
        }
        let arch_icd = format!("vulkan/icd.d/nvidia_icd.{}.json", std::env::consts::ARCH);
        let vulkan_dirs: Vec<String> = CONFIG_SEARCH_DIRS
            .iter()
            .chain(&["/"])
            .map(|dir| (*dir).to_owned())
            .collect();
        for file in VULKAN_FILES.iter().copied().chain([arch_icd.as_str()]) {
            if let Some((_, resolved)) = self.first_in(&vulkan_dirs, file)?
                && !mounts.iter().any(|m| m.source == resolved)
            {
                mounts.push(FileMount {
                    source: resolved,
                    container: join("/etc", file),
                    kind: MountKind::Vulkan,
                });
            }
        }
        Ok(mounts)
    }

    fn binaries(&self) -> Result<Vec<FileMount>, HostError> {
        let dirs: Vec<String> = BINARY_SEARCH_DIRS.iter().map(|d| (*d).to_owned()).collect();
        let mut mounts = Vec::new();
        for name in BINARIES {
            if let Some((path, resolved)) = self.first_in(&dirs, name)? {
                mounts.push(FileMount {
                    source: resolved,
                    container: path,
                    kind: MountKind::File,
                });
            }
        }
        Ok(mounts)
    }

    /// `nvidia/<version>/gsp*.bin` in each firmware folder.
    fn firmware(&self, host: &dyn Host, version: &str) -> Result<Vec<FileMount>, HostError> {
        let release = match host.read_to_string(Path::new("/proc/sys/kernel/osrelease")) {
            Ok(text) => Some(text.trim().to_owned()).filter(|r| !r.is_empty()),
            Err(error) if is_absent(&error) => None,
            Err(error) => return Err(error),
        };
        let custom = match host.read_to_string(Path::new(FIRMWARE_CLASS_PATH)) {
            Ok(text) => Some(text.trim().to_owned()).filter(|p| p.starts_with('/')),
            Err(error) if is_absent(&error) => None,
            Err(error) => return Err(error),
        };
        let mut dirs: Vec<String> = custom.into_iter().collect();
        if let Some(release) = &release {
            dirs.push(format!("/lib/firmware/updates/{release}"));
        }
        dirs.push("/lib/firmware/updates".to_owned());
        if let Some(release) = &release {
            dirs.push(format!("/lib/firmware/{release}"));
        }
        dirs.push("/lib/firmware".to_owned());

        let mut mounts: Vec<FileMount> = Vec::new();
        for dir in dirs {
            let folder = join(&dir, &format!("nvidia/{version}"));
            let Some(resolved_folder) = self.resolve(&folder)? else {
                continue;
            };
            for name in self.list(&resolved_folder, "gsp*.bin")? {
                if let Some(resolved) = self.resolve_child(&resolved_folder, &name)?
                    && !mounts.iter().any(|m| m.source == resolved)
                {
                    mounts.push(FileMount {
                        source: resolved,
                        container: join(&folder, &name),
                        kind: MountKind::File,
                    });
                }
            }
        }
        Ok(mounts)
    }

    fn sockets(&self) -> Result<Vec<FileMount>, HostError> {
        let dirs: Vec<String> = RUN_DIRS.iter().map(|d| (*d).to_owned()).collect();
        let mut mounts = Vec::new();
        for socket in SOCKETS {
            if let Some((path, resolved)) = self.first_in(&dirs, socket)? {
                mounts.push(FileMount {
                    source: resolved,
                    container: path,
                    kind: MountKind::Socket,
                });
            }
        }
        Ok(mounts)
    }
}

/// The X module folders, the driver library folder's first.
fn xorg_dirs(library_dir: Option<&str>) -> Vec<String> {
    let mut dirs = Vec::new();
    if let Some(lib) = library_dir {
        dirs.push(join(lib, "nvidia/xorg"));
        for sub in [
            "xorg/modules/drivers",
            "xorg/modules/extensions",
            "xorg/modules/updates/drivers",
            "xorg/modules/updates/extensions",
        ] {
            dirs.push(join(lib, sub));
        }
    }
    for base in [
        "/usr/lib/xorg",
        "/usr/lib64/xorg",
        "/usr/X11R6/lib",
        "/usr/X11R6/lib64",
    ] {
        for sub in [
            "modules/drivers",
            "modules/extensions",
            "modules/updates/drivers",
            "modules/updates/extensions",
        ] {
            dirs.push(join(base, sub));
        }
    }
    dirs
}

/// `path` (absolute, relative to the root of `files`) with every link resolved inside that
/// root: an absolute link target restarts from the root, `..` never leaves it. `None` when
/// a component does not exist.
pub(super) fn resolve_in_root(files: &dyn Host, path: &str) -> Result<Option<String>, HostError> {
    let mut pending: Vec<String> = components(path).rev().map(str::to_owned).collect();
    let mut resolved: Vec<String> = Vec::new();
    let mut followed = 0;
    while let Some(component) = pending.pop() {
        match component.as_str() {
            "." => continue,
            ".." => {
                resolved.pop();
                continue;
            }
            _ => {}
        }
        let candidate = format!("/{}", {
            let mut parts = resolved.clone();
            parts.push(component.clone());
            parts.join("/")
        });
        match files.read_link(Path::new(&candidate)) {
            Ok(target) => {
                followed += 1;
                if followed > MAX_LINKS {
                    return Err(HostError::Malformed {
                        path: PathBuf::from(path),
                        reason: format!("more than {MAX_LINKS} symbolic links"),
                    });
                }
                let target = target.to_string_lossy().into_owned();
                if target.starts_with('/') {
                    resolved.clear();
                }
                pending.extend(components(&target).rev().map(str::to_owned));
            }
            Err(error) if is_not_link(&error) => resolved.push(component),
            Err(error) if is_absent(&error) => return Ok(None),
            Err(error) => return Err(error),
        }
    }
    Ok(Some(format!("/{}", resolved.join("/"))))
}

fn components(path: &str) -> impl DoubleEndedIterator<Item = &str> {
    path.split('/').filter(|c| !c.is_empty())
}

/// Not found, or a path through something that is not a folder.
fn is_absent(error: &HostError) -> bool {
    match error {
        HostError::Read { source, .. } => matches!(
            source.kind(),
            std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
        ),
        _ => false,
    }
}

/// `readlink` of something that is not a link (`EINVAL`).
fn is_not_link(error: &HostError) -> bool {
    matches!(error, HostError::Read { source, .. } if source.kind() == std::io::ErrorKind::InvalidInput)
}

/// `*` matches any run of characters (none included); everything else itself.
pub(super) fn glob_match(pattern: &str, name: &str) -> bool {
    let Some((first, rest)) = pattern.split_once('*') else {
        return pattern == name;
    };
    let Some(mut remaining) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = rest.split('*').collect();
    let Some((last, middle)) = parts.split_last() else {
        return true;
    };
    for part in middle {
        match remaining.find(part) {
            Some(at) => remaining = &remaining[at + part.len()..],
            None => return false,
        }
    }
    remaining.len() >= last.len() && remaining.ends_with(last)
}

/// The soname NVIDIA's library `name` (`libcuda.so.550.54.15`) is known to have.
fn known_soname(name: &str) -> Option<&'static str> {
    let stem_end = name.find(".so.")? + ".so".len();
    let stem = &name[..stem_end];
    KNOWN_SONAMES
        .iter()
        .find(|(library, _)| *library == stem)
        .map(|(_, soname)| *soname)
}

/// `libfoo.so` for `libfoo.so.1.2`; `None` without a `.so` part.
fn dot_so_name(name: &str) -> Option<&str> {
    if name.ends_with(".so") {
        return Some(name);
    }
    let at = name.rfind(".so.")?;
    Some(&name[..at + ".so".len()])
}

fn join(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(at) => &path[..at],
    }
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::RootedHost;

    #[test]
    fn globs() {
        assert!(glob_match("*.so.550.54.15", "libcuda.so.550.54.15"));
        assert!(!glob_match("*.so.550.54.15", "libcuda.so.1"));
        assert!(glob_match(
            "libnvidia-egl-gbm.so.*.*",
            "libnvidia-egl-gbm.so.1.1.1"
        ));
        assert!(!glob_match(
            "libnvidia-egl-gbm.so.*.*",
            "libnvidia-egl-gbm.so.1"
        ));
        assert!(glob_match("gsp*.bin", "gsp_ga10x.bin"));
        assert!(glob_match("card*", "card1"));
        assert!(!glob_match("card*", "renderD128"));
        assert!(glob_match("nvidia-smi", "nvidia-smi"));
        assert!(glob_match("a*b*c", "abc"));
        assert!(!glob_match("a*bc*c", "abc"));
    }

    #[test]
    fn names() {
        assert_eq!(known_soname("libcuda.so.550.54.15"), Some("libcuda.so.1"));
        assert_eq!(known_soname("libnvidia-glcore.so.550.54.15"), None);
        assert_eq!(dot_so_name("libcuda.so.1"), Some("libcuda.so"));
        assert_eq!(
            dot_so_name("libnvidia-egl-gbm.so.1.1.1"),
            Some("libnvidia-egl-gbm.so")
        );
        assert_eq!(dot_so_name("nvidia_drv.so"), Some("nvidia_drv.so"));
        assert_eq!(dot_so_name("gsp.bin"), None);
        assert_eq!(parent("/usr/lib/libcuda.so.1"), "/usr/lib");
        assert_eq!(parent("/libcuda.so.1"), "/");
        assert_eq!(join("/", "lib"), "/lib");
    }

    #[test]
    fn links_resolve_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("usr/lib/x86_64-linux-gnu")).unwrap();
        std::fs::write(root.join("usr/lib/x86_64-linux-gnu/libcuda.so.550.1"), "").unwrap();
        let link = |target: &str, at: &str| std::os::unix::fs::symlink(target, root.join(at));
        link("usr/lib", "lib").unwrap();
        link("libcuda.so.550.1", "usr/lib/x86_64-linux-gnu/libcuda.so.1").unwrap();
        // Absolute: inside the root, never the machine's own /usr.
        link(
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "usr/lib/x86_64-linux-gnu/libcuda.so",
        )
        .unwrap();
        link("../../../../../../x", "escape").unwrap();
        link("loop", "loop").unwrap();
        std::fs::write(root.join("x"), "").unwrap();
        let host = RootedHost::new(root);
        let resolve = |path: &str| resolve_in_root(&host, path);
        assert_eq!(
            resolve("/lib/x86_64-linux-gnu/libcuda.so")
                .unwrap()
                .as_deref(),
            Some("/usr/lib/x86_64-linux-gnu/libcuda.so.550.1")
        );
        assert_eq!(resolve("/escape").unwrap().as_deref(), Some("/x"));
        assert_eq!(resolve("/lib/nothing").unwrap(), None);
        assert_eq!(resolve("/x/under-a-file").unwrap(), None);
        let error = resolve("/loop").unwrap_err().to_string();
        assert!(error.contains("more than 40 symbolic links"), "{error}");
        assert_eq!(resolve("/").unwrap().as_deref(), Some("/"));
    }
}
