//! The Helm chart (`deploy/helm/mock-gpu-driver`), rendered by `helm template` with the
//! default values and with every values file under its `ci/` directory: every object passes
//! the strict field validation of a v1.36.2 API server's OpenAPI documents (unknown fields are
//! errors) and decodes into its `k8s-openapi` type without losing a field; the DaemonSet's
//! environment names flags the plugin binary has; `ci/all-options-values.yaml` sets every
//! documented value; bad values fail with a clear message. Needs `HELM` (see `.ci/tools`).

mod support;

use std::collections::BTreeSet;

use serde_json::Value;
use support::chart::{
    OpenApi, chart_dir, decode, describe, helm_or_skip, leaves, render, values_sets, yaml,
};

const NAMESPACE: &str = "dra-mock-gpu";

#[test]
fn every_rendered_object_is_valid_for_the_api_server() {
    let Some(helm) = helm_or_skip() else { return };
    let openapi = OpenApi::load();
    let mut problems = Vec::new();
    for (name, args) in values_sets() {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let documents = render(&helm, "mock-gpu", NAMESPACE, &args)
            .unwrap_or_else(|error| panic!("{name}: helm template failed:\n{error}"));
        assert!(!documents.is_empty(), "{name}: nothing rendered");
        for document in &documents {
            let what = format!("{name}: {}", describe(document));
            problems.extend(
                openapi
                    .check(document)
                    .into_iter()
                    .map(|p| format!("{what}: OpenAPI: {p}")),
            );
            problems.extend(
                decode(document)
                    .into_iter()
                    .map(|p| format!("{what}: decode: {p}")),
            );
            // Namespaced objects carry the release namespace, so the output applies as is.
            let kind = document["kind"].as_str().unwrap_or_default();
            if ["ServiceAccount", "DaemonSet", "Service"].contains(&kind) {
                assert_eq!(document["metadata"]["namespace"], NAMESPACE, "{what}");
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_defaults_render_what_the_readme_lists() {
    let Some(helm) = helm_or_skip() else { return };
    let documents = render(&helm, "mock-gpu", NAMESPACE, &[]).unwrap();
    let kinds: BTreeSet<&str> = documents
        .iter()
        .filter_map(|d| d["kind"].as_str())
        .collect();
    let expected: BTreeSet<&str> = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "DeviceClass",
        "DaemonSet",
        "Service",
    ]
    .into();
    assert_eq!(kinds, expected);
    let daemonset = documents.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let spec = &daemonset["spec"];
    assert_eq!(spec["updateStrategy"]["rollingUpdate"]["maxSurge"], 1);
    assert_eq!(spec["updateStrategy"]["rollingUpdate"]["maxUnavailable"], 0);
    let container = &spec["template"]["spec"]["containers"][0];
    for probe in ["livenessProbe", "startupProbe"] {
        assert_eq!(container[probe]["grpc"]["port"], 51515, "{probe}");
    }
    let env = env_map(container);
    assert_eq!(
        env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
    assert_eq!(
        env["POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.uid"
    );
    let paths: BTreeSet<&str> = spec["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["hostPath"]["path"].as_str())
        .collect();
    assert_eq!(
        paths,
        [
            "/var/lib/kubelet/plugins_registry",
            "/var/lib/kubelet/plugins",
            "/var/run/cdi"
        ]
        .into()
    );
    // Least privilege: the verbs the SDK's plugin uses, no patch, no deletecollection.
    let role = documents
        .iter()
        .find(|d| d["kind"] == "ClusterRole")
        .unwrap();
    let rules: Vec<(String, Vec<String>)> = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|rule| {
            (
                rule["resources"][0].as_str().unwrap().to_owned(),
                serde_json::from_value(rule["verbs"].clone()).unwrap(),
            )
        })
        .collect();
    let owned = |r: &str, v: &[&str]| (r.to_owned(), v.iter().map(|s| (*s).to_owned()).collect());
    assert_eq!(
        rules,
        vec![
            owned("resourceclaims", &["get"]),
            owned(
                "resourceslices",
                &["list", "watch", "create", "update", "delete"]
            ),
            owned("nodes", &["get"]),
        ]
    );
}

/// `deviceStatus: true` adds exactly what the status write needs on Kubernetes 1.36: `patch`
/// (server-side apply) on the status, and the node-scoped verb on the synthetic `driver`
/// subresource for this driver's name only.
#[test]
fn device_status_adds_exactly_the_status_rules() {
    let Some(helm) = helm_or_skip() else { return };
    let documents = render(
        &helm,
        "mock-gpu",
        NAMESPACE,
        &["--set", "kubeletPlugin.deviceStatus=true"],
    )
    .unwrap();
    let role = documents
        .iter()
        .find(|d| d["kind"] == "ClusterRole")
        .unwrap();
    let rules = role["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 5, "{rules:?}");
    assert_eq!(
        rules[3],
        serde_json::json!({ "apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"],
                            "verbs": ["patch"] })
    );
    assert_eq!(
        rules[4],
        serde_json::json!({ "apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
                            "resourceNames": ["gpu.example.com"], "verbs": ["associated-node:patch"] })
    );
    let daemonset = documents.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
    let env = env_map(&daemonset["spec"]["template"]["spec"]["containers"][0]);
    assert_eq!(env["DEVICE_STATUS"]["value"], "true");
    assert_eq!(env["DEVICE_METADATA"]["value"], "false");
}

fn env_map(container: &Value) -> std::collections::BTreeMap<String, Value> {
    container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["name"].as_str().unwrap().to_owned(), v.clone()))
        .collect()
}

#[test]
fn the_daemonset_env_names_flags_of_the_plugin() {
    let Some(helm) = helm_or_skip() else { return };
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_mock-gpu-kubelet-plugin"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for (name, args) in values_sets() {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let documents = render(&helm, "mock-gpu", NAMESPACE, &args).unwrap();
        let daemonset = documents.iter().find(|d| d["kind"] == "DaemonSet").unwrap();
        for variable in env_map(&daemonset["spec"]["template"]["spec"]["containers"][0]).keys() {
            if variable == "RUST_LOG" {
                continue;
            }
            assert!(
                help.contains(&format!("[env: {variable}=")),
                "{name}: {variable} is not a flag's variable:\n{help}"
            );
        }
    }
}

#[test]
fn all_options_sets_every_value_and_the_readme_documents_each() {
    let defaults = yaml(&chart_dir().join("values.yaml"));
    let all = yaml(&chart_dir().join("ci/all-options-values.yaml"));
    let readme = std::fs::read_to_string(chart_dir().join("README.md")).unwrap();
    let mut default_leaves = BTreeSet::new();
    leaves(&defaults, "", &mut default_leaves);
    let mut set = BTreeSet::new();
    leaves(&all, "", &mut set);
    for leaf in &default_leaves {
        // A map value (updateStrategy, probes, securityContext) is documented as a whole.
        let documented = leaf
            .match_indices('.')
            .map(|(at, _)| &leaf[..at])
            .chain([leaf.as_str()])
            .any(|prefix| readme.contains(&format!("| `{prefix}` |")));
        assert!(
            documented,
            "values.yaml's {leaf} is not in the README's table"
        );
        let covered = set
            .iter()
            .any(|s| s == leaf || s.starts_with(&format!("{leaf}.")))
            || leaf
                .match_indices('.')
                .any(|(at, _)| set.contains(&leaf[..at]));
        // featureGates has no accepted value but the empty map, which the file sets.
        assert!(covered, "ci/all-options-values.yaml does not set {leaf}");
    }
    let schema: Value =
        serde_json::from_slice(&std::fs::read(chart_dir().join("values.schema.json")).unwrap())
            .unwrap();
    assert_eq!(schema["additionalProperties"], false);
}

#[test]
fn the_device_classes_are_the_drivers_own() {
    // The chart's DeviceClasses select what `mock_gpu::classes` selects (the classes the
    // embedded-cluster demos run with), with and without partitions, and the kind
    // walkthrough's values render valid objects (the first test covers `ci/` only).
    let Some(helm) = helm_or_skip() else { return };
    let kind_values = chart_dir().join("../../../../kind/driver-values.yaml");
    let kind_values = kind_values.to_str().unwrap();
    let openapi = OpenApi::load();
    for (args, partitions) in [
        (vec![], 0),
        (vec!["--set", "kubeletPlugin.gpuPartitions=3"], 3),
        (vec!["--values", kind_values], 4),
    ] {
        let documents = render(&helm, "mock-gpu", NAMESPACE, &args).unwrap();
        for document in &documents {
            assert!(openapi.check(document).is_empty(), "{args:?}: {document}");
        }
        let rendered: Vec<(Value, Value)> = documents
            .iter()
            .filter(|d| d["kind"] == "DeviceClass")
            .map(|d| {
                (
                    d["metadata"]["name"].clone(),
                    d["spec"]["selectors"].clone(),
                )
            })
            .collect();
        let options = mock_gpu::PublishOptions {
            partitions,
            ..Default::default()
        };
        let expected: Vec<(Value, Value)> =
            mock_gpu::classes::device_classes(mock_gpu::DEFAULT_DRIVER_NAME, options)
                .into_iter()
                .map(|class| {
                    let class = serde_json::to_value(class).unwrap();
                    (
                        class["metadata"]["name"].clone(),
                        class["spec"]["selectors"].clone(),
                    )
                })
                .collect();
        assert_eq!(rendered, expected, "{args:?}");
    }
}

#[test]
fn bad_values_fail_with_a_clear_message() {
    let Some(helm) = helm_or_skip() else { return };
    let cases: [(&str, &[&str], &str); 6] = [
        ("default namespace", &[], "default namespace is refused"),
        (
            "feature gate",
            &["--set", "featureGates.TimeSlicingSettings=true"],
            "featureGates",
        ),
        (
            "unknown value",
            &["--set", "kubeletPlugin.numDevice=4"],
            "numDevice",
        ),
        (
            "wrong type",
            &["--set", "kubeletPlugin.containers.plugin.metricsPort=http"],
            "metricsPort",
        ),
        (
            "too many partitions",
            &["--set", "kubeletPlugin.gpuPartitions=101"],
            "gpuPartitions",
        ),
        (
            "no service account",
            &["--set", "serviceAccount.create=false"],
            "serviceAccount.name is required",
        ),
    ];
    for (what, args, expected) in cases {
        let namespace = if what == "default namespace" {
            "default"
        } else {
            NAMESPACE
        };
        let error = render(&helm, "mock-gpu", namespace, args)
            .err()
            .unwrap_or_else(|| panic!("{what}: rendered"));
        assert!(error.contains(expected), "{what}: {error}");
    }
}
