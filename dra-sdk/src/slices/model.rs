//! The typed model of what a driver publishes.
//!
//! The model mirrors `resource.k8s.io/v1` but is independent of the served API version and of the
//! `k8s-openapi` version feature the application picked: the publisher converts it at the edge.
//! Absent optional values are plain Rust defaults (`false`, empty collections), which the wire
//! format leaves out.

use std::collections::BTreeMap;

pub(crate) use k8s_openapi::api::core::v1::NodeSelector;
pub use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
pub(crate) use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Everything a driver publishes: its pools, keyed by pool name.
///
/// ```
/// use dra_sdk::slices::{Device, DriverResources, Pool};
///
/// let resources = DriverResources::new().with_pool(
///     "node-1",
///     Pool::new([Device::new("gpu-0").attribute("model", "a100"), Device::new("gpu-1")]),
/// );
/// assert_eq!(resources.pools["node-1"].devices.len(), 2);
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DriverResources {
    /// Pools keyed by pool name (one or more DNS subdomains joined by `/`, at most 253
    /// characters). A node-local driver usually has one pool named after its node.
    pub pools: BTreeMap<String, Pool>,
}

impl DriverResources {
    /// No pools: publishing this deletes every slice the publisher manages.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a pool.
    pub fn with_pool(mut self, name: impl Into<String>, pool: Pool) -> Self {
        self.pools.insert(name.into(), pool);
        self
    }

    /// A single pool of devices with default settings.
    pub fn single_pool(name: impl Into<String>, devices: Vec<Device>) -> Self {
        Self::new().with_pool(name, Pool::new(devices))
    }

    /// Total number of devices across all pools.
    pub fn device_count(&self) -> usize {
        self.pools.values().map(|pool| pool.devices.len()).sum()
    }
}

/// One resource pool: devices, the counters they share, and which nodes can reach them.
///
/// The publisher splits a pool into as many ResourceSlices as the server's limits require and
/// keeps `pool.generation` and `pool.resourceSliceCount` consistent.
///
/// ```
/// use dra_sdk::slices::{CounterSet, Device, DriverResources, Pool};
///
/// // Two partitions of one GPU, sharing its memory through a counter set.
/// let pool = Pool::new([
///     Device::new("gpu-0-part-0").consumes("gpu-0", [("memory", "40Gi")]),
///     Device::new("gpu-0-part-1").consumes("gpu-0", [("memory", "40Gi")]),
/// ])
/// .counter_set(CounterSet::new("gpu-0", [("memory", "80Gi")]));
/// let resources = DriverResources::new().with_pool("node-a", pool);
/// assert_eq!(resources.device_count(), 2);
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Pool {
    /// The devices, in priority order (the scheduler tries earlier devices first).
    pub devices: Vec<Device>,
    /// Counter sets that partitionable devices consume from (`DRAPartitionableDevices`).
    pub shared_counters: Vec<CounterSet>,
    /// Which nodes can use the pool's devices.
    pub node_selection: PoolNodeSelection,
    /// A minimum pool generation. The publisher normally manages the generation itself; a
    /// driver that wants to force consumers to drop cached state can raise it here.
    pub generation: Option<i64>,
    /// Upper bound on devices per slice, below the server's own limit. `None` uses the
    /// publisher's default (see the module documentation).
    pub max_devices_per_slice: Option<usize>,
    /// `partitionTypeAttribute` (Kubernetes 1.37 alpha, `DRAPartitionableDevicesType`): the
    /// fully qualified name of a string attribute that labels each partitionable device (one
    /// that [`consumes`](Device::consumes) counters) with its partition type, e.g.
    /// `gpu.example.com/profile` = `"1g.10gb"`. See [`Pool::partition_type_attribute`].
    pub partition_type_attribute: Option<String>,
}

impl Pool {
    /// A node-local pool with the given devices.
    pub fn new(devices: impl IntoIterator<Item = Device>) -> Self {
        Self {
            devices: devices.into_iter().collect(),
            ..Self::default()
        }
    }

    /// Adds a device.
    pub fn device(mut self, device: Device) -> Self {
        self.devices.push(device);
        self
    }

    /// Adds a shared counter set.
    pub fn counter_set(mut self, counter_set: CounterSet) -> Self {
        self.shared_counters.push(counter_set);
        self
    }

