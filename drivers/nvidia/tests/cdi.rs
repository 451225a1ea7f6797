//! Container edits for full GPUs, MIG devices and VFIO devices, computed from a fake host
//! tree (see `fixture`), and valid as a CDI spec; the driver files of a fake driver root laid
//! out like a real 550 install (`fixture/driver-550.txt`), with and without hooks; the
//! installation of the bundled `nvidia-cdi-hook` and the node-view check of a configured one;
//! the image's copy of the hook.

mod fixture;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dra_driver_nvidia::cdi::hook::{self, HookSetup, Installed};
use dra_driver_nvidia::cdi::ldcache::LdCacheEntry;
use dra_driver_nvidia::cdi::{CdiEdits, CdiError, CdiHook, DriverRoot};
use dra_driver_nvidia::config::IommuBackendPolicy;
use dra_driver_nvidia::host::Host as _;
use dra_driver_nvidia::host::RootedHost;
use dra_sdk::advanced::cdi::{CdiDevice, Spec};
use dra_sdk::cdi::ContainerEdits;
use fixture::driver_install::{self, LIB, VERSION};
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
    let edits = cdi.gpu(gpu.minor, &gpu.pci.bus_id).unwrap();
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
                // No hook configured: what the hook would link is mounted instead.
                mount(&f.library("libcuda.so"), &format!("{lib}/libcuda.so")),
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
    let bdf = f.inventory.gpus[0].info.pci.bus_id.clone();
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
        as_json(&cdi.gpu(minor, &bdf).unwrap()),
        json!({"deviceNodes": [node(&format!("/dev/nvidia{minor}"), GPU_MAJOR, minor)]})
    );
    // ... and with no NVIDIA module loaded at all, prepare fails clearly.
    std::fs::write(
        f.host_path("/proc/devices"),
        "Character devices:\n  1 mem\n",
    )
    .unwrap();
    assert_eq!(
        cdi.gpu(minor, &bdf).unwrap_err().to_string(),
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
    assert_valid_spec(&common, &[("gpu", f.cdi().gpu(0, "0000:01:00.0").unwrap())]);
}

#[test]
fn a_driver_root_without_libraries_gives_device_nodes_only() {
    let f = Fixture::new("workstation");
    std::fs::remove_dir_all(f.driver_root.resolve(Path::new("/usr"))).unwrap();
    let common = f.cdi().common(&f.inventory.driver_version).unwrap();
    assert!(common.mounts.is_empty());
    assert_eq!(common.device_nodes.len(), 3);
    assert_valid_spec(&common, &[("gpu", f.cdi().gpu(0, "0000:01:00.0").unwrap())]);
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

// ---- A real driver install ------------------------------------------------------------------

/// A fixture whose driver root is the 550 install of `fixture/driver-550.txt`, at
/// `NODE_DRIVER_ROOT` on the node, on a host whose kernel is `6.8.0-45-generic`.
struct Install {
    f: Fixture,
    root: PathBuf,
}

impl Install {
    fn new() -> Self {
        let f = Fixture::new("workstation");
        let root = f.dir.path().join("driver-550");
        driver_install::lay_out(&root);
        let release = f.host_path("/proc/sys/kernel/osrelease");
        std::fs::create_dir_all(release.parent().unwrap()).unwrap();
        std::fs::write(release, "6.8.0-45-generic\n").unwrap();
        Self { f, root }
    }

    fn driver_root(&self) -> DriverRoot {
        DriverRoot::new(Arc::new(RootedHost::new(&self.root)), NODE_DRIVER_ROOT)
    }

    fn cdi(&self) -> CdiEdits {
        CdiEdits::new(Arc::new(self.f.host.clone()), self.driver_root())
    }

    /// A hook binary at `path` on the fake node.
    fn hook_on_node(&self, path: &str) {
        let at = self.f.host_path(path);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::fs::write(at, "").unwrap();
    }
}

/// `(containerPath, hostPath)` of every mount.
fn mounts_of(edits: &ContainerEdits) -> Vec<(String, String)> {
    edits
        .mounts
        .iter()
        .map(|m| (m.container_path.clone(), m.host_path.clone()))
        .collect()
}

fn container_paths(edits: &ContainerEdits) -> Vec<String> {
    edits
        .mounts
        .iter()
        .map(|m| m.container_path.clone())
        .collect()
}

fn assert_no_duplicates(paths: &[String]) {
    let mut seen = HashSet::new();
    for path in paths {
        assert!(seen.insert(path), "{path} is mounted twice: {paths:#?}");
    }
}

/// The files of the list that `nvidia-ctk` mounts as driver libraries: every
/// `*.so.<version>` of the 64-bit folder (by name), then of its `vdpau/` folder.
fn expected_libraries() -> Vec<String> {
    let suffix = format!(".so.{VERSION}");
    let in_dir = |dir: &str| {
        let mut names: Vec<String> = driver_install::files()
            .into_iter()
            .filter(|path| {
                path.rsplit_once('/').map(|(d, _)| d) == Some(dir) && path.ends_with(&suffix)
            })
            .collect();
        names.sort();
        names
    };
    let mut libraries = in_dir(LIB);
    libraries.extend(in_dir(&format!("{LIB}/vdpau")));
    libraries
}

/// Everything but the driver libraries, in the edits' order.
fn expected_other_mounts() -> Vec<&'static str> {
    vec![
        // EGL platform libraries (versioned apart), X modules.
        "/usr/lib/x86_64-linux-gnu/libnvidia-egl-gbm.so.1.1.1",
        "/usr/lib/x86_64-linux-gnu/libnvidia-egl-wayland.so.1.1.13",
        "/usr/lib/xorg/modules/drivers/nvidia_drv.so",
        "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.550.120",
        // Configuration files, then the Vulkan ones under /etc.
        "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
        "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
        "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
        "/usr/share/nvidia/nvoptix.bin",
        "/usr/share/X11/xorg.conf.d/10-nvidia.conf",
        "/etc/vulkan/icd.d/nvidia_icd.json",
        "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
        // Binaries.
        "/usr/bin/nvidia-smi",
        "/usr/bin/nvidia-debugdump",
        "/usr/bin/nvidia-persistenced",
        "/usr/bin/nvidia-cuda-mps-control",
        "/usr/bin/nvidia-cuda-mps-server",
        // GSP firmware, found through /lib -> usr/lib.
        "/lib/firmware/nvidia/550.120/gsp_ga10x.bin",
        "/lib/firmware/nvidia/550.120/gsp_tu10x.bin",
        // IPC.
        "/run/nvidia-persistenced/socket",
    ]
}

