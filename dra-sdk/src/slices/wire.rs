//! The edge between the model and the API: `resource.k8s.io/v1` objects, conversion to the
//! other served versions, semantic comparison, and feature-gate (dropped field) handling.
//!
//! Everything internal works on `k8s_openapi::api::resource::v1` objects. Objects sent to or
//! received from a server serving only `v1beta2` or `v1beta1` are converted at this edge:
//! `v1beta2` has the v1 JSON shape, `v1beta1` wraps everything but a device's name in `basic`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::resource::v1 as api;
use kube::api::DynamicObject;
use kube::core::ApiResource;
use serde_json::Value;

use super::model::{
    AttributeValue, CapacityRequestPolicy, CounterSet, Device, DeviceCounterConsumption,
    DeviceNodeSelection, DeviceTaint, Quantity, Time, ValidRequestValues,
};
use crate::k8s::quantity;

k8s_openapi::k8s_if_le_1_33! {
    compile_error!("dra-sdk's ResourceSlice publisher needs k8s-openapi with a v1_34 or newer version feature");
}

k8s_openapi::k8s_if_ge_1_36! {
    /// Whether the application's k8s-openapi version feature has list-typed attributes.
    pub(crate) const LIST_ATTRIBUTES_COMPILED: bool = true;
}
k8s_openapi::k8s_if_le_1_35! {
    /// Whether the application's k8s-openapi version feature has list-typed attributes.
    pub(crate) const LIST_ATTRIBUTES_COMPILED: bool = false;
}

k8s_openapi::k8s_if_ge_1_37! {
    /// Whether the application's k8s-openapi version feature has the 1.37 device-model
    /// fields (`partitionTypeAttribute`, `compatibilityGroups`, `nodeAllocatableResources`,
    /// `skipNodeOperations`).
    pub(crate) const DEVICE_MODEL_1_37_COMPILED: bool = true;
}
k8s_openapi::k8s_if_le_1_36! {
    /// Whether the application's k8s-openapi version feature has the 1.37 device-model
    /// fields (`partitionTypeAttribute`, `compatibilityGroups`, `nodeAllocatableResources`,
    /// `skipNodeOperations`).
    pub(crate) const DEVICE_MODEL_1_37_COMPILED: bool = false;
}

/// The `resource.k8s.io` version a publisher reads and writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResourceApiVersion {
    /// `resource.k8s.io/v1` (Kubernetes 1.34+).
    V1,
    /// `resource.k8s.io/v1beta2` (Kubernetes 1.33+), the same JSON shape as v1.
    V1beta2,
    /// `resource.k8s.io/v1beta1` (Kubernetes 1.32+), devices wrapped in `basic`.
    V1beta1,
}

impl ResourceApiVersion {
    /// Preference order when several versions are served.
    pub const PREFERENCE: [Self; 3] = [Self::V1, Self::V1beta2, Self::V1beta1];

    /// The version string (`v1`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1 => "v1",
            Self::V1beta2 => "v1beta2",
            Self::V1beta1 => "v1beta1",
        }
    }

    /// The kube `ApiResource` for ResourceSlices in this version.
    pub fn api_resource(self) -> ApiResource {
        self.resource("ResourceSlice", "resourceslices")
    }

    /// The kube `ApiResource` for another `resource.k8s.io` kind in this version.
    pub(crate) fn resource(self, kind: &str, plural: &str) -> ApiResource {
        ApiResource {
            group: "resource.k8s.io".to_owned(),
            version: self.as_str().to_owned(),
            api_version: format!("resource.k8s.io/{}", self.as_str()),
            kind: kind.to_owned(),
            plural: plural.to_owned(),
        }
    }

    /// The newest version the server serves, by discovery; `Ok(None)` when it serves
    /// `resource.k8s.io` in none of them (or not at all).
    pub(crate) async fn newest_served(client: &kube::Client) -> Result<Option<Self>, kube::Error> {
        let groups = client.list_api_groups().await?;
        let Some(group) = groups
            .groups
            .iter()
            .find(|group| group.name == "resource.k8s.io")
        else {
            return Ok(None);
        };
        Ok(Self::PREFERENCE
            .into_iter()
            .find(|v| group.versions.iter().any(|gv| gv.version == v.as_str())))
    }
}

impl fmt::Display for ResourceApiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "resource.k8s.io/{}", self.as_str())
    }
}

/// Converts a v1 slice into an object of the served version.
pub(crate) fn to_dynamic(
    slice: &api::ResourceSlice,
    version: ResourceApiVersion,
) -> Result<DynamicObject, serde_json::Error> {
    let mut value = serde_json::to_value(slice)?;
    if let Some(object) = value.as_object_mut() {
        object.insert(
            "apiVersion".to_owned(),
            Value::String(version.api_resource().api_version),
        );
    }
    if version == ResourceApiVersion::V1beta1 {
        for device in devices_mut(&mut value) {
            if let Some(fields) = device.as_object_mut() {
                let name = fields.remove("name");
                let basic = std::mem::take(fields);
                if let Some(name) = name {
                    fields.insert("name".to_owned(), name);
                }
                fields.insert("basic".to_owned(), Value::Object(basic));
            }
        }
    }
    serde_json::from_value(value)
}

/// Converts an object of the served version into a v1 slice.
pub(crate) fn from_dynamic(
    object: DynamicObject,
    version: ResourceApiVersion,
) -> Result<api::ResourceSlice, serde_json::Error> {
    let mut value = serde_json::to_value(object)?;
    if let Some(object) = value.as_object_mut() {
        object.insert(
            "apiVersion".to_owned(),
            Value::String("resource.k8s.io/v1".to_owned()),
        );
        object.insert("kind".to_owned(), Value::String("ResourceSlice".to_owned()));
    }
    if version == ResourceApiVersion::V1beta1 {
        flatten_v1beta1_devices(&mut value);
    }
    serde_json::from_value(value)
}

