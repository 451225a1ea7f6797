//! Explanations: why a claim gets, or does not get, devices on a node, device by device and
//! constraint by constraint, and what holds a node's devices. Computed by the allocator itself
//! ([`Allocator::explain`], [`Allocator::node_devices`]), from the same checks
//! [`Allocator::allocate`] makes.
//!
//! [`Allocator::explain`]: super::Allocator::explain
//! [`Allocator::node_devices`]: super::Allocator::node_devices
//! [`Allocator::allocate`]: super::Allocator::allocate

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use k8s_openapi::api::resource::v1::AllocationResult;
use serde::Serialize;

use super::index::{AttributeValue, DeviceData};
pub use super::model::ConstraintKind;
use super::search::constraint_applies;
use super::{AllocationError, Allocator, model};

/// Why a claim gets (or does not get) devices on a node: for each request, every device of the
/// cluster with the allocator's verdict, and the outcome [`Allocator::allocate`] returns for the
/// same claim and node.
///
/// [`Allocator::allocate`]: super::Allocator::allocate
#[derive(Debug)]
#[non_exhaustive]
pub struct Explanation {
    /// `namespace/name` of the claim.
    pub claim: String,
    /// The node it was explained for.
    pub node: String,
    /// One entry per request, or per subrequest of a `firstAvailable` request (in order).
    pub requests: Vec<RequestExplanation>,
    /// One entry per `matchAttribute` or `distinctAttribute` constraint of the claim (in order;
    /// malformed ones, which fail the claim, are left out): the devices available for its
    /// requests, by value of its attribute.
    pub constraints: Vec<ConstraintExplanation>,
    /// What [`Allocator::allocate`](super::Allocator::allocate) returns: the allocation, or why
    /// there is none.
    pub outcome: Result<AllocationResult, AllocationError>,
}

impl Explanation {
    /// Whether the claim can be allocated on the node.
    pub fn allocatable(&self) -> bool {
        self.outcome.is_ok()
    }

    /// The explanation of a request (`request` or `request/subrequest`).
    pub fn request(&self, name: &str) -> Option<&RequestExplanation> {
        self.requests.iter().find(|request| request.request == name)
    }
}

/// The devices of one request (or subrequest) of a claim, each with its verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct RequestExplanation {
    /// `request`, or `request/subrequest` for a subrequest of `firstAvailable`.
    pub request: String,
    /// The DeviceClass it names.
    pub device_class: String,
    /// `ExactCount` or `All`.
    pub allocation_mode: String,
    /// Devices wanted with `ExactCount`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<i64>,
    /// Whether the request asks for admin access.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub admin_access: bool,
    /// Why the request cannot be considered at all (its class does not exist, it is
    /// malformed); no devices are listed then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Every device of the cluster, in the order the allocator tries them.
    pub devices: Vec<DeviceExplanation>,
}

impl RequestExplanation {
    /// The entry of a device.
    pub fn device(&self, driver: &str, pool: &str, device: &str) -> Option<&DeviceExplanation> {
        self.devices
            .iter()
            .find(|d| d.driver == driver && d.pool == pool && d.device == device)
    }

    /// The verdict of the device named `device` (in any pool).
    pub fn verdict(&self, device: &str) -> Option<&Verdict> {
        self.devices
            .iter()
            .find(|d| d.device == device)
            .map(|d| &d.verdict)
    }
}

/// One device and the allocator's verdict on it for one request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct DeviceExplanation {
    /// The driver publishing it.
    pub driver: String,
    /// Its pool.
    pub pool: String,
    /// Its name.
    pub device: String,
    /// Why it is, or is not, taken.
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// The allocator's verdict on one device for one request, checked in the allocator's order:
/// node, pool, class selectors, request selectors, other claims, taints, capacity, counters,
/// constraints. Each device gets the first reason that rules it out.
///
/// Verdicts on availability (allocated, capacity, counters) look at the device on its own, as
/// the cluster's other claims leave it; the requests of the claim itself compete for devices
/// too, which only the outcome accounts for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(
    tag = "verdict",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
#[non_exhaustive]
pub enum Verdict {
    /// The allocation takes this device for this request.
    Chosen {
        /// The share's ID, for a device allowing multiple allocations.
        #[serde(rename = "shareID", skip_serializing_if = "Option::is_none")]
        share_id: Option<String>,
        /// What the share consumes, for a device allowing multiple allocations.
        #[serde(skip_serializing_if = "BTreeMap::is_empty")]
        consumed_capacity: BTreeMap<String, String>,
    },
    /// The device could be taken, but the allocation takes it for another request of the claim.
    ChosenForOtherRequest {
        /// The request that gets it.
        request: String,
    },
    /// The device matches and could be taken; the allocation does not need it (or there is no
    /// allocation, for another reason).
    Available,
    /// The device is not available on the node.
    NodeNotEligible {
        /// Where it is available instead.
        reason: NodeMismatch,
    },
    /// The device's pool is not used: it is being updated (fewer slices of its newest
    /// generation than it announces) or invalid.
    PoolUnusable {
        /// `driver/pool`.
        pool: String,
        /// `being updated` or `invalid: <what is wrong>`.
        reason: String,
    },
    /// A selector of the request's DeviceClass is `false` for the device.
    ClassSelectorFalse {
        /// The class.
        class: String,
        /// Position of the selector in the class.
        index: usize,
        /// The CEL expression.
        expression: String,
    },
    /// A selector of the request is `false` for the device.
    RequestSelectorFalse {
        /// The request (`request` or `request/subrequest`).
        request: String,
        /// Position of the selector in the request.
        index: usize,
        /// The CEL expression.
        expression: String,
    },
    /// A selector looks up an attribute or capacity the device does not have. The scheduler
    /// fails the whole claim with a CEL runtime error then (unless the allocator was told to
    /// [tolerate](super::Allocator::tolerate_missing_attributes) it); guard such lookups with
    /// `has(...)`.
    MissingAttribute {
        /// The selector.
        selector: SelectorRef,
        /// The missing name, as CEL reports it.
        name: String,
        /// CEL's message (`no such key: <name>`).
        message: String,
    },
    /// A selector does not compile, or fails on this device. The scheduler fails the whole
    /// claim.
    CelError {
        /// The selector.
        selector: SelectorRef,
        /// `compile` or `runtime`.
        stage: CelStage,
        /// CEL's message.
        message: String,
    },
    /// The device is held by other claims.
    Allocated {
        /// Who holds it.
        holders: Vec<Holder>,
    },
    /// The device has a `NoSchedule` or `NoExecute` taint the request does not tolerate.
    Tainted {
        /// The taint's key.
        key: String,
        /// The taint's value.
        #[serde(skip_serializing_if = "Option::is_none")]
        value: Option<String>,
        /// The taint's effect.
        effect: String,
    },
    /// The request asks for a capacity the device does not have.
    CapacityMissing {
        /// The capacity's name.
        capacity: String,
    },
    /// The device (not shared) has less of a capacity than the request asks for.
    CapacityTooSmall {
        /// The capacity's name.
        capacity: String,
        /// What the request asks for.
        requested: String,
        /// What the device has.
        available: String,
    },
    /// The device (shared) does not allow the amount asked for: its `requestPolicy` forbids it.
    CapacityPolicy {
        /// The capacity's name.
        capacity: String,
        /// The amount the share would consume (the request, rounded up per the policy).
        amount: String,
        /// What the policy says.
        reason: String,
    },
    /// The device (shared) has too little of a capacity left next to the shares of other
    /// claims.
    CapacityExhausted {
        /// The capacity's name.
        capacity: String,
        /// What the share would consume.
        needed: String,
        /// What other claims' shares consume.
        used: String,
        /// The device's capacity.
        total: String,
        /// The shares of other claims.
        holders: Vec<Holder>,
    },
    /// The device's pool has too little of a shared counter left, because other claims hold
    /// devices consuming it.
    CountersExhausted {
        /// The counter set.
        counter_set: String,
        /// The counter.
        counter: String,
        /// What the device consumes.
        needed: String,
        /// What the pool has left.
        left: String,
        /// What the counter set has in all.
        total: String,
        /// The allocated devices that consume the counter set, and their claims.
        holders: Vec<CounterHolder>,
    },
    /// The device's `compatibilityGroups` on one of its counter sets do not go with those of
    /// the devices other claims hold from that set (Kubernetes 1.37): the groups of all devices
    /// drawing from a counter set must have one in common, and a device without groups only
    /// goes with devices without groups.
    CompatibilityGroupConflict {
        /// The counter set.
        counter_set: String,
        /// The device's groups on it (empty: none).
        groups: Vec<String>,
        /// The groups all allocated devices on the set have in common (empty when they
        /// declared none, or have none in common: see `allocatedWithoutGroups`).
        allocated_groups: Vec<String>,
        /// Whether the allocated devices on the set declared no groups.
        allocated_without_groups: bool,
        /// The allocated devices that consume the counter set, and their claims.
        holders: Vec<CounterHolder>,
    },
    /// A constraint of the claim (`matchAttribute`, `distinctAttribute`) applies to the request,
    /// and the device does not have its attribute: it can never be part of the allocation.
    ConstraintAttributeMissing {
        /// Position of the constraint in the claim.
        constraint: usize,
        /// The fully qualified attribute.
        attribute: String,
    },
}

