//! Per-claim transient spec files: written atomically on prepare, removed on unprepare, swept
//! for orphans at start.
//!
//! # File names
//!
//! A claim's spec is `<root>/<vendor>-<class>_<claimUID>.json`, the reference's
//! `GenerateTransientSpecName(vendor, class, claimUID)` plus `.json`, the convention of the
//! dra-example-driver and the NVIDIA driver. Its devices are named `<claimUID>-<name>`, so two
//! claims never define the same qualified name (runtimes make a name that two files of one
//! directory define unresolvable).
//!
//! # Atomicity
//!
//! The spec is written to a temporary file in the same directory, named
//! `.<vendor>=<class>_<claimUID>.<random>.tmp`: hidden, and without the `.json`/`.yaml`
//! extension runtimes scan for, so they never read it. It is then renamed over the final name,
//! which replaces the file atomically: a runtime sees the old spec or the new one, never a
//! part, even if the writer is killed at any point. The temporary name cannot clash with the
//! final name of another kind, because no vendor name contains `=`.
//!
//! There is no fsync: the CDI root (`/var/run/cdi`) is a per-boot tmpfs on nodes, and prepared
//! claims do not survive a reboot anyway. Pointing the writer at a directory on a persistent file
//! system is fine for a driver, but a power loss may then leave an empty or missing spec file of
//! a claim that the kubelet will prepare again after the reboot.

use std::collections::BTreeMap;
use std::fs::{self, DirBuilder, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::error::CdiError;
use super::name::{Kind, QualifiedName};
use super::spec::{ContainerEdits, Device, Spec, peek_kind};

/// The directory for generated and transient specs that runtimes read by default, with a higher
/// priority than the static `/etc/cdi`.
pub const DEFAULT_CDI_ROOT: &str = "/var/run/cdi";

/// Mode of spec files: readable by all (some runtimes and tools read specs without root, and the
/// NVIDIA toolkit uses the same), writable by the driver only.
pub const SPEC_FILE_MODE: u32 = 0o644;

/// Mode of the CDI root when the writer has to create it.
const ROOT_DIR_MODE: u32 = 0o755;

/// How old a temporary file of a claim that is still prepared must be before
/// [`SpecWriter::remove_orphans`] treats it as left behind by a crash. A write takes
/// microseconds; the margin covers another instance of the driver writing during a rolling
/// update.
const STALE_TEMP_AGE: Duration = Duration::from_secs(60);

/// Longest claim UID accepted (Kubernetes UIDs are 36-character UUIDs).
const MAX_CLAIM_UID_LEN: usize = 128;

/// One device of a prepared claim and the edits that inject it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimDevice {
    /// Unique within the claim: the device name, or device name and share ID. Combined with the
    /// claim UID into the CDI device name `<claimUID>-<name>`, so it must follow the device-name
    /// rules (letters, digits, `_`, `-`, `.`, `:`, ending in a letter or digit).
    pub name: String,
    /// What the runtime does to the container for this device; must not be empty.
    pub edits: ContainerEdits,
}

impl ClaimDevice {
    /// A claim device.
    pub fn new(name: impl Into<String>, edits: ContainerEdits) -> Self {
        ClaimDevice {
            name: name.into(),
            edits,
        }
    }
}

/// Writes and removes the per-claim CDI spec files of one driver (one CDI root, one kind).
///
/// ```no_run
/// use dra_sdk::advanced::cdi::{ClaimDevice, SpecWriter, DEFAULT_CDI_ROOT};
/// use dra_sdk::cdi::{ContainerEdits, DeviceNode};
///
/// let writer = SpecWriter::new(DEFAULT_CDI_ROOT, "k8s.gpu.example.com/gpu".parse()?);
/// let common = ContainerEdits::new().env("DRA_RESOURCE_DRIVER_NAME", "gpu.example.com");
/// let devices = [ClaimDevice::new(
///     "gpu-0",
///     ContainerEdits::new().env("GPU_DEVICE_0", "gpu-0").device_node(DeviceNode::new("/dev/gpu0")),
/// )];
/// let ids = writer.write_claim("0b7a41f6-ccd3-4b5c-9d7a-2f3e52e6a3f1", &common, &devices)?;
/// assert_eq!(
///     ids[0].to_string(),
///     "k8s.gpu.example.com/gpu=0b7a41f6-ccd3-4b5c-9d7a-2f3e52e6a3f1-gpu-0"
/// );
/// writer.remove_claim("0b7a41f6-ccd3-4b5c-9d7a-2f3e52e6a3f1")?;
/// # Ok::<(), dra_sdk::cdi::CdiError>(())
/// ```
#[derive(Clone, Debug)]
pub struct SpecWriter {
    root: PathBuf,
    kind: Kind,
    /// `<vendor>-<class>_`: the reference's transient-spec name up to the claim UID.
    file_prefix: String,
    /// `.<vendor>=<class>_`: the temporary-file name up to the claim UID.
    temp_prefix: String,
}

