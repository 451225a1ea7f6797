//! Watch streams: newline-delimited JSON events over a chunked response, replayed from the
//! store's history, with bookmarks, timeouts and selector-aware event translation.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::object::{partial_metadata, with_type_meta};
use super::resources::ResourceType;
use super::selectors::Filter;
use super::status::ApiError;
use super::store::{Event, EventType, ListAt};

/// Where a watch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WatchStart {
    /// Synthetic ADDED events for the current state first (`resourceVersion` unset or `0`, or
    /// `sendInitialEvents=true`).
    Snapshot,
    /// Only changes after this resourceVersion.
    After(u64),
}

/// A parsed and validated watch request.
#[derive(Clone, Debug)]
pub(crate) struct WatchSpec {
    pub(crate) rt: ResourceType,
    pub(crate) filter: Filter,
    pub(crate) start: WatchStart,
    pub(crate) bookmarks: bool,
    /// `sendInitialEvents=true`: end the initial events with an annotated BOOKMARK.
    pub(crate) initial_events_end: bool,
    pub(crate) timeout: Duration,
    pub(crate) metadata_only: bool,
}

/// Initial events are sent in chunks of this many lines.
const INITIAL_CHUNK: usize = 64;

/// Starts the watch task and returns the streaming response body it feeds.
pub(crate) fn spawn(shared: Arc<Shared>, spec: WatchSpec) -> Body {
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let cancel = shared.faults.watch_token();
    shared.active_watches.fetch_add(1, Ordering::SeqCst);
    tokio::spawn(async move {
        run(&shared, &spec, &tx, &cancel).await;
        shared.active_watches.fetch_sub(1, Ordering::SeqCst);
    });
    Body::from_stream(ReceiverStream::new(rx).map(Ok::<_, Infallible>))
}

async fn run(
    shared: &Shared,
    spec: &WatchSpec,
    tx: &mpsc::Sender<Bytes>,
    cancel: &CancellationToken,
) {
    let encoder = Encoder::new(spec);
    let deadline = Instant::now() + spec.timeout;
    let mut changes = shared.state().subscribe();
    changes.borrow_and_update();

    let mut cursor = match spec.start {
        WatchStart::After(rv) => rv,
        WatchStart::Snapshot => {
            let snapshot = shared.state().list(&spec.rt, &spec.filter, ListAt::Latest);
            let (items, rv) = match snapshot {
                Ok(snapshot) => snapshot,
                Err(error) => {
                    send(tx, cancel, encoder.error(&error)).await;
                    return;
                }
            };
            for chunk in items.chunks(INITIAL_CHUNK) {
                let lines = chunk
                    .iter()
                    .map(|obj| encoder.event("ADDED", obj))
                    .collect::<Vec<_>>();
                if !send(tx, cancel, Bytes::from(lines.concat())).await {
                    return;
                }
            }
            if spec.initial_events_end && !send(tx, cancel, encoder.bookmark(rv, true)).await {
                return;
            }
            rv
        }
    };

    let interval = shared.bookmark_interval;
    let mut bookmarks = tokio::time::interval_at(Instant::now() + interval, interval);
    bookmarks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        changes.borrow_and_update();
        let batch = shared.state().events_after(cursor);
        match batch {
            Err(expired) => {
                // The client fell behind the kept history: it must re-list (kube's watcher does on
                // an ERROR event with code 410).
                send(tx, cancel, encoder.error(&expired)).await;
                return;
            }
            Ok((events, rv)) => {
                let lines: Vec<Vec<u8>> = events
                    .iter()
                    .filter_map(|e| encoder.translate(spec, e))
                    .collect();
                cursor = rv;
                if !lines.is_empty() && !send(tx, cancel, Bytes::from(lines.concat())).await {
                    return;
                }
            }
        }
        tokio::select! {
            biased;
            () = cancel.cancelled() => return,
            () = tokio::time::sleep_until(deadline) => return,
            () = tx.closed() => return,
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = bookmarks.tick(), if spec.bookmarks => {
                if !send(tx, cancel, encoder.bookmark(cursor, false)).await {
                    return;
                }
            }
        }
    }
}

/// Sends a chunk unless the watch is cancelled first; `false` when the watch should end.
async fn send(tx: &mpsc::Sender<Bytes>, cancel: &CancellationToken, chunk: Bytes) -> bool {
    tokio::select! {
        biased;
        () = cancel.cancelled() => false,
        sent = tx.send(chunk) => sent.is_ok(),
    }
}

/// Renders watch events for one request's version and output format.
struct Encoder {
    api_version: String,
    kind: &'static str,
    metadata_only: bool,
}

impl Encoder {
    fn new(spec: &WatchSpec) -> Self {
        Self {
            api_version: spec.rt.api_version(),
            kind: spec.rt.kind,
            metadata_only: spec.metadata_only,
        }
    }

    fn line(event: &Value) -> Vec<u8> {
        // Serializing a `Value` cannot fail: all map keys are strings.
        let mut line = serde_json::to_vec(event).unwrap_or_default();
        line.push(b'\n');
        line
    }

    fn event(&self, event_type: &str, stored: &Value) -> Vec<u8> {
        let object = if self.metadata_only {
            partial_metadata(stored)
        } else {
            with_type_meta(stored, &self.api_version, self.kind)
        };
        Self::line(&json!({"type": event_type, "object": object}))
    }

    fn bookmark(&self, rv: u64, initial_events_end: bool) -> Bytes {
        let mut metadata = json!({"resourceVersion": rv.to_string(), "creationTimestamp": null});
        if initial_events_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let (api_version, kind) = if self.metadata_only {
            ("meta.k8s.io/v1", "PartialObjectMetadata")
        } else {
            (self.api_version.as_str(), self.kind)
        };
        let object = json!({"kind": kind, "apiVersion": api_version, "metadata": metadata});
        Bytes::from(Self::line(&json!({"type": "BOOKMARK", "object": object})))
    }

    fn error(&self, error: &ApiError) -> Bytes {
        Bytes::from(Self::line(
            &json!({"type": "ERROR", "object": error.to_status()}),
        ))
    }

    /// The event this watcher sees for a stored change, if any. Like the watch cache, a
    /// modification that moves an object into the selector reads as ADDED and one that moves it
    /// out reads as DELETED (carrying the old object at the new resourceVersion).
    fn translate(&self, spec: &WatchSpec, event: &Event) -> Option<Vec<u8>> {
        if !event.key.is_resource(&spec.rt) {
            return None;
        }
        let matches = |obj: &Value| spec.filter.matches(obj);
        match event.kind {
            EventType::Added => matches(&event.object).then(|| self.event("ADDED", &event.object)),
            EventType::Deleted => {
                matches(&event.object).then(|| self.event("DELETED", &event.object))
            }
            EventType::Modified => {
                let before = event.prev.as_deref().is_some_and(matches);
                match (before, matches(&event.object)) {
                    (true, true) => Some(self.event("MODIFIED", &event.object)),
                    (false, true) => Some(self.event("ADDED", &event.object)),
                    (true, false) => {
                        let mut last = event.prev.as_deref().cloned().unwrap_or(Value::Null);
                        if let Some(meta) = last.get_mut("metadata").and_then(Value::as_object_mut)
                        {
                            meta.insert(
                                "resourceVersion".into(),
                                Value::from(event.rv.to_string()),
                            );
                        }
                        Some(self.event("DELETED", &last))
                    }
                    (false, false) => None,
                }
            }
        }
    }
}
