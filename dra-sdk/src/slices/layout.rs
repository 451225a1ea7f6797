//! Splitting a pool into slices: deterministic, limit-respecting and sticky.
//!
//! A layout assigns every device and counter set of a pool to a numbered slice. The slice
//! number becomes part of the slice's name, so a layout fully determines which objects exist.
//!
//! # Capacity of a slice
//!
//! * Devices per slice: the pool's `max_devices_per_slice`, else
//!   [`SliceLimits::default_devices_per_slice`], and never more than the server allows for the
//!   slice's contents (64 on 1.35+ once any device in it has taints, counter consumption or
//!   list attributes; 128 otherwise).
//! * 1.34 also caps consumed counters per slice; 1.35+ caps counter sets per slice (8) and the
//!   strictest rules cap counters across the sets of a slice (32).
//! * Layout of counter sets: 1.35+ ([`CounterLayout::SeparateSlices`]) puts counter sets in
//!   slices of their own; 1.34 ([`CounterLayout::WithDevices`]) pins all counter sets and every
//!   device that consumes counters to one "home" slice.
//!
//! # Assignment
//!
//! 1. **Fresh layout** (no previous layout): counter-set slices first, then devices in the
//!    driver's order, each slice filled before the next is opened (next-fit). Slices are
//!    numbered from 0.
//! 2. **Sticky layout** (a previous layout exists — the one this publisher computed last, or
//!    after a restart the one read back from the server): every device and counter set that
//!    still exists stays in its previous slice, in the previous order, as long as the slice's
//!    capacity allows (a device that newly uses taints can lower the capacity; devices that no
//!    longer fit are moved). Devices and counter sets that are new or moved are then placed
//!    first-fit, in the driver's order, into the lowest-numbered slice with room, or into a new
//!    slice with the lowest unused number. Slices left empty disappear.
//! 3. If the sticky layout uses more than twice the slices of a fresh layout (and at least two
//!    more), it is replaced by the fresh layout: fragmentation is bounded.
//! 4. Within a slice, devices and counter sets appear in the driver's order. A pool always has
//!    at least one slice, possibly empty.
//!
//! So changing one device (its attributes, a taint) changes one slice; adding a device fills a
//! hole or the last slice; only moving devices or changing the number of slices touches more.

use std::collections::{BTreeMap, HashMap};

use super::limits::{CounterLayout, SliceLimits};
use super::model::Pool;

/// The contents of one slice, as positions in the pool's `devices` and `shared_counters`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SliceAssignment {
    /// The slice number (part of the slice name).
    pub(crate) index: u32,
    /// Positions in `Pool::devices`, ascending.
    pub(crate) devices: Vec<usize>,
    /// Positions in `Pool::shared_counters`, ascending.
    pub(crate) counter_sets: Vec<usize>,
}

/// A slice of an earlier layout, by names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PreviousSlice {
    /// The slice number.
    pub(crate) index: u32,
    /// Device names in slice order.
    pub(crate) devices: Vec<String>,
    /// Counter-set names in slice order.
    pub(crate) counter_sets: Vec<String>,
}

impl PreviousSlice {
    /// The names of an assignment.
    pub(crate) fn from_assignment(pool: &Pool, assignment: &SliceAssignment) -> Self {
        Self {
            index: assignment.index,
            devices: assignment
                .devices
                .iter()
                .map(|&d| pool.devices[d].name.clone())
                .collect(),
            counter_sets: assignment
                .counter_sets
                .iter()
                .map(|&s| pool.shared_counters[s].name.clone())
                .collect(),
        }
    }
}

#[derive(Debug, Default)]
struct Bin {
    devices: Vec<usize>,
    sets: Vec<usize>,
    advanced: bool,
    consumed: usize,
    counters: usize,
}

struct Packer<'a> {
    limits: &'a SliceLimits,
    target: usize,
    advanced: Vec<bool>,
    consumed: Vec<usize>,
    set_counters: Vec<usize>,
    separate: bool,
}

