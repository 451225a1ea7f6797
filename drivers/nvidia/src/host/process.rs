//! Processes the plugin starts and must find again after a restart (the MPS control daemon).
//!
//! A pid alone is not an identity: after the daemon exits, the kernel may hand its pid to any
//! other process. A process is therefore recorded as its pid **and its start time** (field 22
//! of `/proc/<pid>/stat`, in clock ticks since boot); a restarted plugin adopts a recorded
//! process only when both match, and never signals a process whose start time differs.
//!
//! These look at the plugin's own `/proc` (the processes it started live in its pid
//! namespace), never at a host root.

use std::path::Path;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use super::{HostCommand, HostError};

/// A process as the plugin recorded it: pid and start time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessId {
    /// The process ID.
    pub pid: u32,
    /// Its start time, in clock ticks after boot (`/proc/<pid>/stat` field 22).
    pub start_time: u64,
}

impl ProcessId {
    /// Whether this very process is still running: the pid exists, is not a zombie, and
    /// started at the recorded time.
    pub fn is_running(&self) -> bool {
        matches!(start_time(self.pid), Ok(Some(time)) if time == self.start_time)
    }
}

/// The start time of a running process, `None` when there is no such process or it is a
/// zombie (exited, not yet reaped).
pub fn start_time(pid: u32) -> Result<Option<u64>, HostError> {
    let path = format!("/proc/{pid}/stat");
    let stat = match std::fs::read_to_string(&path) {
        Ok(stat) => stat,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(HostError::read(Path::new(&path), source)),
    };
    // `pid (comm) state ppid ...`: comm may hold spaces and parentheses, so split after the
    // last `)`. Fields after it start at field 3 (state).
    let malformed = || HostError::Malformed {
        path: path.clone().into(),
        reason: "not the kernel's stat format".into(),
    };
    let rest = stat
        .rfind(')')
        .map(|end| &stat[end + 1..])
        .ok_or_else(malformed)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if fields.first() == Some(&"Z") || fields.first() == Some(&"X") {
        return Ok(None);
    }
    // Field 22 is index 19 after the state (field 3).
    let time = fields
        .get(19)
        .and_then(|field| field.parse().ok())
        .ok_or_else(malformed)?;
    Ok(Some(time))
}

/// Starts `command` (run as `program` with `args`; `command`'s environment is added)
/// detached: own process group, null standard streams, reaped by a thread so that it never
/// lingers as a zombie while the plugin runs.
pub(super) fn spawn_detached(
    command: &HostCommand,
    program: &str,
    args: &[String],
) -> Result<ProcessId, HostError> {
    use std::os::unix::process::CommandExt as _;
    let failed = |reason: String| HostError::Command {
        command: command.to_string(),
        reason,
    };
    let mut child = Command::new(program)
        .args(args)
        .envs(command.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|error| failed(error.to_string()))?;
    let pid = child.id();
    let start = start_time(pid)?;
    std::thread::Builder::new()
        .name(format!("reap-{pid}"))
        .spawn(move || {
            let _ = child.wait();
        })
        .map_err(|error| failed(format!("starting its reaper thread: {error}")))?;
    let start_time = start.ok_or_else(|| failed("it exited at once".into()))?;
    Ok(ProcessId { pid, start_time })
}

/// Sends SIGTERM or SIGKILL to a recorded process, if it is still that process.
pub(super) fn signal(process: &ProcessId, force: bool) -> Result<(), HostError> {
    if !process.is_running() {
        return Ok(());
    }
    let pid = rustix::process::Pid::from_raw(i32::try_from(process.pid).unwrap_or(i32::MAX))
        .ok_or_else(|| HostError::Command {
            command: format!("kill {}", process.pid),
            reason: "not a valid pid".into(),
        })?;
    let signal = if force {
        rustix::process::Signal::KILL
    } else {
        rustix::process::Signal::TERM
    };
    match rustix::process::kill_process(pid, signal) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
        Err(errno) => Err(HostError::Command {
            command: format!(
                "kill -{} {}",
                if force { "KILL" } else { "TERM" },
                process.pid
            ),
            reason: errno.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_started_process_is_identified_by_pid_and_start_time() {
        let sleep = HostCommand::new("sleep", ["30"]);
        let process = spawn_detached(&sleep, "sleep", &sleep.args).unwrap();
        assert!(process.is_running());
        let other = ProcessId {
            start_time: process.start_time + 1,
            ..process
        };
        assert!(!other.is_running(), "a reused pid is not the same process");
        // Not ours any more: never signalled.
        signal(&other, true).unwrap();
        assert!(process.is_running());
        signal(&process, false).unwrap();
        for _ in 0..200 {
            if !process.is_running() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!process.is_running());
        assert_eq!(start_time(u32::MAX).unwrap(), None);
    }
}