impl Verdict {
    /// The verdict's name as in JSON (`classSelectorFalse`).
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Chosen { .. } => "chosen",
            Verdict::ChosenForOtherRequest { .. } => "chosenForOtherRequest",
            Verdict::Available => "available",
            Verdict::NodeNotEligible { .. } => "nodeNotEligible",
            Verdict::PoolUnusable { .. } => "poolUnusable",
            Verdict::ClassSelectorFalse { .. } => "classSelectorFalse",
            Verdict::RequestSelectorFalse { .. } => "requestSelectorFalse",
            Verdict::MissingAttribute { .. } => "missingAttribute",
            Verdict::CelError { .. } => "celError",
            Verdict::Allocated { .. } => "allocated",
            Verdict::Tainted { .. } => "tainted",
            Verdict::CapacityMissing { .. } => "capacityMissing",
            Verdict::CapacityTooSmall { .. } => "capacityTooSmall",
            Verdict::CapacityPolicy { .. } => "capacityPolicy",
            Verdict::CapacityExhausted { .. } => "capacityExhausted",
            Verdict::CountersExhausted { .. } => "countersExhausted",
            Verdict::CompatibilityGroupConflict { .. } => "compatibilityGroupConflict",
            Verdict::ConstraintAttributeMissing { .. } => "constraintAttributeMissing",
        }
    }

    /// Whether the device could be taken for the request (chosen or not).
    pub fn is_available(&self) -> bool {
        matches!(
            self,
            Verdict::Chosen { .. } | Verdict::ChosenForOtherRequest { .. } | Verdict::Available
        )
    }
}

fn holder_list(holders: &[Holder]) -> String {
    holders
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Chosen {
                share_id,
                consumed_capacity,
            } => {
                f.write_str("chosen")?;
                if let Some(share) = share_id {
                    write!(f, " (share {share}")?;
                    for (name, amount) in consumed_capacity {
                        write!(f, ", {name}={amount}")?;
                    }
                    f.write_str(")")?;
                }
                Ok(())
            }
            Verdict::ChosenForOtherRequest { request } => {
                write!(f, "available, chosen for request {request}")
            }
            Verdict::Available => f.write_str("available"),
            Verdict::NodeNotEligible { reason } => write!(f, "not on this node: {reason}"),
            Verdict::PoolUnusable { pool, reason } => write!(f, "pool {pool} is {reason}"),
            Verdict::ClassSelectorFalse {
                class,
                index,
                expression,
            } => write!(f, "class {class} selector #{index} is false: {expression}"),
            Verdict::RequestSelectorFalse {
                index, expression, ..
            } => write!(f, "request selector #{index} is false: {expression}"),
            Verdict::MissingAttribute { selector, name, .. } => write!(
                f,
                "{selector} looks up {name}, which the device does not have: {}",
                selector.expression
            ),
            Verdict::CelError {
                selector,
                stage,
                message,
            } => write!(
                f,
                // Compile errors go on with lines pointing at the error; the first says it.
                "{selector}: CEL {stage} error: {} (expression: {})",
                message.lines().next().unwrap_or_default(),
                selector.expression
            ),
            Verdict::Allocated { holders } if holders.is_empty() => f.write_str("allocated"),
            Verdict::Allocated { holders } => {
                write!(f, "allocated to {}", holder_list(holders))
            }
            Verdict::Tainted { key, value, effect } => match value {
                Some(value) => write!(f, "taint {key}={value}:{effect} not tolerated"),
                None => write!(f, "taint {key}:{effect} not tolerated"),
            },
            Verdict::CapacityMissing { capacity } => {
                write!(f, "has no capacity {capacity}")
            }
            Verdict::CapacityTooSmall {
                capacity,
                requested,
                available,
            } => write!(
                f,
                "capacity {capacity} is {available}, less than the {requested} requested"
            ),
            Verdict::CapacityPolicy {
                capacity,
                amount,
                reason,
            } => write!(
                f,
                "capacity {capacity}: {amount} is not allowed by the request policy: {reason}"
            ),
            Verdict::CapacityExhausted {
                capacity,
                needed,
                used,
                total,
                holders,
            } => {
                write!(
                    f,
                    "capacity {capacity} used up: {needed} needed, {used} of {total} taken"
                )?;
                if !holders.is_empty() {
                    write!(f, " by {}", holder_list(holders))?;
                }
                Ok(())
            }
            Verdict::CountersExhausted {
                counter_set,
                counter,
                needed,
                left,
                total,
                holders,
            } => {
                write!(
                    f,
                    "counter set {counter_set} exhausted: {counter} {needed} needed, {left} of {total} left"
                )?;
                if !holders.is_empty() {
                    let held: Vec<String> = holders.iter().map(ToString::to_string).collect();
                    write!(f, " (held by {})", held.join(", "))?;
                }
                Ok(())
            }
            Verdict::CompatibilityGroupConflict {
                counter_set,
                groups,
                allocated_groups,
                allocated_without_groups,
                holders,
            } => {
                let own = if groups.is_empty() {
                    "no compatibility groups".to_owned()
                } else {
                    format!("compatibility groups {}", groups.join(", "))
                };
                let allocated = if *allocated_without_groups {
                    "devices without groups".to_owned()
                } else if allocated_groups.is_empty() {
                    "devices with no group in common".to_owned()
                } else {
                    format!("devices sharing {}", allocated_groups.join(", "))
                };
                write!(
                    f,
                    "counter set {counter_set}: {own} do not go with the allocated {allocated}"
                )?;
                if !holders.is_empty() {
                    let held: Vec<String> = holders.iter().map(ToString::to_string).collect();
                    write!(f, " (held by {})", held.join(", "))?;
                }
                Ok(())
            }
            Verdict::ConstraintAttributeMissing {
                constraint,
                attribute,
            } => write!(
                f,
                "has no attribute {attribute}, which constraint #{constraint} of the claim compares"
            ),
        }
    }
}

/// Why a device is not available on a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(
    tag = "kind",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
#[non_exhaustive]
pub enum NodeMismatch {
    /// Published for another node (`nodeName`).
    OtherNode {
        /// That node.
        node: String,
    },
    /// Its `nodeSelector` does not match the node (node labels come from
    /// [`Allocator::with_nodes`](super::Allocator::with_nodes)).
    NodeSelector,
    /// Neither `nodeName`, `nodeSelector` nor `allNodes` is set.
    NoNodeSelection,
}

