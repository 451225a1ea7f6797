//! Restarts over a checkpoint that was corrupt, missing or from another boot: the CDI specs of
//! claims the kubelet still considers prepared are kept (no sweep on a checkpoint not read
//! intact), the claim's next unprepare removes its spec, and a stray spec next to an intact
//! checkpoint is still swept. And a restart with another device inventory: stale pools are
//! replaced before registration, and a claim allocated from them is refused.

use std::path::Path;

use dra_sdk::claim::ClaimRef;
use dra_sdk::slices::{Device, DriverResources, Pool};
use dra_sdk_allocator::allocate_claim;
use dra_sdk_testing::assert_contains;
use dra_sdk_testing::claims::AllocatedClaim;
use dra_sdk_testing::cluster::{NODE_NAME, TestCluster, claim_ref};
use dra_sdk_testing::kubelet::KubeletVersion;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{ListParams, PostParams};

use dra_sdk_testing::sample_driver::{DRIVER, GpuDriver, gpus};

#[derive(Clone, Copy, Debug)]
enum Damage {
    Corrupt,
    Missing,
    OtherBoot,
    /// The control: an intact checkpoint.
    None,
}

fn has_spec(cdi_root: &Path, uid: &str) -> bool {
    std::fs::read_dir(cdi_root).is_ok_and(|entries| {
        entries.flatten().any(|entry| {
            entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.ends_with(&format!("_{uid}.json")))
        })
    })
}

async fn gpu_claim(cluster: &TestCluster, name: &str) -> ClaimRef {
    let claim = AllocatedClaim::new("default", name)
        .device("gpu", DRIVER, NODE_NAME, "gpu-0")
        .create(&cluster.client())
        .await
        .unwrap();
    claim_ref(&claim).unwrap()
}

/// Prepares a claim, stops the plugin, damages the checkpoint, starts it again; returns
/// whether the claim's spec survived the start, and checks that unprepare then cleans up.
async fn spec_survives_restart(damage: Damage) -> bool {
    let cluster = TestCluster::start().await.unwrap();
    let cdi_root = cluster.cdi_root();
    let plugin = cluster
        .plugin(GpuDriver::default(), DRIVER)
        .start()
        .await
        .unwrap();
    let kubelet = cluster
        .register(&plugin, KubeletVersion::V1_36)
        .await
        .unwrap();
    let claim = gpu_claim(&cluster, "running").await;
    assert!(kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap()[&claim.uid].is_ok());
    assert!(has_spec(&cdi_root, &claim.uid));
    plugin.shutdown().await.unwrap();

    let checkpoint = cluster.plugins_dir().join(DRIVER).join("checkpoint.json");
    match damage {
        Damage::Corrupt => std::fs::write(&checkpoint, b"{ not json").unwrap(),
        Damage::Missing => std::fs::remove_file(&checkpoint).unwrap(),
        Damage::OtherBoot | Damage::None => {}
    }
    let mut builder = cluster.plugin(GpuDriver::default(), DRIVER);
    if matches!(damage, Damage::OtherBoot) {
        builder = builder.boot_id("the-next-boot");
    }
    let plugin = builder.start().await.unwrap();
    let survived = has_spec(&cdi_root, &claim.uid);

    // Whatever the checkpoint says, the kubelet's unprepare succeeds and leaves no spec.
    let kubelet = cluster
        .register(&plugin, KubeletVersion::V1_36)
        .await
        .unwrap();
    let outcome = kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(outcome[&claim.uid].is_ok(), "{damage:?}: {outcome:?}");
    assert!(!has_spec(&cdi_root, &claim.uid), "{damage:?}");
    plugin.shutdown().await.unwrap();
    survived
}

#[tokio::test]
async fn a_corrupt_checkpoint_keeps_the_cdi_specs() {
    assert!(spec_survives_restart(Damage::Corrupt).await);
}

#[tokio::test]
async fn a_missing_checkpoint_keeps_the_cdi_specs() {
    assert!(spec_survives_restart(Damage::Missing).await);
}

#[tokio::test]
async fn a_checkpoint_from_another_boot_keeps_the_cdi_specs() {
    assert!(spec_survives_restart(Damage::OtherBoot).await);
}

