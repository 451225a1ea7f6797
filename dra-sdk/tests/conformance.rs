//! The conformance suite over the SDK's own plugin runtime: a correct driver passes every case,
//! in process and as a remote target; broken drivers and plugins fail the case that covers
//! their defect, and the report names it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dra_sdk::cdi::ContainerEdits;
use dra_sdk::checkpoint::ClaimRecord;
use dra_sdk::config::{ConfigHooks, ConfigRegistry, OpaqueConfig};
use dra_sdk::driver::{Claim, ClaimRef, Driver, DriverError, PreparedClaim, PreparedDevice};
use dra_sdk::health::{DeviceHealth, HealthReporter, HealthSource, HealthStatus};
use dra_sdk::slices::{Device, DriverResources};
use dra_sdk::testing::cluster::{NODE_NAME, TestCluster};
use dra_sdk::testing::conformance::{Case, Conformance, Outcome, Report};
use serde::Deserialize;

const DRIVER: &str = "gpu.example.com";

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GpuConfig {
    #[serde(default)]
    sharing: Option<String>,
}

impl ConfigHooks for GpuConfig {}

impl OpaqueConfig for GpuConfig {
    const API_VERSION: &'static str = "gpu.example.com/v1";
    const KIND: &'static str = "GpuConfig";
}

/// A correct driver: one CDI device per GPU, common edits, optional health.
#[derive(Clone, Default)]
struct GoodDriver {
    health: Option<HealthSource>,
}

#[async_trait::async_trait]
impl Driver for GoodDriver {
    type Config = GpuConfig;

    fn config_registry(&self) -> ConfigRegistry<GpuConfig> {
        ConfigRegistry::new().register::<GpuConfig>()
    }

    async fn prepare(&self, claim: &Claim<GpuConfig>) -> Result<PreparedClaim, DriverError> {
        let devices = claim
            .devices
            .iter()
            .map(|device| {
                let sharing = device
                    .config()
                    .and_then(|c| c.sharing.clone())
                    .unwrap_or_else(|| "none".into());
                let edits = ContainerEdits::new()
                    .env(format!("GPU_{}", device.device.replace('-', "_")), "1")
                    .env("SHARING", sharing);
                PreparedDevice::new(device, edits)
            })
            .collect();
        Ok(PreparedClaim::new(devices)
            .with_common_edits(ContainerEdits::new().env("DRIVER", DRIVER)))
    }

    async fn unprepare(&self, _: &ClaimRef, _: &ClaimRecord) -> Result<(), DriverError> {
        Ok(())
    }

    fn health(&self) -> Option<HealthSource> {
        self.health.clone()
    }
}

fn gpus(n: usize) -> DriverResources {
    let devices = (0..n)
        .map(|i| Device::new(format!("gpu-{i}")).attribute("index", i as i64))
        .collect();
    DriverResources::single_pool(NODE_NAME, devices)
}

fn outcome(report: &Report, case: Case) -> &Outcome {
    &report
        .case(case.name())
        .unwrap_or_else(|| panic!("{case} did not run:\n{report}"))
        .outcome
}

#[tokio::test]
async fn a_correct_driver_passes_every_case_in_process() {
    let (reporter, source) = HealthReporter::new();
    reporter.set(
        (0..4)
            .map(|i| DeviceHealth::new(NODE_NAME, format!("gpu-{i}"), HealthStatus::Healthy))
            .collect(),
    );
    let driver = GoodDriver {
        health: Some(source),
    };
    let report = Conformance::in_process(DRIVER, gpus(4), move || driver.clone())
        .run()
        .await
        .unwrap();
    println!("{report}");
    report.assert_passed();
    assert_eq!(report.cases.len(), Case::ALL.len());
    for case in &report.cases {
        assert_eq!(case.outcome, Outcome::Passed, "{}:\n{report}", case.name);
    }
    assert_eq!(report.driver, DRIVER);
    assert_eq!(report.target, "in-process");
}
