//! The SDK against real Kubernetes v1.36 components (see `dra_sdk_testing::e2e`): a real
//! kubelet registers and calls the plugin, a real API server stores its slices, a real
//! scheduler allocates from them. Skipped, with one line saying so, when `DRA_E2E_K8S_BIN`
//! does not name the binaries; CI always sets it.
//!
//! The tests share one cluster with two nodes. `node-1` hosts the suite and the scheduling
//! tests (each with a driver of its own); `node-2` the tests that restart its kubelet or run
//! two instances of one plugin, one at a time.

use std::collections::BTreeMap;
use std::time::Duration;

use dra_sdk::advanced::slices::ResourceSlicePublisher;
use dra_sdk::claim::ClaimRef;
use dra_sdk::health::DeviceState;
use dra_sdk::plugin::KubeletPlugin;
use dra_sdk::slices::{
    CapacityRequestPolicy, CounterSet, Device, DeviceCapacity, DeviceTaint, DriverResources, Pool,
    TaintEffect,
};
use dra_sdk_testing::assert_contains;
use dra_sdk_testing::e2e::workload::{self, ClaimSource};
use dra_sdk_testing::e2e::{
    KubeletNode, RealCluster, Registration, ServedVersions, binaries_or_skip, suite::E2eSuite,
};
use dra_sdk_testing::kubelet::{KubeletSimulator, KubeletVersion};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, ListParams, PostParams};
use serde_json::json;
use tokio::sync::{Mutex, OnceCell};

use dra_sdk_testing::sample_driver::{GpuDriver, gpus_on};

const TIMEOUT: Duration = Duration::from_secs(60);

static CLUSTER: OnceCell<RealCluster> = OnceCell::const_new();
/// The tests on `node-2` restart its kubelet: one at a time.
static NODE_2: Mutex<()> = Mutex::const_new(());

async fn cluster() -> Option<&'static RealCluster> {
    let binaries = binaries_or_skip()?;
    Some(
        CLUSTER
            .get_or_init(|| async {
                let cluster = RealCluster::builder(binaries)
                    .nodes(["node-1", "node-2"])
                    .start()
                    .await
                    .unwrap_or_else(|error| panic!("starting the e2e cluster: {error}"));
                eprintln!("e2e: {}", cluster.describe());
                cluster
            })
            .await,
    )
}

fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).expect("a valid object")
}

async fn start_plugin(
    cluster: &RealCluster,
    node: &str,
    driver: &str,
    resources: DriverResources,
    pod_uid: Option<&str>,
) -> KubeletPlugin {
    let client = cluster.client().await.unwrap();
    let mut builder = cluster
        .plugin(node, GpuDriver::default(), driver, client)
        .unwrap()
        .resources(resources);
    if let Some(uid) = pod_uid {
        builder = builder.pod_uid(uid);
    }
    let plugin = builder.start().await.unwrap();
    tokio::time::timeout(TIMEOUT, plugin.published())
        .await
        .expect("the plugin's slices are written");
    plugin
}

/// The suite over the SDK's test driver: registration, slices, pods with templates, shared
/// claims, two containers, a bad config.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_driver_passes_the_e2e_suite() {
    let Some(cluster) = cluster().await else {
        return;
    };
    let driver = "suite.gpu.example.com";
    let plugin = start_plugin(cluster, "node-1", driver, gpus_on("node-1", 4), None).await;
    let report = E2eSuite::new(cluster, "node-1", driver)
        .bad_config(
            json!({ "apiVersion": "gpu.example.com/v1", "kind": "GpuConfig", "sharingg": "x" }),
            "unknown field `sharingg`",
        )
        .run()
        .await
        .unwrap();
    println!("{report}");
    report.assert_all_passed();
    plugin.shutdown().await.unwrap();
}

/// Kubelets hard-code their device-plugin socket path; each kubelet of the cluster serves it in
/// a folder of its own node (the harness's private mount), so two nodes on one machine never
/// race for it (one lost with "address already in use" in CI).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kubelet_has_its_own_device_plugin_socket() {
    let Some(cluster) = cluster().await else {
        return;
    };
    if !dra_sdk_testing::e2e::mount_namespaces_available() {
        eprintln!("e2e: no mount namespaces here: kubelets share the host's device-plugin folder");
        return;
    }
    for node in cluster.nodes() {
        let socket = node.device_plugins_dir().join("kubelet.sock");
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        while !socket.exists() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} never appeared",
                socket.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Waits for registration number `seen + 1` of `driver` by the node's kubelet and checks
/// that the kubelet chose the v1 DRA service.
async fn registered_v1(node: &KubeletNode, driver: &str, seen: usize) -> Registration {
    let registration = node
        .wait_for_registration(driver, seen, TIMEOUT)
        .await
        .unwrap();
    assert_eq!(
        registration.chosen_service, "v1.DRAPlugin",
        "{registration:?}"
    );
    registration
}

/// A pod with a claim of `driver` runs on `node` and is unprepared when deleted.
async fn a_pod_runs(cluster: &RealCluster, node: &str, driver: &str) {
    E2eSuite::new(cluster, node, driver)
        .only(["pod-runs"])
        .run()
        .await
        .unwrap()
        .assert_all_passed();
}

