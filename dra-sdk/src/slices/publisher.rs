//! The reconcile loop that keeps the cluster's ResourceSlices equal to the driver's resources.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1 as api;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, warn};

use super::backoff::Backoff;
use super::layout::PreviousSlice;
use super::limits::{KubernetesVersion, SliceLimits};
use super::model::DriverResources;
use super::names;
use super::plan::{self, Delete, Plan, PlanContext, Prepared};
use super::validate::ValidationErrors;
use super::wire::{self, FeatureGate, ResourceApiVersion};

/// Callback for background errors.
type ErrorCallback = Arc<dyn Fn(&PublishError) + Send + Sync>;

/// What a write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// `POST` of a new slice.
    Create,
    /// `PUT` of an existing slice.
    Update,
    /// `DELETE` of a slice.
    Delete,
    /// `GET` of a slice after a conflict.
    Refresh,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Create => "creating",
            Self::Update => "updating",
            Self::Delete => "deleting",
            Self::Refresh => "re-reading",
        })
    }
}

fn feature_list(features: &BTreeSet<FeatureGate>) -> String {
    features
        .iter()
        .map(|gate| gate.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A problem the publisher ran into. All of them are retried (validation errors once the
/// driver publishes new resources); they are reported so the driver can surface them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The driver name is not a DNS subdomain of at most 63 characters; nothing is published.
    #[error("invalid driver name {driver:?}: {reason}")]
    InvalidDriverName {
        /// The driver name.
        driver: String,
        /// Why it is invalid.
        reason: &'static str,
    },
    /// The node name is not a DNS subdomain; nothing is published.
    #[error("invalid node name {node:?}: {reason}")]
    InvalidNodeName {
        /// The node name.
        node: String,
        /// Why it is invalid.
        reason: &'static str,
    },
    /// API discovery (`/apis`, `/version`) failed.
    #[error("discovering the API server's resource.k8s.io versions and release: {0}")]
    Discovery(#[source] kube::Error),
    /// The server serves none of `resource.k8s.io` v1, v1beta2 and v1beta1.
    #[error(
        "the API server serves ResourceSlices in none of resource.k8s.io v1, v1beta2, v1beta1 (is DynamicResourceAllocation enabled?)"
    )]
    NotServed,
    /// Getting the Node (for the owner reference's UID) failed.
    #[error("looking up node {node:?} for the slices' owner reference: {source}")]
    NodeLookup {
        /// The node name.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The watch on ResourceSlices failed; it is restarted with backoff.
    #[error("watching ResourceSlices: {0}")]
    Watch(#[source] watcher::Error),
    /// A write failed.
    #[error("{operation} ResourceSlice {slice:?}: {source}")]
    Write {
        /// What was attempted.
        operation: Operation,
        /// The slice name.
        slice: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// A slice from the server could not be read as `resource.k8s.io/v1`.
    #[error("decoding ResourceSlice {slice:?} from the API server: {source}")]
    Decode {
        /// The slice name.
        slice: String,
        /// The decoding error.
        #[source]
        source: serde_json::Error,
    },
    /// A pool failed validation; its slices are left as they are until the driver fixes it.
    #[error("pool {pool:?} is not published: {errors}")]
    Invalid {
        /// The pool.
        pool: String,
        /// What is wrong.
        errors: ValidationErrors,
    },
    /// The server dropped fields because feature gates are disabled; the publisher keeps
    /// publishing without those fields instead of rewriting the slice forever.
    #[error(
        "the API server dropped fields of ResourceSlice {slice:?} (pool {pool:?}) because these feature gates are disabled: {}; publishing without those fields",
        feature_list(.features)
    )]
    DroppedFields {
        /// The pool.
        pool: String,
        /// The slice where the drop was seen.
        slice: String,
        /// The gates whose fields were dropped (all seen so far).
        features: BTreeSet<FeatureGate>,
    },
}

/// Progress reported to [`PublisherHandle::subscribe`] receivers.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum PublishEvent {
    /// Discovery finished: the API version in use and the server's release (`None` when it
    /// could not be parsed; the strictest limits apply then).
    Connected {
        /// The `resource.k8s.io` version.
        api_version: ResourceApiVersion,
        /// The server's release.
        release: Option<KubernetesVersion>,
    },
    /// The cluster matches the resources of [`PublisherHandle::update`] call number
    /// `version` (0 for the resources given to [`ResourceSlicePublisher::spawn`]): every
    /// write is acknowledged and seen on the watch. Sent again after each repair.
    Synced {
        /// The update number.
        version: u64,
    },
    /// Something failed; the publisher retries.
    Error(Arc<PublishError>),
    /// The server dropped fields (reported once per newly detected gate).
    DroppedFields {
        /// The pool.
        pool: String,
        /// The slice.
        slice: String,
        /// All gates detected as disabled so far.
        features: BTreeSet<FeatureGate>,
    },
}

/// Counts of the publisher's API writes and errors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PublishStats {
    /// Slices created.
    pub creates: u64,
    /// Slices updated.
    pub updates: u64,
    /// Slices deleted.
    pub deletes: u64,
    /// Failed API requests (writes, discovery, node lookup, watch).
    pub errors: u64,
}

#[derive(Clone, Debug, Default)]
struct Metrics {
    creates: Counter,
    updates: Counter,
    deletes: Counter,
    errors: Counter,
}

#[derive(Clone, Debug)]
enum Scope {
    Node { name: String, uid: Option<String> },
    Cluster,
}

