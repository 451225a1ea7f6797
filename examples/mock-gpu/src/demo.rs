//! `mock-gpu-kubelet-plugin demo`: the driver end to end against an embedded cluster.
//!
//! Starts the fake API server and the plugin on temporary directories, publishes the mock GPUs,
//! creates claims, allocates them from the published ResourceSlice (first fit, like a
//! scheduler would for these simple requests), prepares them through a simulated kubelet over
//! the plugin's real sockets, shows the CDI edits each container would get, unprepares them and
//! prints a summary.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{Context, Result, bail};
use dra_sdk::driver::ClaimRef;
use dra_sdk::testing::claims::AllocatedClaim;
use dra_sdk::testing::cluster::{NODE_NAME, TestCluster};
use dra_sdk::testing::kubelet::{KubeletDevice, KubeletVersion};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;
use kube::api::ListParams;

use crate::MockGpuDriver;

/// One claim of the demo: what it asks for and which config it carries.
struct DemoClaim {
    name: &'static str,
    what: &'static str,
    gpus: usize,
    config: Option<serde_json::Value>,
}

fn demo_claims() -> Vec<DemoClaim> {
    vec![
        DemoClaim {
            name: "single-gpu",
            what: "one GPU, default config",
            gpus: 1,
            config: None,
        },
        DemoClaim {
            name: "shared-gpu",
            what: "one GPU shared by two containers, time-slicing Long",
            gpus: 1,
            config: Some(serde_json::json!({
                "apiVersion": "gpu.resource.example.com/v1alpha1",
                "kind": "GpuConfig",
                "sharing": { "strategy": "TimeSlicing", "timeSlicingConfig": { "interval": "Long" } }
            })),
        },
        DemoClaim {
            name: "partitioned-pair",
            what: "two GPUs, space-partitioned in 4",
            gpus: 2,
            config: Some(serde_json::json!({
                "apiVersion": "gpu.resource.example.com/v1alpha1",
                "kind": "GpuConfig",
                "sharing": { "strategy": "SpacePartitioning", "spacePartitioningConfig": { "partitionCount": 4 } }
            })),
        },
        DemoClaim {
            name: "bad-config",
            what: "one GPU with a misspelled config field (must fail alone)",
            gpus: 1,
            config: Some(serde_json::json!({
                "apiVersion": "gpu.resource.example.com/v1alpha1",
                "kind": "GpuConfig",
                "sharing": { "strategy": "TimeSlicing", "timeSlicingConfig": { "intervall": "Long" } }
            })),
        },
    ]
}

/// Runs the demo and returns the report it printed.
pub async fn run(driver_name: &str, num_devices: u32) -> Result<String> {
    let mut out = String::new();
    let cluster = TestCluster::start()
        .await
        .context("starting the embedded cluster")?;
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
        "plugin {driver_name} registered (API {:?}), sockets:\n  {}\n  {}",
        kubelet.api,
        plugin.socket_paths().registration.display(),
        plugin.socket_paths().dra.display()
    )?;

    if let Some(publisher) = plugin.publisher() {
        publisher.synced().await;
    }
    let slices: Api<ResourceSlice> = Api::all(cluster.client());
    let published = slices
        .list(&ListParams::default().fields(&format!("spec.driver={driver_name}")))
        .await
        .context("listing ResourceSlices")?;
    let mut free: Vec<(String, String)> = published
        .items
        .iter()
        .flat_map(|slice| {
            let pool = slice.spec.pool.name.clone();
            slice
                .spec
                .devices
                .iter()
                .flatten()
                .map(move |device| (pool.clone(), device.name.clone()))
        })
        .collect();
    free.sort_by_key(|(_, device)| {
        device
            .trim_start_matches("gpu-")
            .parse::<u32>()
            .unwrap_or(0)
    });
    writeln!(
        out,
        "published {} devices in {} ResourceSlice(s)",
        free.len(),
        published.items.len()
    )?;

    let mut claims = Vec::new();
    let mut plans = Vec::new();
    for plan in demo_claims() {
        if free.len() < plan.gpus {
            bail!("not enough free GPUs for claim {}", plan.name);
        }
        let mut builder = AllocatedClaim::new("default", plan.name);
        for (pool, device) in free.drain(..plan.gpus) {
            builder = builder.device("gpu", driver_name, &pool, &device);
        }
        if let Some(config) = &plan.config {
            builder = builder.claim_config(&[], driver_name, config.clone());
        }
        let claim = builder
            .create(&cluster.client())
            .await
            .context("creating a claim")?;
        claims.push(ClaimRef {
            uid: claim.metadata.uid.clone().unwrap_or_default(),
            namespace: "default".into(),
            name: plan.name.into(),
        });
        plans.push(plan);
    }

    let prepared = kubelet
        .prepare(&claims)
        .await
        .context("NodePrepareResources")?;
    let mut succeeded = 0;
    for (claim, plan) in claims.iter().zip(&plans) {
        writeln!(out, "\nclaim {} ({}):", plan.name, plan.what)?;
        match &prepared[&claim.uid] {
            Ok(devices) => {
                succeeded += 1;
                for device in devices {
                    writeln!(
                        out,
                        "  device {}/{} -> {}",
                        device.pool,
                        device.device,
                        device.cdi_device_ids.join(", ")
                    )?;
                    for env in container_env(&cluster, device)? {
                        writeln!(out, "    env {env}")?;
                    }
                }
            }
            Err(error) => writeln!(out, "  FAILED: {error}")?,
        }
    }

    let unprepared = kubelet
        .unprepare(&claims)
        .await
        .context("NodeUnprepareResources")?;
    let unprepared_ok = unprepared.values().filter(|r| r.is_ok()).count();
    let leftover = std::fs::read_dir(cluster.cdi_root())?.count();
    writeln!(
        out,
        "\nsummary: {} claims, {} prepared, {} failed as expected, {} unprepared, {} CDI spec files left",
        claims.len(),
        succeeded,
        claims.len() - succeeded,
        unprepared_ok,
        leftover
    )?;
    plugin.shutdown().await.context("stopping the plugin")?;
    print!("{out}");
    Ok(out)
}

/// The environment a container using `device` gets: the spec-level and device-level env of
/// the CDI spec file that defines its CDI ID.
fn container_env(cluster: &TestCluster, device: &KubeletDevice) -> Result<Vec<String>> {
    let mut env = BTreeMap::new();
    for id in &device.cdi_device_ids {
        let Some((kind, name)) = id.split_once('=') else {
            continue;
        };
        for entry in std::fs::read_dir(cluster.cdi_root())? {
            let path = entry?.path();
            let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)
                .with_context(|| format!("parsing {}", path.display()))?;
            if spec["kind"] != kind {
                continue;
            }
            let Some(devices) = spec["devices"].as_array() else {
                continue;
            };
            let Some(found) = devices.iter().find(|d| d["name"] == name) else {
                continue;
            };
            for value in [
                &spec["containerEdits"]["env"],
                &found["containerEdits"]["env"],
            ] {
                for item in value.as_array().into_iter().flatten() {
                    if let Some(text) = item.as_str() {
                        env.insert(text.to_string(), ());
                    }
                }
            }
        }
    }
    Ok(env.into_keys().collect())
}
