//! MPS: one control daemon per config group of a claim.
//!
//! # Start (at prepare)
//!
//! 1. Check what depends on the devices: `multiUser` needs compute capability 7.0 on every
//!    GPU; each key of `defaultPerDevicePinnedMemoryLimit` must be a UUID of the group or an
//!    index into it. Nothing is touched before these pass.
//! 2. Directories `<mps root>/<id>/{pipe,log,shm}` (`id` = `<claim UID>-<group index>`); a
//!    tmpfs on `shm` (`nosuid,nodev,noexec,size=<half of MemTotal>k`, `65536k` when
//!    `/proc/meminfo` cannot be read, as upstream), mounted by the `mount(2)` system call
//!    ([`Host::mount_tmpfs`](crate::host::Host::mount_tmpfs)): the image has no `mount`.
//! 3. `nvidia-smi -i <uuid> -c EXCLUSIVE_PROCESS` for each full GPU (MIG devices: their
//!    parent may serve other claims, so its compute mode is left alone).
//! 4. `nvidia-cuda-mps-control -f [-M]` with `CUDA_VISIBLE_DEVICES=<uuids>`,
//!    `CUDA_MPS_PIPE_DIRECTORY` and `CUDA_MPS_LOG_DIRECTORY`, started by the plugin's
//!    [`MpsRunner`]:
//!    * [`MpsRunner::Deployment`] (the plugin has `--image-name`, as the chart sets it): a
//!      Deployment `mps-control-daemon-<id>` in the plugin's namespace, pinned to the node, as
//!      upstream ([`deployment`]). The kubelet runs it whatever happens to the plugin's
//!      container, so the daemon survives a container restart and a DaemonSet upgrade.
//!    * [`MpsRunner::HostProcess`] (no image: development, tests, hosts without the chart):
//!      a process spawned detached ([`Host::spawn`](crate::host::Host::spawn)). It survives a
//!      restart of the plugin's *process*, but not of a container it runs in: the container
//!      runtime kills every process of the container.
//!
//!    Foreground mode (`-f`) rather than upstream's `-d`: what the runner starts *is* the
//!    daemon (a process identified by pid and start time; the Deployment's container).
//!    The record is also written to `<mps root>/<id>/daemon.json`, so a daemon whose claim
//!    never reached the checkpoint is still found and stopped at the next start.
//! 5. Readiness: the control socket `<pipe>/control` exists, and the process runs (host
//!    process) or the Deployment has one ready replica whose pod's container is Ready;
//!    checked with upstream's backoff (1 s, doubling, 4 steps, at most 10 s each).
//! 6. The limits, each sent on the control pipe (`echo <cmd> | nvidia-cuda-mps-control`):
//!    `set_default_active_thread_percentage <p>` and
//!    `set_default_device_pinned_mem_limit <uuid> <n>M` (whole MiB).
//!
//! A failure at any step undoes the steps before it.
//!
//! # Containers
//!
//! Each device of the group gets `CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps`, the pipe directory
//! mounted there and the shm directory mounted on `/dev/shm` (`rw, nosuid, nodev, bind`), as
//! upstream. The MPS root is a directory of the plugin (under the kubelet's plugins
//! directory, which the plugin sees at the same path as the node), so the mount sources are
//! node paths.
//!
//! # Restart and stop
//!
//! The checkpointed [`MpsDaemonRecord`] names the process by pid *and* start time, or the
//! Deployment by namespace, name and UID. At start ([`ensure_running`]) a recorded daemon that
//! still runs (its Deployment exists, with the recorded UID) is adopted as is; one that does
//! not is started again with the same directories and limits, by the runner that started it.
//! Unprepare ([`stop`]) ends the daemon: for a host process, `quit` on the control pipe, a
//! wait, then SIGTERM and SIGKILL; for a Deployment, a delete with `Foreground` propagation
//! and a wait until it is gone. Then, for both, it unmounts the tmpfs, sets the compute mode
//! back to `DEFAULT` (unless another claim uses the GPU) and removes the directories.
//!
//! Only the start and the end of the daemon differ between the runners ([`MpsRunner`]); the
//! directories, the tmpfs, the compute modes, the limits, the record and the rollback are the
//! same code.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dra_sdk::cdi::{ContainerEdits, Mount};
use serde::{Deserialize, Serialize};

