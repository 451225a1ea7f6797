//! What the allocator does with the Kubernetes 1.37 device model: compatibility groups on a
//! device's counter consumption (which devices drawing from one counter set may be allocated at
//! the same time, in one claim and across claims) and a request's derived attributes (values
//! computed by CEL per device that constraints compare).

use dra_sdk_allocator::{AllocationError, Allocator, UnsatisfiableReason, Verdict};
use k8s_openapi::api::resource::v1::{AllocationResult, DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::{Value, json};

const DRIVER: &str = "gpu.example.com";
const NIC: &str = "nic.example.com";
const NODE: &str = "node-a";

fn from_json<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).unwrap()
}

fn class(name: &str, driver: &str) -> DeviceClass {
    from_json(json!({
        "metadata": { "name": name },
        "spec": { "selectors": [{ "cel": { "expression": format!("device.driver == '{driver}'") } }] },
    }))
}

fn claim(name: &str, devices: Value) -> ResourceClaim {
    from_json(json!({
        "metadata": { "name": name, "namespace": "default", "uid": format!("uid-{name}") },
        "spec": { "devices": devices },
    }))
}

/// One request per device name, each selecting that device.
fn claim_for(name: &str, wanted: &[&str]) -> ResourceClaim {
    let requests: Vec<Value> = wanted
        .iter()
        .enumerate()
        .map(|(i, device)| {
            json!({ "name": format!("r{i}"), "exactly": {
                "deviceClassName": DRIVER,
                "selectors": [{ "cel": { "expression": format!("device.attributes['{DRIVER}'].id == '{device}'") } }],
            } })
        })
        .collect();
    claim(name, json!({ "requests": requests }))
}

fn holding(mut claim: ResourceClaim, devices: &[&str]) -> ResourceClaim {
    let results: Vec<Value> = devices
        .iter()
        .map(|device| json!({ "request": "r0", "driver": DRIVER, "pool": NODE, "device": device }))
        .collect();
    claim.status = Some(from_json(
        json!({ "allocation": { "devices": { "results": results } } }),
    ));
    claim
}

fn devices(allocation: &AllocationResult) -> Vec<String> {
    allocation
        .devices
        .as_ref()
        .and_then(|d| d.results.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|r| r.device)
        .collect()
}

/// Partitions of one GPU drawing from the counter set `gpu-0` (plenty of memory for all of
/// them, so only compatibility groups decide), with these groups; `other` draws from `gpu-1`
/// without groups.
fn grouped_partitions() -> Vec<ResourceSlice> {
    let partition = |name: &str, set: &str, groups: &[&str]| {
        let mut consumption =
            json!({ "counterSet": set, "counters": { "memory": { "value": "1Gi" } } });
        if !groups.is_empty() {
            consumption["compatibilityGroups"] = json!(groups);
        }
        json!({
            "name": name,
            "attributes": { "id": { "string": name } },
            "consumesCounters": [consumption],
        })
    };
    let pool = json!({ "name": NODE, "generation": 1, "resourceSliceCount": 2 });
    let counters = json!({ "memory": { "value": "100Gi" } });
    vec![
        from_json(json!({ "metadata": { "name": "counters" }, "spec": {
            "driver": DRIVER, "nodeName": NODE, "pool": pool,
            "sharedCounters": [{ "name": "gpu-0", "counters": counters }, { "name": "gpu-1", "counters": counters }],
        } })),
        from_json(json!({ "metadata": { "name": "partitions" }, "spec": {
            "driver": DRIVER, "nodeName": NODE, "pool": pool,
            "devices": [
                partition("x", "gpu-0", &["x"]),
                partition("xy", "gpu-0", &["x", "y"]),
                partition("y", "gpu-0", &["y"]),
                partition("plain-0", "gpu-0", &[]),
                partition("plain-1", "gpu-0", &[]),
                partition("other", "gpu-1", &[]),
            ],
        } })),
    ]
}

fn allocator(held: &[ResourceClaim]) -> Allocator {
    Allocator::new(&grouped_partitions(), &[class(DRIVER, DRIVER)], held)
}

#[test]
fn compatibility_groups_allow_devices_sharing_a_group() {
    for pair in [
        ["x", "xy"],
        ["xy", "y"],
        ["plain-0", "plain-1"],
        ["x", "other"],
    ] {
        let allocation = allocator(&[])
            .allocate(&claim_for("pair", &pair), NODE)
            .unwrap_or_else(|error| panic!("{pair:?}: {error}"));
        assert_eq!(devices(&allocation), pair);
    }
}

