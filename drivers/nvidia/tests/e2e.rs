//! `gpu-kubelet-plugin`, the binary operators run, with mock profiles against real
//! Kubernetes v1.36 components: the real kubelet registers it, the real scheduler allocates
//! from its ResourceSlices, the kubelet prepares and hands the CDI device names to the CRI
//! (a double that logs them). Skipped, with one line saying so, without `DRA_E2E_K8S_BIN`
//! (see `dra_sdk_testing::e2e`).
//!
//! One cluster of five nodes: `node-a100` serves the `dgx-a100` profile (MIG on GPUs 0-2,
//! GPUs 3-7 whole), `node-h100` the `dgx-h100` profile (eight whole GPUs), `node-t4` the
//! `workstation` profile (one T4) with device health on (gate `NVMLDeviceHealthCheck`) and
//! events from a file, used by the health test alone, and `node-dynmig` the `dgx-h100` profile
//! with `DynamicMIG` (every GPU whole or split, kept apart by counters), used by the dynamic
//! MIG test alone, and `node-dynmig-shared` the same with consumable shares
//! (`--consumable-shares=memory`), used by the shared-partition test alone; `node-pcie` the
//! `pcie-a100-bridged` profile (four GPUs, NVLink-bridged in pairs), used by the NVLink test
//! alone; `node-demo` has no plugin: `gpu-demo --kubeconfig` publishes its mock
//! machine there (feature `demo`). An MPS control-daemon Deployment as the driver builds it
//! runs on `node-h100` (the real controller manager and kubelet), with no plugin involved.

use std::path::Path;
use std::time::Duration;

use dra_driver_nvidia::devices::{DRIVER_NAME, device_classes};
use dra_sdk_testing::claims::allocation_results;
use dra_sdk_testing::e2e::suite::E2eSuite;
use dra_sdk_testing::e2e::workload::{self, ClaimSource};
use dra_sdk_testing::e2e::{KubeletNode, ManagedProcess, RealCluster, binaries_or_skip};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate};
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;
use tokio::sync::OnceCell;

const A100_NODE: &str = "node-a100";
const H100_NODE: &str = "node-h100";
const T4_NODE: &str = "node-t4";
const DYNAMIC_MIG_NODE: &str = "node-dynmig";
const SHARED_DYNAMIC_MIG_NODE: &str = "node-dynmig-shared";
const PCIE_NODE: &str = "node-pcie";
/// The node `gpu-demo --kubeconfig` publishes for; no plugin serves it.
const DEMO_NODE: &str = "node-demo";
const TIMEOUT: Duration = Duration::from_secs(90);

/// The CEL of the suite's DeviceClass narrowing, by device type.
fn of_type(device_type: &str) -> String {
    format!("device.attributes['{DRIVER_NAME}'].type == '{device_type}'")
}

/// The cluster with one plugin per node, started once for every test of this binary.
struct Fixture {
    cluster: RealCluster,
    // Kept for their lifetime: the plugins stop with the test process (parent-death signal).
    _plugins: Vec<ManagedProcess>,
}

static FIXTURE: OnceCell<Fixture> = OnceCell::const_new();

async fn fixture() -> Option<&'static Fixture> {
    let binaries = binaries_or_skip()?;
    Some(
        FIXTURE
            .get_or_init(|| async {
                let cluster = RealCluster::builder(binaries)
                    .nodes([
                        A100_NODE,
                        H100_NODE,
                        T4_NODE,
                        DYNAMIC_MIG_NODE,
                        SHARED_DYNAMIC_MIG_NODE,
                        PCIE_NODE,
                        DEMO_NODE,
                    ])
                    .start()
                    .await
                    .unwrap_or_else(|error| panic!("starting the e2e cluster: {error}"));
                let mut plugins = Vec::new();
                for (node, profile) in [
                    (A100_NODE, "dgx-a100"),
                    (H100_NODE, "dgx-h100"),
                    (T4_NODE, "workstation"),
                    (DYNAMIC_MIG_NODE, "dgx-h100"),
                    (SHARED_DYNAMIC_MIG_NODE, "dgx-h100"),
                    (PCIE_NODE, "pcie-a100-bridged"),
                ] {
                    let node = cluster.node(node).unwrap();
                    let extra = match node.name() {
                        T4_NODE => health_args(node),
                        DYNAMIC_MIG_NODE => {
                            vec!["--feature-gates".into(), "DynamicMIG=true".into()]
                        }
                        SHARED_DYNAMIC_MIG_NODE => [
                            "--feature-gates",
                            "DynamicMIG=true,ConsumableShares=true",
                            "--consumable-shares",
                            "memory",
                        ]
                        .map(String::from)
                        .to_vec(),
                        _ => Vec::new(),
                    };
                    let plugin = spawn_plugin(&cluster, node, profile, &extra);
                    node.wait_for_registration(DRIVER_NAME, 0, Duration::from_secs(60))
                        .await
                        .unwrap_or_else(|error| {
                            panic!("{error}; plugin log:\n{}", plugin.log_tail(30))
                        });
                    plugins.push(plugin);
                }
                Fixture {
                    cluster,
                    _plugins: plugins,
                }
            })
            .await,
    )
}

