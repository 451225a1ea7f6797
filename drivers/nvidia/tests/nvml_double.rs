//! The NVML backend over the libnvidia-ml double (`nvml-mock`): for every shipped profile it
//! reads what the mock backend reads and the driver publishes the same ResourceSlices; then
//! what real nodes do to NVML (lost GPUs, GPUs bound to vfio-pci, refused placements, events
//! inside MIG devices …), each answered as `docs/nvml-double.md` says.

#![cfg(feature = "nvml")]

use dra_driver_nvidia::backend::mock::{MockBackend, SHIPPED_PROFILES};
use dra_driver_nvidia::backend::nvml::NvmlBackend;
use dra_driver_nvidia::backend::{GpuBackend, Inventory};
use dra_driver_nvidia::devices::{Discovery, DiscoveryOptions};
use dra_driver_nvidia::host::FakeHostTree;
use nvml_mock::NvmlDouble;

/// A private double serving `profile`, and the NVML backend on it.
fn over_double(profile: &str) -> (NvmlDouble, NvmlBackend) {
    let double = NvmlDouble::new(profile).unwrap_or_else(|error| panic!("{profile}: {error}"));
    let backend =
        NvmlBackend::open(double.library()).unwrap_or_else(|error| panic!("{profile}: {error}"));
    (double, backend)
}

/// What the mock backend reads, less what NVML cannot report (the PCIe root: discovery reads
/// it from sysfs).
fn mock_inventory(profile: &str) -> Inventory {
    let mut inventory = MockBackend::from_profile(profile)
        .unwrap()
        .inventory()
        .unwrap();
    for gpu in &mut inventory.gpus {
        gpu.info.pcie_root = None;
    }
    inventory
}

#[test]
fn every_profile_reads_the_same_through_nvml() {
    for (profile, _) in SHIPPED_PROFILES {
        let (_double, nvml) = over_double(profile);
        let read = nvml.inventory().unwrap();
        let expected = mock_inventory(profile);
        for (nvml_gpu, mock_gpu) in read.gpus.iter().zip(&expected.gpus) {
            assert_eq!(nvml_gpu, mock_gpu, "{profile}: GPU {}", mock_gpu.info.index);
        }
        assert_eq!(read, expected, "{profile}");
        // One GPU at a time, as prepare and unprepare ask.
        for gpu in &expected.gpus {
            assert_eq!(
                nvml.gpu(&gpu.info.uuid).unwrap().as_ref(),
                Some(&gpu.info),
                "{profile}"
            );
        }
        assert_eq!(
            nvml.gpu("GPU-00000000-0000-0000-0000-000000000000")
                .unwrap(),
            None
        );
    }
}

#[test]
fn every_profile_publishes_the_same_slices_through_nvml() {
    let layouts = [
        DiscoveryOptions::new(),
        DiscoveryOptions::new().passthrough(true),
        DiscoveryOptions::new().dynamic_mig(true),
    ];
    for (profile, _) in SHIPPED_PROFILES {
        for options in &layouts {
            let dir = tempfile::tempdir().unwrap();
            let mock = MockBackend::from_profile(profile).unwrap();
            let host = FakeHostTree::new(dir.path())
                .dynamic_mig(options.dynamic_mig)
                .build(mock.hardware())
                .unwrap();
            let (_double, nvml) = over_double(profile);
            let through_mock = Discovery::discover(&mock, &host, options)
                .unwrap()
                .resources("node-1");
            let through_nvml = Discovery::discover(&nvml, &host, options)
                .unwrap()
                .resources("node-1");
            // The Debug rendering holds every field of every device, counter and pool in order.
            assert_eq!(
                format!("{through_nvml:#?}"),
                format!("{through_mock:#?}"),
                "{profile} {options:?}"
            );
        }
    }
}

// ---- NVLink --------------------------------------------------------------------------------