impl SpecWriter {
    /// A writer of `kind` specs in `root` (usually [`DEFAULT_CDI_ROOT`]). Nothing is touched
    /// until the first call; the root is created (mode 0755) on the first write if missing.
    pub fn new(root: impl Into<PathBuf>, kind: Kind) -> Self {
        let file_prefix = format!("{}-{}_", kind.vendor(), kind.class());
        let temp_prefix = format!(".{}={}_", kind.vendor(), kind.class());
        SpecWriter {
            root: root.into(),
            kind,
            file_prefix,
            temp_prefix,
        }
    }

    /// The CDI root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The kind of every spec this writer writes.
    pub fn kind(&self) -> &Kind {
        &self.kind
    }

    /// Where the spec of `claim_uid` lives.
    pub fn spec_path(&self, claim_uid: &str) -> Result<PathBuf, CdiError> {
        check_claim_uid(claim_uid)?;
        Ok(self.spec_path_with(claim_uid, "json"))
    }

    /// The qualified CDI name [`write_claim`](Self::write_claim) gives device `name` of
    /// `claim_uid`: `<vendor>/<class>=<claimUID>-<name>`.
    pub fn device_name(&self, claim_uid: &str, name: &str) -> Result<QualifiedName, CdiError> {
        check_claim_uid(claim_uid)?;
        QualifiedName::new(self.kind.clone(), format!("{claim_uid}-{name}"))
    }

    /// Writes the claim's transient spec atomically; returns the fully-qualified device names in
    /// the order of `devices`.
    ///
    /// `common` becomes the spec-level edits, applied once whenever any device of the claim is
    /// injected (left out when empty). The spec is validated in full before anything is
    /// written, declares the lowest `cdiVersion` its contents allow, and replaces any earlier
    /// spec of the claim. Fails without writing if `devices` is empty, a name repeats, or any
    /// rule is broken.
    pub fn write_claim(
        &self,
        claim_uid: &str,
        common: &ContainerEdits,
        devices: &[ClaimDevice],
    ) -> Result<Vec<QualifiedName>, CdiError> {
        check_claim_uid(claim_uid)?;
        let mut spec = Spec::new(self.kind.clone()).container_edits(common.clone());
        spec.devices = devices
            .iter()
            .map(|device| Device::new(format!("{claim_uid}-{}", device.name), device.edits.clone()))
            .collect();
        spec.set_minimum_version();
        spec.validate()?;
        let mut contents = spec.to_json()?;
        contents.push(b'\n');

        let target = self.spec_path_with(claim_uid, "json");
        self.write_atomically(claim_uid, &target, &contents)?;
        tracing::debug!(
            claim_uid,
            path = %target.display(),
            cdi_version = %spec.version,
            devices = spec.devices.len(),
            "wrote CDI spec"
        );
        Ok(spec
            .devices
            .into_iter()
            .map(|device| QualifiedName::new_unchecked(self.kind.clone(), device.name))
            .collect())
    }

    /// Removes the claim's spec; a missing file is success.
    ///
    /// Also removes a `.yaml` spec of the same name if it is of this writer's kind, as left by a
    /// Go driver this one replaced.
    pub fn remove_claim(&self, claim_uid: &str) -> Result<(), CdiError> {
        check_claim_uid(claim_uid)?;
        remove_if_exists(&self.spec_path_with(claim_uid, "json"))?;
        let yaml = self.spec_path_with(claim_uid, "yaml");
        match fs::read(&yaml) {
            Ok(document) if self.is_own_kind(&document) => remove_if_exists(&yaml)?,
            Ok(_) => {}
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(CdiError::io("read CDI spec", yaml, err)),
        }
        tracing::debug!(claim_uid, "removed CDI spec");
        Ok(())
    }

