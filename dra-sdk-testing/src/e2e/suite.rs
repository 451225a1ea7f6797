//! The end-to-end suite every driver runs against a [`RealCluster`]: the real kubelet
//! registers the plugin, the real API server holds its ResourceSlices, the real scheduler
//! allocates claims from them, pods start with the prepared CDI devices, and pod deletion
//! unprepares. Where the [conformance suite](crate::conformance) checks the plugin's
//! contract with doubles, this one checks it with the components users run.
//!
//! The plugin is started by the test (in process with [`RealCluster::plugin`], or as a binary
//! with [`RealCluster::spawn_program`]) on one node of the cluster; the suite is told the
//! driver's name, the node and the CDI directory the plugin writes to.
//!
//! ```no_run
//! # async fn demo(cluster: &dra_sdk_testing::e2e::RealCluster) -> Result<(), Box<dyn std::error::Error>> {
//! use dra_sdk_testing::e2e::suite::E2eSuite;
//!
//! let report = E2eSuite::new(cluster, "node-1", "gpu.example.com")
//!     // A config the driver must refuse, and a part of the message it answers with.
//!     .bad_config(
//!         serde_json::json!({ "apiVersion": "gpu.example.com/v1", "kind": "GpuConfig", "sharing": 7 }),
//!         "sharing",
//!     )
//!     .run()
//!     .await?;
//! println!("{report}");
//! report.assert_passed();
//! # Ok(()) }
//! ```
//!
//! Each pod takes one device; at most two are in use at a time. The suite works in a
//! namespace of its own and removes what it created, pods first.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::workload::{self, ClaimSource};
use super::{E2eError, RealCluster, api_error};
use crate::cdi_check::{self, Snapshot};
use crate::conformance::{CaseReport, Outcome, Report};

/// The cases, in the order they run: `(name, what it proves)`.
pub const CASES: &[(&str, &str)] = &[
    (
        "registered",
        "the kubelet registered the plugin and chose the v1 DRA service",
    ),
    (
        "slices-accepted",
        "the API server holds the plugin's ResourceSlices for the node, every pool complete",
    ),
    (
        "slices-steady",
        "the publisher writes nothing at steady state",
    ),
    (
        "pod-runs",
        "a pod with a claim from a template is scheduled, prepared and started with the claim's CDI devices; deleting it unprepares",
    ),
    (
        "containers-share-claim",
        "two containers of a pod that share one claim get the same CDI devices",
    ),
    (
        "pods-share-claim",
        "two pods that share one claim run with the same CDI devices, prepared once",
    ),
    (
        "bad-config-isolated",
        "a claim with a malformed opaque config leaves its pod failing with the driver's message in the pod's events, while another pod on the node runs",
    ),
];

/// Runs the suite for one driver; see the [module docs](self).
#[must_use]
pub struct E2eSuite<'a> {
    cluster: &'a RealCluster,
    node: String,
    driver: String,
    selector: Option<String>,
    bad_config: Option<(Value, String)>,
    timeout: Duration,
    steady_for: Duration,
    only: Option<Vec<String>>,
}

impl<'a> E2eSuite<'a> {
    /// The suite for the plugin of `driver` running on `node` of `cluster`, writing CDI specs
    /// to the node's [`cdi_root`](super::KubeletNode::cdi_root).
    pub fn new(cluster: &'a RealCluster, node: &str, driver: &str) -> Self {
        Self {
            cluster,
            node: node.to_owned(),
            driver: driver.to_owned(),
            selector: None,
            bad_config: None,
            timeout: Duration::from_secs(60),
            steady_for: Duration::from_secs(3),
            only: None,
        }
    }

    /// A CEL expression that narrows the devices the suite's claims may get (for drivers
    /// whose devices are not all alike, e.g. full GPUs only).
    pub fn device_selector(mut self, cel: impl Into<String>) -> Self {
        self.selector = Some(cel.into());
        self
    }

    /// The opaque config parameters for `bad-config-isolated`, which the driver must refuse,
    /// and a part of its message. Without one the case is skipped.
    pub fn bad_config(mut self, parameters: Value, expected_message: impl Into<String>) -> Self {
        self.bad_config = Some((parameters, expected_message.into()));
        self
    }

    /// Runs only the named cases (see [`CASES`]); unknown names are reported as failed.
    pub fn only<S: Into<String>>(mut self, cases: impl IntoIterator<Item = S>) -> Self {
        self.only = Some(cases.into_iter().map(Into::into).collect());
        self
    }