/// Converts the devices of a `resource.k8s.io/v1beta1` ResourceSlice (as JSON) to the v1
/// shape: v1beta1 wraps everything of a device but its name in `basic`. The conversion the
/// publisher applies to the slices it reads; tools that read v1beta1 files use it too.
///
/// ```
/// use dra_sdk::advanced::flatten_v1beta1_devices;
/// use serde_json::json;
///
/// let mut slice = json!({"spec": {"devices": [
///     {"name": "gpu-0", "basic": {"attributes": {"model": {"string": "A100"}}}}
/// ]}});
/// flatten_v1beta1_devices(&mut slice);
/// assert_eq!(
///     slice["spec"]["devices"][0],
///     json!({"name": "gpu-0", "attributes": {"model": {"string": "A100"}}})
/// );
/// ```
pub fn flatten_v1beta1_devices(slice: &mut Value) {
    for device in devices_mut(slice) {
        if let Some(fields) = device.as_object_mut()
            && let Some(Value::Object(basic)) = fields.remove("basic")
        {
            fields.extend(basic);
        }
    }
}

fn devices_mut(value: &mut Value) -> impl Iterator<Item = &mut Value> {
    value
        .pointer_mut("/spec/devices")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
}

/// A device in v1 form.
pub(crate) fn device_to_api(device: &Device) -> api::Device {
    let mut out = api::Device {
        name: device.name.clone(),
        ..Default::default()
    };
    if !device.attributes.is_empty() {
        out.attributes = Some(
            device
                .attributes
                .iter()
                .map(|(name, value)| (name.clone(), attribute_to_api(value)))
                .collect(),
        );
    }
    if !device.capacity.is_empty() {
        out.capacity = Some(
            device
                .capacity
                .iter()
                .map(|(name, capacity)| {
                    let mut api_capacity = api::DeviceCapacity {
                        value: capacity.value.clone(),
                        ..Default::default()
                    };
                    api_capacity.request_policy =
                        capacity.request_policy.as_ref().map(request_policy_to_api);
                    (name.clone(), api_capacity)
                })
                .collect(),
        );
    }
    if !device.consumes_counters.is_empty() {
        out.consumes_counters = Some(
            device
                .consumes_counters
                .iter()
                .map(consumption_to_api)
                .collect(),
        );
    }
    match &device.node_selection {
        None => {}
        Some(DeviceNodeSelection::NodeName(node)) => out.node_name = Some(node.clone()),
        Some(DeviceNodeSelection::NodeSelector(selector)) => {
            out.node_selector = Some(selector.clone());
        }
        Some(DeviceNodeSelection::AllNodes) => out.all_nodes = Some(true),
    }
    if !device.taints.is_empty() {
        out.taints = Some(device.taints.iter().map(taint_to_api).collect());
    }
    if device.binds_to_node {
        out.binds_to_node = Some(true);
    }
    if !device.binding_conditions.is_empty() {
        out.binding_conditions = Some(device.binding_conditions.clone());
    }
    if !device.binding_failure_conditions.is_empty() {
        out.binding_failure_conditions = Some(device.binding_failure_conditions.clone());
    }
    if device.allow_multiple_allocations {
        out.allow_multiple_allocations = Some(true);
    }
    // Validation rejects these when the compiled API lacks them.
    set_device_fields_1_37(&mut out, device);
    out
}

