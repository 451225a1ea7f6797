//! `dractl explain` as a user runs it: the binary against YAML fixtures (one per reason a
//! device is rejected, in the shapes of every supported `resource.k8s.io` version), against the
//! SDK's embedded test cluster, and against API servers serving only older versions; asserting
//! on what it prints and how it exits.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use dra_sdk_testing::apiserver::{FakeApiServer, ResourceType};
use dra_sdk_testing::cluster::{NODE_NAME, NewClaim, TestCluster};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, PostParams};
use serde_json::{Value, json};

use dra_sdk_testing::sample_driver::{DRIVER, EnvDriver, gpus};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/explain")
}

fn fixture(name: &str) -> String {
    fixtures().join(name).display().to_string()
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
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{self}"))
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

fn run(args: &[String]) -> Run {
    let output: Output = Command::new(env!("CARGO_BIN_EXE_dractl"))
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Runs dractl off the runtime's threads, so servers in this process keep serving.
async fn run_async(args: Vec<String>) -> Run {
    tokio::task::spawn_blocking(move || run(&args))
        .await
        .unwrap()
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

/// `dractl explain` over the fixture cluster (its slices, classes, allocated claims and
/// nodes), with these arguments.
fn explain(args: &[&str]) -> Run {
    let cluster = fixture("cluster");
    let mut all = strings(&[
        "explain",
        "--slices",
        &cluster,
        "--classes",
        &cluster,
        "--claims",
        &cluster,
        "--nodes",
        &cluster,
    ]);
    all.extend(strings(args));
    run(&all)
}

/// `explain -f claims/<name>.yaml --node node-1 -o json`, expecting `code`.
fn explain_file(name: &str, code: i32) -> Value {
    let file = fixture(&format!("claims/{name}.yaml"));
    let run = explain(&["-f", &file, "--node", "node-1", "-o", "json"]);
    assert_eq!(run.code, code, "{name}: {run}");
    run.json()
}

/// The device entry `pool/device` of the first request.
fn device<'a>(report: &'a Value, pool_device: &str) -> &'a Value {
    report["requests"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| {
            format!(
                "{}/{}",
                d["pool"].as_str().unwrap(),
                d["device"].as_str().unwrap()
            ) == pool_device
        })
        .unwrap_or_else(|| panic!("no device {pool_device} in {report:#}"))
}

#[test]
fn an_allocatable_claim_shows_its_allocation_and_exits_0() {
    let report = explain_file("allocatable", 0);
    assert_eq!(report["allocatable"], true);
    assert_eq!(report["node"], "node-1");
    assert_eq!(report["claim"], "default/h100");
    assert_eq!(
        report["allocation"]["devices"]["results"][0]["device"],
        "gpu-2"
    );
    assert_eq!(device(&report, "node-1/gpu-2")["verdict"], "chosen");
    assert_eq!(
        device(&report, "node-1/gpu-0")["verdict"],
        "requestSelectorFalse"
    );
    assert_eq!(report["reason"], Value::Null);

    let table = explain(&[
        "-f",
        &fixture("claims/allocatable.yaml"),
        "--node",
        "node-1",
    ]);
    assert_eq!(table.code, 0, "{table}");
    assert!(
        table
            .stdout
            .contains("request gpu: 1 device of class gpu.example.com\n"),
        "{table}"
    );
    assert!(
        table
            .stdout
            .lines()
            .any(|l| l.contains("gpu-2") && l.ends_with("chosen")),
        "{table}"
    );
    assert!(
        table
            .stdout
            .ends_with("allocatable on node node-1: gpu → gpu.example.com/node-1/gpu-2\n"),
        "{table}"
    );
}

#[test]
fn selectors_that_are_false_name_the_class_or_the_request() {
    let report = explain_file("class-selector", 1);
    let gpu = device(&report, "node-1/gpu-0");
    assert_eq!(gpu["verdict"], "classSelectorFalse");
    assert_eq!(gpu["class"], "nvidia");
    assert_eq!(gpu["expression"], "device.driver == 'gpu.nvidia.com'");
    assert_eq!(
        report["reason"],
        "request gpu: no device matches the selectors (8 devices considered)"
    );

    let report = explain_file("request-selector", 1);
    let gpu = device(&report, "node-1/gpu-2");
    assert_eq!(gpu["verdict"], "requestSelectorFalse");
    assert_eq!(gpu["request"], "gpu");
    assert_eq!(gpu["index"], 0);
    assert_eq!(
        gpu["expression"],
        "device.attributes['gpu.example.com'].model == 'b200'"
    );
    // Devices of other drivers fail the class's selector first.
    assert_eq!(
        device(&report, "rack-a/nic-0")["verdict"],
        "classSelectorFalse"
    );
}

#[test]
fn cel_errors_and_missing_attributes_give_the_expression_and_the_message() {
    let report = explain_file("missing-attribute", 1);
    let gpu = device(&report, "node-1/gpu-0");
    assert_eq!(gpu["verdict"], "missingAttribute");
    assert_eq!(gpu["name"], "vendor");
    assert_eq!(gpu["selector"]["owner"], json!({ "request": "gpu" }));
    assert_eq!(
        gpu["selector"]["expression"],
        "device.attributes['gpu.example.com'].vendor == 'acme'"
    );
    assert_eq!(
        report["reason"],
        "claim default/vendor, request gpu: selector #0: CEL runtime error: no such key: vendor (expression: device.attributes['gpu.example.com'].vendor == 'acme')"
    );

    let report = explain_file("cel-runtime-error", 1);
    let gpu = device(&report, "node-1/gpu-0");
    assert_eq!(gpu["verdict"], "celError");
    assert_eq!(gpu["stage"], "runtime");
    assert!(
        gpu["message"]
            .as_str()
            .unwrap()
            .contains("no matching overload"),
        "{gpu}"
    );

    let report = explain_file("cel-compile-error", 1);
    let gpu = device(&report, "node-1/gpu-0");
    assert_eq!(gpu["verdict"], "celError");
    assert_eq!(gpu["stage"], "compile");
    assert_eq!(gpu["selector"]["expression"], "device.driver ==");

    let table = explain(&[
        "-f",
        &fixture("claims/cel-compile-error.yaml"),
        "--node",
        "node-1",
    ]);
    assert_eq!(table.code, 1, "{table}");
    assert!(
        table.stdout.contains(
            "request selector #0: CEL compile error: ERROR: <input>:1:17: Syntax error: mismatched input '<EOF>'"
        ),
        "{table}"
    );
}

#[test]
fn devices_held_by_other_claims_name_them() {
    // By name from the --claims files: a pending claim for an A100.
    let run = explain(&["default/a100", "--node", "node-1", "-o", "json"]);
    assert_eq!(run.code, 1, "{run}");
    let report = run.json();
    let held = device(&report, "node-1/gpu-0");
    assert_eq!(held["verdict"], "allocated");
    assert_eq!(
        held["holders"],
        json!([{ "claim": "default/training", "request": "gpu" }])
    );
    let tainted = device(&report, "node-1/gpu-1");
    assert_eq!(tainted["verdict"], "tainted");
    assert_eq!(
        (&tainted["key"], &tainted["value"], &tainted["effect"]),
        (
            &json!("gpu.example.com/xid"),
            &json!("79"),
            &json!("NoSchedule")
        )
    );
    assert_eq!(
        report["reason"],
        "request gpu: 0 of 2 matching devices available, 1 needed (1 allocated, 1 tainted)"
    );

    let table = explain(&["default/a100", "--node", "node-1"]);
    for line in [
        "allocated to default/training (request gpu)",
        "taint gpu.example.com/xid=79:NoSchedule not tolerated",
        "not allocatable on node node-1: request gpu: 0 of 2 matching devices available, 1 needed (1 allocated, 1 tainted)",
    ] {
        assert!(table.stdout.contains(line), "{line:?} in {table}");
    }
}

#[test]
fn counters_and_capacity_say_what_is_left_and_who_holds_it() {
    let report = explain_file("counters", 1);
    let half = device(&report, "node-1-partitions/gpu-4-half-0");
    assert_eq!(half["verdict"], "countersExhausted");
    assert_eq!(half["counterSet"], "gpu-4");
    assert_eq!(half["counter"], "memory");
    assert_eq!(
        (&half["needed"], &half["left"], &half["total"]),
        (&json!("20Gi"), &json!("0"), &json!("40Gi"))
    );
    assert_eq!(
        half["holders"],
        json!([{ "device": "gpu-4", "claims": ["default/whole"], "counters": { "memory": "40Gi" } }])
    );

    let report = explain_file("capacity", 1);
    let h100 = device(&report, "node-1/gpu-2");
    assert_eq!(h100["verdict"], "capacityTooSmall");
    assert_eq!(
        (&h100["requested"], &h100["available"]),
        (&json!("100Gi"), &json!("80Gi"))
    );
    assert_eq!(
        device(&report, "node-1/gpu-3"),
        &json!({ "driver": "gpu.example.com", "pool": "node-1", "device": "gpu-3", "node": "node-1",
                 "verdict": "capacityMissing", "capacity": "memory" })
    );

    let report = explain_file("capacity-policy", 1);
    let nic = device(&report, "rack-a/nic-0");
    assert_eq!(nic["verdict"], "capacityPolicy");
    assert_eq!(nic["amount"], "5G");
    assert_eq!(nic["reason"], "above validRange.max 4G");

    let report = explain_file("capacity-exhausted", 1);
    let nic = device(&report, "rack-a/nic-0");
    assert_eq!(nic["verdict"], "capacityExhausted");
    assert_eq!(
        (&nic["needed"], &nic["used"], &nic["total"]),
        (&json!("3G"), &json!("8G"), &json!("10G"))
    );
    let holders: Vec<&str> = nic["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["claim"].as_str().unwrap())
        .collect();
    assert_eq!(holders, ["default/net-a", "default/net-b"]);
    assert_eq!(nic["holders"][0]["consumedCapacity"]["bandwidth"], "4G");
}

#[test]
fn devices_of_other_nodes_are_not_eligible_and_every_node_is_tried_without_node() {
    let report = explain_file("node", 1);
    let other = device(&report, "node-2/gpu-0");
    assert_eq!(other["verdict"], "nodeNotEligible");
    assert_eq!(
        other["reason"],
        json!({ "kind": "otherNode", "node": "node-2" })
    );

    // The NIC's slice selects zone=a: node-2 (zone b) does not get it.
    let run = explain(&[
        "-f",
        &fixture("claims/capacity-exhausted.yaml"),
        "--node",
        "node-2",
        "-o",
        "json",
    ]);
    assert_eq!(run.code, 1, "{run}");
    assert_eq!(
        device(&run.json(), "rack-a/nic-0")["reason"],
        json!({ "kind": "nodeSelector" })
    );

    // Without --node every node is tried, and the claim fits on node-2.
    let run = explain(&["-f", &fixture("claims/node.yaml"), "-o", "json"]);
    assert_eq!(run.code, 0, "{run}");
    let report = run.json();
    assert_eq!(report["node"], "node-2");
    let nodes: Vec<(&str, bool)> = report["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["node"].as_str().unwrap(),
                n["allocatable"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(nodes, [("node-1", false), ("node-2", true)]);
    assert_eq!(device(&report, "node-2/gpu-0")["verdict"], "chosen");

    // Not allocatable anywhere: each device as judged on its own node, and a line per node.
    let table = explain(&["default/a100"]);
    assert_eq!(table.code, 1, "{table}");
    assert!(
        table
            .stdout
            .contains("  DRIVER           POOL               DEVICE        NODE    VERDICT\n"),
        "{table}"
    );
    assert!(
        table.stdout.contains(
            "node node-2: not allocatable: request gpu: no device matches the selectors (1 devices considered)\n"
        ),
        "{table}"
    );
    assert!(
        table
            .stdout
            .ends_with("not allocatable on any of the 2 nodes\n"),
        "{table}"
    );
}

#[test]
fn constraints_and_templates() {
    let report = explain_file("constraint", 1);
    let t4 = device(&report, "node-1/gpu-3");
    assert_eq!(t4["verdict"], "constraintAttributeMissing");
    assert_eq!(t4["attribute"], "gpu.example.com/index");
    assert_eq!(
        report["reason"],
        "requests a, b: each can be satisfied alone but not together (claim constraints or competition for devices)"
    );

    let report = explain_file("template", 0);
    assert_eq!(report["claim"], "default/two-gpus");
    let chosen: Vec<&str> = report["requests"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["verdict"] == "chosen")
        .map(|d| d["device"].as_str().unwrap())
        .collect();
    assert_eq!(chosen, ["gpu-2", "gpu-3"]);
}

/// NVLink pairs: `gpu.example.com/nvlinkGroup` is nvl-0 for gpu-0 and gpu-2 of node-1, nvl-1
/// for gpu-1 and gpu-3; gpu-0 is allocated and gpu-1 tainted.
#[test]
fn constraint_values_say_why_a_pair_is_refused() {
    let file = fixture("claims/constraint-values.yaml");
    let refused = "constraint #0 (matchAttribute gpu.example.com/nvlinkGroup, requests a, b): needs 2 devices with one value, but no value has enough available devices: nvl-0: gpu-2; nvl-1: gpu-3";
    let table = explain(&["nvlink-pair", "-f", &file, "--node", "node-1"]);
    assert_eq!(table.code, 1, "{table}");
    assert!(
        table.stdout.ends_with(&format!(
            "\n\n{refused}\nnot allocatable on node node-1: requests a, b: each can be satisfied alone but not together (claim constraints or competition for devices)\n"
        )),
        "{table}"
    );
    // Each GPU alone is available for both requests.
    assert_eq!(
        table
            .stdout
            .lines()
            .filter(|l| l.ends_with("available"))
            .map(|l| l.split_whitespace().nth(2).unwrap())
            .collect::<Vec<_>>(),
        ["gpu-2", "gpu-3", "gpu-2", "gpu-3"],
        "{table}"
    );

    let run = explain(&["nvlink-pair", "-f", &file, "--node", "node-1", "-o", "json"]);
    assert_eq!(run.code, 1, "{run}");
    let report = run.json();
    let device = |name: &str| json!({ "driver": "gpu.example.com", "pool": "node-1", "device": name, "requests": ["a", "b"] });
    let constraints = json!([{
        "constraint": 0, "kind": "matchAttribute", "attribute": "gpu.example.com/nvlinkGroup",
        "requests": ["a", "b"], "needed": 2, "enough": false,
        "values": [
            { "value": "nvl-0", "devices": [device("gpu-2")] },
            { "value": "nvl-1", "devices": [device("gpu-3")] },
        ],
    }]);
    assert_eq!(report["constraints"], constraints);
    assert_eq!(report["nodes"][0]["constraints"], constraints);

    // Without --node: under each node.
    let table = explain(&["nvlink-pair", "-f", &file]);
    assert_eq!(table.code, 1, "{table}");
    for line in [
        format!("\n  {refused}\nnode node-2: not allocatable: "),
        "\n  constraint #0 (matchAttribute gpu.example.com/nvlinkGroup, requests a, b): needs 2 devices with one value, but no available device has the attribute\nnot allocatable on any of the 2 nodes\n".to_owned(),
    ] {
        assert!(table.stdout.contains(&line), "{line:?} in {table}");
    }

    // Tolerating gpu-1's taint, one request for two gets the pair gpu-1 and gpu-3 of nvl-1.
    let run = explain(&[
        "nvlink-pair-tolerating",
        "-f",
        &file,
        "--node",
        "node-1",
        "-o",
        "json",
    ]);
    assert_eq!(run.code, 0, "{run}");
    let report = run.json();
    let allocated: Vec<&str> = report["allocation"]["devices"]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["device"].as_str().unwrap())
        .collect();
    assert_eq!(allocated, ["gpu-1", "gpu-3"]);
    let constraint = &report["constraints"][0];
    assert_eq!(
        (
            &constraint["requests"],
            &constraint["needed"],
            &constraint["enough"]
        ),
        (&json!(["gpus"]), &json!(2), &json!(true))
    );
    let values: Vec<(&str, Vec<&str>)> = constraint["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            let devices = v["devices"].as_array().unwrap().iter();
            (
                v["value"].as_str().unwrap(),
                devices.map(|d| d["device"].as_str().unwrap()).collect(),
            )
        })
        .collect();
    assert_eq!(
        values,
        [("nvl-1", vec!["gpu-1", "gpu-3"]), ("nvl-0", vec!["gpu-2"])]
    );
    let table = explain(&["nvlink-pair-tolerating", "-f", &file, "--node", "node-1"]);
    assert_eq!(table.code, 0, "{table}");
    assert!(!table.stdout.contains("constraint #0"), "{table}");
    assert!(
        table.stdout.ends_with(
            "\n\nallocatable on node node-1: gpus → gpu.example.com/node-1/gpu-1, gpus → gpu.example.com/node-1/gpu-3\n"
        ),
        "{table}"
    );
}

#[test]
fn a_node_alone_lists_its_devices_and_what_holds_them() {
    let run = explain(&["--node", "node-1", "-o", "json"]);
    assert_eq!(run.code, 0, "{run}");
    let node = &run.json()["node"];
    let devices = node["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 8, "{node:#}");
    let nic = devices.iter().find(|d| d["device"] == "nic-0").unwrap();
    assert_eq!(
        nic["capacity"],
        json!([{ "name": "bandwidth", "total": "10G", "used": "8G" }])
    );
    assert_eq!(
        nic["holders"][1]["shareID"],
        "0b5a4e1c-0000-4000-8000-00000000000b"
    );
    assert_eq!(
        node["counterSets"],
        json!([{ "driver": "gpu.example.com", "pool": "node-1-partitions", "counterSet": "gpu-4",
                 "counters": [{ "counter": "memory", "total": "40Gi", "left": "0" }],
                 "holders": [{ "device": "gpu-4", "claims": ["default/whole"], "counters": { "memory": "40Gi" } }] }])
    );

    let table = explain(&["--node", "node-1"]);
    assert_eq!(table.code, 0, "{table}");
    assert!(
        table
            .stdout
            .starts_with("node node-1: 8 devices (read from files)\n"),
        "{table}"
    );
    let line = |device: &str| {
        table
            .stdout
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(device))
            .unwrap_or_else(|| panic!("{device} in {table}"))
            .to_owned()
    };
    assert!(
        line("gpu-0").contains("default/training (request gpu)"),
        "{table}"
    );
    assert!(
        line("nic-0").contains("bandwidth 8G of 10G used"),
        "{table}"
    );
    assert!(
        line("gpu-1").contains("taint gpu.example.com/xid=79:NoSchedule"),
        "{table}"
    );
    assert!(
        table
            .stdout
            .contains("memory 0 of 40Gi left  default/whole on gpu-4 (memory=40Gi)"),
        "{table}"
    );
}

#[test]
fn files_of_older_versions_are_read_in_the_v1_shape() {
    let cluster = fixture("v1beta1/cluster.yaml");
    let args = |claim: &str| {
        strings(&[
            "explain",
            "--slices",
            &cluster,
            "--classes",
            &cluster,
            "--claims",
            &cluster,
            "-f",
            &fixture(claim),
            "--node",
            "node-1",
            "-o",
            "json",
        ])
    };
    let run = run(&args("v1beta1/two-a100.yaml"));
    assert_eq!(run.code, 1, "{run}");
    let report = run.json();
    assert_eq!(report["requests"][0]["count"], 2);
    assert_eq!(
        device(&report, "node-1/gpu-0")["holders"][0]["claim"],
        "default/held"
    );
    assert_eq!(device(&report, "node-1/gpu-1")["verdict"], "available");
    assert_eq!(
        report["reason"],
        "request gpus: 1 of 2 matching devices available, 2 needed (1 allocated)"
    );

    let run = self::run(&args("v1beta1/first-available.yaml"));
    assert_eq!(run.code, 0, "{run}");
    let report = run.json();
    let requests: Vec<&str> = report["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["request"].as_str().unwrap())
        .collect();
    assert_eq!(requests, ["gpu/big", "gpu/small"]);
    assert_eq!(
        report["allocation"]["devices"]["results"][0],
        json!({ "request": "gpu/big", "driver": "gpu.example.com", "pool": "node-1", "device": "gpu-1" })
    );
}

#[test]
fn usage_and_file_errors_exit_2() {
    let cases: [(&[&str], &str); 7] = [
        (
            &[],
            "dractl: name a claim as NAMESPACE/NAME, give one with -f FILE, or a node with --node NODE",
        ),
        (
            &["no-namespace"],
            "dractl: claim \"no-namespace\" is not NAMESPACE/NAME",
        ),
        (
            &["default/nope"],
            "dractl: ResourceClaim default/nope is not in the --claims files",
        ),
        (
            &["-f", "/nonexistent.yaml"],
            "dractl: reading /nonexistent.yaml: ",
        ),
        (
            &["-f", &fixture("claims/not-a-claim.yaml")],
            "holds no ResourceClaim or ResourceClaimTemplate",
        ),
        (
            &["-f", &fixture("claims/bad.yaml")],
            "not valid YAML or JSON",
        ),
        (
            &["-f", &fixture("claims/alpha.yaml")],
            "resource.k8s.io/v1alpha3 is not a version dractl reads",
        ),
    ];
    for (args, message) in cases {
        let run = explain(args);
        assert_eq!(run.code, 2, "{args:?}: {run}");
        assert!(
            run.stderr.contains(message),
            "{args:?}: {message:?} in {run}"
        );
        assert!(run.stdout.is_empty(), "{args:?}: {run}");
    }
    // Without files and without a kubeconfig there is no cluster to read.
    let run = run(&strings(&[
        "explain",
        "default/x",
        "--kubeconfig",
        "/nonexistent/kubeconfig",
    ]));
    assert_eq!(run.code, 2, "{run}");
    assert!(
        run.stderr
            .starts_with("dractl: reading kubeconfig /nonexistent/kubeconfig"),
        "{run}"
    );
}

/// Against the SDK's embedded test cluster: a running plugin's slices, the DeviceClass, claims
/// allocated through the API; read-only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_a_live_cluster_it_only_reads() {
    let running = TestCluster::start_with(EnvDriver::default(), DRIVER, gpus(2))
        .await
        .unwrap();
    let cluster = running.cluster();
    let kubeconfig = cluster.write_kubeconfig().unwrap();
    let kubeconfig = kubeconfig.display().to_string();
    cluster
        .create_claim(NewClaim::new("default", "first").request("gpu", DRIVER))
        .await
        .unwrap();
    cluster.allocate("default", "first").await.unwrap();
    cluster
        .create_claim(
            NewClaim::new("default", "gpu-0-too")
                .request("gpu", DRIVER)
                .selector(&format!("device.attributes['{DRIVER}'].index == 0")),
        )
        .await
        .unwrap();
    cluster
        .create_claim(NewClaim::new("default", "any").request("gpu", DRIVER))
        .await
        .unwrap();
    cluster.api().reset_stats();

    let args = |rest: &[&str]| {
        let mut args = strings(&["explain", "--kubeconfig", &kubeconfig]);
        args.extend(strings(rest));
        args
    };
    let run = run_async(args(&["default/gpu-0-too"])).await;
    assert_eq!(run.code, 1, "{run}");
    assert!(
        run.stdout.starts_with(
            "claim default/gpu-0-too (from the API server), against 1 ResourceSlices, 1 DeviceClasses, 1 allocated claims (read through resource.k8s.io/v1)\n"
        ),
        "{run}"
    );
    assert!(
        run.stdout
            .contains("allocated to default/first (request gpu)"),
        "{run}"
    );
    assert!(
        run.stdout.ends_with(&format!(
            "not allocatable on node {NODE_NAME}: request gpu: all 1 matching devices are allocated\n"
        )),
        "{run}"
    );

    let report = run_async(args(&["default/any", "-o", "json"])).await.json();
    assert_eq!(report["allocatable"], true);
    assert_eq!(report["node"], NODE_NAME);
    assert_eq!(
        report["allocation"]["devices"]["results"][0]["device"],
        "gpu-1"
    );

    // An allocated claim: exit 0, its allocation, and what it would get anew.
    let run = run_async(args(&["default/first"])).await;
    assert_eq!(run.code, 0, "{run}");
    assert!(
        run.stdout.contains(&format!(
            "the claim is allocated: gpu → {DRIVER}/{NODE_NAME}/gpu-0; below, what it would get if it were allocated anew\n"
        )),
        "{run}"
    );

    // A claim template file against the live cluster.
    let template = cluster.path().join("template.yaml");
    std::fs::write(
        &template,
        format!(
            "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {{name: two}}\nspec:\n  spec:\n    devices:\n      requests:\n      - name: gpus\n        exactly: {{deviceClassName: {DRIVER}, count: 2}}\n"
        ),
    )
    .unwrap();
    let run = run_async(args(&["-f", &template.display().to_string()])).await;
    assert_eq!(run.code, 1, "{run}");
    assert!(
        run.stdout
            .starts_with("claim default/two (from template in "),
        "{run}"
    );

    let run = run_async(args(&["--node", NODE_NAME, "-o", "json"])).await;
    assert_eq!(run.code, 0, "{run}");
    assert_eq!(
        run.json()["node"]["devices"][0]["holders"][0]["claim"],
        "default/first"
    );

    let stats = cluster.api().stats();
    assert_eq!(stats.writes(), 0, "explain only reads: {stats:?}");
    assert!(stats.resource("resourceslices").list > 0, "{stats:?}");
    running.shutdown().await.unwrap();
}

/// API servers like Kubernetes 1.32 (only v1beta1) and 1.33 (v1beta2, v1beta1): dractl finds
/// the newest version served by discovery and reads through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_through_the_newest_version_the_server_serves() {
    for (version, newest) in [("v1beta1", "v1beta1"), ("v1beta2", "v1beta2")] {
        let types = [
            ResourceType::RESOURCE_SLICES,
            ResourceType::DEVICE_CLASSES,
            ResourceType::RESOURCE_CLAIMS,
        ]
        .map(|t| t.with_version(version));
        let api = FakeApiServer::builder()
            .resource_types(types.into_iter().chain([ResourceType::NODES]))
            .start()
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        api.write_kubeconfig(&kubeconfig).unwrap();
        let client = api.client().unwrap();
        let resource = |kind: &str, plural: &str| ApiResource {
            group: "resource.k8s.io".into(),
            version: version.into(),
            api_version: format!("resource.k8s.io/{version}"),
            kind: kind.into(),
            plural: plural.into(),
        };
        let create =
            async |kind: &str, plural: &str, namespace: Option<&str>, mut object: Value| {
                let resource = resource(kind, plural);
                object["apiVersion"] = json!(resource.api_version);
                object["kind"] = json!(kind);
                let object: DynamicObject = serde_json::from_value(object).unwrap();
                let api: Api<DynamicObject> = match namespace {
                    Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
                    None => Api::all_with(client.clone(), &resource),
                };
                api.create(&PostParams::default(), &object).await.unwrap();
            };
        let (gpu_0, gpu_1, request) = if version == "v1beta1" {
            (
                json!({ "name": "gpu-0", "basic": { "attributes": { "model": { "string": "a100" } } } }),
                json!({ "name": "gpu-1", "basic": { "attributes": { "model": { "string": "t4" } } } }),
                json!({ "name": "gpu", "deviceClassName": "gpu", "selectors": [
                    { "cel": { "expression": "device.attributes['gpu.example.com'].model == 'a100'" } }] }),
            )
        } else {
            (
                json!({ "name": "gpu-0", "attributes": { "model": { "string": "a100" } } }),
                json!({ "name": "gpu-1", "attributes": { "model": { "string": "t4" } } }),
                json!({ "name": "gpu", "exactly": { "deviceClassName": "gpu", "selectors": [
                    { "cel": { "expression": "device.attributes['gpu.example.com'].model == 'a100'" } }] } }),
            )
        };
        create(
            "ResourceSlice",
            "resourceslices",
            None,
            json!({ "metadata": { "name": "s" }, "spec": {
                "driver": "gpu.example.com", "nodeName": "node-1",
                "pool": { "name": "node-1", "generation": 1, "resourceSliceCount": 1 },
                "devices": [gpu_0, gpu_1] } }),
        )
        .await;
        create(
            "DeviceClass",
            "deviceclasses",
            None,
            json!({ "metadata": { "name": "gpu" }, "spec": { "selectors": [
                { "cel": { "expression": "device.driver == 'gpu.example.com'" } }] } }),
        )
        .await;
        create(
            "ResourceClaim",
            "resourceclaims",
            Some("default"),
            json!({ "metadata": { "name": "a100", "namespace": "default" },
                    "spec": { "devices": { "requests": [request] } } }),
        )
        .await;
        api.reset_stats();

        let kubeconfig = kubeconfig.display().to_string();
        let run = run_async(strings(&[
            "explain",
            "default/a100",
            "--kubeconfig",
            &kubeconfig,
        ]))
        .await;
        assert_eq!(run.code, 0, "{version}: {run}");
        assert!(
            run.stdout
                .contains(&format!("(read through resource.k8s.io/{newest})")),
            "{version}: {run}"
        );
        assert!(
            run.stdout
                .ends_with("allocatable on node node-1: gpu → gpu.example.com/node-1/gpu-0\n"),
            "{version}: {run}"
        );
        assert_eq!(api.stats().writes(), 0);
    }
}
