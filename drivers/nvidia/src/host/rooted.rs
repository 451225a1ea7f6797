//! A host in a directory, for tests and for the mock plugin.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::system::{read_dir_names, write_in_place};
use super::{CommandOutput, DeviceNode, DeviceNodeKind, Host, HostCommand, HostError, ProcessId};

/// What a [`RootedHost`] was asked to do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostEvent {
    /// A file write (host path, contents as UTF-8, lossy).
    Write {
        /// Host path.
        path: PathBuf,
        /// What was written.
        contents: String,
    },
    /// A command run.
    Command(HostCommand),
    /// A long-running process started ([`Host::spawn`]), as the driver asked for it (the
    /// stand-in that actually ran is not recorded).
    Spawn(HostCommand),
    /// A signal sent to a process ([`Host::signal`]): its pid, and whether it was SIGKILL.
    Signal {
        /// The process.
        pid: u32,
        /// SIGKILL rather than SIGTERM.
        force: bool,
    },
    /// A tmpfs mounted ([`Host::mount_tmpfs`]).
    MountTmpfs {
        /// The mount point (a plugin path).
        target: PathBuf,
        /// Its size, as given.
        size: String,
    },
    /// An unmount ([`Host::unmount`]), whether or not something was mounted there.
    Unmount {
        /// The mount point (a plugin path).
        target: PathBuf,
    },
}

impl HostEvent {
    /// A write event, for comparisons in tests.
    pub fn write(path: impl Into<PathBuf>, contents: impl Into<String>) -> Self {
        Self::Write {
            path: path.into(),
            contents: contents.into(),
        }
    }
}

#[derive(Debug)]
struct Script {
    program: String,
    args: Option<Vec<String>>,
    outputs: VecDeque<CommandOutput>,
}

/// An answer computed when the command runs (see [`RootedHost::answer_with`]).
type Answer = std::sync::Arc<dyn Fn(&HostCommand) -> CommandOutput + Send + Sync>;

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("events", &self.events)
            .field("scripts", &self.scripts)
            .field("answers", &self.answers.len())
            .field("stand_ins", &self.stand_ins)
            .finish()
    }
}

#[derive(Default)]
struct State {
    events: Vec<HostEvent>,
    scripts: Vec<Script>,
    /// Program → an answer computed at each run; wins over scripts.
    answers: Vec<(String, Answer)>,
    /// Program → the command that really runs when the driver spawns it.
    stand_ins: Vec<(String, HostCommand)>,
    /// Where tmpfs is mounted now (only recorded: mounting needs privileges).
    mounts: std::collections::BTreeSet<PathBuf>,
}

/// A host whose filesystem is a directory (a temporary one in tests). Clones share state.
///
/// * Reads, `exists`, `read_dir` and `read_link` go to the directory.
/// * Writes go to the directory too, and are recorded ([`RootedHost::events`]).
/// * Device nodes are regular files holding `c <major>:<minor>` (or `b …`), since creating
///   real ones needs privileges; real device nodes are recognized as well.
/// * sysfs `bind`/`unbind` behave like the kernel's: writing a bus ID to
///   `/sys/bus/pci/drivers/<drv>/unbind` removes the device's `driver` link (ENODEV when
///   the device is not bound to `<drv>`), and writing it to `…/<drv>/bind` creates it
///   (EBUSY when bound, ENODEV when `driver_override` names another driver). Writing an
///   empty line to `driver_override` clears it (reads back `(null)`).
/// * Commands are answered from a script ([`RootedHost::script`]); an unscripted command is
///   an error.
/// * Long-running processes ([`Host::spawn`]) are real processes: a stand-in registered with
///   [`RootedHost::stand_in`] (a `sleep`, a small shell script) runs instead of the program,
///   with the requested command's environment, so that tests can check what a restarted
///   plugin finds. Signals are real too, and recorded.
/// * tmpfs mounts are recorded, not made (that needs privileges): [`RootedHost::mounted`]
///   tells what is mounted; the mount point must exist, as for `mount(2)`.
#[derive(Clone, Debug)]
pub struct RootedHost {
    root: PathBuf,
    state: Arc<Mutex<State>>,
}

