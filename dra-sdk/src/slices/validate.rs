//! Validation of [`DriverResources`] before anything is sent.
//!
//! Every error names the pool, the device where there is one, and the field, so a driver can
//! log it as is. Validation covers what the API server would reject (names, lengths, counts,
//! references) for the release the publisher talks to; slice-level limits (devices per slice,
//! counter sets per slice) cannot be violated because the publisher splits pools itself.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::limits::{CounterLayout, KubernetesVersion, SliceLimits};
use super::model::{
    AttributeValue, CapacityRequestPolicy, Device, DeviceNodeSelection, DriverResources,
    NodeAllocatableResource, NodeSelector, Pool, PoolNodeSelection, Quantity, ValidRequestValues,
};
use crate::k8s::{names, quantity};

/// Where a problem is: pool, device and field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldPath {
    /// The pool, when the problem is inside one.
    pub pool: Option<String>,
    /// The device, when the problem is inside one.
    pub device: Option<String>,
    /// The field, in `resource.k8s.io` JSON spelling (`attributes["model"].string`).
    pub field: String,
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(pool) = &self.pool {
            write!(f, "pool {pool:?}, ")?;
        }
        if let Some(device) = &self.device {
            write!(f, "device {device:?}, ")?;
        }
        write!(f, "{}", self.field)
    }
}

/// What is wrong with a field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Problem {
    /// The value breaks a syntax rule (DNS label, qualified name, quantity, semver …).
    #[error("{value:?} is not a valid {rule}: {reason}")]
    Invalid {
        /// The offending value.
        value: String,
        /// The rule, e.g. "DNS label".
        rule: &'static str,
        /// Why it fails.
        reason: &'static str,
    },
    /// A string is longer than allowed.
    #[error("is {len} characters long; at most {max} are allowed")]
    TooLong {
        /// Actual length.
        len: usize,
        /// Allowed length.
        max: usize,
    },
    /// A collection has more entries than allowed.
    #[error("has {count} {what}; at most {max} are allowed{release}")]
    TooMany {
        /// Actual number.
        count: usize,
        /// Allowed number.
        max: usize,
        /// What is counted.
        what: &'static str,
        /// `" on Kubernetes 1.34"`, or empty when the limit applies to every release.
        release: String,
    },
    /// A name is used twice where it must be unique.
    #[error("{name:?} is used more than once")]
    Duplicate {
        /// The repeated name.
        name: String,
    },
    /// A device consumes from a counter set the pool does not define.
    #[error("refers to counter set {counter_set:?}, which the pool does not define")]
    UnknownCounterSet {
        /// The missing counter set.
        counter_set: String,
    },
    /// A device consumes a counter its counter set does not define.
    #[error("refers to counter {counter:?}, which counter set {counter_set:?} does not define")]
    UnknownCounter {
        /// The counter set.
        counter_set: String,
        /// The missing counter.
        counter: String,
    },
    /// A required value is missing or a list is empty.
    #[error("must not be empty")]
    Empty,
    /// Node selection is inconsistent (pool vs. device vs. publisher).
    #[error("{0}")]
    NodeSelection(&'static str),
    /// Fields that depend on each other disagree (a capacity request policy and its capacity,
    /// binding conditions without binding-failure conditions …).
    #[error("{0}")]
    Inconsistent(&'static str),
    /// The server's release does not know the field.
    #[error("needs Kubernetes {needs} or newer; the server runs {server}")]
    NeedsRelease {
        /// First release with the field.
        needs: KubernetesVersion,
        /// The server's release.
        server: KubernetesVersion,
    },
    /// Two devices with the same partition type consume different counters
    /// (`partitionTypeAttribute`: devices sharing a value must share the same cost).
    #[error(
        "consumes other counters than device {other_device:?}, which has the same partition type {partition_type:?}"
    )]
    PartitionCostMismatch {
        /// The partition type both devices carry.
        partition_type: String,
        /// The first device with that partition type.
        other_device: String,
    },
    /// The application's `k8s-openapi` version feature predates the field.
    #[error(
        "needs the application to build k8s-openapi with a Kubernetes {needs} (or newer) version feature"
    )]
    NotCompiledIn {
        /// First release with the field.
        needs: KubernetesVersion,
    },
}

/// One validation failure.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {problem}")]
pub struct ValidationError {
    /// Where.
    pub path: FieldPath,
    /// What.
    pub problem: Problem,
}

/// All validation failures of a pool or of a whole [`DriverResources`].
#[derive(Clone, Debug, Default, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors {
    /// The failures, in the order found.
    pub errors: Vec<ValidationError>,
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.errors.len();
        write!(
            f,
            "{count} validation error{}",
            if count == 1 { "" } else { "s" }
        )?;
        for (i, error) in self.errors.iter().enumerate() {
            write!(f, "{} {error}", if i == 0 { ":" } else { ";" })?;
        }
        Ok(())
    }
}

impl ValidationErrors {
    fn into_result(self) -> Result<(), Self> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(self)
        }
    }
}

/// Checks a driver name as the publisher does before it publishes anything: a DNS subdomain of
/// at most 63 characters. Upper case is accepted, as the API server accepts it (with a
/// warning); slice names are written in lower case.
///
/// ```
/// use dra_sdk::advanced::slices::validate_driver_name;
///
/// assert!(validate_driver_name("gpu.example.com").is_ok());
/// let errors = validate_driver_name(&format!("{}.com", "a".repeat(60))).unwrap_err();
/// assert_eq!(errors.errors[0].path.field, "driver");
/// ```
pub fn validate_driver_name(driver: &str) -> Result<(), ValidationErrors> {
    names::driver_name(driver).map_err(|reason| ValidationErrors {
        errors: vec![ValidationError {
            path: FieldPath {
                pool: None,
                device: None,
                field: "driver".to_owned(),
            },
            problem: Problem::Invalid {
                value: driver.to_owned(),
                rule: "driver name (DNS subdomain of at most 63 characters)",
                reason,
            },
        }],
    })
}

impl DriverResources {
    /// Checks every pool against the limits of a release (use [`SliceLimits::strictest`]
    /// when the release is unknown).
    ///
    /// ```
    /// use dra_sdk::slices::{Device, DriverResources};
    /// use dra_sdk::advanced::slices::SliceLimits;
    ///
    /// let bad = DriverResources::single_pool("node-1", vec![Device::new("GPU_0")]);
    /// let errors = bad.validate(&SliceLimits::strictest()).unwrap_err();
    /// assert!(errors.to_string().contains(r#"pool "node-1", device "GPU_0", name"#));
    /// ```
    pub fn validate(&self, limits: &SliceLimits) -> Result<(), ValidationErrors> {
        let mut errors = ValidationErrors::default();
        for (name, pool) in &self.pools {
            if let Err(pool_errors) = pool.validate(name, limits) {
                errors.errors.extend(pool_errors.errors);
            }
        }
        errors.into_result()
    }
}

impl Pool {
    /// Checks one pool (named `name`) against the limits of a release.
    pub fn validate(&self, name: &str, limits: &SliceLimits) -> Result<(), ValidationErrors> {
        self.validate_for(name, limits, None)
    }