/// The real kubelet registers the plugin (v1 chosen), again after its own restart and after
/// the plugin's restart, and pods still get devices afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_survives_kubelet_and_plugin_restarts() {
    let Some(cluster) = cluster().await else {
        return;
    };
    let _node = NODE_2.lock().await;
    let driver = "restart.gpu.example.com";
    let node = cluster.node("node-2").unwrap();
    let plugin = start_plugin(cluster, "node-2", driver, gpus_on("node-2", 2), None).await;
    registered_v1(node, driver, 0).await;

    cluster.restart_kubelet("node-2").await.unwrap();
    registered_v1(node, driver, 1).await;

    plugin.shutdown().await.unwrap();
    let plugin = start_plugin(cluster, "node-2", driver, gpus_on("node-2", 2), None).await;
    registered_v1(node, driver, 2).await;

    a_pod_runs(cluster, "node-2", driver).await;
    plugin.shutdown().await.unwrap();
}

/// A rolling update: a second instance of the plugin starts next to the first (its own
/// sockets, from the pod UID), both are registered, pods run; the first goes away and pods
/// still run through the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_update_with_two_instances() {
    let Some(cluster) = cluster().await else {
        return;
    };
    let _node = NODE_2.lock().await;
    let driver = "rolling.gpu.example.com";
    let node = cluster.node("node-2").unwrap();
    let seen = node.registrations(driver).len();
    let instance = async |pod_uid: &str| {
        start_plugin(
            cluster,
            "node-2",
            driver,
            gpus_on("node-2", 2),
            Some(pod_uid),
        )
        .await
    };
    let old = instance("pod-old").await;
    let first = registered_v1(node, driver, seen).await;
    let new = instance("pod-new").await;
    let second = registered_v1(node, driver, seen + 1).await;
    assert_ne!(
        first.endpoint, second.endpoint,
        "each instance registers its own DRA socket"
    );

    a_pod_runs(cluster, "node-2", driver).await;
    old.shutdown().await.unwrap();
    a_pod_runs(cluster, "node-2", driver).await;
    new.shutdown().await.unwrap();
}

/// Every kind of content the publisher writes: a pool of 1200 devices (split over several
/// slices), shared counters with partitions, taints, consumable capacity, binding conditions.
fn every_feature(node: &str) -> DriverResources {
    let big = (0..1200)
        .map(|i| Device::new(format!("dev-{i}")).attribute("index", i64::from(i)))
        .collect::<Vec<_>>();
    let partitions = vec![
        Device::new("gpu-0").consumes("gpu-0", [("memory", "40Gi")]),
        Device::new("gpu-0-half-a").consumes("gpu-0", [("memory", "20Gi")]),
        Device::new("gpu-0-half-b")
            .consumes("gpu-0", [("memory", "20Gi")])
            .taint(DeviceTaint::new("gpu.example.com/xid", TaintEffect::NoSchedule).value("79")),
        Device::new("shared")
            .allow_multiple_allocations(true)
            .capacity(
                "memory",
                DeviceCapacity::new("16Gi")
                    .with_request_policy(CapacityRequestPolicy::with_default("4Gi")),
            ),
        Device::new("bound")
            .binds_to_node(true)
            .binding_condition("gpu.example.com/attached")
            .binding_failure_condition("gpu.example.com/failed"),
    ];
    DriverResources::new()
        .with_pool(node, Pool::new(big))
        .with_pool(
            format!("{node}-partitioned"),
            Pool::new(partitions).counter_set(CounterSet::new("gpu-0", [("memory", "40Gi")])),
        )
}