use super::{SharedDevice, SharingError, Tools};
use crate::config::MpsConfig;
use crate::host::{HostCommand, ProcessId};

pub mod deployment;

pub use deployment::{
    DaemonCommand, DeploymentRef, DeploymentRunner, ImagePullPolicy, MpsDeploymentConfig,
    OwnedDeployment,
};

/// Where containers find the pipe directory (upstream's path).
pub const CONTAINER_PIPE_DIR: &str = "/tmp/nvidia-mps";
/// The default MPS root: upstream's `<plugin dir>/mps`.
pub const DEFAULT_MPS_ROOT: &str = "/var/lib/kubelet/plugins/gpu.nvidia.com/mps";
/// The shm size when `/proc/meminfo` cannot be read (upstream's fallback).
pub const FALLBACK_SHM_SIZE: &str = "65536k";
/// The file in a daemon's directory that records it.
pub const RECORD_FILE: &str = "daemon.json";
/// Mount options of the pipe and shm directories in containers.
pub const CONTAINER_MOUNT_OPTIONS: [&str; 4] = ["rw", "nosuid", "nodev", "bind"];

const MIB: u64 = 1 << 20;

/// Where daemons live and how long to wait for them.
#[derive(Clone, Debug)]
pub struct MpsSettings {
    /// The directory holding one directory per daemon.
    pub root: PathBuf,
    /// First wait of the readiness check; doubled at each step.
    pub ready_initial: Duration,
    /// Number of readiness waits.
    pub ready_steps: u32,
    /// Longest single wait.
    pub ready_cap: Duration,
    /// How long `quit` (then SIGTERM) gets before the next, harder stop.
    pub stop_grace: Duration,
    /// A daemon no completed claim records is stopped at start only when its record is at
    /// least this old: a younger one may belong to a prepare still running in another
    /// instance of the plugin (a rolling update).
    pub orphan_grace: Duration,
    /// How long a daemon Deployment gets to disappear once deleted (its pod terminating).
    pub delete_timeout: Duration,
}

impl Default for MpsSettings {
    /// Upstream's readiness backoff: 1 s, doubling, 4 steps, at most 10 s each; 10 s grace.
    fn default() -> Self {
        Self {
            root: PathBuf::from(DEFAULT_MPS_ROOT),
            ready_initial: Duration::from_secs(1),
            ready_steps: 4,
            ready_cap: Duration::from_secs(10),
            stop_grace: Duration::from_secs(10),
            orphan_grace: Duration::from_secs(120),
            delete_timeout: Duration::from_secs(60),
        }
    }
}

/// Where new MPS control daemons run; see the [module documentation](self). A recorded daemon
/// is always managed the way it was started, whatever the runner is now.
#[derive(Clone, Debug, Default)]
pub enum MpsRunner {
    /// A process spawned detached on the host ([`Host::spawn`](crate::host::Host::spawn)).
    #[default]
    HostProcess,
    /// A Deployment per daemon ([`deployment`]).
    Deployment(DeploymentRunner),
}

impl MpsRunner {
    /// The Deployment runner, to manage a daemon recorded as a Deployment.
    fn deployments(&self, record: &MpsDaemonRecord) -> Result<&DeploymentRunner, SharingError> {
        match self {
            Self::Deployment(runner) => Ok(runner),
            Self::HostProcess => Err(SharingError::Daemon {
                id: record.id.clone(),
                reason: format!(
                    "it runs as {}, but this plugin has no --image-name and so manages no \
                     Deployments: set --image-name, or delete the Deployment",
                    record
                        .deployment
                        .as_ref()
                        .map_or_else(String::new, ToString::to_string)
                ),
            }),
        }
    }
}

/// One readiness check's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Ready.
    Ready,
    /// Not yet, because of this.
    Waiting(String),
    /// Never will be (the process exited, the Deployment went away).
    Failed(String),
}

