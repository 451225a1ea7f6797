//! The kubelet plugin: sockets, registration, the DRA gRPC services and the run loop.
//!
//! [`KubeletPlugin::builder`] takes a [`Driver`] and everything the plugin needs to reach the
//! kubelet and the API server; [`PluginBuilder::start`] brings it up in the order the kubelet
//! expects:
//!
//! 1. open the checkpoint, roll back prepares interrupted by a crash, remove orphaned CDI specs;
//!    then hand the driver its [`DriverContext`] ([`Driver::start`]) and the prepared claims
//!    ([`Driver::reconcile`]);
//! 2. serve `/metrics` and `/healthz`; start publishing the driver's ResourceSlices, which
//!    replaces the slices an earlier run left on the node;
//! 3. serve the DRA service (v1, v1beta1, and the health stream) on
//!    `<plugins dir>/<driver>/dra.sock`;
//! 4. once the slices are published (or after 10 s at most), create the registration socket
//!    in the kubelet's registry directory. Until the slices of an earlier inventory are gone,
//!    the scheduler may still allocate their devices; prepare refuses a device from a pool
//!    or of a name the plugin does not publish, so no device is handed out twice.
//!
//! [`KubeletPlugin::shutdown`] (or [`KubeletPlugin::run_until_signal`] on SIGTERM/SIGINT)
//! removes the registration socket first, so the kubelet deregisters the plugin before its
//! service goes away, then stops everything else. ResourceSlices are left in place: the
//! kubelet wipes them if the plugin stays away, and a restarted plugin finds them unchanged.

pub(crate) mod authority;
pub(crate) mod client;
mod dra;
mod events;
mod node;
pub(crate) mod registration;
mod reports;
pub(crate) mod socket;
mod sweep;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt as _, Stream, StreamExt as _};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinSet;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_stream::wrappers::{BroadcastStream, WatchStream};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::advanced::checkpoint::{Checkpoint, CheckpointError, ForeignCheckpoint};
use crate::advanced::metadata::MetadataWriter;
use crate::cdi::{Kind, SpecWriter};
use crate::claim::{ClaimReader, DriverError, ReadPolicy, RecordedClaim};
use crate::context::DriverContext;
use crate::driver::{Driver, PluginEvent};
use crate::health::HealthSource;
use crate::metrics::{self, HealthProbe, PluginMetrics};
use crate::slices::{DriverResources, PublishEvent, PublisherHandle, ResourceSlicePublisher};

pub(crate) use registration::RegistrationStatus;
pub(crate) use socket::{SocketError, SocketPaths};

use self::dra::{DraV1, DraV1beta1, HealthService};
use self::node::NodeService;
use self::registration::RegistrationService;
use crate::claim::locks::{self, ClaimLocks};

/// Why the plugin could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PluginError {
    /// A socket could not be set up or removed.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// The checkpoint could not be opened or written.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] CheckpointError),
    /// A setting is invalid.
    #[error("invalid plugin setting: {0}")]
    InvalidSetting(String),
    /// Filesystem or network I/O failed.
    #[error("{context}: {source}")]
    Io {
        /// What the plugin was doing.
        context: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The driver's [`Driver::start`] failed, or its [`Driver::reconcile`] failed fatally.
    #[error("driver {hook} failed: {source}")]
    Driver {
        /// `start` or `reconcile`.
        hook: &'static str,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// A gRPC server failed.
    #[error("gRPC server on {socket}: {source}")]
    Server {
        /// Which socket or port.
        socket: String,
        /// The transport error.
        #[source]
        source: tonic::transport::Error,
    },
}

fn io_error(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> PluginError {
    let context = context.into();
    move |source| PluginError::Io { context, source }
}

/// Entry point: see [`KubeletPlugin::builder`].
pub struct KubeletPlugin {
    paths: SocketPaths,
    registration: watch::Receiver<RegistrationStatus>,
    publisher: Option<PublisherHandle>,
    http_addr: Option<SocketAddr>,
    healthcheck_addr: Option<SocketAddr>,
    registration_shutdown: CancellationToken,
    services_shutdown: CancellationToken,
    registration_task: Option<tokio::task::JoinHandle<Result<(), PluginError>>>,
    tasks: JoinSet<Result<(), PluginError>>,
    context: DriverContext,
}

impl Drop for KubeletPlugin {
    fn drop(&mut self) {
        // A plugin dropped without `shutdown` stops too: let the driver's background work know.
        self.context.cancel();
    }
}

impl std::fmt::Debug for KubeletPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletPlugin")
            .field("paths", &self.paths)
            .field("http_addr", &self.http_addr)
            .field("healthcheck_addr", &self.healthcheck_addr)
            .finish_non_exhaustive()
    }
}

