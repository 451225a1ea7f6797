//! Device status in ResourceClaims (KEP-4817, `status.devices`): per allocated device,
//! conditions, free-form data and network data, written by the driver that prepared it.
//!
//! [`DeviceStatusWriter`] writes a claim's entries of this driver with **one server-side apply
//! per claim per change**, field manager = the driver name (by default). The API server keeps
//! `status.devices` as a list keyed by driver, pool, device and share ID, so the entries of
//! other drivers (other field managers) are left alone, and applying an empty list
//! ([`clear`](DeviceStatusWriter::clear), at unprepare) removes exactly this driver's entries.
//! Sizes are checked against the API's limits before anything is sent. An unchanged status is
//! not sent again.
//!
//! # Permissions
//!
//! `patch` on `resourceclaims/status` (server-side apply is a patch) and, from Kubernetes 1.36
//! (`DRAResourceClaimGranularStatusAuthorization`, beta, on by default), the synthetic
//! subresource `resourceclaims/driver`, `resourceNames: [<driver>]`, with the verb
//! `associated-node:patch` for a kubelet plugin (a service account token bound to the node the
//! claim is allocated on) or `arbitrary-node:patch` for a controller. A refusal is
//! [`DeviceStatusError::Forbidden`], which says what to grant; it changes nothing else (a
//! prepared claim stays prepared). A real v1.36.2 server answers a missing
//! `resourceclaims/driver` permission with 422 Invalid (`FieldValueForbidden` on
//! `status.devices`), not 403; both are recognised. `docs/operations.md` has the rules.
//!
//! # In a driver
//!
//! A driver whose [`Driver::reports_device_status`](crate::driver::Driver::reports_device_status)
//! is `true` returns the statuses from prepare
//! ([`PreparedClaim::with_device_status`](crate::driver::PreparedClaim::with_device_status));
//! the plugin writes them once the claim is recorded as prepared and removes the entries at
//! unprepare. Later changes go through the writer of
//! [`DriverContext::device_status`](crate::context::DriverContext::device_status), the same one
//! the plugin uses.
//!
//! Only allocated devices may have a status: the server refuses entries that match no
//! allocation result of the claim (driver, pool, device, share ID).
//!
//! ```no_run
//! use dra_sdk::device_status::{DeviceStatus, DeviceStatusWriter};
//! use dra_sdk::claim::ClaimRef;
//!
//! # async fn demo(client: kube::Client, claim: ClaimRef) -> Result<(), Box<dyn std::error::Error>> {
//! let writer = DeviceStatusWriter::new(client, "net.example.com");
//! let status = DeviceStatus::new("node-1", "eth1")
//!     .ready("Configured", "interface is up")
//!     .interface("net1", ["10.1.2.3/24"], "00:11:22:33:44:55")
//!     .data(serde_json::json!({"mtu": 9000}));
//! writer.apply(&claim, &[status]).await?;
//! // ... and at unprepare:
//! writer.clear(&claim).await?;
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use crate::claim::wire::{ClaimVersion, DiscoveryError, names_object};
use crate::claim::{ClaimRef, DeviceRef};
use crate::slices::ResourceApiVersion;

/// Most conditions per device.
pub(crate) const MAX_CONDITIONS: usize = 8;
/// Largest `data`, in bytes of JSON.
pub(crate) const MAX_DATA_BYTES: usize = 10 * 1024;
/// Most IPs in `networkData.ips`.
pub(crate) const MAX_IPS: usize = 16;
/// Longest `networkData.interfaceName`.
pub(crate) const MAX_INTERFACE_NAME: usize = 256;
/// Longest `networkData.hardwareAddress`.
pub(crate) const MAX_HARDWARE_ADDRESS: usize = 128;
/// Longest condition message (metav1.Condition).
const MAX_CONDITION_MESSAGE: usize = 32768;
/// Longest condition reason (metav1.Condition).
const MAX_CONDITION_REASON: usize = 1024;
/// Longest condition type (metav1.Condition: a qualified name).
const MAX_CONDITION_TYPE: usize = 316;

