//! The kubelet plugin runtime, end to end: a simulated kubelet dials the plugin's real Unix
//! sockets, the plugin reads claims from the fake API server over HTTP, writes CDI specs and
//! its checkpoint to a temporary directory.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dra_sdk::advanced::RegistrationStatus;
use dra_sdk::advanced::checkpoint::{Checkpoint, ClaimChange, ClaimRecord, ClaimState};
use dra_sdk::claim::{Claim, ClaimRef, DriverError, RecordedClaim};
use dra_sdk::config::ConfigRegistry;
use dra_sdk::driver::{Driver, PluginEvent, PreparedClaim};
use dra_sdk::health::{DeviceState, HealthStatus};
use dra_sdk::plugin::KubeletPlugin;
use dra_sdk_testing::apiserver::{Fault, Verb};
use dra_sdk_testing::assert_contains;
use dra_sdk_testing::claims::AllocatedClaim;
use dra_sdk_testing::cluster::{BOOT_ID, NODE_NAME, TestCluster};
use dra_sdk_testing::kubelet::{
    DraApi, HealthApi, KubeletSimulator, KubeletVersion, RegisteredPlugin,
};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::api::{DeleteParams, PostParams};

use dra_sdk_testing::sample_driver::{DRIVER, GpuConfig, prepare_gpus};

/// Records what the SDK asks of it, and checks the SDK's promise that one claim is never
/// handled twice at once.
#[derive(Default)]
struct TestDriver {
    prepares: AtomicUsize,
    unprepares: AtomicUsize,
    rollbacks: AtomicUsize,
    in_flight: Mutex<HashSet<String>>,
    overlaps: AtomicUsize,
    delay: Option<Duration>,
    reports_health: bool,
    events: Mutex<Vec<PluginEvent>>,
}

