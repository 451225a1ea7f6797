//! Taking over the checkpoint of the upstream Go driver: see [`UpstreamCheckpoint`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::SystemTime;

use dra_sdk::advanced::checkpoint::{
    ClaimRecord, ForeignCheckpoint, ForeignFile, Migration, MigrationRefused, PreparedDeviceRecord,
};
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use super::{
    ClaimState, DRIVER_NAME, MigInstance, PreparedDeviceState, PreparedKind, PriorPersistence,
    VfioBinding,
};
use crate::backend::{GpuBackend, normalize_pci_bus_id};
use crate::config::{DeviceType, FeatureGate, FeatureGates, NvidiaConfig, TimeSliceInterval};
use crate::driver::DeviceName;
use crate::host::{Host, facts};
use crate::sharing::{AppliedSharing, SharedAllocation, TimeSliceRecord};

/// The label of the kept original: `checkpoint.json.upstream-<UTC time>`.
pub const UPSTREAM_LABEL: &str = "upstream";

/// Where the operator's guide is, for refusal messages.
const GUIDE: &str = "drivers/nvidia/docs/migrating-from-upstream.md";

/// The checksum the kubelet's `checkpointmanager` (`pkg/kubelet/checkpointmanager/checksum`)
/// records for `json`, the JSON bytes Go's `json.Marshal` produced.
///
/// `checksum.New(data)` hashes `data` with 32-bit FNV-1a after printing it with go-spew's
/// `%#v` (`k8s.io/apiserver/pkg/util/hash.DeepHashObject`: `DisableMethods`, `SortKeys`):
/// for a `[]byte` that is `([]uint8)[` and the bytes in decimal, separated by spaces, then `]`.
/// The 32-bit sum is stored as a `uint64`.
///
/// ```
/// use dra_driver_nvidia::driver::kubelet_checksum;
///
/// // An empty upstream v1 checkpoint, as `{"checksum":0,"v1":{}}` is hashed.
/// assert_eq!(kubelet_checksum(br#"{"checksum":0,"v1":{}}"#), 1_083_090_442);
/// ```
pub fn kubelet_checksum(json: &[u8]) -> u64 {
    const OFFSET: u32 = 0x811c_9dc5;
    const PRIME: u32 = 0x0100_0193;
    let mut hash = OFFSET;
    let mut feed = |bytes: &[u8]| {
        for byte in bytes {
            hash ^= u32::from(*byte);
            hash = hash.wrapping_mul(PRIME);
        }
    };
    feed(b"([]uint8)[");
    let mut digits = [0u8; 3];
    for (i, byte) in json.iter().enumerate() {
        if i > 0 {
            feed(b" ");
        }
        feed(decimal(*byte, &mut digits));
    }
    feed(b"]");
    u64::from(hash)
}

fn decimal(byte: u8, buffer: &mut [u8; 3]) -> &[u8] {
    let (hundreds, tens, ones) = (byte / 100, byte / 10 % 10, byte % 10);
    buffer[0] = b'0' + hundreds;
    buffer[1] = b'0' + tens;
    buffer[2] = b'0' + ones;
    let start = if hundreds > 0 {
        0
    } else if tens > 0 {
        1
    } else {
        2
    };
    &buffer[start..]
}

