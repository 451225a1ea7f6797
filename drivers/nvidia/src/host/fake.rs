//! The `/proc`, `/sys` and `/dev` files of a mock machine, in a directory.

use std::path::{Path, PathBuf};

use super::{DeviceNode, DeviceNodeKind, HostError, RootedHost};
use crate::backend::Inventory;

/// Major of `/dev/nvidia<minor>` and `/dev/nvidiactl` (fixed by the NVIDIA driver).
pub const NVIDIA_GPU_MAJOR: u32 = 195;
/// Minor of `/dev/nvidiactl`.
pub const NVIDIA_CTL_MINOR: u32 = 255;
/// Major of `/dev/nvidia-uvm` in the fake tree (dynamic on real hosts; read `/proc/devices`).
pub const NVIDIA_UVM_MAJOR: u32 = 507;
/// Major of `/dev/nvidia-caps/*` in the fake tree (dynamic on real hosts).
pub const NVIDIA_CAPS_MAJOR: u32 = 234;
/// Major of `/dev/vfio/<group>` in the fake tree (dynamic on real hosts).
pub const VFIO_MAJOR: u32 = 509;
/// First IOMMU group number the fake tree hands out (one group per GPU, in list order).
pub const FIRST_IOMMU_GROUP: u32 = 20;
/// The kernel release the fake tree reports in `/proc/sys/kernel/osrelease`.
pub const KERNEL_RELEASE: &str = "6.8.0-fake";

/// Capability minor of a MIG GPU instance, as the NVIDIA driver numbers them in
/// `/proc/driver/nvidia-caps/mig-minors`: `config` 1, `monitor` 2, then per GPU 15 GPU
/// instances of 9 entries each (the GI itself and 8 compute instances). The numbering is
/// UNCONFIRMED against a real host; the driver reads the minors from the `access` files, so
/// only this fake tree depends on it.
pub fn mig_gi_capability_minor(gpu_minor: u32, gpu_instance: u32) -> u32 {
    3 + gpu_minor * 15 * 9 + gpu_instance * 9
}

/// Capability minor of a MIG compute instance (see [`mig_gi_capability_minor`]).
pub fn mig_ci_capability_minor(gpu_minor: u32, gpu_instance: u32, compute_instance: u32) -> u32 {
    mig_gi_capability_minor(gpu_minor, gpu_instance) + 1 + compute_instance
}

/// Lays out the host files of a mock machine under a directory, so that the driver's reads
/// (and the VFIO rebinding) see a consistent machine:
///
/// * `/proc/devices` (`nvidia-frontend`, `nvidia-uvm`, `nvidia-caps`, `vfio` majors),
///   `/proc/driver/nvidia/version`, `/proc/driver/nvidia/gpus/<bdf>/information`,
///   `/proc/driver/nvidia/capabilities/{mig/config,mig/monitor,gpu<m>/mig/gi<g>[/ci<c>]/access}`,
///   `/proc/sys/kernel/osrelease`;
/// * `/sys/devices/<pcieRoot>/<bdf>/{vendor,device,class,subsystem_vendor,subsystem_device,
///   modalias,numa_node,driver_override,driver,iommu_group}`, the `/sys/bus/pci/devices/<bdf>`
///   links, `/sys/bus/pci/drivers/nvidia` (and `vfio-pci` when loaded),
///   `/sys/kernel/iommu_groups/<n>/devices/<bdf>` when the IOMMU is on;
/// * device node stand-ins (see [`RootedHost`]): `/dev/nvidiactl`, `/dev/nvidia<minor>`,
///   `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools`, `/dev/nvidia-caps/nvidia-cap<n>`,
///   `/dev/vfio/vfio`, and `/dev/iommu` with IOMMUFD.
///
/// ```
/// use std::path::Path;
/// use dra_driver_nvidia::backend::mock::MockBackend;
/// use dra_driver_nvidia::host::{FakeHostTree, Host, facts};
///
/// let dir = tempfile::tempdir()?;
/// let backend = MockBackend::from_profile("dgx-a100")?;
/// let host = FakeHostTree::new(dir.path()).build(backend.hardware())?;
/// assert_eq!(facts::pci_driver(&host, "0000:07:00.0")?.as_deref(), Some("nvidia"));
/// assert_eq!(facts::numa_node(&host, "0000:07:00.0")?, Some(3));
/// assert!(host.device_node(Path::new("/dev/nvidia7"))?.is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct FakeHostTree {
    root: PathBuf,
    iommu: bool,
    iommufd: bool,
    vfio_pci_loaded: bool,
    device_nodes: bool,
    dynamic_mig: bool,
}

