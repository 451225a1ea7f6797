//! `gpu-kubelet-plugin`: the NVIDIA GPU DRA kubelet plugin.

use anyhow::{Context, Result};
use clap::Parser;
use dra_driver_nvidia::backend::mock::to_profile_yaml;
use dra_driver_nvidia::devices::DRIVER_NAME;
use dra_driver_nvidia::plugin::{Cli, NvidiaPlugin, backend, cdi_kind};
use dra_sdk::cli::PluginArgs;
use dra_sdk::plugin::KubeletPlugin;

fn main() -> Result<()> {
    PluginArgs::init_logging();
    let cli = Cli::parse();
    if cli.nvidia.print_profile {
        return print_profile(&cli);
    }
    // Not `#[tokio::main]`: its runtime starts a worker per CPU, idle threads and memory on
    // a large GPU node (`--worker-threads`).
    cli.plugin
        .runtime()
        .context("starting the async runtime")?
        .block_on(run(cli))
}

async fn run(cli: Cli) -> Result<()> {
    // Discovery reads sysfs and NVML: blocking work, done before the runtime serves anything.
    // Devices prepared before a restart are reserved again by the driver's start-up
    // reconcile, which the SDK runs with the checkpoint's completed claims before registering.
    let nvidia = cli.nvidia.clone();
    let plugin = tokio::task::spawn_blocking(move || NvidiaPlugin::from_args(&nvidia))
        .await
        .context("discovery task")?
        .context("setting up the NVIDIA driver")?;
    let node_name = cli.plugin.node_name.clone();
    let resources = plugin.resources(&node_name);
    tracing::info!(
        backend = %plugin.backend.name(),
        gpus = plugin.discovery.gpus.len(),
        migs = plugin.discovery.migs.len(),
        mig_partitions = plugin.discovery.partitions.len(),
        vfio = plugin.discovery.vfio.len(),
        "devices discovered"
    );

    let client = cli
        .plugin
        .kube_client()
        .await
        .context("connecting to the API server")?;
    let kubelet_plugin =
        KubeletPlugin::builder(plugin.driver.clone(), DRIVER_NAME, &node_name, client)
            .args(&cli.plugin)?
            .cdi_kind(cdi_kind().context("the CDI kind")?)
            .metrics_path(&cli.nvidia.metrics_path)
            // Dynamic MIG: no other plugin instance on the node (a rolling update) may create
            // an instance while this one's start-up clean-up looks for orphans.
            .serialize_operations(plugin.driver.serializes_operations())
            .resources(resources)
            .start()
            .await
            .context("starting the plugin")?;
    tracing::info!(driver = DRIVER_NAME, node = %node_name, "gpu-kubelet-plugin running");
    kubelet_plugin.run_until_signal().await?;
    // The mock host directory (if temporary) lives until here.
    drop(plugin);
    Ok(())
}

/// `--print-profile`: the hardware as a mock profile on stdout.
fn print_profile(cli: &Cli) -> Result<()> {
    let backend = backend(&cli.nvidia).context("opening the GPU backend")?;
    let inventory = backend.inventory().context("reading the hardware")?;
    let description = format!(
        "read from {} on node {} by gpu-kubelet-plugin --print-profile",
        backend.name(),
        cli.plugin.node_name
    );
    print!(
        "{}",
        to_profile_yaml(&cli.plugin.node_name, &description, &inventory)
    );
    Ok(())
}
