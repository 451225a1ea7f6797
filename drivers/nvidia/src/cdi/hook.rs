//! NVIDIA's `nvidia-cdi-hook`: where it comes from, where the container runtime runs it, and
//! how the plugin knows it is there.
//!
//! The container runtime runs the hooks of a CDI spec **on the node**, so the path written
//! into the spec is a node path. Upstream's plugin copies the binary its image carries
//! (`/usr/bin/nvidia-cdi-hook`, from NVIDIA's container-toolkit image) into its plugin
//! folder (`<kubelet plugins dir>/gpu.nvidia.com/nvidia-cdi-hook`) at start, unless
//! `--nvidia-cdi-hook-path` names one; this plugin does the same ([`HookSetup`]):
//!
//! * the copy is atomic (a temporary file in the same folder, made executable, then renamed
//!   over the old copy, so a container starting meanwhile runs the old binary or the new one,
//!   never half a file) and idempotent (an identical executable copy is left alone);
//! * the kubelet plugins folder is mounted into the plugin's container at the node's path,
//!   so the installed file is at the same path for the plugin and for the runtime;
//! * a configured `--nvidia-cdi-hook-path` is a node path: whether it exists is checked in
//!   the node's `/` as the plugin sees it (`--host-root`), or directly when it is under the
//!   plugin folder; where the plugin cannot see it at all, the check is skipped with a
//!   warning at start (the runtime then reports a missing hook when a container starts);
//! * without a hook to install (a development run from `cargo`, an image without the
//!   binary), the plugin warns and writes specs without hooks: each library is then mounted
//!   a second time at its soname and at every link the hook would have made (see
//!   [`crate::cdi`]).

use std::fmt;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::host::{Host, HostError, SystemHost};

/// Where the plugin's image carries the hook (copied there from NVIDIA's container-toolkit
/// image by `drivers/nvidia/Dockerfile`).
pub const BUNDLED_HOOK: &str = "/usr/bin/nvidia-cdi-hook";

/// The installed hook's file name in the plugin folder, as upstream's.
pub const HOOK_FILE_NAME: &str = "nvidia-cdi-hook";

/// The `nvidia-cdi-hook` binary the edits' hooks run, and how to check that it exists.
#[derive(Clone)]
pub struct CdiHook {
    path: PathBuf,
    check: HookCheck,
}

#[derive(Clone)]
enum HookCheck {
    /// Through the host the edits are computed from.
    EditsHost,
    /// Through this view of the node's files.
    In(Arc<dyn Host>),
    /// Not checkable from the plugin (warned about at start).
    Skipped,
}

impl CdiHook {
    /// The hook at `path` on the node; prepare checks that it exists through the host the
    /// edits are computed from ([`super::CdiEdits::host`]).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            check: HookCheck::EditsHost,
        }
    }

    /// Checks the path through `view`, a [`Host`] that sees the node's files (one rooted at
    /// `--host-root`).
    pub fn checked_in(mut self, view: Arc<dyn Host>) -> Self {
        self.check = HookCheck::In(view);
        self
    }

    /// Does not check the path: the plugin cannot see it.
    pub fn unchecked(mut self) -> Self {
        self.check = HookCheck::Skipped;
        self
    }

    /// The node path of the binary.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the binary exists, as far as the plugin can tell: `None` when it cannot.
    pub fn exists(&self, edits_host: &dyn Host) -> Result<Option<bool>, HostError> {
        match &self.check {
            HookCheck::EditsHost => edits_host.exists(&self.path).map(Some),
            HookCheck::In(view) => view.exists(&self.path).map(Some),
            HookCheck::Skipped => Ok(None),
        }
    }
}

impl fmt::Debug for CdiHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let check = match &self.check {
            HookCheck::EditsHost => "edits host".to_owned(),
            HookCheck::In(view) => format!("under {}", view.root().display()),
            HookCheck::Skipped => "unchecked".to_owned(),
        };
        f.debug_struct("CdiHook")
            .field("path", &self.path)
            .field("check", &check)
            .finish()
    }
}

impl From<PathBuf> for CdiHook {
    fn from(path: PathBuf) -> Self {
        Self::new(path)
    }
}

impl From<&PathBuf> for CdiHook {
    fn from(path: &PathBuf) -> Self {
        Self::new(path.clone())
    }
}

impl From<&Path> for CdiHook {
    fn from(path: &Path) -> Self {
        Self::new(path)
    }
}

impl From<&str> for CdiHook {
    fn from(path: &str) -> Self {
        Self::new(path)
    }
}

impl From<String> for CdiHook {
    fn from(path: String) -> Self {
        Self::new(path)
    }
}

