//! AdmissionReview `admission.k8s.io/v1` in and out, and the check of one object's opaque
//! configs.
//!
//! The request is read loosely (unknown fields are fine: the API server adds some in new
//! releases) but what the answer depends on must be there: `apiVersion`, `kind`,
//! `request.uid`, `request.kind`, `request.operation`, and `request.object` for CREATE and
//! UPDATE. The object is walked as JSON rather than decoded into a `resource.k8s.io` type: the
//! opaque config path is the same in v1, v1beta2 and v1beta1, and nothing else of the object
//! matters here.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::{ConfigError, ConfigRegistry};

/// The only AdmissionReview version served; the webhook configuration's
/// `admissionReviewVersions` must list it.
pub(super) const API_VERSION: &str = "admission.k8s.io/v1";

/// HTTP status of a denial, in `response.status.code`: 422 Unprocessable Entity, reason
/// `Invalid`, as the API server's own validation answers an object it cannot accept. The API
/// server hands a webhook's code of 400 or more to the client as is (it raises lower codes to
/// 400), so `kubectl apply` reports "The request is invalid: ...".
const DENIED_CODE: u16 = 422;

/// Decodes the opaque configs of one driver. Type-erases the registry's config type.
pub(super) trait Decoder: Send + Sync {
    /// `None` for another driver's config; otherwise the outcome of strict decoding.
    fn check(&self, opaque_driver: &str, parameters: &Value) -> Option<Result<(), ConfigError>>;
}

pub(super) struct RegistryDecoder<C> {
    pub(super) driver_name: String,
    pub(super) registry: ConfigRegistry<C>,
}

impl<C: Send + Sync + 'static> Decoder for RegistryDecoder<C> {
    fn check(&self, opaque_driver: &str, parameters: &Value) -> Option<Result<(), ConfigError>> {
        // The function prepare uses: same strictness, hooks and message.
        self.registry
            .decode_for_driver(&self.driver_name, opaque_driver, parameters)
            .map(|decoded| decoded.map(drop))
    }
}

/// The AdmissionReview could not be read: answered with HTTP 400 and this text.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed AdmissionReview: {0}")]
pub(super) struct Malformed(String);

/// What was decided, for the log.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Verdict {
    pub(super) uid: String,
    pub(super) operation: String,
    pub(super) kind: String,
    pub(super) namespace: String,
    pub(super) name: String,
    /// `None` when allowed.
    pub(super) denied: Option<String>,
}

/// The envelope, read first: a review of another version is refused for its version, not
/// for a request field that version lacks.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Review {
    api_version: String,
    kind: String,
    request: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request {
    uid: String,
    kind: GroupVersionKind,
    operation: String,
    #[serde(default)]
    sub_resource: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    object: Option<Value>,
    #[serde(default)]
    old_object: Option<Value>,
}

#[derive(Deserialize)]
struct GroupVersionKind {
    // The core group is "", which the API server may leave out.
    #[serde(default)]
    group: String,
    kind: String,
}

/// Reads an AdmissionReview and answers it: the response review, and the verdict to log.
pub(super) fn answer(body: &[u8], decoder: &dyn Decoder) -> Result<(Value, Verdict), Malformed> {
    let deserializer = &mut serde_json::Deserializer::from_slice(body);
    let review: Review =
        serde_path_to_error::deserialize(deserializer).map_err(|error| malformed("", error))?;
    if review.api_version != API_VERSION {
        return Err(Malformed(format!(
            "apiVersion is {:?}; this webhook answers {API_VERSION} only (set \
             admissionReviewVersions: [\"v1\"] in the webhook configuration)",
            review.api_version
        )));
    }
    if review.kind != "AdmissionReview" {
        return Err(Malformed(format!(
            "kind is {:?}, not AdmissionReview",
            review.kind
        )));
    }
    let request = review
        .request
        .ok_or_else(|| Malformed("no `request`".to_owned()))?;
    let request: Request =
        serde_path_to_error::deserialize(request).map_err(|error| malformed("request", error))?;
    if request.uid.is_empty() {
        return Err(Malformed("request.uid is empty".to_owned()));
    }
    let denied = decide(&request, decoder)?;
    let mut response = json!({ "uid": request.uid, "allowed": denied.is_none() });
    if let Some(message) = &denied {
        response["status"] = json!({
            "status": "Failure",
            "code": DENIED_CODE,
            "reason": "Invalid",
            "message": message,
        });
    }
    let review = json!({
        "apiVersion": API_VERSION,
        "kind": "AdmissionReview",
        "response": response,
    });
    let verdict = Verdict {
        uid: request.uid,
        operation: request.operation,
        kind: request.kind.kind,
        namespace: request.namespace.unwrap_or_default(),
        name: request.name.unwrap_or_default(),
        denied,
    };
    Ok((review, verdict))
}

