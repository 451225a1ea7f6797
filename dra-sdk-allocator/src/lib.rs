//! An allocator for ResourceClaims that does what the kube-scheduler does for structured
//! parameters, so tests can allocate claims without a scheduler.
//!
//! [`Allocator`] is pure: it takes ResourceSlices, DeviceClasses and the claims that already
//! hold devices, and computes a claim's `status.allocation` for a node. [`allocate_claim`] does
//! the same against an API server (a real one or the
//! fake, `dra_sdk_testing::apiserver::FakeApiServer`) and writes the result the way the scheduler
//! does.
//!
//! ```
//! use dra_sdk_allocator::Allocator;
//! use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
//! use serde_json::json;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let slice: ResourceSlice = serde_json::from_value(json!({
//!     "metadata": { "name": "node-a-gpus" },
//!     "spec": {
//!         "driver": "gpu.example.com",
//!         "nodeName": "node-a",
//!         "pool": { "name": "node-a", "generation": 1, "resourceSliceCount": 1 },
//!         "devices": [
//!             { "name": "gpu-0", "capacity": { "memory": { "value": "16Gi" } } },
//!             { "name": "gpu-1", "capacity": { "memory": { "value": "80Gi" } } },
//!         ],
//!     },
//! }))?;
//! let class: DeviceClass = serde_json::from_value(json!({
//!     "metadata": { "name": "gpu.example.com" },
//!     "spec": { "selectors": [{ "cel": { "expression": "device.driver == 'gpu.example.com'" } }] },
//! }))?;
//! let claim: ResourceClaim = serde_json::from_value(json!({
//!     "metadata": { "name": "big-gpu", "namespace": "default" },
//!     "spec": { "devices": { "requests": [{
//!         "name": "gpu",
//!         "exactly": {
//!             "deviceClassName": "gpu.example.com",
//!             "selectors": [{ "cel": { "expression":
//!                 "device.capacity['gpu.example.com'].memory.compareTo(quantity('40Gi')) >= 0"
//!             } }],
//!         },
//!     }] } },
//! }))?;
//!
//! let allocator = Allocator::new(&[slice], &[class], &[]);
//! let allocation = allocator.allocate(&claim, "node-a")?;
//! let results = allocation.devices.and_then(|devices| devices.results).unwrap_or_default();
//! assert_eq!(results[0].device, "gpu-1");
//!
//! // Nothing fits on another node; the error says which request and why.
//! let error = allocator.allocate(&claim, "node-b").unwrap_err();
//! assert!(error.to_string().starts_with("cannot allocate all claims"));
//! # Ok(()) }
//! ```
//!
//! # What it does, like the scheduler
//! - **Pools**: only the newest generation of each pool counts; a pool with fewer slices than
//!   `resourceSliceCount` is incomplete and skipped (an `All` request fails on it), as is a pool
//!   with duplicate device names or malformed quantities. Slices for the node are those with its
//!   `nodeName`, `allNodes`, a `nodeSelector` matching the node (labels from
//!   [`Allocator::with_nodes`]) or, with `perDeviceNodeSelection`, devices selecting it. Devices
//!   are tried in pool order (driver, pool name), slice name order, then slice order.
//! - **Requests**: `exactly` with `ExactCount` (`count`, default 1) or `All` (every matching
//!   device on the node, at least one, none allocated elsewhere unless `adminAccess`);
//!   `firstAvailable` subrequests in order, reported as `<request>/<subrequest>`; at most 32
//!   devices per claim.
//! - **Selectors**: the class's CEL selectors, then the request's (see below).
//! - **Constraints**: `matchAttribute` and `distinctAttribute` (fully qualified names; an
//!   unqualified device attribute belongs to the driver's domain; list attributes use set
//!   semantics), scoped by `requests` (`req` covers its subrequests, `req/sub` one of them),
//!   found by backtracking over all requests.
//! - **Derived attributes** (Kubernetes 1.37, `derivedAttributes` on `exactly` and on
//!   `firstAvailable` subrequests, gate `DRADerivedAttributes`): for a device that passed the
//!   request's selectors, each CEL expression (same `device` variable) yields a string, int or
//!   bool or a list of them; constraints compare that value under the derived attribute's name,
//!   which shadows a published attribute of the same name for that request's devices. Any error
//!   (compile, runtime, another result type) aborts the allocation with
//!   [`AllocationError::DerivedAttribute`], as the scheduler fails the pod instead of skipping
//!   the device.
//! - **Availability**: devices held by other claims are excluded; `adminAccess` results of other
//!   claims do not hold devices, and admin requests ignore other claims (but take a device once
//!   per claim). Devices with `NoSchedule`/`NoExecute` taints need a matching toleration;
//!   tolerations are copied into the results.
//! - **Partitionable devices**: a device's `consumesCounters` must fit into its pool's counter
//!   sets minus what allocated devices of the pool consume (counted once per device).
//! - **Compatibility groups** (Kubernetes 1.37, `consumesCounters[].compatibilityGroups`, gate
//!   `DRADeviceCompatibilityGroups`): per counter set, the groups of every device drawing from
//!   it (the devices other claims hold, with their groups as the slices publish them now, and
//!   the devices the claim takes) must have at least one in common; a device without groups
//!   only goes with devices without groups. Devices of different counter sets are never
//!   compared. A refused device counts as "with incompatible compatibility groups" and its
//!   verdict is [`Verdict::CompatibilityGroupConflict`].
//! - **Consumable capacity**: a device with `allowMultipleAllocations` can be allocated again (by
//!   other claims and by other requests of the claim, but once per request, as kube-scheduler
//!   does) while its capacities last. Each share gets a fresh
//!   `shareID` and `consumedCapacity` lists every capacity: the requested amount rounded up per
//!   the `requestPolicy` (`validRange` step, `validValues`), or the policy's `default`, or the
//!   whole capacity when the request does not ask. Without sharing, requested capacity is only a
//!   filter (the device must have that much).
//! - **Result**: `results` in request order; `config` holds each request's class configs
//!   (`source: FromClass`, each class once with the requests that use it) followed by the
//!   claim's configs that apply to an allocated request (`FromClaim`), in claim order, and is
//!   left out when there are none;
//!   `nodeSelector` is `metadata.name` of the node for node-local devices, the slices' node
//!   selector requirements for others, or unset for `allNodes`. Binding conditions are copied;
//!   `bindsToNode` pins the allocation to the node.
//!
//! # CEL
//! Expressions run on [cel-rust](https://docs.rs/cel) (the `cel` crate) with the standard
//! library, its strings (`lowerAscii`, `split`, `replace`, …) and lists extensions, `matches()`
//! (regex), and these Kubernetes additions:
//! - `device.driver`, `device.allowMultipleAllocations`, `device.attributes["<domain>"].<name>`
//!   (int, bool, string, semver, and list values) and `device.capacity["<domain>"].<name>`
//!   (quantities). A domain without entries is an empty map.
//! - Quantities: `quantity(s)`, `isQuantity(s)`, `q.compareTo(q)`, `q.isGreaterThan(q)`,
//!   `q.isLessThan(q)`, `q.add(q|int)`, `q.sub(q|int)`, `q.sign()`, `q.isInteger()`,
//!   `q.asInteger()`, `q.asApproximateFloat()`, `==` by value.
//! - Semantic versions: `semver(s)`, `semver(s, normalize)`, `isSemver(s)`,
//!   `isSemver(s, normalize)`, `v.compareTo(v)`, `v.isGreaterThan(v)`, `v.isLessThan(v)`,
//!   `v.major()`, `v.minor()`, `v.patch()`, `==` by precedence.
//!
//! Not supported: compile-time type checking (cel-rust checks types when evaluating, so a type
//! error surfaces as a runtime error on the first device evaluated), the cost limit, and the
//! Kubernetes `url`, `ip`, `cidr`, `format`, `sets` and `authz` libraries.
//!
//! A compile error, or an evaluation error on any device, fails the allocation with the
//! scheduler's message shape: `class <name>: selector #<i>: CEL runtime error: <error>` or
//! `claim <namespace>/<name>, request <request>: selector #<i>: …`, plus the expression. That
//! includes a lookup of an attribute the device does not have (`no such key: <name>`), which the
//! scheduler reports as an error too; guard such lookups with `has(...)` or `in`, or opt into
//! treating them as "no match" with [`Allocator::tolerate_missing_attributes`].
//!
//! # Explanations
//! [`Allocator::explain`] says why a claim gets, or does not get, devices on a node: for each
//! request, every device of the cluster with a typed [`Verdict`] (chosen, available, or the
//! first check that rules it out, with its details: the selector and its expression, the CEL
//! error, the claims holding the device, the capacity or counters left and who holds them, the
//! taint, the node it is published for), next to the outcome [`Allocator::allocate`] returns.
//! For each `matchAttribute` and `distinctAttribute` constraint, a [`ConstraintExplanation`]
//! groups the devices available for its requests by the attribute's value and says whether some
//! value has enough of them: why two GPUs that are each free are refused as a pair when they
//! sit in different NVLink groups. The verdicts come from the same checks the search makes.
//! [`Allocator::node_devices`] lists a node's devices with what holds them. `dractl explain`
//! prints both.
//!
//! - **Extended resources**: [`extended_resource_claim`] makes the claim the scheduler makes for
//!   a pod's `resources` (say `nvidia.com/gpu: 2`) that a DeviceClass serves; it is allocated
//!   like any other.
//!
//! # Checked against kube-scheduler
//! `tests/recordings_scheduler.rs` replays every scenario recorded on a real kube-scheduler
//! (`shared/reference/recordings/scheduler/`) and compares each allocation; what it cannot
//! compare is listed there with the reason.
//!
//! # Not modelled
//! Scoring (the first fit wins; which node of several that fit is up to the caller),
//! DeviceTaintRules, binding condition timeouts and `allocationTimestamp`, and allocating
//! several claims of a pod together: claims are allocated one at a time, each seeing the ones
//! before it as allocated.
//!
//! Of the Kubernetes 1.37 device model: the allocator behaves as a scheduler with the 1.37
//! alpha gates on (a scheduler with `DRADeviceCompatibilityGroups` off ignores every slice
//! declaring groups, which leaves its pool incomplete; that is not modelled).
//! `partitionTypeAttribute` is read by the ResourcePoolStatusRequest controller in
//! kube-controller-manager, not by the scheduler's allocator, so it changes no allocation here.
//! `nodeAllocatableResources` is accounted by the scheduler against the node's allocatable
//! `cpu`, `memory` and hugepages, next to the pods' own requests, and written to the pod's
//! status for the kubelet; the allocator knows no pods or node allocatable and ignores it. A
//! derived attribute yielding a semantic version fails here with a runtime error (cel-rust
//! cannot hand such a value out of an evaluation), where the scheduler accepts it.
//! [`ConstraintExplanation`] groups devices by their published attributes, not by derived
//! ones.

