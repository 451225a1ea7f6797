//! A soak workload: prepare and unprepare cycles of mixed claims through a plugin's real
//! socket, sampled with a [`LeakProbe`] along the way. The soak bench of `dra-sdk` runs ten
//! thousand cycles of it; its tests a few hundred.
//!
//! The claims are created once and cycled: each prepare reads the claim from the API server
//! again (its record is gone after the unprepare), and the API server's store does not grow
//! with the cycles, so what grows is the plugin's. The mix:
//!
//! | claim | devices | config | answer |
//! |---|---|---|---|
//! | `one-gpu` | 1 | none | prepared |
//! | `two-gpus` | 2 | from the claim | prepared |
//! | `four-gpus` | 4 | from the class and the claim | prepared |
//! | `bad-config` | 1 | malformed (`sharing: 5`) | error naming the config |
//! | `driver-fails` | 1 | `sharing: fail` | the driver's error |
//!
//! Every fourth cycle prepares all five in one batch, the others one claim each.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use dra_sdk_testing::faults::leaks::soak::Soak;
//!
//! let mut soak = Soak::start().await?;
//! let curve = soak.run(300, 6).await?;
//! println!("{curve}");
//! soak.shutdown().await?;
//! # Ok(()) }
//! ```

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dra_sdk::claim::{Claim, ClaimRef, DriverError, RecordedClaim};
use dra_sdk::config::ConfigRegistry;
use dra_sdk::driver::{Driver, PreparedClaim};
use dra_sdk::plugin::KubeletPlugin;
use serde_json::json;

use super::{LeakError, LeakProbe, Sample};
use crate::claims::AllocatedClaim;
use crate::cluster::{ClusterError, NODE_NAME, TestCluster, claim_ref};
use crate::kubelet::{KubeletError, KubeletVersion, RegisteredPlugin};
use crate::sample_driver::{DRIVER, GpuConfig, prepare_gpus};

/// How long descriptors and tasks get to return to the baseline after the last cycle: the
/// connections' and streams' tasks end a moment after the answers.
const SETTLE: Duration = Duration::from_secs(10);

/// Why a soak stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SoakError {
    /// The cluster or plugin could not start or stop.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// A call to the plugin failed as a whole.
    #[error("cycle {cycle}: {source}")]
    Kubelet {
        /// The cycle.
        cycle: usize,
        /// The error.
        #[source]
        source: KubeletError,
    },
    /// A probe failed, or found something left behind after the last cycle.
    #[error(transparent)]
    Probe(#[from] LeakError),
    /// The plugin answered a claim differently from what the mix expects.
    #[error("cycle {cycle}, claim {claim}: {detail}")]
    Unexpected {
        /// The cycle.
        cycle: usize,
        /// The claim's name.
        claim: String,
        /// What was expected and what came.
        detail: String,
    },
}

/// The sample driver's GPU preparation, failing claims whose config says `sharing: fail`.
#[derive(Default)]
struct SoakDriver {
    prepares: AtomicU64,
}

#[async_trait::async_trait]
impl Driver for SoakDriver {
    type Config = GpuConfig;

    fn config_registry(&self) -> ConfigRegistry<GpuConfig> {
        ConfigRegistry::new().register::<GpuConfig>()
    }

    async fn prepare(&self, claim: &Claim<GpuConfig>) -> Result<PreparedClaim, DriverError> {
        self.prepares.fetch_add(1, Ordering::Relaxed);
        let fails = claim.devices.iter().any(|device| {
            device
                .config()
                .is_some_and(|config| config.sharing.as_deref() == Some("fail"))
        });
        if fails {
            return Err(DriverError::other("simulated driver failure"));
        }
        Ok(prepare_gpus(claim))
    }

    async fn unprepare(&self, _: &RecordedClaim) -> Result<(), DriverError> {
        Ok(())
    }
}

/// One claim of the mix and the answer it must get.
struct MixedClaim {
    claim: ClaimRef,
    /// `Ok(devices)`, or a piece of the error message.
    expect: Result<usize, &'static str>,
}

