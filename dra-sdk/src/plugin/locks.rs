//! Per-claim serialization: one claim is never prepared or unprepared twice at once, while
//! different claims proceed in parallel. A node-wide lock ([`NodeLock`]) only for drivers that
//! opt in.
//!
//! Two layers per claim: [`ClaimLocks`] (async mutexes) orders the tasks of this process, and
//! [`ClaimFileLocks`] (one `flock`ed file per claim) orders the plugin instances that share the
//! node during a rolling update. A file lock dies with its process, so start-up recovery can
//! probe it: a claim whose lock is held is being worked on by a live instance right now.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// A table of async mutexes keyed by claim UID; entries vanish when nobody holds or waits.
#[derive(Clone, Default)]
pub(crate) struct ClaimLocks {
    table: Arc<Mutex<HashMap<String, Arc<AsyncMutex<()>>>>>,
}

impl ClaimLocks {
    /// Locks every UID of a batch. UIDs are taken in sorted order, so two batches that share
    /// claims cannot deadlock each other; duplicates are locked once.
    pub(crate) async fn lock_all<'a>(
        &self,
        uids: impl IntoIterator<Item = &'a str>,
    ) -> Vec<ClaimGuard> {
        let mut uids: Vec<&str> = uids.into_iter().collect();
        uids.sort_unstable();
        uids.dedup();
        let mut guards = Vec::with_capacity(uids.len());
        for uid in uids {
            guards.push(self.lock(uid).await);
        }
        guards
    }

    pub(crate) async fn lock(&self, uid: &str) -> ClaimGuard {
        let mutex = {
            let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(table.entry(uid.to_string()).or_default())
        };
        let guard = Arc::clone(&mutex).lock_owned().await;
        ClaimGuard {
            uid: uid.to_string(),
            table: Arc::clone(&self.table),
            mutex,
            guard: Some(guard),
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// Holds one claim's lock; dropping it releases the lock and, when nobody else waits, the
/// table entry.
pub(crate) struct ClaimGuard {
    uid: String,
    table: Arc<Mutex<HashMap<String, Arc<AsyncMutex<()>>>>>,
    mutex: Arc<AsyncMutex<()>>,
    guard: Option<OwnedMutexGuard<()>>,
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        self.guard.take();
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        // Two references left (the table's and ours) means no holder and no waiter: waiters
        // clone the Arc under this same table lock before they wait.
        if Arc::strong_count(&self.mutex) == 2 {
            table.remove(&self.uid);
        }
    }
}

/// How long a prepare or unprepare waits for another plugin instance to finish with the same
/// claim before it reports the claim as busy (the kubelet retries).
const CLAIM_FILE_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// Errors of the cross-process claim locks.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClaimLockError {
    /// The lock file could not be created, opened or locked.
    #[error("locking {}: {source}", path.display())]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// Another plugin instance kept working on the claim for longer than the wait.
    #[error(
        "another plugin instance on this node has been working on claim {uid} for more than {waited:?}"
    )]
    Busy {
        uid: String,
        waited: std::time::Duration,
    },
}

/// Cross-process per-claim locks: `<dir>/<uid>.lock`, `flock`ed while a prepare, unprepare or
/// rollback of the claim runs in any plugin instance on the node.
///
/// The file is deleted by its holder before it unlocks, so the directory holds only the
/// claims being worked on. A waiter that opened the file before the deletion then holds a lock
/// on a name-less file; it notices (the path no longer leads to the inode it locked) and starts
/// over, so two instances never both believe they hold one claim.
#[derive(Clone, Debug)]
pub(crate) struct ClaimFileLocks {
    dir: std::path::PathBuf,
    wait: std::time::Duration,
}

/// What one attempt at a claim's lock file found.
enum Attempt {
    Held(std::fs::File),
    Busy,
    /// The file was deleted or replaced between open and lock: try again.
    Stale,
}

impl ClaimFileLocks {
    /// Creates `dir` if needed.
    pub(crate) fn new(dir: std::path::PathBuf) -> std::io::Result<Self> {
        std::fs::create_dir_all(&dir)?;
        Ok(Self {
            dir,
            wait: CLAIM_FILE_LOCK_WAIT,
        })
    }