impl RootedHost {
    /// A host rooted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            state: Arc::default(),
        }
    }

    /// Answers runs of `program` (any arguments) with `outputs`, in order; the last one
    /// repeats. Later scripts take precedence over earlier ones.
    pub fn script(&self, program: &str, outputs: impl IntoIterator<Item = CommandOutput>) {
        self.add_script(program, None, outputs);
    }

    /// Answers runs of exactly `program args…` with `outputs`, in order; the last one repeats.
    pub fn script_exact(
        &self,
        command: &HostCommand,
        outputs: impl IntoIterator<Item = CommandOutput>,
    ) {
        self.add_script(&command.program, Some(command.args.clone()), outputs);
    }

    fn add_script(
        &self,
        program: &str,
        args: Option<Vec<String>>,
        outputs: impl IntoIterator<Item = CommandOutput>,
    ) {
        self.state().scripts.push(Script {
            program: program.to_owned(),
            args,
            outputs: outputs.into_iter().collect(),
        });
    }

    /// Answers every run of `program` with what `answer` computes then: for a command whose
    /// answer depends on the moment (whether this very process holds a file). Wins over
    /// [`RootedHost::script`]; later answers win over earlier ones.
    pub fn answer_with(
        &self,
        program: &str,
        answer: impl Fn(&HostCommand) -> CommandOutput + Send + Sync + 'static,
    ) {
        self.state()
            .answers
            .push((program.to_owned(), std::sync::Arc::new(answer)));
    }

    /// Runs `stand_in` (with the environment the driver sets) whenever the driver spawns
    /// `program`. Later stand-ins take precedence.
    pub fn stand_in(&self, program: &str, stand_in: HostCommand) {
        self.state().stand_ins.push((program.to_owned(), stand_in));
    }

    /// Everything written and run so far.
    pub fn events(&self) -> Vec<HostEvent> {
        self.state().events.clone()
    }

    /// The mount points of the tmpfs mounted now.
    pub fn mounted(&self) -> Vec<PathBuf> {
        self.state().mounts.iter().cloned().collect()
    }

    /// Forgets the recorded events.
    pub fn clear_events(&self) {
        self.state().events.clear();
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep going with it.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Creates a device node stand-in at a host path (parents included).
    pub fn create_device_node(&self, path: &Path, node: DeviceNode) -> std::io::Result<()> {
        let resolved = self.resolve(path);
        if let Some(parent) = resolved.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(
            resolved,
            format!("{} {}:{}\n", node.kind.as_str(), node.major, node.minor),
        )
    }

    /// The kernel's side of a write to a sysfs PCI driver attribute.
    fn simulate_sysfs(&self, path: &Path, contents: &[u8]) -> Result<bool, HostError> {
        let Ok(rest) = path.strip_prefix("/sys/bus/pci/drivers") else {
            return Ok(false);
        };
        let mut parts = rest.iter().filter_map(|part| part.to_str());
        let (Some(driver), Some(action), None) = (parts.next(), parts.next(), parts.next()) else {
            return Ok(false);
        };
        if action != "bind" && action != "unbind" {
            return Ok(false);
        }
        let errno =
            |code: i32| HostError::write(path, contents, std::io::Error::from_raw_os_error(code));
        const ENODEV: i32 = 19;
        const EBUSY: i32 = 16;
        let bus_id = String::from_utf8_lossy(contents).trim().to_owned();
        let device_dir = Path::new("/sys/bus/pci/devices").join(&bus_id);
        if !self.resolve(&device_dir).exists() || !self.resolve(&path.with_file_name("")).exists() {
            return Err(errno(ENODEV));
        }
        let driver_link = self.resolve(&device_dir.join("driver"));
        let bound = std::fs::read_link(&driver_link).ok().and_then(|link| {
            link.file_name()
                .map(|name| name.to_string_lossy().into_owned())
        });
        if action == "unbind" {
            if bound.as_deref() != Some(driver) {
                return Err(errno(ENODEV));
            }
            std::fs::remove_file(&driver_link)
                .map_err(|source| HostError::write(path, contents, source))?;
            return Ok(true);
        }
        if bound.is_some() {
            return Err(errno(EBUSY));
        }
        let driver_override =
            std::fs::read_to_string(self.resolve(&device_dir.join("driver_override")))
                .unwrap_or_default();
        let driver_override = driver_override.trim();
        if !driver_override.is_empty() && driver_override != "(null)" && driver_override != driver {
            return Err(errno(ENODEV));
        }
        // The link is relative to the device's real directory under /sys/devices, as the
        // kernel makes it; resolve it through the canonical path of the device directory.
        let real_dir = std::fs::canonicalize(self.resolve(&device_dir))
            .map_err(|source| HostError::write(path, contents, source))?;
        let sys = std::fs::canonicalize(self.resolve(Path::new("/sys")))
            .map_err(|source| HostError::write(path, contents, source))?;
        let depth = real_dir
            .strip_prefix(&sys)
            .map(|relative| relative.components().count())
            .unwrap_or(0);
        let mut target = PathBuf::new();
        for _ in 0..depth {
            target.push("..");
        }
        target.push("bus/pci/drivers");
        target.push(driver);
        std::os::unix::fs::symlink(&target, real_dir.join("driver"))
            .map_err(|source| HostError::write(path, contents, source))?;
        Ok(true)
    }
}

