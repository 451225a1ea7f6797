//! The version-independent core of the DRA node service: prepare, unprepare and recovery.
//!
//! The gRPC adapters for v1 and v1beta1 convert at the edge and call into [`NodeService`].
//! A batch is handled in phases so that the checkpoint is written once per phase for the
//! whole batch, while claims inside a phase run concurrently:
//!
//! 1. lock the batch's claim UIDs (sorted, so overlapping batches cannot deadlock), in this
//!    process and in the claim lock file every instance on the node shares;
//! 2. serve already prepared claims from the checkpoint;
//! 3. GET the others, all at once, while `PrepareStarted` is recorded for them (one write,
//!    overlapping the reads, the slowest step; claims that fail to read or resolve and had
//!    no earlier record are removed again with the last write);
//! 4. call the driver and write each claim's CDI spec (and device metadata, for a driver that
//!    opted in), concurrently;
//! 5. record `PrepareCompleted` for the claims that succeeded (one write);
//! 6. write the device status the driver returned, concurrently (opt-in; never fails a claim).

use std::any::Any;
use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::SystemTime;

use futures::FutureExt as _;
use futures::future::join_all;
use tracing::Instrument;

use crate::advanced::checkpoint::{
    Checkpoint, CheckpointError, ClaimChange, ClaimRecord, ClaimState, PreparedDeviceRecord,
};
use crate::cdi::{ClaimDevice, SpecWriter};
use crate::claim::locks::{ClaimFileGuard, ClaimFileLocks, ClaimLocks, NodeGuard, NodeLock};
use crate::claim::{Claim, ClaimReader, ClaimRef, DriverError};
use crate::config::ConfigRegistry;
use crate::context::CLAIM_IN_PROGRESS;
use crate::device_status::DeviceStatus;
use crate::driver::{Driver, PluginEvent, PreparedClaim};
use crate::metrics::{Operation, PluginMetrics};
use crate::plugin::reports::{ClaimReports, check_statuses};

/// Calls the plugin's fault-injection hook at a named step (feature `fault-injection`, test
/// only); compiled out without the feature.
macro_rules! fault_point {
    ($node:expr, $step:ident) => {
        #[cfg(feature = "fault-injection")]
        if let Some(hook) = &$node.fault_hook {
            hook(crate::advanced::fault_injection::Step::$step);
        }
    };
}

/// Result of preparing one claim: its devices, or the message the kubelet shows.
pub(crate) type PrepareResult = Result<Vec<PreparedDeviceRecord>, String>;

/// Result of unpreparing one claim.
pub(crate) type UnprepareResult = Result<(), String>;

/// What preparing one claim produced: its device records, the driver's state and the device
/// statuses to write once it is recorded.
type Prepared = (
    Vec<PreparedDeviceRecord>,
    Option<serde_json::Value>,
    Vec<DeviceStatus>,
);

pub(crate) struct NodeService<D: Driver> {
    pub(crate) driver: Arc<D>,
    pub(crate) driver_name: String,
    pub(crate) registry: ConfigRegistry<D::Config>,
    pub(crate) reader: ClaimReader,
    pub(crate) checkpoint: Arc<Checkpoint>,
    pub(crate) cdi: SpecWriter,
    pub(crate) locks: ClaimLocks,
    /// The same claims, locked across the plugin instances of the node (rolling updates).
    pub(crate) claim_files: ClaimFileLocks,
    pub(crate) metrics: Arc<PluginMetrics>,
    /// The node-wide lock, when the driver asked for serialized operations.
    pub(crate) serial: Option<NodeLock>,
    /// Device metadata and device status, for a driver that opted in.
    pub(crate) reports: ClaimReports,
    /// Called at each named step of prepare and unprepare (crash tests).
    #[cfg(feature = "fault-injection")]
    pub(crate) fault_hook: Option<crate::advanced::fault_injection::FaultHook>,
}

