//! `dractl explain`: why a claim is pending and what it would get, device by device, from the
//! SDK's allocator; and what holds a node's devices. Read-only.

use std::collections::BTreeSet;
use std::path::PathBuf;

use anyhow::{Context, bail};
use dra_sdk_allocator::{
    AllocationError, Allocator, ConstraintExplanation, DeviceExplanation, Explanation, NodeDevices,
    RequestExplanation, Verdict,
};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::{Value, json};

use super::cluster::print_table;
use super::objects::{self, Kind, Object};
use super::{ApiArgs, Output, Status, print_json};

/// What `dractl explain` was asked.
pub(crate) struct ExplainArgs {
    pub(crate) claim: Option<String>,
    pub(crate) file: Option<PathBuf>,
    pub(crate) node: Option<String>,
    pub(crate) slices: Vec<PathBuf>,
    pub(crate) classes: Vec<PathBuf>,
    pub(crate) claims: Vec<PathBuf>,
    pub(crate) nodes: Vec<PathBuf>,
    pub(crate) api: ApiArgs,
}

impl ExplainArgs {
    fn offline(&self) -> bool {
        !(self.slices.is_empty()
            && self.classes.is_empty()
            && self.claims.is_empty()
            && self.nodes.is_empty())
    }
}

/// The cluster as the allocator sees it, and where it was read.
struct World {
    /// `resource.k8s.io/v1` (the version read through) or `files`.
    source: String,
    slices: Vec<ResourceSlice>,
    classes: Vec<DeviceClass>,
    claims: Vec<Object>,
    nodes: Vec<Node>,
    /// Whether Nodes could be read (listing them may be forbidden).
    nodes_read: bool,
}

fn typed_all<T: serde::de::DeserializeOwned>(objects: &[Object]) -> anyhow::Result<Vec<T>> {
    objects
        .iter()
        .map(|object| object.typed().map_err(anyhow::Error::from))
        .collect()
}

async fn read_world(args: &ExplainArgs) -> anyhow::Result<World> {
    if args.offline() {
        let slices = objects::read_paths(&args.slices, &[Kind::ResourceSlice])?;
        let classes = objects::read_paths(&args.classes, &[Kind::DeviceClass])?;
        let claims = objects::read_paths(&args.claims, &[Kind::ResourceClaim])?;
        let nodes = objects::read_paths(&args.nodes, &[Kind::Node])?;
        return Ok(World {
            source: "files".to_owned(),
            slices: typed_all(&slices)?,
            classes: typed_all(&classes)?,
            claims,
            nodes_read: !args.nodes.is_empty(),
            nodes: typed_all(&nodes)?,
        });
    }
    let client = args.api.client().await?;
    let version = objects::served_version(&client).await?;
    let (slices, classes, claims, nodes) = futures::try_join!(
        objects::list(&client, version, Kind::ResourceSlice),
        objects::list(&client, version, Kind::DeviceClass),
        objects::list(&client, version, Kind::ResourceClaim),
        objects::list_nodes(&client),
    )?;
    Ok(World {
        source: version.to_string(),
        slices: typed_all(&slices)?,
        classes: typed_all(&classes)?,
        claims,
        nodes_read: nodes.is_some(),
        nodes: nodes.unwrap_or_default(),
    })
}

