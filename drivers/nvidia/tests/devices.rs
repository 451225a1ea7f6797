//! Published devices of every shipped profile, checked against the facts of
//! `shared/reference/nvidia-mig.md` (written out here independently of the profile files), and
//! against the ResourceSlice limits of every supported Kubernetes release.

use std::collections::BTreeMap;

use dra_driver_nvidia::backend::GpuBackend;
use dra_driver_nvidia::backend::mock::{MockBackend, ProfileError};
use dra_driver_nvidia::devices::{Discovery, DiscoveryOptions};
use dra_driver_nvidia::host::FakeHostTree;
use dra_sdk::advanced::slices::{KubernetesVersion, SliceLimits};
use dra_sdk::slices::{AttributeValue, Device};
use dra_sdk_testing::assert_contains;

/// A GPU model as the reference gives it: name, PCI device ID, compute capability,
/// architecture.
struct Model {
    product_name: &'static str,
    device_id: &'static str,
    compute_capability: &'static str,
    architecture: &'static str,
    /// MIG rows: name, profile ID, MiB, SM, CE, DEC, ENC, JPG, OFA, placements (start, size).
    mig: &'static [MigRow],
}

type MigRow = (
    &'static str,
    u32,
    u64,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    &'static [u32],
    u32,
);

const ONE_SLICE: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const EVEN: &[u32] = &[0, 2, 4, 6];
const TWO_SLICE: &[u32] = &[0, 2, 4];
const HALVES: &[u32] = &[0, 4];
const FIRST: &[u32] = &[0];

const A100_SXM4_80GB: Model = Model {
    product_name: "NVIDIA A100-SXM4-80GB",
    device_id: "0x20b2",
    compute_capability: "8.0.0",
    architecture: "Ampere",
    mig: &[
        ("1g.10gb", 19, 9728, 14, 1, 0, 0, 0, 0, ONE_SLICE, 1),
        ("1g.10gb+me", 20, 9728, 14, 1, 1, 0, 1, 1, ONE_SLICE, 1),
        ("1g.20gb", 15, 19968, 14, 1, 1, 0, 0, 0, EVEN, 2),
        ("2g.20gb", 14, 19968, 28, 2, 1, 0, 0, 0, TWO_SLICE, 2),
        ("3g.40gb", 9, 40192, 42, 3, 2, 0, 0, 0, HALVES, 4),
        ("4g.40gb", 5, 40192, 56, 4, 2, 0, 0, 0, FIRST, 4),
        ("7g.80gb", 0, 80896, 98, 7, 5, 0, 1, 1, FIRST, 8),
    ],
};

/// The 80GB A100 on a PCIe board: the SXM4 board's MIG table (the MIG user guide gives one
/// table for the 80GB A100s).
const A100_80GB_PCIE: Model = Model {
    product_name: "NVIDIA A100 80GB PCIe",
    device_id: "0x20b5",
    compute_capability: "8.0.0",
    architecture: "Ampere",
    mig: A100_SXM4_80GB.mig,
};

const A100_SXM4_40GB: Model = Model {
    product_name: "NVIDIA A100-SXM4-40GB",
    device_id: "0x20b0",
    compute_capability: "8.0.0",
    architecture: "Ampere",
    mig: &[
        ("1g.5gb", 19, 4864, 14, 1, 0, 0, 0, 0, ONE_SLICE, 1),
        ("1g.5gb+me", 20, 4864, 14, 1, 1, 0, 1, 1, ONE_SLICE, 1),
        ("1g.10gb", 15, 9856, 14, 1, 1, 0, 0, 0, EVEN, 2),
        ("2g.10gb", 14, 9856, 28, 2, 1, 0, 0, 0, TWO_SLICE, 2),
        ("3g.20gb", 9, 19968, 42, 3, 2, 0, 0, 0, HALVES, 4),
        ("4g.20gb", 5, 19968, 56, 4, 2, 0, 0, 0, FIRST, 4),
        ("7g.40gb", 0, 40192, 98, 7, 5, 0, 1, 1, FIRST, 8),
    ],
};

