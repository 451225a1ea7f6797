//! NVLink topology: which GPUs of a node talk to each other over NVLink, computed once at
//! discovery from what the backend reported, and published as two attributes a claim can
//! constrain on (`docs/topology.md`):
//!
//! * `gpu.nvidia.com/nvlinkGroup` (string): the same value on every GPU of an **NVLink peer
//!   group**, a set of GPUs each pair of which is connected by NVLink: all GPUs of an
//!   NVSwitch machine, the two GPUs of a bridged pair on a PCIe server, the GPUs of a direct
//!   mesh. The value is the UUID of the group's GPU with the lowest PCI bus ID, so it is unique
//!   across the cluster and stable while the group's GPUs are. MIG devices carry their parent's.
//!   Absent on a GPU with no connected peer.
//! * `gpu.nvidia.com/nvlinkActiveLinks` (int): how many of the GPU's NVLinks are up. Absent when
//!   the GPU has no NVLink at all.
//!
//! Two GPUs are connected when their links say so ([`nvlinks_connect`]: a link of one ends at
//! the other, or both reach the same NVSwitch) or NVML reports peer-to-peer over NVLink between
//! them ([`GpuInventory::nvlink_peers`], which covers NVSwitches NVML cannot see, as in some
//! VMs). A refusal of peer-to-peer does not disconnect GPUs whose links connect them: NVML
//! refuses it for GPUs in MIG mode, whose MIG devices still inherit the group.
//!
//! Connected GPUs form components; a component is a group only when every pair in it is
//! connected. A component that is not (eight V100s in a hybrid cube mesh) publishes no group
//! for its GPUs, and discovery warns: `matchAttribute` on a group must mean "every pair talks
//! over NVLink", never "reachable in several hops".

use std::collections::{BTreeMap, BTreeSet};

use crate::backend::{GpuInventory, Inventory, nvlinks_connect};

/// The NVLink topology of one node's GPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NvLinkTopology {
    /// GPU UUID → its group's value.
    groups: BTreeMap<String, String>,
    /// GPU UUID → active links, for GPUs with NVLinks.
    active_links: BTreeMap<String, u32>,
    /// Components that are connected but not fully: no group is published for them.
    partial: Vec<Vec<String>>,
}

impl NvLinkTopology {
    /// The topology of the inventory's GPUs.
    ///
    /// ```
    /// use dra_driver_nvidia::backend::{GpuBackend, mock::MockBackend};
    /// use dra_driver_nvidia::devices::topology::NvLinkTopology;
    ///
    /// let inventory = MockBackend::from_profile("dgx-h100")?.inventory()?;
    /// let topology = NvLinkTopology::of(&inventory);
    /// let first = &inventory.gpus[0].info.uuid;
    /// // One group of all eight GPUs, named after the first.
    /// assert!(inventory.gpus.iter().all(|gpu| topology.group(&gpu.info.uuid) == Some(first.as_str())));
    /// assert_eq!(topology.active_links(first), Some(18));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn of(inventory: &Inventory) -> Self {
        let gpus = &inventory.gpus;
        let bus_ids: Vec<&str> = gpus
            .iter()
            .map(|gpu| gpu.info.pci.bus_id.as_str())
            .collect();
        let active_links = gpus
            .iter()
            .filter(|gpu| !gpu.nvlinks.is_empty())
            .map(|gpu| {
                let active = gpu.nvlinks.iter().filter(|link| link.active).count();
                (
                    gpu.info.uuid.clone(),
                    u32::try_from(active).unwrap_or(u32::MAX),
                )
            })
            .collect();

        let connected = |a: &GpuInventory, b: &GpuInventory| {
            let p2p = |from: &GpuInventory, to: &GpuInventory| {
                from.nvlink_peers
                    .as_ref()
                    .is_some_and(|peers| peers.contains(&to.info.uuid))
            };
            nvlinks_connect(
                (&a.info.pci.bus_id, &a.nvlinks),
                (&b.info.pci.bus_id, &b.nvlinks),
                &bus_ids,
            ) || p2p(a, b)
                || p2p(b, a)
        };
        let mut edges: BTreeSet<(usize, usize)> = BTreeSet::new();
        for (i, a) in gpus.iter().enumerate() {
            for (j, b) in gpus.iter().enumerate().skip(i + 1) {
                if connected(a, b) {
                    edges.insert((i, j));
                }
            }
        }