impl fmt::Display for NodeMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeMismatch::OtherNode { node } => write!(f, "published for node {node}"),
            NodeMismatch::NodeSelector => f.write_str("its node selector does not match"),
            NodeMismatch::NoNodeSelection => f.write_str("it has no node selection"),
        }
    }
}

/// A CEL selector of a class or a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct SelectorRef {
    /// Whose selector it is.
    pub owner: SelectorOwner,
    /// Its position in the owner's list.
    pub index: usize,
    /// The CEL expression.
    pub expression: String,
}

impl fmt::Display for SelectorRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.owner {
            SelectorOwner::Class(class) => write!(f, "class {class} selector #{}", self.index),
            SelectorOwner::Request(_) => write!(f, "request selector #{}", self.index),
        }
    }
}

/// The owner of a selector.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub enum SelectorOwner {
    /// A DeviceClass, by name.
    Class(String),
    /// A request of the claim (`request` or `request/subrequest`).
    Request(String),
}

/// When a CEL selector failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum CelStage {
    /// It does not compile.
    Compile,
    /// It failed while evaluating the device.
    Runtime,
}

impl fmt::Display for CelStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CelStage::Compile => "compile",
            CelStage::Runtime => "runtime",
        })
    }
}

/// A claim holding (part of) a device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct Holder {
    /// `namespace/name` of the claim.
    pub claim: String,
    /// Its request the device was allocated for.
    pub request: String,
    /// The share's ID, for a share of a device allowing multiple allocations.
    #[serde(rename = "shareID", skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// What the share consumes.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub consumed_capacity: BTreeMap<String, String>,
    /// Admin access, which does not keep the device from other claims.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub admin_access: bool,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (request {}", self.claim, self.request)?;
        if self.admin_access {
            f.write_str(", admin access")?;
        }
        if let Some(share) = &self.share_id {
            write!(f, ", share {share}")?;
            for (name, amount) in &self.consumed_capacity {
                write!(f, " {name}={amount}")?;
            }
        }
        f.write_str(")")
    }
}

/// An allocated device consuming a counter set, and the claims holding it (several share one
/// device that allows multiple allocations; it consumes its counters once).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct CounterHolder {
    /// The device.
    pub device: String,
    /// `namespace/name` of the claims holding it.
    pub claims: Vec<String>,
    /// What it consumes of the counter set.
    pub counters: BTreeMap<String, String>,
}

impl fmt::Display for CounterHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let counters: Vec<String> = self
            .counters
            .iter()
            .map(|(name, amount)| format!("{name}={amount}"))
            .collect();
        write!(
            f,
            "{} on {} ({})",
            self.claims.join(", "),
            self.device,
            counters.join(" ")
        )
    }
}

/// A `matchAttribute` or `distinctAttribute` constraint of the claim, with the devices
/// available for the requests it applies to, grouped by the value of its attribute: why devices
/// that can each be taken do not make an allocation together (say, two free GPUs in different
/// NVLink groups for a claim whose requests must match on the group).
///
/// A device counts when its verdict for one of the constraint's requests says it could be taken
/// ([`Verdict::is_available`]); devices without the attribute have the verdict
/// [`Verdict::ConstraintAttributeMissing`] instead. A constraint naming a request applies to
/// all of its `firstAvailable` subrequests, of which an allocation uses one: [`needed`] counts,
/// per request, the fewest devices a subrequest asks for (none when the constraint leaves one
/// of its subrequests out), the least the requests need.
///
/// [`needed`]: ConstraintExplanation::needed
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ConstraintExplanation {
    /// Position of the constraint in the claim.
    pub constraint: usize,
    /// `matchAttribute` or `distinctAttribute`.
    pub kind: ConstraintKind,
    /// The fully qualified attribute.
    pub attribute: String,
    /// The requests it applies to, named as in [`Explanation::requests`] (`request` or
    /// `request/subrequest`): every request when the constraint names none.
    pub requests: Vec<String>,
    /// Devices those requests need together (the sum of their counts); `None` when one of them
    /// asks for `All` devices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub needed: Option<usize>,
    /// Whether the available devices are enough as far as counting goes: with `matchAttribute`,
    /// some value has enough devices for each request and for all of them together (a device
    /// allowing multiple allocations counts once per request); with `distinctAttribute`, the
    /// devices have at least `needed` different values. Necessary, not sufficient: the search
    /// may still find no way to split the devices among the requests, as the outcome says.
    /// `None` when `needed` is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enough: Option<bool>,
    /// The available devices by value of the attribute, values in the order of their first
    /// device; a device with a list attribute is listed under each of its values.
    pub values: Vec<ConstraintValue>,
}

/// One value of a constraint's attribute and the available devices having it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ConstraintValue {
    /// The value: a string or version as it is, an int or bool as JSON writes it.
    pub value: String,
    /// The devices having it, in the order the allocator tries them.
    pub devices: Vec<ConstraintDevice>,
}

/// A device available for some of a constraint's requests.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ConstraintDevice {
    /// The driver publishing it.
    pub driver: String,
    /// Its pool.
    pub pool: String,
    /// Its name.
    pub device: String,
    /// The constraint's requests it could be taken for.
    pub requests: Vec<String>,
}

fn devices_text(n: usize) -> String {
    if n == 1 {
        "1 device".to_owned()
    } else {
        format!("{n} devices")
    }
}

impl fmt::Display for ConstraintExplanation {
    /// `constraint #0 (matchAttribute gpu.example.com/nvlinkGroup, requests a, b): needs 2
    /// devices with one value, but no value has enough available devices: nvl-0: gpu-2; nvl-1:
    /// gpu-3`, with `(for a only)` after a device available for some of the requests only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let requests = match self.requests.as_slice() {
            [one] => format!("request {one}"),
            [] => "no request".to_owned(),
            all => format!("requests {}", all.join(", ")),
        };
        write!(
            f,
            "constraint #{} ({} {}, {requests}): needs ",
            self.constraint, self.kind, self.attribute
        )?;
        f.write_str(&match self.needed {
            Some(n) => devices_text(n),
            None => "all matching devices".to_owned(),
        })?;
        f.write_str(match self.kind {
            ConstraintKind::MatchAttribute => " with one value",
            ConstraintKind::DistinctAttribute => " with different values",
        })?;
        match (self.enough, self.kind) {
            (Some(false), _) if self.values.is_empty() => {
                return f.write_str(", but no available device has the attribute");
            }
            (Some(false), ConstraintKind::MatchAttribute) => {
                f.write_str(", but no value has enough available devices: ")?;
            }
            (Some(false), _) => {
                f.write_str(", but the available devices have too few different values: ")?;
            }
            _ => f.write_str("; available devices by value: ")?,
        }
        if self.values.is_empty() {
            return f.write_str("none");
        }
        for (i, value) in self.values.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: ", value.value)?;
            for (j, device) in value.devices.iter().enumerate() {
                if j > 0 {
                    f.write_str(", ")?;
                }
                f.write_str(&device.device)?;
                if device.requests.len() < self.requests.len() {
                    write!(f, " (for {} only)", device.requests.join(", "))?;
                }
            }
        }
        Ok(())
    }
}

/// A request's name without its subrequest.
fn base_request(name: &str) -> &str {
    name.split_once('/').map_or(name, |(base, _)| base)
}

fn value_text(value: &AttributeValue) -> String {
    match value {
        AttributeValue::Int(v) => v.to_string(),
        AttributeValue::Bool(v) => v.to_string(),
        AttributeValue::String(v) | AttributeValue::Version(v) => v.clone(),
    }
}

