//! The API client a shipped plugin builds from its flags (`PluginArgs::kube_client`): the
//! background limit holds requests back, prepares have a budget of their own.

use clap::Parser;
use dra_sdk::advanced::rate_limit::ApiBudget;
use dra_sdk::cdi::ContainerEdits;
use dra_sdk::claim::{Claim, DriverError, RecordedClaim};
use dra_sdk::cli::PluginArgs;
use dra_sdk::driver::{Driver, PreparedClaim, PreparedDevice};
use dra_sdk_testing::claims::AllocatedClaim;
use dra_sdk_testing::cluster::{NODE_NAME, TestCluster, claim_ref};
use dra_sdk_testing::kubelet::KubeletVersion;
use k8s_openapi::api::core::v1::Node;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    plugin: PluginArgs,
}

fn parse(args: &[&str]) -> PluginArgs {
    Cli::parse_from([&["plugin", "--node-name", "n"], args].concat()).plugin
}

/// The limit is the client's: requests beyond the burst wait for the API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_holds_requests_beyond_the_burst_back() {
    let cluster = TestCluster::start().await.unwrap();
    let kubeconfig = cluster.write_kubeconfig().unwrap();
    let kubeconfig = kubeconfig.to_str().unwrap();
    let list = |client: kube::Client| async move {
        let nodes: kube::Api<Node> = kube::Api::all(client);
        let start = std::time::Instant::now();
        for _ in 0..6 {
            nodes.list(&Default::default()).await.unwrap();
        }
        start.elapsed()
    };
    // 20 per second, 2 at once: the 4 requests after the burst take 50 ms each.
    let limited = parse(&[
        "--kubeconfig",
        kubeconfig,
        "--kube-api-qps",
        "20",
        "--kube-api-burst",
        "2",
    ]);
    let elapsed = list(limited.kube_client().await.unwrap()).await;
    assert!(
        elapsed >= std::time::Duration::from_millis(190),
        "{elapsed:?}"
    );
    let free = parse(&["--kubeconfig", kubeconfig, "--kube-api-qps", "0"]);
    let elapsed = list(free.kube_client().await.unwrap()).await;
    assert!(
        elapsed < std::time::Duration::from_millis(190),
        "{elapsed:?}"
    );
}

/// Prepare is on the kubelet's critical path. With the client a shipped plugin builds from
/// its defaults, 30 claims prepared one after another are never held back by the limit
/// meant for background work; under one shared limit of 5 per second after a burst of 10,
/// the 11th claim read waited 200 ms and the 30th 4 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepares_are_not_held_back_by_the_background_limit() {
    struct Echo;

    #[async_trait::async_trait]
    impl Driver for Echo {
        type Config = ();
        async fn prepare(&self, claim: &Claim<()>) -> Result<PreparedClaim, DriverError> {
            let devices = claim.devices.iter().map(|device| {
                PreparedDevice::new(
                    device,
                    ContainerEdits::new().env("ECHO", &device.device.name),
                )
            });
            Ok(PreparedClaim::new(devices.collect()))
        }
        async fn unprepare(&self, _: &RecordedClaim) -> Result<(), DriverError> {
            Ok(())
        }
    }

    let cluster = TestCluster::start().await.unwrap();
    let kubeconfig = cluster.write_kubeconfig().unwrap();
    let args = parse(&["--kubeconfig", kubeconfig.to_str().unwrap()]);
    let layer = args.rate_limit().unwrap();
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let client = kube::client::ClientBuilder::try_from(config)
        .unwrap()
        .with_layer(&layer)
        .build();
    let plugin = cluster
        .plugin_with_client(Echo, "echo.example.com", client)
        .start()
        .await
        .unwrap();
    let kubelet = cluster
        .register(&plugin, KubeletVersion::V1_36)
        .await
        .unwrap();
    for i in 0..30 {
        let claim = AllocatedClaim::new("default", format!("claim-{i}"))
            .device("echo", "echo.example.com", NODE_NAME, &format!("echo-{i}"))
            .create(&cluster.client())
            .await
            .unwrap();
        let claim = claim_ref(&claim).unwrap();
        let prepared = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
        assert!(prepared[&claim.uid].is_ok(), "{prepared:?}");
    }
    assert_eq!(layer.held_back(ApiBudget::Prepare), 0);
    assert_eq!(layer.held_back(ApiBudget::Background), 0);
    plugin.shutdown().await.unwrap();
}