/// Configures and starts a [`KubeletPlugin`]; made by [`KubeletPlugin::builder`].
///
/// Every setting has the kubelet's default; [`args`](Self::args) takes the standard flags.
///
/// ```no_run
/// use dra_sdk::claim::{Claim, DriverError, RecordedClaim};
/// use dra_sdk::driver::{Driver, PreparedClaim};
/// use dra_sdk::plugin::KubeletPlugin;
/// use dra_sdk::slices::{Device, DriverResources};
///
/// struct Nothing;
///
/// #[dra_sdk::async_trait]
/// impl Driver for Nothing {
///     type Config = ();
///     async fn prepare(&self, _: &Claim<()>) -> Result<PreparedClaim, DriverError> {
///         Ok(PreparedClaim::new(Vec::new()))
///     }
///     async fn unprepare(&self, _: &RecordedClaim) -> Result<(), DriverError> {
///         Ok(())
///     }
/// }
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let client = kube::Client::try_default().await?;
/// let plugin = KubeletPlugin::builder(Nothing, "nothing.example.com", "node-a", client)
///     .plugins_dir("/var/lib/kubelet/plugins")
///     .cdi_root("/var/run/cdi")
///     .resources(DriverResources::single_pool("node-a", vec![Device::new("dev-0")]))
///     .start()
///     .await?;
/// plugin.published().await;
/// plugin.run_until_signal().await?;
/// # Ok(()) }
/// ```
pub struct PluginBuilder<D: Driver> {
    driver: D,
    driver_name: String,
    node_name: String,
    client: kube::Client,
    registrar_dir: PathBuf,
    plugins_dir: PathBuf,
    cdi_root: PathBuf,
    cdi_kind: Option<Kind>,
    pod_uid: Option<String>,
    boot_id: Option<String>,
    http_endpoint: Option<SocketAddr>,
    metrics_path: String,
    healthcheck_port: Option<u16>,
    resources: Option<DriverResources>,
    health_resend_interval: Duration,
    read_policy: ReadPolicy,
    serialize_operations: bool,
    foreign_checkpoint: Option<Box<dyn ForeignCheckpoint>>,
    skip_node_operations: bool,
    #[cfg(feature = "fault-injection")]
    fault_hook: Option<crate::advanced::fault_injection::FaultHook>,
}

impl KubeletPlugin {
    /// Starts configuring a plugin for `driver`, registered as `driver_name` on `node_name`.
    ///
    /// ```no_run
    /// # use dra_sdk::plugin::KubeletPlugin;
    /// # async fn run(driver: impl dra_sdk::driver::Driver, client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
    /// let plugin = KubeletPlugin::builder(driver, "gpu.example.com", "node-a", client)
    ///     .start()
    ///     .await?;
    /// plugin.run_until_signal().await?;
    /// # Ok(()) }
    /// ```
    pub fn builder<D: Driver>(
        driver: D,
        driver_name: impl Into<String>,
        node_name: impl Into<String>,
        client: kube::Client,
    ) -> PluginBuilder<D> {
        PluginBuilder {
            driver,
            driver_name: driver_name.into(),
            node_name: node_name.into(),
            client,
            registrar_dir: PathBuf::from(crate::DEFAULT_REGISTRAR_DIR),
            plugins_dir: PathBuf::from(crate::DEFAULT_PLUGINS_DIR),
            cdi_root: PathBuf::from(crate::DEFAULT_CDI_ROOT),
            cdi_kind: None,
            pod_uid: None,
            boot_id: None,
            http_endpoint: None,
            metrics_path: metrics::DEFAULT_METRICS_PATH.to_owned(),
            healthcheck_port: None,
            resources: None,
            health_resend_interval: Duration::from_secs(10),
            read_policy: ReadPolicy::default(),
            serialize_operations: false,
            skip_node_operations: false,
            foreign_checkpoint: None,
            #[cfg(feature = "fault-injection")]
            fault_hook: None,
        }
    }

    /// The plugin's socket paths.
    pub fn socket_paths(&self) -> &SocketPaths {
        &self.paths
    }

    /// The kubelet's latest verdict on the registration.
    pub fn registration_status(&self) -> watch::Receiver<RegistrationStatus> {
        self.registration.clone()
    }

    /// Resolves once the devices last given to [`DriverContext::publish`] (or to
    /// [`PluginBuilder::resources`]) are written to the API server and observed; at once when
    /// the plugin publishes nothing. Devices are published only through the context, so that
    /// device states and their taints stay in every update.
    pub async fn published(&self) {
        if let Some(publisher) = &self.publisher {
            publisher.synced().await;
        }
    }

    /// The context the driver received in [`Driver::start`].
    pub fn context(&self) -> &DriverContext {
        &self.context
    }

    /// Where `/metrics` and `/healthz` are served, if enabled.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    /// Where the gRPC health service for liveness probes listens, if enabled.
    pub fn healthcheck_addr(&self) -> Option<SocketAddr> {
        self.healthcheck_addr
    }

    /// Runs until SIGTERM or SIGINT, or until a component fails, then shuts down cleanly.
    pub async fn run_until_signal(mut self) -> Result<(), PluginError> {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .map_err(io_error("installing the SIGTERM handler"))?;
        let failure = tokio::select! {
            _ = terminate.recv() => { tracing::info!("SIGTERM received, shutting down"); None }
            _ = tokio::signal::ctrl_c() => { tracing::info!("SIGINT received, shutting down"); None }
            failure = self.wait_for_failure() => Some(failure),
        };
        let shutdown = self.shutdown().await;
        match failure {
            Some(error) => Err(error),
            None => shutdown,
        }
    }

