//! Client-side rate limiting of API requests, with a budget for the kubelet's critical path.
//!
//! kube-rs has no client-side limiter (client-go's `rest.Config.QPS`/`Burst` have no
//! counterpart), so the SDK brings a small one as a tower layer under [`kube::Client`]: token
//! buckets holding up to `burst` requests, refilled at `qps` per second. A plugin that
//! publishes many slices at once, or a fleet of plugins restarting together, then cannot flood
//! the API server.
//!
//! Requests spend one of two [`ApiBudget`]s. The claim reads of `NodePrepareResources` are on
//! the kubelet's critical path: a node starting 16 GPU pods must not wait seconds for a limit
//! meant for background work, so they spend [`ApiBudget::Prepare`], by default what the kubelet
//! allows its own client (50 per second, bursts of 100). Everything else (publishing
//! ResourceSlices, status writes, watches, discovery) spends [`ApiBudget::Background`], the
//! `--kube-api-qps`/`--kube-api-burst` limit (upstream's default: 5 per second, bursts of 10).
//! The SDK marks its own prepare-path requests; any other request counts as background. A
//! driver marks a request of its own by inserting the budget into the request's extensions.
//!
//! Each request reserves its slot when it is sent to the layer, so requests of one budget
//! leave in the order they were made, and a background request waiting for its slot never
//! holds back a prepare.
//!
//! ```
//! # async fn client(config: kube::Config) -> Result<kube::Client, Box<dyn std::error::Error>> {
//! use dra_sdk::advanced::rate_limit::RateLimitLayer;
//!
//! let layer = RateLimitLayer::new(5.0, 10)?.prepare(50.0, 100)?;
//! let client = kube::client::ClientBuilder::try_from(config)?
//!     .with_layer(&layer)
//!     .build();
//! # Ok(client)
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use kube::client::Body;
use tokio::time::Instant;
use tower::buffer::Buffer;
use tower::{BoxError, Layer, Service, ServiceExt as _};

/// The requests per second and burst the kubelet allows its own API client by default
/// (`kubeAPIQPS`, `kubeAPIBurst`): the default budget of [`ApiBudget::Prepare`].
pub const DEFAULT_PREPARE_LIMIT: (f64, u32) = (50.0, 100);

/// How many requests the layer's queue holds before callers wait for room (as kube's own).
const QUEUE: usize = 1024;

/// Which limit an API request counts against; see the [module](self).
///
/// Insert it into a request's extensions to choose; a request without one is
/// [`Background`](Self::Background).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ApiBudget {
    /// On the kubelet's critical path: the claim reads of `NodePrepareResources`.
    Prepare,
    /// Everything else: publishing, status writes, watches, discovery.
    Background,
}

impl ApiBudget {
    fn index(self) -> usize {
        match self {
            Self::Prepare => 0,
            Self::Background => 1,
        }
    }
}

/// A rate limit that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum RateLimitError {
    /// `qps` is not a finite number.
    #[error("--kube-api-qps: {0} is not a number of requests per second")]
    Qps(f64),
    /// `burst` is 0 while `qps` limits: no request could ever be sent.
    #[error("--kube-api-burst: must be at least 1 when --kube-api-qps is above 0")]
    Burst,
    /// The prepare budget's `qps` is not a finite number.
    #[error("--kube-api-prepare-qps: {0} is not a number of requests per second")]
    PrepareQps(f64),
    /// The prepare budget's `burst` is 0 while its `qps` limits.
    #[error("--kube-api-prepare-burst: must be at least 1 when --kube-api-prepare-qps is above 0")]
    PrepareBurst,
}

/// `(qps, burst)` checked; `None` when `qps` is 0 or less (no limit).
fn checked(
    qps: f64,
    burst: u32,
    bad_qps: fn(f64) -> RateLimitError,
    bad_burst: RateLimitError,
) -> Result<Option<(f64, u32)>, RateLimitError> {
    if !qps.is_finite() {
        return Err(bad_qps(qps));
    }
    if qps <= 0.0 {
        return Ok(None);
    }
    if burst == 0 {
        return Err(bad_burst);
    }
    Ok(Some((qps, burst)))
}

/// A token bucket: its arithmetic, apart from the service so that it can be tested with
/// chosen instants.
#[derive(Clone, Debug)]
struct Bucket {
    qps: f64,
    burst: f64,
    /// Below zero when requests have reserved tokens that are not there yet.
    tokens: f64,
    refilled: Instant,
}

impl Bucket {
    fn new((qps, burst): (f64, u32), now: Instant) -> Self {
        let burst = f64::from(burst);
        Self {
            qps,
            burst,
            tokens: burst,
            refilled: now,
        }
    }

    /// Reserves the next token at `now`: the instant the request may go (`now` when a token
    /// is there). Reservations are served in order: a request reserved later goes later.
    fn reserve(&mut self, now: Instant) -> Instant {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.refilled = now;
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            now
        } else {
            now + Duration::from_secs_f64(-self.tokens / self.qps)
        }
    }
}