#[test]
fn a_real_install_gives_every_driver_file_once() {
    let install = Install::new();
    let common = install.cdi().common(VERSION).unwrap();
    let paths = container_paths(&common);
    assert_no_duplicates(&paths);

    let mut expected: Vec<String> = expected_libraries();
    expected.extend(expected_other_mounts().into_iter().map(str::to_owned));
    assert_eq!(paths[..expected.len()], expected[..], "{paths:#?}");

    // What a container needs for each engine a GPU (or MIG device) advertises.
    for video in [
        "libnvcuvid.so.550.120",            // NVDEC
        "libnvidia-encode.so.550.120",      // NVENC
        "libnvidia-opticalflow.so.550.120", // OFA
        "libcuda.so.550.120",
        "libnvidia-ml.so.550.120",
        "libGLX_nvidia.so.550.120",
        "libEGL_nvidia.so.550.120",
    ] {
        assert!(
            paths.contains(&format!("{LIB}/{video}")),
            "{video} not mounted"
        );
    }
    assert!(paths.contains(&format!("{LIB}/vdpau/libvdpau_nvidia.so.550.120")));
    // Not the 32-bit libraries, not unversioned ones, not the other tools.
    for absent in [
        "/usr/lib/i386-linux-gnu/libcuda.so.550.120",
        "/usr/lib/x86_64-linux-gnu/libnvidia-api.so.1",
        "/usr/bin/nvidia-bug-report.sh",
        "/usr/bin/nvidia-ngx-updater",
        "/etc/OpenCL/vendors/nvidia.icd",
    ] {
        assert!(!paths.contains(&absent.to_owned()), "{absent} mounted");
    }

    // Sources are node paths of the files themselves, links resolved inside the driver
    // root: the firmware found through /lib is /usr/lib's, read-only; the socket writable.
    let mounts = mounts_of(&common);
    let source = |container: &str| {
        mounts
            .iter()
            .find(|(c, _)| c == container)
            .map(|(_, h)| h.clone())
            .unwrap_or_else(|| panic!("{container} not mounted"))
    };
    assert_eq!(
        source("/lib/firmware/nvidia/550.120/gsp_ga10x.bin"),
        format!("{NODE_DRIVER_ROOT}/usr/lib/firmware/nvidia/550.120/gsp_ga10x.bin")
    );
    assert_eq!(
        source("/etc/vulkan/icd.d/nvidia_icd.json"),
        format!("{NODE_DRIVER_ROOT}/usr/share/vulkan/icd.d/nvidia_icd.json")
    );
    let options = |container: &str| {
        common
            .mounts
            .iter()
            .find(|m| m.container_path == container)
            .unwrap()
            .options
            .clone()
    };
    assert_eq!(
        options("/run/nvidia-persistenced/socket"),
        ["nosuid", "nodev", "rbind", "rprivate", "noexec"]
    );
    assert_eq!(
        options("/etc/vulkan/icd.d/nvidia_icd.json"),
        ["ro", "nosuid", "nodev", "bind"]
    );
    assert_eq!(
        options(&format!("{LIB}/libcuda.so.550.120")),
        ["ro", "nosuid", "nodev", "rbind", "rprivate"]
    );
    assert_valid_spec(
        &common,
        &[("gpu", install.cdi().gpu(0, "0000:01:00.0").unwrap())],
    );
}

