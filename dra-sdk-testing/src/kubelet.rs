//! A kubelet simulator: dials a plugin's real Unix sockets and speaks to it the way the kubelet
//! does, including its timeouts, its choice of API version and its checks of the answers.
//!
//! ```no_run
//! # async fn demo(registration_socket: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
//! use dra_sdk::claim::ClaimRef;
//! use dra_sdk_testing::kubelet::{KubeletSimulator, KubeletVersion};
//!
//! let kubelet = KubeletSimulator::new(KubeletVersion::V1_36);
//! let plugin = kubelet.register(registration_socket).await?;
//! let claim = ClaimRef { uid: "uid".into(), namespace: "default".into(), name: "gpu".into() };
//! let prepared = plugin.prepare(&[claim.clone()]).await?;
//! println!("{prepared:?}");
//! plugin.unprepare(&[claim]).await?;
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

use dra_sdk::advanced::AuthorityRewriteStream;
use dra_sdk::advanced::proto::{
    dra_v1, dra_v1beta1, health_v1, health_v1alpha1, pluginregistration as reg_pb,
};
use dra_sdk::claim::ClaimRef;
use dra_sdk::health::HealthStatus;

/// Dial timeout of the kubelet's plugin watcher.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// `GetInfo` timeout of the kubelet's plugin watcher.
pub const GET_INFO_TIMEOUT: Duration = Duration::from_secs(1);
/// `NotifyRegistrationStatus` timeout of the kubelet's plugin watcher.
pub const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);
/// Deadline of each `NodePrepareResources` / `NodeUnprepareResources` call.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(45);

/// The service names the kubelet knows, as plugins advertise them.
const DRA_V1_SERVICE: &str = "v1.DRAPlugin";
const DRA_V1BETA1_SERVICE: &str = "v1beta1.DRAPlugin";
const HEALTH_V1_SERVICE: &str = "v1.DRAResourceHealth";
const HEALTH_V1ALPHA1_SERVICE: &str = "v1alpha1.DRAResourceHealth";

/// Which kubelet release to imitate. They differ in how they pick the DRA API version and the
/// health service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KubeletVersion {
    /// 1.32: prefers v1beta1; knows no v1.
    V1_32,
    /// 1.33: like 1.32.
    V1_33,
    /// 1.34: takes the plugin's first entry among v1 and v1beta1.
    V1_34,
    /// 1.35: like 1.34.
    V1_35,
    /// 1.36: like 1.34.
    V1_36,
    /// 1.37: picks the DRA API like 1.34; knows the health service in v1 and v1alpha1 and
    /// takes v1 when the plugin lists it (1.34-1.36 know only v1alpha1).
    V1_37,
}

/// The resource-health service version a kubelet chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthApi {
    /// `v1.DRAResourceHealth` (kubelet 1.37+).
    V1,
    /// `v1alpha1.DRAResourceHealth` (kubelet 1.34+).
    V1alpha1,
}

/// The DRA node API version a kubelet chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraApi {
    /// `v1.DRAPlugin`.
    V1,
    /// `v1beta1.DRAPlugin`.
    V1beta1,
}

/// What went wrong, as the kubelet would see it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KubeletError {
    /// The socket could not be dialled.
    #[error("dialling {socket}: {source}")]
    Dial {
        /// The socket.
        socket: PathBuf,
        /// The transport error.
        #[source]
        source: tonic::transport::Error,
    },
    /// A call returned a gRPC error.
    #[error("{call}: {status}")]
    Rpc {
        /// The RPC.
        call: &'static str,
        /// The status.
        status: tonic::Status,
    },
    /// A call did not finish within the kubelet's timeout.
    #[error("{call}: no answer within {timeout:?}")]
    Timeout {
        /// The RPC.
        call: &'static str,
        /// The timeout.
        timeout: Duration,
    },
    /// The kubelet rejected the plugin (and told it so with `NotifyRegistrationStatus`).
    #[error("registration rejected: {0}")]
    Rejected(String),
    /// The plugin's answer breaks the kubelet's rules.
    #[error("invalid answer: {0}")]
    InvalidResponse(String),
}

/// The kubelet's claim list in API version `$pb`.
macro_rules! kubelet_claims {
    ($pb:ident, $claims:expr) => {
        $claims
            .iter()
            .map(|c| $pb::Claim {
                namespace: c.namespace.clone(),
                uid: c.uid.clone(),
                name: c.name.clone(),
            })
            .collect()
    };
}

