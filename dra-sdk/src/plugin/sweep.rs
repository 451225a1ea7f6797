//! The start-up sweep: removes the CDI specs and device metadata files of claims that no
//! plugin instance records, left by a crash between writing them and recording the claim.
//!
//! Another instance may serve the node at the same time (a rolling update), so one pass per
//! claim, for both kinds of file, follows the same rules: a claim's files are removed only
//! while this instance holds the claim's cross-process lock, after the checkpoint, re-read
//! under that lock, shows no instance records the claim, and only the files last modified
//! before the sweep started (a younger file was written by someone who decided after the
//! sweep did). The caller runs it only when the checkpoint was read intact at start.

use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::advanced::metadata::ClaimMetadataFiles;
use crate::cdi::ClaimFiles;
use crate::driver::Driver;
use crate::plugin::node::NodeService;

/// What the sweep found on disk for one claim.
#[derive(Default)]
struct ClaimOnDisk {
    cdi: Option<ClaimFiles>,
    metadata: Option<ClaimMetadataFiles>,
}

impl<D: Driver> NodeService<D> {
    /// Removes the CDI specs, metadata files and stale temporary files of claims that no
    /// instance records; `started` is when this instance's recovery began.
    pub(crate) fn sweep_orphans(&self, started: SystemTime) {
        let mut claims: BTreeMap<String, ClaimOnDisk> = BTreeMap::new();
        match self.cdi.claim_files() {
            Ok(files) => {
                for (uid, files) in files {
                    claims.entry(uid).or_default().cdi = Some(files);
                }
            }
            Err(error) => tracing::warn!(%error, "listing CDI specs for the start-up sweep"),
        }
        let metadata = self.reports.list_metadata();
        let mut incomplete = Vec::new();
        if let Some(listing) = metadata {
            for (uid, files) in listing.claims {
                claims.entry(uid).or_default().metadata = Some(files);
            }
            incomplete = listing.incomplete;
        }

        let (mut specs_removed, mut metadata_removed) = (0usize, 0usize);
        for (uid, on_disk) in claims {
            let _guard = match self.claim_files.try_lock(&uid) {
                Ok(Some(guard)) => guard,
                // Another instance is preparing or unpreparing it right now.
                Ok(None) => continue,
                Err(error) => {
                    tracing::warn!(claim.uid = %uid, %error, "cannot lock the claim; keeping its files");
                    continue;
                }
            };
            // Read under the claim's lock: what another instance recorded after this start
            // began is seen here.
            let recorded = match self.checkpoint.get(&uid) {
                Ok(record) => record.is_some(),
                Err(error) => {
                    tracing::warn!(claim.uid = %uid, %error, "cannot read the checkpoint; keeping the claim's files");
                    continue;
                }
            };
            if let Some(files) = on_disk.cdi {
                // Recorded claims keep their spec; only stale temporary files go.
                match self
                    .cdi
                    .remove_claim_files(&uid, &files, started, !recorded)
                {
                    Ok(true) if !recorded && !files.specs.is_empty() => specs_removed += 1,
                    Ok(_) => {}
                    Err(error) => {
                        tracing::warn!(claim.uid = %uid, %error, "removing an orphaned CDI spec")
                    }
                }
            }
            if let Some(files) = on_disk.metadata.filter(|_| !recorded) {
                match self
                    .reports
                    .remove_unrecorded_metadata(&uid, &files, started)
                {
                    Ok(true) => metadata_removed += 1,
                    Ok(false) => {}
                    Err(error) => tracing::warn!(claim.uid = %uid, %error),
                }
            }
        }
        self.reports
            .remove_incomplete_metadata(&incomplete, started);
        if specs_removed > 0 {
            tracing::info!(
                count = specs_removed,
                "removed CDI specs of claims no instance records"
            );
        }
        if metadata_removed > 0 {
            tracing::info!(
                count = metadata_removed,
                "removed device metadata of claims no instance records"
            );
        }
    }
}
