//! `gpu-demo` end to end in the embedded cluster: on the default dgx-a100 machine every
//! workload of the guides is allocated and prepared, the shared GPU is the same for both
//! containers, the wrong-type config fails alone with the driver's message, nothing is left;
//! on dgx-h100 (MIG disabled) the MIG steps are left out; on mixed and workstation (one full
//! GPU, a T4) the full-GPU steps that do not fit are left out, said so, and the rest succeeds;
//! `--kubeconfig` needs `--node-name` and a readable file (it runs against a real cluster in
//! `tests/e2e.rs`).

use dra_driver_nvidia::demo::{DEFAULT_PROFILE, WRONG_TYPE_CLAIM, WRONG_TYPE_ERROR, run};

#[tokio::test]
async fn dgx_a100_walks_every_guide_step() {
    let report = run(DEFAULT_PROFILE, false).await.unwrap();
    assert!(
        report.problems().is_empty(),
        "{:?}\n{}",
        report.problems(),
        report.text
    );
    assert_eq!(report.claims, 6, "{}", report.text);
    assert_eq!(report.allocated, 6, "{}", report.text);
    assert_eq!(report.prepared, 5, "{}", report.text);
    assert_eq!(report.unprepared, 6, "{}", report.text);
    assert_eq!(report.failed.len(), 1, "{}", report.text);
    assert_eq!(report.failed[0].claim, WRONG_TYPE_CLAIM);
    assert!(report.failed[0].message.contains(WRONG_TYPE_ERROR));
    assert_eq!(report.cdi_files_left, 0);
    assert!(
        report.extra.shared_uuids[0].starts_with("GPU-"),
        "{:?}",
        report.extra.shared_uuids
    );
    for expected in [
        "gpu.nvidia.com: device.driver == 'gpu.nvidia.com'",
        "claim mig-job-0-mig (one 1g.10gb MIG slice, from ResourceClaimTemplate mig-slice) allocated",
        "productName == 'NVIDIA A100-SXM4-80GB', with a GpuConfig",
        "MIG profile == '4g.40gb', with a MigDeviceConfig",
        "  container ctr1:",
        "CDI k8s.gpu.nvidia.com/claim=",
        "env NVIDIA_VISIBLE_DEVICES=void",
        "/dev/nvidiactl",
        "/dev/nvidia-caps/nvidia-cap",
        "summary: 6 claims, 6 allocated, 5 prepared, 1 failed (wrong-type)",
    ] {
        assert!(
            report.text.contains(expected),
            "no {expected:?} in\n{}",
            report.text
        );
    }
}

#[tokio::test]
async fn dgx_h100_leaves_the_mig_steps_out() {
    let report = run("dgx-h100", false).await.unwrap();
    assert!(
        report.text.contains("no MIG devices on this machine"),
        "{}",
        report.text
    );
    assert_eq!(report.claims, 3, "{}", report.text);
    assert_eq!(report.prepared, 3, "{}", report.text);
    assert!(!report.extra.mig_steps);
    assert!(
        report.problems().is_empty(),
        "{:?}\n{}",
        report.problems(),
        report.text
    );
}

#[tokio::test]
async fn machines_with_one_full_gpu_run_what_fits_and_say_what_not() {
    for (profile, mig) in [("mixed", true), ("workstation", false)] {
        let report = run(profile, false).await.unwrap();
        assert!(
            report.problems().is_empty(),
            "{profile}: {:?}\n{}",
            report.problems(),
            report.text
        );
        let left: Vec<&str> = report
            .extra
            .skipped
            .iter()
            .map(|s| s.claim.as_str())
            .collect();
        assert!(left.contains(&"by-memory"), "{profile}: {left:?}");
        assert!(left.contains(&"by-product"), "{profile}: {left:?}");
        assert!(
            report.text.contains(
                "left out on this machine: claim by-memory (memory >= 40Gi: no full GPU has 40Gi)"
            ),
            "{profile}:\n{}",
            report.text
        );
        assert_eq!(report.extra.shared_uuids.len(), 2, "{profile}");
        assert_eq!(report.extra.mig_steps, mig, "{profile}");
        // mixed: the shared T4, and the A100's MIG slices for the template, profile and
        // wrong-type steps; workstation: the T4 only.
        let expected = if mig { 4 } else { 1 };
        assert_eq!(report.claims, expected, "{profile}:\n{}", report.text);
        assert_eq!(report.allocated, expected, "{profile}");
        assert_eq!(report.cdi_files_left, 0, "{profile}");
    }
}

#[test]
fn an_unknown_profile_is_a_setup_error() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let error = runtime.block_on(run("no-such-machine", false)).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("setting up the NVIDIA plugin"),
        "{error}"
    );
}

#[test]
fn kubeconfig_needs_a_node_and_a_readable_file() {
    let demo = || std::process::Command::new(env!("CARGO_BIN_EXE_gpu-demo"));
    let output = demo()
        .args(["--kubeconfig", "/nonexistent"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--node-name"), "{stderr}");
    let output = demo()
        .args(["--kubeconfig", "/nonexistent", "--node-name", "n"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--kubeconfig /nonexistent"), "{stderr}");
}