/// Taking over the checkpoint of the upstream Go driver (`k8s-dra-driver-gpu`, now
/// `kubernetes-sigs/dra-driver-nvidia-gpu`) when this driver replaces it on a live node.
///
/// Both drivers keep `<plugins dir>/gpu.nvidia.com/checkpoint.json`. Upstream's is written by
/// the kubelet's `checkpointmanager` (`drivers.md` A.5):
///
/// ```text
/// {"version":"v2","checksum":<u64>,"v1":{"preparedClaims":{…}},"v2":{"checksum":<u64>,"preparedClaims":{…},"nodeBootID":"…"}}
/// ```
///
/// with `v1` (every release; only completed claims since `v2` exists), `v2` (claim states,
/// names, boot ID) and, in the NVIDIA mirror's newest code, `v3` (the same claims with
/// lower-case device keys). [`UpstreamCheckpoint`] reads the newest section present, checks its
/// checksum the way the `checkpointmanager` computes it ([`kubelet_checksum`]), and translates
/// every claim into the SDK's record with the [`ClaimState`] this driver's unprepare and
/// start-up reconcile need:
///
/// * full GPU: UUID (recorded), minor and PCI address (read from the backend now);
/// * MIG device: the recorded live tuple (GPU and compute instance IDs, MIG UUID). With
///   `DynamicMIG` it becomes a [`MigInstance`], so the start-up clean-up adopts the instance
///   instead of destroying it and unprepare destroys it, as upstream would have; without the
///   gate a static MIG device, never destroyed;
/// * VFIO device: the recorded PCI address, with the IOMMU group and driver read from sysfs
///   now; unprepare gives the GPU back to `nvidia`, as upstream would have;
/// * admin access from the claim's recorded allocation; consumable shares with the default
///   config when the claim carries no opaque config of this driver;
/// * time slices upstream recorded as applied (`timeSliceApplied`): reset to `Default` at
///   unprepare, as upstream does;
/// * a claim upstream was still preparing (`PrepareStarted`): recorded as started, so the SDK
///   rolls it back at start and the kubelet's retry prepares it with this driver.
///
/// What cannot be carried over faithfully makes the migration refuse, naming the claims and
/// what to do, and the plugin does not start (the file is left as upstream wrote it): an MPS
/// control daemon upstream started (its Deployment and directories are upstream's), a device
/// kind this driver does not have (vGPU), a GPU that is gone or renumbered, a VFIO device
/// without a recorded PCI address (upstream 25.12 and older), a VFIO claim while
/// `PassthroughSupport` is off, a consumable share with an opaque config, a damaged file.
///
/// CDI: upstream's spec of a claim is `<cdi root>/k8s.gpu.nvidia.com-claim_<uid>.yaml` and its
/// device IDs `k8s.gpu.nvidia.com/claim=<uid>-<device>`, the kind this driver writes too. The
/// IDs are kept in the records, and the SDK's unprepare removes the `.yaml` spec of a claim
/// when its kind is this driver's, so a migrated claim's spec goes with it.
///
/// Verified against upstream's file layout as its source describes it (the fixtures of
/// `tests/upstream_checkpoint.rs` are written from that description), on the mock backend and
/// a fake host only; see `docs/migrating-from-upstream.md`.
///
/// Given to the plugin builder's `foreign_checkpoint` by `gpu-kubelet-plugin`
/// ([`NvidiaPlugin::upstream_checkpoint`](crate::plugin::NvidiaPlugin::upstream_checkpoint)).
#[derive(Clone, Debug)]
pub struct UpstreamCheckpoint {
    backend: Arc<dyn GpuBackend>,
    host: Arc<dyn Host>,
    gates: FeatureGates,
    driver_name: String,
    booted_at: Option<SystemTime>,
}

impl UpstreamCheckpoint {
    /// A migration onto `backend` and `host` (the plugin's), for a driver running with
    /// `gates`: they decide whether a MIG device becomes a dynamic MIG instance and whether
    /// VFIO claims can be served.
    pub fn new(backend: Arc<dyn GpuBackend>, host: Arc<dyn Host>, gates: FeatureGates) -> Self {
        Self {
            backend,
            host,
            gates,
            driver_name: DRIVER_NAME.to_owned(),
            booted_at: None,
        }
    }

    /// When the node booted (`dra_sdk::advanced::checkpoint::boot_time()`): a file without a
    /// recorded boot ID (upstream before 0.5) that was last written before is from an earlier
    /// boot, and none of its claims survived. Unknown by default: such a file is taken as of
    /// this boot.
    pub fn booted_at(mut self, booted_at: Option<SystemTime>) -> Self {
        self.booted_at = booted_at;
        self
    }

    /// The DRA driver name whose results and configs the claims' recorded allocations are
    /// searched for. Default [`DRIVER_NAME`].
    pub fn driver_name(mut self, name: impl Into<String>) -> Self {
        self.driver_name = name.into();
        self
    }
}

/// Which section of upstream's file was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Section {
    V1,
    V2,
    V3,
}

impl Section {
    fn key(self) -> &'static str {
        match self {
            Section::V1 => "v1",
            Section::V2 => "v2",
            Section::V3 => "v3",
        }
    }

    fn format(self) -> String {
        format!("k8s-dra-driver-gpu checkpoint {}", self.key())
    }
}

/// The file's top level, each value kept as written (the checksums cover those bytes).
type Envelope<'a> = BTreeMap<String, &'a RawValue>;

/// Recognizes upstream's file: a JSON object whose `checksum` is a number, with a `v1`, `v2`
/// or `v3` section. Returns the section to read. Anything else is not upstream's.
fn recognize(bytes: &[u8]) -> Option<(Envelope<'_>, Section)> {
    let text = std::str::from_utf8(bytes).ok()?;
    let envelope: Envelope<'_> = serde_json::from_str(text).ok()?;
    let checksum = envelope.get("checksum")?.get();
    if checksum.is_empty() || !checksum.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // The newest section a writer left: upstream reads v3 before v2 before v1 too.
    let section = [Section::V3, Section::V2, Section::V1]
        .into_iter()
        .find(|section| {
            envelope
                .get(section.key())
                .is_some_and(|raw| raw.get() != "null")
        })?;
    Some((envelope, section))
}