/// The claim to explain: from `-f` (a ResourceClaim or a ResourceClaimTemplate, picked by
/// name when the file has several), or by `namespace/name` from the cluster's claims.
fn find_claim(args: &ExplainArgs, world: &World) -> anyhow::Result<(Object, String)> {
    if let Some(file) = &args.file {
        let found: Vec<Object> = objects::read_file(file)?
            .into_iter()
            .filter(|o| matches!(o.kind(), "ResourceClaim" | "ResourceClaimTemplate"))
            .map(with_default_namespace)
            .collect();
        let chosen: Vec<&Object> = match &args.claim {
            Some(wanted) => found
                .iter()
                .filter(|o| o.display_name() == *wanted || o.name() == wanted)
                .collect(),
            None => found.iter().collect(),
        };
        let object = match chosen.as_slice() {
            [one] => (*one).clone(),
            [] if found.is_empty() => bail!(
                "{} holds no ResourceClaim or ResourceClaimTemplate",
                file.display()
            ),
            [] => bail!(
                "{} holds no claim or template named {:?} (it holds {})",
                file.display(),
                args.claim.as_deref().unwrap_or(""),
                names(&found)
            ),
            _ => bail!(
                "{} holds several claims and templates ({}): name one as the argument",
                file.display(),
                names(&found)
            ),
        };
        let source = if object.kind() == "ResourceClaimTemplate" {
            format!("template in {}", file.display())
        } else {
            file.display().to_string()
        };
        return Ok((claim_of(object), source));
    }
    let Some(wanted) = &args.claim else {
        bail!("name a claim as NAMESPACE/NAME, or give one with -f FILE");
    };
    match wanted.split_once('/') {
        Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() => {}
        _ => bail!("claim {wanted:?} is not NAMESPACE/NAME"),
    }
    let object = world
        .claims
        .iter()
        .find(|o| o.display_name() == *wanted)
        .cloned()
        .with_context(|| match args.offline() {
            true => format!("ResourceClaim {wanted} is not in the --claims files"),
            false => format!("ResourceClaim {wanted} not found"),
        })?;
    let source = object.source.clone();
    Ok((object, source))
}

fn names(objects: &[Object]) -> String {
    objects
        .iter()
        .map(|o| format!("{} {}", o.kind(), o.display_name()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Claims and templates of a file without a namespace go to `default`, as with kubectl.
fn with_default_namespace(mut object: Object) -> Object {
    if object.namespace().is_none()
        && let Some(Value::Object(metadata)) = object.value.get_mut("metadata")
    {
        metadata.insert("namespace".into(), json!("default"));
    }
    object
}

/// A template's claim, as the resourceclaim controller would make it (named after it).
fn claim_of(object: Object) -> Object {
    if object.kind() != "ResourceClaimTemplate" {
        return object;
    }
    let value = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": { "name": object.name(), "namespace": object.namespace() },
        "spec": object.value.pointer("/spec/spec").cloned().unwrap_or_else(|| json!({})),
    });
    Object {
        source: object.source,
        value,
    }
}

/// The nodes to try: the one asked for; else the cluster's Nodes and every node that slices
/// name, in name order.
fn nodes_to_try(args: &ExplainArgs, world: &World) -> anyhow::Result<Vec<String>> {
    if let Some(node) = &args.node {
        return Ok(vec![node.clone()]);
    }
    let mut nodes: BTreeSet<String> = world
        .nodes
        .iter()
        .filter_map(|node| node.metadata.name.clone())
        .collect();
    for slice in &world.slices {
        nodes.extend(slice.spec.node_name.clone());
        let value = serde_json::to_value(&slice.spec.devices).unwrap_or(Value::Null);
        for device in value.as_array().into_iter().flatten() {
            if let Some(node) = device.get("nodeName").and_then(Value::as_str) {
                nodes.insert(node.to_owned());
            }
        }
    }
    if nodes.is_empty() {
        bail!("no node to try: no Nodes and no slices for a node; name one with --node NODE");
    }
    Ok(nodes.into_iter().collect())
}

/// `dractl explain`.
pub(crate) async fn explain(args: ExplainArgs, output: Output) -> anyhow::Result<Status> {
    if args.claim.is_none() && args.file.is_none() && args.node.is_none() {
        bail!("name a claim as NAMESPACE/NAME, give one with -f FILE, or a node with --node NODE");
    }
    let world = read_world(&args).await?;
    let held: Vec<ResourceClaim> = typed_all(&world.claims)?;
    let allocator = Allocator::new(&world.slices, &world.classes, &held).with_nodes(&world.nodes);

    if args.claim.is_none() && args.file.is_none() {
        let node = args.node.as_deref().unwrap_or("");
        let devices = allocator.node_devices(node);
        match output {
            Output::Json => print_json(&json!({ "source": world.source, "node": devices }))?,
            Output::Table => print_node(&devices, &world),
        }
        return Ok(Status::Ok);
    }

    let (object, source) = find_claim(&args, &world)?;
    let claim: ResourceClaim = object.typed()?;
    let current = object
        .value
        .pointer("/status/allocation")
        .filter(|allocation| !allocation.is_null())
        .cloned();
    let mut explained = Vec::new();
    for node in nodes_to_try(&args, &world)? {
        let explanation = allocator
            .explain(&claim, &node)
            .with_context(|| format!("claim {}", object.display_name()))?;
        explained.push(explanation);
    }
    let report = Report::new(&explained);
    let ok = report.chosen.is_some() || current.is_some();
    match output {
        Output::Json => print_json(&report.json(&world, &source, current.as_ref()))?,
        Output::Table => report.print(&world, &source, current.as_ref()),
    }
    Ok(if ok { Status::Ok } else { Status::Failed })
}

/// A device's verdict and the node it was judged on (`None`: available on no node tried).
type Judged<'a> = (&'a DeviceExplanation, Option<&'a str>);

/// The explanations of one claim on every node tried, folded into one device list.
struct Report<'a> {
    claim: &'a str,
    explained: &'a [Explanation],
    /// The node whose allocation is predicted: the first where the claim fits.
    chosen: Option<&'a Explanation>,
    /// Per request, every device with its verdict and the node it was judged on.
    requests: Vec<(&'a RequestExplanation, Vec<Judged<'a>>)>,
}

