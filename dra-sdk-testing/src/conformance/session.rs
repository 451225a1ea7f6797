//! What the cases share: the target, the simulated kubelet, API access, and the claims a case
//! created, which are cleaned up after it.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::{ConformanceError, StartPlugin, Target, Verdict, slices};
use crate::cluster::{NODE_NAME, NewClaim, TestCluster, driver_device_class};
use crate::kubelet::{
    DraApi, KubeletDevice, KubeletSimulator, KubeletVersion, PrepareOutcome, RegisteredPlugin,
};
use dra_sdk::advanced::proto::pluginregistration as reg_pb;
use dra_sdk::claim::ClaimRef;
use dra_sdk::plugin::KubeletPlugin;
use dra_sdk_allocator::{AllocateClaimError, allocate_claim};

/// How long an in-process start waits for the plugin's ResourceSlices.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(10);

/// The request name of every claim the suite creates.
pub(super) const REQUEST: &str = "device";

/// The plugin running in the suite's own test cluster.
struct InProcess {
    cluster: TestCluster,
    start: StartPlugin,
    plugin: Option<KubeletPlugin>,
}

/// Access to the plugin's API server.
pub(super) struct ApiAccess {
    pub(super) client: kube::Client,
    pub(super) namespace: String,
    /// The plugin's node, when known: claims are allocated there.
    pub(super) node: Option<String>,
    /// The DeviceClass the suite's claims use.
    pub(super) class: String,
    /// Whether the suite created the class (and so deletes it at the end).
    class_created: bool,
}

/// A claim the suite created and allocated, with the devices allocated from this driver.
#[derive(Clone, Debug)]
pub(super) struct TestClaim {
    pub(super) reference: ClaimRef,
    /// `(pool, device)` of each allocation result for this driver.
    pub(super) devices: BTreeSet<(String, String)>,
}

pub(super) struct Session {
    driver: String,
    expected_driver: Option<String>,
    pub(super) registration: PathBuf,
    kubelet: Result<RegisteredPlugin, String>,
    api: Option<ApiAccess>,
    cdi_root: Option<PathBuf>,
    in_process: Option<InProcess>,
    run_id: String,
    next_claim: usize,
    /// Claims created in the current case: unprepared and deleted after it.
    created: Vec<ClaimRef>,
    /// Claim references the current case sent to prepare: unprepared after it.
    sent: BTreeSet<ClaimRef>,
}

/// `GetInfo` with the kubelet's dial and call timeouts.
pub(super) async fn get_info(socket: &Path) -> Result<reg_pb::PluginInfo, String> {
    KubeletSimulator::new(KubeletVersion::V1_36)
        .get_info(socket)
        .await
        .map_err(|error| error.to_string())
}