/// Checks the checksum of `section` as upstream computed it. `v1` (and the file's top-level
/// checksum) covers `{"checksum":0,"v1":…}`; `v2` and `v3` carry their own, first field of
/// the section, over the section with it set to 0.
fn verify(envelope: &Envelope<'_>, section: Section) -> Result<(), String> {
    let (recorded, hashed) = match section {
        Section::V1 => {
            let recorded = envelope.get("checksum").map(|raw| raw.get()).unwrap_or("");
            let v1 = envelope.get("v1").map(|raw| raw.get()).unwrap_or("{}");
            (
                recorded.to_owned(),
                format!("{{\"checksum\":0,\"v1\":{v1}}}"),
            )
        }
        Section::V2 | Section::V3 => {
            let raw = envelope
                .get(section.key())
                .map(|raw| raw.get())
                .unwrap_or("");
            let rest = raw.strip_prefix("{\"checksum\":").ok_or_else(|| {
                format!(
                    "section `{}` does not start with its checksum as upstream writes it",
                    section.key()
                )
            })?;
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 {
                return Err(format!(
                    "the checksum of section `{}` is not a number",
                    section.key()
                ));
            }
            (
                rest[..digits].to_owned(),
                format!("{{\"checksum\":0{}", &rest[digits..]),
            )
        }
    };
    let computed = kubelet_checksum(hashed.as_bytes());
    match recorded.parse::<u64>() {
        Ok(value) if value == computed => Ok(()),
        _ => Err(format!(
            "the checksum of section `{}` does not match its contents (recorded {recorded}, \
             computed {computed}): the file is damaged or was edited, and upstream would refuse \
             it too",
            section.key()
        )),
    }
}

// --- upstream's JSON, as its source declares it (`checkpointv.go`, `prepared.go`,
// `checkpointv3.go`, `deviceinfo.go`, `mig.go`, `device_state.go`). Go matches JSON keys
// case-insensitively; the two spellings upstream wrote are accepted.

#[derive(Debug, Default, Deserialize)]
struct Claims {
    #[serde(default, rename = "preparedClaims")]
    prepared_claims: Option<BTreeMap<String, UpstreamClaim>>,
    #[serde(default, rename = "nodeBootID")]
    node_boot_id: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct UpstreamClaim {
    /// `v2`/`v3` only; `v1` holds completed claims only.
    #[serde(default, rename = "checkpointState")]
    state: Option<String>,
    /// The full `ResourceClaimStatus`: read for the allocation's admin access and configs.
    #[serde(default)]
    status: Value,
    #[serde(default, rename = "preparedDevices")]
    prepared_devices: Option<Vec<Option<Group>>>,
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
}

#[derive(Debug, Default, Deserialize)]
struct Group {
    #[serde(default)]
    devices: Option<Vec<Entry>>,
    #[serde(default, rename = "configState")]
    config_state: ConfigState,
}

#[derive(Debug, Default, Deserialize)]
struct ConfigState {
    #[serde(default, rename = "mpsControlDaemonID")]
    mps_control_daemon_id: String,
    #[serde(default, rename = "mpsApplied")]
    mps_applied: Option<bool>,
    #[serde(default, rename = "timeSliceApplied")]
    time_slice_applied: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
struct Entry {
    #[serde(default)]
    gpu: Option<GpuEntry>,
    #[serde(default)]
    mig: Option<MigEntry>,
    #[serde(default)]
    vfio: Option<VfioEntry>,
    /// Kinds this driver does not have (`vgpu`, or `imexChannel` of old releases).
    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
struct GpuEntry {
    #[serde(default)]
    info: Option<UuidInfo>,
    #[serde(default)]
    device: Option<UpstreamDevice>,
}

#[derive(Debug, Default, Deserialize)]
struct UuidInfo {
    #[serde(default)]
    uuid: String,
    /// VFIO devices since 0.4 (`omitempty`).
    #[serde(default, rename = "pciBusID")]
    pci_bus_id: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct MigEntry {
    /// Since 25.12: the live tuple, for static and dynamic MIG alike.
    #[serde(default)]
    concrete: Option<LiveTuple>,
    /// Before 25.12: the MIG device's info (UUID and parent UUID).
    #[serde(default)]
    info: Option<OldMigInfo>,
    #[serde(default)]
    device: Option<UpstreamDevice>,
}

#[derive(Debug, Default, Deserialize)]
struct LiveTuple {
    #[serde(rename = "parentMinor")]
    parent_minor: u32,
    #[serde(rename = "giId")]
    gi_id: u32,
    #[serde(rename = "ciId")]
    ci_id: u32,
    #[serde(rename = "migUUID")]
    mig_uuid: String,
    #[serde(rename = "parentUUID")]
    parent_uuid: String,
}

#[derive(Debug, Default, Deserialize)]
struct OldMigInfo {
    #[serde(default)]
    uuid: String,
    #[serde(default, rename = "parentUUID")]
    parent_uuid: String,
}

#[derive(Debug, Default, Deserialize)]
struct VfioEntry {
    #[serde(default)]
    info: Option<UuidInfo>,
    #[serde(default)]
    device: Option<UpstreamDevice>,
}

/// `kubeletplugin.Device` (capitalized keys, no JSON tags) or v3's `CheckpointDevice`.
#[derive(Debug, Default, Deserialize)]
struct UpstreamDevice {
    #[serde(default, rename = "requests", alias = "Requests")]
    requests: Option<Vec<String>>,
    #[serde(default, rename = "poolName", alias = "PoolName")]
    pool_name: String,
    #[serde(default, rename = "deviceName", alias = "DeviceName")]
    device_name: String,
    #[serde(default, rename = "cdiDeviceIDs", alias = "CDIDeviceIDs")]
    cdi_device_ids: Option<Vec<String>>,
    #[serde(default, rename = "shareID", alias = "ShareID")]
    share_id: Option<String>,
}

/// What the claim's recorded allocation says about one device.
#[derive(Debug, Default)]
struct Allocation {
    admin_access: bool,
}

/// The allocation results and whether the claim carries opaque configs of `driver`.
fn allocation(status: &Value, driver: &str) -> (BTreeMap<(String, String), Allocation>, bool) {
    let devices = &status["allocation"]["devices"];
    let mut results = BTreeMap::new();
    for result in devices["results"].as_array().into_iter().flatten() {
        if result["driver"].as_str() != Some(driver) {
            continue;
        }
        let key = (
            result["pool"].as_str().unwrap_or_default().to_owned(),
            result["device"].as_str().unwrap_or_default().to_owned(),
        );
        let entry: &mut Allocation = results.entry(key).or_default();
        entry.admin_access |= result["adminAccess"].as_bool().unwrap_or(false);
    }
    let configured = devices["config"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|config| config["opaque"]["driver"].as_str() == Some(driver));
    (results, configured)
}

/// One claim's translation, or why it cannot be translated.
type ClaimResult = Result<ClaimRecord, String>;

impl UpstreamCheckpoint {
    fn refusal(&self, section: Section, claims: Vec<String>, reason: String) -> MigrationRefused {
        MigrationRefused::new(section.format(), claims, reason)
    }