/// Links, their far ends and NVML's peer-to-peer answer, read through `nvmlDeviceGetNvLinkState`,
/// `nvmlDeviceGetNvLinkRemotePciInfo_v2` and `nvmlDeviceGetP2PStatus`, are the mock backend's,
/// GPU by GPU, on every shipped profile.
#[test]
fn nvlinks_and_peers_read_the_same_through_nvml() {
    for (profile, _) in SHIPPED_PROFILES {
        let (_double, nvml) = over_double(profile);
        let read = nvml.inventory().unwrap();
        let expected = mock_inventory(profile);
        assert_eq!(read.gpus.len(), expected.gpus.len(), "{profile}");
        for (nvml_gpu, mock_gpu) in read.gpus.iter().zip(&expected.gpus) {
            let gpu = format!("{profile}: GPU {}", mock_gpu.info.index);
            assert_eq!(nvml_gpu.info.uuid, mock_gpu.info.uuid, "{gpu}");
            assert_eq!(nvml_gpu.nvlinks, mock_gpu.nvlinks, "{gpu}");
            assert_eq!(nvml_gpu.nvlink_peers, mock_gpu.nvlink_peers, "{gpu}");
            assert_eq!(
                nvml.nvlinks(&mock_gpu.info.uuid).unwrap(),
                mock_gpu.nvlinks,
                "{gpu}: asked alone"
            );
        }
    }
    // What the shipped profiles hold, so that the comparison above compares something.
    let links = |profile: &str| -> Vec<usize> {
        let (_double, nvml) = over_double(profile);
        nvml.inventory()
            .unwrap()
            .gpus
            .iter()
            .map(|gpu| gpu.nvlinks.iter().filter(|link| link.active).count())
            .collect()
    };
    assert_eq!(links("dgx-a100"), [12; 8]);
    assert_eq!(links("dgx-h100"), [18; 8]);
    assert_eq!(links("pcie-a100-bridged"), [12; 4]);
    assert_eq!(links("mixed"), [0, 0]);
}

/// A bridged pair is a pair: NVML's far end of each link is the partner GPU, and NVML's P2P
/// answer names the partner and nothing across the pairs.
#[test]
fn bridged_pairs_are_read_through_nvml() {
    let (_double, nvml) = over_double("pcie-a100-bridged");
    let gpus = nvml.inventory().unwrap().gpus;
    let uuid = |at: usize| gpus[at].info.uuid.clone();
    for (gpu, partner) in [(0, 1), (1, 0), (2, 3), (3, 2)] {
        let far_ends: Vec<Option<&str>> = gpus[gpu]
            .nvlinks
            .iter()
            .map(|link| link.remote_pci_bus_id.as_deref())
            .collect();
        assert_eq!(
            far_ends,
            [Some(gpus[partner].info.pci.bus_id.as_str()); 12],
            "GPU {gpu}"
        );
        assert_eq!(
            gpus[gpu].nvlink_peers,
            Some(vec![uuid(partner)]),
            "GPU {gpu}"
        );
    }
    assert_eq!(nvml.nvlink_p2p(&uuid(0), &uuid(1)).unwrap(), Some(true));
    assert_eq!(nvml.nvlink_p2p(&uuid(1), &uuid(2)).unwrap(), Some(false));
}

/// NVML_ERROR_NOT_SUPPORTED on link 0: no NVLink, an empty list, and no peers asked.
#[test]
fn a_gpu_without_nvlink_has_no_links() {
    let (_double, nvml) = over_double("workstation");
    let t4 = nvml.gpus().unwrap().remove(0);
    assert_eq!(t4.product_name, "Tesla T4");
    assert!(nvml.nvlinks(&t4.uuid).unwrap().is_empty());
    let read = nvml.inventory().unwrap();
    assert!(read.gpus[0].nvlinks.is_empty());
    assert_eq!(read.gpus[0].nvlink_peers, None);
}

