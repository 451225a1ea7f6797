//! Two plugin instances on one node, as a DaemonSet rolling update with `maxSurge: 1` runs
//! them: one checkpoint, one CDI directory, two pairs of sockets. The old instance has a
//! prepare in flight while the new one starts, prepares a claim while the new one's recovery
//! runs, and both then serve overlapping calls for the same claims. The driver opts into
//! device metadata (KEP-5304), whose files the new instance's start-up sweep treats like CDI
//! specs.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dra_sdk::advanced::checkpoint::{Checkpoint, ClaimChange, ClaimRecord, ClaimState};
use dra_sdk::advanced::metadata::{MetadataClaim, MetadataDevice, MetadataWriter};
use dra_sdk::claim::{Claim, ClaimRef, DriverError, RecordedClaim};
use dra_sdk::config::ConfigRegistry;
use dra_sdk::driver::{Driver, PreparedClaim};
use dra_sdk_testing::claims::AllocatedClaim;
use dra_sdk_testing::cluster::{BOOT_ID, NODE_NAME, TestCluster, claim_ref};
use dra_sdk_testing::kubelet::KubeletVersion;
use tokio::sync::Notify;

use dra_sdk_testing::sample_driver::{DRIVER, GpuConfig, prepare_gpus};

/// A claim whose prepare was interrupted by a crash long before this test's instances ran.
const CRASHED_UID: &str = "0d0d0d0d-0000-4000-8000-000000000001";
/// A claim whose metadata a crashed instance left behind without a record: swept.
const ORPHAN_UID: &str = "0d0d0d0d-0000-4000-8000-000000000002";
/// A claim whose metadata was written, without a record yet, after the sweep began: kept.
const LATE_UID: &str = "0d0d0d0d-0000-4000-8000-000000000003";

/// A gate the test opens: the driver waits on it inside a hook.
#[derive(Default)]
struct Gate {
    entered: Notify,
    open: Notify,
}

/// What both instances' drivers share, as the node's hardware would be.
#[derive(Default)]
struct Node {
    /// Claim name -> how many times `prepare` ran for it.
    prepares: Mutex<HashMap<String, usize>>,
    /// Claim names `rollback` ran for.
    rolled_back: Mutex<Vec<String>>,
    /// Hooks that wait for the test, by hook and claim name (`prepare/in-flight`).
    gates: Mutex<HashMap<String, Arc<Gate>>>,
}

impl Node {
    fn gate(&self, claim: &str) -> Arc<Gate> {
        let mut gates = self.gates.lock().unwrap();
        Arc::clone(gates.entry(claim.to_owned()).or_default())
    }

    async fn pass(&self, claim: &str) {
        let gate = self.gates.lock().unwrap().get(claim).cloned();
        if let Some(gate) = gate {
            gate.entered.notify_one();
            gate.open.notified().await;
        }
    }
}

struct HandoverDriver {
    node: Arc<Node>,
}

#[async_trait::async_trait]
impl Driver for HandoverDriver {
    type Config = GpuConfig;

    fn config_registry(&self) -> ConfigRegistry<GpuConfig> {
        ConfigRegistry::new().register::<GpuConfig>()
    }

    fn device_metadata(&self) -> bool {
        true
    }

    async fn prepare(&self, claim: &Claim<GpuConfig>) -> Result<PreparedClaim, DriverError> {
        *self
            .node
            .prepares
            .lock()
            .unwrap()
            .entry(claim.claim.name.clone())
            .or_default() += 1;
        self.node
            .pass(&format!("prepare/{}", claim.claim.name))
            .await;
        // Long enough for two overlapping calls on one claim to overlap here.
        tokio::time::sleep(Duration::from_millis(30)).await;
        Ok(prepare_gpus(claim))
    }

    async fn unprepare(&self, _: &RecordedClaim) -> Result<(), DriverError> {
        Ok(())
    }

    async fn rollback(&self, recorded: &RecordedClaim) -> Result<(), DriverError> {
        let claim = &recorded.claim;
        self.node
            .rolled_back
            .lock()
            .unwrap()
            .push(claim.name.clone());
        self.node.pass(&format!("rollback/{}", claim.name)).await;
        Ok(())
    }
}