mod api;
mod cel;
mod explain;
mod extended;
mod index;
mod model;
mod nodes;
mod search;

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{AllocationResult, DeviceClass, ResourceClaim, ResourceSlice};
use tracing::warn;

pub use api::{AllocateClaimError, allocate_claim};
pub use explain::{
    CapacityUsage, CelStage, ConstraintDevice, ConstraintExplanation, ConstraintKind,
    ConstraintValue, CounterHolder, CounterSetUsage, CounterUsage, DeviceExplanation, Explanation,
    Holder, NodeDevice, NodeDevices, NodeMismatch, RequestExplanation, SelectorOwner, SelectorRef,
    Verdict,
};
pub use extended::{EXTENDED_RESOURCE_CLAIM_ANNOTATION, extended_resource_claim};
pub use nodes::allocation_fits_node;

use index::{HeldClaim, PoolData};

/// Computes allocations the way the kube-scheduler's structured-parameters allocator does.
///
/// See the [module documentation](self) for what it supports.
#[derive(Debug)]
pub struct Allocator {
    pools: Vec<PoolData>,
    classes: BTreeMap<String, model::Class>,
    held: Vec<HeldClaim>,
    node_labels: BTreeMap<String, BTreeMap<String, String>>,
    cel: Result<cel::CelEnvironment, String>,
    search_limit: u64,
    tolerate_missing_attributes: bool,
}

