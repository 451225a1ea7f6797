//! The testing allocator, feature by feature: selectors and CEL, allocation modes, constraints,
//! prioritized lists, admin access, partitionable devices, consumable capacity, node selection,
//! taints, the configs and node selector of the result, the failure messages, and writing the
//! allocation through a (fake) API server.

use dra_sdk_allocator::{AllocationError, Allocator, UnsatisfiableReason, allocate_claim};
use dra_sdk_testing::apiserver::{FakeApiServer, Fault, Verb};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceClass, DeviceRequestAllocationResult, ResourceClaim, ResourceSlice,
};
use serde_json::{Value, json};

const DRIVER: &str = "gpu.example.com";
const NODE: &str = "node-a";

fn from_json<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).unwrap()
}

/// A slice of `pool` on `NODE` (generation 1, one slice in the pool).
fn slice(name: &str, pool: &str, devices: Value) -> ResourceSlice {
    slice_with(
        name,
        json!({
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": { "name": pool, "generation": 1, "resourceSliceCount": 1 },
            "devices": devices,
        }),
    )
}

fn slice_with(name: &str, spec: Value) -> ResourceSlice {
    from_json(json!({ "metadata": { "name": name }, "spec": spec }))
}

fn gpus(count: usize) -> Value {
    Value::Array(
        (0..count)
            .map(|i| json!({ "name": format!("gpu-{i}") }))
            .collect(),
    )
}

/// The class `DRIVER`, selecting the driver's devices.
fn gpu_class() -> DeviceClass {
    class(
        DRIVER,
        &[&format!("device.driver == '{DRIVER}'")],
        json!([]),
    )
}

fn class(name: &str, selectors: &[&str], config: Value) -> DeviceClass {
    let selectors: Vec<Value> = selectors
        .iter()
        .map(|e| json!({ "cel": { "expression": e } }))
        .collect();
    from_json(json!({
        "metadata": { "name": name },
        "spec": { "selectors": selectors, "config": config },
    }))
}

/// A claim in `default` with these `spec.devices`.
fn claim(name: &str, devices: Value) -> ResourceClaim {
    from_json(json!({
        "metadata": { "name": name, "namespace": "default", "uid": format!("uid-{name}") },
        "spec": { "devices": devices },
    }))
}

/// One request `gpu` of the class `DRIVER` with these extra `exactly` fields.
fn gpu_claim(name: &str, exactly: Value) -> ResourceClaim {
    let mut exact = json!({ "deviceClassName": DRIVER });
    exact
        .as_object_mut()
        .unwrap()
        .extend(exactly.as_object().unwrap().clone());
    claim(
        name,
        json!({ "requests": [{ "name": "gpu", "exactly": exact }] }),
    )
}

/// `claim` with `status.allocation` holding these results.
fn holding(mut claim: ResourceClaim, results: Value) -> ResourceClaim {
    claim.status = Some(from_json(
        json!({ "allocation": { "devices": { "results": results } } }),
    ));
    claim
}

fn held(request: &str, device: &str) -> Value {
    json!({ "request": request, "driver": DRIVER, "pool": NODE, "device": device })
}

fn results(allocation: &AllocationResult) -> Vec<DeviceRequestAllocationResult> {
    allocation
        .devices
        .as_ref()
        .and_then(|d| d.results.clone())
        .unwrap_or_default()
}

fn devices(allocation: &AllocationResult) -> Vec<String> {
    results(allocation).into_iter().map(|r| r.device).collect()
}

fn unsatisfiable(error: AllocationError) -> Vec<(String, UnsatisfiableReason)> {
    match error {
        AllocationError::Unsatisfiable { problems, .. } => problems
            .into_iter()
            .map(|p| (p.request, p.reason))
            .collect(),
        other => panic!("expected Unsatisfiable, got {other:?}"),
    }
}

#[test]
fn exact_count_takes_devices_in_order_and_pins_to_the_node() {
    let allocator = Allocator::new(&[slice("s", NODE, gpus(3))], &[gpu_class()], &[]);
    let allocation = allocator
        .allocate(&gpu_claim("c", json!({ "count": 2 })), NODE)
        .unwrap();

    let results = results(&allocation);
    assert_eq!(results.len(), 2);
    for (result, device) in results.iter().zip(["gpu-0", "gpu-1"]) {
        assert_eq!(
            (
                result.request.as_str(),
                result.driver.as_str(),
                result.pool.as_str(),
                result.device.as_str()
            ),
            ("gpu", DRIVER, NODE, device)
        );
        assert_eq!(result.admin_access, None);
        assert_eq!(result.share_id, None);
        assert_eq!(result.consumed_capacity, None);
    }
    let selector = serde_json::to_value(allocation.node_selector).unwrap();
    assert_eq!(
        selector,
        json!({ "nodeSelectorTerms": [{ "matchFields": [
            { "key": "metadata.name", "operator": "In", "values": [NODE] }
        ] }] })
    );
}

#[test]
fn class_and_request_selectors_see_attributes_by_domain() {
    let slice = slice(
        "s",
        NODE,
        json!([
            { "name": "gpu-0", "attributes": { "model": { "string": "t4" }, "example.com/numa": { "int": 0 } } },
            { "name": "gpu-1", "attributes": { "model": { "string": "a100" }, "example.com/numa": { "int": 1 } } },
            { "name": "gpu-2", "attributes": { "model": { "string": "a100" }, "example.com/numa": { "int": 0 } } },
        ]),
    );
    let class = class(
        DRIVER,
        &["device.attributes['gpu.example.com'].model == 'a100'"],
        json!([]),
    );
    let claim = gpu_claim(
        "c",
        json!({
            "selectors": [{ "cel": { "expression": "device.attributes['example.com'].numa == 0" } }],
        }),
    );
    let allocation = Allocator::new(&[slice], &[class], &[])
        .allocate(&claim, NODE)
        .unwrap();
    assert_eq!(devices(&allocation), ["gpu-2"]);
}

