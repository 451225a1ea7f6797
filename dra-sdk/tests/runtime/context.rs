//! The driver's runtime context, end to end: a simulated kubelet on the plugin's real sockets,
//! the fake API server holding claims and ResourceSlices, the checkpoint in a temporary folder.
//!
//! Covered: `Driver::start` receives the context before registration; publishing changed
//! devices; one device-state call feeding the kubelet's health stream and the slices' taints;
//! the cancellation token; reading prepared claims; typed driver state updated after prepare
//! and persisted across restarts; the start-up reconcile (after rollback, errors reported or
//! fatal); extra CDI device IDs; unit-testing `prepare` without a cluster.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use dra_sdk::advanced::RegistrationStatus;
use dra_sdk::advanced::checkpoint::{Checkpoint, ClaimChange, ClaimRecord, PreparedDeviceRecord};
use dra_sdk::advanced::slices::{PublishEvent, ResourceApiVersion};
use dra_sdk::cdi::ContainerEdits;
use dra_sdk::claim::{AllocatedDevice, Claim, ClaimRef, ConfigSource, DriverError, RecordedClaim};
use dra_sdk::config::ConfigRegistry;
use dra_sdk::context::{ContextError, DriverContext};
use dra_sdk::driver::{Driver, PluginEvent, PreparedClaim, PreparedDevice, ReconcileError};
use dra_sdk::health::{DeviceState, HealthStatus};
use dra_sdk::plugin::{KubeletPlugin, PluginError};
use dra_sdk::slices::{DeviceTaint, DriverResources, TaintEffect};
use dra_sdk_testing::assert_contains;
use dra_sdk_testing::claims::AllocatedClaim;
use dra_sdk_testing::cluster::{BOOT_ID, NODE_NAME, TestCluster, claim_ref, wait_for_devices};
use dra_sdk_testing::kubelet::{KubeletVersion, RegisteredPlugin};
use serde::{Deserialize, Serialize};

use dra_sdk_testing::sample_driver::{DRIVER, GpuConfig, gpus, prepare_gpus};

/// What the driver keeps per claim: a (pretend) sharing daemon and how often it restarted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct DaemonState {
    daemon: String,
    restarts: u32,
}

/// How the start-up reconcile should end.
#[derive(Clone, Copy, Default)]
enum ReconcileOutcome {
    #[default]
    Ok,
    Recoverable,
    Fatal,
}

/// Records every hook call in order, keeps its context, and prepares GPUs with a typed state.
#[derive(Default)]
struct ContextDriver {
    ctx: OnceLock<DriverContext>,
    log: Mutex<Vec<String>>,
    events: Mutex<Vec<PluginEvent>>,
    reconciled: Mutex<Vec<RecordedClaim>>,
    unprepared_states: Mutex<Vec<Option<DaemonState>>>,
    /// Published from `start` instead of the builder's resources.
    publish_in_start: Option<DriverResources>,
    fail_start: bool,
    reconcile: ReconcileOutcome,
    /// Per device, an extra CDI device ID of a spec the SDK does not manage.
    extra_cdi_id: Option<String>,
    /// Whether `update_driver_state` from inside prepare was refused, as it must be.
    refused_inside_prepare: AtomicBool,
}

impl ContextDriver {
    fn log(&self, entry: impl Into<String>) {
        self.log.lock().unwrap().push(entry.into());
    }

    fn ctx(&self) -> &DriverContext {
        self.ctx.get().expect("Driver::start was called")
    }
}

#[async_trait::async_trait]
impl Driver for ContextDriver {
    type Config = GpuConfig;

    fn config_registry(&self) -> ConfigRegistry<GpuConfig> {
        ConfigRegistry::new().register::<GpuConfig>()
    }

