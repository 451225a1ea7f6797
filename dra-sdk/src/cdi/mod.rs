//! Container Device Interface (CDI): typed specs, validation and per-claim spec files.
//!
//! The container runtime only sees what CDI spec files say: this module turns the
//! [`ContainerEdits`] a driver returns from prepare into a spec file the runtime reads, and the
//! fully qualified device names (`vendor/class=name`) the kubelet hands to it.
//!
//! - [`ContainerEdits`], [`DeviceNode`], [`Mount`], [`Hook`]: what a driver returns; with
//!   [`Spec`], [`CdiDevice`](crate::advanced::cdi::CdiDevice),
//!   [`IntelRdt`](crate::advanced::cdi::IntelRdt) and [`NetDevice`](crate::advanced::cdi::NetDevice)
//!   in [`advanced::cdi`](crate::advanced::cdi), the spec document up to cdiVersion 1.1.0, with
//!   the exact JSON names; strict JSON and YAML parsing ([`Spec::parse`]).
//! - [`Kind`] (`vendor/class`) and [`QualifiedName`] (`vendor/class=name`).
//! - [`Spec::validate`]: every rule the reference Go library enforces, plus the rules SPEC.md
//!   states but the reference skips (see [Validation](#validation)).
//! - [`Spec::minimum_version`]: the lowest `cdiVersion` the contents allow, computed as the
//!   reference does; a spec declaring less is invalid.
//! - [`SpecWriter`]: one transient spec per prepared claim, written atomically, removed on
//!   unprepare, swept for orphans at start.
//!
//! ```
//! use dra_sdk::advanced::cdi::{CdiVersion, ClaimDevice, Spec, SpecWriter};
//! use dra_sdk::cdi::{ContainerEdits, DeviceNode};
//!
//! # let dir = tempfile::tempdir()?;
//! let writer = SpecWriter::new(dir.path(), "gpu.example.com/gpu".parse()?);
//! let gpu0 = ContainerEdits::new()
//!     .env("GPU_DEVICE_0", "gpu-0")
//!     .device_node(DeviceNode::new("/dev/gpu0").host_path("/dev/dri/card0"));
//! let ids = writer.write_claim("claim-uid-1", &ContainerEdits::new(), &[ClaimDevice::new("gpu-0", gpu0)])?;
//! assert_eq!(ids[0].to_string(), "gpu.example.com/gpu=claim-uid-1-gpu-0");
//!
//! let spec = Spec::read_file(writer.spec_path("claim-uid-1")?)?;
//! assert_eq!(spec.version, CdiVersion::V0_5_0); // hostPath needs 0.5.0
//! writer.remove_claim("claim-uid-1")?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Validation
//!
//! [`Spec::validate`] applies, in the reference's order: the version check; the annotation key
//! rules and size limit; the edits (env `KEY=VALUE` with a non-empty key; device node
//! permissions from `rwm`; hook env; non-empty mount paths; Intel RDT class-of-service names;
//! non-empty, non-duplicate net devices); the device names (character rules, unique, at least
//! one device, each with non-empty edits). Device node types and hook names are typed enums, so
//! a wrong value is a parse error.
//!
//! Stricter than the reference, as SPEC.md and the OCI runtime spec require:
//! - device node `path` and `hostPath`, mount `containerPath` and hook `path` must be absolute,
//!   and so must a bind mount's `hostPath` (a typed mount's source such as `tmpfs` is free);
//! - a hook `timeout`, when set, must be a positive number of seconds that fits a `uint32`.

pub(crate) mod builder;
pub(crate) mod error;
pub(crate) mod files;
pub(crate) mod name;
pub(crate) mod spec;
pub(crate) mod validate;
pub(crate) mod version;

pub use error::CdiError;
pub(crate) use files::ClaimFiles;
pub(crate) use files::{ClaimDevice, DEFAULT_CDI_ROOT, SpecWriter};
pub use name::Kind;
pub(crate) use name::QualifiedName;
// `CdiDevice` and `CdiVersion`, not `Device` and `Version`: `slices::Device` and
// `attributes::Version` are other things, and a driver imports both modules.
pub(crate) use spec::Spec;
pub use spec::{ContainerEdits, DeviceNode, DeviceNodeType, Hook, HookName, Mount};
// The short names inside the crate, where no other `Device` or `Version` is in scope.
pub(crate) use spec::Device;
pub(crate) use version::Version;
