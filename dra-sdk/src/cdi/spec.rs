//! The CDI spec document, field for field as `specs-go` of cdiVersion 1.1.0, and its parsers.
//!
//! Field names are the exact JSON/YAML names. Optional fields that are empty are left out on
//! output, as the reference's `omitempty` does (`major: 0` included). Parsing is strict: unknown
//! fields, duplicate keys and values of the wrong type are errors, as with the reference's
//! `UnmarshalStrict`; `null` is accepted wherever the reference's decoder accepts it for an
//! optional field (it is what an empty YAML value such as `env:` means).

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::error::{CdiError, SpecFormat};
use super::name::Kind;
use super::version::Version;

/// A CDI spec: one file in a CDI directory, describing devices of one kind.
///
/// Build one with [`Spec::new`] and [`Spec::device`], or read one with [`Spec::parse`]. DRA
/// drivers normally never touch this type: [`SpecWriter`](super::SpecWriter) builds, validates
/// and writes the per-claim spec from [`ContainerEdits`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[non_exhaustive]
pub struct Spec {
    /// `cdiVersion`: the spec version the document complies with. A leading `v` is accepted on
    /// input; output never has one.
    #[serde(rename = "cdiVersion")]
    pub version: Version,
    /// `kind`: `vendor/class` of every device in the spec.
    pub kind: Kind,
    /// `annotations` of the spec (cdiVersion 0.6.0).
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "annotations"
    )]
    pub annotations: BTreeMap<String, String>,
    /// `devices`: at least one, names unique within the spec.
    pub devices: Vec<Device>,
    /// `containerEdits` applied once per container whenever any device of this spec is
    /// injected; left out when empty.
    #[serde(
        default,
        skip_serializing_if = "ContainerEdits::is_empty",
        deserialize_with = "nullable"
    )]
    pub container_edits: ContainerEdits,
}

/// One device of a spec: a name and the edits that inject it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[non_exhaustive]
pub struct Device {
    /// `name`: unique within the spec's kind across all spec files.
    pub name: String,
    /// `annotations` of the device (cdiVersion 0.6.0).
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "annotations"
    )]
    pub annotations: BTreeMap<String, String>,
    /// `containerEdits`: must not be empty.
    #[serde(deserialize_with = "nullable")]
    pub container_edits: ContainerEdits,
}

/// The changes a device (or a whole spec) makes to a container: environment, device nodes,
/// mounts, hooks, network devices, Intel RDT and supplementary groups.
///
/// This is also the builder DRA drivers return from prepare:
///
/// ```
/// use dra_sdk::cdi::{ContainerEdits, DeviceNode, Hook, HookName, Mount};
///
/// let edits = ContainerEdits::new()
///     .env("GPU_DEVICE_0", "gpu-0")
///     .device_node(DeviceNode::new("/dev/nvidia0").permissions("rw"))
///     .mount(Mount::new("/opt/lib/libcuda.so.1", "/usr/lib/libcuda.so.1").options(["ro", "rbind"]))
///     .hook(Hook::new(HookName::CreateContainer, "/usr/bin/nvidia-cdi-hook").args(["nvidia-cdi-hook", "update-ldcache"]));
/// assert_eq!(edits.env, ["GPU_DEVICE_0=gpu-0"]);
/// assert!(edits.validate().is_ok());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[non_exhaustive]
pub struct ContainerEdits {
    /// `env`: `KEY=VALUE` entries.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "nullable"
    )]
    pub env: Vec<String>,
    /// `deviceNodes` created in the container.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "nullable"
    )]
    pub device_nodes: Vec<DeviceNode>,
    /// `netDevices` moved into the container's network namespace (cdiVersion 1.1.0).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "nullable"
    )]
    pub net_devices: Vec<NetDevice>,
    /// `hooks` run by the OCI runtime.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "nullable"
    )]
    pub hooks: Vec<Hook>,
    /// `mounts` added to the container.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "nullable"
    )]
    pub mounts: Vec<Mount>,
    /// `intelRdt` settings (cdiVersion 0.7.0; present at all, even empty, raises the version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intel_rdt: Option<IntelRdt>,
    /// `additionalGids`: supplementary groups of the container process (cdiVersion 0.7.0).
    /// Runtimes skip 0.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "nullable"
    )]
    pub additional_gids: Vec<u32>,
}

