//! The standard `resource.kubernetes.io/` device attributes, typed: [`PciBusId`],
//! [`PcieRoot`], [`NumaNode`], and [`PciAttributes`] reading all three from sysfs.
//!
//! Devices that publish these names can be matched across drivers (`matchAttribute` on
//! `resource.kubernetes.io/pcieRoot` puts a GPU and a NIC under one PCIe root complex).
//!
//! | Name | Kind | Standard since |
//! |---|---|---|
//! | `resource.kubernetes.io/pcieRoot` | string `pci<domain>:<bus>` | Go helper v0.34 |
//! | `resource.kubernetes.io/pciBusID` | string, extended BDF `<domain>:<bus>:<device>.<function>` | Go helper v0.36 |
//! | `resource.kubernetes.io/numaNode` | int, or a list of ints with `DRAListTypeAttributes` (the device's node first, then same-socket nodes at the smallest distance) | Kubernetes 1.37 (KEP-6072, stable), Go helper `deviceattribute` |
//!
//! `numaNode` became standard in Kubernetes 1.37 (KEP-6072 went straight to stable: a name and
//! a convention, no API change and no feature gate; the Go helper's `deviceattribute` package
//! gained its constant and sysfs readers in both forms, kubernetes/kubernetes#139929). The API
//! server validates it like any attribute; the scalar form works on every release, the list
//! form needs `DRAListTypeAttributes` (alpha in 1.36). The Go helper refuses negative IDs and
//! IDs of 1024 and more, as [`NumaNode::new`] does.
//!
//! ```
//! use dra_sdk::attributes::{NumaNode, PciBusId};
//! use dra_sdk::slices::{AttributeValue, Device};
//!
//! let bus_id: PciBusId = "0000:3B:00.0".parse()?;
//! let device = Device::new("gpu-0")
//!     .attribute(PciBusId::ATTRIBUTE, bus_id)
//!     .attribute(NumaNode::ATTRIBUTE, NumaNode::new(1)?);
//! assert_eq!(
//!     device.attributes[PciBusId::ATTRIBUTE],
//!     AttributeValue::String("0000:3b:00.0".into()),
//! );
//! # Ok::<(), dra_sdk::attributes::StandardAttributeError>(())
//! ```

use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;

use super::{AttributeListItem, ToAttributeValue};
use crate::slices::{AttributeValue, Device, DeviceAttributes};

/// `resource.kubernetes.io/pciBusID`: the device's PCI address.
pub(crate) const PCI_BUS_ID_ATTRIBUTE: &str = "resource.kubernetes.io/pciBusID";
/// `resource.kubernetes.io/pcieRoot`: the PCIe root complex the device sits under.
pub(crate) const PCIE_ROOT_ATTRIBUTE: &str = "resource.kubernetes.io/pcieRoot";
/// `resource.kubernetes.io/numaNode`: the NUMA node the device is attached to.
pub(crate) const NUMA_NODE_ATTRIBUTE: &str = "resource.kubernetes.io/numaNode";

/// Linux's upper bound on NUMA node IDs; the Go helper refuses larger ones too.
const MAX_NUMA_NODES: u16 = 1024;

