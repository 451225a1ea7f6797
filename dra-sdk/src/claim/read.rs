//! Reading allocated ResourceClaims and resolving them for one driver.
//!
//! The kubelet sends only a claim's namespace, name and UID. For each claim the plugin issues
//! one GET (all claims of a batch concurrently), checks that the object is the one the kubelet
//! meant and that it is allocated, keeps the allocation results for this driver, and decodes
//! the opaque configs that apply to each result. Watching all claims would save the GET but
//! sends every claim event of the cluster to every node, which does not scale.
//!
//! The GET goes through the newest `resource.k8s.io` version the API server serves (`v1` from
//! Kubernetes 1.34, `v1beta2` on 1.33, `v1beta1` on 1.32), found by discovery on the first
//! read, and the object is converted to the `v1` model drivers see.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::{DeviceAllocationConfiguration, ResourceClaim};

use super::wire::{self, ClaimVersion, DiscoveryError, Fetched};

use crate::claim::{AllocatedDevice, AppliedConfig, Claim, ClaimRef, ConfigSource, DeviceRef};
use crate::config::{ConfigError, ConfigRegistry};

/// Why a claim could not be read or resolved. Each variant fails only its claim.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClaimError {
    /// The ResourceClaim does not exist (any more).
    #[error("ResourceClaim {namespace}/{name} not found")]
    NotFound {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// A claim with that name exists but is a different object (deleted and re-created).
    #[error(
        "ResourceClaim {namespace}/{name} was replaced: the kubelet asked for UID {expected}, the API server has UID {found}"
    )]
    Replaced {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// UID the kubelet sent.
        expected: String,
        /// UID found.
        found: String,
    },
    /// The claim has no `status.allocation`.
    #[error("ResourceClaim {namespace}/{name} is not allocated")]
    NotAllocated {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The API server serves ResourceClaims in none of the versions the SDK reads
    /// (`resource.k8s.io` v1, v1beta2, v1beta1).
    #[error(
        "reading ResourceClaim {namespace}/{name}: the API server serves no resource.k8s.io version the plugin reads (v1, v1beta2 or v1beta1)"
    )]
    NotServed {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The read did not finish within [`ReadPolicy::budget`] (the claim read timeout): the API
    /// server stalled, or kept failing with errors worth retrying. The kubelet retries the
    /// prepare later.
    #[error("reading ResourceClaim {namespace}/{name}: timed out after {after:?}{}", last_error_suffix(.last_error))]
    Timeout {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The bound that ran out.
        after: Duration,
        /// The last error retried before the bound ran out, if any.
        last_error: Option<String>,
    },
    /// The API server could not be reached or answered an error, after retries.
    #[error("reading ResourceClaim {namespace}/{name}: {source}")]
    Api {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The last error.
        #[source]
        source: kube::Error,
    },
    /// An opaque config for this driver could not be decoded or is invalid.
    #[error("{location}: {source}")]
    Config {
        /// Where the config sits, e.g. `status.allocation.devices.config[1] (from claim, requests [gpu])`.
        location: String,
        /// What is wrong with it.
        #[source]
        source: ConfigError,
    },
}

impl ClaimError {
    /// A short, stable label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            ClaimError::NotFound { .. } => "claim_not_found",
            ClaimError::Replaced { .. } => "claim_replaced",
            ClaimError::NotAllocated { .. } => "claim_not_allocated",
            ClaimError::NotServed { .. } => "api_not_served",
            ClaimError::Api { .. } => "api",
            ClaimError::Timeout { .. } => "api_timeout",
            ClaimError::Config { .. } => "invalid_config",
        }
    }
}

fn last_error_suffix(last: &Option<String>) -> String {
    last.as_deref()
        .map(|error| format!(" (last error: {error})"))
        .unwrap_or_default()
}

