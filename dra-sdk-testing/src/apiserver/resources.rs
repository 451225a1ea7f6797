//! The table of resource kinds the fake server serves, and what makes each kind special.
//!
//! Everything kind-specific lives here as data (scope, status handling, field selectors, immutable
//! fields, a light validator), so serving another kind is one more constant.

use serde_json::Value;

use super::object::{FieldError, lookup};
use dra_sdk::advanced::slices::{KubernetesVersion, SliceLimits};
use dra_sdk::k8s::{NameRule, QuantityValue, Semver};

/// How a kind treats its `status` stanza.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StatusMode {
    /// No status subresource: `status`, if any, is ordinary content.
    Plain,
    /// A `/status` subresource exists; writes to the main resource keep the stored status.
    /// `clear_on_create` mirrors strategies that wipe `status` on create (ResourceClaim, Pod).
    Subresource { clear_on_create: bool },
}

/// Checks an object beyond its name: returns the field errors a real server would report.
pub(crate) type Validator = fn(&Value) -> Vec<FieldError>;

/// One served resource: group, version, names, scope and server-side behaviour.
///
/// The fake server serves [`ResourceType::defaults`] unless told otherwise through
/// [`FakeApiServerBuilder::resource_types`](super::FakeApiServerBuilder::resource_types).
/// Objects are stored per group and resource name, so serving the same resource under a second
/// version (for example `resource.k8s.io/v1beta2`, whose JSON shape equals v1) shares the objects
/// and only re-stamps `apiVersion`; no conversion is done.
///
/// ```
/// use dra_sdk_testing::apiserver::ResourceType;
///
/// let v1beta2 = ResourceType::RESOURCE_SLICES.with_version("v1beta2");
/// assert_eq!(v1beta2.api_version(), "resource.k8s.io/v1beta2");
/// assert!(!v1beta2.namespaced());
/// ```
#[derive(Clone, Debug)]
pub struct ResourceType {
    pub(crate) group: &'static str,
    pub(crate) version: &'static str,
    pub(crate) plural: &'static str,
    pub(crate) kind: &'static str,
    pub(crate) namespaced: bool,
    pub(crate) short_names: &'static [&'static str],
    pub(crate) status: StatusMode,
    pub(crate) generation: bool,
    pub(crate) field_labels: &'static [&'static str],
    pub(crate) immutable: &'static [&'static str],
    pub(crate) delete_collection: bool,
    pub(crate) returns_deleted_object: bool,
    pub(crate) validate: Option<Validator>,
    /// Lists that server-side apply merges by key (`+listType=map`): path and key fields.
    pub(crate) list_maps: &'static [(&'static str, &'static [&'static str])],
}

impl ResourceType {
    /// `resource.k8s.io/v1` ResourceClaims: namespaced, `/status` subresource, immutable spec.
    pub const RESOURCE_CLAIMS: Self =
        Self::new("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim")
            .in_namespaces()
            .status_subresource(true)
            .immutable(&["spec"])
            .list_maps(&[("status.devices", &["driver", "device", "pool", "shareID"])])
            .validator(validate_resource_claim);
    /// `resource.k8s.io/v1` ResourceClaimTemplates: namespaced, immutable spec.
    pub const RESOURCE_CLAIM_TEMPLATES: Self = Self::new(
        "resource.k8s.io",
        "v1",
        "resourceclaimtemplates",
        "ResourceClaimTemplate",
    )
    .in_namespaces()
    .immutable(&["spec"]);
    /// `resource.k8s.io/v1` ResourceSlices: cluster-scoped, field selectors `spec.nodeName` and
    /// `spec.driver`, immutable driver, node name and pool name.
    pub const RESOURCE_SLICES: Self =
        Self::new("resource.k8s.io", "v1", "resourceslices", "ResourceSlice")
            .field_labels(&["spec.nodeName", "spec.driver"])
            .immutable(&["spec.driver", "spec.nodeName", "spec.pool.name"])
            .validator(validate_resource_slice);
    /// `resource.k8s.io/v1` DeviceClasses: cluster-scoped.
    pub const DEVICE_CLASSES: Self =
        Self::new("resource.k8s.io", "v1", "deviceclasses", "DeviceClass");
    /// Core `v1` Nodes: cluster-scoped, `/status` subresource (kept on create), no generation.
    pub const NODES: Self = Self::new("", "v1", "nodes", "Node")
        .short_names(&["no"])
        .status_subresource(false)
        .field_labels(&["spec.unschedulable"])
        .without_generation()
        .returns_status_on_delete();
    /// Core `v1` Pods: namespaced, `/status` subresource (cleared on create), `spec.nodeName` and
    /// `status.phase` field selectors. Only generic object semantics: no scheduling, no kubelet.
    pub const PODS: Self = Self::new("", "v1", "pods", "Pod")
        .in_namespaces()
        .short_names(&["po"])
        .status_subresource(true)
        .field_labels(&[
            "spec.nodeName",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.phase",
        ]);
    /// Core `v1` Namespaces: cluster-scoped, `/status` subresource. Deleting one is immediate and
    /// does not delete its content; namespaced objects may be created without their namespace.
    pub const NAMESPACES: Self = Self::new("", "v1", "namespaces", "Namespace")
        .short_names(&["ns"])
        .status_subresource(false)
        .field_labels(&["status.phase"])
        .without_generation()
        .without_delete_collection()
        .returns_status_on_delete()
        .validator(validate_namespace);
    /// `apps/v1` Deployments: namespaced, `/status` subresource (cleared on create). Only
    /// generic object semantics: no ReplicaSets or Pods are made, and a delete (whatever its
    /// propagation policy) removes the object at once; a test plays the controllers by writing
    /// `status` (for example `readyReplicas`) itself.
    pub const DEPLOYMENTS: Self = Self::new("apps", "v1", "deployments", "Deployment")
        .in_namespaces()
        .short_names(&["deploy"])
        .status_subresource(true);
    /// `events.k8s.io/v1` Events: namespaced, no generation, the strict validation the real
    /// server applies to Events written through this API (required event time, reporting
    /// controller and instance, action, reason; length limits; a series of at least 2) and
    /// its immutable fields. Unlike a real server, core `v1` Events are a separate store, not
    /// the same objects seen through another API.
    pub const EVENTS: Self = Self::new("events.k8s.io", "v1", "events", "Event")
        .in_namespaces()
        .short_names(&["ev"])
        .without_generation()
        .field_labels(&[
            "regarding.kind",
            "regarding.name",
            "regarding.namespace",
            "regarding.uid",
            "reason",
            "type",
            "reportingController",
        ])
        .immutable(&[
            "eventTime",
            "action",
            "reason",
            "note",
            "type",
            "regarding",
            "related",
            "reportingController",
            "reportingInstance",
        ])
        .validator(validate_event);

    /// The kinds served by default: ResourceClaims, ResourceClaimTemplates, ResourceSlices,
    /// DeviceClasses (all `resource.k8s.io/v1`), core Nodes, Pods and Namespaces, `apps/v1`
    /// Deployments and `events.k8s.io/v1` Events.
    pub fn defaults() -> Vec<Self> {
        vec![
            Self::RESOURCE_CLAIMS,
            Self::RESOURCE_CLAIM_TEMPLATES,
            Self::RESOURCE_SLICES,
            Self::DEVICE_CLASSES,
            Self::NODES,
            Self::PODS,
            Self::NAMESPACES,
            Self::DEPLOYMENTS,
            Self::EVENTS,
        ]
    }

