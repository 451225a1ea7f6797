//! A demo's workloads ([`Workload`]: a claim, or a template, and the Pods using it), created
//! and allocated one at a time: by the SDK's allocator (the embedded cluster, an API server
//! without a scheduler) or by the cluster's scheduler, which the demo waits for.

use std::collections::BTreeSet;
use std::time::Instant;

use dra_sdk_allocator::allocate_claim;
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::{Value, json};

use super::report::{ClaimFailure, ExpectedFailure, Step};
use super::target::{AllocationMode, Stage};
use super::{DemoError, POLL};
use crate::cluster::NewClaim;

/// The image of the demo's Pods; their containers never start (the node's kubelet, if any,
/// does not know the demo's plugin).
const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";
/// Name of the Pods' claim reference, used by their containers.
const POD_CLAIM_NAME: &str = "gpu";

/// A Pod of a workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DemoPod {
    /// Its name.
    pub name: String,
    /// Its containers, each using the workload's claim.
    pub containers: Vec<String>,
}

impl DemoPod {
    /// A Pod `name` with these containers.
    pub fn new(name: impl Into<String>, containers: &[&str]) -> Self {
        Self {
            name: name.into(),
            containers: containers.iter().map(|&c| c.to_owned()).collect(),
        }
    }
}

/// One claim of the demo and the Pods that use it.
#[derive(Clone, Debug)]
pub struct Workload {
    /// The claim's name (for a template's claim, the name the demo gives it in the embedded
    /// cluster and in the report; a cluster's resourceclaim controller names it itself).
    pub claim: String,
    /// What the step shows.
    pub what: String,
    /// The claim's `spec`, as JSON: k8s-openapi's claim types differ between the Kubernetes
    /// versions a driver may pick (a `spec` is optional from 1.37 on), JSON does not.
    pub spec: Value,
    /// The claim comes from this ResourceClaimTemplate (created with `spec`).
    pub template: Option<String>,
    /// The Pods using the claim.
    pub pods: Vec<DemoPod>,
    /// How the claim must fail, if it must.
    pub expected_failure: Option<ExpectedFailure>,
}

impl Workload {
    /// The claim `claim` as `spec` describes it (its name and namespace there do not matter),
    /// used by `pods`; made directly, and meant to succeed.
    pub fn new(
        claim: impl Into<String>,
        what: impl Into<String>,
        spec: NewClaim,
        pods: Vec<DemoPod>,
    ) -> Self {
        Self {
            claim: claim.into(),
            what: what.into(),
            spec: spec.spec_json(),
            template: None,
            pods,
            expected_failure: None,
        }
    }

    /// The claim comes from the ResourceClaimTemplate `template`.
    pub fn from_template(mut self, template: impl Into<String>) -> Self {
        self.template = Some(template.into());
        self
    }

    /// The claim must fail so.
    pub fn must_fail(mut self, expected: ExpectedFailure) -> Self {
        self.expected_failure = Some(expected);
        self
    }

    /// The claim's failure at `step`.
    pub(crate) fn failure(&self, step: Step, message: String) -> ClaimFailure {
        ClaimFailure {
            claim: self.claim.clone(),
            step,
            message,
        }
    }
}

/// A claim as allocated, or why it is not.
pub(crate) type Allocation = Result<ResourceClaim, String>;

