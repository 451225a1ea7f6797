//! Kubernetes Events on a ResourceClaim whose prepare or unprepare failed, so that
//! `kubectl describe resourceclaim` (and `kubectl events`) say why a pod is stuck.
//!
//! The kubelet retries a failed prepare for as long as the pod exists, so one broken claim
//! fails again and again. Events are therefore deduplicated and rate-limited:
//!
//! - The same failure (claim UID, reason, message) within [`SERIES_WINDOW`] of the last one is
//!   one Event whose `series` (count, last observed time) is updated with a merge PATCH, at
//!   most once per [`SERIES_PATCH_INTERVAL`] per Event, always with the latest count: the
//!   events.k8s.io semantics of a series.
//! - Every request (create or patch) takes a token from one bucket per plugin:
//!   [`BUCKET_BURST`] at once, then one per [`BUCKET_REFILL`]. A new Event that finds the
//!   bucket empty is dropped and counted; a series update waits for the next token.
//!
//! Recording never blocks or fails the kubelet's answer: [`ClaimEvents::record`] only decides
//! under a short lock and hands the request to a task, and a failed request is only logged.
//! The `Event` is written as the API server's strict events.k8s.io/v1 validation wants it
//! (see `ValidateEventCreate`): event time, reporting controller and instance, action and
//! reason are set, instance/action/reason fit 128 characters, the note 1024 bytes, and a
//! series update changes nothing but `series`, since every other field is immutable.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};

use crate::claim::ClaimRef;

/// A failure within this long of the previous identical one joins its Event's series; after
/// it the next one starts a new Event. Six minutes, as Kubernetes' own events library ends a
/// series that saw no occurrence for that long.
pub(crate) const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
/// The shortest time between two series updates of one Event.
pub(crate) const SERIES_PATCH_INTERVAL: Duration = Duration::from_secs(5);
/// Requests the plugin may send at once before the bucket holds them back.
pub(crate) const BUCKET_BURST: u32 = 25;
/// One more request is allowed per this long: 12 a minute, sustained.
pub(crate) const BUCKET_REFILL: Duration = Duration::from_secs(5);

/// `note` may have at most this many bytes.
const MAX_NOTE_BYTES: usize = 1024;
/// `reportingInstance`, `action` and `reason` may have at most this many characters.
const MAX_SHORT_FIELD: usize = 128;
/// Object names are DNS subdomains of at most this many characters.
const MAX_NAME: usize = 253;

/// Which operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Failure {
    /// `NodePrepareResources` failed for the claim.
    Prepare,
    /// `NodeUnprepareResources` failed for the claim.
    Unprepare,
}

impl Failure {
    fn reason(self) -> &'static str {
        match self {
            Failure::Prepare => "PrepareFailed",
            Failure::Unprepare => "UnprepareFailed",
        }
    }

    fn action(self) -> &'static str {
        match self {
            Failure::Prepare => "Prepare",
            Failure::Unprepare => "Unprepare",
        }
    }
}

/// Records failure Events on ResourceClaims for one plugin. Cheap to clone.
#[derive(Clone)]
pub(crate) struct ClaimEvents {
    inner: Arc<Inner>,
}

struct Inner {
    client: kube::Client,
    /// `reportingController`: the driver name.
    controller: String,
    /// `reportingInstance`: driver and node.
    instance: String,
    state: Mutex<State>,
}

/// One failure as an Event is keyed: the same claim, reason and message.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    uid: String,
    failure: Failure,
    note: String,
}

struct Series {
    namespace: String,
    name: String,
    /// Occurrences so far, the first included.
    count: i32,
    /// Occurrences the API server knows of (1 once the Event is created).
    sent: i32,
    last_observed: k8s_openapi::jiff::Timestamp,
    last_seen: Instant,
    /// The Event as it is to be created; `None` once it was.
    to_create: Option<Event>,
    /// Whether a task is sending this series' requests.
    task_running: bool,
}

struct State {
    series: HashMap<Key, Series>,
    bucket: TokenBucket,
    /// New Events dropped because the bucket was empty, since the start.
    dropped: u64,
}