/// A deserialization error with the path of the field at fault, under `prefix`.
fn malformed<E: std::fmt::Display>(
    prefix: &str,
    error: serde_path_to_error::Error<E>,
) -> Malformed {
    let path = error.path().to_string();
    let path = match (prefix, path.as_str()) {
        (prefix, "." | "") => prefix.to_owned(),
        ("", path) => path.to_owned(),
        (prefix, path) => format!("{prefix}.{path}"),
    };
    let inner = error.into_inner();
    match path.as_str() {
        "" => Malformed(inner.to_string()),
        path => Malformed(format!("{path}: {inner}")),
    }
}

/// Where a kind keeps its device configs, as a JSON pointer and as the field path users see.
fn config_path(group: &str, kind: &str) -> Option<(&'static str, &'static str)> {
    if group != "resource.k8s.io" {
        return None;
    }
    match kind {
        "ResourceClaim" => Some(("/spec/devices/config", "spec.devices.config")),
        "ResourceClaimTemplate" => Some(("/spec/spec/devices/config", "spec.spec.devices.config")),
        "DeviceClass" => Some(("/spec/config", "spec.config")),
        _ => None,
    }
}

/// `Some(message)` to deny. Every bad config of the object is in the message, not only the
/// first, so one round of `kubectl apply` shows all there is to fix.
fn decide(request: &Request, decoder: &dyn Decoder) -> Result<Option<String>, Malformed> {
    // DELETE and CONNECT carry nothing to check; a subresource (`resourceclaims/status`, which
    // the scheduler writes) cannot change the spec.
    let update = match request.operation.as_str() {
        "CREATE" => false,
        "UPDATE" => true,
        _ => return Ok(None),
    };
    if request
        .sub_resource
        .as_deref()
        .is_some_and(|s| !s.is_empty())
    {
        return Ok(None);
    }
    let Some((pointer, field)) = config_path(&request.kind.group, &request.kind.kind) else {
        // Not a kind this webhook is meant for: the configuration's rules are wider than
        // they should be. Allowing is the safe answer.
        return Ok(None);
    };
    let object = request.object.as_ref().ok_or_else(|| {
        Malformed(format!(
            "request.object is missing for a {} of a {}",
            request.operation, request.kind.kind
        ))
    })?;
    let configs = configs(object, pointer);
    // An UPDATE is judged on what it changes: a config the stored object already had stays
    // acceptable. Otherwise an object created before the webhook (or before a stricter driver
    // version) could never be updated again, not even to remove its finalizers for deletion.
    let old_configs = match (update, request.old_object.as_ref()) {
        (true, Some(old)) => self::configs(old, pointer),
        _ => &[],
    };
    let mut problems = Vec::new();
    for (index, config) in configs.iter().enumerate() {
        if old_configs.contains(config) {
            continue;
        }
        let Some(opaque) = config.get("opaque") else {
            continue;
        };
        let Some(driver) = opaque.get("driver").and_then(Value::as_str) else {
            continue;
        };
        let parameters = opaque.get("parameters").unwrap_or(&Value::Null);
        if let Some(Err(error)) = decoder.check(driver, parameters) {
            problems.push(format!("{field}[{index}].opaque.parameters: {error}"));
        }
    }
    Ok((!problems.is_empty()).then(|| problems.join("; ")))
}

fn configs<'a>(object: &'a Value, pointer: &str) -> &'a [Value] {
    object
        .pointer(pointer)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// The erased decoder of a registry.
