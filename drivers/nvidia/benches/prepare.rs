//! `NodePrepareResources` of one full-GPU claim and of one MIG claim with the mock backend,
//! through the plugin's real Unix socket, against the fake API server over loopback HTTP; and
//! with `DynamicMIG` (`dgx-h100`), `NodePrepareResources` plus `NodeUnprepareResources` of one
//! MIG partition: MIG mode on, GPU and compute instance created, CDI spec and checkpoint
//! written, then all of it undone. The mock backend's MIG calls change an in-memory table
//! (microseconds), so the figure is the driver's and the SDK's time.
//!
//! The driver is assembled as `gpu-kubelet-plugin --mock-profile dgx-a100` assembles it
//! ([`NvidiaPlugin::from_args`]: the mock machine's host tree in a temporary directory), so a
//! prepare does what it does in the shipped binary: the claim GET, the opaque config decoding,
//! the device nodes read from the host tree, the CDI spec write and the checkpoint writes.
//! Each sample prepares a fresh claim (never answered from the checkpoint); its unprepare runs
//! outside the timed section.
//!
//! With `--features nvml`, the same `dgx-h100` DynamicMIG machine once more on the NVML backend
//! over the libnvidia-ml double (`nvml-mock`): one full-GPU claim and one MIG partition claim
//! prepared (prepare only timed), beside the same two on the mock backend. The double answers
//! in microseconds, so the figure is the NVML backend's calls, not a GPU's.
//!
//! Run: `cargo bench -p dra-driver-nvidia --bench prepare` (add `--features nvml` for the
//! NVML rows; `--profile dist` measures the size-optimised build the plugin ships as).

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser as _;
use criterion::{Criterion, criterion_group, criterion_main};
use dra_driver_nvidia::devices::DRIVER_NAME;
use dra_driver_nvidia::driver::NvidiaDriver;
use dra_driver_nvidia::plugin::{Cli, NvidiaPlugin};
use dra_sdk::claim::ClaimRef;
use dra_sdk::plugin::KubeletPlugin;
use dra_sdk_testing::bench::{sample, total_time};
use dra_sdk_testing::claims::AllocatedClaim;
use dra_sdk_testing::cluster::{NODE_NAME, TestCluster};
use dra_sdk_testing::kubelet::{KubeletVersion, RegisteredPlugin};
use serde_json::json;
use tokio::runtime::Runtime;

/// What a claim asks for: the request name, the device and its opaque config kind.
#[derive(Clone, Copy)]
struct Kind {
    label: &'static str,
    request: &'static str,
    config_kind: &'static str,
}

const FULL_GPU: Kind = Kind {
    label: "full_gpu",
    request: "gpu",
    config_kind: "GpuConfig",
};
const MIG: Kind = Kind {
    label: "mig",
    request: "mig",
    config_kind: "MigDeviceConfig",
};
const DYNAMIC_MIG: Kind = Kind {
    label: "dynamic_mig",
    request: "mig",
    config_kind: "MigDeviceConfig",
};
/// A MIG partition (DynamicMIG), prepare only timed.
const PARTITION: Kind = Kind {
    label: "partition",
    request: "mig",
    config_kind: "MigDeviceConfig",
};

struct Bench {
    cluster: TestCluster,
    kubelet: RegisteredPlugin,
    _plugin: KubeletPlugin,
    _nvidia: NvidiaPlugin,
    /// The libnvidia-ml double the driver runs on, when over NVML.
    _double: Option<Box<dyn std::any::Any + Send + Sync>>,
    _host_root: tempfile::TempDir,
    gpu: String,
    mig: String,
    next: usize,
}

