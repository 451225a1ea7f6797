//! `gpu-demo`: the NVIDIA driver without a GPU, on a mock machine in an embedded cluster or,
//! with `--kubeconfig`, on a real API server whose scheduler allocates. See
//! [`dra_driver_nvidia::demo`]. Exits 1 when the demo did not go as it must.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use dra_driver_nvidia::demo::{
    AllocationMode, DEFAULT_PROFILE, DemoError, RunOptions, Target, run_on,
};

/// Run the NVIDIA GPU DRA plugin on a mock machine: DeviceClasses, a MIG slice from a
/// ResourceClaimTemplate, one GPU shared by two containers, CEL selectors on productName,
/// memory and MIG profile, GpuConfig and MigDeviceConfig, a config of the wrong type failing
/// alone; prints what each container would get, then cleans up. In an embedded cluster (fake
/// API server, simulated kubelet, the SDK's allocator) by default; with --kubeconfig on a real
/// API server, whose scheduler allocates for real pods.
#[derive(Parser)]
#[command(name = "gpu-demo", version, about)]
struct Cli {
    /// The mock machine: dgx-a100, dgx-h100, mixed, workstation, or a profile file. Steps the
    /// machine cannot spare devices for are left out, and said so (all of them need three full
    /// GPUs, one with at least 40Gi, and MIG devices: dgx-a100 has them).
    #[arg(long, env = "MOCK_PROFILE", default_value = DEFAULT_PROFILE)]
    mock_profile: String,
    /// Run against the API server of this kubeconfig: the demo publishes the mock machine for
    /// --node-name under gpu.nvidia.com (no gpu-kubelet-plugin may serve that node), creates
    /// the DeviceClasses unless they exist, claims, a template and pods there, and deletes them
    /// again.
    #[arg(long, requires = "node_name")]
    kubeconfig: Option<PathBuf>,
    /// With --kubeconfig: the node to publish the mock machine for (its
    /// `kubernetes.io/hostname` label must be its name).
    #[arg(long, requires = "kubeconfig")]
    node_name: Option<String>,
    /// With --kubeconfig: the namespace of the demo's claims, template and pods.
    #[arg(long, default_value = "default", requires = "kubeconfig")]
    namespace: String,
    /// With --kubeconfig: seconds each wait for the cluster may take: each claim's allocation
    /// by the scheduler, the pods' and the claims' deletion.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 60,
        requires = "kubeconfig"
    )]
    timeout: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    // Errors only by default: on a mock machine the driver rightly warns that it finds no
    // driver libraries, which is noise in a demo (RUST_LOG=warn shows it).
    dra_sdk::cli::LogFormat::from_env().init_logging(tracing::level_filters::LevelFilter::ERROR);
    let cli = Cli::parse();
    let target = match target(&cli).await {
        Ok(target) => target,
        Err(error) => {
            eprintln!("gpu-demo: {error}");
            return ExitCode::FAILURE;
        }
    };
    let mut options = RunOptions::new(target);
    options.timeout = Duration::from_secs(cli.timeout);
    match run_on(&cli.mock_profile, options).await {
        Ok(report) if report.problems().is_empty() => ExitCode::SUCCESS,
        Ok(report) => {
            eprintln!(
                "gpu-demo: the demo failed: {}",
                report.problems().join("; ")
            );
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("gpu-demo: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The embedded cluster, or the API server of `--kubeconfig`, whose scheduler allocates.
async fn target(cli: &Cli) -> Result<Target, DemoError> {
    let (Some(path), Some(node)) = (&cli.kubeconfig, &cli.node_name) else {
        return Ok(Target::Embedded);
    };
    Target::from_kubeconfig(
        path,
        Some(node.clone()),
        cli.namespace.clone(),
        AllocationMode::Scheduler,
    )
    .await
}