#[derive(Clone, Debug)]
struct Options {
    resync_period: Duration,
    sync_delay: Duration,
    backoff_initial: Duration,
    backoff_max: Duration,
    api_version: Option<ResourceApiVersion>,
    release: Option<KubernetesVersion>,
    write_concurrency: usize,
    field_manager: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            resync_period: Duration::from_secs(600),
            sync_delay: Duration::from_millis(200),
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(300),
            api_version: None,
            release: None,
            write_concurrency: 8,
            field_manager: None,
        }
    }
}

/// Publishes a driver's [`DriverResources`] as ResourceSlices and keeps them in sync.
///
/// Configure it with the builder methods, then [`spawn`](Self::spawn) it; the returned
/// [`PublisherHandle`] takes updates. See the [module documentation](super) for the
/// behaviour.
///
/// ```no_run
/// use dra_sdk::slices::{Device, DriverResources, ResourceSlicePublisher};
///
/// # async fn example() -> Result<(), kube::Error> {
/// let client = kube::Client::try_default().await?;
/// let publisher = ResourceSlicePublisher::for_node(client, "gpu.example.com", "node-1")
///     .spawn(DriverResources::single_pool("node-1", vec![Device::new("gpu-0")]));
/// publisher.synced().await;
/// // Later: a device became unhealthy, or was hot-plugged.
/// publisher.update(DriverResources::single_pool("node-1", vec![Device::new("gpu-0"), Device::new("gpu-1")]));
/// publisher.stop().await; // leaves the slices in place
/// # Ok(())
/// # }
/// ```
pub struct ResourceSlicePublisher {
    client: kube::Client,
    driver: String,
    scope: Scope,
    options: Options,
    on_error: Option<ErrorCallback>,
}

impl fmt::Debug for ResourceSlicePublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResourceSlicePublisher")
            .field("driver", &self.driver)
            .field("scope", &self.scope)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl ResourceSlicePublisher {
    /// Node-local publishing: slices get `spec.nodeName` and an owner reference to the Node
    /// (its UID is looked up once unless [`node_uid`](Self::node_uid) gives it), so the
    /// garbage collector removes them with the node. Every pool must be
    /// [`PoolNodeSelection::Local`](super::PoolNodeSelection::Local). The publisher manages
    /// every slice with this driver and node name.
    pub fn for_node(
        client: kube::Client,
        driver_name: impl Into<String>,
        node_name: impl Into<String>,
    ) -> Self {
        Self::new(
            client,
            driver_name.into(),
            Scope::Node {
                name: node_name.into(),
                uid: None,
            },
        )
    }

    /// Cluster-wide publishing of network-attached pools (node selector, all nodes or
    /// per-device node selection). The publisher manages every slice of the driver that has
    /// no `spec.nodeName`, so run one per driver (use leader election for replicas).
    pub fn for_cluster(client: kube::Client, driver_name: impl Into<String>) -> Self {
        Self::new(client, driver_name.into(), Scope::Cluster)
    }

    fn new(client: kube::Client, driver: String, scope: Scope) -> Self {
        Self {
            client,
            driver,
            scope,
            options: Options::default(),
            on_error: None,
        }
    }

    /// The Node's UID, saving the lookup (needs `get` on nodes otherwise). Ignored for
    /// cluster-wide publishers.
    pub fn node_uid(mut self, uid: impl Into<String>) -> Self {
        if let Scope::Node { uid: slot, .. } = &mut self.scope {
            *slot = Some(uid.into());
        }
        self
    }

    /// How often to re-check everything even without events (default 10 minutes).
    pub fn resync_period(mut self, period: Duration) -> Self {
        self.options.resync_period = period.max(Duration::from_millis(10));
        self
    }

    /// How long to wait after someone else changed a slice before reconciling, to coalesce
    /// bursts such as kubelet deleting all slices (default 200 ms).
    pub fn sync_delay(mut self, delay: Duration) -> Self {
        self.options.sync_delay = delay;
        self
    }

    /// Backoff after API errors: starts at `initial`, doubles up to `max`, with jitter
    /// (defaults 500 ms and 5 minutes).
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.options.backoff_initial = initial;
        self.options.backoff_max = max;
        self
    }

    /// Uses this `resource.k8s.io` version instead of discovering it.
    pub fn api_version(mut self, version: ResourceApiVersion) -> Self {
        self.options.api_version = Some(version);
        self
    }

    /// Uses this server release for the validation limits instead of asking `/version`.
    pub fn server_release(mut self, release: KubernetesVersion) -> Self {
        self.options.release = Some(release);
        self
    }

    /// How many writes run concurrently (default 8).
    pub fn write_concurrency(mut self, concurrency: usize) -> Self {
        self.options.write_concurrency = concurrency.max(1);
        self
    }

    /// The field manager of writes (default: the driver name).
    pub fn field_manager(mut self, manager: impl Into<String>) -> Self {
        self.options.field_manager = Some(manager.into());
        self
    }

    /// Calls `callback` for every background error, in addition to logging it and sending
    /// it to [`PublisherHandle::subscribe`] receivers. Keep it quick: it runs on the
    /// publisher's task.
    pub fn on_error(mut self, callback: impl Fn(&PublishError) + Send + Sync + 'static) -> Self {
        self.on_error = Some(Arc::new(callback));
        self
    }

    /// Starts publishing `initial` on a background task.
    ///
    /// Must be called inside a Tokio runtime; never blocks. Dropping the handle stops the
    /// task (without deleting slices), like [`PublisherHandle::stop`].
    pub fn spawn(self, initial: DriverResources) -> PublisherHandle {
        let (desired_tx, desired_rx) = watch::channel(Desired {
            version: 0,
            resources: Arc::new(initial),
        });
        let (sync_tx, sync_rx) = watch::channel(SyncState::default());
        let (events, _) = broadcast::channel(64);
        let metrics = Metrics::default();
        let cancel = CancellationToken::new();
        let node = match &self.scope {
            Scope::Node { name, .. } => Some(name.clone()),
            Scope::Cluster => None,
        };
        let span = tracing::info_span!(
            "resourceslice_publisher",
            driver = %self.driver,
            node = node.as_deref().unwrap_or("<cluster>"),
        );
        let reconciler = Reconciler {
            backoff: Backoff::new(self.options.backoff_initial, self.options.backoff_max),
            field_manager: self
                .options
                .field_manager
                .clone()
                .unwrap_or_else(|| self.driver.clone()),
            client: self.client,
            driver: self.driver.clone(),
            node,
            scope: self.scope,
            options: self.options,
            on_error: self.on_error,
            desired_rx,
            sync_tx,
            events: events.clone(),
            metrics: metrics.clone(),
            cancel: cancel.clone(),
            cache: SliceCache::default(),
            memory: BTreeMap::new(),
            prepared: None,
            disabled: BTreeSet::new(),
            reported_invalid: BTreeMap::new(),
            clean: None,
            in_sync: false,
            churn: 0,
        };
        let task = tokio::spawn(reconciler.run().instrument(span));
        PublisherHandle {
            driver: self.driver,
            desired: desired_tx,
            synced: sync_rx,
            events,
            metrics,
            cancel,
            task: Some(task),
        }
    }
}

