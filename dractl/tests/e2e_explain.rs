//! `dractl explain` against the real scheduler (see `dra_sdk_testing::e2e`): for claims the
//! kube-scheduler allocates, explain predicts that allocation; for claims it leaves pending
//! (a selector matching nothing, counters exhausted by another claim, an untolerated taint),
//! explain names the reason. Skipped, with one line saying so, when `DRA_E2E_K8S_BIN` does not
//! name the binaries.

use std::time::{Duration, Instant};

use dra_sdk::plugin::KubeletPlugin;
use dra_sdk::slices::{CounterSet, Device, DeviceTaint, DriverResources, Pool, TaintEffect};
use dra_sdk_testing::e2e::workload::{self, ClaimSource};
use dra_sdk_testing::e2e::{RealCluster, binaries_or_skip};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate};
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

use dra_sdk_testing::sample_driver::GpuDriver;

const TIMEOUT: Duration = Duration::from_secs(60);
const NODE: &str = "node-1";
const DRIVER: &str = "explain.gpu.example.com";

fn object<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).expect("a valid object")
}

/// The result of one dractl run.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
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

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{self}"))
    }
}

async fn dractl(args: Vec<String>) -> Run {
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_dractl"))
            .args(&args)
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

/// node-1's devices: two A100s (`gpu-1` tainted), and a partitionable GPU whose whole device
/// and half share the counter set `gpu`.
fn devices() -> DriverResources {
    let model = |device: Device, model: &str| device.attribute("model", model);
    let gpus = vec![
        model(Device::new("gpu-0"), "a100"),
        model(Device::new("gpu-1"), "a100-broken").taint(
            DeviceTaint::new("explain.example.com/broken", TaintEffect::NoSchedule).value("xid-79"),
        ),
        model(Device::new("whole"), "a30").consumes("gpu", [("memory", "24Gi")]),
        model(Device::new("half"), "a30-half").consumes("gpu", [("memory", "12Gi")]),
    ];
    DriverResources::new().with_pool(
        NODE,
        Pool::new(gpus).counter_set(CounterSet::new("gpu", [("memory", "24Gi")])),
    )
}

async fn start_plugin(cluster: &RealCluster) -> KubeletPlugin {
    let client = cluster.client().await.unwrap();
    let plugin = cluster
        .plugin(NODE, GpuDriver::default(), DRIVER, client)
        .unwrap()
        .resources(devices())
        .start()
        .await
        .unwrap();
    tokio::time::timeout(TIMEOUT, plugin.published())
        .await
        .expect("the plugin's slices are written");
    plugin
}

/// The test's view of the cluster: its client, namespace, class and kubeconfig.
struct Scene<'a> {
    cluster: &'a RealCluster,
    client: kube::Client,
    namespace: String,
    class: String,
}

