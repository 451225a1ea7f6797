//! The plugin process killed with SIGKILL at a named step of prepare or unprepare
//! ([`Step`]), then started again over what it left: for the promise that every step ends,
//! after the restart, with the claim either fully prepared or fully cleaned up.
//!
//! Needs the feature `fault-injection` (of this crate, which turns on the SDK's test-only
//! hooks). The plugin runs in a child process, the test binary executed again: a `#[test]`
//! function of the caller's calls [`run_child_if_asked`] and does nothing in a normal run; the
//! parent starts it through [`CrashHarness::spawn`] with the [`CHILD_ENV`] variable naming
//! the fake API server's kubeconfig, the directories and the step to die at. The child runs
//! a real [`KubeletPlugin`] with the [`MarkerDriver`], whose side effects are files on disk
//! (one marker per prepared device), and whose fault hook kills the process with `SIGKILL`
//! (no unwinding, no destructor, no flush) when the chosen step is reached the chosen time.
//!
//! [`CrashHarness::claim_on_disk`] then reads what a restart left for a claim: checkpoint
//! record, CDI specs, device metadata, markers and the device status on the claim, and
//! [`ClaimOnDisk::verdict`] says whether that is "fully prepared", "fully cleaned" or
//! neither (with what is out of place).

#![cfg(feature = "fault-injection")]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use dra_sdk::advanced::cdi::Spec;
pub use dra_sdk::advanced::fault_injection::Step;
use dra_sdk::cdi::ContainerEdits;
use dra_sdk::claim::{Claim, DriverError, RecordedClaim};
use dra_sdk::device_status::DeviceStatus;
use dra_sdk::driver::{Driver, PreparedClaim, PreparedDevice};
use dra_sdk::plugin::KubeletPlugin;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::{Deserialize, Serialize};

use crate::cluster::{BOOT_ID, NODE_NAME, TestCluster};
use crate::kubelet::{KubeletSimulator, KubeletVersion, RegisteredPlugin};

/// The environment variable that makes [`run_child_if_asked`] run the plugin: the child's
/// [`ChildConfig`] as JSON.
pub const CHILD_ENV: &str = "DRA_SDK_TESTING_CRASH_CHILD";

/// The driver name the child plugin registers as.
pub const CRASH_DRIVER: &str = "crash.example.com";

/// The log of the [`MarkerDriver`]'s calls, one line per call (`prepare <uid>`, `unprepare
/// <uid>`, `rollback <uid>`), in the markers directory.
pub const CALL_LOG: &str = "calls.log";

/// What the child is told: where everything is, and when to die.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChildConfig {
    /// Kubeconfig of the (parent's) fake API server.
    pub kubeconfig: PathBuf,
    /// The kubelet's registrar directory.
    pub registrar_dir: PathBuf,
    /// The kubelet's plugins directory.
    pub plugins_dir: PathBuf,
    /// The CDI directory.
    pub cdi_root: PathBuf,
    /// Where the [`MarkerDriver`] keeps its markers and [`CALL_LOG`].
    pub markers_dir: PathBuf,
    /// Kill the process at this step (its [`Step::as_str`] name) ...
    pub kill_step: Option<String>,
    /// ... when it is reached for the `kill_hit`-th time (1: the first) while `arm_file`
    /// exists. Steps reached while it does not exist are not counted: the parent prepares
    /// and cleans up through the same child without setting it off.
    pub kill_hit: u32,
    /// See `kill_hit`.
    pub arm_file: PathBuf,
}

/// A driver whose side effects are observable on disk: prepare creates
/// `<markers>/<claim uid>/<device>` for each device and returns a device status for each,
/// unprepare and rollback remove the claim's directory; every call is appended to
/// [`CALL_LOG`]. It opts into device metadata and device status, so that every step of
/// prepare and unprepare does work.
#[derive(Debug, Clone)]
pub struct MarkerDriver {
    markers: PathBuf,
}

impl MarkerDriver {
    /// A driver keeping its markers in `markers`.
    pub fn new(markers: impl Into<PathBuf>) -> Self {
        Self {
            markers: markers.into(),
        }
    }