/// A device node to create in the container.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[non_exhaustive]
pub struct DeviceNode {
    /// `path` in the container; must be absolute.
    pub path: String,
    /// `hostPath` of the node on the host when it differs from `path` (cdiVersion 0.5.0); must be
    /// absolute when set.
    #[serde(
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "nullable"
    )]
    pub host_path: String,
    /// `type`: taken from the host node when unset. An empty string in a file reads as unset.
    #[serde(
        rename = "type",
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "device_node_type"
    )]
    pub device_type: Option<DeviceNodeType>,
    /// `major` number; 0 means "take it from the host node" and is left out on output.
    #[serde(
        default,
        skip_serializing_if = "is_zero",
        deserialize_with = "nullable"
    )]
    pub major: i64,
    /// `minor` number; 0 is left out on output (the runtime then takes it from the host node).
    #[serde(
        default,
        skip_serializing_if = "is_zero",
        deserialize_with = "nullable"
    )]
    pub minor: i64,
    /// `fileMode`: Go `os.FileMode` bits; taken from the host node when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// `permissions` of the cgroup device rule: any of `r`, `w`, `m`; empty means `rwm`.
    #[serde(
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "nullable"
    )]
    pub permissions: String,
    /// `uid` owning the node in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// `gid` owning the node in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

/// The `type` of a [`DeviceNode`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceNodeType {
    /// `b`: block device.
    Block,
    /// `c`: character device.
    Char,
    /// `u`: unbuffered character device.
    Unbuffered,
    /// `p`: FIFO.
    Fifo,
}

impl DeviceNodeType {
    /// The one-letter spelling in the spec.
    pub const fn as_str(self) -> &'static str {
        match self {
            DeviceNodeType::Block => "b",
            DeviceNodeType::Char => "c",
            DeviceNodeType::Unbuffered => "u",
            DeviceNodeType::Fifo => "p",
        }
    }
}

impl fmt::Display for DeviceNodeType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DeviceNodeType {
    type Err = CdiError;

    fn from_str(s: &str) -> Result<Self, CdiError> {
        match s {
            "b" => Ok(DeviceNodeType::Block),
            "c" => Ok(DeviceNodeType::Char),
            "u" => Ok(DeviceNodeType::Unbuffered),
            "p" => Ok(DeviceNodeType::Fifo),
            other => Err(CdiError::spec("type", unknown_device_type(other))),
        }
    }
}

fn unknown_device_type(s: &str) -> String {
    format!("unknown device node type {s:?}; expected \"b\", \"c\", \"u\" or \"p\"")
}

impl Serialize for DeviceNodeType {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// A mount added to the container.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[non_exhaustive]
pub struct Mount {
    /// `hostPath`: the mount source. Absolute for bind mounts; for a typed mount (`tmpfs`, ...)
    /// whatever the file system takes as a source.
    pub host_path: String,
    /// `containerPath`: the mount point in the container; must be absolute.
    pub container_path: String,
    /// `options`, as in `mount(8)` (`ro`, `rbind`, `nosuid`, ...).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "nullable"
    )]
    pub options: Vec<String>,
    /// `type` of the file system (cdiVersion 0.4.0); empty means a bind mount.
    #[serde(
        rename = "type",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "nullable"
    )]
    pub mount_type: String,
}

/// An OCI hook the runtime runs at one point of the container lifecycle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[non_exhaustive]
pub struct Hook {
    /// `hookName`: when it runs.
    pub hook_name: HookName,
    /// `path` of the executable on the host; must be absolute.
    pub path: String,
    /// `args`, including `argv[0]`.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "nullable"
    )]
    pub args: Vec<String>,
    /// `env` of the hook process, `KEY=VALUE` entries.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "nullable"
    )]
    pub env: Vec<String>,
    /// `timeout` in seconds; must be positive (and fit the schema's `uint32`) when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

/// The OCI lifecycle point a [`Hook`] runs at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum HookName {
    /// `prestart` (deprecated in OCI in favour of the three below, still accepted).
    Prestart,
    /// `createRuntime`: in the runtime namespace, after the container is created.
    CreateRuntime,
    /// `createContainer`: in the container namespace, before pivot_root.
    CreateContainer,
    /// `startContainer`: in the container, before the user process starts.
    StartContainer,
    /// `poststart`: after the user process starts.
    Poststart,
    /// `poststop`: after the container is deleted.
    Poststop,
}