impl<D: Driver> NodeService<D> {
    pub(crate) async fn prepare(&self, claims: Vec<ClaimRef>) -> BTreeMap<String, PrepareResult> {
        let claims = unique_by_uid(claims);
        let _timer = self.metrics.request(Operation::Prepare, claims.len());
        let mut steps = StepTimes::new("prepare", claims.len());
        let _guards = self
            .locks
            .lock_all(claims.iter().map(|c| c.uid.as_str()))
            .await;
        let _files = match self.lock_files(&claims, Operation::Prepare).await {
            Ok(guards) => guards,
            Err(failed) => return failed,
        };
        steps.mark("lock");
        fault_point!(self, PrepareLocked);

        // Claims the checkpoint already answers need no read. For the others, the intent is
        // recorded while they are read: the read is the slowest step of a prepare, and the
        // record only has to precede the driver's side effects, not the read.
        let mut results = BTreeMap::new();
        let mut to_read = Vec::new();
        for claim in &claims {
            match self.checkpoint.get(&claim.uid) {
                Ok(Some(record)) if record.is_completed() => {
                    tracing::debug!(claim = %claim, "claim already prepared, answering from the checkpoint");
                    results.insert(claim.uid.clone(), Ok(record.devices));
                }
                Ok(Some(record)) if record.state == ClaimState::UnprepareStarted => {
                    // An unprepare of this claim did not finish: the driver may have released
                    // part of it. Finish the release, then prepare it anew (the new
                    // PrepareStarted record replaces this one).
                    let span = claim_span("finish_unprepare", &self.driver_name, claim);
                    match self.release(claim, &record).instrument(span).await {
                        Ok(()) => to_read.push((claim, false)),
                        Err((kind, message)) => {
                            self.metrics.claim_error(Operation::Prepare, kind);
                            results.insert(
                                claim.uid.clone(),
                                Err(format!("finishing an interrupted unprepare: {message}")),
                            );
                        }
                    }
                }
                Ok(record) => to_read.push((claim, record.is_some())),
                Err(error) => {
                    self.metrics.claim_error(Operation::Prepare, "checkpoint");
                    results.insert(
                        claim.uid.clone(),
                        Err(format!("reading the checkpoint: {error}")),
                    );
                }
            }
        }
        if to_read.is_empty() {
            return results;
        }
        let started = to_read
            .iter()
            .map(|(claim, _)| ClaimChange::Put {
                uid: claim.uid.clone(),
                record: started_record(claim),
            })
            .collect();
        let (recorded, loaded) = tokio::join!(
            self.write_checkpoint(started),
            join_all(to_read.iter().map(|(claim, _)| {
                let span = claim_span("load", &self.driver_name, claim);
                self.load((*claim).clone()).instrument(span)
            }))
        );
        steps.mark("read_and_record_started");
        if let Err(error) = recorded {
            for (claim, _) in to_read {
                self.metrics.claim_error(Operation::Prepare, "checkpoint");
                results.insert(
                    claim.uid.clone(),
                    Err(format!("recording the claim in the checkpoint: {error}")),
                );
            }
            return results;
        }
        fault_point!(self, PrepareStartedRecorded);

        let mut ready = Vec::new();
        // Records of this batch's intent for claims that failed before the driver saw them:
        // removed with the batch's last write. A record from an earlier attempt stays, since
        // that attempt's driver call may have left work to roll back.
        let mut never_started = Vec::new();
        for ((claim, had_record), loaded) in to_read.iter().zip(loaded) {
            match loaded {
                Ok(resolved) => ready.push(resolved),
                Err((kind, message)) => {
                    self.metrics.claim_error(Operation::Prepare, kind);
                    results.insert(claim.uid.clone(), Err(message));
                    if !had_record {
                        never_started.push(ClaimChange::Remove {
                            uid: claim.uid.clone(),
                        });
                    }
                }
            }
        }
        if ready.is_empty() {
            self.forget_never_started(never_started).await;
            return results;
        }
        // Serialized mode: from the driver's first side effect to the last record, no other
        // batch on the node runs.
        let _serial = match self.serialize().await {
            Ok(guard) => guard,
            Err(error) => {
                for claim in ready {
                    self.metrics.claim_error(Operation::Prepare, "lock");
                    results.insert(claim.claim.uid.clone(), Err(error.to_string()));
                }
                self.forget_never_started(never_started).await;
                return results;
            }
        };

        let prepared = join_all(ready.iter().map(|claim| {
            let span = claim_span("prepare", &self.driver_name, &claim.claim);
            CLAIM_IN_PROGRESS.scope(
                claim.claim.uid.clone(),
                self.prepare_one(claim).instrument(span),
            )
        }))
        .await;
        steps.mark("driver_and_cdi");

        let mut completed = Vec::new();
        let mut pending = Vec::new();
        for (claim, outcome) in ready.iter().zip(prepared) {
            match outcome {
                Ok((devices, driver_state, statuses)) => {
                    completed.push(ClaimChange::Put {
                        uid: claim.claim.uid.clone(),
                        record: completed_record(&claim.claim, devices.clone(), driver_state),
                    });
                    pending.push((&claim.claim, devices, statuses));
                }
                Err((kind, message)) => {
                    // The PrepareStarted record stays: the driver may have done part of the
                    // work, and a later unprepare or restart cleans it up.
                    self.metrics.claim_error(Operation::Prepare, kind);
                    results.insert(claim.claim.uid.clone(), Err(message));
                }
            }
        }
        if completed.is_empty() {
            self.forget_never_started(never_started).await;
        } else {
            completed.extend(never_started);
            let recorded = self.write_checkpoint(completed).await;
            steps.mark("record_completed");
            match recorded {
                Ok(()) => {
                    self.metrics.add_prepared_claims(pending.len() as i64);
                    fault_point!(self, PrepareCompletedRecorded);
                    // Status only once the claim is recorded: unprepare then clears it.
                    join_all(pending.iter().map(|(claim, _, statuses)| {
                        let span = claim_span("device_status", &self.driver_name, claim);
                        async move {
                            self.reports
                                .write_status(self.driver.as_ref(), claim, statuses)
                                .await;
                            fault_point!(self, DeviceStatusWritten);
                        }
                        .instrument(span)
                    }))
                    .await;
                    for (claim, devices, _) in pending {
                        results.insert(claim.uid.clone(), Ok(devices));
                    }
                }
                Err(error) => {
                    for (claim, _, _) in pending {
                        let uid = claim.uid.clone();
                        self.metrics.claim_error(Operation::Prepare, "checkpoint");
                        results.insert(
                            uid,
                            Err(format!(
                                "recording the prepared claim in the checkpoint: {error}"
                            )),
                        );
                    }
                }
            }
        }
        results
    }

