//! The reconcile loop that keeps the cluster's ResourceSlices equal to the driver's resources.
//!
//! This file holds the public types and the builder; [`handle`] is what a driver keeps,
//! [`cache`] the publisher's view of its slices and [`reconcile`] the loop itself.

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
use super::plan::{self, Delete, Plan, PlanContext, Prepared};
use super::validate::ValidationErrors;
use super::wire::{self, FeatureGate, ResourceApiVersion};
use crate::k8s::names;

mod cache;
mod handle;
mod pacing;
mod reconcile;

use self::cache::SliceCache;
pub use self::handle::PublisherHandle;
pub(crate) use self::handle::SliceUpdater;
use self::reconcile::Reconciler;

/// How many events a [`ResourceSlicePublisher::subscribe`] receiver may fall behind.
const EVENT_BUFFER: usize = 64;

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

/// What the publisher does about dropped fields: leaves them out, and withholds the devices
/// whose meaning depends on a dropped field (see [`FeatureGate::withholds_devices`]).
fn dropped_policy(features: &BTreeSet<FeatureGate>) -> String {
    let withheld: Vec<&str> = features
        .iter()
        .filter(|gate| gate.withholds_devices())
        .map(|gate| gate.name())
        .collect();
    if withheld.is_empty() {
        "publishing without those fields".to_owned()
    } else {
        format!(
            "publishing without those fields and withholding the devices that need {} (without it the scheduler would allocate them wrongly)",
            withheld.join(", ")
        )
    }
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
    /// publishing without those fields instead of rewriting the slice forever, and withholds
    /// devices that cannot be published safely without theirs
    /// ([`FeatureGate::withholds_devices`]).
    #[error(
        "the API server dropped fields of ResourceSlice {slice:?} (pool {pool:?}) because these feature gates are disabled: {}; {}",
        feature_list(.features),
        dropped_policy(.features)
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

/// Progress reported to [`ResourceSlicePublisher::subscribe`] and
/// [`PublisherHandle::subscribe`] receivers; a kubelet plugin hands each to its driver as
/// [`PluginEvent::Publish`](crate::driver::PluginEvent::Publish).
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

/// Errors compare by their message: two reports of the same failure are equal.
impl PartialEq for PublishEvent {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (
                Self::Connected {
                    api_version: a,
                    release: r,
                },
                Self::Connected {
                    api_version: b,
                    release: s,
                },
            ) => a == b && r == s,
            (Self::Synced { version: a }, Self::Synced { version: b }) => a == b,
            (Self::Error(a), Self::Error(b)) => Arc::ptr_eq(a, b) || a.to_string() == b.to_string(),
            (
                Self::DroppedFields {
                    pool: p,
                    slice: s,
                    features: f,
                },
                Self::DroppedFields {
                    pool: q,
                    slice: t,
                    features: g,
                },
            ) => p == q && s == t && f == g,
            _ => false,
        }
    }
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
    skip_node_operations: bool,
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
            skip_node_operations: false,
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
/// use dra_sdk::slices::{Device, DriverResources};
/// use dra_sdk::advanced::slices::ResourceSlicePublisher;
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
    /// Created with the builder, so a receiver taken before [`spawn`](Self::spawn) sees every
    /// event from the first.
    events: broadcast::Sender<PublishEvent>,
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
            events: broadcast::channel(EVENT_BUFFER).0,
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

    /// Marks the driver's devices as needing no node preparation: slices with devices carry
    /// `skipNodeOperations: [NodePrepareResources, NodeUnprepareResources]` (Kubernetes 1.37
    /// alpha, feature gate `DRAOptionalNodeOperations`), so a kubelet with the gate skips
    /// those calls for claims whose devices all come from such slices.
    ///
    /// Left out where the server's release predates 1.37 or the application's k8s-openapi
    /// version feature lacks the field, and reported as a dropped field when the server
    /// drops it; in all those cases the kubelet keeps calling prepare and unprepare, which
    /// the plugin must still serve.
    pub fn skip_node_operations(mut self) -> Self {
        self.options.skip_node_operations = true;
        self
    }

    /// A receiver of every [`PublishEvent`] from the first: taken before
    /// [`spawn`](Self::spawn), it cannot miss the connection or an early error, which
    /// [`PublisherHandle::subscribe`] (taken after) can. The one way publisher events reach
    /// code; errors are also logged. A receiver that falls more than 64 events behind gets
    /// `Lagged` and loses the oldest.
    ///
    /// ```no_run
    /// # async fn run(client: kube::Client) {
    /// use dra_sdk::slices::DriverResources;
    /// use dra_sdk::advanced::slices::{PublishEvent, ResourceSlicePublisher};
    ///
    /// let publisher = ResourceSlicePublisher::for_node(client, "gpu.example.com", "node-1");
    /// let mut events = publisher.subscribe();
    /// let handle = publisher.spawn(DriverResources::default());
    /// while let Ok(event) = events.recv().await {
    ///     if let PublishEvent::Error(error) = event {
    ///         eprintln!("slices: {error}");
    ///     }
    /// }
    /// # drop(handle);
    /// # }
    /// ```
    pub fn subscribe(&self) -> broadcast::Receiver<PublishEvent> {
        self.events.subscribe()
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
        let events = self.events;
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
            retry_after: None,
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