/// How many devices the search may try before giving up: far more than any test needs, small
/// enough that a pathological claim fails in well under a second.
const DEFAULT_SEARCH_LIMIT: u64 = 1_000_000;

fn decode_all<
    T: serde::de::DeserializeOwned,
    K: serde::Serialize + kube::Resource<DynamicType = ()>,
>(
    objects: &[K],
) -> Vec<T> {
    objects
        .iter()
        .filter_map(|object| match model::decode(object) {
            Ok(decoded) => Some(decoded),
            Err(error) => {
                let name = object.meta().name.as_deref().unwrap_or("");
                warn!(kind = %K::kind(&()), name, %error, "ignoring an object the allocator cannot read");
                None
            }
        })
        .collect()
}

impl Allocator {
    /// An allocator over the cluster's ResourceSlices and DeviceClasses. `allocated` are claims
    /// whose `status.allocation` holds devices (other claims are ignored, so all claims may be
    /// passed).
    pub fn new(
        slices: &[ResourceSlice],
        classes: &[DeviceClass],
        allocated: &[ResourceClaim],
    ) -> Self {
        let slices: Vec<model::Slice> = decode_all(slices);
        let classes: Vec<model::Class> = decode_all(classes);
        let claims: Vec<model::Claim> = decode_all(allocated);
        Self {
            pools: index::build_pools(slices),
            classes: classes
                .into_iter()
                .map(|class| (class.metadata.name().to_owned(), class))
                .collect(),
            held: claims.iter().filter_map(HeldClaim::from_model).collect(),
            node_labels: BTreeMap::new(),
            cel: cel::CelEnvironment::new(),
            search_limit: DEFAULT_SEARCH_LIMIT,
            tolerate_missing_attributes: false,
        }
    }

