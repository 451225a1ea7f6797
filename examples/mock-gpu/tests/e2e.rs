//! The mock GPU plugin, as the binary operators run, against real Kubernetes v1.36
//! components: the SDK's end-to-end suite (with `--device-metadata`, plus the KEP-5304
//! metadata file seen from the runtime's side), then the demo (`mock-gpu-demo --kubeconfig`).
//! Skipped, with one line saying so, without `DRA_E2E_K8S_BIN` (see `dra_sdk_testing::e2e`).

use std::path::Path;
use std::time::Duration;

use dra_sdk::advanced::cdi::Spec;
use dra_sdk_testing::assert_contains;
use dra_sdk_testing::claims::allocation_results;
use dra_sdk_testing::e2e::suite::E2eSuite;
use dra_sdk_testing::e2e::workload::{self, ClaimSource};
use dra_sdk_testing::e2e::{RealCluster, binaries_or_skip};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate};
use kube::Api;
use kube::api::PostParams;
use mock_gpu::DEFAULT_DRIVER_NAME;
use serde_json::json;
use tokio::sync::OnceCell;

static CLUSTER: OnceCell<RealCluster> = OnceCell::const_new();

async fn cluster() -> Option<&'static RealCluster> {
    let binaries = binaries_or_skip()?;
    Some(
        CLUSTER
            .get_or_init(|| async {
                RealCluster::builder(binaries)
                    .start()
                    .await
                    .unwrap_or_else(|error| panic!("starting the e2e cluster: {error}"))
            })
            .await,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_binary_passes_the_e2e_suite() {
    let Some(cluster) = cluster().await else {
        return;
    };
    let node = cluster.node("node-1").unwrap();
    let args: Vec<String> = [
        "--kubeconfig",
        &cluster.kubeconfig().display().to_string(),
        "--node-name",
        node.name(),
        "--num-devices",
        "4",
        "--kubelet-registrar-directory-path",
        &node.registrar_dir().display().to_string(),
        "--kubelet-plugins-directory-path",
        &node.plugins_dir().display().to_string(),
        "--cdi-root",
        &node.cdi_root().display().to_string(),
        "--device-metadata",
    ]
    .iter()
    .map(|arg| (*arg).to_owned())
    .collect();
    let mut plugin = cluster
        .spawn_program(
            "mock-gpu-kubelet-plugin",
            Path::new(env!("CARGO_BIN_EXE_mock-gpu-kubelet-plugin")),
            &args,
        )
        .unwrap();
    node.wait_for_registration(DEFAULT_DRIVER_NAME, 0, Duration::from_secs(60))
        .await
        .unwrap_or_else(|error| panic!("{error}; plugin log:\n{}", plugin.log_tail(20)));

    let report = E2eSuite::new(cluster, node.name(), DEFAULT_DRIVER_NAME)
        .bad_config(
            json!({
                "apiVersion": "gpu.resource.example.com/v1alpha1",
                "kind": "GpuConfig",
                "sharing": { "strategy": "TimeSlicing", "timeSlicingConfig": { "intervall": "Long" } },
            }),
            "unknown field `sharing.timeSlicingConfig.intervall`",
        )
        .run()
        .await
        .unwrap();
    println!("{report}");
    report.assert_all_passed();
    metadata_reaches_the_container(cluster, node.name())
        .await
        .unwrap_or_else(|error| panic!("{error}; plugin log:\n{}", plugin.log_tail(20)));
    plugin.stop();
}

/// KEP-5304 on the real kubelet: the container's CDI devices (as the CRI double received
/// them) name the claim's metadata device, whose spec mounts the metadata file at the path
/// upstream uses; the file describes the allocated device; deleting the pod removes both.
async fn metadata_reaches_the_container(
    cluster: &RealCluster,
    node_name: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let timeout = Duration::from_secs(60);
    let node = cluster.node(node_name)?;
    let client = cluster.client().await?;
    let namespace = cluster.create_namespace("metadata").await?;
    let class = workload::device_class("e2e-metadata", DEFAULT_DRIVER_NAME, None)?;
    Api::<DeviceClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await?;
    let template = workload::claim_template(&namespace, "gpu", "e2e-metadata", json!({}), None)?;
    Api::<ResourceClaimTemplate>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &template)
        .await?;
    let pod = workload::pod_using(
        &namespace,
        "reader",
        node_name,
        &ClaimSource::Template("gpu".into()),
        &["ctr"],
    );
    Api::<Pod>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &pod)
        .await?;
    let pod = workload::wait_for_pod_running(&client, &namespace, "reader", timeout).await?;

    let devices = node
        .cri_log()
        .wait_for_container(&format!("{namespace}/reader"), "ctr", timeout)
        .await?;
    let prefix = format!("{DEFAULT_DRIVER_NAME}/metadata=");
    let metadata_ids: Vec<&String> = devices
        .iter()
        .filter(|id| id.starts_with(&prefix))
        .collect();
    assert_eq!(
        metadata_ids.len(),
        1,
        "CDI devices of the container: {devices:?}"
    );
    assert!(
        devices.len() >= 2,
        "the GPU's own device is passed too: {devices:?}"
    );
    // `<driver>/metadata=<claim uid>_<request>`; the pod's claim and the template's request
    // are both named `dev`.
    let device_name = &metadata_ids[0][prefix.len()..];
    let claim_uid = device_name
        .strip_suffix("_dev")
        .unwrap_or_else(|| panic!("metadata device {device_name} is not for request dev"));

    let claim_name = pod
        .status
        .and_then(|status| status.resource_claim_statuses)
        .and_then(|statuses| statuses.into_iter().next())
        .and_then(|status| status.resource_claim_name)
        .expect("the pod names its claim");
    let claim = Api::<ResourceClaim>::namespaced(client.clone(), &namespace)
        .get(&claim_name)
        .await?;
    assert_eq!(claim.metadata.uid.as_deref(), Some(claim_uid));
    let allocated = allocation_results(&claim);
    assert_eq!(allocated.len(), 1, "{allocated:?}");

    let spec_path = node.cdi_root().join(format!(
        "{DEFAULT_DRIVER_NAME}_metadata_{claim_uid}_dev.json"
    ));
    let spec = Spec::read_file(&spec_path)?;
    assert_eq!(
        spec.kind.to_string(),
        format!("{DEFAULT_DRIVER_NAME}/metadata")
    );
    let device = spec
        .devices
        .iter()
        .find(|device| device.name == device_name)
        .expect("the spec defines the device the container got");
    let mounts = &device.container_edits.mounts;
    assert_eq!(mounts.len(), 1, "{mounts:?}");
    assert_eq!(
        mounts[0].container_path,
        format!(
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/dev/dev/{DEFAULT_DRIVER_NAME}-metadata.json"
        )
    );
    let host_file = Path::new(&mounts[0].host_path).to_path_buf();
    assert_eq!(
        host_file,
        node.plugins_dir()
            .join(DEFAULT_DRIVER_NAME)
            .join("dra-device-metadata")
            .join(format!("{namespace}_{claim_name}/dev/metadata.json"))
    );

    let object: serde_json::Value = serde_json::from_slice(&std::fs::read(&host_file)?)?;
    assert_eq!(object["apiVersion"], "metadata.resource.k8s.io/v1alpha1");
    assert_eq!(object["kind"], "DeviceMetadata");
    assert_eq!(object["metadata"]["namespace"], namespace.as_str());
    assert_eq!(object["metadata"]["name"], claim_name.as_str());
    assert_eq!(object["metadata"]["uid"], claim_uid);
    assert_eq!(object["podClaimName"], "dev");
    assert_eq!(object["requests"][0]["name"], "dev");
    let file_device = &object["requests"][0]["devices"][0];
    assert_eq!(file_device["driver"], DEFAULT_DRIVER_NAME);
    assert_eq!(file_device["pool"], allocated[0].pool.as_str());
    assert_eq!(file_device["name"], allocated[0].device.as_str());
    assert!(
        file_device["attributes"]
            .as_object()
            .is_some_and(|attributes| !attributes.is_empty()),
        "the device's published attributes: {object}"
    );

    workload::delete_pods(&client, &namespace, &["reader"], timeout).await?;
    let deadline = std::time::Instant::now() + timeout;
    while spec_path.exists() || host_file.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "metadata spec or file left {timeout:?} after the pod was deleted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Api::<DeviceClass>::all(client)
        .delete("e2e-metadata", &Default::default())
        .await?;
    Ok(())
}

