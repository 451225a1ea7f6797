//! No secret leaves the plugin: a value of a claim's opaque config, and the bearer token of
//! the plugin's kubeconfig, never land in a CDI spec, a metadata file, the checkpoint, a log
//! line (at TRACE, the kube client's included), an Event or an error the kubelet gets. Claims
//! carry the secret in a well-formed config, in a config of a kind the driver does not know,
//! in a field of the wrong type and as an unknown field's value; all go through the real
//! sockets and the fake API server's HTTP.

use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex};

use dra_sdk::cdi::ContainerEdits;
use dra_sdk::claim::{Claim, ClaimRef, DriverError, RecordedClaim};
use dra_sdk::config::{ConfigHooks, ConfigRegistry, OpaqueConfig};
use dra_sdk::driver::{Driver, PreparedClaim, PreparedDevice};
use dra_sdk_testing::claims::AllocatedClaim;
use dra_sdk_testing::cluster::{NODE_NAME, TestCluster};
use dra_sdk_testing::kubelet::KubeletVersion;
use k8s_openapi::api::events::v1::Event;
use serde::Deserialize;
use serde_json::{Value, json};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::prelude::*;

/// This module's driver name: its own, so that no other test's files mix in.
pub(crate) const DRIVER: &str = "vault.example.com";

/// The secret in the claims' configs: a GitHub-token-looking value.
const SECRET: &str = "ghp_S3cr3tV4lueThatMustNeverLeak0123456789";
/// The kubeconfig's bearer token.
const BEARER: &str = "sha256~BearerTokenThatMustNeverLeak9876543210";

/// A config with a credential the driver uses at prepare and must not pass on.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct VaultConfig {
    /// Echoed into the container as `SHARING` (not secret).
    #[serde(default)]
    sharing: Option<String>,
    /// A credential for the device (say, a licence server's); never echoed.
    #[serde(default)]
    token: Option<String>,
    /// How many slots: a number, so that a string here is a type error.
    #[serde(default)]
    slots: Option<u32>,
}

impl ConfigHooks for VaultConfig {}

impl OpaqueConfig for VaultConfig {
    const API_VERSION: &'static str = "vault.example.com/v1";
    const KIND: &'static str = "VaultConfig";
}

/// Prepares an env var per device, needs the token when the config has one, and writes
/// KEP-5304 device metadata (so a metadata file and its spec exist to scan).
pub(crate) struct VaultDriver;

#[async_trait::async_trait]
impl Driver for VaultDriver {
    type Config = VaultConfig;

    fn config_registry(&self) -> ConfigRegistry<VaultConfig> {
        ConfigRegistry::new().register::<VaultConfig>()
    }

    fn device_metadata(&self) -> bool {
        true
    }

    async fn prepare(&self, claim: &Claim<VaultConfig>) -> Result<PreparedClaim, DriverError> {
        let devices = claim
            .devices
            .iter()
            .map(|device| {
                let config = device.config();
                // The driver uses the credential (here: only that it is there).
                let licensed = config.and_then(|c| c.token.as_ref()).is_some();
                let sharing = config
                    .and_then(|c| c.sharing.clone())
                    .unwrap_or_else(|| "none".into());
                let slots = config.and_then(|c| c.slots).unwrap_or(1);
                let edits = ContainerEdits::new()
                    .env("SHARING", sharing)
                    .env("LICENSED", licensed.to_string())
                    .env("SLOTS", slots.to_string());
                PreparedDevice::new(device, edits)
            })
            .collect();
        Ok(PreparedClaim::new(devices))
    }

    async fn unprepare(&self, _: &RecordedClaim) -> Result<(), DriverError> {
        Ok(())
    }
}

/// Creates an allocated claim of [`DRIVER`] on `device` with `config` for its request.
pub(crate) async fn claim_with(
    cluster: &TestCluster,
    name: &str,
    device: &str,
    config: Value,
) -> ClaimRef {
    let claim = AllocatedClaim::new("default", name)
        .device("gpu", DRIVER, NODE_NAME, device)
        .claim_config(&["gpu"], DRIVER, config)
        .create(&cluster.client())
        .await
        .unwrap();
    ClaimRef {
        uid: claim.metadata.uid.clone().unwrap(),
        namespace: "default".into(),
        name: name.into(),
    }
}

/// A log buffer the fmt layer writes into.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl io::Write for Buffer {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Every regular file under `dir`, recursively, with its contents.
fn files_under(dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            files_under(&path, out);
        } else if kind.is_file()
            && let Ok(bytes) = std::fs::read(&path)
        {
            out.push((path.display().to_string(), bytes));
        }
    }
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

