//! The `gpu-kubelet-plugin` command line and its assembly: flags and environment variables as
//! upstream's (`drivers.md` A.6), then backend, host, driver and published devices built from
//! them.
//!
//! The SDK's flags ([`PluginArgs`]: node name, kubeconfig, kubelet directories, CDI root,
//! health-check port, HTTP endpoint) are flattened in; [`NvidiaArgs`] adds the driver's own.
//!
//! ```
//! use clap::Parser;
//! use dra_driver_nvidia::plugin::{Cli, NvidiaPlugin};
//!
//! let cli = Cli::try_parse_from([
//!     "gpu-kubelet-plugin", "--node-name", "node-1", "--mock-profile", "dgx-h100",
//! ])?;
//! let plugin = NvidiaPlugin::from_args(&cli.nvidia)?;
//! let resources = plugin.resources(&cli.plugin.node_name);
//! assert_eq!(resources.device_count(), 8);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use dra_sdk::cdi::{CdiError, Kind};
use dra_sdk::cli::PluginArgs;
use dra_sdk::slices::DriverResources;

use crate::backend::mig::MigManager;
use crate::backend::mock::MockEvents;
use crate::backend::mock::{MockBackend, ProfileError};
use crate::backend::{BackendError, GpuBackend};
use crate::cdi::DriverRoot;
use crate::config::{FeatureGate, FeatureGates};
use crate::devices::{Discovery, DiscoveryError, DiscoveryOptions};
use crate::driver::NvidiaDriver;
use crate::health::{HealthPolicy, XidListError, parse_xids};
use crate::host::{FakeHostTree, Host, HostError, SystemHost};
use crate::sharing::mps::{ImagePullPolicy, MpsDeploymentConfig};
use crate::sharing::{ConsumableShares, ConsumableSharesError, MpsSettings};

/// `gpu-kubelet-plugin`: the NVIDIA GPU DRA kubelet plugin.
#[derive(Clone, Debug, clap::Parser)]
#[command(
    name = "gpu-kubelet-plugin",
    version,
    about = "NVIDIA GPU DRA kubelet plugin (gpu.nvidia.com): publishes full GPUs, static MIG \
             devices and VFIO devices, and prepares them for pods through CDI, shared by \
             time-slicing, MPS or consumable shares when configured.",
    after_help = "Without a GPU: --mock-profile dgx-a100 (or dgx-h100, mixed, workstation, or \
                  a profile file) serves a described machine; see drivers/nvidia/profiles/README.md."
)]
pub struct Cli {
    /// The SDK's flags.
    #[command(flatten)]
    pub plugin: PluginArgs,
    /// The driver's flags.
    #[command(flatten)]
    pub nvidia: NvidiaArgs,
}

/// The NVIDIA driver's flags, with upstream's names and environment variables.
#[derive(Clone, Debug, clap::Args)]
pub struct NvidiaArgs {
    /// Namespace the plugin runs in (from the downward API). With MPSSupport and
    /// --image-name, MPS control-daemon Deployments are created there, as upstream.
    #[arg(long, env = "NAMESPACE", default_value = "default")]
    pub namespace: String,

    /// Root of the NVIDIA driver installation on the node (`/` for a driver installed on the
    /// host, `/run/nvidia/driver` for the GPU operator's driver container). Paths in CDI
    /// specs are written relative to it. Also read from HOST_DRIVER_ROOT when
    /// NVIDIA_DRIVER_ROOT is unset.
    #[arg(long, env = "NVIDIA_DRIVER_ROOT", visible_alias = "host-driver-root")]
    pub nvidia_driver_root: Option<PathBuf>,

    /// Where the node's driver root is mounted inside the plugin's container; the plugin
    /// looks for driver libraries and binaries (and libnvidia-ml) there.
    #[arg(long, env = "DRIVER_ROOT_CTR_PATH", default_value = "/driver-root")]
    pub container_driver_root: PathBuf,

    /// Where the node's `/` is mounted inside the plugin's container. Needed by
    /// PassthroughSupport (sysfs driver rebinding, and modprobe run chrooted there); it must
    /// exist when that gate is on.
    #[arg(long, env = "HOST_ROOT", default_value = "/host-root")]
    pub host_root: PathBuf,

    /// Path of `nvidia-cdi-hook` on the node, for the hooks of CDI specs (ldcache update,
    /// symlinks in the container). Without it, the plugin installs the hook its image carries
    /// (/usr/bin/nvidia-cdi-hook) into its folder under the kubelet plugins directory and uses
    /// that, as upstream does; with no hook to install (a run outside the image) it warns and
    /// writes specs without hooks (docs/cdi.md).
    #[arg(long, env = "NVIDIA_CDI_HOOK_PATH")]
    pub nvidia_cdi_hook_path: Option<PathBuf>,

