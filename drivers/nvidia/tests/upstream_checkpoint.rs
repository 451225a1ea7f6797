//! Replacing the upstream Go driver on a live node: its `checkpoint.json` (v1, v2 and v3
//! layouts, written here from upstream's source as `drivers.md` A.5 and the driver's module
//! docs describe it, with the kubelet checkpointmanager's checksums) is taken over at plugin
//! start through the kubelet simulator, or the start is refused with instructions. On the mock
//! backend and a fake host tree.

mod fixture;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dra_driver_nvidia::backend::mig::MigManager;
use dra_driver_nvidia::backend::{GpuBackend, MigPlacement};
use dra_driver_nvidia::driver::{
    ClaimState, DRIVER_NAME, MigInstance, NvidiaDriver, PreparedKind, UpstreamCheckpoint,
    VfioBinder,
};
use dra_driver_nvidia::host::{CommandOutput, Host, HostCommand, HostEvent};
use dra_driver_nvidia::plugin::cdi_kind;
use dra_sdk::advanced::checkpoint::{Checkpoint, ClaimRecord};
use dra_sdk::claim::ClaimRef;
use dra_sdk::plugin::{KubeletPlugin, PluginError};
use dra_sdk_testing::assert_contains;
use dra_sdk_testing::cluster::{BOOT_ID, NODE_NAME, TestCluster};
use dra_sdk_testing::kubelet::{KubeletVersion, RegisteredPlugin};
use fixture::*;

// ---- upstream's file, as its writer lays it out -----------------------------------------

/// The kubelet checkpointmanager's checksum of `json`, written independently of the driver's
/// `kubelet_checksum`: 32-bit FNV-1a over go-spew's `%#v` of the bytes, `([]uint8)[…]`.
fn go_checksum(json: &str) -> u64 {
    let spew = format!(
        "([]uint8)[{}]",
        json.bytes()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let hash = spew.bytes().fold(2_166_136_261u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(16_777_619)
    });
    u64::from(hash)
}

/// One prepared device as upstream's `PreparedDevice` marshals it (v1/v2: `kubeletplugin.Device`
/// with capitalized keys; v3: `CheckpointDevice`, lower case).
#[derive(Clone)]
enum Dev {
    Gpu {
        uuid: String,
        name: String,
    },
    Mig {
        parent_minor: u32,
        parent_uuid: String,
        gi: u32,
        ci: u32,
        mig_uuid: String,
        name: String,
    },
    Vfio {
        uuid: String,
        bus_id: Option<String>,
        name: String,
    },
}

impl Dev {
    fn name(&self) -> &str {
        match self {
            Dev::Gpu { name, .. } | Dev::Mig { name, .. } | Dev::Vfio { name, .. } => name,
        }
    }