    fn log(&self, call: &str, uid: &str) -> Result<(), DriverError> {
        use std::io::Write as _;
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.markers.join(CALL_LOG))
            .map_err(DriverError::other)?;
        // One write per line: O_APPEND keeps lines whole even across processes.
        log.write_all(format!("{call} {uid}\n").as_bytes())
            .map_err(DriverError::other)
    }

    fn release(&self, call: &str, claim: &RecordedClaim) -> Result<(), DriverError> {
        self.log(call, &claim.claim.uid)?;
        match std::fs::remove_dir_all(self.markers.join(&claim.claim.uid)) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(DriverError::other(error)),
        }
    }
}

#[async_trait::async_trait]
impl Driver for MarkerDriver {
    type Config = ();

    async fn prepare(&self, claim: &Claim<()>) -> Result<PreparedClaim, DriverError> {
        self.log("prepare", &claim.claim.uid)?;
        let dir = self.markers.join(&claim.claim.uid);
        std::fs::create_dir_all(&dir).map_err(DriverError::other)?;
        let mut prepared = PreparedClaim::new(Vec::new());
        for device in &claim.devices {
            std::fs::write(dir.join(&device.device.name), b"prepared")
                .map_err(DriverError::other)?;
            prepared.devices.push(PreparedDevice::new(
                device,
                ContainerEdits::new().env("MARKER", &device.device.name),
            ));
            prepared = prepared.with_device_status(
                DeviceStatus::new(&device.device.pool, &device.device.name)
                    .ready("Prepared", "marker written"),
            );
        }
        Ok(prepared)
    }

    async fn unprepare(&self, claim: &RecordedClaim) -> Result<(), DriverError> {
        self.release("unprepare", claim)
    }

    async fn rollback(&self, claim: &RecordedClaim) -> Result<(), DriverError> {
        self.release("rollback", claim)
    }

    fn device_metadata(&self) -> bool {
        true
    }

    fn reports_device_status(&self) -> bool {
        true
    }
}

/// Runs the plugin child when [`CHILD_ENV`] is set (never returns then), and returns at once
/// otherwise. Call it first thing in a `#[test]` function that [`CrashHarness::spawn`] names.
pub fn run_child_if_asked() {
    let Some(config) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let outcome = serde_json::from_str::<ChildConfig>(&config.to_string_lossy())
        .map_err(|error| format!("{CHILD_ENV} is not a child config: {error}"))
        .and_then(|config| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(|error| format!("building the runtime: {error}"))?
                .block_on(run_child(config))
        });
    // Only reached when the plugin could not start or the parent went away.
    match outcome {
        Ok(()) => std::process::exit(0),
        Err(error) => {
            eprintln!("crash child: {error}");
            std::process::exit(2)
        }
    }
}

async fn run_child(config: ChildConfig) -> Result<(), String> {
    let kubeconfig = kube::config::Kubeconfig::read_from(&config.kubeconfig)
        .map_err(|error| format!("reading {}: {error}", config.kubeconfig.display()))?;
    let client_config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|error| format!("loading the kubeconfig: {error}"))?;
    let client =
        kube::Client::try_from(client_config).map_err(|error| format!("client: {error}"))?;
    let kill_at = match &config.kill_step {
        Some(name) => Some((name.parse::<Step>()?, config.kill_hit.max(1))),
        None => None,
    };
    let hits = std::sync::atomic::AtomicU32::new(0);
    let arm_file = config.arm_file.clone();
    let plugin = KubeletPlugin::builder(
        MarkerDriver::new(&config.markers_dir),
        CRASH_DRIVER,
        NODE_NAME,
        client,
    )
    .registrar_dir(&config.registrar_dir)
    .plugins_dir(&config.plugins_dir)
    .cdi_root(&config.cdi_root)
    .boot_id(BOOT_ID)
    .fault_hook(move |step| {
        if let Some((kill_step, hit)) = kill_at
            && step == kill_step
            && arm_file.exists()
            && hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == hit
        {
            // The process's own pid: SIGKILL cannot be caught, so nothing after this runs.
            let _ = rustix::process::kill_process(
                rustix::process::getpid(),
                rustix::process::Signal::KILL,
            );
        }
    })
    .start()
    .await
    .map_err(|error| format!("starting the plugin: {error}"))?;
    // Serve until killed; a parent that died (the child is reparented) ends it too.
    let parent = rustix::process::getppid();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if rustix::process::getppid() != parent {
            drop(plugin);
            return Ok(());
        }
    }
}

