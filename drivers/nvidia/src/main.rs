//! `gpu-kubelet-plugin`: the NVIDIA GPU DRA kubelet plugin.

use anyhow::{Context, Result};
use clap::Parser;
use dra_driver_nvidia::backend::mock::to_profile_yaml;
use dra_driver_nvidia::devices::DRIVER_NAME;
use dra_driver_nvidia::plugin::{
    Cli, DriverWait, NvidiaPlugin, backend, cdi_kind, wait_for_driver,
};
use dra_sdk::plugin::KubeletPlugin;

fn main() -> Result<()> {
    // A chrooted host command (modprobe) re-executes this binary to chroot without a
    // `chroot` program, which the distroless image lacks: that never returns.
    dra_driver_nvidia::host::chroot::exec_if_requested();
    // The MPS control daemon's readiness probe runs this binary in the daemon's container.
    dra_driver_nvidia::sharing::mps::deployment::probe_if_requested();
    let cli = Cli::parse();
    cli.plugin.init_logging();
    if cli.nvidia.print_profile {
        return print_profile(&cli);
    }
    if cli.nvidia.wait_for_driver {
        wait_for_driver(&cli.nvidia, DriverWait::default()).context("waiting for the driver")?;
        tracing::info!("the NVIDIA driver is installed");
        return Ok(());
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
    let mut nvidia = cli.nvidia.clone();
    // The bundled nvidia-cdi-hook is installed in this driver's folder of the kubelet's
    // plugins directory, which only the SDK's flags know.
    nvidia.kubelet_plugin_dir = Some(cli.plugin.kubelet_plugins_directory_path.join(DRIVER_NAME));
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
            // Replacing the upstream driver on a live node: its checkpoint's claims are taken
            // over (or the start refused, saying what to do) instead of being forgotten.
            .foreign_checkpoint(plugin.upstream_checkpoint())
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
