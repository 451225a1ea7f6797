//! What the checkpoint remembers about one claim.

use crate::claim::{ClaimRef, RecordedClaim, RecordedDevice};
use std::fmt;

use crate::claim::DeviceRef;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

/// How far the preparation of a claim got.
///
/// The record is written with [`ClaimState::PrepareStarted`] *before* the driver touches the node
/// and with [`ClaimState::PrepareCompleted`] once every side effect is in place, so a restart can
/// tell "serve it again" from "undo what may have been done". Unprepare of a completed claim
/// writes [`ClaimState::UnprepareStarted`] before the driver releases anything, so a restart
/// finishes the release instead of serving devices that may be half gone.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ClaimState {
    /// The driver may have started changing the node for this claim but did not finish.
    /// After a restart such a claim goes to the driver's rollback.
    #[default]
    PrepareStarted,
    /// Every side effect is in place; the recorded devices can be returned to the kubelet as is.
    PrepareCompleted,
    /// The claim was prepared (its devices and driver state are kept) and its unprepare
    /// started: the driver may have released part of it. Never served; a restart, a repeated
    /// unprepare or a new prepare of the claim finishes the unprepare first. SDKs before this
    /// state read it as [`ClaimState::Unrecognized`] (not completed, kept verbatim).
    UnprepareStarted,
    /// A state written by a newer SDK that this version does not know. Treat it like
    /// [`ClaimState::PrepareStarted`]: nothing says the claim is complete. The name is kept and
    /// written back unchanged.
    Unrecognized(String),
}

impl ClaimState {
    /// The name used in the file (`PrepareStarted`, `PrepareCompleted`, `UnprepareStarted`, or
    /// the unrecognized one).
    pub fn as_str(&self) -> &str {
        match self {
            Self::PrepareStarted => "PrepareStarted",
            Self::PrepareCompleted => "PrepareCompleted",
            Self::UnprepareStarted => "UnprepareStarted",
            Self::Unrecognized(name) => name,
        }
    }
}

impl fmt::Display for ClaimState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ClaimState {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ClaimState {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Ok(match name.as_str() {
            "PrepareStarted" => Self::PrepareStarted,
            "PrepareCompleted" => Self::PrepareCompleted,
            "UnprepareStarted" => Self::UnprepareStarted,
            _ => Self::Unrecognized(name),
        })
    }
}

/// The checkpointed record of one claim, keyed by claim UID in the file.
///
/// Every field has a default when reading, so a record written by another SDK version that lacks a
/// field still loads. Fields this version does not know land in
/// [`unknown_fields`](Self::unknown_fields) and are written back unchanged.
///
/// ```
/// use dra_sdk::advanced::checkpoint::{ClaimRecord, PreparedDeviceRecord};
///
/// let started = ClaimRecord::started("default", "gpu-claim")
///     .with_driver_state(serde_json::json!({ "mpsDaemon": "mps-1" }));
/// let completed = started.into_completed(vec![PreparedDeviceRecord::new("node-a", "gpu-0")]);
/// assert!(completed.is_completed());
/// assert_eq!(completed.driver_state.unwrap()["mpsDaemon"], "mps-1");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRecord {
    /// Namespace of the ResourceClaim (kept because unprepare may arrive after the claim is gone).
    #[serde(default)]
    pub namespace: String,
    /// Name of the ResourceClaim.
    #[serde(default)]
    pub name: String,
    /// How far preparation got. A record without a state reads as `PrepareStarted`: nothing
    /// proves it completed.
    #[serde(default)]
    pub state: ClaimState,
    /// The devices handed to the kubelet; empty while the claim is `PrepareStarted`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<PreparedDeviceRecord>,
    /// Opaque per-claim data the driver wants back on unprepare or rollback (MIG tuple, MPS
    /// daemon ID, VFIO binding, ...). A JSON `null` reads back as `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_state: Option<Value>,
    /// Fields written by another SDK version that this one does not know, written back unchanged.
    /// Never put a known field name here: the file would get the key twice.
    #[serde(flatten)]
    pub unknown_fields: Map<String, Value>,
}

impl ClaimRecord {
    /// A record for a claim whose preparation is about to start.
    pub fn started(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            ..Self::default()
        }
    }

    /// Sets the opaque per-claim driver data.
    pub fn with_driver_state(mut self, driver_state: Value) -> Self {
        self.driver_state = Some(driver_state);
        self
    }

    /// The same record, marked completed with the devices handed to the kubelet. Driver state and
    /// unknown fields are kept.
    pub fn into_completed(mut self, devices: Vec<PreparedDeviceRecord>) -> Self {
        self.state = ClaimState::PrepareCompleted;
        self.devices = devices;
        self
    }

    /// Whether the claim is [`ClaimState::PrepareCompleted`], i.e. can be served from the record.
    pub fn is_completed(&self) -> bool {
        self.state == ClaimState::PrepareCompleted
    }

    /// The same record in [`ClaimState::UnprepareStarted`]: devices, driver state and unknown
    /// fields are kept for the driver's `unprepare`, which may have to run again.
    ///
    /// ```
    /// use dra_sdk::advanced::checkpoint::{ClaimRecord, ClaimState, PreparedDeviceRecord};
    ///
    /// let completed = ClaimRecord::started("default", "gpu-claim")
    ///     .into_completed(vec![PreparedDeviceRecord::new("node-a", "gpu-0")]);
    /// let unpreparing = completed.into_unprepare_started();
    /// assert_eq!(unpreparing.state, ClaimState::UnprepareStarted);
    /// assert!(!unpreparing.is_completed());
    /// assert_eq!(unpreparing.devices.len(), 1);
    /// ```
    pub fn into_unprepare_started(mut self) -> Self {
        self.state = ClaimState::UnprepareStarted;
        self
    }

    /// The driver state decoded into the driver's type; `None` when the record has none.
    ///
    /// ```
    /// use dra_sdk::advanced::checkpoint::ClaimRecord;
    ///
    /// #[derive(Debug, serde::Deserialize)]
    /// struct MpsState { daemon: String }
    ///
    /// let record = ClaimRecord::started("default", "gpu-claim")
    ///     .with_driver_state(serde_json::json!({ "daemon": 7 }));
    /// let error = record.decode_driver_state::<MpsState>().unwrap_err();
    /// assert!(error.to_string().contains("default/gpu-claim"), "{error}");
    /// assert!(error.to_string().contains("`daemon`"), "{error}");
    /// ```
    pub fn decode_driver_state<T: serde::de::DeserializeOwned>(
        &self,
    ) -> Result<Option<T>, crate::claim::DriverStateError> {
        crate::claim::decode_state(
            format_args!("{}/{}", self.namespace, self.name),
            self.driver_state.as_ref(),
        )
    }
}

