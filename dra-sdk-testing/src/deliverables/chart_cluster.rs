//! Helm chart checks on a real API server, shared by the chart e2e tests of every driver in
//! this repository (next to [`chart`](super::chart)): a strict
//! server-side apply of rendered objects, service account tokens bound to a pod on a node (as
//! the kubelet mounts them) and kubeconfigs for them, and the slice writes a
//! ValidatingAdmissionPolicy must deny.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::e2e::workload::ClaimSource;
use crate::e2e::{ManagedProcess, RealCluster, workload};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

use super::chart::describe;

/// How long a wait for the API server or a plugin may take.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// The start of a chart e2e test: the `helm` binary
/// ([`helm_or_skip`](super::chart::helm_or_skip)), a real cluster of two nodes (`node-1`,
/// `node-2`) and an admin client of it; `None`, after printing why the test is skipped,
/// without `HELM` or the Kubernetes binaries.
pub async fn start_chart_cluster() -> Option<(PathBuf, RealCluster, kube::Client)> {
    let helm = super::chart::helm_or_skip()?;
    let binaries = crate::e2e::binaries_or_skip()?;
    let cluster = RealCluster::builder(binaries)
        .nodes(["node-1", "node-2"])
        .start()
        .await
        .unwrap_or_else(|error| panic!("starting the e2e cluster: {error}"));
    let admin = cluster.client().await.unwrap();
    Some((helm, cluster, admin))
}

/// Server-side apply of each object with `fieldValidation=Strict`, which fails on any field
/// the server does not know; a control object with a misspelled field must fail.
pub async fn apply_strictly(client: &kube::Client, documents: &[Value]) {
    let params = PatchParams::apply("dra-sdk-chart-e2e").validation_strict();
    for document in documents {
        let (api, name) = dynamic_api(client, document).await;
        api.patch(&name, &params, &Patch::Apply(document))
            .await
            .unwrap_or_else(|error| panic!("{}: {error}", describe(document)));
    }
    let mut bad = documents
        .iter()
        .find(|d| d["kind"] == "DeviceClass")
        .unwrap()
        .clone();
    bad["spec"]["selector"] = json!([]);
    let (api, name) = dynamic_api(client, &bad).await;
    let error = api
        .patch(&name, &params, &Patch::Apply(&bad))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("selector"), "{error}");
}

/// A dynamic API for the object `document` describes, discovered on the server, and the
/// object's name.
pub async fn dynamic_api(client: &kube::Client, document: &Value) -> (Api<DynamicObject>, String) {
    let api_version = document["apiVersion"].as_str().unwrap();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, document["kind"].as_str().unwrap());
    let (resource, capabilities) = kube::discovery::pinned_kind(client, &gvk).await.unwrap();
    let name = document["metadata"]["name"].as_str().unwrap().to_owned();
    let api = match (
        capabilities.scope,
        document["metadata"]["namespace"].as_str(),
    ) {
        (kube::discovery::Scope::Namespaced, Some(namespace)) => {
            Api::namespaced_with(client.clone(), namespace, &resource)
        }
        _ => Api::all_with(client.clone(), &resource),
    };
    (api, name)
}

/// A pod of `service_account` bound to `node` (no scheduler involved), to bind a token to.
pub async fn holder_pod(
    client: &kube::Client,
    namespace: &str,
    service_account: &str,
    node: &str,
) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": format!("token-holder-{node}"), "namespace": namespace },
        "spec": {
            "nodeName": node,
            "serviceAccountName": service_account,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "containers": [{ "name": "pause", "image": workload::POD_IMAGE }],
        },
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
}