/// The parent's side: a cluster's directories and kubeconfig, the test binary and the test
/// that runs the child.
#[derive(Debug)]
pub struct CrashHarness {
    binary: PathBuf,
    child_test: String,
    base: ChildConfig,
    cdi_root: PathBuf,
    data_dir: PathBuf,
}

/// A running plugin child; killed (SIGKILL) and reaped on drop.
#[derive(Debug)]
pub struct PluginProcess {
    child: Child,
    registration: PathBuf,
}

impl CrashHarness {
    /// A harness over `cluster` that runs the plugin as the test `child_test` (its full
    /// path, e.g. `crash_steps::plugin_child`) of the current test binary.
    pub fn new(cluster: &TestCluster, child_test: &str) -> std::io::Result<Self> {
        let kubeconfig = cluster.write_kubeconfig().map_err(std::io::Error::other)?;
        let markers_dir = cluster.path().join("markers");
        std::fs::create_dir_all(&markers_dir)?;
        Ok(Self {
            binary: std::env::current_exe()?,
            child_test: child_test.to_owned(),
            base: ChildConfig {
                kubeconfig,
                registrar_dir: cluster.registrar_dir(),
                plugins_dir: cluster.plugins_dir(),
                cdi_root: cluster.cdi_root(),
                markers_dir,
                kill_step: None,
                kill_hit: 1,
                arm_file: cluster.path().join("armed"),
            },
            cdi_root: cluster.cdi_root(),
            data_dir: cluster.plugins_dir().join(CRASH_DRIVER),
        })
    }

    /// Starts a plugin child that kills itself at the `hit`-th time it reaches `kill_at`
    /// while armed ([`arm`](Self::arm)); never, with `None`.
    pub fn spawn(&self, kill_at: Option<(Step, u32)>) -> std::io::Result<PluginProcess> {
        let mut config = self.base.clone();
        config.kill_step = kill_at.map(|(step, _)| step.as_str().to_owned());
        config.kill_hit = kill_at.map_or(1, |(_, hit)| hit);
        let config = serde_json::to_string(&config).map_err(std::io::Error::other)?;
        let child = Command::new(&self.binary)
            .args([
                self.child_test.as_str(),
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, config)
            .env("RUST_LOG", "off")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()?;
        let registration = self
            .base
            .registrar_dir
            .join(format!("{CRASH_DRIVER}-reg.sock"));
        Ok(PluginProcess {
            child,
            registration,
        })
    }

    /// Arms (or disarms) the children: only steps reached while armed count towards the kill.
    pub fn arm(&self, armed: bool) -> std::io::Result<()> {
        if armed {
            std::fs::write(&self.base.arm_file, b"")
        } else {
            match std::fs::remove_file(&self.base.arm_file) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
                _ => Ok(()),
            }
        }
    }

    /// The markers directory of the [`MarkerDriver`].
    pub fn markers_dir(&self) -> &Path {
        &self.base.markers_dir
    }

    /// How many times the driver was asked to `call` (`prepare`, `unprepare`, `rollback`)
    /// for claim `uid`, over every process.
    pub fn calls(&self, call: &str, uid: &str) -> usize {
        let line = format!("{call} {uid}");
        std::fs::read_to_string(self.markers_dir().join(CALL_LOG))
            .map(|log| log.lines().filter(|l| *l == line).count())
            .unwrap_or(0)
    }

