//! Looking at a CDI root the way a container runtime does: which spec files there are, whether
//! they validate, and which file defines a CDI device ID.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use dra_sdk::advanced::cdi::{QualifiedName, Spec};

/// The spec files of a CDI root and their contents at one moment.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    files: BTreeMap<PathBuf, Vec<u8>>,
}

/// Runtimes read `.json` and `.yaml` files only, and temporary files are hidden.
fn is_spec_file(path: &Path) -> bool {
    let hidden = path
        .file_name()
        .and_then(|name| name.to_str())
        .is_none_or(|name| name.starts_with('.'));
    let extension = path.extension().and_then(|e| e.to_str());
    !hidden && matches!(extension, Some("json" | "yaml"))
}

impl Snapshot {
    /// Reads every spec file of `root`. A file that disappears while being read is skipped.
    pub(crate) fn take(root: &Path) -> Result<Self, String> {
        let entries = std::fs::read_dir(root)
            .map_err(|error| format!("reading the CDI root {}: {error}", root.display()))?;
        let mut files = BTreeMap::new();
        for entry in entries {
            let entry = entry
                .map_err(|error| format!("reading the CDI root {}: {error}", root.display()))?;
            let path = entry.path();
            if !is_spec_file(&path) {
                continue;
            }
            match std::fs::read(&path) {
                Ok(bytes) => {
                    files.insert(path, bytes);
                }
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(format!("reading {}: {error}", path.display())),
            }
        }
        Ok(Self { files })
    }

    /// Files that are new or changed compared to `before`.
    pub(crate) fn changed_since(&self, before: &Snapshot) -> BTreeSet<PathBuf> {
        self.files
            .iter()
            .filter(|(path, bytes)| before.files.get(*path) != Some(*bytes))
            .map(|(path, _)| path.clone())
            .collect()
    }

    /// Whether `path` is among the files.
    pub(crate) fn contains(&self, path: &Path) -> bool {
        self.files.contains_key(path)
    }

    /// Parses and validates the given files of the snapshot; returns one message per file that
    /// fails, naming the file.
    pub(crate) fn invalid_among(&self, paths: &BTreeSet<PathBuf>) -> Vec<String> {
        paths
            .iter()
            .filter_map(|path| {
                let bytes = self.files.get(path)?;
                Spec::parse(bytes)
                    .err()
                    .map(|error| format!("{} does not validate: {error}", path.display()))
            })
            .collect()
    }

    /// The valid specs of the snapshot, by file.
    fn specs(&self) -> impl Iterator<Item = (&PathBuf, Spec)> {
        self.files
            .iter()
            .filter_map(|(path, bytes)| Spec::parse(bytes).ok().map(|spec| (path, spec)))
    }