    /// Removes this kind's claim specs whose claim UID `keep` rejects; never touches other
    /// files. Returns the removed claim UIDs, sorted.
    ///
    /// Meant for start-up, before serving, with `keep` answering from the checkpoint: specs of
    /// claims a crash left behind are removed. A file counts as this writer's only if its name
    /// follows the transient-spec convention for this kind (`.json` or `.yaml`), the rest of the
    /// name is a valid claim UID, and its `kind` field is this kind, so a spec of another driver
    /// whose name happens to look alike (`a-b/c` and `a/b-c` share `a-b-c_`) survives. Temporary
    /// files of this kind are removed too when their claim is rejected or they are older than a
    /// minute.
    ///
    /// Every removal is attempted; the first error, if any, is returned at the end.
    pub fn remove_orphans(&self, keep: impl Fn(&str) -> bool) -> Result<Vec<String>, CdiError> {
        let scan = self.scan()?;
        let mut first_error = None;
        let mut removed = Vec::new();
        for (claim_uid, paths) in scan.specs {
            if keep(&claim_uid) {
                continue;
            }
            let mut ok = true;
            for (path, _) in paths {
                if let Err(err) = remove_if_exists(&path) {
                    tracing::warn!(claim_uid, error = %err, "cannot remove orphaned CDI spec");
                    first_error.get_or_insert(err);
                    ok = false;
                }
            }
            if ok {
                tracing::info!(claim_uid, "removed orphaned CDI spec");
                removed.push(claim_uid);
            }
        }
        let now = SystemTime::now();
        for (claim_uid, path, modified) in scan.temps {
            let stale = modified
                .and_then(|modified| now.duration_since(modified).ok())
                .is_some_and(|age| age >= STALE_TEMP_AGE);
            if !stale && keep(&claim_uid) {
                continue;
            }
            if let Err(err) = remove_if_exists(&path) {
                tracing::warn!(claim_uid, error = %err, "cannot remove stale temporary CDI spec");
                first_error.get_or_insert(err);
            }
        }
        match first_error {
            Some(err) => Err(err),
            None => Ok(removed),
        }
    }

    /// Claim UIDs that currently have a spec file of this kind, sorted; the same ownership test
    /// as [`remove_orphans`](Self::remove_orphans).
    pub fn claim_uids(&self) -> Result<Vec<String>, CdiError> {
        Ok(self.scan()?.specs.into_keys().collect())
    }

    /// This kind's files (specs and temporary files) by claim UID, with their modification
    /// times, for the plugin's start-up sweep.
    pub(crate) fn claim_files(&self) -> Result<BTreeMap<String, ClaimFiles>, CdiError> {
        let scan = self.scan()?;
        let mut files: BTreeMap<String, ClaimFiles> = BTreeMap::new();
        for (claim_uid, paths) in scan.specs {
            files.entry(claim_uid).or_default().specs = paths;
        }
        for (claim_uid, path, modified) in scan.temps {
            files
                .entry(claim_uid)
                .or_default()
                .temps
                .push((path, modified));
        }
        Ok(files)
    }

    /// Removes the listed files of one claim that were last modified before `cutoff`
    /// (temporary files also when older than a minute); a file without a readable modification
    /// time, or a younger one, is kept: someone wrote it after the caller decided. The caller
    /// holds the claim's lock and has checked that no instance records the claim (or, with
    /// `spec_too` false, that one does: then only stale temporary files go). Returns whether
    /// every spec was removed.
    pub(crate) fn remove_claim_files(
        &self,
        claim_uid: &str,
        files: &ClaimFiles,
        cutoff: SystemTime,
        spec_too: bool,
    ) -> Result<bool, CdiError> {
        let now = SystemTime::now();
        let mut all = true;
        let mut first_error = None;
        if spec_too {
            for (path, modified) in &files.specs {
                // Re-read: the listing may be older than the claim's lock.
                let modified = fs::metadata(path)
                    .and_then(|m| m.modified())
                    .ok()
                    .or(*modified);
                if modified.is_none_or(|modified| modified >= cutoff) {
                    tracing::info!(claim_uid, path = %path.display(), "keeping a CDI spec written after the sweep started");
                    all = false;
                    continue;
                }
                if let Err(err) = remove_if_exists(path) {
                    first_error.get_or_insert(err);
                    all = false;
                }
            }
        }
        for (path, modified) in &files.temps {
            let stale = modified
                .and_then(|modified| now.duration_since(modified).ok())
                .is_some_and(|age| age >= STALE_TEMP_AGE);
            let before = modified.is_some_and(|modified| modified < cutoff);
            if (stale || (spec_too && before))
                && let Err(err) = remove_if_exists(path)
            {
                first_error.get_or_insert(err);
            }
        }
        match first_error {
            Some(err) => Err(err),
            None => Ok(all),
        }
    }

    fn spec_path_with(&self, claim_uid: &str, extension: &str) -> PathBuf {
        self.root
            .join(format!("{}{claim_uid}.{extension}", self.file_prefix))
    }

