//! Every program the plugin can execute, and where each one comes from.
//!
//! The plugin's image is distroless (`drivers/nvidia/Dockerfile`): no shell, no `mount`, no
//! `chroot`, no `fuser`. A program the plugin runs must therefore be one of:
//!
//! * the host's own, run with the host root as `/` (`modprobe`), which the plugin reaches by
//!   re-executing its own binary as a chroot launcher ([`dra_driver_nvidia::host::chroot`]);
//! * the NVIDIA driver's, under the driver root the chart mounts (`nvidia-smi`,
//!   `nvidia-cuda-mps-control`);
//! * in the image: the plugin's own binary.
//!
//! The first test reads the sources of the plugin (this crate and the SDK, outside their test
//! modules) and fails on any program started elsewhere, naming the file; a new call site must
//! be added to [`CALL_SITES`] with its source, which the other tests then check.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dra_driver_nvidia::cdi::DriverRoot;
use dra_driver_nvidia::host::{Host, RootedHost};
use dra_driver_nvidia::sharing::Tools;
use dra_sdk_testing::deliverables::dockerfile;

/// Where a started program comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// The host's, run chrooted into the host root: the call must be `.chrooted()`.
    HostRoot,
    /// The driver's, found under the container driver root.
    DriverRoot,
    /// Runs a [`HostCommand`](dra_driver_nvidia::host::HostCommand) as given by one of the
    /// other sources, or the chroot launcher (the plugin's own binary).
    Executor,
}

/// `(file under a crate's src/, the first argument of the Command::new call, its source)`.
const CALL_SITES: &[(&str, &str, Source)] = &[
    (
        "drivers/nvidia/src/driver/vfio.rs",
        "\"modprobe\"",
        Source::HostRoot,
    ),
    (
        "drivers/nvidia/src/sharing/mod.rs",
        "&self.nvidia_smi",
        Source::DriverRoot,
    ),
    (
        "drivers/nvidia/src/sharing/mod.rs",
        "&self.mps_control",
        Source::DriverRoot,
    ),
    // `SystemHost::run`: the command's program, or the chroot launcher.
    (
        "drivers/nvidia/src/host/system.rs",
        "program",
        Source::Executor,
    ),
    // `SystemHost::spawn`: the same, detached.
    (
        "drivers/nvidia/src/host/process.rs",
        "program",
        Source::Executor,
    ),
    // The launcher, inside the host root: the chrooted program itself.
    (
        "drivers/nvidia/src/host/chroot.rs",
        "program",
        Source::Executor,
    ),
];

fn workspace() -> PathBuf {
    dockerfile::workspace(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
}

/// The code of a file before its test module.
fn outside_tests(source: &str) -> &str {
    let mut offset = 0;
    let mut lines = source.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod "))
        {
            return &source[..offset];
        }
        offset += line.len() + 1;
    }
    source
}

/// Every `Command::new(` / `HostCommand::new(` outside tests: (file, first argument, the
/// statement it starts).
fn call_sites() -> Vec<(String, String, String)> {
    let workspace = workspace();
    let mut files = Vec::new();
    for krate in ["drivers/nvidia/src", "dra-sdk/src"] {
        rust_files(&workspace.join(krate), &mut files);
    }
    // The demo binary runs on the test kit, never in the image.
    files.retain(|file| !file.ends_with("src/bin/gpu-demo.rs"));
    let mut sites = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let code = outside_tests(&text);
        let name = file.strip_prefix(&workspace).unwrap().display().to_string();
        for (at, _) in code.match_indices("Command::new(") {
            let rest = &code[at + "Command::new(".len()..];
            let argument = rest
                .split([',', ')'])
                .next()
                .unwrap_or_default()
                .trim()
                .to_owned();
            let statement = rest.split(';').next().unwrap_or_default().to_owned();
            sites.push((name.clone(), argument, statement));
        }
    }
    sites
}

#[test]
fn every_program_the_plugin_starts_is_accounted_for() {
    let sites = call_sites();
    for (file, argument, statement) in &sites {
        let known = CALL_SITES
            .iter()
            .find(|(f, a, _)| f == file && a == argument)
            .unwrap_or_else(|| {
                panic!(
                    "{file} starts `{argument}`: the image has no programs but the plugin; add \
                     it to CALL_SITES with where it comes from (host root, driver root)"
                )
            });
        if known.2 == Source::HostRoot {
            assert!(
                statement.contains(".chrooted()"),
                "{file}: `{argument}` is the host's but is not run chrooted: {statement}"
            );
        }
    }
    for (file, argument, _) in CALL_SITES {
        assert!(
            sites.iter().any(|(f, a, _)| f == file && a == argument),
            "CALL_SITES lists `{argument}` in {file}, which no longer starts it"
        );
    }
    // None of the programs the image lacks is named anywhere outside tests.
    for (file, argument, _) in &sites {
        for missing in [
            "\"mount\"",
            "\"umount\"",
            "\"chroot\"",
            "\"fuser\"",
            "\"sh\"",
        ] {
            assert_ne!(argument, missing, "{file}");
        }
    }
}

#[test]
fn the_drivers_programs_are_found_under_the_driver_root() {
    let dir = tempfile::tempdir().unwrap();
    let container_root = dir.path().join("driver-root");
    for program in ["usr/bin/nvidia-smi", "usr/bin/nvidia-cuda-mps-control"] {
        let path = container_root.join(program);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "").unwrap();
    }
    let files: Arc<dyn Host> = Arc::new(RootedHost::new(&container_root));
    let driver_root = DriverRoot::new(files, "/run/nvidia/driver");
    let host = RootedHost::new(dir.path().join("host"));
    let tools = Tools::find(&host, &driver_root).unwrap();
    for command in [
        tools.nvidia_smi(["-L"]),
        tools.mps_control(Vec::<String>::new()),
    ] {
        assert!(
            Path::new(&command.program).starts_with(&container_root),
            "{} is not under the driver root",
            command.program
        );
        assert!(!command.chroot);
    }
}

#[test]
fn the_image_has_the_binary_that_launches_chroots_and_probes_mps_daemons() {
    use dra_driver_nvidia::host::chroot;
    use dra_driver_nvidia::sharing::mps::deployment::{IMAGE_BINARY, PROBE_SUBCOMMAND};

    let text = std::fs::read_to_string(workspace().join("drivers/nvidia/Dockerfile")).unwrap();
    assert!(
        dockerfile::copies_from(&text)
            .iter()
            .any(|copy| copy.destination == IMAGE_BINARY),
        "the image does not have {IMAGE_BINARY}"
    );
    assert!(
        text.contains(&format!("ENTRYPOINT [\"{IMAGE_BINARY}\"]")),
        "the image's entrypoint is not {IMAGE_BINARY}, which /proc/self/exe re-executes"
    );
    // The built binary answers both hidden subcommands before parsing its flags (which would
    // refuse them).
    let binary = env!("CARGO_BIN_EXE_gpu-kubelet-plugin");
    let launcher = std::process::Command::new(binary)
        .arg(chroot::SUBCOMMAND)
        .output()
        .unwrap();
    assert_eq!(launcher.status.code(), Some(chroot::EXIT_CANNOT_RUN));
    assert!(
        String::from_utf8_lossy(&launcher.stderr).contains("expected `__host-exec <root>"),
        "{launcher:?}"
    );
    let probe = std::process::Command::new(binary)
        .args([PROBE_SUBCOMMAND, "/no/such/control"])
        .output()
        .unwrap();
    assert_eq!(probe.status.code(), Some(1), "{probe:?}");
}
