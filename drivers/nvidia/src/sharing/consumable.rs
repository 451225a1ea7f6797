//! Consumable shares (gate `ConsumableShares`, flag `--consumable-shares`): one GPU or MIG
//! device allocated to several claims, as upstream v0.5 does.
//!
//! | `--consumable-shares` | published |
//! |---|---|
//! | `disabled` (default) | devices as usual: one claim each |
//! | `memory` | `allowMultipleAllocations: true`; capacity `memory` with request policy default = all of it (rounded down to 1Mi), range 1Mi..all, step 1Mi |
//! | `unlimited` | the same, but default 0 and minimum 0: a claim that asks for no memory takes none |
//! | `N` (a positive number) | as `unlimited`, plus capacity `shares` = N with default 1, range 1..N, step 1 |
//!
//! Every other capacity of the device (a MIG device's `multiprocessors`, engines and
//! `memorySlice<i>`) gets a policy of default 0, range 0..all: the scheduler gives a share
//! that does not ask for a capacity **the whole of it** when the capacity has no policy
//! (KEP-5075), so without one the first claim would take every multiprocessor and no second
//! claim would fit. A claim may still ask for an amount, which the scheduler then books.
//!
//! The scheduler then hands out shares of a device (each with a `shareID`). At prepare the
//! node checks what the scheduler cannot: every claim prepared on a device shares it with
//! the **same normalised config** (the same sharing strategy and settings); a claim whose
//! config differs fails with a message naming the claim that holds the device. MPS is
//! refused in this mode, as upstream (one daemon per claim cannot serve several claims).

use std::fmt;
use std::num::NonZeroU32;
use std::str::FromStr;

use dra_sdk::attributes::Bytes;
use dra_sdk::slices::{CapacityRequestPolicy, Device, DeviceCapacity};
use serde::{Deserialize, Serialize};

const MIB: u64 = 1 << 20;

/// How devices are shared between claims (`--consumable-shares`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ConsumableShares {
    /// One claim per device.
    #[default]
    Disabled,
    /// Shares consume memory; a claim that asks for none takes all of it.
    Memory,
    /// Shares consume memory; a claim that asks for none takes none.
    Unlimited,
    /// At most this many shares per device (capacity `shares`), memory as `Unlimited`.
    Shares(NonZeroU32),
}

/// `--consumable-shares` is not one of the accepted values.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "--consumable-shares={value:?}: expected disabled, memory, unlimited or a positive number of shares"
)]
pub struct ConsumableSharesError {
    /// The value given.
    pub value: String,
}

impl FromStr for ConsumableShares {
    type Err = ConsumableSharesError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.trim() {
            "disabled" => Ok(Self::Disabled),
            "memory" => Ok(Self::Memory),
            "unlimited" => Ok(Self::Unlimited),
            number => {
                number
                    .parse::<NonZeroU32>()
                    .map(Self::Shares)
                    .map_err(|_| ConsumableSharesError {
                        value: text.to_owned(),
                    })
            }
        }
    }
}

impl fmt::Display for ConsumableShares {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Disabled => f.write_str("disabled"),
            Self::Memory => f.write_str("memory"),
            Self::Unlimited => f.write_str("unlimited"),
            Self::Shares(n) => write!(f, "{n}"),
        }
    }
}

impl ConsumableShares {
    /// Whether devices are published for several claims.
    pub fn is_enabled(self) -> bool {
        self != Self::Disabled
    }