    /// Reads a claim from the API server and resolves it for the driver.
    async fn load(&self, claim: ClaimRef) -> Result<Claim<D::Config>, (&'static str, String)> {
        let object = self
            .reader
            .read(&claim)
            .await
            .map_err(|error| (error.kind(), error.to_string()))?;
        let claim =
            crate::claim::read::resolve(claim, Arc::new(object), &self.driver_name, &self.registry)
                .map_err(|error| (error.kind(), error.to_string()))?;
        // Checked before the driver sees the claim, and only for claims that are not prepared
        // yet: a prepared claim keeps what it was prepared with (the checkpoint answers it).
        let context = self.reports.context();
        if let Some(message) = claim.devices.iter().find_map(|allocated| {
            context.unpublished(&allocated.device.pool, &allocated.device.name)
        }) {
            return Err(("stale_allocation", message));
        }
        Ok(claim)
    }

    /// Removes the intent records of claims that failed before the driver saw them. Best
    /// effort: a record left behind is rolled back (a no-op for the driver) at the next start,
    /// or removed by the claim's unprepare.
    async fn forget_never_started(&self, changes: Vec<ClaimChange>) {
        if changes.is_empty() {
            return;
        }
        if let Err(error) = self.write_checkpoint(changes).await {
            tracing::warn!(%error, "removing the records of claims that were never prepared");
        }
    }

