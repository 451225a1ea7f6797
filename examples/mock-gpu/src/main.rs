//! `mock-gpu-kubelet-plugin`: the kubelet plugin of the mock GPU example driver.

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use dra_sdk::cli::PluginArgs;
use dra_sdk::plugin::KubeletPlugin;
use mock_gpu::{DEFAULT_DRIVER_NAME, MockGpuDriver};

/// DRA kubelet plugin for mock GPUs.
#[derive(Parser)]
#[command(name = "mock-gpu-kubelet-plugin", version, about)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    plugin: PluginArgs,
    #[command(flatten)]
    driver: DriverArgs,
}

#[derive(Args)]
struct DriverArgs {
    /// DRA driver name.
    #[arg(long, env = "DRIVER_NAME", default_value = DEFAULT_DRIVER_NAME)]
    driver_name: String,
    /// Number of mock GPUs on this node.
    #[arg(long, env = "NUM_DEVICES", default_value_t = 8)]
    num_devices: u32,
}

#[derive(Subcommand)]
enum Command {
    /// Run the driver end to end against an embedded in-process cluster.
    Demo {
        #[command(flatten)]
        driver: DriverArgs,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Demo { driver }) => {
            mock_gpu::demo::run(&driver.driver_name, driver.num_devices).await?;
            Ok(())
        }
        None => run(cli.plugin, cli.driver).await,
    }
}

async fn run(args: PluginArgs, driver_args: DriverArgs) -> Result<()> {
    let client = args
        .kube_client()
        .await
        .context("connecting to the API server")?;
    let driver = MockGpuDriver::new(
        &driver_args.driver_name,
        &args.node_name,
        driver_args.num_devices,
    );
    let resources = driver.resources();
    let plugin = KubeletPlugin::builder(driver, &driver_args.driver_name, &args.node_name, client)
        .args(&args)?
        .resources(resources)
        .start()
        .await
        .context("starting the plugin")?;
    tracing::info!(
        driver = %driver_args.driver_name,
        node = %args.node_name,
        devices = driver_args.num_devices,
        "mock GPU plugin running"
    );
    plugin.run_until_signal().await?;
    Ok(())
}
