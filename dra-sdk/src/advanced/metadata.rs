//! Device metadata for containers (KEP-5304, alpha in Kubernetes 1.36): per prepared claim and
//! request, a JSON file describing the allocated devices, bind-mounted read-only into the
//! containers that use the request through a CDI spec. Opt-in.
//!
//! [`MetadataWriter`] writes exactly what the Go helper `k8s.io/dynamic-resource-allocation`
//! v0.36 writes with `EnableDeviceMetadata(true)`, so applications (KubeVirt's virt-launcher,
//! the Go `devicemetadata` reader) find the same files:
//!
//! | What | Where |
//! |---|---|
//! | metadata file (host) | `<plugin data dir>/dra-device-metadata/<namespace>_<claim>/<request>/metadata.json` |
//! | metadata file (container) | `/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json`, or `…/resourceclaimtemplates/<pod claim name>/…` for claims made from a template |
//! | CDI spec | `<cdi dir>/<driver>_metadata_<claim uid>_<request>.json`, `cdiVersion` 0.5.0, kind `<driver>/metadata` |
//! | CDI device | `<driver>/metadata=<claim uid>_<request>`, to be added to the devices of that request |
//!
//! The file is a stream of `DeviceMetadata` objects, one per configured
//! [`MetadataVersion`], newest first, each followed by a newline; readers use the first they
//! understand. `metadata.generation` starts at 1 and grows with every
//! [`update_request`](MetadataWriter::update_request).
//!
//! `<request>` in paths is the base request; the object names the allocated subrequest
//! (`gpu/high-memory`) where the claim used a prioritized list.
//!
//! # In a driver
//!
//! A driver opts in by returning `true` from
//! [`Driver::device_metadata`](crate::driver::Driver::device_metadata); the plugin then does
//! everything: after each successful prepare it writes the files of every request, with the
//! attributes the devices are published with (so containers see what the scheduler matched),
//! adds each request's CDI device to the devices of that request (and to the checkpoint
//! record), and removes the files at unprepare, at the rollback of an interrupted prepare and,
//! at start, for every claim no checkpoint record names. A write failure fails the claim.
//! `examples/mock-gpu` runs with it on (`--device-metadata`).
//!
//! ```no_run
//! use dra_sdk::claim::{Claim, DriverError, RecordedClaim};
//! use dra_sdk::driver::{Driver, PreparedClaim};
//!
//! struct NicDriver;
//!
//! #[dra_sdk::async_trait]
//! impl Driver for NicDriver {
//!     type Config = ();
//!     fn device_metadata(&self) -> bool {
//!         true
//!     }
//!     async fn prepare(&self, _claim: &Claim<()>) -> Result<PreparedClaim, DriverError> {
//!         Ok(PreparedClaim::default())
//!     }
//!     async fn unprepare(&self, _: &RecordedClaim) -> Result<(), DriverError> {
//!         Ok(())
//!     }
//! }
//! ```
//!
//! [`update_request`](MetadataWriter::update_request) stays available to a driver that learns
//! more after prepare (a network interface's addresses); build the writer with the plugin's
//! data directory (`<plugins dir>/<driver>`) and CDI root.
//!
//! ```
//! use dra_sdk::advanced::metadata::{MetadataClaim, MetadataDevice, MetadataWriter};
//! use dra_sdk::claim::ClaimRef;
//!
//! # let plugin_dir = tempfile::tempdir()?;
//! # let cdi_dir = tempfile::tempdir()?;
//! let writer = MetadataWriter::new("gpu.example.com", plugin_dir.path(), cdi_dir.path());
//! let claim = MetadataClaim::from(ClaimRef::new("default", "gpu-claim", "0b7a41f6-ccd3-4b5c-9d7a-2f3e52e6a3f1"));
//! let devices = [MetadataDevice::new("gpu", "node-1", "gpu-0").attribute("model", "h100")];
//! let written = writer.write_claim(&claim, &devices)?;
//! assert_eq!(
//!     written.cdi_device_ids["gpu"],
//!     "gpu.example.com/metadata=0b7a41f6-ccd3-4b5c-9d7a-2f3e52e6a3f1_gpu",
//! );
//! writer.remove_claim(&claim)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeMap;
use std::fs::{self, DirBuilder, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::cdi::{self, CdiError, ContainerEdits, Kind, Mount, Spec};
use crate::claim::ClaimRef;
use crate::slices::{AttributeValue, Device};

/// Where metadata files appear inside containers.
pub const CONTAINER_DIR: &str = "/var/run/kubernetes.io/dra-device-attributes";
/// Subdirectory of [`CONTAINER_DIR`] for claims referenced by name from the pod.
pub const RESOURCE_CLAIMS_SUBDIR: &str = "resourceclaims";
/// Subdirectory of [`CONTAINER_DIR`] for claims made from a template, keyed by the pod's name
/// for the claim.
pub const RESOURCE_CLAIM_TEMPLATES_SUBDIR: &str = "resourceclaimtemplates";
/// Subdirectory of the plugin's data directory holding the files on the host.
pub const HOST_SUBDIR: &str = "dra-device-metadata";
/// Annotation the resource claim controller puts on claims made from a template: the name the
/// pod gives the claim (`pod.spec.resourceClaims[].name`).
pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";
/// `kind` of the metadata objects.
pub const KIND: &str = "DeviceMetadata";

/// `cdiVersion` of the metadata specs, as the Go helper writes them.
const CDI_VERSION: cdi::Version = cdi::Version::V0_5_0;
const FILE_MODE: u32 = 0o644;
const DIR_MODE: u32 = 0o755;
const HOST_FILE: &str = "metadata.json";
/// How old a directory without a metadata file must be before the plugin's sweep removes it.
const INCOMPLETE_AGE: Duration = Duration::from_secs(60);

/// A version of the metadata API written into the files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum MetadataVersion {
    /// `metadata.resource.k8s.io/v1alpha1`, the version of Kubernetes 1.36.
    V1Alpha1,
}

