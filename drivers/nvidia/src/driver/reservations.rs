//! The in-memory reservations: which claim holds each device (and each PCI function of a
//! full GPU or VFIO device), the consumable shares of a device and the claims holding them,
//! and the state of every claim this process prepared or reconciled. Prepare reserves before
//! any side effect ([`Reservations::reserve`], [`Reservations::reserve_shares`]), so that two
//! claims never get one device; unprepare and a failed prepare release
//! ([`Reservations::release`], [`Reservations::forget`]); reconcile rebuilds them from the
//! checkpoint's completed claims ([`Reservations::restore`]).

use std::collections::BTreeMap;

use dra_sdk::claim::{ClaimRef, DriverError};

use super::{ClaimState, PreparedKind};
use crate::sharing::SharedAllocation;

/// Prefix of the reservation key of a whole PCI function, shared by a GPU and its VFIO twin.
pub(super) const PCI_KEY_PREFIX: &str = "pci/";

#[derive(Clone, Debug)]
pub(super) struct Owner {
    pub(super) uid: String,
    pub(super) namespace: String,
    pub(super) name: String,
}

/// Device name (and PCI function of full GPUs and VFIO devices) → the claim holding it.
#[derive(Debug, Default)]
pub(super) struct Reservations {
    pub(super) by_key: BTreeMap<String, Owner>,
    /// Devices prepared as consumable shares: the config and the claims holding them.
    pub(super) shared: BTreeMap<String, SharedHolders>,
    /// The state of each claim this process prepared (or found in the checkpoint), by UID.
    /// Unprepare falls back to it when the checkpoint has none: the SDK drops the driver
    /// state when writing the CDI spec or the checkpoint fails after a successful prepare.
    pub(super) states: BTreeMap<String, ClaimState>,
}

/// The claims sharing one device, and the config they all have.
#[derive(Debug)]
pub(super) struct SharedHolders {
    config: serde_json::Value,
    pub(super) owners: BTreeMap<String, Owner>,
}

pub(super) fn pci_key(bus_id: &str) -> String {
    format!("{PCI_KEY_PREFIX}{bus_id}")
}

fn reservation_keys(device: &str, kind: &PreparedKind) -> Vec<String> {
    let mut keys = vec![device.to_owned()];
    if let Some(bus_id) = kind.pci_bus_id() {
        keys.push(pci_key(bus_id));
    }
    keys
}

impl Reservations {
    pub(super) fn restore(&mut self, uid: &str, namespace: &str, name: &str, state: &ClaimState) {
        self.states.insert(uid.to_owned(), state.clone());
        for share in &state.shares {
            let holders =
                self.shared
                    .entry(share.device.clone())
                    .or_insert_with(|| SharedHolders {
                        config: share.config.clone(),
                        owners: BTreeMap::new(),
                    });
            holders.owners.insert(
                uid.to_owned(),
                Owner {
                    uid: uid.to_owned(),
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                },
            );
        }
        let shared = |device: &str| state.shares.iter().any(|share| share.device == device);
        for device in state
            .devices
            .iter()
            .filter(|d| !d.admin_access && !shared(&d.device))
        {
            for key in reservation_keys(&device.device, &device.kind) {
                self.by_key.insert(
                    key,
                    Owner {
                        uid: uid.to_owned(),
                        namespace: namespace.to_owned(),
                        name: name.to_owned(),
                    },
                );
            }
        }
    }

    /// Reserves all keys of a claim, or none.
    pub(super) fn reserve(
        &mut self,
        claim: &ClaimRef,
        devices: &[(String, bool, PreparedKind)],
    ) -> Result<(), DriverError> {
        for (device, admin, kind) in devices {
            if *admin {
                // Admin access shares the device, with one exception: a VFIO device whose
                // GPU another claim holds as a full GPU, which binding would take away.
                if let (PreparedKind::Vfio(binding), false) =
                    (kind, self.by_key.contains_key(device))
                    && let Some(owner) = self.by_key.get(&pci_key(&binding.bus_id))
                    && owner.uid != claim.uid
                {
                    return Err(DriverError::Device {
                        device: device.clone(),
                        reason: format!(
                            "its GPU {} is prepared as a full GPU for claim {}/{} ({}); admin \
                             access cannot pass it through",
                            binding.bus_id, owner.namespace, owner.name, owner.uid
                        ),
                    });
                }
                continue;
            }
            if let Some(holders) = self.shared.get(device)
                && let Some(owner) = holders.owners.values().find(|o| o.uid != claim.uid)
            {
                return Err(DriverError::Device {
                    device: device.clone(),
                    reason: format!(
                        "it is prepared as a consumable share for claim {}/{} ({}); it cannot \
                         be prepared exclusively",
                        owner.namespace, owner.name, owner.uid
                    ),
                });
            }
            if let Some(conflict) = self.whole_or_split(claim, kind) {
                return Err(DriverError::Device {
                    device: device.clone(),
                    reason: conflict,
                });
            }
            for key in reservation_keys(device, kind) {
                if let Some(owner) = self.by_key.get(&key)
                    && owner.uid != claim.uid
                {
                    let what = if key == *device {
                        "it".to_owned()
                    } else {
                        format!("its PCI function {}", &key[PCI_KEY_PREFIX.len()..])
                    };
                    return Err(DriverError::Device {
                        device: device.clone(),
                        reason: format!(
                            "{what} is already prepared for claim {}/{} ({}); a device is \
                             prepared for one claim at a time unless allocated with admin access",
                            owner.namespace, owner.name, owner.uid
                        ),
                    });
                }
            }
        }
        let owner = Owner {
            uid: claim.uid.clone(),
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
        };
        for (device, admin, kind) in devices {
            if !*admin {
                for key in reservation_keys(device, kind) {
                    self.by_key.insert(key, owner.clone());
                }
            }
        }
        Ok(())
    }