    fn is_own_kind(&self, document: &[u8]) -> bool {
        peek_kind(document).is_some_and(|kind| kind == self.kind.to_string())
    }

    fn write_atomically(
        &self,
        claim_uid: &str,
        target: &Path,
        contents: &[u8],
    ) -> Result<(), CdiError> {
        // Errors name the spec's final path, the one an operator knows: the temporary file
        // sits next to it and is gone by the time the error is seen.
        let (temp_path, mut file) = self.create_temp(claim_uid, target)?;
        let written = file
            .set_permissions(Permissions::from_mode(SPEC_FILE_MODE))
            .and_then(|()| file.write_all(contents));
        drop(file);
        if let Err(err) = written {
            discard(&temp_path);
            return Err(CdiError::io("write CDI spec", target, err));
        }
        if let Err(err) = fs::rename(&temp_path, target) {
            discard(&temp_path);
            return Err(CdiError::io("rename CDI spec into place", target, err));
        }
        Ok(())
    }

    /// Creates a new temporary file for `target`, creating the root on the first `NotFound`.
    fn create_temp(&self, claim_uid: &str, target: &Path) -> Result<(PathBuf, File), CdiError> {
        let mut created_root = false;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let temp_path = self.root.join(format!(
                "{}{claim_uid}.{:016x}.tmp",
                self.temp_prefix,
                fastrand::u64(..)
            ));
            // The mode is set again with fchmod once open: the umask may have narrowed it.
            let opened = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(SPEC_FILE_MODE)
                .open(&temp_path);
            match opened {
                Ok(file) => return Ok((temp_path, file)),
                Err(err) if err.kind() == io::ErrorKind::NotFound && !created_root => {
                    DirBuilder::new()
                        .recursive(true)
                        .mode(ROOT_DIR_MODE)
                        .create(&self.root)
                        .map_err(|err| CdiError::io("create CDI root", &self.root, err))?;
                    created_root = true;
                }
                // 64 random bits clashing twice means something else is wrong; report it.
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists && attempts < 3 => {}
                Err(err) => return Err(CdiError::io("write CDI spec", target, err)),
            }
        }
    }

    /// This kind's spec files by claim UID, and its temporary files.
    fn scan(&self) -> Result<Scan, CdiError> {
        let mut scan = Scan::default();
        let entries = match fs::read_dir(&self.root) {
            Ok(entries) => entries,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(scan),
            Err(err) => return Err(CdiError::io("list CDI root", &self.root, err)),
        };
        for entry in entries {
            let entry = entry.map_err(|err| CdiError::io("list CDI root", &self.root, err))?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            // Never follow symlinks or descend: runtimes read regular files only, and only
            // regular files are ours.
            if !entry.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            if let Some(rest) = name.strip_prefix(&self.file_prefix) {
                let Some(claim_uid) = rest
                    .strip_suffix(".json")
                    .or_else(|| rest.strip_suffix(".yaml"))
                else {
                    continue;
                };
                if check_claim_uid(claim_uid).is_err() {
                    continue;
                }
                let path = entry.path();
                match fs::read(&path) {
                    Ok(document) if self.is_own_kind(&document) => {
                        let modified = entry.metadata().and_then(|m| m.modified()).ok();
                        scan.specs
                            .entry(claim_uid.to_owned())
                            .or_default()
                            .push((path, modified));
                    }
                    Ok(_) => tracing::debug!(
                        path = %path.display(),
                        "skipping CDI spec of another kind with a look-alike name"
                    ),
                    Err(err) => tracing::warn!(
                        path = %path.display(),
                        error = %err,
                        "cannot read CDI spec; leaving it alone"
                    ),
                }
            } else if let Some(rest) = name.strip_prefix(&self.temp_prefix) {
                let Some((claim_uid, _random)) = rest
                    .strip_suffix(".tmp")
                    .and_then(|rest| rest.split_once('.'))
                else {
                    continue;
                };
                if check_claim_uid(claim_uid).is_err() {
                    continue;
                }
                let modified = entry.metadata().and_then(|m| m.modified()).ok();
                scan.temps
                    .push((claim_uid.to_owned(), entry.path(), modified));
            }
        }
        Ok(scan)
    }
}

#[derive(Default)]
struct Scan {
    specs: BTreeMap<String, Vec<(PathBuf, Option<SystemTime>)>>,
    temps: Vec<(String, PathBuf, Option<SystemTime>)>,
}

