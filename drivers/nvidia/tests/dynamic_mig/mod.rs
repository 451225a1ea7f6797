//! Dynamic MIG through the kubelet simulator: the exact MIG calls of prepare, unprepare and
//! rollback on the mock backend, the capability nodes of the created instance, and the
//! checkpoint records. Part of the `prepare` test binary (no binary of its own: link time).

use dra_driver_nvidia::backend::mig::{MigCall, MigCallKind};
use dra_driver_nvidia::backend::{GpuBackend, MigPlacement};
use dra_driver_nvidia::sharing::ConsumableShares;
use dra_sdk::advanced::checkpoint::Checkpoint;
use dra_sdk::claim::RecordedClaim;
use dra_sdk::driver::Driver;
use dra_sdk_testing::assert_contains;
use dra_sdk_testing::cluster::BOOT_ID;

use super::*;

mod layouts;

const GATES: &str = "DynamicMIG=true";

async fn start_dynamic(profile: &str) -> Running {
    let r = start(profile, GATES).await;
    r.f.creatable_mig_capabilities();
    r
}

/// A claim for the 3g.40gb partition at 4:4 of GPU 0 (`dgx-h100`).
fn slice_of_gpu_0() -> AllocatedClaim {
    AllocatedClaim::new("default", "slice").device(
        "mig",
        DRIVER_NAME,
        NODE_NAME,
        "gpu-0-mig-3g40gb-9-4",
    )
}

fn record(r: &Running, claim: &ClaimRef) -> dra_sdk::advanced::checkpoint::ClaimRecord {
    let (checkpoint, _) =
        Checkpoint::open(&r.cluster.plugins_dir().join(DRIVER_NAME), BOOT_ID).unwrap();
    checkpoint.records().unwrap().remove(&claim.uid).unwrap()
}

fn create_gi(gpu: &str, profile_id: u32, start: u32, size: u32) -> MigCall {
    MigCall::CreateGpuInstance {
        gpu: gpu.to_owned(),
        profile_id,
        placement: MigPlacement::new(start, size),
    }
}

fn create_ci(gpu: &str, gi: u32) -> MigCall {
    MigCall::CreateComputeInstance {
        gpu: gpu.to_owned(),
        gpu_instance_id: gi,
    }
}

fn destroy(gpu: &str, gi: u32) -> [MigCall; 2] {
    [
        MigCall::DestroyComputeInstance {
            gpu: gpu.to_owned(),
            gpu_instance_id: gi,
            compute_instance_id: 0,
        },
        MigCall::DestroyGpuInstance {
            gpu: gpu.to_owned(),
            gpu_instance_id: gi,
        },
    ]
}

fn mode(gpu: &str, enabled: bool) -> MigCall {
    MigCall::SetMigMode {
        gpu: gpu.to_owned(),
        enabled,
    }
}

#[tokio::test]
async fn a_partition_is_created_at_prepare_and_destroyed_at_unprepare() {
    partition_round_trip(Fixture::new("dgx-h100")).await;
}

/// The same on the NVML backend over the libnvidia-ml double: NVML's calls create the
/// instance the driver records and destroy it again (the mock's call log stays empty).
#[cfg(feature = "nvml")]
#[tokio::test]
async fn a_partition_is_created_and_destroyed_through_nvml() {
    partition_round_trip(Fixture::over_nvml("dgx-h100")).await;
}

