//! JSON object plumbing: metadata access, names, timestamps, merge patches and field dropping.

use serde_json::{Map, Value};

/// A field-level validation failure, rendered into `Status.details.causes` like the real server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FieldError {
    pub(crate) field: String,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

impl FieldError {
    pub(crate) fn required(field: &str) -> Self {
        Self {
            field: field.to_string(),
            reason: "FieldValueRequired",
            message: "Required value".into(),
        }
    }

    pub(crate) fn invalid(field: &str, value: &Value, detail: &str) -> Self {
        Self {
            field: field.to_string(),
            reason: "FieldValueInvalid",
            message: format!("Invalid value: {value}: {detail}"),
        }
    }

    pub(crate) fn immutable(field: &str, value: &Value) -> Self {
        Self::invalid(field, value, "field is immutable")
    }
}

/// Follows a dot-separated path through nested objects (`spec.pool.name`).
pub(crate) fn lookup<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(value, |current, key| current.as_object()?.get(key))
}

/// A field value as a field selector sees it: strings as-is, booleans and numbers printed,
/// missing fields as the empty string (the Go server reads a nil pointer as "").
pub(crate) fn field_value(value: &Value, path: &str) -> String {
    match lookup(value, path) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

/// RFC 1123 subdomain: what most object names must be.
pub(crate) fn is_dns_subdomain(name: &str) -> bool {
    dra_sdk::k8s::NameRule::DnsSubdomain.check(name).is_ok()
}

/// RFC 1123 label (namespace names).
pub(crate) fn is_dns_label(name: &str) -> bool {
    dra_sdk::k8s::NameRule::DnsLabel.check(name).is_ok()
}

/// Current time as `metav1.Time` (RFC 3339, whole seconds, UTC).
pub(crate) fn now_timestamp() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// A random RFC 4122 version-4 UID.
pub(crate) fn new_uid() -> String {
    uuid::Builder::from_random_bytes(fastrand::u128(..).to_be_bytes())
        .into_uuid()
        .to_string()
}

/// The five-character suffix `generateName` gets (same alphabet as the Go server: no vowels, no
/// look-alike digits).
pub(crate) fn generated_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| char::from(ALPHABET[fastrand::usize(..ALPHABET.len())]))
        .collect()
}

/// An object taken apart: `metadata`, the type fields, and everything else.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Obj {
    pub(crate) meta: Map<String, Value>,
    /// Top-level fields other than `metadata`, `apiVersion` and `kind`.
    pub(crate) body: Map<String, Value>,
    pub(crate) api_version: Option<String>,
    pub(crate) kind: Option<String>,
}

impl Obj {
    /// Splits a JSON value; fails (with a message for a 400) when it is not an object or its
    /// `metadata`, `apiVersion` or `kind` have the wrong JSON type.
    pub(crate) fn from_value(value: Value) -> Result<Self, String> {
        let Value::Object(mut body) = value else {
            return Err("the request body must be a JSON object".into());
        };
        let meta = match body.remove("metadata") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(meta)) => meta,
            Some(_) => return Err("metadata must be a JSON object".into()),
        };
        let mut type_field = |name: &str| match body.remove(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(format!("{name} must be a string")),
        };
        let api_version = type_field("apiVersion")?;
        let kind = type_field("kind")?;
        Ok(Self {
            meta,
            body,
            api_version,
            kind,
        })
    }

    pub(crate) fn meta_str(&self, key: &str) -> Option<&str> {
        self.meta
            .get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    }

    pub(crate) fn name(&self) -> Option<&str> {
        self.meta_str("name")
    }

    pub(crate) fn resource_version(&self) -> Option<&str> {
        self.meta_str("resourceVersion")
    }

    pub(crate) fn set_meta(&mut self, key: &str, value: impl Into<Value>) {
        self.meta.insert(key.to_string(), value.into());
    }

    /// Copies `key` from `other`'s metadata, removing it here when `other` lacks it.
    pub(crate) fn copy_meta_from(&mut self, other: &Obj, key: &str) {
        match other.meta.get(key) {
            Some(value) => self.meta.insert(key.to_string(), value.clone()),
            None => self.meta.remove(key),
        };
    }

    /// Copies the top-level `key` (e.g. `status`) from `other`, removing it when `other` lacks it.
    pub(crate) fn copy_field_from(&mut self, other: &Obj, key: &str) {
        match other.body.get(key) {
            Some(value) => self.body.insert(key.to_string(), value.clone()),
            None => self.body.remove(key),
        };
    }

    pub(crate) fn finalizers_empty(&self) -> bool {
        self.meta
            .get("finalizers")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
    }

    /// The stored form: metadata plus body, without `apiVersion`/`kind` (stamped per request).
    pub(crate) fn into_value(self) -> Value {
        let mut out = self.body;
        out.insert("metadata".into(), Value::Object(self.meta));
        Value::Object(out)
    }
}