#[derive(Clone, Debug)]
struct Desired {
    version: u64,
    resources: Arc<DriverResources>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct SyncState {
    /// The update number last synced.
    version: Option<u64>,
    /// Whether the cluster still matches it, as far as the publisher knows.
    in_sync: bool,
}

/// Controls a running publisher.
pub struct PublisherHandle {
    driver: String,
    desired: watch::Sender<Desired>,
    synced: watch::Receiver<SyncState>,
    events: broadcast::Sender<PublishEvent>,
    metrics: Metrics,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl fmt::Debug for PublisherHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublisherHandle")
            .field("driver", &self.driver)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl PublisherHandle {
    /// Replaces the published resources. Non-blocking; when updates come faster than the
    /// API server takes them, only the latest is written.
    pub fn update(&self, resources: DriverResources) {
        self.desired.send_modify(|desired| {
            desired.version += 1;
            desired.resources = Arc::new(resources);
        });
    }

    /// A cloneable sender of updates to this publisher, for the plugin's
    /// [`DriverContext`](crate::context::DriverContext). It does not keep the publisher alive.
    pub(crate) fn updater(&self) -> SliceUpdater {
        SliceUpdater {
            desired: self.desired.clone(),
        }
    }

    /// The resources last passed to [`update`](Self::update) (or `spawn`).
    pub fn resources(&self) -> Arc<DriverResources> {
        self.desired.borrow().resources.clone()
    }

    /// Counts of writes and errors so far.
    pub fn stats(&self) -> PublishStats {
        PublishStats {
            creates: self.metrics.creates.get(),
            updates: self.metrics.updates.get(),
            deletes: self.metrics.deletes.get(),
            errors: self.metrics.errors.get(),
        }
    }

    /// Registers counters `dra_resourceslice_{creates,updates,deletes,errors}_total`, labelled
    /// with `driver`.
    ///
    /// `registry` should be a root registry, without a prefix or a `driver` label of its own
    /// (e.g. `Registry::default()`): this adds both. A [`KubeletPlugin`](crate::plugin::KubeletPlugin)
    /// that publishes slices registers them on its `/metrics` already.
    pub fn register_metrics(&self, registry: &mut Registry) {
        let registry = registry
            .sub_registry_with_prefix(crate::metrics::PREFIX)
            .sub_registry_with_label(crate::metrics::driver_label(&self.driver));
        registry.register(
            "resourceslice_creates",
            "ResourceSlices created by the publisher",
            self.metrics.creates.clone(),
        );
        registry.register(
            "resourceslice_updates",
            "ResourceSlices updated by the publisher",
            self.metrics.updates.clone(),
        );
        registry.register(
            "resourceslice_deletes",
            "ResourceSlices deleted by the publisher",
            self.metrics.deletes.clone(),
        );
        registry.register(
            "resourceslice_errors",
            "Failed API requests of the ResourceSlice publisher",
            self.metrics.errors.clone(),
        );
    }

    /// Progress and error events from now on. A receiver that falls more than 64 events
    /// behind loses the oldest (see [`broadcast::error::RecvError::Lagged`]).
    pub fn subscribe(&self) -> broadcast::Receiver<PublishEvent> {
        self.events.subscribe()
    }

    /// Resolves once the resources of the latest [`update`](Self::update) are written and
    /// observed, or when the publisher stopped. Pools that failed validation do not block
    /// it (they are reported as [`PublishError::Invalid`]).
    pub async fn synced(&self) {
        let target = self.desired.borrow().version;
        let mut synced = self.synced.clone();
        // An error means the task ended: nothing more will happen.
        let _ = synced
            .wait_for(|state| state.in_sync && state.version >= Some(target))
            .await;
    }

    /// Stops the publisher without deleting slices (kubelet removes node-local slices of a
    /// driver that stays away, and a restarted publisher adopts them).
    pub async fn stop(mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            // A panic in the task has been logged by the runtime already.
            let _ = task.await;
        }
    }
}

impl Drop for PublisherHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// What [`PublisherHandle::update`] does, from a clone that the driver's context can keep.
#[derive(Clone, Debug)]
pub(crate) struct SliceUpdater {
    desired: watch::Sender<Desired>,
}

impl SliceUpdater {
    /// Like [`PublisherHandle::update`]; a no-op once the publisher stopped.
    pub(crate) fn update(&self, resources: DriverResources) {
        self.desired.send_modify(|desired| {
            desired.version += 1;
            desired.resources = Arc::new(resources);
        });
    }
}

/// Whether resource version `a` is newer than `b`. Resource versions are opaque, but every
/// API server uses integers; anything else counts as newer when different.
fn newer(a: &str, b: &str) -> bool {
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(a), Ok(b)) => a > b,
        _ => a != b,
    }
}

