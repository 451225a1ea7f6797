//! An admission webhook that refuses bad opaque configs at `kubectl apply` (feature `webhook`).
//!
//! Without it, a typo in a claim's `opaque.parameters` shows up only when a pod that uses the
//! claim is scheduled and the kubelet plugin fails to prepare it: the pod hangs in
//! `ContainerCreating`. [`AdmissionServer`] is a ValidatingAdmissionWebhook for
//! ResourceClaims, ResourceClaimTemplates and DeviceClasses (`resource.k8s.io` v1, v1beta2 or
//! v1beta1) that decodes each opaque config addressed to the driver with the driver's
//! [`ConfigRegistry`]: the same strict decoding, the same [`ConfigHooks`] and the same error
//! text as prepare, in a denial that names the field:
//!
//! ```text
//! admission webhook "gpu.example.com" denied the request: spec.devices.config[1].opaque.parameters:
//!   invalid GpuConfig (gpu.example.com/v1): unknown field `timeSlices` (did you mean `timeSlice`?)
//! ```
//!
//! What it checks:
//! - every `opaque` config whose `driver` is this driver, at `spec.devices.config[i]` of a
//!   claim, `spec.spec.devices.config[i]` of a template and `spec.config[i]` of a class;
//!   an `apiVersion`/`kind` the registry does not know is denied, like any decoding or
//!   validation error; other drivers' configs are left alone;
//! - all bad configs of an object in one denial (joined by `; `), not only the first;
//! - CREATE, and UPDATE of configs the stored object did not already have (so an object stored
//!   before the webhook existed can still be updated, for example to remove its finalizers);
//!   DELETE, CONNECT and subresources (the scheduler's `resourceclaims/status`) are allowed.
//!
//! What it cannot check: anything that needs the allocated devices or the node (a config of
//! the wrong kind for the device it lands on, a per-device setting naming a device that is
//! not allocated, a feature gate of the node's plugin). Those stay prepare-time errors, in the
//! claim's events as before.
//!
//! Protocol: `POST /validate` takes an AdmissionReview `admission.k8s.io/v1` and answers one
//! with the request's `uid`, `allowed`, and for a denial `status` with code 422 (reason
//! `Invalid`) and the message. A body that is no AdmissionReview v1 gets HTTP 400 with a text
//! saying why; a body over 6 MiB gets 413 (the API server takes request bodies up to 3 MiB,
//! and an UPDATE's review carries the new and the old object). `GET /readyz` answers 200: the
//! server only listens once it has a certificate. HTTP/1.1 over TLS 1.2 or 1.3 (rustls with
//! the `ring` provider, as kube's client).
//!
//! Certificates: a PEM chain and key from files, typically a `kubernetes.io/tls` Secret
//! (cert-manager's or one Helm made) mounted as a volume. The files are read again every few
//! seconds (see [`AdmissionServer::reload_interval`]); a changed pair that loads is used for
//! every new connection from then on, without a restart. A pair that fails to load (a
//! certificate and key that do not match, say) is logged and the previous one stays.
//!
//! The webhook makes no API calls: it needs no RBAC and no service account token.
//!
//! ```no_run
//! # #[derive(serde::Deserialize, dra_sdk::config::OpaqueConfig)]
//! # #[dra(api_version = "gpu.example.com/v1", kind = "GpuConfig", hooks = false)]
//! # struct GpuConfig {}
//! use dra_sdk::config::ConfigRegistry;
//! use dra_sdk::webhook::AdmissionServer;
//!
//! # async fn main_() -> Result<(), dra_sdk::webhook::WebhookError> {
//! // The registry the driver's `Driver::config_registry` returns.
//! let registry = ConfigRegistry::<GpuConfig>::new().register::<GpuConfig>();
//! AdmissionServer::new("gpu.example.com", registry)
//!     .tls_files("/etc/dra-webhook/tls/tls.crt", "/etc/dra-webhook/tls/tls.key")
//!     .run_until_signal()
//!     .await
//! # }
//! ```
//!
//! [`ConfigHooks`]: crate::config::ConfigHooks

mod review;
mod tls;