    /// Sets how nodes reach the pool.
    pub fn node_selection(mut self, node_selection: PoolNodeSelection) -> Self {
        self.node_selection = node_selection;
        self
    }

    /// Sets a minimum generation (see [`Pool::generation`](Pool#structfield.generation)).
    pub fn generation(mut self, generation: i64) -> Self {
        self.generation = Some(generation);
        self
    }

    /// Caps the number of devices per slice.
    pub fn max_devices_per_slice(mut self, max: usize) -> Self {
        self.max_devices_per_slice = Some(max);
        self
    }

    /// Names the attribute that carries each partitionable device's partition type
    /// (`partitionTypeAttribute`, Kubernetes 1.37 alpha, feature gate
    /// `DRAPartitionableDevicesType`). The resource pool status summarises a pool by it.
    ///
    /// The publisher writes it on every slice of the pool that holds a device consuming
    /// counters (the API server refuses it on other slices). Validation asks what the API
    /// documents: every device that consumes counters carries the attribute as a string, and
    /// devices with the same value consume the same counters in the same amounts.
    ///
    /// ```
    /// use dra_sdk::slices::{CounterSet, Device, Pool};
    ///
    /// let pool = Pool::new([
    ///     Device::new("gpu-0-1g-0")
    ///         .attribute("gpu.example.com/profile", "1g.10gb")
    ///         .consumes("gpu-0", [("memory", "10Gi")]),
    /// ])
    /// .counter_set(CounterSet::new("gpu-0", [("memory", "80Gi")]))
    /// .partition_type_attribute("gpu.example.com/profile");
    /// assert!(pool.validate("node-1", &Default::default()).is_ok());
    /// ```
    pub fn partition_type_attribute(mut self, attribute: impl Into<String>) -> Self {
        self.partition_type_attribute = Some(attribute.into());
        self
    }
}

/// Which nodes can use a pool's devices.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum PoolNodeSelection {
    /// Only the publisher's own node (`spec.nodeName`); the only choice for
    /// [`ResourceSlicePublisher::for_node`](super::ResourceSlicePublisher::for_node).
    #[default]
    Local,
    /// Nodes matching a selector with exactly one term (`spec.nodeSelector`).
    NodeSelector(NodeSelector),
    /// Every node (`spec.allNodes`).
    AllNodes,
    /// Each device says which nodes reach it (`spec.perDeviceNodeSelection`,
    /// `DRAPartitionableDevices`); every device must set [`Device::node_selection`].
    PerDevice,
}

/// Which nodes can use one device of a [`PoolNodeSelection::PerDevice`] pool.
#[derive(Clone, Debug, PartialEq)]
pub enum DeviceNodeSelection {
    /// A single node.
    NodeName(String),
    /// Nodes matching a selector with exactly one term.
    NodeSelector(NodeSelector),
    /// Every node.
    AllNodes,
}

