//! Allocating a claim through the API, the way the scheduler writes it.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};
use tracing::debug;

use super::{AllocationError, Allocator};

/// Finalizer the scheduler adds before it allocates, so that an allocated claim is not deleted
/// before its devices are released.
const DELETE_PROTECTION_FINALIZER: &str = "resource.kubernetes.io/delete-protection";

/// `status.reservedFor` may list at most this many consumers.
const RESERVED_FOR_MAX: usize = 256;

/// How often [`allocate_claim`] starts over after losing an update race.
const ATTEMPTS: usize = 5;

/// Why [`allocate_claim`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AllocateClaimError {
    /// An API request failed.
    #[error("{action}: {source}")]
    Api {
        /// What was being done, e.g. `get ResourceClaim default/gpu`.
        action: String,
        /// The client error.
        source: kube::Error,
    },
    /// No allocation exists for the claim on the node.
    #[error(transparent)]
    Allocation(#[from] AllocationError),
    /// The claim already lists the maximum number of consumers.
    #[error("claim {claim}: reservedFor already holds {RESERVED_FOR_MAX} consumers")]
    ReservedForFull {
        /// `namespace/name` of the claim.
        claim: String,
    },
    /// Other writers changed the claim every time it was about to be written.
    #[error("claim {claim}: still conflicting after {attempts} attempts")]
    Conflict {
        /// `namespace/name` of the claim.
        claim: String,
        /// How many times it was tried.
        attempts: usize,
    },
    /// The updated claim did not round-trip through JSON (a bug).
    #[error("claim {claim}: the updated object does not encode: {source}")]
    Encode {
        /// `namespace/name` of the claim.
        claim: String,
        /// The serde error.
        source: serde_json::Error,
    },
}

fn api_error(action: impl Into<String>) -> impl FnOnce(kube::Error) -> AllocateClaimError {
    let action = action.into();
    move |source| AllocateClaimError::Api { action, source }
}

fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

