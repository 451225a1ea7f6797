//! The [`Deployment`](super::MpsRunner::Deployment) runner: each MPS control daemon runs as a
//! Deployment `mps-control-daemon-<id>` in the plugin's namespace, as upstream, so that it
//! outlives the plugin's container (a container restart, a DaemonSet upgrade): the kubelet
//! keeps the daemon's pod running whatever happens to the plugin's.
//!
//! # The Deployment
//!
//! One replica, strategy `Recreate` (two daemons must never share a pipe directory), pinned to
//! the node with `nodeName` (no scheduler involved, so it tolerates every taint), `hostPID`,
//! one privileged container running the plugin's image (`--image-name`) with:
//!
//! * `CUDA_VISIBLE_DEVICES=<uuids>`, `CUDA_MPS_PIPE_DIRECTORY=<pipe>`,
//!   `CUDA_MPS_LOG_DIRECTORY=<log>` (node paths);
//! * the node's driver root (`--nvidia-driver-root`) mounted on `/driver-root`;
//! * `nvidia-cuda-mps-control -f [-M]` (foreground: the container *is* the daemon) run through
//!   the driver root's own `chroot` into `/driver-root` when the driver root has one (a full
//!   OS tree, as on a host-installed driver or the GPU operator's driver container), with the
//!   pipe, log and shm directories mounted under `/driver-root` at their node paths (shm on
//!   `/driver-root/dev/shm`); directly as `/driver-root/<path>/nvidia-cuda-mps-control`
//!   otherwise (a driver root without `chroot`, such as GKE's), the directories then mounted
//!   at their node paths and shm on `/dev/shm`. The plugin's image is distroless: the `chroot`
//!   binary must come from the driver root;
//! * labels `app.kubernetes.io/managed-by=gpu-kubelet-plugin`,
//!   `resource.nvidia.com/mps-daemon=<id>` (also the pod selector) and
//!   `resource.nvidia.com/mps-claim-uid=<claim UID>`.
//!
//! The pod pulls the image with the plugin's `--image-pull-policy` and
//! `--image-pull-secrets` and runs as `--service-account-name` (upstream's flags), so a
//! private registry or a policy requiring named accounts serves the daemon as it serves the
//! plugin. A readiness probe runs the plugin's own binary from the image
//! ([`PROBE_SUBCOMMAND`]: the image has no shell) to check that the daemon's control socket
//! exists; the plugin's readiness wait below checks the same socket from its side too.
//!
//! # Lifecycle
//!
//! * Create: `AlreadyExists` for a Deployment with the same daemon (image, command,
//!   environment, node, volumes) is adopted; one with another (an upgrade changed the image)
//!   is deleted and created again.
//! * Ready: the Deployment reports `readyReplicas` 1, one of its pods has every container
//!   Ready, and the daemon's control socket `<pipe>/control` exists, checked with the same
//!   backoff as a host process (upstream's: 1 s, doubling, 4 steps, at most 10 s).
//! * Stop: delete with `Foreground` propagation, then wait (at most
//!   [`MpsSettings::delete_timeout`](super::MpsSettings::delete_timeout)) until it is gone.
//!
//! The calls are blocking (the sharing code runs on blocking threads); they run on the
//! plugin's runtime through its handle.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::core::v1::{
    Container, EnvVar, ExecAction, HostPathVolumeSource, LocalObjectReference, Pod, PodSpec,
    PodTemplateSpec, Probe, SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde::{Deserialize, Serialize};

use super::{MpsDaemonRecord, Readiness};
use crate::cdi::{BINARY_DIRS, DriverRoot, LIBRARY_DIRS};
use crate::host::HostError;
use crate::sharing::{MPS_CONTROL, SharingError};

/// Prefix of the Deployments' names (upstream's).
pub const NAME_PREFIX: &str = "mps-control-daemon-";
/// Where the daemon's container mounts the node's driver root.
pub const CONTAINER_DRIVER_ROOT: &str = "/driver-root";
/// The name of the daemon's container.
pub const CONTAINER_NAME: &str = "mps-control-daemon";
/// The label every daemon Deployment of this driver carries, with [`MANAGED_BY`].
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "gpu-kubelet-plugin";
/// The label naming the daemon (`<claim UID>-<group index>`); also the pod selector.
pub const DAEMON_LABEL: &str = "resource.nvidia.com/mps-daemon";
/// The label naming the claim the daemon serves.
pub const CLAIM_LABEL: &str = "resource.nvidia.com/mps-claim-uid";