#[test]
fn quantity_and_semver_selectors() {
    let slice = slice(
        "s",
        NODE,
        json!([
            { "name": "small", "capacity": { "memory": { "value": "16Gi" } }, "attributes": { "fw": { "version": "2.1.0" } } },
            { "name": "large-old", "capacity": { "memory": { "value": "80Gi" } }, "attributes": { "fw": { "version": "1.9.3" } } },
            { "name": "large-new", "capacity": { "memory": { "value": "81920Mi" } }, "attributes": { "fw": { "version": "2.0.0-rc.1" } } },
            { "name": "large", "capacity": { "memory": { "value": "80Gi" } }, "attributes": { "fw": { "version": "2.0.0" } } },
        ]),
    );
    let claim = gpu_claim(
        "c",
        json!({ "selectors": [
        { "cel": { "expression": "device.capacity['gpu.example.com'].memory.compareTo(quantity('40Gi')) >= 0" } },
        { "cel": { "expression": "device.attributes['gpu.example.com'].fw.isGreaterThan(semver('1.10.0'))" } },
        { "cel": { "expression": "!device.attributes['gpu.example.com'].fw.isLessThan(semver('2.0.0'))" } },
    ] }),
    );
    let allocation = Allocator::new(&[slice], &[gpu_class()], &[])
        .allocate(&claim, NODE)
        .unwrap();
    assert_eq!(devices(&allocation), ["large"]);
}

#[test]
fn a_selector_that_matches_nothing_names_the_request() {
    let allocator = Allocator::new(&[slice("s", NODE, gpus(2))], &[gpu_class()], &[]);
    let claim = gpu_claim(
        "c",
        json!({
            "selectors": [{ "cel": { "expression": "has(device.attributes['gpu.example.com'].model)" } }],
        }),
    );
    let error = allocator.allocate(&claim, NODE).unwrap_err();
    assert_eq!(
        error.to_string(),
        "cannot allocate all claims: claim default/c on node node-a: request gpu: \
         no device matches the selectors (2 devices considered)"
    );
    assert_eq!(
        unsatisfiable(error),
        [(
            "gpu".into(),
            UnsatisfiableReason::NoMatchingDevice { considered: 2 }
        )]
    );

    // Nothing is published for another node at all.
    let error = allocator
        .allocate(&gpu_claim("c", json!({})), "node-b")
        .unwrap_err();
    assert_eq!(
        unsatisfiable(error),
        [(
            "gpu".into(),
            UnsatisfiableReason::NoMatchingDevice { considered: 0 }
        )]
    );
}

#[test]
fn cel_errors_name_the_class_or_request_and_the_expression() {
    let slice = slice(
        "s",
        NODE,
        json!([{ "name": "gpu-0", "attributes": { "model": { "string": "a100" } } }]),
    );

    // A missing attribute is an evaluation error, as in the scheduler.
    let strict = class(
        DRIVER,
        &["device.attributes['gpu.example.com'].vendor == 'acme'"],
        json!([]),
    );
    let allocator = Allocator::new(std::slice::from_ref(&slice), &[strict], &[]);
    let error = allocator
        .allocate(&gpu_claim("c", json!({})), NODE)
        .unwrap_err();
    assert!(
        matches!(error, AllocationError::CelRuntime { index: 0, .. }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "class gpu.example.com: selector #0: CEL runtime error: no such key: vendor \
         (expression: device.attributes['gpu.example.com'].vendor == 'acme')"
    );
    // ... unless the test opts into "no match".
    let tolerant = allocator.tolerate_missing_attributes();
    let error = tolerant
        .allocate(&gpu_claim("c", json!({})), NODE)
        .unwrap_err();
    assert!(
        matches!(error, AllocationError::Unsatisfiable { .. }),
        "{error:?}"
    );

    // Type errors surface when evaluating, attributed to the claim's request.
    let claim = gpu_claim(
        "c",
        json!({ "selectors": [
        { "cel": { "expression": "true" } },
        { "cel": { "expression": "device.attributes['gpu.example.com'].model > 3" } },
    ] }),
    );
    let error = Allocator::new(std::slice::from_ref(&slice), &[gpu_class()], &[])
        .allocate(&claim, NODE)
        .unwrap_err();
    let message = error.to_string();
    assert!(
        message.starts_with("claim default/c, request gpu: selector #1: CEL runtime error: "),
        "{message}"
    );
    assert!(
        message.ends_with("(expression: device.attributes['gpu.example.com'].model > 3)"),
        "{message}"
    );

    // Results that are not booleans, and expressions that do not parse.
    let claim = gpu_claim(
        "c",
        json!({ "selectors": [{ "cel": { "expression": "device.driver" } }] }),
    );
    let error = Allocator::new(std::slice::from_ref(&slice), &[gpu_class()], &[])
        .allocate(&claim, NODE)
        .unwrap_err();
    assert!(
        error.to_string().contains("could not be converted to bool"),
        "{error}"
    );
    let claim = gpu_claim(
        "c",
        json!({ "selectors": [{ "cel": { "expression": "device.driver ==" } }] }),
    );
    let error = Allocator::new(&[slice], &[gpu_class()], &[])
        .allocate(&claim, NODE)
        .unwrap_err();
    assert!(
        matches!(error, AllocationError::CelCompile { index: 0, .. }),
        "{error:?}"
    );
    assert!(
        error
            .to_string()
            .starts_with("claim default/c, request gpu: selector #0: CEL compile error: ")
    );
}

#[test]
fn all_mode_takes_every_matching_device_or_nothing() {
    let slice = slice(
        "s",
        NODE,
        json!([
            { "name": "gpu-0", "attributes": { "model": { "string": "a100" } } },
            { "name": "gpu-1", "attributes": { "model": { "string": "t4" } } },
            { "name": "gpu-2", "attributes": { "model": { "string": "a100" } } },
        ]),
    );
    let all = gpu_claim(
        "c",
        json!({
            "allocationMode": "All",
            "selectors": [{ "cel": { "expression": "device.attributes['gpu.example.com'].model == 'a100'" } }],
        }),
    );
    let allocation = Allocator::new(std::slice::from_ref(&slice), &[gpu_class()], &[])
        .allocate(&all, NODE)
        .unwrap();
    assert_eq!(devices(&allocation), ["gpu-0", "gpu-2"]);

    // One of them is taken: "all" cannot be had.
    let other = holding(gpu_claim("other", json!({})), json!([held("gpu", "gpu-2")]));
    let error = Allocator::new(std::slice::from_ref(&slice), &[gpu_class()], &[other])
        .allocate(&all, NODE)
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "cannot allocate all claims: claim default/c on node node-a: request gpu: \
         1 of 2 matching devices available, 2 needed (1 allocated)"
    );

    // At least one device must match.
    let error = Allocator::new(&[slice], &[gpu_class()], &[])
        .allocate(&all, "node-b")
        .unwrap_err();
    assert!(matches!(
        unsatisfiable(error)[0].1,
        UnsatisfiableReason::NoMatchingDevice { .. }
    ));

    // "All" of a pool that is being updated is unknowable.
    let incomplete = slice_with(
        "s",
        json!({
            "driver": DRIVER, "nodeName": NODE,
            "pool": { "name": NODE, "generation": 1, "resourceSliceCount": 2 },
            "devices": gpus(1),
        }),
    );
    let error = Allocator::new(&[incomplete], &[gpu_class()], &[])
        .allocate(&all, NODE)
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "claim default/c, request gpu: asks for all devices, but resource pool gpu.example.com/node-a \
         is currently being updated"
    );
}

