//! The allocator's view of the cluster: pools at their newest generation with parsed devices, and
//! what other claims already hold.

use std::collections::{BTreeMap, BTreeSet};

use super::model;
use dra_sdk::k8s::QuantityValue as Quantity;

/// A typed attribute value as constraints compare it; scalars are one-element sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum AttributeValue {
    Int(i64),
    Bool(bool),
    String(String),
    // Compared as strings: semver 2.0.0 versions are canonical (no leading zeros).
    Version(String),
}

/// How a capacity may be consumed by one share of a multi-allocatable device.
#[derive(Clone, Debug)]
pub(crate) struct CapacityData {
    pub(crate) value: Quantity,
    pub(crate) default: Option<Quantity>,
    pub(crate) valid_values: Option<Vec<Quantity>>,
    pub(crate) range: Option<RangeData>,
}

#[derive(Clone, Debug)]
pub(crate) struct RangeData {
    pub(crate) min: Quantity,
    pub(crate) max: Option<Quantity>,
    pub(crate) step: Option<Quantity>,
}

#[derive(Clone, Debug)]
pub(crate) struct DeviceData {
    pub(crate) raw: model::Device,
    pub(crate) capacity: BTreeMap<String, CapacityData>,
    /// Per counter set: the counters this device takes from it.
    pub(crate) counters: Vec<(String, BTreeMap<String, Quantity>)>,
    /// Per counter set it consumes from: its `compatibilityGroups` there (empty: no groups).
    pub(crate) groups: BTreeMap<String, BTreeSet<String>>,
    /// Attributes under their fully qualified names (`domain/name`).
    pub(crate) attributes: BTreeMap<String, Vec<AttributeValue>>,
    pub(crate) multi: bool,
}

#[derive(Clone, Debug)]
pub(crate) struct SliceData {
    pub(crate) node_name: Option<String>,
    pub(crate) node_selector: Option<model::NodeSelector>,
    pub(crate) all_nodes: bool,
    pub(crate) per_device: bool,
    pub(crate) devices: Vec<DeviceData>,
}

#[derive(Clone, Debug)]
pub(crate) struct PoolData {
    pub(crate) driver: String,
    pub(crate) name: String,
    /// Fewer slices of the newest generation than `resourceSliceCount` announces.
    pub(crate) incomplete: bool,
    /// Why the pool cannot be used (duplicate devices, malformed quantities, …).
    pub(crate) invalid: Option<String>,
    /// Slices of the newest generation, ordered by name.
    pub(crate) slices: Vec<SliceData>,
    /// Counter sets of the pool: set → counter → value.
    pub(crate) counter_sets: BTreeMap<String, BTreeMap<String, Quantity>>,
}

impl PoolData {
    /// `driver/pool`, as messages name pools.
    pub(crate) fn id(&self) -> String {
        format!("{}/{}", self.driver, self.name)
    }
}

/// Groups slices into pools, keeps each pool's newest generation and parses its devices.
pub(crate) fn build_pools(slices: Vec<model::Slice>) -> Vec<PoolData> {
    let mut grouped: BTreeMap<(String, String), Vec<model::Slice>> = BTreeMap::new();
    for slice in slices {
        let key = (slice.spec.driver.clone(), slice.spec.pool.name.clone());
        grouped.entry(key).or_default().push(slice);
    }
    grouped
        .into_iter()
        .map(|((driver, name), mut slices)| {
            let newest = slices
                .iter()
                .map(|s| s.spec.pool.generation)
                .max()
                .unwrap_or_default();
            slices.retain(|s| s.spec.pool.generation == newest);
            slices.sort_by(|a, b| a.metadata.name().cmp(b.metadata.name()));
            let expected = slices
                .iter()
                .map(|s| s.spec.pool.resource_slice_count)
                .max()
                .unwrap_or_default();
            let incomplete = i64::try_from(slices.len()).unwrap_or(i64::MAX) < expected;
            let mut pool = PoolData {
                driver,
                name,
                incomplete,
                invalid: None,
                slices: Vec::with_capacity(slices.len()),
                counter_sets: BTreeMap::new(),
            };
            if let Err(reason) = fill_pool(&mut pool, slices) {
                pool.invalid = Some(reason);
            }
            pool
        })
        .collect()
}

