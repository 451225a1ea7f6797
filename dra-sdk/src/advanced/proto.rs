//! Generated bindings for the kubelet plugin gRPC APIs.
//!
//! The `.proto` files live in the crate's `proto/` folder and are compiled
//! by `build.rs` with a pure-Rust compiler. Package names match the kubelet's
//! exactly, because they are part of every gRPC method path.

#![allow(missing_docs, unreachable_pub, clippy::all)]

/// `pluginregistration`: the kubelet's plugin registration service.
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}

/// `k8s.io.kubelet.pkg.apis.dra.v1`: the DRA node service, v1 (kubelet 1.34+).
pub mod dra_v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// `k8s.io.kubelet.pkg.apis.dra.v1beta1`: the DRA node service, v1beta1 (kubelet 1.32+).
pub mod dra_v1beta1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}

/// `v1alpha1`: the DRA resource-health streaming service (kubelet 1.34+).
pub mod health_v1alpha1 {
    tonic::include_proto!("v1alpha1");
}

/// `v1`: the DRA resource-health streaming service, v1 (kubelet 1.37+; same messages as
/// v1alpha1).
pub mod health_v1 {
    tonic::include_proto!("v1");
}