async fn partition_round_trip(f: Fixture) {
    let over_nvml = f.over_nvml_backend();
    let driver = f.driver(GATES);
    let r = start_driver(f, driver).await;
    r.f.creatable_mig_capabilities();
    let hardware = r.f.hardware();
    let gpu = r.f.inventory.gpus[0].info.clone();
    let uuid = gpu.uuid.as_str();
    let mig = r.f.backend.mig();
    // The MIG calls the driver made, as the mock records them (none reach it over NVML).
    let calls = |expected: &[MigCall]| {
        let made = mig.take_calls();
        if !over_nvml {
            assert_eq!(made, expected);
        }
    };
    let claim = r.claim(slice_of_gpu_0()).await;
    let result = r.prepare_one(&claim).await;
    assert_eq!(result.as_ref().unwrap()[0].device, "gpu-0-mig-3g40gb-9-4");
    // Hopper with MIG off: MIG on, then the GPU instance at 4:4, then its compute instance.
    calls(&[
        mode(uuid, true),
        create_gi(uuid, 9, 4, 4),
        create_ci(uuid, 1),
    ]);
    let devices = hardware.mig_devices(uuid).unwrap();
    assert_eq!(devices.len(), 1);
    assert_eq!(
        (devices[0].profile.as_str(), devices[0].placement),
        ("3g.40gb", MigPlacement::new(4, 4))
    );
    let minor = gpu.minor;
    assert_eq!(
        device_paths(&r.spec(&claim)["devices"][0]["containerEdits"]),
        [
            format!("/dev/nvidia{minor}"),
            format!("/dev/nvidia-caps/nvidia-cap{}", gi_cap_minor(minor, 1)),
            format!("/dev/nvidia-caps/nvidia-cap{}", ci_cap_minor(minor, 1, 0)),
        ]
    );
    // The checkpoint: completed, with the instance the hardware made.
    let recorded = record(&r, &claim);
    assert!(recorded.is_completed());
    assert_eq!(
        recorded.driver_state.unwrap()["devices"][0],
        json!({
            "device": "gpu-0-mig-3g40gb-9-4",
            "adminAccess": false,
            "type": "migdyn",
            "uuid": devices[0].uuid,
            "parentUUID": uuid,
            "parentMinor": minor,
            "profileID": 9,
            "placementStart": 4,
            "placementSize": 4,
            "gpuInstanceID": 1,
            "computeInstanceID": 0,
        })
    );

    let unprepared = r.unprepare_one(&claim).await;
    assert_eq!(unprepared, Ok(()));
    let [destroy_ci, destroy_gi] = destroy(uuid, 1);
    // The last instance gone, Hopper leaves MIG mode so the full GPU can run work again.
    calls(&[destroy_ci, destroy_gi, mode(uuid, false)]);
    assert!(hardware.mig_devices(uuid).unwrap().is_empty());
    assert!(!hardware.mig_mode(uuid).unwrap().unwrap().current);
    // Again: nothing left to destroy, no call.
    let again = r.unprepare_one(&claim).await;
    assert_eq!(again, Ok(()));
    calls(&[]);
    r.shutdown().await;
}

/// A MIG mode change NVML leaves pending (a process holds the GPU) fails the claim with the
/// holder's name, and is reverted so the GPU does not switch at its next reset.
#[cfg(feature = "nvml")]
#[tokio::test]
async fn a_pending_mig_mode_change_names_the_holder_and_is_reverted() {
    let f = Fixture::over_nvml("dgx-h100");
    let gpu = f.inventory.gpus[0].info.clone();
    f.double().set_busy(&gpu.uuid, true).unwrap();
    f.holder(4242, "python3", &format!("/dev/nvidia{}", gpu.minor));
    let driver = f.driver(GATES);
    let r = start_driver(f, driver).await;
    let claim = r.claim(slice_of_gpu_0()).await;
    let error = r.prepare_one(&claim).await.unwrap_err();
    assert_contains(&error, "pending");
    assert_contains(&error, "PID 4242 (python3)");
    assert_contains(&error, "reverted");
    let mode = r.f.hardware().mig_mode(&gpu.uuid).unwrap().unwrap();
    assert_eq!(
        (mode.current, mode.pending),
        (false, false),
        "nothing left pending"
    );
    assert!(r.f.hardware().mig_devices(&gpu.uuid).unwrap().is_empty());
    r.shutdown().await;
}

#[tokio::test]
async fn a_half_created_partition_is_rolled_back() {
    let r = start_dynamic("dgx-h100").await;
    let uuid = r.f.inventory.gpus[1].info.uuid.clone();
    let uuid = uuid.as_str();
    let mig = r.f.backend.mig();
    mig.fail_next(MigCallKind::CreateComputeInstance, "Insufficient Resources");
    let claim = r
        .claim(AllocatedClaim::new("default", "broken").device(
            "mig",
            DRIVER_NAME,
            NODE_NAME,
            "gpu-1-mig-1g10gb-19-2",
        ))
        .await;
    let result = r.prepare_one(&claim).await;
    let error = result.as_ref().unwrap_err();
    assert_contains(error, "gpu-1-mig-1g10gb-19-2");
    assert_contains(error, "Insufficient Resources");
    let [_, destroy_gi] = destroy(uuid, 1);
    assert_eq!(
        mig.take_calls(),
        [
            mode(uuid, true),
            create_gi(uuid, 19, 2, 1),
            create_ci(uuid, 1),
            destroy_gi,
            mode(uuid, false),
        ]
    );
    assert!(mig.calls().is_empty());
    assert!(r.f.backend.mig_devices(uuid).unwrap().is_empty());
    // Nothing recorded as prepared.
    assert!(!record(&r, &claim).is_completed());
    assert!(r.driver.prepared_devices().is_empty());
    r.shutdown().await;
}

