//! Durable record of prepared claims: versioned, checksummed, boot-scoped.
//!
//! The kubelet may call `NodePrepareResources` again for a claim that is already prepared, may
//! call `NodeUnprepareResources` after a plugin restart, and during a rolling update two plugin
//! instances serve the same node: a claim prepared by one may be unprepared by the other. All of
//! that needs a record of what was prepared that outlives the process and is shared between
//! instances. That record is `<dir>/checkpoint.json`:
//!
//! * every claim is written as [`ClaimState::PrepareStarted`] before the driver changes the node
//!   and as [`ClaimState::PrepareCompleted`] afterwards, so a restart serves completed claims and
//!   hands started ones to the driver's rollback;
//! * the file carries a format version and a SHA-256 checksum of its payload; fields another SDK
//!   version wrote are kept on rewrite; a corrupt file is moved aside and reported in
//!   [`OpenReport`], never a reason to fail startup;
//! * a file in another driver implementation's format (the Go driver this one replaces) is
//!   translated by the driver's [`ForeignCheckpoint`], if it gives one to
//!   [`Checkpoint::open_migrating`], instead of being moved aside as corrupt (see
//!   [`ForeignCheckpoint`]'s module, `foreign.rs`);
//! * it records the node's boot ID; a file from an earlier boot is discarded, because prepared
//!   devices (MIG instances, VFIO bindings, MPS daemons) do not survive a reboot and the kubelet
//!   prepares again;
//! * writes are atomic (temp file + rename) but not fsynced: the file must survive a process
//!   crash, not a power loss, which changes the boot ID anyway;
//! * a `flock` on `<dir>/checkpoint.lock` serializes read-modify-write cycles between instances,
//!   and every [`Checkpoint::update`] merges with what the other instance wrote since.
//!
//! Operator-facing details (format, versioning, recovery) are in `docs/checkpoint.md`.
//!
//! ```
//! use dra_sdk::advanced::checkpoint::{Checkpoint, ClaimChange, ClaimRecord, PreparedDeviceRecord};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let tmp = tempfile::tempdir()?;
//! # let plugin_dir = tmp.path();
//! // In a plugin: `checkpoint::current_boot_id()?` instead of a fixed ID.
//! let (checkpoint, report) = Checkpoint::open(plugin_dir, "boot-1")?;
//! assert!(report.is_clean());
//!
//! // Before any side effect:
//! let started = ClaimRecord::started("default", "my-claim");
//! checkpoint.update([ClaimChange::put("uid-1", started.clone())])?;
//! // ... configure the device, write the CDI spec ...
//! let device = PreparedDeviceRecord::new("node-a", "gpu-0");
//! checkpoint.update([ClaimChange::put("uid-1", started.into_completed(vec![device]))])?;
//!
//! assert!(checkpoint.get("uid-1")?.is_some_and(|record| record.is_completed()));
//! checkpoint.update([ClaimChange::remove("uid-1")])?;
//! # Ok(())
//! # }
//! ```

mod file;
mod foreign;
mod format;
mod record;

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;
use std::{fmt, io};

pub use foreign::{
    ForeignCheckpoint, ForeignFile, MigratedCheckpoint, Migration, MigrationRefused,
};
pub use format::Corruption;
pub use record::{ClaimRecord, ClaimState, PreparedDeviceRecord};

use file::{CHECKPOINT_FILE, FileIdentity, LOCK_FILE, LockFailure, LockGuard};
use format::{Contents, StoredClaim};

/// The checkpoint format version this SDK writes. Files with a higher version are read
/// best-effort (see [`OpenReport::newer_version`]).
pub const FORMAT_VERSION: u32 = format::FORMAT_VERSION;

/// How long an operation waits for another plugin instance to release the checkpoint lock before
/// failing with [`CheckpointError::LockTimeout`].
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the kernel publishes the ID of the current boot.
const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";
/// Where the kernel publishes the time of the current boot (`btime`, seconds since the epoch).
const PROC_STAT_PATH: &str = "/proc/stat";

