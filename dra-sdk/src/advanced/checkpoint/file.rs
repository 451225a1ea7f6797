//! File system mechanics: identity, inter-process lock, atomic replace, moving a bad file aside.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Name of the checkpoint inside the plugin's data directory.
pub(super) const CHECKPOINT_FILE: &str = "checkpoint.json";
/// Name of the lock file next to it. Never deleted: removing a lock file while another process
/// waits on it would let two writers in.
pub(super) const LOCK_FILE: &str = "checkpoint.lock";
/// Prefix of the temporary files an atomic write renames over the checkpoint. Hidden, so that a
/// glob over `checkpoint.json*` only shows real checkpoints and moved-aside copies.
const TEMP_PREFIX: &str = ".checkpoint.json.tmp-";
/// Prefix of moved-aside corrupt checkpoints.
const CORRUPT_PREFIX: &str = "checkpoint.json.corrupt-";
/// How many moved-aside copies are kept; older ones are deleted so a recurring problem cannot
/// fill the disk.
const CORRUPT_COPIES_KEPT: usize = 5;

/// What identifies one version of the checkpoint file without reading it.
///
/// Every write creates a new inode (temp file + rename), but inode numbers are reused once the
/// old file is gone, and sizes often repeat. The mtime makes the identity unique: each writer sets
/// it (with nanosecond precision, independent of the kernel's coarse file-time clock) strictly
/// after the mtime of the file it replaces, see [`write_atomically`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileIdentity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: SystemTime,
}

impl FileIdentity {
    /// When this version was written.
    pub(super) fn modified(&self) -> SystemTime {
        self.mtime
    }

    fn of(metadata: &fs::Metadata) -> io::Result<Self> {
        Ok(Self {
            dev: metadata.dev(),
            ino: metadata.ino(),
            size: metadata.size(),
            mtime: metadata.modified()?,
        })
    }
}

/// `stat` of the checkpoint: `None` when it does not exist.
pub(super) fn identity_of(path: &Path) -> io::Result<Option<FileIdentity>> {
    match fs::metadata(path) {
        Ok(metadata) => FileIdentity::of(&metadata).map(Some),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err),
    }
}

/// Reads the checkpoint and the identity of exactly the version read (`fstat` of the open file,
/// so a rename racing with us cannot pair old bytes with a new identity).
pub(super) fn read(path: &Path) -> io::Result<Option<(Vec<u8>, FileIdentity)>> {
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(err),
    };
    let metadata = file.metadata()?;
    let identity = FileIdentity::of(&metadata)?;
    let mut bytes = Vec::with_capacity(usize::try_from(metadata.size()).unwrap_or(0));
    file.read_to_end(&mut bytes)?;
    Ok(Some((bytes, identity)))
}

/// Replaces `path` with `bytes`: write a temp file in the same directory, then rename it into
/// place (see [`install`]).
///
/// A crash at any point leaves either the old or the new file (plus, at worst, a temp file that
/// [`remove_stale_temp_files`] deletes on the next open). There is deliberately no `fsync`: the
/// checkpoint only has to survive the process, not the machine, because a reboot invalidates it
/// anyway (new boot ID), and an fsync would cost milliseconds on every prepare.
///
/// `replaces` is the identity of the file being replaced; the new file's mtime is set strictly
/// after it so the identity of consecutive versions never repeats.
pub(super) fn write_atomically(
    dir: &Path,
    path: &Path,
    bytes: &[u8],
    replaces: Option<FileIdentity>,
) -> io::Result<FileIdentity> {
    let temp = dir.join(format!("{TEMP_PREFIX}{:016x}", fastrand::u64(..)));
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)?;
        file.write_all(bytes)?;
        let now = SystemTime::now();
        let mtime = match replaces {
            Some(old) if now <= old.mtime => old.mtime + Duration::from_nanos(1),
            _ => now,
        };
        file.set_modified(mtime)?;
        let identity = FileIdentity::of(&file.metadata()?)?;
        drop(file);
        // Renaming keeps inode, size and mtime, so the identity taken above is the final one.
        install(&temp, path)?;
        Ok(identity)
    })();
    if result.is_err() {
        // Best effort: the next open cleans up whatever is left.
        let _ = fs::remove_file(&temp);
    }
    result
}

