//! Command-line flags every kubelet plugin needs, with the upstream drivers' names and
//! environment variables, as a clap argument group to flatten into a driver's own CLI.
//!
//! ```
//! use clap::Parser;
//! use dra_sdk::cli::PluginArgs;
//!
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     plugin: PluginArgs,
//!     /// A driver-specific flag.
//!     #[arg(long, default_value_t = 8)]
//!     num_devices: u32,
//! }
//!
//! let cli = Cli::parse_from(["my-plugin", "--node-name", "node-a", "--http-endpoint", ":8080"]);
//! assert_eq!(cli.plugin.node_name, "node-a");
//! assert_eq!(cli.plugin.http_endpoint().unwrap().unwrap().port(), 8080);
//! ```

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;

use crate::advanced::rate_limit::RateLimitLayer;
use crate::{DEFAULT_CDI_ROOT, DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRAR_DIR};

/// The SDK's flags. Flatten with `#[command(flatten)]`.
#[derive(Clone, Debug, clap::Args)]
pub struct PluginArgs {
    /// Name of the node this plugin runs on (from the downward API in a DaemonSet).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,

    /// Kubeconfig file; without it the in-cluster configuration is used.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Directory the kubelet watches for plugin registration sockets.
    #[arg(long, env = "KUBELET_REGISTRAR_DIRECTORY_PATH", default_value = DEFAULT_REGISTRAR_DIR)]
    pub kubelet_registrar_directory_path: PathBuf,

    /// Directory for the plugin's DRA socket and state (`<dir>/<driver name>/`).
    #[arg(long, env = "KUBELET_PLUGINS_DIRECTORY_PATH", default_value = DEFAULT_PLUGINS_DIR)]
    pub kubelet_plugins_directory_path: PathBuf,

    /// Directory the container runtime reads CDI specs from.
    #[arg(long, env = "CDI_ROOT", default_value = DEFAULT_CDI_ROOT)]
    pub cdi_root: PathBuf,

    /// TCP port of the gRPC health service for liveness probes: negative disables it, 0 picks
    /// a free port.
    #[arg(long, env = "HEALTHCHECK_PORT", default_value_t = -1, allow_negative_numbers = true)]
    pub healthcheck_port: i32,

    /// Address of the HTTP endpoint with /metrics and /healthz, e.g. `:8080` or
    /// `127.0.0.1:8080`; empty disables it.
    #[arg(long, env = "HTTP_ENDPOINT", default_value = "")]
    pub http_endpoint: String,

    /// UID of the plugin's pod (downward API). Enables rolling updates: two instances of the
    /// plugin run side by side with UID-specific socket names. Needs kubelet 1.33+.
    #[arg(long, env = "POD_UID")]
    pub pod_uid: Option<String>,

    /// Requests per second to the API server on average: a client-side limit, so that many
    /// plugins starting at once do not flood it. 0 or less: no limit.
    #[arg(
        long,
        env = "KUBE_API_QPS",
        default_value_t = 5.0,
        allow_negative_numbers = true
    )]
    pub kube_api_qps: f64,

    /// Requests to the API server that may go at once before --kube-api-qps holds them back.
    #[arg(long, env = "KUBE_API_BURST", default_value_t = 10)]
    pub kube_api_burst: u32,

    /// Claim reads of NodePrepareResources per second, on average: the kubelet waits on them,
    /// so they have a budget of their own, by default the kubelet's own client limit. 0 or
    /// less: no limit.
    #[arg(
        long,
        env = "KUBE_API_PREPARE_QPS",
        default_value_t = crate::advanced::rate_limit::DEFAULT_PREPARE_LIMIT.0,
        allow_negative_numbers = true
    )]
    pub kube_api_prepare_qps: f64,

    /// Claim reads that may go at once before --kube-api-prepare-qps holds them back.
    #[arg(
        long,
        env = "KUBE_API_PREPARE_BURST",
        default_value_t = crate::advanced::rate_limit::DEFAULT_PREPARE_LIMIT.1
    )]
    pub kube_api_prepare_burst: u32,

    /// Worker threads of the plugin's async runtime ([`PluginArgs::runtime`]). Default: the
    /// CPUs available to the process, at most 4. A plugin waits on the kubelet, the API server
    /// and the disk; on a node with 128 CPUs, one worker per CPU only adds idle threads and
    /// memory.
    #[arg(long, env = "WORKER_THREADS")]
    pub worker_threads: Option<std::num::NonZeroUsize>,
}

/// The most worker threads [`PluginArgs::runtime`] starts unless `--worker-threads` says more.
pub(crate) const DEFAULT_MAX_WORKER_THREADS: usize = 4;

