//! The semantic rules of a CDI spec.
//!
//! Every rule the reference library (v1.1.0) enforces when it loads or writes a spec, in the same
//! order, plus the rules SPEC.md states but the reference skips:
//!
//! - device node `path` and `hostPath`, mount `containerPath` and hook `path` must be absolute;
//!   so must a mount's `hostPath` when the mount is a bind mount (no `type`, or `bind`/`rbind`
//!   in `type` or `options`): a typed mount's source (`tmpfs`, `proc`, ...) is free-form;
//! - a hook `timeout`, when set, must be positive (OCI: "MUST be greater than zero") and fit the
//!   schema's `uint32`.
//!
//! Errors carry the device name (or none for the spec level) and the JSON path of the field.

use std::collections::{BTreeMap, HashSet};

use super::error::CdiError;
use super::name::validate_device_name;
use super::spec::{ContainerEdits, Device, DeviceNode, Hook, IntelRdt, Mount, NetDevice, Spec};
use super::version::Version;

/// Largest total size of one annotation map: the sum of its keys' and values' lengths (the
/// Kubernetes annotation limit, which the reference applies).
pub const MAX_ANNOTATIONS_SIZE: usize = 256 * 1024;

impl Spec {
    /// Checks every rule a runtime applies when it loads the spec, plus the stricter ones listed
    /// in the [module docs](super#validation), and that the declared `cdiVersion` is at least
    /// [`minimum_version`](Self::minimum_version).
    pub fn validate(&self) -> Result<(), CdiError> {
        match self.version_requirement() {
            Some((required, reason)) if self.version < required => {
                return Err(CdiError::VersionTooLow {
                    declared: self.version,
                    required,
                    reason,
                });
            }
            None if self.version < Version::EARLIEST => {
                return Err(CdiError::VersionTooLow {
                    declared: self.version,
                    required: Version::EARLIEST,
                    reason: format!("{} is the earliest spec version", Version::EARLIEST),
                });
            }
            _ => {}
        }
        // The kind was checked when it was built or parsed.
        validate_annotations(&self.annotations, None)?;
        validate_edits(&self.container_edits, None)?;
        if self.devices.is_empty() {
            return Err(CdiError::spec(
                "devices",
                "a spec needs at least one device",
            ));
        }
        let mut names = HashSet::with_capacity(self.devices.len());
        for (index, device) in self.devices.iter().enumerate() {
            device.validate()?;
            if !names.insert(device.name.as_str()) {
                return Err(CdiError::spec(
                    format!("devices[{index}].name"),
                    format!("duplicate device name {:?}", device.name),
                ));
            }
        }
        Ok(())
    }
}

impl Device {
    /// Checks the device name, annotations and edits; the edits must not be empty.
    pub fn validate(&self) -> Result<(), CdiError> {
        validate_device_name(&self.name)?;
        let scope = Some(self.name.as_str());
        validate_annotations(&self.annotations, scope)?;
        if self.container_edits.is_empty() {
            return Err(invalid(
                scope,
                "containerEdits",
                "a device needs at least one container edit",
            ));
        }
        validate_edits(&self.container_edits, scope)
    }
}

impl ContainerEdits {
    /// Checks the edits on their own (as spec-level edits; empty edits pass). Drivers can call
    /// this in prepare to fail early; [`SpecWriter`](super::SpecWriter) validates anyway.
    pub fn validate(&self) -> Result<(), CdiError> {
        validate_edits(self, None)
    }
}

fn validate_edits(edits: &ContainerEdits, device: Option<&str>) -> Result<(), CdiError> {
    validate_env(&edits.env, device, "containerEdits.env")?;
    for (index, node) in edits.device_nodes.iter().enumerate() {
        validate_device_node(
            node,
            device,
            &format!("containerEdits.deviceNodes[{index}]"),
        )?;
    }
    for (index, hook) in edits.hooks.iter().enumerate() {
        validate_hook(hook, device, &format!("containerEdits.hooks[{index}]"))?;
    }
    for (index, mount) in edits.mounts.iter().enumerate() {
        validate_mount(mount, device, &format!("containerEdits.mounts[{index}]"))?;
    }
    if let Some(rdt) = &edits.intel_rdt {
        validate_intel_rdt(rdt, device)?;
    }
    validate_net_devices(&edits.net_devices, device)
    // additionalGids: any u32 is valid; runtimes skip 0.
}

fn validate_env(env: &[String], device: Option<&str>, field: &str) -> Result<(), CdiError> {
    for (index, entry) in env.iter().enumerate() {
        // `=` at index 0 (an empty key) is as wrong as no `=` at all.
        if entry.find('=').is_none_or(|at| at == 0) {
            return Err(invalid(
                device,
                format!("{field}[{index}]"),
                format!("expected KEY=VALUE with a non-empty KEY, got {entry:?}"),
            ));
        }
    }
    Ok(())
}