/// Why a value is not a valid standard attribute, or sysfs could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StandardAttributeError {
    /// Not an extended BDF PCI address.
    #[error(
        "{value:?} is not a PCI bus ID (`<domain>:<bus>:<device>.<function>`, e.g. 0000:3b:00.0): {reason}"
    )]
    InvalidPciBusId {
        /// The rejected text.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Not a PCIe root complex name.
    #[error("{value:?} is not a PCIe root (`pci<domain>:<bus>`, e.g. pci0000:00): {reason}")]
    InvalidPcieRoot {
        /// The rejected text.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Negative (no NUMA affinity: publish no attribute) or beyond the kernel's limit.
    #[error("NUMA node {value} is not valid: {reason}")]
    InvalidNumaNode {
        /// The rejected value.
        value: i64,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A sysfs file or link could not be read.
    #[error("reading {path}: {source}")]
    Sysfs {
        /// The file or link.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A sysfs file or link did not look as the kernel writes it.
    #[error("unexpected content in {path}: {detail}")]
    UnexpectedSysfs {
        /// The file or link.
        path: PathBuf,
        /// What was found.
        detail: String,
    },
}

/// A PCI address in extended BDF form, `<domain>:<bus>:<device>.<function>`, as Linux names
/// devices under `/sys/bus/pci/devices`: the value of `resource.kubernetes.io/pciBusID`.
///
/// Parsing accepts upper-case hex and prints lower case, as the kernel does. The domain has 4
/// to 8 hex digits (Linux prints more than 4 for VMD domains; the Go helper accepts exactly 4),
/// the device is at most `1f` and the function at most `7`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciBusId {
    /// PCI domain (segment).
    pub domain: u32,
    /// Bus number.
    pub bus: u8,
    /// Device number, `0..=0x1f`.
    pub device: u8,
    /// Function number, `0..=7`.
    pub function: u8,
}

impl PciBusId {
    /// The standard attribute name, `resource.kubernetes.io/pciBusID`.
    pub const ATTRIBUTE: &str = PCI_BUS_ID_ATTRIBUTE;

    /// A bus ID from its parts; `None` when the device or function is out of range.
    pub fn new(domain: u32, bus: u8, device: u8, function: u8) -> Option<Self> {
        (device <= 0x1f && function <= 7).then_some(Self {
            domain,
            bus,
            device,
            function,
        })
    }

    /// Parses `dddd:bb:dd.f`.
    pub fn parse(text: &str) -> Result<Self, StandardAttributeError> {
        let invalid = |reason| StandardAttributeError::InvalidPciBusId {
            value: text.to_owned(),
            reason,
        };
        let (domain, rest) = text
            .split_once(':')
            .ok_or_else(|| invalid("expected two colons"))?;
        let (bus, rest) = rest
            .split_once(':')
            .ok_or_else(|| invalid("expected two colons"))?;
        let (device, function) = rest
            .split_once('.')
            .ok_or_else(|| invalid("expected a dot before the function"))?;
        let domain =
            hex(domain, 4..=8).ok_or_else(|| invalid("the domain is 4 to 8 hex digits"))?;
        let bus = hex(bus, 2..=2).ok_or_else(|| invalid("the bus is 2 hex digits"))?;
        let device = hex(device, 2..=2).ok_or_else(|| invalid("the device is 2 hex digits"))?;
        let function = hex(function, 1..=1).ok_or_else(|| invalid("the function is 1 digit"))?;
        let (Ok(bus), Ok(device), Ok(function)) = (
            u8::try_from(bus),
            u8::try_from(device),
            u8::try_from(function),
        ) else {
            return Err(invalid("a part is out of range"));
        };
        Self::new(domain, bus, device, function)
            .ok_or_else(|| invalid("the device is at most 1f and the function at most 7"))
    }

    /// Reads the PCIe root complex of this device from sysfs (`sysfs` is usually `/sys`):
    /// `bus/pci/devices/<id>` links to `devices/pci<domain>:<bus>/…/<id>`, whose first
    /// component is the root. Same method as the Go helper's `GetPCIeRootAttributeByPCIBusID`.
    pub fn pcie_root_from_sysfs(&self, sysfs: &Path) -> Result<PcieRoot, StandardAttributeError> {
        let link = sysfs.join("bus/pci/devices").join(self.to_string());
        let target = std::fs::read_link(&link).map_err(|source| StandardAttributeError::Sysfs {
            path: link.clone(),
            source,
        })?;
        let base = link.parent().unwrap_or(sysfs);
        let resolved = normalize(&base.join(target));
        let unexpected = |detail: String| StandardAttributeError::UnexpectedSysfs {
            path: link.clone(),
            detail,
        };
        let relative = resolved
            .strip_prefix(normalize(&sysfs.join("devices")))
            .map_err(|_| unexpected(format!("links to {} outside devices/", resolved.display())))?;
        if resolved.file_name() != Some(self.to_string().as_ref()) {
            return Err(unexpected(format!(
                "links to {}, not to the device",
                resolved.display()
            )));
        }
        let root = relative
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .unwrap_or_default();
        PcieRoot::parse(root).map_err(|error| unexpected(error.to_string()))
    }

    /// Reads the device's NUMA node from sysfs (`bus/pci/devices/<id>/numa_node`).
    /// `Ok(None)` when the kernel reports no affinity (`-1`): publish no attribute then, since
    /// `-1` would match every other device without affinity under `matchAttribute`.
    pub fn numa_node_from_sysfs(
        &self,
        sysfs: &Path,
    ) -> Result<Option<NumaNode>, StandardAttributeError> {
        let path = sysfs
            .join("bus/pci/devices")
            .join(self.to_string())
            .join("numa_node");
        let text =
            std::fs::read_to_string(&path).map_err(|source| StandardAttributeError::Sysfs {
                path: path.clone(),
                source,
            })?;
        let value: i64 =
            text.trim()
                .parse()
                .map_err(|_| StandardAttributeError::UnexpectedSysfs {
                    path: path.clone(),
                    detail: format!("{:?} is not an integer", text.trim()),
                })?;
        if value < 0 {
            return Ok(None);
        }
        NumaNode::new(value).map(Some)
    }
}

impl fmt::Display for PciBusId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl FromStr for PciBusId {
    type Err = StandardAttributeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

/// A PCIe root complex, `pci<domain>:<bus>` (`pci0000:00`): the value of
/// `resource.kubernetes.io/pcieRoot`. Devices under the same root share it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PcieRoot {
    /// PCI domain (segment).
    pub domain: u32,
    /// Root bus number.
    pub bus: u8,
}

impl PcieRoot {
    /// The standard attribute name, `resource.kubernetes.io/pcieRoot`.
    pub const ATTRIBUTE: &str = PCIE_ROOT_ATTRIBUTE;

    /// The root complex of `domain` and root `bus`.
    pub fn new(domain: u32, bus: u8) -> Self {
        Self { domain, bus }
    }

    /// Parses `pci<domain>:<bus>`, with 4 to 8 hex digits of domain and 2 of bus.
    pub fn parse(text: &str) -> Result<Self, StandardAttributeError> {
        let invalid = |reason| StandardAttributeError::InvalidPcieRoot {
            value: text.to_owned(),
            reason,
        };
        let rest = text
            .strip_prefix("pci")
            .ok_or_else(|| invalid("expected the prefix `pci`"))?;
        let (domain, bus) = rest
            .split_once(':')
            .ok_or_else(|| invalid("expected a colon"))?;
        let domain =
            hex(domain, 4..=8).ok_or_else(|| invalid("the domain is 4 to 8 hex digits"))?;
        let bus = hex(bus, 2..=2)
            .and_then(|bus| u8::try_from(bus).ok())
            .ok_or_else(|| invalid("the bus is 2 hex digits"))?;
        Ok(Self { domain, bus })
    }
}

impl fmt::Display for PcieRoot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pci{:04x}:{:02x}", self.domain, self.bus)
    }
}

