//! What can go wrong with one claim, and the typed driver state codec.

use std::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Why a driver could not prepare or unprepare a claim.
///
/// The message is what users see in the pod's events, so make it specific. It fails that
/// claim only; the other claims of the kubelet's call proceed.
///
/// ```
/// use dra_sdk::claim::DriverError;
///
/// let error = DriverError::Device { device: "gpu-1".into(), reason: "XID 79".into() };
/// assert_eq!(error.to_string(), "device gpu-1: XID 79");
/// assert_eq!(error.kind(), "device");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    /// One device could not be set up.
    #[error("device {device}: {reason}")]
    Device {
        /// `<pool>/<device>` or the device name.
        device: String,
        /// What went wrong.
        reason: String,
    },
    /// The claim's configuration is valid JSON but cannot be honoured on this node.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The node or device is temporarily unable to serve; the kubelet will retry.
    #[error("temporarily unavailable: {0}")]
    Unavailable(String),
    /// Anything else.
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

impl DriverError {
    /// A short, stable label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            DriverError::Device { .. } => "device",
            DriverError::InvalidConfig(_) => "invalid_config",
            DriverError::Unavailable(_) => "unavailable",
            DriverError::Other(_) => "other",
        }
    }

    /// Wraps any error.
    pub fn other(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        DriverError::Other(error.into())
    }
}

/// Encodes a typed driver state as JSON.
pub(crate) fn encode_state<T: Serialize>(state: &T) -> Result<serde_json::Value, DriverStateError> {
    serde_json::to_value(state).map_err(|source| DriverStateError::Encode {
        type_name: std::any::type_name::<T>(),
        source,
    })
}

/// Decodes a claim's JSON driver state into `T`; `None` when the claim has none.
pub(crate) fn decode_state<T: DeserializeOwned>(
    claim: impl fmt::Display,
    state: Option<&serde_json::Value>,
) -> Result<Option<T>, DriverStateError> {
    let Some(state) = state else {
        return Ok(None);
    };
    serde_path_to_error::deserialize(state)
        .map(Some)
        .map_err(|error| {
            let path = error.path().to_string();
            DriverStateError::Decode {
                claim: claim.to_string(),
                type_name: std::any::type_name::<T>(),
                path,
                source: error.into_inner(),
            }
        })
}

/// A typed driver state that could not be encoded or decoded: the driver's state type changed
/// incompatibly between versions, or a state was written by hand.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverStateError {
    /// The state could not be encoded as JSON.
    #[error("encoding the driver state as {type_name}: {source}")]
    Encode {
        /// The Rust type.
        type_name: &'static str,
        /// The serializer error.
        #[source]
        source: serde_json::Error,
    },
    /// The stored state does not decode into the driver's type.
    #[error("decoding the driver state of claim {claim} as {type_name} at `{path}`: {source}")]
    Decode {
        /// The claim: `namespace/name (uid)`, or `namespace/name` from a bare checkpoint record.
        claim: String,
        /// The Rust type.
        type_name: &'static str,
        /// Where in the state the mismatch is (`.` for the whole value).
        path: String,
        /// The deserializer error.
        #[source]
        source: serde_json::Error,
    },
}

impl From<DriverStateError> for DriverError {
    fn from(error: DriverStateError) -> Self {
        DriverError::other(error)
    }
}
