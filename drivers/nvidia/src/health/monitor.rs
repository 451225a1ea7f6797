//! The policy as a state machine ([`HealthTracker`]) and the task that feeds it
//! ([`HealthMonitor`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use dra_sdk::context::DriverContext;
use dra_sdk::health::DeviceState;
use dra_sdk::slices::{DeviceTaint, TaintEffect};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::Instrument;

use super::{HealthPolicy, RESET_ALL, TAINT_GPU_LOST, TAINT_UNMONITORED, TAINT_XID};
use crate::backend::events::{HealthEvent, HealthEventKind, RecoveryAction};
use crate::backend::{BackendError, GpuBackend};
use crate::devices::Discovery;

/// Which published devices an event on a UUID concerns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceMap {
    /// GPU UUID → the GPU's device name (none when MIG is on: only its MIG devices are
    /// published) and its MIG devices' names.
    gpus: BTreeMap<String, (Option<String>, Vec<String>)>,
    /// MIG UUID → the MIG device's name.
    migs: BTreeMap<String, String>,
    /// Devices of partitionable GPUs (dynamic MIG) → the GPU's minor: they are published in
    /// the GPU's own pool (`<node>/gpu-<minor>`).
    partitioned: BTreeMap<String, u32>,
}

impl DeviceMap {
    /// The full GPUs and static MIG devices of a discovery. VFIO devices are not watched:
    /// NVML does not see a GPU bound to VFIO (and the gates exclude each other).
    pub fn from_discovery(discovery: &Discovery) -> Self {
        let mut map = Self::default();
        for gpu in &discovery.gpus {
            map = map.with_gpu(gpu.info.uuid.clone(), gpu.name.clone());
        }
        for mig in &discovery.migs {
            map = map.with_mig(&mig.parent.uuid, mig.mig.uuid.clone(), mig.name.clone());
        }
        for gpu in discovery
            .gpus
            .iter()
            .filter(|gpu| gpu.partitionable.is_some())
        {
            map.partitioned.insert(gpu.name.clone(), gpu.info.minor);
        }
        for partition in &discovery.partitions {
            map = map.with_partition(
                &partition.parent.uuid,
                partition.parent.minor,
                &partition.name,
            );
        }
        map
    }

    /// Adds a MIG partition (dynamic MIG) of the GPU `parent_uuid`: an event on the GPU, or
    /// on any MIG device of it, concerns every partition, since which partition an instance
    /// serves is not known until it is prepared (and any of them may be prepared next).
    pub fn with_partition(mut self, parent_uuid: &str, parent_minor: u32, name: &str) -> Self {
        self.gpus
            .entry(parent_uuid.to_owned())
            .or_default()
            .1
            .push(name.to_owned());
        self.partitioned.insert(name.to_owned(), parent_minor);
        self
    }

    /// The pool of a device, in a node whose own pool is `node_pool`.
    fn pool(&self, node_pool: &str, device: &str) -> String {
        match self.partitioned.get(device) {
            Some(minor) => crate::devices::partition_pool_name(node_pool, *minor),
            None => node_pool.to_owned(),
        }
    }

    /// Adds a full GPU.
    pub fn with_gpu(mut self, uuid: impl Into<String>, name: impl Into<String>) -> Self {
        self.gpus.entry(uuid.into()).or_default().0 = Some(name.into());
        self
    }

    /// Adds a MIG device of the GPU `parent_uuid`.
    pub fn with_mig(
        mut self,
        parent_uuid: &str,
        uuid: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        let name = name.into();
        self.gpus
            .entry(parent_uuid.to_owned())
            .or_default()
            .1
            .push(name.clone());
        self.migs.insert(uuid.into(), name);
        self
    }

    /// The GPU UUIDs, for registration.
    pub fn gpu_uuids(&self) -> Vec<String> {
        self.gpus.keys().cloned().collect()
    }