    /// [`Pool::validate`] knowing the driver, which decides whether a bare attribute name
    /// (implicitly in the driver's domain) matches the pool's `partitionTypeAttribute`.
    pub(crate) fn validate_for(
        &self,
        name: &str,
        limits: &SliceLimits,
        driver: Option<&str>,
    ) -> Result<(), ValidationErrors> {
        let mut v = Validator {
            limits,
            pool: name,
            driver,
            errors: ValidationErrors::default(),
        };
        v.pool(self);
        v.errors.into_result()
    }
}

/// Accumulates errors for one pool.
struct Validator<'a> {
    limits: &'a SliceLimits,
    pool: &'a str,
    /// The publishing driver, when known (bare attribute names are in its domain).
    driver: Option<&'a str>,
    errors: ValidationErrors,
}

/// Release suffix for limits that differ between releases.
fn release_note(limits: &SliceLimits) -> String {
    match limits.release {
        Some(release) => format!(" on Kubernetes {release}"),
        None => " while the server's release is unknown".to_owned(),
    }
}

const LIST_ATTRIBUTES_RELEASE: KubernetesVersion = KubernetesVersion::new(1, 36);

/// First release with `partitionTypeAttribute`, `compatibilityGroups`, the 1.37 shape of
/// `nodeAllocatableResources` and `skipNodeOperations`.
pub(crate) const DEVICE_MODEL_RELEASE: KubernetesVersion = KubernetesVersion::new(1, 37);

/// Node-allocatable resources a device may declare: those a Node reports in
/// `status.allocatable` that are not extended resources (API doc of
/// `Device.nodeAllocatableResources`). `pods` is left out: no device can stand for pod slots.
fn node_allocatable_name(name: &str) -> Result<(), &'static str> {
    match name {
        "cpu" | "memory" | "ephemeral-storage" => Ok(()),
        _ => match name.strip_prefix("hugepages-") {
            Some(size) if quantity::is_valid(size) => Ok(()),
            Some(_) => Err("hugepages-<size> needs a quantity as size, e.g. hugepages-2Mi"),
            None => Err(
                "must be cpu, memory, ephemeral-storage or hugepages-<size>; extended resources are not allowed",
            ),
        },
    }
}

/// What a partitionable device consumes: per consumption entry, its counters and canonical
/// amounts (sorted), without the counter-set name.
type PartitionCost<'a> = Vec<Vec<(&'a str, String)>>;

/// A qualified name with its domain (`gpu.example.com/profile`).
fn fully_qualified_name(name: &str) -> Result<(), &'static str> {
    names::qualified_name(name)?;
    if name.contains('/') {
        Ok(())
    } else {
        Err("needs a domain: <domain>/<name>, e.g. gpu.example.com/profile")
    }
}

/// Most entries of a capacity request policy's `validValues`.
const MAX_VALID_REQUEST_VALUES: usize = 10;