impl FakeHostTree {
    /// A tree under `root`, with the IOMMU on, no IOMMUFD, `vfio-pci` not loaded, and the
    /// NVIDIA device nodes present.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            iommu: true,
            iommufd: false,
            vfio_pci_loaded: false,
            device_nodes: true,
            dynamic_mig: false,
        }
    }

    /// Whether the IOMMU is on (`/sys/kernel/iommu_groups` populated).
    pub fn iommu(mut self, enabled: bool) -> Self {
        self.iommu = enabled;
        self
    }

    /// Whether `/dev/iommu` (IOMMUFD) exists.
    pub fn iommufd(mut self, enabled: bool) -> Self {
        self.iommufd = enabled;
        self
    }

    /// Whether the `vfio-pci` driver is registered (`/sys/bus/pci/drivers/vfio-pci`).
    pub fn vfio_pci_loaded(mut self, loaded: bool) -> Self {
        self.vfio_pci_loaded = loaded;
        self
    }

    /// Whether the NVIDIA device nodes exist (they do not until something opens the driver
    /// on hosts without `nvidia-persistenced`: upstream issue #1380).
    pub fn device_nodes(mut self, present: bool) -> Self {
        self.device_nodes = present;
        self
    }

    /// Whether MIG instances can be created (dynamic MIG): the capability files and nodes of
    /// GPU instances 1 to 14 with compute instance 0 exist on every MIG-capable GPU, as the
    /// NVIDIA driver makes them when an instance is created.
    pub fn dynamic_mig(mut self, enabled: bool) -> Self {
        self.dynamic_mig = enabled;
        self
    }

    /// Writes the files and returns a [`RootedHost`] on them (with no recorded events).
    pub fn build(&self, inventory: &Inventory) -> Result<RootedHost, HostError> {
        let host = RootedHost::new(&self.root);
        let writer = Writer { root: &self.root };
        writer.file(
            "/proc/devices",
            &format!(
                "Character devices:\n  1 mem\n 10 misc\n{NVIDIA_GPU_MAJOR} nvidia-frontend\n\
                 {NVIDIA_CAPS_MAJOR} nvidia-caps\n{NVIDIA_UVM_MAJOR} nvidia-uvm\n{VFIO_MAJOR} vfio\n\
                 \nBlock devices:\n  8 sd\n"
            ),
        )?;
        writer.file(
            "/proc/driver/nvidia/version",
            &format!(
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {}  (fake host tree)\n",
                inventory.driver_version
            ),
        )?;
        writer.file("/proc/sys/kernel/osrelease", &format!("{KERNEL_RELEASE}\n"))?;
        writer.file(
            "/proc/driver/nvidia/capabilities/mig/config",
            &access_file(1),
        )?;
        writer.file(
            "/proc/driver/nvidia/capabilities/mig/monitor",
            &access_file(2),
        )?;
        writer.dir("/sys/bus/pci/drivers/nvidia")?;
        if self.vfio_pci_loaded {
            writer.dir("/sys/bus/pci/drivers/vfio-pci")?;
        }
        writer.dir("/sys/bus/pci/devices")?;
        writer.dir("/sys/kernel/iommu_groups")?;
        let node = |major, minor| DeviceNode {
            kind: DeviceNodeKind::Char,
            major,
            minor,
        };
        let mut nodes = vec![("/dev/vfio/vfio".to_owned(), node(10, 196))];
        if self.iommufd {
            nodes.push(("/dev/iommu".to_owned(), node(10, 123)));
        }
        if self.device_nodes {
            nodes.push((
                "/dev/nvidiactl".into(),
                node(NVIDIA_GPU_MAJOR, NVIDIA_CTL_MINOR),
            ));
            nodes.push(("/dev/nvidia-uvm".into(), node(NVIDIA_UVM_MAJOR, 0)));
            nodes.push(("/dev/nvidia-uvm-tools".into(), node(NVIDIA_UVM_MAJOR, 1)));
            nodes.push((
                "/dev/nvidia-caps/nvidia-cap1".into(),
                node(NVIDIA_CAPS_MAJOR, 1),
            ));
            nodes.push((
                "/dev/nvidia-caps/nvidia-cap2".into(),
                node(NVIDIA_CAPS_MAJOR, 2),
            ));
        }

        for (position, gpu) in inventory.gpus.iter().enumerate() {
            let info = &gpu.info;
            let bdf = &info.pci.bus_id;
            let root_complex = info
                .pcie_root
                .clone()
                .unwrap_or_else(|| format!("pci{}:00", bdf.get(..4).unwrap_or("0000")));
            let real = format!("/sys/devices/{root_complex}/{bdf}");
            writer.dir(&real)?;
            let (subsystem_device, subsystem_vendor) = match info.pci.subsystem_id {
                Some(id) => (id >> 16, id & 0xffff),
                None => (0, u32::from(info.pci.vendor_id)),
            };
            for (file, contents) in [
                ("vendor", format!("{:#06x}\n", info.pci.vendor_id)),
                ("device", format!("{:#06x}\n", info.pci.device_id)),
                // 3D controller: A100, H100 and T4 all enumerate as class 0302.
                ("class", "0x030200\n".to_owned()),
                ("subsystem_vendor", format!("{subsystem_vendor:#06x}\n")),
                ("subsystem_device", format!("{subsystem_device:#06x}\n")),
                (
                    "modalias",
                    format!(
                        "pci:v{:08X}d{:08X}sv{subsystem_vendor:08X}sd{subsystem_device:08X}bc03sc02i00\n",
                        info.pci.vendor_id, info.pci.device_id
                    ),
                ),
                (
                    "numa_node",
                    format!("{}\n", info.numa_node.map_or(-1, i64::from)),
                ),
                ("driver_override", "(null)\n".to_owned()),
            ] {
                writer.file(&format!("{real}/{file}"), &contents)?;
            }
            let depth = real.trim_start_matches("/sys/").split('/').count();
            let up = "../".repeat(depth);
            writer.link(
                &format!("{real}/driver"),
                &format!("{up}bus/pci/drivers/nvidia"),
            )?;
            writer.link(
                &format!("/sys/bus/pci/devices/{bdf}"),
                &format!("../../..{real}").replacen("../../../sys", "../../..", 1),
            )?;
            if self.iommu {
                let group = FIRST_IOMMU_GROUP
                    + u32::try_from(position).unwrap_or(u32::MAX - FIRST_IOMMU_GROUP);
                writer.dir(&format!("/sys/kernel/iommu_groups/{group}/devices"))?;
                writer.link(
                    &format!("{real}/iommu_group"),
                    &format!("{up}kernel/iommu_groups/{group}"),
                )?;
                writer.link(
                    &format!("/sys/kernel/iommu_groups/{group}/devices/{bdf}"),
                    &format!("../../../..{real}").replacen("../../../../sys", "../../../..", 1),
                )?;
            }
            writer.file(
                &format!("/proc/driver/nvidia/gpus/{bdf}/information"),
                &format!(
                    "Model: \t\t {}\nIRQ:   \t\t 0\nGPU UUID: \t {}\nVideo BIOS: \t ??.??.??.??.??\n\
                     Bus Type: \t PCIe\nDMA Size: \t 47 bits\nDMA Mask: \t 0x7fffffffffff\n\
                     Bus Location: \t {bdf}\nDevice Minor: \t {}\nGPU Excluded:\t No\n",
                    info.product_name, info.uuid, info.minor
                ),
            )?;
            if self.device_nodes {
                nodes.push((
                    format!("/dev/nvidia{}", info.minor),
                    node(NVIDIA_GPU_MAJOR, info.minor),
                ));
            }
            let creatable: Vec<(u32, u32)> = if self.dynamic_mig && !gpu.mig_profiles.is_empty() {
                (1..=14)
                    .map(|gi| (gi, 0))
                    .filter(|(gi, ci)| {
                        !gpu.mig_devices
                            .iter()
                            .any(|mig| mig.gpu_instance_id == *gi && mig.compute_instance_id == *ci)
                    })
                    .collect()
            } else {
                Vec::new()
            };
            let existing = gpu
                .mig_devices
                .iter()
                .map(|mig| (mig.gpu_instance_id, mig.compute_instance_id));
            for (gpu_instance_id, compute_instance_id) in existing.chain(creatable) {
                let gi_dir = format!(
                    "/proc/driver/nvidia/capabilities/gpu{}/mig/gi{}",
                    info.minor, gpu_instance_id
                );
                let gi_minor = mig_gi_capability_minor(info.minor, gpu_instance_id);
                let ci_minor =
                    mig_ci_capability_minor(info.minor, gpu_instance_id, compute_instance_id);
                writer.file(&format!("{gi_dir}/access"), &access_file(gi_minor))?;
                writer.file(
                    &format!("{gi_dir}/ci{compute_instance_id}/access"),
                    &access_file(ci_minor),
                )?;
                if self.device_nodes {
                    for minor in [gi_minor, ci_minor] {
                        nodes.push((
                            format!("/dev/nvidia-caps/nvidia-cap{minor}"),
                            node(NVIDIA_CAPS_MAJOR, minor),
                        ));
                    }
                }
            }
        }
        for (path, device) in nodes {
            host.create_device_node(Path::new(&path), device)
                .map_err(|source| HostError::write(Path::new(&path), b"", source))?;
        }
        Ok(host)
    }
}

