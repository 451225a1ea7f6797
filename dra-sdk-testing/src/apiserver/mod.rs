//! A stateful fake Kubernetes API server over real HTTP on loopback.
//!
//! [`FakeApiServer`] serves `resource.k8s.io/v1` ResourceClaims (with `/status`),
//! ResourceClaimTemplates, ResourceSlices and DeviceClasses, and core `v1` Nodes, Pods and
//! Namespaces (see [`ResourceType`]), closely enough that `kube::Client`, `kube::Api`,
//! `kube::runtime::watcher` (list-watch and streaming-list modes) and `reflector` cannot tell it
//! from a real API server for what DRA drivers use:
//!
//! - **Verbs**: get, list, watch, create, update (PUT), patch (merge, strategic merge treated as
//!   merge, JSON patch, server-side apply), delete (with `preconditions`) and deletecollection;
//!   `/status` writes change only `status`, main-resource writes keep the stored `status`.
//! - **Metadata**: `uid`, `creationTimestamp`, `generation` (bumped on spec changes), one global
//!   increasing `resourceVersion`, `generateName`, finalizers with `deletionTimestamp`.
//! - **Concurrency**: 409 Conflict on a stale `metadata.resourceVersion`, 409 AlreadyExists,
//!   404 NotFound, 422 Invalid (names, immutable fields, a subset of ResourceSlice validation), all
//!   as `Status` bodies that kube turns into [`kube::Error::Api`]. A write that changes nothing is
//!   not stored: no new resourceVersion, no watch event (like etcd3's storage).
//! - **Lists and watches**: field selectors (`metadata.name`, `metadata.namespace`, and per kind,
//!   e.g. `spec.nodeName`/`spec.driver` on ResourceSlices), label selectors (equality and set
//!   based), watch replay from an in-memory history (ERROR 410 "Expired" when it no longer reaches
//!   back), BOOKMARKs, `timeoutSeconds`, `sendInitialEvents` with the
//!   `k8s.io/initial-events-end` bookmark, `PartialObjectMetadata` responses.
//! - **Discovery**: `/version`, `/api`, `/apis`, per group and version, aggregated discovery,
//!   and `/healthz`, `/livez`, `/readyz`.
//! - **Test control**: request [`Stats`], [`Faults`] (fail requests, add latency, drop or refuse
//!   watches), and write hooks that emulate disabled feature gates
//!   ([`FakeApiServer::drop_fields`]).
//!
//! # Simplifications
//! - Server-side apply is *create-or-merge*: the applied configuration is merged like a JSON merge
//!   patch, and fields the same field manager applied before but omits now are removed. There is no
//!   field ownership across managers, so apply never conflicts (as if `force` were always set),
//!   no `managedFields` are written, and lists are replaced whole (right for atomic lists such as
//!   `ResourceSlice.spec.devices`) except ResourceClaim `status.devices`, merged by key. Apply
//!   bodies must be JSON (kube sends JSON).
//! - Strategic merge patches are applied as JSON merge patches (no `$patch` directives, lists
//!   replaced whole).
//! - `limit`/`continue` are ignored: lists return everything without a continue token.
//!   `resourceVersionMatch=Exact` lists are served from the history.
//! - No authentication, authorization or admission beyond the hooks; namespaces need not exist;
//!   deleting a namespace does not delete its objects; no garbage collection of owned objects.
//! - Validation is limited to names, immutable fields, the ResourceSlice rules in
//!   kubelet-wire.md §3.2/§3.4 that a publisher can break (1.36 attribute rules included) and
//!   the ResourceClaim `status.devices` rules (allocated devices only, per-entry limits);
//!   unknown fields are kept.
//! - Server-side apply merges ResourceClaim `status.devices` by its keys (driver, device, pool,
//!   share ID) as a real server does, so one manager's apply keeps the entries of others; a
//!   `metadata.uid` in an apply body is a precondition (409 on mismatch).
//! - Objects are stored per group and resource; serving another version of a group
//!   ([`ResourceType::with_version`]) re-stamps `apiVersion` without converting.
//!
//! # Example
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use dra_sdk_testing::apiserver::FakeApiServer;
//! use k8s_openapi::api::core::v1::Node;
//! use kube::api::{Api, PostParams};
//!
//! let server = FakeApiServer::start().await?;
//! let nodes: Api<Node> = Api::all(server.client()?);
//! let mut node = Node::default();
//! node.metadata.name = Some("node-1".into());
//! nodes.create(&PostParams::default(), &node).await?;
//!
//! // The same object, without HTTP; and the request counters.
//! assert!(server.get::<Node>(None, "node-1")?.is_some());
//! assert_eq!(server.stats().resource("nodes").create, 1);
//! server.shutdown().await;
//! # Ok(()) }
//! ```