/// One device as published in a ResourceSlice.
///
/// Build it with [`Device::new`] and the builder methods, or let a
/// `#[derive(DeviceAttributes)]` type fill in attributes and capacities.
///
/// ```
/// use dra_sdk::slices::{Device, DeviceCapacity, DeviceTaint, TaintEffect};
///
/// let gpu = Device::new("gpu-0")
///     .attribute("model", "h100")
///     .attribute("driverVersion", dra_sdk::slices::AttributeValue::Version("550.54.15".into()))
///     .capacity("memory", DeviceCapacity::new("80Gi"))
///     .taint(DeviceTaint::new("example.com/unhealthy", TaintEffect::NoSchedule));
/// assert_eq!(gpu.taints.len(), 1);
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Device {
    /// Device name: a DNS label, unique within its pool.
    pub name: String,
    /// Attributes keyed by qualified name. A bare C identifier is implicitly in the driver's
    /// domain; other names carry their domain (`resource.kubernetes.io/pcieRoot`).
    pub attributes: BTreeMap<String, AttributeValue>,
    /// Capacities keyed by qualified name, with the same naming rules as attributes.
    pub capacity: BTreeMap<String, DeviceCapacity>,
    /// Counters this device consumes from the pool's shared counter sets, at most one entry
    /// per counter set (`DRAPartitionableDevices`).
    pub consumes_counters: Vec<DeviceCounterConsumption>,
    /// Per-device node selection; required in, and only allowed in,
    /// [`PoolNodeSelection::PerDevice`] pools.
    pub node_selection: Option<DeviceNodeSelection>,
    /// Driver-defined taints (`DRADeviceTaints`), e.g. for an unhealthy device.
    pub taints: Vec<DeviceTaint>,
    /// Allocations of this device pin the claim to the chosen node
    /// (`DRADeviceBindingConditions`).
    pub binds_to_node: bool,
    /// Condition types that must be `True` in the claim's device status before the pod binds.
    pub binding_conditions: Vec<String>,
    /// Condition types that signal a failed binding when `True`.
    pub binding_failure_conditions: Vec<String>,
    /// The device may be allocated many times; its capacities become consumable
    /// (`DRAConsumableCapacity`).
    ///
    /// Each allocation that does not ask for a capacity without a
    /// [`request_policy`](DeviceCapacity::request_policy) takes **all** of it (KEP-5075), so
    /// one such capacity lets a single claim use the device. Give every capacity that shares
    /// should split a policy (for one that is only informational, default 0). The scheduler
    /// charges a shared device's [`consumes`](Device::consumes) counters once, for its first
    /// allocation.
    pub allow_multiple_allocations: bool,
    /// Node resources (`cpu`, `memory`, `ephemeral-storage`, `hugepages-<size>`) an
    /// allocation of this device takes from the node (`nodeAllocatableResources`, Kubernetes
    /// 1.37, feature gate `DRANodeAllocatableResources`). See [`Device::node_allocatable`].
    pub node_allocatable_resources: BTreeMap<String, NodeAllocatableResource>,
}

