//! NodePrepareResources latency through the plugin's real Unix socket, against the fake API
//! server over loopback HTTP: the claim GET, the CDI spec write and the checkpoint writes are
//! all included.
//!
//! Then, with the API client a shipped plugin builds from its command line's defaults
//! (`PluginArgs::kube_client`, client-side rate limits included): 80 one-claim prepares one
//! after another and 64 at once, as a node starting many pods sends them; and the same with
//! the single 5/s limit every request shared before prepares had a budget of their own.
//!
//! Run: `cargo bench -p dra-sdk --features testing --bench prepare`

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use criterion::{Criterion, criterion_group, criterion_main};
use dra_sdk::advanced::rate_limit::RateLimitLayer;
use dra_sdk::claim::ClaimRef;
use dra_sdk::cli::PluginArgs;
use dra_sdk::plugin::KubeletPlugin;
use dra_sdk_testing::bench::{Latencies, sample, total_time};
use dra_sdk_testing::claims::AllocatedClaim;
use dra_sdk_testing::cluster::{NODE_NAME, TestCluster};
use dra_sdk_testing::kubelet::{KubeletVersion, RegisteredPlugin};
use tokio::runtime::Runtime;

// The tests' correct driver, shared so the bench measures the same thing they check.

use dra_sdk_testing::sample_driver::{DRIVER, EnvDriver};

struct Bench {
    cluster: TestCluster,
    _plugin: KubeletPlugin,
    kubelet: RegisteredPlugin,
    next: usize,
}

/// A plugin's command line: the SDK's flags, at their defaults unless given.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    plugin: PluginArgs,
}

/// Which API client the plugin gets.
enum ClientKind {
    /// The test cluster's client: no client-side limit.
    Unlimited,
    /// What `PluginArgs::kube_client` builds from the defaults, as the shipped plugins do.
    ShippedDefaults,
    /// Before prepares had a budget of their own: every request under one limit of 5 per
    /// second, bursts of 10.
    OneSharedLimit,
}

impl Bench {
    async fn start() -> Self {
        Self::start_with(ClientKind::Unlimited).await
    }

    async fn start_with(kind: ClientKind) -> Self {
        let cluster = TestCluster::start().await.expect("cluster");
        let kubeconfig = cluster.path().join("bench.kubeconfig");
        cluster
            .api()
            .write_kubeconfig(&kubeconfig)
            .expect("kubeconfig");
        let cli = Cli::parse_from([
            "bench",
            "--node-name",
            NODE_NAME,
            "--kubeconfig",
            kubeconfig.to_str().expect("UTF-8 path"),
        ]);
        let client = match kind {
            ClientKind::Unlimited => cluster.client(),
            ClientKind::ShippedDefaults => cli.plugin.kube_client().await.expect("client"),
            ClientKind::OneSharedLimit => {
                let layer = RateLimitLayer::new(5.0, 10)
                    .and_then(|layer| layer.prepare(5.0, 10))
                    .expect("limit");
                let config = kube::Config::from_custom_kubeconfig(
                    kube::config::Kubeconfig::read_from(&kubeconfig).expect("kubeconfig"),
                    &Default::default(),
                )
                .await
                .expect("config");
                kube::client::ClientBuilder::try_from(config)
                    .expect("client")
                    .with_layer(&layer)
                    .build()
            }
        };
        let plugin = cluster
            .plugin_with_client(EnvDriver::default(), DRIVER, client)
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

/// 80 one-claim prepares one after another; then, on a fresh plugin and client (full
/// buckets), 64 at once (each its own call on the one connection, as the kubelet sends them
/// for pods starting together): per-call p50 and p90, and the wall time of the 64.
async fn shipped_client(kind: fn() -> ClientKind, label: &str) {
    let mut bench = Bench::start_with(kind()).await;
    let claims = bench.claims(80).await;
    let mut sequential = Vec::with_capacity(claims.len());
    for claim in &claims {
        let started = Instant::now();
        let result = bench
            .kubelet
            .prepare(std::slice::from_ref(claim))
            .await
            .expect("prepare");
        sequential.push(started.elapsed());
        assert!(result.values().all(Result::is_ok), "{result:?}");
    }
    drop(bench);
    let mut bench = Bench::start_with(kind()).await;
    let claims = bench.claims(64).await;
    let started = Instant::now();
    let concurrent = futures::future::join_all(claims.iter().map(|claim| {
        let kubelet = bench.kubelet.clone();
        async move {
            let started = Instant::now();
            let result = kubelet
                .prepare(std::slice::from_ref(claim))
                .await
                .expect("prepare");
            assert!(result.values().all(Result::is_ok), "{result:?}");
            started.elapsed()
        }
    }))
    .await;
    let wall = started.elapsed();
    let (sequential, concurrent) = (Latencies::new(sequential), Latencies::new(concurrent));
    let (p50, p90) = (sequential.at(0.5), sequential.at(0.9));
    println!("{label}: 80 sequential one-claim prepares: p50 {p50:?}, p90 {p90:?}");
    let (p50, p90) = (concurrent.at(0.5), concurrent.at(0.9));
    println!(
        "{label}: 64 concurrent one-claim prepares: p50 {p50:?}, p90 {p90:?}, all done in {wall:?}"
    );
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
                    total_time(&bench, iterations, async |bench: &mut Bench| {
                        bench.prepare_batch(size).await
                    })
                    .await
                }
            })
        });
    }
    group.finish();

    // Percentiles criterion does not print.
    for (size, rounds) in [(1usize, 300), (100, 30)] {
        let latencies = runtime.block_on(sample(&bench, rounds, async |bench: &mut Bench| {
            bench.prepare_batch(size).await
        }));
        println!("prepare batch of {size}: {latencies}");
    }

    runtime.block_on(shipped_client(
        || ClientKind::ShippedDefaults,
        "shipped defaults (prepare budget 50/s, burst 100)",
    ));
    runtime.block_on(shipped_client(
        || ClientKind::OneSharedLimit,
        "one shared limit (5/s, burst 10: before)",
    ));
}

criterion_group!(benches, prepare);
criterion_main!(benches);
