//! The Helm chart on a real v1.36.2 API server (the SDK's e2e harness): every object `helm
//! template` renders with `ci/upstream-guide-values.yaml`, `ci/all-options-values.yaml` and
//! `ci/mock-values.yaml` is
//! accepted by a server-side apply with strict field validation; then `gpu-kubelet-plugin
//! --mock-profile` runs with a token of the chart's ServiceAccount bound to a pod on its node,
//! as the kubelet would mount it, and uses every verb the chart's role gives it: it replaces a
//! left-over slice of its pool with its own (`list`, `watch`, `delete`, `create`; owned by the
//! Node: `get` nodes), rewrites its slice when the node's GPUs change (`update`), registers, and
//! prepares a claim of the chart's `gpu.nvidia.com` DeviceClass for a pod (`get`
//! resourceclaims), while the chart's ValidatingAdmissionPolicy denies it any write to another
//! node's or another driver's slice.
//! Needs `HELM` and `DRA_E2E_K8S_BIN`; skips without them unless `HELM_REQUIRED=1` or
//! `DRA_E2E_REQUIRED=1`.

use std::path::{Path, PathBuf};

use dra_driver_nvidia::devices::{DRIVER_NAME, GPU_DEVICE_CLASS};
use dra_sdk_testing::deliverables::{chart as shared, chart_cluster as shared_e2e};
use dra_sdk_testing::e2e::{ManagedProcess, RealCluster, workload};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, PostParams};
use serde_json::Value;
use shared::render_chart;
use shared_e2e::{
    TIMEOUT, apply_strictly, assert_slice_writes_confined, client_from, create_claim_template,
    node_bound_kubeconfig, run_pod, slice, start_chart_cluster, wait_for_slices,
};

const RELEASE: &str = "nvidia-dra";
/// GPUs of the dgx-h100 mock profile.
const PROFILE_GPUS: usize = 8;

fn chart_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/helm/dra-driver-nvidia-gpu")
}

