//! A kubelet misbehaving at the socket: the same claim prepared from two connections at once,
//! an unprepare of a claim never prepared, a claim deleted from the API server before or while
//! it is prepared, health streams opened and dropped in a loop. Each must be answered
//! correctly and leave no task or file descriptor behind.
//!
//! Leaks are measured with the test kit's [`LeakProbe`]: tokio tasks of the test's own runtime
//! (each `#[tokio::test]` has one, and the plugin, the fake API server and the simulated
//! kubelet all run on it), and only the file descriptors that point into the test cluster's
//! directory (the plugin's sockets with the server end of each connection, its CDI specs,
//! checkpoint and lock files): the harness runs other tests in this process at the same time,
//! whose descriptors come and go. The baseline is taken once the set-up settled (after a
//! warm-up batch: the API client's pooled connections exist), and every
//! test ends by waiting (at most 10 s; it takes milliseconds) for both counts to be back.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dra_sdk::claim::{Claim, ClaimRef, DriverError, RecordedClaim};
use dra_sdk::config::ConfigRegistry;
use dra_sdk::driver::{Driver, PreparedClaim};
use dra_sdk::health::{DeviceState, HealthStatus};
use dra_sdk::plugin::KubeletPlugin;
use dra_sdk_testing::assert_contains;
use dra_sdk_testing::claims::AllocatedClaim;
use dra_sdk_testing::cluster::{NODE_NAME, TestCluster, claim_ref};
use dra_sdk_testing::faults::leaks::{LeakProbe, Sample};
use dra_sdk_testing::kubelet::{HealthApi, KubeletVersion, RegisteredPlugin};
use dra_sdk_testing::sample_driver::{DRIVER, GpuConfig, prepare_gpus};
use k8s_openapi::api::resource::v1::ResourceClaim;

/// How long the counts get to return to the baseline.
const SETTLE: Duration = Duration::from_secs(10);

/// The sample GPU driver, counting its calls, optionally slow, optionally reporting health.
#[derive(Default)]
struct CountingDriver {
    prepares: AtomicUsize,
    unprepares: AtomicUsize,
    delay: Option<Duration>,
    health: bool,
}

#[async_trait::async_trait]
impl Driver for CountingDriver {
    type Config = GpuConfig;

    fn config_registry(&self) -> ConfigRegistry<GpuConfig> {
        ConfigRegistry::new().register::<GpuConfig>()
    }

    async fn prepare(&self, claim: &Claim<GpuConfig>) -> Result<PreparedClaim, DriverError> {
        self.prepares.fetch_add(1, Ordering::SeqCst);
        if let Some(delay) = self.delay {
            tokio::time::sleep(delay).await;
        }
        Ok(prepare_gpus(claim))
    }

    async fn unprepare(&self, _: &RecordedClaim) -> Result<(), DriverError> {
        self.unprepares.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn reports_health(&self) -> bool {
        self.health
    }

    async fn start(&self, ctx: &dra_sdk::context::DriverContext) -> Result<(), DriverError> {
        if self.health {
            ctx.set_device_states([DeviceState::new(NODE_NAME, "gpu-0", HealthStatus::Healthy)]);
        }
        Ok(())
    }
}

struct Setup {
    cluster: TestCluster,
    driver: Arc<CountingDriver>,
    plugin: KubeletPlugin,
    kubelet: RegisteredPlugin,
    probe: LeakProbe,
    baseline: Sample,
}

impl Setup {
    async fn start(driver: CountingDriver, version: KubeletVersion) -> Self {
        let cluster = TestCluster::start().await.unwrap();
        let driver = Arc::new(driver);
        // Health is re-sent once a minute, far beyond the settle time: a stream's task that
        // noticed the kubelet's leaving only at its next send would be seen as left behind.
        let plugin = cluster
            .plugin(Arc::clone(&driver), DRIVER)
            .health_resend_interval(Duration::from_secs(60))
            .start()
            .await
            .unwrap();
        let kubelet = cluster.register(&plugin, version).await.unwrap();
        let probe = LeakProbe::current().scoped_to(cluster.path());
        let mut setup = Self {
            cluster,
            driver,
            plugin,
            kubelet,
            probe,
            baseline: Sample {
                fds: 0,
                rss_kib: 0,
                tasks: None,
            },
        };
        setup.warm_up().await;
        setup.baseline = setup.probe.steady().await.unwrap();
        setup
    }

