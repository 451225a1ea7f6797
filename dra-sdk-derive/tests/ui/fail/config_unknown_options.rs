use sdk::config::OpaqueConfig;

#[derive(serde::Deserialize, OpaqueConfig)]
#[dra(crate = "sdk", api_version = "gpu.example.com/v1", kind = "GpuConfig", hook = false)]
struct GpuConfig {}

#[derive(serde::Deserialize, OpaqueConfig)]
#[dra(crate = "sdk", api_version = "gpu.example.com/v1", kind = "Other", hooks = "no")]
struct Other {}

fn main() {}
