//! `gpu-kubelet-plugin` passes the SDK's conformance suite with the mock backend, for every
//! shipped profile: every case, in process, with a restart in the middle that rebuilds the
//! driver from the checkpoint as the binary does. The sharing gates run the suite too: the
//! time-slicing and MPS gates together, and consumable shares (devices published with
//! `allowMultipleAllocations`).

use std::sync::Arc;

use dra_driver_nvidia::cdi::DriverRoot;
use dra_driver_nvidia::config::FeatureGate;
use dra_driver_nvidia::devices::DRIVER_NAME;
use dra_driver_nvidia::driver::NvidiaDriver;
use dra_driver_nvidia::health::HealthPolicy;
use dra_driver_nvidia::plugin::NvidiaPlugin;
use dra_driver_nvidia::sharing::ConsumableShares;
use dra_sdk_testing::cluster::NODE_NAME;
use dra_sdk_testing::conformance::{Conformance, Outcome};

mod fixture;

use fixture::plugin_cli;

/// `single_device`: the suite keeps each case's claims allocated, so on a one-GPU machine
/// the cases after the first allocation find no free device and are skipped (not failed).
async fn conformant(profile: &str, single_device: bool) {
    conformant_with(profile, single_device, &[]).await;
}

/// The suite with more plugin flags (feature gates, `--consumable-shares`).
async fn conformant_with(profile: &str, single_device: bool, flags: &[&str]) {
    let cli = plugin_cli(&[&["--mock-profile", profile], flags].concat());
    let gates = cli.nvidia.feature_gates.clone();
    let consumable: ConsumableShares = cli.nvidia.consumable_shares.parse().unwrap();
    let nvidia = NvidiaPlugin::from_args(&cli.nvidia).unwrap();
    let resources = nvidia.resources(NODE_NAME);
    let (backend, host) = (Arc::clone(&nvidia.backend), Arc::clone(&nvidia.host));
    let mig = Arc::clone(&nvidia.mig_manager);
    let serialize = nvidia.driver.serializes_operations();
    let report = Conformance::in_process_with(move |cluster| {
        // As the binary at each start: the plugin's start-up reconcile reserves what the
        // checkpoint records as completed.
        let driver = NvidiaDriver::builder(Arc::clone(&backend), Arc::clone(&host))
            .driver_root(DriverRoot::new(Arc::clone(&host), "/"))
            .feature_gates(gates.clone())
            .consumable_shares(consumable)
            .mig_manager(Arc::clone(&mig));
        // As the binary: the health monitor with the gate.
        let driver = if gates.is_enabled(FeatureGate::NvmlDeviceHealthCheck) {
            driver.health(HealthPolicy::default())
        } else {
            driver
        }
        .build();
        cluster
            .plugin(driver, DRIVER_NAME)
            .serialize_operations(serialize)
            .resources(resources.clone())
    })
    .run()
    .await
    .expect("the conformance suite could not start");
    println!("{report}");
    report.assert_passed();
    let not_passed: Vec<&str> = report
        .cases
        .iter()
        .filter(|case| case.outcome != Outcome::Passed)
        .filter(|case| {
            !(single_device
                && matches!(&case.outcome, Outcome::Skipped(reason)
                    if reason.contains("all 1 matching devices are allocated")))
        })
        .map(|case| case.name)
        .collect();
    assert!(
        not_passed.is_empty(),
        "{profile}: not passed: {not_passed:?}\n{report}"
    );
    drop(nvidia);
}

#[tokio::test]
async fn dgx_a100_is_conformant() {
    conformant("dgx-a100", false).await;
}

#[tokio::test]
async fn dgx_h100_is_conformant() {
    conformant("dgx-h100", false).await;
}

#[tokio::test]
async fn mixed_is_conformant() {
    conformant("mixed", false).await;
}

#[tokio::test]
async fn workstation_is_conformant() {
    conformant("workstation", true).await;
}

#[tokio::test]
async fn dgx_a100_is_conformant_with_time_slicing_and_mps_enabled() {
    conformant_with(
        "dgx-a100",
        false,
        &[
            "--feature-gates",
            "TimeSlicingSettings=true,MPSSupport=true",
        ],
    )
    .await;
}

#[tokio::test]
async fn dgx_h100_is_conformant_with_consumable_shares() {
    conformant_with(
        "dgx-h100",
        false,
        &[
            "--feature-gates",
            "ConsumableShares=true,TimeSlicingSettings=true",
            "--consumable-shares",
            "memory",
        ],
    )
    .await;
}

#[tokio::test]
async fn dgx_a100_is_conformant_with_every_sharing_gate_and_passthrough() {
    conformant_with(
        "dgx-a100",
        false,
        &[
            "--feature-gates",
            "TimeSlicingSettings=true,MPSSupport=true,ConsumableShares=true,PassthroughSupport=true",
        ],
    )
    .await;
}

#[tokio::test]
async fn mixed_is_conformant_with_four_shares_per_device() {
    conformant_with(
        "mixed",
        false,
        &[
            "--feature-gates",
            "ConsumableShares=true",
            "--consumable-shares",
            "4",
        ],
    )
    .await;
}

/// Dynamic MIG: the A100s in MIG mode and every H100 published as partitionable devices
/// (counters), partitions created at prepare; with health checking on as well, which upstream
/// excludes.
#[tokio::test]
async fn dynamic_mig_is_conformant() {
    conformant_with("dgx-a100", false, &["--feature-gates", "DynamicMIG=true"]).await;
    conformant_with(
        "dgx-h100",
        false,
        &[
            "--feature-gates",
            "DynamicMIG=true,NVMLDeviceHealthCheck=true",
        ],
    )
    .await;
}

/// Dynamic MIG with consumable shares: partitions and full GPUs published for several claims.
#[tokio::test]
async fn dynamic_mig_is_conformant_with_consumable_shares() {
    conformant_with(
        "dgx-h100",
        false,
        &[
            "--feature-gates",
            "DynamicMIG=true,ConsumableShares=true,TimeSlicingSettings=true",
            "--consumable-shares",
            "2",
        ],
    )
    .await;
}
