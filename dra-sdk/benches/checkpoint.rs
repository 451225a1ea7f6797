//! Cost of the checkpoint operations on the prepare path, on the disk that holds `target/`
//! (ext4 here), not on tmpfs.
//!
//! `cargo bench -p dra-sdk --bench checkpoint`; set `CHECKPOINT_BENCH_DIR` to measure on another
//! file system (e.g. `/dev/shm` to see the CPU cost alone).

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use dra_sdk::advanced::checkpoint::{Checkpoint, ClaimChange, ClaimRecord, PreparedDeviceRecord};
use serde_json::json;

const BOOT: &str = "4aa5e138-5a24-4e64-9b5c-cb9e08c7014f";

/// A completed claim shaped like a GPU driver's: two devices with CDI IDs, some driver state.
fn claim(i: usize, generation: u64) -> (String, ClaimRecord) {
    let uid = format!("5b2f6a3e-1c4d-4e8f-9a0b-{i:012}");
    let devices = (0..2)
        .map(|d| PreparedDeviceRecord {
            request_names: vec!["gpu".into()],
            cdi_device_ids: vec![format!("k8s.gpu.nvidia.com/claim={uid}-gpu-{d}")],
            ..PreparedDeviceRecord::new("node-a", format!("gpu-{d}"))
        })
        .collect();
    let record = ClaimRecord::started("team-a", format!("training-job-{i}-gpu"))
        .with_driver_state(json!({
            "mig": { "parentUUID": "GPU-8b7e3c1a-4f2d-11ee-be56-0242ac120002", "gi": 1, "ci": 0 },
            "generation": generation,
        }))
        .into_completed(devices);
    (uid, record)
}

fn batch(claims: usize, generation: u64) -> Vec<ClaimChange> {
    (0..claims)
        .map(|i| {
            let (uid, record) = claim(i, generation);
            ClaimChange::put(uid, record)
        })
        .collect()
}

fn benches(c: &mut Criterion) {
    let parent = std::env::var("CHECKPOINT_BENCH_DIR")
        .unwrap_or_else(|_| env!("CARGO_TARGET_TMPDIR").into());
    let dir = tempfile::tempdir_in(parent).unwrap();
    let (checkpoint, _) = Checkpoint::open(dir.path(), BOOT).unwrap();
    let (peer, _) = Checkpoint::open(dir.path(), BOOT).unwrap();
    let mut generation = 0;

    let mut group = c.benchmark_group("checkpoint");
    group
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));

    for claims in [1, 100] {
        group.bench_function(format!("update/batch_of_{claims}"), |b| {
            b.iter(|| {
                generation += 1;
                checkpoint.update(batch(claims, generation)).unwrap();
            })
        });
    }
    // Steady state: 100 claims recorded, one changes (a prepare of a single claim).
    checkpoint.update(batch(100, 0)).unwrap();
    group.bench_function("update/1_of_100", |b| {
        b.iter(|| {
            generation += 1;
            let (uid, record) = claim(7, generation);
            checkpoint.update([ClaimChange::put(uid, record)]).unwrap();
        })
    });
    let (known, _) = claim(42, 0);
    group.bench_function("get/unchanged_file_100", |b| {
        b.iter(|| black_box(checkpoint.get(black_box(&known)).unwrap()))
    });
    group.bench_function("get/after_peer_write_100", |b| {
        b.iter_batched(
            || {
                generation += 1;
                let (uid, record) = claim(9, generation);
                peer.update([ClaimChange::put(uid, record)]).unwrap();
            },
            |()| black_box(checkpoint.get(&known).unwrap()),
            BatchSize::PerIteration,
        )
    });
    group.bench_function("update/1_of_100_after_peer_write", |b| {
        b.iter_batched(
            || {
                generation += 1;
                let (uid, record) = claim(9, generation);
                peer.update([ClaimChange::put(uid, record)]).unwrap();
                claim(8, generation)
            },
            |(uid, record)| checkpoint.update([ClaimChange::put(uid, record)]).unwrap(),
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(checkpoint_benches, benches);
criterion_main!(checkpoint_benches);