    /// Calls the driver and writes the CDI spec (and device metadata) of one claim.
    async fn prepare_one(
        &self,
        claim: &Claim<D::Config>,
    ) -> Result<Prepared, (&'static str, String)> {
        let prepared = guarded(self.driver.prepare(claim)).await?;
        fault_point!(self, DriverPrepared);
        check_prepared(claim, &prepared).map_err(|message| ("driver_output", message))?;
        check_statuses(
            claim,
            &prepared.device_status,
            self.reports.reports_status(),
        )
        .map_err(|message| ("driver_output", message))?;

        let spec_devices = cdi_devices(&prepared);
        // Spec-level edits only reach containers through one of the spec's devices, so a
        // claim without device edits needs no spec at all.
        let ids = if spec_devices.is_empty() {
            Vec::new()
        } else {
            self.cdi
                .write_claim(&claim.claim.uid, &prepared.common_edits, &spec_devices)
                .map_err(|error| ("cdi", format!("writing the CDI spec: {error}")))?
        };
        fault_point!(self, CdiSpecWritten);

        // Map CDI names back to devices; devices with empty edits get no CDI ID of the SDK's,
        // only the driver's own.
        let mut ids = ids.into_iter();
        let mut records: Vec<PreparedDeviceRecord> = Vec::with_capacity(prepared.devices.len());
        for device in &prepared.devices {
            let mut cdi_device_ids = if device.edits.is_empty() {
                Vec::new()
            } else {
                ids.next()
                    .map(|id| vec![id.to_string()])
                    .unwrap_or_default()
            };
            cdi_device_ids.extend(device.cdi_device_ids.iter().cloned());
            let existing = records.iter_mut().find(|r| {
                r.pool == device.device.pool
                    && r.device == device.device.name
                    && r.share_id == device.share_id
            });
            match existing {
                // The same device allocated for two requests: one entry, both names.
                Some(record) => {
                    if !record.request_names.contains(&device.request) {
                        record.request_names.push(device.request.clone());
                    }
                    record.cdi_device_ids.extend(cdi_device_ids);
                }
                None => records.push(device_record(
                    vec![device.request.clone()],
                    &device.device.pool,
                    &device.device.name,
                    device.share_id.clone(),
                    cdi_device_ids,
                )),
            }
        }
        self.reports
            .write_metadata(claim, &mut records)
            .map_err(|message| ("metadata", message))?;
        fault_point!(self, MetadataWritten);
        tracing::info!(devices = records.len(), "claim prepared");
        Ok((records, prepared.driver_state, prepared.device_status))
    }

    pub(crate) async fn unprepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> BTreeMap<String, UnprepareResult> {
        let claims = unique_by_uid(claims);
        let _timer = self.metrics.request(Operation::Unprepare, claims.len());
        let _guards = self
            .locks
            .lock_all(claims.iter().map(|c| c.uid.as_str()))
            .await;
        let _files = match self.lock_files(&claims, Operation::Unprepare).await {
            Ok(guards) => guards,
            Err(failed) => return failed,
        };
        let _serial = match self.serialize().await {
            Ok(guard) => guard,
            Err(error) => {
                return claims
                    .iter()
                    .map(|claim| {
                        self.metrics.claim_error(Operation::Unprepare, "lock");
                        (claim.uid.clone(), Err(error.to_string()))
                    })
                    .collect();
            }
        };

        fault_point!(self, UnprepareLocked);

        let mut results = BTreeMap::new();
        // Each claim's record, read under its locks.
        let mut work = Vec::with_capacity(claims.len());
        for claim in &claims {
            match self.checkpoint.get(&claim.uid) {
                Ok(record) => work.push((claim, record)),
                Err(error) => {
                    self.metrics.claim_error(Operation::Unprepare, "checkpoint");
                    results.insert(
                        claim.uid.clone(),
                        Err(format!("reading the checkpoint: {error}")),
                    );
                }
            }
        }
        // Before the driver releases anything of a prepared claim, its record says so: a
        // process killed between the release and the record's removal must not serve the
        // claim's half-released devices to a repeated prepare after its restart, which
        // finishes the unprepare instead. One write for the batch.
        let marks: Vec<ClaimChange> = work
            .iter()
            .filter_map(|(claim, record)| match record {
                Some(record) if record.is_completed() => Some(ClaimChange::Put {
                    uid: claim.uid.clone(),
                    record: record.clone().into_unprepare_started(),
                }),
                _ => None,
            })
            .collect();
        if !marks.is_empty() {
            let marked = marks.len() as i64;
            match self.write_checkpoint(marks).await {
                // No longer served from the checkpoint: not counted as prepared.
                Ok(()) => self.metrics.add_prepared_claims(-marked),
                Err(error) => {
                    // Nothing was released yet; the kubelet retries the unprepare.
                    work.retain(|(claim, record)| {
                        let completed = record.as_ref().is_some_and(ClaimRecord::is_completed);
                        if completed {
                            self.metrics.claim_error(Operation::Unprepare, "checkpoint");
                            results.insert(
                                claim.uid.clone(),
                                Err(format!(
                                    "recording the start of the unprepare in the checkpoint: {error}"
                                )),
                            );
                        }
                        !completed
                    });
                }
            }
            fault_point!(self, UnprepareStartedRecorded);
        }

        let outcomes = join_all(work.iter().map(|(claim, record)| {
            let span = claim_span("unprepare", &self.driver_name, claim);
            CLAIM_IN_PROGRESS.scope(
                claim.uid.clone(),
                self.unprepare_one(claim, record.as_ref()).instrument(span),
            )
        }))
        .await;

        let mut removals = Vec::new();
        for ((claim, _), outcome) in work.iter().zip(outcomes) {
            match outcome {
                Ok(true) => {
                    removals.push(ClaimChange::Remove {
                        uid: claim.uid.clone(),
                    });
                    results.insert(claim.uid.clone(), Ok(()));
                }
                Ok(false) => {
                    results.insert(claim.uid.clone(), Ok(()));
                }
                Err((kind, message)) => {
                    // The record stays (`UnprepareStarted` for a prepared claim): the
                    // kubelet's retry, or the next start, finishes the unprepare.
                    self.metrics.claim_error(Operation::Unprepare, kind);
                    results.insert(claim.uid.clone(), Err(message));
                }
            }
        }
        if !removals.is_empty() {
            let uids: Vec<String> = removals
                .iter()
                .filter_map(|change| match change {
                    ClaimChange::Remove { uid } => Some(uid.clone()),
                    ClaimChange::Put { .. } => None,
                })
                .collect();
            match self.write_checkpoint(removals).await {
                Ok(()) => {
                    fault_point!(self, UnprepareRecordRemoved);
                }
                Err(error) => {
                    // The driver already released the devices; unprepare is idempotent, so
                    // the kubelet's retry finishes the job.
                    for uid in uids {
                        self.metrics.claim_error(Operation::Unprepare, "checkpoint");
                        results.insert(
                            uid,
                            Err(format!("removing the claim from the checkpoint: {error}")),
                        );
                    }
                }
            }
        }
        results
    }