impl FromStr for PcieRoot {
    type Err = StandardAttributeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

/// A NUMA node ID, `0..1024`: the value of `resource.kubernetes.io/numaNode`.
///
/// Published as an `int` (the scalar form of the Kubernetes 1.37 standard attribute). In a list
/// (`Vec<NumaNode>`, or [`PciAttributes`] with [`NumaNodeForm::List`]) it becomes `ints`, the
/// list form of KEP-6072 for servers with `DRAListTypeAttributes`: the device's own node first,
/// then nodes of the same socket at the smallest distance. `matchAttribute` on
/// `resource.kubernetes.io/numaNode` then matches an int with a list that contains it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NumaNode(u16);

impl NumaNode {
    /// The standard attribute name, `resource.kubernetes.io/numaNode`.
    pub const ATTRIBUTE: &str = NUMA_NODE_ATTRIBUTE;

    /// Refuses negative IDs (no affinity: omit the attribute) and IDs of 1024 and more.
    pub fn new(id: i64) -> Result<Self, StandardAttributeError> {
        let invalid = |reason| StandardAttributeError::InvalidNumaNode { value: id, reason };
        if id < 0 {
            return Err(invalid(
                "negative means no NUMA affinity; publish no numaNode attribute",
            ));
        }
        u16::try_from(id)
            .ok()
            .filter(|id| *id < MAX_NUMA_NODES)
            .map(Self)
            .ok_or_else(|| invalid("Linux supports at most 1024 NUMA nodes"))
    }

