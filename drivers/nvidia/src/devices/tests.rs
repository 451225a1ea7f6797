use super::*;
use crate::backend::mock::MockBackend;
use crate::host::{FakeHostTree, RootedHost};
use dra_sdk::advanced::slices::{KubernetesVersion, SliceLimits};

fn discover(
    profile: &str,
    options: &DiscoveryOptions,
) -> (tempfile::TempDir, Result<Discovery, DiscoveryError>) {
    let dir = tempfile::tempdir().unwrap();
    let backend = MockBackend::from_profile(profile).unwrap();
    let host = FakeHostTree::new(dir.path())
        .build(backend.hardware())
        .unwrap();
    let discovery = Discovery::discover(&backend, &host, options);
    (dir, discovery)
}

fn names(discovery: &Discovery) -> Vec<String> {
    discovery
        .devices()
        .into_iter()
        .map(|device| device.name)
        .collect()
}

#[test]
fn dgx_a100_names() {
    let (_dir, discovery) = discover("dgx-a100", &DiscoveryOptions::new());
    let discovery = discovery.unwrap();
    let mut expected: Vec<String> = (0..7).map(|p| format!("gpu-0-mig-1g10gb-19-{p}")).collect();
    expected.extend(
        [
            "gpu-1-mig-1g10gb-19-0",
            "gpu-1-mig-1g10gb-19-1",
            "gpu-1-mig-2g20gb-14-2",
            "gpu-1-mig-3g40gb-9-4",
            "gpu-2-mig-1g10gb-me-20-6",
            "gpu-2-mig-1g20gb-15-4",
            "gpu-2-mig-4g40gb-5-0",
            "gpu-3",
            "gpu-4",
            "gpu-5",
            "gpu-6",
            "gpu-7",
        ]
        .map(String::from),
    );
    assert_eq!(names(&discovery), expected);
}

#[test]
fn names_sort_naturally() {
    let mut names = vec!["gpu-10", "gpu-2", "gpu-1-mig-1g10gb-19-0", "gpu-1"];
    names.sort_by(|a, b| natural_key(a).cmp(&natural_key(b)));
    assert_eq!(names, ["gpu-1", "gpu-1-mig-1g10gb-19-0", "gpu-2", "gpu-10"]);
}