impl HookName {
    /// The spelling in the spec (`"createContainer"`).
    pub const fn as_str(self) -> &'static str {
        match self {
            HookName::Prestart => "prestart",
            HookName::CreateRuntime => "createRuntime",
            HookName::CreateContainer => "createContainer",
            HookName::StartContainer => "startContainer",
            HookName::Poststart => "poststart",
            HookName::Poststop => "poststop",
        }
    }
}

impl fmt::Display for HookName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for HookName {
    type Err = CdiError;

    fn from_str(s: &str) -> Result<Self, CdiError> {
        [
            HookName::Prestart,
            HookName::CreateRuntime,
            HookName::CreateContainer,
            HookName::StartContainer,
            HookName::Poststart,
            HookName::Poststop,
        ]
        .into_iter()
        .find(|name| name.as_str() == s)
        .ok_or_else(|| CdiError::spec("hookName", format!("unknown hook name {s:?}")))
    }
}

/// Intel RDT (resource director technology) settings of the container (cdiVersion 0.7.0; the
/// `schemata` and `enableMonitoring` fields 1.1.0).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[non_exhaustive]
pub struct IntelRdt {
    /// `closID`: the class of service, a resctrl group name (or `/` for the root group).
    #[serde(
        rename = "closID",
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "nullable"
    )]
    pub clos_id: String,
    /// `l3CacheSchema`.
    #[serde(
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "nullable"
    )]
    pub l3_cache_schema: String,
    /// `memBwSchema`.
    #[serde(
        default,
        skip_serializing_if = "String::is_empty",
        deserialize_with = "nullable"
    )]
    pub mem_bw_schema: String,
    /// `schemata` lines (cdiVersion 1.1.0). `Some` raises the version even when empty, as in the
    /// reference; unlike the reference's writer, an explicit empty list is written out as `[]`
    /// so that reading the file back gives the same spec and the same minimum version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schemata: Option<Vec<String>>,
    /// `enableMonitoring` (cdiVersion 1.1.0).
    #[serde(
        default,
        skip_serializing_if = "is_false",
        deserialize_with = "nullable"
    )]
    pub enable_monitoring: bool,
}

/// A host network interface moved into the container (cdiVersion 1.1.0).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[non_exhaustive]
pub struct NetDevice {
    /// `hostInterfaceName`: the interface on the host.
    pub host_interface_name: String,
    /// `name` of the interface in the container.
    pub name: String,
}

impl ContainerEdits {
    /// Whether the edits change nothing.
    pub fn is_empty(&self) -> bool {
        let ContainerEdits {
            env,
            device_nodes,
            net_devices,
            hooks,
            mounts,
            intel_rdt,
            additional_gids,
        } = self;
        env.is_empty()
            && device_nodes.is_empty()
            && net_devices.is_empty()
            && hooks.is_empty()
            && mounts.is_empty()
            && intel_rdt.is_none()
            && additional_gids.is_empty()
    }
}

impl Spec {
    /// Parses and validates a spec document, JSON or YAML, as runtimes read spec files.
    ///
    /// A document whose first non-blank character is `{` is read as JSON (falling back to YAML,
    /// of which JSON is a subset, if it is not well-formed JSON); anything else as YAML. Then
    /// [`validate`](Self::validate) runs.
    ///
    /// ```
    /// use dra_sdk::advanced::cdi::Spec;
    ///
    /// let spec = Spec::parse(br#"{"cdiVersion": "0.3.0", "kind": "vendor.com/device",
    ///     "devices": [{"name": "dev0", "containerEdits": {"env": ["A=1"]}}]}"#)?;
    /// assert_eq!(spec.devices[0].name, "dev0");
    /// # Ok::<(), dra_sdk::cdi::CdiError>(())
    /// ```
    pub fn parse(document: &[u8]) -> Result<Spec, CdiError> {
        let spec = Spec::parse_unvalidated(document)?;
        spec.validate()?;
        Ok(spec)
    }

    /// Parses a spec document, JSON or YAML, without the semantic checks of
    /// [`validate`](Self::validate); the structural checks (types, unknown fields, duplicate
    /// keys, known `cdiVersion`, valid `kind`) still apply.
    pub fn parse_unvalidated(document: &[u8]) -> Result<Spec, CdiError> {
        let text = document.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(document);
        if text.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{') {
            match Spec::from_json(text) {
                // YAML flow style (`{kind: v.com/d, ...}`) is valid YAML but not JSON. When YAML
                // fails too, the JSON error is the one that describes what the author meant.
                Err(json_err @ CdiError::Parse { .. }) if !is_well_formed_json(text) => {
                    Spec::from_yaml(text).map_err(|_| json_err)
                }
                result => result,
            }
        } else {
            Spec::from_yaml(text)
        }
    }

