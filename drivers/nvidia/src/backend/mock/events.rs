//! Health events for the mock backend: injected through an API ([`MockEvents::inject`]) or
//! appended to a file the stream polls ([`MockEvents::watch_file`]), so the whole health path
//! runs without a GPU.

use std::collections::VecDeque;
use std::fmt;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::backend::BackendError;
use crate::backend::events::{HealthEvent, HealthEventKind, HealthEventStream, RecoveryAction};

/// How often a waiting stream looks at the event file.
const FILE_POLL: Duration = Duration::from_millis(50);

/// The event source of a [`MockBackend`](crate::backend::mock::MockBackend). Clones share
/// their events: keep one to inject into the backend the driver runs on.
///
/// ```
/// use std::time::Duration;
/// use dra_driver_nvidia::backend::{GpuBackend, mock::MockBackend};
/// use dra_driver_nvidia::backend::events::{HealthEvent, HealthEventKind};
///
/// let backend = MockBackend::from_profile("workstation")?;
/// let events = backend.events();
/// let mut stream = backend.health_events(&[])?;
/// events.inject(HealthEvent::new("GPU-x", HealthEventKind::GpuLost));
/// let event = stream.wait(Duration::from_secs(1))?;
/// assert_eq!(event.map(|event| event.kind), Some(HealthEventKind::GpuLost));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Default)]
pub struct MockEvents {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    arrived: Condvar,
}

#[derive(Default)]
struct State {
    /// Every event injected so far; each stream reads from its own position.
    injected: VecDeque<HealthEvent>,
    file: Option<PathBuf>,
    refuse_registration: Option<String>,
    /// GPUs whose registration fails alone (the others stay watched).
    refused_gpus: std::collections::BTreeSet<String>,
    /// GPU UUID → the recovery action the GPU reports (none set: not reported).
    recovery: std::collections::BTreeMap<String, RecoveryAction>,
}

impl fmt::Debug for MockEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state();
        f.debug_struct("MockEvents")
            .field("injected", &state.injected.len())
            .field("file", &state.file)
            .field("refuse_registration", &state.refuse_registration)
            .finish()
    }
}

/// The event source is not part of the machine a profile describes: two backends of the same
/// profile compare equal whatever their events.
impl PartialEq for MockEvents {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for MockEvents {}

impl MockEvents {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the queue half-updated (every update is
        // a single push or assignment), so a poisoned lock is still usable.
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Delivers `event` to every stream, now and registered later.
    pub fn inject(&self, event: HealthEvent) {
        self.state().injected.push_back(event);
        self.shared.arrived.notify_all();
    }

    /// Streams also read events from `path`, one [`HealthEvent`] line each (`#` starts a
    /// comment), as they are appended. A missing file is no event; a line that does not
    /// parse is logged and skipped.
    pub fn watch_file(&self, path: impl Into<PathBuf>) {
        self.state().file = Some(path.into());
    }

    /// Makes registration fail with `reason`, as NVML does on GPUs without event support:
    /// the monitor marks the devices unmonitored.
    pub fn refuse_registration(&self, reason: impl Into<String>) {
        self.state().refuse_registration = Some(reason.into());
    }

    /// Makes registration fail for this GPU alone, as NVML does on one GPU that supports no
    /// XID or ECC events: a stream registered for it starts with a
    /// [`HealthEventKind::Unmonitored`](crate::backend::events::HealthEventKind::Unmonitored)
    /// event on it and never delivers its events; the other GPUs stay watched.
    pub fn refuse_registration_of(&self, gpu_uuid: impl Into<String>) {
        self.state().refused_gpus.insert(gpu_uuid.into());
    }

    /// Makes the GPU report `action` as its recovery action, as NVML's field 230 would.
    pub fn set_recovery_action(&self, gpu_uuid: impl Into<String>, action: RecoveryAction) {
        self.state().recovery.insert(gpu_uuid.into(), action);
    }

    /// The recovery action set for a GPU.
    pub(crate) fn recovery_action(&self, gpu_uuid: &str) -> Option<RecoveryAction> {
        self.state().recovery.get(gpu_uuid).copied()
    }

    /// A stream from the first injected event and the start of the file, for `gpu_uuids` (the
    /// refused ones reported unmonitored first).
    pub(crate) fn register(&self, gpu_uuids: &[String]) -> Result<MockEventStream, BackendError> {
        if let Some(reason) = &self.state().refuse_registration {
            return Err(BackendError::Unsupported {
                what: format!("health event registration ({reason})"),
                backend: "mock".into(),
            });
        }
        let refused: std::collections::BTreeSet<String> = self
            .state()
            .refused_gpus
            .iter()
            .filter(|gpu| gpu_uuids.contains(gpu))
            .cloned()
            .collect();
        Ok(MockEventStream {
            events: self.clone(),
            next_injected: 0,
            file_offset: 0,
            pending: refused
                .iter()
                .map(|gpu| HealthEvent::new(gpu.clone(), HealthEventKind::Unmonitored))
                .collect(),
            partial: String::new(),
            refused,
        })
    }
}

/// A stream of [`MockEvents`].
#[derive(Debug)]
pub struct MockEventStream {
    events: MockEvents,
    next_injected: usize,
    file_offset: u64,
    pending: VecDeque<HealthEvent>,
    partial: String,
    /// GPUs not registered: their events are not delivered.
    refused: std::collections::BTreeSet<String>,
}

impl MockEventStream {
    /// Reads what was appended to the event file since the last read.
    fn read_file(&mut self, path: &std::path::Path) {
        let Ok(mut file) = std::fs::File::open(path) else {
            return;
        };
        let mut appended = String::new();
        if file.seek(SeekFrom::Start(self.file_offset)).is_err()
            || file.read_to_string(&mut appended).is_err()
        {
            return;
        }
        self.file_offset += appended.len() as u64;
        self.partial.push_str(&appended);
        // Only complete lines: a writer may be half-way through one.
        while let Some(end) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=end).collect();
            let line = line.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            match line.parse::<HealthEvent>() {
                Ok(event) => self.pending.push_back(event),
                Err(error) => {
                    tracing::warn!(%error, path = %path.display(), "skipping mock health event")
                }
            }
        }
    }
}