    /// The plugin's folder under the kubelet plugins directory
    /// (`<--kubelet-plugins-directory-path>/gpu.nvidia.com`), where the bundled
    /// `nvidia-cdi-hook` is installed. Not a flag: set from the SDK's flags by the binary;
    /// when unset, `KUBELET_PLUGINS_DIRECTORY_PATH` (else the kubelet's default) is used.
    #[arg(skip)]
    pub kubelet_plugin_dir: Option<PathBuf>,

    /// Feature gates, `Name=true|false` separated by commas. Known gates: TimeSlicingSettings,
    /// MPSSupport, PassthroughSupport, DynamicMIG, NVMLDeviceHealthCheck, DeviceMetadata,
    /// DRAListTypeAttributes, FabricManagerPartitioning, ConsumableShares and the
    /// ComputeDomain gates. Dependencies are checked (DeviceMetadata needs
    /// PassthroughSupport; DynamicMIG excludes PassthroughSupport and MPSSupport, but not
    /// NVMLDeviceHealthCheck as upstream does); an unknown gate is an error listing the known
    /// ones.
    #[arg(long, env = "FEATURE_GATES", default_value = "", value_parser = parse_gates)]
    pub feature_gates: FeatureGates,

    /// The image the plugin's pods run (the chart passes its `image.*`). With MPSSupport, each
    /// MPS control daemon runs as a Deployment of this image in --namespace, as upstream, and
    /// so outlives the plugin's container; without it, daemons are host processes spawned by
    /// the plugin, which a restart of its container kills (docs/sharing.md).
    #[arg(long, env = "IMAGE_NAME")]
    pub image_name: Option<String>,

    /// Secrets the MPS control-daemon Deployments pull --image-name with, separated by
    /// commas (the chart passes its `imagePullSecrets`).
    #[arg(long, env = "IMAGE_PULL_SECRETS", value_delimiter = ',')]
    pub image_pull_secrets: Vec<String>,

    /// `imagePullPolicy` of the MPS control-daemon containers (Always, IfNotPresent or
    /// Never; the cluster's default when unset).
    #[arg(long, env = "IMAGE_PULL_POLICY", ignore_case = true)]
    pub image_pull_policy: Option<ImagePullPolicy>,

    /// Service account of the MPS control-daemon pods (the namespace's default when unset;
    /// the daemon calls no API).
    #[arg(long, env = "SERVICE_ACCOUNT_NAME")]
    pub service_account_name: Option<String>,

    /// HTTP path of the Prometheus metrics on --http-endpoint (letters, digits and `/-_.`,
    /// starting with `/`, not `/healthz`; anything else is refused at start).
    #[arg(long, env = "METRICS_PATH", default_value = METRICS_PATH)]
    pub metrics_path: String,

    /// Let several claims share a GPU or MIG device (published with
    /// allowMultipleAllocations): `disabled`, `memory` (a claim takes all the memory unless it
    /// asks for less), `unlimited` (a claim takes no memory unless it asks for some) or a
    /// number of shares per device. Anything but `disabled` needs the ConsumableShares gate.
    #[arg(long, env = "CONSUMABLE_SHARES", default_value = "disabled")]
    pub consumable_shares: String,

    /// With MPSSupport: where MPS control daemons keep their pipe, log and shm directories,
    /// one directory per daemon. Must be visible at the same path on the node (it is under
    /// the kubelet's plugins directory by default), since containers mount from it.
    #[arg(long, env = "MPS_ROOT", default_value = crate::sharing::mps::DEFAULT_MPS_ROOT)]
    pub mps_root: PathBuf,

    /// Serve a described machine instead of the GPUs NVML reports: a shipped profile
    /// (dgx-a100, dgx-h100, mixed, workstation) or a profile file. The mock's /proc, /sys and
    /// /dev files are laid out under --mock-host-root.
    #[arg(long, env = "MOCK_PROFILE")]
    pub mock_profile: Option<String>,

    /// With --mock-profile: the directory the mock machine's host files are laid out in
    /// (created, or replaced if it holds an earlier layout). Default: a temporary directory
    /// removed when the plugin stops.
    #[arg(long, env = "MOCK_HOST_ROOT", requires = "mock_profile")]
    pub mock_host_root: Option<PathBuf>,

    /// XIDs whose taint is informational (effect None) on top of upstream's 13, 31, 43, 45,
    /// 68 and 109, comma-separated. Used with the NVMLDeviceHealthCheck gate.
    #[arg(long, env = "ADDITIONAL_XIDS_TO_IGNORE", default_value = "")]
    pub additional_xids_to_ignore: String,

    /// With NVMLDeviceHealthCheck: seconds without a new health event after which a device's
    /// xid taint is removed (a lost GPU stays tainted). 0 (the default): taints stay until
    /// the operator resets them through --health-reset-dir.
    #[arg(long, env = "HEALTH_RECOVERY_PERIOD", default_value_t = 0)]
    pub health_recovery_period: u64,

    /// With NVMLDeviceHealthCheck: a directory where the operator creates a file named after
    /// a device (or `all`) to remove its health taints; the plugin deletes the file once done.
    #[arg(long, env = "HEALTH_RESET_DIR")]
    pub health_reset_dir: Option<PathBuf>,

