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
    OpenApi, assert_all_options_documented, assert_plugin_rules, chart_dir, describe, env_map,
    find_kind, helm_or_skip, render, validate_all, values_sets,
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
        problems.extend(validate_all(&openapi, &name, &documents));
        for document in &documents {
            let what = format!("{name}: {}", describe(document));
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
    let daemonset = find_kind(&documents, "DaemonSet");
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
    assert_plugin_rules(find_kind(&documents, "ClusterRole"));
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
    let role = find_kind(&documents, "ClusterRole");
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
    let daemonset = find_kind(&documents, "DaemonSet");
    let env = env_map(&daemonset["spec"]["template"]["spec"]["containers"][0]);
    assert_eq!(env["DEVICE_STATUS"]["value"], "true");
    assert_eq!(env["DEVICE_METADATA"]["value"], "false");
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
        let daemonset = find_kind(&documents, "DaemonSet");
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
    // A map value (updateStrategy, probes, securityContext) is documented as a whole;
    // featureGates has no accepted value but the empty map, which the file sets.
    assert_all_options_documented(&chart_dir());
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
