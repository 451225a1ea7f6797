//! `#[derive(DeviceAttributes)]`: what the generated code publishes.

use std::borrow::Cow;

use dra_sdk::attributes::{Bytes, ToAttributeValue, Version};
use dra_sdk::slices::{AttributeValue, Device, DeviceAttributes, DeviceCapacity, Quantity};

/// Attributes a GPU and its MIG devices share, as the NVIDIA driver publishes them.
#[derive(Clone, DeviceAttributes)]
struct CommonAttributes {
    product_name: String,
    architecture: &'static str,
    cuda_compute_capability: Version,
    driver_version: Version,
    #[dra(name = "resource.kubernetes.io/pciBusID")]
    pci_bus_id: Option<String>,
    #[dra(name = "resource.kubernetes.io/pcieRoot")]
    pcie_root: Option<String>,
}

#[derive(DeviceAttributes)]
struct Gpu {
    r#type: DeviceType,
    uuid: String,
    #[dra(flatten)]
    common: CommonAttributes,
    addressing_mode: Option<Cow<'static, str>>,
    #[dra(name = "resource.kubernetes.io/numaNode")]
    numa_node: Vec<i64>,
    partitionable: bool,
    #[dra(capacity)]
    memory: Bytes,
    #[dra(capacity)]
    multiprocessors: u32,
    #[dra(capacity)]
    shares: Option<u64>,
    #[dra(capacity, name = "example.com/bandwidth")]
    bandwidth: Quantity,
    #[dra(skip)]
    #[allow(dead_code)]
    minor: u32,
}

/// A driver type published as a string attribute through `ToAttributeValue`.
enum DeviceType {
    Gpu,
}

impl ToAttributeValue for DeviceType {
    fn to_attribute_value(&self) -> Option<AttributeValue> {
        Some(AttributeValue::String(
            match self {
                DeviceType::Gpu => "gpu",
            }
            .to_owned(),
        ))
    }
}

fn common() -> CommonAttributes {
    CommonAttributes {
        product_name: "NVIDIA A100-SXM4-40GB".into(),
        architecture: "Ampere",
        cuda_compute_capability: Version::coerce("8.0").unwrap(),
        driver_version: Version::coerce("535.104.05").unwrap(),
        pci_bus_id: Some("0000:07:00.0".into()),
        pcie_root: None,
    }
}

fn string(value: &str) -> AttributeValue {
    AttributeValue::String(value.to_owned())
}

fn version(value: &str) -> AttributeValue {
    AttributeValue::Version(value.to_owned())
}

#[test]
fn publishes_attributes_and_capacities() {
    let gpu = Gpu {
        r#type: DeviceType::Gpu,
        uuid: "GPU-5b1f".into(),
        common: common(),
        addressing_mode: None,
        numa_node: vec![1],
        partitionable: false,
        memory: Bytes(40 << 30),
        multiprocessors: 108,
        shares: None,
        bandwidth: Quantity("100G".into()),
        minor: 0,
    };
    let device = Device::new("gpu-0").with_attributes(&gpu);

    let attributes: Vec<(&str, &AttributeValue)> = device
        .attributes
        .iter()
        .map(|(name, value)| (name.as_str(), value))
        .collect();
    assert_eq!(
        attributes,
        [
            ("architecture", &string("Ampere")),
            ("cudaComputeCapability", &version("8.0.0")),
            ("driverVersion", &version("535.104.5")),
            ("partitionable", &AttributeValue::Bool(false)),
            ("productName", &string("NVIDIA A100-SXM4-40GB")),
            (
                "resource.kubernetes.io/numaNode",
                &AttributeValue::Ints(vec![1])
            ),
            ("resource.kubernetes.io/pciBusID", &string("0000:07:00.0")),
            ("type", &string("gpu")),
            ("uuid", &string("GPU-5b1f")),
        ]
    );
    let capacity: Vec<(&str, &DeviceCapacity)> = device
        .capacity
        .iter()
        .map(|(name, value)| (name.as_str(), value))
        .collect();
    assert_eq!(
        capacity,
        [
            ("example.com/bandwidth", &DeviceCapacity::new("100G")),
            ("memory", &DeviceCapacity::new("40Gi")),
            ("multiprocessors", &DeviceCapacity::new("108")),
        ]
    );
}

#[test]
fn omitted_values_leave_no_entry() {
    let gpu = Gpu {
        r#type: DeviceType::Gpu,
        uuid: "GPU-1".into(),
        common: CommonAttributes {
            pci_bus_id: None,
            ..common()
        },
        addressing_mode: Some("HMM".into()),
        numa_node: vec![],
        partitionable: true,
        memory: Bytes(0),
        multiprocessors: 0,
        shares: Some(4),
        bandwidth: Quantity("1G".into()),
        minor: 1,
    };
    let device = Device::new("gpu-1").with_attributes(&gpu);
    assert!(
        !device
            .attributes
            .contains_key("resource.kubernetes.io/numaNode")
    );
    assert!(
        !device
            .attributes
            .contains_key("resource.kubernetes.io/pciBusID")
    );
    assert_eq!(device.attributes["addressingMode"], string("HMM"));
    assert_eq!(device.capacity["shares"], DeviceCapacity::new("4"));
    assert!(!device.capacity.contains_key("minor"));
}