#[tokio::test]
async fn no_config_secret_or_bearer_token_reaches_a_file_log_event_or_kubelet_error() {
    let cluster = TestCluster::start().await.unwrap();
    let config = |extra: Value| {
        let mut config = json!({ "apiVersion": "vault.example.com/v1", "kind": "VaultConfig" });
        config
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        config
    };
    // Claims are created before logs are captured: the test's own requests carry the secret.
    let good = claim_with(
        &cluster,
        "well-formed",
        "gpu-0",
        config(json!({ "sharing": "timeslice", "token": SECRET })),
    )
    .await;
    let unknown_kind = claim_with(
        &cluster,
        "unknown-kind",
        "gpu-1",
        json!({ "apiVersion": "vault.example.com/v1", "kind": "Vault", "token": SECRET }),
    )
    .await;
    let wrong_type = claim_with(
        &cluster,
        "wrong-type",
        "gpu-2",
        config(json!({ "slots": SECRET })),
    )
    .await;
    let unknown_field = claim_with(
        &cluster,
        "unknown-field",
        "gpu-3",
        config(json!({ "sharing": "timeslice", "password": SECRET })),
    )
    .await;
    let bad = [&unknown_kind, &wrong_type, &unknown_field];

    // The plugin's client as a shipped plugin builds it, from a kubeconfig with a token.
    let mut kubeconfig = serde_json::to_value(cluster.api().kubeconfig()).unwrap();
    kubeconfig["users"][0]["user"] = json!({ "token": BEARER });
    let kubeconfig: kube::config::Kubeconfig = serde_json::from_value(kubeconfig).unwrap();
    let client_config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(client_config).unwrap();

    // Everything at TRACE except the doubles' own logs (the fake API server and the
    // simulated kubelet are not the plugin; the kubelet's errors are checked below).
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::registry().with(
        tracing_subscriber::fmt::layer()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_filter(
                Targets::new()
                    .with_default(LevelFilter::TRACE)
                    .with_target("dra_sdk_testing", LevelFilter::OFF),
            ),
    );
    let guard = tracing::subscriber::set_default(subscriber);

    let plugin = cluster
        .plugin_with_client(VaultDriver, DRIVER, client)
        .start()
        .await
        .unwrap();
    let kubelet = cluster
        .register(&plugin, KubeletVersion::V1_36)
        .await
        .unwrap();
    let claims = [
        good.clone(),
        unknown_kind.clone(),
        wrong_type.clone(),
        unknown_field.clone(),
    ];
    let outcome = kubelet.prepare(&claims).await.unwrap();
    assert!(outcome[&good.uid].is_ok(), "{outcome:?}");
    let mut kubelet_errors = Vec::new();
    for claim in bad {
        let error = outcome[&claim.uid].clone().unwrap_err();
        kubelet_errors.push((claim.name.clone(), error));
    }
    // Each failed claim gets its PrepareFailed Event (recorded asynchronously).
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    let events = loop {
        let events: Vec<Event> = cluster.api().list().unwrap();
        if events.len() >= bad.len() {
            break events;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the Events never got there: {events:#?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let unprepared = kubelet.unprepare(&claims).await.unwrap();
    assert!(unprepared.values().all(Result::is_ok), "{unprepared:?}");
    // Prepare again, to leave the files of the good claim on disk for the scan.
    let again = kubelet.prepare(std::slice::from_ref(&good)).await.unwrap();
    assert!(again[&good.uid].is_ok(), "{again:?}");
    drop(guard);
    let logs = String::from_utf8_lossy(&buffer.0.lock().unwrap().clone()).into_owned();

    // The capture saw the plugin and its client at work.
    assert!(logs.contains(&good.uid), "the logs name the claim");
    assert!(
        logs.contains("TRACE") && logs.contains("kube"),
        "TRACE lines of the kube client were captured"
    );
    // The errors name what is wrong, without the value.
    for (name, error) in &kubelet_errors {
        assert!(!error.contains(SECRET), "{name}: the kubelet got {error}");
    }
    for event in &events {
        let text = serde_json::to_string(event).unwrap();
        assert!(!text.contains(SECRET), "an Event has the secret: {text}");
    }
    for (line_no, line) in logs.lines().enumerate() {
        assert!(!line.contains(SECRET), "log line {line_no}: {line}");
        assert!(
            !line.contains(BEARER),
            "log line {line_no} has the token: {line}"
        );
    }
    // Every file the plugin wrote: CDI specs (the device's and the metadata's), metadata
    // files, the checkpoint and its lock, the claim locks.
    let mut files = Vec::new();
    files_under(&cluster.cdi_root(), &mut files);
    files_under(&cluster.plugins_dir().join(DRIVER), &mut files);
    let names: Vec<&str> = files.iter().map(|(name, _)| name.as_str()).collect();
    assert!(
        names.iter().any(|n| n.ends_with("checkpoint.json"))
            && names.iter().any(|n| n.contains("_metadata_"))
            && names
                .iter()
                .any(|n| n.contains(dra_sdk::advanced::metadata::HOST_SUBDIR)),
        "the scan covers the checkpoint, the CDI specs and the metadata files: {names:?}"
    );
    for (name, bytes) in &files {
        assert!(!contains(bytes, SECRET), "{name} has the secret");
        assert!(!contains(bytes, BEARER), "{name} has the bearer token");
    }
    plugin.shutdown().await.unwrap();
}