/// One `NodePrepareResources` call in API version `$pb`; `$share_id` reads a device's share
/// ID where the version has one.
macro_rules! prepare_via {
    ($pb:ident, $channel:expr, $claims:expr, $share_id:expr) => {{
        let mut client = $pb::dra_plugin_client::DraPluginClient::new($channel.clone());
        let request = $pb::NodePrepareResourcesRequest {
            claims: kubelet_claims!($pb, $claims),
        };
        let share_id: fn($pb::Device) -> Option<String> = $share_id;
        with_timeout(
            "NodePrepareResources",
            CALL_TIMEOUT,
            client.node_prepare_resources(request),
        )
        .await?
        .into_inner()
        .claims
        .into_iter()
        .map(|(uid, claim)| {
            let outcome = if claim.error.is_empty() {
                Ok(claim
                    .devices
                    .into_iter()
                    .map(|d| KubeletDevice {
                        request_names: d.request_names.clone(),
                        pool: d.pool_name.clone(),
                        device: d.device_name.clone(),
                        cdi_device_ids: d.cdi_device_ids.clone(),
                        share_id: share_id(d),
                    })
                    .collect())
            } else {
                Err(claim.error)
            };
            (uid, outcome)
        })
        .collect()
    }};
}

/// One `NodeUnprepareResources` call in API version `$pb`: per-claim error strings.
macro_rules! unprepare_via {
    ($pb:ident, $channel:expr, $claims:expr) => {{
        let mut client = $pb::dra_plugin_client::DraPluginClient::new($channel.clone());
        let request = $pb::NodeUnprepareResourcesRequest {
            claims: kubelet_claims!($pb, $claims),
        };
        with_timeout(
            "NodeUnprepareResources",
            CALL_TIMEOUT,
            client.node_unprepare_resources(request),
        )
        .await?
        .into_inner()
        .claims
        .into_iter()
        .map(|(uid, claim)| (uid, claim.error))
        .collect()
    }};
}

/// Imitates one kubelet.
#[derive(Clone, Debug)]
pub struct KubeletSimulator {
    version: KubeletVersion,
}

/// A device as the kubelet records it after a successful prepare.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeletDevice {
    /// Base request names; empty means all requests.
    pub request_names: Vec<String>,
    /// Pool.
    pub pool: String,
    /// Device.
    pub device: String,
    /// CDI IDs handed to the runtime.
    pub cdi_device_ids: Vec<String>,
    /// Share ID (v1 only).
    pub share_id: Option<String>,
}

/// Per-claim outcome of a prepare call.
pub type PrepareOutcome = Result<Vec<KubeletDevice>, String>;

/// One health entry as the kubelet receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedHealth {
    /// Pool.
    pub pool: String,
    /// Device.
    pub device: String,
    /// Status.
    pub status: HealthStatus,
    /// Message.
    pub message: String,
    /// Per-device timeout in seconds (0 = kubelet default).
    pub timeout_seconds: i64,
}

impl KubeletSimulator {
    /// A simulator of the given release.
    pub fn new(version: KubeletVersion) -> Self {
        Self { version }
    }

    /// Registration sockets in `registrar_dir` as the plugin watcher sees them: sockets,
    /// including in sub-directories, skipping names that start with a dot.
    pub fn discover(registrar_dir: &Path) -> std::io::Result<Vec<PathBuf>> {
        use std::os::unix::fs::FileTypeExt;
        let mut found = Vec::new();
        let mut pending = vec![registrar_dir.to_path_buf()];
        while let Some(dir) = pending.pop() {
            for entry in std::fs::read_dir(&dir)? {
                let entry = entry?;
                if entry.file_name().to_string_lossy().starts_with('.') {
                    continue;
                }
                let file_type = entry.file_type()?;
                if file_type.is_dir() {
                    pending.push(entry.path());
                } else if file_type.is_socket() {
                    found.push(entry.path());
                }
            }
        }
        found.sort();
        Ok(found)
    }