/// Publishes [`every_feature`] for `node` through `client`, checks the server holds every
/// device in complete pools, and that nothing is written at steady state.
async fn publish_every_feature(client: kube::Client, driver: &str, node: &str, served: &[&str]) {
    let resources = every_feature(node);
    let publisher =
        ResourceSlicePublisher::for_node(client.clone(), driver, node).spawn(resources.clone());
    tokio::time::timeout(TIMEOUT, publisher.synced())
        .await
        .expect("slices written");
    let written = publisher.stats();
    assert_eq!(written.errors, 0, "{written:?}");

    // Read back in the newest version the server serves: v1 is off on the older ones.
    let version = ["v1", "v1beta2", "v1beta1"]
        .into_iter()
        .find(|version| served.contains(version))
        .unwrap();
    let resource = ApiResource {
        group: "resource.k8s.io".into(),
        version: version.into(),
        api_version: format!("resource.k8s.io/{version}"),
        kind: "ResourceSlice".into(),
        plural: "resourceslices".into(),
    };
    let slices = Api::<DynamicObject>::all_with(client.clone(), &resource)
        .list(&ListParams::default().fields(&format!("spec.driver={driver}")))
        .await
        .unwrap()
        .items;
    let mut pools: BTreeMap<String, (i64, usize)> = BTreeMap::new();
    let mut devices = 0;
    for slice in &slices {
        let spec = &slice.data["spec"];
        let entry = pools
            .entry(spec["pool"]["name"].as_str().unwrap().to_owned())
            .or_insert((spec["pool"]["resourceSliceCount"].as_i64().unwrap(), 0));
        entry.1 += 1;
        devices += spec["devices"].as_array().map_or(0, Vec::len);
    }
    assert_eq!(devices, resources.device_count(), "every device is stored");
    for (pool, (count, seen)) in &pools {
        assert_eq!(*count, *seen as i64, "pool {pool} is complete");
    }
    assert!(pools[node].1 > 1, "1200 devices need several slices");

    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(publisher.stats(), written, "no writes at steady state");
    publisher.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_accepts_every_slice_the_publisher_writes() {
    let Some(cluster) = cluster().await else {
        return;
    };
    let client = cluster.client().await.unwrap();
    publish_every_feature(client, "publish.gpu.example.com", "node-1", &["v1"]).await;
}

/// A server like Kubernetes 1.33 (v1beta2 and v1beta1 only) and one like 1.32 (v1beta1 only):
/// the publisher finds the version by discovery and the server accepts everything, and the
/// plugin reads claims through the newest version served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn older_api_servers_accept_the_slices() {
    let Some(binaries) = binaries_or_skip() else {
        return;
    };
    for (served, versions) in [
        (ServedVersions::Like1_33, ["v1beta2", "v1beta1"].as_slice()),
        (ServedVersions::Like1_32, ["v1beta1"].as_slice()),
    ] {
        let cluster = RealCluster::builder(&binaries)
            .control_plane_only()
            .served_versions(served)
            .start()
            .await
            .unwrap();
        let client = cluster.client().await.unwrap();
        let node: Node = object(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": { "name": "old-node", "labels": { "kubernetes.io/hostname": "old-node" } },
        }));
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
        let groups = client.list_api_groups().await.unwrap();
        let group = groups
            .groups
            .iter()
            .find(|g| g.name == "resource.k8s.io")
            .unwrap();
        let offered: Vec<&str> = group.versions.iter().map(|v| v.version.as_str()).collect();
        assert!(!offered.contains(&"v1"), "{served:?} serves {offered:?}");
        assert_eq!(
            offered.contains(&"v1beta2"),
            versions.contains(&"v1beta2"),
            "{offered:?}"
        );
        publish_every_feature(client.clone(), "old.gpu.example.com", "old-node", versions).await;
        prepare_through_an_older_api(client, versions[0]).await;
    }
}

/// A claim written in `version` (the newest the server serves), allocated the way the
/// scheduler would, is prepared by a plugin that finds the version by discovery; a claim that
/// does not exist is reported as such, not confused with a version the server does not serve.
async fn prepare_through_an_older_api(client: kube::Client, version: &str) {
    let driver = "claims.gpu.example.com";
    let request = match version {
        "v1beta1" => json!({ "name": "gpu", "deviceClassName": "gpu.example.com" }),
        _ => json!({ "name": "gpu", "exactly": { "deviceClassName": "gpu.example.com" } }),
    };
    let resource = ApiResource {
        group: "resource.k8s.io".into(),
        version: version.into(),
        api_version: format!("resource.k8s.io/{version}"),
        kind: "ResourceClaim".into(),
        plural: "resourceclaims".into(),
    };
    let claims = Api::<DynamicObject>::namespaced_with(client.clone(), "default", &resource);
    let claim: DynamicObject = object(json!({
        "apiVersion": format!("resource.k8s.io/{version}"), "kind": "ResourceClaim",
        "metadata": { "name": "old-claim", "namespace": "default" },
        "spec": { "devices": { "requests": [request] } },
    }));
    let mut claim = claims.create(&PostParams::default(), &claim).await.unwrap();
    claim.data["status"] = json!({ "allocation": { "devices": { "results": [
        { "request": "gpu", "driver": driver, "pool": "old-node", "device": "gpu-1" },
    ] } } });
    let claim = claims
        .replace_status("old-claim", &PostParams::default(), &claim)
        .await
        .unwrap();
    let uid = claim.metadata.uid.clone().unwrap();

    let dirs = tempfile::tempdir().unwrap();
    let plugin = KubeletPlugin::builder(GpuDriver::default(), driver, "old-node", client)
        .registrar_dir(dirs.path().join("registry"))
        .plugins_dir(dirs.path().join("plugins"))
        .cdi_root(dirs.path().join("cdi"))
        .resources(gpus_on("old-node", 2))
        .start()
        .await
        .unwrap();
    let kubelet = KubeletSimulator::new(KubeletVersion::V1_36)
        .register(&plugin.socket_paths().registration)
        .await
        .unwrap();
    let present = ClaimRef {
        uid: uid.clone(),
        namespace: "default".into(),
        name: "old-claim".into(),
    };
    let absent = ClaimRef {
        uid: "uid-absent".into(),
        namespace: "default".into(),
        name: "no-such-claim".into(),
    };
    let outcomes = kubelet.prepare(&[present.clone(), absent]).await.unwrap();
    let devices = outcomes[&uid]
        .as_ref()
        .unwrap_or_else(|error| panic!("prepare through {version}: {error}"));
    assert_eq!(devices.len(), 1, "{devices:?}");
    assert_eq!(devices[0].device, "gpu-1");
    assert_eq!(devices[0].cdi_device_ids.len(), 1, "{devices:?}");
    let missing = outcomes["uid-absent"].as_ref().unwrap_err();
    assert!(
        missing.contains("no-such-claim not found"),
        "a missing claim is reported as missing through {version}: {missing}"
    );
    let unprepared = kubelet.unprepare(&[present]).await.unwrap();
    assert_eq!(unprepared[&uid], Ok(()));
    plugin.shutdown().await.unwrap();
}