/// Starts `gpu-kubelet-plugin --mock-profile <profile>` for `node`, with the node's kubelet
/// directories and CDI root and its own mock host tree.
fn spawn_plugin(
    cluster: &RealCluster,
    node: &KubeletNode,
    profile: &str,
    extra: &[String],
) -> ManagedProcess {
    let host_root = node.root_dir().join("mock-host");
    let mut args: Vec<String> = [
        "--kubeconfig",
        &cluster.kubeconfig().display().to_string(),
        "--node-name",
        node.name(),
        "--mock-profile",
        profile,
        "--mock-host-root",
        &host_root.display().to_string(),
        "--kubelet-registrar-directory-path",
        &node.registrar_dir().display().to_string(),
        "--kubelet-plugins-directory-path",
        &node.plugins_dir().display().to_string(),
        "--cdi-root",
        &node.cdi_root().display().to_string(),
    ]
    .iter()
    .map(|arg| (*arg).to_owned())
    .collect();
    args.extend_from_slice(extra);
    cluster
        .spawn_program(
            &format!("gpu-kubelet-plugin-{}", node.name()),
            Path::new(env!("CARGO_BIN_EXE_gpu-kubelet-plugin")),
            &args,
        )
        .unwrap()
}

/// Device health on: events appended to `<node root>/health-events`, the operator's reset
/// files in `<node root>/health-reset`.
fn health_args(node: &KubeletNode) -> Vec<String> {
    let events = node.root_dir().join("health-events");
    let reset = node.root_dir().join("health-reset");
    std::fs::write(&events, "").unwrap();
    std::fs::create_dir_all(&reset).unwrap();
    vec![
        "--feature-gates".into(),
        "NVMLDeviceHealthCheck=true".into(),
        "--mock-health-events".into(),
        events.display().to_string(),
        "--health-reset-dir".into(),
        reset.display().to_string(),
    ]
}

/// The suite on the DGX A100 node, with MIG devices: the bad config is a `GpuConfig` naming a
/// request that got a MIG device, which the driver refuses for that claim alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dgx_a100_mig_devices_pass_the_e2e_suite() {
    let Some(fixture) = fixture().await else {
        return;
    };
    let report = E2eSuite::new(&fixture.cluster, A100_NODE, DRIVER_NAME)
        .device_selector(of_type("mig"))
        .bad_config(
            json!({ "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig" }),
            "GpuConfig (resource.nvidia.com/v1beta1) cannot configure MIG device",
        )
        .timeout(TIMEOUT)
        .run()
        .await
        .unwrap();
    println!("{report}");
    report.assert_all_passed();
}

/// The suite on the DGX H100 node, with full GPUs: the bad config is a `MigDeviceConfig` on a
/// full GPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dgx_h100_full_gpus_pass_the_e2e_suite() {
    let Some(fixture) = fixture().await else {
        return;
    };
    let report = E2eSuite::new(&fixture.cluster, H100_NODE, DRIVER_NAME)
        .device_selector(of_type("gpu"))
        .bad_config(
            json!({ "apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig" }),
            "MigDeviceConfig (resource.nvidia.com/v1beta1) cannot configure GPU",
        )
        .timeout(TIMEOUT)
        .run()
        .await
        .unwrap();
    println!("{report}");
    report.assert_all_passed();
}