/// The default claim read timeout ([`ReadPolicy::budget`]): a stalled API server fails the
/// claim after this long, well inside the kubelet's 45 s deadline for the whole
/// NodePrepareResources call, leaving the driver time to prepare.
pub(crate) const DEFAULT_CLAIM_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Retry policy for claim reads.
#[derive(Clone, Debug)]
pub struct ReadPolicy {
    /// Attempts in total, the first included.
    pub attempts: u32,
    /// Delay before the first retry; doubled each time, with jitter. A `Retry-After` the
    /// server sends is waited for instead when it is longer and fits in the budget.
    pub initial_backoff: Duration,
    /// Upper bound of one delay.
    pub max_backoff: Duration,
    /// The claim read timeout: the whole read (discovery, every attempt, the waits between them,
    /// and the client's own retries of 429/503/504) ends with [`ClaimError::Timeout`] once this
    /// much time has passed, and no retry starts that could not finish inside it. Default
    /// 10 s (`--claim-read-timeout`); keep it well inside the kubelet's 45 s deadline for the
    /// whole call.
    pub budget: Duration,
}

impl Default for ReadPolicy {
    fn default() -> Self {
        Self {
            attempts: 6,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
            budget: DEFAULT_CLAIM_READ_TIMEOUT,
        }
    }
}

/// Reads ResourceClaims with bounded retries of transient errors, through the newest
/// `resource.k8s.io` version the server serves (see [`wire`]).
#[derive(Clone)]
pub(crate) struct ClaimReader {
    client: kube::Client,
    policy: ReadPolicy,
    version: Arc<ClaimVersion>,
}

impl ClaimReader {
    pub(crate) fn new(client: kube::Client, policy: ReadPolicy) -> Self {
        Self {
            client,
            policy,
            version: Arc::default(),
        }
    }

    /// GETs the claim and checks its UID and allocation, within the policy's budget.
    pub(crate) async fn read(&self, claim: &ClaimRef) -> Result<ResourceClaim, ClaimError> {
        // kube's client has no read timeout of its own (only a 30 s connect timeout) and
        // retries 429/503/504 up to 15 times, honouring Retry-After: without this bound a
        // stalled or throttling API server holds the kubelet's call until its 45 s deadline.
        let budget = self.policy.budget;
        let mut last_error = None;
        let outcome =
            tokio::time::timeout(budget, self.read_with_retries(claim, &mut last_error)).await;
        outcome.unwrap_or_else(|_| {
            tracing::warn!(claim = %claim, ?budget, last_error = last_error.as_deref(), "claim read timed out");
            Err(ClaimError::Timeout {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                after: budget,
                last_error,
            })
        })
    }

    async fn read_with_retries(
        &self,
        claim: &ClaimRef,
        last_error: &mut Option<String>,
    ) -> Result<ResourceClaim, ClaimError> {
        let api_error = |source| ClaimError::Api {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            source,
        };
        let started = Instant::now();
        let mut backoff = self.policy.initial_backoff;
        let mut attempt = 1;
        // One new discovery per read when the chosen version stops being served, so that
        // a server that answers 404 for every path cannot keep us rediscovering.
        let mut rediscovered = false;
        let object = loop {
            let outcome = match self.version.get(&self.client).await {
                Ok(version) => wire::fetch(&self.client, version, &claim.namespace, &claim.name)
                    .await
                    .map(|fetched| (version, fetched)),
                Err(DiscoveryError::Api(error)) => Err(error),
                Err(DiscoveryError::NotServed) => {
                    return Err(ClaimError::NotServed {
                        namespace: claim.namespace.clone(),
                        name: claim.name.clone(),
                    });
                }
            };
            match outcome {
                Ok((_, Fetched::Claim(object))) => break *object,
                Ok((_, Fetched::Missing)) => {
                    return Err(ClaimError::NotFound {
                        namespace: claim.namespace.clone(),
                        name: claim.name.clone(),
                    });
                }
                Ok((version, Fetched::VersionNotServed)) if !rediscovered => {
                    tracing::info!(
                        claim = %claim,
                        version = version.as_str(),
                        "the API server no longer serves ResourceClaims in this version; discovering again"
                    );
                    self.version.forget(version);
                    rediscovered = true;
                }
                Ok((_, Fetched::VersionNotServed)) => {
                    return Err(ClaimError::NotServed {
                        namespace: claim.namespace.clone(),
                        name: claim.name.clone(),
                    });
                }
                Err(error) if is_transient(&error) && attempt < self.policy.attempts => {
                    let delay = retry_delay(&error, backoff);
                    if started.elapsed() + delay >= self.policy.budget {
                        // Answer with the server's error now rather than a timeout later.
                        return Err(api_error(error));
                    }
                    tracing::debug!(claim = %claim, attempt, %error, ?delay, "retrying claim read");
                    *last_error = Some(error.to_string());
                    tokio::time::sleep(delay).await;
                    backoff = (backoff * 2).min(self.policy.max_backoff);
                    attempt += 1;
                }
                Err(source) => return Err(api_error(source)),
            }
        };
        check_claim(claim, &object)?;
        Ok(object)
    }
}