#[test]
fn devices_of_other_claims_are_excluded() {
    let slices = [slice("s", NODE, gpus(2))];
    let first = holding(gpu_claim("first", json!({})), json!([held("gpu", "gpu-0")]));
    let allocation = Allocator::new(&slices, &[gpu_class()], std::slice::from_ref(&first))
        .allocate(&gpu_claim("c", json!({})), NODE)
        .unwrap();
    assert_eq!(devices(&allocation), ["gpu-1"]);

    let second = holding(
        gpu_claim("second", json!({})),
        json!([held("gpu", "gpu-1")]),
    );
    let error = Allocator::new(&slices, &[gpu_class()], &[first.clone(), second])
        .allocate(&gpu_claim("c", json!({})), NODE)
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "cannot allocate all claims: claim default/c on node node-a: request gpu: \
         all 2 matching devices are allocated"
    );

    // Admin access does not hold a device; the claim's own (stale) allocation does not either.
    let monitor = holding(
        gpu_claim("monitor", json!({})),
        json!([{ "request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-1", "adminAccess": true }]),
    );
    let itself = holding(gpu_claim("c", json!({})), json!([held("gpu", "gpu-1")]));
    let allocation = Allocator::new(&slices, &[gpu_class()], &[first, monitor, itself])
        .allocate(&gpu_claim("c", json!({})), NODE)
        .unwrap();
    assert_eq!(devices(&allocation), ["gpu-1"]);
}

#[test]
fn admin_access_ignores_other_claims_but_not_its_own() {
    let slices = [slice("s", NODE, gpus(1))];
    let other = holding(gpu_claim("other", json!({})), json!([held("gpu", "gpu-0")]));
    let allocator = Allocator::new(&slices, &[gpu_class()], &[other]);
    let allocation = allocator
        .allocate(&gpu_claim("admin", json!({ "adminAccess": true })), NODE)
        .unwrap();
    let results = results(&allocation);
    assert_eq!(
        (results[0].device.as_str(), results[0].admin_access),
        ("gpu-0", Some(true))
    );

    // Within one claim a device is handed out once.
    let both = claim(
        "both",
        json!({ "requests": [
        { "name": "admin", "exactly": { "deviceClassName": DRIVER, "adminAccess": true } },
        { "name": "again", "exactly": { "deviceClassName": DRIVER, "adminAccess": true } },
    ] }),
    );
    let problems = unsatisfiable(allocator.allocate(&both, NODE).unwrap_err());
    assert_eq!(problems[0].1, UnsatisfiableReason::Combination);
}

