use super::*;

const MINIMAL: &str = r#"
driverVersion: "580.126.20"
cudaDriverVersion: "13.0"
migProfileTables:
  t:
    - { id: 19, name: 1g.10gb, sliceCount: 1, maxInstances: 7, memoryMiB: 9728, multiprocessors: 14, copyEngines: 1, decoders: 0, encoders: 0, jpegEngines: 0, ofaEngines: 0, placements: "{0,1,2,3,4,5,6}:1" }
    - { id: 9, name: 3g.40gb, sliceCount: 3, maxInstances: 2, memoryMiB: 40192, multiprocessors: 42, copyEngines: 3, decoders: 2, encoders: 0, jpegEngines: 0, ofaEngines: 0, placements: "{0,4}:4" }
models:
  m: { productName: X, brand: Nvidia, architecture: Ampere, computeCapability: "8.0", memoryMiB: 81920, pciDeviceId: "0x20b2", migProfiles: t }
gpus:
  - model: m
    pciBusId: "0000:07:00.0"
    migMode: enabled
    migDevices:
"#;

fn with_devices(devices: &str) -> Result<MockBackend, ProfileError> {
    MockBackend::from_yaml("test.yaml", &format!("{MINIMAL}{devices}"))
}

fn invalid_field(error: ProfileError) -> String {
    match error {
        ProfileError::Invalid { field, .. } => field,
        other => panic!("expected Invalid, got {other}"),
    }
}

#[test]
fn every_shipped_profile_loads() {
    let backends = MockBackend::shipped().unwrap();
    let names: Vec<_> = backends.iter().map(MockBackend::profile_name).collect();
    assert_eq!(
        names,
        [
            "dgx-a100",
            "dgx-h100",
            "mixed",
            "pcie-a100-bridged",
            "workstation"
        ]
    );
}

#[test]
fn profiles_by_name_and_by_path() {
    assert_eq!(
        MockBackend::from_profile("dgx-a100").unwrap().name(),
        "mock:dgx-a100"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("my-node.yaml");
    std::fs::write(&path, format!("{MINIMAL}      []\n")).unwrap();
    let backend = MockBackend::from_profile(path.to_str().unwrap()).unwrap();
    assert_eq!(backend.profile_name(), "my-node");
    let error = MockBackend::from_profile("dgx-z100").unwrap_err();
    assert!(matches!(error, ProfileError::NotFound { .. }));
    assert!(
        error
            .to_string()
            .contains("dgx-a100, dgx-h100, mixed, pcie-a100-bridged, workstation"),
        "{error}"
    );
}

#[test]
fn parse_errors_name_the_file_and_the_field() {
    let error = MockBackend::from_yaml(
        "bad.yaml",
        "driverVersion: 1\ncudaDriverVersion: \"13.0\"\nmodels: {}\ngpus: []\nextra: 1\n",
    )
    .unwrap_err();
    let message = error.to_string();
    assert!(message.starts_with("mock profile bad.yaml:"), "{message}");
    assert!(message.contains("extra"), "{message}");
    let error = MockBackend::from_yaml(
        "bad.yaml",
        &MINIMAL.replace("migMode: enabled", "migMode: enabled\n    numaNode: three"),
    )
    .unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("mock profile bad.yaml: gpus[0].numaNode: "),
        "{error}"
    );
    assert!(error.to_string().contains("line 14 column 15"), "{error}");
}

#[test]
fn mig_devices_must_sit_on_a_placement_of_their_profile() {
    let error =
        with_devices("      - { profile: 3g.40gb, placement: 2, gpuInstanceId: 1 }\n").unwrap_err();
    let message = error.to_string();
    assert_eq!(invalid_field(error), "gpus[0].migDevices[0].placement");
    assert!(message.contains("possible: 0:4, 4:4"), "{message}");
}

#[test]
fn mig_devices_must_not_overlap() {
    let error = with_devices(
        "      - { profile: 3g.40gb, placement: 4, gpuInstanceId: 1 }\n      - { profile: 1g.10gb, placement: 5, gpuInstanceId: 7 }\n",
    )
    .unwrap_err();
    let message = error.to_string();
    assert_eq!(invalid_field(error), "gpus[0].migDevices[1].placement");
    assert!(message.contains("overlaps 3g.40gb at 4:4"), "{message}");
}