    /// Nodes whose labels slices' and devices' `nodeSelector`s are matched against. A node not
    /// given here has no labels (its name still matches `metadata.name` fields).
    pub fn with_nodes(mut self, nodes: &[Node]) -> Self {
        for node in nodes {
            if let Some(name) = &node.metadata.name {
                self.node_labels.insert(
                    name.clone(),
                    node.metadata.labels.clone().unwrap_or_default(),
                );
            }
        }
        self
    }

    /// Caps the backtracking search at this many steps (one step tries one device for one
    /// request); beyond it allocation fails with [`AllocationError::SearchLimit`].
    /// Default: one million.
    pub fn with_search_limit(mut self, steps: u64) -> Self {
        self.search_limit = steps;
        self
    }

    /// Treats a selector that looks up an attribute or capacity the device lacks
    /// (`no such key`) as not matching that device, instead of failing the allocation as the
    /// scheduler does. For tests of drivers whose devices publish different attribute sets.
    pub fn tolerate_missing_attributes(mut self) -> Self {
        self.tolerate_missing_attributes = true;
        self
    }

    /// Allocates the claim's devices for the node: the value the scheduler writes to
    /// `status.allocation`. Any allocation the claim itself already has is ignored (it is
    /// computed anew, and a stale copy among `allocated` does not block its own devices).
    pub fn allocate(
        &self,
        claim: &ResourceClaim,
        node_name: &str,
    ) -> Result<AllocationResult, AllocationError> {
        let decoded = decode_claim(claim)?;
        self.allocate_decoded(&decoded, node_name)
    }

    fn allocate_decoded(
        &self,
        decoded: &model::Claim,
        node_name: &str,
    ) -> Result<AllocationResult, AllocationError> {
        let span =
            tracing::debug_span!("allocate", claim = %decoded.display_name(), node = node_name);
        let _entered = span.enter();
        let allocation = search::allocate(self, decoded, node_name)?;
        serde_json::from_value(allocation).map_err(AllocationError::Encode)
    }