#[test]
fn full_gpu_attributes_are_upstreams() {
    let (_dir, discovery) = discover("dgx-h100", &DiscoveryOptions::new());
    let discovery = discovery.unwrap();
    let device = &discovery.devices()[0];
    assert_eq!(device.name, "gpu-0");
    let string = |s: &str| AttributeValue::String(s.to_owned());
    let gpu = &discovery.gpus[0];
    let expected: BTreeMap<String, AttributeValue> = [
        ("type", string("gpu")),
        ("uuid", string(&gpu.info.uuid)),
        ("productName", string("NVIDIA H100 80GB HBM3")),
        ("brand", string("Nvidia")),
        ("architecture", string("Hopper")),
        (
            "cudaComputeCapability",
            AttributeValue::Version("9.0.0".into()),
        ),
        (
            "driverVersion",
            AttributeValue::Version("580.126.20".into()),
        ),
        (
            "cudaDriverVersion",
            AttributeValue::Version("13.0.0".into()),
        ),
        ("resource.kubernetes.io/pciBusID", string("0000:1b:00.0")),
        ("resource.kubernetes.io/pcieRoot", string("pci0000:15")),
        ("resource.kubernetes.io/numaNode", AttributeValue::Int(0)),
        // All eight GPUs on the NVSwitches: one group, named after the first GPU.
        ("nvlinkGroup", string(&gpu.info.uuid)),
        ("nvlinkActiveLinks", AttributeValue::Int(18)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(device.attributes, expected);
    assert_eq!(device.capacity.keys().collect::<Vec<_>>(), ["memory"]);
    assert_eq!(device.capacity["memory"].value.0, "81559Mi");
    assert!(device.consumes_counters.is_empty());
}

#[test]
fn mig_attributes_and_capacities() {
    let (_dir, discovery) = discover("dgx-a100", &DiscoveryOptions::new());
    let discovery = discovery.unwrap();
    let devices = discovery.devices();
    let device = devices
        .iter()
        .find(|device| device.name == "gpu-1-mig-3g40gb-9-4")
        .unwrap();
    let parent = &discovery.inventory.gpus[1].info;
    assert_eq!(
        device.attributes["type"],
        AttributeValue::String("mig".into())
    );
    assert_eq!(
        device.attributes["profile"],
        AttributeValue::String("3g.40gb".into())
    );
    assert_eq!(
        device.attributes["parentUUID"],
        AttributeValue::String(parent.uuid.clone())
    );
    assert!(
        matches!(&device.attributes["uuid"], AttributeValue::String(uuid) if uuid.starts_with("MIG-"))
    );
    assert_eq!(
        device.attributes["productName"],
        AttributeValue::String("NVIDIA A100-SXM4-80GB".into())
    );
    let capacity: BTreeMap<&str, &str> = device
        .capacity
        .iter()
        .map(|(name, capacity)| (name.as_str(), capacity.value.0.as_str()))
        .collect();
    let expected: BTreeMap<&str, &str> = [
        ("multiprocessors", "42"),
        ("copyEngines", "3"),
        ("decoders", "2"),
        ("encoders", "0"),
        ("jpegEngines", "0"),
        ("ofaEngines", "0"),
        ("memory", "40192Mi"),
        ("memorySlice4", "1"),
        ("memorySlice5", "1"),
        ("memorySlice6", "1"),
        ("memorySlice7", "1"),
    ]
    .into_iter()
    .collect();
    assert_eq!(capacity, expected);
    // Lookup for prepare.
    let Some(NodeDevice::Mig(mig)) = discovery.device("gpu-1-mig-3g40gb-9-4") else {
        panic!("not a MIG device");
    };
    assert_eq!(mig.mig.gpu_instance_id, 1);
    assert_eq!(mig.parent.minor, 1);
}

#[test]
fn a_gpu_in_mig_mode_is_not_published_whole() {
    let (_dir, discovery) = discover("mixed", &DiscoveryOptions::new());
    let discovery = discovery.unwrap();
    assert_eq!(
        names(&discovery),
        [
            "gpu-0",
            "gpu-1-mig-1g5gb-19-0",
            "gpu-1-mig-1g5gb-19-1",
            "gpu-1-mig-2g10gb-14-2",
            "gpu-1-mig-3g20gb-9-4",
        ]
    );
    assert!(discovery.device("gpu-1").is_none());
    assert_eq!(
        discovery.device("gpu-0").unwrap().device_type(),
        DeviceType::Gpu
    );
}

#[test]
fn vfio_twins_share_a_counter() {
    let (_dir, discovery) = discover("dgx-h100", &DiscoveryOptions::new().passthrough(true));
    let discovery = discovery.unwrap();
    assert_eq!(discovery.vfio.len(), 8);
    let resources = discovery.resources("node-1");
    let pool = &resources.pools["node-1"];
    assert_eq!(pool.devices.len(), 16);
    assert_eq!(pool.shared_counters.len(), 8);
    let gpu0 = pool.devices.iter().find(|d| d.name == "gpu-0").unwrap();
    let vfio0 = pool
        .devices
        .iter()
        .find(|d| d.name == "gpu-vfio-0")
        .unwrap();
    assert_eq!(gpu0.consumes_counters, vfio0.consumes_counters);
    assert_eq!(
        gpu0.consumes_counters[0].counter_set,
        "gpu-vfio-0-counter-set"
    );
    assert_eq!(
        vfio0.attributes["deviceID"],
        AttributeValue::String("0x2330".into())
    );
    assert_eq!(
        vfio0.attributes["vendorID"],
        AttributeValue::String("0x10de".into())
    );
    assert_eq!(
        vfio0.attributes["iommuFDEnabled"],
        AttributeValue::Bool(false)
    );
    assert_eq!(vfio0.attributes["uuid"], gpu0.attributes["uuid"]);
    assert_eq!(vfio0.capacity["addressableMemory"].value.0, "81559Mi");
    for release in [34, 35, 36] {
        resources
            .validate(&SliceLimits::for_release(KubernetesVersion::new(
                1, release,
            )))
            .unwrap();
    }
}

#[test]
fn gpus_split_into_mig_devices_get_no_vfio_twin() {
    let (_dir, discovery) = discover("mixed", &DiscoveryOptions::new().passthrough(true));
    let discovery = discovery.unwrap();
    // The A100 (bus af, index 1) has MIG devices: only the T4 is offered.
    let vfio: Vec<_> = discovery
        .vfio
        .iter()
        .map(|v| (v.name.as_str(), v.pci_bus_id.as_str()))
        .collect();
    assert_eq!(vfio, [("gpu-vfio-0", "0000:3b:00.0")]);
    assert_eq!(discovery.vfio[0].bound_driver.as_deref(), Some("nvidia"));
    assert_eq!(
        discovery.vfio[0].iommu_group,
        Some(crate::host::FIRST_IOMMU_GROUP)
    );
}

#[test]
fn a_gpu_already_bound_to_vfio_keeps_its_vfio_device() {
    // Only sysfs knows the second GPU (NVML does not see GPUs bound to vfio-pci).
    let dir = tempfile::tempdir().unwrap();
    let backend = MockBackend::from_profile("mixed").unwrap();
    let host = FakeHostTree::new(dir.path())
        .build(backend.hardware())
        .unwrap();
    let mut inventory = backend.hardware().clone();
    inventory.gpus.remove(0);
    let discovery =
        Discovery::from_inventory(inventory, &host, &DiscoveryOptions::new().passthrough(true))
            .unwrap();
    let vfio = &discovery.vfio[0];
    assert_eq!(
        (vfio.name.as_str(), vfio.gpu.is_none()),
        ("gpu-vfio-0", true)
    );
    let devices = discovery.devices();
    let device = devices.iter().find(|d| d.name == "gpu-vfio-0").unwrap();
    assert_eq!(
        device.attributes["deviceID"],
        AttributeValue::String("0x1eb8".into())
    );
    assert!(!device.attributes.contains_key("uuid"));
}

#[test]
fn passthrough_needs_the_iommu() {
    let dir = tempfile::tempdir().unwrap();
    let backend = MockBackend::from_profile("workstation").unwrap();
    let host = FakeHostTree::new(dir.path())
        .iommu(false)
        .build(backend.hardware())
        .unwrap();
    let error = Discovery::discover(&backend, &host, &DiscoveryOptions::new().passthrough(true))
        .unwrap_err();
    assert!(matches!(error, DiscoveryError::IommuDisabled), "{error}");
}

#[test]
fn without_a_host_tree_the_backend_facts_suffice() {
    let dir = tempfile::tempdir().unwrap();
    let host = RootedHost::new(dir.path());
    let backend = MockBackend::from_profile("workstation").unwrap();
    let discovery = Discovery::discover(&backend, &host, &DiscoveryOptions::new()).unwrap();
    let devices = discovery.devices();
    assert_eq!(devices.len(), 1);
    assert!(
        !devices[0]
            .attributes
            .contains_key("resource.kubernetes.io/numaNode")
    );
    assert_eq!(
        devices[0].attributes["resource.kubernetes.io/pcieRoot"],
        AttributeValue::String("pci0000:00".into())
    );
}

#[test]
fn device_classes_select_by_type() {
    let classes = device_classes();
    let summary: Vec<(String, String, Option<String>)> = classes
        .iter()
        .map(|class| {
            let selectors = class.spec.as_ref().unwrap().selectors.as_ref().unwrap();
            (
                class.metadata.name.clone().unwrap(),
                selectors[0].cel.as_ref().unwrap().expression.clone(),
                class.spec.as_ref().unwrap().extended_resource_name.clone(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                "gpu.nvidia.com".to_owned(),
                "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'".to_owned(),
                Some("nvidia.com/gpu".to_owned()),
            ),
            (
                "mig.nvidia.com".to_owned(),
                "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'".to_owned(),
                None,
            ),
            (
                "vfio.gpu.nvidia.com".to_owned(),
                "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'vfio'".to_owned(),
                None,
            ),
        ]
    );
}

#[test]
fn profile_name_parts_follow_upstream() {
    assert_eq!(mig_profile_name_part("1g.10gb"), "1g10gb");
    assert_eq!(mig_profile_name_part("1g.10gb+me"), "1g10gb-me");
    assert_eq!(mig_profile_name_part("7G.80GB"), "7g80gb");
}

#[test]
fn bad_versions_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let host = RootedHost::new(dir.path());
    let mut inventory = MockBackend::from_profile("workstation")
        .unwrap()
        .hardware()
        .clone();
    inventory.driver_version = "not-a-version".into();
    let error = Discovery::from_inventory(inventory, &host, &DiscoveryOptions::new()).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("driverVersion \"not-a-version\""),
        "{error}"
    );
}

#[test]
fn numa_node_as_a_list_with_dra_list_type_attributes() {
    let options = DiscoveryOptions::new()
        .list_type_attributes(true)
        .passthrough(true);
    let (_dir, discovery) = discover("dgx-a100", &options);
    let discovery = discovery.unwrap();
    let resources = discovery.resources("node-1");
    for device in &resources.pools["node-1"].devices {
        assert!(
            matches!(
                device.attributes["resource.kubernetes.io/numaNode"],
                AttributeValue::Ints(ref nodes) if nodes.len() == 1
            ),
            "{}",
            device.name
        );
    }
    resources
        .validate(&SliceLimits::for_release(KubernetesVersion::new(1, 36)))
        .unwrap();
    assert!(
        resources
            .validate(&SliceLimits::for_release(KubernetesVersion::new(1, 35)))
            .is_err()
    );
}

/// `(device name, nvlinkGroup, nvlinkActiveLinks)` of every published device.
fn nvlink_attributes(discovery: &Discovery) -> Vec<(String, Option<String>, Option<i64>)> {
    discovery
        .devices()
        .iter()
        .map(|device| {
            let group = match device.attributes.get("nvlinkGroup") {
                Some(AttributeValue::String(group)) => Some(group.clone()),
                _ => None,
            };
            let links = match device.attributes.get("nvlinkActiveLinks") {
                Some(AttributeValue::Int(links)) => Some(*links),
                _ => None,
            };
            (device.name.clone(), group, links)
        })
        .collect()
}

#[test]
fn bridged_pairs_publish_one_group_each() {
    let (_dir, discovery) = discover("pcie-a100-bridged", &DiscoveryOptions::new());
    let discovery = discovery.unwrap();
    let uuid = |gpu: usize| Some(discovery.gpus[gpu].info.uuid.clone());
    let expected = [
        ("gpu-0".to_owned(), uuid(0), Some(12)),
        ("gpu-1".to_owned(), uuid(0), Some(12)),
        ("gpu-2".to_owned(), uuid(2), Some(12)),
        ("gpu-3".to_owned(), uuid(2), Some(12)),
    ];
    assert_eq!(nvlink_attributes(&discovery), expected);
}

#[test]
fn gpus_without_nvlink_publish_neither_attribute() {
    let (_dir, discovery) = discover("mixed", &DiscoveryOptions::new());
    let discovery = discovery.unwrap();
    assert!(
        nvlink_attributes(&discovery)
            .iter()
            .all(|(_, group, links)| group.is_none() && links.is_none())
    );
}

#[test]
fn mig_devices_and_partitions_inherit_their_parents_group() {
    // Static MIG devices of the DGX A100 (GPUs 0-2 in MIG mode).
    let (_dir, discovery) = discover("dgx-a100", &DiscoveryOptions::new());
    let discovery = discovery.unwrap();
    let group = Some(discovery.inventory.gpus[0].info.uuid.clone());
    let migs: Vec<_> = nvlink_attributes(&discovery)
        .into_iter()
        .filter(|(name, ..)| name.contains("-mig-"))
        .collect();
    assert!(!migs.is_empty());
    // The group, not the link count: that stays a GPU's attribute.
    assert!(
        migs.iter()
            .all(|(_, g, links)| *g == group && links.is_none()),
        "{migs:?}"
    );

    // Dynamic MIG partitions of the bridged PCIe server, MIG mode on (an A100 changes it only
    // at a reset, so it must be on already): each pair's value.
    let (_, yaml) = crate::backend::mock::SHIPPED_PROFILES
        .iter()
        .find(|(name, _)| *name == "pcie-a100-bridged")
        .unwrap();
    let backend = MockBackend::from_yaml(
        "mig-on",
        &yaml.replace("migMode: disabled", "migMode: enabled"),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let host = FakeHostTree::new(dir.path())
        .build(backend.hardware())
        .unwrap();
    let options = DiscoveryOptions::new().dynamic_mig(true);
    let discovery = Discovery::discover(&backend, &host, &options).unwrap();
    assert!(!discovery.partitions.is_empty());
    for partition in &discovery.partitions {
        let pair_first = if partition.parent.minor < 2 { 0 } else { 2 };
        let expected = &discovery.inventory.gpus[pair_first].info.uuid;
        assert_eq!(
            partition.device().attributes.get("nvlinkGroup"),
            Some(&AttributeValue::String(expected.clone())),
            "{}",
            partition.name
        );
    }
}