    /// With --mock-profile: a file of health events the mock GPUs report as they are
    /// appended, one `<uuid> xid <n>`, `<uuid> double-bit-ecc` or `<uuid> gpu-lost` a line
    /// (see docs/health.md).
    #[arg(long, env = "MOCK_HEALTH_EVENTS", requires = "mock_profile")]
    pub mock_health_events: Option<PathBuf>,

    /// Print the hardware the backend reports as a mock profile (YAML, named after
    /// --node-name) and exit, without contacting the API server. On a GPU node this turns the
    /// real machine into a --mock-profile file. Read-only.
    #[arg(long)]
    pub print_profile: bool,

    /// Wait until the NVIDIA driver is installed (its libnvidia-ml.so.1 under
    /// --container-driver-root loads and initialises), then exit 0: the chart's init
    /// container, which has no probe to fail while the GPU operator installs the driver. The
    /// plugin itself waits the same way at start (1 s, doubling, at most 30 s apart).
    #[arg(long, conflicts_with = "print_profile")]
    pub wait_for_driver: bool,
}

fn parse_gates(text: &str) -> Result<FeatureGates, String> {
    text.parse::<FeatureGates>()
        .map_err(|error| error.to_string())
}

impl NvidiaArgs {
    /// The node's driver root: `--nvidia-driver-root`, else `HOST_DRIVER_ROOT` from the
    /// environment, else `/`.
    pub fn nvidia_driver_root(&self) -> PathBuf {
        self.nvidia_driver_root
            .clone()
            .or_else(|| std::env::var_os("HOST_DRIVER_ROOT").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("/"))
    }

    /// Where the bundled `nvidia-cdi-hook` is installed: [`Self::kubelet_plugin_dir`], else
    /// `KUBELET_PLUGINS_DIRECTORY_PATH` from the environment (else the kubelet's default)
    /// joined with the driver name.
    pub fn kubelet_plugin_dir(&self) -> PathBuf {
        self.kubelet_plugin_dir.clone().unwrap_or_else(|| {
            std::env::var_os("KUBELET_PLUGINS_DIRECTORY_PATH")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(dra_sdk::advanced::DEFAULT_PLUGINS_DIR))
                .join(crate::devices::DRIVER_NAME)
        })
    }
}

/// The only metrics path the SDK's HTTP endpoint serves.
pub const METRICS_PATH: &str = "/metrics";

/// Gates this driver does not implement yet: enabling one is a start-up error, not a silent
/// no-op.
const UNIMPLEMENTED_GATES: [FeatureGate; 1] = [FeatureGate::FabricManagerPartitioning];