    /// Explains what [`allocate`](Self::allocate) does with the claim on the node: for each
    /// request (and subrequest), every device of the cluster with the allocator's verdict (taken,
    /// available, or the first reason that rules it out, with its details: the selector, the
    /// claims holding it, the counters or capacity left, the taint), for each constraint the
    /// devices available for its requests by value of its attribute, and `allocate`'s outcome.
    /// Fails only when the claim does not decode, as `allocate` does.
    ///
    /// ```
    /// use dra_sdk_allocator::{Allocator, Verdict};
    /// use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
    /// use serde_json::json;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let slice: ResourceSlice = serde_json::from_value(json!({
    ///     "metadata": { "name": "node-a-gpus" },
    ///     "spec": {
    ///         "driver": "gpu.example.com", "nodeName": "node-a",
    ///         "pool": { "name": "node-a", "generation": 1, "resourceSliceCount": 1 },
    ///         "devices": [{ "name": "gpu-0", "attributes": { "model": { "string": "a100" } } }],
    ///     },
    /// }))?;
    /// let class: DeviceClass = serde_json::from_value(json!({
    ///     "metadata": { "name": "gpu" },
    ///     "spec": { "selectors": [{ "cel": { "expression": "device.driver == 'gpu.example.com'" } }] },
    /// }))?;
    /// let claim: ResourceClaim = serde_json::from_value(json!({
    ///     "metadata": { "name": "h100", "namespace": "default" },
    ///     "spec": { "devices": { "requests": [{ "name": "gpu", "exactly": {
    ///         "deviceClassName": "gpu",
    ///         "selectors": [{ "cel": { "expression":
    ///             "device.attributes['gpu.example.com'].model == 'h100'" } }],
    ///     } }] } },
    /// }))?;
    ///
    /// let explanation = Allocator::new(&[slice], &[class], &[]).explain(&claim, "node-a")?;
    /// assert!(!explanation.allocatable());
    /// let verdict = explanation.requests[0].verdict("gpu-0").unwrap();
    /// assert!(matches!(verdict, Verdict::RequestSelectorFalse { index: 0, .. }));
    /// assert_eq!(
    ///     verdict.to_string(),
    ///     "request selector #0 is false: device.attributes['gpu.example.com'].model == 'h100'"
    /// );
    /// # Ok(()) }
    /// ```
    pub fn explain(
        &self,
        claim: &ResourceClaim,
        node_name: &str,
    ) -> Result<Explanation, AllocationError> {
        let decoded = decode_claim(claim)?;
        let outcome = self.allocate_decoded(&decoded, node_name);
        let mut requests = search::explain_requests(self, &decoded, node_name);
        if let Ok(allocation) = &outcome {
            mark_chosen(&mut requests, allocation);
        }
        let constraints = explain::explain_constraints(self, &decoded, &requests);
        Ok(Explanation {
            claim: decoded.display_name(),
            node: node_name.to_owned(),
            requests,
            constraints,
            outcome,
        })
    }

    /// The devices available on the node, in the order the allocator tries them, with the
    /// claims holding each (and their shares), what shares consume of their capacity, and what
    /// is left of their pools' counter sets.
    pub fn node_devices(&self, node_name: &str) -> NodeDevices {
        search::node_devices(self, node_name)
    }
}

fn decode_claim(claim: &ResourceClaim) -> Result<model::Claim, AllocationError> {
    model::decode(claim).map_err(|error| {
        let name = claim.metadata.name.as_deref().unwrap_or("");
        AllocationError::InvalidClaim {
            claim: match &claim.metadata.namespace {
                Some(namespace) => format!("{namespace}/{name}"),
                None => name.to_owned(),
            },
            reason: format!("does not decode: {error}"),
        }
    })
}