/// Links up whose far end NVML cannot name (NVSwitches invisible in a VM): the links count as
/// up with no far end, and the peers come from NVML's P2P answer, which the links alone could
/// not give.
#[test]
fn peers_come_from_nvml_when_far_ends_are_unknown() {
    let yaml = r#"
name: vm-without-nvswitches
driverVersion: "580.126.20"
cudaDriverVersion: "13.0"
models:
  h100:
    productName: NVIDIA H100 80GB HBM3
    brand: Nvidia
    architecture: Hopper
    computeCapability: "9.0"
    memoryMiB: 81559
    pciDeviceId: "0x2330"
gpus:
  - { model: h100, pciBusId: "0000:18:00.0", nvlinks: [unknown, unknown, null], nvlinkPeers: ["0000:2a:00.0"] }
  - { model: h100, pciBusId: "0000:2a:00.0", nvlinks: [unknown, unknown, null], nvlinkPeers: ["0000:18:00.0"] }
  - { model: h100, pciBusId: "0000:3a:00.0", nvlinks: [unknown], nvlinkPeers: [] }
  - { model: h100, pciBusId: "0000:5d:00.0" }
"#;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vm.yaml");
    std::fs::write(&path, yaml).unwrap();
    let profile = path.to_str().unwrap();
    let (_double, nvml) = over_double(profile);
    let read = nvml.inventory().unwrap();
    let uuid = |at: usize| read.gpus[at].info.uuid.clone();

    let first = &read.gpus[0].nvlinks;
    assert_eq!(first.len(), 3);
    assert!(first[0].active && first[1].active && !first[2].active);
    assert!(first.iter().all(|link| link.remote_pci_bus_id.is_none()));
    // NVML's P2P answer: the first two are peers, the third is linked to neither.
    assert_eq!(read.gpus[0].nvlink_peers, Some(vec![uuid(1)]));
    assert_eq!(read.gpus[1].nvlink_peers, Some(vec![uuid(0)]));
    assert_eq!(read.gpus[2].nvlink_peers, Some(vec![]));
    // No link, nothing asked.
    assert!(read.gpus[3].nvlinks.is_empty());
    assert_eq!(read.gpus[3].nvlink_peers, None);
    assert_eq!(nvml.nvlink_p2p(&uuid(0), &uuid(2)).unwrap(), Some(false));
    assert_eq!(read, mock_inventory(profile));
}

// ---- what real nodes do to NVML ------------------------------------------------------------

use std::time::Duration;

use dra_driver_nvidia::backend::events::HealthEventKind;
use dra_driver_nvidia::backend::mig::{MigError, MigManager};
use dra_driver_nvidia::backend::{MigMode, MigPlacement};

/// The `mixed` profile's A100, with its MIG devices.
fn mig_gpu(backend: &NvmlBackend) -> dra_driver_nvidia::backend::GpuInventory {
    backend
        .inventory()
        .unwrap()
        .gpus
        .into_iter()
        .find(|gpu| !gpu.mig_devices.is_empty())
        .unwrap()
}

fn uuids(backend: &NvmlBackend) -> Vec<String> {
    backend
        .gpus()
        .unwrap()
        .into_iter()
        .map(|gpu| gpu.uuid)
        .collect()
}

#[test]
fn nvml_starts_when_every_gpu_is_bound_to_vfio_pci() {
    let double = NvmlDouble::new("dgx-h100").unwrap();
    let all = uuids(&NvmlBackend::open(double.library()).unwrap());
    for uuid in &all {
        double.set_detached(uuid, true).unwrap();
    }
    // NVML_INIT_FLAG_NO_GPUS: init succeeds, and there is nothing to publish.
    let backend = NvmlBackend::open(double.library()).unwrap();
    assert!(backend.gpus().unwrap().is_empty());
    // One back on nvidia: NVML sees it again.
    double.set_detached(&all[2], false).unwrap();
    assert_eq!(uuids(&backend), [all[2].clone()]);
}

