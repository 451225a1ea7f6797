//! An embedded test cluster: the fake API server with a Node, and temporary kubelet
//! directories for plugins, so a driver runs exactly as on a node, minus the node.
//!
//! One call starts everything, the driver's plugin included, and the helpers create
//! DeviceClasses and ResourceClaims through the API and allocate them from the plugin's
//! published ResourceSlices like the scheduler:
//!
//! ```no_run
//! # async fn demo(driver: impl dra_sdk::driver::Driver) -> Result<(), Box<dyn std::error::Error>> {
//! use dra_sdk::slices::{Device, DriverResources};
//! use dra_sdk_testing::cluster::{NODE_NAME, NewClaim, TestCluster};
//!
//! let resources = DriverResources::single_pool(NODE_NAME, vec![Device::new("gpu-0")]);
//! // API server, Node, plugin, published slices, a DeviceClass named after the driver and a
//! // registered kubelet.
//! let running = TestCluster::start_with(driver, "gpu.example.com", resources).await?;
//! let cluster = running.cluster();
//! cluster
//!     .create_claim(NewClaim::new("default", "gpu").request("gpu", "gpu.example.com"))
//!     .await?;
//! let claim = cluster.allocate("default", "gpu").await?;
//! let prepared = running.kubelet().prepare(&[claim.clone()]).await?;
//! assert!(prepared[&claim.uid].is_ok());
//! running.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! The parts can also be put together by hand:
//!
//! ```no_run
//! # async fn demo(driver: impl dra_sdk::driver::Driver) -> Result<(), Box<dyn std::error::Error>> {
//! use dra_sdk_testing::cluster::TestCluster;
//! use dra_sdk_testing::kubelet::KubeletVersion;
//!
//! let cluster = TestCluster::start().await?;
//! let plugin = cluster.plugin(driver, "gpu.example.com").start().await?;
//! let kubelet = cluster.register(&plugin, KubeletVersion::V1_36).await?;
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{Device, DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

use crate::apiserver::FakeApiServer;
use crate::kubelet::{KubeletError, KubeletSimulator, KubeletVersion, RegisteredPlugin};
use dra_sdk::claim::ClaimRef;
use dra_sdk::driver::Driver;
use dra_sdk::plugin::{KubeletPlugin, PluginBuilder, PluginError};
use dra_sdk::slices::DriverResources;
use dra_sdk_allocator::{AllocateClaimError, allocate_claim};

/// Name of the node every test cluster has.
pub const NODE_NAME: &str = "test-node";
/// Boot ID the plugins of a test cluster see; restarts within a test keep it.
pub const BOOT_ID: &str = "00000000-0000-4000-8000-000000000001";

/// How long [`TestCluster::start_with`] waits for the plugin's ResourceSlices.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// Polls `check` every 20 ms until it holds; panics after 30 seconds, naming `what`. For
/// waiting on a plugin process (its sockets, its slices) from a multi-threaded test.
pub async fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The devices of every ResourceSlice of `driver`, listed through `client` every 50 ms until
/// `done` holds for them; panics after 10 seconds, naming `what` and the last devices seen.
pub async fn wait_for_devices(
    client: &kube::Client,
    driver: &str,
    what: &str,
    done: impl Fn(&[Device]) -> bool,
) -> Vec<Device> {
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let devices: Vec<Device> = api
            .list(&ListParams::default())
            .await
            .expect("listing ResourceSlices")
            .items
            .into_iter()
            .filter(|slice| slice.spec.driver == driver)
            .flat_map(|slice| slice.spec.devices.unwrap_or_default())
            .collect();
        if done(&devices) {
            return devices;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {devices:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Why the test cluster could not start, or a helper failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// A directory could not be set up.
    #[error("starting the test cluster: {0}")]
    Io(#[from] std::io::Error),
    /// The fake API server could not start or store the Node.
    #[error("starting the test cluster's API server: {0}")]
    ApiServer(#[from] crate::apiserver::Error),
    /// The plugin could not start or stop.
    #[error("plugin: {0}")]
    Plugin(#[from] PluginError),
    /// The simulated kubelet could not register the plugin.
    #[error("registering the plugin with the simulated kubelet: {0}")]
    Register(#[from] KubeletError),
    /// An API request failed.
    #[error("{action}: {source}")]
    Api {
        /// What was being done, e.g. `create ResourceClaim default/gpu`.
        action: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// A claim could not be allocated.
    #[error(transparent)]
    Allocate(#[from] AllocateClaimError),
    /// The plugin's ResourceSlices were not written in time.
    #[error("the plugin of {driver} did not publish its ResourceSlices within {timeout:?}")]
    PublishTimeout {
        /// The driver.
        driver: String,
        /// How long it was given.
        timeout: Duration,
    },
    /// The API server returned an object without a field every stored object has.
    #[error("{object} as returned by the API server has no {field}")]
    Incomplete {
        /// `namespace/name` of the object.
        object: String,
        /// The missing field, e.g. `metadata.uid`.
        field: &'static str,
    },
}

fn api_error(action: impl Into<String>) -> impl FnOnce(kube::Error) -> ClusterError {
    let action = action.into();
    move |source| ClusterError::Api { action, source }
}

/// The fake API server, a Node, and kubelet directories in a temporary folder.
pub struct TestCluster {
    api: FakeApiServer,
    client: kube::Client,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for TestCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCluster")
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl TestCluster {
    /// Starts the API server and creates the Node [`NODE_NAME`].
    pub async fn start() -> Result<Self, ClusterError> {
        Self::start_on(FakeApiServer::start().await?)
    }

    /// Like [`start`](Self::start), on an API server configured by the caller (another
    /// Kubernetes release with [`git_version`](crate::apiserver::FakeApiServerBuilder::git_version),
    /// other served versions).
    pub fn start_on(api: FakeApiServer) -> Result<Self, ClusterError> {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": { "name": NODE_NAME, "labels": { "kubernetes.io/hostname": NODE_NAME } },
        }))
        .map_err(std::io::Error::other)?;
        api.insert(&node)?;
        // Short paths keep socket names far from the 108-byte limit.
        let dir = tempfile::Builder::new().prefix("dra").tempdir()?;
        for sub in ["registry", "plugins", "cdi"] {
            std::fs::create_dir_all(dir.path().join(sub))?;
        }
        let client = api.client()?;
        Ok(Self { api, client, dir })
    }

    /// Starts a cluster with `driver`'s plugin running in it, in one call: the API server and
    /// Node of [`start`](Self::start), the plugin on the cluster's directories publishing
    /// `resources` (this waits until the ResourceSlices are written), a DeviceClass named
    /// `driver_name` that selects every device of the driver, and a simulated kubelet
    /// (release 1.36) that registered the plugin.
    pub async fn start_with<D: Driver>(
        driver: D,
        driver_name: &str,
        resources: DriverResources,
    ) -> Result<RunningPlugin, ClusterError> {
        let cluster = Self::start().await?;
        cluster
            .create_device_class(driver_name, driver_name)
            .await?;
        let (plugin, kubelet) = cluster
            .launch(driver, driver_name, resources.clone())
            .await?;
        Ok(RunningPlugin {
            cluster,
            driver_name: driver_name.to_owned(),
            resources,
            plugin,
            kubelet,
        })
    }

    /// Starts a plugin publishing `resources`, waits for its slices and registers it.
    async fn launch<D: Driver>(
        &self,
        driver: D,
        driver_name: &str,
        resources: DriverResources,
    ) -> Result<(KubeletPlugin, RegisteredPlugin), ClusterError> {
        let plugin = self
            .plugin(driver, driver_name)
            .resources(resources)
            .start()
            .await?;
        if tokio::time::timeout(PUBLISH_TIMEOUT, plugin.published())
            .await
            .is_err()
        {
            // Best effort: the plugin is dropped with the error either way.
            let _ = plugin.shutdown().await;
            return Err(ClusterError::PublishTimeout {
                driver: driver_name.to_owned(),
                timeout: PUBLISH_TIMEOUT,
            });
        }
        match self.register(&plugin, KubeletVersion::V1_36).await {
            Ok(kubelet) => Ok((plugin, kubelet)),
            Err(error) => {
                let _ = plugin.shutdown().await;
                Err(error.into())
            }
        }
    }

    /// The fake API server.
    pub fn api(&self) -> &FakeApiServer {
        &self.api
    }

    /// A client of the fake API server.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The kubelet's plugin registry directory.
    pub fn registrar_dir(&self) -> PathBuf {
        self.dir.path().join("registry")
    }

    /// The kubelet's plugins directory.
    pub fn plugins_dir(&self) -> PathBuf {
        self.dir.path().join("plugins")
    }

    /// The CDI spec directory.
    pub fn cdi_root(&self) -> PathBuf {
        self.dir.path().join("cdi")
    }

    /// The temporary folder holding everything.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a kubeconfig for the fake API server to `kubeconfig` in the cluster's folder
    /// and returns its path: what a plugin process or a CLI is pointed at with
    /// `--kubeconfig`.
    pub fn write_kubeconfig(&self) -> Result<PathBuf, ClusterError> {
        let path = self.path().join("kubeconfig");
        self.api.write_kubeconfig(&path)?;
        Ok(path)
    }

    /// A kubelet plugin binary at `binary`, pointed at this cluster through `kubeconfig`, as
    /// an operator runs it on the cluster's node: `--kubeconfig`, `--node-name` and the
    /// kubelet's registrar, plugins and CDI directories, with `RUST_LOG=warn` and stdout
    /// discarded. The driver's own flags (device counts, profiles) are added by the caller.
    pub fn plugin_command(&self, binary: &Path, kubeconfig: &Path) -> Command {
        let mut command = Command::new(binary);
        command
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--node-name", NODE_NAME])
            .arg("--kubelet-registrar-directory-path")
            .arg(self.registrar_dir())
            .arg("--kubelet-plugins-directory-path")
            .arg(self.plugins_dir())
            .arg("--cdi-root")
            .arg(self.cdi_root())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null());
        command
    }

    /// A plugin builder wired to this cluster: its API server, directories and boot ID.
    pub fn plugin<D: Driver>(&self, driver: D, driver_name: &str) -> PluginBuilder<D> {
        self.plugin_with_client(driver, driver_name, self.client())
    }

    /// Like [`plugin`](Self::plugin), with an API client of the caller's: one built as a
    /// shipped plugin builds it (`PluginArgs::kube_client`, rate limits included), say, from a
    /// kubeconfig the fake API server wrote.
    pub fn plugin_with_client<D: Driver>(
        &self,
        driver: D,
        driver_name: &str,
        client: kube::Client,
    ) -> PluginBuilder<D> {
        KubeletPlugin::builder(driver, driver_name, NODE_NAME, client)
            .registrar_dir(self.registrar_dir())
            .plugins_dir(self.plugins_dir())
            .cdi_root(self.cdi_root())
            .boot_id(BOOT_ID)
    }

    /// Registers a running plugin with a simulated kubelet of the given release.
    pub async fn register(
        &self,
        plugin: &KubeletPlugin,
        version: KubeletVersion,
    ) -> Result<RegisteredPlugin, KubeletError> {
        KubeletSimulator::new(version)
            .register(&plugin.socket_paths().registration)
            .await
    }

    /// Creates a DeviceClass through the API that selects every device of `driver_name`
    /// (`device.driver == "<driver_name>"`).
    pub async fn create_device_class(
        &self,
        name: &str,
        driver_name: &str,
    ) -> Result<DeviceClass, ClusterError> {
        let classes: Api<DeviceClass> = Api::all(self.client());
        classes
            .create(
                &PostParams::default(),
                &driver_device_class(name, driver_name),
            )
            .await
            .map_err(api_error(format!("create DeviceClass {name}")))
    }

    /// Creates a ResourceClaim through the API; it stays unallocated until
    /// [`allocate`](Self::allocate).
    pub async fn create_claim(&self, claim: NewClaim) -> Result<ResourceClaim, ClusterError> {
        claim.create(&self.client).await
    }

    /// Allocates a claim on [`NODE_NAME`] from the published ResourceSlices, as the scheduler
    /// would (see [`allocate_claim`]), and returns what the kubelet sends the plugin for it.
    pub async fn allocate(&self, namespace: &str, name: &str) -> Result<ClaimRef, ClusterError> {
        let claim = allocate_claim(&self.client, namespace, name, NODE_NAME, None).await?;
        claim_ref(&claim)
    }
}

/// The kubelet's identity of a claim (namespace, name, UID) read from the stored object.
pub fn claim_ref(claim: &ResourceClaim) -> Result<ClaimRef, ClusterError> {
    let metadata = &claim.metadata;
    let object = format!(
        "ResourceClaim {}/{}",
        metadata.namespace.as_deref().unwrap_or(""),
        metadata.name.as_deref().unwrap_or("")
    );
    let field = |value: &Option<String>, field: &'static str| {
        value.clone().ok_or_else(|| ClusterError::Incomplete {
            object: object.clone(),
            field,
        })
    };
    Ok(ClaimRef {
        uid: field(&metadata.uid, "metadata.uid")?,
        namespace: field(&metadata.namespace, "metadata.namespace")?,
        name: field(&metadata.name, "metadata.name")?,
    })
}

/// A DeviceClass named `name` that selects every device of `driver_name`.
pub fn driver_device_class(name: &str, driver_name: &str) -> DeviceClass {
    let expression = format!("device.driver == {}", Value::String(driver_name.to_owned()));
    let object = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": { "name": name },
        "spec": { "selectors": [{ "cel": { "expression": expression } }] },
    });
    // Built from typed values, so it always decodes.
    serde_json::from_value(object).unwrap_or_default()
}

/// Builder of an unallocated ResourceClaim, the way a user writes one.
///
/// ```
/// use dra_sdk_testing::cluster::NewClaim;
///
/// let claim = NewClaim::new("default", "two-gpus")
///     .request("gpu", "gpu.example.com")
///     .count(2)
///     .selector("device.attributes['gpu.example.com'].model == 'h100'")
///     .config(&["gpu"], "gpu.example.com", serde_json::json!({
///         "apiVersion": "gpu.example.com/v1", "kind": "GpuConfig"
///     }))
///     .build();
/// let claim = serde_json::to_value(claim).unwrap();
/// assert_eq!(claim["spec"]["devices"]["requests"][0]["exactly"]["count"], 2);
/// ```
#[derive(Clone, Debug)]
pub struct NewClaim {
    namespace: String,
    name: String,
    requests: Vec<Value>,
    configs: Vec<Value>,
    constraints: Vec<Value>,
}

impl NewClaim {
    /// A claim without requests yet.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            requests: Vec::new(),
            configs: Vec::new(),
            constraints: Vec::new(),
        }
    }

    /// Adds a request for one device of `device_class`.
    pub fn request(mut self, name: &str, device_class: &str) -> Self {
        self.requests.push(json!({
            "name": name,
            "exactly": { "deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1 },
        }));
        self
    }

    /// Asks for `count` devices in the last request.
    pub fn count(mut self, count: u32) -> Self {
        if let Some(exactly) = self.last_exactly() {
            exactly.insert("count".into(), json!(count));
        }
        self
    }

    /// Asks for every matching device in the last request (`allocationMode: All`).
    pub fn all(mut self) -> Self {
        if let Some(exactly) = self.last_exactly() {
            exactly.insert("allocationMode".into(), json!("All"));
            exactly.remove("count");
        }
        self
    }

    /// Adds a CEL selector to the last request.
    pub fn selector(mut self, expression: &str) -> Self {
        if let Some(exactly) = self.last_exactly() {
            let selectors = exactly.entry("selectors").or_insert_with(|| json!([]));
            if let Value::Array(selectors) = selectors {
                selectors.push(json!({ "cel": { "expression": expression } }));
            }
        }
        self
    }

    /// Adds an opaque config for `driver`; empty `requests` applies it to all requests.
    pub fn config(mut self, requests: &[&str], driver: &str, parameters: Value) -> Self {
        let mut config = json!({ "opaque": { "driver": driver, "parameters": parameters } });
        if !requests.is_empty()
            && let Value::Object(fields) = &mut config
        {
            fields.insert("requests".into(), json!(requests));
        }
        self.configs.push(config);
        self
    }

    /// Adds a `matchAttribute` constraint: every device allocated for `requests` (all requests
    /// when empty) has the same value of `attribute` (fully qualified,
    /// `gpu.nvidia.com/nvlinkGroup`).
    ///
    /// ```
    /// use dra_sdk_testing::cluster::NewClaim;
    ///
    /// let claim = NewClaim::new("default", "pair")
    ///     .request("gpus", "gpu.nvidia.com")
    ///     .count(2)
    ///     .match_attribute("gpu.nvidia.com/nvlinkGroup", &[])
    ///     .build();
    /// let claim = serde_json::to_value(claim).unwrap();
    /// assert_eq!(
    ///     claim["spec"]["devices"]["constraints"][0]["matchAttribute"],
    ///     "gpu.nvidia.com/nvlinkGroup"
    /// );
    /// ```
    pub fn match_attribute(mut self, attribute: &str, requests: &[&str]) -> Self {
        let mut constraint = json!({ "matchAttribute": attribute });
        if !requests.is_empty()
            && let Value::Object(fields) = &mut constraint
        {
            fields.insert("requests".into(), json!(requests));
        }
        self.constraints.push(constraint);
        self
    }

    fn last_exactly(&mut self) -> Option<&mut serde_json::Map<String, Value>> {
        self.requests
            .last_mut()
            .and_then(|request| request.get_mut("exactly"))
            .and_then(Value::as_object_mut)
    }

    /// The claim's `spec` as JSON, the same for every Kubernetes version's Rust types.
    pub fn spec_json(&self) -> Value {
        let mut devices = json!({ "requests": self.requests, "config": self.configs });
        if !self.constraints.is_empty() {
            devices["constraints"] = json!(self.constraints);
        }
        json!({ "devices": devices })
    }

    /// The claim object.
    pub fn build(self) -> ResourceClaim {
        // Built through JSON so it does not depend on which Kubernetes version's Rust types
        // the application selected.
        let object = json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": { "name": self.name, "namespace": self.namespace },
            "spec": self.spec_json(),
        });
        serde_json::from_value(object).unwrap_or_default()
    }

    /// Creates the claim through the API and returns the stored object (with its UID).
    pub async fn create(self, client: &kube::Client) -> Result<ResourceClaim, ClusterError> {
        let action = format!("create ResourceClaim {}/{}", self.namespace, self.name);
        let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &self.namespace);
        claims
            .create(&PostParams::default(), &self.build())
            .await
            .map_err(api_error(action))
    }
}