const H100_80GB_HBM3: Model = Model {
    product_name: "NVIDIA H100 80GB HBM3",
    device_id: "0x2330",
    compute_capability: "9.0.0",
    architecture: "Hopper",
    mig: &[
        ("1g.10gb", 19, 9984, 16, 1, 1, 0, 1, 0, ONE_SLICE, 1),
        ("1g.10gb+me", 20, 9984, 16, 1, 1, 0, 1, 1, ONE_SLICE, 1),
        ("1g.20gb", 15, 20096, 26, 1, 1, 0, 1, 0, EVEN, 2),
        ("2g.20gb", 14, 20096, 32, 2, 2, 0, 2, 0, TWO_SLICE, 2),
        ("3g.40gb", 9, 40448, 60, 3, 3, 0, 3, 0, HALVES, 4),
        ("4g.40gb", 5, 40448, 64, 4, 4, 0, 4, 0, FIRST, 4),
        ("7g.80gb", 0, 81152, 132, 8, 7, 0, 7, 1, FIRST, 8),
    ],
};

const TESLA_T4: Model = Model {
    product_name: "Tesla T4",
    device_id: "0x1eb8",
    compute_capability: "7.5.0",
    architecture: "Turing",
    mig: &[],
};

fn model_of(product_name: &str) -> &'static Model {
    [
        &A100_SXM4_80GB,
        &A100_80GB_PCIE,
        &A100_SXM4_40GB,
        &H100_80GB_HBM3,
        &TESLA_T4,
    ]
    .into_iter()
    .find(|model| model.product_name == product_name)
    .unwrap_or_else(|| panic!("no reference model for {product_name}"))
}

fn string(device: &Device, name: &str) -> String {
    match device.attributes.get(name) {
        Some(AttributeValue::String(value)) => value.clone(),
        other => panic!("{}: {name} is {other:?}", device.name),
    }
}

fn version(device: &Device, name: &str) -> String {
    match device.attributes.get(name) {
        Some(AttributeValue::Version(value)) => value.clone(),
        other => panic!("{}: {name} is {other:?}", device.name),
    }
}

fn capacity(device: &Device, name: &str) -> String {
    device
        .capacity
        .get(name)
        .unwrap_or_else(|| panic!("{}: no capacity {name}", device.name))
        .value
        .0
        .clone()
}

fn discover(profile: &str, passthrough: bool) -> (tempfile::TempDir, MockBackend, Discovery) {
    discover_with(profile, &DiscoveryOptions::new().passthrough(passthrough))
}

fn discover_with(
    profile: &str,
    options: &DiscoveryOptions,
) -> (tempfile::TempDir, MockBackend, Discovery) {
    let dir = tempfile::tempdir().unwrap();
    let backend = MockBackend::from_profile(profile).unwrap();
    let host = FakeHostTree::new(dir.path())
        .dynamic_mig(options.dynamic_mig)
        .build(backend.hardware())
        .unwrap();
    let discovery = Discovery::discover(&backend, &host, options).unwrap();
    (dir, backend, discovery)
}

