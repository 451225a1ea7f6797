//! Dynamic MIG (gate `DynamicMIG`, [`DiscoveryOptions::dynamic_mig`](super::DiscoveryOptions::dynamic_mig)): MIG-capable GPUs
//! published as partitionable devices.
//!
//! A GPU is *partitionable* when it supports MIG, lists its GPU-instance profiles, waits for
//! no reset (MIG mode `current` = `pending`), and either has MIG mode on or can turn it on
//! without a reset (Hopper and later, [`can_toggle_mig_mode`]). Ampere with MIG off stays a
//! plain full GPU (turning MIG on would need a reset); a GPU waiting for a reset is published
//! as without the gate.
//!
//! For each partitionable GPU the node publishes, in a pool of its own
//! ([`partition_pool_name`]: `<node>/gpu-<minor>`):
//!
//! * the counter set `gpu-<minor>-counter-set` ([`crate::devices::counters`]);
//! * one abstract MIG device per profile and placement, named as a static MIG device
//!   (`gpu-<minor>-mig-<profile>-<profileID>-<placementStart>`), with the attributes of a MIG
//!   device except `uuid` (the instance exists only once prepared), consuming its share;
//! * the full GPU `gpu-<minor>` when MIG mode is off, consuming every counter.
//!
//! Compatibility groups (Kubernetes 1.37, `consumesCounters[].compatibilityGroups`) are
//! declared only where the counters fall short ([`compatibility_groups`]): NVIDIA drivers
//! before R510 cannot hold the two 4-memory-slice halves of a GPU as a 4-compute and a
//! 3-compute instance at once (`4g` with `3g`), which the counters allow. From R510 on, the
//! memory-slice and dimension counters already express every layout the placement tables
//! allow, and no groups are published (`docs/dynamic-mig.md`, "Layouts the counters keep").
//!
//! Why a pool per GPU: Kubernetes 1.34 keeps a counter set and the devices consuming it in one
//! slice, and allows 32 counters across the counter sets of a slice. A GPU's set has 15
//! counters (7 dimensions, 8 memory slices), so one pool for a DGX (8 sets, 120 counters)
//! would not validate there; the SDK lays out one slice per pool on 1.34 and, on 1.35+, a
//! counter-set slice and a device slice per pool (upstream: G slices on 1.34, G+1 on 1.35+).

use std::collections::BTreeMap;

use dra_sdk::slices::{CounterSet, Device};

use super::{GpuCommon, MigAttributes, mig_device_name};
use crate::backend::mig::{can_toggle_mig_mode, needs_reset};
use crate::backend::{GpuInfo, GpuInventory, MigMode, MigPlacement, MigProfileInfo};
use crate::devices::counters::{counter_set_name, gpu_counters, partition_consumption};

/// The pool of a partitionable GPU: `<node>/gpu-<minor>`.
pub fn partition_pool_name(node_name: &str, minor: u32) -> String {
    format!("{node_name}/gpu-{minor}")
}

/// Whether a GPU is published as partitionable under dynamic MIG (see the module docs).
pub fn is_partitionable(gpu: &GpuInventory) -> bool {
    let Some(mode) = gpu.mig_mode else {
        return false;
    };
    !gpu.mig_profiles.is_empty()
        && !needs_reset(Some(mode))
        && (mode.current || can_toggle_mig_mode(gpu.info.cuda_compute_capability))
}

/// The compatibility group of layouts that may hold the 4-compute instance on a 4-memory-slice
/// half (`4g`), on drivers before R510.
pub const HALF_4C_GROUP: &str = "half-4c";
/// The compatibility group of layouts that may hold a 3-compute instance on a 4-memory-slice
/// half (`3g`), on drivers before R510.
pub const HALF_3C_GROUP: &str = "half-3c";

/// The first NVIDIA driver branch that allows a `4g` and a `3g` instance on one GPU.
const HALVES_TOGETHER_SINCE: u64 = 510;

