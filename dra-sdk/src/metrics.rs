//! Prometheus metrics of a running plugin, and the HTTP endpoint serving them with `/healthz`.
//!
//! Metrics (all labelled with `driver`):
//! - `dra_prepare_claims_total`, `dra_unprepare_claims_total`: claims handled;
//! - `dra_claim_errors_total{operation, kind}`: failed claims by error kind;
//! - `dra_prepare_claim_duration_seconds`, `dra_unprepare_claim_duration_seconds`: per-request
//!   latency histograms (a request carries a batch of claims);
//! - `dra_requests_in_flight{operation}`: kubelet requests being served;
//! - `dra_prepared_claims`: claims currently prepared on this node.
//!
//! The ResourceSlice publisher adds its own counters to the same registry:
//! `dra_resourceslice_{creates,updates,deletes,errors}_total`, with the same `driver` label.

use std::borrow::Cow;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Prefix of every metric the plugin serves.
pub(crate) const PREFIX: &str = "dra";

/// The `driver` label every metric the plugin serves carries.
pub(crate) fn driver_label(driver_name: &str) -> (Cow<'static, str>, Cow<'static, str>) {
    (Cow::Borrowed("driver"), Cow::Owned(driver_name.to_string()))
}

/// Which kubelet operation a metric is about.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub(crate) enum Operation {
    Prepare,
    Unprepare,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: Operation,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    operation: Operation,
    kind: Cow<'static, str>,
}

/// The plugin's metrics, shared by the gRPC handlers.
pub(crate) struct PluginMetrics {
    prepare_claims: Counter,
    unprepare_claims: Counter,
    errors: Family<ErrorLabels, Counter>,
    prepare_duration: Histogram,
    unprepare_duration: Histogram,
    in_flight: Family<OperationLabels, Gauge>,
    prepared_claims: Gauge,
}

impl PluginMetrics {
    /// Creates the metrics and registers them under `dra_` with a `driver` label.
    ///
    /// The registry returned is the root one the HTTP endpoint encodes: it has neither a
    /// prefix nor labels of its own, so that other components (the ResourceSlice publisher's
    /// [`register_metrics`](crate::slices::PublisherHandle::register_metrics)) can add their
    /// metrics to it under the same `dra_` prefix and `driver` label without doubling either.
    pub(crate) fn new(driver_name: &str) -> (Arc<Self>, Registry) {
        let mut root = Registry::default();
        let registry = root
            .sub_registry_with_prefix(PREFIX)
            .sub_registry_with_label(driver_label(driver_name));
        // 100 µs .. ~3.3 s: prepare is usually sub-millisecond, but a slow API server or a
        // driver creating MIG devices can take seconds.
        let buckets = || exponential_buckets(0.0001, 2.0, 16);
        let metrics = Arc::new(Self {
            prepare_claims: Counter::default(),
            unprepare_claims: Counter::default(),
            errors: Family::default(),
            prepare_duration: Histogram::new(buckets()),
            unprepare_duration: Histogram::new(buckets()),
            in_flight: Family::default(),
            prepared_claims: Gauge::default(),
        });
        registry.register(
            "prepare_claims",
            "Claims handled by NodePrepareResources",
            metrics.prepare_claims.clone(),
        );
        registry.register(
            "unprepare_claims",
            "Claims handled by NodeUnprepareResources",
            metrics.unprepare_claims.clone(),
        );
        registry.register(
            "claim_errors",
            "Claims that failed, by operation and error kind",
            metrics.errors.clone(),
        );
        registry.register(
            "prepare_claim_duration_seconds",
            "Duration of NodePrepareResources requests",
            metrics.prepare_duration.clone(),
        );
        registry.register(
            "unprepare_claim_duration_seconds",
            "Duration of NodeUnprepareResources requests",
            metrics.unprepare_duration.clone(),
        );
        registry.register(
            "requests_in_flight",
            "Kubelet requests being served",
            metrics.in_flight.clone(),
        );
        registry.register(
            "prepared_claims",
            "Claims currently prepared on this node",
            metrics.prepared_claims.clone(),
        );
        (metrics, root)
    }

    /// Tracks one kubelet request from start to drop.
    pub(crate) fn request(self: &Arc<Self>, operation: Operation, claims: usize) -> RequestTimer {
        match operation {
            Operation::Prepare => self.prepare_claims.inc_by(claims as u64),
            Operation::Unprepare => self.unprepare_claims.inc_by(claims as u64),
        };
        self.in_flight
            .get_or_create(&OperationLabels { operation })
            .inc();
        RequestTimer {
            metrics: Arc::clone(self),
            operation,
            started: std::time::Instant::now(),
        }
    }

    pub(crate) fn claim_error(&self, operation: Operation, kind: &'static str) {
        self.errors
            .get_or_create(&ErrorLabels {
                operation,
                kind: Cow::Borrowed(kind),
            })
            .inc();
    }