impl Host for RootedHost {
    fn root(&self) -> &Path {
        &self.root
    }

    fn read_to_string(&self, path: &Path) -> Result<String, HostError> {
        std::fs::read_to_string(self.resolve(path)).map_err(|source| HostError::read(path, source))
    }

    fn write(&self, path: &Path, contents: &[u8]) -> Result<(), HostError> {
        self.state()
            .events
            .push(HostEvent::write(path, String::from_utf8_lossy(contents)));
        if self.simulate_sysfs(path, contents)? {
            return Ok(());
        }
        let is_override = path
            .file_name()
            .is_some_and(|name| name == "driver_override")
            && path.starts_with("/sys");
        let contents: &[u8] = if is_override && contents.iter().all(u8::is_ascii_whitespace) {
            b"(null)\n"
        } else {
            contents
        };
        write_in_place(&self.resolve(path), contents, true)
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
        let resolved = self.resolve(path);
        if !resolved.exists() {
            return Ok(None);
        }
        let real = super::SystemHost::rooted(&self.root);
        if let Ok(node) = real.device_node(path) {
            return Ok(node);
        }
        let text = self.read_to_string(path)?;
        parse_device_node(text.trim())
            .map(Some)
            .ok_or_else(|| HostError::Malformed {
                path: path.to_owned(),
                reason: format!(
                    "{:?} is neither a device node nor `c <major>:<minor>`",
                    text.trim()
                ),
            })
    }

    fn run(&self, command: &HostCommand) -> Result<CommandOutput, HostError> {
        let mut state = self.state();
        state.events.push(HostEvent::Command(command.clone()));
        if let Some((_, answer)) = state
            .answers
            .iter()
            .rev()
            .find(|(program, _)| *program == command.program)
        {
            let answer = std::sync::Arc::clone(answer);
            drop(state);
            return Ok(answer(command));
        }
        let script = state.scripts.iter_mut().rev().find(|script| {
            script.program == command.program
                && script
                    .args
                    .as_ref()
                    .is_none_or(|args| *args == command.args)
        });
        let Some(script) = script else {
            return Err(HostError::Command {
                command: command.to_string(),
                reason: "no scripted answer in this RootedHost".into(),
            });
        };
        let output = if script.outputs.len() > 1 {
            script.outputs.pop_front()
        } else {
            script.outputs.front().cloned()
        };
        Ok(output.unwrap_or_default())
    }

