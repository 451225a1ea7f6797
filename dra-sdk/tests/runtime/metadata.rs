//! KEP-5304 device metadata, through the test cluster and the simulated kubelet: prepare
//! writes the metadata file and its CDI spec and hands the kubelet the spec's CDI device next
//! to the device's own; unprepare removes both. Once by hand from a driver (the writer's API),
//! once by the plugin itself for a driver that opts in (`Driver::device_metadata`), with the
//! checkpoint record and the start-up sweep of orphans.

use std::path::PathBuf;
use std::sync::OnceLock;

use dra_sdk::advanced::cdi::Spec;
use dra_sdk::advanced::metadata::{MetadataClaim, MetadataDevice, MetadataWriter};
use dra_sdk::cdi::ContainerEdits;
use dra_sdk::claim::{Claim, ClaimRef, DriverError, RecordedClaim};
use dra_sdk::context::DriverContext;
use dra_sdk::driver::{Driver, PreparedClaim, PreparedDevice};
use dra_sdk::slices::{Device, DriverResources};
use dra_sdk_testing::cluster::{NODE_NAME, NewClaim, TestCluster};
use serde_json::json;

const DRIVER: &str = "meta.example.com";

struct MetadataDriver {
    writer: MetadataWriter,
    ctx: OnceLock<DriverContext>,
}

#[async_trait::async_trait]
impl Driver for MetadataDriver {
    type Config = ();

    async fn start(&self, ctx: &DriverContext) -> Result<(), DriverError> {
        let prepared = ctx.prepared_claims().await.map_err(DriverError::other)?;
        self.writer
            .remove_orphans(|uid| prepared.iter().any(|c| c.claim.uid == uid))
            .map_err(DriverError::other)?;
        let _ = self.ctx.set(ctx.clone());
        Ok(())
    }

    async fn prepare(&self, claim: &Claim<()>) -> Result<PreparedClaim, DriverError> {
        let identity = MetadataClaim::from_resource_claim(&claim.resource_claim)
            .map_err(DriverError::other)?;
        let resources = self.ctx.get().and_then(DriverContext::resources);
        let devices = MetadataDevice::for_claim(claim, resources.as_ref());
        let written = self
            .writer
            .write_claim(&identity, &devices)
            .map_err(DriverError::other)?;
        let prepared = claim
            .devices
            .iter()
            .map(|device| {
                let edits = ContainerEdits::new().env("DEVICE", &device.device.name);
                let prepared = PreparedDevice::new(device, edits);
                match written.cdi_device_ids.get(&device.request) {
                    Some(id) => prepared.with_cdi_device_id(id.clone()),
                    None => prepared,
                }
            })
            .collect();
        Ok(PreparedClaim::new(prepared))
    }

    async fn unprepare(&self, recorded: &RecordedClaim) -> Result<(), DriverError> {
        let identity = MetadataClaim::from(recorded.claim.clone());
        self.writer
            .remove_claim(&identity)
            .map_err(DriverError::other)
    }
}

#[tokio::test]
async fn prepare_writes_metadata_and_unprepare_removes_it() {
    let host = tempfile::tempdir().unwrap();
    // The writer is built before the cluster exists, so its CDI specs go to a directory of
    // the test's (a real driver passes its --cdi-root).
    let cdi = tempfile::tempdir().unwrap();
    let driver = MetadataDriver {
        writer: MetadataWriter::new(DRIVER, host.path(), cdi.path()),
        ctx: OnceLock::new(),
    };
    let resources = DriverResources::single_pool(
        NODE_NAME,
        vec![
            Device::new("nic-0")
                .attribute("model", "x710")
                .attribute("resource.kubernetes.io/pciBusID", "0000:3b:00.0"),
        ],
    );
    let running = TestCluster::start_with(driver, DRIVER, resources)
        .await
        .unwrap();
    let cluster = running.cluster();
    cluster
        .create_claim(NewClaim::new("default", "nic").request("net", DRIVER))
        .await
        .unwrap();
    let claim = cluster.allocate("default", "nic").await.unwrap();

    let outcome = running
        .kubelet()
        .prepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    let devices = outcome[&claim.uid].as_ref().unwrap();
    let metadata_id = format!("{DRIVER}/metadata={}_net", claim.uid);
    assert_eq!(devices[0].cdi_device_ids.len(), 2, "{devices:?}");
    assert_eq!(devices[0].cdi_device_ids[1], metadata_id);

    let spec_path: PathBuf = cdi
        .path()
        .join(format!("{DRIVER}_metadata_{}_net.json", claim.uid));
    let spec = Spec::read_file(&spec_path).unwrap();
    let mount = &spec.devices[0].container_edits.mounts[0];
    assert_eq!(
        mount.container_path,
        format!(
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/nic/net/{DRIVER}-metadata.json"
        )
    );
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&mount.host_path).unwrap()).unwrap();
    assert_eq!(file["metadata"]["uid"], claim.uid.as_str());
    assert_eq!(
        file["requests"][0]["devices"][0]["attributes"],
        json!({
            "model": {"string": "x710"},
            "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"},
        })
    );

    let unprepared = running
        .kubelet()
        .unprepare(std::slice::from_ref(&claim))
        .await
        .unwrap();
    assert!(unprepared[&claim.uid].is_ok());
    assert!(!spec_path.exists());
    assert!(!std::path::Path::new(&mount.host_path).exists());
}

