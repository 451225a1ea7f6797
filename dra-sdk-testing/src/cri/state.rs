//! The runtime's state: pod sandboxes, containers and images, and how CRI calls change it.
//!
//! Plain synchronous code over the generated messages, so the state machine is tested
//! without a socket. Ids are readable and deterministic, as containerd's names are:
//! `<pod>_<namespace>_<uid>_<attempt>` for a sandbox, `<sandbox id>_<container>_<attempt>`
//! for a container. The kubelet never creates two of the same name and attempt; a second
//! one is refused, as a runtime refuses a name it has reserved.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use tonic::Status;

use super::proto::{self, ContainerState, PodSandboxState};
use super::record::ContainerRecord;

/// The size every image reports: the kubelet's image manager wants a non-zero size.
pub(crate) const IMAGE_SIZE: u64 = 1 << 20;

/// The IP every sandbox reports (the kubelet copies it into the pod's status).
pub(crate) const POD_IP: &str = "192.168.192.168";

/// The images present before any pull.
pub(crate) const DEFAULT_IMAGES: [&str; 3] =
    ["busybox", "busybox:latest", "registry.k8s.io/pause:3.10"];

struct Sandbox {
    config: proto::PodSandboxConfig,
    runtime_handler: String,
    state: PodSandboxState,
    created_at: i64,
}

struct Container {
    sandbox_id: String,
    config: proto::ContainerConfig,
    state: ContainerState,
    created_at: i64,
    started_at: i64,
    finished_at: i64,
    log_path: PathBuf,
}

/// Everything the runtime holds.
#[derive(Default)]
pub(crate) struct State {
    sandboxes: BTreeMap<String, Sandbox>,
    containers: BTreeMap<String, Container>,
    images: BTreeSet<String>,
    /// Pods whose first `CreateContainer` is to fail (`namespace/name`), and those for which
    /// it did.
    fail_first_create: BTreeSet<String>,
    failed_once: BTreeSet<String>,
    /// Every container ever created, oldest first.
    records: Vec<ContainerRecord>,
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |elapsed| {
            i64::try_from(elapsed.as_nanos()).unwrap_or(i64::MAX)
        })
}

fn labels_match(labels: &HashMap<String, String>, selector: &HashMap<String, String>) -> bool {
    selector
        .iter()
        .all(|(key, value)| labels.get(key) == Some(value))
}

fn pod_of(config: &proto::PodSandboxConfig) -> String {
    let metadata = config.metadata.clone().unwrap_or_default();
    format!("{}/{}", metadata.namespace, metadata.name)
}