fn rv(slice: &api::ResourceSlice) -> &str {
    slice
        .metadata
        .resource_version
        .as_deref()
        .unwrap_or_default()
}

/// An acknowledged write that the watch has not shown yet.
#[derive(Clone, Debug, PartialEq)]
enum Pending {
    Written(String),
    Deleted,
}

/// What a watch event meant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    /// Nothing new (stale, or our own write echoed).
    Nothing,
    /// Someone else changed a slice.
    Foreign,
    /// The initial list is complete.
    Ready,
}

/// The publisher's view of its slices: the watch plus its own acknowledged writes.
#[derive(Debug, Default)]
struct SliceCache {
    objects: BTreeMap<String, api::ResourceSlice>,
    ready: bool,
    relist: Option<BTreeMap<String, api::ResourceSlice>>,
    pending: BTreeMap<String, Pending>,
    /// Resource versions of slices we deleted, to ignore late events about them.
    tombstones: BTreeMap<String, String>,
}

impl SliceCache {
    fn apply(&mut self, event: watcher::Event<api::ResourceSlice>) -> Seen {
        match event {
            watcher::Event::Init => {
                self.relist = Some(BTreeMap::new());
                Seen::Nothing
            }
            watcher::Event::InitApply(slice) => {
                if let (Some(relist), Some(name)) = (&mut self.relist, slice.metadata.name.clone())
                {
                    relist.insert(name, slice);
                }
                Seen::Nothing
            }
            watcher::Event::InitDone => self.finish_relist(),
            watcher::Event::Apply(slice) => self.applied(slice),
            watcher::Event::Delete(slice) => self.deleted(&slice),
        }
    }

    fn finish_relist(&mut self) -> Seen {
        let listed = self.relist.take().unwrap_or_default();
        let mut foreign = false;
        let names: BTreeSet<String> = listed.keys().chain(self.objects.keys()).cloned().collect();
        let mut objects = BTreeMap::new();
        for name in names {
            match (listed.get(&name), self.objects.get(&name)) {
                (Some(listed), Some(cached)) if newer(rv(cached), rv(listed)) => {
                    // Our own write raced the list; the watch will confirm it.
                    objects.insert(name, cached.clone());
                }
                (Some(listed), cached) => {
                    foreign |= cached.is_none_or(|c| rv(c) != rv(listed));
                    if let Some(Pending::Written(pending)) = self.pending.get(&name)
                        && !newer(pending, rv(listed))
                    {
                        self.pending.remove(&name);
                    }
                    objects.insert(name, listed.clone());
                }
                (None, _) => {
                    foreign = true;
                    if self.pending.get(&name) == Some(&Pending::Deleted) {
                        self.pending.remove(&name);
                    }
                }
            }
        }
        self.objects = objects;
        self.tombstones.clear();
        if !self.ready {
            self.ready = true;
            Seen::Ready
        } else if foreign {
            Seen::Foreign
        } else {
            Seen::Nothing
        }
    }

    fn applied(&mut self, slice: api::ResourceSlice) -> Seen {
        let Some(name) = slice.metadata.name.clone() else {
            return Seen::Nothing;
        };
        let version = rv(&slice).to_owned();
        if let Some(Pending::Written(pending)) = self.pending.get(&name)
            && !newer(pending, &version)
        {
            self.pending.remove(&name);
        }
        let stale = self
            .objects
            .get(&name)
            .map(|cached| !newer(&version, rv(cached)))
            .or_else(|| self.tombstones.get(&name).map(|t| !newer(&version, t)))
            .unwrap_or(false);
        if stale {
            return Seen::Nothing;
        }
        self.tombstones.remove(&name);
        self.objects.insert(name, slice);
        Seen::Foreign
    }

    fn deleted(&mut self, slice: &api::ResourceSlice) -> Seen {
        let Some(name) = slice.metadata.name.as_deref() else {
            return Seen::Nothing;
        };
        if self.pending.get(name) == Some(&Pending::Deleted) {
            self.pending.remove(name);
        }
        match self.objects.get(name) {
            Some(cached) if !newer(rv(cached), rv(slice)) => {
                self.objects.remove(name);
                Seen::Foreign
            }
            _ => Seen::Nothing,
        }
    }