impl MetadataVersion {
    /// The `apiVersion` of objects of this version.
    pub fn api_version(self) -> &'static str {
        match self {
            MetadataVersion::V1Alpha1 => "metadata.resource.k8s.io/v1alpha1",
        }
    }
}

/// Why metadata could not be written, updated or removed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetadataError {
    /// A name that becomes a path component is empty, `.`/`..` or contains `/`.
    #[error("{what} {value:?} cannot be used in a metadata path")]
    InvalidName {
        /// Which name.
        what: &'static str,
        /// The name.
        value: String,
    },
    /// The ResourceClaim lacks its namespace, name or UID.
    #[error("the ResourceClaim has no {0}")]
    IncompleteClaim(&'static str),
    /// No metadata version configured.
    #[error("no metadata version configured")]
    NoVersions,
    /// A request of the claim has no metadata file to update.
    #[error("request {request:?} of claim {claim} has no metadata file (not prepared?)")]
    NotPrepared {
        /// The request.
        request: String,
        /// `<namespace>/<name>` of the claim.
        claim: String,
    },
    /// A file operation failed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was attempted.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// An existing metadata file could not be decoded.
    #[error("decoding metadata file {}: {source}", path.display())]
    Decode {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: serde_json::Error,
    },
    /// The CDI spec is invalid (a driver or claim name CDI does not accept).
    #[error(transparent)]
    Cdi(#[from] CdiError),
}

impl MetadataError {
    fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

/// The claim a metadata file describes: its identity, and for a claim made from a template
/// the pod's name for it.
///
/// ```
/// use dra_sdk::advanced::metadata::MetadataClaim;
/// use dra_sdk::claim::ClaimRef;
///
/// let claim = MetadataClaim::from(ClaimRef::new("default", "pod-gpu-x7k", "8f0c5d1e"))
///     .pod_claim_name("gpu");
/// assert_eq!(claim.claim.name, "pod-gpu-x7k");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MetadataClaim {
    /// The ResourceClaim.
    pub claim: ClaimRef,
    /// The pod's name for the claim, for claims made from a template (the
    /// [`POD_CLAIM_NAME_ANNOTATION`]); selects the `resourceclaimtemplates` path.
    pub pod_claim_name: Option<String>,
}

impl From<ClaimRef> for MetadataClaim {
    fn from(claim: ClaimRef) -> Self {
        Self {
            claim,
            pod_claim_name: None,
        }
    }
}

impl MetadataClaim {
    /// Sets the pod's name for a claim made from a template.
    pub fn pod_claim_name(mut self, name: impl Into<String>) -> Self {
        self.pod_claim_name = Some(name.into());
        self
    }

    /// Namespace, name, UID and the pod claim name annotation of a ResourceClaim.
    pub fn from_resource_claim(claim: &ResourceClaim) -> Result<Self, MetadataError> {
        let meta = &claim.metadata;
        let get = |value: &Option<String>, what| {
            value
                .clone()
                .filter(|v| !v.is_empty())
                .ok_or(MetadataError::IncompleteClaim(what))
        };
        Ok(Self {
            claim: ClaimRef::new(
                get(&meta.namespace, "namespace")?,
                get(&meta.name, "name")?,
                get(&meta.uid, "uid")?,
            ),
            pod_claim_name: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(POD_CLAIM_NAME_ANNOTATION))
                .filter(|name| !name.is_empty())
                .cloned(),
        })
    }

    fn describe(&self) -> String {
        format!("{}/{}", self.claim.namespace, self.claim.name)
    }
}

/// Network data of a device (KEP-4817's `NetworkDeviceData`), for network drivers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NetworkData {
    /// Interface name in the pod (`eth1`).
    pub interface_name: Option<String>,
    /// IP addresses in CIDR form (`10.1.2.3/24`).
    pub ips: Vec<String>,
    /// Hardware (MAC) address.
    pub hardware_address: Option<String>,
}

impl NetworkData {
    /// Empty network data; fill in with the setters.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the interface name.
    pub fn interface_name(mut self, name: impl Into<String>) -> Self {
        self.interface_name = Some(name.into());
        self
    }

    /// Adds an IP address (CIDR).
    pub fn ip(mut self, ip: impl Into<String>) -> Self {
        self.ips.push(ip.into());
        self
    }

    /// Sets the hardware address.
    pub fn hardware_address(mut self, address: impl Into<String>) -> Self {
        self.hardware_address = Some(address.into());
        self
    }
}

/// One prepared device as the metadata file describes it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct MetadataDevice {
    /// The request, `<request>` or `<request>/<subrequest>` for a prioritized list.
    pub request: String,
    /// Pool of the device.
    pub pool: String,
    /// Name of the device.
    pub device: String,
    /// Attributes, in ResourceSlice form (`model`, `resource.kubernetes.io/pciBusID`).
    pub attributes: BTreeMap<String, AttributeValue>,
    /// Network data, if any.
    pub network_data: Option<NetworkData>,
}

impl MetadataDevice {
    /// A device of `request` without attributes.
    pub fn new(
        request: impl Into<String>,
        pool: impl Into<String>,
        device: impl Into<String>,
    ) -> Self {
        Self {
            request: request.into(),
            pool: pool.into(),
            device: device.into(),
            attributes: BTreeMap::new(),
            network_data: None,
        }
    }

    /// Adds an attribute.
    pub fn attribute(mut self, name: impl Into<String>, value: impl Into<AttributeValue>) -> Self {
        self.attributes.insert(name.into(), value.into());
        self
    }

