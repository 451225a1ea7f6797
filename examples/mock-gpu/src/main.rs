//! `mock-gpu-kubelet-plugin`: the kubelet plugin of the mock GPU example driver.

use anyhow::{Context, Result};
use clap::{Args, Parser};
use dra_sdk::cli::PluginArgs;
use dra_sdk::plugin::KubeletPlugin;
use mock_gpu::{DEFAULT_DRIVER_NAME, MockGpuDriver};

/// DRA kubelet plugin for mock GPUs.
#[derive(Parser)]
#[command(
    name = "mock-gpu-kubelet-plugin",
    version,
    about,
    after_help = "Subcommand:\n  demo    Run the driver end to end against an embedded in-process cluster\n          (`mock-gpu-kubelet-plugin demo --help`)"
)]
struct Cli {
    #[command(flatten)]
    plugin: PluginArgs,
    #[command(flatten)]
    driver: DriverArgs,
}

/// Run the driver end to end against an embedded in-process cluster.
#[derive(Parser)]
#[command(name = "mock-gpu-kubelet-plugin demo")]
struct DemoCli {
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

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    // The plugin's own flags include a required --node-name that the demo does not need, so
    // the demo is parsed as a command of its own.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|arg| arg == "demo") {
        let demo = DemoCli::parse_from(&args[1..]);
        mock_gpu::demo::run(&demo.driver.driver_name, demo.driver.num_devices).await?;
        return Ok(());
    }
    let cli = Cli::parse_from(args);
    run(cli.plugin, cli.driver).await
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