fn validate_device_node(
    node: &DeviceNode,
    device: Option<&str>,
    field: &str,
) -> Result<(), CdiError> {
    require_absolute(&node.path, device, &format!("{field}.path"))?;
    if !node.host_path.is_empty() {
        require_absolute(&node.host_path, device, &format!("{field}.hostPath"))?;
    }
    if let Some(bad) = node
        .permissions
        .chars()
        .find(|c| !matches!(c, 'r' | 'w' | 'm'))
    {
        return Err(invalid(
            device,
            format!("{field}.permissions"),
            format!(
                "invalid permission {bad:?} in {:?}: only 'r', 'w' and 'm' are allowed",
                node.permissions
            ),
        ));
    }
    // The type is checked by the parser (a typed enum); major, minor, fileMode, uid and gid take
    // any value, as in the reference.
    Ok(())
}

fn validate_hook(hook: &Hook, device: Option<&str>, field: &str) -> Result<(), CdiError> {
    // The hook name is checked by the parser (a typed enum).
    require_absolute(&hook.path, device, &format!("{field}.path"))?;
    validate_env(&hook.env, device, &format!("{field}.env"))?;
    if let Some(timeout) = hook.timeout {
        if timeout <= 0 {
            return Err(invalid(
                device,
                format!("{field}.timeout"),
                format!("must be a positive number of seconds, got {timeout}"),
            ));
        }
        if timeout > i64::from(u32::MAX) {
            return Err(invalid(
                device,
                format!("{field}.timeout"),
                format!("{timeout} seconds does not fit the spec's uint32"),
            ));
        }
    }
    Ok(())
}

fn validate_mount(mount: &Mount, device: Option<&str>, field: &str) -> Result<(), CdiError> {
    if mount.host_path.is_empty() {
        return Err(invalid(
            device,
            format!("{field}.hostPath"),
            "must not be empty",
        ));
    }
    require_absolute(
        &mount.container_path,
        device,
        &format!("{field}.containerPath"),
    )?;
    if is_bind_mount(mount) {
        require_absolute(&mount.host_path, device, &format!("{field}.hostPath"))
            .map_err(|err| with_reason_suffix(err, " (it is the source of a bind mount)"))?;
    }
    Ok(())
}

fn is_bind_mount(mount: &Mount) -> bool {
    matches!(mount.mount_type.as_str(), "" | "bind" | "rbind")
        || mount.options.iter().any(|o| o == "bind" || o == "rbind")
}

fn validate_intel_rdt(rdt: &IntelRdt, device: Option<&str>) -> Result<(), CdiError> {
    let clos_id = rdt.clos_id.as_str();
    // The root class of service is "/"; any other value is a resctrl directory name.
    let valid = clos_id == "/"
        || !(clos_id.len() >= 4096
            || clos_id == "."
            || clos_id == ".."
            || clos_id.contains(['/', '\n']));
    if !valid {
        return Err(invalid(
            device,
            "containerEdits.intelRdt.closID",
            format!(
                "invalid class of service {clos_id:?}: must be \"/\" or a file name \
                 (no '/' or newline, not \".\" or \"..\", shorter than 4096 bytes)"
            ),
        ));
    }
    Ok(())
}

fn validate_net_devices(net_devices: &[NetDevice], device: Option<&str>) -> Result<(), CdiError> {
    let mut host_names = HashSet::with_capacity(net_devices.len());
    let mut names = HashSet::with_capacity(net_devices.len());
    for (index, net) in net_devices.iter().enumerate() {
        let field = format!("containerEdits.netDevices[{index}]");
        if net.host_interface_name.is_empty() {
            return Err(invalid(
                device,
                format!("{field}.hostInterfaceName"),
                "must not be empty",
            ));
        }
        if net.name.is_empty() {
            return Err(invalid(
                device,
                format!("{field}.name"),
                "must not be empty",
            ));
        }
        if !host_names.insert(net.host_interface_name.as_str()) {
            return Err(invalid(
                device,
                format!("{field}.hostInterfaceName"),
                format!("duplicate host interface {:?}", net.host_interface_name),
            ));
        }
        if !names.insert(net.name.as_str()) {
            return Err(invalid(
                device,
                format!("{field}.name"),
                format!("duplicate container interface {:?}", net.name),
            ));
        }
    }
    Ok(())
}