        let mut groups = BTreeMap::new();
        let mut partial = Vec::new();
        let mut seen = vec![false; gpus.len()];
        for start in 0..gpus.len() {
            if seen[start] {
                continue;
            }
            // The component of `start`, breadth first.
            let mut component = vec![start];
            seen[start] = true;
            let mut next = 0;
            while let Some(&gpu) = component.get(next) {
                next += 1;
                for (other, seen) in seen.iter_mut().enumerate() {
                    if !*seen && edges.contains(&(gpu.min(other), gpu.max(other))) {
                        *seen = true;
                        component.push(other);
                    }
                }
            }
            if component.len() < 2 {
                continue;
            }
            let complete = component.iter().enumerate().all(|(n, &a)| {
                component[n + 1..]
                    .iter()
                    .all(|&b| edges.contains(&(a.min(b), a.max(b))))
            });
            let uuids = component.iter().map(|&gpu| gpus[gpu].info.uuid.clone());
            if !complete {
                partial.push(uuids.collect());
                continue;
            }
            let Some(&name_giver) = component
                .iter()
                .min_by_key(|&&gpu| gpus[gpu].info.pci.bus_id.as_str())
            else {
                continue;
            };
            let value = gpus[name_giver].info.uuid.clone();
            groups.extend(uuids.map(|uuid| (uuid, value.clone())));
        }
        Self {
            groups,
            active_links,
            partial,
        }
    }

    /// The `nvlinkGroup` value of a GPU, if it is in a group.
    pub fn group(&self, gpu_uuid: &str) -> Option<&str> {
        self.groups.get(gpu_uuid).map(String::as_str)
    }

    /// The `nvlinkActiveLinks` value of a GPU: `None` when it has no NVLink.
    pub fn active_links(&self, gpu_uuid: &str) -> Option<u32> {
        self.active_links.get(gpu_uuid).copied()
    }

    /// The components whose GPUs are connected but not each pair directly: no group is
    /// published for them (GPU UUIDs, in NVML order).
    pub fn not_fully_connected(&self) -> &[Vec<String>] {
        &self.partial
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::mock::MockBackend;
    use crate::backend::{GpuBackend, NvLink};

    fn inventory(profile: &str) -> Inventory {
        let backend = MockBackend::from_profile(profile).expect("shipped profile");
        backend.inventory().expect("inventory")
    }

    /// Links on `inventory`'s GPUs: `links[i]` are GPU i's link far ends (`None`: down).
    fn with_links(mut inventory: Inventory, links: &[&[Option<&str>]]) -> Inventory {
        for (gpu, ends) in inventory.gpus.iter_mut().zip(links) {
            gpu.nvlinks = ends
                .iter()
                .zip(0..)
                .map(|(end, link)| match end {
                    Some(end) => NvLink::active(link, Some(end)).expect("bus ID"),
                    None => NvLink::inactive(link),
                })
                .collect();
            gpu.nvlink_peers = None;
        }
        inventory
    }

    fn groups(topology: &NvLinkTopology, inventory: &Inventory) -> Vec<Option<String>> {
        inventory
            .gpus
            .iter()
            .map(|gpu| topology.group(&gpu.info.uuid).map(str::to_owned))
            .collect()
    }

    #[test]
    fn a_gpu_without_links_has_neither_attribute() {
        let inventory = inventory("workstation");
        let topology = NvLinkTopology::of(&inventory);
        let uuid = &inventory.gpus[0].info.uuid;
        assert_eq!(topology.group(uuid), None);
        assert_eq!(topology.active_links(uuid), None);
    }

    #[test]
    fn bridged_pairs_are_two_groups_named_after_their_first_gpu() {
        // Four GPUs (the dgx-h100 profile's bus IDs stand in): 0-1 and 2-3 bridged.
        let base = inventory("dgx-h100");
        let bus = |gpu: usize| base.gpus[gpu].info.pci.bus_id.clone();
        let (b0, b1, b2, b3) = (bus(0), bus(1), bus(2), bus(3));
        let mut inventory = with_links(
            base.clone(),
            &[
                &[Some(&b1), Some(&b1)],
                &[Some(&b0), Some(&b0)],
                &[Some(&b3), None],
                &[Some(&b2), None],
            ],
        );
        inventory.gpus.truncate(4);
        let topology = NvLinkTopology::of(&inventory);
        let uuid = |gpu: usize| Some(inventory.gpus[gpu].info.uuid.clone());
        assert_eq!(
            groups(&topology, &inventory),
            [uuid(0), uuid(0), uuid(2), uuid(2)]
        );
        assert_eq!(topology.active_links(&inventory.gpus[2].info.uuid), Some(1));
        assert!(topology.not_fully_connected().is_empty());
    }

    #[test]
    fn a_chain_is_not_a_group() {
        // 0-1 and 1-2 linked, 0-2 not: every pair must be connected.
        let base = inventory("dgx-h100");
        let bus = |gpu: usize| base.gpus[gpu].info.pci.bus_id.clone();
        let (b0, b1, b2) = (bus(0), bus(1), bus(2));
        let mut inventory = with_links(
            base.clone(),
            &[&[Some(&b1)], &[Some(&b0), Some(&b2)], &[Some(&b1)]],
        );
        inventory.gpus.truncate(3);
        let topology = NvLinkTopology::of(&inventory);
        assert_eq!(groups(&topology, &inventory), [None, None, None]);
        assert_eq!(topology.not_fully_connected().len(), 1);
        assert_eq!(topology.not_fully_connected()[0].len(), 3);
    }

    #[test]
    fn peer_to_peer_connects_gpus_whose_switches_nvml_cannot_see() {
        // Links up, far ends unknown (a VM): only NVML's peer-to-peer answer connects them.
        let mut inventory = inventory("dgx-h100");
        inventory.gpus.truncate(2);
        let uuids: Vec<String> = inventory.gpus.iter().map(|g| g.info.uuid.clone()).collect();
        for gpu in &mut inventory.gpus {
            gpu.nvlinks = vec![NvLink::active(0, None).expect("no bus ID")];
            gpu.nvlink_peers = None;
        }
        assert_eq!(
            groups(&NvLinkTopology::of(&inventory), &inventory),
            [None, None]
        );
        inventory.gpus[0].nvlink_peers = Some(vec![uuids[1].clone()]);
        let topology = NvLinkTopology::of(&inventory);
        assert_eq!(
            groups(&topology, &inventory),
            [Some(uuids[0].clone()), Some(uuids[0].clone())]
        );
    }

    #[test]
    fn a_peer_to_peer_refusal_does_not_split_linked_gpus() {
        // MIG mode: NVML refuses peer-to-peer, the links still connect the GPUs.
        let mut inventory = inventory("dgx-a100");
        for gpu in &mut inventory.gpus {
            gpu.nvlink_peers = Some(Vec::new());
        }
        let topology = NvLinkTopology::of(&inventory);
        let first = inventory.gpus[0].info.uuid.clone();
        assert!(
            groups(&topology, &inventory)
                .iter()
                .all(|group| group.as_deref() == Some(first.as_str()))
        );
    }
}
