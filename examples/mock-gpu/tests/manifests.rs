//! The workloads users apply (`demo/`): every object decodes into its Kubernetes API type
//! without losing a field (so no misspelled or misplaced field), and the opaque configs decode
//! strictly into the driver's config. The deployment is the Helm chart, tested by `chart.rs`.

use std::path::PathBuf;

use dra_sdk::driver::Driver;
use dra_sdk_testing::deliverables::chart::{decode, yaml_documents};
use mock_gpu::MockGpuDriver;

fn package_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn manifests_are_valid_objects_of_their_kinds() {
    let mut problems = Vec::new();
    let mut seen = 0;
    for dir in ["demo"] {
        for entry in std::fs::read_dir(package_dir().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            for document in yaml_documents(&path) {
                seen += 1;
                let name = format!(
                    "{} {} {}",
                    path.display(),
                    document["kind"],
                    document["metadata"]["name"]
                );
                problems.extend(
                    decode(&document)
                        .into_iter()
                        .map(|p| format!("{name}: {p}")),
                );
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
    for document in yaml_documents(&package_dir().join("demo/gpu-test.yaml")) {
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
