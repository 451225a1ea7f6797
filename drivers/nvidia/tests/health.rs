//! Device health (gate NVMLDeviceHealthCheck) end to end on a mock machine: a health event
//! injected into the mock backend (through its API or its event file) reaches both the
//! ResourceSlice in the fake API server (taints) and the simulated kubelet's health stream,
//! and recovery (a quiet period or the operator's reset file) removes the taints again.

use std::time::Duration;

use dra_driver_nvidia::backend::events::{HealthEvent, HealthEventKind, RecoveryAction};
use dra_driver_nvidia::devices::DRIVER_NAME;
use dra_driver_nvidia::health::{TAINT_GPU_LOST, TAINT_UNMONITORED, TAINT_XID};
use dra_driver_nvidia::plugin::NvidiaPlugin;
use dra_sdk::health::HealthStatus;
use dra_sdk_testing::cluster::{NODE_NAME, RunningPlugin, TestCluster};
use dra_sdk_testing::kubelet::{HealthWatch, ObservedHealth};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, ListParams};

mod fixture;

use fixture::plugin_cli;

const WAIT: Duration = Duration::from_secs(20);

struct Fixture {
    running: RunningPlugin,
    nvidia: NvidiaPlugin,
    health: HealthWatch,
}

fn plugin(args: &[&str]) -> NvidiaPlugin {
    plugin_with_gates("NVMLDeviceHealthCheck=true", args)
}

fn plugin_with_gates(gates: &str, args: &[&str]) -> NvidiaPlugin {
    let cli = plugin_cli(&[&["--feature-gates", gates], args].concat());
    NvidiaPlugin::from_args(&cli.nvidia).unwrap()
}

async fn start(nvidia: NvidiaPlugin) -> Fixture {
    let running = TestCluster::start_with(
        nvidia.driver.clone(),
        DRIVER_NAME,
        nvidia.resources(NODE_NAME),
    )
    .await
    .unwrap();
    let health = running.kubelet().watch_health().await.unwrap();
    Fixture {
        running,
        nvidia,
        health,
    }
}

/// (key, value, effect) of a device's taints in the API server.
type Taints = Vec<(String, Option<String>, String)>;

impl Fixture {
    fn gpu(&self, index: usize) -> (String, String) {
        let gpu = &self.nvidia.discovery.gpus[index];
        (gpu.info.uuid.clone(), gpu.name.clone())
    }

    fn migs_of(&self, gpu_uuid: &str) -> Vec<String> {
        self.nvidia
            .discovery
            .migs
            .iter()
            .filter(|mig| mig.parent.uuid == gpu_uuid)
            .map(|mig| mig.name.clone())
            .collect()
    }

    fn inject(&self, event: HealthEvent) {
        self.nvidia.mock_events.as_ref().unwrap().inject(event);
    }

    async fn taints(&self, device: &str) -> Taints {
        let slices: Api<ResourceSlice> = Api::all(self.running.cluster().client());
        slices
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .flat_map(|slice| slice.spec.devices.unwrap_or_default())
            .filter(|published| published.name == device)
            .flat_map(|published| published.taints.unwrap_or_default())
            .map(|taint| (taint.key, taint.value, taint.effect))
            .collect()
    }