    /// Every device name.
    pub fn devices(&self) -> BTreeSet<String> {
        self.gpus
            .values()
            .flat_map(|(gpu, migs)| gpu.iter().chain(migs))
            .cloned()
            .collect()
    }

    /// The UUID of the GPU a device is (or is on).
    fn gpu_of(&self, device: &str) -> Option<&str> {
        self.gpus
            .iter()
            .find(|(_, (gpu, migs))| {
                gpu.as_deref() == Some(device) || migs.iter().any(|mig| mig == device)
            })
            .map(|(uuid, _)| uuid.as_str())
    }

    /// The devices an event on `uuid` affects; `None` when the UUID is unknown.
    fn affected(&self, uuid: &str) -> Option<Vec<String>> {
        if let Some((gpu, migs)) = self.gpus.get(uuid) {
            return Some(gpu.iter().chain(migs).cloned().collect());
        }
        self.migs.get(uuid).map(|mig| vec![mig.clone()])
    }
}

/// One device's faults: taint key → (value, effect, message).
#[derive(Clone, Debug, Default)]
struct Faults {
    taints: BTreeMap<String, (Option<String>, TaintEffect, String)>,
    last_event: Option<Instant>,
}

impl Faults {
    fn is_unhealthy(&self) -> bool {
        self.taints
            .values()
            .any(|(_, effect, _)| *effect != TaintEffect::None)
    }
}

/// The health policy as a state machine: events, elapsed time and operator resets in,
/// device states out. No I/O, so every rule is unit-tested.
#[derive(Debug)]
pub struct HealthTracker {
    pool: String,
    policy: HealthPolicy,
    map: DeviceMap,
    faults: BTreeMap<String, Faults>,
    /// Every device is unmonitored (the event stream failed), and why.
    unmonitored: Option<String>,
    /// Devices of GPUs whose event registration failed alone, and why.
    unmonitored_devices: BTreeMap<String, String>,
}

impl HealthTracker {
    /// A tracker of the devices in `map`, published in `pool`; every device starts Healthy.
    pub fn new(pool: impl Into<String>, policy: HealthPolicy, map: DeviceMap) -> Self {
        Self {
            pool: pool.into(),
            policy,
            map,
            faults: BTreeMap::new(),
            unmonitored: None,
            unmonitored_devices: BTreeMap::new(),
        }
    }

    /// The state of every device.
    pub fn states(&self) -> Vec<DeviceState> {
        self.map
            .devices()
            .iter()
            .map(|device| self.state(device))
            .collect()
    }

    /// The state of one device.
    pub fn state(&self, device: &str) -> DeviceState {
        let faults = self.faults.get(device);
        let pool = &self.map.pool(&self.pool, device);
        let unmonitored =
            self.unmonitored.is_some() || self.unmonitored_devices.contains_key(device);
        let mut state = match (faults, unmonitored) {
            (Some(faults), _) if faults.is_unhealthy() => {
                let message = faults
                    .taints
                    .values()
                    .filter(|(_, effect, _)| *effect != TaintEffect::None)
                    .map(|(_, _, message)| message.as_str())
                    .collect::<Vec<_>>()
                    .join("; ");
                DeviceState::unhealthy(pool, device, message)
            }
            (_, true) => match self.unmonitored_devices.get(device) {
                Some(reason) => DeviceState::unknown(pool, device).with_message(reason.clone()),
                None => DeviceState::unknown(pool, device),
            },
            _ => DeviceState::healthy(pool, device),
        };
        if let Some(faults) = faults {
            for (key, (value, effect, _)) in &faults.taints {
                let mut taint = DeviceTaint::new(key.clone(), *effect);
                if let Some(value) = value {
                    taint = taint.value(value.clone());
                }
                state = state.with_taint(taint);
            }
        }
        if unmonitored {
            state = state.with_taint(DeviceTaint::new(TAINT_UNMONITORED, TaintEffect::None));
        }
        state
    }

