use sdk::OpaqueConfig;

#[derive(OpaqueConfig)]
#[dra(crate = "sdk", api_version = "gpu.example.com/v1", kind = "GpuConfig", hooks = false)]
struct GpuConfig {
    interval: u8,
}

fn main() {}