/// The wait before retrying after `error`: the backoff with jitter, or the server's
/// `Retry-After` (`details.retryAfterSeconds`) when that is longer.
fn retry_delay(error: &kube::Error, backoff: Duration) -> Duration {
    // Jitter keeps many plugins from retrying in lockstep after an outage.
    let jittered = backoff.mul_f64(0.5 + fastrand::f64() * 0.5);
    let server = match error {
        kube::Error::Api(status) => status
            .details
            .as_ref()
            .map_or(0, |details| details.retry_after_seconds),
        _ => 0,
    };
    jittered.max(Duration::from_secs(server.into()))
}

/// Errors worth retrying: server-side trouble, throttling, and transport failures.
fn is_transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => matches!(status.code, 429 | 500 | 502 | 503 | 504),
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

fn check_claim(claim: &ClaimRef, object: &ResourceClaim) -> Result<(), ClaimError> {
    let found = object.metadata.uid.as_deref().unwrap_or_default();
    if found != claim.uid {
        return Err(ClaimError::Replaced {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            expected: claim.uid.clone(),
            found: found.to_string(),
        });
    }
    let allocated = object
        .status
        .as_ref()
        .and_then(|status| status.allocation.as_ref())
        .is_some();
    if !allocated {
        return Err(ClaimError::NotAllocated {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
        });
    }
    Ok(())
}

/// Resolves an allocated ResourceClaim for one driver: keeps the allocation results of
/// `driver_name` (base request names, subrequests, shares, capacity, admin access) and decodes
/// the opaque configs addressed to it with `registry`, class configs first.
///
/// This is what the plugin does before it calls [`Driver::prepare`](crate::driver::Driver::prepare);
/// it is pure (no API calls), so a driver's tests can turn a ResourceClaim fixture into the
/// exact [`Claim`] its `prepare` will see. `claim` is the kubelet's identity of the claim; the
/// UID is not checked against the object here (the plugin does that when it reads the claim).
///
/// ```
/// use std::sync::Arc;
/// use dra_sdk::advanced::claim::resolve;
/// use dra_sdk::config::ConfigRegistry;
/// use dra_sdk::claim::ClaimRef;
/// use k8s_openapi::api::resource::v1::ResourceClaim;
///
/// let object: ResourceClaim = serde_json::from_value(serde_json::json!({
///     "metadata": { "namespace": "default", "name": "c", "uid": "uid-1" },
///     "spec": {},
///     "status": { "allocation": { "devices": { "results": [
///         { "request": "gpu", "driver": "gpu.example.com", "pool": "node-a", "device": "gpu-0" },
///         { "request": "nic", "driver": "net.example.com", "pool": "node-a", "device": "eth1" },
///     ] } } },
/// }))?;
/// let claim = resolve::<()>(
///     ClaimRef::new("default", "c", "uid-1"),
///     Arc::new(object),
///     "gpu.example.com",
///     &ConfigRegistry::new(),
/// )?;
/// assert_eq!(claim.devices.len(), 1);
/// assert_eq!(claim.devices[0].device.name, "gpu-0");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn resolve<C: Send + Sync + 'static>(
    claim: ClaimRef,
    object: Arc<ResourceClaim>,
    driver_name: &str,
    registry: &ConfigRegistry<C>,
) -> Result<Claim<C>, ClaimError> {
    let Some(allocation) = object
        .status
        .as_ref()
        .and_then(|status| status.allocation.as_ref())
    else {
        return Err(ClaimError::NotAllocated {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
        });
    };
    let Some(device_allocation) = allocation.devices.as_ref() else {
        return Ok(Claim {
            claim,
            devices: Vec::new(),
            resource_claim: object,
        });
    };

    let configs = decode_configs(
        device_allocation.config.as_deref().unwrap_or_default(),
        driver_name,
        registry,
    )?;

    let devices = device_allocation
        .results
        .iter()
        .flatten()
        .filter(|result| result.driver == driver_name)
        .map(|result| {
            let (request, subrequest) = split_request(&result.request);
            let applied = configs
                .iter()
                .filter(|config| config.applies_to(&result.request, request))
                .map(|config| config.applied.clone())
                .collect();
            AllocatedDevice {
                request: request.to_string(),
                subrequest: subrequest.map(str::to_string),
                device: DeviceRef::new(&result.pool, &result.device),
                share_id: result.share_id.clone(),
                consumed_capacity: result
                    .consumed_capacity
                    .clone()
                    .map(|capacity| capacity.into_iter().collect::<BTreeMap<_, _>>())
                    .unwrap_or_default(),
                admin_access: result.admin_access.unwrap_or(false),
                configs: applied,
            }
        })
        .collect();

    Ok(Claim {
        claim,
        devices,
        resource_claim: object,
    })
}

