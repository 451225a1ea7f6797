//! The parts of `resource.k8s.io/v1` objects the allocator reads, decoded from JSON.
//!
//! The allocator takes k8s-openapi types but reads them through these structs (every field
//! optional, unknown fields ignored), so it works whichever Kubernetes version feature the
//! application selected: field optionality and field sets differ between those versions.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Re-decodes a typed object through JSON.
pub(crate) fn decode<T: DeserializeOwned>(
    object: &impl serde::Serialize,
) -> Result<T, serde_json::Error> {
    serde_json::to_value(object).and_then(serde_json::from_value)
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct Metadata {
    pub(crate) name: Option<String>,
    pub(crate) namespace: Option<String>,
    pub(crate) uid: Option<String>,
}

impl Metadata {
    pub(crate) fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("")
    }
}

// --- ResourceSlice ---

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct Slice {
    pub(crate) metadata: Metadata,
    pub(crate) spec: SliceSpec,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct SliceSpec {
    pub(crate) driver: String,
    pub(crate) pool: Pool,
    pub(crate) node_name: Option<String>,
    pub(crate) node_selector: Option<NodeSelector>,
    pub(crate) all_nodes: Option<bool>,
    pub(crate) per_device_node_selection: Option<bool>,
    pub(crate) devices: Vec<Device>,
    pub(crate) shared_counters: Vec<CounterSet>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct Pool {
    pub(crate) name: String,
    pub(crate) generation: i64,
    pub(crate) resource_slice_count: i64,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct Device {
    pub(crate) name: String,
    pub(crate) attributes: BTreeMap<String, Attribute>,
    pub(crate) capacity: BTreeMap<String, Capacity>,
    pub(crate) consumes_counters: Vec<CounterConsumption>,
    pub(crate) node_name: Option<String>,
    pub(crate) node_selector: Option<NodeSelector>,
    pub(crate) all_nodes: Option<bool>,
    pub(crate) taints: Vec<Taint>,
    pub(crate) binds_to_node: Option<bool>,
    pub(crate) binding_conditions: Vec<String>,
    pub(crate) binding_failure_conditions: Vec<String>,
    pub(crate) allow_multiple_allocations: Option<bool>,
}

/// One attribute value: exactly one field is set (validation guarantees it).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Attribute {
    pub(crate) int: Option<i64>,
    pub(crate) bool: Option<bool>,
    pub(crate) string: Option<String>,
    pub(crate) version: Option<String>,
    pub(crate) ints: Option<Vec<i64>>,
    pub(crate) bools: Option<Vec<bool>>,
    pub(crate) strings: Option<Vec<String>>,
    pub(crate) versions: Option<Vec<String>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct Capacity {
    pub(crate) value: String,
    pub(crate) request_policy: Option<RequestPolicy>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct RequestPolicy {
    pub(crate) default: Option<String>,
    pub(crate) valid_values: Option<Vec<String>>,
    pub(crate) valid_range: Option<RequestPolicyRange>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct RequestPolicyRange {
    pub(crate) min: Option<String>,
    pub(crate) max: Option<String>,
    pub(crate) step: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct CounterSet {
    pub(crate) name: String,
    pub(crate) counters: BTreeMap<String, Counter>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct CounterConsumption {
    pub(crate) counter_set: String,
    pub(crate) counters: BTreeMap<String, Counter>,
    /// `compatibilityGroups` (1.37): unset and empty both mean "no groups".
    pub(crate) compatibility_groups: Vec<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Counter {
    pub(crate) value: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Taint {
    pub(crate) key: String,
    pub(crate) value: Option<String>,
    pub(crate) effect: String,
}

#[derive(Clone, Debug, Default, Deserialize, serde::Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct NodeSelector {
    pub(crate) node_selector_terms: Vec<NodeSelectorTerm>,
}

#[derive(Clone, Debug, Default, Deserialize, serde::Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct NodeSelectorTerm {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) match_expressions: Vec<NodeSelectorRequirement>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) match_fields: Vec<NodeSelectorRequirement>,
}

#[derive(Clone, Debug, Default, Deserialize, serde::Serialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct NodeSelectorRequirement {
    pub(crate) key: String,
    pub(crate) operator: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) values: Vec<String>,
}

// --- DeviceClass ---

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct Class {
    pub(crate) metadata: Metadata,
    pub(crate) spec: ClassSpec,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct ClassSpec {
    pub(crate) selectors: Vec<Selector>,
    /// `DeviceClassConfiguration` entries, kept as JSON: they are copied into the result.
    pub(crate) config: Vec<serde_json::Map<String, Value>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Selector {
    pub(crate) cel: Option<CelSelector>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct CelSelector {
    pub(crate) expression: String,
}

// --- ResourceClaim ---

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct Claim {
    pub(crate) metadata: Metadata,
    pub(crate) spec: ClaimSpec,
    pub(crate) status: ClaimStatus,
}

impl Claim {
    /// `namespace/name`, as the scheduler names claims in its messages.
    pub(crate) fn display_name(&self) -> String {
        match &self.metadata.namespace {
            Some(namespace) => format!("{namespace}/{}", self.metadata.name()),
            None => self.metadata.name().to_owned(),
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct ClaimSpec {
    pub(crate) devices: DeviceClaim,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct DeviceClaim {
    pub(crate) requests: Vec<Request>,
    pub(crate) constraints: Vec<Constraint>,
    /// `DeviceClaimConfiguration` entries, kept as JSON: they are copied into the result.
    pub(crate) config: Vec<serde_json::Map<String, Value>>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct Request {
    pub(crate) name: String,
    pub(crate) exactly: Option<ExactRequest>,
    pub(crate) first_available: Vec<SubRequest>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct ExactRequest {
    pub(crate) device_class_name: String,
    pub(crate) selectors: Vec<Selector>,
    pub(crate) allocation_mode: Option<String>,
    pub(crate) count: Option<i64>,
    pub(crate) admin_access: Option<bool>,
    pub(crate) tolerations: Vec<Value>,
    pub(crate) capacity: Option<CapacityRequirements>,
    /// `derivedAttributes` (1.37).
    pub(crate) derived_attributes: Vec<DerivedAttribute>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct SubRequest {
    pub(crate) name: String,
    pub(crate) device_class_name: String,
    pub(crate) selectors: Vec<Selector>,
    pub(crate) allocation_mode: Option<String>,
    pub(crate) count: Option<i64>,
    pub(crate) tolerations: Vec<Value>,
    pub(crate) capacity: Option<CapacityRequirements>,
    /// `derivedAttributes` (1.37).
    pub(crate) derived_attributes: Vec<DerivedAttribute>,
}

/// A `DeviceDerivedAttribute` of a request: a value computed per candidate device by CEL that
/// constraints compare instead of a published attribute of that name.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct DerivedAttribute {
    pub(crate) name: String,
    pub(crate) expression: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct CapacityRequirements {
    pub(crate) requests: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct Toleration {
    pub(crate) key: Option<String>,
    pub(crate) operator: Option<String>,
    pub(crate) value: Option<String>,
    pub(crate) effect: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct Constraint {
    pub(crate) requests: Vec<String>,
    pub(crate) match_attribute: Option<String>,
    pub(crate) distinct_attribute: Option<String>,
}

impl Constraint {
    /// The kind and attribute of a well-formed constraint: exactly one of `matchAttribute`
    /// and `distinctAttribute` is set.
    pub(crate) fn kind(&self) -> Option<(ConstraintKind, &String)> {
        match (&self.match_attribute, &self.distinct_attribute) {
            (Some(attribute), None) => Some((ConstraintKind::MatchAttribute, attribute)),
            (None, Some(attribute)) => Some((ConstraintKind::DistinctAttribute, attribute)),
            _ => None,
        }
    }
}

/// The kind of a constraint of a claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub enum ConstraintKind {
    /// `matchAttribute`: all devices have the same value.
    MatchAttribute,
    /// `distinctAttribute`: all devices have different values.
    DistinctAttribute,
}

impl fmt::Display for ConstraintKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConstraintKind::MatchAttribute => "matchAttribute",
            ConstraintKind::DistinctAttribute => "distinctAttribute",
        })
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct ClaimStatus {
    pub(crate) allocation: Option<Allocation>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct Allocation {
    pub(crate) devices: AllocatedDevices,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct AllocatedDevices {
    pub(crate) results: Vec<AllocatedDevice>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct AllocatedDevice {
    pub(crate) request: String,
    pub(crate) driver: String,
    pub(crate) pool: String,
    pub(crate) device: String,
    pub(crate) admin_access: Option<bool>,
    #[serde(rename = "shareID")]
    pub(crate) share_id: Option<String>,
    pub(crate) consumed_capacity: BTreeMap<String, String>,
}