/// Creates the workload's claim (or template) and Pods and has the claim allocated and
/// reserved for them. An error is a step the demo could not carry out; an allocation that
/// did not happen is the claim's failure.
pub(crate) async fn create_and_allocate(
    stage: &Stage,
    workload: &Workload,
) -> Result<Allocation, DemoError> {
    match &workload.template {
        Some(template) => {
            let object: ResourceClaimTemplate = from_json(json!({
                "metadata": stage.metadata(template),
                "spec": { "spec": workload.spec },
            }))?;
            stage
                .templates()
                .create(&PostParams::default(), &object)
                .await
                .map_err(DemoError::api(format!(
                    "creating ResourceClaimTemplate {template}"
                )))?;
        }
        None => create_claim(stage, workload, None).await?,
    }
    let mut pods = Vec::new();
    for pod in &workload.pods {
        let created = stage
            .pods()
            .create(&PostParams::default(), &demo_pod(stage, workload, pod)?)
            .await
            .map_err(DemoError::api(format!("creating pod {}", pod.name)))?;
        let uid = created.metadata.uid.ok_or_else(|| DemoError::Incomplete {
            object: format!("pod {}", pod.name),
            field: "metadata.uid",
        })?;
        pods.push((pod.name.as_str(), uid));
    }
    match stage.allocation() {
        AllocationMode::Demo => {
            // A template's claim is made by the resourceclaim controller, owned by the Pod: the
            // demo plays that controller once the Pod has its UID.
            if workload.template.is_some()
                && let Some((pod, uid)) = pods.first()
            {
                create_claim(stage, workload, Some((pod, uid))).await?;
            }
            Ok(allocate_here(stage, &workload.claim, &pods).await)
        }
        AllocationMode::Scheduler => await_allocation(stage, workload, &pods).await,
    }
}

/// Creates the workload's claim, owned by the Pod `owner` (name, UID) when given.
async fn create_claim(
    stage: &Stage,
    workload: &Workload,
    owner: Option<(&str, &str)>,
) -> Result<(), DemoError> {
    let mut metadata = stage.metadata(&workload.claim);
    metadata.owner_references = owner.map(|(pod, uid)| {
        vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: pod.into(),
            uid: uid.into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]
    });
    let claim: ResourceClaim = from_json(json!({ "metadata": metadata, "spec": workload.spec }))?;
    stage
        .claims()
        .create(&PostParams::default(), &claim)
        .await
        .map_err(DemoError::api(format!("creating claim {}", workload.claim)))?;
    Ok(())
}

/// An object from its JSON (claims and templates are written as JSON so that the demo builds with
/// whichever Kubernetes version of k8s-openapi the driver picked).
fn from_json<T: serde::de::DeserializeOwned>(object: Value) -> Result<T, DemoError> {
    let what = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    serde_json::from_value(object).map_err(|source| DemoError::Object { what, source })
}

/// A Pod of the workload using its claim from all its containers, pinned to the demo's node
/// (see [`Stage::placement`]).
fn demo_pod(stage: &Stage, workload: &Workload, pod: &DemoPod) -> Result<Pod, DemoError> {
    let containers: Vec<Value> = pod
        .containers
        .iter()
        .map(|container| {
            json!({
                "name": container,
                "image": PAUSE_IMAGE,
                "resources": { "claims": [{ "name": POD_CLAIM_NAME }] },
                // Admitted under the `restricted` Pod Security Standard.
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "capabilities": { "drop": ["ALL"] },
                },
            })
        })
        .collect();
    let claim = match &workload.template {
        Some(template) => json!({ "name": POD_CLAIM_NAME, "resourceClaimTemplateName": template }),
        None => json!({ "name": POD_CLAIM_NAME, "resourceClaimName": workload.claim }),
    };
    let mut spec = json!({
        "containers": containers,
        "resourceClaims": [claim],
        "automountServiceAccountToken": false,
        // No container ever runs: nothing to wait for once the Pod is deleted.
        "terminationGracePeriodSeconds": 0,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 65535,
            "seccompProfile": { "type": "RuntimeDefault" },
        },
    });
    let (field, placement) = stage.placement();
    spec[field] = placement;
    Ok(Pod {
        metadata: stage.metadata(&pod.name),
        spec: Some(
            serde_json::from_value(spec).map_err(|source| DemoError::Object {
                what: format!("pod {}", pod.name),
                source,
            })?,
        ),
        status: None,
    })
}

