//! `metav1.Status` failures, shaped and worded like the real API server's.

use serde_json::{Value, json};

use super::object::FieldError;
use super::resources::ResourceType;

/// A failed request: HTTP code, `Status.reason`, message and optional details.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ApiError {
    pub(crate) code: u16,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    pub(crate) details: Option<Value>,
    /// Seconds for `Retry-After` and `details.retryAfterSeconds` (429/503 faults).
    pub(crate) retry_after: Option<u32>,
}

impl ApiError {
    pub(crate) fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    /// The reason the real server uses for a bare HTTP code.
    pub(crate) fn reason_for(code: u16) -> &'static str {
        match code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            405 => "MethodNotAllowed",
            406 => "NotAcceptable",
            409 => "Conflict",
            410 => "Expired",
            413 => "RequestEntityTooLarge",
            415 => "UnsupportedMediaType",
            422 => "Invalid",
            429 => "TooManyRequests",
            500 => "InternalError",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "Unknown",
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// A plain Go error surfacing from storage: 500 with no reason, the message as is.
    pub(crate) fn unclassified(message: impl Into<String>) -> Self {
        Self::new(500, "", message)
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }

    fn with_resource_details(mut self, rt: &ResourceType, name: &str) -> Self {
        self.details = Some(json!({"name": name, "group": rt.group, "kind": rt.plural}));
        self
    }

    pub(crate) fn not_found(rt: &ResourceType, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", rt.qualified_resource()),
        )
        .with_resource_details(rt, name)
    }

    pub(crate) fn already_exists(rt: &ResourceType, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", rt.qualified_resource()),
        )
        .with_resource_details(rt, name)
    }

    /// 409 Conflict, the optimistic-concurrency failure (`detail` says which precondition).
    pub(crate) fn conflict(rt: &ResourceType, name: &str, detail: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {detail}",
                rt.qualified_resource()
            ),
        )
        .with_resource_details(rt, name)
    }

    pub(crate) fn stale(rt: &ResourceType, name: &str) -> Self {
        Self::conflict(
            rt,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 Invalid listing field errors in `details.causes`.
    pub(crate) fn invalid(rt: &ResourceType, name: &str, errors: &[FieldError]) -> Self {
        let summary: Vec<String> = errors
            .iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect();
        let summary = if summary.len() == 1 {
            summary.join("")
        } else {
            format!("[{}]", summary.join(", "))
        };
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| json!({"reason": e.reason, "message": e.message, "field": e.field}))
            .collect();
        let mut err = Self::new(
            422,
            "Invalid",
            format!("{} \"{name}\" is invalid: {summary}", rt.qualified_kind()),
        );
        err.details =
            Some(json!({"name": name, "group": rt.group, "kind": rt.kind, "causes": causes}));
        err
    }

    /// The `Status` object sent as the body (and as an ERROR watch event's object).
    pub(crate) fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        });
        // An unclassified error has an empty reason, which the server omits.
        if !self.reason.is_empty() {
            status["reason"] = json!(self.reason);
        }
        let mut details = self.details.clone();
        if let Some(seconds) = self.retry_after {
            let details = details.get_or_insert_with(|| json!({}));
            details["retryAfterSeconds"] = json!(seconds);
        }
        if let Some(details) = details {
            status["details"] = details;
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_parse_as_kube_status() {
        let rt = ResourceType::RESOURCE_SLICES;
        let err = ApiError::stale(&rt, "s1");
        let status: kube::core::Status = serde_json::from_value(err.to_status()).unwrap();
        assert!(status.is_conflict());
        assert_eq!(status.code, 409);
        assert!(
            status
                .message
                .contains("resourceslices.resource.k8s.io \"s1\"")
        );

        let status: kube::core::Status =
            serde_json::from_value(ApiError::not_found(&ResourceType::NODES, "n").to_status())
                .unwrap();
        assert!(status.is_not_found());
        assert_eq!(status.message, "nodes \"n\" not found");

        let err = ApiError::invalid(&rt, "s", &[FieldError::required("spec.driver")]);
        let status: kube::core::Status = serde_json::from_value(err.to_status()).unwrap();
        assert!(status.is_invalid());
        assert_eq!(
            status.message,
            "ResourceSlice.resource.k8s.io \"s\" is invalid: spec.driver: Required value"
        );
        assert_eq!(status.details.unwrap().causes[0].field, "spec.driver");
    }

    #[test]
    fn retry_after_lands_in_details() {
        let mut err = ApiError::new(429, "TooManyRequests", "slow down");
        err.retry_after = Some(2);
        assert_eq!(err.to_status()["details"]["retryAfterSeconds"], 2);
    }
}