/// Allocates a claim for a node through the API and reserves it for a pod, like the scheduler:
/// lists ResourceSlices, DeviceClasses and ResourceClaims (and reads the Node for its labels),
/// computes the allocation with [`Allocator`], adds the
/// `resource.kubernetes.io/delete-protection` finalizer, then writes `status.allocation` and
/// `status.reservedFor` through the status subresource. Every write carries the
/// `resourceVersion` it was computed from; on a conflict it starts over (a few times).
///
/// A claim that is already allocated keeps its allocation and only gets the reservation.
/// `pod` is the consumer's `(name, uid)`; `None` allocates without reserving.
///
/// Against a real cluster, reserve only for pods that exist: its resourceclaim controller
/// removes reservations by pods it cannot find, then the allocation of a claim nobody
/// reserves (the fake API server runs no controller and keeps both). Better still, create the
/// pods and let the real scheduler allocate, as `mock-gpu-demo` does.
///
/// ```no_run
/// # async fn example(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
/// use dra_sdk_allocator::allocate_claim;
///
/// let claim = allocate_claim(&client, "default", "gpu", "node-a", Some(("pod-0", "1234-5678"))).await?;
/// assert!(claim.status.and_then(|status| status.allocation).is_some());
/// # Ok(()) }
/// ```
pub async fn allocate_claim(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    node_name: &str,
    pod: Option<(&str, &str)>,
) -> Result<ResourceClaim, AllocateClaimError> {
    let claim_id = format!("{namespace}/{name}");
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), namespace);
    for attempt in 1..=ATTEMPTS {
        let mut claim = claims
            .get(name)
            .await
            .map_err(api_error(format!("get ResourceClaim {claim_id}")))?;
        let mut status = claim_status(&claim, &claim_id)?;
        let mut changed = false;

        if status.get("allocation").is_none_or(Value::is_null) {
            let allocation = compute_allocation(client, &claim, node_name).await?;
            let finalizers = claim.metadata.finalizers.get_or_insert_with(Vec::new);
            if !finalizers.iter().any(|f| f == DELETE_PROTECTION_FINALIZER) {
                finalizers.push(DELETE_PROTECTION_FINALIZER.to_owned());
                claim = match claims.replace(name, &PostParams::default(), &claim).await {
                    Ok(updated) => updated,
                    Err(error) if is_conflict(&error) => {
                        debug!(claim = %claim_id, attempt, "conflict adding the finalizer, starting over");
                        continue;
                    }
                    Err(error) => {
                        return Err(api_error(format!(
                            "add finalizer to ResourceClaim {claim_id}"
                        ))(error));
                    }
                };
                status = claim_status(&claim, &claim_id)?;
            }
            let encoded =
                serde_json::to_value(&allocation).map_err(|source| AllocateClaimError::Encode {
                    claim: claim_id.clone(),
                    source,
                })?;
            status.insert("allocation".into(), encoded);
            changed = true;
        }

        if let Some((pod_name, pod_uid)) = pod {
            let reserved = status.entry("reservedFor").or_insert_with(|| json!([]));
            if !reserved.is_array() {
                *reserved = json!([]);
            }
            if let Value::Array(consumers) = reserved {
                let listed = consumers
                    .iter()
                    .any(|c| c.get("uid").and_then(Value::as_str) == Some(pod_uid));
                if !listed {
                    if consumers.len() >= RESERVED_FOR_MAX {
                        return Err(AllocateClaimError::ReservedForFull { claim: claim_id });
                    }
                    // The core API group is the empty string, which the API omits.
                    consumers.push(json!({ "resource": "pods", "name": pod_name, "uid": pod_uid }));
                    changed = true;
                }
            }
        }

        if !changed {
            return Ok(claim);
        }
        let mut object =
            serde_json::to_value(&claim).map_err(|source| AllocateClaimError::Encode {
                claim: claim_id.clone(),
                source,
            })?;
        if let Value::Object(fields) = &mut object {
            fields.insert("status".into(), Value::Object(status));
        }
        let updated: ResourceClaim =
            serde_json::from_value(object).map_err(|source| AllocateClaimError::Encode {
                claim: claim_id.clone(),
                source,
            })?;
        match claims
            .replace_status(name, &PostParams::default(), &updated)
            .await
        {
            Ok(written) => return Ok(written),
            Err(error) if is_conflict(&error) => {
                debug!(claim = %claim_id, attempt, "conflict writing the status, starting over");
            }
            Err(error) => {
                return Err(api_error(format!(
                    "update status of ResourceClaim {claim_id}"
                ))(error));
            }
        }
    }
    Err(AllocateClaimError::Conflict {
        claim: claim_id,
        attempts: ATTEMPTS,
    })
}

fn claim_status(
    claim: &ResourceClaim,
    claim_id: &str,
) -> Result<serde_json::Map<String, Value>, AllocateClaimError> {
    match serde_json::to_value(&claim.status) {
        Ok(Value::Object(status)) => Ok(status),
        Ok(_) => Ok(serde_json::Map::new()),
        Err(source) => Err(AllocateClaimError::Encode {
            claim: claim_id.to_owned(),
            source,
        }),
    }
}

async fn compute_allocation(
    client: &kube::Client,
    claim: &ResourceClaim,
    node_name: &str,
) -> Result<k8s_openapi::api::resource::v1::AllocationResult, AllocateClaimError> {
    let list = ListParams::default();
    let slices_api: Api<ResourceSlice> = Api::all(client.clone());
    let classes_api: Api<DeviceClass> = Api::all(client.clone());
    let claims_api: Api<ResourceClaim> = Api::all(client.clone());
    let nodes_api: Api<Node> = Api::all(client.clone());
    let (slices, classes, claims, node) = futures::try_join!(
        async {
            slices_api
                .list(&list)
                .await
                .map_err(api_error("list ResourceSlices"))
        },
        async {
            classes_api
                .list(&list)
                .await
                .map_err(api_error("list DeviceClasses"))
        },
        async {
            claims_api
                .list(&list)
                .await
                .map_err(api_error("list ResourceClaims"))
        },
        async {
            nodes_api
                .get_opt(node_name)
                .await
                .map_err(api_error(format!("get Node {node_name}")))
        },
    )?;
    let allocator =
        Allocator::new(&slices.items, &classes.items, &claims.items).with_nodes(node.as_slice());
    Ok(allocator.allocate(claim, node_name)?)
}
