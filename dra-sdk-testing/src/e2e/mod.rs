//! End-to-end tests against real Kubernetes components: etcd, the API server, the scheduler,
//! the controller manager and one kubelet per node, started from a directory of binaries in a
//! temporary folder, on loopback ports chosen at run time. The envtest of DRA: a driver's
//! plugin registers with a real kubelet, publishes to a real API server, its devices are
//! allocated by the real scheduler and prepared when real pods start, all inside `cargo test`,
//! without containers.
//!
//! The kubelet's container runtime is the test kit's [`CriDouble`](crate::cri::CriDouble),
//! served in the test process on the node's `cri.sock`: pods and containers reach Running
//! without a process being started, and it logs every CRI call to the node's `cri.jsonl`,
//! including the CDI device names, mounts and environment the kubelet passed for each
//! container ([`CriLog`]). That is how a test sees that what the plugin prepared reached the
//! runtime.
//!
//! # Where the binaries come from
//!
//! [`ENV_BINARIES`] (`DRA_E2E_K8S_BIN`) names a directory with `kube-apiserver`,
//! `kube-controller-manager`, `kube-scheduler` and `kubelet` (from the official Kubernetes
//! *server binaries* archive, `kubernetes-server-linux-amd64.tar.gz`) and `etcd` (from an
//! upstream etcd release). Nothing else: the container runtime is the test kit's own. Without
//! it, [`binaries_or_skip`] prints one line saying the end-to-end tests are skipped and returns
//! `None`; with [`ENV_REQUIRED`] (`DRA_E2E_REQUIRED=1`) it panics instead, so a run that must
//! run them can never pass green without. `docs/testing.md` says how to get the binaries.
//!
//! # A cluster for the tests of one binary
//!
//! Starting a cluster takes about 10 s; share one between the tests of a test binary and keep
//! them apart with namespaces and driver names. [`RealClusterBuilder::start`] needs no particular
//! runtime (the components are processes, the waits are plain futures), so the cluster can
//! live in a `static` initialised by whichever test comes first:
//!
//! ```no_run
//! use dra_sdk_testing::e2e::{RealCluster, binaries_or_skip};
//! use tokio::sync::OnceCell;
//!
//! static CLUSTER: OnceCell<RealCluster> = OnceCell::const_new();
//!
//! async fn cluster() -> Option<&'static RealCluster> {
//!     let binaries = binaries_or_skip()?;
//!     Some(
//!         CLUSTER
//!             .get_or_init(|| async {
//!                 RealCluster::builder(binaries).start().await.expect("e2e cluster")
//!             })
//!             .await,
//!     )
//! }
//!
//! #[tokio::test]
//! async fn pods_get_my_devices() {
//!     let Some(cluster) = cluster().await else { return };
//!     let client = cluster.client().await.unwrap();
//!     let namespace = cluster.create_namespace("my-test").await.unwrap();
//!     // start the plugin with `cluster.plugin(...)`, create pods, read `cluster.cri_log(...)`
//! }
//! ```
//!
//! Every process dies with its cluster: when it is dropped, when a test panics, and also when
//! the test process is killed (see [`pdeath_signal_supported`]). A cluster in a `static` is
//! never dropped; its processes end with the test process and its folder is removed by the
//! next cluster started on the machine.

mod cluster;
mod cri;
mod node;
mod pki;
mod process;
pub mod suite;
pub mod workload;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::Duration;

pub use self::cluster::{RealCluster, RealClusterBuilder, ServedVersions};
pub use self::cri::{CriCall, CriLog};
pub use self::node::{KubeletNode, Registration, node_ready};
pub use self::pki::PkiError;
pub use self::process::{
    ENV_SHARED_DEVICE_PLUGINS, ManagedProcess, mount_namespaces_available, pdeath_signal_supported,
};

/// Environment variable naming the directory of the Kubernetes binaries.
pub const ENV_BINARIES: &str = "DRA_E2E_K8S_BIN";
/// Environment variable that turns a missing [`ENV_BINARIES`] into a test failure, for runs
/// that must run the end-to-end tests.
pub const ENV_REQUIRED: &str = "DRA_E2E_REQUIRED";
/// Environment variable: keep the cluster's folder (logs, certificates, kubelet directories)
/// after the cluster is dropped, for a look after a failure.
pub const ENV_KEEP: &str = "DRA_E2E_KEEP";