    /// Parses a JSON document, without [`validate`](Self::validate).
    pub fn from_json(document: &[u8]) -> Result<Spec, CdiError> {
        let parse_error = |message: String| CdiError::Parse {
            format: SpecFormat::Json,
            message,
        };
        let mut deserializer = serde_json::Deserializer::from_slice(document);
        let spec: Option<Spec> =
            serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
                let path = err.path().to_string();
                let inner = err.into_inner();
                if path == "." {
                    parse_error(inner.to_string())
                } else {
                    parse_error(format!("{path}: {inner}"))
                }
            })?;
        deserializer
            .end()
            .map_err(|err| parse_error(err.to_string()))?;
        spec.ok_or(CdiError::Empty)
    }

    /// Parses a YAML document, without [`validate`](Self::validate).
    pub fn from_yaml(document: &[u8]) -> Result<Spec, CdiError> {
        // The YAML parser says only "input is not valid UTF-8"; say where.
        if let Err(err) = std::str::from_utf8(document) {
            let (line, column) = position(document, err.valid_up_to());
            return Err(CdiError::Parse {
                format: SpecFormat::Yaml,
                message: format!("input is not valid UTF-8 at line {line} column {column}"),
            });
        }
        let options = serde_saphyr::options! {
            // One-line messages: they end up in logs and kubelet events.
            with_snippet: false,
        };
        let spec: Option<Spec> =
            serde_saphyr::from_slice_with_options(document, options).map_err(|err| {
                CdiError::Parse {
                    format: SpecFormat::Yaml,
                    message: err.to_string(),
                }
            })?;
        spec.ok_or(CdiError::Empty)
    }

    /// Reads, parses and validates a spec file.
    pub fn read_file(path: impl AsRef<Path>) -> Result<Spec, CdiError> {
        let path = path.as_ref();
        let document =
            std::fs::read(path).map_err(|err| CdiError::io("read CDI spec", path, err))?;
        Spec::parse(&document).map_err(|err| CdiError::InFile {
            path: path.to_owned(),
            source: Box::new(err),
        })
    }

    /// The spec as compact JSON, the format [`SpecWriter`](super::SpecWriter) writes.
    pub fn to_json(&self) -> Result<Vec<u8>, CdiError> {
        serde_json::to_vec(self).map_err(CdiError::Serialize)
    }

    /// The spec as indented JSON, for humans.
    pub fn to_json_pretty(&self) -> Result<Vec<u8>, CdiError> {
        serde_json::to_vec_pretty(self).map_err(CdiError::Serialize)
    }
}

/// The `kind` of a spec document, read without checking anything else; `None` if the document
/// has no readable string `kind`.
pub(crate) fn peek_kind(document: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct KindOnly {
        kind: String,
    }
    serde_json::from_slice::<KindOnly>(document)
        .ok()
        .or_else(|| serde_saphyr::from_slice::<KindOnly>(document).ok())
        .map(|doc| doc.kind)
}

/// The 1-based line and column (in bytes) of byte `offset` of `document`.
fn position(document: &[u8], offset: usize) -> (usize, usize) {
    let before = &document[..offset.min(document.len())];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let column = before.len()
        - before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |at| at + 1)
        + 1;
    (line, column)
}

fn is_well_formed_json(document: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(document).is_ok()
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// `null` reads as the default, as Go's decoders leave a field untouched on `null`.
fn nullable<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

fn device_node_type<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<DeviceNodeType>, D::Error> {
    match Option::<String>::deserialize(deserializer)?.as_deref() {
        None | Some("") => Ok(None),
        Some(text) => text
            .parse()
            .map(Some)
            .map_err(|_| de::Error::custom(unknown_device_type(text))),
    }
}

/// An annotation map that rejects duplicate keys, which a plain map would silently collapse.
fn annotations<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    struct AnnotationsVisitor;

    impl<'de> Visitor<'de> for AnnotationsVisitor {
        type Value = BTreeMap<String, String>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a map of annotation keys to string values")
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(BTreeMap::new())
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(BTreeMap::new())
        }

        fn visit_some<D: Deserializer<'de>>(
            self,
            deserializer: D,
        ) -> Result<Self::Value, D::Error> {
            deserializer.deserialize_map(self)
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut annotations = BTreeMap::new();
            while let Some((key, value)) = map.next_entry::<String, String>()? {
                if let Some(key) = insert_new(&mut annotations, key, value) {
                    return Err(de::Error::custom(format!(
                        "duplicate annotation key {key:?}"
                    )));
                }
            }
            Ok(annotations)
        }
    }

    deserializer.deserialize_option(AnnotationsVisitor)
}

