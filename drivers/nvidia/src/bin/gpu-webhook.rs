//! `gpu-webhook`: the NVIDIA driver's admission webhook. It refuses ResourceClaims,
//! ResourceClaimTemplates and DeviceClasses whose `resource.nvidia.com/v1beta1` opaque configs
//! would fail the plugin's decoding and validation (docs/webhook.md), with the same messages.
//! What needs the node (feature gates, the allocated devices) is still checked at prepare.

use anyhow::{Context, Result};
use clap::Parser;
use dra_driver_nvidia::config::registry;
use dra_driver_nvidia::devices::DRIVER_NAME;
use dra_sdk::webhook::{AdmissionServer, WebhookArgs};

/// Admission webhook for the NVIDIA GPU driver's opaque configs (HTTPS, POST /validate).
#[derive(Parser)]
#[command(name = "gpu-webhook", version, about)]
struct Cli {
    /// DRA driver name whose opaque configs are checked; others' are let through.
    #[arg(long, env = "DRIVER_NAME", default_value = DRIVER_NAME)]
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
            AdmissionServer::new(&cli.driver_name, registry())
                .args(&cli.webhook)
                .run_until_signal(),
        )
        .context("serving the admission webhook")
}
