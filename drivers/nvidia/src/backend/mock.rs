//! A GPU backend that serves a machine described by a hardware profile (YAML).
//!
//! Profiles ship with the crate (`dgx-a100`, `dgx-h100`, `mixed`, `workstation`; see
//! [`SHIPPED_PROFILES`]) and any file in the same schema can be loaded with
//! [`MockBackend::from_profile`]. The values in the shipped profiles are what the real
//! hardware reports, with sources in each file; `drivers/nvidia/profiles/README.md` has the
//! schema in full.
//!
//! # Schema
//!
//! ```yaml
//! name: my-node                  # defaults to the file name
//! description: free text
//! driverVersion: "580.126.20"    # as NVML prints it
//! cudaDriverVersion: "13.0"
//! migProfileTables:              # GPU-instance profile tables, by any key
//!   a100-sxm4-80gb:
//!     - id: 19                   # the ID `nvidia-smi mig -lgip` prints
//!       name: 1g.10gb
//!       sliceCount: 1            # compute slices (the `g` number)
//!       maxInstances: 7
//!       memoryMiB: 9728
//!       multiprocessors: 14
//!       copyEngines: 1
//!       decoders: 0
//!       encoders: 0
//!       jpegEngines: 0
//!       ofaEngines: 0
//!       placements: "{0,1,2,3,4,5,6}:1"   # as `nvidia-smi mig -lgipp` prints them
//! models:                        # GPU models, by any key
//!   a100-sxm4-80gb:
//!     productName: NVIDIA A100-SXM4-80GB
//!     brand: Nvidia
//!     architecture: Ampere
//!     computeCapability: "8.0"
//!     memoryMiB: 81920
//!     pciDeviceId: "0x20b2"
//!     pciVendorId: "0x10de"      # optional, this is the default
//!     migProfiles: a100-sxm4-80gb   # optional: a key of migProfileTables; absent = no MIG
//! gpus:
//!   - model: a100-sxm4-80gb
//!     pciBusId: "0000:07:00.0"
//!     index: 0                   # optional: position in the list
//!     minor: 0                   # optional: the index
//!     uuid: GPU-…                # optional: derived from profile name and index
//!     numaNode: 3                # optional
//!     pcieRoot: pci0000:00       # optional
//!     migMode: enabled           # enabled | disabled | {current: bool, pending: bool};
//!                                # default disabled on MIG-capable models
//!     nvlinks: ["0000:c4:00.0", unknown, null]   # optional: the far end of each NVLink by
//!                                # link number: a PCI bus ID (a GPU's or an NVSwitch's),
//!                                # `unknown` (up, far end not identified), null (down)
//!     nvlinkPeers: ["0000:0f:00.0"]  # optional: the GPUs NVML reports peer-to-peer over
//!                                # NVLink with; derived from `nvlinks` when absent
//!     migDevices:                # MIG devices that exist (needs migMode current)
//!       - profile: 1g.10gb       # a name in the model's table
//!         placement: 0           # start memory slice; must be one of the profile's
//!         gpuInstanceId: 7
//!         computeInstanceId: 0   # optional, default 0
//!         uuid: MIG-…            # optional: derived
//!         memoryMiB: 9728        # optional: the profile's memory
//! ```
//!
//! Loading validates: references resolve, placements parse and fit the 8 memory slices,
//! every MIG device sits on a placement of its profile, no two overlap, per-profile
//! instance counts stay within `maxInstances`, compute slices add up to at most 7, GPU
//! instance IDs, minors, indexes, UUIDs and bus IDs are unique, at most 18 NVLinks
//! (`NVML_NVLINK_MAX_LINKS`), a link between two GPUs listed at both ends as often, peers are
//! other GPUs with a link up. Errors name the file and the field
//! (`gpus[1].migDevices[2].placement`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::events::HealthEventStream;

mod events;
mod mig;
mod persistence;
pub use events::{MockEventStream, MockEvents};
pub use mig::MockMig;
pub use persistence::{MockPersistence, PersistenceCall};

use super::{
    BackendError, ComputeCapability, CudaDriverVersion, GpuBackend, GpuInfo, GpuInventory,
    Inventory, MigDeviceInfo, MigEngines, MigMode, MigPlacement, MigProfileInfo, NvLink, PciInfo,
    normalize_pci_bus_id, nvlinks_connect,
};

/// The profiles embedded in the crate: `(name, YAML)`.
pub const SHIPPED_PROFILES: &[(&str, &str)] = &[
    ("dgx-a100", include_str!("../../profiles/dgx-a100.yaml")),
    ("dgx-h100", include_str!("../../profiles/dgx-h100.yaml")),
    ("mixed", include_str!("../../profiles/mixed.yaml")),
    (
        "pcie-a100-bridged",
        include_str!("../../profiles/pcie-a100-bridged.yaml"),
    ),
    (
        "workstation",
        include_str!("../../profiles/workstation.yaml"),
    ),
];

/// Memory slices of a MIG-capable GPU (A100, H100): placements are counted in these.
pub const MEMORY_SLICES: u32 = 8;
/// Compute slices of a MIG-capable GPU (A100, H100).
pub const COMPUTE_SLICES: u32 = 7;