    /// Copies every attribute of a published device, so containers see what the scheduler saw.
    pub fn attributes_of(mut self, device: &Device) -> Self {
        self.attributes.extend(
            device
                .attributes
                .iter()
                .map(|(name, value)| (name.clone(), value.clone())),
        );
        self
    }

    /// Sets the network data.
    pub fn network_data(mut self, data: NetworkData) -> Self {
        self.network_data = Some(data);
        self
    }

    /// One entry per allocated device of `claim`, named by request (and subrequest), with the
    /// attributes the device is published with in `resources` (usually
    /// [`DriverContext::resources`](crate::context::DriverContext::resources)), so containers
    /// see what the scheduler matched.
    pub fn for_claim<C>(
        claim: &crate::claim::Claim<C>,
        resources: Option<&crate::slices::DriverResources>,
    ) -> Vec<Self> {
        claim
            .devices
            .iter()
            .map(|allocated| {
                let request = match &allocated.subrequest {
                    Some(sub) => format!("{}/{sub}", allocated.request),
                    None => allocated.request.clone(),
                };
                let device = &allocated.device;
                let metadata = Self::new(request, &device.pool, &device.name);
                let published = resources
                    .and_then(|r| r.pools.get(&device.pool))
                    .and_then(|pool| pool.devices.iter().find(|d| d.name == device.name));
                match published {
                    Some(device) => metadata.attributes_of(device),
                    None => metadata,
                }
            })
            .collect()
    }
}

/// What [`MetadataWriter::write_claim`] wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WrittenMetadata {
    /// Per base request, the CDI device to add to every device of that request.
    pub cdi_device_ids: BTreeMap<String, String>,
    /// Every file written (metadata files and CDI specs).
    pub files: Vec<PathBuf>,
}

/// The metadata files of one claim found on disk.
#[derive(Debug, Default)]
pub(crate) struct ClaimMetadataFiles {
    /// Its CDI specs.
    specs: Vec<PathBuf>,
    /// Its request files (`<claim dir>/<request>/metadata.json`).
    files: Vec<PathBuf>,
}

/// What [`MetadataWriter::list_claims`] found.
#[derive(Debug, Default)]
pub(crate) struct MetadataListing {
    /// The files, by the claim UID they name.
    pub(crate) claims: BTreeMap<String, ClaimMetadataFiles>,
    /// Directories holding no metadata file: a crash between creating a directory and its file,
    /// or a write in progress.
    pub(crate) incomplete: Vec<PathBuf>,
}

/// Writes, updates and removes the metadata files and CDI specs of prepared claims.
#[derive(Clone, Debug)]
pub struct MetadataWriter {
    driver: String,
    host_dir: PathBuf,
    cdi_dir: PathBuf,
    versions: Vec<MetadataVersion>,
}

