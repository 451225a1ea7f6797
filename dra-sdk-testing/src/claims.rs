//! Building allocated ResourceClaims by hand, for tests that need no scheduler.
//!
//! ```
//! use dra_sdk_testing::claims::AllocatedClaim;
//!
//! let claim = AllocatedClaim::new("default", "gpu-claim")
//!     .device("gpu", "gpu.example.com", "node-a", "gpu-0")
//!     .claim_config(&["gpu"], "gpu.example.com", serde_json::json!({
//!         "apiVersion": "gpu.example.com/v1", "kind": "GpuConfig"
//!     }))
//!     .build();
//! let allocation = claim.status.unwrap().allocation.unwrap();
//! assert_eq!(allocation.devices.unwrap().results.unwrap()[0].device, "gpu-0");
//! ```

use k8s_openapi::api::resource::v1::{
    DeviceAllocationConfiguration, DeviceRequestAllocationResult, OpaqueDeviceConfiguration,
    ResourceClaim,
};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{Api, Patch, PatchParams, PostParams};

/// The device results of a claim's allocation (`status.allocation.devices.results`); empty
/// while the claim is not allocated.
pub fn allocation_results(claim: &ResourceClaim) -> Vec<DeviceRequestAllocationResult> {
    claim
        .status
        .as_ref()
        .and_then(|status| status.allocation.as_ref())
        .and_then(|allocation| allocation.devices.as_ref())
        .and_then(|devices| devices.results.clone())
        .unwrap_or_default()
}

/// Builder of a ResourceClaim with `status.allocation` filled in.
#[derive(Clone, Debug)]
pub struct AllocatedClaim {
    namespace: String,
    name: String,
    results: Vec<DeviceRequestAllocationResult>,
    configs: Vec<DeviceAllocationConfiguration>,
}

impl AllocatedClaim {
    /// A claim without devices yet.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            results: Vec::new(),
            configs: Vec::new(),
        }
    }

    /// Adds an allocation result.
    pub fn device(self, request: &str, driver: &str, pool: &str, device: &str) -> Self {
        self.result(DeviceRequestAllocationResult {
            request: request.into(),
            driver: driver.into(),
            pool: pool.into(),
            device: device.into(),
            ..Default::default()
        })
    }

    /// Adds a fully specified allocation result (share IDs, consumed capacity, admin access).
    pub fn result(mut self, result: DeviceRequestAllocationResult) -> Self {
        self.results.push(result);
        self
    }

    /// Adds an opaque config declared in the claim (`FromClaim`); empty `requests` = all.
    pub fn claim_config(
        self,
        requests: &[&str],
        driver: &str,
        parameters: serde_json::Value,
    ) -> Self {
        self.config("FromClaim", requests, driver, parameters)
    }

    /// Adds an opaque config inherited from the device class (`FromClass`).
    pub fn class_config(
        self,
        requests: &[&str],
        driver: &str,
        parameters: serde_json::Value,
    ) -> Self {
        self.config("FromClass", requests, driver, parameters)
    }

    fn config(
        mut self,
        source: &str,
        requests: &[&str],
        driver: &str,
        parameters: serde_json::Value,
    ) -> Self {
        self.configs.push(DeviceAllocationConfiguration {
            source: source.into(),
            requests: (!requests.is_empty())
                .then(|| requests.iter().map(|r| r.to_string()).collect()),
            opaque: Some(OpaqueDeviceConfiguration {
                driver: driver.into(),
                parameters: RawExtension(parameters),
            }),
        });
        self
    }

    /// The claim object (without UID: the API server assigns it).
    pub fn build(self) -> ResourceClaim {
        // Built through JSON so it does not depend on which Kubernetes version's Rust types
        // the application selected (field optionality differs between them).
        let object = serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": { "name": self.name, "namespace": self.namespace },
            "spec": { "devices": {} },
            "status": {
                "allocation": {
                    "devices": { "results": self.results, "config": self.configs }
                }
            }
        });
        // Serializing typed values can only yield a valid object.
        serde_json::from_value(object).unwrap_or_default()
    }

    /// Creates the claim through the API, then writes its allocation through the status
    /// subresource the way the scheduler does. Returns the stored object (with its UID).
    pub async fn create(self, client: &kube::Client) -> Result<ResourceClaim, kube::Error> {
        let namespace = self.namespace.clone();
        let name = self.name.clone();
        let claim = self.build();
        let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &namespace);
        let mut without_status = claim.clone();
        without_status.status = None;
        api.create(&PostParams::default(), &without_status).await?;
        let status = serde_json::json!({ "status": claim.status });
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
    }
}
