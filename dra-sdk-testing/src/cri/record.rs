//! What the double keeps of each container, and its JSON Lines call log.

use std::io::Write as _;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::proto;

/// A container the kubelet created, with what it passed that a DRA driver influences.
///
/// Kept after the container is removed, so a test can look after the pod is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ContainerRecord {
    /// The container's CRI id.
    pub id: String,
    /// `namespace/name` of its pod.
    pub pod: String,
    /// The container's name in the pod spec.
    pub name: String,
    /// The kubelet's attempt number (its restart count).
    pub attempt: u32,
    /// The fully-qualified CDI device names (`vendor.com/class=device`): for a DRA claim,
    /// what the driver's `NodePrepareResources` returned.
    pub cdi_devices: Vec<String>,
    /// The mounts, in the kubelet's order (volumes, service account token, `/etc/hosts`,
    /// termination log).
    pub mounts: Vec<CriMount>,
    /// The environment, in the kubelet's order.
    pub envs: Vec<CriEnv>,
    /// Device-plugin devices (DRA devices come as CDI names instead).
    pub devices: Vec<CriDevice>,
}

impl ContainerRecord {
    pub(crate) fn new(id: &str, pod: &str, config: &proto::ContainerConfig) -> Self {
        let metadata = config.metadata.clone().unwrap_or_default();
        Self {
            id: id.to_owned(),
            pod: pod.to_owned(),
            name: metadata.name,
            attempt: metadata.attempt,
            cdi_devices: config.cdi_devices.iter().map(|d| d.name.clone()).collect(),
            mounts: config.mounts.iter().map(CriMount::from).collect(),
            envs: config.envs.iter().map(CriEnv::from).collect(),
            devices: config.devices.iter().map(CriDevice::from).collect(),
        }
    }

    /// The value of the environment variable `key`, where it is UTF-8 (the last one wins, as
    /// in a process's environment).
    pub fn env(&self, key: &str) -> Option<&str> {
        self.envs
            .iter()
            .rev()
            .find(|env| env.key == key)
            .and_then(CriEnv::value_str)
    }
}

/// A mount the kubelet asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CriMount {
    /// The path inside the container.
    #[serde(rename = "containerPath")]
    pub container_path: String,
    /// The path on the host.
    #[serde(rename = "hostPath")]
    pub host_path: String,
    /// Whether it is read-only.
    #[serde(default)]
    pub readonly: bool,
}

impl From<&proto::Mount> for CriMount {
    fn from(mount: &proto::Mount) -> Self {
        Self {
            container_path: mount.container_path.clone(),
            host_path: mount.host_path.clone(),
            readonly: mount.readonly,
        }
    }
}

/// A device-plugin device the kubelet asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CriDevice {
    /// The path inside the container.
    #[serde(rename = "containerPath")]
    pub container_path: String,
    /// The path on the host.
    #[serde(rename = "hostPath")]
    pub host_path: String,
    /// cgroup permissions, e.g. `rw`.
    #[serde(default)]
    pub permissions: String,
}

impl From<&proto::Device> for CriDevice {
    fn from(device: &proto::Device) -> Self {
        Self {
            container_path: device.container_path.clone(),
            host_path: device.host_path.clone(),
            permissions: device.permissions.clone(),
        }
    }
}

/// An environment variable the kubelet set. Its value is bytes in the CRI (since v1.36), so
/// it need not be UTF-8; in the call log it is `{"key", "value"}` when it is, and
/// `{"key", "base64"}` otherwise.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "EnvJson", try_from = "EnvJson")]
#[non_exhaustive]
pub struct CriEnv {
    /// The variable's name.
    pub key: String,
    /// Its value.
    pub value: Vec<u8>,
}

impl CriEnv {
    /// The value, where it is UTF-8.
    pub fn value_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.value).ok()
    }
}

impl From<&proto::KeyValue> for CriEnv {
    fn from(env: &proto::KeyValue) -> Self {
        Self {
            key: env.key.clone(),
            value: env.value.clone(),
        }
    }
}

/// [`CriEnv`] as the call log writes it.
#[derive(Serialize, Deserialize)]
struct EnvJson {
    key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    base64: Option<String>,
}

impl From<CriEnv> for EnvJson {
    fn from(env: CriEnv) -> Self {
        match String::from_utf8(env.value) {
            Ok(value) => Self {
                key: env.key,
                value: Some(value),
                base64: None,
            },
            Err(error) => Self {
                key: env.key,
                value: None,
                base64: Some(base64::engine::general_purpose::STANDARD.encode(error.as_bytes())),
            },
        }
    }
}

impl TryFrom<EnvJson> for CriEnv {
    type Error = base64::DecodeError;

    fn try_from(env: EnvJson) -> Result<Self, Self::Error> {
        let value = match (env.value, env.base64) {
            (Some(value), _) => value.into_bytes(),
            (None, Some(encoded)) => base64::engine::general_purpose::STANDARD.decode(encoded)?,
            (None, None) => Vec::new(),
        };
        Ok(Self {
            key: env.key,
            value,
        })
    }
}

/// One line of the call log: the format [`CriLog`](crate::e2e::CriLog) reads.
#[derive(Serialize, Default)]
pub(crate) struct LogLine<'a> {
    /// Milliseconds since the double started.
    pub(crate) t_ms: f64,
    /// The method, e.g. `CreateContainer`.
    pub(crate) call: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) pod: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) container: Option<String>,
    /// `Code: message` of a failed call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    #[serde(rename = "cdiDevices", skip_serializing_if = "Option::is_none")]
    pub(crate) cdi_devices: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) mounts: Option<&'a [CriMount]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) envs: Option<&'a [CriEnv]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) devices: Option<&'a [CriDevice]>,
}

/// The JSON Lines call log: one line per call, written when the call is answered.
pub(crate) struct CallLog {
    started: Instant,
    file: Option<Mutex<std::fs::File>>,
}

impl CallLog {
    /// A log appending to `path`, or none.
    pub(crate) fn open(path: Option<&Path>) -> std::io::Result<Self> {
        let file = match path {
            Some(path) => Some(Mutex::new(
                std::fs::File::options()
                    .create(true)
                    .append(true)
                    .open(path)?,
            )),
            None => None,
        };
        Ok(Self {
            started: Instant::now(),
            file,
        })
    }

    pub(crate) fn elapsed_ms(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * 1000.0
    }

    pub(crate) fn write(&self, line: &LogLine<'_>) {
        let Some(file) = &self.file else {
            return;
        };
        let mut text = match serde_json::to_string(line) {
            Ok(text) => text,
            Err(error) => {
                tracing::warn!(%error, "CRI double: cannot serialise a log line");
                return;
            }
        };
        text.push('\n');
        // One write per line on an O_APPEND file: a reader never sees half a line.
        let mut file = file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(error) = file.write_all(text.as_bytes()) {
            tracing::warn!(%error, "CRI double: cannot write its call log");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_values_are_text_where_they_can_be() {
        let text = CriEnv {
            key: "GREETING".into(),
            value: b"hello".to_vec(),
        };
        let binary = CriEnv {
            key: "BLOB".into(),
            value: vec![0xff, 0x00],
        };
        let json = serde_json::to_string(&[&text, &binary]).unwrap();
        assert_eq!(
            json,
            r#"[{"key":"GREETING","value":"hello"},{"key":"BLOB","base64":"/wA="}]"#
        );
        let back: Vec<CriEnv> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, [text, binary]);
        assert_eq!(back[0].value_str(), Some("hello"));
        assert_eq!(back[1].value_str(), None);
    }
}