/// Why a hardware profile could not be loaded. Every variant names the profile.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProfileError {
    /// Neither a shipped profile name nor a readable file.
    #[error(
        "no mock profile {name:?}: not one of the shipped profiles ({}) and not a readable file: {reason}",
        SHIPPED_PROFILES.iter().map(|(name, _)| *name).collect::<Vec<_>>().join(", ")
    )]
    NotFound {
        /// What was asked for.
        name: String,
        /// Why the file could not be read.
        reason: String,
    },
    /// Not valid YAML for the schema.
    #[error("mock profile {source_name}: {}{message}", field.as_deref().map(|field| format!("{field}: ")).unwrap_or_default())]
    Parse {
        /// The profile name or file path.
        source_name: String,
        /// The field being read, when the error is inside one (`gpus[2].numaNode`).
        field: Option<String>,
        /// The parser's message, with the location.
        message: String,
    },
    /// Valid YAML, but inconsistent or impossible hardware.
    #[error("mock profile {source_name}: {field}: {reason}")]
    Invalid {
        /// The profile name or file path.
        source_name: String,
        /// The offending field (`gpus[1].migDevices[2].placement`).
        field: String,
        /// What is wrong.
        reason: String,
    },
}

// ---- the file format -------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ProfileFile {
    name: Option<String>,
    #[serde(default)]
    #[allow(dead_code)] // documentation for readers of the file
    description: Option<String>,
    driver_version: String,
    cuda_driver_version: String,
    #[serde(default)]
    mig_profile_tables: BTreeMap<String, Vec<MigProfileRow>>,
    models: BTreeMap<String, ModelSpec>,
    gpus: Vec<GpuSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MigProfileRow {
    id: u32,
    name: String,
    slice_count: u32,
    max_instances: u32,
    #[serde(rename = "memoryMiB")]
    memory_mib: u64,
    multiprocessors: u32,
    copy_engines: u32,
    decoders: u32,
    encoders: u32,
    jpeg_engines: u32,
    ofa_engines: u32,
    placements: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ModelSpec {
    product_name: String,
    brand: String,
    architecture: String,
    compute_capability: String,
    #[serde(rename = "memoryMiB")]
    memory_mib: u64,
    pci_device_id: String,
    pci_vendor_id: Option<String>,
    pci_subsystem_id: Option<String>,
    mig_profiles: Option<String>,
    addressing_mode: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GpuSpec {
    model: String,
    pci_bus_id: String,
    index: Option<u32>,
    minor: Option<u32>,
    uuid: Option<String>,
    numa_node: Option<u32>,
    pcie_root: Option<String>,
    mig_mode: Option<MigModeSpec>,
    #[serde(default)]
    nvlinks: Vec<Option<String>>,
    nvlink_peers: Option<Vec<String>>,
    #[serde(default)]
    mig_devices: Vec<MigDeviceSpec>,
}

/// How a profile writes an active NVLink whose far end NVML cannot identify.
const UNKNOWN_LINK_END: &str = "unknown";
/// `NVML_NVLINK_MAX_LINKS`.
const MAX_NVLINKS: usize = 18;

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum MigModeSpec {
    Word(String),
    Explicit { current: bool, pending: bool },
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MigDeviceSpec {
    profile: String,
    placement: u32,
    gpu_instance_id: u32,
    #[serde(default)]
    compute_instance_id: u32,
    uuid: Option<String>,
    #[serde(rename = "memoryMiB")]
    memory_mib: Option<u64>,
}

// ---- the backend -----------------------------------------------------------------------

/// A [`GpuBackend`] serving a hardware profile. Cheap to clone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MockBackend {
    profile: String,
    inventory: Inventory,
    /// Health events to deliver (injected or from a file); shared by clones.
    events: MockEvents,
    /// MIG instances created and destroyed since the profile was loaded; shared by clones.
    mig: MockMig,
    /// Persistence mode of each GPU; shared by clones.
    persistence: MockPersistence,
}

impl MockBackend {
    /// A shipped profile by name, or a profile file by path.
    ///
    /// A name of a shipped profile wins over a file of the same name in the working
    /// directory; write `./dgx-a100` to mean the file.
    pub fn from_profile(name_or_path: &str) -> Result<Self, ProfileError> {
        if let Some((name, yaml)) = SHIPPED_PROFILES
            .iter()
            .find(|(name, _)| *name == name_or_path)
        {
            return Self::from_yaml(name, yaml);
        }
        let path = PathBuf::from(name_or_path);
        let yaml = std::fs::read_to_string(&path).map_err(|error| ProfileError::NotFound {
            name: name_or_path.to_owned(),
            reason: error.to_string(),
        })?;
        Self::from_yaml(&path.display().to_string(), &yaml)
    }

    /// A profile from YAML text; `source_name` names it in errors (a file path or a name).
    pub fn from_yaml(source_name: &str, yaml: &str) -> Result<Self, ProfileError> {
        // serde_path_to_error around the YAML deserializer: the message names the field
        // (`gpus[2].numaNode`) as well as the line and column.
        let mut field = None;
        let file: ProfileFile = serde_saphyr::with_deserializer_from_str(yaml, |deserializer| {
            serde_path_to_error::deserialize(deserializer).map_err(|error| {
                field = Some(error.path().to_string());
                error.into_inner()
            })
        })
        .map_err(|error| ProfileError::Parse {
            source_name: source_name.to_owned(),
            field: field.filter(|field| field != "."),
            message: error.to_string(),
        })?;
        let default_name = Path::new(source_name)
            .file_stem()
            .and_then(|stem| stem.to_str())
            .unwrap_or(source_name)
            .to_owned();
        let inventory = build(source_name, &file)?;
        Ok(Self {
            profile: file.name.clone().unwrap_or(default_name),
            inventory,
            events: MockEvents::default(),
            mig: MockMig::default(),
            persistence: MockPersistence::default(),
        })
    }

    /// All shipped profiles, loaded.
    pub fn shipped() -> Result<Vec<Self>, ProfileError> {
        SHIPPED_PROFILES
            .iter()
            .map(|(name, yaml)| Self::from_yaml(name, yaml))
            .collect()
    }

    /// The profile's name.
    pub fn profile_name(&self) -> &str {
        &self.profile
    }

    /// The health event source: inject events, point it at an event file or make
    /// registration fail. Clones of the backend share it.
    pub fn events(&self) -> MockEvents {
        self.events.clone()
    }

    /// The MIG state changes (dynamic MIG): the calls received, injected failures. Clones of
    /// the backend share it.
    pub fn mig(&self) -> MockMig {
        self.mig.clone()
    }

    /// The GPUs' persistence mode: set it, read the calls received, make changes fail.
    /// Clones of the backend share it.
    pub fn persistence(&self) -> MockPersistence {
        self.persistence.clone()
    }

    /// The whole machine as the profile describes it, without going through the trait (MIG
    /// instances created since are not in it; [`GpuBackend::inventory`] has them).
    pub fn hardware(&self) -> &Inventory {
        &self.inventory
    }

    fn gpu(&self, uuid: &str) -> Result<&GpuInventory, BackendError> {
        self.inventory
            .gpu(uuid)
            .ok_or_else(|| BackendError::NoSuchGpu {
                uuid: uuid.to_owned(),
            })
    }
}

impl GpuBackend for MockBackend {
    fn name(&self) -> String {
        format!("mock:{}", self.profile)
    }

    fn health_events(
        &self,
        gpu_uuids: &[String],
    ) -> Result<Box<dyn HealthEventStream + '_>, BackendError> {
        Ok(Box::new(self.events.register(gpu_uuids)?))
    }

    fn recovery_action(
        &self,
        gpu_uuid: &str,
    ) -> Result<Option<crate::backend::events::RecoveryAction>, BackendError> {
        self.gpu(gpu_uuid)?;
        Ok(self.events.recovery_action(gpu_uuid))
    }

    fn driver_version(&self) -> Result<String, BackendError> {
        Ok(self.inventory.driver_version.clone())
    }

    fn cuda_driver_version(&self) -> Result<CudaDriverVersion, BackendError> {
        Ok(self.inventory.cuda_driver_version)
    }

    fn gpus(&self) -> Result<Vec<GpuInfo>, BackendError> {
        Ok(self
            .inventory
            .gpus
            .iter()
            .map(|gpu| gpu.info.clone())
            .collect())
    }

    fn mig_mode(&self, gpu_uuid: &str) -> Result<Option<MigMode>, BackendError> {
        Ok(self.mig.current(self.gpu(gpu_uuid)?).0)
    }

    fn mig_devices(&self, gpu_uuid: &str) -> Result<Vec<MigDeviceInfo>, BackendError> {
        Ok(self.mig.current(self.gpu(gpu_uuid)?).1)
    }

    fn mig_profiles(&self, gpu_uuid: &str) -> Result<Vec<MigProfileInfo>, BackendError> {
        Ok(self.gpu(gpu_uuid)?.mig_profiles.clone())
    }

    fn persistence_mode(&self, gpu_uuid: &str) -> Result<Option<bool>, BackendError> {
        self.gpu(gpu_uuid)?;
        Ok(Some(self.persistence.get(gpu_uuid)))
    }

    fn set_persistence_mode(&self, gpu_uuid: &str, enabled: bool) -> Result<(), BackendError> {
        self.gpu(gpu_uuid)?;
        self.persistence.change(gpu_uuid, enabled)
    }

    fn nvlinks(&self, gpu_uuid: &str) -> Result<Vec<NvLink>, BackendError> {
        Ok(self.gpu(gpu_uuid)?.nvlinks.clone())
    }

    fn nvlink_p2p(&self, gpu_uuid: &str, peer_uuid: &str) -> Result<Option<bool>, BackendError> {
        self.gpu(peer_uuid)?;
        Ok(self
            .gpu(gpu_uuid)?
            .nvlink_peers
            .as_ref()
            .map(|peers| peers.iter().any(|peer| peer == peer_uuid)))
    }

    fn inventory(&self) -> Result<Inventory, BackendError> {
        let mut inventory = self.inventory.clone();
        for gpu in &mut inventory.gpus {
            (gpu.mig_mode, gpu.mig_devices) = self.mig.current(gpu);
        }
        Ok(inventory)
    }
}

// ---- building and validating -----------------------------------------------------------

struct Checker<'a> {
    source_name: &'a str,
}