/// The status of one allocated device, as this driver reports it: attach it to a prepared
/// claim ([`PreparedClaim::with_device_status`](crate::driver::PreparedClaim::with_device_status)) or write it
/// with the context's [`DeviceStatusWriter`].
///
/// ```
/// use dra_sdk::device_status::DeviceStatus;
///
/// let status = DeviceStatus::new("node-a", "nic-0")
///     .ready("Configured", "VF 3 bound")
///     .interface("net1", ["10.1.2.3/24"], "02:42:ac:11:00:02");
/// assert!(status.validate().is_ok());
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct DeviceStatus {
    /// The device.
    pub device: DeviceRef,
    /// Share ID, for a share of a multi-allocatable device.
    pub share_id: Option<String>,
    /// Conditions (at most 8, types unique). `Ready` should be `True` once configured; binding
    /// conditions a device declares are reported here too.
    pub conditions: Vec<Condition>,
    /// Free-form data (at most 10 KiB of JSON).
    pub data: Option<Value>,
    /// Network data of a network device.
    pub network: Option<NetworkDeviceData>,
}

/// `networkData` of a device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NetworkDeviceData {
    /// Interface name in the pod (at most 256 characters).
    pub interface_name: Option<String>,
    /// IP addresses with prefix length (`10.1.2.3/24`), at most 16, unique.
    pub ips: Vec<String>,
    /// Hardware address (at most 128 characters).
    pub hardware_address: Option<String>,
}

impl DeviceStatus {
    /// Most conditions a device's status may hold.
    pub const MAX_CONDITIONS: usize = MAX_CONDITIONS;
    /// Most bytes of the opaque `data` of a device's status.
    pub const MAX_DATA_BYTES: usize = MAX_DATA_BYTES;
    /// Most IP addresses in a device's network data.
    pub const MAX_IPS: usize = MAX_IPS;
    /// Longest interface name in a device's network data.
    pub const MAX_INTERFACE_NAME: usize = MAX_INTERFACE_NAME;
    /// Longest hardware address in a device's network data.
    pub const MAX_HARDWARE_ADDRESS: usize = MAX_HARDWARE_ADDRESS;

    /// An empty status of `pool`/`device`.
    pub fn new(pool: impl Into<String>, device: impl Into<String>) -> Self {
        Self {
            device: DeviceRef::new(pool, device),
            share_id: None,
            conditions: Vec::new(),
            data: None,
            network: None,
        }
    }

    /// Sets the share ID.
    pub fn share_id(mut self, share_id: impl Into<String>) -> Self {
        self.share_id = Some(share_id.into());
        self
    }