    /// Translates a completed claim.
    fn completed(&self, uid: &str, claim: &UpstreamClaim, notes: &mut Vec<String>) -> ClaimResult {
        let (results, configured) = allocation(&claim.status, &self.driver_name);
        let mut state = ClaimState::default();
        let mut records = Vec::new();
        let groups = claim.prepared_devices.as_deref().unwrap_or_default();
        for group in groups {
            let Some(group) = group else {
                return Err("a device group of the claim is empty (null)".to_owned());
            };
            let config = &group.config_state;
            if !config.mps_control_daemon_id.is_empty() || config.mps_applied == Some(true) {
                let id = if config.mps_control_daemon_id.is_empty() {
                    "(no ID recorded)"
                } else {
                    config.mps_control_daemon_id.as_str()
                };
                return Err(format!(
                    "it shares its devices through an MPS control daemon upstream started \
                     ({id}); this driver cannot adopt upstream's MPS daemons (their Deployment \
                     and directories are upstream's), and stopping it would break the pod"
                ));
            }
            let mut time_sliced = TimeSliceRecord {
                devices: Vec::new(),
                gpus: Vec::new(),
                interval: TimeSliceInterval::Default,
            };
            for entry in group.devices.as_deref().unwrap_or_default() {
                let (record, device) = self.device(entry, &results)?;
                if let PreparedKind::Gpu { uuid, .. } = &device.kind {
                    time_sliced.devices.push(device.device.clone());
                    time_sliced.gpus.push(uuid.clone());
                }
                if let Some(share_id) = &record.share_id {
                    if configured {
                        return Err(format!(
                            "device {} is a consumable share (share {share_id}) of a claim with \
                             opaque configs of {}; the config later shares must match cannot be \
                             carried over",
                            device.device, self.driver_name
                        ));
                    }
                    let device_type = match &device.kind {
                        PreparedKind::Mig { .. } | PreparedKind::MigDynamic(_) => DeviceType::Mig,
                        PreparedKind::Vfio(_) => DeviceType::Vfio,
                        PreparedKind::Gpu { .. } => DeviceType::Gpu,
                    };
                    let config = serde_json::to_value(NvidiaConfig::default_for(device_type))
                        .map_err(|error| format!("encoding the default config: {error}"))?;
                    state.shares.push(SharedAllocation {
                        device: device.device.clone(),
                        share_id: share_id.clone(),
                        config,
                    });
                }
                records.push(record);
                state.devices.push(device);
            }
            if config.time_slice_applied == Some(true) && !time_sliced.gpus.is_empty() {
                notes.push(format!(
                    "claim {uid}: upstream set a time slice on {}; its interval is not \
                     recorded, and unprepare resets it to Default, as upstream does",
                    time_sliced.gpus.join(", ")
                ));
                state.sharing.push(AppliedSharing::TimeSlicing(time_sliced));
            }
        }
        let driver_state = serde_json::to_value(&state)
            .map_err(|error| format!("encoding the driver state: {error}"))?;
        Ok(ClaimRecord::started(&claim.namespace, &claim.name)
            .with_driver_state(driver_state)
            .into_completed(records))
    }

