//! Taking over a checkpoint another driver implementation left in the plugin's directory:
//! see [`ForeignCheckpoint`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::SystemTime;

use super::record::ClaimRecord;

/// The foreign file as the SDK found it at open.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ForeignFile<'a> {
    /// Its path (`<dir>/checkpoint.json`).
    pub path: &'a Path,
    /// Its exact bytes.
    pub bytes: &'a [u8],
    /// When it was last written, if the file system says.
    pub modified: Option<SystemTime>,
    /// The boot ID the checkpoint is opened with (the node's current boot).
    pub boot_id: &'a str,
}

/// A foreign checkpoint translated into the SDK's records.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Migration {
    /// What the file was, for logs and the report (`k8s-dra-driver-gpu checkpoint v2`).
    pub format: String,
    /// The claims, by UID: completed ones are served and handed to the driver's reconcile,
    /// started ones are rolled back, exactly as if the SDK had written them.
    pub claims: BTreeMap<String, ClaimRecord>,
    /// The file was written during an earlier boot of the node: nothing it records survived
    /// the reboot, so its claims are not kept (the kubelet prepares them again). The original
    /// is still kept next to the checkpoint.
    pub from_other_boot: bool,
    /// Things an operator should know about the translation (a field that had no equivalent,
    /// a claim rolled back), logged as warnings and kept in the report.
    pub notes: Vec<String>,
}

impl Migration {
    /// A migration of `format` holding `claims`.
    pub fn new(format: impl Into<String>, claims: BTreeMap<String, ClaimRecord>) -> Self {
        Self {
            format: format.into(),
            claims,
            from_other_boot: false,
            notes: Vec::new(),
        }
    }

    /// The file of `format` is from an earlier boot: no claim is kept.
    pub fn from_other_boot(format: impl Into<String>) -> Self {
        Self {
            format: format.into(),
            from_other_boot: true,
            ..Self::default()
        }
    }

    /// Adds a note for the operator.
    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.notes.push(note.into());
        self
    }
}

/// Why a foreign checkpoint cannot be taken over. The plugin must not start: the file is left
/// as it was, and [`Display`](fmt::Display) gives the operator everything in one message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub struct MigrationRefused {
    /// What the file is (`k8s-dra-driver-gpu checkpoint v2`).
    pub format: String,
    /// UIDs of the claims that cannot be taken over (empty when the file as a whole cannot).
    pub claims: Vec<String>,
    /// Why, and what the operator has to do, written for them.
    pub reason: String,
}

