//! Leak probes: a process's open file descriptors, its resident memory and the live tasks of a
//! tokio runtime, snapshotted together in a [`Sample`] so that a test can show a fault (or ten
//! thousand prepares) left nothing behind.
//!
//! The file descriptors are read from `/proc/<pid>/fd`. A test binary runs many tests at once
//! in one process, so a probe can be [scoped](LeakProbe::scoped_to) to a directory: it then
//! counts only descriptors that point into it, meaning files and directories under it (CDI
//! specs, the checkpoint, lock files) and Unix sockets bound under it, including the server
//! end of every accepted connection (Linux reports the listener's path for those, in
//! `/proc/net/unix`). A plugin's API connections are TCP and not counted by a scoped probe;
//! each is served by a task, which the task count sees.
//!
//! Tasks are those of one runtime ([`RuntimeMetrics::num_alive_tasks`]): a `#[tokio::test]`
//! has a runtime of its own, so the count is not disturbed by other tests. Resident memory is
//! the whole process's (`VmRSS`); it only means something in a process of its own, like a
//! bench.
//!
//! ```no_run
//! # async fn demo(cluster_dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use dra_sdk_testing::faults::leaks::LeakProbe;
//!
//! let probe = LeakProbe::current().scoped_to(cluster_dir);
//! let before = probe.sample()?;
//! // ... open and drop connections, prepare and unprepare ...
//! let after = probe.settled(&before, Duration::from_secs(10)).await?;
//! println!("{before} -> {after}");
//! # Ok(()) }
//! ```
//!
//! [`RuntimeMetrics::num_alive_tasks`]: tokio::runtime::RuntimeMetrics::num_alive_tasks

pub mod soak;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Why a probe failed, or what it found left behind.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeakError {
    /// A file under `/proc` could not be read.
    #[error("reading {path}: {source}")]
    Proc {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Descriptors or tasks stayed above the baseline for the whole wait.
    #[error("still above the baseline after {waited:?}: baseline {baseline}, now {now}")]
    Leaked {
        /// The sample to return to.
        baseline: Sample,
        /// The last sample taken.
        now: Sample,
        /// How long the probe waited.
        waited: Duration,
    },
}

/// What a probe measured at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Open file descriptors (of the probe's scope).
    pub fds: usize,
    /// Resident memory of the whole process, in KiB (`VmRSS`); 0 when unreadable.
    pub rss_kib: u64,
    /// Live tasks of the probe's runtime; `None` without one.
    pub tasks: Option<usize>,
}

impl Sample {
    /// Whether the descriptors and tasks are at most `baseline`'s (resident memory is not
    /// compared: an allocator keeps freed memory, so it need not return to where it was).
    pub fn within(&self, baseline: &Sample) -> bool {
        self.fds <= baseline.fds
            && match (self.tasks, baseline.tasks) {
                (Some(now), Some(then)) => now <= then,
                _ => true,
            }
    }
}

/// `fds 12, rss 20.5 MiB, tasks 31`.
impl fmt::Display for Sample {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "fds {}, rss {:.1} MiB, tasks ",
            self.fds,
            self.rss_kib as f64 / 1024.0
        )?;
        match self.tasks {
            Some(tasks) => write!(f, "{tasks}"),
            None => f.write_str("-"),
        }
    }
}

/// What to measure: which process, which of its descriptors, which runtime's tasks.
#[derive(Clone, Debug)]
pub struct LeakProbe {
    pid: u32,
    scope: Option<PathBuf>,
    runtime: Option<tokio::runtime::Handle>,
}

impl LeakProbe {
    /// This process, all its descriptors, and the tasks of the tokio runtime it is called on
    /// (none outside one).
    pub fn current() -> Self {
        Self {
            pid: std::process::id(),
            scope: None,
            runtime: tokio::runtime::Handle::try_current().ok(),
        }
    }

    /// Another process (a plugin binary a test started): its descriptors and memory; no
    /// tasks.
    pub fn process(pid: u32) -> Self {
        Self {
            pid,
            scope: None,
            runtime: None,
        }
    }

    /// Counts only descriptors pointing into `dir`: files and directories under it and Unix
    /// sockets bound under it (listeners and the server ends of their connections).
    #[must_use]
    pub fn scoped_to(mut self, dir: impl Into<PathBuf>) -> Self {
        self.scope = Some(dir.into());
        self
    }

    /// Takes a sample now.
    pub fn sample(&self) -> Result<Sample, LeakError> {
        Ok(Sample {
            fds: self.count_fds()?,
            rss_kib: crate::deliverables::memory::rss_kib(self.pid).map_or(0, |[rss, ..]| rss),
            tasks: self
                .runtime
                .as_ref()
                .map(|runtime| runtime.metrics().num_alive_tasks()),
        })
    }

