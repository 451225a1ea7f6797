//! The checkpoint file on a real file system: round trips, format evolution, recovery from
//! corrupt files, other boots and interrupted writes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::{fs, io};

use dra_sdk::advanced::checkpoint::{
    Checkpoint, ClaimChange, ClaimRecord, ClaimState, Corruption, FORMAT_VERSION,
    PreparedDeviceRecord,
};
use dra_sdk_testing::assert_contains;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const BOOT: &str = "7f9e4c52-0b1d-4f5e-9a3c-2d6e8f1a0b4c";

fn completed(name: &str, device: &str) -> ClaimRecord {
    let device = PreparedDeviceRecord {
        request_names: vec!["gpu".into()],
        cdi_device_ids: vec![format!("k8s.gpu.example.com/claim={name}-{device}")],
        ..PreparedDeviceRecord::new("node-a", device)
    };
    ClaimRecord::started("team-a", name)
        .with_driver_state(json!({ "mig": { "gi": 1, "ci": 0 } }))
        .into_completed(vec![device])
}

/// A checkpoint file as another SDK version would write it, with a valid checksum over `data`.
fn handcrafted(version: u64, data: &Value, envelope_extra: &str) -> String {
    let data = serde_json::to_string(data).unwrap();
    let checksum = format!("sha256:{:x}", Sha256::digest(data.as_bytes()));
    format!(r#"{{"version":{version},"checksum":"{checksum}","data":{data}{envelope_extra}}}"#)
}

fn file_json(path: &Path) -> Value {
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

fn dir_entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn records_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let (checkpoint, report) = Checkpoint::open(dir.path(), BOOT).unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(checkpoint.path(), dir.path().join("checkpoint.json"));
    checkpoint
        .update([
            ClaimChange::put("uid-1", completed("claim-1", "gpu-0")),
            ClaimChange::put("uid-2", completed("claim-2", "gpu-1")),
        ])
        .unwrap();
    let before = checkpoint.records().unwrap();
    drop(checkpoint);

    let (reopened, report) = Checkpoint::open(dir.path(), BOOT).unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(reopened.records().unwrap(), before);
    assert_eq!(
        reopened.get("uid-2").unwrap(),
        Some(completed("claim-2", "gpu-1"))
    );
    assert_eq!(reopened.get("uid-3").unwrap(), None);

    let on_disk = file_json(reopened.path());
    assert_eq!(on_disk["version"], FORMAT_VERSION);
    assert_eq!(on_disk["data"]["bootId"], BOOT);
    assert!(on_disk["checksum"].as_str().unwrap().starts_with("sha256:"));
    assert_eq!(
        dir_entries(dir.path()),
        ["checkpoint.json", "checkpoint.lock"],
        "no temp files left behind"
    );
}

#[test]
fn started_and_completed_claims_are_told_apart_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (checkpoint, _) = Checkpoint::open(dir.path(), BOOT).unwrap();
    let started = ClaimRecord::started("team-a", "half-done").with_driver_state(json!("vfio"));
    checkpoint
        .update([
            ClaimChange::put("started", started.clone()),
            ClaimChange::put("done", completed("done", "gpu-0")),
        ])
        .unwrap();
    drop(checkpoint);

    let (restarted, _) = Checkpoint::open(dir.path(), BOOT).unwrap();
    let records = restarted.records().unwrap();
    let (to_serve, to_roll_back): (Vec<_>, Vec<_>) = records
        .iter()
        .partition(|(_, record)| record.is_completed());
    assert_eq!(to_serve.len(), 1);
    assert_eq!(to_serve[0].0, "done");
    assert_eq!(to_roll_back.len(), 1);
    assert_eq!(to_roll_back[0].1, &started);
    assert_eq!(to_roll_back[0].1.state, ClaimState::PrepareStarted);
    assert!(to_roll_back[0].1.devices.is_empty());
    assert_eq!(to_roll_back[0].1.driver_state, Some(json!("vfio")));
}

