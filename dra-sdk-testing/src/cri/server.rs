//! Starting and stopping the double: its socket, thread and runtime.

use std::os::unix::fs::FileTypeExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::sync::oneshot;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint};

use super::CriError;
use super::faults::Faults;
use super::proto::{
    self, image_service_server::ImageServiceServer, runtime_service_server::RuntimeServiceServer,
};
use super::record::{CallLog, ContainerRecord};
use super::service::{Cri, Shared};
use super::state::{DEFAULT_IMAGES, State};

/// How long a stopping double waits for calls in flight before it drops them.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Configures a [`CriDouble`]; see the [module docs](super).
#[derive(Debug)]
#[must_use]
pub struct CriDoubleBuilder {
    socket: PathBuf,
    log: Option<PathBuf>,
    images: Vec<String>,
    faults: Faults,
    metric_descriptors: Vec<proto::MetricDescriptor>,
}

impl CriDoubleBuilder {
    /// Appends one JSON object per CRI call to `path` (created if missing): `call`, `pod`
    /// (`namespace/name`), `container`, `error` (`Code: message`) where a call failed, and
    /// for `CreateContainer` the `cdiDevices`, `mounts`, `envs` and `devices` the kubelet
    /// passed. [`CriLog`](crate::e2e::CriLog) reads it.
    pub fn log_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.log = Some(path.into());
        self
    }

    /// The images `ListImages` lists before any pull (default: `busybox`, `busybox:latest`
    /// and `registry.k8s.io/pause:3.10`). Any other image is present too, once asked for.
    pub fn images<S: Into<String>>(mut self, images: impl IntoIterator<Item = S>) -> Self {
        self.images = images.into_iter().map(Into::into).collect();
        self
    }

    /// Answers these methods (`RuntimeConfig`, `ListContainerStats`, ...) with
    /// `Unimplemented` and grpc-go's message `unknown method M for service S`, as a runtime
    /// built against an older CRI does. Not `Version` or `ImageFsInfo`, unless the test wants
    /// the kubelet to refuse the runtime: it exits at start without them.
    pub fn unimplemented<S: Into<String>>(mut self, methods: impl IntoIterator<Item = S>) -> Self {
        self.faults
            .unimplemented
            .extend(methods.into_iter().map(Into::into));
        self
    }

    /// Fails the first `CreateContainer` of the pod `namespace/name` with `Unknown` (the
    /// kubelet reports `CreateContainerError` and retries at once).
    pub fn fail_first_create(mut self, namespace: &str, name: &str) -> Self {
        self.faults
            .fail_first_create
            .insert(format!("{namespace}/{name}"));
        self
    }

    /// What `ListMetricDescriptors` answers (default: none, so that a kubelet with the
    /// `PodAndContainerStatsFromCRI` gate never asks for metric values).
    pub fn metric_descriptors(mut self, descriptors: Vec<proto::MetricDescriptor>) -> Self {
        self.metric_descriptors = descriptors;
        self
    }

    /// Binds the socket and starts serving on a thread of the double's own.
    ///
    /// A socket file left at the path by an earlier run is replaced; any other file there
    /// is an error.
    pub fn start(self) -> Result<CriDouble, CriError> {
        let socket = self.socket;
        let listener = bind(&socket)?;
        let log = CallLog::open(self.log.as_deref()).map_err(|source| CriError::Log {
            path: self.log.clone().unwrap_or_default(),
            source,
        })?;
        let shared = Arc::new(Shared {
            state: std::sync::Mutex::new(State::new(
                self.images,
                self.faults.fail_first_create.clone(),
            )),
            faults: self.faults,
            metric_descriptors: self.metric_descriptors,
            log,
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(CriError::Thread)?;
        let (stop, stopped) = oneshot::channel();
        let cri = Cri {
            shared: shared.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("dra-cri-double".into())
            .spawn(move || serve(&runtime, listener, cri, stopped))
            .map_err(CriError::Thread)?;
        tracing::info!(socket = %socket.display(), "CRI double serving");
        Ok(CriDouble {
            socket,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

/// Binds `socket`, replacing a stale socket file. The listener is made here, on the caller's
/// thread, so that a bind error is the caller's error.
fn bind(socket: &Path) -> Result<std::os::unix::net::UnixListener, CriError> {
    let bind_error = |source| CriError::Bind {
        path: socket.to_owned(),
        source,
    };
    match std::fs::symlink_metadata(socket) {
        Ok(metadata) if metadata.file_type().is_socket() => {
            std::fs::remove_file(socket).map_err(bind_error)?;
        }
        Ok(_) => {
            return Err(CriError::PathInUse {
                path: socket.to_owned(),
            });
        }
        Err(_) => {}
    }
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).map_err(bind_error)?;
    }
    let listener = std::os::unix::net::UnixListener::bind(socket).map_err(bind_error)?;
    listener.set_nonblocking(true).map_err(bind_error)?;
    Ok(listener)
}

/// The double's thread: serves until `stopped` fires, then gives calls in flight
/// [`STOP_GRACE`] and drops the rest with the runtime.
fn serve(
    runtime: &tokio::runtime::Runtime,
    listener: std::os::unix::net::UnixListener,
    cri: Cri,
    stopped: oneshot::Receiver<()>,
) {
    runtime.block_on(async move {
        let listener = match tokio::net::UnixListener::from_std(listener) {
            Ok(listener) => listener,
            Err(error) => {
                tracing::error!(%error, "CRI double: cannot register its socket");
                return;
            }
        };
        let (shutdown, shutting_down) = oneshot::channel::<()>();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RuntimeServiceServer::new(cri.clone()))
                .add_service(ImageServiceServer::new(cri))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = shutting_down.await;
                }),
        );
        // Dropped sender (the double was dropped without stop) counts as a stop too.
        let _ = stopped.await;
        let _ = shutdown.send(());
        match tokio::time::timeout(STOP_GRACE, server).await {
            Ok(Ok(Err(error))) => tracing::warn!(%error, "CRI double: server error"),
            Ok(Err(error)) => tracing::warn!(%error, "CRI double: server task failed"),
            Ok(Ok(Ok(()))) | Err(_) => {}
        }
    });
}