/// Atomically puts `temp` in place of `path`.
///
/// A plain rename over an existing file makes ext4 (default `auto_da_alloc`) start writeback of
/// the new file's data inside the rename, which measured 0.5–3 ms on a busy disk: an fsync in
/// all but name. Exchanging the two names (`renameat2(RENAME_EXCHANGE)`, just as atomic) skips
/// that, and the old version, now under the temp name, is then deleted. A crash in between
/// leaves the new checkpoint in place and a temp file for the next open to remove.
fn install(temp: &Path, path: &Path) -> io::Result<()> {
    use rustix::fs::{CWD, RenameFlags, renameat_with};
    use rustix::io::Errno;
    match renameat_with(CWD, temp, CWD, path, RenameFlags::EXCHANGE) {
        Ok(()) => {
            if let Err(err) = fs::remove_file(temp) {
                tracing::debug!(path = %temp.display(), error = %err, "could not delete the replaced checkpoint version");
            }
            Ok(())
        }
        // No checkpoint yet, or a file system / kernel without RENAME_EXCHANGE.
        Err(Errno::NOENT | Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
            fs::rename(temp, path)
        }
        Err(errno) => Err(errno.into()),
    }
}

/// Deletes temp files left by a process that died between creating and renaming one. Only call
/// this with the checkpoint lock held: another instance may be in the middle of a write.
pub(super) fn remove_stale_temp_files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
            let path = entry.path();
            match fs::remove_file(&path) {
                Ok(()) => removed.push(path),
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(err),
            }
        }
    }
    Ok(removed)
}

/// Renames a corrupt checkpoint to `checkpoint.json.corrupt-<UTC timestamp>` and prunes old
/// copies. Returns the new path.
pub(super) fn move_aside(dir: &Path, path: &Path) -> io::Result<PathBuf> {
    let target = dir.join(format!(
        "{CORRUPT_PREFIX}{}",
        utc_timestamp(SystemTime::now())
    ));
    fs::rename(path, &target)?;
    if let Err(err) = prune_corrupt_copies(dir) {
        tracing::debug!(error = %err, "could not prune old corrupt checkpoint copies");
    }
    Ok(target)
}

/// Writes `bytes` to a new file `<prefix><UTC timestamp>` in `dir` (mode 0600, never
/// replacing one) and returns its path: the kept original of a migrated foreign checkpoint.
/// Unlike corrupt copies these are never pruned: they are what a switch back needs.
pub(super) fn keep_copy(dir: &Path, prefix: &str, bytes: &[u8]) -> io::Result<PathBuf> {
    let target = dir.join(format!("{prefix}{}", utc_timestamp(SystemTime::now())));
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&target)?;
    if let Err(err) = file.write_all(bytes) {
        drop(file);
        let _ = fs::remove_file(&target);
        return Err(err);
    }
    Ok(target)
}

fn prune_corrupt_copies(dir: &Path) -> io::Result<()> {
    let mut copies = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(CORRUPT_PREFIX)
        {
            copies.push(entry.path());
        }
    }
    // The timestamp format sorts chronologically as text.
    copies.sort();
    let excess = copies.len().saturating_sub(CORRUPT_COPIES_KEPT);
    for old in &copies[..excess] {
        fs::remove_file(old)?;
    }
    Ok(())
}

/// `YYYYMMDDTHHMMSS.nnnnnnnnnZ` (UTC), sortable as text and unique enough for file names.
fn utc_timestamp(time: SystemTime) -> String {
    let since_epoch = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since_epoch.as_secs();
    let (days, day_secs) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}.{:09}Z",
        day_secs / 3600,
        day_secs % 3600 / 60,
        day_secs % 60,
        since_epoch.subsec_nanos()
    )
}