#[test]
fn removing_unknown_claims_and_identical_puts_do_not_write() {
    let dir = tempfile::tempdir().unwrap();
    let (checkpoint, _) = Checkpoint::open(dir.path(), BOOT).unwrap();
    checkpoint
        .update([ClaimChange::put("uid-1", completed("c", "gpu-0"))])
        .unwrap();
    let before = fs::metadata(checkpoint.path()).unwrap();
    checkpoint
        .update([
            ClaimChange::remove("never-prepared"),
            ClaimChange::put("uid-1", completed("c", "gpu-0")),
        ])
        .unwrap();
    checkpoint.update([]).unwrap();
    let after = fs::metadata(checkpoint.path()).unwrap();
    assert_eq!(before.modified().unwrap(), after.modified().unwrap());
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&before),
        std::os::unix::fs::MetadataExt::ino(&after)
    );
}

#[test]
fn unknown_fields_at_every_level_survive_a_rewrite() {
    let dir = tempfile::tempdir().unwrap();
    let data = json!({
        "bootId": BOOT,
        "nodeName": "node-a",
        "claims": {
            "uid-1": {
                "namespace": "team-a", "name": "claim-1", "state": "PrepareCompleted",
                "status": { "allocation": { "devices": { "results": [] } } },
                "devices": [{
                    "pool": "node-a", "device": "gpu-0", "requestNames": ["gpu"],
                    "metadata": { "pciBusID": "0000:3b:00.0" },
                }],
            },
        },
    });
    fs::write(
        dir.path().join("checkpoint.json"),
        handcrafted(1, &data, r#","writer":"dra-sdk 9.9""#),
    )
    .unwrap();

    let (checkpoint, report) = Checkpoint::open(dir.path(), BOOT).unwrap();
    assert!(report.is_clean(), "{report:?}");
    let record = checkpoint.get("uid-1").unwrap().unwrap();
    assert!(record.is_completed());
    assert_eq!(record.devices[0].device, "gpu-0");
    assert_eq!(
        record.unknown_fields["status"]["allocation"],
        json!({ "devices": { "results": [] } })
    );
    assert_eq!(
        record.devices[0].unknown_fields["metadata"],
        json!({ "pciBusID": "0000:3b:00.0" })
    );

    // A rewrite for another claim, and one that puts back the (modified) record read above.
    let mut changed = record.clone();
    changed.driver_state = Some(json!({ "mps": true }));
    checkpoint
        .update([
            ClaimChange::put("uid-2", completed("claim-2", "gpu-1")),
            ClaimChange::put("uid-1", changed),
        ])
        .unwrap();

    let on_disk = file_json(checkpoint.path());
    assert_eq!(on_disk["writer"], "dra-sdk 9.9");
    assert_eq!(on_disk["data"]["nodeName"], "node-a");
    let claim = &on_disk["data"]["claims"]["uid-1"];
    assert_eq!(
        claim["status"]["allocation"]["devices"]["results"],
        json!([])
    );
    assert_eq!(claim["devices"][0]["metadata"]["pciBusID"], "0000:3b:00.0");
    assert_eq!(claim["driverState"], json!({ "mps": true }));
    // And the rewritten file is itself valid.
    drop(checkpoint);
    let (_, report) = Checkpoint::open(dir.path(), BOOT).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

#[test]
fn newer_version_is_read_best_effort_and_its_data_kept() {
    let dir = tempfile::tempdir().unwrap();
    let data = json!({
        "bootId": BOOT,
        "claims": {
            "done": { "namespace": "ns", "name": "done", "state": "PrepareCompleted",
                      "devices": [{ "pool": "p", "device": "gpu-0", "sharing": "mps" }] },
            "odd": { "namespace": "ns", "name": "odd", "state": "ReleaseStarted" },
            "alien": { "namespace": "ns", "name": "alien", "devices": { "v3": "map" } },
        },
        "claimIndex": [1, 2, 3],
    });
    fs::write(
        dir.path().join("checkpoint.json"),
        handcrafted(3, &data, r#","v3":{"minReader":2}"#),
    )
    .unwrap();

    let (checkpoint, report) = Checkpoint::open(dir.path(), BOOT).unwrap();
    assert_eq!(report.newer_version, Some(3));
    assert_eq!(report.unreadable_claims, ["alien"]);
    assert!(report.corrupt_moved_to.is_none());
    let records = checkpoint.records().unwrap();
    assert_eq!(records.keys().collect::<Vec<_>>(), ["done", "odd"]);
    assert!(records["done"].is_completed());
    assert_eq!(
        records["odd"].state,
        ClaimState::Unrecognized("ReleaseStarted".into())
    );
    assert!(!records["odd"].is_completed());
    assert_eq!(checkpoint.get("alien").unwrap(), None);

    checkpoint
        .update([ClaimChange::put("new", completed("new", "gpu-1"))])
        .unwrap();
    let on_disk = file_json(checkpoint.path());
    // The file now says which format its writer guarantees; the newer fields ride along.
    assert_eq!(on_disk["version"], FORMAT_VERSION);
    assert_eq!(on_disk["v3"], json!({ "minReader": 2 }));
    assert_eq!(on_disk["data"]["claimIndex"], json!([1, 2, 3]));
    let claims = &on_disk["data"]["claims"];
    assert_eq!(claims["alien"]["devices"], json!({ "v3": "map" }));
    assert_eq!(claims["odd"]["state"], "ReleaseStarted");
    assert_eq!(claims["done"]["devices"][0]["sharing"], "mps");
    assert_eq!(claims["new"]["name"], "new");

    // Putting or removing an unreadable claim replaces it like any other.
    checkpoint.update([ClaimChange::remove("alien")]).unwrap();
    assert!(file_json(checkpoint.path())["data"]["claims"]["alien"].is_null());
}

/// Captures log output of the code run in `f`.
fn with_logs<T>(f: impl FnOnce() -> T) -> (T, String) {
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);
    impl io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let result = tracing::subscriber::with_default(subscriber, f);
    let logs = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
    (result, logs)
}

/// Writes `bytes` as the checkpoint, opens it, and checks it was moved aside and replaced by an
/// empty, valid checkpoint. Returns what the report says was wrong.
fn open_corrupt(bytes: &[u8]) -> Corruption {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("checkpoint.json");
    fs::write(&path, bytes).unwrap();

    let ((checkpoint, report), logs) = with_logs(|| Checkpoint::open(dir.path(), BOOT).unwrap());
    let moved_to: PathBuf = report.corrupt_moved_to.clone().expect("moved aside");
    assert_eq!(moved_to.parent(), Some(dir.path()));
    let moved_name = moved_to.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        moved_name.starts_with("checkpoint.json.corrupt-2"),
        "{moved_name}"
    );
    assert_eq!(
        fs::read(&moved_to).unwrap(),
        bytes,
        "the evidence is kept verbatim"
    );
    assert!(!report.is_clean());
    assert!(checkpoint.records().unwrap().is_empty());
    assert_contains(&logs, "WARN");
    assert_contains(&logs, "checkpoint is corrupt");
    assert!(logs.contains(&moved_name), "the log names the copy: {logs}");

    // A fresh checkpoint is in place and usable.
    checkpoint
        .update([ClaimChange::put("uid-1", completed("c", "gpu-0"))])
        .unwrap();
    drop(checkpoint);
    let (reopened, again) = Checkpoint::open(dir.path(), BOOT).unwrap();
    assert!(again.is_clean(), "{again:?}");
    assert_eq!(reopened.records().unwrap().len(), 1);
    report.corruption.expect("reason reported")
}

fn valid_file_bytes() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let (checkpoint, _) = Checkpoint::open(dir.path(), BOOT).unwrap();
    checkpoint
        .update([
            ClaimChange::put("uid-1", completed("claim-1", "gpu-0")),
            ClaimChange::put("uid-2", completed("claim-2", "gpu-1")),
        ])
        .unwrap();
    fs::read(checkpoint.path()).unwrap()
}