/// Why the plugin cannot be assembled from its flags.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// A feature gate this driver does not implement is on.
    #[error(
        "feature gate {gate} is not implemented by this driver yet; turn it off (--feature-gates {gate}=false)"
    )]
    UnimplementedGate {
        /// The gate.
        gate: &'static str,
    },
    /// `--consumable-shares` other than `disabled` without the gate.
    #[error(
        "--consumable-shares={value}: consumable shares need the ConsumableShares feature gate \
         (--feature-gates ConsumableShares=true), or use --consumable-shares=disabled"
    )]
    ConsumableShares {
        /// The value given.
        value: String,
    },
    /// `--consumable-shares` does not parse.
    #[error(transparent)]
    ConsumableSharesValue(#[from] ConsumableSharesError),
    /// `--image-name` is empty or not an image reference.
    #[error(
        "--image-name={value:?}: not an image reference (e.g. registry.example.com/gpu-kubelet-plugin:0.1.0)"
    )]
    ImageName {
        /// The value given.
        value: String,
    },
    /// `--additional-xids-to-ignore` does not parse.
    #[error(transparent)]
    Xids(#[from] XidListError),
    /// PassthroughSupport is on but the host root is not mounted.
    #[error(
        "PassthroughSupport needs the node's / at --host-root, but {} does not exist",
        path.display()
    )]
    HostRootMissing {
        /// The host root.
        path: PathBuf,
    },
    /// No mock profile was given and the NVML backend is not built in.
    #[error(
        "this gpu-kubelet-plugin was built without the `nvml` feature: pass --mock-profile \
         (or MOCK_PROFILE), or build with `--features nvml`"
    )]
    NvmlNotBuilt,
    /// The mock profile could not be loaded.
    #[error(transparent)]
    Profile(#[from] ProfileError),
    /// The backend failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The mock machine's host files could not be laid out.
    #[error("laying out the mock host files: {0}")]
    MockHost(#[source] HostError),
    /// A temporary directory for the mock host files could not be made.
    #[error("creating a directory for the mock host files: {0}")]
    MockHostDir(#[source] std::io::Error),
    /// Discovery failed.
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    /// The bundled `nvidia-cdi-hook` could not be installed.
    #[error(transparent)]
    CdiHook(#[from] crate::cdi::hook::HookInstallError),
}

/// Everything the plugin runs on, assembled from its flags: the backend, the host, the
/// [`NvidiaDriver`] and the devices it publishes.
#[derive(Debug)]
#[non_exhaustive]
pub struct NvidiaPlugin {
    /// The hardware.
    pub backend: Arc<dyn GpuBackend>,
    /// What creates and destroys MIG instances (dynamic MIG): the same backend.
    pub mig_manager: Arc<dyn MigManager>,
    /// The host (the real one, or the mock machine's files).
    pub host: Arc<dyn Host>,
    /// The `dra_sdk::driver::Driver`.
    pub driver: NvidiaDriver,
    /// The devices found at start-up.
    pub discovery: Discovery,
    /// With `--mock-profile`: the mock GPUs' health event source, to inject events.
    pub mock_events: Option<MockEvents>,
    /// Keeps a temporary mock host directory alive while the plugin runs.
    _mock_host_dir: Option<tempfile::TempDir>,
}

impl NvidiaPlugin {
    /// Validates the flags, opens the backend, lays out or opens the host, builds the driver
    /// and discovers the devices.
    #[tracing::instrument(skip_all, fields(mock_profile = args.mock_profile.as_deref()))]
    pub fn from_args(args: &NvidiaArgs) -> Result<Self, SetupError> {
        let gates = args.feature_gates.clone();
        if let Some(gate) = UNIMPLEMENTED_GATES
            .into_iter()
            .find(|gate| gates.is_enabled(*gate))
        {
            return Err(SetupError::UnimplementedGate { gate: gate.name() });
        }
        if let Some(image) = &args.image_name
            && (image.trim().is_empty() || image.chars().any(char::is_whitespace))
        {
            return Err(SetupError::ImageName {
                value: image.clone(),
            });
        }
        let consumable: ConsumableShares = args.consumable_shares.parse()?;
        if consumable.is_enabled() && !gates.is_enabled(FeatureGate::ConsumableShares) {
            return Err(SetupError::ConsumableShares {
                value: args.consumable_shares.clone(),
            });
        }
        let health = if gates.is_enabled(FeatureGate::NvmlDeviceHealthCheck) {
            Some(
                HealthPolicy::default()
                    .ignore_xids(parse_xids(&args.additional_xids_to_ignore)?)
                    .recovery_period(
                        (args.health_recovery_period > 0)
                            .then(|| Duration::from_secs(args.health_recovery_period)),
                    )
                    .reset_dir(args.health_reset_dir.clone()),
            )
        } else {
            None
        };
        let passthrough = gates.is_enabled(FeatureGate::PassthroughSupport);
        let dynamic_mig = gates.is_enabled(FeatureGate::DynamicMig);
        let list_type_attributes = gates.is_enabled(FeatureGate::DraListTypeAttributes);

        let mut mock_events = None;
        let mig: Arc<dyn MigManager>;
        let (backend, host, mock_host_dir): (Arc<dyn GpuBackend>, Arc<dyn Host>, _) = match &args
            .mock_profile
        {
            Some(profile) => {
                let backend = MockBackend::from_profile(profile)?;
                let events = backend.events();
                if let Some(path) = &args.mock_health_events {
                    events.watch_file(path);
                }
                mock_events = Some(events);
                let (root, temporary) = match &args.mock_host_root {
                    Some(root) => {
                        prepare_mock_root(root)?;
                        (root.clone(), None)
                    }
                    None => {
                        let dir = tempfile::Builder::new()
                            .prefix("gpu-kubelet-plugin-mock-host-")
                            .tempdir()
                            .map_err(SetupError::MockHostDir)?;
                        (dir.path().to_owned(), Some(dir))
                    }
                };
                let host = FakeHostTree::new(&root)
                    .vfio_pci_loaded(passthrough)
                    .dynamic_mig(dynamic_mig)
                    .build(backend.hardware())
                    .map_err(SetupError::MockHost)?;
                tracing::info!(profile = %backend.profile_name(), host_root = %root.display(), "mock backend");
                let backend = Arc::new(backend);
                mig = Arc::clone(&backend) as Arc<dyn MigManager>;
                (backend, Arc::new(host), temporary)
            }
            None => {
                // Checked first: a flag error is reported at once, not after the driver wait.
                let host = if passthrough {
                    if !args.host_root.exists() {
                        return Err(SetupError::HostRootMissing {
                            path: args.host_root.clone(),
                        });
                    }
                    SystemHost::rooted(&args.host_root)
                } else {
                    SystemHost::new()
                };
                let (backend, manager) =
                    nvml_backend_waiting(&args.container_driver_root, DriverWait::default())?;
                mig = manager;
                (backend, Arc::new(host), None)
            }
        };

        let driver_root = if args.mock_profile.is_some() {
            // The mock machine has no driver installation: CDI edits carry its device nodes
            // only.
            DriverRoot::new(Arc::clone(&host), "/")
        } else {
            DriverRoot::new(
                Arc::new(SystemHost::rooted(&args.container_driver_root)),
                args.nvidia_driver_root(),
            )
        };
        let mut builder = NvidiaDriver::builder(Arc::clone(&backend), Arc::clone(&host))
            .driver_root(driver_root)
            .feature_gates(gates)
            .consumable_shares(consumable)
            .mps(MpsSettings {
                root: args.mps_root.clone(),
                ..MpsSettings::default()
            })
            .mig_manager(Arc::clone(&mig));
        let hook = crate::cdi::hook::HookSetup {
            configured: args.nvidia_cdi_hook_path.clone(),
            bundled: PathBuf::from(crate::cdi::hook::BUNDLED_HOOK),
            install_dir: args.kubelet_plugin_dir(),
            host_root: args.host_root.clone(),
            mock: args.mock_profile.is_some(),
        }
        .resolve()?;
        if let Some(hook) = hook {
            builder = builder.cdi_hook(hook);
        }
        match (
            &args.image_name,
            args.feature_gates.is_enabled(FeatureGate::MpsSupport),
        ) {
            (Some(image), true) => {
                tracing::info!(image = %image, namespace = %args.namespace, "MPS control daemons run as Deployments of this image");
                builder = builder.mps_deployments(MpsDeploymentConfig {
                    image_pull_policy: args.image_pull_policy,
                    image_pull_secrets: args
                        .image_pull_secrets
                        .iter()
                        .map(|name| name.trim())
                        .filter(|name| !name.is_empty())
                        .map(str::to_owned)
                        .collect(),
                    service_account_name: args
                        .service_account_name
                        .clone()
                        .filter(|name| !name.trim().is_empty()),
                    ..MpsDeploymentConfig::new(&args.namespace, image)
                });
            }
            (None, true) => tracing::warn!(
                "no --image-name: MPS control daemons run as host processes, which do not \
                 survive a restart of the plugin's container"
            ),
            (Some(image), false) => {
                tracing::info!(image = %image, "image name (used by MPSSupport only, which is off)");
            }
            (None, false) => {}
        }
        if let Some(policy) = health {
            builder = builder.health(policy);
        }
        let driver = builder.build();
        let discovery = Discovery::discover(
            backend.as_ref(),
            host.as_ref(),
            &DiscoveryOptions::new()
                .passthrough(passthrough)
                .dynamic_mig(dynamic_mig)
                .list_type_attributes(list_type_attributes)
                .consumable_shares(consumable),
        )?;
        Ok(Self {
            backend,
            mig_manager: mig,
            host,
            driver,
            discovery,
            mock_events,
            _mock_host_dir: mock_host_dir,
        })
    }

    /// What the plugin publishes on `node_name`: one pool named after the node.
    pub fn resources(&self, node_name: &str) -> DriverResources {
        self.discovery.resources(node_name)
    }

    /// The translation of the upstream driver's checkpoint, for the plugin builder's
    /// `foreign_checkpoint`: on this plugin's hardware, host and feature gates, with the node's
    /// boot time (see [`UpstreamCheckpoint`](crate::driver::UpstreamCheckpoint) and
    /// `docs/migrating-from-upstream.md`).
    pub fn upstream_checkpoint(&self) -> crate::driver::UpstreamCheckpoint {
        let booted_at = match dra_sdk::advanced::checkpoint::boot_time() {
            Ok(booted_at) => Some(booted_at),
            Err(error) => {
                tracing::warn!(%error, "the boot time is unknown: an upstream checkpoint without a boot ID is taken as of this boot");
                None
            }
        };
        crate::driver::UpstreamCheckpoint::new(
            Arc::clone(&self.backend),
            Arc::clone(&self.host),
            self.driver.feature_gates().clone(),
        )
        .booted_at(booted_at)
    }
}

/// Vendor of the CDI kind of the plugin's specs: upstream's (`drivers.md` A.5).
pub const CDI_VENDOR: &str = "k8s.gpu.nvidia.com";

/// Class of the CDI kind of the plugin's specs: upstream's `claim` (one transient spec per
/// claim).
pub const CDI_CLASS: &str = "claim";

/// The CDI kind of the specs the plugin writes, `k8s.gpu.nvidia.com/claim` as upstream's, so
/// that the CDI device names (`k8s.gpu.nvidia.com/claim=<claimUID>-<device>`) and spec files
/// (`k8s.gpu.nvidia.com-claim_<claimUID>.yaml`) are those upstream's tools and guides show.
/// The SDK's default would be `k8s.gpu.nvidia.com/gpu`.
///
/// ```
/// assert_eq!(dra_driver_nvidia::plugin::cdi_kind()?.to_string(), "k8s.gpu.nvidia.com/claim");
/// # Ok::<(), dra_sdk::cdi::CdiError>(())
/// ```
///
/// # Errors
///
/// Never: both parts are valid CDI names (the SDK validates every kind it builds).
pub fn cdi_kind() -> Result<Kind, CdiError> {
    Kind::new(CDI_VENDOR, CDI_CLASS)
}

/// The backend the flags select: the mock profile, else NVML (feature `nvml`). For
/// `--print-profile`; [`NvidiaPlugin::from_args`] opens its own.
pub fn backend(args: &NvidiaArgs) -> Result<Arc<dyn GpuBackend>, SetupError> {
    match &args.mock_profile {
        Some(profile) => Ok(Arc::new(MockBackend::from_profile(profile)?)),
        None => nvml_backend(&args.container_driver_root).map(|(backend, _)| backend),
    }
}

/// Marks a directory as a mock host tree this plugin may replace.
const MOCK_ROOT_MARKER: &str = ".gpu-kubelet-plugin-mock-host";

/// Empties `root` for a fresh layout, refusing a non-empty directory that is not an earlier
/// layout (so a typo never wipes a real directory).
fn prepare_mock_root(root: &Path) -> Result<(), SetupError> {
    let io = SetupError::MockHostDir;
    match std::fs::read_dir(root) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                if !root.join(MOCK_ROOT_MARKER).exists() {
                    return Err(SetupError::MockHostDir(std::io::Error::other(format!(
                        "{} is not empty and holds no earlier mock layout ({MOCK_ROOT_MARKER}); \
                         refusing to replace it",
                        root.display()
                    ))));
                }
                std::fs::remove_dir_all(root).map_err(io)?;
            }
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(io(error)),
    }
    std::fs::create_dir_all(root).map_err(io)?;
    std::fs::write(root.join(MOCK_ROOT_MARKER), "").map_err(io)
}

/// `libnvidia-ml.so.1` under the container driver root, where the usual library directories
/// have it; else the loader's search path.
#[cfg(feature = "nvml")]
fn nvml_backend(container_driver_root: &Path) -> Result<NvmlBackends, SetupError> {
    use crate::backend::nvml::{DEFAULT_LIBRARY, NvmlBackend};
    let candidates = [
        "usr/lib64",
        "usr/lib/x86_64-linux-gnu",
        "usr/lib/aarch64-linux-gnu",
        "lib64",
        "lib/x86_64-linux-gnu",
        "lib/aarch64-linux-gnu",
        "usr/lib",
    ];
    let library = candidates
        .iter()
        .map(|dir| container_driver_root.join(dir).join(DEFAULT_LIBRARY))
        .find(|path| path.exists())
        .unwrap_or_else(|| PathBuf::from(DEFAULT_LIBRARY));
    let backend = Arc::new(NvmlBackend::open(library)?);
    Ok((Arc::clone(&backend) as Arc<dyn GpuBackend>, backend))
}

/// The NVML backend, as the read-only backend and as the MIG manager.
type NvmlBackends = (Arc<dyn GpuBackend>, Arc<dyn MigManager>);

/// The back-off between attempts to open the NVIDIA driver at start: `first`, doubling, at
/// most `cap` apart, for as long as it takes: the GPU operator's driver container can take
/// minutes to build and load its modules, and a plugin that exits meanwhile only crash-loops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverWait {
    /// The first pause.
    pub first: Duration,
    /// The longest pause.
    pub cap: Duration,
}