#[test]
fn match_attribute_backtracks_across_requests() {
    let slices = [
        slice(
            "s",
            NODE,
            json!([
                { "name": "gpu-0", "attributes": { "example.com/numa": { "int": 0 } } },
                { "name": "gpu-1", "attributes": { "example.com/numa": { "int": 1 } } },
            ]),
        ),
        slice_with(
            "n",
            json!({
                "driver": "nic.example.com", "nodeName": NODE,
                "pool": { "name": NODE, "generation": 1, "resourceSliceCount": 1 },
                "devices": [{ "name": "nic-0", "attributes": { "example.com/numa": { "int": 1 } } }],
            }),
        ),
    ];
    let classes = [
        gpu_class(),
        class(
            "nic.example.com",
            &["device.driver == 'nic.example.com'"],
            json!([]),
        ),
    ];
    let pair = claim(
        "pair",
        json!({
            "requests": [
                { "name": "gpu", "exactly": { "deviceClassName": DRIVER } },
                { "name": "nic", "exactly": { "deviceClassName": "nic.example.com" } },
            ],
            "constraints": [{ "requests": ["gpu", "nic"], "matchAttribute": "example.com/numa" }],
        }),
    );
    let allocation = Allocator::new(&slices, &classes, &[])
        .allocate(&pair, NODE)
        .unwrap();
    assert_eq!(
        devices(&allocation),
        ["gpu-1", "nic-0"],
        "gpu-0 had to be given up for gpu-1"
    );

    // With gpu-1 taken no pair fits, though each request alone could be satisfied.
    let other = holding(gpu_claim("other", json!({})), json!([held("gpu", "gpu-1")]));
    let error = Allocator::new(&slices, &classes, &[other])
        .allocate(&pair, NODE)
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "cannot allocate all claims: claim default/pair on node node-a: requests gpu, nic: each can be \
         satisfied alone but not together (claim constraints or competition for devices)"
    );

    // Unqualified attributes belong to the driver's domain.
    let slices = [slice(
        "s",
        NODE,
        json!([
            { "name": "gpu-0", "attributes": { "model": { "string": "t4" } } },
            { "name": "gpu-1", "attributes": { "model": { "string": "a100" } } },
            { "name": "gpu-2", "attributes": { "model": { "string": "a100" } } },
            { "name": "gpu-3", "attributes": { "model": { "string": "a100" } } },
        ]),
    )];
    let same = claim(
        "same",
        json!({
            "requests": [
                { "name": "a", "exactly": { "deviceClassName": DRIVER } },
                { "name": "b", "exactly": { "deviceClassName": DRIVER, "count": 2 } },
            ],
            "constraints": [{ "matchAttribute": "gpu.example.com/model" }],
        }),
    );
    let allocation = Allocator::new(&slices, &[gpu_class()], &[])
        .allocate(&same, NODE)
        .unwrap();
    assert_eq!(devices(&allocation), ["gpu-1", "gpu-2", "gpu-3"]);
}

/// GPUs pairwise connected by NVLink share `gpu.nvidia.com/nvlinkGroup`: a claim for two GPUs
/// matching on it gets a connected pair, whether it asks with one request for two or with two
/// requests, and is refused when the free GPUs are in different groups.
#[test]
fn nvlink_groups_pair_gpus_for_a_count_of_two_and_for_two_requests() {
    const GROUP: &str = "gpu.nvidia.com/nvlinkGroup";
    let slices = [slice(
        "s",
        NODE,
        json!([
            { "name": "gpu-0", "attributes": { GROUP: { "string": "nvl-0" } } },
            { "name": "gpu-1", "attributes": { GROUP: { "string": "nvl-1" } } },
            { "name": "gpu-2", "attributes": { GROUP: { "string": "nvl-1" } } },
            { "name": "gpu-3", "attributes": { GROUP: { "string": "nvl-0" } } },
        ]),
    )];
    let count_two = claim(
        "count-two",
        json!({
            "requests": [{ "name": "gpus", "exactly": { "deviceClassName": DRIVER, "count": 2 } }],
            "constraints": [{ "matchAttribute": GROUP }],
        }),
    );
    let two_requests = claim(
        "two-requests",
        json!({
            "requests": [
                { "name": "a", "exactly": { "deviceClassName": DRIVER } },
                { "name": "b", "exactly": { "deviceClassName": DRIVER } },
            ],
            "constraints": [{ "matchAttribute": GROUP, "requests": ["a", "b"] }],
        }),
    );
    let holding_devices = |devices: &[&str]| -> Vec<ResourceClaim> {
        devices
            .iter()
            .map(|device| {
                holding(
                    gpu_claim(&format!("on-{device}"), json!({})),
                    json!([held("gpu", device)]),
                )
            })
            .collect()
    };
    for (held_devices, expected) in [
        // gpu-1 does not match gpu-0's group, nor gpu-2: the search goes on to gpu-3.
        (&[][..], ["gpu-0", "gpu-3"]),
        // Without gpu-0, the group nvl-1.
        (&["gpu-0"][..], ["gpu-1", "gpu-2"]),
    ] {
        let allocator = Allocator::new(&slices, &[gpu_class()], &holding_devices(held_devices));
        for claim in [&count_two, &two_requests] {
            let allocation = allocator.allocate(claim, NODE).unwrap();
            assert_eq!(devices(&allocation), expected, "{held_devices:?}");
        }
    }

    // gpu-2 and gpu-3 are free, each alone in its group: no pair.
    let allocator = Allocator::new(
        &slices,
        &[gpu_class()],
        &holding_devices(&["gpu-0", "gpu-1"]),
    );
    for (claim, requests) in [(&count_two, "gpus"), (&two_requests, "a, b")] {
        let error = allocator.allocate(claim, NODE).unwrap_err();
        assert_eq!(
            unsatisfiable(error),
            [(requests.to_owned(), UnsatisfiableReason::Combination)]
        );
        let explanation = allocator.explain(claim, NODE).unwrap();
        let constraint = &explanation.constraints[0];
        assert_eq!(constraint.enough, Some(false));
        assert!(
            constraint
                .to_string()
                .ends_with("but no value has enough available devices: nvl-1: gpu-2; nvl-0: gpu-3"),
            "{constraint}"
        );
    }
}

#[test]
fn distinct_attribute_spreads_devices() {
    let slices = [slice(
        "s",
        NODE,
        json!([
            { "name": "gpu-0", "attributes": { "example.com/numa": { "int": 0 } } },
            { "name": "gpu-1", "attributes": { "example.com/numa": { "int": 0 } } },
            { "name": "gpu-2", "attributes": { "example.com/numa": { "int": 1 } } },
        ]),
    )];
    let spread = claim(
        "spread",
        json!({
            "requests": [{ "name": "gpu", "exactly": { "deviceClassName": DRIVER, "count": 2 } }],
            "constraints": [{ "distinctAttribute": "example.com/numa" }],
        }),
    );
    let allocation = Allocator::new(&slices, &[gpu_class()], &[])
        .allocate(&spread, NODE)
        .unwrap();
    assert_eq!(devices(&allocation), ["gpu-0", "gpu-2"]);
}