    async fn start(&self, ctx: &DriverContext) -> Result<(), DriverError> {
        self.log("start");
        if self.fail_start {
            return Err(DriverError::Unavailable("no devices found".into()));
        }
        if let Some(resources) = &self.publish_in_start {
            ctx.publish(resources.clone())?;
        }
        let _ = self.ctx.set(ctx.clone());
        Ok(())
    }

    async fn reconcile(&self, prepared: &[RecordedClaim]) -> Result<(), ReconcileError> {
        let names: Vec<&str> = prepared.iter().map(|c| c.claim.name.as_str()).collect();
        self.log(format!("reconcile {names:?}"));
        self.reconciled
            .lock()
            .unwrap()
            .extend(prepared.iter().cloned());
        match self.reconcile {
            ReconcileOutcome::Ok => Ok(()),
            ReconcileOutcome::Recoverable => {
                Err(DriverError::Unavailable("MIG instance 3 is busy".into()).into())
            }
            ReconcileOutcome::Fatal => Err(ReconcileError::fatal(DriverError::Device {
                device: "gpu-0".into(),
                reason: "cannot destroy orphaned MIG instances".into(),
            })),
        }
    }

    fn reports_health(&self) -> bool {
        true
    }

    async fn prepare(&self, claim: &Claim<GpuConfig>) -> Result<PreparedClaim, DriverError> {
        self.log(format!("prepare {}", claim.claim.name));
        let inside = self.ctx().update_driver_state(&claim.claim.uid, &0).await;
        if matches!(inside, Err(ContextError::InsideClaimOperation { .. })) {
            self.refused_inside_prepare.store(true, Ordering::SeqCst);
        }
        let mut prepared = prepare_gpus(claim);
        if let Some(id) = &self.extra_cdi_id {
            prepared.devices = prepared
                .devices
                .into_iter()
                .map(|device| device.with_cdi_device_id(id))
                .collect();
        }
        Ok(prepared.with_typed_state(&DaemonState {
            daemon: format!("mps-{}", claim.claim.name),
            restarts: 0,
        })?)
    }

    async fn unprepare(&self, claim: &RecordedClaim) -> Result<(), DriverError> {
        self.log(format!("unprepare {}", claim.claim.name));
        let state = claim.decode_state::<DaemonState>()?;
        self.unprepared_states.lock().unwrap().push(state);
        Ok(())
    }

    fn on_event(&self, event: &PluginEvent) {
        self.events.lock().unwrap().push(event.clone());
    }
}

async fn start(
    cluster: &TestCluster,
    driver: &Arc<ContextDriver>,
    resources: Option<DriverResources>,
) -> Result<(KubeletPlugin, RegisteredPlugin), PluginError> {
    let mut builder = cluster
        .plugin(Arc::clone(driver), DRIVER)
        .health_resend_interval(Duration::from_millis(200));
    if let Some(resources) = resources {
        builder = builder.resources(resources);
    }
    let plugin = builder.start().await?;
    let kubelet = cluster
        .register(&plugin, KubeletVersion::V1_36)
        .await
        .expect("registration");
    Ok((plugin, kubelet))
}

async fn gpu_claim(cluster: &TestCluster, name: &str, devices: &[&str]) -> ClaimRef {
    let mut builder = AllocatedClaim::new("default", name);
    for device in devices {
        builder = builder.device("gpu", DRIVER, NODE_NAME, device);
    }
    claim_ref(&builder.create(&cluster.client()).await.unwrap()).unwrap()
}

/// Polls the driver's ResourceSlices until `done` holds for the devices they list.
async fn wait_for_slices(
    cluster: &TestCluster,
    what: &str,
    done: impl Fn(&[k8s_openapi::api::resource::v1::Device]) -> bool,
) -> Vec<k8s_openapi::api::resource::v1::Device> {
    wait_for_devices(&cluster.client(), DRIVER, what, done).await
}

fn taints_of(devices: &[k8s_openapi::api::resource::v1::Device], name: &str) -> Vec<String> {
    devices
        .iter()
        .find(|d| d.name == name)
        .and_then(|d| d.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| format!("{}={}:{}", t.key, t.value.unwrap_or_default(), t.effect))
        .collect()
}

