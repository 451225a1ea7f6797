//! Deleting what a demo created: its Pods (waiting for the kubelet, forcing when none
//! confirms), claims (dropping the delete-protection finalizer of stuck ones), templates,
//! DeviceClasses and the plugin's ResourceSlices.

use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};

use super::target::Stage;
use super::{DemoError, POLL};

/// The finalizer the scheduler (or the SDK's allocator) adds when it allocates.
const DELETE_PROTECTION_FINALIZER: &str = "resource.kubernetes.io/delete-protection";
/// How long force-deleted Pods get to disappear.
const FORCED_POD_DELETION: Duration = Duration::from_secs(15);

/// How many objects of each kind a removal deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Removed {
    pub(crate) pods: usize,
    pub(crate) claims: usize,
    pub(crate) templates: usize,
}

/// Deletes the demo's Pods, then its claims, then (when the demo uses them) its templates.
pub(crate) async fn remove_workloads(stage: &Stage, templates: bool) -> Result<Removed, DemoError> {
    let pods = remove_pods(stage).await?;
    let claims = remove_claims(stage).await?;
    let templates = if templates {
        remove_templates(stage).await?
    } else {
        0
    };
    Ok(Removed {
        pods,
        claims,
        templates,
    })
}

/// Deletes the demo's Pods and waits until they are gone: the node's kubelet confirms the
/// deletion of a scheduled Pod. Pods still there after the stage's timeout (a node without a
/// working kubelet) are force-deleted.
async fn remove_pods(stage: &Stage) -> Result<usize, DemoError> {
    let pods = stage.pods();
    let list = || async {
        pods.list(&stage.label_selector())
            .await
            .map_err(DemoError::api("listing the demo's Pods"))
    };
    let listed = list().await?.items;
    for name in listed.iter().filter_map(|pod| pod.metadata.name.as_deref()) {
        ignore_not_found(pods.delete(name, &DeleteParams::default()).await)
            .map_err(DemoError::api(format!("deleting pod {name}")))?;
    }
    let timeout = stage.timeout();
    let mut deadline = Instant::now() + timeout;
    let mut forced = false;
    loop {
        let left = list().await?.items;
        if left.is_empty() {
            return Ok(listed.len());
        }
        if Instant::now() >= deadline {
            let names = names(&left);
            if forced {
                return Err(DemoError::Stuck(format!(
                    "pods {} are still there after their forced deletion",
                    names.join(", ")
                )));
            }
            tracing::warn!(
                "pods {} still there {timeout:?} after their deletion (no kubelet confirmed it); \
                 forcing it",
                names.join(", ")
            );
            for name in names {
                ignore_not_found(
                    pods.delete(name, &DeleteParams::default().grace_period(0))
                        .await,
                )
                .map_err(DemoError::api(format!("force-deleting pod {name}")))?;
            }
            forced = true;
            deadline = Instant::now() + FORCED_POD_DELETION;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Deletes the demo's claims and waits until they are gone. Normally the cluster's
/// resourceclaim controller deallocates a deleted claim no Pod uses any more and drops its
/// delete-protection finalizer; a claim still there the stage's `stuck_after` after the
/// deletion (no controller: the embedded cluster, an API server alone) loses the finalizer to
/// the demo.
async fn remove_claims(stage: &Stage) -> Result<usize, DemoError> {
    let claims = stage.claims();
    let list = || async {
        claims
            .list(&stage.label_selector())
            .await
            .map_err(DemoError::api("listing the demo's ResourceClaims"))
    };
    let listed = list().await?.items;
    for name in names(&listed) {
        ignore_not_found(claims.delete(name, &DeleteParams::default()).await)
            .map_err(DemoError::api(format!("deleting claim {name}")))?;
    }
    let start = Instant::now();
    let stuck_after = stage.stuck_after();
    loop {
        let left = list().await?.items;
        if left.is_empty() {
            return Ok(listed.len());
        }
        let waited = start.elapsed();
        if waited >= stuck_after + stage.timeout() {
            return Err(DemoError::Stuck(format!(
                "claims {} are still there {waited:.1?} after their deletion (finalizers other \
                 than {DELETE_PROTECTION_FINALIZER}?)",
                names(&left).join(", ")
            )));
        }
        if waited >= stuck_after {
            for claim in &left {
                drop_finalizer(&claims, claim).await?;
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Removes the delete-protection finalizer of a deleted claim; a conflict is left for the
/// next round.
async fn drop_finalizer(
    claims: &Api<ResourceClaim>,
    claim: &ResourceClaim,
) -> Result<(), DemoError> {
    let Some(name) = claim.metadata.name.as_deref() else {
        return Ok(());
    };
    let Some(kept) = finalizers_without_protection(claim) else {
        return Ok(());
    };
    let patch = serde_json::json!({ "metadata": {
        "finalizers": kept,
        "resourceVersion": claim.metadata.resource_version,
    }});
    match claims
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        Err(error) => Err(DemoError::api(format!(
            "removing the finalizer of claim {name}"
        ))(error)),
    }
}

/// The finalizers a deleted claim keeps once the delete-protection one is dropped; `None` when
/// there is nothing to drop (not deleted, or no such finalizer).
fn finalizers_without_protection(claim: &ResourceClaim) -> Option<Vec<String>> {
    let finalizers = claim.metadata.finalizers.as_ref()?;
    if claim.metadata.deletion_timestamp.is_none()
        || !finalizers.iter().any(|f| f == DELETE_PROTECTION_FINALIZER)
    {
        return None;
    }
    Some(
        finalizers
            .iter()
            .filter(|f| *f != DELETE_PROTECTION_FINALIZER)
            .cloned()
            .collect(),
    )
}

/// Deletes the demo's ResourceClaimTemplates (the claims made from them go with their Pods).
async fn remove_templates(stage: &Stage) -> Result<usize, DemoError> {
    let deleted = stage
        .templates()
        .delete_collection(&DeleteParams::default(), &stage.label_selector())
        .await
        .map_err(DemoError::api("deleting the demo's ResourceClaimTemplates"))?;
    Ok(deleted.left().map_or(0, |list| list.items.len()))
}

/// Deletes those of the DeviceClasses `names` the demo created (labelled so); returns how many.
/// A class of the same name from elsewhere (a chart's) is left alone.
pub(crate) async fn remove_device_classes(
    stage: &Stage,
    names: &[String],
) -> Result<usize, DemoError> {
    let classes: Api<DeviceClass> = Api::all(stage.client().clone());
    let mut removed = 0;
    for name in names {
        let Some(class) = classes
            .get_opt(name)
            .await
            .map_err(DemoError::api(format!("reading DeviceClass {name}")))?
        else {
            continue;
        };
        if stage.is_ours(class.metadata.labels.as_ref()) {
            ignore_not_found(classes.delete(name, &DeleteParams::default()).await)
                .map_err(DemoError::api(format!("deleting DeviceClass {name}")))?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Deletes the plugin's ResourceSlices: on a real cluster no kubelet knows this plugin, so
/// none would remove them once it is gone.
pub(crate) async fn remove_slices(stage: &Stage, driver_name: &str) -> Result<(), DemoError> {
    let slices: Api<ResourceSlice> = Api::all(stage.client().clone());
    slices
        .delete_collection(
            &DeleteParams::default(),
            &slice_selector(driver_name, stage.node()),
        )
        .await
        .map_err(DemoError::api("deleting the demo's ResourceSlices"))?;
    Ok(())
}

/// Selects the ResourceSlices `driver_name` publishes for `node`.
pub(crate) fn slice_selector(driver_name: &str, node: &str) -> ListParams {
    ListParams::default().fields(&format!("spec.driver={driver_name},spec.nodeName={node}"))
}

fn names<K: kube::Resource>(objects: &[K]) -> Vec<&str> {
    objects
        .iter()
        .filter_map(|object| object.meta().name.as_deref())
        .collect()
}

fn ignore_not_found<T>(result: kube::Result<T>) -> kube::Result<()> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(deleted: bool, finalizers: &[&str]) -> ResourceClaim {
        let mut metadata = serde_json::json!({ "name": "c", "finalizers": finalizers });
        if deleted {
            metadata["deletionTimestamp"] = "2025-01-01T00:00:00Z".into();
        }
        serde_json::from_value(serde_json::json!({ "metadata": metadata, "spec": {} })).unwrap()
    }

    #[test]
    fn only_a_deleted_claim_loses_the_delete_protection_finalizer() {
        let other = "example.com/other";
        assert_eq!(
            finalizers_without_protection(&claim(true, &[DELETE_PROTECTION_FINALIZER, other])),
            Some(vec![other.to_owned()])
        );
        assert_eq!(
            finalizers_without_protection(&claim(false, &[DELETE_PROTECTION_FINALIZER])),
            None
        );
        assert_eq!(finalizers_without_protection(&claim(true, &[other])), None);
    }

    #[test]
    fn slices_are_selected_by_driver_and_node() {
        let params = slice_selector("gpu.example.com", "node-a");
        assert_eq!(
            params.field_selector.as_deref(),
            Some("spec.driver=gpu.example.com,spec.nodeName=node-a")
        );
    }
}
