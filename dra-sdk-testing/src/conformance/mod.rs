//! A conformance suite for DRA kubelet plugins: checks a driver against the kubelet's contract
//! without a cluster, the way `csi-sanity` does for CSI drivers.
//!
//! One call runs every [`Case`] and returns a [`Report`] with each case by name, its outcome
//! and its duration. Two kinds of target:
//!
//! - **In process** ([`Conformance::in_process`]): the suite starts a [`TestCluster`] (fake API
//!   server, Node, temporary kubelet and CDI directories), starts the driver's plugin in it from
//!   a factory, and can restart it, so every case runs.
//! - **Remote** ([`Conformance::remote`]): a plugin that is already running, reached through
//!   its registration socket, plus optionally a client of its API server, its node name and its
//!   CDI directory. Cases that need what is missing are reported as skipped, with the reason.
//!
//! Claims for the cases are created in the API and allocated from the driver's published
//! ResourceSlices with the [allocator](dra_sdk_allocator), through a DeviceClass
//! `dra-conformance.<driver>` (selector `device.driver == "<driver>"`) the suite creates.
//! Each case needs at most three devices at a time; claims are unprepared and deleted after
//! each case.
//!
//! ```no_run
//! use dra_sdk::cdi::ContainerEdits;
//! use dra_sdk::claim::{Claim, DriverError, RecordedClaim};
//! use dra_sdk::driver::{Driver, PreparedClaim, PreparedDevice};
//! use dra_sdk::slices::{Device, DriverResources};
//! use dra_sdk_testing::cluster::NODE_NAME;
//! use dra_sdk_testing::conformance::Conformance;
//!
//! struct MyDriver;
//!
//! #[dra_sdk::async_trait]
//! impl Driver for MyDriver {
//!     type Config = ();
//!     async fn prepare(&self, claim: &Claim<()>) -> Result<PreparedClaim, DriverError> {
//!         let devices = claim.devices.iter().map(|device| {
//!             PreparedDevice::new(device, ContainerEdits::new().env("MY_DEVICE", &device.device.name))
//!         });
//!         Ok(PreparedClaim::new(devices.collect()))
//!     }
//!     async fn unprepare(&self, _: &RecordedClaim) -> Result<(), DriverError> {
//!         Ok(())
//!     }
//! }
//!
//! #[tokio::test]
//! async fn my_driver_is_conformant() {
//!     let devices = (0..4).map(|i| Device::new(format!("gpu-{i}"))).collect();
//!     let resources = DriverResources::single_pool(NODE_NAME, devices);
//!     let report = Conformance::in_process("gpu.example.com", resources, || MyDriver)
//!         .run()
//!         .await
//!         .expect("the suite could not start");
//!     println!("{report}");
//!     report.assert_passed();
//! }
//! ```
//!
//! See `docs/conformance.md` for what each case proves.

mod cases;
mod report;
mod session;
pub mod slices;

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tracing::Instrument;

pub use self::report::{CaseReport, Outcome, Report};
use self::session::Session;
use crate::cluster::{ClusterError, TestCluster};
use dra_sdk::driver::Driver;
use dra_sdk::plugin::{KubeletPlugin, PluginBuilder, PluginError};
use dra_sdk::slices::DriverResources;

/// Default namespace of the claims the suite creates.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Default time limit of one case.
pub const DEFAULT_CASE_TIMEOUT: Duration = Duration::from_secs(120);