    /// Events cannot be watched (registration failed or the stream broke): every device is
    /// Unknown and carries the `unmonitored` taint, on top of the faults seen so far.
    pub fn unmonitored(&mut self, reason: impl Into<String>) -> Vec<DeviceState> {
        self.unmonitored = Some(reason.into());
        self.states()
    }

    /// Applies an event; the states of the devices it changed.
    pub fn on_event(&mut self, event: &HealthEvent, now: Instant) -> Vec<DeviceState> {
        if event.kind == HealthEventKind::Unmonitored {
            let Some(affected) = self.map.affected(&event.uuid) else {
                tracing::warn!(uuid = %event.uuid, "unmonitored event on an unknown device; ignored");
                return Vec::new();
            };
            for device in &affected {
                self.unmonitored_devices.insert(
                    device.clone(),
                    format!("no health events from {}", event.uuid),
                );
            }
            return affected.iter().map(|device| self.state(device)).collect();
        }
        let (key, value, effect) = match event.kind {
            HealthEventKind::Xid(xid) => {
                let effect = if self.policy.ignored_xids.contains(&xid) {
                    TaintEffect::None
                } else {
                    TaintEffect::NoSchedule
                };
                (TAINT_XID, Some(xid.to_string()), effect)
            }
            HealthEventKind::DoubleBitEcc => {
                (TAINT_XID, Some("dbe".to_owned()), TaintEffect::NoSchedule)
            }
            HealthEventKind::GpuLost => (TAINT_GPU_LOST, None, TaintEffect::NoSchedule),
            HealthEventKind::Unmonitored => return Vec::new(), // handled above
        };
        let affected = match self.map.affected(&event.uuid) {
            Some(devices) => devices,
            // As upstream: a device that cannot be resolved is as good as lost, and without
            // knowing which one, every device is suspect.
            None if event.kind == HealthEventKind::GpuLost => {
                self.map.devices().into_iter().collect()
            }
            None => {
                tracing::warn!(uuid = %event.uuid, kind = %event.kind, "health event on an unknown device; ignored");
                return Vec::new();
            }
        };
        let message = format!("{} on {}", event.kind, event.uuid);
        for device in &affected {
            let faults = self.faults.entry(device.clone()).or_default();
            let entry = faults
                .taints
                .entry(key.to_owned())
                .or_insert_with(|| (value.clone(), effect, message.clone()));
            // A critical XID wins over an ignorable one under the same key: one taint per
            // key, and it must keep the device off the scheduler.
            if effect != TaintEffect::None || entry.1 == TaintEffect::None {
                *entry = (value.clone(), effect, message.clone());
            }
            faults.last_event = Some(now);
        }
        affected.iter().map(|device| self.state(device)).collect()
    }

    /// Untaints devices without a new event for the recovery period (not lost GPUs); the
    /// states that changed.
    pub fn recover(&mut self, now: Instant) -> Vec<DeviceState> {
        self.recover_with(now, &|_| None)
    }

    /// [`HealthTracker::recover`], except that a device whose GPU's recovery action
    /// (`recovery`, by GPU UUID) asks for something (a reset, a reboot, a drain) keeps its
    /// taints until the GPU says none is needed.
    pub fn recover_with(
        &mut self,
        now: Instant,
        recovery: &dyn Fn(&str) -> Option<RecoveryAction>,
    ) -> Vec<DeviceState> {
        let Some(period) = self.policy.recovery_period else {
            return Vec::new();
        };
        let mut changed = Vec::new();
        for (device, faults) in &mut self.faults {
            let quiet = faults
                .last_event
                .is_some_and(|last| now.saturating_duration_since(last) >= period);
            let needed = self
                .map
                .gpu_of(device)
                .and_then(recovery)
                .filter(|action| *action != RecoveryAction::None);
            if let (true, Some(action)) = (quiet, needed) {
                tracing::debug!(device, %action, "quiet, but the GPU needs {action}; taints kept");
                continue;
            }
            if quiet {
                let before = faults.taints.len();
                faults.taints.retain(|key, _| key == TAINT_GPU_LOST);
                if faults.taints.len() != before {
                    changed.push(device.clone());
                }
            }
        }
        self.faults.retain(|_, faults| !faults.taints.is_empty());
        changed.iter().map(|device| self.state(device)).collect()
    }

