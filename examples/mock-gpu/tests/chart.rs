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
    OpenApi, assert_all_options_documented, assert_helm_mode_certificate, assert_plugin_rules,
    assert_rbac_matches_calls, assert_webhook_shape, chart_dir, describe, env_map, find_kind,
    granted_permissions, helm_or_skip, prepare_good_and_retry_bad_until_event_series, rbac_objects,
    render, requested_permissions, secret_data, tls_handshake, validate_all, values_sets,
    webhook_objects,
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
    // Plain text logs unless `logFormat: json`.
    assert_eq!(env["LOG_FORMAT"]["value"], "text");
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
    // Least privilege: the verbs the SDK's plugin uses, no deletecollection, patch only on
    // Events (their series count).
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
    assert_eq!(rules.len(), 6, "{rules:?}");
    assert_eq!(
        rules[4],
        serde_json::json!({ "apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"],
                            "verbs": ["patch"] })
    );
    assert_eq!(
        rules[5],
        serde_json::json!({ "apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
                            "resourceNames": ["gpu.example.com"], "verbs": ["associated-node:patch"] })
    );
    let daemonset = find_kind(&documents, "DaemonSet");
    let env = env_map(&daemonset["spec"]["template"]["spec"]["containers"][0]);
    assert_eq!(env["DEVICE_STATUS"]["value"], "true");
    assert_eq!(env["LOG_FORMAT"]["value"], "text");
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
        // The kind values enable the webhook: its PodDisruptionBudget is decoded only (the
        // reference OpenAPI documents lack policy/v1).
        let problems = validate_all(&openapi, &format!("{args:?}"), &documents);
        assert!(problems.is_empty(), "{}", problems.join("\n"));
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
    let cases: [(&str, &[&str], &str); 7] = [
        (
            "unknown log format",
            &["--set", "kubeletPlugin.logFormat=xml"],
            "logFormat",
        ),
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

// ---- the validating admission webhook (webhook.enabled) ------------------------------------

const WEBHOOK: &str = "/usr/bin/mock-gpu-webhook";

fn render_webhook(helm: &std::path::Path, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["--set", "webhook.enabled=true"];
    all.extend_from_slice(args);
    render(helm, "mock-gpu", NAMESPACE, &all)
        .unwrap_or_else(|error| panic!("{all:?}: helm template failed:\n{error}"))
}

#[test]
fn the_webhook_is_off_by_default_and_renders_nothing() {
    let Some(helm) = helm_or_skip() else { return };
    let documents = render(&helm, "mock-gpu", NAMESPACE, &[]).unwrap();
    assert!(webhook_objects(&documents).is_empty());
    assert!(
        documents
            .iter()
            .all(|d| !describe(d).contains("webhook") && d["kind"] != "Deployment"),
        "{documents:?}"
    );
}

#[test]
fn the_webhook_renders_a_hardened_deployment_its_service_budget_and_configuration() {
    let Some(helm) = helm_or_skip() else { return };
    let openapi = OpenApi::load();
    let documents = render_webhook(&helm, &[]);
    let problems = validate_all(&openapi, "webhook", &documents);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let webhook = assert_webhook_shape(&documents, NAMESPACE, WEBHOOK);
    // Defaults: 2 replicas with a budget, Ignore, 10 s, the driver's name.
    let objects = webhook_objects(&documents);
    let deployment = objects["Deployment"][0];
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert_eq!(objects["PodDisruptionBudget"].len(), 1);
    assert_eq!(webhook["failurePolicy"], "Ignore");
    assert_eq!(webhook["timeoutSeconds"], 10);
    assert_eq!(webhook["name"], "opaque-config.gpu.example.com");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        find_kind(&documents, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["image"],
        "the plugin's image"
    );
    let env = env_map(container);
    assert_eq!(env["DRIVER_NAME"]["value"], "gpu.example.com");
    assert_eq!(env["WEBHOOK_PORT"]["value"], "8443");
    assert_eq!(
        container["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    // Replicas spread across nodes unless the affinity is set.
    let spread =
        &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(
        spread["podAffinityTerm"]["topologyKey"],
        "kubernetes.io/hostname"
    );
    assert_eq!(
        spread["podAffinityTerm"]["labelSelector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    let service = objects["Service"][0];
    assert_eq!(service["spec"]["ports"][0]["port"], 443);
    // The driver name follows `driverName`.
    let renamed = render_webhook(&helm, &["--set", "driverName=gpu.test.example"]);
    let renamed_env = env_map(
        &webhook_objects(&renamed)["Deployment"][0]["spec"]["template"]["spec"]["containers"][0],
    );
    assert_eq!(renamed_env["DRIVER_NAME"]["value"], "gpu.test.example");
}

#[test]
fn the_webhook_settings_are_honoured() {
    let Some(helm) = helm_or_skip() else { return };
    let documents = render_webhook(
        &helm,
        &[
            "--set",
            "webhook.failurePolicy=Fail",
            "--set",
            "webhook.timeoutSeconds=3",
            "--set",
            "webhook.replicas=1",
            "--set",
            "webhook.containerPort=9443",
            "--set",
            "webhook.servicePort=8443",
        ],
    );
    let webhook = assert_webhook_shape(&documents, NAMESPACE, WEBHOOK);
    assert_eq!(webhook["failurePolicy"], "Fail");
    assert_eq!(webhook["timeoutSeconds"], 3);
    assert_eq!(webhook["clientConfig"]["service"]["port"], 8443);
    // One replica: no budget (it would block every drain).
    assert!(!webhook_objects(&documents).contains_key("PodDisruptionBudget"));
    let container =
        &webhook_objects(&documents)["Deployment"][0]["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["ports"][0]["containerPort"], 9443);
    // The all-options file (secret mode, every value set) has the same shape.
    let all = chart_dir().join("ci/all-options-values.yaml");
    let documents = render(&helm, "mock-gpu", NAMESPACE, &["-f", all.to_str().unwrap()]).unwrap();
    let webhook = assert_webhook_shape(&documents, NAMESPACE, WEBHOOK);
    assert_eq!(webhook["name"], "opaque-config.all.gpu.example.com");
}

#[test]
fn helm_mode_generates_a_ca_whose_bundle_verifies_the_serving_certificate() {
    let Some(helm) = helm_or_skip() else { return };
    let documents = render_webhook(&helm, &[]);
    assert_helm_mode_certificate(&documents, NAMESPACE);
    let objects = webhook_objects(&documents);
    assert!(!objects.contains_key("Certificate"));
    assert!(
        objects["ValidatingWebhookConfiguration"][0]["metadata"]["annotations"].is_null(),
        "no cert-manager annotation in helm mode"
    );
    // Extra DNS names are in the certificate too.
    let documents = render_webhook(
        &helm,
        &[
            "--set",
            "webhook.tls.certManager.dnsNames={gpu-webhook.example.com}",
        ],
    );
    let secret = webhook_objects(&documents)["Secret"][0];
    let (cert, key, ca) = (
        secret_data(secret, "tls.crt"),
        secret_data(secret, "tls.key"),
        secret_data(secret, "ca.crt"),
    );
    tls_handshake(&cert, &key, &ca, "gpu-webhook.example.com").unwrap();
}

#[test]
fn cert_manager_mode_renders_an_issuer_a_certificate_and_the_injection_annotation() {
    let Some(helm) = helm_or_skip() else { return };
    let documents = render_webhook(&helm, &["--set", "webhook.tls.mode=cert-manager"]);
    assert_webhook_shape(&documents, NAMESPACE, WEBHOOK);
    let objects = webhook_objects(&documents);
    assert!(
        !objects.contains_key("Secret"),
        "cert-manager writes the Secret"
    );
    let issuer = objects["Issuer"][0];
    assert_eq!(issuer["apiVersion"], "cert-manager.io/v1");
    assert_eq!(issuer["spec"], serde_json::json!({ "selfSigned": {} }));
    let certificate = objects["Certificate"][0];
    let service = objects["Service"][0]["metadata"]["name"].as_str().unwrap();
    let secret_name =
        &objects["Deployment"][0]["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"];
    assert_eq!(&certificate["spec"]["secretName"], secret_name);
    assert_eq!(
        certificate["spec"]["issuerRef"],
        serde_json::json!({ "group": "cert-manager.io", "kind": "Issuer",
                            "name": issuer["metadata"]["name"] })
    );
    let names = certificate["spec"]["dnsNames"].as_array().unwrap();
    assert!(
        names.contains(&Value::from(format!("{service}.{NAMESPACE}.svc"))),
        "{names:?}"
    );
    let configuration = objects["ValidatingWebhookConfiguration"][0];
    assert_eq!(
        configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        format!(
            "{NAMESPACE}/{}",
            certificate["metadata"]["name"].as_str().unwrap()
        )
    );
    assert!(configuration["webhooks"][0]["clientConfig"]["caBundle"].is_null());
    // An existing ClusterIssuer instead of the chart's.
    let documents = render_webhook(
        &helm,
        &[
            "--set",
            "webhook.tls.mode=cert-manager",
            "--set",
            "webhook.tls.certManager.issuerType=clusterissuer",
            "--set",
            "webhook.tls.certManager.issuerName=cluster-ca",
        ],
    );
    let objects = webhook_objects(&documents);
    assert!(!objects.contains_key("Issuer"));
    assert_eq!(
        objects["Certificate"][0]["spec"]["issuerRef"],
        serde_json::json!({ "group": "cert-manager.io", "kind": "ClusterIssuer", "name": "cluster-ca" })
    );
}

/// A base64 PEM bundle, as `base64 -w0 ca.crt` gives.
const CA_BUNDLE: &str =
    "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJ0ZXN0Ci0tLS0tRU5EIENFUlRJRklDQVRFLS0tLS0K";

#[test]
fn secret_mode_mounts_the_users_secret_and_uses_its_ca_bundle() {
    let Some(helm) = helm_or_skip() else { return };
    let documents = render_webhook(
        &helm,
        &[
            "--set",
            "webhook.tls.mode=secret",
            "--set",
            "webhook.tls.secret.name=my-webhook-tls",
            "--set",
            &format!("webhook.tls.secret.caBundle={CA_BUNDLE}"),
        ],
    );
    let webhook = assert_webhook_shape(&documents, NAMESPACE, WEBHOOK);
    let objects = webhook_objects(&documents);
    assert!(!objects.contains_key("Secret") && !objects.contains_key("Certificate"));
    assert_eq!(webhook["clientConfig"]["caBundle"], CA_BUNDLE);
    assert_eq!(
        objects["Deployment"][0]["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"],
        "my-webhook-tls"
    );
}

#[test]
fn the_webhook_leaves_the_plugins_rbac_unchanged() {
    let Some(helm) = helm_or_skip() else { return };
    let rbac = rbac_objects;
    for args in [&[][..], &["--set", "kubeletPlugin.deviceStatus=true"][..]] {
        let without = render(&helm, "mock-gpu", NAMESPACE, args).unwrap();
        let mut with_args = args.to_vec();
        with_args.extend(["--set", "webhook.enabled=true"]);
        let with = render(&helm, "mock-gpu", NAMESPACE, &with_args).unwrap();
        assert_eq!(rbac(&without), rbac(&with), "{args:?}");
        assert!(!rbac(&with).is_empty());
    }
}

#[test]
fn bad_webhook_values_fail_with_a_clear_message() {
    let Some(helm) = helm_or_skip() else { return };
    let bundle = format!("webhook.tls.secret.caBundle={CA_BUNDLE}");
    let cases: &[(&str, &[&str], &str)] = &[
        (
            "secret without a name",
            &["webhook.tls.mode=secret", &bundle],
            "webhook.tls.secret.name is required",
        ),
        (
            "secret without a bundle",
            &["webhook.tls.mode=secret", "webhook.tls.secret.name=tls"],
            "webhook.tls.secret.caBundle is required",
        ),
        (
            "a bundle that is no PEM",
            &[
                "webhook.tls.mode=secret",
                "webhook.tls.secret.name=tls",
                "webhook.tls.secret.caBundle=bm90IGEgY2VydA==",
            ],
            "webhook.tls.secret.caBundle must be the base64 encoding of PEM certificates",
        ),
        (
            "an issuer without a name",
            &[
                "webhook.tls.mode=cert-manager",
                "webhook.tls.certManager.issuerType=issuer",
            ],
            "webhook.tls.certManager.issuerName is required",
        ),
        (
            "a privileged port",
            &["webhook.containerPort=443"],
            "cannot listen on a port below 1024",
        ),
        (
            "an unknown failure policy",
            &["webhook.failurePolicy=Deny"],
            "failurePolicy",
        ),
        ("an unknown TLS mode", &["webhook.tls.mode=self"], "mode"),
        (
            "a long timeout",
            &["webhook.timeoutSeconds=31"],
            "timeoutSeconds",
        ),
        ("an unknown key", &["webhook.replica=3"], "replica"),
        (
            "no service account",
            &["webhook.serviceAccount.create=false"],
            "webhook.serviceAccount.name is required",
        ),
    ];
    for (what, sets, expected) in cases {
        let mut args = vec!["--set", "webhook.enabled=true"];
        for set in *sets {
            args.extend(["--set", set]);
        }
        let error = render(&helm, "mock-gpu", NAMESPACE, &args)
            .err()
            .unwrap_or_else(|| panic!("{what}: rendered"));
        assert!(error.contains(expected), "{what}: {error}");
    }
}

#[test]
fn the_webhook_env_names_flags_of_the_webhook_binary() {
    // Every variable the Deployment sets (all values sets with the webhook on) is one of
    // mock-gpu-webhook's flags, except its log filter.
    let Some(helm) = helm_or_skip() else { return };
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_mock-gpu-webhook"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let all = chart_dir().join("ci/all-options-values.yaml");
    for args in [
        vec!["--set", "webhook.enabled=true"],
        vec!["-f", all.to_str().unwrap()],
    ] {
        let documents = render(&helm, "mock-gpu", NAMESPACE, &args).unwrap();
        let deployment = webhook_objects(&documents)["Deployment"][0];
        let env = env_map(&deployment["spec"]["template"]["spec"]["containers"][0]);
        assert!(env.contains_key("DRIVER_NAME"));
        for variable in env.keys().filter(|v| *v != "RUST_LOG") {
            assert!(
                help.contains(&format!("[env: {variable}=")),
                "{args:?}: {variable} is not a flag's variable:\n{help}"
            );
        }
    }
}

/// The plugin container's security context is the least the mock plugin needs: root only to
/// write the root-owned host directories (registration socket, plugins directory, CDI
/// specs), and nothing else: not privileged, no capability, no privilege escalation, a
/// read-only root filesystem, the runtime's default seccomp profile, no host namespaces.
#[test]
fn the_mock_plugin_runs_unprivileged_with_every_capability_dropped() {
    let Some(helm) = helm_or_skip() else { return };
    // The defaults and the CI values files, except the one that sets every option to a
    // non-default value (a user may widen the context; the chart does not).
    for (name, args) in values_sets()
        .into_iter()
        .filter(|(name, _)| name != "all-options-values.yaml")
    {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let documents = render(&helm, "mock-gpu", NAMESPACE, &args).unwrap();
        let pod = &find_kind(&documents, "DaemonSet")["spec"]["template"]["spec"];
        for namespace in ["hostPID", "hostIPC", "hostNetwork"] {
            assert!(
                pod[namespace].is_null() || pod[namespace] == false,
                "{name}: {namespace}"
            );
        }
        let containers = pod["containers"].as_array().unwrap();
        assert_eq!(containers.len(), 1, "{name}");
        let security = &containers[0]["securityContext"];
        assert_eq!(
            security,
            &serde_json::json!({
                "runAsUser": 0,
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "capabilities": { "drop": ["ALL"] },
                "seccompProfile": { "type": "RuntimeDefault" },
            }),
            "{name}"
        );
        // Only the kubelet's directories and the CDI root come from the host.
        for volume in pod["volumes"].as_array().unwrap() {
            if let Some(path) = volume["hostPath"]["path"].as_str() {
                assert!(
                    ["plugins_registry", "plugins", "cdi"]
                        .iter()
                        .any(|dir| path.ends_with(dir)),
                    "{name}: hostPath {path}"
                );
            }
        }
    }
}

/// The plugin's ClusterRole grants exactly the API calls the plugin makes: the mock driver
/// runs in process (device status on, as `kubeletPlugin.deviceStatus=true` renders its
/// rules) against the fake API server through every path that calls the API (first publish
/// deleting a stale slice, a slice update, claim reads, status patches, a failing claim's
/// Event and its series patch, unprepare), and the requests the server counted are compared
/// with the rendered rules both ways.
#[tokio::test]
async fn the_plugins_rbac_rules_are_exactly_the_calls_it_makes() {
    use dra_sdk_testing::claims::AllocatedClaim;
    use dra_sdk_testing::cluster::{NODE_NAME, TestCluster, claim_ref};
    use dra_sdk_testing::kubelet::KubeletVersion;
    use k8s_openapi::api::resource::v1::ResourceSlice;
    use mock_gpu::{DEFAULT_DRIVER_NAME, MockGpuDriver};

    let Some(helm) = helm_or_skip() else { return };
    let documents = render(
        &helm,
        "mock-gpu",
        NAMESPACE,
        &["--set", "kubeletPlugin.deviceStatus=true"],
    )
    .unwrap();
    let account = find_kind(&documents, "ServiceAccount")["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let granted = granted_permissions(&documents, &account);

    let cluster = TestCluster::start().await.unwrap();
    // A slice an earlier run left for a pool the node no longer has: the first publish
    // deletes it.
    let stale: ResourceSlice = serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": { "name": "stale-slice" },
        "spec": { "driver": DEFAULT_DRIVER_NAME, "nodeName": NODE_NAME,
                  "pool": { "name": "gone", "generation": 1, "resourceSliceCount": 1 },
                  "devices": [{ "name": "gpu-9" }] },
    }))
    .unwrap();
    cluster.api().insert(&stale).unwrap();
    let client = cluster.client();
    let good = AllocatedClaim::new("default", "good")
        .device("gpu", DEFAULT_DRIVER_NAME, NODE_NAME, "gpu-0")
        .create(&client)
        .await
        .unwrap();
    let bad = AllocatedClaim::new("default", "bad")
        .device("gpu", DEFAULT_DRIVER_NAME, NODE_NAME, "gpu-1")
        .claim_config(
            &["gpu"],
            DEFAULT_DRIVER_NAME,
            serde_json::json!({ "apiVersion": "gpu.resource.example.com/v1alpha1",
                                "kind": "GpuConfig", "sharing": 7 }),
        )
        .create(&client)
        .await
        .unwrap();
    let (good, bad) = (claim_ref(&good).unwrap(), claim_ref(&bad).unwrap());
    // From here on only the plugin talks to the API server over HTTP.
    cluster.api().reset_stats();

    let driver = MockGpuDriver::new(DEFAULT_DRIVER_NAME, NODE_NAME, 2).with_device_status(true);
    let plugin = cluster
        .plugin(driver.clone(), DEFAULT_DRIVER_NAME)
        .resources(driver.resources())
        .start()
        .await
        .unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(20), plugin.published())
        .await
        .expect("the first publish");
    let kubelet = cluster
        .register(&plugin, KubeletVersion::V1_36)
        .await
        .unwrap();
    // A failing claim: its Event is created, a retry patches the Event's series.
    prepare_good_and_retry_bad_until_event_series(&kubelet, cluster.api(), &good, &bad).await;
    // A changed GPU: its slice is updated.
    let updates = cluster.api().stats().resource("resourceslices").update;
    driver
        .update_gpu(0, |gpu| {
            gpu.memory = dra_sdk::slices::Quantity("40Gi".into())
        })
        .unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while cluster.api().stats().resource("resourceslices").update == updates {
        assert!(tokio::time::Instant::now() < deadline, "no slice update");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let unprepared = kubelet
        .unprepare(std::slice::from_ref(&good))
        .await
        .unwrap();
    assert!(unprepared[&good.uid].is_ok(), "{unprepared:?}");
    let slices: Vec<ResourceSlice> = cluster.api().list().unwrap();
    assert!(
        slices
            .iter()
            .all(|s| s.metadata.name.as_deref() != Some("stale-slice")),
        "the stale slice was deleted"
    );
    plugin.shutdown().await.unwrap();

    let requested = requested_permissions(&cluster.api().stats()).unwrap();
    assert_rbac_matches_calls("mock-gpu-driver", &granted, &requested);
}
