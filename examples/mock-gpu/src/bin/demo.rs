//! `mock-gpu-demo`: the mock GPU driver end to end, against an embedded cluster by default or
//! a real one with `--kubeconfig`. See [`mock_gpu::demo`]. Exits non-zero when the demo did
//! not go as it must (see [`mock_gpu::demo::DemoFailed`]).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use mock_gpu::DEFAULT_DRIVER_NAME;
use mock_gpu::demo::{AllocationMode, DEFAULT_TIMEOUT, DemoOptions, Target};

/// Run the mock GPU driver end to end: publish, create claims and the pods using them, have
/// the claims allocated, prepare them through a simulated kubelet over the plugin's real
/// sockets, unprepare, clean up.
#[derive(Parser)]
#[command(name = "mock-gpu-demo", version, about)]
struct Cli {
    /// Run against the API server of this kubeconfig instead of an embedded one. The demo
    /// creates a DeviceClass, ResourceClaims, Pods and ResourceSlices there and deletes them
    /// again.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// With --kubeconfig: the node to publish the mock GPUs for [default: the first Ready node
    /// without NoSchedule/NoExecute taints].
    #[arg(long, requires = "kubeconfig")]
    node_name: Option<String>,
    /// With --kubeconfig: the namespace of the demo's ResourceClaims and Pods.
    #[arg(long, default_value = "default", requires = "kubeconfig")]
    namespace: String,
    /// With --kubeconfig: who allocates the claims. `scheduler`: the cluster's kube-scheduler,
    /// for pods that select the node; `demo`: the demo itself, with the SDK's allocator, for
    /// pods it binds to the node (for an API server without a scheduler). The embedded cluster
    /// always uses `demo`.
    #[arg(long, value_enum, default_value_t = AllocationMode::Scheduler, requires = "kubeconfig")]
    allocate: AllocationMode,
    /// Seconds each wait for the cluster may take: the scheduler's allocation, the pods' and
    /// the claims' deletion.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_TIMEOUT.as_secs())]
    timeout: u64,
    /// DRA driver name [default: gpu.example.com embedded; demo.gpu.example.com on a real
    /// cluster, so the demo never competes with a deployed driver].
    #[arg(long, env = "DRIVER_NAME")]
    driver_name: Option<String>,
    /// Number of mock GPUs (the demo's claims need 8).
    #[arg(long, env = "NUM_DEVICES", default_value_t = 8)]
    num_devices: u32,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            // The report is on stdout already; this says what went wrong. The demo's errors
            // name their causes in their own message: `{error:#}` would repeat them.
            eprintln!("mock-gpu-demo: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<()> {
    // The SDK's logging set-up (`LOG_FORMAT`, colour only on a terminal), warnings and errors
    // unless RUST_LOG says more: the demo's report is on stdout.
    dra_sdk::cli::LogFormat::from_env().init_logging(tracing::level_filters::LevelFilter::WARN);
    let cli = Cli::parse();
    let (target, default_driver) = match &cli.kubeconfig {
        None => (Target::Embedded, DEFAULT_DRIVER_NAME.to_owned()),
        Some(path) => {
            let target =
                Target::from_kubeconfig(path, cli.node_name, cli.namespace, cli.allocate).await?;
            (target, format!("demo.{DEFAULT_DRIVER_NAME}"))
        }
    };
    let mut options = DemoOptions::new(cli.driver_name.unwrap_or(default_driver), target);
    options.num_devices = cli.num_devices;
    options.timeout = Duration::from_secs(cli.timeout);
    mock_gpu::demo::run(options).await?;
    Ok(())
}