/// Errors of the checkpoint. Corrupt files and files from another boot are *not* errors: they
/// are handled and described in [`OpenReport`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The boot ID given to [`Checkpoint::open`] is empty.
    #[error("the boot ID must not be empty")]
    EmptyBootId,
    /// The kernel's boot ID could not be read.
    #[error("cannot read the boot ID from {}: {source}", path.display())]
    BootId {
        /// The file read.
        path: PathBuf,
        /// The I/O error (`InvalidData` if the file is empty).
        source: io::Error,
    },
    /// The checkpoint directory could not be created.
    #[error("cannot create checkpoint directory {}: {source}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The lock file could not be opened or locked.
    #[error("cannot lock {}: {source}", path.display())]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// Another process held the lock for longer than the lock timeout.
    #[error(
        "gave up after {waited:?} waiting for the lock on {}: another plugin instance holds it",
        path.display()
    )]
    LockTimeout {
        /// The lock file.
        path: PathBuf,
        /// How long we waited.
        waited: Duration,
    },
    /// The checkpoint could not be read.
    #[error("cannot read checkpoint {}: {source}", path.display())]
    Read {
        /// The checkpoint file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The checkpoint could not be written; the previous version is still in place.
    #[error("cannot write checkpoint {}: {source}", path.display())]
    Write {
        /// The checkpoint file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A claim record could not be encoded as JSON.
    #[error("cannot encode the checkpoint record of claim {claim_uid}: {source}")]
    EncodeRecord {
        /// The claim UID.
        claim_uid: String,
        /// The serializer error.
        source: serde_json::Error,
    },
    /// The checkpoint could not be encoded as JSON.
    #[error("cannot encode checkpoint {}: {source}", path.display())]
    Encode {
        /// The checkpoint file.
        path: PathBuf,
        /// The serializer error.
        source: serde_json::Error,
    },
    /// The time of the current boot could not be read.
    #[error("cannot read the boot time (`btime`) from {}: {source}", path.display())]
    BootTime {
        /// The file read.
        path: PathBuf,
        /// The I/O error (`InvalidData` if the line is missing or malformed).
        source: io::Error,
    },
    /// The checkpoint is another implementation's, and the driver's [`ForeignCheckpoint`]
    /// refused to take it over. The file is left as it was; the refusal says what to do.
    #[error("checkpoint {}: {refusal}", path.display())]
    ForeignCheckpointRefused {
        /// The checkpoint file.
        path: PathBuf,
        /// The driver's refusal.
        refusal: MigrationRefused,
    },
    /// The original of a migrated foreign checkpoint could not be kept; nothing was changed.
    #[error("cannot keep a copy of the foreign checkpoint {} before migrating it: {source}", path.display())]
    KeepForeign {
        /// The checkpoint file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A corrupt checkpoint could not be renamed out of the way.
    #[error("checkpoint {} is corrupt ({corruption}) and cannot be moved aside: {source}", path.display())]
    MoveAside {
        /// The checkpoint file.
        path: PathBuf,
        /// What is wrong with it.
        corruption: Corruption,
        /// The I/O error of the rename.
        source: io::Error,
    },
}

/// Reads the ID of the current boot from `/proc/sys/kernel/random/boot_id`.
///
/// ```no_run
/// let boot_id = dra_sdk::advanced::checkpoint::current_boot_id()?;
/// # Ok::<(), dra_sdk::advanced::checkpoint::CheckpointError>(())
/// ```
pub fn current_boot_id() -> Result<String, CheckpointError> {
    read_boot_id(Path::new(BOOT_ID_PATH))
}

fn read_boot_id(path: &Path) -> Result<String, CheckpointError> {
    let error = |source| CheckpointError::BootId {
        path: path.to_owned(),
        source,
    };
    let text = fs::read_to_string(path).map_err(error)?;
    let boot_id = text.trim();
    if boot_id.is_empty() {
        return Err(error(io::Error::new(
            io::ErrorKind::InvalidData,
            "the file is empty",
        )));
    }
    Ok(boot_id.to_owned())
}

/// Reads the time of the current boot (`btime` in `/proc/stat`), for a [`ForeignCheckpoint`]
/// that must tell whether a file without a boot ID predates the boot (its
/// [`ForeignFile::modified`] is earlier).
///
/// ```no_run
/// let booted = dra_sdk::advanced::checkpoint::boot_time()?;
/// assert!(booted <= std::time::SystemTime::now());
/// # Ok::<(), dra_sdk::advanced::checkpoint::CheckpointError>(())
/// ```
pub fn boot_time() -> Result<std::time::SystemTime, CheckpointError> {
    read_boot_time(Path::new(PROC_STAT_PATH))
}

fn read_boot_time(path: &Path) -> Result<std::time::SystemTime, CheckpointError> {
    let error = |source| CheckpointError::BootTime {
        path: path.to_owned(),
        source,
    };
    let text = fs::read_to_string(path).map_err(error)?;
    let seconds = text
        .lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|value| value.trim().parse::<u64>().ok())
        .ok_or_else(|| {
            error(io::Error::new(
                io::ErrorKind::InvalidData,
                "no `btime <seconds>` line",
            ))
        })?;
    Ok(std::time::UNIX_EPOCH + Duration::from_secs(seconds))
}

/// One change of a batch given to [`Checkpoint::update`].
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimChange {
    /// Insert or replace the record of a claim.
    Put {
        /// Claim UID.
        uid: String,
        /// The new record.
        record: ClaimRecord,
    },
    /// Forget a claim; a claim that is not recorded is not an error (unprepare is idempotent).
    Remove {
        /// Claim UID.
        uid: String,
    },
}

impl ClaimChange {
    /// Shorthand for [`ClaimChange::Put`].
    pub fn put(uid: impl Into<String>, record: ClaimRecord) -> Self {
        Self::Put {
            uid: uid.into(),
            record,
        }
    }

    /// Shorthand for [`ClaimChange::Remove`].
    pub fn remove(uid: impl Into<String>) -> Self {
        Self::Remove { uid: uid.into() }
    }
}

/// What [`Checkpoint::open`] found and did. Everything here was also logged; a driver may want
/// to surface it further (an Event, a metric).
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct OpenReport {
    /// The file came from an earlier boot of the node and was replaced by an empty checkpoint.
    pub discarded_other_boot: bool,
    /// Boot ID recorded in the discarded file.
    pub discarded_boot_id: Option<String>,
    /// How many claim records the discarded file held.
    pub discarded_claims: usize,
    /// The file was corrupt and renamed to this path; the checkpoint starts empty.
    pub corrupt_moved_to: Option<PathBuf>,
    /// What was wrong with the moved-aside file.
    pub corruption: Option<Corruption>,
    /// The file was written by a newer SDK with this format version. Known fields were read,
    /// unknown ones are kept on rewrite.
    pub newer_version: Option<u32>,
    /// UIDs of claims whose record could not be read (written by an incompatible version). They
    /// are not served, and are kept in the file until put or removed.
    pub unreadable_claims: Vec<String>,
    /// There was no checkpoint file: a first start on this node, or someone deleted it. An
    /// empty one was created. (Not a reason for [`is_clean`](Self::is_clean) to be false.)
    pub created: bool,
    /// Temporary files left by a process that died in the middle of a write, now deleted.
    pub stale_temp_files_removed: Vec<PathBuf>,
    /// The file was another implementation's checkpoint, translated by the driver's
    /// [`ForeignCheckpoint`] ([`Checkpoint::open_migrating`]); the original is kept.
    pub migrated: Option<MigratedCheckpoint>,
}

impl OpenReport {
    /// Whether the checkpoint was read as is (or created), with nothing discarded, moved or
    /// skipped. Removed temp files do not count: they only hold writes that never completed, or
    /// the version a completed write replaced. A foreign checkpoint migrated in full counts as
    /// read intact (its claims are all recorded now), unless it was from another boot.
    pub fn is_clean(&self) -> bool {
        !self.discarded_other_boot
            && self.corrupt_moved_to.is_none()
            && self.newer_version.is_none()
            && self.unreadable_claims.is_empty()
    }
}

/// Which version of the file the in-memory contents correspond to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// Unknown (after a failed write or a panic): the next access re-reads.
    Unknown,
    /// There was no file.
    Absent,
    /// This version of the file.
    File(FileIdentity),
}

