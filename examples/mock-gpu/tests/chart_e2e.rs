//! The Helm chart on a real v1.36.2 API server (the SDK's e2e harness): every object `helm
//! template` renders is accepted by a server-side apply with strict field validation; then the
//! plugin binary runs with a token of the chart's ServiceAccount bound to a pod on its node,
//! as the kubelet would mount it: it publishes, updates and deletes its own node's slices and
//! prepares a claim for a pod (each RBAC verb of the chart used), while the chart's
//! ValidatingAdmissionPolicy denies it any write to another node's or another driver's slice,
//! and any write with a token that names no node. Device status (KEP-4817) under 1.36's
//! granular authorization: without `deviceStatus: true` the chart grants no status write, the
//! plugin's write is refused with a message saying what to grant and the pod runs all the
//! same; with it, exactly the chart's rules let the plugin write the status of claims on its
//! node, and no other node's. Needs `HELM` and `DRA_E2E_K8S_BIN`.

/// The chart checks on a real API server every driver's chart e2e test shares.
mod support;
use dra_sdk_testing::assert_contains;
use dra_sdk_testing::deliverables::chart_cluster as shared_e2e;

use std::path::Path;

use dra_sdk_testing::e2e::{RealCluster, workload};
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use shared_e2e::{
    TIMEOUT, apply_strictly, assert_slice_writes_confined, client_from, create_claim_template,
    node_bound_kubeconfig, request_token, run_pod, service_account_name, slice,
    start_chart_cluster, token_kubeconfig, write_denied,
};
use support::chart::render;