/// A started MPS control daemon, as the checkpoint keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MpsDaemonRecord {
    /// `<claim UID>-<group index>`.
    pub id: String,
    /// The devices of the config group.
    pub devices: Vec<String>,
    /// `CUDA_VISIBLE_DEVICES` of the daemon: the UUIDs of the group's GPUs and MIG devices.
    pub uuids: Vec<String>,
    /// Full GPUs whose compute mode was set to `EXCLUSIVE_PROCESS`.
    pub exclusive_gpus: Vec<String>,
    /// The daemon process (pid 0 for a daemon running as a Deployment).
    pub process: ProcessId,
    /// The daemon's Deployment, when [`MpsRunner::Deployment`] started it; `None` for a host
    /// process (and in records of versions without Deployments).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<DeploymentRef>,
    /// `<mps root>/<id>`.
    pub dir: PathBuf,
    /// Whether a tmpfs was mounted on the shm directory.
    pub shm_mounted: bool,
    /// Started with `-M`.
    pub multi_user: bool,
    /// The control commands that set the limits, sent again when the daemon is restarted.
    pub control_commands: Vec<String>,
}

impl MpsDaemonRecord {
    /// The pipe directory (`CUDA_MPS_PIPE_DIRECTORY`).
    pub fn pipe_dir(&self) -> PathBuf {
        self.dir.join("pipe")
    }

    /// The log directory (`CUDA_MPS_LOG_DIRECTORY`).
    pub fn log_dir(&self) -> PathBuf {
        self.dir.join("log")
    }

    /// The shm directory, mounted on the containers' `/dev/shm`.
    pub fn shm_dir(&self) -> PathBuf {
        self.dir.join("shm")
    }

    /// The edits every device of the group gets.
    pub fn container_edits(&self) -> ContainerEdits {
        let mount = |source: PathBuf, target: &str| {
            Mount::new(source.display().to_string(), target).options(CONTAINER_MOUNT_OPTIONS)
        };
        ContainerEdits::new()
            .env("CUDA_MPS_PIPE_DIRECTORY", CONTAINER_PIPE_DIR)
            .mount(mount(self.pipe_dir(), CONTAINER_PIPE_DIR))
            .mount(mount(self.shm_dir(), "/dev/shm"))
    }
}

/// What [`ensure_running`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readoption {
    /// The recorded daemon runs: adopted as is.
    Adopted,
    /// It did not run; it was started again, with this new record.
    Restarted(Box<MpsDaemonRecord>),
}

/// Checks the config against the devices and returns the control commands that set its
/// limits, in order; see the [module documentation](self).
pub fn control_commands(
    config: &MpsConfig,
    devices: &[SharedDevice],
) -> Result<Vec<String>, SharingError> {
    if config.multi_user == Some(true)
        && let Some(old) = devices
            .iter()
            .find(|device| device.compute_capability.major < 7)
    {
        return Err(SharingError::InvalidConfig {
            field: "sharing.mpsConfig.multiUser".into(),
            reason: format!(
                "multi-user MPS needs compute capability 7.0 (Volta) or newer on every GPU; {} \
                 ({}) has {}.{}",
                old.device, old.uuid, old.compute_capability.major, old.compute_capability.minor
            ),
        });
    }
    let mut commands = Vec::new();
    if let Some(percentage) = config.default_active_thread_percentage {
        commands.push(format!("set_default_active_thread_percentage {percentage}"));
    }
    let mut limits: BTreeMap<usize, u64> = BTreeMap::new();
    if let Some(limit) = config
        .default_pinned_device_memory_limit
        .as_ref()
        .and_then(|q| q.bytes())
    {
        for index in 0..devices.len() {
            limits.insert(index, limit / MIB);
        }
    }
    for (key, limit) in config
        .default_per_device_pinned_memory_limit
        .iter()
        .flatten()
    {
        let index = devices
            .iter()
            .position(|device| device.uuid == *key)
            .or_else(|| key.parse::<usize>().ok().filter(|i| *i < devices.len()));
        let Some(index) = index else {
            let known: Vec<String> = devices
                .iter()
                .enumerate()
                .map(|(i, d)| format!("{i} or {}", d.uuid))
                .collect();
            return Err(SharingError::InvalidConfig {
                field: format!("sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[{key}]"),
                reason: format!(
                    "{key:?} is neither the UUID nor the index of a device of this config group \
                     (devices: {})",
                    known.join(", ")
                ),
            });
        };
        if let Some(bytes) = limit.bytes() {
            limits.insert(index, bytes / MIB);
        }
    }
    for (index, mib) in limits {
        commands.push(format!(
            "set_default_device_pinned_mem_limit {} {mib}M",
            devices[index].uuid
        ));
    }
    Ok(commands)
}