mod faults;
mod http;
mod object;
mod resources;
mod selectors;
mod stats;
mod status;
mod store;
mod watch;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use kube::config::{
    AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::warn;

pub use faults::{Fault, Faults};
pub use resources::ResourceType;
pub use stats::{Stats, Verb, VerbCounts};

use object::{remove_path, with_type_meta};
use status::ApiError;
use store::{Preconditions, State, WriteCtx, WriteHook};

/// Errors of the fake API server's own API (not the HTTP errors it serves).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The listening socket could not be bound.
    #[error("failed to bind the fake API server to {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The bind error.
        source: std::io::Error,
    },
    /// The server's URL did not parse as a URI (cannot happen for a bound socket address).
    #[error("the fake API server URL {url} is not a valid URI: {source}")]
    Url {
        /// The URL.
        url: String,
        /// The parse error.
        source: ::http::uri::InvalidUri,
    },
    /// kube could not build a client for the server.
    #[error("failed to build a kube client for the fake API server: {0}")]
    Client(#[source] kube::Error),
    /// The type's group, version and resource are not served (see [`ResourceType`]).
    #[error("the fake API server does not serve {api_version} {plural}")]
    UnknownResource {
        /// `group/version` of the type.
        api_version: String,
        /// Plural resource name of the type.
        plural: String,
    },
    /// An object did not serialize to JSON.
    #[error("failed to encode a {kind} as JSON: {source}")]
    Encode {
        /// Kind of the object.
        kind: String,
        /// The serde error.
        source: serde_json::Error,
    },
    /// A stored object did not deserialize into the requested type.
    #[error("stored {kind} \"{name}\" does not decode: {source}")]
    Decode {
        /// Kind of the object.
        kind: String,
        /// Name of the object.
        name: String,
        /// The serde error.
        source: serde_json::Error,
    },
    /// The server refused the operation; the same `Status` an HTTP client would have received.
    #[error("the fake API server refused the request: {0}")]
    Api(Box<kube::core::Status>),
    /// The kubeconfig file could not be written.
    #[error("failed to write the kubeconfig to {}: {source}", path.display())]
    WriteKubeconfig {
        /// Where it was to be written.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

impl From<ApiError> for Error {
    fn from(error: ApiError) -> Self {
        let status = serde_json::from_value::<kube::core::Status>(error.to_status())
            .unwrap_or_else(|_| {
                kube::core::Status::failure(&error.message, error.reason).with_code(error.code)
            });
        Error::Api(Box::new(status))
    }
}

/// State shared by the HTTP handlers, the watch tasks and the [`FakeApiServer`] handles.
pub(crate) struct Shared {
    state: Mutex<State>,
    resources: Vec<ResourceType>,
    git_version: String,
    bookmark_interval: Duration,
    faults: Faults,
    stats: Mutex<Stats>,
    hooks: Mutex<Vec<(String, WriteHook)>>,
    active_watches: AtomicUsize,
    root: CancellationToken,
    addr: SocketAddr,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing panics while holding these locks; if something did, the data is still consistent
    // enough for a test double.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn record(&self, resource: &str, verb: Verb) {
        lock(&self.stats).record(resource, verb);
    }

    fn hooks_for(&self, plural: &str) -> Vec<WriteHook> {
        lock(&self.hooks)
            .iter()
            .filter(|(r, _)| r == plural)
            .map(|(_, h)| h.clone())
            .collect()
    }
}

/// Options for a [`FakeApiServer`]; start with [`FakeApiServer::builder`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use dra_sdk_testing::apiserver::{FakeApiServer, ResourceType};
///
/// let server = FakeApiServer::builder()
///     .git_version("v1.34.1")
///     .bookmark_interval(Duration::from_millis(50))
///     .history_limit(100)
///     .resource_types([ResourceType::RESOURCE_SLICES, ResourceType::NODES])
///     .start()
///     .await?;
/// assert_eq!(server.client()?.apiserver_version().await?.minor, "34");
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct FakeApiServerBuilder {
    addr: SocketAddr,
    git_version: String,
    bookmark_interval: Duration,
    history_limit: usize,
    resources: Vec<ResourceType>,
}

impl Default for FakeApiServerBuilder {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            git_version: "v1.36.2".into(),
            bookmark_interval: Duration::from_secs(1),
            history_limit: 10_000,
            resources: ResourceType::defaults(),
        }
    }
}