    /// Sets condition `type_` (replacing one of the same type), stamped now.
    pub fn condition(
        mut self,
        type_: impl Into<String>,
        status: bool,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        let type_ = type_.into();
        self.conditions.retain(|c| c.type_ != type_);
        self.conditions.push(Condition {
            type_,
            status: if status { "True" } else { "False" }.to_owned(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Time(jiff_now()),
            observed_generation: None,
        });
        self
    }

    /// `Ready=True` with `reason` and `message`.
    pub fn ready(self, reason: impl Into<String>, message: impl Into<String>) -> Self {
        self.condition("Ready", true, reason, message)
    }

    /// Sets free-form data.
    pub fn data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    /// Sets network data.
    pub fn network(mut self, network: NetworkDeviceData) -> Self {
        self.network = Some(network);
        self
    }

    /// Sets network data from an interface name, its IPs and hardware address.
    pub fn interface<I: Into<String>>(
        self,
        name: impl Into<String>,
        ips: impl IntoIterator<Item = I>,
        hardware_address: impl Into<String>,
    ) -> Self {
        self.network(NetworkDeviceData {
            interface_name: Some(name.into()),
            ips: ips.into_iter().map(Into::into).collect(),
            hardware_address: Some(hardware_address.into()),
        })
    }

    /// Checks the API's limits; the error names the device and the field.
    pub fn validate(&self) -> Result<(), DeviceStatusError> {
        let invalid = |field: &str, reason: String| DeviceStatusError::Invalid {
            device: self.device.to_string(),
            field: field.to_owned(),
            reason,
        };
        if self.device.pool.is_empty() || self.device.name.is_empty() {
            return Err(invalid("device", "pool and device are required".into()));
        }
        if self.conditions.len() > MAX_CONDITIONS {
            return Err(invalid(
                "conditions",
                format!(
                    "{} conditions; at most {MAX_CONDITIONS}",
                    self.conditions.len()
                ),
            ));
        }
        let mut types = std::collections::HashSet::new();
        for (i, condition) in self.conditions.iter().enumerate() {
            let field = format!("conditions[{i}]");
            check_condition(condition).map_err(|reason| invalid(&field, reason))?;
            if !types.insert(condition.type_.as_str()) {
                return Err(invalid(
                    &field,
                    format!("type {:?} repeats", condition.type_),
                ));
            }
        }
        if let Some(data) = &self.data {
            let size = serde_json::to_vec(data).map_or(usize::MAX, |d| d.len());
            if size > MAX_DATA_BYTES {
                return Err(invalid(
                    "data",
                    format!("{size} bytes of JSON; at most {MAX_DATA_BYTES}"),
                ));
            }
        }
        if let Some(network) = &self.network {
            if let Some(name) = &network.interface_name
                && name.len() > MAX_INTERFACE_NAME
            {
                return Err(invalid(
                    "networkData.interfaceName",
                    format!("{} characters; at most {MAX_INTERFACE_NAME}", name.len()),
                ));
            }
            if let Some(address) = &network.hardware_address
                && address.len() > MAX_HARDWARE_ADDRESS
            {
                return Err(invalid(
                    "networkData.hardwareAddress",
                    format!(
                        "{} characters; at most {MAX_HARDWARE_ADDRESS}",
                        address.len()
                    ),
                ));
            }
            if network.ips.len() > MAX_IPS {
                return Err(invalid(
                    "networkData.ips",
                    format!("{} addresses; at most {MAX_IPS}", network.ips.len()),
                ));
            }
            let mut seen = std::collections::HashSet::new();
            for (i, ip) in network.ips.iter().enumerate() {
                let field = format!("networkData.ips[{i}]");
                check_cidr(ip).map_err(|reason| invalid(&field, reason))?;
                if !seen.insert(ip.as_str()) {
                    return Err(invalid(&field, format!("{ip:?} repeats")));
                }
            }
        }
        Ok(())
    }

    /// The `AllocatedDeviceStatus` JSON of this device for `driver`.
    fn to_json(&self, driver: &str) -> Value {
        let mut entry =
            json!({ "driver": driver, "pool": self.device.pool, "device": self.device.name });
        if let Some(share_id) = &self.share_id {
            entry["shareID"] = json!(share_id);
        }
        if !self.conditions.is_empty() {
            entry["conditions"] = json!(self.conditions);
        }
        if let Some(data) = &self.data {
            entry["data"] = data.clone();
        }
        if let Some(network) = &self.network {
            let mut out = json!({});
            if let Some(name) = &network.interface_name {
                out["interfaceName"] = json!(name);
            }
            if !network.ips.is_empty() {
                out["ips"] = json!(network.ips);
            }
            if let Some(address) = &network.hardware_address {
                out["hardwareAddress"] = json!(address);
            }
            entry["networkData"] = out;
        }
        entry
    }
}

fn jiff_now() -> k8s_openapi::jiff::Timestamp {
    // Conditions carry whole seconds on the wire; trimming here keeps "unchanged" detectable.
    let now = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now)
}

fn check_condition(condition: &Condition) -> Result<(), String> {
    let type_ = &condition.type_;
    if type_.is_empty() || type_.len() > MAX_CONDITION_TYPE {
        return Err(format!(
            "type must have 1 to {MAX_CONDITION_TYPE} characters"
        ));
    }
    if !matches!(condition.status.as_str(), "True" | "False" | "Unknown") {
        return Err(format!(
            "status {:?} must be True, False or Unknown",
            condition.status
        ));
    }
    let reason = &condition.reason;
    let reason_ok = reason.len() <= MAX_CONDITION_REASON
        && reason
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic())
        && reason
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ',' | ':'))
        && !reason.ends_with([',', ':']);
    if !reason_ok {
        return Err(format!(
            "reason {reason:?} must be CamelCase: a letter, then letters, digits, '_', ',' or ':' (at most {MAX_CONDITION_REASON})"
        ));
    }
    if condition.message.len() > MAX_CONDITION_MESSAGE {
        return Err(format!(
            "message is longer than {MAX_CONDITION_MESSAGE} bytes"
        ));
    }
    if condition.observed_generation.is_some_and(|g| g < 0) {
        return Err("observedGeneration must not be negative".into());
    }
    Ok(())
}