    fn wrote(&mut self, slice: api::ResourceSlice) {
        if let Some(name) = slice.metadata.name.clone() {
            // A write that changed nothing keeps the resource version and produces no watch
            // event; waiting for its echo would never end.
            let changed = self
                .objects
                .get(&name)
                .is_none_or(|cached| newer(rv(&slice), rv(cached)));
            if changed {
                self.pending
                    .insert(name.clone(), Pending::Written(rv(&slice).to_owned()));
            }
            self.tombstones.remove(&name);
            self.objects.insert(name, slice);
        }
    }

    fn removed(&mut self, name: &str, last_version: Option<String>, echo_expected: bool) {
        self.objects.remove(name);
        if echo_expected {
            self.pending.insert(name.to_owned(), Pending::Deleted);
        } else {
            self.pending.remove(name);
        }
        if let Some(version) = last_version {
            self.tombstones.insert(name.to_owned(), version);
        }
    }

    /// Replaces what we know about one slice with the server's current state.
    fn refreshed(&mut self, name: &str, slice: Option<api::ResourceSlice>) {
        match slice {
            Some(slice) => {
                if let Some(Pending::Written(pending)) = self.pending.get(name)
                    && !newer(pending, rv(&slice))
                {
                    self.pending.remove(name);
                }
                self.objects.insert(name.to_owned(), slice);
            }
            None => {
                self.objects.remove(name);
                if self.pending.get(name) == Some(&Pending::Deleted) {
                    self.pending.remove(name);
                }
            }
        }
    }
}

/// Everything discovery found out.
struct Connection {
    api: Api<DynamicObject>,
    version: ResourceApiVersion,
    limits: SliceLimits,
    owner: Option<OwnerReference>,
}

/// The outcome of one write.
enum WriteResult {
    Written {
        sent: Box<api::ResourceSlice>,
        stored: Result<Box<api::ResourceSlice>, serde_json::Error>,
        operation: Operation,
    },
    Deleted {
        delete: Delete,
        last_version: Option<String>,
    },
    Failed {
        operation: Operation,
        name: String,
        error: kube::Error,
        /// The write was refused because the server does not know list attributes
        /// (`DRAListTypeAttributes` off): it drops them, then rejects the empty attributes.
        refused_lists: Option<String>,
    },
    Unencodable {
        name: String,
        error: serde_json::Error,
    },
}

struct Reconciler {
    client: kube::Client,
    driver: String,
    node: Option<String>,
    scope: Scope,
    options: Options,
    field_manager: String,
    on_error: Option<ErrorCallback>,
    desired_rx: watch::Receiver<Desired>,
    sync_tx: watch::Sender<SyncState>,
    events: broadcast::Sender<PublishEvent>,
    metrics: Metrics,
    cancel: CancellationToken,
    backoff: Backoff,
    cache: SliceCache,
    memory: BTreeMap<String, Vec<PreviousSlice>>,
    /// Validation and conversion of the desired resources of one update number.
    prepared: Option<(u64, Arc<Prepared>)>,
    disabled: BTreeSet<FeatureGate>,
    reported_invalid: BTreeMap<String, ValidationErrors>,
    /// The update number whose plan came out empty, while nothing changed since.
    clean: Option<u64>,
    in_sync: bool,
    /// Consecutive successful write rounds without any outside change: a guard against
    /// rewriting forever should the server normalize something the comparison misses.
    churn: u32,
}

type Decoded = Result<api::ResourceSlice, (String, serde_json::Error)>;

/// Converts the objects of a watch event to v1.
fn decode_event(
    event: watcher::Event<DynamicObject>,
    version: ResourceApiVersion,
) -> watcher::Event<Decoded> {
    let decode = |object: DynamicObject| {
        let name = object.metadata.name.clone().unwrap_or_default();
        wire::from_dynamic(object, version).map_err(|source| (name, source))
    };
    match event {
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitDone => watcher::Event::InitDone,
        watcher::Event::InitApply(object) => watcher::Event::InitApply(decode(object)),
        watcher::Event::Apply(object) => watcher::Event::Apply(decode(object)),
        watcher::Event::Delete(object) => watcher::Event::Delete(decode(object)),
    }
}

fn schedule(next: &mut Option<Instant>, at: Instant) {
    *next = Some(next.map_or(at, |n| n.min(at)));
}

impl Reconciler {
    async fn run(mut self) {
        if let Err(error) = self.check_names() {
            self.report(error);
            return;
        }
        let cancel = self.cancel.clone();
        let connection = tokio::select! {
            _ = cancel.cancelled() => return,
            connection = self.connect() => connection,
        };
        self.main_loop(connection).await;
        debug!("publisher stopped");
    }

    fn check_names(&self) -> Result<(), PublishError> {
        names::driver_name(&self.driver).map_err(|reason| PublishError::InvalidDriverName {
            driver: self.driver.clone(),
            reason,
        })?;
        if let Some(node) = &self.node {
            names::dns_subdomain(node).map_err(|reason| PublishError::InvalidNodeName {
                node: node.clone(),
                reason,
            })?;
        }
        Ok(())
    }

