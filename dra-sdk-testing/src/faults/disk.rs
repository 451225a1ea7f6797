//! Disk faults under a plugin's directories, hit through the real system calls: a full file
//! system (`ENOSPC`), a read-only one (`EROFS`), and a directory where the plugin expects a
//! file (`EISDIR`).
//!
//! # Why a private mount namespace
//!
//! A full or read-only file system needs a mount: a size-limited `tmpfs`, or a read-only bind
//! mount of the directory over itself (as root, `chmod` does not stop a write, so only a
//! read-only mount makes the kernel answer `EROFS`). Mounting in the test's own namespace would
//! leak into the machine, and entering a new namespace (`unshare(2)`) needs a single-threaded
//! process, which a test binary is not, and `unsafe` code (`pre_exec`) to do it between `fork`
//! and `exec`. So [`in_mount_namespace`] re-executes the test binary under the `unshare`
//! command (`unshare --user --map-root-user --mount`, or `unshare --mount` as root where user
//! namespaces are off) with only the calling test selected; that child runs the whole scenario
//! in-process inside its private mount namespace, where its mounts vanish with it. The parent
//! only waits, forwards the child's output and reports its exit status.
//!
//! Where neither variant works (no `unshare` binary, no user namespaces and not root), the
//! scenario is skipped with a message on the real standard error (not the captured one), or
//! fails when [`REQUIRE_ENV`] is `1` (set it in CI): a machine that cannot run these tests
//! should not fail a developer's `cargo test`, but CI must never pass them by skipping.
//!
//! # Example
//!
//! ```no_run
//! use dra_sdk_testing::faults::disk;
//!
//! // The body of a #[test] function (its thread's name selects the test to re-execute):
//! disk::in_mount_namespace(|mounts| {
//!     let dir = tempfile::tempdir().unwrap();
//!     let tmpfs = mounts.tmpfs(dir.path(), 64 * 1024).unwrap();
//!     let filler = disk::fill(dir.path()).unwrap();
//!     let err = std::fs::write(dir.path().join("spec.json"), b"{}").unwrap_err();
//!     assert_eq!(err.raw_os_error(), Some(28)); // ENOSPC
//!     filler.release().unwrap();
//!     std::fs::write(dir.path().join("spec.json"), b"{}").unwrap();
//!     tmpfs.unmount().unwrap();
//! })
//! .unwrap();
//! ```

use std::ffi::{CString, OsString};
use std::fs::{self, OpenOptions};
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use rustix::fs::StatVfsMountFlags;
use rustix::mount::{MountFlags, UnmountFlags};

/// Set in the re-executed test process to the parent's mount namespace (`mnt:[…]`): it marks
/// the child, and lets the child check that it really has a namespace of its own before it
/// mounts anything.
pub const CHILD_ENV: &str = "DRA_SDK_TESTING_DISK_FAULTS_CHILD";

/// Set to `1` to make a machine without private mount namespaces fail the scenarios instead of
/// skipping them.
pub const REQUIRE_ENV: &str = "DRA_SDK_TESTING_REQUIRE_MOUNT_NAMESPACE";

/// Name of the file [`fill`] writes.
pub const FILLER_FILE: &str = ".disk-fault-filler";

/// The `unshare` invocations tried, in order: an unprivileged user namespace first (works for
/// any user where the kernel allows it), then a plain mount namespace (root only).
const VARIANTS: [&[&str]; 2] = [&["--user", "--map-root-user", "--mount"], &["--mount"]];

/// Errors of the disk fault layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DiskFaultError {
    /// A file system operation of the fault layer itself failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The error of the system call.
        source: io::Error,
    },
    /// [`in_mount_namespace`] was not called from a test's own thread, so the test to
    /// re-execute is unknown.
    #[error(
        "cannot tell which test to re-execute: the current thread is {0:?}, not a test's thread \
         (call in_mount_namespace directly from a #[test] function)"
    )]
    NoTestName(Option<String>),
    /// Neither `unshare` variant works here and [`REQUIRE_ENV`] asks for a failure.
    #[error(
        "no private mount namespace on this machine ({0}); these tests need the `unshare` \
         command and either unprivileged user namespaces or root"
    )]
    NoMountNamespace(String),
    /// The child process runs in the parent's mount namespace: mounting there would change
    /// the machine, so nothing was mounted.
    #[error("the re-executed test shares the mount namespace {0}; refusing to mount anything")]
    NotIsolated(String),
}

