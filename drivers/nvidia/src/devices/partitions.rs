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
    attributes: MigAttributes,
}

impl MigPartition {
    /// The device as published: attributes, capacities and its counter consumption.
    pub fn device(&self) -> Device {
        Device::new(&self.name)
            .with_attributes(&self.attributes)
            .consumes(
                &self.counter_set,
                partition_consumption(&self.profile, self.placement),
            )
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
