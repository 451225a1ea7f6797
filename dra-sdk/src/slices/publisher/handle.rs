//! The handle a driver keeps to a running publisher: updates, stats, events and stop.

use super::*;

/// Controls a running publisher.
pub struct PublisherHandle {
    pub(super) driver: String,
    pub(super) desired: watch::Sender<Desired>,
    pub(super) synced: watch::Receiver<SyncState>,
    pub(super) events: broadcast::Sender<PublishEvent>,
    pub(super) metrics: Metrics,
    pub(super) cancel: CancellationToken,
    pub(super) task: Option<JoinHandle<()>>,
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
    pub(super) desired: watch::Sender<Desired>,
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