impl Seen {
    fn matches(self, on_disk: Option<FileIdentity>) -> bool {
        match (self, on_disk) {
            (Self::Absent, None) => true,
            (Self::File(seen), Some(current)) => seen == current,
            _ => false,
        }
    }

    fn identity(self) -> Option<FileIdentity> {
        match self {
            Self::File(identity) => Some(identity),
            Self::Unknown | Self::Absent => None,
        }
    }
}

#[derive(Debug)]
struct Inner {
    contents: Contents,
    seen: Seen,
}

/// A [`ClaimChange`] with the record already serialized, so that serializing happens before
/// the locks are taken.
#[derive(Debug)]
enum StagedChange {
    Put { uid: String, claim: StoredClaim },
    Remove { uid: String },
}

impl StagedChange {
    fn stage(change: ClaimChange) -> Result<Self, CheckpointError> {
        Ok(match change {
            ClaimChange::Put { uid, record } => match StoredClaim::from_record(record) {
                Ok(claim) => Self::Put { uid, claim },
                Err(source) => {
                    return Err(CheckpointError::EncodeRecord {
                        claim_uid: uid,
                        source,
                    });
                }
            },
            ClaimChange::Remove { uid } => Self::Remove { uid },
        })
    }
}

/// The previous value of every claim a batch touched, to restore memory if the write fails.
#[derive(Debug)]
struct Undo(Vec<(String, Option<StoredClaim>)>);

impl Undo {
    /// Applies `changes`, skipping those that change nothing.
    fn apply(claims: &mut BTreeMap<String, StoredClaim>, changes: Vec<StagedChange>) -> Self {
        let mut undo = Vec::new();
        for change in changes {
            match change {
                StagedChange::Put { uid, claim } => {
                    let unchanged = claims
                        .get(&uid)
                        .and_then(StoredClaim::known)
                        .is_some_and(|current| Some(current) == claim.known());
                    if !unchanged {
                        let previous = claims.insert(uid.clone(), claim);
                        undo.push((uid, previous));
                    }
                }
                StagedChange::Remove { uid } => {
                    if let Some(previous) = claims.remove(&uid) {
                        undo.push((uid, Some(previous)));
                    }
                }
            }
        }
        Self(undo)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Restores the previous values, newest change first (a batch may touch a claim twice).
    fn revert(self, claims: &mut BTreeMap<String, StoredClaim>) {
        for (uid, previous) in self.0.into_iter().rev() {
            match previous {
                Some(previous) => claims.insert(uid, previous),
                None => claims.remove(&uid),
            };
        }
    }
}

/// The checkpoint of one plugin instance: `<dir>/checkpoint.json`, shared with any other
/// instance that opens the same directory.
///
/// All methods are synchronous and short (a `stat` for [`get`](Self::get) when nothing changed;
/// one write without fsync for [`update`](Self::update)), so they can be called from async code
/// directly. They block only while another instance holds the file lock for its own update.
/// Share it in an `Arc`.
///
/// See the [module documentation](self) for an example.
pub struct Checkpoint {
    dir: PathBuf,
    path: PathBuf,
    lock_path: PathBuf,
    lock_file: File,
    boot_id: String,
    lock_timeout: Duration,
    /// Serializes callers in this process (the `flock` does not: it is per open file, and all
    /// threads share ours) and caches the last version read or written.
    inner: Mutex<Inner>,
}

impl fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpoint")
            .field("path", &self.path)
            .field("boot_id", &self.boot_id)
            .field("lock_timeout", &self.lock_timeout)
            .finish_non_exhaustive()
    }
}