/// Every published device carries the reference values of its model.
fn check_against_reference(profile: &str) -> BTreeMap<&'static str, usize> {
    let (_dir, _backend, discovery) = discover(profile, true);
    let mut counts = BTreeMap::new();
    for device in discovery.devices() {
        let kind = string(&device, "type");
        *counts
            .entry(match kind.as_str() {
                "gpu" => "gpu",
                "mig" => "mig",
                "vfio" => "vfio",
                other => panic!("unknown type {other}"),
            })
            .or_insert(0) += 1;
        let model = model_of(&string(&device, "productName"));
        match kind.as_str() {
            "gpu" | "mig" => {
                assert_eq!(
                    string(&device, "architecture"),
                    model.architecture,
                    "{}",
                    device.name
                );
                assert_eq!(
                    version(&device, "cudaComputeCapability"),
                    model.compute_capability,
                    "{}",
                    device.name
                );
                assert!(string(&device, "resource.kubernetes.io/pciBusID").starts_with("0000:"));
            }
            _ => {
                assert_eq!(
                    string(&device, "deviceID"),
                    model.device_id,
                    "{}",
                    device.name
                );
                assert_eq!(string(&device, "vendorID"), "0x10de");
            }
        }
        if kind == "mig" {
            let profile = string(&device, "profile");
            let row = model
                .mig
                .iter()
                .find(|row| row.0 == profile)
                .unwrap_or_else(|| {
                    panic!("{}: {profile} is not in the reference table", device.name)
                });
            let (_, id, mib, sm, ce, dec, enc, jpg, ofa, starts, size) = *row;
            assert!(device.name.ends_with(&format!(
                "-{id}-{}",
                device.name.rsplit('-').next().unwrap()
            )));
            let start: u32 = device.name.rsplit('-').next().unwrap().parse().unwrap();
            assert!(starts.contains(&start), "{}: start {start}", device.name);
            for (name, expected) in [
                ("multiprocessors", sm),
                ("copyEngines", ce),
                ("decoders", dec),
                ("encoders", enc),
                ("jpegEngines", jpg),
                ("ofaEngines", ofa),
            ] {
                assert_eq!(
                    capacity(&device, name),
                    expected.to_string(),
                    "{}: {name}",
                    device.name
                );
            }
            assert_eq!(
                capacity(&device, "memory"),
                format!("{mib}Mi"),
                "{}",
                device.name
            );
            let slices: Vec<u32> = (0..8)
                .filter(|slice| device.capacity.contains_key(&format!("memorySlice{slice}")))
                .collect();
            assert_eq!(
                slices,
                (start..start + size).collect::<Vec<_>>(),
                "{}",
                device.name
            );
        }
    }
    counts
}

#[test]
fn dgx_a100_matches_the_reference() {
    let counts = check_against_reference("dgx-a100");
    // 5 whole GPUs, 14 MIG devices (eleven of them 1g.10gb), and VFIO twins of the 5 GPUs
    // without MIG devices.
    assert_eq!(
        counts,
        BTreeMap::from([("gpu", 5), ("mig", 14), ("vfio", 5)])
    );
    let (_dir, _backend, discovery) = discover("dgx-a100", false);
    let one_g: usize = discovery
        .migs
        .iter()
        .filter(|mig| mig.profile.name == "1g.10gb")
        .count();
    assert_eq!(one_g, 9);
    assert_eq!(discovery.migs.len(), 14);
}

#[test]
fn dgx_h100_matches_the_reference() {
    let counts = check_against_reference("dgx-h100");
    assert_eq!(counts, BTreeMap::from([("gpu", 8), ("vfio", 8)]));
    let (_dir, backend, discovery) = discover("dgx-h100", false);
    // MIG off, but the profile table is the reference one.
    for gpu in &backend.inventory().unwrap().gpus {
        assert_eq!(gpu.mig_mode.map(|mode| mode.current), Some(false));
        let table: Vec<_> = gpu
            .mig_profiles
            .iter()
            .map(|p| {
                (
                    p.name.as_str(),
                    p.id,
                    p.memory_mib,
                    p.engines.multiprocessors,
                    p.placements.len(),
                )
            })
            .collect();
        let expected: Vec<_> = H100_80GB_HBM3
            .mig
            .iter()
            .map(|row| (row.0, row.1, row.2, row.3, row.9.len()))
            .collect();
        assert_eq!(table, expected);
    }
    let names: Vec<String> = discovery.devices().into_iter().map(|d| d.name).collect();
    assert_eq!(
        names,
        (0..8).map(|i| format!("gpu-{i}")).collect::<Vec<_>>()
    );
}

#[test]
fn mixed_matches_the_reference() {
    let counts = check_against_reference("mixed");
    assert_eq!(
        counts,
        BTreeMap::from([("gpu", 1), ("mig", 4), ("vfio", 1)])
    );
}