    /// How long a pod gets to start, or a claim to be unprepared (default 60 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Runs every case and cleans up. Fails only when the suite cannot start or clean up;
    /// failed checks are in the report.
    pub async fn run(self) -> Result<Report, E2eError> {
        let node = self.cluster.node(&self.node)?;
        let namespace = self.cluster.create_namespace("e2e").await?;
        let client = self.cluster.client().await?;
        let run = Run {
            suite: &self,
            client: client.clone(),
            class: format!("{namespace}.{}", self.driver),
            namespace: namespace.clone(),
            cdi_root: node.cdi_root(),
        };
        run.create_class().await?;
        let mut report = Report::new(
            self.driver.clone(),
            format!("e2e on {} of {}", self.node, self.cluster.server()),
        );
        report.suite = "e2e";
        for name in self.only.iter().flatten() {
            if !CASES.iter().any(|(case, _)| case == name) {
                report.push(
                    "unknown-case",
                    "a case given to E2eSuite::only",
                    Outcome::Failed(format!("no case {name:?}")),
                );
            }
        }
        for (name, description) in CASES {
            if self
                .only
                .as_ref()
                .is_some_and(|only| !only.iter().any(|case| case == name))
            {
                continue;
            }
            let started = Instant::now();
            let outcome = match run.case(name).await {
                Ok(()) => Outcome::Passed,
                Err(Verdict::Skip(why)) => Outcome::Skipped(why),
                Err(Verdict::Fail(why)) => Outcome::Failed(why),
            };
            report.cases.push(CaseReport {
                name,
                description,
                outcome,
                duration: started.elapsed(),
                notes: Vec::new(),
            });
        }
        run.clean_up().await?;
        Ok(report)
    }
}

/// Why a case did not pass.
enum Verdict {
    Fail(String),
    Skip(String),
}

impl From<E2eError> for Verdict {
    fn from(error: E2eError) -> Self {
        Verdict::Fail(error.to_string())
    }
}

fn fail<T>(message: impl Into<String>) -> Result<T, Verdict> {
    Err(Verdict::Fail(message.into()))
}

/// One run of the suite: its namespace and DeviceClass.
struct Run<'s, 'a> {
    suite: &'s E2eSuite<'a>,
    client: kube::Client,
    namespace: String,
    class: String,
    cdi_root: PathBuf,
}

fn object<T: DeserializeOwned>(value: Value) -> Result<T, Verdict> {
    serde_json::from_value(value)
        .map_err(|error| Verdict::Fail(format!("building an object: {error}")))
}

impl Run<'_, '_> {
    async fn case(&self, name: &str) -> Result<(), Verdict> {
        match name {
            "registered" => self.registered().await,
            "slices-accepted" => self.slices_accepted().await,
            "slices-steady" => self.slices_steady().await,
            "pod-runs" => self.pod_runs().await,
            "containers-share-claim" => self.containers_share_claim().await,
            "pods-share-claim" => self.pods_share_claim().await,
            "bad-config-isolated" => self.bad_config_isolated().await,
            other => fail(format!("unknown case {other}")),
        }
    }

    async fn create_class(&self) -> Result<(), E2eError> {
        let class = workload::device_class(
            &self.class,
            &self.suite.driver,
            self.suite.selector.as_deref(),
        )
        .map_err(|error| {
            super::io_error("building the DeviceClass")(std::io::Error::other(error))
        })?;
        Api::<DeviceClass>::all(self.client.clone())
            .create(&PostParams::default(), &class)
            .await
            .map_err(api_error(format!("create DeviceClass {}", self.class)))?;
        Ok(())
    }

    async fn registered(&self) -> Result<(), Verdict> {
        let node = self.suite.cluster.node(&self.suite.node)?;
        let registration = node
            .wait_for_registration(&self.suite.driver, 0, self.suite.timeout)
            .await?;
        if registration.chosen_service != "v1.DRAPlugin" {
            return fail(format!(
                "the kubelet chose {} (endpoint {}), not v1.DRAPlugin",
                registration.chosen_service, registration.endpoint
            ));
        }
        Ok(())
    }

