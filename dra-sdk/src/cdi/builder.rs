//! Builders for the spec types: what a driver's prepare uses to describe a device's edits.
//!
//! Every method takes and returns the value, so edits read as one expression; nothing is
//! checked here. [`ContainerEdits::validate`] checks the edits on their own, and
//! [`SpecWriter::write_claim`](super::SpecWriter::write_claim) validates the whole spec before
//! anything reaches the disk.

use super::name::Kind;
use super::spec::{
    ContainerEdits, Device, DeviceNode, DeviceNodeType, Hook, HookName, IntelRdt, Mount, NetDevice,
    Spec,
};
use super::version::Version;

impl ContainerEdits {
    /// No edits.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets environment variable `key` to `value` (adds a `KEY=VALUE` entry).
    ///
    /// `key` must be non-empty and must not contain `=`: the entry is split at its first `=`,
    /// so a key with one would silently become a shorter key with a longer value.
    pub fn env(mut self, key: impl AsRef<str>, value: impl AsRef<str>) -> Self {
        self.env
            .push(format!("{}={}", key.as_ref(), value.as_ref()));
        self
    }

    /// Adds a raw `KEY=VALUE` environment entry.
    pub fn env_entry(mut self, entry: impl Into<String>) -> Self {
        self.env.push(entry.into());
        self
    }

    /// Adds a device node.
    pub fn device_node(mut self, node: DeviceNode) -> Self {
        self.device_nodes.push(node);
        self
    }

    /// Adds a mount.
    pub fn mount(mut self, mount: Mount) -> Self {
        self.mounts.push(mount);
        self
    }

    /// Adds a hook.
    pub fn hook(mut self, hook: Hook) -> Self {
        self.hooks.push(hook);
        self
    }

    /// Adds a supplementary group of the container process (cdiVersion 0.7.0).
    pub fn additional_gid(mut self, gid: u32) -> Self {
        self.additional_gids.push(gid);
        self
    }

    /// Moves a host network interface into the container (cdiVersion 1.1.0).
    pub fn net_device(mut self, net_device: NetDevice) -> Self {
        self.net_devices.push(net_device);
        self
    }

    /// Sets the Intel RDT settings (cdiVersion 0.7.0), replacing earlier ones.
    pub fn intel_rdt(mut self, intel_rdt: IntelRdt) -> Self {
        self.intel_rdt = Some(intel_rdt);
        self
    }

    /// Appends all of `other`'s edits after this one's; `other`'s Intel RDT settings, if any,
    /// replace these.
    pub fn append(&mut self, other: ContainerEdits) {
        let ContainerEdits {
            env,
            device_nodes,
            net_devices,
            hooks,
            mounts,
            intel_rdt,
            additional_gids,
        } = other;
        self.env.extend(env);
        self.device_nodes.extend(device_nodes);
        self.net_devices.extend(net_devices);
        self.hooks.extend(hooks);
        self.mounts.extend(mounts);
        if intel_rdt.is_some() {
            self.intel_rdt = intel_rdt;
        }
        self.additional_gids.extend(additional_gids);
    }

    /// [`append`](Self::append) as a builder step.
    pub fn merge(mut self, other: ContainerEdits) -> Self {
        self.append(other);
        self
    }
}

impl DeviceNode {
    /// A node at `path` in the container; type, numbers and mode come from the host node of the
    /// same path unless set.
    pub fn new(path: impl Into<String>) -> Self {
        DeviceNode {
            path: path.into(),
            ..DeviceNode::default()
        }
    }

    /// The node on the host, when it differs from the path in the container (cdiVersion 0.5.0).
    pub fn host_path(mut self, host_path: impl Into<String>) -> Self {
        self.host_path = host_path.into();
        self
    }

    /// The node type.
    pub fn device_type(mut self, device_type: DeviceNodeType) -> Self {
        self.device_type = Some(device_type);
        self
    }

    /// The major number.
    pub fn major(mut self, major: i64) -> Self {
        self.major = major;
        self
    }

    /// The minor number.
    pub fn minor(mut self, minor: i64) -> Self {
        self.minor = minor;
        self
    }

    /// The file mode bits (Go `os.FileMode`; `0o666` for a plain rw node).
    pub fn file_mode(mut self, file_mode: u32) -> Self {
        self.file_mode = Some(file_mode);
        self
    }

    /// The cgroup permissions: any of `r`, `w`, `m` (`"rw"`); unset means `rwm`.
    pub fn permissions(mut self, permissions: impl Into<String>) -> Self {
        self.permissions = permissions.into();
        self
    }

    /// The owner in the container.
    pub fn uid(mut self, uid: u32) -> Self {
        self.uid = Some(uid);
        self
    }

