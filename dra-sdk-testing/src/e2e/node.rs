//! A node of the test cluster: a kubelet and its CRI double, with their folders and logs.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Api;

use super::cluster::{RealCluster, http_get_ok};
use super::cri::CriLog;
use super::pki::Usage;
use super::process::{ManagedProcess, PrivateMount, mount_namespaces_available};
use super::{E2eError, io_error};
use crate::cri::CriDouble;

/// Where every kubelet puts its device-plugin registration socket, whatever its `--root-dir`.
const KUBELET_DEVICE_PLUGINS: &str = "/var/lib/kubelet/device-plugins";

/// Without a mount namespace per kubelet, kubelets that start together race for the shared
/// device-plugin socket (the loser exits with "address already in use"): waits, at most 30 s,
/// until the socket was created after `spawned_at` (by this kubelet) or the kubelet exited
/// (which the readiness check then reports).
fn wait_for_own_socket(kubelet: &mut ManagedProcess, spawned_at: std::time::SystemTime) {
    let socket = Path::new(KUBELET_DEVICE_PLUGINS).join("kubelet.sock");
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline && kubelet.exited().is_none() {
        let fresh = std::fs::metadata(&socket)
            .and_then(|metadata| metadata.modified())
            .is_ok_and(|modified| modified >= spawned_at);
        if fresh {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Ports of one kubelet.
pub(crate) struct NodePorts {
    pub(crate) kubelet: u16,
    pub(crate) healthz: u16,
}

/// The kubelet process of a node, and its in-process container runtime.
#[derive(Default)]
struct NodeProcesses {
    cri: Option<CriDouble>,
    kubelet: Option<ManagedProcess>,
}

/// One node: a real kubelet with the test kit's [`CriDouble`] as its container runtime.
pub struct KubeletNode {
    name: String,
    root: PathBuf,
    healthz_port: u16,
    processes: Mutex<NodeProcesses>,
}

impl std::fmt::Debug for KubeletNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletNode")
            .field("name", &self.name)
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

/// A registration of a DRA plugin, as the kubelet logged it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Registration {
    /// The driver name.
    pub driver: String,
    /// The DRA socket the kubelet will call.
    pub endpoint: String,
    /// The gRPC service the kubelet chose, e.g. `v1.DRAPlugin`.
    pub chosen_service: String,
}

impl KubeletNode {
    pub(crate) fn launch(
        cluster: &RealCluster,
        name: &str,
        ports: NodePorts,
        gates: &[(String, bool)],
    ) -> Result<Self, E2eError> {
        let root = cluster.path().join("nodes").join(name);
        let node = Self {
            name: name.to_owned(),
            root,
            healthz_port: ports.healthz,
            processes: Mutex::new(NodeProcesses::default()),
        };
        for dir in [
            node.kubelet_dir(),
            node.registrar_dir(),
            node.plugins_dir(),
            node.cdi_root(),
            node.root.join("pod-logs"),
        ] {
            std::fs::create_dir_all(&dir)
                .map_err(io_error(format!("creating {}", dir.display())))?;
        }
        let authority = cluster.authority();
        let client = authority.issue(
            &format!("kubelet-{name}"),
            &format!("system:node:{name}"),
            Some("system:nodes"),
            Usage::Client,
        )?;
        let serving = authority.issue(
            &format!("kubelet-serving-{name}"),
            name,
            None,
            Usage::Serving(&["127.0.0.1", "localhost", name]),
        )?;
        let kubeconfig = node.root.join("kubelet.kubeconfig");
        authority.kubeconfig(&kubeconfig, cluster.server(), name, &client)?;
        let config = node.root.join("kubelet-config.yaml");
        let gates: String = gates
            .iter()
            .map(|(gate, on)| format!("  {gate}: {on}\n"))
            .collect();
        let socket = node.cri_socket();
        let text = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
tlsCertFile: {cert}
tlsPrivateKeyFile: {key}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: Webhook}}
containerRuntimeEndpoint: unix://{socket}
imageServiceEndpoint: unix://{socket}
podLogsDir: {logs}
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
failCgroupV1: false
localStorageCapacityIsolation: false
protectKernelDefaults: false
makeIPTablesUtilChains: false
evictionHard: {{}}
evictionPressureTransitionPeriod: 0s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
clusterDomain: cluster.local
clusterDNS: [10.0.0.10]
resolvConf: \"\"
serializeImagePulls: false
nodeStatusUpdateFrequency: 10s
syncFrequency: 10s
fileCheckFrequency: 20s
featureGates:
{gates}",
            port = ports.kubelet,
            healthz = ports.healthz,
            cert = serving.cert.display(),
            key = serving.key.display(),
            ca = authority.ca_cert().display(),
            socket = socket.display(),
            logs = node.root.join("pod-logs").display(),
        );
        std::fs::write(&config, text).map_err(io_error(format!("writing {}", config.display())))?;

        // The runtime serves in this process, on a thread of its own, so it outlives the
        // runtime of whichever test started the cluster.
        let cri = CriDouble::builder(&socket)
            .log_file(node.cri_log_path())
            .start()?;
        node.lock().cri = Some(cri);
        let args = vec![
            format!("--config={}", config.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--root-dir={}", node.kubelet_dir().display()),
            format!("--cert-dir={}", node.root.join("kubelet-pki").display()),
            format!("--hostname-override={name}"),
            "--node-ip=127.0.0.1".into(),
            "--v=2".into(),
            "--vmodule=dra_plugin_manager=4,dra_plugin=4,registration=4".into(),
        ];
        // The device-plugin socket path is fixed in the kubelet: give each kubelet its own.
        let device_plugins = PrivateMount {
            source: node.device_plugins_dir(),
            target: PathBuf::from(KUBELET_DEVICE_PLUGINS),
        };
        let spawned_at = std::time::SystemTime::now();
        let mut kubelet = cluster.spawn_with_mounts(
            &format!("kubelet-{name}"),
            "kubelet",
            &args,
            &[device_plugins],
        )?;
        if !mount_namespaces_available() {
            // Shared host path: let this kubelet bind its socket before the next one starts.
            wait_for_own_socket(&mut kubelet, spawned_at);
        }
        node.lock().kubelet = Some(kubelet);
        Ok(node)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, NodeProcesses> {
        self.processes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The node's name (also the kubelet's `--hostname-override`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's folder.
    pub fn root_dir(&self) -> &Path {
        &self.root
    }

    /// The kubelet's `--root-dir`.
    pub fn kubelet_dir(&self) -> PathBuf {
        self.root.join("kubelet")
    }

    /// The kubelet's plugin registry directory (`<root-dir>/plugins_registry`).
    pub fn registrar_dir(&self) -> PathBuf {
        self.kubelet_dir().join("plugins_registry")
    }

    /// The kubelet's plugins directory (`<root-dir>/plugins`).
    pub fn plugins_dir(&self) -> PathBuf {
        self.kubelet_dir().join("plugins")
    }

    /// A CDI spec directory for the node's plugins. Nothing reads it but the tests: the CRI
    /// double receives CDI names, it does not resolve them.
    pub fn cdi_root(&self) -> PathBuf {
        self.root.join("cdi")
    }

    /// The command line a kubelet plugin on this node starts with: `--kubeconfig`,
    /// `--node-name` and the node's registrar, plugins and CDI directories. The driver's own
    /// flags go after it.
    pub fn plugin_args(&self, kubeconfig: &Path) -> Vec<String> {
        vec![
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--node-name".into(),
            self.name().into(),
            "--kubelet-registrar-directory-path".into(),
            self.registrar_dir().display().to_string(),
            "--kubelet-plugins-directory-path".into(),
            self.plugins_dir().display().to_string(),
            "--cdi-root".into(),
            self.cdi_root().display().to_string(),
        ]
    }

    fn cri_socket(&self) -> PathBuf {
        self.root.join("cri.sock")
    }

    fn cri_log_path(&self) -> PathBuf {
        self.root.join("cri.jsonl")
    }

    /// What the CRI double was asked to do on this node.
    pub fn cri_log(&self) -> CriLog {
        CriLog::new(self.cri_log_path())
    }

    /// The kubelet's device-plugin directory, where it serves the device-plugin registration
    /// socket. Kubelets hard-code `/var/lib/kubelet/device-plugins`; the harness gives each
    /// kubelet this folder in its place (a bind mount in a mount namespace of the kubelet's
    /// own), so kubelets of several nodes and clusters on one machine do not fight over it.
    /// Where it cannot (not root, or no `unshare`), the kubelet uses the host path and this
    /// folder stays empty.
    pub fn device_plugins_dir(&self) -> PathBuf {
        self.root.join("device-plugins")
    }

    /// The kubelet's log file.
    pub fn kubelet_log_path(&self) -> Option<PathBuf> {
        self.lock()
            .kubelet
            .as_ref()
            .map(|process| process.log_path().to_owned())
    }

    /// Every DRA plugin registration the kubelet logged for `driver`, oldest first (a
    /// restarted kubelet or plugin registers again).
    pub fn registrations(&self, driver: &str) -> Vec<Registration> {
        let Some(path) = self.kubelet_log_path() else {
            return Vec::new();
        };
        let Ok(log) = std::fs::read_to_string(path) else {
            return Vec::new();
        };
        log.lines()
            .filter(|line| line.contains("\"Registered DRA plugin\""))
            .filter_map(|line| {
                Some(Registration {
                    driver: log_value(line, "driverName")?,
                    endpoint: log_value(line, "endpoint")?,
                    chosen_service: log_value(line, "chosenService")?,
                })
            })
            .filter(|registration| registration.driver == driver)
            .collect()
    }

    /// Waits until the kubelet has logged more than `seen` registrations of `driver`, and
    /// returns the newest.
    pub async fn wait_for_registration(
        &self,
        driver: &str,
        seen: usize,
        timeout: Duration,
    ) -> Result<Registration, E2eError> {
        let deadline = Instant::now() + timeout;
        loop {
            let registrations = self.registrations(driver);
            if registrations.len() > seen
                && let Some(last) = registrations.into_iter().last()
            {
                return Ok(last);
            }
            if Instant::now() > deadline {
                return Err(E2eError::Timeout {
                    what: format!(
                        "registration #{} of {driver} by the kubelet of {}",
                        seen + 1,
                        self.name
                    ),
                    timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) async fn wait_ready(
        &self,
        client: &kube::Client,
        timeout: Duration,
    ) -> Result<(), E2eError> {
        let nodes = Api::<Node>::all(client.clone());
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(node)) = nodes.get_opt(&self.name).await
                && node_ready(&node)
            {
                return Ok(());
            }
            self.check_running(timeout, deadline, "Node Ready")?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Fails when the kubelet exited, or the deadline passed.
    fn check_running(
        &self,
        timeout: Duration,
        deadline: Instant,
        waiting_for: &str,
    ) -> Result<(), E2eError> {
        let mut processes = self.lock();
        let kubelet = &mut processes.kubelet;
        if let Some(process) = kubelet.as_mut()
            && let Some(status) = process.exited()
        {
            return Err(E2eError::Exited {
                component: process.name().to_owned(),
                status,
                log: process.log_path().to_owned(),
                tail: process.log_tail(15),
            });
        }
        if Instant::now() > deadline
            && let Some(kubelet) = kubelet.as_ref()
        {
            return Err(E2eError::NotReady {
                component: kubelet.name().to_owned(),
                waiting_for: waiting_for.to_owned(),
                timeout,
                log: kubelet.log_path().to_owned(),
                tail: kubelet.log_tail(15),
            });
        }
        Ok(())
    }

    pub(crate) async fn restart_kubelet(&self, cluster: &RealCluster) -> Result<(), E2eError> {
        {
            let mut processes = self.lock();
            if let Some(kubelet) = processes.kubelet.as_mut() {
                kubelet
                    .restart(cluster.spawner())
                    .map_err(io_error(format!("restarting the kubelet of {}", self.name)))?;
            }
        }
        let timeout = Duration::from_secs(60);
        let deadline = Instant::now() + timeout;
        let healthz =
            std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, self.healthz_port));
        while !http_get_ok(healthz, "/healthz").await {
            self.check_running(timeout, deadline, "GET /healthz")?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    pub(crate) fn pids(&self) -> Vec<(String, u32)> {
        let processes = self.lock();
        // The CRI double runs in this process: it has no PID of its own.
        processes
            .kubelet
            .iter()
            .filter_map(|process| Some((process.name().to_owned(), process.pid()?)))
            .collect()
    }

    /// Stops the kubelet, then the CRI double.
    pub(crate) fn stop(&self) {
        let mut processes = self.lock();
        processes.kubelet.take();
        processes.cri.take();
    }
}

/// Whether a Node's `Ready` condition is `True`.
pub fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

/// The value of `key="value"` in a klog structured line.
fn log_value(line: &str, key: &str) -> Option<String> {
    let start = line.find(&format!(" {key}=\""))? + key.len() + 3;
    let rest = &line[start..];
    let end = rest.find('"')?;
    Some(rest[..end].to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_klog_values() {
        let line = r#"I1125 02:55:40.336577    4817 dra_plugin_manager.go:418] "Registered DRA plugin" logger="DRA registration handler" driverName="test-driver.cdi.k8s.io" endpoint="/tmp/rk/kubelet/plugins/test-driver.cdi.k8s.io/dra.sock" chosenService="v1.DRAPlugin" numPlugins=1"#;
        assert_eq!(
            log_value(line, "driverName").as_deref(),
            Some("test-driver.cdi.k8s.io")
        );
        assert_eq!(
            log_value(line, "chosenService").as_deref(),
            Some("v1.DRAPlugin")
        );
        assert_eq!(log_value(line, "missing"), None);
    }
}