impl ClaimEvents {
    /// A recorder writing with `client` as driver `driver` on node `node`.
    pub(crate) fn new(client: kube::Client, driver: &str, node: &str) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                controller: driver.to_owned(),
                instance: truncate_chars(&format!("{driver}-{node}"), MAX_SHORT_FIELD),
                state: Mutex::new(State {
                    series: HashMap::new(),
                    bucket: TokenBucket::new(BUCKET_BURST, BUCKET_REFILL, Instant::now()),
                    dropped: 0,
                }),
            }),
        }
    }

    /// Records that `failure` happened to `claim` with `message` (the text the kubelet got).
    /// Returns at once; the request, if any, is sent by a task. Needs a Tokio runtime.
    pub(crate) fn record(&self, claim: &ClaimRef, failure: Failure, message: &str) {
        if claim.namespace.is_empty() || claim.name.is_empty() {
            // Nowhere to put it: an Event lives in its object's namespace.
            return;
        }
        let note = truncate_bytes(message, MAX_NOTE_BYTES);
        let key = Key {
            uid: claim.uid.clone(),
            failure,
            note,
        };
        let now = Instant::now();
        let timestamp = micro_now();
        let mut state = self.inner.lock();
        state
            .series
            .retain(|_, series| now.duration_since(series.last_seen) < SERIES_WINDOW);
        if let Some(series) = state.series.get_mut(&key) {
            series.count = series.count.saturating_add(1);
            series.last_observed = timestamp;
            series.last_seen = now;
            if !series.task_running {
                series.task_running = true;
                drop(state);
                self.spawn(key);
            }
            return;
        }
        if !state.bucket.try_take(now) {
            state.dropped += 1;
            tracing::debug!(
                claim = %claim.uid,
                reason = failure.reason(),
                dropped = state.dropped,
                "not recording an Event: the plugin's Event budget is spent"
            );
            return;
        }
        let event = self.inner.event(claim, failure, &key.note, timestamp);
        let name = event.metadata.name.clone().unwrap_or_default();
        state.series.insert(
            key.clone(),
            Series {
                namespace: claim.namespace.clone(),
                name,
                count: 1,
                sent: 0,
                last_observed: timestamp,
                last_seen: now,
                to_create: Some(event),
                task_running: true,
            },
        );
        drop(state);
        self.spawn(key);
    }

    /// Sends the series' pending requests: the create (its token already taken), then series
    /// updates while occurrences arrive, one per [`SERIES_PATCH_INTERVAL`] at most.
    fn spawn(&self, key: Key) {
        let inner = Arc::clone(&self.inner);
        tokio::spawn(async move {
            loop {
                let next = {
                    let mut state = inner.lock();
                    let State { series, bucket, .. } = &mut *state;
                    let Some(entry) = series.get_mut(&key) else {
                        return;
                    };
                    if let Some(event) = entry.to_create.take() {
                        Step::Create(entry.namespace.clone(), Box::new(event))
                    } else if entry.count <= entry.sent {
                        entry.task_running = false;
                        return;
                    } else if let Err(wait) = bucket.take_or_wait(Instant::now()) {
                        Step::Wait(wait)
                    } else {
                        Step::Patch(
                            entry.namespace.clone(),
                            entry.name.clone(),
                            entry.count,
                            entry.last_observed,
                        )
                    }
                };
                match next {
                    Step::Wait(wait) => {
                        tokio::time::sleep(wait).await;
                        continue;
                    }
                    Step::Create(namespace, event) => {
                        let api: Api<Event> = Api::namespaced(inner.client.clone(), &namespace);
                        match api.create(&PostParams::default(), &event).await {
                            Ok(_) => inner.sent(&key, 1),
                            Err(error) => {
                                tracing::warn!(
                                    claim = %key.uid,
                                    reason = key.failure.reason(),
                                    %error,
                                    "could not record an Event on the ResourceClaim"
                                );
                                // A later failure tries again with a new Event.
                                inner.lock().series.remove(&key);
                                return;
                            }
                        }
                    }
                    Step::Patch(namespace, name, count, last_observed) => {
                        let api: Api<Event> = Api::namespaced(inner.client.clone(), &namespace);
                        let patch = serde_json::json!({
                            "series": {
                                "count": count,
                                "lastObservedTime": MicroTime(last_observed),
                            }
                        });
                        match api
                            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                            .await
                        {
                            Ok(_) => inner.sent(&key, count),
                            Err(error) => {
                                tracing::warn!(
                                    claim = %key.uid,
                                    reason = key.failure.reason(),
                                    event = %name,
                                    %error,
                                    "could not update the Event's series count"
                                );
                                // Gone (expired, deleted) or refused: the next failure starts
                                // a new Event rather than patching this one again.
                                inner.lock().series.remove(&key);
                                return;
                            }
                        }
                        tokio::time::sleep(SERIES_PATCH_INTERVAL).await;
                    }
                }
            }
        });
    }
}