/// The chart with `values` (a file of `ci/`), its DaemonSet kept off every node: its pods
/// would need the image, and its host paths would be this machine's. The plugin runs as a
/// process below, with the pod's identity.
fn render(helm: &Path, namespace: &str, values: &str) -> Vec<Value> {
    let values = chart_dir().join("ci").join(values).display().to_string();
    render_chart(
        helm,
        &chart_dir(),
        RELEASE,
        namespace,
        &[
            "-f",
            &values,
            "--set",
            "kubeletPlugin.nodeSelector.dra-sdk\\.dev/chart-e2e=never",
        ],
    )
    .unwrap_or_else(|error| panic!("helm template with {values}: {error}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_installs_and_confines_the_plugin_to_its_node() {
    let Some((helm, cluster, admin)) = start_chart_cluster().await else {
        return;
    };
    let namespace = cluster.create_namespace("nvidia-chart").await.unwrap();

    // An upstream-guide-style install applies strictly; the mock install then replaces it
    // (same release, same object names).
    apply_strictly(
        &admin,
        &render(&helm, &namespace, "upstream-guide-values.yaml"),
    )
    .await;
    // Every documented option (the health flags and their host path included) applies
    // strictly as well; its objects have names of their own (`fullnameOverride`).
    apply_strictly(
        &admin,
        &render(&helm, &namespace, "all-options-values.yaml"),
    )
    .await;
    let documents = render(&helm, &namespace, "mock-values.yaml");
    apply_strictly(&admin, &documents).await;
    // A token for the ServiceAccount bound to a pod on node-1, like the one the kubelet mounts
    // into the plugin's pod: it names the node.
    let kubeconfig =
        node_bound_kubeconfig(&cluster, &admin, &namespace, &documents, "node-1").await;
    let node = cluster.node("node-1").unwrap();

    // A slice of node-1's pool left by an earlier install: the plugin replaces the pool, so it
    // deletes that slice (`delete`) and writes its own (`create`).
    let slices_api = Api::<ResourceSlice>::all(admin.clone());
    slices_api
        .create(
            &PostParams::default(),
            &slice("left-over", "node-1", DRIVER_NAME),
        )
        .await
        .unwrap();
    let mut plugin = spawn_plugin(&cluster, &kubeconfig, "dgx-h100");
    let slices = wait_for_slices(&admin, DRIVER_NAME, "node-1", |s| {
        full_gpus(s) == PROFILE_GPUS
            && s.iter()
                .all(|s| s.metadata.name.as_deref() != Some("left-over"))
    })
    .await
    .unwrap_or_else(|error| panic!("{error}; plugin log:\n{}", plugin.log_tail(30)));
    // The owner reference needs the Node's UID: `get` on nodes was allowed.
    for slice in &slices {
        let owner = &slice.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("Node", "node-1")
        );
    }
    let first: Vec<_> = slices
        .iter()
        .map(|s| (s.metadata.name.clone(), s.metadata.resource_version.clone()))
        .collect();
    plugin.stop();

    // The node now has one T4 (the workstation profile): its slice is rewritten (`update`).
    let mut plugin = spawn_plugin(&cluster, &kubeconfig, "workstation");
    let slices = wait_for_slices(&admin, DRIVER_NAME, "node-1", |s| full_gpus(s) == 1)
        .await
        .unwrap_or_else(|error| panic!("{error}; plugin log:\n{}", plugin.log_tail(30)));
    let updated = slices.iter().any(|slice| {
        first.iter().any(|(name, version)| {
            *name == slice.metadata.name && *version != slice.metadata.resource_version
        })
    });
    assert!(
        updated,
        "no slice was updated in place: {first:?} then {slices:?}"
    );
    node.wait_for_registration(DRIVER_NAME, 0, TIMEOUT)
        .await
        .unwrap_or_else(|error| panic!("{error}; plugin log:\n{}", plugin.log_tail(30)));

    // A pod with a claim of the chart's gpu.nvidia.com DeviceClass: the plugin reads the
    // claim (get) and prepares it.
    create_claim_template(&admin, &namespace, "one-gpu", GPU_DEVICE_CLASS).await;
    run_pod(&admin, &namespace, "uses-a-gpu", "one-gpu", &plugin).await;

    // The policy: the same token may not write node-2's slices or another driver's.
    let as_plugin = client_from(&kubeconfig).await;
    assert_slice_writes_confined(&as_plugin, &admin, DRIVER_NAME).await;

    workload::delete_pods(&admin, &namespace, &["uses-a-gpu"], TIMEOUT)
        .await
        .unwrap();
    plugin.stop();
}

/// `gpu-kubelet-plugin --mock-profile <profile>` for node-1, with the kubelet directories of
/// the e2e node and its mock host files in the cluster's folder.
fn spawn_plugin(cluster: &RealCluster, kubeconfig: &Path, profile: &str) -> ManagedProcess {
    let mut args = cluster.node("node-1").unwrap().plugin_args(kubeconfig);
    args.extend([
        "--mock-profile".into(),
        profile.into(),
        "--mock-host-root".into(),
        cluster
            .path()
            .join(format!("mock-host-{profile}"))
            .display()
            .to_string(),
    ]);
    cluster
        .spawn_program(
            &format!("gpu-plugin-{profile}"),
            Path::new(env!("CARGO_BIN_EXE_gpu-kubelet-plugin")),
            &args,
        )
        .unwrap()
}

/// Full GPUs in `slices`: `gpu-<minor>` (MIG and VFIO devices have longer names).
fn full_gpus(slices: &[ResourceSlice]) -> usize {
    slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .filter(|d| {
            d.name
                .strip_prefix("gpu-")
                .is_some_and(|minor| minor.parse::<u32>().is_ok())
        })
        .count()
}