#[test]
fn first_available_falls_back_to_later_subrequests() {
    let slices = [slice(
        "s",
        NODE,
        json!([
            { "name": "gpu-0", "attributes": { "model": { "string": "t4" } } },
            { "name": "gpu-1", "attributes": { "model": { "string": "t4" } } },
        ]),
    )];
    let classes = [
        class(
            "big",
            &["device.attributes['gpu.example.com'].model == 'a100'"],
            json!([
                { "opaque": { "driver": DRIVER, "parameters": { "profile": "big" } } },
            ]),
        ),
        class(
            "small",
            &["device.attributes['gpu.example.com'].model == 't4'"],
            json!([
                { "opaque": { "driver": DRIVER, "parameters": { "profile": "small" } } },
            ]),
        ),
    ];
    let claim = claim(
        "c",
        json!({
            "requests": [{ "name": "gpu", "firstAvailable": [
                { "name": "large", "deviceClassName": "big" },
                { "name": "two-small", "deviceClassName": "small", "count": 2 },
            ] }],
            "config": [
                { "requests": ["gpu/large"], "opaque": { "driver": DRIVER, "parameters": { "for": "large" } } },
                { "requests": ["gpu/two-small"], "opaque": { "driver": DRIVER, "parameters": { "for": "small" } } },
                { "requests": ["gpu"], "opaque": { "driver": DRIVER, "parameters": { "for": "any" } } },
            ],
        }),
    );
    let allocation = Allocator::new(&slices, &classes, &[])
        .allocate(&claim, NODE)
        .unwrap();
    let results = results(&allocation);
    assert_eq!(
        results
            .iter()
            .map(|r| r.request.as_str())
            .collect::<Vec<_>>(),
        ["gpu/two-small"; 2]
    );
    let config = serde_json::to_value(&allocation.devices.unwrap().config).unwrap();
    assert_eq!(
        config,
        json!([
            { "source": "FromClass", "requests": ["gpu/two-small"],
              "opaque": { "driver": DRIVER, "parameters": { "profile": "small" } } },
            { "source": "FromClaim", "requests": ["gpu/two-small"],
              "opaque": { "driver": DRIVER, "parameters": { "for": "small" } } },
            { "source": "FromClaim", "requests": ["gpu"],
              "opaque": { "driver": DRIVER, "parameters": { "for": "any" } } },
        ])
    );

    // When no subrequest fits, each says why.
    let error = Allocator::new(&slices, &classes, &[])
        .allocate(&claim, "node-b")
        .unwrap_err();
    let problems = unsatisfiable(error);
    assert_eq!(
        problems
            .iter()
            .map(|(request, _)| request.as_str())
            .collect::<Vec<_>>(),
        ["gpu/large", "gpu/two-small"]
    );
}

#[test]
fn class_configs_come_first_once_per_class_then_claim_configs_in_order() {
    let slices = [slice("s", NODE, gpus(3))];
    let classes = [class(
        DRIVER,
        &[],
        json!([
            { "opaque": { "driver": DRIVER, "parameters": { "class": 1 } } },
            { "opaque": { "driver": "other.example.com", "parameters": { "class": 2 } } },
        ]),
    )];
    let claim = claim(
        "c",
        json!({
            "requests": [
                { "name": "a", "exactly": { "deviceClassName": DRIVER } },
                { "name": "b", "exactly": { "deviceClassName": DRIVER } },
            ],
            "config": [
                { "opaque": { "driver": DRIVER, "parameters": { "claim": "all" } } },
                { "requests": ["b"], "opaque": { "driver": DRIVER, "parameters": { "claim": "b" } } },
            ],
        }),
    );
    let allocation = Allocator::new(&slices, &classes, &[])
        .allocate(&claim, NODE)
        .unwrap();
    let config = serde_json::to_value(&allocation.devices.unwrap().config).unwrap();
    assert_eq!(
        config,
        json!([
            { "source": "FromClass", "requests": ["a", "b"], "opaque": { "driver": DRIVER, "parameters": { "class": 1 } } },
            { "source": "FromClass", "requests": ["a", "b"], "opaque": { "driver": "other.example.com", "parameters": { "class": 2 } } },
            { "source": "FromClaim", "opaque": { "driver": DRIVER, "parameters": { "claim": "all" } } },
            { "source": "FromClaim", "requests": ["b"], "opaque": { "driver": DRIVER, "parameters": { "claim": "b" } } },
        ])
    );
}

/// A GPU with 40Gi of memory published as a counter set, and partitions consuming from it.
fn partitioned_gpu() -> Vec<ResourceSlice> {
    let partition = |name: &str, memory: &str| {
        json!({
            "name": name,
            "attributes": { "whole": { "bool": memory == "40Gi" } },
            "consumesCounters": [{ "counterSet": "gpu-0", "counters": { "memory": { "value": memory } } }],
        })
    };
    let pool = json!({ "name": NODE, "generation": 1, "resourceSliceCount": 2 });
    vec![
        slice_with(
            "counters",
            json!({
                "driver": DRIVER, "nodeName": NODE, "pool": pool,
                "sharedCounters": [{ "name": "gpu-0", "counters": { "memory": { "value": "40Gi" } } }],
            }),
        ),
        slice_with(
            "partitions",
            json!({
                "driver": DRIVER, "nodeName": NODE, "pool": pool,
                "devices": [partition("whole", "40Gi"), partition("half-0", "20Gi"), partition("half-1", "20Gi")],
            }),
        ),
    ]
}

