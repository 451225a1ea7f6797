//! Compiles the kubelet plugin protos in `proto/` with protox, a pure-Rust
//! protobuf compiler, so building the SDK needs no `protoc` binary.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    // Inside the workspace the protos live at the root; a published crate
    // carries a copy in its own `proto/` folder.
    let proto_dir = [manifest.join("../proto"), manifest.join("proto")]
        .into_iter()
        .find(|dir| dir.join("pluginregistration.proto").exists())
        .ok_or("proto/ directory with the kubelet plugin protos not found")?;
    let files = [
        "pluginregistration.proto",
        "dra-v1.proto",
        "dra-v1beta1.proto",
        "dra-health-v1alpha1.proto",
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