/// The real scheduler allocates from the plugin's slices: by CEL on an attribute, within the
/// shared counters of partitionable devices (a partition waits while the whole device is
/// taken), and from the consumable capacity of a device that takes many allocations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheduler_allocates_from_our_slices() {
    let Some(cluster) = cluster().await else {
        return;
    };
    let driver = "sched.gpu.example.com";
    let kind = |device: Device, kind: &str| device.attribute("kind", kind);
    let devices = vec![
        kind(Device::new("fast"), "plain").attribute("speed", 10_i64),
        kind(Device::new("slow"), "plain").attribute("speed", 1_i64),
        kind(Device::new("whole"), "whole").consumes("gpu", [("memory", "40Gi")]),
        kind(Device::new("half"), "half").consumes("gpu", [("memory", "20Gi")]),
        kind(Device::new("shared"), "shared")
            .allow_multiple_allocations(true)
            .capacity(
                "memory",
                DeviceCapacity::new("16Gi")
                    .with_request_policy(CapacityRequestPolicy::with_default("4Gi")),
            ),
    ];
    let resources = DriverResources::new().with_pool(
        "node-1",
        Pool::new(devices).counter_set(CounterSet::new("gpu", [("memory", "40Gi")])),
    );
    let plugin = start_plugin(cluster, "node-1", driver, resources, None).await;
    let client = cluster.client().await.unwrap();
    let namespace = cluster.create_namespace("sched").await.unwrap();
    let class = format!("{namespace}.{driver}");
    Api::<DeviceClass>::all(client.clone())
        .create(
            &PostParams::default(),
            &workload::device_class(&class, driver, None).unwrap(),
        )
        .await
        .unwrap();
    let templates = Api::<ResourceClaimTemplate>::namespaced(client.clone(), &namespace);
    let of_kind = |kind: &str| format!("device.attributes[{driver:?}].kind == {kind:?}");
    for (name, exactly) in [
        (
            "fast",
            json!({ "selectors": [{ "cel": { "expression": format!("device.attributes[{driver:?}].speed > 5") } }] }),
        ),
        (
            "whole",
            json!({ "selectors": [{ "cel": { "expression": of_kind("whole") } }] }),
        ),
        (
            "half",
            json!({ "selectors": [{ "cel": { "expression": of_kind("half") } }] }),
        ),
        (
            "share-8gi",
            json!({
                "selectors": [{ "cel": { "expression": of_kind("shared") } }],
                "capacity": { "requests": { "memory": "8Gi" } },
            }),
        ),
    ] {
        let template = workload::claim_template(&namespace, name, &class, exactly, None).unwrap();
        templates
            .create(&PostParams::default(), &template)
            .await
            .unwrap();
    }
    let pods = Api::<Pod>::namespaced(client.clone(), &namespace);
    let create = async |name: &str, template: &str| {
        let source = ClaimSource::Template(template.into());
        let pod = workload::pod_using(&namespace, name, "node-1", &source, &["ctr"]);
        pods.create(&PostParams::default(), &pod).await.unwrap();
    };
    let running = async |name: &str| {
        workload::wait_for_pod_running(&client, &namespace, name, TIMEOUT)
            .await
            .unwrap()
    };
    // The device and share ID allocated to the pod's claim.
    let allocated = async |name: &str| -> (String, Option<String>) {
        let pod = running(name).await;
        let claim = pod.status.and_then(|s| s.resource_claim_statuses).unwrap()[0]
            .resource_claim_name
            .clone()
            .unwrap();
        let claim = Api::<ResourceClaim>::namespaced(client.clone(), &namespace)
            .get(&claim)
            .await
            .unwrap();
        let result = &claim
            .status
            .and_then(|s| s.allocation)
            .unwrap()
            .devices
            .unwrap()
            .results
            .unwrap()[0];
        assert_eq!(result.driver, driver);
        (result.device.clone(), result.share_id.clone())
    };
    let stays_pending = async |name: &str| {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let pod = pods.get(name).await.unwrap();
        let spec = pod.spec.unwrap_or_default();
        assert_eq!(spec.node_name, None, "pod {name} must not be scheduled");
    };

    create("cel", "fast").await;
    assert_eq!(
        allocated("cel").await.0,
        "fast",
        "CEL picks the fast device"
    );

    create("whole", "whole").await;
    assert_eq!(allocated("whole").await.0, "whole");
    create("half", "half").await;
    stays_pending("half").await;
    workload::delete_pods(&client, &namespace, &["whole"], TIMEOUT)
        .await
        .unwrap();
    assert_eq!(
        allocated("half").await.0,
        "half",
        "the counters are free again"
    );

    create("share-1", "share-8gi").await;
    create("share-2", "share-8gi").await;
    let (first, first_share) = allocated("share-1").await;
    let (second, second_share) = allocated("share-2").await;
    assert_eq!((first.as_str(), second.as_str()), ("shared", "shared"));
    assert!(
        first_share.is_some() && first_share != second_share,
        "{first_share:?} {second_share:?}"
    );
    create("share-3", "share-8gi").await;
    stays_pending("share-3").await;

    workload::delete_pods(
        &client,
        &namespace,
        &["cel", "half", "share-1", "share-2", "share-3"],
        TIMEOUT,
    )
    .await
    .unwrap();
    plugin.shutdown().await.unwrap();
}