#[tokio::test]
async fn a_claim_failing_on_its_second_partition_destroys_the_first() {
    let r = start_dynamic("dgx-a100").await;
    let [gpu0, gpu2] = [0, 2].map(|i| r.f.inventory.gpus[i].info.uuid.clone());
    // The A100s 0-2 came with MIG instances no claim records: the plugin's start-up
    // clean-up destroyed them.
    for gpu in [&gpu0, &gpu2] {
        assert!(r.f.backend.mig_devices(gpu).unwrap().is_empty());
    }
    let mig = r.f.backend.mig();
    assert_eq!(mig.take_calls().len(), 2 * (7 + 4 + 3));
    // Someone makes a 4g.40gb at 0:4 on GPU 2 by hand.
    use dra_driver_nvidia::backend::mig::MigManager;
    let by_hand =
        r.f.backend
            .create_gpu_instance(&gpu2, 5, MigPlacement::new(0, 4))
            .unwrap();
    r.f.backend.create_compute_instance(&gpu2, by_hand).unwrap();
    mig.take_calls();

    let claim = r
        .claim(
            AllocatedClaim::new("default", "two")
                .device("a", DRIVER_NAME, NODE_NAME, "gpu-0-mig-1g10gb-19-0")
                .device("b", DRIVER_NAME, NODE_NAME, "gpu-2-mig-3g40gb-9-0"),
        )
        .await;
    let result = r.prepare_one(&claim).await;
    let error = result.as_ref().unwrap_err();
    assert_contains(error, "gpu-2-mig-3g40gb-9-0");
    assert_contains(error, "placement 0:4 of 3g.40gb is taken by GPU instance 1");
    let [destroy_ci, destroy_gi] = destroy(&gpu0, 1);
    // Ampere in MIG mode: the mode is never toggled.
    assert_eq!(
        mig.take_calls(),
        [
            create_gi(&gpu0, 19, 0, 1),
            create_ci(&gpu0, 1),
            create_gi(&gpu2, 9, 0, 4),
            destroy_ci,
            destroy_gi,
        ]
    );
    assert!(r.f.backend.mig_devices(&gpu0).unwrap().is_empty());
    assert_eq!(r.f.backend.mig_devices(&gpu2).unwrap().len(), 1);
    r.shutdown().await;
}

/// Where an API server dropped the counters, prepare still keeps a GPU whole or split.
#[tokio::test]
async fn a_gpu_prepared_whole_is_not_split_and_the_other_way_round() {
    let r = start_dynamic("dgx-h100").await;
    let whole = r
        .claim(AllocatedClaim::new("default", "whole").device(
            "gpu",
            DRIVER_NAME,
            NODE_NAME,
            "gpu-5",
        ))
        .await;
    let split = r
        .claim(AllocatedClaim::new("default", "split").device(
            "mig",
            DRIVER_NAME,
            NODE_NAME,
            "gpu-5-mig-1g10gb-19-0",
        ))
        .await;
    let prepared = r.prepare_one(&whole).await;
    assert!(prepared.is_ok(), "{prepared:?}");
    let refused = r.prepare_one(&split).await;
    let error = refused.as_ref().unwrap_err();
    assert_contains(error, "its GPU gpu-5 is prepared whole");
    assert!(r.f.backend.mig().calls().is_empty());

    // Split first: the whole GPU is refused (MIG mode is on now, so it is not even there).
    r.unprepare_one(&whole).await.unwrap();
    let prepared = r.prepare_one(&split).await;
    assert!(prepared.is_ok(), "{prepared:?}");
    let again = r
        .claim(AllocatedClaim::new("default", "whole-again").device(
            "gpu",
            DRIVER_NAME,
            NODE_NAME,
            "gpu-5",
        ))
        .await;
    let refused = r.prepare_one(&again).await;
    assert!(refused.is_err(), "{refused:?}");
    r.shutdown().await;
}

/// A claim for one share (`share_id`) of partition `device`, with `config` (a
/// `MigDeviceConfig`'s fields) when given.
fn partition_share(
    name: &str,
    device: &str,
    share_id: &str,
    config: Option<Value>,
) -> AllocatedClaim {
    let claim = AllocatedClaim::new("default", name).result(DeviceRequestAllocationResult {
        request: "mig".into(),
        driver: DRIVER_NAME.into(),
        pool: NODE_NAME.into(),
        device: device.into(),
        share_id: Some(share_id.into()),
        ..Default::default()
    });
    match config {
        Some(mut config) => {
            config["apiVersion"] = json!("resource.nvidia.com/v1beta1");
            config["kind"] = json!("MigDeviceConfig");
            claim.claim_config(&["mig"], DRIVER_NAME, config)
        }
        None => claim,
    }
}