impl MetadataWriter {
    /// A writer for `driver`, keeping files under `<plugin_data_dir>/dra-device-metadata` and
    /// CDI specs in `cdi_dir` (usually [`cdi::DEFAULT_CDI_ROOT`]), writing
    /// [`MetadataVersion::V1Alpha1`]. Nothing is touched before the first write.
    pub fn new(
        driver: impl Into<String>,
        plugin_data_dir: impl AsRef<Path>,
        cdi_dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            driver: driver.into(),
            host_dir: plugin_data_dir.as_ref().join(HOST_SUBDIR),
            cdi_dir: cdi_dir.into(),
            versions: vec![MetadataVersion::V1Alpha1],
        }
    }

    /// The versions to write, newest first (duplicates dropped). Fails when empty.
    pub fn versions(
        mut self,
        versions: impl IntoIterator<Item = MetadataVersion>,
    ) -> Result<Self, MetadataError> {
        let mut unique = Vec::new();
        for version in versions {
            if !unique.contains(&version) {
                unique.push(version);
            }
        }
        if unique.is_empty() {
            return Err(MetadataError::NoVersions);
        }
        self.versions = unique;
        Ok(self)
    }

    /// Where metadata files live on the host.
    pub fn host_dir(&self) -> &Path {
        &self.host_dir
    }

    /// Writes one metadata file and one CDI spec per request of `devices` (generation 1,
    /// replacing earlier files of the claim's requests), and returns the CDI device per base
    /// request. Devices with an empty request are skipped (they name no request directory).
    pub fn write_claim(
        &self,
        claim: &MetadataClaim,
        devices: &[MetadataDevice],
    ) -> Result<WrittenMetadata, MetadataError> {
        let _span =
            tracing::debug_span!("write_metadata", claim = %claim.describe(), uid = %claim.claim.uid)
                .entered();
        self.check_claim(claim)?;
        let mut by_request: BTreeMap<&str, Vec<&MetadataDevice>> = BTreeMap::new();
        for device in devices.iter().filter(|d| !d.request.is_empty()) {
            by_request.entry(&device.request).or_default().push(device);
        }
        let mut written = WrittenMetadata::default();
        for (request, devices) in by_request {
            let base = base_request(request);
            check_component("request", base)?;
            let file = self.host_file(claim, base);
            let dir = file.parent().unwrap_or(&self.host_dir);
            DirBuilder::new()
                .recursive(true)
                .mode(DIR_MODE)
                .create(dir)
                .map_err(|e| MetadataError::io("create metadata directory", dir, e))?;
            let stream = self.encode(claim, 1, request, &devices);
            write_atomically(&file, &stream)?;
            written.files.push(file.clone());

            let (spec_path, id) = self.write_spec(claim, base, &file)?;
            written.files.push(spec_path);
            written.cdi_device_ids.insert(base.to_owned(), id);
        }
        tracing::debug!(
            requests = written.cdi_device_ids.len(),
            "wrote device metadata"
        );
        Ok(written)
    }

    /// Rewrites the metadata of one request of a prepared claim with `devices`, one generation
    /// up; returns the new generation. For data known only after prepare (a network
    /// interface's addresses), before the containers start.
    ///
    /// The file is rewritten in place, not replaced: a bind mount holds on to the file it was
    /// made from, so a replaced file would stay invisible to containers already created.
    pub fn update_request(
        &self,
        claim: &MetadataClaim,
        request: &str,
        devices: &[MetadataDevice],
    ) -> Result<i64, MetadataError> {
        self.check_claim(claim)?;
        let base = base_request(request);
        check_component("request", base)?;
        let file = self.host_file(claim, base);
        let existing = match fs::read(&file) {
            Ok(existing) => existing,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(MetadataError::NotPrepared {
                    request: request.to_owned(),
                    claim: claim.describe(),
                });
            }
            Err(e) => return Err(MetadataError::io("read metadata file", file, e)),
        };
        let previous = first_object(&existing).map_err(|source| MetadataError::Decode {
            path: file.clone(),
            source,
        })?;
        let mut claim = claim.clone();
        if claim.pod_claim_name.is_none() {
            claim.pod_claim_name = previous.pod_claim_name;
        }
        let generation = previous.metadata.generation.saturating_add(1);
        let devices: Vec<&MetadataDevice> = devices.iter().collect();
        let stream = self.encode(&claim, generation, request, &devices);
        OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&file)
            .and_then(|mut f| f.write_all(&stream))
            .map_err(|e| MetadataError::io("rewrite metadata file", &file, e))?;
        tracing::debug!(claim = %claim.describe(), request, generation, "updated device metadata");
        Ok(generation)
    }

    /// Removes the claim's metadata files and CDI specs; missing files are success.
    pub fn remove_claim(&self, claim: &MetadataClaim) -> Result<(), MetadataError> {
        self.check_claim(claim)?;
        let dir = self.claim_dir(claim);
        match fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(MetadataError::io("remove metadata directory", dir, e)),
        }
        for (uid, path) in self.specs()? {
            if uid == claim.claim.uid {
                remove_file(&path)?;
            }
        }
        tracing::debug!(claim = %claim.describe(), "removed device metadata");
        Ok(())
    }

    /// Removes metadata of claims `keep` rejects (by claim UID): CDI specs named for this
    /// driver, request files that name a rejected UID, and request directories that hold no
    /// metadata file at all (a crash between creating the directory and the file). Returns the
    /// removed claim UIDs, sorted. Meant for a driver's own start-up with `keep` answering from
    /// the checkpoint; a file that cannot be decoded is kept and reported in the log. (The
    /// plugin's own sweep, for a driver that opts in, does more: it checks and removes each
    /// claim's files under the claim's lock, and keeps files written after it began.)
    pub fn remove_orphans(
        &self,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Vec<String>, MetadataError> {
        let listing = self.list_claims()?;
        let mut removed = Vec::new();
        for (uid, files) in &listing.claims {
            if !keep(uid) {
                self.remove_files(uid, files, None)?;
                removed.push(uid.clone());
            }
        }
        self.remove_incomplete(&listing.incomplete, None)?;
        Ok(removed)
    }

    /// The metadata files on disk, by the claim UID they name, and the request directories
    /// naming none. A request file that cannot be decoded is left out (and logged): whose it
    /// is cannot be told, so it is never removed.
    pub(crate) fn list_claims(&self) -> Result<MetadataListing, MetadataError> {
        let mut listing = MetadataListing::default();
        for (uid, path) in self.specs()? {
            listing.claims.entry(uid).or_default().specs.push(path);
        }
        for claim_dir in subdirectories(&self.host_dir)? {
            let requests = subdirectories(&claim_dir)?;
            if requests.is_empty() {
                listing.incomplete.push(claim_dir);
                continue;
            }
            for request_dir in requests {
                let file = request_dir.join(HOST_FILE);
                let contents = match fs::read(&file) {
                    Ok(contents) => contents,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        listing.incomplete.push(request_dir);
                        continue;
                    }
                    Err(e) => return Err(MetadataError::io("read", file, e)),
                };
                match first_object(&contents) {
                    Ok(object) => listing
                        .claims
                        .entry(object.metadata.uid)
                        .or_default()
                        .files
                        .push(file),
                    Err(source) => {
                        let error = MetadataError::Decode { path: file, source };
                        tracing::warn!(%error, "keeping a metadata file that cannot be decoded");
                    }
                }
            }
        }
        Ok(listing)
    }

    /// Removes the listed files of one claim (CDI specs, request files, then the directories
    /// they leave empty). With a `cutoff`, a file last modified at or after it, or whose
    /// modification time cannot be read, is kept: someone wrote it after the caller decided.
    /// Returns whether every file is gone. The plugin's sweep calls this holding the claim's
    /// lock, after the checkpoint (read under that lock) showed no instance records the claim.
    pub(crate) fn remove_files(
        &self,
        claim_uid: &str,
        files: &ClaimMetadataFiles,
        cutoff: Option<SystemTime>,
    ) -> Result<bool, MetadataError> {
        let mut all = true;
        for path in files.specs.iter().chain(&files.files) {
            if let Some(cutoff) = cutoff {
                // Read now, not at listing: the listing may be older than the claim's lock.
                let modified = match fs::metadata(path) {
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    metadata => metadata.and_then(|m| m.modified()).ok(),
                };
                if modified.is_none_or(|modified| modified >= cutoff) {
                    tracing::info!(claim_uid, path = %path.display(), "keeping device metadata written after the sweep started");
                    all = false;
                    continue;
                }
            }
            remove_file(path)?;
        }
        for file in &files.files {
            // Only empty directories go: another claim of the same name may be writing there.
            let request_dir = file.parent();
            for dir in [request_dir, request_dir.and_then(Path::parent)]
                .into_iter()
                .flatten()
            {
                let _ = fs::remove_dir(dir);
            }
        }
        Ok(all)
    }

    /// Removes request (or claim) directories that held no metadata file when listed, when
    /// nothing in them was modified at or after `cutoff` (and, with a cutoff, nothing in the
    /// last minute: a write may have just created the directory). No claim lock covers them:
    /// the claim they were for cannot be told.
    pub(crate) fn remove_incomplete(
        &self,
        dirs: &[PathBuf],
        cutoff: Option<SystemTime>,
    ) -> Result<(), MetadataError> {
        let now = SystemTime::now();
        for dir in dirs {
            if let Some(cutoff) = cutoff {
                let newest = newest_modification(dir);
                let old = newest.is_some_and(|newest| {
                    newest < cutoff
                        && now
                            .duration_since(newest)
                            .is_ok_and(|age| age >= INCOMPLETE_AGE)
                });
                if !old {
                    continue;
                }
            }
            match fs::remove_dir_all(dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(MetadataError::io("remove metadata directory", dir, e)),
            }
            if let Some(claim_dir) = dir.parent().filter(|parent| *parent != self.host_dir) {
                let _ = fs::remove_dir(claim_dir);
            }
            tracing::info!(path = %dir.display(), "removed incomplete device metadata");
        }
        Ok(())
    }

    /// `<host dir>/<namespace>_<name>`.
    fn claim_dir(&self, claim: &MetadataClaim) -> PathBuf {
        self.host_dir
            .join(format!("{}_{}", claim.claim.namespace, claim.claim.name))
    }

    fn host_file(&self, claim: &MetadataClaim, base_request: &str) -> PathBuf {
        self.claim_dir(claim).join(base_request).join(HOST_FILE)
    }

    /// The in-container path of a request's file.
    pub fn container_path(&self, claim: &MetadataClaim, base_request: &str) -> String {
        let file = format!("{}-metadata.json", self.driver);
        match claim.pod_claim_name.as_deref().filter(|n| !n.is_empty()) {
            Some(pod_claim) => format!(
                "{CONTAINER_DIR}/{RESOURCE_CLAIM_TEMPLATES_SUBDIR}/{pod_claim}/{base_request}/{file}"
            ),
            None => format!(
                "{CONTAINER_DIR}/{RESOURCE_CLAIMS_SUBDIR}/{}/{base_request}/{file}",
                claim.claim.name
            ),
        }
    }

    fn check_claim(&self, claim: &MetadataClaim) -> Result<(), MetadataError> {
        check_component("driver name", &self.driver)?;
        check_component("claim namespace", &claim.claim.namespace)?;
        check_component("claim name", &claim.claim.name)?;
        check_component("claim UID", &claim.claim.uid)?;
        if claim.claim.uid.contains('_') {
            // The UID is the part of the CDI file name between two underscores.
            return Err(MetadataError::InvalidName {
                what: "claim UID",
                value: claim.claim.uid.clone(),
            });
        }
        if let Some(pod_claim) = &claim.pod_claim_name {
            check_component("pod claim name", pod_claim)?;
        }
        Ok(())
    }

    fn encode(
        &self,
        claim: &MetadataClaim,
        generation: i64,
        request: &str,
        devices: &[&MetadataDevice],
    ) -> Vec<u8> {
        let mut stream = Vec::new();
        for version in &self.versions {
            let object = FileObject {
                kind: KIND.to_owned(),
                api_version: version.api_version().to_owned(),
                metadata: FileMeta {
                    name: claim.claim.name.clone(),
                    namespace: claim.claim.namespace.clone(),
                    uid: claim.claim.uid.clone(),
                    generation,
                },
                pod_claim_name: claim.pod_claim_name.clone(),
                requests: vec![FileRequest {
                    name: request.to_owned(),
                    devices: devices.iter().map(|d| self.file_device(d)).collect(),
                }],
            };
            // Serializing plain strings, numbers and maps cannot fail.
            if serde_json::to_writer_pretty(&mut stream, &object).is_ok() {
                stream.push(b'\n');
            }
        }
        stream
    }

    fn file_device(&self, device: &MetadataDevice) -> FileDevice {
        FileDevice {
            driver: self.driver.clone(),
            pool: device.pool.clone(),
            name: device.device.clone(),
            attributes: device
                .attributes
                .iter()
                .map(|(name, value)| (name.clone(), attribute_json(value)))
                .collect(),
            network_data: device.network_data.as_ref().map(|data| FileNetworkData {
                interface_name: data.interface_name.clone(),
                ips: data.ips.clone(),
                hardware_address: data.hardware_address.clone(),
            }),
        }
    }

    /// Writes the CDI spec that mounts `host_file`; returns its path and the device ID.
    fn write_spec(
        &self,
        claim: &MetadataClaim,
        base_request: &str,
        host_file: &Path,
    ) -> Result<(PathBuf, String), MetadataError> {
        let kind: Kind = format!("{}/metadata", self.driver).parse()?;
        let device_name = format!("{}_{base_request}", claim.claim.uid);
        let mount = Mount::new(
            host_file.to_string_lossy(),
            self.container_path(claim, base_request),
        )
        .options(["ro", "bind"]);
        let mut spec = Spec::new(kind.clone());
        spec.version = CDI_VERSION;
        spec.devices = vec![cdi::Device::new(
            device_name.clone(),
            ContainerEdits::new().mount(mount),
        )];
        spec.validate()?;
        let mut contents = spec.to_json_pretty()?;
        contents.push(b'\n');
        DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(&self.cdi_dir)
            .map_err(|e| MetadataError::io("create CDI directory", &self.cdi_dir, e))?;
        let path = self.cdi_dir.join(format!(
            "{}_metadata_{}_{base_request}.json",
            self.driver, claim.claim.uid
        ));
        write_atomically(&path, &contents)?;
        Ok((path, format!("{kind}={device_name}")))
    }

    /// This driver's metadata CDI specs: (claim UID, path).
    fn specs(&self) -> Result<Vec<(String, PathBuf)>, MetadataError> {
        let prefix = format!("{}_metadata_", self.driver);
        let entries = match fs::read_dir(&self.cdi_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(MetadataError::io("list CDI directory", &self.cdi_dir, e)),
        };
        let mut specs = Vec::new();
        for entry in entries {
            let entry =
                entry.map_err(|e| MetadataError::io("list CDI directory", &self.cdi_dir, e))?;
            let name = entry.file_name();
            let Some(rest) = name
                .to_str()
                .and_then(|n| n.strip_prefix(&prefix))
                .and_then(|n| n.strip_suffix(".json"))
            else {
                continue;
            };
            if let Some((uid, request)) = rest.split_once('_')
                && !uid.is_empty()
                && !request.is_empty()
            {
                specs.push((uid.to_owned(), entry.path()));
            }
        }
        Ok(specs)
    }
}

