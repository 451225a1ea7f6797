//! The table of resource kinds the fake server serves, and what makes each kind special.
//!
//! Everything kind-specific lives here as data (scope, status handling, field selectors, immutable
//! fields, a light validator), so serving another kind is one more constant.

use serde_json::Value;

use super::object::{FieldError, lookup};

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
/// use dra_sdk::testing::apiserver::ResourceType;
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
}

impl ResourceType {
    /// `resource.k8s.io/v1` ResourceClaims: namespaced, `/status` subresource, immutable spec.
    pub const RESOURCE_CLAIMS: Self =
        Self::new("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim")
            .in_namespaces()
            .status_subresource(true)
            .immutable(&["spec"]);
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

    /// The kinds served by default: ResourceClaims, ResourceClaimTemplates, ResourceSlices,
    /// DeviceClasses (all `resource.k8s.io/v1`), and core Nodes, Pods and Namespaces.
    pub fn defaults() -> Vec<Self> {
        vec![
            Self::RESOURCE_CLAIMS,
            Self::RESOURCE_CLAIM_TEMPLATES,
            Self::RESOURCE_SLICES,
            Self::DEVICE_CLASSES,
            Self::NODES,
            Self::PODS,
            Self::NAMESPACES,
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
    if lookup(obj, "spec.pool.name")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        errors.push(FieldError::required("spec.pool.name"));
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
        let advanced = devices.iter().any(|d| {
            lookup(d, "taints").is_some_and(|t| t.as_array().is_some_and(|a| !a.is_empty()))
                || lookup(d, "consumesCounters")
                    .is_some_and(|t| t.as_array().is_some_and(|a| !a.is_empty()))
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
        let mut seen = std::collections::BTreeSet::new();
        for (index, device) in devices.iter().enumerate() {
            match lookup(device, "name").and_then(Value::as_str) {
                None | Some("") => {
                    errors.push(FieldError::required(&format!("spec.devices[{index}].name")))
                }
                Some(name) => {
                    if !seen.insert(name) {
                        errors.push(FieldError {
                            field: format!("spec.devices[{index}].name"),
                            reason: "FieldValueDuplicate",
                            message: format!("Duplicate value: \"{name}\""),
                        });
                    }
                }
            }
        }
    }
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
                "spec.devices[1].name"
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
