//! The shared counters of a MIG-capable GPU under dynamic MIG (`drivers.md` A.3), so that the
//! scheduler never allocates overlapping partitions, or a partition and the full GPU.
//!
//! One counter set per GPU, `gpu-<minor>-counter-set`, with
//!
//! * one counter per capacity dimension, the largest value any profile has (the `7g` profile's,
//!   which is all the GPU gives to MIG): `multiprocessors`, `copy-engines`, `decoders`,
//!   `encoders`, `jpeg-engines`, `ofa-engines`, `memory` (MiB × 2^20, written `<MiB>Mi`);
//! * one counter `memory-slice-<i>` = 1 per memory slice (8 on A100 and H100).
//!
//! A partition (profile at a placement) consumes its profile's dimensions and the memory
//! slices of its placement; the full GPU consumes every counter at its full value. Two
//! partitions whose placements overlap both need a slice counter that holds 1, so only one
//! is ever allocated; any partition blocks the full GPU and the full GPU blocks all of them.
//! The dimension counters add what the slices cannot express (two `1g.10gb+me` would
//! exceed the one OFA engine).
//!
//! Counter names are upstream's (kebab-case), so CEL and tools written against upstream's
//! slices read the same.

use std::collections::BTreeMap;

use crate::backend::{MigPlacement, MigProfileInfo};

/// The counter set of the GPU with this minor: `gpu-<minor>-counter-set`.
pub fn counter_set_name(minor: u32) -> String {
    format!("gpu-{minor}-counter-set")
}

/// The counter of one memory slice: `memory-slice-<i>`.
pub fn memory_slice_counter(slice: u32) -> String {
    format!("memory-slice-{slice}")
}

/// The per-dimension counters of a profile (or of the whole GPU), in publishing order.
fn dimensions(profile: &MigProfileInfo) -> [(&'static str, String); 7] {
    let engines = &profile.engines;
    [
        ("multiprocessors", engines.multiprocessors.to_string()),
        ("copy-engines", engines.copy_engines.to_string()),
        ("decoders", engines.decoders.to_string()),
        ("encoders", engines.encoders.to_string()),
        ("jpeg-engines", engines.jpeg_engines.to_string()),
        ("ofa-engines", engines.ofa_engines.to_string()),
        ("memory", format!("{}Mi", profile.memory_mib)),
    ]
}

/// The memory slices of a GPU: the end of its furthest placement (8 on A100 and H100).
pub fn memory_slice_count(profiles: &[MigProfileInfo]) -> u32 {
    profiles
        .iter()
        .flat_map(|profile| &profile.placements)
        .map(|placement| placement.slices().end)
        .max()
        .unwrap_or(0)
}

/// What a GPU with these profiles holds: the counter set's counters, name → value.
pub fn gpu_counters(profiles: &[MigProfileInfo]) -> BTreeMap<String, String> {
    let mut counters = BTreeMap::new();
    let mut largest = MigProfileInfo {
        id: 0,
        name: String::new(),
        slice_count: 0,
        max_instances: 0,
        memory_mib: 0,
        engines: Default::default(),
        placements: Vec::new(),
    };
    for profile in profiles {
        let (mine, theirs) = (&mut largest.engines, &profile.engines);
        mine.multiprocessors = mine.multiprocessors.max(theirs.multiprocessors);
        mine.copy_engines = mine.copy_engines.max(theirs.copy_engines);
        mine.decoders = mine.decoders.max(theirs.decoders);
        mine.encoders = mine.encoders.max(theirs.encoders);
        mine.jpeg_engines = mine.jpeg_engines.max(theirs.jpeg_engines);
        mine.ofa_engines = mine.ofa_engines.max(theirs.ofa_engines);
        largest.memory_mib = largest.memory_mib.max(profile.memory_mib);
    }
    for (name, value) in dimensions(&largest) {
        counters.insert(name.to_owned(), value);
    }
    for slice in 0..memory_slice_count(profiles) {
        counters.insert(memory_slice_counter(slice), "1".to_owned());
    }
    counters
}

/// What a partition (profile at placement) consumes from its GPU's counter set.
pub fn partition_consumption(
    profile: &MigProfileInfo,
    placement: MigPlacement,
) -> BTreeMap<String, String> {
    let mut consumed: BTreeMap<String, String> = dimensions(profile)
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect();
    for slice in placement.slices() {
        consumed.insert(memory_slice_counter(slice), "1".to_owned());
    }
    consumed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::mock::MockBackend;

    #[test]
    fn names_are_upstreams() {
        assert_eq!(counter_set_name(3), "gpu-3-counter-set");
        assert_eq!(memory_slice_counter(7), "memory-slice-7");
    }

    #[test]
    fn a_partition_consumes_its_profile_and_slices() {
        let backend = MockBackend::from_profile("dgx-a100").unwrap();
        let gpu = &backend.hardware().gpus[0];
        let profile = gpu.mig_profile(14).unwrap(); // 2g.20gb
        let consumed = partition_consumption(profile, MigPlacement::new(2, 2));
        assert_eq!(consumed["multiprocessors"], "28");
        assert_eq!(consumed["memory"], "19968Mi");
        assert_eq!(consumed["memory-slice-2"], "1");
        assert_eq!(consumed["memory-slice-3"], "1");
        assert!(!consumed.contains_key("memory-slice-4"));
        assert_eq!(consumed.len(), 9);
    }
}
