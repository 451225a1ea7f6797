//! Helpers for the example's own tests and benchmarks.

use std::path::Path;
use std::process::Command;

use dra_sdk_testing::cluster::TestCluster;

/// The plugin binary at `binary`, pointed at `cluster` through `kubeconfig`, as an operator
/// would run it on the cluster's node ([`TestCluster::plugin_command`]) with `num_devices`
/// GPUs.
pub fn plugin_command(
    binary: &Path,
    cluster: &TestCluster,
    kubeconfig: &Path,
    num_devices: u32,
) -> Command {
    let mut command = cluster.plugin_command(binary, kubeconfig);
    command.args(["--num-devices", &num_devices.to_string()]);
    command
}
