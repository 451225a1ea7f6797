//! Commands that look at the cluster side: slices, and the conformance suite.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use dra_sdk::advanced::slices::SliceLimits;
use dra_sdk_testing::conformance::{Case, Conformance, slices};
use serde_json::{Value, json};

use super::{Output, Status, print_json};

/// Prints rows under a header, columns padded to their widest cell.
pub(crate) fn print_table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(str::len);
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

fn text<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// An attribute value as `name=value`.
fn attribute(name: &str, value: &Value) -> String {
    let shown = [
        "int", "bool", "string", "version", "ints", "bools", "strings", "versions",
    ]
    .iter()
    .find_map(|kind| value.get(*kind))
    .map(|v| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    })
    .unwrap_or_else(|| value.to_string());
    format!("{name}={shown}")
}

/// The node selection of a slice, for the pool line.
fn node_selection(slice: &Value) -> String {
    let spec = &slice["spec"];
    if let Some(node) = spec.get("nodeName").and_then(Value::as_str) {
        format!("node {node}")
    } else if spec.get("allNodes") == Some(&Value::Bool(true)) {
        "all nodes".to_owned()
    } else if spec.get("perDeviceNodeSelection") == Some(&Value::Bool(true)) {
        "per-device node selection".to_owned()
    } else if spec.get("nodeSelector").is_some() {
        "node selector".to_owned()
    } else {
        "no node selection".to_owned()
    }
}

/// `dractl slices`.
pub(crate) async fn slices(
    client: &kube::Client,
    driver: Option<&str>,
    node: Option<&str>,
    output: Output,
) -> anyhow::Result<Status> {
    let published = slices::read_published(client, driver, node)
        .await
        .context("reading ResourceSlices")?;
    let limits = SliceLimits::for_optional_release(published.release);
    let mut by_driver: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for slice in published.slices {
        by_driver
            .entry(text(&slice, "/spec/driver").to_owned())
            .or_default()
            .push(slice);
    }
    let problems: BTreeMap<&str, Vec<String>> = by_driver
        .iter()
        .map(|(driver, slices)| (driver.as_str(), slices::check(slices, driver, &limits)))
        .collect();
    let failed = problems.values().any(|p| !p.is_empty());
    let release = published
        .release
        .map_or_else(|| "unknown".to_owned(), |r| r.to_string());

    match output {
        Output::Json => {
            let drivers: Vec<Value> = by_driver
                .iter()
                .map(|(driver, slices)| {
                    json!({
                        "driver": driver,
                        "slices": slices,
                        "problems": problems.get(driver.as_str()),
                    })
                })
                .collect();
            print_json(&json!({
                "apiVersion": published.api_version.to_string(),
                "release": release,
                "drivers": drivers,
            }))?;
        }
        Output::Table => {
            if by_driver.is_empty() {
                println!("no ResourceSlices");
            }
            for (driver, slices) in &by_driver {
                print_driver(driver, slices, &problems[driver.as_str()]);
            }
            println!(
                "read in {}, checked against the limits of Kubernetes {release}",
                published.api_version
            );
        }
    }
    Ok(if failed { Status::Failed } else { Status::Ok })
}

fn print_driver(driver: &str, slices: &[Value], problems: &[String]) {
    let mut pools: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
    for slice in slices {
        pools
            .entry(text(slice, "/spec/pool/name"))
            .or_default()
            .push(slice);
    }
    let devices: usize = slices
        .iter()
        .map(|s| s["spec"]["devices"].as_array().map_or(0, Vec::len))
        .sum();
    println!(
        "driver {driver}: {} pools, {} slices, {devices} devices",
        pools.len(),
        slices.len()
    );
    for (pool, slices) in pools {
        let generation = slices
            .iter()
            .filter_map(|s| s.pointer("/spec/pool/generation").and_then(Value::as_i64))
            .max()
            .unwrap_or(0);
        let count = slices
            .first()
            .and_then(|s| s.pointer("/spec/pool/resourceSliceCount"))
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let selection = slices
            .first()
            .map(|s| node_selection(s))
            .unwrap_or_default();
        println!(
            "  pool {pool} ({selection}): generation {generation}, {} of {count} slices",
            slices.len()
        );
        for slice in slices {
            let devices = slice["spec"]["devices"]
                .as_array()
                .map_or(&[][..], Vec::as_slice);
            let counters = slice["spec"]["sharedCounters"]
                .as_array()
                .map_or(0, Vec::len);
            let mut summary = format!("{} devices", devices.len());
            if counters > 0 {
                summary.push_str(&format!(", {counters} counter sets"));
            }
            println!("    slice {} ({summary})", text(slice, "/metadata/name"));
            for device in devices {
                let mut details: Vec<String> = device["attributes"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(name, value)| attribute(name, value))
                    .collect();
                details.extend(
                    device["capacity"]
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(name, c)| format!("{name}={}", text(c, "/value"))),
                );
                for taint in device["taints"].as_array().into_iter().flatten() {
                    details.push(format!(
                        "taint {}={}:{}",
                        text(taint, "/key"),
                        text(taint, "/value"),
                        text(taint, "/effect")
                    ));
                }
                println!("      {}  {}", text(device, "/name"), details.join(" "));
            }
        }
    }
    if problems.is_empty() {
        println!("  valid");
    } else {
        println!("  {} problems:", problems.len());
        for problem in problems {
            println!("    - {problem}");
        }
    }
}

/// `dractl conformance --list`.
pub(crate) fn list_cases(output: Output) -> Status {
    match output {
        Output::Json => {
            let cases: Vec<Value> = Case::ALL
                .iter()
                .map(|c| json!({ "name": c.name(), "description": c.description() }))
                .collect();
            println!("{}", Value::Array(cases));
        }
        Output::Table => {
            let rows: Vec<[String; 2]> = Case::ALL
                .iter()
                .map(|c| [c.name().to_owned(), c.description().to_owned()])
                .collect();
            print_table(&["CASE", "PROVES"], &rows);
        }
    }
    Status::Ok
}

/// What `dractl conformance` runs against.
pub(crate) struct SuiteSettings {
    pub(crate) socket: PathBuf,
    pub(crate) client: Option<kube::Client>,
    pub(crate) node: Option<String>,
    pub(crate) cdi_root: Option<PathBuf>,
    pub(crate) namespace: String,
    pub(crate) cases: Vec<String>,
    pub(crate) skipped: Vec<String>,
}

/// `dractl conformance`.
pub(crate) async fn conformance(settings: SuiteSettings, output: Output) -> anyhow::Result<Status> {
    let mut suite = Conformance::remote(&settings.socket).namespace(settings.namespace);
    if let Some(client) = settings.client {
        suite = suite.client(client);
    }
    if let Some(node) = settings.node {
        suite = suite.node_name(node);
    }
    if let Some(root) = settings.cdi_root {
        suite = suite.cdi_root(root);
    }
    if !settings.cases.is_empty() {
        suite = suite.only(&settings.cases)?;
    }
    suite = suite.skip(&settings.skipped)?;
    let report = suite.run().await?;
    match output {
        Output::Json => print_json(&report)?,
        Output::Table => println!("{report}"),
    }
    Ok(if report.passed() {
        Status::Ok
    } else {
        Status::Failed
    })
}
