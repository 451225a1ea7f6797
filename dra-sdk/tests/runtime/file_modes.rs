//! The modes of everything the plugin creates on the node, after a real prepare through the
//! sockets: each the narrowest that works (docs/operations.md, "Files and sockets"), set by
//! the plugin rather than left to the umask (the test's umask, 022, would give 0755 and 0644
//! where 0700 and 0600 are wanted).

use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use dra_sdk_testing::cluster::TestCluster;
use dra_sdk_testing::kubelet::KubeletVersion;
use serde_json::json;

use crate::secrets::{DRIVER, VaultDriver, claim_with};

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// Every path under `dir` (not `dir` itself), recursively.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        out.push(path.clone());
        if entry.file_type().unwrap().is_dir() {
            walk(&path, out);
        }
    }
}

#[tokio::test]
async fn sockets_directories_and_files_get_the_narrowest_modes_that_work() {
    let cluster = TestCluster::start().await.unwrap();
    let data_dir = cluster.plugins_dir().join(DRIVER);
    // A data directory an earlier version left with the umask's mode is narrowed.
    std::fs::create_dir(&data_dir).unwrap();
    std::fs::set_permissions(&data_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let claim = claim_with(
        &cluster,
        "modes",
        "gpu-0",
        json!({ "apiVersion": "vault.example.com/v1", "kind": "VaultConfig" }),
    )
    .await;
    let plugin = cluster
        .plugin(VaultDriver, DRIVER)
        .serialize_operations(true)
        .start()
        .await
        .unwrap();
    let kubelet = cluster
        .register(&plugin, KubeletVersion::V1_36)
        .await
        .unwrap();
    let outcome = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
    assert!(outcome[&claim.uid].is_ok(), "{outcome:?}");

    let registration = cluster.registrar_dir().join(format!("{DRIVER}-reg.sock"));
    let dra = data_dir.join("dra.sock");
    for socket in [&registration, &dra] {
        let kind = std::fs::symlink_metadata(socket).unwrap().file_type();
        assert!(kind.is_socket(), "{}", socket.display());
        // Only the kubelet (root) connects.
        assert_eq!(mode(socket), 0o600, "{}", socket.display());
    }
    // Root's alone: sockets, checkpoint, locks; workloads see metadata via a bind mount.
    assert_eq!(mode(&data_dir), 0o700);
    for private in [
        "checkpoint.json",
        "checkpoint.lock",
        "claims.lock",
        "operations.lock",
    ] {
        assert_eq!(mode(&data_dir.join(private)), 0o600, "{private}");
    }
    // Below the data directory only the metadata tree is readable by others: workloads
    // running as any user read their metadata file.
    let metadata_root = data_dir.join(dra_sdk::advanced::metadata::HOST_SUBDIR);
    let mut metadata = Vec::new();
    walk(&metadata_root, &mut metadata);
    assert!(metadata.iter().any(|p| p.is_file()), "{metadata:?}");
    assert_eq!(mode(&metadata_root), 0o755);
    for path in &metadata {
        let expected = if path.is_dir() { 0o755 } else { 0o644 };
        assert_eq!(mode(path), expected, "{}", path.display());
    }
    // CDI specs: read by the container runtime and by tools such as `nvidia-ctk cdi list`;
    // they carry no secret (see the secrets module), and nobody but root writes them.
    let mut specs = Vec::new();
    walk(&cluster.cdi_root(), &mut specs);
    assert_eq!(
        specs.len(),
        2,
        "the device's spec and the metadata spec: {specs:?}"
    );
    for spec in &specs {
        assert_eq!(mode(spec), 0o644, "{}", spec.display());
    }
    // A CDI root the plugin has to create gets 0755 (the runtime lists it).
    plugin.shutdown().await.unwrap();
    let fresh_root = cluster.path().join("fresh-cdi");
    let plugin = cluster
        .plugin(VaultDriver, DRIVER)
        .cdi_root(fresh_root.clone())
        .start()
        .await
        .unwrap();
    assert_eq!(mode(&fresh_root), 0o755);
    // Nothing anywhere is writable by group or others.
    let mut all = Vec::new();
    walk(cluster.path(), &mut all);
    for path in all {
        let kind = std::fs::symlink_metadata(&path).unwrap().file_type();
        if kind.is_symlink() {
            continue;
        }
        assert_eq!(
            mode(&path) & 0o022,
            0,
            "{} is writable by others",
            path.display()
        );
    }
    plugin.shutdown().await.unwrap();
}