    /// Translates one prepared device: the SDK's record of it and this driver's state.
    fn device(
        &self,
        entry: &Entry,
        results: &BTreeMap<(String, String), Allocation>,
    ) -> Result<(PreparedDeviceRecord, PreparedDeviceState), String> {
        if let Some((kind, _)) = entry.other.iter().find(|(_, value)| !value.is_null()) {
            return Err(format!(
                "it holds a `{kind}` device, a kind this driver does not have"
            ));
        }
        let set = [
            entry.gpu.is_some(),
            entry.mig.is_some(),
            entry.vfio.is_some(),
        ];
        if set.iter().filter(|set| **set).count() != 1 {
            return Err("a prepared device entry names no device, or several at once".to_owned());
        }
        let (upstream, kind) = if let Some(gpu) = &entry.gpu {
            let device = required_device(gpu.device.as_ref())?;
            let uuid = gpu
                .info
                .as_ref()
                .map(|info| info.uuid.as_str())
                .filter(|uuid| !uuid.is_empty())
                .ok_or_else(|| format!("device {}: no GPU UUID recorded", device.device_name))?;
            (device, self.gpu(&device.device_name, uuid)?)
        } else if let Some(mig) = &entry.mig {
            let device = required_device(mig.device.as_ref())?;
            (device, self.mig(&device.device_name, mig)?)
        } else if let Some(vfio) = &entry.vfio {
            let device = required_device(vfio.device.as_ref())?;
            (device, self.vfio(&device.device_name, vfio)?)
        } else {
            return Err("a prepared device entry names no device".to_owned());
        };
        let admin_access = results
            .get(&(upstream.pool_name.clone(), upstream.device_name.clone()))
            .is_some_and(|allocation| allocation.admin_access);
        let mut request_names: Vec<String> = Vec::new();
        for request in upstream.requests.as_deref().unwrap_or_default() {
            // The SDK records base request names; upstream records `<request>/<subrequest>`
            // for a request with subrequests.
            let base = request.split('/').next().unwrap_or(request).to_owned();
            if !request_names.contains(&base) {
                request_names.push(base);
            }
        }
        let mut record =
            PreparedDeviceRecord::new(upstream.pool_name.clone(), upstream.device_name.clone());
        record.request_names = request_names;
        record.share_id = upstream.share_id.clone().filter(|id| !id.is_empty());
        record.cdi_device_ids = upstream.cdi_device_ids.clone().unwrap_or_default();
        let state = PreparedDeviceState {
            device: upstream.device_name.clone(),
            admin_access,
            kind,
        };
        Ok((record, state))
    }

    fn gpu(&self, name: &str, uuid: &str) -> Result<PreparedKind, String> {
        let gpu = match self.backend.gpu(uuid) {
            Ok(Some(gpu)) => gpu,
            Ok(None) => {
                return Err(format!(
                    "device {name} is GPU {uuid}, which this node does not have (any more)"
                ));
            }
            Err(error) => return Err(format!("device {name}: reading GPU {uuid}: {error}")),
        };
        if DeviceName::parse(name) != Some(DeviceName::Gpu { minor: gpu.minor }) {
            return Err(format!(
                "device {name} is GPU {uuid}, which is gpu-{} now (the GPUs were renumbered)",
                gpu.minor
            ));
        }
        Ok(PreparedKind::Gpu {
            uuid: gpu.uuid,
            minor: gpu.minor,
            pci_bus_id: gpu.pci.bus_id,
        })
    }

