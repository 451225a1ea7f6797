//! Command-line flags every kubelet plugin needs, with the upstream drivers' names and
//! environment variables, as a clap argument group to flatten into a driver's own CLI.
//!
//! ```
//! use clap::Parser;
//! use dra_sdk::cli::PluginArgs;
//!
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     plugin: PluginArgs,
//!     /// A driver-specific flag.
//!     #[arg(long, default_value_t = 8)]
//!     num_devices: u32,
//! }
//!
//! let cli = Cli::parse_from(["my-plugin", "--node-name", "node-a", "--http-endpoint", ":8080"]);
//! assert_eq!(cli.plugin.node_name, "node-a");
//! assert_eq!(cli.plugin.http_endpoint().unwrap().unwrap().port(), 8080);
//! ```

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;

use crate::{DEFAULT_CDI_ROOT, DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRAR_DIR};

/// The SDK's flags. Flatten with `#[command(flatten)]`.
#[derive(Clone, Debug, clap::Args)]
pub struct PluginArgs {
    /// Name of the node this plugin runs on (from the downward API in a DaemonSet).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,

    /// Kubeconfig file; without it the in-cluster configuration is used.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Directory the kubelet watches for plugin registration sockets.
    #[arg(long, env = "KUBELET_REGISTRAR_DIRECTORY_PATH", default_value = DEFAULT_REGISTRAR_DIR)]
    pub kubelet_registrar_directory_path: PathBuf,

    /// Directory for the plugin's DRA socket and state (`<dir>/<driver name>/`).
    #[arg(long, env = "KUBELET_PLUGINS_DIRECTORY_PATH", default_value = DEFAULT_PLUGINS_DIR)]
    pub kubelet_plugins_directory_path: PathBuf,

    /// Directory the container runtime reads CDI specs from.
    #[arg(long, env = "CDI_ROOT", default_value = DEFAULT_CDI_ROOT)]
    pub cdi_root: PathBuf,

    /// TCP port of the gRPC health service for liveness probes: negative disables it, 0 picks
    /// a free port.
    #[arg(long, env = "HEALTHCHECK_PORT", default_value_t = -1, allow_negative_numbers = true)]
    pub healthcheck_port: i32,

    /// Address of the HTTP endpoint with /metrics and /healthz, e.g. `:8080` or
    /// `127.0.0.1:8080`; empty disables it.
    #[arg(long, env = "HTTP_ENDPOINT", default_value = "")]
    pub http_endpoint: String,

    /// UID of the plugin's pod (downward API). Enables rolling updates: two instances of the
    /// plugin run side by side with UID-specific socket names. Needs kubelet 1.33+.
    #[arg(long, env = "POD_UID")]
    pub pod_uid: Option<String>,
}

/// A flag value that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("--{flag}: {message}")]
pub struct ArgsError {
    flag: &'static str,
    message: String,
}

impl PluginArgs {
    /// The HTTP endpoint address; `None` when disabled. `:8080` means all interfaces.
    pub fn http_endpoint(&self) -> Result<Option<SocketAddr>, ArgsError> {
        parse_endpoint(&self.http_endpoint).map_err(|message| ArgsError {
            flag: "http-endpoint",
            message,
        })
    }

    /// The gRPC health port; `None` when disabled.
    pub fn healthcheck_port(&self) -> Result<Option<u16>, ArgsError> {
        if self.healthcheck_port < 0 {
            return Ok(None);
        }
        u16::try_from(self.healthcheck_port)
            .map(Some)
            .map_err(|_| ArgsError {
                flag: "healthcheck-port",
                message: format!("{} is not a TCP port", self.healthcheck_port),
            })
    }

    /// A Kubernetes client from `--kubeconfig`, or the in-cluster configuration.
    pub async fn kube_client(&self) -> Result<kube::Client, kube::Error> {
        let config = match &self.kubeconfig {
            Some(path) => {
                let kubeconfig = kube::config::Kubeconfig::read_from(path)
                    .map_err(kube::Error::InferKubeconfig)?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                    .await
                    .map_err(kube::Error::InferKubeconfig)?
            }
            None => kube::Config::infer()
                .await
                .map_err(kube::Error::InferConfig)?,
        };
        kube::Client::try_from(config)
    }
}

fn parse_endpoint(value: &str) -> Result<Option<SocketAddr>, String> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(None);
    }
    if let Some(port) = value.strip_prefix(':') {
        let port: u16 = port
            .parse()
            .map_err(|_| format!("{value:?} has no valid port"))?;
        return Ok(Some(SocketAddr::new(
            IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            port,
        )));
    }
    value
        .parse()
        .map(Some)
        .map_err(|_| format!("{value:?} is not host:port (e.g. 127.0.0.1:8080 or :8080)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_like_the_go_drivers() {
        assert_eq!(parse_endpoint("").unwrap(), None);
        assert_eq!(parse_endpoint(":8080").unwrap().unwrap().port(), 8080);
        assert_eq!(
            parse_endpoint("127.0.0.1:9000")
                .unwrap()
                .unwrap()
                .to_string(),
            "127.0.0.1:9000"
        );
        assert!(parse_endpoint("nonsense").unwrap_err().contains("nonsense"));
        assert!(parse_endpoint(":99999").is_err());
    }
}