/// The cases, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Case {
    /// `registration`: `GetInfo` answers within the kubelet's 1 s, with type `DRAPlugin`, a
    /// valid driver name, a reachable endpoint and known services, and every kubelet release
    /// from 1.34 on registers the plugin.
    Registration,
    /// `slices-valid`: the published ResourceSlices are valid for the limits of the API
    /// server's release, and every pool is complete.
    SlicesValid,
    /// `api-versions`: both `v1.DRAPlugin` and `v1beta1.DRAPlugin` are advertised and serve
    /// prepare and unprepare, and they share state.
    ApiVersions,
    /// `prepare-idempotent`: preparing a prepared claim again returns the same answer.
    PrepareIdempotent,
    /// `unprepare-unknown`: unprepare of claims never prepared, and a second unprepare,
    /// succeed.
    UnprepareUnknown,
    /// `every-claim-answered`: every claim of a batch gets exactly one answer, also unknown
    /// ones, and an empty batch gets an empty answer.
    EveryClaimAnswered,
    /// `bad-config-isolated`: claims with an unknown or malformed opaque config fail with a
    /// message, and only they: the other claims of the batch are prepared.
    BadConfigIsolated,
    /// `concurrent-prepare-unprepare`: concurrent prepare and unprepare calls for one claim
    /// all succeed, give one answer, and leave the claim consistent.
    ConcurrentPrepareUnprepare,
    /// `cdi-specs`: after prepare the CDI spec files exist and validate; after unprepare the
    /// claim's devices and files are gone, shared ones stay while in use.
    CdiSpecs,
    /// `cdi-ids-resolve`: every CDI ID in a prepare answer is well formed and defined by
    /// exactly one valid spec file.
    CdiIdsResolve,
    /// `health-stream`: each advertised health service (`v1.DRAResourceHealth` for 1.37
    /// kubelets, `v1alpha1.DRAResourceHealth` for 1.34+) sends a full device list at once, of
    /// published devices, and both report the same devices; without either, the v1alpha1
    /// stream 1.36 kubelets open anyway is noted.
    HealthStream,
    /// `restart-keeps-claims`: after a plugin restart, prepared claims are still prepared
    /// (same answer, same CDI devices) and can be unprepared, also once the ResourceClaim is
    /// gone from the API.
    RestartKeepsClaims,
}

impl Case {
    /// Every case, in the order they run.
    pub const ALL: [Case; 12] = [
        Case::Registration,
        Case::SlicesValid,
        Case::ApiVersions,
        Case::PrepareIdempotent,
        Case::UnprepareUnknown,
        Case::EveryClaimAnswered,
        Case::BadConfigIsolated,
        Case::ConcurrentPrepareUnprepare,
        Case::CdiSpecs,
        Case::CdiIdsResolve,
        Case::HealthStream,
        Case::RestartKeepsClaims,
    ];

    /// The stable name reports use.
    pub fn name(self) -> &'static str {
        match self {
            Case::Registration => "registration",
            Case::SlicesValid => "slices-valid",
            Case::ApiVersions => "api-versions",
            Case::PrepareIdempotent => "prepare-idempotent",
            Case::UnprepareUnknown => "unprepare-unknown",
            Case::EveryClaimAnswered => "every-claim-answered",
            Case::BadConfigIsolated => "bad-config-isolated",
            Case::ConcurrentPrepareUnprepare => "concurrent-prepare-unprepare",
            Case::CdiSpecs => "cdi-specs",
            Case::CdiIdsResolve => "cdi-ids-resolve",
            Case::HealthStream => "health-stream",
            Case::RestartKeepsClaims => "restart-keeps-claims",
        }
    }

    /// What the case proves, in one line.
    pub fn description(self) -> &'static str {
        match self {
            Case::Registration => "registration answers fast and correctly",
            Case::SlicesValid => "published slices are valid for the server's limits",
            Case::ApiVersions => "both DRA API versions serve",
            Case::PrepareIdempotent => "prepare is idempotent",
            Case::UnprepareUnknown => "unprepare of unknown claims succeeds",
            Case::EveryClaimAnswered => "every requested claim gets an answer",
            Case::BadConfigIsolated => "bad configs fail one claim only",
            Case::ConcurrentPrepareUnprepare => "concurrent prepare/unprepare of a claim is safe",
            Case::CdiSpecs => "CDI specs exist and validate, and are removed",
            Case::CdiIdsResolve => "returned CDI IDs resolve to devices in the specs",
            Case::HealthStream => "the health stream is served as advertised",
            Case::RestartKeepsClaims => "restart keeps prepared claims",
        }
    }
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Case {
    type Err = ConformanceError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Case::ALL
            .into_iter()
            .find(|case| case.name() == name)
            .ok_or_else(|| ConformanceError::UnknownCase(name.to_owned()))
    }
}

