//! A writer killed at random points never leaves a partial or unparsable spec visible.
//!
//! The test re-executes its own binary as the writer: with `CHILD_DIR_ENV` set, the
//! `crash_writer_child` test writes large specs in a loop until it is SIGKILLed. The parent
//! kills it after a random delay, then checks every file a runtime would read. (A writer that
//! truncates and writes the final file in place fails this test within a few dozen kills.)

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dra_sdk::advanced::cdi::{ClaimDevice, Spec, SpecWriter};
use dra_sdk::cdi::{ContainerEdits, DeviceNode, Mount};

const CHILD_DIR_ENV: &str = "DRA_SDK_CDI_CRASH_CHILD_DIR";
const KIND: &str = "crash.example.com/gpu";
/// Enough to kill the writer at many different points, yet bounded (about 1-2 s in all).
const ITERATIONS: u32 = 60;
const TIME_BUDGET: Duration = Duration::from_secs(3);

/// Alternately small specs (so that most of the writer's time goes to file operations and a
/// kill often lands between them) and specs of a few hundred KiB (so that a kill can land in the
/// middle of the bytes).
fn claim_devices(round: u64) -> Vec<ClaimDevice> {
    let devices = 8 + (round % 8) as usize;
    let vars_per_device = if round.is_multiple_of(2) { 1 } else { 100 };
    (0..devices)
        .map(|device| {
            let mut edits = ContainerEdits::new()
                .device_node(DeviceNode::new(format!("/dev/gpu{device}")))
                .mount(Mount::new(
                    format!("/opt/gpu/lib{device}"),
                    format!("/usr/lib/gpu{device}"),
                ));
            for var in 0..vars_per_device {
                edits = edits.env(format!("GPU_{device}_VAR_{var}"), format!("{round:0>200}"));
            }
            ClaimDevice::new(format!("gpu-{device}"), edits)
        })
        .collect()
}

/// The writer child: does nothing unless started by the parent test.
#[test]
fn crash_writer_child() {
    let Some(dir) = std::env::var_os(CHILD_DIR_ENV) else {
        return;
    };
    let writer = SpecWriter::new(dir, KIND.parse().unwrap());
    let common = ContainerEdits::new().env("COMMON", "1");
    for round in 0u64.. {
        let claim_uid = format!("claim-{}", round % 3);
        writer
            .write_claim(&claim_uid, &common, &claim_devices(round))
            .unwrap();
        if round % 5 == 4 {
            writer.remove_claim(&claim_uid).unwrap();
        }
    }
}

/// What a runtime would read: every `.json`/`.yaml` file must parse and validate.
fn check_visible_specs(dir: &Path) -> (usize, usize) {
    let (mut specs, mut temps) = (0, 0);
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        if name.ends_with(".json") || name.ends_with(".yaml") {
            let spec = Spec::read_file(&path)
                .unwrap_or_else(|err| panic!("a runtime would see a broken spec: {err}"));
            assert!(spec.devices.len() >= 8, "{}", path.display());
            specs += 1;
        } else {
            assert!(
                name.starts_with('.') && name.ends_with(".tmp"),
                "unexpected {name}"
            );
            temps += 1;
        }
    }
    (specs, temps)
}

#[test]
fn killed_writer_never_leaves_a_partial_spec() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let started = Instant::now();
    let (mut iterations, mut saw_specs, mut saw_temps) = (0, 0, 0);
    while iterations < ITERATIONS && started.elapsed() < TIME_BUDGET {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "crash_writer_child",
                "--test-threads=1",
                "--nocapture",
            ])
            .env(CHILD_DIR_ENV, dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Process start-up takes a few milliseconds; delays past it land at random points of
        // the write loop.
        std::thread::sleep(Duration::from_micros(fastrand::u64(2_000..25_000)));
        child.kill().unwrap(); // SIGKILL: no destructor, no cleanup
        let status = child.wait().unwrap();
        assert!(
            !status.success(),
            "the writer child exited on its own: {status}"
        );
        let (specs, temps) = check_visible_specs(dir.path());
        saw_specs += usize::from(specs > 0);
        saw_temps += usize::from(temps > 0);
        iterations += 1;
    }
    eprintln!(
        "{iterations} kills in {:?}; specs visible after {saw_specs}, temporary files left after {saw_temps}",
        started.elapsed()
    );
    assert!(saw_specs > 0, "the child never got to write a spec");

    // The sweep at start removes what the crashes left, temporary files included.
    let writer = SpecWriter::new(dir.path(), KIND.parse().unwrap());
    writer.remove_orphans(|_| false).unwrap();
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