/// Lists of every kind, lifetimes and type parameters.
#[derive(DeviceAttributes)]
struct Lists<'a, T> {
    ints: [u16; 2],
    bools: Vec<bool>,
    strings: &'a [&'a str],
    versions: Vec<Version>,
    generic: T,
    #[dra(capacity)]
    generic_capacity: Option<u8>,
}

#[test]
fn lists_lifetimes_and_generics() {
    let names = ["a", "b"];
    let lists = Lists {
        ints: [1, 2],
        bools: vec![true],
        strings: &names,
        versions: vec![Version::new(1, 2, 3), Version::parse("2.0.0-rc.1").unwrap()],
        generic: Some(7i32),
        generic_capacity: Some(3),
    };
    let device = Device::new("x").with_attributes(&lists);
    assert_eq!(device.attributes["ints"], AttributeValue::Ints(vec![1, 2]));
    assert_eq!(
        device.attributes["bools"],
        AttributeValue::Bools(vec![true])
    );
    assert_eq!(
        device.attributes["strings"],
        AttributeValue::Strings(vec!["a".into(), "b".into()])
    );
    assert_eq!(
        device.attributes["versions"],
        AttributeValue::Versions(vec!["1.2.3".into(), "2.0.0-rc.1".into()])
    );
    assert_eq!(device.attributes["generic"], AttributeValue::Int(7));
    assert_eq!(device.capacity["genericCapacity"], DeviceCapacity::new("3"));
}

/// `apply_to` adds to what the device already has, so several sources can be combined.
#[test]
fn applies_on_top_of_existing_entries() {
    let mut device = Device::new("gpu-0");
    device
        .attributes
        .insert("index".into(), AttributeValue::Int(0));
    dra_sdk::slices::DeviceAttributes::apply_to(&common(), &mut device);
    assert_eq!(device.attributes.len(), 6);
    assert_eq!(device.attributes["index"], AttributeValue::Int(0));
}

#[cfg(feature = "semver")]
#[test]
fn semver_versions() {
    #[derive(DeviceAttributes)]
    struct Firmware {
        firmware: semver::Version,
        history: Vec<semver::Version>,
    }
    let firmware = Firmware {
        firmware: semver::Version::parse("1.2.3-beta.1").unwrap(),
        history: vec![semver::Version::new(1, 0, 0)],
    };
    let device = Device::new("nic-0").with_attributes(&firmware);
    assert_eq!(device.attributes["firmware"], version("1.2.3-beta.1"));
    assert_eq!(
        device.attributes["history"],
        AttributeValue::Versions(vec!["1.0.0".into()])
    );
}

/// The typed standard attributes as derive fields: named explicitly, or all three at once
/// through `#[dra(flatten)]` of `PciAttributes`.
#[test]
fn standard_attributes_as_fields() {
    use dra_sdk::attributes::{NumaNode, NumaNodeForm, PciAttributes, PciBusId, PcieRoot};

    #[derive(DeviceAttributes)]
    struct Named {
        #[dra(name = "resource.kubernetes.io/pciBusID")]
        pci_bus_id: PciBusId,
        #[dra(name = "resource.kubernetes.io/pcieRoot")]
        pcie_root: Option<PcieRoot>,
        #[dra(name = "resource.kubernetes.io/numaNode")]
        numa_node: Vec<NumaNode>,
    }

    #[derive(DeviceAttributes)]
    struct Flattened {
        model: &'static str,
        #[dra(flatten)]
        pci: PciAttributes,
    }

    let bus_id: PciBusId = "0000:3b:00.0".parse().unwrap();
    let named = Device::new("gpu-0").with_attributes(&Named {
        pci_bus_id: bus_id,
        pcie_root: Some(PcieRoot::new(0, 0x3a)),
        numa_node: vec![NumaNode::new(1).unwrap()],
    });
    let flattened = Device::new("gpu-0").with_attributes(&Flattened {
        model: "h100",
        pci: PciAttributes::new(bus_id)
            .pcie_root(Some(PcieRoot::new(0, 0x3a)))
            .numa_node(Some(NumaNode::new(1).unwrap()))
            .numa_node_form(NumaNodeForm::List),
    });
    for device in [&named, &flattened] {
        assert_eq!(
            device.attributes[PciBusId::ATTRIBUTE],
            AttributeValue::String("0000:3b:00.0".into())
        );
        assert_eq!(
            device.attributes[PcieRoot::ATTRIBUTE],
            AttributeValue::String("pci0000:3a".into())
        );
        assert_eq!(
            device.attributes[NumaNode::ATTRIBUTE],
            AttributeValue::Ints(vec![1])
        );
    }
    assert_eq!(flattened.attributes.len(), 4);
}
