//! Where the recordings of real Kubernetes components are: the judge of the test doubles.
//!
//! `shared/reference/recordings/` (next to the repository) holds what real Kubernetes v1.36.2
//! components did, recorded as data: the scheduler's allocations, the API server's verdicts and
//! a kubelet's CRI conversation. The test kit's doubles are checked against every file there, so
//! a misreading shared by a double and the code it tests cannot pass unnoticed.
//!
//! [`recordings_or_skip`] finds the folder: [`ENV_RECORDINGS`] when set, otherwise
//! `../shared/reference/recordings` beside the workspace. A checkout without it skips those
//! tests with one line on standard error; a run that names the folder and does not have it
//! fails, so CI (which sets the variable) never passes without checking them.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Once;

/// Environment variable naming the recordings folder (`.../reference/recordings`).
pub const ENV_RECORDINGS: &str = "DRA_RECORDINGS";

/// The recordings folder, or `None` after printing, once per process, that the tests that
/// need it are skipped.
///
/// `workspace_root` is the folder of the repository checkout (the workspace's
/// `Cargo.toml`); the default is `<workspace_root>/../shared/reference/recordings`.
///
/// # Panics
///
/// When [`ENV_RECORDINGS`] is set and does not name a folder: a run that asked for the
/// recordings must check them.
pub fn recordings_or_skip(workspace_root: &Path) -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(ENV_RECORDINGS).filter(|dir| !dir.is_empty()) {
        let dir = PathBuf::from(dir);
        assert!(
            dir.is_dir(),
            "{ENV_RECORDINGS}={} is not a folder: the recordings cannot be checked",
            dir.display()
        );
        return Some(dir);
    }
    let dir = workspace_root.join("../shared/reference/recordings");
    if dir.is_dir() {
        return Some(dir);
    }
    static SAID: Once = Once::new();
    SAID.call_once(|| {
        let _ = writeln!(
            std::io::stderr(),
            "recordings: skipped: {} not found and {ENV_RECORDINGS} is not set (see docs/testing.md)",
            dir.display()
        );
    });
    None
}

/// The files directly in `dir` whose names end with `suffix`, sorted by name; new recordings
/// are picked up without code changes.
///
/// # Panics
///
/// When `dir` cannot be read: a recordings folder without one of its parts is broken.
pub fn files_with_suffix(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|error| panic!("reading {}: {error}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| Some(entry.ok()?.path()))
        .filter(|path| {
            path.is_file()
                && path
                    .file_name()
                    .and_then(|name| name.to_str())
                    .is_some_and(|name| name.ends_with(suffix))
        })
        .collect();
    files.sort();
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_matching_files_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["b.yaml", "a.yaml", "c.jsonl"] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        std::fs::create_dir(dir.path().join("d.yaml")).unwrap();
        let names: Vec<_> = files_with_suffix(dir.path(), ".yaml")
            .iter()
            .map(|path| path.file_name().unwrap().to_str().unwrap().to_owned())
            .collect();
        assert_eq!(names, ["a.yaml", "b.yaml"]);
    }
}
