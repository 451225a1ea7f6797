//! The gRPC services: each call checks the faults, runs on the state, and is logged.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::Stream;
use tonic::{Request, Response, Status};

use super::faults::{Faults, IMAGE_SERVICE, RUNTIME_SERVICE};
use super::proto::{
    self, image_service_server::ImageService, runtime_service_server::RuntimeService,
};
use super::record::{CallLog, ContainerRecord, LogLine};
use super::state::State;

/// What the version call answers. `version` and `runtime_api_version` are what the runtime
/// of the kubelet recordings answered (the kubelet only logs them); `runtime_version` must
/// be semver, it goes into the node's `containerRuntimeVersion`.
const RUNTIME_NAME: &str = "dra-sdk-cri-double";
const API_VERSION: &str = "0.1.0";

/// The state and settings every call shares.
pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    pub(crate) faults: Faults,
    pub(crate) metric_descriptors: Vec<proto::MetricDescriptor>,
    pub(crate) log: CallLog,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Serves both CRI services from one [`Shared`].
#[derive(Clone)]
pub(crate) struct Cri {
    pub(crate) shared: Arc<Shared>,
}

/// Who a call concerns, for the log.
#[derive(Default)]
struct Subject {
    pod: Option<String>,
    container: Option<String>,
}

impl Cri {
    /// Runs one call: the fault check, then `run` on the state under its lock, then one log
    /// line. `subject` is read before `run`, so a removal still names what it removed.
    fn call<T>(
        &self,
        service: &str,
        method: &'static str,
        subject: impl FnOnce(&State) -> Subject,
        run: impl FnOnce(&mut State) -> Result<T, Status>,
    ) -> Result<Response<T>, Status> {
        let t_ms = self.shared.log.elapsed_ms();
        let (subject, result) = match self.shared.faults.check(service, method) {
            Err(status) => (Subject::default(), Err(status)),
            Ok(()) => {
                let mut state = self.shared.lock();
                let subject = subject(&state);
                let result = run(&mut state);
                (subject, result)
            }
        };
        tracing::trace!(method, ok = result.is_ok(), "CRI call");
        self.shared.log.write(&LogLine {
            t_ms,
            call: method,
            pod: subject.pod,
            container: subject.container,
            error: result
                .as_ref()
                .err()
                .map(|status| format!("{:?}: {}", status.code(), status.message())),
            ..LogLine::default()
        });
        result.map(Response::new)
    }

    fn sandbox(id: &str) -> impl FnOnce(&State) -> Subject + '_ {
        move |state| Subject {
            pod: state.sandbox_pod(id),
            container: None,
        }
    }

    fn container(id: &str) -> impl FnOnce(&State) -> Subject + '_ {
        move |state| match state.container_names(id) {
            Some((pod, name)) => Subject {
                pod,
                container: Some(name),
            },
            None => Subject::default(),
        }
    }
}

fn none(_: &State) -> Subject {
    Subject::default()
}

type EventStream =
    Pin<Box<dyn Stream<Item = Result<proto::ContainerEventResponse, Status>> + Send>>;

#[tonic::async_trait]
impl RuntimeService for Cri {
    async fn version(
        &self,
        _: Request<proto::VersionRequest>,
    ) -> Result<Response<proto::VersionResponse>, Status> {
        self.call(RUNTIME_SERVICE, "Version", none, |_| {
            Ok(proto::VersionResponse {
                version: API_VERSION.to_owned(),
                runtime_name: RUNTIME_NAME.to_owned(),
                runtime_version: env!("CARGO_PKG_VERSION").to_owned(),
                runtime_api_version: API_VERSION.to_owned(),
            })
        })
    }

    async fn run_pod_sandbox(
        &self,
        request: Request<proto::RunPodSandboxRequest>,
    ) -> Result<Response<proto::RunPodSandboxResponse>, Status> {
        let request = request.into_inner();
        let pod = request
            .config
            .as_ref()
            .and_then(|config| config.metadata.as_ref())
            .map(|metadata| format!("{}/{}", metadata.namespace, metadata.name));
        self.call(
            RUNTIME_SERVICE,
            "RunPodSandbox",
            |_| Subject {
                pod,
                container: None,
            },
            |state| state.run_pod_sandbox(request),
        )
    }

    async fn stop_pod_sandbox(
        &self,
        request: Request<proto::StopPodSandboxRequest>,
    ) -> Result<Response<proto::StopPodSandboxResponse>, Status> {
        let id = request.into_inner().pod_sandbox_id;
        self.call(
            RUNTIME_SERVICE,
            "StopPodSandbox",
            Self::sandbox(&id),
            |state| {
                state.stop_pod_sandbox(&id);
                Ok(proto::StopPodSandboxResponse {})
            },
        )
    }