impl Packer<'_> {
    fn device_fits(&self, bin: &Bin, device: usize) -> bool {
        if self.separate && !bin.sets.is_empty() {
            return false;
        }
        let advanced = bin.advanced || self.advanced[device];
        let hard = if advanced {
            self.limits.max_devices_per_slice_advanced
        } else {
            self.limits.max_devices_per_slice
        };
        bin.devices.len() < hard.min(self.target)
            && self
                .limits
                .max_consumed_counters_per_slice
                .is_none_or(|max| bin.consumed + self.consumed[device] <= max)
    }

    fn set_fits(&self, bin: &Bin, set: usize) -> bool {
        (!self.separate || bin.devices.is_empty())
            && bin.sets.len() < self.limits.max_counter_sets_per_slice
            && self
                .limits
                .max_counters_per_slice
                .is_none_or(|max| bin.counters + self.set_counters[set] <= max)
    }

    fn put_device(&self, bin: &mut Bin, device: usize) {
        bin.devices.push(device);
        bin.advanced |= self.advanced[device];
        bin.consumed += self.consumed[device];
    }

    fn put_set(&self, bin: &mut Bin, set: usize) {
        bin.sets.push(set);
        bin.counters += self.set_counters[set];
    }
}

fn lowest_unused(bins: &BTreeMap<u32, Bin>) -> u32 {
    (0..).find(|i| !bins.contains_key(i)).unwrap_or(u32::MAX)
}

/// Computes the layout of a pool. The pool must have passed validation for `limits`.
pub(crate) fn assign(
    pool: &Pool,
    limits: &SliceLimits,
    previous: Option<&[PreviousSlice]>,
) -> Vec<SliceAssignment> {
    let packer = Packer {
        limits,
        target: pool
            .max_devices_per_slice
            .unwrap_or_else(|| limits.default_devices_per_slice())
            .max(1),
        advanced: pool
            .devices
            .iter()
            .map(|d| d.uses_advanced_features())
            .collect(),
        consumed: pool
            .devices
            .iter()
            .map(|d| d.consumes_counters.iter().map(|c| c.counters.len()).sum())
            .collect(),
        set_counters: pool
            .shared_counters
            .iter()
            .map(|s| s.counters.len())
            .collect(),
        separate: limits.counter_layout == CounterLayout::SeparateSlices,
    };
    let Some(previous) = previous.filter(|p| !p.is_empty()) else {
        return finish(pack(pool, &packer, None));
    };
    let sticky = pack(pool, &packer, Some(previous));
    let too_many = |fresh: usize| sticky.len() > (2 * fresh).max(fresh + 1);
    // A fresh layout never needs fewer slices than this, so below it there is no need to
    // compute one.
    let per_slice = packer.target.min(limits.max_devices_per_slice);
    let mut lower_bound = pool.devices.len().div_ceil(per_slice);
    if packer.separate {
        lower_bound += pool
            .shared_counters
            .len()
            .div_ceil(limits.max_counter_sets_per_slice.max(1));
    }
    if too_many(lower_bound.max(1)) {
        let fresh = pack(pool, &packer, None);
        if too_many(fresh.len()) {
            return finish(fresh);
        }
    }
    finish(sticky)
}