#[test]
fn partitions_share_counters() {
    let slices = partitioned_gpu();
    let halves = gpu_claim(
        "halves",
        json!({
            "count": 2,
            "selectors": [{ "cel": { "expression": "!device.attributes['gpu.example.com'].whole" } }],
        }),
    );
    let allocation = Allocator::new(&slices, &[gpu_class()], &[])
        .allocate(&halves, NODE)
        .unwrap();
    assert_eq!(devices(&allocation), ["half-0", "half-1"]);

    // The whole GPU is gone once one half is allocated, and vice versa.
    let half = holding(gpu_claim("half", json!({})), json!([held("gpu", "half-1")]));
    let whole = gpu_claim(
        "whole",
        json!({ "selectors": [
        { "cel": { "expression": "device.attributes['gpu.example.com'].whole" } },
    ] }),
    );
    let error = Allocator::new(&slices, &[gpu_class()], &[half])
        .allocate(&whole, NODE)
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "cannot allocate all claims: claim default/whole on node node-a: request gpu: \
         0 of 1 matching devices available, 1 needed (1 without enough shared counters)"
    );
    let three = gpu_claim("three", json!({ "count": 2 }));
    let allocation = Allocator::new(&slices, &[gpu_class()], &[])
        .allocate(&three, NODE)
        .unwrap();
    assert_eq!(
        devices(&allocation),
        ["half-0", "half-1"],
        "whole then a half would exceed 40Gi"
    );
}

/// A NIC whose bandwidth is shared between claims.
fn shared_nic(policy: Value) -> Vec<ResourceSlice> {
    let mut bandwidth = json!({ "value": "10G" });
    if !policy.is_null() {
        bandwidth["requestPolicy"] = policy;
    }
    vec![slice(
        "s",
        NODE,
        json!([{
            "name": "nic-0",
            "allowMultipleAllocations": true,
            "capacity": { "bandwidth": bandwidth, "queues": { "value": "8" } },
        }]),
    )]
}

fn share(claim: &str, device: &str, consumed: Value) -> ResourceClaim {
    holding(
        gpu_claim(claim, json!({})),
        json!([{
            "request": "gpu", "driver": DRIVER, "pool": NODE, "device": device,
            "shareID": format!("{claim}-share"), "consumedCapacity": consumed,
        }]),
    )
}

#[test]
fn consumable_capacity_is_shared_with_share_ids() {
    let policy = json!({ "default": "1G", "validRange": { "min": "1G", "step": "1G" } });
    let slices = shared_nic(policy);
    let other = share(
        "other",
        "nic-0",
        json!({ "bandwidth": "6G", "queues": "0" }),
    );
    let allocator = Allocator::new(&slices, &[gpu_class()], &[other]);

    // 2.5G rounds up to the 1G step; queues have no policy and no request: the whole capacity.
    let claim = gpu_claim(
        "c",
        json!({ "capacity": { "requests": { "bandwidth": "2500M" } } }),
    );
    let allocation = allocator.allocate(&claim, NODE).unwrap();
    let result = &results(&allocation)[0];
    assert_eq!(result.device, "nic-0");
    let consumed = serde_json::to_value(&result.consumed_capacity).unwrap();
    assert_eq!(consumed, json!({ "bandwidth": "3G", "queues": "8" }));
    let share_id = result.share_id.clone().unwrap();
    assert_eq!(share_id.len(), 36);
    assert_eq!(share_id.matches('-').count(), 4);

    // Without a request the policy's default applies; two requests of one claim on the same
    // device get two shares. One request does not take a shared device twice: kube-scheduler
    // leaves `count: 2` of one shared device pending (recordings, scenario 41; this test
    // expected two shares before).
    let twice = self::claim(
        "twice",
        json!({ "requests": [
            { "name": "gpu", "exactly": { "deviceClassName": DRIVER } },
            { "name": "more", "exactly": { "deviceClassName": DRIVER } },
        ] }),
    );
    let count_two = gpu_claim("count-two", json!({ "count": 2 }));
    let slices_without_queues = vec![slice(
        "s",
        NODE,
        json!([{
            "name": "nic-0", "allowMultipleAllocations": true,
            "capacity": { "bandwidth": { "value": "10G", "requestPolicy": { "default": "1G", "validValues": ["1G", "2G"] } } },
        }]),
    )];
    let shared = Allocator::new(&slices_without_queues, &[gpu_class()], &[]);
    assert!(matches!(
        shared.allocate(&count_two, NODE),
        Err(AllocationError::Unsatisfiable { .. })
    ));
    let allocation = shared.allocate(&twice, NODE).unwrap();
    let results = results(&allocation);
    assert_eq!(devices(&allocation), ["nic-0", "nic-0"]);
    assert_ne!(results[0].share_id, results[1].share_id);
    assert_eq!(
        serde_json::to_value(&results[1].consumed_capacity).unwrap(),
        json!({ "bandwidth": "1G" })
    );

    // 6G of other shares plus 5G does not fit into 10G.
    let claim = gpu_claim(
        "c",
        json!({ "capacity": { "requests": { "bandwidth": "5G" } } }),
    );
    let problems = unsatisfiable(allocator.allocate(&claim, NODE).unwrap_err());
    assert!(
        matches!(
            problems[0].1,
            UnsatisfiableReason::Unavailable {
                capacity: 1,
                available: 0,
                ..
            }
        ),
        "{problems:?}"
    );

    // A value outside validValues cannot be rounded up: the policy forbids it.
    let claim = gpu_claim(
        "c",
        json!({ "capacity": { "requests": { "bandwidth": "3G" } } }),
    );
    assert!(
        Allocator::new(&slices_without_queues, &[gpu_class()], &[])
            .allocate(&claim, NODE)
            .is_err()
    );
}

