//! The processes of a test cluster, and the guarantee that none outlives the test.
//!
//! Each child is started through `setpriv --pdeathsig KILL` from one thread the cluster owns
//! (the *spawner*). Linux delivers the parent-death signal when the thread that forked the
//! child ends, so every component dies with its cluster: on drop (the spawner thread is told
//! to stop after the components were terminated), on a panic that unwinds through the test,
//! and also when the test process is killed outright, where no destructor runs. The spawner
//! is a thread of its own, not the caller's, because a test's thread ends with the test while
//! a cluster shared by the tests of one binary lives on. Where `setpriv` is missing, children
//! are still terminated on drop, and [`pdeath_signal_supported`] says so.
//!
//! A process can also get [`PrivateMount`]s: it then runs in a mount namespace of its own in
//! which a folder of the cluster is bind-mounted over a fixed host path. The kubelet needs this:
//! its device-plugin registration socket is always `/var/lib/kubelet/device-plugins/kubelet.sock`,
//! whatever `--root-dir` says, so two kubelets on one machine (two nodes, or two clusters of
//! concurrent tests) would race for it, and the loser exits with "address already in use".

use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

/// Where `setpriv` is looked for.
const SETPRIV: &str = "/usr/bin/setpriv";

/// Whether children get a parent-death signal (`setpriv` is installed).
pub fn pdeath_signal_supported() -> bool {
    Path::new(SETPRIV).exists()
}

/// A host path that one process sees replaced by a folder of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PrivateMount {
    /// The cluster's folder that is mounted (created if missing).
    pub(crate) source: PathBuf,
    /// The fixed host path it hides (created if missing; nothing else on the host changes).
    pub(crate) target: PathBuf,
}

/// Environment variable: when set, kubelets are not isolated (as where mount namespaces are
/// unavailable), to test that path.
pub const ENV_SHARED_DEVICE_PLUGINS: &str = "DRA_E2E_SHARED_DEVICE_PLUGINS";

/// Where `unshare` (util-linux, like `setpriv`) is looked for.
const UNSHARE: &str = "/usr/bin/unshare";

/// Runs in the new mount namespace: bind-mounts each `source target` pair given before `--`,
/// then becomes the program after it (same process, so signals and the parent-death signal
/// reach the component itself). Paths are arguments, never spliced into the script.
const MOUNT_THEN_EXEC: &str = r#"while [ "$1" != -- ]; do mount --bind "$1" "$2" || exit 125; shift 2; done; shift; exec "$@""#;

/// Whether each kubelet gets a mount namespace of its own (see the module docs): `unshare
/// --mount` works here, which needs root and `CAP_SYS_ADMIN` (a container may withhold it even
/// from root) and util-linux's `unshare`, and [`ENV_SHARED_DEVICE_PLUGINS`] is not set. Probed
/// once per process.
pub fn mount_namespaces_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        std::env::var_os(ENV_SHARED_DEVICE_PLUGINS).is_none()
            && rustix::process::geteuid().is_root()
            && Command::new(UNSHARE)
                .args(["--mount", "--propagation", "private", "--", "/bin/true"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|status| status.success())
    })
}