    fn report(&self, error: PublishError) {
        match &error {
            PublishError::Invalid { .. } | PublishError::DroppedFields { .. } => {
                warn!(error = %error, "ResourceSlice publishing problem");
            }
            _ => warn!(error = %error, "ResourceSlice publishing error; retrying"),
        }
        if let Some(callback) = &self.on_error {
            callback(&error);
        }
        if let PublishError::DroppedFields {
            pool,
            slice,
            features,
        } = &error
        {
            let _ = self.events.send(PublishEvent::DroppedFields {
                pool: pool.clone(),
                slice: slice.clone(),
                features: features.clone(),
            });
        } else {
            // No receivers is fine.
            let _ = self.events.send(PublishEvent::Error(Arc::new(error)));
        }
    }

    fn api_error(&mut self, error: PublishError) {
        self.metrics.errors.inc();
        self.report(error);
    }

    /// Discovery and node lookup, retried with backoff until they succeed.
    async fn connect(&mut self) -> Connection {
        loop {
            match self.try_connect().await {
                Ok(connection) => {
                    self.backoff.reset();
                    info!(
                        api_version = %connection.version,
                        release = ?connection.limits.release,
                        "connected to the API server",
                    );
                    let _ = self.events.send(PublishEvent::Connected {
                        api_version: connection.version,
                        release: connection.limits.release,
                    });
                    return connection;
                }
                Err(error) => {
                    self.api_error(error);
                    tokio::time::sleep(self.backoff.next_delay()).await;
                }
            }
        }
    }

    async fn try_connect(&mut self) -> Result<Connection, PublishError> {
        let version = match self.options.api_version {
            Some(version) => version,
            None => ResourceApiVersion::newest_served(&self.client)
                .await
                .map_err(PublishError::Discovery)?
                .ok_or(PublishError::NotServed)?,
        };
        let release = match self.options.release {
            Some(release) => Some(release),
            None => {
                let request = http::Request::get("/version")
                    .body(Vec::new())
                    .map_err(|e| PublishError::Discovery(kube::Error::HttpError(e)))?;
                let info: serde_json::Value = self
                    .client
                    .request(request)
                    .await
                    .map_err(PublishError::Discovery)?;
                let release = KubernetesVersion::from_version_info(&info);
                if release.is_none() {
                    warn!(version = %info, "cannot parse the server's release; applying the strictest limits");
                }
                release
            }
        };
        let owner = match &mut self.scope {
            Scope::Cluster => None,
            Scope::Node { name, uid } => {
                let uid = match uid {
                    Some(uid) => uid.clone(),
                    None => {
                        let node = Api::<Node>::all(self.client.clone())
                            .get(name)
                            .await
                            .map_err(|source| PublishError::NodeLookup {
                                node: name.clone(),
                                source,
                            })?;
                        let found = node.metadata.uid.unwrap_or_default();
                        *uid = Some(found.clone());
                        found
                    }
                };
                Some(OwnerReference {
                    api_version: "v1".to_owned(),
                    kind: "Node".to_owned(),
                    name: name.clone(),
                    uid,
                    controller: Some(true),
                    ..Default::default()
                })
            }
        };
        Ok(Connection {
            api: Api::all_with(self.client.clone(), &version.api_resource()),
            version,
            limits: SliceLimits::for_optional_release(release),
            owner,
        })
    }

    fn owned(&self, slice: &api::ResourceSlice) -> bool {
        slice.spec.driver == self.driver && slice.spec.node_name == self.node
    }

    async fn main_loop(&mut self, connection: Connection) {
        let mut fields = format!("spec.driver={}", self.driver);
        if let Some(node) = &self.node {
            fields.push_str(&format!(",spec.nodeName={node}"));
        }
        let version = connection.version;
        let watch_backoff = Backoff::new(self.options.backoff_initial, self.options.backoff_max);
        let mut watch = watcher(
            connection.api.clone(),
            watcher::Config::default().fields(&fields),
        )
        .backoff(watch_backoff)
        .map_ok(move |event| decode_event(event, version))
        .boxed();
        let period = self.options.resync_period;
        let mut resync = tokio::time::interval_at(Instant::now() + period, period);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut next: Option<Instant> = None;
        let cancel = self.cancel.clone();

        loop {
            let wake = next;
            let sleep = async move {
                match wake {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                changed = self.desired_rx.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    self.outside_change();
                    schedule(&mut next, Instant::now());
                }
                event = watch.next() => match event {
                    Some(Ok(event)) => {
                        let seen = self.on_watch_event(event);
                        match seen {
                            Seen::Nothing => {}
                            Seen::Ready => schedule(&mut next, Instant::now()),
                            Seen::Foreign => {
                                self.outside_change();
                                schedule(&mut next, Instant::now() + self.options.sync_delay);
                            }
                        }
                        self.publish_sync_state();
                    }
                    Some(Err(error)) => self.api_error(PublishError::Watch(error)),
                    None => return,
                },
                () = sleep => {
                    next = None;
                    let reconciled = tokio::select! {
                        _ = cancel.cancelled() => return,
                        reconciled = self.reconcile(&connection) => reconciled,
                    };
                    if let Some(at) = reconciled {
                        schedule(&mut next, at);
                    }
                }
                _ = resync.tick() => schedule(&mut next, Instant::now()),
            }
        }
    }

    /// Something other than our own writes happened: the next plan decides again.
    fn outside_change(&mut self) {
        self.clean = None;
        self.churn = 0;
        self.publish_sync_state();
    }