    pub(crate) fn set_prepared_claims(&self, count: usize) {
        self.prepared_claims
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    pub(crate) fn add_prepared_claims(&self, delta: i64) {
        self.prepared_claims.inc_by(delta);
    }
}

/// Observes the duration and in-flight gauge of one request when dropped.
pub(crate) struct RequestTimer {
    metrics: Arc<PluginMetrics>,
    operation: Operation,
    started: std::time::Instant,
}

impl Drop for RequestTimer {
    fn drop(&mut self) {
        let elapsed = self.started.elapsed().as_secs_f64();
        match self.operation {
            Operation::Prepare => self.metrics.prepare_duration.observe(elapsed),
            Operation::Unprepare => self.metrics.unprepare_duration.observe(elapsed),
        }
        self.metrics
            .in_flight
            .get_or_create(&OperationLabels {
                operation: self.operation,
            })
            .dec();
    }
}

/// A probe that says whether the plugin's sockets answer.
pub(crate) type HealthProbe =
    Arc<dyn Fn() -> futures::future::BoxFuture<'static, Result<(), String>> + Send + Sync>;

#[derive(Clone)]
struct HttpState {
    registry: Arc<Mutex<Registry>>,
    probe: HealthProbe,
}

/// Where the metrics are served unless the driver picks another path.
pub(crate) const DEFAULT_METRICS_PATH: &str = "/metrics";

/// Checks a metrics path before it reaches the router, which panics on paths it cannot route
/// (no leading `/`, `{}` captures, a clash with `/healthz`).
pub(crate) fn check_metrics_path(path: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '/' | '-' | '_' | '.');
    if !path.starts_with('/') || path.len() < 2 || !path.chars().all(allowed) {
        return Err(format!(
            "metrics path {path:?}: must start with '/' and use only letters, digits and '/-_.'"
        ));
    }
    if path.trim_end_matches('/') == "/healthz" {
        return Err(format!(
            "metrics path {path:?}: /healthz is the health check"
        ));
    }
    Ok(())
}

/// Serves the metrics (Prometheus text format) at `metrics_path` and `/healthz` on an already
/// bound listener. `metrics_path` has passed [`check_metrics_path`].
pub(crate) async fn serve_http(
    listener: tokio::net::TcpListener,
    metrics_path: &str,
    registry: Arc<Mutex<Registry>>,
    probe: HealthProbe,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route(metrics_path, get(metrics_handler))
        .route("/healthz", get(healthz_handler))
        .with_state(HttpState { registry, probe });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Binds the HTTP endpoint early so that a bad address fails the start, not a background task.
pub(crate) async fn bind_http(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    bind_tcp(addr).await
}

/// Binds a TCP listener. The wildcard `[::]` (the default of `:PORT` endpoints, which also
/// takes IPv4 connections on Linux) falls back to `0.0.0.0` where the pod or host has IPv6
/// disabled: there binding `[::]` fails with "address family not supported" or "cannot assign
/// requested address", and the DaemonSet's probes would never see the plugin.
pub(crate) async fn bind_tcp(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    match tokio::net::TcpListener::bind(addr).await {
        Err(error) if addr.ip() == std::net::Ipv6Addr::UNSPECIFIED && ipv6_unavailable(&error) => {
            tracing::info!(%error, port = addr.port(), "IPv6 is unavailable; listening on 0.0.0.0");
            tokio::net::TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, addr.port())).await
        }
        result => result,
    }
}

fn ipv6_unavailable(error: &std::io::Error) -> bool {
    error.kind() == std::io::ErrorKind::AddrNotAvailable
        || error.raw_os_error() == Some(rustix::io::Errno::AFNOSUPPORT.raw_os_error())
}

async fn metrics_handler(State(state): State<HttpState>) -> impl IntoResponse {
    let mut body = String::new();
    let encoded = {
        let registry = state
            .registry
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        prometheus_client::encoding::text::encode(&mut body, &registry)
    };
    match encoded {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        ),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("encoding metrics: {error}"),
        ),
    }
}

async fn healthz_handler(State(state): State<HttpState>) -> impl IntoResponse {
    match (state.probe)().await {
        Ok(()) => (StatusCode::OK, "ok".to_string()),
        Err(error) => (StatusCode::SERVICE_UNAVAILABLE, error),
    }
}

#[cfg(test)]
mod path_tests {
    #[test]
    fn metrics_paths_are_checked_before_routing() {
        for good in ["/metrics", "/custom/metrics", "/nvidia_dra-metrics.v1"] {
            assert_eq!(super::check_metrics_path(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "/",
            "metrics",
            "/m etrics",
            "/{id}",
            "/*rest",
            "/healthz",
            "/healthz/",
        ] {
            assert!(super::check_metrics_path(bad).is_err(), "{bad:?}");
        }
    }
}
