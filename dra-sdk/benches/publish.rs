//! Publishing 10,000 devices in one pool through the fake API server over loopback HTTP.
//!
//! Measures the time until the publisher reports the pool synced, then the time to publish a
//! one-device change, and prints the API requests each took (the target for the change is a
//! single update). Run with `cargo bench -p dra-sdk --bench publish --features testing`.

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use dra_sdk::advanced::slices::{PublisherHandle, ResourceSlicePublisher};
use dra_sdk::slices::{Device, DeviceCapacity, DriverResources};
use dra_sdk_testing::apiserver::{FakeApiServer, Stats};
use k8s_openapi::api::core::v1::Node;

const DRIVER: &str = "gpu.example.com";
const NODE: &str = "node-1";
const DEVICES: usize = 10_000;

fn resources(changed: Option<usize>) -> DriverResources {
    let devices = (0..DEVICES).map(|i| {
        let device = Device::new(format!("dev-{i}"))
            .attribute("index", i as i64)
            .attribute("model", "h100")
            .attribute("uuid", format!("GPU-{i:08x}-0000-0000-0000-000000000000"))
            .capacity("memory", DeviceCapacity::new("80Gi"));
        if changed == Some(i) {
            device.attribute("healthy", false)
        } else {
            device
        }
    });
    DriverResources::single_pool(NODE, devices.collect())
}

async fn server() -> FakeApiServer {
    let server = FakeApiServer::start().await.expect("fake API server");
    let mut node = Node::default();
    node.metadata.name = Some(NODE.to_owned());
    server.insert(&node).expect("node");
    server
}

async fn publish(server: &FakeApiServer, initial: DriverResources) -> PublisherHandle {
    let client = server.client().expect("client");
    let handle = ResourceSlicePublisher::for_node(client, DRIVER, NODE).spawn(initial);
    handle.synced().await;
    handle
}

fn describe(stats: &Stats) -> String {
    let slices = stats.resource("resourceslices");
    format!(
        "{} requests to resourceslices ({} list, {} watch, {} create, {} update, {} delete), {} in total",
        slices.total(),
        slices.list,
        slices.watch,
        slices.create,
        slices.update,
        slices.delete,
        stats.total.total(),
    )
}

/// One measured run with request counts, printed once.
async fn report() {
    let server = server().await;
    let start = Instant::now();
    let handle = publish(&server, resources(None)).await;
    let converge = start.elapsed();
    let slices = server
        .list::<k8s_openapi::api::resource::v1::ResourceSlice>()
        .expect("list")
        .len();
    println!(
        "initial publish of {DEVICES} devices: {converge:?} to converge into {slices} slices; {} (+2 discovery requests)",
        describe(&server.stats())
    );
    server.reset_stats();
    let start = Instant::now();
    handle.update(resources(Some(DEVICES / 2)));
    handle.synced().await;
    println!(
        "one device changed: {:?} to converge; {}",
        start.elapsed(),
        describe(&server.stats())
    );
    handle.stop().await;
    server.shutdown().await;
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(report());

    let mut group = c.benchmark_group("publish_10k_devices");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(20));
    group.bench_function("initial_converge", |b| {
        b.to_async(&runtime).iter_custom(|iterations| async move {
            let mut total = Duration::ZERO;
            for _ in 0..iterations {
                let server = server().await;
                let start = Instant::now();
                let handle = publish(&server, resources(None)).await;
                total += start.elapsed();
                handle.stop().await;
                server.shutdown().await;
            }
            total
        });
    });
    group.bench_function("one_device_change", |b| {
        b.to_async(&runtime).iter_custom(|iterations| async move {
            let server = server().await;
            let handle = publish(&server, resources(None)).await;
            let mut total = Duration::ZERO;
            for i in 0..iterations {
                // Toggle one device's health, so every iteration is a one-device change.
                let desired = resources((i % 2 == 0).then_some(DEVICES / 2));
                let start = Instant::now();
                handle.update(desired);
                handle.synced().await;
                total += start.elapsed();
            }
            handle.stop().await;
            server.shutdown().await;
            total
        });
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
