//! Disk faults under a running plugin, through the kubelet's socket: the CDI directory or the
//! checkpoint directory full (`ENOSPC`), read-only (`EROFS`) or removed, and a file replaced by
//! a directory (`EISDIR`). Each time, prepare fails the claims the fault touches, with a
//! message naming the path and the errno; nothing partial is left (no temporary file, no spec
//! without a record, no record claiming a prepared claim without its spec); the checkpoint
//! stays readable; and once the fault clears the next prepare and unprepare succeed without a
//! restart.
//!
//! The full and read-only file systems are real mounts (a size-limited tmpfs, a read-only bind
//! mount) in a private mount namespace: each such test re-executes itself under `unshare`
//! (`dra_sdk_testing::faults::disk`), so the kernel's own errors reach the plugin.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dra_sdk::advanced::cdi::SpecWriter;
use dra_sdk::advanced::checkpoint::{Checkpoint, ClaimRecord};
use dra_sdk::claim::ClaimRef;
use dra_sdk::plugin::KubeletPlugin;
use dra_sdk_testing::assert_contains;
use dra_sdk_testing::claims::AllocatedClaim;
use dra_sdk_testing::cluster::{BOOT_ID, NODE_NAME, TestCluster, claim_ref};
use dra_sdk_testing::faults::disk::{self, MountNamespace};
use dra_sdk_testing::kubelet::{KubeletVersion, RegisteredPlugin};
use dra_sdk_testing::sample_driver::{DRIVER, GpuDriver};

/// Room for the plugin's files (sockets, lock files, a checkpoint, a few specs); [`disk::fill`]
/// takes the rest.
const TMPFS_SIZE: u64 = 256 * 1024;

const ENOSPC: &str = "No space left on device (os error 28)";
const EROFS: &str = "Read-only file system (os error 30)";
const ENOENT: &str = "No such file or directory (os error 2)";
const EISDIR: &str = "Is a directory (os error 21)";

/// A plugin of the sample GPU driver on a test cluster, registered with a 1.36 kubelet.
struct Node {
    plugin: KubeletPlugin,
    kubelet: RegisteredPlugin,
    cdi: SpecWriter,
    cluster: TestCluster,
}

impl Node {
    async fn start(cluster: TestCluster) -> Node {
        let plugin = cluster
            .plugin(GpuDriver::default(), DRIVER)
            .start()
            .await
            .unwrap();
        let kubelet = cluster
            .register(&plugin, KubeletVersion::V1_36)
            .await
            .unwrap();
        let kind = format!("k8s.{DRIVER}/gpu").parse().unwrap();
        let cdi = SpecWriter::new(cluster.cdi_root(), kind);
        Node {
            plugin,
            kubelet,
            cdi,
            cluster,
        }
    }

    fn data_dir(&self) -> PathBuf {
        data_dir(&self.cluster)
    }

    fn checkpoint_path(&self) -> PathBuf {
        self.data_dir().join("checkpoint.json")
    }

    fn spec_path(&self, claim: &ClaimRef) -> PathBuf {
        self.cdi.spec_path(&claim.uid).unwrap()
    }

    async fn claim(&self, name: &str, device: &str) -> ClaimRef {
        let claim = AllocatedClaim::new("default", name)
            .device("gpu", DRIVER, NODE_NAME, device)
            .create(&self.cluster.client())
            .await
            .unwrap();
        claim_ref(&claim).unwrap()
    }

    /// Prepares `claims` in one call; the error message of each that failed.
    async fn prepare(&self, claims: &[&ClaimRef]) -> BTreeMap<String, Result<(), String>> {
        let claims: Vec<ClaimRef> = claims.iter().map(|&claim| claim.clone()).collect();
        let outcome = self.kubelet.prepare(&claims).await.unwrap();
        outcome
            .into_iter()
            .map(|(uid, result)| (uid, result.map(drop)))
            .collect()
    }