impl Checkpoint {
    /// Opens (or creates) `<dir>/checkpoint.json`, creating `dir` and `<dir>/checkpoint.lock` if
    /// needed.
    ///
    /// `boot_id` is normally [`current_boot_id()`]. A file from another boot is discarded, a
    /// corrupt file moved aside, leftover temp files deleted; the [`OpenReport`] says which.
    /// Apart from an empty `boot_id`, errors are I/O failures only (unreadable directory,
    /// read-only file system, lock held by a stuck peer for longer than
    /// [`DEFAULT_LOCK_TIMEOUT`]): a bad file is never a reason to fail.
    pub fn open(
        dir: &Path,
        boot_id: impl Into<String>,
    ) -> Result<(Checkpoint, OpenReport), CheckpointError> {
        Self::open_with(dir, boot_id.into(), None)
    }

    /// [`open`](Self::open), but a file that is not in the SDK's format goes to `foreign`
    /// first: translated into the SDK's records (the original kept next to the checkpoint,
    /// [`OpenReport::migrated`]), refused ([`CheckpointError::ForeignCheckpointRefused`], the
    /// file left as it was), or, when `foreign` does not know it either, moved aside as
    /// corrupt. See [`ForeignCheckpoint`].
    pub fn open_migrating(
        dir: &Path,
        boot_id: impl Into<String>,
        foreign: &dyn ForeignCheckpoint,
    ) -> Result<(Checkpoint, OpenReport), CheckpointError> {
        Self::open_with(dir, boot_id.into(), Some(foreign))
    }

    fn open_with(
        dir: &Path,
        boot_id: String,
        foreign: Option<&dyn ForeignCheckpoint>,
    ) -> Result<(Checkpoint, OpenReport), CheckpointError> {
        if boot_id.is_empty() {
            return Err(CheckpointError::EmptyBootId);
        }
        // 0700: the checkpoint is root's alone, like the kubelet's own (it names every
        // prepared claim); an existing directory keeps its mode.
        std::os::unix::fs::DirBuilderExt::mode(fs::DirBuilder::new().recursive(true), 0o700)
            .create(dir)
            .map_err(|source| CheckpointError::CreateDir {
                path: dir.to_owned(),
                source,
            })?;
        let lock_path = dir.join(LOCK_FILE);
        let lock_file =
            file::open_lock_file(&lock_path).map_err(|source| CheckpointError::Lock {
                path: lock_path.clone(),
                source,
            })?;
        let checkpoint = Checkpoint {
            dir: dir.to_owned(),
            path: dir.join(CHECKPOINT_FILE),
            lock_path,
            lock_file,
            inner: Mutex::new(Inner {
                contents: Contents::empty(&boot_id),
                seen: Seen::Unknown,
            }),
            boot_id,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
        };
        let report = checkpoint.load_at_open(foreign)?;
        Ok((checkpoint, report))
    }

    fn load_at_open(
        &self,
        foreign: Option<&dyn ForeignCheckpoint>,
    ) -> Result<OpenReport, CheckpointError> {
        let mut inner = self.lock_inner();
        let _file_lock = self.lock_file()?;
        // Under the lock: no other instance is between creating and renaming a temp file.
        let stale = file::remove_stale_temp_files(&self.dir).unwrap_or_else(|err| {
            tracing::warn!(dir = %self.dir.display(), error = %err, "could not remove leftover checkpoint temp files");
            Vec::new()
        });
        let (mut report, needs_write) = self.sync_from_disk(&mut inner, foreign)?;
        if needs_write {
            self.write_locked(&mut inner)?;
        }
        report.stale_temp_files_removed = stale;
        let path = self.path.display();
        if !report.stale_temp_files_removed.is_empty() {
            tracing::info!(%path, removed = ?report.stale_temp_files_removed, "removed temp files of an interrupted checkpoint write");
        }
        if let Some(version) = report.newer_version {
            tracing::info!(%path, version, supported = FORMAT_VERSION, "checkpoint was written by a newer SDK; reading the fields this version knows and keeping the rest");
        }
        for (uid, claim) in &inner.contents.claims {
            if let StoredClaim::Unreadable { reason, .. } = claim {
                tracing::warn!(%path, claim_uid = %uid, %reason, "cannot read this claim's checkpoint record; it is kept but not served");
                report.unreadable_claims.push(uid.clone());
            }
        }
        tracing::debug!(%path, claims = inner.contents.claims.len(), "checkpoint opened");
        Ok(report)
    }