impl Device {
    /// A device with the given name and nothing else.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ..Self::default()
        }
    }

    /// Adds the attributes and capacities of a [`DeviceAttributes`] value.
    pub fn with_attributes<A: DeviceAttributes + ?Sized>(mut self, attributes: &A) -> Self {
        attributes.apply_to(&mut self);
        self
    }

    /// Sets one attribute.
    pub fn attribute(mut self, name: impl Into<String>, value: impl Into<AttributeValue>) -> Self {
        self.attributes.insert(name.into(), value.into());
        self
    }

    /// Sets one capacity.
    pub fn capacity(
        mut self,
        name: impl Into<String>,
        capacity: impl Into<DeviceCapacity>,
    ) -> Self {
        self.capacity.insert(name.into(), capacity.into());
        self
    }

    /// Consumes counters from a shared counter set of the pool.
    ///
    /// ```
    /// # use dra_sdk::slices::Device;
    /// let slice = Device::new("gpu-0-mig-1g")
    ///     .consumes("gpu-0", [("memory", "10Gi"), ("multiprocessors", "14")]);
    /// assert_eq!(slice.consumes_counters[0].counters.len(), 2);
    /// ```
    pub fn consumes<K, V>(
        mut self,
        counter_set: impl Into<String>,
        counters: impl IntoIterator<Item = (K, V)>,
    ) -> Self
    where
        K: Into<String>,
        V: Into<String>,
    {
        self.consumes_counters
            .push(DeviceCounterConsumption::new(counter_set, counters));
        self
    }

    /// Like [`Device::consumes`], with compatibility groups on that counter set
    /// (`compatibilityGroups`, Kubernetes 1.37 alpha, `DRADeviceCompatibilityGroups`): devices
    /// consuming from the same counter set are only allocated together when they share a
    /// group. At most 2 groups, each a DNS label.
    ///
    /// ```
    /// # use dra_sdk::slices::Device;
    /// // MIG and a full-GPU device on the same GPU: never allocated together.
    /// let mig = Device::new("gpu-0-1g-0").consumes_in_groups("gpu-0", [("memory", "10Gi")], ["mig"]);
    /// let full = Device::new("gpu-0").consumes_in_groups("gpu-0", [("memory", "80Gi")], ["full"]);
    /// assert_eq!(mig.consumes_counters[0].compatibility_groups, ["mig"]);
    /// # let _ = full;
    /// ```
    pub fn consumes_in_groups<K, V, G>(
        mut self,
        counter_set: impl Into<String>,
        counters: impl IntoIterator<Item = (K, V)>,
        groups: impl IntoIterator<Item = G>,
    ) -> Self
    where
        K: Into<String>,
        V: Into<String>,
        G: Into<String>,
    {
        self.consumes_counters.push(
            DeviceCounterConsumption::new(counter_set, counters).compatibility_groups(groups),
        );
        self
    }

    /// Declares what an allocation of this device takes from the node's allocatable
    /// `resource` (`cpu`, `memory`, `ephemeral-storage` or `hugepages-<size>`; extended
    /// resources are refused), so that the scheduler and kubelet account for it.
    ///
    /// ```
    /// use dra_sdk::slices::{Device, DeviceCapacity, NodeAllocatableResource};
    ///
    /// // A GPU that pins 2Gi of host memory per pod using it.
    /// let gpu = Device::new("gpu-0")
    ///     .node_allocatable("memory", NodeAllocatableResource::overhead_only().per_pod("2Gi"));
    /// // A CPU driver's core complex: 8 CPUs per allocated device.
    /// let ccx = Device::new("ccx-0").node_allocatable("cpu", NodeAllocatableResource::per_device("8"));
    /// assert_eq!(gpu.node_allocatable_resources.len() + ccx.node_allocatable_resources.len(), 2);
    /// ```
    pub fn node_allocatable(
        mut self,
        resource: impl Into<String>,
        allocatable: NodeAllocatableResource,
    ) -> Self {
        self.node_allocatable_resources
            .insert(resource.into(), allocatable);
        self
    }

    /// Adds a taint.
    pub fn taint(mut self, taint: DeviceTaint) -> Self {
        self.taints.push(taint);
        self
    }

    /// Sets the per-device node selection (only for [`PoolNodeSelection::PerDevice`] pools).
    pub fn node_selection(mut self, node_selection: DeviceNodeSelection) -> Self {
        self.node_selection = Some(node_selection);
        self
    }

    /// Sets [`Device::binds_to_node`](Device#structfield.binds_to_node).
    pub fn binds_to_node(mut self, binds_to_node: bool) -> Self {
        self.binds_to_node = binds_to_node;
        self
    }

    /// Adds a binding condition type.
    pub fn binding_condition(mut self, condition: impl Into<String>) -> Self {
        self.binding_conditions.push(condition.into());
        self
    }

    /// Adds a binding-failure condition type.
    pub fn binding_failure_condition(mut self, condition: impl Into<String>) -> Self {
        self.binding_failure_conditions.push(condition.into());
        self
    }

    /// Sets [`Device::allow_multiple_allocations`](Device#structfield.allow_multiple_allocations).
    pub fn allow_multiple_allocations(mut self, allow: bool) -> Self {
        self.allow_multiple_allocations = allow;
        self
    }

    /// Whether the device uses a feature that lowers the per-slice device limit to 64 on
    /// Kubernetes 1.35+ (taints, counter consumption, list-typed attributes).
    pub(crate) fn uses_advanced_features(&self) -> bool {
        !self.taints.is_empty()
            || !self.consumes_counters.is_empty()
            || self.attributes.values().any(AttributeValue::is_list)
    }
}

/// The value of a device attribute. Exactly one kind, as in `resource.k8s.io`.
#[derive(Clone, Debug, PartialEq)]
pub enum AttributeValue {
    /// A 64-bit integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
    /// A string of at most 64 characters.
    String(String),
    /// A semantic version (semver 2.0.0) of at most 64 characters.
    Version(String),
    /// A non-empty list of integers (Kubernetes 1.36+, `DRAListTypeAttributes`).
    Ints(Vec<i64>),
    /// A non-empty list of booleans (Kubernetes 1.36+).
    Bools(Vec<bool>),
    /// A non-empty list of strings (Kubernetes 1.36+).
    Strings(Vec<String>),
    /// A non-empty list of semantic versions (Kubernetes 1.36+).
    Versions(Vec<String>),
}

impl AttributeValue {
    /// Whether this is one of the list kinds.
    pub fn is_list(&self) -> bool {
        matches!(
            self,
            Self::Ints(_) | Self::Bools(_) | Self::Strings(_) | Self::Versions(_)
        )
    }

