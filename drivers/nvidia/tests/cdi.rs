//! Container edits for full GPUs, MIG devices and VFIO devices, computed from a fake host
//! tree (see `fixture`), and valid as a CDI spec.

mod fixture;

use std::path::Path;

use dra_driver_nvidia::cdi::{CdiEdits, CdiError};
use dra_driver_nvidia::config::IommuBackendPolicy;
use dra_driver_nvidia::host::Host as _;
use dra_sdk::advanced::cdi::{CdiDevice, Spec};
use dra_sdk::cdi::ContainerEdits;
use fixture::*;
use serde_json::{Value, json};

fn as_json(edits: &ContainerEdits) -> Value {
    serde_json::to_value(edits).unwrap()
}

/// A fully specified character device. A zero minor is omitted, as in Go's CDI types
/// (`omitempty`): runtimes read a missing minor as 0, and a node with a type and a non-zero
/// major is never looked up on the host.
fn node(path: &str, major: u32, minor: u32) -> Value {
    let mut node = json!({"path": path, "type": "c", "major": major});
    if minor != 0 {
        node["minor"] = json!(minor);
    }
    node
}

fn mount(host: &str, container: &str) -> Value {
    json!({
        "hostPath": host,
        "containerPath": container,
        "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"],
    })
}

/// The edits make a valid CDI spec (absolute paths, known hook names, non-empty devices).
fn assert_valid_spec(common: &ContainerEdits, devices: &[(&str, ContainerEdits)]) {
    let mut spec =
        Spec::new("k8s.gpu.nvidia.com/claim".parse().unwrap()).container_edits(common.clone());
    for (name, edits) in devices {
        spec = spec.device(CdiDevice::new(*name, edits.clone()));
    }
    let version = spec.minimum_version();
    let spec = spec.version(version);
    spec.validate().unwrap();
}

#[test]
fn a_full_gpu_gets_its_node_and_the_driver() {
    let f = Fixture::new("dgx-a100");
    let cdi = f.cdi();
    let gpu = &f.inventory.gpus[4].info;
    let edits = cdi.gpu(gpu.minor).unwrap();
    assert_eq!(
        as_json(&edits),
        json!({"deviceNodes": [node(&format!("/dev/nvidia{}", gpu.minor), GPU_MAJOR, gpu.minor)]})
    );

    let common = cdi.common(&f.inventory.driver_version).unwrap();
    let lib = "/usr/lib/x86_64-linux-gnu";
    let version = &f.inventory.driver_version;
    assert_eq!(
        as_json(&common),
        json!({
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [
                node("/dev/nvidiactl", GPU_MAJOR, 255),
                node("/dev/nvidia-uvm", UVM_MAJOR, 0),
                node("/dev/nvidia-uvm-tools", UVM_MAJOR, 1),
            ],
            "mounts": [
                mount(&f.library("libcuda.so"), &format!("{lib}/libcuda.so.{version}")),
                mount(&f.library("libnvidia-ml.so"), &format!("{lib}/libnvidia-ml.so.{version}")),
                mount(
                    &f.library("libnvidia-ptxjitcompiler.so"),
                    &format!("{lib}/libnvidia-ptxjitcompiler.so.{version}"),
                ),
                mount(&format!("{NODE_DRIVER_ROOT}/usr/bin/nvidia-smi"), "/usr/bin/nvidia-smi"),
                mount(
                    &format!("{NODE_DRIVER_ROOT}/usr/bin/nvidia-cuda-mps-control"),
                    "/usr/bin/nvidia-cuda-mps-control",
                ),
                // No hook configured: the sonames are mounted too.
                mount(&f.library("libcuda.so"), &format!("{lib}/libcuda.so.1")),
                mount(&f.library("libnvidia-ml.so"), &format!("{lib}/libnvidia-ml.so.1")),
                mount(
                    &f.library("libnvidia-ptxjitcompiler.so"),
                    &format!("{lib}/libnvidia-ptxjitcompiler.so.1"),
                ),
            ],
        })
    );
    assert_valid_spec(&common, &[("uid-gpu-4", edits)]);
}