/// How a scenario given to [`in_mount_namespace`] went.
#[derive(Debug)]
#[non_exhaustive]
pub enum Outcome {
    /// This process is the re-executed child and the scenario returned (a failing scenario
    /// panics, as any test does).
    RanHere,
    /// The child ran the scenario and passed.
    Passed {
        /// The `unshare` arguments used.
        unshare: String,
    },
    /// The child failed; its output was forwarded to this test's (captured) output. Only
    /// returned by [`run_in_mount_namespace`]; [`in_mount_namespace`] panics instead.
    Failed,
    /// The scenario did not run: no private mount namespace here. Also written to the
    /// process's real standard error.
    Skipped {
        /// Why.
        reason: String,
    },
}

/// Runs `scenario` in a private mount namespace, in a re-executed copy of the test binary (see
/// the [module documentation](self)), and panics with the child's exit status if it failed.
/// Call it directly from a `#[test]` function: the test's thread name selects the test to
/// re-execute.
pub fn in_mount_namespace(
    scenario: impl FnOnce(&MountNamespace),
) -> Result<Outcome, DiskFaultError> {
    let outcome = run_in_mount_namespace(scenario)?;
    if matches!(outcome, Outcome::Failed) {
        // The test's verdict: the child's output above says why.
        panic!("the scenario failed in its mount namespace (its output is above)");
    }
    Ok(outcome)
}

/// [`in_mount_namespace`] returning [`Outcome::Failed`] instead of panicking when the child
/// fails: for a test of a scenario that must fail.
pub fn run_in_mount_namespace(
    scenario: impl FnOnce(&MountNamespace),
) -> Result<Outcome, DiskFaultError> {
    if let Some(parent_namespace) = std::env::var_os(CHILD_ENV) {
        let own = mount_namespace()?;
        if own == parent_namespace {
            return Err(DiskFaultError::NotIsolated(
                own.to_string_lossy().into_owned(),
            ));
        }
        scenario(&MountNamespace { _private: () });
        return Ok(Outcome::RanHere);
    }

    let thread = std::thread::current();
    let test = match thread.name() {
        Some(name) if name != "main" => name.to_owned(),
        other => return Err(DiskFaultError::NoTestName(other.map(str::to_owned))),
    };
    let Some(variant) = VARIANTS.iter().find(|variant| unshare_works(variant)) else {
        let reason = "neither `unshare --user --map-root-user --mount true` nor `unshare --mount true` succeeded".to_owned();
        if std::env::var(REQUIRE_ENV).is_ok_and(|value| value == "1") {
            return Err(DiskFaultError::NoMountNamespace(reason));
        }
        // Past the test harness's capture: a skipped test must be seen even when it "passes".
        let _ = writeln!(
            io::stderr(),
            "SKIPPED {test}: no private mount namespace ({reason}); set {REQUIRE_ENV}=1 to fail instead"
        );
        return Ok(Outcome::Skipped { reason });
    };

    let exe = std::env::current_exe().map_err(|source| DiskFaultError::Io {
        op: "find the test binary",
        path: PathBuf::from("/proc/self/exe"),
        source,
    })?;
    let output = Command::new("unshare")
        .args(*variant)
        .arg("--")
        .arg(&exe)
        .args(["--exact", &test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, mount_namespace()?)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| DiskFaultError::Io {
            op: "run the test under unshare",
            path: exe.clone(),
            source,
        })?;
    // Into the harness's capture: shown with the test's own output when it fails.
    print!("{}", String::from_utf8_lossy(&output.stdout));
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    let unshare = variant.join(" ");
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        println!("`unshare {unshare} {test}` failed: {}", output.status);
        return Ok(Outcome::Failed);
    }
    // A filter that matched nothing also exits with success.
    if !stdout.contains("1 passed") {
        println!("`unshare {unshare}` ran no test named {test:?}");
        return Ok(Outcome::Failed);
    }
    Ok(Outcome::Passed { unshare })
}

fn unshare_works(variant: &[&str]) -> bool {
    Command::new("unshare")
        .args(variant)
        .arg("true")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .as_ref()
        .is_ok_and(ExitStatus::success)
}

fn mount_namespace() -> Result<OsString, DiskFaultError> {
    let path = Path::new("/proc/self/ns/mnt");
    fs::read_link(path)
        .map(PathBuf::into_os_string)
        .map_err(|source| DiskFaultError::Io {
            op: "read the mount namespace",
            path: path.to_owned(),
            source,
        })
}

/// Proof that this process runs in a mount namespace of its own: only
/// [`in_mount_namespace`] hands one out, so the mounts below never touch the machine. (It is
/// `Copy` so that an async scenario can move it into its future.)
#[derive(Debug, Clone, Copy)]
pub struct MountNamespace {
    _private: (),
}

