//! Reading what a driver publishes and checking it against the API server's limits.
//!
//! The publisher of this SDK validates before it writes, but a conformance suite checks the
//! result, whoever wrote it: the ResourceSlices as stored, against the limits of the release the
//! server reports (kubelet-wire §3.2–§3.4). Field rules reuse the SDK's validation of
//! [`Pool`]; the rules that only exist per slice (devices per slice, counter sets per slice,
//! node selection, pool completeness) are checked here.
//!
//! ```no_run
//! # async fn demo(client: kube::Client) -> Result<(), kube::Error> {
//! use dra_sdk::advanced::slices::SliceLimits;
//! use dra_sdk_testing::conformance::slices;
//!
//! let published = slices::read_published(&client, Some("gpu.example.com"), Some("node-a")).await?;
//! let limits = SliceLimits::for_optional_release(published.release);
//! for problem in slices::check(&published.slices, "gpu.example.com", &limits) {
//!     println!("{problem}");
//! }
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, BTreeSet};

use kube::api::{Api, DynamicObject, ListParams};
use serde_json::Value;

use dra_sdk::advanced::slices::{
    CounterLayout, KubernetesVersion, Problem, ResourceApiVersion, SliceLimits,
};
use dra_sdk::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use dra_sdk::slices::{
    AttributeValue, CapacityRequestPolicy, CounterSet, Device, DeviceCapacity,
    DeviceCounterConsumption, DeviceNodeSelection, DeviceTaint, Pool, PoolNodeSelection, Quantity,
    TaintEffect, ValidRequestValues,
};

/// ResourceSlices as read from a server, in `resource.k8s.io/v1` JSON shape whatever version
/// the server serves.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PublishedSlices {
    /// The version they were read in.
    pub api_version: ResourceApiVersion,
    /// The server's release from `/version`, when it reports one.
    pub release: Option<KubernetesVersion>,
    /// The slices, sorted by name.
    pub slices: Vec<Value>,
}

/// Reads the ResourceSlices of `driver` (of every driver when `None`; for `node` and those
/// without a node, when given) in the newest `resource.k8s.io` version the server serves, and
/// the server's release.
pub async fn read_published(
    client: &kube::Client,
    driver: Option<&str>,
    node: Option<&str>,
) -> Result<PublishedSlices, kube::Error> {
    let release = server_release(client).await?;
    let params = match driver {
        Some(driver) => ListParams::default().fields(&format!("spec.driver={driver}")),
        None => ListParams::default(),
    };
    let list = |version: ResourceApiVersion| {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &version.api_resource());
        let params = params.clone();
        async move { api.list(&params).await.map(|list| (version, list)) }
    };
    // A version the server does not serve answers 404: fall back to the next older one.
    let not_served =
        |error: &kube::Error| matches!(error, kube::Error::Api(status) if status.code == 404);
    let (version, list) = match list(ResourceApiVersion::V1).await {
        Err(error) if not_served(&error) => match list(ResourceApiVersion::V1beta2).await {
            Err(error) if not_served(&error) => list(ResourceApiVersion::V1beta1).await?,
            other => other?,
        },
        other => other?,
    };
    let mut slices: Vec<Value> = list
        .items
        .into_iter()
        .filter_map(|object| serde_json::to_value(object).ok())
        .map(|value| to_v1_shape(value, version))
        .filter(|slice| match (node, str_at(slice, "/spec/nodeName")) {
            (Some(node), Some(slice_node)) => slice_node == node,
            _ => true,
        })
        .collect();
    slices.sort_by(|a, b| name_of(a).cmp(name_of(b)));
    Ok(PublishedSlices {
        api_version: version,
        release,
        slices,
    })
}

/// The server's release from `/version`, if it reports a parsable one.
pub async fn server_release(
    client: &kube::Client,
) -> Result<Option<KubernetesVersion>, kube::Error> {
    let info = client.apiserver_version().await?;
    Ok(serde_json::to_value(info)
        .ok()
        .and_then(|info| KubernetesVersion::from_version_info(&info)))
}