#[test]
fn a_mig_device_gets_its_parent_and_capability_nodes() {
    let f = Fixture::new("dgx-a100");
    let parent = &f.inventory.gpus[1];
    let mig = parent
        .mig_devices
        .iter()
        .find(|mig| mig.profile == "3g.40gb")
        .unwrap();
    let minor = parent.info.minor;
    let (gi, ci) = (mig.gpu_instance_id, mig.compute_instance_id);
    let edits = f.cdi().mig(minor, gi, ci).unwrap();
    let gi_minor = gi_cap_minor(minor, gi);
    let ci_minor = ci_cap_minor(minor, gi, ci);
    assert_eq!(
        as_json(&edits),
        json!({"deviceNodes": [
            node(&format!("/dev/nvidia{minor}"), GPU_MAJOR, minor),
            node(&format!("/dev/nvidia-caps/nvidia-cap{gi_minor}"), CAPS_MAJOR, gi_minor),
            node(&format!("/dev/nvidia-caps/nvidia-cap{ci_minor}"), CAPS_MAJOR, ci_minor),
        ]})
    );
    let common = f.cdi().common(&f.inventory.driver_version).unwrap();
    assert_valid_spec(&common, &[("uid-mig", edits)]);

    // A compute instance the driver does not list: the error names the file.
    let error = f.cdi().mig(minor, gi, ci + 1).unwrap_err();
    assert!(matches!(error, CdiError::Host(_)), "{error:?}");
    assert_eq!(
        error.to_string(),
        format!(
            "reading /proc/driver/nvidia/capabilities/gpu{minor}/mig/gi{gi}/ci{}/access: No such \
             file or directory (os error 2)",
            ci + 1
        )
    );
}

#[test]
fn edits_follow_the_host_state_at_each_call() {
    let f = Fixture::new("workstation");
    let cdi = f.cdi();
    let minor = f.inventory.gpus[0].info.minor;
    let first = cdi.common(&f.inventory.driver_version).unwrap();
    assert_eq!(first.device_nodes.len(), 3);

    // uvm-tools disappears from /dev: rebuilt from the nvidia-uvm major in /proc/devices.
    f.remove("/dev/nvidia-uvm-tools");
    let again = cdi.common(&f.inventory.driver_version).unwrap();
    assert_eq!(again.device_nodes, first.device_nodes);

    // Without the uvm module at all, the UVM nodes are left out, and the rest stays.
    f.remove("/dev/nvidia-uvm");
    let devices = std::fs::read_to_string(f.host_path("/proc/devices")).unwrap();
    std::fs::write(
        f.host_path("/proc/devices"),
        devices.replace(&format!("{UVM_MAJOR} nvidia-uvm\n"), ""),
    )
    .unwrap();
    let without_uvm = cdi.common(&f.inventory.driver_version).unwrap();
    assert_eq!(
        serde_json::to_value(&without_uvm.device_nodes).unwrap(),
        json!([node("/dev/nvidiactl", GPU_MAJOR, 255)])
    );

    // The GPU node not created yet (upstream issue #1380): the node is still fully
    // specified from /proc/devices, so the container gets it.
    f.remove(&format!("/dev/nvidia{minor}"));
    assert_eq!(
        as_json(&cdi.gpu(minor).unwrap()),
        json!({"deviceNodes": [node(&format!("/dev/nvidia{minor}"), GPU_MAJOR, minor)]})
    );
    // ... and with no NVIDIA module loaded at all, prepare fails clearly.
    std::fs::write(
        f.host_path("/proc/devices"),
        "Character devices:\n  1 mem\n",
    )
    .unwrap();
    assert_eq!(
        cdi.gpu(minor).unwrap_err().to_string(),
        format!(
            "/dev/nvidia{minor} does not exist on the host and /proc/devices lists no \
             \"nvidia-frontend\" major; is the NVIDIA kernel module loaded (nvidia-smi, \
             nvidia-modprobe)?"
        )
    );
}

