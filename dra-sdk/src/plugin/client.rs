//! gRPC client connections over Unix sockets, for health probes and the kubelet simulator.

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

/// Opens a gRPC channel to a Unix socket. The URI is a placeholder: the connector ignores it
/// and dials the socket, and the client then sends `localhost`-like authority as the kubelet's
/// DRA client does.
///
/// ```no_run
/// use dra_sdk::advanced::{proto::pluginregistration as reg, unix_channel};
///
/// # async fn probe() -> Result<(), Box<dyn std::error::Error>> {
/// let socket = std::path::Path::new("/var/lib/kubelet/plugins_registry/gpu.example.com-reg.sock");
/// let mut client = reg::registration_client::RegistrationClient::new(unix_channel(socket).await?);
/// let info = client.get_info(reg::InfoRequest {}).await?.into_inner();
/// println!("{} serves {:?}", info.name, info.supported_versions);
/// # Ok(()) }
/// ```
pub async fn unix_channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
}