#[test]
fn compatibility_groups_refuse_devices_without_a_common_group() {
    // x and y share nothing; a grouped device never goes with one without groups; and the
    // intersection narrows: after x and xy only x is common, so y is refused.
    for wanted in [
        &["x", "y"][..],
        &["x", "plain-0"],
        &["plain-0", "y"],
        &["x", "xy", "y"],
    ] {
        let error = allocator(&[])
            .allocate(&claim_for("c", wanted), NODE)
            .unwrap_err();
        match error {
            AllocationError::Unsatisfiable { problems, .. } => assert_eq!(
                problems[0].reason,
                UnsatisfiableReason::Combination,
                "{wanted:?}"
            ),
            other => panic!("{wanted:?}: expected Unsatisfiable, got {other}"),
        }
    }
}

#[test]
fn compatibility_groups_apply_across_claims() {
    // Another claim holds x: y is refused, xy is fine; the groups of held devices are read from
    // the slices.
    let held = [holding(claim_for("holder", &["x"]), &["x"])];
    let error = allocator(&held)
        .allocate(&claim_for("c", &["y"]), NODE)
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "cannot allocate all claims: claim default/c on node node-a: request r0: \
         0 of 1 matching devices available, 1 needed (1 with incompatible compatibility groups)"
    );
    let allocation = allocator(&held)
        .allocate(&claim_for("c", &["xy"]), NODE)
        .unwrap();
    assert_eq!(devices(&allocation), ["xy"]);
    assert!(
        allocator(&held)
            .allocate(&claim_for("c", &["plain-0"]), NODE)
            .is_err(),
        "no groups next to a held grouped device"
    );

    // A held device without groups keeps grouped ones off its counter set, not others.
    let held = [holding(claim_for("holder", &["plain-0"]), &["plain-0"])];
    assert!(
        allocator(&held)
            .allocate(&claim_for("c", &["x"]), NODE)
            .is_err()
    );
    let allocation = allocator(&held)
        .allocate(&claim_for("c", &["plain-1", "other"]), NODE)
        .unwrap();
    assert_eq!(devices(&allocation), ["plain-1", "other"]);

    // A claim taking any grouped device picks one that fits next to the held one.
    let any = claim(
        "any",
        json!({ "requests": [{ "name": "gpu", "exactly": {
            "deviceClassName": DRIVER,
            "selectors": [{ "cel": { "expression": "device.attributes['gpu.example.com'].id in ['y', 'xy']" } }],
        } }] }),
    );
    let held = [holding(claim_for("holder", &["x"]), &["x"])];
    let allocation = allocator(&held).allocate(&any, NODE).unwrap();
    assert_eq!(devices(&allocation), ["xy"], "y is skipped, xy shares x");
}

#[test]
fn explain_names_a_compatibility_group_conflict() {
    let held = [holding(claim_for("holder", &["x"]), &["x"])];
    let explanation = allocator(&held)
        .explain(&claim_for("c", &["y"]), NODE)
        .unwrap();
    assert!(!explanation.allocatable());
    let verdict = explanation.requests[0].verdict("y").unwrap();
    assert_eq!(verdict.name(), "compatibilityGroupConflict");
    assert!(
        matches!(verdict, Verdict::CompatibilityGroupConflict { counter_set, .. } if counter_set == "gpu-0"),
        "{verdict:?}"
    );
    assert_eq!(
        verdict.to_string(),
        "counter set gpu-0: compatibility groups y do not go with the allocated devices \
         sharing x (held by default/holder on x (memory=1Gi))"
    );
    let held = [holding(claim_for("holder", &["plain-0"]), &["plain-0"])];
    let explanation = allocator(&held)
        .explain(&claim_for("c", &["x"]), NODE)
        .unwrap();
    assert_eq!(
        explanation.requests[0].verdict("x").unwrap().to_string(),
        "counter set gpu-0: compatibility groups x do not go with the allocated devices \
         without groups (held by default/holder on plain-0 (memory=1Gi))"
    );
}