    /// The node ID.
    pub fn id(self) -> u16 {
        self.0
    }
}

impl fmt::Display for NumaNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl ToAttributeValue for PciBusId {
    fn to_attribute_value(&self) -> Option<AttributeValue> {
        Some(AttributeValue::String(self.to_string()))
    }
}

impl AttributeListItem for PciBusId {
    fn list_value<'a>(items: impl Iterator<Item = &'a Self>) -> AttributeValue {
        AttributeValue::Strings(items.map(ToString::to_string).collect())
    }
}

impl ToAttributeValue for PcieRoot {
    fn to_attribute_value(&self) -> Option<AttributeValue> {
        Some(AttributeValue::String(self.to_string()))
    }
}

impl AttributeListItem for PcieRoot {
    fn list_value<'a>(items: impl Iterator<Item = &'a Self>) -> AttributeValue {
        AttributeValue::Strings(items.map(ToString::to_string).collect())
    }
}

impl ToAttributeValue for NumaNode {
    fn to_attribute_value(&self) -> Option<AttributeValue> {
        Some(AttributeValue::Int(i64::from(self.0)))
    }
}

impl AttributeListItem for NumaNode {
    fn list_value<'a>(items: impl Iterator<Item = &'a Self>) -> AttributeValue {
        AttributeValue::Ints(items.map(|node| i64::from(node.0)).collect())
    }
}

impl From<PciBusId> for AttributeValue {
    fn from(value: PciBusId) -> Self {
        AttributeValue::String(value.to_string())
    }
}

impl From<PcieRoot> for AttributeValue {
    fn from(value: PcieRoot) -> Self {
        AttributeValue::String(value.to_string())
    }
}

impl From<NumaNode> for AttributeValue {
    fn from(value: NumaNode) -> Self {
        AttributeValue::Int(i64::from(value.0))
    }
}

/// How [`PciAttributes`] publishes `numaNode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NumaNodeForm {
    /// An `int`: works with every release.
    #[default]
    Scalar,
    /// A one-element `ints` list. Needs `DRAListTypeAttributes` (alpha in 1.36) on the API
    /// server, which otherwise rejects the slice (the publisher reports it). Whatever the
    /// operator enabled must be configured here: a driver cannot see the server's gates.
    /// Same-distance neighbour nodes are not added.
    List,
}

/// The three standard attributes of a PCI device, for `#[dra(flatten)]` or
/// [`Device::with_attributes`].
///
/// ```
/// use dra_sdk::attributes::{NumaNode, PciAttributes, PciBusId};
/// use dra_sdk::slices::Device;
///
/// let pci = PciAttributes::new("0000:3b:00.0".parse()?).numa_node(Some(NumaNode::new(0)?));
/// let device = Device::new("gpu-0").with_attributes(&pci);
/// assert_eq!(device.attributes.len(), 2); // pciBusID and numaNode; the root is unknown
/// # Ok::<(), dra_sdk::attributes::StandardAttributeError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciAttributes {
    /// `resource.kubernetes.io/pciBusID`.
    pub pci_bus_id: PciBusId,
    /// `resource.kubernetes.io/pcieRoot`, when known.
    pub pcie_root: Option<PcieRoot>,
    /// `resource.kubernetes.io/numaNode`, when the device has an affinity.
    pub numa_node: Option<NumaNode>,
    /// How `numaNode` is published.
    pub numa_node_form: NumaNodeForm,
}

impl PciAttributes {
    /// Only the bus ID; add the rest with the setters or use [`from_sysfs`](Self::from_sysfs).
    pub fn new(pci_bus_id: PciBusId) -> Self {
        Self {
            pci_bus_id,
            pcie_root: None,
            numa_node: None,
            numa_node_form: NumaNodeForm::Scalar,
        }
    }