/// `gpu/high-memory` → `gpu`.
fn base_request(request: &str) -> &str {
    request.split_once('/').map_or(request, |(base, _)| base)
}

/// Names become path components: refuse anything that would leave the directory.
fn check_component(what: &'static str, value: &str) -> Result<(), MetadataError> {
    if value.is_empty() || value == "." || value == ".." || value.contains(['/', '\0']) {
        return Err(MetadataError::InvalidName {
            what,
            value: value.to_owned(),
        });
    }
    Ok(())
}

/// An attribute in ResourceSlice JSON form (`{"int": 1}`, `{"strings": ["a"]}`).
fn attribute_json(value: &AttributeValue) -> Value {
    match value {
        AttributeValue::Int(v) => json!({ "int": v }),
        AttributeValue::Bool(v) => json!({ "bool": v }),
        AttributeValue::String(v) => json!({ "string": v }),
        AttributeValue::Version(v) => json!({ "version": v }),
        AttributeValue::Ints(v) => json!({ "ints": v }),
        AttributeValue::Bools(v) => json!({ "bools": v }),
        AttributeValue::Strings(v) => json!({ "strings": v }),
        AttributeValue::Versions(v) => json!({ "versions": v }),
    }
}

/// Writes through a temporary file and a rename, so the runtime never reads half a file.
fn write_atomically(path: &Path, contents: &[u8]) -> Result<(), MetadataError> {
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = path.with_file_name(format!(".{file_name}.{:016x}.tmp", fastrand::u64(..)));
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(&temp)
        .and_then(|mut file| {
            // The umask may have narrowed the mode given at creation.
            file.set_permissions(Permissions::from_mode(FILE_MODE))?;
            file.write_all(contents)
        });
    if let Err(e) = written.and_then(|()| fs::rename(&temp, path)) {
        let _ = fs::remove_file(&temp);
        return Err(MetadataError::io("write", path, e));
    }
    Ok(())
}

