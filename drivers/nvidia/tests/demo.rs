//! `gpu-demo` end to end in the embedded cluster: on the default dgx-a100 machine every
//! workload of the guides is allocated and prepared, the shared GPU is the same for both
//! containers, the wrong-type config fails alone with the driver's message, nothing is left;
//! on dgx-h100 (MIG disabled) the MIG steps are left out; `--kubeconfig` says it is not
//! supported yet.

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
    assert_eq!(report.failed[0].0, WRONG_TYPE_CLAIM);
    assert!(report.failed[0].1.contains(WRONG_TYPE_ERROR));
    assert_eq!(report.cdi_files_left, 0);
    assert!(
        report.shared_uuids[0].starts_with("GPU-"),
        "{:?}",
        report.shared_uuids
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
    assert!(!report.mig_steps);
    assert!(
        report.problems().is_empty(),
        "{:?}\n{}",
        report.problems(),
        report.text
    );
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
fn kubeconfig_is_not_supported_yet() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-demo"))
        .args(["--kubeconfig", "/nonexistent"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("not supported yet"), "{stderr}");
}