impl MountNamespace {
    /// Mounts a `tmpfs` of `size_bytes` (rounded up to pages by the kernel) on `dir`, creating
    /// `dir` if needed: what [`fill`] then fills. Unmounted when the returned [`Mount`] is
    /// dropped.
    pub fn tmpfs(&self, dir: &Path, size_bytes: u64) -> Result<Mount, DiskFaultError> {
        fs::create_dir_all(dir).map_err(io_error("create the mount point", dir))?;
        let options = CString::new(format!("size={size_bytes},mode=0755"))
            .map_err(|err| io_error("mount tmpfs on", dir)(io::Error::other(err)))?;
        rustix::mount::mount(
            "tmpfs",
            dir,
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV,
            Some(options.as_c_str()),
        )
        .map_err(|errno| io_error("mount tmpfs on", dir)(errno.into()))?;
        Ok(Mount {
            target: dir.to_owned(),
        })
    }

    /// Makes `dir` read-only: bind-mounts it over itself and remounts that bind read-only.
    /// Writes through the path then fail with `EROFS`, while files the plugin already holds
    /// open (its lock files) keep working, as on a node whose file system was remounted under
    /// a running plugin. (Remounting the file system itself read-only would fail with `EBUSY`
    /// while any file on it is open for writing.) [`Mount::unmount`] clears the fault.
    pub fn read_only(&self, dir: &Path) -> Result<Mount, DiskFaultError> {
        rustix::mount::mount_bind(dir, dir)
            .map_err(|errno| io_error("bind-mount", dir)(errno.into()))?;
        let mount = Mount {
            target: dir.to_owned(),
        };
        // In a user namespace the flags of the mount the bind came from are locked: keep them.
        let inherited = rustix::fs::statvfs(dir)
            .map_err(|errno| io_error("statvfs", dir)(errno.into()))?
            .f_flag;
        let mut flags = MountFlags::BIND | MountFlags::RDONLY;
        for (has, keep) in [
            (StatVfsMountFlags::NOSUID, MountFlags::NOSUID),
            (StatVfsMountFlags::NODEV, MountFlags::NODEV),
            (StatVfsMountFlags::NOEXEC, MountFlags::NOEXEC),
        ] {
            if inherited.contains(has) {
                flags |= keep;
            }
        }
        rustix::mount::mount_remount(dir, flags, "")
            .map_err(|errno| io_error("remount read-only", dir)(errno.into()))?;
        Ok(mount)
    }
}

/// A mount made by [`MountNamespace`]; dropping it unmounts it (lazily, ignoring errors), as
/// the namespace's end would.
#[derive(Debug)]
pub struct Mount {
    target: PathBuf,
}

impl Mount {
    /// Where it is mounted.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Unmounts it now (lazily: a file still open on it keeps its file system alive, but new
    /// lookups of the path no longer see it).
    pub fn unmount(self) -> Result<(), DiskFaultError> {
        let result = rustix::mount::unmount(&self.target, UnmountFlags::DETACH)
            .map_err(|errno| io_error("unmount", &self.target)(errno.into()));
        std::mem::forget(self);
        result
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.target, UnmountFlags::DETACH);
    }
}

/// Fills the file system holding `dir` with a file [`FILLER_FILE`] in it until the kernel
/// answers `ENOSPC`, and checks that a new file cannot get a byte either. Meant for a small
/// [`MountNamespace::tmpfs`]: on a real disk it would take the disk's whole free space.
/// [`Filler::release`] (or dropping it) frees the space.
pub fn fill(dir: &Path) -> Result<Filler, DiskFaultError> {
    let path = dir.join(FILLER_FILE);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(io_error("create", &path))?;
    let filler = Filler { path };
    let chunk = vec![0u8; 64 * 1024];
    // Big chunks first, then single bytes for the partly filled last page.
    for size in [chunk.len(), 1] {
        loop {
            match file.write(&chunk[..size]) {
                Ok(0) => break,
                Ok(_) => {}
                Err(err) if is_enospc(&err) => break,
                Err(err) => return Err(io_error("fill", &filler.path)(err)),
            }
        }
    }
    // The proof the fault is real: a new file cannot be written.
    let probe = dir.join(".disk-fault-probe");
    let written = fs::write(&probe, b"x");
    let _ = fs::remove_file(&probe);
    match written {
        Err(err) if is_enospc(&err) => Ok(filler),
        Err(err) => Err(io_error("probe the filled file system at", dir)(err)),
        Ok(()) => Err(io_error("fill", dir)(io::Error::other(
            "a new file could still be written after the filler hit ENOSPC",
        ))),
    }
}

fn is_enospc(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::StorageFull
}