/// The name of the Deployment of daemon `id`.
pub fn deployment_name(id: &str) -> String {
    format!("{NAME_PREFIX}{id}")
}

/// What the plugin's flags say about daemon Deployments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MpsDeploymentConfig {
    /// The namespace the Deployments go to: the plugin's own (`--namespace`, the downward
    /// API's `metadata.namespace` in the chart).
    pub namespace: String,
    /// The image the daemon's container runs (`--image-name`: the plugin's own image).
    pub image: String,
    /// The container's `imagePullPolicy` (`--image-pull-policy`); the cluster's default
    /// when `None`.
    pub image_pull_policy: Option<ImagePullPolicy>,
    /// Secrets the pod pulls the image with (`--image-pull-secrets`): the plugin's own, so
    /// that a private registry serves the daemon as it serves the plugin.
    pub image_pull_secrets: Vec<String>,
    /// The pod's service account (`--service-account-name`); the namespace's `default` when
    /// `None`. The daemon calls no API: this only satisfies clusters whose policies require
    /// a named account.
    pub service_account_name: Option<String>,
}

impl MpsDeploymentConfig {
    /// Deployments of `image` in `namespace`, with the cluster's defaults for the rest.
    pub fn new(namespace: impl Into<String>, image: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            image: image.into(),
            image_pull_policy: None,
            image_pull_secrets: Vec::new(),
            service_account_name: None,
        }
    }
}

/// A container's `imagePullPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "PascalCase")]
pub enum ImagePullPolicy {
    /// Pull on every start.
    Always,
    /// Pull when the node lacks the image.
    IfNotPresent,
    /// Never pull.
    Never,
}

impl ImagePullPolicy {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::IfNotPresent => "IfNotPresent",
            Self::Never => "Never",
        }
    }
}

/// A daemon's Deployment, as its [`MpsDaemonRecord`] keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name (`mps-control-daemon-<id>`).
    pub name: String,
    /// Its UID: a Deployment of the same name with another UID was made by someone else
    /// (or again, after it was deleted).
    pub uid: String,
}

impl std::fmt::Display for DeploymentRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Deployment {}/{}", self.namespace, self.name)
    }
}

/// How the daemon's container runs `nvidia-cuda-mps-control` from the driver root, found
/// once per operation ([`Tools::find`](crate::sharing::Tools::find)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonCommand {
    /// The driver root on the node: the daemon container's [`CONTAINER_DRIVER_ROOT`].
    pub node_root: PathBuf,
    /// `nvidia-cuda-mps-control` relative to the driver root; `None` when it has none.
    pub mps_control: Option<String>,
    /// The driver root's `chroot`, relative to it; `None`: the daemon runs without one.
    pub chroot: Option<String>,
    /// The directory of `libcuda.so.1` relative to the driver root, for `LD_LIBRARY_PATH`
    /// when the daemon runs without `chroot`.
    pub library_dir: Option<String>,
}

impl DaemonCommand {
    /// Looks the binaries and the library up in `driver_root`.
    pub fn find(driver_root: &DriverRoot) -> Result<Self, HostError> {
        let library_dir = driver_root
            .find_relative(&LIBRARY_DIRS, &["libcuda.so.1"])?
            .and_then(|path| {
                Path::new(&path)
                    .parent()
                    .map(|dir| dir.display().to_string())
            });
        Ok(Self {
            node_root: driver_root.node_path().to_owned(),
            mps_control: driver_root.find_relative(&BINARY_DIRS, &[MPS_CONTROL])?,
            chroot: driver_root.find_relative(&BINARY_DIRS, &["chroot"])?,
            library_dir,
        })
    }

    /// Where the container mounts the daemon's directories: under the driver root when the
    /// daemon is chrooted there, so that it finds them at their node paths.
    fn mount_prefix(&self) -> &str {
        if self.chroot.is_some() {
            CONTAINER_DRIVER_ROOT
        } else {
            ""
        }
    }