    /// Only `GetInfo`, with the kubelet's timeouts, without telling the plugin anything: for
    /// looking at a plugin that a real kubelet may have registered.
    pub async fn get_info(&self, socket: &Path) -> Result<reg_pb::PluginInfo, KubeletError> {
        let channel = dial_registration(socket).await?;
        let mut client = reg_pb::registration_client::RegistrationClient::new(channel);
        Ok(with_timeout(
            "GetInfo",
            GET_INFO_TIMEOUT,
            client.get_info(reg_pb::InfoRequest {}),
        )
        .await?
        .into_inner())
    }

    /// The DRA API version this kubelet would use with a plugin that sent `info`, or why it
    /// would reject the plugin.
    pub fn choose_api(&self, info: &reg_pb::PluginInfo) -> Result<DraApi, String> {
        self.validate(info)
    }

    /// The health service this kubelet would open for a plugin that sent `info`: a 1.37
    /// kubelet takes v1 when it is listed, else v1alpha1 when that is; 1.34-1.36 know only
    /// v1alpha1; 1.32/1.33 stream no health. `None` when no known service is listed.
    pub fn choose_health(&self, info: &reg_pb::PluginInfo) -> Option<HealthApi> {
        let listed = |name: &str| info.supported_versions.iter().any(|v| v == name);
        match self.version {
            KubeletVersion::V1_37 if listed(HEALTH_V1_SERVICE) => Some(HealthApi::V1),
            KubeletVersion::V1_34
            | KubeletVersion::V1_35
            | KubeletVersion::V1_36
            | KubeletVersion::V1_37
                if listed(HEALTH_V1ALPHA1_SERVICE) =>
            {
                Some(HealthApi::V1alpha1)
            }
            _ => None,
        }
    }

    /// Runs the registration handshake: `GetInfo`, validation, `NotifyRegistrationStatus`.
    pub async fn register(&self, socket: &Path) -> Result<RegisteredPlugin, KubeletError> {
        let channel = dial_registration(socket).await?;
        let mut client = reg_pb::registration_client::RegistrationClient::new(channel);
        let info = with_timeout(
            "GetInfo",
            GET_INFO_TIMEOUT,
            client.get_info(reg_pb::InfoRequest {}),
        )
        .await?
        .into_inner();

        let verdict = self.validate(&info);
        let status = match &verdict {
            Ok(_) => reg_pb::RegistrationStatus {
                plugin_registered: true,
                error: String::new(),
            },
            Err(reason) => reg_pb::RegistrationStatus {
                plugin_registered: false,
                error: reason.clone(),
            },
        };
        let notified = with_timeout(
            "NotifyRegistrationStatus",
            NOTIFY_TIMEOUT,
            client.notify_registration_status(status),
        )
        .await;
        let api = verdict.map_err(KubeletError::Rejected)?;
        notified?;

        // The kubelet dials the endpoint as `unix:<path>`; an empty endpoint means the
        // registration socket itself.
        let endpoint = if info.endpoint.is_empty() {
            socket.to_path_buf()
        } else {
            PathBuf::from(&info.endpoint)
        };
        let channel = dial(&endpoint).await?;
        let health_api = self.choose_health(&info);
        Ok(RegisteredPlugin {
            info,
            api,
            health_advertised: health_api.is_some(),
            health_api,
            channel,
            endpoint,
        })
    }

    fn validate(&self, info: &reg_pb::PluginInfo) -> Result<DraApi, String> {
        if info.r#type != "DRAPlugin" {
            return Err(format!(
                "no handler registered for plugin type: {}",
                info.r#type
            ));
        }
        if info.name.is_empty() {
            return Err("plugin name is empty".to_string());
        }
        if info.supported_versions.is_empty() {
            return Err("plugin advertises no supported versions".to_string());
        }
        let to_api = |name: &str| match name {
            DRA_V1_SERVICE => Some(DraApi::V1),
            DRA_V1BETA1_SERVICE => Some(DraApi::V1beta1),
            _ => None,
        };
        match self.version {
            // 1.34+: the plugin's order decides; unknown entries are skipped.
            KubeletVersion::V1_34
            | KubeletVersion::V1_35
            | KubeletVersion::V1_36
            | KubeletVersion::V1_37 => info
                .supported_versions
                .iter()
                .find_map(|v| to_api(v))
                .ok_or_else(|| {
                    format!(
                        "none of the plugin's services {:?} is supported (need v1.DRAPlugin or v1beta1.DRAPlugin)",
                        info.supported_versions
                    )
                }),
            // 1.32/1.33: the kubelet's own preference order; v1 does not exist yet. A non-empty
            // list without a known entry would fall back to v1alpha3, which this SDK does not
            // serve, so the simulator rejects it.
            KubeletVersion::V1_32 | KubeletVersion::V1_33 => {
                if info
                    .supported_versions
                    .iter()
                    .any(|v| v == DRA_V1BETA1_SERVICE)
                {
                    Ok(DraApi::V1beta1)
                } else {
                    Err(format!(
                        "kubelet {:?} needs v1beta1.DRAPlugin, plugin offers {:?}",
                        self.version, info.supported_versions
                    ))
                }
            }
        }
    }
}