async fn gpu_claim(cluster: &TestCluster, name: &str) -> ClaimRef {
    let claim = AllocatedClaim::new("default", name)
        .device("gpu", DRIVER, NODE_NAME, "gpu-0")
        .create(&cluster.client())
        .await
        .unwrap();
    claim_ref(&claim).unwrap()
}

/// Whether the CDI root holds a spec file for the claim.
fn has_spec(cdi_root: &Path, uid: &str) -> bool {
    std::fs::read_dir(cdi_root).is_ok_and(|entries| {
        entries.flatten().any(|entry| {
            entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.ends_with(&format!("_{uid}.json")))
        })
    })
}

/// Whether the CDI root holds the metadata spec of the claim's `gpu` request.
fn has_metadata(cdi_root: &Path, uid: &str) -> bool {
    cdi_root
        .join(format!("{DRIVER}_metadata_{uid}_gpu.json"))
        .exists()
}

/// Writes a claim's metadata files as an instance would, without recording the claim.
fn write_unrecorded_metadata(cluster: &TestCluster, name: &str, uid: &str) {
    MetadataWriter::new(
        DRIVER,
        cluster.plugins_dir().join(DRIVER),
        cluster.cdi_root(),
    )
    .write_claim(
        &MetadataClaim::from(ClaimRef::new("default", name, uid)),
        &[MetadataDevice::new("gpu", NODE_NAME, "gpu-0")],
    )
    .unwrap();
}

fn states(cluster: &TestCluster) -> BTreeMap<String, ClaimState> {
    let (checkpoint, _) = Checkpoint::open(&cluster.plugins_dir().join(DRIVER), BOOT_ID).unwrap();
    checkpoint
        .records()
        .unwrap()
        .into_iter()
        .map(|(uid, record)| (uid, record.state))
        .collect()
}