/// Samples taken along a soak: `(cycle, sample)`, the first before the first cycle, the last
/// after the plugin settled.
#[derive(Clone, Debug, Default)]
pub struct Curve {
    /// The samples, in order.
    pub points: Vec<(usize, Sample)>,
}

impl Curve {
    /// The first sample (the baseline).
    pub fn start(&self) -> Option<Sample> {
        self.points.first().map(|(_, sample)| *sample)
    }

    /// The last sample (settled after the last cycle).
    pub fn end(&self) -> Option<Sample> {
        self.points.last().map(|(_, sample)| *sample)
    }
}

/// One line per sample: `cycle 2500: fds 14, rss 22.1 MiB, tasks 40`.
impl fmt::Display for Curve {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (cycle, sample) in &self.points {
            writeln!(f, "cycle {cycle:>6}: {sample}")?;
        }
        Ok(())
    }
}

/// A plugin with the soak's driver, registered with a simulated kubelet (1.36), and the mix of
/// claims.
pub struct Soak {
    cluster: TestCluster,
    plugin: KubeletPlugin,
    kubelet: RegisteredPlugin,
    driver: Arc<SoakDriver>,
    claims: Vec<MixedClaim>,
    probe: LeakProbe,
}

impl fmt::Debug for Soak {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Soak")
            .field("cluster", &self.cluster)
            .field("probe", &self.probe)
            .finish_non_exhaustive()
    }
}

impl Soak {
    /// Starts the cluster and the plugin and creates the claims. The probe counts the
    /// descriptors under the cluster's directory and the tasks of the calling runtime; see
    /// [`with_probe`](Self::with_probe) for a whole process.
    pub async fn start() -> Result<Self, SoakError> {
        let cluster = TestCluster::start().await?;
        let driver = Arc::new(SoakDriver::default());
        let plugin = cluster
            .plugin(Arc::clone(&driver), DRIVER)
            .start()
            .await
            .map_err(ClusterError::from)?;
        let kubelet = cluster
            .register(&plugin, KubeletVersion::V1_36)
            .await
            .map_err(ClusterError::from)?;
        let probe = LeakProbe::current().scoped_to(cluster.path());
        let mut soak = Self {
            cluster,
            plugin,
            kubelet,
            driver,
            claims: Vec::new(),
            probe,
        };
        soak.create_claims().await?;
        Ok(soak)
    }

    /// Measures with `probe` instead (a bench in a process of its own: all descriptors).
    #[must_use]
    pub fn with_probe(mut self, probe: LeakProbe) -> Self {
        self.probe = probe;
        self
    }

    /// The cluster's directory (CDI specs under `cdi`, the checkpoint under `plugins`).
    pub fn path(&self) -> &Path {
        self.cluster.path()
    }

    /// How many times the driver was asked to prepare a claim.
    pub fn driver_prepares(&self) -> u64 {
        self.driver.prepares.load(Ordering::Relaxed)
    }

    async fn create_claims(&mut self) -> Result<(), SoakError> {
        let gpu = |claim: AllocatedClaim, request: &str, first: usize, count: usize| {
            (first..first + count).fold(claim, |claim, index| {
                claim.device(request, DRIVER, NODE_NAME, &format!("gpu-{index}"))
            })
        };
        let config = |sharing: serde_json::Value| json!({ "apiVersion": "gpu.example.com/v1", "kind": "GpuConfig", "sharing": sharing });
        let mix: Vec<(AllocatedClaim, Result<usize, &'static str>)> = vec![
            (
                gpu(AllocatedClaim::new("default", "one-gpu"), "gpu", 0, 1),
                Ok(1),
            ),
            (
                gpu(AllocatedClaim::new("default", "two-gpus"), "gpu", 1, 2).claim_config(
                    &[],
                    DRIVER,
                    config(json!("time-slicing")),
                ),
                Ok(2),
            ),
            (
                gpu(AllocatedClaim::new("default", "four-gpus"), "gpus", 3, 4)
                    .class_config(&[], DRIVER, config(json!("mps")))
                    .claim_config(&["gpus"], DRIVER, config(json!("none"))),
                Ok(4),
            ),
            (
                gpu(AllocatedClaim::new("default", "bad-config"), "gpu", 7, 1).claim_config(
                    &[],
                    DRIVER,
                    config(json!(5)),
                ),
                Err("sharing"),
            ),
            (
                gpu(AllocatedClaim::new("default", "driver-fails"), "gpu", 8, 1).claim_config(
                    &[],
                    DRIVER,
                    config(json!("fail")),
                ),
                Err("simulated driver failure"),
            ),
        ];
        for (claim, expect) in mix {
            let object = claim
                .create(&self.cluster.client())
                .await
                .map_err(|source| ClusterError::Api {
                    action: "create a soak claim".into(),
                    source,
                })?;
            self.claims.push(MixedClaim {
                claim: claim_ref(&object)?,
                expect,
            });
        }
        Ok(())
    }

