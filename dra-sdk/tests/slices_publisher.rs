//! ResourceSlicePublisher against the fake API server over real HTTP: first publish, no-op
//! republish, single-slice updates, splitting, partitionable devices, taints, repairs of
//! external deletes and edits, kubelet wipes, outages, dropped fields, owner references,
//! discovery of older API versions, metrics.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dra_sdk::advanced::slices::PublishEvent;
use dra_sdk::advanced::slices::{
    FeatureGate, PublisherHandle, ResourceApiVersion, ResourceSlicePublisher,
};
use dra_sdk::slices::{
    CounterSet, Device, DeviceCapacity, DeviceTaint, DriverResources, NodeAllocatableResource,
    Pool, PoolNodeSelection, TaintEffect,
};
use dra_sdk_testing::apiserver::{FakeApiServer, Fault, ResourceType, Verb};
use dra_sdk_testing::assert_contains;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams};
use serde_json::json;
use tokio::sync::broadcast;

const DRIVER: &str = "gpu.example.com";
const NODE: &str = "node-1";
const WAIT: Duration = Duration::from_secs(15);

struct Env {
    server: FakeApiServer,
    node_uid: String,
}

async fn env_with(builder: dra_sdk_testing::apiserver::FakeApiServerBuilder) -> Env {
    let server = builder
        .bookmark_interval(Duration::from_millis(50))
        .start()
        .await
        .unwrap();
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
    }))
    .unwrap();
    let node = server.insert(&node).unwrap();
    Env {
        node_uid: node.metadata.uid.unwrap(),
        server,
    }
}

async fn env() -> Env {
    env_with(FakeApiServer::builder()).await
}

impl Env {
    fn publisher(&self) -> ResourceSlicePublisher {
        ResourceSlicePublisher::for_node(self.server.client().unwrap(), DRIVER, NODE)
            .sync_delay(Duration::from_millis(20))
            .backoff(Duration::from_millis(10), Duration::from_millis(200))
    }

    fn slices(&self) -> Vec<ResourceSlice> {
        self.server.list::<ResourceSlice>().unwrap()
    }

    fn slice_writes(&self) -> (u64, u64, u64) {
        let counts = self.server.stats().resource("resourceslices");
        (counts.create, counts.update, counts.delete)
    }
}

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, future)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

async fn synced(handle: &PublisherHandle) {
    within("the publisher to sync", handle.synced()).await;
}

/// Polls `check` until it holds.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    within(what, async {
        while !check() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

fn gpus(n: usize) -> Vec<Device> {
    (0..n)
        .map(|i| {
            Device::new(format!("gpu-{i}"))
                .attribute("index", i as i64)
                .attribute("model", "h100")
                .capacity("memory", DeviceCapacity::new("80Gi"))
        })
        .collect()
}

fn pool_of(devices: Vec<Device>) -> DriverResources {
    DriverResources::single_pool(NODE, devices)
}

/// Checks the invariants consumers rely on and returns the published device names in order.
fn assert_consistent_pool(slices: &[ResourceSlice], pool: &str) -> Vec<String> {
    let slices: Vec<&ResourceSlice> = slices.iter().filter(|s| s.spec.pool.name == pool).collect();
    assert!(!slices.is_empty(), "pool {pool} has no slices");
    let generations: BTreeSet<i64> = slices.iter().map(|s| s.spec.pool.generation).collect();
    assert_eq!(generations.len(), 1, "mixed generations {generations:?}");
    for slice in &slices {
        assert_eq!(slice.spec.pool.resource_slice_count, slices.len() as i64);
        assert_eq!(slice.spec.driver, DRIVER);
    }
    let names: Vec<String> = slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten().map(|d| d.name.clone()))
        .collect();
    let unique: BTreeSet<&String> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "a device is published twice");
    names
}

/// Every problem the publisher reports on its event stream (errors, and dropped fields with
/// their gates), as messages, collected from the first event on.
fn problems(publisher: &ResourceSlicePublisher) -> Arc<Mutex<Vec<String>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut events = publisher.subscribe();
    let sink = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok(event) = events.recv().await {
            let message = match event {
                PublishEvent::Error(error) => error.to_string(),
                PublishEvent::DroppedFields { features, .. } => format!(
                    "dropped fields of {}",
                    features
                        .iter()
                        .map(|gate| gate.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                _ => continue,
            };
            sink.lock().unwrap().push(message);
        }
    });
    seen
}

async fn next_event(
    events: &mut broadcast::Receiver<PublishEvent>,
    mut matches: impl FnMut(&PublishEvent) -> bool,
) -> PublishEvent {
    within("a publisher event", async {
        loop {
            let event = events.recv().await.expect("event stream closed");
            if matches(&event) {
                return event;
            }
        }
    })
    .await
}