fn remove_file(path: &Path) -> Result<(), MetadataError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(MetadataError::io("remove", path, e)),
    }
}

/// The directories directly under `dir`; none when it does not exist.
fn subdirectories(dir: &Path) -> Result<Vec<PathBuf>, MetadataError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(MetadataError::io("list metadata directory", dir, e)),
    };
    let mut dirs = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|e| MetadataError::io("list metadata directory", dir, e))?
            .path();
        if path.is_dir() {
            dirs.push(path);
        }
    }
    Ok(dirs)
}

/// The latest modification time of `dir` and what is in it, two levels deep; `None` when one
/// cannot be read.
fn newest_modification(dir: &Path) -> Option<SystemTime> {
    fn walk(path: &Path, depth: u8, newest: &mut SystemTime) -> Option<()> {
        let metadata = fs::symlink_metadata(path).ok()?;
        *newest = (*newest).max(metadata.modified().ok()?);
        if metadata.is_dir() && depth > 0 {
            for entry in fs::read_dir(path).ok()? {
                walk(&entry.ok()?.path(), depth - 1, newest)?;
            }
        }
        Some(())
    }
    let mut newest = SystemTime::UNIX_EPOCH;
    walk(dir, 2, &mut newest).map(|()| newest)
}

/// The first object of a metadata stream; every version carries the same identity.
fn first_object(stream: &[u8]) -> Result<FileObject, serde_json::Error> {
    serde_json::Deserializer::from_slice(stream)
        .into_iter::<FileObject>()
        .next()
        .unwrap_or_else(|| serde_json::from_slice(b"null"))
}

/// One `DeviceMetadata` object, with the field order of the Go encoder.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FileObject {
    kind: String,
    api_version: String,
    metadata: FileMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pod_claim_name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    requests: Vec<FileRequest>,
}

#[derive(Debug, Serialize, Deserialize)]
struct FileMeta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    uid: String,
    #[serde(default)]
    generation: i64,
}

