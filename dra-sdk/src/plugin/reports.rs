//! What the plugin publishes about a prepared claim besides its CDI spec, for a driver that
//! opts in: KEP-5304 device metadata files ([`Driver::device_metadata`]) and KEP-4817 device
//! status ([`Driver::reports_device_status`]).
//!
//! Kept apart from the node service so that the prepare/unprepare flow only calls in at four
//! points: after the driver's prepare (write metadata, add its CDI devices), after the
//! checkpoint records the claim as prepared (write the status), at unprepare and rollback
//! (remove both), and in the start-up sweep (remove metadata no checkpoint record owns).
//!
//! Metadata failures fail the claim, like a CDI spec that cannot be written: the containers
//! would miss a file the driver promised. Device status failures never do: the devices work
//! without it, so the claim stays prepared and the failure is logged and reported as
//! [`PluginEvent::DeviceStatusFailed`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use crate::advanced::checkpoint::PreparedDeviceRecord;
use crate::advanced::metadata::{
    ClaimMetadataFiles, MetadataClaim, MetadataDevice, MetadataListing, MetadataWriter,
};
use crate::claim::{Claim, ClaimRef};
use crate::context::DriverContext;
use crate::device_status::{DeviceStatus, DeviceStatusWriter};
use crate::driver::{Driver, PluginEvent};

/// The opted-in publishers of one plugin.
pub(crate) struct ClaimReports {
    metadata: Option<MetadataWriter>,
    status: Option<Arc<DeviceStatusWriter>>,
    /// For the published attributes of allocated devices.
    context: DriverContext,
}

impl ClaimReports {
    /// The driver's context.
    pub(crate) fn context(&self) -> &DriverContext {
        &self.context
    }

    /// The publishers `driver` opted in to. The status writer is the context's, so that
    /// writes at prepare and through [`DriverContext::device_status`] share one record of
    /// what was sent.
    pub(crate) fn new<D: Driver>(
        driver: &D,
        context: DriverContext,
        metadata: MetadataWriter,
    ) -> Self {
        let status = if driver.reports_device_status() {
            match context.device_status() {
                Ok(writer) => Some(writer),
                Err(error) => {
                    tracing::warn!(%error, "device status is not reported: no API client");
                    None
                }
            }
        } else {
            None
        };
        Self {
            metadata: driver.device_metadata().then_some(metadata),
            status,
            context,
        }
    }

    /// Whether statuses returned by a prepare are written.
    pub(crate) fn reports_status(&self) -> bool {
        self.status.is_some()
    }

    /// Writes the claim's metadata files and specs and adds each request's metadata CDI
    /// device to the records of that request's devices.
    pub(crate) fn write_metadata<C>(
        &self,
        claim: &Claim<C>,
        records: &mut [PreparedDeviceRecord],
    ) -> Result<(), String> {
        let Some(writer) = &self.metadata else {
            return Ok(());
        };
        let identity = MetadataClaim::from_resource_claim(&claim.resource_claim)
            .map_err(|error| format!("writing the device metadata: {error}"))?;
        let resources = self.context.resources();
        let devices = MetadataDevice::for_claim(claim, resources.as_ref());
        let written = writer
            .write_claim(&identity, &devices)
            .map_err(|error| format!("writing the device metadata: {error}"))?;
        for record in records.iter_mut() {
            for request in &record.request_names {
                if let Some(id) = written.cdi_device_ids.get(request)
                    && !record.cdi_device_ids.contains(id)
                {
                    record.cdi_device_ids.push(id.clone());
                }
            }
        }
        Ok(())
    }

    /// Removes the claim's metadata files and specs; missing ones are success.
    pub(crate) fn remove_metadata(&self, claim: &ClaimRef) -> Result<(), String> {
        let Some(writer) = &self.metadata else {
            return Ok(());
        };
        writer
            .remove_claim(&MetadataClaim::from(claim.clone()))
            .map_err(|error| format!("removing the device metadata: {error}"))
    }

    /// The metadata files on disk, for the start-up sweep; `None` for a driver that did not
    /// opt in, or when they cannot be listed (logged: then none is removed).
    pub(crate) fn list_metadata(&self) -> Option<MetadataListing> {
        let writer = self.metadata.as_ref()?;
        writer
            .list_claims()
            .inspect_err(|error| {
                tracing::warn!(%error, "listing device metadata for the start-up sweep");
            })
            .ok()
    }