#[tokio::test]
async fn first_publish_sets_node_owner_and_pool_fields() {
    let env = env().await;
    let handle = env.publisher().spawn(pool_of(gpus(3)));
    let mut events = handle.subscribe();
    synced(&handle).await;

    let slices = env.slices();
    assert_eq!(slices.len(), 1);
    let slice = &slices[0];
    assert_eq!(slice.spec.node_name.as_deref(), Some(NODE));
    assert_eq!(slice.spec.pool.generation, 0);
    assert_eq!(slice.spec.pool.resource_slice_count, 1);
    let owner = &slice.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.name.as_str()
        ),
        ("v1", "Node", NODE)
    );
    assert_eq!(owner.uid, env.node_uid);
    assert_eq!(owner.controller, Some(true));
    let device = &slice.spec.devices.as_ref().unwrap()[1];
    assert_eq!(device.name, "gpu-1");
    assert_eq!(device.attributes.as_ref().unwrap()["index"].int, Some(1));
    assert_eq!(device.capacity.as_ref().unwrap()["memory"].value.0, "80Gi");
    assert_eq!(handle.stats().creates, 1);
    assert_eq!(env.slice_writes(), (1, 0, 0));

    // The publisher announced the server it found and the sync.
    let connected = next_event(&mut events, |e| matches!(e, PublishEvent::Connected { .. })).await;
    assert!(matches!(
        connected,
        PublishEvent::Connected { api_version: ResourceApiVersion::V1, release: Some(r) } if r.minor == 36
    ));
    next_event(&mut events, |e| {
        matches!(e, PublishEvent::Synced { version: 0 })
    })
    .await;
    handle.stop().await;
}

#[tokio::test]
async fn noop_republish_and_one_device_change() {
    let env = env().await;
    let mut devices = gpus(300);
    let handle = env.publisher().spawn(pool_of(devices.clone()));
    synced(&handle).await;
    assert_eq!(env.slices().len(), 5); // 64 devices per slice by default on 1.36
    assert_eq!(assert_consistent_pool(&env.slices(), NODE).len(), 300);

    // Same resources again: zero writes.
    env.server.reset_stats();
    handle.update(pool_of(devices.clone()));
    synced(&handle).await;
    assert_eq!(env.server.stats().writes(), 0);

    // One device changes: one slice update, the generation stays.
    devices[150] = devices[150].clone().attribute("firmware", "2.0");
    env.server.reset_stats();
    handle.update(pool_of(devices.clone()));
    synced(&handle).await;
    assert_eq!(env.slice_writes(), (0, 1, 0));
    assert_eq!(env.server.stats().writes(), 1);
    let slices = env.slices();
    assert_consistent_pool(&slices, NODE);
    assert!(slices.iter().all(|s| s.spec.pool.generation == 0));
    let stats = handle.stats();
    assert_eq!(
        (stats.creates, stats.updates, stats.deletes, stats.errors),
        (5, 1, 0, 0)
    );
    handle.stop().await;
}

#[tokio::test]
async fn thousand_devices_split_into_valid_slices_and_shrink() {
    let env = env().await;
    let handle = env.publisher().spawn(pool_of(gpus(1000)));
    synced(&handle).await;
    let slices = env.slices();
    assert_eq!(slices.len(), 16);
    assert!(
        slices
            .iter()
            .all(|s| s.spec.devices.as_ref().unwrap().len() <= 64)
    );
    let names = assert_consistent_pool(&slices, NODE);
    let expected: BTreeSet<String> = (0..1000).map(|i| format!("gpu-{i}")).collect();
    assert_eq!(names.into_iter().collect::<BTreeSet<_>>(), expected);

    // Shrinking to 10 devices repacks (bounded fragmentation) into one slice, new generation.
    handle.update(pool_of(gpus(10)));
    synced(&handle).await;
    let slices = env.slices();
    assert_eq!(slices.len(), 1);
    assert_eq!(slices[0].spec.pool.generation, 1);
    assert_eq!(assert_consistent_pool(&slices, NODE).len(), 10);
    handle.stop().await;
}

#[tokio::test]
async fn shared_counters_and_partitions() {
    let env = env().await;
    let mut pool = Pool::new([]);
    for gpu in 0..3 {
        let set = format!("gpu-{gpu}-counters");
        pool = pool
            .counter_set(CounterSet::new(&set, [("memory", "80Gi"), ("sms", "132")]))
            .device(
                Device::new(format!("gpu-{gpu}"))
                    .consumes(&set, [("memory", "80Gi"), ("sms", "132")]),
            );
        for part in 0..7 {
            pool = pool.device(
                Device::new(format!("gpu-{gpu}-mig-1g-{part}"))
                    .attribute("profile", "1g.10gb")
                    .consumes(&set, [("memory", "10Gi"), ("sms", "14")]),
            );
        }
    }
    let handle = env
        .publisher()
        .spawn(DriverResources::new().with_pool(NODE, pool));
    synced(&handle).await;
    let slices = env.slices();
    assert_eq!(slices.len(), 2, "one counter slice, one device slice");
    let counters: Vec<&ResourceSlice> = slices
        .iter()
        .filter(|s| s.spec.shared_counters.is_some())
        .collect();
    assert_eq!(counters.len(), 1);
    assert!(counters[0].spec.devices.as_ref().is_none_or(Vec::is_empty));
    assert_eq!(counters[0].spec.shared_counters.as_ref().unwrap().len(), 3);
    let names = assert_consistent_pool(&slices, NODE);
    assert_eq!(names.len(), 24);
    let device_slice = slices.iter().find(|s| s.spec.devices.is_some()).unwrap();
    let mig = &device_slice.spec.devices.as_ref().unwrap()[1];
    let consumption = &mig.consumes_counters.as_ref().unwrap()[0];
    assert_eq!(consumption.counter_set, "gpu-0-counters");
    assert_eq!(consumption.counters["memory"].value.0, "10Gi");
    handle.stop().await;
}

