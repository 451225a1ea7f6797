//! Pacing of the publisher's watch requests.
//!
//! kube's watcher treats a watch whose body ends early (a connection reset, a proxy that cuts
//! streams, an API server that closes every watch at once) as a normal end and watches again
//! at once, without an error and so without backoff. Against a server that keeps doing that,
//! the publisher would send watch requests as fast as the round trips allow. client-go's
//! reflector guards against the same with its "very short watch" check; here a watch request
//! that follows the previous one within [`SHORT_WATCH`] waits for the publisher's backoff
//! first, and a watch that lasted longer starts the backoff over.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kube::client::Body;
use tokio::time::Instant;

use crate::slices::backoff::Backoff;

/// A watch that ended within this long after it started counts as cut short.
const SHORT_WATCH: Duration = Duration::from_secs(1);

/// When to let the next watch request go.
#[derive(Debug)]
struct Pacer {
    last_start: Option<Instant>,
    backoff: Backoff,
}

impl Pacer {
    /// How long a watch request made now waits; records its start.
    fn wait(&mut self, now: Instant) -> Duration {
        let wait = match self.last_start {
            Some(last) if now.saturating_duration_since(last) < SHORT_WATCH => {
                self.backoff.next_delay()
            }
            _ => {
                self.backoff.reset();
                Duration::ZERO
            }
        };
        self.last_start = Some(now + wait);
        wait
    }
}

fn is_watch(request: &http::Request<Body>) -> bool {
    request.uri().query().is_some_and(|query| {
        query
            .split('&')
            .any(|pair| pair == "watch=true" || pair == "watch=1")
    })
}

/// `client` with its watch requests paced (other requests pass straight through).
pub(super) fn paced(client: &kube::Client, initial: Duration, max: Duration) -> kube::Client {
    let pacer = Arc::new(Mutex::new(Pacer {
        last_start: None,
        backoff: Backoff::new(initial, max),
    }));
    let inner = client.clone();
    let service = tower::service_fn(move |request: http::Request<Body>| {
        let inner = inner.clone();
        let wait = is_watch(&request).then(|| {
            // Plain data: a panic elsewhere cannot leave it torn.
            pacer
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .wait(Instant::now())
        });
        async move {
            if let Some(wait) = wait.filter(|wait| !wait.is_zero()) {
                tracing::debug!(
                    ?wait,
                    "the last watch ended right after it started; waiting"
                );
                tokio::time::sleep(wait).await;
            }
            inner.send(request).await
        }
    });
    kube::Client::new(service, client.default_namespace())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_watches_back_off_and_long_ones_reset() {
        let mut pacer = Pacer {
            last_start: None,
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(1)),
        };
        let start = Instant::now();
        assert_eq!(pacer.wait(start), Duration::ZERO);
        let first = pacer.wait(start + Duration::from_millis(10));
        assert!(first >= Duration::from_millis(50), "{first:?}");
        let second = pacer.wait(start + Duration::from_millis(20) + first);
        assert!(second >= Duration::from_millis(100), "{second:?}");
        assert_eq!(pacer.wait(start + Duration::from_secs(10)), Duration::ZERO);
    }

    #[test]
    fn only_watches_are_paced() {
        let request = |uri: &str| http::Request::get(uri).body(Body::empty()).unwrap();
        assert!(is_watch(&request(
            "/apis/x/v1/things?watch=true&resourceVersion=5"
        )));
        assert!(is_watch(&request(
            "/apis/x/v1/things?fieldSelector=a&watch=1"
        )));
        assert!(!is_watch(&request("/apis/x/v1/things?resourceVersion=5")));
        assert!(!is_watch(&request("/apis/x/v1/things/watch=true")));
    }
}