impl Default for DriverWait {
    /// 1 s, doubling, at most 30 s.
    fn default() -> Self {
        Self {
            first: Duration::from_secs(1),
            cap: Duration::from_secs(30),
        }
    }
}

/// `--wait-for-driver`: returns once the driver the flags name opens (at once for a mock
/// profile), waiting with `wait`'s back-off while its NVML library is missing or does not
/// initialise. Any other error ends the wait.
pub fn wait_for_driver(args: &NvidiaArgs, wait: DriverWait) -> Result<(), SetupError> {
    if args.mock_profile.is_some() {
        return Ok(());
    }
    nvml_backend_waiting(&args.container_driver_root, wait).map(drop)
}

/// [`nvml_backend`], again after each pause of `wait` while the driver is not installed yet
/// (its library is not there, or NVML does not initialise: modules not loaded, or loaded in
/// another version than the library's during an upgrade). Each attempt is logged with what
/// failed, so an operator whose driver root is simply wrong sees why the plugin is not up.
fn nvml_backend_waiting(
    container_driver_root: &Path,
    wait: DriverWait,
) -> Result<NvmlBackends, SetupError> {
    let mut pause = wait.first;
    loop {
        match nvml_backend(container_driver_root) {
            Err(SetupError::Backend(
                error @ (BackendError::LibraryNotFound { .. } | BackendError::Init { .. }),
            )) => {
                tracing::warn!(
                    %error,
                    container_driver_root = %container_driver_root.display(),
                    retry_in = ?pause,
                    "waiting for the NVIDIA driver (check --nvidia-driver-root and the driver's \
                     installation if this lasts)"
                );
                std::thread::sleep(pause);
                pause = (pause * 2).min(wait.cap);
            }
            other => return other,
        }
    }
}

