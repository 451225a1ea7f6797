//! Restarts over a checkpoint that was corrupt, missing or from another boot: the CDI specs of
//! claims the kubelet still considers prepared are kept (no sweep on a checkpoint not read
//! intact), the claim's next unprepare removes its spec, and a stray spec next to an intact
//! checkpoint is still swept.

use std::path::Path;

use dra_sdk::driver::ClaimRef;
use dra_sdk::testing::claims::AllocatedClaim;
use dra_sdk::testing::cluster::{NODE_NAME, TestCluster, claim_ref};
use dra_sdk::testing::kubelet::KubeletVersion;

mod driver_common;

use driver_common::{DRIVER, GpuDriver};

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
    let (checkpoint, _) = dra_sdk::checkpoint::Checkpoint::open(
        &cluster.plugins_dir().join(DRIVER),
        dra_sdk::testing::cluster::BOOT_ID,
    )
    .unwrap();
    checkpoint
        .update([dra_sdk::checkpoint::ClaimChange::remove(claim.uid.clone())])
        .unwrap();
    let plugin = cluster
        .plugin(GpuDriver::default(), DRIVER)
        .start()
        .await
        .unwrap();
    assert!(!has_spec(&cdi_root, &claim.uid));
    plugin.shutdown().await.unwrap();
}
