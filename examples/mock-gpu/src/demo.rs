//! `mock-gpu-demo`: the driver end to end, against an embedded cluster or a real one.
//!
//! Starts the plugin on temporary kubelet directories, publishes the mock GPUs, creates a
//! DeviceClass and claims the way a user would, allocates them from the published
//! ResourceSlices with the SDK's scheduler-like allocator (CEL selectors included), prepares
//! them through a simulated kubelet over the plugin's real sockets, shows the CDI edits each
//! container would get, unprepares them and prints a summary.
//!
//! By default the API server is the SDK's embedded fake. With [`Target::Cluster`] (the
//! binary's `--kubeconfig`) everything goes through a real API server instead: the plugin
//! publishes for a real node under a driver name of its own, so it never competes with a
//! deployed driver, and the demo deletes every object it created before it returns, leftovers
//! of an interrupted earlier run included.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use dra_sdk::driver::ClaimRef;
use dra_sdk::plugin::KubeletPlugin;
use dra_sdk::testing::allocator::allocate_claim;
use dra_sdk::testing::cluster::{NODE_NAME, TestCluster};
use dra_sdk::testing::kubelet::{KubeletDevice, KubeletSimulator, KubeletVersion};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};

use crate::MockGpuDriver;

/// One claim of the demo: what it asks for, who uses it.
struct DemoClaim {
    name: &'static str,
    what: &'static str,
    /// The claim's `spec.devices`.
    devices: serde_json::Value,
    /// Pods (and the containers in them) that use the claim.
    pods: &'static [(&'static str, &'static [&'static str])],
}

/// Label on every object the demo creates in a real cluster, to find leftovers of an
/// interrupted run.
const DEMO_LABEL: (&str, &str) = ("app.kubernetes.io/managed-by", "mock-gpu-demo");
/// The finalizer the allocator adds, as the scheduler does; the demo removes it itself.
const DELETE_PROTECTION_FINALIZER: &str = "resource.kubernetes.io/delete-protection";
/// How long the plugin gets to write its ResourceSlices.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the demo runs.
pub enum Target {
    /// The SDK's embedded fake API server, with a Node of its own.
    Embedded,
    /// A real cluster.
    Cluster {
        /// A client of its API server, allowed to manage DeviceClasses, ResourceClaims (and
        /// their status) and ResourceSlices, and to list Nodes.
        client: kube::Client,
        /// The node the mock GPUs are published for; the first node listed when `None`.
        node_name: Option<String>,
        /// Namespace of the demo's claims.
        namespace: String,
    },
}

/// What the demo runs.
pub struct DemoOptions {
    /// DRA driver name; also the DeviceClass's name.
    pub driver_name: String,
    /// Number of mock GPUs.
    pub num_devices: u32,
    /// Where it runs.
    pub target: Target,
}

fn gpu_request(class: &str, count: u32, selector: Option<&str>) -> serde_json::Value {
    let mut exactly = serde_json::json!({ "deviceClassName": class, "count": count });
    if let Some(expression) = selector {
        exactly["selectors"] = serde_json::json!([{ "cel": { "expression": expression } }]);
    }
    serde_json::json!({ "name": "gpu", "exactly": exactly })
}

fn gpu_config(driver: &str, sharing: serde_json::Value) -> serde_json::Value {
    serde_json::json!([{
        "requests": ["gpu"],
        "opaque": {
            "driver": driver,
            "parameters": {
                "apiVersion": "gpu.resource.example.com/v1alpha1",
                "kind": "GpuConfig",
                "sharing": sharing
            }
        }
    }])
}