impl Checker<'_> {
    fn invalid(&self, field: impl Into<String>, reason: impl Into<String>) -> ProfileError {
        ProfileError::Invalid {
            source_name: self.source_name.to_owned(),
            field: field.into(),
            reason: reason.into(),
        }
    }
}

fn build(source_name: &str, file: &ProfileFile) -> Result<Inventory, ProfileError> {
    let check = Checker { source_name };
    let cuda_driver_version: CudaDriverVersion = file
        .cuda_driver_version
        .parse()
        .map_err(|error: BackendError| check.invalid("cudaDriverVersion", error.to_string()))?;
    if file.driver_version.trim().is_empty() {
        return Err(check.invalid("driverVersion", "must not be empty"));
    }
    let mut tables = BTreeMap::new();
    for (key, rows) in &file.mig_profile_tables {
        tables.insert(key.as_str(), build_table(&check, key, rows)?);
    }
    let mut gpus = Vec::with_capacity(file.gpus.len());
    for (position, spec) in file.gpus.iter().enumerate() {
        let field = format!("gpus[{position}]");
        let model = file.models.get(&spec.model).ok_or_else(|| {
            check.invalid(
                format!("{field}.model"),
                format!("no model {:?} under models", spec.model),
            )
        })?;
        let model_field = format!("models.{}", spec.model);
        let table = match &model.mig_profiles {
            Some(key) => Some(tables.get(key.as_str()).ok_or_else(|| {
                check.invalid(
                    format!("{model_field}.migProfiles"),
                    format!("no table {key:?} under migProfileTables"),
                )
            })?),
            None => None,
        };
        gpus.push(build_gpu(
            &check,
            file,
            position,
            spec,
            model,
            &model_field,
            table,
        )?);
    }
    check_unique(&check, &gpus)?;
    add_nvlinks(&check, file, &mut gpus)?;
    Ok(Inventory {
        driver_version: file.driver_version.clone(),
        cuda_driver_version,
        gpus,
    })
}