    /// Resolves when a background component fails (it never resolves otherwise).
    async fn wait_for_failure(&mut self) -> PluginError {
        loop {
            match self.tasks.join_next().await {
                Some(Ok(Ok(()))) => continue,
                Some(Ok(Err(error))) => return error,
                Some(Err(join_error)) => {
                    return PluginError::Io {
                        context: "a plugin task panicked".into(),
                        source: std::io::Error::other(join_error.to_string()),
                    };
                }
                None => std::future::pending::<()>().await,
            }
        }
    }

    /// Stops the plugin: the registration socket goes first, then the services and sockets.
    /// ResourceSlices stay published.
    pub async fn shutdown(mut self) -> Result<(), PluginError> {
        let mut first_error = None;
        self.context.cancel();
        self.registration_shutdown.cancel();
        if let Some(task) = self.registration_task.take()
            && let Ok(Err(error)) = task.await
        {
            first_error.get_or_insert(error);
        }
        if let Err(error) = socket::remove_socket(&self.paths.registration) {
            first_error.get_or_insert(error.into());
        }
        self.services_shutdown.cancel();
        while let Some(result) = self.tasks.join_next().await {
            if let Ok(Err(error)) = result {
                first_error.get_or_insert(error);
            }
        }
        if let Err(error) = socket::remove_socket(&self.paths.dra) {
            first_error.get_or_insert(error.into());
        }
        if let Some(publisher) = self.publisher.take() {
            publisher.stop().await;
        }
        tracing::info!("plugin stopped");
        first_error.map_or(Ok(()), Err)
    }
}

