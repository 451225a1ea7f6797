//! Compiles the kubelet plugin protos in the crate's `proto/` with protox, a pure-Rust
//! protobuf compiler, so building the SDK needs no `protoc` binary. The protos live inside the
//! crate (their one copy), so the published package builds on its own.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto_dir = manifest.join("proto");
    let files = [
        "pluginregistration.proto",
        "dra-v1.proto",
        "dra-v1beta1.proto",
        "dra-health-v1alpha1.proto",
        "dra-health-v1.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={}", proto_dir.join(file).display());
    }
    let fds = protox::compile(files, [&proto_dir])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
