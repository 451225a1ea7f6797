//! The kubelet plugin registration service.
//!
//! The kubelet discovers a plugin through its registration socket, asks it
//! `GetInfo` (type, driver name, DRA endpoint, supported services) and then
//! tells it the outcome with `NotifyRegistrationStatus`. The outcome is
//! published as a [`RegistrationStatus`] on a watch channel so that the rest
//! of the plugin (health reporting, readiness) can follow it.

use std::future::Future;
use std::path::Path;

use futures::TryStreamExt;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::plugin::authority::AuthorityRewriteStream;
use crate::proto::pluginregistration::registration_server::{Registration, RegistrationServer};
use crate::proto::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus as RegistrationStatusMessage,
    RegistrationStatusResponse,
};

/// `PluginInfo.type` of a DRA plugin.
pub(crate) const DRA_PLUGIN_TYPE: &str = "DRAPlugin";

/// DRA node services served by the plugin, in the order the kubelet should
/// prefer them: kubelets 1.34+ take the first entry they know.
pub(crate) const DRA_SERVICE_VERSIONS: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];

/// The resource-health streaming services, both served from the same device states and
/// advertised only for drivers that report health. A 1.37 kubelet takes v1 when it is listed
/// (and v1alpha1 when only that is); kubelets 1.34-1.36 know only v1alpha1 and skip the v1
/// entry. (Kubelet 1.36 opens the v1alpha1 stream whether it is listed or not; the plugin
/// answers those with a quiet stream.)
pub(crate) const HEALTH_SERVICE_VERSIONS: [&str; 2] =
    ["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"];

/// What the kubelet last said about this plugin's registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistrationStatus {
    /// The kubelet has not reported an outcome yet.
    Pending,
    /// The kubelet accepted the plugin.
    Registered,
    /// The kubelet rejected the plugin; it retries from scratch later.
    Rejected {
        /// The kubelet's reason.
        error: String,
    },
}

/// The `pluginregistration.Registration` gRPC service.
pub(crate) struct RegistrationService {
    info: PluginInfo,
    status: watch::Sender<RegistrationStatus>,
}

impl RegistrationService {
    /// A service answering `GetInfo` with `info`, and a receiver that follows
    /// the kubelet's verdicts (starting at [`RegistrationStatus::Pending`]).
    pub(crate) fn new(info: PluginInfo) -> (Self, watch::Receiver<RegistrationStatus>) {
        let (status, receiver) = watch::channel(RegistrationStatus::Pending);
        (Self { info, status }, receiver)
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(
        &self,
        _request: Request<InfoRequest>,
    ) -> Result<Response<PluginInfo>, Status> {
        tracing::debug!(driver = %self.info.name, "kubelet asked for plugin info");
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatusMessage>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let verdict = request.into_inner();
        let driver = &self.info.name;
        if verdict.plugin_registered {
            tracing::info!(%driver, "kubelet registered the plugin");
            self.status.send_replace(RegistrationStatus::Registered);
            Ok(Response::new(RegistrationStatusResponse {}))
        } else {
            tracing::warn!(%driver, error = %verdict.error, "kubelet rejected the plugin registration");
            self.status.send_replace(RegistrationStatus::Rejected {
                error: verdict.error.clone(),
            });
            // Like the Go library: answering an error makes the failure
            // visible in the kubelet's log next to its own message.
            Err(Status::unknown(format!(
                "plugin registration failed: {}",
                verdict.error
            )))
        }
    }
}

/// Serves the registration service on `listener` until `shutdown` completes,
/// then drains open connections.
///
/// Every accepted connection is wrapped in an [`AuthorityRewriteStream`]:
/// the kubelet sends the percent-encoded socket path as HTTP/2 `:authority`,
/// which h2 would otherwise reject.
pub(crate) async fn serve_registration(
    listener: tokio::net::UnixListener,
    service: RegistrationService,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let span = tracing::info_span!("registration", driver = %service.info.name);
    let incoming = UnixListenerStream::new(listener).map_ok(AuthorityRewriteStream::new);
    tonic::transport::Server::builder()
        .add_service(RegistrationServer::new(service))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .instrument(span)
        .await
}

/// The `PluginInfo` a DRA plugin reports: type `DRAPlugin`, the driver name,
/// the DRA socket as endpoint and the services it serves.
///
/// `endpoint` is converted lossily if it is not UTF-8; paths from
/// [`SocketPaths`](crate::plugin::SocketPaths) always are.
pub(crate) fn plugin_info(driver_name: &str, endpoint: &Path, with_health: bool) -> PluginInfo {
    let mut supported_versions: Vec<String> = DRA_SERVICE_VERSIONS
        .iter()
        .map(|v| (*v).to_owned())
        .collect();
    if with_health {
        supported_versions.extend(HEALTH_SERVICE_VERSIONS.iter().map(|v| (*v).to_owned()));
    }
    PluginInfo {
        r#type: DRA_PLUGIN_TYPE.to_owned(),
        name: driver_name.to_owned(),
        endpoint: endpoint.to_string_lossy().into_owned(),
        supported_versions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::authority::test_support::*;
    use crate::plugin::socket::bind_private;
    use crate::proto::pluginregistration::registration_client::RegistrationClient;
    use prost::Message;
    use std::path::PathBuf;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::oneshot;
    use tokio::task::JoinHandle;

    const FIXTURE: &[u8] = include_bytes!("../../tests/fixtures/kubelet-registration-v1.36.2.h2");
    const DRIVER: &str = "gpu.example.com";
    const ENDPOINT: &str = "/var/lib/kubelet/plugins/gpu.example.com/dra.sock";

    struct TestServer {
        _dir: tempfile::TempDir,
        path: PathBuf,
        status: watch::Receiver<RegistrationStatus>,
        stop: Option<oneshot::Sender<()>>,
        task: JoinHandle<Result<(), tonic::transport::Error>>,
    }

    impl TestServer {
        /// Starts the registration server, with the `:authority` rewriter
        /// (`rewrite`) or as a stock tonic server for the negative control.
        fn start(rewrite: bool) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(format!("{DRIVER}-reg.sock"));
            let listener = bind_private(&path).unwrap();
            let (service, status) =
                RegistrationService::new(plugin_info(DRIVER, Path::new(ENDPOINT), true));
            let (stop, stopped) = oneshot::channel::<()>();
            let shutdown = async move {
                let _ = stopped.await;
            };
            let task = if rewrite {
                tokio::spawn(serve_registration(listener, service, shutdown))
            } else {
                tokio::spawn(
                    tonic::transport::Server::builder()
                        .add_service(RegistrationServer::new(service))
                        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown),
                )
            };
            TestServer {
                _dir: dir,
                path,
                status,
                stop: Some(stop),
                task,
            }
        }

        async fn stop(mut self) {
            if let Some(stop) = self.stop.take() {
                let _ = stop.send(());
            }
            tokio::time::timeout(Duration::from_secs(5), self.task)
                .await
                .expect("server did not shut down")
                .unwrap()
                .unwrap();
        }
    }