fn check_cidr(ip: &str) -> Result<(), String> {
    let bad = || format!("{ip:?} is not an IP address with a prefix length (10.1.2.3/24)");
    let (address, prefix) = ip.split_once('/').ok_or_else(bad)?;
    let address: IpAddr = address.parse().map_err(|_| bad())?;
    let prefix: u8 = prefix.parse().map_err(|_| bad())?;
    let max = if address.is_ipv4() { 32 } else { 128 };
    if prefix > max || prefix.to_string() != ip.split_once('/').map_or("", |(_, p)| p) {
        return Err(bad());
    }
    Ok(())
}

/// Why a device status was not written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceStatusError {
    /// A status breaks an API limit; nothing was sent.
    #[error("status of device {device}, {field}: {reason}")]
    Invalid {
        /// `<pool>/<device>`.
        device: String,
        /// The field.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// The API server refused the write: the driver lacks the permissions.
    #[error(
        "writing the device status of claim {claim} was refused: {message}. The plugin needs `patch` on resourceclaims/status and, from Kubernetes 1.36, `associated-node:patch` on resourceclaims/driver with resourceNames [{driver}] (`arbitrary-node:patch` for a claim not allocated on the plugin's node)"
    )]
    Forbidden {
        /// The claim.
        claim: String,
        /// This driver.
        driver: String,
        /// The server's message.
        message: String,
    },
    /// The claim no longer exists, or was replaced (another UID).
    #[error("claim {claim} is gone or was replaced")]
    ClaimGone {
        /// The claim.
        claim: String,
    },
    /// The server serves `resource.k8s.io` in none of the versions with `status.devices`
    /// (`v1`, `v1beta2`, `v1beta1`).
    #[error(
        "writing the device status of claim {claim}: the API server serves no resource.k8s.io version with status.devices"
    )]
    NotServed {
        /// The claim.
        claim: String,
    },
    /// Any other API error.
    #[error("writing the device status of claim {claim}: {source}")]
    Api {
        /// The claim.
        claim: String,
        /// The error.
        #[source]
        source: kube::Error,
    },
}

/// Writes this driver's `status.devices` entries of claims with server-side apply.
pub struct DeviceStatusWriter {
    client: kube::Client,
    driver: String,
    field_manager: String,
    version: WriteVersion,
    /// What was last applied per claim UID, to skip unchanged writes.
    last: Mutex<HashMap<String, Value>>,
}

/// The `resource.k8s.io` version the writer sends through.
#[derive(Debug)]
enum WriteVersion {
    /// The newest served one, found by discovery on first use (shared logic with the claim
    /// reader and the slice publisher) and found again when the server stops serving it.
    Discovered(ClaimVersion),
    /// Set by [`DeviceStatusWriter::api_version`].
    Fixed(ApiResource),
}

impl DeviceStatusWriter {
    /// A writer for `driver`, with field manager `driver`, through the newest
    /// `resource.k8s.io` version the server serves (`v1` on 1.34+, `v1beta2` on 1.33, `v1beta1`
    /// on 1.32; `status.devices` has the same shape in each), found by discovery at the first
    /// write.
    pub fn new(client: kube::Client, driver: impl Into<String>) -> Self {
        let driver = driver.into();
        Self {
            client,
            field_manager: driver.clone(),
            driver,
            version: WriteVersion::Discovered(ClaimVersion::default()),
            last: Mutex::new(HashMap::new()),
        }
    }

    /// Sets the field manager (default: the driver name). Keep it stable across restarts: the
    /// server knows the entries to remove by it.
    pub fn field_manager(mut self, manager: impl Into<String>) -> Self {
        self.field_manager = manager.into();
        self
    }

    /// Writes through this `resource.k8s.io` version instead of the discovered one (`v1beta2`
    /// for 1.33, `v1beta1` for 1.32 with `DRAResourceClaimDeviceStatus` on).
    pub fn api_version(mut self, version: &str) -> Self {
        self.version = WriteVersion::Fixed(claim_resource(version));
        self
    }