    /// Sets how long operations wait for another instance to release the file lock
    /// (default [`DEFAULT_LOCK_TIMEOUT`]).
    pub fn with_lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }

    /// Path of the checkpoint file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The boot ID this checkpoint belongs to.
    pub fn boot_id(&self) -> &str {
        &self.boot_id
    }

    /// The record of one claim, if any. Reflects writes by another instance sharing the file:
    /// costs a `stat` when the file is unchanged since this instance last read or wrote it, and a
    /// re-read otherwise.
    pub fn get(&self, claim_uid: &str) -> Result<Option<ClaimRecord>, CheckpointError> {
        let mut inner = self.lock_inner();
        self.refresh(&mut inner)?;
        Ok(inner
            .contents
            .claims
            .get(claim_uid)
            .and_then(StoredClaim::known)
            .cloned())
    }

    /// All readable records, by claim UID. For a restart (serve completed claims, roll back
    /// started ones) and for cleaning up orphaned CDI specs.
    pub fn records(&self) -> Result<BTreeMap<String, ClaimRecord>, CheckpointError> {
        let mut inner = self.lock_inner();
        self.refresh(&mut inner)?;
        Ok(inner
            .contents
            .claims
            .iter()
            .filter_map(|(uid, claim)| Some((uid.clone(), claim.known()?.clone())))
            .collect())
    }

    /// Applies all changes of one batch and writes the file once.
    ///
    /// Under the file lock, the changes are applied to the latest version of the file (re-read
    /// if another instance wrote it since), so concurrent instances never lose each other's
    /// claims. A batch that changes nothing (removing unknown claims, putting identical records)
    /// does not write. If the write fails, nothing of the batch is applied.
    pub fn update(
        &self,
        changes: impl IntoIterator<Item = ClaimChange>,
    ) -> Result<(), CheckpointError> {
        let changes = changes
            .into_iter()
            .map(StagedChange::stage)
            .collect::<Result<Vec<_>, _>>()?;
        if changes.is_empty() {
            return Ok(());
        }
        let _span = tracing::debug_span!("checkpoint_update", changes = changes.len()).entered();
        let mut inner = self.lock_inner();
        let _file_lock = self.lock_file()?;
        let mut needs_write = false;
        if !inner.seen.matches(self.identity_on_disk()?) {
            needs_write = self.sync_from_disk(&mut inner, None)?.1;
        }

        let undo = Undo::apply(&mut inner.contents.claims, changes);
        if undo.is_empty() && !needs_write {
            return Ok(());
        }
        if let Err(err) = self.write_locked(&mut inner) {
            undo.revert(&mut inner.contents.claims);
            return Err(err);
        }
        Ok(())
    }

    /// Replaces the driver state of a completed claim, atomically under the file lock, so that
    /// an unprepare by this or another instance either sees the new state or removes the claim
    /// first. Returns `false`, writing nothing, when the claim is not recorded as completed.
    pub fn set_driver_state(
        &self,
        claim_uid: &str,
        driver_state: Option<serde_json::Value>,
    ) -> Result<bool, CheckpointError> {
        let mut inner = self.lock_inner();
        let _file_lock = self.lock_file()?;
        let mut needs_write = false;
        if !inner.seen.matches(self.identity_on_disk()?) {
            needs_write = self.sync_from_disk(&mut inner, None)?.1;
        }
        let record = inner
            .contents
            .claims
            .get(claim_uid)
            .and_then(StoredClaim::known)
            .filter(|record| record.is_completed())
            .cloned();
        let Some(mut record) = record else {
            if needs_write {
                self.write_locked(&mut inner)?;
            }
            return Ok(false);
        };
        record.driver_state = driver_state;
        let change = StagedChange::stage(ClaimChange::put(claim_uid, record))?;
        let undo = Undo::apply(&mut inner.contents.claims, vec![change]);
        if undo.is_empty() && !needs_write {
            return Ok(true);
        }
        if let Err(err) = self.write_locked(&mut inner) {
            undo.revert(&mut inner.contents.claims);
            return Err(err);
        }
        Ok(true)
    }

    fn lock_inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|poisoned| {
            // A panic in another thread may have left memory ahead of the file: re-read.
            self.inner.clear_poison();
            let mut inner = poisoned.into_inner();
            inner.seen = Seen::Unknown;
            inner
        })
    }

    fn lock_file(&self) -> Result<LockGuard<'_>, CheckpointError> {
        file::lock_exclusive(&self.lock_file, self.lock_timeout).map_err(|failure| match failure {
            LockFailure::TimedOut(waited) => CheckpointError::LockTimeout {
                path: self.lock_path.clone(),
                waited,
            },
            LockFailure::Io(source) => CheckpointError::Lock {
                path: self.lock_path.clone(),
                source,
            },
        })
    }

    fn identity_on_disk(&self) -> Result<Option<FileIdentity>, CheckpointError> {
        file::identity_of(&self.path).map_err(|source| CheckpointError::Read {
            path: self.path.clone(),
            source,
        })
    }

    /// Re-reads the file if it changed since we last saw it.
    fn refresh(&self, inner: &mut Inner) -> Result<(), CheckpointError> {
        if inner.seen.matches(self.identity_on_disk()?) {
            return Ok(());
        }
        // Re-reading needs no lock (renames are atomic), but recovering from a corrupt or
        // missing file rewrites it, and that must not race with another instance's write.
        let _file_lock = self.lock_file()?;
        let (_, needs_write) = self.sync_from_disk(inner, None)?;
        if needs_write {
            self.write_locked(inner)?;
        }
        Ok(())
    }

    /// Loads the file into memory, applying the recovery rules. Call with the file lock held.
    /// Returns what happened and whether the file must be (re)written.
    ///
    /// The rules are the same at open and later; only the starting memory differs (empty at
    /// open, the last good version later). A missing or corrupt file is replaced by what is in
    /// memory: at runtime that is the best knowledge of what is prepared on the node. Only at
    /// open is a file in another format offered to `foreign` (see [`ForeignCheckpoint`]).
    fn sync_from_disk(
        &self,
        inner: &mut Inner,
        foreign: Option<&dyn ForeignCheckpoint>,
    ) -> Result<(OpenReport, bool), CheckpointError> {
        let mut report = OpenReport::default();
        let path = self.path.display();
        let read = file::read(&self.path).map_err(|source| CheckpointError::Read {
            path: self.path.clone(),
            source,
        })?;
        let Some((bytes, identity)) = read else {
            if !inner.contents.claims.is_empty() {
                tracing::warn!(%path, claims = inner.contents.claims.len(), "checkpoint file disappeared; writing it again from memory");
            }
            inner.seen = Seen::Absent;
            report.created = true;
            return Ok((report, true));
        };
        match format::decode(&bytes) {
            Err(corruption) => {
                if let Some(foreign) = foreign {
                    let file = ForeignFile {
                        path: &self.path,
                        bytes: &bytes,
                        modified: Some(identity.modified()),
                        boot_id: &self.boot_id,
                    };
                    match foreign.migrate(&file) {
                        Ok(Some(migration)) => {
                            return self.adopt_foreign(inner, identity, &bytes, foreign, migration);
                        }
                        Ok(None) => {}
                        Err(refusal) => {
                            tracing::error!(%path, %refusal, "the checkpoint of another driver implementation cannot be taken over; it is left as it is");
                            return Err(CheckpointError::ForeignCheckpointRefused {
                                path: self.path.clone(),
                                refusal,
                            });
                        }
                    }
                }
                let moved_to = file::move_aside(&self.dir, &self.path).map_err(|source| {
                    CheckpointError::MoveAside {
                        path: self.path.clone(),
                        corruption: corruption.clone(),
                        source,
                    }
                })?;
                tracing::warn!(
                    %path,
                    moved_to = %moved_to.display(),
                    reason = %corruption,
                    claims_kept = inner.contents.claims.len(),
                    "checkpoint is corrupt; moved it aside and continuing with the claims known in memory (none at startup)"
                );
                inner.seen = Seen::Absent;
                report.corrupt_moved_to = Some(moved_to);
                report.corruption = Some(corruption);
                Ok((report, true))
            }
            Ok(contents) if contents.boot_id != self.boot_id => {
                tracing::info!(
                    %path,
                    recorded_boot_id = %contents.boot_id,
                    current_boot_id = %self.boot_id,
                    claims = contents.claims.len(),
                    "checkpoint is from another boot; discarding it (prepared devices do not survive a reboot, the kubelet prepares again)"
                );
                report.discarded_other_boot = true;
                report.discarded_claims = contents.claims.len();
                report.discarded_boot_id = Some(contents.boot_id);
                inner.contents = Contents::empty(&self.boot_id);
                inner.seen = Seen::File(identity);
                Ok((report, true))
            }
            Ok(contents) => {
                if contents.version > FORMAT_VERSION {
                    report.newer_version = Some(contents.version);
                }
                inner.contents = contents;
                inner.seen = Seen::File(identity);
                Ok((report, false))
            }
        }
    }

    /// Replaces memory with a migrated foreign checkpoint, after keeping a copy of the
    /// original. Call with the file lock held; the caller writes the new file. A crash before
    /// that write leaves the foreign file in place (and an extra copy), so the next start
    /// migrates it again.
    fn adopt_foreign(
        &self,
        inner: &mut Inner,
        identity: FileIdentity,
        bytes: &[u8],
        foreign: &dyn ForeignCheckpoint,
        migration: Migration,
    ) -> Result<(OpenReport, bool), CheckpointError> {
        let label = foreign::file_label(foreign.label());
        let kept_at = file::keep_copy(&self.dir, &format!("{CHECKPOINT_FILE}.{label}-"), bytes)
            .map_err(|source| CheckpointError::KeepForeign {
                path: self.path.clone(),
                source,
            })?;
        let mut contents = Contents::empty(&self.boot_id);
        if !migration.from_other_boot {
            for (uid, record) in migration.claims.iter() {
                let stored = StoredClaim::from_record(record.clone()).map_err(|source| {
                    CheckpointError::EncodeRecord {
                        claim_uid: uid.clone(),
                        source,
                    }
                })?;
                contents.claims.insert(uid.clone(), stored);
            }
        }
        let claims = contents.claims.len();
        let completed = if migration.from_other_boot {
            0
        } else {
            migration
                .claims
                .values()
                .filter(|record| record.is_completed())
                .count()
        };
        let path = self.path.display();
        tracing::info!(
            %path,
            format = %migration.format,
            kept_at = %kept_at.display(),
            claims,
            completed,
            from_other_boot = migration.from_other_boot,
            "migrated the checkpoint of another driver implementation; its original is kept"
        );
        for note in &migration.notes {
            tracing::warn!(%path, format = %migration.format, "{note}");
        }
        let mut report = OpenReport {
            discarded_other_boot: migration.from_other_boot,
            discarded_claims: if migration.from_other_boot {
                migration.claims.len()
            } else {
                0
            },
            ..OpenReport::default()
        };
        report.migrated = Some(MigratedCheckpoint {
            format: migration.format,
            kept_at,
            claims,
            completed,
            from_other_boot: migration.from_other_boot,
            notes: migration.notes,
        });
        inner.contents = contents;
        inner.seen = Seen::File(identity);
        Ok((report, true))
    }

    /// Writes memory to the file. Call with the file lock held.
    fn write_locked(&self, inner: &mut Inner) -> Result<(), CheckpointError> {
        let bytes = format::encode(&inner.contents).map_err(|source| CheckpointError::Encode {
            path: self.path.clone(),
            source,
        })?;
        match file::write_atomically(&self.dir, &self.path, &bytes, inner.seen.identity()) {
            Ok(identity) => {
                inner.seen = Seen::File(identity);
                tracing::debug!(path = %self.path.display(), claims = inner.contents.claims.len(), bytes = bytes.len(), "checkpoint written");
                Ok(())
            }
            Err(source) => {
                // The rename may or may not have happened: re-read next time.
                inner.seen = Seen::Unknown;
                Err(CheckpointError::Write {
                    path: self.path.clone(),
                    source,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Checkpoint>();
    }

    #[test]
    fn boot_id_is_trimmed_and_must_not_be_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("boot_id");
        fs::write(&path, "4aa5e138-5a24-4e64-9b5c-cb9e08c7014f\n").unwrap();
        assert_eq!(
            read_boot_id(&path).unwrap(),
            "4aa5e138-5a24-4e64-9b5c-cb9e08c7014f"
        );
        fs::write(&path, "\n").unwrap();
        assert!(matches!(
            read_boot_id(&path),
            Err(CheckpointError::BootId { .. })
        ));
        assert!(matches!(
            Checkpoint::open(dir.path(), ""),
            Err(CheckpointError::EmptyBootId)
        ));
    }

    #[test]
    fn boot_time_is_read_from_btime() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stat");
        fs::write(&path, "cpu  1 2 3\nbtime 1700000000\nprocesses 9\n").unwrap();
        assert_eq!(
            read_boot_time(&path).unwrap(),
            std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
        );
        fs::write(&path, "cpu  1 2 3\n").unwrap();
        assert!(matches!(
            read_boot_time(&path),
            Err(CheckpointError::BootTime { .. })
        ));
        // The kernel's, on Linux like the SDK.
        assert!(boot_time().unwrap() <= std::time::SystemTime::now());
    }

    #[test]
    fn current_boot_id_reads_the_kernel_value() {
        // Linux only, like the SDK.
        let boot_id = current_boot_id().unwrap();
        assert_eq!(boot_id.len(), 36, "{boot_id:?}");
    }

    fn stage(changes: Vec<ClaimChange>) -> Vec<StagedChange> {
        changes
            .into_iter()
            .map(|change| StagedChange::stage(change).unwrap())
            .collect()
    }

    fn stored(name: &str) -> StoredClaim {
        StoredClaim::from_record(ClaimRecord::started("ns", name)).unwrap()
    }

    #[test]
    fn undo_restores_the_claims_before_the_batch() {
        let mut claims =
            BTreeMap::from([("a".to_owned(), stored("a")), ("b".to_owned(), stored("b"))]);
        let before = claims.clone();
        let undo = Undo::apply(
            &mut claims,
            stage(vec![
                ClaimChange::put("a", ClaimRecord::started("ns", "a2")),
                ClaimChange::put("c", ClaimRecord::started("ns", "c")),
                ClaimChange::put("c", ClaimRecord::started("ns", "c2")),
                ClaimChange::remove("b"),
                ClaimChange::remove("unknown"),
            ]),
        );
        assert_eq!(claims.keys().collect::<Vec<_>>(), ["a", "c"]);
        assert_eq!(claims["c"], stored("c2"));
        undo.revert(&mut claims);
        assert_eq!(claims, before);
    }

    /// A foreign format for the tests: `FOREIGN <uid>...`, or `REFUSE`, or `OLD <uid>`
    /// (from another boot); anything else is not this format.
    struct Lines {
        calls: std::sync::atomic::AtomicUsize,
    }

    impl Lines {
        fn new() -> Self {
            Self {
                calls: std::sync::atomic::AtomicUsize::new(0),
            }
        }

        fn calls(&self) -> usize {
            self.calls.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    impl ForeignCheckpoint for Lines {
        fn label(&self) -> &str {
            "test format"
        }

        fn migrate(&self, file: &ForeignFile<'_>) -> Result<Option<Migration>, MigrationRefused> {
            self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            assert_eq!(file.boot_id, "boot-1");
            assert!(file.modified.is_some());
            let text = std::str::from_utf8(file.bytes).unwrap_or_default();
            let mut words = text.split_whitespace();
            match words.next() {
                Some("FOREIGN") => {
                    let claims = words
                        .map(|uid| {
                            let record = ClaimRecord::started("ns", uid)
                                .with_driver_state(serde_json::json!({ "from": "foreign" }));
                            let record = if uid.starts_with("started") {
                                record
                            } else {
                                record.into_completed(vec![PreparedDeviceRecord::new("node", uid)])
                            };
                            (uid.to_owned(), record)
                        })
                        .collect();
                    Ok(Some(
                        Migration::new("lines v1", claims).note("one field had no equivalent"),
                    ))
                }
                Some("OLD") => Ok(Some(Migration::from_other_boot("lines v1"))),
                Some("REFUSE") => Err(MigrationRefused::new(
                    "lines v1",
                    ["uid-9"],
                    "drain the node first",
                )),
                _ => Ok(None),
            }
        }
    }

    fn kept_copies(dir: &Path) -> Vec<PathBuf> {
        let mut kept: Vec<PathBuf> = fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| {
                path.file_name()
                    .and_then(|name| name.to_str())
                    .is_some_and(|name| name.starts_with("checkpoint.json.test-format-"))
            })
            .collect();
        kept.sort();
        kept
    }

    #[test]
    fn a_foreign_checkpoint_is_migrated_and_its_original_kept() {
        let dir = tempfile::tempdir().unwrap();
        let original = b"FOREIGN uid-1 uid-2 started-3\n";
        fs::write(dir.path().join(CHECKPOINT_FILE), original).unwrap();
        let lines = Lines::new();
        let (checkpoint, report) =
            Checkpoint::open_migrating(dir.path(), "boot-1", &lines).unwrap();
        assert_eq!(lines.calls(), 1);
        assert!(report.is_clean(), "{report:?}");
        let migrated = report.migrated.clone().unwrap();
        assert_eq!(migrated.format, "lines v1");
        assert_eq!((migrated.claims, migrated.completed), (3, 2));
        assert!(!migrated.from_other_boot);
        assert_eq!(migrated.notes, ["one field had no equivalent"]);
        assert_eq!(
            kept_copies(dir.path()),
            std::slice::from_ref(&migrated.kept_at)
        );
        assert_eq!(fs::read(&migrated.kept_at).unwrap(), original);

        let records = checkpoint.records().unwrap();
        assert_eq!(records.len(), 3);
        assert!(records["uid-1"].is_completed());
        assert_eq!(records["uid-1"].devices[0].device, "uid-1");
        assert_eq!(
            records["uid-2"].driver_state,
            Some(serde_json::json!({ "from": "foreign" }))
        );
        assert_eq!(records["started-3"].state, ClaimState::PrepareStarted);

        // The file is the SDK's now: a plain open reads it as is, and the hook is not asked
        // again.
        drop(checkpoint);
        let (reopened, report) = Checkpoint::open_migrating(dir.path(), "boot-1", &lines).unwrap();
        assert_eq!(lines.calls(), 1);
        assert!(report.is_clean() && report.migrated.is_none(), "{report:?}");
        assert_eq!(reopened.records().unwrap(), records);
    }

    #[test]
    fn a_refused_foreign_checkpoint_fails_the_open_and_stays_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CHECKPOINT_FILE);
        fs::write(&path, "REFUSE").unwrap();
        let error = Checkpoint::open_migrating(dir.path(), "boot-1", &Lines::new()).unwrap_err();
        let CheckpointError::ForeignCheckpointRefused { path: at, refusal } = &error else {
            panic!("expected a refusal, got {error:?}");
        };
        assert_eq!(at, &path);
        assert_eq!(refusal.claims, ["uid-9"]);
        let text = error.to_string();
        assert!(text.contains("drain the node first"), "{text}");
        assert!(text.contains("uid-9"), "{text}");
        assert_eq!(fs::read(&path).unwrap(), b"REFUSE");
        assert!(kept_copies(dir.path()).is_empty());
        let names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with("checkpoint.json"))
            .collect();
        assert_eq!(names, ["checkpoint.json"], "nothing moved aside");
    }

    #[test]
    fn an_unknown_format_is_still_moved_aside_as_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(CHECKPOINT_FILE), "garbage").unwrap();
        let lines = Lines::new();
        let (checkpoint, report) =
            Checkpoint::open_migrating(dir.path(), "boot-1", &lines).unwrap();
        assert_eq!(lines.calls(), 1);
        assert!(report.migrated.is_none());
        assert!(report.corrupt_moved_to.is_some());
        assert!(checkpoint.records().unwrap().is_empty());
    }

    #[test]
    fn a_foreign_checkpoint_of_an_earlier_boot_keeps_no_claim() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(CHECKPOINT_FILE), "OLD uid-1").unwrap();
        let (checkpoint, report) =
            Checkpoint::open_migrating(dir.path(), "boot-1", &Lines::new()).unwrap();
        assert!(report.discarded_other_boot);
        assert!(!report.is_clean());
        let migrated = report.migrated.unwrap();
        assert!(migrated.from_other_boot);
        assert_eq!(migrated.claims, 0);
        assert_eq!(fs::read(&migrated.kept_at).unwrap(), b"OLD uid-1");
        assert!(checkpoint.records().unwrap().is_empty());
    }

    #[test]
    fn a_foreign_file_written_while_running_is_not_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let lines = Lines::new();
        let (checkpoint, report) =
            Checkpoint::open_migrating(dir.path(), "boot-1", &lines).unwrap();
        assert!(report.created);
        checkpoint
            .update([ClaimChange::put("mine", ClaimRecord::started("ns", "mine"))])
            .unwrap();
        // The other implementation still runs and writes its file: that is corruption, and
        // what this instance knows is written back.
        fs::write(dir.path().join(CHECKPOINT_FILE), "FOREIGN uid-1").unwrap();
        let records = checkpoint.records().unwrap();
        assert_eq!(records.keys().collect::<Vec<_>>(), ["mine"]);
        assert_eq!(lines.calls(), 0);
        assert!(kept_copies(dir.path()).is_empty());
    }

    #[test]
    fn batch_without_effect_has_nothing_to_undo() {
        let mut claims = BTreeMap::from([("a".to_owned(), stored("a"))]);
        let undo = Undo::apply(
            &mut claims,
            stage(vec![
                ClaimChange::put("a", ClaimRecord::started("ns", "a")),
                ClaimChange::remove("unknown"),
            ]),
        );
        assert!(undo.is_empty());
    }
}