impl HealthEventStream for MockEventStream {
    fn wait(&mut self, timeout: Duration) -> Result<Option<HealthEvent>, BackendError> {
        let deadline = Instant::now() + timeout;
        loop {
            let file = {
                let state = self.events.state();
                self.pending
                    .extend(state.injected.iter().skip(self.next_injected).cloned());
                self.next_injected = state.injected.len();
                state.file.clone()
            };
            if let Some(path) = file {
                self.read_file(&path);
            }
            while let Some(event) = self.pending.pop_front() {
                let unwatched = self.refused.contains(&event.uuid)
                    && event.kind != HealthEventKind::Unmonitored;
                if !unwatched {
                    return Ok(Some(event));
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let state = self.events.state();
            if state.injected.len() == self.next_injected {
                let _ = self
                    .events
                    .shared
                    .arrived
                    .wait_timeout(state, FILE_POLL.min(deadline - now));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn a_refused_gpu_is_unmonitored_alone() {
        let events = MockEvents::default();
        events.refuse_registration_of("GPU-b");
        let gpus = ["GPU-a".to_owned(), "GPU-b".to_owned()];
        let mut stream = events.register(&gpus).unwrap();
        events.inject(HealthEvent::new("GPU-b", HealthEventKind::Xid(79)));
        events.inject(HealthEvent::new("GPU-a", HealthEventKind::Xid(48)));
        let first = stream.wait(Duration::from_millis(10)).unwrap().unwrap();
        assert_eq!(
            first,
            HealthEvent::new("GPU-b", HealthEventKind::Unmonitored)
        );
        let next = stream.wait(Duration::from_millis(10)).unwrap().unwrap();
        assert_eq!(
            next,
            HealthEvent::new("GPU-a", HealthEventKind::Xid(48)),
            "GPU-b's XID is not watched"
        );
        assert!(stream.wait(Duration::from_millis(10)).unwrap().is_none());
    }

    #[test]
    fn injected_events_reach_every_stream() {
        let events = MockEvents::default();
        let mut early = events.register(&[]).unwrap();
        events.inject(HealthEvent::new("GPU-a", HealthEventKind::Xid(79)));
        let mut late = events.register(&[]).unwrap();
        for stream in [&mut early, &mut late] {
            let event = stream.wait(Duration::from_millis(10)).unwrap().unwrap();
            assert_eq!(event.kind, HealthEventKind::Xid(79));
            assert!(stream.wait(Duration::from_millis(10)).unwrap().is_none());
        }
    }

    #[test]
    fn file_events_are_read_as_appended() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events");
        let events = MockEvents::default();
        events.watch_file(&path);
        let mut stream = events.register(&[]).unwrap();
        assert!(stream.wait(Duration::from_millis(10)).unwrap().is_none());
        let mut file = std::fs::File::create(&path).unwrap();
        write!(
            file,
            "# comment\nGPU-a double-bit-ecc\nnonsense\nGPU-b gpu-"
        )
        .unwrap();
        file.flush().unwrap();
        let event = stream.wait(Duration::from_millis(100)).unwrap().unwrap();
        assert_eq!(
            event,
            HealthEvent::new("GPU-a", HealthEventKind::DoubleBitEcc)
        );
        assert!(stream.wait(Duration::from_millis(10)).unwrap().is_none());
        writeln!(file, "lost").unwrap();
        let event = stream.wait(Duration::from_millis(100)).unwrap().unwrap();
        assert_eq!(event, HealthEvent::new("GPU-b", HealthEventKind::GpuLost));
    }

    #[test]
    fn registration_can_be_refused() {
        let events = MockEvents::default();
        events.refuse_registration("not supported on this GPU");
        assert!(events.register(&[]).is_err());
    }
}