/// Why [`PluginArgs::kube_client`] could not build a client.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The kubeconfig or in-cluster configuration could not be loaded.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// `--kube-api-qps` or `--kube-api-burst` cannot be used.
    #[error(transparent)]
    RateLimit(#[from] crate::advanced::rate_limit::RateLimitError),
}

/// A flag value that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("--{flag}: {message}")]
pub struct ArgsError {
    flag: &'static str,
    message: String,
}

impl PluginArgs {
    /// Logs to stderr at the levels `RUST_LOG` names, as `level` and `target=level`
    /// directives (`info`, `warn,dra_sdk=debug`); `info` when unset, and an unparsable value
    /// is reported and ignored. Call it once, first thing in `main`, before the flags are
    /// parsed.
    ///
    /// The directives are `tracing_subscriber`'s `Targets`, not `EnvFilter`: its span and field
    /// matching brings a regex engine into the executable, and every megabyte of code shows up
    /// in the plugin's resident memory on every node.
    ///
    /// ```no_run
    /// use clap::Parser;
    /// use dra_sdk::cli::PluginArgs;
    ///
    /// #[derive(Parser)]
    /// struct Cli {
    ///     #[command(flatten)]
    ///     plugin: PluginArgs,
    /// }
    ///
    /// PluginArgs::init_logging();
    /// let cli = Cli::parse();
    /// tracing::info!(node = %cli.plugin.node_name, "starting");
    /// ```
    pub fn init_logging() {
        use tracing_subscriber::filter::{LevelFilter, Targets};
        use tracing_subscriber::layer::SubscriberExt as _;
        use tracing_subscriber::util::SubscriberInitExt as _;

        let rust_log = std::env::var("RUST_LOG").unwrap_or_default();
        let filter = match rust_log.parse::<Targets>() {
            Ok(filter) if !rust_log.trim().is_empty() => filter,
            Ok(_) => Targets::new().with_default(LevelFilter::INFO),
            Err(error) => {
                eprintln!("ignoring RUST_LOG={rust_log:?} ({error}); logging at info");
                Targets::new().with_default(LevelFilter::INFO)
            }
        };
        tracing_subscriber::registry()
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
            .with(filter)
            .init();
    }

    /// The most worker threads a plugin starts without `--max-worker-threads`.
    pub const DEFAULT_MAX_WORKER_THREADS: usize = DEFAULT_MAX_WORKER_THREADS;

    /// The HTTP endpoint address; `None` when disabled. `:8080` means all interfaces.
    pub fn http_endpoint(&self) -> Result<Option<SocketAddr>, ArgsError> {
        parse_endpoint(&self.http_endpoint).map_err(|message| ArgsError {
            flag: "http-endpoint",
            message,
        })
    }

    /// The gRPC health port; `None` when disabled.
    pub fn healthcheck_port(&self) -> Result<Option<u16>, ArgsError> {
        if self.healthcheck_port < 0 {
            return Ok(None);
        }
        u16::try_from(self.healthcheck_port)
            .map(Some)
            .map_err(|_| ArgsError {
                flag: "healthcheck-port",
                message: format!("{} is not a TCP port", self.healthcheck_port),
            })
    }

    /// The number of worker threads for the plugin's runtime: `--worker-threads`, else the
    /// CPUs available, at most [`DEFAULT_MAX_WORKER_THREADS`](Self::DEFAULT_MAX_WORKER_THREADS).
    pub fn worker_threads(&self) -> usize {
        self.worker_threads.map_or_else(
            || {
                std::thread::available_parallelism()
                    .map_or(1, std::num::NonZeroUsize::get)
                    .min(DEFAULT_MAX_WORKER_THREADS)
            },
            std::num::NonZeroUsize::get,
        )
    }