/// The explanation of each well-formed constraint of the claim, from the verdicts of its
/// requests (with the chosen devices marked) and the devices' attributes.
pub(crate) fn explain_constraints(
    allocator: &Allocator,
    claim: &model::Claim,
    requests: &[RequestExplanation],
) -> Vec<ConstraintExplanation> {
    claim
        .spec
        .devices
        .constraints
        .iter()
        .enumerate()
        .filter_map(|(index, constraint)| {
            let (kind, attribute) = constraint.kind()?;
            Some(explain_constraint(
                allocator,
                index,
                kind,
                attribute,
                &constraint.requests,
                requests,
            ))
        })
        .collect()
}

/// An available device while a constraint is explained.
struct Candidate<'a> {
    explained: ConstraintDevice,
    data: &'a DeviceData,
}

fn explain_constraint(
    allocator: &Allocator,
    index: usize,
    kind: ConstraintKind,
    attribute: &str,
    named: &[String],
    requests: &[RequestExplanation],
) -> ConstraintExplanation {
    let covers = |request: &RequestExplanation| {
        constraint_applies(named, base_request(&request.request), &request.request)
    };
    let count = |request: &RequestExplanation| {
        request
            .count
            .map_or(1, |count| usize::try_from(count).unwrap_or(0))
    };
    let covered: Vec<&RequestExplanation> = requests.iter().filter(|r| covers(r)).collect();
    // The requests (by name) with the covered ones, each with its entries (subrequests).
    let mut bases: Vec<(&str, Vec<&RequestExplanation>)> = Vec::new();
    for request in requests {
        let base = base_request(&request.request);
        match bases.iter_mut().find(|(name, _)| *name == base) {
            Some((_, entries)) => entries.push(request),
            None => bases.push((base, vec![request])),
        }
    }
    bases.retain(|(_, entries)| entries.iter().any(|e| covers(e)));
    let all = covered.iter().any(|r| r.allocation_mode == "All");
    let needed = (!all).then(|| {
        bases
            .iter()
            .map(|(_, entries)| {
                entries
                    .iter()
                    .map(|e| if covers(e) { count(e) } else { 0 })
                    .min()
                    .unwrap_or(0)
            })
            .sum::<usize>()
    });

    // The devices available for a covered request, in the allocator's order.
    let verdicts: Vec<HashMap<(&str, &str, &str), &Verdict>> = covered
        .iter()
        .map(|request| {
            request
                .devices
                .iter()
                .map(|d| {
                    (
                        (d.driver.as_str(), d.pool.as_str(), d.device.as_str()),
                        &d.verdict,
                    )
                })
                .collect()
        })
        .collect();
    let mut candidates = Vec::new();
    for pool in &allocator.pools {
        for device in pool.slices.iter().flat_map(|slice| &slice.devices) {
            let key = (
                pool.driver.as_str(),
                pool.name.as_str(),
                device.raw.name.as_str(),
            );
            let available_for: Vec<String> = covered
                .iter()
                .zip(&verdicts)
                .filter(|(_, verdicts)| verdicts.get(&key).is_some_and(|v| v.is_available()))
                .map(|(request, _)| request.request.clone())
                .collect();
            if available_for.is_empty() {
                continue;
            }
            candidates.push(Candidate {
                explained: ConstraintDevice {
                    driver: pool.driver.clone(),
                    pool: pool.name.clone(),
                    device: device.raw.name.clone(),
                    requests: available_for,
                },
                data: device,
            });
        }
    }

    // Grouped by value (set semantics: a device counts under each of its values).
    let mut groups: Vec<(&AttributeValue, Vec<&Candidate<'_>>)> = Vec::new();
    for candidate in &candidates {
        let values = candidate
            .data
            .attributes
            .get(attribute)
            .into_iter()
            .flatten();
        let mut seen: Vec<&AttributeValue> = Vec::new();
        for value in values {
            if seen.contains(&value) {
                continue;
            }
            seen.push(value);
            match groups.iter_mut().find(|(v, _)| *v == value) {
                Some((_, devices)) => devices.push(candidate),
                None => groups.push((value, vec![candidate])),
            }
        }
    }

    let enough = needed.map(|needed| match kind {
        ConstraintKind::MatchAttribute if needed == 0 => true,
        ConstraintKind::MatchAttribute => groups.iter().any(|(_, devices)| {
            // A device allowing multiple allocations serves each request once.
            let total: usize = devices
                .iter()
                .map(|d| {
                    if d.data.multi {
                        let mut served: Vec<&str> = d
                            .explained
                            .requests
                            .iter()
                            .map(|r| base_request(r))
                            .collect();
                        served.dedup();
                        served.len()
                    } else {
                        1
                    }
                })
                .sum();
            let each = bases.iter().all(|(_, entries)| {
                entries.iter().any(|entry| {
                    !covers(entry)
                        || devices
                            .iter()
                            .filter(|d| d.explained.requests.contains(&entry.request))
                            .count()
                            >= count(entry)
                })
            });
            total >= needed && each
        }),
        ConstraintKind::DistinctAttribute => candidates.len() >= needed && groups.len() >= needed,
    });

    ConstraintExplanation {
        constraint: index,
        kind,
        attribute: attribute.to_owned(),
        requests: covered.iter().map(|r| r.request.clone()).collect(),
        needed,
        enough,
        values: groups
            .into_iter()
            .map(|(value, devices)| ConstraintValue {
                value: value_text(value),
                devices: devices.into_iter().map(|d| d.explained.clone()).collect(),
            })
            .collect(),
    }
}

/// The devices available on a node and what holds them: [`Allocator::node_devices`].
///
/// [`Allocator::node_devices`]: super::Allocator::node_devices
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct NodeDevices {
    /// The node.
    pub node: String,
    /// Its devices, in the order the allocator tries them.
    pub devices: Vec<NodeDevice>,
    /// The counter sets of the pools with devices on the node.
    pub counter_sets: Vec<CounterSetUsage>,
}

/// A device available on a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct NodeDevice {
    /// The driver publishing it.
    pub driver: String,
    /// Its pool.
    pub pool: String,
    /// Its name.
    pub device: String,
    /// `allowMultipleAllocations`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub allow_multiple_allocations: bool,
    /// Why its pool is not used, when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool_problem: Option<String>,
    /// The claims holding it.
    pub holders: Vec<Holder>,
    /// Its capacities, with what shares consume of them.
    pub capacity: Vec<CapacityUsage>,
    /// What it consumes of its pool's counter sets when allocated.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub consumes_counters: BTreeMap<String, BTreeMap<String, String>>,
    /// Its taints, as `key=value:Effect`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<String>,
}

/// A capacity of a device and what shares of it consume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct CapacityUsage {
    /// The capacity's name.
    pub name: String,
    /// The device's capacity.
    pub total: String,
    /// What shares consume (only devices allowing multiple allocations are shared).
    pub used: String,
}

/// A counter set of a pool and what is left of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct CounterSetUsage {
    /// The driver.
    pub driver: String,
    /// The pool.
    pub pool: String,
    /// The counter set.
    pub counter_set: String,
    /// Each counter: what the set has and what is left.
    pub counters: Vec<CounterUsage>,
    /// The allocated devices consuming it.
    pub holders: Vec<CounterHolder>,
}

