//! Low-level building blocks, for tools and tests that speak the kubelet's protocols
//! themselves. A driver does not need anything here: [`KubeletPlugin`](crate::plugin::KubeletPlugin)
//! binds the sockets, serves the gRPC services and rewrites `:authority` on its own.
//!
//! These items follow the kubelet's wire formats rather than the SDK's driver-facing design, so
//! they change when those formats change (a new DRA API version adds a [`proto`] module, for
//! example). Use them when you write a kubelet stand-in, a probe or a protocol test:
//!
//! - [`proto`]: the generated gRPC bindings of the registration, DRA (v1, v1beta1) and
//!   resource-health services;
//! - [`AuthorityRewriteStream`]: wraps a server connection so that tonic accepts the
//!   percent-encoded socket path the kubelet sends as HTTP/2 `:authority`;
//! - [`bind_private`] and [`remove_socket`]: the plugin's Unix-socket helpers (owner-only
//!   permissions, stale sockets replaced, regular files never removed), and [`unix_channel`],
//!   a gRPC client channel to such a socket;
//! - [`nest_v1beta1_requests`] and [`flatten_v1beta1_devices`]: the conversions the plugin
//!   applies to `resource.k8s.io/v1beta1` claims and slices, for tools that read such objects
//!   and want the `v1` shape.
//!
//! And the machinery a driver reaches only through [`KubeletPlugin`](crate::plugin::KubeletPlugin)
//! and its [`DriverContext`](crate::context::DriverContext), for tools and tests that drive it
//! directly:
//!
//! - [`checkpoint`]: the durable record of prepared claims;
//! - [`claim`]: reading and resolving allocated ResourceClaims;
//! - [`cdi`]: the CDI spec model, its validation and the per-claim spec writer;
//! - [`slices`]: the ResourceSlice publisher, slice limits per Kubernetes release, and the
//!   validation report's parts;
//! - [`metadata`]: the device metadata files of KEP-5304;
//! - [`rate_limit`]: the client-side limits of API requests;
//! - `fault_injection` (feature `fault-injection`, test-only): the named steps of prepare and
//!   unprepare, and the hook a test gives the plugin to stop it at one.

pub mod checkpoint;
#[cfg(feature = "fault-injection")]
#[cfg_attr(docsrs, doc(cfg(feature = "fault-injection")))]
pub mod fault_injection;
pub mod metadata;
pub mod proto;
pub mod rate_limit;

/// The CDI spec model behind [`ContainerEdits`](crate::cdi::ContainerEdits): specs, their
/// names and versions, and the writer of the per-claim spec files.
pub mod cdi {
    pub use crate::cdi::error::{NameKind, SpecFormat};
    pub use crate::cdi::files::{ClaimDevice, DEFAULT_CDI_ROOT, SPEC_FILE_MODE, SpecWriter};
    pub use crate::cdi::name::{
        QualifiedName, validate_class_name, validate_device_name, validate_vendor_name,
    };
    pub use crate::cdi::spec::{Device as CdiDevice, IntelRdt, NetDevice, Spec};
    pub use crate::cdi::validate::MAX_ANNOTATIONS_SIZE;
    pub use crate::cdi::version::Version as CdiVersion;
}

/// The ResourceSlice publisher behind [`DriverContext::publish`](crate::context::DriverContext::publish),
/// the slice limits of each Kubernetes release, and the parts of a validation report.
pub mod slices {
    pub use crate::slices::limits::{CounterLayout, KubernetesVersion, SliceLimits};
    pub use crate::slices::publisher::{
        Operation, PublishError, PublishEvent, PublishStats, PublisherHandle,
        ResourceSlicePublisher,
    };
    pub use crate::slices::validate::{FieldPath, Problem, ValidationError, validate_driver_name};
    pub use crate::slices::wire::{FeatureGate, ResourceApiVersion};
}

/// Reading allocated ResourceClaims the way the plugin does, for tools and tests that resolve
/// a claim themselves (the plugin hands drivers the result as a [`Claim`](crate::claim::Claim)).
pub mod claim {
    pub use crate::claim::read::{ClaimError, ReadPolicy, resolve};
}

/// Default kubelet plugin registry directory.
pub const DEFAULT_REGISTRAR_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// Default kubelet plugins directory (the plugin's sockets and data go to `<dir>/<driver>`).
pub const DEFAULT_PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";

pub use crate::claim::wire::nest_v1beta1_requests;
pub use crate::plugin::authority::{AuthorityError, AuthorityRewriteStream};
pub use crate::plugin::client::unix_channel;
pub use crate::plugin::registration::RegistrationStatus;
pub use crate::plugin::socket::{SocketError, SocketPaths, bind_private, remove_socket};
pub use crate::slices::wire::flatten_v1beta1_devices;