fn build_table(
    check: &Checker<'_>,
    key: &str,
    rows: &[MigProfileRow],
) -> Result<Vec<MigProfileInfo>, ProfileError> {
    let mut ids = BTreeSet::new();
    let mut names = BTreeSet::new();
    rows.iter()
        .enumerate()
        .map(|(i, row)| {
            let field = format!("migProfileTables.{key}[{i}]");
            if !ids.insert(row.id) {
                return Err(check.invalid(
                    format!("{field}.id"),
                    format!("profile ID {} appears twice", row.id),
                ));
            }
            if !names.insert(row.name.as_str()) {
                return Err(check.invalid(
                    format!("{field}.name"),
                    format!("{:?} appears twice", row.name),
                ));
            }
            if row.slice_count == 0 || row.slice_count > COMPUTE_SLICES {
                return Err(check.invalid(
                    format!("{field}.sliceCount"),
                    format!("{} is not within 1..={COMPUTE_SLICES}", row.slice_count),
                ));
            }
            if row.max_instances == 0 {
                return Err(check.invalid(format!("{field}.maxInstances"), "must be at least 1"));
            }
            let placements = parse_placements(&row.placements).ok_or_else(|| {
                check.invalid(
                    format!("{field}.placements"),
                    format!("{:?} is not of the form {{0,2,4}}:2", row.placements),
                )
            })?;
            if let Some(bad) = placements
                .iter()
                .find(|p| p.size == 0 || p.start + p.size > MEMORY_SLICES)
            {
                return Err(check.invalid(
                    format!("{field}.placements"),
                    format!("placement {bad} does not fit in {MEMORY_SLICES} memory slices"),
                ));
            }
            Ok(MigProfileInfo {
                id: row.id,
                name: row.name.clone(),
                slice_count: row.slice_count,
                max_instances: row.max_instances,
                memory_mib: row.memory_mib,
                engines: MigEngines {
                    multiprocessors: row.multiprocessors,
                    copy_engines: row.copy_engines,
                    decoders: row.decoders,
                    encoders: row.encoders,
                    jpeg_engines: row.jpeg_engines,
                    ofa_engines: row.ofa_engines,
                },
                placements,
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(|mut profiles| {
            crate::backend::sort_mig_profiles(&mut profiles);
            profiles
        })
}

/// `{0,2,4}:2` (or `{0}:8`, or `0:8`) into placements.
fn parse_placements(text: &str) -> Option<Vec<MigPlacement>> {
    let (starts, size) = text.trim().rsplit_once(':')?;
    let size: u32 = size.trim().parse().ok()?;
    let starts = starts.trim();
    let starts = starts
        .strip_prefix('{')
        .and_then(|rest| rest.strip_suffix('}'))
        .unwrap_or(starts);
    let placements = starts
        .split(',')
        .map(|start| {
            start
                .trim()
                .parse()
                .ok()
                .map(|start| MigPlacement::new(start, size))
        })
        .collect::<Option<Vec<_>>>()?;
    (!placements.is_empty()).then_some(placements)
}

fn parse_hex_u16(text: &str) -> Option<u16> {
    let digits = text
        .trim()
        .strip_prefix("0x")
        .or_else(|| text.trim().strip_prefix("0X"))?;
    u16::from_str_radix(digits, 16).ok()
}

fn parse_hex_u32(text: &str) -> Option<u32> {
    let digits = text
        .trim()
        .strip_prefix("0x")
        .or_else(|| text.trim().strip_prefix("0X"))?;
    u32::from_str_radix(digits, 16).ok()
}

/// A stable, UUID-shaped identifier from text (FNV-1a, 128 bits from two seeds): the same
/// profile always yields the same UUIDs.
fn derived_uuid(prefix: &str, seed: &str) -> String {
    let fnv = |offset: u64| {
        seed.bytes().fold(offset, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    let (high, low) = (fnv(0xcbf2_9ce4_8422_2325), fnv(0x6c62_272e_07bb_0142));
    let hex = format!("{high:016x}{low:016x}");
    format!(
        "{prefix}-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

fn build_gpu(
    check: &Checker<'_>,
    file: &ProfileFile,
    position: usize,
    spec: &GpuSpec,
    model: &ModelSpec,
    model_field: &str,
    table: Option<&Vec<MigProfileInfo>>,
) -> Result<GpuInventory, ProfileError> {
    let field = format!("gpus[{position}]");
    let profile_name = file.name.as_deref().unwrap_or(check.source_name);
    let index = match spec.index {
        Some(index) => index,
        None => u32::try_from(position).map_err(|_| check.invalid(&field, "too many GPUs"))?,
    };
    let minor = spec.minor.unwrap_or(index);
    let uuid = spec
        .uuid
        .clone()
        .unwrap_or_else(|| derived_uuid("GPU", &format!("{profile_name}/gpu/{index}")));
    if !uuid.starts_with("GPU-") {
        return Err(check.invalid(
            format!("{field}.uuid"),
            format!("{uuid:?} does not start with GPU-"),
        ));
    }
    let compute_capability: ComputeCapability =
        model
            .compute_capability
            .parse()
            .map_err(|error: BackendError| {
                check.invalid(
                    format!("{model_field}.computeCapability"),
                    error.to_string(),
                )
            })?;
    let device_id = parse_hex_u16(&model.pci_device_id).ok_or_else(|| {
        check.invalid(
            format!("{model_field}.pciDeviceId"),
            format!(
                "{:?} is not a 16-bit hex number like \"0x20b2\"",
                model.pci_device_id
            ),
        )
    })?;
    let vendor_id = match &model.pci_vendor_id {
        Some(text) => parse_hex_u16(text).ok_or_else(|| {
            check.invalid(
                format!("{model_field}.pciVendorId"),
                format!("{text:?} is not a 16-bit hex number like \"0x10de\""),
            )
        })?,
        None => 0x10de,
    };
    let mut pci = PciInfo::new(&spec.pci_bus_id, vendor_id, device_id)
        .map_err(|error| check.invalid(format!("{field}.pciBusId"), error.to_string()))?;
    if let Some(text) = &model.pci_subsystem_id {
        pci.subsystem_id = Some(parse_hex_u32(text).ok_or_else(|| {
            check.invalid(
                format!("{model_field}.pciSubsystemId"),
                format!("{text:?} is not a 32-bit hex number like \"0x145f10de\""),
            )
        })?);
    }
    let mig_mode = match (table, &spec.mig_mode) {
        (None, None) => None,
        (None, Some(_)) => {
            return Err(check.invalid(
                format!("{field}.migMode"),
                format!(
                    "model {:?} has no migProfiles: it does not support MIG",
                    spec.model
                ),
            ));
        }
        (Some(_), None) => Some(MigMode::settled(false)),
        (Some(_), Some(MigModeSpec::Word(word))) => match word.as_str() {
            "enabled" => Some(MigMode::settled(true)),
            "disabled" => Some(MigMode::settled(false)),
            other => {
                return Err(check.invalid(
                    format!("{field}.migMode"),
                    format!("{other:?} is not enabled, disabled or {{current, pending}}"),
                ));
            }
        },
        (Some(_), Some(MigModeSpec::Explicit { current, pending })) => Some(MigMode {
            current: *current,
            pending: *pending,
        }),
    };
    let mig_profiles = table.cloned().unwrap_or_default();
    let mig_devices = build_mig_devices(
        check,
        profile_name,
        &field,
        spec,
        &uuid,
        mig_mode,
        &mig_profiles,
    )?;
    Ok(GpuInventory {
        info: GpuInfo {
            index,
            minor,
            uuid,
            product_name: model.product_name.clone(),
            brand: model.brand.clone(),
            architecture: model.architecture.clone(),
            cuda_compute_capability: compute_capability,
            memory_bytes: model.memory_mib.saturating_mul(1024 * 1024),
            pci,
            numa_node: spec.numa_node,
            pcie_root: spec.pcie_root.clone(),
            addressing_mode: model.addressing_mode.clone(),
        },
        mig_mode,
        mig_devices,
        mig_profiles,
        nvlinks: Vec::new(),
        nvlink_peers: None,
    })
}

/// The GPUs' NVLinks and peers from the profile, checked: a link's far end parses, a link
/// between two GPUs is listed at both ends as often, peers are other GPUs with a link up.
/// Peers not listed are what the links say ([`nvlinks_connect`]), as NVML's answer would be
/// on a machine whose NVSwitches it sees.
fn add_nvlinks(
    check: &Checker<'_>,
    file: &ProfileFile,
    gpus: &mut [GpuInventory],
) -> Result<(), ProfileError> {
    for (position, (spec, gpu)) in file.gpus.iter().zip(gpus.iter_mut()).enumerate() {
        let field = format!("gpus[{position}].nvlinks");
        if spec.nvlinks.len() > MAX_NVLINKS {
            return Err(check.invalid(
                field,
                format!(
                    "{} links; NVML reports at most {MAX_NVLINKS} (NVML_NVLINK_MAX_LINKS)",
                    spec.nvlinks.len()
                ),
            ));
        }
        let mut links = Vec::with_capacity(spec.nvlinks.len());
        for (link, end) in (0..).zip(&spec.nvlinks) {
            let invalid = |reason: String| check.invalid(format!("{field}[{link}]"), reason);
            links.push(match end.as_deref() {
                None => NvLink::inactive(link),
                Some(UNKNOWN_LINK_END) => {
                    NvLink::active(link, None).map_err(|error| invalid(error.to_string()))?
                }
                Some(bus_id) => {
                    let link = NvLink::active(link, Some(bus_id)).map_err(|error| {
                        invalid(format!("{error} (or write {UNKNOWN_LINK_END} or null)"))
                    })?;
                    if link.remote_pci_bus_id.as_deref() == Some(gpu.info.pci.bus_id.as_str()) {
                        return Err(invalid("a GPU's link cannot end at the GPU itself".into()));
                    }
                    link
                }
            });
        }
        gpu.nvlinks = links;
    }

    let bus_ids: Vec<String> = gpus.iter().map(|gpu| gpu.info.pci.bus_id.clone()).collect();
    let links_to = |gpu: &GpuInventory, bus_id: &str| {
        gpu.nvlinks
            .iter()
            .filter(|link| link.remote_pci_bus_id.as_deref() == Some(bus_id))
            .count()
    };
    for (position, gpu) in gpus.iter().enumerate() {
        for (other_position, other) in gpus.iter().enumerate() {
            let (there, back) = (
                links_to(gpu, &other.info.pci.bus_id),
                links_to(other, &gpu.info.pci.bus_id),
            );
            if there != back {
                return Err(check.invalid(
                    format!("gpus[{position}].nvlinks"),
                    format!(
                        "{there} links end at gpus[{other_position}] ({}), which lists {back} back",
                        other.info.pci.bus_id
                    ),
                ));
            }
        }
    }

    let linked = |gpu: &GpuInventory| gpu.nvlinks.iter().any(|link| link.active);
    let bus_id_refs: Vec<&str> = bus_ids.iter().map(String::as_str).collect();
    let mut peers = Vec::with_capacity(gpus.len());
    for (position, (spec, gpu)) in file.gpus.iter().zip(gpus.iter()).enumerate() {
        let field = format!("gpus[{position}].nvlinkPeers");
        let listed = match &spec.nvlink_peers {
            Some(listed) if !linked(gpu) => {
                if listed.is_empty() {
                    None
                } else {
                    return Err(check.invalid(field, "peers need a link that is up in nvlinks"));
                }
            }
            Some(listed) => {
                let mut uuids = BTreeSet::new();
                for (n, peer) in listed.iter().enumerate() {
                    let bus_id = normalize_pci_bus_id(peer).map_err(|error| {
                        check.invalid(format!("{field}[{n}]"), error.to_string())
                    })?;
                    match gpus.iter().find(|other| other.info.pci.bus_id == bus_id) {
                        Some(other) if other.info.uuid != gpu.info.uuid && linked(other) => {
                            uuids.insert(other.info.uuid.clone());
                        }
                        _ => {
                            return Err(check.invalid(
                                format!("{field}[{n}]"),
                                format!(
                                    "{bus_id} is not another GPU of the profile with a link up"
                                ),
                            ));
                        }
                    }
                }
                Some(uuids)
            }
            None => None,
        };
        // In NVML order, as GpuBackend::inventory asks.
        peers.push(linked(gpu).then(|| {
            gpus.iter()
                .filter(|other| other.info.uuid != gpu.info.uuid && linked(other))
                .filter(|other| match &listed {
                    Some(listed) => listed.contains(&other.info.uuid),
                    None => nvlinks_connect(
                        (&gpu.info.pci.bus_id, &gpu.nvlinks),
                        (&other.info.pci.bus_id, &other.nvlinks),
                        &bus_id_refs,
                    ),
                })
                .map(|other| other.info.uuid.clone())
                .collect::<Vec<_>>()
        }));
    }
    for (gpu, peers) in gpus.iter_mut().zip(peers) {
        gpu.nvlink_peers = peers;
    }
    Ok(())
}

fn build_mig_devices(
    check: &Checker<'_>,
    profile_name: &str,
    field: &str,
    spec: &GpuSpec,
    gpu_uuid: &str,
    mig_mode: Option<MigMode>,
    profiles: &[MigProfileInfo],
) -> Result<Vec<MigDeviceInfo>, ProfileError> {
    if spec.mig_devices.is_empty() {
        return Ok(Vec::new());
    }
    if !mig_mode.is_some_and(|mode| mode.current) {
        return Err(check.invalid(
            format!("{field}.migDevices"),
            "MIG devices need migMode enabled (current: true)",
        ));
    }
    let mut devices: Vec<MigDeviceInfo> = Vec::with_capacity(spec.mig_devices.len());
    let mut per_profile: BTreeMap<u32, u32> = BTreeMap::new();
    let mut compute_slices = 0;
    for (i, device) in spec.mig_devices.iter().enumerate() {
        let field = format!("{field}.migDevices[{i}]");
        let profile = profiles
            .iter()
            .find(|profile| profile.name == device.profile)
            .ok_or_else(|| {
                check.invalid(
                    format!("{field}.profile"),
                    format!(
                        "{:?} is not in this GPU's profile table ({})",
                        device.profile,
                        profiles
                            .iter()
                            .map(|p| p.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })?;
        let placement = profile
            .placements
            .iter()
            .find(|placement| placement.start == device.placement)
            .copied()
            .ok_or_else(|| {
                check.invalid(
                    format!("{field}.placement"),
                    format!(
                        "{} is not a placement start of {} (possible: {})",
                        device.placement,
                        profile.name,
                        profile
                            .placements
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })?;
        if let Some(other) = devices
            .iter()
            .find(|other| other.placement.overlaps(&placement))
        {
            return Err(check.invalid(
                format!("{field}.placement"),
                format!(
                    "{} at {placement} overlaps {} at {} (GPU instance {})",
                    profile.name, other.profile, other.placement, other.gpu_instance_id
                ),
            ));
        }
        if devices
            .iter()
            .any(|other| other.gpu_instance_id == device.gpu_instance_id)
        {
            return Err(check.invalid(
                format!("{field}.gpuInstanceId"),
                format!(
                    "GPU instance {} appears twice on this GPU",
                    device.gpu_instance_id
                ),
            ));
        }
        let count = per_profile.entry(profile.id).or_default();
        *count += 1;
        if *count > profile.max_instances {
            return Err(check.invalid(
                format!("{field}.profile"),
                format!(
                    "more than {} instances of {}",
                    profile.max_instances, profile.name
                ),
            ));
        }
        compute_slices += profile.slice_count;
        if compute_slices > COMPUTE_SLICES {
            return Err(check.invalid(
                format!("{field}.profile"),
                format!("the MIG devices use more than {COMPUTE_SLICES} compute slices"),
            ));
        }
        let uuid = device.uuid.clone().unwrap_or_else(|| {
            derived_uuid(
                "MIG",
                &format!(
                    "{profile_name}/{gpu_uuid}/gi{}/ci{}",
                    device.gpu_instance_id, device.compute_instance_id
                ),
            )
        });
        if !uuid.starts_with("MIG-") {
            return Err(check.invalid(
                format!("{field}.uuid"),
                format!("{uuid:?} does not start with MIG-"),
            ));
        }
        devices.push(MigDeviceInfo {
            uuid,
            gpu_instance_id: device.gpu_instance_id,
            compute_instance_id: device.compute_instance_id,
            profile_id: profile.id,
            profile: profile.name.clone(),
            placement,
            memory_bytes: device
                .memory_mib
                .unwrap_or(profile.memory_mib)
                .saturating_mul(1024 * 1024),
            engines: profile.engines,
        });
    }
    Ok(devices)
}

fn check_unique(check: &Checker<'_>, gpus: &[GpuInventory]) -> Result<(), ProfileError> {
    let mut seen: BTreeMap<(&str, String), usize> = BTreeMap::new();
    for (position, gpu) in gpus.iter().enumerate() {
        let keys = [
            ("index", gpu.info.index.to_string()),
            ("minor", gpu.info.minor.to_string()),
            ("uuid", gpu.info.uuid.clone()),
            ("pciBusId", gpu.info.pci.bus_id.clone()),
        ];
        for (name, value) in keys {
            if let Some(first) = seen.insert((name, value.clone()), position) {
                return Err(check.invalid(
                    format!("gpus[{position}].{name}"),
                    format!("{value} is already used by gpus[{first}]"),
                ));
            }
        }
        for device in &gpu.mig_devices {
            if let Some(first) = seen.insert(("uuid", device.uuid.clone()), position) {
                return Err(check.invalid(
                    format!("gpus[{position}].migDevices"),
                    format!("UUID {} is already used by gpus[{first}]", device.uuid),
                ));
            }
        }
    }
    Ok(())
}

// ---- writing profiles ------------------------------------------------------------------

/// Writes `inventory` as a hardware profile in the schema above, so that a machine read
/// through NVML (`gpu-kubelet-plugin --print-profile`) becomes a mock profile holding its
/// real values. Everything is explicit (UUIDs, indexes, minors, GPU instance IDs); loading
/// the text with [`MockBackend::from_yaml`] gives the same inventory back, except memory
/// sizes, which the schema holds in whole MiB.
///
/// ```
/// use dra_driver_nvidia::backend::mock::{MockBackend, to_profile_yaml};
///
/// let machine = MockBackend::from_profile("mixed")?;
/// let yaml = to_profile_yaml("copy", "a copy of mixed", machine.hardware());
/// let copy = MockBackend::from_yaml("copy.yaml", &yaml)?;
/// assert_eq!(copy.hardware(), machine.hardware());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn to_profile_yaml(name: &str, description: &str, inventory: &Inventory) -> String {
    use std::fmt::Write as _;
    // JSON strings are YAML double-quoted scalars: no escaping rules of our own.
    let quote = |text: &str| serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into());
    let mib = |bytes: u64| bytes / (1024 * 1024);
    let mut out = String::new();
    // Writing to a String cannot fail; the results are ignored for that reason.
    let _ = writeln!(
        out,
        "# Written by dra-driver-nvidia from what the backend reported."
    );
    let _ = writeln!(out, "name: {}", quote(name));
    let _ = writeln!(out, "description: {}", quote(description));
    let _ = writeln!(out, "driverVersion: {}", quote(&inventory.driver_version));
    let _ = writeln!(
        out,
        "cudaDriverVersion: {}",
        quote(&inventory.cuda_driver_version.to_string())
    );

    // One model (and MIG table) per distinct set of GPU properties, in order of appearance.
    let model_of = |gpu: &GpuInventory| {
        (
            gpu.info.product_name.clone(),
            gpu.info.brand.clone(),
            gpu.info.architecture.clone(),
            gpu.info.cuda_compute_capability,
            mib(gpu.info.memory_bytes),
            gpu.info.pci.vendor_id,
            gpu.info.pci.device_id,
            gpu.info.pci.subsystem_id,
            gpu.info.addressing_mode.clone(),
            gpu.mig_mode.map(|_| gpu.mig_profiles.clone()),
        )
    };
    let mut models: Vec<(String, GpuInventory)> = Vec::new();
    let mut model_keys = Vec::with_capacity(inventory.gpus.len());
    for gpu in &inventory.gpus {
        let key = match models
            .iter()
            .find(|(_, seen)| model_of(seen) == model_of(gpu))
        {
            Some((key, _)) => key.clone(),
            None => {
                let key = format!("model-{}", models.len());
                models.push((key.clone(), gpu.clone()));
                key
            }
        };
        model_keys.push(key);
    }
    if models.iter().any(|(_, gpu)| gpu.mig_mode.is_some()) {
        let _ = writeln!(out, "migProfileTables:");
        for (key, gpu) in models.iter().filter(|(_, gpu)| gpu.mig_mode.is_some()) {
            let _ = writeln!(out, "  {key}:");
            if gpu.mig_profiles.is_empty() {
                let _ = writeln!(out, "    []");
            }
            for profile in &gpu.mig_profiles {
                let starts: Vec<String> = profile
                    .placements
                    .iter()
                    .map(|placement| placement.start.to_string())
                    .collect();
                let size = profile
                    .placements
                    .first()
                    .map_or(0, |placement| placement.size);
                let _ = writeln!(
                    out,
                    "    - {{ id: {}, name: {}, sliceCount: {}, maxInstances: {}, memoryMiB: {}, \
                     multiprocessors: {}, copyEngines: {}, decoders: {}, encoders: {}, \
                     jpegEngines: {}, ofaEngines: {}, placements: \"{{{}}}:{size}\" }}",
                    profile.id,
                    quote(&profile.name),
                    profile.slice_count,
                    profile.max_instances,
                    profile.memory_mib,
                    profile.engines.multiprocessors,
                    profile.engines.copy_engines,
                    profile.engines.decoders,
                    profile.engines.encoders,
                    profile.engines.jpeg_engines,
                    profile.engines.ofa_engines,
                    starts.join(","),
                );
            }
        }
    }
    let _ = writeln!(out, "models:");
    for (key, gpu) in &models {
        let info = &gpu.info;
        let _ = writeln!(out, "  {key}:");
        let _ = writeln!(out, "    productName: {}", quote(&info.product_name));
        let _ = writeln!(out, "    brand: {}", quote(&info.brand));
        let _ = writeln!(out, "    architecture: {}", quote(&info.architecture));
        let _ = writeln!(
            out,
            "    computeCapability: {}",
            quote(&info.cuda_compute_capability.to_string())
        );
        let _ = writeln!(out, "    memoryMiB: {}", mib(info.memory_bytes));
        let _ = writeln!(out, "    pciDeviceId: \"{:#06x}\"", info.pci.device_id);
        let _ = writeln!(out, "    pciVendorId: \"{:#06x}\"", info.pci.vendor_id);
        if let Some(subsystem) = info.pci.subsystem_id {
            let _ = writeln!(out, "    pciSubsystemId: \"{subsystem:#010x}\"");
        }
        if let Some(mode) = &info.addressing_mode {
            let _ = writeln!(out, "    addressingMode: {}", quote(mode));
        }
        if gpu.mig_mode.is_some() {
            let _ = writeln!(out, "    migProfiles: {key}");
        }
    }
    let _ = writeln!(out, "gpus:");
    for (gpu, key) in inventory.gpus.iter().zip(&model_keys) {
        let info = &gpu.info;
        let _ = writeln!(out, "  - model: {key}");
        let _ = writeln!(out, "    pciBusId: {}", quote(&info.pci.bus_id));
        let _ = writeln!(out, "    index: {}", info.index);
        let _ = writeln!(out, "    minor: {}", info.minor);
        let _ = writeln!(out, "    uuid: {}", quote(&info.uuid));
        if let Some(node) = info.numa_node {
            let _ = writeln!(out, "    numaNode: {node}");
        }
        if let Some(root) = &info.pcie_root {
            let _ = writeln!(out, "    pcieRoot: {}", quote(root));
        }
        if let Some(mode) = gpu.mig_mode {
            let _ = writeln!(
                out,
                "    migMode: {{ current: {}, pending: {} }}",
                mode.current, mode.pending
            );
        }
        if !gpu.nvlinks.is_empty() {
            let ends: Vec<String> = gpu
                .nvlinks
                .iter()
                .map(|link| match (&link.remote_pci_bus_id, link.active) {
                    (_, false) => "null".to_owned(),
                    (Some(end), true) => quote(end),
                    (None, true) => UNKNOWN_LINK_END.to_owned(),
                })
                .collect();
            let _ = writeln!(out, "    nvlinks: [{}]", ends.join(", "));
        }
        if let Some(peers) = &gpu.nvlink_peers {
            let bus_ids: Vec<String> = peers
                .iter()
                .filter_map(|peer| inventory.gpu(peer))
                .map(|peer| quote(&peer.info.pci.bus_id))
                .collect();
            let _ = writeln!(out, "    nvlinkPeers: [{}]", bus_ids.join(", "));
        }
        if !gpu.mig_devices.is_empty() {
            let _ = writeln!(out, "    migDevices:");
            for mig in &gpu.mig_devices {
                let _ = writeln!(
                    out,
                    "      - {{ profile: {}, placement: {}, gpuInstanceId: {}, \
                     computeInstanceId: {}, uuid: {}, memoryMiB: {} }}",
                    quote(&mig.profile),
                    mig.placement.start,
                    mig.gpu_instance_id,
                    mig.compute_instance_id,
                    quote(&mig.uuid),
                    mib(mig.memory_bytes),
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
