//! The CRI double's log: one JSON object per CRI call the kubelet made.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::E2eError;
use crate::cri::{CriDevice, CriEnv, CriMount};

/// One CRI call, as the [`CriDouble`](crate::cri::CriDouble) logged it
/// ([`CriDoubleBuilder::log_file`](crate::cri::CriDoubleBuilder::log_file)).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[non_exhaustive]
pub struct CriCall {
    /// The CRI method, e.g. `RunPodSandbox` or `CreateContainer`.
    pub call: String,
    /// `namespace/name` of the pod, where the call concerns one.
    #[serde(default)]
    pub pod: Option<String>,
    /// The container's name, for container calls.
    #[serde(default)]
    pub container: Option<String>,
    /// The CDI device names the kubelet passed for the container (`CreateContainer`).
    #[serde(default, rename = "cdiDevices")]
    pub cdi_devices: Vec<String>,
    /// The mounts the kubelet passed for the container (`CreateContainer`).
    #[serde(default)]
    pub mounts: Vec<CriMount>,
    /// The environment the kubelet passed for the container (`CreateContainer`).
    #[serde(default)]
    pub envs: Vec<CriEnv>,
    /// The device-plugin devices the kubelet passed for the container (`CreateContainer`).
    #[serde(default)]
    pub devices: Vec<CriDevice>,
    /// `Code: message` where the call failed (the kubelet retries a failed
    /// `CreateContainer`).
    #[serde(default)]
    pub error: Option<String>,
}

/// Reads the CRI double's log of one node.
#[derive(Clone, Debug)]
pub struct CriLog {
    path: PathBuf,
}

impl CriLog {
    pub(crate) fn new(path: PathBuf) -> Self {
        Self { path }
    }

    /// Every call logged so far; lines that are not CRI calls are skipped.
    pub fn calls(&self) -> Vec<CriCall> {
        let Ok(text) = std::fs::read_to_string(&self.path) else {
            return Vec::new();
        };
        text.lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// The newest successful `CreateContainer` of `container` in the pod `namespace/name`,
    /// with everything the kubelet passed (CDI devices, mounts, environment, devices).
    pub fn created_container(&self, pod: &str, container: &str) -> Option<CriCall> {
        self.calls().into_iter().rfind(|call| {
            call.call == "CreateContainer"
                && call.error.is_none()
                && call.pod.as_deref() == Some(pod)
                && call.container.as_deref() == Some(container)
        })
    }

    /// The CDI device names of the newest successful `CreateContainer` of `container` in the
    /// pod `namespace/name`, if the kubelet created it.
    pub fn container_cdi_devices(&self, pod: &str, container: &str) -> Option<Vec<String>> {
        self.created_container(pod, container)
            .map(|call| call.cdi_devices)
    }

    /// Waits until the kubelet created `container` of the pod `namespace/name`, and returns
    /// the CDI device names it passed.
    pub async fn wait_for_container(
        &self,
        pod: &str,
        container: &str,
        timeout: Duration,
    ) -> Result<Vec<String>, E2eError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(devices) = self.container_cdi_devices(pod, container) {
                return Ok(devices);
            }
            if Instant::now() > deadline {
                return Err(E2eError::Timeout {
                    what: format!(
                        "CreateContainer {pod}/{container} in {}",
                        self.path.display()
                    ),
                    timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_calls_and_the_cdi_devices() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cri.jsonl");
        std::fs::write(
            &path,
            concat!(
                r#"{"ts":"2026-11-25T02:55:41Z","call":"RunPodSandbox","ms":0.4,"pod":"ns/p"}"#,
                "\n",
                r#"{"ts":"2026-11-25T02:55:41Z","call":"CreateContainer","ms":0.2,"pod":"ns/p","container":"c","cdiDevices":["k8s.gpu.example.com/claim=uid-gpu-0"]}"#,
                "\nnot json\n",
                r#"{"t_ms":3.5,"call":"CreateContainer","pod":"ns/p","container":"c","error":"Unknown: injected","cdiDevices":["k8s.gpu.example.com/claim=uid-gpu-1"],"mounts":[],"envs":[],"devices":[]}"#,
                "\n",
                r#"{"t_ms":4.5,"call":"CreateContainer","pod":"ns/p","container":"d","cdiDevices":[],"mounts":[{"containerPath":"/data","hostPath":"/var/data","readonly":true}],"envs":[{"key":"A","value":"b"}],"devices":[{"containerPath":"/dev/x","hostPath":"/dev/y","permissions":"rw"}]}"#,
                "\n",
            ),
        )
        .unwrap();
        let log = CriLog::new(path);
        assert_eq!(log.calls().len(), 4);
        // The failed attempt after it does not count.
        assert_eq!(
            log.container_cdi_devices("ns/p", "c"),
            Some(vec!["k8s.gpu.example.com/claim=uid-gpu-0".to_owned()])
        );
        assert_eq!(log.container_cdi_devices("ns/p", "other"), None);
        let d = log.created_container("ns/p", "d").unwrap();
        assert_eq!(d.mounts[0].host_path, "/var/data");
        assert!(d.mounts[0].readonly);
        assert_eq!(d.envs[0].value_str(), Some("b"));
        assert_eq!(d.devices[0].permissions, "rw");
    }
}