    /// What is on disk (and on the API server) for claim `uid` in `namespace`/`name`.
    pub async fn claim_on_disk(
        &self,
        client: &kube::Client,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> ClaimOnDisk {
        let checkpoint = std::fs::read(self.data_dir.join("checkpoint.json"))
            .ok()
            .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok());
        let state = checkpoint
            .as_ref()
            .and_then(|file| file["data"]["claims"].get(uid))
            .map(|record| record["state"].as_str().unwrap_or("").to_owned());
        let mut specs = Vec::new();
        if let Ok(entries) = std::fs::read_dir(&self.cdi_root) {
            for entry in entries.flatten() {
                let file = entry.file_name().to_string_lossy().into_owned();
                if file.contains(uid) {
                    specs.push((file, Spec::read_file(entry.path()).is_ok()));
                }
            }
        }
        specs.sort();
        let metadata = self
            .data_dir
            .join("dra-device-metadata")
            .join(format!("{namespace}_{name}"))
            .exists();
        let mut markers: Vec<String> = std::fs::read_dir(self.markers_dir().join(uid))
            .map(|entries| {
                entries
                    .flatten()
                    .map(|entry| entry.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        markers.sort();
        let statuses = kube::Api::<ResourceClaim>::namespaced(client.clone(), namespace)
            .get(name)
            .await
            .ok()
            .and_then(|claim| claim.status)
            .and_then(|status| status.devices)
            .map_or(0, |devices| {
                devices
                    .iter()
                    .filter(|device| device.driver == CRASH_DRIVER)
                    .count()
            });
        ClaimOnDisk {
            state,
            specs,
            metadata,
            markers,
            statuses,
        }
    }
}

/// What a claim left on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimOnDisk {
    /// The checkpoint record's state, if there is a record.
    pub state: Option<String>,
    /// CDI spec files naming the claim's UID, each with whether it parses and validates.
    pub specs: Vec<(String, bool)>,
    /// Whether the claim's device metadata directory exists.
    pub metadata: bool,
    /// The driver's markers (device names) for the claim.
    pub markers: Vec<String>,
    /// Device status entries of the driver on the claim.
    pub statuses: usize,
}

/// Which of the two allowed states a claim is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Completed record, valid CDI specs (the claim's and its metadata's), metadata and a
    /// marker for each of `devices`.
    FullyPrepared,
    /// No record, no spec, no metadata, no marker, no device status.
    FullyCleaned,
    /// Anything else: what is out of place.
    Neither(String),
}

impl ClaimOnDisk {
    /// Whether this is fully prepared (with a marker for each of `devices`), fully cleaned, or
    /// neither.
    pub fn verdict(&self, devices: &[&str]) -> Verdict {
        let cleaned = self.state.is_none()
            && self.specs.is_empty()
            && !self.metadata
            && self.markers.is_empty()
            && self.statuses == 0;
        if cleaned {
            return Verdict::FullyCleaned;
        }
        let mut expected: Vec<String> = devices.iter().map(|d| (*d).to_owned()).collect();
        expected.sort();
        let prepared = self.state.as_deref() == Some("PrepareCompleted")
            && !self.specs.is_empty()
            && self.specs.iter().all(|(_, valid)| *valid)
            && self.metadata
            && self.markers == expected;
        if prepared {
            Verdict::FullyPrepared
        } else {
            Verdict::Neither(format!("{self:?}"))
        }
    }
}

impl PluginProcess {
    /// Registers a simulated kubelet once the plugin is up (start-up recovery has run by
    /// then: the plugin registers after it). Fails when the child exits first or `timeout`
    /// passes.
    pub async fn register(&mut self, timeout: Duration) -> Result<RegisteredPlugin, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "the plugin child exited before registering: {status}"
                ));
            }
            // A socket file of a killed predecessor refuses connections until this child
            // replaces it.
            if let Ok(plugin) = KubeletSimulator::new(KubeletVersion::V1_36)
                .register(&self.registration)
                .await
            {
                return Ok(plugin);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the plugin child did not register within {timeout:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits (at most `timeout`) for the child to exit, and returns how.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus, String> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if Instant::now() > deadline => {
                    return Err(format!("the plugin child still runs after {timeout:?}"));
                }
                Ok(None) => tokio::time::sleep(Duration::from_millis(2)).await,
                Err(error) => return Err(format!("waiting for the plugin child: {error}")),
            }
        }
    }

    /// The child's process ID.
    pub fn id(&self) -> u32 {
        self.child.id()
    }
}

/// Whether `status` is a death by `SIGKILL`.
pub fn killed_by_sigkill(status: &ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt as _;
    status.signal() == Some(rustix::process::Signal::KILL.as_raw())
}

impl Drop for PluginProcess {
    fn drop(&mut self) {
        // This child only: Child::kill signals its own pid.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
