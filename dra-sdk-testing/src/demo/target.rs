//! Where a demo runs ([`Target`]), who allocates there ([`AllocationMode`]), and the API
//! server, node and kubelet directories it runs on once started ([`Stage`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use dra_sdk::driver::Driver;
use dra_sdk::plugin::{KubeletPlugin, PluginBuilder};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::ListParams;

use super::DemoError;
use crate::cluster::{NODE_NAME, TestCluster};
use crate::e2e::node_ready;

/// The label key on every object a demo creates; its value names the demo (see
/// [`DemoDriver::label`](super::DemoDriver::label)), so that a later run finds the leftovers of
/// an interrupted one.
pub const DEMO_LABEL_KEY: &str = "app.kubernetes.io/managed-by";
/// The namespace of the embedded cluster's claims and Pods, and of a cluster's by default.
pub const DEFAULT_NAMESPACE: &str = "default";
/// A deleted claim still there this long after its Pods are gone is stuck: no resourceclaim
/// controller deallocates it and drops its finalizer, so the demo does.
const CLAIM_STUCK_AFTER: Duration = Duration::from_secs(5);
/// The node label a scheduled Pod selects its node by.
const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// Who allocates the demo's claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AllocationMode {
    /// The cluster's kube-scheduler, for the demo's Pods (which select the demo's node).
    Scheduler,
    /// The demo, with the SDK's scheduler-like allocator, for Pods it binds to the node itself:
    /// for API servers without a scheduler.
    Demo,
}

impl AllocationMode {
    /// Who that is, for the report.
    pub fn who(self) -> &'static str {
        match self {
            Self::Scheduler => "the cluster's scheduler",
            Self::Demo => "the demo's allocator",
        }
    }
}

/// Where the demo runs.
#[derive(Clone)]
#[non_exhaustive]
pub enum Target {
    /// The SDK's embedded cluster (fake API server, a Node [`NODE_NAME`], no scheduler nor
    /// controllers): the demo binds the Pods to the node and allocates.
    Embedded,
    /// A real API server. The plugin registers with a simulated kubelet only: the node's real
    /// kubelet reports `FailedPrepareDynamicResources` for the demo's Pods and never starts
    /// them, which is expected.
    Cluster {
        /// A client of its API server, allowed to manage DeviceClasses, ResourceClaims (and
        /// their status), ResourceClaimTemplates, ResourceSlices and Pods, and to read Nodes
        /// and Events.
        client: kube::Client,
        /// The node the devices are published for; when `None`, the first Ready node without
        /// `NoSchedule`/`NoExecute` taints (or else the first node listed).
        node_name: Option<String>,
        /// Namespace of the demo's claims, templates and Pods.
        namespace: String,
        /// Who allocates the claims.
        allocation: AllocationMode,
    },
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Embedded => f.write_str("Embedded"),
            Self::Cluster {
                node_name,
                namespace,
                allocation,
                ..
            } => f
                .debug_struct("Cluster")
                .field("node_name", node_name)
                .field("namespace", namespace)
                .field("allocation", allocation)
                .finish_non_exhaustive(),
        }
    }
}

impl Target {
    /// A real cluster: any suitable node, namespace `default`, allocated by its scheduler.
    pub fn cluster(client: kube::Client) -> Self {
        Self::Cluster {
            client,
            node_name: None,
            namespace: DEFAULT_NAMESPACE.into(),
            allocation: AllocationMode::Scheduler,
        }
    }

    /// The API server of the kubeconfig at `path` (its current context), what a demo binary's
    /// `--kubeconfig` names.
    pub async fn from_kubeconfig(
        path: &Path,
        node_name: Option<String>,
        namespace: impl Into<String>,
        allocation: AllocationMode,
    ) -> Result<Self, DemoError> {
        let failed = |source: Box<dyn std::error::Error + Send + Sync>| DemoError::Kubeconfig {
            path: path.to_owned(),
            source,
        };
        let kubeconfig =
            kube::config::Kubeconfig::read_from(path).map_err(|error| failed(error.into()))?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .map_err(|error| failed(error.into()))?;
        let client = kube::Client::try_from(config).map_err(|error| failed(error.into()))?;
        Ok(Self::Cluster {
            client,
            node_name,
            namespace: namespace.into(),
            allocation,
        })
    }
}

/// Where the kubelet directories are: the embedded cluster's, or temporary ones.
enum Dirs {
    Embedded(TestCluster),
    Temporary(tempfile::TempDir),
}