    /// The driver's slices for the node, once there are some.
    async fn node_slices(&self) -> Result<Vec<ResourceSlice>, Verdict> {
        let slices = Api::<ResourceSlice>::all(self.client.clone());
        let params = ListParams::default().fields(&format!(
            "spec.driver={},spec.nodeName={}",
            self.suite.driver, self.suite.node
        ));
        let deadline = Instant::now() + self.suite.timeout;
        loop {
            let list = slices
                .list(&params)
                .await
                .map_err(|error| Verdict::Fail(format!("list ResourceSlices: {error}")))?;
            if !list.items.is_empty() {
                return Ok(list.items);
            }
            if Instant::now() > deadline {
                return fail(format!(
                    "no ResourceSlice of {} for node {} after {:?}",
                    self.suite.driver, self.suite.node, self.suite.timeout
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn slices_accepted(&self) -> Result<(), Verdict> {
        let slices = self.node_slices().await?;
        let mut pools = std::collections::BTreeMap::<(String, i64), (i64, usize, usize)>::new();
        for slice in &slices {
            let pool = &slice.spec.pool;
            let entry = pools
                .entry((pool.name.clone(), pool.generation))
                .or_insert((pool.resource_slice_count, 0, 0));
            entry.1 += 1;
            entry.2 += slice.spec.devices.as_ref().map_or(0, Vec::len);
        }
        let newest = pools.iter().fold(
            std::collections::BTreeMap::<&str, i64>::new(),
            |mut newest, ((pool, generation), _)| {
                let g = newest.entry(pool.as_str()).or_insert(*generation);
                *g = (*g).max(*generation);
                newest
            },
        );
        let mut devices = 0;
        for ((pool, generation), (count, seen, pool_devices)) in &pools {
            if newest.get(pool.as_str()) != Some(generation) {
                continue;
            }
            if i64::try_from(*seen).ok() != Some(*count) {
                return fail(format!(
                    "pool {pool} generation {generation}: {seen} slices, resourceSliceCount {count}"
                ));
            }
            devices += pool_devices;
        }
        if devices == 0 {
            return fail("the node's slices hold no devices");
        }
        Ok(())
    }

    async fn slices_steady(&self) -> Result<(), Verdict> {
        let versions = |slices: Vec<ResourceSlice>| -> BTreeSet<(String, String)> {
            slices
                .into_iter()
                .map(|slice| {
                    (
                        slice.metadata.name.unwrap_or_default(),
                        slice.metadata.resource_version.unwrap_or_default(),
                    )
                })
                .collect()
        };
        let before = versions(self.node_slices().await?);
        tokio::time::sleep(self.suite.steady_for).await;
        let after = versions(self.node_slices().await?);
        if before != after {
            return fail(format!(
                "the slices changed within {:?} at steady state: before {before:?}, after {after:?}",
                self.suite.steady_for
            ));
        }
        Ok(())
    }

    /// The opaque config entry for `parameters`, as a claim's `devices.config`.
    fn config(&self, parameters: &Value) -> Value {
        json!([{
            "requests": ["dev"],
            "opaque": { "driver": self.suite.driver, "parameters": parameters },
        }])
    }

    async fn create_template(&self, name: &str, config: Option<&Value>) -> Result<(), Verdict> {
        let config = config.map(|parameters| self.config(parameters));
        let template =
            workload::claim_template(&self.namespace, name, &self.class, Value::Null, config)
                .map_err(|error| {
                    Verdict::Fail(format!("building ResourceClaimTemplate {name}: {error}"))
                })?;
        Api::<ResourceClaimTemplate>::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &template)
            .await
            .map_err(|error| {
                Verdict::Fail(format!("create ResourceClaimTemplate {name}: {error}"))
            })?;
        Ok(())
    }

    async fn create_claim(&self, name: &str) -> Result<(), Verdict> {
        let claim: ResourceClaim = object(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": { "name": name, "namespace": self.namespace },
            "spec": { "devices": { "requests": [{ "name": "dev", "exactly": { "deviceClassName": self.class } }] } },
        }))?;
        Api::<ResourceClaim>::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &claim)
            .await
            .map_err(|error| Verdict::Fail(format!("create ResourceClaim {name}: {error}")))?;
        Ok(())
    }

    async fn create_pod(
        &self,
        name: &str,
        source: ClaimSource,
        containers: &[&str],
    ) -> Result<(), Verdict> {
        let pod = workload::pod_using(&self.namespace, name, &self.suite.node, &source, containers);
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .map_err(|error| Verdict::Fail(format!("create Pod {name}: {error}")))?;
        Ok(())
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    async fn wait_running(&self, name: &str) -> Result<(), Verdict> {
        workload::wait_for_pod_running(&self.client, &self.namespace, name, self.suite.timeout)
            .await?;
        Ok(())
    }

    /// The CDI devices the kubelet passed for a container: non-empty, each defined by exactly
    /// one valid spec file of the CDI directory.
    async fn container_devices(
        &self,
        pod: &str,
        container: &str,
    ) -> Result<BTreeSet<String>, Verdict> {
        let node = self.suite.cluster.node(&self.suite.node)?;
        let devices = node
            .cri_log()
            .wait_for_container(
                &format!("{}/{pod}", self.namespace),
                container,
                self.suite.timeout,
            )
            .await?;
        let devices: BTreeSet<String> = devices.into_iter().collect();
        let own: BTreeSet<String> = devices
            .iter()
            .filter(|id| self.is_own(id))
            .cloned()
            .collect();
        if own.is_empty() {
            return fail(format!(
                "container {pod}/{container} got no CDI device of {} (got {devices:?})",
                self.suite.driver
            ));
        }
        let snapshot = Snapshot::take(&self.cdi_root).map_err(Verdict::Fail)?;
        let problems = cdi_check::unresolved(&snapshot, &own);
        if !problems.is_empty() {
            return fail(problems.join("; "));
        }
        Ok(own)
    }

    /// Whether a CDI ID is defined in the node's CDI directory, where the plugin writes (a
    /// container may also get IDs of other drivers' claims).
    fn is_own(&self, id: &str) -> bool {
        let snapshot = Snapshot::take(&self.cdi_root).ok();
        snapshot.is_some_and(|snapshot| {
            snapshot
                .resolve([&id.to_owned()])
                .into_values()
                .any(|found| found.is_ok_and(|files| !files.is_empty()))
        })
    }

    /// Deletes pods and waits until they are gone and `ids` are no longer defined in the CDI
    /// directory (the kubelet unprepared them).
    async fn delete_and_check_unprepared(
        &self,
        pods: &[&str],
        ids: &BTreeSet<String>,
    ) -> Result<(), Verdict> {
        workload::delete_pods(&self.client, &self.namespace, pods, self.suite.timeout).await?;
        let deadline = Instant::now() + self.suite.timeout;
        loop {
            let snapshot = Snapshot::take(&self.cdi_root).map_err(Verdict::Fail)?;
            let left = cdi_check::still_defined(&snapshot, ids);
            if left.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return fail(format!(
                    "{:?} after deleting the pods: {}",
                    self.suite.timeout,
                    left.join("; ")
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn pod_runs(&self) -> Result<(), Verdict> {
        self.create_template("single", None).await?;
        self.create_pod("single", ClaimSource::Template("single".into()), &["ctr"])
            .await?;
        self.wait_running("single").await?;
        let ids = self.container_devices("single", "ctr").await?;
        // The claim made from the template is allocated on this node by the scheduler.
        let pod = self
            .pods()
            .get("single")
            .await
            .map_err(|error| Verdict::Fail(format!("get Pod single: {error}")))?;
        let claim_name = pod
            .status
            .and_then(|status| status.resource_claim_statuses)
            .and_then(|statuses| statuses.into_iter().next())
            .and_then(|status| status.resource_claim_name);
        let Some(claim_name) = claim_name else {
            return fail("pod single has no resourceClaimStatuses entry naming its claim");
        };
        let claims = Api::<ResourceClaim>::namespaced(self.client.clone(), &self.namespace);
        let claim = claims
            .get(&claim_name)
            .await
            .map_err(|error| Verdict::Fail(format!("get ResourceClaim {claim_name}: {error}")))?;
        let results = crate::claims::allocation_results(&claim);
        if !results
            .iter()
            .any(|result| result.driver == self.suite.driver)
        {
            return fail(format!(
                "claim {claim_name} has no allocation result of the driver"
            ));
        }
        self.delete_and_check_unprepared(&["single"], &ids).await?;
        // The resourceclaim controller deletes a claim made from a template with its pod.
        let deadline = Instant::now() + self.suite.timeout;
        while claims.get_opt(&claim_name).await.ok().flatten().is_some() {
            if Instant::now() > deadline {
                return fail(format!(
                    "claim {claim_name} still exists after its pod was deleted"
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    async fn containers_share_claim(&self) -> Result<(), Verdict> {
        self.create_template("pair", None).await?;
        self.create_pod(
            "pair",
            ClaimSource::Template("pair".into()),
            &["first", "second"],
        )
        .await?;
        self.wait_running("pair").await?;
        let first = self.container_devices("pair", "first").await?;
        let second = self.container_devices("pair", "second").await?;
        if first != second {
            return fail(format!(
                "container first got {first:?}, container second {second:?}"
            ));
        }
        self.delete_and_check_unprepared(&["pair"], &first).await
    }

    async fn pods_share_claim(&self) -> Result<(), Verdict> {
        self.create_claim("shared").await?;
        for pod in ["shared-a", "shared-b"] {
            self.create_pod(pod, ClaimSource::Claim("shared".into()), &["ctr"])
                .await?;
        }
        self.wait_running("shared-a").await?;
        self.wait_running("shared-b").await?;
        let a = self.container_devices("shared-a", "ctr").await?;
        let b = self.container_devices("shared-b", "ctr").await?;
        if a != b {
            return fail(format!("pod shared-a got {a:?}, pod shared-b {b:?}"));
        }
        let claims = Api::<ResourceClaim>::namespaced(self.client.clone(), &self.namespace);
        let claim = claims
            .get("shared")
            .await
            .map_err(|error| Verdict::Fail(format!("get ResourceClaim shared: {error}")))?;
        let reserved = claim
            .status
            .and_then(|status| status.reserved_for)
            .map_or(0, |reserved| reserved.len());
        if reserved != 2 {
            return fail(format!(
                "claim shared is reserved for {reserved} pods, not 2"
            ));
        }
        self.delete_and_check_unprepared(&["shared-a", "shared-b"], &a)
            .await?;
        let _ = claims.delete("shared", &DeleteParams::default()).await;
        Ok(())
    }

    async fn bad_config_isolated(&self) -> Result<(), Verdict> {
        let Some((parameters, expected)) = &self.suite.bad_config else {
            return Err(Verdict::Skip(
                "no bad config given (E2eSuite::bad_config)".into(),
            ));
        };
        self.create_template("bad-config", Some(parameters)).await?;
        self.create_template("good-neighbour", None).await?;
        self.create_pod(
            "bad-config",
            ClaimSource::Template("bad-config".into()),
            &["ctr"],
        )
        .await?;
        self.create_pod(
            "good-neighbour",
            ClaimSource::Template("good-neighbour".into()),
            &["ctr"],
        )
        .await?;
        self.wait_running("good-neighbour").await?;
        let ids = self.container_devices("good-neighbour", "ctr").await?;
        workload::wait_for_pod_event(
            &self.client,
            &self.namespace,
            "bad-config",
            expected,
            self.suite.timeout,
        )
        .await?;
        let pod = self
            .pods()
            .get("bad-config")
            .await
            .map_err(|error| Verdict::Fail(format!("get Pod bad-config: {error}")))?;
        let phase = pod.status.and_then(|status| status.phase);
        if phase.as_deref() == Some("Running") {
            return fail("pod bad-config runs although its claim could not be prepared");
        }
        if node_has_container(self, "bad-config") {
            return fail("the kubelet created a container of pod bad-config");
        }
        self.delete_and_check_unprepared(&["bad-config", "good-neighbour"], &ids)
            .await
    }

    /// Deletes the suite's pods (so their claims are unprepared), its namespace and class.
    async fn clean_up(&self) -> Result<(), E2eError> {
        let pods = self
            .pods()
            .list(&ListParams::default())
            .await
            .map_err(api_error(format!("list Pods in {}", self.namespace)))?;
        let names: Vec<String> = pods
            .items
            .into_iter()
            .filter_map(|pod| pod.metadata.name)
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        if let Err(Verdict::Fail(why) | Verdict::Skip(why)) = self
            .delete_and_check_unprepared(&names, &BTreeSet::new())
            .await
        {
            return Err(E2eError::Timeout {
                what: format!("cleaning up: {why}"),
                timeout: self.suite.timeout,
            });
        }
        let namespaces = Api::<k8s_openapi::api::core::v1::Namespace>::all(self.client.clone());
        let _ = namespaces
            .delete(&self.namespace, &DeleteParams::default())
            .await;
        let _ = Api::<DeviceClass>::all(self.client.clone())
            .delete(&self.class, &DeleteParams::default())
            .await;
        Ok(())
    }
}

/// Whether the CRI double created a container for the pod.
fn node_has_container(run: &Run<'_, '_>, pod: &str) -> bool {
    let Ok(node) = run.suite.cluster.node(&run.suite.node) else {
        return false;
    };
    let pod = format!("{}/{pod}", run.namespace);
    node.cri_log()
        .calls()
        .iter()
        .any(|call| call.call == "CreateContainer" && call.pod.as_deref() == Some(pod.as_str()))
}