    /// The container's command line and extra environment.
    fn command(
        &self,
        record: &MpsDaemonRecord,
    ) -> Result<(Vec<String>, Vec<EnvVar>), SharingError> {
        let Some(binary) = &self.mps_control else {
            return Err(SharingError::Daemon {
                id: record.id.clone(),
                reason: format!(
                    "{MPS_CONTROL} not found in the driver root {} (looked in {})",
                    self.node_root.display(),
                    BINARY_DIRS.join(", ")
                ),
            });
        };
        let in_root = |relative: &str| format!("{CONTAINER_DRIVER_ROOT}{relative}");
        let mut command = match &self.chroot {
            Some(chroot) => vec![
                in_root(chroot),
                CONTAINER_DRIVER_ROOT.to_owned(),
                binary.clone(),
            ],
            None => vec![in_root(binary)],
        };
        command.push("-f".to_owned());
        if record.multi_user {
            command.push("-M".to_owned());
        }
        let mut env = Vec::new();
        if let (None, Some(dir)) = (&self.chroot, &self.library_dir) {
            env.push(env_var("LD_LIBRARY_PATH", in_root(dir)));
        }
        Ok((command, env))
    }
}

/// The hidden first argument that makes the plugin's binary the daemon's readiness probe.
pub const PROBE_SUBCOMMAND: &str = "__mps-control-ready";

/// Where the plugin's image has its binary, which the probe runs in the daemon's container
/// (the daemon's image is the plugin's, `--image-name`).
pub const IMAGE_BINARY: &str = "/usr/bin/gpu-kubelet-plugin";

/// Ready when the daemon's control socket exists: the daemon creates it once it accepts
/// clients. An exec probe of the plugin's own binary, since the image has no shell; it only
/// looks at the file and never connects, so the daemon sees no stray client.
fn readiness_probe(control_socket: String) -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(vec![
                IMAGE_BINARY.to_owned(),
                PROBE_SUBCOMMAND.to_owned(),
                control_socket,
            ]),
        }),
        period_seconds: Some(2),
        timeout_seconds: Some(5),
        failure_threshold: Some(3),
        ..Probe::default()
    }
}

/// When this process was started as the daemon's readiness probe (first argument
/// [`PROBE_SUBCOMMAND`], then the control socket's path), exits 0 if that path is a Unix
/// socket and 1 (saying why on standard error) otherwise; returns at once when not.
pub fn probe_if_requested() {
    let mut args = std::env::args_os();
    if args.nth(1).as_deref() != Some(std::ffi::OsStr::new(PROBE_SUBCOMMAND)) {
        return;
    }
    let Some(socket) = args.next() else {
        eprintln!("{PROBE_SUBCOMMAND}: expected the control socket's path");
        std::process::exit(2);
    };
    match control_socket_ready(Path::new(&socket)) {
        Ok(()) => std::process::exit(0),
        Err(reason) => {
            eprintln!("{PROBE_SUBCOMMAND}: {reason}");
            std::process::exit(1);
        }
    }
}

/// Whether `socket` is a Unix socket; why not otherwise.
pub fn control_socket_ready(socket: &Path) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt as _;
    match std::fs::metadata(socket) {
        Ok(metadata) if metadata.file_type().is_socket() => Ok(()),
        Ok(_) => Err(format!("{} is not a socket", socket.display())),
        Err(error) => Err(format!("{}: {error}", socket.display())),
    }
}

fn env_var(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value.into()),
        ..EnvVar::default()
    }
}

fn host_path_volume(name: &str, path: &Path) -> Volume {
    Volume {
        name: name.to_owned(),
        host_path: Some(HostPathVolumeSource {
            path: path.display().to_string(),
            type_: Some("Directory".to_owned()),
        }),
        ..Volume::default()
    }
}

fn volume_mount(name: &str, path: String) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: path,
        ..VolumeMount::default()
    }
}

/// A daemon Deployment of this driver on this node, as [`DeploymentRunner::ours`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedDeployment {
    /// The Deployment.
    pub deployment: DeploymentRef,
    /// The daemon ID of its [`DAEMON_LABEL`].
    pub id: String,
    /// How long ago it was created (zero when the server did not say).
    pub age: Duration,
}

/// Creates, checks and deletes daemon Deployments; see the [module documentation](self).
/// Cheap to clone.
#[derive(Clone)]
pub struct DeploymentRunner {
    client: kube::Client,
    runtime: tokio::runtime::Handle,
    node_name: String,
    // Shared: a runner is cloned into every operation.
    config: std::sync::Arc<MpsDeploymentConfig>,
}

