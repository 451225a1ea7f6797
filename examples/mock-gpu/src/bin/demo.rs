//! `mock-gpu-demo`: the mock GPU driver end to end, against an embedded cluster by default or
//! a real one with `--kubeconfig`. See [`mock_gpu::demo`].

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use mock_gpu::DEFAULT_DRIVER_NAME;
use mock_gpu::demo::{DemoOptions, Target};

/// Run the mock GPU driver end to end: publish, allocate, prepare through a simulated kubelet
/// over the plugin's real sockets, unprepare, clean up.
#[derive(Parser)]
#[command(name = "mock-gpu-demo", version, about)]
struct Cli {
    /// Run against the API server of this kubeconfig instead of an embedded one. The demo
    /// creates a DeviceClass, ResourceClaims and ResourceSlices there and deletes them again.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// With --kubeconfig: the node to publish the mock GPUs for [default: the first node].
    #[arg(long, requires = "kubeconfig")]
    node_name: Option<String>,
    /// With --kubeconfig: the namespace of the demo's ResourceClaims.
    #[arg(long, default_value = "default", requires = "kubeconfig")]
    namespace: String,
    /// DRA driver name [default: gpu.example.com embedded; demo.gpu.example.com on a real
    /// cluster, so the demo never competes with a deployed driver].
    #[arg(long, env = "DRIVER_NAME")]
    driver_name: Option<String>,
    /// Number of mock GPUs.
    #[arg(long, env = "NUM_DEVICES", default_value_t = 8)]
    num_devices: u32,
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let (target, default_driver) = match &cli.kubeconfig {
        None => (Target::Embedded, DEFAULT_DRIVER_NAME.to_owned()),
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .with_context(|| format!("loading {}", path.display()))?;
            let target = Target::Cluster {
                client: kube::Client::try_from(config).context("creating the API client")?,
                node_name: cli.node_name,
                namespace: cli.namespace,
            };
            (target, format!("demo.{DEFAULT_DRIVER_NAME}"))
        }
    };
    mock_gpu::demo::run(DemoOptions {
        driver_name: cli.driver_name.unwrap_or(default_driver),
        num_devices: cli.num_devices,
        target,
    })
    .await?;
    Ok(())
}
