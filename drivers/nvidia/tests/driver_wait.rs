//! `--wait-for-driver`, the chart's init container: the plugin's binary waits, with back-off,
//! until the driver's NVML library loads under the container driver root, then exits 0,
//! instead of crash-looping while the GPU operator installs the driver. Over the NVML double,
//! which stands in for the driver appearing.

use std::process::Command;

fn plugin() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gpu-kubelet-plugin"));
    command.args(["--node-name", "node-1", "--wait-for-driver"]);
    command
}

#[test]
fn a_mock_profile_has_no_driver_to_wait_for() {
    let output = plugin()
        .args(["--mock-profile", "dgx-h100"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
}

#[cfg(feature = "nvml")]
#[test]
fn the_init_container_waits_until_the_driver_is_installed() {
    use std::io::Read as _;
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let driver_root = dir.path().join("driver-root");
    let libraries = driver_root.join("usr/lib/x86_64-linux-gnu");
    std::fs::create_dir_all(&libraries).unwrap();
    let mut child = plugin()
        .arg("--container-driver-root")
        .arg(&driver_root)
        .env(nvml_mock::PROFILE_ENV, "dgx-h100")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Attempts at 0 s, 1 s and 3 s find nothing: still waiting, not exited.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "exited before the driver was installed"
    );
    // The driver's installer puts libnvidia-ml.so.1 in place (a link to the double).
    std::os::unix::fs::symlink(
        nvml_mock::built_library().unwrap(),
        libraries.join("libnvidia-ml.so.1"),
    )
    .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "still waiting 30 s after the driver appeared"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(status.success(), "{status:?}: {stderr}");
    // Each attempt said what it was waiting for and where it looked.
    assert!(stderr.contains("waiting for the NVIDIA driver"), "{stderr}");
    assert!(
        stderr.contains(&driver_root.display().to_string()),
        "{stderr}"
    );
    assert!(
        stderr.contains("the NVIDIA driver is installed"),
        "{stderr}"
    );
}
