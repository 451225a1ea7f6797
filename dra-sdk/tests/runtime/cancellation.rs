//! A kubelet that gives up on a call (its deadline, a stream reset) drops it; the batch it
//! started still finishes: the driver's prepare runs to its end, the CDI spec and the
//! `PrepareCompleted` record are written, and the kubelet's retry is answered from them.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dra_sdk::advanced::checkpoint::{Checkpoint, ClaimState};
use dra_sdk::advanced::proto::dra_v1;
use dra_sdk::claim::{Claim, DriverError, RecordedClaim};
use dra_sdk::config::ConfigRegistry;
use dra_sdk::driver::{Driver, PreparedClaim};
use dra_sdk_testing::claims::AllocatedClaim;
use dra_sdk_testing::cluster::{BOOT_ID, NODE_NAME, TestCluster, claim_ref};
use dra_sdk_testing::kubelet::KubeletVersion;
use tokio::sync::Notify;

use dra_sdk_testing::sample_driver::{DRIVER, GpuConfig, prepare_gpus};

/// Prepares only once the test says so.
#[derive(Default)]
struct SlowDriver {
    entered: Notify,
    release: Notify,
    prepares: AtomicUsize,
}

#[async_trait::async_trait]
impl Driver for SlowDriver {
    type Config = GpuConfig;

    fn config_registry(&self) -> ConfigRegistry<GpuConfig> {
        ConfigRegistry::new().register::<GpuConfig>()
    }

    async fn prepare(&self, claim: &Claim<GpuConfig>) -> Result<PreparedClaim, DriverError> {
        self.prepares.fetch_add(1, Ordering::SeqCst);
        self.entered.notify_one();
        self.release.notified().await;
        Ok(prepare_gpus(claim))
    }

    async fn unprepare(&self, _: &RecordedClaim) -> Result<(), DriverError> {
        Ok(())
    }
}

fn has_spec(cdi_root: &Path, uid: &str) -> bool {
    std::fs::read_dir(cdi_root).is_ok_and(|entries| {
        entries.flatten().any(|entry| {
            entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.ends_with(&format!("_{uid}.json")))
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_prepare_call_still_completes_the_claim() {
    let cluster = TestCluster::start().await.unwrap();
    let driver = Arc::new(SlowDriver::default());
    let plugin = cluster
        .plugin(Arc::clone(&driver), DRIVER)
        .start()
        .await
        .unwrap();
    let kubelet = cluster
        .register(&plugin, KubeletVersion::V1_36)
        .await
        .unwrap();
    let claim = AllocatedClaim::new("default", "abandoned")
        .device("gpu", DRIVER, NODE_NAME, "gpu-0")
        .create(&cluster.client())
        .await
        .unwrap();
    let claim = claim_ref(&claim).unwrap();

    // The kubelet's deadline (sent as `grpc-timeout`, enforced by the server, which drops the
    // handler) passes while the driver is in the middle of prepare.
    let socket = plugin.socket_paths().dra.clone();
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let socket = socket.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(socket).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .unwrap();
    let mut client = dra_v1::dra_plugin_client::DraPluginClient::new(channel);
    let mut request = tonic::Request::new(dra_v1::NodePrepareResourcesRequest {
        claims: vec![dra_v1::Claim {
            namespace: claim.namespace.clone(),
            uid: claim.uid.clone(),
            name: claim.name.clone(),
        }],
    });
    request.set_timeout(Duration::from_millis(300));
    let call = client.node_prepare_resources(request);
    let (status, ()) = tokio::join!(call, driver.entered.notified());
    let status = status.expect_err("the deadline passed before the driver finished");
    assert_eq!(status.code(), tonic::Code::Cancelled, "{status}");
    // Past the server's own deadline too, so the handler is gone before the driver goes on.
    tokio::time::sleep(Duration::from_millis(500)).await;
    driver.release.notify_one();

    let (checkpoint, _) = Checkpoint::open(&cluster.plugins_dir().join(DRIVER), BOOT_ID).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let record = checkpoint.get(&claim.uid).unwrap();
        if record
            .as_ref()
            .is_some_and(|record| record.state == ClaimState::PrepareCompleted)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the abandoned prepare never completed: {record:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(has_spec(&cluster.cdi_root(), &claim.uid));

    // The kubelet's retry is answered from the checkpoint, without a second driver call.
    let outcome = kubelet.prepare(std::slice::from_ref(&claim)).await.unwrap();
    assert!(outcome[&claim.uid].is_ok(), "{outcome:?}");
    assert_eq!(driver.prepares.load(Ordering::SeqCst), 1);
    plugin.shutdown().await.unwrap();
}