/// One prepared device of a claim, as returned to the kubelet.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDeviceRecord {
    /// Base request names (no `/<subrequest>` suffix) this device satisfies.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub request_names: Vec<String>,
    /// ResourceSlice pool of the device.
    #[serde(default)]
    pub pool: String,
    /// Device name within the pool.
    #[serde(default)]
    pub device: String,
    /// Share ID of a consumable-capacity allocation, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// Fully qualified CDI device IDs (`vendor/class=name`) given to the kubelet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cdi_device_ids: Vec<String>,
    /// Fields written by another SDK version that this one does not know, written back unchanged.
    #[serde(flatten)]
    pub unknown_fields: Map<String, Value>,
}

impl PreparedDeviceRecord {
    /// A device record with pool and device name; fill in the other fields as needed.
    pub fn new(pool: impl Into<String>, device: impl Into<String>) -> Self {
        Self {
            pool: pool.into(),
            device: device.into(),
            ..Self::default()
        }
    }
}

impl ClaimRecord {
    /// The driver's view of this record, the checkpoint entry of `claim`.
    pub(crate) fn recorded(&self, claim: ClaimRef) -> RecordedClaim {
        let record = self;
        RecordedClaim {
            claim,
            // An unprepare that started had a completed prepare to undo.
            completed: matches!(
                record.state,
                ClaimState::PrepareCompleted | ClaimState::UnprepareStarted
            ),
            devices: record.devices.iter().map(RecordedDevice::from).collect(),
            driver_state: record.driver_state.clone(),
        }
    }
}

impl From<&PreparedDeviceRecord> for RecordedDevice {
    fn from(record: &PreparedDeviceRecord) -> Self {
        Self {
            request_names: record.request_names.clone(),
            device: DeviceRef::new(&record.pool, &record.device),
            share_id: record.share_id.clone(),
            cdi_device_ids: record.cdi_device_ids.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn missing_fields_default_and_missing_state_is_not_completed() {
        let record: ClaimRecord = serde_json::from_value(json!({ "name": "c" })).unwrap();
        assert_eq!(record.name, "c");
        assert_eq!(record.state, ClaimState::PrepareStarted);
        assert!(!record.is_completed());
    }

    #[test]
    fn unknown_state_round_trips_verbatim() {
        let record: ClaimRecord =
            serde_json::from_value(json!({ "state": "ReleaseStarted" })).unwrap();
        assert_eq!(
            record.state,
            ClaimState::Unrecognized("ReleaseStarted".into())
        );
        assert!(!record.is_completed());
        assert_eq!(
            serde_json::to_value(&record).unwrap()["state"],
            "ReleaseStarted"
        );
    }

    #[test]
    fn unprepare_started_round_trips_keeping_devices_and_driver_state() {
        let record = ClaimRecord::started("ns", "claim")
            .with_driver_state(json!({ "mig": 3 }))
            .into_completed(vec![PreparedDeviceRecord::new("pool", "gpu-0")])
            .into_unprepare_started();
        let value = serde_json::to_value(&record).unwrap();
        assert_eq!(value["state"], "UnprepareStarted");
        assert_eq!(value["devices"][0]["device"], "gpu-0");
        assert_eq!(value["driverState"]["mig"], 3);
        let back: ClaimRecord = serde_json::from_value(value).unwrap();
        assert_eq!(back, record);
        assert_eq!(back.state, ClaimState::UnprepareStarted);
        // Not served, but the driver's unprepare sees a completed prepare to undo.
        assert!(!back.is_completed());
        let recorded = back.recorded(ClaimRef {
            uid: "u".into(),
            namespace: "ns".into(),
            name: "claim".into(),
        });
        assert!(recorded.completed);
        assert_eq!(recorded.devices.len(), 1);
    }

    #[test]
    fn wire_names_are_camel_case() {
        let device = PreparedDeviceRecord {
            request_names: vec!["gpu".into()],
            share_id: Some("s".into()),
            cdi_device_ids: vec!["k8s.example.com/gpu=uid-gpu-0".into()],
            ..PreparedDeviceRecord::new("pool", "gpu-0")
        };
        let record = ClaimRecord::started("ns", "claim")
            .with_driver_state(json!(1))
            .into_completed(vec![device]);
        assert_eq!(
            serde_json::to_value(&record).unwrap(),
            json!({
                "namespace": "ns", "name": "claim", "state": "PrepareCompleted",
                "driverState": 1,
                "devices": [{
                    "requestNames": ["gpu"], "pool": "pool", "device": "gpu-0",
                    "shareId": "s", "cdiDeviceIds": ["k8s.example.com/gpu=uid-gpu-0"],
                }],
            })
        );
    }
}