impl Bench {
    /// The plugin on the mock backend, or (`over_nvml`) on the NVML backend over the double
    /// serving the same machine.
    async fn start(profile: &str, gates: &str, over_nvml: bool) -> Self {
        let host_root = tempfile::tempdir().expect("host root");
        let root = host_root.path().join("host");
        let cli = Cli::try_parse_from([
            "gpu-kubelet-plugin",
            "--node-name",
            NODE_NAME,
            "--mock-profile",
            profile,
            "--feature-gates",
            gates,
            "--mock-host-root",
            root.to_str().expect("a UTF-8 temporary path"),
        ])
        .expect("flags");
        let nvidia = NvidiaPlugin::from_args(&cli.nvidia).expect("mock machine");
        let (driver, double) = if over_nvml {
            over_double(&nvidia, profile, &root)
        } else {
            (nvidia.driver.clone(), None)
        };
        let gpu = nvidia
            .discovery
            .gpus
            .first()
            .expect("a full GPU")
            .name
            .clone();
        // A static MIG device, or with DynamicMIG a partition.
        let mig = nvidia
            .discovery
            .migs
            .first()
            .map(|mig| mig.name.clone())
            .or_else(|| {
                let partition = nvidia.discovery.partitions.first()?;
                Some(partition.name.clone())
            })
            .expect("a MIG device");
        let cluster = TestCluster::start().await.expect("cluster");
        let plugin = cluster
            .plugin(driver, DRIVER_NAME)
            .start()
            .await
            .expect("plugin");
        let kubelet = cluster
            .register(&plugin, KubeletVersion::V1_36)
            .await
            .expect("register");
        Self {
            cluster,
            kubelet,
            _plugin: plugin,
            _nvidia: nvidia,
            _double: double,
            _host_root: host_root,
            gpu,
            mig,
            next: 0,
        }
    }

    async fn claim(&mut self, kind: Kind) -> ClaimRef {
        self.next += 1;
        let name = format!("{}-{}", kind.label.replace('_', "-"), self.next);
        let device = match kind.request {
            "mig" => &self.mig,
            _ => &self.gpu,
        };
        let claim = AllocatedClaim::new("default", &name)
            .device(kind.request, DRIVER_NAME, NODE_NAME, device)
            .claim_config(
                &[kind.request],
                DRIVER_NAME,
                json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": kind.config_kind}),
            )
            .create(&self.cluster.client())
            .await
            .expect("create claim");
        ClaimRef {
            uid: claim.metadata.uid.expect("uid"),
            namespace: "default".into(),
            name,
        }
    }

    /// Prepares one fresh claim, timing only the prepare call, then unprepares it (the
    /// device is free again for the next sample).
    async fn prepare_one(&mut self, kind: Kind) -> Duration {
        let claim = self.claim(kind).await;
        let claims = std::slice::from_ref(&claim);
        let started = Instant::now();
        let result = self.kubelet.prepare(claims).await.expect("prepare");
        let elapsed = started.elapsed();
        assert!(
            result.values().all(Result::is_ok),
            "{}: {result:?}",
            kind.label
        );
        let unprepared = self.kubelet.unprepare(claims).await.expect("unprepare");
        assert!(unprepared.values().all(Result::is_ok), "{unprepared:?}");
        // Dynamic MIG: the round trip is the measure (creating and destroying the instance).
        if kind.label == DYNAMIC_MIG.label {
            return started.elapsed();
        }
        elapsed
    }
}

/// The driver of `nvidia` rebuilt on the NVML backend over a double serving `profile` with
/// its device nodes under `root`.
#[cfg(feature = "nvml")]
fn over_double(
    nvidia: &NvidiaPlugin,
    profile: &str,
    root: &std::path::Path,
) -> (NvidiaDriver, Option<Box<dyn std::any::Any + Send + Sync>>) {
    use dra_driver_nvidia::backend::nvml::NvmlBackend;
    use dra_driver_nvidia::cdi::DriverRoot;
    let double = nvml_mock::NvmlDouble::with_root(profile, root).expect("the NVML double");
    let backend = Arc::new(NvmlBackend::open(double.library()).expect("NVML over the double"));
    let host = Arc::clone(&nvidia.host);
    let driver = NvidiaDriver::builder(backend.clone(), Arc::clone(&host))
        .driver_root(DriverRoot::new(host, "/"))
        .feature_gates(nvidia.driver.feature_gates().clone())
        .mig_manager(backend)
        .build();
    (driver, Some(Box::new(double)))
}

