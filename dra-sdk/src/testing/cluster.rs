//! An embedded test cluster: the fake API server with a Node, and temporary kubelet
//! directories for plugins, so a driver runs exactly as on a node, minus the node.
//!
//! ```no_run
//! # async fn demo(driver: impl dra_sdk::driver::Driver) -> Result<(), Box<dyn std::error::Error>> {
//! use dra_sdk::testing::cluster::TestCluster;
//! use dra_sdk::testing::kubelet::KubeletVersion;
//!
//! let cluster = TestCluster::start().await?;
//! let plugin = cluster.plugin(driver, "gpu.example.com").start().await?;
//! let kubelet = cluster.register(&plugin, KubeletVersion::V1_36).await?;
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Node;

use crate::driver::Driver;
use crate::plugin::{KubeletPlugin, PluginBuilder};
use crate::testing::apiserver::FakeApiServer;
use crate::testing::kubelet::{KubeletError, KubeletSimulator, KubeletVersion, RegisteredPlugin};

/// Name of the node every test cluster has.
pub const NODE_NAME: &str = "test-node";
/// Boot ID the plugins of a test cluster see; restarts within a test keep it.
pub const BOOT_ID: &str = "00000000-0000-4000-8000-000000000001";

/// Why the test cluster could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// A directory could not be set up.
    #[error("starting the test cluster: {0}")]
    Io(#[from] std::io::Error),
    /// The fake API server could not start or store the Node.
    #[error("starting the test cluster's API server: {0}")]
    ApiServer(#[from] crate::testing::apiserver::Error),
}

/// The fake API server, a Node, and kubelet directories in a temporary folder.
pub struct TestCluster {
    api: FakeApiServer,
    client: kube::Client,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for TestCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCluster")
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl TestCluster {
    /// Starts the API server and creates the Node [`NODE_NAME`].
    pub async fn start() -> Result<Self, ClusterError> {
        let api = FakeApiServer::start().await?;
        let node: Node = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": { "name": NODE_NAME, "labels": { "kubernetes.io/hostname": NODE_NAME } },
        }))
        .map_err(std::io::Error::other)?;
        api.insert(&node)?;
        // Short paths keep socket names far from the 108-byte limit.
        let dir = tempfile::Builder::new().prefix("dra").tempdir()?;
        for sub in ["registry", "plugins", "cdi"] {
            std::fs::create_dir_all(dir.path().join(sub))?;
        }
        let client = api.client()?;
        Ok(Self { api, client, dir })
    }

    /// The fake API server.
    pub fn api(&self) -> &FakeApiServer {
        &self.api
    }

    /// A client of the fake API server.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The kubelet's plugin registry directory.
    pub fn registrar_dir(&self) -> PathBuf {
        self.dir.path().join("registry")
    }

    /// The kubelet's plugins directory.
    pub fn plugins_dir(&self) -> PathBuf {
        self.dir.path().join("plugins")
    }

    /// The CDI spec directory.
    pub fn cdi_root(&self) -> PathBuf {
        self.dir.path().join("cdi")
    }

    /// The temporary folder holding everything.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A plugin builder wired to this cluster: its API server, directories and boot ID.
    pub fn plugin<D: Driver>(&self, driver: D, driver_name: &str) -> PluginBuilder<D> {
        KubeletPlugin::builder(driver, driver_name, NODE_NAME, self.client())
            .registrar_dir(self.registrar_dir())
            .plugins_dir(self.plugins_dir())
            .cdi_root(self.cdi_root())
            .boot_id(BOOT_ID)
    }

    /// Registers a running plugin with a simulated kubelet of the given release.
    pub async fn register(
        &self,
        plugin: &KubeletPlugin,
        version: KubeletVersion,
    ) -> Result<RegisteredPlugin, KubeletError> {
        KubeletSimulator::new(version)
            .register(&plugin.socket_paths().registration)
            .await
    }
}