use std::future::Future;
use std::net::{Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use crate::config::ConfigRegistry;

use self::review::Decoder;
use self::tls::CertFiles;

/// Largest AdmissionReview accepted. The API server refuses request bodies over 3 MiB, and the
/// review of an UPDATE carries both the new object and the stored one.
const MAX_REVIEW_BYTES: usize = 6 * 1024 * 1024;
/// A client that connects and does not finish the TLS handshake in this time is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time to read a request's headers; the API server sends them at once.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open connections get to finish their requests at shutdown. The API server's
/// default webhook timeout is 10 s.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the certificate files are read again; the contract with the charts is "within
/// about 10 s", on top of the kubelet's own delay in updating a Secret volume.
const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(5);

/// Why the admission server could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WebhookError {
    /// The certificate or key file could not be read, or does not hold a usable certificate
    /// chain and matching private key.
    #[error("TLS certificate file {}: {message}", path.display())]
    Certificate {
        /// The file at fault.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// Binding the port, or another I/O failure.
    #[error("{context}: {source}")]
    Io {
        /// What the server was doing.
        context: String,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
}

/// The admission webhook server: configure with the builder methods, then
/// [`run_until_signal`](Self::run_until_signal) (or [`serve`](Self::serve) on a listener of
/// your own). See the [module documentation](self) for what it checks.
pub struct AdmissionServer {
    driver_name: String,
    decoder: Arc<dyn Decoder>,
    cert_file: PathBuf,
    key_file: PathBuf,
    address: SocketAddr,
    reload_interval: Duration,
}

impl std::fmt::Debug for AdmissionServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdmissionServer")
            .field("driver_name", &self.driver_name)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("address", &self.address)
            .field("reload_interval", &self.reload_interval)
            .finish_non_exhaustive()
    }
}

impl AdmissionServer {
    /// The port it listens on unless told otherwise.
    pub const DEFAULT_PORT: u16 = 8443;
    /// Where a `kubernetes.io/tls` Secret is expected to be mounted: `tls.crt` and `tls.key`.
    pub const DEFAULT_TLS_DIR: &'static str = "/etc/dra-webhook/tls";