    fn spawn(&self, command: &HostCommand) -> Result<ProcessId, HostError> {
        let stand_in = {
            let mut state = self.state();
            state.events.push(HostEvent::Spawn(command.clone()));
            state
                .stand_ins
                .iter()
                .rev()
                .find(|(program, _)| *program == command.program)
                .map(|(_, stand_in)| stand_in.clone())
        };
        let Some(stand_in) = stand_in else {
            return Err(HostError::Command {
                command: command.to_string(),
                reason: "no stand-in process in this RootedHost".into(),
            });
        };
        let mut real = stand_in.clone();
        real.env = command.env.iter().chain(&stand_in.env).cloned().collect();
        super::process::spawn_detached(&real, &real.program, &real.args)
    }

    fn signal(&self, process: &ProcessId, force: bool) -> Result<(), HostError> {
        self.state().events.push(HostEvent::Signal {
            pid: process.pid,
            force,
        });
        super::process::signal(process, force)
    }

    fn mount_tmpfs(&self, target: &Path, size: &str) -> Result<(), HostError> {
        let mut state = self.state();
        state.events.push(HostEvent::MountTmpfs {
            target: target.to_owned(),
            size: size.to_owned(),
        });
        let errno = |code| HostError::Mount {
            operation: "mounting a tmpfs on",
            path: target.to_owned(),
            source: std::io::Error::from_raw_os_error(code),
        };
        const ENOENT: i32 = 2;
        const EBUSY: i32 = 16;
        if !target.is_dir() {
            return Err(errno(ENOENT));
        }
        // Mounting twice on one point works in Linux (the second hides the first); the
        // driver never means to, so the double refuses it.
        if !state.mounts.insert(target.to_owned()) {
            return Err(errno(EBUSY));
        }
        Ok(())
    }

    fn unmount(&self, target: &Path) -> Result<bool, HostError> {
        let mut state = self.state();
        state.events.push(HostEvent::Unmount {
            target: target.to_owned(),
        });
        Ok(state.mounts.remove(target))
    }
}