/// The API server, node and kubelet directories a demo runs on.
pub struct Stage {
    client: kube::Client,
    node: String,
    /// The node's `kubernetes.io/hostname` label (its name when it has none).
    hostname: String,
    namespace: String,
    allocation: AllocationMode,
    timeout: Duration,
    /// How long a deleted claim may keep its finalizer before the demo removes it.
    stuck_after: Duration,
    label: String,
    /// The embedded cluster is kept alive for the demo; its folder holds the directories.
    dirs: Dirs,
}

impl std::fmt::Debug for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stage")
            .field("node", &self.node)
            .field("namespace", &self.namespace)
            .field("allocation", &self.allocation)
            .field("kubelet_dir", &self.kubelet_dir())
            .finish_non_exhaustive()
    }
}

impl Stage {
    /// Starts the embedded cluster or picks the cluster's node, and makes the kubelet
    /// directories; objects are labelled `app.kubernetes.io/managed-by=<label>`.
    pub async fn new(target: Target, timeout: Duration, label: &str) -> Result<Self, DemoError> {
        let stage = match target {
            Target::Embedded => {
                let cluster = TestCluster::start().await?;
                Self {
                    client: cluster.client(),
                    node: NODE_NAME.to_owned(),
                    hostname: NODE_NAME.to_owned(),
                    namespace: DEFAULT_NAMESPACE.to_owned(),
                    allocation: AllocationMode::Demo,
                    timeout,
                    // Nobody but the demo drops the finalizer in the embedded cluster.
                    stuck_after: Duration::ZERO,
                    label: label.to_owned(),
                    dirs: Dirs::Embedded(cluster),
                }
            }
            Target::Cluster {
                client,
                node_name,
                namespace,
                allocation,
            } => {
                let (node, hostname) = pick_node(&client, node_name.as_deref()).await?;
                let io = |source| DemoError::Io {
                    action: "creating the kubelet directories".into(),
                    source,
                };
                // Short paths keep the socket names far from the 108-byte limit.
                let dir = tempfile::Builder::new()
                    .prefix("dra")
                    .tempdir()
                    .map_err(io)?;
                for sub in ["registry", "plugins", "cdi"] {
                    std::fs::create_dir_all(dir.path().join(sub)).map_err(io)?;
                }
                Self {
                    client,
                    node,
                    hostname,
                    namespace,
                    allocation,
                    timeout,
                    stuck_after: CLAIM_STUCK_AFTER.min(timeout),
                    label: label.to_owned(),
                    dirs: Dirs::Temporary(dir),
                }
            }
        };
        Ok(stage)
    }

    /// The API client.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The node the plugin publishes for.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The namespace of the demo's claims, templates and Pods.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Who allocates.
    pub fn allocation(&self) -> AllocationMode {
        self.allocation
    }

    /// The bound on each wait for the cluster.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether this is the embedded cluster.
    pub fn is_embedded(&self) -> bool {
        matches!(self.dirs, Dirs::Embedded(_))
    }

    /// `the embedded cluster` or `the cluster`, for the report.
    pub fn location(&self) -> &'static str {
        if self.is_embedded() {
            "the embedded cluster"
        } else {
            "the cluster"
        }
    }

    fn kubelet_dir(&self) -> &Path {
        match &self.dirs {
            Dirs::Embedded(cluster) => cluster.path(),
            Dirs::Temporary(dir) => dir.path(),
        }
    }

    /// The CDI spec directory the plugin writes to.
    pub fn cdi_root(&self) -> PathBuf {
        self.kubelet_dir().join("cdi")
    }

    /// A plugin builder wired to the stage: its API server, node and kubelet directories.
    pub fn plugin<D: Driver>(&self, driver: D, driver_name: &str) -> PluginBuilder<D> {
        match &self.dirs {
            Dirs::Embedded(cluster) => cluster.plugin(driver, driver_name),
            Dirs::Temporary(dir) => {
                KubeletPlugin::builder(driver, driver_name, &self.node, self.client.clone())
                    .registrar_dir(dir.path().join("registry"))
                    .plugins_dir(dir.path().join("plugins"))
                    .cdi_root(self.cdi_root())
            }
        }
    }

    /// The value of [`DEMO_LABEL_KEY`] on the demo's objects.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The metadata of the demo's object `name` in its namespace, with its label.
    pub(crate) fn metadata(&self, name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(self.namespace.clone()),
            labels: Some(BTreeMap::from([(
                DEMO_LABEL_KEY.to_owned(),
                self.label.clone(),
            )])),
            ..ObjectMeta::default()
        }
    }

    /// Selects the objects carrying the demo's label (see [`label`](Self::label)).
    pub fn label_selector(&self) -> ListParams {
        ListParams::default().labels(&format!("{DEMO_LABEL_KEY}={}", self.label))
    }

    /// Whether an object with these labels is the demo's.
    pub(crate) fn is_ours(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        labels
            .and_then(|labels| labels.get(DEMO_LABEL_KEY))
            .is_some_and(|value| *value == self.label)
    }

    /// How the demo's Pods are pinned to the node: by `spec.nodeName` when the demo allocates
    /// (no scheduler takes them), by a `nodeSelector` on the node's hostname label when the
    /// scheduler does.
    pub(crate) fn placement(&self) -> (&'static str, serde_json::Value) {
        match self.allocation {
            AllocationMode::Demo => ("nodeName", serde_json::json!(self.node)),
            AllocationMode::Scheduler => (
                "nodeSelector",
                serde_json::json!({ HOSTNAME_LABEL: self.hostname }),
            ),
        }
    }

    pub(crate) fn stuck_after(&self) -> Duration {
        self.stuck_after
    }

    pub(crate) fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub(crate) fn claims(&self) -> Api<ResourceClaim> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub(crate) fn templates(&self) -> Api<ResourceClaimTemplate> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }
}