#[test]
fn without_a_hook_every_link_is_a_mount_of_the_library() {
    let install = Install::new();
    let common = install.cdi().common(VERSION).unwrap();
    assert!(common.hooks.is_empty());
    assert!(
        !common
            .env
            .iter()
            .any(|e| e.starts_with("NVIDIA_CTK_LIBCUDA_DIR"))
    );
    let mounts = mounts_of(&common);
    let paths = container_paths(&common);
    assert_no_duplicates(&paths);
    let lib = |name: &str| format!("{LIB}/{name}");
    let node = |name: &str| format!("{NODE_DRIVER_ROOT}{LIB}/{name}");
    for (link, library) in [
        ("libcuda.so.1", "libcuda.so.550.120"),
        ("libcuda.so", "libcuda.so.550.120"),
        ("libnvidia-ml.so.1", "libnvidia-ml.so.550.120"),
        ("libnvidia-nvvm.so.4", "libnvidia-nvvm.so.550.120"),
        ("libnvcuvid.so.1", "libnvcuvid.so.550.120"),
        ("libnvidia-encode.so.1", "libnvidia-encode.so.550.120"),
        (
            "libnvidia-opticalflow.so.1",
            "libnvidia-opticalflow.so.550.120",
        ),
        (
            "libnvidia-opticalflow.so",
            "libnvidia-opticalflow.so.550.120",
        ),
        ("libGLX_indirect.so.0", "libGLX_nvidia.so.550.120"),
        ("libGLX_nvidia.so.0", "libGLX_nvidia.so.550.120"),
        ("libEGL_nvidia.so.0", "libEGL_nvidia.so.550.120"),
        (
            "vdpau/libvdpau_nvidia.so.1",
            "vdpau/libvdpau_nvidia.so.550.120",
        ),
        ("gbm/nvidia-drm_gbm.so", "libnvidia-allocator.so.550.120"),
        ("libnvidia-egl-gbm.so.1", "libnvidia-egl-gbm.so.1.1.1"),
        (
            "libnvidia-egl-wayland.so.1",
            "libnvidia-egl-wayland.so.1.1.13",
        ),
    ] {
        assert!(
            mounts.contains(&(lib(link), node(library))),
            "{link} is not a mount of {library}"
        );
    }
    // No link for a library without a soname of its own.
    assert!(
        !paths
            .iter()
            .any(|p| p.starts_with(&lib("libnvidia-glcore.so.")) && !p.ends_with(VERSION))
    );
    // Every mount's source is a file of the install (never a link, never a folder).
    let files: HashSet<String> = driver_install::files()
        .into_iter()
        .map(|f| format!("{NODE_DRIVER_ROOT}{f}"))
        .collect();
    for (container, host) in &mounts {
        assert!(
            files.contains(host),
            "{container}: {host} is not a file of the install"
        );
    }
}