#[test]
fn gpu_device_nodes_are_let_go_at_shutdown_and_while_released() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockBackend::from_profile("dgx-h100").unwrap();
    FakeHostTree::new(dir.path())
        .build(mock.hardware())
        .unwrap();
    let double = NvmlDouble::with_root("dgx-h100", dir.path()).unwrap();
    let backend = NvmlBackend::open(double.library()).unwrap();
    assert_eq!(double.init_count().unwrap(), 1);
    assert_eq!(double.open_node_count().unwrap(), 0, "no handle taken yet");
    backend.inventory().unwrap();
    assert_eq!(double.open_node_count().unwrap(), 8);
    // What a "who holds /dev/nvidia0" check sees: this process.
    let node = std::fs::canonicalize(dir.path().join("dev/nvidia0")).unwrap();
    let held = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == node));
    assert!(held, "the library holds {} open", node.display());
    // And what the driver's scan of the host's /proc sees: the root's /proc shows the hold,
    // as the kernel's does, under this process's PID and name.
    let host = dra_driver_nvidia::host::RootedHost::new(dir.path());
    let holders = |node: &str| {
        dra_driver_nvidia::host::facts::node_holders(&host, std::path::Path::new(node)).unwrap()
    };
    let own_name = std::fs::read_to_string("/proc/self/comm").unwrap();
    assert_eq!(
        holders("/dev/nvidia0"),
        [dra_driver_nvidia::host::facts::NodeHolder {
            pid: std::process::id(),
            name: own_name.trim().to_owned(),
        }]
    );
    assert_eq!(holders("/dev/nvidia7").len(), 1);
    // Released (a GPU is about to go to vfio-pci): NVML shuts down between calls.
    let released = backend.release_devices();
    assert_eq!(double.open_node_count().unwrap(), 0);
    assert_eq!(double.init_count().unwrap(), 0);
    assert!(holders("/dev/nvidia0").is_empty(), "gone from /proc too");
    backend.inventory().unwrap();
    assert_eq!(
        double.open_node_count().unwrap(),
        0,
        "a call while released leaves nothing open"
    );
    drop(released);
    backend.inventory().unwrap();
    assert_eq!(double.open_node_count().unwrap(), 8, "shared again");
    drop(backend);
    assert_eq!(double.init_count().unwrap(), 0);
    assert_eq!(
        double.open_node_count().unwrap(),
        0,
        "nvmlShutdown closes them"
    );
}

/// Persistence mode, the driver's own (legacy) setting: read and set through NVML, set outside
/// NVML by an operator, refused without root.
#[test]
fn persistence_mode_is_read_and_set_through_nvml() {
    let (double, backend) = over_double("dgx-a100");
    let all = uuids(&backend);
    let gpu = all[2].as_str();
    assert_eq!(backend.persistence_mode(gpu).unwrap(), Some(false));
    double.set_persistence(gpu, true).unwrap();
    assert_eq!(backend.persistence_mode(gpu).unwrap(), Some(true));
    assert_eq!(backend.persistence_mode(&all[3]).unwrap(), Some(false));
    backend.set_persistence_mode(gpu, false).unwrap();
    assert_eq!(backend.persistence_mode(gpu).unwrap(), Some(false));
    backend.set_persistence_mode(gpu, true).unwrap();
    assert_eq!(backend.persistence_mode(gpu).unwrap(), Some(true));

    double.refuse_persistence(gpu).unwrap();
    let error = backend.set_persistence_mode(gpu, false).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "turning persistence mode off of {gpu}: the current user does not have permission to \
             perform this operation"
        )
    );
    assert_eq!(backend.persistence_mode(gpu).unwrap(), Some(true));
    // A GPU NVML does not know.
    assert!(matches!(
        backend.set_persistence_mode("GPU-00000000-0000-0000-0000-000000000000", true),
        Err(dra_driver_nvidia::backend::BackendError::NoSuchGpu { .. })
    ));
}

