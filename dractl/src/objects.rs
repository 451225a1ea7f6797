//! DRA objects for `dractl explain`, in the `resource.k8s.io/v1` shape: read from the API
//! server through the newest `resource.k8s.io` version it serves (found by discovery), or from
//! YAML or JSON files of any version the SDK supports (`v1`, `v1beta2`, `v1beta1`). Read-only.

use std::path::{Path, PathBuf};

use dra_sdk::advanced::slices::ResourceApiVersion;
use dra_sdk::advanced::{flatten_v1beta1_devices, nest_v1beta1_requests};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, ListParams};
use serde::de::DeserializeOwned;
use serde_json::Value;

const GROUP: &str = "resource.k8s.io";

/// Why objects could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    /// A file or directory could not be read.
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file is neither YAML nor JSON.
    #[error("{path}: not valid YAML or JSON: {message}")]
    Parse { path: PathBuf, message: String },
    /// An object is not what its kind says.
    #[error("{source_name}: {kind} {name}: {message}")]
    Object {
        source_name: String,
        kind: String,
        name: String,
        message: String,
    },
    /// The server serves none of the versions dractl reads.
    #[error(
        "the API server serves {GROUP} in none of v1, v1beta2 and v1beta1 (it serves: {served})"
    )]
    NotServed { served: String },
    /// An API request failed.
    #[error("{action}: {source}")]
    Api {
        action: String,
        #[source]
        source: kube::Error,
    },
}

/// The kinds `dractl explain` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    ResourceSlice,
    DeviceClass,
    ResourceClaim,
    Node,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::ResourceSlice => "ResourceSlice",
            Kind::DeviceClass => "DeviceClass",
            Kind::ResourceClaim => "ResourceClaim",
            Kind::Node => "Node",
        }
    }

    fn plural(self) -> &'static str {
        match self {
            Kind::ResourceSlice => "resourceslices",
            Kind::DeviceClass => "deviceclasses",
            Kind::ResourceClaim => "resourceclaims",
            Kind::Node => "nodes",
        }
    }

    fn api_resource(self, version: ResourceApiVersion) -> ApiResource {
        ApiResource {
            group: GROUP.to_owned(),
            version: version.as_str().to_owned(),
            api_version: format!("{GROUP}/{}", version.as_str()),
            kind: self.name().to_owned(),
            plural: self.plural().to_owned(),
        }
    }
}

/// An object with where it came from, for messages.
#[derive(Clone, Debug)]
pub(crate) struct Object {
    /// `FILE`, `FILE (document N)` or `the API server`.
    pub(crate) source: String,
    /// The object in the v1 shape.
    pub(crate) value: Value,
}

impl Object {
    pub(crate) fn kind(&self) -> &str {
        self.value.get("kind").and_then(Value::as_str).unwrap_or("")
    }

    pub(crate) fn name(&self) -> &str {
        self.value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    pub(crate) fn namespace(&self) -> Option<&str> {
        self.value
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
    }

    /// `namespace/name`, or `name` for cluster-scoped objects.
    pub(crate) fn display_name(&self) -> String {
        match self.namespace() {
            Some(namespace) => format!("{namespace}/{}", self.name()),
            None => self.name().to_owned(),
        }
    }

    /// The object as a k8s-openapi type.
    pub(crate) fn typed<T: DeserializeOwned>(&self) -> Result<T, ReadError> {
        serde_json::from_value(self.value.clone()).map_err(|error| ReadError::Object {
            source_name: self.source.clone(),
            kind: self.kind().to_owned(),
            name: self.display_name(),
            message: error.to_string(),
        })
    }
}

/// The objects of the kinds asked for in these files and directories (the files of a
/// directory ending in `.yaml`, `.yml` or `.json`, in name order; `-` is standard input), in
/// the v1 shape. Each file may hold several documents and `List`s; other kinds are skipped.
pub(crate) fn read_paths(paths: &[PathBuf], kinds: &[Kind]) -> Result<Vec<Object>, ReadError> {
    let mut objects = Vec::new();
    for path in paths {
        for file in files_of(path)? {
            for object in read_file(&file)? {
                if kinds.iter().any(|kind| kind.name() == object.kind()) {
                    objects.push(object);
                }
            }
        }
    }
    Ok(objects)
}

fn files_of(path: &Path) -> Result<Vec<PathBuf>, ReadError> {
    let io = |source| ReadError::Io {
        path: path.to_owned(),
        source,
    };
    if path == Path::new("-") || !path.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).map_err(io)? {
        let file = entry.map_err(io)?.path();
        let wanted = file
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
        if wanted && file.is_file() {
            files.push(file);
        }
    }
    files.sort();
    Ok(files)
}