/// Consumable shares on a partition: the first claim creates the instance, a second with the
/// same config gets that instance (no MIG call, the same capability nodes); a claim with
/// another config and the full GPU are refused, naming the holder; the instance stays while a
/// claim holds it, also across a restart (the holders come back from the checkpoint), and
/// goes with the last.
#[tokio::test]
async fn a_shared_partition_is_created_once_and_destroyed_with_its_last_claim() {
    let f = Fixture::new("dgx-h100");
    let driver = f
        .builder("DynamicMIG=true,ConsumableShares=true,TimeSlicingSettings=true")
        .consumable_shares(ConsumableShares::Memory)
        .build();
    let r = start_driver(f, driver).await;
    r.f.creatable_mig_capabilities();
    let uuid = r.f.inventory.gpus[2].info.uuid.clone();
    let uuid = uuid.as_str();
    let mig = r.f.backend.mig();
    let device = "gpu-2-mig-1g10gb-19-3";
    let first = r
        .claim(partition_share("first", device, "share-1", None))
        .await;
    let second = r
        .claim(partition_share("second", device, "share-2", None))
        .await;
    let other_config = r
        .claim(partition_share(
            "other-config",
            device,
            "share-3",
            Some(json!({ "sharing": { "strategy": "TimeSlicing" } })),
        ))
        .await;
    let whole_share = |name: &str, gpu: &str| {
        AllocatedClaim::new("default", name).result(DeviceRequestAllocationResult {
            request: "gpu".into(),
            driver: DRIVER_NAME.into(),
            pool: NODE_NAME.into(),
            device: gpu.into(),
            share_id: Some(format!("{name}-share")),
            ..Default::default()
        })
    };
    let whole = r.claim(whole_share("whole", "gpu-2")).await;

    assert!(r.prepare_one(&first).await.is_ok());
    assert_eq!(
        mig.take_calls(),
        [
            mode(uuid, true),
            create_gi(uuid, 19, 3, 1),
            create_ci(uuid, 1)
        ]
    );
    let prepared = r.prepare_one(&second).await;
    assert!(prepared.is_ok(), "{prepared:?}");
    assert!(mig.take_calls().is_empty(), "the instance is reused");
    assert_eq!(r.f.backend.mig_devices(uuid).unwrap().len(), 1);
    assert_eq!(
        device_paths(&r.spec(&first)["devices"][0]["containerEdits"]),
        device_paths(&r.spec(&second)["devices"][0]["containerEdits"]),
    );
    let instance = |claim: &ClaimRef| record(&r, claim).driver_state.unwrap()["devices"][0].clone();
    assert_eq!(instance(&first), instance(&second));
    let mut holders = vec![first.uid.clone(), second.uid.clone()];
    holders.sort();
    assert_eq!(r.driver.shared_devices()[device], holders);

    let error = r.prepare_one(&other_config).await.unwrap_err();
    assert_contains(
        &error,
        format!("conflicting configuration: device {device} is shared with claim default/"),
    );
    // The GPU is in MIG mode now, split for the partition: its full GPU is not there to share.
    let error = r.prepare_one(&whole).await.unwrap_err();
    assert_contains(
        &error,
        format!("gpu-2: the GPU's MIG partition {device} is prepared for claim default/"),
    );
    // The other way round: a GPU shared whole is not split for a partition's share.
    let shared_whole = r.claim(whole_share("shared-whole", "gpu-5")).await;
    let split = r
        .claim(partition_share(
            "split",
            "gpu-5-mig-1g10gb-19-0",
            "share-5",
            None,
        ))
        .await;
    assert!(r.prepare_one(&shared_whole).await.is_ok());
    let error = r.prepare_one(&split).await.unwrap_err();
    assert_contains(
        &error,
        "its GPU gpu-5 is prepared whole for claim default/shared-whole",
    );
    r.unprepare_one(&shared_whole).await.unwrap();
    assert!(mig.take_calls().is_empty());

    // A restart: the holders come back from the checkpoint.
    let Running {
        f,
        cluster,
        plugin,
        driver,
        ..
    } = r;
    plugin.shutdown().await.unwrap();
    drop(driver);
    let (checkpoint, _) =
        Checkpoint::open(&cluster.plugins_dir().join(DRIVER_NAME), BOOT_ID).unwrap();
    let records = checkpoint.records().unwrap();
    let restarted = f
        .builder("DynamicMIG=true,ConsumableShares=true,TimeSlicingSettings=true")
        .consumable_shares(ConsumableShares::Memory)
        .build();
    restarted
        .reconcile(&completed_claims(&cluster))
        .await
        .unwrap();
    assert!(mig.take_calls().is_empty(), "the shared instance is kept");
    assert_eq!(restarted.shared_devices()[device], holders);
    let recorded = |claim: &ClaimRef| {
        let record = &records[&claim.uid];
        RecordedClaim::new(claim.clone()).with_driver_state(record.driver_state.clone().unwrap())
    };

    // The first claim goes: the second still holds the instance.
    restarted.unprepare(&recorded(&first)).await.unwrap();
    assert!(mig.take_calls().is_empty(), "kept for the second claim");
    assert_eq!(f.backend.mig_devices(uuid).unwrap().len(), 1);
    // The last goes: destroyed, and MIG mode off again.
    restarted.unprepare(&recorded(&second)).await.unwrap();
    let [destroy_ci, destroy_gi] = destroy(uuid, 1);
    assert_eq!(
        mig.take_calls(),
        [destroy_ci, destroy_gi, mode(uuid, false)]
    );
    assert!(restarted.shared_devices().is_empty());
}