/// Marks the devices of the allocation as chosen for their request, and, for other requests
/// that could have taken a device not shared, as chosen for another request.
fn mark_chosen(requests: &mut [RequestExplanation], allocation: &AllocationResult) {
    let results = serde_json::to_value(allocation)
        .ok()
        .and_then(|value| value.pointer("/devices/results").cloned())
        .and_then(|results| match results {
            serde_json::Value::Array(results) => Some(results),
            _ => None,
        })
        .unwrap_or_default();
    let text = |result: &serde_json::Value, field: &str| {
        result
            .get(field)
            .and_then(serde_json::Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    for result in &results {
        let (request, driver, pool, device) = (
            text(result, "request"),
            text(result, "driver"),
            text(result, "pool"),
            text(result, "device"),
        );
        let share_id = result
            .get("shareID")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned);
        let consumed_capacity: BTreeMap<String, String> = result
            .get("consumedCapacity")
            .and_then(serde_json::Value::as_object)
            .into_iter()
            .flatten()
            .map(|(name, amount)| {
                let amount = amount
                    .as_str()
                    .map_or_else(|| amount.to_string(), str::to_owned);
                (name.clone(), amount)
            })
            .collect();
        for explained in requests.iter_mut() {
            let same_request = explained.request == request;
            for entry in &mut explained.devices {
                if entry.driver != driver || entry.pool != pool || entry.device != device {
                    continue;
                }
                if same_request {
                    entry.verdict = Verdict::Chosen {
                        share_id: share_id.clone(),
                        consumed_capacity: consumed_capacity.clone(),
                    };
                } else if share_id.is_none() && entry.verdict == Verdict::Available {
                    entry.verdict = Verdict::ChosenForOtherRequest {
                        request: request.clone(),
                    };
                }
            }
        }
    }
}

/// Why a claim could not be allocated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AllocationError {
    /// The claim is malformed (a request without `exactly` or `firstAvailable`, a zero count,
    /// an unknown allocation mode, a malformed quantity or toleration, an empty constraint).
    #[error("claim {claim}: {reason}")]
    InvalidClaim {
        /// `namespace/name` of the claim.
        claim: String,
        /// What is wrong.
        reason: String,
    },
    /// A request names a DeviceClass that does not exist.
    #[error("claim {claim}, request {request}: could not retrieve device class {class}: not found")]
    UnknownDeviceClass {
        /// `namespace/name` of the claim.
        claim: String,
        /// The request (`request/subrequest` for a subrequest).
        request: String,
        /// The class name.
        class: String,
    },
    /// A selector does not compile.
    #[error("{owner}: selector #{index}: CEL compile error: {message} (expression: {expression})")]
    CelCompile {
        /// `class <name>` or `claim <namespace>/<name>, request <request>`.
        owner: String,
        /// Position of the selector in its list.
        index: usize,
        /// The expression.
        expression: String,
        /// The compiler's message.
        message: String,
    },
    /// A selector failed while evaluating a device (including lookups of attributes the device
    /// does not have, unless [`Allocator::tolerate_missing_attributes`] is set).
    #[error("{owner}: selector #{index}: CEL runtime error: {message} (expression: {expression})")]
    CelRuntime {
        /// `class <name>` or `claim <namespace>/<name>, request <request>`.
        owner: String,
        /// Position of the selector in its list.
        index: usize,
        /// The expression.
        expression: String,
        /// The evaluation error.
        message: String,
    },
    /// A derived attribute of a request (`derivedAttributes`, Kubernetes 1.37) does not compile,
    /// fails while evaluating a device that passed the request's selectors, or yields something
    /// other than a scalar or a list of scalars. Like the scheduler, the allocator aborts rather
    /// than leave the device out: a silently skipped device would hide the mistake.
    #[error(
        "claim {claim}, request {request}: derived attribute {name} on device {device}: {message}"
    )]
    DerivedAttribute {
        /// `namespace/name` of the claim.
        claim: String,
        /// The request (`request/subrequest` for a subrequest).
        request: String,
        /// The derived attribute's name.
        name: String,
        /// `driver/pool/device` being evaluated.
        device: String,
        /// What went wrong, then the expression: `CEL runtime error: no such key: numa
        /// (expression: device.attributes['nic.example.com'].numa)`.
        message: String,
    },
    /// The CEL environment could not be built (a bug, never expected).
    #[error("the CEL environment could not be built: {0}")]
    CelEnvironment(String),
    /// An `All` request cannot know "all" while a pool on the node is being updated.
    #[error(
        "claim {claim}, request {request}: asks for all devices, but resource pool {pool} is currently being updated"
    )]
    PoolBeingUpdated {
        /// `namespace/name` of the claim.
        claim: String,
        /// The request.
        request: String,
        /// `driver/pool`.
        pool: String,
    },
    /// A pool the allocation depends on is invalid.
    #[error("claim {claim}, request {request}: resource pool {pool} is invalid: {reason}")]
    InvalidPool {
        /// `namespace/name` of the claim.
        claim: String,
        /// The request.
        request: String,
        /// `driver/pool`.
        pool: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A constraint rules out one of the devices an `All` request must take.
    #[error(
        "claim {claim}, request {request}: cannot add device {device} because a claim constraint would not be satisfied"
    )]
    ConstraintRejectsDevice {
        /// `namespace/name` of the claim.
        claim: String,
        /// The request.
        request: String,
        /// `driver/pool/device`.
        device: String,
    },
    /// The claim needs more devices than an allocation may hold.
    #[error(
        "claim {claim}: number of requested devices {requested} exceeds the claim limit of {limit}"
    )]
    TooManyDevices {
        /// `namespace/name` of the claim.
        claim: String,
        /// Devices needed (at least).
        requested: usize,
        /// The limit (32).
        limit: usize,
    },
    /// The search exceeded [`Allocator::with_search_limit`].
    #[error("claim {claim}: no allocation found within {steps} search steps")]
    SearchLimit {
        /// `namespace/name` of the claim.
        claim: String,
        /// The limit.
        steps: u64,
    },
    /// No combination of devices satisfies the claim on the node.
    #[error(
        "cannot allocate all claims: claim {claim} on node {node}: {}{}",
        ListDisplay(problems),
        SkippedPools(skipped_pools)
    )]
    Unsatisfiable {
        /// `namespace/name` of the claim.
        claim: String,
        /// The node.
        node: String,
        /// What stands in the way, per request.
        problems: Vec<RequestProblem>,
        /// Pools on the node that were not used: `driver/pool (being updated)` or
        /// `driver/pool (invalid: reason)`.
        skipped_pools: Vec<String>,
    },
    /// The result did not decode into k8s-openapi's `AllocationResult` (a bug).
    #[error("the allocation result does not decode as an AllocationResult: {0}")]
    Encode(#[source] serde_json::Error),
}

