//! The minimal driver as users meet it: the binary runs in the SDK's embedded cluster (fake API
//! server, simulated kubelet) and prepares a claim; its source stays one file under 150 lines,
//! and the quickstart guide shows that file exactly.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use dra_sdk_testing::assert_contains;
use dra_sdk_testing::cluster::{NewClaim, TestCluster, wait_for};
use dra_sdk_testing::kubelet::{KubeletSimulator, KubeletVersion};
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde_json::json;

const DRIVER: &str = "minimal.example.com";

fn package_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Kills the plugin when a test fails half-way, so no process outlives the test.
struct Plugin(Child);

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// Multi-threaded: the fake API server must keep answering while the test waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_publishes_registers_and_prepares_a_claim() {
    let cluster = TestCluster::start().await.unwrap();
    let kubeconfig = cluster.write_kubeconfig().unwrap();
    cluster.create_device_class(DRIVER, DRIVER).await.unwrap();
    let _plugin = Plugin(
        cluster
            .plugin_command(
                Path::new(env!("CARGO_BIN_EXE_minimal-kubelet-plugin")),
                &kubeconfig,
            )
            .args(["--num-devices", "3"])
            .spawn()
            .unwrap(),
    );

    let registrar = cluster.registrar_dir();
    wait_for("the registration socket", || {
        KubeletSimulator::discover(&registrar).is_ok_and(|found| found.len() == 1)
    })
    .await;
    let socket = KubeletSimulator::discover(&registrar).unwrap().remove(0);
    let kubelet = KubeletSimulator::new(KubeletVersion::V1_36)
        .register(&socket)
        .await
        .unwrap();
    assert_eq!(kubelet.info.name, DRIVER);

    let api = cluster.api();
    let devices = || -> usize {
        api.list::<ResourceSlice>()
            .unwrap()
            .iter()
            .filter_map(|slice| slice.spec.devices.as_ref())
            .map(Vec::len)
            .sum()
    };
    wait_for("3 published devices", || devices() == 3).await;

    // A user's claim with an opaque config; the allocator picks a device by CEL, as the
    // scheduler would.
    cluster
        .create_claim(
            NewClaim::new("default", "low-power")
                .request("acc", DRIVER)
                .selector("device.attributes['minimal.example.com'].index == 1")
                .config(
                    &["acc"],
                    DRIVER,
                    json!({
                        "apiVersion": "minimal.example.com/v1",
                        "kind": "AcceleratorConfig",
                        "powerMode": "LowPower",
                    }),
                ),
        )
        .await
        .unwrap();
    let claim = cluster.allocate("default", "low-power").await.unwrap();
    let outcomes = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
    let prepared = outcomes[&claim.uid].as_ref().unwrap();
    assert_eq!(prepared.len(), 1);
    assert_eq!(prepared[0].device, "acc-1");
    assert_eq!(prepared[0].cdi_device_ids.len(), 1);

    // What the container runtime would read: the claim's CDI spec carries the env.
    let specs = cdi_specs(&cluster.cdi_root());
    assert_contains(&specs, "ACCELERATOR_ACC_1=acc-1");
    assert_contains(&specs, "ACCELERATOR_ACC_1_POWER_MODE=LowPower");

    // A config the driver rejects fails that claim alone, with a message naming the field.
    cluster
        .create_claim(
            NewClaim::new("default", "bad")
                .request("acc", DRIVER)
                .config(
                    &[],
                    DRIVER,
                    json!({
                        "apiVersion": "minimal.example.com/v1",
                        "kind": "AcceleratorConfig",
                        "powerMode": "Turbo",
                    }),
                ),
        )
        .await
        .unwrap();
    let bad = cluster.allocate("default", "bad").await.unwrap();
    let outcomes = kubelet.prepare(std::slice::from_ref(&bad)).await.unwrap();
    let error = outcomes[&bad.uid].as_ref().unwrap_err();
    assert_contains(error, "powerMode");

    let unprepared = kubelet.unprepare(&[claim]).await.unwrap();
    assert!(unprepared.values().all(Result::is_ok), "{unprepared:?}");
    assert!(!cdi_specs(&cluster.cdi_root()).contains("ACCELERATOR_ACC_1="));
}

/// Every CDI spec file under `dir`, concatenated.
fn cdi_specs(dir: &Path) -> String {
    let mut all = String::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        all.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap());
    }
    all
}

#[test]
fn the_driver_is_one_file_well_under_150_lines() {
    let src = package_dir().join("src");
    let files: Vec<_> = std::fs::read_dir(&src).unwrap().collect();
    assert_eq!(files.len(), 1, "the minimal example is one file");
    let lines = std::fs::read_to_string(src.join("main.rs"))
        .unwrap()
        .lines()
        .count();
    assert!(
        lines < 150,
        "src/main.rs has {lines} lines; keep it under 150"
    );
}

#[test]
fn the_quickstart_shows_the_file_as_it_is() {
    let guide = std::fs::read_to_string(package_dir().join("../../docs/quickstart.md")).unwrap();
    let source = std::fs::read_to_string(package_dir().join("src/main.rs")).unwrap();
    let marker = "<!-- examples/minimal/src/main.rs -->\n```rust\n";
    let start = guide
        .find(marker)
        .map(|at| at + marker.len())
        .expect("docs/quickstart.md has the marked code block");
    let end = start + guide[start..].find("\n```\n").expect("the block ends") + 1;
    assert_eq!(
        &guide[start..end],
        source,
        "docs/quickstart.md's copy of src/main.rs is out of date"
    );
}

#[test]
fn help_lists_the_sdk_flags() {
    let output = Command::new(env!("CARGO_BIN_EXE_minimal-kubelet-plugin"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    for flag in [
        "--node-name",
        "--kubeconfig",
        "--cdi-root",
        "--healthcheck-port",
        "--num-devices",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}