impl<D: Driver> PluginBuilder<D> {
    /// Directory the kubelet watches for registration sockets.
    pub fn registrar_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.registrar_dir = dir.into();
        self
    }

    /// Kubelet plugins directory; the plugin uses `<dir>/<driver name>/` for its DRA socket
    /// and checkpoint.
    pub fn plugins_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.plugins_dir = dir.into();
        self
    }

    /// CDI spec directory read by the container runtime.
    pub fn cdi_root(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cdi_root = dir.into();
        self
    }

    /// CDI kind of the generated specs. Default: `k8s.<driver name>/<first label of the driver
    /// name>`, e.g. `k8s.gpu.example.com/gpu`.
    pub fn cdi_kind(mut self, kind: Kind) -> Self {
        self.cdi_kind = Some(kind);
        self
    }

    /// Enables rolling-update mode with the plugin pod's UID.
    pub fn pod_uid(mut self, pod_uid: impl Into<String>) -> Self {
        self.pod_uid = Some(pod_uid.into());
        self
    }

    /// Overrides the node's boot ID (normally read from the kernel); for tests.
    pub fn boot_id(mut self, boot_id: impl Into<String>) -> Self {
        self.boot_id = Some(boot_id.into());
        self
    }

    /// Serves `/metrics` and `/healthz` on this address.
    pub fn http_endpoint(mut self, addr: SocketAddr) -> Self {
        self.http_endpoint = Some(addr);
        self
    }

    /// Serves the metrics at this path of the HTTP endpoint instead of `/metrics` (upstream
    /// drivers' `--metrics-path`). The path must start with `/`, use only letters, digits and
    /// `/ - _ .`, and not be `/healthz`; [`start`](Self::start) fails with
    /// [`PluginError::InvalidSetting`] otherwise.
    pub fn metrics_path(mut self, path: impl Into<String>) -> Self {
        self.metrics_path = path.into();
        self
    }

    /// Serves the gRPC health service on this TCP port (0 picks one).
    pub fn healthcheck_port(mut self, port: u16) -> Self {
        self.healthcheck_port = Some(port);
        self
    }

    /// Publishes these resources as the node's ResourceSlices; update them later through
    /// [`DriverContext::publish`]. A driver may instead publish its first resources from
    /// [`Driver::start`].
    pub fn resources(mut self, resources: DriverResources) -> Self {
        self.resources = Some(resources);
        self
    }

    /// How often the health stream re-sends an unchanged device list (default 10 s; the
    /// kubelet treats a device as unknown after 30 s without news).
    pub fn health_resend_interval(mut self, interval: Duration) -> Self {
        self.health_resend_interval = interval;
        self
    }

    /// Serializes prepare and unprepare node-wide, for drivers whose hardware operations must
    /// not overlap (MIG placement, VFIO rebinding). Off by default: claims run in parallel.
    ///
    /// When on, one batch at a time runs the driver and writes its checkpoint records, across
    /// this process and every other instance of the plugin on the node (a rolling update: the
    /// lock is an `flock` on `<plugins dir>/<driver>/operations.lock`); the start-up rollback and
    /// [`Driver::reconcile`] hold the same lock, so they never see another instance's prepare
    /// half-done. Reading claims from the API server stays concurrent.
    pub fn serialize_operations(mut self, serialize: bool) -> Self {
        self.serialize_operations = serialize;
        self
    }

    /// Takes over the checkpoint of another implementation of this driver found at start
    /// (`<plugins dir>/<driver>/checkpoint.json` in another format) instead of moving it aside
    /// as corrupt: see [`ForeignCheckpoint`]. When it refuses, [`start`](Self::start) fails
    /// with [`PluginError::Checkpoint`] carrying its message, and the file is left as it was.
    pub fn foreign_checkpoint(mut self, foreign: impl ForeignCheckpoint + 'static) -> Self {
        self.foreign_checkpoint = Some(Box::new(foreign));
        self
    }

    /// Declares that this driver's devices need no node preparation: its ResourceSlices carry
    /// `skipNodeOperations` (Kubernetes 1.37 alpha, `DRAOptionalNodeOperations`; see
    /// [`ResourceSlicePublisher::skip_node_operations`](crate::advanced::slices::ResourceSlicePublisher::skip_node_operations)),
    /// so a kubelet with the gate skips
    /// prepare and unprepare for claims that only use such devices.
    ///
    /// The plugin keeps serving both calls unchanged: older kubelets, kubelets without the
    /// gate and servers that drop the field still make them, and claims allocated before the
    /// change keep the setting they were allocated with.
    pub fn skip_node_operations(mut self) -> Self {
        self.skip_node_operations = true;
        self
    }

    /// Retry policy for ResourceClaim reads.
    pub fn claim_read_policy(mut self, policy: ReadPolicy) -> Self {
        self.read_policy = policy;
        self
    }

    /// Bounds each ResourceClaim read of a prepare: discovery, every attempt, the client's
    /// retries of 429/503/504 (honouring `Retry-After`), dropped connections and the waits in
    /// between. A claim whose read does not finish in time fails alone with
    /// `reading ResourceClaim <namespace>/<name>: timed out after …`, and the kubelet retries
    /// the prepare later, instead of the whole call hanging until the kubelet's 45 s deadline.
    /// Default 10 s; `--claim-read-timeout` sets it from the command line. It is
    /// [`ReadPolicy::budget`](crate::advanced::claim::ReadPolicy::budget): a later
    /// [`claim_read_policy`](Self::claim_read_policy) replaces it.
    pub fn claim_read_timeout(mut self, timeout: Duration) -> Self {
        self.read_policy.budget = timeout;
        self
    }

    /// Test-only (feature `fault-injection`): calls `hook` at each named step of prepare and
    /// unprepare ([`Step`](crate::advanced::fault_injection::Step)), on the task doing the
    /// work, before the next side effect starts. A crash test kills the process from it.
    #[cfg(feature = "fault-injection")]
    pub fn fault_hook(
        mut self,
        hook: impl Fn(crate::advanced::fault_injection::Step) + Send + Sync + 'static,
    ) -> Self {
        self.fault_hook = Some(Arc::new(hook));
        self
    }

    /// Applies the command-line flags.
    #[cfg(feature = "cli")]
    pub fn args(mut self, args: &crate::cli::PluginArgs) -> Result<Self, PluginError> {
        self.registrar_dir = args.kubelet_registrar_directory_path.clone();
        self.plugins_dir = args.kubelet_plugins_directory_path.clone();
        self.cdi_root = args.cdi_root.clone();
        self.pod_uid = args.pod_uid.clone().filter(|uid| !uid.is_empty());
        self.http_endpoint = args
            .http_endpoint()
            .map_err(|e| PluginError::InvalidSetting(e.to_string()))?;
        self.healthcheck_port = args
            .healthcheck_port()
            .map_err(|e| PluginError::InvalidSetting(e.to_string()))?;
        self.read_policy.budget = args.claim_read_timeout;
        Ok(self)
    }

    /// Starts the plugin. Must be called inside a tokio runtime.
    pub async fn start(self) -> Result<KubeletPlugin, PluginError> {
        let span = tracing::info_span!("plugin", driver = %self.driver_name);
        self.start_steps().instrument(span).await
    }

    /// The steps of [`start`](Self::start), in order: directories, checkpoint, node service,
    /// recovery and the driver's start, the HTTP and gRPC health endpoints, the publisher,
    /// the DRA server, the publisher's first sync, registration.
    async fn start_steps(self) -> Result<KubeletPlugin, PluginError> {
        // Settings first: a start that fails later has already bound sockets.
        metrics::check_metrics_path(&self.metrics_path).map_err(PluginError::InvalidSetting)?;
        let driver_name = self.driver_name.clone();
        let paths = SocketPaths::new(
            &driver_name,
            &self.registrar_dir,
            &self.plugins_dir,
            self.pod_uid.as_deref(),
        )?;
        let cdi_kind = match self.cdi_kind {
            Some(kind) => kind,
            None => default_cdi_kind(&driver_name)?,
        };
        let data_dir = self.plugins_dir.join(&driver_name);
        create_private_dir(&data_dir)?;
        create_dir(&self.cdi_root)?;

        let driver = Arc::new(self.driver);
        let boot_id = match self.boot_id {
            Some(id) => id,
            None => crate::advanced::checkpoint::current_boot_id()?,
        };
        let (checkpoint, report) = match &self.foreign_checkpoint {
            Some(foreign) => Checkpoint::open_migrating(&data_dir, boot_id, foreign.as_ref())?,
            None => Checkpoint::open(&data_dir, boot_id)?,
        };
        if let Some(moved_to) = report.corrupt_moved_to.clone() {
            driver.on_event(&PluginEvent::CheckpointCorrupt { moved_to });
        }
        if report.discarded_other_boot {
            driver.on_event(&PluginEvent::CheckpointFromOtherBoot);
        }

        let (plugin_metrics, registry) = PluginMetrics::new(&driver_name);
        let checkpoint = Arc::new(checkpoint);
        let locks = ClaimLocks::default();
        let context = DriverContext::new(
            driver_name.clone(),
            self.node_name.clone(),
            Arc::clone(&checkpoint),
            locks.clone(),
            self.resources,
        );
        context.attach_client(self.client.clone());
        let serial = if self.serialize_operations {
            let path = data_dir.join("operations.lock");
            Some(
                locks::NodeLock::open(path.clone())
                    .map_err(io_error(format!("opening {}", path.display())))?,
            )
        } else {
            None
        };
        let claims_lock = data_dir.join("claims.lock");
        let claim_files = locks::ClaimFileLocks::open(claims_lock.clone())
            .map_err(io_error(format!("opening {}", claims_lock.display())))?;
        let node = Arc::new(NodeService {
            registry: driver.config_registry(),
            driver: Arc::clone(&driver),
            driver_name: driver_name.clone(),
            reader: ClaimReader::new(self.client.clone(), self.read_policy),
            checkpoint,
            cdi: SpecWriter::new(self.cdi_root.clone(), cdi_kind),
            locks,
            claim_files,
            metrics: plugin_metrics,
            serial,
            reports: reports::ClaimReports::new(
                driver.as_ref(),
                context.clone(),
                MetadataWriter::new(&driver_name, &data_dir, self.cdi_root.clone()),
            ),
            #[cfg(feature = "fault-injection")]
            fault_hook: self.fault_hook.clone(),
        });

        // If anything below fails, the driver's background work (started in `Driver::start`)
        // must stop with the plugin that never ran.
        let cancel_on_error = context.cancellation_token().drop_guard();
        recover_and_start_driver(&node, &context, &report).await?;
        let health = health_source(driver.as_ref(), &context);

        let services_shutdown = CancellationToken::new();
        let registration_shutdown = CancellationToken::new();
        // Dropping the set on an early return aborts every task in it (and closes its
        // listener), so a start that fails leaves nothing served.
        let mut tasks = JoinSet::new();
        // The ports first, the sockets last: whatever can still fail comes before the kubelet
        // can see the plugin. Until the sockets exist, the probes on these ports answer
        // "not serving".
        let registry = Arc::new(Mutex::new(registry));
        let probe = socket_probe(paths.clone());
        let http_addr = match self.http_endpoint {
            Some(addr) => Some(
                spawn_http(
                    addr,
                    &self.metrics_path,
                    Arc::clone(&registry),
                    Arc::clone(&probe),
                    &services_shutdown,
                    &mut tasks,
                )
                .await?,
            ),
            None => None,
        };
        let healthcheck_addr = match self.healthcheck_port {
            Some(port) => {
                Some(spawn_healthcheck(port, probe, services_shutdown.clone(), &mut tasks).await?)
            }
            None => None,
        };
        // The publisher before the kubelet can call: at start it replaces the slices an
        // earlier run of the driver left on this node (another inventory: a GPU lost or
        // replaced, partitioning switched), and until those are gone the scheduler may still
        // allocate their devices. Registration waits for that, within a bound.
        let publisher = context.initial_resources().map(|resources| {
            let mut publisher = ResourceSlicePublisher::for_node(
                self.client.clone(),
                &driver_name,
                &self.node_name,
            );
            if self.skip_node_operations {
                publisher = publisher.skip_node_operations();
            }
            tasks.spawn(forward_events(
                publish_events(publisher.subscribe()),
                Arc::clone(&driver),
                services_shutdown.clone(),
            ));
            let handle = publisher.spawn(resources);
            if let Ok(mut registry) = registry.lock() {
                handle.register_metrics(&mut registry);
            }
            handle
        });
        context.attach_publisher(publisher.as_ref().map(PublisherHandle::updater));
        // DRA service before registration: the kubelet may call it as soon as it registers.
        spawn_dra_server(
            &node,
            events::ClaimEvents::new(self.client.clone(), &driver_name, &self.node_name),
            &paths,
            health.clone(),
            self.health_resend_interval,
            &services_shutdown,
            &mut tasks,
        )
        .await?;
        if let Some(publisher) = &publisher {
            wait_for_first_sync(publisher).await;
        }
        let (registration_task, registration) = match spawn_registration(
            &driver_name,
            &paths,
            health.is_some(),
            &registration_shutdown,
        ) {
            Ok(registration) => registration,
            Err(error) => {
                // The DRA server's task goes with `tasks`; its socket file must go too, or the
                // next start would find a stale socket.
                services_shutdown.cancel();
                let _ = std::fs::remove_file(&paths.dra);
                return Err(error);
            }
        };
        tasks.spawn(forward_events(
            registration_events(registration.clone()),
            Arc::clone(&driver),
            services_shutdown.clone(),
        ));
        tracing::info!(
            registration = %paths.registration.display(),
            endpoint = %paths.dra.display(),
            "plugin sockets ready"
        );

        cancel_on_error.disarm();
        Ok(KubeletPlugin {
            paths,
            registration,
            publisher,
            http_addr,
            healthcheck_addr,
            registration_shutdown,
            services_shutdown,
            registration_task: Some(registration_task),
            tasks,
            context,
        })
    }
}

