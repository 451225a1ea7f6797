//! The admission webhook's flags, as a clap argument group (feature `cli`).

use std::path::PathBuf;

use crate::cli::LogFormat;

/// The flags every driver's webhook binary shares: the certificate files, the port and the
/// log format.
/// Flatten with `#[command(flatten)]` next to the driver's own `--driver-name`, and hand to
/// [`AdmissionServer::args`](super::AdmissionServer::args).
///
/// ```
/// use clap::Parser;
/// use dra_sdk::webhook::WebhookArgs;
///
/// #[derive(Parser)]
/// struct Cli {
///     #[command(flatten)]
///     webhook: WebhookArgs,
/// }
///
/// let cli = Cli::parse_from(["my-webhook", "--port", "9443"]);
/// assert_eq!(cli.webhook.port, 9443);
/// assert_eq!(cli.webhook.tls_cert_file.to_str(), Some("/etc/dra-webhook/tls/tls.crt"));
/// ```
#[derive(Clone, Debug, clap::Args)]
pub struct WebhookArgs {
    /// PEM certificate chain to serve (`tls.crt` of a kubernetes.io/tls Secret), re-read
    /// when it changes.
    #[arg(
        long,
        env = "TLS_CERT_FILE",
        default_value = "/etc/dra-webhook/tls/tls.crt"
    )]
    pub tls_cert_file: PathBuf,

    /// PEM private key of the certificate (`tls.key`), re-read when it changes.
    #[arg(
        long,
        env = "TLS_KEY_FILE",
        default_value = "/etc/dra-webhook/tls/tls.key"
    )]
    pub tls_key_file: PathBuf,

    /// HTTPS port, on all interfaces (IPv4 and IPv6).
    #[arg(long, env = "WEBHOOK_PORT", default_value_t = super::AdmissionServer::DEFAULT_PORT)]
    pub port: u16,

    /// Log format on stderr: `text` or `json`, as the plugins'.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl WebhookArgs {
    /// Logs to stderr in `--log-format` at the levels `RUST_LOG` names (`info` when unset):
    /// the SDK's one logging set-up, as [`PluginArgs::init_logging`](crate::cli::PluginArgs::init_logging).
    pub fn init_logging(&self) {
        self.log_format
            .init_logging(tracing::level_filters::LevelFilter::INFO);
    }
}