#[test]
fn with_a_hook_the_links_are_the_hooks_and_ldconfig_indexes_the_library_folders() {
    let install = Install::new();
    let hook = "/var/lib/kubelet/plugins/gpu.nvidia.com/nvidia-cdi-hook";
    install.hook_on_node(hook);
    let common = install.cdi().with_hook(hook).common(VERSION).unwrap();

    // Mounts are the files only: the hook and ldconfig make the links.
    let mut expected = expected_libraries();
    expected.extend(expected_other_mounts().into_iter().map(str::to_owned));
    assert_eq!(container_paths(&common), expected);
    assert!(
        common
            .env
            .contains(&format!("NVIDIA_CTK_LIBCUDA_DIR={LIB}"))
    );

    let hooks: Vec<Vec<String>> = common.hooks.iter().map(|h| h.args.clone()).collect();
    assert!(common.hooks.iter().all(|h| h.path == hook));
    let l = |target: &str, link: &str| format!("{target}::{LIB}/{link}");
    let v = |name: &str| format!("{name}.{VERSION}");
    let mut create = vec!["nvidia-cdi-hook".to_owned(), "create-symlinks".to_owned()];
    for link in [
        l(&v("libEGL_nvidia.so"), "libEGL_nvidia.so.0"),
        l(&v("libGLESv1_CM_nvidia.so"), "libGLESv1_CM_nvidia.so.1"),
        l(&v("libGLESv2_nvidia.so"), "libGLESv2_nvidia.so.2"),
        l(&v("libGLX_nvidia.so"), "libGLX_indirect.so.0"),
        l(&v("libGLX_nvidia.so"), "libGLX_nvidia.so.0"),
        l("libcuda.so.1", "libcuda.so"),
        l(&v("libcuda.so"), "libcuda.so.1"),
        l(&v("libcudadebugger.so"), "libcudadebugger.so.1"),
        l(&v("libnvcuvid.so"), "libnvcuvid.so.1"),
        l("libnvcuvid.so.1", "libnvcuvid.so"),
        l(&v("libnvidia-allocator.so"), "libnvidia-allocator.so.1"),
        l("libnvidia-allocator.so.1", "libnvidia-allocator.so"),
        l(&v("libnvidia-cfg.so"), "libnvidia-cfg.so.1"),
        l("libnvidia-cfg.so.1", "libnvidia-cfg.so"),
        l(&v("libnvidia-encode.so"), "libnvidia-encode.so.1"),
        l("libnvidia-encode.so.1", "libnvidia-encode.so"),
        l(&v("libnvidia-fbc.so"), "libnvidia-fbc.so.1"),
        l("libnvidia-fbc.so.1", "libnvidia-fbc.so"),
        l(&v("libnvidia-ml.so"), "libnvidia-ml.so.1"),
        l("libnvidia-ml.so.1", "libnvidia-ml.so"),
        l(&v("libnvidia-ngx.so"), "libnvidia-ngx.so.1"),
        l(&v("libnvidia-nvvm.so"), "libnvidia-nvvm.so.4"),
        l("libnvidia-nvvm.so.4", "libnvidia-nvvm.so"),
        l(&v("libnvidia-opencl.so"), "libnvidia-opencl.so.1"),
        l("libnvidia-opticalflow.so.1", "libnvidia-opticalflow.so"),
        l(&v("libnvidia-opticalflow.so"), "libnvidia-opticalflow.so.1"),
        l(
            &v("libnvidia-ptxjitcompiler.so"),
            "libnvidia-ptxjitcompiler.so.1",
        ),
        l(
            "libnvidia-ptxjitcompiler.so.1",
            "libnvidia-ptxjitcompiler.so",
        ),
        l(&v("libnvoptix.so"), "libnvoptix.so.1"),
        l(&v("libvdpau_nvidia.so"), "vdpau/libvdpau_nvidia.so.1"),
        l("../libnvidia-allocator.so.1", "gbm/nvidia-drm_gbm.so"),
        format!(
            "{}::/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so",
            v("libglxserver_nvidia.so")
        ),
    ] {
        create.push("--link".to_owned());
        create.push(link);
    }
    let strings = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        hooks,
        vec![
            create,
            strings(&[
                "nvidia-cdi-hook",
                "enable-cuda-compat",
                "--host-driver-version=550.120"
            ]),
            strings(&[
                "nvidia-cdi-hook",
                "update-ldcache",
                "--folder",
                LIB,
                "--folder",
                "/usr/lib/x86_64-linux-gnu/vdpau",
            ]),
            strings(&["nvidia-cdi-hook", "disable-device-node-modification"]),
        ]
    );
    assert_valid_spec(
        &common,
        &[("gpu", install.cdi().gpu(0, "0000:01:00.0").unwrap())],
    );
}