#[test]
fn a_lost_gpu_is_left_out_and_reported_alone() {
    let double = NvmlDouble::new("dgx-h100").unwrap();
    let backend = NvmlBackend::open(double.library()).unwrap();
    let all = uuids(&backend);
    let mut stream = backend.health_events(&all).unwrap();
    double.lose_gpu(&all[3]).unwrap();
    let event = stream.wait(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!(event.uuid, all[3], "the lost GPU, not every GPU");
    assert_eq!(event.kind, HealthEventKind::GpuLost);
    drop(stream);
    assert_eq!(
        backend.gpu(&all[3]).unwrap(),
        None,
        "gone for unprepare too"
    );
    // Discovery goes on without it.
    let left = uuids(&backend);
    assert_eq!(left.len(), 7);
    assert!(!left.contains(&all[3]));
}

#[test]
fn an_xid_inside_a_mig_device_names_the_mig_device() {
    let (double, backend) = over_double("mixed");
    let a100 = mig_gpu(&backend);
    let mig = &a100.mig_devices[2];
    let mut stream = backend.health_events(&uuids(&backend)).unwrap();
    double
        .inject_xid(
            &a100.info.uuid,
            94,
            Some((mig.gpu_instance_id, mig.compute_instance_id)),
        )
        .unwrap();
    let event = stream.wait(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!(
        (event.uuid.as_str(), event.kind),
        (mig.uuid.as_str(), HealthEventKind::Xid(94))
    );
    // Outside any MIG device: the GPU.
    double.inject_xid(&a100.info.uuid, 79, None).unwrap();
    let event = stream.wait(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!(event.uuid, a100.info.uuid);
    double.inject_double_bit_ecc(&a100.info.uuid).unwrap();
    let event = stream.wait(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!(event.kind, HealthEventKind::DoubleBitEcc);
}

#[test]
fn odd_answers_do_not_stop_discovery() {
    let double = NvmlDouble::new("dgx-a100").unwrap();
    let backend = NvmlBackend::open(double.library()).unwrap();
    let first = uuids(&backend)[0].clone();
    // A brand a newer driver added, a GPU without a memory size, a profile whose placements
    // NVML refuses.
    double.set_raw_brand(&first, 42).unwrap();
    double.memory_not_supported(&first).unwrap();
    double.refuse_placements(&first, 19).unwrap();
    let gpu = backend.inventory().unwrap().gpus.remove(0);
    assert_eq!(gpu.info.brand, "Unknown");
    assert_eq!(gpu.info.memory_bytes, 0);
    let ids: Vec<u32> = gpu.mig_profiles.iter().map(|profile| profile.id).collect();
    assert!(!ids.contains(&19), "{ids:?}");
    assert_eq!(ids.len(), 6, "the other profiles stay: {ids:?}");
}

#[test]
fn mig_changes_answer_with_nvml_error_codes() {
    let double = NvmlDouble::new("dgx-h100").unwrap();
    let backend = NvmlBackend::open(double.library()).unwrap();
    let gpu = uuids(&backend)[0].clone();
    // MIG off: creating is refused.
    let error = backend
        .create_gpu_instance(&gpu, 19, MigPlacement::new(0, 1))
        .unwrap_err();
    // NVML_ERROR_NOT_SUPPORTED, in nvml-wrapper's words.
    assert!(error.to_string().contains("not available"), "{error}");
    // Hopper switches at once.
    assert_eq!(
        backend.set_mig_mode(&gpu, true).unwrap(),
        MigMode::settled(true)
    );
    let gi = backend
        .create_gpu_instance(&gpu, 9, MigPlacement::new(0, 4))
        .unwrap();
    let ci = backend.create_compute_instance(&gpu, gi).unwrap();
    let taken = backend
        .create_gpu_instance(&gpu, 19, MigPlacement::new(2, 1))
        .unwrap_err();
    // NVML's INSUFFICIENT_RESOURCES, with the holder found as the mock backend names it.
    assert!(
        matches!(taken, MigError::PlacementTaken { gpu_instance_id, .. } if gpu_instance_id == gi),
        "{taken}"
    );
    let in_use = backend.destroy_gpu_instance(&gpu, gi).unwrap_err();
    assert!(
        in_use.to_string().to_lowercase().contains("in use"),
        "{in_use}"
    );
    let devices = backend.mig_devices(&gpu).unwrap();
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].profile, "3g.40gb");
    backend.destroy_compute_instance(&gpu, gi, ci).unwrap();
    backend.destroy_gpu_instance(&gpu, gi).unwrap();
    assert!(backend.gpu_instances(&gpu).unwrap().is_empty());
    assert_eq!(
        backend.set_mig_mode(&gpu, false).unwrap(),
        MigMode::settled(false)
    );
}

#[test]
fn a_mig_mode_change_stays_pending_while_the_gpu_is_busy() {
    let double = NvmlDouble::new("dgx-h100").unwrap();
    let backend = NvmlBackend::open(double.library()).unwrap();
    let gpu = uuids(&backend)[1].clone();
    double.set_busy(&gpu, true).unwrap();
    let mode = backend.set_mig_mode(&gpu, true).unwrap();
    assert_eq!(
        mode,
        MigMode {
            current: false,
            pending: true
        }
    );
}

#[test]
fn instances_gone_with_mig_switched_off_outside_count_as_destroyed() {
    let (double, backend) = over_double("mixed");
    let a100 = mig_gpu(&backend);
    let mig = &a100.mig_devices[0];
    double.set_mig_mode_outside(&a100.info.uuid, false).unwrap();
    // Unprepare of a MIG device whose instances went with MIG mode: nothing left to do.
    backend
        .destroy_compute_instance(
            &a100.info.uuid,
            mig.gpu_instance_id,
            mig.compute_instance_id,
        )
        .unwrap();
    backend
        .destroy_gpu_instance(&a100.info.uuid, mig.gpu_instance_id)
        .unwrap();
    assert!(backend.gpu_instances(&a100.info.uuid).unwrap().is_empty());
}

#[test]
fn a_gpu_refusing_event_registration_is_unmonitored_alone() {
    let (double, backend) = over_double("dgx-h100");
    let all = uuids(&backend);
    double.refuse_events(&all[5]).unwrap();
    let mut stream = backend.health_events(&all).unwrap();
    let event = stream.wait(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!(
        (event.uuid.as_str(), event.kind),
        (all[5].as_str(), HealthEventKind::Unmonitored)
    );
    // The others are watched.
    double.inject_xid(&all[0], 48, None).unwrap();
    let event = stream.wait(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!(
        (event.uuid.as_str(), event.kind),
        (all[0].as_str(), HealthEventKind::Xid(48))
    );
}

#[test]
fn the_recovery_action_comes_from_nvml() {
    use dra_driver_nvidia::backend::events::RecoveryAction;
    let (double, backend) = over_double("dgx-h100");
    let gpu = uuids(&backend)[4].clone();
    assert_eq!(
        backend.recovery_action(&gpu).unwrap(),
        Some(RecoveryAction::None)
    );
    double.set_recovery_action(&gpu, 1).unwrap();
    assert_eq!(
        backend.recovery_action(&gpu).unwrap(),
        Some(RecoveryAction::GpuReset)
    );
    double.set_recovery_action(&gpu, 2).unwrap();
    assert_eq!(
        backend.recovery_action(&gpu).unwrap(),
        Some(RecoveryAction::NodeReboot)
    );
}

/// The profile variants of current NVML headers past nvml-wrapper-sys's 13 (`-me`, `+me.all`,
/// and the `+gfx` ones at 10-12), on a machine whose table has them: read through NVML like
/// the rest. The rows are dgx-h100's with those names (the engines are not Blackwell's; what is
/// checked is that every enum index is asked).
#[test]
fn profile_variants_past_index_twelve_are_read() {
    let shipped = dra_driver_nvidia::backend::mock::SHIPPED_PROFILES
        .iter()
        .find(|(name, _)| *name == "dgx-h100")
        .unwrap()
        .1;
    let variants = [
        ("1g.10gb+gfx", 30, 1),
        ("1g.10gb-me", 31, 1),
        ("1g.10gb+me.all", 32, 1),
        ("2g.20gb-me", 33, 2),
        ("2g.20gb+me.all", 34, 2),
    ];
    let rows: String = variants
        .iter()
        .map(|(name, id, slices)| {
            let placements = if *slices == 1 { "{0,1,2,3,4,5,6}:1" } else { "{0,2,4}:2" };
            format!(
                "    - {{ id: {id}, name: {name}, sliceCount: {slices}, maxInstances: 1, memoryMiB: {}, multiprocessors: 16, copyEngines: 1, decoders: 0, encoders: 0, jpegEngines: 0, ofaEngines: 0, placements: \"{placements}\" }}\n",
                9984 * slices
            )
        })
        .collect();
    let anchor = "  h100-80gb-hbm3:\n    - { id: 19,";
    assert!(shipped.contains(anchor));
    let yaml = shipped
        .replacen(
            anchor,
            &format!("  h100-80gb-hbm3:\n{rows}    - {{ id: 19,"),
            1,
        )
        .replace("name: dgx-h100", "name: variants");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("variants.yaml");
    std::fs::write(&path, yaml).unwrap();
    let profile = path.to_str().unwrap();
    let (_double, nvml) = over_double(profile);
    let read = nvml.inventory().unwrap();
    let ids: Vec<u32> = read.gpus[0]
        .mig_profiles
        .iter()
        .map(|profile| profile.id)
        .collect();
    for (name, id, _) in variants {
        assert!(ids.contains(&id), "{name} ({id}) not read: {ids:?}");
    }
    assert_eq!(read, mock_inventory(profile));
}

/// `resource.kubernetes.io/numaNode` comes from the PCI device's sysfs node, not NVML's NUMA
/// ID (on GH200 and GB200 that is the GPU memory's node); `addressingMode` from NVML.
#[test]
fn numa_node_comes_from_sysfs_and_addressing_mode_from_nvml() {
    let shipped = dra_driver_nvidia::backend::mock::SHIPPED_PROFILES
        .iter()
        .find(|(name, _)| *name == "dgx-h100")
        .unwrap()
        .1;
    let anchor = "    pciDeviceId: \"0x2330\"\n";
    assert!(shipped.contains(anchor));
    let yaml = shipped.replacen(anchor, &format!("{anchor}    addressingMode: ATS\n"), 1);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ats.yaml");
    std::fs::write(&path, &yaml).unwrap();
    let profile = path.to_str().unwrap();
    let mock = MockBackend::from_profile(profile).unwrap();
    // sysfs puts GPU 0 on node 1; NVML (the profile) says 0.
    let mut sysfs = mock.hardware().clone();
    assert_eq!(sysfs.gpus[0].info.numa_node, Some(0));
    sysfs.gpus[0].info.numa_node = Some(1);
    let host = FakeHostTree::new(dir.path().join("host"))
        .build(&sysfs)
        .unwrap();
    let (_double, nvml) = over_double(profile);
    assert_eq!(nvml.gpus().unwrap()[0].numa_node, Some(0), "NVML's own ID");
    let discovery = Discovery::discover(&nvml, &host, &DiscoveryOptions::new()).unwrap();
    assert_eq!(discovery.gpus[0].info.numa_node, Some(1), "sysfs wins");
    assert_eq!(
        discovery.gpus[0].info.addressing_mode.as_deref(),
        Some("ATS")
    );
}