/// What an operator does after installing the driver: the crate's DeviceClasses, claim
/// templates selecting by CEL (a full GPU by product name, a MIG device by profile), one pod
/// each. The real scheduler allocates, the real kubelet prepares, and the CRI gets
/// `k8s.gpu.nvidia.com/claim=<claimUID>-<device>` for exactly the allocated device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_get_a_full_gpu_and_a_mig_device_through_the_crate_device_classes() {
    let Some(fixture) = fixture().await else {
        return;
    };
    let (node, client, namespace) = scene(fixture, A100_NODE, "nvidia").await;

    let templates = Api::<ResourceClaimTemplate>::namespaced(client.clone(), &namespace);
    let full_gpu = workload::claim_template(
        &namespace,
        "full-a100",
        "gpu.nvidia.com",
        json!({ "selectors": [{ "cel": { "expression":
            "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100-SXM4-80GB'" } }] }),
        None,
    )
    .unwrap();
    let mig = workload::claim_template(
        &namespace,
        "mig-1g10gb",
        "mig.nvidia.com",
        json!({ "selectors": [{ "cel": { "expression":
            "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'" } }] }),
        // The MIG device's own config kind, named explicitly: accepted.
        Some(json!([{
            "requests": ["dev"],
            "opaque": {
                "driver": DRIVER_NAME,
                "parameters": { "apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig" },
            },
        }])),
    )
    .unwrap();
    for template in [&full_gpu, &mig] {
        templates
            .create(&PostParams::default(), template)
            .await
            .unwrap();
    }

    let pods = Api::<Pod>::namespaced(client.clone(), &namespace);
    for (pod, template) in [("trainer", "full-a100"), ("notebook", "mig-1g10gb")] {
        let spec = workload::pod_using(
            &namespace,
            pod,
            A100_NODE,
            &ClaimSource::Template(template.to_owned()),
            &["main"],
        );
        pods.create(&PostParams::default(), &spec).await.unwrap();
    }

    let claims = Api::<ResourceClaim>::namespaced(client.clone(), &namespace);
    for (pod, device_prefix, not_mig) in [("trainer", "gpu-", true), ("notebook", "gpu-", false)] {
        workload::wait_for_pod_running(&client, &namespace, pod, TIMEOUT)
            .await
            .unwrap();
        let cdi = node
            .cri_log()
            .wait_for_container(&format!("{namespace}/{pod}"), "main", TIMEOUT)
            .await
            .unwrap();
        let (uid, device) = allocated_device(&claims, pod).await;
        assert!(device.starts_with(device_prefix), "{pod}: {device}");
        assert_eq!(!device.contains("-mig-"), not_mig, "{pod} got {device}");
        if !not_mig {
            assert!(device.contains("-mig-1g10gb-"), "{pod} got {device}");
        } else {
            // GPUs 0-2 are in MIG mode on this profile: only 3-7 are whole.
            assert!(
                ["gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"].contains(&device.as_str()),
                "{pod} got {device}"
            );
        }
        let expected = format!("k8s.gpu.nvidia.com/claim={uid}-{device}");
        assert!(
            cdi.contains(&expected),
            "{pod}: the CRI got {cdi:?}, expected {expected} among them"
        );
        assert!(
            cdi.iter()
                .all(|name| name.starts_with("k8s.gpu.nvidia.com/claim=")),
            "{pod}: {cdi:?}"
        );
        // The spec file has upstream's name.
        let spec = spec_path(node, &uid);
        assert!(
            spec.exists(),
            "{pod}: no CDI spec {} (CDI root holds {:?})",
            spec.display(),
            std::fs::read_dir(node.cdi_root())
                .map(|dir| dir
                    .flatten()
                    .map(|entry| entry.file_name())
                    .collect::<Vec<_>>())
                .unwrap_or_default()
        );
    }

    // Deleting the pods unprepares: their spec files go.
    let uids: Vec<String> = claims
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|claim| claim.metadata.uid)
        .collect();
    workload::delete_pods(&client, &namespace, &["trainer", "notebook"], TIMEOUT)
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let left: Vec<&String> = uids
            .iter()
            .filter(|uid| spec_path(node, uid).exists())
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "CDI specs left after the pods went: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Dynamic MIG with the real scheduler: the full GPU and a partition of it are never both
/// allocated (a pod asking for the other stays pending until the first goes), and freed
/// placements are allocated again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_mig_counters_keep_whole_and_split_apart_with_the_real_scheduler() {
    let Some(fixture) = fixture().await else {
        return;
    };
    let pods = Pods::on_gpu0(fixture, DYNAMIC_MIG_NODE, "dynmig", None).await;

    // Whole first: no partition of the GPU while it runs.
    pods.run("whole", "whole").await;
    assert_eq!(pods.running("whole").await.device, "gpu-0");
    pods.run("left", "half").await;
    pods.pending("left").await;
    // The whole GPU goes: the partition is allocated, and the whole GPU cannot come back.
    pods.delete(&["whole"]).await;
    assert_eq!(pods.running("left").await.device, "gpu-0-mig-3g40gb-9-0");
    pods.run("right", "half").await;
    assert_eq!(pods.running("right").await.device, "gpu-0-mig-3g40gb-9-4");
    // All eight memory slices are taken: a 1g.10gb waits ...
    pods.run("small", "slice").await;
    pods.pending("small").await;
    // ... until the left half is freed, and gets a placement in it.
    pods.delete(&["left"]).await;
    let small = pods.running("small").await.device;
    assert!(
        [0, 1, 2, 3]
            .iter()
            .any(|start| small == format!("gpu-0-mig-1g10gb-19-{start}")),
        "small got {small}"
    );
    pods.delete(&["right", "small"]).await;
}