    /// Waits until every device in `devices` carries exactly `expected` in the API server.
    async fn wait_taints(&self, devices: &[String], expected: &Taints) {
        let waited = tokio::time::timeout(WAIT, async {
            loop {
                let mut all = true;
                for device in devices {
                    all &= self.taints(device).await == *expected;
                }
                if all {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        if waited.is_err() {
            let mut actual = Vec::new();
            for device in devices {
                actual.push((device.clone(), self.taints(device).await));
            }
            panic!("not all devices carried {expected:?}: {actual:?}");
        }
    }

    /// Waits until the health stream reports `status` for every device in `devices`; the
    /// matching entries.
    async fn wait_health(
        &mut self,
        devices: &[String],
        status: HealthStatus,
    ) -> Vec<ObservedHealth> {
        tokio::time::timeout(WAIT, async {
            loop {
                let update = self.health.next().await.unwrap().unwrap();
                let matching: Vec<ObservedHealth> = update
                    .into_iter()
                    .filter(|entry| devices.contains(&entry.device) && entry.status == status)
                    .collect();
                if matching.len() == devices.len() {
                    return matching;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{devices:?} never reported {status:?}"))
    }
}

fn taint(key: &str, value: Option<&str>, effect: &str) -> Taints {
    vec![(key.to_owned(), value.map(str::to_owned), effect.to_owned())]
}

#[tokio::test]
async fn critical_xid_taints_gpu_and_its_mig_devices_until_the_quiet_period_ends() {
    let mut fixture = start(plugin(&[
        "--mock-profile",
        "dgx-a100",
        "--health-recovery-period",
        "2",
    ]))
    .await;
    // A full GPU, and a MIG-enabled GPU, which publishes its MIG devices only: an event on
    // that GPU affects them all.
    let (uuid, gpu) = fixture.gpu(0);
    let mig_parent = fixture.nvidia.discovery.migs[0].parent.uuid.clone();
    let mut failed = vec![gpu];
    failed.extend(fixture.migs_of(&mig_parent));
    assert!(failed.len() > 1, "dgx-a100 has MIG devices");
    let (_, other) = fixture.gpu(1);
    fixture.wait_health(&failed, HealthStatus::Healthy).await;

    fixture.inject(HealthEvent::new(&uuid, HealthEventKind::Xid(79)));
    fixture.inject(HealthEvent::new(&mig_parent, HealthEventKind::Xid(79)));
    let xid = taint(TAINT_XID, Some("79"), "NoSchedule");
    fixture.wait_taints(&failed, &xid).await;
    assert!(fixture.taints(&other).await.is_empty());
    let unhealthy = fixture.wait_health(&failed, HealthStatus::Unhealthy).await;
    assert!(
        unhealthy
            .iter()
            .all(|entry| entry.message.contains("xid 79")),
        "{unhealthy:?}"
    );

    // No event for the recovery period: untainted, Healthy again.
    fixture.wait_taints(&failed, &Vec::new()).await;
    fixture.wait_health(&failed, HealthStatus::Healthy).await;
    fixture.running.shutdown().await.unwrap();
}

/// A GPU whose recovery action asks for a reset keeps its taint past the quiet period, until
/// it reports none needed.
#[tokio::test]
async fn a_gpu_that_needs_a_reset_stays_tainted_past_the_quiet_period() {
    let fixture = start(plugin(&[
        "--mock-profile",
        "dgx-a100",
        "--health-recovery-period",
        "1",
    ]))
    .await;
    let (uuid, gpu) = fixture.gpu(4);
    let events = fixture.nvidia.mock_events.clone().unwrap();
    events.set_recovery_action(&uuid, RecoveryAction::GpuReset);
    fixture.inject(HealthEvent::new(&uuid, HealthEventKind::Xid(79)));
    let xid = taint(TAINT_XID, Some("79"), "NoSchedule");
    fixture.wait_taints(std::slice::from_ref(&gpu), &xid).await;
    // Three checks past the quiet period: still tainted.
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    assert_eq!(fixture.taints(&gpu).await, xid);
    // The GPU was reset: nothing needed any more, the next check clears the taint.
    events.set_recovery_action(&uuid, RecoveryAction::None);
    fixture.wait_taints(&[gpu], &Vec::new()).await;
    fixture.running.shutdown().await.unwrap();
}

/// With DynamicMIG (which upstream excludes from health checking): an XID on a
/// partitionable GPU taints its full GPU and all 25 partitions, published in the GPU's own
/// pool, and reports them Unhealthy; the other GPUs stay clean; the quiet period heals them.
#[tokio::test]
async fn with_dynamic_mig_an_xid_taints_the_gpu_and_all_its_partitions() {
    let mut fixture = start(plugin_with_gates(
        "NVMLDeviceHealthCheck=true,DynamicMIG=true",
        &[
            "--mock-profile",
            "dgx-h100",
            // 26 devices per GPU in 8 pools make each publish heavier than on the other
            // profiles: a longer quiet period, so that a slow publish under load is still
            // seen tainted before recovery.
            "--health-recovery-period",
            "6",
        ],
    ))
    .await;
    let (uuid, gpu) = fixture.gpu(2);
    let mut failed = vec![gpu];
    failed.extend(
        fixture
            .nvidia
            .discovery
            .partitions
            .iter()
            .filter(|partition| partition.parent.uuid == uuid)
            .map(|partition| partition.name.clone()),
    );
    assert_eq!(failed.len(), 26, "{failed:?}");
    let (_, other) = fixture.gpu(3);
    fixture.wait_health(&failed, HealthStatus::Healthy).await;

    fixture.inject(HealthEvent::new(&uuid, HealthEventKind::Xid(79)));
    let xid = taint(TAINT_XID, Some("79"), "NoSchedule");
    fixture.wait_taints(&failed, &xid).await;
    assert!(fixture.taints(&other).await.is_empty());
    assert!(fixture.taints("gpu-3-mig-1g10gb-19-0").await.is_empty());
    fixture.wait_health(&failed, HealthStatus::Unhealthy).await;

    fixture.wait_taints(&failed, &Vec::new()).await;
    fixture.wait_health(&failed, HealthStatus::Healthy).await;
    fixture.running.shutdown().await.unwrap();
}

#[tokio::test]
async fn ignorable_xids_from_the_event_file_are_informational() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events");
    let mut fixture = start(plugin(&[
        "--mock-profile",
        "workstation",
        "--additional-xids-to-ignore",
        "48",
        "--mock-health-events",
        events.to_str().unwrap(),
    ]))
    .await;
    let (uuid, gpu) = fixture.gpu(0);
    let devices = vec![gpu];
    std::fs::write(&events, format!("{uuid} xid 48\n")).unwrap();
    fixture
        .wait_taints(&devices, &taint(TAINT_XID, Some("48"), "None"))
        .await;
    fixture.wait_health(&devices, HealthStatus::Healthy).await;

    // Built-in ignorable XID on an unknown device: ignored.
    std::fs::write(
        &events,
        format!("{uuid} xid 48\nGPU-unknown xid 13\n{uuid} xid 13\n"),
    )
    .unwrap();
    fixture
        .wait_taints(&devices, &taint(TAINT_XID, Some("13"), "None"))
        .await;
    fixture.running.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_lost_gpu_stays_tainted_until_the_operator_resets_it() {
    let reset = tempfile::tempdir().unwrap();
    let mut fixture = start(plugin(&[
        "--mock-profile",
        "workstation",
        "--health-recovery-period",
        "1",
        "--health-reset-dir",
        reset.path().to_str().unwrap(),
    ]))
    .await;
    let (uuid, gpu) = fixture.gpu(0);
    let devices = vec![gpu.clone()];
    fixture.inject(HealthEvent::new(&uuid, HealthEventKind::GpuLost));
    let lost = taint(TAINT_GPU_LOST, None, "NoSchedule");
    fixture.wait_taints(&devices, &lost).await;
    fixture.wait_health(&devices, HealthStatus::Unhealthy).await;

    // Well past the recovery period: still lost.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(fixture.taints(&gpu).await, lost);

    let signal = reset.path().join(&gpu);
    std::fs::write(&signal, "").unwrap();
    fixture.wait_taints(&devices, &Vec::new()).await;
    fixture.wait_health(&devices, HealthStatus::Healthy).await;
    assert!(!signal.exists(), "the reset file is consumed");
    fixture.running.shutdown().await.unwrap();
}

#[tokio::test]
async fn devices_are_unmonitored_when_events_cannot_be_registered() {
    let nvidia = plugin(&["--mock-profile", "dgx-a100"]);
    nvidia
        .mock_events
        .as_ref()
        .unwrap()
        .refuse_registration("events not supported");
    let mut fixture = start(nvidia).await;
    let devices: Vec<String> = fixture
        .nvidia
        .discovery
        .gpus
        .iter()
        .map(|gpu| gpu.name.clone())
        .chain(
            fixture
                .nvidia
                .discovery
                .migs
                .iter()
                .map(|mig| mig.name.clone()),
        )
        .collect();
    fixture
        .wait_taints(&devices, &taint(TAINT_UNMONITORED, None, "None"))
        .await;
    fixture.wait_health(&devices, HealthStatus::Unknown).await;
    fixture.running.shutdown().await.unwrap();
}

/// One GPU whose registration fails is unmonitored alone: its device carries the informational
/// taint and is Unknown, the others stay Healthy and untainted.
#[tokio::test]
async fn a_gpu_whose_registration_fails_is_unmonitored_alone() {
    let nvidia = plugin(&["--mock-profile", "dgx-a100"]);
    let unwatched = nvidia.discovery.gpus[1].clone();
    nvidia
        .mock_events
        .as_ref()
        .unwrap()
        .refuse_registration_of(&unwatched.info.uuid);
    let mut fixture = start(nvidia).await;
    fixture
        .wait_taints(
            std::slice::from_ref(&unwatched.name),
            &taint(TAINT_UNMONITORED, None, "None"),
        )
        .await;
    fixture
        .wait_health(std::slice::from_ref(&unwatched.name), HealthStatus::Unknown)
        .await;
    let (_, other) = fixture.gpu(0);
    assert!(fixture.taints(&other).await.is_empty());
    fixture.wait_health(&[other], HealthStatus::Healthy).await;
    fixture.running.shutdown().await.unwrap();
}