    /// Cycle `index`: prepares its batch, checks every answer, unprepares the batch and checks
    /// that each unprepare succeeded.
    pub async fn cycle(&self, index: usize) -> Result<(), SoakError> {
        let batch: Vec<&MixedClaim> = if index.is_multiple_of(4) {
            self.claims.iter().collect()
        } else {
            vec![&self.claims[index % self.claims.len()]]
        };
        let refs: Vec<ClaimRef> = batch.iter().map(|mixed| mixed.claim.clone()).collect();
        let kubelet = |source| SoakError::Kubelet {
            cycle: index,
            source,
        };
        let prepared = self.kubelet.prepare(&refs).await.map_err(kubelet)?;
        for mixed in &batch {
            let unexpected = |detail: String| SoakError::Unexpected {
                cycle: index,
                claim: mixed.claim.name.clone(),
                detail,
            };
            match (&mixed.expect, prepared.get(&mixed.claim.uid)) {
                (Ok(devices), Some(Ok(got))) if got.len() == *devices => {}
                (Err(needle), Some(Err(message))) if message.contains(needle) => {}
                (expect, got) => {
                    return Err(unexpected(format!("expected {expect:?}, got {got:?}")));
                }
            }
        }
        let unprepared = self.kubelet.unprepare(&refs).await.map_err(kubelet)?;
        if let Some((uid, Err(message))) = unprepared.iter().find(|(_, outcome)| outcome.is_err()) {
            return Err(SoakError::Unexpected {
                cycle: index,
                claim: uid.clone(),
                detail: format!("unprepare failed: {message}"),
            });
        }
        Ok(())
    }

    /// Runs `cycles` cycles after a warm-up (two rounds of the mix: the API client's
    /// connections, version discovery and the checkpoint file exist from then on), sampling
    /// before the first, every `cycles / points` cycles, and once more after the last, when
    /// descriptors and tasks are back at the baseline (else [`LeakError::Leaked`]). Also
    /// checks that no CDI spec is left.
    pub async fn run(&mut self, cycles: usize, points: usize) -> Result<Curve, SoakError> {
        for warm_up in 0..2 * self.claims.len() {
            self.cycle(warm_up).await?;
        }
        let every = (cycles / points.max(1)).max(1);
        let baseline = self.probe.steady().await?;
        let mut curve = Curve {
            points: vec![(0, baseline)],
        };
        let started = Instant::now();
        for index in 0..cycles {
            self.cycle(index).await?;
            let done = index + 1;
            if done.is_multiple_of(every) && done < cycles {
                curve.points.push((done, self.probe.sample()?));
            }
        }
        tracing::info!(cycles, elapsed = ?started.elapsed(), "soak done");
        let end = self.probe.settled(&baseline, SETTLE).await?;
        curve.points.push((cycles, end));
        let specs = std::fs::read_dir(self.cluster.cdi_root())
            .map(|entries| entries.count())
            .unwrap_or(0);
        if specs != 0 {
            return Err(SoakError::Unexpected {
                cycle: cycles,
                claim: "(all)".into(),
                detail: format!("{specs} CDI specs left after the last unprepare"),
            });
        }
        Ok(curve)
    }

    /// Stops the plugin.
    pub async fn shutdown(self) -> Result<(), SoakError> {
        self.plugin.shutdown().await.map_err(ClusterError::from)?;
        Ok(())
    }
}