    /// Locks every UID of a batch, in sorted order (every instance sorts the same way, so two
    /// overlapping batches in two processes cannot deadlock). Polls rather than blocking a
    /// thread, so a caller that gives up leaves nothing behind.
    pub(crate) async fn lock_all<'a>(
        &self,
        uids: impl IntoIterator<Item = &'a str>,
    ) -> Result<Vec<ClaimFileGuard>, ClaimLockError> {
        let mut uids: Vec<&str> = uids.into_iter().collect();
        uids.sort_unstable();
        uids.dedup();
        let mut guards = Vec::with_capacity(uids.len());
        for uid in uids {
            guards.push(self.lock(uid).await?);
        }
        Ok(guards)
    }

    /// Waits for one claim's lock, up to the wait limit.
    pub(crate) async fn lock(&self, uid: &str) -> Result<ClaimFileGuard, ClaimLockError> {
        let started = tokio::time::Instant::now();
        let mut pause = std::time::Duration::from_micros(200);
        loop {
            if let Some(guard) = self.try_lock(uid)? {
                return Ok(guard);
            }
            if started.elapsed() >= self.wait {
                return Err(ClaimLockError::Busy {
                    uid: uid.to_owned(),
                    waited: self.wait,
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_millis(20));
        }
    }

    /// Takes one claim's lock if no instance holds it; `None` when one does.
    pub(crate) fn try_lock(&self, uid: &str) -> Result<Option<ClaimFileGuard>, ClaimLockError> {
        let path = self.dir.join(format!("{}.lock", file_name_of(uid)));
        loop {
            match attempt(&path).map_err(|source| ClaimLockError::Io {
                path: path.clone(),
                source,
            })? {
                Attempt::Held(file) => return Ok(Some(ClaimFileGuard { path, file })),
                Attempt::Busy => return Ok(None),
                Attempt::Stale => continue,
            }
        }
    }
}

fn attempt(path: &std::path::Path) -> std::io::Result<Attempt> {
    use std::os::unix::fs::MetadataExt as _;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => return Ok(Attempt::Busy),
        Err(std::fs::TryLockError::Error(error)) => return Err(error),
    }
    let locked = file.metadata()?;
    match std::fs::metadata(path) {
        Ok(named) if named.dev() == locked.dev() && named.ino() == locked.ino() => {
            Ok(Attempt::Held(file))
        }
        Ok(_) => Ok(Attempt::Stale),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Attempt::Stale),
        Err(error) => Err(error),
    }
}

/// A claim UID as a file name: letters, digits and `-` as they are (Kubernetes UIDs), anything
/// else as `_xx` hex, so no UID the kubelet sends can leave the lock directory.
fn file_name_of(uid: &str) -> String {
    let mut name = String::with_capacity(uid.len());
    for byte in uid.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'-' {
            name.push(char::from(byte));
        } else {
            name.push_str(&format!("_{byte:02x}"));
        }
    }
    name
}

/// Holds one claim's cross-process lock; dropping it deletes the lock file, then unlocks.
#[derive(Debug)]
pub(crate) struct ClaimFileGuard {
    path: std::path::PathBuf,
    file: std::fs::File,
}

impl Drop for ClaimFileGuard {
    fn drop(&mut self) {
        // Delete while still holding the lock: a waiter that already opened this inode sees it
        // is no longer the one the path names and starts over.
        if let Err(error) = std::fs::remove_file(&self.path)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.path.display(), %error, "removing a claim lock file");
        }
        if let Err(error) = self.file.unlock() {
            tracing::warn!(path = %self.path.display(), %error, "releasing a claim lock");
        }
    }
}

/// The opt-in node-wide lock of [`PluginBuilder::serialize_operations`](crate::plugin::PluginBuilder::serialize_operations):
/// an async mutex for this process and an `flock` on a file shared with every other instance
/// of the plugin on the node (rolling updates), so no two prepare or unprepare batches, and no
/// start-up recovery, overlap anywhere on the node.
pub(crate) struct NodeLock {
    mutex: AsyncMutex<()>,
    file: std::fs::File,
    path: std::path::PathBuf,
}