k8s_openapi::k8s_if_ge_1_37! {
    /// The `skipNodeOperations` a driver without node preparation publishes: both operations
    /// by name rather than `"*"`. `"*"` also skips operations later releases add, and this
    /// driver still runs a kubelet plugin that may serve them; naming the two states exactly
    /// what it does not need (the API requires `NodeUnprepareResources` with
    /// `NodePrepareResources`).
    pub(crate) const SKIPPED_NODE_OPERATIONS: [&str; 2] =
        ["NodePrepareResources", "NodeUnprepareResources"];

    fn set_device_fields_1_37(out: &mut api::Device, device: &Device) {
        if device.node_allocatable_resources.is_empty() {
            return;
        }
        out.node_allocatable_resources = Some(
            device
                .node_allocatable_resources
                .iter()
                .map(|(name, resource)| {
                    let mapping = resource.has_mapping().then(|| api::NodeAllocatableMapping {
                        capacity_key: resource.capacity_key.clone(),
                        capacity_multiplier: resource.capacity_multiplier.clone(),
                        device_multiplier: resource.device_multiplier.clone(),
                    });
                    let overhead = (resource.per_pod.is_some() || resource.per_container.is_some())
                        .then(|| api::NodeAllocatableOverhead {
                            per_container: resource.per_container.clone(),
                            per_pod: resource.per_pod.clone(),
                        });
                    (name.clone(), api::NodeAllocatableResource { mapping, overhead })
                })
                .collect(),
        );
    }

    fn set_compatibility_groups(out: &mut api::DeviceCounterConsumption, groups: &[String]) {
        if !groups.is_empty() {
            out.compatibility_groups = Some(groups.to_vec());
        }
    }

    /// Sets the slice-level 1.37 fields: `partitionTypeAttribute` where a device of the slice
    /// consumes counters (the server refuses it elsewhere), and `skipNodeOperations` on
    /// slices with devices.
    pub(crate) fn set_slice_fields(
        spec: &mut api::ResourceSliceSpec,
        partition_type_attribute: Option<&str>,
        skip_node_operations: bool,
    ) {
        let consumes = spec
            .devices
            .iter()
            .flatten()
            .any(|d| present(&d.consumes_counters));
        if consumes {
            spec.partition_type_attribute = partition_type_attribute.map(str::to_owned);
        }
        if skip_node_operations && present(&spec.devices) {
            spec.skip_node_operations =
                Some(SKIPPED_NODE_OPERATIONS.iter().map(|&op| op.to_owned()).collect());
        }
    }

    /// The 1.37 gates whose fields `stored` lacks although `sent` had them.
    fn dropped_features_1_37(
        sent: &api::ResourceSliceSpec,
        stored: &api::ResourceSliceSpec,
        dropped: &mut BTreeSet<FeatureGate>,
    ) {
        if sent.partition_type_attribute.is_some() && stored.partition_type_attribute.is_none() {
            dropped.insert(FeatureGate::PartitionableDevicesType);
        }
        if present(&sent.skip_node_operations) && !present(&stored.skip_node_operations) {
            dropped.insert(FeatureGate::OptionalNodeOperations);
        }
        let stored_devices: BTreeMap<&str, &api::Device> = stored
            .devices
            .iter()
            .flatten()
            .map(|d| (d.name.as_str(), d))
            .collect();
        for device in sent.devices.iter().flatten() {
            let Some(stored) = stored_devices.get(device.name.as_str()) else {
                continue;
            };
            if device.node_allocatable_resources.as_ref().is_some_and(|m| !m.is_empty())
                && stored.node_allocatable_resources.as_ref().is_none_or(BTreeMap::is_empty)
            {
                dropped.insert(FeatureGate::NodeAllocatableResources);
            }
            // Groups dropped together with the whole consumption belong to
            // DRAPartitionableDevices, detected by the caller.
            let groups_dropped = device.consumes_counters.iter().flatten().any(|sent| {
                present(&sent.compatibility_groups)
                    && stored
                        .consumes_counters
                        .iter()
                        .flatten()
                        .find(|c| c.counter_set == sent.counter_set)
                        .is_some_and(|c| !present(&c.compatibility_groups))
            });
            if groups_dropped {
                dropped.insert(FeatureGate::DeviceCompatibilityGroups);
            }
        }
    }

    /// Removes the 1.37 fields of disabled gates. Devices whose meaning depends on a dropped
    /// field are withheld (see [`FeatureGate::withholds_devices`]).
    fn strip_features_1_37(spec: &mut api::ResourceSliceSpec, disabled: &BTreeSet<FeatureGate>) {
        if disabled.contains(&FeatureGate::OptionalNodeOperations) {
            spec.skip_node_operations = None;
        }
        if disabled.contains(&FeatureGate::DeviceCompatibilityGroups)
            && let Some(devices) = &mut spec.devices
        {
            devices.retain(|d| {
                !d.consumes_counters
                    .iter()
                    .flatten()
                    .any(|c| present(&c.compatibility_groups))
            });
        }
        if disabled.contains(&FeatureGate::NodeAllocatableResources)
            && let Some(devices) = &mut spec.devices
        {
            devices.retain(|d| {
                !d.node_allocatable_resources
                    .iter()
                    .flatten()
                    .any(|(_, r)| r.mapping.is_some())
            });
            for device in devices.iter_mut() {
                device.node_allocatable_resources = None;
            }
        }
        // The server refuses partitionTypeAttribute on a slice without counter consumers,
        // which withholding devices or a disabled DRAPartitionableDevices may leave.
        let consumes = spec
            .devices
            .iter()
            .flatten()
            .any(|d| present(&d.consumes_counters));
        if disabled.contains(&FeatureGate::PartitionableDevicesType) || !consumes {
            spec.partition_type_attribute = None;
        }
    }

    fn normalize_1_37(spec: &mut api::ResourceSliceSpec) {
        fn q(quantity: &mut Option<Quantity>) {
            if let Some(quantity) = quantity {
                quantity.0 = quantity::canonical(&quantity.0);
            }
        }
        if spec.skip_node_operations.as_ref().is_some_and(Vec::is_empty) {
            spec.skip_node_operations = None;
        }
        for device in spec.devices.iter_mut().flatten() {
            for consumption in device.consumes_counters.iter_mut().flatten() {
                if consumption.compatibility_groups.as_ref().is_some_and(Vec::is_empty) {
                    consumption.compatibility_groups = None;
                }
            }
            if device.node_allocatable_resources.as_ref().is_some_and(BTreeMap::is_empty) {
                device.node_allocatable_resources = None;
            }
            for resource in device.node_allocatable_resources.iter_mut().flat_map(|m| m.values_mut()) {
                if let Some(mapping) = &mut resource.mapping {
                    q(&mut mapping.capacity_multiplier);
                    q(&mut mapping.device_multiplier);
                }
                if let Some(overhead) = &mut resource.overhead {
                    q(&mut overhead.per_pod);
                    q(&mut overhead.per_container);
                }
            }
        }
    }
}

k8s_openapi::k8s_if_le_1_36! {
    fn set_device_fields_1_37(_: &mut api::Device, _: &Device) {}

    fn set_compatibility_groups(_: &mut api::DeviceCounterConsumption, _: &[String]) {}

    /// Sets the slice-level 1.37 fields (none: the compiled API lacks them; validation
    /// refuses `partitionTypeAttribute`, and a skipped `skipNodeOperations` is harmless as
    /// the plugin still prepares).
    pub(crate) fn set_slice_fields(_: &mut api::ResourceSliceSpec, _: Option<&str>, _: bool) {}

    fn dropped_features_1_37(
        _: &api::ResourceSliceSpec,
        _: &api::ResourceSliceSpec,
        _: &mut BTreeSet<FeatureGate>,
    ) {
    }

    fn strip_features_1_37(_: &mut api::ResourceSliceSpec, _: &BTreeSet<FeatureGate>) {}

    fn normalize_1_37(_: &mut api::ResourceSliceSpec) {}
}

fn attribute_to_api(value: &AttributeValue) -> api::DeviceAttribute {
    let mut out = api::DeviceAttribute::default();
    match value {
        AttributeValue::Int(v) => out.int = Some(*v),
        AttributeValue::Bool(v) => out.bool = Some(*v),
        AttributeValue::String(v) => out.string = Some(v.clone()),
        AttributeValue::Version(v) => out.version = Some(v.clone()),
        // Validation rejects list attributes when the compiled API lacks them.
        AttributeValue::Ints(_)
        | AttributeValue::Bools(_)
        | AttributeValue::Strings(_)
        | AttributeValue::Versions(_) => set_list_attribute(&mut out, value),
    }
    out
}

k8s_openapi::k8s_if_ge_1_36! {
    fn set_list_attribute(out: &mut api::DeviceAttribute, value: &AttributeValue) {
        match value {
            AttributeValue::Ints(v) => out.ints = Some(v.clone()),
            AttributeValue::Bools(v) => out.bools = Some(v.clone()),
            AttributeValue::Strings(v) => out.strings = Some(v.clone()),
            AttributeValue::Versions(v) => out.versions = Some(v.clone()),
            AttributeValue::Int(_)
            | AttributeValue::Bool(_)
            | AttributeValue::String(_)
            | AttributeValue::Version(_) => {}
        }
    }

    /// Whether an attribute carries a list value.
    fn attribute_has_list(attribute: &api::DeviceAttribute) -> bool {
        attribute.ints.is_some()
            || attribute.bools.is_some()
            || attribute.strings.is_some()
            || attribute.versions.is_some()
    }
}