#[tokio::test]
async fn published_devices_and_device_states_reach_the_slices_and_the_health_stream() {
    let cluster = TestCluster::start().await.unwrap();
    let driver = Arc::new(ContextDriver::default());
    let (plugin, kubelet) = start(&cluster, &driver, Some(gpus(2))).await.unwrap();
    assert!(
        kubelet.health_advertised,
        "reports_health advertises the stream"
    );
    let ctx = driver.ctx().clone();
    assert_eq!(ctx.driver_name(), DRIVER);
    assert_eq!(ctx.node_name(), NODE_NAME);
    wait_for_slices(&cluster, "the builder's 2 GPUs", |d| d.len() == 2).await;

    // Hot-plug: a third GPU appears.
    ctx.publish(gpus(3)).unwrap();
    wait_for_slices(&cluster, "3 GPUs", |d| d.len() == 3).await;

    // One call: gpu-1 fails, the kubelet hears it and the slice carries the taint.
    let mut health = kubelet.watch_health().await.unwrap();
    ctx.set_device_state(
        DeviceState::unhealthy(NODE_NAME, "gpu-1", "XID 79").with_taint(
            DeviceTaint::new("gpu.example.com/xid", TaintEffect::NoExecute).value("79"),
        ),
    );
    let devices = wait_for_slices(&cluster, "the taint on gpu-1", |d| {
        !taints_of(d, "gpu-1").is_empty()
    })
    .await;
    assert_eq!(
        taints_of(&devices, "gpu-1"),
        ["gpu.example.com/xid=79:NoExecute"]
    );
    assert!(taints_of(&devices, "gpu-0").is_empty());
    let observed = loop {
        let list = health.next().await.unwrap().unwrap();
        if list.iter().any(|d| d.status == HealthStatus::Unhealthy) {
            break list;
        }
    };
    let gpu1 = observed.iter().find(|d| d.device == "gpu-1").unwrap();
    assert_eq!(
        (gpu1.pool.as_str(), gpu1.message.as_str()),
        (NODE_NAME, "XID 79")
    );

    // Devices published later keep the state's taint.
    ctx.publish(gpus(4)).unwrap();
    let devices = wait_for_slices(&cluster, "4 GPUs", |d| d.len() == 4).await;
    assert_eq!(taints_of(&devices, "gpu-1").len(), 1);

    // Recovery: one call, healthy on the stream and the taint gone.
    ctx.set_device_state(DeviceState::healthy(NODE_NAME, "gpu-1"));
    wait_for_slices(&cluster, "gpu-1 untainted", |d| {
        d.len() == 4 && taints_of(d, "gpu-1").is_empty()
    })
    .await;
    loop {
        let list = health.next().await.unwrap().unwrap();
        if list
            .iter()
            .any(|d| d.device == "gpu-1" && d.status == HealthStatus::Healthy)
        {
            break;
        }
    }
    assert!(ctx.resources().is_some_and(|r| r.device_count() == 4));
    plugin.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_driver_publishes_its_first_devices_from_start_and_the_token_ends_with_the_plugin() {
    let cluster = TestCluster::start().await.unwrap();
    let driver = Arc::new(ContextDriver {
        publish_in_start: Some(gpus(3)),
        ..ContextDriver::default()
    });
    // No resources given to the builder: what `start` published is what the plugin writes.
    let (plugin, _kubelet) = start(&cluster, &driver, None).await.unwrap();
    wait_for_slices(&cluster, "the 3 GPUs published in start", |d| d.len() == 3).await;
    plugin.published().await;

    // The publisher's progress reaches the driver the one way events do: `on_event`.
    let published = || {
        let events = driver.events.lock().unwrap();
        let connected = events.iter().any(|event| {
            matches!(
                event,
                PluginEvent::Publish(PublishEvent::Connected {
                    api_version: ResourceApiVersion::V1,
                    ..
                })
            )
        });
        let synced = events
            .iter()
            .any(|event| matches!(event, PluginEvent::Publish(PublishEvent::Synced { .. })));
        connected && synced
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !published() {
        assert!(tokio::time::Instant::now() < deadline, "no publish events");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let token = driver.ctx().cancellation_token();
    assert!(!token.is_cancelled());
    plugin.shutdown().await.unwrap();
    tokio::time::timeout(Duration::from_secs(1), token.cancelled())
        .await
        .expect("the token is cancelled at shutdown");
}

#[tokio::test]
async fn without_a_publisher_publishing_is_a_typed_error() {
    let cluster = TestCluster::start().await.unwrap();
    let driver = Arc::new(ContextDriver::default());
    let (plugin, _kubelet) = start(&cluster, &driver, None).await.unwrap();
    assert!(matches!(
        driver.ctx().publish(gpus(1)),
        Err(ContextError::NotPublishing)
    ));
    // Device states still reach the health stream.
    driver
        .ctx()
        .set_device_state(DeviceState::healthy(NODE_NAME, "gpu-0"));
    plugin.shutdown().await.unwrap();
}

#[tokio::test]
async fn typed_driver_state_is_read_updated_and_survives_a_restart() {
    let cluster = TestCluster::start().await.unwrap();
    let driver = Arc::new(ContextDriver::default());
    let (plugin, kubelet) = start(&cluster, &driver, Some(gpus(2))).await.unwrap();
    let claim = gpu_claim(&cluster, "shared", &["gpu-0", "gpu-1"]).await;
    let result = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
    assert_eq!(result[&claim.uid].as_ref().unwrap().len(), 2);
    assert!(
        driver.refused_inside_prepare.load(Ordering::SeqCst),
        "updating a claim's state from its own prepare must fail, not deadlock"
    );

    // Read access: the claim, its devices and its typed state.
    let ctx = driver.ctx().clone();
    let prepared = ctx.prepared_claims().await.unwrap();
    assert_eq!(prepared.len(), 1);
    assert_eq!(prepared[0].claim, claim);
    let devices: Vec<&str> = prepared[0]
        .devices
        .iter()
        .map(|d| d.device.name.as_str())
        .collect();
    assert_eq!(devices, ["gpu-0", "gpu-1"]);
    assert_eq!(
        prepared[0].decode_state::<DaemonState>().unwrap(),
        Some(DaemonState {
            daemon: "mps-shared".into(),
            restarts: 0
        })
    );
    // A state that does not fit the type says which claim and which field.
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Wrong {
        restarts: String,
    }
    let error = prepared[0].decode_state::<Wrong>().unwrap_err().to_string();
    assert_contains(&error, &claim.uid);
    assert_contains(&error, "`restarts`");

    // The daemon restarts: the new state goes to the checkpoint.
    let restarted = DaemonState {
        daemon: "mps-shared-2".into(),
        restarts: 1,
    };
    ctx.update_driver_state(&claim.uid, &restarted)
        .await
        .unwrap();
    let error = ctx
        .update_driver_state("no-such-claim", &restarted)
        .await
        .unwrap_err();
    assert!(
        matches!(error, ContextError::ClaimNotPrepared { .. }),
        "{error}"
    );

    // A new instance's reconcile sees the updated state; its unprepare gets it too.
    plugin.shutdown().await.unwrap();
    let driver = Arc::new(ContextDriver::default());
    let (plugin, kubelet) = start(&cluster, &driver, Some(gpus(2))).await.unwrap();
    let reconciled = driver.reconciled.lock().unwrap().clone();
    assert_eq!(reconciled.len(), 1);
    assert_eq!(
        reconciled[0].decode_state::<DaemonState>().unwrap(),
        Some(restarted.clone())
    );
    let result = kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(result[&claim.uid].is_ok(), "{result:?}");
    assert_eq!(*driver.unprepared_states.lock().unwrap(), [Some(restarted)]);
    assert!(driver.ctx().prepared_claims().await.unwrap().is_empty());
    plugin.shutdown().await.unwrap();
}

/// Writes a checkpoint as a crashed instance would leave it: one completed claim, one whose
/// prepare never finished.
fn seed_checkpoint(cluster: &TestCluster) {
    let (checkpoint, _) = Checkpoint::open(&cluster.plugins_dir().join(DRIVER), BOOT_ID).unwrap();
    let mut device = PreparedDeviceRecord::new(NODE_NAME, "gpu-0");
    device.request_names = vec!["gpu".into()];
    checkpoint
        .update([
            ClaimChange::put(
                "uid-done",
                ClaimRecord::started("default", "done")
                    .with_driver_state(serde_json::json!({ "daemon": "mps-done", "restarts": 0 }))
                    .into_completed(vec![device]),
            ),
            ClaimChange::put("uid-half", ClaimRecord::started("default", "half")),
        ])
        .unwrap();
}

#[tokio::test]
async fn reconcile_sees_the_completed_claims_after_the_rollback_and_before_registration() {
    let cluster = TestCluster::start().await.unwrap();
    seed_checkpoint(&cluster);
    let driver = Arc::new(ContextDriver::default());
    let plugin = cluster
        .plugin(Arc::clone(&driver), DRIVER)
        .start()
        .await
        .unwrap();
    // `start` returned: every hook ran, and the kubelet has not registered the plugin yet.
    assert_eq!(
        *plugin.registration_status().borrow(),
        RegistrationStatus::Pending
    );
    assert_eq!(
        *driver.log.lock().unwrap(),
        ["unprepare half", "start", "reconcile [\"done\"]"]
    );
    let reconciled = driver.reconciled.lock().unwrap().clone();
    assert_eq!(
        reconciled[0].claim,
        ClaimRef::new("default", "done", "uid-done")
    );
    assert_eq!(reconciled[0].devices[0].device.name, "gpu-0");
    assert_eq!(
        reconciled[0]
            .decode_state::<DaemonState>()
            .unwrap()
            .unwrap()
            .daemon,
        "mps-done"
    );
    plugin.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_failed_reconcile_is_reported_and_the_plugin_serves_unless_it_is_fatal() {
    let cluster = TestCluster::start().await.unwrap();
    seed_checkpoint(&cluster);
    let driver = Arc::new(ContextDriver {
        reconcile: ReconcileOutcome::Recoverable,
        ..ContextDriver::default()
    });
    let (plugin, kubelet) = start(&cluster, &driver, Some(gpus(1))).await.unwrap();
    assert!(driver.events.lock().unwrap().iter().any(|event| matches!(
        event,
        PluginEvent::ReconcileFailed { error } if error.contains("MIG instance 3 is busy")
    )));
    // It serves: the completed claim is answered from the checkpoint.
    let done = ClaimRef::new("default", "done", "uid-done");
    let result = kubelet.prepare(std::slice::from_ref(&done)).await.unwrap();
    assert_eq!(result[&done.uid].as_ref().unwrap()[0].device, "gpu-0");
    plugin.shutdown().await.unwrap();

    let fatal = Arc::new(ContextDriver {
        reconcile: ReconcileOutcome::Fatal,
        ..ContextDriver::default()
    });
    let error = start(&cluster, &fatal, Some(gpus(1))).await.unwrap_err();
    assert!(
        matches!(
            error,
            PluginError::Driver {
                hook: "reconcile",
                ..
            }
        ),
        "{error}"
    );
    // The context it got in `start` is cancelled: its background work stops.
    assert!(fatal.ctx().cancellation_token().is_cancelled());
    assert!(
        error.to_string().contains("orphaned MIG instances"),
        "{error}"
    );

    let broken = Arc::new(ContextDriver {
        fail_start: true,
        ..ContextDriver::default()
    });
    let error = start(&cluster, &broken, Some(gpus(1))).await.unwrap_err();
    assert!(
        matches!(error, PluginError::Driver { hook: "start", .. }),
        "{error}"
    );
    assert_eq!(*broken.log.lock().unwrap(), ["start"]);
    // Nothing was left registered by the failed starts.
    assert!(
        std::fs::read_dir(cluster.registrar_dir())
            .unwrap()
            .next()
            .is_none()
    );
}

#[tokio::test]
async fn extra_cdi_device_ids_reach_the_kubelet_after_the_sdks_own() {
    let cluster = TestCluster::start().await.unwrap();
    let driver = Arc::new(ContextDriver {
        extra_cdi_id: Some("nvidia.com/gpu=all".into()),
        ..ContextDriver::default()
    });
    let (plugin, kubelet) = start(&cluster, &driver, Some(gpus(1))).await.unwrap();
    let claim = gpu_claim(&cluster, "extra", &["gpu-0"]).await;
    let result = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
    let ids = &result[&claim.uid].as_ref().unwrap()[0].cdi_device_ids;
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(ids[0].starts_with("k8s.gpu.example.com/gpu="), "{ids:?}");
    assert_eq!(ids[1], "nvidia.com/gpu=all");
    plugin.shutdown().await.unwrap();

    // An ID that is not a qualified CDI name fails the claim with a clear message.
    let driver = Arc::new(ContextDriver {
        extra_cdi_id: Some("not a cdi name".into()),
        ..ContextDriver::default()
    });
    let (plugin, kubelet) = start(&cluster, &driver, Some(gpus(1))).await.unwrap();
    let claim = gpu_claim(&cluster, "bad-extra", &["gpu-0"]).await;
    let result = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
    let error = result[&claim.uid].as_ref().unwrap_err();
    assert_contains(error, "not a qualified CDI name");
    plugin.shutdown().await.unwrap();
}

/// A driver author's unit test: no API server, no sockets.
#[tokio::test]
async fn prepare_is_unit_testable_with_built_and_resolved_claims() {
    let driver = ContextDriver::default();
    let ctx_free = dra_sdk_testing::sample_driver::GpuDriver::default();

    // Built by hand.
    let claim: Claim<GpuConfig> = Claim::new(ClaimRef::new("default", "c", "uid-1"))
        .with_device(AllocatedDevice::new("gpu", NODE_NAME, "gpu-0").with_config(
            ConfigSource::Claim,
            GpuConfig {
                sharing: Some("TimeSlicing".into()),
            },
        ))
        .with_device(
            AllocatedDevice::new("gpu", NODE_NAME, "gpu-1")
                .with_share_id("share-1")
                .with_consumed_capacity("memory", "10Gi"),
        );
    let prepared = ctx_free.prepare(&claim).await.unwrap();
    assert_eq!(prepared.devices.len(), 2);
    assert!(
        prepared.devices[0]
            .edits
            .env
            .contains(&"SHARING=TimeSlicing".to_string())
    );

    // Resolved from a ResourceClaim fixture exactly as the plugin does.
    let object = AllocatedClaim::new("default", "c")
        .device("gpu", DRIVER, NODE_NAME, "gpu-0")
        .device("nic", "net.example.com", NODE_NAME, "eth0")
        .claim_config(
            &["gpu"],
            DRIVER,
            serde_json::json!({ "apiVersion": "gpu.example.com/v1", "kind": "GpuConfig", "sharing": "MPS" }),
        )
        .build();
    let claim = dra_sdk::advanced::claim::resolve(
        ClaimRef::new("default", "c", "uid-1"),
        Arc::new(object),
        DRIVER,
        &driver.config_registry(),
    )
    .unwrap();
    assert_eq!(claim.devices.len(), 1);
    let prepared = ctx_free.prepare(&claim).await.unwrap();
    assert!(
        prepared.devices[0]
            .edits
            .env
            .contains(&"SHARING=MPS".to_string())
    );
    // Extra CDI IDs and typed state are plain builder calls.
    let device = PreparedDevice::new(&claim.devices[0], ContainerEdits::new())
        .with_cdi_device_id("nvidia.com/gpu=0");
    assert_eq!(device.cdi_device_ids, ["nvidia.com/gpu=0"]);
}

/// Counts how many driver operations run at once across every plugin instance sharing it.
#[derive(Clone, Default)]
struct Hardware {
    busy: Arc<std::sync::atomic::AtomicUsize>,
    most: Arc<std::sync::atomic::AtomicUsize>,
}

impl Hardware {
    async fn operate(&self) {
        let now = self.busy.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(40)).await;
        self.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A driver whose (pretend) hardware operations must not overlap, like MIG placement.
struct PlacementDriver {
    hardware: Hardware,
}

#[async_trait::async_trait]
impl Driver for PlacementDriver {
    type Config = GpuConfig;

    fn config_registry(&self) -> ConfigRegistry<GpuConfig> {
        ConfigRegistry::new().register::<GpuConfig>()
    }

    async fn prepare(&self, claim: &Claim<GpuConfig>) -> Result<PreparedClaim, DriverError> {
        self.hardware.operate().await;
        Ok(prepare_gpus(claim))
    }

    async fn unprepare(&self, _: &RecordedClaim) -> Result<(), DriverError> {
        self.hardware.operate().await;
        Ok(())
    }
}

/// Two instances of the plugin on one node (a rolling update), each prepared and unprepared
/// three claims at once; returns the most driver operations that overlapped.
async fn most_overlapping_operations(serialize: bool) -> usize {
    let cluster = TestCluster::start().await.unwrap();
    let hardware = Hardware::default();
    let mut plugins = Vec::new();
    let mut kubelets = Vec::new();
    for pod_uid in ["old-pod", "new-pod"] {
        let driver = PlacementDriver {
            hardware: hardware.clone(),
        };
        let plugin = cluster
            .plugin(driver, DRIVER)
            .pod_uid(pod_uid)
            .serialize_operations(serialize)
            .start()
            .await
            .unwrap();
        kubelets.push(
            cluster
                .register(&plugin, KubeletVersion::V1_36)
                .await
                .unwrap(),
        );
        plugins.push(plugin);
    }
    let mut claims = Vec::new();
    for i in 0..6 {
        claims.push(gpu_claim(&cluster, &format!("placed-{i}"), &["gpu-0"]).await);
    }
    let prepares = claims.iter().enumerate().map(|(i, claim)| {
        let kubelet = &kubelets[i % 2];
        async move { kubelet.prepare(std::slice::from_ref(claim)).await.unwrap() }
    });
    for (claim, result) in claims.iter().zip(futures::future::join_all(prepares).await) {
        assert!(result[&claim.uid].is_ok(), "{result:?}");
    }
    let unprepares = claims.iter().enumerate().map(|(i, claim)| {
        // The other instance unprepares: both share the checkpoint.
        let kubelet = &kubelets[(i + 1) % 2];
        async move {
            kubelet
                .unprepare(std::slice::from_ref(claim))
                .await
                .unwrap()
        }
    });
    for (claim, result) in claims
        .iter()
        .zip(futures::future::join_all(unprepares).await)
    {
        assert!(result[&claim.uid].is_ok(), "{result:?}");
    }
    for plugin in plugins {
        plugin.shutdown().await.unwrap();
    }
    hardware.most.load(Ordering::SeqCst)
}

#[tokio::test]
async fn serialized_operations_never_overlap_across_instances() {
    assert_eq!(most_overlapping_operations(true).await, 1);
    // The control: without the option the same load overlaps, so the assertion above has teeth.
    assert!(most_overlapping_operations(false).await > 1);
}
