//! Pods that use claims, and waiting for what the kubelet does with them: the pieces the
//! [suite](super::suite) is made of, for a driver's own end-to-end tests.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Container, Event, Pod, PodResourceClaim, PodSpec, ResourceClaim as ContainerClaim,
    ResourceRequirements,
};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimTemplate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, ListParams};

use super::{E2eError, api_error};

/// The image of the pods made here. The CRI double never pulls it.
pub const POD_IMAGE: &str = "registry.k8s.io/pause:3.10";

/// Where a pod's claim comes from.
#[derive(Clone, Debug)]
pub enum ClaimSource {
    /// A claim made for the pod from this ResourceClaimTemplate.
    Template(String),
    /// This existing ResourceClaim, which other pods may share.
    Claim(String),
}

/// A pod for `node` with one claim, named `dev`, from `source`, used by every container.
/// The pod mounts no service-account token (nothing for the kubelet to mount on a test
/// machine) and is deleted without grace.
pub fn pod_using(
    namespace: &str,
    name: &str,
    node: &str,
    source: &ClaimSource,
    containers: &[&str],
) -> Pod {
    let (template, claim) = match source {
        ClaimSource::Template(template) => (Some(template.clone()), None),
        ClaimSource::Claim(claim) => (None, Some(claim.clone())),
    };
    let containers = containers
        .iter()
        .map(|container| Container {
            name: (*container).to_owned(),
            image: Some(POD_IMAGE.to_owned()),
            resources: Some(ResourceRequirements {
                claims: Some(vec![ContainerClaim {
                    name: "dev".to_owned(),
                    ..ContainerClaim::default()
                }]),
                ..ResourceRequirements::default()
            }),
            ..Container::default()
        })
        .collect();
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_selector: Some([("kubernetes.io/hostname".to_owned(), node.to_owned())].into()),
            automount_service_account_token: Some(false),
            termination_grace_period_seconds: Some(0),
            resource_claims: Some(vec![PodResourceClaim {
                name: "dev".to_owned(),
                resource_claim_template_name: template,
                resource_claim_name: claim,
            }]),
            containers,
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// A DeviceClass `name` selecting every device of `driver`, narrowed by `selector` (CEL) if
/// given.
///
/// # Errors
///
/// Never for a valid name; built through JSON so that it is the same for every Kubernetes
/// version of the API types (`spec` is optional in some).
pub fn device_class(
    name: &str,
    driver: &str,
    selector: Option<&str>,
) -> Result<DeviceClass, serde_json::Error> {
    let mut selectors = vec![
        serde_json::json!({ "cel": { "expression": format!("device.driver == {driver:?}") } }),
    ];
    if let Some(expression) = selector {
        selectors.push(serde_json::json!({ "cel": { "expression": expression } }));
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": { "name": name },
        "spec": { "selectors": selectors },
    }))
}

/// A ResourceClaimTemplate `namespace/name` whose claims have one request, `dev`, for one
/// device of `class`, narrowed by the `exactly` fields given (`selectors`, `capacity`, `count`,
/// ...; `deviceClassName` is set here), with `config` (the claim's `devices.config`) if given.
///
/// # Errors
///
/// When `exactly` or `config` hold fields that are not those of the API.
pub fn claim_template(
    namespace: &str,
    name: &str,
    class: &str,
    exactly: serde_json::Value,
    config: Option<serde_json::Value>,
) -> Result<ResourceClaimTemplate, serde_json::Error> {
    let mut exactly = match exactly {
        serde_json::Value::Null => serde_json::json!({}),
        other => other,
    };
    exactly["deviceClassName"] = serde_json::json!(class);
    let mut devices = serde_json::json!({ "requests": [{ "name": "dev", "exactly": exactly }] });
    if let Some(config) = config {
        devices["config"] = config;
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": { "name": name, "namespace": namespace },
        "spec": { "spec": { "devices": devices } },
    }))
}

/// The pod's events, one line each: `<type> <reason>: <message>`.
pub async fn pod_events(client: &kube::Client, namespace: &str, pod: &str) -> Vec<String> {
    let events = Api::<Event>::namespaced(client.clone(), namespace);
    let params = ListParams::default().fields(&format!("involvedObject.name={pod}"));
    match events.list(&params).await {
        Ok(list) => list
            .items
            .into_iter()
            .map(|event| {
                format!(
                    "{} {}: {}",
                    event.type_.unwrap_or_default(),
                    event.reason.unwrap_or_default(),
                    event.message.unwrap_or_default()
                )
            })
            .collect(),
        Err(error) => vec![format!("(listing events: {error})")],
    }
}

/// Waits until the pod runs; on timeout the error gives its phase and events.
pub async fn wait_for_pod_running(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> Result<Pod, E2eError> {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace);
    let deadline = Instant::now() + timeout;
    loop {
        let pod = pods
            .get(name)
            .await
            .map_err(api_error(format!("get Pod {namespace}/{name}")))?;
        let phase = pod.status.as_ref().and_then(|status| status.phase.clone());
        if phase.as_deref() == Some("Running") {
            return Ok(pod);
        }
        if Instant::now() > deadline {
            return Err(E2eError::Timeout {
                what: format!(
                    "pod {namespace}/{name} to run (it is {}; events: {})",
                    phase.as_deref().unwrap_or("without a phase"),
                    pod_events(client, namespace, name).await.join(" | ")
                ),
                timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until some event of the pod contains `text`, and returns it.
pub async fn wait_for_pod_event(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    text: &str,
    timeout: Duration,
) -> Result<String, E2eError> {
    let deadline = Instant::now() + timeout;
    loop {
        let events = pod_events(client, namespace, name).await;
        if let Some(event) = events.iter().find(|event| event.contains(text)) {
            return Ok(event.clone());
        }
        if Instant::now() > deadline {
            return Err(E2eError::Timeout {
                what: format!(
                    "an event of pod {namespace}/{name} mentioning {text:?} (events: {})",
                    events.join(" | ")
                ),
                timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Deletes pods without grace and waits until they are gone.
pub async fn delete_pods(
    client: &kube::Client,
    namespace: &str,
    names: &[&str],
    timeout: Duration,
) -> Result<(), E2eError> {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace);
    for name in names {
        match pods
            .delete(name, &DeleteParams::default().grace_period(0))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(api_error(format!("delete Pod {namespace}/{name}"))(error)),
        }
    }
    let deadline = Instant::now() + timeout;
    for name in names {
        while pods.get_opt(name).await.ok().flatten().is_some() {
            if Instant::now() > deadline {
                return Err(E2eError::Timeout {
                    what: format!("pod {namespace}/{name} to be deleted"),
                    timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}