fn image(name: &str) -> proto::Image {
    proto::Image {
        id: name.to_owned(),
        repo_tags: vec![name.to_owned()],
        size: IMAGE_SIZE,
        spec: Some(proto::ImageSpec {
            image: name.to_owned(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

impl State {
    pub(crate) fn new(
        images: impl IntoIterator<Item = String>,
        fail_first_create: BTreeSet<String>,
    ) -> Self {
        Self {
            images: images.into_iter().collect(),
            fail_first_create,
            ..Self::default()
        }
    }

    /// Every container created so far, oldest first.
    pub(crate) fn records(&self) -> &[ContainerRecord] {
        &self.records
    }

    /// `namespace/name` of the pod a sandbox belongs to.
    pub(crate) fn sandbox_pod(&self, id: &str) -> Option<String> {
        self.sandboxes
            .get(id)
            .map(|sandbox| pod_of(&sandbox.config))
    }

    /// `namespace/name` of the pod and the container's name.
    pub(crate) fn container_names(&self, id: &str) -> Option<(Option<String>, String)> {
        let container = self.containers.get(id)?;
        let name = container.config.metadata.clone().unwrap_or_default().name;
        Some((self.sandbox_pod(&container.sandbox_id), name))
    }

    // ---- sandboxes ----

    pub(crate) fn run_pod_sandbox(
        &mut self,
        request: proto::RunPodSandboxRequest,
    ) -> Result<proto::RunPodSandboxResponse, Status> {
        let config = request
            .config
            .ok_or_else(|| Status::invalid_argument("RunPodSandbox without a config"))?;
        let metadata = config
            .metadata
            .clone()
            .ok_or_else(|| Status::invalid_argument("PodSandboxConfig without metadata"))?;
        let id = format!(
            "{}_{}_{}_{}",
            metadata.name, metadata.namespace, metadata.uid, metadata.attempt
        );
        if self.sandboxes.contains_key(&id) {
            return Err(Status::already_exists(format!(
                "pod sandbox {id:?} already exists"
            )));
        }
        self.sandboxes.insert(
            id.clone(),
            Sandbox {
                config,
                runtime_handler: request.runtime_handler,
                state: PodSandboxState::SandboxReady,
                created_at: now_ns(),
            },
        );
        Ok(proto::RunPodSandboxResponse { pod_sandbox_id: id })
    }

    /// Stops the sandbox and every container in it. Idempotent, also for a sandbox that is
    /// gone (the kubelet stops a sandbox again before it removes it).
    pub(crate) fn stop_pod_sandbox(&mut self, id: &str) {
        let Some(sandbox) = self.sandboxes.get_mut(id) else {
            return;
        };
        sandbox.state = PodSandboxState::SandboxNotready;
        let now = now_ns();
        for container in self.containers.values_mut() {
            if container.sandbox_id == id {
                container.stop(now);
            }
        }
    }

    /// Removes the sandbox and its containers. Idempotent.
    pub(crate) fn remove_pod_sandbox(&mut self, id: &str) {
        self.sandboxes.remove(id);
        self.containers
            .retain(|_, container| container.sandbox_id != id);
    }

    pub(crate) fn pod_sandbox_status(
        &self,
        id: &str,
    ) -> Result<proto::PodSandboxStatusResponse, Status> {
        let sandbox = self
            .sandboxes
            .get(id)
            .ok_or_else(|| Status::not_found(format!("pod sandbox \"{id}\" not found")))?;
        let namespace_options = sandbox
            .config
            .linux
            .as_ref()
            .and_then(|linux| linux.security_context.as_ref())
            .and_then(|context| context.namespace_options.clone());
        Ok(proto::PodSandboxStatusResponse {
            status: Some(proto::PodSandboxStatus {
                id: id.to_owned(),
                metadata: sandbox.config.metadata.clone(),
                state: sandbox.state.into(),
                created_at: sandbox.created_at,
                network: Some(proto::PodSandboxNetworkStatus {
                    ip: POD_IP.to_owned(),
                }),
                linux: Some(proto::LinuxPodSandboxStatus {
                    namespaces: Some(proto::Namespace {
                        options: namespace_options,
                    }),
                }),
                labels: sandbox.config.labels.clone(),
                annotations: sandbox.config.annotations.clone(),
                runtime_handler: sandbox.runtime_handler.clone(),
            }),
        })
    }

    pub(crate) fn list_pod_sandbox(
        &self,
        filter: Option<&proto::PodSandboxFilter>,
    ) -> proto::ListPodSandboxResponse {
        let items = self
            .sandboxes
            .iter()
            .filter(|(id, sandbox)| {
                let Some(filter) = filter else { return true };
                (filter.id.is_empty() || filter.id == **id)
                    // A state filter that is set but empty asks for SANDBOX_READY.
                    && filter
                        .state
                        .as_ref()
                        .is_none_or(|state| state.state == i32::from(sandbox.state))
                    && labels_match(&sandbox.config.labels, &filter.label_selector)
            })
            .map(|(id, sandbox)| proto::PodSandbox {
                id: id.clone(),
                metadata: sandbox.config.metadata.clone(),
                state: sandbox.state.into(),
                created_at: sandbox.created_at,
                labels: sandbox.config.labels.clone(),
                annotations: sandbox.config.annotations.clone(),
                runtime_handler: sandbox.runtime_handler.clone(),
            })
            .collect();
        proto::ListPodSandboxResponse { items }
    }

    // ---- containers ----

    /// Creates the container and its (empty) log file. Fails, once, for a pod configured to.
    pub(crate) fn create_container(
        &mut self,
        request: proto::CreateContainerRequest,
    ) -> Result<proto::CreateContainerResponse, Status> {
        let sandbox = self.sandboxes.get(&request.pod_sandbox_id).ok_or_else(|| {
            Status::not_found(format!(
                "pod sandbox \"{}\" not found",
                request.pod_sandbox_id
            ))
        })?;
        let pod = pod_of(&sandbox.config);
        if self.fail_first_create.contains(&pod) && self.failed_once.insert(pod.clone()) {
            tracing::info!(
                pod,
                "CRI double: failing the first CreateContainer, as asked"
            );
            return Err(Status::unknown(format!(
                "dra-sdk CRI double: injected failure of the first CreateContainer of pod {pod}"
            )));
        }
        let config = request
            .config
            .ok_or_else(|| Status::invalid_argument("CreateContainer without a config"))?;
        let metadata = config
            .metadata
            .clone()
            .ok_or_else(|| Status::invalid_argument("ContainerConfig without metadata"))?;
        let id = format!(
            "{}_{}_{}",
            request.pod_sandbox_id, metadata.name, metadata.attempt
        );
        if self.containers.contains_key(&id) {
            return Err(Status::already_exists(format!(
                "container {id:?} already exists"
            )));
        }
        // The kubelet reads the log at the path the status reports, and on cleanup removes
        // it: it must be a real, absolute file, never "" (which the kubelet would resolve
        // against its working directory).
        let log_path = Path::new(&sandbox.config.log_directory).join(&config.log_path);
        if !log_path.is_absolute() || config.log_path.is_empty() {
            return Err(Status::invalid_argument(format!(
                "log path {} (log_directory {:?} + log_path {:?}) is not an absolute file path",
                log_path.display(),
                sandbox.config.log_directory,
                config.log_path
            )));
        }
        create_log_file(&log_path).map_err(|error| {
            Status::internal(format!(
                "creating the log file {}: {error}",
                log_path.display()
            ))
        })?;
        self.records.push(ContainerRecord::new(&id, &pod, &config));
        self.containers.insert(
            id.clone(),
            Container {
                sandbox_id: request.pod_sandbox_id,
                config,
                state: ContainerState::ContainerCreated,
                created_at: now_ns(),
                started_at: 0,
                finished_at: 0,
                log_path,
            },
        );
        Ok(proto::CreateContainerResponse { container_id: id })
    }

    pub(crate) fn start_container(&mut self, id: &str) -> Result<(), Status> {
        let container = self
            .containers
            .get_mut(id)
            .ok_or_else(|| Status::not_found(format!("container \"{id}\" not found")))?;
        match container.state {
            ContainerState::ContainerCreated => {
                container.state = ContainerState::ContainerRunning;
                container.started_at = now_ns();
                Ok(())
            }
            state => Err(Status::failed_precondition(format!(
                "container \"{id}\" is {}, not created",
                state.as_str_name()
            ))),
        }
    }

    /// Stops the container (no process: it exits with 0 at once). Idempotent.
    pub(crate) fn stop_container(&mut self, id: &str) {
        if let Some(container) = self.containers.get_mut(id) {
            container.stop(now_ns());
        }
    }

    /// Removes the container. Idempotent.
    pub(crate) fn remove_container(&mut self, id: &str) {
        self.containers.remove(id);
    }

    pub(crate) fn list_containers(
        &self,
        filter: Option<&proto::ContainerFilter>,
    ) -> proto::ListContainersResponse {
        let containers = self
            .containers
            .iter()
            .filter(|(id, container)| {
                let Some(filter) = filter else { return true };
                (filter.id.is_empty() || filter.id == **id)
                    && (filter.pod_sandbox_id.is_empty()
                        || filter.pod_sandbox_id == container.sandbox_id)
                    && filter
                        .state
                        .as_ref()
                        .is_none_or(|state| state.state == i32::from(container.state))
                    && labels_match(&container.config.labels, &filter.label_selector)
            })
            .map(|(id, container)| proto::Container {
                id: id.clone(),
                pod_sandbox_id: container.sandbox_id.clone(),
                metadata: container.config.metadata.clone(),
                image: container.config.image.clone(),
                image_ref: container.image_ref(),
                state: container.state.into(),
                created_at: container.created_at,
                labels: container.config.labels.clone(),
                annotations: container.config.annotations.clone(),
                ..Default::default()
            })
            .collect();
        proto::ListContainersResponse { containers }
    }

    /// The container's status. An unknown id answers `Unknown`, not `NotFound`: that is what
    /// the runtime of the kubelet recordings answered, and the kubelet asks this right after
    /// every `RemoveContainer`.
    pub(crate) fn container_status(
        &self,
        id: &str,
    ) -> Result<proto::ContainerStatusResponse, Status> {
        let container = self
            .containers
            .get(id)
            .ok_or_else(|| Status::unknown(format!("container \"{id}\" not found")))?;
        Ok(proto::ContainerStatusResponse {
            status: Some(proto::ContainerStatus {
                id: id.to_owned(),
                metadata: container.config.metadata.clone(),
                state: container.state.into(),
                created_at: container.created_at,
                started_at: container.started_at,
                finished_at: container.finished_at,
                exit_code: 0,
                image: container.config.image.clone(),
                image_ref: container.image_ref(),
                labels: container.config.labels.clone(),
                annotations: container.config.annotations.clone(),
                log_path: container.log_path.display().to_string(),
                ..Default::default()
            }),
        })
    }

    // ---- images ----

    pub(crate) fn list_images(&self) -> proto::ListImagesResponse {
        proto::ListImagesResponse {
            images: self.images.iter().map(|name| image(name)).collect(),
        }
    }

    /// Every image is present: one not seen before is "pulled" on the spot.
    pub(crate) fn image_status(
        &mut self,
        spec: Option<&proto::ImageSpec>,
    ) -> proto::ImageStatusResponse {
        let image = spec.filter(|spec| !spec.image.is_empty()).map(|spec| {
            self.images.insert(spec.image.clone());
            image(&spec.image)
        });
        proto::ImageStatusResponse { image }
    }

    pub(crate) fn pull_image(
        &mut self,
        spec: Option<&proto::ImageSpec>,
    ) -> Result<proto::PullImageResponse, Status> {
        let name = spec
            .map(|spec| spec.image.clone())
            .filter(|name| !name.is_empty())
            .ok_or_else(|| Status::invalid_argument("PullImage without an image"))?;
        self.images.insert(name.clone());
        Ok(proto::PullImageResponse { image_ref: name })
    }
}

impl Container {
    fn stop(&mut self, now: i64) {
        if matches!(
            self.state,
            ContainerState::ContainerCreated | ContainerState::ContainerRunning
        ) {
            self.state = ContainerState::ContainerExited;
            self.finished_at = now;
        }
    }

    /// The image's id: the image name, as `PullImage` answers.
    fn image_ref(&self) -> String {
        self.config
            .image
            .as_ref()
            .map(|image| image.image.clone())
            .unwrap_or_default()
    }
}

fn create_log_file(path: &Path) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::File::options()
        .create(true)
        .append(true)
        .open(path)
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox_config(logs: &Path, name: &str) -> proto::PodSandboxConfig {
        proto::PodSandboxConfig {
            metadata: Some(proto::PodSandboxMetadata {
                name: name.into(),
                uid: format!("uid-{name}"),
                namespace: "ns".into(),
                attempt: 0,
            }),
            log_directory: logs.join(name).display().to_string(),
            labels: [("io.kubernetes.pod.uid".to_owned(), format!("uid-{name}"))].into(),
            ..Default::default()
        }
    }

    fn run(state: &mut State, logs: &Path, name: &str) -> String {
        state
            .run_pod_sandbox(proto::RunPodSandboxRequest {
                config: Some(sandbox_config(logs, name)),
                runtime_handler: String::new(),
            })
            .unwrap()
            .pod_sandbox_id
    }

    fn create(
        state: &mut State,
        logs: &Path,
        sandbox: &str,
        pod: &str,
        name: &str,
    ) -> Result<String, Status> {
        state
            .create_container(proto::CreateContainerRequest {
                pod_sandbox_id: sandbox.into(),
                config: Some(proto::ContainerConfig {
                    metadata: Some(proto::ContainerMetadata {
                        name: name.into(),
                        attempt: 0,
                    }),
                    image: Some(proto::ImageSpec {
                        image: "busybox:latest".into(),
                        ..Default::default()
                    }),
                    log_path: format!("{name}/0.log"),
                    cdi_devices: vec![proto::CdiDevice {
                        name: "vendor.com/gpu=gpu-0".into(),
                    }],
                    envs: vec![proto::KeyValue {
                        key: "GREETING".into(),
                        value: b"hello".to_vec(),
                    }],
                    ..Default::default()
                }),
                sandbox_config: Some(sandbox_config(logs, pod)),
            })
            .map(|response| response.container_id)
    }

    fn status(state: &State, id: &str) -> proto::ContainerStatus {
        state.container_status(id).unwrap().status.unwrap()
    }

    #[test]
    fn a_pod_goes_through_its_states_and_is_removed() {
        let logs = tempfile::tempdir().unwrap();
        let mut state = State::default();
        let sandbox = run(&mut state, logs.path(), "p");
        assert_eq!(sandbox, "p_ns_uid-p_0");
        let id = create(&mut state, logs.path(), &sandbox, "p", "c").unwrap();
        assert_eq!(id, "p_ns_uid-p_0_c_0");

        let created = status(&state, &id);
        assert_eq!(created.state(), ContainerState::ContainerCreated);
        // The log file is real and its path absolute.
        let log = logs.path().join("p/c/0.log");
        assert_eq!(created.log_path, log.display().to_string());
        assert!(log.is_file());

        state.start_container(&id).unwrap();
        let running = status(&state, &id);
        assert_eq!(running.state(), ContainerState::ContainerRunning);
        assert!(running.started_at > 0);
        assert_eq!(running.finished_at, 0);
        assert!(state.start_container(&id).is_err(), "started twice");
        assert_eq!(
            state.start_container("nope").unwrap_err().code(),
            tonic::Code::NotFound
        );

        state.stop_container(&id);
        state.stop_container(&id);
        let exited = status(&state, &id);
        assert_eq!(exited.state(), ContainerState::ContainerExited);
        assert!(exited.finished_at >= exited.started_at);
        assert_eq!(exited.exit_code, 0);

        state.stop_pod_sandbox(&sandbox);
        let sandbox_status = state.pod_sandbox_status(&sandbox).unwrap().status.unwrap();
        assert_eq!(sandbox_status.state(), PodSandboxState::SandboxNotready);
        assert_eq!(sandbox_status.network.unwrap().ip, POD_IP);

        state.remove_container(&id);
        state.remove_container(&id);
        let gone = state.container_status(&id).unwrap_err();
        assert_eq!(gone.code(), tonic::Code::Unknown);
        assert_eq!(gone.message(), format!("container \"{id}\" not found"));

        state.stop_pod_sandbox(&sandbox);
        state.remove_pod_sandbox(&sandbox);
        state.remove_pod_sandbox(&sandbox);
        state.stop_pod_sandbox(&sandbox);
        assert_eq!(
            state.pod_sandbox_status(&sandbox).unwrap_err().code(),
            tonic::Code::NotFound
        );
        assert!(state.list_pod_sandbox(None).items.is_empty());

        // What the kubelet passed stays queryable after the removal.
        let [record] = state.records() else {
            panic!("one record: {:?}", state.records())
        };
        assert_eq!(record.pod, "ns/p");
        assert_eq!(record.cdi_devices, ["vendor.com/gpu=gpu-0"]);
        assert_eq!(record.env("GREETING"), Some("hello"));
    }

    #[test]
    fn stopping_a_sandbox_stops_its_containers_and_removing_it_removes_them() {
        let logs = tempfile::tempdir().unwrap();
        let mut state = State::default();
        let sandbox = run(&mut state, logs.path(), "p");
        let id = create(&mut state, logs.path(), &sandbox, "p", "c").unwrap();
        state.start_container(&id).unwrap();
        state.stop_pod_sandbox(&sandbox);
        assert_eq!(status(&state, &id).state(), ContainerState::ContainerExited);
        state.remove_pod_sandbox(&sandbox);
        assert!(state.list_containers(None).containers.is_empty());
    }

    #[test]
    fn lists_filter_by_id_state_sandbox_and_labels() {
        let logs = tempfile::tempdir().unwrap();
        let mut state = State::default();
        let a = run(&mut state, logs.path(), "a");
        let b = run(&mut state, logs.path(), "b");
        let a_c = create(&mut state, logs.path(), &a, "a", "c").unwrap();
        let b_c = create(&mut state, logs.path(), &b, "b", "c").unwrap();
        state.start_container(&a_c).unwrap();
        state.stop_pod_sandbox(&b);

        let sandboxes = |filter: proto::PodSandboxFilter| -> Vec<String> {
            state
                .list_pod_sandbox(Some(&filter))
                .items
                .into_iter()
                .map(|item| item.id)
                .collect()
        };
        assert_eq!(
            sandboxes(proto::PodSandboxFilter::default()),
            [a.clone(), b.clone()]
        );
        // A set but empty state filter means SANDBOX_READY.
        let ready = proto::PodSandboxFilter {
            state: Some(proto::PodSandboxStateValue::default()),
            ..Default::default()
        };
        assert_eq!(sandboxes(ready), [a.as_str()]);
        let by_uid = proto::PodSandboxFilter {
            label_selector: [("io.kubernetes.pod.uid".to_owned(), "uid-b".to_owned())].into(),
            ..Default::default()
        };
        assert_eq!(sandboxes(by_uid), [b.as_str()]);
        let by_id = proto::PodSandboxFilter {
            id: b.clone(),
            ..Default::default()
        };
        assert_eq!(sandboxes(by_id), [b.as_str()]);

        let containers = |filter: proto::ContainerFilter| -> Vec<String> {
            state
                .list_containers(Some(&filter))
                .containers
                .into_iter()
                .map(|container| container.id)
                .collect()
        };
        let running = proto::ContainerFilter {
            state: Some(proto::ContainerStateValue {
                state: ContainerState::ContainerRunning.into(),
            }),
            ..Default::default()
        };
        assert_eq!(containers(running), [a_c.as_str()]);
        let in_b = proto::ContainerFilter {
            pod_sandbox_id: b.clone(),
            ..Default::default()
        };
        assert_eq!(containers(in_b), [b_c.as_str()]);
        assert_eq!(state.list_containers(None).containers.len(), 2);
    }

    #[test]
    fn the_first_create_of_a_chosen_pod_fails_once() {
        let logs = tempfile::tempdir().unwrap();
        let mut state = State::new(
            DEFAULT_IMAGES.map(str::to_owned),
            ["ns/p".to_owned()].into(),
        );
        let sandbox = run(&mut state, logs.path(), "p");
        let failed = create(&mut state, logs.path(), &sandbox, "p", "c").unwrap_err();
        assert_eq!(failed.code(), tonic::Code::Unknown);
        assert!(state.records().is_empty());
        // The retry has the same attempt, and gets the id the failed one would have had.
        assert_eq!(
            create(&mut state, logs.path(), &sandbox, "p", "c").unwrap(),
            "p_ns_uid-p_0_c_0"
        );
        assert_eq!(
            create(&mut state, logs.path(), &sandbox, "p", "c")
                .unwrap_err()
                .code(),
            tonic::Code::AlreadyExists
        );
    }

    #[test]
    fn a_relative_log_path_is_refused() {
        let mut state = State::default();
        let sandbox = run(&mut state, Path::new(""), "p");
        let refused = create(&mut state, Path::new(""), &sandbox, "p", "c").unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn every_image_is_present() {
        let mut state = State::new(DEFAULT_IMAGES.map(str::to_owned), BTreeSet::new());
        assert_eq!(state.list_images().images.len(), 3);
        let spec = proto::ImageSpec {
            image: "example.com/new:1".into(),
            ..Default::default()
        };
        let image = state.image_status(Some(&spec)).image.unwrap();
        assert_eq!(image.id, "example.com/new:1");
        assert_eq!(image.size, IMAGE_SIZE);
        assert_eq!(
            state.pull_image(Some(&spec)).unwrap().image_ref,
            "example.com/new:1"
        );
        assert_eq!(state.list_images().images.len(), 4);
        assert!(state.image_status(None).image.is_none());
    }
}
