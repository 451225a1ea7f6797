//! `mock-gpu-kubelet-plugin demo`: the driver end to end against an embedded cluster.
//!
//! Starts the fake API server and the plugin on temporary directories, publishes the mock GPUs,
//! creates a DeviceClass and claims the way a user would, allocates them from the published
//! ResourceSlices with the SDK's scheduler-like allocator (CEL selectors included), prepares
//! them through a simulated kubelet over the plugin's real sockets, shows the CDI edits each
//! container would get, unprepares them and prints a summary.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{Context, Result};
use dra_sdk::driver::ClaimRef;
use dra_sdk::testing::allocator::allocate_claim;
use dra_sdk::testing::cluster::{NODE_NAME, TestCluster};
use dra_sdk::testing::kubelet::{KubeletDevice, KubeletVersion};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{ListParams, PostParams};

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

fn gpu_request(count: u32, selector: Option<&str>) -> serde_json::Value {
    let mut exactly = serde_json::json!({ "deviceClassName": "gpu.example.com", "count": count });
    if let Some(expression) = selector {
        exactly["selectors"] = serde_json::json!([{ "cel": { "expression": expression } }]);
    }
    serde_json::json!({ "name": "gpu", "exactly": exactly })
}

fn gpu_config(sharing: serde_json::Value) -> serde_json::Value {
    serde_json::json!([{
        "requests": ["gpu"],
        "opaque": {
            "driver": "gpu.example.com",
            "parameters": {
                "apiVersion": "gpu.resource.example.com/v1alpha1",
                "kind": "GpuConfig",
                "sharing": sharing
            }
        }
    }])
}

fn demo_claims() -> Vec<DemoClaim> {
    vec![
        DemoClaim {
            name: "single-gpu",
            what: "one GPU, default config",
            devices: serde_json::json!({ "requests": [gpu_request(1, None)] }),
            pods: &[("pod-a", &["main"])],
        },
        DemoClaim {
            name: "shared-gpu",
            what: "one GPU shared by two pods, time-slicing Long",
            devices: serde_json::json!({
                "requests": [gpu_request(1, None)],
                "config": gpu_config(serde_json::json!({
                    "strategy": "TimeSlicing", "timeSlicingConfig": { "interval": "Long" }
                })),
            }),
            pods: &[("pod-b", &["main"]), ("pod-c", &["main"])],
        },
        DemoClaim {
            name: "cel-selected",
            what: "two GPUs with index >= 6, selected by CEL, space-partitioned in 4",
            devices: serde_json::json!({
                "requests": [gpu_request(2, Some(
                    "device.attributes[\"gpu.example.com\"].index >= 6 && \
                     device.capacity[\"gpu.example.com\"].memory.compareTo(quantity(\"40Gi\")) >= 0"
                ))],
                "config": gpu_config(serde_json::json!({
                    "strategy": "SpacePartitioning", "spacePartitioningConfig": { "partitionCount": 4 }
                })),
            }),
            pods: &[("pod-d", &["trainer", "sidecar"])],
        },
        DemoClaim {
            name: "bad-config",
            what: "one GPU with a misspelled config field (must fail alone)",
            devices: serde_json::json!({
                "requests": [gpu_request(1, None)],
                "config": gpu_config(serde_json::json!({
                    "strategy": "TimeSlicing", "timeSlicingConfig": { "intervall": "Long" }
                })),
            }),
            pods: &[("pod-e", &["main"])],
        },
    ]
}

/// Runs the demo and returns the report it printed.
pub async fn run(driver_name: &str, num_devices: u32) -> Result<String> {
    let mut out = String::new();
    let cluster = TestCluster::start()
        .await
        .context("starting the embedded cluster")?;
    let client = cluster.client();
    let driver = MockGpuDriver::new(driver_name, NODE_NAME, num_devices);
    let resources = driver.resources();
    let plugin = cluster
        .plugin(driver, driver_name)
        .resources(resources)
        .start()
        .await
        .context("starting the plugin")?;
    let kubelet = cluster
        .register(&plugin, KubeletVersion::V1_36)
        .await
        .context("registering with the simulated kubelet")?;
    writeln!(
        out,
        "plugin {driver_name} registered with a simulated kubelet 1.36 (API {:?})",
        kubelet.api
    )?;

    if let Some(publisher) = plugin.publisher() {
        publisher.synced().await;
    }
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let published = slices
        .list(&ListParams::default().fields(&format!("spec.driver={driver_name}")))
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
        "metadata": { "name": "gpu.example.com" },
        "spec": { "selectors": [{ "cel": { "expression": format!("device.driver == \"{driver_name}\"") } }] }
    }))?;
    Api::<DeviceClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
        .context("creating the DeviceClass")?;

    let claims_api: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let plans = demo_claims();
    let mut refs = Vec::new();
    for plan in &plans {
        let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": { "name": plan.name, "namespace": "default" },
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
                    &client,
                    "default",
                    plan.name,
                    NODE_NAME,
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
            namespace: "default".into(),
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
                            for env in container_env(&cluster, devices)? {
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
    let leftover = std::fs::read_dir(cluster.cdi_root())?.count();
    writeln!(
        out,
        "\nsummary: {} claims allocated, {prepared} prepared, {} failed (the bad config), \
         {unprepared_ok} unprepared, {leftover} CDI spec files left",
        refs.len(),
        refs.len() - prepared,
    )?;
    plugin.shutdown().await.context("stopping the plugin")?;
    print!("{out}");
    Ok(out)
}

/// The environment a container using `devices` gets: spec-level and device-level env of the
/// CDI spec files that define their CDI IDs.
fn container_env(cluster: &TestCluster, devices: &[KubeletDevice]) -> Result<Vec<String>> {
    let mut env = std::collections::BTreeSet::new();
    for id in devices.iter().flat_map(|d| &d.cdi_device_ids) {
        let Some((kind, name)) = id.split_once('=') else {
            continue;
        };
        for entry in std::fs::read_dir(cluster.cdi_root())? {
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
