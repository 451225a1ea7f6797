use sdk::config::OpaqueConfig;

#[derive(serde::Deserialize, OpaqueConfig)]
#[dra(crate = "sdk", kind = "GpuConfig", hooks = false)]
struct NoApiVersion {}

#[derive(serde::Deserialize, OpaqueConfig)]
#[dra(crate = "sdk", api_version = "gpu.example.com/v1", hooks = false)]
struct NoKind {}

#[derive(serde::Deserialize, OpaqueConfig)]
struct NoAttribute {}

fn main() {}
