//! Helpers shared by the `cdi_*` integration tests: fixture paths and the official JSON schema.

#![allow(dead_code, unreachable_pub)] // each test binary uses a subset

use std::path::{Path, PathBuf};

use jsonschema::{Registry, Resource, Validator};
use serde_json::Value;

/// `tests/fixtures/<rest>`.
pub fn fixture(rest: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rest)
}

/// Files of a fixture directory, sorted.
pub fn fixture_files(dir: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(fixture(dir))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no fixtures in {dir}");
    files
}

/// The official CDI schema, either `"schema"` (repository HEAD) or `"v1.1.0-tag/schema"` (the
/// v1.1.0 release), with its `defs.json` resolved locally: no network, no file retrieval.
pub fn schema_validator(which: &str) -> Validator {
    let dir = fixture("cdi-schema").join(which);
    let read = |name: &str| -> Value {
        serde_json::from_slice(&std::fs::read(dir.join(name)).unwrap()).unwrap()
    };
    let (schema, defs) = (read("schema.json"), read("defs.json"));
    let registry = Registry::new()
        .add(
            "file:///cdi-schema/defs.json",
            Resource::from_contents(defs),
        )
        .unwrap()
        .prepare()
        .unwrap();
    jsonschema::options()
        .with_registry(&registry)
        .with_base_uri("file:///cdi-schema/schema.json")
        .build(&schema)
        .unwrap()
}

/// Both official schemas.
pub fn schema_validators() -> Vec<(&'static str, Validator)> {
    ["schema", "v1.1.0-tag/schema"]
        .into_iter()
        .map(|which| (which, schema_validator(which)))
        .collect()
}

/// Panics with every schema error if `document` (JSON) does not validate.
pub fn assert_schema_valid(validators: &[(&str, Validator)], document: &[u8], what: &str) {
    let instance: Value = serde_json::from_slice(document).unwrap();
    for (which, validator) in validators {
        let errors: Vec<String> = validator
            .iter_errors(&instance)
            .map(|err| format!("{err} at {}", err.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{what} fails {which}: {errors:#?}");
    }
}