fn demo_claims(driver: &str) -> Vec<DemoClaim> {
    vec![
        DemoClaim {
            name: "single-gpu",
            what: "one GPU, default config",
            devices: serde_json::json!({ "requests": [gpu_request(driver, 1, None)] }),
            pods: &[("pod-a", &["main"])],
        },
        DemoClaim {
            name: "shared-gpu",
            what: "one GPU shared by two pods, time-slicing Long",
            devices: serde_json::json!({
                "requests": [gpu_request(driver, 1, None)],
                "config": gpu_config(driver, serde_json::json!({
                    "strategy": "TimeSlicing", "timeSlicingConfig": { "interval": "Long" }
                })),
            }),
            pods: &[("pod-b", &["main"]), ("pod-c", &["main"])],
        },
        DemoClaim {
            name: "cel-selected",
            what: "two GPUs with index >= 6, selected by CEL, space-partitioned in 4",
            devices: serde_json::json!({
                "requests": [gpu_request(driver, 2, Some(&format!(
                    "device.attributes[\"{driver}\"].index >= 6 && \
                     device.capacity[\"{driver}\"].memory.compareTo(quantity(\"40Gi\")) >= 0"
                )))],
                "config": gpu_config(driver, serde_json::json!({
                    "strategy": "SpacePartitioning", "spacePartitioningConfig": { "partitionCount": 4 }
                })),
            }),
            pods: &[("pod-d", &["trainer", "sidecar"])],
        },
        DemoClaim {
            name: "bad-config",
            what: "one GPU with a misspelled config field (must fail alone)",
            devices: serde_json::json!({
                "requests": [gpu_request(driver, 1, None)],
                "config": gpu_config(driver, serde_json::json!({
                    "strategy": "TimeSlicing", "timeSlicingConfig": { "intervall": "Long" }
                })),
            }),
            pods: &[("pod-e", &["main"])],
        },
    ]
}

/// The API server, node and kubelet directories the demo runs on.
struct Stage {
    client: kube::Client,
    node: String,
    namespace: String,
    /// Temporary kubelet directories: `registry`, `plugins`, `cdi`.
    dir: tempfile::TempDir,
    /// The embedded API server, kept alive for the demo; `None` on a real cluster.
    embedded: Option<TestCluster>,
}

impl Stage {
    async fn new(target: Target) -> Result<Self> {
        let (client, node, namespace, embedded) = match target {
            Target::Embedded => {
                let cluster = TestCluster::start()
                    .await
                    .context("starting the embedded cluster")?;
                let client = cluster.client();
                (
                    client,
                    NODE_NAME.to_owned(),
                    "default".to_owned(),
                    Some(cluster),
                )
            }
            Target::Cluster {
                client,
                node_name,
                namespace,
            } => {
                let node = match node_name {
                    Some(node) => node,
                    None => first_node(&client).await?,
                };
                (client, node, namespace, None)
            }
        };
        // Short paths keep the socket names far from the 108-byte limit.
        let dir = tempfile::Builder::new().prefix("dra").tempdir()?;
        for sub in ["registry", "plugins", "cdi"] {
            std::fs::create_dir_all(dir.path().join(sub))?;
        }
        Ok(Self {
            client,
            node,
            namespace,
            dir,
            embedded,
        })
    }

    fn cdi_root(&self) -> PathBuf {
        self.dir.path().join("cdi")
    }

    fn location(&self) -> &'static str {
        if self.embedded.is_some() {
            "the embedded cluster"
        } else {
            "the cluster"
        }
    }
}

async fn first_node(client: &kube::Client) -> Result<String> {
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default().limit(1))
        .await
        .context("listing Nodes to pick one (or pass --node-name)")?;
    nodes
        .items
        .into_iter()
        .find_map(|node| node.metadata.name)
        .context("the cluster has no Nodes to publish the mock GPUs for")
}

fn labels() -> serde_json::Value {
    serde_json::json!({ DEMO_LABEL.0: DEMO_LABEL.1 })
}

fn label_selector() -> ListParams {
    ListParams::default().labels(&format!("{}={}", DEMO_LABEL.0, DEMO_LABEL.1))
}

/// Runs the demo and returns the report it printed.
pub async fn run(options: DemoOptions) -> Result<String> {
    let DemoOptions {
        driver_name,
        num_devices,
        target,
    } = options;
    let stage = Stage::new(target).await?;
    let client = stage.client.clone();
    let claims_api: Api<ResourceClaim> = Api::namespaced(client.clone(), &stage.namespace);
    let classes: Api<DeviceClass> = Api::all(client.clone());
    // Leftovers of an interrupted run would make the creates below fail.
    remove_claims(&claims_api).await?;

    let mut out = String::new();
    let driver = MockGpuDriver::new(&driver_name, &stage.node, num_devices);
    let resources = driver.resources();
    let plugin = KubeletPlugin::builder(driver, &driver_name, &stage.node, client.clone())
        .registrar_dir(stage.dir.path().join("registry"))
        .plugins_dir(stage.dir.path().join("plugins"))
        .cdi_root(stage.cdi_root())
        .resources(resources)
        .start()
        .await
        .context("starting the plugin")?;
    let outcome = drive(
        &stage,
        &driver_name,
        &plugin,
        &classes,
        &claims_api,
        &mut out,
    )
    .await;

    // Clean up whatever happened: a failed step must not leave objects in a real cluster.
    let cleanup = async {
        remove_claims(&claims_api).await?;
        remove_device_class(&classes, &driver_name).await?;
        plugin.shutdown().await.context("stopping the plugin")?;
        if stage.embedded.is_none() {
            remove_slices(&client, &driver_name, &stage.node).await?;
        }
        anyhow::Ok(())
    }
    .await;
    if let (Err(_), Err(error)) = (&outcome, &cleanup) {
        // The step's error is the one returned; the cleanup's must not vanish with it.
        tracing::error!("cleaning up after the failed demo: {error:#}");
    }
    outcome?;
    cleanup?;
    print!("{out}");
    Ok(out)
}

