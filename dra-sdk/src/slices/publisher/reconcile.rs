//! The reconcile loop: discovery, the watch, planning and executing writes.

use super::cache::{Seen, SliceCache};
use super::*;

/// Everything discovery found out.
pub(super) struct Connection {
    pub(super) api: Api<DynamicObject>,
    pub(super) version: ResourceApiVersion,
    pub(super) limits: SliceLimits,
    pub(super) owner: Option<OwnerReference>,
}

/// The outcome of one write.
pub(super) enum WriteResult {
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

pub(super) struct Reconciler {
    pub(super) client: kube::Client,
    pub(super) driver: String,
    pub(super) node: Option<String>,
    pub(super) scope: Scope,
    pub(super) options: Options,
    pub(super) field_manager: String,
    pub(super) desired_rx: watch::Receiver<Desired>,
    pub(super) sync_tx: watch::Sender<SyncState>,
    pub(super) events: broadcast::Sender<PublishEvent>,
    pub(super) metrics: Metrics,
    pub(super) cancel: CancellationToken,
    pub(super) backoff: Backoff,
    pub(super) cache: SliceCache,
    pub(super) memory: BTreeMap<String, Vec<PreviousSlice>>,
    /// Validation and conversion of the desired resources of one update number.
    pub(super) prepared: Option<(u64, Arc<Prepared>)>,
    pub(super) disabled: BTreeSet<FeatureGate>,
    pub(super) reported_invalid: BTreeMap<String, ValidationErrors>,
    /// The update number whose plan came out empty, while nothing changed since.
    pub(super) clean: Option<u64>,
    pub(super) in_sync: bool,
    /// Consecutive successful write rounds without any outside change: a guard against
    /// rewriting forever should the server normalize something the comparison misses.
    pub(super) churn: u32,
    /// The longest `Retry-After` a failed write of this round carried: the next round waits
    /// at least that long, whatever the backoff says (kube's client honours it only for the
    /// requests it retries itself, and not at all with its default retries turned off).
    pub(super) retry_after: Option<Duration>,
}

/// The most a server's `Retry-After` holds the publisher back: the default backoff's ceiling.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// The server's `Retry-After` (`details.retryAfterSeconds`) on an error answer, if any.
fn retry_after_of(error: &kube::Error) -> Option<Duration> {
    match error {
        kube::Error::Api(status) => status
            .details
            .as_ref()
            .map(|details| details.retry_after_seconds)
            .filter(|seconds| *seconds > 0)
            .map(|seconds| Duration::from_secs(seconds.into()).min(MAX_RETRY_AFTER)),
        _ => None,
    }
}

pub(super) type Decoded = Result<api::ResourceSlice, (String, serde_json::Error)>;

/// Converts the objects of a watch event to v1.
pub(super) fn decode_event(
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

pub(super) fn schedule(next: &mut Option<Instant>, at: Instant) {
    *next = Some(next.map_or(at, |n| n.min(at)));
}

impl Reconciler {
    pub(super) async fn run(mut self) {
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

    pub(super) fn check_names(&self) -> Result<(), PublishError> {
        names::driver_name(&self.driver).map_err(|reason| PublishError::InvalidDriverName {
            driver: self.driver.clone(),
            reason,
        })?;
        if self.driver.bytes().any(|b| b.is_ascii_uppercase()) {
            // The API server takes it, with the same warning on every write.
            warn!(driver = %self.driver, "driver names should be lower case");
        }
        if let Some(node) = &self.node {
            names::dns_subdomain(node).map_err(|reason| PublishError::InvalidNodeName {
                node: node.clone(),
                reason,
            })?;
        }
        Ok(())
    }

    pub(super) fn report(&self, error: PublishError) {
        match &error {
            PublishError::Invalid { .. } | PublishError::DroppedFields { .. } => {
                warn!(error = %error, "ResourceSlice publishing problem");
            }
            _ => warn!(error = %error, "ResourceSlice publishing error; retrying"),
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

    pub(super) fn api_error(&mut self, error: PublishError) {
        self.metrics.errors.inc();
        self.report(error);
    }

    /// Discovery and node lookup, retried with backoff until they succeed.
    pub(super) async fn connect(&mut self) -> Connection {
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

    pub(super) async fn try_connect(&mut self) -> Result<Connection, PublishError> {
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

    pub(super) fn owned(&self, slice: &api::ResourceSlice) -> bool {
        slice.spec.driver == self.driver && slice.spec.node_name == self.node
    }

    pub(super) async fn main_loop(&mut self, connection: Connection) {
        let mut fields = format!("spec.driver={}", self.driver);
        if let Some(node) = &self.node {
            fields.push_str(&format!(",spec.nodeName={node}"));
        }
        let version = connection.version;
        let watch_backoff = Backoff::new(self.options.backoff_initial, self.options.backoff_max);
        let paced = super::pacing::paced(
            &self.client,
            self.options.backoff_initial,
            self.options.backoff_max,
        );
        let mut watch = watcher(
            Api::all_with(paced, &version.api_resource()),
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
    pub(super) fn outside_change(&mut self) {
        self.clean = None;
        self.churn = 0;
        self.publish_sync_state();
    }

    pub(super) fn on_watch_event(&mut self, event: watcher::Event<Decoded>) -> Seen {
        let decoded = match event {
            watcher::Event::Init => Some(watcher::Event::Init),
            watcher::Event::InitDone => Some(watcher::Event::InitDone),
            watcher::Event::InitApply(slice) => self.decoded(slice).map(watcher::Event::InitApply),
            watcher::Event::Apply(slice) => self.decoded(slice).map(watcher::Event::Apply),
            watcher::Event::Delete(slice) => self.decoded(slice).map(watcher::Event::Delete),
        };
        decoded.map_or(Seen::Nothing, |event| self.cache.apply(event))
    }

    pub(super) fn decoded(&self, slice: Decoded) -> Option<api::ResourceSlice> {
        match slice {
            // The field selector already filters; this guards against servers that ignore it.
            Ok(slice) => self.owned(&slice).then_some(slice),
            Err((slice, source)) => {
                self.report(PublishError::Decode { slice, source });
                None
            }
        }
    }

    pub(super) fn publish_sync_state(&mut self) {
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
    pub(super) async fn reconcile(&mut self, connection: &Connection) -> Option<Instant> {
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
            skip_node_operations: self.options.skip_node_operations,
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
        let retry_after = self.retry_after.take().unwrap_or_default();
        if failed {
            Some(now + self.backoff.next_delay().max(retry_after))
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

    pub(super) fn remember_layouts(
        &mut self,
        layouts: BTreeMap<String, Vec<PreviousSlice>>,
        invalid: &BTreeMap<String, ValidationErrors>,
    ) {
        // Invalid pools keep their old layout for when they become valid again.
        self.memory.retain(|pool, _| invalid.contains_key(pool));
        self.memory.extend(layouts);
    }

    pub(super) fn report_invalid(&mut self, invalid: &BTreeMap<String, ValidationErrors>) {
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
    pub(super) async fn execute(&mut self, plan: Plan, connection: &Connection) -> bool {
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
    pub(super) async fn absorb(
        &mut self,
        results: Vec<WriteResult>,
        connection: &Connection,
    ) -> bool {
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
                    self.retry_after = self.retry_after.max(retry_after_of(&error));
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

    pub(super) async fn refresh(&mut self, name: &str, connection: &Connection) {
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

    pub(super) fn check_dropped(&mut self, sent: &api::ResourceSlice, stored: &api::ResourceSlice) {
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