/// The compatibility groups of a partition of a GPU with these profiles, under NVIDIA driver
/// `driver_version` (`535.183.01`): none, unless the driver predates R510 and the GPU has
/// both a 4-memory-slice profile with 4 compute slices and one with 3. Then the `4g`
/// profile is in [`HALF_4C_GROUP`], the `3g` profile in [`HALF_3C_GROUP`] and every other
/// partition in both, so the scheduler never puts the two together (the groups of all
/// partitions allocated from a GPU's counter set must share one) while every other layout the
/// counters allow stays allowed. NVIDIA MIG user guide: "prior to NVIDIA driver release R510,
/// the combination of a (4 memory, 4 compute) and a (4 memory, 3 compute) profile was not
/// supported" (`shared/reference/nvidia-mig.md`). An unreadable version counts as current.
pub fn compatibility_groups(
    profile: &MigProfileInfo,
    profiles: &[MigProfileInfo],
    driver_version: &str,
) -> Vec<&'static str> {
    let major = driver_version
        .split('.')
        .next()
        .and_then(|major| major.trim().parse::<u64>().ok());
    if major.is_none_or(|major| major >= HALVES_TOGETHER_SINCE) {
        return Vec::new();
    }
    let half = |compute: u32| {
        move |p: &MigProfileInfo| {
            p.slice_count == compute
                && !p.placements.is_empty()
                && p.placements.iter().all(|placement| placement.size == 4)
        }
    };
    let (four, three) = (half(4), half(3));
    if !profiles.iter().any(&four) || !profiles.iter().any(&three) {
        return Vec::new();
    }
    if four(profile) {
        vec![HALF_4C_GROUP]
    } else if three(profile) {
        vec![HALF_3C_GROUP]
    } else {
        vec![HALF_4C_GROUP, HALF_3C_GROUP]
    }
}

/// A GPU published as partitionable.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PartitionableGpu {
    /// The GPU, completed from the host.
    pub info: GpuInfo,
    /// Its MIG mode at discovery.
    pub mig_mode: MigMode,
    /// `gpu-<minor>-counter-set`.
    pub counter_set: String,
    /// The counters of the set, name → value.
    pub counters: BTreeMap<String, String>,
}

impl PartitionableGpu {
    /// The counter set as published.
    pub fn counter_set(&self) -> CounterSet {
        CounterSet::new(
            &self.counter_set,
            self.counters.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        )
    }
}

/// One profile at one placement on a partitionable GPU: created at prepare.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct MigPartition {
    /// `gpu-<minor>-mig-<profile>-<profileID>-<placementStart>`.
    pub name: String,
    /// The GPU.
    pub parent: GpuInfo,
    /// The GPU-instance profile.
    pub profile: MigProfileInfo,
    /// The placement.
    pub placement: MigPlacement,
    /// The counter set it consumes from.
    pub counter_set: String,
    /// Its compatibility groups on the counter set ([`compatibility_groups`]; usually none).
    pub compatibility_groups: Vec<&'static str>,
    attributes: MigAttributes,
}

impl MigPartition {
    /// The device as published: attributes, capacities and its counter consumption.
    pub fn device(&self) -> Device {
        let device = Device::new(&self.name).with_attributes(&self.attributes);
        let consumed = partition_consumption(&self.profile, self.placement);
        if self.compatibility_groups.is_empty() {
            device.consumes(&self.counter_set, consumed)
        } else {
            device.consumes_in_groups(
                &self.counter_set,
                consumed,
                self.compatibility_groups.iter().copied(),
            )
        }
    }
}

/// The partitionable GPU and its partitions, for one GPU of the inventory.
pub(super) fn partition(
    gpu: &GpuInventory,
    info: &GpuInfo,
    common: &GpuCommon,
) -> (PartitionableGpu, Vec<MigPartition>) {
    let counter_set = counter_set_name(info.minor);
    let partitionable = PartitionableGpu {
        info: info.clone(),
        mig_mode: gpu.mig_mode.unwrap_or_default(),
        counter_set: counter_set.clone(),
        counters: gpu_counters(&gpu.mig_profiles),
    };
    let mut partitions = Vec::new();
    for profile in &gpu.mig_profiles {
        for placement in &profile.placements {
            partitions.push(MigPartition {
                name: mig_device_name(info.minor, profile, placement.start),
                parent: info.clone(),
                profile: profile.clone(),
                placement: *placement,
                counter_set: counter_set.clone(),
                compatibility_groups: compatibility_groups(
                    profile,
                    &gpu.mig_profiles,
                    common.driver_version.as_str(),
                ),
                attributes: MigAttributes::new(None, info, profile, common),
            });
        }
    }
    (partitionable, partitions)
}

