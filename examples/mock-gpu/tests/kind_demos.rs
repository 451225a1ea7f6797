//! The kind walkthrough's demos (`examples/kind/demos/*/demo.yaml`) against the embedded
//! cluster, so they are tested although kind does not run here: each demo's claims are made
//! from its YAML as the resourceclaim controller would (one claim per pod for a template),
//! allocated by the SDK's scheduler-like allocator (CEL, `All`, admin access), prepared by the
//! mock GPU plugin through the simulated kubelet, and the environment each container would get
//! from the CDI specs is checked against what the demo's README promises, the same checks
//! `examples/kind/check-demos.sh` makes on a kind cluster; each demo alone, and all of them on
//! one node one after the other, as `run-demos.sh` runs them. The driver runs with the settings
//! `install-driver.sh` installs the chart with (`examples/kind/driver-values.yaml`) and the
//! chart's DeviceClasses.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use dra_sdk::advanced::cdi::Spec;
use dra_sdk_allocator::allocate_claim;
use dra_sdk_testing::assert_contains;
use dra_sdk_testing::cluster::{NODE_NAME, RunningPlugin, TestCluster, claim_ref};
use dra_sdk_testing::kubelet::KubeletDevice;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use kube::api::{Api, Patch, PatchParams, PostParams};
use mock_gpu::classes::device_classes;
use mock_gpu::{DEFAULT_DRIVER_NAME, MockGpuDriver, PublishOptions};
use serde_json::{Value, json};
use support::chart::{OpenApi, validate_all, yaml_documents};

fn demos_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../kind/demos")
}

/// `pod/container` → the environment the container would get.
type Environments = BTreeMap<String, Vec<String>>;

/// `examples/kind/driver-values.yaml`: the GPUs per node and how they are published.
fn kind_driver_settings() -> (u32, PublishOptions) {
    let values: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(demos_dir().join("../driver-values.yaml")).unwrap(),
    )
    .unwrap();
    let number = |value: &Value| u32::try_from(value.as_u64().unwrap()).unwrap();
    let plugin = &values["kubeletPlugin"];
    (
        number(&plugin["numDevices"]),
        PublishOptions {
            partitions: number(&plugin["gpuPartitions"]),
            allow_multiple_allocations: values["gpuAllowMultipleAllocations"].as_bool().unwrap(),
        },
    )
}

/// A cluster running the mock GPU plugin as the walkthrough installs it, with the chart's
/// DeviceClasses (replacing the one the test kit makes, which selects every device).
async fn start_kind_like_cluster() -> RunningPlugin {
    let (num_devices, options) = kind_driver_settings();
    let driver = MockGpuDriver::new(DEFAULT_DRIVER_NAME, NODE_NAME, num_devices)
        .with_options(options)
        .unwrap();
    let resources = driver.resources();
    let running = TestCluster::start_with(driver, DEFAULT_DRIVER_NAME, resources)
        .await
        .unwrap();
    let classes = Api::<DeviceClass>::all(running.cluster().client());
    classes
        .delete(DEFAULT_DRIVER_NAME, &Default::default())
        .await
        .unwrap();
    for class in device_classes(DEFAULT_DRIVER_NAME, options) {
        classes
            .create(&PostParams::default(), &class)
            .await
            .unwrap();
    }
    running
}

/// Runs one demo in a fresh embedded cluster (see [`start_kind_like_cluster`]).
async fn run_demo(name: &str) -> Environments {
    run_demo_with_results(name).await.0
}

/// claim name → the `request` of each of its allocation results (`request/subrequest` for
/// `firstAvailable`).
type Results = BTreeMap<String, Vec<String>>;

/// [`run_demo`], and the claims' allocation results.
async fn run_demo_with_results(name: &str) -> (Environments, Results) {
    run_demo_on(&start_kind_like_cluster().await, name).await
}

/// Runs one demo in `running`, next to whatever its claims hold already (the walkthrough runs
/// the demos one after the other on one node, and they stay): the containers' environments and
/// the claims' allocation results.
async fn run_demo_on(running: &RunningPlugin, name: &str) -> (Environments, Results) {
    let documents = yaml_documents(&demos_dir().join(name).join("demo.yaml"));
    let client = running.cluster().client();
    let templates: BTreeMap<&str, &Value> = documents
        .iter()
        .filter(|d| d["kind"] == "ResourceClaimTemplate")
        .map(|d| (d["metadata"]["name"].as_str().unwrap(), &d["spec"]["spec"]))
        .collect();
    for claim in documents.iter().filter(|d| d["kind"] == "ResourceClaim") {
        create_claim(&client, claim.clone()).await;
    }
    // claim name → what the kubelet got for it; a shared claim is prepared once.
    let mut prepared: BTreeMap<String, Vec<KubeletDevice>> = BTreeMap::new();
    let mut results = Results::new();
    let mut environments = Environments::new();
    for pod in documents.iter().filter(|d| d["kind"] == "Pod") {
        let namespace = pod["metadata"]["namespace"].as_str().unwrap();
        let pod_name = pod["metadata"]["name"].as_str().unwrap();
        // pod claim name → ResourceClaim name.
        let mut claims = BTreeMap::new();
        for entry in pod["spec"]["resourceClaims"].as_array().unwrap() {
            let entry_name = entry["name"].as_str().unwrap();
            let claim_name = match entry["resourceClaimTemplateName"].as_str() {
                Some(template) => {
                    let claim_name = format!("{pod_name}-{entry_name}");
                    create_claim(
                        &client,
                        json!({
                            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                            "metadata": { "name": claim_name, "namespace": namespace },
                            "spec": templates[template],
                        }),
                    )
                    .await;
                    claim_name
                }
                None => entry["resourceClaimName"].as_str().unwrap().to_owned(),
            };
            if !prepared.contains_key(&claim_name) {
                let (devices, requests) = prepare(running, namespace, &claim_name).await;
                prepared.insert(claim_name.clone(), devices);
                results.insert(claim_name.clone(), requests);
            }
            claims.insert(entry_name.to_owned(), claim_name);
        }
        for container in pod["spec"]["containers"].as_array().unwrap() {
            let mut devices = Vec::new();
            for use_ in container["resources"]["claims"].as_array().unwrap() {
                let claim = &claims[use_["name"].as_str().unwrap()];
                let request = use_["request"].as_str();
                devices.extend(prepared[claim].iter().filter(|device| {
                    request.is_none_or(|request| {
                        device.request_names.is_empty()
                            || device.request_names.iter().any(|r| r == request)
                    })
                }));
            }
            let key = format!("{pod_name}/{}", container["name"].as_str().unwrap());
            environments.insert(key, container_env(&running.cluster().cdi_root(), &devices));
        }
    }
    (environments, results)
}

async fn create_claim(client: &kube::Client, claim: Value) {
    let claim: ResourceClaim = serde_json::from_value(claim).unwrap();
    let namespace = claim.metadata.namespace.clone().unwrap();
    Api::<ResourceClaim>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
}

