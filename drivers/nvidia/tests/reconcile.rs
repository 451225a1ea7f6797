//! Start-up reconciliation: reservations rebuilt from the completed claims, VFIO bindings
//! given back only when the checkpoint proves they are the driver's, every other VFIO binding
//! reported and left alone. On a fake host tree with the `dgx-h100` profile.

mod fixture;

use std::time::Duration;

use dra_driver_nvidia::backend::GpuInventory;
use dra_driver_nvidia::driver::{
    ClaimState, MigInstance, PreparedDeviceState, PreparedKind, VfioBinder,
};
use dra_driver_nvidia::host::CommandOutput;
use dra_sdk::claim::ClaimRef;
use dra_sdk_testing::assert_contains;
use fixture::*;

fn vfio_state(device: &str, binding: dra_driver_nvidia::driver::VfioBinding) -> ClaimState {
    ClaimState {
        devices: vec![PreparedDeviceState {
            device: device.to_owned(),
            admin_access: false,
            kind: PreparedKind::Vfio(binding),
        }],
        ..ClaimState::default()
    }
}

#[test]
fn reconcile_keeps_completed_claims_restores_only_its_own_bindings_and_reports_the_rest() {
    let f = Fixture::new("dgx-h100");
    let mut bus_ids: Vec<String> = f
        .inventory
        .gpus
        .iter()
        .map(|g| g.info.pci.bus_id.clone())
        .collect();
    bus_ids.sort();
    // Idle GPUs: fuser finds no process.
    f.host.script("fuser", [CommandOutput::failed(1, "")]);
    let binder = VfioBinder::new(&f.host, Duration::from_millis(1), Duration::from_millis(20));
    let bind = |bus_id: &str| binder.bind(bus_id, None).unwrap();
    // gpu-vfio-0: a claim still prepared. gpu-vfio-1: a claim the SDK rolled back while the
    // GPU stayed on VFIO (a crash between bind and checkpoint). gpu-vfio-2: bound by someone
    // else (an administrator, a VM manager): no claim records it.
    let kept_binding = bind(&bus_ids[0]);
    let stale_binding = bind(&bus_ids[1]);
    bind(&bus_ids[2]);

    let kept = ClaimRef::new("default", "vm", "uid-kept");
    let stale = ClaimRef::new("default", "crashed", "uid-stale");
    let driver = f.driver("PassthroughSupport=true");
    // As the plugin starts: the checkpoint held both claims.
    let first = driver.reconcile_claims([
        (kept.clone(), vfio_state("gpu-vfio-0", kept_binding.clone())),
        (stale.clone(), vfio_state("gpu-vfio-1", stale_binding)),
    ]);
    assert_eq!(first.reserved, ["uid-kept", "uid-stale"]);
    assert_eq!(first.unowned.len(), 1, "{first:?}");
    assert_eq!(first.unowned[0].bus_id, bus_ids[2]);
    assert_eq!(first.unowned[0].driver, "vfio-pci");
    assert_eq!(
        first.unowned[0].reason,
        "no claim in the checkpoint records binding it"
    );

    // The SDK rolled `stale` back: only `kept` is completed.
    let report = driver.reconcile_claims([(kept.clone(), vfio_state("gpu-vfio-0", kept_binding))]);
    assert_eq!(report.reserved, ["uid-kept"]);
    assert_eq!(report.released, ["uid-stale"]);
    assert_eq!(report.restored, [bus_ids[1].clone()]);
    assert_eq!(report.unowned.len(), 1, "{report:?}");
    assert_eq!(report.unowned[0].bus_id, bus_ids[2]);
    assert!(report.failures.is_empty(), "{:?}", report.failures);

    assert_eq!(f.bound_driver(&bus_ids[0]).as_deref(), Some("vfio-pci"));
    assert_eq!(f.bound_driver(&bus_ids[1]).as_deref(), Some("nvidia"));
    // Never destroyed blindly.
    assert_eq!(f.bound_driver(&bus_ids[2]).as_deref(), Some("vfio-pci"));
    let prepared = driver.prepared_devices();
    assert_eq!(
        prepared.get("gpu-vfio-0").map(String::as_str),
        Some("uid-kept")
    );
    assert!(!prepared.contains_key("gpu-vfio-1"), "{prepared:?}");

    // `kept` gone from the checkpoint too: its binding was recorded, so it is given back.
    let again = driver.reconcile_claims([]);
    assert_eq!(again.released, ["uid-kept"]);
    assert_eq!(again.restored, [bus_ids[0].clone()]);
    assert_eq!(again.unowned.len(), 1, "{again:?}");
    assert_eq!(f.bound_driver(&bus_ids[0]).as_deref(), Some("nvidia"));
    assert!(driver.prepared_devices().is_empty());
}