#[test]
fn workstation_matches_the_reference() {
    let counts = check_against_reference("workstation");
    assert_eq!(counts, BTreeMap::from([("gpu", 1), ("vfio", 1)]));
}

#[test]
fn pcie_a100_bridged_matches_the_reference() {
    let counts = check_against_reference("pcie-a100-bridged");
    assert_eq!(counts, BTreeMap::from([("gpu", 4), ("vfio", 4)]));
}

/// NVLink attributes of every GPU of every profile, from the facts the profiles cite: `nvidia-smi
/// topo -m` prints NV12 for every pair of a DGX A100 (six NVSwitches), NV18 for every pair of
/// a DGX H100 (four NVSwitches), NV12 within a bridged pair of A100 PCIe boards; the T4 has no
/// NVLink. `(device, group's first GPU index, active links)`; MIG devices carry the group only.
#[test]
fn nvlink_attributes_follow_the_topology_facts() {
    fn attributes(profile: &str) -> Vec<(String, Option<usize>, Option<i64>)> {
        let (_dir, backend, discovery) = discover(profile, false);
        let uuids: Vec<String> = backend
            .inventory()
            .unwrap()
            .gpus
            .into_iter()
            .map(|gpu| gpu.info.uuid)
            .collect();
        discovery
            .devices()
            .into_iter()
            .map(|device| {
                let group = match device.attributes.get("nvlinkGroup") {
                    Some(AttributeValue::String(uuid)) => {
                        Some(uuids.iter().position(|gpu| gpu == uuid).unwrap())
                    }
                    None => None,
                    other => panic!("{}: nvlinkGroup is {other:?}", device.name),
                };
                let links = match device.attributes.get("nvlinkActiveLinks") {
                    Some(AttributeValue::Int(links)) => Some(*links),
                    None => None,
                    other => panic!("{}: nvlinkActiveLinks is {other:?}", device.name),
                };
                (device.name, group, links)
            })
            .collect()
    }
    // DGX A100: GPUs 0-2 are in MIG mode (only their MIG devices are published), 3-7 whole.
    for (name, group, links) in attributes("dgx-a100") {
        assert_eq!(group, Some(0), "{name}");
        let expected = (!name.contains("-mig-")).then_some(12);
        assert_eq!(links, expected, "{name}");
    }
    assert_eq!(
        attributes("dgx-h100"),
        (0..8)
            .map(|gpu| (format!("gpu-{gpu}"), Some(0), Some(18)))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        attributes("pcie-a100-bridged"),
        [
            ("gpu-0".to_owned(), Some(0), Some(12)),
            ("gpu-1".to_owned(), Some(0), Some(12)),
            ("gpu-2".to_owned(), Some(2), Some(12)),
            ("gpu-3".to_owned(), Some(2), Some(12)),
        ]
    );
    for profile in ["mixed", "workstation"] {
        assert!(
            attributes(profile)
                .iter()
                .all(|(_, group, links)| group.is_none() && links.is_none()),
            "{profile}"
        );
    }
}

#[test]
fn every_profile_is_valid_for_every_release() {
    for (profile, _) in dra_driver_nvidia::backend::mock::SHIPPED_PROFILES {
        for passthrough in [false, true] {
            let (_dir, _backend, discovery) = discover(profile, passthrough);
            let resources = discovery.resources("node-1");
            assert_eq!(resources.pools.len(), 1);
            let mut limits: Vec<SliceLimits> = [34, 35, 36]
                .into_iter()
                .map(|minor| SliceLimits::for_release(KubernetesVersion::new(1, minor)))
                .collect();
            limits.push(SliceLimits::strictest());
            for limits in limits {
                if let Err(errors) = resources.validate(&limits) {
                    panic!(
                        "{profile} (passthrough {passthrough}) on {:?}: {errors}",
                        limits.release
                    );
                }
            }
        }
    }
}