#[test]
fn mig_device_counts_stay_within_the_table() {
    let error = with_devices(
        "      - { profile: 3g.40gb, placement: 0, gpuInstanceId: 1 }\n      - { profile: 3g.40gb, placement: 4, gpuInstanceId: 2 }\n      - { profile: 1g.10gb, placement: 6, gpuInstanceId: 7 }\n",
    );
    // 3 + 3 + 1 compute slices fit in 7, but 1g at 6 overlaps 3g at 4:4.
    assert!(error.is_err());
    let ok = with_devices(
        "      - { profile: 3g.40gb, placement: 0, gpuInstanceId: 1 }\n      - { profile: 3g.40gb, placement: 4, gpuInstanceId: 2 }\n",
    )
    .unwrap();
    assert_eq!(ok.hardware().gpus[0].mig_devices.len(), 2);
    let error = with_devices(
        "      - { profile: 1g.10gb, placement: 0, gpuInstanceId: 7 }\n      - { profile: 1g.10gb, placement: 1, gpuInstanceId: 7 }\n",
    )
    .unwrap_err();
    assert_eq!(invalid_field(error), "gpus[0].migDevices[1].gpuInstanceId");
}

#[test]
fn unknown_references_are_named() {
    let error =
        with_devices("      - { profile: 2g.20gb, placement: 0, gpuInstanceId: 1 }\n").unwrap_err();
    assert_eq!(invalid_field(error), "gpus[0].migDevices[0].profile");
    let error = MockBackend::from_yaml(
        "x",
        &format!("{MINIMAL}      []\n").replace("model: m", "model: n"),
    )
    .unwrap_err();
    assert_eq!(invalid_field(error), "gpus[0].model");
}

#[test]
fn mig_devices_need_mig_mode() {
    let yaml = format!("{MINIMAL}      - {{ profile: 1g.10gb, placement: 0, gpuInstanceId: 7 }}\n")
        .replace(
            "migMode: enabled",
            "migMode: { current: false, pending: true }",
        );
    let error = MockBackend::from_yaml("x", &yaml).unwrap_err();
    assert_eq!(invalid_field(error), "gpus[0].migDevices");
}

#[test]
fn placements_parse_like_nvidia_smi_prints_them() {
    assert_eq!(
        parse_placements("{0,2,4}:2").unwrap(),
        vec![
            MigPlacement::new(0, 2),
            MigPlacement::new(2, 2),
            MigPlacement::new(4, 2)
        ]
    );
    assert_eq!(
        parse_placements("{0}:8").unwrap(),
        vec![MigPlacement::new(0, 8)]
    );
    assert_eq!(
        parse_placements("0:8").unwrap(),
        vec![MigPlacement::new(0, 8)]
    );
    assert!(parse_placements("{0,2}").is_none());
    assert!(parse_placements("{}:2").is_none());
}

#[test]
fn derived_uuids_are_stable_and_uuid_shaped() {
    let a = derived_uuid("GPU", "dgx-a100/gpu/0");
    assert_eq!(a, derived_uuid("GPU", "dgx-a100/gpu/0"));
    assert_ne!(a, derived_uuid("GPU", "dgx-a100/gpu/1"));
    assert_eq!(a.len(), "GPU-".len() + 36);
    let backend = MockBackend::from_profile("dgx-a100").unwrap();
    let again = MockBackend::from_profile("dgx-a100").unwrap();
    assert_eq!(backend, again);
}

#[test]
fn the_trait_serves_the_profile() {
    let backend = MockBackend::from_profile("mixed").unwrap();
    let gpus = backend.gpus().unwrap();
    assert_eq!(gpus.len(), 2);
    assert_eq!(backend.mig_mode(&gpus[0].uuid).unwrap(), None);
    assert_eq!(
        backend.mig_mode(&gpus[1].uuid).unwrap(),
        Some(MigMode::settled(true))
    );
    assert_eq!(backend.mig_devices(&gpus[1].uuid).unwrap().len(), 4);
    assert_eq!(backend.mig_profiles(&gpus[1].uuid).unwrap().len(), 7);
    assert!(matches!(
        backend.mig_devices("GPU-nope"),
        Err(BackendError::NoSuchGpu { .. })
    ));
    assert_eq!(backend.driver_version().unwrap(), "535.183.01");
    assert_eq!(
        backend.cuda_driver_version().unwrap(),
        CudaDriverVersion::new(12, 2)
    );
}

#[test]
fn written_profiles_load_back_the_same() {
    for backend in MockBackend::shipped().unwrap() {
        let yaml = to_profile_yaml(backend.profile_name(), "round trip", backend.hardware());
        let again = MockBackend::from_yaml("again.yaml", &yaml)
            .unwrap_or_else(|error| panic!("{error}\n{yaml}"));
        assert_eq!(again.hardware(), backend.hardware(), "{yaml}");
        assert_eq!(again.profile_name(), backend.profile_name());
    }
}