k8s_openapi::k8s_if_le_1_35! {
    fn set_list_attribute(_: &mut api::DeviceAttribute, _: &AttributeValue) {}

    /// Whether an attribute carries a list value (never, before 1.36 types).
    fn attribute_has_list(_: &api::DeviceAttribute) -> bool {
        false
    }
}

/// Whether an attribute carries no value at all (a list value the server dropped).
fn attribute_is_empty(attribute: &api::DeviceAttribute) -> bool {
    attribute.int.is_none()
        && attribute.bool.is_none()
        && attribute.string.is_none()
        && attribute.version.is_none()
        && !attribute_has_list(attribute)
}

fn request_policy_to_api(policy: &CapacityRequestPolicy) -> api::CapacityRequestPolicy {
    let mut out = api::CapacityRequestPolicy {
        default: policy.default.clone(),
        ..Default::default()
    };
    match &policy.valid {
        None => {}
        Some(ValidRequestValues::Values(values)) => out.valid_values = Some(values.clone()),
        Some(ValidRequestValues::Range { min, max, step }) => {
            out.valid_range = Some(api::CapacityRequestPolicyRange {
                min: min.clone(),
                max: max.clone(),
                step: step.clone(),
            });
        }
    }
    out
}

fn counters_to_api(counters: &BTreeMap<String, Quantity>) -> BTreeMap<String, api::Counter> {
    counters
        .iter()
        .map(|(name, value)| {
            (
                name.clone(),
                api::Counter {
                    value: value.clone(),
                },
            )
        })
        .collect()
}

fn consumption_to_api(consumption: &DeviceCounterConsumption) -> api::DeviceCounterConsumption {
    let mut out = api::DeviceCounterConsumption {
        counter_set: consumption.counter_set.clone(),
        counters: counters_to_api(&consumption.counters),
        ..Default::default()
    };
    set_compatibility_groups(&mut out, &consumption.compatibility_groups);
    out
}

/// A counter set in v1 form.
pub(crate) fn counter_set_to_api(set: &CounterSet) -> api::CounterSet {
    api::CounterSet {
        name: set.name.clone(),
        counters: counters_to_api(&set.counters),
    }
}

fn taint_to_api(taint: &DeviceTaint) -> api::DeviceTaint {
    api::DeviceTaint {
        key: taint.key.clone(),
        value: taint.value.clone(),
        effect: taint.effect.as_str().to_owned(),
        time_added: taint.time_added.clone(),
    }
}

/// Copies `timeAdded` of taints the server already stores into desired taints that leave it
/// empty, so that a taint keeps the time it first appeared and comparisons see no change.
pub(crate) fn inherit_taint_times(
    desired: &mut api::ResourceSliceSpec,
    stored: &api::ResourceSliceSpec,
) {
    let Some(stored_devices) = &stored.devices else {
        return;
    };
    let stored_by_name: BTreeMap<&str, &api::Device> = stored_devices
        .iter()
        .map(|d| (d.name.as_str(), d))
        .collect();
    for device in desired.devices.iter_mut().flatten() {
        let (Some(taints), Some(stored_device)) =
            (&mut device.taints, stored_by_name.get(device.name.as_str()))
        else {
            continue;
        };
        let Some(stored_taints) = &stored_device.taints else {
            continue;
        };
        for taint in taints.iter_mut().filter(|t| t.time_added.is_none()) {
            taint.time_added = stored_taints
                .iter()
                .find(|s| s.key == taint.key && s.value == taint.value && s.effect == taint.effect)
                .and_then(|s| s.time_added.clone());
        }
    }
}

/// Brings a spec into a canonical form for equality checks: quantities by value, times to
/// whole seconds (the server's precision), empty collections and `false` flags as absent.
pub(crate) fn normalize(spec: &mut api::ResourceSliceSpec) {
    fn q(quantity: &mut Quantity) {
        quantity.0 = quantity::canonical(&quantity.0);
    }
    fn flag(value: &mut Option<bool>) {
        if *value == Some(false) {
            *value = None;
        }
    }
    fn list<T>(value: &mut Option<Vec<T>>) {
        if value.as_ref().is_some_and(Vec::is_empty) {
            *value = None;
        }
    }
    fn map<K, V>(value: &mut Option<BTreeMap<K, V>>) {
        if value.as_ref().is_some_and(BTreeMap::is_empty) {
            *value = None;
        }
    }
    fn counters(counters: &mut BTreeMap<String, api::Counter>) {
        counters.values_mut().for_each(|c| q(&mut c.value));
    }

    flag(&mut spec.all_nodes);
    flag(&mut spec.per_device_node_selection);
    list(&mut spec.shared_counters);
    for set in spec.shared_counters.iter_mut().flatten() {
        counters(&mut set.counters);
    }
    list(&mut spec.devices);
    for device in spec.devices.iter_mut().flatten() {
        map(&mut device.attributes);
        map(&mut device.capacity);
        for capacity in device.capacity.iter_mut().flat_map(|c| c.values_mut()) {
            q(&mut capacity.value);
            if let Some(policy) = &mut capacity.request_policy {
                policy.default.iter_mut().for_each(q);
                list(&mut policy.valid_values);
                policy.valid_values.iter_mut().flatten().for_each(q);
                if let Some(range) = &mut policy.valid_range {
                    q(&mut range.min);
                    range.max.iter_mut().for_each(q);
                    range.step.iter_mut().for_each(q);
                }
            }
        }
        list(&mut device.consumes_counters);
        for consumption in device.consumes_counters.iter_mut().flatten() {
            counters(&mut consumption.counters);
        }
        flag(&mut device.all_nodes);
        list(&mut device.taints);
        for taint in device.taints.iter_mut().flatten() {
            if let Some(time) = &mut taint.time_added
                && let Ok(seconds) = k8s_openapi::jiff::Timestamp::from_second(time.0.as_second())
            {
                *time = Time(seconds);
            }
        }
        flag(&mut device.binds_to_node);
        list(&mut device.binding_conditions);
        list(&mut device.binding_failure_conditions);
        flag(&mut device.allow_multiple_allocations);
    }
    normalize_1_37(spec);
}

