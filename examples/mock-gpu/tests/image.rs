//! The container image's recipe, checked without a container engine (none runs in this
//! project's CI): the build stage's cargo command names a profile, package and binary that
//! exist with features the plugin builds with, and the path the final stage copies is where
//! that command puts the binary; `.dockerignore` keeps `target/` out of the build context.

use dra_sdk_testing::deliverables::dockerfile;

use std::path::PathBuf;

const DOCKERFILE: &str = "examples/mock-gpu/Dockerfile";

#[test]
fn the_build_stage_builds_the_plugin_with_an_existing_profile() {
    let workspace = dockerfile::workspace(env!("CARGO_MANIFEST_DIR"));
    let args = dockerfile::check_build_stage(
        &workspace,
        DOCKERFILE,
        env!("CARGO_PKG_NAME"),
        "mock-gpu-kubelet-plugin",
    );
    assert!(
        args.contains(&"--no-default-features".to_owned()),
        "{args:?}"
    );
    // The binary exists under that name in this package (Cargo built it for this test).
    assert!(PathBuf::from(env!("CARGO_BIN_EXE_mock-gpu-kubelet-plugin")).is_file());
}

#[test]
fn the_image_ships_the_admission_webhook_next_to_the_plugin() {
    let workspace = dockerfile::workspace(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(workspace.join(DOCKERFILE)).unwrap();
    let args = dockerfile::cargo_build_args(&text);
    let bins: Vec<&str> = args
        .windows(2)
        .filter(|pair| pair[0] == "--bin")
        .map(|pair| pair[1].as_str())
        .collect();
    assert_eq!(bins, ["mock-gpu-kubelet-plugin", "mock-gpu-webhook"]);
    // Built, installed into the final stage at the path the chart's webhook Deployment runs.
    assert!(text.contains("install -D -m 0755 target/dist/mock-gpu-webhook /out/mock-gpu-webhook"));
    let copies = dockerfile::copies_from(&text);
    assert!(
        copies.iter().any(|copy| copy.from == "build"
            && copy.sources == ["/out/mock-gpu-webhook"]
            && copy.destination == "/usr/bin/mock-gpu-webhook"),
        "{copies:?}"
    );
    assert!(PathBuf::from(env!("CARGO_BIN_EXE_mock-gpu-webhook")).is_file());
    // .ci/run type-checks the image's build command, both binaries included.
    let ci = std::fs::read_to_string(workspace.join(".ci/run")).unwrap();
    let check = format!("cargo check {}", args.join(" ")).replace(" --profile dist", "");
    assert!(ci.contains(&check), ".ci/run lacks `{check}`");
}

#[test]
fn the_toolchain_of_the_build_image_is_the_pinned_one() {
    dockerfile::check_toolchain(
        &dockerfile::workspace(env!("CARGO_MANIFEST_DIR")),
        DOCKERFILE,
    );
}

#[test]
fn the_build_context_leaves_target_out() {
    dockerfile::check_build_context(&dockerfile::workspace(env!("CARGO_MANIFEST_DIR")));
}