struct ListDisplay<'a>(&'a [RequestProblem]);

impl fmt::Display for ListDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

struct SkippedPools<'a>(&'a [String]);

impl fmt::Display for SkippedPools<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return Ok(());
        }
        write!(f, " (skipped pools: {})", self.0.join(", "))
    }
}

/// Why one request (or subrequest) of an unsatisfiable claim could not be satisfied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestProblem {
    /// `request`, `request/subrequest`, or for [`UnsatisfiableReason::Combination`] all requests.
    pub request: String,
    /// Why.
    pub reason: UnsatisfiableReason,
}

impl fmt::Display for RequestProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason {
            UnsatisfiableReason::Combination => {
                write!(f, "requests {}: {}", self.request, self.reason)
            }
            _ => write!(f, "request {}: {}", self.request, self.reason),
        }
    }
}

/// Why a request could not be satisfied.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnsatisfiableReason {
    /// No device on the node matches the class's and the request's selectors.
    NoMatchingDevice {
        /// Devices on the node in usable pools.
        considered: usize,
    },
    /// Devices match, but too few can be taken.
    Unavailable {
        /// Devices the request needs.
        needed: usize,
        /// Devices matching the selectors.
        matching: usize,
        /// Matching devices that could be taken.
        available: usize,
        /// Matching devices held by other claims (or already by this one).
        allocated: usize,
        /// Matching devices with an untolerated taint.
        tainted: usize,
        /// Matching devices without the requested capacity (or with it used up by shares).
        capacity: usize,
        /// Matching devices whose shared counters are used up.
        counters: usize,
        /// Matching devices whose compatibility groups do not go with the devices already
        /// allocated from one of their counter sets.
        incompatible: usize,
    },
    /// Every request could be satisfied on its own, but not all together: constraints
    /// (`matchAttribute`, `distinctAttribute`) or requests competing for the same devices.
    Combination,
}

impl fmt::Display for UnsatisfiableReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            UnsatisfiableReason::NoMatchingDevice { considered } => {
                write!(f, "no device matches the selectors ({considered} devices considered)")
            }
            UnsatisfiableReason::Unavailable { needed, matching, available, allocated, tainted, capacity, counters, incompatible } => {
                if available == 0 && allocated == matching {
                    return write!(f, "all {matching} matching devices are allocated");
                }
                write!(f, "{available} of {matching} matching devices available, {needed} needed")?;
                let reasons = [
                    (allocated, "allocated"),
                    (tainted, "tainted"),
                    (capacity, "without enough capacity"),
                    (counters, "without enough shared counters"),
                    (incompatible, "with incompatible compatibility groups"),
                ];
                let listed: Vec<String> =
                    reasons.iter().filter(|(n, _)| *n > 0).map(|(n, what)| format!("{n} {what}")).collect();
                if !listed.is_empty() {
                    write!(f, " ({})", listed.join(", "))?;
                }
                Ok(())
            }
            UnsatisfiableReason::Combination => {
                f.write_str("each can be satisfied alone but not together (claim constraints or competition for devices)")
            }
        }
    }
}