    /// Number of values: 1 for scalars, the list length for lists. Kubernetes 1.36 caps the
    /// sum per device.
    pub fn value_count(&self) -> usize {
        match self {
            Self::Int(_) | Self::Bool(_) | Self::String(_) | Self::Version(_) => 1,
            Self::Ints(values) => values.len(),
            Self::Bools(values) => values.len(),
            Self::Strings(values) | Self::Versions(values) => values.len(),
        }
    }
}

impl From<i64> for AttributeValue {
    fn from(value: i64) -> Self {
        Self::Int(value)
    }
}

impl From<i32> for AttributeValue {
    fn from(value: i32) -> Self {
        Self::Int(value.into())
    }
}

impl From<u32> for AttributeValue {
    fn from(value: u32) -> Self {
        Self::Int(value.into())
    }
}

impl From<bool> for AttributeValue {
    fn from(value: bool) -> Self {
        Self::Bool(value)
    }
}

impl From<&str> for AttributeValue {
    fn from(value: &str) -> Self {
        Self::String(value.to_owned())
    }
}

impl From<String> for AttributeValue {
    fn from(value: String) -> Self {
        Self::String(value)
    }
}

impl From<Vec<i64>> for AttributeValue {
    fn from(value: Vec<i64>) -> Self {
        Self::Ints(value)
    }
}

impl From<Vec<bool>> for AttributeValue {
    fn from(value: Vec<bool>) -> Self {
        Self::Bools(value)
    }
}

impl From<Vec<String>> for AttributeValue {
    fn from(value: Vec<String>) -> Self {
        Self::Strings(value)
    }
}

/// A device capacity.
///
/// ```
/// use dra_sdk::slices::{CapacityRequestPolicy, Device, DeviceCapacity};
///
/// // 80Gi of memory that several claims may share, in steps of 1Gi, 10Gi when not asked.
/// let memory = DeviceCapacity::new("80Gi").with_request_policy(
///     CapacityRequestPolicy::with_default("10Gi").valid_range("1Gi", Some("80Gi"), Some("1Gi")),
/// );
/// let gpu = Device::new("gpu-0").capacity("memory", memory).allow_multiple_allocations(true);
/// assert!(gpu.capacity["memory"].request_policy.is_some());
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceCapacity {
    /// Total amount of the capacity.
    pub value: Quantity,
    /// How requests may consume the capacity of a device with
    /// [`Device::allow_multiple_allocations`](Device#structfield.allow_multiple_allocations)
    /// (`DRAConsumableCapacity`).
    /// `None` there: every allocation that does not ask for the capacity takes all of it.
    pub request_policy: Option<CapacityRequestPolicy>,
}

impl DeviceCapacity {
    /// A capacity with the given total value.
    pub fn new(value: impl Into<String>) -> Self {
        Self {
            value: Quantity(value.into()),
            request_policy: None,
        }
    }

    /// Sets the request policy.
    pub fn with_request_policy(mut self, policy: CapacityRequestPolicy) -> Self {
        self.request_policy = Some(policy);
        self
    }
}

impl From<Quantity> for DeviceCapacity {
    fn from(value: Quantity) -> Self {
        Self {
            value,
            request_policy: None,
        }
    }
}

impl From<&str> for DeviceCapacity {
    fn from(value: &str) -> Self {
        Self::new(value)
    }
}

/// How a request may consume a consumable capacity.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct CapacityRequestPolicy {
    /// Amount consumed by a request that does not ask for this capacity.
    pub default: Option<Quantity>,
    /// Amounts a request may ask for; `None` allows any amount up to the value.
    pub valid: Option<ValidRequestValues>,
}

impl CapacityRequestPolicy {
    /// A policy with only a default amount.
    pub fn with_default(default: impl Into<String>) -> Self {
        Self {
            default: Some(Quantity(default.into())),
            valid: None,
        }
    }

    /// Restricts requests to the given amounts.
    pub fn valid_values(mut self, values: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.valid = Some(ValidRequestValues::Values(
            values.into_iter().map(|v| Quantity(v.into())).collect(),
        ));
        self
    }

    /// Restricts requests to a range, optionally in steps.
    pub fn valid_range(
        mut self,
        min: impl Into<String>,
        max: Option<&str>,
        step: Option<&str>,
    ) -> Self {
        self.valid = Some(ValidRequestValues::Range {
            min: Quantity(min.into()),
            max: max.map(|m| Quantity(m.to_owned())),
            step: step.map(|s| Quantity(s.to_owned())),
        });
        self
    }
}