impl NodeLock {
    /// Opens (or creates) the lock file.
    pub(crate) fn open(path: std::path::PathBuf) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)?;
        Ok(Self {
            mutex: AsyncMutex::new(()),
            file,
            path,
        })
    }

    /// Waits for the lock. The file lock is polled rather than waited for in a blocking thread,
    /// so a caller that gives up (a kubelet deadline) leaves nothing behind.
    pub(crate) async fn lock(&self) -> std::io::Result<NodeGuard<'_>> {
        let guard = self.mutex.lock().await;
        let mut pause = std::time::Duration::from_micros(100);
        loop {
            match self.file.try_lock() {
                Ok(()) => {
                    return Ok(NodeGuard {
                        file: &self.file,
                        _guard: guard,
                    });
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(std::time::Duration::from_millis(10));
                }
                Err(std::fs::TryLockError::Error(error)) => {
                    return Err(std::io::Error::new(
                        error.kind(),
                        format!("locking {}: {error}", self.path.display()),
                    ));
                }
            }
        }
    }
}

/// Holds the node-wide lock; dropping it releases the file lock, then the mutex.
pub(crate) struct NodeGuard<'a> {
    file: &'a std::fs::File,
    _guard: tokio::sync::MutexGuard<'a, ()>,
}

impl Drop for NodeGuard<'_> {
    fn drop(&mut self) {
        // Closing the file would release it too, but the file lives as long as the plugin.
        if let Err(error) = self.file.unlock() {
            tracing::warn!(%error, "releasing the node-wide operation lock");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn same_uid_is_serialized_and_table_is_cleaned() {
        let locks = ClaimLocks::default();
        let first = locks.lock("a").await;
        let other = locks.lock("b").await; // different claims do not block each other
        let locks2 = locks.clone();
        let waiter = tokio::spawn(async move { locks2.lock("a").await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished());
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .unwrap()
            .unwrap();
        drop(second);
        drop(other);
        assert_eq!(locks.len(), 0);
    }

    #[tokio::test]
    async fn claim_file_locks_exclude_each_other_and_clean_up() {
        let dir = tempfile::tempdir().unwrap();
        // Two instances: two handles on one directory, as two processes would have.
        let old = ClaimFileLocks::new(dir.path().join("claims")).unwrap();
        let new = ClaimFileLocks::new(dir.path().join("claims")).unwrap();
        let held = old.lock("uid-a").await.unwrap();
        assert!(new.try_lock("uid-a").unwrap().is_none());
        assert!(new.try_lock("uid-b").unwrap().is_some());
        let waiter = {
            let new = new.clone();
            tokio::spawn(async move { new.lock("uid-a").await.map(drop) })
        };
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!waiter.is_finished());
        drop(held);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(
            std::fs::read_dir(dir.path().join("claims"))
                .unwrap()
                .count(),
            0
        );
    }

    #[tokio::test]
    async fn claim_file_lock_waits_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let mut locks = ClaimFileLocks::new(dir.path().to_path_buf()).unwrap();
        locks.wait = Duration::from_millis(50);
        let _held = locks.try_lock("uid-a").unwrap().unwrap();
        let error = locks.lock_all(["uid-b", "uid-a"]).await.unwrap_err();
        assert!(
            matches!(error, ClaimLockError::Busy { ref uid, .. } if uid == "uid-a"),
            "{error}"
        );
    }

    #[test]
    fn odd_uids_stay_inside_the_lock_directory() {
        assert_eq!(file_name_of("0a1b-c"), "0a1b-c");
        assert_eq!(file_name_of("../x"), "_2e_2e_2fx");
    }

    #[tokio::test]
    async fn overlapping_batches_in_opposite_order_do_not_deadlock() {
        let locks = ClaimLocks::default();
        let mut tasks = Vec::new();
        for i in 0..50 {
            let locks = locks.clone();
            tasks.push(tokio::spawn(async move {
                let batch = if i % 2 == 0 {
                    ["x", "y", "z"]
                } else {
                    ["z", "y", "x"]
                };
                let _guards = locks.lock_all(batch).await;
                tokio::task::yield_now().await;
            }));
        }
        for task in tasks {
            tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .unwrap()
                .unwrap();
        }
        assert_eq!(locks.len(), 0);
    }
}