/// The buckets of one client, shared by the clones of its service.
#[derive(Debug)]
struct Buckets {
    /// Indexed by [`ApiBudget::index`]; `None`: that budget is not limited.
    buckets: Mutex<[Option<Bucket>; 2]>,
    /// Requests that had to wait, by budget.
    held_back: [AtomicU64; 2],
}

impl Buckets {
    /// When a request of `budget` may go; `None` when it may go now.
    fn reserve(&self, budget: ApiBudget, now: Instant) -> Option<Instant> {
        // The guarded value is plain numbers updated in one step: a panic elsewhere cannot
        // leave it torn.
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let at = buckets[budget.index()].as_mut()?.reserve(now);
        (at > now).then(|| {
            self.held_back[budget.index()].fetch_add(1, Ordering::Relaxed);
            at
        })
    }
}

/// A tower layer limiting API requests by [`ApiBudget`]; see the [module](self).
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    /// `(qps, burst)` by [`ApiBudget::index`]; `None`: no limit.
    limits: [Option<(f64, u32)>; 2],
    buckets: Arc<Buckets>,
}

impl RateLimitLayer {
    /// A limit of `qps` background requests per second on average and `burst` at once, and
    /// the [default prepare budget](DEFAULT_PREPARE_LIMIT). A `qps` of 0 or less turns the
    /// background limit off.
    pub fn new(qps: f64, burst: u32) -> Result<Self, RateLimitError> {
        let background = checked(qps, burst, RateLimitError::Qps, RateLimitError::Burst)?;
        Ok(Self::with_limits([Some(DEFAULT_PREPARE_LIMIT), background]))
    }

    /// The same layer with the prepare budget set to `qps` per second and `burst` at once; a
    /// `qps` of 0 or less turns the prepare limit off.
    pub fn prepare(self, qps: f64, burst: u32) -> Result<Self, RateLimitError> {
        let prepare = checked(
            qps,
            burst,
            RateLimitError::PrepareQps,
            RateLimitError::PrepareBurst,
        )?;
        Ok(Self::with_limits([prepare, self.limits[1]]))
    }

    fn with_limits(limits: [Option<(f64, u32)>; 2]) -> Self {
        let now = Instant::now();
        Self {
            limits,
            buckets: Arc::new(Buckets {
                buckets: Mutex::new(limits.map(|limit| limit.map(|limit| Bucket::new(limit, now)))),
                held_back: [AtomicU64::new(0), AtomicU64::new(0)],
            }),
        }
    }

    /// `(qps, burst)` of background requests, or `None` when they are not limited.
    pub fn limit(&self) -> Option<(f64, u32)> {
        self.limits[ApiBudget::Background.index()]
    }

    /// `(qps, burst)` of prepare requests, or `None` when they are not limited.
    pub fn prepare_limit(&self) -> Option<(f64, u32)> {
        self.limits[ApiBudget::Prepare.index()]
    }

    /// How many requests of `budget` had to wait for a token so far, over every client built
    /// with this layer (or a clone of it).
    pub fn held_back(&self, budget: ApiBudget) -> u64 {
        self.buckets.held_back[budget.index()].load(Ordering::Relaxed)
    }
}

impl<S> Layer<S> for RateLimitLayer
where
    S: Service<Request<Body>> + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError> + Send + Sync,
{
    type Service = RateLimit<S::Future>;

    /// Wraps `inner` in a queue of its own (spawned on the current Tokio runtime, as kube's
    /// client does with its own), so that a request can wait for its budget after it was
    /// handed to the layer: its budget is only known then.
    fn layer(&self, inner: S) -> RateLimit<S::Future> {
        RateLimit {
            inner: Buffer::new(inner, QUEUE),
            buckets: Arc::clone(&self.buckets),
        }
    }
}

/// The service of [`RateLimitLayer`].
pub struct RateLimit<F> {
    inner: Buffer<Request<Body>, F>,
    buckets: Arc<Buckets>,
}

impl<F: Send + 'static> Clone for RateLimit<F> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            buckets: Arc::clone(&self.buckets),
        }
    }
}

impl<F> std::fmt::Debug for RateLimit<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit")
            .field("buckets", &self.buckets)
            .finish_non_exhaustive()
    }
}