/// A plugin the simulator registered, ready for DRA calls.
#[derive(Clone, Debug)]
pub struct RegisteredPlugin {
    /// What `GetInfo` returned.
    pub info: reg_pb::PluginInfo,
    /// The API version the kubelet chose.
    pub api: DraApi,
    /// Whether the plugin advertised a health service this kubelet knows.
    pub health_advertised: bool,
    /// The health service this kubelet chose (see [`KubeletSimulator::choose_health`]).
    pub health_api: Option<HealthApi>,
    channel: Channel,
    /// The DRA socket the channel dialled.
    endpoint: PathBuf,
}

impl RegisteredPlugin {
    /// The same plugin over a connection of its own: the DRA socket dialled again. Clones of a
    /// `RegisteredPlugin` share one HTTP/2 connection; a kubelet that restarted, or a second
    /// process calling the plugin, comes on another.
    pub async fn connect_again(&self) -> Result<RegisteredPlugin, KubeletError> {
        Ok(RegisteredPlugin {
            channel: dial(&self.endpoint).await?,
            ..self.clone()
        })
    }

    /// `NodePrepareResources` with the kubelet's deadline and response checks.
    pub async fn prepare(
        &self,
        claims: &[ClaimRef],
    ) -> Result<BTreeMap<String, PrepareOutcome>, KubeletError> {
        let outcomes: BTreeMap<String, PrepareOutcome> = match self.api {
            DraApi::V1 => {
                prepare_via!(dra_v1, self.channel, claims, |d: dra_v1::Device| d.share_id)
            }
            DraApi::V1beta1 => prepare_via!(dra_v1beta1, self.channel, claims, |_| None),
        };
        check_keys(claims, outcomes.keys())?;
        Ok(outcomes)
    }

    /// `NodeUnprepareResources` with the kubelet's deadline and response checks.
    pub async fn unprepare(
        &self,
        claims: &[ClaimRef],
    ) -> Result<BTreeMap<String, Result<(), String>>, KubeletError> {
        let errors: BTreeMap<String, String> = match self.api {
            DraApi::V1 => unprepare_via!(dra_v1, self.channel, claims),
            DraApi::V1beta1 => unprepare_via!(dra_v1beta1, self.channel, claims),
        };
        check_keys(claims, errors.keys())?;
        Ok(errors
            .into_iter()
            .map(|(uid, error)| (uid, if error.is_empty() { Ok(()) } else { Err(error) }))
            .collect())
    }

    /// Opens the health stream in the service version this kubelet chose. With none listed,
    /// it opens v1alpha1 as kubelet 1.36 (v1.36.2 included) does for every plugin, advertised
    /// or not, retrying every 5 s after an error; a 1.37 kubelet opens none then.
    pub async fn watch_health(&self) -> Result<HealthWatch, KubeletError> {
        self.watch_health_via(self.health_api.unwrap_or(HealthApi::V1alpha1))
            .await
    }

    /// Opens the health stream in a given service version, whatever the kubelet would pick:
    /// for checking every advertised version.
    pub async fn watch_health_via(&self, api: HealthApi) -> Result<HealthWatch, KubeletError> {
        let rpc = |status| KubeletError::Rpc {
            call: "NodeWatchResources",
            status,
        };
        let stream = match api {
            HealthApi::V1 => {
                let mut client =
                    health_v1::dra_resource_health_client::DraResourceHealthClient::new(
                        self.channel.clone(),
                    );
                HealthStream::V1(
                    client
                        .node_watch_resources(health_v1::NodeWatchResourcesRequest {})
                        .await
                        .map_err(rpc)?
                        .into_inner(),
                )
            }
            HealthApi::V1alpha1 => {
                let mut client =
                    health_v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(
                        self.channel.clone(),
                    );
                HealthStream::V1alpha1(
                    client
                        .node_watch_resources(health_v1alpha1::NodeWatchResourcesRequest {})
                        .await
                        .map_err(rpc)?
                        .into_inner(),
                )
            }
        };
        Ok(HealthWatch { stream })
    }
}