/// `v1beta1` wraps everything of a device but its name in `basic`; unwrap it.
fn to_v1_shape(mut slice: Value, version: ResourceApiVersion) -> Value {
    if version == ResourceApiVersion::V1beta1 {
        dra_sdk::advanced::flatten_v1beta1_devices(&mut slice);
    }
    slice
}

fn str_at<'a>(value: &'a Value, pointer: &str) -> Option<&'a str> {
    value.pointer(pointer).and_then(Value::as_str)
}

fn name_of(slice: &Value) -> &str {
    str_at(slice, "/metadata/name").unwrap_or("")
}

fn array_at<'a>(value: &'a Value, pointer: &str) -> &'a [Value] {
    value
        .pointer(pointer)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// Checks `slices` (v1 JSON shape, as [`read_published`] returns them) of `driver` against
/// `limits`. Returns one message per problem, each naming the slice or pool, the device and
/// the field; empty when everything is valid.
pub fn check(slices: &[Value], driver: &str, limits: &SliceLimits) -> Vec<String> {
    let mut problems = Vec::new();
    if let Err(reason) = dra_sdk::k8s::NameRule::DriverName.check(driver) {
        problems.push(format!("driver name {driver:?} is invalid: {reason}"));
    }
    let mut pools: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
    for slice in slices {
        let name = name_of(slice);
        let mut problem = |message: String| problems.push(format!("slice {name}: {message}"));
        match str_at(slice, "/spec/driver") {
            Some(d) if d == driver => {}
            other => problem(format!("spec.driver is {other:?}, expected {driver:?}")),
        }
        check_slice_shape(slice, limits, &mut problem);
        match str_at(slice, "/spec/pool/name") {
            Some(pool) => pools.entry(pool).or_default().push(slice),
            None => problem("spec.pool.name is missing".into()),
        }
    }
    for (pool, slices) in pools {
        check_pool(pool, &slices, limits, &mut problems);
    }
    problems
}

/// Rules of one slice on its own.
fn check_slice_shape(slice: &Value, limits: &SliceLimits, problem: &mut impl FnMut(String)) {
    let set = |field: &str| {
        slice
            .pointer(&format!("/spec/{field}"))
            .is_some_and(|v| !v.is_null() && *v != Value::Bool(false) && v.as_str() != Some(""))
    };
    let selections: Vec<&str> = [
        "nodeName",
        "nodeSelector",
        "allNodes",
        "perDeviceNodeSelection",
    ]
    .into_iter()
    .filter(|field| set(field))
    .collect();
    if selections.len() != 1 {
        problem(format!(
            "exactly one of nodeName, nodeSelector, allNodes and perDeviceNodeSelection must be set, found {selections:?}"
        ));
    }
    match slice
        .pointer("/spec/pool/resourceSliceCount")
        .and_then(Value::as_i64)
    {
        Some(count) if count > 0 => {}
        other => problem(format!(
            "spec.pool.resourceSliceCount must be greater than zero, is {other:?}"
        )),
    }
    if slice
        .pointer("/spec/pool/generation")
        .and_then(Value::as_i64)
        .is_none()
    {
        problem("spec.pool.generation is missing".into());
    }

    let devices = array_at(slice, "/spec/devices");
    let counter_sets = array_at(slice, "/spec/sharedCounters");
    let advanced = devices.iter().any(uses_advanced_features);
    let max = if advanced {
        limits.max_devices_per_slice_advanced
    } else {
        limits.max_devices_per_slice
    };
    let release = release_note(limits);
    if devices.len() > max {
        let why = if advanced {
            " (some device has taints, consumes counters or has list attributes)"
        } else {
            ""
        };
        problem(format!(
            "has {} devices; at most {max} are allowed{release}{why}",
            devices.len()
        ));
    }
    if limits.counter_layout == CounterLayout::SeparateSlices {
        if !devices.is_empty() && !counter_sets.is_empty() {
            problem(format!(
                "has both devices and sharedCounters, which are mutually exclusive{release}"
            ));
        }
        if counter_sets.len() > limits.max_counter_sets_per_slice {
            problem(format!(
                "has {} counter sets; at most {} are allowed{release}",
                counter_sets.len(),
                limits.max_counter_sets_per_slice
            ));
        }
    }
}

