//! Several writers on one checkpoint: two instances of a rolling update (in one process and in
//! two processes), threads sharing an instance, a peer that holds the lock, and a writer killed
//! at an arbitrary point.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use dra_sdk::advanced::checkpoint::{
    Checkpoint, CheckpointError, ClaimChange, ClaimRecord, PreparedDeviceRecord,
};

const BOOT: &str = "boot-concurrency";

/// Set in the environment of child processes: the checkpoint directory they write to.
const CHILD_DIR_ENV: &str = "DRA_SDK_CHECKPOINT_CHILD_DIR";
/// Set in the environment of child processes: their writer name.
const CHILD_NAME_ENV: &str = "DRA_SDK_CHECKPOINT_CHILD_NAME";
/// Set in the environment of child processes: how many claims to write (0: until killed).
const CHILD_COUNT_ENV: &str = "DRA_SDK_CHECKPOINT_CHILD_COUNT";

fn record(name: &str) -> ClaimRecord {
    ClaimRecord::started("ns", name).into_completed(vec![PreparedDeviceRecord::new("p", name)])
}

fn uids(checkpoint: &Checkpoint) -> BTreeSet<String> {
    checkpoint.records().unwrap().into_keys().collect()
}

#[test]
fn two_instances_interleaving_never_lose_each_others_claims() {
    let dir = tempfile::tempdir().unwrap();
    let (old, _) = Checkpoint::open(dir.path(), BOOT).unwrap();
    let (new, report) = Checkpoint::open(dir.path(), BOOT).unwrap();
    assert!(report.is_clean(), "{report:?}");

    old.update([ClaimChange::put("a", record("a"))]).unwrap();
    new.update([ClaimChange::put("b", record("b"))]).unwrap();
    // Prepared by the old instance, seen and unprepared by the new one.
    assert_eq!(new.get("a").unwrap(), Some(record("a")));
    old.update([
        ClaimChange::put("c", record("c")),
        ClaimChange::put("d", record("d")),
    ])
    .unwrap();
    new.update([ClaimChange::remove("a")]).unwrap();
    old.update([ClaimChange::put("e", record("e"))]).unwrap();

    let expected: BTreeSet<String> = ["b", "c", "d", "e"].map(String::from).into();
    assert_eq!(uids(&old), expected);
    assert_eq!(uids(&new), expected);
    assert_eq!(old.get("a").unwrap(), None);
    drop((old, new));
    let (reopened, _) = Checkpoint::open(dir.path(), BOOT).unwrap();
    assert_eq!(uids(&reopened), expected);
}