/// The kubelet's side of the health stream.
#[derive(Debug)]
pub struct HealthWatch {
    stream: HealthStream,
}

/// The open stream, in the version the kubelet dialled.
#[derive(Debug)]
enum HealthStream {
    V1(tonic::Streaming<health_v1::NodeWatchResourcesResponse>),
    V1alpha1(tonic::Streaming<health_v1alpha1::NodeWatchResourcesResponse>),
}

/// A health response in version `$pb` as [`ObservedHealth`] entries.
macro_rules! observed {
    ($pb:ident, $response:expr) => {
        $response
            .devices
            .into_iter()
            .map(|device| {
                let id = device.device.unwrap_or_default();
                ObservedHealth {
                    pool: id.pool_name,
                    device: id.device_name,
                    status: match $pb::HealthStatus::try_from(device.health) {
                        Ok($pb::HealthStatus::Healthy) => HealthStatus::Healthy,
                        Ok($pb::HealthStatus::Unhealthy) => HealthStatus::Unhealthy,
                        _ => HealthStatus::Unknown,
                    },
                    message: device.message,
                    timeout_seconds: device.health_check_timeout_seconds,
                }
            })
            .collect()
    };
}

impl HealthWatch {
    /// The service version this stream was opened in.
    pub fn api(&self) -> HealthApi {
        match self.stream {
            HealthStream::V1(_) => HealthApi::V1,
            HealthStream::V1alpha1(_) => HealthApi::V1alpha1,
        }
    }

    /// The next full device list; `None` when the plugin ended the stream.
    pub async fn next(&mut self) -> Option<Result<Vec<ObservedHealth>, KubeletError>> {
        let next = match &mut self.stream {
            HealthStream::V1(stream) => stream
                .message()
                .await
                .map(|response| response.map(|r| observed!(health_v1, r))),
            HealthStream::V1alpha1(stream) => stream
                .message()
                .await
                .map(|response| response.map(|r| observed!(health_v1alpha1, r))),
        };
        match next {
            Ok(Some(devices)) => Some(Ok(devices)),
            Ok(None) => None,
            Err(status) => Some(Err(KubeletError::Rpc {
                call: "NodeWatchResources",
                status,
            })),
        }
    }
}

/// The kubelet fails the whole call when an answer misses a requested claim or names one it
/// did not ask for.
fn check_keys<'a>(
    claims: &[ClaimRef],
    keys: impl Iterator<Item = &'a String>,
) -> Result<(), KubeletError> {
    let requested: BTreeSet<&str> = claims.iter().map(|c| c.uid.as_str()).collect();
    let answered: BTreeSet<&str> = keys.map(String::as_str).collect();
    if let Some(extra) = answered.difference(&requested).next() {
        return Err(KubeletError::InvalidResponse(format!(
            "answer for claim {extra} that was not requested"
        )));
    }
    if let Some(missing) = requested.difference(&answered).next() {
        return Err(KubeletError::InvalidResponse(format!(
            "no answer for requested claim {missing}"
        )));
    }
    Ok(())
}

/// Dials a registration socket the way the kubelet's plugin manager does: by its bare path,
/// for which grpc-go sends the percent-encoded path as the HTTP/2 `:authority`
/// (`%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2F...`).
///
/// tonic's client cannot send such an authority (`http::Uri` refuses `%` in a host), so the
/// channel talks to an in-memory pipe and a forwarding task rewrites its header blocks on the
/// way to the socket, with the same HPACK rewriter the plugin runs on its side.
async fn dial_registration(socket: &Path) -> Result<Channel, KubeletError> {
    let path = socket.to_path_buf();
    let authority = kubelet_authority(socket);
    let endpoint = Endpoint::from_static("http://localhost");
    let connect = endpoint.connect_with_connector(tower::service_fn(move |_: http::Uri| {
        let path = path.clone();
        let authority = authority.clone();
        async move {
            let mut socket = tokio::net::UnixStream::connect(path).await?;
            let (client_end, forwarder_end) = tokio::io::duplex(64 * 1024);
            let mut rewritten = AuthorityRewriteStream::with_authority(forwarder_end, authority);
            tokio::spawn(async move {
                // Ends when either side closes; errors are the connection's end.
                let _ = tokio::io::copy_bidirectional(&mut rewritten, &mut socket).await;
            });
            Ok::<_, std::io::Error>(TokioIo::new(client_end))
        }
    }));
    finish_dial(socket, connect).await
}