/// Why the bundled hook could not be installed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HookInstallError {
    /// Reading the bundled binary or the installed copy failed.
    #[error("installing nvidia-cdi-hook: reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Writing the copy failed (is the kubelet plugins folder mounted read-write?).
    #[error(
        "installing nvidia-cdi-hook: writing {path}: {source} (the kubelet plugins folder must \
         be mounted read-write at the node's path)"
    )]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

fn read_error(path: &Path) -> impl FnOnce(std::io::Error) -> HookInstallError + '_ {
    move |source| HookInstallError::Read {
        path: path.to_owned(),
        source,
    }
}

fn write_error(path: &Path) -> impl FnOnce(std::io::Error) -> HookInstallError + '_ {
    move |source| HookInstallError::Write {
        path: path.to_owned(),
        source,
    }
}

/// What [`install`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Installed {
    /// Wrote a new copy (none was there, or it differed).
    Copied,
    /// An identical executable copy was there already.
    Unchanged,
}

/// Installs `source` as `<dir>/nvidia-cdi-hook`, executable, atomically and only when the
/// installed copy differs; creates `dir`. Returns the installed path.
pub fn install(source: &Path, dir: &Path) -> Result<(PathBuf, Installed), HookInstallError> {
    let target = dir.join(HOOK_FILE_NAME);
    if same_executable(source, &target)? {
        return Ok((target, Installed::Unchanged));
    }
    std::fs::create_dir_all(dir).map_err(write_error(dir))?;
    let temporary = dir.join(format!(".{HOOK_FILE_NAME}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut input = std::fs::File::open(source).map_err(read_error(source))?;
        let mut output = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o755)
            .open(&temporary)
            .map_err(write_error(&temporary))?;
        std::io::copy(&mut input, &mut output).map_err(write_error(&temporary))?;
        // The mode given at creation is masked by the umask: set it exactly.
        output
            .set_permissions(std::fs::Permissions::from_mode(0o755))
            .map_err(write_error(&temporary))?;
        output.flush().map_err(write_error(&temporary))?;
        output.sync_all().map_err(write_error(&temporary))?;
        std::fs::rename(&temporary, &target).map_err(write_error(&target))?;
        // The rename itself survives a crash once the folder is synced.
        if let Ok(folder) = std::fs::File::open(dir) {
            let _ = folder.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    result.map(|()| (target, Installed::Copied))
}

/// Whether `target` is an executable file with `source`'s bytes. A missing target is not.
fn same_executable(source: &Path, target: &Path) -> Result<bool, HookInstallError> {
    let installed = match std::fs::metadata(target) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(source) => {
            return Err(HookInstallError::Read {
                path: target.to_owned(),
                source,
            });
        }
    };
    let bundled = std::fs::metadata(source).map_err(|error| HookInstallError::Read {
        path: source.to_owned(),
        source: error,
    })?;
    if !installed.is_file()
        || installed.permissions().mode() & 0o111 != 0o111
        || installed.len() != bundled.len()
    {
        return Ok(false);
    }
    let open = |path: &Path| {
        std::fs::File::open(path).map_err(|error| HookInstallError::Read {
            path: path.to_owned(),
            source: error,
        })
    };
    let (mut a, mut b) = (open(source)?, open(target)?);
    let (mut buf_a, mut buf_b) = (vec![0_u8; 64 * 1024], vec![0_u8; 64 * 1024]);
    loop {
        let n = read_full(&mut a, &mut buf_a).map_err(|error| HookInstallError::Read {
            path: source.to_owned(),
            source: error,
        })?;
        let m = read_full(&mut b, &mut buf_b).map_err(|error| HookInstallError::Read {
            path: target.to_owned(),
            source: error,
        })?;
        if n != m || buf_a[..n] != buf_b[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

/// Reads until `buf` is full or the file ends.
fn read_full(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..])? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// Where the plugin's hook comes from at start: the flags and the places it looks.
#[derive(Clone, Debug)]
pub struct HookSetup {
    /// `--nvidia-cdi-hook-path`: a node path, used as given.
    pub configured: Option<PathBuf>,
    /// The binary the image carries ([`BUNDLED_HOOK`]).
    pub bundled: PathBuf,
    /// The plugin folder to install into (`<kubelet plugins dir>/gpu.nvidia.com`), mounted at
    /// the node's path.
    pub install_dir: PathBuf,
    /// Where the node's `/` is mounted in the plugin's container (`--host-root`), to check a
    /// configured path; unused when it does not exist.
    pub host_root: PathBuf,
    /// The plugin serves a mock machine: nothing is installed (the mock machine has no
    /// driver, and a test run must not write into the kubelet's folders).
    pub mock: bool,
}

impl HookSetup {
    /// The hook the edits use, installing the bundled one when none is configured; `None`
    /// (with a warning saying what that means) when there is none.
    pub fn resolve(&self) -> Result<Option<CdiHook>, HookInstallError> {
        if let Some(path) = &self.configured {
            return Ok(Some(self.configured_hook(path)));
        }
        if self.mock {
            tracing::info!(
                "mock machine: no nvidia-cdi-hook installed, CDI specs carry no hooks \
                 (--nvidia-cdi-hook-path adds them)"
            );
            return Ok(None);
        }
        if !self.bundled.is_file() {
            tracing::warn!(
                bundled = %self.bundled.display(),
                "no nvidia-cdi-hook to install (not running from the plugin's image?): CDI \
                 specs carry no hooks, so containers get the driver libraries mounted at \
                 their sonames but no ldconfig run, which images whose loader searches other \
                 folders (a UBI image on an Ubuntu node) need; set --nvidia-cdi-hook-path to \
                 a hook on the node to add them"
            );
            return Ok(None);
        }
        let (path, installed) = install(&self.bundled, &self.install_dir)?;
        tracing::info!(path = %path.display(), ?installed, "nvidia-cdi-hook installed for the container runtime");
        // The plugin folder is mounted at the node's path: the plugin's view is the node's.
        Ok(Some(
            CdiHook::new(path).checked_in(Arc::new(SystemHost::new())),
        ))
    }

    fn configured_hook(&self, path: &Path) -> CdiHook {
        let hook = CdiHook::new(path);
        if self.mock {
            // The mock machine's files are the node for its edits.
            return hook;
        }
        if self.host_root.is_dir() {
            let view: Arc<dyn Host> = Arc::new(SystemHost::rooted(&self.host_root));
            match view.exists(path) {
                Ok(true) => {}
                Ok(false) => tracing::warn!(
                    path = %path.display(),
                    host_root = %self.host_root.display(),
                    "--nvidia-cdi-hook-path does not exist on the node: prepares fail until it does"
                ),
                Err(error) => tracing::warn!(%error, "cannot check --nvidia-cdi-hook-path"),
            }
            return hook.checked_in(view);
        }
        if path.starts_with(&self.install_dir) {
            return hook.checked_in(Arc::new(SystemHost::new()));
        }
        tracing::warn!(
            path = %path.display(),
            host_root = %self.host_root.display(),
            "cannot check --nvidia-cdi-hook-path from inside the container (the node's / is \
             not at --host-root): specs name it as given, and a missing hook shows only when \
             a container starts"
        );
        hook.unchecked()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installs_atomically_and_only_when_changed() {
        let dir = tempfile::tempdir().unwrap();
        let bundled = dir.path().join("bundled");
        std::fs::write(&bundled, b"hook v1").unwrap();
        let plugin_dir = dir.path().join("plugins/gpu.nvidia.com");

        let (path, what) = install(&bundled, &plugin_dir).unwrap();
        assert_eq!(path, plugin_dir.join("nvidia-cdi-hook"));
        assert_eq!(what, Installed::Copied);
        assert_eq!(std::fs::read(&path).unwrap(), b"hook v1");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);

        // Again: nothing to do.
        assert_eq!(
            install(&bundled, &plugin_dir).unwrap().1,
            Installed::Unchanged
        );

        // A non-executable copy, or another version: replaced.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(install(&bundled, &plugin_dir).unwrap().1, Installed::Copied);
        std::fs::write(&bundled, b"hook v2, longer").unwrap();
        assert_eq!(install(&bundled, &plugin_dir).unwrap().1, Installed::Copied);
        assert_eq!(std::fs::read(&path).unwrap(), b"hook v2, longer");
        std::fs::write(&bundled, b"hook v3, longer").unwrap(); // same length, other bytes
        assert_eq!(install(&bundled, &plugin_dir).unwrap().1, Installed::Copied);
        assert_eq!(std::fs::read(&path).unwrap(), b"hook v3, longer");
        // No temporary file left behind.
        let names: Vec<_> = std::fs::read_dir(&plugin_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["nvidia-cdi-hook"]);
    }

    #[test]
    fn a_missing_bundled_binary_is_a_read_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let error = install(&dir.path().join("nope"), dir.path()).unwrap_err();
        assert!(matches!(error, HookInstallError::Read { .. }), "{error:?}");
        assert!(error.to_string().contains("nope"), "{error}");
    }
}