/// What a series task does next.
enum Step {
    Create(String, Box<Event>),
    Patch(String, String, i32, k8s_openapi::jiff::Timestamp),
    Wait(Duration),
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state stays consistent at every await-free step, so a poisoned lock (a panic
        // elsewhere while holding it) is still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn sent(&self, key: &Key, count: i32) {
        if let Some(series) = self.lock().series.get_mut(key) {
            series.sent = series.sent.max(count);
        }
    }

    /// The Event for a first occurrence.
    fn event(
        &self,
        claim: &ClaimRef,
        failure: Failure,
        note: &str,
        now: k8s_openapi::jiff::Timestamp,
    ) -> Event {
        Event {
            metadata: ObjectMeta {
                name: Some(event_name(&claim.name, now)),
                namespace: Some(claim.namespace.clone()),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some("Warning".to_owned()),
            reason: Some(failure.reason().to_owned()),
            action: Some(failure.action().to_owned()),
            note: Some(note.to_owned()),
            regarding: Some(ObjectReference {
                api_version: Some("resource.k8s.io/v1".to_owned()),
                kind: Some("ResourceClaim".to_owned()),
                name: Some(claim.name.clone()),
                namespace: Some(claim.namespace.clone()),
                uid: Some(claim.uid.clone()),
                ..ObjectReference::default()
            }),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Event::default()
        }
    }
}

/// Now, to the microsecond (what a `MicroTime` carries).
fn micro_now() -> k8s_openapi::jiff::Timestamp {
    let now = k8s_openapi::jiff::Timestamp::now();
    now.round(k8s_openapi::jiff::Unit::Microsecond)
        .unwrap_or(now)
}

/// `<claim name>.<nanoseconds in hex>`, like Kubernetes' own recorders: unique per occurrence
/// and sorted by time. The claim name is cut so that the whole stays a DNS subdomain.
fn event_name(claim: &str, now: k8s_openapi::jiff::Timestamp) -> String {
    let suffix = format!(".{:x}", now.as_nanosecond());
    let room = MAX_NAME.saturating_sub(suffix.len());
    let prefix = truncate_bytes(claim, room);
    let prefix = prefix.trim_end_matches(['.', '-']);
    format!("{prefix}{suffix}")
}

/// At most `max` bytes of `text`, cut on a character boundary.
fn truncate_bytes(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text[..cut].to_owned()
}

/// At most `max` characters of `text`.
fn truncate_chars(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

/// A token bucket: `burst` tokens, one more per `refill`.
struct TokenBucket {
    burst: u32,
    refill: Duration,
    tokens: u32,
    /// When the last token was added (or the bucket was full).
    since: Instant,
}

impl TokenBucket {
    fn new(burst: u32, refill: Duration, now: Instant) -> Self {
        Self {
            burst,
            refill,
            tokens: burst,
            since: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        if self.tokens >= self.burst {
            self.since = now;
            return;
        }
        let elapsed = now.duration_since(self.since);
        let added = (elapsed.as_nanos() / self.refill.as_nanos().max(1)) as u64;
        if added > 0 {
            let total = u64::from(self.tokens) + added;
            self.tokens = u32::try_from(total.min(u64::from(self.burst))).unwrap_or(self.burst);
            self.since += self.refill * u32::try_from(added).unwrap_or(u32::MAX);
            if self.tokens >= self.burst {
                self.since = now;
            }
        }
    }

    fn try_take(&mut self, now: Instant) -> bool {
        self.take_or_wait(now).is_ok()
    }

    /// Takes a token, or says how long until the next one.
    fn take_or_wait(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        if self.tokens > 0 {
            self.tokens -= 1;
            Ok(())
        } else {
            Err((self.since + self.refill).saturating_duration_since(now))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_allows_its_burst_then_one_per_refill() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(3, Duration::from_secs(5), start);
        assert!((0..3).all(|_| bucket.try_take(start)));
        assert!(!bucket.try_take(start));
        assert_eq!(
            bucket.take_or_wait(start + Duration::from_secs(2)),
            Err(Duration::from_secs(3))
        );
        assert!(bucket.try_take(start + Duration::from_secs(5)));
        assert!(!bucket.try_take(start + Duration::from_secs(6)));
        // A long pause refills to the burst, not beyond.
        let later = start + Duration::from_secs(3600);
        assert!((0..3).all(|_| bucket.try_take(later)));
        assert!(!bucket.try_take(later));
    }

    #[test]
    fn notes_are_cut_to_1024_bytes_on_a_character_boundary() {
        let long = "é".repeat(600); // 1200 bytes
        let note = truncate_bytes(&long, MAX_NOTE_BYTES);
        assert_eq!(note.len(), 1024);
        assert!(note.chars().all(|c| c == 'é'));
        assert_eq!(truncate_bytes("short", MAX_NOTE_BYTES), "short");
        let odd = format!("a{}", "é".repeat(600));
        assert_eq!(truncate_bytes(&odd, MAX_NOTE_BYTES).len(), 1023);
    }

    #[test]
    fn event_names_are_dns_subdomains_of_at_most_253_characters() {
        let now = k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap();
        assert_eq!(event_name("gpu", now), "gpu.17979cfe362a0000");
        let long = format!("{}-{}", "a".repeat(234), "b".repeat(40));
        let name = event_name(&long, now);
        assert!(name.len() <= MAX_NAME, "{}", name.len());
        assert!(name.ends_with(".17979cfe362a0000"));
        // A cut right after a '-' would end a label with it.
        let dashed = format!("{}-bbbb", "a".repeat(235));
        let name = event_name(&dashed, now);
        assert!(name.starts_with(&"a".repeat(235)));
        assert!(!name.contains("-."), "{name}");
    }

    #[tokio::test]
    async fn a_first_failure_becomes_a_complete_v1_event() {
        // Never sent: the client points nowhere, and only the built object is checked.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let node = "n".repeat(200);
        let events = ClaimEvents::new(client, "gpu.example.com", &node);
        let claim = ClaimRef {
            uid: "uid-1".into(),
            namespace: "team-a".into(),
            name: "gpu".into(),
        };
        let event = events
            .inner
            .event(&claim, Failure::Prepare, "bad config", micro_now());
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        assert_eq!(event.reason.as_deref(), Some("PrepareFailed"));
        assert_eq!(event.action.as_deref(), Some("Prepare"));
        assert_eq!(event.note.as_deref(), Some("bad config"));
        assert_eq!(
            event.reporting_controller.as_deref(),
            Some("gpu.example.com")
        );
        let instance = event.reporting_instance.unwrap();
        assert_eq!(instance.chars().count(), MAX_SHORT_FIELD);
        assert!(instance.starts_with("gpu.example.com-nnn"));
        assert!(event.event_time.is_some());
        assert!(event.series.is_none());
        assert_eq!(event.metadata.namespace.as_deref(), Some("team-a"));
        let regarding = event.regarding.unwrap();
        assert_eq!(regarding.api_version.as_deref(), Some("resource.k8s.io/v1"));
        assert_eq!(regarding.kind.as_deref(), Some("ResourceClaim"));
        assert_eq!(regarding.uid.as_deref(), Some("uid-1"));
        assert_eq!(regarding.namespace.as_deref(), Some("team-a"));
        assert_eq!(Failure::Unprepare.reason(), "UnprepareFailed");
    }
}