/// Starts the daemon of one config group; see the [module documentation](self). On failure,
/// whatever was done is undone.
#[tracing::instrument(skip_all, fields(id))]
pub fn start(
    tools: &Tools<'_>,
    settings: &MpsSettings,
    runner: &MpsRunner,
    id: &str,
    config: &MpsConfig,
    devices: &[SharedDevice],
) -> Result<MpsDaemonRecord, SharingError> {
    let control_commands = control_commands(config, devices)?;
    let mut record = MpsDaemonRecord {
        id: id.to_owned(),
        devices: devices.iter().map(|d| d.device.clone()).collect(),
        uuids: devices.iter().map(|d| d.uuid.clone()).collect(),
        exclusive_gpus: Vec::new(),
        process: ProcessId {
            pid: 0,
            start_time: 0,
        },
        deployment: None,
        dir: settings.root.join(id),
        shm_mounted: false,
        multi_user: config.multi_user == Some(true),
        control_commands,
    };
    match start_steps(tools, settings, runner, &mut record, devices) {
        Ok(()) => {
            tracing::info!(pid = record.process.pid, deployment = ?record.deployment.as_ref().map(|d| &d.name), dir = %record.dir.display(), "MPS control daemon ready");
            Ok(record)
        }
        Err(error) => {
            if let Err(cleanup) = stop(tools, settings, runner, &record, &record.exclusive_gpus) {
                tracing::error!(%cleanup, "undoing a failed MPS daemon start");
            }
            Err(error)
        }
    }
}

fn start_steps(
    tools: &Tools<'_>,
    settings: &MpsSettings,
    runner: &MpsRunner,
    record: &mut MpsDaemonRecord,
    devices: &[SharedDevice],
) -> Result<(), SharingError> {
    for dir in [record.pipe_dir(), record.log_dir(), record.shm_dir()] {
        std::fs::create_dir_all(&dir).map_err(|e| SharingError::io("creating", &dir, e))?;
    }
    tools
        .host()
        .mount_tmpfs(&record.shm_dir(), &shm_size(tools))?;
    record.shm_mounted = true;
    for gpu in devices.iter().filter_map(|d| d.gpu_uuid.as_deref()) {
        tools.run(&tools.nvidia_smi(["-i", gpu, "-c", "EXCLUSIVE_PROCESS"]))?;
        record.exclusive_gpus.push(gpu.to_owned());
    }
    launch(tools, settings, runner, record)
}

/// Starts the daemon of `record` with `runner`, waits for it and sends its limits.
fn launch(
    tools: &Tools<'_>,
    settings: &MpsSettings,
    runner: &MpsRunner,
    record: &mut MpsDaemonRecord,
) -> Result<(), SharingError> {
    // A control socket left by an earlier daemon would pass the readiness check before the
    // new one listens.
    let _ = std::fs::remove_file(record.pipe_dir().join("control"));
    let control = record.pipe_dir().join("control");
    match runner {
        MpsRunner::HostProcess => {
            let mut args = vec!["-f"];
            if record.multi_user {
                args.push("-M");
            }
            let command = tools
                .mps_control(args)
                .env("CUDA_VISIBLE_DEVICES", record.uuids.join(","))
                .env(
                    "CUDA_MPS_PIPE_DIRECTORY",
                    record.pipe_dir().display().to_string(),
                )
                .env(
                    "CUDA_MPS_LOG_DIRECTORY",
                    record.log_dir().display().to_string(),
                );
            record.process = tools.host().spawn(&command)?;
            record.deployment = None;
            write_record(record)?;
            let process = record.process;
            wait_ready(settings, record, || {
                Ok(if !process.is_running() {
                    Readiness::Failed("exited before it was ready".to_owned())
                } else if control.exists() {
                    Readiness::Ready
                } else {
                    Readiness::Waiting(format!("{} does not exist", control.display()))
                })
            })?;
        }
        MpsRunner::Deployment(deployments) => {
            let desired = deployments.build(record, tools.daemon_command())?;
            let created = deployments.create(&record.id, &desired)?;
            record.deployment = Some(created.clone());
            write_record(record)?;
            wait_ready(settings, record, || deployments.readiness(record, &created))?;
        }
    }
    for control in &record.control_commands {
        tools.run(&control_command(tools, record, control))?;
    }
    Ok(())
}

/// `echo <control> | nvidia-cuda-mps-control` on the daemon's pipe.
fn control_command(tools: &Tools<'_>, record: &MpsDaemonRecord, control: &str) -> HostCommand {
    tools
        .mps_control(Vec::<String>::new())
        .env(
            "CUDA_MPS_PIPE_DIRECTORY",
            record.pipe_dir().display().to_string(),
        )
        .stdin(format!("{control}\n"))
}