/// A driver that only opts in: the plugin writes, records, removes and sweeps the metadata.
#[derive(Clone, Copy)]
struct OptInDriver;

#[async_trait::async_trait]
impl Driver for OptInDriver {
    type Config = ();

    fn device_metadata(&self) -> bool {
        true
    }

    async fn prepare(&self, claim: &Claim<()>) -> Result<PreparedClaim, DriverError> {
        let devices = claim
            .devices
            .iter()
            .map(|device| {
                PreparedDevice::new(
                    device,
                    ContainerEdits::new().env("NIC", &device.device.name),
                )
            })
            .collect();
        Ok(PreparedClaim::new(devices))
    }

    async fn unprepare(&self, _: &RecordedClaim) -> Result<(), DriverError> {
        Ok(())
    }
}

#[tokio::test]
async fn the_plugin_writes_records_sweeps_and_removes_metadata_of_a_driver_that_opts_in() {
    let resources = DriverResources::single_pool(
        NODE_NAME,
        vec![
            Device::new("nic-0").attribute("model", "x710"),
            Device::new("nic-1").attribute("model", "e810"),
        ],
    );
    let running = TestCluster::start_with(OptInDriver, DRIVER, resources)
        .await
        .unwrap();
    let cluster = running.cluster();
    let mut claims = Vec::new();
    for name in ["a", "b"] {
        cluster
            .create_claim(NewClaim::new("default", name).request("net", DRIVER))
            .await
            .unwrap();
        claims.push(cluster.allocate("default", name).await.unwrap());
    }
    let outcome = running.kubelet().prepare(&claims).await.unwrap();
    let cdi_root = cluster.cdi_root();
    let data_dir = cluster.plugins_dir().join(DRIVER);
    let spec_of = |uid: &str| cdi_root.join(format!("{DRIVER}_metadata_{uid}_net.json"));
    let claim_dir = |dir: &str| {
        data_dir
            .join(dra_sdk::advanced::metadata::HOST_SUBDIR)
            .join(dir)
    };
    for claim in &claims {
        let devices = outcome[&claim.uid].as_ref().unwrap();
        let metadata_id = format!("{DRIVER}/metadata={}_net", claim.uid);
        // The device's own spec first, then the metadata spec's device.
        assert_eq!(devices[0].cdi_device_ids.len(), 2, "{devices:?}");
        assert_eq!(devices[0].cdi_device_ids[1], metadata_id);
        let spec = Spec::read_file(spec_of(&claim.uid)).unwrap();
        let mount = &spec.devices[0].container_edits.mounts[0];
        assert_eq!(
            mount.container_path,
            format!(
                "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/{}/net/{DRIVER}-metadata.json",
                claim.name
            )
        );
        let file: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&mount.host_path).unwrap()).unwrap();
        assert_eq!(file["metadata"]["uid"], claim.uid.as_str());
        let device = &file["requests"][0]["devices"][0];
        let model = if device["name"] == "nic-0" {
            "x710"
        } else {
            "e810"
        };
        assert_eq!(device["attributes"]["model"], json!({ "string": model }));
    }
    // The checkpoint records the metadata device: a repeated prepare answers with it.
    let recorded = running.plugin().context().prepared_claims().await.unwrap();
    assert!(
        recorded
            .iter()
            .all(|claim| claim.devices[0].cdi_device_ids.len() == 2)
    );

    // Files of a claim no record names (left by a crash or an old instance) go at start;
    // those of prepared claims stay.
    let leftover = MetadataWriter::new(DRIVER, &data_dir, cdi_root.clone());
    let ghost = MetadataClaim::from(ClaimRef::new(
        "default",
        "ghost",
        "0c6f3a1e-0000-4000-8000-000000000000",
    ));
    let written = leftover
        .write_claim(&ghost, &[MetadataDevice::new("net", NODE_NAME, "nic-0")])
        .unwrap();
    assert!(written.files.iter().all(|file| file.exists()));
    let running = running.restart(OptInDriver).await.unwrap();
    assert!(
        written.files.iter().all(|file| !file.exists()),
        "{written:?}"
    );
    assert!(spec_of(&claims[0].uid).exists() && spec_of(&claims[1].uid).exists());
    let again = running.kubelet().prepare(&claims[..1]).await.unwrap();
    assert_eq!(
        again[&claims[0].uid].as_ref().unwrap()[0].cdi_device_ids,
        outcome[&claims[0].uid].as_ref().unwrap()[0].cdi_device_ids
    );

    // Unprepare removes the claim's files, and only those.
    let unprepared = running.kubelet().unprepare(&claims[..1]).await.unwrap();
    assert!(unprepared[&claims[0].uid].is_ok());
    assert!(!spec_of(&claims[0].uid).exists());
    assert!(
        !claim_dir("default_a").exists(),
        "the claim's metadata directory is gone"
    );
    assert!(spec_of(&claims[1].uid).exists());
    assert!(claim_dir("default_b").exists());
}