fn pack(
    pool: &Pool,
    packer: &Packer<'_>,
    previous: Option<&[PreviousSlice]>,
) -> BTreeMap<u32, Bin> {
    let mut bins: BTreeMap<u32, Bin> = BTreeMap::new();
    let mut device_placed = vec![false; pool.devices.len()];
    let mut set_placed = vec![false; pool.shared_counters.len()];
    let device_pos: HashMap<&str, usize> = pool
        .devices
        .iter()
        .enumerate()
        .map(|(i, d)| (d.name.as_str(), i))
        .collect();
    let set_pos: HashMap<&str, usize> = pool
        .shared_counters
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.as_str(), i))
        .collect();

    // 1.34: counter sets and their consumers share one home slice.
    if !packer.separate && !pool.shared_counters.is_empty() {
        let home = previous
            .and_then(|p| p.iter().find(|s| !s.counter_sets.is_empty()))
            .or_else(|| previous.and_then(|p| p.first()))
            .map_or(0, |s| s.index);
        let bin = bins.entry(home).or_default();
        for (set, placed) in set_placed.iter_mut().enumerate() {
            packer.put_set(bin, set);
            *placed = true;
        }
        for (device, placed) in device_placed.iter_mut().enumerate() {
            if !pool.devices[device].consumes_counters.is_empty() {
                packer.put_device(bin, device);
                *placed = true;
            }
        }
    }

    // Sticky pass: keep what still fits where it was.
    for slice in previous.into_iter().flatten() {
        let bin = bins.entry(slice.index).or_default();
        for name in &slice.counter_sets {
            if let Some(&set) = set_pos.get(name.as_str())
                && !set_placed[set]
                && packer.set_fits(bin, set)
            {
                packer.put_set(bin, set);
                set_placed[set] = true;
            }
        }
        for name in &slice.devices {
            if let Some(&device) = device_pos.get(name.as_str())
                && !device_placed[device]
                && packer.device_fits(bin, device)
            {
                packer.put_device(bin, device);
                device_placed[device] = true;
            }
        }
    }
    bins.retain(|_, bin| !bin.devices.is_empty() || !bin.sets.is_empty());

    // New and moved entries: first-fit after a previous layout, next-fit for a fresh one.
    let sticky = previous.is_some();
    // Next-fit continues in the last slice so far (1.34's home slice takes devices too).
    let mut open: Option<u32> = bins.keys().next_back().copied();
    for set in (0..pool.shared_counters.len()).filter(|&s| !set_placed[s]) {
        let existing = if sticky {
            bins.iter()
                .find(|(_, bin)| packer.set_fits(bin, set))
                .map(|(&i, _)| i)
        } else {
            open.filter(|i| bins.get(i).is_some_and(|bin| packer.set_fits(bin, set)))
        };
        let index = existing.unwrap_or_else(|| lowest_unused(&bins));
        packer.put_set(bins.entry(index).or_default(), set);
        open = Some(index);
    }
    open = bins.keys().next_back().copied();
    for device in (0..pool.devices.len()).filter(|&d| !device_placed[d]) {
        let existing = if sticky {
            bins.iter()
                .find(|(_, bin)| packer.device_fits(bin, device))
                .map(|(&i, _)| i)
        } else {
            open.filter(|i| {
                bins.get(i)
                    .is_some_and(|bin| packer.device_fits(bin, device))
            })
        };
        let index = existing.unwrap_or_else(|| lowest_unused(&bins));
        packer.put_device(bins.entry(index).or_default(), device);
        open = Some(index);
    }

    if bins.is_empty() {
        let index = previous.and_then(|p| p.first()).map_or(0, |s| s.index);
        bins.insert(index, Bin::default());
    }
    bins
}

fn finish(bins: BTreeMap<u32, Bin>) -> Vec<SliceAssignment> {
    bins.into_iter()
        .map(|(index, mut bin)| {
            bin.devices.sort_unstable();
            bin.sets.sort_unstable();
            SliceAssignment {
                index,
                devices: bin.devices,
                counter_sets: bin.sets,
            }
        })
        .collect()
}