/// The amounts a request may consume (`validValues` or `validRange`).
#[derive(Clone, Debug, PartialEq)]
pub enum ValidRequestValues {
    /// An explicit list of amounts.
    Values(Vec<Quantity>),
    /// A range with an optional maximum and step.
    Range {
        /// Smallest amount (also the base of `step`).
        min: Quantity,
        /// Largest amount.
        max: Option<Quantity>,
        /// Granularity above `min`.
        step: Option<Quantity>,
    },
}

/// A named set of counters shared by the partitions of a device.
#[derive(Clone, Debug, PartialEq)]
pub struct CounterSet {
    /// Counter-set name: a DNS label, unique in the pool.
    pub name: String,
    /// Counters (DNS-label names) and their total values.
    pub counters: BTreeMap<String, Quantity>,
}

impl CounterSet {
    /// A counter set.
    ///
    /// ```
    /// # use dra_sdk::slices::CounterSet;
    /// let gpu = CounterSet::new("gpu-0", [("memory", "80Gi"), ("multiprocessors", "132")]);
    /// assert_eq!(gpu.counters.len(), 2);
    /// ```
    pub fn new<K: Into<String>, V: Into<String>>(
        name: impl Into<String>,
        counters: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Self {
            name: name.into(),
            counters: counters
                .into_iter()
                .map(|(k, v)| (k.into(), Quantity(v.into())))
                .collect(),
        }
    }
}

/// Counters one device consumes from one counter set.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceCounterConsumption {
    /// Name of a counter set of the same pool.
    pub counter_set: String,
    /// Consumed amount per counter of that set.
    pub counters: BTreeMap<String, Quantity>,
    /// Compatibility groups on this counter set (Kubernetes 1.37 alpha,
    /// `DRADeviceCompatibilityGroups`): devices consuming from the same set are co-allocated
    /// only if all of them share a group; devices without groups only with each other. At
    /// most 2, unique, DNS labels.
    pub compatibility_groups: Vec<String>,
}

impl DeviceCounterConsumption {
    /// A consumption entry.
    pub fn new<K: Into<String>, V: Into<String>>(
        counter_set: impl Into<String>,
        counters: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Self {
            counter_set: counter_set.into(),
            counters: counters
                .into_iter()
                .map(|(k, v)| (k.into(), Quantity(v.into())))
                .collect(),
            compatibility_groups: Vec::new(),
        }
    }

    /// Sets the compatibility groups (see
    /// [`compatibility_groups`](DeviceCounterConsumption#structfield.compatibility_groups)).
    pub fn compatibility_groups(
        mut self,
        groups: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        self.compatibility_groups = groups.into_iter().map(Into::into).collect();
        self
    }
}

/// What an allocation of a device takes from one node-allocatable resource
/// (`nodeAllocatableResources`, Kubernetes 1.37, feature gate `DRANodeAllocatableResources`).
///
/// Two independent parts, at least one of them set:
///
/// * a **mapping**, for a device that *is* a node resource (a CPU driver's cores): either
///   [`per_device`](NodeAllocatableResource::per_device) (allocated devices × multiplier) or
///   [`per_capacity`](NodeAllocatableResource::per_capacity) (consumed capacity × multiplier),
///   never both. The scheduler does not share claims with a mapping between pods.
/// * an **overhead**, for a device that needs some of a node resource
///   ([`per_pod`](NodeAllocatableResource::per_pod) and/or
///   [`per_container`](NodeAllocatableResource::per_container)).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct NodeAllocatableResource {
    /// `mapping.deviceMultiplier`: amount per allocated device (positive).
    pub device_multiplier: Option<Quantity>,
    /// `mapping.capacityKey`: a key of the device's capacity whose consumed amount is
    /// multiplied.
    pub capacity_key: Option<String>,
    /// `mapping.capacityMultiplier`: multiplier of the consumed capacity (positive).
    pub capacity_multiplier: Option<Quantity>,
    /// `overhead.perPod`: amount per pod referencing the claim (not negative).
    pub per_pod: Option<Quantity>,
    /// `overhead.perContainer`: amount per container referencing the claim (not negative).
    pub per_container: Option<Quantity>,
}