    /// A server for `driver_name`'s opaque configs, decoded with `registry` (the one the
    /// driver's [`Driver::config_registry`](crate::driver::Driver::config_registry) returns).
    /// Listens on `[::]:8443` (IPv4 too; `0.0.0.0` where IPv6 is off) with the certificate in
    /// [`DEFAULT_TLS_DIR`](Self::DEFAULT_TLS_DIR) unless configured otherwise.
    pub fn new<C: Send + Sync + 'static>(
        driver_name: impl Into<String>,
        registry: ConfigRegistry<C>,
    ) -> Self {
        let driver_name = driver_name.into();
        let dir = PathBuf::from(Self::DEFAULT_TLS_DIR);
        Self {
            decoder: review::decoder(driver_name.clone(), registry),
            driver_name,
            cert_file: dir.join("tls.crt"),
            key_file: dir.join("tls.key"),
            address: SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), Self::DEFAULT_PORT),
            reload_interval: DEFAULT_RELOAD_INTERVAL,
        }
    }

    /// The PEM certificate chain (leaf first) and private key (PKCS#8, PKCS#1 or SEC1) to
    /// serve, re-read when they change.
    pub fn tls_files(
        mut self,
        cert_file: impl Into<PathBuf>,
        key_file: impl Into<PathBuf>,
    ) -> Self {
        self.cert_file = cert_file.into();
        self.key_file = key_file.into();
        self
    }

    /// The address [`run_until_signal`](Self::run_until_signal) listens on.
    pub fn address(mut self, address: SocketAddr) -> Self {
        self.address = address;
        self
    }

    /// How often the certificate files are checked for a change (default 5 s).
    pub fn reload_interval(mut self, interval: Duration) -> Self {
        self.reload_interval = interval.max(Duration::from_millis(10));
        self
    }

    /// The certificate files and port of [`WebhookArgs`].
    #[cfg(feature = "cli")]
    pub fn args(self, args: &WebhookArgs) -> Self {
        let address = SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), args.port);
        self.tls_files(&args.tls_cert_file, &args.tls_key_file)
            .address(address)
    }

    /// Loads the certificate, listens, and serves until SIGTERM or SIGINT; then lets open
    /// requests finish (up to 10 s) and returns.
    pub async fn run_until_signal(self) -> Result<(), WebhookError> {
        let listener = crate::metrics::bind_tcp(self.address)
            .await
            .map_err(|source| WebhookError::Io {
                context: format!("listening on {}", self.address),
                source,
            })?;
        let mut terminate = tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::terminate(),
        )
        .map_err(|source| WebhookError::Io {
            context: "installing the SIGTERM handler".into(),
            source,
        })?;
        let signal = async move {
            tokio::select! {
                _ = terminate.recv() => tracing::info!("SIGTERM received, shutting down"),
                _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received, shutting down"),
            }
        };
        self.serve(listener, signal).await
    }

    /// Serves on `listener` until `shutdown` completes, then lets open requests finish (up to
    /// 10 s). Fails before serving anything if the certificate cannot be loaded.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), WebhookError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let (mut files, resolver) = CertFiles::load(
            self.cert_file.clone(),
            self.key_file.clone(),
            Arc::clone(&provider),
        )
        .await?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|error| WebhookError::Certificate {
                path: self.cert_file.clone(),
                message: error.to_string(),
            })?
            .with_no_client_auth()
            .with_cert_resolver(resolver.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        // No session resumption: a resumed session skips the certificate, so a client could
        // go on trusting the replaced one. Full handshakes are cheap at the API server's rate
        // of new connections (it keeps them alive).
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let app = Router::new()
            .route("/validate", post(validate))
            .route("/readyz", get(|| async { "ok" }))
            .layer(DefaultBodyLimit::max(MAX_REVIEW_BYTES))
            .with_state(Arc::clone(&self.decoder));

        let local = listener.local_addr().ok();
        tracing::info!(
            driver = %self.driver_name,
            address = ?local,
            cert = %self.cert_file.display(),
            "admission webhook serving"
        );
        let stop = CancellationToken::new();
        let mut connections = JoinSet::new();
        let mut reload = tokio::time::interval(self.reload_interval);
        reload.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        reload.tick().await;
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                _ = reload.tick() => {
                    files.reload(&resolver).await;
                }
                accepted = listener.accept() => {
                    // Reap finished connections so the set does not grow.
                    while connections.try_join_next().is_some() {}
                    let (stream, peer) = match accepted {
                        Ok(accepted) => accepted,
                        Err(error) => {
                            // Out of file descriptors and the like: pause instead of spinning.
                            tracing::warn!(%error, "accepting a connection");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    };
                    connections.spawn(connection(
                        stream,
                        peer,
                        acceptor.clone(),
                        app.clone(),
                        stop.clone(),
                    ));
                }
            }
        }
        drop(listener);
        stop.cancel();
        let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
            while connections.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                open = connections.len(),
                "connections still open after {DRAIN_TIMEOUT:?}; closing them"
            );
            connections.shutdown().await;
        }
        Ok(())
    }
}

/// One client connection: TLS, then HTTP/1.1 requests until it closes or the server stops.
async fn connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    acceptor: tokio_rustls::TlsAcceptor,
    app: Router,
    stop: CancellationToken,
) {
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(error)) => {
            tracing::debug!(%peer, %error, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    let service = hyper::service::service_fn(move |request| app.clone().oneshot(request));
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(tls), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.as_mut().await
        }
    };
    if let Err(error) = result {
        tracing::debug!(%peer, %error, "connection ended with an error");
    }
}

async fn validate(State(decoder): State<Arc<dyn Decoder>>, body: Bytes) -> Response {
    match review::answer(&body, &*decoder) {
        Ok((review, verdict)) => {
            let span = tracing::info_span!(
                "admission",
                uid = %verdict.uid,
                operation = %verdict.operation,
                kind = %verdict.kind,
                namespace = %verdict.namespace,
                object = %verdict.name,
            );
            let _entered = span.enter();
            match &verdict.denied {
                Some(message) => tracing::info!(denial = %message, "denied"),
                None => tracing::debug!("allowed"),
            }
            axum::Json(review).into_response()
        }
        Err(malformed) => {
            tracing::warn!(error = %malformed, "answering 400");
            (
                StatusCode::BAD_REQUEST,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                format!("{malformed}\n"),
            )
                .into_response()
        }
    }
}

#[cfg(feature = "cli")]
mod args;
#[cfg(feature = "cli")]
pub use args::WebhookArgs;