#[test]
fn libraries_outside_the_usual_folders_are_found_through_the_loader_cache() {
    let install = Install::new();
    // A driver in /opt, as a runfile install with --opengl-libdir puts it, reached through
    // an absolute link that must resolve inside the driver root.
    let root = install.f.dir.path().join("opt-root");
    let dir = root.join("opt/nvidia/lib64");
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["libcuda.so.550.120", "libnvidia-ml.so.550.120"] {
        std::fs::write(dir.join(name), name).unwrap();
    }
    std::os::unix::fs::symlink(
        "/opt/nvidia/lib64/libcuda.so.550.120",
        dir.join("libcuda.so.1"),
    )
    .unwrap();
    let cdi = || {
        CdiEdits::new(
            Arc::new(install.f.host.clone()),
            DriverRoot::new(Arc::new(RootedHost::new(&root)), "/"),
        )
    };
    // Without a loader cache: not found.
    assert!(cdi().common(VERSION).unwrap().mounts.is_empty());

    driver_install::write_ld_cache(
        &root,
        &[LdCacheEntry {
            name: "libcuda.so.1".into(),
            path: "/opt/nvidia/lib64/libcuda.so.1".into(),
        }],
    );
    let common = cdi().common(VERSION).unwrap();
    assert_eq!(
        mounts_of(&common),
        [
            (
                "/opt/nvidia/lib64/libcuda.so.550.120".to_owned(),
                "/opt/nvidia/lib64/libcuda.so.550.120".to_owned()
            ),
            (
                "/opt/nvidia/lib64/libnvidia-ml.so.550.120".to_owned(),
                "/opt/nvidia/lib64/libnvidia-ml.so.550.120".to_owned()
            ),
            // No hook: the links, as mounts.
            (
                "/opt/nvidia/lib64/libcuda.so".to_owned(),
                "/opt/nvidia/lib64/libcuda.so.550.120".to_owned()
            ),
            (
                "/opt/nvidia/lib64/libcuda.so.1".to_owned(),
                "/opt/nvidia/lib64/libcuda.so.550.120".to_owned()
            ),
            (
                "/opt/nvidia/lib64/libnvidia-ml.so.1".to_owned(),
                "/opt/nvidia/lib64/libnvidia-ml.so.550.120".to_owned()
            ),
        ]
    );
    // A cache that is not one is ignored, not an error.
    std::fs::write(root.join("etc/ld.so.cache"), "garbage").unwrap();
    assert!(cdi().common(VERSION).unwrap().mounts.is_empty());
}

#[test]
fn libraries_of_another_version_are_not_mounted() {
    let install = Install::new();
    // The kernel driver was upgraded, the node not rebooted: 555 in the kernel, 550 on disk.
    let common = install.cdi().common("555.42.02").unwrap();
    let paths = container_paths(&common);
    assert!(
        !paths.iter().any(|p| p.contains(".so.550.120")),
        "{paths:#?}"
    );
    assert!(!paths.iter().any(|p| p.contains("gsp_")), "{paths:#?}");
    // Version-free files still are.
    assert!(paths.contains(&"/usr/bin/nvidia-smi".to_owned()));
    assert!(paths.contains(&"/etc/vulkan/icd.d/nvidia_icd.json".to_owned()));
}