/// Allocates and prepares a claim: what the kubelet got, and the results' requests.
async fn prepare(
    running: &RunningPlugin,
    namespace: &str,
    name: &str,
) -> (Vec<KubeletDevice>, Vec<String>) {
    let claim = allocate_claim(
        &running.cluster().client(),
        namespace,
        name,
        NODE_NAME,
        None,
    )
    .await
    .unwrap_or_else(|error| panic!("allocating {namespace}/{name}: {error}"));
    let requests =
        serde_json::to_value(&claim).unwrap()["status"]["allocation"]["devices"]["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|result| result["request"].as_str().unwrap().to_owned())
            .collect();
    let claim = claim_ref(&claim).unwrap();
    let mut outcomes = running
        .kubelet()
        .prepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    let devices = outcomes
        .remove(&claim.uid)
        .unwrap()
        .unwrap_or_else(|error| panic!("preparing {namespace}/{name}: {error}"));
    (devices, requests)
}

/// The environment a container with `devices` gets: the spec-level and device-level env of
/// the CDI spec files that define their CDI IDs, as the runtime applies them.
fn container_env(cdi_root: &Path, devices: &[&KubeletDevice]) -> Vec<String> {
    let specs: Vec<Spec> = std::fs::read_dir(cdi_root)
        .unwrap()
        .map(|entry| Spec::read_file(entry.unwrap().path()).unwrap())
        .collect();
    let mut env = std::collections::BTreeSet::new();
    for id in devices.iter().flat_map(|d| &d.cdi_device_ids) {
        let (kind, name) = id.split_once('=').unwrap();
        let (spec, device) = specs
            .iter()
            .find_map(|spec| {
                let device = spec.devices.iter().find(|d| d.name == name)?;
                (spec.kind.to_string() == kind).then_some((spec, device))
            })
            .unwrap_or_else(|| panic!("no CDI spec defines {id}"));
        env.extend(spec.container_edits.env.iter().cloned());
        env.extend(device.container_edits.env.iter().cloned());
    }
    env.into_iter().collect()
}

/// The GPU UUIDs (`GPU_DEVICE_<n>=<uuid>`) in an environment.
fn uuids(env: &[String]) -> Vec<&str> {
    env.iter()
        .filter_map(|line| line.split_once('='))
        .filter(|(name, _)| {
            name.strip_prefix("GPU_DEVICE_")
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(|(_, value)| value)
        .collect()
}

/// The values of the variables named `GPU_DEVICE_<i>_PARTITION_<j>` in an environment, as
/// `(i, j, uuid)`.
fn partitions(env: &[String]) -> Vec<(u32, u32, &str)> {
    env.iter()
        .filter_map(|line| line.split_once('='))
        .filter_map(|(name, value)| {
            let (gpu, partition) = name
                .strip_prefix("GPU_DEVICE_")?
                .split_once("_PARTITION_")?;
            Some((gpu.parse().ok()?, partition.parse().ok()?, value))
        })
        .collect()
}

fn has_line(env: &[String], predicate: impl Fn(&str) -> bool) -> bool {
    env.iter().any(|line| predicate(line))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pods_get_one_distinct_gpu_each() {
    let env = run_demo("two-pods-one-gpu-each").await;
    let (a, b) = (uuids(&env["pod0/ctr"]), uuids(&env["pod1/ctr"]));
    assert_eq!((a.len(), b.len()), (1, 1), "{env:#?}");
    assert_ne!(a, b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_containers_share_one_gpu() {
    let env = run_demo("containers-share-a-gpu").await;
    let a = uuids(&env["pod/ctr0"]);
    assert_eq!(a.len(), 1, "{env:#?}");
    assert_eq!(a, uuids(&env["pod/ctr1"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pods_share_one_claim() {
    let env = run_demo("pods-share-a-claim").await;
    let a = uuids(&env["pod0/ctr"]);
    assert_eq!(a.len(), 1, "{env:#?}");
    assert_eq!(a, uuids(&env["pod1/ctr"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cel_selector_picks_a_high_index_gpu() {
    let env = run_demo("cel-selector").await;
    let ctr = &env["pod/ctr"];
    assert_eq!(uuids(ctr).len(), 1, "{env:#?}");
    assert!(
        has_line(ctr, |l| l.starts_with("GPU_DEVICE_6=")
            || l.starts_with("GPU_DEVICE_7=")),
        "{env:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opaque_configs_reach_their_containers() {
    let env = run_demo("opaque-configs").await;
    let (ts, sp) = (&env["pod/ts-ctr"], &env["pod/sp-ctr"]);
    assert_eq!((uuids(ts).len(), uuids(sp).len()), (1, 1), "{env:#?}");
    assert_ne!(uuids(ts), uuids(sp));
    assert!(
        has_line(ts, |l| l.ends_with("_TIMESLICE_INTERVAL=Long")),
        "{ts:#?}"
    );
    assert!(
        has_line(sp, |l| l.ends_with("_PARTITION_COUNT=4")),
        "{sp:#?}"
    );
    assert!(
        !has_line(ts, |l| l.contains("_PARTITION_COUNT=")),
        "{ts:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prioritized_list_falls_back_to_any_gpu() {
    let (env, results) = run_demo_with_results("prioritized-list").await;
    assert_eq!(uuids(&env["pod/ctr"]).len(), 1, "{env:#?}");
    assert_eq!(results["pod-gpu"], ["gpu/any"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_access_sees_every_gpu() {
    let env = run_demo("admin-access").await;
    let ctr = &env["pod/ctr"];
    let (num_devices, _) = kind_driver_settings();
    assert_eq!(uuids(ctr).len(), num_devices as usize, "{env:#?}");
    assert!(has_line(ctr, |l| l == "DRA_ADMIN_ACCESS=true"), "{ctr:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_of_one_gpu_and_a_whole_other_gpu() {
    let env = run_demo("partitionable-devices").await;
    let (parts, whole) = (&env["pod/part-ctr"], &env["pod/whole-ctr"]);
    let found = partitions(parts);
    assert_eq!(found.len(), 2, "{parts:#?}");
    let (gpu, first, uuid) = found[0];
    let (other_gpu, second, other_uuid) = found[1];
    assert_eq!((gpu, uuid), (other_gpu, other_uuid), "{parts:#?}");
    assert_ne!(first, second);
    assert!(
        uuids(parts).is_empty(),
        "a partition is not a whole GPU: {parts:#?}"
    );
    for (name, value) in [("MEMORY", "20480Mi"), ("COMPUTE", "25")] {
        for partition in [first, second] {
            let line = format!("GPU_DEVICE_{gpu}_PARTITION_{partition}_{name}={value}");
            assert!(has_line(parts, |l| l == line), "{line}: {parts:#?}");
        }
    }
    // The whole GPU is another one: the partitions hold part of their GPU's counter set.
    let whole_uuids = uuids(whole);
    assert_eq!(whole_uuids.len(), 1, "{whole:#?}");
    assert_ne!(whole_uuids[0], uuid);
    assert!(partitions(whole).is_empty(), "{whole:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_counters_keep_a_gpu_and_its_partitions_apart() {
    // What the partitionable demo's README says: with two of GPU 0's partitions taken, a
    // claim for all of GPU 0 does not fit; and the other way round on GPU 1.
    let running = start_kind_like_cluster().await;
    let client = running.cluster().client();
    let claim = |name: &str, class: &str, index: u32, count: u32| {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": { "name": name, "namespace": "default" },
            "spec": { "devices": { "requests": [{ "name": "gpu", "exactly": {
                "deviceClassName": class, "count": count,
                "selectors": [{ "cel": { "expression":
                    format!("device.attributes[\"gpu.example.com\"].index == {index}") } }],
            } }] } },
        })
    };
    let partition = "partition.gpu.example.com";
    for (name, class, index, count) in [
        ("two-partitions-of-0", partition, 0, 2),
        ("whole-gpu-0", DEFAULT_DRIVER_NAME, 0, 1),
        ("whole-gpu-1", DEFAULT_DRIVER_NAME, 1, 1),
        ("a-partition-of-1", partition, 1, 1),
    ] {
        create_claim(&client, claim(name, class, index, count)).await;
    }
    let allocate = |name: &'static str| allocate_claim(&client, "default", name, NODE_NAME, None);
    allocate("two-partitions-of-0").await.unwrap();
    allocate("whole-gpu-1").await.unwrap();
    for refused in ["whole-gpu-0", "a-partition-of-1"] {
        let error = allocate(refused).await.unwrap_err().to_string();
        assert!(
            error.contains("without enough shared counters"),
            "{refused}: {error}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_claims_share_one_gpu_by_capacity() {
    let env = run_demo("consumable-capacity").await;
    let (a, b) = (&env["pod/ctr0"], &env["pod/ctr1"]);
    assert_eq!(uuids(a).len(), 1, "{env:#?}");
    assert_eq!(uuids(a), uuids(b), "{env:#?}");
    for env in [a, b] {
        for line in ["GPU_DEVICE_11_MEMORY=20Gi", "GPU_DEVICE_11_COMPUTE=25"] {
            assert!(has_line(env, |l| l == line), "{line}: {env:#?}");
        }
    }
    let claim_of = |env: &[String]| {
        env.iter()
            .find(|l| l.starts_with("GPU_DEVICE_11_RESOURCE_CLAIM="))
            .cloned()
            .unwrap()
    };
    assert_ne!(claim_of(a), claim_of(b));
}

/// The indices `<n>` of the whole GPUs (`GPU_DEVICE_<n>=<uuid>`) in an environment, sorted.
fn gpu_indices(env: &[String]) -> Vec<u32> {
    let mut indices: Vec<u32> = env
        .iter()
        .filter_map(|line| line.split_once('='))
        .filter_map(|(name, _)| name.strip_prefix("GPU_DEVICE_")?.parse().ok())
        .collect();
    indices.sort_unstable();
    indices
}

/// Two GPUs of one NVLink-bridged pair of the mock driver: `2k` and `2k+1`.
fn is_nvlink_pair(indices: &[u32]) -> bool {
    matches!(indices, [a, b] if a % 2 == 0 && *b == a + 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gpus_of_one_nvlink_group() {
    let env = run_demo("gpus-on-one-nvlink-group").await;
    let ctr = &env["pod/ctr"];
    assert_eq!(uuids(ctr).len(), 2, "{ctr:#?}");
    assert!(is_nvlink_pair(&gpu_indices(ctr)), "{ctr:#?}");
}

/// The GPU indices a claim with the spec of `demo`'s (only) ResourceClaimTemplate, less its
/// constraints, is allocated in `running` now; the claim is deleted again.
async fn allocate_without_constraints(running: &RunningPlugin, demo: &str) -> Vec<u32> {
    let documents = yaml_documents(&demos_dir().join(demo).join("demo.yaml"));
    let template = documents
        .iter()
        .find(|d| d["kind"] == "ResourceClaimTemplate")
        .unwrap();
    let mut spec = template["spec"]["spec"].clone();
    assert!(
        spec["devices"]
            .as_object_mut()
            .unwrap()
            .remove("constraints")
            .is_some(),
        "{demo} has no constraints"
    );
    let client = running.cluster().client();
    let name = "without-constraints";
    create_claim(
        &client,
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": { "name": name, "namespace": "default" },
            "spec": spec,
        }),
    )
    .await;
    let claim = allocate_claim(&client, "default", name, NODE_NAME, None)
        .await
        .unwrap();
    let mut indices: Vec<u32> =
        serde_json::to_value(&claim).unwrap()["status"]["allocation"]["devices"]["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|result| {
                let device = result["device"].as_str().unwrap();
                device.strip_prefix("gpu-").unwrap().parse().unwrap()
            })
            .collect();
    indices.sort_unstable();
    // Without the finalizer the allocator added, the claim is gone at once, and its devices
    // with it (no resourceclaim controller runs here).
    let claims = Api::<ResourceClaim>::namespaced(client, "default");
    let no_finalizers = Patch::Merge(json!({ "metadata": { "finalizers": null } }));
    claims
        .patch(name, &PatchParams::default(), &no_finalizers)
        .await
        .unwrap();
    claims.delete(name, &Default::default()).await.unwrap();
    indices
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demos_fit_on_one_node_one_after_the_other() {
    // As run-demos.sh runs them: in DEMOS order on one node, each next to what the demos
    // before it hold. Every claim is still allocated and prepared; admin-access, first, sees
    // every GPU; the NVLink demo, last, gets a pair where a claim without its constraint
    // would get two GPUs of different pairs (the READMEs say which).
    let running = start_kind_like_cluster().await;
    let (num_devices, _) = kind_driver_settings();
    let mut held = BTreeMap::new();
    let denied = denied_demos();
    for demo in demos_in_order() {
        // Refused at admission in kind: nothing of it is allocated (see
        // the_webhook_denies_the_bad_config_and_admits_every_other_demo).
        if denied.contains(&demo) {
            continue;
        }
        if demo == "gpus-on-one-nvlink-group" {
            let unconstrained = allocate_without_constraints(&running, &demo).await;
            assert_eq!(unconstrained, [10, 12], "{held:?}");
        }
        let (env, _) = run_demo_on(&running, &demo).await;
        let mut indices: Vec<u32> = env.values().flat_map(|env| gpu_indices(env)).collect();
        indices.sort_unstable();
        indices.dedup();
        held.insert(demo, indices);
    }
    let all: Vec<u32> = (0..num_devices).collect();
    assert_eq!(held["admin-access"], all);
    assert_eq!(held["consumable-capacity"], [11], "{held:?}");
    assert_eq!(held["gpus-on-one-nvlink-group"], [12, 13], "{held:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_without_capacity_requests_still_gets_a_whole_gpu() {
    // The request policy's default is all of the GPU: the other demos' claims, which ask for
    // no capacity, keep getting a GPU each although whole GPUs allow multiple allocations.
    let env = run_demo("two-pods-one-gpu-each").await;
    for ctr in ["pod0/ctr", "pod1/ctr"] {
        let index = env[ctr]
            .iter()
            .find_map(|l| {
                l.strip_prefix("GPU_DEVICE_")?
                    .split_once('=')
                    .map(|(n, _)| n.to_owned())
            })
            .unwrap();
        let line = format!("GPU_DEVICE_{index}_MEMORY=80Gi");
        assert!(has_line(&env[ctr], |l| l == line), "{line}: {env:#?}");
    }
}

#[test]
fn every_demo_has_a_readme_a_test_and_a_check() {
    let check = std::fs::read_to_string(demos_dir().join("../check-demos.sh")).unwrap();
    let common = std::fs::read_to_string(demos_dir().join("../common.sh")).unwrap();
    let this = include_str!("kind_demos.rs");
    for entry in std::fs::read_dir(demos_dir()).unwrap() {
        let dir = entry.unwrap().path();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        assert!(dir.join("README.md").is_file(), "{name} has no README.md");
        assert!(dir.join("demo.yaml").is_file(), "{name} has no demo.yaml");
        assert!(
            check.contains(&name),
            "check-demos.sh does not check {name}"
        );
        assert!(common.contains(&name), "common.sh's DEMOS lacks {name}");
        assert!(
            (this.contains(&format!("run_demo(\"{name}\")"))
                || this.contains(&format!("run_demo_with_results(\"{name}\")"))
                || this.contains(&format!("denial_of(\"{name}\")"))),
            "no test runs {name}"
        );
    }
}

#[test]
fn every_demo_object_is_valid_for_the_api_server() {
    let openapi = OpenApi::load();
    let mut problems = Vec::new();
    for entry in std::fs::read_dir(demos_dir()).unwrap() {
        let file = entry.unwrap().path().join("demo.yaml");
        problems.extend(validate_all(
            &openapi,
            &file.display().to_string(),
            &yaml_documents(&file),
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_kind_config_has_two_nodes_cdi_and_known_gates() {
    let kind_dir = demos_dir().join("..");
    let config: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(kind_dir.join("kind-config.yaml")).unwrap(),
    )
    .unwrap();
    let roles: Vec<&str> = config["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|node| node["role"].as_str())
        .collect();
    assert_eq!(roles, ["control-plane", "worker"]);
    let patches = config["containerdConfigPatches"][0].as_str().unwrap();
    assert_contains(patches, "enable_cdi = true");
    // Every gate is a DRA gate of Kubernetes 1.36 (the e2e harness's list): no typos, none
    // that a 1.36 component would refuse to start with.
    let known = dra_sdk_testing::e2e::FEATURE_GATES;
    for (gate, value) in config["featureGates"].as_object().unwrap() {
        assert!(
            known.contains(&gate.as_str()),
            "unknown feature gate {gate}"
        );
        assert_eq!(value, true, "{gate}");
    }
    // Only the gates the demos need on 1.34 and 1.35, where they are alpha (on by default from
    // 1.36): no DRADeviceTaints, whose alpha on 1.34 and 1.35 needs resource.k8s.io/v1alpha3
    // served (without it the scheduler's DeviceTaintRule informer never syncs), and no
    // runtimeConfig.
    let mut gates: Vec<&str> = config["featureGates"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    gates.sort_unstable();
    assert_eq!(gates, ["DRAConsumableCapacity", "DRAPartitionableDevices"]);
    assert!(config.get("runtimeConfig").is_none(), "{config}");
    // The node image is Kubernetes 1.34 or newer, pinned by digest, with the kind release
    // that built it; the walkthrough's README names both.
    let common = std::fs::read_to_string(kind_dir.join("common.sh")).unwrap();
    let value = |name: &str| {
        common
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("{name} in common.sh"))
            .to_owned()
    };
    let (release, image) = (value("KIND_RELEASE"), value("KIND_RELEASE_NODE_IMAGE"));
    assert!(
        common.contains(": \"${KIND_NODE_IMAGE:=$KIND_RELEASE_NODE_IMAGE}\""),
        "KIND_NODE_IMAGE's default"
    );
    let (tag, digest) = image
        .strip_prefix("kindest/node:v")
        .and_then(|rest| rest.split_once("@sha256:"))
        .unwrap_or_else(|| panic!("{image} is not kindest/node:v<version>@sha256:<digest>"));
    assert!(
        digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
        "{image}"
    );
    let minor: u32 = tag.split('.').nth(1).unwrap().parse().unwrap();
    assert!(minor >= 34, "kindest/node:v{tag} is older than 1.34");
    assert!(release.starts_with("v0."), "{release}");
    let readme = std::fs::read_to_string(kind_dir.join("README.md")).unwrap();
    for pinned in [&image, &release] {
        assert!(readme.contains(pinned.as_str()), "README.md lacks {pinned}");
    }
    let config_text = std::fs::read_to_string(kind_dir.join("kind-config.yaml")).unwrap();
    assert!(
        config_text.contains(&image),
        "kind-config.yaml's command lacks {image}"
    );
}

// The walkthrough's scripts themselves, run for real with stubbed `kubectl`, `kind`, `docker`,
// `podman` and `helm` first on PATH: each stub records its arguments and answers with canned
// output, so the waiting and checking logic is tested without a cluster (none runs here).

/// The whole GPUs each demo holds while it runs, which an `allocationMode: All` request made
/// meanwhile does not get (consumable-capacity's two quarter shares leave GPU 11 capacity, so
/// it holds none whole).
const GPUS_HELD: &[(&str, u32)] = &[
    ("two-pods-one-gpu-each", 2),
    ("containers-share-a-gpu", 1),
    ("pods-share-a-claim", 1),
    ("cel-selector", 1),
    ("opaque-configs", 2),
    ("bad-config-denied", 0),
    ("prioritized-list", 1),
    ("partitionable-devices", 2),
    ("consumable-capacity", 0),
    ("gpus-on-one-nvlink-group", 2),
];

/// `kubectl`: records the call; `apply` and `wait` record the demo (`apply` of
/// bad-config-denied fails with `state/denial` when it exists, as the webhook denies it, and
/// its claims are `state/stored-claims`); `logs` of a demo's
/// container prints `state/logs/<namespace>/<pod>/<container>`, except admin-access's, which
/// gets every GPU (`state/num-devices`) minus those the demos applied before its pods were
/// waited for hold (the scheduler may place any applied pod first); the DaemonSet's `desiredNumberScheduled` is
/// `state/desired`, the nodes publishing slices `state/slices`, the cluster's nodes
/// `state/nodes`, the webhook Deployments `state/webhooks` (their `rollout status` fails when
/// `state/rollout-fails` exists).
const KUBECTL_STUB: &str = r#"#!/usr/bin/env bash
set -euo pipefail
echo "kubectl $*" >>"$STUB_STATE/calls"
if [[ ${1:-} == --context ]]; then shift 2; fi
case $1 in
  apply)
    demo=$(basename "$(dirname "$3")")
    echo "$demo" >>"$STUB_STATE/applied"
    echo "namespace/$demo created"
    if [[ $demo == bad-config-denied && -f $STUB_STATE/denial ]]; then
      cat "$STUB_STATE/denial" >&2
      exit 1
    fi ;;
  wait)
    args="$*"; ns=${args##*-n }; ns=${ns%% *}
    if [[ $ns == admin-access && ! -f $STUB_STATE/admin-held ]]; then
      held=0
      while read -r demo; do
        [[ $demo == admin-access ]] && continue
        held=$((held + $(grep "^$demo " "$STUB_STATE/held" | cut -d' ' -f2)))
      done <"$STUB_STATE/applied"
      echo "$held" >"$STUB_STATE/admin-held"
    fi ;;
  logs)
    ns=$3 pod=$4 ctr=$6
    if [[ $ns == admin-access ]]; then
      for ((i = 0; i < $(cat "$STUB_STATE/num-devices") - $(cat "$STUB_STATE/admin-held"); i++)); do echo "GPU_DEVICE_$i=gpu-$i"; done
      echo DRA_ADMIN_ACCESS=true
    else
      cat "$STUB_STATE/logs/$ns/$pod/$ctr"
    fi ;;
  -n)
    case "$3 ${4:-}" in
      "get daemonsets") cat "$STUB_STATE/desired" ;;
      "get deployments") cat "$STUB_STATE/webhooks" ;;
      "rollout status") [[ ! -f $STUB_STATE/rollout-fails ]] ;;
      *) echo "plugin: no slices written" ;;
    esac ;;
  get)
    case $2 in
      resourceslices) if [[ $* == *jsonpath* ]]; then cat "$STUB_STATE/slices"; else echo "NAME NODE"; fi ;;
      resourceclaims)
        if [[ $* == *bad-config-denied* ]]; then cat "$STUB_STATE/stored-claims"; else printf gpu/any; fi ;;
      nodes) cat "$STUB_STATE/nodes" ;;
    esac ;;
esac
"#;

/// `kind`: `version` prints `state/kind-version`; `get clusters` prints `state/clusters`;
/// `load docker-image` fails as on Docker's containerd image store when `state/load-fails`
/// exists; `get nodes` prints both nodes.
const KIND_STUB: &str = r#"#!/usr/bin/env bash
set -euo pipefail
echo "kind $*" >>"$STUB_STATE/calls"
case "$1 ${2:-}" in
  "version ") cat "$STUB_STATE/kind-version" ;;
  "get clusters") cat "$STUB_STATE/clusters" ;;
  "get nodes") printf 'dra-mock-gpu-control-plane\ndra-mock-gpu-worker\n' ;;
  "load docker-image")
    if [[ -f $STUB_STATE/load-fails ]]; then
      echo 'ctr: content digest sha256:0123: not found' >&2
      exit 1
    fi ;;
esac
"#;

/// `docker` and `podman`: `buildx version` fails when `state/no-buildx` exists; `save` prints
/// an archive (podman's `-o` writes it); `exec` reads its input.
const ENGINE_STUB: &str = r#"#!/usr/bin/env bash
set -euo pipefail
echo "$(basename "$0") $*" >>"$STUB_STATE/calls"
case "$1 ${2:-}" in
  "buildx version") [[ ! -f $STUB_STATE/no-buildx ]] ;;
  save*) if [[ ${3:-} == -o ]]; then echo archive >"$4"; else echo archive; fi ;;
  exec*) cat >/dev/null ;;
esac
"#;

const HELM_STUB: &str = r#"#!/usr/bin/env bash
echo "helm $*" >>"$STUB_STATE/calls"
"#;

/// A directory of stubs and their state, and the walkthrough's scripts run against them.
struct Stubs {
    dir: tempfile::TempDir,
}

struct ScriptRun {
    success: bool,
    stdout: String,
    stderr: String,
    /// Every stubbed command run, `<tool> <args>`, in order.
    calls: Vec<String>,
}

impl Stubs {
    fn new() -> Self {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        for (name, body) in [
            ("kubectl", KUBECTL_STUB),
            ("kind", KIND_STUB),
            ("docker", ENGINE_STUB),
            ("podman", ENGINE_STUB),
            ("helm", HELM_STUB),
        ] {
            let path = bin.join(name);
            std::fs::write(&path, body).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let stubs = Self { dir };
        stubs.set("calls", "");
        stubs.set("applied", "");
        stubs.set(
            "nodes",
            "node/dra-mock-gpu-control-plane\nnode/dra-mock-gpu-worker\n",
        );
        stubs.set("desired", "1");
        stubs.set(
            "webhooks",
            "deployment.apps/mock-gpu-mock-gpu-driver-webhook\n",
        );
        stubs.set("denial", DENIAL);
        stubs.set("stored-claims", "");
        stubs.set("slices", "dra-mock-gpu-worker\n");
        stubs.set("kind-version", "kind v0.32.0 go1.25.5 linux/amd64\n");
        stubs.set("clusters", "dra-mock-gpu\n");
        let held: String = GPUS_HELD
            .iter()
            .map(|(demo, gpus)| format!("{demo} {gpus}\n"))
            .collect();
        stubs.set("held", &held);
        stubs.set("num-devices", &kind_driver_settings().0.to_string());
        stubs.set_passing_logs();
        stubs
    }

    /// Writes a state file (creating its directories).
    fn set(&self, name: &str, contents: &str) {
        let path = self.dir.path().join("state").join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, contents).unwrap();
    }

    /// What each demo's containers print when its README holds (admin-access's come from
    /// the stub).
    fn set_passing_logs(&self) {
        let logs: &[(&str, &[&str])] = &[
            ("two-pods-one-gpu-each/pod0/ctr", &["GPU_DEVICE_0=gpu-a"]),
            ("two-pods-one-gpu-each/pod1/ctr", &["GPU_DEVICE_1=gpu-b"]),
            ("containers-share-a-gpu/pod/ctr0", &["GPU_DEVICE_2=gpu-c"]),
            ("containers-share-a-gpu/pod/ctr1", &["GPU_DEVICE_2=gpu-c"]),
            ("pods-share-a-claim/pod0/ctr", &["GPU_DEVICE_3=gpu-d"]),
            ("pods-share-a-claim/pod1/ctr", &["GPU_DEVICE_3=gpu-d"]),
            ("cel-selector/pod/ctr", &["GPU_DEVICE_6=gpu-g"]),
            (
                "opaque-configs/pod/ts-ctr",
                &["GPU_DEVICE_4=gpu-e", "GPU_DEVICE_4_TIMESLICE_INTERVAL=Long"],
            ),
            (
                "opaque-configs/pod/sp-ctr",
                &["GPU_DEVICE_5=gpu-f", "GPU_DEVICE_5_PARTITION_COUNT=4"],
            ),
            ("prioritized-list/pod/ctr", &["GPU_DEVICE_7=gpu-h"]),
            (
                "partitionable-devices/pod/part-ctr",
                &[
                    "GPU_DEVICE_8_PARTITION_0=gpu-i",
                    "GPU_DEVICE_8_PARTITION_0_MEMORY=20480Mi",
                    "GPU_DEVICE_8_PARTITION_1=gpu-i",
                    "GPU_DEVICE_8_PARTITION_1_MEMORY=20480Mi",
                ],
            ),
            (
                "partitionable-devices/pod/whole-ctr",
                &["GPU_DEVICE_9=gpu-j"],
            ),
            (
                "gpus-on-one-nvlink-group/pod/ctr",
                &["GPU_DEVICE_12=gpu-m", "GPU_DEVICE_13=gpu-n"],
            ),
        ];
        for (path, lines) in logs {
            self.set(&format!("logs/{path}"), &(lines.join("\n") + "\n"));
        }
        for ctr in ["ctr0", "ctr1"] {
            self.set(
                &format!("logs/consumable-capacity/pod/{ctr}"),
                "GPU_DEVICE_11=gpu-l\nGPU_DEVICE_11_MEMORY=20Gi\nGPU_DEVICE_11_COMPUTE=25\n",
            );
        }
    }

    /// Runs `examples/kind/<script>` with the stubs first on PATH and `env` set.
    fn run(&self, script: &str, args: &[&str], env: &[(&str, &str)]) -> ScriptRun {
        let kind_dir = demos_dir().join("..");
        let path = format!(
            "{}:{}",
            self.dir.path().join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut command = std::process::Command::new(kind_dir.join(script));
        command
            .args(args)
            .env("PATH", path)
            .env("STUB_STATE", self.dir.path().join("state"))
            .env("TMPDIR", self.dir.path())
            .env("WAIT_INTERVAL", "0");
        for name in [
            "KIND",
            "KUBECTL",
            "HELM",
            "CONTAINER_ENGINE",
            "KIND_EXPERIMENTAL_PROVIDER",
            "CLUSTER_NAME",
            "KIND_NODE_IMAGE",
            "DRIVER_NAMESPACE",
            "RELEASE_NAME",
            "IMAGE_REPOSITORY",
            "IMAGE_TAG",
            "WAIT_ATTEMPTS",
        ] {
            command.env_remove(name);
        }
        command.envs(env.iter().copied());
        let output = command.output().unwrap();
        let calls = std::fs::read_to_string(self.dir.path().join("state/calls")).unwrap();
        ScriptRun {
            success: output.status.success(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            calls: calls.lines().map(str::to_owned).collect(),
        }
    }
}

impl std::fmt::Debug for ScriptRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "success: {}\n--- stdout\n{}--- stderr\n{}--- calls\n{}",
            self.success,
            self.stdout,
            self.stderr,
            self.calls.join("\n")
        )
    }
}

/// The demos in the order of `DEMOS` in common.sh.
fn demos_in_order() -> Vec<String> {
    common_list("\nDEMOS=(")
}

/// The demos the API server must refuse: `DENIED_DEMOS` in common.sh.
fn denied_demos() -> Vec<String> {
    common_list("\nDENIED_DEMOS=(")
}

/// The words of the bash array that starts with `start` in common.sh.
fn common_list(start: &str) -> Vec<String> {
    let common = std::fs::read_to_string(demos_dir().join("../common.sh")).unwrap();
    let from = common
        .find(start)
        .unwrap_or_else(|| panic!("{start} in common.sh"))
        + start.len();
    let end = from + common[from..].find(')').unwrap();
    common[from..end]
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// What kubectl prints when the webhook denies bad-config-denied's claim (the stub's).
const DENIAL: &str = "namespace/bad-config-denied created\nError from server (Invalid): error when \
creating \"demos/bad-config-denied/demo.yaml\": admission webhook \"opaque-config.gpu.example.com\" \
denied the request: spec.devices.config[0].opaque.parameters: invalid GpuConfig: unknown field \
`timeSliceConfig`\n";

#[test]
fn install_driver_waits_for_the_nodes_the_daemonset_runs_on_not_every_node() {
    // Two nodes, the plugin on the worker only (the control plane's taint): done at once.
    let stubs = Stubs::new();
    let run = stubs.run("install-driver.sh", &[], &[]);
    assert!(run.success, "{run:?}");
    let helm = run.calls.iter().find(|c| c.starts_with("helm ")).unwrap();
    for value in ["image.pullPolicy=Never", "--values", "--wait"] {
        assert_contains(helm, value);
    }
    let polls = run
        .calls
        .iter()
        .filter(|c| c.contains("get resourceslices") && c.contains("jsonpath"))
        .count();
    assert_eq!(polls, 1, "{run:?}");
    assert!(
        run.calls
            .iter()
            .any(|c| c.contains("get daemonsets") && c.contains("desiredNumberScheduled")),
        "{run:?}"
    );
}

#[test]
fn install_driver_fails_naming_the_nodes_that_do_not_publish() {
    let stubs = Stubs::new();
    stubs.set("desired", "2");
    let run = stubs.run("install-driver.sh", &[], &[("WAIT_ATTEMPTS", "3")]);
    assert!(!run.success, "{run:?}");
    assert!(
        run.stderr
            .contains("only 1 of the 2 nodes the plugin runs on publish mock GPUs"),
        "{run:?}"
    );
    let polls = run
        .calls
        .iter()
        .filter(|c| c.contains("get resourceslices"))
        .count();
    assert_eq!(polls, 3, "{run:?}");
    assert!(run.calls.iter().any(|c| c.contains("logs -l")), "{run:?}");

    // A DaemonSet that runs nowhere fails at once, without waiting.
    let stubs = Stubs::new();
    stubs.set("desired", "0");
    let run = stubs.run("install-driver.sh", &[], &[]);
    assert!(!run.success, "{run:?}");
    assert!(run.stderr.contains("runs on no node"), "{run:?}");
    assert!(
        !run.calls.iter().any(|c| c.contains("get resourceslices")),
        "{run:?}"
    );
}

/// `(demo, step)` for each kubectl call of run-demos.sh and the checks it runs: `apply`,
/// `wait` or `check` (a `logs` or `get resourceclaims` of the demo's namespace).
fn demo_steps(calls: &[String]) -> Vec<(String, &'static str)> {
    let namespace = |call: &str| {
        let rest = &call[call.find(" -n ")? + 4..];
        Some(rest.split_whitespace().next()?.to_owned())
    };
    calls
        .iter()
        .filter_map(|call| {
            if call.contains(" apply -f ") {
                let path = call.rsplit(' ').next()?;
                let demo = Path::new(path).parent()?.file_name()?.to_str()?.to_owned();
                Some((demo, "apply"))
            } else if call.contains(" wait ") {
                Some((namespace(call)?, "wait"))
            } else if call.contains(" logs ") || call.contains(" get resourceclaims ") {
                Some((namespace(call)?, "check"))
            } else {
                None
            }
        })
        .collect()
}

#[test]
fn run_demos_applies_waits_and_checks_one_demo_at_a_time_in_an_order_that_holds() {
    let stubs = Stubs::new();
    let run = stubs.run("run-demos.sh", &[], &[]);
    assert!(run.success, "{run:?}");
    assert!(
        run.stdout.contains("every demo ran and matches its README"),
        "{run:?}"
    );
    // Every demo in DEMOS order, each applied, waited for and checked before the next.
    let steps = demo_steps(&run.calls);
    let mut order: Vec<String> = Vec::new();
    for (demo, step) in &steps {
        if *step == "apply" {
            assert!(!order.contains(demo), "{demo} applied twice: {run:?}");
            order.push(demo.clone());
        } else {
            assert_eq!(
                order.last(),
                Some(demo),
                "{step} of {demo} while another demo runs: {run:?}"
            );
        }
    }
    assert_eq!(order, demos_in_order());
    let denied = denied_demos();
    for demo in &order {
        for step in ["wait", "check"] {
            // A denied demo has no pods to wait for: its check is the apply.
            let expected = step == "check" || !denied.contains(demo);
            assert_eq!(
                steps.contains(&(demo.clone(), step)),
                expected,
                "{demo}: {step}: {run:?}"
            );
        }
    }
    assert!(
        run.stdout
            .contains("bad-config-denied: kubectl apply is denied"),
        "{run:?}"
    );
    // A request for all devices runs before any demo that holds a GPU.
    let first_other = order
        .iter()
        .position(|demo| {
            let yaml = std::fs::read_to_string(demos_dir().join(demo).join("demo.yaml")).unwrap();
            !yaml.contains("allocationMode: All")
        })
        .unwrap();
    for demo in &order[first_other..] {
        let yaml = std::fs::read_to_string(demos_dir().join(demo).join("demo.yaml")).unwrap();
        assert!(
            !yaml.contains("allocationMode: All"),
            "{demo} asks for all GPUs after demos that hold some"
        );
    }
    // Every demo the directory has runs, and only those.
    let mut all: Vec<String> = std::fs::read_dir(demos_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    all.sort();
    let mut ran = order.clone();
    ran.sort();
    assert_eq!(ran, all);
}

#[test]
fn the_admin_access_check_fails_when_other_demos_hold_gpus_first() {
    // The stub's model of the cluster reproduces the bug of applying every demo at once:
    // after a demo that holds two GPUs, the All request gets 12, not 14.
    let stubs = Stubs::new();
    let run = stubs.run(
        "run-demos.sh",
        &["two-pods-one-gpu-each", "admin-access"],
        &[],
    );
    assert!(!run.success, "{run:?}");
    assert!(run.stderr.contains("FAILED admin-access"), "{run:?}");
}

#[test]
fn run_demos_stops_at_the_first_demo_that_differs() {
    let stubs = Stubs::new();
    stubs.set("logs/cel-selector/pod/ctr", "GPU_DEVICE_3=gpu-d\n");
    let run = stubs.run("run-demos.sh", &[], &[]);
    assert!(!run.success, "{run:?}");
    assert!(run.stderr.contains("FAILED cel-selector"), "{run:?}");
    let order = demos_in_order();
    let next = &order[order.iter().position(|d| d == "cel-selector").unwrap() + 1];
    assert!(
        !demo_steps(&run.calls).contains(&(next.clone(), "apply")),
        "{next} applied after cel-selector failed: {run:?}"
    );
    // check-demos.sh on its own names it too, and checks the others.
    let run = stubs.run("check-demos.sh", &[], &[]);
    assert!(!run.success, "{run:?}");
    assert!(
        run.stderr
            .contains("demos that differ from their README: cel-selector"),
        "{run:?}"
    );
}

#[test]
fn the_nvlink_check_wants_two_gpus_of_one_pair() {
    let stubs = Stubs::new();
    let check = |stubs: &Stubs| stubs.run("check-demos.sh", &["gpus-on-one-nvlink-group"], &[]);
    let run = check(&stubs);
    assert!(run.success, "{run:?}");
    // What a claim without the constraint gets after the other demos (10 and 12), GPUs next to
    // each other but of two pairs (11 and 12), one GPU, three GPUs.
    for lines in [
        "GPU_DEVICE_10=gpu-k\nGPU_DEVICE_12=gpu-m\n",
        "GPU_DEVICE_11=gpu-l\nGPU_DEVICE_12=gpu-m\n",
        "GPU_DEVICE_12=gpu-m\n",
        "GPU_DEVICE_12=gpu-m\nGPU_DEVICE_13=gpu-n\nGPU_DEVICE_2=gpu-c\n",
    ] {
        stubs.set("logs/gpus-on-one-nvlink-group/pod/ctr", lines);
        let run = check(&stubs);
        assert!(!run.success, "{lines}: {run:?}");
        assert!(
            run.stderr.contains("FAILED gpus-on-one-nvlink-group"),
            "{run:?}"
        );
    }
    // Sorted as numbers: 8 and 9 are a pair although "9" sorts after "10" as text; and the
    // partitions' and capacity lines are not GPUs.
    stubs.set(
        "logs/gpus-on-one-nvlink-group/pod/ctr",
        "GPU_DEVICE_9=gpu-j\nGPU_DEVICE_9_MEMORY=80Gi\nGPU_DEVICE_8=gpu-i\nGPU_DEVICE_8_RESOURCE_CLAIM=uid\n",
    );
    let run = check(&stubs);
    assert!(run.success, "{run:?}");
}

#[test]
fn build_image_builds_without_provenance_and_falls_back_to_ctr_import() {
    let stubs = Stubs::new();
    let run = stubs.run("build-image.sh", &[], &[]);
    assert!(run.success, "{run:?}");
    let build = run
        .calls
        .iter()
        .find(|c| c.starts_with("docker buildx build"))
        .unwrap_or_else(|| panic!("no buildx build: {run:?}"));
    assert_contains(build, "--provenance=false");
    assert_contains(build, "--load");
    assert!(
        run.calls
            .iter()
            .any(|c| c.starts_with("kind load docker-image")),
        "{run:?}"
    );
    assert!(!run.calls.iter().any(|c| c.contains("ctr")), "{run:?}");

    // kind load fails ("content digest ... not found"): docker save | ctr import on each node.
    let stubs = Stubs::new();
    stubs.set("load-fails", "");
    let run = stubs.run("build-image.sh", &[], &[]);
    assert!(run.success, "{run:?}");
    for node in ["dra-mock-gpu-control-plane", "dra-mock-gpu-worker"] {
        let import = format!(
            "docker exec -i {node} ctr --namespace=k8s.io images import --digests --snapshotter=overlayfs -"
        );
        assert!(run.calls.contains(&import), "{import}: {run:?}");
    }
    assert_eq!(
        run.calls
            .iter()
            .filter(|c| c.starts_with("docker save"))
            .count(),
        2,
        "{run:?}"
    );

    // Without buildx (BuildKit) the build stops before it starts, saying why.
    let stubs = Stubs::new();
    stubs.set("no-buildx", "");
    let run = stubs.run("build-image.sh", &[], &[]);
    assert!(!run.success, "{run:?}");
    assert!(
        run.stderr.contains("buildx (BuildKit) is required"),
        "{run:?}"
    );
    assert!(
        !run.calls.iter().any(|c| c.contains("buildx build")),
        "{run:?}"
    );
}

#[test]
fn build_image_with_podman_loads_an_archive_from_a_portable_mktemp() {
    let stubs = Stubs::new();
    let run = stubs.run("build-image.sh", &[], &[("CONTAINER_ENGINE", "podman")]);
    assert!(run.success, "{run:?}");
    let load = run
        .calls
        .iter()
        .find(|c| c.starts_with("kind load image-archive"))
        .unwrap_or_else(|| panic!("no image-archive load: {run:?}"));
    let archive = load.split_whitespace().nth(3).unwrap();
    assert!(
        archive.starts_with(&stubs.dir.path().display().to_string()),
        "{load}"
    );
    assert!(!Path::new(archive).exists(), "{archive} left behind");
    // GNU-only mktemp options (--suffix, --tmpdir, ...) fail on macOS.
    for entry in std::fs::read_dir(demos_dir().join("..")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "sh") {
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(!text.contains("mktemp -"), "{}", path.display());
        }
    }
}

#[test]
fn create_cluster_requires_the_kind_release_that_built_the_node_image() {
    let stubs = Stubs::new();
    stubs.set("clusters", "");
    let run = stubs.run("create-cluster.sh", &[], &[]);
    assert!(run.success, "{run:?}");
    let create = run
        .calls
        .iter()
        .find(|c| c.starts_with("kind create cluster"))
        .unwrap();
    assert_contains(create, "--image kindest/node:v1.36.1@sha256:");

    stubs.set("kind-version", "kind v0.31.0 go1.25.5 linux/amd64\n");
    stubs.set("calls", "");
    let run = stubs.run("create-cluster.sh", &[], &[]);
    assert!(!run.success, "{run:?}");
    assert!(run.stderr.contains("kind v0.32.0 is required"), "{run:?}");
    assert!(
        !run.calls.iter().any(|c| c.starts_with("kind create")),
        "{run:?}"
    );
}

// The admission webhook's side of bad-config-denied. The embedded cluster's API server calls no
// admission webhooks, so the webhook binary the chart runs (`mock-gpu-webhook`, started here with
// the variables the chart's Deployment sets) is sent the AdmissionReviews a real API server
// would send for each demo's objects, over HTTPS with a test CA. Only kind shows the API server
// calling it through the chart's ValidatingWebhookConfiguration and `kubectl apply` failing.

/// The `mock-gpu-webhook` binary serving on a free local port with a test certificate.
struct RunningWebhook {
    child: std::process::Child,
    client: dra_sdk_testing::admission::WebhookClient,
    _dir: tempfile::TempDir,
}

impl Drop for RunningWebhook {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_webhook() -> RunningWebhook {
    use dra_sdk_testing::admission::{WebhookClient, WebhookPki};
    let dir = tempfile::tempdir().unwrap();
    let pki = WebhookPki::create(dir.path());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_mock-gpu-webhook"))
        .env("DRIVER_NAME", DEFAULT_DRIVER_NAME)
        .env("WEBHOOK_PORT", port.to_string())
        .env("TLS_CERT_FILE", &pki.cert_file)
        .env("TLS_KEY_FILE", &pki.key_file)
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let client = WebhookClient::new(
        std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        pki.ca_pem(),
    );
    let mut webhook = RunningWebhook {
        child,
        client,
        _dir: dir,
    };
    // Ready as the chart's probes see it: GET /readyz answers 200.
    for _ in 0..100 {
        if let Ok(response) = webhook.client.request("GET", "/readyz", None).await
            && response.status == 200
        {
            return webhook;
        }
        if let Ok(Some(status)) = webhook.child.try_wait() {
            panic!("mock-gpu-webhook exited: {status}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("mock-gpu-webhook did not become ready");
}

/// The webhook's answer to a CREATE of every claim, claim template and DeviceClass of `demo`,
/// by `kind/name`.
async fn admission_of(webhook: &RunningWebhook, demo: &str) -> BTreeMap<String, Value> {
    let documents = yaml_documents(&demos_dir().join(demo).join("demo.yaml"));
    let mut answers = BTreeMap::new();
    for object in documents.iter().filter(|d| {
        ["ResourceClaim", "ResourceClaimTemplate", "DeviceClass"]
            .contains(&d["kind"].as_str().unwrap_or_default())
    }) {
        let review = dra_sdk_testing::admission::review("CREATE", object, None);
        let answer = webhook.client.review(&review).await;
        let key = format!(
            "{}/{}",
            object["kind"].as_str().unwrap(),
            object["metadata"]["name"].as_str().unwrap()
        );
        answers.insert(key, answer["response"].clone());
    }
    answers
}

/// The denial of `demo`'s one object, as `kubectl apply` prints the message.
async fn denial_of(name: &str) -> String {
    let webhook = start_webhook().await;
    let answers = admission_of(&webhook, name).await;
    assert_eq!(answers.len(), 1, "{answers:#?}");
    let answer = answers.values().next().unwrap();
    assert_eq!(answer["allowed"], false, "{answer}");
    answer["status"]["message"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_denies_the_bad_config_and_admits_every_other_demo() {
    let message = denial_of("bad-config-denied").await;
    // The field, where it is, as check-demos.sh greps it from kubectl's output.
    assert_contains(&message, "spec.devices.config[0].opaque.parameters");
    assert_contains(&message, "timeSliceConfig");
    let check = std::fs::read_to_string(demos_dir().join("../check-demos.sh")).unwrap();
    assert_contains(&check, "MISSPELLED_FIELD=timeSliceConfig");
    // Every other demo's claims and templates, opaque configs included, are let through.
    let webhook = start_webhook().await;
    let denied = denied_demos();
    for demo in demos_in_order()
        .iter()
        .filter(|demo| !denied.contains(demo))
    {
        for (object, answer) in admission_of(&webhook, demo).await {
            assert_eq!(answer["allowed"], true, "{demo}: {object}: {answer}");
        }
    }
    // The same claim with the field spelled right is admitted.
    let documents = yaml_documents(&demos_dir().join("bad-config-denied/demo.yaml"));
    let mut claim = documents
        .iter()
        .find(|d| d["kind"] == "ResourceClaim")
        .unwrap()
        .clone();
    let sharing = &mut claim["spec"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"];
    let fixed = sharing
        .as_object_mut()
        .unwrap()
        .remove("timeSliceConfig")
        .unwrap();
    sharing["timeSlicingConfig"] = fixed;
    let answer = webhook
        .client
        .review(&dra_sdk_testing::admission::review("CREATE", &claim, None))
        .await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_webhook_the_bad_config_fails_at_prepare_naming_the_same_field() {
    // What the webhook saves the user from: the API server stores the claim, and the plugin
    // refuses to prepare it, with the field in the error the pod's events show.
    let running = start_kind_like_cluster().await;
    let documents = yaml_documents(&demos_dir().join("bad-config-denied/demo.yaml"));
    let claim = documents
        .iter()
        .find(|d| d["kind"] == "ResourceClaim")
        .unwrap();
    let (namespace, name) = (
        claim["metadata"]["namespace"].as_str().unwrap(),
        claim["metadata"]["name"].as_str().unwrap(),
    );
    create_claim(&running.cluster().client(), claim.clone()).await;
    let allocated = allocate_claim(
        &running.cluster().client(),
        namespace,
        name,
        NODE_NAME,
        None,
    )
    .await
    .unwrap();
    let claim_ref = claim_ref(&allocated).unwrap();
    let mut outcomes = running
        .kubelet()
        .prepare(std::slice::from_ref(&claim_ref))
        .await
        .unwrap();
    let error = outcomes
        .remove(&claim_ref.uid)
        .unwrap()
        .expect_err("prepared a claim with a misspelled config field")
        .to_string();
    assert_contains(&error, "timeSliceConfig");
}

#[test]
fn install_driver_waits_for_the_webhook_before_the_demos() {
    let stubs = Stubs::new();
    let run = stubs.run("install-driver.sh", &[], &[]);
    assert!(run.success, "{run:?}");
    let helm = run
        .calls
        .iter()
        .position(|c| c.starts_with("helm "))
        .unwrap();
    let rollout = run
        .calls
        .iter()
        .position(|c| c.contains("rollout status deployment.apps/mock-gpu-mock-gpu-driver-webhook"))
        .unwrap_or_else(|| panic!("no rollout status: {run:?}"));
    assert!(helm < rollout, "{run:?}");
    assert!(
        run.calls
            .iter()
            .any(|c| c.contains("get deployments")
                && c.contains("app.kubernetes.io/component=webhook")),
        "{run:?}"
    );
    // A webhook that does not become ready fails the install, with its logs.
    let stubs = Stubs::new();
    stubs.set("rollout-fails", "");
    let run = stubs.run("install-driver.sh", &[], &[]);
    assert!(!run.success, "{run:?}");
    assert_contains(&run.stderr, "is not ready");
    assert!(
        !run.calls.iter().any(|c| c.contains("get resourceslices")),
        "{run:?}"
    );
    // The walkthrough's values enable the webhook with Helm's certificates (no cert-manager).
    let values = support::chart::yaml(&demos_dir().join("../driver-values.yaml"));
    assert_eq!(
        values["webhook"],
        json!({ "enabled": true, "tls": { "mode": "helm" } })
    );
}

#[test]
fn the_bad_config_check_fails_when_the_claim_is_admitted() {
    // Denied, naming the field: passes, and shows kubectl's message.
    let stubs = Stubs::new();
    let run = stubs.run("check-demos.sh", &["bad-config-denied"], &[]);
    assert!(run.success, "{run:?}");
    assert_contains(&run.stdout, "denied the request");
    // Admitted (no webhook answered, failurePolicy Ignore): fails, says what to look at, and
    // deletes the claim so that a rerun checks again.
    let stubs = Stubs::new();
    std::fs::remove_file(stubs.dir.path().join("state/denial")).unwrap();
    let run = stubs.run("run-demos.sh", &["bad-config-denied"], &[]);
    assert!(!run.success, "{run:?}");
    assert_contains(&run.stderr, "was admitted: is the webhook running?");
    assert!(
        run.calls.iter().any(|c| c.contains(" delete -f ")),
        "{run:?}"
    );
    // Denied for another reason (the message lacks the field): fails too.
    let stubs = Stubs::new();
    stubs.set(
        "denial",
        "Error from server (Forbidden): namespaces \"bad-config-denied\" is forbidden\n",
    );
    let run = stubs.run("check-demos.sh", &["bad-config-denied"], &[]);
    assert!(!run.success, "{run:?}");
}