    async fn unprepare(&self, claims: &[&ClaimRef]) -> BTreeMap<String, Result<(), String>> {
        let claims: Vec<ClaimRef> = claims.iter().map(|&claim| claim.clone()).collect();
        self.kubelet.unprepare(&claims).await.unwrap()
    }

    /// Prepares a claim and asserts it succeeded with its spec written.
    async fn prepared(&self, claim: &ClaimRef) {
        let outcome = self.prepare(&[claim]).await;
        assert_eq!(outcome[&claim.uid], Ok(()), "prepare of {claim}");
        assert!(self.spec_path(claim).is_file(), "no spec for {claim}");
    }

    /// Prepares `claim` until it succeeds (at most 10 s); the time it took.
    async fn recovers(&self, claim: &ClaimRef) -> Duration {
        let start = Instant::now();
        loop {
            let outcome = self.prepare(&[claim]).await;
            if outcome[&claim.uid].is_ok() {
                assert!(self.spec_path(claim).is_file(), "no spec for {claim}");
                return start.elapsed();
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "prepare still fails after the fault cleared: {outcome:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Nothing partial on disk: no temporary file in either directory, the checkpoint readable
    /// and intact, every completed claim with its spec, every spec with a record. Returns the
    /// records.
    fn assert_consistent(&self) -> BTreeMap<String, ClaimRecord> {
        for dir in [self.cluster.cdi_root(), self.data_dir()] {
            let temps = disk::temporary_files(&dir).unwrap();
            assert!(temps.is_empty(), "left in {}: {temps:?}", dir.display());
        }
        let records = read_checkpoint(&self.checkpoint_path());
        for (uid, record) in &records {
            if record.is_completed() {
                assert!(
                    self.cdi.spec_path(uid).unwrap().is_file(),
                    "claim {uid} is recorded as prepared but has no spec"
                );
            }
        }
        for uid in self.cdi.claim_uids().unwrap() {
            assert!(
                records.contains_key(&uid),
                "a spec of claim {uid} that no record knows"
            );
        }
        records
    }

    async fn shutdown(self) -> TestCluster {
        self.plugin.shutdown().await.unwrap();
        self.cluster
    }
}

fn data_dir(cluster: &TestCluster) -> PathBuf {
    cluster.plugins_dir().join(DRIVER)
}

/// The checkpoint as the next start would read it: a copy, opened by a `Checkpoint` of its
/// own (the directory itself may be read-only, and opening it there would write), which must
/// find it intact.
fn read_checkpoint(path: &Path) -> BTreeMap<String, ClaimRecord> {
    let copy = tempfile::tempdir().unwrap();
    std::fs::copy(path, copy.path().join("checkpoint.json"))
        .unwrap_or_else(|err| panic!("the checkpoint {} is unreadable: {err}", path.display()));
    let (checkpoint, report) = Checkpoint::open(copy.path(), BOOT_ID).unwrap();
    assert!(
        report.is_clean() && !report.created,
        "the checkpoint is not intact: {report:?}"
    );
    checkpoint.records().unwrap()
}

fn fails_with<'a>(outcome: &'a BTreeMap<String, Result<(), String>>, claim: &ClaimRef) -> &'a str {
    match &outcome[&claim.uid] {
        Err(message) => {
            println!("{claim}: {message}");
            message
        }
        Ok(()) => panic!("{claim} was prepared despite the fault: {outcome:?}"),
    }
}

/// Runs an async scenario in the private mount namespace of a re-executed test.
fn in_mount_namespace<F: Future<Output = ()>>(scenario: impl FnOnce(MountNamespace) -> F) {
    disk::in_mount_namespace(|&mounts| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(scenario(mounts));
    })
    .unwrap_or_else(|err| panic!("{err}"));
}

