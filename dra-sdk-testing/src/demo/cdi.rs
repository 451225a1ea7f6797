//! What a container gets from the CDI spec files the plugin wrote, read back the way a
//! runtime reads them.

use std::collections::BTreeSet;
use std::path::Path;

use dra_sdk::advanced::cdi::Spec;

use super::DemoError;
use crate::kubelet::KubeletDevice;

/// The environment and device nodes a container gets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerCdi {
    /// `NAME=value` entries, sorted.
    pub env: Vec<String>,
    /// Device node paths, sorted.
    pub device_nodes: Vec<String>,
}

/// What a container using `devices` gets: the spec-level and device-level edits of the CDI
/// spec files under `cdi_root` that define their CDI device names.
pub fn container_cdi(
    cdi_root: &Path,
    devices: &[KubeletDevice],
) -> Result<ContainerCdi, DemoError> {
    let ids: BTreeSet<&str> = devices
        .iter()
        .flat_map(|d| &d.cdi_device_ids)
        .map(String::as_str)
        .collect();
    let io = |source| DemoError::Io {
        action: format!("reading the CDI directory {}", cdi_root.display()),
        source,
    };
    let mut env = BTreeSet::new();
    let mut nodes = BTreeSet::new();
    for entry in std::fs::read_dir(cdi_root).map_err(io)? {
        let path = entry.map_err(io)?.path();
        let spec = Spec::read_file(&path).map_err(|source| DemoError::Cdi {
            path: path.clone(),
            source,
        })?;
        for device in &spec.devices {
            if !ids.contains(format!("{}={}", spec.kind, device.name).as_str()) {
                continue;
            }
            for edits in [&spec.container_edits, &device.container_edits] {
                env.extend(edits.env.iter().cloned());
                nodes.extend(edits.device_nodes.iter().map(|node| node.path.clone()));
            }
        }
    }
    Ok(ContainerCdi {
        env: env.into_iter().collect(),
        device_nodes: nodes.into_iter().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(ids: &[&str]) -> KubeletDevice {
        KubeletDevice {
            request_names: vec![],
            pool: "p".into(),
            device: "d".into(),
            cdi_device_ids: ids.iter().map(|&id| id.to_owned()).collect(),
            share_id: None,
        }
    }

    #[test]
    fn only_the_devices_named_contribute_with_their_spec() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("example.com-gpu.json"),
            serde_json::json!({
                "cdiVersion": "0.6.0",
                "kind": "example.com/gpu",
                "containerEdits": { "env": ["COMMON=1"] },
                "devices": [
                    { "name": "a", "containerEdits": {
                        "env": ["A=1"], "deviceNodes": [{ "path": "/dev/a" }],
                    } },
                    { "name": "b", "containerEdits": { "env": ["B=1"] } },
                ],
            })
            .to_string(),
        )
        .unwrap();
        let got = container_cdi(dir.path(), &[device(&["example.com/gpu=a"])]).unwrap();
        assert_eq!(got.env, ["A=1", "COMMON=1"]);
        assert_eq!(got.device_nodes, ["/dev/a"]);
        let none = container_cdi(dir.path(), &[device(&["example.com/other=a"])]).unwrap();
        assert_eq!(none, ContainerCdi::default());
    }
}