/// `gpu/large` -> (`gpu`, Some(`large`)): containers reference base request names.
pub(crate) fn split_request(request: &str) -> (&str, Option<&str>) {
    match request.split_once('/') {
        Some((base, sub)) => (base, Some(sub)),
        None => (request, None),
    }
}

struct DecodedConfig<C> {
    requests: Vec<String>,
    applied: AppliedConfig<C>,
}

impl<C> DecodedConfig<C> {
    /// Empty `requests` means every request; a base request name covers its subrequests.
    fn applies_to(&self, full_request: &str, base_request: &str) -> bool {
        self.requests.is_empty()
            || self
                .requests
                .iter()
                .any(|r| r == full_request || r == base_request)
    }
}

/// Decodes the opaque configs addressed to this driver, class configs first, then claim
/// configs, each group in declaration order, so "later wins" means claim over class.
fn decode_configs<C: Send + Sync + 'static>(
    configs: &[DeviceAllocationConfiguration],
    driver_name: &str,
    registry: &ConfigRegistry<C>,
) -> Result<Vec<DecodedConfig<C>>, ClaimError> {
    let mut decoded = Vec::new();
    for (index, config) in configs.iter().enumerate() {
        let Some(opaque) = config.opaque.as_ref() else {
            continue;
        };
        // Shared with the admission webhook: the same decoding and the same message.
        let Some(outcome) =
            registry.decode_for_driver(driver_name, &opaque.driver, &opaque.parameters.0)
        else {
            continue;
        };
        let source = match config.source.as_str() {
            "FromClass" => ConfigSource::Class,
            _ => ConfigSource::Claim,
        };
        let requests = config.requests.clone().unwrap_or_default();
        let value = outcome.map_err(|source_error| ClaimError::Config {
            location: config_location(index, source, &requests),
            source: source_error,
        })?;
        decoded.push(DecodedConfig {
            requests,
            applied: AppliedConfig {
                source,
                config: Arc::new(value),
            },
        });
    }
    // Stable: keeps declaration order inside each source.
    decoded.sort_by_key(|config| match config.applied.source {
        ConfigSource::Class => 0,
        ConfigSource::Claim => 1,
    });
    Ok(decoded)
}