#[test]
fn a_full_cdi_directory_fails_only_that_claim_naming_the_path_and_errno_and_the_next_prepare_succeeds()
 {
    in_mount_namespace(|mounts| async move {
        let cluster = TestCluster::start().await.unwrap();
        let tmpfs = mounts.tmpfs(&cluster.cdi_root(), TMPFS_SIZE).unwrap();
        let node = Node::start(cluster).await;
        let before = node.claim("before", "gpu-0").await;
        let during = node.claim("during", "gpu-1").await;
        node.prepared(&before).await;

        let filler = disk::fill(&node.cluster.cdi_root()).unwrap();
        let outcome = node.prepare(&[&before, &during]).await;
        // The claim already prepared needs no space: the checkpoint answers it.
        assert_eq!(outcome[&before.uid], Ok(()), "{outcome:?}");
        let message = fails_with(&outcome, &during);
        assert_contains(message, node.spec_path(&during).display().to_string());
        assert_contains(message, ENOSPC);
        let records = node.assert_consistent();
        assert!(!node.spec_path(&during).exists());
        assert!(records.get(&during.uid).is_none_or(|r| !r.is_completed()));
        // Removing a spec needs no space either.
        assert_eq!(node.unprepare(&[&before]).await[&before.uid], Ok(()));
        assert!(!node.spec_path(&before).exists());

        filler.release().unwrap();
        let took = node.recovers(&during).await;
        println!("full CDI directory: prepared {took:?} after the space came back");
        node.assert_consistent();
        assert_eq!(node.unprepare(&[&during]).await[&during.uid], Ok(()));
        node.assert_consistent();
        let _cluster = node.shutdown().await;
        tmpfs.unmount().unwrap();
    });
}

#[test]
fn a_full_checkpoint_directory_fails_prepare_and_unprepare_naming_the_checkpoint_and_errno_and_both_succeed_once_cleared()
 {
    in_mount_namespace(|mounts| async move {
        let cluster = TestCluster::start().await.unwrap();
        let tmpfs = mounts.tmpfs(&data_dir(&cluster), TMPFS_SIZE).unwrap();
        let node = Node::start(cluster).await;
        let before = node.claim("before", "gpu-0").await;
        let during = node.claim("during", "gpu-1").await;
        node.prepared(&before).await;

        let filler = disk::fill(&node.data_dir()).unwrap();
        let checkpoint = node.checkpoint_path().display().to_string();
        let outcome = node.prepare(&[&before, &during]).await;
        assert_eq!(outcome[&before.uid], Ok(()), "{outcome:?}");
        let message = fails_with(&outcome, &during);
        assert_contains(message, &checkpoint);
        assert_contains(message, ENOSPC);
        let unprepared = node.unprepare(&[&before]).await;
        let message = unprepared[&before.uid].as_ref().unwrap_err();
        assert_contains(message, &checkpoint);
        assert_contains(message, ENOSPC);
        let records = node.assert_consistent();
        assert!(!node.spec_path(&during).exists());
        assert!(!records.contains_key(&during.uid), "{records:?}");
        assert!(records[&before.uid].is_completed(), "{records:?}");

        filler.release().unwrap();
        let took = node.recovers(&during).await;
        println!("full checkpoint directory: prepared {took:?} after the space came back");
        assert_eq!(node.unprepare(&[&before]).await[&before.uid], Ok(()));
        let records = node.assert_consistent();
        assert_eq!(records.keys().collect::<Vec<_>>(), [&during.uid]);
        let _cluster = node.shutdown().await;
        tmpfs.unmount().unwrap();
    });
}

#[test]
fn a_read_only_cdi_directory_fails_prepare_and_unprepare_naming_the_path_and_errno_and_both_succeed_once_writable()
 {
    in_mount_namespace(|mounts| async move {
        let node = Node::start(TestCluster::start().await.unwrap()).await;
        let before = node.claim("before", "gpu-0").await;
        let during = node.claim("during", "gpu-1").await;
        node.prepared(&before).await;

        let read_only = mounts.read_only(&node.cluster.cdi_root()).unwrap();
        let outcome = node.prepare(&[&before, &during]).await;
        assert_eq!(outcome[&before.uid], Ok(()), "{outcome:?}");
        let message = fails_with(&outcome, &during);
        assert_contains(message, node.spec_path(&during).display().to_string());
        assert_contains(message, EROFS);
        let unprepared = node.unprepare(&[&before]).await;
        let message = unprepared[&before.uid].as_ref().unwrap_err();
        assert_contains(message, node.spec_path(&before).display().to_string());
        assert_contains(message, EROFS);
        let records = node.assert_consistent();
        assert!(!node.spec_path(&during).exists());
        assert!(records.get(&during.uid).is_none_or(|r| !r.is_completed()));

        read_only.unmount().unwrap();
        let took = node.recovers(&during).await;
        println!("read-only CDI directory: prepared {took:?} after it became writable");
        assert_eq!(node.unprepare(&[&before]).await[&before.uid], Ok(()));
        assert!(!node.spec_path(&before).exists());
        node.assert_consistent();
        node.shutdown().await;
    });
}

