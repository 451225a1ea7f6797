//! Compiles the CRI v1 subset of the CRI double (`proto/cri-v1.proto`) with protox, a
//! pure-Rust protobuf compiler (no `protoc`), and keeps its encoded descriptors
//! (`cri-v1.bin`, [`cri::FILE_DESCRIPTOR_SET`]) for tests that speak protojson.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    // The proto lives inside the crate (its one copy), so the published package builds alone.
    let file = "cri-v1.proto";
    let proto_dir = manifest.join("proto");
    println!("cargo:rerun-if-changed={}", proto_dir.join(file).display());
    let mut compiler = protox::Compiler::new([&proto_dir])?;
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