/// A running CRI double; see the [module docs](super). Stops when dropped.
pub struct CriDouble {
    socket: PathBuf,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for CriDouble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CriDouble")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

impl CriDouble {
    /// A builder for a double serving on the Unix socket `socket` (the kubelet's
    /// `containerRuntimeEndpoint` and `imageServiceEndpoint`, `unix://<socket>`).
    pub fn builder(socket: impl Into<PathBuf>) -> CriDoubleBuilder {
        CriDoubleBuilder {
            socket: socket.into(),
            log: None,
            images: DEFAULT_IMAGES
                .iter()
                .map(|image| (*image).to_owned())
                .collect(),
            faults: Faults::default(),
            metric_descriptors: Vec::new(),
        }
    }

    /// The socket it serves on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Every container the kubelet created, oldest first, including removed ones.
    pub fn containers(&self) -> Vec<ContainerRecord> {
        self.shared.lock().records().to_vec()
    }

    /// The newest container `name` of the pod `namespace/name`, if the kubelet created one.
    pub fn container(&self, pod: &str, name: &str) -> Option<ContainerRecord> {
        self.shared
            .lock()
            .records()
            .iter()
            .rev()
            .find(|record| record.pod == pod && record.name == name)
            .cloned()
    }

    /// A gRPC channel to the double's socket, for clients of [`proto`](super::proto).
    pub async fn connect(&self) -> Result<Channel, tonic::transport::Error> {
        let socket = self.socket.clone();
        Endpoint::from_static("http://localhost")
            .connect_with_connector(tower::service_fn(move |_: http::Uri| {
                let socket = socket.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(socket).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(stream))
                }
            }))
            .await
    }
}