    /// For each CDI ID, the files that define it (several files make it unresolvable for
    /// runtimes). Malformed IDs map to an error.
    pub(crate) fn resolve<'a>(
        &self,
        ids: impl IntoIterator<Item = &'a String>,
    ) -> BTreeMap<String, Result<Vec<PathBuf>, String>> {
        let specs: Vec<(&PathBuf, Spec)> = self.specs().collect();
        ids.into_iter()
            .map(|id| {
                let found = id
                    .parse::<QualifiedName>()
                    .map_err(|error| format!("{id:?} is not a CDI device ID: {error}"))
                    .map(|name| {
                        specs
                            .iter()
                            .filter(|(_, spec)| spec.kind == *name.kind())
                            .filter(|(_, spec)| {
                                spec.devices.iter().any(|device| device.name == name.name())
                            })
                            .map(|(path, _)| (*path).clone())
                            .collect()
                    });
                (id.clone(), found)
            })
            .collect()
    }

    /// The qualified names of every device the given file defines (empty if it does not parse).
    pub(crate) fn devices_of(&self, path: &Path) -> BTreeSet<String> {
        self.files
            .get(path)
            .and_then(|bytes| Spec::parse(bytes).ok())
            .map(|spec| {
                spec.devices
                    .iter()
                    .map(|device| format!("{}={}", spec.kind, device.name))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Problems with how `ids` resolve in `snapshot`: every ID must be defined by exactly one
/// valid spec file.
pub(crate) fn unresolved(snapshot: &Snapshot, ids: &BTreeSet<String>) -> Vec<String> {
    snapshot
        .resolve(ids)
        .into_iter()
        .filter_map(|(id, found)| match found {
            Err(error) => Some(error),
            Ok(files) if files.is_empty() => {
                Some(format!("{id} is not defined by any valid spec file"))
            }
            Ok(files) if files.len() > 1 => Some(format!(
                "{id} is defined by {} files ({}), which runtimes refuse to resolve",
                files.len(),
                display_paths(&files)
            )),
            Ok(_) => None,
        })
        .collect()
}

/// IDs among `ids` that some spec file of `snapshot` still defines.
pub(crate) fn still_defined(snapshot: &Snapshot, ids: &BTreeSet<String>) -> Vec<String> {
    snapshot
        .resolve(ids)
        .into_iter()
        .filter_map(|(id, found)| match found {
            Ok(files) if !files.is_empty() => Some(format!(
                "{id} is still defined in {}",
                display_paths(&files)
            )),
            _ => None,
        })
        .collect()
}

pub(crate) fn display_paths(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|path| path.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, kind: &str, devices: &[&str]) {
        let devices: Vec<_> = devices
            .iter()
            .map(|d| serde_json::json!({"name": d, "containerEdits": {"env": ["A=1"]}}))
            .collect();
        let spec = serde_json::json!({"cdiVersion": "0.5.0", "kind": kind, "devices": devices});
        std::fs::write(dir.join(name), serde_json::to_vec(&spec).unwrap()).unwrap();
    }

    #[test]
    fn resolves_ids_across_files_and_flags_duplicates() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a.json", "example.com/gpu", &["u1-gpu-0"]);
        write(
            dir.path(),
            "b.yaml",
            "example.com/gpu",
            &["shared", "u2-gpu-1"],
        );
        write(dir.path(), "c.json", "example.com/gpu", &["shared"]);
        write(dir.path(), "ignored.yml", "example.com/gpu", &["u3"]);
        std::fs::write(dir.path().join("broken.json"), b"{").unwrap();
        let snapshot = Snapshot::take(dir.path()).unwrap();
        let ids: BTreeSet<String> = [
            "example.com/gpu=u1-gpu-0",
            "example.com/gpu=shared",
            "example.com/gpu=u3",
            "no-equals-sign",
        ]
        .map(String::from)
        .into();
        let problems = unresolved(&snapshot, &ids);
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(
            problems
                .iter()
                .any(|p| p.contains("shared is defined by 2 files"))
        );
        assert!(problems.iter().any(|p| p.contains("u3 is not defined")));
        assert!(problems.iter().any(|p| p.contains("not a CDI device ID")));
        let broken: BTreeSet<PathBuf> = [dir.path().join("broken.json")].into();
        assert_eq!(snapshot.invalid_among(&broken).len(), 1);
    }

    #[test]
    fn changes_are_new_or_rewritten_files() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a.json", "example.com/gpu", &["one"]);
        write(dir.path(), "b.json", "example.com/gpu", &["two"]);
        let before = Snapshot::take(dir.path()).unwrap();
        write(dir.path(), "b.json", "example.com/gpu", &["two", "three"]);
        write(dir.path(), ".b.json.tmp", "example.com/gpu", &["x"]);
        write(dir.path(), "c.json", "example.com/gpu", &["four"]);
        let after = Snapshot::take(dir.path()).unwrap();
        let changed: Vec<_> = after.changed_since(&before).into_iter().collect();
        assert_eq!(
            changed,
            [dir.path().join("b.json"), dir.path().join("c.json")]
        );
        assert_eq!(after.devices_of(&dir.path().join("b.json")).len(), 2);
    }
}
