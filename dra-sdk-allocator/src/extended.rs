//! Extended resources backed by DRA: the claim the scheduler makes for a pod that asks for
//! `resources.limits: {nvidia.com/gpu: 2}` instead of referencing a claim.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use serde::Deserialize;
use serde_json::json;

use super::model;
use dra_sdk::k8s::QuantityValue as Quantity;

/// The resource name a class serves without naming one: `deviceclass.resource.kubernetes.io/<class>`.
const IMPLICIT_PREFIX: &str = "deviceclass.resource.kubernetes.io/";

/// Annotation the scheduler puts on the claims it makes for extended resources.
pub const EXTENDED_RESOURCE_CLAIM_ANNOTATION: &str =
    "resource.kubernetes.io/extended-resource-claim";

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct PodView {
    metadata: ObjectMeta,
    spec: PodSpec,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct ObjectMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct PodSpec {
    init_containers: Vec<Container>,
    containers: Vec<Container>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct Container {
    resources: Resources,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct Resources {
    limits: BTreeMap<String, String>,
    requests: BTreeMap<String, String>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct ClassView {
    metadata: ObjectMeta,
    spec: ClassSpec,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct ClassSpec {
    extended_resource_name: Option<String>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct NodeView {
    status: NodeStatus,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct NodeStatus {
    allocatable: BTreeMap<String, String>,
}

/// The ResourceClaim kube-scheduler makes for the pod's extended-resource requests that a
/// DeviceClass serves on `node` (feature `DRAExtendedResource`), or `None` when the pod asks
/// for none: the claim [`Allocator::allocate`](super::Allocator::allocate) then allocates like
/// any other.
///
/// A resource is served by the class naming it in `extendedResourceName`, or by the class
/// `<class>` for `deviceclass.resource.kubernetes.io/<class>` (the first class by name where
/// several name it); a node that advertises the resource in `status.allocatable` serves it with
/// a device plugin instead, so it gets no request. Each served resource of each container
/// becomes one request `container-<c>-request-<r>`, `ExactCount` with the amount asked
/// (requests, else limits): `c` indexes init containers then containers, `r` the container's
/// resources (all of them) in name order, as in kube-scheduler's `createDeviceRequests`. As
/// recorded (scenario 65): the claim has `generateName: <pod>-extended-resources-`, the
/// annotation [`EXTENDED_RESOURCE_CLAIM_ANNOTATION`] and the pod as owner; it has no name (the
/// API server generates it).
pub fn extended_resource_claim(
    pod: &Pod,
    classes: &[DeviceClass],
    node: &Node,
) -> Option<ResourceClaim> {
    let pod: PodView = model::decode(pod).ok()?;
    let node: NodeView = model::decode(node).unwrap_or_default();
    let mut serving: BTreeMap<String, String> = BTreeMap::new();
    let mut names: Vec<String> = classes
        .iter()
        .filter_map(|class| model::decode::<ClassView>(class).ok())
        .filter_map(|class| {
            let name = class.metadata.name?;
            if let Some(resource) = class.spec.extended_resource_name {
                serving.entry(resource).or_insert_with(|| name.clone());
            }
            Some(name)
        })
        .collect();
    names.sort();
    let class_for = |resource: &str| -> Option<String> {
        if let Some(class) = resource.strip_prefix(IMPLICIT_PREFIX) {
            return names.iter().find(|name| *name == class).cloned();
        }
        serving.get(resource).cloned()
    };

    let containers = pod.spec.init_containers.iter().chain(&pod.spec.containers);
    let mut requests = Vec::new();
    for (index, container) in containers.enumerate() {
        // Requests default to limits for extended resources (they must be equal).
        let mut amounts = container.resources.limits.clone();
        amounts.extend(container.resources.requests.clone());
        // The second index counts every resource of the container in name order, served or
        // not, as kube-scheduler's `createDeviceRequests` does.
        for (position, (resource, amount)) in amounts.iter().enumerate() {
            if node.status.allocatable.contains_key(resource) {
                continue;
            }
            let Some(class) = class_for(resource) else {
                continue;
            };
            // Extended resources are whole numbers; anything else was rejected by the API
            // server, so it is not a request.
            let Some(count) = Quantity::parse(amount)
                .ok()
                .and_then(|quantity| quantity.as_integer())
                .filter(|count| *count > 0)
            else {
                continue;
            };
            requests.push(json!({
                "name": format!("container-{index}-request-{position}"),
                "exactly": {
                    "allocationMode": "ExactCount",
                    "count": count,
                    "deviceClassName": class,
                },
            }));
        }
    }
    if requests.is_empty() {
        return None;
    }
    let pod_name = pod.metadata.name.unwrap_or_default();
    let claim = json!({
        "metadata": {
            "generateName": format!("{pod_name}-extended-resources-"),
            "namespace": pod.metadata.namespace,
            "annotations": { EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true" },
            "ownerReferences": [{
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod_name,
                "uid": pod.metadata.uid.unwrap_or_default(),
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": { "devices": { "requests": requests } },
    });
    serde_json::from_value(claim).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_json<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
        serde_json::from_value(value).unwrap()
    }

    fn pod(resources: serde_json::Value) -> Pod {
        from_json(json!({
            "metadata": { "name": "p1", "namespace": "s65", "uid": "u1" },
            "spec": { "containers": [
                { "name": "sidecar", "image": "pause" },
                { "name": "c", "image": "pause", "resources": resources },
            ] },
        }))
    }

    fn classes() -> Vec<DeviceClass> {
        vec![
            from_json(json!({
                "metadata": { "name": "gpu.nvidia.com" },
                "spec": { "extendedResourceName": "nvidia.com/gpu" },
            })),
            from_json(json!({ "metadata": { "name": "mig.nvidia.com" }, "spec": {} })),
        ]
    }

    fn node(allocatable: serde_json::Value) -> Node {
        from_json(json!({ "metadata": { "name": "n" }, "status": { "allocatable": allocatable } }))
    }

    fn requests(claim: &ResourceClaim) -> serde_json::Value {
        serde_json::to_value(claim).unwrap()["spec"]["devices"]["requests"].clone()
    }

    // Scenario 65 recorded one container asking nvidia.com/gpu: 2 (`container-0-request-0`);
    // here the second container's resources are numbered in name order, cpu included.
    #[test]
    fn makes_one_exact_count_request_per_served_resource() {
        let pod = pod(json!({ "limits": {
            "nvidia.com/gpu": "2",
            "deviceclass.resource.kubernetes.io/mig.nvidia.com": "1",
            "cpu": "1",
        } }));
        let claim = extended_resource_claim(&pod, &classes(), &node(json!({"cpu": "8"}))).unwrap();
        assert_eq!(
            requests(&claim),
            json!([
                { "name": "container-1-request-1", "exactly": {
                    "allocationMode": "ExactCount", "count": 1, "deviceClassName": "mig.nvidia.com" } },
                { "name": "container-1-request-2", "exactly": {
                    "allocationMode": "ExactCount", "count": 2, "deviceClassName": "gpu.nvidia.com" } },
            ])
        );
        assert_eq!(
            claim.metadata.generate_name.as_deref(),
            Some("p1-extended-resources-")
        );
        assert_eq!(
            claim.metadata.annotations.unwrap()[EXTENDED_RESOURCE_CLAIM_ANNOTATION],
            "true"
        );
    }

    #[test]
    fn none_without_served_resources_or_when_the_node_advertises_them() {
        let asks_gpu = pod(json!({ "limits": { "nvidia.com/gpu": "2" } }));
        let device_plugin = node(json!({ "nvidia.com/gpu": "8" }));
        assert!(extended_resource_claim(&asks_gpu, &classes(), &device_plugin).is_none());
        let asks_cpu = pod(json!({ "limits": { "cpu": "2" } }));
        assert!(extended_resource_claim(&asks_cpu, &classes(), &node(json!({}))).is_none());
    }
}