/// Two claims of one batch (one pod) sharing a partition: prepared together, one instance.
#[tokio::test]
async fn claims_of_one_batch_share_one_instance() {
    let f = Fixture::new("dgx-h100");
    let driver = f
        .builder("DynamicMIG=true,ConsumableShares=true")
        .consumable_shares(ConsumableShares::Unlimited)
        .build();
    let r = start_driver(f, driver).await;
    r.f.creatable_mig_capabilities();
    let uuid = r.f.inventory.gpus[4].info.uuid.clone();
    let device = "gpu-4-mig-2g20gb-14-2";
    let a = r.claim(partition_share("a", device, "share-a", None)).await;
    let b = r.claim(partition_share("b", device, "share-b", None)).await;
    let results = r.kubelet.prepare(&[a.clone(), b.clone()]).await.unwrap();
    assert!(
        results[&a.uid].is_ok() && results[&b.uid].is_ok(),
        "{results:?}"
    );
    let creates =
        r.f.backend
            .mig()
            .take_calls()
            .into_iter()
            .filter(|call| matches!(call, MigCall::CreateGpuInstance { .. }))
            .count();
    assert_eq!(creates, 1);
    assert_eq!(r.f.backend.mig_devices(&uuid).unwrap().len(), 1);
    let results = r.kubelet.unprepare(&[a.clone(), b.clone()]).await.unwrap();
    assert!(
        results[&a.uid].is_ok() && results[&b.uid].is_ok(),
        "{results:?}"
    );
    assert!(r.f.backend.mig_devices(&uuid).unwrap().is_empty());
    r.shutdown().await;
}

/// The GPU a claim's partition lived on is gone after a restart (lost, replaced, or another
/// inventory): nothing is left to undo on it, so unprepare succeeds (with a warning) and the
/// claim's spec and record go. Before, "destroying its MIG instance: no GPU with UUID ..."
/// came back as temporarily unavailable on every retry, and the pod never finished
/// terminating.
#[tokio::test]
async fn a_partition_whose_gpu_is_gone_is_released_at_unprepare() {
    let r = start_dynamic("dgx-h100").await;
    let claim = r
        .claim(AllocatedClaim::new("default", "slice").device(
            "mig",
            DRIVER_NAME,
            &format!("{NODE_NAME}/gpu-0"),
            "gpu-0-mig-3g40gb-9-4",
        ))
        .await;
    assert!(r.prepare_one(&claim).await.is_ok());
    let Running {
        cluster, plugin, ..
    } = r;
    plugin.shutdown().await.unwrap();

    // The node comes back with other GPUs: no H100 UUID exists any more.
    let other = Fixture::new("dgx-a100");
    let plugin = cluster
        .plugin(other.driver(GATES), DRIVER_NAME)
        .start()
        .await
        .unwrap();
    let kubelet = cluster
        .register(&plugin, KubeletVersion::V1_36)
        .await
        .unwrap();
    let unprepared = kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(unprepared[&claim.uid], Ok(()));
    let (checkpoint, _) =
        Checkpoint::open(&cluster.plugins_dir().join(DRIVER_NAME), BOOT_ID).unwrap();
    assert!(!checkpoint.records().unwrap().contains_key(&claim.uid));
    let specs: Vec<_> = std::fs::read_dir(cluster.cdi_root())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains(&claim.uid))
        .collect();
    assert!(specs.is_empty(), "{specs:?}");
    plugin.shutdown().await.unwrap();
}