/// Whether two specs are equal up to spelling (see [`normalize`]).
pub(crate) fn specs_equal(a: &api::ResourceSliceSpec, b: &api::ResourceSliceSpec) -> bool {
    if a == b {
        return true;
    }
    let (mut a, mut b) = (a.clone(), b.clone());
    normalize(&mut a);
    normalize(&mut b);
    a == b
}

/// A `resource.k8s.io` feature gate whose fields a server drops when it is disabled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum FeatureGate {
    /// `DRADeviceTaints`: device `taints`.
    DeviceTaints,
    /// `DRAPartitionableDevices`: `sharedCounters`, `perDeviceNodeSelection`, device
    /// `consumesCounters`, `nodeName`, `nodeSelector`, `allNodes`.
    PartitionableDevices,
    /// `DRADeviceBindingConditions`: `bindsToNode`, `bindingConditions`,
    /// `bindingFailureConditions`.
    DeviceBindingConditions,
    /// `DRAConsumableCapacity`: `allowMultipleAllocations`, capacity `requestPolicy`.
    ConsumableCapacity,
    /// `DRAListTypeAttributes`: list-typed attribute values.
    ListTypeAttributes,
    /// `DRAPartitionableDevicesType` (1.37 alpha): `partitionTypeAttribute`. Published
    /// without it when dropped: only the resource pool status summary uses it.
    PartitionableDevicesType,
    /// `DRADeviceCompatibilityGroups` (1.37 alpha): counter consumptions'
    /// `compatibilityGroups`. When dropped, the devices that declare groups are withheld:
    /// without them the scheduler would co-allocate partitions the hardware cannot combine.
    DeviceCompatibilityGroups,
    /// `DRANodeAllocatableResources` (1.37 shape): device `nodeAllocatableResources`. When
    /// dropped, devices with a mapping (devices that are node CPU or memory) are withheld, as
    /// the scheduler would hand them out next to the same resources requested by pods;
    /// overhead-only declarations are published without it.
    NodeAllocatableResources,
    /// `DRAOptionalNodeOperations` (1.37 alpha): `skipNodeOperations`. Published without it
    /// when dropped: the kubelet then calls prepare and unprepare, which the plugin serves.
    OptionalNodeOperations,
}

impl FeatureGate {
    /// The gate's name as the API server knows it.
    pub fn name(self) -> &'static str {
        match self {
            Self::DeviceTaints => "DRADeviceTaints",
            Self::PartitionableDevices => "DRAPartitionableDevices",
            Self::DeviceBindingConditions => "DRADeviceBindingConditions",
            Self::ConsumableCapacity => "DRAConsumableCapacity",
            Self::ListTypeAttributes => "DRAListTypeAttributes",
            Self::PartitionableDevicesType => "DRAPartitionableDevicesType",
            Self::DeviceCompatibilityGroups => "DRADeviceCompatibilityGroups",
            Self::NodeAllocatableResources => "DRANodeAllocatableResources",
            Self::OptionalNodeOperations => "DRAOptionalNodeOperations",
        }
    }

    /// Whether the publisher withholds the devices that use this gate's fields once the
    /// server dropped them, instead of publishing them without (see each variant).
    pub fn withholds_devices(self) -> bool {
        matches!(
            self,
            Self::DeviceCompatibilityGroups | Self::NodeAllocatableResources
        )
    }
}

impl fmt::Display for FeatureGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn present<T>(value: &Option<Vec<T>>) -> bool {
    value.as_ref().is_some_and(|v| !v.is_empty())
}

/// Feature gates whose fields were sent but are missing from what the server stored.
pub(crate) fn dropped_features(
    sent: &api::ResourceSliceSpec,
    stored: &api::ResourceSliceSpec,
) -> BTreeSet<FeatureGate> {
    let mut dropped = BTreeSet::new();
    if present(&sent.shared_counters) && !present(&stored.shared_counters)
        || sent.per_device_node_selection == Some(true)
            && stored.per_device_node_selection != Some(true)
    {
        dropped.insert(FeatureGate::PartitionableDevices);
    }
    let stored_devices: BTreeMap<&str, &api::Device> = stored
        .devices
        .iter()
        .flatten()
        .map(|d| (d.name.as_str(), d))
        .collect();
    for device in sent.devices.iter().flatten() {
        let Some(stored) = stored_devices.get(device.name.as_str()) else {
            continue;
        };
        if present(&device.taints) && !present(&stored.taints) {
            dropped.insert(FeatureGate::DeviceTaints);
        }
        if present(&device.consumes_counters) && !present(&stored.consumes_counters)
            || device.node_name.is_some() && stored.node_name.is_none()
            || device.node_selector.is_some() && stored.node_selector.is_none()
            || device.all_nodes == Some(true) && stored.all_nodes != Some(true)
        {
            dropped.insert(FeatureGate::PartitionableDevices);
        }
        if device.binds_to_node == Some(true) && stored.binds_to_node != Some(true)
            || present(&device.binding_conditions) && !present(&stored.binding_conditions)
            || present(&device.binding_failure_conditions)
                && !present(&stored.binding_failure_conditions)
        {
            dropped.insert(FeatureGate::DeviceBindingConditions);
        }
        let policy_dropped = device.capacity.iter().flatten().any(|(name, capacity)| {
            capacity.request_policy.is_some()
                && stored
                    .capacity
                    .as_ref()
                    .and_then(|c| c.get(name))
                    .is_some_and(|c| c.request_policy.is_none())
        });
        if device.allow_multiple_allocations == Some(true)
            && stored.allow_multiple_allocations != Some(true)
            || policy_dropped
        {
            dropped.insert(FeatureGate::ConsumableCapacity);
        }
        let list_dropped = device.attributes.iter().flatten().any(|(name, attribute)| {
            attribute_has_list(attribute)
                && stored
                    .attributes
                    .as_ref()
                    .and_then(|a| a.get(name))
                    .is_none_or(attribute_is_empty)
        });
        if list_dropped {
            dropped.insert(FeatureGate::ListTypeAttributes);
        }
    }
    dropped_features_1_37(sent, stored, &mut dropped);
    dropped
}