#[derive(Debug, Serialize, Deserialize)]
struct FileRequest {
    name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    devices: Vec<FileDevice>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FileDevice {
    driver: String,
    pool: String,
    name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    attributes: BTreeMap<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    network_data: Option<FileNetworkData>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct FileNetworkData {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    interface_name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    ips: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hardware_address: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const DRIVER: &str = "gpu.example.com";
    const UID: &str = "0b7a41f6-ccd3-4b5c-9d7a-2f3e52e6a3f1";

    struct Dirs {
        plugin: tempfile::TempDir,
        cdi: tempfile::TempDir,
    }

    fn writer() -> (MetadataWriter, Dirs) {
        let dirs = Dirs {
            plugin: tempfile::tempdir().unwrap(),
            cdi: tempfile::tempdir().unwrap(),
        };
        (
            MetadataWriter::new(DRIVER, dirs.plugin.path(), dirs.cdi.path()),
            dirs,
        )
    }

    fn claim() -> MetadataClaim {
        MetadataClaim::from(ClaimRef::new("default", "gpu-claim", UID))
    }

    fn stream(path: &Path) -> Vec<Value> {
        let bytes = fs::read(path).unwrap();
        serde_json::Deserializer::from_slice(&bytes)
            .into_iter::<Value>()
            .map(Result::unwrap)
            .collect()
    }

    #[test]
    fn writes_the_go_helpers_files() {
        let (writer, dirs) = writer();
        let devices = [
            MetadataDevice::new("gpu/high-memory", "node-1", "gpu-0")
                .attribute("model", "h100")
                .attribute("index", 0i64)
                .attribute("resource.kubernetes.io/numaNode", vec![1i64]),
            MetadataDevice::new("gpu/high-memory", "node-1", "gpu-1"),
            MetadataDevice::new("nic", "node-1", "eth-0").network_data(
                NetworkData::new()
                    .interface_name("net1")
                    .ip("10.0.0.2/24")
                    .hardware_address("00:11:22:33:44:55"),
            ),
        ];
        let written = writer.write_claim(&claim(), &devices).unwrap();
        assert_eq!(
            written.cdi_device_ids,
            BTreeMap::from([
                ("gpu".to_owned(), format!("{DRIVER}/metadata={UID}_gpu")),
                ("nic".to_owned(), format!("{DRIVER}/metadata={UID}_nic")),
            ])
        );
        assert_eq!(written.files.len(), 4);

        let host = dirs
            .plugin
            .path()
            .join("dra-device-metadata/default_gpu-claim/gpu/metadata.json");
        let objects = stream(&host);
        assert_eq!(objects.len(), 1);
        assert_eq!(
            objects[0],
            json!({
                "kind": "DeviceMetadata",
                "apiVersion": "metadata.resource.k8s.io/v1alpha1",
                "metadata": {"name": "gpu-claim", "namespace": "default", "uid": UID, "generation": 1},
                "requests": [{
                    "name": "gpu/high-memory",
                    "devices": [
                        {"driver": DRIVER, "pool": "node-1", "name": "gpu-0", "attributes": {
                            "index": {"int": 0},
                            "model": {"string": "h100"},
                            "resource.kubernetes.io/numaNode": {"ints": [1]},
                        }},
                        {"driver": DRIVER, "pool": "node-1", "name": "gpu-1"},
                    ],
                }],
            })
        );
        let text = fs::read_to_string(&host).unwrap();
        assert!(text.starts_with("{\n  \"kind\": \"DeviceMetadata\",\n  \"apiVersion\""));
        assert!(text.ends_with("}\n"));
        assert_eq!(
            fs::metadata(&host).unwrap().permissions().mode() & 0o777,
            0o644
        );
        let nic = stream(
            &host
                .parent()
                .unwrap()
                .with_file_name("nic")
                .join("metadata.json"),
        );
        assert_eq!(
            nic[0]["requests"][0]["devices"][0]["networkData"],
            json!({"interfaceName": "net1", "ips": ["10.0.0.2/24"], "hardwareAddress": "00:11:22:33:44:55"})
        );

        let spec_path = dirs
            .cdi
            .path()
            .join(format!("{DRIVER}_metadata_{UID}_gpu.json"));
        let spec: Value = serde_json::from_slice(&fs::read(&spec_path).unwrap()).unwrap();
        assert_eq!(
            spec,
            json!({
                "cdiVersion": "0.5.0",
                "kind": format!("{DRIVER}/metadata"),
                "devices": [{
                    "name": format!("{UID}_gpu"),
                    "containerEdits": {"mounts": [{
                        "hostPath": host.to_string_lossy(),
                        "containerPath": format!("/var/run/kubernetes.io/dra-device-attributes/resourceclaims/gpu-claim/gpu/{DRIVER}-metadata.json"),
                        "options": ["ro", "bind"],
                    }]},
                }],
            })
        );
        // The SDK's own CDI parser accepts it.
        Spec::read_file(&spec_path).unwrap();
    }

    #[test]
    fn template_claims_use_the_pod_claim_name() {
        let (writer, _dirs) = writer();
        let claim = claim().pod_claim_name("gpu");
        assert_eq!(
            writer.container_path(&claim, "req"),
            format!(
                "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpu/req/{DRIVER}-metadata.json"
            )
        );
        let written = writer
            .write_claim(&claim, &[MetadataDevice::new("req", "p", "d")])
            .unwrap();
        assert_eq!(stream(&written.files[0])[0]["podClaimName"], "gpu");
    }

    #[test]
    fn claims_come_from_resource_claims() {
        let object: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": "pod-gpu-x7k", "uid": UID,
                         "annotations": {POD_CLAIM_NAME_ANNOTATION: "gpu"}},
            "spec": {},
        }))
        .unwrap();
        assert_eq!(
            MetadataClaim::from_resource_claim(&object).unwrap(),
            MetadataClaim::from(ClaimRef::new("ns", "pod-gpu-x7k", UID)).pod_claim_name("gpu")
        );
        let mut nameless = object;
        nameless.metadata.uid = None;
        assert!(matches!(
            MetadataClaim::from_resource_claim(&nameless),
            Err(MetadataError::IncompleteClaim("uid"))
        ));
    }

    #[test]
    fn updates_bump_the_generation_in_place() {
        let (writer, _dirs) = writer();
        let written = writer
            .write_claim(
                &claim().pod_claim_name("net"),
                &[MetadataDevice::new("nic", "p", "eth-0")],
            )
            .unwrap();
        let file = &written.files[0];
        let inode = || std::os::unix::fs::MetadataExt::ino(&fs::metadata(file).unwrap());
        let before = inode();
        let updated = [MetadataDevice::new("nic", "p", "eth-0")
            .network_data(NetworkData::new().interface_name("net1"))];
        // The claim as unprepare knows it: no pod claim name; the file keeps it.
        assert_eq!(writer.update_request(&claim(), "nic", &updated).unwrap(), 2);
        assert_eq!(writer.update_request(&claim(), "nic", &updated).unwrap(), 3);
        assert_eq!(
            inode(),
            before,
            "rewritten in place for existing bind mounts"
        );
        let object = &stream(file)[0];
        assert_eq!(object["metadata"]["generation"], 3);
        assert_eq!(object["podClaimName"], "net");
        assert_eq!(
            object["requests"][0]["devices"][0]["networkData"]["interfaceName"],
            "net1"
        );
        assert!(matches!(
            writer.update_request(&claim(), "other", &updated),
            Err(MetadataError::NotPrepared { .. })
        ));
    }

    #[test]
    fn the_sweep_keeps_files_younger_than_its_start() {
        let (writer, _dirs) = writer();
        let device = [MetadataDevice::new("gpu", "node-1", "gpu-0")];
        let written = writer.write_claim(&claim(), &device).unwrap();
        fs::create_dir_all(writer.host_dir().join("default_half/a")).unwrap();
        let listing = writer.list_claims().unwrap();
        assert_eq!(listing.claims.keys().collect::<Vec<_>>(), [UID]);
        assert_eq!(listing.claims[UID].files.len(), 1);
        assert_eq!(listing.claims[UID].specs.len(), 1);
        assert_eq!(
            listing.incomplete,
            [writer.host_dir().join("default_half/a")]
        );

        // Written after the cutoff: kept, and so is the fresh directory without a file.
        let long_ago = SystemTime::UNIX_EPOCH;
        assert!(
            !writer
                .remove_files(UID, &listing.claims[UID], Some(long_ago))
                .unwrap()
        );
        writer
            .remove_incomplete(&listing.incomplete, Some(SystemTime::now()))
            .unwrap();
        assert!(written.files.iter().all(|file| file.exists()));
        assert!(writer.host_dir().join("default_half/a").exists());

        // Written before it: removed, with the directories they leave empty.
        let later = SystemTime::now() + Duration::from_secs(1);
        assert!(
            writer
                .remove_files(UID, &listing.claims[UID], Some(later))
                .unwrap()
        );
        assert!(written.files.iter().all(|file| !file.exists()));
        assert!(!writer.host_dir().join("default_gpu-claim").exists());
    }

    #[test]
    fn remove_claim_and_orphans() {
        let (writer, dirs) = writer();
        let other = MetadataClaim::from(ClaimRef::new(
            "default",
            "other",
            "11111111-2222-3333-4444-555555555555",
        ));
        writer
            .write_claim(
                &claim(),
                &[
                    MetadataDevice::new("a", "p", "d"),
                    MetadataDevice::new("b", "p", "d"),
                ],
            )
            .unwrap();
        writer
            .write_claim(&other, &[MetadataDevice::new("a", "p", "d")])
            .unwrap();
        // Another driver's spec and a crash leftover without a file.
        fs::write(
            dirs.cdi
                .path()
                .join(format!("other.example.com_metadata_{UID}_a.json")),
            "{}",
        )
        .unwrap();
        fs::create_dir_all(writer.host_dir().join("default_half/a")).unwrap();

        let removed = writer.remove_orphans(|uid| uid == UID).unwrap();
        assert_eq!(removed, vec![other.claim.uid.clone()]);
        assert!(!writer.host_dir().join("default_other").exists());
        assert!(!writer.host_dir().join("default_half").exists());
        assert!(
            writer
                .host_dir()
                .join("default_gpu-claim/b/metadata.json")
                .exists()
        );

        writer.remove_claim(&claim()).unwrap();
        writer.remove_claim(&claim()).unwrap();
        let left: Vec<_> = fs::read_dir(dirs.cdi.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, [format!("other.example.com_metadata_{UID}_a.json")]);
        assert_eq!(fs::read_dir(writer.host_dir()).unwrap().count(), 0);
    }

    #[test]
    fn several_versions_and_bad_names() {
        let (writer, _dirs) = writer();
        assert!(matches!(
            writer.clone().versions([]),
            Err(MetadataError::NoVersions)
        ));
        let writer = writer
            .versions([MetadataVersion::V1Alpha1, MetadataVersion::V1Alpha1])
            .unwrap();
        let written = writer
            .write_claim(&claim(), &[MetadataDevice::new("a", "p", "d")])
            .unwrap();
        assert_eq!(stream(&written.files[0]).len(), 1);
        for bad in [
            MetadataClaim::from(ClaimRef::new("default", "../x", UID)),
            MetadataClaim::from(ClaimRef::new("default", "c", "a_b")),
            MetadataClaim::from(ClaimRef::new("", "c", UID)),
        ] {
            assert!(matches!(
                writer.write_claim(&bad, &[]),
                Err(MetadataError::InvalidName { .. })
            ));
        }
        assert!(matches!(
            writer.write_claim(&claim(), &[MetadataDevice::new("..", "p", "d")]),
            Err(MetadataError::InvalidName { .. })
        ));
    }
}
