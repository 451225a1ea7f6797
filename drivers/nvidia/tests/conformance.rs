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
    conformant_on(profile, single_device, flags, false).await;
}

/// The suite; with `over_nvml`, the driver reads and changes the machine through the NVML
/// backend over the libnvidia-ml double serving the same profile (the mock host tree stays:
/// it is the node's /dev, /proc and /sys). What is published is the mock plugin's, which
/// `tests/nvml_double.rs` shows is what the NVML backend publishes.
async fn conformant_on(profile: &str, single_device: bool, flags: &[&str], over_nvml: bool) {
    let host_root = tempfile::tempdir().unwrap();
    let root = host_root.path().join("host");
    let root_flag = root.to_str().unwrap();
    let cli = plugin_cli(
        &[
            &["--mock-profile", profile, "--mock-host-root", root_flag],
            flags,
        ]
        .concat(),
    );
    let gates = cli.nvidia.feature_gates.clone();
    let consumable: ConsumableShares = cli.nvidia.consumable_shares.parse().unwrap();
    let nvidia = NvidiaPlugin::from_args(&cli.nvidia).unwrap();
    let resources = nvidia.resources(NODE_NAME);
    let (mut backend, host) = (Arc::clone(&nvidia.backend), Arc::clone(&nvidia.host));
    let mut mig = Arc::clone(&nvidia.mig_manager);
    let mut _double = None;
    if over_nvml {
        (backend, mig, _double) = nvml_backend(profile, &root);
    }
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

/// The NVML backend over the double serving `profile` with its nodes under `root`.
#[cfg(feature = "nvml")]
fn nvml_backend(
    profile: &str,
    root: &std::path::Path,
) -> (
    Arc<dyn dra_driver_nvidia::backend::GpuBackend>,
    Arc<dyn dra_driver_nvidia::backend::mig::MigManager>,
    Option<nvml_mock::NvmlDouble>,
) {
    let double = nvml_mock::NvmlDouble::with_root(profile, root).unwrap();
    let backend =
        Arc::new(dra_driver_nvidia::backend::nvml::NvmlBackend::open(double.library()).unwrap());
    (backend.clone(), backend, Some(double))
}

#[cfg(not(feature = "nvml"))]
fn nvml_backend(
    _profile: &str,
    _root: &std::path::Path,
) -> (
    Arc<dyn dra_driver_nvidia::backend::GpuBackend>,
    Arc<dyn dra_driver_nvidia::backend::mig::MigManager>,
    Option<()>,
) {
    unreachable!("the tests over NVML are built with the nvml feature only")
}

/// Every shipped profile, on the NVML backend over the double.
#[cfg(feature = "nvml")]
#[tokio::test]
async fn every_profile_is_conformant_over_nvml() {
    for (profile, _) in dra_driver_nvidia::backend::mock::SHIPPED_PROFILES {
        conformant_on(profile, *profile == "workstation", &[], true).await;
    }
}

/// Dynamic MIG with health checking, on the NVML backend over the double: partitions created
/// and destroyed through NVML's calls, events through an NVML event set.
#[cfg(feature = "nvml")]
#[tokio::test]
async fn dynamic_mig_is_conformant_over_nvml() {
    conformant_on(
        "dgx-h100",
        false,
        &[
            "--feature-gates",
            "DynamicMIG=true,NVMLDeviceHealthCheck=true",
        ],
        true,
    )
    .await;
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