impl std::fmt::Debug for DeploymentRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeploymentRunner")
            .field("node_name", &self.node_name)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Whether the server answered with this HTTP status.
fn is_status(error: &kube::Error, code: u16) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == code)
}

impl DeploymentRunner {
    /// A runner for the daemons of `node_name`, calling the API server with `client` on
    /// `runtime` (the plugin's).
    pub fn new(
        client: kube::Client,
        runtime: tokio::runtime::Handle,
        node_name: impl Into<String>,
        config: MpsDeploymentConfig,
    ) -> Self {
        Self {
            client,
            runtime,
            node_name: node_name.into(),
            config: std::sync::Arc::new(config),
        }
    }

    /// The flags it runs with.
    pub fn config(&self) -> &MpsDeploymentConfig {
        &self.config
    }

    fn deployments(&self, namespace: &str) -> Api<Deployment> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// The Deployment of `record`'s daemon, as it is created.
    pub fn build(
        &self,
        record: &MpsDaemonRecord,
        daemon: &DaemonCommand,
    ) -> Result<Deployment, SharingError> {
        let (command, extra_env) = daemon.command(record)?;
        let claim_uid = record
            .id
            .rsplit_once('-')
            .map_or(record.id.as_str(), |(uid, _)| uid);
        let selector = BTreeMap::from([(DAEMON_LABEL.to_owned(), record.id.clone())]);
        let mut labels = selector.clone();
        labels.insert(MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned());
        labels.insert(CLAIM_LABEL.to_owned(), claim_uid.to_owned());
        labels.insert(
            "app.kubernetes.io/name".to_owned(),
            CONTAINER_NAME.to_owned(),
        );
        let mut env = vec![
            env_var("CUDA_VISIBLE_DEVICES", record.uuids.join(",")),
            env_var(
                "CUDA_MPS_PIPE_DIRECTORY",
                record.pipe_dir().display().to_string(),
            ),
            env_var(
                "CUDA_MPS_LOG_DIRECTORY",
                record.log_dir().display().to_string(),
            ),
        ];
        env.extend(extra_env);
        let prefix = daemon.mount_prefix();
        let control_socket = format!("{prefix}{}/control", record.pipe_dir().display());
        let container = Container {
            name: CONTAINER_NAME.to_owned(),
            image: Some(self.config.image.clone()),
            image_pull_policy: self
                .config
                .image_pull_policy
                .map(|policy| policy.as_str().to_owned()),
            command: Some(command),
            env: Some(env),
            readiness_probe: Some(readiness_probe(control_socket)),
            security_context: Some(SecurityContext {
                privileged: Some(true),
                ..SecurityContext::default()
            }),
            volume_mounts: Some(vec![
                volume_mount("driver-root", CONTAINER_DRIVER_ROOT.to_owned()),
                volume_mount(
                    "mps-pipe",
                    format!("{prefix}{}", record.pipe_dir().display()),
                ),
                volume_mount("mps-log", format!("{prefix}{}", record.log_dir().display())),
                volume_mount("mps-shm", format!("{prefix}/dev/shm")),
            ]),
            ..Container::default()
        };
        let pod = PodSpec {
            node_name: Some(self.node_name.clone()),
            host_pid: Some(true),
            containers: vec![container],
            image_pull_secrets: (!self.config.image_pull_secrets.is_empty()).then(|| {
                self.config
                    .image_pull_secrets
                    .iter()
                    .map(|name| LocalObjectReference { name: name.clone() })
                    .collect()
            }),
            service_account_name: self.config.service_account_name.clone(),
            // Pinned with nodeName: the scheduler's taint checks do not apply, but a
            // NoExecute taint would still evict it.
            tolerations: Some(vec![Toleration {
                operator: Some("Exists".to_owned()),
                ..Toleration::default()
            }]),
            volumes: Some(vec![
                host_path_volume("driver-root", &daemon.node_root),
                host_path_volume("mps-pipe", &record.pipe_dir()),
                host_path_volume("mps-log", &record.log_dir()),
                host_path_volume("mps-shm", &record.shm_dir()),
            ]),
            ..PodSpec::default()
        };
        Ok(Deployment {
            metadata: ObjectMeta {
                name: Some(deployment_name(&record.id)),
                namespace: Some(self.config.namespace.clone()),
                labels: Some(labels.clone()),
                ..ObjectMeta::default()
            },
            spec: DeploymentSpec {
                replicas: Some(1),
                selector: LabelSelector {
                    match_labels: Some(selector),
                    ..LabelSelector::default()
                },
                strategy: Some(DeploymentStrategy {
                    type_: Some("Recreate".to_owned()),
                    ..DeploymentStrategy::default()
                }),
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(labels),
                        ..ObjectMeta::default()
                    }),
                    spec: Some(pod),
                },
                ..DeploymentSpec::default()
            },
            status: None,
        })
    }

    /// Creates `desired` (from [`build`](Self::build)) for daemon `id`; see the
    /// [module documentation](self) for `AlreadyExists`.
    pub fn create(&self, id: &str, desired: &Deployment) -> Result<DeploymentRef, SharingError> {
        let name = desired.metadata.name.clone().unwrap_or_default();
        let namespace = self.config.namespace.clone();
        let api = self.deployments(&namespace);
        let what = format!("Deployment {namespace}/{name}");
        let reference = |created: &Deployment| DeploymentRef {
            namespace: namespace.clone(),
            name: name.clone(),
            uid: created.metadata.uid.clone().unwrap_or_default(),
        };
        // One replacement at most: a second AlreadyExists is an error.
        let mut replaced = false;
        loop {
            let source = match self
                .runtime
                .block_on(api.create(&PostParams::default(), desired))
            {
                Ok(created) => {
                    tracing::info!(id, deployment = %name, "MPS control daemon Deployment created");
                    return Ok(reference(&created));
                }
                Err(error) if is_status(&error, 409) && !replaced => error,
                Err(source) => {
                    return Err(SharingError::Api {
                        action: format!("creating {what}"),
                        source,
                    });
                }
            };
            tracing::debug!(id, error = %source, "MPS control daemon Deployment exists");
            replaced = true;
            let existing = self
                .runtime
                .block_on(api.get_opt(&name))
                .map_err(|source| SharingError::Api {
                    action: format!("reading {what}"),
                    source,
                })?;
            // Deleted meanwhile: create it.
            let Some(existing) = existing else { continue };
            if same_daemon(&existing, desired) {
                tracing::info!(id, deployment = %name, "MPS control daemon Deployment exists already; adopted");
                return Ok(reference(&existing));
            }
            tracing::warn!(id, deployment = %name, "MPS control daemon Deployment exists with another daemon spec; replacing it");
            self.delete(&reference(&existing), REPLACE_DELETE_TIMEOUT)?;
        }
    }

    /// The UID of the Deployment named in `deployment`, `None` when there is none.
    pub fn current_uid(&self, deployment: &DeploymentRef) -> Result<Option<String>, SharingError> {
        self.runtime
            .block_on(
                self.deployments(&deployment.namespace)
                    .get_opt(&deployment.name),
            )
            .map(|found| found.map(|d| d.metadata.uid.unwrap_or_default()))
            .map_err(|source| SharingError::Api {
                action: format!("reading {deployment}"),
                source,
            })
    }

    /// One readiness check: the Deployment, then its pod, then the control socket.
    pub fn readiness(
        &self,
        record: &MpsDaemonRecord,
        deployment: &DeploymentRef,
    ) -> Result<Readiness, SharingError> {
        let api = self.deployments(&deployment.namespace);
        let found = self
            .runtime
            .block_on(api.get_opt(&deployment.name))
            .map_err(|source| SharingError::Api {
                action: format!("reading {deployment}"),
                source,
            })?;
        let Some(found) = found else {
            return Ok(Readiness::Failed(format!(
                "{deployment} was deleted before it was ready"
            )));
        };
        let ready = found
            .status
            .as_ref()
            .and_then(|status| status.ready_replicas)
            .unwrap_or(0);
        if ready != 1 {
            return Ok(Readiness::Waiting(format!(
                "{deployment} has {ready} ready replicas, not 1"
            )));
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &deployment.namespace);
        let selector = format!("{DAEMON_LABEL}={}", record.id);
        let pods = self
            .runtime
            .block_on(pods.list(&ListParams::default().labels(&selector)))
            .map_err(|source| SharingError::Api {
                action: format!("listing the pods of {deployment}"),
                source,
            })?;
        let pod_ready = pods.items.iter().any(|pod| {
            pod.metadata.deletion_timestamp.is_none()
                && pod
                    .status
                    .as_ref()
                    .and_then(|status| status.container_statuses.as_ref())
                    .is_some_and(|statuses| {
                        !statuses.is_empty() && statuses.iter().all(|status| status.ready)
                    })
        });
        if !pod_ready {
            return Ok(Readiness::Waiting(format!(
                "no pod of {deployment} (label {selector}) has its container Ready"
            )));
        }
        let control = record.pipe_dir().join("control");
        if control.exists() {
            Ok(Readiness::Ready)
        } else {
            Ok(Readiness::Waiting(format!(
                "{deployment} is ready but {} does not exist",
                control.display()
            )))
        }
    }

    /// Deletes the Deployment (`Foreground`: its ReplicaSet and pod go first) and waits at
    /// most `timeout` until it is gone. A Deployment already gone is fine.
    pub fn delete(
        &self,
        deployment: &DeploymentRef,
        timeout: Duration,
    ) -> Result<(), SharingError> {
        let api = self.deployments(&deployment.namespace);
        match self
            .runtime
            .block_on(api.delete(&deployment.name, &DeleteParams::foreground()))
        {
            Ok(_) => {}
            Err(error) if is_status(&error, 404) => return Ok(()),
            Err(source) => {
                return Err(SharingError::Api {
                    action: format!("deleting {deployment}"),
                    source,
                });
            }
        }
        let deadline = Instant::now() + timeout;
        loop {
            let uid = self.current_uid(deployment)?;
            // Gone, or deleted and made again by someone else: ours is gone.
            if uid.is_none_or(|uid| !deployment.uid.is_empty() && uid != deployment.uid) {
                tracing::info!(deployment = %deployment.name, "MPS control daemon Deployment deleted");
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(SharingError::NotDeleted {
                    what: deployment.to_string(),
                    timeout,
                });
            }
            std::thread::sleep(DELETE_POLL.min(timeout));
        }
    }

    /// The daemon Deployments of this driver on this node (by [`MANAGED_BY_LABEL`] and the
    /// pod template's `nodeName`).
    pub fn ours(&self) -> Result<Vec<OwnedDeployment>, SharingError> {
        let namespace = &self.config.namespace;
        let selector = format!("{MANAGED_BY_LABEL}={MANAGED_BY},{DAEMON_LABEL}");
        let list = self
            .runtime
            .block_on(
                self.deployments(namespace)
                    .list(&ListParams::default().labels(&selector)),
            )
            .map_err(|source| SharingError::Api {
                action: format!("listing the MPS control daemon Deployments in {namespace}"),
                source,
            })?;
        let now = k8s_openapi::jiff::Timestamp::now();
        Ok(list
            .items
            .into_iter()
            .filter(|d| {
                d.spec
                    .template
                    .spec
                    .as_ref()
                    .and_then(|pod| pod.node_name.as_deref())
                    == Some(self.node_name.as_str())
            })
            .filter_map(|d| {
                let id = d.metadata.labels.as_ref()?.get(DAEMON_LABEL)?.clone();
                let age = d
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .and_then(|created| Duration::try_from(now.duration_since(created.0)).ok())
                    .unwrap_or_default();
                Some(OwnedDeployment {
                    deployment: DeploymentRef {
                        namespace: namespace.clone(),
                        name: d.metadata.name.clone()?,
                        uid: d.metadata.uid.clone().unwrap_or_default(),
                    },
                    id,
                    age,
                })
            })
            .collect())
    }
}