/// Consumable shares on dynamic MIG partitions (`--consumable-shares=memory`) with the real
/// scheduler: two claims asking for 4Gi of a `1g.10gb` get the same partition under two share
/// IDs, and both pods run on its one MIG instance (the same capability device in both CDI
/// specs); the shared partition still blocks the full GPU through its counters, charged once
/// for both claims; the instance outlives the first pod, and the GPU is whole again once the
/// last share goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_mig_partitions_are_shared_by_claims_with_the_real_scheduler() {
    let Some(fixture) = fixture().await else {
        return;
    };
    let pods = Pods::on_gpu0(
        fixture,
        SHARED_DYNAMIC_MIG_NODE,
        "dynmig-shared",
        Some(json!({ "requests": { "memory": "4Gi" } })),
    )
    .await;

    pods.run("first", "slice").await;
    let first = pods.running("first").await;
    pods.run("second", "slice").await;
    let second = pods.running("second").await;
    assert!(
        first.device.starts_with("gpu-0-mig-1g10gb-19-"),
        "{}",
        first.device
    );
    assert_eq!(first.device, second.device, "the partition is shared");
    assert!(
        first.share_id.is_some() && first.share_id != second.share_id,
        "{:?} {:?}",
        first.share_id,
        second.share_id
    );
    let instance = pods.mig_capabilities(&first.claim_uid);
    assert!(!instance.is_empty(), "no MIG capability in the CDI spec");
    assert_eq!(instance, pods.mig_capabilities(&second.claim_uid));

    // The counters the shared partition consumes keep the full GPU away ...
    pods.run("whole", "whole").await;
    pods.pending("whole").await;
    // ... while one share is left.
    pods.delete(&["first"]).await;
    pods.pending_still("whole").await;
    assert_eq!(pods.mig_capabilities(&second.claim_uid), instance);
    pods.delete(&["second"]).await;
    assert_eq!(pods.running("whole").await.device, "gpu-0");
    pods.delete(&["whole"]).await;
}

/// Pods on one node, with claim templates selecting on its first GPU: `whole` (the full GPU),
/// `half` (a `3g.40gb` of it) and `slice` (a `1g.10gb`).
struct Pods<'a> {
    node: &'a KubeletNode,
    client: kube::Client,
    namespace: String,
}

/// What a running pod's claim got.
struct Allocation {
    claim_uid: String,
    device: String,
    share_id: Option<String>,
}

impl<'a> Pods<'a> {
    /// The scene and the templates; `capacity` is added to the partition requests (consumable
    /// shares).
    async fn on_gpu0(
        fixture: &'a Fixture,
        node: &str,
        namespace: &str,
        capacity: Option<serde_json::Value>,
    ) -> Self {
        let (node, client, namespace) = scene(fixture, node, namespace).await;
        // The profile's first GPU, as the plugin publishes it.
        let gpu0 = dra_driver_nvidia::backend::mock::MockBackend::from_profile("dgx-h100")
            .unwrap()
            .hardware()
            .gpus[0]
            .info
            .uuid
            .clone();
        let domain = "device.attributes['gpu.nvidia.com']";
        let on_gpu0 = |profile: &str| {
            format!("{domain}.parentUUID == '{gpu0}' && {domain}.profile == '{profile}'")
        };
        let templates = Api::<ResourceClaimTemplate>::namespaced(client.clone(), &namespace);
        for (name, class, expression, capacity) in [
            (
                "whole",
                "gpu.nvidia.com",
                format!("{domain}.uuid == '{gpu0}'"),
                None,
            ),
            (
                "half",
                "mig.nvidia.com",
                on_gpu0("3g.40gb"),
                capacity.clone(),
            ),
            (
                "slice",
                "mig.nvidia.com",
                on_gpu0("1g.10gb"),
                capacity.clone(),
            ),
        ] {
            let mut request = json!({ "selectors": [{ "cel": { "expression": expression } }] });
            if let Some(capacity) = capacity {
                request["capacity"] = capacity;
            }
            let template =
                workload::claim_template(&namespace, name, class, request, None).unwrap();
            templates
                .create(&PostParams::default(), &template)
                .await
                .unwrap();
        }
        Self {
            node,
            client,
            namespace,
        }
    }

