//! `mock-gpu-webhook`: the admission webhook of the mock GPU example driver. It refuses
//! ResourceClaims, ResourceClaimTemplates and DeviceClasses whose opaque configs for the
//! driver would fail prepare (docs/webhook.md), with the plugin's own decoding and messages.

use anyhow::{Context, Result};
use clap::Parser;
use dra_sdk::webhook::{AdmissionServer, WebhookArgs};
use mock_gpu::{DEFAULT_DRIVER_NAME, config_registry};

/// Admission webhook for the mock GPU driver's opaque configs (HTTPS, POST /validate).
#[derive(Parser)]
#[command(name = "mock-gpu-webhook", version, about)]
struct Cli {
    /// DRA driver name whose opaque configs are checked; others' are let through.
    #[arg(long, env = "DRIVER_NAME", default_value = DEFAULT_DRIVER_NAME)]
    driver_name: String,
    #[command(flatten)]
    webhook: WebhookArgs,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    cli.webhook.init_logging();
    // One thread: a webhook answers a few requests a second, each a few microseconds of
    // decoding; a worker per CPU would only add idle threads.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(
            AdmissionServer::new(&cli.driver_name, config_registry())
                .args(&cli.webhook)
                .run_until_signal(),
        )
        .context("serving the admission webhook")
}
