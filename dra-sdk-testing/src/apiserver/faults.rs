//! Fault injection: failing requests, responses cut off mid-body, latency, dropped watches.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::stats::Verb;
use super::status::ApiError;

/// A failure to inject: which requests it hits, what they get, and how many times.
///
/// Built from [`Fault::status`] (an error answer), [`Fault::reset_mid_body`] (a connection
/// that drops in the middle of the answer) or [`Fault::delayed`] (a slow answer) and narrowed with the other methods; handed to
/// [`Faults::inject`].
///
/// ```
/// use dra_sdk_testing::apiserver::{Fault, Verb};
///
/// // The next two updates of ResourceSlices fail with 500.
/// let fault = Fault::status(500).verb(Verb::Update).resource("resourceslices").times(2);
/// # let _ = fault;
/// ```
#[derive(Clone, Debug)]
pub struct Fault {
    verb: Option<Verb>,
    resource: Option<String>,
    effect: Effect,
    remaining: Option<u32>,
    message: Option<String>,
    retry_after: Option<u32>,
}

impl Fault {
    /// Fails the next matching request (once, any verb, any resource) with this HTTP status and a
    /// `Status` body whose reason matches the code (`InternalError` for 500, `Conflict` for 409,
    /// `TooManyRequests` for 429, `ServiceUnavailable` for 503, ...).
    pub fn status(code: u16) -> Self {
        Self {
            verb: None,
            resource: None,
            effect: Effect::Status(code),
            remaining: Some(1),
            message: None,
            retry_after: None,
        }
    }

    /// Lets the next matching request (once, any verb, any resource) run and starts its real
    /// answer (status line, headers and about half of the body, or the first chunk of a watch),
    /// then drops the connection, as a dying API server or a proxy in between does. A write
    /// has taken effect by then: the client cannot tell, as with a real reset. The client sees
    /// a body that ends early (hyper: "end of file before message length reached" or an
    /// incomplete chunked message), not an HTTP status. [`message`](Self::message) and
    /// [`retry_after`](Self::retry_after) do not apply.
    pub fn reset_mid_body() -> Self {
        Self {
            effect: Effect::ResetMidBody,
            ..Self::status(200)
        }
    }

    /// Holds the next matching request (once, any verb, any resource) for `delay` before
    /// handling it normally: a slow or stalled API server for chosen requests only, where
    /// [`Faults::set_latency`] slows every request. A client that gives up earlier closes the
    /// connection and the request is never handled.
    pub fn delayed(delay: Duration) -> Self {
        Self {
            effect: Effect::Delay(delay),
            ..Self::status(200)
        }
    }

    /// Only requests with this verb.
    #[must_use]
    pub fn verb(mut self, verb: Verb) -> Self {
        self.verb = Some(verb);
        self
    }

    /// Only requests for this resource: a plural such as `resourceslices` matches the resource
    /// and its subresources; `resourceclaims/status` matches the subresource only.
    #[must_use]
    pub fn resource(mut self, resource: impl Into<String>) -> Self {
        self.resource = Some(resource.into());
        self
    }

    /// Fail this many matching requests (default 1).
    #[must_use]
    pub fn times(mut self, count: u32) -> Self {
        self.remaining = Some(count);
        self
    }

    /// Fail every matching request until [`Faults::clear`].
    #[must_use]
    pub fn always(mut self) -> Self {
        self.remaining = None;
        self
    }

    /// The `Status.message` to send.
    #[must_use]
    pub fn message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }

    /// Send `Retry-After` (and `details.retryAfterSeconds`); kube's default retry policy honours it
    /// for 429, 503 and 504.
    #[must_use]
    pub fn retry_after(mut self, seconds: u32) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    fn matches(&self, verb: Verb, resource: &str) -> bool {
        let resource_ok = self.resource.as_deref().is_none_or(|wanted| {
            resource == wanted
                || resource
                    .split_once('/')
                    .is_some_and(|(base, _)| base == wanted)
        });
        self.verb.is_none_or(|v| v == verb) && resource_ok
    }

    fn to_injected(&self, verb: Verb, resource: &str) -> Injected {
        let code = match self.effect {
            Effect::Status(code) => code,
            Effect::ResetMidBody => return Injected::ResetMidBody,
            Effect::Delay(delay) => return Injected::Delay(delay),
        };
        let message = self
            .message
            .clone()
            .unwrap_or_else(|| format!("injected fault: {code} {verb} {resource}"));
        let mut error = ApiError::new(code, ApiError::reason_for(code), message);
        error.retry_after = self.retry_after;
        Injected::Fail(error)
    }
}

/// What a fault does to the request it hits.
#[derive(Clone, Copy, Debug)]
enum Effect {
    /// Answer this HTTP status instead of handling the request.
    Status(u16),
    /// Handle the request, then drop the connection part-way through the answer.
    ResetMidBody,
    /// Handle the request after this long.
    Delay(Duration),
}

/// What the HTTP layer does with a request a fault hit.
#[derive(Debug)]
pub(crate) enum Injected {
    /// Answer this error instead.
    Fail(ApiError),
    /// Handle it and cut the answer off mid-body.
    ResetMidBody,
    /// Handle it after this long.
    Delay(Duration),
}

struct FaultState {
    rules: Vec<Fault>,
    latency: Duration,
    /// Cancelled by `drop_watches`; every watch holds a clone of the token current at its start.
    watch_token: CancellationToken,
    injected: u64,
}

