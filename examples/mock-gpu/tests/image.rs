//! The container image's recipe, checked without a container engine (none runs in this
//! project's CI): the build stage's cargo command names a profile, package and binary that
//! exist with features the plugin builds with, and the path the final stage copies is where
//! that command puts the binary; `.dockerignore` keeps `target/` out of the build context.

use std::path::PathBuf;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn dockerfile() -> String {
    std::fs::read_to_string(workspace().join("examples/mock-gpu/Dockerfile")).unwrap()
}

/// The words after `cargo build` in the Dockerfile.
fn cargo_build_args() -> Vec<String> {
    let text = dockerfile().replace("\\\n", " ");
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

fn flag(args: &[String], name: &str) -> String {
    let at = args
        .iter()
        .position(|a| a == name)
        .unwrap_or_else(|| panic!("{name} missing"));
    args[at + 1].clone()
}

#[test]
fn the_build_stage_builds_the_plugin_with_an_existing_profile() {
    let args = cargo_build_args();
    assert!(args.contains(&"--locked".to_owned()), "{args:?}");
    assert!(
        args.contains(&"--no-default-features".to_owned()),
        "{args:?}"
    );
    assert_eq!(flag(&args, "-p"), env!("CARGO_PKG_NAME"));
    let binary = flag(&args, "--bin");
    assert_eq!(binary, "mock-gpu-kubelet-plugin");
    // The binary exists under that name in this package (Cargo built it for this test).
    assert!(PathBuf::from(env!("CARGO_BIN_EXE_mock-gpu-kubelet-plugin")).is_file());
    let profile = flag(&args, "--profile");
    let manifest = std::fs::read_to_string(workspace().join("Cargo.toml")).unwrap();
    assert!(
        manifest.contains(&format!("[profile.{profile}]")),
        "no profile {profile}"
    );
    // Cargo puts a custom profile's output in target/<profile>/.
    let text = dockerfile();
    let built = format!("target/{profile}/{binary}");
    assert!(
        text.contains(&built),
        "the Dockerfile does not take {built}"
    );
    assert!(text.contains(&format!("/usr/bin/{binary}")));
    assert!(text.contains(&format!("ENTRYPOINT [\"/usr/bin/{binary}\"]")));
}

#[test]
fn the_toolchain_of_the_build_image_is_the_pinned_one() {
    let pinned = std::fs::read_to_string(workspace().join("rust-toolchain.toml")).unwrap();
    let channel = pinned
        .lines()
        .find_map(|line| line.trim().strip_prefix("channel"))
        .and_then(|rest| rest.split('"').nth(1))
        .expect("a channel in rust-toolchain.toml")
        .to_owned();
    let from = format!("rust:{}-", channel.trim_end_matches(".0"));
    assert!(
        dockerfile().contains(&from),
        "the build image is not {from}*"
    );
}

#[test]
fn the_build_context_leaves_target_out() {
    let ignore = std::fs::read_to_string(workspace().join(".dockerignore")).unwrap();
    for pattern in ["target/", ".git/"] {
        assert!(
            ignore.lines().any(|line| line.trim() == pattern),
            "{pattern}"
        );
    }
}