    /// Prepares and unprepares three claims in one batch before the baseline is taken: the
    /// plugin's API client keeps up to one pooled connection (a task, and a TCP socket) per
    /// concurrent read, which no test here exceeds, and the checkpoint and lock files exist.
    async fn warm_up(&self) {
        let mut claims = Vec::new();
        for index in 0..3 {
            claims.push(self.claim(&format!("warm-up-{index}"), "gpu-0").await);
        }
        let answer = self.kubelet.prepare(&claims).await.unwrap();
        assert!(answer.values().all(Result::is_ok), "{answer:?}");
        let answer = self.kubelet.unprepare(&claims).await.unwrap();
        assert!(answer.values().all(Result::is_ok), "{answer:?}");
        self.driver.prepares.store(0, Ordering::SeqCst);
        self.driver.unprepares.store(0, Ordering::SeqCst);
    }

    async fn claim(&self, name: &str, device: &str) -> ClaimRef {
        let claim = AllocatedClaim::new("default", name)
            .device("gpu", DRIVER, NODE_NAME, device)
            .create(&self.cluster.client())
            .await
            .unwrap();
        claim_ref(&claim).unwrap()
    }

    fn checkpoint(&self) -> String {
        std::fs::read_to_string(
            self.cluster
                .plugins_dir()
                .join(DRIVER)
                .join("checkpoint.json"),
        )
        .unwrap_or_default()
    }

    /// Waits for tasks and descriptors to be back at the baseline, then stops the plugin.
    async fn finish(self) {
        if let Err(error) = self.probe.settled(&self.baseline, SETTLE).await {
            panic!(
                "{error}; descriptors now: {:?}",
                self.probe.describe_fds().unwrap_or_default()
            );
        }
        self.plugin.shutdown().await.unwrap();
    }
}

/// The CDI spec files naming `uid`.
fn specs_of(cdi_root: &Path, uid: &str) -> Vec<String> {
    let mut specs: Vec<String> = std::fs::read_dir(cdi_root)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|entry| entry.file_name().into_string().ok())
                .filter(|name| name.contains(uid))
                .collect()
        })
        .unwrap_or_default();
    specs.sort();
    specs
}

#[tokio::test]
async fn the_same_claim_prepared_from_two_connections_at_once_is_prepared_once_with_one_spec() {
    // Slow enough that the two calls overlap in the plugin.
    let driver = CountingDriver {
        delay: Some(Duration::from_millis(300)),
        ..CountingDriver::default()
    };
    let setup = Setup::start(driver, KubeletVersion::V1_36).await;
    let claim = setup.claim("twice", "gpu-0").await;
    let second = setup.kubelet.connect_again().await.unwrap();

    let claims = std::slice::from_ref(&claim);
    let (first_answer, second_answer) =
        tokio::join!(setup.kubelet.prepare(claims), second.prepare(claims));
    let (first_answer, second_answer) = (first_answer.unwrap(), second_answer.unwrap());
    let devices = first_answer[&claim.uid].as_ref().unwrap();
    assert_eq!(devices.len(), 1);
    assert_eq!(
        first_answer, second_answer,
        "both connections get the same answer"
    );
    assert_eq!(setup.driver.prepares.load(Ordering::SeqCst), 1);
    assert_eq!(specs_of(&setup.cluster.cdi_root(), &claim.uid).len(), 1);

    // Unprepared from both at once too: one driver call, no spec, both answers success.
    let (first_answer, second_answer) =
        tokio::join!(setup.kubelet.unprepare(claims), second.unprepare(claims));
    assert!(first_answer.unwrap()[&claim.uid].is_ok());
    assert!(second_answer.unwrap()[&claim.uid].is_ok());
    assert_eq!(setup.driver.unprepares.load(Ordering::SeqCst), 1);
    assert!(specs_of(&setup.cluster.cdi_root(), &claim.uid).is_empty());
    assert!(!setup.checkpoint().contains(&claim.uid));

    drop(second);
    setup.finish().await;
}