fn config_location(index: usize, source: ConfigSource, requests: &[String]) -> String {
    let origin = match source {
        ConfigSource::Class => "from device class",
        ConfigSource::Claim => "from claim",
    };
    let scope = if requests.is_empty() {
        "all requests".to_string()
    } else {
        format!("requests [{}]", requests.join(", "))
    };
    format!("opaque config #{index} ({origin}, {scope})")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult,
        OpaqueDeviceConfiguration, ResourceClaimStatus,
    };
    use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
    use serde::Deserialize;

    use crate::config::{ConfigHooks, OpaqueConfig};

    #[derive(Debug, Deserialize, PartialEq)]
    struct Sharing {
        strategy: String,
    }
    impl ConfigHooks for Sharing {}
    impl OpaqueConfig for Sharing {
        const API_VERSION: &'static str = "gpu.example.com/v1";
        const KIND: &'static str = "Sharing";
    }

    fn result(request: &str, driver: &str, device: &str) -> DeviceRequestAllocationResult {
        DeviceRequestAllocationResult {
            request: request.into(),
            driver: driver.into(),
            pool: "node-a".into(),
            device: device.into(),
            ..Default::default()
        }
    }

    fn config(
        source: &str,
        requests: &[&str],
        driver: &str,
        strategy: &str,
    ) -> DeviceAllocationConfiguration {
        DeviceAllocationConfiguration {
            source: source.into(),
            requests: (!requests.is_empty())
                .then(|| requests.iter().map(|r| r.to_string()).collect()),
            opaque: Some(OpaqueDeviceConfiguration {
                driver: driver.into(),
                parameters: RawExtension(serde_json::json!({
                    "apiVersion": "gpu.example.com/v1", "kind": "Sharing", "strategy": strategy
                })),
            }),
        }
    }

    fn claim_with(
        results: Vec<DeviceRequestAllocationResult>,
        configs: Vec<DeviceAllocationConfiguration>,
    ) -> Arc<ResourceClaim> {
        let mut claim = ResourceClaim::default();
        claim.metadata.uid = Some("uid-1".into());
        claim.status = Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    config: Some(configs),
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        Arc::new(claim)
    }

    fn claim_ref() -> ClaimRef {
        ClaimRef {
            uid: "uid-1".into(),
            namespace: "ns".into(),
            name: "c".into(),
        }
    }

    #[test]
    fn keeps_only_this_drivers_results_and_strips_subrequests() {
        let object = claim_with(
            vec![
                result("gpu/large", "gpu.example.com", "gpu-0"),
                result("nic", "net.example.com", "nic-0"),
            ],
            vec![],
        );
        let registry = ConfigRegistry::<Sharing>::new();
        let claim = resolve(claim_ref(), object, "gpu.example.com", &registry).unwrap();
        assert_eq!(claim.devices.len(), 1);
        assert_eq!(claim.devices[0].request, "gpu");
        assert_eq!(claim.devices[0].subrequest.as_deref(), Some("large"));
    }

    #[test]
    fn claim_configs_override_class_configs_and_request_scoping_applies() {
        let object = claim_with(
            vec![
                result("a", "gpu.example.com", "gpu-0"),
                result("b/sub", "gpu.example.com", "gpu-1"),
            ],
            vec![
                // Deliberately out of order: claim config listed before the class config.
                config("FromClaim", &["b"], "gpu.example.com", "claim-b"),
                config("FromClass", &[], "gpu.example.com", "class"),
                config("FromClaim", &[], "other.example.com", "ignored"),
            ],
        );
        let registry = ConfigRegistry::<Sharing>::new().register::<Sharing>();
        let claim = resolve(claim_ref(), object, "gpu.example.com", &registry).unwrap();
        assert_eq!(claim.devices[0].config().unwrap().strategy, "class");
        assert_eq!(claim.devices[0].configs.len(), 1);
        assert_eq!(claim.devices[1].config().unwrap().strategy, "claim-b");
        assert_eq!(claim.devices[1].configs.len(), 2);
    }

    #[test]
    fn config_errors_name_the_config() {
        let mut bad = config("FromClaim", &["a"], "gpu.example.com", "x");
        if let Some(opaque) = bad.opaque.as_mut() {
            opaque.parameters = RawExtension(serde_json::json!({
                "apiVersion": "gpu.example.com/v1", "kind": "Sharing", "strategy": "x", "bogus": 1
            }));
        }
        let object = claim_with(vec![result("a", "gpu.example.com", "gpu-0")], vec![bad]);
        let registry = ConfigRegistry::<Sharing>::new().register::<Sharing>();
        let error = resolve(claim_ref(), object, "gpu.example.com", &registry).unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("opaque config #0 (from claim, requests [a])"),
            "{message}"
        );
        assert!(message.contains("bogus"), "{message}");
    }

    #[test]
    fn uid_mismatch_and_missing_allocation_are_reported() {
        let mut object = ResourceClaim::default();
        object.metadata.uid = Some("other".into());
        let error = check_claim(&claim_ref(), &object).unwrap_err();
        assert!(matches!(error, ClaimError::Replaced { .. }), "{error}");
        object.metadata.uid = Some("uid-1".into());
        let error = check_claim(&claim_ref(), &object).unwrap_err();
        assert!(matches!(error, ClaimError::NotAllocated { .. }), "{error}");
    }
}