/// Two GPUs without MIG, each with the given `nvlinks:`/`nvlinkPeers:` lines.
fn two_linked_gpus(first: &str, second: &str) -> Result<MockBackend, ProfileError> {
    let yaml = format!(
        r#"
driverVersion: "580.126.20"
cudaDriverVersion: "13.0"
models:
  m: {{ productName: X, brand: Nvidia, architecture: Ampere, computeCapability: "8.0", memoryMiB: 81920, pciDeviceId: "0x20b5" }}
gpus:
  - {{ model: m, pciBusId: "0000:17:00.0", {first} }}
  - {{ model: m, pciBusId: "0000:31:00.0", {second} }}
"#
    );
    MockBackend::from_yaml("links.yaml", &yaml)
}

#[test]
fn nvlinks_and_peers_come_from_the_profile() {
    let backend = two_linked_gpus(
        r#"nvlinks: ["0000:31:00.0", null, unknown]"#,
        r#"nvlinks: ["00000000:17:00.0"]"#,
    )
    .unwrap();
    let inventory = backend.inventory().unwrap();
    let (first, second) = (&inventory.gpus[0], &inventory.gpus[1]);
    assert_eq!(
        first.nvlinks,
        [
            NvLink::active(0, Some("0000:31:00.0")).unwrap(),
            NvLink::inactive(1),
            NvLink::active(2, None).unwrap(),
        ]
    );
    // NVML's form of the far end is accepted and normalized.
    assert_eq!(
        second.nvlinks[0].remote_pci_bus_id.as_deref(),
        Some("0000:17:00.0")
    );
    // Peers derived from the links, as the trait answers them.
    assert_eq!(
        first.nvlink_peers.as_deref(),
        Some(std::slice::from_ref(&second.info.uuid))
    );
    assert_eq!(
        backend
            .nvlink_p2p(&second.info.uuid, &first.info.uuid)
            .unwrap(),
        Some(true)
    );
    assert_eq!(backend.nvlinks(&first.info.uuid).unwrap(), first.nvlinks);
}

#[test]
fn listed_peers_win_over_the_links() {
    // Far ends unknown (NVSwitches a VM does not show): only the listed peers connect.
    let backend = two_linked_gpus(
        r#"nvlinks: [unknown], nvlinkPeers: ["0000:31:00.0"]"#,
        "nvlinks: [unknown], nvlinkPeers: []",
    )
    .unwrap();
    let inventory = backend.inventory().unwrap();
    assert_eq!(
        inventory.gpus[0].nvlink_peers.as_deref(),
        Some(std::slice::from_ref(&inventory.gpus[1].info.uuid))
    );
    assert_eq!(inventory.gpus[1].nvlink_peers.as_deref(), Some(&[][..]));
}

#[test]
fn bad_nvlinks_are_named() {
    let cases = [
        // Not a bus ID.
        (r#"nvlinks: ["c4"]"#, "nvlinks: []", "gpus[0].nvlinks[0]"),
        // A link to itself.
        (
            r#"nvlinks: ["0000:17:00.0"]"#,
            "nvlinks: []",
            "gpus[0].nvlinks[0]",
        ),
        // Two links out, one back.
        (
            r#"nvlinks: ["0000:31:00.0", "0000:31:00.0"]"#,
            r#"nvlinks: ["0000:17:00.0"]"#,
            "gpus[0].nvlinks",
        ),
        // A peer that is no GPU of the profile.
        (
            r#"nvlinks: [unknown], nvlinkPeers: ["0000:99:00.0"]"#,
            "nvlinks: [unknown]",
            "gpus[0].nvlinkPeers[0]",
        ),
        // Peers without a link up.
        (
            r#"nvlinks: [null], nvlinkPeers: ["0000:31:00.0"]"#,
            "nvlinks: [unknown]",
            "gpus[0].nvlinkPeers",
        ),
    ];
    for (first, second, field) in cases {
        let error = two_linked_gpus(first, second).unwrap_err();
        assert_eq!(invalid_field(error), field, "{first} / {second}");
    }
    let nineteen = vec!["null"; 19].join(", ");
    let error = two_linked_gpus(&format!("nvlinks: [{nineteen}]"), "nvlinks: []").unwrap_err();
    assert!(
        error.to_string().contains("NVML_NVLINK_MAX_LINKS"),
        "{error}"
    );
}