#[test]
fn hooks_when_a_hook_binary_is_configured() {
    let f = Fixture::new("workstation");
    let hook = "/var/lib/kubelet/plugins/gpu.nvidia.com/nvidia-cdi-hook";
    let cdi = f.cdi().with_hook(hook);
    let version = f.inventory.driver_version.clone();
    assert_eq!(
        cdi.common(&version).unwrap_err().to_string(),
        format!("the CDI hook {hook} does not exist on the host (check --nvidia-cdi-hook-path)")
    );

    let resolved = f.host_path(hook);
    std::fs::create_dir_all(resolved.parent().unwrap()).unwrap();
    std::fs::write(&resolved, "").unwrap();
    let common = cdi.common(&version).unwrap();
    let hook_json = |args: Vec<String>| {
        json!({
            "hookName": "createContainer",
            "path": hook,
            "args": args,
            "env": ["NVIDIA_CTK_DEBUG=false"],
        })
    };
    let args = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        serde_json::to_value(&common.hooks).unwrap(),
        json!([
            hook_json(args(&[
                "nvidia-cdi-hook",
                "create-symlinks",
                "--link",
                "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so",
            ])),
            hook_json(args(&[
                "nvidia-cdi-hook",
                "enable-cuda-compat",
                &format!("--host-driver-version={version}"),
            ])),
            hook_json(args(&[
                "nvidia-cdi-hook",
                "update-ldcache",
                "--folder",
                "/usr/lib/x86_64-linux-gnu",
            ])),
            hook_json(args(&[
                "nvidia-cdi-hook",
                "disable-device-node-modification"
            ])),
        ])
    );
    // With hooks, ldconfig links the sonames: no extra mounts.
    assert!(
        common
            .mounts
            .iter()
            .all(|m| !m.container_path.ends_with(".so.1")),
        "{:?}",
        common.mounts
    );
    assert_valid_spec(&common, &[("gpu", f.cdi().gpu(0).unwrap())]);
}

#[test]
fn a_driver_root_without_libraries_gives_device_nodes_only() {
    let f = Fixture::new("workstation");
    std::fs::remove_dir_all(f.driver_root.resolve(Path::new("/usr"))).unwrap();
    let common = f.cdi().common(&f.inventory.driver_version).unwrap();
    assert!(common.mounts.is_empty());
    assert_eq!(common.device_nodes.len(), 3);
    assert_valid_spec(&common, &[("gpu", f.cdi().gpu(0).unwrap())]);
}

#[test]
fn vfio_devices_get_their_group_and_the_api_device() {
    let f = Fixture::new("mixed");
    let bus_id = f.inventory.gpus[0].info.pci.bus_id.clone();
    let cdi: CdiEdits = f.cdi();

    // Legacy: the group node (from the vfio major) and /dev/vfio/vfio (misc 10:196).
    let legacy = cdi
        .vfio(&bus_id, 20, IommuBackendPolicy::LegacyOnly, false)
        .unwrap();
    assert_eq!(
        as_json(&legacy),
        json!({
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [node("/dev/vfio/20", VFIO_MAJOR, 20), node("/dev/vfio/vfio", 10, 196)],
        })
    );
    // PreferIommuFD without IOMMUFD on the host: legacy too.
    assert_eq!(
        cdi.vfio(&bus_id, 20, IommuBackendPolicy::PreferIommuFd, false)
            .unwrap(),
        legacy
    );

    // The host has IOMMUFD and the device a vfio cdev.
    f.node("/dev/iommu", 10, 123);
    f.node("/dev/vfio/devices/vfio3", 238, 3);
    let cdev_dir = f
        .host_path(&format!("/sys/bus/pci/devices/{bus_id}"))
        .join("vfio-dev/vfio3");
    std::fs::create_dir_all(cdev_dir).unwrap();
    assert_eq!(
        as_json(
            &cdi.vfio(&bus_id, 20, IommuBackendPolicy::PreferIommuFd, false)
                .unwrap()
        ),
        json!({
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [node("/dev/vfio/devices/vfio3", 238, 3), node("/dev/iommu", 10, 123)],
        })
    );
    // Legacy with the API device asked for: /dev/iommu as well.
    let with_api = cdi
        .vfio(&bus_id, 20, IommuBackendPolicy::LegacyOnly, true)
        .unwrap();
    assert_eq!(with_api.device_nodes.len(), 3);
    assert_eq!(with_api.device_nodes[2].path, "/dev/iommu");
    assert_valid_spec(&ContainerEdits::new(), &[("vfio", with_api)]);

    // No vfio module: a clear error.
    std::fs::write(
        f.host_path("/proc/devices"),
        "Character devices:\n 10 misc\n",
    )
    .unwrap();
    assert_eq!(
        cdi.vfio(&bus_id, 21, IommuBackendPolicy::LegacyOnly, false)
            .unwrap_err()
            .to_string(),
        "/dev/vfio/21 does not exist on the host and /proc/devices lists no \"vfio\" major; is \
         the GPU bound to a VFIO driver?"
    );
}
