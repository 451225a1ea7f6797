//! Running a host program with the host's root as `/`, without a `chroot` program.
//!
//! The plugin's image is distroless: no shell, no `chroot`, no `mount`. A command marked
//! [`HostCommand::chrooted`](super::HostCommand::chrooted) (`modprobe`, which must load the
//! host's kernel modules with the host's `modprobe.d`) is run by re-executing the plugin's own
//! binary (`/proc/self/exe`, so a binary replaced on disk by an upgrade does not matter) with
//! the hidden first argument [`SUBCOMMAND`], the host root, the program and its arguments.
//! That short-lived process:
//!
//! 1. checks that the root is an absolute path to a directory;
//! 2. `chroot(2)`s into it and `chdir(2)`s to the new `/`, so that no working directory is
//!    left outside the new root;
//! 3. `execve(2)`s the program, looked up through `PATH` inside the new root (the host's own
//!    `/usr/sbin/modprobe`, never one from the image), with the environment it was given.
//!
//! A failure before the program starts ends the process with status 127 (not found) or 126
//! (anything else) and one line on standard error starting with [`SUBCOMMAND`];
//! [`SystemHost::run`](super::SystemHost) turns that into
//! [`HostError::Command`](super::HostError::Command), as a program that could not be spawned
//! without a chroot is. Re-executing rather than chrooting in the forked child keeps the
//! crate free of `unsafe` (`pre_exec` is an unsafe hook).
//!
//! A binary that runs chrooted commands through [`SystemHost`](super::SystemHost) calls
//! [`exec_if_requested`] first thing in `main` (`gpu-kubelet-plugin` does), or names another
//! binary that does with [`SystemHost::with_chroot_launcher`](super::SystemHost::with_chroot_launcher).

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The hidden first argument that makes the plugin's binary a chroot launcher.
pub const SUBCOMMAND: &str = "__host-exec";

/// Exit status of a launcher whose program was not found in the new root (as a shell's).
pub const EXIT_NOT_FOUND: i32 = 127;
/// Exit status of a launcher that failed otherwise before the program started.
pub const EXIT_CANNOT_RUN: i32 = 126;

/// How a chrooted command is started: a binary that dispatches [`SUBCOMMAND`] through
/// [`exec_if_requested`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChrootLauncher {
    binary: PathBuf,
}

impl ChrootLauncher {
    /// This process's own binary, re-executed.
    pub fn current_exe() -> Self {
        Self::binary("/proc/self/exe")
    }

    /// Another binary whose `main` calls [`exec_if_requested`] (tests use the built plugin).
    pub fn binary(binary: impl Into<PathBuf>) -> Self {
        Self {
            binary: binary.into(),
        }
    }

    /// The program and arguments that run `program args…` with `root` as `/`.
    pub(super) fn command_line(
        &self,
        root: &Path,
        program: &str,
        args: &[String],
    ) -> (String, Vec<String>) {
        let mut line = vec![
            SUBCOMMAND.to_owned(),
            root.to_string_lossy().into_owned(),
            program.to_owned(),
        ];
        line.extend(args.iter().cloned());
        (self.binary.to_string_lossy().into_owned(), line)
    }
}

impl Default for ChrootLauncher {
    fn default() -> Self {
        Self::current_exe()
    }
}

/// Why a launcher could not start its program.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChrootError {
    /// Not `<root> <program> [args…]`.
    #[error("expected `{SUBCOMMAND} <root> <program> [args…]`")]
    Usage,
    /// The root is not an absolute path to a directory.
    #[error("the root {root} is not an absolute path to a directory")]
    BadRoot {
        /// The root given.
        root: PathBuf,
    },
    /// `chroot(2)` or `chdir(2)` failed (`EPERM` without `CAP_SYS_CHROOT`).
    #[error("changing the root to {root}: {source}")]
    Chroot {
        /// The root given.
        root: PathBuf,
        /// The error the kernel returned.
        source: std::io::Error,
    },
    /// `execve(2)` failed: the program is not in the new root, or cannot run.
    #[error("running {program} in {root}: {source}")]
    Exec {
        /// The program, as given.
        program: String,
        /// The root it was looked up in.
        root: PathBuf,
        /// The error the kernel returned.
        source: std::io::Error,
    },
}