#[tokio::test]
async fn unprepare_of_a_claim_never_prepared_succeeds_and_touches_nothing() {
    let setup = Setup::start(CountingDriver::default(), KubeletVersion::V1_36).await;
    // Another claim is prepared, so that there is a checkpoint and a spec to leave alone.
    let prepared = setup.claim("prepared", "gpu-0").await;
    let answer = setup
        .kubelet
        .prepare(std::slice::from_ref(&prepared))
        .await
        .unwrap();
    assert!(answer[&prepared.uid].is_ok());
    // One claim that exists but was never prepared, one the API server never heard of.
    let existing = setup.claim("never-prepared", "gpu-1").await;
    let unknown = ClaimRef {
        uid: "5f0c2a61-0000-4000-8000-000000000000".into(),
        namespace: "default".into(),
        name: "unknown".into(),
    };

    let checkpoint_path = setup
        .cluster
        .plugins_dir()
        .join(DRIVER)
        .join("checkpoint.json");
    let checkpoint_before = std::fs::read(&checkpoint_path).unwrap();
    let modified_before = std::fs::metadata(&checkpoint_path)
        .unwrap()
        .modified()
        .unwrap();
    let cdi_before = specs_of(&setup.cluster.cdi_root(), "");
    setup.cluster.api().reset_stats();

    let answer = setup
        .kubelet
        .unprepare(&[existing.clone(), unknown.clone()])
        .await
        .unwrap();
    assert!(answer[&existing.uid].is_ok(), "{answer:?}");
    assert!(answer[&unknown.uid].is_ok(), "{answer:?}");

    assert_eq!(setup.driver.unprepares.load(Ordering::SeqCst), 0);
    assert_eq!(std::fs::read(&checkpoint_path).unwrap(), checkpoint_before);
    assert_eq!(
        std::fs::metadata(&checkpoint_path)
            .unwrap()
            .modified()
            .unwrap(),
        modified_before,
        "the checkpoint is not rewritten"
    );
    assert_eq!(specs_of(&setup.cluster.cdi_root(), ""), cdi_before);
    assert_eq!(
        setup
            .cluster
            .api()
            .stats()
            .resource("resourceclaims")
            .total(),
        0,
        "an unprepare reads nothing from the API server"
    );
    // The prepared claim is untouched: its unprepare still finds its record.
    let answer = setup
        .kubelet
        .unprepare(std::slice::from_ref(&prepared))
        .await
        .unwrap();
    assert!(answer[&prepared.uid].is_ok());
    assert_eq!(setup.driver.unprepares.load(Ordering::SeqCst), 1);
    setup.finish().await;
}

#[tokio::test]
async fn a_claim_deleted_before_prepare_fails_alone_naming_the_claim_and_leaves_no_record_or_spec()
{
    let setup = Setup::start(CountingDriver::default(), KubeletVersion::V1_36).await;
    let kept = setup.claim("kept", "gpu-0").await;
    let deleted = setup.claim("deleted", "gpu-1").await;
    let replaced = setup.claim("replaced", "gpu-2").await;
    // Deleted after allocation, before the kubelet's call; one name re-created at once (another
    // UID), as a controller re-creating a pod's claim would.
    let api = setup.cluster.api();
    api.delete::<ResourceClaim>(Some("default"), "deleted")
        .unwrap();
    api.delete::<ResourceClaim>(Some("default"), "replaced")
        .unwrap();
    let recreated = setup.claim("replaced", "gpu-3").await;
    assert_ne!(recreated.uid, replaced.uid);

    let answer = setup
        .kubelet
        .prepare(&[kept.clone(), deleted.clone(), replaced.clone()])
        .await
        .unwrap();
    assert!(answer[&kept.uid].is_ok(), "{answer:?}");
    let error = answer[&deleted.uid].as_ref().unwrap_err();
    assert_contains(error, "ResourceClaim default/deleted not found");
    let error = answer[&replaced.uid].as_ref().unwrap_err();
    assert_contains(error, "ResourceClaim default/replaced was replaced");
    assert_contains(error, &replaced.uid);

    assert_eq!(setup.driver.prepares.load(Ordering::SeqCst), 1);
    let checkpoint = setup.checkpoint();
    assert!(checkpoint.contains(&kept.uid));
    for gone in [&deleted, &replaced] {
        assert!(!checkpoint.contains(&gone.uid), "record of {}", gone.name);
        assert!(specs_of(&setup.cluster.cdi_root(), &gone.uid).is_empty());
    }
    // The kubelet's unprepare of the failed claims is a no-op success.
    let answer = setup
        .kubelet
        .unprepare(&[kept, deleted, replaced])
        .await
        .unwrap();
    assert!(answer.values().all(Result::is_ok), "{answer:?}");
    setup.finish().await;
}