    fn mig(&self, name: &str, mig: &MigEntry) -> Result<PreparedKind, String> {
        let Some(DeviceName::Mig {
            parent_minor,
            profile_id,
            placement_start,
            ..
        }) = DeviceName::parse(name)
        else {
            return Err(format!("device {name} is not a MIG device name"));
        };
        let (uuid, parent_uuid, ids) = match (&mig.concrete, &mig.info) {
            (Some(tuple), _) => {
                if tuple.parent_minor != parent_minor {
                    return Err(format!(
                        "device {name}: its recorded parent minor {} differs from its name",
                        tuple.parent_minor
                    ));
                }
                (
                    tuple.mig_uuid.clone(),
                    tuple.parent_uuid.clone(),
                    Some((tuple.gi_id, tuple.ci_id)),
                )
            }
            (None, Some(info)) => (info.uuid.clone(), info.parent_uuid.clone(), None),
            (None, None) => return Err(format!("device {name}: no MIG device recorded")),
        };
        if uuid.is_empty() || parent_uuid.is_empty() {
            return Err(format!("device {name}: no MIG or parent UUID recorded"));
        }
        let parent = match self.backend.gpu(&parent_uuid) {
            Ok(Some(parent)) => parent,
            Ok(None) => {
                return Err(format!(
                    "device {name} is on GPU {parent_uuid}, which this node does not have (any \
                     more)"
                ));
            }
            Err(error) => {
                return Err(format!("device {name}: reading GPU {parent_uuid}: {error}"));
            }
        };
        if parent.minor != parent_minor {
            return Err(format!(
                "device {name} is on GPU {parent_uuid}, which is gpu-{} now (the GPUs were \
                 renumbered)",
                parent.minor
            ));
        }
        let live = self
            .backend
            .mig_devices(&parent_uuid)
            .map_err(|error| format!("device {name}: listing the MIG devices: {error}"))?;
        // The instance as it is now: by its IDs (recorded since 25.12), else by its UUID.
        let found = live.iter().find(|device| match ids {
            Some((gi, ci)) => device.gpu_instance_id == gi && device.compute_instance_id == ci,
            None => device.uuid == uuid,
        });
        if let Some(found) = found
            && found.uuid != uuid
        {
            return Err(format!(
                "device {name}: GPU instance {} / compute instance {} is MIG device {} now, not \
                 the {uuid} upstream prepared (the MIG layout was changed by hand)",
                found.gpu_instance_id, found.compute_instance_id, found.uuid
            ));
        }
        let (gpu_instance_id, compute_instance_id) = match (ids, found) {
            (Some(ids), _) => ids,
            (None, Some(found)) => (found.gpu_instance_id, found.compute_instance_id),
            (None, None) => {
                return Err(format!(
                    "device {name}: MIG device {uuid} is gone, and this upstream release did \
                     not record its instance IDs"
                ));
            }
        };
        if !self.gates.is_enabled(FeatureGate::DynamicMig) {
            return Ok(PreparedKind::Mig {
                uuid,
                parent_uuid,
                parent_minor,
                gpu_instance_id,
                compute_instance_id,
            });
        }
        let placement_size = match found {
            Some(found) => {
                if found.profile_id != profile_id || found.placement.start != placement_start {
                    return Err(format!(
                        "device {name}: its MIG device {uuid} has profile {} at placement {}, \
                         not what its name says",
                        found.profile_id, found.placement
                    ));
                }
                found.placement.size
            }
            // Gone already: unprepare finds nothing to destroy; the size is the profile's.
            None => self
                .backend
                .mig_profiles(&parent_uuid)
                .map_err(|error| format!("device {name}: reading the MIG profiles: {error}"))?
                .into_iter()
                .find(|profile| profile.id == profile_id)
                .map(|profile| profile.slice_count)
                .ok_or_else(|| {
                    format!("device {name}: GPU {parent_uuid} has no MIG profile {profile_id}")
                })?,
        };
        Ok(PreparedKind::MigDynamic(MigInstance {
            uuid,
            parent_uuid,
            parent_minor,
            profile_id,
            placement_start,
            placement_size,
            gpu_instance_id,
            compute_instance_id,
        }))
    }

