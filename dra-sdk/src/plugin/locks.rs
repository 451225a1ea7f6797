//! Per-claim serialization: one claim is never prepared or unprepared twice at once, while
//! different claims proceed in parallel. A node-wide lock ([`NodeLock`]) only for drivers that
//! opt in.

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