#[test]
fn checksum_mismatch_moves_the_file_aside() {
    let tampered = String::from_utf8(valid_file_bytes())
        .unwrap()
        .replacen("gpu-1", "gpu-7", 1);
    let corruption = open_corrupt(tampered.as_bytes());
    assert!(
        matches!(corruption, Corruption::ChecksumMismatch { .. }),
        "{corruption:?}"
    );
    assert!(corruption.to_string().contains("checksum mismatch"));
}

#[test]
fn truncated_file_is_moved_aside() {
    let bytes = valid_file_bytes();
    let corruption = open_corrupt(&bytes[..bytes.len() / 2]);
    assert!(
        matches!(corruption, Corruption::InvalidJson(_)),
        "{corruption:?}"
    );
}

#[test]
fn empty_and_garbage_files_are_moved_aside() {
    assert_eq!(open_corrupt(b""), Corruption::Empty);
    assert!(matches!(
        open_corrupt(b"\x00\x00\x7fELF\xff"),
        Corruption::InvalidJson(_)
    ));
    assert!(matches!(
        open_corrupt(br#"{"version":1,"checksum":"sha256:ab","data":{"bootId":"#),
        Corruption::InvalidJson(_)
    ));
    assert_eq!(
        open_corrupt(br#"{"checksum":"sha256:00","data":{}}"#),
        Corruption::MissingField("version")
    );
    let no_boot_id = handcrafted(1, &json!({ "claims": {} }), "");
    assert_eq!(
        open_corrupt(no_boot_id.as_bytes()),
        Corruption::MissingField("data.bootId")
    );
}

#[test]
fn corruption_while_running_keeps_the_claims_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (checkpoint, _) = Checkpoint::open(dir.path(), BOOT).unwrap();
    checkpoint
        .update([ClaimChange::put("uid-1", completed("c", "gpu-0"))])
        .unwrap();
    // Something outside the SDK scribbles over the file.
    fs::write(checkpoint.path(), b"garbage").unwrap();

    let (record, logs) = with_logs(|| checkpoint.get("uid-1").unwrap());
    assert_eq!(record, Some(completed("c", "gpu-0")));
    assert_contains(&logs, "checkpoint is corrupt");
    let names = dir_entries(dir.path());
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(
        names[1].starts_with("checkpoint.json.corrupt-"),
        "{names:?}"
    );
    // The file was rewritten from memory.
    assert_eq!(
        file_json(checkpoint.path())["data"]["claims"]["uid-1"]["name"],
        "c"
    );

    // Same for a file deleted behind our back.
    fs::remove_file(checkpoint.path()).unwrap();
    assert_eq!(checkpoint.records().unwrap().len(), 1);
    assert!(checkpoint.path().exists());
}

#[test]
fn checkpoint_from_another_boot_is_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let (before_reboot, _) = Checkpoint::open(dir.path(), "boot-before").unwrap();
    before_reboot
        .update([
            ClaimChange::put("uid-1", completed("c1", "gpu-0")),
            ClaimChange::put("uid-2", ClaimRecord::started("ns", "c2")),
        ])
        .unwrap();
    drop(before_reboot);

    let ((after_reboot, report), logs) =
        with_logs(|| Checkpoint::open(dir.path(), "boot-after").unwrap());
    assert!(report.discarded_other_boot);
    assert_eq!(report.discarded_boot_id.as_deref(), Some("boot-before"));
    assert_eq!(report.discarded_claims, 2);
    assert!(report.corrupt_moved_to.is_none());
    assert!(after_reboot.records().unwrap().is_empty());
    assert_eq!(after_reboot.get("uid-1").unwrap(), None);
    assert_contains(&logs, "INFO");
    assert_contains(&logs, "another boot");
    assert_eq!(
        file_json(after_reboot.path())["data"]["bootId"],
        "boot-after"
    );
    drop(after_reboot);

    let (_, report) = Checkpoint::open(dir.path(), "boot-after").unwrap();
    assert!(report.is_clean(), "{report:?}");
}