    /// The GPUs with at least one tainted device.
    fn faulted_gpus(&self) -> BTreeSet<String> {
        self.faults
            .keys()
            .filter_map(|device| self.map.gpu_of(device))
            .map(str::to_owned)
            .collect()
    }

    /// The operator's signal: untaints `device` ([`RESET_ALL`]: every device), lost GPUs
    /// included; the states that changed.
    pub fn reset(&mut self, device: &str) -> Vec<DeviceState> {
        let devices: Vec<String> = if device == RESET_ALL {
            self.faults.keys().cloned().collect()
        } else {
            self.faults
                .keys()
                .filter(|known| *known == device)
                .cloned()
                .collect()
        };
        for device in &devices {
            self.faults.remove(device);
        }
        devices.iter().map(|device| self.state(device)).collect()
    }
}

/// Runs a [`HealthTracker`] against a backend's events for the plugin's lifetime.
#[derive(Debug)]
pub struct HealthMonitor {
    backend: Arc<dyn GpuBackend>,
    tracker: HealthTracker,
    policy: HealthPolicy,
}

enum Message {
    Event(HealthEvent),
    Unmonitored(BackendError),
}

impl HealthMonitor {
    /// A monitor of the devices of `discovery`, published in `pool`.
    pub fn new(
        backend: Arc<dyn GpuBackend>,
        discovery: &Discovery,
        pool: impl Into<String>,
        policy: HealthPolicy,
    ) -> Self {
        let tracker =
            HealthTracker::new(pool, policy.clone(), DeviceMap::from_discovery(discovery));
        Self {
            backend,
            tracker,
            policy,
        }
    }

    /// Publishes every device Healthy, then spawns the event reader (a blocking thread) and
    /// the policy task; both end when the context's cancellation token fires.
    pub fn spawn(self, ctx: DriverContext) -> tokio::task::JoinHandle<()> {
        ctx.set_device_states(self.tracker.states());
        let (sender, receiver) = mpsc::channel(64);
        let uuids = self.tracker.map.gpu_uuids();
        let backend = Arc::clone(&self.backend);
        let wait = self.policy.event_wait;
        let reader_token = ctx.cancellation_token();
        let span = tracing::info_span!("health-events", backend = %backend.name());
        tokio::task::spawn_blocking(move || {
            let _entered = span.enter();
            read_events(
                backend.as_ref(),
                &uuids,
                wait,
                &|| reader_token.is_cancelled(),
                &sender,
            );
        });
        let span = tracing::info_span!("health-policy");
        tokio::spawn(self.run(ctx, receiver).instrument(span))
    }

    /// The recovery actions of the GPUs with tainted devices, read on a blocking thread (an
    /// NVML call).
    async fn recovery_actions(&self) -> BTreeMap<String, RecoveryAction> {
        let gpus = self.tracker.faulted_gpus();
        if gpus.is_empty() {
            return BTreeMap::new();
        }
        let backend = Arc::clone(&self.backend);
        tokio::task::spawn_blocking(move || {
            gpus.into_iter()
                .filter_map(|gpu| match backend.recovery_action(&gpu) {
                    Ok(action) => action.map(|action| (gpu, action)),
                    Err(error) => {
                        tracing::debug!(%gpu, %error, "recovery action unreadable");
                        None
                    }
                })
                .collect()
        })
        .await
        .unwrap_or_default()
    }