    /// Creates pod `pod` with a claim from `template`.
    async fn run(&self, pod: &str, template: &str) {
        let spec = workload::pod_using(
            &self.namespace,
            pod,
            self.node.name(),
            &ClaimSource::Template(template.to_owned()),
            &["main"],
        );
        Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &spec)
            .await
            .unwrap();
    }

    /// Waits until `pod` runs with its device's CDI name at the CRI; what it got.
    async fn running(&self, pod: &str) -> Allocation {
        workload::wait_for_pod_running(&self.client, &self.namespace, pod, TIMEOUT)
            .await
            .unwrap();
        let cdi = self
            .node
            .cri_log()
            .wait_for_container(&format!("{}/{pod}", self.namespace), "main", TIMEOUT)
            .await
            .unwrap();
        let allocation = allocation(&self.claims(), pod).await;
        // A share's CDI device is named after its share ID too.
        let expected = format!(
            "k8s.gpu.nvidia.com/claim={}-{}{}",
            allocation.claim_uid,
            allocation.device,
            allocation
                .share_id
                .as_ref()
                .map(|share| format!("-{share}"))
                .unwrap_or_default()
        );
        assert!(cdi.contains(&expected), "{pod}: the CRI got {cdi:?}");
        allocation
    }

    /// Waits until the scheduler reports that `pod` does not fit, and checks it is pending.
    async fn pending(&self, pod: &str) {
        workload::wait_for_pod_event(
            &self.client,
            &self.namespace,
            pod,
            "FailedScheduling",
            TIMEOUT,
        )
        .await
        .unwrap_or_else(|error| panic!("{pod} should stay pending: {error}"));
        self.pending_still(pod).await;
    }

    /// Checks that `pod` is pending, after giving the scheduler time to retry.
    async fn pending_still(&self, pod: &str) {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let phase = Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .get(pod)
            .await
            .unwrap()
            .status
            .and_then(|status| status.phase);
        assert_eq!(phase.as_deref(), Some("Pending"), "{pod}");
        let events = workload::pod_events(&self.client, &self.namespace, pod).await;
        assert!(
            !events
                .iter()
                .any(|event| event.contains(" Scheduled:") || event.contains("FailedPrepare")),
            "{pod} was scheduled: {events:?}"
        );
    }

    async fn delete(&self, pods: &[&str]) {
        workload::delete_pods(&self.client, &self.namespace, pods, TIMEOUT)
            .await
            .unwrap();
    }

    fn claims(&self) -> Api<ResourceClaim> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The MIG capability device nodes in the CDI spec of claim `uid`: they name the GPU and
    /// compute instance.
    fn mig_capabilities(&self, uid: &str) -> Vec<String> {
        let spec = spec_path(self.node, uid);
        let text = std::fs::read_to_string(&spec)
            .unwrap_or_else(|error| panic!("reading {}: {error}", spec.display()));
        let spec: serde_json::Value = serde_json::from_str(&text).unwrap();
        let mut caps: Vec<String> = spec["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|device| {
                device["containerEdits"]["deviceNodes"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter_map(|node| node["path"].as_str().map(str::to_owned))
            .filter(|path| path.starts_with("/dev/nvidia-caps/"))
            .collect();
        caps.sort();
        caps
    }
}

/// Where the plugin on `node` writes the CDI spec of claim `uid` (upstream's file name).
fn spec_path(node: &KubeletNode, uid: &str) -> std::path::PathBuf {
    node.cdi_root()
        .join(format!("k8s.gpu.nvidia.com-claim_{uid}.json"))
}

/// The UID of the claim made for `pod` from its template, and the one device allocated to it.
async fn allocated_device(claims: &Api<ResourceClaim>, pod: &str) -> (String, String) {
    let allocation = allocation(claims, pod).await;
    (allocation.claim_uid, allocation.device)
}

/// The claim made for `pod` from its template.
async fn claim_of(claims: &Api<ResourceClaim>, pod: &str) -> ResourceClaim {
    let list = claims.list(&ListParams::default()).await.unwrap();
    list.items
        .into_iter()
        .find(|claim| {
            claim
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|owner| owner.kind == "Pod" && owner.name == pod)
        })
        .unwrap_or_else(|| panic!("no claim owned by pod {pod}"))
}

/// The devices allocated to the claim of `pod`, sorted.
async fn devices_of(claims: &Api<ResourceClaim>, pod: &str) -> Vec<String> {
    let mut devices: Vec<String> = allocation_results(&claim_of(claims, pod).await)
        .into_iter()
        .map(|result| result.device)
        .collect();
    devices.sort();
    devices
}

/// What the claim made for `pod` from its template got: one device of ours.
async fn allocation(claims: &Api<ResourceClaim>, pod: &str) -> Allocation {
    let claim = claim_of(claims, pod).await;
    let results = allocation_results(&claim);
    assert_eq!(results.len(), 1, "{pod}: {results:?}");
    assert_eq!(results[0].driver, DRIVER_NAME);
    Allocation {
        claim_uid: claim.metadata.uid.unwrap_or_default(),
        device: results[0].device.clone(),
        share_id: results[0].share_id.clone(),
    }
}