    /// Reads the PCIe root and the NUMA node of `pci_bus_id` from sysfs (usually `/sys`).
    pub fn from_sysfs(sysfs: &Path, pci_bus_id: PciBusId) -> Result<Self, StandardAttributeError> {
        Ok(Self {
            pci_bus_id,
            pcie_root: Some(pci_bus_id.pcie_root_from_sysfs(sysfs)?),
            numa_node: pci_bus_id.numa_node_from_sysfs(sysfs)?,
            numa_node_form: NumaNodeForm::Scalar,
        })
    }

    /// Sets the PCIe root.
    pub fn pcie_root(mut self, root: Option<PcieRoot>) -> Self {
        self.pcie_root = root;
        self
    }

    /// Sets the NUMA node.
    pub fn numa_node(mut self, node: Option<NumaNode>) -> Self {
        self.numa_node = node;
        self
    }

    /// Sets how `numaNode` is published.
    pub fn numa_node_form(mut self, form: NumaNodeForm) -> Self {
        self.numa_node_form = form;
        self
    }
}

impl DeviceAttributes for PciAttributes {
    fn apply_to(&self, device: &mut Device) {
        let mut set = |name: &str, value: Option<AttributeValue>| {
            if let Some(value) = value {
                device.attributes.insert(name.to_owned(), value);
            }
        };
        set(PCI_BUS_ID_ATTRIBUTE, self.pci_bus_id.to_attribute_value());
        set(PCIE_ROOT_ATTRIBUTE, self.pcie_root.to_attribute_value());
        set(
            NUMA_NODE_ATTRIBUTE,
            match self.numa_node_form {
                NumaNodeForm::Scalar => self.numa_node.to_attribute_value(),
                NumaNodeForm::List => self.numa_node.map(|node| [node]).to_attribute_value(),
            },
        );
    }
}

/// Parses `digits` hex digits (either case) into a number.
fn hex(text: &str, digits: std::ops::RangeInclusive<usize>) -> Option<u32> {
    (digits.contains(&text.len()) && text.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u32::from_str_radix(text, 16).ok())
        .flatten()
}