#[tokio::test]
async fn taint_added_then_removed() {
    let env = env().await;
    let mut devices = gpus(100);
    let handle = env.publisher().spawn(pool_of(devices.clone()));
    synced(&handle).await;

    env.server.reset_stats();
    devices[70] = devices[70]
        .clone()
        .taint(DeviceTaint::new("gpu.example.com/xid", TaintEffect::NoExecute).value("79"));
    handle.update(pool_of(devices.clone()));
    synced(&handle).await;
    assert_eq!(env.slice_writes(), (0, 1, 0));
    let tainted: Vec<_> = env
        .slices()
        .into_iter()
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .filter(|d| d.taints.is_some())
        .collect();
    assert_eq!(tainted.len(), 1);
    assert_eq!(tainted[0].name, "gpu-70");
    let taint = &tainted[0].taints.as_ref().unwrap()[0];
    assert_eq!(
        (taint.key.as_str(), taint.effect.as_str()),
        ("gpu.example.com/xid", "NoExecute")
    );

    env.server.reset_stats();
    devices[70].taints.clear();
    handle.update(pool_of(devices));
    synced(&handle).await;
    assert_eq!(env.slice_writes(), (0, 1, 0));
    assert!(
        env.slices()
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .all(|d| d.taints.is_none())
    );
    handle.stop().await;
}

#[tokio::test]
async fn external_delete_and_edit_are_repaired() {
    let env = env().await;
    let handle = env.publisher().spawn(pool_of(gpus(200)));
    synced(&handle).await;
    let before = env.slices();
    assert_eq!(before.len(), 4);

    // Someone deletes a slice: it comes back with the same name and generation.
    let victim = before[1].metadata.name.clone().unwrap();
    env.server.delete::<ResourceSlice>(None, &victim).unwrap();
    eventually("the deleted slice to come back", || {
        env.server
            .get::<ResourceSlice>(None, &victim)
            .unwrap()
            .is_some()
    })
    .await;
    synced(&handle).await;
    let after = env.slices();
    assert_eq!(after.len(), 4);
    assert_consistent_pool(&after, NODE);
    assert!(after.iter().all(|s| s.spec.pool.generation == 0));

    // Someone edits a slice: it is restored.
    let mut edited = after[2].clone();
    edited.spec.devices.as_mut().unwrap().truncate(3);
    let edited = env.server.replace(&edited).unwrap();
    let edited_rv = edited.metadata.resource_version.clone();
    let name = edited.metadata.name.clone().unwrap();
    eventually("the edited slice to be restored", || {
        let current = env
            .server
            .get::<ResourceSlice>(None, &name)
            .unwrap()
            .unwrap();
        current.metadata.resource_version != edited_rv
            && current.spec.devices.as_ref().is_some_and(|d| d.len() == 64)
    })
    .await;
    synced(&handle).await;
    assert_eq!(assert_consistent_pool(&env.slices(), NODE).len(), 200);
    handle.stop().await;
}

#[tokio::test]
async fn kubelet_wipe_is_republished_and_stale_slices_removed() {
    let env = env().await;
    // A leftover from an older driver version (generateName style) and a removed pool.
    let stale: ResourceSlice = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "node-1-gpu.example.com-x7k2p"},
        "spec": {"driver": DRIVER, "nodeName": NODE,
                 "pool": {"name": "old-pool", "generation": 3, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0"}]},
    }))
    .unwrap();
    env.server.insert(&stale).unwrap();
    let other_driver: ResourceSlice = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "someone-else"},
        "spec": {"driver": "nic.example.com", "nodeName": NODE,
                 "pool": {"name": NODE, "generation": 0, "resourceSliceCount": 1}},
    }))
    .unwrap();
    env.server.insert(&other_driver).unwrap();

    let handle = env.publisher().spawn(pool_of(gpus(70)));
    synced(&handle).await;
    let ours: Vec<ResourceSlice> = env
        .slices()
        .into_iter()
        .filter(|s| s.spec.driver == DRIVER)
        .collect();
    assert_eq!(ours.len(), 2);
    assert!(ours.iter().all(|s| s.spec.pool.name == NODE));
    assert!(
        env.server
            .get::<ResourceSlice>(None, "someone-else")
            .unwrap()
            .is_some()
    );
    let names: BTreeSet<Option<String>> = ours.iter().map(|s| s.metadata.name.clone()).collect();

    // kubelet restarts and deletes every slice of the node.
    let api: Api<ResourceSlice> = Api::all(env.server.client().unwrap());
    api.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().fields(&format!("spec.nodeName={NODE}")),
    )
    .await
    .unwrap();
    eventually("the wiped slices to be republished", || {
        env.slices()
            .iter()
            .filter(|s| s.spec.driver == DRIVER)
            .count()
            == 2
    })
    .await;
    synced(&handle).await;
    let republished: BTreeSet<Option<String>> = env
        .slices()
        .into_iter()
        .filter(|s| s.spec.driver == DRIVER)
        .map(|s| s.metadata.name)
        .collect();
    assert_eq!(republished, names);

    // Removing the pool deletes its slices.
    handle.update(DriverResources::new());
    synced(&handle).await;
    assert!(env.slices().iter().all(|s| s.spec.driver != DRIVER));
    handle.stop().await;
}