#[test]
fn capacity_requests_filter_unshared_devices() {
    let slices = [slice(
        "s",
        NODE,
        json!([
            { "name": "gpu-0", "capacity": { "memory": { "value": "16Gi" } } },
            { "name": "gpu-1", "capacity": { "memory": { "value": "80Gi" } } },
        ]),
    )];
    let claim = gpu_claim(
        "c",
        json!({ "capacity": { "requests": { "memory": "40Gi" } } }),
    );
    let allocation = Allocator::new(&slices, &[gpu_class()], &[])
        .allocate(&claim, NODE)
        .unwrap();
    let result = &results(&allocation)[0];
    assert_eq!(
        (
            result.device.as_str(),
            &result.consumed_capacity,
            &result.share_id
        ),
        ("gpu-1", &None, &None)
    );
}

#[test]
fn only_complete_pools_at_their_newest_generation_count() {
    let old = slice_with(
        "old",
        json!({
            "driver": DRIVER, "nodeName": NODE,
            "pool": { "name": NODE, "generation": 1, "resourceSliceCount": 1 },
            "devices": [{ "name": "retired" }],
        }),
    );
    let new = slice_with(
        "new",
        json!({
            "driver": DRIVER, "nodeName": NODE,
            "pool": { "name": NODE, "generation": 2, "resourceSliceCount": 1 },
            "devices": [{ "name": "current" }],
        }),
    );
    let allocation = Allocator::new(&[old, new], &[gpu_class()], &[])
        .allocate(&gpu_claim("c", json!({})), NODE)
        .unwrap();
    assert_eq!(devices(&allocation), ["current"]);

    let partial = slice_with(
        "partial",
        json!({
            "driver": DRIVER, "nodeName": NODE,
            "pool": { "name": NODE, "generation": 3, "resourceSliceCount": 2 },
            "devices": [{ "name": "gpu-0" }],
        }),
    );
    let error = Allocator::new(&[partial], &[gpu_class()], &[])
        .allocate(&gpu_claim("c", json!({})), NODE)
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "cannot allocate all claims: claim default/c on node node-a: request gpu: no device matches the \
         selectors (0 devices considered) (skipped pools: gpu.example.com/node-a (being updated))"
    );
}

#[test]
fn node_selection_of_slices_and_devices() {
    let everywhere = slice_with(
        "everywhere",
        json!({
            "driver": DRIVER, "allNodes": true,
            "pool": { "name": "fabric", "generation": 1, "resourceSliceCount": 1 },
            "devices": [{ "name": "link-0" }],
        }),
    );
    let allocation = Allocator::new(std::slice::from_ref(&everywhere), &[gpu_class()], &[])
        .allocate(&gpu_claim("c", json!({})), "any-node")
        .unwrap();
    assert_eq!(devices(&allocation), ["link-0"]);
    assert_eq!(allocation.node_selector, None, "usable on every node");

    let zone = json!({ "nodeSelectorTerms": [{ "matchExpressions": [
        { "key": "zone", "operator": "In", "values": ["a"] }
    ] }] });
    let zonal = slice_with(
        "zonal",
        json!({
            "driver": DRIVER, "nodeSelector": zone,
            "pool": { "name": "zone-a", "generation": 1, "resourceSliceCount": 1 },
            "devices": [{ "name": "shared-0" }],
        }),
    );
    let node: Node = from_json(json!({ "metadata": { "name": NODE, "labels": { "zone": "a" } } }));
    let allocator =
        Allocator::new(std::slice::from_ref(&zonal), &[gpu_class()], &[]).with_nodes(&[node]);
    let allocation = allocator
        .allocate(&gpu_claim("c", json!({})), NODE)
        .unwrap();
    assert_eq!(
        serde_json::to_value(&allocation.node_selector).unwrap(),
        zone
    );
    assert!(
        allocator
            .allocate(&gpu_claim("c", json!({})), "unlabelled")
            .is_err()
    );

    let per_device = slice_with(
        "per-device",
        json!({
            "driver": DRIVER, "perDeviceNodeSelection": true,
            "pool": { "name": "mixed", "generation": 1, "resourceSliceCount": 1 },
            "devices": [{ "name": "on-b", "nodeName": "node-b" }, { "name": "on-a", "nodeName": NODE }],
        }),
    );
    let allocation = Allocator::new(&[per_device], &[gpu_class()], &[])
        .allocate(&gpu_claim("c", json!({})), NODE)
        .unwrap();
    assert_eq!(devices(&allocation), ["on-a"]);
    assert_eq!(
        serde_json::to_value(&allocation.node_selector).unwrap()["nodeSelectorTerms"][0]["matchFields"]
            [0]["values"],
        json!([NODE])
    );
}

#[test]
fn taints_need_tolerations() {
    let slices = [slice(
        "s",
        NODE,
        json!([{
            "name": "gpu-0",
            "taints": [{ "key": "example.com/unhealthy", "value": "ecc", "effect": "NoSchedule" }],
        }, {
            "name": "gpu-1",
            "taints": [{ "key": "example.com/note", "effect": "None" }],
        }]),
    )];
    let allocator = Allocator::new(&slices, &[gpu_class()], &[]);
    let allocation = allocator
        .allocate(&gpu_claim("c", json!({})), NODE)
        .unwrap();
    assert_eq!(
        devices(&allocation),
        ["gpu-1"],
        "only NoSchedule and NoExecute keep devices away"
    );

    let error = allocator
        .allocate(&gpu_claim("c", json!({ "count": 2 })), NODE)
        .unwrap_err();
    assert!(
        error
            .to_string()
            .ends_with("1 of 2 matching devices available, 2 needed (1 tainted)"),
        "{error}"
    );

    let toleration = json!({ "key": "example.com/unhealthy", "operator": "Equal", "value": "ecc", "effect": "NoSchedule" });
    let claim = gpu_claim("c", json!({ "count": 2, "tolerations": [toleration] }));
    let allocation = allocator.allocate(&claim, NODE).unwrap();
    let results = results(&allocation);
    assert_eq!(devices(&allocation), ["gpu-0", "gpu-1"]);
    assert_eq!(
        serde_json::to_value(&results[0].tolerations).unwrap(),
        json!([toleration])
    );
}

