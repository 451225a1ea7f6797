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
//! - [`nest_v1beta1_requests`]: the conversion the plugin applies to `resource.k8s.io/v1beta1`
//!   claims, for tools that read such objects and want the `v1` shape.

pub mod proto;

pub use crate::claim::wire::nest_v1beta1_requests;
pub use crate::plugin::authority::{AuthorityError, AuthorityRewriteStream};
pub use crate::plugin::client::unix_channel;
pub use crate::plugin::socket::{bind_private, remove_socket};