    fn on_watch_event(&mut self, event: watcher::Event<Decoded>) -> Seen {
        let decoded = match event {
            watcher::Event::Init => Some(watcher::Event::Init),
            watcher::Event::InitDone => Some(watcher::Event::InitDone),
            watcher::Event::InitApply(slice) => self.decoded(slice).map(watcher::Event::InitApply),
            watcher::Event::Apply(slice) => self.decoded(slice).map(watcher::Event::Apply),
            watcher::Event::Delete(slice) => self.decoded(slice).map(watcher::Event::Delete),
        };
        decoded.map_or(Seen::Nothing, |event| self.cache.apply(event))
    }

    fn decoded(&self, slice: Decoded) -> Option<api::ResourceSlice> {
        match slice {
            // The field selector already filters; this guards against servers that ignore it.
            Ok(slice) => self.owned(&slice).then_some(slice),
            Err((slice, source)) => {
                self.report(PublishError::Decode { slice, source });
                None
            }
        }
    }

    fn publish_sync_state(&mut self) {
        let in_sync = self.cache.ready
            && self.cache.pending.is_empty()
            && self.clean == Some(self.desired_rx.borrow().version);
        let state = SyncState {
            version: if in_sync {
                self.clean
            } else {
                self.sync_tx.borrow().version
            },
            in_sync,
        };
        if in_sync && !self.in_sync {
            debug!(version = ?self.clean, "slices in sync");
            if let Some(version) = self.clean {
                let _ = self.events.send(PublishEvent::Synced { version });
            }
        }
        self.in_sync = in_sync;
        self.sync_tx.send_if_modified(|current| {
            let changed = *current != state;
            *current = state;
            changed
        });
    }

    /// One reconcile round; returns when to run the next one, if needed before an event.
    async fn reconcile(&mut self, connection: &Connection) -> Option<Instant> {
        if !self.cache.ready {
            return None;
        }
        let desired = self.desired_rx.borrow_and_update().clone();
        let ctx = PlanContext {
            driver: &self.driver,
            node: self.node.as_deref(),
            owner: connection.owner.as_ref(),
            limits: &connection.limits,
            disabled: &self.disabled,
        };
        let started = std::time::Instant::now();
        let prepared = match &self.prepared {
            Some((version, prepared)) if *version == desired.version => prepared.clone(),
            _ => {
                let prepared = Arc::new(plan::prepare(&ctx, &desired.resources));
                self.prepared = Some((desired.version, prepared.clone()));
                prepared
            }
        };
        let mut plan = plan::plan_prepared(
            &ctx,
            &desired.resources,
            &prepared,
            &self.cache.objects,
            &self.memory,
        );
        debug!(
            elapsed = ?started.elapsed(),
            devices = desired.resources.device_count(),
            writes = plan.deletes.len() + plan.updates.len() + plan.creates.len(),
            "planned",
        );
        let layouts = std::mem::take(&mut plan.layouts);
        self.remember_layouts(layouts, &plan.invalid);
        self.report_invalid(&plan.invalid);

        if plan.is_empty() {
            self.backoff.reset();
            self.churn = 0;
            self.clean = Some(desired.version);
            self.publish_sync_state();
            return None;
        }
        self.clean = None;
        self.publish_sync_state();
        debug!(
            deletes = plan.deletes.len(),
            updates = plan.updates.len(),
            creates = plan.creates.len(),
            "writing ResourceSlices",
        );
        let failed = self.execute(plan, connection).await;
        let now = Instant::now();
        if failed {
            Some(now + self.backoff.next_delay())
        } else {
            self.churn += 1;
            if self.churn > 3 {
                // Successful writes that never converge: slow down instead of spinning.
                warn!(
                    rounds = self.churn,
                    "ResourceSlices keep differing from the desired state after writing them"
                );
                Some(now + self.backoff.next_delay())
            } else {
                self.backoff.reset();
                // Check the result (normally an empty plan, which marks the state synced).
                Some(now)
            }
        }
    }

    fn remember_layouts(
        &mut self,
        layouts: BTreeMap<String, Vec<PreviousSlice>>,
        invalid: &BTreeMap<String, ValidationErrors>,
    ) {
        // Invalid pools keep their old layout for when they become valid again.
        self.memory.retain(|pool, _| invalid.contains_key(pool));
        self.memory.extend(layouts);
    }

    fn report_invalid(&mut self, invalid: &BTreeMap<String, ValidationErrors>) {
        self.reported_invalid
            .retain(|pool, _| invalid.contains_key(pool));
        for (pool, errors) in invalid {
            if self.reported_invalid.get(pool) != Some(errors) {
                self.reported_invalid.insert(pool.clone(), errors.clone());
                self.report(PublishError::Invalid {
                    pool: pool.clone(),
                    errors: errors.clone(),
                });
            }
        }
    }