    /// Unprepares one claim given its record, read under its lock; `Ok(true)` when the
    /// record must be removed.
    async fn unprepare_one(
        &self,
        claim: &ClaimRef,
        record: Option<&ClaimRecord>,
    ) -> Result<bool, (&'static str, String)> {
        let Some(record) = record else {
            // Never prepared here (or already unprepared): success, and make sure no spec is
            // left behind either.
            self.cdi
                .remove_claim(&claim.uid)
                .map_err(|error| ("cdi", format!("removing the CDI spec: {error}")))?;
            self.reports
                .remove_metadata(claim)
                .map_err(|message| ("metadata", message))?;
            tracing::debug!("claim not prepared on this node; nothing to do");
            return Ok(false);
        };
        self.release(claim, record).await?;
        tracing::info!("claim unprepared");
        Ok(true)
    }

    /// Undoes everything a prepare of `claim` did, the record aside: the driver's unprepare,
    /// the CDI spec, the device metadata and the device status. Idempotent, so an interrupted
    /// release can run again.
    async fn release(
        &self,
        claim: &ClaimRef,
        record: &ClaimRecord,
    ) -> Result<(), (&'static str, String)> {
        let recorded = record.recorded(claim.clone());
        guarded(self.driver.unprepare(&recorded)).await?;
        fault_point!(self, DriverUnprepared);
        self.cdi
            .remove_claim(&claim.uid)
            .map_err(|error| ("cdi", format!("removing the CDI spec: {error}")))?;
        fault_point!(self, CdiSpecRemoved);
        self.reports
            .remove_metadata(claim)
            .map_err(|message| ("metadata", message))?;
        fault_point!(self, MetadataRemoved);
        self.reports.clear_status(self.driver.as_ref(), claim).await;
        fault_point!(self, DeviceStatusCleared);
        Ok(())
    }