/// Resolves `.` and `..` lexically: sysfs links are relative and contain no further links
/// that matter for the first component below `devices/`.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_bus_ids_parse_and_print_like_the_kernel() {
        for (text, printed) in [
            ("0000:3b:00.0", "0000:3b:00.0"),
            ("0000:3B:1F.7", "0000:3b:1f.7"),
            ("0123:45:1e.7", "0123:45:1e.7"),
            ("10000:e1:00.1", "10000:e1:00.1"),
        ] {
            let id = PciBusId::parse(text).unwrap();
            assert_eq!(id.to_string(), printed);
            assert_eq!(printed.parse::<PciBusId>().unwrap(), id);
        }
        for text in [
            "",
            "3b:00.0",
            "000:3b:00.0",
            "0000:3b:00",
            "0000:3b:20.0",
            "0000:3b:00.8",
            "0000:3b:00.00",
            "0000:3bb:00.0",
            "0000:3b:00.g",
            "0000:3b:0.0",
            "123456789:00:00.0",
            " 0000:3b:00.0",
        ] {
            assert!(PciBusId::parse(text).is_err(), "{text:?} accepted");
        }
        let error = PciBusId::parse("0000:3b:20.0").unwrap_err();
        assert!(error.to_string().contains("at most 1f"), "{error}");
    }

    #[test]
    fn pcie_roots_parse_and_print() {
        assert_eq!(
            PcieRoot::parse("pci0000:64").unwrap(),
            PcieRoot::new(0, 0x64)
        );
        assert_eq!(PcieRoot::new(1, 0).to_string(), "pci0001:00");
        assert_eq!(PcieRoot::parse("PCI0000:00").ok(), None);
        for text in ["0000:00", "pci0000", "pci00:00", "pci0000:0", "pci0000:000"] {
            assert!(PcieRoot::parse(text).is_err(), "{text:?} accepted");
        }
    }

    #[test]
    fn numa_nodes_refuse_no_affinity_and_huge_ids() {
        assert_eq!(NumaNode::new(0).unwrap().id(), 0);
        assert_eq!(NumaNode::new(1023).unwrap().to_string(), "1023");
        assert!(NumaNode::new(-1).is_err());
        assert!(NumaNode::new(1024).is_err());
        assert!(NumaNode::new(i64::MAX).is_err());
    }

    #[test]
    fn attribute_values() {
        let id = PciBusId::new(0, 0x3b, 0, 0).unwrap();
        assert_eq!(
            id.to_attribute_value(),
            Some(AttributeValue::String("0000:3b:00.0".into()))
        );
        assert_eq!(
            vec![NumaNode::new(0).unwrap(), NumaNode::new(2).unwrap()].to_attribute_value(),
            Some(AttributeValue::Ints(vec![0, 2]))
        );
        assert_eq!(
            [PcieRoot::new(0, 0)].to_attribute_value(),
            Some(AttributeValue::Strings(vec!["pci0000:00".into()]))
        );
    }

    #[test]
    fn pci_attributes_apply_in_both_numa_forms() {
        let base = PciAttributes::new(PciBusId::new(0, 1, 0, 0).unwrap())
            .pcie_root(Some(PcieRoot::new(0, 0)))
            .numa_node(Some(NumaNode::new(1).unwrap()));
        let device = Device::new("d").with_attributes(&base);
        assert_eq!(
            device.attributes[NUMA_NODE_ATTRIBUTE],
            AttributeValue::Int(1)
        );
        assert_eq!(
            device.attributes[PCIE_ROOT_ATTRIBUTE],
            AttributeValue::String("pci0000:00".into())
        );
        let device = Device::new("d").with_attributes(&base.numa_node_form(NumaNodeForm::List));
        assert_eq!(
            device.attributes[NUMA_NODE_ATTRIBUTE],
            AttributeValue::Ints(vec![1])
        );
    }

    /// A sysfs tree laid out as the kernel does: a relative link from `bus/pci/devices`.
    fn fake_sysfs(numa_node: &str) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let device = root
            .path()
            .join("devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0");
        std::fs::create_dir_all(&device).unwrap();
        std::fs::write(device.join("numa_node"), numa_node).unwrap();
        let bus = root.path().join("bus/pci/devices");
        std::fs::create_dir_all(&bus).unwrap();
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0",
            bus.join("0000:3b:00.0"),
        )
        .unwrap();
        root
    }

    #[test]
    fn reads_root_and_numa_node_from_sysfs() {
        let sysfs = fake_sysfs("1\n");
        let id: PciBusId = "0000:3b:00.0".parse().unwrap();
        let attributes = PciAttributes::from_sysfs(sysfs.path(), id).unwrap();
        assert_eq!(attributes.pcie_root, Some(PcieRoot::new(0, 0x3a)));
        assert_eq!(attributes.numa_node, Some(NumaNode::new(1).unwrap()));

        let sysfs = fake_sysfs("-1\n");
        assert_eq!(id.numa_node_from_sysfs(sysfs.path()).unwrap(), None);
        let sysfs = fake_sysfs("x\n");
        assert!(matches!(
            id.numa_node_from_sysfs(sysfs.path()),
            Err(StandardAttributeError::UnexpectedSysfs { .. })
        ));
    }

    #[test]
    fn sysfs_errors_name_the_path() {
        let sysfs = tempfile::tempdir().unwrap();
        let id: PciBusId = "0000:01:00.0".parse().unwrap();
        let error = id.pcie_root_from_sysfs(sysfs.path()).unwrap_err();
        assert!(
            error.to_string().contains("bus/pci/devices/0000:01:00.0"),
            "{error}"
        );
        // A link that leaves devices/ is refused, not guessed at.
        let bus = sysfs.path().join("bus/pci/devices");
        std::fs::create_dir_all(&bus).unwrap();
        std::os::unix::fs::symlink("/elsewhere/0000:01:00.0", bus.join("0000:01:00.0")).unwrap();
        assert!(matches!(
            id.pcie_root_from_sysfs(sysfs.path()),
            Err(StandardAttributeError::UnexpectedSysfs { .. })
        ));
    }
}