#[tokio::test]
async fn a_claim_deleted_while_its_prepare_reads_it_fails_naming_the_claim_and_leaves_no_record_or_spec()
 {
    let setup = Setup::start(CountingDriver::default(), KubeletVersion::V1_36).await;
    let claim = setup.claim("deleted-meanwhile", "gpu-1").await;

    // Every API request now waits 1.5 s before it is handled: the claim's GET is in flight
    // when the claim goes.
    setup
        .cluster
        .api()
        .faults()
        .set_latency(Duration::from_millis(1500));
    let kubelet = setup.kubelet.clone();
    let request = claim.clone();
    let prepare = tokio::spawn(async move { kubelet.prepare(&[request]).await });
    // The prepare is running once its intent is recorded (written while the claim is read).
    let started = Instant::now();
    while !setup.checkpoint().contains(&claim.uid) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the prepare never recorded its intent"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    setup
        .cluster
        .api()
        .delete::<ResourceClaim>(Some("default"), "deleted-meanwhile")
        .unwrap();
    let answer = prepare.await.unwrap().unwrap();
    setup.cluster.api().faults().clear();

    let error = answer[&claim.uid].as_ref().unwrap_err();
    assert_contains(error, "ResourceClaim default/deleted-meanwhile not found");
    assert_eq!(setup.driver.prepares.load(Ordering::SeqCst), 0);
    assert!(
        !setup.checkpoint().contains(&claim.uid),
        "the intent record is removed again"
    );
    assert!(specs_of(&setup.cluster.cdi_root(), &claim.uid).is_empty());
    let answer = setup
        .kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(answer[&claim.uid].is_ok(), "{answer:?}");
    setup.finish().await;
}

/// Opens a health stream, reads its first message when `read_first`, and drops it;
/// `iterations` times, every tenth on a connection of its own (dropped with the stream), in
/// the service versions of `apis` by turns.
async fn open_and_drop_health_streams(
    kubelet: &RegisteredPlugin,
    iterations: usize,
    apis: &[HealthApi],
    read_first: bool,
) {
    for iteration in 0..iterations {
        let api = apis[iteration % apis.len()];
        let connection = if iteration % 10 == 9 {
            kubelet.connect_again().await.unwrap()
        } else {
            kubelet.clone()
        };
        let mut watch = connection.watch_health_via(api).await.unwrap();
        if read_first {
            let devices = watch.next().await.unwrap().unwrap();
            assert_eq!(devices.len(), 1);
        }
        drop(watch);
        drop(connection);
    }
}

#[tokio::test]
async fn health_streams_opened_and_dropped_hundreds_of_times_leave_no_task_or_fd_and_the_plugin_serves_on()
 {
    let driver = CountingDriver {
        health: true,
        ..CountingDriver::default()
    };
    let setup = Setup::start(driver, KubeletVersion::V1_37).await;
    assert_eq!(setup.kubelet.health_api, Some(HealthApi::V1));
    open_and_drop_health_streams(
        &setup.kubelet,
        300,
        &[HealthApi::V1, HealthApi::V1alpha1],
        true,
    )
    .await;
    let after = setup.probe.settled(&setup.baseline, SETTLE).await;
    assert!(after.is_ok(), "{after:?}");

    // Still serving: a new stream gets the devices, a claim is prepared.
    let mut watch = setup.kubelet.watch_health().await.unwrap();
    let devices = watch.next().await.unwrap().unwrap();
    assert_eq!(devices[0].status, HealthStatus::Healthy);
    drop(watch);
    let claim = setup.claim("after-the-streams", "gpu-0").await;
    let answer = setup
        .kubelet
        .prepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(answer[&claim.uid].is_ok());
    let answer = setup
        .kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(answer[&claim.uid].is_ok());
    setup.finish().await;
}

#[tokio::test]
async fn quiet_health_streams_of_a_driver_without_health_opened_and_dropped_in_a_loop_leave_nothing()
 {
    // Kubelet 1.36 opens the v1alpha1 stream for every plugin; this driver reports no health,
    // so each stream stays silent until the kubelet drops it.
    let setup = Setup::start(CountingDriver::default(), KubeletVersion::V1_36).await;
    assert_eq!(setup.kubelet.health_api, None);
    open_and_drop_health_streams(&setup.kubelet, 100, &[HealthApi::V1alpha1], false).await;
    let claim = setup.claim("after-the-streams", "gpu-0").await;
    let answer = setup
        .kubelet
        .prepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(answer[&claim.uid].is_ok());
    let answer = setup
        .kubelet
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(answer[&claim.uid].is_ok());
    setup.finish().await;
}