#[cfg(test)]
mod tests {
    use super::super::{Discovery, DiscoveryOptions, NodeDevice};
    use crate::backend::mock::MockBackend;
    use crate::backend::{GpuBackend, MigMode};
    use crate::host::FakeHostTree;

    // The counters against the reference tables: `tests/devices.rs`.

    #[test]
    fn a_gpu_waiting_for_a_reset_is_not_partitionable() {
        let dir = tempfile::tempdir().unwrap();
        let backend = MockBackend::from_profile("dgx-h100").unwrap();
        let gpu = backend.hardware().gpus[2].clone();
        backend.mig().set_mode(
            &gpu,
            MigMode {
                current: false,
                pending: true,
            },
        );
        let host = FakeHostTree::new(dir.path())
            .build(&backend.inventory().unwrap())
            .unwrap();
        let options = DiscoveryOptions::new().dynamic_mig(true);
        let discovery = Discovery::discover(&backend, &host, &options).unwrap();
        assert_eq!(discovery.partitionable.len(), 7);
        assert!(
            discovery
                .partitionable
                .iter()
                .all(|p| p.info.uuid != gpu.info.uuid)
        );
        // Published as without the gate: a full GPU in the node's pool.
        let node: Vec<String> = discovery.devices().into_iter().map(|d| d.name).collect();
        assert_eq!(node, [format!("gpu-{}", gpu.info.minor)]);
        // The others: partitions and full GPU in the GPU's pool.
        assert_eq!(
            discovery.pool_of("node-1", "gpu-3-mig-2g20gb-14-4"),
            "node-1/gpu-3"
        );
        assert_eq!(discovery.pool_of("node-1", "gpu-3"), "node-1/gpu-3");
        assert_eq!(discovery.pool_of("node-1", "gpu-2"), "node-1");
        assert!(matches!(
            discovery.device("gpu-3-mig-2g20gb-14-4"),
            Some(NodeDevice::Partition(p)) if p.placement.start == 4 && p.profile.id == 14
        ));
    }
}

#[cfg(test)]
mod group_tests {
    use super::*;
    use crate::backend::mock::MockBackend;

    #[test]
    fn groups_only_before_r510_and_only_where_a_4g_and_a_3g_exist() {
        let backend = MockBackend::from_profile("mixed").unwrap();
        let a100 = backend
            .hardware()
            .gpus
            .iter()
            .find(|gpu| !gpu.mig_profiles.is_empty())
            .unwrap();
        let profiles = &a100.mig_profiles;
        let groups = |id: u32, driver: &str| {
            let profile = profiles.iter().find(|p| p.id == id).unwrap();
            compatibility_groups(profile, profiles, driver)
        };
        assert_eq!(groups(5, "470.82.01"), [HALF_4C_GROUP]);
        assert_eq!(groups(9, "470.82.01"), [HALF_3C_GROUP]);
        for other in [19, 20, 15, 14, 0] {
            assert_eq!(
                groups(other, "470.82.01"),
                [HALF_4C_GROUP, HALF_3C_GROUP],
                "profile {other}"
            );
        }
        assert!(groups(5, "510.39.01").is_empty(), "R510 holds both halves");
        assert!(groups(9, "535.183.01").is_empty());
        assert!(groups(9, "unknown").is_empty(), "unreadable: current");
        // Without a 3g profile there is nothing to keep apart.
        let without_3g: Vec<MigProfileInfo> =
            profiles.iter().filter(|p| p.id != 9).cloned().collect();
        let four = without_3g.iter().find(|p| p.id == 5).unwrap();
        assert!(compatibility_groups(four, &without_3g, "470.82.01").is_empty());
    }
}
