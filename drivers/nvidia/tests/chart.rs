//! The Helm chart (`deploy/helm/dra-driver-nvidia-gpu`), rendered by `helm template` with
//! each values file under its `ci/` directory: every object passes the strict field validation
//! of a v1.36.2 API server's OpenAPI documents (unknown fields are errors) and decodes into its
//! `k8s-openapi` type without losing a field; the DaemonSet's environment names flags of the
//! built `gpu-kubelet-plugin` and parses as its command line; the DeviceClasses are the driver
//! crate's; `ci/all-options-values.yaml` sets every documented value; the defaults (as
//! upstream), ComputeDomains and bad values fail with a clear message; the admission webhook
//! (`webhook.enabled`, upstream's keys) renders in each TLS mode, and nothing of it by default. Needs
//! `HELM` (see `.ci/tools`); skips without it unless `HELM_REQUIRED=1`. Also the image the
//! chart deploys (`drivers/nvidia/Dockerfile`), without a container engine: its build command
//! and the path its final stage copies.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::{CommandFactory as _, Parser as _};
use dra_driver_nvidia::devices::device_classes;
use dra_driver_nvidia::plugin::Cli;
use dra_sdk_testing::assert_contains;
// The image the chart deploys is checked here too: one test binary less to link.
use dra_sdk_testing::deliverables::{chart as shared, dockerfile};
use serde_json::{Value, json};
use shared::{
    OpenApi, assert_plugin_rules, assert_rbac_matches_calls, describe, env_map, find_kind as find,
    granted_permissions, helm_or_skip, prepare_good_and_retry_bad_until_event_series, render_chart,
    requested_permissions, validate_all,
};

const NAMESPACE: &str = "nvidia-dra-driver-gpu";
const RELEASE: &str = "nvidia-dra";
/// What the chart refuses its bare defaults with, as upstream does.
const OVERRIDE_NEEDED: &str = "resources.gpus.enabled=true needs gpuResourcesEnabledOverride=true";
/// Variables the DaemonSet sets that are not the plugin's flags: its log filter, and the NVIDIA
/// container runtime's (where it is the node's default runtime; the last one is the extra
/// `kubeletPlugin.containers.gpus.env` of `ci/all-options-values.yaml`).
const NOT_FLAGS: [&str; 4] = [
    "RUST_LOG",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_MIG_CONFIG_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
];

fn chart_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/helm/dra-driver-nvidia-gpu")
}

fn render(helm: &Path, args: &[&str]) -> Result<Vec<Value>, String> {
    render_chart(helm, &chart_dir(), RELEASE, NAMESPACE, args)
}

/// The values files CI renders: each file of `ci/` (the bare defaults are refused, see
/// `the_defaults_are_refused_as_upstream`).
fn values_files() -> Vec<(String, Vec<String>)> {
    shared::values_sets(&chart_dir())
        .into_iter()
        .filter(|(name, _)| name != "defaults")
        .collect()
}

fn rendered(helm: &Path, file: &str) -> Vec<Value> {
    let path = chart_dir().join("ci").join(file);
    render(helm, &["-f", &path.display().to_string()])
        .unwrap_or_else(|error| panic!("{file}: helm template failed:\n{error}"))
}

fn container(documents: &[Value]) -> &Value {
    &find(documents, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
}

fn pod_spec(documents: &[Value]) -> &Value {
    &find(documents, "DaemonSet")["spec"]["template"]["spec"]
}

fn named<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_array()
        .and_then(|items| items.iter().find(|item| item["name"] == name))
        .unwrap_or_else(|| panic!("no {name:?} in {list}"))
}

fn mount<'a>(container: &'a Value, name: &str) -> &'a Value {
    named(&container["volumeMounts"], name)
}

fn volume<'a>(pod: &'a Value, name: &str) -> &'a Value {
    named(&pod["volumes"], name)
}

