//! A CRI double: the container runtime a real kubelet talks to in the e2e harness.
//!
//! [`CriDouble`] serves the CRI v1 `RuntimeService` and `ImageService` on a Unix socket, the
//! way containerd or CRI-O would, without starting a single process:
//!
//! - every image is present: `ListImages` lists a few at start, `ImageStatus` of any image
//!   answers it present (1 MiB), `PullImage` succeeds;
//! - pod sandboxes and containers go through their states (`RunPodSandbox` → ready,
//!   `CreateContainer` → created, `StartContainer` → running, stop → exited/not ready,
//!   removal) and stop and removal are idempotent, as the CRI asks of a runtime;
//! - each container's log file is created (empty) at the sandbox's `log_directory` joined
//!   with the container's `log_path`, and its status reports that absolute path: a kubelet
//!   handed an empty log path deletes files in its working directory;
//! - the runtime and its network are ready, the cgroup driver is cgroupfs, there are no
//!   stats, and the container event stream ends at once (the kubelet then relists).
//!
//! It keeps, per container, what the kubelet passed that a DRA driver influences: the CDI
//! device names, mounts, environment and devices ([`ContainerRecord`]); a test asks
//! [`CriDouble::containers`], or reads the JSON Lines call log the builder can write
//! ([`CriDoubleBuilder::log_file`], read by [`CriLog`](super::e2e::CriLog)).
//!
//! Faults a test can inject: methods answered `Unimplemented` as a runtime built against an
//! older CRI would ([`CriDoubleBuilder::unimplemented`]), and a failed first
//! `CreateContainer` of a pod ([`CriDoubleBuilder::fail_first_create`]).
//!
//! The double is checked against the recorded CRI conversation of a real kubelet v1.36
//! (`tests/cri_recordings.rs`, over [`recordings`](super::recordings)): every request the
//! kubelet sent gets an answer of the same shape and gRPC code as the recorded runtime's.
//!
//! It runs on a thread of its own with a single-threaded tokio runtime, not on the caller's:
//! a double shared by the tests of one binary (in a `static`) must outlive each test's
//! runtime. Dropping the [`CriDouble`] stops the server, joins the thread and removes the
//! socket.
//!
//! ```
//! use dra_sdk_testing::cri::CriDouble;
//! use dra_sdk_testing::cri::proto::runtime_service_client::RuntimeServiceClient;
//! use dra_sdk_testing::cri::proto::VersionRequest;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let socket = dir.path().join("cri.sock");
//! let cri = CriDouble::builder(&socket).unimplemented(["RuntimeConfig"]).start()?;
//!
//! // A kubelet would now run with `containerRuntimeEndpoint: unix://<socket>`; here a client
//! // asks the version.
//! let mut client = RuntimeServiceClient::new(cri.connect().await?);
//! let version = client.version(VersionRequest::default()).await?.into_inner();
//! assert_eq!(version.runtime_name, "dra-sdk-cri-double");
//! assert!(cri.containers().is_empty());
//! drop(cri);
//! assert!(!socket.exists());
//! # Ok(())
//! # }
//! ```

mod faults;
mod record;
mod server;
mod service;
mod state;

use std::path::PathBuf;

pub use self::record::{ContainerRecord, CriDevice, CriEnv, CriMount};
pub use self::server::{CriDouble, CriDoubleBuilder};

/// The CRI v1 messages and the `RuntimeService`/`ImageService` servers and clients the
/// double is built on, generated from the crate's `proto/cri-v1.proto` (the part of the
/// CRI a kubelet v1.36 uses, with cri-api's field numbers).
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod proto {
    tonic::include_proto!("runtime.v1");
}

/// The encoded `google.protobuf.FileDescriptorSet` of `proto/cri-v1.proto`, for tests that
/// read and write CRI messages as protojson (with `prost-reflect`), as the replay of the
/// kubelet recordings does.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/cri-v1.bin"));

/// Why the double could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CriError {
    /// Something other than a stale socket is in the way at the socket path.
    #[error("{}: exists and is not a socket", path.display())]
    PathInUse {
        /// The socket path.
        path: PathBuf,
    },
    /// Binding the socket, or preparing its folder, failed.
    #[error("binding the CRI socket {}: {source}", path.display())]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The call log could not be opened.
    #[error("opening the CRI call log {}: {source}", path.display())]
    Log {
        /// The log path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The server's thread or runtime could not be started.
    #[error("starting the CRI double's thread: {0}")]
    Thread(#[source] std::io::Error),
}
