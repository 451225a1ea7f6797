//! Commands that talk to the plugin's sockets: info, prepare, unprepare, health.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use dra_sdk::claim::ClaimRef;
use dra_sdk_allocator::allocate_claim;
use dra_sdk_testing::conformance::slices;
use dra_sdk_testing::kubelet::{
    DraApi, KubeletDevice, KubeletSimulator, KubeletVersion, RegisteredPlugin,
};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use serde_json::json;

use super::{ApiVersion, ClaimArgs, Output, Status, print_json};

const RELEASES: [(KubeletVersion, &str); 6] = [
    (KubeletVersion::V1_32, "1.32"),
    (KubeletVersion::V1_33, "1.33"),
    (KubeletVersion::V1_34, "1.34"),
    (KubeletVersion::V1_35, "1.35"),
    (KubeletVersion::V1_36, "1.36"),
    (KubeletVersion::V1_37, "1.37"),
];

fn api_name(api: DraApi) -> &'static str {
    match api {
        DraApi::V1 => "v1",
        DraApi::V1beta1 => "v1beta1",
    }
}

/// `dractl info`: `GetInfo` only, and the kubelets' choices computed locally, so a plugin that
/// a real kubelet registered is told nothing.
pub(crate) async fn info(socket: &Path, output: Output) -> anyhow::Result<Status> {
    let started = Instant::now();
    let info = KubeletSimulator::new(KubeletVersion::V1_36)
        .get_info(socket)
        .await
        .with_context(|| format!("GetInfo on {}", socket.display()))?;
    let elapsed = started.elapsed();
    let choices: Vec<(&str, Result<DraApi, String>)> = RELEASES
        .iter()
        .map(|(version, name)| (*name, KubeletSimulator::new(*version).choose_api(&info)))
        .collect();
    let health = info
        .supported_versions
        .iter()
        .any(|v| v == "v1.DRAResourceHealth" || v == "v1alpha1.DRAResourceHealth");
    // Kubelets before 1.34 are out of support soon; a plugin they reject still works.
    let usable = choices.iter().skip(2).all(|(_, choice)| choice.is_ok());

    match output {
        Output::Json => {
            let kubelets: serde_json::Map<String, serde_json::Value> = choices
                .iter()
                .map(|(name, choice)| {
                    let value = match choice {
                        Ok(api) => json!({ "api": api_name(*api) }),
                        Err(reason) => json!({ "rejected": reason }),
                    };
                    ((*name).to_owned(), value)
                })
                .collect();
            print_json(&json!({
                "socket": socket,
                "type": info.r#type,
                "name": info.name,
                "endpoint": info.endpoint,
                "supportedVersions": info.supported_versions,
                "health": health,
                "getInfoMs": elapsed.as_secs_f64() * 1000.0,
                "kubelets": kubelets,
            }))?;
        }
        Output::Table => {
            let rows = [
                ("registration socket", socket.display().to_string()),
                ("type", info.r#type.clone()),
                ("driver", info.name.clone()),
                ("endpoint", info.endpoint.clone()),
                ("services", info.supported_versions.join(", ")),
                (
                    "health",
                    if health {
                        "advertised"
                    } else {
                        "not advertised"
                    }
                    .to_owned(),
                ),
                (
                    "GetInfo",
                    format!("{:.1} ms", elapsed.as_secs_f64() * 1000.0),
                ),
            ];
            for (key, value) in rows {
                println!("{key:<20} {value}");
            }
            for (name, choice) in &choices {
                let verdict = match choice {
                    Ok(api) => format!("uses {}", api_name(*api)),
                    Err(reason) => format!("rejects it: {reason}"),
                };
                println!("{:<20} {verdict}", format!("kubelet {name}"));
            }
        }
    }
    Ok(if usable { Status::Ok } else { Status::Failed })
}

/// Registers with a simulated 1.36 kubelet and switches to the requested API version.
async fn connect(args: &ClaimArgs) -> anyhow::Result<RegisteredPlugin> {
    let mut plugin = KubeletSimulator::new(KubeletVersion::V1_36)
        .register(&args.socket)
        .await
        .with_context(|| format!("registering with {}", args.socket.display()))?;
    match args.api_version {
        Some(ApiVersion::V1) => plugin.api = DraApi::V1,
        Some(ApiVersion::V1beta1) => plugin.api = DraApi::V1beta1,
        None => {}
    }
    Ok(plugin)
}

fn split_claim(claim: &str) -> anyhow::Result<(&str, &str)> {
    match claim.split_once('/') {
        Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() => {
            Ok((namespace, name))
        }
        _ => bail!("claim {claim:?} is not NAMESPACE/NAME"),
    }
}

/// The claim's identity: the UID from --uid or from the API, allocating it first if asked.
async fn claim_ref(args: &ClaimArgs, allocate: Option<Option<String>>) -> anyhow::Result<ClaimRef> {
    let (namespace, name) = split_claim(&args.claim)?;
    if let (Some(uid), None) = (&args.uid, &allocate) {
        return Ok(ClaimRef {
            uid: uid.clone(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        });
    }
    let client = args.api.client().await?;
    let claim = match allocate {
        Some(node) => {
            let node = match node {
                Some(node) => node,
                None => node_of_driver(&client, &args.socket).await?,
            };
            allocate_claim(&client, namespace, name, &node, None)
                .await
                .with_context(|| format!("allocating {namespace}/{name} on node {node}"))?
        }
        None => Api::<ResourceClaim>::namespaced(client, namespace)
            .get(name)
            .await
            .with_context(|| format!("reading ResourceClaim {namespace}/{name}"))?,
    };
    let uid = claim
        .metadata
        .uid
        .with_context(|| format!("ResourceClaim {namespace}/{name} has no UID"))?;
    if let Some(expected) = &args.uid
        && *expected != uid
    {
        bail!("ResourceClaim {namespace}/{name} has UID {uid}, not {expected}");
    }
    Ok(ClaimRef {
        uid,
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    })
}

/// The one node the plugin's driver publishes node-local slices for.
async fn node_of_driver(client: &kube::Client, socket: &Path) -> anyhow::Result<String> {
    let info = KubeletSimulator::new(KubeletVersion::V1_36)
        .get_info(socket)
        .await
        .with_context(|| format!("GetInfo on {}", socket.display()))?;
    let published = slices::read_published(client, Some(&info.name), None)
        .await
        .context("reading ResourceSlices")?;
    let nodes: std::collections::BTreeSet<&str> = published
        .slices
        .iter()
        .filter_map(|s| s.pointer("/spec/nodeName").and_then(|n| n.as_str()))
        .collect();
    match nodes.into_iter().collect::<Vec<_>>().as_slice() {
        [node] => Ok((*node).to_owned()),
        [] => bail!("{} publishes no node-local slices; give --node", info.name),
        several => bail!(
            "{} publishes slices for {several:?}; give --node",
            info.name
        ),
    }
}

fn claim_json(claim: &ClaimRef) -> serde_json::Value {
    json!({ "namespace": claim.namespace, "name": claim.name, "uid": claim.uid })
}

fn device_json(device: &KubeletDevice) -> serde_json::Value {
    json!({
        "requestNames": device.request_names,
        "pool": device.pool,
        "device": device.device,
        "cdiDeviceIds": device.cdi_device_ids,
        "shareId": device.share_id,
    })
}

/// `dractl prepare`.
pub(crate) async fn prepare(
    args: &ClaimArgs,
    allocate: Option<Option<String>>,
    output: Output,
) -> anyhow::Result<Status> {
    let claim = claim_ref(args, allocate).await?;
    let plugin = connect(args).await?;
    let mut answer = plugin
        .prepare(std::slice::from_ref(&claim))
        .await
        .context("NodePrepareResources")?;
    let outcome = answer
        .remove(&claim.uid)
        .with_context(|| format!("no answer for claim {}", claim.uid))?;
    let api = api_name(plugin.api);
    match (&outcome, output) {
        (Ok(devices), Output::Json) => print_json(&json!({
            "claim": claim_json(&claim),
            "api": api,
            "devices": devices.iter().map(device_json).collect::<Vec<_>>(),
        }))?,
        (Err(error), Output::Json) => print_json(&json!({
            "claim": claim_json(&claim),
            "api": api,
            "error": error,
        }))?,
        (Ok(devices), Output::Table) => {
            println!("claim {claim} prepared through {api}");
            print_devices(devices);
        }
        (Err(error), Output::Table) => println!("claim {claim}: prepare failed: {error}"),
    }
    Ok(if outcome.is_ok() {
        Status::Ok
    } else {
        Status::Failed
    })
}

fn print_devices(devices: &[KubeletDevice]) {
    let rows: Vec<[String; 4]> = devices
        .iter()
        .map(|d| {
            let requests = if d.request_names.is_empty() {
                "(all)".to_owned()
            } else {
                d.request_names.join(",")
            };
            let device = match &d.share_id {
                Some(share) => format!("{} (share {share})", d.device),
                None => d.device.clone(),
            };
            [d.pool.clone(), device, requests, d.cdi_device_ids.join(",")]
        })
        .collect();
    crate::cluster::print_table(&["POOL", "DEVICE", "REQUESTS", "CDI IDS"], &rows);
}

/// `dractl unprepare`.
pub(crate) async fn unprepare(args: &ClaimArgs, output: Output) -> anyhow::Result<Status> {
    let claim = claim_ref(args, None).await?;
    let plugin = connect(args).await?;
    let mut answer = plugin
        .unprepare(std::slice::from_ref(&claim))
        .await
        .context("NodeUnprepareResources")?;
    let outcome = answer
        .remove(&claim.uid)
        .with_context(|| format!("no answer for claim {}", claim.uid))?;
    let api = api_name(plugin.api);
    match (&outcome, output) {
        (Ok(()), Output::Json) => print_json(&json!({ "claim": claim_json(&claim), "api": api }))?,
        (Err(error), Output::Json) => print_json(&json!({
            "claim": claim_json(&claim),
            "api": api,
            "error": error,
        }))?,
        (Ok(()), Output::Table) => println!("claim {claim} unprepared through {api}"),
        (Err(error), Output::Table) => println!("claim {claim}: unprepare failed: {error}"),
    }
    Ok(if outcome.is_ok() {
        Status::Ok
    } else {
        Status::Failed
    })
}

/// `dractl health`.
pub(crate) async fn health(
    socket: &Path,
    count: Option<usize>,
    timeout: Option<f64>,
    output: Output,
) -> anyhow::Result<Status> {
    // A 1.37 kubelet: it opens v1 when the plugin lists it, else v1alpha1.
    let plugin = KubeletSimulator::new(KubeletVersion::V1_37)
        .register(socket)
        .await
        .with_context(|| format!("registering with {}", socket.display()))?;
    if !plugin.health_advertised {
        println!(
            "{} does not advertise a health service (v1.DRAResourceHealth or v1alpha1.DRAResourceHealth)",
            plugin.info.name
        );
        return Ok(Status::Failed);
    }
    let mut watch = plugin
        .watch_health()
        .await
        .context("opening the health stream")?;
    let deadline = match timeout {
        Some(seconds) => Some(
            Instant::now()
                + Duration::try_from_secs_f64(seconds)
                    .with_context(|| format!("--timeout {seconds} is not a duration"))?,
        ),
        None => None,
    };
    let mut received = 0;
    loop {
        if count.is_some_and(|count| received >= count) {
            return Ok(Status::Ok);
        }
        let expired = async {
            match deadline {
                Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
                None => std::future::pending().await,
            }
        };
        let next = tokio::select! {
            next = watch.next() => next,
            _ = tokio::signal::ctrl_c() => return Ok(Status::Ok),
            () = expired => {
                // Without --count a timeout is how the watch ends; with it, too few came.
                if count.is_some() {
                    eprintln!("dractl: {received} of {count:?} device lists within the timeout");
                    return Ok(Status::Failed);
                }
                return Ok(Status::Ok);
            }
        };
        let devices = match next {
            None => {
                eprintln!("dractl: the plugin ended the health stream");
                return Ok(Status::Failed);
            }
            Some(Err(error)) => {
                eprintln!("dractl: health stream: {error}");
                return Ok(Status::Failed);
            }
            Some(Ok(devices)) => devices,
        };
        received += 1;
        match output {
            Output::Json => {
                let devices: Vec<_> = devices
                    .iter()
                    .map(|d| {
                        json!({
                            "pool": d.pool,
                            "device": d.device,
                            "health": format!("{:?}", d.status),
                            "message": d.message,
                            "timeoutSeconds": d.timeout_seconds,
                        })
                    })
                    .collect();
                println!("{}", json!({ "update": received, "devices": devices }));
            }
            Output::Table => {
                println!("update {received}: {} devices", devices.len());
                let rows: Vec<[String; 5]> = devices
                    .iter()
                    .map(|d| {
                        let timeout = if d.timeout_seconds > 0 {
                            format!("{}s", d.timeout_seconds)
                        } else {
                            "default".to_owned()
                        };
                        [
                            d.pool.clone(),
                            d.device.clone(),
                            format!("{:?}", d.status),
                            timeout,
                            d.message.clone(),
                        ]
                    })
                    .collect();
                crate::cluster::print_table(
                    &["POOL", "DEVICE", "HEALTH", "TIMEOUT", "MESSAGE"],
                    &rows,
                );
            }
        }
    }
}