fn quantity(text: &str, what: impl FnOnce() -> String) -> Result<Quantity, String> {
    Quantity::parse(text).map_err(|error| format!("{}: {error}", what()))
}

fn fill_pool(pool: &mut PoolData, slices: Vec<model::Slice>) -> Result<(), String> {
    let mut names = BTreeSet::new();
    for slice in &slices {
        for set in &slice.spec.shared_counters {
            if pool.counter_sets.contains_key(&set.name) {
                return Err(format!(
                    "counter set {} is defined more than once",
                    set.name
                ));
            }
            let counters = set
                .counters
                .iter()
                .map(|(name, counter)| {
                    let value = quantity(&counter.value, || {
                        format!("counter set {} counter {name}", set.name)
                    })?;
                    Ok((name.clone(), value))
                })
                .collect::<Result<_, String>>()?;
            pool.counter_sets.insert(set.name.clone(), counters);
        }
    }
    for slice in slices {
        let driver = slice.spec.driver.clone();
        let mut devices = Vec::with_capacity(slice.spec.devices.len());
        for device in slice.spec.devices {
            if !names.insert(device.name.clone()) {
                return Err(format!("device {} is listed more than once", device.name));
            }
            devices.push(parse_device(&driver, device, &pool.counter_sets)?);
        }
        pool.slices.push(SliceData {
            node_name: slice.spec.node_name,
            node_selector: slice.spec.node_selector,
            all_nodes: slice.spec.all_nodes.unwrap_or(false),
            per_device: slice.spec.per_device_node_selection.unwrap_or(false),
            devices,
        });
    }
    Ok(())
}

fn parse_device(
    driver: &str,
    device: model::Device,
    counter_sets: &BTreeMap<String, BTreeMap<String, Quantity>>,
) -> Result<DeviceData, String> {
    let device_name = device.name.clone();
    let mut capacity = BTreeMap::new();
    for (name, entry) in &device.capacity {
        let what = |field: &str| format!("device {device_name} capacity {name}{field}");
        let value = quantity(&entry.value, || what(""))?;
        let policy = entry.request_policy.as_ref();
        let default = policy
            .and_then(|p| p.default.as_deref())
            .map(|text| quantity(text, || what(" default")))
            .transpose()?;
        let valid_values = policy
            .and_then(|p| p.valid_values.as_ref())
            .map(|values| {
                values
                    .iter()
                    .map(|text| quantity(text, || what(" validValues")))
                    .collect()
            })
            .transpose()?;
        let range = match policy.and_then(|p| p.valid_range.as_ref()) {
            Some(range) => match range.min.as_deref() {
                Some(min) => Some(RangeData {
                    min: quantity(min, || what(" validRange.min"))?,
                    max: range
                        .max
                        .as_deref()
                        .map(|t| quantity(t, || what(" validRange.max")))
                        .transpose()?,
                    step: range
                        .step
                        .as_deref()
                        .map(|t| quantity(t, || what(" validRange.step")))
                        .transpose()?,
                }),
                None => return Err(format!("{}: validRange without min", what(""))),
            },
            None => None,
        };
        if range
            .as_ref()
            .and_then(|r| r.step)
            .is_some_and(|step| step.sign() <= 0)
        {
            return Err(format!("{}: validRange.step must be positive", what("")));
        }
        capacity.insert(
            name.clone(),
            CapacityData {
                value,
                default,
                valid_values,
                range,
            },
        );
    }
    let mut counters = Vec::with_capacity(device.consumes_counters.len());
    let mut groups = BTreeMap::new();
    for consumption in &device.consumes_counters {
        let Some(set) = counter_sets.get(&consumption.counter_set) else {
            return Err(format!(
                "device {device_name} consumes from unknown counter set {}",
                consumption.counter_set
            ));
        };
        let mut taken = BTreeMap::new();
        for (name, counter) in &consumption.counters {
            if !set.contains_key(name) {
                return Err(format!(
                    "device {device_name} consumes unknown counter {name} of counter set {}",
                    consumption.counter_set
                ));
            }
            let value = quantity(&counter.value, || {
                format!("device {device_name} counter {name}")
            })?;
            taken.insert(name.clone(), value);
        }
        counters.push((consumption.counter_set.clone(), taken));
        groups.insert(
            consumption.counter_set.clone(),
            consumption.compatibility_groups.iter().cloned().collect(),
        );
    }
    let attributes = device
        .attributes
        .iter()
        .map(|(name, attribute)| {
            let qualified = if name.contains('/') {
                name.clone()
            } else {
                format!("{driver}/{name}")
            };
            (qualified, attribute_values(attribute))
        })
        .collect();
    let multi = device.allow_multiple_allocations.unwrap_or(false);
    Ok(DeviceData {
        raw: device,
        capacity,
        counters,
        groups,
        attributes,
        multi,
    })
}