    /// A multi-threaded Tokio runtime with [`worker_threads`](Self::worker_threads) workers
    /// and every driver enabled, for a plugin's `main` (instead of `#[tokio::main]`, whose
    /// runtime starts one worker per CPU).
    ///
    /// ```
    /// use clap::Parser;
    /// use dra_sdk::cli::PluginArgs;
    ///
    /// #[derive(Parser)]
    /// struct Cli {
    ///     #[command(flatten)]
    ///     plugin: PluginArgs,
    /// }
    ///
    /// let cli = Cli::parse_from(["my-plugin", "--node-name", "node-a", "--worker-threads", "2"]);
    /// let runtime = cli.plugin.runtime()?;
    /// assert_eq!(runtime.metrics().num_workers(), 2);
    /// runtime.block_on(async { /* start the plugin */ });
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn runtime(&self) -> std::io::Result<tokio::runtime::Runtime> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(self.worker_threads())
            .enable_all()
            .build()
    }

    /// The client-side rate limits: `--kube-api-qps` and `--kube-api-burst` for background
    /// requests, `--kube-api-prepare-qps` and `--kube-api-prepare-burst` for the claim reads
    /// of prepares (see [`rate_limit`](crate::advanced::rate_limit)).
    pub fn rate_limit(
        &self,
    ) -> Result<RateLimitLayer, crate::advanced::rate_limit::RateLimitError> {
        RateLimitLayer::new(self.kube_api_qps, self.kube_api_burst)?
            .prepare(self.kube_api_prepare_qps, self.kube_api_prepare_burst)
    }

    /// A Kubernetes client from `--kubeconfig`, or the in-cluster configuration, its requests
    /// limited by [`rate_limit`](Self::rate_limit). Call it inside the Tokio runtime.
    pub async fn kube_client(&self) -> Result<kube::Client, ClientError> {
        let limit = self.rate_limit()?;
        let config = match &self.kubeconfig {
            Some(path) => {
                let kubeconfig = kube::config::Kubeconfig::read_from(path)
                    .map_err(kube::Error::InferKubeconfig)?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                    .await
                    .map_err(kube::Error::InferKubeconfig)?
            }
            None => kube::Config::infer()
                .await
                .map_err(kube::Error::InferConfig)?,
        };
        Ok(kube::client::ClientBuilder::try_from(config)?
            .with_layer(&limit)
            .build())
    }
}

fn parse_endpoint(value: &str) -> Result<Option<SocketAddr>, String> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(None);
    }
    if let Some(port) = value.strip_prefix(':') {
        let port: u16 = port
            .parse()
            .map_err(|_| format!("{value:?} has no valid port"))?;
        return Ok(Some(SocketAddr::new(
            IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            port,
        )));
    }
    value
        .parse()
        .map(Some)
        .map_err(|_| format!("{value:?} is not host:port (e.g. 127.0.0.1:8080 or :8080)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_like_the_go_drivers() {
        assert_eq!(parse_endpoint("").unwrap(), None);
        assert_eq!(parse_endpoint(":8080").unwrap().unwrap().port(), 8080);
        assert_eq!(
            parse_endpoint("127.0.0.1:9000")
                .unwrap()
                .unwrap()
                .to_string(),
            "127.0.0.1:9000"
        );
        assert!(parse_endpoint("nonsense").unwrap_err().contains("nonsense"));
        assert!(parse_endpoint(":99999").is_err());
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        plugin: PluginArgs,
    }

    fn parse(args: &[&str]) -> PluginArgs {
        <Cli as clap::Parser>::parse_from([&["plugin", "--node-name", "n"], args].concat()).plugin
    }

    #[test]
    fn worker_threads_default_to_the_cpus_at_most_four_and_the_flag_wins() {
        let cpus = std::thread::available_parallelism().unwrap().get();
        assert_eq!(
            parse(&[]).worker_threads(),
            cpus.min(DEFAULT_MAX_WORKER_THREADS)
        );
        assert_eq!(parse(&["--worker-threads", "16"]).worker_threads(), 16);
        let runtime = parse(&["--worker-threads", "3"]).runtime().unwrap();
        assert_eq!(runtime.metrics().num_workers(), 3);
        assert!(
            <Cli as clap::Parser>::try_parse_from([
                "plugin",
                "--node-name",
                "n",
                "--worker-threads",
                "0"
            ])
            .is_err()
        );
    }

    #[test]
    fn the_rate_limit_flags_default_as_upstream_and_configure_the_limit() {
        assert_eq!(parse(&[]).rate_limit().unwrap().limit(), Some((5.0, 10)));
        let args = parse(&["--kube-api-qps", "20.5", "--kube-api-burst", "30"]);
        assert_eq!(args.rate_limit().unwrap().limit(), Some((20.5, 30)));
        assert_eq!(
            parse(&["--kube-api-qps=-1"]).rate_limit().unwrap().limit(),
            None
        );
        let error = parse(&["--kube-api-burst", "0"]).rate_limit().unwrap_err();
        assert!(error.to_string().starts_with("--kube-api-burst"), "{error}");
        // Prepares have the kubelet's own budget unless told otherwise.
        let defaults = parse(&[]).rate_limit().unwrap();
        assert_eq!(defaults.prepare_limit(), Some((50.0, 100)));
        let args = parse(&[
            "--kube-api-prepare-qps",
            "200",
            "--kube-api-prepare-burst",
            "400",
        ]);
        assert_eq!(
            args.rate_limit().unwrap().prepare_limit(),
            Some((200.0, 400))
        );
        let error = parse(&["--kube-api-prepare-burst", "0"])
            .rate_limit()
            .unwrap_err();
        assert!(
            error.to_string().starts_with("--kube-api-prepare-burst"),
            "{error}"
        );
    }
}