/// Inserts unless the key is taken; returns the key back when it is.
fn insert_new(map: &mut BTreeMap<String, String>, key: String, value: String) -> Option<String> {
    use std::collections::btree_map::Entry;
    match map.entry(key) {
        Entry::Vacant(slot) => {
            slot.insert(value);
            None
        }
        Entry::Occupied(slot) => Some(slot.key().clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"{"cdiVersion":"0.3.0","kind":"vendor.com/device","devices":[{"name":"dev","containerEdits":{"env":["A=1"]}}]}"#;

    fn parse_err(document: &str) -> String {
        Spec::parse(document.as_bytes()).unwrap_err().to_string()
    }

    #[test]
    fn compact_json_round_trips_byte_for_byte() {
        let spec = Spec::parse(MINIMAL.as_bytes()).unwrap();
        assert_eq!(String::from_utf8(spec.to_json().unwrap()).unwrap(), MINIMAL);
    }

    #[test]
    fn unknown_fields_are_errors_at_every_level() {
        for document in [
            r#"{"cdiVersion":"0.3.0","kind":"v.com/d","devices":[],"extra":1}"#,
            r#"{"cdiVersion":"0.3.0","kind":"v.com/d","devices":[{"name":"d","containerEdits":{},"x":1}]}"#,
            r#"{"cdiVersion":"0.3.0","kind":"v.com/d","devices":[{"name":"d","containerEdits":{"deviceNodes":[{"path":"/d","devicePath":"/x"}]}}]}"#,
            r#"{"cdiVersion":"0.7.0","kind":"v.com/d","devices":[{"name":"d","containerEdits":{"intelRdt":{"enableCMT":true}}}]}"#,
        ] {
            let err = parse_err(document);
            assert!(err.contains("unknown field"), "{err}");
        }
        // The path of the offending field is in the message.
        let err = parse_err(
            r#"{"cdiVersion":"0.3.0","kind":"v.com/d","devices":[{"name":"d","containerEdits":{"mounts":[{"hostPath":"/a","containerPath":"/b","flags":1}]}}]}"#,
        );
        assert!(err.contains("devices[0].containerEdits.mounts[0]"), "{err}");
    }

    #[test]
    fn duplicate_keys_are_errors_in_json_and_yaml() {
        let json = r#"{"cdiVersion":"0.3.0","cdiVersion":"0.3.0","kind":"v.com/d","devices":[]}"#;
        assert!(
            parse_err(json).contains("duplicate field"),
            "{}",
            parse_err(json)
        );
        let json = r#"{"cdiVersion":"0.6.0","kind":"v.com/d","annotations":{"a":"1","a":"2"},"devices":[]}"#;
        assert!(
            parse_err(json).contains("duplicate annotation key"),
            "{}",
            parse_err(json)
        );
        let yaml =
            "cdiVersion: 0.6.0\nkind: v.com/d\nannotations:\n  a: '1'\n  a: '2'\ndevices: []\n";
        assert!(parse_err(yaml).contains("duplicate"), "{}", parse_err(yaml));
        let yaml = "cdiVersion: 0.3.0\nkind: v.com/d\nkind: v.com/e\ndevices: []\n";
        assert!(parse_err(yaml).contains("duplicate"), "{}", parse_err(yaml));
    }

    #[test]
    fn invalid_utf8_is_located() {
        let err = Spec::parse(b"cdiVersion: 0.3.0\nkind: v\xff").unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot parse CDI spec as YAML: input is not valid UTF-8 at line 2 column 8"
        );
        assert_eq!(position(b"", 0), (1, 1));
        assert_eq!(position(b"ab\ncd", 4), (2, 2));
    }

    #[test]
    fn empty_and_null_documents() {
        for document in ["", "   \n", "null", "---\n", "~"] {
            assert!(
                matches!(Spec::parse(document.as_bytes()), Err(CdiError::Empty)),
                "{document:?}: {:?}",
                Spec::parse(document.as_bytes())
            );
        }
        assert!(parse_err("{}").contains("missing field"));
    }

    #[test]
    fn yaml_reads_like_json_and_null_means_unset() {
        let yaml = "\u{feff}---\ncdiVersion: v0.5.0\nkind: vendor.com/device\ncontainerEdits:\n  env:\n  hooks: ~\ndevices:\n  - name: \"0\"\n    annotations:\n    containerEdits:\n      deviceNodes:\n        - path: /dev/card0\n          hostPath: /dev/dri/card0\n          type: \"\"\n          major: 226\n          fileMode: 8630\n";
        let spec = Spec::parse(yaml.as_bytes()).unwrap();
        assert_eq!(spec.version, Version::V0_5_0);
        assert!(spec.container_edits.is_empty());
        let node = &spec.devices[0].container_edits.device_nodes[0];
        assert_eq!(node.device_type, None);
        assert_eq!(node.major, 226);
        assert_eq!(node.file_mode, Some(8630));
        // JSON input of the same content gives the same spec.
        let again = Spec::parse(&spec.to_json().unwrap()).unwrap();
        assert_eq!(again, spec);
    }

    #[test]
    fn json_like_yaml_falls_back_to_yaml() {
        let flow = "{cdiVersion: 0.3.0, kind: v.com/d, devices: [{name: d, containerEdits: {env: [A=1]}}]}";
        assert_eq!(Spec::parse(flow.as_bytes()).unwrap().devices[0].name, "d");
    }

    #[test]
    fn omitted_fields_follow_omitempty() {
        let spec = Spec::new("v.com/d".parse().unwrap()).device(Device::new(
            "d",
            ContainerEdits::new()
                .device_node(DeviceNode::new("/dev/x").major(0).minor(0))
                .hook(Hook::new(HookName::Poststop, "/bin/h"))
                .mount(Mount::new("/a", "/b"))
                .net_device(NetDevice::new("eth0", "net0"))
                .intel_rdt(IntelRdt::new()),
        ));
        let json = String::from_utf8(spec.to_json().unwrap()).unwrap();
        assert_eq!(
            json,
            r#"{"cdiVersion":"0.3.0","kind":"v.com/d","devices":[{"name":"d","containerEdits":{"deviceNodes":[{"path":"/dev/x"}],"netDevices":[{"hostInterfaceName":"eth0","name":"net0"}],"hooks":[{"hookName":"poststop","path":"/bin/h"}],"mounts":[{"hostPath":"/a","containerPath":"/b"}],"intelRdt":{}}}]}"#
        );
    }

    #[test]
    fn typed_fields_reject_unknown_values() {
        let node = |t: &str| {
            format!(
                r#"{{"cdiVersion":"0.3.0","kind":"v.com/d","devices":[{{"name":"d","containerEdits":{{"deviceNodes":[{{"path":"/d","type":"{t}"}}]}}}}]}}"#
            )
        };
        for t in ["b", "c", "u", "p", ""] {
            assert!(Spec::parse(node(t).as_bytes()).is_ok(), "{t}");
        }
        let err = parse_err(&node("x"));
        assert!(
            err.contains("devices[0].containerEdits.deviceNodes[0].type"),
            "{err}"
        );
        assert!(err.contains("unknown device node type \"x\""), "{err}");

        let err = parse_err(
            r#"{"cdiVersion":"0.3.0","kind":"v.com/d","devices":[{"name":"d","containerEdits":{"hooks":[{"hookName":"preStart","path":"/h"}]}}]}"#,
        );
        assert!(err.contains("hookName"), "{err}");
        let err = parse_err(r#"{"cdiVersion":"2.0.0","kind":"v.com/d","devices":[]}"#);
        assert!(err.contains("unknown CDI version \"2.0.0\""), "{err}");
        let err = parse_err(r#"{"cdiVersion":"0.3.0","kind":"v.com/d/e","devices":[]}"#);
        assert!(err.contains("invalid CDI class name"), "{err}");
    }

    #[test]
    fn explicit_empty_schemata_survives_a_round_trip() {
        let spec = Spec::new("v.com/d".parse().unwrap()).device(Device::new(
            "d",
            ContainerEdits::new().intel_rdt(IntelRdt::new().schemata(Vec::<String>::new())),
        ));
        assert_eq!(spec.minimum_version(), Version::V1_1_0);
        let again = Spec::parse_unvalidated(&spec.to_json().unwrap()).unwrap();
        assert_eq!(again, spec);
    }
}