    /// Brings state left by a previous run in line before the plugin registers: rolls back
    /// interrupted prepares and removes CDI specs and device metadata of claims no instance
    /// records (`plugin/sweep.rs`).
    ///
    /// Another instance may be serving the node at the same time (a rolling update), so
    /// nothing here trusts a snapshot: a `PrepareStarted` record is rolled back only when its
    /// claim's lock file is free (a live instance holds it for the whole prepare, a dead one
    /// cannot), and re-read under that lock; a spec or metadata file is removed only under its
    /// claim's lock, after the checkpoint, re-read then, shows no instance records the claim,
    /// and only if it was written before this recovery started. `sweep` is false when the
    /// checkpoint was not read intact (corrupt, missing, from another boot, records
    /// unreadable): then no file is removed, since the kubelet may still consider those claims
    /// prepared.
    pub(crate) async fn recover(&self, sweep: bool) -> Result<(), CheckpointError> {
        // Files younger than this were written by someone who decided after this start began.
        let started = SystemTime::now();
        let records = self.checkpoint.records()?;
        for (uid, record) in &records {
            let claim = ClaimRef {
                uid: uid.clone(),
                namespace: record.namespace.clone(),
                name: record.name.clone(),
            };
            match record.state {
                ClaimState::PrepareStarted => {
                    let span = claim_span("rollback", &self.driver_name, &claim);
                    self.roll_back(claim).instrument(span).await?;
                }
                ClaimState::UnprepareStarted => {
                    let span = claim_span("finish_unprepare", &self.driver_name, &claim);
                    self.finish_unprepare(claim).instrument(span).await?;
                }
                _ => {}
            }
        }
        if sweep {
            self.sweep_orphans(started);
        } else {
            // Only worth a warning when something is kept: a first start (no checkpoint, none
            // of our files) is not a problem.
            let kept = self.cdi.claim_files().map_or(0, |files| files.len())
                + self
                    .reports
                    .list_metadata()
                    .map_or(0, |listing| listing.claims.len());
            if kept > 0 {
                tracing::warn!(
                    kept,
                    "the checkpoint was not read intact at start; keeping every CDI spec and metadata file (claims the kubelet considers prepared keep working; unprepare removes their files)"
                );
            } else {
                tracing::debug!("no intact checkpoint and no claim files on disk: nothing to keep");
            }
        }
        let completed = self
            .checkpoint
            .records()?
            .values()
            .filter(|record| record.is_completed())
            .count();
        self.metrics.set_prepared_claims(completed);
        Ok(())
    }

    /// The claim's cross-process lock for recovery, unless a live instance holds it (it is
    /// working on the claim) or it cannot be taken (logged; the work is left for later).
    fn recovery_lock(&self, claim: &ClaimRef) -> Option<ClaimFileGuard> {
        match self.claim_files.try_lock(&claim.uid) {
            Ok(Some(guard)) => Some(guard),
            Ok(None) => {
                tracing::info!(
                    "another plugin instance is working on this claim; leaving it to that instance"
                );
                None
            }
            Err(error) => {
                tracing::warn!(%error, "cannot lock the claim; leaving its interrupted operation for later");
                None
            }
        }
    }

    /// Finishes one interrupted unprepare (the kubelet was not answered, so it unprepares the
    /// claim again anyway), unless a live instance is working on the claim. A failure is
    /// logged and leaves the record: the kubelet's next unprepare of the claim retries.
    async fn finish_unprepare(&self, claim: ClaimRef) -> Result<(), CheckpointError> {
        let Some(_guard) = self.recovery_lock(&claim) else {
            return Ok(());
        };
        // Re-read under the lock, as in `roll_back`.
        let record = match self.checkpoint.get(&claim.uid)? {
            Some(record) if record.state == ClaimState::UnprepareStarted => record,
            _ => return Ok(()),
        };
        match self.release(&claim, &record).await {
            Ok(()) => {
                self.write_checkpoint(vec![ClaimChange::Remove {
                    uid: claim.uid.clone(),
                }])
                .await?;
                tracing::info!(claim = %claim, "finished an interrupted unprepare");
            }
            Err((_, error)) => {
                tracing::warn!(claim = %claim, %error, "finishing an interrupted unprepare failed; the kubelet's next unprepare of the claim retries");
            }
        }
        Ok(())
    }

