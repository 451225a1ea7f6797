//! The mock GPU driver's chart for the shared chart checks (`test-support/chart.rs`).

#![allow(dead_code, unreachable_pub, unused_imports)] // each test binary uses a part

use std::path::{Path, PathBuf};

use serde_json::Value;

pub use super::shared::{
    OpenApi, assert_all_options_documented, assert_helm_mode_certificate, assert_plugin_rules,
    assert_rbac_matches_calls, assert_webhook_shape, decode, describe, env_map, find_kind,
    granted_permissions, helm_or_skip, leaves, prepare_good_and_retry_bad_until_event_series,
    rbac_objects, requested_permissions, secret_data, tls_handshake, validate_all, webhook_objects,
    yaml, yaml_documents,
};

pub fn chart_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/helm/mock-gpu-driver")
}

/// `helm template` of the chart as release `release` in `namespace`, with `args` (values
/// files, `--set`); every document as JSON.
pub fn render(
    helm: &Path,
    release: &str,
    namespace: &str,
    args: &[&str],
) -> Result<Vec<Value>, String> {
    super::shared::render_chart(helm, &chart_dir(), release, namespace, args)
}

/// The values sets CI renders: the defaults, then each file of `ci/`.
pub fn values_sets() -> Vec<(String, Vec<String>)> {
    super::shared::values_sets(&chart_dir())
}
