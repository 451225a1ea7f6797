//! The workloads users apply (`demo/`): every object decodes into its Kubernetes API type
//! without losing a field (so no misspelled or misplaced field), and the opaque configs decode
//! strictly into the driver's config. The deployment is the Helm chart, tested by `chart.rs`.

use std::path::{Path, PathBuf};

use dra_sdk::driver::Driver;
use dra_sdk_testing::deliverables::chart::round_trip;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate};
use mock_gpu::MockGpuDriver;
use serde_json::Value;

fn package_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every YAML document of `file`, as JSON.
fn documents(file: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(file).unwrap();
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap_or_else(|error| panic!("{}: {error}", file.display()))
}

fn check(document: &Value) -> Vec<String> {
    let api_version = document["apiVersion"].as_str().unwrap_or_default();
    let kind = document["kind"].as_str().unwrap_or_default();
    match (api_version, kind) {
        ("v1", "Namespace") => round_trip::<Namespace>(document),
        ("v1", "ServiceAccount") => round_trip::<ServiceAccount>(document),
        ("v1", "Pod") => round_trip::<Pod>(document),
        ("apps/v1", "DaemonSet") => round_trip::<DaemonSet>(document),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => round_trip::<ClusterRole>(document),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            round_trip::<ClusterRoleBinding>(document)
        }
        ("resource.k8s.io/v1", "DeviceClass") => round_trip::<DeviceClass>(document),
        ("resource.k8s.io/v1", "ResourceClaim") => round_trip::<ResourceClaim>(document),
        ("resource.k8s.io/v1", "ResourceClaimTemplate") => {
            round_trip::<ResourceClaimTemplate>(document)
        }
        other => vec![format!("no check for {other:?}; add one")],
    }
}

#[test]
fn manifests_are_valid_objects_of_their_kinds() {
    let mut problems = Vec::new();
    let mut seen = 0;
    for dir in ["demo"] {
        for entry in std::fs::read_dir(package_dir().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            for document in documents(&path) {
                seen += 1;
                let name = format!(
                    "{} {} {}",
                    path.display(),
                    document["kind"],
                    document["metadata"]["name"]
                );
                problems.extend(check(&document).into_iter().map(|p| format!("{name}: {p}")));
            }
        }
    }
    assert!(seen >= 5, "only {seen} objects found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn opaque_configs_decode_strictly() {
    let registry = MockGpuDriver::new("gpu.example.com", "node", 1).config_registry();
    let mut configs = 0;
    for document in documents(&package_dir().join("demo/gpu-test.yaml")) {
        let spec = match document["kind"].as_str() {
            Some("ResourceClaim") => &document["spec"],
            Some("ResourceClaimTemplate") => &document["spec"]["spec"],
            _ => continue,
        };
        for config in spec["devices"]["config"].as_array().into_iter().flatten() {
            configs += 1;
            if let Err(error) = registry.decode(&config["opaque"]["parameters"]) {
                panic!("{}: {error}", document["metadata"]["name"]);
            }
        }
    }
    assert!(configs > 0);
}