impl MigrationRefused {
    /// A refusal of `format` for `claims`, with `reason` for the operator.
    pub fn new(
        format: impl Into<String>,
        claims: impl IntoIterator<Item = impl Into<String>>,
        reason: impl Into<String>,
    ) -> Self {
        Self {
            format: format.into(),
            claims: claims.into_iter().map(Into::into).collect(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for MigrationRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} cannot be taken over", self.format)?;
        if !self.claims.is_empty() {
            write!(f, " (claims {})", self.claims.join(", "))?;
        }
        write!(f, ": {}", self.reason)
    }
}

/// Taking over a checkpoint another driver implementation left in the plugin's directory.
///
/// A driver built on this SDK may replace a driver written elsewhere (the Go reference
/// drivers) on a node where pods still run with claims the other one prepared. Both keep
/// `<plugins dir>/<driver>/checkpoint.json`, in different formats: to the SDK the other one's
/// file is corrupt, and without help it would move it aside and forget every claim in it, so
/// the kubelet's later unprepare would find nothing to undo (and a driver that cleans up at
/// start what no claim records, like dynamic MIG, would destroy what running pods use).
///
/// A [`ForeignCheckpoint`] is that help: when the file is not the SDK's format, the SDK hands
/// its bytes to the driver's implementation, which either
///
/// * says it is not a format it knows (`Ok(None)`): the file is treated as corrupt, as before;
/// * translates it into the SDK's records ([`Migration`]): the original is kept next to the
///   checkpoint under a name with the migration's label
///   (`checkpoint.json.<label>-<UTC timestamp>`, never pruned), the translated claims are
///   written, and [`OpenReport::migrated`](super::OpenReport::migrated) says what happened;
/// * or refuses ([`MigrationRefused`]): a claim cannot be taken over faithfully. Opening
///   fails with [`CheckpointError::ForeignCheckpointRefused`](super::CheckpointError), the
///   file is left exactly as it was, and the refusal's text (which the implementation writes
///   for an operator: what to do, which claims) is in the error.
///
/// Only the first read at open consults the hook: a foreign file appearing later means the
/// other implementation still runs on the node, and its writes are then treated as corruption.
///
/// ```
/// use std::collections::BTreeMap;
/// use dra_sdk::advanced::checkpoint::{
///     Checkpoint, ClaimRecord, ForeignCheckpoint, ForeignFile, Migration, MigrationRefused,
/// };
///
/// /// A made-up format: one claim UID per line, each prepared with nothing to undo.
/// struct UidList;
///
/// impl ForeignCheckpoint for UidList {
///     fn label(&self) -> &str {
///         "uid-list"
///     }
///     fn migrate(&self, file: &ForeignFile<'_>) -> Result<Option<Migration>, MigrationRefused> {
///         let Ok(text) = std::str::from_utf8(file.bytes) else { return Ok(None) };
///         let claims: BTreeMap<String, ClaimRecord> = text
///             .lines()
///             .map(|uid| (uid.to_owned(), ClaimRecord::started("", "").into_completed(Vec::new())))
///             .collect();
///         Ok(Some(Migration::new("uid list", claims)))
///     }
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let tmp = tempfile::tempdir()?;
/// std::fs::write(tmp.path().join("checkpoint.json"), "uid-1\nuid-2\n")?;
/// let (checkpoint, report) = Checkpoint::open_migrating(tmp.path(), "boot-1", &UidList)?;
/// let migrated = report.migrated.expect("the file was migrated");
/// assert_eq!(migrated.claims, 2);
/// assert!(migrated.kept_at.file_name().unwrap().to_str().unwrap().starts_with("checkpoint.json.uid-list-"));
/// assert!(checkpoint.get("uid-1")?.is_some_and(|record| record.is_completed()));
/// # Ok(())
/// # }
/// ```
///
/// Given to [`Checkpoint::open_migrating`](super::Checkpoint::open_migrating), or to
/// [`PluginBuilder::foreign_checkpoint`](crate::plugin::PluginBuilder::foreign_checkpoint).
pub trait ForeignCheckpoint: Send + Sync {
    /// A short name for the kept original (`checkpoint.json.<label>-<timestamp>`) and the
    /// logs: ASCII letters, digits and `-` only (anything else is replaced by `-`).
    fn label(&self) -> &str;

    /// Translates `file`. `Ok(None)`: not a format this implementation knows (the SDK then
    /// treats the file as corrupt). Must not change the node: it runs before the plugin holds
    /// anything, and a refusal must leave everything as it was.
    fn migrate(&self, file: &ForeignFile<'_>) -> Result<Option<Migration>, MigrationRefused>;
}

/// What a migration at open did, in [`OpenReport::migrated`](super::OpenReport::migrated).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct MigratedCheckpoint {
    /// What the file was ([`Migration::format`]).
    pub format: String,
    /// Where the original file is kept, byte for byte.
    pub kept_at: std::path::PathBuf,
    /// How many claims were taken over (0 when [`from_other_boot`](Self::from_other_boot)).
    pub claims: usize,
    /// How many of them were completed (the rest are rolled back at start).
    pub completed: usize,
    /// The file was from an earlier boot; its claims were dropped.
    pub from_other_boot: bool,
    /// The migration's notes for the operator.
    pub notes: Vec<String>,
}

/// The label made safe for a file name.
pub(super) fn file_label(label: &str) -> String {
    let cleaned: String = label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    if cleaned.is_empty() {
        "foreign".to_owned()
    } else {
        cleaned
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_file_name_safe() {
        assert_eq!(file_label("upstream"), "upstream");
        assert_eq!(file_label("k8s dra/v2"), "k8s-dra-v2");
        assert_eq!(file_label(""), "foreign");
    }

    #[test]
    fn a_refusal_names_format_claims_and_reason() {
        let refusal = MigrationRefused::new("fmt v2", ["a", "b"], "drain the node");
        assert_eq!(
            refusal.to_string(),
            "fmt v2 cannot be taken over (claims a, b): drain the node"
        );
        let whole = MigrationRefused::new("fmt v2", Vec::<String>::new(), "damaged");
        assert_eq!(whole.to_string(), "fmt v2 cannot be taken over: damaged");
    }
}