/// Gregorian date of a day count since 1970-01-01 (H. Hinnant's `civil_from_days`, for days ≥ 0).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// Opens (creating if needed) the lock file.
pub(super) fn open_lock_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
}

/// An exclusive `flock` on the lock file, released on drop.
#[derive(Debug)]
pub(super) struct LockGuard<'a>(&'a File);

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        // Closing the file would release it too; unlocking keeps the handle for the next call.
        let _ = self.0.unlock();
    }
}

/// Why the lock could not be taken.
#[derive(Debug)]
pub(super) enum LockFailure {
    TimedOut(Duration),
    Io(io::Error),
}

/// Takes the exclusive lock, polling with a short backoff until `timeout`.
///
/// Polling instead of a blocking `flock` bounds the wait: a holder only keeps the lock for one
/// read-modify-write (well under a millisecond), so a long wait means a stuck peer, and failing
/// the call is better than hanging the kubelet's prepare until its own 45 s deadline.
pub(super) fn lock_exclusive(file: &File, timeout: Duration) -> Result<LockGuard<'_>, LockFailure> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(50);
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(LockGuard(file)),
            Err(TryLockError::WouldBlock) => {
                let waited = start.elapsed();
                if waited >= timeout {
                    return Err(LockFailure::TimedOut(waited));
                }
                std::thread::sleep(pause.min(timeout - waited));
                pause = (pause * 2).min(Duration::from_millis(2));
            }
            Err(TryLockError::Error(err)) => return Err(LockFailure::Io(err)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_utc_and_sortable() {
        assert_eq!(utc_timestamp(UNIX_EPOCH), "19700101T000000.000000000Z");
        let leap_day = UNIX_EPOCH + Duration::new(1_709_210_096, 5);
        assert_eq!(utc_timestamp(leap_day), "20240229T123456.000000005Z");
        let end_of_year = UNIX_EPOCH + Duration::from_secs(1_735_689_599);
        assert_eq!(utc_timestamp(end_of_year), "20241231T235959.000000000Z");
    }

    #[test]
    fn rewrite_never_repeats_identity() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CHECKPOINT_FILE);
        let mut previous = None;
        for _ in 0..50 {
            // Same size every time; only the identity tells the versions apart.
            let identity = write_atomically(dir.path(), &path, b"{}", previous).unwrap();
            assert_ne!(Some(identity), previous);
            assert_eq!(identity_of(&path).unwrap(), Some(identity));
            if let Some(previous) = previous {
                assert!(identity.mtime > previous.mtime);
            }
            previous = Some(identity);
            assert_eq!(fs::read(&path).unwrap(), b"{}");
            assert_eq!(
                fs::read_dir(dir.path()).unwrap().count(),
                1,
                "temp files left"
            );
        }
    }

    #[test]
    fn mtime_moves_forward_even_if_the_old_file_is_in_the_future() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CHECKPOINT_FILE);
        let first = write_atomically(dir.path(), &path, b"{}", None).unwrap();
        let future = FileIdentity {
            mtime: SystemTime::now() + Duration::from_secs(3600),
            ..first
        };
        let second = write_atomically(dir.path(), &path, b"{}", Some(future)).unwrap();
        assert_eq!(second.mtime, future.mtime + Duration::from_nanos(1));
    }

    #[test]
    fn only_the_newest_corrupt_copies_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..CORRUPT_COPIES_KEPT + 3 {
            fs::write(dir.path().join(format!("{CORRUPT_PREFIX}2000{i:02}")), "x").unwrap();
        }
        let path = dir.path().join(CHECKPOINT_FILE);
        fs::write(&path, "bad").unwrap();
        let moved = move_aside(dir.path(), &path).unwrap();
        let mut left: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        left.sort();
        assert_eq!(left.len(), CORRUPT_COPIES_KEPT);
        assert_eq!(left.last(), Some(&moved));
        assert_eq!(fs::read(&moved).unwrap(), b"bad");
    }
}