impl TestDriver {
    fn enter(&self, uid: &str) {
        if !self.in_flight.lock().unwrap().insert(uid.to_string()) {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn leave(&self, uid: &str) {
        self.in_flight.lock().unwrap().remove(uid);
    }
}

#[async_trait::async_trait]
impl Driver for TestDriver {
    type Config = GpuConfig;

    fn config_registry(&self) -> ConfigRegistry<GpuConfig> {
        ConfigRegistry::new().register::<GpuConfig>()
    }

    async fn prepare(&self, claim: &Claim<GpuConfig>) -> Result<PreparedClaim, DriverError> {
        if claim.claim.name == "panics" {
            panic!("simulated driver bug");
        }
        self.enter(&claim.claim.uid);
        self.prepares.fetch_add(1, Ordering::SeqCst);
        if let Some(delay) = self.delay {
            tokio::time::sleep(delay).await;
        }
        self.leave(&claim.claim.uid);
        Ok(prepare_gpus(claim).with_driver_state(serde_json::json!({ "note": "hello" })))
    }

    async fn unprepare(&self, recorded: &RecordedClaim) -> Result<(), DriverError> {
        let claim = &recorded.claim;
        self.enter(&claim.uid);
        self.unprepares.fetch_add(1, Ordering::SeqCst);
        if let Some(delay) = self.delay {
            tokio::time::sleep(delay).await;
        }
        if recorded.completed {
            assert_eq!(
                recorded.driver_state,
                Some(serde_json::json!({ "note": "hello" }))
            );
        }
        self.leave(&claim.uid);
        Ok(())
    }

    async fn rollback(&self, claim: &RecordedClaim) -> Result<(), DriverError> {
        assert!(
            !claim.completed,
            "only interrupted prepares are rolled back"
        );
        self.rollbacks.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn reports_health(&self) -> bool {
        self.reports_health
    }

    fn on_event(&self, event: &PluginEvent) {
        self.events.lock().unwrap().push(event.clone());
    }
}

struct Setup {
    cluster: TestCluster,
    driver: Arc<TestDriver>,
    plugin: KubeletPlugin,
    kubelet: RegisteredPlugin,
}

async fn setup_with(driver: TestDriver, version: KubeletVersion) -> Setup {
    let cluster = TestCluster::start().await.unwrap();
    let driver = Arc::new(driver);
    let plugin = cluster
        .plugin(Arc::clone(&driver), DRIVER)
        .health_resend_interval(Duration::from_millis(200))
        .start()
        .await
        .unwrap();
    let kubelet = cluster.register(&plugin, version).await.unwrap();
    Setup {
        cluster,
        driver,
        plugin,
        kubelet,
    }
}

async fn setup() -> Setup {
    setup_with(TestDriver::default(), KubeletVersion::V1_36).await
}

fn claim_ref(claim: &ResourceClaim) -> ClaimRef {
    ClaimRef {
        uid: claim.metadata.uid.clone().unwrap(),
        namespace: claim.metadata.namespace.clone().unwrap(),
        name: claim.metadata.name.clone().unwrap(),
    }
}

async fn gpu_claim(cluster: &TestCluster, name: &str, devices: &[&str]) -> ClaimRef {
    let mut builder = AllocatedClaim::new("default", name);
    for device in devices {
        builder = builder.device("gpu", DRIVER, NODE_NAME, device);
    }
    claim_ref(&builder.create(&cluster.client()).await.unwrap())
}

fn cdi_files(cluster: &TestCluster) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(cluster.cdi_root())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    files
}

#[tokio::test]
async fn registers_with_v1_kubelets_and_serves_prepare() {
    let s = setup().await;
    assert_eq!(s.kubelet.api, DraApi::V1);
    assert_eq!(s.kubelet.info.r#type, "DRAPlugin");
    assert_eq!(s.kubelet.info.name, DRIVER);
    assert_eq!(
        s.kubelet.info.endpoint,
        s.plugin.socket_paths().dra.display().to_string()
    );
    assert_eq!(
        s.kubelet.info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );
    assert!(!s.kubelet.health_advertised);
    let mut status = s.plugin.registration_status();
    tokio::time::timeout(
        Duration::from_secs(5),
        status.wait_for(|s| *s == RegistrationStatus::Registered),
    )
    .await
    .unwrap()
    .unwrap();
    // The same verdict reaches the driver, the one way background events do.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !s
        .driver
        .events
        .lock()
        .unwrap()
        .contains(&PluginEvent::Registered)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no Registered event"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let claim = gpu_claim(&s.cluster, "one", &["gpu-0"]).await;
    let result = s
        .kubelet
        .prepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    let devices = result[&claim.uid].as_ref().unwrap();
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].request_names, ["gpu"]);
    assert_eq!(devices[0].pool, NODE_NAME);
    assert_eq!(devices[0].device, "gpu-0");
    assert_eq!(devices[0].cdi_device_ids.len(), 1);
    assert!(
        devices[0].cdi_device_ids[0].starts_with("k8s.gpu.example.com/gpu="),
        "{:?}",
        devices[0].cdi_device_ids
    );
    assert!(devices[0].cdi_device_ids[0].contains(&claim.uid));
}

#[tokio::test]
async fn kubelet_1_32_uses_v1beta1() {
    let s = setup_with(TestDriver::default(), KubeletVersion::V1_32).await;
    assert_eq!(s.kubelet.api, DraApi::V1beta1);
    let claim = gpu_claim(&s.cluster, "beta", &["gpu-1"]).await;
    let result = s
        .kubelet
        .prepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(result[&claim.uid].as_ref().unwrap()[0].device, "gpu-1");
    let result = s
        .kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(result[&claim.uid], Ok(()));
}

#[tokio::test]
async fn prepare_and_unprepare_round_trip_writes_and_removes_the_cdi_spec() {
    let s = setup().await;
    let claim = gpu_claim(&s.cluster, "pair", &["gpu-0", "gpu-1"]).await;
    let result = s
        .kubelet
        .prepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    let devices = result[&claim.uid].as_ref().unwrap();
    assert_eq!(devices.len(), 2);

    let files = cdi_files(&s.cluster);
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].contains(&claim.uid), "{files:?}");
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(s.cluster.cdi_root().join(&files[0])).unwrap())
            .unwrap();
    assert_eq!(spec["kind"], "k8s.gpu.example.com/gpu");
    let names: Vec<String> = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect();
    for device in devices {
        let name = device.cdi_device_ids[0].split('=').nth(1).unwrap();
        assert!(names.iter().any(|n| n == name), "{name} not in {names:?}");
    }
    assert!(
        spec["containerEdits"]["env"]
            .to_string()
            .contains("DRIVER=gpu.example.com")
    );

    let result = s
        .kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(result[&claim.uid], Ok(()));
    assert!(cdi_files(&s.cluster).is_empty());
    assert_eq!(s.driver.unprepares.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn prepare_is_idempotent_and_does_not_call_the_driver_twice() {
    let s = setup().await;
    let claim = gpu_claim(&s.cluster, "idem", &["gpu-2"]).await;
    let first = s
        .kubelet
        .prepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    let second = s
        .kubelet
        .prepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(first, second);
    assert_eq!(s.driver.prepares.load(Ordering::SeqCst), 1);
    // The second answer comes from the checkpoint: not even the API server is asked.
    s.cluster.api().faults().fail_next(10, 500);
    let third = s
        .kubelet
        .prepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(first, third);
}

#[tokio::test]
async fn a_batch_with_bad_claims_fails_only_those_claims() {
    let s = setup().await;
    let client = s.cluster.client();
    let good = gpu_claim(&s.cluster, "good", &["gpu-0"]).await;

    let missing = ClaimRef {
        uid: "00000000-dead-beef-0000-000000000000".into(),
        namespace: "default".into(),
        name: "missing".into(),
    };

    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let mut unallocated = AllocatedClaim::new("default", "unallocated").build();
    unallocated.status = None;
    let unallocated = claim_ref(
        &api.create(&PostParams::default(), &unallocated)
            .await
            .unwrap(),
    );

    let mut replaced = gpu_claim(&s.cluster, "replaced", &["gpu-3"]).await;
    replaced.uid = "11111111-0000-0000-0000-000000000000".into();

    let config = |name: &str, parameters: serde_json::Value| {
        let client = client.clone();
        let name = name.to_string();
        async move {
            claim_ref(
                &AllocatedClaim::new("default", &name)
                    .device("gpu", DRIVER, NODE_NAME, "gpu-4")
                    .claim_config(&["gpu"], DRIVER, parameters)
                    .create(&client)
                    .await
                    .unwrap(),
            )
        }
    };
    let unknown_field = config(
        "unknown-field",
        serde_json::json!({"apiVersion": "gpu.example.com/v1", "kind": "GpuConfig", "sharin": "x"}),
    )
    .await;
    let unknown_kind = config(
        "unknown-kind",
        serde_json::json!({"apiVersion": "gpu.example.com/v1", "kind": "MigConfig"}),
    )
    .await;
    let malformed = config("malformed", serde_json::json!(["not", "an", "object"])).await;
    let wrong_type = config(
        "wrong-type",
        serde_json::json!({"apiVersion": "gpu.example.com/v1", "kind": "GpuConfig", "sharing": 7}),
    )
    .await;
    let other_driver = claim_ref(
        &AllocatedClaim::new("default", "other-driver-config")
            .device("gpu", DRIVER, NODE_NAME, "gpu-5")
            .claim_config(
                &[],
                "other.example.com",
                serde_json::json!({"anything": true}),
            )
            .create(&client)
            .await
            .unwrap(),
    );

    let batch = [
        good.clone(),
        missing.clone(),
        unallocated.clone(),
        replaced.clone(),
        unknown_field.clone(),
        unknown_kind.clone(),
        malformed.clone(),
        wrong_type.clone(),
        other_driver.clone(),
    ];
    let result = s.kubelet.prepare(&batch).await.unwrap();
    assert_eq!(result.len(), batch.len());
    assert!(result[&good.uid].is_ok());
    assert!(
        result[&other_driver.uid].is_ok(),
        "configs of other drivers are ignored"
    );
    let error = |claim: &ClaimRef| result[&claim.uid].clone().unwrap_err();
    assert_contains(error(&missing), "default/missing not found");
    assert_contains(error(&unallocated), "not allocated");
    assert_contains(error(&replaced), "was replaced");
    assert_contains(error(&unknown_field), "sharin");
    assert_contains(error(&unknown_kind), "MigConfig");
    assert_contains(error(&malformed), "opaque config #0");
    assert_contains(error(&wrong_type), "sharing");
    // Only the two good claims reached the driver; failed ones left no spec behind.
    assert_eq!(s.driver.prepares.load(Ordering::SeqCst), 2);
    assert_eq!(cdi_files(&s.cluster).len(), 2);
}

#[tokio::test]
async fn claims_that_fail_before_the_driver_leave_no_checkpoint_record() {
    // The intent is recorded while claims are read; a claim that then fails to read is
    // removed again, unless an earlier attempt had recorded it (that attempt's driver call
    // may have left work for a rollback).
    let s = setup().await;
    let good = gpu_claim(&s.cluster, "good", &["gpu-0"]).await;
    let missing = |uid: &str, name: &str| ClaimRef {
        uid: uid.into(),
        namespace: "default".into(),
        name: name.into(),
    };
    let never_seen = missing("00000000-0000-0000-0000-00000000000a", "never-seen");
    let tried_before = missing("00000000-0000-0000-0000-00000000000b", "tried-before");
    let data_dir = s.cluster.plugins_dir().join(DRIVER);
    let (checkpoint, _) = Checkpoint::open(&data_dir, BOOT_ID).unwrap();
    checkpoint
        .update([ClaimChange::Put {
            uid: tried_before.uid.clone(),
            record: ClaimRecord::started("default", "tried-before"),
        }])
        .unwrap();

    let batch = [good.clone(), never_seen.clone(), tried_before.clone()];
    let result = s.kubelet.prepare(&batch).await.unwrap();
    assert!(result[&good.uid].is_ok());
    assert!(result[&never_seen.uid].is_err());
    assert!(result[&tried_before.uid].is_err());
    let records = checkpoint.records().unwrap();
    assert!(records[&good.uid].is_completed());
    assert!(!records.contains_key(&never_seen.uid), "{records:?}");
    assert_eq!(records[&tried_before.uid].state, ClaimState::PrepareStarted);

    // A batch in which nothing reaches the driver.
    let alone = missing("00000000-0000-0000-0000-00000000000c", "alone");
    let result = s
        .kubelet
        .prepare(std::slice::from_ref(&alone))
        .await
        .unwrap();
    assert!(result[&alone.uid].is_err());
    assert!(!checkpoint.records().unwrap().contains_key(&alone.uid));
    assert_eq!(s.driver.prepares.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_panic_fails_only_its_claim() {
    let s = setup().await;
    let good = gpu_claim(&s.cluster, "good", &["gpu-0"]).await;
    let panics = gpu_claim(&s.cluster, "panics", &["gpu-1"]).await;

    let results = s
        .kubelet
        .prepare(&[good.clone(), panics.clone()])
        .await
        .unwrap();
    assert!(results[&good.uid].is_ok(), "{results:?}");
    let error = results[&panics.uid].as_ref().unwrap_err();
    assert_contains(error, "the driver panicked: simulated driver bug");

    // The plugin keeps serving, the good claim is checkpointed (answered without the
    // driver), and the panicked one unprepares cleanly.
    let prepares = s.driver.prepares.load(Ordering::SeqCst);
    let again = s
        .kubelet
        .prepare(std::slice::from_ref(&good))
        .await
        .unwrap();
    assert!(again[&good.uid].is_ok());
    assert_eq!(s.driver.prepares.load(Ordering::SeqCst), prepares);
    let unprepared = s.kubelet.unprepare(&[good, panics]).await.unwrap();
    assert!(unprepared.values().all(Result::is_ok), "{unprepared:?}");
}

#[tokio::test]
async fn claim_reads_retry_transient_api_errors() {
    let s = setup().await;
    let claim = gpu_claim(&s.cluster, "flaky", &["gpu-0"]).await;
    s.cluster.api().faults().inject(
        Fault::status(503)
            .verb(Verb::Get)
            .resource("resourceclaims")
            .times(2),
    );
    let result = s
        .kubelet
        .prepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(result[&claim.uid].is_ok(), "{:?}", result[&claim.uid]);
}

#[tokio::test]
async fn unprepare_needs_no_api_server_and_accepts_unknown_claims() {
    let s = setup().await;
    let claim = gpu_claim(&s.cluster, "gone", &["gpu-0"]).await;
    s.kubelet
        .prepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    let api: Api<ResourceClaim> = Api::namespaced(s.cluster.client(), "default");
    api.delete("gone", &DeleteParams::default()).await.unwrap();
    let unknown = ClaimRef {
        uid: "22222222-0000-0000-0000-000000000000".into(),
        namespace: "default".into(),
        name: "never-seen".into(),
    };
    // The API server is down for the whole call.
    s.cluster.api().faults().fail_next(100, 500);
    let result = s
        .kubelet
        .unprepare(&[claim.clone(), unknown.clone()])
        .await
        .unwrap();
    assert_eq!(result[&claim.uid], Ok(()));
    assert_eq!(result[&unknown.uid], Ok(()));
    assert_eq!(
        s.driver.unprepares.load(Ordering::SeqCst),
        1,
        "unknown claims do not reach the driver"
    );
    // And again: idempotent.
    let result = s
        .kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert_eq!(result[&claim.uid], Ok(()));
    assert_eq!(s.driver.unprepares.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn concurrent_prepare_and_unprepare_of_one_claim_are_serialized() {
    let driver = TestDriver {
        delay: Some(Duration::from_millis(5)),
        ..TestDriver::default()
    };
    let s = setup_with(driver, KubeletVersion::V1_36).await;
    let claim = gpu_claim(&s.cluster, "racy", &["gpu-0"]).await;
    let other = gpu_claim(&s.cluster, "bystander", &["gpu-1"]).await;
    let mut calls = Vec::new();
    for i in 0..20 {
        let kubelet = s.kubelet.clone();
        let claims = if i % 3 == 0 {
            vec![claim.clone(), other.clone()]
        } else {
            vec![claim.clone()]
        };
        calls.push(tokio::spawn(async move {
            if i % 2 == 0 {
                kubelet.prepare(&claims).await.map(|r| r.len())
            } else {
                kubelet.unprepare(&claims).await.map(|r| r.len())
            }
        }));
    }
    for call in calls {
        call.await.unwrap().unwrap();
    }
    assert_eq!(s.driver.overlaps.load(Ordering::SeqCst), 0);
    // Whatever the interleaving, a final unprepare leaves nothing behind.
    s.kubelet
        .unprepare(&[claim.clone(), other.clone()])
        .await
        .unwrap();
    assert!(cdi_files(&s.cluster).is_empty());
}

#[tokio::test]
async fn restart_serves_completed_claims_and_rolls_back_interrupted_ones() {
    let cluster = TestCluster::start().await.unwrap();
    let first = Arc::new(TestDriver::default());
    let plugin = cluster
        .plugin(Arc::clone(&first), DRIVER)
        .start()
        .await
        .unwrap();
    let kubelet = cluster
        .register(&plugin, KubeletVersion::V1_36)
        .await
        .unwrap();
    let done = gpu_claim(&cluster, "done", &["gpu-0"]).await;
    let before = kubelet.prepare(std::slice::from_ref(&done)).await.unwrap();
    plugin.shutdown().await.unwrap();

    // A prepare that was interrupted by a crash, and a spec file nobody knows about.
    let data_dir = cluster.plugins_dir().join(DRIVER);
    {
        let (checkpoint, _) = Checkpoint::open(&data_dir, BOOT_ID).unwrap();
        checkpoint
            .update([ClaimChange::Put {
                uid: "33333333-0000-0000-0000-000000000000".into(),
                record: ClaimRecord::started("default", "half"),
            }])
            .unwrap();
    }
    let orphan = cluster
        .cdi_root()
        .join("k8s.gpu.example.com-gpu_44444444-0000-0000-0000-000000000000.json");
    std::fs::write(
        &orphan,
        br#"{"cdiVersion":"0.5.0","kind":"k8s.gpu.example.com/gpu","devices":[]}"#,
    )
    .unwrap();
    let unrelated = cluster.cdi_root().join("vendor.com-other.json");
    std::fs::write(&unrelated, b"{}").unwrap();

    let second = Arc::new(TestDriver::default());
    let plugin = cluster
        .plugin(Arc::clone(&second), DRIVER)
        .start()
        .await
        .unwrap();
    assert_eq!(second.rollbacks.load(Ordering::SeqCst), 1);
    let kubelet = cluster
        .register(&plugin, KubeletVersion::V1_36)
        .await
        .unwrap();
    let after = kubelet.prepare(std::slice::from_ref(&done)).await.unwrap();
    assert_eq!(before, after);
    assert_eq!(
        second.prepares.load(Ordering::SeqCst),
        0,
        "served from the checkpoint"
    );
    assert!(unrelated.exists(), "other vendors' specs are never touched");
    let files = cdi_files(&cluster);
    assert!(files.iter().all(|f| !f.contains("44444444")), "{files:?}");
    plugin.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_corrupt_checkpoint_is_moved_aside_and_reported() {
    let cluster = TestCluster::start().await.unwrap();
    let data_dir = cluster.plugins_dir().join(DRIVER);
    std::fs::create_dir_all(&data_dir).unwrap();
    std::fs::write(data_dir.join("checkpoint.json"), b"{ this is not json").unwrap();
    let driver = Arc::new(TestDriver::default());
    let plugin = cluster
        .plugin(Arc::clone(&driver), DRIVER)
        .start()
        .await
        .unwrap();
    let events = driver.events.lock().unwrap().clone();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, PluginEvent::CheckpointCorrupt { moved_to } if moved_to.exists())),
        "{events:?}"
    );
    let kubelet = cluster
        .register(&plugin, KubeletVersion::V1_36)
        .await
        .unwrap();
    let claim = gpu_claim(&cluster, "after-corruption", &["gpu-0"]).await;
    assert!(kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap()[&claim.uid].is_ok());
    plugin.shutdown().await.unwrap();
}

#[tokio::test]
async fn rolling_update_runs_two_instances_side_by_side() {
    let cluster = TestCluster::start().await.unwrap();
    let old = cluster
        .plugin(Arc::new(TestDriver::default()), DRIVER)
        .pod_uid("aaaaaaaa-0000-0000-0000-000000000001")
        .start()
        .await
        .unwrap();
    let new = cluster
        .plugin(Arc::new(TestDriver::default()), DRIVER)
        .pod_uid("bbbbbbbb-0000-0000-0000-000000000002")
        .start()
        .await
        .unwrap();
    assert_ne!(
        old.socket_paths().registration,
        new.socket_paths().registration
    );
    assert_ne!(old.socket_paths().dra, new.socket_paths().dra);
    let found = KubeletSimulator::discover(&cluster.registrar_dir()).unwrap();
    assert_eq!(found.len(), 2);

    // A claim prepared by the old instance is unprepared by the new one.
    let old_kubelet = cluster.register(&old, KubeletVersion::V1_36).await.unwrap();
    let new_kubelet = cluster.register(&new, KubeletVersion::V1_36).await.unwrap();
    let claim = gpu_claim(&cluster, "handover", &["gpu-0"]).await;
    old_kubelet
        .prepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    old.shutdown().await.unwrap();
    assert_eq!(
        new_kubelet
            .unprepare(std::slice::from_ref(&claim))
            .await
            .unwrap()[&claim.uid],
        Ok(())
    );
    assert!(cdi_files(&cluster).is_empty());
    assert_eq!(
        KubeletSimulator::discover(&cluster.registrar_dir())
            .unwrap()
            .len(),
        1
    );
    new.shutdown().await.unwrap();
}

#[tokio::test]
async fn long_driver_names_get_hashed_socket_names_under_108_bytes() {
    let cluster = TestCluster::start().await.unwrap();
    let driver_name = "a-very-long-driver-name-for-testing.accelerators.example.com";
    let plugin = cluster
        .plugin(Arc::new(TestDriver::default()), driver_name)
        .pod_uid("cccccccc-0000-0000-0000-000000000003")
        .cdi_kind("example.com/accel".parse().unwrap())
        .start()
        .await
        .unwrap();
    for path in [
        &plugin.socket_paths().registration,
        &plugin.socket_paths().dra,
    ] {
        assert!(path.as_os_str().len() < 108, "{}", path.display());
    }
    let kubelet = cluster
        .register(&plugin, KubeletVersion::V1_36)
        .await
        .unwrap();
    assert_eq!(kubelet.info.name, driver_name);
    plugin.shutdown().await.unwrap();
}

#[tokio::test]
async fn health_is_streamed_and_resent_when_the_driver_reports_it() {
    let driver = TestDriver {
        reports_health: true,
        ..TestDriver::default()
    };
    let s = setup_with(driver, KubeletVersion::V1_36).await;
    let context = s.plugin.context();
    context.set_device_state(DeviceState::healthy(NODE_NAME, "gpu-0"));
    assert!(s.kubelet.health_advertised);
    assert!(
        s.kubelet
            .info
            .supported_versions
            .contains(&"v1alpha1.DRAResourceHealth".to_string())
    );
    assert_eq!(s.kubelet.health_api, Some(HealthApi::V1alpha1));
    let mut watch = s.kubelet.watch_health().await.unwrap();
    let first = watch.next().await.unwrap().unwrap();
    assert_eq!(first[0].status, HealthStatus::Healthy);
    context.set_device_state(DeviceState::unhealthy(NODE_NAME, "gpu-0", "XID 79"));
    let second = watch.next().await.unwrap().unwrap();
    assert_eq!(second[0].status, HealthStatus::Unhealthy);
    assert_eq!(second[0].message, "XID 79");
    // Nothing changes, yet the list comes again before the kubelet's staleness timeout.
    let resent = tokio::time::timeout(Duration::from_secs(2), watch.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(resent, second);
}

/// Kubelet 1.37 takes `v1.DRAResourceHealth`; kubelets 1.34-1.36 know only v1alpha1. A
/// plugin lists both (v1 first) and serves the same device states on both, over its socket.
#[tokio::test]
async fn health_reaches_a_1_37_kubelet_over_v1_and_an_older_one_over_v1alpha1() {
    let driver = TestDriver {
        reports_health: true,
        ..TestDriver::default()
    };
    let s = setup_with(driver, KubeletVersion::V1_37).await;
    let versions = &s.kubelet.info.supported_versions;
    let position = |name: &str| versions.iter().position(|v| v == name);
    let v1 = position("v1.DRAResourceHealth").expect("v1 health listed");
    let v1alpha1 = position("v1alpha1.DRAResourceHealth").expect("v1alpha1 health listed");
    assert!(v1 < v1alpha1, "{versions:?}");
    assert_eq!(s.kubelet.health_api, Some(HealthApi::V1));
    let older = s
        .cluster
        .register(&s.plugin, KubeletVersion::V1_36)
        .await
        .unwrap();
    assert_eq!(older.health_api, Some(HealthApi::V1alpha1));

    let context = s.plugin.context();
    context.set_device_state(
        DeviceState::unhealthy(NODE_NAME, "gpu-0", "XID 79").with_timeout(Duration::from_secs(45)),
    );
    let mut new_kubelet = s.kubelet.watch_health().await.unwrap();
    let mut old_kubelet = older.watch_health().await.unwrap();
    assert_eq!(new_kubelet.api(), HealthApi::V1);
    assert_eq!(old_kubelet.api(), HealthApi::V1alpha1);
    let over_v1 = new_kubelet.next().await.unwrap().unwrap();
    let over_v1alpha1 = old_kubelet.next().await.unwrap().unwrap();
    assert_eq!(over_v1[0].status, HealthStatus::Unhealthy);
    assert_eq!(over_v1[0].message, "XID 79");
    assert_eq!(over_v1[0].timeout_seconds, 45);
    assert_eq!(over_v1, over_v1alpha1);

    // A change reaches both.
    context.set_device_state(DeviceState::healthy(NODE_NAME, "gpu-0"));
    let over_v1 = new_kubelet.next().await.unwrap().unwrap();
    let over_v1alpha1 = old_kubelet.next().await.unwrap().unwrap();
    assert_eq!(over_v1[0].status, HealthStatus::Healthy);
    assert_eq!(over_v1, over_v1alpha1);
    s.plugin.shutdown().await.unwrap();
}

/// A 1.37 kubelet opens no health stream for a plugin that lists no health service.
#[tokio::test]
async fn a_1_37_kubelet_picks_no_health_service_for_a_driver_without_health() {
    let s = setup_with(TestDriver::default(), KubeletVersion::V1_37).await;
    assert_eq!(s.kubelet.health_api, None);
    assert!(!s.kubelet.health_advertised);
    assert!(
        !s.kubelet
            .info
            .supported_versions
            .iter()
            .any(|v| v.ends_with(".DRAResourceHealth"))
    );
    s.plugin.shutdown().await.unwrap();
}

/// Kubelet 1.36 opens the health stream of every plugin, listed or not, and retries every 5 s
/// after an error: a driver without health is not advertised, and its stream stays open and
/// quiet.
#[tokio::test]
async fn without_health_the_service_is_not_advertised_and_its_stream_stays_quiet() {
    let s = setup().await;
    assert!(!s.kubelet.health_advertised);
    let mut watch = s.kubelet.watch_health().await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), watch.next())
            .await
            .is_err(),
        "nothing is sent and the stream does not end"
    );
}

#[tokio::test]
async fn healthz_and_metrics_are_served_over_http() {
    let cluster = TestCluster::start().await.unwrap();
    let plugin = cluster
        .plugin(Arc::new(TestDriver::default()), DRIVER)
        .http_endpoint("127.0.0.1:0".parse().unwrap())
        .start()
        .await
        .unwrap();
    let kubelet = cluster
        .register(&plugin, KubeletVersion::V1_36)
        .await
        .unwrap();
    let claim = gpu_claim(&cluster, "metered", &["gpu-0"]).await;
    kubelet.prepare(&[claim]).await.unwrap();
    let addr = plugin.http_addr().unwrap();
    let (status, body) = http_get(addr, "/healthz").await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200);
    assert_contains(
        &body,
        "dra_prepare_claims_total{driver=\"gpu.example.com\"} 1",
    );
    assert_contains(&body, "dra_prepared_claims{driver=\"gpu.example.com\"} 1");
    assert_contains(&body, "dra_prepare_claim_duration_seconds_bucket");
    plugin.shutdown().await.unwrap();
}