/// The `:authority` grpc-go derives from a bare socket path: the path with every byte outside
/// RFC 3986's unreserved set percent-encoded.
fn kubelet_authority(socket: &Path) -> Vec<u8> {
    let mut encoded = Vec::new();
    for &byte in socket.as_os_str().as_encoded_bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(byte);
        } else {
            encoded.extend_from_slice(format!("%{byte:02X}").as_bytes());
        }
    }
    encoded
}

async fn dial(socket: &Path) -> Result<Channel, KubeletError> {
    finish_dial(socket, dra_sdk::advanced::unix_channel(socket)).await
}

async fn finish_dial(
    socket: &Path,
    connect: impl std::future::Future<Output = Result<Channel, tonic::transport::Error>>,
) -> Result<Channel, KubeletError> {
    match tokio::time::timeout(DIAL_TIMEOUT, connect).await {
        Ok(Ok(channel)) => Ok(channel),
        Ok(Err(source)) => Err(KubeletError::Dial {
            socket: socket.to_path_buf(),
            source,
        }),
        Err(_) => Err(KubeletError::Timeout {
            call: "dial",
            timeout: DIAL_TIMEOUT,
        }),
    }
}

async fn with_timeout<T>(
    call: &'static str,
    timeout: Duration,
    future: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<tonic::Response<T>, KubeletError> {
    match tokio::time::timeout(timeout, future).await {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(status)) => Err(KubeletError::Rpc { call, status }),
        Err(_) => Err(KubeletError::Timeout { call, timeout }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(versions: &[&str]) -> reg_pb::PluginInfo {
        reg_pb::PluginInfo {
            r#type: "DRAPlugin".into(),
            name: "gpu.example.com".into(),
            endpoint: "/dra.sock".into(),
            supported_versions: versions.iter().map(|v| (*v).to_owned()).collect(),
        }
    }

    #[test]
    fn health_service_is_picked_like_the_1_37_kubelet() {
        let both = info(&[DRA_V1_SERVICE, HEALTH_V1ALPHA1_SERVICE, HEALTH_V1_SERVICE]);
        let alpha_only = info(&[DRA_V1_SERVICE, HEALTH_V1ALPHA1_SERVICE]);
        let v1_only = info(&[DRA_V1_SERVICE, HEALTH_V1_SERVICE]);
        let none = info(&[DRA_V1_SERVICE]);
        let new = KubeletSimulator::new(KubeletVersion::V1_37);
        // v1 wins whatever the order of the list.
        assert_eq!(new.choose_health(&both), Some(HealthApi::V1));
        assert_eq!(new.choose_health(&alpha_only), Some(HealthApi::V1alpha1));
        assert_eq!(new.choose_health(&v1_only), Some(HealthApi::V1));
        assert_eq!(new.choose_health(&none), None);
        for version in [
            KubeletVersion::V1_34,
            KubeletVersion::V1_35,
            KubeletVersion::V1_36,
        ] {
            let old = KubeletSimulator::new(version);
            assert_eq!(old.choose_health(&both), Some(HealthApi::V1alpha1));
            assert_eq!(old.choose_health(&v1_only), None, "{version:?} knows no v1");
        }
        let oldest = KubeletSimulator::new(KubeletVersion::V1_33);
        assert_eq!(oldest.choose_health(&both), None);
    }

    #[test]
    fn authority_is_the_percent_encoded_path_like_the_recorded_kubelet() {
        // What kubelet v1.36.2 sent in ../shared/reference/fixtures/kubelet-registration-v1.36.2.h2.
        let authority = kubelet_authority(Path::new(
            "/var/lib/kubelet/plugins_registry/gpu.example.com-reg.sock",
        ));
        assert_eq!(
            String::from_utf8(authority).unwrap(),
            "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.example.com-reg.sock"
        );
    }
}