/// Whether `status`, the answer to writing `sent`, is how a server with `DRAListTypeAttributes`
/// off refuses list attributes. Such a server does not store the slice without them: it drops
/// the list value and then rejects the attribute left without a value ("exactly one value must
/// be specified", 422 Invalid), naming `spec.devices[<i>].attributes[<name>]`. Only attributes
/// sent with a list value count, so a genuinely invalid slice is not mistaken for a gate.
pub(crate) fn rejected_list_attributes(
    sent: &api::ResourceSliceSpec,
    status: &kube::core::Status,
) -> bool {
    const REJECTION: &str = "exactly one value must be specified";
    if status.code != 422 {
        return false;
    }
    let causes = status.details.iter().flat_map(|d| d.causes.iter());
    let mut fields: Vec<&str> = causes
        .filter(|cause| cause.message.contains(REJECTION))
        .map(|cause| cause.field.as_str())
        .collect();
    if fields.is_empty() && status.message.contains(REJECTION) {
        // No causes: the message names the fields ("…: spec.devices[0].attributes[x]: …").
        fields.push(status.message.as_str());
    }
    sent.devices
        .iter()
        .flatten()
        .enumerate()
        .any(|(index, device)| {
            device.attributes.iter().flatten().any(|(name, attribute)| {
                let path = format!("spec.devices[{index}].attributes[{name}]");
                attribute_has_list(attribute) && fields.iter().any(|field| field.contains(&path))
            })
        })
}