/// NVLink topology with the real scheduler: on the PCIe server whose GPUs are bridged in pairs
/// (0-1 and 2-3), a claim for two GPUs with `matchAttribute: gpu.nvidia.com/nvlinkGroup` gets
/// a bridged pair. With GPU 0 held by another pod it gets GPUs 2 and 3 (never 1 and 2, which a
/// claim without the constraint may get); a second pair claim waits while only GPU 1 is free,
/// and gets GPUs 0 and 1 once GPU 0 is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_gpu_claim_gets_a_bridged_pair_with_the_real_scheduler() {
    let Some(fixture) = fixture().await else {
        return;
    };
    let (node, client, namespace) = scene(fixture, PCIE_NODE, "nvlink").await;
    let gpu0 = dra_driver_nvidia::backend::mock::MockBackend::from_profile("pcie-a100-bridged")
        .unwrap()
        .hardware()
        .gpus[0]
        .info
        .uuid
        .clone();
    let first_gpu = workload::claim_template(
        &namespace,
        "first-gpu",
        "gpu.nvidia.com",
        json!({ "selectors": [{ "cel": { "expression":
            format!("device.attributes['gpu.nvidia.com'].uuid == '{gpu0}'") } }] }),
        None,
    )
    .unwrap();
    let pair: ResourceClaimTemplate = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": { "name": "nvlink-pair", "namespace": namespace },
        "spec": { "spec": { "devices": {
            "requests": [{ "name": "gpus", "exactly": { "deviceClassName": "gpu.nvidia.com", "count": 2 } }],
            "constraints": [{ "matchAttribute": "gpu.nvidia.com/nvlinkGroup" }],
        } } },
    }))
    .unwrap();
    let templates = Api::<ResourceClaimTemplate>::namespaced(client.clone(), &namespace);
    for template in [&first_gpu, &pair] {
        templates
            .create(&PostParams::default(), template)
            .await
            .unwrap();
    }
    let pods = Api::<Pod>::namespaced(client.clone(), &namespace);
    let run = |pod: &'static str, template: &'static str| {
        let spec = workload::pod_using(
            &namespace,
            pod,
            node.name(),
            &ClaimSource::Template(template.to_owned()),
            &["main"],
        );
        let pods = pods.clone();
        async move { pods.create(&PostParams::default(), &spec).await.unwrap() }
    };
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), &namespace);

    run("single", "first-gpu").await;
    workload::wait_for_pod_running(&client, &namespace, "single", TIMEOUT)
        .await
        .unwrap();
    assert_eq!(devices_of(&claims, "single").await, ["gpu-0"]);

    run("pair-a", "nvlink-pair").await;
    workload::wait_for_pod_running(&client, &namespace, "pair-a", TIMEOUT)
        .await
        .unwrap();
    assert_eq!(devices_of(&claims, "pair-a").await, ["gpu-2", "gpu-3"]);

    run("pair-b", "nvlink-pair").await;
    workload::wait_for_pod_event(&client, &namespace, "pair-b", "FailedScheduling", TIMEOUT)
        .await
        .unwrap_or_else(|error| panic!("pair-b should wait for a whole pair: {error}"));
    workload::delete_pods(&client, &namespace, &["single"], TIMEOUT)
        .await
        .unwrap();
    workload::wait_for_pod_running(&client, &namespace, "pair-b", TIMEOUT)
        .await
        .unwrap();
    assert_eq!(devices_of(&claims, "pair-b").await, ["gpu-0", "gpu-1"]);
    workload::delete_pods(&client, &namespace, &["pair-a", "pair-b"], TIMEOUT)
        .await
        .unwrap();
}

/// Device health with the real scheduler: an XID on the T4 node's only GPU taints it
/// `gpu.nvidia.com/xid=79:NoSchedule`, so a new pod asking for a GPU there stays unscheduled
/// (the scheduler reports it); once the operator resets the GPU the taint goes and the same
/// pod gets that GPU and runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_health_taint_keeps_new_pods_off_a_failed_gpu_until_it_recovers() {
    use k8s_openapi::api::resource::v1::ResourceSlice;

    let Some(fixture) = fixture().await else {
        return;
    };
    let (node, client, namespace) = scene(fixture, T4_NODE, "health").await;

    let slices = Api::<ResourceSlice>::all(client.clone());
    let on_node = ListParams::default().fields(&format!("spec.nodeName={T4_NODE}"));
    let gpu = |slices: &[ResourceSlice]| {
        slices
            .iter()
            .flat_map(|slice| slice.spec.devices.iter().flatten())
            .find(|device| device.name == "gpu-0")
            .cloned()
    };
    let published = gpu(&slices.list(&on_node).await.unwrap().items).expect("gpu-0 published");
    let uuid = published.attributes.as_ref().unwrap()["uuid"]
        .string
        .clone()
        .unwrap();
    let xid_taint = |device: &k8s_openapi::api::resource::v1::Device| {
        device
            .taints
            .iter()
            .flatten()
            .find(|taint| taint.key == "gpu.nvidia.com/xid")
            .map(|taint| (taint.value.clone(), taint.effect.clone()))
    };
    assert_eq!(xid_taint(&published), None);

    // The failure, as NVML would report it.
    let events = node.root_dir().join("health-events");
    std::fs::write(&events, format!("{uuid} xid 79\n")).unwrap();
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let device = gpu(&slices.list(&on_node).await.unwrap().items).unwrap();
        if xid_taint(&device) == Some((Some("79".into()), "NoSchedule".into())) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gpu-0 never tainted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A new pod for a GPU of this node: the only one is tainted.
    let template =
        workload::claim_template(&namespace, "any-gpu", "gpu.nvidia.com", json!({}), None).unwrap();
    Api::<ResourceClaimTemplate>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    let pod = workload::pod_using(
        &namespace,
        "after-failure",
        T4_NODE,
        &ClaimSource::Template("any-gpu".into()),
        &["main"],
    );
    let pods = Api::<Pod>::namespaced(client.clone(), &namespace);
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let refused = workload::wait_for_pod_event(
        &client,
        &namespace,
        "after-failure",
        "FailedScheduling",
        TIMEOUT,
    )
    .await
    .unwrap();
    println!("while tainted: {refused}");
    let pending = pods.get("after-failure").await.unwrap();
    assert!(
        pending
            .spec
            .as_ref()
            .and_then(|spec| spec.node_name.as_ref())
            .is_none(),
        "the pod was scheduled onto a tainted GPU"
    );

    // The operator's reset: untainted, and the waiting pod gets the GPU.
    std::fs::write(node.root_dir().join("health-reset").join("gpu-0"), "").unwrap();
    workload::wait_for_pod_running(&client, &namespace, "after-failure", TIMEOUT)
        .await
        .unwrap();
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), &namespace);
    let (_, device) = allocated_device(&claims, "after-failure").await;
    assert_eq!(device, "gpu-0");
    let device = gpu(&slices.list(&on_node).await.unwrap().items).unwrap();
    assert_eq!(xid_taint(&device), None);
    workload::delete_pods(&client, &namespace, &["after-failure"], TIMEOUT)
        .await
        .unwrap();
}