    const fn new(
        group: &'static str,
        version: &'static str,
        plural: &'static str,
        kind: &'static str,
    ) -> Self {
        Self {
            group,
            version,
            plural,
            kind,
            namespaced: false,
            short_names: &[],
            status: StatusMode::Plain,
            generation: true,
            field_labels: &[],
            immutable: &[],
            delete_collection: true,
            returns_deleted_object: true,
            validate: None,
            list_maps: &[],
        }
    }

    const fn in_namespaces(mut self) -> Self {
        self.namespaced = true;
        self
    }

    const fn short_names(mut self, names: &'static [&'static str]) -> Self {
        self.short_names = names;
        self
    }

    const fn status_subresource(mut self, clear_on_create: bool) -> Self {
        self.status = StatusMode::Subresource { clear_on_create };
        self
    }

    const fn field_labels(mut self, labels: &'static [&'static str]) -> Self {
        self.field_labels = labels;
        self
    }

    const fn immutable(mut self, paths: &'static [&'static str]) -> Self {
        self.immutable = paths;
        self
    }

    const fn without_generation(mut self) -> Self {
        self.generation = false;
        self
    }

    const fn without_delete_collection(mut self) -> Self {
        self.delete_collection = false;
        self
    }

    const fn returns_status_on_delete(mut self) -> Self {
        self.returns_deleted_object = false;
        self
    }

    const fn list_maps(
        mut self,
        list_maps: &'static [(&'static str, &'static [&'static str])],
    ) -> Self {
        self.list_maps = list_maps;
        self
    }

    const fn validator(mut self, validate: Validator) -> Self {
        self.validate = Some(validate);
        self
    }

    /// The same resource served under another version of its group (same JSON shape assumed).
    #[must_use]
    pub const fn with_version(mut self, version: &'static str) -> Self {
        self.version = version;
        self
    }

    /// API group; empty for the core group.
    pub fn group(&self) -> &'static str {
        self.group
    }

    /// API version within the group, e.g. `v1`.
    pub fn version(&self) -> &'static str {
        self.version
    }

    /// `apiVersion` as written in objects: `group/version`, or `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Plural resource name used in URLs, e.g. `resourceslices`.
    pub fn plural(&self) -> &'static str {
        self.plural
    }

    /// Kind, e.g. `ResourceSlice`.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// Whether objects live in namespaces.
    pub fn namespaced(&self) -> bool {
        self.namespaced
    }

    /// Whether the kind has a `/status` subresource.
    pub fn has_status_subresource(&self) -> bool {
        matches!(self.status, StatusMode::Subresource { .. })
    }

    /// Singular name in discovery: the lowercased kind for every built-in kind.
    pub(crate) fn singular(&self) -> String {
        self.kind.to_ascii_lowercase()
    }

    /// `plural.group` as the API server names resources in messages (`nodes` for core).
    pub(crate) fn qualified_resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// `Kind.group` as the API server names kinds in validation messages.
    pub(crate) fn qualified_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.to_string()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }

    /// Verbs in discovery order.
    pub(crate) fn verbs(&self) -> Vec<&'static str> {
        let mut verbs = vec!["create", "delete"];
        if self.delete_collection {
            verbs.push("deletecollection");
        }
        verbs.extend(["get", "list", "patch", "update", "watch"]);
        verbs
    }

    /// Whether `field` may be used in a field selector on this kind.
    pub(crate) fn supports_field(&self, field: &str) -> bool {
        field == "metadata.name"
            || field == "metadata.namespace"
            || self.field_labels.contains(&field)
    }
}

/// Validation a real server does on ResourceSlices that a buggy publisher could trip
/// (a subset of `ValidateResourceSlice` for 1.36; see kubelet-wire.md §3.2 and §3.4).
fn validate_resource_slice(obj: &Value) -> Vec<FieldError> {
    let limits = limits();
    let mut errors = Vec::new();
    let spec = lookup(obj, "spec");
    if spec.is_none() {
        errors.push(FieldError::required("spec"));
        return errors;
    }
    if lookup(obj, "spec.driver")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        errors.push(FieldError::required("spec.driver"));
    }
    if let Some(driver) = lookup(obj, "spec.driver").and_then(Value::as_str)
        && !driver.is_empty()
        && let Err(reason) = NameRule::DriverName.check(driver)
    {
        errors.push(if driver.len() > NameRule::DriverName.max_len() {
            too_long_by("spec.driver", NameRule::DriverName.max_len())
        } else {
            FieldError::invalid("spec.driver", &Value::from(driver), reason)
        });
    }
    match lookup(obj, "spec.pool.name").and_then(Value::as_str) {
        None | Some("") => errors.push(FieldError::required("spec.pool.name")),
        Some(pool) if pool.len() > NameRule::PoolName.max_len() => {
            errors.push(too_long_by("spec.pool.name", NameRule::PoolName.max_len()));
        }
        Some(pool) => {
            if let Err(reason) = NameRule::PoolName.check(pool) {
                errors.push(FieldError::invalid(
                    "spec.pool.name",
                    &Value::from(pool),
                    reason,
                ));
            }
        }
    }
    if lookup(obj, "spec.perDeviceNodeSelection") == Some(&Value::Bool(false)) {
        errors.push(FieldError::invalid(
            "spec.perDeviceNodeSelection",
            &Value::Bool(false),
            "must be either unset or set to true",
        ));
    }
    if let Some(terms) =
        lookup(obj, "spec.nodeSelector.nodeSelectorTerms").and_then(Value::as_array)
        && terms.len() != 1
    {
        errors.push(FieldError::invalid(
            "spec.nodeSelector.nodeSelectorTerms",
            &Value::from(terms.len()),
            "must have exactly one node selector term",
        ));
    }
    match lookup(obj, "spec.pool.resourceSliceCount").and_then(Value::as_i64) {
        Some(count) if count > 0 => {}
        Some(count) => errors.push(FieldError::invalid(
            "spec.pool.resourceSliceCount",
            &Value::from(count),
            "must be greater than zero",
        )),
        None => errors.push(FieldError::required("spec.pool.resourceSliceCount")),
    }
    if lookup(obj, "spec.pool.generation")
        .and_then(Value::as_i64)
        .is_some_and(|g| g < 0)
    {
        errors.push(FieldError::invalid(
            "spec.pool.generation",
            lookup(obj, "spec.pool.generation").unwrap_or(&Value::Null),
            "must be greater than or equal to 0",
        ));
    }
    let node_selection = [
        "nodeName",
        "nodeSelector",
        "allNodes",
        "perDeviceNodeSelection",
    ]
    .iter()
    .filter(|field| {
        lookup(obj, &format!("spec.{field}")).is_some_and(|v| {
            !v.is_null() && v != &Value::Bool(false) && v != &Value::String(String::new())
        })
    })
    .count();
    if node_selection != 1 {
        errors.push(FieldError {
            field: "spec".into(),
            reason: "FieldValueInvalid",
            message: "Invalid value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required".into(),
        });
    }
    if let Some(devices) = lookup(obj, "spec.devices").and_then(Value::as_array) {
        // v1beta1 keeps everything but a device's name in `basic`; the rules are the same.
        let devices: Vec<Value> = devices.iter().map(without_basic).collect();
        let advanced = devices.iter().any(|d| {
            lookup(d, "taints").is_some_and(|t| t.as_array().is_some_and(|a| !a.is_empty()))
                || lookup(d, "consumesCounters")
                    .is_some_and(|t| t.as_array().is_some_and(|a| !a.is_empty()))
                || has_list_attribute(d)
        });
        let limit = if advanced { 64 } else { 128 };
        if devices.len() > limit {
            errors.push(FieldError {
                field: "spec.devices".into(),
                reason: "FieldValueTooMany",
                message: format!(
                    "Too many: {}: must have at most {limit} items",
                    devices.len()
                ),
            });
        }
        let per_device = lookup(obj, "spec.perDeviceNodeSelection") == Some(&Value::Bool(true));
        let mut seen = std::collections::BTreeSet::new();
        for (index, device) in devices.iter().enumerate() {
            let path = format!("spec.devices[{index}]");
            validate_device_attributes(&path, device, &mut errors);
            validate_device(&path, device, per_device, &limits, &mut errors);
            match lookup(device, "name").and_then(Value::as_str) {
                None | Some("") => errors.push(FieldError::required(&format!("{path}.name"))),
                Some(name) => {
                    if let Err(reason) = NameRule::DnsLabel.check(name) {
                        errors.push(FieldError::invalid(
                            &format!("{path}.name"),
                            &Value::from(name),
                            reason,
                        ));
                    }
                    if !seen.insert(name) {
                        // Recorded: the real server names the entry, not its name field.
                        errors.push(duplicate(&path, name));
                    }
                }
            }
        }
    }
    validate_shared_counters(obj, &limits, &mut errors);
    validate_partition_type_attribute(obj, &mut errors);
    validate_skip_node_operations(obj, &mut errors);
    if lookup(obj, "spec.sharedCounters")
        .and_then(Value::as_array)
        .is_some_and(|c| !c.is_empty())
        && lookup(obj, "spec.devices")
            .and_then(Value::as_array)
            .is_some_and(|d| !d.is_empty())
    {
        errors.push(FieldError {
            field: "spec".into(),
            reason: "FieldValueInvalid",
            message: "Invalid value: only one of `devices` and `sharedCounters` may be set".into(),
        });
    }
    errors
}