const RELEASE: &str = "mock-gpu";
const DRIVER: &str = "gpu.example.com";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_installs_and_confines_the_plugin_to_its_node() {
    let Some((helm, cluster, admin)) = start_chart_cluster().await else {
        return;
    };
    let namespace = cluster.create_namespace("chart").await.unwrap();

    // The DaemonSet selects no node here: its pods would need the image, and its host paths
    // would be this machine's. The plugin runs as a process below, with the pod's identity.
    let documents = render(
        &helm,
        RELEASE,
        &namespace,
        &[
            "--set",
            "kubeletPlugin.nodeSelector.dra-sdk\\.dev/chart-e2e=never",
        ],
    )
    .unwrap();
    apply_strictly(&admin, &documents).await;
    let service_account = service_account_name(&documents);
    // A token for the ServiceAccount bound to a pod on node-1, like the one the kubelet mounts
    // into the plugin's pod: it names the node.
    let kubeconfig =
        node_bound_kubeconfig(&cluster, &admin, &namespace, &documents, "node-1").await;
    let node = cluster.node("node-1").unwrap();

    // 130 devices need several slices: create.
    let mut plugin = spawn_plugin(&cluster, "plugin-a", &kubeconfig, 130, &[]);
    let slices = wait_for_slices(&admin, "node-1", |s| {
        s.len() >= 2
            && s.iter()
                .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
                .sum::<usize>()
                == 130
    })
    .await
    .unwrap_or_else(|error| panic!("{error}; plugin log:\n{}", plugin.log_tail(30)));
    // The owner reference needs the Node's UID: `get` on nodes was used.
    for slice in &slices {
        let owner = &slice.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("Node", "node-1")
        );
        assert!(!owner.uid.is_empty());
    }
    let first: Vec<_> = slices
        .iter()
        .map(|s| (s.metadata.name.clone(), s.metadata.resource_version.clone()))
        .collect();
    plugin.stop();

    // Restarted with 4: one slice updated, the others deleted. It reports device status,
    // which the chart's default RBAC does not allow yet.
    let mut plugin = spawn_plugin(&cluster, "plugin-b", &kubeconfig, 4, &["--device-status"]);
    let slices = wait_for_slices(&admin, "node-1", |s| {
        s.len() == 1 && s[0].spec.devices.as_ref().is_some_and(|d| d.len() == 4)
    })
    .await
    .unwrap_or_else(|error| panic!("{error}; plugin log:\n{}", plugin.log_tail(30)));
    // The same slice, rewritten (`update`); the others are gone (`delete`).
    let kept = &slices[0].metadata;
    let before = first.iter().find(|(name, _)| *name == kept.name);
    let (_, version) = before.expect("the remaining slice is one of the first ones, updated");
    assert_ne!(*version, kept.resource_version);
    node.wait_for_registration(DRIVER, 0, TIMEOUT)
        .await
        .unwrap_or_else(|error| panic!("{error}; plugin log:\n{}", plugin.log_tail(30)));

    // A pod with a claim from the chart's DeviceClass: the plugin reads the claim (get) to
    // prepare it.
    create_claim_template(&admin, &namespace, "one-gpu", DRIVER).await;
    run_pod(&admin, &namespace, "uses-a-gpu", "one-gpu", &plugin).await;
    // Prepared, though the status write was refused: the log says what to grant.
    let claim = pod_claim(&admin, &namespace, "uses-a-gpu").await;
    assert!(
        claim
            .status
            .as_ref()
            .and_then(|s| s.devices.as_ref())
            .is_none_or(Vec::is_empty)
    );
    let log = plugin.log_tail(60);
    assert!(
        log.contains("associated-node:patch") && log.contains("resourceclaims/driver"),
        "{log}"
    );

    // `deviceStatus: true` adds the rules; the next claim's status is written.
    let with_status = render(
        &helm,
        RELEASE,
        &namespace,
        &[
            "--set",
            "kubeletPlugin.nodeSelector.dra-sdk\\.dev/chart-e2e=never",
            "--set",
            "kubeletPlugin.deviceStatus=true",
        ],
    )
    .unwrap();
    apply_strictly(&admin, &with_status).await;
    wait_until_allowed(
        &admin,
        &namespace,
        &service_account,
        "associated-node:patch",
    )
    .await;
    run_pod(&admin, &namespace, "reports-status", "one-gpu", &plugin).await;
    let claim = pod_claim(&admin, &namespace, "reports-status").await;
    let devices = claim.status.and_then(|s| s.devices).unwrap_or_default();
    assert_eq!(
        devices.len(),
        1,
        "{devices:?}; plugin log:\n{}",
        plugin.log_tail(30)
    );
    assert_eq!(devices[0].driver, DRIVER);
    assert_eq!(devices[0].pool, "node-1");
    let ready = &devices[0].conditions.as_ref().unwrap()[0];
    assert_eq!(
        (ready.type_.as_str(), ready.status.as_str()),
        ("Ready", "True")
    );
    // The same grant does not reach a claim allocated on another node.
    let refused = status_write_on_node_2(&admin, &namespace, &kubeconfig).await;
    assert_contains(&refused, "arbitrary-node:patch");

    // The policy: the same token may not touch node-2's slices or another driver's.
    let as_plugin = client_from(&kubeconfig).await;
    assert_slice_writes_confined(&as_plugin, &admin, DRIVER).await;
    // Nor delete another node's slice that an admin created.
    let slices_api = Api::<ResourceSlice>::all(admin.clone());
    slices_api
        .create(
            &PostParams::default(),
            &slice("node-2-slice", "node-2", DRIVER),
        )
        .await
        .unwrap();
    let error = Api::<ResourceSlice>::all(as_plugin.clone())
        .delete("node-2-slice", &DeleteParams::default())
        .await
        .expect_err("the plugin deleted node-2's slice");
    assert!(error.to_string().contains("its own node"), "{error}");
    slices_api
        .delete("node-2-slice", &DeleteParams::default())
        .await
        .unwrap();

    // A token of the same ServiceAccount bound to no pod names no node: no slice writes.
    let unbound = request_token(&admin, &namespace, &service_account, None).await;
    let unbound = client_from(&token_kubeconfig(&cluster, &unbound, "plugin-unbound")).await;
    let denied = write_denied(&unbound, &admin, slice("unbound", "node-1", DRIVER)).await;
    assert_contains(&denied, "the token has no node name");

    workload::delete_pods(
        &admin,
        &namespace,
        &["uses-a-gpu", "reports-status"],
        TIMEOUT,
    )
    .await
    .unwrap();
    plugin.stop();
}

