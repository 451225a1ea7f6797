//! Compiles the kubelet plugin protos in `proto/` with protox, a pure-Rust
//! protobuf compiler, so building the SDK needs no `protoc` binary. With the
//! `testing` feature it also compiles the CRI v1 subset of the test kit's CRI
//! double, and keeps its encoded descriptors for tests that speak protojson.

use std::path::{Path, PathBuf};

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
    if std::env::var_os("CARGO_FEATURE_TESTING").is_some() {
        compile_cri(&proto_dir)?;
    }
    Ok(())
}

/// The CRI double's API: server and client code, plus the encoded
/// `FileDescriptorSet` (`cri-v1.bin`) that `testing::cri::FILE_DESCRIPTOR_SET`
/// includes.
fn compile_cri(proto_dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let file = "cri-v1.proto";
    println!("cargo:rerun-if-changed={}", proto_dir.join(file).display());
    let mut compiler = protox::Compiler::new([proto_dir])?;
    compiler.include_imports(true).open_file(file)?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("cri-v1.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