/// Why the suite could not run at all (as opposed to cases failing).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConformanceError {
    /// The in-process test cluster could not start.
    #[error("starting the test cluster: {0}")]
    Cluster(#[from] ClusterError),
    /// The in-process plugin could not start.
    #[error("starting the plugin: {0}")]
    Start(#[source] PluginError),
    /// The remote registration socket does not exist or is not a socket.
    #[error("{path}: {reason}")]
    Socket {
        /// The socket path.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The plugin does not answer `GetInfo` on its registration socket.
    #[error("GetInfo on {path}: {message}")]
    GetInfo {
        /// The socket path.
        path: PathBuf,
        /// The transport or gRPC error.
        message: String,
    },
    /// A case name given to [`Conformance::only`] or [`Conformance::skip`] does not exist.
    #[error("unknown conformance case {0:?}")]
    UnknownCase(String),
}

/// Starts the plugin under test in a test cluster; called again by the restart case.
type StartPlugin = Arc<
    dyn Fn(&TestCluster) -> BoxFuture<'static, Result<KubeletPlugin, PluginError>> + Send + Sync,
>;

enum Target {
    InProcess {
        driver_name: Option<String>,
        start: StartPlugin,
    },
    Remote {
        registration: PathBuf,
        client: Option<kube::Client>,
        node_name: Option<String>,
        cdi_root: Option<PathBuf>,
    },
}

/// Configures and runs the conformance suite. See the [module documentation](self).
pub struct Conformance {
    target: Target,
    namespace: String,
    cases: BTreeSet<Case>,
    case_timeout: Duration,
}

impl fmt::Debug for Conformance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let target = match &self.target {
            Target::InProcess { driver_name, .. } => format!("in-process {driver_name:?}"),
            Target::Remote { registration, .. } => registration.display().to_string(),
        };
        f.debug_struct("Conformance")
            .field("target", &target)
            .field("namespace", &self.namespace)
            .field("cases", &self.cases)
            .finish_non_exhaustive()
    }
}

impl Conformance {
    /// The suite against `driver_name`'s plugin, run in process: `factory` makes a driver for
    /// each start of the plugin (the restart case starts a second one on the same directories),
    /// which publishes `resources` on the test cluster's node
    /// ([`NODE_NAME`](crate::cluster::NODE_NAME)).
    pub fn in_process<D, F>(driver_name: &str, resources: DriverResources, factory: F) -> Self
    where
        D: Driver,
        F: Fn() -> D + Send + Sync + 'static,
    {
        let name = driver_name.to_owned();
        let mut suite = Self::in_process_with(move |cluster| {
            cluster
                .plugin(factory(), &name)
                .resources(resources.clone())
        });
        if let Target::InProcess { driver_name: d, .. } = &mut suite.target {
            *d = Some(driver_name.to_owned());
        }
        suite
    }

    /// Like [`in_process`](Self::in_process), for plugins that need more settings: `build`
    /// returns the plugin builder (start from [`TestCluster::plugin`] and add resources, a CDI
    /// kind, health …); the suite starts it.
    pub fn in_process_with<D, F>(build: F) -> Self
    where
        D: Driver,
        F: Fn(&TestCluster) -> PluginBuilder<D> + Send + Sync + 'static,
    {
        let start: StartPlugin = Arc::new(move |cluster| Box::pin(build(cluster).start()));
        Self::new(Target::InProcess {
            driver_name: None,
            start,
        })
    }

    /// The suite against a running plugin, reached through its registration socket. Without
    /// [`client`](Self::client) the cases that need claims are skipped; without
    /// [`cdi_root`](Self::cdi_root) the CDI cases are; the restart case always is.
    pub fn remote(registration_socket: impl Into<PathBuf>) -> Self {
        Self::new(Target::Remote {
            registration: registration_socket.into(),
            client: None,
            node_name: None,
            cdi_root: None,
        })
    }

    fn new(target: Target) -> Self {
        Self {
            target,
            namespace: DEFAULT_NAMESPACE.to_owned(),
            cases: Case::ALL.into_iter().collect(),
            case_timeout: DEFAULT_CASE_TIMEOUT,
        }
    }

    /// Remote targets: a client of the plugin's API server, to create and allocate claims
    /// and read ResourceSlices.
    pub fn client(mut self, client: kube::Client) -> Self {
        if let Target::Remote { client: c, .. } = &mut self.target {
            *c = Some(client);
        }
        self
    }