async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), future)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_update_never_undoes_or_sweeps_the_other_instances_work() {
    let cluster = TestCluster::start().await.unwrap();
    let node = Arc::new(Node::default());
    let cdi_root = cluster.cdi_root();

    let old = cluster
        .plugin(
            HandoverDriver {
                node: Arc::clone(&node),
            },
            DRIVER,
        )
        .pod_uid("old-pod")
        .start()
        .await
        .unwrap();
    let old_kubelet = Arc::new(cluster.register(&old, KubeletVersion::V1_36).await.unwrap());

    // A claim the old instance prepared before the update: it must survive it.
    let before = gpu_claim(&cluster, "before").await;
    assert!(
        old_kubelet
            .prepare(std::slice::from_ref(&before))
            .await
            .unwrap()[&before.uid]
            .is_ok()
    );

    // A genuinely interrupted prepare (its instance died): the new instance rolls it back.
    {
        let (checkpoint, _) =
            Checkpoint::open(&cluster.plugins_dir().join(DRIVER), BOOT_ID).unwrap();
        checkpoint
            .update([ClaimChange::put(
                CRASHED_UID,
                ClaimRecord::started("default", "crashed"),
            )])
            .unwrap();
    }
    // Metadata a crashed instance wrote for a claim it never recorded.
    write_unrecorded_metadata(&cluster, "orphan", ORPHAN_UID);
    assert!(has_metadata(&cdi_root, ORPHAN_UID));

    // The old instance is in the middle of preparing `in-flight` when the new one starts.
    let in_flight = gpu_claim(&cluster, "in-flight").await;
    let in_flight_gate = node.gate("prepare/in-flight");
    let in_flight_call = {
        let kubelet = Arc::clone(&old_kubelet);
        let claim = in_flight.clone();
        tokio::spawn(async move { kubelet.prepare(&[claim]).await })
    };
    within(
        "prepare of in-flight starts",
        in_flight_gate.entered.notified(),
    )
    .await;

    // The new instance starts; its recovery stops in the rollback of the crashed claim, and
    // meanwhile the old instance prepares another claim from start to end.
    let crashed_gate = node.gate("rollback/crashed");
    let new_start = {
        let builder = cluster
            .plugin(
                HandoverDriver {
                    node: Arc::clone(&node),
                },
                DRIVER,
            )
            .pod_uid("new-pod");
        tokio::spawn(builder.start())
    };
    within(
        "rollback of crashed starts",
        crashed_gate.entered.notified(),
    )
    .await;
    let during = gpu_claim(&cluster, "during").await;
    assert!(
        old_kubelet
            .prepare(std::slice::from_ref(&during))
            .await
            .unwrap()[&during.uid]
            .is_ok()
    );
    assert!(has_spec(&cdi_root, &during.uid));
    assert!(has_metadata(&cdi_root, &during.uid));
    // Files written after the sweep began, by an instance that has not recorded the claim
    // yet: younger than the sweep, so they stay even though no record names the claim. (The
    // pause: file times come from the kernel's coarse clock, up to a tick behind.)
    tokio::time::sleep(Duration::from_millis(50)).await;
    write_unrecorded_metadata(&cluster, "late", LATE_UID);
    crashed_gate.open.notify_one();
    let new = within("new instance starts", new_start)
        .await
        .unwrap()
        .unwrap();
    let new_kubelet = cluster.register(&new, KubeletVersion::V1_36).await.unwrap();

    // The handover: the old instance finishes its in-flight prepare after the new one started.
    in_flight_gate.open.notify_one();
    let outcome = within("in-flight prepare", in_flight_call)
        .await
        .unwrap()
        .unwrap();
    assert!(outcome[&in_flight.uid].is_ok(), "{outcome:?}");

    let recorded = states(&cluster);
    for claim in [&before, &in_flight, &during] {
        assert_eq!(
            recorded.get(&claim.uid),
            Some(&ClaimState::PrepareCompleted),
            "{}: {recorded:?}",
            claim.name
        );
        assert!(
            has_spec(&cdi_root, &claim.uid),
            "the CDI spec of {} must survive the new instance's start",
            claim.name
        );
        assert!(
            has_metadata(&cdi_root, &claim.uid),
            "the device metadata of {} must survive the new instance's start",
            claim.name
        );
    }
    let host_dir = cluster
        .plugins_dir()
        .join(DRIVER)
        .join("dra-device-metadata");
    assert!(host_dir.join("default_during/gpu/metadata.json").exists());
    assert!(
        !has_metadata(&cdi_root, ORPHAN_UID) && !host_dir.join("default_orphan").exists(),
        "the sweep removes metadata no instance records, written before it began"
    );
    assert!(
        has_metadata(&cdi_root, LATE_UID)
            && host_dir.join("default_late/gpu/metadata.json").exists(),
        "the sweep keeps metadata written after it began"
    );
    assert!(!recorded.contains_key(CRASHED_UID));
    assert_eq!(
        *node.rolled_back.lock().unwrap(),
        ["crashed"],
        "only the dead instance's claim is rolled back, never the one the old instance was preparing"
    );

    // Overlapping calls for the same claims through both instances: each claim's prepare runs
    // once on the node, and an unprepare through one instance waits for the other's prepare.
    let mut shared = Vec::new();
    for i in 0..4 {
        shared.push(gpu_claim(&cluster, &format!("shared-{i}")).await);
    }
    let (from_old, from_new) =
        tokio::join!(old_kubelet.prepare(&shared), new_kubelet.prepare(&shared));
    for outcome in [from_old.unwrap(), from_new.unwrap()] {
        for claim in &shared {
            assert!(outcome[&claim.uid].is_ok(), "{outcome:?}");
        }
    }
    for claim in &shared {
        assert_eq!(
            node.prepares.lock().unwrap()[&claim.name],
            1,
            "{} was prepared by both instances at once",
            claim.name
        );
    }
    let (prepared_again, unprepared) = tokio::join!(
        old_kubelet.prepare(&shared[..2]),
        new_kubelet.unprepare(&shared)
    );
    prepared_again.unwrap();
    unprepared.unwrap();
    let recorded = states(&cluster);
    for claim in &shared {
        // Whichever ran last decides, but record and spec always agree.
        assert_eq!(
            recorded.contains_key(&claim.uid),
            has_spec(&cdi_root, &claim.uid),
            "{}: {recorded:?}",
            claim.name
        );
    }

    // The old instance goes away; the new one serves the claims it prepared.
    old.shutdown().await.unwrap();
    let outcome = new_kubelet
        .unprepare(&[before.clone(), in_flight.clone(), during.clone()])
        .await
        .unwrap();
    assert!(outcome.values().all(Result::is_ok), "{outcome:?}");
    for claim in [&before, &in_flight, &during] {
        assert!(!has_spec(&cdi_root, &claim.uid));
        assert!(!has_metadata(&cdi_root, &claim.uid));
    }
    new.shutdown().await.unwrap();
}
