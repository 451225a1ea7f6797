//! `mock-gpu-kubelet-plugin`: the kubelet plugin of the mock GPU example driver.

use anyhow::{Context, Result};
use clap::{Args, Parser};
use dra_sdk::cli::PluginArgs;
use dra_sdk::plugin::KubeletPlugin;
use mock_gpu::{DEFAULT_DRIVER_NAME, MAX_PARTITIONS, MockGpuDriver, PublishOptions};

/// DRA kubelet plugin for mock GPUs.
#[derive(Parser)]
#[command(
    name = "mock-gpu-kubelet-plugin",
    version,
    about,
    after_help = "The end-to-end demo is the `mock-gpu-demo` binary:\n  cargo run --release -p mock-gpu --bin mock-gpu-demo"
)]
struct Cli {
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
    /// Report each prepared GPU's status in its claim (`status.devices`, KEP-4817). Needs
    /// `patch` on resourceclaims/status and `associated-node:patch` on resourceclaims/driver.
    #[arg(long, env = "DEVICE_STATUS")]
    device_status: bool,
    /// Mount a device metadata file into the containers (KEP-5304, Kubernetes 1.36 alpha).
    #[arg(long, env = "DEVICE_METADATA")]
    device_metadata: bool,
    /// Partitionable mode (needs the DRAPartitionableDevices feature in the cluster): cut every
    /// GPU into this many equal partitions `gpu-<i>-partition-<j>` that share the counter set
    /// `gpu-<i>-counters` with the whole GPU `gpu-<i>`, so a GPU and its partitions are never
    /// allocated together. 0 publishes whole GPUs only.
    #[arg(long, env = "GPU_PARTITIONS", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=i64::from(MAX_PARTITIONS)))]
    gpu_partitions: u32,
    /// Consumable-capacity mode (needs the DRAConsumableCapacity feature in the cluster): whole
    /// GPUs allow multiple allocations; a claim asking for part of `memory` (1Gi steps) or
    /// `compute` (steps of 1) shares the GPU with others, a claim asking for none gets all of it.
    #[arg(long, env = "GPU_ALLOW_MULTIPLE_ALLOCATIONS")]
    gpu_allow_multiple_allocations: bool,
}

fn main() -> Result<()> {
    // The demo was once a subcommand of this binary; point there instead of failing with an
    // unexpected-argument error.
    if std::env::args_os().nth(1).is_some_and(|arg| arg == "demo") {
        eprintln!(
            "the demo is its own binary now: cargo run --release -p mock-gpu --bin mock-gpu-demo"
        );
        std::process::exit(2);
    }
    let cli = Cli::parse();
    cli.plugin.init_logging();
    // Not `#[tokio::main]`, whose runtime starts a worker per CPU: `--worker-threads`.
    cli.plugin
        .runtime()
        .context("starting the async runtime")?
        .block_on(run(cli.plugin, cli.driver))
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
    )
    .with_device_status(driver_args.device_status)
    .with_device_metadata(driver_args.device_metadata)
    .with_options(PublishOptions {
        partitions: driver_args.gpu_partitions,
        allow_multiple_allocations: driver_args.gpu_allow_multiple_allocations,
    })?;
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
        partitions = driver_args.gpu_partitions,
        allow_multiple_allocations = driver_args.gpu_allow_multiple_allocations,
        "mock GPU plugin running"
    );
    plugin.run_until_signal().await?;
    Ok(())
}