#[test]
fn a_full_gpu_gets_its_drm_nodes_and_their_by_path_links() {
    let install = Install::new();
    let f = &install.f;
    let gpu = &f.inventory.gpus[0].info;
    let (minor, bdf) = (gpu.minor, gpu.pci.bus_id.as_str());
    let drm = format!("/sys/bus/pci/devices/{bdf}/drm");
    for (name, dev) in [
        ("card1", Some("226:1")),
        ("renderD128", Some("226:128")),
        ("controlD64", None),
    ] {
        let dir = f.host_path(&format!("{drm}/{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        if let Some(dev) = dev {
            std::fs::write(dir.join("dev"), format!("{dev}\n")).unwrap();
        }
    }
    // card1 has its node on the host; renderD128's is not there (yet): from sysfs.
    f.node("/dev/dri/card1", 226, 1);
    let by_path = f.host_path("/dev/dri/by-path");
    std::fs::create_dir_all(&by_path).unwrap();
    let link = |name: String, target: &str| {
        std::os::unix::fs::symlink(target, by_path.join(name)).unwrap()
    };
    link(format!("pci-{bdf}-card"), "../card1");
    link(format!("pci-{bdf}-render"), "../renderD128");
    link("pci-0000:99:00.0-card".to_owned(), "../card2"); // another GPU's

    let nodes = json!([
        node(&format!("/dev/nvidia{minor}"), GPU_MAJOR, minor),
        node("/dev/dri/card1", 226, 1),
        node("/dev/dri/renderD128", 226, 128),
    ]);
    let plain = install.cdi().gpu(minor, bdf).unwrap();
    assert_eq!(as_json(&plain), json!({"deviceNodes": nodes}));

    let hook = "/usr/local/nvidia/toolkit/nvidia-cdi-hook";
    let with_hook = install.cdi().with_hook(hook).gpu(minor, bdf).unwrap();
    assert_eq!(
        as_json(&with_hook),
        json!({
            "deviceNodes": nodes,
            "hooks": [{
                "hookName": "createContainer",
                "path": hook,
                "args": [
                    "nvidia-cdi-hook", "create-symlinks",
                    "--link", format!("../card1::/dev/dri/by-path/pci-{bdf}-card"),
                    "--link", format!("../renderD128::/dev/dri/by-path/pci-{bdf}-render"),
                ],
                "env": ["NVIDIA_CTK_DEBUG=false"],
            }],
        })
    );
    // MIG devices get no DRM nodes.
    let parent = &f.inventory.gpus[0];
    if let Some(mig) = parent.mig_devices.first() {
        let edits = install
            .cdi()
            .mig(minor, mig.gpu_instance_id, mig.compute_instance_id)
            .unwrap();
        assert!(
            edits
                .device_nodes
                .iter()
                .all(|n| !n.path.starts_with("/dev/dri"))
        );
    }
    // nvidia-modeset, once the module made it, is claim-wide.
    f.node("/dev/nvidia-modeset", GPU_MAJOR, 254);
    let common = install.cdi().common(VERSION).unwrap();
    assert_eq!(
        serde_json::to_value(common.device_nodes.last()).unwrap(),
        node("/dev/nvidia-modeset", GPU_MAJOR, 254)
    );
    assert_valid_spec(&common, &[("gpu", with_hook)]);
}

// ---- The hook: installed at start, checked where the node has it -----------------------------

/// A plugin container's view: a bundled hook, a plugin folder, a node's / at a host root.
struct HookPlaces {
    dir: tempfile::TempDir,
}

impl HookPlaces {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.dir.path().join(relative)
    }

    fn setup(&self, configured: Option<&str>) -> HookSetup {
        HookSetup {
            configured: configured.map(PathBuf::from),
            bundled: self.path("image/usr/bin/nvidia-cdi-hook"),
            install_dir: self.path("plugins/gpu.nvidia.com"),
            host_root: self.path("host-root"),
            mock: false,
        }
    }

    fn write(&self, relative: &str, contents: &str) -> PathBuf {
        let path = self.path(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, contents).unwrap();
        path
    }
}

#[test]
fn the_bundled_hook_is_installed_into_the_plugin_folder_and_used() {
    let places = HookPlaces::new();
    // Without one in the image (a run from cargo): no hook, hooks left out (a warning).
    assert!(places.setup(None).resolve().unwrap().is_none());

    places.write("image/usr/bin/nvidia-cdi-hook", "the hook");
    let hook = places.setup(None).resolve().unwrap().expect("a hook");
    let installed = places.path("plugins/gpu.nvidia.com/nvidia-cdi-hook");
    assert_eq!(hook.path(), installed);
    assert_eq!(std::fs::read_to_string(&installed).unwrap(), "the hook");
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(
        std::fs::metadata(&installed).unwrap().permissions().mode() & 0o777,
        0o755
    );
    // Again (a restart): left alone. A new image: replaced.
    assert_eq!(
        hook::install(
            &places.path("image/usr/bin/nvidia-cdi-hook"),
            &places.path("plugins/gpu.nvidia.com")
        )
        .unwrap()
        .1,
        Installed::Unchanged
    );
    places.write("image/usr/bin/nvidia-cdi-hook", "a newer hook");
    places.setup(None).resolve().unwrap().unwrap();
    assert_eq!(std::fs::read_to_string(&installed).unwrap(), "a newer hook");

    // The edits run it from there, and find it there (the plugin folder is at the node's path).
    let install = Install::new();
    let common = install.cdi().with_hook(hook).common(VERSION).unwrap();
    assert_eq!(common.hooks[0].path, installed.to_string_lossy());
    assert_eq!(common.hooks.len(), 4);

    // A mock machine installs nothing (tests must not write into the kubelet's folders).
    let mut mock = places.setup(None);
    mock.mock = true;
    mock.install_dir = places.path("elsewhere");
    assert!(mock.resolve().unwrap().is_none());
    assert!(!places.path("elsewhere").exists());
}