#[test]
fn without_passthrough_only_recorded_bindings_are_looked_at() {
    let f = Fixture::new("dgx-h100");
    let mut bus_ids: Vec<String> = f
        .inventory
        .gpus
        .iter()
        .map(|g| g.info.pci.bus_id.clone())
        .collect();
    bus_ids.sort();
    f.host.script("fuser", [CommandOutput::failed(1, "")]);
    let binder = VfioBinder::new(&f.host, Duration::from_millis(1), Duration::from_millis(20));
    binder.bind(&bus_ids[0], None).unwrap();
    let driver = f.driver("");
    let report = driver.reconcile_claims([]);
    assert!(report.unowned.is_empty(), "{report:?}");
    assert!(report.failures.is_empty(), "{report:?}");
    assert_eq!(f.bound_driver(&bus_ids[0]).as_deref(), Some("vfio-pci"));
}

/// Dynamic MIG: at start, every MIG instance no completed claim records is destroyed
/// (compute instance, then GPU instance), except on a GPU that waits for a reset, whose
/// instances are reported and left alone; MIG mode is never touched. Without the gate,
/// nothing is.
/// The `dgx-a100` profile's 3g.40gb at 4:4 on GPU 1 (GPU instance 1), as a claim records it.
fn half_of_gpu1(gpu1: &GpuInventory, uuid: &str) -> MigInstance {
    MigInstance {
        uuid: uuid.to_owned(),
        parent_uuid: gpu1.info.uuid.clone(),
        parent_minor: gpu1.info.minor,
        profile_id: 9,
        placement_start: 4,
        placement_size: 4,
        gpu_instance_id: 1,
        compute_instance_id: 0,
    }
}

#[test]
fn dynamic_mig_destroys_orphans_except_on_gpus_waiting_for_a_reset() {
    use dra_driver_nvidia::backend::mig::MigCall;
    use dra_driver_nvidia::backend::{GpuBackend, MigMode};

    let f = Fixture::new("dgx-a100");
    let mig = f.backend.mig();
    let [gpu0, gpu1, gpu2] = [0, 1, 2].map(|i| f.inventory.gpus[i].clone());

    let untouched = f.driver("").reconcile_claims([]);
    assert_eq!(untouched.mig, Default::default());
    assert!(mig.calls().is_empty());

    // GPU 2 waits for a reset: MIG was switched off, the change is pending.
    mig.set_mode(
        &gpu2,
        MigMode {
            current: true,
            pending: false,
        },
    );
    // A completed claim owns GPU 1's 3g.40gb at 4:4 (GPU instance 1).
    let owned = gpu1
        .mig_devices
        .iter()
        .find(|d| d.gpu_instance_id == 1)
        .unwrap();
    let state = ClaimState {
        devices: vec![PreparedDeviceState {
            device: "gpu-1-mig-3g40gb-9-4".to_owned(),
            admin_access: false,
            kind: PreparedKind::MigDynamic(half_of_gpu1(&gpu1, &owned.uuid)),
        }],
        ..ClaimState::default()
    };
    let driver = f.driver("DynamicMIG=true");
    let report = driver.reconcile_claims([(ClaimRef::new("default", "kept", "uid-kept"), state)]);
    assert!(report.failures.is_empty(), "{:?}", report.failures);

    let destroyed: Vec<(String, u32)> = report
        .mig
        .destroyed
        .iter()
        .map(|o| (o.gpu.clone(), o.gpu_instance_id))
        .collect();
    let mut expected: Vec<(String, u32)> =
        (7..=13).map(|gi| (gpu0.info.uuid.clone(), gi)).collect();
    expected.extend([5, 7, 8].map(|gi| (gpu1.info.uuid.clone(), gi)));
    assert_eq!(destroyed, expected);
    let calls = mig.take_calls();
    let mut expected_calls = Vec::new();
    for (gpu, gi) in &expected {
        expected_calls.push(MigCall::DestroyComputeInstance {
            gpu: gpu.clone(),
            gpu_instance_id: *gi,
            compute_instance_id: 0,
        });
        expected_calls.push(MigCall::DestroyGpuInstance {
            gpu: gpu.clone(),
            gpu_instance_id: *gi,
        });
    }
    assert_eq!(calls, expected_calls);

    assert_eq!(report.mig.kept.len(), 3);
    for kept in &report.mig.kept {
        assert_eq!(kept.instance.gpu, gpu2.info.uuid);
        assert_contains(&kept.reason, "waits for a reset");
    }
    assert!(f.backend.mig_devices(&gpu0.info.uuid).unwrap().is_empty());
    let left = f.backend.mig_devices(&gpu1.info.uuid).unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].uuid, owned.uuid);
    assert_eq!(f.backend.mig_devices(&gpu2.info.uuid).unwrap().len(), 3);
    // Still reserved for its claim.
    assert_eq!(
        driver
            .prepared_devices()
            .get("gpu-1-mig-3g40gb-9-4")
            .map(String::as_str),
        Some("uid-kept")
    );
}

