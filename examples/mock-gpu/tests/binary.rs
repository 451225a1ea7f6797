//! The `mock-gpu-kubelet-plugin` binary as an operator runs it: against an API server through
//! `--kubeconfig`, publishing its devices, registering, and cleaning up on SIGTERM.

use std::path::Path;
use std::process::{Child, Command};

use dra_sdk_testing::assert_contains;
use dra_sdk_testing::cluster::{NODE_NAME, TestCluster, wait_for};
use dra_sdk_testing::kubelet::{KubeletSimulator, KubeletVersion};
use k8s_openapi::api::resource::v1::ResourceSlice;
use mock_gpu::testing::plugin_command;

fn spawn_plugin(cluster: &TestCluster, kubeconfig: &Path) -> Child {
    plugin_command(
        Path::new(env!("CARGO_BIN_EXE_mock-gpu-kubelet-plugin")),
        cluster,
        kubeconfig,
        4,
    )
    .spawn()
    .expect("spawn plugin")
}

// Multi-threaded: the fake API server must keep answering while this test waits for the child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_registers_and_removes_its_sockets_on_sigterm() {
    let cluster = TestCluster::start().await.unwrap();
    let kubeconfig = cluster.write_kubeconfig().unwrap();
    let mut child = spawn_plugin(&cluster, &kubeconfig);

    let registrar = cluster.registrar_dir();
    wait_for("the registration socket", || {
        KubeletSimulator::discover(&registrar).is_ok_and(|found| found.len() == 1)
    })
    .await;
    let socket = KubeletSimulator::discover(&registrar).unwrap().remove(0);
    let plugin = KubeletSimulator::new(KubeletVersion::V1_36)
        .register(&socket)
        .await
        .unwrap();
    assert_eq!(plugin.info.name, "gpu.example.com");

    let api = cluster.api();
    wait_for("a ResourceSlice", || {
        !api.list::<ResourceSlice>().unwrap().is_empty()
    })
    .await;
    let slices = api.list::<ResourceSlice>().unwrap();
    let devices: usize = slices
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .sum();
    assert_eq!(devices, 4);
    assert_eq!(slices[0].spec.node_name.as_deref(), Some(NODE_NAME));

    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "exit status {status}");
    assert!(!socket.exists(), "registration socket left behind");
    assert!(
        !Path::new(&plugin.info.endpoint).exists(),
        "DRA socket left behind"
    );
    // Slices stay: the kubelet wipes them if the plugin does not come back.
    assert!(!api.list::<ResourceSlice>().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_partitionable_and_consumable_flags_shape_what_is_published() {
    let cluster = TestCluster::start().await.unwrap();
    let kubeconfig = cluster.write_kubeconfig().unwrap();
    let binary = Path::new(env!("CARGO_BIN_EXE_mock-gpu-kubelet-plugin"));
    let mut child = plugin_command(binary, &cluster, &kubeconfig, 2)
        .arg("--gpu-partitions=3")
        .env("GPU_ALLOW_MULTIPLE_ALLOCATIONS", "true")
        .spawn()
        .unwrap();
    let api = cluster.api();
    let devices = || -> Vec<serde_json::Value> {
        api.list::<ResourceSlice>()
            .unwrap()
            .iter()
            .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
            .map(|d| serde_json::to_value(d).unwrap())
            .collect()
    };
    wait_for("2 GPUs with 3 partitions each", || devices().len() == 8).await;
    let counter_sets: Vec<String> = api
        .list::<ResourceSlice>()
        .unwrap()
        .iter()
        .flat_map(|s| s.spec.shared_counters.clone().unwrap_or_default())
        .map(|set| set.name)
        .collect();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(counter_sets, ["gpu-0-counters", "gpu-1-counters"]);
    let devices = devices();
    let whole = devices.iter().find(|d| d["name"] == "gpu-1").unwrap();
    assert_eq!(whole["allowMultipleAllocations"], true, "{whole}");
    assert_eq!(
        whole["capacity"]["memory"]["requestPolicy"]["default"],
        "80Gi"
    );
    let partition = devices
        .iter()
        .find(|d| d["name"] == "gpu-1-partition-2")
        .unwrap();
    assert_eq!(
        partition["attributes"]["partition"]["int"], 2,
        "{partition}"
    );
    assert_eq!(
        partition["consumesCounters"][0]["counters"]["memory"]["value"],
        "27306Mi"
    );
}

#[test]
fn too_many_partitions_are_refused_naming_the_flag() {
    let output = Command::new(env!("CARGO_BIN_EXE_mock-gpu-kubelet-plugin"))
        .args(["--node-name", "n", "--gpu-partitions", "101"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_contains(&stderr, "--gpu-partitions");
    let help = Command::new(env!("CARGO_BIN_EXE_mock-gpu-kubelet-plugin"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for variable in [
        "[env: GPU_PARTITIONS=]",
        "[env: GPU_ALLOW_MULTIPLE_ALLOCATIONS=]",
    ] {
        assert!(help.contains(variable), "{variable}: {help}");
    }
}

#[test]
fn bad_flags_fail_with_a_clear_message() {
    let output = Command::new(env!("CARGO_BIN_EXE_mock-gpu-kubelet-plugin"))
        .args([
            "--node-name",
            "n",
            "--http-endpoint",
            "nonsense",
            "--kubeconfig",
            "/nonexistent",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("/nonexistent") || stderr.contains("http-endpoint"),
        "{stderr}"
    );
}

/// Runs the plugin with stderr on a pipe (as in a container: a file on the node, read with
/// `kubectl logs`), lets a kubelet prepare a claim through it, stops it, and returns its stderr
/// and the claim's UID.
async fn plugin_stderr(configure: impl FnOnce(&mut Command)) -> (Vec<u8>, String) {
    use dra_sdk_testing::claims::AllocatedClaim;
    let cluster = TestCluster::start().await.unwrap();
    let kubeconfig = cluster.write_kubeconfig().unwrap();
    let mut command = plugin_command(
        Path::new(env!("CARGO_BIN_EXE_mock-gpu-kubelet-plugin")),
        &cluster,
        &kubeconfig,
        2,
    );
    command
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .stderr(std::process::Stdio::piped());
    configure(&mut command);
    let child = command.spawn().expect("spawn plugin");

    let registrar = cluster.registrar_dir();
    wait_for("the registration socket", || {
        KubeletSimulator::discover(&registrar).is_ok_and(|found| found.len() == 1)
    })
    .await;
    let socket = KubeletSimulator::discover(&registrar).unwrap().remove(0);
    let plugin = KubeletSimulator::new(KubeletVersion::V1_36)
        .register(&socket)
        .await
        .unwrap();
    let claim = AllocatedClaim::new("default", "logged")
        .device("gpu", "gpu.example.com", NODE_NAME, "gpu-0")
        .create(&cluster.client())
        .await
        .unwrap();
    let claim = dra_sdk::claim::ClaimRef {
        uid: claim.metadata.uid.clone().unwrap(),
        namespace: "default".into(),
        name: "logged".into(),
    };
    let prepared = plugin.prepare(std::slice::from_ref(&claim)).await.unwrap();
    assert!(prepared[&claim.uid].is_ok(), "{prepared:?}");

    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(output.status.success(), "exit status {}", output.status);
    (output.stderr, claim.uid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_on_a_pipe_are_plain_text_without_escape_codes() {
    let (stderr, uid) = plugin_stderr(|_| {}).await;
    let text = String::from_utf8_lossy(&stderr);
    assert!(!stderr.is_empty());
    assert!(
        !stderr.contains(&0x1b),
        "ANSI escape codes in a non-terminal log:\n{text}"
    );
    assert_contains(&text, "claim prepared");
    assert_contains(&text, &uid);
}

/// `LOG_FORMAT=json` (the chart's `logFormat`): every line is a JSON object a log pipeline
/// can parse, and a claim's lines carry its UID from the span they were logged in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_format_json_writes_one_object_per_line_with_the_claims_span_fields() {
    let (stderr, uid) = plugin_stderr(|command| {
        command.env("LOG_FORMAT", "json");
    })
    .await;
    let text = String::from_utf8(stderr).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    assert!(!lines.is_empty());
    for line in &lines {
        assert!(line["timestamp"].is_string(), "{line}");
        assert!(line["level"].is_string(), "{line}");
        assert!(line["target"].is_string(), "{line}");
        assert!(line["message"].is_string(), "{line}");
    }
    let prepared = lines
        .iter()
        .find(|line| line["message"] == "claim prepared")
        .unwrap_or_else(|| panic!("no `claim prepared` line:\n{text}"));
    assert_eq!(prepared["span"]["claim.uid"], uid.as_str(), "{prepared}");
    assert_eq!(prepared["span"]["driver"], "gpu.example.com", "{prepared}");
}

#[test]
fn an_unknown_log_format_is_refused_naming_the_flag() {
    let output = Command::new(env!("CARGO_BIN_EXE_mock-gpu-kubelet-plugin"))
        .args(["--node-name", "n", "--log-format", "xml"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_contains(&stderr, "--log-format");
    assert!(!output.stderr.contains(&0x1b), "{stderr}");
}

/// `mock-gpu-webhook` as the chart runs it: certificate files and port from flags and
/// environment, HTTPS, a claim with a bad config denied with the field named, a good one
/// allowed, and SIGTERM ending it cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_binary_denies_a_bad_config_and_allows_a_good_one_over_https() {
    use dra_sdk_testing::admission::{WebhookClient, WebhookPki, review};
    use serde_json::json;

    let dir = tempfile::tempdir().unwrap();
    let pki = WebhookPki::create(dir.path());
    // A free port: bound, read and released (the binary binds it right after).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_mock-gpu-webhook"))
        .arg("--tls-cert-file")
        .arg(&pki.cert_file)
        .env("TLS_KEY_FILE", &pki.key_file)
        .env("WEBHOOK_PORT", port.to_string())
        .args(["--log-format", "json"])
        .spawn()
        .expect("spawn webhook");
    let client = WebhookClient::new(([127, 0, 0, 1], port).into(), pki.ca_pem());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match client.request("GET", "/readyz", None).await {
            Ok(response) if response.status == 200 => break,
            other => {
                assert!(child.try_wait().unwrap().is_none(), "the webhook exited");
                assert!(
                    std::time::Instant::now() < deadline,
                    "never ready: {other:?}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }

    let claim = |sharing: serde_json::Value| {
        json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": { "name": "shared-gpu", "namespace": "default" },
            "spec": { "devices": {
                "requests": [{ "name": "gpu", "exactly": { "deviceClassName": "gpu.example.com" } }],
                "config": [{ "requests": ["gpu"], "opaque": {
                    "driver": "gpu.example.com",
                    "parameters": {
                        "apiVersion": "gpu.resource.example.com/v1alpha1",
                        "kind": "GpuConfig",
                        "sharing": sharing,
                    },
                } }],
            } },
        })
    };
    let bad =
        claim(json!({ "strategy": "TimeSlicing", "timeSlicingConfig": { "interval": "Forever" } }));
    let answer = client.review(&review("CREATE", &bad, None)).await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    let message = answer["response"]["status"]["message"].as_str().unwrap();
    assert_contains(
        message,
        "spec.devices.config[0].opaque.parameters: invalid GpuConfig (gpu.resource.example.com/v1alpha1): sharing.timeSlicingConfig.interval: unknown variant, expected",
    );
    let good =
        claim(json!({ "strategy": "TimeSlicing", "timeSlicingConfig": { "interval": "Long" } }));
    let answer = client.review(&review("CREATE", &good, None)).await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");

    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "exit status {status}");
}