    /// The resource to write through, and the discovered version it came from.
    async fn resource(
        &self,
        claim: &ClaimRef,
    ) -> Result<(ApiResource, Option<ResourceApiVersion>), DeviceStatusError> {
        match &self.version {
            WriteVersion::Fixed(resource) => Ok((resource.clone(), None)),
            WriteVersion::Discovered(chosen) => match chosen.get(&self.client).await {
                Ok(version) => Ok((
                    version.resource("ResourceClaim", "resourceclaims"),
                    Some(version),
                )),
                Err(DiscoveryError::Api(source)) => Err(DeviceStatusError::Api {
                    claim: describe(claim),
                    source,
                }),
                Err(DiscoveryError::NotServed) => Err(DeviceStatusError::NotServed {
                    claim: describe(claim),
                }),
            },
        }
    }

    /// Makes `devices` this driver's entries in the claim's `status.devices`: one
    /// server-side apply, skipped when it equals the last one sent for the claim. Returns
    /// whether a write was sent. Every status is validated first; the claim's UID is a
    /// precondition, so a replaced claim is not written.
    pub async fn apply(
        &self,
        claim: &ClaimRef,
        devices: &[DeviceStatus],
    ) -> Result<bool, DeviceStatusError> {
        for device in devices {
            device.validate()?;
        }
        let entries: Vec<Value> = devices.iter().map(|d| d.to_json(&self.driver)).collect();
        let (resource, discovered) = self.resource(claim).await?;
        let body = json!({
            "apiVersion": resource.api_version,
            "kind": "ResourceClaim",
            "metadata": { "name": claim.name, "namespace": claim.namespace, "uid": claim.uid },
            "status": { "devices": entries },
        });
        if self.last_applied(&claim.uid).as_ref() == Some(&body) {
            return Ok(false);
        }
        let span =
            tracing::debug_span!("apply_device_status", claim = %claim, devices = devices.len());
        let _entered = span.enter();
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &claim.namespace, &resource);
        let params = PatchParams::apply(&self.field_manager).force();
        match api
            .patch_status(&claim.name, &params, &Patch::Apply(&body))
            .await
        {
            Ok(_) => {
                self.remember(&claim.uid, Some(body));
                tracing::debug!("applied device status");
                Ok(true)
            }
            Err(error) => {
                // The server's state is unknown now: send the next apply whatever it is.
                self.remember(&claim.uid, None);
                // A 404 that names no object: the version went away (an API server upgrade
                // or downgrade); discover again for the next write.
                if let (kube::Error::Api(status), Some(version), WriteVersion::Discovered(chosen)) =
                    (&error, discovered, &self.version)
                    && status.code == 404
                    && !names_object(status, &claim.name)
                {
                    chosen.forget(version);
                    return Err(DeviceStatusError::Api {
                        claim: describe(claim),
                        source: error,
                    });
                }
                Err(self.classify(claim, error))
            }
        }
    }

    /// Removes this driver's entries from the claim (an apply without entries). A claim that is
    /// gone is success: its status went with it.
    pub async fn clear(&self, claim: &ClaimRef) -> Result<(), DeviceStatusError> {
        let result = self.apply(claim, &[]).await;
        self.remember(&claim.uid, None);
        match result {
            Ok(_) | Err(DeviceStatusError::ClaimGone { .. }) => Ok(()),
            Err(error) => Err(error),
        }
    }

    fn last_applied(&self, uid: &str) -> Option<Value> {
        self.last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(uid)
            .cloned()
    }

    fn remember(&self, uid: &str, body: Option<Value>) {
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match body {
            Some(body) => {
                last.insert(uid.to_owned(), body);
            }
            None => {
                last.remove(uid);
            }
        }
    }

    fn classify(&self, claim: &ClaimRef, error: kube::Error) -> DeviceStatusError {
        let claim_name = describe(claim);
        match &error {
            // A missing `resourceclaims/status` permission is a 403; the 1.36 per-driver check
            // answers 422 Invalid instead (FieldValueForbidden on `status.devices`, naming the
            // verb it wanted on `resourceclaims/driver`), as a real v1.36.2 server does.
            kube::Error::Api(status)
                if status.code == 403
                    || status.code == 422 && status.message.contains("resourceclaims/driver") =>
            {
                DeviceStatusError::Forbidden {
                    claim: claim_name,
                    driver: self.driver.clone(),
                    message: status.message.clone(),
                }
            }
            // 404: deleted; 409 with force: only the UID precondition can conflict.
            kube::Error::Api(status) if status.code == 404 || status.code == 409 => {
                DeviceStatusError::ClaimGone { claim: claim_name }
            }
            _ => DeviceStatusError::Api {
                claim: claim_name,
                source: error,
            },
        }
    }
}