#[tokio::test]
async fn outage_then_recovery_converges() {
    let env = env().await;
    let mut devices = gpus(130);
    let publisher = env.publisher();
    let errors = problems(&publisher);
    let handle = publisher.spawn(pool_of(devices.clone()));
    synced(&handle).await;

    // The API server breaks: writes fail with 500, watches are dropped and refused.
    let faults = env.server.faults();
    faults.inject(
        Fault::status(500)
            .resource("resourceslices")
            .verb(Verb::Update)
            .always(),
    );
    faults.inject(
        Fault::status(500)
            .resource("resourceslices")
            .verb(Verb::Create)
            .always(),
    );
    faults.reject_watches(500);
    faults.drop_watches();
    devices.push(Device::new("gpu-hotplugged"));
    devices[0] = devices[0].clone().attribute("healthy", false);
    handle.update(pool_of(devices.clone()));
    eventually("write errors to be reported", || {
        errors.lock().unwrap().iter().any(|e| e.contains("500"))
    })
    .await;
    eventually("several retries", || handle.stats().errors >= 3).await;
    eventually("the refused re-watch to be reported", || {
        errors
            .lock()
            .unwrap()
            .iter()
            .any(|e| e.contains("watching ResourceSlices"))
    })
    .await;

    // Then conflicts for a while.
    faults.clear();
    faults.inject(
        Fault::status(409)
            .resource("resourceslices")
            .verb(Verb::Update)
            .times(2),
    );
    synced(&handle).await;
    let slices = env.slices();
    let names = assert_consistent_pool(&slices, NODE);
    assert_eq!(names.len(), 131);
    assert!(names.contains(&"gpu-hotplugged".to_owned()));
    let gpu0 = slices
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .find(|d| d.name == "gpu-0")
        .unwrap();
    assert_eq!(
        gpu0.attributes.as_ref().unwrap()["healthy"].bool,
        Some(false)
    );

    // After recovery the publisher is quiet again.
    env.server.reset_stats();
    handle.update(pool_of(devices));
    synced(&handle).await;
    assert_eq!(env.server.stats().writes(), 0);
    handle.stop().await;
}

#[tokio::test]
async fn dropped_fields_are_reported_once_and_not_rewritten() {
    let env = env().await;
    env.server
        .drop_fields("resourceslices", &["spec.devices[].taints"]);
    let mut devices = gpus(10);
    devices[3] = devices[3].clone().taint(DeviceTaint::new(
        "gpu.example.com/unhealthy",
        TaintEffect::NoSchedule,
    ));
    let publisher = env.publisher();
    let errors = problems(&publisher);
    let mut events = publisher.subscribe();
    let handle = publisher.spawn(pool_of(devices.clone()));
    synced(&handle).await;

    let event = next_event(&mut events, |e| {
        matches!(e, PublishEvent::DroppedFields { .. })
    })
    .await;
    let PublishEvent::DroppedFields { pool, features, .. } = event else {
        unreachable!()
    };
    assert_eq!(pool, NODE);
    assert_eq!(features, BTreeSet::from([FeatureGate::DeviceTaints]));
    eventually("the dropped taints to be reported", || {
        !errors.lock().unwrap().is_empty()
    })
    .await;
    assert!(errors.lock().unwrap()[0].contains("DRADeviceTaints"));
    assert_eq!(env.slice_writes(), (1, 0, 0), "no rewrite loop");

    // Another taint later: published (without taints), not reported again, not rewritten forever.
    devices[4] = devices[4]
        .clone()
        .taint(DeviceTaint::new(
            "gpu.example.com/unhealthy",
            TaintEffect::NoSchedule,
        ))
        .attribute("firmware", "2");
    handle.update(pool_of(devices));
    synced(&handle).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(env.slice_writes(), (1, 1, 0));
    assert_eq!(errors.lock().unwrap().len(), 1);
    handle.stop().await;
}

