//! The real host's side effects that need no program from the image: chrooted commands run by
//! re-executing the plugin's binary, and tmpfs mounts by system call. Each test checks the
//! outcome where the test runs with the privileges the plugin has (root with `CAP_SYS_CHROOT`
//! and `CAP_SYS_ADMIN`, as in CI's containers), and the exact error where it does not.

use std::path::Path;

use dra_driver_nvidia::host::chroot::ChrootLauncher;
use dra_driver_nvidia::host::{Host, HostCommand, HostError, SystemHost};

fn host(root: &Path) -> SystemHost {
    SystemHost::rooted(root).with_chroot_launcher(ChrootLauncher::binary(env!(
        "CARGO_BIN_EXE_gpu-kubelet-plugin"
    )))
}

#[test]
fn a_chrooted_command_runs_with_the_host_root_as_slash() {
    let dir = tempfile::tempdir().unwrap();
    // A root that is not spelled `/` but is the real root: the programs of this machine are
    // there to run, and `pwd` shows where the launcher left the working directory.
    let root = dir.path().join("host-root");
    std::os::unix::fs::symlink("/", &root).unwrap();
    let command = HostCommand::new("sh", ["-c", "echo ran; pwd"])
        .env("GREETING", "kept")
        .chrooted();
    match host(&root).run(&command) {
        Ok(output) => {
            assert!(output.success(), "{output:?}");
            assert_eq!(output.stdout, "ran\n/\n");
        }
        Err(HostError::Command { reason, .. }) => {
            // Without CAP_SYS_CHROOT: the launcher says which root it could not enter.
            assert!(
                reason.starts_with(&format!("changing the root to {}", root.display())),
                "{reason}"
            );
        }
        Err(other) => panic!("{other}"),
    }
}

#[test]
fn a_program_missing_from_the_host_root_is_a_command_error_naming_both() {
    let root = tempfile::tempdir().unwrap();
    let error = host(root.path())
        .run(&HostCommand::new("modprobe", ["vfio-pci"]).chrooted())
        .unwrap_err();
    let HostError::Command { command, reason } = &error else {
        panic!("{error}");
    };
    assert_eq!(command, "modprobe vfio-pci");
    let root = root.path().display();
    assert!(
        reason.starts_with(&format!("running modprobe in {root}: "))
            || reason.starts_with(&format!("changing the root to {root}: ")),
        "{reason}"
    );
}

#[test]
fn commands_not_marked_chrooted_run_in_the_plugins_own_filesystem() {
    let root = tempfile::tempdir().unwrap();
    let output = host(root.path())
        .run(&HostCommand::new("sh", ["-c", "echo here"]))
        .unwrap();
    assert_eq!(output.stdout, "here\n");
}

#[test]
fn a_tmpfs_is_mounted_and_unmounted_by_system_call() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("shm");
    std::fs::create_dir(&target).unwrap();
    let host = SystemHost::new();
    match host.mount_tmpfs(&target, "1024k") {
        Ok(()) => {
            let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            let line = mounts
                .lines()
                .find(|line| line.split(' ').nth(4) == Some(target.to_str().unwrap()))
                .unwrap_or_else(|| panic!("{} not in mountinfo", target.display()));
            for option in ["nosuid", "nodev", "noexec"] {
                assert!(line.contains(option), "{line}");
            }
            assert!(
                line.contains(" - tmpfs tmpfs ") && line.contains("size=1024k"),
                "{line}"
            );
            assert!(host.unmount(&target).unwrap());
            // Unmounted already (an interrupted earlier unprepare): nothing to do.
            assert!(!host.unmount(&target).unwrap());
        }
        Err(error) => {
            // Without CAP_SYS_ADMIN: the error names the mount point and the errno.
            let HostError::Mount { path, source, .. } = &error else {
                panic!("{error}");
            };
            assert_eq!(path, &target);
            assert_eq!(source.raw_os_error(), Some(1), "{error}");
        }
    }
    // A mount point that does not exist: the kernel's ENOENT, named.
    let missing = dir.path().join("missing");
    let error = host.mount_tmpfs(&missing, "1024k").unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with(&format!("mounting a tmpfs on {}: ", missing.display())),
        "{error}"
    );
    assert!(!host.unmount(&missing).unwrap());
}