/// Everything between starting the plugin and cleaning up; writes the report to `out`.
async fn drive(
    stage: &Stage,
    driver_name: &str,
    plugin: &KubeletPlugin,
    classes: &Api<DeviceClass>,
    claims_api: &Api<ResourceClaim>,
    out: &mut String,
) -> Result<()> {
    let client = &stage.client;
    let kubelet = KubeletSimulator::new(KubeletVersion::V1_36)
        .register(&plugin.socket_paths().registration)
        .await
        .context("registering with the simulated kubelet")?;
    writeln!(
        out,
        "plugin {driver_name} on node {} of {} registered with a simulated kubelet 1.36 (API {:?})",
        stage.node,
        stage.location(),
        kubelet.api
    )?;

    if let Some(publisher) = plugin.publisher()
        && tokio::time::timeout(PUBLISH_TIMEOUT, publisher.synced())
            .await
            .is_err()
    {
        bail!("the plugin did not publish its ResourceSlices within {PUBLISH_TIMEOUT:?}");
    }
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let published = slices
        .list(&ListParams::default().fields(&format!(
            "spec.driver={driver_name},spec.nodeName={}",
            stage.node
        )))
        .await
        .context("listing ResourceSlices")?;
    let devices: usize = published
        .items
        .iter()
        .map(|slice| slice.spec.devices.as_ref().map_or(0, Vec::len))
        .sum();
    writeln!(
        out,
        "published {devices} GPUs in {} ResourceSlice(s)",
        published.items.len()
    )?;

    let class: DeviceClass = serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": { "name": driver_name, "labels": labels() },
        "spec": { "selectors": [{ "cel": { "expression": format!("device.driver == \"{driver_name}\"") } }] }
    }))?;
    match classes.create(&PostParams::default(), &class).await {
        Ok(_) => {}
        // A class of that name from elsewhere is used as it is (and left alone afterwards).
        Err(kube::Error::Api(status)) if status.code == 409 => {
            writeln!(out, "using the existing DeviceClass {driver_name}")?;
        }
        Err(error) => return Err(error).context("creating the DeviceClass"),
    }

    let plans = demo_claims(driver_name);
    let mut refs = Vec::new();
    for plan in &plans {
        let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": { "name": plan.name, "namespace": stage.namespace, "labels": labels() },
            "spec": { "devices": plan.devices },
        }))?;
        claims_api
            .create(&PostParams::default(), &claim)
            .await
            .with_context(|| format!("creating claim {}", plan.name))?;
        let mut allocated = None;
        for (index, (pod, _)) in plan.pods.iter().enumerate() {
            let pod_uid = format!("00000000-0000-4000-8000-{:012}", refs.len() * 10 + index);
            allocated = Some(
                allocate_claim(
                    client,
                    &stage.namespace,
                    plan.name,
                    &stage.node,
                    Some((pod, &pod_uid)),
                )
                .await
                .with_context(|| format!("allocating claim {}", plan.name))?,
            );
        }
        let uid = allocated
            .and_then(|claim| claim.metadata.uid)
            .context("allocated claim without UID")?;
        refs.push(ClaimRef {
            uid,
            namespace: stage.namespace.clone(),
            name: plan.name.into(),
        });
    }

    // The kubelet sends one NodePrepareResources per pod; a claim already prepared for an
    // earlier pod is answered from the plugin's checkpoint.
    let mut results = BTreeMap::new();
    for (plan, claim) in plans.iter().zip(&refs) {
        for (pod, containers) in plan.pods {
            let answer = kubelet
                .prepare(std::slice::from_ref(claim))
                .await
                .context("NodePrepareResources")?;
            if let Some(result) = answer.get(&claim.uid) {
                results.insert(claim.uid.clone(), result.clone());
                writeln!(out, "\npod {pod}, claim {} ({}):", plan.name, plan.what)?;
                match result {
                    Ok(devices) => {
                        for container in *containers {
                            writeln!(out, "  container {container}:")?;
                            for device in devices {
                                writeln!(
                                    out,
                                    "    {} -> {}",
                                    device.device,
                                    device.cdi_device_ids.join(", ")
                                )?;
                            }
                            for env in container_env(&stage.cdi_root(), devices)? {
                                writeln!(out, "      env {env}")?;
                            }
                        }
                    }
                    Err(error) => writeln!(out, "  FAILED: {error}")?,
                }
            }
        }
    }

    let unprepared = kubelet
        .unprepare(&refs)
        .await
        .context("NodeUnprepareResources")?;
    let prepared = results.values().filter(|r| r.is_ok()).count();
    let unprepared_ok = unprepared.values().filter(|r| r.is_ok()).count();
    let leftover = std::fs::read_dir(stage.cdi_root())?.count();
    writeln!(
        out,
        "\nsummary: {} claims allocated, {prepared} prepared, {} failed (the bad config), \
         {unprepared_ok} unprepared, {leftover} CDI spec files left",
        refs.len(),
        refs.len() - prepared,
    )?;
    Ok(())
}

