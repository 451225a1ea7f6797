//! The faults a test asks the double to inject.

use std::collections::BTreeSet;

/// The services of the CRI, by the name gRPC puts in a method path.
pub(crate) const RUNTIME_SERVICE: &str = "runtime.v1.RuntimeService";
pub(crate) const IMAGE_SERVICE: &str = "runtime.v1.ImageService";

/// Which calls fail, and how.
#[derive(Clone, Debug, Default)]
pub(crate) struct Faults {
    /// Methods (`RuntimeConfig`) answered `Unimplemented`.
    pub(crate) unimplemented: BTreeSet<String>,
    /// Pods (`namespace/name`) whose first `CreateContainer` fails with `Unknown`.
    pub(crate) fail_first_create: BTreeSet<String>,
}

impl Faults {
    /// `Unimplemented` for `method` of `service` when configured, with the message grpc-go
    /// gives a method it does not have: a runtime built against an older CRI answers that,
    /// and the kubelet matches on the code.
    pub(crate) fn check(&self, service: &str, method: &str) -> Result<(), tonic::Status> {
        if self.unimplemented.contains(method) {
            tracing::debug!(method, "CRI double: answering Unimplemented");
            return Err(tonic::Status::unimplemented(format!(
                "unknown method {method} for service {service}"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unimplemented_answers_as_grpc_go_does() {
        let faults = Faults {
            unimplemented: ["ImageFsInfo".to_owned()].into(),
            ..Faults::default()
        };
        let status = faults.check(IMAGE_SERVICE, "ImageFsInfo").unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unimplemented);
        assert_eq!(
            status.message(),
            "unknown method ImageFsInfo for service runtime.v1.ImageService"
        );
        assert!(faults.check(RUNTIME_SERVICE, "Version").is_ok());
    }
}