/// A random claim UID in UUID form, for claims nobody created.
pub(super) fn random_uid() -> String {
    let hex: String = (0..32)
        .map(|_| char::from_digit(fastrand::u32(0..16), 16).unwrap_or('0'))
        .collect();
    format!(
        "{}-{}-4{}-8{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}

/// The API version as the services name it (`v1`, `v1beta1`).
pub(super) fn api_name(api: DraApi) -> &'static str {
    match api {
        DraApi::V1 => "v1",
        DraApi::V1beta1 => "v1beta1",
    }
}

fn fail(message: impl Into<String>) -> Verdict {
    Verdict::Fail(message.into())
}

impl Session {
    pub(super) async fn open(target: Target, namespace: String) -> Result<Self, ConformanceError> {
        let run_id: String = (0..6)
            .map(|_| char::from_digit(fastrand::u32(0..36), 36).unwrap_or('x'))
            .collect();
        let (registration, client, node, cdi_root, in_process, expected_driver) = match target {
            Target::InProcess { driver_name, start } => {
                let cluster = TestCluster::start().await?;
                let plugin = start_plugin(&cluster, &start)
                    .await
                    .map_err(ConformanceError::Start)?;
                let registration = plugin.socket_paths().registration.clone();
                let client = cluster.client();
                let cdi_root = cluster.cdi_root();
                (
                    registration,
                    Some(client),
                    Some(NODE_NAME.to_owned()),
                    Some(cdi_root),
                    Some(InProcess {
                        cluster,
                        start,
                        plugin: Some(plugin),
                    }),
                    driver_name,
                )
            }
            Target::Remote {
                registration,
                client,
                node_name,
                cdi_root,
            } => {
                match std::fs::metadata(&registration) {
                    Ok(metadata) if metadata.file_type().is_socket() => {}
                    Ok(_) => {
                        return Err(ConformanceError::Socket {
                            path: registration,
                            reason: "not a Unix socket".into(),
                        });
                    }
                    Err(error) => {
                        return Err(ConformanceError::Socket {
                            path: registration,
                            reason: error.to_string(),
                        });
                    }
                }
                (registration, client, node_name, cdi_root, None, None)
            }
        };

        let info = get_info(&registration)
            .await
            .map_err(|message| ConformanceError::GetInfo {
                path: registration.clone(),
                message,
            })?;
        let driver = info.name.clone();
        let kubelet = KubeletSimulator::new(KubeletVersion::V1_36)
            .register(&registration)
            .await
            .map_err(|error| error.to_string());

        let api = match client {
            Some(client) => Some(open_api(client, namespace, node, &driver).await),
            None => None,
        };
        Ok(Self {
            driver,
            expected_driver,
            registration,
            kubelet,
            api,
            cdi_root,
            in_process,
            run_id,
            next_claim: 0,
            created: Vec::new(),
            sent: BTreeSet::new(),
        })
    }

    pub(super) fn driver(&self) -> &str {
        &self.driver
    }

    pub(super) fn expected_driver(&self) -> Option<&str> {
        self.expected_driver.as_deref()
    }

    pub(super) fn target_name(&self) -> String {
        if self.in_process.is_some() {
            "in-process".to_owned()
        } else {
            self.registration.display().to_string()
        }
    }

    /// The simulated kubelet (1.36) the plugin registered with.
    pub(super) fn kubelet(&self) -> Result<RegisteredPlugin, Verdict> {
        self.kubelet.clone().map_err(|error| {
            Verdict::Skip(format!(
                "the plugin did not register with a 1.36 kubelet: {error}"
            ))
        })
    }

    /// The registered plugin, talking the given API version.
    pub(super) fn kubelet_via(&self, api: DraApi) -> Result<RegisteredPlugin, Verdict> {
        let mut kubelet = self.kubelet()?;
        kubelet.api = api;
        Ok(kubelet)
    }

    pub(super) fn api(&self) -> Result<&ApiAccess, Verdict> {
        self.api
            .as_ref()
            .ok_or_else(|| Verdict::Skip("no access to the API server (give a kubeconfig)".into()))
    }

    /// Whether claims can be created and allocated.
    pub(super) fn can_allocate(&self) -> bool {
        self.api.as_ref().is_some_and(|api| api.node.is_some())
    }

    pub(super) fn cdi_root(&self) -> Result<&Path, Verdict> {
        self.cdi_root.as_deref().ok_or_else(|| {
            Verdict::Skip("the CDI spec directory is unknown (give the CDI root)".into())
        })
    }

    pub(super) fn is_in_process(&self) -> bool {
        self.in_process.is_some()
    }

    /// A reference to a claim that does not exist.
    pub(super) fn unknown_claim(&mut self) -> ClaimRef {
        self.next_claim += 1;
        let namespace = self
            .api
            .as_ref()
            .map_or(super::DEFAULT_NAMESPACE, |api| api.namespace.as_str())
            .to_owned();
        ClaimRef {
            uid: random_uid(),
            namespace,
            name: format!("conformance-{}-missing-{}", self.run_id, self.next_claim),
        }
    }

    /// Creates and allocates a claim for one device of this driver, with an opaque config for
    /// it if given. `Ok(None)` when the API server refused the claim as invalid.
    pub(super) async fn try_new_claim(
        &mut self,
        config: Option<Value>,
    ) -> Result<Option<TestClaim>, Verdict> {
        let api = self.api()?;
        let Some(node) = api.node.clone() else {
            return Err(Verdict::Skip(
                "the plugin's node is unknown (give the node name)".into(),
            ));
        };
        let client = api.client.clone();
        let namespace = api.namespace.clone();
        let class = api.class.clone();
        self.next_claim += 1;
        let name = format!("conformance-{}-{}", self.run_id, self.next_claim);
        let mut claim = NewClaim::new(&namespace, &name).request(REQUEST, &class);
        if let Some(parameters) = config {
            claim = claim.config(&[REQUEST], &self.driver, parameters);
        }
        let object = claim.build();
        let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &namespace);
        match claims.create(&PostParams::default(), &object).await {
            Ok(created) => {
                if let Some(uid) = created.metadata.uid {
                    self.created.push(ClaimRef {
                        uid,
                        namespace: namespace.clone(),
                        name: name.clone(),
                    });
                }
            }
            Err(kube::Error::Api(status)) if status.code == 422 => return Ok(None),
            Err(error) => {
                return Err(fail(format!(
                    "creating ResourceClaim {namespace}/{name}: {error}"
                )));
            }
        }
        let allocated = allocate_claim(&client, &namespace, &name, &node, None)
            .await
            .map_err(|error| match error {
                AllocateClaimError::Allocation(error) => Verdict::Skip(format!(
                    "no device of {} to allocate on node {node}: {error}",
                    self.driver
                )),
                other => fail(format!("allocating {namespace}/{name}: {other}")),
            })?;
        let reference =
            crate::cluster::claim_ref(&allocated).map_err(|error| fail(error.to_string()))?;
        let devices = crate::claims::allocation_results(&allocated)
            .into_iter()
            .filter(|result| result.driver == self.driver)
            .map(|result| (result.pool, result.device))
            .collect();
        Ok(Some(TestClaim { reference, devices }))
    }

    /// [`try_new_claim`](Self::try_new_claim) where a refusal is a failure.
    pub(super) async fn new_claim(&mut self, config: Option<Value>) -> Result<TestClaim, Verdict> {
        self.try_new_claim(config)
            .await?
            .ok_or_else(|| fail("the API server refused a plain one-device claim as invalid"))
    }

    /// One prepare call; gRPC errors and answers the kubelet would reject fail the case.
    pub(super) async fn prepare_via(
        &mut self,
        kubelet: &RegisteredPlugin,
        claims: &[ClaimRef],
    ) -> Result<BTreeMap<String, PrepareOutcome>, Verdict> {
        self.sent.extend(claims.iter().cloned());
        kubelet.prepare(claims).await.map_err(|error| {
            fail(format!(
                "NodePrepareResources ({}): {error}",
                api_name(kubelet.api)
            ))
        })
    }

    pub(super) async fn prepare(
        &mut self,
        claims: &[ClaimRef],
    ) -> Result<BTreeMap<String, PrepareOutcome>, Verdict> {
        let kubelet = self.kubelet()?;
        self.prepare_via(&kubelet, claims).await
    }

    /// Prepares one claim that must succeed; returns its devices.
    pub(super) async fn prepare_one_via(
        &mut self,
        kubelet: &RegisteredPlugin,
        claim: &ClaimRef,
    ) -> Result<Vec<KubeletDevice>, Verdict> {
        let mut answer = self
            .prepare_via(kubelet, std::slice::from_ref(claim))
            .await?;
        match answer.remove(&claim.uid) {
            Some(Ok(devices)) => Ok(devices),
            Some(Err(error)) => Err(fail(format!(
                "prepare of {}/{} failed: {error}",
                claim.namespace, claim.name
            ))),
            None => Err(fail(format!("no answer for claim {}", claim.uid))),
        }
    }

    pub(super) async fn prepare_one(
        &mut self,
        claim: &ClaimRef,
    ) -> Result<Vec<KubeletDevice>, Verdict> {
        let kubelet = self.kubelet()?;
        self.prepare_one_via(&kubelet, claim).await
    }

    /// Unprepares claims; each must succeed.
    pub(super) async fn unprepare_via(
        &self,
        kubelet: &RegisteredPlugin,
        claims: &[ClaimRef],
    ) -> Result<(), Verdict> {
        let answer = kubelet.unprepare(claims).await.map_err(|error| {
            fail(format!(
                "NodeUnprepareResources ({}): {error}",
                api_name(kubelet.api)
            ))
        })?;
        let failures: Vec<String> = claims
            .iter()
            .filter_map(|claim| match answer.get(&claim.uid) {
                Some(Ok(())) => None,
                Some(Err(error)) => Some(format!(
                    "unprepare of {}/{} failed: {error}",
                    claim.namespace, claim.name
                )),
                None => Some(format!("no unprepare answer for claim {}", claim.uid)),
            })
            .collect();
        if failures.is_empty() {
            Ok(())
        } else {
            Err(fail(failures.join("\n")))
        }
    }

    pub(super) async fn unprepare(&self, claims: &[ClaimRef]) -> Result<(), Verdict> {
        let kubelet = self.kubelet()?;
        self.unprepare_via(&kubelet, claims).await
    }

    /// Deletes a claim from the API (removing the scheduler's finalizer first), as when a
    /// user deletes it and the claim controller lets it go. A missing claim is not an error.
    pub(super) async fn delete_claim(&self, claim: &ClaimRef) -> Result<(), String> {
        let Some(api) = &self.api else {
            return Ok(());
        };
        let claims: Api<ResourceClaim> = Api::namespaced(api.client.clone(), &claim.namespace);
        let gone = |error: &kube::Error| matches!(error, kube::Error::Api(s) if s.code == 404);
        let unfinalize = json!({ "metadata": { "finalizers": null } });
        match claims
            .patch(
                &claim.name,
                &PatchParams::default(),
                &Patch::Merge(&unfinalize),
            )
            .await
        {
            Ok(_) => {}
            Err(error) if gone(&error) => return Ok(()),
            Err(error) => {
                return Err(format!(
                    "removing the finalizers of {}: {error}",
                    claim.name
                ));
            }
        }
        match claims.delete(&claim.name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(error) if gone(&error) => Ok(()),
            Err(error) => Err(format!("deleting {}: {error}", claim.name)),
        }
    }

    /// After each case: unprepare what it sent to prepare and delete what it created, so the
    /// next case finds the devices free and the CDI root clean.
    pub(super) async fn cleanup(&mut self) {
        let sent: Vec<ClaimRef> = std::mem::take(&mut self.sent).into_iter().collect();
        if !sent.is_empty()
            && let Ok(kubelet) = self.kubelet()
            && let Err(error) = kubelet.unprepare(&sent).await
        {
            tracing::warn!(%error, "cleanup: unprepare failed");
        }
        for claim in std::mem::take(&mut self.created) {
            if let Err(error) = self.delete_claim(&claim).await {
                tracing::warn!(%error, "cleanup: deleting a claim failed");
            }
        }
    }

    /// After the last case: delete the DeviceClass the suite created, stop an in-process
    /// plugin.
    pub(super) async fn close(mut self) {
        if let Some(api) = &self.api
            && api.class_created
        {
            let classes: Api<DeviceClass> = Api::all(api.client.clone());
            if let Err(error) = classes.delete(&api.class, &DeleteParams::default()).await {
                tracing::warn!(%error, class = %api.class, "deleting the suite's DeviceClass failed");
            }
        }
        if let Some(plugin) = self.in_process.as_mut().and_then(|p| p.plugin.take())
            && let Err(error) = plugin.shutdown().await
        {
            tracing::warn!(%error, "stopping the plugin failed");
        }
    }

    /// Stops the in-process plugin and starts a new one from the factory, then registers it.
    pub(super) async fn restart(&mut self) -> Result<(), Verdict> {
        let Some(in_process) = self.in_process.as_mut() else {
            return Err(Verdict::Skip(
                "restarting the plugin needs an in-process target".into(),
            ));
        };
        if let Some(plugin) = in_process.plugin.take() {
            plugin
                .shutdown()
                .await
                .map_err(|error| fail(format!("stopping the plugin: {error}")))?;
        }
        if self.registration.exists() {
            return Err(fail(format!(
                "the registration socket {} is still there after the plugin stopped",
                self.registration.display()
            )));
        }
        let plugin = start_plugin(&in_process.cluster, &in_process.start)
            .await
            .map_err(|error| fail(format!("starting the plugin again: {error}")))?;
        self.registration = plugin.socket_paths().registration.clone();
        in_process.plugin = Some(plugin);
        let kubelet = KubeletSimulator::new(KubeletVersion::V1_36)
            .register(&self.registration)
            .await
            .map_err(|error| fail(format!("registering the restarted plugin: {error}")))?;
        self.kubelet = Ok(kubelet);
        Ok(())
    }

    /// The driver's published ResourceSlices, if the API is reachable.
    pub(super) async fn published(&self) -> Result<slices::PublishedSlices, Verdict> {
        let api = self.api()?;
        slices::read_published(&api.client, Some(&self.driver), api.node.as_deref())
            .await
            .map_err(|error| fail(format!("reading ResourceSlices: {error}")))
    }
}

