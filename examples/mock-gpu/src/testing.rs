//! Helpers for the example's own tests and benchmarks.

use std::path::Path;
use std::process::{Command, Stdio};

use dra_sdk_testing::cluster::{NODE_NAME, TestCluster};

/// The plugin binary at `binary`, pointed at `cluster` through `kubeconfig`, as an operator
/// would run it on the cluster's node.
pub fn plugin_command(
    binary: &Path,
    cluster: &TestCluster,
    kubeconfig: &Path,
    num_devices: u32,
) -> Command {
    let mut command = Command::new(binary);
    command
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args([
            "--node-name",
            NODE_NAME,
            "--num-devices",
            &num_devices.to_string(),
        ])
        .arg("--kubelet-registrar-directory-path")
        .arg(cluster.registrar_dir())
        .arg("--kubelet-plugins-directory-path")
        .arg(cluster.plugins_dir())
        .arg("--cdi-root")
        .arg(cluster.cdi_root())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null());
    command
}