/// Every DRA feature gate of Kubernetes 1.36 (and the ones they need), all on by default.
pub const FEATURE_GATES: &[&str] = &[
    "DynamicResourceAllocation",
    "DRAAdminAccess",
    "DRAPrioritizedList",
    "DRAConsumableCapacity",
    "DRADeviceBindingConditions",
    "DRADeviceTaints",
    "DRADeviceTaintRules",
    "DRAExtendedResource",
    "DRAListTypeAttributes",
    "DRANodeAllocatableResources",
    "DRAPartitionableDevices",
    "DRAResourceClaimDeviceStatus",
    "DRAResourceClaimGranularStatusAuthorization",
    "DRAResourcePoolStatus",
    "DRASchedulerFilterTimeout",
    "DRAWorkloadResourceClaims",
    "GenericWorkload",
    "ResourceHealthStatus",
    "ResourceHealthStatusMessage",
];

/// Why a cluster could not start, or an operation on it failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum E2eError {
    /// A binary is missing from the configured directory.
    #[error("{binary} not found in {dir} (set {ENV_BINARIES} to a directory with the Kubernetes binaries; see docs/testing.md)", dir = dir.display())]
    MissingBinary {
        /// The binary, e.g. `kube-apiserver`.
        binary: &'static str,
        /// The directory it was looked for in.
        dir: PathBuf,
    },
    /// A file or directory operation failed.
    #[error("{action}: {source}")]
    Io {
        /// What was being done.
        action: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The certificates could not be made.
    #[error(transparent)]
    Pki(#[from] PkiError),
    /// A node's CRI double could not start.
    #[error(transparent)]
    Cri(#[from] crate::cri::CriError),
    /// A component exited while it was awaited.
    #[error("{component} exited ({status}); last lines of {log}:\n{tail}", log = log.display())]
    Exited {
        /// The component.
        component: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// Its log file.
        log: PathBuf,
        /// The end of its log.
        tail: String,
    },
    /// A component did not become ready in time.
    #[error("{component} not ready after {timeout:?}: {waiting_for}; last lines of {log}:\n{tail}", log = log.display())]
    NotReady {
        /// The component.
        component: String,
        /// What was awaited, e.g. `GET /readyz`.
        waiting_for: String,
        /// How long it was given.
        timeout: Duration,
        /// Its log file.
        log: PathBuf,
        /// The end of its log.
        tail: String,
    },
    /// The cluster has no node of this name.
    #[error("the cluster has no node {0}")]
    UnknownNode(String),
    /// A client of the API server could not be made.
    #[error("creating an API client from {kubeconfig}: {message}", kubeconfig = kubeconfig.display())]
    Client {
        /// The kubeconfig.
        kubeconfig: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// An API request failed.
    #[error("{action}: {source}")]
    Api {
        /// What was being done, e.g. `create Namespace e2e-1`.
        action: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// Something a test waited for did not happen in time.
    #[error("timed out after {timeout:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        timeout: Duration,
    },
}

pub(crate) fn io_error(action: impl Into<String>) -> impl FnOnce(std::io::Error) -> E2eError {
    let action = action.into();
    move |source| E2eError::Io { action, source }
}

pub(crate) fn api_error(action: impl Into<String>) -> impl FnOnce(kube::Error) -> E2eError {
    let action = action.into();
    move |source| E2eError::Api { action, source }
}

/// The directory of binaries named by [`ENV_BINARIES`], or `None` after printing, once per
/// process, that the end-to-end tests are skipped.
///
/// The line goes straight to the process's standard error, past the test harness's output
/// capture, so a run without the binaries always says so.
///
/// # Panics
///
/// When [`ENV_REQUIRED`] is set (to anything but `0` or empty) and [`ENV_BINARIES`] is not:
/// CI must never pass without running the end-to-end tests.
pub fn binaries_or_skip() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(ENV_BINARIES).filter(|dir| !dir.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    let required = std::env::var(ENV_REQUIRED).is_ok_and(|value| !value.is_empty() && value != "0");
    assert!(
        !required,
        "{ENV_REQUIRED} is set but {ENV_BINARIES} is not: the end-to-end tests cannot run"
    );
    static SAID: Once = Once::new();
    SAID.call_once(|| {
        let _ = writeln!(
            std::io::stderr(),
            "e2e: skipped: {ENV_BINARIES} is not set (a directory with kube-apiserver, etcd, \
             kubelet, ...; see docs/testing.md)"
        );
    });
    None
}

/// The binaries a cluster runs, checked to exist.
pub(crate) struct Binaries {
    dir: PathBuf,
}

impl Binaries {
    const REQUIRED: [&'static str; 5] = [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubelet",
    ];

    pub(crate) fn new(dir: &Path) -> Result<Self, E2eError> {
        for binary in Self::REQUIRED {
            if !dir.join(binary).is_file() {
                return Err(E2eError::MissingBinary {
                    binary,
                    dir: dir.to_owned(),
                });
            }
        }
        Ok(Self {
            dir: dir.to_owned(),
        })
    }

    pub(crate) fn path(&self, binary: &str) -> PathBuf {
        self.dir.join(binary)
    }
}