impl<'a> Report<'a> {
    fn new(explained: &'a [Explanation]) -> Self {
        let chosen = explained.iter().find(|e| e.allocatable());
        let claim = explained.first().map_or("", |e| e.claim.as_str());
        // With an allocation: its node's view. Without: each device as judged on the first
        // node it is available on (devices on no node tried: as seen from the first).
        let base = chosen.or(explained.first());
        let mut requests = Vec::new();
        if let Some(base) = base {
            for (r, request) in base.requests.iter().enumerate() {
                let devices = request
                    .devices
                    .iter()
                    .enumerate()
                    .map(|(d, device)| {
                        if chosen.is_some() {
                            return (device, on_node(device, &base.node));
                        }
                        explained
                            .iter()
                            .filter_map(|e| {
                                e.requests
                                    .get(r)
                                    .and_then(|req| req.devices.get(d))
                                    .map(|dev| (dev, e.node.as_str()))
                            })
                            .find(|(dev, _)| {
                                !matches!(dev.verdict, Verdict::NodeNotEligible { .. })
                            })
                            .map_or((device, None), |(dev, node)| (dev, Some(node)))
                    })
                    .collect();
                requests.push((request, devices));
            }
        }
        Self {
            claim,
            explained,
            chosen,
            requests,
        }
    }

    fn json(&self, world: &World, source: &str, current: Option<&Value>) -> Value {
        let nodes: Vec<Value> = self
            .explained
            .iter()
            .map(|e| match &e.outcome {
                Ok(allocation) => json!({ "node": e.node, "allocatable": true,
                    "allocation": allocation, "constraints": e.constraints }),
                Err(error) => json!({ "node": e.node, "allocatable": false,
                    "reason": error.to_string(), "constraints": e.constraints }),
            })
            .collect();
        let requests: Vec<Value> = self
            .requests
            .iter()
            .map(|(request, devices)| {
                let mut value = serde_json::to_value(request).unwrap_or(Value::Null);
                let devices: Vec<Value> = devices
                    .iter()
                    .map(|(device, node)| {
                        let mut entry = serde_json::to_value(device).unwrap_or(Value::Null);
                        if let (Some(fields), Some(node)) = (entry.as_object_mut(), node) {
                            fields.insert("node".into(), json!(node));
                        }
                        entry
                    })
                    .collect();
                if let Some(fields) = value.as_object_mut() {
                    fields.insert("devices".into(), Value::Array(devices));
                }
                value
            })
            .collect();
        json!({
            "claim": self.claim,
            "source": source,
            "readFrom": world.source,
            "allocatable": self.chosen.is_some(),
            "node": self.chosen.map(|e| e.node.as_str()),
            "allocation": self.chosen.and_then(|e| e.outcome.as_ref().ok()),
            "reason": self.reason(),
            "currentAllocation": current,
            "nodes": nodes,
            "requests": requests,
            "constraints": self.constraints(),
        })
    }