/// An `access` file as the NVIDIA driver writes it.
fn access_file(minor: u32) -> String {
    format!("DeviceFileMinor: {minor}\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
}

struct Writer<'a> {
    root: &'a Path,
}

impl Writer<'_> {
    fn resolve(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    fn dir(&self, path: &str) -> Result<(), HostError> {
        std::fs::create_dir_all(self.resolve(path))
            .map_err(|source| HostError::write(Path::new(path), b"", source))
    }

    fn file(&self, path: &str, contents: &str) -> Result<(), HostError> {
        let resolved = self.resolve(path);
        if let Some(parent) = resolved.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|source| HostError::write(Path::new(path), b"", source))?;
        }
        std::fs::write(resolved, contents)
            .map_err(|source| HostError::write(Path::new(path), contents.as_bytes(), source))
    }

    fn link(&self, path: &str, target: &str) -> Result<(), HostError> {
        let resolved = self.resolve(path);
        if let Some(parent) = resolved.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|source| HostError::write(Path::new(path), b"", source))?;
        }
        std::os::unix::fs::symlink(target, resolved)
            .map_err(|source| HostError::write(Path::new(path), target.as_bytes(), source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::mock::MockBackend;
    use crate::host::{Host, facts};

    #[test]
    fn the_tree_matches_the_profile() {
        let dir = tempfile::tempdir().unwrap();
        let backend = MockBackend::from_profile("dgx-a100").unwrap();
        let host = FakeHostTree::new(dir.path())
            .build(backend.hardware())
            .unwrap();
        for gpu in &backend.hardware().gpus {
            let bdf = &gpu.info.pci.bus_id;
            assert_eq!(
                facts::pci_driver(&host, bdf).unwrap().as_deref(),
                Some("nvidia")
            );
            assert_eq!(facts::pcie_root(&host, bdf).unwrap(), gpu.info.pcie_root);
            assert_eq!(facts::numa_node(&host, bdf).unwrap(), gpu.info.numa_node);
            assert!(facts::iommu_group(&host, bdf).unwrap().is_some());
            let node = host
                .device_node(Path::new(&format!("/dev/nvidia{}", gpu.info.minor)))
                .unwrap()
                .unwrap();
            assert_eq!((node.major, node.minor), (NVIDIA_GPU_MAJOR, gpu.info.minor));
            let information = host
                .read_to_string(Path::new(&format!(
                    "/proc/driver/nvidia/gpus/{bdf}/information"
                )))
                .unwrap();
            assert!(information.contains(&gpu.info.uuid));
            for mig in &gpu.mig_devices {
                let gi =
                    facts::mig_capability_minor(&host, gpu.info.minor, mig.gpu_instance_id, None)
                        .unwrap();
                let ci = facts::mig_capability_minor(
                    &host,
                    gpu.info.minor,
                    mig.gpu_instance_id,
                    Some(mig.compute_instance_id),
                )
                .unwrap();
                assert_eq!(ci, gi + 1 + mig.compute_instance_id);
                assert!(
                    host.device_node(Path::new(&format!("/dev/nvidia-caps/nvidia-cap{ci}")))
                        .unwrap()
                        .is_some()
                );
            }
        }
        // The iommu group lists the device back.
        let group = facts::iommu_group(&host, "0000:07:00.0").unwrap().unwrap();
        let members = host
            .read_dir(Path::new(&format!(
                "/sys/kernel/iommu_groups/{group}/devices"
            )))
            .unwrap();
        assert_eq!(members, ["0000:07:00.0"]);
        assert!(
            host.exists(Path::new(&format!(
                "/sys/kernel/iommu_groups/{group}/devices/0000:07:00.0/vendor"
            )))
            .unwrap()
        );
        assert!(host.events().is_empty());
    }

    #[test]
    fn vfio_rebinding_works_on_the_tree() {
        let dir = tempfile::tempdir().unwrap();
        let backend = MockBackend::from_profile("workstation").unwrap();
        let host = FakeHostTree::new(dir.path())
            .vfio_pci_loaded(true)
            .build(backend.hardware())
            .unwrap();
        let bdf = "0000:01:00.0";
        host.write(
            &facts::pci_device_dir(bdf).join("driver_override"),
            b"vfio-pci",
        )
        .unwrap();
        host.write(
            Path::new("/sys/bus/pci/drivers/nvidia/unbind"),
            bdf.as_bytes(),
        )
        .unwrap();
        host.write(
            Path::new("/sys/bus/pci/drivers/vfio-pci/bind"),
            bdf.as_bytes(),
        )
        .unwrap();
        assert_eq!(
            facts::pci_driver(&host, bdf).unwrap().as_deref(),
            Some("vfio-pci")
        );
        assert_eq!(facts::numa_node(&host, bdf).unwrap(), None);
    }

    #[test]
    fn options_shape_the_tree() {
        let dir = tempfile::tempdir().unwrap();
        let backend = MockBackend::from_profile("workstation").unwrap();
        let host = FakeHostTree::new(dir.path())
            .iommu(false)
            .device_nodes(false)
            .iommufd(true)
            .build(backend.hardware())
            .unwrap();
        assert_eq!(facts::iommu_group(&host, "0000:01:00.0").unwrap(), None);
        assert_eq!(host.device_node(Path::new("/dev/nvidia0")).unwrap(), None);
        assert!(host.device_node(Path::new("/dev/iommu")).unwrap().is_some());
        assert!(
            host.read_dir(Path::new("/sys/kernel/iommu_groups"))
                .unwrap()
                .is_empty()
        );
    }
}
