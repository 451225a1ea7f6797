//! The driver's opaque configuration API: `gpu.resource.example.com/v1alpha1`, kind `GpuConfig`.
//!
//! ```yaml
//! apiVersion: gpu.resource.example.com/v1alpha1
//! kind: GpuConfig
//! sharing:
//!   strategy: TimeSlicing        # or SpacePartitioning
//!   timeSlicingConfig:
//!     interval: Long             # Default | Short | Medium | Long
//! ```

use dra_sdk::config::{ConfigHooks, ConfigValidationError, OpaqueConfig};
use serde::{Deserialize, Serialize};

/// How the GPUs of a request are shared.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, OpaqueConfig)]
#[serde(rename_all = "camelCase")]
#[dra(api_version = "gpu.resource.example.com/v1alpha1", kind = "GpuConfig")]
pub struct GpuConfig {
    /// Sharing settings; defaults to time-slicing with the default interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<GpuSharing>,
}

/// A sharing strategy and its settings.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuSharing {
    /// Which strategy.
    pub strategy: SharingStrategy,
    /// Settings for `TimeSlicing`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slicing_config: Option<TimeSlicingConfig>,
    /// Settings for `SpacePartitioning`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub space_partitioning_config: Option<SpacePartitioningConfig>,
}

/// Sharing strategies of the mock GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub enum SharingStrategy {
    /// Processes take turns on the whole GPU.
    TimeSlicing,
    /// The GPU is split into fixed partitions.
    SpacePartitioning,
}

/// Time-slicing settings.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TimeSlicingConfig {
    /// Length of a time slice.
    pub interval: TimeSliceInterval,
}

/// Time-slice lengths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub enum TimeSliceInterval {
    /// The GPU's default.
    Default,
    /// Short slices.
    Short,
    /// Medium slices.
    Medium,
    /// Long slices.
    Long,
}

/// Space-partitioning settings.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SpacePartitioningConfig {
    /// Number of partitions, at least 1.
    pub partition_count: i64,
}

impl ConfigHooks for GpuConfig {
    fn normalize(&mut self) {
        let sharing = self.sharing.get_or_insert(GpuSharing {
            strategy: SharingStrategy::TimeSlicing,
            time_slicing_config: None,
            space_partitioning_config: None,
        });
        match sharing.strategy {
            SharingStrategy::TimeSlicing if sharing.time_slicing_config.is_none() => {
                sharing.time_slicing_config = Some(TimeSlicingConfig {
                    interval: TimeSliceInterval::Default,
                });
            }
            SharingStrategy::SpacePartitioning if sharing.space_partitioning_config.is_none() => {
                sharing.space_partitioning_config =
                    Some(SpacePartitioningConfig { partition_count: 1 });
            }
            _ => {}
        }
    }

    fn validate(&self) -> Result<(), ConfigValidationError> {
        let Some(sharing) = &self.sharing else {
            return Err(ConfigValidationError::for_field("sharing", "is required"));
        };
        match sharing.strategy {
            SharingStrategy::TimeSlicing if sharing.space_partitioning_config.is_some() => {
                Err(ConfigValidationError::for_field(
                    "sharing.spacePartitioningConfig",
                    "must not be set with strategy TimeSlicing",
                ))
            }
            SharingStrategy::SpacePartitioning if sharing.time_slicing_config.is_some() => {
                Err(ConfigValidationError::for_field(
                    "sharing.timeSlicingConfig",
                    "must not be set with strategy SpacePartitioning",
                ))
            }
            SharingStrategy::SpacePartitioning => match &sharing.space_partitioning_config {
                Some(space) if space.partition_count < 1 => Err(ConfigValidationError::for_field(
                    "sharing.spacePartitioningConfig.partitionCount",
                    format!("must be at least 1, got {}", space.partition_count),
                )),
                _ => Ok(()),
            },
            SharingStrategy::TimeSlicing => Ok(()),
        }
    }
}
