//! The workspace's layering, checked from the source: no two modules of a crate import each
//! other (directly or around a loop), and no file is pulled in with `#[path]`.
//!
//! A module's imports are the `crate::<module>` paths in its non-test code (a file named
//! `tests.rs`, and everything from a file's first `#[cfg(test)]` on, is test code; comment lines
//! do not count). A namespace module that only re-exports (the SDK's `advanced`) counts as its
//! submodules, each a node of its own.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The crates checked, their source folder relative to the workspace root, and their namespace
/// modules.
const CRATES: &[(&str, &[&str])] = &[
    ("dra-sdk/src", &["advanced"]),
    ("dra-sdk-allocator/src", &[]),
    ("dra-sdk-derive/src", &[]),
    ("dra-sdk-testing/src", &[]),
    ("dractl/src", &[]),
    ("drivers/nvidia/src", &[]),
    ("drivers/nvidia/nvml-mock/src", &[]),
    ("examples/mock-gpu/src", &[]),
    ("examples/minimal/src", &[]),
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the test kit lives in a workspace folder")
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|error| panic!("{}: {error}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// The module graph node a file belongs to: its top-level module, or `namespace::sub`.
fn node_of(relative: &Path, namespaces: &[&str]) -> Option<String> {
    let parts: Vec<String> = relative
        .with_extension("")
        .components()
        .map(|part| part.as_os_str().to_string_lossy().into_owned())
        .collect();
    let top = parts.first()?.clone();
    if matches!(top.as_str(), "bin" | "main" | "lib") {
        return None;
    }
    match parts.get(1) {
        Some(sub) if namespaces.contains(&top.as_str()) && sub != "mod" => {
            Some(format!("{top}::{sub}"))
        }
        _ => Some(top),
    }
}

/// `crate::a` or, for a namespace `a`, `crate::a::b`, in every non-test, non-comment line.
fn imports(source: &str, namespaces: &[&str]) -> BTreeSet<String> {
    let code = source
        .find("#[cfg(test)]")
        .map_or(source, |test| &source[..test]);
    let mut found = BTreeSet::new();
    for line in code.lines() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("crate::") {
            let before = rest[..at].chars().last();
            rest = &rest[at + "crate::".len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue; // `dra_sdk_crate::`, not ours
            }
            let path: Vec<&str> = rest
                .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .next()
                .unwrap_or_default()
                .split("::")
                .collect();
            let Some(&module) = path.first().filter(|module| !module.is_empty()) else {
                continue;
            };
            if !module.starts_with(|c: char| c.is_ascii_lowercase()) {
                continue; // an item of the crate root
            }
            match path.get(1) {
                Some(sub)
                    if namespaces.contains(&module)
                        && sub.starts_with(|c: char| c.is_ascii_lowercase()) =>
                {
                    found.insert(format!("{module}::{sub}"))
                }
                _ => found.insert(module.to_string()),
            };
        }
    }
    found
}

fn graph(src: &Path, namespaces: &[&str]) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        if file.file_name().is_some_and(|name| name == "tests.rs") {
            continue;
        }
        let relative = file.strip_prefix(src).expect("under the source folder");
        let Some(node) = node_of(relative, namespaces) else {
            continue;
        };
        let source = fs::read_to_string(&file).expect("a readable source file");
        let edges = graph.entry(node.clone()).or_default();
        for target in imports(&source, namespaces) {
            // A namespace's own files (`advanced/mod.rs`) re-export; they are no node.
            if target != node && !namespaces.contains(&node.as_str()) {
                edges.insert(target);
            }
        }
    }
    graph
}

/// A path from `from` back to `to`, if there is one.
fn path_between(
    graph: &BTreeMap<String, BTreeSet<String>>,
    from: &str,
    to: &str,
    seen: &mut BTreeSet<String>,
) -> Option<Vec<String>> {
    for next in graph.get(from).into_iter().flatten() {
        if next == to {
            return Some(vec![from.to_string(), next.clone()]);
        }
        if seen.insert(next.clone())
            && let Some(mut path) = path_between(graph, next, to, seen)
        {
            path.insert(0, from.to_string());
            return Some(path);
        }
    }
    None
}

#[test]
fn no_crate_has_an_import_loop() {
    let root = workspace_root();
    let mut loops = Vec::new();
    for (src, namespaces) in CRATES {
        assert!(root.join(src).is_dir(), "{src}: no such folder");
        let graph = graph(&root.join(src), namespaces);
        for (module, targets) in &graph {
            for target in targets {
                if let Some(back) = path_between(&graph, target, module, &mut BTreeSet::new()) {
                    loops.push(format!("{src}: {module} -> {}", back.join(" -> ")));
                }
            }
        }
    }
    assert!(loops.is_empty(), "import loops:\n{}", loops.join("\n"));
}

#[test]
fn no_file_is_included_by_path() {
    let root = workspace_root();
    let mut files = Vec::new();
    for dir in [
        "dra-sdk",
        "dra-sdk-allocator",
        "dra-sdk-derive",
        "dra-sdk-testing",
        "dractl",
        "drivers",
        "examples",
    ] {
        rust_files(&root.join(dir), &mut files);
    }
    let offenders: Vec<String> = files
        .iter()
        .filter(|file| {
            fs::read_to_string(file).is_ok_and(|source| {
                source
                    .lines()
                    .any(|line| line.trim_start().starts_with("#[path"))
            })
        })
        .map(|file| file.display().to_string())
        .collect();
    assert!(offenders.is_empty(), "#[path] includes: {offenders:?}");
}

#[test]
fn the_check_sees_a_loop() {
    let namespaces = ["advanced"];
    assert_eq!(
        imports(
            "use crate::driver::X;\n// use crate::commented::Y;\nlet a = crate::advanced::cdi::Spec;\n#[cfg(test)]\nuse crate::test_only::Z;",
            &namespaces
        ),
        BTreeSet::from(["driver".to_string(), "advanced::cdi".to_string()])
    );
    let graph = BTreeMap::from([
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["c".to_string()])),
        ("c".to_string(), BTreeSet::from(["a".to_string()])),
    ]);
    assert_eq!(
        path_between(&graph, "b", "a", &mut BTreeSet::new()),
        Some(vec!["b".to_string(), "c".to_string(), "a".to_string()])
    );
}