impl Scene<'_> {
    /// A template `name` for one device of the class with the model `model`.
    fn template(&self, name: &str, model: &str) -> Value {
        json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": { "name": name, "namespace": self.namespace },
            "spec": { "spec": { "devices": { "requests": [{ "name": "dev", "exactly": {
                "deviceClassName": self.class,
                "selectors": [{ "cel": { "expression":
                    format!("device.attributes[{DRIVER:?}].model == {model:?}") } }],
            } }] } } },
        })
    }

    /// Writes the template to a file for `explain -f`, and creates it.
    async fn create_template(&self, name: &str, model: &str) -> String {
        let template = self.template(name, model);
        let file = self
            .cluster
            .path()
            .join(format!("{}-{name}.json", self.namespace));
        std::fs::write(&file, serde_json::to_vec_pretty(&template).unwrap()).unwrap();
        Api::<ResourceClaimTemplate>::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &object(template))
            .await
            .unwrap();
        file.display().to_string()
    }

    async fn create_pod(&self, name: &str, template: &str) {
        let source = ClaimSource::Template(template.into());
        let pod = workload::pod_using(&self.namespace, name, NODE, &source, &["ctr"]);
        Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
    }

    /// The claim the resourceclaim controller made for the pod.
    async fn claim_of(&self, pod: &str) -> String {
        let pods = Api::<Pod>::namespaced(self.client.clone(), &self.namespace);
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let name = pods
                .get(pod)
                .await
                .unwrap()
                .status
                .and_then(|s| s.resource_claim_statuses)
                .and_then(|statuses| statuses.into_iter().next())
                .and_then(|status| status.resource_claim_name);
            if let Some(name) = name {
                return name;
            }
            assert!(Instant::now() < deadline, "pod {pod} got no claim");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The device the scheduler allocated to the pod's claim, once the pod runs.
    async fn allocated_device(&self, pod: &str) -> String {
        workload::wait_for_pod_running(&self.client, &self.namespace, pod, TIMEOUT)
            .await
            .unwrap();
        let claim = Api::<ResourceClaim>::namespaced(self.client.clone(), &self.namespace)
            .get(&self.claim_of(pod).await)
            .await
            .unwrap();
        let claim = serde_json::to_value(claim).unwrap();
        claim
            .pointer("/status/allocation/devices/results/0/device")
            .and_then(Value::as_str)
            .unwrap()
            .to_owned()
    }

    /// Waits a while and checks the scheduler left the pod unscheduled, saying it cannot
    /// allocate the claims.
    async fn stays_pending(&self, pod: &str) {
        let pods = Api::<Pod>::namespaced(self.client.clone(), &self.namespace);
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let pod_object = pods.get(pod).await.unwrap();
            assert_eq!(
                pod_object.spec.as_ref().and_then(|s| s.node_name.clone()),
                None,
                "pod {pod} must not be scheduled"
            );
            let message = pod_object
                .status
                .and_then(|s| s.conditions)
                .into_iter()
                .flatten()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")
                .and_then(|c| c.message);
            if let Some(message) = message {
                assert!(
                    message.contains("cannot allocate all claims"),
                    "pod {pod}: {message}"
                );
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the scheduler never said why {pod} is pending"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `dractl explain <args> --kubeconfig <the cluster's>`.
    async fn explain(&self, args: &[&str]) -> Run {
        let mut all = vec!["explain".to_owned()];
        all.extend(args.iter().map(|a| a.to_string()));
        all.push("--kubeconfig".to_owned());
        all.push(self.cluster.kubeconfig().display().to_string());
        dractl(all).await
    }

    /// `explain <namespace>/<claim of pod> --node node-1 -o json`, expecting `code`.
    async fn explain_pod(&self, pod: &str, code: i32) -> Value {
        let claim = format!("{}/{}", self.namespace, self.claim_of(pod).await);
        let run = self.explain(&[&claim, "--node", NODE, "-o", "json"]).await;
        assert_eq!(run.code, code, "{run}");
        run.json()
    }
}

/// The verdict entry of a device of this test's driver.
fn device<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["requests"][0]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["driver"] == DRIVER && d["device"] == name)
        .unwrap_or_else(|| panic!("no device {name} in {report:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_agrees_with_the_real_scheduler() {
    let Some(binaries) = binaries_or_skip() else {
        return;
    };
    let cluster = RealCluster::builder(binaries)
        .nodes([NODE])
        .start()
        .await
        .unwrap_or_else(|error| panic!("starting the e2e cluster: {error}"));
    eprintln!("e2e: {}", cluster.describe());
    let plugin = start_plugin(&cluster).await;
    let client = cluster.client().await.unwrap();
    let namespace = cluster.create_namespace("explain").await.unwrap();
    let class = format!("{namespace}.{DRIVER}");
    Api::<DeviceClass>::all(client.clone())
        .create(
            &PostParams::default(),
            &object(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": { "name": class },
                "spec": { "selectors": [{ "cel": { "expression": format!("device.driver == {DRIVER:?}") } }] },
            })),
        )
        .await
        .unwrap();
    let scene = Scene {
        cluster: &cluster,
        client: client.clone(),
        namespace: namespace.clone(),
        class,
    };

    // Allocated by the scheduler: explain, asked before, predicted that device.
    let file = scene.create_template("a100", "a100").await;
    let run = scene.explain(&["-f", &file, "-o", "json"]).await;
    assert_eq!(run.code, 0, "{run}");
    let prediction = run.json();
    assert_eq!(prediction["node"], NODE);
    let predicted = prediction["allocation"]["devices"]["results"][0]["device"].clone();
    scene.create_pod("a100", "a100").await;
    assert_eq!(json!(scene.allocated_device("a100").await), predicted);
    assert_eq!(predicted, "gpu-0");

    let file = scene.create_template("whole", "a30").await;
    let run = scene
        .explain(&["-f", &file, "--node", NODE, "-o", "json"])
        .await;
    assert_eq!(run.code, 0, "{run}");
    assert_eq!(device(&run.json(), "whole")["verdict"], "chosen");
    scene.create_pod("whole", "whole").await;
    assert_eq!(scene.allocated_device("whole").await, "whole");
    let whole_claim = format!("{namespace}/{}", scene.claim_of("whole").await);

    // Pending: a selector matching nothing.
    scene.create_template("b200", "b200").await;
    scene.create_pod("b200", "b200").await;
    scene.stays_pending("b200").await;
    let report = scene.explain_pod("b200", 1).await;
    for name in ["gpu-0", "gpu-1", "whole", "half"] {
        assert_eq!(
            device(&report, name)["verdict"],
            "requestSelectorFalse",
            "{name}: {report:#}"
        );
    }
    assert!(
        report["reason"]
            .as_str()
            .unwrap()
            .contains("request dev: no device matches the selectors"),
        "{report:#}"
    );

    // Pending: the half's counters are taken by the whole device's claim.
    scene.create_template("half", "a30-half").await;
    scene.create_pod("half", "half").await;
    scene.stays_pending("half").await;
    let report = scene.explain_pod("half", 1).await;
    let half = device(&report, "half");
    assert_eq!(half["verdict"], "countersExhausted", "{report:#}");
    assert_eq!(half["counterSet"], "gpu");
    assert_eq!(half["holders"][0]["claims"], json!([whole_claim]));
    assert_eq!(half["holders"][0]["device"], "whole");

    // Pending: the only matching device has a taint the claim does not tolerate.
    scene.create_template("broken", "a100-broken").await;
    scene.create_pod("broken", "broken").await;
    scene.stays_pending("broken").await;
    let report = scene.explain_pod("broken", 1).await;
    let broken = device(&report, "gpu-1");
    assert_eq!(broken["verdict"], "tainted", "{report:#}");
    assert_eq!(broken["key"], "explain.example.com/broken");
    assert_eq!(broken["effect"], "NoSchedule");

    // The table says the same, for people.
    let claim = format!("{namespace}/{}", scene.claim_of("half").await);
    let run = scene.explain(&[&claim, "--node", NODE]).await;
    assert_eq!(run.code, 1, "{run}");
    assert!(
        run.stdout.contains(&format!(
            "counter set gpu exhausted: memory 12Gi needed, 0 of 24Gi left (held by {whole_claim} on whole (memory=24Gi))"
        )),
        "{run}"
    );
    assert!(
        run.stdout.contains("(read through resource.k8s.io/v1)"),
        "{run}"
    );

    // Once the whole device's pod is gone, explain sees the counters free, and the scheduler
    // allocates the half.
    workload::delete_pods(&client, &namespace, &["whole"], TIMEOUT)
        .await
        .unwrap();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        // The claim is deallocated a moment after its pod is gone.
        let run = scene.explain(&[&claim, "--node", NODE, "-o", "json"]).await;
        if run.code == 0 {
            assert_eq!(device(&run.json(), "half")["verdict"], "chosen");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the counters never came free: {run}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(scene.allocated_device("half").await, "half");

    // The node view: what holds each device.
    let run = scene.explain(&["--node", NODE, "-o", "json"]).await;
    assert_eq!(run.code, 0, "{run}");
    let node = run.json();
    let a100_claim = format!("{namespace}/{}", scene.claim_of("a100").await);
    let gpu_0 = node["node"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["driver"] == DRIVER && d["device"] == "gpu-0")
        .unwrap();
    assert_eq!(gpu_0["holders"][0]["claim"], a100_claim);

    workload::delete_pods(
        &client,
        &namespace,
        &["a100", "half", "b200", "broken"],
        TIMEOUT,
    )
    .await
    .unwrap();
    plugin.shutdown().await.unwrap();
}