    async fn run(mut self, ctx: DriverContext, mut receiver: mpsc::Receiver<Message>) {
        let token = ctx.cancellation_token();
        let mut ticks = tokio::time::interval(self.policy.check_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reader_open = true;
        loop {
            let changed = tokio::select! {
                () = token.cancelled() => return,
                message = receiver.recv(), if reader_open => match message {
                    Some(Message::Event(event)) => {
                        tracing::warn!(uuid = %event.uuid, kind = %event.kind, "health event");
                        self.tracker.on_event(&event, Instant::now())
                    }
                    Some(Message::Unmonitored(error)) => {
                        tracing::error!(%error, "device health events cannot be watched; devices are tainted unmonitored");
                        self.tracker.unmonitored(error.to_string())
                    }
                    None => {
                        reader_open = false;
                        Vec::new()
                    }
                },
                _ = ticks.tick() => {
                    let recovery = self.recovery_actions().await;
                    let mut changed = self
                        .tracker
                        .recover_with(Instant::now(), &|gpu| recovery.get(gpu).copied());
                    if let Some(dir) = self.policy.reset_dir.clone() {
                        for device in take_resets(&dir).await {
                            tracing::info!(device, "operator reset of device health");
                            changed.extend(self.tracker.reset(&device));
                        }
                    }
                    changed
                }
            };
            for state in changed {
                ctx.set_device_state(state);
            }
        }
    }
}

/// The blocking loop: registers, then forwards events until cancelled or the channel closes.
fn read_events(
    backend: &dyn GpuBackend,
    uuids: &[String],
    wait: Duration,
    cancelled: &dyn Fn() -> bool,
    sender: &mpsc::Sender<Message>,
) {
    let mut stream = match backend.health_events(uuids) {
        Ok(stream) => stream,
        Err(error) => {
            let _ = sender.blocking_send(Message::Unmonitored(error));
            return;
        }
    };
    tracing::info!(gpus = uuids.len(), "watching device health events");
    while !cancelled() {
        let message = match stream.wait(wait) {
            Ok(None) => continue,
            Ok(Some(event)) => Message::Event(event),
            Err(error) => {
                let _ = sender.blocking_send(Message::Unmonitored(error));
                return;
            }
        };
        if sender.blocking_send(message).is_err() {
            return;
        }
    }
}

/// Reads and removes the reset files in `dir`: the device names they request.
async fn take_resets(dir: &Path) -> Vec<String> {
    let dir = dir.to_owned();
    tokio::task::spawn_blocking(move || {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut devices = Vec::new();
        for entry in entries.flatten() {
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if name.starts_with('.') {
                continue;
            }
            // Remove first: a reset that cannot be consumed would repeat every tick.
            match std::fs::remove_file(entry.path()) {
                Ok(()) => devices.push(name),
                Err(error) => tracing::warn!(%error, file = %entry.path().display(), "cannot remove the reset file; ignored"),
            }
        }
        devices
    })
    .await
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use dra_sdk::health::HealthStatus;

    use super::*;

    fn tracker(policy: HealthPolicy) -> HealthTracker {
        let map = DeviceMap::default()
            .with_gpu("GPU-0", "gpu-0")
            .with_mig("GPU-0", "MIG-0a", "gpu-0-mig-1g10gb-19-0")
            .with_gpu("GPU-1", "gpu-1");
        HealthTracker::new("node", policy, map)
    }

    fn taints(state: &DeviceState) -> Vec<(String, Option<String>, TaintEffect)> {
        state
            .taints
            .iter()
            .map(|taint| (taint.key.clone(), taint.value.clone(), taint.effect))
            .collect()
    }

    fn xid(uuid: &str, xid: u64) -> HealthEvent {
        HealthEvent::new(uuid, HealthEventKind::Xid(xid))
    }

    #[test]
    fn critical_xid_taints_the_gpu_and_its_mig_devices() {
        let mut tracker = tracker(HealthPolicy::default());
        let changed = tracker.on_event(&xid("GPU-0", 79), Instant::now());
        assert_eq!(changed.len(), 2);
        for state in &changed {
            assert_eq!(state.status, HealthStatus::Unhealthy);
            assert_eq!(
                taints(state),
                [(
                    TAINT_XID.to_owned(),
                    Some("79".to_owned()),
                    TaintEffect::NoSchedule
                )]
            );
        }
        assert_eq!(tracker.state("gpu-1").status, HealthStatus::Healthy);
    }

    #[test]
    fn dynamic_mig_partitions_are_tainted_with_their_gpu_in_its_pool() {
        let map = DeviceMap::default()
            .with_gpu("GPU-3", "gpu-3")
            .with_partition("GPU-3", 3, "gpu-3-mig-1g10gb-19-0")
            .with_partition("GPU-3", 3, "gpu-3-mig-7g80gb-0-0")
            .with_gpu("GPU-4", "gpu-4");
        let mut map = map;
        map.partitioned.insert("gpu-3".to_owned(), 3);
        let mut tracker = HealthTracker::new("node", HealthPolicy::default(), map);
        let changed = tracker.on_event(&xid("GPU-3", 79), Instant::now());
        let mut tainted: Vec<(String, String)> = changed
            .iter()
            .map(|state| (state.device.pool.clone(), state.device.name.clone()))
            .collect();
        tainted.sort();
        assert_eq!(
            tainted,
            [
                ("node/gpu-3".to_owned(), "gpu-3".to_owned()),
                ("node/gpu-3".to_owned(), "gpu-3-mig-1g10gb-19-0".to_owned()),
                ("node/gpu-3".to_owned(), "gpu-3-mig-7g80gb-0-0".to_owned()),
            ]
        );
        assert!(changed.iter().all(|s| s.status == HealthStatus::Unhealthy));
        let other = tracker.state("gpu-4");
        assert_eq!(
            (other.device.pool.as_str(), other.status),
            ("node", HealthStatus::Healthy)
        );
    }

    #[test]
    fn a_mig_event_taints_that_mig_device_only() {
        let mut tracker = tracker(HealthPolicy::default());
        let changed = tracker.on_event(&xid("MIG-0a", 48), Instant::now());
        assert_eq!(changed.len(), 1);
        assert_eq!(changed[0].device.name, "gpu-0-mig-1g10gb-19-0");
        assert!(tracker.state("gpu-0").taints.is_empty());
    }

    #[test]
    fn ignorable_xids_are_informational() {
        let mut tracker = tracker(HealthPolicy::default().ignore_xids([48]));
        for number in [13, 48] {
            let changed = tracker.on_event(&xid("GPU-1", number), Instant::now());
            assert_eq!(changed[0].status, HealthStatus::Healthy);
            assert_eq!(
                taints(&changed[0]),
                [(
                    TAINT_XID.to_owned(),
                    Some(number.to_string()),
                    TaintEffect::None
                )]
            );
        }
        // A critical XID replaces the informational taint, and is not replaced by one.
        tracker.on_event(&xid("GPU-1", 79), Instant::now());
        let state = tracker
            .on_event(&xid("GPU-1", 13), Instant::now())
            .remove(0);
        assert_eq!(state.status, HealthStatus::Unhealthy);
        assert_eq!(state.taints[0].value.as_deref(), Some("79"));
    }

    #[test]
    fn taints_stay_while_the_gpu_asks_for_a_reset() {
        let period = Duration::from_secs(60);
        let mut tracker = tracker(HealthPolicy::default().recovery_period(Some(period)));
        let start = Instant::now();
        tracker.on_event(&xid("GPU-0", 79), start);
        let later = start + Duration::from_secs(61);
        let reset = |gpu: &str| (gpu == "GPU-0").then_some(RecoveryAction::GpuReset);
        assert!(
            tracker.recover_with(later, &reset).is_empty(),
            "a reset is still needed"
        );
        assert!(!taints(&tracker.state("gpu-0")).is_empty());
        let done = |_: &str| Some(RecoveryAction::None);
        let changed = tracker.recover_with(later, &done);
        assert_eq!(changed.len(), 2, "the GPU and its MIG device: {changed:?}");
        assert!(changed.iter().all(|state| state.taints.is_empty()));
    }

    #[test]
    fn recovery_after_a_quiet_period_spares_lost_gpus() {
        let period = Duration::from_secs(60);
        let mut tracker = tracker(HealthPolicy::default().recovery_period(Some(period)));
        let start = Instant::now();
        tracker.on_event(&xid("GPU-0", 79), start);
        tracker.on_event(&HealthEvent::new("GPU-1", HealthEventKind::GpuLost), start);
        tracker.on_event(
            &HealthEvent::new("GPU-0", HealthEventKind::DoubleBitEcc),
            start + Duration::from_secs(30),
        );
        assert!(tracker.recover(start + Duration::from_secs(61)).is_empty());
        let changed = tracker.recover(start + Duration::from_secs(91));
        assert_eq!(changed.len(), 2);
        assert!(
            changed
                .iter()
                .all(|state| state.taints.is_empty() && state.status == HealthStatus::Healthy)
        );
        assert_eq!(
            taints(&tracker.state("gpu-1")),
            [(TAINT_GPU_LOST.to_owned(), None, TaintEffect::NoSchedule)]
        );
        let changed = tracker.reset("gpu-1");
        assert_eq!(changed.len(), 1);
        assert!(changed[0].taints.is_empty());
    }

    #[test]
    fn no_recovery_period_means_operator_reset_only() {
        let mut tracker = tracker(HealthPolicy::default());
        let start = Instant::now();
        tracker.on_event(&xid("GPU-0", 79), start);
        assert!(
            tracker
                .recover(start + Duration::from_secs(86_400))
                .is_empty()
        );
        assert_eq!(tracker.reset(RESET_ALL).len(), 2);
        assert!(tracker.states().iter().all(|state| state.taints.is_empty()));
    }

    #[test]
    fn unknown_devices_are_ignored_but_an_unknown_lost_gpu_taints_everything() {
        let mut tracker = tracker(HealthPolicy::default());
        assert!(
            tracker
                .on_event(&xid("GPU-9", 79), Instant::now())
                .is_empty()
        );
        let changed = tracker.on_event(
            &HealthEvent::new("GPU-9", HealthEventKind::GpuLost),
            Instant::now(),
        );
        assert_eq!(changed.len(), 3);
    }

    #[test]
    fn a_gpu_without_events_is_unmonitored_alone() {
        let mut tracker = tracker(HealthPolicy::default());
        let all = tracker.states().len();
        let changed = tracker.on_event(
            &HealthEvent::new("GPU-0", HealthEventKind::Unmonitored),
            Instant::now(),
        );
        assert!(!changed.is_empty() && changed.len() < all, "{changed:?}");
        for state in tracker.states() {
            let expected = changed.iter().any(|c| c.device == state.device);
            assert_eq!(state.status == HealthStatus::Unknown, expected, "{state:?}");
            assert_eq!(
                !taints(&state).is_empty(),
                expected,
                "only the unwatched GPU's devices carry the taint: {state:?}"
            );
        }
    }

    #[test]
    fn unmonitored_devices_are_unknown_with_an_informational_taint() {
        let mut tracker = tracker(HealthPolicy::default());
        let states = tracker.unmonitored("no events");
        assert_eq!(states.len(), 3);
        for state in &states {
            assert_eq!(state.status, HealthStatus::Unknown);
            assert_eq!(
                taints(state),
                [(TAINT_UNMONITORED.to_owned(), None, TaintEffect::None)]
            );
        }
    }
}