fn attribute_values(attribute: &model::Attribute) -> Vec<AttributeValue> {
    let mut values = Vec::new();
    if let Some(v) = attribute.int {
        values.push(AttributeValue::Int(v));
    }
    if let Some(v) = attribute.bool {
        values.push(AttributeValue::Bool(v));
    }
    if let Some(v) = &attribute.string {
        values.push(AttributeValue::String(v.clone()));
    }
    if let Some(v) = &attribute.version {
        values.push(AttributeValue::Version(v.clone()));
    }
    values.extend(
        attribute
            .ints
            .iter()
            .flatten()
            .map(|v| AttributeValue::Int(*v)),
    );
    values.extend(
        attribute
            .bools
            .iter()
            .flatten()
            .map(|v| AttributeValue::Bool(*v)),
    );
    values.extend(
        attribute
            .strings
            .iter()
            .flatten()
            .map(|v| AttributeValue::String(v.clone())),
    );
    values.extend(
        attribute
            .versions
            .iter()
            .flatten()
            .map(|v| AttributeValue::Version(v.clone())),
    );
    values
}

/// A device allocation held by another claim.
#[derive(Clone, Debug)]
pub(crate) struct HeldDevice {
    /// The claim's request (`request` or `request/subrequest`).
    pub(crate) request: String,
    pub(crate) driver: String,
    pub(crate) pool: String,
    pub(crate) device: String,
    /// A share of a multi-allocatable device: what it consumes. `None` for exclusive use.
    pub(crate) share: Option<BTreeMap<String, Quantity>>,
    /// The share's `shareID`.
    pub(crate) share_id: Option<String>,
}

/// Another claim's allocation.
#[derive(Clone, Debug)]
pub(crate) struct HeldClaim {
    pub(crate) uid: Option<String>,
    pub(crate) namespace: Option<String>,
    pub(crate) name: String,
    pub(crate) devices: Vec<HeldDevice>,
    /// Devices used with admin access, which hold nothing (only shown by explanations).
    pub(crate) admin_devices: Vec<HeldDevice>,
}