impl Drop for CriDouble {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("CRI double: its thread panicked");
        }
        let _ = std::fs::remove_file(&self.socket);
        tracing::info!(socket = %self.socket.display(), "CRI double stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::proto::image_service_client::ImageServiceClient;
    use crate::cri::proto::runtime_service_client::RuntimeServiceClient;
    use crate::e2e::CriLog;

    fn create_request(sandbox: &str, logs: &Path) -> proto::CreateContainerRequest {
        proto::CreateContainerRequest {
            pod_sandbox_id: sandbox.to_owned(),
            config: Some(proto::ContainerConfig {
                metadata: Some(proto::ContainerMetadata {
                    name: "ctr".into(),
                    attempt: 0,
                }),
                log_path: "ctr/0.log".into(),
                cdi_devices: vec![proto::CdiDevice {
                    name: "gpu.example.com/gpu=claim-uid-gpu".into(),
                }],
                mounts: vec![proto::Mount {
                    container_path: "/data".into(),
                    host_path: logs.display().to_string(),
                    readonly: true,
                    ..Default::default()
                }],
                envs: vec![proto::KeyValue {
                    key: "BLOB".into(),
                    value: vec![0xff],
                }],
                ..Default::default()
            }),
            sandbox_config: None,
        }
    }

    /// Over the socket: the injected faults, the containers kept, and a call log that
    /// `CriLog` reads (a failed `CreateContainer` does not count as the container's).
    #[tokio::test]
    async fn serves_logs_and_injects_faults_over_its_socket() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("run/cri.sock");
        let log = dir.path().join("cri.jsonl");
        let cri = CriDouble::builder(&socket)
            .log_file(&log)
            .unimplemented(["RuntimeConfig"])
            .fail_first_create("ns", "p")
            .start()
            .unwrap();
        let channel = cri.connect().await.unwrap();
        let mut runtime = RuntimeServiceClient::new(channel.clone());
        let mut images = ImageServiceClient::new(channel.clone());

        let refused = runtime
            .runtime_config(proto::RuntimeConfigRequest {})
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unimplemented);
        assert_eq!(
            refused.message(),
            "unknown method RuntimeConfig for service runtime.v1.RuntimeService"
        );
        images
            .image_fs_info(proto::ImageFsInfoRequest {})
            .await
            .unwrap();

        let sandbox = runtime
            .run_pod_sandbox(proto::RunPodSandboxRequest {
                config: Some(proto::PodSandboxConfig {
                    metadata: Some(proto::PodSandboxMetadata {
                        name: "p".into(),
                        uid: "u".into(),
                        namespace: "ns".into(),
                        attempt: 0,
                    }),
                    log_directory: dir.path().join("logs").display().to_string(),
                    ..Default::default()
                }),
                runtime_handler: String::new(),
            })
            .await
            .unwrap()
            .into_inner()
            .pod_sandbox_id;
        let failed = runtime
            .create_container(create_request(&sandbox, dir.path()))
            .await
            .unwrap_err();
        assert_eq!(failed.code(), tonic::Code::Unknown);
        let cri_log = CriLog::new(log.clone());
        assert_eq!(cri_log.container_cdi_devices("ns/p", "ctr"), None);

        let id = runtime
            .create_container(create_request(&sandbox, dir.path()))
            .await
            .unwrap()
            .into_inner()
            .container_id;
        runtime
            .start_container(proto::StartContainerRequest {
                container_id: id.clone(),
            })
            .await
            .unwrap();
        let mut events = runtime
            .get_container_events(proto::GetEventsRequest {})
            .await
            .unwrap()
            .into_inner();
        assert!(events.message().await.unwrap().is_none(), "ends at once");

        let record = cri.container("ns/p", "ctr").unwrap();
        assert_eq!(record.id, id);
        assert_eq!(record.cdi_devices, ["gpu.example.com/gpu=claim-uid-gpu"]);
        assert_eq!(record.envs[0].value, [0xff]);
        let created = cri_log.created_container("ns/p", "ctr").unwrap();
        assert_eq!(created.cdi_devices, record.cdi_devices);
        assert_eq!(created.mounts, record.mounts);
        assert_eq!(created.envs, record.envs);
        let start = cri_log
            .calls()
            .into_iter()
            .find(|call| call.call == "StartContainer")
            .unwrap();
        assert_eq!(start.pod.as_deref(), Some("ns/p"));
        assert_eq!(start.container.as_deref(), Some("ctr"));

        drop((runtime, images, channel));
        drop(cri);
        assert!(!socket.exists(), "the socket is removed");
    }

    #[test]
    fn refuses_a_path_that_is_not_a_socket_and_replaces_a_stale_one() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert!(matches!(
            CriDouble::builder(&file).start(),
            Err(CriError::PathInUse { .. })
        ));
        let socket = dir.path().join("cri.sock");
        let stale = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        drop(stale);
        let cri = CriDouble::builder(&socket).start().unwrap();
        assert_eq!(cri.socket(), socket);
    }
}