#[test]
fn a_read_only_checkpoint_directory_fails_prepare_and_unprepare_naming_the_checkpoint_and_errno_and_both_succeed_once_writable()
 {
    in_mount_namespace(|mounts| async move {
        let node = Node::start(TestCluster::start().await.unwrap()).await;
        let before = node.claim("before", "gpu-0").await;
        let during = node.claim("during", "gpu-1").await;
        node.prepared(&before).await;

        let read_only = mounts.read_only(&node.data_dir()).unwrap();
        let checkpoint = node.checkpoint_path().display().to_string();
        let outcome = node.prepare(&[&before, &during]).await;
        assert_eq!(outcome[&before.uid], Ok(()), "{outcome:?}");
        let message = fails_with(&outcome, &during);
        assert_contains(message, &checkpoint);
        assert_contains(message, EROFS);
        let unprepared = node.unprepare(&[&before]).await;
        let message = unprepared[&before.uid].as_ref().unwrap_err();
        assert_contains(message, &checkpoint);
        assert_contains(message, EROFS);
        let records = node.assert_consistent();
        assert!(!records.contains_key(&during.uid), "{records:?}");
        assert!(records[&before.uid].is_completed(), "{records:?}");

        read_only.unmount().unwrap();
        let took = node.recovers(&during).await;
        println!("read-only checkpoint directory: prepared {took:?} after it became writable");
        assert_eq!(node.unprepare(&[&before]).await[&before.uid], Ok(()));
        node.assert_consistent();
        node.shutdown().await;
    });
}

/// The CDI root removed under the plugin (a cleanup script, an operator) is created again by
/// the next write: nothing to clear.
#[tokio::test]
async fn a_removed_cdi_directory_is_created_again_by_the_next_prepare() {
    let node = Node::start(TestCluster::start().await.unwrap()).await;
    let before = node.claim("before", "gpu-0").await;
    let during = node.claim("during", "gpu-1").await;
    node.prepared(&before).await;

    std::fs::remove_dir_all(node.cluster.cdi_root()).unwrap();
    // Its spec went with the directory; unprepare does not mind.
    assert_eq!(node.unprepare(&[&before]).await[&before.uid], Ok(()));
    node.prepared(&during).await;
    node.assert_consistent();
    node.shutdown().await;
}

/// The plugin's data directory removed under it (the checkpoint, its lock files and the DRA
/// socket with it; the kubelet's connection stays open): the checkpoint cannot be written, and
/// once the directory is back the checkpoint is written again from memory, claims prepared
/// before included.
#[tokio::test]
async fn a_removed_checkpoint_directory_fails_prepare_naming_the_checkpoint_and_errno_and_the_next_prepare_succeeds_once_it_is_back()
 {
    let node = Node::start(TestCluster::start().await.unwrap()).await;
    let before = node.claim("before", "gpu-0").await;
    let during = node.claim("during", "gpu-1").await;
    node.prepared(&before).await;

    std::fs::remove_dir_all(node.data_dir()).unwrap();
    let checkpoint = node.checkpoint_path().display().to_string();
    let outcome = node.prepare(&[&during]).await;
    let message = fails_with(&outcome, &during);
    assert_contains(message, &checkpoint);
    assert_contains(message, ENOENT);
    let unprepared = node.unprepare(&[&before]).await;
    let message = unprepared[&before.uid].as_ref().unwrap_err();
    assert_contains(message, &checkpoint);
    assert_contains(message, ENOENT);
    assert!(!node.spec_path(&during).exists());
    assert!(node.spec_path(&before).exists());

    std::fs::create_dir(node.data_dir()).unwrap();
    let took = node.recovers(&during).await;
    println!("removed checkpoint directory: prepared {took:?} after it was back");
    let records = node.assert_consistent();
    assert!(records[&before.uid].is_completed(), "{records:?}");
    assert_eq!(node.unprepare(&[&before]).await[&before.uid], Ok(()));
    node.assert_consistent();
    node.shutdown().await;
}

