//! NodePrepareResources latency through the plugin's real Unix socket, against the fake API
//! server over loopback HTTP: the claim GET, the CDI spec write and the checkpoint writes are
//! all included.
//!
//! Run: `cargo bench -p dra-sdk --features testing --bench prepare`

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use dra_sdk::driver::ClaimRef;
use dra_sdk::plugin::KubeletPlugin;
use dra_sdk::testing::claims::AllocatedClaim;
use dra_sdk::testing::cluster::{NODE_NAME, TestCluster};
use dra_sdk::testing::kubelet::{KubeletVersion, RegisteredPlugin};
use tokio::runtime::Runtime;

// The tests' correct driver, shared so the bench measures the same thing they check.
#[path = "../tests/driver_common/mod.rs"]
mod driver_common;

use driver_common::{DRIVER, EnvDriver};

struct Bench {
    cluster: TestCluster,
    _plugin: KubeletPlugin,
    kubelet: RegisteredPlugin,
    next: usize,
}

impl Bench {
    async fn start() -> Self {
        let cluster = TestCluster::start().await.expect("cluster");
        let plugin = cluster
            .plugin(EnvDriver::default(), DRIVER)
            .start()
            .await
            .expect("plugin");
        let kubelet = cluster
            .register(&plugin, KubeletVersion::V1_36)
            .await
            .expect("register");
        Self {
            cluster,
            _plugin: plugin,
            kubelet,
            next: 0,
        }
    }

    async fn claims(&mut self, count: usize) -> Vec<ClaimRef> {
        let mut claims = Vec::with_capacity(count);
        for _ in 0..count {
            self.next += 1;
            let name = format!("claim-{}", self.next);
            let claim = AllocatedClaim::new("default", &name)
                .device("gpu", DRIVER, NODE_NAME, &format!("gpu-{}", self.next % 8))
                .create(&self.cluster.client())
                .await
                .expect("create claim");
            claims.push(ClaimRef {
                uid: claim.metadata.uid.expect("uid"),
                namespace: "default".into(),
                name,
            });
        }
        claims
    }

    /// Prepares a batch of fresh claims, timing only the prepare call, then unprepares them.
    async fn prepare_batch(&mut self, size: usize) -> Duration {
        let claims = self.claims(size).await;
        let started = Instant::now();
        let result = self.kubelet.prepare(&claims).await.expect("prepare");
        let elapsed = started.elapsed();
        assert!(result.values().all(Result::is_ok));
        self.kubelet.unprepare(&claims).await.expect("unprepare");
        elapsed
    }
}

fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let at = |p: f64| samples[((samples.len() - 1) as f64 * p) as usize];
    (at(0.5), at(0.99))
}

fn prepare(c: &mut Criterion) {
    // `RUST_LOG=dra_sdk::timing=debug` prints the plugin's time per step of each batch.
    if let Ok(filter) = std::env::var("RUST_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .init();
    }
    let runtime = Runtime::new().expect("runtime");
    let bench = Arc::new(tokio::sync::Mutex::new(runtime.block_on(Bench::start())));

    let mut group = c.benchmark_group("node_prepare_resources");
    group.sample_size(50);
    for size in [1usize, 100] {
        group.bench_function(format!("batch_of_{size}"), |b| {
            b.to_async(&runtime).iter_custom(|iterations| {
                let bench = Arc::clone(&bench);
                async move {
                    let mut bench = bench.lock().await;
                    let mut total = Duration::ZERO;
                    for _ in 0..iterations {
                        total += bench.prepare_batch(size).await;
                    }
                    total
                }
            })
        });
    }
    group.finish();

    // Percentiles criterion does not print.
    for (size, rounds) in [(1usize, 300), (100, 30)] {
        let samples = runtime.block_on(async {
            let mut bench = bench.lock().await;
            let mut samples = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                samples.push(bench.prepare_batch(size).await);
            }
            samples
        });
        let (p50, p99) = percentiles(samples);
        println!("prepare batch of {size}: p50 {p50:?}, p99 {p99:?} ({rounds} rounds)");
    }
}

criterion_group!(benches, prepare);
criterion_main!(benches);
