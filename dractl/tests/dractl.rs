//! `dractl` as a user runs it: the binary against a plugin running in this test process, on
//! the embedded test cluster, reached through its sockets and a kubeconfig file; asserting
//! on what it prints and how it exits.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use dra_sdk::health::DeviceState;
use dra_sdk_testing::cluster::{NODE_NAME, NewClaim, RunningPlugin, TestCluster};
use serde_json::Value;

use dra_sdk_testing::sample_driver::{DRIVER, EnvDriver, gpus};

/// A running plugin and a kubeconfig file for its API server.
struct Setup {
    running: RunningPlugin,
    kubeconfig: PathBuf,
}

impl Setup {
    async fn start(driver: EnvDriver) -> Self {
        let running = TestCluster::start_with(driver, DRIVER, gpus(4))
            .await
            .unwrap();
        let kubeconfig = running.cluster().write_kubeconfig().unwrap();
        Self {
            running,
            kubeconfig,
        }
    }

    fn socket(&self) -> &Path {
        &self.running.plugin().socket_paths().registration
    }

    fn socket_arg(&self) -> String {
        self.socket().display().to_string()
    }

    fn kubeconfig_arg(&self) -> String {
        self.kubeconfig.display().to_string()
    }
}

/// The result of one dractl run.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.stdout))
    }
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs dractl off the runtime's threads, so the plugin in this process keeps serving.
async fn dractl(args: &[&str]) -> Run {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let output: Output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_dractl"))
            .args(&args)
            // The tests choose the API server explicitly.
            .env_remove("KUBECONFIG")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_shows_the_registration_and_the_kubelets_choices() {
    let s = Setup::start(EnvDriver::default()).await;
    let run = dractl(&["info", &s.socket_arg()]).await;
    assert_eq!(run.code, 0, "{run}");
    assert!(
        run.stdout.contains("type                 DRAPlugin"),
        "{run}"
    );
    assert!(
        run.stdout.contains("driver               gpu.example.com"),
        "{run}"
    );
    assert!(
        run.stdout
            .contains("services             v1.DRAPlugin, v1beta1.DRAPlugin"),
        "{run}"
    );
    assert!(
        run.stdout.contains("kubelet 1.32         uses v1beta1"),
        "{run}"
    );
    assert!(run.stdout.contains("kubelet 1.36         uses v1"), "{run}");
    assert!(
        run.stdout.contains("health               not advertised"),
        "{run}"
    );

    let json = dractl(&["info", &s.socket_arg(), "--output", "json"])
        .await
        .json();
    assert_eq!(json["name"], DRIVER);
    assert_eq!(
        json["endpoint"],
        s.running.plugin().socket_paths().dra.display().to_string()
    );
    assert_eq!(json["kubelets"]["1.34"]["api"], "v1");
    assert!(json["getInfoMs"].as_f64().unwrap() < 1000.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_and_usage_errors_exit_2() {
    let run = dractl(&["info", "/nonexistent/dra-reg.sock"]).await;
    assert_eq!(run.code, 2, "{run}");
    assert!(
        run.stderr
            .starts_with("dractl: GetInfo on /nonexistent/dra-reg.sock: "),
        "{run}"
    );
    assert!(run.stdout.is_empty(), "{run}");

    let run = dractl(&["prepare", "/nonexistent", "not-a-claim-name", "--uid", "u"]).await;
    assert_eq!(run.code, 2, "{run}");
    assert!(
        run.stderr
            .contains(r#"claim "not-a-claim-name" is not NAMESPACE/NAME"#),
        "{run}"
    );

    let run = dractl(&["frobnicate"]).await;
    assert_eq!(run.code, 2, "{run}");
    assert!(run.stderr.contains("unrecognized subcommand"), "{run}");

    let run = dractl(&["conformance", "/x", "--case", "no-such-case"]).await;
    assert_eq!(run.code, 2, "{run}");
    assert!(
        run.stderr
            .contains(r#"unknown conformance case "no-such-case""#),
        "{run}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_and_unprepare_a_claim_by_name() {
    let s = Setup::start(EnvDriver::default()).await;
    let cluster = s.running.cluster();
    cluster
        .create_claim(NewClaim::new("default", "gpu").request("gpu", DRIVER))
        .await
        .unwrap();

    // Not allocated yet: the plugin says so, and dractl exits 1.
    let run = dractl(&[
        "prepare",
        &s.socket_arg(),
        "default/gpu",
        "--kubeconfig",
        &s.kubeconfig_arg(),
    ])
    .await;
    assert_eq!(run.code, 1, "{run}");
    assert!(
        run.stdout.contains("prepare failed") && run.stdout.contains("not allocated"),
        "{run}"
    );

    // --allocate does the scheduler's part, on the node of the driver's slices.
    let run = dractl(&[
        "prepare",
        &s.socket_arg(),
        "default/gpu",
        "--kubeconfig",
        &s.kubeconfig_arg(),
        "--allocate",
    ])
    .await;
    assert_eq!(run.code, 0, "{run}");
    assert!(run.stdout.contains("prepared through v1"), "{run}");
    assert!(
        run.stdout.contains("POOL       DEVICE  REQUESTS  CDI IDS"),
        "{run}"
    );
    assert!(
        run.stdout
            .contains("test-node  gpu-0   gpu       k8s.gpu.example.com/gpu="),
        "{run}"
    );

    // Idempotent, through the other API version, as JSON.
    let run = dractl(&[
        "prepare",
        &s.socket_arg(),
        "default/gpu",
        "--kubeconfig",
        &s.kubeconfig_arg(),
        "--api-version",
        "v1beta1",
        "-o",
        "json",
    ])
    .await;
    assert_eq!(run.code, 0, "{run}");
    let json = run.json();
    assert_eq!(json["api"], "v1beta1");
    assert_eq!(json["claim"]["name"], "gpu");
    assert_eq!(json["devices"][0]["device"], "gpu-0");
    let uid = json["claim"]["uid"].as_str().unwrap().to_owned();
    assert_eq!(std::fs::read_dir(cluster.cdi_root()).unwrap().count(), 1);

    // Unprepare needs no API server when the UID is given.
    let run = dractl(&["unprepare", &s.socket_arg(), "default/gpu", "--uid", &uid]).await;
    assert_eq!(run.code, 0, "{run}");
    assert!(
        run.stdout
            .starts_with(&format!("claim default/gpu ({uid}) unprepared through v1")),
        "{run}"
    );
    assert_eq!(std::fs::read_dir(cluster.cdi_root()).unwrap().count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_failing_to_prepare_exits_1_with_the_plugins_message() {
    let s = Setup::start(EnvDriver::default()).await;
    let run = dractl(&[
        "prepare",
        &s.socket_arg(),
        "default/gone",
        "--uid",
        "11111111-2222-4333-8444-555555555555",
        "-o",
        "json",
    ])
    .await;
    assert_eq!(run.code, 1, "{run}");
    assert!(
        run.json()["error"]
            .as_str()
            .unwrap()
            .contains("default/gone not found"),
        "{run}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_streams_device_lists() {
    let s = Setup::start(EnvDriver {
        health: Some(vec![
            DeviceState::healthy(NODE_NAME, "gpu-0"),
            DeviceState::unhealthy(NODE_NAME, "gpu-1", "XID 79"),
        ]),
        ..EnvDriver::default()
    })
    .await;
    let run = dractl(&["health", &s.socket_arg(), "--count", "1"]).await;
    assert_eq!(run.code, 0, "{run}");
    assert!(run.stdout.starts_with("update 1: 2 devices\n"), "{run}");
    assert!(
        run.stdout
            .contains("test-node  gpu-1   Unhealthy  default  XID 79"),
        "{run}"
    );

    let run = dractl(&["health", &s.socket_arg(), "--count", "1", "-o", "json"]).await;
    assert_eq!(run.code, 0, "{run}");
    let line: Value = serde_json::from_str(run.stdout.lines().next().unwrap()).unwrap();
    assert_eq!(line["devices"][0]["health"], "Healthy");

    // Fewer lists than asked for within the timeout is a failure.
    let run = dractl(&[
        "health",
        &s.socket_arg(),
        "--count",
        "5",
        "--timeout",
        "0.3",
    ])
    .await;
    assert_eq!(run.code, 1, "{run}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_of_a_plugin_without_it_exits_1() {
    let s = Setup::start(EnvDriver::default()).await;
    let run = dractl(&["health", &s.socket_arg()]).await;
    assert_eq!(run.code, 1, "{run}");
    assert!(
        run.stdout.contains("does not advertise a health service"),
        "{run}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_are_printed_and_checked() {
    let s = Setup::start(EnvDriver::default()).await;
    let run = dractl(&["slices", "--kubeconfig", &s.kubeconfig_arg()]).await;
    assert_eq!(run.code, 0, "{run}");
    assert!(
        run.stdout
            .starts_with("driver gpu.example.com: 1 pools, 1 slices, 4 devices\n"),
        "{run}"
    );
    assert!(
        run.stdout
            .contains("  pool test-node (node test-node): generation "),
        "{run}"
    );
    assert!(run.stdout.contains("      gpu-3  index=3\n"), "{run}");
    assert!(run.stdout.contains("  valid\n"), "{run}");
    assert!(
        run.stdout
            .contains("read in resource.k8s.io/v1, checked against the limits of Kubernetes 1.36"),
        "{run}"
    );

    // Someone publishes one slice of a pool of two for the same driver: the API server takes
    // it (it checks one object at a time), consumers treat the pool as incomplete.
    let broken: k8s_openapi::api::resource::v1::ResourceSlice =
        serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": { "name": "broken" },
            "spec": {
                "driver": DRIVER,
                "nodeName": NODE_NAME,
                "pool": { "name": "extra", "generation": 0, "resourceSliceCount": 2 },
                "devices": [{ "name": "gpu-9" }],
            },
        }))
        .unwrap();
    s.running.cluster().api().insert(&broken).unwrap();
    let run = dractl(&[
        "slices",
        "--kubeconfig",
        &s.kubeconfig_arg(),
        "--driver",
        DRIVER,
        "-o",
        "json",
    ])
    .await;
    assert_eq!(run.code, 1, "{run}");
    let json = run.json();
    assert_eq!(json["release"], "1.36");
    let problems = json["drivers"][0]["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 1, "{run}");
    assert!(
        problems[0].as_str().unwrap().contains(
            r#"pool "extra" generation 0: 1 slices published, resourceSliceCount says 2"#
        ),
        "{run}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_against_a_running_plugin() {
    let s = Setup::start(EnvDriver::default()).await;
    let cdi_root = s.running.cluster().cdi_root().display().to_string();
    let run = dractl(&[
        "conformance",
        &s.socket_arg(),
        "--kubeconfig",
        &s.kubeconfig_arg(),
        "--cdi-root",
        &cdi_root,
    ])
    .await;
    assert_eq!(run.code, 0, "{run}");
    assert!(
        run.stdout.starts_with(&format!(
            "conformance of gpu.example.com ({})",
            s.socket_arg()
        )),
        "{run}"
    );
    assert!(
        run.stdout.contains("prepare-idempotent            passed"),
        "{run}"
    );
    assert!(
        run.stdout.contains(
            "restart-keeps-claims          skipped      0 ms  restarting the plugin needs an in-process target"
        ),
        "{run}"
    );
    assert!(
        run.stdout
            .trim_end()
            .ends_with("11 passed, 0 failed, 1 skipped"),
        "{run}"
    );

    // A subset, as JSON, without API access or CDI root: skipped with the reason.
    let run = dractl(&[
        "conformance",
        &s.socket_arg(),
        "--case",
        "registration",
        "--case",
        "cdi-specs",
        "-o",
        "json",
    ])
    .await;
    assert_eq!(run.code, 0, "{run}");
    let json = run.json();
    let cases = json["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 2);
    assert_eq!(cases[0]["name"], "registration");
    assert_eq!(cases[0]["outcome"], "passed");
    assert_eq!(cases[1]["outcome"], "skipped");
    assert_eq!(
        cases[1]["message"],
        "the CDI spec directory is unknown (give the CDI root)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_case_exits_1() {
    // The leaky driver needs the CDI root, known only once the cluster exists.
    let cluster = TestCluster::start().await.unwrap();
    let driver = EnvDriver {
        leak_into: Some(cluster.cdi_root()),
        ..EnvDriver::default()
    };
    let plugin = cluster
        .plugin(driver, DRIVER)
        .resources(gpus(4))
        .start()
        .await
        .unwrap();
    plugin.published().await;
    let kubeconfig = cluster.write_kubeconfig().unwrap();
    let run = dractl(&[
        "conformance",
        &plugin.socket_paths().registration.display().to_string(),
        "--kubeconfig",
        &kubeconfig.display().to_string(),
        "--cdi-root",
        &cluster.cdi_root().display().to_string(),
        "--skip",
        "restart-keeps-claims",
    ])
    .await;
    assert_eq!(run.code, 1, "{run}");
    assert!(
        run.stdout.contains("cdi-specs                     FAILED"),
        "{run}"
    );
    assert!(
        run.stdout
            .contains("spec files written by prepare are still there after unprepare"),
        "{run}"
    );
    assert!(
        run.stdout
            .trim_end()
            .ends_with("10 passed, 1 failed, 0 skipped"),
        "{run}"
    );
    plugin.shutdown().await.unwrap();
}