/// Dynamic MIG with consumable shares: a partition two completed claims share keeps its
/// instance at start, and the instance goes with the second of them, not the first.
#[tokio::test]
async fn a_partition_two_completed_claims_share_is_kept_until_both_go() {
    use dra_driver_nvidia::backend::GpuBackend;
    use dra_driver_nvidia::backend::mig::MigCall;
    use dra_driver_nvidia::sharing::SharedAllocation;
    use dra_sdk::claim::RecordedClaim;
    use dra_sdk::driver::Driver;

    let f = Fixture::new("dgx-a100");
    let mig = f.backend.mig();
    let gpu1 = f.inventory.gpus[1].clone();
    let device = "gpu-1-mig-3g40gb-9-4";
    let shared = gpu1
        .mig_devices
        .iter()
        .find(|d| d.gpu_instance_id == 1)
        .unwrap();
    let state = |share: &str| ClaimState {
        devices: vec![PreparedDeviceState {
            device: device.to_owned(),
            admin_access: false,
            kind: PreparedKind::MigDynamic(half_of_gpu1(&gpu1, &shared.uuid)),
        }],
        shares: vec![SharedAllocation {
            device: device.to_owned(),
            share_id: share.to_owned(),
            config: serde_json::json!({ "kind": "MigDeviceConfig" }),
        }],
        ..ClaimState::default()
    };
    let [a, b] = ["a", "b"].map(|name| ClaimRef::new("default", name, format!("uid-{name}")));
    let driver = f
        .builder("DynamicMIG=true,ConsumableShares=true")
        .consumable_shares(dra_driver_nvidia::sharing::ConsumableShares::Memory)
        .build();
    let report =
        driver.reconcile_claims([(a.clone(), state("share-a")), (b.clone(), state("share-b"))]);
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert!(
        report
            .mig
            .destroyed
            .iter()
            .all(|orphan| !(orphan.gpu == gpu1.info.uuid && orphan.gpu_instance_id == 1)),
        "{:?}",
        report.mig.destroyed
    );
    assert_eq!(driver.shared_devices()[device], ["uid-a", "uid-b"]);
    mig.take_calls();

    let recorded = |claim: &ClaimRef, share: &str| {
        RecordedClaim::new(claim.clone())
            .with_driver_state(serde_json::to_value(state(share)).unwrap())
    };
    driver.unprepare(&recorded(&a, "share-a")).await.unwrap();
    assert!(mig.take_calls().is_empty(), "still used by claim b");
    driver.unprepare(&recorded(&b, "share-b")).await.unwrap();
    assert_eq!(
        mig.take_calls(),
        [
            MigCall::DestroyComputeInstance {
                gpu: gpu1.info.uuid.clone(),
                gpu_instance_id: 1,
                compute_instance_id: 0,
            },
            MigCall::DestroyGpuInstance {
                gpu: gpu1.info.uuid.clone(),
                gpu_instance_id: 1,
            },
        ]
    );
    assert!(
        f.backend
            .mig_devices(&gpu1.info.uuid)
            .unwrap()
            .iter()
            .all(|d| d.uuid != shared.uuid)
    );
}
