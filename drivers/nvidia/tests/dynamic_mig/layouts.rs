//! Which MIG layouts the scheduler may allocate on one GPU, through the test kit's allocator:
//! the counters keep placements apart, and on drivers before R510 compatibility groups
//! (Kubernetes 1.37) keep a `4g` and a `3g` instance off one GPU. On an API server before 1.37
//! the groups are dropped, and the SDK withholds the partitions that carry them.

use dra_driver_nvidia::plugin::NvidiaPlugin;
use dra_sdk_testing::apiserver::FakeApiServer;
use dra_sdk_testing::cluster::{ClusterError, NewClaim, wait_for_devices};
use k8s_openapi::api::resource::v1::Device;

use super::*;

/// Partitions of the A100-40GB of `mixed` (GPU 1, in MIG mode).
const FOUR_G: &str = "gpu-1-mig-4g20gb-5-0";
const THREE_G_HIGH: &str = "gpu-1-mig-3g20gb-9-4";
const ONE_G: &str = "gpu-1-mig-1g5gb-19-6";

/// `mixed` with an NVIDIA driver from the R470 branch, before R510.
fn r470_profile(f_dir: &std::path::Path) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/profiles/mixed.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let old = text.replace(
        "driverVersion: \"535.183.01\"",
        "driverVersion: \"470.82.01\"",
    );
    assert_ne!(old, text, "mixed.yaml names its driver version");
    let path = f_dir.join("mixed-r470.yaml");
    std::fs::write(&path, old).unwrap();
    path.to_str().unwrap().to_owned()
}

/// The plugin as the binary runs it with dynamic MIG on the mock `profile` (a name or a
/// path), publishing into a cluster whose API server reports `git_version`.
struct Node {
    cluster: TestCluster,
    _plugin: KubeletPlugin,
    _host: tempfile::TempDir,
}

async fn start_on(profile: &str, git_version: &str) -> Node {
    let host = tempfile::tempdir().unwrap();
    let root = host.path().join("host");
    let cli = plugin_cli(&[
        "--mock-profile",
        profile,
        "--mock-host-root",
        root.to_str().unwrap(),
        "--feature-gates",
        GATES,
    ]);
    let nvidia = NvidiaPlugin::from_args(&cli.nvidia).unwrap();
    let api = FakeApiServer::builder()
        .git_version(git_version)
        .start()
        .await
        .unwrap();
    let cluster = TestCluster::start_on(api).unwrap();
    let plugin = cluster
        .plugin(nvidia.driver.clone(), DRIVER_NAME)
        .resources(nvidia.resources(NODE_NAME))
        .start()
        .await
        .unwrap();
    cluster
        .create_device_class("mig", DRIVER_NAME)
        .await
        .unwrap();
    Node {
        cluster,
        _plugin: plugin,
        _host: host,
    }
}

async fn published(r: &Node, what: &str, done: impl Fn(&[Device]) -> bool) -> Vec<Device> {
    wait_for_devices(&r.cluster.client(), DRIVER_NAME, what, done).await
}

fn groups_of(devices: &[Device], name: &str) -> Vec<String> {
    let device = devices.iter().find(|d| d.name == name).unwrap();
    device.consumes_counters.as_ref().unwrap()[0]
        .compatibility_groups
        .clone()
        .unwrap_or_default()
}

/// A claim with one request per profile (the allocator picks the placements).
async fn claim_profiles(r: &Node, name: &str, profiles: &[&str]) -> Result<(), ClusterError> {
    let mut claim = NewClaim::new("default", name);
    for (i, profile) in profiles.iter().enumerate() {
        let attributes = format!("device.attributes['{DRIVER_NAME}']");
        claim = claim.request(&format!("r{i}"), "mig").selector(&format!(
            "has({attributes}.profile) && {attributes}.profile == '{profile}'"
        ));
    }
    r.cluster.create_claim(claim).await?;
    r.cluster.allocate("default", name).await.map(|_| ())
}

#[tokio::test]
async fn before_r510_a_4g_and_a_3g_never_share_a_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let r = start_on(&r470_profile(dir.path()), "v1.37.0").await;
    let devices = published(&r, "the A100's partitions", |d| {
        d.iter().any(|d| d.name == FOUR_G)
    })
    .await;
    assert_eq!(groups_of(&devices, FOUR_G), ["half-4c"]);
    assert_eq!(groups_of(&devices, THREE_G_HIGH), ["half-3c"]);
    assert_eq!(groups_of(&devices, ONE_G), ["half-4c", "half-3c"]);

    // In one claim: the counters would allow 4g at 0:4 with 3g at 4:4; the groups do not.
    let error = claim_profiles(&r, "halves", &["4g.20gb", "3g.20gb"])
        .await
        .unwrap_err();
    assert_contains(error.to_string(), "cannot allocate all claims");
    // Layouts that driver allows: two 3g; then nothing fits next to them.
    claim_profiles(&r, "threes", &["3g.20gb", "3g.20gb"])
        .await
        .unwrap();
    assert!(
        claim_profiles(&r, "one", &["1g.5gb"]).await.is_err(),
        "the 3g instances hold every memory slice"
    );
}

#[tokio::test]
async fn before_r510_the_groups_hold_across_claims() {
    let dir = tempfile::tempdir().unwrap();
    let r = start_on(&r470_profile(dir.path()), "v1.37.0").await;
    published(&r, "the A100's partitions", |d| {
        d.iter().any(|d| d.name == FOUR_G)
    })
    .await;
    claim_profiles(&r, "four", &["4g.20gb"]).await.unwrap();
    // 3g at 0:4 overlaps the 4g; 3g at 4:4 fits the counters but not the groups.
    let error = claim_profiles(&r, "three", &["3g.20gb"]).await.unwrap_err();
    assert_contains(
        error.to_string(),
        "(1 without enough shared counters, 1 with incompatible compatibility groups)",
    );
    // A 1g instance next to the 4g: allowed.
    claim_profiles(&r, "one", &["1g.5gb"]).await.unwrap();
}

#[tokio::test]
async fn from_r510_the_counters_alone_decide() {
    let r = start_on("mixed", "v1.37.0").await;
    let devices = published(&r, "the A100's partitions", |d| {
        d.iter().any(|d| d.name == FOUR_G)
    })
    .await;
    assert!(groups_of(&devices, FOUR_G).is_empty(), "no groups on R535");
    claim_profiles(&r, "halves", &["4g.20gb", "3g.20gb"])
        .await
        .unwrap();
}

#[tokio::test]
async fn a_server_before_1_37_gets_no_partitions_that_need_groups() {
    // A 1.36 server drops compatibilityGroups: published without them, the scheduler could
    // put a 4g and a 3g together, so the SDK withholds the partitions carrying groups and
    // publishes the rest of the node.
    let dir = tempfile::tempdir().unwrap();
    let r = start_on(&r470_profile(dir.path()), "v1.36.2").await;
    published(&r, "the T4", |d| d.iter().any(|d| d.name == "gpu-0")).await;
    // The GPU pools are published on their own: give them time to show up if they were
    // going to.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let devices = published(&r, "the T4", |d| d.iter().any(|d| d.name == "gpu-0")).await;
    assert!(
        devices.iter().all(|d| !d.name.starts_with("gpu-1-mig-")),
        "{:?}",
        devices.iter().map(|d| &d.name).collect::<Vec<_>>()
    );
}