impl HeldClaim {
    pub(crate) fn from_model(claim: &model::Claim) -> Option<Self> {
        let allocation = claim.status.allocation.as_ref()?;
        let held = |result: &model::AllocatedDevice| HeldDevice {
            request: result.request.clone(),
            driver: result.driver.clone(),
            pool: result.pool.clone(),
            device: result.device.clone(),
            share: result.share_id.as_ref().map(|_| {
                result
                    .consumed_capacity
                    .iter()
                    // An unparsable amount cannot have been accepted by the API server.
                    .filter_map(|(name, text)| {
                        Quantity::parse(text).ok().map(|q| (name.clone(), q))
                    })
                    .collect()
            }),
            share_id: result.share_id.clone(),
        };
        // Admin access does not take the device away from ordinary claims.
        let (admin, devices): (Vec<_>, Vec<_>) = allocation
            .devices
            .results
            .iter()
            .partition(|result| result.admin_access.unwrap_or(false));
        Some(Self {
            uid: claim.metadata.uid.clone(),
            namespace: claim.metadata.namespace.clone(),
            name: claim.metadata.name().to_owned(),
            devices: devices.into_iter().map(held).collect(),
            admin_devices: admin.into_iter().map(held).collect(),
        })
    }

    /// `namespace/name`, as messages name claims.
    pub(crate) fn display_name(&self) -> String {
        match &self.namespace {
            Some(namespace) => format!("{namespace}/{}", self.name),
            None => self.name.clone(),
        }
    }

    /// Whether this is (a stale copy of) the claim being allocated.
    pub(crate) fn is_same_claim(&self, claim: &model::Claim) -> bool {
        match (&self.uid, &claim.metadata.uid) {
            (Some(a), Some(b)) => a == b,
            _ => self.namespace == claim.metadata.namespace && self.name == claim.metadata.name(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(value: serde_json::Value) -> model::Slice {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn newest_generation_and_completeness() {
        let pools = build_pools(vec![
            slice(
                serde_json::json!({"metadata": {"name": "b"}, "spec": {"driver": "d", "pool": {"name": "p", "generation": 2, "resourceSliceCount": 2}, "devices": [{"name": "new-1"}]}}),
            ),
            slice(
                serde_json::json!({"metadata": {"name": "a"}, "spec": {"driver": "d", "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1}, "devices": [{"name": "old"}]}}),
            ),
            slice(
                serde_json::json!({"metadata": {"name": "c"}, "spec": {"driver": "d", "pool": {"name": "q", "generation": 1, "resourceSliceCount": 1}, "devices": [{"name": "x"}, {"name": "x"}]}}),
            ),
        ]);
        assert_eq!(pools.len(), 2);
        assert_eq!(pools[0].id(), "d/p");
        assert!(pools[0].incomplete, "one of two slices of generation 2");
        assert_eq!(pools[0].slices.len(), 1);
        assert_eq!(pools[0].slices[0].devices[0].raw.name, "new-1");
        assert_eq!(
            pools[1].invalid.as_deref(),
            Some("device x is listed more than once")
        );
    }

    #[test]
    fn qualified_attributes_and_counters() {
        let pools = build_pools(vec![
            slice(serde_json::json!({
                "metadata": {"name": "s"},
                "spec": {
                    "driver": "gpu.example.com", "pool": {"name": "p", "generation": 1, "resourceSliceCount": 2},
                    "devices": [{
                        "name": "part",
                        "attributes": {"model": {"string": "a"}, "example.com/numa": {"int": 1}},
                        "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": "10Gi"}}}],
                    }],
                },
            })),
            slice(serde_json::json!({
                "metadata": {"name": "t"},
                "spec": {
                    "driver": "gpu.example.com", "pool": {"name": "p", "generation": 1, "resourceSliceCount": 2},
                    "sharedCounters": [{"name": "gpu-0", "counters": {"memory": {"value": "40Gi"}}}],
                },
            })),
        ]);
        let pool = &pools[0];
        assert!(
            !pool.incomplete && pool.invalid.is_none(),
            "{:?}",
            pool.invalid
        );
        let device = &pool.slices[0].devices[0];
        assert!(device.attributes.contains_key("gpu.example.com/model"));
        assert!(device.attributes.contains_key("example.com/numa"));
        assert_eq!(
            device.counters[0].1["memory"],
            Quantity::parse("10Gi").unwrap()
        );
        assert_eq!(
            pool.counter_sets["gpu-0"]["memory"],
            Quantity::parse("40Gi").unwrap()
        );
    }
}
