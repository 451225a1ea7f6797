//! The kind walkthrough's demos (`examples/kind/demos/*/demo.yaml`) against the embedded
//! cluster, so they are tested although kind does not run here: each demo's claims are made
//! from its YAML as the resourceclaim controller would (one claim per pod for a template),
//! allocated by the SDK's scheduler-like allocator (CEL, `All`, admin access), prepared by the
//! mock GPU plugin through the simulated kubelet, and the environment each container would get
//! from the CDI specs is checked against what the demo's README promises, the same checks
//! `examples/kind/check-demos.sh` makes on a kind cluster. The driver runs with the settings
//! `install-driver.sh` installs the chart with (`examples/kind/driver-values.yaml`) and the
//! chart's DeviceClasses.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use dra_sdk::cdi::Spec;
use dra_sdk::testing::allocator::allocate_claim;
use dra_sdk::testing::cluster::{NODE_NAME, RunningPlugin, TestCluster, claim_ref};
use dra_sdk::testing::kubelet::KubeletDevice;
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, PostParams};
use mock_gpu::classes::device_classes;
use mock_gpu::{DEFAULT_DRIVER_NAME, MockGpuDriver, PublishOptions};
use serde_json::{Value, json};
use support::chart::{OpenApi, decode, describe};

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
    let text = std::fs::read_to_string(demos_dir().join(name).join("demo.yaml")).unwrap();
    let documents: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    let running = start_kind_like_cluster().await;
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
                let (devices, requests) = prepare(&running, namespace, &claim_name).await;
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
                || this.contains(&format!("run_demo_with_results(\"{name}\")"))),
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
        let text = std::fs::read_to_string(&file).unwrap();
        for document in serde_saphyr::from_multiple::<Value>(&text).unwrap() {
            let what = format!("{}: {}", file.display(), describe(&document));
            problems.extend(
                openapi
                    .check(&document)
                    .into_iter()
                    .map(|p| format!("{what}: OpenAPI: {p}")),
            );
            problems.extend(
                decode(&document)
                    .into_iter()
                    .map(|p| format!("{what}: decode: {p}")),
            );
        }
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
    assert!(patches.contains("enable_cdi = true"), "{patches}");
    // Every gate is a DRA gate of Kubernetes 1.36 (the e2e harness's list): no typos, none
    // that a 1.36 component would refuse to start with.
    let known = dra_sdk::testing::e2e::FEATURE_GATES;
    for (gate, value) in config["featureGates"].as_object().unwrap() {
        assert!(
            known.contains(&gate.as_str()),
            "unknown feature gate {gate}"
        );
        assert_eq!(value, true, "{gate}");
    }
    for gate in ["DRAPartitionableDevices", "DRAConsumableCapacity"] {
        assert_eq!(config["featureGates"][gate], true, "{gate} is off");
    }
    // The node image is Kubernetes 1.34 or newer.
    let common = std::fs::read_to_string(kind_dir.join("common.sh")).unwrap();
    let tag = common
        .lines()
        .find_map(|line| line.strip_prefix(": \"${KIND_NODE_IMAGE:=kindest/node:v"))
        .and_then(|rest| rest.strip_suffix("}\""))
        .expect("KIND_NODE_IMAGE in common.sh");
    let minor: u32 = tag.split('.').nth(1).unwrap().parse().unwrap();
    assert!(minor >= 34, "kindest/node:v{tag} is older than 1.34");
}
