//! The `resource.k8s.io` version a ResourceClaim is read through, and its conversion to v1.
//!
//! Kubernetes 1.34+ serves ResourceClaims as `v1`, 1.33 as `v1beta2` and `v1beta1`, 1.32 as
//! `v1beta1` only. The plugin reads the newest one the server serves, found by discovery like
//! the slice publisher does, and converts it to the one internal model (`v1`). `v1beta2` has
//! v1's JSON shape; `v1beta1` keeps a request's fields inline where v1 nests them under
//! `exactly`. Allocation results and status are the same in all three.
//!
//! The claims a kubelet names in its gRPC requests are checked here too ([`check_claim`]):
//! they are wire input as much as the claims read from the API server.

use std::collections::BTreeMap;
use std::sync::Mutex;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{DynamicObject, GetParams};
use kube::core::Status;
use kube::{Client, Resource as _};
use serde_json::{Map, Value};

use crate::advanced::rate_limit::ApiBudget;
use crate::claim::ClaimRef;
use crate::k8s::names;
use crate::slices::ResourceApiVersion;

/// Why the served version could not be found.
#[derive(Debug)]
pub(crate) enum DiscoveryError {
    /// The discovery request failed.
    Api(kube::Error),
    /// `resource.k8s.io` is not served, or serves none of the versions the SDK reads.
    NotServed,
}

/// The version claims are read through: discovered on first use, forgotten when the server
/// stops serving it (an upgrade or downgrade of the API server while the plugin runs).
#[derive(Debug, Default)]
pub(crate) struct ClaimVersion {
    chosen: Mutex<Option<ResourceApiVersion>>,
}

impl ClaimVersion {
    /// The version to read through, discovering it when none is known.
    pub(crate) async fn get(&self, client: &Client) -> Result<ResourceApiVersion, DiscoveryError> {
        if let Some(version) = *self.lock() {
            return Ok(version);
        }
        let version = discover(client).await?;
        tracing::debug!(version = version.as_str(), "reading ResourceClaims through");
        *self.lock() = Some(version);
        Ok(version)
    }