    async fn remove_pod_sandbox(
        &self,
        request: Request<proto::RemovePodSandboxRequest>,
    ) -> Result<Response<proto::RemovePodSandboxResponse>, Status> {
        let id = request.into_inner().pod_sandbox_id;
        self.call(
            RUNTIME_SERVICE,
            "RemovePodSandbox",
            Self::sandbox(&id),
            |state| {
                state.remove_pod_sandbox(&id);
                Ok(proto::RemovePodSandboxResponse {})
            },
        )
    }

    async fn pod_sandbox_status(
        &self,
        request: Request<proto::PodSandboxStatusRequest>,
    ) -> Result<Response<proto::PodSandboxStatusResponse>, Status> {
        let id = request.into_inner().pod_sandbox_id;
        self.call(
            RUNTIME_SERVICE,
            "PodSandboxStatus",
            Self::sandbox(&id),
            |state| state.pod_sandbox_status(&id),
        )
    }

    async fn list_pod_sandbox(
        &self,
        request: Request<proto::ListPodSandboxRequest>,
    ) -> Result<Response<proto::ListPodSandboxResponse>, Status> {
        let filter = request.into_inner().filter;
        self.call(RUNTIME_SERVICE, "ListPodSandbox", none, |state| {
            Ok(state.list_pod_sandbox(filter.as_ref()))
        })
    }

    async fn create_container(
        &self,
        request: Request<proto::CreateContainerRequest>,
    ) -> Result<Response<proto::CreateContainerResponse>, Status> {
        let request = request.into_inner();
        let t_ms = self.shared.log.elapsed_ms();
        let (result, pod) = match self.shared.faults.check(RUNTIME_SERVICE, "CreateContainer") {
            Err(status) => (
                Err(status),
                self.shared.lock().sandbox_pod(&request.pod_sandbox_id),
            ),
            Ok(()) => {
                let mut state = self.shared.lock();
                let pod = state.sandbox_pod(&request.pod_sandbox_id);
                (state.create_container(request.clone()), pod)
            }
        };
        // The log line carries what the kubelet passed, also when the call failed, so a test
        // can see what a failed attempt was given.
        let config = request.config.unwrap_or_default();
        let record = ContainerRecord::new(
            result
                .as_ref()
                .map(|response| response.container_id.as_str())
                .unwrap_or_default(),
            pod.as_deref().unwrap_or_default(),
            &config,
        );
        self.shared.log.write(&LogLine {
            t_ms,
            call: "CreateContainer",
            pod,
            container: Some(record.name.clone()),
            error: result
                .as_ref()
                .err()
                .map(|status| format!("{:?}: {}", status.code(), status.message())),
            cdi_devices: Some(&record.cdi_devices),
            mounts: Some(&record.mounts),
            envs: Some(&record.envs),
            devices: Some(&record.devices),
        });
        tracing::debug!(
            pod = record.pod,
            container = record.name,
            cdi_devices = ?record.cdi_devices,
            ok = result.is_ok(),
            "CRI CreateContainer"
        );
        result.map(Response::new)
    }

    async fn start_container(
        &self,
        request: Request<proto::StartContainerRequest>,
    ) -> Result<Response<proto::StartContainerResponse>, Status> {
        let id = request.into_inner().container_id;
        self.call(
            RUNTIME_SERVICE,
            "StartContainer",
            Self::container(&id),
            |state| {
                state
                    .start_container(&id)
                    .map(|()| proto::StartContainerResponse {})
            },
        )
    }

    async fn stop_container(
        &self,
        request: Request<proto::StopContainerRequest>,
    ) -> Result<Response<proto::StopContainerResponse>, Status> {
        let id = request.into_inner().container_id;
        self.call(
            RUNTIME_SERVICE,
            "StopContainer",
            Self::container(&id),
            |state| {
                state.stop_container(&id);
                Ok(proto::StopContainerResponse {})
            },
        )
    }

    async fn remove_container(
        &self,
        request: Request<proto::RemoveContainerRequest>,
    ) -> Result<Response<proto::RemoveContainerResponse>, Status> {
        let id = request.into_inner().container_id;
        self.call(
            RUNTIME_SERVICE,
            "RemoveContainer",
            Self::container(&id),
            |state| {
                state.remove_container(&id);
                Ok(proto::RemoveContainerResponse {})
            },
        )
    }

    async fn list_containers(
        &self,
        request: Request<proto::ListContainersRequest>,
    ) -> Result<Response<proto::ListContainersResponse>, Status> {
        let filter = request.into_inner().filter;
        self.call(RUNTIME_SERVICE, "ListContainers", none, |state| {
            Ok(state.list_containers(filter.as_ref()))
        })
    }

