//! The Helm chart (`deploy/helm/dra-driver-nvidia-gpu`), rendered by `helm template` with
//! each values file under its `ci/` directory: every object passes the strict field validation
//! of a v1.36.2 API server's OpenAPI documents (unknown fields are errors) and decodes into its
//! `k8s-openapi` type without losing a field; the DaemonSet's environment names flags of the
//! built `gpu-kubelet-plugin` and parses as its command line; the DeviceClasses are the driver
//! crate's; `ci/all-options-values.yaml` sets every documented value; the defaults (as
//! upstream), ComputeDomains, the webhook and bad values fail with a clear message. Needs
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
use serde_json::Value;
use shared::{
    OpenApi, assert_plugin_rules, describe, env_map, find_kind as find, helm_or_skip, render_chart,
    validate_all,
};

const NAMESPACE: &str = "nvidia-dra-driver-gpu";
const RELEASE: &str = "nvidia-dra";
/// What the chart refuses its bare defaults with, as upstream does.
const OVERRIDE_NEEDED: &str = "resources.gpus.enabled=true needs gpuResourcesEnabledOverride=true";
/// Variables the DaemonSet sets that are not the plugin's flags: its log filter, and the NVIDIA
/// container runtime's (where it is the node's default runtime).
const NOT_FLAGS: [&str; 3] = [
    "RUST_LOG",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_MIG_CONFIG_DEVICES",
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
            ("driver-root", "/"),
        ]
        .into()
    );
    let mounts: BTreeMap<&str, &str> = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| Some((m["name"].as_str()?, m["mountPath"].as_str()?)))
        .collect();
    assert_eq!(
        env["DRIVER_ROOT_CTR_PATH"]["value"].as_str(),
        Some(mounts["driver-root"])
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
    let pod = &find(&guide, "DaemonSet")["spec"]["template"]["spec"];
    let driver_root = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "driver-root")
        .unwrap();
    assert_eq!(driver_root["hostPath"]["path"], "/run/nvidia/driver");
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
    let cases: [(&str, &[&str], &str); 11] = [
        (
            "compute domains",
            &["--set", "resources.computeDomains.enabled=true"],
            "resources.computeDomains.enabled=true is not supported: this chart installs the GPU \
             kubelet plugin only",
        ),
        (
            "webhook",
            &["--set", "webhook.enabled=true"],
            "webhook.enabled=true is not supported",
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
    dockerfile::check_toolchain(&workspace, DOCKERFILE);
    dockerfile::check_build_context(&workspace);
    // .ci/run type-checks exactly this command (the workspace's --all-features runs build the
    // demo in, which the image leaves out).
    let ci = std::fs::read_to_string(workspace.join(".ci/run")).unwrap();
    let check = format!("cargo check {}", args.join(" ")).replace(" --profile dist", "");
    assert!(ci.contains(&check), ".ci/run lacks `{check}`");
}