#[test]
fn concurrent_updates_from_threads_and_instances_are_all_kept() {
    const THREADS_PER_INSTANCE: usize = 4;
    const CLAIMS_PER_THREAD: usize = 25;
    let dir = tempfile::tempdir().unwrap();
    let instances: Vec<Arc<Checkpoint>> = (0..2)
        .map(|_| Arc::new(Checkpoint::open(dir.path(), BOOT).unwrap().0))
        .collect();
    let start = Arc::new(Barrier::new(2 * THREADS_PER_INSTANCE));
    let workers: Vec<_> = (0..2 * THREADS_PER_INSTANCE)
        .map(|worker| {
            let checkpoint = Arc::clone(&instances[worker % 2]);
            let start = Arc::clone(&start);
            thread::spawn(move || {
                start.wait();
                for i in 0..CLAIMS_PER_THREAD {
                    let uid = format!("w{worker}-{i}");
                    // Prepare in two steps, like the pipeline, and drop every third claim again.
                    checkpoint
                        .update([ClaimChange::put(&uid, ClaimRecord::started("ns", &uid))])
                        .unwrap();
                    checkpoint
                        .update([ClaimChange::put(&uid, record(&uid))])
                        .unwrap();
                    assert!(checkpoint.get(&uid).unwrap().unwrap().is_completed());
                    if i % 3 == 0 {
                        checkpoint.update([ClaimChange::remove(&uid)]).unwrap();
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }

    let expected: BTreeSet<String> = (0..2 * THREADS_PER_INSTANCE)
        .flat_map(|worker| {
            (0..CLAIMS_PER_THREAD)
                .filter(|i| i % 3 != 0)
                .map(move |i| format!("w{worker}-{i}"))
        })
        .collect();
    for checkpoint in &instances {
        assert_eq!(uids(checkpoint), expected);
    }
}

#[test]
fn a_peer_holding_the_lock_makes_updates_time_out_not_hang() {
    let dir = tempfile::tempdir().unwrap();
    let (checkpoint, _) = Checkpoint::open(dir.path(), BOOT).unwrap();
    let checkpoint = checkpoint.with_lock_timeout(Duration::from_millis(50));
    let peer: File = OpenOptions::new()
        .write(true)
        .open(dir.path().join("checkpoint.lock"))
        .unwrap();
    peer.lock().unwrap();

    let started = Instant::now();
    let err = checkpoint
        .update([ClaimChange::put("a", record("a"))])
        .unwrap_err();
    assert!(
        matches!(err, CheckpointError::LockTimeout { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("checkpoint.lock"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
    // Reads of an unchanged file need no lock.
    assert_eq!(checkpoint.get("a").unwrap(), None);

    peer.unlock().unwrap();
    checkpoint
        .update([ClaimChange::put("a", record("a"))])
        .unwrap();
    assert!(checkpoint.get("a").unwrap().is_some());
}

/// Spawns this test binary to run only [`child_writer`], which writes claims to `dir`.
fn spawn_writer(dir: &Path, name: &str, count: usize) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_writer", "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR_ENV, dir)
        .env(CHILD_NAME_ENV, name)
        .env(CHILD_COUNT_ENV, count.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// Not a test on its own: the body of the child processes of the tests below. Does nothing
/// unless started by [`spawn_writer`].
#[test]
fn child_writer() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let name = std::env::var(CHILD_NAME_ENV).unwrap();
    let count: usize = std::env::var(CHILD_COUNT_ENV).unwrap().parse().unwrap();
    let (checkpoint, _) = Checkpoint::open(Path::new(&dir), BOOT).unwrap();
    let mut i = 0;
    while count == 0 || i < count {
        let uid = format!("{name}-{i}");
        checkpoint
            .update([ClaimChange::put(&uid, ClaimRecord::started("ns", &uid))])
            .unwrap();
        checkpoint
            .update([ClaimChange::put(&uid, record(&uid))])
            .unwrap();
        i += 1;
    }
}

#[test]
fn two_processes_writing_at_once_keep_all_claims() {
    const COUNT: usize = 40;
    let dir = tempfile::tempdir().unwrap();
    let children = [
        spawn_writer(dir.path(), "old", COUNT),
        spawn_writer(dir.path(), "new", COUNT),
    ];
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    let (checkpoint, report) = Checkpoint::open(dir.path(), BOOT).unwrap();
    assert!(report.is_clean(), "{report:?}");
    let records = checkpoint.records().unwrap();
    assert_eq!(records.len(), 2 * COUNT);
    assert!(records.values().all(ClaimRecord::is_completed));
}

#[test]
fn a_writer_killed_at_any_point_leaves_a_valid_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..3 {
        let mut child = spawn_writer(dir.path(), &format!("round{round}"), 0);
        // Kill it once it is busy writing, at a moment that varies from round to round.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !dir.path().join("checkpoint.json").exists() {
            assert!(Instant::now() < deadline, "child never wrote");
            thread::sleep(Duration::from_millis(5));
        }
        thread::sleep(Duration::from_millis(20 + 17 * round));
        child.kill().unwrap();
        child.wait().unwrap();

        let (checkpoint, report) = Checkpoint::open(dir.path(), BOOT).unwrap();
        assert!(report.corrupt_moved_to.is_none(), "{report:?}");
        assert!(report.is_clean(), "{report:?}");
        let records = checkpoint.records().unwrap();
        assert!(
            records
                .keys()
                .any(|uid| uid.starts_with(&format!("round{round}-"))),
            "the child wrote before it was killed"
        );
        // Only the claim being written when the child died can be half-way (started, not
        // completed).
        let started = records
            .iter()
            .filter(|(uid, r)| uid.starts_with(&format!("round{round}-")) && !r.is_completed())
            .count();
        assert!(started <= 1, "{started} claims left in PrepareStarted");
        for leftover in std::fs::read_dir(dir.path()).unwrap() {
            let name = leftover.unwrap().file_name();
            assert!(
                !name.to_string_lossy().contains(".tmp-"),
                "temp file {name:?} survived open"
            );
        }
    }
}