#[tokio::test]
async fn a_checkpoint_replaced_by_a_directory_fails_naming_it_and_the_errno_and_is_written_again_from_memory_once_cleared()
 {
    let node = Node::start(TestCluster::start().await.unwrap()).await;
    let before = node.claim("before", "gpu-0").await;
    let during = node.claim("during", "gpu-1").await;
    node.prepared(&before).await;

    let fault = disk::replace_with_directory(&node.checkpoint_path()).unwrap();
    let checkpoint = node.checkpoint_path().display().to_string();
    // The checkpoint is the only record of what is prepared: without it no claim is served.
    let outcome = node.prepare(&[&before, &during]).await;
    for claim in [&before, &during] {
        let message = fails_with(&outcome, claim);
        assert_contains(message, &checkpoint);
        assert_contains(message, EISDIR);
    }
    let unprepared = node.unprepare(&[&before]).await;
    let message = unprepared[&before.uid].as_ref().unwrap_err();
    assert_contains(message, &checkpoint);
    assert_contains(message, EISDIR);
    assert!(!node.spec_path(&during).exists());
    assert!(node.spec_path(&before).exists());

    fault.clear().unwrap();
    let took = node.recovers(&during).await;
    println!("checkpoint replaced by a directory: prepared {took:?} after it was removed");
    let records = node.assert_consistent();
    assert!(records[&before.uid].is_completed(), "{records:?}");
    assert_eq!(node.unprepare(&[&before]).await[&before.uid], Ok(()));
    node.assert_consistent();
    node.shutdown().await;
}

#[tokio::test]
async fn a_cdi_spec_path_replaced_by_a_directory_fails_only_that_claim_naming_it_and_the_errno_until_cleared()
 {
    let node = Node::start(TestCluster::start().await.unwrap()).await;
    let blocked = node.claim("blocked", "gpu-0").await;
    let other = node.claim("other", "gpu-1").await;

    let fault = disk::replace_with_directory(&node.spec_path(&blocked)).unwrap();
    let outcome = node.prepare(&[&blocked, &other]).await;
    assert_eq!(outcome[&other.uid], Ok(()), "{outcome:?}");
    let message = fails_with(&outcome, &blocked);
    assert_contains(message, node.spec_path(&blocked).display().to_string());
    assert_contains(message, EISDIR);
    // The directory is not the plugin's to delete: unprepare fails on it too.
    let unprepared = node.unprepare(&[&blocked]).await;
    let message = unprepared[&blocked.uid].as_ref().unwrap_err();
    assert_contains(message, node.spec_path(&blocked).display().to_string());
    assert_contains(message, EISDIR);
    assert!(node.spec_path(&blocked).is_dir());
    for dir in [node.cluster.cdi_root(), node.data_dir()] {
        assert_eq!(disk::temporary_files(&dir).unwrap(), Vec::<String>::new());
    }

    fault.clear().unwrap();
    let took = node.recovers(&blocked).await;
    println!("CDI spec path replaced by a directory: prepared {took:?} after it was removed");
    node.assert_consistent();
    let unprepared = node.unprepare(&[&blocked, &other]).await;
    assert!(unprepared.values().all(Result::is_ok), "{unprepared:?}");
    node.assert_consistent();
    node.shutdown().await;
}