/// One counter of a counter set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct CounterUsage {
    /// The counter.
    pub counter: String,
    /// What the set has.
    pub total: String,
    /// What allocated devices leave.
    pub left: String,
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
    use serde_json::{Value, json};

    use super::super::{AllocationError, Allocator};
    use super::*;

    const GPU: &str = "gpu.example.com";
    const NIC: &str = "nic.example.com";

    fn from_json<T: serde::de::DeserializeOwned>(value: Value) -> T {
        serde_json::from_value(value).unwrap()
    }

    fn slice(name: &str, driver: &str, pool: &str, count: i64, placement: Value) -> Value {
        let mut spec = json!({
            "driver": driver,
            "pool": { "name": pool, "generation": 1, "resourceSliceCount": count },
        });
        spec.as_object_mut()
            .unwrap()
            .extend(placement.as_object().unwrap().clone());
        json!({ "metadata": { "name": name }, "spec": spec })
    }

    /// node-a: gpu-0 (held by default/training), gpu-1 (tainted), gpu-2 (80Gi), gpu-3 (no
    /// memory); partitions of gpu-4 (held whole by default/whole); a shared NIC for zone a
    /// (two 4G shares held); an incomplete pool; node-b: one GPU.
    fn cluster() -> (
        Vec<ResourceSlice>,
        Vec<DeviceClass>,
        Vec<ResourceClaim>,
        Vec<Node>,
    ) {
        let model = |m: &str| json!({ "model": { "string": m } });
        let slices = vec![
            slice(
                "a-gpus",
                GPU,
                "node-a",
                1,
                json!({ "nodeName": "node-a", "devices": [
                { "name": "gpu-0", "attributes": model("a100"), "capacity": { "memory": { "value": "40Gi" } } },
                { "name": "gpu-1", "attributes": model("a100"), "capacity": { "memory": { "value": "40Gi" } },
                  "taints": [{ "key": "xid", "value": "79", "effect": "NoSchedule" }] },
                { "name": "gpu-2", "attributes": model("h100"), "capacity": { "memory": { "value": "80Gi" } } },
                { "name": "gpu-3", "attributes": model("t4") },
            ] }),
            ),
            slice(
                "a-parts-0",
                GPU,
                "node-a-parts",
                2,
                json!({ "nodeName": "node-a",
                "sharedCounters": [{ "name": "gpu-4", "counters": { "memory": { "value": "40Gi" } } }] }),
            ),
            slice(
                "a-parts-1",
                GPU,
                "node-a-parts",
                2,
                json!({ "nodeName": "node-a", "devices": [
                { "name": "gpu-4", "attributes": model("a30"),
                  "consumesCounters": [{ "counterSet": "gpu-4", "counters": { "memory": { "value": "40Gi" } } }] },
                { "name": "gpu-4-half", "attributes": model("a30-half"),
                  "consumesCounters": [{ "counterSet": "gpu-4", "counters": { "memory": { "value": "20Gi" } } }] },
            ] }),
            ),
            slice(
                "a-updating",
                GPU,
                "node-a-updating",
                2,
                json!({ "nodeName": "node-a", "devices": [
                { "name": "gpu-9", "attributes": model("h100") },
            ] }),
            ),
            slice(
                "b-gpus",
                GPU,
                "node-b",
                1,
                json!({ "nodeName": "node-b", "devices": [
                { "name": "gpu-0", "attributes": model("v100") },
            ] }),
            ),
            slice(
                "nics",
                NIC,
                "rack-a",
                1,
                json!({
                    "nodeSelector": { "nodeSelectorTerms": [{ "matchExpressions": [
                        { "key": "zone", "operator": "In", "values": ["a"] }] }] },
                    "devices": [{ "name": "nic-0", "allowMultipleAllocations": true, "capacity": {
                        "bandwidth": { "value": "10G", "requestPolicy": {
                            "default": "1G", "validRange": { "min": "1G", "max": "4G", "step": "1G" } } } } }],
                }),
            ),
        ];
        let class = |name: &str, driver: &str| {
            json!({ "metadata": { "name": name }, "spec": { "selectors": [
                { "cel": { "expression": format!("device.driver == '{driver}'") } }] } })
        };
        let held = |name: &str, request: &str, mut result: Value| {
            result["request"] = json!(request);
            json!({
                "metadata": { "name": name, "namespace": "default", "uid": format!("uid-{name}") },
                "spec": { "devices": { "requests": [] } },
                "status": { "allocation": { "devices": { "results": [result] } } },
            })
        };
        let claims = vec![
            held(
                "training",
                "gpu",
                json!({ "driver": GPU, "pool": "node-a", "device": "gpu-0" }),
            ),
            held(
                "whole",
                "gpu",
                json!({ "driver": GPU, "pool": "node-a-parts", "device": "gpu-4" }),
            ),
            held(
                "net-a",
                "nic",
                json!({ "driver": NIC, "pool": "rack-a", "device": "nic-0",
                "shareID": "share-a", "consumedCapacity": { "bandwidth": "4G" } }),
            ),
            held(
                "net-b",
                "nic",
                json!({ "driver": NIC, "pool": "rack-a", "device": "nic-0",
                "shareID": "share-b", "consumedCapacity": { "bandwidth": "4G" } }),
            ),
            held(
                "debug",
                "gpu",
                json!({ "driver": GPU, "pool": "node-a", "device": "gpu-2",
                "adminAccess": true }),
            ),
        ];
        let nodes = vec![
            json!({ "metadata": { "name": "node-a", "labels": { "zone": "a" } } }),
            json!({ "metadata": { "name": "node-b", "labels": { "zone": "b" } } }),
        ];
        (
            slices.into_iter().map(from_json).collect(),
            vec![
                from_json(class(GPU, GPU)),
                from_json(class(NIC, NIC)),
                from_json(class("other", "other.example.com")),
            ],
            claims.into_iter().map(from_json).collect(),
            nodes.into_iter().map(from_json).collect(),
        )
    }

    fn allocator() -> Allocator {
        let (slices, classes, claims, nodes) = cluster();
        Allocator::new(&slices, &classes, &claims).with_nodes(&nodes)
    }

    fn claim(name: &str, devices: Value) -> ResourceClaim {
        from_json(json!({
            "metadata": { "name": name, "namespace": "default", "uid": format!("uid-{name}") },
            "spec": { "devices": devices },
        }))
    }

    /// One request `r` with these `exactly` fields.
    fn exactly(name: &str, exactly: Value) -> ResourceClaim {
        claim(
            name,
            json!({ "requests": [{ "name": "r", "exactly": exactly }] }),
        )
    }

    fn selecting(model: &str) -> Value {
        json!([{ "cel": { "expression": format!("device.attributes['{GPU}'].model == '{model}'") } }])
    }

    /// Verdicts of request `r`, by `pool/device`.
    fn verdicts(explanation: &Explanation) -> BTreeMap<String, Verdict> {
        explanation.requests[0]
            .devices
            .iter()
            .map(|d| (format!("{}/{}", d.pool, d.device), d.verdict.clone()))
            .collect()
    }

    #[test]
    fn every_device_gets_the_first_reason_that_rules_it_out() {
        let allocator = allocator();
        let explanation = allocator
            .explain(
                &exactly(
                    "a100",
                    json!({ "deviceClassName": GPU, "selectors": selecting("a100") }),
                ),
                "node-a",
            )
            .unwrap();
        assert!(!explanation.allocatable());
        let v = verdicts(&explanation);
        assert_eq!(
            v["node-a/gpu-0"],
            Verdict::Allocated {
                holders: vec![Holder {
                    claim: "default/training".into(),
                    request: "gpu".into(),
                    share_id: None,
                    consumed_capacity: BTreeMap::new(),
                    admin_access: false,
                }]
            }
        );
        assert_eq!(
            v["node-a/gpu-1"],
            Verdict::Tainted {
                key: "xid".into(),
                value: Some("79".into()),
                effect: "NoSchedule".into()
            }
        );
        assert_eq!(
            v["node-a/gpu-1"].to_string(),
            "taint xid=79:NoSchedule not tolerated"
        );
        assert!(
            matches!(&v["node-a/gpu-2"], Verdict::RequestSelectorFalse { request, index: 0, expression }
                if request == "r" && expression.contains("'a100'")),
            "{:?}",
            v["node-a/gpu-2"]
        );
        assert_eq!(
            v["node-b/gpu-0"],
            Verdict::NodeNotEligible {
                reason: NodeMismatch::OtherNode {
                    node: "node-b".into()
                }
            }
        );
        assert_eq!(
            v["node-a-updating/gpu-9"],
            Verdict::PoolUnusable {
                pool: "gpu.example.com/node-a-updating".into(),
                reason: "being updated (it has fewer slices of its newest generation than resourceSliceCount)".into(),
            }
        );
        assert!(
            matches!(&v["rack-a/nic-0"], Verdict::ClassSelectorFalse { class, index: 0, .. } if class == GPU)
        );
        // The outcome is allocate's.
        let error = allocator
            .allocate(
                &exactly(
                    "a100",
                    json!({ "deviceClassName": GPU, "selectors": selecting("a100") }),
                ),
                "node-a",
            )
            .unwrap_err();
        assert_eq!(
            explanation.outcome.as_ref().unwrap_err().to_string(),
            error.to_string()
        );

        // On node-b the NIC's node selector does not match.
        let on_b = allocator
            .explain(&exactly("nic", json!({ "deviceClassName": NIC })), "node-b")
            .unwrap();
        assert_eq!(
            verdicts(&on_b)["rack-a/nic-0"],
            Verdict::NodeNotEligible {
                reason: NodeMismatch::NodeSelector
            }
        );
    }

    #[test]
    fn capacity_counters_and_shares_name_what_holds_them() {
        let allocator = allocator();
        let too_big = allocator
            .explain(&exactly("big", json!({ "deviceClassName": GPU,
                "capacity": { "requests": { "memory": "100Gi" } },
                "selectors": [{ "cel": { "expression": format!("device.attributes['{GPU}'].model in ['h100', 't4']") } }] })), "node-a")
            .unwrap();
        let v = verdicts(&too_big);
        assert_eq!(
            v["node-a/gpu-2"],
            Verdict::CapacityTooSmall {
                capacity: "memory".into(),
                requested: "100Gi".into(),
                available: "80Gi".into()
            }
        );
        assert_eq!(
            v["node-a/gpu-3"],
            Verdict::CapacityMissing {
                capacity: "memory".into()
            }
        );

        let half = allocator
            .explain(
                &exactly(
                    "half",
                    json!({ "deviceClassName": GPU, "selectors": selecting("a30-half") }),
                ),
                "node-a",
            )
            .unwrap();
        let verdict = &verdicts(&half)["node-a-parts/gpu-4-half"];
        assert_eq!(
            *verdict,
            Verdict::CountersExhausted {
                counter_set: "gpu-4".into(),
                counter: "memory".into(),
                needed: "20Gi".into(),
                left: "0".into(),
                total: "40Gi".into(),
                holders: vec![CounterHolder {
                    device: "gpu-4".into(),
                    claims: vec!["default/whole".into()],
                    counters: BTreeMap::from([("memory".into(), "40Gi".into())]),
                }],
            }
        );
        assert_eq!(
            verdict.to_string(),
            "counter set gpu-4 exhausted: memory 20Gi needed, 0 of 40Gi left (held by default/whole on gpu-4 (memory=40Gi))"
        );

        let policy = allocator
            .explain(&exactly("fat", json!({ "deviceClassName": NIC, "capacity": { "requests": { "bandwidth": "5G" } } })), "node-a")
            .unwrap();
        assert_eq!(
            verdicts(&policy)["rack-a/nic-0"],
            Verdict::CapacityPolicy {
                capacity: "bandwidth".into(),
                amount: "5G".into(),
                reason: "above validRange.max 4G".into()
            }
        );
        let exhausted = allocator
            .explain(&exactly("share", json!({ "deviceClassName": NIC, "capacity": { "requests": { "bandwidth": "3G" } } })), "node-a")
            .unwrap();
        match &verdicts(&exhausted)["rack-a/nic-0"] {
            Verdict::CapacityExhausted {
                capacity,
                needed,
                used,
                total,
                holders,
            } => {
                assert_eq!(
                    (
                        capacity.as_str(),
                        needed.as_str(),
                        used.as_str(),
                        total.as_str()
                    ),
                    ("bandwidth", "3G", "8G", "10G")
                );
                let shares: Vec<_> = holders
                    .iter()
                    .map(|h| (h.claim.as_str(), h.share_id.as_deref()))
                    .collect();
                assert_eq!(
                    shares,
                    [
                        ("default/net-a", Some("share-a")),
                        ("default/net-b", Some("share-b"))
                    ]
                );
            }
            other => panic!("{other:?}"),
        }
        // 2G fits next to the shares: chosen, with its share.
        let fits = allocator
            .explain(&exactly("small", json!({ "deviceClassName": NIC, "capacity": { "requests": { "bandwidth": "2G" } } })), "node-a")
            .unwrap();
        assert!(fits.allocatable());
        match &verdicts(&fits)["rack-a/nic-0"] {
            Verdict::Chosen {
                share_id: Some(_),
                consumed_capacity,
            } => {
                assert_eq!(consumed_capacity["bandwidth"], "2G");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn cel_problems_are_per_device_verdicts_and_fail_the_claim() {
        let allocator = allocator();
        let missing = allocator
            .explain(&exactly("vendor", json!({ "deviceClassName": GPU, "selectors": [
                { "cel": { "expression": format!("device.attributes['{GPU}'].vendor == 'acme'") } }] })), "node-a")
            .unwrap();
        match &verdicts(&missing)["node-a/gpu-3"] {
            Verdict::MissingAttribute {
                selector,
                name,
                message,
            } => {
                assert_eq!(selector.owner, SelectorOwner::Request("r".into()));
                assert_eq!(
                    (name.as_str(), message.as_str()),
                    ("vendor", "no such key: vendor")
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            missing.outcome,
            Err(AllocationError::CelRuntime { .. })
        ));

        let runtime = allocator
            .explain(
                &exactly(
                    "n",
                    json!({ "deviceClassName": GPU, "selectors": [
                { "cel": { "expression": format!("device.attributes['{GPU}'].model > 5") } }] }),
                ),
                "node-a",
            )
            .unwrap();
        assert!(matches!(&verdicts(&runtime)["node-a/gpu-2"],
            Verdict::CelError { stage: CelStage::Runtime, message, .. } if message.contains("no matching overload")));

        let compile = allocator
            .explain(&exactly("c", json!({ "deviceClassName": GPU, "selectors": [{ "cel": { "expression": "device.driver ==" } }] })), "node-a")
            .unwrap();
        let verdict = &verdicts(&compile)["node-a/gpu-2"];
        assert!(
            matches!(
                verdict,
                Verdict::CelError {
                    stage: CelStage::Compile,
                    ..
                }
            ),
            "{verdict:?}"
        );
        assert!(!verdict.to_string().contains('\n'), "one line: {verdict}");
        assert!(matches!(
            compile.outcome,
            Err(AllocationError::CelCompile { .. })
        ));

        // Tolerated, a missing attribute is still reported, and the claim fails for lack of
        // devices instead.
        let (slices, classes, claims, nodes) = cluster();
        let tolerant = Allocator::new(&slices, &classes, &claims)
            .with_nodes(&nodes)
            .tolerate_missing_attributes();
        let explanation = tolerant
            .explain(&exactly("vendor", json!({ "deviceClassName": GPU, "selectors": [
                { "cel": { "expression": format!("device.attributes['{GPU}'].vendor == 'acme'") } }] })), "node-a")
            .unwrap();
        assert_eq!(
            verdicts(&explanation)["node-a/gpu-3"].name(),
            "missingAttribute"
        );
        assert!(matches!(
            explanation.outcome,
            Err(AllocationError::Unsatisfiable { .. })
        ));
    }

    #[test]
    fn chosen_devices_constraints_and_requests_that_cannot_be_built() {
        let allocator = allocator();
        let two = claim(
            "two",
            json!({ "requests": [
            { "name": "a", "exactly": { "deviceClassName": GPU, "selectors": selecting("h100") } },
            { "name": "b", "exactly": { "deviceClassName": GPU, "selectors": [
                { "cel": { "expression": format!("device.attributes['{GPU}'].model in ['h100', 't4']") } }] } },
        ] }),
        );
        let explanation = allocator.explain(&two, "node-a").unwrap();
        let allocation = allocator.allocate(&two, "node-a").unwrap();
        assert_eq!(
            serde_json::to_value(explanation.outcome.as_ref().unwrap()).unwrap(),
            serde_json::to_value(&allocation).unwrap(),
            "explain's outcome is allocate's"
        );
        let b = explanation.request("b").unwrap();
        assert_eq!(
            b.verdict("gpu-2"),
            Some(&Verdict::ChosenForOtherRequest {
                request: "a".into()
            })
        );
        assert!(matches!(
            b.verdict("gpu-3"),
            Some(Verdict::Chosen { share_id: None, .. })
        ));

        let constrained = claim(
            "same",
            json!({
                "requests": [
                    { "name": "a", "exactly": { "deviceClassName": GPU } },
                    { "name": "b", "exactly": { "deviceClassName": GPU, "adminAccess": true } },
                ],
                "constraints": [{ "matchAttribute": format!("{GPU}/index"), "requests": ["a"] }],
            }),
        );
        let explanation = allocator.explain(&constrained, "node-a").unwrap();
        assert_eq!(
            explanation.request("a").unwrap().verdict("gpu-2"),
            Some(&Verdict::ConstraintAttributeMissing {
                constraint: 0,
                attribute: format!("{GPU}/index")
            })
        );
        // Admin access ignores holders; the constraint does not apply to b.
        assert!(
            explanation
                .request("b")
                .unwrap()
                .verdict("gpu-0")
                .unwrap()
                .is_available()
        );

        let unknown = claim(
            "unknown",
            json!({ "requests": [
            { "name": "x", "exactly": { "deviceClassName": "missing" } },
            { "name": "y", "firstAvailable": [
                { "name": "big", "deviceClassName": GPU, "selectors": selecting("b200") },
                { "name": "any", "deviceClassName": GPU },
            ] },
        ] }),
        );
        let explanation = allocator.explain(&unknown, "node-a").unwrap();
        let names: Vec<&str> = explanation
            .requests
            .iter()
            .map(|r| r.request.as_str())
            .collect();
        assert_eq!(names, ["x", "y/big", "y/any"]);
        let x = explanation.request("x").unwrap();
        assert!(x.devices.is_empty());
        assert_eq!(
            x.error.as_deref(),
            Some(
                "claim default/unknown, request x: could not retrieve device class missing: not found"
            )
        );
        assert!(
            explanation
                .request("y/any")
                .unwrap()
                .verdict("gpu-2")
                .unwrap()
                .is_available()
        );
        assert!(matches!(
            explanation.outcome,
            Err(AllocationError::UnknownDeviceClass { .. })
        ));
    }

    #[test]
    fn node_devices_show_holders_shares_and_counters_left() {
        let devices = allocator().node_devices("node-a");
        let names: Vec<&str> = devices.devices.iter().map(|d| d.device.as_str()).collect();
        assert_eq!(
            names,
            [
                "gpu-0",
                "gpu-1",
                "gpu-2",
                "gpu-3",
                "gpu-4",
                "gpu-4-half",
                "gpu-9",
                "nic-0"
            ]
        );
        let device = |name: &str| devices.devices.iter().find(|d| d.device == name).unwrap();
        assert_eq!(device("gpu-0").holders[0].claim, "default/training");
        assert!(
            device("gpu-2").holders[0].admin_access,
            "admin access is shown"
        );
        assert_eq!(device("gpu-1").taints, ["xid=79:NoSchedule"]);
        assert_eq!(
            device("gpu-9").pool_problem.as_deref(),
            Some("being updated")
        );
        let nic = device("nic-0");
        assert!(nic.allow_multiple_allocations);
        assert_eq!(nic.holders.len(), 2);
        assert_eq!(
            nic.capacity,
            [CapacityUsage {
                name: "bandwidth".into(),
                total: "10G".into(),
                used: "8G".into()
            }]
        );
        assert_eq!(
            device("gpu-4-half").consumes_counters["gpu-4"]["memory"],
            "20Gi"
        );
        assert_eq!(devices.counter_sets.len(), 1);
        let set = &devices.counter_sets[0];
        assert_eq!(
            (set.pool.as_str(), set.counter_set.as_str()),
            ("node-a-parts", "gpu-4")
        );
        assert_eq!(
            set.counters,
            [CounterUsage {
                counter: "memory".into(),
                total: "40Gi".into(),
                left: "0".into()
            }]
        );
        assert_eq!(set.holders[0].claims, ["default/whole"]);

        let b = allocator().node_devices("node-b");
        let names: Vec<&str> = b.devices.iter().map(|d| d.device.as_str()).collect();
        assert_eq!(names, ["gpu-0"], "the NIC's selector does not match zone b");
    }

    #[test]
    fn verdicts_serialize_with_their_name() {
        let verdict = Verdict::NodeNotEligible {
            reason: NodeMismatch::OtherNode { node: "n".into() },
        };
        assert_eq!(
            serde_json::to_value(&verdict).unwrap(),
            json!({ "verdict": "nodeNotEligible", "reason": { "kind": "otherNode", "node": "n" } })
        );
        let device = DeviceExplanation {
            driver: "d".into(),
            pool: "p".into(),
            device: "x".into(),
            verdict: Verdict::CapacityMissing {
                capacity: "memory".into(),
            },
        };
        assert_eq!(
            serde_json::to_value(&device).unwrap(),
            json!({ "driver": "d", "pool": "p", "device": "x", "verdict": "capacityMissing", "capacity": "memory" })
        );
        assert_eq!(device.verdict.name(), "capacityMissing");
    }

    const NVLINK: &str = "gpu.example.com/nvlinkGroup";

    /// node-a: five GPUs, gpu-0 and gpu-2 (an h100) in NVLink group nvl-0, gpu-1 and gpu-3 in
    /// nvl-1, gpu-4 in none; the devices `held` are allocated to other claims.
    fn nvlink(held: &[&str]) -> Allocator {
        let gpu = |name: &str, model: &str, group: Option<&str>| {
            let mut attributes = json!({ "model": { "string": model } });
            if let Some(group) = group {
                attributes["nvlinkGroup"] = json!({ "string": group });
            }
            json!({ "name": name, "attributes": attributes })
        };
        let slices = vec![from_json(slice(
            "a-gpus",
            GPU,
            "node-a",
            1,
            json!({ "nodeName": "node-a", "devices": [
                gpu("gpu-0", "a100", Some("nvl-0")),
                gpu("gpu-1", "a100", Some("nvl-1")),
                gpu("gpu-2", "h100", Some("nvl-0")),
                gpu("gpu-3", "a100", Some("nvl-1")),
                gpu("gpu-4", "a100", None),
            ] }),
        ))];
        let class = from_json(
            json!({ "metadata": { "name": GPU }, "spec": { "selectors": [
            { "cel": { "expression": format!("device.driver == '{GPU}'") } }] } }),
        );
        let claims: Vec<ResourceClaim> = held
            .iter()
            .map(|device| {
                from_json(json!({
                    "metadata": { "name": format!("on-{device}"), "namespace": "default" },
                    "spec": { "devices": { "requests": [] } },
                    "status": { "allocation": { "devices": { "results": [
                        { "request": "gpu", "driver": GPU, "pool": "node-a", "device": device }] } } },
                }))
            })
            .collect();
        Allocator::new(&slices, &[class], &claims)
    }

    /// Requests `a` and `b` (with these `exactly` fields each) matching on the NVLink group.
    fn pair(a: Value, b: Value) -> ResourceClaim {
        claim(
            "pair",
            json!({
                "requests": [
                    { "name": "a", "exactly": a },
                    { "name": "b", "exactly": b },
                ],
                "constraints": [{ "matchAttribute": NVLINK }],
            }),
        )
    }

    fn grouped(constraint: &ConstraintExplanation) -> Vec<(&str, Vec<&str>)> {
        constraint
            .values
            .iter()
            .map(|v| {
                (
                    v.value.as_str(),
                    v.devices.iter().map(|d| d.device.as_str()).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn constraints_group_the_available_devices_by_value() {
        let any = json!({ "deviceClassName": GPU });
        // gpu-0 and gpu-3 are free, but in different groups: the pair is refused.
        let explanation = nvlink(&["gpu-1", "gpu-2"])
            .explain(&pair(any.clone(), any.clone()), "node-a")
            .unwrap();
        assert!(!explanation.allocatable());
        assert_eq!(
            explanation.request("a").unwrap().verdict("gpu-4"),
            Some(&Verdict::ConstraintAttributeMissing {
                constraint: 0,
                attribute: NVLINK.into()
            })
        );
        let [constraint] = explanation.constraints.as_slice() else {
            panic!("{:?}", explanation.constraints)
        };
        assert_eq!(
            (
                constraint.constraint,
                constraint.kind,
                constraint.attribute.as_str(),
                constraint.requests.clone(),
                constraint.needed,
                constraint.enough,
            ),
            (
                0,
                ConstraintKind::MatchAttribute,
                NVLINK,
                vec!["a".to_owned(), "b".to_owned()],
                Some(2),
                Some(false)
            )
        );
        assert_eq!(
            grouped(constraint),
            [("nvl-0", vec!["gpu-0"]), ("nvl-1", vec!["gpu-3"])]
        );
        assert_eq!(
            constraint.to_string(),
            "constraint #0 (matchAttribute gpu.example.com/nvlinkGroup, requests a, b): needs 2 devices with one value, but no value has enough available devices: nvl-0: gpu-0; nvl-1: gpu-3"
        );
        assert_eq!(
            serde_json::to_value(constraint).unwrap(),
            json!({
                "constraint": 0, "kind": "matchAttribute", "attribute": NVLINK,
                "requests": ["a", "b"], "needed": 2, "enough": false,
                "values": [
                    { "value": "nvl-0", "devices": [
                        { "driver": GPU, "pool": "node-a", "device": "gpu-0", "requests": ["a", "b"] }] },
                    { "value": "nvl-1", "devices": [
                        { "driver": GPU, "pool": "node-a", "device": "gpu-3", "requests": ["a", "b"] }] },
                ],
            })
        );

        // With gpu-2 free, nvl-0 has two: the pair is allocated there (chosen devices count).
        let explanation = nvlink(&["gpu-1"])
            .explain(&pair(any.clone(), any.clone()), "node-a")
            .unwrap();
        assert!(explanation.allocatable());
        let constraint = &explanation.constraints[0];
        assert_eq!(constraint.enough, Some(true));
        assert_eq!(
            constraint.to_string(),
            "constraint #0 (matchAttribute gpu.example.com/nvlinkGroup, requests a, b): needs 2 devices with one value; available devices by value: nvl-0: gpu-0, gpu-2; nvl-1: gpu-3"
        );

        // One request for two: the same, with the request's count.
        let two = claim(
            "two",
            json!({
                "requests": [{ "name": "gpus", "exactly": { "deviceClassName": GPU, "count": 2 } }],
                "constraints": [{ "matchAttribute": NVLINK, "requests": ["gpus"] }],
            }),
        );
        let explanation = nvlink(&["gpu-1", "gpu-2"]).explain(&two, "node-a").unwrap();
        assert!(!explanation.allocatable());
        assert_eq!(
            explanation.constraints[0].to_string(),
            "constraint #0 (matchAttribute gpu.example.com/nvlinkGroup, request gpus): needs 2 devices with one value, but no value has enough available devices: nvl-0: gpu-0; nvl-1: gpu-3"
        );

        // nvl-1 has two devices, but only for b: each request needs its own in the group.
        let h100 = json!({ "deviceClassName": GPU, "selectors": selecting("h100") });
        let explanation = nvlink(&["gpu-0"])
            .explain(&pair(h100, any.clone()), "node-a")
            .unwrap();
        assert!(!explanation.allocatable());
        let constraint = &explanation.constraints[0];
        assert_eq!(constraint.enough, Some(false));
        assert_eq!(
            constraint.to_string(),
            "constraint #0 (matchAttribute gpu.example.com/nvlinkGroup, requests a, b): needs 2 devices with one value, but no value has enough available devices: nvl-1: gpu-1 (for b only), gpu-3 (for b only); nvl-0: gpu-2"
        );

        // distinctAttribute: two free GPUs of one group are too few values.
        let spread = claim(
            "spread",
            json!({
                "requests": [{ "name": "gpus", "exactly": { "deviceClassName": GPU, "count": 2 } }],
                "constraints": [{ "distinctAttribute": NVLINK }],
            }),
        );
        let explanation = nvlink(&["gpu-1", "gpu-3"])
            .explain(&spread, "node-a")
            .unwrap();
        assert!(!explanation.allocatable());
        assert_eq!(
            explanation.constraints[0].to_string(),
            "constraint #0 (distinctAttribute gpu.example.com/nvlinkGroup, request gpus): needs 2 devices with different values, but the available devices have too few different values: nvl-0: gpu-0, gpu-2"
        );
    }

    #[test]
    fn constraints_on_subrequests_need_the_fewest_devices_a_subrequest_asks_for() {
        let first_available = |requests: Value| {
            claim(
                "fallback",
                json!({
                    "requests": [
                        { "name": "gpu", "firstAvailable": [
                            { "name": "big", "deviceClassName": GPU, "selectors": selecting("h100") },
                            { "name": "two", "deviceClassName": GPU, "count": 2 },
                        ] },
                        { "name": "all", "exactly": { "deviceClassName": GPU, "allocationMode": "All" } },
                    ],
                    "constraints": [{ "matchAttribute": NVLINK, "requests": requests }],
                }),
            )
        };
        let allocator = nvlink(&[]);
        let explain = |requests: Value| {
            allocator
                .explain(&first_available(requests), "node-a")
                .unwrap()
                .constraints
                .remove(0)
        };
        // The request covers both subrequests; one of them is used.
        let constraint = explain(json!(["gpu"]));
        assert_eq!(constraint.requests, ["gpu/big", "gpu/two"]);
        assert_eq!(
            (constraint.needed, constraint.enough),
            (Some(1), Some(true))
        );
        let gpu_2 = &constraint.values[0].devices[1];
        assert_eq!(
            (gpu_2.device.as_str(), gpu_2.requests.clone()),
            ("gpu-2", vec!["gpu/big".to_owned(), "gpu/two".to_owned()])
        );
        // A subrequest alone: the other one needs nothing from the constraint.
        let constraint = explain(json!(["gpu/two"]));
        assert_eq!(constraint.requests, ["gpu/two"]);
        assert_eq!(
            (constraint.needed, constraint.enough),
            (Some(0), Some(true))
        );
        // With an All request nothing is counted.
        let constraint = explain(json!([]));
        assert_eq!(constraint.requests, ["gpu/big", "gpu/two", "all"]);
        assert_eq!((constraint.needed, constraint.enough), (None, None));
        assert_eq!(
            constraint.to_string(),
            "constraint #0 (matchAttribute gpu.example.com/nvlinkGroup, requests gpu/big, gpu/two, all): needs all matching devices with one value; available devices by value: nvl-0: gpu-0 (for gpu/two, all only), gpu-2; nvl-1: gpu-1 (for gpu/two, all only), gpu-3 (for gpu/two, all only)"
        );
    }
}
