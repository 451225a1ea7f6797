use sdk::config::OpaqueConfig;

#[derive(serde::Deserialize, OpaqueConfig)]
#[dra(crate = "sdk", api_version = "v1", kind = "GpuConfig", hooks = false)]
struct CoreGroup {}

#[derive(serde::Deserialize, OpaqueConfig)]
#[dra(crate = "sdk", api_version = "GPU.example.com/v1", kind = "GpuConfig", hooks = false)]
struct UppercaseGroup {}

#[derive(serde::Deserialize, OpaqueConfig)]
#[dra(crate = "sdk", api_version = "gpu.example.com/1", kind = "GpuConfig", hooks = false)]
struct NumericVersion {}

#[derive(serde::Deserialize, OpaqueConfig)]
#[dra(crate = "sdk", api_version = "gpu.example.com/v1", kind = "gpu-config", hooks = false)]
struct LowercaseKind {}

fn main() {}