    /// Remote targets: the plugin's node. Without it the suite uses the node of the driver's
    /// node-local ResourceSlices when they name exactly one.
    pub fn node_name(mut self, node_name: impl Into<String>) -> Self {
        if let Target::Remote { node_name: n, .. } = &mut self.target {
            *n = Some(node_name.into());
        }
        self
    }

    /// Remote targets: the directory the plugin writes CDI specs to.
    pub fn cdi_root(mut self, cdi_root: impl Into<PathBuf>) -> Self {
        if let Target::Remote { cdi_root: c, .. } = &mut self.target {
            *c = Some(cdi_root.into());
        }
        self
    }

    /// Namespace of the claims the suite creates (default `default`; it must exist).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Runs only these cases (names as in [`Case::name`]).
    pub fn only<I, S>(mut self, cases: I) -> Result<Self, ConformanceError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.cases = cases
            .into_iter()
            .map(|name| name.as_ref().parse())
            .collect::<Result<_, _>>()?;
        Ok(self)
    }

    /// Leaves these cases out.
    pub fn skip<I, S>(mut self, cases: I) -> Result<Self, ConformanceError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        for name in cases {
            let case: Case = name.as_ref().parse()?;
            self.cases.remove(&case);
        }
        Ok(self)
    }

    /// Time limit of one case (default [`DEFAULT_CASE_TIMEOUT`]); a case that takes longer
    /// fails.
    pub fn case_timeout(mut self, timeout: Duration) -> Self {
        self.case_timeout = timeout;
        self
    }

    /// Runs the selected cases, one after the other, and cleans up what they created.
    ///
    /// Fails only when the target cannot be reached at all; everything else is a case
    /// outcome in the report.
    pub async fn run(self) -> Result<Report, ConformanceError> {
        let Self {
            target,
            namespace,
            cases,
            case_timeout,
        } = self;
        let mut session = Session::open(target, namespace).await?;
        let mut report = Report::new(session.driver().to_owned(), session.target_name());
        for case in cases {
            let span =
                tracing::info_span!("conformance", case = case.name(), driver = %session.driver());
            let started = Instant::now();
            let outcome = tokio::time::timeout(case_timeout, cases::run(case, &mut session))
                .instrument(span.clone())
                .await;
            let duration = started.elapsed();
            session.cleanup().instrument(span).await;
            let (outcome, notes) = match outcome {
                Ok(Ok(notes)) => (Outcome::Passed, notes),
                Ok(Err(verdict)) => (verdict.into(), Vec::new()),
                Err(_) => (
                    Outcome::Failed(format!("did not finish within {case_timeout:?}")),
                    Vec::new(),
                ),
            };
            report.cases.push(CaseReport {
                name: case.name(),
                description: case.description(),
                outcome,
                duration,
                notes,
            });
        }
        session.close().await;
        Ok(report)
    }
}

/// Why a case did not pass.
#[derive(Debug)]
enum Verdict {
    Fail(String),
    Skip(String),
}

impl From<Verdict> for Outcome {
    fn from(verdict: Verdict) -> Self {
        match verdict {
            Verdict::Fail(message) => Outcome::Failed(message),
            Verdict::Skip(reason) => Outcome::Skipped(reason),
        }
    }
}

/// A case's result: its notes when it passed.
type CaseResult = Result<Vec<String>, Verdict>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn case_names_round_trip_and_are_unique() {
        let names: BTreeSet<&str> = Case::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(names.len(), Case::ALL.len());
        for case in Case::ALL {
            assert_eq!(case.name().parse::<Case>().unwrap(), case);
            assert!(!case.description().is_empty());
        }
        assert!(matches!(
            "no-such-case".parse::<Case>(),
            Err(ConformanceError::UnknownCase(name)) if name == "no-such-case"
        ));
    }

    #[test]
    fn only_and_skip_select_cases() {
        let suite = Conformance::remote("/nonexistent")
            .only(["registration", "cdi-specs"])
            .unwrap()
            .skip(["cdi-specs"])
            .unwrap();
        assert_eq!(
            suite.cases.into_iter().collect::<Vec<_>>(),
            [Case::Registration]
        );
        assert!(Conformance::remote("/x").only(["nope"]).is_err());
    }
}
