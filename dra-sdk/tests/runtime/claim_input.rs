//! Claim references a broken or hostile kubelet sends: each bad one fails alone with an error
//! naming its field, the good claim of the same batch is prepared, and a UID with `/` or `..`
//! reaches no file path.

use std::path::Path;
use std::sync::Arc;

use dra_sdk::claim::ClaimRef;
use dra_sdk_testing::claims::AllocatedClaim;
use dra_sdk_testing::cluster::{NODE_NAME, TestCluster};
use dra_sdk_testing::kubelet::KubeletVersion;
use dra_sdk_testing::sample_driver::{DRIVER, GpuDriver};

/// Every file name under `dir`, recursively.
fn file_names(dir: &Path) -> Vec<String> {
    let mut names = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            names.push(entry.file_name().to_string_lossy().into_owned());
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                pending.push(entry.path());
            }
        }
    }
    names
}

#[tokio::test]
async fn hostile_claim_references_fail_alone_naming_the_field_and_reach_no_path() {
    let cluster = TestCluster::start().await.unwrap();
    let plugin = cluster
        .plugin(Arc::new(GpuDriver::default()), DRIVER)
        .start()
        .await
        .unwrap();
    let created = AllocatedClaim::new("default", "good")
        .device("gpu", DRIVER, NODE_NAME, "gpu-0")
        .create(&cluster.client())
        .await
        .unwrap();
    let good = ClaimRef::new(
        "default",
        "good",
        created.metadata.uid.clone().unwrap_or_default(),
    );
    let hostile = [
        (ClaimRef::new("default", "good", "../../escaped"), "uid"),
        (ClaimRef::new("default", "good", "a/../../escaped"), "uid"),
        (ClaimRef::new("default", "good", ""), "uid"),
        (ClaimRef::new("default", "good", "nul\0escaped"), "uid"),
        (ClaimRef::new("default", "good", "u".repeat(10_000)), "uid"),
        (
            ClaimRef::new("../kube-system", "good", "uid-ns"),
            "namespace",
        ),
        (
            ClaimRef::new("default", "../../escaped", "uid-name"),
            "name",
        ),
        (
            ClaimRef::new("default", "n".repeat(300), "uid-long-name"),
            "name",
        ),
    ];
    // v1 (1.36) and v1beta1 (1.32): the two adapters convert the request each.
    for version in [KubeletVersion::V1_36, KubeletVersion::V1_32] {
        let kubelet = cluster.register(&plugin, version).await.unwrap();
        let mut batch = vec![good.clone()];
        batch.extend(hostile.iter().map(|(claim, _)| claim.clone()));

        let prepared = kubelet.prepare(&batch).await.unwrap();
        assert!(prepared[&good.uid].is_ok(), "{:?}", prepared[&good.uid]);
        for (claim, field) in &hostile {
            let error = prepared[&claim.uid].as_ref().unwrap_err();
            assert!(
                error.starts_with(&format!("invalid claim in the request: claims[].{field} ")),
                "{error}"
            );
            assert!(error.len() < 300, "{error}");
        }

        let unprepared = kubelet.unprepare(&batch).await.unwrap();
        assert_eq!(unprepared[&good.uid], Ok(()));
        for (claim, field) in &hostile {
            let error = unprepared[&claim.uid].as_ref().unwrap_err();
            assert!(error.contains(&format!("claims[].{field} ")), "{error}");
        }
    }
    let names = file_names(cluster.path());
    assert!(
        !names.iter().any(|name| name.contains("escaped")),
        "{names:?}"
    );
    // `../../` from a directory of the cluster's folder: the folder's parent.
    let parent = std::fs::read_dir(cluster.path().parent().unwrap()).unwrap();
    assert!(
        !parent
            .flatten()
            .any(|entry| entry.file_name().to_string_lossy().contains("escaped"))
    );
}