#[tokio::test]
async fn metrics_are_served_at_the_chosen_path_and_bad_paths_fail_the_start() {
    let cluster = TestCluster::start().await.unwrap();
    let plugin = cluster
        .plugin(Arc::new(TestDriver::default()), DRIVER)
        .http_endpoint("127.0.0.1:0".parse().unwrap())
        .metrics_path("/custom/metrics")
        .start()
        .await
        .unwrap();
    let addr = plugin.http_addr().unwrap();
    let (status, body) = http_get(addr, "/custom/metrics").await;
    assert_eq!(status, 200);
    assert_contains(&body, "dra_prepared_claims");
    assert_eq!(http_get(addr, "/metrics").await.0, 404);
    assert_eq!(http_get(addr, "/healthz").await.0, 200);
    plugin.shutdown().await.unwrap();

    for bad in ["metrics", "/healthz", "/{id}"] {
        let error = cluster
            .plugin(Arc::new(TestDriver::default()), DRIVER)
            .http_endpoint("127.0.0.1:0".parse().unwrap())
            .metrics_path(bad)
            .start()
            .await
            .err()
            .unwrap_or_else(|| panic!("{bad:?} was accepted"));
        assert!(
            matches!(error, dra_sdk::plugin::PluginError::InvalidSetting(ref m) if m.contains("metrics path")),
            "{bad:?}: {error}"
        );
    }
}