#[test]
fn a_configured_hook_is_checked_on_the_node_not_in_the_plugin_container() {
    let places = HookPlaces::new();
    let install = Install::new();
    // The image has a hook at /usr/bin/nvidia-cdi-hook of the *container*; the node does
    // not (the toolkit is not installed there). A path that exists only in the container
    // must fail, where the runtime would fail to run it.
    let in_container = places.write("image/usr/bin/nvidia-cdi-hook", "the hook");
    std::fs::create_dir_all(places.path("host-root")).unwrap();
    let configured = in_container.to_string_lossy().into_owned();
    let hook = places.setup(Some(&configured)).resolve().unwrap().unwrap();
    assert_eq!(
        install
            .cdi()
            .with_hook(hook)
            .common(VERSION)
            .unwrap_err()
            .to_string(),
        format!(
            "the CDI hook {configured} does not exist on the host (check --nvidia-cdi-hook-path)"
        )
    );

    // On the node (under the host root): fine, and the spec names the node path.
    let on_node = "/usr/local/nvidia/toolkit/nvidia-cdi-hook";
    places.write(&format!("host-root{on_node}"), "the hook");
    let hook: CdiHook = places.setup(Some(on_node)).resolve().unwrap().unwrap();
    let common = install
        .cdi()
        .with_hook(hook.clone())
        .common(VERSION)
        .unwrap();
    assert!(common.hooks.iter().all(|h| h.path == on_node));
    // It disappears from the node: prepares fail clearly again.
    std::fs::remove_file(places.path(&format!("host-root{on_node}"))).unwrap();
    assert!(matches!(
        install.cdi().with_hook(hook).common(VERSION),
        Err(CdiError::HookMissing { .. })
    ));

    // No host root mounted, a path outside the plugin folder: cannot be checked, so used as
    // given (the runtime reports it if it is missing).
    std::fs::remove_dir_all(places.path("host-root")).unwrap();
    let hook = places.setup(Some(on_node)).resolve().unwrap().unwrap();
    let common = install.cdi().with_hook(hook).common(VERSION).unwrap();
    assert_eq!(common.hooks.len(), 4);
    // Under the plugin folder (mounted at the node's path): checked there.
    let in_plugin_dir = places.path("plugins/gpu.nvidia.com/my-hook");
    let configured = in_plugin_dir.to_string_lossy().into_owned();
    let hook = places.setup(Some(&configured)).resolve().unwrap().unwrap();
    assert!(matches!(
        install.cdi().with_hook(hook.clone()).common(VERSION),
        Err(CdiError::HookMissing { .. })
    ));
    places.write("plugins/gpu.nvidia.com/my-hook", "");
    install.cdi().with_hook(hook).common(VERSION).unwrap();
}

#[test]
fn the_image_copies_the_hook_from_a_pinned_toolkit_image_to_where_the_plugin_installs_it_from() {
    use dra_sdk_testing::deliverables::dockerfile;
    let workspace = dockerfile::workspace(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(workspace.join("drivers/nvidia/Dockerfile")).unwrap();
    let copy = dockerfile::copies_from(&text)
        .into_iter()
        .find(|copy| copy.destination == hook::BUNDLED_HOOK)
        .expect("a COPY --from=... of nvidia-cdi-hook to the path the plugin installs from");
    // From NVIDIA's container-toolkit image, where its packages are unpacked under
    // /artifacts/rpm (as upstream's DRA driver image copies it).
    assert_eq!(copy.sources, ["/artifacts/rpm/usr/bin/nvidia-cdi-hook"]);
    let image = dockerfile::image_of(&text, &copy.from);
    assert!(
        image.starts_with("nvcr.io/nvidia/k8s/container-toolkit:"),
        "{image}"
    );
    assert!(
        dockerfile::is_pinned(&image),
        "{image} is not pinned to a version"
    );
    // ... into the final stage (after the last FROM).
    let last_from = text.rfind("\nFROM ").unwrap();
    assert!(text[last_from..].contains(&format!("COPY --from={}", copy.from)));
}
