//! ResourceSlice publishing: the device model, validation, splitting and the reconcile loop.
//!
//! A driver describes what it has as [`DriverResources`] (pools of [`Device`]s with
//! attributes, capacities, shared counters, taints …). A [`ResourceSlicePublisher`] keeps the
//! cluster's ResourceSlices equal to that, across restarts, API outages, other writers and
//! Kubernetes versions:
//!
//! * **Validation** before anything is sent ([`DriverResources::validate`]), against the
//!   limits of the server's release ([`SliceLimits`](crate::advanced::slices::SliceLimits)); errors name pool, device and field.
//! * **Splitting**: a pool becomes as many slices as the limits require, with
//!   `resourceSliceCount` and the pool generation kept consistent. Assignment of devices to
//!   slices is deterministic and sticky, so changing one device rewrites one slice (see
//!   *Slice layout* below).
//! * **Reconciling** with a kube-rs watcher on this driver's slices (field selectors
//!   `spec.driver` and, for node-local publishers, `spec.nodeName`): creates, updates and
//!   deletes until the cluster matches, and not a single write when it already does. Slices
//!   deleted or edited by someone else (kubelet wipes node-local slices when it restarts or
//!   the plugin is gone for 30 s) are repaired; slices of removed pools are deleted.
//! * **Versions**: `resource.k8s.io/v1` where served (1.34+), otherwise `v1beta2` (1.33) or
//!   `v1beta1` (1.32), chosen by API discovery; validation limits follow `/version`. Fields a
//!   server drops because a feature gate is off are reported once
//!   ([`PublishEvent::DroppedFields`]) and then left out, instead of rewriting forever.
//!   Devices whose meaning depends on a dropped 1.37 field (compatibility groups, node-resource
//!   mappings) are withheld instead
//!   ([`FeatureGate::withholds_devices`](crate::advanced::slices::FeatureGate::withholds_devices)).
//! * **Kubernetes 1.37 device model**: [`Pool::partition_type_attribute`],
//!   [`Device::consumes_in_groups`], [`Device::node_allocatable`] and, for drivers without
//!   node preparation,
//!   [`skip_node_operations`](crate::advanced::slices::ResourceSlicePublisher::skip_node_operations)
//!   (all alpha in 1.37; see `docs/slices.md`).
//! * **Operability**: never blocks the caller ([`PublisherHandle::update`] is a non-blocking
//!   "latest wins" hand-off), retries API errors with jittered exponential backoff, reports
//!   progress and errors through [`ResourceSlicePublisher::subscribe`] (taken before it
//!   runs) and [`PublisherHandle::subscribe`], counts writes and errors
//!   ([`PublisherHandle::stats`], [`PublisherHandle::register_metrics`]).
//!
//! ```no_run
//! use dra_sdk::advanced::slices::ResourceSlicePublisher;
//! use dra_sdk::slices::{Device, DeviceCapacity, DeviceTaint, DriverResources, TaintEffect};
//!
//! # async fn example() -> Result<(), kube::Error> {
//! let gpu = |i: i64| {
//!     Device::new(format!("gpu-{i}"))
//!         .attribute("index", i)
//!         .attribute("productName", "NVIDIA H100 80GB HBM3")
//!         .capacity("memory", DeviceCapacity::new("80Gi"))
//! };
//! let client = kube::Client::try_default().await?;
//! let publisher = ResourceSlicePublisher::for_node(client, "gpu.example.com", "node-1")
//!     .spawn(DriverResources::single_pool("node-1", (0..8).map(gpu).collect()));
//!
//! // A device fails: taint it. Only the slice holding gpu-3 is rewritten.
//! let mut devices: Vec<Device> = (0..8).map(gpu).collect();
//! devices[3] = devices[3]
//!     .clone()
//!     .taint(DeviceTaint::new("gpu.example.com/xid", TaintEffect::NoExecute).value("79"));
//! publisher.update(DriverResources::single_pool("node-1", devices));
//! publisher.synced().await;
//! # Ok(())
//! # }
//! ```
//!
//! # Slice layout
//!
//! Slices are named `[<node>-]<driver>-<pool>-<hash>-<index>`: the pool name with `/` written
//! as `.`, truncated to keep the name within 253 characters, then 8 hex digits of a SHA-256
//! over node, driver and pool (unique even where the readable part is ambiguous or cut), then
//! the slice number zero-padded to four digits (names sort in slice order; the scheduler tries
//! slices in name order). The names are deterministic, so creates are idempotent and a
//! restarted publisher adopts its slices. Slices of the driver (and node) with other names are
//! deleted.
//!
//! Per slice, the publisher puts at most the pool's
//! [`max_devices_per_slice`](Pool#structfield.max_devices_per_slice) devices, by default 64 on
//! 1.35+ (and while the release is unknown) and 128 on 1.34. 64 is the 1.35+ limit for slices
//! in which any device has taints, counter consumption or list attributes; using it from the
//! start means tainting a device never splits a slice. Shared counter sets get slices of
//! their own (at most 8 sets each) on 1.35+, while 1.34 keeps all counter sets and their
//! consumers in one slice.
//!
//! Assignment, for each pool:
//!
//! 1. Without a previous layout (first publish, or after all slices were wiped): counter sets
//!    first, then devices in the driver's order, each slice filled before the next one starts.
//! 2. With a previous layout (the publisher's own from its last round, or after a restart
//!    read back from the pool's newest slices): every device and counter set stays in its
//!    previous slice while that slice's limits allow; new ones (and any that no longer fit)
//!    go, in the driver's order, into the lowest-numbered slice with room, else into a new
//!    slice with the lowest unused number. Slices left empty disappear.
//! 3. If that uses more than twice the slices of a fresh layout (and at least two more), the
//!    fresh layout of step 1 is used instead.
//! 4. Within a slice, devices keep the driver's order.
//!
//! # Generations
//!
//! With `G` the highest generation among a pool's slices, the pool stays at `G` when its slice
//! count stays the same, at most one slice that consumers currently see has to change, and
//! the driver asked for no higher [`generation`](Pool#structfield.generation); missing or
//! older slices are (re)written at `G` on the way. Otherwise all slices move to
//! `max(G + 1, Pool::generation)`. Deletes go first, then updates, then creates, so no
//! complete generation ever shows a device twice.

mod backoff;
mod layout;
pub(crate) mod limits;
mod model;
mod plan;
pub(crate) mod publisher;
pub(crate) mod slice_names;
pub(crate) mod validate;
pub(crate) mod wire;

pub use dra_sdk_derive::DeviceAttributes;
pub use model::{
    AttributeValue, CapacityRequestPolicy, CounterSet, Device, DeviceAttributes, DeviceCapacity,
    DeviceCounterConsumption, DeviceNodeSelection, DeviceTaint, DriverResources,
    NodeAllocatableResource, Pool, PoolNodeSelection, Quantity, TaintEffect, ValidRequestValues,
};
pub(crate) use publisher::SliceUpdater;
pub(crate) use publisher::{PublishEvent, PublisherHandle, ResourceSlicePublisher};
pub use validate::ValidationErrors;
pub(crate) use wire::ResourceApiVersion;