/// Every object of a file (documents, and the items of `List`s), in the v1 shape.
pub(crate) fn read_file(path: &Path) -> Result<Vec<Object>, ReadError> {
    let io = |source| ReadError::Io {
        path: path.to_owned(),
        source,
    };
    let text = if path == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).map_err(io)?
    } else {
        std::fs::read_to_string(path).map_err(io)?
    };
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(&text).map_err(|error| ReadError::Parse {
            path: path.to_owned(),
            message: error.to_string(),
        })?;
    let several = documents.len() > 1;
    let mut objects = Vec::new();
    for (index, document) in documents.into_iter().enumerate() {
        let source = if several {
            format!("{} (document {})", path.display(), index + 1)
        } else {
            path.display().to_string()
        };
        let items = match document {
            Value::Null => continue,
            Value::Object(mut fields)
                if fields
                    .get("kind")
                    .and_then(Value::as_str)
                    .is_some_and(|kind| kind.ends_with("List")) =>
            {
                match fields.remove("items") {
                    Some(Value::Array(items)) => items,
                    _ => Vec::new(),
                }
            }
            other => vec![other],
        };
        for mut item in items {
            stringify_numbers(&mut item, None);
            let value = to_v1(item).map_err(|(kind, name, message)| ReadError::Object {
                source_name: source.clone(),
                kind,
                name,
                message,
            })?;
            objects.push(Object {
                source: source.clone(),
                value,
            });
        }
    }
    Ok(objects)
}

/// YAML reads `value: 40` as a number and `zone: 1` as an integer; the API takes both as
/// strings (quantities, label values). Turns numbers into strings where strings are meant.
fn stringify_numbers(value: &mut Value, key: Option<&str>) {
    const SCALARS: [&str; 5] = ["value", "default", "min", "max", "step"];
    const LISTS: [&str; 2] = ["validValues", "values"];
    const MAPS: [&str; 4] = ["requests", "consumedCapacity", "labels", "annotations"];
    let to_string = |value: &mut Value| {
        if let Value::Number(number) = value {
            *value = Value::String(number.to_string());
        }
    };
    match value {
        Value::Number(_) if key.is_some_and(|key| SCALARS.contains(&key)) => to_string(value),
        Value::Array(items) => {
            for item in items {
                if key.is_some_and(|key| LISTS.contains(&key)) {
                    to_string(item);
                }
                stringify_numbers(item, None);
            }
        }
        Value::Object(fields) => {
            let map = key.is_some_and(|key| MAPS.contains(&key));
            for (name, field) in fields.iter_mut() {
                if map {
                    to_string(field);
                }
                stringify_numbers(field, Some(name));
            }
        }
        _ => {}
    }
}

/// Converts an object of `resource.k8s.io/v1beta1` or `v1beta2` into the v1 shape (`v1beta2`
/// has it already; `v1beta1` wraps a device's fields in `basic` and has no `exactly` in
/// requests). Other objects are returned as they are. `Err((kind, name, message))`.
pub(crate) fn to_v1(mut value: Value) -> Result<Value, (String, String, String)> {
    let text = |value: &Value, pointer: &str| {
        value
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    let kind = text(&value, "/kind");
    let api_version = text(&value, "/apiVersion");
    let Some(version) = api_version.strip_prefix(&format!("{GROUP}/")) else {
        return Ok(value);
    };
    match version {
        "v1" | "v1beta2" => {}
        "v1beta1" => match kind.as_str() {
            "ResourceSlice" => flatten_v1beta1_devices(&mut value),
            "ResourceClaim" => nest_v1beta1_requests(value.pointer_mut("/spec/devices/requests")),
            "ResourceClaimTemplate" => {
                nest_v1beta1_requests(value.pointer_mut("/spec/spec/devices/requests"));
            }
            _ => {}
        },
        other => {
            return Err((
                kind.clone(),
                text(&value, "/metadata/name"),
                format!("{GROUP}/{other} is not a version dractl reads (v1, v1beta2, v1beta1)"),
            ));
        }
    }
    if let Some(fields) = value.as_object_mut() {
        fields.insert("apiVersion".into(), Value::String(format!("{GROUP}/v1")));
    }
    Ok(value)
}

/// The newest `resource.k8s.io` version the server serves, by discovery.
pub(crate) async fn served_version(client: &kube::Client) -> Result<ResourceApiVersion, ReadError> {
    let groups = client
        .list_api_groups()
        .await
        .map_err(|source| ReadError::Api {
            action: "discovering the API groups".to_owned(),
            source,
        })?;
    let served: Vec<String> = groups
        .groups
        .iter()
        .filter(|group| group.name == GROUP)
        .flat_map(|group| group.versions.iter().map(|v| v.version.clone()))
        .collect();
    ResourceApiVersion::PREFERENCE
        .into_iter()
        .find(|version| served.iter().any(|v| v == version.as_str()))
        .ok_or_else(|| ReadError::NotServed {
            served: if served.is_empty() {
                "nothing".to_owned()
            } else {
                served.join(", ")
            },
        })
}

/// Every object of a `resource.k8s.io` kind in the server, read in `version`, in the v1 shape.
pub(crate) async fn list(
    client: &kube::Client,
    version: ResourceApiVersion,
    kind: Kind,
) -> Result<Vec<Object>, ReadError> {
    let resource = kind.api_resource(version);
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|source| ReadError::Api {
            action: format!("listing {} in {}", kind.plural(), resource.api_version),
            source,
        })?;
    let mut objects = Vec::with_capacity(list.items.len());
    for item in list.items {
        let mut value = serde_json::to_value(item).map_err(|error| ReadError::Object {
            source_name: "the API server".to_owned(),
            kind: kind.name().to_owned(),
            name: String::new(),
            message: error.to_string(),
        })?;
        if let Some(fields) = value.as_object_mut() {
            // List items may lack them; the conversion goes by them.
            fields.insert(
                "apiVersion".into(),
                Value::String(resource.api_version.clone()),
            );
            fields.insert("kind".into(), Value::String(kind.name().to_owned()));
        }
        let value = to_v1(value).map_err(|(kind, name, message)| ReadError::Object {
            source_name: "the API server".to_owned(),
            kind,
            name,
            message,
        })?;
        objects.push(Object {
            source: "the API server".to_owned(),
            value,
        });
    }
    Ok(objects)
}