/// Starts the plugin and waits until its ResourceSlices are written.
async fn start_plugin(
    cluster: &TestCluster,
    start: &StartPlugin,
) -> Result<KubeletPlugin, dra_sdk::plugin::PluginError> {
    let plugin = start(cluster).await?;
    if tokio::time::timeout(PUBLISH_TIMEOUT, plugin.published())
        .await
        .is_err()
    {
        // The slices case reports what is missing.
        tracing::warn!("the plugin's ResourceSlices were not written within {PUBLISH_TIMEOUT:?}");
    }
    Ok(plugin)
}

/// Prepares API access: the DeviceClass for the suite's claims, and the node if not given.
async fn open_api(
    client: kube::Client,
    namespace: String,
    node: Option<String>,
    driver: &str,
) -> ApiAccess {
    let class = format!("dra-conformance.{driver}");
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let class_created = match classes
        .create(&PostParams::default(), &driver_device_class(&class, driver))
        .await
    {
        Ok(_) => true,
        Err(error) => {
            // Already there from an earlier run, or not allowed: claims then fail to allocate
            // and the cases say why.
            tracing::debug!(%error, %class, "not creating the suite's DeviceClass");
            false
        }
    };
    let node = match node {
        Some(node) => Some(node),
        None => infer_node(&client, driver).await,
    };
    ApiAccess {
        client,
        namespace,
        node,
        class,
        class_created,
    }
}

/// The node of the driver's node-local slices, when they name exactly one.
async fn infer_node(client: &kube::Client, driver: &str) -> Option<String> {
    let published = slices::read_published(client, Some(driver), None)
        .await
        .ok()?;
    let nodes: BTreeSet<&str> = published
        .slices
        .iter()
        .filter_map(|slice| slice.pointer("/spec/nodeName").and_then(Value::as_str))
        .collect();
    match nodes.into_iter().collect::<Vec<_>>().as_slice() {
        [node] => Some((*node).to_owned()),
        _ => None,
    }
}