/// How long registration waits for the publisher's first sync at start.
const FIRST_SYNC_WAIT: Duration = Duration::from_secs(10);

/// Waits, at most [`FIRST_SYNC_WAIT`], until the publisher has written the node's slices (and
/// deleted stale ones). An API server that does not answer in time must not keep the plugin
/// from the kubelet: claims already prepared still need unpreparing.
async fn wait_for_first_sync(publisher: &PublisherHandle) {
    if tokio::time::timeout(FIRST_SYNC_WAIT, publisher.synced())
        .await
        .is_err()
    {
        tracing::warn!(
            waited = ?FIRST_SYNC_WAIT,
            "the ResourceSlices are not published yet; registering with the kubelet anyway"
        );
    }
}

fn create_dir(dir: &std::path::Path) -> Result<(), PluginError> {
    std::fs::create_dir_all(dir).map_err(io_error(format!("creating {}", dir.display())))
}

/// Mode of the plugin's own directory (`<plugins dir>/<driver>`: sockets, checkpoint, lock
/// files, metadata files): only root (the kubelet, the container runtime, the plugin itself)
/// goes in. Workloads read their metadata files through a bind mount of a directory below,
/// which the runtime sets up as root, so they need no access to this one.
const DATA_DIR_MODE: u32 = 0o700;