    fn json(&self, uid: &str, v3: bool) -> String {
        let name = self.name();
        let device = if v3 {
            format!(
                r#"{{"requests":["gpu"],"poolName":"{NODE_NAME}","deviceName":"{name}","cdiDeviceIDs":["k8s.gpu.nvidia.com/claim={uid}-{name}"]}}"#
            )
        } else {
            format!(
                r#"{{"Requests":["gpu"],"PoolName":"{NODE_NAME}","DeviceName":"{name}","CDIDeviceIDs":["k8s.gpu.nvidia.com/claim={uid}-{name}"]}}"#
            )
        };
        match (self, v3) {
            (Dev::Gpu { uuid, .. }, false) => {
                format!(r#"{{"gpu":{{"info":{{"uuid":"{uuid}"}},"device":{device}}},"mig":null}}"#)
            }
            (Dev::Gpu { uuid, .. }, true) => {
                format!(r#"{{"gpu":{{"info":{{"uuid":"{uuid}"}},"device":{device}}}}}"#)
            }
            (
                Dev::Mig {
                    parent_minor,
                    parent_uuid,
                    gi,
                    ci,
                    mig_uuid,
                    ..
                },
                v3,
            ) => {
                let tuple = format!(
                    r#"{{"parentMinor":{parent_minor},"giId":{gi},"ciId":{ci},"migUUID":"{mig_uuid}","parentUUID":"{parent_uuid}"}}"#
                );
                if v3 {
                    format!(r#"{{"mig":{{"concrete":{tuple},"device":{device}}}}}"#)
                } else {
                    format!(r#"{{"gpu":null,"mig":{{"concrete":{tuple},"device":{device}}}}}"#)
                }
            }
            (Dev::Vfio { uuid, bus_id, .. }, _) => {
                let bus = bus_id
                    .as_ref()
                    .map(|bus| format!(r#","pciBusID":"{bus}""#))
                    .unwrap_or_default();
                format!(
                    r#"{{"gpu":null,"mig":null,"vfio":{{"info":{{"uuid":"{uuid}"{bus}}},"device":{device}}}}}"#
                )
            }
        }
    }
}

#[derive(Clone)]
struct UpClaim {
    uid: String,
    name: String,
    state: &'static str,
    devices: Vec<Dev>,
    mps_daemon: &'static str,
    time_slice_applied: bool,
    admin: bool,
}

impl UpClaim {
    fn completed(uid: &str, devices: Vec<Dev>) -> Self {
        Self {
            uid: uid.to_owned(),
            name: format!("claim-{uid}"),
            state: "PrepareCompleted",
            devices,
            mps_daemon: "",
            time_slice_applied: false,
            admin: false,
        }
    }

    fn claim_ref(&self) -> ClaimRef {
        ClaimRef::new("default", &self.name, &self.uid)
    }

    /// The ResourceClaimStatus upstream records (the allocation, abridged to what matters).
    fn status(&self) -> String {
        let results: Vec<String> = self
            .devices
            .iter()
            .map(|device| {
                let admin = if self.admin { r#","adminAccess":true"# } else { "" };
                format!(
                    r#"{{"request":"gpu","driver":"{DRIVER_NAME}","pool":"{NODE_NAME}","device":"{}"{admin}}}"#,
                    device.name()
                )
            })
            .collect();
        format!(
            r#"{{"allocation":{{"devices":{{"results":[{}]}},"nodeSelector":{{"nodeSelectorTerms":[{{"matchFields":[{{"key":"metadata.name","operator":"In","values":["{NODE_NAME}"]}}]}}]}}}}}}"#,
            results.join(",")
        )
    }

    fn groups(&self, v3: bool) -> String {
        if self.state != "PrepareCompleted" {
            return "null".to_owned();
        }
        let devices: Vec<String> = self.devices.iter().map(|d| d.json(&self.uid, v3)).collect();
        let applied = if self.time_slice_applied {
            r#","timeSliceApplied":true"#
        } else {
            ""
        };
        format!(
            r#"[{{"devices":[{}],"configState":{{"mpsControlDaemonID":"{}"{applied}}}}}]"#,
            devices.join(","),
            self.mps_daemon
        )
    }

    fn v1(&self) -> String {
        format!(
            r#"{{"status":{},"preparedDevices":{}}}"#,
            self.status(),
            self.groups(false)
        )
    }

    fn v2(&self, v3: bool) -> String {
        format!(
            r#"{{"checkpointState":"{}","status":{},"preparedDevices":{},"name":"{}","namespace":"default"}}"#,
            self.state,
            self.status(),
            self.groups(v3),
            self.name
        )
    }
}

fn claims_map(claims: &[UpClaim], each: impl Fn(&UpClaim) -> String) -> String {
    let mut sorted: Vec<&UpClaim> = claims.iter().collect();
    sorted.sort_by(|a, b| a.uid.cmp(&b.uid));
    let entries: Vec<String> = sorted
        .iter()
        .map(|claim| format!(r#""{}":{}"#, claim.uid, each(claim)))
        .collect();
    format!("{{{}}}", entries.join(","))
}

/// `{"checksum":N,"v1":…}`: the only layout before v2 (upstream 25.3).
fn upstream_v1(claims: &[UpClaim]) -> String {
    let v1 = format!(
        r#"{{"preparedClaims":{}}}"#,
        claims_map(claims, UpClaim::v1)
    );
    let sum = go_checksum(&format!(r#"{{"checksum":0,"v1":{v1}}}"#));
    format!(r#"{{"checksum":{sum},"v1":{v1}}}"#)
}

/// The v2 layout of kubernetes-sigs HEAD: `version`, the v1 projection of completed claims,
/// and v2 with its own checksum and the boot ID.
fn upstream_v2(claims: &[UpClaim], boot_id: Option<&str>) -> String {
    let completed: Vec<UpClaim> = claims
        .iter()
        .filter(|claim| claim.state == "PrepareCompleted")
        .cloned()
        .collect();
    let v1 = format!(
        r#"{{"preparedClaims":{}}}"#,
        claims_map(&completed, UpClaim::v1)
    );
    let v1_sum = go_checksum(&format!(r#"{{"checksum":0,"v1":{v1}}}"#));
    let boot = boot_id
        .map(|id| format!(r#","nodeBootID":"{id}""#))
        .unwrap_or_default();
    let body = format!(
        r#","preparedClaims":{}{boot}}}"#,
        claims_map(claims, |claim| claim.v2(false))
    );
    let v2_sum = go_checksum(&format!(r#"{{"checksum":0{body}"#));
    format!(r#"{{"version":"v2","checksum":{v1_sum},"v1":{v1},"v2":{{"checksum":{v2_sum}{body}}}"#)
}

/// The NVIDIA mirror's newest layout: v1, v2 and v3, v3 with lower-case device keys.
fn upstream_v3(claims: &[UpClaim]) -> String {
    let v1 = format!(
        r#"{{"preparedClaims":{}}}"#,
        claims_map(claims, UpClaim::v1)
    );
    let v1_sum = go_checksum(&format!(r#"{{"checksum":0,"v1":{v1}}}"#));
    let section = |v3: bool| {
        let body = format!(
            r#","preparedClaims":{}}}"#,
            claims_map(claims, |claim| claim.v2(v3))
        );
        format!(
            r#"{{"checksum":{}{body}"#,
            go_checksum(&format!(r#"{{"checksum":0{body}"#))
        )
    };
    format!(
        r#"{{"checksum":{v1_sum},"v1":{v1},"v2":{},"v3":{}}}"#,
        section(false),
        section(true)
    )
}

// ---- the node ------------------------------------------------------------------------------

struct Node {
    f: Fixture,
    cluster: TestCluster,
}

impl Node {
    async fn new(profile: &str) -> Self {
        Self {
            f: Fixture::new(profile),
            cluster: TestCluster::start().await.unwrap(),
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.cluster.plugins_dir().join(DRIVER_NAME)
    }

    fn checkpoint_path(&self) -> PathBuf {
        self.data_dir().join("checkpoint.json")
    }

    /// Upstream's file where it leaves it, and its CDI specs.
    fn upstream_left(&self, file: &str, claims: &[UpClaim]) {
        std::fs::create_dir_all(self.data_dir()).unwrap();
        std::fs::write(self.checkpoint_path(), file).unwrap();
        std::fs::create_dir_all(self.cluster.cdi_root()).unwrap();
        for claim in claims {
            std::fs::write(self.upstream_spec(&claim.uid), upstream_spec(&claim.uid)).unwrap();
        }
    }

    fn upstream_spec(&self, uid: &str) -> PathBuf {
        self.cluster
            .cdi_root()
            .join(format!("k8s.gpu.nvidia.com-claim_{uid}.yaml"))
    }

    fn migration(&self, gates: &str) -> UpstreamCheckpoint {
        UpstreamCheckpoint::new(
            self.f.backend.clone() as Arc<dyn GpuBackend>,
            Arc::new(self.f.host.clone()) as Arc<dyn Host>,
            gates.parse().unwrap(),
        )
    }

    async fn start(
        &self,
        driver: &NvidiaDriver,
        migration: Option<UpstreamCheckpoint>,
    ) -> Result<KubeletPlugin, PluginError> {
        let mut builder = self
            .cluster
            .plugin(driver.clone(), DRIVER_NAME)
            .cdi_kind(cdi_kind().unwrap())
            .serialize_operations(driver.serializes_operations());
        if let Some(migration) = migration {
            builder = builder.foreign_checkpoint(migration);
        }
        builder.start().await
    }

    async fn register(&self, plugin: &KubeletPlugin) -> RegisteredPlugin {
        self.cluster
            .register(plugin, KubeletVersion::V1_36)
            .await
            .unwrap()
    }

    fn records(&self) -> std::collections::BTreeMap<String, ClaimRecord> {
        let (checkpoint, _) = Checkpoint::open(&self.data_dir(), BOOT_ID).unwrap();
        checkpoint.records().unwrap()
    }

    /// The kept originals, `checkpoint.json.upstream-<time>`.
    fn kept(&self) -> Vec<PathBuf> {
        let mut kept: Vec<PathBuf> = std::fs::read_dir(self.data_dir())
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| {
                path.file_name()
                    .and_then(|name| name.to_str())
                    .is_some_and(|name| name.starts_with("checkpoint.json.upstream-"))
            })
            .collect();
        kept.sort();
        kept
    }
}

/// A transient spec as upstream writes it (YAML, its kind).
fn upstream_spec(uid: &str) -> String {
    format!(
        "cdiVersion: 0.5.0\nkind: k8s.gpu.nvidia.com/claim\ndevices:\n- name: {uid}-gpu-0\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n"
    )
}

fn state_of(record: &ClaimRecord) -> ClaimState {
    ClaimState::from_value(record.driver_state.as_ref().expect("a driver state")).unwrap()
}

fn gpu_dev(f: &Fixture, index: usize) -> Dev {
    let gpu = &f.inventory.gpus[index].info;
    Dev::Gpu {
        uuid: gpu.uuid.clone(),
        name: format!("gpu-{}", gpu.minor),
    }
}

// ---- tests ----------------------------------------------------------------------------------

#[tokio::test]
async fn a_v2_checkpoint_is_taken_over_and_its_claims_are_served_and_unprepared() {
    let node = Node::new("dgx-a100").await;
    let f = &node.f;
    // dgx-a100: GPU 0 has seven static 1g.10gb MIG devices; GPU 1 is a full GPU.
    let gpu0 = &f.inventory.gpus[0];
    let mig = &gpu0.mig_devices[2];
    let mig_name = format!(
        "gpu-{}-mig-1g10gb-{}-{}",
        gpu0.info.minor, mig.profile_id, mig.placement.start
    );
    let full = UpClaim {
        time_slice_applied: true,
        ..UpClaim::completed("uid-full", vec![gpu_dev(f, 1)])
    };
    let static_mig = UpClaim::completed(
        "uid-mig",
        vec![Dev::Mig {
            parent_minor: gpu0.info.minor,
            parent_uuid: gpu0.info.uuid.clone(),
            gi: mig.gpu_instance_id,
            ci: mig.compute_instance_id,
            mig_uuid: mig.uuid.clone(),
            name: mig_name.clone(),
        }],
    );
    let admin = UpClaim {
        admin: true,
        ..UpClaim::completed("uid-admin", vec![gpu_dev(f, 2)])
    };
    let halfway = UpClaim {
        state: "PrepareStarted",
        ..UpClaim::completed("uid-halfway", vec![gpu_dev(f, 3)])
    };
    let claims = [
        full.clone(),
        static_mig.clone(),
        admin.clone(),
        halfway.clone(),
    ];
    let file = upstream_v2(&claims, Some(BOOT_ID));
    node.upstream_left(&file, &claims);

    let driver = f.driver("");
    let plugin = node.start(&driver, Some(node.migration(""))).await.unwrap();

    // The original is kept byte for byte; the checkpoint is the SDK's now.
    let kept = node.kept();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(std::fs::read_to_string(&kept[0]).unwrap(), file);
    let records = node.records();
    assert_eq!(
        records.keys().collect::<Vec<_>>(),
        ["uid-admin", "uid-full", "uid-mig"],
        "the half-prepared claim was rolled back at start"
    );
    // Its upstream spec went with the rollback; the others stay for their running pods.
    assert!(!node.upstream_spec("uid-halfway").exists());
    assert!(node.upstream_spec("uid-full").exists());

    let gpu1 = &f.inventory.gpus[1].info;
    let full_record = &records["uid-full"];
    assert!(full_record.is_completed());
    assert_eq!(
        (full_record.namespace.as_str(), full_record.name.as_str()),
        ("default", "claim-uid-full")
    );
    assert_eq!(full_record.devices[0].request_names, ["gpu"]);
    assert_eq!(
        full_record.devices[0].cdi_device_ids,
        [format!(
            "k8s.gpu.nvidia.com/claim=uid-full-gpu-{}",
            gpu1.minor
        )]
    );
    let state = state_of(full_record);
    assert_eq!(
        state.devices[0].kind,
        PreparedKind::Gpu {
            uuid: gpu1.uuid.clone(),
            minor: gpu1.minor,
            pci_bus_id: gpu1.pci.bus_id.clone(),
        }
    );
    assert_eq!(
        state.sharing.len(),
        1,
        "the time slice upstream set is undone at unprepare"
    );
    assert!(state_of(&records["uid-admin"]).devices[0].admin_access);
    assert_eq!(
        state_of(&records["uid-mig"]).devices[0].kind,
        PreparedKind::Mig {
            uuid: mig.uuid.clone(),
            parent_uuid: gpu0.info.uuid.clone(),
            parent_minor: gpu0.info.minor,
            gpu_instance_id: mig.gpu_instance_id,
            compute_instance_id: mig.compute_instance_id,
        }
    );
    // The reconcile reserved them: another claim cannot get these devices now.
    let reserved = driver.prepared_devices();
    assert_eq!(
        reserved
            .get(&format!("gpu-{}", gpu1.minor))
            .map(String::as_str),
        Some("uid-full")
    );
    assert_eq!(reserved.get(&mig_name).map(String::as_str), Some("uid-mig"));

    // The kubelet's calls: prepare again answers from the checkpoint with upstream's CDI IDs;
    // unprepare undoes (time slice back to Default) and removes upstream's spec.
    let smi = f
        .driver_root
        .resolve(std::path::Path::new("/usr/bin/nvidia-smi"))
        .display()
        .to_string();
    f.host.script(&smi, [CommandOutput::ok("")]);
    f.host.clear_events();
    let kubelet = node.register(&plugin).await;
    let prepared = kubelet.prepare(&[full.claim_ref()]).await.unwrap();
    assert_contains(
        format!("{prepared:?}"),
        format!("k8s.gpu.nvidia.com/claim=uid-full-gpu-{}", gpu1.minor),
    );
    let outcome = kubelet.unprepare(&[full.claim_ref()]).await.unwrap();
    assert_eq!(outcome["uid-full"], Ok(()));
    assert!(!node.upstream_spec("uid-full").exists());
    assert!(!node.records().contains_key("uid-full"));
    assert_eq!(
        f.host.events(),
        [HostEvent::Command(HostCommand::new(
            smi,
            [
                "compute-policy",
                "-i",
                gpu1.uuid.as_str(),
                "--set-timeslice",
                "0"
            ]
        ))]
    );
    assert!(
        !driver
            .prepared_devices()
            .contains_key(&format!("gpu-{}", gpu1.minor))
    );
    plugin.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_v1_checkpoint_of_the_oldest_layout_is_taken_over() {
    let node = Node::new("dgx-h100").await;
    let claim = UpClaim::completed("uid-old", vec![gpu_dev(&node.f, 0)]);
    node.upstream_left(&upstream_v1(std::slice::from_ref(&claim)), &[]);
    let driver = node.f.driver("");
    let plugin = node.start(&driver, Some(node.migration(""))).await.unwrap();
    let records = node.records();
    let record = &records["uid-old"];
    assert!(record.is_completed());
    // v1 recorded no name: the kubelet's unprepare names the claim.
    assert_eq!(record.name, "");
    assert_eq!(
        driver
            .prepared_devices()
            .get(&format!("gpu-{}", node.f.inventory.gpus[0].info.minor)),
        Some(&"uid-old".to_owned())
    );
    let kubelet = node.register(&plugin).await;
    assert_eq!(
        kubelet.unprepare(&[claim.claim_ref()]).await.unwrap()["uid-old"],
        Ok(())
    );
    assert!(node.records().is_empty());
    plugin.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_v3_checkpoint_with_lower_case_device_keys_is_taken_over() {
    let node = Node::new("dgx-h100").await;
    let claim = UpClaim::completed("uid-v3", vec![gpu_dev(&node.f, 4)]);
    node.upstream_left(&upstream_v3(std::slice::from_ref(&claim)), &[]);
    let driver = node.f.driver("");
    let plugin = node.start(&driver, Some(node.migration(""))).await.unwrap();
    let record = &node.records()["uid-v3"];
    assert_eq!(record.devices[0].pool, NODE_NAME);
    assert_eq!(record.devices[0].request_names, ["gpu"]);
    assert_eq!(
        state_of(record).devices[0].device,
        format!("gpu-{}", node.f.inventory.gpus[4].info.minor)
    );
    plugin.shutdown().await.unwrap();
}

const DYNAMIC: &str = "DynamicMIG=true";

/// What upstream's prepare of a 3g.40gb partition at 4:4 left on GPU `index`: MIG on, a GPU
/// and a compute instance. Returns the device as upstream records it.
fn upstream_partition(f: &Fixture, index: usize) -> Dev {
    let gpu = &f.inventory.gpus[index].info;
    let mig: &dyn MigManager = f.backend.as_ref();
    mig.set_mig_mode(&gpu.uuid, true).unwrap();
    let gi = mig
        .create_gpu_instance(&gpu.uuid, 9, MigPlacement::new(4, 4))
        .unwrap();
    let ci = mig.create_compute_instance(&gpu.uuid, gi).unwrap();
    let created = f
        .backend
        .mig_devices(&gpu.uuid)
        .unwrap()
        .into_iter()
        .find(|device| device.gpu_instance_id == gi && device.compute_instance_id == ci)
        .unwrap();
    Dev::Mig {
        parent_minor: gpu.minor,
        parent_uuid: gpu.uuid.clone(),
        gi,
        ci,
        mig_uuid: created.uuid,
        name: format!("gpu-{}-mig-3g40gb-9-4", gpu.minor),
    }
}

#[tokio::test]
async fn dynamic_mig_start_keeps_the_instance_a_migrated_claim_holds() {
    let node = Node::new("dgx-h100").await;
    let f = &node.f;
    f.creatable_mig_capabilities();
    let held = upstream_partition(f, 0);
    // An instance no claim records (upstream's prepare died half-way): the clean-up destroys it.
    upstream_partition(f, 1);
    let claim = UpClaim::completed("uid-slice", vec![held.clone()]);
    node.upstream_left(
        &upstream_v2(std::slice::from_ref(&claim), Some(BOOT_ID)),
        &[],
    );
    let gpu0 = f.inventory.gpus[0].info.clone();
    let gpu1 = f.inventory.gpus[1].info.clone();
    let Dev::Mig {
        gi, ci, mig_uuid, ..
    } = held
    else {
        unreachable!()
    };

    let driver = f.driver(DYNAMIC);
    let plugin = node
        .start(&driver, Some(node.migration(DYNAMIC)))
        .await
        .unwrap();
    // The held instance survived the start-up clean-up, the orphan did not.
    let on_gpu0 = f.backend.mig_devices(&gpu0.uuid).unwrap();
    assert_eq!(on_gpu0.len(), 1, "{on_gpu0:?}");
    assert_eq!(on_gpu0[0].uuid, mig_uuid);
    assert!(f.backend.mig_devices(&gpu1.uuid).unwrap().is_empty());
    let records = node.records();
    assert_eq!(
        state_of(&records["uid-slice"]).devices[0].kind,
        PreparedKind::MigDynamic(MigInstance {
            uuid: mig_uuid,
            parent_uuid: gpu0.uuid.clone(),
            parent_minor: gpu0.minor,
            profile_id: 9,
            placement_start: 4,
            placement_size: 4,
            gpu_instance_id: gi,
            compute_instance_id: ci,
        })
    );
    // Unprepare destroys it, as upstream's would have.
    let kubelet = node.register(&plugin).await;
    assert_eq!(
        kubelet.unprepare(&[claim.claim_ref()]).await.unwrap()["uid-slice"],
        Ok(())
    );
    assert!(f.backend.mig_devices(&gpu0.uuid).unwrap().is_empty());
    plugin.shutdown().await.unwrap();
}

/// Without the migration (the behaviour the issue reported), upstream's file reads as corrupt,
/// is moved aside, and the dynamic MIG clean-up destroys the running pod's instance.
#[tokio::test]
async fn without_the_migration_the_running_pods_instance_is_destroyed() {
    let node = Node::new("dgx-h100").await;
    let f = &node.f;
    let held = upstream_partition(f, 0);
    let claim = UpClaim::completed("uid-slice", vec![held]);
    node.upstream_left(
        &upstream_v2(std::slice::from_ref(&claim), Some(BOOT_ID)),
        &[],
    );
    let driver = f.driver(DYNAMIC);
    let plugin = node.start(&driver, None).await.unwrap();
    assert!(
        f.backend
            .mig_devices(&f.inventory.gpus[0].info.uuid)
            .unwrap()
            .is_empty()
    );
    assert!(node.records().is_empty());
    plugin.shutdown().await.unwrap();
}

/// The refusal the plugin's start fails with, and the file left as upstream wrote it.
async fn refused(node: &Node, driver: &NvidiaDriver, gates: &str, file: &str) -> String {
    let error = node
        .start(driver, Some(node.migration(gates)))
        .await
        .expect_err("the start must be refused");
    assert!(matches!(error, PluginError::Checkpoint(_)), "{error:?}");
    assert_eq!(
        std::fs::read_to_string(node.checkpoint_path()).unwrap(),
        file
    );
    assert!(node.kept().is_empty());
    error.to_string()
}

#[tokio::test]
async fn an_upstream_mps_daemon_refuses_the_start_with_instructions() {
    let node = Node::new("dgx-h100").await;
    let mps = UpClaim {
        mps_daemon: "4c1ad3a7-mps",
        ..UpClaim::completed("uid-mps", vec![gpu_dev(&node.f, 0)])
    };
    let fine = UpClaim::completed("uid-fine", vec![gpu_dev(&node.f, 1)]);
    let file = upstream_v2(&[mps, fine], Some(BOOT_ID));
    node.upstream_left(&file, &[]);
    let driver = node.f.driver("");
    let message = refused(&node, &driver, "", &file).await;
    assert_contains(&message, "default/claim-uid-mps (uid-mps)");
    assert_contains(
        &message,
        "MPS control daemon upstream started (4c1ad3a7-mps)",
    );
    assert_contains(&message, "Put the upstream driver back on this node");
    assert_contains(&message, "migrating-from-upstream.md");
    assert!(!message.contains("uid-fine"), "{message}");
    // Nothing of the driver changed either: no reservation.
    assert!(driver.prepared_devices().is_empty());
}

#[tokio::test]
async fn a_damaged_upstream_checkpoint_refuses_the_start() {
    let node = Node::new("dgx-h100").await;
    let claim = UpClaim::completed("uid-1", vec![gpu_dev(&node.f, 0)]);
    let file = upstream_v2(std::slice::from_ref(&claim), Some(BOOT_ID)).replace("uid-1", "uid-2");
    node.upstream_left(&file, &[]);
    let message = refused(&node, &node.f.driver(""), "", &file).await;
    assert_contains(&message, "checksum of section `v2` does not match");
}

#[tokio::test]
async fn a_gpu_the_node_lost_or_renumbered_refuses_the_start() {
    let node = Node::new("dgx-h100").await;
    let gone = UpClaim::completed(
        "uid-gone",
        vec![Dev::Gpu {
            uuid: "GPU-00000000-dead-beef-0000-000000000000".into(),
            name: "gpu-0".into(),
        }],
    );
    let gpu2 = &node.f.inventory.gpus[2].info;
    let renumbered = UpClaim::completed(
        "uid-renumbered",
        vec![Dev::Gpu {
            uuid: gpu2.uuid.clone(),
            name: format!("gpu-{}", gpu2.minor + 1),
        }],
    );
    let file = upstream_v2(&[gone, renumbered], Some(BOOT_ID));
    node.upstream_left(&file, &[]);
    let message = refused(&node, &node.f.driver(""), "", &file).await;
    assert_contains(&message, "which this node does not have");
    assert_contains(&message, format!("which is gpu-{} now", gpu2.minor));
}

#[tokio::test]
async fn an_upstream_checkpoint_of_an_earlier_boot_keeps_no_claim() {
    let node = Node::new("dgx-h100").await;
    let claim = UpClaim::completed("uid-1", vec![gpu_dev(&node.f, 0)]);
    let file = upstream_v2(std::slice::from_ref(&claim), Some("an-earlier-boot"));
    node.upstream_left(&file, &[]);
    let driver = node.f.driver("");
    let plugin = node.start(&driver, Some(node.migration(""))).await.unwrap();
    assert!(node.records().is_empty());
    assert_eq!(std::fs::read_to_string(&node.kept()[0]).unwrap(), file);
    assert!(driver.prepared_devices().is_empty());
    plugin.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_file_without_boot_id_written_before_the_boot_keeps_no_claim() {
    let node = Node::new("dgx-h100").await;
    let claim = UpClaim::completed("uid-1", vec![gpu_dev(&node.f, 0)]);
    node.upstream_left(&upstream_v1(std::slice::from_ref(&claim)), &[]);
    let written = std::fs::metadata(node.checkpoint_path())
        .unwrap()
        .modified()
        .unwrap();
    let migration = node
        .migration("")
        .booted_at(Some(written + Duration::from_secs(60)));
    let driver = node.f.driver("");
    let plugin = node.start(&driver, Some(migration)).await.unwrap();
    assert!(node.records().is_empty());
    plugin.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_vfio_claim_gives_the_gpu_back_to_nvidia_at_unprepare() {
    let node = Node::new("dgx-h100").await;
    let f = &node.f;
    let mut bus_ids: Vec<String> = f
        .inventory
        .gpus
        .iter()
        .map(|g| g.info.pci.bus_id.clone())
        .collect();
    bus_ids.sort();
    let gpu = f
        .inventory
        .gpus
        .iter()
        .find(|g| g.info.pci.bus_id == bus_ids[0])
        .unwrap()
        .info
        .clone();
    // Upstream's prepare moved the GPU to vfio-pci.
    f.host.script("fuser", [CommandOutput::failed(1, "")]);
    VfioBinder::new(&f.host, Duration::from_millis(1), Duration::from_millis(20))
        .bind(&gpu.pci.bus_id, None)
        .unwrap();
    assert_eq!(f.bound_driver(&gpu.pci.bus_id).as_deref(), Some("vfio-pci"));
    let vm = UpClaim::completed(
        "uid-vm",
        vec![Dev::Vfio {
            uuid: gpu.uuid.clone(),
            bus_id: Some(gpu.pci.bus_id.to_uppercase()),
            name: "gpu-vfio-0".into(),
        }],
    );
    node.upstream_left(&upstream_v2(std::slice::from_ref(&vm), Some(BOOT_ID)), &[]);
    let gates = "PassthroughSupport=true";
    let driver = f.driver(gates);
    let plugin = node
        .start(&driver, Some(node.migration(gates)))
        .await
        .unwrap();
    let state = state_of(&node.records()["uid-vm"]);
    let PreparedKind::Vfio(binding) = &state.devices[0].kind else {
        panic!("{state:?}");
    };
    assert_eq!(binding.bus_id, gpu.pci.bus_id);
    assert_eq!(binding.vfio_driver, "vfio-pci");
    assert_eq!(binding.previous_driver.as_deref(), Some("nvidia"));
    assert!(binding.rebound());
    let kubelet = node.register(&plugin).await;
    assert_eq!(
        kubelet.unprepare(&[vm.claim_ref()]).await.unwrap()["uid-vm"],
        Ok(())
    );
    assert_eq!(f.bound_driver(&gpu.pci.bus_id).as_deref(), Some("nvidia"));
    plugin.shutdown().await.unwrap();
}

#[tokio::test]
async fn vfio_claims_need_a_recorded_address_and_the_passthrough_gate() {
    let node = Node::new("dgx-h100").await;
    let gpu = &node.f.inventory.gpus[0].info;
    let old = UpClaim::completed(
        "uid-old-vm",
        vec![Dev::Vfio {
            uuid: gpu.uuid.clone(),
            bus_id: None,
            name: "gpu-vfio-0".into(),
        }],
    );
    let file = upstream_v2(std::slice::from_ref(&old), Some(BOOT_ID));
    node.upstream_left(&file, &[]);
    let gates = "PassthroughSupport=true";
    let message = refused(&node, &node.f.driver(gates), gates, &file).await;
    assert_contains(&message, "did not record its PCI address");
    let message = refused(&node, &node.f.driver(""), "", &file).await;
    assert_contains(&message, "without the PassthroughSupport feature gate");
}

#[tokio::test]
async fn a_file_in_neither_format_is_still_moved_aside() {
    let node = Node::new("dgx-h100").await;
    node.upstream_left("{\"something\":\"else\"}", &[]);
    let driver = node.f.driver("");
    let plugin = node.start(&driver, Some(node.migration(""))).await.unwrap();
    assert!(node.kept().is_empty());
    let corrupt: Vec<_> = std::fs::read_dir(node.data_dir())
        .unwrap()
        .filter_map(|entry| entry.ok())
        .filter(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .starts_with("checkpoint.json.corrupt-")
        })
        .collect();
    assert_eq!(corrupt.len(), 1);
    plugin.shutdown().await.unwrap();
}

#[test]
fn the_test_checksum_agrees_with_the_drivers() {
    for json in [
        r#"{"checksum":0,"v1":{}}"#,
        r#"{"checksum":0,"preparedClaims":{"u":{"checkpointState":"PrepareStarted"}}}"#,
    ] {
        assert_eq!(
            go_checksum(json),
            dra_driver_nvidia::driver::kubelet_checksum(json.as_bytes())
        );
    }
}