#[tokio::test]
async fn an_intact_checkpoint_keeps_its_claims_specs_and_sweeps_strays() {
    assert!(spec_survives_restart(Damage::None).await);

    // A spec of a claim no instance records, left next to an intact checkpoint, goes.
    let cluster = TestCluster::start().await.unwrap();
    let cdi_root = cluster.cdi_root();
    let plugin = cluster
        .plugin(GpuDriver::default(), DRIVER)
        .start()
        .await
        .unwrap();
    let kubelet = cluster
        .register(&plugin, KubeletVersion::V1_36)
        .await
        .unwrap();
    let claim = gpu_claim(&cluster, "stray").await;
    assert!(kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap()[&claim.uid].is_ok());
    plugin.shutdown().await.unwrap();
    // Forget the claim, as a crash between the spec removal and the checkpoint write would
    // the other way round.
    let (checkpoint, _) = dra_sdk::advanced::checkpoint::Checkpoint::open(
        &cluster.plugins_dir().join(DRIVER),
        dra_sdk_testing::cluster::BOOT_ID,
    )
    .unwrap();
    checkpoint
        .update([dra_sdk::advanced::checkpoint::ClaimChange::remove(
            claim.uid.clone(),
        )])
        .unwrap();
    let plugin = cluster
        .plugin(GpuDriver::default(), DRIVER)
        .start()
        .await
        .unwrap();
    assert!(!has_spec(&cdi_root, &claim.uid));
    plugin.shutdown().await.unwrap();
}

/// A claim the scheduler allocates from `class` on the test node, as it would from the slices
/// the API server holds now.
async fn scheduled_claim(cluster: &TestCluster, name: &str) -> ResourceClaim {
    let claims: Api<ResourceClaim> = Api::namespaced(cluster.client(), "default");
    let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "namespace": "default" },
        "spec": { "devices": { "requests": [
            { "name": "gpu", "exactly": { "deviceClassName": "gpu" } },
        ] } },
    }))
    .unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap();
    allocate_claim(&cluster.client(), "default", name, NODE_NAME, None)
        .await
        .unwrap()
}

fn allocated(claim: &ResourceClaim) -> (String, String) {
    let result = &claim
        .status
        .as_ref()
        .unwrap()
        .allocation
        .as_ref()
        .unwrap()
        .devices
        .as_ref()
        .unwrap()
        .results
        .as_ref()
        .unwrap()[0];
    (result.pool.clone(), result.device.clone())
}

/// The plugin restarted with another inventory (one pool per GPU before, one pool for the node
/// after, as the NVIDIA plugin does when DynamicMIG is switched off). A claim the scheduler
/// allocated from the old slices must not be prepared as the new `gpu-0`: the scheduler gives
/// that one to another claim, and the GPU would be handed out twice.
#[tokio::test]
async fn a_claim_from_a_stale_pool_is_refused_and_no_device_goes_twice() {
    let cluster = TestCluster::start().await.unwrap();
    cluster.create_device_class("gpu", DRIVER).await.unwrap();
    let pool_per_gpu = (0..2).fold(DriverResources::new(), |resources, i| {
        resources.with_pool(
            format!("{NODE_NAME}/gpu-{i}"),
            Pool::new(vec![Device::new(format!("gpu-{i}"))]),
        )
    });
    let plugin = cluster
        .plugin(GpuDriver::default(), DRIVER)
        .resources(pool_per_gpu)
        .start()
        .await
        .unwrap();
    plugin.published().await;
    plugin.shutdown().await.unwrap();

    // While no plugin runs, the scheduler still sees the old slices.
    let stale = scheduled_claim(&cluster, "stale").await;
    let stale_pool = format!("{NODE_NAME}/gpu-0");
    assert_eq!(allocated(&stale), (stale_pool.clone(), "gpu-0".to_owned()));

    let plugin = cluster
        .plugin(GpuDriver::default(), DRIVER)
        .resources(gpus(2))
        .start()
        .await
        .unwrap();
    // By the time the kubelet can see the plugin, the old pools are gone.
    let slices: Api<ResourceSlice> = Api::all(cluster.client());
    let pools: Vec<String> = slices
        .list(&ListParams::default())
        .await
        .unwrap()
        .into_iter()
        .map(|slice| slice.spec.pool.name)
        .collect();
    assert_eq!(
        pools,
        [NODE_NAME],
        "stale pools still published at registration"
    );

    let kubelet = cluster
        .register(&plugin, KubeletVersion::V1_36)
        .await
        .unwrap();
    let stale = claim_ref(&stale).unwrap();
    let refused = kubelet.prepare(std::slice::from_ref(&stale)).await.unwrap()[&stale.uid]
        .clone()
        .unwrap_err();
    assert_contains(
        &refused,
        format!("pool {stale_pool:?}, which this plugin does not publish"),
    );
    // The new gpu-0 goes to the claim the scheduler allocates from the new slices, once.
    let fresh = scheduled_claim(&cluster, "fresh").await;
    assert_eq!(
        allocated(&fresh),
        (NODE_NAME.to_owned(), "gpu-0".to_owned())
    );
    let fresh = claim_ref(&fresh).unwrap();
    let prepared = kubelet.prepare(std::slice::from_ref(&fresh)).await.unwrap();
    assert!(prepared[&fresh.uid].is_ok(), "{prepared:?}");
    // A retry of the refused claim is refused again, not served from the checkpoint.
    let again = kubelet.prepare(std::slice::from_ref(&stale)).await.unwrap();
    assert!(again[&stale.uid].is_err(), "{again:?}");
    plugin.shutdown().await.unwrap();
}