fn spawn_plugin(
    cluster: &RealCluster,
    name: &str,
    kubeconfig: &Path,
    devices: u32,
    extra: &[&str],
) -> dra_sdk_testing::e2e::ManagedProcess {
    let mut args = cluster.node("node-1").unwrap().plugin_args(kubeconfig);
    args.extend(["--num-devices".into(), devices.to_string()]);
    args.extend(extra.iter().map(|arg| (*arg).to_owned()));
    cluster
        .spawn_program(
            name,
            Path::new(env!("CARGO_BIN_EXE_mock-gpu-kubelet-plugin")),
            &args,
        )
        .unwrap()
}

/// The driver's slices of `node` once `done` holds for them.
async fn wait_for_slices(
    client: &kube::Client,
    node: &str,
    done: impl Fn(&[ResourceSlice]) -> bool,
) -> Result<Vec<ResourceSlice>, String> {
    shared_e2e::wait_for_slices(client, DRIVER, node, done).await
}

/// The claim the pod's template made for it.
async fn pod_claim(client: &kube::Client, namespace: &str, pod: &str) -> ResourceClaim {
    let pod = Api::<Pod>::namespaced(client.clone(), namespace)
        .get(pod)
        .await
        .unwrap();
    let name = pod
        .status
        .and_then(|s| s.resource_claim_statuses)
        .and_then(|s| s.into_iter().next())
        .and_then(|s| s.resource_claim_name)
        .expect("the pod's claim");
    Api::<ResourceClaim>::namespaced(client.clone(), namespace)
        .get(&name)
        .await
        .unwrap()
}

/// Waits until RBAC lets the ServiceAccount use `verb` on this driver's `resourceclaims/driver`
/// (the authorizer's cache follows role changes within moments).
async fn wait_until_allowed(client: &kube::Client, namespace: &str, account: &str, verb: &str) {
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {
            "user": format!("system:serviceaccount:{namespace}:{account}"),
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{namespace}"),
                       "system:authenticated"],
            "resourceAttributes": { "group": "resource.k8s.io", "resource": "resourceclaims",
                                    "subresource": "driver", "name": DRIVER,
                                    "namespace": namespace, "verb": verb },
        },
    }))
    .unwrap();
    let api = Api::<SubjectAccessReview>::all(client.clone());
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let answer = api.create(&PostParams::default(), &review).await.unwrap();
        if answer.status.is_some_and(|s| s.allowed) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{verb} never allowed");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// What the server answers the plugin's token for a status write to a claim allocated on
/// node-2.
async fn status_write_on_node_2(
    admin: &kube::Client,
    namespace: &str,
    kubeconfig: &Path,
) -> String {
    use dra_sdk::device_status::{DeviceStatus, DeviceStatusError, DeviceStatusWriter};
    use kube::api::{Patch, PatchParams};

    let claims = Api::<ResourceClaim>::namespaced(admin.clone(), namespace);
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": { "name": "on-node-2" },
        "spec": { "devices": { "requests": [
            { "name": "gpu", "exactly": { "deviceClassName": DRIVER } },
        ] } },
    }))
    .unwrap();
    let claim = claims.create(&PostParams::default(), &claim).await.unwrap();
    // Allocated on node-2 as the scheduler would write it.
    let allocation = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": { "name": "on-node-2", "namespace": namespace },
        "status": { "allocation": {
            "devices": { "results": [
                { "request": "gpu", "driver": DRIVER, "pool": "node-2", "device": "gpu-0" },
            ] },
            "nodeSelector": { "nodeSelectorTerms": [{ "matchFields": [
                { "key": "metadata.name", "operator": "In", "values": ["node-2"] },
            ] }] },
        } },
    });
    claims
        .patch_status(
            "on-node-2",
            &PatchParams::apply("scheduler").force(),
            &Patch::Apply(&allocation),
        )
        .await
        .unwrap();
    let writer = DeviceStatusWriter::new(client_from(kubeconfig).await, DRIVER);
    let reference =
        dra_sdk::claim::ClaimRef::new(namespace, "on-node-2", claim.metadata.uid.unwrap());
    let error = writer
        .apply(
            &reference,
            &[DeviceStatus::new("node-2", "gpu-0").ready("Prepared", "")],
        )
        .await
        .expect_err("the plugin of node-1 wrote the status of a claim on node-2");
    assert!(
        matches!(error, DeviceStatusError::Forbidden { .. }),
        "{error:?}"
    );
    error.to_string()
}