    /// Forgets `version` (if it is still the chosen one) so that the next read discovers again.
    pub(crate) fn forget(&self, version: ResourceApiVersion) {
        let mut chosen = self.lock();
        if *chosen == Some(version) {
            *chosen = None;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<ResourceApiVersion>> {
        // The guarded value is a plain `Option<Copy>`: a panic elsewhere cannot leave it torn.
        self.chosen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

async fn discover(client: &Client) -> Result<ResourceApiVersion, DiscoveryError> {
    ResourceApiVersion::newest_served(client)
        .await
        .map_err(DiscoveryError::Api)?
        .ok_or(DiscoveryError::NotServed)
}

/// What one GET found.
#[derive(Debug)]
pub(crate) enum Fetched {
    /// The claim, converted to v1.
    Claim(Box<ResourceClaim>),
    /// The server says this claim does not exist.
    Missing,
    /// A 404 that does not name the claim: the version (or the group) is not served.
    VersionNotServed,
}

/// GETs one claim through `version` and converts it to v1. The request spends the
/// [prepare budget](ApiBudget::Prepare) of the client's rate limit: the kubelet waits on it.
pub(crate) async fn fetch(
    client: &Client,
    version: ResourceApiVersion,
    namespace: &str,
    name: &str,
) -> Result<Fetched, kube::Error> {
    let result = match version {
        // The hot path on 1.34+: no conversion, no intermediate JSON tree.
        ResourceApiVersion::V1 => {
            let url = ResourceClaim::url_path(&(), Some(namespace));
            get_for_prepare::<ResourceClaim>(client, &url, name)
                .await
                .map(Box::new)
        }
        older => {
            let resource = older.resource("ResourceClaim", "resourceclaims");
            let url = DynamicObject::url_path(&resource, Some(namespace));
            match get_for_prepare::<DynamicObject>(client, &url, name).await {
                Ok(object) => {
                    let value = serde_json::to_value(object).map_err(kube::Error::SerdeError)?;
                    to_v1(older, value)
                        .map(Box::new)
                        .map_err(kube::Error::SerdeError)
                }
                Err(error) => Err(error),
            }
        }
    };
    match result {
        Ok(claim) => Ok(Fetched::Claim(claim)),
        Err(kube::Error::Api(status)) if status.is_not_found() => {
            if names_object(&status, name) {
                Ok(Fetched::Missing)
            } else {
                Ok(Fetched::VersionNotServed)
            }
        }
        Err(error) => Err(error),
    }
}

/// `Api::get`, with the request marked for the prepare budget (which `Api` cannot do).
async fn get_for_prepare<K>(client: &Client, url: &str, name: &str) -> Result<K, kube::Error>
where
    K: serde::de::DeserializeOwned + Clone + std::fmt::Debug,
{
    let mut request = kube::core::Request::new(url)
        .get(name, &GetParams::default())
        .map_err(kube::Error::BuildRequest)?;
    request.extensions_mut().insert(ApiBudget::Prepare);
    client.request::<K>(request).await
}

/// A 404 for a missing object carries the object's name in its details; a 404 for a path the
/// server does not serve (`the server could not find the requested resource`) carries none.
pub(crate) fn names_object(status: &Status, name: &str) -> bool {
    status
        .details
        .as_ref()
        .is_some_and(|details| details.name == name)
}

/// Longest claim UID accepted from the kubelet (the API server writes 36-character UUIDs;
/// the CDI spec files' limit).
const MAX_CLAIM_UID_LEN: usize = 128;
/// Longest piece of a bad field quoted back to the kubelet.
const MAX_QUOTED: usize = 64;

/// Checks one claim of a prepare or unprepare request before anything uses it: the UID goes
/// into CDI spec file names, CDI device names and the checkpoint, the namespace and name into
/// API request paths. The kubelet only sends what the API server stored, so a bad value means
/// a broken or hostile client; the claim then fails alone, with a message naming the field.
///
/// - `uid`: 1 to 128 ASCII letters, digits and `-`, starting with a letter or digit (so no
///   `/`, `..`, NUL or `_`, which would change a path or the spec file naming);
/// - `namespace`: a DNS label;
/// - `name`: a DNS subdomain.
pub(crate) fn check_claim(claim: &ClaimRef) -> Result<(), String> {
    let (field, value, reason) = if let Err(reason) = check_uid(&claim.uid) {
        ("uid", &claim.uid, reason)
    } else if let Err(reason) = names::dns_label(&claim.namespace) {
        ("namespace", &claim.namespace, reason)
    } else if let Err(reason) = names::dns_subdomain(&claim.name) {
        ("name", &claim.name, reason)
    } else {
        return Ok(());
    };
    let quoted: String = value.chars().take(MAX_QUOTED).collect();
    let more = if quoted.len() < value.len() {
        "..."
    } else {
        ""
    };
    Err(format!(
        "invalid claim in the request: claims[].{field} {quoted:?}{more} {reason}"
    ))
}

fn check_uid(uid: &str) -> Result<(), &'static str> {
    if uid.is_empty() {
        Err("must not be empty")
    } else if uid.len() > MAX_CLAIM_UID_LEN {
        Err("must be at most 128 characters")
    } else if !uid.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        Err("must start with an ASCII letter or digit")
    } else if !uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        Err("may contain only ASCII letters, digits and '-'")
    } else {
        Ok(())
    }
}

/// Splits the kubelet's claims into those [`check_claim`] accepts and the errors of the
/// others, keyed by UID. A UID that any bad claim carries is refused in all its claims: the
/// answer has one entry per UID.
pub(crate) fn split_valid(claims: Vec<ClaimRef>) -> (Vec<ClaimRef>, BTreeMap<String, String>) {
    let mut refused = BTreeMap::new();
    for claim in &claims {
        if let Err(message) = check_claim(claim) {
            refused.entry(claim.uid.clone()).or_insert(message);
        }
    }
    let valid = claims
        .into_iter()
        .filter(|claim| !refused.contains_key(&claim.uid))
        .collect();
    (valid, refused)
}

/// The fields of a v1beta1 `DeviceRequest` that v1 moved under `exactly`.
const EXACT_REQUEST_FIELDS: [&str; 7] = [
    "deviceClassName",
    "selectors",
    "allocationMode",
    "count",
    "adminAccess",
    "tolerations",
    "capacity",
];

/// Converts a ResourceClaim read through `version` (as JSON) to the v1 model.
pub(crate) fn to_v1(
    version: ResourceApiVersion,
    mut claim: Value,
) -> Result<ResourceClaim, serde_json::Error> {
    if version == ResourceApiVersion::V1beta1 {
        nest_v1beta1_requests(claim.pointer_mut("/spec/devices/requests"));
    }
    if let Some(object) = claim.as_object_mut() {
        object.insert("apiVersion".to_owned(), Value::from("resource.k8s.io/v1"));
    }
    serde_json::from_value(claim)
}

/// Converts the v1beta1 `DeviceRequest` array `requests` (of a claim, or of a claim template's
/// claim spec) to the v1 shape: a request's fields move under `exactly`, except in a
/// `firstAvailable` request. `dractl` converts the files it reads with this too.
///
/// ```
/// use dra_sdk::advanced::nest_v1beta1_requests;
/// use serde_json::json;
///
/// let mut claim = json!({"spec": {"devices": {"requests": [
///     {"name": "gpu", "deviceClassName": "gpu.example.com", "count": 2}
/// ]}}});
/// nest_v1beta1_requests(claim.pointer_mut("/spec/devices/requests"));
/// assert_eq!(
///     claim["spec"]["devices"]["requests"][0],
///     json!({"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com", "count": 2}})
/// );
/// ```
pub fn nest_v1beta1_requests(requests: Option<&mut Value>) {
    for request in requests.and_then(Value::as_array_mut).into_iter().flatten() {
        if let Some(request) = request.as_object_mut() {
            nest_exact_request(request);
        }
    }
}

/// v1beta1 writes a request's fields inline; v1 nests them under `exactly`, except for a
/// `firstAvailable` request, whose subrequests keep their fields inline in both versions.
fn nest_exact_request(request: &mut Map<String, Value>) {
    if request.contains_key("firstAvailable") {
        for field in EXACT_REQUEST_FIELDS {
            request.remove(field);
        }
        return;
    }
    let mut exactly = Map::new();
    for field in EXACT_REQUEST_FIELDS {
        if let Some(value) = request.remove(field) {
            exactly.insert(field.to_owned(), value);
        }
    }
    if !exactly.is_empty() {
        request.insert("exactly".to_owned(), Value::Object(exactly));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn v1beta1_claim() -> Value {
        json!({
            "apiVersion": "resource.k8s.io/v1beta1",
            "kind": "ResourceClaim",
            "metadata": { "namespace": "default", "name": "c", "uid": "u-1" },
            "spec": { "devices": {
                "requests": [
                    { "name": "gpu", "deviceClassName": "gpu.example.com", "allocationMode": "ExactCount",
                      "count": 2, "selectors": [{ "cel": { "expression": "true" } }] },
                    { "name": "any", "firstAvailable": [
                        { "name": "big", "deviceClassName": "gpu.example.com" },
                        { "name": "small", "deviceClassName": "gpu.example.com", "count": 2 }
                    ] }
                ],
                "config": [{ "requests": ["gpu"], "opaque": { "driver": "gpu.example.com", "parameters": {} } }]
            } },
            "status": { "allocation": { "devices": { "results": [
                { "request": "gpu", "driver": "gpu.example.com", "pool": "n", "device": "gpu-0", "adminAccess": false },
                { "request": "any/small", "driver": "gpu.example.com", "pool": "n", "device": "gpu-1" }
            ] } } }
        })
    }

    #[test]
    fn v1beta1_requests_move_under_exactly_and_results_keep_their_shape() {
        let claim = to_v1(ResourceApiVersion::V1beta1, v1beta1_claim()).unwrap();
        let spec = claim.spec.as_ref().unwrap();
        let requests = spec.devices.as_ref().unwrap().requests.as_ref().unwrap();
        let exactly = requests[0].exactly.as_ref().unwrap();
        assert_eq!(exactly.device_class_name, "gpu.example.com");
        assert_eq!(exactly.count, Some(2));
        assert_eq!(exactly.selectors.as_ref().unwrap().len(), 1);
        assert!(requests[1].exactly.is_none());
        let first = requests[1].first_available.as_ref().unwrap();
        assert_eq!(first[1].name, "small");
        assert_eq!(first[1].count, Some(2));
        let results = claim
            .status
            .unwrap()
            .allocation
            .unwrap()
            .devices
            .unwrap()
            .results;
        let results = results.unwrap();
        assert_eq!(results[1].request, "any/small");
        assert_eq!(results[0].device, "gpu-0");
    }

    #[test]
    fn v1beta2_has_the_v1_shape() {
        let mut value = v1beta1_claim();
        value["spec"]["devices"]["requests"][0] =
            json!({ "name": "gpu", "exactly": { "deviceClassName": "gpu.example.com" } });
        value["spec"]["devices"]["requests"]
            .as_array_mut()
            .unwrap()
            .truncate(1);
        let claim = to_v1(ResourceApiVersion::V1beta2, value).unwrap();
        let requests = claim.spec.unwrap().devices.unwrap().requests.unwrap();
        assert_eq!(
            requests[0].exactly.as_ref().unwrap().device_class_name,
            "gpu.example.com"
        );
    }

    #[test]
    fn only_a_404_naming_the_claim_means_missing() {
        let missing: Status = serde_json::from_value(json!({
            "status": "Failure", "reason": "NotFound", "code": 404,
            "message": "resourceclaims.resource.k8s.io \"c\" not found",
            "details": { "name": "c", "group": "resource.k8s.io", "kind": "resourceclaims" }
        }))
        .unwrap();
        let unserved: Status = serde_json::from_value(json!({
            "status": "Failure", "reason": "NotFound", "code": 404,
            "message": "the server could not find the requested resource", "details": {}
        }))
        .unwrap();
        assert!(names_object(&missing, "c"));
        assert!(!names_object(&unserved, "c"));
    }

    mod claims {
        use proptest::prelude::*;

        use super::super::{check_claim, split_valid};
        use crate::claim::ClaimRef;

        fn claim(namespace: &str, name: &str, uid: &str) -> ClaimRef {
            ClaimRef::new(namespace, name, uid)
        }

        #[test]
        fn real_claims_pass() {
            for (namespace, name, uid) in [
                (
                    "default",
                    "gpu-claim",
                    "0c1d5e2f-3a4b-4c5d-8e9f-0a1b2c3d4e5f",
                ),
                ("kube-system", "a.b-c", "uid-1"),
                ("a", &"x".repeat(253), &"u".repeat(128)),
            ] {
                assert_eq!(check_claim(&claim(namespace, name, uid)), Ok(()));
            }
        }

        #[test]
        fn each_bad_field_is_named() {
            for (claim, message) in [
                (
                    claim("default", "c", "../../etc"),
                    "invalid claim in the request: claims[].uid \"../../etc\" must start with \
                     an ASCII letter or digit",
                ),
                (
                    claim("default", "c", "a/../../b"),
                    "invalid claim in the request: claims[].uid \"a/../../b\" may contain only \
                     ASCII letters, digits and '-'",
                ),
                (
                    claim("default", "c", "uid\0"),
                    "invalid claim in the request: claims[].uid \"uid\\0\" may contain only \
                     ASCII letters, digits and '-'",
                ),
                (
                    claim("default", "c", ""),
                    "invalid claim in the request: claims[].uid \"\" must not be empty",
                ),
                (
                    claim("Default", "c", "uid-1"),
                    "invalid claim in the request: claims[].namespace \"Default\" may contain \
                     only lower-case letters, digits and '-'",
                ),
                (
                    claim("default", "../c", "uid-1"),
                    "invalid claim in the request: claims[].name \"../c\" must not be empty",
                ),
            ] {
                assert_eq!(check_claim(&claim).unwrap_err(), message);
            }
            let long = check_claim(&claim("default", "c", &"u".repeat(10_000))).unwrap_err();
            assert!(long.len() < 200, "{long}");
            assert!(
                long.ends_with("\"... must be at most 128 characters"),
                "{long}"
            );
        }

        #[test]
        fn a_bad_claim_fails_alone_and_its_uid_is_refused_everywhere() {
            let (valid, refused) = split_valid(vec![
                claim("default", "good", "uid-1"),
                claim("BAD", "bad", "uid-2"),
                claim("default", "same-uid", "uid-2"),
            ]);
            assert_eq!(valid, vec![claim("default", "good", "uid-1")]);
            assert_eq!(refused.keys().collect::<Vec<_>>(), ["uid-2"]);
        }

        /// What a UID accepted here can do to a path: nothing. Every accepted UID is one
        /// plain file-name component.
        fn stays_one_path_component(uid: &str) -> bool {
            let path = std::path::Path::new("/var/run/cdi").join(format!("vendor-gpu_{uid}.json"));
            path.parent() == Some(std::path::Path::new("/var/run/cdi"))
                && path.components().count() == 4
        }

        fn field_text() -> impl Strategy<Value = String> {
            prop_oneof![
                Just(String::new()),
                Just("..".to_owned()),
                Just("../..".to_owned()),
                Just("a/b".to_owned()),
                Just("a\0b".to_owned()),
                "[a-z0-9-]{1,70}",
                "[a-z0-9.-]{1,260}",
                "[A-Za-z0-9_./-]{0,140}",
                any::<String>(),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// Any uid, namespace and name (empty, too long, not DNS, NUL bytes, `../`):
            /// never a panic; a refusal names the field, and a UID that passes stays one
            /// plain file-name component.
            #[test]
            fn claim_fields_are_checked_without_panics(
                namespace in field_text(),
                name in field_text(),
                uid in field_text(),
            ) {
                let claim = claim(&namespace, &name, &uid);
                match check_claim(&claim) {
                    Ok(()) => {
                        prop_assert!(stays_one_path_component(&uid), "{uid:?}");
                        prop_assert!(!uid.contains(['/', '.', '\0', '_']));
                        prop_assert!(!namespace.is_empty() && namespace.len() <= 63);
                        prop_assert!(!name.is_empty() && name.len() <= 253);
                    }
                    Err(message) => {
                        prop_assert!(message.len() < 400, "{message}");
                        prop_assert!(
                            ["claims[].uid ", "claims[].namespace ", "claims[].name "]
                                .iter()
                                .any(|field| message.contains(field)),
                            "{message}"
                        );
                    }
                }
                let (valid, refused) = split_valid(vec![claim.clone()]);
                prop_assert_eq!(valid.len() + refused.len(), 1);
            }
        }
    }
}