#[test]
fn claim_level_errors() {
    let slices = [slice("s", NODE, gpus(1))];
    let allocator = Allocator::new(&slices, &[gpu_class()], &[]);
    let error = allocator
        .allocate(&gpu_claim("c", json!({ "count": 33 })), NODE)
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "claim default/c: number of requested devices 33 exceeds the claim limit of 32"
    );

    let unknown = claim(
        "c",
        json!({ "requests": [{ "name": "gpu", "exactly": { "deviceClassName": "nope" } }] }),
    );
    let error = allocator.allocate(&unknown, NODE).unwrap_err();
    assert_eq!(
        error.to_string(),
        "claim default/c, request gpu: could not retrieve device class nope: not found"
    );

    let error = allocator
        .allocate(&gpu_claim("c", json!({ "count": 0 })), NODE)
        .unwrap_err();
    assert!(
        matches!(error, AllocationError::InvalidClaim { .. }),
        "{error:?}"
    );
}

#[test]
fn the_search_is_bounded() {
    // Eight requests that need distinct values of an attribute with seven values among 16
    // devices: only trying (nearly) every assignment proves that none works.
    let devices: Vec<Value> = (0..16)
        .map(|i| json!({ "name": format!("gpu-{i}"), "attributes": { "example.com/slot": { "int": i % 7 } } }))
        .collect();
    let requests: Vec<Value> = (0..8)
        .map(|i| json!({ "name": format!("r{i}"), "exactly": { "deviceClassName": DRIVER } }))
        .collect();
    let claim = claim(
        "c",
        json!({ "requests": requests, "constraints": [{ "distinctAttribute": "example.com/slot" }] }),
    );
    let allocator = Allocator::new(
        &[slice("s", NODE, Value::Array(devices))],
        &[gpu_class()],
        &[],
    )
    .with_search_limit(10_000);
    let error = allocator.allocate(&claim, NODE).unwrap_err();
    assert!(
        matches!(error, AllocationError::SearchLimit { steps: 10_000, .. }),
        "{error:?}"
    );
}

#[tokio::test]
async fn allocate_claim_writes_allocation_and_reservation_through_the_api() {
    let server = FakeApiServer::start().await.unwrap();
    server.insert(&gpu_class()).unwrap();
    server.insert(&slice("s", NODE, gpus(2))).unwrap();
    server
        .insert(&from_json::<Node>(json!({ "metadata": { "name": NODE } })))
        .unwrap();
    for name in ["first", "second", "third"] {
        let mut claim = gpu_claim(name, json!({}));
        claim.metadata.uid = None;
        server.insert(&claim).unwrap();
    }
    let client = server.client().unwrap();

    let first = allocate_claim(
        &client,
        "default",
        "first",
        NODE,
        Some(("pod-1", "uid-pod-1")),
    )
    .await
    .unwrap();
    let status = serde_json::to_value(&first.status).unwrap();
    assert_eq!(
        status["allocation"]["devices"]["results"][0]["device"],
        "gpu-0"
    );
    assert_eq!(
        status["reservedFor"],
        json!([{ "resource": "pods", "name": "pod-1", "uid": "uid-pod-1" }])
    );
    assert_eq!(
        first.metadata.finalizers,
        Some(vec!["resource.kubernetes.io/delete-protection".to_owned()])
    );
    let stored: ResourceClaim = server.get(Some("default"), "first").unwrap().unwrap();
    assert_eq!(serde_json::to_value(&stored.status).unwrap(), status);
    assert_eq!(server.stats().resource("resourceclaims/status").update, 1);

    // The next claim sees the first one's device as taken; a lost race is retried.
    server.faults().inject(
        Fault::status(409)
            .verb(Verb::Update)
            .resource("resourceclaims/status"),
    );
    let second = allocate_claim(&client, "default", "second", NODE, None)
        .await
        .unwrap();
    let status = serde_json::to_value(&second.status).unwrap();
    assert_eq!(
        status["allocation"]["devices"]["results"][0]["device"],
        "gpu-1"
    );
    assert!(status.get("reservedFor").is_none());
    assert_eq!(server.faults().injected(), 1);

    // Allocated claims only gain consumers; their allocation stays.
    let again = allocate_claim(
        &client,
        "default",
        "first",
        NODE,
        Some(("pod-2", "uid-pod-2")),
    )
    .await
    .unwrap();
    let status = serde_json::to_value(&again.status).unwrap();
    assert_eq!(
        status["allocation"]["devices"]["results"][0]["device"],
        "gpu-0"
    );
    assert_eq!(status["reservedFor"].as_array().unwrap().len(), 2);
    let before = server.stats().resource("resourceclaims/status").update;
    allocate_claim(
        &client,
        "default",
        "first",
        NODE,
        Some(("pod-2", "uid-pod-2")),
    )
    .await
    .unwrap();
    assert_eq!(
        server.stats().resource("resourceclaims/status").update,
        before,
        "nothing to write"
    );

    // Nothing left for the third claim: the allocator's error comes back, nothing is written.
    let error = allocate_claim(&client, "default", "third", NODE, None)
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "cannot allocate all claims: claim default/third on node node-a: request gpu: \
         all 2 matching devices are allocated"
    );
    let third: ResourceClaim = server.get(Some("default"), "third").unwrap().unwrap();
    assert!(third.status.and_then(|s| s.allocation).is_none());
    server.shutdown().await;
}