impl std::fmt::Debug for DeviceStatusWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceStatusWriter")
            .field("driver", &self.driver)
            .field("field_manager", &self.field_manager)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

fn describe(claim: &ClaimRef) -> String {
    format!("{}/{}", claim.namespace, claim.name)
}

fn claim_resource(version: &str) -> ApiResource {
    ApiResource {
        group: "resource.k8s.io".into(),
        version: version.into(),
        api_version: format!("resource.k8s.io/{version}"),
        kind: "ResourceClaim".into(),
        plural: "resourceclaims".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_checked_before_sending() {
        let ok = DeviceStatus::new("p", "d")
            .ready("Configured", "up")
            .interface("net1", ["10.1.2.3/24", "fd00::1/64"], "00:11:22:33:44:55")
            .data(json!({"a": 1}));
        ok.validate().unwrap();

        let field_of = |status: DeviceStatus| match status.validate() {
            Err(DeviceStatusError::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        let mut many = DeviceStatus::new("p", "d");
        for i in 0..9 {
            many = many.condition(format!("C{i}"), true, "R", "");
        }
        assert_eq!(field_of(many), "conditions");
        assert_eq!(
            field_of(DeviceStatus::new("p", "d").condition("Ready", true, "not camel", "")),
            "conditions[0]"
        );
        assert_eq!(
            field_of(DeviceStatus::new("p", "d").data(json!("x".repeat(MAX_DATA_BYTES)))),
            "data"
        );
        assert_eq!(
            field_of(DeviceStatus::new("p", "d").interface("x".repeat(257), ["10.0.0.1/8"], "")),
            "networkData.interfaceName"
        );
        assert_eq!(
            field_of(DeviceStatus::new("p", "d").interface("n", ["10.0.0.1"], "")),
            "networkData.ips[0]"
        );
        assert_eq!(
            field_of(DeviceStatus::new("p", "d").interface("n", ["10.0.0.1/33"], "")),
            "networkData.ips[0]"
        );
        assert_eq!(
            field_of(DeviceStatus::new("p", "d").interface("n", ["10.0.0.1/8", "10.0.0.1/8"], "")),
            "networkData.ips[1]"
        );
        let ips: Vec<String> = (0..17).map(|i| format!("10.0.0.{i}/32")).collect();
        assert_eq!(
            field_of(DeviceStatus::new("p", "d").interface("n", ips, "")),
            "networkData.ips"
        );
        assert_eq!(
            field_of(DeviceStatus::new("p", "d").interface("n", ["10.0.0.1/8"], "a".repeat(129))),
            "networkData.hardwareAddress"
        );
    }

    #[test]
    fn conditions_replace_by_type() {
        let status = DeviceStatus::new("p", "d")
            .condition("Ready", false, "Starting", "")
            .ready("Configured", "up");
        assert_eq!(status.conditions.len(), 1);
        assert_eq!(status.conditions[0].status, "True");
    }

    #[test]
    fn entries_carry_the_driver_and_keys() {
        let entry = DeviceStatus::new("p", "d")
            .share_id("s-1")
            .interface("net1", ["10.1.2.3/24"], "aa")
            .to_json("net.example.com");
        assert_eq!(entry["driver"], "net.example.com");
        assert_eq!(entry["shareID"], "s-1");
        assert_eq!(
            entry["networkData"],
            json!({"interfaceName": "net1", "ips": ["10.1.2.3/24"], "hardwareAddress": "aa"})
        );
        assert!(entry.get("conditions").is_none());
    }
}