/// A token of the ServiceAccount from the TokenRequest API, bound to `pod` if given.
pub async fn request_token(
    client: &kube::Client,
    namespace: &str,
    service_account: &str,
    pod: Option<&Pod>,
) -> String {
    // Through JSON: the spec's fields differ between Kubernetes releases of the types.
    let mut spec = json!({ "expirationSeconds": 3600 });
    if let Some(pod) = pod {
        spec["boundObjectRef"] = json!({
            "apiVersion": "v1", "kind": "Pod",
            "name": pod.metadata.name, "uid": pod.metadata.uid,
        });
    }
    let request: TokenRequest = serde_json::from_value(
        json!({ "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec }),
    )
    .unwrap();
    let answer = Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request(service_account, &PostParams::default(), &request)
        .await
        .unwrap();
    serde_json::to_value(answer).unwrap()["status"]["token"]
        .as_str()
        .expect("a token in the TokenRequest's status")
        .to_owned()
}

/// A kubeconfig for the cluster that authenticates with `token`.
pub fn token_kubeconfig(cluster: &RealCluster, token: &str, name: &str) -> PathBuf {
    let admin: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(cluster.kubeconfig()).unwrap()).unwrap();
    let cluster_entry = serde_json::to_string(&admin["clusters"][0]["cluster"]).unwrap();
    let path = cluster.path().join(format!("{name}.kubeconfig"));
    // JSON is YAML: no escaping to get wrong.
    let text = format!(
        r#"{{"apiVersion": "v1", "kind": "Config",
  "clusters": [{{"name": "e2e", "cluster": {cluster_entry}}}],
  "users": [{{"name": "{name}", "user": {{"token": "{token}"}}}}],
  "contexts": [{{"name": "e2e", "context": {{"cluster": "e2e", "user": "{name}"}}}}],
  "current-context": "e2e"}}"#
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// The name of the first ServiceAccount among a chart's rendered `documents` (the plugin's).
pub fn service_account_name(documents: &[Value]) -> String {
    documents
        .iter()
        .find(|d| d["kind"] == "ServiceAccount")
        .and_then(|d| d["metadata"]["name"].as_str())
        .expect("a ServiceAccount among the rendered objects")
        .to_owned()
}

/// A kubeconfig with a token of the chart's ServiceAccount (in rendered `documents`, applied
/// in `namespace`) bound to a pod on `node` ([`holder_pod`], [`request_token`],
/// [`token_kubeconfig`] named `<service account>-<node>`), like the one the kubelet mounts
/// into the plugin's pod there: the token names the node.
pub async fn node_bound_kubeconfig(
    cluster: &RealCluster,
    client: &kube::Client,
    namespace: &str,
    documents: &[Value],
    node: &str,
) -> PathBuf {
    let service_account = service_account_name(documents);
    let holder = holder_pod(client, namespace, &service_account, node).await;
    let bound = request_token(client, namespace, &service_account, Some(&holder)).await;
    token_kubeconfig(cluster, &bound, &format!("{service_account}-{node}"))
}

/// A client for the cluster and credentials of a kubeconfig file.
pub async fn client_from(kubeconfig: &Path) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// The slices of `driver` on `node` once `done` holds for them (or an error after `TIMEOUT`).
pub async fn wait_for_slices(
    client: &kube::Client,
    driver: &str,
    node: &str,
    done: impl Fn(&[ResourceSlice]) -> bool,
) -> Result<Vec<ResourceSlice>, String> {
    let api = Api::<ResourceSlice>::all(client.clone());
    let params =
        ListParams::default().fields(&format!("spec.nodeName={node},spec.driver={driver}"));
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let slices = api.list(&params).await.map_err(|e| e.to_string())?.items;
        if done(&slices) {
            return Ok(slices);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{} slices of {node}, not the expected ones",
                slices.len()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A ResourceSlice of one device for `node` and `driver`.
pub fn slice(name: &str, node: &str, driver: &str) -> ResourceSlice {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": { "name": name },
        "spec": {
            "driver": driver, "nodeName": node,
            "pool": { "name": node, "generation": 1, "resourceSliceCount": 1 },
            "devices": [{ "name": "gpu-x" }],
        },
    }))
    .unwrap()
}

/// Creates `slice` as `client` and returns the API server's refusal. The policy takes effect
/// a moment after it is created: a write that got through before is undone and retried.
pub async fn write_denied(
    client: &kube::Client,
    admin: &kube::Client,
    slice: ResourceSlice,
) -> String {
    let name = slice.metadata.name.clone().unwrap();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match Api::<ResourceSlice>::all(client.clone())
            .create(&PostParams::default(), &slice)
            .await
        {
            Err(error) => return error.to_string(),
            Ok(_) => {
                Api::<ResourceSlice>::all(admin.clone())
                    .delete(&name, &DeleteParams::default())
                    .await
                    .unwrap();
                assert!(
                    Instant::now() < deadline,
                    "writing slice {name} was never denied"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Panics unless the chart's ValidatingAdmissionPolicy confines `as_plugin` (a client with a
/// token bound to a pod on `node-1`) to node-1's slices of `driver`: writing a slice of
/// node-2, or one of another driver on node-1, is denied ([`write_denied`]) with the policy's
/// message.
pub async fn assert_slice_writes_confined(
    as_plugin: &kube::Client,
    admin: &kube::Client,
    driver: &str,
) {
    let denied = write_denied(as_plugin, admin, slice("other-node", "node-2", driver)).await;
    assert!(
        denied.contains("may only write ResourceSlices of its own node"),
        "{denied}"
    );
    let denied = write_denied(
        as_plugin,
        admin,
        slice("other-driver", "node-1", "x.example.com"),
    )
    .await;
    assert!(denied.contains(&format!("of driver {driver}")), "{denied}");
}

/// Creates the ResourceClaimTemplate `name` asking for one device of `device_class`.
pub async fn create_claim_template(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
    device_class: &str,
) {
    let template = workload::claim_template(namespace, name, device_class, Value::Null, None)
        .expect("a valid template");
    Api::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &template)
        .await
        .expect("creating the claim template");
}

/// Starts pod `name` on node-1 with a claim from `template` and waits until it runs; on failure
/// the panic shows the tail of `plugin`'s log.
pub async fn run_pod(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
    template: &str,
    plugin: &ManagedProcess,
) {
    let pod = workload::pod_using(
        namespace,
        name,
        "node-1",
        &ClaimSource::Template(template.into()),
        &["ctr"],
    );
    Api::<Pod>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &pod)
        .await
        .expect("creating the pod");
    workload::wait_for_pod_running(admin, namespace, name, TIMEOUT)
        .await
        .unwrap_or_else(|error| panic!("{error}; plugin log:\n{}", plugin.log_tail(30)));
}
