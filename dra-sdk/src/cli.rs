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

    /// How long a prepare may spend reading one ResourceClaim from the API server, retries
    /// of 5xx, 429 and dropped connections included (`10s`, `1500ms`, `1m`; a bare number is
    /// seconds). A claim whose read takes longer fails alone with "timed out after …" and the
    /// kubelet retries it; keep it well under the kubelet's 45 s deadline for the whole call.
    #[arg(
        long,
        env = "CLAIM_READ_TIMEOUT",
        default_value = "10s",
        value_parser = parse_timeout
    )]
    pub claim_read_timeout: std::time::Duration,

    /// Worker threads of the plugin's async runtime ([`PluginArgs::runtime`]). Default: the
    /// CPUs available to the process, at most 4. A plugin waits on the kubelet, the API server
    /// and the disk; on a node with 128 CPUs, one worker per CPU only adds idle threads and
    /// memory.
    #[arg(long, env = "WORKER_THREADS")]
    pub worker_threads: Option<std::num::NonZeroUsize>,

    /// Log format on stderr: `text` (one human-readable line per event) or `json` (one JSON
    /// object per line, for log pipelines). See [`PluginArgs::init_logging`].
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// How [`PluginArgs::init_logging`] writes log lines (`--log-format`, env `LOG_FORMAT`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
#[non_exhaustive]
pub enum LogFormat {
    /// One human-readable line per event, with the fields of the spans it happened in
    /// (`claim{driver=… claim.uid=…}: message`); coloured only on a terminal.
    #[default]
    Text,
    /// One JSON object per line: `timestamp` (RFC 3339), `level`, `target`, `message` and the
    /// event's own fields at the top level, `span` (the innermost span's name and fields) and
    /// `spans` (every enclosing span, outermost first), so a claim's UID and the driver's name
    /// are on every line logged while working on that claim.
    Json,
}

impl LogFormat {
    /// The format `LOG_FORMAT` names, for a binary without [`PluginArgs`] (a demo, a tool):
    /// `text` when unset; an unknown value is reported on stderr and `text` is used.
    pub fn from_env() -> Self {
        let (format, problem) = log_format_from(std::env::var_os("LOG_FORMAT").as_deref());
        if let Some(problem) = problem {
            eprintln!("{problem}");
        }
        format
    }