    /// Writes the kubelet's recorded bytes and collects the server's frames
    /// until streams 1 and 3 have ended (trailers or RST_STREAM), the server
    /// closes, or a second passes.
    async fn replay_kubelet(path: &Path) -> Vec<Frame> {
        let mut stream = tokio::net::UnixStream::connect(path).await.unwrap();
        stream.write_all(FIXTURE).await.unwrap();
        let mut received = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        loop {
            let (frames, _) = parse_frames(&received);
            let ended = |id: u32| {
                frames.iter().any(|f| {
                    f.stream_id == id
                        && (f.kind == RST_STREAM
                            || (f.kind == HEADERS && f.flags & END_STREAM != 0))
                })
            };
            if ended(1) && ended(3) {
                return frames;
            }
            let mut buf = [0u8; 4096];
            match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
                Ok(Ok(0)) | Err(_) => return frames,
                Ok(Ok(n)) => received.extend_from_slice(&buf[..n]),
                Ok(Err(error)) => panic!("reading from the server failed: {error}"),
            }
        }
    }

    fn expected_info() -> PluginInfo {
        PluginInfo {
            r#type: "DRAPlugin".into(),
            name: DRIVER.into(),
            endpoint: ENDPOINT.into(),
            supported_versions: vec![
                "v1.DRAPlugin".into(),
                "v1beta1.DRAPlugin".into(),
                // v1 first: a 1.37 kubelet takes it; 1.34-1.36 skip it and take v1alpha1.
                "v1.DRAResourceHealth".into(),
                "v1alpha1.DRAResourceHealth".into(),
            ],
        }
    }

    /// Decodes one gRPC length-prefixed message.
    fn grpc_message<M: Message + Default>(data: &[u8]) -> M {
        assert_eq!(data[0], 0, "compressed gRPC message");
        let len = u32::from_be_bytes(data[1..5].try_into().unwrap()) as usize;
        assert_eq!(data.len(), 5 + len, "one message per DATA frame");
        M::decode(&data[5..]).unwrap()
    }

    #[tokio::test]
    async fn kubelet_recording_registers_through_the_rewriter() {
        let server = TestServer::start(true);
        let frames = replay_kubelet(&server.path).await;
        assert!(
            frames.iter().all(|f| f.kind != RST_STREAM),
            "server reset a stream: {frames:?}"
        );
        let conversation = collect(&frames);
        let headers = decode_blocks(&conversation.blocks);
        for stream_id in [1, 3] {
            let trailers = conversation
                .blocks
                .iter()
                .zip(&headers)
                .find(|(b, _)| b.stream_id == stream_id && b.flags & END_STREAM != 0)
                .map(|(_, h)| h)
                .unwrap_or_else(|| panic!("no trailers on stream {stream_id}: {frames:?}"));
            assert_eq!(
                header(trailers, "grpc-status"),
                Some("0"),
                "stream {stream_id}: {trailers:?}"
            );
        }
        let data: Vec<&Frame> = conversation
            .others
            .iter()
            .filter(|f| f.kind == DATA && f.stream_id == 1)
            .collect();
        assert_eq!(data.len(), 1, "{frames:?}");
        assert_eq!(
            grpc_message::<PluginInfo>(&data[0].payload),
            expected_info()
        );
        // The recording's NotifyRegistrationStatus says plugin_registered=true.
        assert_eq!(*server.status.borrow(), RegistrationStatus::Registered);
        server.stop().await;
    }

    #[tokio::test]
    async fn kubelet_recording_is_reset_by_a_stock_tonic_server() {
        // Negative control: proves the replay detects the :authority trap.
        let server = TestServer::start(false);
        let frames = replay_kubelet(&server.path).await;
        for stream_id in [1, 3] {
            let reset = frames
                .iter()
                .find(|f| f.kind == RST_STREAM && f.stream_id == stream_id)
                .unwrap_or_else(|| panic!("stream {stream_id} was not reset: {frames:?}"));
            assert_eq!(reset.payload, 1u32.to_be_bytes(), "not PROTOCOL_ERROR");
        }
        assert_eq!(*server.status.borrow(), RegistrationStatus::Pending);
        server.stop().await;
    }

    #[tokio::test]
    async fn tonic_client_over_unix_socket_works_with_the_rewriter() {
        let mut server = TestServer::start(true);
        let channel =
            tonic::transport::Endpoint::from_shared(format!("unix://{}", server.path.display()))
                .unwrap()
                .connect()
                .await
                .unwrap();
        let mut client = RegistrationClient::new(channel);

        let info = client.get_info(InfoRequest {}).await.unwrap().into_inner();
        assert_eq!(info, expected_info());

        client
            .notify_registration_status(RegistrationStatusMessage {
                plugin_registered: true,
                error: String::new(),
            })
            .await
            .unwrap();
        assert_eq!(
            *server.status.borrow_and_update(),
            RegistrationStatus::Registered
        );

        let rejected = client
            .notify_registration_status(RegistrationStatusMessage {
                plugin_registered: false,
                error: "driver name already registered".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(rejected.code(), tonic::Code::Unknown);
        assert!(
            rejected
                .message()
                .contains("driver name already registered")
        );
        assert!(server.status.has_changed().unwrap());
        assert_eq!(
            *server.status.borrow(),
            RegistrationStatus::Rejected {
                error: "driver name already registered".into()
            }
        );

        // Several calls on one connection keep the HPACK state in step.
        for _ in 0..3 {
            assert_eq!(
                client.get_info(InfoRequest {}).await.unwrap().into_inner(),
                expected_info()
            );
        }
        drop(client);
        server.stop().await;
    }

    #[test]
    fn plugin_info_lists_health_only_when_served() {
        let info = plugin_info(DRIVER, Path::new(ENDPOINT), false);
        assert_eq!(info.r#type, "DRAPlugin");
        assert_eq!(info.name, DRIVER);
        assert_eq!(info.endpoint, ENDPOINT);
        assert_eq!(
            info.supported_versions,
            ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
        );
        assert_eq!(
            plugin_info(DRIVER, Path::new(ENDPOINT), true),
            expected_info()
        );
    }

    /// Runs `tests/grpcio_registration_client.py` (Python grpcio, which sends
    /// the percent-encoded socket path as `:authority` like the kubelet).
    /// Returns `None` when grpcio is not installed.
    async fn run_grpcio_client(path: &Path) -> Option<std::process::Output> {
        let path = path.to_path_buf();
        let run = tokio::task::spawn_blocking(move || {
            use std::process::Command;
            match Command::new("python3").args(["-c", "import grpc"]).output() {
                Ok(output) if output.status.success() => {}
                Ok(output) => {
                    eprintln!(
                        "skipping grpcio interop check: `import grpc` failed: {}",
                        String::from_utf8_lossy(&output.stderr).trim()
                    );
                    return None;
                }
                Err(error) => {
                    eprintln!("skipping grpcio interop check: cannot run python3: {error}");
                    return None;
                }
            }
            let script =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/grpcio_registration_client.py");
            Some(
                Command::new("python3")
                    .arg(script)
                    .arg(&path)
                    .output()
                    .unwrap(),
            )
        });
        tokio::time::timeout(Duration::from_secs(30), run)
            .await
            .expect("grpcio client hung")
            .unwrap()
    }

    #[tokio::test]
    async fn grpcio_client_with_default_unix_authority() {
        let server = TestServer::start(true);
        let Some(output) = run_grpcio_client(&server.path).await else {
            return;
        };
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "grpcio client failed: {stderr}");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let hex = stdout.trim();
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        assert_eq!(PluginInfo::decode(&bytes[..]).unwrap(), expected_info());
        assert_eq!(*server.status.borrow(), RegistrationStatus::Registered);
        server.stop().await;

        // Negative control: the same client against a stock tonic server.
        let server = TestServer::start(false);
        let output = run_grpcio_client(&server.path).await.unwrap();
        assert!(
            !output.status.success(),
            "grpcio unexpectedly succeeded without the rewriter"
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        eprintln!("grpcio against a stock tonic server: {}", stderr.trim());
        assert!(
            stderr.contains("RST_STREAM") || stderr.contains("INTERNAL"),
            "{stderr}"
        );
        server.stop().await;
    }
}