/// A v1beta1 device (`{name, basic: {...}}`) in the v1 shape; v1 devices unchanged.
fn without_basic(device: &Value) -> Value {
    match (device.get("basic"), device.get("name")) {
        (Some(Value::Object(basic)), name) => {
            let mut out = basic.clone();
            if let Some(name) = name {
                out.insert("name".to_owned(), name.clone());
            }
            Value::Object(out)
        }
        _ => device.clone(),
    }
}

/// The per-object limits the fake enforces: the SDK's for 1.36, which the recorded API server
/// corpus checks (`tests/recordings_apiserver.rs`).
fn limits() -> SliceLimits {
    SliceLimits::for_release(KubernetesVersion::new(1, 36))
}

const TAINT_EFFECTS: [&str; 3] = ["NoSchedule", "NoExecute", "None"];

fn too_many(field: &str, count: usize, max: usize) -> Option<FieldError> {
    (count > max).then(|| FieldError {
        field: field.to_owned(),
        reason: "FieldValueTooMany",
        message: format!("Too many: {count}: must have at most {max} items"),
    })
}

fn duplicate(field: &str, value: &str) -> FieldError {
    FieldError {
        field: field.to_owned(),
        reason: "FieldValueDuplicate",
        message: format!("Duplicate value: \"{value}\""),
    }
}

fn too_long_by(field: &str, max: usize) -> FieldError {
    FieldError {
        field: field.to_owned(),
        reason: "FieldValueTooLong",
        message: format!("Too long: may not be more than {max} bytes"),
    }
}

