//! Client-side rate limiting of API requests: `--kube-api-qps` and `--kube-api-burst`.
//!
//! kube-rs has no client-side limiter (client-go's `rest.Config.QPS`/`Burst` have no
//! counterpart), so the SDK brings a small one: a token bucket holding up to `burst` requests,
//! refilled at `qps` per second, as a tower layer under [`kube::Client`]. A request waits for
//! a token before it is sent; a plugin that publishes many slices at once, or a fleet of plugins
//! restarting together, then cannot flood the API server. The wait happens in `poll_ready`,
//! which the client's buffer drives one request at a time, so requests leave in order.
//!
//! ```
//! # async fn client(config: kube::Config) -> Result<kube::Client, kube::Error> {
//! use dra_sdk::rate_limit::RateLimitLayer;
//!
//! let layer = RateLimitLayer::new(5.0, 10).expect("a valid limit");
//! let client = kube::client::ClientBuilder::try_from(config)?
//!     .with_layer(&layer)
//!     .build();
//! # Ok(client)
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

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
}

/// The token bucket: its arithmetic, apart from the service so that it can be tested with
/// chosen instants.
#[derive(Clone, Debug)]
struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    refilled: Instant,
}

impl Bucket {
    fn new(qps: f64, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst);
        Self {
            qps,
            burst,
            tokens: burst,
            refilled: now,
        }
    }

    /// Takes a token at `now`, or says how long until one is there.
    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.refilled = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.qps))
        }
    }
}

/// A tower layer limiting requests to `qps` per second with bursts of `burst`; see the
/// [module](self).
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    /// `None`: no limit.
    limit: Option<(f64, u32)>,
}

impl RateLimitLayer {
    /// A limit of `qps` requests per second on average and `burst` at once. A `qps` of 0 or
    /// less turns the limit off.
    pub fn new(qps: f64, burst: u32) -> Result<Self, RateLimitError> {
        if !qps.is_finite() {
            return Err(RateLimitError::Qps(qps));
        }
        if qps <= 0.0 {
            return Ok(Self { limit: None });
        }
        if burst == 0 {
            return Err(RateLimitError::Burst);
        }
        Ok(Self {
            limit: Some((qps, burst)),
        })
    }

    /// `(qps, burst)`, or `None` when requests are not limited.
    pub fn limit(&self) -> Option<(f64, u32)> {
        self.limit
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            bucket: self
                .limit
                .map(|(qps, burst)| Bucket::new(qps, burst, Instant::now())),
            permit: false,
            sleep: None,
        }
    }
}

/// The service of [`RateLimitLayer`].
#[derive(Debug)]
pub struct RateLimit<S> {
    inner: S,
    bucket: Option<Bucket>,
    /// A token was taken for the next `call`.
    permit: bool,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<S, R> Service<R> for RateLimit<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        if let Some(bucket) = &mut self.bucket {
            while !self.permit {
                if let Some(sleep) = &mut self.sleep {
                    ready!(sleep.as_mut().poll(cx));
                    self.sleep = None;
                }
                let now = Instant::now();
                match bucket.take(now) {
                    Ok(()) => self.permit = true,
                    Err(wait) => {
                        tracing::trace!(?wait, "API request held back by --kube-api-qps");
                        self.sleep = Some(Box::pin(tokio::time::sleep_until(now + wait)));
                    }
                }
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> S::Future {
        self.permit = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_allows_a_burst_then_qps() {
        let start = Instant::now();
        let mut bucket = Bucket::new(5.0, 10, start);
        for _ in 0..10 {
            assert_eq!(bucket.take(start), Ok(()));
        }
        let wait = bucket.take(start).unwrap_err();
        assert!((wait.as_secs_f64() - 0.2).abs() < 1e-9, "{wait:?}");
        assert_eq!(bucket.take(start + Duration::from_millis(200)), Ok(()));
        // A long pause refills up to the burst, not beyond.
        let later = start + Duration::from_secs(60);
        for _ in 0..10 {
            assert_eq!(bucket.take(later), Ok(()));
        }
        assert!(bucket.take(later).is_err());
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
        assert_eq!(
            RateLimitLayer::new(5.0, 10).unwrap().limit(),
            Some((5.0, 10))
        );
    }

    /// Counts calls; always ready.
    struct Counter(usize);

    impl Service<()> for Counter {
        type Response = usize;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<usize, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, (): ()) -> Self::Future {
            self.0 += 1;
            std::future::ready(Ok(self.0))
        }
    }

    #[tokio::test]
    async fn the_service_holds_requests_beyond_the_burst_back() {
        use tower::ServiceExt as _;
        // 50 per second, 3 at once: the first three go at once, the next two 20 ms apart.
        let mut service = RateLimitLayer::new(50.0, 3).unwrap().layer(Counter(0));
        let start = std::time::Instant::now();
        for _ in 0..3 {
            service.ready().await.unwrap().call(()).await.unwrap();
        }
        assert!(
            start.elapsed() < Duration::from_millis(15),
            "{:?}",
            start.elapsed()
        );
        for _ in 0..2 {
            service.ready().await.unwrap().call(()).await.unwrap();
        }
        assert!(
            start.elapsed() >= Duration::from_millis(35),
            "{:?}",
            start.elapsed()
        );
        // No limit: nothing waits.
        let mut free = RateLimitLayer::new(0.0, 0).unwrap().layer(Counter(0));
        let start = std::time::Instant::now();
        for _ in 0..100 {
            free.ready().await.unwrap().call(()).await.unwrap();
        }
        assert!(start.elapsed() < Duration::from_millis(15));
    }
}