#[test]
fn interrupted_write_leaves_the_old_file_and_a_temp_file_that_open_removes() {
    let dir = tempfile::tempdir().unwrap();
    let (checkpoint, _) = Checkpoint::open(dir.path(), BOOT).unwrap();
    checkpoint
        .update([ClaimChange::put("uid-1", completed("c", "gpu-0"))])
        .unwrap();
    drop(checkpoint);
    // What a process killed between writing the temp file and renaming it leaves behind.
    let stale = dir.path().join(".checkpoint.json.tmp-00c0ffee00c0ffee");
    fs::write(&stale, br#"{"version":1,"checksum":"sha256:"#).unwrap();

    let (checkpoint, report) = Checkpoint::open(dir.path(), BOOT).unwrap();
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(
        report.stale_temp_files_removed,
        std::slice::from_ref(&stale)
    );
    assert!(!stale.exists());
    assert_eq!(checkpoint.records().unwrap().len(), 1);
    assert_eq!(
        dir_entries(dir.path()),
        ["checkpoint.json", "checkpoint.lock"]
    );
}

#[test]
fn creates_missing_directories() {
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("plugins/gpu.example.com");
    let (checkpoint, report) = Checkpoint::open(&nested, BOOT).unwrap();
    assert!(report.is_clean());
    assert!(checkpoint.path().exists());
    assert_eq!(checkpoint.boot_id(), BOOT);
}