/// Creates the plugin's own directory with [`DATA_DIR_MODE`], and narrows an existing one
/// (an earlier version created it from the umask): the directory is the driver's alone.
fn create_private_dir(dir: &std::path::Path) -> Result<(), PluginError> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DATA_DIR_MODE)
        .create(dir)
        .map_err(io_error(format!("creating {}", dir.display())))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(DATA_DIR_MODE))
        .map_err(io_error(format!("setting the mode of {}", dir.display())))
}

/// Rolls back what an earlier instance left half-done and hands the driver its context and
/// the prepared claims, all under the node-wide operation lock (when the driver asked for
/// serialization), so another instance's prepare is never seen half-done.
async fn recover_and_start_driver<D: Driver>(
    node: &NodeService<D>,
    context: &DriverContext,
    report: &crate::advanced::checkpoint::OpenReport,
) -> Result<(), PluginError> {
    let startup_serial = node
        .serialize()
        .await
        .map_err(io_error("taking the node-wide operation lock"))?;
    // Sweeping CDI specs needs a checkpoint read intact: an empty one standing in for a
    // corrupt, missing or other-boot file would name every prepared claim an orphan.
    let sweep = report.is_clean() && !report.created;
    node.recover(sweep).await?;
    start_driver(&node.driver, context).await?;
    drop(startup_serial);
    Ok(())
}

/// The health source the plugin serves: the context's device states, when the driver reports
/// health through them.
fn health_source<D: Driver>(driver: &D, context: &DriverContext) -> Option<HealthSource> {
    driver.reports_health().then(|| context.health_source())
}

/// Binds the DRA socket and serves both DRA API versions, the gRPC health service and the
/// resource-health stream on it until `shutdown`.
async fn spawn_dra_server<D: Driver>(
    node: &Arc<NodeService<D>>,
    events: events::ClaimEvents,
    paths: &SocketPaths,
    health: Option<HealthSource>,
    resend_interval: Duration,
    shutdown: &CancellationToken,
    tasks: &mut JoinSet<Result<(), PluginError>>,
) -> Result<(), PluginError> {
    let (health_reporter, grpc_health) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<crate::proto::dra_v1::dra_plugin_server::DraPluginServer<DraV1<D>>>()
        .await;
    health_reporter
        .set_serving::<crate::proto::dra_v1beta1::dra_plugin_server::DraPluginServer<DraV1beta1<D>>>()
        .await;
    let dra_listener = socket::bind_private(&paths.dra)?;
    // Served even for a driver without health, though then not advertised: see
    // `HealthService`.
    // One health service, both versions (v1 for 1.37 kubelets, v1alpha1 for 1.34-1.36).
    let health_service = HealthService {
        source: health,
        resend_interval,
        shutdown: shutdown.clone(),
    };
    let health_v1 =
        crate::proto::health_v1::dra_resource_health_server::DraResourceHealthServer::new(
            health_service.clone(),
        );
    let health_v1alpha1 =
        crate::proto::health_v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(
            health_service,
        );
    let dra_router = tonic::transport::Server::builder()
        .add_service(
            crate::proto::dra_v1::dra_plugin_server::DraPluginServer::new(DraV1 {
                node: Arc::clone(node),
                events: events.clone(),
            }),
        )
        .add_service(
            crate::proto::dra_v1beta1::dra_plugin_server::DraPluginServer::new(DraV1beta1 {
                node: Arc::clone(node),
                events,
            }),
        )
        .add_service(grpc_health)
        .add_service(health_v1)
        .add_service(health_v1alpha1);
    let dra_socket = paths.dra.display().to_string();
    let token = shutdown.clone();
    tasks.spawn(async move {
        dra_router
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(dra_listener),
                token.cancelled_owned(),
            )
            .await
            .map_err(|source| PluginError::Server {
                socket: dra_socket,
                source,
            })
    });
    Ok(())
}