    /// Logs to stderr in this format at the levels `RUST_LOG` names, `default_level` when it
    /// is unset: the one logging set-up of every binary (plugins call it through
    /// [`PluginArgs::init_logging`]; a demo passes a quieter level). See
    /// [`PluginArgs::init_logging`] for `RUST_LOG` and colour.
    ///
    /// ```no_run
    /// use dra_sdk::cli::LogFormat;
    ///
    /// // A demo binary: errors only unless RUST_LOG says more.
    /// LogFormat::from_env().init_logging(tracing::level_filters::LevelFilter::ERROR);
    /// ```
    pub fn init_logging(self, default_level: tracing::level_filters::LevelFilter) {
        use std::io::IsTerminal as _;
        use tracing_subscriber::layer::SubscriberExt as _;
        use tracing_subscriber::util::SubscriberInitExt as _;

        let rust_log = std::env::var("RUST_LOG").unwrap_or_default();
        let (filter, problem) = log_filter(&rust_log, default_level);
        let colour = use_colour(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR").as_deref(),
        );
        tracing_subscriber::registry()
            .with(log_layer(self, colour, std::io::stderr))
            .with(filter)
            .init();
        if let Some(problem) = problem {
            // After the set-up, so that a JSON pipeline gets it as a JSON line too.
            tracing::warn!("{problem}");
        }
    }
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
    /// Logs to stderr in `--log-format` (env `LOG_FORMAT`, default `text`) at the levels
    /// `RUST_LOG` names, as `level` and `target=level` directives (`info`,
    /// `warn,dra_sdk=debug`); `info` when unset, and an unparsable value is reported and
    /// ignored. Call it once, first thing after the flags are parsed. Binaries without
    /// `PluginArgs` call [`LogFormat::init_logging`].
    ///
    /// Text is coloured only when stderr is a terminal and `NO_COLOR` is unset or empty
    /// (<https://no-color.org>): a plugin's stderr is a file on the node, read with
    /// `kubectl logs`, where escape codes are noise. JSON is never coloured.
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
    /// let cli = Cli::parse();
    /// cli.plugin.init_logging();
    /// tracing::info!(node = %cli.plugin.node_name, "starting");
    /// ```
    pub fn init_logging(&self) {
        self.log_format
            .init_logging(tracing::level_filters::LevelFilter::INFO);
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

/// A positive duration: a number with `ms`, `s` or `m`, or a bare number of seconds.
fn parse_timeout(value: &str) -> Result<std::time::Duration, String> {
    let value = value.trim();
    let split = value
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let scale = match unit.trim() {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" => 60.0,
        other => return Err(format!("unknown unit {other:?} (use ms, s or m)")),
    };
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{value:?} is not a duration such as 10s or 1500ms"))?;
    std::time::Duration::try_from_secs_f64(number * scale)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("{value:?} is not a positive duration"))
}

/// The format a `LOG_FORMAT` value names (case-insensitive, like the flag), and a line saying
/// why an unknown one is ignored.
fn log_format_from(value: Option<&std::ffi::OsStr>) -> (LogFormat, Option<String>) {
    let Some(value) = value else {
        return (LogFormat::Text, None);
    };
    let value = value.to_string_lossy();
    match <LogFormat as clap::ValueEnum>::from_str(value.trim(), true) {
        Ok(format) => (format, None),
        Err(_) => (
            LogFormat::Text,
            Some(format!(
                "ignoring LOG_FORMAT={value:?} (expected text or json); logging as text"
            )),
        ),
    }
}

/// The `RUST_LOG` directives as a filter, `default_level` for an empty value; an unparsable
/// value gives the default and a line saying so.
fn log_filter(
    rust_log: &str,
    default_level: tracing::level_filters::LevelFilter,
) -> (tracing_subscriber::filter::Targets, Option<String>) {
    use tracing_subscriber::filter::Targets;
    if rust_log.trim().is_empty() {
        return (Targets::new().with_default(default_level), None);
    }
    match rust_log.parse::<Targets>() {
        Ok(filter) => (filter, None),
        Err(error) => (
            Targets::new().with_default(default_level),
            Some(format!(
                "ignoring RUST_LOG={rust_log:?} ({error}); logging at {default_level}"
            )),
        ),
    }
}

/// Colour only on a terminal, and not when `NO_COLOR` is set to anything but the empty
/// string.
fn use_colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|value| value.is_empty())
}