/// Deletes the demo's claims. The allocator added the scheduler's delete-protection
/// finalizer; without a real scheduler and controller to drop it, the demo does.
async fn remove_claims(claims: &Api<ResourceClaim>) -> Result<()> {
    let listed = claims
        .list(&label_selector())
        .await
        .context("listing the demo's ResourceClaims")?;
    for claim in listed.items {
        let Some(name) = claim.metadata.name else {
            continue;
        };
        let finalizers = claim.metadata.finalizers.unwrap_or_default();
        if finalizers.iter().any(|f| f == DELETE_PROTECTION_FINALIZER) {
            let kept: Vec<_> = finalizers
                .into_iter()
                .filter(|f| f != DELETE_PROTECTION_FINALIZER)
                .collect();
            let patch = serde_json::json!({ "metadata": {
                "finalizers": kept,
                "resourceVersion": claim.metadata.resource_version,
            }});
            ignore_not_found(
                claims
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await,
            )
            .with_context(|| format!("removing the finalizer of claim {name}"))?;
        }
        ignore_not_found(
            claims
                .delete(&name, &DeleteParams::default())
                .await
                .map(|_| ()),
        )
        .with_context(|| format!("deleting claim {name}"))?;
    }
    Ok(())
}

/// Deletes the DeviceClass `name` if the demo created it.
async fn remove_device_class(classes: &Api<DeviceClass>, name: &str) -> Result<()> {
    let Some(class) = classes
        .get_opt(name)
        .await
        .context("reading the DeviceClass")?
    else {
        return Ok(());
    };
    let ours = class
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(DEMO_LABEL.0))
        .is_some_and(|value| value == DEMO_LABEL.1);
    if ours {
        ignore_not_found(
            classes
                .delete(name, &DeleteParams::default())
                .await
                .map(|_| ()),
        )
        .context("deleting the DeviceClass")?;
    }
    Ok(())
}

/// Deletes the plugin's ResourceSlices: on a real cluster no kubelet knows this plugin, so
/// none would remove them once it is gone.
async fn remove_slices(client: &kube::Client, driver_name: &str, node: &str) -> Result<()> {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let fields = format!("spec.driver={driver_name},spec.nodeName={node}");
    slices
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().fields(&fields),
        )
        .await
        .context("deleting the demo's ResourceSlices")?;
    Ok(())
}

fn ignore_not_found<T>(result: kube::Result<T>) -> kube::Result<()> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(error),
    }
}

/// The environment a container using `devices` gets: spec-level and device-level env of the
/// CDI spec files that define their CDI IDs.
fn container_env(cdi_root: &Path, devices: &[KubeletDevice]) -> Result<Vec<String>> {
    let mut env = std::collections::BTreeSet::new();
    for id in devices.iter().flat_map(|d| &d.cdi_device_ids) {
        let Some((kind, name)) = id.split_once('=') else {
            continue;
        };
        for entry in std::fs::read_dir(cdi_root)? {
            let path = entry?.path();
            let spec = dra_sdk::cdi::Spec::read_file(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            if spec.kind.to_string() != kind {
                continue;
            }
            let Some(device) = spec.devices.iter().find(|d| d.name == name) else {
                continue;
            };
            for edits in [&spec.container_edits, &device.container_edits] {
                env.extend(edits.env.iter().cloned());
            }
        }
    }
    Ok(env.into_iter().collect())
}