/// One claim's files in the CDI root, with their modification times.
#[derive(Debug, Default)]
pub(crate) struct ClaimFiles {
    /// Spec files (`.json`, `.yaml`).
    pub(crate) specs: Vec<(PathBuf, Option<SystemTime>)>,
    /// Temporary files of writes in progress or interrupted.
    pub(crate) temps: Vec<(PathBuf, Option<SystemTime>)>,
}

/// A claim UID goes into a file name and into CDI device names: ASCII letters, digits and `-`
/// only (no `_` or `.`, which the file-name convention uses as separators), starting with a
/// letter or digit.
fn check_claim_uid(claim_uid: &str) -> Result<(), CdiError> {
    let reason = if claim_uid.is_empty() {
        "must not be empty"
    } else if claim_uid.len() > MAX_CLAIM_UID_LEN {
        "longer than 128 characters"
    } else if !claim_uid.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        "must start with an ASCII letter or digit"
    } else if !claim_uid
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        "only ASCII letters, digits and '-' are allowed"
    } else {
        return Ok(());
    };
    Err(CdiError::InvalidClaimUid {
        uid: claim_uid.to_owned(),
        reason,
    })
}

fn remove_if_exists(path: &Path) -> Result<(), CdiError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(CdiError::io("remove CDI spec", path, err)),
    }
}

/// Best-effort removal of a temporary file after a failed write; the original error is what
/// the caller needs, and a leftover is swept by `remove_orphans`.
fn discard(temp_path: &Path) {
    if let Err(err) = fs::remove_file(temp_path) {
        tracing::debug!(path = %temp_path.display(), error = %err, "cannot remove temporary CDI spec");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn gpu_writer(dir: &Path) -> SpecWriter {
        SpecWriter::new(dir, "vendor.com/gpu".parse().unwrap())
    }

    fn gpu(name: &str) -> ClaimDevice {
        ClaimDevice::new(name, ContainerEdits::new().env("GPU", name))
    }

    #[test]
    fn claim_uid_rules() {
        for good in ["0b7a41f6-ccd3-4b5c-9d7a-2f3e52e6a3f1", "a", "claim-1", "A9"] {
            assert!(check_claim_uid(good).is_ok(), "{good}");
        }
        let long = "a".repeat(129);
        for bad in ["", "-a", "a_b", "a.b", "../x", "a/b", "a b", long.as_str()] {
            assert!(check_claim_uid(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn write_creates_root_and_names_file_by_convention() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("nested/cdi");
        let writer = gpu_writer(&root);
        let ids = writer
            .write_claim(
                "uid-1",
                &ContainerEdits::new(),
                &[gpu("gpu-0"), gpu("gpu-1")],
            )
            .unwrap();
        let ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
        assert_eq!(
            ids,
            ["vendor.com/gpu=uid-1-gpu-0", "vendor.com/gpu=uid-1-gpu-1"]
        );
        let path = root.join("vendor.com-gpu_uid-1.json");
        assert_eq!(writer.spec_path("uid-1").unwrap(), path);
        let meta = fs::metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o777, SPEC_FILE_MODE);
        assert_eq!(fs::metadata(&root).unwrap().mode() & 0o777, ROOT_DIR_MODE);
        // Nothing else: the temporary file was renamed.
        assert_eq!(fs::read_dir(&root).unwrap().count(), 1);
        let spec = Spec::read_file(&path).unwrap();
        assert_eq!(spec.devices.len(), 2);
        assert!(spec.container_edits.is_empty());
    }

    #[test]
    fn invalid_claims_write_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let writer = gpu_writer(dir.path());
        let common = ContainerEdits::new();
        assert!(writer.write_claim("uid", &common, &[]).is_err());
        assert!(
            writer
                .write_claim("uid", &common, &[gpu("a"), gpu("a")])
                .is_err()
        );
        assert!(
            writer
                .write_claim(
                    "uid",
                    &common,
                    &[ClaimDevice::new("a", ContainerEdits::new())]
                )
                .is_err()
        );
        assert!(writer.write_claim("u_id", &common, &[gpu("a")]).is_err());
        assert!(
            writer
                .write_claim("uid", &common, &[gpu("bad name")])
                .is_err()
        );
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn remove_is_idempotent_and_validates_uid() {
        let dir = tempfile::tempdir().unwrap();
        let writer = gpu_writer(dir.path());
        writer
            .write_claim("uid", &ContainerEdits::new(), &[gpu("a")])
            .unwrap();
        writer.remove_claim("uid").unwrap();
        writer.remove_claim("uid").unwrap();
        assert!(writer.remove_claim("../uid").is_err());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
        // The root does not even exist.
        gpu_writer(&dir.path().join("missing"))
            .remove_claim("uid")
            .unwrap();
    }
}