fn write_record(record: &MpsDaemonRecord) -> Result<(), SharingError> {
    let path = record.dir.join(RECORD_FILE);
    let json = serde_json::to_vec_pretty(record)
        .map_err(|e| SharingError::io("encoding", &path, std::io::Error::other(e)))?;
    std::fs::write(&path, json).map_err(|e| SharingError::io("writing", &path, e))
}

/// Runs `check` with upstream's backoff until it answers ready or failed, or the steps run
/// out; the error names the last reason and the daemon's log.
fn wait_ready(
    settings: &MpsSettings,
    record: &MpsDaemonRecord,
    mut check: impl FnMut() -> Result<Readiness, SharingError>,
) -> Result<(), SharingError> {
    let log = record.log_dir().join("control.log");
    let mut wait = settings.ready_initial;
    let started = Instant::now();
    let mut reason = String::new();
    for step in 0..=settings.ready_steps {
        match check()? {
            Readiness::Ready => return Ok(()),
            Readiness::Failed(why) => {
                return Err(SharingError::Daemon {
                    id: record.id.clone(),
                    reason: format!("{why} (see {})", log.display()),
                });
            }
            Readiness::Waiting(why) => reason = why,
        }
        if step == settings.ready_steps {
            break;
        }
        std::thread::sleep(wait);
        wait = (wait * 2).min(settings.ready_cap);
    }
    Err(SharingError::Daemon {
        id: record.id.clone(),
        reason: format!(
            "not ready after {:.1?}: {reason} (see {})",
            started.elapsed(),
            log.display()
        ),
    })
}

/// Half of `MemTotal` in KiB, as upstream sizes the shm tmpfs.
fn shm_size(tools: &Tools<'_>) -> String {
    tools
        .host()
        .read_to_string(Path::new("/proc/meminfo"))
        .ok()
        .and_then(|meminfo| {
            meminfo.lines().find_map(|line| {
                let value = line.strip_prefix("MemTotal:")?;
                value
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
        })
        .map_or_else(
            || FALLBACK_SHM_SIZE.to_owned(),
            |kib| format!("{}k", kib / 2),
        )
}

/// Stops the daemon of `record` and removes what it had; `reset_gpus` are the GPUs whose
/// compute mode goes back to `DEFAULT` (those of the record that no other claim uses).
/// Idempotent: a daemon already gone, an unmounted shm and missing directories are fine.
#[tracing::instrument(skip_all, fields(id = %record.id))]
pub fn stop(
    tools: &Tools<'_>,
    settings: &MpsSettings,
    runner: &MpsRunner,
    record: &MpsDaemonRecord,
    reset_gpus: &[String],
) -> Result<(), SharingError> {
    terminate(tools, settings, runner, record)?;
    if record.shm_mounted {
        // `false` (nothing mounted) after an earlier, interrupted unprepare: fine.
        tools.host().unmount(&record.shm_dir())?;
    }
    for gpu in reset_gpus {
        tools.run(&tools.nvidia_smi(["-i", gpu.as_str(), "-c", "DEFAULT"]))?;
    }
    match std::fs::remove_dir_all(&record.dir) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(SharingError::io("removing", &record.dir, error)),
    }
    tracing::info!("MPS control daemon stopped");
    Ok(())
}

/// Ends the daemon of `record`, if it still runs. A Deployment is deleted (`Foreground`) and
/// waited for ([`MpsSettings::delete_timeout`]); a process gets `quit` on the control pipe,
/// then SIGTERM, then SIGKILL, each given [`MpsSettings::stop_grace`].
fn terminate(
    tools: &Tools<'_>,
    settings: &MpsSettings,
    runner: &MpsRunner,
    record: &MpsDaemonRecord,
) -> Result<(), SharingError> {
    if let Some(deployment) = &record.deployment {
        return runner
            .deployments(record)?
            .delete(deployment, settings.delete_timeout);
    }
    if record.process.pid == 0 || !record.process.is_running() {
        return Ok(());
    }
    // `quit` asks the daemon to stop; it fails harmlessly if the pipe is gone.
    let quit = control_command(tools, record, "quit");
    if let Err(error) = tools.run(&quit) {
        tracing::warn!(%error, "quit on the control pipe failed");
    }
    let mut stopped = wait_exit(&record.process, settings.stop_grace);
    for force in [false, true] {
        if stopped {
            break;
        }
        tools.host().signal(&record.process, force)?;
        stopped = wait_exit(&record.process, settings.stop_grace);
    }
    if stopped {
        Ok(())
    } else {
        Err(SharingError::Daemon {
            id: record.id.clone(),
            reason: format!("pid {} survived SIGKILL", record.process.pid),
        })
    }
}

fn wait_exit(process: &ProcessId, grace: Duration) -> bool {
    let deadline = Instant::now() + grace;
    loop {
        if !process.is_running() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20).min(grace));
    }
}