    /// A GPU or MIG device as published in this mode; `memory_bytes` is its memory.
    ///
    /// ```
    /// use dra_driver_nvidia::sharing::ConsumableShares;
    /// use dra_sdk::slices::Device;
    ///
    /// let mode: ConsumableShares = "4".parse()?;
    /// let device = mode.publish(Device::new("gpu-0"), 80 << 30);
    /// assert!(device.allow_multiple_allocations);
    /// assert_eq!(device.capacity["shares"].value.0, "4");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn publish(self, device: Device, memory_bytes: u64) -> Device {
        let all = Bytes(memory_bytes / MIB * MIB).to_string();
        let memory = DeviceCapacity::new(Bytes(memory_bytes).to_string());
        let policy = match self {
            Self::Disabled => return device,
            Self::Memory => CapacityRequestPolicy::with_default(&all).valid_range(
                "1Mi",
                Some(&all),
                Some("1Mi"),
            ),
            Self::Unlimited | Self::Shares(_) => {
                CapacityRequestPolicy::with_default("0").valid_range("0", Some(&all), Some("1Mi"))
            }
        };
        let mut device = device.allow_multiple_allocations(true);
        for capacity in device.capacity.values_mut() {
            let all = capacity.value.0.clone();
            capacity.request_policy =
                Some(CapacityRequestPolicy::with_default("0").valid_range("0", Some(&all), None));
        }
        device = device.capacity("memory", memory.with_request_policy(policy));
        if let Self::Shares(n) = self {
            let n = n.to_string();
            device = device.capacity(
                "shares",
                DeviceCapacity::new(&n).with_request_policy(
                    CapacityRequestPolicy::with_default("1").valid_range("1", Some(&n), Some("1")),
                ),
            );
        }
        device
    }
}

/// One share of a device held by a claim, as the checkpoint keeps it: the config it was
/// prepared with is what later claims on the device must match.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SharedAllocation {
    /// The device.
    pub device: String,
    /// The share the scheduler allocated.
    #[serde(rename = "shareID")]
    pub share_id: String,
    /// The normalised config the device was prepared with (a [`NvidiaConfig`](crate::config::NvidiaConfig) as JSON, so
    /// that configs compare exactly as they are stored).
    pub config: serde_json::Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print_as_the_flag() {
        for text in ["disabled", "memory", "unlimited", "8"] {
            assert_eq!(text.parse::<ConsumableShares>().unwrap().to_string(), text);
        }
        assert_eq!(
            "0".parse::<ConsumableShares>().unwrap_err().to_string(),
            "--consumable-shares=\"0\": expected disabled, memory, unlimited or a positive \
             number of shares"
        );
    }

    #[test]
    fn memory_policies_follow_upstream() {
        let memory = (40u64 << 30) + 123; // not a whole MiB
        let device = ConsumableShares::Memory.publish(Device::new("gpu-0"), memory);
        let policy = device.capacity["memory"].request_policy.clone().unwrap();
        assert_eq!(policy.default.unwrap().0, "40Gi");
        assert_eq!(
            format!("{:?}", policy.valid.unwrap()),
            "Range { min: Quantity(\"1Mi\"), max: Some(Quantity(\"40Gi\")), step: Some(Quantity(\"1Mi\")) }"
        );
        let device = ConsumableShares::Unlimited.publish(Device::new("gpu-0"), memory);
        assert_eq!(default_of(&device, "memory"), "0");
        assert!(!device.capacity.contains_key("shares"));
        let plain = ConsumableShares::Disabled.publish(Device::new("gpu-0"), memory);
        assert!(!plain.allow_multiple_allocations && plain.capacity.is_empty());
    }

    /// A share that does not ask for a capacity without a policy would get all of it: every
    /// capacity besides memory gets default 0.
    #[test]
    fn other_capacities_are_not_taken_whole_by_each_share() {
        let mig = Device::new("gpu-0-mig-1g10gb-19-0")
            .capacity("multiprocessors", DeviceCapacity::new("16"))
            .capacity("memorySlice0", DeviceCapacity::new("1"));
        let device = ConsumableShares::Shares(NonZeroU32::new(4).unwrap()).publish(mig, 10 << 30);
        for (name, all) in [("multiprocessors", "16"), ("memorySlice0", "1")] {
            assert_eq!(
                format!("{:?}", device.capacity[name].request_policy),
                format!(
                    "Some(CapacityRequestPolicy {{ default: Some(Quantity(\"0\")), valid: \
                     Some(Range {{ min: Quantity(\"0\"), max: Some(Quantity(\"{all}\")), step: None }}) }})"
                ),
                "{name}"
            );
        }
        assert_eq!(default_of(&device, "shares"), "1");
    }

    /// What a share takes of capacity `name` when it does not ask.
    fn default_of(device: &Device, name: &str) -> String {
        let policy = device.capacity[name].request_policy.as_ref().unwrap();
        policy.default.as_ref().unwrap().0.clone()
    }
}