fn uses_advanced_features(device: &Value) -> bool {
    let non_empty = |field: &str| !array_at(device, &format!("/{field}")).is_empty();
    let list_attribute = device
        .get("attributes")
        .and_then(Value::as_object)
        .is_some_and(|attributes| {
            attributes.values().any(|a| {
                ["ints", "bools", "strings", "versions"]
                    .iter()
                    .any(|kind| a.get(*kind).is_some_and(|v| !v.is_null()))
            })
        });
    non_empty("taints") || non_empty("consumesCounters") || list_attribute
}

fn release_note(limits: &SliceLimits) -> String {
    match limits.release {
        Some(release) => format!(" on Kubernetes {release}"),
        None => String::new(),
    }
}

/// Rules across the slices of one pool: completeness of the newest generation, then the
/// field rules of the SDK's model validation.
fn check_pool(pool: &str, slices: &[&Value], limits: &SliceLimits, problems: &mut Vec<String>) {
    let generation_of = |slice: &Value| {
        slice
            .pointer("/spec/pool/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0)
    };
    let newest = slices.iter().map(|s| generation_of(s)).max().unwrap_or(0);
    let current: Vec<&Value> = slices
        .iter()
        .copied()
        .filter(|s| generation_of(s) == newest)
        .collect();
    let counts: BTreeSet<i64> = current
        .iter()
        .filter_map(|s| {
            s.pointer("/spec/pool/resourceSliceCount")
                .and_then(Value::as_i64)
        })
        .collect();
    match counts.iter().next() {
        Some(&count) if counts.len() == 1 => {
            if usize::try_from(count).ok() != Some(current.len()) {
                problems.push(format!(
                    "pool {pool:?} generation {newest}: {} slices published, resourceSliceCount says {count}; consumers treat the pool as incomplete",
                    current.len()
                ));
            }
        }
        _ => problems.push(format!(
            "pool {pool:?} generation {newest}: the slices disagree on resourceSliceCount ({counts:?})"
        )),
    }

    // Before 1.35 counter sets belong to their slice, so each slice is its own little pool;
    // from 1.35 on, counter sets and device names are pool-wide.
    let groups: Vec<Vec<&Value>> = match limits.counter_layout {
        CounterLayout::WithDevices => current.iter().map(|s| vec![*s]).collect(),
        CounterLayout::SeparateSlices => vec![current.clone()],
    };
    for group in groups {
        let (model, conversion_problems) = pool_model(&group);
        problems.extend(
            conversion_problems
                .into_iter()
                .map(|p| format!("pool {pool:?}, {p}")),
        );
        if let Err(errors) = model.validate(pool, limits) {
            problems.extend(
                errors
                    .errors
                    .into_iter()
                    // Whether this program was built with list attributes is irrelevant to
                    // what the server holds.
                    .filter(|e| !matches!(e.problem, Problem::NotCompiledIn { .. }))
                    .map(|e| e.to_string()),
            );
        }
    }
    if limits.counter_layout == CounterLayout::WithDevices {
        let mut seen = BTreeSet::new();
        for device in current
            .iter()
            .flat_map(|s| array_at(s, "/spec/devices"))
            .filter_map(|d| d.get("name").and_then(Value::as_str))
        {
            if !seen.insert(device) {
                problems.push(format!(
                    "pool {pool:?}: device {device:?} is published in more than one slice"
                ));
            }
        }
    }
}

/// The SDK's model of the given slices of one pool, and what could not be represented.
fn pool_model(slices: &[&Value]) -> (Pool, Vec<String>) {
    let mut problems = Vec::new();
    let mut pool = Pool::default();
    if let Some(first) = slices.first() {
        let spec = first.get("spec").unwrap_or(&Value::Null);
        pool.node_selection =
            if let Some(selector) = spec.get("nodeSelector").filter(|v| !v.is_null()) {
                match serde_json::from_value(selector.clone()) {
                    Ok(selector) => PoolNodeSelection::NodeSelector(selector),
                    Err(error) => {
                        problems.push(format!("nodeSelector: {error}"));
                        PoolNodeSelection::Local
                    }
                }
            } else if spec.get("allNodes") == Some(&Value::Bool(true)) {
                PoolNodeSelection::AllNodes
            } else if spec.get("perDeviceNodeSelection") == Some(&Value::Bool(true)) {
                PoolNodeSelection::PerDevice
            } else {
                PoolNodeSelection::Local
            };
    }
    for slice in slices {
        for set in array_at(slice, "/spec/sharedCounters") {
            let name = set.get("name").and_then(Value::as_str).unwrap_or_default();
            pool.shared_counters.push(CounterSet {
                name: name.to_owned(),
                counters: counters(set.get("counters")),
            });
        }
        for device in array_at(slice, "/spec/devices") {
            match device_model(device) {
                Ok(device) => pool.devices.push(device),
                Err(problem) => problems.push(problem),
            }
        }
    }
    (pool, problems)
}

/// `{name: {value: quantity}}` as in counter sets and consumption entries.
fn counters(value: Option<&Value>) -> BTreeMap<String, Quantity> {
    value
        .and_then(Value::as_object)
        .map(|counters| {
            counters
                .iter()
                .map(|(name, counter)| {
                    let value = counter.get("value").and_then(Value::as_str).unwrap_or("");
                    (name.clone(), Quantity(value.to_owned()))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn strings(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|item| item.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn quantity(value: Option<&Value>) -> Option<Quantity> {
    value
        .and_then(Value::as_str)
        .map(|q| Quantity(q.to_owned()))
}

/// One attribute: exactly one of its value fields must be set.
fn attribute_model(attribute: &Value) -> Result<AttributeValue, &'static str> {
    const KINDS: [&str; 8] = [
        "int", "bool", "string", "version", "ints", "bools", "strings", "versions",
    ];
    let set: Vec<(&str, &Value)> = KINDS
        .into_iter()
        .filter_map(|kind| {
            attribute
                .get(kind)
                .filter(|v| !v.is_null())
                .map(|v| (kind, v))
        })
        .collect();
    fn list<T: serde::de::DeserializeOwned>(v: &Value) -> Option<T> {
        serde_json::from_value(v.clone()).ok()
    }
    let parsed = match set.as_slice() {
        [("int", v)] => v.as_i64().map(AttributeValue::Int),
        [("bool", v)] => v.as_bool().map(AttributeValue::Bool),
        [("string", v)] => v.as_str().map(|s| AttributeValue::String(s.to_owned())),
        [("version", v)] => v.as_str().map(|s| AttributeValue::Version(s.to_owned())),
        [("ints", v)] => list(v).map(AttributeValue::Ints),
        [("bools", v)] => list(v).map(AttributeValue::Bools),
        [("strings", v)] => list(v).map(AttributeValue::Strings),
        [("versions", v)] => list(v).map(AttributeValue::Versions),
        [] => return Err("has no value"),
        _ => return Err("has more than one value"),
    };
    parsed.ok_or("has a value of the wrong type")
}

fn capacity_model(capacity: &Value) -> Option<DeviceCapacity> {
    let value = quantity(capacity.get("value"))?;
    let request_policy = capacity
        .get("requestPolicy")
        .filter(|p| !p.is_null())
        .map(|policy| {
            let valid = match policy.get("validValues").and_then(Value::as_array) {
                Some(values) => Some(ValidRequestValues::Values(
                    values.iter().filter_map(|v| quantity(Some(v))).collect(),
                )),
                None => policy
                    .get("validRange")
                    .filter(|r| !r.is_null())
                    .map(|range| ValidRequestValues::Range {
                        min: quantity(range.get("min")).unwrap_or_else(|| Quantity(String::new())),
                        max: quantity(range.get("max")),
                        step: quantity(range.get("step")),
                    }),
            };
            let mut model = CapacityRequestPolicy::default();
            model.default = quantity(policy.get("default"));
            model.valid = valid;
            model
        });
    Some(DeviceCapacity {
        value,
        request_policy,
    })
}

/// One API device in the SDK's model. Shape errors (an attribute with no or several values, an
/// unknown taint effect) are returned, naming the device.
fn device_model(value: &Value) -> Result<Device, String> {
    let name = value
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let shape_error = |field: String, what: &str| format!("device {name:?}, {field}: {what}");
    let mut device = Device::new(name.clone());

    let entries = |field: &str| {
        value
            .get(field)
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
    };
    for (key, attribute) in entries("attributes") {
        let parsed = attribute_model(attribute)
            .map_err(|what| shape_error(format!("attributes[{key:?}]"), what))?;
        device.attributes.insert(key.clone(), parsed);
    }
    for (key, capacity) in entries("capacity") {
        let parsed = capacity_model(capacity)
            .ok_or_else(|| shape_error(format!("capacity[{key:?}].value"), "is missing"))?;
        device.capacity.insert(key.clone(), parsed);
    }

    for consumption in array_at(value, "/consumesCounters") {
        device.consumes_counters.push(DeviceCounterConsumption {
            counter_set: consumption
                .get("counterSet")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            counters: counters(consumption.get("counters")),
            compatibility_groups: consumption
                .get("compatibilityGroups")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
        });
    }

    device.node_selection = if let Some(node) = value.get("nodeName").and_then(Value::as_str) {
        Some(DeviceNodeSelection::NodeName(node.to_owned()))
    } else if let Some(selector) = value.get("nodeSelector").filter(|v| !v.is_null()) {
        let selector = serde_json::from_value(selector.clone())
            .map_err(|error| shape_error("nodeSelector".into(), &error.to_string()))?;
        Some(DeviceNodeSelection::NodeSelector(selector))
    } else if value.get("allNodes") == Some(&Value::Bool(true)) {
        Some(DeviceNodeSelection::AllNodes)
    } else {
        None
    };

    for (index, taint) in array_at(value, "/taints").iter().enumerate() {
        let effect = match taint.get("effect").and_then(Value::as_str) {
            Some("None") => TaintEffect::None,
            Some("NoSchedule") => TaintEffect::NoSchedule,
            Some("NoExecute") => TaintEffect::NoExecute,
            other => {
                return Err(shape_error(
                    format!("taints[{index}].effect"),
                    &format!("{other:?} is not one of None, NoSchedule, NoExecute"),
                ));
            }
        };
        let key = taint.get("key").and_then(Value::as_str).unwrap_or_default();
        let mut model = DeviceTaint::new(key, effect);
        if let Some(v) = taint.get("value").and_then(Value::as_str) {
            model = model.value(v);
        }
        if let Some(time) = taint
            .get("timeAdded")
            .and_then(|t| serde_json::from_value::<Time>(t.clone()).ok())
        {
            model = model.time_added(time);
        }
        device.taints.push(model);
    }

    device.binds_to_node = value.get("bindsToNode") == Some(&Value::Bool(true));
    device.binding_conditions = strings(value.get("bindingConditions"));
    device.binding_failure_conditions = strings(value.get("bindingFailureConditions"));
    device.allow_multiple_allocations =
        value.get("allowMultipleAllocations") == Some(&Value::Bool(true));
    Ok(device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(name: &str, pool: &str, generation: i64, count: i64, devices: Value) -> Value {
        json!({
            "metadata": { "name": name },
            "spec": {
                "driver": "gpu.example.com",
                "nodeName": "node-a",
                "pool": { "name": pool, "generation": generation, "resourceSliceCount": count },
                "devices": devices,
            }
        })
    }

    fn gpu(name: &str) -> Value {
        json!({
            "name": name,
            "attributes": { "model": { "string": "h100" }, "index": { "int": 0 } },
            "capacity": { "memory": { "value": "80Gi" } },
        })
    }

    #[test]
    fn valid_slices_have_no_problems() {
        let slices = [
            slice("a", "node-a", 1, 2, json!([gpu("gpu-0")])),
            slice("b", "node-a", 1, 2, json!([gpu("gpu-1")])),
            // An older generation left over during an update is not a problem.
            slice("c", "node-a", 0, 1, json!([gpu("gpu-9")])),
        ];
        let problems = check(&slices, "gpu.example.com", &SliceLimits::strictest());
        assert!(problems.is_empty(), "{problems:?}");
    }

    #[test]
    fn field_rules_and_pool_completeness() {
        let long = "x".repeat(65);
        let bad = json!([
            { "name": "GPU_0" },
            { "name": "gpu-1", "attributes": { "model": { "string": long } } },
            { "name": "gpu-2", "attributes": { "model": { "string": "a", "int": 1 } } },
        ]);
        let slices = [slice("a", "node-a", 3, 2, bad)];
        let problems = check(&slices, "gpu.example.com", &SliceLimits::strictest());
        let text = problems.join("\n");
        assert!(
            text.contains("1 slices published, resourceSliceCount says 2"),
            "{text}"
        );
        assert!(text.contains(r#"device "GPU_0", name"#), "{text}");
        assert!(text.contains("65 characters"), "{text}");
        assert!(text.contains("has more than one value"), "{text}");
    }

    #[test]
    fn per_release_slice_limits() {
        let tainted: Vec<Value> = (0..65)
            .map(|i| {
                json!({
                    "name": format!("gpu-{i}"),
                    "taints": [{ "key": "example.com/x", "effect": "NoSchedule" }],
                })
            })
            .collect();
        let slices = [slice("a", "node-a", 1, 1, Value::Array(tainted))];
        let v134 = SliceLimits::for_release(KubernetesVersion::new(1, 34));
        assert!(check(&slices, "gpu.example.com", &v134).is_empty());
        let v135 = SliceLimits::for_release(KubernetesVersion::new(1, 35));
        let problems = check(&slices, "gpu.example.com", &v135);
        assert!(
            problems[0].contains("has 65 devices; at most 64 are allowed on Kubernetes 1.35"),
            "{problems:?}"
        );

        let mut both = slice("b", "node-a", 1, 1, json!([gpu("gpu-0")]));
        both["spec"]["sharedCounters"] =
            json!([{ "name": "gpu-0", "counters": { "memory": { "value": "80Gi" } } }]);
        let problems = check(&[both], "gpu.example.com", &v135);
        assert!(
            problems.iter().any(|p| p.contains("mutually exclusive")),
            "{problems:?}"
        );
    }

    #[test]
    fn node_selection_must_be_exactly_one() {
        let mut s = slice("a", "node-a", 1, 1, json!([gpu("gpu-0")]));
        s["spec"]["allNodes"] = json!(true);
        let problems = check(&[s], "gpu.example.com", &SliceLimits::strictest());
        assert!(
            problems[0].contains("exactly one of nodeName"),
            "{problems:?}"
        );
    }

    #[test]
    fn v1beta1_devices_are_unwrapped() {
        let s = json!({
            "spec": { "devices": [{ "name": "gpu-0", "basic": { "attributes": { "a": { "int": 1 } } } }] }
        });
        let v1 = to_v1_shape(s, ResourceApiVersion::V1beta1);
        assert_eq!(v1["spec"]["devices"][0]["attributes"]["a"]["int"], 1);
    }
}