/// Creates the crate's DeviceClasses; another test of this binary may have created them.
/// What a scheduling test starts from: the shared cluster's node `node`, an admin client, a
/// namespace of its own (named after `namespace`) and the crate's DeviceClasses.
async fn scene<'a>(
    fixture: &'a Fixture,
    node: &str,
    namespace: &str,
) -> (&'a KubeletNode, kube::Client, String) {
    let cluster = &fixture.cluster;
    let client = cluster.client().await.unwrap();
    let namespace = cluster.create_namespace(namespace).await.unwrap();
    create_device_classes(&client).await;
    (cluster.node(node).unwrap(), client, namespace)
}

async fn create_device_classes(client: &kube::Client) {
    let classes = Api::<DeviceClass>::all(client.clone());
    for class in device_classes() {
        match classes.create(&PostParams::default(), &class).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => panic!("creating DeviceClass: {error}"),
        }
    }
}

/// The demo against the real cluster (`gpu-demo --kubeconfig`): real pods, the real scheduler
/// allocates every planned claim from the demo plugin's slices on `node-demo` (the
/// resourceclaim controller makes the template's claim), the demo prepares them through its
/// simulated kubelet, the wrong-type config fails alone, and everything it made is deleted.
#[cfg(feature = "demo")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_demo_runs_against_the_real_cluster() {
    use dra_sdk_testing::assert_contains;
    use k8s_openapi::api::resource::v1::ResourceSlice;
    let Some(fixture) = fixture().await else {
        return;
    };
    let cluster = &fixture.cluster;
    let client = cluster.client().await.unwrap();
    // The classes exist before the demo, as after a chart install: the demo uses them and
    // leaves them (another test of this binary uses them at the same time).
    create_device_classes(&client).await;
    let classes = Api::<DeviceClass>::all(client.clone());
    // dgx-a100 walks every step; mixed (one full T4, an A100 in MIG mode) leaves the memory
    // and product steps out and still succeeds.
    let runs = [
        (
            "dgx-a100",
            [
                "claim mig-job-0-mig (one 1g.10gb MIG slice, from ResourceClaimTemplate mig-slice) allocated",
                "summary: 6 claims, 6 allocated, 5 prepared, 1 failed (wrong-type), 6 unprepared",
                "0 CDI spec files left, 0 steps left out: OK",
            ],
        ),
        (
            "mixed",
            [
                "left out on this machine: claim by-memory",
                "summary: 4 claims, 4 allocated, 3 prepared, 1 failed (wrong-type), 4 unprepared",
                "0 CDI spec files left, 2 steps left out: OK",
            ],
        ),
    ];
    let mut namespaces = Vec::new();
    for (profile, expected) in runs {
        let namespace = cluster.create_namespace("gpu-demo").await.unwrap();
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-demo"));
        command
            .arg("--kubeconfig")
            .arg(cluster.kubeconfig())
            .args(["--node-name", DEMO_NODE, "--namespace", &namespace])
            .args(["--mock-profile", profile, "--timeout", "60"]);
        // Off the runtime: the binary takes some seconds.
        let output = tokio::task::spawn_blocking(move || command.output())
            .await
            .unwrap()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "{profile}: exit {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
            output.status
        );
        assert_contains(
            &stdout,
            format!("mock machine {profile} on node {DEMO_NODE}"),
        );
        for expected in expected {
            assert!(
                stdout.contains(expected),
                "{profile}: no {expected:?} in\n{stdout}"
            );
        }
        namespaces.push(namespace);
    }
    // Nothing of the demo is left but what the cluster's controllers finish deleting.
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={DEMO_NODE}")))
        .await
        .unwrap();
    assert!(
        slices.items.is_empty(),
        "slices left: {}",
        slices.items.len()
    );
    for namespace in &namespaces {
        let pods = Api::<Pod>::namespaced(client.clone(), namespace)
            .list(&ListParams::default())
            .await
            .unwrap();
        assert!(
            pods.items
                .iter()
                .all(|pod| pod.metadata.deletion_timestamp.is_some())
        );
    }
    for class in device_classes() {
        let name = class.metadata.name.unwrap();
        assert!(
            classes.get_opt(&name).await.unwrap().is_some(),
            "{name} deleted"
        );
    }
}