impl NodeAllocatableResource {
    /// A mapping of `multiplier` per allocated device.
    pub fn per_device(multiplier: impl Into<String>) -> Self {
        Self {
            device_multiplier: Some(Quantity(multiplier.into())),
            ..Self::default()
        }
    }

    /// A mapping of the consumed amount of the device's capacity `capacity_key`, times
    /// `multiplier`.
    pub fn per_capacity(capacity_key: impl Into<String>, multiplier: impl Into<String>) -> Self {
        Self {
            capacity_key: Some(capacity_key.into()),
            capacity_multiplier: Some(Quantity(multiplier.into())),
            ..Self::default()
        }
    }

    /// No mapping: add an overhead with [`per_pod`](Self::per_pod) or
    /// [`per_container`](Self::per_container).
    pub fn overhead_only() -> Self {
        Self::default()
    }

    /// Sets the overhead per pod referencing the claim.
    pub fn per_pod(mut self, amount: impl Into<String>) -> Self {
        self.per_pod = Some(Quantity(amount.into()));
        self
    }

    /// Sets the overhead per container referencing the claim.
    pub fn per_container(mut self, amount: impl Into<String>) -> Self {
        self.per_container = Some(Quantity(amount.into()));
        self
    }

    /// Whether a mapping part is set (the device models the node resource itself).
    pub(crate) fn has_mapping(&self) -> bool {
        self.device_multiplier.is_some()
            || self.capacity_key.is_some()
            || self.capacity_multiplier.is_some()
    }
}

/// A taint on a device: pods without a matching toleration are not scheduled on it
/// (`NoSchedule`) or are evicted from it (`NoExecute`).
///
/// ```
/// use dra_sdk::slices::{Device, DeviceTaint, TaintEffect};
///
/// let gpu = Device::new("gpu-3")
///     .taint(DeviceTaint::new("gpu.example.com/maintenance", TaintEffect::NoSchedule).value("bios"));
/// assert_eq!(gpu.taints[0].effect, TaintEffect::NoSchedule);
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct DeviceTaint {
    /// Taint key: a label key (`[prefix/]name`).
    pub key: String,
    /// Optional value: a label value.
    pub value: Option<String>,
    /// Effect on claims that do not tolerate the taint.
    pub effect: TaintEffect,
    /// When the taint was added. Left empty, the server fills it in and the publisher keeps
    /// the server's time for as long as the taint stays.
    pub time_added: Option<Time>,
}

impl DeviceTaint {
    /// A taint without value.
    pub fn new(key: impl Into<String>, effect: TaintEffect) -> Self {
        Self {
            key: key.into(),
            value: None,
            effect,
            time_added: None,
        }
    }

    /// Sets the value.
    pub fn value(mut self, value: impl Into<String>) -> Self {
        self.value = Some(value.into());
        self
    }

    /// Sets the time the taint was added.
    pub fn time_added(mut self, time: Time) -> Self {
        self.time_added = Some(time);
        self
    }
}

/// The effect of a device taint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TaintEffect {
    /// Informational only.
    None,
    /// New claims that do not tolerate the taint are not allocated the device.
    NoSchedule,
    /// Like `NoSchedule`, and pods using the device without toleration are evicted.
    NoExecute,
}

impl TaintEffect {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "None",
            Self::NoSchedule => "NoSchedule",
            Self::NoExecute => "NoExecute",
        }
    }
}

impl std::fmt::Display for TaintEffect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Something that contributes attributes and capacities to a [`Device`].
///
/// Usually derived with `#[derive(DeviceAttributes)]`:
///
/// ```
/// use dra_sdk::slices::{AttributeValue, Device, DeviceAttributes, Quantity};
///
/// #[derive(DeviceAttributes)]
/// struct Gpu {
///     model: String,
///     #[dra(capacity)]
///     memory: Quantity,
/// }
///
/// let gpu = Gpu { model: "A100".into(), memory: Quantity("80Gi".into()) };
/// let device = Device::new("gpu-0").with_attributes(&gpu);
/// assert_eq!(device.attributes["model"], AttributeValue::String("A100".into()));
/// ```
pub trait DeviceAttributes {
    /// Writes this value's attributes and capacities into `device`.
    fn apply_to(&self, device: &mut Device);
}
