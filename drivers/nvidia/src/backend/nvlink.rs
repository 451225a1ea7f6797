//! NVLinks as NVML reports them, and the one rule that reads a connection from them.

use serde::{Deserialize, Serialize};

use super::{BackendError, normalize_pci_bus_id};

/// A PCI address no NVLink ends at.
const NO_BUS_ID: &str = "0000:00:00.0";

/// One NVLink of a GPU, as NVML reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct NvLink {
    /// The link number (0 to 17: `NVML_NVLINK_MAX_LINKS` is 18).
    pub link: u32,
    /// Whether the link is up (`NVML_FEATURE_ENABLED`).
    pub active: bool,
    /// The PCI bus ID of the far end of an active link, in the sysfs form (`0000:c4:00.0`):
    /// a GPU's, or an NVSwitch's. `None` for an inactive link, or when NVML cannot identify
    /// the far end (NVSwitches are invisible in some VMs).
    pub remote_pci_bus_id: Option<String>,
}

impl NvLink {
    /// An active link to `remote_pci_bus_id` (normalized with [`normalize_pci_bus_id`]). An
    /// all-zero bus ID (`0000:00:00.0`, the host bridge, never the end of an NVLink) is taken
    /// as unknown: a driver that cannot see the NVSwitch may fill in nothing, and two GPUs
    /// would otherwise seem to share a switch at that address.
    pub fn active(link: u32, remote_pci_bus_id: Option<&str>) -> Result<Self, BackendError> {
        let remote = remote_pci_bus_id.map(normalize_pci_bus_id).transpose()?;
        Ok(Self {
            link,
            active: true,
            remote_pci_bus_id: remote.filter(|bus_id| bus_id != NO_BUS_ID),
        })
    }

    /// A link that is down.
    pub fn inactive(link: u32) -> Self {
        Self {
            link,
            active: false,
            remote_pci_bus_id: None,
        }
    }
}

/// Whether the links of two GPUs connect them: an active link of one ends at the other (a
/// bridge or a direct mesh), or both have an active link to the same device that is not a GPU
/// of the node (an NVSwitch; `gpu_bus_ids` lists the node's GPUs). What the links alone say;
/// NVML's peer-to-peer status is the other source ([`crate::devices::topology`]).
///
/// ```
/// use dra_driver_nvidia::backend::{NvLink, nvlinks_connect};
///
/// let gpus = ["0000:07:00.0", "0000:0f:00.0"];
/// // Both GPUs have a link up to the same NVSwitch.
/// let a = [NvLink::active(0, Some("0000:c4:00.0"))?, NvLink::inactive(1)];
/// let b = [NvLink::active(0, Some("0000:c4:00.0"))?];
/// assert!(nvlinks_connect((gpus[0], &a), (gpus[1], &b), &gpus));
/// // A link that is down connects nothing.
/// let down = [NvLink::inactive(0)];
/// assert!(!nvlinks_connect((gpus[0], &a), (gpus[1], &down), &gpus));
/// // Nor does a far end given as all zeros: unknown, not a shared switch.
/// let zero = [NvLink::active(0, Some("00000000:00:00.0"))?];
/// assert_eq!(zero[0].remote_pci_bus_id, None);
/// assert!(!nvlinks_connect((gpus[0], &zero), (gpus[1], &zero), &gpus));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn nvlinks_connect(
    (a_bus_id, a_links): (&str, &[NvLink]),
    (b_bus_id, b_links): (&str, &[NvLink]),
    gpu_bus_ids: &[&str],
) -> bool {
    let remotes = |links: &'_ [NvLink]| -> Vec<String> {
        links
            .iter()
            .filter(|link| link.active)
            .filter_map(|link| link.remote_pci_bus_id.clone())
            .collect()
    };
    let (a_remotes, b_remotes) = (remotes(a_links), remotes(b_links));
    let direct = a_remotes.iter().any(|remote| remote == b_bus_id)
        || b_remotes.iter().any(|remote| remote == a_bus_id);
    let through_switch = a_remotes
        .iter()
        .any(|remote| !gpu_bus_ids.contains(&remote.as_str()) && b_remotes.contains(remote));
    direct || through_switch
}