/// An MPS control-daemon Deployment as the driver builds it, on the real cluster: the API
/// server accepts it (privileged, hostPID, host paths), the real controller manager and
/// kubelet run its pod on the pinned node without the scheduler (the CRI double starts no
/// process, and the Deployment has no probe, so its container is Ready once it runs), the readiness
/// check passes once the test plays the daemon by creating its control socket, and the
/// Foreground delete ends with the Deployment gone (the garbage collector removing its
/// ReplicaSet and pod first). The whole prepare path is in `tests/sharing/mps_deployments.rs`;
/// the mock machine has no `nvidia-smi` to run it here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mps_daemon_deployment_runs_on_its_node_and_is_deleted_in_the_foreground() {
    use dra_driver_nvidia::host::ProcessId;
    use dra_driver_nvidia::sharing::MpsDaemonRecord;
    use dra_driver_nvidia::sharing::mps::{
        DaemonCommand, DeploymentRunner, MpsDeploymentConfig, Readiness,
    };

    let Some(fixture) = fixture().await else {
        return;
    };
    let cluster = &fixture.cluster;
    let client = cluster.client().await.unwrap();
    let namespace = cluster.create_namespace("mps").await.unwrap();
    let node = cluster.node(H100_NODE).unwrap();
    let root = node.root_dir().join("mps-e2e");
    let record = MpsDaemonRecord {
        id: "5e2c0c5e-7d6b-4b8e-9d44-3a7b1c0e2f10-0".into(),
        devices: vec!["gpu-0".into()],
        uuids: vec!["GPU-e2e".into()],
        exclusive_gpus: Vec::new(),
        process: ProcessId {
            pid: 0,
            start_time: 0,
        },
        deployment: None,
        dir: root.join("daemon"),
        shm_mounted: false,
        multi_user: false,
        control_commands: Vec::new(),
    };
    for dir in [record.pipe_dir(), record.log_dir(), record.shm_dir()] {
        std::fs::create_dir_all(dir).unwrap();
    }
    let daemon = DaemonCommand {
        node_root: root.clone(),
        mps_control: Some("/usr/bin/nvidia-cuda-mps-control".into()),
        chroot: None,
        library_dir: None,
    };
    let runner = DeploymentRunner::new(
        client.clone(),
        tokio::runtime::Handle::current(),
        H100_NODE,
        MpsDeploymentConfig::new(&namespace, "registry.example.com/gpu-kubelet-plugin:e2e"),
    );
    // The runner blocks (the driver calls it from blocking threads).
    let deployment = {
        let (runner, record) = (runner.clone(), record.clone());
        tokio::task::spawn_blocking(move || {
            let desired = runner.build(&record, &daemon).unwrap();
            runner.create(&record.id, &desired).unwrap()
        })
        .await
        .unwrap()
    };
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let (runner, record, reference) = (runner.clone(), record.clone(), deployment.clone());
        let last = tokio::task::spawn_blocking(move || runner.readiness(&record, &reference))
            .await
            .unwrap()
            .unwrap();
        match &last {
            // The Deployment and its pod are ready; only the daemon's socket is missing.
            Readiness::Waiting(why) if why.contains("is ready but") => break,
            Readiness::Failed(why) => panic!("{why}"),
            _ if std::time::Instant::now() > deadline => panic!("not ready: {last:?}"),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    std::fs::write(record.pipe_dir().join("control"), "").unwrap();
    let pods = Api::<Pod>::namespaced(client.clone(), &namespace);
    let listed = pods
        .list(
            &ListParams::default().labels(&format!("resource.nvidia.com/mps-daemon={}", record.id)),
        )
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1, "{listed:?}");
    let pod = &listed.items[0];
    assert_eq!(
        pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some(H100_NODE)
    );
    {
        let (runner, record, reference) = (runner.clone(), record.clone(), deployment.clone());
        let ready = tokio::task::spawn_blocking(move || {
            let ready = runner.readiness(&record, &reference).unwrap();
            runner.delete(&reference, TIMEOUT).unwrap();
            (ready, runner.current_uid(&reference).unwrap())
        })
        .await
        .unwrap();
        assert_eq!(ready, (Readiness::Ready, None));
    }
    assert!(
        pods.list(
            &ListParams::default().labels(&format!("resource.nvidia.com/mps-daemon={}", record.id))
        )
        .await
        .unwrap()
        .items
        .iter()
        .all(|pod| pod.metadata.deletion_timestamp.is_some()),
        "Foreground deletion: the pod is gone (or going) once the Deployment is"
    );
}
