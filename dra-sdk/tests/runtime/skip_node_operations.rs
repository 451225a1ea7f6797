//! `PluginBuilder::skip_node_operations` (Kubernetes 1.37 alpha, `DRAOptionalNodeOperations`):
//! the node's slices say the driver needs no prepare/unprepare, and the plugin still serves
//! both calls for a kubelet that makes them (older kubelets, the gate off, a server that
//! dropped the field). Runs on the fake API server and the kubelet simulator only.

use std::time::Duration;

use dra_sdk::claim::ClaimRef;
use dra_sdk_testing::apiserver::FakeApiServer;
use dra_sdk_testing::claims::AllocatedClaim;
use dra_sdk_testing::cluster::{NODE_NAME, TestCluster};
use dra_sdk_testing::kubelet::KubeletVersion;
use dra_sdk_testing::sample_driver::{DRIVER, GpuDriver, gpus};
use k8s_openapi::api::resource::v1::ResourceSlice;

async fn slices_when(
    cluster: &TestCluster,
    done: impl Fn(&[ResourceSlice]) -> bool,
) -> Vec<ResourceSlice> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let slices = cluster.api().list::<ResourceSlice>().unwrap();
        if done(&slices) {
            return slices;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "slices never got there: {slices:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn prepare_and_unprepare(
    cluster: &TestCluster,
    plugin: &dra_sdk::plugin::KubeletPlugin,
    version: KubeletVersion,
) {
    let kubelet = cluster.register(plugin, version).await.unwrap();
    let claim = AllocatedClaim::new("default", "skip")
        .device("gpu", DRIVER, NODE_NAME, "gpu-1")
        .create(&cluster.client())
        .await
        .unwrap();
    let claim = ClaimRef {
        uid: claim.metadata.uid.clone().unwrap(),
        namespace: claim.metadata.namespace.clone().unwrap(),
        name: claim.metadata.name.clone().unwrap(),
    };
    let prepared = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
    let devices = prepared[&claim.uid].as_ref().unwrap();
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].device, "gpu-1");
    assert_eq!(devices[0].cdi_device_ids.len(), 1);
    let unprepared = kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(unprepared[&claim.uid], Ok(()));
}

#[tokio::test]
async fn slices_say_skip_and_a_kubelet_that_still_calls_gets_prepare_and_unprepare() {
    let api = FakeApiServer::builder()
        .git_version("v1.37.0")
        .start()
        .await
        .unwrap();
    let cluster = TestCluster::start_on(api).unwrap();
    let plugin = cluster
        .plugin(GpuDriver::default(), DRIVER)
        .resources(gpus(2))
        .skip_node_operations()
        .start()
        .await
        .unwrap();
    let slices = slices_when(&cluster, |s| !s.is_empty()).await;
    for slice in &slices {
        assert_eq!(
            slice.spec.skip_node_operations.as_deref(),
            Some(
                &[
                    "NodePrepareResources".to_owned(),
                    "NodeUnprepareResources".to_owned()
                ][..]
            ),
        );
    }
    // A 1.36 kubelet knows nothing of the field; a 1.37 one with the gate off calls as well.
    prepare_and_unprepare(&cluster, &plugin, KubeletVersion::V1_37).await;
    plugin.shutdown().await.unwrap();
}

#[tokio::test]
async fn on_a_server_that_drops_the_field_the_plugin_still_prepares() {
    let api = FakeApiServer::builder()
        .git_version("v1.37.0")
        .start()
        .await
        .unwrap();
    assert!(api.disable_feature_gate("DRAOptionalNodeOperations"));
    let cluster = TestCluster::start_on(api).unwrap();
    let plugin = cluster
        .plugin(GpuDriver::default(), DRIVER)
        .resources(gpus(2))
        .skip_node_operations()
        .start()
        .await
        .unwrap();
    let slices = slices_when(&cluster, |s| !s.is_empty()).await;
    assert!(slices.iter().all(|s| s.spec.skip_node_operations.is_none()));
    prepare_and_unprepare(&cluster, &plugin, KubeletVersion::V1_36).await;
    plugin.shutdown().await.unwrap();
}