impl ChrootError {
    /// The launcher's exit status for this failure.
    pub fn exit_status(&self) -> i32 {
        match self {
            Self::Exec { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                EXIT_NOT_FOUND
            }
            _ => EXIT_CANNOT_RUN,
        }
    }
}

/// When this process was started as a chroot launcher (its first argument is
/// [`SUBCOMMAND`]), chroots and execs the program it names, and never returns: on failure it
/// prints the reason on standard error and exits with [`ChrootError::exit_status`].
/// Otherwise it returns at once. Call it before parsing flags or starting threads.
pub fn exec_if_requested() {
    let mut args = std::env::args_os();
    if args.nth(1).as_deref() != Some(OsStr::new(SUBCOMMAND)) {
        return;
    }
    let rest: Vec<OsString> = args.collect();
    let error = exec_chrooted(&rest);
    eprintln!("{SUBCOMMAND}: {error}");
    std::process::exit(error.exit_status());
}

/// Chroots into `args[0]` and execs `args[1]` with `args[2..]`. Returns only on failure.
fn exec_chrooted(args: &[OsString]) -> ChrootError {
    let [root, program, rest @ ..] = args else {
        return ChrootError::Usage;
    };
    let root = PathBuf::from(root);
    if !root.is_absolute() || !root.is_dir() {
        return ChrootError::BadRoot { root };
    }
    let chroot = rustix::process::chroot(&root).and_then(|()| rustix::process::chdir("/"));
    if let Err(errno) = chroot {
        return ChrootError::Chroot {
            root,
            source: errno.into(),
        };
    }
    // `exec` returns only when execve failed; on success this process is the program.
    let source = Command::new(program).args(rest).exec();
    ChrootError::Exec {
        program: program.to_string_lossy().into_owned(),
        root,
        source,
    }
}

/// Whether a launcher's output says it failed before its program started; the reason if so.
pub(super) fn launcher_failure(status: Option<i32>, stderr: &str) -> Option<String> {
    let failed = matches!(status, Some(EXIT_NOT_FOUND | EXIT_CANNOT_RUN));
    let reason = stderr.trim().strip_prefix(SUBCOMMAND)?.strip_prefix(": ")?;
    failed.then(|| reason.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_names_root_program_and_arguments() {
        let launcher = ChrootLauncher::current_exe();
        let (program, args) =
            launcher.command_line(Path::new("/host-root"), "modprobe", &["vfio-pci".into()]);
        assert_eq!(program, "/proc/self/exe");
        assert_eq!(args, [SUBCOMMAND, "/host-root", "modprobe", "vfio-pci"]);
    }

    #[test]
    fn bad_arguments_and_roots_are_refused_before_any_system_call() {
        assert!(matches!(exec_chrooted(&[]), ChrootError::Usage));
        let relative = exec_chrooted(&["host-root".into(), "modprobe".into()]);
        assert!(
            matches!(relative, ChrootError::BadRoot { .. }),
            "{relative}"
        );
        let missing = exec_chrooted(&["/no/such/root".into(), "modprobe".into()]);
        assert_eq!(
            missing.to_string(),
            "the root /no/such/root is not an absolute path to a directory"
        );
        assert_eq!(missing.exit_status(), EXIT_CANNOT_RUN);
    }

    #[test]
    fn only_the_launchers_own_failures_are_recognized() {
        assert_eq!(
            launcher_failure(
                Some(127),
                "__host-exec: running modprobe in /r: not found\n"
            ),
            Some("running modprobe in /r: not found".to_owned())
        );
        // The program ran and failed on its own.
        assert_eq!(launcher_failure(Some(1), "__host-exec: x"), None);
        assert_eq!(
            launcher_failure(Some(127), "modprobe: FATAL: Module x not found"),
            None
        );
    }
}