/// Checks a layout against the limits: used by tests and debug assertions.
#[cfg(test)]
pub(crate) fn check(
    pool: &Pool,
    limits: &SliceLimits,
    layout: &[SliceAssignment],
) -> Result<(), String> {
    use std::collections::BTreeSet;
    let mut devices = BTreeSet::new();
    let mut sets = BTreeSet::new();
    for slice in layout {
        let advanced = slice
            .devices
            .iter()
            .any(|&d| pool.devices[d].uses_advanced_features());
        let max = if advanced {
            limits.max_devices_per_slice_advanced
        } else {
            limits.max_devices_per_slice
        };
        if slice.devices.len() > max {
            return Err(format!(
                "slice {} has {} devices",
                slice.index,
                slice.devices.len()
            ));
        }
        if limits.counter_layout == CounterLayout::SeparateSlices {
            if !slice.devices.is_empty() && !slice.counter_sets.is_empty() {
                return Err(format!("slice {} mixes devices and counters", slice.index));
            }
            if slice.counter_sets.len() > limits.max_counter_sets_per_slice {
                return Err(format!("slice {} has too many counter sets", slice.index));
            }
        }
        for &d in &slice.devices {
            if !devices.insert(d) {
                return Err(format!("device {d} appears twice"));
            }
        }
        for &s in &slice.counter_sets {
            if !sets.insert(s) {
                return Err(format!("counter set {s} appears twice"));
            }
        }
    }
    if devices.len() != pool.devices.len() || sets.len() != pool.shared_counters.len() {
        return Err("not everything was placed".to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slices::limits::KubernetesVersion;
    use crate::slices::model::{CounterSet, Device, DeviceTaint, TaintEffect};

    fn devices(n: usize) -> Vec<Device> {
        (0..n).map(|i| Device::new(format!("dev-{i}"))).collect()
    }

    fn names(pool: &Pool, layout: &[SliceAssignment]) -> Vec<PreviousSlice> {
        layout
            .iter()
            .map(|a| PreviousSlice::from_assignment(pool, a))
            .collect()
    }

    fn sizes(layout: &[SliceAssignment]) -> Vec<(u32, usize)> {
        layout.iter().map(|s| (s.index, s.devices.len())).collect()
    }

    #[test]
    fn fresh_layout_fills_slices_in_order() {
        let limits = SliceLimits::for_release(KubernetesVersion::new(1, 36));
        let pool = Pool::new(devices(1000));
        let layout = assign(&pool, &limits, None);
        assert_eq!(layout.len(), 16); // 15 × 64 + 40
        assert_eq!(layout[0].devices, (0..64).collect::<Vec<_>>());
        assert_eq!(layout[15].devices.len(), 1000 - 15 * 64);
        check(&pool, &limits, &layout).unwrap();

        let v134 = SliceLimits::for_release(KubernetesVersion::new(1, 34));
        assert_eq!(assign(&pool, &v134, None).len(), 8); // 128 per slice
        let big = Pool::new(devices(1000)).max_devices_per_slice(128);
        assert_eq!(assign(&big, &limits, None).len(), 8);
    }

    #[test]
    fn empty_pool_has_one_empty_slice() {
        let layout = assign(&Pool::new([]), &SliceLimits::strictest(), None);
        assert_eq!(layout, vec![SliceAssignment::default()]);
    }

    #[test]
    fn layout_is_a_fixpoint() {
        let limits = SliceLimits::strictest();
        let pool = Pool::new(devices(300));
        let first = assign(&pool, &limits, None);
        let again = assign(&pool, &limits, Some(&names(&pool, &first)));
        assert_eq!(first, again);
    }

    #[test]
    fn a_taint_changes_only_its_slice() {
        let limits = SliceLimits::for_release(KubernetesVersion::new(1, 36));
        let mut pool = Pool::new(devices(200));
        let before = assign(&pool, &limits, None);
        let previous = names(&pool, &before);
        pool.devices[70]
            .taints
            .push(DeviceTaint::new("example.com/bad", TaintEffect::NoExecute));
        let after = assign(&pool, &limits, Some(&previous));
        assert_eq!(before, after);
    }

    #[test]
    fn taint_in_a_full_large_slice_moves_only_overflow() {
        let limits = SliceLimits::for_release(KubernetesVersion::new(1, 36));
        let mut pool = Pool::new(devices(128)).max_devices_per_slice(128);
        let before = assign(&pool, &limits, None);
        assert_eq!(sizes(&before), vec![(0, 128)]);
        let previous = names(&pool, &before);
        pool.devices[3]
            .taints
            .push(DeviceTaint::new("example.com/bad", TaintEffect::NoExecute));
        let after = assign(&pool, &limits, Some(&previous));
        check(&pool, &limits, &after).unwrap();
        assert_eq!(sizes(&after), vec![(0, 64), (1, 64)]);
        assert_eq!(after[0].devices, (0..64).collect::<Vec<_>>());
    }

    #[test]
    fn added_device_fills_a_hole_and_removed_one_leaves_it() {
        let limits = SliceLimits::strictest();
        let mut pool = Pool::new(devices(130));
        let before = assign(&pool, &limits, None);
        assert_eq!(sizes(&before), vec![(0, 64), (1, 64), (2, 2)]);

        // Removing a device from slice 0 touches only slice 0.
        let previous = names(&pool, &before);
        pool.devices.remove(10);
        let removed = assign(&pool, &limits, Some(&previous));
        assert_eq!(sizes(&removed), vec![(0, 63), (1, 64), (2, 2)]);
        assert_eq!(names(&pool, &removed)[1..], previous[1..]);

        // A new device at the front of the list lands in the hole.
        let previous = names(&pool, &removed);
        pool.devices.insert(0, Device::new("new"));
        let added = assign(&pool, &limits, Some(&previous));
        assert_eq!(sizes(&added), vec![(0, 64), (1, 64), (2, 2)]);
        assert!(added[0].devices.contains(&0));
    }

    #[test]
    fn lost_slice_gets_its_number_back() {
        let limits = SliceLimits::strictest();
        let pool = Pool::new(devices(192));
        let before = assign(&pool, &limits, None);
        let mut previous = names(&pool, &before);
        previous.remove(1);
        let after = assign(&pool, &limits, Some(&previous));
        assert_eq!(after, before);
    }

    #[test]
    fn fragmentation_is_bounded() {
        let limits = SliceLimits::strictest();
        let pool = Pool::new(devices(640));
        let before = assign(&pool, &limits, None);
        assert_eq!(before.len(), 10);
        // Keep one device per slice.
        let few = Pool::new(before.iter().map(|s| pool.devices[s.devices[0]].clone()));
        let after = assign(&few, &limits, Some(&names(&pool, &before)));
        assert_eq!(sizes(&after), vec![(0, 10)]);
        // Mild fragmentation is kept for stability.
        let some = Pool::new(
            pool.devices[..64 * 3]
                .iter()
                .cloned()
                .chain(pool.devices[600..].iter().cloned()),
        );
        let after = assign(&some, &limits, Some(&names(&pool, &before)));
        assert_eq!(sizes(&after), vec![(0, 64), (1, 64), (2, 64), (9, 40)]);
    }

    #[test]
    fn counter_sets_get_their_own_slices_on_1_35() {
        let limits = SliceLimits::for_release(KubernetesVersion::new(1, 35));
        let mut pool = Pool::new([]);
        for gpu in 0..10 {
            pool = pool.counter_set(CounterSet::new(format!("gpu-{gpu}"), [("memory", "80Gi")]));
            for part in 0..7 {
                pool = pool.device(
                    Device::new(format!("gpu-{gpu}-mig-{part}"))
                        .consumes(format!("gpu-{gpu}"), [("memory", "10Gi")]),
                );
            }
        }
        let layout = assign(&pool, &limits, None);
        check(&pool, &limits, &layout).unwrap();
        assert_eq!(
            layout
                .iter()
                .map(|s| (s.index, s.counter_sets.len(), s.devices.len()))
                .collect::<Vec<_>>(),
            vec![(0, 8, 0), (1, 2, 0), (2, 0, 64), (3, 0, 6)]
        );
        let strict = assign(&pool, &SliceLimits::strictest(), None);
        check(&pool, &SliceLimits::strictest(), &strict).unwrap();
    }

    #[test]
    fn counter_sets_share_a_slice_with_consumers_on_1_34() {
        let limits = SliceLimits::for_release(KubernetesVersion::new(1, 34));
        let mut devices = devices(200);
        devices.push(Device::new("part-a").consumes("gpu", [("memory", "1")]));
        let pool = Pool::new(devices).counter_set(CounterSet::new("gpu", [("memory", "2")]));
        let layout = assign(&pool, &limits, None);
        check(&pool, &limits, &layout).unwrap();
        assert_eq!(layout[0].counter_sets, vec![0]);
        assert!(layout[0].devices.contains(&200));
        assert_eq!(sizes(&layout), vec![(0, 128), (1, 73)]);
        let again = assign(&pool, &limits, Some(&names(&pool, &layout)));
        assert_eq!(layout, again);
    }

    #[test]
    fn deterministic() {
        let limits = SliceLimits::strictest();
        let pool = Pool::new(devices(500));
        let previous = names(&pool, &assign(&pool, &limits, None));
        let mut changed = pool.clone();
        changed.devices.retain(|d| !d.name.ends_with('7'));
        changed
            .devices
            .extend((0..90).map(|i| Device::new(format!("new-{i}"))));
        let a = assign(&changed, &limits, Some(&previous));
        let b = assign(&changed, &limits, Some(&previous));
        assert_eq!(a, b);
        check(&changed, &limits, &a).unwrap();
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        #[derive(Clone, Debug)]
        enum Change {
            Remove(usize),
            Insert(usize),
            Taint(usize),
            Untaint(usize),
        }

        fn change() -> impl Strategy<Value = Change> {
            prop_oneof![
                any::<usize>().prop_map(Change::Remove),
                any::<usize>().prop_map(Change::Insert),
                any::<usize>().prop_map(Change::Taint),
                any::<usize>().prop_map(Change::Untaint),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]

            /// Whatever happens to a pool, layouts stay valid, are fixpoints, and a change to
            /// one device's taints moves at most the devices of one overfull slice.
            #[test]
            fn layouts_stay_valid_and_stable(
                initial in 0usize..400,
                target in prop_oneof![Just(None), (1usize..200).prop_map(Some)],
                changes in proptest::collection::vec(change(), 1..25),
                release in 34u32..37,
            ) {
                let limits = SliceLimits::for_release(KubernetesVersion::new(1, release));
                let mut pool = Pool::new(devices(initial));
                pool.max_devices_per_slice = target;
                let mut layout = assign(&pool, &limits, None);
                let mut next_name = initial;
                for change in changes {
                    let previous = names(&pool, &layout);
                    let len = pool.devices.len();
                    let mut touched = None;
                    match change {
                        Change::Remove(i) if len > 0 => { pool.devices.remove(i % len); }
                        Change::Insert(i) => {
                            pool.devices.insert(i % (len + 1), Device::new(format!("dev-{next_name}")));
                            next_name += 1;
                        }
                        Change::Taint(i) if len > 0 => {
                            pool.devices[i % len].taints =
                                vec![DeviceTaint::new("example.com/bad", TaintEffect::NoSchedule)];
                            touched = Some(pool.devices[i % len].name.clone());
                        }
                        Change::Untaint(i) if len > 0 => {
                            pool.devices[i % len].taints.clear();
                            touched = Some(pool.devices[i % len].name.clone());
                        }
                        _ => {}
                    }
                    let next = assign(&pool, &limits, Some(&previous));
                    prop_assert_eq!(check(&pool, &limits, &next), Ok(()));
                    let again = assign(&pool, &limits, Some(&names(&pool, &next)));
                    prop_assert_eq!(&again, &next);
                    if let Some(device) = touched {
                        // Only the slice holding the device may lose devices (the overflow
                        // when its limit drops to 64); the others keep all of theirs.
                        let after = names(&pool, &next);
                        let holder = previous.iter().find(|s| s.devices.contains(&device)).map(|s| s.index);
                        for slice in previous.iter().filter(|s| Some(s.index) != holder) {
                            let now = after.iter().find(|s| s.index == slice.index);
                            prop_assert!(now.is_some_and(|now| slice.devices.iter().all(|d| now.devices.contains(d))));
                        }
                    }
                    layout = next;
                }
            }
        }
    }
}