/// The program and arguments that start `program` with `mounts` private to it: through
/// `unshare --mount` where [`mount_namespaces_available`] (root, as in CI and on the
/// development machines); otherwise `program` itself, which then uses the host paths as it
/// would outside the harness.
fn with_private_mounts(
    program: &Path,
    args: &[String],
    mounts: &[PrivateMount],
) -> std::io::Result<(PathBuf, Vec<String>)> {
    if mounts.is_empty() || !mount_namespaces_available() {
        return Ok((program.to_owned(), args.to_owned()));
    }
    let mut wrapped: Vec<String> = ["--mount", "--propagation", "private", "--", "/bin/sh", "-c"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    wrapped.push(MOUNT_THEN_EXEC.to_owned());
    wrapped.push("sh".to_owned());
    for mount in mounts {
        // Both must exist for the bind mount; creating the host path changes nothing else
        // (the kubelet would create it itself).
        std::fs::create_dir_all(&mount.source)?;
        std::fs::create_dir_all(&mount.target)?;
        wrapped.push(mount.source.display().to_string());
        wrapped.push(mount.target.display().to_string());
    }
    wrapped.push("--".to_owned());
    wrapped.push(program.display().to_string());
    wrapped.extend(args.iter().cloned());
    Ok((PathBuf::from(UNSHARE), wrapped))
}

type SpawnReply = mpsc::Sender<std::io::Result<Child>>;

/// The thread that starts every process of one cluster.
pub(crate) struct Spawner {
    requests: Option<mpsc::Sender<(Command, SpawnReply)>>,
    thread: Option<JoinHandle<()>>,
}

impl Spawner {
    pub(crate) fn new() -> std::io::Result<Self> {
        let (requests, receive) = mpsc::channel::<(Command, SpawnReply)>();
        let thread = std::thread::Builder::new()
            .name("dra-e2e-spawner".into())
            .spawn(move || {
                // Ends when the cluster drops its sender; the children's parent-death signal
                // fires then, after the cluster has already stopped them.
                for (mut command, reply) in receive {
                    let _ = reply.send(command.spawn());
                }
            })?;
        Ok(Self {
            requests: Some(requests),
            thread: Some(thread),
        })
    }

    /// Starts `program` with `args` in `work_dir`, output appended to `log`, with `mounts`
    /// private to it (see the module docs).
    pub(crate) fn spawn(
        &self,
        name: &str,
        program: &Path,
        args: &[String],
        work_dir: &Path,
        log: &Path,
        mounts: &[PrivateMount],
    ) -> std::io::Result<ManagedProcess> {
        let out = File::options().create(true).append(true).open(log)?;
        let err = out.try_clone()?;
        let (launched, launch_args) = with_private_mounts(program, args, mounts)?;
        let mut command = if pdeath_signal_supported() {
            let mut command = Command::new(SETPRIV);
            command
                .arg("--pdeathsig")
                .arg("KILL")
                .arg("--")
                .arg(&launched);
            command
        } else {
            Command::new(&launched)
        };
        command
            .args(&launch_args)
            .current_dir(work_dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let (reply, answer) = mpsc::channel();
        let closed = || std::io::Error::other("the cluster's spawner thread has stopped");
        self.requests
            .as_ref()
            .ok_or_else(closed)?
            .send((command, reply))
            .map_err(|_| closed())?;
        let child = answer.recv().map_err(|_| closed())??;
        Ok(ManagedProcess {
            name: name.to_owned(),
            program: program.to_owned(),
            args: args.to_owned(),
            work_dir: work_dir.to_owned(),
            log: log.to_owned(),
            mounts: mounts.to_vec(),
            child: Some(child),
        })
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        self.requests.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A process of the cluster: terminated (TERM, then KILL) when dropped.
#[derive(Debug)]
pub struct ManagedProcess {
    name: String,
    program: PathBuf,
    args: Vec<String>,
    work_dir: PathBuf,
    log: PathBuf,
    mounts: Vec<PrivateMount>,
    child: Option<Child>,
}

/// How long a component gets to exit after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(5);

impl ManagedProcess {
    /// The component's name, e.g. `kube-apiserver` or `kubelet-node-1`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process ID, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The file its standard output and error go to.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The exit status, if it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// The last `lines` lines of its log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }

    /// Stops the process: SIGTERM, then SIGKILL after a grace period. Idempotent.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        if let Some(pid) = i32::try_from(child.id()).ok().and_then(Pid::from_raw) {
            let _ = kill_process(pid, Signal::TERM);
        }
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Kills the process at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the same command again, after a [`stop`](Self::stop) or
    /// [`kill`](Self::kill).
    pub(crate) fn restart(&mut self, spawner: &Spawner) -> std::io::Result<()> {
        self.stop();
        let fresh = spawner.spawn(
            &self.name,
            &self.program,
            &self.args,
            &self.work_dir,
            &self.log,
            &self.mounts,
        )?;
        *self = fresh;
        Ok(())
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last `lines` lines of a log file (at most its last 64 KiB are read).
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    let read = || -> std::io::Result<String> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match read() {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(error) => format!("(cannot read {}: {error})", path.display()),
    }
}