/// The registration server's task and the receiver of the kubelet's verdicts.
type Registration = (
    tokio::task::JoinHandle<Result<(), PluginError>>,
    watch::Receiver<RegistrationStatus>,
);

/// Binds the registration socket and serves `GetInfo` and the kubelet's verdicts on it until
/// `shutdown`.
fn spawn_registration(
    driver_name: &str,
    paths: &SocketPaths,
    serves_health: bool,
    shutdown: &CancellationToken,
) -> Result<Registration, PluginError> {
    let info = registration::plugin_info(driver_name, &paths.dra, serves_health);
    let (registration_service, registration) = RegistrationService::new(info);
    let registration_listener = socket::bind_private(&paths.registration)?;
    let registration_socket = paths.registration.display().to_string();
    let token = shutdown.clone();
    let task = tokio::spawn(async move {
        registration::serve_registration(
            registration_listener,
            registration_service,
            token.cancelled_owned(),
        )
        .await
        .map_err(|source| PluginError::Server {
            socket: registration_socket,
            source,
        })
    });
    Ok((task, registration))
}

/// Serves the metrics and `/healthz` on `addr` until `shutdown`; the address actually bound.
async fn spawn_http(
    addr: SocketAddr,
    metrics_path: &str,
    registry: Arc<Mutex<prometheus_client::registry::Registry>>,
    probe: HealthProbe,
    shutdown: &CancellationToken,
    tasks: &mut JoinSet<Result<(), PluginError>>,
) -> Result<SocketAddr, PluginError> {
    let listener = metrics::bind_http(addr)
        .await
        .map_err(io_error(format!("binding the HTTP endpoint {addr}")))?;
    let bound = listener
        .local_addr()
        .map_err(io_error("reading the HTTP endpoint address"))?;
    let token = shutdown.clone();
    let metrics_path = metrics_path.to_owned();
    tasks.spawn(async move {
        metrics::serve_http(
            listener,
            &metrics_path,
            registry,
            probe,
            token.cancelled_owned(),
        )
        .await
        .map_err(io_error(format!("serving HTTP on {bound}")))
    });
    Ok(bound)
}

/// Hands the driver its context, then the claims prepared before this start. Runs before the
/// plugin registers, so no kubelet call overlaps it.
async fn start_driver<D: Driver>(
    driver: &Arc<D>,
    context: &DriverContext,
) -> Result<(), PluginError> {
    driver
        .start(context)
        .instrument(tracing::info_span!("driver_start"))
        .await
        .map_err(|source| PluginError::Driver {
            hook: "start",
            source,
        })?;
    let prepared: Vec<RecordedClaim> = match context.prepared_claims().await {
        Ok(prepared) => prepared,
        Err(error) => {
            return Err(PluginError::Driver {
                hook: "reconcile",
                source: error.into(),
            });
        }
    };
    let outcome = std::panic::AssertUnwindSafe(driver.reconcile(&prepared))
        .catch_unwind()
        .instrument(tracing::info_span!(
            "driver_reconcile",
            claims = prepared.len()
        ))
        .await;
    let error = match outcome {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(error)) => error,
        Err(panic) => crate::driver::ReconcileError::fatal(DriverError::other(format!(
            "the driver panicked: {}",
            node::panic_message(panic.as_ref())
        ))),
    };
    if error.is_fatal() {
        tracing::error!(%error, "start-up reconcile failed; the plugin does not start");
        return Err(PluginError::Driver {
            hook: "reconcile",
            source: error.into_source(),
        });
    }
    tracing::warn!(%error, "start-up reconcile failed; starting anyway");
    driver.on_event(&PluginEvent::ReconcileFailed {
        error: error.to_string(),
    });
    Ok(())
}

/// `k8s.<driver>/<first DNS label of the driver>`: the convention of the example drivers.
fn default_cdi_kind(driver_name: &str) -> Result<Kind, PluginError> {
    let class = driver_name.split('.').next().unwrap_or(driver_name);
    Kind::new(format!("k8s.{driver_name}"), class).map_err(|error| {
        PluginError::InvalidSetting(format!(
            "no valid default CDI kind for driver {driver_name:?} ({error}); set one with cdi_kind()"
        ))
    })
}