    /// The constraints as judged on the predicted node, or on the only node tried.
    fn constraints(&self) -> Option<&'a [ConstraintExplanation]> {
        match (self.chosen, self.explained) {
            (Some(chosen), _) => Some(&chosen.constraints),
            (None, [one]) => Some(&one.constraints),
            (None, _) => None,
        }
    }

    /// The shortest reason no allocation is possible: the allocator's error on the one node
    /// tried, or per node.
    fn reason(&self) -> Option<String> {
        if self.chosen.is_some() {
            return None;
        }
        match self.explained {
            [one] => one.outcome.as_ref().err().map(short_reason),
            all => Some(format!(
                "no node of {} fits: {}",
                all.len(),
                all.iter()
                    .filter_map(|e| {
                        let error = e.outcome.as_ref().err()?;
                        Some(format!("{}: {}", e.node, short_reason(error)))
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            )),
        }
    }

    fn print(&self, world: &World, source: &str, current: Option<&Value>) {
        println!(
            "claim {} (from {source}), against {} ResourceSlices, {} DeviceClasses, {} allocated claims (read {})",
            self.claim,
            world.slices.len(),
            world.classes.len(),
            world
                .claims
                .iter()
                .filter(|o| o
                    .value
                    .pointer("/status/allocation")
                    .is_some_and(|a| !a.is_null()))
                .count(),
            match world.source.as_str() {
                "files" => "from files".to_owned(),
                version => format!("through {version}"),
            }
        );
        if !world.nodes_read {
            println!("(no Node objects read: node selectors only match node names)");
        }
        if let Some(current) = current {
            println!(
                "the claim is allocated: {}; below, what it would get if it were allocated anew",
                results_text(current)
            );
        }
        for (request, devices) in &self.requests {
            println!();
            let what = match (request.allocation_mode.as_str(), request.count) {
                ("All", _) => "all matching devices".to_owned(),
                (_, Some(1) | None) => "1 device".to_owned(),
                (_, Some(n)) => format!("{n} devices"),
            };
            let admin = if request.admin_access {
                ", admin access"
            } else {
                ""
            };
            println!(
                "request {}: {what} of class {}{admin}",
                request.request, request.device_class
            );
            if let Some(error) = &request.error {
                println!("  {error}");
                continue;
            }
            if devices.is_empty() {
                println!("  no devices in the cluster");
                continue;
            }
            // Without an allocation, devices are shown as judged on their own node.
            if self.chosen.is_none() && self.explained.len() > 1 {
                let rows: Vec<[String; 5]> = devices
                    .iter()
                    .map(|(device, node)| {
                        [
                            format!("  {}", device.driver),
                            device.pool.clone(),
                            device.device.clone(),
                            node.unwrap_or("-").to_owned(),
                            device.verdict.to_string(),
                        ]
                    })
                    .collect();
                print_table(&["  DRIVER", "POOL", "DEVICE", "NODE", "VERDICT"], &rows);
            } else {
                let rows: Vec<[String; 4]> = devices
                    .iter()
                    .map(|(device, _)| {
                        [
                            format!("  {}", device.driver),
                            device.pool.clone(),
                            device.device.clone(),
                            device.verdict.to_string(),
                        ]
                    })
                    .collect();
                print_table(&["  DRIVER", "POOL", "DEVICE", "VERDICT"], &rows);
            }
        }
        println!();
        if self.explained.len() > 1 {
            for e in self.explained {
                match &e.outcome {
                    Ok(allocation) => println!(
                        "node {}: allocatable: {}",
                        e.node,
                        results_text(&serde_json::to_value(allocation).unwrap_or(Value::Null))
                    ),
                    Err(error) => {
                        println!("node {}: not allocatable: {}", e.node, short_reason(error));
                        // Under each node: how the devices available there spread over the
                        // values of each constraint's attribute.
                        if self.chosen.is_none() {
                            for constraint in &e.constraints {
                                println!("  {constraint}");
                            }
                        }
                    }
                }
            }
        } else if self.chosen.is_none() {
            for e in self.explained {
                for constraint in &e.constraints {
                    println!("{constraint}");
                }
            }
        }
        match self.chosen {
            Some(e) => {
                let allocation = e
                    .outcome
                    .as_ref()
                    .ok()
                    .and_then(|a| serde_json::to_value(a).ok())
                    .unwrap_or(Value::Null);
                println!(
                    "allocatable on node {}: {}",
                    e.node,
                    results_text(&allocation)
                );
            }
            None => match self.explained {
                [one] => println!(
                    "not allocatable on node {}: {}",
                    one.node,
                    self.reason().unwrap_or_default()
                ),
                all => println!("not allocatable on any of the {} nodes", all.len()),
            },
        }
    }
}

/// The allocator's reason without the claim and node it names (the report does): for an
/// unsatisfiable claim, what stands in the way per request.
fn short_reason(error: &AllocationError) -> String {
    match error {
        AllocationError::Unsatisfiable {
            problems,
            skipped_pools,
            ..
        } => {
            let mut text = problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ");
            if !skipped_pools.is_empty() {
                text.push_str(&format!(" (skipped pools: {})", skipped_pools.join(", ")));
            }
            text
        }
        other => other.to_string(),
    }
}

/// The node a device was judged on, unless it is not available there.
fn on_node<'a>(device: &DeviceExplanation, node: &'a str) -> Option<&'a str> {
    (!matches!(device.verdict, Verdict::NodeNotEligible { .. })).then_some(node)
}

