//! The real host.

use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::chroot::{self, ChrootLauncher};
use super::{CommandOutput, DeviceNode, DeviceNodeKind, Host, HostCommand, HostError, ProcessId};

/// The machine the plugin runs on, with host paths resolved under `root`: `/` for a plugin
/// that sees the host's filesystem, `/host-root` (upstream's `--host-root`) for one in a
/// container with the host's `/` mounted there.
///
/// Nothing here runs a program the plugin's distroless image lacks: tmpfs mounts are system
/// calls, and chrooted commands re-execute the plugin's own binary ([`super::chroot`]).
#[derive(Clone, Debug)]
pub struct SystemHost {
    root: PathBuf,
    chroot_launcher: ChrootLauncher,
}

impl SystemHost {
    /// The host seen at `/`.
    pub fn new() -> Self {
        Self::rooted(PathBuf::from("/"))
    }

    /// The host seen at `root`.
    pub fn rooted(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            chroot_launcher: ChrootLauncher::current_exe(),
        }
    }

    /// The same host, starting chrooted commands with `launcher` instead of this process's
    /// own binary (for a binary whose `main` does not call [`chroot::exec_if_requested`]).
    pub fn with_chroot_launcher(mut self, launcher: ChrootLauncher) -> Self {
        self.chroot_launcher = launcher;
        self
    }
}

impl Default for SystemHost {
    fn default() -> Self {
        Self::new()
    }
}

impl Host for SystemHost {
    fn root(&self) -> &Path {
        &self.root
    }

    fn read_to_string(&self, path: &Path) -> Result<String, HostError> {
        std::fs::read_to_string(self.resolve(path)).map_err(|source| HostError::read(path, source))
    }

    fn write(&self, path: &Path, contents: &[u8]) -> Result<(), HostError> {
        tracing::debug!(path = %path.display(), contents = %String::from_utf8_lossy(contents).trim_end(), "host write");
        // Never create: on the real host a write goes to a file the kernel made (a sysfs
        // attribute); a typo must fail, not leave a new file behind.
        write_in_place(&self.resolve(path), contents, false)
            .map_err(|source| HostError::write(path, contents, source))
    }

    fn exists(&self, path: &Path) -> Result<bool, HostError> {
        self.resolve(path)
            .try_exists()
            .map_err(|source| HostError::read(path, source))
    }

    fn read_dir(&self, path: &Path) -> Result<Vec<String>, HostError> {
        read_dir_names(&self.resolve(path)).map_err(|source| HostError::read(path, source))
    }

    fn read_link(&self, path: &Path) -> Result<PathBuf, HostError> {
        std::fs::read_link(self.resolve(path)).map_err(|source| HostError::read(path, source))
    }

    fn device_node(&self, path: &Path) -> Result<Option<DeviceNode>, HostError> {
        let metadata = match std::fs::metadata(self.resolve(path)) {
            Ok(metadata) => metadata,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(HostError::read(path, source)),
        };
        let kind = if metadata.file_type().is_char_device() {
            DeviceNodeKind::Char
        } else if metadata.file_type().is_block_device() {
            DeviceNodeKind::Block
        } else {
            return Err(HostError::Malformed {
                path: path.to_owned(),
                reason: "not a device node".into(),
            });
        };
        let rdev = metadata.rdev();
        Ok(Some(DeviceNode {
            kind,
            major: rustix::fs::major(rdev),
            minor: rustix::fs::minor(rdev),
        }))
    }