    fn vfio(&self, name: &str, vfio: &VfioEntry) -> Result<PreparedKind, String> {
        if !self.gates.is_enabled(FeatureGate::PassthroughSupport) {
            return Err(format!(
                "device {name} is passed through with VFIO, and this driver runs without the \
                 PassthroughSupport feature gate; enable it as upstream had it"
            ));
        }
        let recorded = vfio
            .info
            .as_ref()
            .and_then(|info| info.pci_bus_id.as_deref())
            .filter(|bus_id| !bus_id.is_empty())
            .ok_or_else(|| {
                format!(
                    "device {name} is passed through with VFIO, and upstream did not record \
                     its PCI address (releases 25.12 and older): which GPU to give back to \
                     nvidia at unprepare is unknown"
                )
            })?;
        let bus_id = normalize_pci_bus_id(recorded)
            .map_err(|error| format!("device {name}: recorded PCI address: {error}"))?;
        let host = self.host.as_ref();
        let iommu_group = facts::iommu_group(host, &bus_id)
            .map_err(|error| format!("device {name}: reading the IOMMU group: {error}"))?
            .ok_or_else(|| format!("device {name}: {bus_id} has no IOMMU group"))?;
        let driver = facts::pci_driver(host, &bus_id)
            .map_err(|error| format!("device {name}: reading the bound driver: {error}"))?;
        let uuid = vfio
            .info
            .as_ref()
            .map(|info| info.uuid.clone())
            .filter(|uuid| !uuid.is_empty());
        let binding = match driver {
            // On VFIO, as upstream left it: unprepare gives it back to nvidia and turns
            // persistence mode on again, as upstream's unprepare does.
            Some(driver) if driver.contains("vfio") => VfioBinding {
                bus_id,
                iommu_group,
                vfio_driver: driver,
                previous_driver: Some("nvidia".to_owned()),
                persistence: Some(PriorPersistence {
                    gpu_uuid: uuid,
                    daemon: false,
                    nvml: true,
                }),
            },
            // Not on VFIO any more (given back by hand): unprepare leaves it alone.
            Some(driver) => VfioBinding {
                bus_id,
                iommu_group,
                vfio_driver: driver.clone(),
                previous_driver: Some(driver),
                persistence: None,
            },
            None => {
                return Err(format!(
                    "device {name}: {bus_id} is bound to no driver; upstream's unprepare would \
                     bind it to nvidia"
                ));
            }
        };
        Ok(PreparedKind::Vfio(binding))
    }
}

fn required_device(device: Option<&UpstreamDevice>) -> Result<&UpstreamDevice, String> {
    device
        .filter(|device| !device.device_name.is_empty())
        .ok_or_else(|| "a prepared device entry has no device name".to_owned())
}

/// `ns/name (uid)`, or the UID alone when upstream (v1) did not record the name.
fn describe(uid: &str, claim: &UpstreamClaim) -> String {
    if claim.name.is_empty() {
        uid.to_owned()
    } else {
        format!("{}/{} ({uid})", claim.namespace, claim.name)
    }
}

impl ForeignCheckpoint for UpstreamCheckpoint {
    fn label(&self) -> &str {
        UPSTREAM_LABEL
    }