fn parse_device_node(text: &str) -> Option<DeviceNode> {
    let (kind, numbers) = text.split_once(' ')?;
    let kind = match kind {
        "c" => DeviceNodeKind::Char,
        "b" => DeviceNodeKind::Block,
        _ => return None,
    };
    let (major, minor) = numbers.trim().split_once(':')?;
    Some(DeviceNode {
        kind,
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pci_tree() -> (tempfile::TempDir, RootedHost) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let real = root.join("sys/devices/pci0000:00/0000:07:00.0");
        std::fs::create_dir_all(&real).unwrap();
        for driver in ["nvidia", "vfio-pci"] {
            std::fs::create_dir_all(root.join("sys/bus/pci/drivers").join(driver)).unwrap();
        }
        std::fs::create_dir_all(root.join("sys/bus/pci/devices")).unwrap();
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:00/0000:07:00.0",
            root.join("sys/bus/pci/devices/0000:07:00.0"),
        )
        .unwrap();
        std::os::unix::fs::symlink("../../../bus/pci/drivers/nvidia", real.join("driver")).unwrap();
        std::fs::write(real.join("driver_override"), "(null)\n").unwrap();
        let host = RootedHost::new(root);
        (dir, host)
    }

    #[test]
    fn unbind_and_bind_move_the_driver_link() {
        let (_dir, host) = pci_tree();
        let bdf = "0000:07:00.0";
        assert_eq!(
            super::super::facts::pci_driver(&host, bdf)
                .unwrap()
                .as_deref(),
            Some("nvidia")
        );
        host.write(
            Path::new("/sys/bus/pci/devices/0000:07:00.0/driver_override"),
            b"vfio-pci",
        )
        .unwrap();
        // Binding while bound is EBUSY, as in the kernel.
        let busy = host.write(
            Path::new("/sys/bus/pci/drivers/vfio-pci/bind"),
            bdf.as_bytes(),
        );
        assert!(busy.unwrap_err().to_string().contains("busy"));
        host.write(
            Path::new("/sys/bus/pci/drivers/nvidia/unbind"),
            bdf.as_bytes(),
        )
        .unwrap();
        assert_eq!(super::super::facts::pci_driver(&host, bdf).unwrap(), None);
        // The override refuses another driver.
        assert!(
            host.write(
                Path::new("/sys/bus/pci/drivers/nvidia/bind"),
                bdf.as_bytes()
            )
            .is_err()
        );
        host.write(
            Path::new("/sys/bus/pci/drivers/vfio-pci/bind"),
            bdf.as_bytes(),
        )
        .unwrap();
        assert_eq!(
            super::super::facts::pci_driver(&host, bdf)
                .unwrap()
                .as_deref(),
            Some("vfio-pci")
        );
        assert_eq!(
            super::super::facts::pcie_root(&host, bdf)
                .unwrap()
                .as_deref(),
            Some("pci0000:00")
        );
        host.write(
            Path::new("/sys/bus/pci/devices/0000:07:00.0/driver_override"),
            b"\n",
        )
        .unwrap();
        assert_eq!(
            host.read_to_string(Path::new(
                "/sys/bus/pci/devices/0000:07:00.0/driver_override"
            ))
            .unwrap(),
            "(null)\n"
        );
        assert_eq!(host.events().len(), 6);
        assert_eq!(
            host.events()[0],
            HostEvent::write(
                "/sys/bus/pci/devices/0000:07:00.0/driver_override",
                "vfio-pci"
            )
        );
    }

    #[test]
    fn unbinding_from_the_wrong_driver_is_enodev() {
        let (_dir, host) = pci_tree();
        let error = host
            .write(
                Path::new("/sys/bus/pci/drivers/vfio-pci/unbind"),
                b"0000:07:00.0",
            )
            .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("/sys/bus/pci/drivers/vfio-pci/unbind"),
            "{error}"
        );
    }

    #[test]
    fn scripted_commands_answer_in_order_and_the_last_repeats() {
        let dir = tempfile::tempdir().unwrap();
        let host = RootedHost::new(dir.path());
        let fuser = HostCommand::new("fuser", ["/dev/nvidia0"]).chrooted();
        host.script(
            "fuser",
            [CommandOutput::ok("1234"), CommandOutput::failed(1, "")],
        );
        assert!(host.run(&fuser).unwrap().success());
        assert!(!host.run(&fuser).unwrap().success());
        assert!(!host.run(&fuser).unwrap().success());
        let unscripted = host
            .run(&HostCommand::new("modprobe", ["vfio-pci"]))
            .unwrap_err();
        assert!(unscripted.to_string().contains("modprobe vfio-pci"));
        assert_eq!(host.events().len(), 4);
    }

    #[test]
    fn device_node_stand_ins() {
        let dir = tempfile::tempdir().unwrap();
        let host = RootedHost::new(dir.path());
        let node = DeviceNode {
            kind: DeviceNodeKind::Char,
            major: 195,
            minor: 3,
        };
        host.create_device_node(Path::new("/dev/nvidia3"), node)
            .unwrap();
        assert_eq!(
            host.device_node(Path::new("/dev/nvidia3")).unwrap(),
            Some(node)
        );
        assert_eq!(host.device_node(Path::new("/dev/nvidia4")).unwrap(), None);
        std::fs::write(dir.path().join("dev/junk"), "x").unwrap();
        assert!(host.device_node(Path::new("/dev/junk")).is_err());
    }
}