impl Validator<'_> {
    fn push(&mut self, device: Option<&str>, field: impl Into<String>, problem: Problem) {
        self.errors.errors.push(ValidationError {
            path: FieldPath {
                pool: Some(self.pool.to_owned()),
                device: device.map(str::to_owned),
                field: field.into(),
            },
            problem,
        });
    }

    /// Refuses a 1.37 field when the compiled API or the server's release lacks it.
    fn needs_1_37(&mut self, device: Option<&str>, field: &str) {
        if !super::wire::DEVICE_MODEL_1_37_COMPILED {
            self.push(
                device,
                field,
                Problem::NotCompiledIn {
                    needs: DEVICE_MODEL_RELEASE,
                },
            );
        }
        if let Some(server) = self.limits.release
            && !self.limits.device_model_1_37
        {
            self.push(
                device,
                field,
                Problem::NeedsRelease {
                    needs: DEVICE_MODEL_RELEASE,
                    server,
                },
            );
        }
    }

    fn rule(
        &mut self,
        device: Option<&str>,
        field: impl Into<String>,
        value: &str,
        rule: &'static str,
        check: fn(&str) -> Result<(), &'static str>,
    ) {
        if let Err(reason) = check(value) {
            self.push(
                device,
                field,
                Problem::Invalid {
                    value: value.to_owned(),
                    rule,
                    reason,
                },
            );
        }
    }

    fn count(
        &mut self,
        device: Option<&str>,
        field: impl Into<String>,
        count: usize,
        max: usize,
        what: &'static str,
        release_specific: bool,
    ) {
        if count > max {
            let release = if release_specific {
                release_note(self.limits)
            } else {
                String::new()
            };
            self.push(
                device,
                field,
                Problem::TooMany {
                    count,
                    max,
                    what,
                    release,
                },
            );
        }
    }

    fn quantity(&mut self, device: Option<&str>, field: impl Into<String>, value: &Quantity) {
        if !quantity::is_valid(&value.0) {
            self.push(
                device,
                field,
                Problem::Invalid {
                    value: value.0.clone(),
                    rule: "quantity",
                    reason: "must look like 10, 1.5, 100m, 80Gi or 1e3",
                },
            );
        }
    }

    fn node_selector(&mut self, device: Option<&str>, field: &str, selector: &NodeSelector) {
        if selector.node_selector_terms.len() != 1 {
            self.push(
                device,
                format!("{field}.nodeSelectorTerms"),
                Problem::NodeSelection("must have exactly one term"),
            );
        }
    }

    fn pool(&mut self, pool: &Pool) {
        let pool_name = self.pool;
        self.rule(
            None,
            "pool.name",
            pool_name,
            "pool name (DNS subdomains joined by '/')",
            names::pool_name,
        );
        if let Some(generation) = pool.generation
            && generation < 0
        {
            self.push(
                None,
                "pool.generation",
                Problem::Invalid {
                    value: generation.to_string(),
                    rule: "generation",
                    reason: "must not be negative",
                },
            );
        }
        if pool.max_devices_per_slice == Some(0) {
            self.push(
                None,
                "maxDevicesPerSlice",
                Problem::Invalid {
                    value: "0".to_owned(),
                    rule: "device limit",
                    reason: "must be at least 1",
                },
            );
        }
        if let PoolNodeSelection::NodeSelector(selector) = &pool.node_selection {
            self.node_selector(None, "nodeSelector", selector);
        }

        // Counter sets.
        let mut counter_sets: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        let mut total_counters = 0;
        for set in &pool.shared_counters {
            let field = format!("sharedCounters[{:?}]", set.name);
            self.rule(
                None,
                format!("{field}.name"),
                &set.name,
                "DNS label",
                names::dns_label,
            );
            if counter_sets.contains_key(set.name.as_str()) {
                self.push(
                    None,
                    "sharedCounters",
                    Problem::Duplicate {
                        name: set.name.clone(),
                    },
                );
            }
            if set.counters.is_empty() {
                self.push(None, format!("{field}.counters"), Problem::Empty);
            }
            self.count(
                None,
                format!("{field}.counters"),
                set.counters.len(),
                self.limits.max_counters_per_set,
                "counters",
                false,
            );
            for (counter, value) in &set.counters {
                let counter_field = format!("{field}.counters[{counter:?}]");
                self.rule(None, &counter_field, counter, "DNS label", names::dns_label);
                self.quantity(None, format!("{counter_field}.value"), value);
            }
            total_counters += set.counters.len();
            counter_sets.insert(&set.name, set.counters.keys().map(String::as_str).collect());
        }
        let with_devices = self.limits.counter_layout == CounterLayout::WithDevices;
        if with_devices && let Some(max) = self.limits.max_counters_per_slice {
            // All counter sets share the pool's first slice.
            self.count(
                None,
                "sharedCounters",
                total_counters,
                max,
                "counters across all counter sets",
                true,
            );
        }

        // Devices.
        let mut device_names = BTreeSet::new();
        let mut consumers = 0;
        let mut consumed_in_pool = 0;
        for device in &pool.devices {
            if !device_names.insert(device.name.as_str()) {
                self.push(
                    None,
                    "devices",
                    Problem::Duplicate {
                        name: device.name.clone(),
                    },
                );
            }
            self.device(device, &pool.node_selection, &counter_sets);
            if !device.consumes_counters.is_empty() {
                consumers += 1;
                consumed_in_pool += device
                    .consumes_counters
                    .iter()
                    .map(|c| c.counters.len())
                    .sum::<usize>();
            }
        }
        if let Some(attribute) = &pool.partition_type_attribute {
            self.partition_type(pool, attribute);
        }
        if with_devices && !pool.shared_counters.is_empty() {
            // 1.34 keeps counter sets and their consumers in one slice.
            self.count(
                None,
                "devices",
                consumers,
                self.limits.max_devices_per_slice,
                "devices consuming counters (they must share one slice with the counter sets)",
                true,
            );
            if let Some(max) = self.limits.max_consumed_counters_per_slice {
                self.count(
                    None,
                    "devices",
                    consumed_in_pool,
                    max,
                    "consumed counters in the slice with the counter sets",
                    true,
                );
            }
        }
    }

    fn device(
        &mut self,
        device: &Device,
        pool_selection: &PoolNodeSelection,
        counter_sets: &BTreeMap<&str, BTreeSet<&str>>,
    ) {
        let d = Some(device.name.as_str());
        let limits = self.limits;
        self.rule(d, "name", &device.name, "DNS label", names::dns_label);

        // Attributes and capacities.
        self.count(
            d,
            "attributes+capacity",
            device.attributes.len() + device.capacity.len(),
            limits.max_attributes_and_capacities,
            "attributes and capacities together",
            false,
        );
        if let Some(max) = limits.max_attribute_values {
            let values = device
                .attributes
                .values()
                .map(AttributeValue::value_count)
                .sum();
            self.count(
                d,
                "attributes",
                values,
                max,
                "attribute values (list elements counted)",
                true,
            );
        }
        for (name, value) in &device.attributes {
            let field = format!("attributes[{name:?}]");
            self.rule(d, &field, name, "qualified name", names::qualified_name);
            self.attribute(d, &field, value);
        }
        for (name, capacity) in &device.capacity {
            let field = format!("capacity[{name:?}]");
            self.rule(d, &field, name, "qualified name", names::qualified_name);
            self.quantity(d, format!("{field}.value"), &capacity.value);
            if let Some(policy) = &capacity.request_policy {
                let field = format!("{field}.requestPolicy");
                if !device.allow_multiple_allocations {
                    // Recorded: 422 Forbidden "allowMultipleAllocations must be true".
                    self.push(
                        d,
                        &field,
                        Problem::Inconsistent(
                            "needs allowMultipleAllocations: only a device that can be allocated more than once takes capacity requests",
                        ),
                    );
                }
                self.request_policy(d, &field, &capacity.value, policy);
            }
        }

        // Counter consumption.
        self.count(
            d,
            "consumesCounters",
            device.consumes_counters.len(),
            limits.max_consumptions_per_device,
            "counter-consumption entries",
            true,
        );
        let mut seen_sets = BTreeSet::new();
        let mut consumed = 0;
        for consumption in &device.consumes_counters {
            let field = format!("consumesCounters[{:?}]", consumption.counter_set);
            if !seen_sets.insert(consumption.counter_set.as_str()) {
                self.push(
                    d,
                    "consumesCounters",
                    Problem::Duplicate {
                        name: consumption.counter_set.clone(),
                    },
                );
            }
            if consumption.counters.is_empty() {
                self.push(d, format!("{field}.counters"), Problem::Empty);
            }
            self.count(
                d,
                format!("{field}.counters"),
                consumption.counters.len(),
                limits.max_counters_per_consumption,
                "counters",
                false,
            );
            consumed += consumption.counters.len();
            let known = counter_sets.get(consumption.counter_set.as_str());
            if known.is_none() {
                self.push(
                    d,
                    format!("{field}.counterSet"),
                    Problem::UnknownCounterSet {
                        counter_set: consumption.counter_set.clone(),
                    },
                );
            }
            for (counter, value) in &consumption.counters {
                let counter_field = format!("{field}.counters[{counter:?}]");
                if let Some(known) = known
                    && !known.contains(counter.as_str())
                {
                    self.push(
                        d,
                        &counter_field,
                        Problem::UnknownCounter {
                            counter_set: consumption.counter_set.clone(),
                            counter: counter.clone(),
                        },
                    );
                }
                self.quantity(d, format!("{counter_field}.value"), value);
            }
        }
        for consumption in &device.consumes_counters {
            let field = format!("consumesCounters[{:?}]", consumption.counter_set);
            self.compatibility_groups(d, &field, &consumption.compatibility_groups);
        }
        self.node_allocatable(device);
        if let Some(max) = limits.max_consumed_counters_per_device {
            self.count(
                d,
                "consumesCounters",
                consumed,
                max,
                "consumed counters across entries",
                true,
            );
        }

        // Node selection.
        match (pool_selection, &device.node_selection) {
            (PoolNodeSelection::PerDevice, None) => self.push(
                d,
                "nodeSelection",
                Problem::NodeSelection(
                    "is required: the pool uses per-device node selection (set nodeName, nodeSelector or allNodes)",
                ),
            ),
            (PoolNodeSelection::PerDevice, Some(DeviceNodeSelection::NodeName(node))) => {
                self.rule(d, "nodeName", node, "node name (DNS subdomain)", names::dns_subdomain);
            }
            (PoolNodeSelection::PerDevice, Some(DeviceNodeSelection::NodeSelector(selector))) => {
                self.node_selector(d, "nodeSelector", selector);
            }
            (PoolNodeSelection::PerDevice, Some(DeviceNodeSelection::AllNodes)) => {}
            (_, Some(_)) => self.push(
                d,
                "nodeSelection",
                Problem::NodeSelection(
                    "is only allowed when the pool uses per-device node selection (PoolNodeSelection::PerDevice)",
                ),
            ),
            (_, None) => {}
        }

        // Taints.
        self.count(
            d,
            "taints",
            device.taints.len(),
            limits.max_taints_per_device,
            "taints",
            true,
        );
        let mut seen_taints = BTreeSet::new();
        for taint in &device.taints {
            let field = format!("taints[{:?}]", taint.key);
            self.rule(
                d,
                format!("{field}.key"),
                &taint.key,
                "label key",
                names::label_key,
            );
            if let Some(value) = &taint.value {
                self.rule(
                    d,
                    format!("{field}.value"),
                    value,
                    "label value",
                    names::label_value,
                );
            }
            if !seen_taints.insert((taint.key.as_str(), taint.effect)) {
                self.push(
                    d,
                    "taints",
                    Problem::Duplicate {
                        name: format!("{}:{}", taint.key, taint.effect),
                    },
                );
            }
        }

        // Binding conditions: the scheduler needs a failure condition for every device that
        // waits on one (recorded: 422 "bindingFailureConditions are required to use
        // bindingConditions"), and failure conditions alone mean nothing.
        for (field, present, other) in [
            (
                "bindingFailureConditions",
                &device.binding_failure_conditions,
                &device.binding_conditions,
            ),
            (
                "bindingConditions",
                &device.binding_conditions,
                &device.binding_failure_conditions,
            ),
        ] {
            if present.is_empty() && !other.is_empty() {
                self.push(
                    d,
                    field,
                    Problem::Inconsistent(
                        "is required: bindingConditions and bindingFailureConditions go together",
                    ),
                );
            }
        }
        for (field, conditions) in [
            ("bindingConditions", &device.binding_conditions),
            (
                "bindingFailureConditions",
                &device.binding_failure_conditions,
            ),
        ] {
            self.count(
                d,
                field,
                conditions.len(),
                limits.max_binding_conditions,
                "conditions",
                false,
            );
            let mut seen = BTreeSet::new();
            for condition in conditions {
                self.rule(
                    d,
                    format!("{field}[{condition:?}]"),
                    condition,
                    "condition type",
                    names::label_key,
                );
                if !seen.insert(condition.as_str()) {
                    self.push(
                        d,
                        field,
                        Problem::Duplicate {
                            name: condition.clone(),
                        },
                    );
                }
            }
        }
    }

    /// `partitionTypeAttribute`: a fully qualified name; every device that consumes counters
    /// carries it as a string (kube-apiserver 1.37 `validatePartitionTypeAttribute`), and
    /// devices with the same value consume the same counters in the same amounts (the API
    /// doc; the server does not check this, the pool status controller relies on it).
    fn partition_type(&mut self, pool: &Pool, attribute: &str) {
        const FIELD: &str = "partitionTypeAttribute";
        self.needs_1_37(None, FIELD);
        self.rule(
            None,
            FIELD,
            attribute,
            "fully qualified attribute name",
            fully_qualified_name,
        );
        if fully_qualified_name(attribute).is_err() {
            // No device can carry a malformed name; one error says it all.
            return;
        }
        // The bare spelling of the name, when it may be in the driver's domain.
        let bare = attribute.split_once('/').and_then(|(domain, bare)| {
            self.driver
                .is_none_or(|driver| driver == domain)
                .then_some(bare)
        });
        // First device of each partition type, with its cost.
        let mut first: BTreeMap<&str, (&str, PartitionCost<'_>)> = BTreeMap::new();
        for device in pool
            .devices
            .iter()
            .filter(|d| !d.consumes_counters.is_empty())
        {
            let d = Some(device.name.as_str());
            let field = format!("attributes[{attribute:?}]");
            let value = device
                .attributes
                .get(attribute)
                .or_else(|| bare.and_then(|bare| device.attributes.get(bare)));
            let partition_type = match value {
                Some(AttributeValue::String(value)) => value.as_str(),
                Some(_) => {
                    self.push(
                        d,
                        field,
                        Problem::Inconsistent(
                            "must be a string: the pool's partitionTypeAttribute names this attribute",
                        ),
                    );
                    continue;
                }
                None => {
                    self.push(
                        d,
                        field,
                        Problem::Inconsistent(
                            "is required: the device consumes counters and the pool's partitionTypeAttribute names this attribute",
                        ),
                    );
                    continue;
                }
            };
            // The cost: each consumption's counters and canonical amounts; counter-set names
            // differ between partitions of different GPUs of the same type, so they are not
            // part of it.
            let mut cost: PartitionCost<'_> = device
                .consumes_counters
                .iter()
                .map(|c| {
                    c.counters
                        .iter()
                        .map(|(name, q)| (name.as_str(), quantity::canonical(&q.0)))
                        .collect()
                })
                .collect();
            cost.sort();
            match first.get(partition_type) {
                None => {
                    first.insert(partition_type, (device.name.as_str(), cost));
                }
                Some((other, other_cost)) if *other_cost != cost => {
                    let problem = Problem::PartitionCostMismatch {
                        partition_type: partition_type.to_owned(),
                        other_device: (*other).to_owned(),
                    };
                    self.push(d, "consumesCounters", problem);
                }
                Some(_) => {}
            }
        }
    }

    /// `compatibilityGroups` of one counter consumption: at most 2, unique, DNS labels
    /// (`+k8s:maxItems=2`, `+k8s:unique=set`, `+k8s:eachVal=+k8s:format=k8s-short-name`).
    fn compatibility_groups(&mut self, d: Option<&str>, field: &str, groups: &[String]) {
        if groups.is_empty() {
            return;
        }
        let field = format!("{field}.compatibilityGroups");
        self.needs_1_37(d, &field);
        self.count(
            d,
            &field,
            groups.len(),
            self.limits.max_compatibility_groups,
            "compatibility groups",
            false,
        );
        let mut seen = BTreeSet::new();
        for group in groups {
            self.rule(
                d,
                format!("{field}[{group:?}]"),
                group,
                "compatibility group (DNS label)",
                names::dns_label,
            );
            if !seen.insert(group.as_str()) {
                self.push(
                    d,
                    &field,
                    Problem::Duplicate {
                        name: group.clone(),
                    },
                );
            }
        }
    }

    /// `nodeAllocatableResources`, as kube-apiserver 1.37 `validateNodeAllocatableResources`
    /// and the field's declarative tags check it.
    fn node_allocatable(&mut self, device: &Device) {
        if device.node_allocatable_resources.is_empty() {
            return;
        }
        let d = Some(device.name.as_str());
        self.needs_1_37(d, "nodeAllocatableResources");
        for (name, resource) in &device.node_allocatable_resources {
            let field = format!("nodeAllocatableResources[{name:?}]");
            self.rule(
                d,
                &field,
                name,
                "node allocatable resource name",
                node_allocatable_name,
            );
            self.node_allocatable_resource(device, &field, resource);
        }
    }

    fn node_allocatable_resource(
        &mut self,
        device: &Device,
        field: &str,
        resource: &NodeAllocatableResource,
    ) {
        let d = Some(device.name.as_str());
        let has_overhead = resource.per_pod.is_some() || resource.per_container.is_some();
        if !resource.has_mapping() && !has_overhead {
            self.push(
                d,
                field,
                Problem::Inconsistent(
                    "needs a mapping (deviceMultiplier, or capacityKey with capacityMultiplier) or an overhead (perPod, perContainer)",
                ),
            );
            return;
        }
        // Quantities that must be positive (multipliers) or not negative (overheads).
        let amount = |v: &mut Self, field: String, q: &Quantity, positive: bool| {
            v.quantity(d, &field, q);
            let Some(nanos) = quantity::nanos(&q.0) else {
                return;
            };
            let reason = if positive && nanos <= 0 {
                "must be positive"
            } else if nanos < 0 {
                "must not be negative"
            } else {
                return;
            };
            v.push(
                d,
                field,
                Problem::Invalid {
                    value: q.0.clone(),
                    rule: "quantity",
                    reason,
                },
            );
        };
        let mapping = format!("{field}.mapping");
        if resource.device_multiplier.is_some() && resource.capacity_key.is_some() {
            self.push(
                d,
                &mapping,
                Problem::Inconsistent(
                    "deviceMultiplier and capacityKey are mutually exclusive: a mapping counts devices or consumed capacity",
                ),
            );
        }
        if let Some(multiplier) = &resource.device_multiplier {
            amount(
                self,
                format!("{mapping}.deviceMultiplier"),
                multiplier,
                true,
            );
        }
        match (&resource.capacity_key, &resource.capacity_multiplier) {
            (Some(key), multiplier) => {
                if !device.capacity.contains_key(key) {
                    self.push(
                        d,
                        format!("{mapping}.capacityKey"),
                        Problem::Invalid {
                            value: key.clone(),
                            rule: "capacity key",
                            reason: "is not a capacity of this device",
                        },
                    );
                }
                match multiplier {
                    Some(multiplier) => amount(
                        self,
                        format!("{mapping}.capacityMultiplier"),
                        multiplier,
                        true,
                    ),
                    None => self.push(
                        d,
                        format!("{mapping}.capacityMultiplier"),
                        Problem::Inconsistent("is required when capacityKey is set"),
                    ),
                }
            }
            (None, Some(_)) => self.push(
                d,
                format!("{mapping}.capacityKey"),
                Problem::Inconsistent("is required when capacityMultiplier is set"),
            ),
            (None, None) => {}
        }
        if let Some(per_pod) = &resource.per_pod {
            amount(self, format!("{field}.overhead.perPod"), per_pod, false);
        }
        if let Some(per_container) = &resource.per_container {
            amount(
                self,
                format!("{field}.overhead.perContainer"),
                per_container,
                false,
            );
        }
    }

    fn attribute(&mut self, d: Option<&str>, field: &str, value: &AttributeValue) {
        let max = self.limits.max_string_length;
        let text = |v: &mut Self, field: String, s: &str, version: bool| {
            let len = s.chars().count();
            if len > max {
                v.push(d, &field, Problem::TooLong { len, max });
            }
            if version {
                v.rule(d, field, s, "version", names::semver);
            }
        };
        match value {
            AttributeValue::Int(_) | AttributeValue::Bool(_) => {}
            AttributeValue::String(s) => text(self, format!("{field}.string"), s, false),
            AttributeValue::Version(s) => text(self, format!("{field}.version"), s, true),
            AttributeValue::Ints(_)
            | AttributeValue::Bools(_)
            | AttributeValue::Strings(_)
            | AttributeValue::Versions(_) => {
                let (kind, count) = match value {
                    AttributeValue::Ints(v) => ("ints", v.len()),
                    AttributeValue::Bools(v) => ("bools", v.len()),
                    AttributeValue::Strings(v) => ("strings", v.len()),
                    AttributeValue::Versions(v) => ("versions", v.len()),
                    _ => ("", 1),
                };
                let list_field = format!("{field}.{kind}");
                if count == 0 {
                    self.push(d, &list_field, Problem::Empty);
                }
                if !super::wire::LIST_ATTRIBUTES_COMPILED {
                    self.push(
                        d,
                        &list_field,
                        Problem::NotCompiledIn {
                            needs: LIST_ATTRIBUTES_RELEASE,
                        },
                    );
                }
                if let Some(server) = self.limits.release
                    && !self.limits.list_attributes
                {
                    self.push(
                        d,
                        &list_field,
                        Problem::NeedsRelease {
                            needs: LIST_ATTRIBUTES_RELEASE,
                            server,
                        },
                    );
                }
                match value {
                    AttributeValue::Strings(values) => {
                        for (i, s) in values.iter().enumerate() {
                            text(self, format!("{list_field}[{i}]"), s, false);
                        }
                    }
                    AttributeValue::Versions(values) => {
                        for (i, s) in values.iter().enumerate() {
                            text(self, format!("{list_field}[{i}]"), s, true);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    fn request_policy(
        &mut self,
        d: Option<&str>,
        field: &str,
        capacity: &Quantity,
        policy: &CapacityRequestPolicy,
    ) {
        if let Some(default) = &policy.default {
            self.quantity(d, format!("{field}.default"), default);
        }
        // The relations between default, valid values and capacity, as kube-apiserver 1.36
        // checks them (recorded in the API server corpus). Unparsable quantities are reported
        // above; they take no part in comparisons.
        let value = |q: &Quantity| quantity::nanos(&q.0);
        let capacity = value(capacity);
        let default = policy.default.as_ref().and_then(value);
        let default_field = format!("{field}.default");
        match &policy.valid {
            None => {}
            Some(ValidRequestValues::Values(values)) => {
                let values_field = format!("{field}.validValues");
                if values.is_empty() {
                    self.push(d, &values_field, Problem::Empty);
                }
                self.count(
                    d,
                    &values_field,
                    values.len(),
                    MAX_VALID_REQUEST_VALUES,
                    "valid values",
                    false,
                );
                if policy.default.is_none() {
                    self.push(
                        d,
                        &default_field,
                        Problem::Inconsistent("is required when validValues are set"),
                    );
                }
                let mut previous = None;
                for (i, quantity) in values.iter().enumerate() {
                    let item_field = format!("{values_field}[{i}]");
                    self.quantity(d, &item_field, quantity);
                    let Some(current) = value(quantity) else {
                        continue;
                    };
                    if previous.is_some_and(|previous| previous >= current) {
                        self.push(
                            d,
                            &item_field,
                            Problem::Inconsistent("values must be sorted in ascending order"),
                        );
                    }
                    if capacity.is_some_and(|capacity| current > capacity) {
                        self.push(
                            d,
                            &item_field,
                            Problem::Inconsistent("is larger than the capacity's value"),
                        );
                    }
                    previous = Some(current);
                }
                if let Some(default) = default
                    && values.len() <= MAX_VALID_REQUEST_VALUES
                    && !values.iter().any(|v| value(v) == Some(default))
                {
                    self.push(
                        d,
                        &values_field,
                        Problem::Inconsistent("must contain the default"),
                    );
                }
            }
            Some(ValidRequestValues::Range { min, max, step }) => {
                let range_field = format!("{field}.validRange");
                self.quantity(d, format!("{range_field}.min"), min);
                if let Some(max) = max {
                    self.quantity(d, format!("{range_field}.max"), max);
                }
                if let Some(step) = step {
                    self.quantity(d, format!("{range_field}.step"), step);
                }
                if policy.default.is_none() {
                    self.push(
                        d,
                        &default_field,
                        Problem::Inconsistent("is required when validRange is set"),
                    );
                }
                let min = value(min);
                let max = max.as_ref().and_then(value);
                let step = step.as_ref().and_then(value);
                let above = |a: Option<i128>, b: Option<i128>| a.zip(b).is_some_and(|(a, b)| a > b);
                if above(min, capacity) {
                    self.push(
                        d,
                        format!("{range_field}.min"),
                        Problem::Inconsistent("is larger than the capacity's value"),
                    );
                }
                if above(min, max) {
                    self.push(
                        d,
                        format!("{range_field}.max"),
                        Problem::Inconsistent("is smaller than min"),
                    );
                }
                if above(max, capacity) {
                    self.push(
                        d,
                        format!("{range_field}.max"),
                        Problem::Inconsistent("is larger than the capacity's value"),
                    );
                }
                if above(min, default) || above(default, max) {
                    self.push(
                        d,
                        &default_field,
                        Problem::Inconsistent("must lie within validRange"),
                    );
                }
                if let Some(step) = step {
                    if step <= 0 {
                        self.push(
                            d,
                            format!("{range_field}.step"),
                            Problem::Inconsistent("must be positive"),
                        );
                    } else if let Some(min) = min
                        && [default, max]
                            .into_iter()
                            .flatten()
                            .any(|v| (v - min) % step != 0)
                    {
                        self.push(
                            d,
                            format!("{range_field}.step"),
                            Problem::Inconsistent(
                                "default and max must be min plus a multiple of step",
                            ),
                        );
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slices::model::{CounterSet, DeviceCapacity, DeviceTaint, TaintEffect};

    fn problems(pool: &Pool, limits: &SliceLimits) -> Vec<String> {
        match pool.validate("pool-a", limits) {
            Ok(()) => Vec::new(),
            Err(errors) => errors.errors.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn valid_pool_passes() {
        let pool = Pool::new([
            Device::new("gpu-0")
                .attribute("model", "h100")
                .attribute("example.com/index", 0)
                .attribute("driverVersion", AttributeValue::Version("550.1.2".into()))
                .capacity("memory", DeviceCapacity::new("80Gi")),
            Device::new("gpu-0-half").consumes("gpu-0", [("memory", "40Gi")]),
        ])
        .counter_set(CounterSet::new("gpu-0", [("memory", "80Gi")]));
        assert_eq!(
            problems(&pool, &SliceLimits::strictest()),
            Vec::<String>::new()
        );
    }

    #[test]
    fn names_the_device_and_field() {
        let pool = Pool::new([
            Device::new("gpu_0"),
            Device::new("gpu-1").attribute("bad-name", 1),
            Device::new("gpu-2").attribute("s", "x".repeat(65)),
            Device::new("gpu-3").attribute("v", AttributeValue::Version("1.2".into())),
            Device::new("gpu-3"),
        ]);
        let found = problems(&pool, &SliceLimits::strictest());
        assert_eq!(
            found,
            vec![
                r#"pool "pool-a", device "gpu_0", name: "gpu_0" is not a valid DNS label: may contain only lower-case letters, digits and '-'"#,
                r#"pool "pool-a", device "gpu-1", attributes["bad-name"]: "bad-name" is not a valid qualified name: identifier may contain only letters, digits and '_'"#,
                r#"pool "pool-a", device "gpu-2", attributes["s"].string: is 65 characters long; at most 64 are allowed"#,
                r#"pool "pool-a", device "gpu-3", attributes["v"].version: "1.2" is not a valid version: must be a semantic version (semver 2.0.0), e.g. 1.2.3-rc.1+build.5"#,
                r#"pool "pool-a", devices: "gpu-3" is used more than once"#,
            ]
        );
    }

    #[test]
    fn counter_references_are_checked() {
        let pool = Pool::new([
            Device::new("a").consumes("missing", [("memory", "1")]),
            Device::new("b").consumes("gpu", [("cores", "1")]),
        ])
        .counter_set(CounterSet::new("gpu", [("memory", "10")]))
        .counter_set(CounterSet::new("gpu", [("memory", "10")]));
        let found = problems(&pool, &SliceLimits::strictest());
        assert!(found.contains(
            &r#"pool "pool-a", sharedCounters: "gpu" is used more than once"#.to_owned()
        ));
        // Recorded: the real server names the set's `name` field.
        let bad = Pool::new([]).counter_set(CounterSet::new("Set_0", [("memory", "1")]));
        assert_eq!(
            problems(&bad, &SliceLimits::strictest()),
            vec![
                r#"pool "pool-a", sharedCounters["Set_0"].name: "Set_0" is not a valid DNS label: may contain only lower-case letters, digits and '-'"#
            ]
        );
        assert!(found.contains(&r#"pool "pool-a", device "a", consumesCounters["missing"].counterSet: refers to counter set "missing", which the pool does not define"#.to_owned()));
        assert!(found.contains(&r#"pool "pool-a", device "b", consumesCounters["gpu"].counters["cores"]: refers to counter "cores", which counter set "gpu" does not define"#.to_owned()));
    }

    #[test]
    fn per_release_limits() {
        let taints: Vec<_> = (0..5)
            .map(|i| DeviceTaint::new(format!("example.com/t{i}"), TaintEffect::NoSchedule))
            .collect();
        let mut device = Device::new("gpu-0");
        device.taints = taints;
        let pool = Pool::new([device]);
        let v134 = SliceLimits::for_release(KubernetesVersion::new(1, 34));
        let v135 = SliceLimits::for_release(KubernetesVersion::new(1, 35));
        assert_eq!(
            problems(&pool, &v134),
            vec![
                r#"pool "pool-a", device "gpu-0", taints: has 5 taints; at most 4 are allowed on Kubernetes 1.34"#
            ]
        );
        assert!(problems(&pool, &v135).is_empty());
        assert_eq!(
            problems(&pool, &SliceLimits::strictest()),
            vec![
                r#"pool "pool-a", device "gpu-0", taints: has 5 taints; at most 4 are allowed while the server's release is unknown"#
            ]
        );

        let lists = Pool::new([Device::new("nic").attribute("vlans", vec![1i64, 2])]);
        assert_eq!(
            problems(&lists, &v135),
            vec![
                r#"pool "pool-a", device "nic", attributes["vlans"].ints: needs Kubernetes 1.36 or newer; the server runs 1.35"#
            ]
        );
        let three = Device::new("x")
            .consumes("a", [("c", "1")])
            .consumes("b", [("c", "1")])
            .consumes("c", [("c", "1")]);
        let pool = Pool::new([three])
            .counter_set(CounterSet::new("a", [("c", "1")]))
            .counter_set(CounterSet::new("b", [("c", "1")]))
            .counter_set(CounterSet::new("c", [("c", "1")]));
        assert_eq!(
            problems(&pool, &v135),
            vec![
                r#"pool "pool-a", device "x", consumesCounters: has 3 counter-consumption entries; at most 2 are allowed on Kubernetes 1.35"#
            ]
        );
        assert!(problems(&pool, &v134).is_empty());
    }

    #[test]
    fn attribute_and_value_counts() {
        let mut device = Device::new("d");
        for i in 0..33 {
            device = device.attribute(format!("a{i}"), i);
        }
        let found = problems(&Pool::new([device]), &SliceLimits::strictest());
        assert_eq!(
            found,
            vec![
                r#"pool "pool-a", device "d", attributes+capacity: has 33 attributes and capacities together; at most 32 are allowed"#
            ]
        );
        let device = Device::new("d").attribute("many", (0..49).collect::<Vec<i64>>());
        let found = problems(
            &Pool::new([device]),
            &SliceLimits::for_release(KubernetesVersion::new(1, 36)),
        );
        assert_eq!(
            found,
            vec![
                r#"pool "pool-a", device "d", attributes: has 49 attribute values (list elements counted); at most 48 are allowed on Kubernetes 1.36"#
            ]
        );
    }

    #[test]
    fn node_selection_consistency() {
        let pool = Pool::new([Device::new("a").node_selection(DeviceNodeSelection::AllNodes)]);
        assert_eq!(problems(&pool, &SliceLimits::strictest()).len(), 1);
        let pool = Pool::new([Device::new("a")]).node_selection(PoolNodeSelection::PerDevice);
        assert!(problems(&pool, &SliceLimits::strictest())[0].contains("is required"));
        let pool = Pool::new([Device::new("a")])
            .node_selection(PoolNodeSelection::NodeSelector(NodeSelector::default()));
        assert!(problems(&pool, &SliceLimits::strictest())[0].contains("nodeSelectorTerms"));
    }

    /// The rules kube-apiserver 1.36 enforces between fields (each recorded in the API server
    /// corpus; `tests/recordings_apiserver.rs` replays the cases).
    #[test]
    fn binding_conditions_need_failure_conditions() {
        let device = Device::new("d").binding_condition("example.com/ready");
        assert_eq!(
            problems(&Pool::new([device]), &SliceLimits::strictest()),
            vec![
                r#"pool "pool-a", device "d", bindingFailureConditions: is required: bindingConditions and bindingFailureConditions go together"#
            ]
        );
        let device = Device::new("d")
            .binding_condition("example.com/ready")
            .binding_failure_condition("example.com/failed");
        assert!(problems(&Pool::new([device]), &SliceLimits::strictest()).is_empty());
        // bindsToNode alone is accepted (recorded).
        let device = Device::new("d").binds_to_node(true);
        assert!(problems(&Pool::new([device]), &SliceLimits::strictest()).is_empty());
    }

    #[test]
    fn capacity_request_policies() {
        let limits = SliceLimits::strictest();
        let with = |value: &str, policy: CapacityRequestPolicy, multiple: bool| {
            let device = Device::new("d")
                .capacity(
                    "memory",
                    DeviceCapacity::new(value).with_request_policy(policy),
                )
                .allow_multiple_allocations(multiple);
            problems(&Pool::new([device]), &limits)
        };
        let field = r#"pool "pool-a", device "d", capacity["memory"].requestPolicy"#;
        // Recorded accepted: a range with default, min, max and step.
        let ok = CapacityRequestPolicy::with_default("10Gi").valid_range(
            "5Gi",
            Some("80Gi"),
            Some("5Gi"),
        );
        assert!(with("80Gi", ok.clone(), true).is_empty());
        assert_eq!(
            with("80Gi", ok, false),
            vec![format!(
                "{field}: needs allowMultipleAllocations: only a device that can be allocated more than once takes capacity requests"
            )]
        );
        let step = CapacityRequestPolicy::with_default("7Gi").valid_range("5Gi", None, Some("5Gi"));
        assert_eq!(
            with("80Gi", step, true),
            vec![format!(
                "{field}.validRange.step: default and max must be min plus a multiple of step"
            )]
        );
        let max =
            CapacityRequestPolicy::with_default("10Gi").valid_range("5Gi", Some("100Gi"), None);
        assert_eq!(
            with("80Gi", max, true),
            vec![format!(
                "{field}.validRange.max: is larger than the capacity's value"
            )]
        );
        let mut no_default = CapacityRequestPolicy::default().valid_range("5Gi", None, None);
        no_default.default = None;
        assert_eq!(
            with("80Gi", no_default, true),
            vec![format!(
                "{field}.default: is required when validRange is set"
            )]
        );
        let unsorted = CapacityRequestPolicy::with_default("2").valid_values(["2", "1", "4"]);
        assert_eq!(
            with("8", unsorted, true),
            vec![format!(
                "{field}.validValues[1]: values must be sorted in ascending order"
            )]
        );
        let missing = CapacityRequestPolicy::with_default("3").valid_values(["1", "2", "4"]);
        assert_eq!(
            with("8", missing, true),
            vec![format!("{field}.validValues: must contain the default")]
        );
        let eleven =
            CapacityRequestPolicy::with_default("1").valid_values((1..=11).map(|i| i.to_string()));
        assert_eq!(
            with("16", eleven, true),
            vec![format!(
                "{field}.validValues: has 11 valid values; at most 10 are allowed"
            )]
        );
    }

    #[test]
    fn v134_counter_layout_limits() {
        let v134 = SliceLimits::for_release(KubernetesVersion::new(1, 34));
        let big = CounterSet::new("a", (0..20).map(|i| (format!("c{i}"), "1")));
        let other = CounterSet::new("b", (0..20).map(|i| (format!("c{i}"), "1")));
        let pool = Pool::new([]).counter_set(big).counter_set(other);
        assert_eq!(
            problems(&pool, &v134),
            vec![
                r#"pool "pool-a", sharedCounters: has 40 counters across all counter sets; at most 32 are allowed on Kubernetes 1.34"#
            ]
        );
    }

    fn mig_pool() -> Pool {
        let part = |name: &str, profile: &str, memory: &str| {
            Device::new(name)
                .attribute("gpu.example.com/profile", profile)
                .consumes("gpu-0", [("memory", memory)])
        };
        Pool::new([
            part("gpu-0-1g-0", "1g.10gb", "10Gi"),
            part("gpu-0-1g-1", "1g.10gb", "10240Mi"),
            part("gpu-0-full", "7g.80gb", "80Gi"),
            Device::new("nic-0"),
        ])
        .counter_set(CounterSet::new("gpu-0", [("memory", "80Gi")]))
        .partition_type_attribute("gpu.example.com/profile")
    }

    #[test]
    fn partition_type_attribute_is_checked_per_device() {
        let v137 = SliceLimits::for_release(KubernetesVersion::new(1, 37));
        let pool = mig_pool();
        if !super::super::wire::DEVICE_MODEL_1_37_COMPILED {
            return;
        }
        assert_eq!(problems(&pool, &v137), Vec::<String>::new());

        // Missing, not a string, a different cost for the same type, a bad name.
        let mut bad = pool.clone();
        bad.devices[0].attributes.clear();
        bad.devices[1] = bad.devices[1]
            .clone()
            .attribute("gpu.example.com/profile", 7);
        bad.devices.push(
            Device::new("gpu-0-1g-2")
                .attribute("gpu.example.com/profile", "1g.10gb")
                .consumes("gpu-0", [("memory", "20Gi")]),
        );
        bad.devices.push(
            Device::new("gpu-0-1g-3")
                .attribute("gpu.example.com/profile", "1g.10gb")
                .consumes("gpu-0", [("memory", "10Gi")]),
        );
        assert_eq!(
            problems(&bad, &v137),
            [
                r#"pool "pool-a", device "gpu-0-1g-0", attributes["gpu.example.com/profile"]: is required: the device consumes counters and the pool's partitionTypeAttribute names this attribute"#,
                r#"pool "pool-a", device "gpu-0-1g-1", attributes["gpu.example.com/profile"]: must be a string: the pool's partitionTypeAttribute names this attribute"#,
                r#"pool "pool-a", device "gpu-0-1g-3", consumesCounters: consumes other counters than device "gpu-0-1g-2", which has the same partition type "1g.10gb""#,
            ]
        );

        let unqualified = mig_pool().partition_type_attribute("profile");
        let errors = problems(&unqualified, &v137);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with(r#"pool "pool-a", partitionTypeAttribute: "profile" is not a valid fully qualified attribute name"#),
            "{errors:?}"
        );
    }

    #[test]
    fn partition_type_attribute_accepts_a_bare_name_in_the_driver_domain() {
        if !super::super::wire::DEVICE_MODEL_1_37_COMPILED {
            return;
        }
        let limits = SliceLimits::for_release(KubernetesVersion::new(1, 37));
        let pool = Pool::new([Device::new("p")
            .attribute("profile", "1g")
            .consumes("gpu-0", [("memory", "10Gi")])])
        .counter_set(CounterSet::new("gpu-0", [("memory", "80Gi")]))
        .partition_type_attribute("gpu.example.com/profile");
        assert!(
            pool.validate_for("p", &limits, Some("gpu.example.com"))
                .is_ok()
        );
        let other = pool.validate_for("p", &limits, Some("other.example.com"));
        assert!(other.is_err());
    }

    #[test]
    fn the_1_37_fields_need_1_37() {
        let v136 = SliceLimits::for_release(KubernetesVersion::new(1, 36));
        let pool = Pool::new([Device::new("p")
            .attribute("gpu.example.com/profile", "1g")
            .consumes_in_groups("gpu-0", [("memory", "10Gi")], ["mig"])
            .node_allocatable(
                "memory",
                NodeAllocatableResource::overhead_only().per_pod("1Gi"),
            )])
        .counter_set(CounterSet::new("gpu-0", [("memory", "80Gi")]))
        .partition_type_attribute("gpu.example.com/profile");
        let errors = problems(&pool, &v136);
        let fields: Vec<&str> = errors
            .iter()
            .filter(|e| e.contains("needs Kubernetes 1.37 or newer; the server runs 1.36"))
            .map(|e| e.split(": ").next().unwrap_or_default())
            .collect();
        assert_eq!(
            fields,
            [
                r#"pool "pool-a", device "p", consumesCounters["gpu-0"].compatibilityGroups"#,
                r#"pool "pool-a", device "p", nodeAllocatableResources"#,
                r#"pool "pool-a", partitionTypeAttribute"#,
            ],
            "{errors:?}"
        );
        if super::super::wire::DEVICE_MODEL_1_37_COMPILED {
            assert!(problems(&pool, &SliceLimits::strictest()).is_empty());
        } else {
            assert!(errors.iter().any(|e| e.contains("k8s-openapi")));
        }
    }

    #[test]
    fn compatibility_groups_rules() {
        if !super::super::wire::DEVICE_MODEL_1_37_COMPILED {
            return;
        }
        let limits = SliceLimits::for_release(KubernetesVersion::new(1, 37));
        let pool = |groups: &[&str]| {
            Pool::new([Device::new("p").consumes_in_groups(
                "gpu-0",
                [("memory", "10Gi")],
                groups.iter().copied(),
            )])
            .counter_set(CounterSet::new("gpu-0", [("memory", "80Gi")]))
        };
        assert!(problems(&pool(&["mig", "mps"]), &limits).is_empty());
        assert_eq!(
            problems(&pool(&["a", "b", "c"]), &limits),
            [
                r#"pool "pool-a", device "p", consumesCounters["gpu-0"].compatibilityGroups: has 3 compatibility groups; at most 2 are allowed"#
            ]
        );
        assert_eq!(
            problems(&pool(&["mig", "mig"]), &limits),
            [
                r#"pool "pool-a", device "p", consumesCounters["gpu-0"].compatibilityGroups: "mig" is used more than once"#
            ]
        );
        let bad = problems(&pool(&["MIG_1"]), &limits);
        assert_eq!(bad.len(), 1);
        assert!(bad[0].starts_with(
            r#"pool "pool-a", device "p", consumesCounters["gpu-0"].compatibilityGroups["MIG_1"]: "MIG_1" is not a valid compatibility group (DNS label)"#
        ));
    }

    #[test]
    fn node_allocatable_resources_rules() {
        if !super::super::wire::DEVICE_MODEL_1_37_COMPILED {
            return;
        }
        let limits = SliceLimits::for_release(KubernetesVersion::new(1, 37));
        let device = |name: &str, resource: NodeAllocatableResource| {
            Device::new("d")
                .capacity("cores", DeviceCapacity::new("8"))
                .node_allocatable(name, resource)
        };
        let check = |d: Device| problems(&Pool::new([d]), &limits);
        for good in [
            device("cpu", NodeAllocatableResource::per_device("8")),
            device("cpu", NodeAllocatableResource::per_capacity("cores", "2")),
            device(
                "memory",
                NodeAllocatableResource::overhead_only()
                    .per_pod("1Gi")
                    .per_container("0"),
            ),
            device(
                "hugepages-2Mi",
                NodeAllocatableResource::per_device("1Gi").per_pod("2Mi"),
            ),
            device(
                "ephemeral-storage",
                NodeAllocatableResource::overhead_only().per_container("1Gi"),
            ),
        ] {
            assert_eq!(check(good), Vec::<String>::new());
        }
        let prefix = r#"pool "pool-a", device "d", nodeAllocatableResources"#;
        let cases: Vec<(Device, String)> = vec![
            (
                device("example.com/foo", NodeAllocatableResource::per_device("1")),
                format!(
                    r#"{prefix}["example.com/foo"]: "example.com/foo" is not a valid node allocatable resource name: must be cpu, memory, ephemeral-storage or hugepages-<size>; extended resources are not allowed"#
                ),
            ),
            (
                device("cpu", NodeAllocatableResource::overhead_only()),
                format!(
                    r#"{prefix}["cpu"]: needs a mapping (deviceMultiplier, or capacityKey with capacityMultiplier) or an overhead (perPod, perContainer)"#
                ),
            ),
            (
                device("cpu", {
                    let mut r = NodeAllocatableResource::per_device("1");
                    r.capacity_key = Some("cores".into());
                    r.capacity_multiplier = Some(Quantity("1".into()));
                    r
                }),
                format!(
                    r#"{prefix}["cpu"].mapping: deviceMultiplier and capacityKey are mutually exclusive: a mapping counts devices or consumed capacity"#
                ),
            ),
            (
                device("cpu", NodeAllocatableResource::per_capacity("threads", "1")),
                format!(
                    r#"{prefix}["cpu"].mapping.capacityKey: "threads" is not a valid capacity key: is not a capacity of this device"#
                ),
            ),
            (
                device("cpu", NodeAllocatableResource::per_device("0")),
                format!(
                    r#"{prefix}["cpu"].mapping.deviceMultiplier: "0" is not a valid quantity: must be positive"#
                ),
            ),
            (
                device(
                    "cpu",
                    NodeAllocatableResource {
                        capacity_key: Some("cores".into()),
                        ..NodeAllocatableResource::default()
                    },
                ),
                format!(
                    r#"{prefix}["cpu"].mapping.capacityMultiplier: is required when capacityKey is set"#
                ),
            ),
            (
                device(
                    "cpu",
                    NodeAllocatableResource {
                        capacity_multiplier: Some(Quantity("2".into())),
                        ..NodeAllocatableResource::default()
                    },
                ),
                format!(
                    r#"{prefix}["cpu"].mapping.capacityKey: is required when capacityMultiplier is set"#
                ),
            ),
            (
                device(
                    "memory",
                    NodeAllocatableResource::overhead_only().per_pod("-1Gi"),
                ),
                format!(
                    r#"{prefix}["memory"].overhead.perPod: "-1Gi" is not a valid quantity: must not be negative"#
                ),
            ),
            (
                device(
                    "memory",
                    NodeAllocatableResource::overhead_only().per_container("lots"),
                ),
                format!(
                    r#"{prefix}["memory"].overhead.perContainer: "lots" is not a valid quantity: must look like 10, 1.5, 100m, 80Gi or 1e3"#
                ),
            ),
        ];
        for (device, expected) in cases {
            assert_eq!(check(device), [expected]);
        }
    }
}