#[test]
fn names_are_stable_across_restarts() {
    let (_a, _, first) = discover("dgx-a100", true);
    let (_b, _, second) = discover("dgx-a100", true);
    assert_eq!(first.devices(), second.devices());
}

#[test]
fn a_bad_profile_file_names_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.yaml");
    std::fs::write(
        &path,
        "driverVersion: \"580.126.20\"\ncudaDriverVersion: \"13.0\"\nmodels:\n  t4: { productName: Tesla T4, brand: Nvidia, architecture: Turing, computeCapability: \"7.5\", memoryMiB: 15360, pciDeviceId: \"0x1eb8\" }\ngpus:\n  - { model: t4, pciBusId: \"0000:01:00.0\", migMode: enabled }\n",
    )
    .unwrap();
    let error = MockBackend::from_profile(path.to_str().unwrap()).unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, ProfileError::Invalid { .. }), "{message}");
    assert_contains(&message, "broken.yaml");
    assert_contains(&message, "gpus[0].migMode");

    std::fs::write(&path, "driverVersion: [\n").unwrap();
    let error = MockBackend::from_profile(path.to_str().unwrap()).unwrap_err();
    assert!(matches!(error, ProfileError::Parse { .. }), "{error}");
    assert!(error.to_string().contains("broken.yaml"), "{error}");

    std::fs::write(&path, "driverVersion: \"1\"\ncudaDriverVersion: \"13.0\"\nmodels: {}\ngpus:\n  - { model: x, pciBusId: 7, typo: 1 }\n").unwrap();
    let message = MockBackend::from_profile(path.to_str().unwrap())
        .unwrap_err()
        .to_string();
    assert_contains(&message, "typo");
}

// ---- dynamic MIG: the counters against the reference tables ------------------------------

fn dynamic(profile: &str) -> (tempfile::TempDir, MockBackend, Discovery) {
    discover_with(profile, &DiscoveryOptions::new().dynamic_mig(true))
}

fn quantities(map: &BTreeMap<String, dra_sdk::slices::Quantity>) -> BTreeMap<String, String> {
    map.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect()
}

/// What a row consumes (or, for the largest row, what the GPU holds): its dimensions and the
/// memory slices `slices`.
fn counters_of(row: &MigRow, slices: std::ops::Range<u32>) -> BTreeMap<String, String> {
    let (_, _, mib, sm, ce, dec, enc, jpg, ofa, _, _) = *row;
    let mut counters: BTreeMap<String, String> = [
        ("multiprocessors", sm.to_string()),
        ("copy-engines", ce.to_string()),
        ("decoders", dec.to_string()),
        ("encoders", enc.to_string()),
        ("jpeg-engines", jpg.to_string()),
        ("ofa-engines", ofa.to_string()),
        ("memory", format!("{mib}Mi")),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value))
    .collect();
    counters.extend(slices.map(|slice| (format!("memory-slice-{slice}"), "1".to_owned())));
    counters
}