#[test]
fn every_rendered_object_is_valid_for_the_api_server() {
    let Some(helm) = helm_or_skip() else { return };
    let openapi = OpenApi::load();
    let mut problems = Vec::new();
    let sets = values_files();
    assert!(sets.len() >= 4, "ci/ lost a values file: {sets:?}");
    for (name, args) in sets {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let documents =
            render(&helm, &args).unwrap_or_else(|error| panic!("{name}: helm template:\n{error}"));
        assert!(!documents.is_empty(), "{name}: nothing rendered");
        problems.extend(validate_all(&openapi, &name, &documents));
        for document in &documents {
            // Namespaced objects carry the release namespace, so the output applies as is.
            let kind = document["kind"].as_str().unwrap_or_default();
            if [
                "ServiceAccount",
                "DaemonSet",
                "Service",
                "Role",
                "RoleBinding",
                "Deployment",
                "PodDisruptionBudget",
                "Secret",
            ]
            .contains(&kind)
            {
                assert_eq!(
                    document["metadata"]["namespace"],
                    NAMESPACE,
                    "{name}: {}",
                    describe(document)
                );
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_defaults_are_refused_as_upstream() {
    let Some(helm) = helm_or_skip() else { return };
    let error = render(&helm, &[]).expect_err("the bare defaults rendered");
    assert_contains(&error, OVERRIDE_NEEDED);
    // With GPUs off there is nothing to guard, and nothing to install.
    let documents = render(&helm, &["--set", "resources.gpus.enabled=false"]).unwrap();
    assert!(documents.is_empty(), "{documents:?}");
}

/// `kubeletPlugin.logFormat` reaches both containers that run the plugin binary (the one that
/// waits for the driver logs too), and only `text` or `json` is accepted.
#[test]
fn log_format_reaches_both_plugin_containers_and_is_checked() {
    let Some(helm) = helm_or_skip() else { return };
    let documents = render(
        &helm,
        &[
            "--set",
            "gpuResourcesEnabledOverride=true",
            "--set",
            "kubeletPlugin.logFormat=json",
        ],
    )
    .unwrap();
    let pod = pod_spec(&documents);
    assert_eq!(
        env_map(container(&documents))["LOG_FORMAT"]["value"],
        "json"
    );
    assert_eq!(
        env_map(&pod["initContainers"][0])["LOG_FORMAT"]["value"],
        "json"
    );
    let error = render(
        &helm,
        &[
            "--set",
            "gpuResourcesEnabledOverride=true",
            "--set",
            "kubeletPlugin.logFormat=xml",
        ],
    )
    .expect_err("an unknown log format rendered");
    assert_contains(&error, "logFormat");
}

#[test]
fn the_defaults_render_what_the_readme_lists() {
    let Some(helm) = helm_or_skip() else { return };
    let documents = rendered(&helm, "defaults-values.yaml");
    let kinds: BTreeMap<&str, usize> = documents.iter().filter_map(|d| d["kind"].as_str()).fold(
        BTreeMap::new(),
        |mut counts, kind| {
            *counts.entry(kind).or_default() += 1;
            counts
        },
    );
    let expected: BTreeMap<&str, usize> = [
        ("ServiceAccount", 1),
        ("ClusterRole", 1),
        ("ClusterRoleBinding", 1),
        ("ValidatingAdmissionPolicy", 1),
        ("ValidatingAdmissionPolicyBinding", 1),
        ("DeviceClass", 3),
        ("DaemonSet", 1),
        ("Service", 1),
    ]
    .into();
    assert_eq!(kinds, expected);

    let spec = &find(&documents, "DaemonSet")["spec"];
    assert_eq!(spec["updateStrategy"]["rollingUpdate"]["maxSurge"], 1);
    assert_eq!(spec["updateStrategy"]["rollingUpdate"]["maxUnavailable"], 0);
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert_eq!(pod["tolerations"][0]["key"], "nvidia.com/gpu");
    let container = container(&documents);
    assert_eq!(container["command"][0], "gpu-kubelet-plugin");
    for probe in ["livenessProbe", "startupProbe"] {
        assert_eq!(container[probe]["grpc"]["port"], 51516, "{probe}");
    }
    let env = env_map(container);
    for (variable, field) in [
        ("NODE_NAME", "spec.nodeName"),
        ("POD_UID", "metadata.uid"),
        ("NAMESPACE", "metadata.namespace"),
    ] {
        assert_eq!(
            env[variable]["valueFrom"]["fieldRef"]["fieldPath"], field,
            "{variable}"
        );
    }
    assert_eq!(env["NVIDIA_DRIVER_ROOT"]["value"], "/");
    assert_eq!(env["HEALTHCHECK_PORT"]["value"], "51516");
    assert_eq!(env["HTTP_ENDPOINT"]["value"], ":8080");
    assert_eq!(env["RUST_LOG"]["value"], "info");
    assert_eq!(env["LOG_FORMAT"]["value"], "text");
    assert!(!env.contains_key("MOCK_PROFILE") && !env.contains_key("HOST_ROOT"));

    // Host paths, and the driver root where the plugin looks for it.
    let volumes: BTreeMap<&str, &str> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| Some((v["name"].as_str()?, v["hostPath"]["path"].as_str()?)))
        .collect();
    assert_eq!(
        volumes,
        [
            ("plugins-registry", "/var/lib/kubelet/plugins_registry"),
            ("plugins", "/var/lib/kubelet/plugins"),
            ("cdi", "/var/run/cdi"),
            ("driver-root-parent", "/"),
        ]
        .into()
    );
    let mounts: BTreeMap<&str, &str> = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| Some((m["name"].as_str()?, m["mountPath"].as_str()?)))
        .collect();
    // `/` is its own parent: the root in the container is the mount itself.
    assert_eq!(
        env["DRIVER_ROOT_CTR_PATH"]["value"].as_str(),
        Some(mounts["driver-root-parent"])
    );
    assert_eq!(
        mount(container, "driver-root-parent")["mountPropagation"],
        "HostToContainer"
    );
    assert_eq!(
        volume(pod, "driver-root-parent")["hostPath"]["type"],
        "Directory"
    );
    // Without MPSSupport the plugins directory does not propagate.
    assert!(
        mount(container, "plugins")
            .get("mountPropagation")
            .is_none()
    );
    assert_eq!(
        env["CDI_ROOT"]["value"].as_str(),
        Some(mounts["cdi"]),
        "the plugin writes CDI specs where the host's CDI root is mounted"
    );

    // Least privilege: the verbs the SDK's plugin uses, no patch, no deletecollection.
    assert_plugin_rules(find(&documents, "ClusterRole"));
    let policy = find(&documents, "ValidatingAdmissionPolicy");
    let text = policy.to_string();
    assert_contains(&text, "authentication.kubernetes.io/node-name");
    assert_contains(&text, "s.spec.driver == \\\"gpu.nvidia.com\\\"");
}

#[test]
fn mps_gets_a_role_for_its_daemon_deployments_in_the_release_namespace_only() {
    let Some(helm) = helm_or_skip() else { return };
    // Without MPSSupport: no Role (the defaults' kinds are checked above).
    let defaults = rendered(&helm, "defaults-values.yaml");
    assert!(!defaults.iter().any(|d| d["kind"] == "Role"));
    let all = rendered(&helm, "all-options-values.yaml");
    let role = find(&all, "Role");
    assert_eq!(role["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        role["rules"],
        serde_json::json!([
            {"apiGroups": ["apps"], "resources": ["deployments"],
             "verbs": ["create", "get", "list", "delete"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        ])
    );
    // The ClusterRole does not grow: Deployments are namespaced to the plugin's own.
    let cluster_role = find(&all, "ClusterRole").to_string();
    assert!(!cluster_role.contains("deployments"), "{cluster_role}");
    let binding = find(&all, "RoleBinding");
    assert_eq!(binding["metadata"]["namespace"], NAMESPACE);
    assert_eq!(binding["roleRef"]["kind"], "Role");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(
        binding["subjects"][0]["name"],
        find(&all, "ServiceAccount")["metadata"]["name"]
    );
    // The plugin creates them in its own namespace with its own image.
    let env = env_map(container(&all));
    assert_eq!(
        env["NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    assert!(
        env["IMAGE_NAME"]["value"]
            .as_str()
            .is_some_and(|image| !image.is_empty())
    );
    let gates = env["FEATURE_GATES"]["value"].as_str().unwrap();
    assert_contains(gates, "MPSSupport=true");
    // The daemons' shm tmpfs, mounted under the plugins directory, must reach the host.
    assert_eq!(
        mount(container(&all), "plugins")["mountPropagation"],
        "Bidirectional"
    );
    assert_eq!(container(&all)["securityContext"]["privileged"], true);
}

#[test]
fn the_device_classes_are_the_driver_crates() {
    let Some(helm) = helm_or_skip() else { return };
    let documents = rendered(&helm, "defaults-values.yaml");
    let from_chart: Vec<(Value, Value)> = documents
        .iter()
        .filter(|d| d["kind"] == "DeviceClass")
        .map(|d| (d["metadata"]["name"].clone(), d["spec"].clone()))
        .collect();
    let from_crate: Vec<(Value, Value)> = device_classes()
        .into_iter()
        .map(|class| {
            let class = serde_json::to_value(class).unwrap();
            (class["metadata"]["name"].clone(), class["spec"].clone())
        })
        .collect();
    assert_eq!(from_chart, from_crate);
}

/// `--flag` of each environment variable of `gpu-kubelet-plugin`.
fn flags_by_env() -> BTreeMap<String, String> {
    Cli::command()
        .get_arguments()
        .filter_map(|arg| {
            let env = arg.get_env()?.to_string_lossy().into_owned();
            Some((env, format!("--{}", arg.get_long()?)))
        })
        .collect()
}

#[test]
fn the_daemonset_env_is_a_command_line_of_the_plugin() {
    let Some(helm) = helm_or_skip() else { return };
    // The built binary's own help: the image runs this binary, not the library's parser.
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-kubelet-plugin"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let flags = flags_by_env();
    for (name, args) in values_files() {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let documents = render(&helm, &args).unwrap();
        let mut command_line = vec!["gpu-kubelet-plugin".to_owned()];
        for (variable, entry) in env_map(container(&documents)) {
            if NOT_FLAGS.contains(&variable.as_str()) {
                continue;
            }
            assert!(
                help.contains(&format!("[env: {variable}=")),
                "{name}: {variable} is not a flag's variable:\n{help}"
            );
            let flag = &flags[&variable];
            // Downward API values are known on the node only; any value of the right shape.
            let value = match entry["value"].as_str() {
                Some(value) => value.to_owned(),
                None if variable == "POD_UID" => "0b0e7f5c-5a52-4c59-9b1e-0d8d6e1f4a10".to_owned(),
                None => format!("from-{variable}"),
            };
            command_line.push(format!("{flag}={value}"));
        }
        // Values (feature gates, ports, paths) parse as the plugin's flags do.
        if let Err(error) = Cli::try_parse_from(&command_line) {
            panic!("{name}: {command_line:?}: {error}");
        }
    }
}

#[test]
fn mock_mode_and_upstream_values_render_as_documented() {
    let Some(helm) = helm_or_skip() else { return };
    let mock = rendered(&helm, "mock-values.yaml");
    let env = env_map(container(&mock));
    assert_eq!(env["MOCK_PROFILE"]["value"], "dgx-h100");
    let pod = &find(&mock, "DaemonSet")["spec"]["template"]["spec"];
    assert!(pod.get("affinity").is_none() && pod.get("tolerations").is_none());

    let guide = rendered(&helm, "upstream-guide-values.yaml");
    let env = env_map(container(&guide));
    assert_eq!(env["NVIDIA_DRIVER_ROOT"]["value"], "/run/nvidia/driver");
    assert_eq!(
        env["FEATURE_GATES"]["value"],
        "MPSSupport=false,TimeSlicingSettings=true"
    );
    assert_eq!(env["RUST_LOG"]["value"], "debug", "logVerbosity 6");
    // The GPU operator's driver root: its parent is mounted, as upstream, and created if the
    // driver container has not made it yet.
    let pod = pod_spec(&guide);
    let parent = volume(pod, "driver-root-parent");
    assert_eq!(parent["hostPath"]["path"], "/run/nvidia");
    assert_eq!(parent["hostPath"]["type"], "DirectoryOrCreate");
    assert_eq!(
        mount(container(&guide), "driver-root-parent")["mountPath"],
        "/driver-root-parent"
    );
    assert_eq!(
        env["DRIVER_ROOT_CTR_PATH"]["value"],
        "/driver-root-parent/driver"
    );
    assert_eq!(
        container(&guide)["resources"]["requests"]["cpu"],
        "50m",
        "kubeletPlugin.containers.gpus.resources"
    );
    // Nothing of upstream's ComputeDomain side is rendered.
    assert!(guide.iter().all(|d| d["kind"] != "Deployment"));

    // PassthroughSupport mounts the host's root where HOST_ROOT says.
    let passthrough = rendered(&helm, "passthrough-values.yaml");
    assert_eq!(
        env_map(container(&passthrough))["HOST_ROOT"]["value"],
        "/host-root"
    );
    let all = rendered(&helm, "all-options-values.yaml");
    let env = env_map(container(&all));
    assert_eq!(
        env["IMAGE_NAME"]["value"],
        "registry.example.com/dra/gpu-kubelet-plugin:v0.1.0-test"
    );
    assert_eq!(env["IMAGE_NAME"]["value"], container(&all)["image"]);
    assert_eq!(
        env["NVIDIA_CDI_HOOK_PATH"]["value"],
        "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
    );
}

#[test]
fn health_values_become_the_health_flags_and_a_reset_mount() {
    let Some(helm) = helm_or_skip() else { return };
    let all = rendered(&helm, "all-options-values.yaml");
    let env = env_map(container(&all));
    assert_eq!(env["ADDITIONAL_XIDS_TO_IGNORE"]["value"], "94,95");
    assert_eq!(env["HEALTH_RECOVERY_PERIOD"]["value"], "600");
    assert_eq!(
        env["HEALTH_RESET_DIR"]["value"],
        "/var/lib/gpu-health-reset"
    );
    assert!(
        env["FEATURE_GATES"]["value"]
            .as_str()
            .unwrap()
            .contains("NVMLDeviceHealthCheck=true")
    );
    let mount = container(&all)["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "health-reset")
        .unwrap();
    assert_eq!(mount["mountPath"], "/var/lib/gpu-health-reset");
    assert!(
        mount.get("readOnly").is_none(),
        "the plugin deletes reset files"
    );
    let volume = find(&all, "DaemonSet")["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "health-reset")
        .unwrap();
    assert_eq!(volume["hostPath"]["path"], "/var/lib/gpu-health-reset");
    assert_eq!(volume["hostPath"]["type"], "DirectoryOrCreate");

    // The values reach the plugin as its flags: the policy they give is the one it runs.
    let flags = flags_by_env();
    let mut command_line = vec!["gpu-kubelet-plugin".to_owned(), "--node-name=n".to_owned()];
    for variable in [
        "ADDITIONAL_XIDS_TO_IGNORE",
        "HEALTH_RECOVERY_PERIOD",
        "HEALTH_RESET_DIR",
    ] {
        let value = env[variable]["value"].as_str().unwrap();
        command_line.push(format!("{}={value}", flags[variable]));
    }
    let cli = Cli::try_parse_from(&command_line).unwrap();
    assert_eq!(cli.nvidia.health_recovery_period, 600);
    assert_eq!(
        cli.nvidia.health_reset_dir.as_deref(),
        Some(Path::new("/var/lib/gpu-health-reset"))
    );
    assert_eq!(
        dra_driver_nvidia::health::parse_xids(&cli.nvidia.additional_xids_to_ignore).unwrap(),
        vec![94, 95]
    );

    // By default nothing of it is rendered.
    let defaults = render(&helm, &["--set", "gpuResourcesEnabledOverride=true"]).unwrap();
    let env = env_map(container(&defaults));
    for variable in [
        "ADDITIONAL_XIDS_TO_IGNORE",
        "HEALTH_RECOVERY_PERIOD",
        "HEALTH_RESET_DIR",
    ] {
        assert!(!env.contains_key(variable), "{variable}");
    }
}

#[test]
fn all_options_sets_every_value_and_the_readme_documents_each() {
    // A map value (updateStrategy, probes, affinity) is documented as a whole.
    shared::assert_all_options_documented(&chart_dir());
}

#[test]
fn unsupported_and_bad_values_fail_with_a_clear_message() {
    let Some(helm) = helm_or_skip() else { return };
    let ok = ["--set", "gpuResourcesEnabledOverride=true"];
    let cases: [(&str, &[&str], &str); 14] = [
        (
            "MPS without a privileged container",
            &[
                "--set",
                "featureGates.MPSSupport=true",
                "--set",
                "kubeletPlugin.containers.gpus.securityContext.privileged=false",
            ],
            "featureGates.MPSSupport needs kubeletPlugin.containers.gpus.securityContext.privileged=true",
        ),
        (
            "metrics endpoint without a port",
            &["--set", "kubeletPlugin.metrics.gpuHttpEndpoint=localhost"],
            "gpuHttpEndpoint",
        ),
        (
            "unknown resource API version",
            &["--set", "resourceApiVersion=resource.k8s.io/v2"],
            "resourceApiVersion",
        ),
        (
            "compute domains",
            &["--set", "resources.computeDomains.enabled=true"],
            "resources.computeDomains.enabled=true is not supported: this chart installs the GPU \
             kubelet plugin only",
        ),
        (
            "webhook Secret in another namespace",
            &[
                "--set",
                "webhook.enabled=true",
                "--set",
                "webhook.tls.mode=secret",
                "--set",
                "webhook.tls.secret.name=tls",
                "--set",
                "webhook.tls.secret.namespace=elsewhere",
            ],
            "a pod mounts Secrets of its own namespace only",
        ),
        (
            "unknown value",
            &["--set", "kubeletPlugin.numDevices=4"],
            "numDevices",
        ),
        (
            "wrong type",
            &["--set", "kubeletPlugin.containers.gpus.metricsPort=http"],
            "metricsPort",
        ),
        (
            "feature gate value",
            &["--set", "featureGates.TimeSlicingSettings=yes"],
            "TimeSlicingSettings",
        ),
        (
            "no service account",
            &["--set", "serviceAccount.create=false"],
            "serviceAccount.name is required",
        ),
        (
            "health values without the gate",
            &["--set", "kubeletPlugin.health.recoveryPeriodSeconds=60"],
            "kubeletPlugin.health.* is used only with the NVMLDeviceHealthCheck feature gate",
        ),
        (
            "passthrough with health checks",
            &[
                "--set",
                "featureGates.NVMLDeviceHealthCheck=true",
                "--set",
                "featureGates.PassthroughSupport=true",
            ],
            "cannot both be true",
        ),
        (
            "negative recovery period",
            &[
                "--set",
                "featureGates.NVMLDeviceHealthCheck=true",
                "--set",
                "kubeletPlugin.health.recoveryPeriodSeconds=-1",
            ],
            "recoveryPeriodSeconds",
        ),
        (
            "relative reset directory",
            &[
                "--set",
                "featureGates.NVMLDeviceHealthCheck=true",
                "--set",
                "kubeletPlugin.health.resetDir=reset",
            ],
            "resetDir",
        ),
        (
            "relative driver root",
            &["--set", "nvidiaDriverRoot=run/nvidia/driver"],
            "nvidiaDriverRoot",
        ),
    ];
    for (what, args, expected) in cases {
        let args: Vec<&str> = ok.iter().chain(args).copied().collect();
        let error = render(&helm, &args)
            .err()
            .unwrap_or_else(|| panic!("{what}: rendered"));
        assert!(error.contains(expected), "{what}: {error}");
    }
    let error = render_chart(&helm, &chart_dir(), RELEASE, "default", &ok)
        .expect_err("rendered into the default namespace");
    assert_contains(&error, "default namespace is refused");
}

// ---- upstream's values -------------------------------------------------------------------

/// Every value key of the upstream chart (kubernetes-sigs/dra-driver-nvidia-gpu
/// `deployments/helm/dra-driver-nvidia-gpu/values.yaml` at HEAD; `maskNvidiaDriverParams` and
/// `gpuDriverConfig` which only its templates read; `kubeletPlugin.containers.gpus.additionalXidsToIgnore`
/// and `webhook.tls.secret.namespace` of the NVIDIA-hosted releases' values), as paths:
/// `ci/upstream-all-keys-values.yaml` must set each.
const UPSTREAM_KEYS: &[&str] = &[
    "nvidiaDriverRoot",
    "nvidiaCDIHookPath",
    "altProcDevices",
    "maskNvidiaDriverParams",
    "gpuDriverConfig.default",
    "nameOverride",
    "fullnameOverride",
    "namespaceOverride",
    "selectorLabelsOverride",
    "gpuResourcesEnabledOverride",
    "consumableShares",
    "allowDefaultNamespace",
    "resourceApiVersion",
    "imagePullSecrets",
    "image.repository",
    "image.pullPolicy",
    "image.tag",
    "serviceAccount.create",
    "serviceAccount.annotations",
    "serviceAccount.name",
    "resources.gpus.enabled",
    "resources.computeDomains.enabled",
    "resources.computeDomains.imex.mode",
    "resources.computeDomains.imex.isolation",
    "resources.computeDomains.imex.hostSocketPath",
    "featureGates",
    "logVerbosity",
    "webhook.enabled",
    "webhook.replicas",
    "webhook.servicePort",
    "webhook.containerPort",
    "webhook.priorityClassName",
    "webhook.strategy",
    "webhook.podAnnotations",
    "webhook.podSecurityContext",
    "webhook.nodeSelector",
    "webhook.tolerations",
    "webhook.affinity",
    "webhook.containers.webhook.securityContext",
    "webhook.containers.webhook.resources",
    "webhook.serviceAccount.create",
    "webhook.serviceAccount.name",
    "webhook.failurePolicy",
    "webhook.tls.mode",
    "webhook.tls.certManager.issuerType",
    "webhook.tls.certManager.issuerName",
    "webhook.tls.certManager.dnsNames",
    "webhook.tls.secret.name",
    "webhook.tls.secret.namespace",
    "webhook.tls.secret.caBundle",
    "controller.replicas",
    "controller.leaderElection",
    "controller.metrics",
    "controller.priorityClassName",
    "controller.podAnnotations",
    "controller.podSecurityContext",
    "controller.nodeSelector",
    "controller.tolerations",
    "controller.containers.computeDomain",
    "controller.affinity",
    "controller.networkPolicy.enabled",
    "kubeletPlugin.metrics.enabled",
    "kubeletPlugin.metrics.gpuHttpEndpoint",
    "kubeletPlugin.metrics.computeDomainHttpEndpoint",
    "kubeletPlugin.metrics.metricsPath",
    "kubeletPlugin.priorityClassName",
    "kubeletPlugin.updateStrategy",
    "kubeletPlugin.podAnnotations",
    "kubeletPlugin.podSecurityContext",
    "kubeletPlugin.nodeSelector",
    "kubeletPlugin.tolerations",
    "kubeletPlugin.kubeletRegistrarDirectoryPath",
    "kubeletPlugin.kubeletPluginsDirectoryPath",
    "kubeletPlugin.containers.init.securityContext",
    "kubeletPlugin.containers.init.resources",
    "kubeletPlugin.containers.computeDomains.env",
    "kubeletPlugin.containers.computeDomains.securityContext",
    "kubeletPlugin.containers.computeDomains.resources",
    "kubeletPlugin.containers.computeDomains.healthcheckPort",
    "kubeletPlugin.containers.computeDomains.gpuCliqueLabelEnabled",
    "kubeletPlugin.containers.gpus.env",
    "kubeletPlugin.containers.gpus.securityContext",
    "kubeletPlugin.containers.gpus.resources",
    "kubeletPlugin.containers.gpus.healthcheckPort",
    "kubeletPlugin.containers.gpus.additionalXidsToIgnore",
    "kubeletPlugin.affinity",
    "kubeletPlugin.networkPolicy.enabled",
];

const UPSTREAM_FILE: &str = "upstream-all-keys-values.yaml";

fn upstream_file_args() -> Vec<String> {
    vec![
        "-f".to_owned(),
        chart_dir()
            .join("ci")
            .join(UPSTREAM_FILE)
            .display()
            .to_string(),
    ]
}

/// The `WARNING:` lines of the install notes with `args`.
fn warnings(helm: &Path, args: &[&str]) -> Vec<String> {
    let notes = shared::render_notes(helm, &chart_dir(), RELEASE, NAMESPACE, args)
        .unwrap_or_else(|error| panic!("helm install --dry-run=client {args:?}:\n{error}"));
    notes
        .lines()
        .filter_map(|line| line.trim().strip_prefix("WARNING: "))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_upstream_values_file_sets_every_upstream_key() {
    let file = shared::yaml(&chart_dir().join("ci").join(UPSTREAM_FILE));
    let mut set = std::collections::BTreeSet::new();
    shared::leaves(&file, "", &mut set);
    for key in UPSTREAM_KEYS {
        assert!(
            set.iter()
                .any(|leaf| leaf == key || leaf.starts_with(&format!("{key}."))),
            "{UPSTREAM_FILE} does not set upstream's {key}"
        );
    }
}

#[test]
fn every_upstream_key_renders_and_is_honoured_or_warned_about() {
    let Some(helm) = helm_or_skip() else { return };
    let base = upstream_file_args();
    let base: Vec<&str> = base.iter().map(String::as_str).collect();
    let documents = render(&helm, &base).unwrap();
    let env = env_map(container(&documents));
    // Honoured at upstream's defaults: the old gate name, the empty consumable shares, the
    // metrics endpoint; the logging gate is left out.
    assert_eq!(env["FEATURE_GATES"]["value"], "NVMLDeviceHealthCheck=false");
    assert_eq!(env["CONSUMABLE_SHARES"]["value"], "disabled");
    assert_eq!(env["HTTP_ENDPOINT"]["value"], ":8080");
    assert_eq!(env["METRICS_PATH"]["value"], "/metrics");
    assert_eq!(env["HEALTHCHECK_PORT"]["value"], "51516");
    // Upstream's init container settings go to the container that waits for the driver.
    let init = &pod_spec(&documents)["initContainers"][0];
    let upstream = shared::yaml(&chart_dir().join("ci").join(UPSTREAM_FILE));
    for key in ["resources", "securityContext"] {
        let value = &upstream["kubeletPlugin"]["containers"]["init"][key];
        if !value.is_null() && value != &json!({}) {
            assert_eq!(&init[key], value, "{key}");
        }
    }
    assert_eq!(
        find(&documents, "DaemonSet")["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"],
        "100%"
    );
    // What has no effect is said so, each once.
    let warned = warnings(&helm, &base);
    let keys: Vec<&str> = warned
        .iter()
        .filter_map(|line| line.split_once(": ").map(|(key, _)| key))
        .collect();
    assert_eq!(
        keys,
        [
            "altProcDevices",
            "maskNvidiaDriverParams",
            "gpuDriverConfig",
            "resources.computeDomains.imex",
            "controller",
            "kubeletPlugin.containers.computeDomains",
            "kubeletPlugin.metrics.computeDomainHttpEndpoint",
            "featureGates.ContextualLogging",
        ],
        "{warned:#?}"
    );
    for line in &warned {
        assert!(line.len() > 40, "a warning says why: {line}");
    }
    // The chart's own values files warn only about the upstream values they set.
    assert!(warnings(&helm, &["--set", "gpuResourcesEnabledOverride=true"]).is_empty());
    let guide = chart_dir().join("ci/upstream-guide-values.yaml");
    let guide = ["-f", guide.to_str().unwrap()];
    assert_eq!(
        warnings(&helm, &guide)
            .iter()
            .map(|line| line.split_once(':').unwrap().0)
            .collect::<Vec<_>>(),
        ["controller", "kubeletPlugin.containers.computeDomains"]
    );
}

#[test]
fn upstream_values_this_chart_has_are_honoured() {
    let Some(helm) = helm_or_skip() else { return };
    let base = upstream_file_args();
    let with = |extra: &[&str]| {
        let args: Vec<&str> = base
            .iter()
            .map(String::as_str)
            .chain(extra.iter().copied())
            .collect();
        render(&helm, &args).unwrap_or_else(|error| panic!("{extra:?}: {error}"))
    };
    let openapi = OpenApi::load();

    // namespaceOverride moves every namespaced object; selectorLabelsOverride selects the pods.
    let moved = with(&[
        "--set",
        "namespaceOverride=gpu-system",
        "--set-json",
        r#"selectorLabelsOverride={"app":"gpu-plugin"}"#,
        "--set",
        "kubeletPlugin.networkPolicy.enabled=true",
        "--set-json",
        r#"kubeletPlugin.podSecurityContext={"runAsNonRoot":false}"#,
        "--set-json",
        r#"kubeletPlugin.containers.gpus.env=[{"name":"EXTRA","value":"1"}]"#,
    ]);
    for document in &moved {
        if document["metadata"].get("namespace").is_some() {
            assert_eq!(
                document["metadata"]["namespace"],
                "gpu-system",
                "{}",
                describe(document)
            );
        }
    }
    let binding = find(&moved, "ClusterRoleBinding");
    assert_eq!(binding["subjects"][0]["namespace"], "gpu-system");
    assert_contains(
        find(&moved, "ValidatingAdmissionPolicy").to_string(),
        "system:serviceaccount:gpu-system:",
    );
    let daemonset = find(&moved, "DaemonSet");
    assert_eq!(
        daemonset["spec"]["selector"]["matchLabels"],
        serde_json::json!({"app": "gpu-plugin"})
    );
    assert_eq!(
        daemonset["spec"]["template"]["metadata"]["labels"]["app"],
        "gpu-plugin"
    );
    assert_eq!(pod_spec(&moved)["securityContext"]["runAsNonRoot"], false);
    assert_eq!(env_map(container(&moved))["EXTRA"]["value"], "1");
    let policy = find(&moved, "NetworkPolicy");
    assert!(
        shared::decode(policy).is_empty(),
        "{:?}",
        shared::decode(policy)
    );
    assert_eq!(
        policy["spec"]["podSelector"]["matchLabels"]["app"],
        "gpu-plugin"
    );
    assert_eq!(policy["spec"]["ingress"][0]["ports"][0]["port"], 8080);
    assert_eq!(policy["spec"]["egress"][0]["ports"][1]["port"], 6443);

    // resourceApiVersion: the DeviceClasses in that version, valid for it, without the
    // v1-only extendedResourceName.
    let beta = with(&["--set", "resourceApiVersion=resource.k8s.io/v1beta2"]);
    let classes: Vec<&Value> = beta.iter().filter(|d| d["kind"] == "DeviceClass").collect();
    assert_eq!(classes.len(), 3);
    for class in classes {
        assert_eq!(class["apiVersion"], "resource.k8s.io/v1beta2");
        assert!(class["spec"].get("extendedResourceName").is_none());
        assert!(
            openapi.check(class).is_empty(),
            "{:?}",
            openapi.check(class)
        );
    }

    // The metrics endpoint: upstream's [host]:port sets the port everywhere; off turns off
    // the endpoint, its port and the Service.
    let endpoint = with(&[
        "--set",
        "kubeletPlugin.metrics.gpuHttpEndpoint=0.0.0.0:9400",
    ]);
    assert_eq!(
        env_map(container(&endpoint))["HTTP_ENDPOINT"]["value"],
        "0.0.0.0:9400"
    );
    assert_eq!(
        named(&container(&endpoint)["ports"], "metrics")["containerPort"],
        9400
    );
    assert_eq!(find(&endpoint, "Service")["spec"]["ports"][0]["port"], 9400);
    let off = with(&["--set", "kubeletPlugin.metrics.enabled=false"]);
    let env = env_map(container(&off));
    assert!(!env.contains_key("HTTP_ENDPOINT") && !env.contains_key("METRICS_PATH"));
    assert!(off.iter().all(|d| d["kind"] != "Service"));
    assert!(
        container(&off)["ports"]
            .as_array()
            .unwrap()
            .iter()
            .all(|port| port["name"] != "metrics")
    );

    // A negative health port turns the service and its probes off, as upstream.
    let no_health = with(&["--set", "kubeletPlugin.containers.gpus.healthcheckPort=-1"]);
    let plugin = container(&no_health);
    assert!(!env_map(plugin).contains_key("HEALTHCHECK_PORT"));
    assert!(plugin.get("livenessProbe").is_none() && plugin.get("startupProbe").is_none());

    // The older health gate and XID list, as the NVIDIA-hosted releases set them.
    let health = with(&[
        "--set",
        "featureGates.DeviceHealthCheck=true",
        "--set",
        r"kubeletPlugin.containers.gpus.additionalXidsToIgnore=48\, 79",
    ]);
    let env = env_map(container(&health));
    assert_eq!(env["FEATURE_GATES"]["value"], "NVMLDeviceHealthCheck=true");
    assert_eq!(env["ADDITIONAL_XIDS_TO_IGNORE"]["value"], "48,79");
    for (name, documents) in [("moved", &moved), ("health", &health)] {
        let problems = validate_all(&openapi, name, documents);
        // The OpenAPI documents of this repository have no networking.k8s.io group; the
        // NetworkPolicy was decoded above instead.
        let problems: Vec<&String> = problems
            .iter()
            .filter(|problem| !problem.contains("NetworkPolicy"))
            .collect();
        assert!(problems.is_empty(), "{problems:#?}");
    }
}

const DOCKERFILE: &str = "drivers/nvidia/Dockerfile";

#[test]
fn the_image_builds_the_plugin_with_nvml_and_copies_it() {
    let workspace = dockerfile::workspace(env!("CARGO_MANIFEST_DIR"));
    let args = dockerfile::check_build_stage(
        &workspace,
        DOCKERFILE,
        env!("CARGO_PKG_NAME"),
        "gpu-kubelet-plugin",
    );
    // The real backend, and nothing of the demo (the SDK's test kit).
    assert_eq!(dockerfile::flag(&args, "--features"), "nvml");
    assert!(!args.iter().any(|a| a.contains("demo")), "{args:?}");
    // The binary exists under that name in this package (Cargo built it for this test).
    assert!(Path::new(env!("CARGO_BIN_EXE_gpu-kubelet-plugin")).is_file());
    // The admission webhook is built in the same command and copied next to the plugin, at
    // the path the chart's webhook Deployment runs.
    let bins: Vec<&str> = args
        .windows(2)
        .filter(|pair| pair[0] == "--bin")
        .map(|pair| pair[1].as_str())
        .collect();
    assert_eq!(bins, ["gpu-kubelet-plugin", "gpu-webhook"]);
    let text = std::fs::read_to_string(workspace.join(DOCKERFILE)).unwrap();
    assert!(text.contains("install -D -m 0755 target/dist/gpu-webhook /out/gpu-webhook"));
    assert!(
        dockerfile::copies_from(&text)
            .iter()
            .any(|copy| copy.from == "build"
                && copy.sources == ["/out/gpu-webhook"]
                && copy.destination == "/usr/bin/gpu-webhook"),
        "{DOCKERFILE} does not copy the webhook to /usr/bin/gpu-webhook"
    );
    assert!(Path::new(env!("CARGO_BIN_EXE_gpu-webhook")).is_file());
    dockerfile::check_toolchain(&workspace, DOCKERFILE);
    dockerfile::check_build_context(&workspace);
    // .ci/run type-checks exactly this command (the workspace's --all-features runs build the
    // demo in, which the image leaves out).
    let ci = std::fs::read_to_string(workspace.join(".ci/run")).unwrap();
    let check = format!("cargo check {}", args.join(" ")).replace(" --profile dist", "");
    assert!(ci.contains(&check), ".ci/run lacks `{check}`");
}

#[test]
fn an_init_container_waits_for_the_driver_except_in_mock_mode() {
    let Some(helm) = helm_or_skip() else { return };
    for (name, args) in values_files() {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let documents = render(&helm, &args).unwrap();
        let pod = pod_spec(&documents);
        let main = container(&documents);
        if env_map(main).contains_key("MOCK_PROFILE") {
            assert!(pod["initContainers"].is_null(), "{name}: {pod}");
            continue;
        }
        let init = &pod["initContainers"][0];
        assert_eq!(init["image"], main["image"], "{name}");
        assert_eq!(
            init["command"],
            json!(["gpu-kubelet-plugin", "--wait-for-driver"]),
            "{name}"
        );
        // It looks where the plugin will: the same driver root, below the same mount.
        let env = env_map(init);
        assert_eq!(
            env["DRIVER_ROOT_CTR_PATH"],
            env_map(main)["DRIVER_ROOT_CTR_PATH"],
            "{name}"
        );
        assert_eq!(
            mount(init, "driver-root-parent"),
            mount(main, "driver-root-parent"),
            "{name}"
        );
        let mut command_line = vec![
            "gpu-kubelet-plugin".to_owned(),
            "--wait-for-driver".to_owned(),
        ];
        let flags = flags_by_env();
        for (variable, entry) in env {
            if NOT_FLAGS.contains(&variable.as_str()) {
                continue;
            }
            let value = entry["value"].as_str().unwrap_or("node-1");
            command_line.push(format!("{}={value}", flags[&variable]));
        }
        let cli = Cli::try_parse_from(&command_line)
            .unwrap_or_else(|error| panic!("{name}: {command_line:?}: {error}"));
        assert!(cli.nvidia.wait_for_driver);
    }
    // Upstream's `kubeletPlugin.containers.init` settings are this container's.
    let defaults = chart_dir().join("ci/defaults-values.yaml");
    let documents = render(
        &helm,
        &[
            "-f",
            defaults.to_str().unwrap(),
            "--set",
            "kubeletPlugin.containers.init.resources.requests.memory=32Mi",
            "--set",
            "kubeletPlugin.containers.init.securityContext.readOnlyRootFilesystem=true",
        ],
    )
    .unwrap();
    let init = &pod_spec(&documents)["initContainers"][0];
    assert_eq!(init["resources"]["requests"]["memory"], "32Mi");
    assert_eq!(init["securityContext"]["readOnlyRootFilesystem"], true);
}

#[test]
fn mps_daemons_pull_and_run_as_the_plugin_does() {
    let Some(helm) = helm_or_skip() else { return };
    let all = rendered(&helm, "all-options-values.yaml");
    let env = env_map(container(&all));
    assert_eq!(env["IMAGE_PULL_POLICY"]["value"], "Always");
    assert_eq!(env["IMAGE_PULL_SECRETS"]["value"], "registry-credentials");
    assert_eq!(
        env["SERVICE_ACCOUNT_NAME"]["value"],
        pod_spec(&all)["serviceAccountName"]
    );
    let defaults = rendered(&helm, "defaults-values.yaml");
    let env = env_map(container(&defaults));
    assert!(!env.contains_key("IMAGE_PULL_SECRETS"));
    assert_eq!(env["IMAGE_PULL_POLICY"]["value"], "IfNotPresent");
}

// ---- the validating admission webhook (webhook.enabled) ------------------------------------

const WEBHOOK: &str = "/usr/bin/gpu-webhook";

fn render_webhook(helm: &Path, args: &[&str]) -> Vec<Value> {
    let mut all = vec![
        "--set",
        "gpuResourcesEnabledOverride=true",
        "--set",
        "webhook.enabled=true",
    ];
    all.extend_from_slice(args);
    render(helm, &all).unwrap_or_else(|error| panic!("{all:?}: helm template failed:\n{error}"))
}

#[test]
fn the_webhook_is_off_by_default_and_renders_nothing() {
    let Some(helm) = helm_or_skip() else { return };
    for file in [
        "defaults-values.yaml",
        UPSTREAM_FILE,
        "upstream-guide-values.yaml",
    ] {
        let documents = rendered(&helm, file);
        assert!(shared::webhook_objects(&documents).is_empty(), "{file}");
        assert!(
            documents.iter().all(|d| !describe(d).contains("webhook")),
            "{file}"
        );
    }
    // Nothing without the GPU plugin either.
    let off = render(
        &helm,
        &[
            "--set",
            "resources.gpus.enabled=false",
            "--set",
            "webhook.enabled=true",
        ],
    )
    .unwrap();
    assert!(shared::webhook_objects(&off).is_empty());
}

#[test]
fn the_webhook_renders_a_hardened_deployment_its_service_budget_and_configuration() {
    let Some(helm) = helm_or_skip() else { return };
    let openapi = OpenApi::load();
    let documents = render_webhook(&helm, &[]);
    let problems = validate_all(&openapi, "webhook", &documents);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let webhook = shared::assert_webhook_shape(&documents, NAMESPACE, WEBHOOK);
    assert_eq!(webhook["name"], "opaque-config.gpu.nvidia.com");
    assert_eq!(webhook["failurePolicy"], "Ignore");
    assert_eq!(webhook["timeoutSeconds"], 10);
    let objects = shared::webhook_objects(&documents);
    let deployment = objects["Deployment"][0];
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(
        pod["containers"][0]["image"],
        container(&documents)["image"]
    );
    let env = env_map(&pod["containers"][0]);
    assert_eq!(env["DRIVER_NAME"]["value"], "gpu.nvidia.com");
    // The log level follows logVerbosity unless webhook.logLevel is set.
    assert_eq!(env["RUST_LOG"]["value"], "info");
    let verbose = render_webhook(&helm, &["--set", "logVerbosity=7"]);
    let verbose = &shared::webhook_objects(&verbose)["Deployment"][0]["spec"]["template"]["spec"];
    assert_eq!(
        env_map(&verbose["containers"][0])["RUST_LOG"]["value"],
        "trace"
    );
    assert_eq!(
        pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
            ["topologyKey"],
        "kubernetes.io/hostname"
    );
    shared::assert_helm_mode_certificate(&documents, NAMESPACE);
    // With the plugin's NetworkPolicy, the webhook's pods get ingress to their port only and
    // no egress.
    let policed = render_webhook(
        &helm,
        &["--set", "kubeletPlugin.networkPolicy.enabled=true"],
    );
    let problems = validate_all(&openapi, "networkPolicy", &policed);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    shared::assert_webhook_shape(&policed, NAMESPACE, WEBHOOK);
    let policy = shared::webhook_objects(&policed)["NetworkPolicy"][0];
    assert_eq!(
        policy["spec"]["podSelector"]["matchLabels"],
        objects["Deployment"][0]["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(
        policy["spec"]["ingress"],
        json!([{ "ports": [{ "protocol": "TCP", "port": 8443 }] }])
    );
    assert_eq!(policy["spec"]["egress"], json!([]));
}

#[test]
fn the_all_options_file_renders_the_webhook_in_secret_mode() {
    let Some(helm) = helm_or_skip() else { return };
    // selectorLabelsOverride there: the plugin's selectors still leave the webhook's pods out.
    let documents = rendered(&helm, "all-options-values.yaml");
    let webhook = shared::assert_webhook_shape(&documents, NAMESPACE, WEBHOOK);
    assert_eq!(webhook["failurePolicy"], "Fail");
    assert_eq!(webhook["timeoutSeconds"], 5);
    let all = shared::yaml(&chart_dir().join("ci/all-options-values.yaml"));
    assert_eq!(
        webhook["clientConfig"]["caBundle"],
        all["webhook"]["tls"]["secret"]["caBundle"]
    );
    let objects = shared::webhook_objects(&documents);
    assert!(!objects.contains_key("Secret"));
    assert_eq!(objects["Deployment"][0]["spec"]["replicas"], 3);
    assert_eq!(
        objects["Deployment"][0]["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"],
        "nvidia-gpu-webhook-tls"
    );
}

#[test]
fn an_upstream_webhook_section_is_honoured() {
    let Some(helm) = helm_or_skip() else { return };
    // Upstream's webhook keys at upstream's defaults, enabled, with the port this chart needs.
    let upstream = shared::yaml(&chart_dir().join("ci").join(UPSTREAM_FILE));
    let mut section = upstream["webhook"].clone();
    section["enabled"] = json!(true);
    section["containerPort"] = json!(8443);
    let file = std::env::temp_dir().join(format!(
        "nvidia-upstream-webhook-{}.yaml",
        std::process::id()
    ));
    std::fs::write(
        &file,
        serde_json::to_string(&json!({ "gpuResourcesEnabledOverride": true, "webhook": section }))
            .unwrap(),
    )
    .unwrap();
    let documents = render(&helm, &["-f", file.to_str().unwrap()]).unwrap();
    let _ = std::fs::remove_file(&file);
    let webhook = shared::assert_webhook_shape(&documents, NAMESPACE, WEBHOOK);
    assert_eq!(webhook["failurePolicy"], section["failurePolicy"]);
    let objects = shared::webhook_objects(&documents);
    let deployment = objects["Deployment"][0];
    assert_eq!(deployment["spec"]["replicas"], section["replicas"]);
    // One replica, as upstream: no budget.
    assert!(!objects.contains_key("PodDisruptionBudget"));
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["tolerations"], section["tolerations"]);
    assert_eq!(pod["priorityClassName"], section["priorityClassName"]);
    assert_eq!(
        deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
        section["strategy"]["rollingUpdate"]["maxUnavailable"]
    );
    // Upstream's `privileged: false` merges with the hardened defaults.
    let security = &pod["containers"][0]["securityContext"];
    assert_eq!(security["privileged"], false);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    // Upstream's cert-manager mode with its self-signed issuer.
    assert_eq!(section["tls"]["mode"], "cert-manager");
    assert_eq!(objects["Issuer"][0]["spec"], json!({ "selfSigned": {} }));
    let certificate = objects["Certificate"][0];
    assert_eq!(
        objects["ValidatingWebhookConfiguration"][0]["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        format!(
            "{NAMESPACE}/{}",
            certificate["metadata"]["name"].as_str().unwrap()
        )
    );
    // Upstream's default port 443 is refused with the reason (the Service keeps 443).
    let mut args = vec![
        "--set",
        "gpuResourcesEnabledOverride=true",
        "--set",
        "webhook.enabled=true",
    ];
    args.extend(["--set", "webhook.containerPort=443"]);
    let error = render(&helm, &args).expect_err("port 443 rendered");
    assert_contains(&error, "cannot listen on a port below 1024");
}

#[test]
fn secret_and_cert_manager_modes_render_as_documented() {
    let Some(helm) = helm_or_skip() else { return };
    let bundle =
        "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJ0ZXN0Ci0tLS0tRU5EIENFUlRJRklDQVRFLS0tLS0K";
    let ca = format!("webhook.tls.secret.caBundle={bundle}");
    let namespace = format!("webhook.tls.secret.namespace={NAMESPACE}");
    let documents = render_webhook(
        &helm,
        &[
            "--set",
            "webhook.tls.mode=secret",
            "--set",
            "webhook.tls.secret.name=my-tls",
            "--set",
            &ca,
            "--set",
            &namespace,
        ],
    );
    let webhook = shared::assert_webhook_shape(&documents, NAMESPACE, WEBHOOK);
    assert_eq!(webhook["clientConfig"]["caBundle"], bundle);
    let objects = shared::webhook_objects(&documents);
    assert!(!objects.contains_key("Secret"));
    assert_eq!(
        objects["Deployment"][0]["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"],
        "my-tls"
    );
    let documents = render_webhook(
        &helm,
        &[
            "--set",
            "webhook.tls.mode=cert-manager",
            "--set",
            "webhook.tls.certManager.issuerType=issuer",
            "--set",
            "webhook.tls.certManager.issuerName=team-ca",
        ],
    );
    let webhook = shared::assert_webhook_shape(&documents, NAMESPACE, WEBHOOK);
    assert!(webhook["clientConfig"]["caBundle"].is_null());
    let objects = shared::webhook_objects(&documents);
    assert!(!objects.contains_key("Issuer") && !objects.contains_key("Secret"));
    assert_eq!(
        objects["Certificate"][0]["spec"]["issuerRef"],
        json!({ "group": "cert-manager.io", "kind": "Issuer", "name": "team-ca" })
    );
}

#[test]
fn the_webhook_leaves_the_plugins_rbac_unchanged() {
    let Some(helm) = helm_or_skip() else { return };
    let rbac = shared::rbac_objects;
    for extra in [&[][..], &["--set", "featureGates.MPSSupport=true"][..]] {
        let mut without = vec!["--set", "gpuResourcesEnabledOverride=true"];
        without.extend_from_slice(extra);
        let without = render(&helm, &without).unwrap();
        let with = render_webhook(&helm, extra);
        assert_eq!(rbac(&without), rbac(&with), "{extra:?}");
        assert!(!rbac(&with).is_empty());
    }
}

#[test]
fn the_webhook_env_names_flags_of_the_webhook_binary() {
    // Every variable the Deployment sets is one of gpu-webhook's flags, except its log filter.
    let Some(helm) = helm_or_skip() else { return };
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-webhook"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for documents in [
        render_webhook(&helm, &[]),
        rendered(&helm, "all-options-values.yaml"),
    ] {
        let deployment = shared::webhook_objects(&documents)["Deployment"][0];
        let env = env_map(&deployment["spec"]["template"]["spec"]["containers"][0]);
        assert!(env.contains_key("DRIVER_NAME"));
        for variable in env.keys().filter(|v| *v != "RUST_LOG") {
            assert!(
                help.contains(&format!("[env: {variable}=")),
                "{variable} is not a flag's variable:\n{help}"
            );
        }
    }
}

/// The plugin pod's privileges are exactly those the chart README lists, each for its reason:
/// a privileged `gpus` container (device nodes, MIG changes, VFIO rebinding, the MPS mount's
/// Bidirectional propagation), no host namespaces, host paths limited to the kubelet's
/// directories, the CDI root and the driver root (read-only), plus with `PassthroughSupport`
/// the host root and `/lib/modules`, both read-only. The init container that waits for the
/// driver asks for nothing.
#[test]
fn the_plugins_privileges_are_exactly_the_listed_ones() {
    let Some(helm) = helm_or_skip() else { return };
    for (file, passthrough) in [
        ("defaults-values.yaml", false),
        ("mock-values.yaml", false),
        ("passthrough-values.yaml", true),
    ] {
        let documents = rendered(&helm, file);
        let pod = pod_spec(&documents);
        for namespace in ["hostPID", "hostIPC", "hostNetwork"] {
            assert!(pod[namespace].is_null(), "{file}: {namespace}");
        }
        assert!(pod["securityContext"].is_null(), "{file}");
        assert_eq!(
            container(&documents)["securityContext"],
            json!({ "privileged": true }),
            "{file}"
        );
        for init in pod["initContainers"].as_array().into_iter().flatten() {
            // NVML, which the wait initialises, opens the driver's device nodes.
            assert_eq!(
                init["securityContext"],
                json!({ "privileged": true }),
                "{file}: {init}"
            );
            for mount in init["volumeMounts"].as_array().unwrap() {
                assert_eq!(mount["readOnly"], true, "{file}: {mount}");
            }
        }
        let mut host_paths: Vec<(&str, &str)> = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| Some((v["name"].as_str()?, v["hostPath"]["path"].as_str()?)))
            .collect();
        host_paths.sort_unstable();
        let mut expected = vec![
            ("cdi", "/var/run/cdi"),
            ("driver-root-parent", "/"),
            ("plugins", "/var/lib/kubelet/plugins"),
            ("plugins-registry", "/var/lib/kubelet/plugins_registry"),
        ];
        if passthrough {
            expected.extend([("host-root", "/"), ("lib-modules", "/lib/modules")]);
            expected.sort_unstable();
        }
        assert_eq!(host_paths, expected, "{file}");
        // What is only read is mounted read-only.
        for name in ["driver-root-parent", "host-root", "lib-modules"] {
            if host_paths.iter().any(|(volume, _)| *volume == name) {
                assert_eq!(
                    mount(container(&documents), name)["readOnly"],
                    true,
                    "{file}: {name}"
                );
            }
        }
    }
}

/// The plugin's ClusterRole grants exactly the API calls `gpu-kubelet-plugin` makes: the
/// plugin on a mock DGX H100 runs in process against the fake API server through every path
/// that calls the API (first publish deleting a stale slice, node lookup, a claim read at
/// prepare, a failing claim's Event and its series patch, a slice rewritten when the node's
/// GPUs change, unprepare), and the requests the server counted are compared with the
/// rendered rules both ways. MPS (its Role for the daemons' Deployments) is not run here.
#[tokio::test]
async fn the_plugins_rbac_rules_are_exactly_the_calls_it_makes() {
    use dra_driver_nvidia::devices::DRIVER_NAME;
    use dra_driver_nvidia::plugin::NvidiaPlugin;
    use dra_sdk_testing::claims::AllocatedClaim;
    use dra_sdk_testing::cluster::{NODE_NAME, TestCluster, claim_ref};
    use dra_sdk_testing::kubelet::KubeletVersion;
    use k8s_openapi::api::resource::v1::ResourceSlice;

    let Some(helm) = helm_or_skip() else { return };
    let documents = rendered(&helm, "defaults-values.yaml");
    let account = find(&documents, "ServiceAccount")["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let granted = granted_permissions(&documents, &account);

    let cli = Cli::try_parse_from([
        "gpu-kubelet-plugin",
        "--node-name",
        NODE_NAME,
        "--mock-profile",
        "dgx-h100",
    ])
    .unwrap();
    let nvidia = NvidiaPlugin::from_args(&cli.nvidia).unwrap();
    let resources = nvidia.resources(NODE_NAME);
    let cluster = TestCluster::start().await.unwrap();
    let stale: ResourceSlice = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": { "name": "stale-slice" },
        "spec": { "driver": DRIVER_NAME, "nodeName": NODE_NAME,
                  "pool": { "name": "gone", "generation": 1, "resourceSliceCount": 1 },
                  "devices": [{ "name": "gpu-99" }] },
    }))
    .unwrap();
    cluster.api().insert(&stale).unwrap();
    let client = cluster.client();
    let good = AllocatedClaim::new("default", "good")
        .device("gpu", DRIVER_NAME, NODE_NAME, "gpu-0")
        .create(&client)
        .await
        .unwrap();
    let bad = AllocatedClaim::new("default", "bad")
        .device("gpu", DRIVER_NAME, NODE_NAME, "gpu-1")
        .claim_config(
            &["gpu"],
            DRIVER_NAME,
            json!({ "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                    "sharing": 7 }),
        )
        .create(&client)
        .await
        .unwrap();
    let (good, bad) = (claim_ref(&good).unwrap(), claim_ref(&bad).unwrap());
    // From here on only the plugin talks to the API server over HTTP.
    cluster.api().reset_stats();
    let plugin = cluster
        .plugin(nvidia.driver.clone(), DRIVER_NAME)
        .resources(resources)
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
    // The node's GPUs change (another machine's, as after a repartition): the slice is
    // rewritten.
    let updates = cluster.api().stats().resource("resourceslices").update;
    let workstation = Cli::try_parse_from([
        "gpu-kubelet-plugin",
        "--node-name",
        NODE_NAME,
        "--mock-profile",
        "workstation",
    ])
    .unwrap();
    let workstation = NvidiaPlugin::from_args(&workstation.nvidia).unwrap();
    plugin
        .context()
        .publish(workstation.resources(NODE_NAME))
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
    assert_rbac_matches_calls("dra-driver-nvidia-gpu", &granted, &requested);
}