/// Removes the fields of disabled gates from a desired spec, so that the publisher compares
/// against what the server can store instead of rewriting forever.
pub(crate) fn strip_features(spec: &mut api::ResourceSliceSpec, disabled: &BTreeSet<FeatureGate>) {
    if disabled.is_empty() {
        return;
    }
    let partitionable = disabled.contains(&FeatureGate::PartitionableDevices);
    if partitionable {
        spec.shared_counters = None;
        spec.per_device_node_selection = None;
    }
    for device in spec.devices.iter_mut().flatten() {
        if partitionable {
            device.consumes_counters = None;
            device.node_name = None;
            device.node_selector = None;
            device.all_nodes = None;
        }
        if disabled.contains(&FeatureGate::DeviceTaints) {
            device.taints = None;
        }
        if disabled.contains(&FeatureGate::DeviceBindingConditions) {
            device.binds_to_node = None;
            device.binding_conditions = None;
            device.binding_failure_conditions = None;
        }
        if disabled.contains(&FeatureGate::ConsumableCapacity) {
            device.allow_multiple_allocations = None;
            for capacity in device.capacity.iter_mut().flat_map(|c| c.values_mut()) {
                capacity.request_policy = None;
            }
        }
        if disabled.contains(&FeatureGate::ListTypeAttributes)
            && let Some(attributes) = &mut device.attributes
        {
            attributes.retain(|_, attribute| !attribute_has_list(attribute));
        }
    }
    strip_features_1_37(spec, disabled);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slices::model::{DeviceCapacity, TaintEffect};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn slice_with(devices: Vec<api::Device>) -> api::ResourceSlice {
        api::ResourceSlice {
            metadata: ObjectMeta {
                name: Some("s".into()),
                ..Default::default()
            },
            spec: api::ResourceSliceSpec {
                driver: "gpu.example.com".into(),
                node_name: Some("node-1".into()),
                pool: api::ResourcePool {
                    name: "node-1".into(),
                    generation: 1,
                    resource_slice_count: 1,
                },
                devices: Some(devices),
                ..Default::default()
            },
        }
    }

    #[test]
    fn v1beta1_wraps_devices_in_basic() {
        let device = device_to_api(
            &Device::new("gpu-0")
                .attribute("model", "h100")
                .capacity("memory", DeviceCapacity::new("80Gi")),
        );
        let slice = slice_with(vec![device]);
        let beta1 = to_dynamic(&slice, ResourceApiVersion::V1beta1).unwrap();
        let json = serde_json::to_value(&beta1).unwrap();
        assert_eq!(json["apiVersion"], "resource.k8s.io/v1beta1");
        assert_eq!(json["spec"]["devices"][0]["name"], "gpu-0");
        assert_eq!(
            json["spec"]["devices"][0]["basic"]["attributes"]["model"]["string"],
            "h100"
        );
        assert_eq!(
            json["spec"]["devices"][0]["basic"]["capacity"]["memory"]["value"],
            "80Gi"
        );
        let back = from_dynamic(beta1, ResourceApiVersion::V1beta1).unwrap();
        assert_eq!(back, slice);

        let beta2 = to_dynamic(&slice, ResourceApiVersion::V1beta2).unwrap();
        let json = serde_json::to_value(&beta2).unwrap();
        assert_eq!(json["apiVersion"], "resource.k8s.io/v1beta2");
        assert_eq!(
            json["spec"]["devices"][0]["attributes"]["model"]["string"],
            "h100"
        );
        assert_eq!(
            from_dynamic(beta2, ResourceApiVersion::V1beta2).unwrap(),
            slice
        );
    }

    #[test]
    fn device_json_matches_the_v1_schema() {
        let device = Device::new("gpu-0-mig")
            .attribute("index", 3)
            .capacity(
                "memory",
                DeviceCapacity::new("10Gi").with_request_policy(
                    CapacityRequestPolicy::with_default("1Gi").valid_range(
                        "1Gi",
                        Some("10Gi"),
                        None,
                    ),
                ),
            )
            .consumes("gpu-0", [("memory", "10Gi")])
            .taint(DeviceTaint::new("example.com/xid", TaintEffect::NoExecute).value("79"))
            .binds_to_node(true)
            .binding_condition("example.com/attached")
            .allow_multiple_allocations(true);
        let json = serde_json::to_value(device_to_api(&device)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "name": "gpu-0-mig",
                "attributes": {"index": {"int": 3}},
                "capacity": {"memory": {"value": "10Gi", "requestPolicy": {
                    "default": "1Gi", "validRange": {"min": "1Gi", "max": "10Gi"}}}},
                "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": "10Gi"}}}],
                "taints": [{"key": "example.com/xid", "value": "79", "effect": "NoExecute"}],
                "bindsToNode": true,
                "bindingConditions": ["example.com/attached"],
                "allowMultipleAllocations": true,
            })
        );
    }

    #[test]
    fn semantic_equality() {
        let a = slice_with(vec![device_to_api(
            &Device::new("d").capacity("memory", DeviceCapacity::new("1024Mi")),
        )])
        .spec;
        let mut b = slice_with(vec![device_to_api(
            &Device::new("d").capacity("memory", DeviceCapacity::new("1Gi")),
        )])
        .spec;
        assert!(specs_equal(&a, &b));
        b.all_nodes = Some(false);
        assert!(specs_equal(&a, &b));
        b.devices = Some(vec![]);
        assert!(!specs_equal(&a, &b));
    }

    #[test]
    fn taint_times_are_inherited() {
        let taint = DeviceTaint::new("example.com/bad", TaintEffect::NoSchedule);
        let mut desired = slice_with(vec![device_to_api(&Device::new("d").taint(taint))]).spec;
        let mut stored = desired.clone();
        let now = k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap();
        stored.devices.as_mut().unwrap()[0].taints.as_mut().unwrap()[0].time_added =
            Some(Time(now));
        assert!(!specs_equal(&desired, &stored));
        inherit_taint_times(&mut desired, &stored);
        assert!(specs_equal(&desired, &stored));
    }

    #[test]
    fn detects_and_strips_dropped_fields() {
        let device = Device::new("d")
            .taint(DeviceTaint::new("example.com/bad", TaintEffect::NoSchedule))
            .consumes("c", [("x", "1")])
            .allow_multiple_allocations(true);
        let mut sent = slice_with(vec![device_to_api(&device)]).spec;
        sent.shared_counters = Some(vec![counter_set_to_api(&CounterSet::new(
            "c",
            [("x", "2")],
        ))]);
        let mut stored = sent.clone();
        stored.devices.as_mut().unwrap()[0].taints = None;
        stored.devices.as_mut().unwrap()[0].allow_multiple_allocations = None;
        let dropped = dropped_features(&sent, &stored);
        assert_eq!(
            dropped,
            BTreeSet::from([FeatureGate::DeviceTaints, FeatureGate::ConsumableCapacity])
        );
        assert!(dropped_features(&sent, &sent).is_empty());
        strip_features(&mut sent, &dropped);
        assert!(specs_equal(&sent, &stored));
        assert_eq!(FeatureGate::DeviceTaints.to_string(), "DRADeviceTaints");
    }

    fn invalid(field: &str, message: &str) -> kube::core::Status {
        serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": 422, "reason": "Invalid",
            "message": format!("ResourceSlice.resource.k8s.io \"s\" is invalid: {field}: {message}"),
            "details": {"causes": [{"reason": "FieldValueInvalid", "field": field, "message": message}]},
        }))
        .unwrap()
    }

    #[test]
    fn a_refused_list_attribute_is_told_from_an_invalid_slice() {
        if !LIST_ATTRIBUTES_COMPILED {
            return;
        }
        let device = Device::new("nic")
            .attribute("vlans", vec![10i64, 20])
            .attribute("model", "x");
        let sent = slice_with(vec![device_to_api(&device)]).spec;
        let rejection = "Invalid value: \"\": exactly one value must be specified";
        assert!(rejected_list_attributes(
            &sent,
            &invalid("spec.devices[0].attributes[vlans]", rejection)
        ));
        // The same words on a scalar attribute, or another error on the list: not the gate.
        assert!(!rejected_list_attributes(
            &sent,
            &invalid("spec.devices[0].attributes[model]", rejection)
        ));
        assert!(!rejected_list_attributes(
            &sent,
            &invalid("spec.devices[0].attributes[vlans].ints", "Required value")
        ));
        // Without causes, the message carries the field.
        let mut bare = invalid("spec.devices[0].attributes[vlans]", rejection);
        bare.details = None;
        assert!(rejected_list_attributes(&sent, &bare));
        bare.code = 409;
        assert!(!rejected_list_attributes(&sent, &bare));
    }

    #[test]
    fn list_attributes_round_trip() {
        let device = Device::new("nic").attribute("vlans", vec![10i64, 20]);
        let json = serde_json::to_value(device_to_api(&device)).unwrap();
        if LIST_ATTRIBUTES_COMPILED {
            assert_eq!(
                json["attributes"]["vlans"]["ints"],
                serde_json::json!([10, 20])
            );
            let sent = slice_with(vec![device_to_api(&device)]).spec;
            let mut stored = sent.clone();
            stored.devices.as_mut().unwrap()[0].attributes = Some(BTreeMap::from([(
                "vlans".to_owned(),
                api::DeviceAttribute::default(),
            )]));
            assert_eq!(
                dropped_features(&sent, &stored),
                BTreeSet::from([FeatureGate::ListTypeAttributes])
            );
        }
    }
}