/// Every partitionable GPU's pool: the counter set holds the 7g row and 8 memory slices;
/// each partition of each row consumes its row and the slices of its placement; the full GPU,
/// when published, consumes everything; nothing else is in the pool. Returns the number of
/// partitionable GPUs and of them the number with the full GPU published.
fn check_partitions(profile: &str) -> (usize, usize) {
    let (_dir, _backend, discovery) = dynamic(profile);
    let pools = discovery.partition_pools("node-1");
    let mut with_full = 0;
    for parent in &discovery.partitionable {
        let minor = parent.info.minor;
        let model = model_of(&parent.info.product_name);
        let (_, pool) = pools
            .iter()
            .find(|(name, _)| *name == format!("node-1/gpu-{minor}"))
            .unwrap_or_else(|| panic!("{profile}: no pool for gpu-{minor}"));
        let set_name = format!("gpu-{minor}-counter-set");
        assert_eq!(pool.shared_counters.len(), 1);
        assert_eq!(pool.shared_counters[0].name, set_name);
        let everything = counters_of(model.mig.last().unwrap(), 0..8);
        assert_eq!(quantities(&pool.shared_counters[0].counters), everything);
        let mut expected = 0;
        for row in model.mig {
            let (name, id, .., starts, size) = *row;
            for &start in starts {
                let device_name = format!(
                    "gpu-{minor}-mig-{}-{id}-{start}",
                    name.replace('.', "").replace('+', "-")
                );
                let device = pool
                    .devices
                    .iter()
                    .find(|device| device.name == device_name)
                    .unwrap_or_else(|| panic!("{device_name} is not published"));
                assert_eq!(device.consumes_counters.len(), 1);
                assert_eq!(device.consumes_counters[0].counter_set, set_name);
                assert_eq!(
                    quantities(&device.consumes_counters[0].counters),
                    counters_of(row, start..start + size),
                    "{device_name}"
                );
                assert!(!device.attributes.contains_key("uuid"), "{device_name}");
                assert_eq!(string(device, "profile"), name);
                expected += 1;
            }
        }
        if let Some(full) = pool
            .devices
            .iter()
            .find(|d| d.name == format!("gpu-{minor}"))
        {
            assert_eq!(
                quantities(&full.consumes_counters[0].counters),
                everything,
                "the full GPU consumes everything"
            );
            with_full += 1;
            expected += 1;
        }
        assert_eq!(pool.devices.len(), expected, "{profile}: gpu-{minor}");
    }
    (discovery.partitionable.len(), with_full)
}

#[test]
fn dynamic_mig_counters_follow_the_reference_tables() {
    // A100-80GB: GPUs 0-2 are in MIG mode (Ampere cannot leave it without a reset):
    // partitions only; GPUs 3-7 have MIG off and cannot turn it on: plain full GPUs.
    assert_eq!(check_partitions("dgx-a100"), (3, 0));
    let (_dir, _backend, a100) = dynamic("dgx-a100");
    assert!(a100.migs.is_empty(), "no static MIG devices under the gate");
    let node: Vec<String> = a100.devices().into_iter().map(|d| d.name).collect();
    assert_eq!(node, ["gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"]);
    // H100: Hopper turns MIG on at prepare: every GPU, with its full GPU.
    assert_eq!(check_partitions("dgx-h100"), (8, 8));
    // A100-40GB (in MIG mode) next to a T4.
    assert_eq!(check_partitions("mixed"), (1, 0));
}

#[test]
fn dynamic_mig_pools_are_valid_in_both_slice_layouts() {
    for profile in ["dgx-a100", "dgx-h100", "mixed"] {
        let (_dir, _backend, discovery) = dynamic(profile);
        let resources = discovery.resources("node-1");
        // 1.34: counter sets with their consumers; 1.35+: counter sets in slices of their own.
        for release in [34, 35, 36] {
            resources
                .validate(&SliceLimits::for_release(KubernetesVersion::new(
                    1, release,
                )))
                .unwrap_or_else(|error| panic!("{profile} on 1.{release}: {error}"));
        }
    }
}

/// Why the driver declares no `partitionTypeAttribute` (docs/dynamic-mig.md): the partitions
/// of one profile consume different `memory-slice-<i>` counters at each placement, and a
/// partition type needs one counter cost for all its devices (the pool status controller
/// reports `PartitionCostMismatch` otherwise; the SDK refuses it before publishing).
#[test]
fn dynamic_mig_pools_cannot_name_the_profile_as_partition_type() {
    let (_dir, _backend, discovery) = dynamic("dgx-h100");
    let (name, pool) = discovery.partition_pools("node-1").remove(0);
    let resources = dra_sdk::slices::DriverResources::new().with_pool(
        name,
        pool.partition_type_attribute("gpu.nvidia.com/profile"),
    );
    let error = resources
        .validate(&SliceLimits::for_release(KubernetesVersion::new(1, 37)))
        .unwrap_err()
        .to_string();
    assert_contains(&error, "which has the same partition type \"1g.10gb\"");
}