impl FakeApiServerBuilder {
    /// Address to listen on; default `127.0.0.1:0` (a free port).
    #[must_use]
    pub fn bind_addr(mut self, addr: SocketAddr) -> Self {
        self.addr = addr;
        self
    }

    /// `gitVersion` reported by `/version` (major and minor are derived); default `v1.36.2`.
    #[must_use]
    pub fn git_version(mut self, version: impl Into<String>) -> Self {
        self.git_version = version.into();
        self
    }

    /// How often watches with `allowWatchBookmarks=true` get a BOOKMARK; default 1 s (the real
    /// server sends one about every minute). Keep it short in tests that wait for bookmarks.
    #[must_use]
    pub fn bookmark_interval(mut self, interval: Duration) -> Self {
        self.bookmark_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// How many events the watch history keeps (at least 1); default 10 000. A watch or an exact
    /// list from a resourceVersion older than the history gets 410 Expired.
    #[must_use]
    pub fn history_limit(mut self, events: usize) -> Self {
        self.history_limit = events;
        self
    }

    /// Serve exactly these resource types instead of [`ResourceType::defaults`].
    #[must_use]
    pub fn resource_types(mut self, types: impl IntoIterator<Item = ResourceType>) -> Self {
        self.resources = types.into_iter().collect();
        self
    }

    /// Binds the socket and starts serving on the current Tokio runtime.
    pub async fn start(self) -> Result<FakeApiServer, Error> {
        let listener = tokio::net::TcpListener::bind(self.addr)
            .await
            .map_err(|source| Error::Bind {
                addr: self.addr,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| Error::Bind {
            addr: self.addr,
            source,
        })?;
        let root = CancellationToken::new();
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new(self.history_limit)),
            resources: self.resources,
            git_version: self.git_version,
            bookmark_interval: self.bookmark_interval,
            faults: Faults::new(root.clone()),
            stats: Mutex::new(Stats::default()),
            hooks: Mutex::new(Vec::new()),
            active_watches: AtomicUsize::new(0),
            root: root.clone(),
            addr,
        });
        let app = http::router(shared.clone());
        let task = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app)
                .with_graceful_shutdown(root.cancelled_owned())
                .await
            {
                warn!(%error, "fake API server stopped with an error");
            }
        });
        let server = FakeApiServer {
            inner: Arc::new(Inner {
                shared,
                task: Mutex::new(Some(task)),
            }),
        };
        // A release before 1.37 does not know the 1.37 ResourceSlice fields: its decoder
        // drops them as unknown fields, which is what the disabled gates' hooks do.
        let release = dra_sdk::advanced::slices::KubernetesVersion::parse_git_version(
            &server.shared().git_version,
        );
        if release.is_some_and(|r| r < dra_sdk::advanced::slices::KubernetesVersion::new(1, 37)) {
            for gate in GATES_1_37 {
                server.disable_feature_gate(gate);
            }
        }
        Ok(server)
    }
}

/// The `resource.k8s.io` feature gates of the ResourceSlice fields new in 1.37.
const GATES_1_37: [&str; 4] = [
    "DRAPartitionableDevicesType",
    "DRADeviceCompatibilityGroups",
    "DRANodeAllocatableResources",
    "DRAOptionalNodeOperations",
];

struct Inner {
    shared: Arc<Shared>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shared.root.cancel();
    }
}

/// A running fake API server. Clones are handles to the same server; it stops when
/// [`shutdown`](Self::shutdown) is called or the last handle is dropped.
///
/// See the [module documentation](self) for what it emulates.
#[derive(Clone)]
pub struct FakeApiServer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for FakeApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeApiServer")
            .field("addr", &self.shared().addr)
            .finish_non_exhaustive()
    }
}

const KUBECONFIG_NAME: &str = "fake-apiserver";

impl FakeApiServer {
    /// Starts a server with default options on `127.0.0.1` and a free port.
    pub async fn start() -> Result<Self, Error> {
        FakeApiServerBuilder::default().start().await
    }

    /// Options for a server.
    pub fn builder() -> FakeApiServerBuilder {
        FakeApiServerBuilder::default()
    }

    fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    /// The socket address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.shared().addr
    }

    /// Base URL, e.g. `http://127.0.0.1:39123`.
    pub fn url(&self) -> String {
        format!("http://{}", self.shared().addr)
    }

    /// A kube client configuration for this server (plain HTTP, no credentials, namespace
    /// `default`, kube's default retry of 429/503/504).
    pub fn config(&self) -> Result<kube::Config, Error> {
        let url = self.url();
        let uri = url.parse().map_err(|source| Error::Url {
            url: url.clone(),
            source,
        })?;
        Ok(kube::Config::new(uri))
    }

    /// A kube client for this server.
    pub fn client(&self) -> Result<kube::Client, Error> {
        kube::Client::try_from(self.config()?).map_err(Error::Client)
    }

    /// A kubeconfig with one cluster, user and context named `fake-apiserver`.
    pub fn kubeconfig(&self) -> Kubeconfig {
        Kubeconfig {
            clusters: vec![NamedCluster {
                name: KUBECONFIG_NAME.into(),
                cluster: Some(Cluster {
                    server: Some(self.url()),
                    ..Cluster::default()
                }),
                ..NamedCluster::default()
            }],
            auth_infos: vec![NamedAuthInfo {
                name: KUBECONFIG_NAME.into(),
                auth_info: Some(AuthInfo::default()),
                ..NamedAuthInfo::default()
            }],
            contexts: vec![NamedContext {
                name: KUBECONFIG_NAME.into(),
                context: Some(Context {
                    cluster: KUBECONFIG_NAME.into(),
                    user: Some(KUBECONFIG_NAME.into()),
                    namespace: Some("default".into()),
                    ..Context::default()
                }),
                ..NamedContext::default()
            }],
            current_context: Some(KUBECONFIG_NAME.into()),
            kind: Some("Config".into()),
            api_version: Some("v1".into()),
            ..Kubeconfig::default()
        }
    }

    /// Writes [`kubeconfig`](Self::kubeconfig) to `path` (as JSON, which is valid YAML), for a
    /// separate process started with `--kubeconfig`.
    pub fn write_kubeconfig(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        let path = path.as_ref();
        let bytes =
            serde_json::to_vec_pretty(&self.kubeconfig()).map_err(|source| Error::Encode {
                kind: "Kubeconfig".into(),
                source,
            })?;
        std::fs::write(path, bytes).map_err(|source| Error::WriteKubeconfig {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Request counters since start or the last [`reset_stats`](Self::reset_stats).
    pub fn stats(&self) -> Stats {
        lock(&self.shared().stats).clone()
    }

    /// Zeroes the request counters.
    pub fn reset_stats(&self) {
        *lock(&self.shared().stats) = Stats::default();
    }

    /// The fault-injection handle.
    pub fn faults(&self) -> Faults {
        self.shared().faults.clone()
    }

    /// Number of watch streams currently open.
    pub fn active_watches(&self) -> usize {
        self.shared().active_watches.load(Ordering::SeqCst)
    }

    /// The current (latest) resourceVersion.
    pub fn resource_version(&self) -> String {
        self.shared().state().resource_version().to_string()
    }

    /// Emulates a disabled feature gate: from now on, writes of `resource` (a plural such as
    /// `resourceslices`; main resource and subresources) silently drop the fields at `paths`, as a
    /// real server does with fields of a disabled gate. Path syntax: dot-separated keys, `name[]`
    /// for every element of the list `name`, `*` for every value of a map.
    ///
    /// ```no_run
    /// # fn demo(server: &dra_sdk_testing::apiserver::FakeApiServer) {
    /// // A 1.34-like server: DRADeviceTaints, DRAPartitionableDevices, DRAConsumableCapacity off.
    /// server.drop_fields("resourceslices", &[
    ///     "spec.devices[].taints",
    ///     "spec.sharedCounters",
    ///     "spec.devices[].consumesCounters",
    ///     "spec.devices[].allowMultipleAllocations",
    ///     "spec.devices[].capacity.*.requestPolicy",
    /// ]);
    /// # }
    /// ```
    pub fn drop_fields(&self, resource: &str, paths: &[&str]) {
        let paths: Vec<String> = paths.iter().map(|p| (*p).to_string()).collect();
        self.on_write(resource, move |obj| {
            paths.iter().for_each(|path| remove_path(obj, path))
        });
    }

    /// Emulates a server with the `resource.k8s.io` feature gate `gate` disabled: drops its
    /// ResourceSlice fields on every write (see [`drop_fields`](Self::drop_fields)), as the
    /// real server's strategy does for a new object. Returns `false` (and changes nothing)
    /// for a gate this fake does not know.
    ///
    /// Known: `DRADeviceTaints`, `DRAPartitionableDevices`, `DRADeviceBindingConditions`,
    /// `DRAConsumableCapacity`, and the 1.37 gates `DRAPartitionableDevicesType`
    /// (`partitionTypeAttribute`), `DRADeviceCompatibilityGroups` (`compatibilityGroups`),
    /// `DRANodeAllocatableResources` (`nodeAllocatableResources`) and
    /// `DRAOptionalNodeOperations` (`skipNodeOperations`). A fake started with a
    /// [`git_version`](FakeApiServerBuilder::git_version) before 1.37 (the default is 1.36)
    /// starts with those four disabled, as such a server drops the fields as unknown.
    /// `DRAListTypeAttributes` is not here: a real server refuses the attribute a dropped
    /// list value leaves empty, which [`drop_fields`](Self::drop_fields) plus this fake's
    /// validation already reproduce.
    ///
    /// ```no_run
    /// # fn demo(server: &dra_sdk_testing::apiserver::FakeApiServer) {
    /// assert!(server.disable_feature_gate("DRADeviceCompatibilityGroups"));
    /// # }
    /// ```
    pub fn disable_feature_gate(&self, gate: &str) -> bool {
        let paths: &[&str] = match gate {
            "DRADeviceTaints" => &["spec.devices[].taints"],
            "DRAPartitionableDevices" => &[
                "spec.sharedCounters",
                "spec.perDeviceNodeSelection",
                "spec.devices[].consumesCounters",
                "spec.devices[].nodeName",
                "spec.devices[].nodeSelector",
                "spec.devices[].allNodes",
            ],
            "DRADeviceBindingConditions" => &[
                "spec.devices[].bindsToNode",
                "spec.devices[].bindingConditions",
                "spec.devices[].bindingFailureConditions",
            ],
            "DRAConsumableCapacity" => &[
                "spec.devices[].allowMultipleAllocations",
                "spec.devices[].capacity.*.requestPolicy",
            ],
            "DRAPartitionableDevicesType" => &["spec.partitionTypeAttribute"],
            "DRADeviceCompatibilityGroups" => {
                &["spec.devices[].consumesCounters[].compatibilityGroups"]
            }
            "DRANodeAllocatableResources" => &["spec.devices[].nodeAllocatableResources"],
            "DRAOptionalNodeOperations" => &["spec.skipNodeOperations"],
            _ => return false,
        };
        self.drop_fields("resourceslices", paths);
        true
    }

    /// Registers a hook that may rewrite every object of `resource` (plural) written from now on,
    /// before validation and storage. It sees the object without `apiVersion` and `kind`.
    /// Hooks run while the store is locked: they must not call back into the server.
    pub fn on_write(&self, resource: &str, hook: impl Fn(&mut Value) + Send + Sync + 'static) {
        lock(&self.shared().hooks).push((resource.to_string(), Arc::new(hook)));
    }

    /// Removes all write hooks, including [`drop_fields`](Self::drop_fields) and
    /// [`disable_feature_gate`](Self::disable_feature_gate) ones (also those a pre-1.37 fake
    /// starts with).
    pub fn clear_write_hooks(&self) {
        lock(&self.shared().hooks).clear();
    }

    fn resource_type<K: kube::Resource<DynamicType = ()>>(&self) -> Result<&ResourceType, Error> {
        let (group, version, plural) = (K::group(&()), K::version(&()), K::plural(&()));
        self.shared()
            .resources
            .iter()
            .find(|rt| rt.group == group && rt.version == version && rt.plural == plural)
            .ok_or_else(|| Error::UnknownResource {
                api_version: K::api_version(&()).into_owned(),
                plural: plural.into_owned(),
            })
    }

    fn encode<K: kube::Resource<DynamicType = ()> + Serialize>(obj: &K) -> Result<Value, Error> {
        serde_json::to_value(obj).map_err(|source| Error::Encode {
            kind: K::kind(&()).into_owned(),
            source,
        })
    }

    fn decode<K: kube::Resource<DynamicType = ()> + DeserializeOwned>(
        rt: &ResourceType,
        stored: &Value,
    ) -> Result<K, Error> {
        serde_json::from_value(with_type_meta(stored, &rt.api_version(), rt.kind)).map_err(
            |source| Error::Decode {
                kind: rt.kind.to_string(),
                name: stored
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                source,
            },
        )
    }

    /// Creates an object without HTTP: same defaulting, validation, hooks and watch events as a
    /// POST (not counted in [`stats`](Self::stats), not subject to [`faults`](Self::faults)).
    /// Namespaced objects without a namespace go to `default`. Returns the stored object.
    pub fn insert<K>(&self, obj: &K) -> Result<K, Error>
    where
        K: kube::Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    {
        let rt = self.resource_type::<K>()?;
        let namespace = obj
            .meta()
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let hooks = self.shared().hooks_for(rt.plural);
        let ctx = WriteCtx {
            rt,
            namespace: Some(&namespace),
            dry_run: false,
            hooks: &hooks,
        };
        let stored = self.shared().state().create(&ctx, Self::encode(obj)?)?;
        Self::decode(rt, &stored)
    }

    /// Replaces an object without HTTP (like a PUT: `metadata.resourceVersion`, when set, must be
    /// current; `status` is kept for kinds with a status subresource).
    pub fn replace<K>(&self, obj: &K) -> Result<K, Error>
    where
        K: kube::Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    {
        self.put(obj, false)
    }

    /// Replaces an object's `status` without HTTP (like a PUT to `/status`).
    pub fn update_status<K>(&self, obj: &K) -> Result<K, Error>
    where
        K: kube::Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    {
        self.put(obj, true)
    }

    fn put<K>(&self, obj: &K, status: bool) -> Result<K, Error>
    where
        K: kube::Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    {
        let rt = self.resource_type::<K>()?;
        let namespace = obj
            .meta()
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = obj.meta().name.clone().unwrap_or_default();
        let hooks = self.shared().hooks_for(rt.plural);
        let ctx = WriteCtx {
            rt,
            namespace: Some(&namespace),
            dry_run: false,
            hooks: &hooks,
        };
        let stored = self
            .shared()
            .state()
            .replace(&ctx, &name, Self::encode(obj)?, status)?;
        Self::decode(rt, &stored)
    }

    /// Reads an object without HTTP; `None` when it does not exist. `namespace` is ignored for
    /// cluster-scoped kinds.
    pub fn get<K>(&self, namespace: Option<&str>, name: &str) -> Result<Option<K>, Error>
    where
        K: kube::Resource<DynamicType = ()> + DeserializeOwned,
    {
        let rt = self.resource_type::<K>()?;
        let stored = self.shared().state().get(rt, namespace, name);
        match stored {
            Ok(stored) => Self::decode(rt, &stored).map(Some),
            Err(_) => Ok(None),
        }
    }

    /// All objects of a kind, in every namespace, ordered by namespace and name.
    pub fn list<K>(&self) -> Result<Vec<K>, Error>
    where
        K: kube::Resource<DynamicType = ()> + DeserializeOwned,
    {
        let rt = self.resource_type::<K>()?;
        let (items, _) =
            self.shared()
                .state()
                .list(rt, &selectors::Filter::default(), store::ListAt::Latest)?;
        items
            .iter()
            .map(|stored| Self::decode(rt, stored))
            .collect()
    }

    /// Deletes an object without HTTP. Finalizers are honoured: an object with finalizers only
    /// gets a `deletionTimestamp` and goes when the last finalizer is removed.
    pub fn delete<K>(&self, namespace: Option<&str>, name: &str) -> Result<(), Error>
    where
        K: kube::Resource<DynamicType = ()>,
    {
        let rt = self.resource_type::<K>()?;
        let ctx = WriteCtx {
            rt,
            namespace,
            dry_run: false,
            hooks: &[],
        };
        self.shared()
            .state()
            .delete(&ctx, name, &Preconditions::default())?;
        Ok(())
    }

    /// Stops serving: ends all watches, closes connections, and waits (at most 5 s) for the
    /// server task. Other handles to the server see it stopped.
    pub async fn shutdown(self) {
        self.shared().root.cancel();
        let task = lock(&self.inner.task).take();
        if let Some(mut task) = task {
            // Graceful shutdown waits for open connections; a client that keeps one busy must not
            // stall the caller.
            if tokio::time::timeout(Duration::from_secs(5), &mut task)
                .await
                .is_err()
            {
                task.abort();
            }
        }
    }
}