/// Whether a process is gone (a zombie waiting for its reaper counts as gone: it runs no
/// more and holds no port).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

async fn wait_gone(pids: &[(String, u32)]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let alive: Vec<_> = pids.iter().filter(|(_, pid)| !gone(*pid)).collect();
        if alive.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "orphaned components still run: {alive:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The child half of [`no_orphans_when_the_test_process_is_killed`]: does something only when
/// that test runs this binary again with `DRA_E2E_ORPHAN_CHILD` naming a file, where it writes
/// the PIDs of its cluster's components before it waits to be killed.
#[tokio::test]
async fn orphan_child() {
    let Some(file) = std::env::var_os("DRA_E2E_ORPHAN_CHILD") else {
        return;
    };
    let binaries = binaries_or_skip().expect("the parent checked the binaries");
    let cluster = RealCluster::builder(binaries)
        .control_plane_only()
        .start()
        .await
        .unwrap();
    let pids: Vec<String> = cluster
        .pids()
        .into_iter()
        .map(|(name, pid)| format!("{name}={pid}"))
        .collect();
    std::fs::write(file, pids.join("\n")).unwrap();
    tokio::time::sleep(Duration::from_secs(300)).await;
}

/// A test process killed with SIGKILL runs no destructor; its cluster's components must die
/// with it all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_orphans_when_the_test_process_is_killed() {
    if binaries_or_skip().is_none() {
        return;
    }
    assert!(
        dra_sdk_testing::e2e::pdeath_signal_supported(),
        "setpriv (util-linux) is needed to tie components to the test process"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pids");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "orphan_child", "--nocapture"])
        .env("DRA_E2E_ORPHAN_CHILD", &file)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + TIMEOUT;
    let pids = loop {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        if !text.is_empty() {
            break text
                .lines()
                .filter_map(|line| line.split_once('='))
                .map(|(name, pid)| (name.to_owned(), pid.parse::<u32>().unwrap()))
                .collect::<Vec<_>>();
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the child test ended early"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the child's cluster did not start"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(pids.len(), 2, "etcd and the API server: {pids:?}");
    assert!(pids.iter().all(|(_, pid)| !gone(*pid)));
    child.kill().unwrap();
    child.wait().unwrap();
    wait_gone(&pids).await;
}

/// A test that panics with a cluster drops it while unwinding: every component stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_orphans_after_a_panic() {
    let Some(binaries) = binaries_or_skip() else {
        return;
    };
    let pids = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = pids.clone();
    let test = tokio::spawn(async move {
        let cluster = RealCluster::builder(binaries)
            .control_plane_only()
            .start()
            .await
            .unwrap();
        *seen.lock().unwrap() = cluster.pids();
        panic!("a failing test");
    });
    assert!(test.await.unwrap_err().is_panic());
    let pids = pids.lock().unwrap().clone();
    assert_eq!(pids.len(), 2, "{pids:?}");
    wait_gone(&pids).await;
}

/// Without the binaries every e2e test passes after one line saying that it was skipped; with
/// `DRA_E2E_REQUIRED` set (as CI does) the same run fails instead.
#[test]
fn without_binaries_the_suite_says_it_is_skipped() {
    let run = |required: bool| {
        let mut command = std::process::Command::new(std::env::current_exe().unwrap());
        command
            .args(["--exact", "sdk_driver_passes_the_e2e_suite"])
            .env_remove("DRA_E2E_K8S_BIN")
            .env_remove("DRA_E2E_REQUIRED");
        if required {
            command.env("DRA_E2E_REQUIRED", "1");
        }
        command.output().unwrap()
    };
    let skipped = run(false);
    let stderr = String::from_utf8_lossy(&skipped.stderr);
    assert!(skipped.status.success(), "{stderr}");
    assert_eq!(
        stderr
            .matches("e2e: skipped: DRA_E2E_K8S_BIN is not set")
            .count(),
        1,
        "{stderr}"
    );
    let required = run(true);
    assert!(!required.status.success());
    assert_contains(
        String::from_utf8_lossy(&required.stdout),
        "DRA_E2E_REQUIRED is set but DRA_E2E_K8S_BIN is not",
    );
}

/// Device health reaches the pod: the kubelet watches the plugin's health stream and shows
/// each allocated device's health in `containerStatuses[].allocatedResourcesStatus`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_health_reaches_the_pod_status() {
    let Some(cluster) = cluster().await else {
        return;
    };
    let driver = "health.gpu.example.com";
    let states = |state: fn(String) -> DeviceState| (0..2).map(move |i| state(format!("gpu-{i}")));
    let healthy = |device: String| DeviceState::healthy("node-1", device);
    let unhealthy = |device: String| DeviceState::unhealthy("node-1", device, "XID 79");
    let client = cluster.client().await.unwrap();
    let plugin = cluster
        .plugin(
            "node-1",
            GpuDriver {
                health: Some(states(healthy).collect()),
            },
            driver,
            client.clone(),
        )
        .unwrap()
        .resources(gpus_on("node-1", 1))
        .start()
        .await
        .unwrap();
    let node = cluster.node("node-1").unwrap();
    node.wait_for_registration(driver, 0, TIMEOUT)
        .await
        .unwrap();
    let namespace = cluster.create_namespace("health").await.unwrap();
    let class = format!("{namespace}.{driver}");
    Api::<DeviceClass>::all(client.clone())
        .create(
            &PostParams::default(),
            &workload::device_class(&class, driver, None).unwrap(),
        )
        .await
        .unwrap();
    let template = workload::claim_template(&namespace, "gpu", &class, json!({}), None).unwrap();
    Api::<ResourceClaimTemplate>::namespaced(client.clone(), &namespace)
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    let pod = workload::pod_using(
        &namespace,
        "watched",
        "node-1",
        &ClaimSource::Template("gpu".into()),
        &["ctr"],
    );
    let pods = Api::<Pod>::namespaced(client.clone(), &namespace);
    pods.create(&PostParams::default(), &pod).await.unwrap();
    workload::wait_for_pod_running(&client, &namespace, "watched", TIMEOUT)
        .await
        .unwrap();

    let health_in_status = async |want: &str| {
        let deadline = std::time::Instant::now() + TIMEOUT;
        loop {
            let pod = pods.get("watched").await.unwrap();
            let statuses =
                serde_json::to_value(pod.status.and_then(|s| s.container_statuses)).unwrap();
            let seen: Vec<String> = statuses[0]["allocatedResourcesStatus"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|entry| entry["resources"].as_array().cloned().unwrap_or_default())
                .filter_map(|resource| resource["health"].as_str().map(str::to_owned))
                .collect();
            if seen.iter().any(|health| health == want) {
                return statuses;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no {want} device in the pod's status: {statuses}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    health_in_status("Healthy").await;
    plugin.context().set_device_states(states(unhealthy));
    let statuses = health_in_status("Unhealthy").await;
    eprintln!("pod status with an unhealthy device: {statuses}");
    plugin.context().set_device_states(states(healthy));
    health_in_status("Healthy").await;

    workload::delete_pods(&client, &namespace, &["watched"], TIMEOUT)
        .await
        .unwrap();
    plugin.shutdown().await.unwrap();
}

/// The standard `resource.kubernetes.io/` attributes and list attributes against a real 1.36
/// API server: stored as published with `DRAListTypeAttributes` on; with it off the server
/// refuses the slice (it drops the list value, then rejects the attribute left without one),
/// which is what the fake API server emulates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_and_list_attributes_on_a_real_api_server() {
    use dra_sdk::attributes::{NumaNode, NumaNodeForm, PciAttributes, PciBusId, PcieRoot};

    let Some(binaries) = binaries_or_skip() else {
        return;
    };
    let device = |form| {
        let pci = PciAttributes::new(PciBusId::new(0, 0x3b, 0, 0).unwrap())
            .pcie_root(Some(PcieRoot::new(0, 0x3a)))
            .numa_node(Some(NumaNode::new(1).unwrap()))
            .numa_node_form(form);
        Device::new("nic-0")
            .with_attributes(&pci)
            .attribute("vlans", vec![10i64, 20])
    };
    let slice = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": { "name": "raw-list" },
        "spec": { "driver": "raw.example.com", "allNodes": true,
                  "pool": { "name": "raw", "generation": 1, "resourceSliceCount": 1 },
                  "devices": [{ "name": "nic", "attributes": { "vlans": { "ints": [10, 20] } } }] },
    });
    let slices = |client: kube::Client| {
        Api::<DynamicObject>::all_with(
            client,
            &ApiResource::erase::<k8s_openapi::api::resource::v1::ResourceSlice>(&()),
        )
    };

    for gate in [true, false] {
        let cluster = RealCluster::builder(&binaries)
            .control_plane_only()
            .feature_gate("DRAListTypeAttributes", gate)
            .start()
            .await
            .unwrap();
        let client = cluster.client().await.unwrap();
        let created = slices(client.clone())
            .create(&PostParams::default(), &object(slice.clone()))
            .await;
        if !gate {
            let Err(kube::Error::Api(status)) = created else {
                panic!("a server without DRAListTypeAttributes stored {created:?}");
            };
            assert_eq!(status.code, 422, "{status:?}");
            assert!(
                status.message.contains("spec.devices[0].attributes[vlans]")
                    && status
                        .message
                        .contains("exactly one value must be specified"),
                "{status:?}"
            );
            continue;
        }
        created.unwrap();
        let node: Node = object(json!({
            "apiVersion": "v1", "kind": "Node", "metadata": { "name": "attr-node" },
        }));
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
        let publisher =
            ResourceSlicePublisher::for_node(client.clone(), "attr.example.com", "attr-node")
                .spawn(DriverResources::single_pool(
                    "attr-node",
                    vec![device(NumaNodeForm::List)],
                ));
        tokio::time::timeout(TIMEOUT, publisher.synced())
            .await
            .expect("slices written");
        assert_eq!(publisher.stats().errors, 0, "{:?}", publisher.stats());
        let stored = slices(client)
            .list(&ListParams::default().fields("spec.driver=attr.example.com"))
            .await
            .unwrap()
            .items;
        let attributes = &stored[0].data["spec"]["devices"][0]["attributes"];
        assert_eq!(
            attributes[PciBusId::ATTRIBUTE],
            json!({ "string": "0000:3b:00.0" })
        );
        assert_eq!(
            attributes["resource.kubernetes.io/pcieRoot"],
            json!({ "string": "pci0000:3a" })
        );
        assert_eq!(attributes[NumaNode::ATTRIBUTE], json!({ "ints": [1] }));
        assert_eq!(attributes["vlans"], json!({ "ints": [10, 20] }));
        publisher.stop().await;
    }
}

/// Device status (KEP-4817) against a real 1.36 API server with RBAC: `patch` on
/// `resourceclaims/status` alone is refused (the granular `resourceclaims/driver` check of
/// `DRAResourceClaimGranularStatusAuthorization`), with an error saying what to grant; once the
/// driver's synthetic verb is granted, one apply writes the entries, another driver's entry is
/// kept, and `clear` removes only ours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_status_with_granular_authorization() {
    use dra_sdk::device_status::{DeviceStatus, DeviceStatusError, DeviceStatusWriter};
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    use kube::api::{Patch, PatchParams};

    let Some(binaries) = binaries_or_skip() else {
        return;
    };
    let driver = "status.example.com";
    let cluster = RealCluster::builder(&binaries)
        .control_plane_only()
        .start()
        .await
        .unwrap();
    let admin = cluster.client().await.unwrap();
    let claims = Api::<ResourceClaim>::namespaced(admin.clone(), "default");
    let claim = claims
        .create(
            &PostParams::default(),
            &object(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": { "name": "nic" },
                "spec": { "devices": { "requests": [
                    { "name": "nic", "exactly": { "deviceClassName": "nic.example.com" } },
                ] } },
            })),
        )
        .await
        .unwrap();
    // Only allocated devices may have a status: allocate one device of each driver, as the
    // scheduler would.
    let allocation = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": { "name": "nic", "namespace": "default" },
        "status": { "allocation": { "devices": { "results": [
            { "request": "nic", "driver": "gpu.example.com", "pool": "node-1", "device": "gpu-0" },
            { "request": "nic", "driver": driver, "pool": "node-1", "device": "eth0" },
        ] } } },
    });
    claims
        .patch_status(
            "nic",
            &PatchParams::apply("scheduler").force(),
            &Patch::Apply(&allocation),
        )
        .await
        .unwrap();
    let other = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": { "name": "nic", "namespace": "default" },
        "status": { "devices": [
            { "driver": "gpu.example.com", "pool": "node-1", "device": "gpu-0", "data": { "owner": "gpu" } },
        ] },
    });
    claims
        .patch_status(
            "nic",
            &PatchParams::apply("gpu.example.com").force(),
            &Patch::Apply(&other),
        )
        .await
        .unwrap();

    let rule = |resources: &[&str], names: Option<&[&str]>, verbs: &[&str]| {
        json!({ "apiGroups": ["resource.k8s.io"], "resources": resources,
                "resourceNames": names, "verbs": verbs })
    };
    let grant = |name: &str, rules: Vec<serde_json::Value>| {
        let admin = admin.clone();
        let name = name.to_owned();
        async move {
            Api::<ClusterRole>::all(admin.clone())
                .create(
                    &PostParams::default(),
                    &object(json!({ "apiVersion": "rbac.authorization.k8s.io/v1",
                                    "kind": "ClusterRole", "metadata": { "name": name },
                                    "rules": rules })),
                )
                .await
                .unwrap();
            Api::<ClusterRoleBinding>::all(admin)
                .create(
                    &PostParams::default(),
                    &object(json!({ "apiVersion": "rbac.authorization.k8s.io/v1",
                                    "kind": "ClusterRoleBinding", "metadata": { "name": name },
                                    "roleRef": { "apiGroup": "rbac.authorization.k8s.io",
                                                 "kind": "ClusterRole", "name": name },
                                    "subjects": [{ "apiGroup": "rbac.authorization.k8s.io",
                                                   "kind": "User", "name": "status-writer" }] })),
                )
                .await
                .unwrap();
        }
    };
    grant(
        "status-writer",
        vec![
            rule(&["resourceclaims"], None, &["get"]),
            rule(&["resourceclaims/status"], None, &["patch", "update"]),
        ],
    )
    .await;
    let kubeconfig =
        kube::config::Kubeconfig::read_from(cluster.kubeconfig_for("status-writer", None).unwrap())
            .unwrap();
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let writer = DeviceStatusWriter::new(kube::Client::try_from(config).unwrap(), driver);
    let reference = ClaimRef {
        uid: claim.metadata.uid.clone().unwrap(),
        namespace: "default".into(),
        name: "nic".into(),
    };
    let status = DeviceStatus::new("node-1", "eth0")
        .ready("Configured", "up")
        .interface("net1", ["10.1.2.3/24"], "00:11:22:33:44:55")
        .data(json!({ "mtu": 9000 }));

    let stored = |claims: Api<ResourceClaim>| async move {
        let claim = claims.get_status("nic").await.unwrap();
        serde_json::to_value(claim.status.unwrap().devices.unwrap_or_default()).unwrap()
    };
    let error = writer
        .apply(&reference, std::slice::from_ref(&status))
        .await
        .unwrap_err();
    assert!(
        matches!(error, DeviceStatusError::Forbidden { .. }),
        "{error:?}"
    );
    eprintln!("refused as expected: {error}");
    assert_eq!(stored(claims.clone()).await.as_array().unwrap().len(), 1);

    // What a controller would be granted; a kubelet plugin gets associated-node:patch, which
    // only a service account bound to the claim's node can use.
    grant(
        "status-writer-driver",
        vec![rule(
            &["resourceclaims/driver"],
            Some(&[driver]),
            &["arbitrary-node:patch"],
        )],
    )
    .await;
    let mut written = Err(error);
    for _ in 0..50 {
        // RBAC changes reach the authorizer's cache within moments.
        written = writer
            .apply(&reference, std::slice::from_ref(&status))
            .await;
        if written.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(written.unwrap(), "written");
    let devices = stored(claims.clone()).await;
    assert_eq!(devices[0]["driver"], "gpu.example.com");
    assert_eq!(devices[1]["driver"], driver);
    assert_eq!(devices[1]["networkData"]["interfaceName"], "net1");
    assert_eq!(devices[1]["conditions"][0]["type"], "Ready");
    assert_eq!(devices[1]["data"], json!({ "mtu": 9000 }));

    writer.clear(&reference).await.unwrap();
    let devices = stored(claims).await;
    assert_eq!(devices.as_array().unwrap().len(), 1, "{devices}");
    assert_eq!(devices[0]["driver"], "gpu.example.com");
}