/// [`AllocationMode::Demo`]: allocates the claim with the SDK's allocator and reserves it for
/// each of its Pods.
async fn allocate_here(stage: &Stage, claim: &str, pods: &[(&str, String)]) -> Allocation {
    let mut outcome = Err("the claim has no pods".to_owned());
    for (pod, uid) in pods {
        outcome = allocate_claim(
            stage.client(),
            stage.namespace(),
            claim,
            stage.node(),
            Some((pod, uid)),
        )
        .await
        .map_err(|error| error.to_string());
        if outcome.is_err() {
            break;
        }
    }
    outcome
}

/// [`AllocationMode::Scheduler`]: waits until the scheduler allocated the workload's claim
/// (named, or the one the resourceclaim controller made from the template for its first Pod)
/// and reserved it for all its Pods, or until the stage's timeout; a claim still waiting then
/// fails with its Pods' scheduling state.
async fn await_allocation(
    stage: &Stage,
    workload: &Workload,
    pods: &[(&str, String)],
) -> Result<Allocation, DemoError> {
    let uids: Vec<&str> = pods.iter().map(|(_, uid)| uid.as_str()).collect();
    let deadline = Instant::now() + stage.timeout();
    loop {
        let name = match (&workload.template, pods.first()) {
            (None, _) => Some(workload.claim.clone()),
            (Some(_), None) => None,
            (Some(_), Some((pod, _))) => stage
                .pods()
                .get(pod)
                .await
                .map_err(DemoError::api(format!("reading pod {pod}")))?
                .status
                .and_then(|status| status.resource_claim_statuses)
                .and_then(|statuses| statuses.into_iter().find_map(|s| s.resource_claim_name)),
        };
        let claim = match &name {
            Some(name) => stage
                .claims()
                .get_opt(name)
                .await
                .map_err(DemoError::api(format!("reading claim {name}")))?,
            None => None,
        };
        if let Some(claim) = &claim
            && missing_reservations(claim, &uids).is_empty()
        {
            return Ok(Ok(claim.clone()));
        }
        if Instant::now() >= deadline {
            let mut why = Vec::new();
            for (pod, uid) in pods {
                if claim
                    .as_ref()
                    .is_some_and(|claim| missing_reservations(claim, &[uid.as_str()]).is_empty())
                {
                    continue;
                }
                why.push(format!(
                    "pod {pod}: {}",
                    scheduling_state(stage, pod, uid).await
                ));
            }
            let state = match (&claim, &workload.template) {
                (None, Some(template)) => {
                    format!("was not made from ResourceClaimTemplate {template}")
                }
                (Some(claim), _) if !allocated_devices(claim).is_empty() => {
                    "was allocated but not reserved for all its pods".to_owned()
                }
                _ => "was not allocated".to_owned(),
            };
            return Ok(Err(format!(
                "claim {}/{} {state} within {:?}: {}",
                stage.namespace(),
                name.as_deref().unwrap_or(&workload.claim),
                stage.timeout(),
                why.join("; ")
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The UIDs of `pods` the claim is not (allocated and) reserved for.
fn missing_reservations<'a>(claim: &ResourceClaim, pods: &[&'a str]) -> Vec<&'a str> {
    let Some(status) = claim.status.as_ref().filter(|s| s.allocation.is_some()) else {
        return pods.to_vec();
    };
    let reserved: BTreeSet<&str> = status
        .reserved_for
        .iter()
        .flatten()
        .map(|consumer| consumer.uid.as_str())
        .collect();
    pods.iter()
        .copied()
        .filter(|uid| !reserved.contains(uid))
        .collect()
}

/// `pool/device` of each device allocated to the claim.
pub(crate) fn allocated_devices(claim: &ResourceClaim) -> Vec<String> {
    claim
        .status
        .as_ref()
        .and_then(|status| status.allocation.as_ref())
        .and_then(|allocation| allocation.devices.as_ref())
        .map(|devices| {
            devices
                .results
                .iter()
                .flatten()
                .map(|result| format!("{}/{}", result.pool, result.device))
                .collect()
        })
        .unwrap_or_default()
}

/// Why a Pod is not running with its claim: its `PodScheduled` condition and its last
/// events, as far as they can be read.
async fn scheduling_state(stage: &Stage, pod: &str, uid: &str) -> String {
    let mut state = match stage.pods().get_opt(pod).await {
        Ok(Some(found)) => pod_state(&found),
        Ok(None) => "the pod is gone".to_owned(),
        Err(error) => format!("the pod could not be read: {error}"),
    };
    let events: Api<Event> = Api::namespaced(stage.client().clone(), stage.namespace());
    let selector = ListParams::default().fields(&format!(
        "involvedObject.kind=Pod,involvedObject.name={pod},involvedObject.uid={uid}"
    ));
    if let Ok(mut listed) = events.list(&selector).await
        && !listed.items.is_empty()
    {
        listed.items.sort_by(|a, b| {
            let key = |e: &Event| (e.last_timestamp.clone(), e.event_time.clone());
            key(a).cmp(&key(b))
        });
        let last: Vec<String> = listed
            .items
            .iter()
            .rev()
            .take(2)
            .map(|e| {
                format!(
                    "{} {}: {}",
                    e.type_.as_deref().unwrap_or("?"),
                    e.reason.as_deref().unwrap_or("?"),
                    e.message.as_deref().unwrap_or("").trim()
                )
            })
            .collect();
        state.push_str(&format!("; last events: {}", last.join(" | ")));
    }
    state
}

/// Where the Pod is bound, and its `PodScheduled` condition.
fn pod_state(pod: &Pod) -> String {
    let node = pod.spec.as_ref().and_then(|spec| spec.node_name.clone());
    let condition = pod
        .status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "PodScheduled"))
        .map(|c| {
            format!(
                "PodScheduled={} ({}: {})",
                c.status,
                c.reason.as_deref().unwrap_or("no reason"),
                c.message.as_deref().unwrap_or("no message")
            )
        });
    match (node, condition) {
        (Some(node), Some(condition)) => format!("bound to {node}, {condition}"),
        (Some(node), None) => format!("bound to {node}"),
        (None, Some(condition)) => condition,
        (None, None) => {
            "not scheduled, no PodScheduled condition (is a kube-scheduler running?)".to_owned()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(status: Value) -> ResourceClaim {
        serde_json::from_value(json!({ "metadata": { "name": "c" }, "spec": {}, "status": status }))
            .unwrap()
    }

    #[test]
    fn reservations_count_only_once_allocated() {
        let reserved = json!([{ "resource": "pods", "name": "a", "uid": "uid-a" }]);
        let unallocated = claim(json!({ "reservedFor": reserved }));
        assert_eq!(missing_reservations(&unallocated, &["uid-a"]), ["uid-a"]);
        let allocated = claim(json!({
            "allocation": { "devices": { "results": [
                { "request": "gpu", "driver": "d", "pool": "p", "device": "gpu-0" },
            ] } },
            "reservedFor": reserved,
        }));
        assert!(missing_reservations(&allocated, &["uid-a"]).is_empty());
        assert_eq!(
            missing_reservations(&allocated, &["uid-a", "uid-b"]),
            ["uid-b"]
        );
        assert_eq!(allocated_devices(&allocated), ["p/gpu-0"]);
        assert!(allocated_devices(&unallocated).is_empty());
    }

    #[test]
    fn a_pod_state_says_where_it_is_bound_and_why() {
        let pod = |value: Value| -> Pod { serde_json::from_value(value).unwrap() };
        assert_eq!(
            pod_state(&pod(json!({ "metadata": { "name": "p" } }))),
            "not scheduled, no PodScheduled condition (is a kube-scheduler running?)"
        );
        let unschedulable = pod(json!({
            "metadata": { "name": "p" },
            "status": { "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "no devices",
            }] },
        }));
        assert_eq!(
            pod_state(&unschedulable),
            "PodScheduled=False (Unschedulable: no devices)"
        );
        let bound = pod(json!({
            "metadata": { "name": "p" },
            "spec": { "nodeName": "n", "containers": [] },
        }));
        assert_eq!(pod_state(&bound), "bound to n");
    }
}
