//! A device health event to an updated ResourceSlice in the fake API server (issue target:
//! under 200 ms), with the mock backend.
//!
//! The driver is assembled as `gpu-kubelet-plugin --mock-profile workstation --feature-gates
//! NVMLDeviceHealthCheck=true` assembles it ([`NvidiaPlugin::from_args`]) and runs in the
//! test cluster (fake API server over loopback HTTP, simulated kubelet). Each sample injects a
//! critical event through the mock backend's API and times until the GPU's device in the
//! stored ResourceSlice carries the taint it causes: the event reader thread, the health
//! policy task, the SDK's device state and the ResourceSlice publisher's update. Samples
//! alternate XID 79 and a double-bit ECC error, both `gpu.nvidia.com/xid` NoSchedule taints
//! with different values (`79`, `dbe`), so each one changes the slice without waiting for a
//! recovery. The store is polled every millisecond (in process, no HTTP), so a figure may be
//! up to about 1 ms late.
//!
//! Run: `cargo bench -p dra-driver-nvidia --bench health`

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser as _;
use criterion::{Criterion, criterion_group, criterion_main};
use dra_driver_nvidia::backend::events::{HealthEvent, HealthEventKind};
use dra_driver_nvidia::devices::DRIVER_NAME;
use dra_driver_nvidia::health::TAINT_XID;
use dra_driver_nvidia::plugin::{Cli, NvidiaPlugin};
use dra_sdk_testing::bench::{sample, total_time};
use dra_sdk_testing::cluster::{NODE_NAME, RunningPlugin, TestCluster};
use k8s_openapi::api::resource::v1::ResourceSlice;
use tokio::runtime::Runtime;

/// Gives up on one sample after this long: a lost update, not a slow one.
const GIVE_UP: Duration = Duration::from_secs(10);

struct Bench {
    running: RunningPlugin,
    nvidia: NvidiaPlugin,
    uuid: String,
    device: String,
    next: usize,
}

impl Bench {
    async fn start() -> Self {
        let cli = Cli::try_parse_from([
            "gpu-kubelet-plugin",
            "--node-name",
            NODE_NAME,
            "--mock-profile",
            "workstation",
            "--feature-gates",
            "NVMLDeviceHealthCheck=true",
        ])
        .expect("flags");
        let nvidia = NvidiaPlugin::from_args(&cli.nvidia).expect("mock machine");
        let gpu = nvidia.discovery.gpus.first().expect("a GPU");
        let (uuid, device) = (gpu.info.uuid.clone(), gpu.name.clone());
        let running = TestCluster::start_with(
            nvidia.driver.clone(),
            DRIVER_NAME,
            nvidia.resources(NODE_NAME),
        )
        .await
        .expect("cluster");
        Self {
            running,
            nvidia,
            uuid,
            device,
            next: 0,
        }
    }

    /// The value of the device's `gpu.nvidia.com/xid` taint in the stored slices.
    fn xid_taint(&self) -> Option<String> {
        let slices: Vec<ResourceSlice> = self.running.cluster().api().list().expect("list");
        slices
            .into_iter()
            .flat_map(|slice| slice.spec.devices.unwrap_or_default())
            .filter(|device| device.name == self.device)
            .flat_map(|device| device.taints.unwrap_or_default())
            .find(|taint| taint.key == TAINT_XID)
            .and_then(|taint| taint.value)
    }

    /// Injects the next event and times until the slice shows it.
    async fn event_to_slice(&mut self) -> Duration {
        self.next += 1;
        let (kind, value) = if self.next.is_multiple_of(2) {
            (HealthEventKind::Xid(79), "79")
        } else {
            (HealthEventKind::DoubleBitEcc, "dbe")
        };
        let events = self.nvidia.mock_events.as_ref().expect("mock events");
        let started = Instant::now();
        events.inject(HealthEvent::new(&self.uuid, kind));
        while self.xid_taint().as_deref() != Some(value) {
            assert!(
                started.elapsed() < GIVE_UP,
                "the slice never showed {value}"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        started.elapsed()
    }
}

fn health(c: &mut Criterion) {
    let runtime = Runtime::new().expect("runtime");
    let bench = Arc::new(tokio::sync::Mutex::new(runtime.block_on(Bench::start())));

    let mut group = c.benchmark_group("nvidia_health");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    group.bench_function("event_to_resourceslice", |b| {
        b.to_async(&runtime).iter_custom(|iterations| {
            let bench = Arc::clone(&bench);
            async move {
                total_time(&bench, iterations, async |bench: &mut Bench| {
                    bench.event_to_slice().await
                })
                .await
            }
        })
    });
    group.finish();

    // Percentiles criterion does not print.
    let rounds = 100;
    let latencies = runtime.block_on(sample(&bench, rounds, async |bench: &mut Bench| {
        bench.event_to_slice().await
    }));
    println!("health event to updated ResourceSlice: {latencies}");
}

criterion_group!(benches, health);
criterion_main!(benches);