/// The README's main job against a real cluster: `mock-gpu-demo --kubeconfig` creates real
/// Pods, the real scheduler allocates their claims from the demo plugin's slices, the claims
/// stay allocated while the demo prepares them, and the binary exits 0 with a true summary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_runs_against_the_real_cluster() {
    let Some(cluster) = cluster().await else {
        return;
    };
    let namespace = cluster.create_namespace("demo").await.unwrap();
    let binary = env!("CARGO_BIN_EXE_mock-gpu-demo");
    let mut command = std::process::Command::new(binary);
    command
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig())
        .args(["--node-name", "node-1", "--namespace", &namespace])
        .env("DRIVER_NAME", "e2e-demo.gpu.example.com");
    // Off the runtime: the binary takes a few seconds.
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert_contains(
        &stdout,
        "summary: 4 of 4 claims allocated by the cluster's scheduler, 3 prepared, \
             1 failed (bad-config at prepare, as expected), 4 unprepared, 0 CDI spec files left",
    );
    assert_contains(
        &stdout,
        "unknown field `sharing.timeSlicingConfig.intervall`",
    );
    // Everything it created is gone.
    let client = cluster.client().await.unwrap();
    let pods = kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), &namespace)
        .list(&Default::default())
        .await
        .unwrap();
    assert!(pods.items.is_empty(), "pods left: {}", pods.items.len());
    let claims =
        kube::Api::<k8s_openapi::api::resource::v1::ResourceClaim>::namespaced(client, &namespace)
            .list(&Default::default())
            .await
            .unwrap();
    assert!(
        claims.items.is_empty(),
        "claims left: {}",
        claims.items.len()
    );
}