    fn run(&self, command: &HostCommand) -> Result<CommandOutput, HostError> {
        let _span = tracing::debug_span!("host command", command = %command).entered();
        let (program, args) = self.command_line(command);
        let failed = |error: std::io::Error| HostError::Command {
            command: command.to_string(),
            reason: error.to_string(),
        };
        let mut process = Command::new(program);
        process
            .args(args)
            .envs(command.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(if command.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            });
        let mut child = process.spawn().map_err(failed)?;
        if let (Some(input), Some(mut stdin)) = (&command.stdin, child.stdin.take()) {
            use std::io::Write as _;
            stdin.write_all(input.as_bytes()).map_err(failed)?;
            // Dropping it closes the pipe: the command sees the end of its input.
        }
        let output = child.wait_with_output().map_err(failed)?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        if let Some(reason) = chroot::launcher_failure(output.status.code(), &stderr) {
            return Err(HostError::Command {
                command: command.to_string(),
                reason,
            });
        }
        Ok(CommandOutput {
            status: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }

    fn spawn(&self, command: &HostCommand) -> Result<ProcessId, HostError> {
        tracing::info!(command = %command, "starting a daemon");
        let (program, args) = self.command_line(command);
        super::process::spawn_detached(command, &program, &args)
    }

    fn signal(&self, process: &ProcessId, force: bool) -> Result<(), HostError> {
        super::process::signal(process, force)
    }

    fn mount_tmpfs(&self, target: &Path, size: &str) -> Result<(), HostError> {
        use rustix::mount::{MountFlags, mount};
        tracing::debug!(target = %target.display(), size, "mounting a tmpfs");
        let failed = |source: std::io::Error| HostError::Mount {
            operation: "mounting a tmpfs on",
            path: target.to_owned(),
            source,
        };
        let data = std::ffi::CString::new(format!("size={size}")).map_err(|_| {
            failed(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("the size {size:?} holds a NUL byte"),
            ))
        })?;
        let flags = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
        mount("tmpfs", target, "tmpfs", flags, data.as_c_str())
            .map_err(|errno| failed(errno.into()))
    }

    fn unmount(&self, target: &Path) -> Result<bool, HostError> {
        use rustix::io::Errno;
        use rustix::mount::{UnmountFlags, unmount};
        match unmount(target, UnmountFlags::empty()) {
            Ok(()) => Ok(true),
            // EINVAL: not a mount point; ENOENT: the directory is gone.
            Err(Errno::INVAL | Errno::NOENT) => Ok(false),
            Err(errno) => Err(HostError::Mount {
                operation: "unmounting",
                path: target.to_owned(),
                source: errno.into(),
            }),
        }
    }
}

impl SystemHost {
    /// The program and arguments that run `command`: chrooted into the host root when asked
    /// and the root is not `/`.
    fn command_line(&self, command: &HostCommand) -> (String, Vec<String>) {
        if command.chroot && self.root != Path::new("/") {
            self.chroot_launcher
                .command_line(&self.root, &command.program, &command.args)
        } else {
            (command.program.clone(), command.args.clone())
        }
    }
}

/// One `write(2)` into an existing file (or a new one with `create`), without a
/// create-and-rename: how sysfs attributes must be written.
pub(super) fn write_in_place(path: &Path, contents: &[u8], create: bool) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(create)
        .truncate(true)
        .open(path)?;
    file.write_all(contents)
}

pub(super) fn read_dir_names(path: &Path) -> std::io::Result<Vec<String>> {
    let mut names = std::fs::read_dir(path)?
        .map(|entry| entry.map(|entry| entry.file_name().to_string_lossy().into_owned()))
        .collect::<Result<Vec<_>, _>>()?;
    names.sort();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_under_its_root() {
        let dir = tempfile::tempdir().unwrap();
        let host = SystemHost::rooted(dir.path());
        std::fs::create_dir_all(dir.path().join("sys/x")).unwrap();
        // Only existing files are written, as in sysfs.
        let missing = host.write(Path::new("/sys/x/a"), b"1\n").unwrap_err();
        assert!(missing.is_not_found(), "{missing}");
        assert!(!dir.path().join("sys/x/a").exists());
        std::fs::write(dir.path().join("sys/x/a"), "0\n").unwrap();
        host.write(Path::new("/sys/x/a"), b"1\n").unwrap();
        assert_eq!(host.read_to_string(Path::new("/sys/x/a")).unwrap(), "1\n");
        assert_eq!(host.read_dir(Path::new("/sys/x")).unwrap(), vec!["a"]);
        assert!(host.exists(Path::new("/sys/x/a")).unwrap());
        assert!(!host.exists(Path::new("/sys/x/b")).unwrap());
        let error = host.read_to_string(Path::new("/sys/x/b")).unwrap_err();
        assert!(error.is_not_found());
        assert!(error.to_string().contains("/sys/x/b"), "{error}");
    }

    #[test]
    fn device_nodes_are_recognized() {
        let host = SystemHost::new();
        let null = host.device_node(Path::new("/dev/null")).unwrap().unwrap();
        assert_eq!(
            (null.kind, null.major, null.minor),
            (DeviceNodeKind::Char, 1, 3)
        );
        assert_eq!(
            host.device_node(Path::new("/dev/no-such-node")).unwrap(),
            None
        );
    }

    #[test]
    fn commands_run_and_report_their_status() {
        let host = SystemHost::new();
        let output = host
            .run(&HostCommand::new("sh", ["-c", "echo hi; exit 3"]))
            .unwrap();
        assert_eq!(output.status, Some(3));
        assert_eq!(output.stdout, "hi\n");
        let output = host
            .run(
                &HostCommand::new("sh", ["-c", "read line; echo \"$GREETING $line\""])
                    .env("GREETING", "hello")
                    .stdin("world\n"),
            )
            .unwrap();
        assert_eq!(output.stdout, "hello world\n");
        let error = host.run(&HostCommand::new("/no/such/program", Vec::<String>::new()));
        assert!(error.unwrap_err().to_string().contains("/no/such/program"));
    }
}