/// How long [`DeploymentRunner::create`] waits for a Deployment with another spec to go.
const REPLACE_DELETE_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a deletion is checked.
const DELETE_POLL: Duration = Duration::from_millis(200);

/// Whether `existing` runs the daemon `desired` describes: the same image, command,
/// environment, node and host paths (fields the server defaults are not compared).
fn same_daemon(existing: &Deployment, desired: &Deployment) -> bool {
    let existing = DaemonEssentials::of(existing);
    existing.is_some() && existing == DaemonEssentials::of(desired)
}

/// What makes a Deployment's daemon that daemon.
#[derive(PartialEq)]
struct DaemonEssentials<'a> {
    image: Option<&'a str>,
    command: Option<&'a [String]>,
    env: Vec<(&'a str, Option<&'a str>)>,
    node: Option<&'a str>,
    host_paths: Vec<&'a str>,
}

impl<'a> DaemonEssentials<'a> {
    fn of(deployment: &'a Deployment) -> Option<Self> {
        let pod = deployment.spec.template.spec.as_ref()?;
        let container = pod.containers.first()?;
        Some(Self {
            image: container.image.as_deref(),
            command: container.command.as_deref(),
            env: container
                .env
                .iter()
                .flatten()
                .map(|e| (e.name.as_str(), e.value.as_deref()))
                .collect(),
            node: pod.node_name.as_deref(),
            host_paths: pod
                .volumes
                .iter()
                .flatten()
                .filter_map(|v| Some(v.host_path.as_ref()?.path.as_str()))
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(multi_user: bool) -> MpsDaemonRecord {
        MpsDaemonRecord {
            id: "0b1c-0".into(),
            devices: vec!["gpu-0".into(), "gpu-1".into()],
            uuids: vec!["GPU-a".into(), "GPU-b".into()],
            exclusive_gpus: Vec::new(),
            process: crate::host::ProcessId {
                pid: 0,
                start_time: 0,
            },
            deployment: None,
            dir: PathBuf::from("/mps/0b1c-0"),
            shm_mounted: true,
            multi_user,
            control_commands: Vec::new(),
        }
    }

    fn daemon(chroot: bool) -> DaemonCommand {
        DaemonCommand {
            node_root: PathBuf::from("/run/nvidia/driver"),
            mps_control: Some("/usr/bin/nvidia-cuda-mps-control".into()),
            chroot: chroot.then(|| "/usr/sbin/chroot".into()),
            library_dir: Some("/usr/lib64".into()),
        }
    }

    #[test]
    fn chrooted_and_direct_daemons_see_their_directories_at_node_paths() {
        let (command, env) = daemon(true).command(&record(true)).unwrap();
        assert_eq!(
            command,
            [
                "/driver-root/usr/sbin/chroot",
                "/driver-root",
                "/usr/bin/nvidia-cuda-mps-control",
                "-f",
                "-M"
            ]
        );
        assert!(env.is_empty());
        assert_eq!(daemon(true).mount_prefix(), "/driver-root");

        let (command, env) = daemon(false).command(&record(false)).unwrap();
        assert_eq!(
            command,
            ["/driver-root/usr/bin/nvidia-cuda-mps-control", "-f"]
        );
        assert_eq!(env, [env_var("LD_LIBRARY_PATH", "/driver-root/usr/lib64")]);
        assert_eq!(daemon(false).mount_prefix(), "");

        let missing = DaemonCommand {
            mps_control: None,
            ..daemon(true)
        };
        assert_eq!(
            missing.command(&record(false)).unwrap_err().to_string(),
            "MPS control daemon 0b1c-0: nvidia-cuda-mps-control not found in the driver root \
             /run/nvidia/driver (looked in /usr/bin, /usr/sbin, /bin, /sbin)"
        );
    }

    #[test]
    fn a_deployment_with_another_image_is_another_daemon() {
        let pod = |image: &str, extra: Option<&str>| Deployment {
            spec: DeploymentSpec {
                template: PodTemplateSpec {
                    metadata: None,
                    spec: Some(PodSpec {
                        node_name: Some("node-1".into()),
                        containers: vec![Container {
                            image: Some(image.into()),
                            env: Some(vec![env_var("CUDA_VISIBLE_DEVICES", "GPU-a")]),
                            // A field the server defaults is not compared.
                            termination_message_path: extra.map(str::to_owned),
                            ..Container::default()
                        }],
                        ..PodSpec::default()
                    }),
                },
                ..DeploymentSpec::default()
            },
            ..Deployment::default()
        };
        assert!(same_daemon(
            &pod("plugin:1", Some("/dev/termination-log")),
            &pod("plugin:1", None)
        ));
        assert!(!same_daemon(&pod("plugin:2", None), &pod("plugin:1", None)));
        assert!(!same_daemon(&Deployment::default(), &Deployment::default()));
    }
}
