//! Compile-time errors of the derives: every message is pinned in `ui/fail/*.stderr`. Code that
//! must compile is tested as ordinary tests (`renamed_crate.rs`): a trybuild `pass` case would
//! make trybuild build, not only check, the SDK's dependency tree again (minutes in CI).
//!
//! Compiler output changes between Rust releases, so the expected files are for the toolchain
//! pinned in `rust-toolchain.toml`; other toolchains skip the test. After an intended change,
//! regenerate with `TRYBUILD=overwrite cargo test --workspace --all-features --test ui` (the README test command's feature set: the expected compiler output lists trait implementations, which depend on the enabled features) and review the
//! diff.

use std::process::Command;

/// The toolchain the `.stderr` files were written with.
const PINNED_RUSTC: &str = "rustc 1.95.";

#[test]
fn ui() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let version = Command::new(rustc)
        .arg("--version")
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).into_owned())
        .unwrap_or_default();
    if !version.starts_with(PINNED_RUSTC) {
        eprintln!("skipping UI tests: expected output is for {PINNED_RUSTC}x, found {version:?}");
        return;
    }
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/fail/*.rs");
}