/// The cluster's Nodes (for their labels); `None` when listing them is forbidden.
pub(crate) async fn list_nodes(client: &kube::Client) -> Result<Option<Vec<Node>>, ReadError> {
    match Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => Ok(Some(list.items)),
        Err(kube::Error::Api(status)) if status.code == 403 => Ok(None),
        Err(source) => Err(ReadError::Api {
            action: "listing nodes".to_owned(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn v1beta1_devices_and_requests_become_v1() {
        let slice = to_v1(json!({
            "apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceSlice",
            "metadata": { "name": "s" },
            "spec": { "devices": [{ "name": "d", "basic": { "attributes": { "a": { "int": 1 } } } }] },
        }))
        .unwrap();
        assert_eq!(slice["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(
            slice["spec"]["devices"][0],
            json!({ "name": "d", "attributes": { "a": { "int": 1 } } })
        );

        let claim = to_v1(json!({
            "apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim",
            "metadata": { "name": "c" },
            "spec": { "devices": { "requests": [
                { "name": "a", "deviceClassName": "gpu", "count": 2 },
                { "name": "b", "firstAvailable": [{ "name": "x", "deviceClassName": "gpu" }] },
            ] } },
        }))
        .unwrap();
        assert_eq!(
            claim["spec"]["devices"]["requests"],
            json!([
                { "name": "a", "exactly": { "deviceClassName": "gpu", "count": 2 } },
                { "name": "b", "firstAvailable": [{ "name": "x", "deviceClassName": "gpu" }] },
            ])
        );

        let v1beta2 = json!({ "apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceClass", "metadata": { "name": "c" } });
        assert_eq!(to_v1(v1beta2).unwrap()["apiVersion"], "resource.k8s.io/v1");
        assert!(
            to_v1(json!({ "apiVersion": "resource.k8s.io/v1alpha3", "kind": "DeviceClass" }))
                .is_err()
        );
    }

    #[test]
    fn numbers_become_strings_where_the_api_has_strings() {
        let mut slice = json!({ "spec": {
            "devices": [{ "name": "d", "attributes": { "n": { "int": 4 } },
                          "capacity": { "memory": { "value": 40, "requestPolicy": { "validValues": [1, 2] } } },
                          "taints": [{ "key": "k", "value": 79, "effect": "NoSchedule" }] }],
            "pool": { "name": "p", "generation": 1, "resourceSliceCount": 1 },
        }, "metadata": { "labels": { "zone": 1 } } });
        stringify_numbers(&mut slice, None);
        let device = &slice["spec"]["devices"][0];
        assert_eq!(device["attributes"]["n"]["int"], 4);
        assert_eq!(device["capacity"]["memory"]["value"], "40");
        assert_eq!(
            device["capacity"]["memory"]["requestPolicy"]["validValues"],
            json!(["1", "2"])
        );
        assert_eq!(device["taints"][0]["value"], "79");
        assert_eq!(slice["spec"]["pool"]["generation"], 1);
        assert_eq!(slice["metadata"]["labels"]["zone"], "1");
    }
}