/// GPUs publishing their NUMA node as an int, NICs as a string `numa<N>`.
fn gpus_and_nics() -> Allocator {
    let slice = |driver: &str, devices: Value| -> ResourceSlice {
        from_json(json!({ "metadata": { "name": driver }, "spec": {
            "driver": driver, "nodeName": NODE,
            "pool": { "name": NODE, "generation": 1, "resourceSliceCount": 1 },
            "devices": devices,
        } }))
    };
    let slices = [
        slice(
            DRIVER,
            json!([
                { "name": "gpu-0", "attributes": { "numa": { "int": 0 } } },
                { "name": "gpu-1", "attributes": { "numa": { "int": 1 } } },
            ]),
        ),
        slice(
            NIC,
            json!([
                { "name": "nic-0", "attributes": { "socket": { "string": "numa1" } } },
                { "name": "nic-1", "attributes": { "socket": { "string": "numa0" } } },
            ]),
        ),
    ];
    Allocator::new(&slices, &[class("gpu", DRIVER), class("nic", NIC)], &[])
}

fn gpu_and_nic(attribute: &str, gpu_derived: Value, nic_expression: &str) -> ResourceClaim {
    claim(
        "pair",
        json!({
            "requests": [
                { "name": "gpu", "exactly": { "deviceClassName": "gpu", "derivedAttributes": gpu_derived } },
                { "name": "nic", "exactly": { "deviceClassName": "nic", "derivedAttributes": [
                    { "name": attribute, "expression": nic_expression },
                ] } },
            ],
            "constraints": [{ "matchAttribute": attribute }],
        }),
    )
}

#[test]
fn derived_attributes_match_devices_of_different_drivers() {
    let nic_numa = "int(device.attributes['nic.example.com'].socket.replace('numa', ''))";
    let claim = gpu_and_nic(
        "derived/numa",
        json!([{ "name": "derived/numa", "expression": "device.attributes['gpu.example.com'].numa" }]),
        nic_numa,
    );
    let allocation = gpus_and_nics().allocate(&claim, NODE).unwrap();
    assert_eq!(
        devices(&allocation),
        ["gpu-0", "nic-1"],
        "nic-0 is on NUMA node 1, gpu-0 on 0"
    );

    // Shadowing: the NIC's derived value stands in for the GPU driver's attribute of that name,
    // which NICs do not publish (without it, no NIC could match).
    let claim = gpu_and_nic("gpu.example.com/numa", json!([]), nic_numa);
    let allocation = gpus_and_nics().allocate(&claim, NODE).unwrap();
    assert_eq!(devices(&allocation), ["gpu-0", "nic-1"]);

    // A list result uses set semantics like list attributes.
    let claim = gpu_and_nic(
        "derived/numa",
        json!([{ "name": "derived/numa", "expression": "[device.attributes['gpu.example.com'].numa, 7]" }]),
        "[1, int(device.attributes['nic.example.com'].socket.replace('numa', ''))]",
    );
    let allocation = gpus_and_nics().allocate(&claim, NODE).unwrap();
    assert_eq!(
        devices(&allocation),
        ["gpu-0", "nic-1"],
        "{{0, 7}} meets {{1, 0}} of nic-1, not {{1}} of nic-0"
    );
}

#[test]
fn a_derived_attribute_cel_error_fails_the_allocation() {
    // NICs have no `numa` attribute: the lookup fails on the first NIC tried.
    let claim = gpu_and_nic(
        "derived/numa",
        json!([{ "name": "derived/numa", "expression": "device.attributes['gpu.example.com'].numa" }]),
        "device.attributes['nic.example.com'].numa",
    );
    let error = gpus_and_nics().allocate(&claim, NODE).unwrap_err();
    assert!(
        matches!(&error, AllocationError::DerivedAttribute { request, name, .. }
            if request == "nic" && name == "derived/numa"),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "claim default/pair, request nic: derived attribute derived/numa on device \
         nic.example.com/node-a/nic-0: CEL runtime error: no such key: numa \
         (expression: device.attributes['nic.example.com'].numa)"
    );

    // A result that is neither a scalar nor a list of scalars is an error too.
    let claim = gpu_and_nic(
        "derived/numa",
        json!([{ "name": "derived/numa", "expression": "{'numa': 1}" }]),
        "1",
    );
    let error = gpus_and_nics().allocate(&claim, NODE).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("is not a string, int, bool, semver or a list of them"),
        "{error}"
    );
}