/// At start: adopts the recorded daemon if it still runs, else starts it again with the same
/// directories and limits (the tmpfs stays mounted across plugin restarts and is reused).
pub fn ensure_running(
    tools: &Tools<'_>,
    settings: &MpsSettings,
    runner: &MpsRunner,
    record: &MpsDaemonRecord,
) -> Result<Readoption, SharingError> {
    // The runner that started it starts it again.
    let relaunch_with = match &record.deployment {
        Some(deployment) => {
            let deployments = runner.deployments(record)?;
            match deployments.current_uid(deployment)? {
                Some(uid) if uid == deployment.uid => {
                    tracing::info!(id = %record.id, deployment = %deployment.name, "MPS control daemon Deployment adopted");
                    return Ok(Readoption::Adopted);
                }
                Some(uid) => {
                    // Made again by someone else with our name and spec: that one is the
                    // daemon now (the create below would adopt it too).
                    tracing::warn!(id = %record.id, deployment = %deployment.name, %uid, "MPS control daemon Deployment has another UID than recorded");
                }
                None => {
                    tracing::warn!(id = %record.id, deployment = %deployment.name, "MPS control daemon Deployment missing; creating it again");
                }
            }
            MpsRunner::Deployment(deployments.clone())
        }
        None if record.process.is_running() => {
            tracing::info!(id = %record.id, pid = record.process.pid, "MPS control daemon adopted");
            return Ok(Readoption::Adopted);
        }
        None => {
            tracing::warn!(id = %record.id, pid = record.process.pid, "MPS control daemon not running; starting it again");
            MpsRunner::HostProcess
        }
    };
    let mut restarted = record.clone();
    for dir in [
        restarted.pipe_dir(),
        restarted.log_dir(),
        restarted.shm_dir(),
    ] {
        std::fs::create_dir_all(&dir).map_err(|e| SharingError::io("creating", &dir, e))?;
    }
    if let Err(error) = launch(tools, settings, &relaunch_with, &mut restarted) {
        // Started but not ready: do not leave it running unrecorded.
        if (restarted.process != record.process || restarted.deployment != record.deployment)
            && let Err(stop) = terminate(tools, settings, &relaunch_with, &restarted)
        {
            tracing::error!(id = %record.id, %stop, "stopping a daemon that did not get ready");
        }
        return Err(error);
    }
    Ok(Readoption::Restarted(Box::new(restarted)))
}