#[cfg(not(feature = "nvml"))]
fn nvml_backend(_container_driver_root: &Path) -> Result<NvmlBackends, SetupError> {
    Err(SetupError::NvmlNotBuilt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(
            ["gpu-kubelet-plugin", "--node-name", "node-1"]
                .iter()
                .chain(args),
        )
    }

    #[test]
    fn upstream_flags_parse() {
        let cli = parse(&[
            "--cdi-root",
            "/var/run/cdi",
            "--host-driver-root",
            "/run/nvidia/driver",
            "--container-driver-root",
            "/driver-root",
            "--host-root",
            "/host-root",
            "--feature-gates",
            "PassthroughSupport=true,DeviceMetadata=true",
            "--healthcheck-port",
            "51516",
            "--http-endpoint",
            ":8080",
            "--mock-profile",
            "dgx-a100",
        ])
        .unwrap();
        assert_eq!(
            cli.nvidia.nvidia_driver_root(),
            PathBuf::from("/run/nvidia/driver")
        );
        assert!(
            cli.nvidia
                .feature_gates
                .is_enabled(FeatureGate::DeviceMetadata)
        );
        assert_eq!(cli.plugin.healthcheck_port().unwrap(), Some(51516));
    }

    #[test]
    fn unknown_and_conflicting_gates_are_clear_errors() {
        let error = parse(&["--feature-gates", "NoSuchGate=true"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("unknown feature gate"), "{error}");
        assert!(error.contains("PassthroughSupport"), "{error}");
        let error = parse(&["--feature-gates", "DeviceMetadata=true"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("PassthroughSupport"), "{error}");
    }

    #[test]
    fn mock_plugin_publishes_the_profile() {
        let cli = parse(&["--mock-profile", "dgx-a100"]).unwrap();
        let plugin = NvidiaPlugin::from_args(&cli.nvidia).unwrap();
        assert_eq!(plugin.resources("node-1").device_count(), 19);
        assert_eq!(plugin.backend.name(), "mock:dgx-a100");
    }

    #[test]
    fn passthrough_on_the_mock_machine_adds_vfio_twins() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("mock");
        let root = root.to_str().unwrap();
        let cli = parse(&[
            "--mock-profile",
            "dgx-h100",
            "--mock-host-root",
            root,
            "--feature-gates",
            "PassthroughSupport=true",
        ])
        .unwrap();
        let plugin = NvidiaPlugin::from_args(&cli.nvidia).unwrap();
        assert_eq!(plugin.resources("node-1").device_count(), 16);
        // A second start replaces its own earlier layout.
        NvidiaPlugin::from_args(&cli.nvidia).unwrap();
    }

    #[test]
    fn print_profile_writes_a_loadable_profile() {
        let cli = parse(&["--mock-profile", "dgx-a100", "--print-profile"]).unwrap();
        assert!(cli.nvidia.print_profile);
        let inventory = backend(&cli.nvidia).unwrap().inventory().unwrap();
        let yaml = crate::backend::mock::to_profile_yaml(&cli.plugin.node_name, "", &inventory);
        let copy = MockBackend::from_yaml("node-1.yaml", &yaml).unwrap();
        assert_eq!(copy.profile_name(), "node-1");
        assert_eq!(copy.hardware(), &inventory);
    }

    #[test]
    fn a_foreign_mock_host_root_is_not_wiped() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("precious"), "x").unwrap();
        let cli = parse(&[
            "--mock-profile",
            "workstation",
            "--mock-host-root",
            dir.path().to_str().unwrap(),
        ])
        .unwrap();
        let error = NvidiaPlugin::from_args(&cli.nvidia).unwrap_err();
        assert!(error.to_string().contains("refusing"), "{error}");
        assert!(dir.path().join("precious").exists());
    }

    #[test]
    fn unimplemented_features_refuse_to_start() {
        let cli = parse(&[
            "--mock-profile",
            "dgx-a100",
            "--feature-gates",
            "FabricManagerPartitioning=true",
        ])
        .unwrap();
        let error = NvidiaPlugin::from_args(&cli.nvidia).unwrap_err();
        assert!(
            error.to_string().contains("FabricManagerPartitioning"),
            "{error}"
        );
        let cli = parse(&["--mock-profile", "dgx-a100", "--consumable-shares", "4"]).unwrap();
        let error = NvidiaPlugin::from_args(&cli.nvidia).unwrap_err();
        assert!(error.to_string().contains("ConsumableShares"), "{error}");
    }

    #[test]
    fn consumable_shares_publish_every_gpu_and_mig_device_for_several_claims() {
        let cli = parse(&[
            "--mock-profile",
            "dgx-a100",
            "--feature-gates",
            "ConsumableShares=true",
            "--consumable-shares",
            "4",
        ])
        .unwrap();
        let plugin = NvidiaPlugin::from_args(&cli.nvidia).unwrap();
        let resources = plugin.resources("node-1");
        let devices = &resources.pools["node-1"].devices;
        assert_eq!(devices.len(), 19);
        for device in devices {
            assert!(device.allow_multiple_allocations, "{}", device.name);
            assert_eq!(device.capacity["shares"].value.0, "4", "{}", device.name);
        }
        let cli = parse(&[
            "--mock-profile",
            "dgx-a100",
            "--feature-gates",
            "ConsumableShares=true",
            "--consumable-shares",
            "some",
        ])
        .unwrap();
        let error = NvidiaPlugin::from_args(&cli.nvidia).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("--consumable-shares=\"some\""),
            "{error}"
        );
    }

    #[test]
    fn metrics_path_and_image_name_are_read() {
        let cli = parse(&["--mock-profile", "workstation"]).unwrap();
        assert_eq!(cli.nvidia.metrics_path, "/metrics");
        assert_eq!(cli.nvidia.image_name, None);
        NvidiaPlugin::from_args(&cli.nvidia).unwrap();
        let cli = parse(&[
            "--mock-profile",
            "workstation",
            "--metrics-path",
            "/metrics",
            "--image-name",
            "registry.example.com/gpu-kubelet-plugin:0.1.0",
        ])
        .unwrap();
        // Without MPSSupport the image runs nothing.
        let plugin = NvidiaPlugin::from_args(&cli.nvidia).unwrap();
        assert_eq!(plugin.driver.mps_deployments(), None);
        // With it, MPS daemons are Deployments of that image in the plugin's namespace.
        let cli = parse(&[
            "--mock-profile",
            "workstation",
            "--feature-gates",
            "MPSSupport=true",
            "--namespace",
            "nvidia-dra",
            "--image-name",
            "registry.example.com/gpu-kubelet-plugin:0.1.0",
        ])
        .unwrap();
        let plugin = NvidiaPlugin::from_args(&cli.nvidia).unwrap();
        assert_eq!(
            plugin.driver.mps_deployments(),
            Some(&MpsDeploymentConfig::new(
                "nvidia-dra",
                "registry.example.com/gpu-kubelet-plugin:0.1.0"
            ))
        );
        // Upstream's pull and account flags reach the Deployments; empty ones are unset.
        let cli = parse(&[
            "--mock-profile",
            "workstation",
            "--feature-gates",
            "MPSSupport=true",
            "--image-name",
            "registry.example.com/gpu-kubelet-plugin:0.1.0",
            "--image-pull-secrets",
            "registry-a, registry-b,",
            "--image-pull-policy",
            "ifnotpresent",
            "--service-account-name",
            "",
        ])
        .unwrap();
        let plugin = NvidiaPlugin::from_args(&cli.nvidia).unwrap();
        let config = plugin.driver.mps_deployments().unwrap();
        assert_eq!(config.image_pull_secrets, ["registry-a", "registry-b"]);
        assert_eq!(
            config.image_pull_policy,
            Some(ImagePullPolicy::IfNotPresent)
        );
        assert_eq!(config.service_account_name, None);
        let error = parse(&["--image-pull-policy", "Sometimes"]).unwrap_err();
        assert!(error.to_string().contains("IfNotPresent"), "{error}");
        // Any path is the SDK's to check when the HTTP endpoint starts (tests/plugin.rs).
        let cli = parse(&["--mock-profile", "workstation", "--metrics-path", "/m"]).unwrap();
        assert_eq!(cli.nvidia.metrics_path, "/m");
        NvidiaPlugin::from_args(&cli.nvidia).unwrap();
        let cli = parse(&["--mock-profile", "workstation", "--image-name", "a b"]).unwrap();
        let error = NvidiaPlugin::from_args(&cli.nvidia).unwrap_err();
        assert!(error.to_string().starts_with("--image-name="), "{error}");
    }

    #[test]
    fn passthrough_needs_the_host_root() {
        let cli = parse(&[
            "--feature-gates",
            "PassthroughSupport=true",
            "--host-root",
            "/no/such/host-root",
        ])
        .unwrap();
        // Refused before the backend is opened (or waited for).
        let error = NvidiaPlugin::from_args(&cli.nvidia).unwrap_err();
        assert!(
            matches!(error, SetupError::HostRootMissing { .. }),
            "{error}"
        );
    }

    #[test]
    fn help_explains_every_flag() {
        let help = <Cli as clap::CommandFactory>::command()
            .render_long_help()
            .to_string();
        for flag in [
            "--node-name",
            "--cdi-root",
            "--nvidia-driver-root",
            "--container-driver-root",
            "--host-root",
            "--feature-gates",
            "--healthcheck-port",
            "--http-endpoint",
            "--mock-profile",
            "[env: MOCK_PROFILE=]",
            "[env: NVIDIA_DRIVER_ROOT=]",
            "--image-name",
            "[env: IMAGE_NAME=]",
            "--metrics-path",
            "[env: METRICS_PATH=]",
            "--kube-api-qps",
            "[env: KUBE_API_QPS=]",
            "--kube-api-burst",
            "[env: KUBE_API_BURST=]",
        ] {
            assert!(help.contains(flag), "{flag} missing from --help:\n{help}");
        }
    }
}