/// `(name, kubernetes.io/hostname label)` of the named node, or of the first Ready node
/// without `NoSchedule`/`NoExecute` taints (the first node listed when none is).
async fn pick_node(
    client: &kube::Client,
    name: Option<&str>,
) -> Result<(String, String), DemoError> {
    let nodes: Api<Node> = Api::all(client.clone());
    if let Some(name) = name {
        let node = nodes
            .get_opt(name)
            .await
            .map_err(DemoError::api(format!("reading Node {name}")))?
            .ok_or_else(|| DemoError::NoNode(format!("the cluster has no Node {name}")))?;
        return Ok((name.to_owned(), hostname(&node, name)));
    }
    let listed = nodes
        .list(&ListParams::default())
        .await
        .map_err(DemoError::api(
            "listing Nodes to pick one (or pass --node-name)",
        ))?;
    let node = listed
        .items
        .iter()
        .find(|node| usable(node))
        .or_else(|| listed.items.first())
        .ok_or_else(|| {
            DemoError::NoNode("the cluster has no Nodes to publish the devices for".into())
        })?;
    let name = node
        .metadata
        .name
        .clone()
        .ok_or_else(|| DemoError::Incomplete {
            object: "a Node".into(),
            field: "metadata.name",
        })?;
    let label = hostname(node, &name);
    Ok((name, label))
}

/// The node's `kubernetes.io/hostname` label, or `name` when it has none.
fn hostname(node: &Node, name: &str) -> String {
    node.metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(HOSTNAME_LABEL))
        .cloned()
        .unwrap_or_else(|| name.to_owned())
}

/// Ready, not cordoned, and without taints that keep the demo's Pods off.
fn usable(node: &Node) -> bool {
    let spec = node.spec.as_ref();
    let cordoned = spec.and_then(|spec| spec.unschedulable).unwrap_or(false);
    let tainted = spec
        .and_then(|spec| spec.taints.as_ref())
        .is_some_and(|taints| {
            taints
                .iter()
                .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        });
    node_ready(node) && !cordoned && !tainted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(value: serde_json::Value) -> Node {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_usable_node_is_ready_schedulable_and_untainted() {
        let ready = serde_json::json!({ "conditions": [{ "type": "Ready", "status": "True" }] });
        assert!(usable(&node(serde_json::json!({
            "metadata": { "name": "n" }, "status": ready,
        }))));
        assert!(!usable(&node(
            serde_json::json!({ "metadata": { "name": "n" } })
        )));
        assert!(!usable(&node(serde_json::json!({
            "metadata": { "name": "n" }, "spec": { "unschedulable": true }, "status": ready,
        }))));
        assert!(!usable(&node(serde_json::json!({
            "metadata": { "name": "n" },
            "spec": { "taints": [{ "key": "k", "effect": "NoSchedule" }] },
            "status": ready,
        }))));
        assert!(usable(&node(serde_json::json!({
            "metadata": { "name": "n" },
            "spec": { "taints": [{ "key": "k", "effect": "PreferNoSchedule" }] },
            "status": ready,
        }))));
    }

    #[test]
    fn the_hostname_label_defaults_to_the_name() {
        let labelled = node(serde_json::json!({
            "metadata": { "name": "n", "labels": { HOSTNAME_LABEL: "host-n" } },
        }));
        assert_eq!(hostname(&labelled, "n"), "host-n");
        assert_eq!(
            hostname(&node(serde_json::json!({ "metadata": {} })), "n"),
            "n"
        );
    }

    #[test]
    fn allocation_modes_say_who() {
        assert_eq!(AllocationMode::Scheduler.who(), "the cluster's scheduler");
        assert_eq!(AllocationMode::Demo.who(), "the demo's allocator");
    }
}