#[tokio::test]
async fn invalid_pool_is_reported_and_others_still_publish() {
    let env = env().await;
    let resources = pool_of(gpus(2)).with_pool(
        "broken",
        Pool::new([
            Device::new("GPU_0"),
            Device::new("ok").attribute("bad-name", 1),
        ]),
    );
    let publisher = env.publisher();
    let errors = problems(&publisher);
    let handle = publisher.spawn(resources);
    synced(&handle).await;
    assert_eq!(env.slices().len(), 1);
    eventually("the invalid pool to be reported", || {
        !errors.lock().unwrap().is_empty()
    })
    .await;
    let errors = errors.lock().unwrap().clone();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains(r#"pool "broken" is not published"#));
    assert!(errors[0].contains(r#"device "GPU_0", name"#));
    assert!(errors[0].contains(r#"device "ok", attributes["bad-name"]"#));
    handle.stop().await;
}

#[tokio::test]
async fn stop_leaves_slices_and_a_restart_adopts_them() {
    let env = env().await;
    let handle = env
        .publisher()
        .node_uid(env.node_uid.clone())
        .spawn(pool_of(gpus(100)));
    synced(&handle).await;
    handle.stop().await;
    assert_eq!(env.slices().len(), 2);

    env.server.reset_stats();
    let handle = env.publisher().spawn(pool_of(gpus(100)));
    synced(&handle).await;
    assert_eq!(env.server.stats().writes(), 0);
    // Dropping the handle stops the task too.
    drop(handle);
    assert_eq!(env.slices().len(), 2);
}

#[tokio::test]
async fn older_servers_via_discovery() {
    // A 1.33-style server: only v1beta2 (v1 JSON shape).
    let env = env_with(
        FakeApiServer::builder()
            .git_version("v1.33.4")
            .resource_types([
                ResourceType::RESOURCE_SLICES.with_version("v1beta2"),
                ResourceType::NODES,
            ]),
    )
    .await;
    let handle = env.publisher().spawn(pool_of(gpus(2)));
    let mut events = handle.subscribe();
    synced(&handle).await;
    let event = next_event(&mut events, |e| matches!(e, PublishEvent::Connected { .. })).await;
    assert!(matches!(
        event,
        PublishEvent::Connected {
            api_version: ResourceApiVersion::V1beta2,
            ..
        }
    ));
    handle.stop().await;

    // A 1.32-style server: only v1beta1, where devices are wrapped in `basic`.
    let env = env_with(
        FakeApiServer::builder()
            .git_version("v1.32.9")
            .resource_types([
                ResourceType::RESOURCE_SLICES.with_version("v1beta1"),
                ResourceType::NODES,
            ]),
    )
    .await;
    let handle = env.publisher().spawn(pool_of(gpus(2)));
    synced(&handle).await;
    let api: Api<DynamicObject> = Api::all_with(
        env.server.client().unwrap(),
        &ResourceApiVersion::V1beta1.api_resource(),
    );
    let stored = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(stored.items.len(), 1);
    let device = &stored.items[0].data["spec"]["devices"][0];
    assert_eq!(device["name"], "gpu-0");
    assert_eq!(device["basic"]["attributes"]["model"]["string"], "h100");
    env.server.reset_stats();
    handle.update(pool_of(gpus(2)));
    synced(&handle).await;
    assert_eq!(
        env.server.stats().writes(),
        0,
        "v1beta1 round trip is stable"
    );
    handle.stop().await;
}

#[tokio::test]
async fn metrics_and_unknown_node() {
    let env = env().await;
    // The node does not exist yet: the publisher keeps retrying the lookup.
    let publisher =
        ResourceSlicePublisher::for_node(env.server.client().unwrap(), DRIVER, "node-2")
            .backoff(Duration::from_millis(10), Duration::from_millis(50));
    let errors = problems(&publisher);
    let handle = publisher.spawn(DriverResources::single_pool("node-2", gpus(1)));
    eventually("the node lookup error", || {
        errors
            .lock()
            .unwrap()
            .iter()
            .any(|e| e.contains(r#"looking up node "node-2""#))
    })
    .await;
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-2"},
    }))
    .unwrap();
    env.server.insert(&node).unwrap();
    synced(&handle).await;

    let mut registry = prometheus_client::registry::Registry::default();
    handle.register_metrics(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert_contains(
        &text,
        r#"dra_resourceslice_creates_total{driver="gpu.example.com"} 1"#,
    );
    assert_contains(&text, "dra_resourceslice_errors_total");
    assert_eq!(env.slices()[0].spec.node_name.as_deref(), Some("node-2"));
    handle.stop().await;
}

#[tokio::test]
async fn cluster_scoped_network_pools() {
    let env = env().await;
    let handle =
        ResourceSlicePublisher::for_cluster(env.server.client().unwrap(), "net.example.com")
            .sync_delay(Duration::from_millis(20))
            .spawn(DriverResources::new().with_pool(
                "fabric/rack-1",
                Pool::new([Device::new("nic-0")]).node_selection(PoolNodeSelection::AllNodes),
            ));
    synced(&handle).await;
    let slices = env.slices();
    assert_eq!(slices.len(), 1);
    assert_eq!(slices[0].spec.all_nodes, Some(true));
    assert_eq!(slices[0].spec.node_name, None);
    assert_eq!(slices[0].spec.pool.name, "fabric/rack-1");
    assert!(slices[0].metadata.owner_references.is_none());
    handle.stop().await;
}

/// The standard `resource.kubernetes.io/` attributes and list attributes (1.36): stored as
/// published, and a pool with list attributes split at 64 devices per slice, which the fake
/// server enforces as the real one does.
#[tokio::test]
async fn standard_and_list_attributes_are_published() {
    use dra_sdk::attributes::{NumaNode, NumaNodeForm, PciAttributes, PciBusId, PcieRoot};

    let env = env().await;
    let devices: Vec<Device> = (0..65u8)
        .map(|i| {
            let pci = PciAttributes::new(PciBusId::new(0, i, 0, 0).unwrap())
                .pcie_root(Some(PcieRoot::new(0, 0)))
                .numa_node(Some(NumaNode::new(i64::from(i % 2)).unwrap()))
                .numa_node_form(NumaNodeForm::List);
            Device::new(format!("nic-{i}"))
                .with_attributes(&pci)
                .attribute("vlans", vec![10i64, 20])
        })
        .collect();
    let handle = env.publisher().spawn(pool_of(devices));
    synced(&handle).await;

    let slices = env.slices();
    assert_eq!(
        slices.len(),
        2,
        "65 devices with list attributes need two slices"
    );
    assert_eq!(assert_consistent_pool(&slices, NODE).len(), 65);
    let device = serde_json::to_value(&slices)
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().unwrap().clone())
        .find(|d| d["name"] == "nic-3")
        .unwrap();
    assert_eq!(
        device["attributes"][PciBusId::ATTRIBUTE],
        json!({"string": "0000:03:00.0"})
    );
    assert_eq!(
        device["attributes"][PcieRoot::ATTRIBUTE],
        json!({"string": "pci0000:00"})
    );
    assert_eq!(
        device["attributes"][NumaNode::ATTRIBUTE],
        json!({"ints": [1]})
    );
    assert_eq!(device["attributes"]["vlans"], json!({"ints": [10, 20]}));
    handle.stop().await;
}

/// A 1.36 server with `DRAListTypeAttributes` off refuses slices with list attributes (it drops
/// the values, then rejects the empty attributes): the publisher reports the gate once, as for
/// a dropped field, and publishes the devices without their list attributes instead of being
/// refused forever.
#[tokio::test]
async fn list_attributes_refused_without_their_gate_are_reported_and_left_out() {
    let env = env().await;
    env.server.drop_fields(
        "resourceslices",
        &[
            "spec.devices[].attributes.*.ints",
            "spec.devices[].attributes.*.bools",
            "spec.devices[].attributes.*.strings",
            "spec.devices[].attributes.*.versions",
        ],
    );
    let devices = vec![
        Device::new("nic-0")
            .attribute("model", "x710")
            .attribute("vlans", vec![10i64, 20]),
    ];
    let publisher = env.publisher();
    let errors = problems(&publisher);
    let mut events = publisher.subscribe();
    let handle = publisher.spawn(pool_of(devices));
    synced(&handle).await;
    let event = next_event(&mut events, |e| {
        matches!(e, PublishEvent::DroppedFields { .. })
    })
    .await;
    let PublishEvent::DroppedFields { features, .. } = event else {
        unreachable!()
    };
    assert_eq!(features, BTreeSet::from([FeatureGate::ListTypeAttributes]));

    let slices = env.slices();
    assert_eq!(slices.len(), 1);
    let attributes = slices[0].spec.devices.as_ref().unwrap()[0]
        .attributes
        .clone()
        .unwrap();
    assert!(attributes.contains_key("model"));
    assert!(!attributes.contains_key("vlans"));
    eventually("the dropped list attribute to be reported", || {
        !errors.lock().unwrap().is_empty()
    })
    .await;
    let errors = errors.lock().unwrap().clone();
    assert_eq!(errors.len(), 1, "reported once: {errors:?}");
    assert!(errors[0].contains("DRAListTypeAttributes"), "{errors:?}");
    handle.stop().await;
}

/// The 1.37 device model: a GPU's MIG partitions and its full profile on one counter set,
/// told apart by `partitionTypeAttribute` and kept apart by compatibility groups, and a
/// CPU driver's core complex with node-allocatable resources.
fn device_model_1_37() -> DriverResources {
    let part = |name: &str, profile: &str, memory: &str, group: &str| {
        Device::new(name)
            .attribute("gpu.example.com/profile", profile)
            .consumes_in_groups("gpu-0", [("memory", memory)], [group])
    };
    let pool = Pool::new([
        part("gpu-0", "7g.80gb", "80Gi", "full"),
        part("gpu-0-1g-0", "1g.10gb", "10Gi", "mig"),
        part("gpu-0-1g-1", "1g.10gb", "10Gi", "mig"),
        Device::new("ccx-0")
            .capacity("cores", DeviceCapacity::new("8"))
            .node_allocatable("cpu", NodeAllocatableResource::per_capacity("cores", "2"))
            .node_allocatable(
                "memory",
                NodeAllocatableResource::overhead_only().per_pod("64Mi"),
            ),
        Device::new("nic-0").node_allocatable(
            "memory",
            NodeAllocatableResource::overhead_only().per_pod("1Gi"),
        ),
    ])
    .counter_set(CounterSet::new("gpu-0", [("memory", "80Gi")]))
    .partition_type_attribute("gpu.example.com/profile");
    DriverResources::new().with_pool(NODE, pool)
}

async fn env_1_37() -> Env {
    env_with(FakeApiServer::builder().git_version("v1.37.0")).await
}

#[tokio::test]
async fn device_model_1_37_is_published_and_read_back() {
    let env = env_1_37().await;
    let publisher = env.publisher().skip_node_operations();
    let errors = problems(&publisher);
    let handle = publisher.spawn(device_model_1_37());
    synced(&handle).await;
    let slices = env.slices();
    assert_consistent_pool(&slices, NODE);
    // 1.35+: the counter set in a slice of its own, without the device-only fields.
    let (counters, devices): (Vec<&ResourceSlice>, Vec<&ResourceSlice>) = slices
        .iter()
        .partition(|s| s.spec.shared_counters.is_some());
    assert_eq!((counters.len(), devices.len()), (1, 1));
    assert_eq!(counters[0].spec.partition_type_attribute, None);
    assert_eq!(counters[0].spec.skip_node_operations, None);
    let spec = serde_json::to_value(&devices[0].spec).unwrap();
    assert_eq!(spec["partitionTypeAttribute"], "gpu.example.com/profile");
    assert_eq!(
        spec["skipNodeOperations"],
        json!(["NodePrepareResources", "NodeUnprepareResources"])
    );
    let device = |name: &str| {
        spec["devices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(
        device("gpu-0-1g-1")["consumesCounters"][0]["compatibilityGroups"],
        json!(["mig"])
    );
    assert_eq!(
        device("ccx-0")["nodeAllocatableResources"],
        json!({
            "cpu": {"mapping": {"capacityKey": "cores", "capacityMultiplier": "2"}},
            "memory": {"overhead": {"perPod": "64Mi"}},
        })
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(env.slice_writes(), (2, 0, 0), "no rewrite loop");
    assert!(
        errors.lock().unwrap().is_empty(),
        "{:?}",
        errors.lock().unwrap()
    );
    handle.stop().await;
}

#[tokio::test]
async fn dropped_1_37_fields_are_reported_and_unsafe_devices_withheld() {
    let env = env_1_37().await;
    for gate in [
        "DRAPartitionableDevicesType",
        "DRADeviceCompatibilityGroups",
        "DRANodeAllocatableResources",
        "DRAOptionalNodeOperations",
    ] {
        assert!(env.server.disable_feature_gate(gate), "{gate}");
    }
    let publisher = env.publisher().skip_node_operations();
    let errors = problems(&publisher);
    let mut events = publisher.subscribe();
    let handle = publisher.spawn(device_model_1_37());
    let event = next_event(
        &mut events,
        |e| matches!(e, PublishEvent::DroppedFields { features, .. } if features.len() == 4),
    )
    .await;
    let PublishEvent::DroppedFields { features, .. } = event else {
        unreachable!()
    };
    assert_eq!(
        features,
        BTreeSet::from([
            FeatureGate::PartitionableDevicesType,
            FeatureGate::DeviceCompatibilityGroups,
            FeatureGate::NodeAllocatableResources,
            FeatureGate::OptionalNodeOperations,
        ])
    );
    // Grouped partitions and the CPU device (its mapping would double-book node CPUs) are
    // withheld; the NIC's memory overhead alone is dropped and the NIC stays published.
    eventually("the unsafe devices to be withheld", || {
        let slices = env.slices();
        let names: Vec<String> = slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten().map(|d| d.name.clone()))
            .collect();
        names == ["nic-0"]
    })
    .await;
    synced(&handle).await;
    let writes = env.slice_writes();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(env.slice_writes(), writes, "no rewrite loop");
    let slices = env.slices();
    assert!(slices.iter().all(
        |s| s.spec.partition_type_attribute.is_none() && s.spec.skip_node_operations.is_none()
    ));
    let errors = errors.lock().unwrap().clone();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("DRADeviceCompatibilityGroups")),
        "{errors:?}"
    );
    handle.stop().await;
}

#[tokio::test]
async fn a_dropped_skip_node_operations_is_reported_and_harmless() {
    let env = env_1_37().await;
    assert!(env.server.disable_feature_gate("DRAOptionalNodeOperations"));
    let publisher = env.publisher().skip_node_operations();
    let mut events = publisher.subscribe();
    let handle = publisher.spawn(pool_of(gpus(3)));
    let event = next_event(&mut events, |e| {
        matches!(e, PublishEvent::DroppedFields { .. })
    })
    .await;
    let PublishEvent::DroppedFields { features, .. } = event else {
        unreachable!()
    };
    assert_eq!(
        features,
        BTreeSet::from([FeatureGate::OptionalNodeOperations])
    );
    synced(&handle).await;
    assert_eq!(assert_consistent_pool(&env.slices(), NODE).len(), 3);
    assert_eq!(
        env.slice_writes(),
        (1, 0, 0),
        "published once, not rewritten"
    );
    handle.stop().await;
}

#[tokio::test]
async fn a_1_36_server_gets_no_skip_node_operations_and_refuses_the_rest_by_name() {
    // The fake's default release is 1.36, which drops the 1.37 fields as unknown.
    let env = env().await;
    let publisher = env.publisher().skip_node_operations();
    let errors = problems(&publisher);
    let handle = publisher.spawn(pool_of(gpus(2)).with_pool(
        "cpus",
        Pool::new([
            Device::new("ccx-0").node_allocatable("cpu", NodeAllocatableResource::per_device("8")),
        ]),
    ));
    synced(&handle).await;
    let slices = env.slices();
    assert_eq!(slices.len(), 1);
    assert_eq!(slices[0].spec.skip_node_operations, None);
    eventually("the 1.37-only pool to be refused", || {
        !errors.lock().unwrap().is_empty()
    })
    .await;
    let errors = errors.lock().unwrap().clone();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_contains(
        &errors[0],
        r#"pool "cpus", device "ccx-0", nodeAllocatableResources: needs Kubernetes 1.37 or newer; the server runs 1.36"#,
    );
    handle.stop().await;
}

// --- API server faults: backoff (counted requests) and convergence ---------------------------

/// How long each fault lasts in the tests below.
const FAULT_WINDOW: Duration = Duration::from_millis(1500);

/// The most ResourceSlice requests of one kind the test publisher (backoff 10 ms doubling to
/// 200 ms, jitter in the upper half) may send in [`FAULT_WINDOW`] against a failing server:
/// about 6 while the backoff grows, then one per 100–200 ms. A publisher without backoff sends
/// hundreds.
const STORM_BOUND: u64 = 25;

/// Publishes 4 GPUs, syncs, zeroes the counters, lets `inject` break the server, hot-plugs a
/// fifth GPU and waits `window`. Returns the ResourceSlice requests the server saw during the
/// fault; then clears the faults and checks that the publisher converges to the 5 GPUs.
async fn through_a_fault(
    env: &Env,
    publisher: ResourceSlicePublisher,
    window: Duration,
    inject: impl FnOnce(&dra_sdk_testing::apiserver::Faults),
) -> dra_sdk_testing::apiserver::VerbCounts {
    let mut devices = gpus(4);
    let handle = publisher.spawn(pool_of(devices.clone()));
    synced(&handle).await;
    env.server.reset_stats();
    inject(&env.server.faults());
    devices.push(Device::new("gpu-hotplugged"));
    handle.update(pool_of(devices.clone()));
    tokio::time::sleep(window).await;
    let during = env.server.stats().resource("resourceslices");
    env.server.faults().clear();
    synced(&handle).await;
    let names = assert_consistent_pool(&env.slices(), NODE);
    let expected: Vec<String> = devices.iter().map(|d| d.name.clone()).collect();
    assert_eq!(
        names.iter().collect::<BTreeSet<_>>(),
        expected.iter().collect::<BTreeSet<_>>()
    );
    handle.stop().await;
    during
}

/// A client without kube's own retries of 429/503/504, so that the publisher's backoff is what
/// the server sees.
fn client_without_retries(env: &Env) -> kube::Client {
    let mut config = env.server.config().unwrap();
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

fn publisher_with(client: kube::Client) -> ResourceSlicePublisher {
    ResourceSlicePublisher::for_node(client, DRIVER, NODE)
        .sync_delay(Duration::from_millis(20))
        .backoff(Duration::from_millis(10), Duration::from_millis(200))
}

#[tokio::test]
async fn the_publisher_backs_off_under_5xx_and_converges() {
    for code in [500, 503] {
        let env = env().await;
        let publisher = publisher_with(client_without_retries(&env));
        let during = through_a_fault(&env, publisher, FAULT_WINDOW, |faults| {
            faults.inject(
                Fault::status(code)
                    .resource("resourceslices")
                    .verb(Verb::Update)
                    .always(),
            );
        })
        .await;
        assert!(during.update >= 3, "{code}: only {} updates", during.update);
        assert!(
            during.update <= STORM_BOUND,
            "{code}: {} updates in {FAULT_WINDOW:?}",
            during.update
        );
    }
}

#[tokio::test]
async fn the_publisher_backs_off_under_429_with_retry_after_and_converges() {
    // Both with kube's default client (its retry layer honours Retry-After) and without it
    // (the publisher's own rounds do).
    let window = Duration::from_millis(2500);
    for retries in [true, false] {
        let env = env().await;
        let client = if retries {
            env.server.client().unwrap()
        } else {
            client_without_retries(&env)
        };
        let during = through_a_fault(&env, publisher_with(client), window, |faults| {
            faults.inject(
                Fault::status(429)
                    .retry_after(1)
                    .resource("resourceslices")
                    .verb(Verb::Update)
                    .always(),
            );
        })
        .await;
        // One at the start, then one per second: 3 in 2.5 s. The backoff alone would allow ~15.
        assert!(
            (2..=4).contains(&during.update),
            "kube retries {retries}: {} updates in {window:?} with Retry-After: 1",
            during.update
        );
    }
}

#[tokio::test]
async fn the_publisher_backs_off_under_connection_resets_and_converges() {
    let env = env().await;
    let publisher = publisher_with(env.server.client().unwrap());
    let errors = problems(&publisher);
    let during = through_a_fault(&env, publisher, FAULT_WINDOW, |faults| {
        // Every write and every re-watch is cut off mid-body; the open watch is closed so the
        // publisher must re-watch.
        faults.inject(
            Fault::reset_mid_body()
                .resource("resourceslices")
                .verb(Verb::Update)
                .always(),
        );
        faults.inject(
            Fault::reset_mid_body()
                .resource("resourceslices")
                .verb(Verb::Watch)
                .always(),
        );
        faults.drop_watches();
    })
    .await;
    assert!(during.watch >= 2, "only {} re-watches", during.watch);
    for (verb, count) in [("watches", during.watch), ("updates", during.update)] {
        assert!(count <= STORM_BOUND, "{count} {verb} in {FAULT_WINDOW:?}");
    }
    // kube's watcher takes a cut watch for a normal end (no error; the publisher's watch
    // pacing is what keeps the re-watches apart); a cut write is an error, retried with backoff.
    assert!(
        errors
            .lock()
            .unwrap()
            .iter()
            .any(|e| e.contains("updating ResourceSlice") && e.contains("body")),
        "{errors:?}"
    );
}

#[tokio::test]
async fn the_publisher_rewatches_closed_watches_and_relists_after_410_gone() {
    let env = env_with(FakeApiServer::builder().history_limit(20)).await;
    let publisher = env.publisher();
    let errors = problems(&publisher);
    let mut devices = gpus(4);
    let handle = publisher.spawn(pool_of(devices.clone()));
    synced(&handle).await;
    let faults = env.server.faults();

    // Closed watches: each close costs one re-watch, no more.
    env.server.reset_stats();
    let closes = 10;
    for _ in 0..closes {
        faults.drop_watches();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let watches = env.server.stats().resource("resourceslices").watch;
    assert!(
        (1..=closes + 2).contains(&watches),
        "{watches} watches for {closes} closes"
    );
    synced(&handle).await;

    // Re-watches refused while the history moves past the publisher's resourceVersion: the
    // re-watch then gets 410 Expired, and the publisher lists again.
    faults.reject_watches(500);
    faults.drop_watches();
    eventually("a refused re-watch", || {
        errors
            .lock()
            .unwrap()
            .iter()
            .any(|e| e.contains("watching ResourceSlices"))
    })
    .await;
    for i in 0..30 {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": format!("filler-{i}")},
        }))
        .unwrap();
        env.server.insert(&node).unwrap();
    }
    devices.push(Device::new("gpu-hotplugged"));
    handle.update(pool_of(devices.clone()));
    env.server.reset_stats();
    faults.clear();
    eventually("the expired re-watch to be reported", || {
        errors
            .lock()
            .unwrap()
            .iter()
            .any(|e| e.contains("too old resource version"))
    })
    .await;
    eventually("a re-list", || {
        env.server.stats().resource("resourceslices").list >= 1
    })
    .await;
    synced(&handle).await;
    let names = assert_consistent_pool(&env.slices(), NODE);
    assert_eq!(names.len(), 5);
    assert!(names.contains(&"gpu-hotplugged".to_owned()));
    handle.stop().await;
}