    /// Samples every 20 ms until descriptors and tasks are back at `baseline` or below
    /// ([`Sample::within`]), for at most `timeout`: connections and streams are closed by
    /// tasks that run after the caller dropped its end, so a leak is only what stays.
    pub async fn settled(&self, baseline: &Sample, timeout: Duration) -> Result<Sample, LeakError> {
        let started = Instant::now();
        loop {
            let now = self.sample()?;
            if now.within(baseline) {
                return Ok(now);
            }
            if started.elapsed() >= timeout {
                return Err(LeakError::Leaked {
                    baseline: *baseline,
                    now,
                    waited: started.elapsed(),
                });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A sample once two in a row, 20 ms apart, agree on descriptors and tasks (at most half a
    /// second): the baseline to take when the tasks of the last answers may still be ending.
    pub async fn steady(&self) -> Result<Sample, LeakError> {
        let mut last = self.sample()?;
        for _ in 0..25 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let now = self.sample()?;
            if now.within(&last) && last.within(&now) {
                return Ok(now);
            }
            last = now;
        }
        Ok(last)
    }

    /// What each counted descriptor points at (`/path`, `socket:[inode] /bound/path`), for a
    /// failure message that says what leaked.
    pub fn describe_fds(&self) -> Result<Vec<String>, LeakError> {
        let sockets = self.scope.as_ref().map(|_| bound_unix_sockets());
        let mut described = Vec::new();
        for target in self.fd_targets()? {
            match (&self.scope, &sockets) {
                (Some(scope), Some(sockets)) => {
                    if let Some(path) = in_scope(&target, scope, sockets) {
                        described.push(path);
                    }
                }
                _ => described.push(target.to_string_lossy().into_owned()),
            }
        }
        described.sort();
        Ok(described)
    }

    fn count_fds(&self) -> Result<usize, LeakError> {
        let targets = self.fd_targets()?;
        let Some(scope) = &self.scope else {
            return Ok(targets.len());
        };
        let sockets = bound_unix_sockets();
        Ok(targets
            .iter()
            .filter(|target| in_scope(target, scope, &sockets).is_some())
            .count())
    }

    /// Where each open descriptor points (`readlink /proc/<pid>/fd/<n>`). A descriptor closed
    /// between the listing and the read is skipped.
    fn fd_targets(&self) -> Result<Vec<PathBuf>, LeakError> {
        let dir = PathBuf::from(format!("/proc/{}/fd", self.pid));
        let entries = std::fs::read_dir(&dir).map_err(|source| LeakError::Proc {
            path: dir.clone(),
            source,
        })?;
        let mut targets = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| LeakError::Proc {
                path: dir.clone(),
                source,
            })?;
            if let Ok(target) = std::fs::read_link(entry.path()) {
                targets.push(target);
            }
        }
        // The listing itself held one descriptor of this process while it ran; it is closed
        // now, and was counted only when probing ourselves.
        if self.pid == std::process::id() {
            targets.retain(|target| target != &dir);
        }
        Ok(targets)
    }
}

/// The descriptor's place under `scope`, if it has one: its path, or for a socket the path it
/// is bound to.
fn in_scope(target: &Path, scope: &Path, sockets: &HashMap<u64, PathBuf>) -> Option<String> {
    if target.starts_with(scope) {
        return Some(target.to_string_lossy().into_owned());
    }
    let inode = socket_inode(target)?;
    let bound = sockets.get(&inode)?;
    bound
        .starts_with(scope)
        .then(|| format!("socket:[{inode}] {}", bound.display()))
}

/// `socket:[12345]` -> 12345.
fn socket_inode(target: &Path) -> Option<u64> {
    target
        .to_str()?
        .strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// Unix sockets with a path, by inode, from `/proc/net/unix` (columns: Num RefCount Protocol
/// Flags Type St Inode Path). Empty when unreadable: a scoped probe then counts files only.
fn bound_unix_sockets() -> HashMap<u64, PathBuf> {
    let Ok(table) = std::fs::read_to_string("/proc/net/unix") else {
        return HashMap::new();
    };
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let mut columns = line.split_whitespace();
            let inode = columns.nth(6)?.parse().ok()?;
            let path = columns.next()?;
            Some((inode, PathBuf::from(path)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_scoped_probe_counts_files_and_both_ends_of_accepted_sockets_under_its_dir() {
        let dir = tempfile::tempdir().unwrap();
        let probe = LeakProbe::current().scoped_to(dir.path());
        let before = probe.sample().unwrap();
        assert_eq!(before.fds, 0);
        assert!(before.tasks.is_some());

        let file = std::fs::File::create(dir.path().join("spec.json")).unwrap();
        let listener = tokio::net::UnixListener::bind(dir.path().join("s.sock")).unwrap();
        let client = tokio::net::UnixStream::connect(dir.path().join("s.sock"))
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        // The file, the listener and the accepted end; the client end has no path.
        assert_eq!(probe.sample().unwrap().fds, 3, "{:?}", probe.describe_fds());

        drop((file, server, client, listener));
        let after = probe
            .settled(&before, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(after.fds, 0);
    }

    #[tokio::test]
    async fn a_task_still_running_is_reported_as_left_behind() {
        let probe = LeakProbe::current();
        let before = probe.sample().unwrap();
        let stuck = tokio::spawn(std::future::pending::<()>());
        let error = probe
            .settled(&before, Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(
            error.to_string().contains("still above the baseline"),
            "{error}"
        );
        stuck.abort();
        let _ = stuck.await;
        probe
            .settled(&before, Duration::from_secs(5))
            .await
            .unwrap();
    }

    #[test]
    fn samples_print_all_three_values() {
        let sample = Sample {
            fds: 12,
            rss_kib: 20 * 1024 + 512,
            tasks: Some(31),
        };
        assert_eq!(sample.to_string(), "fds 12, rss 20.5 MiB, tasks 31");
        assert!(sample.within(&sample));
        assert!(!Sample { fds: 13, ..sample }.within(&sample));
        assert!(
            !Sample {
                tasks: Some(32),
                ..sample
            }
            .within(&sample)
        );
    }
}