    /// A claim other than `claim` holding `device`, alone or as a consumable share.
    fn other_holder(&self, claim: &ClaimRef, device: &str) -> Option<&Owner> {
        let other = |owner: &&Owner| owner.uid != claim.uid;
        self.by_key.get(device).filter(other).or_else(|| {
            self.shared
                .get(device)
                .and_then(|holders| holders.owners.values().find(other))
        })
    }

    /// Dynamic MIG: a GPU is used whole or split, never both, whether alone or in shares.
    /// Counters keep the scheduler from allocating both; this holds where a scheduler
    /// miscounted them or an API server dropped them.
    fn whole_or_split(&self, claim: &ClaimRef, kind: &PreparedKind) -> Option<String> {
        match kind {
            PreparedKind::MigDynamic(instance) => {
                let whole = format!("gpu-{}", instance.parent_minor);
                let owner = self.other_holder(claim, &whole)?;
                Some(format!(
                    "its GPU {whole} is prepared whole for claim {}/{} ({})",
                    owner.namespace, owner.name, owner.uid
                ))
            }
            PreparedKind::Gpu { minor, .. } => {
                let prefix = format!("gpu-{minor}-mig-");
                let (partition, owner) = self
                    .by_key
                    .keys()
                    .chain(self.shared.keys())
                    .filter(|key| key.starts_with(&prefix))
                    .find_map(|key| Some((key, self.other_holder(claim, key)?)))?;
                Some(format!(
                    "the GPU's MIG partition {partition} is prepared for claim {}/{} ({})",
                    owner.namespace, owner.name, owner.uid
                ))
            }
            _ => None,
        }
    }

    pub(super) fn release(&mut self, uid: &str) {
        self.by_key.retain(|_, owner| owner.uid != uid);
        self.shared.retain(|_, holders| {
            holders.owners.remove(uid);
            !holders.owners.is_empty()
        });
    }

    /// Reserves the consumable shares of a claim, or none: a device shared already must have
    /// been prepared with the same config, and a device held exclusively is refused, as is a
    /// partition of a GPU held whole and the other way round.
    pub(super) fn reserve_shares(
        &mut self,
        claim: &ClaimRef,
        shares: &[(SharedAllocation, PreparedKind)],
    ) -> Result<(), DriverError> {
        for (share, kind) in shares {
            if let Some(conflict) = self.whole_or_split(claim, kind) {
                return Err(DriverError::Device {
                    device: share.device.clone(),
                    reason: conflict,
                });
            }
            if let Some(owner) = self.by_key.get(&share.device)
                && owner.uid != claim.uid
            {
                return Err(DriverError::Device {
                    device: share.device.clone(),
                    reason: format!(
                        "it is prepared for claim {}/{} ({}) without sharing; a share of it \
                         cannot be prepared",
                        owner.namespace, owner.name, owner.uid
                    ),
                });
            }
            if let Some(holders) = self.shared.get(&share.device)
                && let Some(owner) = holders.owners.values().find(|o| o.uid != claim.uid)
                && holders.config != share.config
            {
                return Err(DriverError::InvalidConfig(format!(
                    "conflicting configuration: device {} is shared with claim {}/{} ({}), which \
                     was prepared with {}; claims sharing a device must have identical \
                     configs; this one has {}",
                    share.device,
                    owner.namespace,
                    owner.name,
                    owner.uid,
                    holders.config,
                    share.config
                )));
            }
        }
        let owner = Owner {
            uid: claim.uid.clone(),
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
        };
        for (share, _) in shares {
            self.shared
                .entry(share.device.clone())
                .or_insert_with(|| SharedHolders {
                    config: share.config.clone(),
                    owners: BTreeMap::new(),
                })
                .owners
                .insert(claim.uid.clone(), owner.clone());
        }
        Ok(())
    }

    /// Releases a claim's devices and forgets its state.
    pub(super) fn forget(&mut self, uid: &str) {
        self.release(uid);
        self.states.remove(uid);
    }
}