/// A stored object with `apiVersion` and `kind` added, as single-object responses and watch events
/// carry them.
pub(crate) fn with_type_meta(stored: &Value, api_version: &str, kind: &str) -> Value {
    let mut out = Map::new();
    out.insert("apiVersion".into(), Value::from(api_version));
    out.insert("kind".into(), Value::from(kind));
    if let Value::Object(map) = stored {
        out.extend(map.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    Value::Object(out)
}

/// The `PartialObjectMetadata` view of a stored object (metadata-only clients such as
/// `kube::runtime::metadata_watcher`).
pub(crate) fn partial_metadata(stored: &Value) -> Value {
    serde_json::json!({
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadata",
        "metadata": stored.get("metadata").cloned().unwrap_or_else(|| Value::Object(Map::new())),
    })
}

/// RFC 7386 JSON merge patch: objects merge recursively, `null` deletes, anything else replaces.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch_map) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(target_map) = target {
        for (key, value) in patch_map {
            if value.is_null() {
                target_map.remove(key);
            } else {
                merge_patch(target_map.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

/// The merge patch that moves a manager's previous applied configuration to its new one: the new
/// configuration plus `null` for every field the manager applied before and dropped now.
///
/// This is the fake's stand-in for server-side apply field ownership: a manager removes fields it
/// stops applying, and lists replace wholesale (as atomic lists do).
pub(crate) fn apply_patch(previous: Option<&Value>, applied: &Value) -> Value {
    match (previous, applied) {
        (Some(Value::Object(previous)), Value::Object(applied)) => {
            let mut patch = Map::new();
            for (key, value) in applied {
                patch.insert(key.clone(), apply_patch(previous.get(key), value));
            }
            for key in previous.keys() {
                if !applied.contains_key(key) {
                    patch.insert(key.clone(), Value::Null);
                }
            }
            Value::Object(patch)
        }
        _ => applied.clone(),
    }
}

/// Removes the field at `path` everywhere it occurs. Path syntax: dot-separated keys, `name[]` to
/// descend into every element of the array `name`, `*` for every key of an object; e.g.
/// `spec.devices[].capacity.*.requestPolicy`.
pub(crate) fn remove_path(value: &mut Value, path: &str) {
    let segments: Vec<&str> = path.split('.').filter(|s| !s.is_empty()).collect();
    remove_segments(value, &segments);
}

fn remove_segments(value: &mut Value, segments: &[&str]) {
    let Some((first, rest)) = segments.split_first() else {
        return;
    };
    let Value::Object(map) = value else {
        return;
    };
    let (key, each) = match first.strip_suffix("[]") {
        Some(key) => (key, true),
        None => (*first, false),
    };
    let keys: Vec<String> = if key == "*" {
        map.keys().cloned().collect()
    } else {
        vec![key.to_string()]
    };
    for key in keys {
        if rest.is_empty() {
            map.remove(&key);
            continue;
        }
        match map.get_mut(&key) {
            Some(Value::Array(items)) if each => {
                items
                    .iter_mut()
                    .for_each(|item| remove_segments(item, rest));
            }
            Some(child) if !each => remove_segments(child, rest),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn names() {
        assert!(is_dns_subdomain("gpu-0.example.com"));
        assert!(!is_dns_subdomain("Gpu"));
        assert!(!is_dns_subdomain("-a"));
        assert!(!is_dns_subdomain("a..b"));
        assert!(!is_dns_subdomain(""));
        assert!(is_dns_label("kube-system"));
        assert!(!is_dns_label("a.b"));
    }

    #[test]
    fn uid_and_suffix_shapes() {
        let uid = new_uid();
        assert_eq!(uid.len(), 36);
        assert_eq!(uid.as_bytes()[14], b'4');
        assert_eq!(generated_suffix().len(), 5);
        assert!(now_timestamp().ends_with('Z'));
    }

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut doc = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        merge_patch(&mut doc, &json!({"a": "z", "c": {"f": null}, "l": [3]}));
        assert_eq!(doc, json!({"a": "z", "c": {"d": "e"}, "l": [3]}));
    }

    #[test]
    fn apply_patch_removes_dropped_fields() {
        let previous = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"x": 1}});
        let applied = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"y": 2}});
        let patch = apply_patch(Some(&previous), &applied);
        assert_eq!(
            patch,
            json!({"metadata": {"labels": {"a": "1", "b": null}}, "spec": {"x": null, "y": 2}})
        );
        assert_eq!(apply_patch(None, &applied), applied);
    }

    #[test]
    fn remove_path_walks_arrays_and_maps() {
        let mut doc = json!({"spec": {
            "sharedCounters": [],
            "devices": [
                {"name": "a", "taints": [{}], "capacity": {"mem": {"value": "1", "requestPolicy": {}}}},
                {"name": "b"},
            ],
        }});
        remove_path(&mut doc, "spec.devices[].taints");
        remove_path(&mut doc, "spec.devices[].capacity.*.requestPolicy");
        remove_path(&mut doc, "spec.sharedCounters");
        remove_path(&mut doc, "spec.missing.deeper");
        assert_eq!(
            doc,
            json!({"spec": {"devices": [{"name": "a", "capacity": {"mem": {"value": "1"}}}, {"name": "b"}]}})
        );
    }

    #[test]
    fn obj_round_trip_and_rejects() {
        let obj = Obj::from_value(
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}, "spec": {}}),
        )
        .unwrap();
        assert_eq!(obj.name(), Some("n"));
        assert_eq!(obj.kind.as_deref(), Some("Node"));
        assert_eq!(
            obj.into_value(),
            json!({"metadata": {"name": "n"}, "spec": {}})
        );
        assert!(Obj::from_value(json!([1])).is_err());
        assert!(Obj::from_value(json!({"metadata": 3})).is_err());
        assert!(Obj::from_value(json!({"kind": 3})).is_err());
    }

    #[test]
    fn field_values() {
        let doc = json!({"spec": {"nodeName": "n1", "unschedulable": true}});
        assert_eq!(field_value(&doc, "spec.nodeName"), "n1");
        assert_eq!(field_value(&doc, "spec.unschedulable"), "true");
        assert_eq!(field_value(&doc, "spec.driver"), "");
    }
}