fn array<'a>(value: &'a Value, path: &str) -> &'a [Value] {
    lookup(value, path)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn object_keys<'a>(value: &'a Value, path: &str) -> Vec<&'a str> {
    lookup(value, path)
        .and_then(Value::as_object)
        .map(|map| map.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

/// The per-device rules of 1.36 beyond attribute values: names of attributes and capacities,
/// their number, taints, binding conditions, counter consumption and per-device node
/// selection. The name rules are the SDK's own (`slices::names`), which the recordings check.
fn validate_device(
    path: &str,
    device: &Value,
    per_device: bool,
    limits: &SliceLimits,
    errors: &mut Vec<FieldError>,
) {
    let attributes = object_keys(device, "attributes");
    let capacities = object_keys(device, "capacity");
    let total = attributes.len() + capacities.len();
    if total > limits.max_attributes_and_capacities {
        errors.push(FieldError::invalid(
            path,
            &Value::from(total),
            &format!(
                "the total number of attributes and capacities must not exceed {}",
                limits.max_attributes_and_capacities
            ),
        ));
    }
    for (map, names_in_map) in [("attributes", &attributes), ("capacity", &capacities)] {
        for name in names_in_map.iter() {
            if let Err(reason) = NameRule::QualifiedName.check(name) {
                errors.push(FieldError::invalid(
                    &format!("{path}.{map}"),
                    &Value::from(*name),
                    reason,
                ));
            }
        }
    }
    for name in &attributes {
        if let Some(version) = lookup(device, "attributes")
            .and_then(|a| a.get(*name))
            .and_then(|a| a.get("version"))
            .and_then(Value::as_str)
            && let Err(reason) = Semver::parse(version)
                .map_err(|_| "must be a semantic version (semver 2.0.0), e.g. 1.2.3-rc.1+build.5")
        {
            errors.push(FieldError::invalid(
                &format!("{path}.attributes[{name}].version"),
                &Value::from(version),
                reason,
            ));
        }
    }

    let taints = array(device, "taints");
    errors.extend(too_many(
        &format!("{path}.taints"),
        taints.len(),
        limits.max_taints_per_device,
    ));
    for (i, taint) in taints.iter().enumerate() {
        let field = format!("{path}.taints[{i}]");
        let text = |key: &str| taint.get(key).and_then(Value::as_str);
        if let Some(key) = text("key")
            && let Err(reason) = NameRule::LabelKey.check(key)
        {
            errors.push(FieldError::invalid(
                &format!("{field}.key"),
                &Value::from(key),
                reason,
            ));
        }
        if let Some(value) = text("value")
            && let Err(reason) = NameRule::LabelValue.check(value)
        {
            errors.push(FieldError::invalid(
                &format!("{field}.value"),
                &Value::from(value),
                reason,
            ));
        }
        match text("effect") {
            None | Some("") => errors.push(FieldError::required(&format!("{field}.effect"))),
            Some(effect) if !TAINT_EFFECTS.contains(&effect) => errors.push(FieldError {
                field: format!("{field}.effect"),
                reason: "FieldValueNotSupported",
                message: format!(
                    "Unsupported value: \"{effect}\": supported values: \"NoExecute\", \"NoSchedule\", \"None\""
                ),
            }),
            Some(_) => {}
        }
    }

    let conditions = array(device, "bindingConditions");
    let failures = array(device, "bindingFailureConditions");
    for (name, list, other, other_name) in [
        (
            "bindingConditions",
            conditions,
            failures,
            "bindingFailureConditions",
        ),
        (
            "bindingFailureConditions",
            failures,
            conditions,
            "bindingConditions",
        ),
    ] {
        let field = format!("{path}.{name}");
        errors.extend(too_many(&field, list.len(), limits.max_binding_conditions));
        for (i, condition) in list.iter().enumerate() {
            if let Some(condition) = condition.as_str()
                && let Err(reason) = NameRule::LabelKey.check(condition)
            {
                errors.push(FieldError::invalid(
                    &format!("{field}[{i}]"),
                    &Value::from(condition),
                    reason,
                ));
            }
        }
        if list.is_empty() && !other.is_empty() {
            errors.push(FieldError::invalid(
                &field,
                &Value::Null,
                &format!("{name} are required to use {other_name}"),
            ));
        }
    }

    let consumptions = array(device, "consumesCounters");
    errors.extend(too_many(
        &format!("{path}.consumesCounters"),
        consumptions.len(),
        limits.max_consumptions_per_device,
    ));
    let mut sets = std::collections::BTreeSet::new();
    for (i, consumption) in consumptions.iter().enumerate() {
        let field = format!("{path}.consumesCounters[{i}]");
        let set = consumption
            .get("counterSet")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !sets.insert(set) {
            errors.push(duplicate(&field, set));
        }
        let counters = object_keys(consumption, "counters").len();
        errors.extend(too_many(
            &format!("{field}.counters"),
            counters,
            limits.max_counters_per_consumption,
        ));
        validate_compatibility_groups(&field, consumption, errors);
    }
    validate_node_allocatable_resources(path, device, errors);

    let selections = ["nodeName", "nodeSelector", "allNodes"]
        .iter()
        .filter(|key| {
            device
                .get(**key)
                .is_some_and(|v| !v.is_null() && v != &Value::Bool(false))
        })
        .count();
    match (per_device, selections) {
        (true, 0) => errors.push(FieldError {
            field: path.to_owned(),
            reason: "FieldValueRequired",
            message: "Required value: exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when `perDeviceNodeSelection` is set to true in the ResourceSlice spec".into(),
        }),
        (true, 1) | (false, 0) => {}
        (true, _) => errors.push(FieldError::invalid(
            path,
            &Value::Null,
            "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when `perDeviceNodeSelection` is set to true in the ResourceSlice spec",
        )),
        (false, _) => errors.push(FieldError::invalid(
            path,
            &Value::Null,
            "`nodeName`, `nodeSelector` and `allNodes` can only be set if `perDeviceNodeSelection` is set to true in the ResourceSlice spec",
        )),
    }
}

/// `spec.partitionTypeAttribute` (1.37, `DRAPartitionableDevicesType`), as kube-apiserver 1.37
/// checks it: a fully qualified name, only on a slice with devices that consume counters, and
/// each of those devices carries the attribute (by that name, or bare when the name is in the
/// driver's domain) as a string.
fn validate_partition_type_attribute(obj: &Value, errors: &mut Vec<FieldError>) {
    const FIELD: &str = "spec.partitionTypeAttribute";
    let Some(name) = lookup(obj, FIELD).and_then(Value::as_str) else {
        return;
    };
    let devices: Vec<Value> = array(obj, "spec.devices")
        .iter()
        .map(without_basic)
        .collect();
    let consumers: Vec<(usize, &Value)> = devices
        .iter()
        .enumerate()
        .filter(|(_, d)| !array(d, "consumesCounters").is_empty())
        .collect();
    if consumers.is_empty() {
        errors.push(FieldError::invalid(
            FIELD,
            &Value::from(name),
            "may only be set on a slice which declares devices that consume counters",
        ));
        return;
    }
    let qualified = NameRule::QualifiedName.check(name);
    if let Err(reason) = qualified.and_then(|()| {
        if name.contains('/') {
            Ok(())
        } else {
            Err("a fully qualified name must be a domain and a name separated by a slash")
        }
    }) {
        errors.push(FieldError::invalid(FIELD, &Value::from(name), reason));
        return;
    }
    let driver = lookup(obj, "spec.driver")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let bare = name
        .strip_prefix(driver)
        .and_then(|rest| rest.strip_prefix('/'));
    for (index, device) in consumers {
        let field = format!("spec.devices[{index}].attributes[{name}]");
        let attribute = device
            .get("attributes")
            .and_then(|a| a.get(name).or_else(|| bare.and_then(|bare| a.get(bare))));
        match attribute {
            None => errors.push(FieldError {
                field,
                reason: "FieldValueRequired",
                message: "Required value: device consumes counters and `partitionTypeAttribute` names this attribute, so it must be set".into(),
            }),
            Some(attribute) if attribute.get("string").is_none_or(|v| !v.is_string()) => {
                errors.push(FieldError::invalid(
                    &field,
                    attribute,
                    "must be a string value because `partitionTypeAttribute` names this attribute",
                ));
            }
            Some(_) => {}
        }
    }
}

/// `spec.skipNodeOperations` (1.37, `DRAOptionalNodeOperations`): a set of
/// `NodePrepareResources`, `NodeUnprepareResources` and `*`; `NodePrepareResources` only with
/// `NodeUnprepareResources` or `*`.
fn validate_skip_node_operations(obj: &Value, errors: &mut Vec<FieldError>) {
    const FIELD: &str = "spec.skipNodeOperations";
    const KNOWN: [&str; 3] = ["NodePrepareResources", "NodeUnprepareResources", "*"];
    let operations = array(obj, FIELD);
    let mut seen = std::collections::BTreeSet::new();
    for (i, operation) in operations.iter().enumerate() {
        let field = format!("{FIELD}[{i}]");
        match operation.as_str() {
            Some(op) if KNOWN.contains(&op) => {
                if !seen.insert(op) {
                    errors.push(duplicate(&field, op));
                }
            }
            _ => errors.push(FieldError {
                field,
                reason: "FieldValueNotSupported",
                message: format!(
                    "Unsupported value: {operation}: supported values: \"*\", \"NodePrepareResources\", \"NodeUnprepareResources\""
                ),
            }),
        }
    }
    if seen.contains("NodePrepareResources")
        && !seen.contains("NodeUnprepareResources")
        && !seen.contains("*")
    {
        errors.push(FieldError::invalid(
            FIELD,
            lookup(obj, FIELD).unwrap_or(&Value::Null),
            "NodePrepareResources cannot be skipped unless NodeUnprepareResources is also skipped",
        ));
    }
}

/// `compatibilityGroups` of one counter consumption (1.37, `DRADeviceCompatibilityGroups`):
/// at most 2, unique, DNS labels.
fn validate_compatibility_groups(field: &str, consumption: &Value, errors: &mut Vec<FieldError>) {
    let field = format!("{field}.compatibilityGroups");
    let groups = array(consumption, "compatibilityGroups");
    if let Some(error) = too_many(&field, groups.len(), 2) {
        errors.push(error);
        return;
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, group) in groups.iter().enumerate() {
        let item = format!("{field}[{i}]");
        let text = group.as_str().unwrap_or_default();
        if let Err(reason) = NameRule::DnsLabel.check(text) {
            errors.push(FieldError::invalid(&item, group, reason));
        }
        if !seen.insert(text) {
            errors.push(duplicate(&item, text));
        }
    }
}

/// A device's `nodeAllocatableResources` (1.37 shape, `DRANodeAllocatableResources`), as
/// kube-apiserver 1.37 `validateNodeAllocatableResources` and the fields' declarative tags
/// check them. Keys: `cpu`, `memory`, `ephemeral-storage`, `hugepages-<size>`.
fn validate_node_allocatable_resources(path: &str, device: &Value, errors: &mut Vec<FieldError>) {
    let Some(resources) = device
        .get("nodeAllocatableResources")
        .and_then(Value::as_object)
    else {
        return;
    };
    let capacities = device.get("capacity").and_then(Value::as_object);
    let quantity = |v: &Value| v.as_str().and_then(|q| QuantityValue::parse(q).ok());
    for (name, resource) in resources {
        let field = format!("{path}.nodeAllocatableResources[{name}]");
        let allocatable = matches!(name.as_str(), "cpu" | "memory" | "ephemeral-storage")
            || name
                .strip_prefix("hugepages-")
                .is_some_and(|size| QuantityValue::parse(size).is_ok());
        if !allocatable {
            errors.push(FieldError::invalid(
                &field,
                &Value::from(name.as_str()),
                "must be a node allocatable resource name",
            ));
        }
        let mapping = resource.get("mapping").filter(|v| !v.is_null());
        let overhead = resource.get("overhead").filter(|v| !v.is_null());
        if mapping.is_none() && overhead.is_none() {
            errors.push(FieldError {
                field: field.clone(),
                reason: "FieldValueRequired",
                message: "Required value: at least one of mapping or overhead must be set".into(),
            });
        }
        if let Some(mapping) = mapping {
            let field = format!("{field}.mapping");
            let key = mapping.get("capacityKey").filter(|v| !v.is_null());
            let capacity_multiplier = mapping.get("capacityMultiplier").filter(|v| !v.is_null());
            let device_multiplier = mapping.get("deviceMultiplier").filter(|v| !v.is_null());
            if key.is_some() == device_multiplier.is_some() {
                errors.push(FieldError::invalid(
                    &field,
                    mapping,
                    "exactly one of `capacityKey` or `deviceMultiplier` is required",
                ));
            }
            if let Some(key) = key {
                let text = key.as_str().unwrap_or_default();
                if !capacities.is_some_and(|c| c.contains_key(text)) {
                    errors.push(FieldError {
                        field: format!("{field}.capacityKey"),
                        reason: "FieldValueNotFound",
                        message: format!("Not found: {key}"),
                    });
                }
                match capacity_multiplier {
                    None => {
                        errors.push(FieldError::required(&format!("{field}.capacityMultiplier")))
                    }
                    Some(m) if quantity(m).is_none_or(|q| q.sign() <= 0) => {
                        errors.push(FieldError::invalid(
                            &format!("{field}.capacityMultiplier"),
                            m,
                            "must be positive",
                        ));
                    }
                    Some(_) => {}
                }
            } else if capacity_multiplier.is_some() {
                errors.push(FieldError::required(&format!("{field}.capacityKey")));
            }
            if let Some(m) = device_multiplier
                && quantity(m).is_none_or(|q| q.sign() <= 0)
            {
                errors.push(FieldError::invalid(
                    &format!("{field}.deviceMultiplier"),
                    m,
                    "must be positive",
                ));
            }
        }
        if let Some(overhead) = overhead {
            let field = format!("{field}.overhead");
            let per_pod = overhead.get("perPod").filter(|v| !v.is_null());
            let per_container = overhead.get("perContainer").filter(|v| !v.is_null());
            if per_pod.is_none() && per_container.is_none() {
                errors.push(FieldError::invalid(
                    &field,
                    &Value::from(""),
                    "at least one of perPod or perContainer must be set",
                ));
            }
            for (key, value) in [("perPod", per_pod), ("perContainer", per_container)] {
                if let Some(value) = value
                    && quantity(value).is_none_or(|q| q.sign() < 0)
                {
                    errors.push(FieldError::invalid(
                        &format!("{field}.{key}"),
                        value,
                        "must be non-negative",
                    ));
                }
            }
        }
    }
}

/// `spec.sharedCounters`: at most 8 sets with DNS-label names, unique, each with 1 to 32
/// counters whose names are DNS labels.
fn validate_shared_counters(obj: &Value, limits: &SliceLimits, errors: &mut Vec<FieldError>) {
    let sets = array(obj, "spec.sharedCounters");
    errors.extend(too_many(
        "spec.sharedCounters",
        sets.len(),
        limits.max_counter_sets_per_slice,
    ));
    let mut seen = std::collections::BTreeSet::new();
    for (i, set) in sets.iter().enumerate() {
        let field = format!("spec.sharedCounters[{i}]");
        let name = set.get("name").and_then(Value::as_str).unwrap_or_default();
        if let Err(reason) = NameRule::DnsLabel.check(name) {
            errors.push(FieldError::invalid(
                &format!("{field}.name"),
                &Value::from(name),
                reason,
            ));
        }
        if !seen.insert(name) {
            errors.push(duplicate(&field, name));
        }
        let counters = object_keys(set, "counters");
        let counters_field = format!("{field}.counters");
        if counters.is_empty() {
            errors.push(FieldError::required(&counters_field));
        }
        errors.extend(too_many(
            &counters_field,
            counters.len(),
            limits.max_counters_per_set,
        ));
        for counter in counters {
            if let Err(reason) = NameRule::DnsLabel.check(counter) {
                errors.push(FieldError::invalid(
                    &counters_field,
                    &Value::from(counter),
                    reason,
                ));
            }
        }
    }
}

/// The `status.devices` rules of a real 1.36 server (KEP-4817): every entry names an allocated
/// device of the claim (driver, pool, device, share ID), at most 8 conditions, `data` of at most
/// 10 KiB of JSON, at most 16 IPs, an interface name of at most 256 and a hardware address of at
/// most 128 characters. Messages follow the real server's where it was observed.
fn validate_resource_claim(obj: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let Some(devices) = lookup(obj, "status.devices").and_then(Value::as_array) else {
        return errors;
    };
    let key = |v: &Value| {
        ["driver", "pool", "device", "shareID"].map(|k| {
            v.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        })
    };
    let allocated: Vec<[String; 4]> = lookup(obj, "status.allocation.devices.results")
        .and_then(Value::as_array)
        .map(|results| results.iter().map(key).collect())
        .unwrap_or_default();
    for (i, device) in devices.iter().enumerate() {
        let field = format!("status.devices[{i}]");
        let [driver, pool, name, share] = key(device);
        if !allocated.contains(&key(device)) {
            errors.push(FieldError::invalid(
                &field,
                &serde_json::json!({"Driver": driver, "Pool": pool, "Device": name, "ShareID": share}),
                "must be an allocated device in the claim",
            ));
        }
        let count = |path: &str| {
            lookup(device, path)
                .and_then(Value::as_array)
                .map_or(0, Vec::len)
        };
        let length = |path: &str| {
            lookup(device, path)
                .and_then(Value::as_str)
                .map_or(0, |s| s.chars().count())
        };
        let mut too_many = |path: &str, n: usize, max: usize| {
            if n > max {
                errors.push(FieldError {
                    field: format!("{field}.{path}"),
                    reason: "FieldValueTooMany",
                    message: format!("Too many: {n}: must have at most {max} items"),
                });
            }
        };
        too_many("conditions", count("conditions"), 8);
        too_many("networkData.ips", count("networkData.ips"), 16);
        for (path, max) in [
            ("networkData.interfaceName", 256),
            ("networkData.hardwareAddress", 128),
        ] {
            if length(path) > max {
                errors.push(FieldError {
                    field: format!("{field}.{path}"),
                    reason: "FieldValueTooLong",
                    message: format!("Too long: may not be more than {max} bytes"),
                });
            }
        }
        if let Some(data) = device.get("data")
            && serde_json::to_vec(data).map_or(0, |d| d.len()) > 10 * 1024
        {
            errors.push(FieldError {
                field: format!("{field}.data"),
                reason: "FieldValueTooLong",
                message: "Too long: may not be more than 10240 bytes".into(),
            });
        }
    }
    errors
}

/// Scalar and (1.36, `DRAListTypeAttributes`) list value fields of a `DeviceAttribute`.
const SCALAR_VALUES: [&str; 4] = ["int", "bool", "string", "version"];
const LIST_VALUES: [&str; 4] = ["ints", "bools", "strings", "versions"];
/// Longest string or version value, and most attribute values per device (list elements
/// counted), as in 1.36.
const MAX_VALUE_LENGTH: usize = 64;
const MAX_ATTRIBUTE_VALUES: usize = 48;

/// Whether any attribute of `device` carries a list value (which lowers the per-slice device
/// limit to 64 in 1.36).
fn has_list_attribute(device: &Value) -> bool {
    lookup(device, "attributes")
        .and_then(Value::as_object)
        .is_some_and(|attributes| {
            attributes.values().any(|a| {
                LIST_VALUES
                    .iter()
                    .any(|kind| lookup(a, kind).is_some_and(|v| !v.is_null()))
            })
        })
}

/// The attribute rules of 1.36 `validateDeviceAttribute`: exactly one value per attribute (an
/// attribute whose list value a disabled `DRAListTypeAttributes` dropped has none, so the real
/// server rejects it), non-empty lists, string and version elements of at most 64 characters,
/// at most 48 values per device. Messages are close to, not byte-equal with, the real ones.
fn validate_device_attributes(path: &str, device: &Value, errors: &mut Vec<FieldError>) {
    let Some(attributes) = lookup(device, "attributes").and_then(Value::as_object) else {
        return;
    };
    let mut values = 0;
    for (name, attribute) in attributes {
        let field = format!("{path}.attributes[{name}]");
        let set = |kind: &str| lookup(attribute, kind).is_some_and(|v| !v.is_null());
        let scalars = SCALAR_VALUES.iter().filter(|kind| set(kind)).count();
        let lists: Vec<&str> = LIST_VALUES
            .iter()
            .copied()
            .filter(|kind| set(kind))
            .collect();
        match scalars + lists.len() {
            0 => errors.push(FieldError::invalid(
                &field,
                &Value::String(String::new()),
                "exactly one value must be specified",
            )),
            1 => {}
            _ => errors.push(FieldError::invalid(
                &field,
                attribute,
                "exactly one value must be specified",
            )),
        }
        values += scalars;
        for kind in ["string", "version"] {
            if let Some(text) = lookup(attribute, kind).and_then(Value::as_str)
                && text.chars().count() > MAX_VALUE_LENGTH
            {
                errors.push(too_long(&format!("{field}.{kind}")));
            }
        }
        for kind in lists {
            let list_field = format!("{field}.{kind}");
            let Some(items) = lookup(attribute, kind).and_then(Value::as_array) else {
                errors.push(FieldError::invalid(
                    &list_field,
                    lookup(attribute, kind).unwrap_or(&Value::Null),
                    "must be a list",
                ));
                continue;
            };
            if items.is_empty() {
                errors.push(FieldError::required(&list_field));
            }
            values += items.len();
            for (i, item) in items.iter().enumerate() {
                if item
                    .as_str()
                    .is_some_and(|t| t.chars().count() > MAX_VALUE_LENGTH)
                {
                    errors.push(too_long(&format!("{list_field}[{i}]")));
                }
            }
        }
    }
    if values > MAX_ATTRIBUTE_VALUES {
        errors.push(FieldError::invalid(
            &format!("{path}.attributes"),
            &Value::from(values),
            &format!("the total number of attribute values must not exceed {MAX_ATTRIBUTE_VALUES}"),
        ));
    }
}

fn too_long(field: &str) -> FieldError {
    FieldError {
        field: field.to_owned(),
        reason: "FieldValueTooLong",
        message: format!("Too long: may not be more than {MAX_VALUE_LENGTH} bytes"),
    }
}

/// The API server's checks of an Event written through `events.k8s.io/v1`
/// (`ValidateEventCreate`'s strict part): what it requires, the length limits (bytes, as Go's
/// `len`), and the deprecated core fields left unset.
fn validate_event(obj: &Value) -> Vec<FieldError> {
    const SHORT_LIMIT: usize = 128;
    const NOTE_LIMIT: usize = 1024;
    let mut errors = Vec::new();
    let text = |path: &str| {
        lookup(obj, path)
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    if text("eventTime").is_empty() {
        errors.push(FieldError::required("eventTime"));
    }
    let kind = text("type");
    if kind != "Normal" && kind != "Warning" {
        errors.push(FieldError::invalid(
            "type",
            &Value::from(kind),
            "has invalid value",
        ));
    }
    let controller = text("reportingController");
    if controller.is_empty() {
        errors.push(FieldError::required("reportingController"));
    } else if !is_qualified_name(controller) {
        errors.push(FieldError::invalid(
            "reportingController",
            &Value::from(controller),
            "must be a qualified name: an optional DNS subdomain prefix and '/', then at most 63 alphanumeric characters, '-', '_' or '.', starting and ending with an alphanumeric character",
        ));
    }
    for field in ["reportingInstance", "action", "reason"] {
        let value = text(field);
        if value.is_empty() {
            errors.push(FieldError::required(field));
        } else if value.len() > SHORT_LIMIT {
            errors.push(FieldError::invalid(
                field,
                &Value::from(""),
                &format!("can have at most {SHORT_LIMIT} characters"),
            ));
        }
    }
    if text("note").len() > NOTE_LIMIT {
        errors.push(FieldError::invalid(
            "note",
            &Value::from(""),
            &format!("can have at most {NOTE_LIMIT} characters"),
        ));
    }
    let namespace = text("metadata.namespace");
    if text("regarding.namespace").is_empty()
        && namespace != "default"
        && namespace != "kube-system"
    {
        errors.push(FieldError::invalid(
            "regarding.namespace",
            &Value::from(""),
            "does not match event.namespace",
        ));
    }
    if let Some(series) = lookup(obj, "series").filter(|s| !s.is_null()) {
        if series.get("count").and_then(Value::as_i64).unwrap_or(0) < 2 {
            errors.push(FieldError::invalid(
                "series.count",
                &Value::from(""),
                "should be at least 2",
            ));
        }
        if series
            .get("lastObservedTime")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            errors.push(FieldError::required("series.lastObservedTime"));
        }
    }
    for field in [
        "deprecatedCount",
        "deprecatedFirstTimestamp",
        "deprecatedLastTimestamp",
        "deprecatedSource",
    ] {
        if lookup(obj, field).is_some_and(|v| !v.is_null()) {
            errors.push(FieldError::invalid(
                field,
                &Value::from(""),
                "needs to be unset",
            ));
        }
    }
    errors
}

/// A Kubernetes qualified name: `[prefix/]name`, the prefix a DNS subdomain, the name at most
/// 63 characters of alphanumerics, '-', '_' and '.', alphanumeric at both ends.
fn is_qualified_name(value: &str) -> bool {
    let (prefix, name) = match value.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, value),
    };
    if prefix.is_some_and(|p| !super::object::is_dns_subdomain(p)) {
        return false;
    }
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Namespace names are DNS labels, stricter than the subdomain rule applied to other kinds.
fn validate_namespace(obj: &Value) -> Vec<FieldError> {
    match lookup(obj, "metadata.name").and_then(Value::as_str) {
        Some(name) if !super::object::is_dns_label(name) => vec![FieldError::invalid(
            "metadata.name",
            &Value::from(name),
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
        )],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn slice(spec: Value) -> Value {
        json!({"metadata": {"name": "s"}, "spec": spec})
    }

    fn fields_of(spec: Value) -> Vec<String> {
        validate_resource_slice(&slice(spec))
            .into_iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect()
    }

    fn base(extra: Value) -> Value {
        let mut spec = json!({
            "driver": "gpu.example.com", "nodeName": "n1",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
        });
        if let (Some(spec), Value::Object(extra)) = (spec.as_object_mut(), extra) {
            spec.extend(extra);
        }
        spec
    }

    #[test]
    fn partition_type_attribute_as_1_37_validates_it() {
        let consumer = |attributes: Value| {
            json!({"name": "p", "attributes": attributes,
                   "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": "1Gi"}}}]})
        };
        let ok = base(json!({
            "partitionTypeAttribute": "gpu.example.com/profile",
            "devices": [consumer(json!({"profile": {"string": "1g"}})), {"name": "plain"}],
        }));
        assert_eq!(fields_of(ok), Vec::<String>::new());
        let no_consumers = base(json!({
            "partitionTypeAttribute": "gpu.example.com/profile",
            "devices": [{"name": "plain"}],
        }));
        assert_eq!(
            fields_of(no_consumers),
            [
                r#"spec.partitionTypeAttribute: Invalid value: "gpu.example.com/profile": may only be set on a slice which declares devices that consume counters"#
            ]
        );
        let wrong = base(json!({
            "partitionTypeAttribute": "gpu.example.com/profile",
            "devices": [consumer(json!({"gpu.example.com/profile": {"int": 1}})), {
                "name": "q",
                "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": "1Gi"}}}],
            }],
        }));
        let errors = fields_of(wrong);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(
            errors[0]
                .starts_with("spec.devices[0].attributes[gpu.example.com/profile]: Invalid value")
        );
        assert!(
            errors[1]
                .starts_with("spec.devices[1].attributes[gpu.example.com/profile]: Required value")
        );
    }

    #[test]
    fn skip_node_operations_as_1_37_validates_them() {
        let ops = |ops: Value| fields_of(base(json!({"skipNodeOperations": ops})));
        assert!(ops(json!(["NodePrepareResources", "NodeUnprepareResources"])).is_empty());
        assert!(ops(json!(["*"])).is_empty());
        assert!(ops(json!(["NodeUnprepareResources"])).is_empty());
        assert_eq!(
            ops(json!(["NodePrepareResources"])),
            [
                r#"spec.skipNodeOperations: Invalid value: ["NodePrepareResources"]: NodePrepareResources cannot be skipped unless NodeUnprepareResources is also skipped"#
            ]
        );
        assert_eq!(ops(json!(["Other"])).len(), 1);
        assert_eq!(ops(json!(["*", "*"])).len(), 1);
    }

    #[test]
    fn compatibility_groups_and_node_allocatable_as_1_37_validates_them() {
        let device = |device: Value| fields_of(base(json!({"devices": [device]})));
        let groups = |groups: Value| {
            device(
                json!({"name": "p", "consumesCounters": [{"counterSet": "gpu-0",
                "counters": {"memory": {"value": "1Gi"}}, "compatibilityGroups": groups}]}),
            )
        };
        assert!(groups(json!(["mig", "mps"])).is_empty());
        assert_eq!(groups(json!(["a", "b", "c"])).len(), 1);
        assert_eq!(groups(json!(["a", "a"])).len(), 1);
        assert_eq!(groups(json!(["A_1"])).len(), 1);

        let allocatable = |resources: Value| {
            device(json!({"name": "d", "capacity": {"cores": {"value": "8"}},
                          "nodeAllocatableResources": resources}))
        };
        assert!(
            allocatable(json!({
                "cpu": {"mapping": {"capacityKey": "cores", "capacityMultiplier": "2"}},
                "memory": {"overhead": {"perPod": "1Gi"}},
                "hugepages-2Mi": {"mapping": {"deviceMultiplier": "2Mi"}},
            }))
            .is_empty()
        );
        for bad in [
            json!({"example.com/x": {"mapping": {"deviceMultiplier": "1"}}}),
            json!({"cpu": {}}),
            json!({"cpu": {"mapping": {"capacityKey": "threads", "capacityMultiplier": "1"}}}),
            json!({"cpu": {"mapping": {"capacityKey": "cores"}}}),
            json!({"cpu": {"mapping": {"deviceMultiplier": "0"}}}),
            json!({"memory": {"overhead": {"perPod": "-1"}}}),
            json!({"memory": {"overhead": {}}}),
        ] {
            assert_eq!(
                allocatable(bad.clone()).len(),
                1,
                "{bad}: {:?}",
                allocatable(bad.clone())
            );
        }
    }

    #[test]
    fn valid_slice_passes() {
        let obj = slice(json!({
            "driver": "gpu.example.com", "nodeName": "n1",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}, {"name": "gpu-1"}],
        }));
        assert!(validate_resource_slice(&obj).is_empty());
    }

    #[test]
    fn slice_errors_name_the_field() {
        let obj = slice(json!({
            "pool": {"name": "p", "generation": 0, "resourceSliceCount": 0},
            "devices": [{"name": "a"}, {"name": "a"}],
        }));
        let fields: Vec<_> = validate_resource_slice(&obj)
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert_eq!(
            fields,
            [
                "spec.driver",
                "spec.pool.resourceSliceCount",
                "spec",
                // Recorded: the real server names the duplicate entry, not its name.
                "spec.devices[1]"
            ]
        );
    }

    fn with_devices(devices: Vec<Value>) -> Value {
        slice(json!({
            "driver": "gpu.example.com", "nodeName": "n1",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        }))
    }

    fn fields(obj: &Value) -> Vec<String> {
        validate_resource_slice(obj)
            .into_iter()
            .map(|e| e.field)
            .collect()
    }

    #[test]
    fn attributes_hold_exactly_one_value() {
        let obj = with_devices(vec![json!({"name": "a", "attributes": {
            "ok": {"int": 1},
            "vlans": {"ints": [1, 2]},
            "dropped": {},
            "both": {"int": 1, "ints": [1]},
            "empty": {"strings": []},
            "long": {"strings": ["x", "y".repeat(65)]},
            "longer": {"version": format!("1.0.0+{}", "a".repeat(60))},
        }})]);
        assert_eq!(
            fields(&obj),
            [
                "spec.devices[0].attributes[both]",
                "spec.devices[0].attributes[dropped]",
                "spec.devices[0].attributes[empty].strings",
                "spec.devices[0].attributes[long].strings[1]",
                "spec.devices[0].attributes[longer].version",
            ]
        );
        let errors = validate_resource_slice(&obj);
        assert!(
            errors[1]
                .message
                .contains("exactly one value must be specified")
        );
    }

    #[test]
    fn attribute_values_per_device_count_list_elements() {
        let attributes = |n: i64| {
            json!({"name": "a", "attributes": {
                "list": {"ints": (0..n).collect::<Vec<_>>()},
                "one": {"bool": true},
            }})
        };
        assert!(fields(&with_devices(vec![attributes(47)])).is_empty());
        assert_eq!(
            fields(&with_devices(vec![attributes(48)])),
            ["spec.devices[0].attributes"]
        );
    }

    #[test]
    fn list_attributes_lower_the_device_limit_to_64() {
        let devices = |list: bool| {
            (0..65)
                .map(|i| {
                    let value = if list && i == 0 {
                        json!({"ints": [1]})
                    } else {
                        json!({"int": 1})
                    };
                    json!({"name": format!("d{i}"), "attributes": {"a": value}})
                })
                .collect::<Vec<_>>()
        };
        assert!(fields(&with_devices(devices(false))).is_empty());
        assert_eq!(fields(&with_devices(devices(true))), ["spec.devices"]);
    }

    /// Rules added from the API server recordings (`tests/recordings_apiserver.rs` replays
    /// them all); each field is the one the real server named.
    #[test]
    fn device_rules_follow_the_recordings() {
        let device = json!({
            "name": "GPU_0",
            "attributes": {"my-attr": {"int": 1}, "v": {"version": "1.2"}},
            "capacity": {"Mem-ory": {"value": "1"}},
            "taints": [{"key": "bad key", "effect": "NoSchedule"}, {"key": "k", "effect": "PreferNoSchedule"}, {"key": "k2"}],
            "bindingConditions": ["example.com/ready"],
            "consumesCounters": [{"counterSet": "s", "counters": {"c": {"value": "1"}}}, {"counterSet": "s", "counters": {"c": {"value": "1"}}}],
            "nodeName": "n1",
        });
        assert_eq!(
            fields(&with_devices(vec![device])),
            [
                "spec.devices[0].attributes",
                "spec.devices[0].capacity",
                "spec.devices[0].attributes[v].version",
                "spec.devices[0].taints[0].key",
                "spec.devices[0].taints[1].effect",
                "spec.devices[0].taints[2].effect",
                "spec.devices[0].bindingFailureConditions",
                "spec.devices[0].consumesCounters[1]",
                "spec.devices[0]",
                "spec.devices[0].name",
            ]
        );
    }

    #[test]
    fn v1beta1_devices_are_read_inside_basic() {
        let devices: Vec<Value> = (0..65)
            .map(|i| {
                let mut basic = json!({});
                if i == 0 {
                    basic = json!({"consumesCounters": [{"counterSet": "s", "counters": {"c": {"value": "1"}}}]});
                }
                json!({"name": format!("d{i}"), "basic": basic})
            })
            .collect();
        assert_eq!(fields(&with_devices(devices)), ["spec.devices"]);
    }

    #[test]
    fn shared_counter_rules() {
        let obj = slice(json!({
            "driver": "gpu.example.com", "nodeName": "n1",
            "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
            "sharedCounters": [
                {"name": "Set_0", "counters": {"Mem_ory": {"value": "1"}}},
                {"name": "s", "counters": {}},
                {"name": "s", "counters": {"c": {"value": "1"}}},
            ],
        }));
        assert_eq!(
            fields(&obj),
            [
                "spec.sharedCounters[0].name",
                "spec.sharedCounters[0].counters",
                "spec.sharedCounters[1].counters",
                "spec.sharedCounters[2]",
            ]
        );
    }

    #[test]
    fn node_selection_is_one_of() {
        let obj = slice(json!({
            "driver": "d", "nodeName": "n", "allNodes": true,
            "pool": {"name": "p", "generation": 0, "resourceSliceCount": 1},
        }));
        assert_eq!(validate_resource_slice(&obj).len(), 1);
    }

    #[test]
    fn events_follow_the_strict_events_k8s_io_v1_rules() {
        let valid = json!({
            "metadata": {"name": "gpu.17979cfe362a0000", "namespace": "team-a"},
            "eventTime": "2026-12-02T01:00:00.000000Z",
            "type": "Warning",
            "reason": "PrepareFailed",
            "action": "Prepare",
            "note": "bad config",
            "reportingController": "gpu.example.com",
            "reportingInstance": "gpu.example.com-node-a",
            "regarding": {"kind": "ResourceClaim", "namespace": "team-a", "name": "gpu"},
        });
        assert!(validate_event(&valid).is_empty());
        let fields = |obj: &Value| -> Vec<String> {
            validate_event(obj).into_iter().map(|e| e.field).collect()
        };
        let mut broken = valid.clone();
        broken["reason"] = json!("");
        broken["note"] = json!("x".repeat(1025));
        broken["reportingInstance"] = json!("i".repeat(129));
        broken["type"] = json!("Error");
        broken["reportingController"] = json!("not a name");
        broken["series"] = json!({"count": 1});
        broken["deprecatedCount"] = json!(3);
        assert_eq!(
            fields(&broken),
            [
                "type",
                "reportingController",
                "reportingInstance",
                "reason",
                "note",
                "series.count",
                "series.lastObservedTime",
                "deprecatedCount"
            ]
        );
        let mut series = valid.clone();
        series["series"] = json!({"count": 2, "lastObservedTime": "2026-12-02T01:00:05.000000Z"});
        assert!(validate_event(&series).is_empty());
        let mut no_time = valid;
        no_time.as_object_mut().unwrap().remove("eventTime");
        assert_eq!(fields(&no_time), ["eventTime"]);
    }

    #[test]
    fn names_and_verbs() {
        let rt = ResourceType::NODES;
        assert_eq!(rt.api_version(), "v1");
        assert_eq!(rt.qualified_resource(), "nodes");
        assert_eq!(
            ResourceType::RESOURCE_SLICES.qualified_kind(),
            "ResourceSlice.resource.k8s.io"
        );
        assert_eq!(ResourceType::RESOURCE_CLAIMS.singular(), "resourceclaim");
        assert!(
            !ResourceType::NAMESPACES
                .verbs()
                .contains(&"deletecollection")
        );
        assert!(ResourceType::RESOURCE_SLICES.supports_field("spec.driver"));
        assert!(!ResourceType::RESOURCE_CLAIMS.supports_field("spec.driver"));
    }
}