/// Handle to the server's fault injection; cheap to clone, effective immediately, also while
/// requests are in flight.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use dra_sdk_testing::apiserver::{FakeApiServer, Fault, Verb};
///
/// let server = FakeApiServer::start().await?;
/// let faults = server.faults();
/// faults.inject(Fault::status(503).verb(Verb::Create).times(3));
/// faults.set_latency(Duration::from_millis(20));
/// faults.drop_watches();
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Faults {
    state: Arc<Mutex<FaultState>>,
    root: CancellationToken,
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("Faults")
            .field("rules", &state.rules)
            .field("latency", &state.latency)
            .field("injected", &state.injected)
            .finish()
    }
}

impl Faults {
    pub(crate) fn new(root: CancellationToken) -> Self {
        let state = FaultState {
            rules: Vec::new(),
            latency: Duration::ZERO,
            watch_token: root.child_token(),
            injected: 0,
        };
        Self {
            state: Arc::new(Mutex::new(state)),
            root,
        }
    }

    fn lock(&self) -> MutexGuard<'_, FaultState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a fault; faults are checked in the order they were added and the first match fires.
    pub fn inject(&self, fault: Fault) {
        self.lock().rules.push(fault);
    }

    /// Fails the next `count` requests, whatever they are, with `code`.
    pub fn fail_next(&self, count: u32, code: u16) {
        self.inject(Fault::status(code).times(count));
    }

    /// Refuses every watch request with `code` (e.g. 503) until [`clear`](Self::clear).
    pub fn reject_watches(&self, code: u16) {
        self.inject(Fault::status(code).verb(Verb::Watch).always());
    }

    /// Delays every request by `latency` before it is handled (watches: before the stream starts).
    pub fn set_latency(&self, latency: Duration) {
        self.lock().latency = latency;
    }

    /// Ends every open watch now, as an API server restart or a load balancer would: the response
    /// body ends and clients re-watch from their last resourceVersion.
    pub fn drop_watches(&self) {
        let mut state = self.lock();
        let fresh = self.root.child_token();
        std::mem::replace(&mut state.watch_token, fresh).cancel();
    }

    /// Removes all faults and the latency.
    pub fn clear(&self) {
        let mut state = self.lock();
        state.rules.clear();
        state.latency = Duration::ZERO;
    }

    /// How many requests faults have hit (failed, cut off or delayed) so far.
    pub fn injected(&self) -> u64 {
        self.lock().injected
    }

    pub(crate) fn latency(&self) -> Duration {
        self.lock().latency
    }

    pub(crate) fn watch_token(&self) -> CancellationToken {
        self.lock().watch_token.clone()
    }

    /// The failure for this request, consuming one use of the first matching fault.
    pub(crate) fn take(&self, verb: Verb, resource: &str) -> Option<Injected> {
        let mut state = self.lock();
        let index = state.rules.iter().position(|f| f.matches(verb, resource))?;
        let injected = state.rules[index].to_injected(verb, resource);
        match &mut state.rules[index].remaining {
            Some(remaining) if *remaining <= 1 => {
                state.rules.remove(index);
            }
            Some(remaining) => *remaining -= 1,
            None => {}
        }
        state.injected += 1;
        Some(injected)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_match_and_run_out() {
        let faults = Faults::new(CancellationToken::new());
        faults.inject(
            Fault::status(500)
                .verb(Verb::Update)
                .resource("resourceslices")
                .times(2),
        );
        assert!(faults.take(Verb::Get, "resourceslices").is_none());
        assert!(faults.take(Verb::Update, "nodes").is_none());
        let Some(Injected::Fail(err)) = faults.take(Verb::Update, "resourceslices") else {
            panic!("expected a status fault");
        };
        assert_eq!((err.code, err.reason), (500, "InternalError"));
        assert!(faults.take(Verb::Update, "resourceslices").is_some());
        assert!(faults.take(Verb::Update, "resourceslices").is_none());
        assert_eq!(faults.injected(), 2);
    }

    #[test]
    fn resource_matches_subresources() {
        let faults = Faults::new(CancellationToken::new());
        faults.inject(Fault::status(409).resource("resourceclaims").always());
        assert!(faults.take(Verb::Patch, "resourceclaims/status").is_some());
        assert!(faults.take(Verb::Patch, "resourceclaimtemplates").is_none());
        faults.clear();
        faults.inject(Fault::status(409).resource("resourceclaims/status"));
        assert!(faults.take(Verb::Patch, "resourceclaims").is_none());
        assert!(faults.take(Verb::Patch, "resourceclaims/status").is_some());
    }

    #[test]
    fn reset_mid_body_is_its_own_effect() {
        let faults = Faults::new(CancellationToken::new());
        faults.inject(Fault::reset_mid_body().verb(Verb::Get).times(2));
        assert!(faults.take(Verb::List, "pods").is_none());
        assert!(matches!(
            faults.take(Verb::Get, "pods"),
            Some(Injected::ResetMidBody)
        ));
        assert!(faults.take(Verb::Get, "pods").is_some());
        assert!(faults.take(Verb::Get, "pods").is_none());
        assert_eq!(faults.injected(), 2);
    }

    #[test]
    fn drop_watches_cancels_only_current_watches() {
        let faults = Faults::new(CancellationToken::new());
        let before = faults.watch_token();
        faults.drop_watches();
        assert!(before.is_cancelled());
        assert!(!faults.watch_token().is_cancelled());
    }
}