    /// Rolls back one interrupted prepare, unless a live instance is working on the claim.
    async fn roll_back(&self, claim: ClaimRef) -> Result<(), CheckpointError> {
        let Some(_guard) = self.recovery_lock(&claim) else {
            return Ok(());
        };
        // Under the lock, the record may have changed since the first read: completed by the
        // instance that held the lock, or removed by its unprepare.
        let record = match self.checkpoint.get(&claim.uid)? {
            Some(record) if record.state == ClaimState::PrepareStarted => record,
            _ => return Ok(()),
        };
        let recorded = record.recorded(claim.clone());
        let outcome = guarded(self.driver.rollback(&recorded)).await;
        match outcome
            .map_err(|(_, message)| message)
            .and_then(|()| self.cdi.remove_claim(&claim.uid).map_err(|e| e.to_string()))
            .and_then(|()| self.reports.remove_metadata(&claim))
        {
            Ok(()) => {
                // Written while the claim is still locked: after the unlock another instance
                // may prepare it again, and its new record must not be removed.
                self.write_checkpoint(vec![ClaimChange::Remove {
                    uid: claim.uid.clone(),
                }])
                .await?;
                tracing::info!(claim = %claim, "rolled back an interrupted prepare");
            }
            Err(error) => {
                tracing::warn!(claim = %claim, %error, "rollback of an interrupted prepare failed");
                self.driver
                    .on_event(&PluginEvent::RollbackFailed { claim, error });
            }
        }
        Ok(())
    }

    /// Takes the batch's cross-process claim locks; on failure, the answer for every claim.
    async fn lock_files<T>(
        &self,
        claims: &[ClaimRef],
        operation: Operation,
    ) -> Result<Vec<ClaimFileGuard>, BTreeMap<String, Result<T, String>>> {
        self.claim_files
            .lock_all(claims.iter().map(|c| c.uid.as_str()))
            .await
            .map_err(|error| {
                tracing::warn!(%error, "cannot lock the batch's claims");
                claims
                    .iter()
                    .map(|claim| {
                        self.metrics.claim_error(operation, "lock");
                        (claim.uid.clone(), Err(error.to_string()))
                    })
                    .collect()
            })
    }

    /// Takes the node-wide lock in serialized mode; `None` otherwise.
    pub(crate) async fn serialize(&self) -> std::io::Result<Option<NodeGuard<'_>>> {
        match &self.serial {
            Some(lock) => lock.lock().await.map(Some),
            None => Ok(None),
        }
    }

    async fn write_checkpoint(&self, changes: Vec<ClaimChange>) -> Result<(), CheckpointError> {
        let checkpoint = Arc::clone(&self.checkpoint);
        // The file lock may briefly block on another plugin instance: keep it off the runtime.
        match tokio::task::spawn_blocking(move || checkpoint.update(changes)).await {
            Ok(result) => result,
            Err(join_error) => Err(CheckpointError::Write {
                path: self.checkpoint.path().to_path_buf(),
                source: std::io::Error::other(format!(
                    "checkpoint writer task failed: {join_error}"
                )),
            }),
        }
    }
}

fn claim_span(operation: &'static str, driver: &str, claim: &ClaimRef) -> tracing::Span {
    tracing::info_span!(
        "claim",
        operation,
        driver = %driver,
        claim.uid = %claim.uid,
        claim.namespace = %claim.namespace,
        claim.name = %claim.name,
    )
}

/// Keeps the first occurrence of each UID, in a stable order.
fn unique_by_uid(claims: Vec<ClaimRef>) -> Vec<ClaimRef> {
    let mut seen = HashSet::new();
    claims
        .into_iter()
        .filter(|claim| seen.insert(claim.uid.clone()))
        .collect()
}

/// The driver may only return devices that were allocated to this claim for it.
fn check_prepared<C>(claim: &Claim<C>, prepared: &PreparedClaim) -> Result<(), String> {
    for device in &prepared.devices {
        let allocated = claim.devices.iter().any(|allocated| {
            allocated.device == device.device && allocated.share_id == device.share_id
        });
        if !allocated {
            return Err(format!(
                "driver returned device {} which is not allocated to this claim by this driver",
                device.device
            ));
        }
        for id in &device.cdi_device_ids {
            if let Err(error) = id.parse::<crate::cdi::QualifiedName>() {
                return Err(format!(
                    "driver returned CDI device ID {id:?} for device {}, which is not a qualified CDI name: {error}",
                    device.device
                ));
            }
        }
    }
    Ok(())
}