    #[tracing::instrument(skip_all, fields(path = %file.path.display()))]
    fn migrate(&self, file: &ForeignFile<'_>) -> Result<Option<Migration>, MigrationRefused> {
        let Some((envelope, section)) = recognize(file.bytes) else {
            return Ok(None);
        };
        let path = file.path.display();
        let damaged = |what: String| {
            self.refusal(
                section,
                Vec::new(),
                format!(
                    "{what}. Nothing was changed and the plugin does not start. Put the \
                     upstream driver back on this node, or, after ending every pod on this node \
                     that uses a GPU claim (kubectl drain), move {path} away by hand; see \
                     {GUIDE}"
                ),
            )
        };
        verify(&envelope, section).map_err(damaged)?;
        let raw = envelope
            .get(section.key())
            .map(|raw| raw.get())
            .unwrap_or("{}");
        let claims: Claims = serde_json::from_str(raw)
            .map_err(|error| damaged(format!("section `{}`: {error}", section.key())))?;

        let format = section.format();
        let boot = match (&claims.node_boot_id, file.modified, self.booted_at) {
            (Some(recorded), _, _) if !recorded.is_empty() => Some(recorded != file.boot_id),
            (_, Some(modified), Some(booted)) => Some(modified < booted),
            _ => None,
        };
        if boot == Some(true) {
            tracing::info!(%format, "upstream's checkpoint is from an earlier boot; none of its claims survived the reboot");
            return Ok(Some(Migration::from_other_boot(format)));
        }

        let mut notes = Vec::new();
        if boot.is_none() {
            notes.push(
                "upstream's checkpoint records no boot ID and the node's boot time is unknown: \
                 its claims are taken as prepared during this boot"
                    .to_owned(),
            );
        }
        let upstream = claims.prepared_claims.unwrap_or_default();
        let mut migrated = BTreeMap::new();
        let mut started = Vec::new();
        let mut problems = Vec::new();
        let mut refused = BTreeSet::new();
        for (uid, claim) in &upstream {
            // v1 holds completed claims only (upstream's own v1 → v2 conversion says so).
            let completed = match (section, claim.state.as_deref()) {
                (Section::V1, _) => true,
                (_, Some("PrepareCompleted")) => true,
                (_, _) => false,
            };
            if !completed {
                started.push(describe(uid, claim));
                migrated.insert(
                    uid.clone(),
                    ClaimRecord::started(&claim.namespace, &claim.name),
                );
                continue;
            }
            match self.completed(uid, claim, &mut notes) {
                Ok(record) => {
                    migrated.insert(uid.clone(), record);
                }
                Err(problem) => {
                    problems.push(format!("claim {}: {problem}", describe(uid, claim)));
                    refused.insert(uid.clone());
                }
            }
        }
        if !problems.is_empty() {
            return Err(self.refusal(
                section,
                refused.into_iter().collect(),
                format!(
                    "{}. Nothing was changed and the plugin does not start: {path} is as \
                     upstream left it. Put the upstream driver back on this node, end the pods \
                     that use these claims (or drain the node), wait until upstream has \
                     unprepared them (they leave {path}), then install this driver again; see \
                     {GUIDE}",
                    problems.join("; ")
                ),
            ));
        }
        if !started.is_empty() {
            notes.push(format!(
                "upstream was still preparing claims {}: they are rolled back at start and the \
                 kubelet's retry prepares them with this driver (a MIG instance upstream \
                 created half-way is destroyed by the dynamic MIG clean-up; a GPU it left on \
                 vfio-pci is reported and left alone)",
                started.join(", ")
            ));
        }
        let mut migration = Migration::new(format, migrated);
        migration.notes = notes;
        Ok(Some(migration))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_match_an_independent_computation() {
        // Values computed with a separate implementation (Python) of FNV-1a over go-spew's
        // `%#v` of the bytes.
        assert_eq!(
            kubelet_checksum(br#"{"checksum":0,"v1":{}}"#),
            1_083_090_442
        );
        assert_eq!(kubelet_checksum(br#"{"checksum":0}"#), 4_166_374_854);
        assert_eq!(
            kubelet_checksum(
                br#"{"checksum":0,"preparedClaims":{"a":{"checkpointState":"PrepareCompleted"}},"nodeBootID":"b"}"#
            ),
            496_755_160
        );
    }

    #[test]
    fn decimals_are_printed_without_leading_zeros() {
        let mut buffer = [0; 3];
        assert_eq!(decimal(0, &mut buffer), b"0");
        assert_eq!(decimal(7, &mut buffer), b"7");
        assert_eq!(decimal(34, &mut buffer), b"34");
        assert_eq!(decimal(100, &mut buffer), b"100");
        assert_eq!(decimal(255, &mut buffer), b"255");
    }

    #[test]
    fn only_upstream_files_are_recognized() {
        for (input, expected) in [
            (r#"{"checksum":1,"v1":{}}"#, Some(Section::V1)),
            (
                r#"{"version":"v2","checksum":1,"v1":{},"v2":{"checksum":2}}"#,
                Some(Section::V2),
            ),
            (
                r#"{"checksum":1,"v1":{},"v2":{"checksum":2},"v3":{"checksum":3}}"#,
                Some(Section::V3),
            ),
            // The SDK's own format.
            (r#"{"version":1,"checksum":"sha256:00","data":{}}"#, None),
            (r#"{"checksum":1}"#, None),
            (r#"{"checksum":"1","v1":{}}"#, None),
            ("[]", None),
            ("", None),
        ] {
            assert_eq!(
                recognize(input.as_bytes()).map(|(_, section)| section),
                expected,
                "{input}"
            );
        }
    }

    #[test]
    fn checksums_are_verified_over_the_bytes_upstream_hashed() {
        let v1 = format!(
            r#"{{"checksum":{},"v1":{{}}}}"#,
            kubelet_checksum(br#"{"checksum":0,"v1":{}}"#)
        );
        let (envelope, section) = recognize(v1.as_bytes()).unwrap();
        verify(&envelope, section).unwrap();

        let body =
            r#","preparedClaims":{"a":{"checkpointState":"PrepareCompleted"}},"nodeBootID":"b"}"#;
        let sum = kubelet_checksum(format!("{{\"checksum\":0{body}").as_bytes());
        let v2 = format!(r#"{{"checksum":7,"v1":{{}},"v2":{{"checksum":{sum}{body}}}"#);
        let (envelope, section) = recognize(v2.as_bytes()).unwrap();
        assert_eq!(section, Section::V2);
        verify(&envelope, section).unwrap();

        let edited = v2.replace("\"b\"", "\"c\"");
        let (envelope, section) = recognize(edited.as_bytes()).unwrap();
        let error = verify(&envelope, section).unwrap_err();
        assert!(error.contains("does not match"), "{error}");
    }

    #[test]
    fn allocations_give_admin_access_and_configs_of_the_driver_only() {
        let status = serde_json::json!({
            "allocation": { "devices": {
                "results": [
                    { "request": "a", "driver": "gpu.nvidia.com", "pool": "node", "device": "gpu-0", "adminAccess": true },
                    { "request": "b", "driver": "gpu.nvidia.com", "pool": "node", "device": "gpu-1" },
                    { "request": "c", "driver": "other.example.com", "pool": "node", "device": "gpu-2", "adminAccess": true },
                ],
                "config": [
                    { "source": "FromClaim", "opaque": { "driver": "other.example.com", "parameters": {} } },
                ],
            }},
        });
        let (results, configured) = allocation(&status, "gpu.nvidia.com");
        assert!(results[&("node".to_owned(), "gpu-0".to_owned())].admin_access);
        assert!(!results[&("node".to_owned(), "gpu-1".to_owned())].admin_access);
        assert!(!results.contains_key(&("node".to_owned(), "gpu-2".to_owned())));
        assert!(!configured);
        let (_, configured) = allocation(&status, "other.example.com");
        assert!(configured);
    }
}