/// The kubelet's verdicts on the registration, as driver events.
fn registration_events(
    status: watch::Receiver<RegistrationStatus>,
) -> impl Stream<Item = PluginEvent> + Send + 'static {
    WatchStream::from_changes(status).filter_map(|status| async move {
        match status {
            RegistrationStatus::Registered => Some(PluginEvent::Registered),
            RegistrationStatus::Rejected { error } => {
                Some(PluginEvent::RegistrationRejected { error })
            }
            RegistrationStatus::Pending => None,
        }
    })
}

/// The publisher's events, as driver events.
fn publish_events(
    events: broadcast::Receiver<PublishEvent>,
) -> impl Stream<Item = PluginEvent> + Send + 'static {
    BroadcastStream::new(events).filter_map(|event| async move {
        match event {
            Ok(event) => Some(PluginEvent::Publish(event)),
            Err(BroadcastStreamRecvError::Lagged(missed)) => {
                tracing::warn!(missed, "the driver fell behind the ResourceSlice publisher's events; the oldest were dropped");
                None
            }
        }
    })
}

/// Hands `events` to the driver until they end or the plugin stops.
async fn forward_events<D: Driver>(
    events: impl Stream<Item = PluginEvent> + Send + 'static,
    driver: Arc<D>,
    shutdown: CancellationToken,
) -> Result<(), PluginError> {
    let mut events = std::pin::pin!(events.take_until(shutdown.cancelled_owned()));
    while let Some(event) = events.next().await {
        driver.on_event(&event);
    }
    Ok(())
}

/// Checks that both sockets answer real gRPC calls.
fn socket_probe(paths: SocketPaths) -> HealthProbe {
    Arc::new(move || {
        let paths = paths.clone();
        Box::pin(async move {
            const TIMEOUT: Duration = Duration::from_secs(5);
            let check = async {
                let channel = client::unix_channel(&paths.registration)
                    .await
                    .map_err(|e| format!("registration socket: {e}"))?;
                crate::proto::pluginregistration::registration_client::RegistrationClient::new(
                    channel,
                )
                .get_info(crate::proto::pluginregistration::InfoRequest {})
                .await
                .map_err(|e| format!("registration socket GetInfo: {e}"))?;
                let channel = client::unix_channel(&paths.dra)
                    .await
                    .map_err(|e| format!("DRA socket: {e}"))?;
                let response = tonic_health::pb::health_client::HealthClient::new(channel)
                    .check(tonic_health::pb::HealthCheckRequest {
                        service: String::new(),
                    })
                    .await
                    .map_err(|e| format!("DRA socket health check: {e}"))?;
                if response.into_inner().status
                    != tonic_health::pb::health_check_response::ServingStatus::Serving as i32
                {
                    return Err("DRA socket reports not serving".to_string());
                }
                Ok(())
            };
            tokio::time::timeout(TIMEOUT, check)
                .await
                .unwrap_or_else(|_| Err("sockets did not answer within 5 s".to_string()))
        })
    })
}

/// The gRPC health service for liveness probes: `Check` probes both sockets.
struct SocketHealth {
    probe: HealthProbe,
}

#[tonic::async_trait]
impl tonic_health::pb::health_server::Health for SocketHealth {
    async fn check(
        &self,
        _request: tonic::Request<tonic_health::pb::HealthCheckRequest>,
    ) -> Result<tonic::Response<tonic_health::pb::HealthCheckResponse>, tonic::Status> {
        use tonic_health::pb::health_check_response::ServingStatus;
        let status = match (self.probe)().await {
            Ok(()) => ServingStatus::Serving,
            Err(error) => {
                tracing::warn!(%error, "health check failed");
                ServingStatus::NotServing
            }
        };
        Ok(tonic::Response::new(
            tonic_health::pb::HealthCheckResponse {
                status: status as i32,
            },
        ))
    }

    type WatchStream = std::pin::Pin<
        Box<
            dyn futures::Stream<Item = Result<tonic_health::pb::HealthCheckResponse, tonic::Status>>
                + Send,
        >,
    >;

    async fn watch(
        &self,
        _request: tonic::Request<tonic_health::pb::HealthCheckRequest>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        Err(tonic::Status::unimplemented(
            "Watch is not supported by this health endpoint; use Check",
        ))
    }
}

async fn spawn_healthcheck(
    port: u16,
    probe: HealthProbe,
    shutdown: CancellationToken,
    tasks: &mut JoinSet<Result<(), PluginError>>,
) -> Result<SocketAddr, PluginError> {
    let listener = crate::metrics::bind_tcp((std::net::Ipv6Addr::UNSPECIFIED, port).into())
        .await
        .map_err(io_error(format!("binding the health check port {port}")))?;
    let addr = listener
        .local_addr()
        .map_err(io_error("reading the health check address"))?;
    let server = tonic::transport::Server::builder().add_service(
        tonic_health::pb::health_server::HealthServer::new(SocketHealth { probe }),
    );
    tasks.spawn(async move {
        server
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                shutdown.cancelled_owned(),
            )
            .await
            .map_err(|source| PluginError::Server {
                socket: addr.to_string(),
                source,
            })
    });
    Ok(addr)
}