/// The daemons recorded under the MPS root (`<root>/<id>/daemon.json`) at least
/// [`MpsSettings::orphan_grace`] ago, for finding those no prepared claim owns. Unreadable
/// records are skipped with a warning.
pub fn recorded_daemons(settings: &MpsSettings) -> Vec<MpsDaemonRecord> {
    let Ok(entries) = std::fs::read_dir(&settings.root) else {
        return Vec::new();
    };
    let mut records = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path().join(RECORD_FILE);
        let age = std::fs::metadata(&path)
            .and_then(|metadata| metadata.modified())
            .ok()
            .and_then(|modified| modified.elapsed().ok());
        if age.is_none_or(|age| age < settings.orphan_grace) {
            continue;
        }
        let Ok(text) = std::fs::read(&path) else {
            continue;
        };
        match serde_json::from_slice::<MpsDaemonRecord>(&text) {
            Ok(record) => records.push(record),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "unreadable MPS daemon record; left alone");
            }
        }
    }
    records.sort_by(|a, b| a.id.cmp(&b.id));
    records
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::ComputeCapability;
    use crate::config::Quantity;

    fn device(uuid: &str, major: u32) -> SharedDevice {
        SharedDevice {
            device: format!("dev-{uuid}"),
            uuid: uuid.to_owned(),
            gpu_uuid: Some(uuid.to_owned()),
            compute_capability: ComputeCapability::new(major, 0),
        }
    }

    #[test]
    fn a_restarted_daemon_that_never_gets_ready_is_stopped_not_left_running() {
        use crate::cdi::DriverRoot;
        use crate::host::{CommandOutput, HostEvent, RootedHost};
        use crate::sharing::MPS_CONTROL;
        use std::sync::Arc;

        let dir = tempfile::tempdir().unwrap();
        let host = RootedHost::new(dir.path().join("host"));
        // Never creates its control socket.
        host.stand_in(MPS_CONTROL, HostCommand::new("sleep", ["600"]));
        host.script(MPS_CONTROL, [CommandOutput::ok("")]);
        let driver_root = DriverRoot::new(Arc::new(host.clone()), "/");
        let tools = Tools::find(&host, &driver_root).unwrap();
        let settings = MpsSettings {
            root: dir.path().join("mps"),
            ready_initial: Duration::from_millis(5),
            ready_steps: 3,
            ready_cap: Duration::from_millis(20),
            stop_grace: Duration::from_millis(100),
            orphan_grace: Duration::ZERO,
            delete_timeout: Duration::from_millis(100),
        };
        let gone = ProcessId {
            pid: u32::MAX,
            start_time: 1,
        };
        let record = MpsDaemonRecord {
            id: "uid-0".into(),
            devices: vec!["gpu-0".into()],
            uuids: vec!["GPU-a".into()],
            exclusive_gpus: Vec::new(),
            process: gone,
            deployment: None,
            dir: settings.root.join("uid-0"),
            shm_mounted: true,
            multi_user: false,
            control_commands: Vec::new(),
        };
        let error =
            ensure_running(&tools, &settings, &MpsRunner::HostProcess, &record).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("MPS control daemon uid-0: not ready after"),
            "{error}"
        );
        let events = host.events();
        let Some(HostEvent::Signal { pid, force: false }) = events.last() else {
            panic!("{events:?}");
        };
        // The daemon it started is gone (SIGTERM after `quit`), not left running unrecorded.
        assert_eq!(crate::host::process::start_time(*pid).unwrap(), None);
    }

    #[test]
    fn limits_are_whole_mib_per_device_with_overrides_by_uuid_or_index() {
        let config = MpsConfig {
            default_active_thread_percentage: Some(50),
            default_pinned_device_memory_limit: Some(Quantity("10Gi".into())),
            default_per_device_pinned_memory_limit: Some(BTreeMap::from([
                ("1".to_owned(), Quantity("1536Mi".into())),
                ("GPU-c".to_owned(), Quantity("1572864".into())),
            ])),
            multi_user: None,
        };
        let devices = [device("GPU-a", 8), device("GPU-b", 8), device("GPU-c", 8)];
        assert_eq!(
            control_commands(&config, &devices).unwrap(),
            [
                "set_default_active_thread_percentage 50",
                "set_default_device_pinned_mem_limit GPU-a 10240M",
                "set_default_device_pinned_mem_limit GPU-b 1536M",
                "set_default_device_pinned_mem_limit GPU-c 1M",
            ]
        );
    }

    #[test]
    fn unknown_device_keys_and_old_gpus_with_multi_user_are_config_errors() {
        let config = MpsConfig {
            default_per_device_pinned_memory_limit: Some(BTreeMap::from([(
                "2".to_owned(),
                Quantity("1Gi".into()),
            )])),
            ..MpsConfig::default()
        };
        let devices = [device("GPU-a", 8), device("GPU-b", 8)];
        assert_eq!(
            control_commands(&config, &devices).unwrap_err().to_string(),
            "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[2]: \"2\" is neither the UUID \
             nor the index of a device of this config group (devices: 0 or GPU-a, 1 or GPU-b)"
        );
        let multi = MpsConfig {
            multi_user: Some(true),
            ..MpsConfig::default()
        };
        assert_eq!(
            control_commands(&multi, &[device("GPU-a", 8), device("GPU-p", 6)])
                .unwrap_err()
                .to_string(),
            "sharing.mpsConfig.multiUser: multi-user MPS needs compute capability 7.0 (Volta) \
             or newer on every GPU; dev-GPU-p (GPU-p) has 6.0"
        );
    }
}
