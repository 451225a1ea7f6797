//! The kubelet plugin registration service.