#[cfg(not(feature = "nvml"))]
fn over_double(
    _: &NvidiaPlugin,
    _: &str,
    _: &std::path::Path,
) -> (NvidiaDriver, Option<Box<dyn std::any::Any + Send + Sync>>) {
    unreachable!("the NVML rows are benchmarked with the nvml feature only")
}

fn prepare(c: &mut Criterion) {
    let runtime = Runtime::new().expect("runtime");
    let bench = Arc::new(tokio::sync::Mutex::new(
        runtime.block_on(Bench::start("dgx-a100", "", false)),
    ));
    let dynamic = Arc::new(tokio::sync::Mutex::new(runtime.block_on(Bench::start(
        "dgx-h100",
        "DynamicMIG=true",
        false,
    ))));
    let bench_for = |kind: Kind| {
        if kind.label == DYNAMIC_MIG.label {
            Arc::clone(&dynamic)
        } else {
            Arc::clone(&bench)
        }
    };

    let mut group = c.benchmark_group("nvidia_node_prepare_resources");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for kind in [FULL_GPU, MIG, DYNAMIC_MIG] {
        group.bench_function(kind.label, |b| {
            b.to_async(&runtime).iter_custom(|iterations| {
                let bench = bench_for(kind);
                async move {
                    total_time(&bench, iterations, async |bench: &mut Bench| {
                        bench.prepare_one(kind).await
                    })
                    .await
                }
            })
        });
    }
    group.finish();

    // Percentiles criterion does not print.
    let rounds = 200;
    for kind in [FULL_GPU, MIG, DYNAMIC_MIG] {
        let bench = bench_for(kind);
        let latencies = runtime.block_on(sample(&bench, rounds, async |bench: &mut Bench| {
            bench.prepare_one(kind).await
        }));
        let what = if kind.label == DYNAMIC_MIG.label {
            "prepare + unprepare"
        } else {
            "prepare"
        };
        println!(
            "{what} of one {} claim: {latencies}",
            kind.label.replace('_', "-")
        );
    }
}

/// `dgx-h100` with DynamicMIG (every partition published): a full-GPU claim and a partition
/// claim, prepare only timed, on the mock backend and on the NVML backend over the double.
fn prepare_dynamic_mig_backends(c: &mut Criterion) {
    let runtime = Runtime::new().expect("runtime");
    let backends: &[(&str, bool)] = if cfg!(feature = "nvml") {
        &[("mock", false), ("nvml", true)]
    } else {
        &[("mock", false)]
    };
    let mut group = c.benchmark_group("nvidia_prepare_dgx_h100_dynamic_mig");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    let mut percentiles = Vec::new();
    for &(backend, over_nvml) in backends {
        let bench = Arc::new(tokio::sync::Mutex::new(runtime.block_on(Bench::start(
            "dgx-h100",
            "DynamicMIG=true",
            over_nvml,
        ))));
        for kind in [FULL_GPU, PARTITION] {
            let id = format!("{backend}/{}", kind.label);
            group.bench_function(&id, |b| {
                b.to_async(&runtime).iter_custom(|iterations| {
                    let bench = Arc::clone(&bench);
                    async move {
                        total_time(&bench, iterations, async |bench: &mut Bench| {
                            bench.prepare_one(kind).await
                        })
                        .await
                    }
                })
            });
            let latencies = runtime.block_on(sample(&bench, 200, async |bench: &mut Bench| {
                bench.prepare_one(kind).await
            }));
            percentiles.push(format!(
                "prepare of one {id} claim (dgx-h100, DynamicMIG): {latencies}"
            ));
        }
    }
    group.finish();
    for line in percentiles {
        println!("{line}");
    }
}

criterion_group!(benches, prepare, prepare_dynamic_mig_backends);
criterion_main!(benches);