    async fn container_status(
        &self,
        request: Request<proto::ContainerStatusRequest>,
    ) -> Result<Response<proto::ContainerStatusResponse>, Status> {
        let id = request.into_inner().container_id;
        self.call(
            RUNTIME_SERVICE,
            "ContainerStatus",
            Self::container(&id),
            |state| state.container_status(&id),
        )
    }

    async fn list_container_stats(
        &self,
        _: Request<proto::ListContainerStatsRequest>,
    ) -> Result<Response<proto::ListContainerStatsResponse>, Status> {
        self.call(RUNTIME_SERVICE, "ListContainerStats", none, |_| {
            Ok(proto::ListContainerStatsResponse {})
        })
    }

    async fn list_pod_sandbox_stats(
        &self,
        _: Request<proto::ListPodSandboxStatsRequest>,
    ) -> Result<Response<proto::ListPodSandboxStatsResponse>, Status> {
        self.call(RUNTIME_SERVICE, "ListPodSandboxStats", none, |_| {
            Ok(proto::ListPodSandboxStatsResponse {})
        })
    }

    async fn status(
        &self,
        _: Request<proto::StatusRequest>,
    ) -> Result<Response<proto::StatusResponse>, Status> {
        self.call(RUNTIME_SERVICE, "Status", none, |_| {
            let ready = |kind: &str| proto::RuntimeCondition {
                r#type: kind.to_owned(),
                status: true,
                ..Default::default()
            };
            Ok(proto::StatusResponse {
                status: Some(proto::RuntimeStatus {
                    conditions: vec![ready("RuntimeReady"), ready("NetworkReady")],
                }),
            })
        })
    }

    type GetContainerEventsStream = EventStream;

    /// A stream that ends at once: the kubelet (EventedPLEG) retries a few times and then
    /// relists, as it does with the runtime of the recordings.
    async fn get_container_events(
        &self,
        _: Request<proto::GetEventsRequest>,
    ) -> Result<Response<Self::GetContainerEventsStream>, Status> {
        self.call(RUNTIME_SERVICE, "GetContainerEvents", none, |_| {
            Ok(Box::pin(futures::stream::empty()) as EventStream)
        })
    }

    async fn list_metric_descriptors(
        &self,
        _: Request<proto::ListMetricDescriptorsRequest>,
    ) -> Result<Response<proto::ListMetricDescriptorsResponse>, Status> {
        let descriptors = self.shared.metric_descriptors.clone();
        self.call(RUNTIME_SERVICE, "ListMetricDescriptors", none, |_| {
            Ok(proto::ListMetricDescriptorsResponse { descriptors })
        })
    }

    async fn list_pod_sandbox_metrics(
        &self,
        _: Request<proto::ListPodSandboxMetricsRequest>,
    ) -> Result<Response<proto::ListPodSandboxMetricsResponse>, Status> {
        self.call(RUNTIME_SERVICE, "ListPodSandboxMetrics", none, |_| {
            Ok(proto::ListPodSandboxMetricsResponse {})
        })
    }

    async fn runtime_config(
        &self,
        _: Request<proto::RuntimeConfigRequest>,
    ) -> Result<Response<proto::RuntimeConfigResponse>, Status> {
        self.call(RUNTIME_SERVICE, "RuntimeConfig", none, |_| {
            Ok(proto::RuntimeConfigResponse {
                linux: Some(proto::LinuxRuntimeConfiguration {
                    cgroup_driver: proto::CgroupDriver::Cgroupfs.into(),
                }),
            })
        })
    }
}

#[tonic::async_trait]
impl ImageService for Cri {
    async fn list_images(
        &self,
        _: Request<proto::ListImagesRequest>,
    ) -> Result<Response<proto::ListImagesResponse>, Status> {
        self.call(IMAGE_SERVICE, "ListImages", none, |state| {
            Ok(state.list_images())
        })
    }

    async fn image_status(
        &self,
        request: Request<proto::ImageStatusRequest>,
    ) -> Result<Response<proto::ImageStatusResponse>, Status> {
        let spec = request.into_inner().image;
        self.call(IMAGE_SERVICE, "ImageStatus", none, |state| {
            Ok(state.image_status(spec.as_ref()))
        })
    }

    async fn pull_image(
        &self,
        request: Request<proto::PullImageRequest>,
    ) -> Result<Response<proto::PullImageResponse>, Status> {
        let spec = request.into_inner().image;
        self.call(IMAGE_SERVICE, "PullImage", none, |state| {
            state.pull_image(spec.as_ref())
        })
    }

    async fn image_fs_info(
        &self,
        _: Request<proto::ImageFsInfoRequest>,
    ) -> Result<Response<proto::ImageFsInfoResponse>, Status> {
        self.call(IMAGE_SERVICE, "ImageFsInfo", none, |_| {
            Ok(proto::ImageFsInfoResponse {})
        })
    }
}
