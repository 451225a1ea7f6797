//! The claim vocabulary every other module builds on: which claim ([`ClaimRef`]), the claim a
//! driver prepares ([`Claim`], [`AllocatedDevice`]), the claim the checkpoint recorded
//! ([`RecordedClaim`]), what can go wrong with one claim ([`DriverError`]), and reading an
//! allocated ResourceClaim from the API server (in
//! [`advanced::claim`](crate::advanced::claim)).
//!
//! This module imports nothing above it (the driver trait, the context, the plugin), so the
//! modules that do can all share it without an import loop.
//!
//! ```
//! use dra_sdk::claim::{AllocatedDevice, Claim, ClaimRef, RecordedClaim, RecordedDevice};
//!
//! let uid = ClaimRef::new("default", "gpu-claim", "uid-1");
//! let claim: Claim<()> =
//!     Claim::new(uid.clone()).with_device(AllocatedDevice::new("gpu", "node-a", "gpu-0"));
//! let recorded = RecordedClaim::new(uid).with_device(RecordedDevice::new("node-a", "gpu-0"));
//! assert_eq!(claim.devices[0].device, recorded.devices[0].device);
//! ```

mod error;
mod identity;
pub(crate) mod locks;
pub(crate) mod read;
mod recorded;
mod resolved;
pub(crate) mod wire;

pub use error::{DriverError, DriverStateError};
pub(crate) use error::{decode_state, encode_state};
pub use identity::{ClaimRef, DeviceRef};
pub(crate) use read::ClaimReader;
pub(crate) use read::ReadPolicy;
pub use recorded::{RecordedClaim, RecordedDevice};
pub use resolved::{AllocatedDevice, AppliedConfig, Claim, ConfigSource};