impl<F, B, E> Service<Request<Body>> for RateLimit<F>
where
    F: Future<Output = Result<Response<B>, E>> + Send + 'static,
    E: Into<BoxError>,
    B: Send + 'static,
{
    type Response = Response<B>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<B>, BoxError>> + Send>>;

    /// Always ready: a request waits for its budget in its future, and for room in the queue
    /// after that.
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let budget = request
            .extensions()
            .get::<ApiBudget>()
            .copied()
            .unwrap_or(ApiBudget::Background);
        let at = self.buckets.reserve(budget, Instant::now());
        let inner = self.inner.clone();
        Box::pin(async move {
            if let Some(at) = at {
                tracing::trace!(?budget, wait = ?at.saturating_duration_since(Instant::now()), "API request held back by the client-side limit");
                tokio::time::sleep_until(at).await;
            }
            inner.oneshot(request).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_allows_a_burst_then_qps_in_order() {
        let start = Instant::now();
        let mut bucket = Bucket::new((5.0, 10), start);
        for _ in 0..10 {
            assert_eq!(bucket.reserve(start), start);
        }
        // The next two wait 200 and 400 ms: reservations queue up.
        assert_eq!(bucket.reserve(start), start + Duration::from_millis(200));
        assert_eq!(bucket.reserve(start), start + Duration::from_millis(400));
        // A long pause refills up to the burst, not beyond.
        let later = start + Duration::from_secs(60);
        for _ in 0..10 {
            assert_eq!(bucket.reserve(later), later);
        }
        assert!(bucket.reserve(later) > later);
    }

    #[test]
    fn bad_limits_are_refused_and_zero_qps_is_no_limit() {
        assert_eq!(
            RateLimitLayer::new(f64::NAN, 10).unwrap_err().to_string(),
            "--kube-api-qps: NaN is not a number of requests per second"
        );
        assert_eq!(
            RateLimitLayer::new(5.0, 0).unwrap_err(),
            RateLimitError::Burst
        );
        assert_eq!(RateLimitLayer::new(0.0, 0).unwrap().limit(), None);
        assert_eq!(RateLimitLayer::new(-1.0, 10).unwrap().limit(), None);
        let layer = RateLimitLayer::new(5.0, 10).unwrap();
        assert_eq!(layer.limit(), Some((5.0, 10)));
        assert_eq!(layer.prepare_limit(), Some(DEFAULT_PREPARE_LIMIT));
        assert_eq!(
            layer.clone().prepare(f64::INFINITY, 1).unwrap_err(),
            RateLimitError::PrepareQps(f64::INFINITY)
        );
        assert_eq!(
            layer.clone().prepare(1.0, 0).unwrap_err(),
            RateLimitError::PrepareBurst
        );
        let layer = layer.prepare(0.0, 0).unwrap();
        assert_eq!(layer.prepare_limit(), None);
        assert_eq!(layer.limit(), Some((5.0, 10)));
    }

    /// Answers every request at once with an empty 200.
    #[derive(Clone)]
    struct Answer;

    impl Service<Request<Body>> for Answer {
        type Response = Response<()>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Response<()>, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<Body>) -> Self::Future {
            std::future::ready(Ok(Response::new(())))
        }
    }

    fn request(budget: Option<ApiBudget>) -> Request<Body> {
        let mut request = Request::new(Body::empty());
        if let Some(budget) = budget {
            request.extensions_mut().insert(budget);
        }
        request
    }

    #[tokio::test(start_paused = true)]
    async fn prepare_requests_do_not_wait_behind_background_ones() {
        let layer = RateLimitLayer::new(5.0, 10).unwrap();
        let service = layer.layer(Answer);
        let start = Instant::now();
        // 20 background requests at once: 10 go, 10 wait up to 2 s.
        let background: Vec<_> = (0..20)
            .map(|_| tokio::spawn(service.clone().oneshot(request(None))))
            .collect();
        // Meanwhile 100 prepares go at once, on their own budget.
        for _ in 0..100 {
            service
                .clone()
                .oneshot(request(Some(ApiBudget::Prepare)))
                .await
                .unwrap();
        }
        assert_eq!(Instant::now(), start, "a prepare waited");
        assert_eq!(layer.held_back(ApiBudget::Prepare), 0);
        // The prepare budget has a limit of its own: past its burst, the next waits 20 ms.
        service
            .clone()
            .oneshot(request(Some(ApiBudget::Prepare)))
            .await
            .unwrap();
        assert_eq!(Instant::now() - start, Duration::from_millis(20));
        assert_eq!(layer.held_back(ApiBudget::Prepare), 1);
        for task in background {
            task.await.unwrap().unwrap();
        }
        assert_eq!(Instant::now() - start, Duration::from_secs(2));
        assert_eq!(layer.held_back(ApiBudget::Background), 10);
    }

    #[tokio::test(start_paused = true)]
    async fn without_limits_nothing_waits() {
        let layer = RateLimitLayer::new(0.0, 0)
            .unwrap()
            .prepare(0.0, 0)
            .unwrap();
        let service = layer.layer(Answer);
        let start = Instant::now();
        for budget in [None, Some(ApiBudget::Prepare)] {
            for _ in 0..500 {
                service.clone().oneshot(request(budget)).await.unwrap();
            }
        }
        assert_eq!(Instant::now(), start);
        assert_eq!(layer.held_back(ApiBudget::Background), 0);
    }
}