/// A [`TestCluster`] with a driver's plugin running and registered: what
/// [`TestCluster::start_with`] returns.
pub struct RunningPlugin {
    cluster: TestCluster,
    driver_name: String,
    resources: DriverResources,
    plugin: KubeletPlugin,
    kubelet: RegisteredPlugin,
}

impl std::fmt::Debug for RunningPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningPlugin")
            .field("cluster", &self.cluster)
            .field("driver_name", &self.driver_name)
            .field("plugin", &self.plugin)
            .finish_non_exhaustive()
    }
}

impl RunningPlugin {
    /// The cluster the plugin runs in.
    pub fn cluster(&self) -> &TestCluster {
        &self.cluster
    }

    /// The driver name the plugin registered.
    pub fn driver_name(&self) -> &str {
        &self.driver_name
    }

    /// The running plugin.
    pub fn plugin(&self) -> &KubeletPlugin {
        &self.plugin
    }

    /// The simulated kubelet (release 1.36) the plugin is registered with.
    pub fn kubelet(&self) -> &RegisteredPlugin {
        &self.kubelet
    }

    /// Stops the plugin and starts `driver` in its place on the same directories, the same
    /// checkpoint and the same resources, as after a crash or an upgrade, then registers it
    /// again.
    pub async fn restart<D: Driver>(self, driver: D) -> Result<Self, ClusterError> {
        let Self {
            cluster,
            driver_name,
            resources,
            plugin,
            ..
        } = self;
        plugin.shutdown().await?;
        let (plugin, kubelet) = cluster
            .launch(driver, &driver_name, resources.clone())
            .await?;
        Ok(Self {
            cluster,
            driver_name,
            resources,
            plugin,
            kubelet,
        })
    }

    /// Stops the plugin, then the cluster.
    pub async fn shutdown(self) -> Result<(), ClusterError> {
        self.plugin.shutdown().await?;
        Ok(())
    }
}