/// A real API server takes the plugin's failure Event as written (the strict validation of
/// `events.k8s.io/v1`: required fields, lengths, a series of at least 2, only `series` changed
/// by the patch), and counts the retries in one Event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_accepts_the_plugins_prepare_failed_event_and_its_series() {
    use dra_sdk_testing::claims::AllocatedClaim;
    use dra_sdk_testing::sample_driver::DRIVER;
    use k8s_openapi::api::events::v1::Event;

    let Some(binaries) = binaries_or_skip() else {
        return;
    };
    let cluster = RealCluster::builder(&binaries)
        .control_plane_only()
        .start()
        .await
        .unwrap();
    let client = cluster.client().await.unwrap();
    let node = "events-node";
    let claim = AllocatedClaim::new("default", "bad-config")
        .device("gpu", DRIVER, node, "gpu-0")
        .claim_config(
            &["gpu"],
            DRIVER,
            json!({"apiVersion": "gpu.example.com/v1", "kind": "GpuConfig", "sharing": 7}),
        )
        .create(&client)
        .await
        .unwrap();
    let claim = ClaimRef {
        uid: claim.metadata.uid.clone().unwrap(),
        namespace: "default".into(),
        name: "bad-config".into(),
    };
    let dirs = tempfile::tempdir().unwrap();
    let plugin = KubeletPlugin::builder(GpuDriver::default(), DRIVER, node, client.clone())
        .registrar_dir(dirs.path().join("registry"))
        .plugins_dir(dirs.path().join("plugins"))
        .cdi_root(dirs.path().join("cdi"))
        .resources(gpus_on(node, 2))
        .start()
        .await
        .unwrap();
    let kubelet = KubeletSimulator::new(KubeletVersion::V1_36)
        .register(&plugin.socket_paths().registration)
        .await
        .unwrap();
    let mut message = String::new();
    for _ in 0..3 {
        let outcomes = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
        message = outcomes[&claim.uid].clone().unwrap_err();
    }
    let events = Api::<Event>::namespaced(client, "default");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let event = loop {
        let listed = events.list(&ListParams::default()).await.unwrap().items;
        let ours = listed.into_iter().find(|e| {
            e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(claim.uid.as_str())
        });
        if let Some(event) = ours
            && event.series.as_ref().is_some_and(|s| s.count == 3)
        {
            break event;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no PrepareFailed Event with a series of 3 on the claim"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(event.reason.as_deref(), Some("PrepareFailed"));
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.note.as_deref(), Some(message.as_str()));
    assert_eq!(event.reporting_controller.as_deref(), Some(DRIVER));
    plugin.shutdown().await.unwrap();
}