    /// Removes the listed metadata files of a claim no instance records, keeping files
    /// modified at or after `cutoff`; whether every file is gone. The caller holds the claim's
    /// lock.
    pub(crate) fn remove_unrecorded_metadata(
        &self,
        claim_uid: &str,
        files: &ClaimMetadataFiles,
        cutoff: SystemTime,
    ) -> Result<bool, String> {
        let Some(writer) = &self.metadata else {
            return Ok(true);
        };
        writer
            .remove_files(claim_uid, files, Some(cutoff))
            .map_err(|error| format!("removing orphaned device metadata: {error}"))
    }

    /// Removes metadata directories that hold no file and were last modified before `cutoff`.
    pub(crate) fn remove_incomplete_metadata(&self, dirs: &[PathBuf], cutoff: SystemTime) {
        if let Some(writer) = &self.metadata
            && let Err(error) = writer.remove_incomplete(dirs, Some(cutoff))
        {
            tracing::warn!(%error, "removing incomplete device metadata");
        }
    }

    /// Writes the statuses a prepare returned; a failure is reported, never returned.
    pub(crate) async fn write_status<D: Driver>(
        &self,
        driver: &D,
        claim: &ClaimRef,
        statuses: &[DeviceStatus],
    ) {
        let Some(writer) = &self.status else {
            return;
        };
        if statuses.is_empty() {
            return;
        }
        if let Err(error) = writer.apply(claim, statuses).await {
            report_failure(driver, claim, "writing", &error.to_string());
        }
    }

    /// Removes this driver's status entries of an unprepared claim; a failure is reported.
    pub(crate) async fn clear_status<D: Driver>(&self, driver: &D, claim: &ClaimRef) {
        let Some(writer) = &self.status else {
            return;
        };
        if let Err(error) = writer.clear(claim).await {
            report_failure(driver, claim, "removing", &error.to_string());
        }
    }
}

fn report_failure<D: Driver>(driver: &D, claim: &ClaimRef, action: &str, error: &str) {
    tracing::warn!(%error, "{action} the device status failed; the claim is not affected");
    driver.on_event(&PluginEvent::DeviceStatusFailed {
        claim: claim.clone(),
        error: error.to_owned(),
    });
}

/// Checks the statuses a prepare returned: only for a driver that reports status, each for a
/// device allocated to the claim, each within the API's limits.
pub(crate) fn check_statuses<C>(
    claim: &Claim<C>,
    statuses: &[DeviceStatus],
    reports_status: bool,
) -> Result<(), String> {
    if statuses.is_empty() {
        return Ok(());
    }
    if !reports_status {
        return Err(
            "driver returned device status but does not report it (Driver::reports_device_status is false)"
                .to_owned(),
        );
    }
    for status in statuses {
        let allocated = claim.devices.iter().any(|allocated| {
            allocated.device == status.device && allocated.share_id == status.share_id
        });
        if !allocated {
            return Err(format!(
                "driver returned a status for device {}, which is not allocated to this claim by this driver",
                status.device
            ));
        }
        status
            .validate()
            .map_err(|error| format!("driver returned an invalid device status: {error}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::AllocatedDevice;

    #[test]
    fn statuses_must_name_allocated_devices_and_keep_the_limits() {
        let claim: Claim<()> = Claim::new(ClaimRef::new("default", "c", "u-1"))
            .with_device(AllocatedDevice::new("nic", "node-1", "eth0"));
        let ok = DeviceStatus::new("node-1", "eth0").ready("Configured", "up");
        check_statuses(&claim, std::slice::from_ref(&ok), true).unwrap();
        check_statuses(&claim, &[], false).unwrap();

        let error = check_statuses(&claim, std::slice::from_ref(&ok), false).unwrap_err();
        assert!(error.contains("reports_device_status"), "{error}");
        let other = DeviceStatus::new("node-1", "eth9");
        let error = check_statuses(&claim, &[other], true).unwrap_err();
        assert!(error.contains("node-1/eth9"), "{error}");
        let invalid = DeviceStatus::new("node-1", "eth0").interface("n", ["10.0.0.1"], "");
        let error = check_statuses(&claim, &[invalid], true).unwrap_err();
        assert!(error.contains("networkData.ips[0]"), "{error}");
    }
}