pub(super) fn decoder<C: Send + Sync + 'static>(
    driver_name: String,
    registry: ConfigRegistry<C>,
) -> Arc<dyn Decoder> {
    Arc::new(RegistryDecoder {
        driver_name,
        registry,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ConfigHooks, ConfigValidationError, OpaqueConfig};

    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Gpu {
        #[serde(default)]
        time_slice: Option<String>,
    }

    impl OpaqueConfig for Gpu {
        const API_VERSION: &'static str = "gpu.example.com/v1";
        const KIND: &'static str = "GpuConfig";
    }

    impl ConfigHooks for Gpu {
        fn validate(&self) -> Result<(), ConfigValidationError> {
            match self.time_slice.as_deref() {
                None | Some("Short" | "Long") => Ok(()),
                Some(other) => Err(ConfigValidationError::for_field(
                    "timeSlice",
                    format!("must be Short or Long, got {other:?}"),
                )),
            }
        }
    }

    fn decoder() -> Arc<dyn Decoder> {
        super::decoder(
            "gpu.example.com".into(),
            ConfigRegistry::<Gpu>::new().register::<Gpu>(),
        )
    }

    fn opaque(driver: &str, parameters: Value) -> Value {
        json!({ "opaque": { "driver": driver, "parameters": parameters } })
    }

    fn claim(configs: Vec<Value>) -> Value {
        json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": { "name": "c", "namespace": "default" },
            "spec": { "devices": { "requests": [], "config": configs } },
        })
    }

    fn review(operation: &str, kind: &str, object: Value, old: Option<Value>) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": API_VERSION,
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": { "group": "resource.k8s.io", "version": "v1", "kind": kind },
                "operation": operation,
                "object": object,
                "oldObject": old,
            },
        }))
        .unwrap()
    }

    fn message(body: &[u8]) -> Option<String> {
        let (review, verdict) = answer(body, &*decoder()).unwrap();
        assert_eq!(
            review["response"]["uid"],
            "705ab4f5-6393-11e8-b7cc-42010a800002"
        );
        assert_eq!(review["response"]["allowed"], verdict.denied.is_none());
        verdict.denied
    }

    #[test]
    fn every_bad_config_is_named_by_its_path() {
        let body = review(
            "CREATE",
            "ResourceClaim",
            claim(vec![
                opaque(
                    "gpu.example.com",
                    json!({"apiVersion": "gpu.example.com/v1", "kind": "GpuConfig"}),
                ),
                opaque(
                    "gpu.example.com",
                    json!({"apiVersion": "gpu.example.com/v1", "kind": "GpuConfig", "timeSlice": "Medium"}),
                ),
                opaque("nic.example.com", json!({"anything": true})),
                opaque(
                    "gpu.example.com",
                    json!({"apiVersion": "gpu.example.com/v1", "kind": "Other"}),
                ),
            ]),
            None,
        );
        assert_eq!(
            message(&body).unwrap(),
            "spec.devices.config[1].opaque.parameters: invalid GpuConfig (gpu.example.com/v1): \
             timeSlice: must be Short or Long, got \"Medium\"; \
             spec.devices.config[3].opaque.parameters: unsupported opaque config kind \"Other\" \
             in apiVersion \"gpu.example.com/v1\"; this driver accepts GpuConfig (gpu.example.com/v1)"
        );
    }

    #[test]
    fn templates_and_classes_have_their_own_paths() {
        let bad = opaque(
            "gpu.example.com",
            json!({"apiVersion": "gpu.example.com/v1", "kind": "GpuConfig", "timeSlices": "x"}),
        );
        let template = json!({ "spec": { "spec": { "devices": { "config": [bad] } } } });
        assert!(
            message(&review("CREATE", "ResourceClaimTemplate", template, None))
                .unwrap()
                .starts_with("spec.spec.devices.config[0].opaque.parameters: invalid GpuConfig")
        );
        let class = json!({ "spec": { "config": [bad] } });
        assert!(
            message(&review("UPDATE", "DeviceClass", class, None))
                .unwrap()
                .starts_with("spec.config[0].opaque.parameters: invalid GpuConfig")
        );
    }

    #[test]
    fn updates_are_judged_on_the_configs_they_change() {
        let bad = opaque(
            "gpu.example.com",
            json!({"apiVersion": "gpu.example.com/v1", "kind": "Old"}),
        );
        let old = claim(vec![bad.clone()]);
        // A metadata-only update (a finalizer removed) of an object that was stored with a
        // config the driver no longer accepts.
        assert_eq!(
            message(&review(
                "UPDATE",
                "ResourceClaim",
                claim(vec![bad.clone()]),
                Some(old.clone())
            )),
            None
        );
        let worse = opaque(
            "gpu.example.com",
            json!({"apiVersion": "gpu.example.com/v1", "kind": "Newer"}),
        );
        let denied = message(&review(
            "UPDATE",
            "ResourceClaim",
            claim(vec![bad, worse]),
            Some(old),
        ))
        .unwrap();
        assert!(
            denied.starts_with("spec.devices.config[1].opaque.parameters: "),
            "{denied}"
        );
    }

    #[test]
    fn other_operations_subresources_and_kinds_are_allowed() {
        let bad = claim(vec![opaque("gpu.example.com", json!([]))]);
        assert_eq!(
            message(&review(
                "DELETE",
                "ResourceClaim",
                Value::Null,
                Some(bad.clone())
            )),
            None
        );
        assert_eq!(message(&review("CREATE", "Pod", bad.clone(), None)), None);
        let mut status =
            serde_json::from_slice::<Value>(&review("UPDATE", "ResourceClaim", bad.clone(), None))
                .unwrap();
        status["request"]["subResource"] = json!("status");
        assert_eq!(message(&serde_json::to_vec(&status).unwrap()), None);
        assert!(message(&review("CREATE", "ResourceClaim", bad, None)).is_some());
    }

    #[test]
    fn malformed_reviews_say_what_is_wrong() {
        let cases: [(&[u8], &str); 6] = [
            (b"not json", "expected ident"),
            (br#"{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}"#, "admissionReviewVersions"),
            (br#"{"apiVersion": "admission.k8s.io/v1", "kind": "Pod"}"#, "not AdmissionReview"),
            (br#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}"#, "no `request`"),
            (br#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"kind": {}}}"#, "request.kind"),
            (
                br#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u", "operation": "CREATE", "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "DeviceClass"}}}"#,
                "request.object is missing",
            ),
        ];
        for (body, expected) in cases {
            let error = answer(body, &*decoder()).unwrap_err().to_string();
            assert!(error.starts_with("malformed AdmissionReview: "), "{error}");
            assert!(error.contains(expected), "{error} lacks {expected}");
        }
    }
}