    /// Runs the plan phase by phase (deletes, updates, creates); stops after a phase with a
    /// failure. Returns whether anything failed.
    async fn execute(&mut self, plan: Plan, connection: &Connection) -> bool {
        let concurrency = self.options.write_concurrency;
        let params = PostParams {
            field_manager: Some(self.field_manager.clone()),
            ..Default::default()
        };
        let api = &connection.api;
        let version = connection.version;

        let deletes = futures::stream::iter(plan.deletes)
            .map(|delete| async move {
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: delete.uid.clone(),
                        resource_version: delete.resource_version.clone(),
                    }),
                    ..Default::default()
                };
                match api.delete(&delete.name, &params).await {
                    Ok(response) => {
                        let last_version = response
                            .left()
                            .and_then(|object| object.metadata.resource_version)
                            .or_else(|| delete.resource_version.clone());
                        WriteResult::Deleted {
                            delete,
                            last_version,
                        }
                    }
                    Err(error) => WriteResult::Failed {
                        operation: Operation::Delete,
                        name: delete.name,
                        error,
                        refused_lists: None,
                    },
                }
            })
            .buffer_unordered(concurrency)
            .collect::<Vec<_>>()
            .await;
        if self.absorb(deletes, connection).await {
            return true;
        }

        let write = |slice: api::ResourceSlice, operation: Operation| {
            let params = &params;
            async move {
                let name = slice.metadata.name.clone().unwrap_or_default();
                let object = match wire::to_dynamic(&slice, version) {
                    Ok(object) => object,
                    Err(error) => return WriteResult::Unencodable { name, error },
                };
                let result = match operation {
                    Operation::Create => api.create(params, &object).await,
                    _ => api.replace(&name, params, &object).await,
                };
                match result {
                    Ok(stored) => WriteResult::Written {
                        sent: Box::new(slice),
                        stored: wire::from_dynamic(stored, version).map(Box::new),
                        operation,
                    },
                    Err(error) => {
                        let refused = matches!(&error, kube::Error::Api(status)
                            if wire::rejected_list_attributes(&slice.spec, status));
                        WriteResult::Failed {
                            operation,
                            name,
                            error,
                            refused_lists: refused.then(|| slice.spec.pool.name.clone()),
                        }
                    }
                }
            }
        };
        let updates = futures::stream::iter(plan.updates)
            .map(|slice| write(slice, Operation::Update))
            .buffer_unordered(concurrency)
            .collect::<Vec<_>>()
            .await;
        if self.absorb(updates, connection).await {
            return true;
        }
        let creates = futures::stream::iter(plan.creates)
            .map(|slice| write(slice, Operation::Create))
            .buffer_unordered(concurrency)
            .collect::<Vec<_>>()
            .await;
        self.absorb(creates, connection).await
    }

    /// Applies write results to the cache, stats and reports. Returns whether any failed.
    async fn absorb(&mut self, results: Vec<WriteResult>, connection: &Connection) -> bool {
        let mut failed = false;
        for result in results {
            match result {
                WriteResult::Written {
                    sent,
                    stored,
                    operation,
                } => {
                    match operation {
                        Operation::Create => self.metrics.creates.inc(),
                        _ => self.metrics.updates.inc(),
                    };
                    match stored {
                        Ok(stored) => {
                            self.check_dropped(&sent, &stored);
                            self.cache.wrote(*stored);
                        }
                        Err(source) => {
                            failed = true;
                            self.report(PublishError::Decode {
                                slice: sent.metadata.name.clone().unwrap_or_default(),
                                source,
                            });
                        }
                    }
                }
                WriteResult::Deleted {
                    delete,
                    last_version,
                } => {
                    self.metrics.deletes.inc();
                    self.cache.removed(&delete.name, last_version, true);
                }
                WriteResult::Failed {
                    operation,
                    name,
                    error,
                    refused_lists,
                } => {
                    // Like a dropped field, reported once; the next round publishes without
                    // list attributes instead of being refused forever.
                    if let Some(pool) = refused_lists
                        && self.disabled.insert(FeatureGate::ListTypeAttributes)
                    {
                        failed = true;
                        self.report(PublishError::DroppedFields {
                            pool,
                            slice: name,
                            features: self.disabled.clone(),
                        });
                        continue;
                    }
                    let status = match &error {
                        kube::Error::Api(status) => status.code,
                        _ => 0,
                    };
                    match (operation, status) {
                        // Already gone: nothing to do.
                        (Operation::Delete, 404) => {
                            self.cache.removed(&name, None, false);
                            continue;
                        }
                        // Gone while we updated it: the next round creates it.
                        (Operation::Update, 404) => self.cache.removed(&name, None, false),
                        // Someone else wrote it: learn the current state before retrying.
                        (_, 409) => self.refresh(&name, connection).await,
                        _ => {}
                    }
                    failed = true;
                    self.api_error(PublishError::Write {
                        operation,
                        slice: name,
                        source: error,
                    });
                }
                WriteResult::Unencodable { name, error } => {
                    failed = true;
                    self.report(PublishError::Decode {
                        slice: name,
                        source: error,
                    });
                }
            }
        }
        failed
    }

    async fn refresh(&mut self, name: &str, connection: &Connection) {
        match connection.api.get_opt(name).await {
            Ok(object) => {
                let slice = match object.map(|o| wire::from_dynamic(o, connection.version)) {
                    None => None,
                    Some(Ok(slice)) => self.owned(&slice).then_some(slice),
                    Some(Err(source)) => {
                        self.report(PublishError::Decode {
                            slice: name.to_owned(),
                            source,
                        });
                        return;
                    }
                };
                self.cache.refreshed(name, slice);
            }
            Err(source) => self.api_error(PublishError::Write {
                operation: Operation::Refresh,
                slice: name.to_owned(),
                source,
            }),
        }
    }

    fn check_dropped(&mut self, sent: &api::ResourceSlice, stored: &api::ResourceSlice) {
        let dropped = wire::dropped_features(&sent.spec, &stored.spec);
        if dropped.is_subset(&self.disabled) {
            return;
        }
        self.disabled.extend(dropped);
        self.report(PublishError::DroppedFields {
            pool: sent.spec.pool.name.clone(),
            slice: sent.metadata.name.clone().unwrap_or_default(),
            features: self.disabled.clone(),
        });
    }
}
