use sdk::config::OpaqueConfig;

/// No `impl ConfigHooks` and no `hooks = false`.
#[derive(serde::Deserialize, OpaqueConfig)]
#[dra(crate = "sdk", api_version = "gpu.example.com/v1", kind = "GpuConfig")]
struct GpuConfig {
    interval: u8,
}

fn main() {}