#[tokio::test]
async fn shutdown_removes_both_sockets() {
    let s = setup().await;
    let paths = s.plugin.socket_paths().clone();
    assert!(paths.registration.exists() && paths.dra.exists());
    s.plugin.shutdown().await.unwrap();
    assert!(!paths.registration.exists());
    assert!(!paths.dra.exists());
}

/// A start that fails on its last steps (here the HTTP port is taken) must not leave the
/// sockets served, or the kubelet would register a plugin that is not running.
#[tokio::test]
async fn a_start_that_fails_late_leaves_no_socket_served() {
    let cluster = TestCluster::start().await.unwrap();
    let plugin = cluster
        .plugin(Arc::new(TestDriver::default()), DRIVER)
        .start()
        .await
        .unwrap();
    let paths = plugin.socket_paths().clone();
    plugin.shutdown().await.unwrap();

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let error = cluster
        .plugin(Arc::new(TestDriver::default()), DRIVER)
        .http_endpoint(taken.local_addr().unwrap())
        .start()
        .await
        .expect_err("the HTTP port is taken");
    assert!(
        error.to_string().contains("binding the HTTP endpoint"),
        "{error}"
    );
    assert!(!paths.registration.exists(), "registration socket left");
    assert!(!paths.dra.exists(), "DRA socket left");

    // The same plugin starts once the port is free.
    drop(taken);
    let plugin = cluster
        .plugin(Arc::new(TestDriver::default()), DRIVER)
        .start()
        .await
        .unwrap();
    assert!(paths.registration.exists() && paths.dra.exists());
    plugin.shutdown().await.unwrap();
}

/// A minimal HTTP/1.1 GET, to keep an HTTP client library out of the dependencies.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    (status, body)
}
