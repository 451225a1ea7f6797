//! Events on a ResourceClaim whose prepare or unprepare failed: what the API server gets, over
//! the plugin's real sockets and the fake API server's HTTP.

use std::time::Duration;

use dra_sdk::claim::{Claim, ClaimRef, DriverError, RecordedClaim};
use dra_sdk::config::ConfigRegistry;
use dra_sdk::driver::{Driver, PreparedClaim};
use dra_sdk_testing::claims::AllocatedClaim;
use dra_sdk_testing::cluster::{NODE_NAME, TestCluster};
use dra_sdk_testing::kubelet::{KubeletVersion, RegisteredPlugin};
use dra_sdk_testing::sample_driver::{DRIVER, GpuConfig, prepare_gpus};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::ListParams;

/// Prepares like the sample driver; fails to unprepare claims named `stuck`.
struct StuckDriver;

#[async_trait::async_trait]
impl Driver for StuckDriver {
    type Config = GpuConfig;

    fn config_registry(&self) -> ConfigRegistry<GpuConfig> {
        ConfigRegistry::new().register::<GpuConfig>()
    }

    async fn prepare(&self, claim: &Claim<GpuConfig>) -> Result<PreparedClaim, DriverError> {
        Ok(prepare_gpus(claim))
    }

    async fn unprepare(&self, recorded: &RecordedClaim) -> Result<(), DriverError> {
        if recorded.claim.name == "stuck" {
            return Err(DriverError::other(
                "the device is still in use by process 4242",
            ));
        }
        Ok(())
    }
}

async fn setup() -> (
    TestCluster,
    dra_sdk::plugin::KubeletPlugin,
    RegisteredPlugin,
) {
    let cluster = TestCluster::start().await.unwrap();
    let plugin = cluster.plugin(StuckDriver, DRIVER).start().await.unwrap();
    let kubelet = cluster
        .register(&plugin, KubeletVersion::V1_36)
        .await
        .unwrap();
    (cluster, plugin, kubelet)
}

/// A claim whose opaque config does not decode.
async fn bad_config_claim(cluster: &TestCluster, name: &str) -> ClaimRef {
    let claim = AllocatedClaim::new("default", name)
        .device("gpu", DRIVER, NODE_NAME, "gpu-0")
        .claim_config(
            &["gpu"],
            DRIVER,
            serde_json::json!({"apiVersion": "gpu.example.com/v1", "kind": "GpuConfig", "sharing": 7}),
        )
        .create(&cluster.client())
        .await
        .unwrap();
    ClaimRef {
        uid: claim.metadata.uid.clone().unwrap(),
        namespace: claim.metadata.namespace.clone().unwrap(),
        name: claim.metadata.name.clone().unwrap(),
    }
}

/// The Events in `default` once `done` holds for them (recording is asynchronous).
async fn events_when(cluster: &TestCluster, done: impl Fn(&[Event]) -> bool) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(cluster.client(), "default");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let events = api.list(&ListParams::default()).await.unwrap().items;
        if done(&events) {
            return events;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the Events never got there: {events:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_claim_that_fails_to_prepare_gets_a_prepare_failed_event_with_the_kubelets_message() {
    let (cluster, plugin, kubelet) = setup().await;
    let claim = bad_config_claim(&cluster, "bad-config").await;
    let result = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
    let message = result[&claim.uid].clone().unwrap_err();
    assert!(message.contains("sharing"), "{message}");

    let events = events_when(&cluster, |events| !events.is_empty()).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    let event = &events[0];
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.reason.as_deref(), Some("PrepareFailed"));
    assert_eq!(event.action.as_deref(), Some("Prepare"));
    assert_eq!(event.note.as_deref(), Some(message.as_str()));
    assert_eq!(event.reporting_controller.as_deref(), Some(DRIVER));
    assert_eq!(
        event.reporting_instance.as_deref(),
        Some(format!("{DRIVER}-{NODE_NAME}").as_str())
    );
    assert!(event.event_time.is_some());
    assert!(event.series.is_none(), "one occurrence is no series");
    let regarding = event.regarding.as_ref().unwrap();
    assert_eq!(regarding.api_version.as_deref(), Some("resource.k8s.io/v1"));
    assert_eq!(regarding.kind.as_deref(), Some("ResourceClaim"));
    assert_eq!(regarding.name.as_deref(), Some("bad-config"));
    assert_eq!(regarding.namespace.as_deref(), Some("default"));
    assert_eq!(regarding.uid.as_deref(), Some(claim.uid.as_str()));
    plugin.shutdown().await.unwrap();
}

/// A kubelet retrying a broken claim makes one Event whose series counts the retries, with a
/// bounded number of requests, not one Event (or one request) per retry.
#[tokio::test]
async fn fifty_retries_of_a_failing_prepare_are_one_event_and_few_requests() {
    let (cluster, plugin, kubelet) = setup().await;
    let claim = bad_config_claim(&cluster, "retried").await;
    for _ in 0..50 {
        let result = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
        assert!(result[&claim.uid].is_err());
    }
    let events = events_when(&cluster, |events| {
        events
            .iter()
            .any(|e| e.series.as_ref().is_some_and(|s| s.count == 50))
    })
    .await;
    assert_eq!(events.len(), 1, "{events:#?}");
    let series = events[0].series.as_ref().unwrap();
    assert!(series.last_observed_time.0 >= events[0].event_time.as_ref().unwrap().0);
    let requests = cluster.api().stats().resource("events");
    assert_eq!(requests.create, 1);
    // One update right after the create, then at most one per 5 s per Event.
    assert!(
        (1..=4).contains(&requests.patch),
        "{} series updates for 50 failures",
        requests.patch
    );
    plugin.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_failed_unprepare_gets_an_unprepare_failed_event_and_a_success_none() {
    let (cluster, plugin, kubelet) = setup().await;
    let create = |name: &'static str| {
        let client = cluster.client();
        async move {
            let claim = AllocatedClaim::new("default", name)
                .device("gpu", DRIVER, NODE_NAME, "gpu-1")
                .create(&client)
                .await
                .unwrap();
            ClaimRef {
                uid: claim.metadata.uid.clone().unwrap(),
                namespace: "default".into(),
                name: name.into(),
            }
        }
    };
    let stuck = create("stuck").await;
    let fine = create("fine").await;
    let claims = [stuck.clone(), fine.clone()];
    let prepared = kubelet.prepare(&claims).await.unwrap();
    assert!(prepared.values().all(Result::is_ok), "{prepared:?}");
    let result = kubelet.unprepare(&claims).await.unwrap();
    let message = result[&stuck.uid].clone().unwrap_err();
    assert!(result[&fine.uid].is_ok());

    let events = events_when(&cluster, |events| !events.is_empty()).await;
    assert_eq!(events.len(), 1, "only the failure is recorded: {events:#?}");
    assert_eq!(events[0].reason.as_deref(), Some("UnprepareFailed"));
    assert_eq!(events[0].action.as_deref(), Some("Unprepare"));
    assert_eq!(events[0].note.as_deref(), Some(message.as_str()));
    assert_eq!(
        events[0].regarding.as_ref().unwrap().uid.as_deref(),
        Some(stuck.uid.as_str())
    );
    plugin.shutdown().await.unwrap();
}