fn validate_annotations(
    annotations: &BTreeMap<String, String>,
    device: Option<&str>,
) -> Result<(), CdiError> {
    let mut total = 0usize;
    for (key, value) in annotations {
        check_annotation_key(key)
            .map_err(|reason| invalid(device, format!("annotations[{key:?}]"), reason))?;
        total = total.saturating_add(key.len()).saturating_add(value.len());
    }
    if total > MAX_ANNOTATIONS_SIZE {
        return Err(invalid(
            device,
            "annotations",
            format!("total size {total} bytes exceeds the limit of {MAX_ANNOTATIONS_SIZE} bytes"),
        ));
    }
    Ok(())
}

/// The Kubernetes qualified-name rule for annotation keys, applied after lowercasing as the
/// reference does: `[prefix/]name`, prefix a DNS-1123 subdomain, name at most 63 characters.
fn check_annotation_key(key: &str) -> Result<(), String> {
    let key = key.to_lowercase();
    let mut parts = key.split('/');
    let (prefix, name) = match (parts.next(), parts.next(), parts.next()) {
        (Some(name), None, None) => (None, name),
        (Some(prefix), Some(name), None) => (Some(prefix), name),
        _ => return Err("a qualified name has at most one '/'".to_owned()),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Err("the prefix before '/' must not be empty".to_owned());
        }
        check_dns_subdomain(prefix)?;
    }
    if name.is_empty() {
        return Err("the name part must not be empty".to_owned());
    }
    if name.len() > 63 {
        return Err(format!(
            "the name part must be at most 63 characters, it has {}",
            name.len()
        ));
    }
    if crate::k8s::names::label_name_part(name).is_err() {
        return Err(format!(
            "the name part {name:?} must consist of ASCII letters, digits, '-', '_' or '.', \
             and start and end with a letter or digit"
        ));
    }
    Ok(())
}

fn check_dns_subdomain(prefix: &str) -> Result<(), String> {
    if prefix.len() > 253 {
        return Err(format!(
            "the prefix must be at most 253 characters, it has {}",
            prefix.len()
        ));
    }
    if crate::k8s::names::dns_subdomain(prefix).is_err() {
        return Err(format!(
            "the prefix {prefix:?} must be a DNS subdomain: dot-separated labels of lowercase \
             letters, digits and '-', each starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

fn require_absolute(path: &str, device: Option<&str>, field: &str) -> Result<(), CdiError> {
    if path.is_empty() {
        return Err(invalid(device, field, "must not be empty"));
    }
    if !path.starts_with('/') {
        return Err(invalid(
            device,
            field,
            format!("must be an absolute path, got {path:?}"),
        ));
    }
    Ok(())
}

fn invalid(device: Option<&str>, field: impl Into<String>, reason: impl Into<String>) -> CdiError {
    CdiError::InvalidSpec {
        device: device.map(str::to_owned),
        field: field.into(),
        reason: reason.into(),
    }
}

fn with_reason_suffix(err: CdiError, suffix: &str) -> CdiError {
    match err {
        CdiError::InvalidSpec {
            device,
            field,
            reason,
        } => CdiError::InvalidSpec {
            device,
            field,
            reason: reason + suffix,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotation_keys() {
        for good in [
            "a",
            "A",
            "a.b_c-d",
            "example.com/x",
            "EXAMPLE.com/x",
            "cdi.k8s.io/vfio17",
            "a-b.c/d",
        ] {
            assert!(check_annotation_key(good).is_ok(), "{good}");
        }
        let long_name = "a".repeat(64);
        let long_prefix = format!("{}/x", "a".repeat(254));
        for bad in [
            "",
            "/x",
            "a/b/c",
            "x/",
            "-a",
            "a-",
            "a b",
            "ex_ample.com/x",
            "example..com/x",
            "-example.com/x",
            long_name.as_str(),
            long_prefix.as_str(),
        ] {
            assert!(check_annotation_key(bad).is_err(), "{bad:?}");
        }
        assert!(check_annotation_key(&"a".repeat(63)).is_ok());
    }

    #[test]
    fn annotation_size_limit() {
        let mut annotations = BTreeMap::new();
        annotations.insert("k".to_owned(), "v".repeat(MAX_ANNOTATIONS_SIZE - 1));
        assert!(validate_annotations(&annotations, None).is_ok());
        annotations.insert("l".to_owned(), String::new());
        let err = validate_annotations(&annotations, Some("dev")).unwrap_err();
        assert!(
            err.to_string()
                .contains("device \"dev\": annotations: total size"),
            "{err}"
        );
    }

    #[test]
    fn bind_mount_detection() {
        assert!(is_bind_mount(&Mount::new("/a", "/b")));
        assert!(is_bind_mount(&Mount::new("/a", "/b").mount_type("bind")));
        assert!(is_bind_mount(
            &Mount::new("/a", "/b").mount_type("none").option("rbind")
        ));
        assert!(!is_bind_mount(
            &Mount::new("tmpfs", "/b").mount_type("tmpfs")
        ));
    }
}