/// The formatting layer for `format`, writing to `writer`.
fn log_layer<S, W>(
    format: LogFormat,
    colour: bool,
    writer: W,
) -> Box<dyn tracing_subscriber::Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    use tracing_subscriber::Layer as _;
    let layer = tracing_subscriber::fmt::layer().with_writer(writer);
    match format {
        LogFormat::Text => layer.with_ansi(colour).boxed(),
        LogFormat::Json => layer
            .json()
            .with_ansi(false)
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(true)
            .boxed(),
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
    fn claim_read_timeouts_parse_with_units_and_refuse_nonsense() {
        use std::time::Duration;
        assert_eq!(parse_timeout("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_timeout("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_timeout("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_timeout("2.5"), Ok(Duration::from_millis(2500)));
        assert!(parse_timeout("0s").unwrap_err().contains("positive"));
        assert!(parse_timeout("10h").unwrap_err().contains("unit"));
        assert!(parse_timeout("s").is_err());
        assert!(parse_timeout("-1s").is_err());
        assert!(parse_timeout("1e400").is_err());
    }

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
    fn log_format_is_text_by_default_and_json_on_request() {
        assert_eq!(parse(&[]).log_format, LogFormat::Text);
        assert_eq!(parse(&["--log-format", "json"]).log_format, LogFormat::Json);
        assert_eq!(parse(&["--log-format=text"]).log_format, LogFormat::Text);
        let error = <Cli as clap::Parser>::try_parse_from([
            "plugin",
            "--node-name",
            "n",
            "--log-format",
            "xml",
        ])
        .err()
        .unwrap()
        .to_string();
        assert!(error.contains("--log-format"), "{error}");
        assert!(error.contains("json"), "the choices are listed: {error}");
    }

    #[test]
    fn log_format_env_values_parse_and_unknown_ones_fall_back_to_text() {
        use std::ffi::OsStr;
        assert_eq!(log_format_from(None), (LogFormat::Text, None));
        assert_eq!(log_format_from(Some(OsStr::new("json"))).0, LogFormat::Json);
        assert_eq!(
            log_format_from(Some(OsStr::new(" JSON "))).0,
            LogFormat::Json
        );
        let (format, problem) = log_format_from(Some(OsStr::new("yaml")));
        assert_eq!(format, LogFormat::Text);
        assert!(problem.unwrap().contains("LOG_FORMAT=\"yaml\""));
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(use_colour(true, None));
        assert!(
            !use_colour(false, None),
            "a pipe or file gets no escape codes"
        );
        assert!(!use_colour(true, Some(OsStr::new("1"))));
        // no-color.org: an empty NO_COLOR does not count.
        assert!(use_colour(true, Some(OsStr::new(""))));
    }

    #[test]
    fn rust_log_directives_or_the_default_level() {
        use tracing::level_filters::LevelFilter;
        let (filter, problem) = log_filter("", LevelFilter::WARN);
        assert!(problem.is_none());
        assert_eq!(filter.default_level(), Some(LevelFilter::WARN));
        let (filter, problem) = log_filter("debug,h2=off", LevelFilter::WARN);
        assert!(problem.is_none());
        assert!(filter.would_enable("dra_sdk::plugin", &tracing::Level::DEBUG));
        assert!(!filter.would_enable("h2::codec", &tracing::Level::ERROR));
        let (filter, problem) = log_filter("dra_sdk=loud", LevelFilter::INFO);
        assert_eq!(filter.default_level(), Some(LevelFilter::INFO));
        assert!(problem.unwrap().contains("RUST_LOG=\"dra_sdk=loud\""));
    }

    /// A writer into a shared buffer, to read what a layer wrote.
    #[derive(Clone, Default)]
    struct Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> tracing_subscriber::fmt::MakeWriter<'w> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'w self) -> Buffer {
            self.clone()
        }
    }

    /// Logs one warning inside a claim span shaped like the plugin's, with `format`.
    fn log_in_claim_span(format: LogFormat, colour: bool) -> String {
        use tracing_subscriber::layer::SubscriberExt as _;
        let buffer = Buffer::default();
        let subscriber =
            tracing_subscriber::registry().with(log_layer(format, colour, buffer.clone()));
        tracing::subscriber::with_default(subscriber, || {
            let _plugin = tracing::info_span!("plugin", driver = "gpu.example.com").entered();
            let _claim = tracing::info_span!(
                "claim",
                operation = "prepare",
                claim.uid = "uid-1",
                claim.name = "gpu"
            )
            .entered();
            tracing::warn!(device = "gpu-0", "prepare failed");
        });
        let bytes = buffer.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn json_lines_carry_timestamp_level_target_message_and_span_fields() {
        let output = log_in_claim_span(LogFormat::Json, true);
        assert!(!output.contains('\x1b'), "{output}");
        let lines: Vec<&str> = output.lines().collect();
        assert_eq!(lines.len(), 1, "{output}");
        let line: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert!(line["timestamp"].is_string(), "{line}");
        assert_eq!(line["level"], "WARN");
        assert_eq!(line["target"], "dra_sdk::cli::tests");
        assert_eq!(line["message"], "prepare failed");
        assert_eq!(line["device"], "gpu-0");
        assert_eq!(line["span"]["claim.uid"], "uid-1");
        assert_eq!(line["spans"][0]["driver"], "gpu.example.com");
        assert_eq!(line["spans"][1]["operation"], "prepare");
    }

    #[test]
    fn text_lines_are_plain_unless_coloured_and_name_the_span_fields() {
        let plain = log_in_claim_span(LogFormat::Text, false);
        assert!(!plain.contains('\x1b'), "{plain}");
        assert!(plain.contains("claim.uid=\"uid-1\""), "{plain}");
        assert!(plain.contains("prepare failed"), "{plain}");
        let coloured = log_in_claim_span(LogFormat::Text, true);
        assert!(
            coloured.contains('\x1b'),
            "a terminal still gets colour: {coloured}"
        );
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