/// The file that fills a file system; see [`fill`].
#[derive(Debug)]
pub struct Filler {
    path: PathBuf,
}

impl Filler {
    /// The filler file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Deletes the filler: the fault clears.
    pub fn release(self) -> Result<(), DiskFaultError> {
        let result = fs::remove_file(&self.path).map_err(io_error("remove", &self.path));
        std::mem::forget(self);
        result
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Replaces the file at `path` (if any) with a non-empty directory, as a confused operator or
/// a bad volume mount does: opening it for reading works but reading fails with `EISDIR`,
/// renaming a file over it fails with `EISDIR`, deleting it as a file fails with `EISDIR`.
/// The original contents are kept in the returned guard; [`DirectoryInPlace::clear`] removes
/// the directory (it does not put the file back).
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("checkpoint.json");
/// std::fs::write(&path, b"{}")?;
/// let fault = dra_sdk_testing::faults::disk::replace_with_directory(&path)?;
/// assert_eq!(fault.original(), Some(&b"{}"[..]));
/// assert_eq!(std::fs::read(&path).unwrap_err().raw_os_error(), Some(21)); // EISDIR
/// fault.clear()?;
/// # Ok(())
/// # }
/// ```
pub fn replace_with_directory(path: &Path) -> Result<DirectoryInPlace, DiskFaultError> {
    let original = match fs::read(path) {
        Ok(bytes) => {
            fs::remove_file(path).map_err(io_error("remove", path))?;
            Some(bytes)
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => None,
        Err(err) => return Err(io_error("read", path)(err)),
    };
    fs::create_dir(path).map_err(io_error("create a directory at", path))?;
    // Not empty, so that neither rmdir nor a rename of a directory over it removes it.
    let inside = path.join("occupied");
    fs::write(&inside, b"").map_err(io_error("create", &inside))?;
    Ok(DirectoryInPlace {
        path: path.to_owned(),
        original,
    })
}

/// A directory put where a file was; see [`replace_with_directory`].
#[derive(Debug)]
pub struct DirectoryInPlace {
    path: PathBuf,
    original: Option<Vec<u8>>,
}

impl DirectoryInPlace {
    /// What the file held before it was replaced (`None`: there was no file).
    pub fn original(&self) -> Option<&[u8]> {
        self.original.as_deref()
    }

    /// Removes the directory, leaving nothing at the path: the fault clears.
    pub fn clear(self) -> Result<(), DiskFaultError> {
        fs::remove_dir_all(&self.path).map_err(io_error("remove the directory", &self.path))
    }
}

/// Whether any file in `dir` looks like a temporary file of an interrupted write (`.tmp`
/// suffix or `.tmp-` in the name, the SDK's CDI and checkpoint writers' conventions). Returns
/// their names, sorted.
pub fn temporary_files(dir: &Path) -> Result<Vec<String>, DiskFaultError> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_error("list", dir))? {
        let entry = entry.map_err(io_error("list", dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".tmp") || name.contains(".tmp-") {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

fn io_error<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> DiskFaultError + 'a {
    move |source| DiskFaultError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_in_place_of_a_file_answers_eisdir_and_clears() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.json");
        fs::write(&path, b"old").unwrap();
        let fault = replace_with_directory(&path).unwrap();
        assert_eq!(fault.original(), Some(&b"old"[..]));
        assert_eq!(fs::read(&path).unwrap_err().raw_os_error(), Some(21));
        assert_eq!(fs::remove_file(&path).unwrap_err().raw_os_error(), Some(21));
        let temp = dir.path().join("x");
        fs::write(&temp, b"new").unwrap();
        assert_eq!(
            fs::rename(&temp, &path).unwrap_err().raw_os_error(),
            Some(21)
        );
        fault.clear().unwrap();
        assert!(!path.exists());
    }

    #[test]
    fn temporary_files_are_found_by_name() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "a.json",
            ".k8s.x=y_uid.0123.tmp",
            ".checkpoint.json.tmp-ab",
            "checkpoint.json",
        ] {
            fs::write(dir.path().join(name), b"").unwrap();
        }
        assert_eq!(
            temporary_files(dir.path()).unwrap(),
            [".checkpoint.json.tmp-ab", ".k8s.x=y_uid.0123.tmp"]
        );
    }

    #[test]
    fn outside_a_test_thread_the_test_name_is_unknown() {
        let err = std::thread::Builder::new()
            .spawn(|| run_in_mount_namespace(|_| {}).map(|_| ()))
            .unwrap()
            .join()
            .unwrap()
            .unwrap_err();
        assert!(matches!(err, DiskFaultError::NoTestName(None)), "{err}");
    }
}