    /// The group in the container.
    pub fn gid(mut self, gid: u32) -> Self {
        self.gid = Some(gid);
        self
    }
}

impl Mount {
    /// A mount of `host_path` at `container_path`: a bind mount unless a type is set.
    pub fn new(host_path: impl Into<String>, container_path: impl Into<String>) -> Self {
        Mount {
            host_path: host_path.into(),
            container_path: container_path.into(),
            ..Mount::default()
        }
    }

    /// Adds one mount option (`"ro"`).
    pub fn option(mut self, option: impl Into<String>) -> Self {
        self.options.push(option.into());
        self
    }

    /// Adds mount options (`["ro", "nosuid", "nodev", "rbind"]`).
    pub fn options<I>(mut self, options: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.options.extend(options.into_iter().map(Into::into));
        self
    }

    /// The file-system type (`"tmpfs"`; cdiVersion 0.4.0).
    pub fn mount_type(mut self, mount_type: impl Into<String>) -> Self {
        self.mount_type = mount_type.into();
        self
    }
}

impl Hook {
    /// A hook running the executable at `path` (absolute, on the host) at `hook_name`.
    pub fn new(hook_name: HookName, path: impl Into<String>) -> Self {
        Hook {
            hook_name,
            path: path.into(),
            args: Vec::new(),
            env: Vec::new(),
            timeout: None,
        }
    }

    /// Adds one argument; the first is `argv[0]`.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Adds arguments; the first is `argv[0]`.
    pub fn args<I>(mut self, args: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets environment variable `key` of the hook process (same rules as
    /// [`ContainerEdits::env`]).
    pub fn env(mut self, key: impl AsRef<str>, value: impl AsRef<str>) -> Self {
        self.env
            .push(format!("{}={}", key.as_ref(), value.as_ref()));
        self
    }

    /// The timeout in seconds; must be positive.
    pub fn timeout(mut self, seconds: u32) -> Self {
        self.timeout = Some(i64::from(seconds));
        self
    }
}

impl IntelRdt {
    /// Empty settings; already enough to need cdiVersion 0.7.0.
    pub fn new() -> Self {
        Self::default()
    }

    /// The class of service (resctrl group name, or `/`).
    pub fn clos_id(mut self, clos_id: impl Into<String>) -> Self {
        self.clos_id = clos_id.into();
        self
    }

    /// The L3 cache schema.
    pub fn l3_cache_schema(mut self, schema: impl Into<String>) -> Self {
        self.l3_cache_schema = schema.into();
        self
    }

    /// The memory bandwidth schema.
    pub fn mem_bw_schema(mut self, schema: impl Into<String>) -> Self {
        self.mem_bw_schema = schema.into();
        self
    }

    /// The schemata lines (cdiVersion 1.1.0).
    pub fn schemata<I>(mut self, lines: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.schemata = Some(lines.into_iter().map(Into::into).collect());
        self
    }

    /// Enables monitoring (cdiVersion 1.1.0).
    pub fn enable_monitoring(mut self, enable: bool) -> Self {
        self.enable_monitoring = enable;
        self
    }
}

impl NetDevice {
    /// Moves host interface `host_interface_name` into the container as `name`.
    pub fn new(host_interface_name: impl Into<String>, name: impl Into<String>) -> Self {
        NetDevice {
            host_interface_name: host_interface_name.into(),
            name: name.into(),
        }
    }
}

impl Device {
    /// A device named `name` with its edits.
    pub fn new(name: impl Into<String>, container_edits: ContainerEdits) -> Self {
        Device {
            name: name.into(),
            annotations: Default::default(),
            container_edits,
        }
    }

    /// Adds an annotation (cdiVersion 0.6.0).
    pub fn annotation(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }
}

impl Spec {
    /// An empty spec of `kind` declaring [`Version::EARLIEST`]; add devices, then call
    /// [`set_minimum_version`](Self::set_minimum_version) before writing it.
    pub fn new(kind: Kind) -> Self {
        Spec {
            version: Version::EARLIEST,
            kind,
            annotations: Default::default(),
            devices: Vec::new(),
            container_edits: ContainerEdits::default(),
        }
    }

    /// Declares `cdiVersion`.
    pub fn version(mut self, version: Version) -> Self {
        self.version = version;
        self
    }

    /// Adds a device.
    pub fn device(mut self, device: Device) -> Self {
        self.devices.push(device);
        self
    }

    /// Sets the spec-level edits, applied whenever any device of the spec is injected.
    pub fn container_edits(mut self, container_edits: ContainerEdits) -> Self {
        self.container_edits = container_edits;
        self
    }

    /// Adds an annotation (cdiVersion 0.6.0).
    pub fn annotation(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }
}
