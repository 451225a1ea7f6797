//! `gpu-demo`: the NVIDIA driver without a GPU, on a mock machine in an embedded cluster. See
//! [`dra_driver_nvidia::demo`]. Exits 1 when the demo did not go as it must.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use dra_driver_nvidia::demo::{DEFAULT_PROFILE, DemoError, run};

/// Run the NVIDIA GPU DRA plugin on a mock machine in an embedded cluster (fake API server,
/// simulated kubelet, the SDK's allocator): DeviceClasses, a MIG slice from a
/// ResourceClaimTemplate, one GPU shared by two containers, CEL selectors on productName,
/// memory and MIG profile, GpuConfig and MigDeviceConfig, a config of the wrong type failing
/// alone; prints what each container would get, then cleans up.
#[derive(Parser)]
#[command(name = "gpu-demo", version, about)]
struct Cli {
    /// The mock machine: dgx-a100, dgx-h100, mixed, workstation, or a profile file. The demo's
    /// pods need three full GPUs, one with at least 40Gi (dgx-a100 and dgx-h100 have them).
    #[arg(long, env = "MOCK_PROFILE", default_value = DEFAULT_PROFILE)]
    mock_profile: String,
    /// Run against a real API server: not supported yet (the demo exits with an error).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    // Errors only by default: on a mock machine the driver rightly warns that it finds no
    // driver libraries, which is noise in a demo (RUST_LOG=warn shows it).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let outcome = match cli.kubeconfig {
        Some(_) => Err(DemoError::RealClusterUnsupported),
        None => run(&cli.mock_profile, true).await,
    };
    match outcome {
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