/// One CDI device per prepared device with edits; names unique within the claim.
fn cdi_devices(prepared: &PreparedClaim) -> Vec<ClaimDevice> {
    let mut names = HashSet::new();
    prepared
        .devices
        .iter()
        .filter(|device| !device.edits.is_empty())
        .enumerate()
        .map(|(index, device)| {
            let mut name = match &device.share_id {
                Some(share) => format!("{}-{share}", device.device.name),
                None => device.device.name.clone(),
            };
            // Two pools may both have a `gpu-0`; pools can contain `/`, so use an index.
            if !names.insert(name.clone()) {
                name = format!("{name}-{index}");
                names.insert(name.clone());
            }
            ClaimDevice {
                name,
                edits: device.edits.clone(),
            }
        })
        .collect()
}

fn started_record(claim: &ClaimRef) -> ClaimRecord {
    ClaimRecord::started(&claim.namespace, &claim.name)
}

fn completed_record(
    claim: &ClaimRef,
    devices: Vec<PreparedDeviceRecord>,
    driver_state: Option<serde_json::Value>,
) -> ClaimRecord {
    let record = ClaimRecord::started(&claim.namespace, &claim.name);
    match driver_state {
        Some(state) => record.with_driver_state(state),
        None => record,
    }
    .into_completed(devices)
}

fn device_record(
    request_names: Vec<String>,
    pool: &str,
    device: &str,
    share_id: Option<String>,
    cdi_device_ids: Vec<String>,
) -> PreparedDeviceRecord {
    let mut record = PreparedDeviceRecord::new(pool, device);
    record.request_names = request_names;
    record.share_id = share_id;
    record.cdi_device_ids = cdi_device_ids;
    record
}

/// Awaits a driver call, turning its error, or its panic, into `(metrics kind, message)` for
/// this claim alone. With `panic = "unwind"` (Cargo's default) a bug hit by one claim must not
/// fail the rest of the batch or lose their checkpoint records; the claim keeps its
/// PrepareStarted record, so unprepare or the next start cleans up after it. (Built with
/// `panic = "abort"`, the process ends instead and the next start does the same.)
async fn guarded<T>(
    call: impl Future<Output = Result<T, DriverError>>,
) -> Result<T, (&'static str, String)> {
    match AssertUnwindSafe(call).catch_unwind().await {
        Ok(result) => result.map_err(|error| (error.kind(), error.to_string())),
        Err(panic) => Err((
            "panic",
            format!("the driver panicked: {}", panic_message(panic.as_ref())),
        )),
    }
}

pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// Wall-clock time of each step of one batch, logged at debug level (target
/// `dra_sdk::timing`) when the batch ends: where a prepare's time goes against a real API
/// server, without a profiler (`RUST_LOG=dra_sdk::timing=debug`).
struct StepTimes {
    operation: &'static str,
    claims: usize,
    started: std::time::Instant,
    last: std::time::Instant,
    steps: Vec<(&'static str, std::time::Duration)>,
}

impl StepTimes {
    fn new(operation: &'static str, claims: usize) -> Self {
        let now = std::time::Instant::now();
        Self {
            operation,
            claims,
            started: now,
            last: now,
            steps: Vec::with_capacity(6),
        }
    }

    /// Ends the step named `step`; the next one starts now.
    fn mark(&mut self, step: &'static str) {
        let now = std::time::Instant::now();
        self.steps.push((step, now - self.last));
        self.last = now;
    }
}

impl Drop for StepTimes {
    fn drop(&mut self) {
        if !tracing::enabled!(target: "dra_sdk::timing", tracing::Level::DEBUG) {
            return;
        }
        let mut steps = String::new();
        for (step, took) in &self.steps {
            use std::fmt::Write as _;
            let _ = write!(steps, "{step}={}us ", took.as_micros());
        }
        tracing::debug!(
            target: "dra_sdk::timing",
            operation = self.operation,
            claims = self.claims,
            total_us = self.started.elapsed().as_micros() as u64,
            steps = steps.trim_end(),
            "batch step times"
        );
    }
}
