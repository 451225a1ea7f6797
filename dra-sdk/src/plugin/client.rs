//! gRPC client connections over Unix sockets, for health probes and the kubelet simulator.

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

/// Opens a gRPC channel to a Unix socket. The URI is a placeholder: the connector ignores it
/// and dials the socket, and the client then sends `localhost`-like authority as the kubelet's
/// DRA client does.
pub(crate) async fn unix_channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
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