/// `request → driver/pool/device` for each result of an allocation.
fn results_text(allocation: &Value) -> String {
    let results: Vec<String> = allocation
        .pointer("/devices/results")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|result| {
            let field = |name: &str| result.get(name).and_then(Value::as_str).unwrap_or("");
            let mut text = format!(
                "{} → {}/{}/{}",
                field("request"),
                field("driver"),
                field("pool"),
                field("device")
            );
            if let Some(share) = result.get("shareID").and_then(Value::as_str) {
                text.push_str(&format!(" (share {share})"));
            }
            text
        })
        .collect();
    if results.is_empty() {
        "no devices".to_owned()
    } else {
        results.join(", ")
    }
}

fn print_node(devices: &NodeDevices, world: &World) {
    println!(
        "node {}: {} devices (read {})",
        devices.node,
        devices.devices.len(),
        match world.source.as_str() {
            "files" => "from files".to_owned(),
            version => format!("through {version}"),
        }
    );
    if devices.devices.is_empty() {
        return;
    }
    let rows: Vec<[String; 6]> = devices
        .devices
        .iter()
        .map(|device| {
            let held = if device.holders.is_empty() {
                "-".to_owned()
            } else {
                device
                    .holders
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let capacity = device
                .capacity
                .iter()
                .map(|c| {
                    if device.allow_multiple_allocations {
                        format!("{} {} of {} used", c.name, c.used, c.total)
                    } else {
                        format!("{}={}", c.name, c.total)
                    }
                })
                .collect::<Vec<_>>()
                .join(", ");
            let counters = device
                .consumes_counters
                .iter()
                .map(|(set, counters)| {
                    let counters: Vec<String> = counters
                        .iter()
                        .map(|(name, amount)| format!("{name}={amount}"))
                        .collect();
                    format!("{set}: {}", counters.join(" "))
                })
                .collect::<Vec<_>>()
                .join(", ");
            let mut notes = device
                .taints
                .iter()
                .map(|t| format!("taint {t}"))
                .collect::<Vec<_>>();
            if device.allow_multiple_allocations {
                notes.insert(0, "shared".to_owned());
            }
            if let Some(problem) = &device.pool_problem {
                notes.push(format!("pool {problem}"));
            }
            [
                format!("{}/{}", device.driver, device.pool),
                device.device.clone(),
                capacity,
                counters,
                notes.join(", "),
                held,
            ]
        })
        .collect();
    print_table(
        &["POOL", "DEVICE", "CAPACITY", "CONSUMES", "NOTES", "HELD BY"],
        &rows,
    );
    if devices.counter_sets.is_empty() {
        return;
    }
    println!();
    let rows: Vec<[String; 4]> = devices
        .counter_sets
        .iter()
        .map(|set| {
            let counters = set
                .counters
                .iter()
                .map(|c| format!("{} {} of {} left", c.counter, c.left, c.total))
                .collect::<Vec<_>>()
                .join(", ");
            let holders = if set.holders.is_empty() {
                "-".to_owned()
            } else {
                set.holders
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            [
                format!("{}/{}", set.driver, set.pool),
                set.counter_set.clone(),
                counters,
                holders,
            ]
        })
        .collect();
    print_table(&["POOL", "COUNTER SET", "LEFT", "HELD BY"], &rows);
}
