//! Checks of a plugin image's Dockerfile without a container engine (none runs in this
//! project's CI), shared by the drivers of this repository: the build stage's `cargo build`
//! names a profile, package and binary that exist, and the final stage copies the binary from
//! where that command puts it.

use std::path::{Path, PathBuf};

/// The repository root, from a crate two levels below it.
pub fn workspace(manifest_dir: &str) -> PathBuf {
    Path::new(manifest_dir).join("../..")
}

/// The words after `cargo build` in a Dockerfile, up to the next `&&`.
pub fn cargo_build_args(dockerfile: &str) -> Vec<String> {
    let text = dockerfile.replace("\\\n", " ");
    let line = text
        .lines()
        .find(|line| line.contains("cargo build"))
        .expect("a cargo build step");
    let after = &line[line.find("cargo build").unwrap() + "cargo build".len()..];
    after
        .split("&&")
        .next()
        .unwrap()
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// The value after `name` in `args`.
pub fn flag(args: &[String], name: &str) -> String {
    let at = args
        .iter()
        .position(|a| a == name)
        .unwrap_or_else(|| panic!("{name} missing"));
    args[at + 1].clone()
}

/// The Dockerfile at `path` builds `binary` of `package` with `--locked`, under a profile of
/// the workspace's manifest, and the final stage copies it from `target/<profile>/` to
/// `/usr/bin/` and runs it. Returns the build command's arguments for further checks.
pub fn check_build_stage(workspace: &Path, path: &str, package: &str, binary: &str) -> Vec<String> {
    let text = std::fs::read_to_string(workspace.join(path)).unwrap();
    let args = cargo_build_args(&text);
    assert!(args.contains(&"--locked".to_owned()), "{args:?}");
    assert_eq!(flag(&args, "-p"), package);
    assert_eq!(flag(&args, "--bin"), binary);
    let profile = flag(&args, "--profile");
    let manifest = std::fs::read_to_string(workspace.join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains(&format!("[profile.{profile}]")),
        "no profile {profile}"
    );
    // Cargo puts a custom profile's output in target/<profile>/.
    let built = format!("target/{profile}/{binary}");
    assert!(text.contains(&built), "{path} does not take {built}");
    assert!(text.contains(&format!("/usr/bin/{binary}")));
    assert!(text.contains(&format!("ENTRYPOINT [\"/usr/bin/{binary}\"]")));
    args
}

/// The build image is `rust:<the pinned toolchain>-…` (the exact version: `rust:1.95` would
/// float to the newest 1.95.x), and it adds the toolchain file's components.
pub fn check_toolchain(workspace: &Path, path: &str) {
    let pinned = std::fs::read_to_string(workspace.join("rust-toolchain.toml")).unwrap();
    let field = |name: &str| {
        pinned
            .lines()
            .find_map(|line| line.trim().strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in rust-toolchain.toml"))
            .to_owned()
    };
    let channel = field("channel")
        .split('"')
        .nth(1)
        .expect("a channel in rust-toolchain.toml")
        .to_owned();
    assert_eq!(
        channel.split('.').count(),
        3,
        "{channel}: not an exact version"
    );
    let from = format!("FROM docker.io/library/rust:{channel}-");
    let text = std::fs::read_to_string(workspace.join(path)).unwrap();
    assert!(
        text.contains(&from),
        "{path}: the build image is not {from}*"
    );
    let components: Vec<String> = field("components")
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    let add = text
        .lines()
        .find(|line| line.contains("rustup component add"))
        .unwrap_or_else(|| panic!("{path}: no rustup component add"));
    for component in &components {
        assert!(
            add.split_whitespace().any(|word| word == component),
            "{path}: {add} lacks {component}"
        );
    }
}

/// `.dockerignore` keeps `target/` and `.git/` out of every image's build context.
pub fn check_build_context(workspace: &Path) {
    let ignore = std::fs::read_to_string(workspace.join(".dockerignore")).unwrap();
    for pattern in ["target/", ".git/"] {
        assert!(
            ignore.lines().any(|line| line.trim() == pattern),
            "{pattern}"
        );
    }
}