k8s_openapi::k8s_if_ge_1_37! {
#[cfg(test)]
mod tests_1_37 {
    use super::*;
    use crate::slices::model::{DeviceCapacity, NodeAllocatableResource};
    use serde_json::json;

    fn spec_with(devices: &[Device]) -> api::ResourceSliceSpec {
        api::ResourceSliceSpec {
            driver: "gpu.example.com".into(),
            node_name: Some("node-1".into()),
            pool: api::ResourcePool {
                name: "node-1".into(),
                generation: 1,
                resource_slice_count: 1,
            },
            devices: Some(devices.iter().map(device_to_api).collect()),
            ..Default::default()
        }
    }

    fn mig() -> Device {
        Device::new("gpu-0-1g-0")
            .attribute("gpu.example.com/profile", "1g.10gb")
            .consumes_in_groups("gpu-0", [("memory", "10Gi")], ["mig"])
    }

    fn cpu() -> Device {
        Device::new("ccx-0")
            .capacity("cores", DeviceCapacity::new("8"))
            .node_allocatable("cpu", NodeAllocatableResource::per_capacity("cores", "2"))
            .node_allocatable(
                "memory",
                NodeAllocatableResource::overhead_only().per_pod("64Mi").per_container("1Mi"),
            )
    }

    fn gpu_overhead() -> Device {
        Device::new("gpu-1")
            .node_allocatable("memory", NodeAllocatableResource::per_device("2Gi"))
    }

    #[test]
    fn device_fields_in_the_v1_shape_and_back_through_v1beta1() {
        let json = serde_json::to_value(device_to_api(&mig())).unwrap();
        assert_eq!(
            json["consumesCounters"],
            json!([{"counterSet": "gpu-0", "counters": {"memory": {"value": "10Gi"}},
                    "compatibilityGroups": ["mig"]}])
        );
        let json = serde_json::to_value(device_to_api(&cpu())).unwrap();
        assert_eq!(
            json["nodeAllocatableResources"],
            json!({
                "cpu": {"mapping": {"capacityKey": "cores", "capacityMultiplier": "2"}},
                "memory": {"overhead": {"perPod": "64Mi", "perContainer": "1Mi"}},
            })
        );
        let json = serde_json::to_value(device_to_api(&gpu_overhead())).unwrap();
        assert_eq!(
            json["nodeAllocatableResources"],
            json!({"memory": {"mapping": {"deviceMultiplier": "2Gi"}}})
        );

        let mut spec = spec_with(&[mig(), cpu()]);
        set_slice_fields(&mut spec, Some("gpu.example.com/profile"), true);
        let slice = api::ResourceSlice {
            metadata: Default::default(),
            spec,
        };
        for version in ResourceApiVersion::PREFERENCE {
            let object = to_dynamic(&slice, version).unwrap();
            let json = serde_json::to_value(&object).unwrap();
            assert_eq!(json["spec"]["partitionTypeAttribute"], "gpu.example.com/profile");
            assert_eq!(
                json["spec"]["skipNodeOperations"],
                json!(["NodePrepareResources", "NodeUnprepareResources"])
            );
            let device = if version == ResourceApiVersion::V1beta1 {
                &json["spec"]["devices"][1]["basic"]
            } else {
                &json["spec"]["devices"][1]
            };
            assert_eq!(device["nodeAllocatableResources"]["cpu"]["mapping"]["capacityKey"], "cores");
            assert_eq!(from_dynamic(object, version).unwrap(), slice, "{version}");
        }
    }

    #[test]
    fn slice_fields_only_where_the_server_takes_them() {
        // No device consumes counters: no partitionTypeAttribute (the server refuses it).
        let mut spec = spec_with(&[cpu()]);
        set_slice_fields(&mut spec, Some("gpu.example.com/profile"), false);
        assert_eq!(spec.partition_type_attribute, None);
        assert_eq!(spec.skip_node_operations, None);
        // A counter-set slice has no devices: no skipNodeOperations.
        let mut counters = spec_with(&[]);
        counters.devices = None;
        set_slice_fields(&mut counters, None, true);
        assert_eq!(counters.skip_node_operations, None);
    }

    #[test]
    fn dropped_1_37_fields_are_detected_and_stripped_per_policy() {
        let mut sent = spec_with(&[mig(), cpu(), gpu_overhead(), Device::new("plain")]);
        set_slice_fields(&mut sent, Some("gpu.example.com/profile"), true);
        assert!(dropped_features(&sent, &sent).is_empty());

        // What a server with the four alpha gates off stores.
        let mut stored = sent.clone();
        stored.partition_type_attribute = None;
        stored.skip_node_operations = None;
        for device in stored.devices.iter_mut().flatten() {
            device.node_allocatable_resources = None;
            for consumption in device.consumes_counters.iter_mut().flatten() {
                consumption.compatibility_groups = None;
            }
        }
        let dropped = dropped_features(&sent, &stored);
        assert_eq!(
            dropped,
            BTreeSet::from([
                FeatureGate::PartitionableDevicesType,
                FeatureGate::DeviceCompatibilityGroups,
                FeatureGate::NodeAllocatableResources,
                FeatureGate::OptionalNodeOperations,
            ])
        );
        assert_eq!(
            FeatureGate::OptionalNodeOperations.to_string(),
            "DRAOptionalNodeOperations"
        );

        // Stripping: the grouped MIG device and the CPU device (a mapping) are withheld; the
        // GPU's memory mapping is a mapping too (device multiplier); the plain device stays.
        let mut desired = sent.clone();
        strip_features(&mut desired, &dropped);
        let names: Vec<&str> = desired.devices.iter().flatten().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["plain"]);
        assert_eq!(desired.partition_type_attribute, None);
        assert_eq!(desired.skip_node_operations, None);

        // Only the harmless ones dropped: nothing withheld, fields left out.
        let harmless = BTreeSet::from([
            FeatureGate::PartitionableDevicesType,
            FeatureGate::OptionalNodeOperations,
        ]);
        let mut desired = sent.clone();
        strip_features(&mut desired, &harmless);
        assert_eq!(desired.devices.as_ref().map(Vec::len), Some(4));
        assert_eq!(desired.partition_type_attribute, None);
        assert!(!FeatureGate::OptionalNodeOperations.withholds_devices());
        assert!(FeatureGate::DeviceCompatibilityGroups.withholds_devices());
    }

    #[test]
    fn overhead_only_survives_a_dropped_node_allocatable_gate() {
        let overhead = Device::new("gpu-2").node_allocatable(
            "memory",
            NodeAllocatableResource::overhead_only().per_pod("1Gi"),
        );
        let mut desired = spec_with(&[overhead]);
        strip_features(
            &mut desired,
            &BTreeSet::from([FeatureGate::NodeAllocatableResources]),
        );
        let devices = desired.devices.unwrap_or_default();
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0].node_allocatable_resources, None);
    }

    #[test]
    fn new_quantities_compare_by_value() {
        let a = spec_with(&[gpu_overhead()]);
        let mut b = a.clone();
        let resources = b.devices.as_mut().unwrap()[0]
            .node_allocatable_resources
            .as_mut()
            .unwrap();
        resources.get_mut("memory").unwrap().mapping.as_mut().unwrap().device_multiplier =
            Some(Quantity("2048Mi".into()));
        assert!(specs_equal(&a, &b));
    }
}
}
